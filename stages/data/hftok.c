/* Hugging Face tokenizer.json (hftok_int.h): a byte-level BPE as the `tokenizers` library
 * builds it, loaded and checked, then encoding (added tokens split out of the raw text, the
 * pre-tokenizer steps, BPE merges with a per-pre-token cache) and the bytes of each token for
 * decoding. tok_t (tokenizer.c) dispatches here for a tokenizer.json. */
#include "stages/data/hftok_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "ipc/util.h"
#include "stages/data/tokenizer_int.h"
#include "stages/data/tokfile.h"

#define HF_MAX_STEPS 8
#define NO_TOKEN UINT32_MAX
/* The encode cache is dropped when it grows past these (as tokenizer.c's). */
#define CACHE_MAX_ENTRIES (1u << 21)
#define CACHE_MAX_POOL (64u << 20)

enum { STEP_LLAMA3, STEP_GPT2, STEP_BYTELEVEL };
typedef struct {
    int kind;
    int prefix; /* ByteLevel add_prefix_space */
    int regex;  /* ByteLevel use_regex */
} step_t;

typedef struct {
    uint32_t off, len, id; /* content at abytes + off */
    uint8_t lstrip, rstrip, single_word, normalized, special;
} added_t;

/* Added tokens of one kind (normalized or not) by first byte, longest first. */
typedef struct {
    int *list;
    int start[257];
} matcher_t;

typedef struct {
    uint32_t c, len;
    int32_t prev, next;
} sym_t;

typedef struct {
    uint32_t rank, pos, new_id;
} hmerge_t;

struct hftok {
    int vocab_size; /* the largest id + 1 */
    int model_size; /* entries in model.vocab */
    uint32_t *tb_off, *tb_len; /* (vocab_size); tb_len NO_TOKEN: no token has this id */
    uint8_t *tb;
    size_t ntb, tbcap;
    tok_ctab_t by_bytes; /* model tokens through the byte-level alphabet -> id */
    tok_ctab_t by_name;  /* model tokens as written -> id */
    uint32_t byte_id[256];
    int ignore_merges;
    uint32_t *merges; /* (n_merges, 2) */
    int n_merges;
    uint64_t *mkey; /* (a, b) -> mrank, mnew; UINT64_MAX marks an empty slot */
    uint32_t *mrank, *mnew;
    size_t mcap;
    added_t *added;
    int n_added;
    uint8_t *abytes;
    size_t nab, abcap;
    matcher_t match[2]; /* [0] normalized false (matched first), [1] normalized true */
    step_t step[HF_MAX_STEPS];
    int nsteps;
    uint8_t *scratch[HF_MAX_STEPS];
    size_t scap[HF_MAX_STEPS];
    int bos, eos;
    tok_ctab_t cache; /* pre-token -> offset in pool of [count, ids...] */
    uint32_t *pool;
    size_t npool, pool_cap;
    sym_t *sym;
    size_t sym_cap;
    hmerge_t *heap;
    size_t heap_cap;
    uint8_t *json; /* the file, for hftok_save */
    size_t json_len;
    uint8_t *tmp; /* merge keys */
    size_t tmp_cap;
};

/* ---- GPT-2's byte-level alphabet: each byte is one printable character ---- */

static uint16_t byte_char[256];
static int16_t char_byte[324];
static pthread_once_t alpha_once = PTHREAD_ONCE_INIT;

static void fill_alphabet(void)
{
    int n = 0;
    for (int i = 0; i < 324; i++) char_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        byte_char[b] = (uint16_t)(keep ? b : 256 + n++);
        char_byte[byte_char[b]] = (int16_t)b;
    }
}

/* The bytes that token text s[0..n) stands for, into dst (n bytes suffice); -1 if a character
 * is outside the alphabet. */
static long unmap(const uint8_t *s, size_t n, uint8_t *dst)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += hf_utf8(s + i, n - i, &cp);
        if (cp >= 324 || char_byte[cp] < 0) return -1;
        dst[o++] = (uint8_t)char_byte[cp];
    }
    return (long)o;
}

/* ---- tables ---- */

static tok_cslot_t *ctab_find(const tok_ctab_t *t, const uint8_t *p, size_t len)
{
    if (!t->cap) return NULL;
    uint64_t h = XXH3_64bits(p, len) | 1;
    for (size_t j = h & (t->cap - 1);; j = (j + 1) & (t->cap - 1)) {
        tok_cslot_t *s = &t->slot[j];
        if (!s->hash) return NULL;
        if (s->hash == h && s->len == len && !memcmp(t->bytes + s->off, p, len)) return s;
    }
}

static int64_t find_id(const tok_ctab_t *t, const uint8_t *p, size_t len)
{
    tok_cslot_t *s = ctab_find(t, p, len);
    return s ? (int64_t)s->val : -1;
}

