/* The checkpoint format and writer (checkpointd/ckpt.h, checkpointd/writer.h) on real
 * files: round trips, every check of the index decoder, reads across chunk boundaries,
 * verification of damaged checkpoints, falling back to an older one, retention, and a
 * writer killed mid-write leaving nothing loadable. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <cmocka.h>
#include <xxhash.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/uring.h"
#include "checkpointd/writer.h"
#include "kernels/params.h"
#include "tests/testutil.h"

typedef struct {
    char dir[256];
    param_table_t tab;
    float *arr[3]; /* weights, exp_avg, exp_avg_sq: tab.total each */
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "/tmp/ctitan-test-ckpt-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    model_config_t c;
    config_preset("tiny", &c);
    assert_int_equal(params_table_init(&f->tab, &c), 0);
    for (int a = 0; a < 3; a++) {
        f->arr[a] = malloc(f->tab.total * sizeof(float));
        tu_fill(NULL, f->arr[a], f->tab.total, 100 + a, 1.0);
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    tu_rmtree(f->dir);
    for (int a = 0; a < 3; a++)
        free(f->arr[a]);
    params_table_free(&f->tab);
    free(f);
    return 0;
}

/* Writes step `step` of the fixture's arrays into f->dir/sub with the real writer. */
static int write_ckpt(fx_t *f, const char *sub, int64_t step, char *path, size_t pathlen)
{
    char dir[512], err[1024];
    snprintf(dir, sizeof(dir), "%s/%s", f->dir, sub);
    ckpt_index_t plan;
    uint8_t cur[3] = {0x81, 0xa1, 's'};
    assert_int_equal(ckpt_index_plan(&plan, &f->tab, optim_find("AdamW"), step, "[job]\nname = \"t\"\n", cur, sizeof(cur)), 0);
    for (int a = 0; a < 3; a++)
        ckpt_index_hash(&plan, (uint32_t)a, f->arr[a]);
    ckw_t *w;
    int rc = ckw_begin(&w, dir, &plan, err, sizeof(err));
    assert_int_equal(rc, 0);
    static _Alignas(4096) uint8_t hdr[CKPT_DATA_HDR];
    for (int a = 0; a < 3 && !rc; a++) {
        ckpt_data_header(hdr, (uint32_t)a, step);
        rc = ckw_write(w, (uint32_t)a, 0, hdr, sizeof(hdr), err, sizeof(err));
        /* in uneven pieces, to cross the writer's buffers at odd places */
        size_t n = f->tab.total * sizeof(float), off = 0, piece = 12345 * 4;
        while (!rc && off < n) {
            size_t k = n - off < piece ? n - off : piece;
            rc = ckw_write(w, (uint32_t)a, CKPT_DATA_HDR + off, (char *)f->arr[a] + off, k, err, sizeof(err));
            off += k;
        }
    }
    if (rc)
        ckw_abort(&w);
    else
        rc = ckw_commit(&w, path, pathlen, NULL, err, sizeof(err));
    if (rc)
        fprintf(stderr, "write_ckpt: %s\n", err);
    ckpt_index_free(&plan);
    return rc;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void test_ckpt_round_trip_reads_every_tensor(void **state)
{
    fx_t *f = *state;
    char path[512], err[1024], want[512];
    assert_int_equal(write_ckpt(f, "c", 40, path, sizeof(path)), 0);
    snprintf(want, sizeof(want), "%s/c/step-00000040", f->dir);
    assert_string_equal(path, want);
    ckpt_t *ck;
    assert_int_equal(ckpt_open(&ck, path, err, sizeof(err)), 0);
    const ckpt_index_t *ix = ckpt_index(ck);
    assert_int_equal(ix->step, 40);
    assert_int_equal(ix->cursor_len, 3);
    assert_string_equal(ix->manifest, "[job]\nname = \"t\"\n");
    assert_int_equal(ix->n_tensors, 3 * f->tab.n);
    const char *pre[3] = {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."};
    for (int a = 0; a < 3; a++)
        for (int t = 0; t < f->tab.n; t++) {
            const param_info_t *p = &f->tab.t[t];
            char name[256];
            snprintf(name, sizeof(name), "%s%s", pre[a], p->name);
            const ckpt_tensor_t *ct = ckpt_index_find(ix, name);
            assert_non_null(ct);
            assert_int_equal(ct->ndim, p->ndim);
            assert_int_equal(ct->shape[0], p->shape[0]);
            float *got = malloc(p->numel * sizeof(float));
            assert_int_equal(ckpt_read(ck, name, 0, p->numel, got, err, sizeof(err)), 0);
            assert_memory_equal(got, f->arr[a] + p->offset, p->numel * sizeof(float));
            free(got);
        }
    char mb[256];
    assert_string_equal(ckpt_master_name(ck, "lm_head.weight", mb, sizeof(mb)), "lm_head.weight");
    ckpt_close(&ck);
    int bad;
    assert_int_equal(ckpt_verify(path, NULL, &bad, err, sizeof(err)), 0);
    assert_int_equal(bad, 0);
    /* nothing but the step directory is left in the folder */
    snprintf(want, sizeof(want), "%s/c", f->dir);
    assert_int_equal(count_entries(want), 1);
}

/* Splits every chunk of an index into pieces of `bytes`: the reader must handle any
 * chunking another writer chose. */
static void rechunk(ckpt_index_t *ix, uint64_t bytes)
{
    for (int i = 0; i < ix->n_tensors; i++) {
        ckpt_tensor_t *t = &ix->tensors[i];
        uint64_t total = 0;
        for (uint32_t c = 0; c < t->n_chunks; c++)
            total += t->chunks[c].length;
        uint32_t n = (uint32_t)((total + bytes - 1) / bytes);
        ckpt_chunk_t *nc = calloc(n, sizeof(*nc));
        for (uint32_t c = 0; c < n; c++)
            nc[c] = (ckpt_chunk_t){.file = t->chunks[0].file, .offset = t->chunks[0].offset + c * bytes,
                                   .length = total - c * bytes < bytes ? total - c * bytes : bytes};
        free(t->chunks);
        t->chunks = nc;
        t->n_chunks = n;
    }
}

static void test_ckpt_read_slices_across_chunks(void **state)
{
    fx_t *f = *state;
    char path[512], err[1024], ip[600];
    assert_int_equal(write_ckpt(f, "c", 3, path, sizeof(path)), 0);
    /* rewrite the index with 1000-byte chunks (checksums recomputed from the arrays) */
    ckpt_t *ck;
    assert_int_equal(ckpt_open(&ck, path, err, sizeof(err)), 0);
    ckpt_index_t ix;
    uint8_t *buf;
    size_t len;
    assert_int_equal(ckpt_index_encode(ckpt_index(ck), &buf, &len), 0);
    ckpt_close(&ck);
    assert_int_equal(ckpt_index_decode(buf, len, &ix, "copy", err, sizeof(err)), 0);
    free(buf);
    rechunk(&ix, 1000);
    for (int a = 0; a < 3; a++)
        ckpt_index_hash(&ix, (uint32_t)a, f->arr[a]);
    assert_int_equal(ckpt_index_encode(&ix, &buf, &len), 0);
    ckpt_index_free(&ix);
    snprintf(ip, sizeof(ip), "%s/index", path);
    FILE *fp = fopen(ip, "w");
    assert_int_equal(fwrite(buf, 1, len, fp), len);
    fclose(fp);
    free(buf);
    assert_int_equal(ckpt_open(&ck, path, err, sizeof(err)), 0);
    const param_info_t *p = &f->tab.t[0]; /* the largest tensor: many chunks */
    for (int t = 1; t < f->tab.n; t++)
        if (f->tab.t[t].numel > p->numel)
            p = &f->tab.t[t];
    assert_true(ckpt_index_find(ckpt_index(ck), p->name)->n_chunks > 3);
    uint64_t s = 7;
    for (int trial = 0; trial < 200; trial++) {
        uint64_t a = tu_next(&s) % p->numel, b = tu_next(&s) % p->numel;
        uint64_t lo = a < b ? a : b, n = (a < b ? b - a : a - b) + 1;
        float *got = malloc(n * sizeof(float));
        assert_int_equal(ckpt_read(ck, p->name, lo, n, got, err, sizeof(err)), 0);
        assert_memory_equal(got, f->arr[0] + p->offset + lo, n * sizeof(float));
        free(got);
    }
    float x;
    assert_int_equal(ckpt_read(ck, p->name, p->numel, 1, &x, err, sizeof(err)), -EINVAL);
    assert_int_equal(ckpt_read(ck, "no.such.tensor", 0, 1, &x, err, sizeof(err)), -ENOENT);
    ckpt_close(&ck);
}

/* Decodes after `mutate` changed a valid index; expects -EBADMSG with `needle` in the message. */
static void expect_bad_index(fx_t *f, void (*mutate)(ckpt_index_t *), const char *needle)
{
    ckpt_index_t ix;
    assert_int_equal(ckpt_index_plan(&ix, &f->tab, optim_find("AdamW"), 1, "", NULL, 0), 0);
    mutate(&ix);
    uint8_t *buf;
    size_t len;
    assert_int_equal(ckpt_index_encode(&ix, &buf, &len), 0);
    ckpt_index_free(&ix);
    char err[1024] = "";
    ckpt_index_t out;
    assert_int_equal(ckpt_index_decode(buf, len, &out, "X/index", err, sizeof(err)), -EBADMSG);
    if (!strstr(err, needle))
        fail_msg("'%s' does not mention '%s'", err, needle);
    assert_non_null(strstr(err, "X/index"));
    free(buf);
}

static void m_escape(ckpt_index_t *ix) { snprintf(ix->files[1].name, CKPT_FILE_MAX, "../../etc/x"); }
static void m_hidden(ckpt_index_t *ix) { snprintf(ix->files[0].name, CKPT_FILE_MAX, ".index"); }
static void m_dup(ckpt_index_t *ix) { snprintf(ix->files[2].name, CKPT_FILE_MAX, "model.bin"); }
static void m_outside(ckpt_index_t *ix) { ix->tensors[0].chunks[0].offset = ix->files[0].bytes - 4; }
static void m_file(ckpt_index_t *ix) { ix->tensors[0].chunks[0].file = 7; }
static void m_cover(ckpt_index_t *ix) { ix->tensors[0].shape[0] += 1; }
static void m_dtype(ckpt_index_t *ix) { snprintf(ix->tensors[0].dtype, 8, "F17"); }
static void m_odd(ckpt_index_t *ix) { ix->tensors[0].chunks[0].length -= 2; }
static void m_step(ckpt_index_t *ix) { ix->step = 1LL << 62; }

static void test_ckpt_index_decoder_rejects_bad_indexes(void **state)
{
    fx_t *f = *state;
    expect_bad_index(f, m_escape, "not a plain file name");
    expect_bad_index(f, m_hidden, "not a plain file name");
    expect_bad_index(f, m_dup, "listed twice");
    expect_bad_index(f, m_outside, "do not fit");
    expect_bad_index(f, m_file, "does not exist");
    expect_bad_index(f, m_cover, "its shape needs");
    expect_bad_index(f, m_dtype, "unknown dtype");
    expect_bad_index(f, m_odd, "do not fit");
    expect_bad_index(f, m_step, "'step'");
    /* damage to the bytes: every flipped byte and every truncation is caught */
    ckpt_index_t ix;
    assert_int_equal(ckpt_index_plan(&ix, &f->tab, optim_find("AdamW"), 1, "m", NULL, 0), 0);
    uint8_t *buf;
    size_t len;
    assert_int_equal(ckpt_index_encode(&ix, &buf, &len), 0);
    ckpt_index_free(&ix);
    char err[512];
    for (size_t i = 0; i < len; i += 7) {
        buf[i] ^= 1;
        assert_int_equal(ckpt_index_decode(buf, len, &ix, "i", err, sizeof(err)), -EBADMSG);
        buf[i] ^= 1;
    }
    for (size_t n = 0; n < len; n += 13)
        assert_int_equal(ckpt_index_decode(buf, n, &ix, "i", err, sizeof(err)), -EBADMSG);
    assert_int_equal(ckpt_index_decode(buf, len, &ix, "i", err, sizeof(err)), 0);
    ckpt_index_free(&ix);
    free(buf);
}

/* An index that checks out (magic, version, length, XXH64, which anyone can compute) but whose
 * body declares a container of 2^32-1 items in a few bytes is refused before msgpack-c would
 * allocate for it (remote checkpointd decodes the indexes its clients send). */
static void test_ckpt_index_decoder_walks_a_hostile_body_before_allocating(void **state)
{
    static const uint8_t bodies[][16] = {
        {0x81, 0xa7, 't', 'e', 'n', 's', 'o', 'r', 's', 0xdd, 0xff, 0xff, 0xff, 0xff},
        {0xdf, 0xff, 0xff, 0xff, 0xff, 0xc0},
    };
    static const size_t sizes[] = {14, 6};
    for (int i = 0; i < 2; i++) {
        uint8_t buf[64] = {0};
        uint32_t v = CKPT_VERSION;
        uint64_t body = sizes[i];
        memcpy(buf, CKPT_INDEX_MAGIC, 8);
        memcpy(buf + 8, &v, 4);
        memcpy(buf + 16, &body, 8);
        memcpy(buf + 24, bodies[i], sizes[i]);
        uint64_t sum = XXH64(buf, 24 + sizes[i], 0);
        memcpy(buf + 24 + sizes[i], &sum, 8);
        ckpt_index_t ix;
        char err[512] = "";
        assert_int_equal(ckpt_index_decode(buf, 32 + sizes[i], &ix, "hostile", err, sizeof(err)), -EBADMSG);
        if (!strstr(err, "hostile: bad index: the body truncated"))
            fail_msg("%s", err);
    }
}

static void test_ckpt_safe_names(void **state)
{
    (void)state;
    assert_true(ckpt_safe_name("model.bin"));
    assert_true(ckpt_safe_name("a-b_c.9"));
    assert_false(ckpt_safe_name(""));
    assert_false(ckpt_safe_name(".."));
    assert_false(ckpt_safe_name("../x"));
    assert_false(ckpt_safe_name("a/b"));
    assert_false(ckpt_safe_name(".hidden"));
    assert_false(ckpt_safe_name("sp ace"));
    char longname[100];
    memset(longname, 'a', 99);
    longname[99] = 0;
    assert_false(ckpt_safe_name(longname));
}

/* ckpt_layout.h: every name of a checkpoint folder and its files from one place, each read
 * back as it was written, and what is of another form refused. */
static void test_ckpt_layout_names_read_back(void **state)
{
    (void)state;
    char buf[128];
    int64_t step;
    long pid;
    ckpt_step_path(buf, sizeof(buf), "d", 42);
    assert_string_equal(buf, "d/step-00000042");
    assert_int_equal(ckpt_step_of(buf + 2), 42);
    assert_int_equal(ckpt_step_of("step-123456789"), 123456789);
    assert_int_equal(ckpt_step_of("step-"), -1);
    assert_int_equal(ckpt_step_of("step-12x"), -1);
    assert_int_equal(ckpt_step_of(".tmp-step-00000042.7"), -1);
    ckpt_tmp_name(buf, sizeof(buf), 42, 1234);
    assert_string_equal(buf, ".tmp-step-00000042.1234");
    assert_true(ckpt_tmp_of(buf, &step, &pid));
    assert_true(step == 42 && pid == 1234);
    assert_int_equal(ckpt_tmp_check(buf, 42, NULL, 0), 0);
    assert_int_equal(ckpt_tmp_check(buf, 43, NULL, 0), -EINVAL);
    assert_true(ckpt_tmp_of(".tmp-step-7", &step, &pid) && step == 7 && pid == 0); /* a leftover */
    assert_true(ckpt_tmp_of(".tmp-step-x", &step, &pid) && step == -1);
    assert_false(ckpt_tmp_of("step-00000042", &step, &pid));
    const optim_t *o = optim_find("AdamW");
    assert_int_equal(ckpt_files(o, 1), optim_arrays(o));
    for (int k = 0; k < 3; k++)
        for (int a = 0; a < optim_arrays(o); a++) {
            uint32_t f = ckpt_file_of(o, k, a);
            assert_int_equal(ckpt_part_of_file(f, ckpt_files(o, 3), 3), k);
            ckpt_file_name(o, f, 3, buf, sizeof(buf));
            assert_int_equal(ckpt_file_name_part(buf), k);
            assert_true(ckpt_safe_name(buf));
        }
    ckpt_file_name(o, 0, 1, buf, sizeof(buf));
    assert_string_equal(buf, "model.bin");
    assert_int_equal(ckpt_file_name_part(buf), -1);
    assert_int_equal(ckpt_file_name_part("model.h.bin"), -1);
    assert_int_equal(ckpt_file_name_part("model.h2x.bin"), -1);
    assert_string_equal(ckpt_tensor_name(o, 0, "lm_head.weight", buf, sizeof(buf)), "lm_head.weight");
    ckpt_tensor_name(o, 1, "lm_head.weight", buf, sizeof(buf));
    assert_true(!strncmp(buf, "optimizer.", 10) && strstr(buf, ".lm_head.weight"));
}

static void test_ckpt_verify_names_damage(void **state)
{
    fx_t *f = *state;
    char path[512], err[1024], p[700];
    assert_int_equal(write_ckpt(f, "c", 5, path, sizeof(path)), 0);
    /* a flipped byte inside lm_head's first moment */
    int lm = params_find_name(&f->tab, "lm_head.weight");
    snprintf(p, sizeof(p), "%s/exp_avg.bin", path);
    assert_int_equal(tu_flip_byte(p, CKPT_DATA_HDR + (off_t)(f->tab.t[lm].offset + 3) * 4), 0);
    char *out = NULL;
    size_t olen;
    FILE *mem = open_memstream(&out, &olen);
    int bad;
    assert_int_equal(ckpt_verify(path, mem, &bad, err, sizeof(err)), -EBADMSG);
    fclose(mem);
    assert_int_equal(bad, 1);
    assert_non_null(strstr(out, "optimizer.exp_avg.lm_head.weight"));
    assert_non_null(strstr(out, "exp_avg.bin"));
    assert_non_null(strstr(out, "checksum mismatch"));
    free(out);
    /* a load of that tensor refuses, one of another tensor still works */
    ckpt_t *ck;
    float x[4];
    assert_int_equal(ckpt_open(&ck, path, err, sizeof(err)), 0);
    assert_int_equal(ckpt_read(ck, "optimizer.exp_avg.lm_head.weight", 0, 4, x, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "checksum mismatch"));
    assert_int_equal(ckpt_read(ck, "lm_head.weight", 0, 4, x, err, sizeof(err)), 0);
    ckpt_close(&ck);
    /* a truncated data file */
    snprintf(p, sizeof(p), "%s/model.bin", path);
    assert_int_equal(truncate(p, CKPT_DATA_HDR + 1000), 0);
    mem = open_memstream(&out, &olen);
    assert_int_equal(ckpt_verify(path, mem, &bad, err, sizeof(err)), -EBADMSG);
    fclose(mem);
    assert_non_null(strstr(out, "model.bin: truncated"));
    assert_non_null(strstr(out, "lm_head.weight")); /* the tensors past the end are named */
    free(out);
    /* a missing data file, then a missing index */
    snprintf(p, sizeof(p), "%s/exp_avg_sq.bin", path);
    assert_int_equal(unlink(p), 0);
    mem = open_memstream(&out, &olen);
    assert_int_equal(ckpt_verify(path, mem, &bad, err, sizeof(err)), -EBADMSG);
    fclose(mem);
    assert_non_null(strstr(out, "exp_avg_sq.bin: missing"));
    free(out);
    snprintf(p, sizeof(p), "%s/index", path);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(ckpt_verify(path, NULL, &bad, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "incomplete"));
}

/* ckpt_data_header_read reads back what ckpt_data_header writes and says what is wrong with
 * anything else, never reading past the length it is given. */
static void test_ckpt_data_header_read_round_trips_and_names_what_is_wrong(void **state)
{
    (void)state;
    static uint8_t b[CKPT_DATA_HDR + 8];
    uint32_t file = 9;
    int64_t step = 9;
    char err[256];
    ckpt_data_header(b, 2, CKPT_STEP_MAX);
    assert_int_equal(ckpt_data_header_read(b, CKPT_DATA_HDR, &file, &step, err, sizeof(err)), 0);
    assert_int_equal(file, 2);
    assert_int_equal(step, CKPT_STEP_MAX);
    assert_int_equal(ckpt_data_header_read(b, sizeof(b), &file, &step, NULL, 0), 0);
    assert_int_equal(ckpt_data_header_read(b, CKPT_DATA_HDR - 1, &file, &step, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "shorter"));
    assert_int_equal(ckpt_data_header_read(b, 0, &file, &step, err, sizeof(err)), -EBADMSG);
    struct { size_t at; uint8_t x; const char *why; } bad[] = {
        {0, 'X', "magic"}, {8, 2, "version"}, {23, 0x80, "negative"}, {20, 1, "more than any run"},
        {24, 1, "byte 24"},
        {CKPT_DATA_HDR - 1, 0xff, "byte 4095"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint8_t was = b[bad[i].at];
        b[bad[i].at] = bad[i].x;
        assert_int_equal(ckpt_data_header_read(b, CKPT_DATA_HDR, &file, &step, err, sizeof(err)), -EBADMSG);
        if (!strstr(err, "header: ") || !strstr(err, bad[i].why))
            fail_msg("byte %zu: %s", bad[i].at, err);
        b[bad[i].at] = was;
    }
}

/* Every byte of a data file's 4 KiB header counts: the magic, the version, the file's number
 * and the step (both against the index) and the zeros after them. Any one flipped is named by
 * verify and refused by a read, as a header copied from another file or another step is. */
static void test_ckpt_header_damage_is_caught_by_verify_and_read(void **state)
{
    fx_t *f = *state;
    char path[512], err[1024], p[700], *out = NULL;
    size_t olen;
    int bad;
    float x;
    ckpt_t *ck;
    assert_int_equal(write_ckpt(f, "c", 5, path, sizeof(path)), 0);
    snprintf(p, sizeof(p), "%s/model.bin", path);
    const long at[] = {0, 7, 8, 11, 12, 15, 16, 23, 24, 100, 2048, CKPT_DATA_HDR - 1};
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        assert_int_equal(tu_flip_byte(p, at[i]), 0);
        FILE *mem = open_memstream(&out, &olen);
        int rc = ckpt_verify(path, mem, &bad, err, sizeof(err));
        fclose(mem);
        if (rc != -EBADMSG || !strstr(out, "model.bin") || !strstr(out, "header"))
            fail_msg("byte %ld of the header flipped: verify says %d: %s", at[i], rc, out);
        free(out);
        assert_int_equal(ckpt_open(&ck, path, err, sizeof(err)), 0);
        assert_int_equal(ckpt_read(ck, "lm_head.weight", 0, 1, &x, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "header"));
        ckpt_close(&ck);
        assert_int_equal(tu_flip_byte(p, at[i]), 0);
        assert_int_equal(ckpt_verify(path, NULL, &bad, err, sizeof(err)), 0);
    }
    /* exp_avg.bin's header in model.bin (file 1 where file 0 belongs), then step 6's */
    static uint8_t hdr[CKPT_DATA_HDR];
    const int64_t steps[2] = {5, 6};
    const uint32_t files[2] = {1, 0};
    const char *why[2] = {"file", "step"};
    for (int k = 0; k < 2; k++) {
        ckpt_data_header(hdr, files[k], steps[k]);
        FILE *fp = fopen(p, "r+b");
        assert_non_null(fp);
        assert_int_equal(fwrite(hdr, 1, sizeof(hdr), fp), sizeof(hdr));
        fclose(fp);
        assert_int_equal(ckpt_verify(path, NULL, &bad, err, sizeof(err)), -EBADMSG);
        assert_int_equal(ckpt_open(&ck, path, err, sizeof(err)), 0);
        assert_int_equal(ckpt_read(ck, "lm_head.weight", 0, 1, &x, err, sizeof(err)), -EBADMSG);
        if (!strstr(err, "header") || !strstr(err, why[k]))
            fail_msg("a header of %s: %s", why[k], err);
        ckpt_close(&ck);
    }
}

/* Runs fn(f, arg) in a child that must be done within `secs` (a reader that opened a FIFO
 * would wait for a writer forever). Returns fn's result, or -1 when the child had to be killed. */
static int within(double secs, int (*fn)(fx_t *, const char *), fx_t *f, const char *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(fn(f, arg));
    return tu_reap(pid, secs, NULL);
}

/* verify and read of a checkpoint whose model.bin is a FIFO: 0 when both refuse it, naming it */
static int fifo_data(fx_t *f, const char *path)
{
    char err[1024], *out = NULL;
    size_t olen;
    int bad;
    FILE *mem = open_memstream(&out, &olen);
    int rc = ckpt_verify(path, mem, &bad, err, sizeof(err));
    fclose(mem);
    if (rc != -EBADMSG || !strstr(out, "model.bin: not a regular file"))
        return 1;
    ckpt_t *ck;
    float x;
    if (ckpt_open(&ck, path, err, sizeof(err)))
        return 2;
    rc = ckpt_read(ck, "lm_head.weight", 0, 1, &x, err, sizeof(err));
    ckpt_close(&ck);
    return rc == -EBADMSG && strstr(err, "model.bin: not a regular file") ? 0 : 3;
}

/* open and verify of a checkpoint whose index is a FIFO */
static int fifo_index(fx_t *f, const char *path)
{
    char err[1024] = "";
    ckpt_t *ck;
    int bad;
    if (ckpt_open(&ck, path, err, sizeof(err)) == 0 || !strstr(err, "index: not a regular file"))
        return 1;
    return ckpt_verify(path, NULL, &bad, err, sizeof(err)) && strstr(err, "not a regular file") ? 0 : 2;
}

/* latest past both: the good one below them */
static int fifo_latest(fx_t *f, const char *dir)
{
    char err[1024], got[512], want[512];
    if (ckpt_find_latest(dir, got, sizeof(got), NULL, err, sizeof(err)))
        return 1;
    snprintf(want, sizeof(want), "%s/step-00000004", dir);
    return strcmp(got, want) ? 2 : 0;
}

/* A FIFO in place of a data file or the index is refused at once (it is not a regular file),
 * never waited on: verify, read and latest all finish. */
static void test_ckpt_fifo_in_place_of_a_file_is_refused_at_once(void **state)
{
    fx_t *f = *state;
    char path[512], p[700], dir[300];
    snprintf(dir, sizeof(dir), "%s/c", f->dir);
    for (int s = 4; s <= 8; s += 2)
        assert_int_equal(write_ckpt(f, "c", s, path, sizeof(path)), 0);
    snprintf(p, sizeof(p), "%s/step-00000006/model.bin", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0644), 0);
    snprintf(p, sizeof(p), "%s/step-00000008/index", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0644), 0);
    snprintf(p, sizeof(p), "%s/step-00000006", dir);
    assert_int_equal(within(5, fifo_data, f, p), 0);
    snprintf(p, sizeof(p), "%s/step-00000008", dir);
    assert_int_equal(within(5, fifo_index, f, p), 0);
    assert_int_equal(within(5, fifo_latest, f, dir), 0);
}

