/* The tokenizer files of a Hugging Face export (hf_export.h): a tokenizer.json is copied with
 * the files transformers keeps beside it; ctitan's own tokenizer.bin is converted into the
 * tokenizer.json of the same byte-level BPE, which the `tokenizers` library runs. */
#include "checkpointd/hf_export.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/util.h"
#include "stages/data/tokenizer.h"

#define HF_TOK_FILE_MAX (1u << 30)

/* tok_chunk_len as a regex (Oniguruma, as `tokenizers` runs it), over characters: a space and a
 * run of one class (letters: ASCII letters and every non-ASCII character, whose UTF-8 bytes
 * are all >= 0x80; digits; other non-space), at most TOK_MAX_CHUNK bytes with the space; or
 * a whitespace run that leaves its last space to the word after it. */
#define RX_S "[\\t\\n\\x0B\\x0C\\r ]"
#define RX_L "[^\\x00-\\x40\\x5B-\\x60\\x7B-\\x7F]"
#define RX_D "[0-9]"
#define RX_O "[\\x00-\\x08\\x0E-\\x1F!-/:-@\\x5B-`{-\\x7F]"
#define RX_RUN(C) " " C "{1,127}|" C "{1,128}|"
static const char hf_split_regex[] =
    RX_RUN(RX_L) RX_RUN(RX_D) RX_RUN(RX_O) RX_S "{1,127}(?= [^\\t\\n\\x0B\\x0C\\r ])|" RX_S "{1,128}";

/* A whole tokenizer file (at most HF_TOK_FILE_MAX bytes), NUL-terminated. */
static int read_all(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
    return util_read_file(path, HF_TOK_FILE_MAX, "tokenizer file", out, len, err, errlen);
}

int hf_tok_is_bin(const char *path)
{
    char magic[8];
    size_t size;
    int fd = util_open_regular(path, &size, NULL, 0);
    if (fd < 0)
        return fd;
    long n = util_read_all(fd, magic, sizeof(magic), 0);
    close(fd);
    if (n < 0)
        return (int)n;
    return n == 8 && !memcmp(magic, TOK_MAGIC, 8);
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for
 * U+0100 onward in byte order. */
static void byte_chars(unsigned cp[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = keep ? (unsigned)b : 256u + (unsigned)n++;
    }
}

/* The token's bytes as its byte-level string (UTF-8; each code point < 0x800). */
static char *token_string(const uint8_t *bytes, size_t len, const unsigned cp[256])
{
    char *s = malloc(2 * len + 1), *o = s;
    if (!s)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        unsigned c = cp[bytes[i]];
        if (c < 0x80) {
            *o++ = (char)c;
        } else {
            *o++ = (char)(0xC0 | c >> 6);
            *o++ = (char)(0x80 | (c & 63));
        }
    }
    *o = 0;
    return s;
}

/* model.vocab and model.merges of t. */
static int bpe_tables(const tok_t *t, json_t *vocab, json_t *merges, int *n_dup)
{
    unsigned cp[256];
    byte_chars(cp);
    int v = tok_vocab_size(t);
    char **str = calloc((size_t)v, sizeof(char *));
    int rc = str ? 0 : -ENOMEM;
    for (int id = 0; id < v && !rc; id++) {
        size_t len;
        const uint8_t *b = tok_token_bytes(t, (uint32_t)id, &len);
        if (!b || !(str[id] = token_string(b, len, cp))) {
            rc = -ENOMEM;
            break;
        }
        if (json_object_get(vocab, str[id]))
            (*n_dup)++;
        else if (json_object_set_new(vocab, str[id], json_integer(id)))
            rc = -ENOMEM;
    }
    for (int r = 0; r + 256 < v && !rc; r++) {
        uint32_t a, b;
        tok_merge(t, r, &a, &b);
        size_t la = strlen(str[a]), lb = strlen(str[b]);
        char *m = malloc(la + lb + 2);
        if (!m) {
            rc = -ENOMEM;
            break;
        }
        memcpy(m, str[a], la);
        m[la] = ' ';
        memcpy(m + la + 1, str[b], lb + 1);
        if (json_array_append_new(merges, json_string(m)))
            rc = -ENOMEM;
        free(m);
    }
    for (int id = 0; str && id < v; id++)
        free(str[id]);
    free(str);
    return rc;
}

int hf_tok_bin_json(const char *path, json_t **out, int *n_dup, char *err, size_t errlen)
{
    tok_t *t = NULL;
    *out = NULL;
    *n_dup = 0;
    int rc = tok_load(&t, path, err, errlen);
    if (rc)
        return rc;
    json_t *vocab = json_object(), *merges = json_array();
    json_t *pre = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
                            "pretokenizers", "type", "Split", "pattern", "Regex", hf_split_regex, "behavior",
                            "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                            "use_regex", 0);
    json_t *dec = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
                            "use_regex", 1);
    if (!vocab || !merges || !pre || !dec || (rc = bpe_tables(t, vocab, merges, n_dup))) {
        json_decref(vocab), json_decref(merges), json_decref(pre), json_decref(dec);
        tok_destroy(&t);
        return util_fail(err, errlen, rc ? rc : -ENOMEM, "%s: out of memory", path);
    }
    tok_destroy(&t);
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                              "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                              "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
    json_t *j = model ? json_pack("{s:s, s:n, s:n, s:[], s:n, s:o, s:n, s:o, s:o}", "version", "1.0", "truncation",
                                  "padding", "added_tokens", "normalizer", "pre_tokenizer", pre, "post_processor",
                                  "decoder", dec, "model", model)
                      : NULL;
    if (!j)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    *out = j;
    return 0;
}

/* ---- a tokenizer.json ---- */

