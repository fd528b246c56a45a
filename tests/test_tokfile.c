/* Tests of token shard files (stages/data/tokfile.c): round trips in both dtypes, reading llm.c's
 * files, and one error per kind of bad input, each naming the file and the problem. */
#include <dirent.h>
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
#include "stages/data/tokfile.h"

typedef struct {
    char *dir;
    char path[512];
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    f->dir = strdup("/tmp/ctitan-test-tokfile-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof(f->path), "%s/tokens.bin", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    int gone = tu_rmtree(f->dir) == 0;
    free(f->dir);
    free(f);
    return gone ? 0 : -1;
}

static void write_raw(const char *path, const void *a, size_t na, const void *b, size_t nb)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(a, 1, na, fp), na);
    if (nb) assert_int_equal(fwrite(b, 1, nb, fp), nb);
    fclose(fp);
}

/* A ctitan header with the given fields. */
static void ct_header(uint8_t h[32], uint32_t version, uint32_t dtype, uint64_t count,
                      uint32_t vocab)
{
    memset(h, 0, 32);
    memcpy(h, TOKFILE_MAGIC, 8);
    memcpy(h + 8, &version, 4);
    memcpy(h + 12, &dtype, 4);
    memcpy(h + 16, &count, 8);
    memcpy(h + 24, &vocab, 4);
}

static void expect_open_error(const char *path, int vocab, const char *want)
{
    tokfile_t *tf = NULL;
    char err[512] = "";
    int rc = tokfile_open(&tf, path, vocab, err, sizeof(err));
    if (rc == 0) fail_msg("%s opened, expected an error containing \"%s\"", path, want);
    assert_true(rc < 0);
    assert_null(tf);
    if (!strstr(err, path) || !strstr(err, want))
        fail_msg("error \"%s\" should name %s and contain \"%s\"", err, path, want);
}

static size_t count_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void roundtrip(const char *path, int vocab, size_t n, int want_dtype)
{
    uint32_t *tok = calloc(n ? n : 1, sizeof(uint32_t));
    uint64_t s = 5;
    for (size_t i = 0; i < n; i++) tok[i] = (uint32_t)(tu_next(&s) % (uint64_t)vocab);
    if (n) tok[n - 1] = (uint32_t)vocab - 1; /* the largest id survives */
    char err[512];
    if (tokfile_write(path, tok, n, vocab, err, sizeof(err))) fail_msg("write: %s", err);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((size_t)st.st_size, TOKFILE_HEADER_BYTES + n * want_dtype);
    tokfile_t *tf = NULL;
    if (tokfile_open(&tf, path, vocab, err, sizeof(err))) fail_msg("open: %s", err);
    assert_int_equal(tokfile_count(tf), n);
    assert_int_equal(tokfile_vocab_size(tf), vocab);
    assert_int_equal(tokfile_format(tf), TOKFILE_FORMAT_CTITAN);
    assert_string_equal(tokfile_path(tf), path);
    for (size_t i = 0; i < n; i++) assert_int_equal(tokfile_get(tf, i), tok[i]);
    int32_t *bulk = malloc((n ? n : 1) * sizeof(int32_t));
    assert_int_equal(tokfile_read(tf, 0, n, bulk), 0);
    for (size_t i = 0; i < n; i++) assert_int_equal((uint32_t)bulk[i], tok[i]);
    if (n > 10) {
        assert_int_equal(tokfile_read(tf, 7, 3, bulk), 0);
        assert_int_equal((uint32_t)bulk[0], tok[7]);
        assert_int_equal((uint32_t)bulk[2], tok[9]);
    }
    assert_int_equal(tokfile_read(tf, n, 1, bulk), -ERANGE);
    assert_int_equal(tokfile_read(tf, n + 1, 0, bulk), -ERANGE);
    assert_int_equal(tokfile_read(tf, n, 0, bulk), 0);
    tokfile_close(&tf);
    assert_null(tf);
    free(bulk);
    free(tok);
}

static void test_uint16_roundtrip(void **state)
{
    fixture_t *f = *state;
    roundtrip(f->path, 2048, 100000, 2);
    roundtrip(f->path, 65536, 1000, 2); /* the largest vocab that still fits uint16 */
    assert_int_equal(count_dir_entries(f->dir), 1); /* no temp files left */
}

