/* Loading a checkpoint into the staging segment (checkpointd/restore.h) on real files and a
 * real segment: every tensor lands at its offset of the flat space with the step and the
 * loader cursor, "latest" picks the newest that loads (none: a fresh start), and a
 * checkpoint of another model, a missing directory or a corrupt one is refused saying why.
 * Also latest from a storage host, streamed: a fake host feeds its files as a fetch's parts
 * (rmt_fetch_part, in pieces that straddle chunks) into the load's sink. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/remote_int.h"
#include "checkpointd/restore.h"
#include "checkpointd/writer.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "stages/runtime/ldr.h"
#include "stages/job/staging.h"
#include "tests/testutil.h"

typedef struct {
    char dir[256], job[64];
    manifest_t m;          /* the run's: the tiny model, checkpoints in dir */
    param_table_t tab;
    float *arr[3]; /* what the checkpoints hold: weights, exp_avg, exp_avg_sq */
    shm_seg_t *seg;        /* the staging segment, for tab.total floats */
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    char err[256];
    snprintf(f->dir, sizeof(f->dir), "/tmp/ctitan-test-restore-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->job, sizeof(f->job), "test-restore-%d", (int)getpid());
    manifest_defaults(&f->m);
    snprintf(f->m.flavor, sizeof(f->m.flavor), "tiny");
    assert_int_equal(config_preset("tiny", &f->m.model), 0);
    snprintf(f->m.ckpt_folder, sizeof(f->m.ckpt_folder), "%s", f->dir);
    assert_int_equal(params_table_init(&f->tab, &f->m.model), 0);
    for (int a = 0; a < 3; a++) {
        f->arr[a] = malloc(f->tab.total * sizeof(float));
        tu_fill(NULL, f->arr[a], f->tab.total, 200 + a, 1.0);
    }
    assert_int_equal(staging_create(&f->seg, f->job, f->tab.total, 3, err, sizeof(err)), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    shm_detach(&f->seg);
    shm_remove_all(f->job);
    tu_rmtree(f->dir);
    for (int a = 0; a < 3; a++)
        free(f->arr[a]);
    params_table_free(&f->tab);
    free(f);
    return 0;
}

/* Writes step `step` of the fixture's arrays to f->dir/step-N, stored with manifest `by` and
 * loader cursor cur (NULL: {"sample": 42}). */
static void write_ckpt_cursor(fx_t *f, const manifest_t *by, int64_t step, const uint8_t *cur, size_t curlen)
{
    char err[1024], *toml = manifest_to_toml(by);
    ckpt_index_t plan;
    static const uint8_t s42[] = {0x81, 0xa6, 's', 'a', 'm', 'p', 'l', 'e', 0x2a}; /* {"sample": 42} */
    if (!cur)
        cur = s42, curlen = sizeof(s42);
    assert_non_null(toml);
    assert_int_equal(ckpt_index_plan(&plan, &f->tab, optim_find("AdamW"), step, toml, cur, curlen), 0);
    ckw_t *w;
    assert_int_equal(ckw_begin(&w, f->dir, &plan, err, sizeof(err)), 0);
    static _Alignas(4096) uint8_t hdr[CKPT_DATA_HDR];
    for (int a = 0; a < 3; a++) {
        ckpt_data_header(hdr, (uint32_t)a, step);
        assert_int_equal(ckw_write(w, (uint32_t)a, 0, hdr, sizeof(hdr), err, sizeof(err)), 0);
        assert_int_equal(ckw_write(w, (uint32_t)a, CKPT_DATA_HDR, f->arr[a], f->tab.total * sizeof(float), err,
                                   sizeof(err)), 0);
    }
    assert_int_equal(ckw_commit(&w, NULL, 0, NULL, err, sizeof(err)), 0);
    ckpt_index_free(&plan);
    free(toml);
}

static void write_ckpt(fx_t *f, const manifest_t *by, int64_t step) { write_ckpt_cursor(f, by, step, NULL, 0); }

/* Copies f->dir/step-N of `from` to f->dir/`to` claiming step `step` throughout: index and
 * data file headers alike (a consistent checkpoint of another step, as a person or a bug
 * could make one). */
static void forge(fx_t *f, int64_t from, const char *to, int64_t step)
{
    char cmd[1024], out[256], p[700], err[1024];
    snprintf(cmd, sizeof(cmd), "cp -r %s/step-%08lld %s/%s 2>&1", f->dir, (long long)from, f->dir, to);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    snprintf(p, sizeof(p), "%s/%s/index", f->dir, to);
    FILE *fp = fopen(p, "rb");
    assert_non_null(fp);
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf), fp);
    fclose(fp);
    ckpt_index_t ix;
    assert_int_equal(ckpt_index_decode(buf, n, &ix, p, err, sizeof(err)), 0);
    ix.step = step;
    uint8_t *enc;
    size_t len;
    assert_int_equal(ckpt_index_encode(&ix, &enc, &len), 0);
    assert_non_null(fp = fopen(p, "wb"));
    assert_int_equal(fwrite(enc, 1, len, fp), len);
    fclose(fp);
    free(enc);
    static uint8_t hdr[CKPT_DATA_HDR];
    for (int a = 0; a < ix.n_files; a++) {
        snprintf(p, sizeof(p), "%s/%s/%s", f->dir, to, ix.files[a].name);
        ckpt_data_header(hdr, (uint32_t)a, step);
        assert_non_null(fp = fopen(p, "r+b"));
        assert_int_equal(fwrite(hdr, 1, sizeof(hdr), fp), sizeof(hdr));
        fclose(fp);
    }
    ckpt_index_free(&ix);
}

