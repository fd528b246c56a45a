/* Tests of the Hugging Face tokenizer.json reader (stages/data/hftok.c, through tokenizer.h):
 * token for token against the `tokenizers` library (tests/hf_tok.py) on Llama 3's vocabulary
 * and on vocabularies trained there, llama.cpp's Llama 3 test strings, round trips of any bytes,
 * BOS/EOS, and the refusal of what is not supported, by name. */
#include <errno.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/testutil.h"
#include "stages/data/prep.h"
#include "stages/data/tokenizer.h"
#include "stages/data/tokfile.h"

static char tmp[] = "/tmp/ctitan-test-hftok-XXXXXX";
static char refdir[] = "/tmp/ctitan-test-hftok-ref-XXXXXX";
static int have_ref; /* hf_tok.py ran: refdir holds the corpus and reference ids */

/* ---- helpers ---- */

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    b[*n] = 0;
    return b;
}

static void write_text(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(s, f);
    assert_int_equal(fclose(f), 0);
}

static tok_t *load_ok(const char *path)
{
    char err[512] = "";
    tok_t *t = NULL;
    int rc = tok_load(&t, path, err, sizeof(err));
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    return t;
}

/* Encodes text and, when check, checks decode(encode(text)) == text; returns the ids (malloc'ed). */
static uint32_t *encode_ids(tok_t *t, const uint8_t *text, size_t n, size_t *nt, int check)
{
    size_t cap = tok_max_tokens(t, n) + 1;
    uint32_t *ids = malloc(cap * sizeof(uint32_t));
    assert_int_equal(tok_encode_cap(t, text, n, ids, cap, nt), 0);
    uint8_t *back;
    size_t nb;
    assert_int_equal(tok_decode(t, ids, *nt, &back, &nb), 0);
    if (check && (nb != n || memcmp(back, text, n))) fail_msg("decode(encode(x)) != x for \"%.*s\"", (int)(n < 80 ? n : 80), text);
    free(back);
    return ids;
}

static uint32_t *encode_checked(tok_t *t, const uint8_t *text, size_t n, size_t *nt)
{
    return encode_ids(t, text, n, nt, 1);
}

static void show(const char *what, const uint8_t *p, size_t n)
{
    print_error("%s: \"", what);
    for (size_t i = 0; i < n && i < 200; i++)
        print_error(p[i] >= 32 && p[i] < 127 && p[i] != '\\' ? "%c" : "\\x%02x", p[i]);
    print_error("\"\n");
}

/* The documents of corpus.bin that `ids_file` has ids for (all, or the first ones), against
 * them, and decode(encode(x)) == x for those without `unless` (NULL: all; "": none); returns
 * the bytes compared. */
static size_t compare_corpus(const char *tok_path, const char *ids_file, const char *unless)
{
    char path[512];
    size_t nc = 0, ni = 0;
    snprintf(path, sizeof(path), "%s/corpus.bin", refdir);
    uint8_t *corpus = slurp(path, &nc);
    snprintf(path, sizeof(path), "%s/%s", refdir, ids_file);
    uint8_t *ref = slurp(path, &ni);
    assert_non_null(corpus);
    assert_non_null(ref);
    tok_t *t = load_ok(tok_path);
    size_t pc = 0, pi = 0, docs = 0;
    while (pc < nc && pi < ni) {
        uint32_t len, cnt;
        memcpy(&len, corpus + pc, 4);
        memcpy(&cnt, ref + pi, 4);
        const uint8_t *text = corpus + pc + 4;
        const uint32_t *want = (const uint32_t *)(ref + pi + 4);
        size_t nt;
        int check = !unless || (*unless && !memmem(text, len, unless, strlen(unless)));
        uint32_t *got = encode_ids(t, text, len, &nt, check);
        size_t k = 0;
        while (k < nt && k < cnt && got[k] == want[k]) k++;
        if (k < nt || k < cnt) {
            show("document", text, len);
            print_error("%s, document %zu: token %zu is %d, tokenizers gives %d (%zu vs %u tokens)\n", ids_file,
                        docs, k, k < nt ? (int)got[k] : -1, k < cnt ? (int)want[k] : -1, nt, cnt);
            for (size_t j = k < 3 ? 0 : k - 3; j < k + 3 && j < cnt; j++) {
                size_t l;
                const uint8_t *b = tok_token_bytes(t, want[j], &l);
                print_error("  want[%zu] = %u ", j, want[j]);
                show("", b, l);
            }
            fail();
        }
        free(got);
        pc += 4 + len;
        pi += 4 + 4 * (size_t)cnt;
        docs++;
    }
    assert_int_equal(pi, ni);
    tok_destroy(&t);
    free(corpus);
    free(ref);
    return pc;
}