static void test_uint32_roundtrip(void **state)
{
    fixture_t *f = *state;
    roundtrip(f->path, 65537, 1000, 4);
    roundtrip(f->path, 128256, 50000, 4);
    assert_int_equal(count_dir_entries(f->dir), 1);
}

static void test_empty_file_roundtrip(void **state)
{
    fixture_t *f = *state;
    roundtrip(f->path, 300, 0, 2);
}

static void write_llmc(const char *path, int32_t magic, int32_t version, int32_t count,
                       const void *tok, size_t tok_bytes)
{
    int32_t hdr[256] = {0};
    hdr[0] = magic;
    hdr[1] = version;
    hdr[2] = count;
    write_raw(path, hdr, sizeof(hdr), tok, tok_bytes);
}

static void test_reads_llmc_gpt2_file(void **state)
{
    fixture_t *f = *state;
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++) tok[i] = (uint16_t)(i * 50);
    write_llmc(f->path, 20240520, 1, 1000, tok, sizeof(tok));
    tokfile_t *tf = NULL;
    char err[512];
    if (tokfile_open(&tf, f->path, 50257, err, sizeof(err))) fail_msg("open: %s", err);
    assert_int_equal(tokfile_format(tf), TOKFILE_FORMAT_LLMC);
    assert_int_equal(tokfile_count(tf), 1000);
    assert_int_equal(tokfile_vocab_size(tf), 0);
    int32_t got[1000];
    assert_int_equal(tokfile_read(tf, 0, 1000, got), 0);
    for (int i = 0; i < 1000; i++) assert_int_equal(got[i], i * 50);
    assert_int_equal(tokfile_get(tf, 999), 49950);
    tokfile_close(&tf);
    /* a model with a smaller vocab than the file's ids gets a clear error */
    expect_open_error(f->path, 2048, "token 2050 at position 41 is >= vocab_size 2048");
}

static void test_reads_llmc_llama3_file(void **state)
{
    fixture_t *f = *state;
    uint32_t tok[3] = {128000, 5, 128255};
    write_llmc(f->path, 20240801, 7, 3, tok, sizeof(tok));
    tokfile_t *tf = NULL;
    char err[512];
    if (tokfile_open(&tf, f->path, 128256, err, sizeof(err))) fail_msg("open: %s", err);
    assert_int_equal(tokfile_count(tf), 3);
    assert_int_equal(tokfile_get(tf, 2), 128255);
    tokfile_close(&tf);
}

static void test_missing_file_is_named(void **state)
{
    fixture_t *f = *state;
    char p[600];
    snprintf(p, sizeof(p), "%s/nope.bin", f->dir);
    expect_open_error(p, 0, "No such file");
}

static void test_short_header_is_rejected(void **state)
{
    fixture_t *f = *state;
    write_raw(f->path, "CTT", 3, NULL, 0);
    expect_open_error(f->path, 0, "header too short");
    write_raw(f->path, TOKFILE_MAGIC "\1\0\0\0\2\0", 14, NULL, 0);
    expect_open_error(f->path, 0, "header too short");
    int32_t llmc[10] = {20240520, 1, 0};
    write_raw(f->path, llmc, sizeof(llmc), NULL, 0);
    expect_open_error(f->path, 0, "header too short");
}

static void test_foreign_magic_is_rejected(void **state)
{
    fixture_t *f = *state;
    uint8_t junk[64];
    memset(junk, 0x5a, sizeof(junk));
    write_raw(f->path, junk, sizeof(junk), NULL, 0);
    expect_open_error(f->path, 0, "unknown magic");
}

static void test_unknown_version_is_rejected(void **state)
{
    fixture_t *f = *state;
    uint8_t h[32];
    uint16_t tok[4] = {1, 2, 3, 4};
    ct_header(h, 2, 2, 4, 100);
    write_raw(f->path, h, 32, tok, sizeof(tok));
    expect_open_error(f->path, 0, "unsupported version 2");
    write_llmc(f->path, 20240520, 3, 4, tok, sizeof(tok));
    expect_open_error(f->path, 0, "unsupported version 3");
}

static void test_unknown_dtype_is_rejected(void **state)
{
    fixture_t *f = *state;
    uint8_t h[32], tok[12] = {0};
    ct_header(h, 1, 3, 4, 100);
    write_raw(f->path, h, 32, tok, sizeof(tok));
    expect_open_error(f->path, 0, "unknown token dtype 3");
}