static int load(fx_t *f, const char *what, char *path, char *err, FILE *log)
{
    return restore_load(what, &f->m, &f->tab, shm_data(f->seg), log, path, sizeof(f->m.ckpt_load), err, 1024);
}

static void test_restore_fills_the_staging_segment_with_every_tensor_step_and_cursor(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024];
    write_ckpt(f, &f->m, 6);
    snprintf(want, sizeof(want), "%s/step-00000006", f->dir);
    assert_int_equal(load(f, want, path, err, NULL), 0);
    assert_string_equal(path, want);
    staging_hdr_t *h = shm_data(f->seg);
    assert_int_equal(atomic_load(&h->step), 6);
    uint64_t sample = 0;
    assert_int_equal(ldr_cursor_get(h->cursor, h->cursor_len, "sample", &sample), 0);
    assert_int_equal(sample, 42);
    for (int a = 0; a < 3; a++)
        assert_memory_equal(staging_array(h, a), f->arr[a], f->tab.total * sizeof(float));
    /* a long load says how far it is (here after every tensor: the interval 0), up to the whole */
    FILE *log = tmpfile();
    assert_non_null(log);
    setenv("CTITAN_TEST_SAY_S", "0", 1);
    int rc = load(f, want, path, err, log);
    unsetenv("CTITAN_TEST_SAY_S");
    assert_int_equal(rc, 0);
    static char text[1 << 16], last[700];
    rewind(log);
    text[fread(text, 1, sizeof(text) - 1, log)] = 0;
    fclose(log);
    double total = (double)f->tab.total * 3 * sizeof(float) / (1 << 30);
    snprintf(last, sizeof(last), "ctitan: loading %s: %.1f of %.1f GiB (", want, total, total);
    assert_non_null(strstr(text, last));
    int lines = 0;
    for (const char *q = text; (q = strstr(q, "ctitan: loading ")) != NULL; q++)
        lines++;
    assert_true(lines >= f->tab.n); /* a line a tensor or more */
}

static void test_restore_latest_is_the_newest_that_verifies_and_none_is_a_fresh_start(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024];
    assert_int_equal(load(f, "latest", path, err, NULL), 0);
    assert_string_equal(path, "");
    write_ckpt(f, &f->m, 4);
    write_ckpt(f, &f->m, 8);
    snprintf(want, sizeof(want), "%s/step-00000008/exp_avg.bin", f->dir);
    assert_int_equal(tu_flip_byte(want, CKPT_DATA_HDR + 8), 0);
    char *said = NULL;
    size_t len = 0;
    FILE *log = open_memstream(&said, &len);
    assert_int_equal(load(f, "latest", path, err, log), 0);
    fclose(log);
    snprintf(want, sizeof(want), "%s/step-00000004", f->dir);
    assert_string_equal(path, want);
    assert_non_null(strstr(said, "step-00000008 is not loadable"));
    free(said);
    assert_int_equal(atomic_load(&((staging_hdr_t *)shm_data(f->seg))->step), 4);
}