/* ---- against the tokenizers library ---- */

static void test_llama3_encodes_llama_cpp_test_strings(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    char path[512];
    snprintf(path, sizeof(path), "%s/llama3/ggml-vocab-llama-bpe.gguf.inp", py);
    size_t ni = 0, no = 0;
    uint8_t *inp = slurp(path, &ni);
    snprintf(path, sizeof(path), "%s/llama3/ggml-vocab-llama-bpe.gguf.out", py);
    uint8_t *out = slurp(path, &no);
    assert_non_null(inp);
    assert_non_null(out);
    snprintf(path, sizeof(path), "%s/llama3/tokenizer.json", py);
    tok_t *t = load_ok(path);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *s = (char *)inp, *line = (char *)out;
    int n = 0;
    for (char *e; (e = strstr(s, sep)); s = e + strlen(sep), n++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = 0;
        size_t nt;
        uint32_t *ids = encode_checked(t, (const uint8_t *)s, (size_t)(e - s), &nt);
        char got[4096] = "";
        size_t off = 0;
        for (size_t k = 0; k < nt; k++) off += snprintf(got + off, sizeof(got) - off, "%s%u", k ? " " : "", ids[k]);
        const char *want = line[0] == ' ' ? line + 1 : line; /* lines are " id id ..." */
        if (strcmp(got, want)) {
            show("test string", (const uint8_t *)s, (size_t)(e - s));
            fail_msg("string %d: got [%s], llama.cpp expects [%s]", n, got, want);
        }
        free(ids);
        line = nl + 1;
    }
    assert_int_equal(n, 46); /* the 47th piece of the split is what follows the last separator */
    tok_destroy(&t);
    free(inp);
    free(out);
}

static void test_llama3_matches_tokenizers_on_corpus(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    assert_true(have_ref);
    char path[512];
    snprintf(path, sizeof(path), "%s/llama3/tokenizer.json", py);
    size_t n = compare_corpus(path, "llama3.ids", NULL);
    assert_true(n >= (1u << 20));
}

static void test_trained_vocab_matches_tokenizers(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    assert_true(have_ref);
    char path[512];
    snprintf(path, sizeof(path), "%s/trained/tokenizer.json", refdir);
    size_t n = compare_corpus(path, "trained.ids", "<sep>"); /* lstrip/rstrip drop the spaces beside it */
    assert_true(n >= (1u << 20));
    tok_t *t = load_ok(path);
    assert_int_equal(tok_token_id(t, "<|endoftext|>"), 0);
    assert_int_equal(tok_eos(t), 0);
    assert_int_equal(tok_bos(t), -1);
    tok_destroy(&t);
}

static void test_prefix_space_vocab_matches_tokenizers(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    assert_true(have_ref);
    char path[512];
    snprintf(path, sizeof(path), "%s/prefix/tokenizer.json", refdir);
    compare_corpus(path, "prefix.ids", ""); /* decodes with the prefix space */
}

static void test_llama3_bos_eos_and_special_ids(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    char path[512];
    snprintf(path, sizeof(path), "%s/llama3/tokenizer.json", py);
    tok_t *t = load_ok(path);
    assert_int_equal(tok_vocab_size(t), 128256);
    assert_int_equal(tok_bos(t), 128000);
    assert_int_equal(tok_eos(t), 128001);
    assert_int_equal(tok_token_id(t, "<|begin_of_text|>"), 128000);
    assert_int_equal(tok_token_id(t, "<|eot_id|>"), 128009);
    assert_int_equal(tok_token_id(t, "hello"), -1);
    size_t len;
    const uint8_t *b = tok_token_bytes(t, 128001, &len);
    assert_int_equal(len, 15);
    assert_memory_equal(b, "<|end_of_text|>", 15);
    assert_null(tok_token_bytes(t, 128256, &len));
    uint32_t a, c;
    assert_int_equal(tok_merge(t, 0, &a, &c), 0);
    tok_destroy(&t);
}