static const hmerge_t *merge_find(const hftok_t *h, uint32_t a, uint32_t b, hmerge_t *m)
{
    uint64_t k = tok_pair_key(a, b);
    for (size_t j = tok_mix64(k) & (h->mcap - 1);; j = (j + 1) & (h->mcap - 1)) {
        if (h->mkey[j] == UINT64_MAX) return NULL;
        if (h->mkey[j] == k) {
            *m = (hmerge_t){.rank = h->mrank[j], .new_id = h->mnew[j]};
            return m;
        }
    }
}

/* A later merge of the same pair replaces the earlier, as the library's HashMap collect does. */
static void merge_put(hftok_t *h, uint32_t a, uint32_t b, uint32_t rank, uint32_t new_id)
{
    uint64_t k = tok_pair_key(a, b);
    size_t j = tok_mix64(k) & (h->mcap - 1);
    while (h->mkey[j] != UINT64_MAX && h->mkey[j] != k) j = (j + 1) & (h->mcap - 1);
    h->mkey[j] = k;
    h->mrank[j] = rank;
    h->mnew[j] = new_id;
}

/* Token id's bytes are p[0..n). */
static int set_bytes(hftok_t *h, uint32_t id, const uint8_t *p, size_t n)
{
    uint8_t *b = tok_grow(h->tb, &h->tbcap, h->ntb + n, 1);
    if (!b) return -ENOMEM;
    h->tb = b;
    memcpy(b + h->ntb, p, n);
    h->tb_off[id] = (uint32_t)h->ntb;
    h->tb_len[id] = (uint32_t)n;
    h->ntb += n;
    return 0;
}

void hftok_destroy(hftok_t **p)
{
    hftok_t *h = *p;
    if (!h) return;
    free(h->tb_off);
    free(h->tb_len);
    free(h->tb);
    tok_ctab_free(&h->by_bytes);
    tok_ctab_free(&h->by_name);
    free(h->merges);
    free(h->mkey);
    free(h->mrank);
    free(h->mnew);
    free(h->added);
    free(h->abytes);
    for (int k = 0; k < 2; k++) free(h->match[k].list);
    for (int k = 0; k < HF_MAX_STEPS; k++) free(h->scratch[k]);
    tok_ctab_free(&h->cache);
    free(h->pool);
    free(h->sym);
    free(h->heap);
    free(h->json);
    free(h->tmp);
    free(h);
    *p = NULL;
}

/* ---- loading: tokenizer.json ---- */

#define FAIL(...) util_fail(err, errlen, -EINVAL, __VA_ARGS__)

/* An optional field that ctitan does not implement: absent, null, false or "" only. */
static int check_unset(const char *path, const json_t *obj, const char *field, const char *what,
                       char *err, size_t errlen)
{
    const json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v) || json_is_false(v) || (json_is_string(v) && !json_string_length(v)))
        return 0;
    return FAIL("%s: %s is set, but %s", path, field, what);
}

static int json_id(const json_t *v, int64_t *id)
{
    if (!json_is_integer(v)) return -1;
    *id = json_integer_value(v);
    return *id >= 0 && *id < TOK_MAX_VOCAB ? 0 : -1;
}

/* The largest id in model.vocab and added_tokens, each checked to be in range. */
static int max_id(const char *path, const json_t *vocab, const json_t *added, int64_t *max,
                  char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    int64_t id;
    *max = -1;
    json_object_foreach((json_t *)vocab, key, v) {
        if (json_id(v, &id))
            return FAIL("%s: model.vocab: token \"%s\" has id %s, expected an integer in [0, %d)", path, key,
                        json_is_integer(v) ? "out of range" : "that is not an integer", TOK_MAX_VOCAB);
        if (id > *max) *max = id;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        if (!json_is_object(v) || json_id(json_object_get(v, "id"), &id))
            return FAIL("%s: added_tokens[%zu]: expected an object with an integer id in [0, %d)", path, i,
                        TOK_MAX_VOCAB);
        if (id > *max) *max = id;
    }
    if (*max < 0) return FAIL("%s: model.vocab is empty", path);
    return 0;
}

static int load_vocab(hftok_t *h, const char *path, const json_t *vocab, char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    uint8_t *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    json_object_foreach((json_t *)vocab, key, v) {
        uint32_t id = (uint32_t)json_integer_value(v);
        size_t n = strlen(key);
        if (h->tb_len[id] != NO_TOKEN) {
            rc = FAIL("%s: model.vocab: id %u is given to two tokens (again to \"%s\")", path, id, key);
            break;
        }
        if (!n) {
            rc = FAIL("%s: model.vocab: id %u is given to an empty token", path, id);
            break;
        }
        int found;
        uint8_t *b = tok_grow(buf, &cap, n + 1, 1);
        tok_cslot_t *s = b ? tok_ctab_upsert(&h->by_name, (const uint8_t *)key, (uint32_t)n, &found) : NULL;
        if (b) buf = b;
        if (!s) {
            rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
            break;
        }
        s->val = id;
        long m = unmap((const uint8_t *)key, n, buf);
        if (m >= 0) {
            if (!(s = tok_ctab_upsert(&h->by_bytes, buf, (uint32_t)m, &found))) rc = -ENOMEM;
            else s->val = id;
        }
        if (rc || (rc = m >= 0 ? set_bytes(h, id, buf, (size_t)m) : set_bytes(h, id, (const uint8_t *)key, n))) {
            rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
            break;
        }
        h->model_size++;
    }
    free(buf);
    for (int b = 0; b < 256 && !rc; b++) {
        uint8_t c = (uint8_t)b;
        int64_t id = find_id(&h->by_bytes, &c, 1);
        h->byte_id[b] = id < 0 ? NO_TOKEN : (uint32_t)id;
    }
    return rc;
}