static void test_size_not_matching_count_is_rejected(void **state)
{
    fixture_t *f = *state;
    uint8_t h[32];
    uint16_t tok[5] = {1, 2, 3, 4, 5};
    ct_header(h, 1, 2, 5, 100);
    write_raw(f->path, h, 32, tok, 9); /* one byte short */
    expect_open_error(f->path, 0, "does not match the header's 5 tokens");
    write_raw(f->path, h, 32, tok, 10);
    tokfile_t *tf = NULL;
    char err[512];
    assert_int_equal(tokfile_open(&tf, f->path, 0, err, sizeof(err)), 0);
    tokfile_close(&tf);
    ct_header(h, 1, 2, 4, 100);
    write_raw(f->path, h, 32, tok, 10); /* trailing bytes */
    expect_open_error(f->path, 0, "does not match the header's 4 tokens");
    ct_header(h, 1, 4, UINT64_MAX / 2, 100); /* count whose byte size overflows */
    write_raw(f->path, h, 32, tok, 8);
    expect_open_error(f->path, 0, "does not match");
    write_llmc(f->path, 20240520, 1, 6, tok, 10);
    expect_open_error(f->path, 0, "does not match the header's 6 tokens");
}

static void test_token_over_vocab_is_rejected(void **state)
{
    fixture_t *f = *state;
    uint32_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = (uint32_t)i;
    tok[56] = 1234;
    char err[512];
    assert_int_equal(tokfile_write(f->path, tok, 100, 65536, err, sizeof(err)), 0);
    expect_open_error(f->path, 1000, "token 1234 at position 56 is >= vocab_size 1000");
    /* a file whose tokens exceed its own header's vocab_size is corrupt, whatever the caller
     * asks for */
    uint8_t h[32];
    uint16_t t16[3] = {1, 700, 2};
    ct_header(h, 1, 2, 3, 512);
    write_raw(f->path, h, 32, t16, sizeof(t16));
    expect_open_error(f->path, 0, "token 700 at position 1 is >= vocab_size 512");
}

static void test_write_rejects_bad_tokens_and_leaves_nothing(void **state)
{
    fixture_t *f = *state;
    uint32_t tok[3] = {1, 2048, 3};
    char err[512];
    assert_int_equal(tokfile_write(f->path, tok, 3, 2048, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "token 2048 at position 1 is >= vocab_size 2048"));
    assert_non_null(strstr(err, f->path));
    assert_int_equal(count_dir_entries(f->dir), 0);
    char p[600];
    snprintf(p, sizeof(p), "%s/no/such/dir/t.bin", f->dir);
    assert_true(tokfile_write(p, tok, 1, 2048, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, p));
    assert_int_equal(count_dir_entries(f->dir), 0);
}

static void test_write_replaces_existing_file(void **state)
{
    fixture_t *f = *state;
    uint32_t a[4] = {1, 2, 3, 4}, b[2] = {9, 8};
    char err[512];
    assert_int_equal(tokfile_write(f->path, a, 4, 16, err, sizeof(err)), 0);
    assert_int_equal(tokfile_write(f->path, b, 2, 16, err, sizeof(err)), 0);
    tokfile_t *tf = NULL;
    assert_int_equal(tokfile_open(&tf, f->path, 16, err, sizeof(err)), 0);
    assert_int_equal(tokfile_count(tf), 2);
    assert_int_equal(tokfile_get(tf, 0), 9);
    tokfile_close(&tf);
    assert_int_equal(count_dir_entries(f->dir), 1);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_uint16_roundtrip),
        T(test_uint32_roundtrip),
        T(test_empty_file_roundtrip),
        T(test_reads_llmc_gpt2_file),
        T(test_reads_llmc_llama3_file),
        T(test_missing_file_is_named),
        T(test_short_header_is_rejected),
        T(test_foreign_magic_is_rejected),
        T(test_unknown_version_is_rejected),
        T(test_unknown_dtype_is_rejected),
        T(test_size_not_matching_count_is_rejected),
        T(test_token_over_vocab_is_rejected),
        T(test_write_rejects_bad_tokens_and_leaves_nothing),
        T(test_write_replaces_existing_file),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
