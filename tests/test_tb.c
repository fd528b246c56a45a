/* TensorBoard event files (stages/report/tb.h, `[metrics] enable_tensorboard`): the writer alone, and
 * whole jobs whose event files are read back by the test's own reader (TFRecord framing, both
 * masked CRC32Cs by a bitwise CRC of its own, protobuf-c's unpacking) and compared with the
 * metrics file's records, number by number; a relaunched run's second file; a folder that cannot
 * be written failing the launch; and TensorBoard's own reader on a run (tools/check_tb.py,
 * skipped without the tensorboard package). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stages/report/tb.h"
#include "stages/report/tb_event.pb-c.h"
#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("tb"); }
static int teardown(void **state) { return tj_teardown(); }

/* ---- the test's reader ---- */

/* CRC32C (Castagnoli, reflected polynomial 0x82f63b78) bit by bit: the test's own, so the
 * writer's use of ISA-L (initial value, final inversion) is checked, not repeated. */
static uint32_t crc32c(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    while (n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
    }
    return ~c;
}

/* TFRecord's masked CRC (TensorFlow's crc32c::Mask). */
static uint32_t masked(const uint8_t *p, size_t n)
{
    uint32_t c = crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

typedef struct {
    double wall_time;
    int64_t step;
    char version[32]; /* file_version ("" for the others) */
    int start;        /* a SessionLog START */
    char tag[64];     /* a scalar's ("" for the others) */
    float value;
} ev_t;

#define MAX_EVENTS 40000

/* Every record of an event file into ev[]: each one's length and data checked against their
 * masked CRCs, the data an Event that protobuf-c unpacks, holding a file_version, a SessionLog
 * START or a summary of exactly one simple_value; no bytes after the last record, unless torn_ok (a
 * writer killed in its write(2) may leave part of a record: TensorBoard's reader stops there).
 * Returns the count. */
static int read_events(const char *path, ev_t *ev, int max, int torn_ok)
{
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    uint8_t *buf = malloc((size_t)sb.st_size + 1);
    assert_non_null(buf);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(buf, 1, (size_t)sb.st_size, f), (size_t)sb.st_size);
    fclose(f);
    size_t at = 0, size = (size_t)sb.st_size;
    int n = 0;
    while (at < size) {
        if (size - at < 12 && torn_ok)
            break;
        if (size - at < 12)
            fail_msg("%s: %zu bytes at %zu: a torn record header", path, size - at, at);
        uint64_t len = get_le(buf + at, 8);
        if (get_le(buf + at + 8, 4) != masked(buf + at, 8))
            fail_msg("%s: record %d: the length's CRC does not match", path, n);
        if ((len > size - at - 12 || size - at - 12 - len < 4) && torn_ok)
            break;
        if (len > size - at - 12 || size - at - 12 - len < 4)
            fail_msg("%s: record %d: length %llu runs past the end", path, n, (unsigned long long)len);
        const uint8_t *data = buf + at + 12;
        if (get_le(data + len, 4) != masked(data, (size_t)len))
            fail_msg("%s: record %d: the data's CRC does not match", path, n);
        Tensorboard__Event *e = tensorboard__event__unpack(NULL, (size_t)len, data);
        if (!e)
            fail_msg("%s: record %d: not an Event", path, n);
        assert_true(n < max);
        ev_t *o = &ev[n++];
        memset(o, 0, sizeof(*o));
        o->wall_time = e->wall_time;
        o->step = e->step;
        if (e->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION) {
            snprintf(o->version, sizeof(o->version), "%s", e->file_version);
        } else if (e->what_case == TENSORBOARD__EVENT__WHAT_SESSION_LOG) {
            assert_int_equal(e->session_log->status, TENSORBOARD__SESSION_LOG__SESSION_STATUS__START);
            o->start = 1;
        } else {
            assert_int_equal(e->what_case, TENSORBOARD__EVENT__WHAT_SUMMARY);
            assert_int_equal(e->summary->n_value, 1);
            const Tensorboard__Summary__Value *v = e->summary->value[0];
            assert_int_equal(v->value_case, TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
            assert_true(strlen(v->tag) > 0 && strlen(v->tag) < sizeof(o->tag));
            snprintf(o->tag, sizeof(o->tag), "%s", v->tag);
            o->value = v->simple_value;
        }
        tensorboard__event__free_unpacked(e, NULL);
        at += 12 + len + 4;
    }
    free(buf);
    return n;
}

/* The event files of folder dir, in name order (TensorBoard's), into names[]; the count. */
static int event_files(const char *dir, char names[][PATH_MAX], int max)
{
    struct dirent **list;
    int k = scandir(dir, &list, NULL, alphasort), n = 0;
    for (int i = 0; i < k; i++) {
        if (!strncmp(list[i]->d_name, TB_FILE_PREFIX, strlen(TB_FILE_PREFIX)) && n < max)
            snprintf(names[n++], PATH_MAX, "%s/%s", dir, list[i]->d_name);
        free(list[i]);
    }
    if (k >= 0)
        free(list);
    return n;
}

/* A file's name is events.out.tfevents.<time>.<this host>.<pid>.<n>, time within [t0, t1]. */
static void assert_file_name(const char *path, double t0, double t1, pid_t pid)
{
    char host[256], tail[320];
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = 0;
    const char *base = strrchr(path, '/') + 1;
    assert_int_equal(strncmp(base, TB_FILE_PREFIX, strlen(TB_FILE_PREFIX)), 0);
    char *end;
    long long t = strtoll(base + strlen(TB_FILE_PREFIX), &end, 10);
    if (t < (long long)t0 || t > (long long)t1)
        fail_msg("%s: time %lld outside [%.0f, %.0f]", base, t, t0, t1);
    snprintf(tail, sizeof(tail), ".%s.%d.", host, (int)pid);
    if (strncmp(end, tail, strlen(tail)))
        fail_msg("%s: expected '%s' after the time", base, tail);
    end += strlen(tail);
    assert_true(*end >= '0' && *end <= '9');
    strtol(end, &end, 10);
    assert_int_equal(*end, 0);
}

/* ---- the metrics file's records as the tags they become ---- */

typedef struct {
    char tag[64];
    double v;
    double tol; /* the half unit of its last printed digit */
} num_t;

/* A number at *p, its value and half the unit of its last printed digit. */
static double parse_number(const char **p, double *half_unit)
{
    char *end;
    double v = strtod(*p, &end);
    const char *dot = memchr(*p, '.', (size_t)(end - *p)), *e = memchr(*p, 'e', (size_t)(end - *p));
    int digits = dot ? (int)((e ? e : end) - dot - 1) : 0, exp = e ? atoi(e + 1) : 0;
    *half_unit = 0.5 * pow(10, exp - digits);
    *p = end;
    return v;
}

static void put(num_t *out, int *n, int max, const char *tag, double v, double tol)
{
    assert_true(*n < max);
    snprintf(out[*n].tag, sizeof(out[*n].tag), "%s", tag);
    out[*n].v = v;
    out[(*n)++].tol = tol;
}

/* The numbers of one metrics record as the tags tb writes them: each key's own, mem_peak_bytes
 * as mem_peak_gib, stage_ms's rows as stage_ms/S/f, /b, /w, a null as what not_finite names,
 * the validation record's val_loss (not its counts). Returns the count (0 for a restart
 * record), the step in *step. */
static int record_numbers(const char *line, int *step, num_t *out, int max)
{
    const char *p = line;
    char nf[512] = "";
    int n = 0;
    if (!strncmp(line, "{\"restart\": ", 12))
        return 0;
    const char *q = strstr(line, "\"not_finite\": {");
    if (q)
        snprintf(nf, sizeof(nf), "%.*s", (int)strcspn(q, "}"), q);
    assert_true(*p++ == '{');
    while (*p == '"') {
        char key[64];
        size_t kl = strcspn(p + 1, "\"");
        assert_true(kl < sizeof(key));
        snprintf(key, sizeof(key), "%.*s", (int)kl, p + 1);
        p += kl + 2;
        assert_true(!strncmp(p, ": ", 2));
        p += 2;
        double half;
        if (!strcmp(key, "not_finite")) {
            p = strchr(p, '}') + 1;
        } else if (!strcmp(key, "stage_ms")) {
            assert_true(*p++ == '[');
            for (int s = 0; *p == '['; s++) {
                p++;
                for (int k = 0; k < 3; k++) {
                    char tag[64];
                    snprintf(tag, sizeof(tag), "stage_ms/%d/%c", s, "fbw"[k]);
                    double v = parse_number(&p, &half);
                    put(out, &n, max, tag, v, half);
                    if (k < 2) {
                        assert_true(!strncmp(p, ", ", 2));
                        p += 2;
                    }
                }
                assert_true(*p++ == ']');
                if (!strncmp(p, ", ", 2))
                    p += 2;
            }
            assert_true(*p++ == ']');
        } else if (!strncmp(p, "null", 4)) {
            char want[80];
            snprintf(want, sizeof(want), "\"%s\": \"", key);
            const char *w = strstr(nf, want);
            if (!w)
                fail_msg("%s is null and not_finite does not name it: %s", key, line);
            put(out, &n, max, key, strtod(w + strlen(want), NULL), 0); /* "nan", "inf", "-inf" */
            p += 4;
        } else {
            double v = parse_number(&p, &half);
            if (!strcmp(key, "step"))
                *step = (int)v;
            else if (!strcmp(key, "mem_peak_bytes"))
                put(out, &n, max, "mem_peak_gib", v / 1073741824.0, half / 1073741824.0);
            else if (strcmp(key, "val_batches") && strcmp(key, "val_tokens"))
                put(out, &n, max, key, v, half);
        }
        if (!strncmp(p, ", ", 2))
            p += 2;
    }
    if (*p != '}')
        fail_msg("unexpected text at '%.40s' in %s", p, line);
    return n;
}

/* Whether an event's float is the record's number: as printed, to the printed digits and a
 * float's rounding; NaN and the infinities as they are. */
static int same_value(float got, double v, double tol)
{
    if (isnan(v))
        return isnan(got);
    if (isinf(v))
        return got == v;
    return fabs((double)got - v) <= tol + fabs(v) * 0x1p-24;
}

/* The events ev[0..n) (a file's, after its version record) are the records of lines
 * [0, nlines) in order: for each record its step's events, one per number, each of the
 * record's tags once and its value; wall times within [t0, t1], one per step, never going back.
 * killed: the writer was killed -9, the events may stop inside the last record (the metrics
 * file is written first, then the step's events in one write(2) that a kill may cut short). */
static void assert_events_are_the_records(const ev_t *ev, int n, char **lines, int nlines, double t0, double t1,
                                          int killed)
{
    static num_t nums[256];
    int at = 0;
    double last_wall = 0;
    for (int l = 0; l < nlines; l++) {
        int step = -1, k = record_numbers(lines[l], &step, nums, 256);
        if (!k)
            continue;
        int last = 1;
        for (int m = l + 1; m < nlines; m++)
            last &= !strncmp(lines[m], "{\"restart\": ", 12);
        if (at + k > n && !(killed && last))
            fail_msg("the events end at %d, the record of step %d needs %d more: %s", n, step, k, lines[l]);
        if (at + k > n) {
            print_message("the killed run's events stop inside its last record, step %d (%d of %d)\n", step, n - at, k);
            k = n - at;
            if (!k)
                break;
        }
        for (int i = 0; i < k; i++) {
            const ev_t *e = &ev[at + i];
            if (e->step != step)
                fail_msg("event %d (%s) has step %lld among step %d's: %s", at + i, e->tag, (long long)e->step, step,
                         lines[l]);
            assert_true(e->wall_time == ev[at].wall_time);
            int j = 0;
            while (j < k && strcmp(nums[j].tag, e->tag))
                j++;
            if (j == k)
                fail_msg("step %d: event tag '%s' is no number of the record %s", step, e->tag, lines[l]);
            if (!same_value(e->value, nums[j].v, nums[j].tol))
                fail_msg("step %d: %s is %.9g in the events, %.17g (to %g) in the record", step, e->tag, e->value,
                         nums[j].v, nums[j].tol);
            nums[j].tag[0] = 0; /* each once */
        }
        if (ev[at].wall_time < last_wall || ev[at].wall_time < t0 || ev[at].wall_time > t1)
            fail_msg("step %d: wall time %.3f, the previous step's %.3f, the run from %.3f to %.3f", step,
                     ev[at].wall_time, last_wall, t0, t1);
        last_wall = ev[at].wall_time;
        at += k;
    }
    if (at != n)
        fail_msg("%d events after the last record's (the first: %s at step %lld)", n - at, ev[at].tag,
                 (long long)ev[at].step);
}

/* A file's first records, written as it is created: the version, then a SessionLog START at
 * the run's first step; only the scalars after them. Returns the first scalar. */
static const ev_t *after_start(const ev_t *ev, int n, int64_t first_step, double t0, double t1)
{
    assert_true(n >= 2);
    assert_string_equal(ev[0].version, TB_FILE_VERSION);
    assert_int_equal(ev[0].step, 0);
    assert_true(ev[0].wall_time >= t0 && ev[0].wall_time <= t1);
    assert_true(ev[1].start && !ev[1].version[0] && !ev[1].tag[0]);
    assert_int_equal(ev[1].step, first_step);
    assert_true(ev[1].wall_time == ev[0].wall_time);
    for (int i = 2; i < n; i++)
        assert_true(!ev[i].version[0] && !ev[i].start && ev[i].tag[0]);
    return ev + 2;
}

/* The job's metrics file as lines (static storage), the count. */
static int metrics_lines(const char *job, char **lines, int max)
{
    static char buf[1 << 22];
    tj_read_metrics(job, buf, sizeof(buf));
    int n = 0;
    for (char *l = strtok(buf, "\n"); l && n < max; l = strtok(NULL, "\n"))
        lines[n++] = l;
    return n;
}

/* ---- the writer alone ---- */

static void test_tb_the_test_crc_is_crc32c(void **state)
{
    assert_int_equal(crc32c((const uint8_t *)"123456789", 9), 0xe3069283u); /* the Castagnoli check value */
    assert_int_equal(crc32c((const uint8_t *)"", 0), 0);
}

/* A file holds its version and START records from the open, the scalars only once flushed,
 * each as it was given (0, NaN and the infinities too; a double beyond a float's range is an
 * infinity), in order; the name is TensorFlow's. */
static void test_tb_writer_keeps_the_version_then_each_scalar_at_flush(void **state)
{
    char dir[] = "/tmp/ctitan-tbw-XXXXXX", sub[64], err[512], names[4][PATH_MAX];
    static ev_t ev[64];
    assert_non_null(mkdtemp(dir));
    snprintf(sub, sizeof(sub), "%s/a/b", dir); /* created with its parent */
    double t0 = tb_now();
    tb_t *tb = NULL;
    assert_int_equal(tb_open(&tb, sub, 7, err, sizeof(err)), 0);
    assert_int_equal(event_files(sub, names, 4), 1);
    assert_string_equal(names[0], tb_path(tb));
    assert_file_name(names[0], t0, tb_now(), getpid());
    assert_int_equal(read_events(names[0], ev, 64, 0), 2);

    const struct { const char *tag; int64_t step; double v; } in[] = {
        {"loss", 1, 2.5}, {"zero", 1, 0.0}, {"neg", 1, -1e-7}, {"nan", 2, NAN}, {"inf", 2, INFINITY},
        {"ninf", 2, -INFINITY}, {"huge", 3, 1e300}, {"stage_ms/0/f", 1LL << 40, 0.1},
    };
    int k = (int)(sizeof(in) / sizeof(in[0]));
    double wall = tb_now();
    for (int i = 0; i < k; i++)
        assert_int_equal(tb_scalar(tb, in[i].tag, in[i].step, in[i].v, wall + i), 0);
    assert_int_equal(read_events(names[0], ev, 64, 0), 2); /* buffered */
    assert_int_equal(tb_flush(tb, err, sizeof(err)), 0);
    double t1 = tb_now();
    tb_close(&tb);
    assert_null(tb);
    assert_int_equal(read_events(names[0], ev, 64, 0), 2 + k);
    const ev_t *s = after_start(ev, 2 + k, 7, t0, t1);
    for (int i = 0; i < k; i++) {
        const ev_t *e = &s[i];
        assert_string_equal(e->tag, in[i].tag);
        assert_int_equal(e->step, in[i].step);
        assert_true(e->wall_time == wall + i);
        float want = (float)in[i].v;
        if (isnan(want) ? !isnan(e->value) : memcmp(&e->value, &want, sizeof(float)))
            fail_msg("%s: %.9g, expected %.9g", e->tag, e->value, want);
    }
    assert_true(isinf(s[6].value) && s[6].value > 0); /* 1e300 as a float */
    tu_rmtree(dir);
}

/* TensorBoard reads a folder's files in name order: a second open in the same second waits for
 * the next, so its file sorts after the first's; each has its own first records. */
static void test_tb_a_second_file_in_a_folder_sorts_after_the_first(void **state)
{
    char dir[] = "/tmp/ctitan-tbw-XXXXXX", err[512], names[4][PATH_MAX];
    static ev_t ev[8];
    assert_non_null(mkdtemp(dir));
    tb_t *a = NULL, *b = NULL;
    double t0 = tb_now();
    assert_int_equal(tb_open(&a, dir, 1, err, sizeof(err)), 0);
    assert_int_equal(tb_open(&b, dir, 1, err, sizeof(err)), 0);
    double t1 = tb_now();
    assert_true(t1 - t0 < 2.5);
    assert_int_equal(event_files(dir, names, 4), 2);
    assert_string_equal(names[0], tb_path(a));
    assert_string_equal(names[1], tb_path(b));
    assert_true(atoll(strrchr(names[1], '/') + 1 + strlen(TB_FILE_PREFIX)) >
                atoll(strrchr(names[0], '/') + 1 + strlen(TB_FILE_PREFIX)));
    for (int i = 0; i < 2; i++) {
        assert_file_name(names[i], t0, t1, getpid());
        assert_int_equal(read_events(names[i], ev, 8, 0), 2);
        after_start(ev, 2, 1, t0, t1);
    }
    tb_close(&a);
    tb_close(&b);
    tu_rmtree(dir);
}

/* A folder that cannot be created, and a "folder" that is a file, fail the open naming the
 * path and the reason; nothing is left open. */
static void test_tb_open_fails_naming_the_path(void **state)
{
    char dir[] = "/tmp/ctitan-tbw-XXXXXX", file[64], err[512], want[256];
    assert_non_null(mkdtemp(dir));
    tb_t *tb = (tb_t *)1;
    assert_int_equal(tb_open(&tb, "/proc/ctitan-no/tb", 1, err, sizeof(err)), -ENOENT);
    assert_null(tb);
    assert_string_equal(err, "/proc/ctitan-no/tb: cannot create the folder: No such file or directory");
    snprintf(file, sizeof(file), "%s/plain", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(tb_open(&tb, file, 1, err, sizeof(err)), -ENOTDIR);
    assert_null(tb);
    snprintf(want, sizeof(want), "%s/" TB_FILE_PREFIX, file);
    if (strncmp(err, want, strlen(want)) || !strstr(err, ": cannot create: Not a directory"))
        fail_msg("error '%s'", err);
    tu_rmtree(dir);
}

/* ---- whole jobs ---- */

static char *lines[TJ_MAX_STEPS * 2];

/* The job's folder of event files (the default save_tb_folder: DUMP/tb). */
static void tb_dir(const char *job, char *dir, size_t n) { snprintf(dir, n, "%s/runs/%s/tb", tj_dir, job); }

/* A job with validation (tiny.toml: 2 pipeline stages) writes one event file whose records are
 * the metrics file's, number by number and step by step, the validation loss last at the last
 * step; the banner names the file and how to open it. */
static void test_tb_a_run_writes_every_number_of_its_metrics_records(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    static ev_t ev[MAX_EVENTS];
    char j[32], extra[512], dir[256], names[4][PATH_MAX], want[PATH_MAX + 512];
    tj_name(j, sizeof(j), 't', "run");
    snprintf(extra, sizeof(extra),
             "--training.steps 6 --metrics.enable_tensorboard true --validation.enable true "
             "--validation.dataset_path %s/data/val.bin --validation.steps 2",
             tj_dir);
    double t0 = tb_now();
    int rc = tj_launch("", 300, j, extra, out, sizeof(out));
    double t1 = tb_now();
    if (rc)
        TJ_FAIL_WITH(out, "status %d", rc);
    tb_dir(j, dir, sizeof(dir));
    assert_int_equal(event_files(dir, names, 4), 1);
    snprintf(want, sizeof(want), "launch: TensorBoard events in %s (tensorboard --logdir %s)\n", names[0], dir);
    if (!strstr(out, want))
        TJ_FAIL_WITH(out, "no line '%s'", want);
    int n = read_events(names[0], ev, MAX_EVENTS, 0), nl = metrics_lines(j, lines, TJ_MAX_STEPS * 2);
    assert_int_equal(nl, 7);
    const ev_t *e = after_start(ev, n, 1, t0, t1);
    assert_events_are_the_records(e, n - 2, lines, nl, t0, t1, 0);
    /* 11 numbers (the bubble measured and ideal among them), the loader's sample count and 3
     * times for each of 2 stages per step */
    assert_int_equal(n, 2 + 6 * 18 + 1);
    assert_string_equal(ev[n - 1].tag, "val_loss");
    assert_int_equal(ev[n - 1].step, 6);
    assert_string_equal(e[0].tag, "loss");
    assert_int_equal(e[0].step, 1);
    tj_assert_clean(j);
}

/* A run whose numbers become NaN (lr 1e38) writes them as they are, where the metrics file
 * has null and names them under not_finite. */
static void test_tb_values_that_are_not_finite_are_written_as_they_are(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    static ev_t ev[MAX_EVENTS];
    char j[32], dir[256], names[4][PATH_MAX];
    tj_name(j, sizeof(j), 't', "nan");
    double t0 = tb_now();
    int rc = tj_launch("", 300, j,
                       "--training.steps 4 --optimizer.lr 1e38 --lr_scheduler.warmup_steps 0 "
                       "--metrics.enable_tensorboard true",
                       out, sizeof(out));
    double t1 = tb_now();
    if (rc)
        TJ_FAIL_WITH(out, "status %d", rc);
    tb_dir(j, dir, sizeof(dir));
    assert_int_equal(event_files(dir, names, 4), 1);
    int n = read_events(names[0], ev, MAX_EVENTS, 0), nl = metrics_lines(j, lines, TJ_MAX_STEPS * 2);
    assert_events_are_the_records(after_start(ev, n, 1, t0, t1), n - 2, lines, nl, t0, t1, 0);
    int nans = 0;
    for (int i = 2; i < n; i++)
        nans += isnan(ev[i].value);
    assert_true(nans > 0);
    tj_read_metrics(j, out, sizeof(out));
    assert_non_null(strstr(out, "\"grad_norm\": \"nan\""));
}

/* A save_tb_folder that cannot be created (under /proc) fails the launch before the first step,
 * naming the key and the path; nothing of the job is left. */
static void test_tb_an_unwritable_folder_fails_the_launch_naming_it(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    tj_name(j, sizeof(j), 't', "proc");
    int rc = tj_launch("", 300, j, "--training.steps 4 --metrics.enable_tensorboard true "
                       "--metrics.save_tb_folder /proc/ctitan-no/tb", out, sizeof(out));
    assert_int_equal(rc, 1);
    if (!strstr(out, "launch: metrics.save_tb_folder: /proc/ctitan-no/tb: cannot create the folder: "))
        TJ_FAIL_WITH(out, "the launch does not name the folder");
    assert_null(strstr(out, "\nstep "));
    tj_read_metrics(j, out, sizeof(out));
    assert_null(strstr(out, "\"step\""));
    tj_assert_clean(j);
}

/* A run of 600 steps with a checkpoint every 100 whose coordinator is killed -9 once the first
 * is saved (about 100 steps later here), relaunched at once (no backoff); validation at the
 * end. Returns the folder's event files in names[] and their count. */
static int relaunched_run(const char *j, char names[][PATH_MAX], int max, double *t0, double *t1)
{
    static char out[1 << 20];
    char extra[512], dir[256];
    snprintf(extra, sizeof(extra),
             "--metrics.log_freq 100000 --training.steps 600 --checkpoint.enable true --checkpoint.interval 100 "
             "--job.restart_backoff_ms 0 --metrics.enable_tensorboard true --validation.enable true "
             "--validation.dataset_path %s/data/val.bin --validation.steps 2",
             tj_dir);
    *t0 = tb_now();
    pid_t pid = tj_launch_bg(j, extra);
    int i;
    for (i = 0; i < 6000; i++) {
        tj_read_out(j, out, sizeof(out));
        if (strstr(out, "checkpoint: step 100 saved"))
            break;
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    }
    assert_true(i < 6000);
    pid_t coord = tu_descendant_named(pid, "ctitan-coord");
    assert_true(coord > 0);
    kill(coord, SIGKILL);
    int rc = tu_reap(pid, 120, NULL);
    *t1 = tb_now();
    tj_read_out(j, out, sizeof(out));
    if (rc)
        TJ_FAIL_WITH(out, "status %d", rc);
    if (!strstr(out, "\nrestart 1"))
        TJ_FAIL_WITH(out, "the run ended before its coordinator was killed: no restart");
    tb_dir(j, dir, sizeof(dir));
    return event_files(dir, names, max);
}

/* A run relaunched by the supervisor (its coordinator killed -9) has two event files: the
 * failed run's, the records before the restart record, and the relaunch's, sorting after it,
 * the records after it (from the step after the checkpoint it resumed), its START at that
 * step (where TensorBoard drops the failed run's events). */
static void test_tb_a_relaunch_writes_a_second_file_after_the_first(void **state)
{
    TU_NEED_BIN();
    static ev_t ev[MAX_EVENTS];
    char j[32], names[4][PATH_MAX];
    double t0, t1;
    tj_name(j, sizeof(j), 't', "again");
    assert_int_equal(relaunched_run(j, names, 4, &t0, &t1), 2);
    int nl = metrics_lines(j, lines, TJ_MAX_STEPS * 2), r = 0;
    while (r < nl && strncmp(lines[r], "{\"restart\": 1,", 14))
        r++;
    assert_true(r > 0 && r < nl);
    for (int f = 0; f < 2; f++) {
        static num_t nums[64];
        char **from = f ? lines + r + 1 : lines;
        int count = f ? nl - r - 1 : r, first = -1;
        record_numbers(from[0], &first, nums, 64);
        if (f)
            assert_true(first > 100 && first % 100 == 1); /* after a checkpoint */
        else
            assert_int_equal(first, 1);
        int n = read_events(names[f], ev, MAX_EVENTS, !f);
        assert_events_are_the_records(after_start(ev, n, first, t0, t1), n - 2, from, count, t0, t1, !f);
    }
    tj_assert_clean(j);
}

/* tools/check_tb.py over job's event folder and the metrics file of `metrics_job`: its exit
 * status, its output in res. */
static int check_tb(const char *script, const char *job, const char *metrics_job, char *res, size_t n)
{
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof(cmd), "python3 %s %s/runs/%s/tb %s/%s.jsonl 2>&1", script, tj_dir, job, tj_dir, metrics_job);
    int rc = tu_run(cmd, res, n);
    print_message("%s", res);
    return rc;
}

/* TensorBoard's own reader (EventAccumulator, tools/check_tb.py) shows the metrics file's
 * numbers: over a relaunched run's folder every tag at each step once, the relaunch's values
 * where it redid steps; over a run whose numbers are NaN, NaN where the metrics file has null.
 * The checker does see a difference: one number changed in a copy of the metrics file. Skipped
 * without the tensorboard package. */
static void test_tb_tensorboard_reads_the_metrics_files_numbers(void **state)
{
    TU_NEED_BIN();
    static char res[1 << 16];
    char j[32], nan[32], names[4][PATH_MAX], script[PATH_MAX + 64] = "tools/check_tb.py", exe[PATH_MAX];
    double t0, t1;
    if (tu_run("python3 -c 'import tensorboard' 2>&1", res, sizeof(res))) {
        print_message("python3 cannot import tensorboard: skipping TensorBoard's reader "
                      "(python3 -m pip install tensorboard to run it)\n");
        skip();
    }
    /* from the repository root (make test), else beside the build folder */
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (access(script, R_OK) && n > 0) {
        exe[n] = 0;
        snprintf(script, sizeof(script), "%s/../../tools/check_tb.py", dirname(exe));
    }
    assert_int_equal(access(script, R_OK), 0);
    tj_name(j, sizeof(j), 't', "board");
    assert_int_equal(relaunched_run(j, names, 4, &t0, &t1), 2);
    assert_int_equal(check_tb(script, j, j, res, sizeof(res)), 0);
    assert_non_null(strstr(res, "check_tb: 19 tags, "));
    tj_assert_clean(j);

    tj_name(nan, sizeof(nan), 't', "bnan");
    int rc = tj_launch("", 300, nan,
                       "--training.steps 4 --optimizer.lr 1e38 --lr_scheduler.warmup_steps 0 "
                       "--metrics.enable_tensorboard true",
                       res, sizeof(res));
    if (rc)
        TJ_FAIL_WITH(res, "status %d", rc);
    assert_int_equal(check_tb(script, nan, nan, res, sizeof(res)), 0);
    assert_non_null(strstr(res, "check_tb: 18 tags, 72 values")); /* no val_loss */
    char path[PATH_MAX], *at;
    tj_read_metrics(nan, res, sizeof(res));
    assert_non_null(at = strstr(res, "\"loader_sample\": 8,")); /* step 2's: 4 sequences a step */
    at[17] = '9';
    snprintf(path, sizeof(path), "%s/changed.jsonl", tj_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(res, f);
    fclose(f);
    assert_int_equal(check_tb(script, nan, "changed", res, sizeof(res)), 1);
    assert_non_null(strstr(res, "check_tb: loader_sample at step 2: TensorBoard has 8.0, the metrics file 9.0"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tb_the_test_crc_is_crc32c),
        cmocka_unit_test(test_tb_writer_keeps_the_version_then_each_scalar_at_flush),
        cmocka_unit_test(test_tb_a_second_file_in_a_folder_sorts_after_the_first),
        cmocka_unit_test(test_tb_open_fails_naming_the_path),
        cmocka_unit_test(test_tb_a_run_writes_every_number_of_its_metrics_records),
        cmocka_unit_test(test_tb_values_that_are_not_finite_are_written_as_they_are),
        cmocka_unit_test(test_tb_an_unwritable_folder_fails_the_launch_naming_it),
        cmocka_unit_test(test_tb_a_relaunch_writes_a_second_file_after_the_first),
        cmocka_unit_test(test_tb_tensorboard_reads_the_metrics_files_numbers),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