/* The two token names of merge i ("a b" or ["a", "b"]) into *a, *na, *b, *nb. */
static int merge_names(const char *path, size_t i, const json_t *m, const char **a, size_t *na,
                       const char **b, size_t *nb, char *err, size_t errlen)
{
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ') || strlen(s) != json_string_length(m))
            return FAIL("%s: model.merges[%zu]: \"%s\" is not two tokens separated by one space", path, i, s);
        *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = strlen(sp + 1);
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0)), *na = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1)), *nb = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return FAIL("%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", path, i);
}

static int load_merges(hftok_t *h, const char *path, const json_t *merges, char *err, size_t errlen)
{
    size_t n = json_array_size(merges), i;
    h->mcap = 16;
    while (h->mcap < 2 * n) h->mcap *= 2;
    h->mkey = malloc(h->mcap * sizeof(uint64_t));
    h->mrank = malloc(h->mcap * sizeof(uint32_t));
    h->mnew = malloc(h->mcap * sizeof(uint32_t));
    h->merges = malloc((2 * n + 1) * sizeof(uint32_t));
    if (!h->mkey || !h->mrank || !h->mnew || !h->merges)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    memset(h->mkey, 0xff, h->mcap * sizeof(uint64_t));
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        int rc = merge_names(path, i, m, &a, &na, &b, &nb, err, errlen);
        if (rc) return rc;
        uint8_t *t = tok_grow(h->tmp, &h->tmp_cap, na + nb + 1, 1);
        if (!t) return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
        h->tmp = t;
        memcpy(t, a, na);
        memcpy(t + na, b, nb);
        int64_t ia = find_id(&h->by_name, (const uint8_t *)a, na);
        int64_t ib = find_id(&h->by_name, (const uint8_t *)b, nb);
        int64_t iz = find_id(&h->by_name, t, na + nb);
        if (ia < 0 || ib < 0 || iz < 0) {
            const char *what = ia < 0 ? a : ib < 0 ? b : (t[na + nb] = 0, (const char *)t);
            int len = (int)(ia < 0 ? na : ib < 0 ? nb : na + nb);
            return FAIL("%s: model.merges[%zu]: token \"%.*s\" is not in model.vocab", path, i, len, what);
        }
        h->merges[2 * i] = (uint32_t)ia;
        h->merges[2 * i + 1] = (uint32_t)ib;
        merge_put(h, (uint32_t)ia, (uint32_t)ib, (uint32_t)i, (uint32_t)iz);
    }
    h->n_merges = (int)n;
    return 0;
}

static int load_model(hftok_t *h, const char *path, const json_t *model, char *err, size_t errlen)
{
    const json_t *type = json_object_get(model, "type");
    if (!json_is_string(type))
        return FAIL("%s: model.type: missing or not a string (ctitan reads model type BPE)", path);
    if (strcmp(json_string_value(type), "BPE"))
        return FAIL("%s: model type %s is not supported (ctitan reads byte-level BPE only)", path,
                    json_string_value(type));
    int rc;
    if ((rc = check_unset(path, model, "dropout", "BPE dropout is not supported", err, errlen)) ||
        (rc = check_unset(path, model, "unk_token", "a byte-level BPE with an unk_token is not supported", err,
                          errlen)) ||
        (rc = check_unset(path, model, "continuing_subword_prefix", "it is not supported", err, errlen)) ||
        (rc = check_unset(path, model, "end_of_word_suffix", "it is not supported", err, errlen)) ||
        (rc = check_unset(path, model, "byte_fallback", "byte_fallback is not supported", err, errlen)))
        return rc;
    const json_t *im = json_object_get(model, "ignore_merges");
    if (im && !json_is_boolean(im)) return FAIL("%s: model.ignore_merges: expected true or false", path);
    h->ignore_merges = json_is_true(im);
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) return FAIL("%s: model.merges: missing or not an array", path);
    if ((rc = load_vocab(h, path, json_object_get(model, "vocab"), err, errlen))) return rc;
    return load_merges(h, path, merges, err, errlen);
}

