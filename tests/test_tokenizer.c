/* Tests of the byte-level BPE tokenizer (stages/data/tokenizer.c): the pre-split, training against a
 * naive reference, determinism, compression, exact round trips of arbitrary bytes, and the
 * tokenizer.bin format with its corruption checks. */
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "tests/testutil.h"
#include "stages/data/tokenizer.h"

/* ---- helpers ---- */

static char *make_tmpdir(void)
{
    char *d = strdup("/tmp/ctitan-test-tok-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void remove_tmpdir(char *d)
{
    tu_rmtree(d);
    assert_int_not_equal(access(d, F_OK), 0);
    free(d);
}

/* Pseudo-English with numbers, punctuation, tabs, runs of spaces and some UTF-8. */
static uint8_t *make_corpus(uint64_t seed, size_t n)
{
    static const char *words[] = {
        "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then",
        "a", "cat", "sat", "on", "mat", "there", "these", "those", "other", "mother",
        "café", "naïve", "über", "is", "in", "it", "of", "to", "that", "with",
    };
    static const char *punct[] = {".", ",", "!", "?", "--", "...", ";", ":", "'s", "\""};
    uint8_t *t = malloc(n + 64);
    size_t i = 0;
    uint64_t s = seed;
    while (i < n) {
        uint64_t r = tu_next(&s);
        const char *w;
        char num[24];
        switch (r % 16) {
        case 0: snprintf(num, sizeof(num), "%u", (unsigned)(r >> 32) % 5000); w = num; break;
        case 1: w = punct[(r >> 8) % 10]; break;
        case 2: w = (r >> 8) % 4 ? "\n" : "\n\t"; break;
        case 3: w = "  "; break;
        default: w = words[(r >> 8) % 30]; break;
        }
        size_t l = strlen(w);
        if (i + l + 1 > n) break;
        memcpy(t + i, w, l);
        i += l;
        if ((r >> 40) % 3) t[i++] = ' ';
    }
    while (i < n) t[i++] = 'x';
    return t;
}

#define CORPUS_BYTES 40000
#define VOCAB 512

typedef struct {
    uint8_t *corpus;
    tok_t *tok;
} fixture_t;

static int group_setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    f->corpus = make_corpus(42, CORPUS_BYTES);
    char err[256];
    if (tok_train(&f->tok, f->corpus, CORPUS_BYTES, VOCAB, err, sizeof(err))) {
        fprintf(stderr, "train: %s\n", err);
        return -1;
    }
    *state = f;
    return 0;
}

static int group_teardown(void **state)
{
    fixture_t *f = *state;
    tok_destroy(&f->tok);
    free(f->corpus);
    free(f);
    return 0;
}

static void assert_roundtrip(tok_t *t, const uint8_t *s, size_t n)
{
    uint32_t *ids = malloc((n ? n : 1) * sizeof(uint32_t));
    size_t nt = 0;
    assert_int_equal(tok_encode(t, s, n, ids, &nt), 0);
    assert_true(nt <= n);
    for (size_t i = 0; i < nt; i++) assert_true(ids[i] < (uint32_t)tok_vocab_size(t));
    uint8_t *back = NULL;
    size_t nb = 0;
    assert_int_equal(tok_decode(t, ids, nt, &back, &nb), 0);
    assert_int_equal(nb, n);
    assert_memory_equal(back, s, n);
    free(back);
    free(ids);
}

/* Plain BPE: recount every pair over every chunk, take the most frequent, ties to the
 * smallest (a, b). What tok_train's incremental counting must reproduce exactly. */
static uint32_t *naive_train(const uint8_t *text, size_t n, int vocab)
{
    size_t nchunks = 0, cap = 1024;
    uint32_t **ch = malloc(cap * sizeof(*ch));
    size_t *len = malloc(cap * sizeof(*len));
    for (size_t i = 0; i < n;) {
        size_t l = tok_chunk_len(text + i, n - i);
        if (nchunks == cap) {
            cap *= 2;
            ch = realloc(ch, cap * sizeof(*ch));
            len = realloc(len, cap * sizeof(*len));
        }
        ch[nchunks] = malloc(l * sizeof(uint32_t));
        for (size_t k = 0; k < l; k++) ch[nchunks][k] = text[i + k];
        len[nchunks++] = l;
        i += l;
    }
    int nm = vocab - 256;
    uint32_t *merges = malloc(2 * nm * sizeof(uint32_t));
    int64_t *cnt = malloc((size_t)vocab * vocab * sizeof(int64_t));
    for (int m = 0; m < nm; m++) {
        memset(cnt, 0, (size_t)vocab * vocab * sizeof(int64_t));
        for (size_t c = 0; c < nchunks; c++)
            for (size_t k = 0; k + 1 < len[c]; k++) cnt[(size_t)ch[c][k] * vocab + ch[c][k + 1]]++;
        int64_t best = 0;
        size_t bi = 0;
        for (size_t p = 0; p < (size_t)vocab * vocab; p++)
            if (cnt[p] > best) best = cnt[p], bi = p;
        assert_true(best > 0);
        uint32_t a = (uint32_t)(bi / vocab), b = (uint32_t)(bi % vocab), z = 256 + m;
        merges[2 * m] = a;
        merges[2 * m + 1] = b;
        for (size_t c = 0; c < nchunks; c++) {
            size_t j = 0;
            for (size_t k = 0; k < len[c];) {
                if (k + 1 < len[c] && ch[c][k] == a && ch[c][k + 1] == b) {
                    ch[c][j++] = z;
                    k += 2;
                } else {
                    ch[c][j++] = ch[c][k++];
                }
            }
            len[c] = j;
        }
    }
    for (size_t c = 0; c < nchunks; c++) free(ch[c]);
    free(ch);
    free(len);
    free(cnt);
    return merges;
}

static void assert_chunks(const char *text, const char *const *want, size_t nwant)
{
    size_t n = strlen(text), i = 0, k = 0;
    while (i < n) {
        size_t l = tok_chunk_len((const uint8_t *)text + i, n - i);
        assert_true(k < nwant);
        if (l != strlen(want[k]) || memcmp(text + i, want[k], l))
            fail_msg("chunk %zu of \"%s\": got \"%.*s\", want \"%s\"", k, text, (int)l, text + i,
                     want[k]);
        i += l;
        k++;
    }
    assert_int_equal(k, nwant);
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    uint8_t *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void write_all_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* ---- tests ---- */

static void test_chunks_follow_gpt2_style_split(void **state)
{
    assert_chunks("Hello world", (const char *[]){"Hello", " world"}, 2);
    assert_chunks("a  b", (const char *[]){"a", " ", " b"}, 3);
    assert_chunks("x123..y", (const char *[]){"x", "123", "..", "y"}, 4);
    assert_chunks("end.\n\nNext", (const char *[]){"end", ".", "\n\n", "Next"}, 4);
    assert_chunks(" 42 !?", (const char *[]){" 42", " !?"}, 2);
    assert_chunks("café au", (const char *[]){"café", " au"}, 2);
    assert_chunks("trailing  ", (const char *[]){"trailing", "  "}, 2);
    /* a long run is cut at TOK_MAX_CHUNK */
    char longrun[300];
    memset(longrun, 'a', sizeof(longrun));
    assert_int_equal(tok_chunk_len((uint8_t *)longrun, sizeof(longrun)), TOK_MAX_CHUNK);
}

static void test_train_matches_naive_reference(void **state)
{
    /* small enough for the naive trainer; includes overlapping pairs ("aaaa") */
    size_t n = 12000;
    uint8_t *text = make_corpus(7, n);
    memcpy(text + 100, " aaaa aaa aaaaa", 15);
    int vocab = 256 + 120;
    tok_t *t = NULL;
    char err[256];
    assert_int_equal(tok_train(&t, text, n, vocab, err, sizeof(err)), 0);
    uint32_t *ref = naive_train(text, n, vocab);
    for (int r = 0; r < vocab - 256; r++) {
        uint32_t a, b;
        assert_int_equal(tok_merge(t, r, &a, &b), 0);
        if (a != ref[2 * r] || b != ref[2 * r + 1])
            fail_msg("merge %d: got (%u, %u), reference (%u, %u)", r, a, b, ref[2 * r],
                     ref[2 * r + 1]);
    }
    free(ref);
    tok_destroy(&t);
    free(text);
}

static void test_train_is_deterministic(void **state)
{
    fixture_t *f = *state;
    tok_t *t = NULL;
    char err[256];
    assert_int_equal(tok_train(&t, f->corpus, CORPUS_BYTES, VOCAB, err, sizeof(err)), 0);
    assert_int_equal(tok_vocab_size(t), VOCAB);
    for (int r = 0; r < VOCAB - 256; r++) {
        uint32_t a1, b1, a2, b2;
        assert_int_equal(tok_merge(t, r, &a1, &b1), 0);
        assert_int_equal(tok_merge(f->tok, r, &a2, &b2), 0);
        assert_int_equal(a1, a2);
        assert_int_equal(b1, b2);
    }
    uint32_t a, b;
    assert_int_equal(tok_merge(t, VOCAB - 256, &a, &b), -ERANGE);
    tok_destroy(&t);
}

static void test_merges_compress_training_text(void **state)
{
    fixture_t *f = *state;
    uint32_t *ids = malloc(CORPUS_BYTES * sizeof(uint32_t));
    size_t nt;
    assert_int_equal(tok_encode(f->tok, f->corpus, CORPUS_BYTES, ids, &nt), 0);
    /* this corpus has a 30-word vocabulary: 256 merges should at least halve it */
    if (nt * 2 > CORPUS_BYTES) fail_msg("%zu tokens for %d bytes", nt, CORPUS_BYTES);
    /* every merge is used somewhere: rank r makes token 256 + r */
    uint8_t *seen = calloc(VOCAB, 1);
    for (size_t i = 0; i < nt; i++) seen[ids[i]] = 1;
    int used = 0;
    for (int v = 256; v < VOCAB; v++) used += seen[v];
    assert_true(used > (VOCAB - 256) / 2);
    free(seen);
    free(ids);
}

static void test_roundtrip_random_byte_strings(void **state)
{
    fixture_t *f = *state;
    uint64_t s = 123;
    uint8_t buf[3000];
    for (int iter = 0; iter < 300; iter++) {
        size_t n = tu_next(&s) % sizeof(buf);
        int mode = iter % 3;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = tu_next(&s);
            if (mode == 0) buf[i] = (uint8_t)r;                         /* any byte */
            else if (mode == 1) buf[i] = f->corpus[(r >> 8) % CORPUS_BYTES]; /* text-like */
            else buf[i] = (r & 7) ? f->corpus[(iter * 97 + i) % CORPUS_BYTES] : (uint8_t)(r >> 8);
        }
        assert_roundtrip(f->tok, buf, n);
    }
}

static void test_roundtrip_all_byte_values_nul_and_empty(void **state)
{
    fixture_t *f = *state;
    uint8_t all[512];
    for (int i = 0; i < 256; i++) all[i] = (uint8_t)i, all[511 - i] = (uint8_t)i;
    assert_roundtrip(f->tok, all, sizeof(all));
    assert_roundtrip(f->tok, (const uint8_t *)"", 0);
    uint8_t nul[1000] = {0};
    assert_roundtrip(f->tok, nul, sizeof(nul));
    const uint8_t bad_utf8[] = {0xc3, 0x28, 0xe2, 0x82, 0xff, 0xfe, ' ', 't', 'h', 'e', 0x80};
    assert_roundtrip(f->tok, bad_utf8, sizeof(bad_utf8));
    uint8_t *runs = malloc(20000);
    memset(runs, ' ', 7000);
    memset(runs + 7000, 'a', 7000);
    memset(runs + 14000, '\n', 6000);
    assert_roundtrip(f->tok, runs, 20000);
    free(runs);
    /* encoding empty input gives no tokens */
    uint32_t id;
    size_t nt = 99;
    assert_int_equal(tok_encode(f->tok, (const uint8_t *)"", 0, &id, &nt), 0);
    assert_int_equal(nt, 0);
}

static void test_encoding_is_independent_of_cache_state(void **state)
{
    fixture_t *f = *state;
    const char *s = "the other mother sat on the mat, 1234 times!";
    size_t n = strlen(s), n1, n2;
    uint32_t a[64], b[64];
    tok_t *fresh = NULL;
    char err[256];
    assert_int_equal(tok_train(&fresh, f->corpus, CORPUS_BYTES, VOCAB, err, sizeof(err)), 0);
    assert_int_equal(tok_encode(fresh, (const uint8_t *)s, n, a, &n1), 0); /* cold cache */
    assert_int_equal(tok_encode(f->tok, (const uint8_t *)s, n, b, &n2), 0); /* warm cache */
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1 * sizeof(uint32_t));
    assert_true(n1 < n / 2);
    tok_destroy(&fresh);
}