static void test_ckpt_latest_falls_back_past_damaged_ones(void **state)
{
    fx_t *f = *state;
    char path[512], err[1024], p[700], got[512], dir[300];
    snprintf(dir, sizeof(dir), "%s/c", f->dir);
    assert_int_equal(ckpt_find_latest(dir, got, sizeof(got), NULL, err, sizeof(err)), -ENOENT);
    for (int s = 10; s <= 40; s += 10)
        assert_int_equal(write_ckpt(f, "c", s, path, sizeof(path)), 0);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 4);
    assert_int_equal(steps[0], 10);
    assert_int_equal(steps[3], 40);
    free(steps);
    /* 40: a flipped byte; 30: no index (as after a crash); 20 is the newest good one */
    snprintf(p, sizeof(p), "%s/step-00000040/model.bin", dir);
    assert_int_equal(tu_flip_byte(p, CKPT_DATA_HDR + 8), 0);
    snprintf(p, sizeof(p), "%s/step-00000030/index", dir);
    unlink(p);
    char *log = NULL;
    size_t llen;
    FILE *mem = open_memstream(&log, &llen);
    assert_int_equal(ckpt_find_latest(dir, got, sizeof(got), mem, err, sizeof(err)), 0);
    fclose(mem);
    snprintf(p, sizeof(p), "%s/step-00000020", dir);
    assert_string_equal(got, p);
    assert_non_null(strstr(log, "step-00000040 is not loadable"));
    assert_non_null(strstr(log, "checksum mismatch"));
    assert_non_null(strstr(log, "step-00000030 is not loadable"));
    free(log);
    assert_int_equal(ckpt_list(dir, &steps), 3); /* 30 has no index: not complete */
    free(steps);
    /* every one bad: an error, not a fresh start */
    snprintf(p, sizeof(p), "%s/step-00000020/index", dir);
    assert_int_equal(tu_flip_byte(p, 30), 0);
    snprintf(p, sizeof(p), "%s/step-00000010/exp_avg.bin", dir);
    assert_int_equal(truncate(p, 10), 0);
    assert_int_equal(ckpt_find_latest(dir, got, sizeof(got), NULL, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "no checkpoint there verifies"));
}