static int added_flag(const json_t *t, const char *name, int dflt)
{
    const json_t *v = json_object_get(t, name);
    return v ? json_is_true(v) : dflt;
}

/* The id the library gives added token i: a model token's own id, else the model's size, or one
 * past the largest added id so far once that reaches it; it warns and ignores the file's id. */
static int load_added(hftok_t *h, const char *path, const json_t *added, char *err, size_t errlen)
{
    size_t i, n = json_array_size(added);
    if (!(h->added = calloc(n + 1, sizeof(added_t)))) return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    int64_t next = h->model_size, maxid = -1;
    json_t *t;
    json_array_foreach(added, i, t) {
        const json_t *c = json_object_get(t, "content");
        int64_t id = json_integer_value(json_object_get(t, "id"));
        if (!json_is_string(c) || !json_string_length(c))
            return FAIL("%s: added_tokens[%zu]: content is missing, empty or not a string", path, i);
        const char *s = json_string_value(c);
        size_t len = json_string_length(c);
        for (int k = 0; k < h->n_added; k++)
            if (h->added[k].len == len && !memcmp(h->abytes + h->added[k].off, s, len))
                return FAIL("%s: added_tokens[%zu]: \"%s\" is listed twice", path, i, s);
        int64_t want = find_id(&h->by_name, (const uint8_t *)s, len);
        if (want < 0) want = maxid >= 0 && (maxid >= next || next == 0) ? maxid + 1 : next;
        if (id != want)
            return FAIL("%s: added_tokens[%zu] (\"%s\"): id %lld, but the tokenizers library gives it id %lld",
                        path, i, s, (long long)id, (long long)want);
        if (id > maxid) maxid = id;
        uint8_t *b = tok_grow(h->abytes, &h->abcap, h->nab + len, 1);
        if (!b || set_bytes(h, (uint32_t)id, (const uint8_t *)s, len))
            return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
        h->abytes = b;
        memcpy(b + h->nab, s, len);
        int special = added_flag(t, "special", 0);
        h->added[h->n_added++] = (added_t){.off = (uint32_t)h->nab, .len = (uint32_t)len, .id = (uint32_t)id,
                                           .lstrip = (uint8_t)added_flag(t, "lstrip", 0),
                                           .rstrip = (uint8_t)added_flag(t, "rstrip", 0),
                                           .single_word = (uint8_t)added_flag(t, "single_word", 0),
                                           .normalized = (uint8_t)added_flag(t, "normalized", !special),
                                           .special = (uint8_t)special};
        h->nab += len;
    }
    return 0;
}

static int added_cmp(const void *x, const void *y, void *ctx)
{
    const hftok_t *h = ctx;
    const added_t *a = &h->added[*(const int *)x], *b = &h->added[*(const int *)y];
    uint8_t fa = h->abytes[a->off], fb = h->abytes[b->off];
    if (fa != fb) return fa < fb ? -1 : 1;
    return a->len > b->len ? -1 : a->len < b->len;
}

static int build_matchers(hftok_t *h)
{
    for (int k = 0; k < 2; k++) {
        matcher_t *m = &h->match[k];
        if (!(m->list = malloc((h->n_added + 1) * sizeof(int)))) return -ENOMEM;
        int n = 0;
        for (int i = 0; i < h->n_added; i++)
            if (h->added[i].normalized == k) m->list[n++] = i;
        qsort_r(m->list, (size_t)n, sizeof(int), added_cmp, h);
        int j = 0;
        for (int c = 0; c < 256; c++) {
            m->start[c] = j;
            while (j < n && h->abytes[h->added[m->list[j]].off] == c) j++;
        }
        m->start[256] = n;
    }
    return 0;
}

static int push_step(hftok_t *h, const char *path, step_t s, char *err, size_t errlen)
{
    if (h->nsteps == HF_MAX_STEPS) return FAIL("%s: pre_tokenizer: more than %d steps", path, HF_MAX_STEPS);
    h->step[h->nsteps++] = s;
    return 0;
}

static int load_split(hftok_t *h, const char *path, const json_t *p, char *err, size_t errlen)
{
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *re = json_object_get(pat, "Regex");
    const char *b = json_string_value(json_object_get(p, "behavior"));
    if (!json_is_string(re))
        return FAIL("%s: pre_tokenizer Split: only a Regex pattern is supported (Llama 3's or GPT-2's)", path);
    const char *r = json_string_value(re);
    int kind = !strcmp(r, HF_LLAMA3_REGEX) ? STEP_LLAMA3 : !strcmp(r, HF_GPT2_REGEX) ? STEP_GPT2 : -1;
    if (kind < 0)
        return FAIL("%s: pre_tokenizer Split: regex %s is not supported (only Llama 3's and GPT-2's are)", path, r);
    if (!b || strcmp(b, "Isolated"))
        return FAIL("%s: pre_tokenizer Split: behavior %s is not supported (only Isolated)", path, b ? b : "(none)");
    if (json_is_true(json_object_get(p, "invert")))
        return FAIL("%s: pre_tokenizer Split: invert is not supported", path);
    return push_step(h, path, (step_t){.kind = kind}, err, errlen);
}