/* A flipped byte in a data file's header (outside every chunk's checksum) makes the newest
 * checkpoint unloadable: latest falls back to the one before, a path is refused. */
static void test_restore_refuses_a_damaged_data_file_header(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024];
    write_ckpt(f, &f->m, 4);
    write_ckpt(f, &f->m, 8);
    snprintf(want, sizeof(want), "%s/step-00000008/exp_avg_sq.bin", f->dir);
    assert_int_equal(tu_flip_byte(want, 17), 0); /* the step's second byte */
    assert_int_equal(load(f, "latest", path, err, NULL), 0);
    snprintf(want, sizeof(want), "%s/step-00000004", f->dir);
    assert_string_equal(path, want);
    snprintf(want, sizeof(want), "%s/step-00000008", f->dir);
    assert_int_equal(load(f, want, path, err, NULL), -EBADMSG);
    assert_non_null(strstr(err, "not loadable"));
    assert_int_equal(access(want, F_OK), 0); /* a run that writes no checkpoint leaves it */
}

/* latest in a run that writes checkpoints: the damaged newer ones it passed over are moved
 * aside to step-N.damaged (kept), not left for the run to write over. */
static void test_restore_latest_moves_aside_what_it_passed_over_when_the_run_writes_checkpoints(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024];
    static char log[4096];
    f->m.ckpt_enable = 1;
    f->m.steps = 100; /* steps left to train: the data is read */
    write_ckpt(f, &f->m, 4);
    write_ckpt(f, &f->m, 8);
    write_ckpt(f, &f->m, 12);
    for (int step = 8; step <= 12; step += 4) { /* a header, then a chunk */
        snprintf(want, sizeof(want), "%s/step-%08d/exp_avg.bin", f->dir, step);
        assert_int_equal(tu_flip_byte(want, step == 8 ? 17 : CKPT_DATA_HDR + 40), 0);
    }
    FILE *lf = fmemopen(log, sizeof(log), "w");
    assert_int_equal(load(f, "latest", path, err, lf), 0);
    fclose(lf);
    snprintf(want, sizeof(want), "%s/step-00000004", f->dir);
    assert_string_equal(path, want);
    for (int step = 8; step <= 12; step += 4) {
        snprintf(want, sizeof(want), "%s/step-%08d", f->dir, step);
        assert_int_equal(access(want, F_OK), -1);
        strcat(want, ".damaged");
        assert_int_equal(access(want, F_OK), 0);
        if (!strstr(log, want))
            fail_msg("%s", log);
    }
    int64_t *steps = NULL;
    assert_int_equal(ckpt_list(f->dir, &steps), 1);
    free(steps);
}

/* The step a checkpoint claims must be the one its directory is named for, and one a run can
 * reach (training.steps is an int): a consistent step-6 checkpoint copied to step-00000009
 * would resume at step 7 with the weights latest took for step 9's, and one claiming 2^62
 * would end any run at once as done. latest passes over both; a path to either is refused. */
static void test_restore_refuses_a_step_its_directory_does_not_name_or_no_run_reaches(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024];
    write_ckpt(f, &f->m, 4);
    write_ckpt(f, &f->m, 6);
    forge(f, 6, "step-00000009", 6);
    assert_int_equal(load(f, "latest", path, err, NULL), 0);
    snprintf(want, sizeof(want), "%s/step-00000006", f->dir);
    assert_string_equal(path, want);
    snprintf(want, sizeof(want), "%s/step-00000009", f->dir);
    assert_int_equal(load(f, want, path, err, NULL), -EBADMSG);
    assert_non_null(strstr(err, "not loadable"));
    forge(f, 4, "step-4611686018427387904", 1LL << 62);
    char *said = NULL;
    size_t len = 0;
    FILE *log = open_memstream(&said, &len);
    assert_int_equal(load(f, "latest", path, err, log), 0);
    fclose(log);
    snprintf(want, sizeof(want), "%s/step-00000006", f->dir);
    assert_string_equal(path, want);
    assert_non_null(strstr(said, "step-4611686018427387904 is not loadable"));
    assert_non_null(strstr(said, "step-00000009 is not loadable"));
    free(said);
    assert_int_equal(atomic_load(&((staging_hdr_t *)shm_data(f->seg))->step), 6);
}