/* ---- a small tokenizer.json written here ---- */

/* GPT-2's byte-level alphabet: the character that stands for byte b, as UTF-8 into out. */
static int byte_utf8(int b, char *out)
{
    int n = 0, c = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        for (int x = 0; x < b; x++)
            n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
        c = 256 + n;
    }
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    out[0] = (char)(0xC0 | c >> 6);
    out[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

typedef struct {
    const char *type, *model_extra, *vocab_extra, *merges, *added, *normalizer, *pre, *decoder, *post;
} mini_t;

static const mini_t MINI = {
    .type = "\"BPE\"",
    .model_extra = "",
    .vocab_extra = ",\"\\u0120t\":256,\"he\":257,\"\\u0120the\":258",
    .merges = "[\"\\u0120 t\",[\"h\",\"e\"],\"\\u0120t he\"]",
    .added = "[{\"id\":259,\"content\":\"<|endoftext|>\",\"single_word\":false,\"lstrip\":false,"
             "\"rstrip\":false,\"normalized\":false,\"special\":true}]",
    .normalizer = "null",
    .pre = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}",
    .decoder = "{\"type\":\"ByteLevel\"}",
    .post = "null",
};

/* Writes the tokenizer.json m describes into dir; returns its path (static). */
static const char *write_mini(const char *dir, const mini_t *m)
{
    static char path[512];
    static char json[65536];
    char vocab[8192];
    size_t o = 0;
    for (int b = 0; b < 256; b++) {
        char ch[4];
        int n = byte_utf8(b, ch);
        o += snprintf(vocab + o, sizeof(vocab) - o, "%s\"", b ? "," : "");
        for (int k = 0; k < n; k++) {
            if (ch[k] == '"' || ch[k] == '\\') vocab[o++] = '\\';
            vocab[o++] = ch[k];
        }
        o += snprintf(vocab + o, sizeof(vocab) - o, "\":%d", b);
    }
    snprintf(json, sizeof(json),
             "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":%s,\"normalizer\":%s,"
             "\"pre_tokenizer\":%s,\"post_processor\":%s,\"decoder\":%s,\"model\":{\"type\":%s,%s"
             "\"vocab\":{%s%s},\"merges\":%s}}\n",
             m->added, m->normalizer, m->pre, m->post, m->decoder, m->type, m->model_extra, vocab, m->vocab_extra,
             m->merges);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    write_text(path, json);
    return path;
}

static void test_any_bytes_round_trip(void **state)
{
    (void)state;
    tok_t *t = load_ok(write_mini(tmp, &MINI));
    assert_int_equal(tok_vocab_size(t), 260);
    const char *cases[] = {"", "the the", " the<|endoftext|>the", "\xff\xfe", ("a\x80" "b"), "\xc3", "\xe2\x82",
                           "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf", "'s\xf0\x9f\x98", "\x00\x01 \x00"};
    size_t lens[] = {0, 7, 20, 2, 3, 1, 2, 3, 4, 2, 5, 4};
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        size_t n;
        free(encode_checked(t, (const uint8_t *)cases[i], lens[i], &n));
    }
    size_t n;
    uint32_t *ids = encode_checked(t, (const uint8_t *)" the<|endoftext|>", 17, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 258);
    assert_int_equal(ids[1], 259);
    free(ids);
    uint64_t seed = 7;
    uint8_t buf[4096];
    for (int r = 0; r < 200; r++) { /* random bytes, biased to UTF-8 lead and continuation bytes */
        size_t len = tu_next(&seed) % sizeof(buf);
        for (size_t i = 0; i < len; i++) {
            uint64_t x = tu_next(&seed);
            buf[i] = (uint8_t)(x & 3 ? x >> 8 : 0x80 | (x >> 8 & 0x7f));
        }
        free(encode_checked(t, buf, len, &n));
        assert_true(n <= len);
    }
    uint32_t bad = 260;
    uint8_t *out;
    size_t nb;
    assert_int_equal(tok_decode(t, &bad, 1, &out, &nb), -EINVAL);
    tok_destroy(&t);
}