static int load_pre(hftok_t *h, const char *path, const json_t *p, int depth, char *err, size_t errlen)
{
    if (!p || json_is_null(p)) return 0;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type || depth > HF_MAX_STEPS) return FAIL("%s: pre_tokenizer: expected an object with a type", path);
    if (!strcmp(type, "Sequence")) {
        const json_t *a = json_object_get(p, "pretokenizers"), *q;
        size_t i;
        if (!json_is_array(a)) return FAIL("%s: pre_tokenizer Sequence: pretokenizers is not an array", path);
        json_array_foreach(a, i, q) {
            int rc = load_pre(h, path, q, depth + 1, err, errlen);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel"))
        return push_step(h, path,
                         (step_t){.kind = STEP_BYTELEVEL,
                                  .prefix = added_flag(p, "add_prefix_space", 1),
                                  .regex = added_flag(p, "use_regex", 1)},
                         err, errlen);
    if (!strcmp(type, "Split")) return load_split(h, path, p, err, errlen);
    return FAIL("%s: pre_tokenizer %s is not supported (ByteLevel, Split and Sequence are)", path, type);
}

/* Normalizer none, pre-tokenizers ending in the one ByteLevel, decoder ByteLevel. */
static int load_pipeline(hftok_t *h, const char *path, const json_t *root, char *err, size_t errlen)
{
    const json_t *norm = json_object_get(root, "normalizer"), *dec = json_object_get(root, "decoder");
    if (norm && !json_is_null(norm)) {
        const char *t = json_string_value(json_object_get(norm, "type"));
        return FAIL("%s: normalizer %s is not supported (only none)", path, t ? t : "(without a type)");
    }
    int rc = load_pre(h, path, json_object_get(root, "pre_tokenizer"), 0, err, errlen);
    if (rc) return rc;
    int nbl = 0;
    for (int i = 0; i < h->nsteps; i++) nbl += h->step[i].kind == STEP_BYTELEVEL;
    if (nbl != 1 || h->step[h->nsteps - 1].kind != STEP_BYTELEVEL)
        return FAIL("%s: pre_tokenizer: expected a byte-level BPE, whose pre-tokenizers end in one ByteLevel", path);
    const char *dt = json_string_value(json_object_get(dec, "type"));
    if (!dt || strcmp(dt, "ByteLevel"))
        return FAIL("%s: decoder %s is not supported (only ByteLevel)", path, dt ? dt : "(none)");
    return 0;
}

/* ---- BOS and EOS ---- */

int hftok_token_id(const hftok_t *h, const char *text)
{
    size_t n = strlen(text);
    for (int k = 0; k < h->n_added; k++)
        if (h->added[k].len == n && !memcmp(h->abytes + h->added[k].off, text, n)) return (int)h->added[k].id;
    return -1;
}

static int any_id(const hftok_t *h, const char *text)
{
    int id = hftok_token_id(h, text);
    return id >= 0 ? id : (int)find_id(&h->by_name, (const uint8_t *)text, strlen(text));
}

/* BOS: the first token of the post-processor's TemplateProcessing for one sequence. */
static int template_bos(const hftok_t *h, const json_t *pp)
{
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (type && !strcmp(type, "Sequence")) {
        const json_t *q;
        size_t i;
        json_array_foreach(json_object_get(pp, "processors"), i, q) {
            int id = template_bos(h, q);
            if (id >= 0) return id;
        }
        return -1;
    }
    if (!type || strcmp(type, "TemplateProcessing")) return -1;
    const json_t *first = json_object_get(json_array_get(json_object_get(pp, "single"), 0), "SpecialToken");
    const char *name = json_string_value(json_object_get(first, "id"));
    if (!name) return -1;
    const json_t *ids = json_object_get(json_object_get(json_object_get(pp, "special_tokens"), name), "ids");
    int64_t id;
    if (json_array_size(ids) >= 1 && !json_id(json_array_get(ids, 0), &id) && id < h->vocab_size) return (int)id;
    return any_id(h, name);
}

/* bos_token or eos_token of tokenizer_config.json: "text", {"content": "text"}, null. */
static int config_token(const hftok_t *h, const char *cpath, const json_t *cfg, const char *field, int *id,
                        char *err, size_t errlen)
{
    const json_t *v = json_object_get(cfg, field);
    if (!v) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (json_is_null(v)) {
        *id = -1;
        return 0;
    }
    if (!json_is_string(v)) return FAIL("%s: %s: expected a string, {\"content\": ...} or null", cpath, field);
    if ((*id = any_id(h, json_string_value(v))) < 0)
        return FAIL("%s: %s \"%s\" is not a token of the tokenizer.json beside it", cpath, field,
                    json_string_value(v));
    return 0;
}

static int load_specials(hftok_t *h, const char *path, const json_t *root, char *err, size_t errlen)
{
    h->bos = template_bos(h, json_object_get(root, "post_processor"));
    const char *eos[] = {"<|end_of_text|>", "</s>", "<|endoftext|>"};
    h->eos = -1;
    for (int k = 0; k < 3 && h->eos < 0; k++) h->eos = any_id(h, eos[k]);
    char cpath[4096];
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path) : 1;
    if (snprintf(cpath, sizeof(cpath), "%.*s/tokenizer_config.json", dl, slash ? path : ".") >= (int)sizeof(cpath))
        return 0;
    if (access(cpath, F_OK)) return 0;
    json_error_t je;
    json_t *cfg = json_load_file(cpath, JSON_REJECT_DUPLICATES, &je);
    int rc = 0;
    if (!cfg) rc = FAIL("%s:%d:%d: malformed JSON: %s", cpath, je.line, je.column, je.text);
    else if (!json_is_object(cfg)) rc = FAIL("%s: not a JSON object", cpath);
    else if (!(rc = config_token(h, cpath, cfg, "bos_token", &h->bos, err, errlen)))
        rc = config_token(h, cpath, cfg, "eos_token", &h->eos, err, errlen);
    json_decref(cfg);
    return rc;
}