static void test_ckpt_retain_keeps_newest_and_clears_dead_temporaries(void **state)
{
    fx_t *f = *state;
    char path[512], dir[300], p[700];
    snprintf(dir, sizeof(dir), "%s/c", f->dir);
    for (int s = 1; s <= 5; s++)
        assert_int_equal(write_ckpt(f, "c", s, path, sizeof(path)), 0);
    /* a temporary directory of a writer that is gone, and one of a live writer (us) */
    snprintf(p, sizeof(p), "%s/.tmp-step-00000006.999999999", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/.tmp-step-00000006.999999999/model.bin", dir);
    fclose(fopen(p, "w"));
    snprintf(p, sizeof(p), "%s/.tmp-step-00000007.%d", dir, (int)getpid());
    assert_int_equal(mkdir(p, 0755), 0);
    assert_int_equal(ckpt_retain(dir, 2), 3);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 2);
    assert_int_equal(steps[0], 4);
    assert_int_equal(steps[1], 5);
    free(steps);
    snprintf(p, sizeof(p), "%s/.tmp-step-00000006.999999999", dir);
    assert_int_equal(access(p, F_OK), -1);
    snprintf(p, sizeof(p), "%s/.tmp-step-00000007.%d", dir, (int)getpid());
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(ckpt_retain(dir, 0), 0); /* 0 keeps all */
    assert_int_equal(ckpt_list(dir, &steps), 2);
    free(steps);
}