static void test_prefix_space_may_need_more_tokens_than_bytes(void **state)
{
    (void)state;
    mini_t m = MINI;
    m.pre = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}";
    tok_t *t = load_ok(write_mini(tmp, &m));
    uint32_t ids[4] = {0, 0, 0, 7};
    size_t n = 0;
    assert_int_equal(tok_max_tokens(t, 1), 2);
    assert_int_equal(tok_encode(t, (const uint8_t *)"a", 1, ids, &n), -E2BIG);
    assert_int_equal(ids[1], 0); /* nothing written past the n tokens it was given */
    assert_int_equal(tok_encode_cap(t, (const uint8_t *)"a", 1, ids, 2, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 32); /* the space's byte token (id = byte here), then 'a' */
    assert_int_equal(ids[1], 'a');
    assert_int_equal(tok_encode_cap(t, (const uint8_t *)"the", 3, ids, 3, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 258);
    tok_destroy(&t);
}

static void test_bos_eos_from_template_and_config(void **state)
{
    (void)state;
    mini_t m = MINI;
    m.added = "[{\"id\":259,\"content\":\"<s>\",\"special\":true},{\"id\":260,\"content\":\"</s>\",\"special\":true}]";
    m.post = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
             "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\","
             "\"ids\":[259],\"tokens\":[\"<s>\"]}}}";
    tok_t *t = load_ok(write_mini(tmp, &m));
    assert_int_equal(tok_bos(t), 259);
    assert_int_equal(tok_eos(t), 260);
    tok_destroy(&t);
    char cfg[512];
    snprintf(cfg, sizeof(cfg), "%s/tokenizer_config.json", tmp);
    write_text(cfg, "{\"bos_token\":{\"content\":\"</s>\"},\"eos_token\":\"<s>\"}");
    t = load_ok(write_mini(tmp, &m));
    assert_int_equal(tok_bos(t), 260);
    assert_int_equal(tok_eos(t), 259);
    tok_destroy(&t);
    write_text(cfg, "{\"bos_token\":null,\"eos_token\":\"he\"}"); /* a model token does too */
    t = load_ok(write_mini(tmp, &m));
    assert_int_equal(tok_bos(t), -1);
    assert_int_equal(tok_eos(t), 257);
    tok_destroy(&t);
    char err[512] = "";
    write_text(cfg, "{\"bos_token\":\"<nope>\"}");
    assert_int_equal(tok_load(&t, write_mini(tmp, &m), err, sizeof(err)), -EINVAL);
    assert_null(t);
    assert_non_null(strstr(err, "tokenizer_config.json: bos_token \"<nope>\" is not a token"));
    write_text(cfg, "{\"bos_token\": [");
    assert_int_equal(tok_load(&t, write_mini(tmp, &m), err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "tokenizer_config.json:1:"));
    unlink(cfg);
}

static void refused(const mini_t *m, const char *want)
{
    char err[512] = "";
    tok_t *t = (tok_t *)1;
    const char *path = write_mini(tmp, m);
    int rc = tok_load(&t, path, err, sizeof(err));
    if (rc != -EINVAL || !strstr(err, want) || !strstr(err, path))
        fail_msg("rc %d, error \"%s\"; expected -EINVAL naming %s and \"%s\"", rc, err, path, want);
    assert_null(t);
}

static void test_unsupported_tokenizers_are_refused_by_name(void **state)
{
    (void)state;
    mini_t m = MINI;
    m.type = "\"Unigram\"";
    refused(&m, "model type Unigram is not supported");
    m.type = "\"WordPiece\"";
    refused(&m, "model type WordPiece is not supported");
    m = MINI;
    m.model_extra = "\"dropout\":0.1,";
    refused(&m, "dropout is set");
    m.model_extra = "\"unk_token\":\"<unk>\",";
    refused(&m, "unk_token is set");
    m.model_extra = "\"continuing_subword_prefix\":\"##\",";
    refused(&m, "continuing_subword_prefix is set");
    m.model_extra = "\"byte_fallback\":true,";
    refused(&m, "byte_fallback is set");
    m = MINI;
    m.merges = "[\"\\u0120 zz\"]";
    refused(&m, "model.merges[0]: token \"zz\" is not in model.vocab");
    m.merges = "[\"a b c\"]";
    refused(&m, "model.merges[0]: \"a b c\" is not two tokens");
    m.merges = "[\"x y\"]"; /* "xy" is not a token */
    refused(&m, "token \"xy\" is not in model.vocab");
    m = MINI;
    m.vocab_extra = ",\"\\u0120t\":256,\"he\":256";
    refused(&m, "id 256 is given to two tokens");
    m.vocab_extra = ",\"he\":99999999";
    refused(&m, "token \"he\" has id out of range");
    m.vocab_extra = ",\"he\":-1";
    refused(&m, "token \"he\" has id out of range");
    m.vocab_extra = ",\"he\":\"x\"";
    refused(&m, "that is not an integer");
    m.vocab_extra = ",\"\":256";
    refused(&m, "id 256 is given to an empty token");
    m = MINI;
    m.normalizer = "{\"type\":\"NFC\"}";
    refused(&m, "normalizer NFC is not supported");
    m = MINI;
    m.pre = "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"behavior\":\"Isolated\"}";
    refused(&m, "regex \\s+ is not supported");
    m.pre = "{\"type\":\"Whitespace\"}";
    refused(&m, "pre_tokenizer Whitespace is not supported");
    m.pre = "null";
    refused(&m, "expected a byte-level BPE");
    m = MINI;
    m.decoder = "{\"type\":\"WordPiece\"}";
    refused(&m, "decoder WordPiece is not supported");
    m = MINI;
    m.added = "[{\"id\":300,\"content\":\"<x>\"}]";
    refused(&m, "added_tokens[0] (\"<x>\"): id 300, but the tokenizers library gives it id 259");
    m.added = "[{\"id\":259,\"content\":\"<x>\"},{\"id\":259,\"content\":\"<x>\"}]";
    refused(&m, "\"<x>\" is listed twice");
    m.added = "[{\"id\":259,\"content\":\"\"}]";
    refused(&m, "content is missing, empty");
    m = MINI;
    m.merges = "[\"\\u0120 t\",";
    refused(&m, "malformed JSON");
    char err[512], path[512];
    tok_t *t;
    snprintf(path, sizeof(path), "%s/tokenizer.json", tmp);
    write_text(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,\n \"a\": 1}}}");
    assert_int_equal(tok_load(&t, path, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, ":2:"));
    write_text(path, "  [1, 2]");
    assert_int_equal(tok_load(&t, path, err, sizeof(err)), -EINVAL); /* not '{': a tokenizer.bin? no */
    write_text(path, "{}");
    assert_int_equal(tok_load(&t, path, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "model: missing"));
}

static void test_save_writes_the_json_back(void **state)
{
    (void)state;
    tok_t *t = load_ok(write_mini(tmp, &MINI));
    char err[512], path[512];
    snprintf(path, sizeof(path), "%s/copy.bin", tmp);
    assert_int_equal(tok_save(t, path, err, sizeof(err)), 0);
    tok_t *u = load_ok(path);
    assert_int_equal(tok_vocab_size(u), 260);
    tok_destroy(&u);
    u = load_ok(tmp); /* a folder: its tokenizer.json */
    assert_int_equal(tok_vocab_size(u), 260);
    tok_destroy(&u);
    tok_destroy(&t);
    /* ctitan's own tokenizer.bin has no added tokens, BOS or EOS */
    uint8_t text[4096];
    for (size_t i = 0; i < sizeof(text); i++) text[i] = (uint8_t)("the cat sat. "[i % 13]);
    assert_int_equal(tok_train(&t, text, sizeof(text), 260, err, sizeof(err)), 0);
    assert_int_equal(tok_bos(t), -1);
    assert_int_equal(tok_eos(t), -1);
    assert_int_equal(tok_token_id(t, "<|endoftext|>"), -1);
    tok_destroy(&t);
}

static void test_prep_encodes_with_a_given_tokenizer(void **state)
{
    (void)state;
    const char *tpath = write_mini(tmp, &MINI);
    char text[512], out[256], path[512], err[512] = "";
    snprintf(text, sizeof(text), "%s/corpus.txt", tmp);
    snprintf(out, sizeof(out), "%s/prep", tmp);
    const char *doc = "the theme<|endoftext|> then the end\n";
    write_text(text, doc);
    char config[512];
    snprintf(config, sizeof(config), "%s/tokenizer_config.json", tmp); /* its EOS goes with it */
    write_text(config, "{\"eos_token\": \"<|endoftext|>\"}");
    char *argv[] = {"prep", "--tokenizer", (char *)tpath, "--out", out, "--val-fraction", "0", text};
    prep_opts_t o;
    assert_int_equal(prep_parse_args(8, argv, &o, err, sizeof(err)), 0);
    assert_string_equal(o.tokenizer, tpath);
    prep_result_t r;
    int rc = prep_run(&o, &r, err, sizeof(err));
    if (rc) fail_msg("prep: %s", err);
    assert_int_equal(r.vocab_size, 260);
    tok_t *t = load_ok(tpath);
    size_t n;
    uint32_t *want = encode_checked(t, (const uint8_t *)doc, strlen(doc), &n);
    assert_int_equal(r.n_tokens, n);
    tokfile_t *tf;
    snprintf(path, sizeof(path), "%s/train.bin", out);
    assert_int_equal(tokfile_open(&tf, path, 260, err, sizeof(err)), 0);
    assert_int_equal(tokfile_count(tf), n);
    int32_t got[64];
    assert_int_equal(tokfile_read(tf, 0, n, got), 0);
    for (size_t i = 0; i < n; i++) assert_int_equal(got[i], (int32_t)want[i]);
    tokfile_close(&tf);
    snprintf(path, sizeof(path), "%s/tokenizer.json", out); /* the tokenizer.json, copied under its own name */
    tok_t *u = load_ok(path);
    assert_int_equal(tok_token_id(u, "<|endoftext|>"), 259);
    assert_int_equal(tok_eos(u), 259);
    char copied[256];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", out); /* copied beside it, for BOS and EOS */
    tu_read_file(path, copied, sizeof(copied));
    assert_string_equal(copied, "{\"eos_token\": \"<|endoftext|>\"}");
    snprintf(path, sizeof(path), "%s/tokenizer.bin", out);
    assert_int_not_equal(access(path, F_OK), 0);
    unlink(config);
    tok_destroy(&u);
    tok_destroy(&t);
    free(want);
    o.tokenizer = "/nonexistent/tokenizer.json";
    assert_int_not_equal(prep_run(&o, &r, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "loading the tokenizer: /nonexistent/tokenizer.json"));
}

/* ---- setup ---- */

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(tmp) || !mkdtemp(refdir)) return -1;
    char why[512], cmd[2048], out[4096];
    const char *py = tu_py(why, sizeof(why));
    if (!py) return 0;
    snprintf(cmd, sizeof(cmd), "RAYON_NUM_THREADS=2 %s/venv/bin/python tests/hf_tok.py %s %s/llama3/tokenizer.json 2>&1",
             py, refdir, py);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc) fprintf(stderr, "%s: exit %d\n%s\n", cmd, rc, out);
    have_ref = rc == 0;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(tmp);
    tu_rmtree(refdir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_any_bytes_round_trip),
        cmocka_unit_test(test_prefix_space_may_need_more_tokens_than_bytes),
        cmocka_unit_test(test_bos_eos_from_template_and_config),
        cmocka_unit_test(test_unsupported_tokenizers_are_refused_by_name),
        cmocka_unit_test(test_save_writes_the_json_back),
        cmocka_unit_test(test_prep_encodes_with_a_given_tokenizer),
        cmocka_unit_test(test_llama3_encodes_llama_cpp_test_strings),
        cmocka_unit_test(test_llama3_bos_eos_and_special_ids),
        cmocka_unit_test(test_llama3_matches_tokenizers_on_corpus),
        cmocka_unit_test(test_trained_vocab_matches_tokenizers),
        cmocka_unit_test(test_prefix_space_vocab_matches_tokenizers),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