/* ---- hftok_load ---- */

static int load_json(hftok_t *h, const char *path, const json_t *root, char *err, size_t errlen)
{
    const json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(root)) return FAIL("%s: not a JSON object", path);
    if (!json_is_object(model)) return FAIL("%s: model: missing or not an object", path);
    if (added && !json_is_array(added)) return FAIL("%s: added_tokens: not an array", path);
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) {
        const char *t = json_string_value(json_object_get(model, "type"));
        if (t && strcmp(t, "BPE")) return FAIL("%s: model type %s is not supported (ctitan reads byte-level BPE only)", path, t);
        return FAIL("%s: model.vocab: missing or not an object", path);
    }
    int64_t max;
    int rc = max_id(path, vocab, added, &max, err, errlen);
    if (rc) return rc;
    h->vocab_size = (int)max + 1;
    h->tb_off = malloc(h->vocab_size * sizeof(uint32_t));
    h->tb_len = malloc(h->vocab_size * sizeof(uint32_t));
    if (!h->tb_off || !h->tb_len) return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    memset(h->tb_len, 0xff, h->vocab_size * sizeof(uint32_t));
    if ((rc = load_model(h, path, model, err, errlen)) || (rc = load_added(h, path, added, err, errlen)) ||
        (rc = load_pipeline(h, path, root, err, errlen)))
        return rc;
    if (build_matchers(h)) return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    return load_specials(h, path, root, err, errlen);
}

int hftok_load(hftok_t **out, const char *path, const uint8_t *buf, size_t size, char *err, size_t errlen)
{
    *out = NULL;
    pthread_once(&alpha_once, fill_alphabet);
    hftok_t *h = calloc(1, sizeof(*h));
    if (!h || !(h->json = malloc(size ? size : 1))) {
        free(h);
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    }
    memcpy(h->json, buf, size);
    h->json_len = size;
    json_error_t je;
    json_t *root = json_loadb((const char *)buf, size, JSON_REJECT_DUPLICATES, &je);
    int rc = root ? load_json(h, path, root, err, errlen)
                  : FAIL("%s:%d:%d: malformed JSON: %s", path, je.line, je.column, je.text);
    json_decref(root);
    if (rc) hftok_destroy(&h);
    *out = h;
    return rc;
}

int hftok_save(const hftok_t *h, const char *path, char *err, size_t errlen)
{
    return tokfile_write_bytes(path, h->json, h->json_len, NULL, 0, err, errlen);
}

int hftok_vocab_size(const hftok_t *h) { return h->vocab_size; }
int hftok_bos(const hftok_t *h) { return h->bos; }
int hftok_eos(const hftok_t *h) { return h->eos; }

int hftok_may_grow(const hftok_t *h)
{
    for (int i = 0; i < h->nsteps; i++)
        if (h->step[i].prefix) return 1;
    return 0;
}

int hftok_merge(const hftok_t *h, int rank, uint32_t *a, uint32_t *b)
{
    if (rank < 0 || rank >= h->n_merges) return -ERANGE;
    *a = h->merges[2 * rank];
    *b = h->merges[2 * rank + 1];
    return 0;
}

const uint8_t *hftok_token_bytes(const hftok_t *h, uint32_t id, size_t *len)
{
    if (id >= (uint32_t)h->vocab_size || h->tb_len[id] == NO_TOKEN) return NULL;
    *len = h->tb_len[id];
    return h->tb + h->tb_off[id];
}

/* ---- encoding ---- */

typedef struct {
    uint32_t *o;
    size_t n, cap;
} sink_t;