/* The loader cursor's "sample" (stages/runtime/ldr.h) must be an unsigned integer below 2^63: 2^63 and
 * a negative number are refused, naming the key, instead of reaching the loader. */
static void test_restore_refuses_a_cursor_sample_out_of_range(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024];
    const uint8_t big[] = {0x81, 0xa6, 's', 'a', 'm', 'p', 'l', 'e', 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0}; /* 2^63 */
    const uint8_t neg[] = {0x81, 0xa6, 's', 'a', 'm', 'p', 'l', 'e', 0xfb};                            /* -5 */
    write_ckpt_cursor(f, &f->m, 3, big, sizeof(big));
    write_ckpt_cursor(f, &f->m, 5, neg, sizeof(neg));
    for (int64_t step = 3; step <= 5; step += 2) {
        snprintf(want, sizeof(want), "%s/step-%08lld", f->dir, (long long)step);
        assert_int_not_equal(load(f, want, path, err, NULL), 0);
        if (!strstr(err, "\"sample\""))
            fail_msg("step %lld: %s", (long long)step, err);
        assert_int_equal(atomic_load(&((staging_hdr_t *)shm_data(f->seg))->step), -1);
    }
}

static void test_restore_refuses_a_checkpoint_of_another_model_naming_the_key(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024];
    manifest_t other = f->m;
    other.model.rope_theta = 500000;
    write_ckpt(f, &other, 2);
    snprintf(want, sizeof(want), "%s/step-00000002", f->dir);
    assert_int_equal(load(f, want, path, err, NULL), -EINVAL);
    assert_non_null(strstr(err, "was written for another model: its model.rope_theta = 500000, this run's is 10000"));
    assert_int_equal(atomic_load(&((staging_hdr_t *)shm_data(f->seg))->step), -1);
}

static void test_restore_names_a_missing_or_corrupt_directory_once_with_why(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024], msg[1200];
    snprintf(want, sizeof(want), "%s/step-00000009", f->dir);
    assert_int_equal(load(f, want, path, err, NULL), -ENOENT);
    snprintf(msg, sizeof(msg), "checkpoint.load %s is not loadable (no such directory): not resuming from it", want);
    assert_string_equal(err, msg);
    write_ckpt(f, &f->m, 3);
    snprintf(want, sizeof(want), "%s/step-00000003/index", f->dir); /* as if the machine died before the rename */
    assert_int_equal(unlink(want), 0);
    want[strlen(want) - strlen("/index")] = 0;
    assert_int_equal(load(f, want, path, err, NULL), -ENOENT);
    snprintf(msg, sizeof(msg), "checkpoint.load %s is not loadable (no index: incomplete checkpoint): not resuming "
             "from it", want);
    assert_string_equal(err, msg);
}

/* Bytes this process has read so far (/proc/self/io rchar: every read and pread). */
static long long bytes_read(void)
{
    FILE *fp = fopen("/proc/self/io", "r");
    char line[128];
    long long n = -1;
    while (fp && fgets(line, sizeof(line), fp))
        if (sscanf(line, "rchar: %lld", &n) == 1)
            break;
    if (fp)
        fclose(fp);
    assert_true(n >= 0);
    return n;
}

/* A load reads the checkpoint's data once, checking each chunk as it reads it: no whole verify
 * first (on an 8B's ~96 GB that was a second read of it all), by path and by latest. */