static void test_ckpt_same_step_again_replaces_it(void **state)
{
    fx_t *f = *state;
    char path[512], err[1024];
    assert_int_equal(write_ckpt(f, "c", 9, path, sizeof(path)), 0);
    f->arr[0][0] += 1.0f;
    assert_int_equal(write_ckpt(f, "c", 9, path, sizeof(path)), 0);
    ckpt_t *ck;
    float x;
    assert_int_equal(ckpt_open(&ck, path, err, sizeof(err)), 0);
    assert_int_equal(ckpt_read(ck, f->tab.t[0].name, 0, 1, &x, err, sizeof(err)), 0);
    assert_true(x == f->arr[0][0]);
    ckpt_close(&ck);
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/c", f->dir);
    assert_int_equal(count_entries(dir), 1); /* the replaced one is gone */
}

static void test_ckpt_writer_rejects_out_of_order_data(void **state)
{
    fx_t *f = *state;
    char dir[300], err[1024];
    snprintf(dir, sizeof(dir), "%s/c", f->dir);
    ckpt_index_t plan;
    assert_int_equal(ckpt_index_plan(&plan, &f->tab, optim_find("AdamW"), 2, "", NULL, 0), 0);
    ckw_t *w;
    uint8_t hdr[CKPT_DATA_HDR] = {0};
    assert_int_equal(ckw_begin(&w, dir, &plan, err, sizeof(err)), 0);
    assert_int_equal(ckw_write(w, 1, 0, hdr, 16, err, sizeof(err)), -EINVAL); /* file 1 before 0 */
    assert_int_equal(ckw_write(w, 0, 0, hdr, 16, err, sizeof(err)), 0);
    assert_int_equal(ckw_write(w, 0, 32, hdr, 16, err, sizeof(err)), -EINVAL); /* a gap */
    assert_non_null(strstr(err, "expected offset 16"));
    assert_int_equal(ckw_write(w, 1, 0, hdr, 16, err, sizeof(err)), -EINVAL); /* file 0 unfinished */
    /* committing a plan whose files were not all written fails and leaves nothing */
    char path[512];
    assert_int_equal(ckw_commit(&w, path, sizeof(path), NULL, err, sizeof(err)), -EINVAL);
    assert_null(w);
    assert_int_equal(count_entries(dir), 0);
    assert_int_equal(ckw_begin(&w, dir, &plan, err, sizeof(err)), 0);
    ckw_abort(&w);
    assert_int_equal(count_entries(dir), 0);
    ckpt_index_free(&plan);
}