static inline int heap_less(const hmerge_t *a, const hmerge_t *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(hmerge_t *hp, size_t *n, hmerge_t m)
{
    size_t i = (*n)++;
    while (i > 0 && heap_less(&m, &hp[(i - 1) / 2])) {
        hp[i] = hp[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    hp[i] = m;
}

static hmerge_t heap_pop(hmerge_t *hp, size_t *n)
{
    hmerge_t top = hp[0], last = hp[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&hp[c + 1], &hp[c])) c++;
        if (!heap_less(&hp[c], &last)) break;
        hp[i] = hp[c];
        i = c;
    }
    if (*n) hp[i] = last;
    return top;
}

static void push_pair(const hftok_t *h, hmerge_t *hp, size_t *nh, const sym_t *s, int32_t pos)
{
    hmerge_t m;
    if (merge_find(h, s[pos].c, s[s[pos].next].c, &m)) {
        m.pos = (uint32_t)pos;
        heap_push(hp, nh, m);
    }
}

/* The library's Word::merge_all: lowest (rank, position) first, a queued pair skipped once its
 * symbols no longer make the token it would. Bytes without a token are dropped, as the
 * library does without an unk_token. The ids go to dst (n of them at most); returns the count. */
static long merge_word(hftok_t *h, const uint8_t *p, size_t n, uint32_t *dst)
{
    if (n >= INT32_MAX) return -ENOMEM; /* positions are int32: no such pre-token in practice */
    sym_t *s = tok_grow(h->sym, &h->sym_cap, n, sizeof(sym_t));
    if (!s) return -ENOMEM;
    h->sym = s;
    hmerge_t *hp = tok_grow(h->heap, &h->heap_cap, 2 * n + 1, sizeof(hmerge_t));
    if (!hp) return -ENOMEM;
    h->heap = hp;
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        if (h->byte_id[p[i]] == NO_TOKEN) continue;
        s[ns] = (sym_t){.c = h->byte_id[p[i]], .len = 1, .prev = ns - 1, .next = ns + 1};
        ns++;
    }
    if (ns) s[ns - 1].next = -1;
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++) push_pair(h, hp, &nh, s, i);
    while (nh) {
        hmerge_t top = heap_pop(hp, &nh);
        sym_t *a = &s[top.pos];
        if (!a->len || a->next < 0) continue;
        sym_t *b = &s[a->next];
        hmerge_t cur;
        if (!merge_find(h, a->c, b->c, &cur) || cur.new_id != top.new_id) continue;
        a->c = top.new_id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (a->next >= 0) s[a->next].prev = (int32_t)top.pos;
        if (a->prev >= 0) push_pair(h, hp, &nh, s, a->prev);
        if (a->next >= 0) push_pair(h, hp, &nh, s, (int32_t)top.pos);
        if (nh + 2 > h->heap_cap) { /* cannot happen: each merge adds two and removes one */
            hp = tok_grow(h->heap, &h->heap_cap, nh + 2, sizeof(hmerge_t));
            if (!hp) return -ENOMEM;
            h->heap = hp;
        }
    }
    long k = 0;
    for (int32_t i = 0; i < ns; i++)
        if (s[i].len) dst[k++] = s[i].c;
    return k;
}

/* The ids of one pre-token, from the cache or made and remembered. */
static int encode_piece(hftok_t *h, const uint8_t *p, size_t n, sink_t *o)
{
    if (h->cache.n >= CACHE_MAX_ENTRIES || h->npool >= CACHE_MAX_POOL) {
        tok_ctab_free(&h->cache);
        h->npool = 0;
    }
    int found;
    tok_cslot_t *s = tok_ctab_upsert(&h->cache, p, (uint32_t)n, &found);
    if (!s) return -ENOMEM;
    if (!found) {
        uint32_t *pool = tok_grow(h->pool, &h->pool_cap, h->npool + n + 1, sizeof(uint32_t));
        int64_t id = h->ignore_merges ? find_id(&h->by_bytes, p, n) : -1;
        long k = 1;
        if (pool) {
            h->pool = pool;
            if (id >= 0) pool[h->npool + 1] = (uint32_t)id;
            else k = merge_word(h, p, n, pool + h->npool + 1);
        }
        if (!pool || k < 0) { /* drop the half-made entry so a later lookup cannot see it */
            tok_ctab_free(&h->cache);
            h->npool = 0;
            return -ENOMEM;
        }
        pool[h->npool] = (uint32_t)k;
        s->val = (uint32_t)h->npool;
        h->npool += 1 + (size_t)k;
    }
    const uint32_t *e = h->pool + s->val;
    if (o->n + e[0] > o->cap) return -E2BIG;
    memcpy(o->o + o->n, e + 1, e[0] * sizeof(uint32_t));
    o->n += e[0];
    return 0;
}