/* The id of token text in a tokenizer.json: an added token's, else the vocabulary's; -1. */
static int token_id(const json_t *tj, const char *text)
{
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(tj, "added_tokens"), i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        json_t *id = json_object_get(a, "id");
        if (c && json_is_integer(id) && !strcmp(c, text))
            return (int)json_integer_value(id);
    }
    json_t *id = json_object_get(json_object_get(json_object_get(tj, "model"), "vocab"), text);
    return json_is_integer(id) ? (int)json_integer_value(id) : -1;
}

/* tokenizer_config.json's bos_token / eos_token: a string or {"content": string} */
static const char *config_token(const json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_string_value(v);
}

/* The first of names that the tokenizer has, as text and id; NULL when none. */
static const char *guess_token(const json_t *tj, const char *const *names, int *id)
{
    for (int i = 0; names[i]; i++)
        if ((*id = token_id(tj, names[i])) >= 0)
            return names[i];
    return NULL;
}

/* The file `name` beside src, copied into dir when there (checked to be JSON); *json gets it
 * parsed (NULL when absent). */
static int copy_beside(const char *src, const char *name, const char *dir, json_t **json, char *err, size_t errlen)
{
    char tmp[PATH_MAX], p[PATH_MAX];
    *json = NULL;
    snprintf(tmp, sizeof(tmp), "%s", src);
    if ((size_t)snprintf(p, sizeof(p), "%s/%s", dirname(tmp), name) >= sizeof(p) || access(p, F_OK))
        return 0;
    char *buf;
    size_t len;
    int rc = read_all(p, &buf, &len, err, errlen);
    if (rc)
        return rc;
    json_error_t je;
    if (!(*json = json_loadb(buf, len, 0, &je)) || !json_is_object(*json)) {
        free(buf);
        json_decref(*json);
        *json = NULL;
        return util_fail(err, errlen, -EINVAL, "%s: line %d: not a JSON object: %s", p, je.line, je.text);
    }
    rc = hf_put_file(dir, name, buf, len, err, errlen);
    free(buf);
    return rc;
}

static int export_json(const char *src, const char *dir, int *bos, int *eos, char *err, size_t errlen)
{
    char *buf;
    size_t len;
    int rc = read_all(src, &buf, &len, err, errlen);
    if (rc)
        return rc;
    json_error_t je;
    json_t *tj = json_loadb(buf, len, 0, &je), *cfg = NULL, *map = NULL;
    if (!tj || !json_is_object(json_object_get(tj, "model"))) {
        rc = util_fail(err, errlen, -EINVAL, "%s: neither ctitan's tokenizer.bin nor a Hugging Face tokenizer.json"
                       " (%s%s)", src, tj ? "no \"model\" object" : "not JSON: ", tj ? "" : je.text);
        goto out;
    }
    if ((rc = hf_put_file(dir, "tokenizer.json", buf, len, err, errlen)) ||
        (rc = copy_beside(src, "tokenizer_config.json", dir, &cfg, err, errlen)) ||
        (rc = copy_beside(src, "special_tokens_map.json", dir, &map, err, errlen)))
        goto out;
    static const char *const bos_names[] = {"<|begin_of_text|>", "<s>", "<|startoftext|>", NULL};
    static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", NULL};
    const json_t *from = cfg ? cfg : map;
    const char *b = from ? config_token(from, "bos_token") : NULL, *e = from ? config_token(from, "eos_token") : NULL;
    *bos = b ? token_id(tj, b) : -1;
    *eos = e ? token_id(tj, e) : -1;
    if (!from) {
        b = guess_token(tj, bos_names, bos);
        e = guess_token(tj, eos_names, eos);
    }
    if (!cfg) { /* a minimal one: AutoTokenizer needs the class */
        json_t *c = json_pack("{s:s, s:b}", "tokenizer_class", "PreTrainedTokenizerFast",
                              "clean_up_tokenization_spaces", 0);
        if (b && *bos >= 0)
            json_object_set_new(c, "bos_token", json_string(b));
        if (e && *eos >= 0)
            json_object_set_new(c, "eos_token", json_string(e));
        rc = hf_put_json(dir, "tokenizer_config.json", c, 0, err, errlen);
        json_decref(c);
    }
out:
    json_decref(tj);
    json_decref(cfg);
    json_decref(map);
    free(buf);
    return rc;
}

int hf_tok_export(const char *src, const char *dir, int *bos_id, int *eos_id, FILE *log, char *err, size_t errlen)
{
    *bos_id = *eos_id = -1;
    int is_bin = hf_tok_is_bin(src);
    if (is_bin < 0)
        return util_fail(err, errlen, is_bin, "tokenizer %s: cannot read: %s", src, strerror(-is_bin));
    if (!is_bin)
        return export_json(src, dir, bos_id, eos_id, err, errlen);
    json_t *tj = NULL;
    int n_dup = 0, rc = hf_tok_bin_json(src, &tj, &n_dup, err, errlen);
    if (rc)
        return rc;
    if (n_dup && log)
        fprintf(log, "note: %s: %d merge%s make%s the bytes of an earlier token; tokenizer.json encodes %s as "
                "the earlier id\n", src, n_dup, n_dup == 1 ? "" : "s", n_dup == 1 ? "s" : "", n_dup == 1 ? "it" :
                "them");
    rc = hf_put_json(dir, "tokenizer.json", tj, JSON_INDENT(2) | JSON_PRESERVE_ORDER, err, errlen);
    json_decref(tj);
    if (rc)
        return rc;
    json_t *c = json_pack("{s:s, s:b}", "tokenizer_class", "PreTrainedTokenizerFast", "clean_up_tokenization_spaces",
                          0);
    rc = hf_put_json(dir, "tokenizer_config.json", c, 0, err, errlen);
    json_decref(c);
    return rc;
}