static void test_restore_reads_the_data_once(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024];
    write_ckpt(f, &f->m, 6);
    long long data = 3 * (long long)(f->tab.total * sizeof(float));
    snprintf(want, sizeof(want), "%s/step-00000006", f->dir);
    for (int latest = 0; latest < 2; latest++) {
        long long before = bytes_read();
        assert_int_equal(load(f, latest ? "latest" : want, path, err, NULL), 0);
        long long read = bytes_read() - before;
        print_message("%s: %lld bytes read for %lld of data\n", latest ? "latest" : "a path", read, data);
        assert_true(read >= data && read < 2 * data); /* a verify first read it all twice */
        assert_int_equal(atomic_load(&((staging_hdr_t *)shm_data(f->seg))->step), 6);
    }
}

/* A flipped byte inside a chunk of a checkpoint given by path: found as the load reads it, the
 * load refused naming the tensor and chunk (and the verify that lists every problem), the
 * segment left holding nothing whole. */
static void test_restore_refuses_a_corrupt_chunk_found_as_it_loads(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024];
    write_ckpt(f, &f->m, 4);
    snprintf(want, sizeof(want), "%s/step-00000004/exp_avg_sq.bin", f->dir);
    assert_int_equal(tu_flip_byte(want, CKPT_DATA_HDR + f->tab.total * sizeof(float) - 3), 0); /* the last tensor */
    snprintf(want, sizeof(want), "%s/step-00000004", f->dir);
    assert_int_equal(load(f, want, path, err, NULL), -EBADMSG);
    print_message("%s\n", err);
    if (!strstr(err, "checkpoint.load ") || !strstr(err, "is not loadable (") || !strstr(err, "checksum mismatch") ||
        !strstr(err, "exp_avg_sq.bin: tensor ") || !strstr(err, "ctitan ckpt verify"))
        fail_msg("%s", err);
    assert_int_equal(atomic_load(&((staging_hdr_t *)shm_data(f->seg))->step), -1);
}

/* A checkpoint at or past training.steps: the step is all the run needs (it has nothing left
 * to train), so no tensor is read. */
static void test_restore_reads_no_tensor_when_nothing_is_left_to_train(void **state)
{
    fx_t *f = *state;
    char path[sizeof(f->m.ckpt_load)], want[512], err[1024];
    write_ckpt(f, &f->m, f->m.steps);
    snprintf(want, sizeof(want), "%s/step-%08d", f->dir, f->m.steps);
    assert_int_equal(load(f, want, path, err, NULL), 0);
    staging_hdr_t *h = shm_data(f->seg);
    assert_int_equal(atomic_load(&h->step), f->m.steps);
    assert_true(staging_array(h, 0)[0] == 0 && staging_array(h, 2)[f->tab.total - 1] == 0);
}

/* ---- latest from a storage host, streamed into the segment ---- */

/* The storage host of these tests: f->dir/host/step-N, sent as a fetch's parts of `piece`
 * bytes (the server's order: the index, then each data file); or failing with `fail`. */
typedef struct {
    char dir[300];
    size_t piece;
    int fail, calls;
} host_t;

static int send_file(rmt_fetch_t *F, uint32_t file, const char *path, size_t piece, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t n = 0;
    assert_int_equal(util_read_file(path, (size_t)1 << 30, "file", &buf, &n, err, errlen), 0);
    int rc = 0;
    for (size_t off = 0; !rc && (off < n || off == 0); off += piece) {
        rmt_hdr_t h = {.type = RMT_PART, .file = file, .offset = off, .size = n};
        rc = rmt_fetch_part(F, &h, buf + off, n - off < piece ? n - off : piece, err, errlen);
        if (n == 0)
            break;
    }
    free(buf);
    return rc;
}

static int host_fetch(void *arg, int64_t step, const rmt_sink_t *sink, char *where, size_t wherelen, char *err,
                      size_t errlen)
{
    host_t *H = arg;
    H->calls++;
    if (H->fail)
        return util_fail(err, errlen, H->fail, "the storage host went quiet");
    char dir[400], path[600];
    snprintf(dir, sizeof(dir), "%s/step-%08lld", H->dir, (long long)step);
    rmt_fetch_t F;
    rmt_fetch_init(&F, sink, "job", step, "the test's host");
    ckpt_t *ck; /* the host's own reading of its index, for the files' names */
    assert_int_equal(ckpt_open(&ck, dir, err, errlen), 0);
    const ckpt_index_t *ix = ckpt_index(ck);
    snprintf(path, sizeof(path), "%s/index", dir);
    int rc = send_file(&F, 0, path, H->piece, err, errlen);
    for (int k = 0; !rc && k < ix->n_files; k++) {
        snprintf(path, sizeof(path), "%s/%s", dir, ix->files[k].name);
        rc = send_file(&F, (uint32_t)k + 1, path, H->piece, err, errlen);
    }
    ckpt_close(&ck);
    if (!rc)
        rc = rmt_fetch_done(&F, err, errlen);
    rmt_fetch_free(&F);
    snprintf(where, wherelen, "%s on tcp://host:1", dir);
    return rc;
}