static void test_token_bytes_concatenate_to_text(void **state)
{
    fixture_t *f = *state;
    const char *s = "the quick brown fox jumps over the lazy dog.";
    size_t n = strlen(s), nt, off = 0, l;
    uint32_t ids[64];
    assert_int_equal(tok_encode(f->tok, (const uint8_t *)s, n, ids, &nt), 0);
    for (size_t i = 0; i < nt; i++) {
        const uint8_t *p = tok_token_bytes(f->tok, ids[i], &l);
        assert_non_null(p);
        assert_true(off + l <= n);
        assert_memory_equal(p, s + off, l);
        off += l;
    }
    assert_int_equal(off, n);
    assert_null(tok_token_bytes(f->tok, VOCAB, &l));
    uint8_t *out = NULL;
    size_t nout;
    uint32_t bad[2] = {1, VOCAB};
    assert_int_equal(tok_decode(f->tok, bad, 2, &out, &nout), -EINVAL);
    assert_null(out);
}

static void test_train_rejects_bad_vocab_and_tiny_corpus(void **state)
{
    tok_t *t = NULL;
    char err[256];
    const uint8_t *s = (const uint8_t *)"ab ab ab";
    assert_int_equal(tok_train(&t, s, 8, 256, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "vocab_size 256"));
    assert_int_equal(tok_train(&t, s, 8, TOK_MAX_VOCAB + 1, err, sizeof(err)), -EINVAL);
    assert_int_equal(tok_train(&t, s, 8, 300, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "corpus too small"));
    assert_null(t);
    assert_int_equal(tok_train(&t, s, 8, 258, err, sizeof(err)), 0); /* "ab", " ab" */
    tok_destroy(&t);
    assert_null(t);
}