/* The pre-tokenizer steps from `step` on over p[0..n), then the model. */
static int pretok(hftok_t *h, int step, const uint8_t *p, size_t n, sink_t *o)
{
    if (!n) return 0;
    if (step == h->nsteps) return encode_piece(h, p, n, o);
    const step_t *s = &h->step[step];
    size_t (*split)(const uint8_t *, size_t) = s->kind == STEP_LLAMA3 ? hf_split_llama3 : hf_split_gpt2;
    if (s->kind == STEP_BYTELEVEL) {
        if (s->prefix && p[0] != ' ') {
            uint8_t *b = tok_grow(h->scratch[step], &h->scap[step], n + 1, 1);
            if (!b) return -ENOMEM;
            h->scratch[step] = b;
            b[0] = ' ';
            memcpy(b + 1, p, n++);
            p = b;
        }
        if (!s->regex) return pretok(h, step + 1, p, n, o);
    }
    for (size_t i = 0; i < n;) {
        size_t len = split(p + i, n - i);
        int rc = pretok(h, step + 1, p + i, len, o);
        if (rc) return rc;
        i += len;
    }
    return 0;
}

/* The leftmost-longest added token of matcher m in p[from..n): its index, *at its start. */
static int find_added(const hftok_t *h, const matcher_t *m, const uint8_t *p, size_t n, size_t from, size_t *at)
{
    for (size_t i = from; i < n; i++) {
        for (int j = m->start[p[i]]; j < m->start[p[i] + 1]; j++) {
            const added_t *a = &h->added[m->list[j]];
            if (a->len <= n - i && !memcmp(h->abytes + a->off, p + i, a->len)) {
                *at = i;
                return m->list[j];
            }
        }
    }
    return -1;
}

/* Where the whitespace (White_Space, as Rust's char::is_whitespace) that ends p[0..n) begins. */
static size_t space_start(const uint8_t *p, size_t n)
{
    while (n > 0) {
        size_t k = 0;
        for (size_t len = 1; len <= 3 && len <= n && !k; len++) {
            uint32_t cp;
            if (hf_utf8(p + n - len, len, &cp) == len && uni_class(cp) == UNI_SPACE) k = len;
        }
        if (!k) break;
        n -= k;
    }
    return n;
}

/* The length of the whitespace that begins p[0..n). */
static size_t space_len(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = hf_utf8(p + i, n - i, &cp);
        if (uni_class(cp) != UNI_SPACE) break;
        i += k;
    }
    return i;
}

/* Whether the character that ends p[0..n) (n > 0), or begins it, is a word character (the
 * library's regexes \w$ and ^\w). p[n] begins an added token, so no character straddles n. */
static int word_at_end(const uint8_t *p, size_t n)
{
    size_t len = 1;
    while (len < 4 && len < n && (p[n - len] & 0xC0) == 0x80) len++;
    uint32_t cp;
    if (hf_utf8(p + n - len, len, &cp) != len) cp = p[n - 1] < 0x80 ? p[n - 1] : 0x110000;
    return uni_word(cp);
}

static int word_at_start(const uint8_t *p, size_t n)
{
    uint32_t cp;
    hf_utf8(p, n, &cp);
    return uni_word(cp);
}

static int split_added(hftok_t *h, int pass, const uint8_t *p, size_t n, sink_t *o);

static int next_pass(hftok_t *h, int pass, const uint8_t *p, size_t n, sink_t *o)
{
    return pass == 0 ? split_added(h, 1, p, n, o) : pretok(h, 0, p, n, o);
}

/* The library's AddedVocabulary::find_matches: the added tokens of this pass come out whole
 * (lstrip and rstrip taking the whitespace beside them), the text between goes on. */
static int split_added(hftok_t *h, int pass, const uint8_t *p, size_t n, sink_t *o)
{
    const matcher_t *m = &h->match[pass];
    if (m->start[256] == 0) return next_pass(h, pass, p, n, o);
    size_t done = 0, pos = 0, start;
    int k, rc;
    while ((k = find_added(h, m, p, n, pos, &start)) >= 0) {
        const added_t *a = &h->added[k];
        size_t stop = start + a->len;
        pos = stop;
        if (a->single_word && ((start > 0 && word_at_end(p, start)) || (stop < n && word_at_start(p + stop, n - stop))))
            continue; /* inside a word: stays text */
        if (a->lstrip) {
            size_t s = space_start(p, start);
            start = s > done ? s : done;
        }
        if (a->rstrip) stop += space_len(p + stop, n - stop);
        if (done < start && (rc = next_pass(h, pass, p + done, start - done, o))) return rc;
        if (o->n + 1 > o->cap) return -E2BIG;
        o->o[o->n++] = a->id;
        done = stop;
    }
    return done < n ? next_pass(h, pass, p + done, n - done, o) : 0;
}

int hftok_encode(hftok_t *h, const uint8_t *text, size_t n, uint32_t *out, size_t cap, size_t *nout)
{
    sink_t o = {.o = out, .cap = cap};
    int rc = split_added(h, 0, text, n, &o);
    *nout = o.n;
    return rc;
}