/* The fixture's run made one that checkpoints to a storage host holding steps 4 and 8, written
 * into f->dir/host (by manifest `by8` for step 8). */
static void host_setup(fx_t *f, host_t *H, restore_stored_t *st, const manifest_t *by8)
{
    char local[sizeof(f->dir)];
    snprintf(local, sizeof(local), "%s", f->dir);
    assert_true(strlen(local) + 6 < sizeof(f->dir));
    snprintf(f->dir, sizeof(f->dir), "%.240s/host", local);
    assert_int_equal(util_mkdirs(f->dir), 0);
    write_ckpt(f, &f->m, 4);
    write_ckpt(f, by8, 8);
    snprintf(H->dir, sizeof(H->dir), "%s", f->dir);
    H->piece = 1000; /* not a divisor of the header or of a chunk */
    snprintf(f->dir, sizeof(f->dir), "%s", local);
    snprintf(f->m.ckpt_folder, sizeof(f->m.ckpt_folder), "%.240s/local", local);
    snprintf(f->m.ckpt_endpoint, sizeof(f->m.ckpt_endpoint), "tcp://host:1");
    f->m.ckpt_enable = 1;
    *st = (restore_stored_t){.n = 2, .steps = {8, 4}, .fetch = host_fetch, .arg = H};
}

static int load_stored(fx_t *f, const restore_stored_t *st, char *path, char *err, FILE *log)
{
    return restore_load_stored("latest", &f->m, st, &f->tab, shm_data(f->seg), log, path, sizeof(f->m.ckpt_load),
                               err, 1024);
}

/* The newest streams in whole (every array, the step, the cursor), named as the host keeps
 * it, and nothing is written on the trainer's side. */
static void test_restore_streams_the_newest_checkpoint_from_a_storage_host(void **state)
{
    fx_t *f = *state;
    host_t H = {0};
    restore_stored_t st;
    char path[sizeof(f->m.ckpt_load)], err[1024], want[600];
    host_setup(f, &H, &st, &f->m);
    int rc = load_stored(f, &st, path, err, NULL);
    if (rc)
        fail_msg("%d: %s", rc, err);
    snprintf(want, sizeof(want), "%s/step-00000008 on tcp://host:1", H.dir);
    assert_string_equal(path, want);
    assert_int_equal(H.calls, 1);
    staging_hdr_t *h = shm_data(f->seg);
    assert_int_equal(atomic_load(&h->step), 8);
    uint64_t sample = 0;
    assert_int_equal(ldr_cursor_get(h->cursor, h->cursor_len, "sample", &sample), 0);
    assert_int_equal(sample, 42);
    for (int a = 0; a < 3; a++)
        assert_memory_equal(staging_array(h, a), f->arr[a], f->tab.total * sizeof(float));
    assert_int_equal(access(f->m.ckpt_folder, F_OK), -1);
    /* a load that fails before any index came leaves no step of an earlier one (found by
     * fuzz_stream) */
    H.fail = -ETIMEDOUT;
    assert_int_equal(load_stored(f, &st, path, err, NULL), -ETIMEDOUT);
    assert_int_equal(atomic_load(&h->step), -1);
}

/* Damage the host's step 8 holds (a chunk's byte, then a data file's header) is found in what
 * streams in, and latest takes step 4, saying why; a checkpoint of another model ends the
 * search (it is not damage), as does a host that cannot send; none loading is refused. */