static void test_save_load_gives_identical_encodings(void **state)
{
    fixture_t *f = *state;
    char *dir = make_tmpdir(), path[512], err[256];
    snprintf(path, sizeof(path), "%s/tokenizer.bin", dir);
    assert_int_equal(tok_save(f->tok, path, err, sizeof(err)), 0);
    tok_t *t = NULL;
    if (tok_load(&t, path, err, sizeof(err))) fail_msg("load: %s", err);
    assert_int_equal(tok_vocab_size(t), VOCAB);
    uint32_t *a = malloc(CORPUS_BYTES * 4), *b = malloc(CORPUS_BYTES * 4);
    size_t na, nb;
    assert_int_equal(tok_encode(f->tok, f->corpus, CORPUS_BYTES, a, &na), 0);
    assert_int_equal(tok_encode(t, f->corpus, CORPUS_BYTES, b, &nb), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * 4);
    for (uint32_t v = 0; v < VOCAB; v++) {
        size_t l1, l2;
        const uint8_t *p1 = tok_token_bytes(f->tok, v, &l1), *p2 = tok_token_bytes(t, v, &l2);
        assert_int_equal(l1, l2);
        assert_memory_equal(p1, p2, l1);
    }
    /* saving again gives the same bytes (no temp files left beside it) */
    char path2[512];
    snprintf(path2, sizeof(path2), "%s/again.bin", dir);
    assert_int_equal(tok_save(t, path2, err, sizeof(err)), 0);
    size_t n1, n2;
    uint8_t *f1 = read_all(path, &n1), *f2 = read_all(path2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(f1, f2, n1);
    assert_int_equal(n1, 32 + 8 * (VOCAB - 256));
    free(f1);
    free(f2);
    free(a);
    free(b);
    tok_destroy(&t);
    remove_tmpdir(dir);
}

/* Writes a corrupted copy of a good file, loads it, checks the error names file and problem. */
static void expect_load_error(const char *path, const uint8_t *b, size_t n, const char *want)
{
    write_all_file(path, b, n);
    tok_t *t = NULL;
    char err[512] = "";
    int rc = tok_load(&t, path, err, sizeof(err));
    if (rc == 0) fail_msg("%s: loaded, expected an error containing \"%s\"", path, want);
    assert_null(t);
    if (!strstr(err, path) || !strstr(err, want))
        fail_msg("error \"%s\" should name %s and contain \"%s\"", err, path, want);
}

static void test_load_rejects_corrupt_files(void **state)
{
    fixture_t *f = *state;
    char *dir = make_tmpdir(), good[512], bad[512], err[512];
    snprintf(good, sizeof(good), "%s/good.bin", dir);
    snprintf(bad, sizeof(bad), "%s/bad.bin", dir);
    assert_int_equal(tok_save(f->tok, good, err, sizeof(err)), 0);
    size_t n;
    uint8_t *g = read_all(good, &n), *b = malloc(n + 16);

    tok_t *t = NULL;
    char missing[512];
    snprintf(missing, sizeof(missing), "%s/missing.bin", dir);
    assert_int_equal(tok_load(&t, missing, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, missing));

    expect_load_error(bad, g, 10, "header too short");
    expect_load_error(bad, g, n - 4, "does not match vocab_size");
    memcpy(b, g, n);
    memset(b + n, 0, 8);
    expect_load_error(bad, b, n + 8, "does not match vocab_size");
    memcpy(b, g, n);
    b[0] = 'X';
    expect_load_error(bad, b, n, "bad magic");
    memcpy(b, g, n);
    b[8] = 2;
    expect_load_error(bad, b, n, "unsupported version 2");
    memcpy(b, g, n);
    b[16] = 9;
    expect_load_error(bad, b, n, "pre-split rule 9");
    memcpy(b, g, n);
    uint32_t v = 100;
    memcpy(b + 12, &v, 4);
    expect_load_error(bad, b, n, "vocab_size 100 is outside");
    memcpy(b, g, n);
    b[40] ^= 1;
    expect_load_error(bad, b, n, "checksum mismatch");
    /* a merge that refers to a token not yet made, with a valid checksum */
    memcpy(b, g, n);
    uint32_t future = 300;
    memcpy(b + 32, &future, 4);
    uint64_t sum = XXH64(b + 32, n - 32, 0);
    memcpy(b + 24, &sum, 8);
    expect_load_error(bad, b, n, "merge 0 is (300,");

    free(g);
    free(b);
    remove_tmpdir(dir);
}

static void test_train_is_fast_on_a_megabyte(void **state)
{
    /* the real corpus is ~2.6 MB at vocab 2048; this guards against a quadratic slip */
    size_t n = 1 << 20;
    uint8_t *text = make_corpus(99, n);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tok_t *t = NULL;
    char err[256];
    assert_int_equal(tok_train(&t, text, n, 2048, err, sizeof(err)), 0);
    uint32_t *ids = malloc(n * 4);
    size_t nt;
    assert_int_equal(tok_encode(t, text, n, ids, &nt), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (secs > 3.0) fail_msg("train+encode of 1 MiB took %.2f s", secs);
    free(ids);
    tok_destroy(&t);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunks_follow_gpt2_style_split),
        cmocka_unit_test(test_train_matches_naive_reference),
        cmocka_unit_test(test_train_is_deterministic),
        cmocka_unit_test(test_merges_compress_training_text),
        cmocka_unit_test(test_roundtrip_random_byte_strings),
        cmocka_unit_test(test_roundtrip_all_byte_values_nul_and_empty),
        cmocka_unit_test(test_encoding_is_independent_of_cache_state),
        cmocka_unit_test(test_token_bytes_concatenate_to_text),
        cmocka_unit_test(test_train_rejects_bad_vocab_and_tiny_corpus),
        cmocka_unit_test(test_save_load_gives_identical_encodings),
        cmocka_unit_test(test_load_rejects_corrupt_files),
        cmocka_unit_test(test_train_is_fast_on_a_megabyte),
    };
    return tu_run_group_tests(tests, group_setup, group_teardown);
}