static void test_ckpt_writer_killed_mid_write_leaves_nothing_loadable(void **state)
{
    fx_t *f = *state;
    char dir[300], err[1024], got[512], path[512];
    snprintf(dir, sizeof(dir), "%s/c", f->dir);
    assert_int_equal(write_ckpt(f, "c", 1, path, sizeof(path)), 0);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    if (pid == 0) { /* begins step 2, writes half of the first file, tells the parent, waits */
        ckpt_index_t plan;
        ckw_t *w;
        uint8_t hdr[CKPT_DATA_HDR] = {0};
        if (ckpt_index_plan(&plan, &f->tab, optim_find("AdamW"), 2, "", NULL, 0) || ckw_begin(&w, dir, &plan, err, sizeof(err)) ||
            ckw_write(w, 0, 0, hdr, sizeof(hdr), err, sizeof(err)) ||
            ckw_write(w, 0, CKPT_DATA_HDR, f->arr[0], f->tab.total * 2, err, sizeof(err)))
            _exit(1);
        if (write(pipefd[1], "x", 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    close(pipefd[1]);
    char c;
    assert_int_equal(read(pipefd[0], &c, 1), 1);
    close(pipefd[0]);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(count_entries(dir), 2); /* step-1 and the dead writer's temporary directory */
    assert_int_equal(ckpt_find_latest(dir, got, sizeof(got), NULL, err, sizeof(err)), 0);
    assert_string_equal(got, path);
    ckpt_retain(dir, 0);
    assert_int_equal(count_entries(dir), 1);
}

/* A plan of n files of one 2500-float tensor each (no checksums). */
static void many_files_plan(ckpt_index_t *ix, int n)
{
    memset(ix, 0, sizeof(*ix));
    ix->step = 3;
    ix->manifest = strdup("");
    ix->n_files = ix->n_tensors = n;
    ix->files = calloc((size_t)n, sizeof(ckpt_file_t));
    ix->tensors = calloc((size_t)n, sizeof(ckpt_tensor_t));
    for (int i = 0; i < n; i++) {
        snprintf(ix->files[i].name, CKPT_FILE_MAX, "f%02d.bin", i);
        ix->files[i].bytes = 10000 + 100; /* 100 bytes of padding no chunk covers */
        ckpt_tensor_t *t = &ix->tensors[i];
        snprintf(t->name, sizeof(t->name), "t%d", i);
        snprintf(t->dtype, sizeof(t->dtype), "F32");
        t->ndim = 1;
        t->shape[0] = 2500;
        t->numel = 2500;
        t->n_chunks = 1;
        t->chunks = calloc(1, sizeof(ckpt_chunk_t));
        t->chunks[0] = (ckpt_chunk_t){.file = (uint32_t)i, .offset = 100, .length = 10000};
    }
}

static void test_ckpt_writer_fills_in_checksums_across_many_files(void **state)
{
    fx_t *f = *state;
    char dir[300], err[1024], path[512];
    snprintf(dir, sizeof(dir), "%s/m", f->dir);
    ckpt_index_t plan;
    many_files_plan(&plan, 37); /* more files than the writer keeps open unsynced */
    ckw_t *w;
    assert_int_equal(ckw_begin(&w, dir, &plan, err, sizeof(err)), 0);
    uint8_t pad[100] = {7};
    for (int i = 0; i < 37; i++) {
        assert_int_equal(ckw_write(w, (uint32_t)i, 0, pad, sizeof(pad), err, sizeof(err)), 0);
        /* in two pieces, split inside the chunk */
        assert_int_equal(ckw_write(w, (uint32_t)i, 100, f->arr[0] + i, 3333, err, sizeof(err)), 0);
        assert_int_equal(ckw_write(w, (uint32_t)i, 3433, (char *)(f->arr[0] + i) + 3333, 10000 - 3333, err,
                                   sizeof(err)), 0);
    }
    assert_int_equal(ckw_commit(&w, path, sizeof(path), NULL, err, sizeof(err)), 0);
    int bad;
    assert_int_equal(ckpt_verify(path, NULL, &bad, err, sizeof(err)), 0);
    ckpt_t *ck;
    assert_int_equal(ckpt_open(&ck, path, err, sizeof(err)), 0);
    float got[2500];
    for (int i = 0; i < 37; i += 9) {
        char name[16];
        snprintf(name, sizeof(name), "t%d", i);
        assert_int_equal(ckpt_read(ck, name, 0, 2500, got, err, sizeof(err)), 0);
        assert_memory_equal(got, f->arr[0] + i, sizeof(got));
    }
    ckpt_close(&ck);
    ckpt_index_free(&plan);
}

static void test_ckpt_writer_refuses_bytes_that_miss_the_plans_checksum(void **state)
{
    fx_t *f = *state;
    char dir[300], err[1024];
    snprintf(dir, sizeof(dir), "%s/x", f->dir);
    ckpt_index_t plan;
    assert_int_equal(ckpt_index_plan(&plan, &f->tab, optim_find("AdamW"), 4, "", NULL, 0), 0);
    for (int a = 0; a < 3; a++)
        ckpt_index_hash(&plan, (uint32_t)a, f->arr[a]);
    f->arr[0][5] += 1.0f; /* the bytes changed after the plan was made */
    ckw_t *w;
    static uint8_t hdr[CKPT_DATA_HDR];
    assert_int_equal(ckw_begin(&w, dir, &plan, err, sizeof(err)), 0);
    assert_int_equal(ckw_write(w, 0, 0, hdr, sizeof(hdr), err, sizeof(err)), 0);
    int rc = ckw_write(w, 0, CKPT_DATA_HDR, f->arr[0], f->tab.total * sizeof(float), err, sizeof(err));
    assert_int_equal(rc, -EBADMSG);
    assert_non_null(strstr(err, "model.bin"));
    assert_non_null(strstr(err, "do not match their checksum"));
    ckw_abort(&w);
    assert_int_equal(count_entries(dir), 0);
    ckpt_index_free(&plan);
}

/* A filesystem without O_DIRECT (ramfs: open fails with EINVAL) gets the same checkpoint
 * buffered. Needs a private mount namespace, so root. */
static void test_ckpt_writer_falls_back_where_o_direct_is_refused(void **state)
{
    fx_t *f = *state;
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/ramfs", f->dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    if (geteuid() != 0) {
        print_message("not root: cannot mount a ramfs to test the buffered fallback\n");
        skip();
    }
    pid_t pid = fork();
    if (pid == 0) {
        /* 10: cannot set up; 0: written buffered and it verifies; others: failures */
        if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
            mount("none", dir, "ramfs", 0, NULL))
            _exit(10);
        char path[600], err[1024], sub[300];
        snprintf(sub, sizeof(sub), "ramfs/c");
        ckpt_index_t plan;
        ckw_t *w;
        ckw_stats_t st;
        static _Alignas(4096) uint8_t hdr[CKPT_DATA_HDR];
        if (ckpt_index_plan(&plan, &f->tab, optim_find("AdamW"), 1, "", NULL, 0))
            _exit(2);
        snprintf(path, sizeof(path), "%s/%s", f->dir, sub);
        if (ckw_begin(&w, path, &plan, err, sizeof(err)))
            _exit(3);
        for (int a = 0; a < 3; a++) {
            ckpt_data_header(hdr, (uint32_t)a, 1); /* verify checks it */
            if (ckw_write(w, (uint32_t)a, 0, hdr, sizeof(hdr), err, sizeof(err)) ||
                ckw_write(w, (uint32_t)a, CKPT_DATA_HDR, f->arr[a], f->tab.total * sizeof(float), err, sizeof(err)))
                _exit(4);
        }
        if (ckw_commit(&w, path, sizeof(path), &st, err, sizeof(err)))
            _exit(5);
        int bad;
        if (ckpt_verify(path, stderr, &bad, err, sizeof(err)))
            _exit(6);
        _exit(st.direct ? 7 : 0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 10) {
        print_message("cannot mount a ramfs here: the buffered fallback is not tested\n");
        skip();
    }
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_ckpt_raw_write_measures_a_real_file(void **state)
{
    fx_t *f = *state;
    char p[300], err[512];
    snprintf(p, sizeof(p), "%s/raw", f->dir);
    double secs;
    int direct;
    assert_int_equal(uw_raw_write(p, 10u << 20 | 123, &secs, &direct, err, sizeof(err)), 0);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_size, 10u << 20 | 123);
    assert_true(secs > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ckpt_round_trip_reads_every_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_read_slices_across_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_index_decoder_rejects_bad_indexes, setup, teardown),
        cmocka_unit_test(test_ckpt_index_decoder_walks_a_hostile_body_before_allocating),
        cmocka_unit_test(test_ckpt_safe_names),
        cmocka_unit_test(test_ckpt_layout_names_read_back),
        cmocka_unit_test_setup_teardown(test_ckpt_verify_names_damage, setup, teardown),
        cmocka_unit_test(test_ckpt_data_header_read_round_trips_and_names_what_is_wrong),
        cmocka_unit_test_setup_teardown(test_ckpt_header_damage_is_caught_by_verify_and_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_fifo_in_place_of_a_file_is_refused_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_latest_falls_back_past_damaged_ones, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_retain_keeps_newest_and_clears_dead_temporaries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_same_step_again_replaces_it, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_writer_rejects_out_of_order_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_writer_killed_mid_write_leaves_nothing_loadable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_writer_fills_in_checksums_across_many_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_writer_refuses_bytes_that_miss_the_plans_checksum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_writer_falls_back_where_o_direct_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_raw_write_measures_a_real_file, setup, teardown),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