static void test_restore_passes_over_a_damaged_stored_checkpoint_and_stops_at_a_refused_one(void **state)
{
    fx_t *f = *state;
    host_t H = {0};
    restore_stored_t st;
    char path[sizeof(f->m.ckpt_load)], err[1024], file[600];
    static char log[8192];
    host_setup(f, &H, &st, &f->m);
    snprintf(file, sizeof(file), "%s/step-00000008/exp_avg.bin", H.dir);
    assert_int_equal(tu_flip_byte(file, CKPT_DATA_HDR + 5000), 0);
    FILE *lf = fmemopen(log, sizeof(log), "w");
    assert_int_equal(load_stored(f, &st, path, err, lf), 0);
    fclose(lf);
    assert_non_null(strstr(path, "/step-00000004 on tcp://host:1"));
    if (!strstr(log, "step 8 of job") || !strstr(log, "exp_avg.bin: checksum mismatch: not loading it"))
        fail_msg("%s", log);
    staging_hdr_t *h = shm_data(f->seg);
    assert_int_equal(atomic_load(&h->step), 4);
    for (int a = 0; a < 3; a++)
        assert_memory_equal(staging_array(h, a), f->arr[a], f->tab.total * sizeof(float));
    assert_int_equal(tu_flip_byte(file, CKPT_DATA_HDR + 5000), 0); /* mended; now a header */
    snprintf(file, sizeof(file), "%s/step-00000008/exp_avg_sq.bin", H.dir);
    assert_int_equal(tu_flip_byte(file, 17), 0);
    lf = fmemopen(log, sizeof(log), "w");
    assert_int_equal(load_stored(f, &st, path, err, lf), 0);
    fclose(lf);
    assert_non_null(strstr(path, "/step-00000004 on tcp://host:1"));
    if (!strstr(log, "data file exp_avg_sq.bin: header"))
        fail_msg("%s", log);
    /* both damaged: refused, never a fresh start */
    snprintf(file, sizeof(file), "%s/step-00000004/model.bin", H.dir);
    assert_int_equal(tu_flip_byte(file, CKPT_DATA_HDR + 7), 0);
    assert_int_equal(load_stored(f, &st, path, err, NULL), -EBADMSG);
    if (!strstr(err, "none of the newest 2 checkpoints of job") || !strstr(err, "on the storage host at tcp://host:1"))
        fail_msg("%s", err);
    assert_int_equal(atomic_load(&h->step), -1);
    /* a host that cannot send ends it at once */
    H.fail = -ETIMEDOUT;
    H.calls = 0;
    assert_int_equal(load_stored(f, &st, path, err, NULL), -ETIMEDOUT);
    assert_int_equal(H.calls, 1);
    assert_non_null(strstr(err, "the storage host went quiet"));
}

static void test_restore_a_stored_checkpoint_of_another_model_ends_the_search(void **state)
{
    fx_t *f = *state;
    host_t H = {0};
    restore_stored_t st;
    char path[sizeof(f->m.ckpt_load)], err[1024];
    manifest_t other = f->m;
    other.model.rope_theta = 500000;
    host_setup(f, &H, &st, &other);
    assert_int_equal(load_stored(f, &st, path, err, NULL), -EINVAL);
    assert_int_equal(H.calls, 1);
    if (!strstr(err, "step 8 of job") || !strstr(err, "was written for another model"))
        fail_msg("%s", err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_restore_fills_the_staging_segment_with_every_tensor_step_and_cursor,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_latest_is_the_newest_that_verifies_and_none_is_a_fresh_start,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_refuses_a_damaged_data_file_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_latest_moves_aside_what_it_passed_over_when_the_run_writes_checkpoints,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_refuses_a_step_its_directory_does_not_name_or_no_run_reaches,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_refuses_a_cursor_sample_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_refuses_a_checkpoint_of_another_model_naming_the_key, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_restore_names_a_missing_or_corrupt_directory_once_with_why, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_restore_reads_the_data_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_refuses_a_corrupt_chunk_found_as_it_loads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_reads_no_tensor_when_nothing_is_left_to_train, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_restore_streams_the_newest_checkpoint_from_a_storage_host, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_restore_passes_over_a_damaged_stored_checkpoint_and_stops_at_a_refused_one,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_a_stored_checkpoint_of_another_model_ends_the_search, setup,
                                        teardown),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
