/* The cached sgemm and GPU peaks (stages/report/peak_cache.h) with real files in a temp folder and a stand-in
 * measurement that counts its calls: measured once, then read back; given by the manifest,
 * never touched; a bad, foreign or unwritable cache passed over with a warning naming the
 * file, never a failure. (test_report runs the real measurement inside a launch.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cblas.h>

#include "stages/report/peak_cache.h"
#include "tests/testutil.h"

static char g_dir[64];
static int g_calls;

/* The stand-in: 100 + calls GFLOP/s, so each measurement is told apart. */
static double fake_measure(int threads, int n, int runs, double *native, double *pooled)
{
    assert_int_equal(n, PEAK_CACHE_N);
    assert_int_equal(runs, PEAK_CACHE_RUNS);
    g_calls++;
    *native = 50.25;
    *pooled = 100 + g_calls + 1.0 / 3;
    return *pooled;
}

static int setup(void **state)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/ctitan-peak-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    tu_rmtree(g_dir);
    return 0;
}

/* Each test: its own cache file DIR/NAME/peak (the folder not made yet), pointed at by
 * CTITAN_PEAK_CACHE; the call count from 0. */
static const char *use_cache(const char *name)
{
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s/peak", g_dir, name);
    setenv("CTITAN_PEAK_CACHE", path, 1);
    g_calls = 0;
    return path;
}

static void write_text(const char *path, const char *text, size_t n)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s", path);
    *strrchr(dir, '/') = 0;
    mkdir(dir, 0755);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    fclose(f);
}

static void test_peak_cache_measures_once_then_reads_the_file(void **state)
{
    const char *path = use_cache("once");
    peak_cache_t p, q;
    char line[8192], want[512];
    assert_true(peak_cache_get(0, 2, fake_measure, &p) == 100 + 1 + 1.0 / 3);
    assert_int_equal(p.from, PEAK_MEASURED);
    assert_int_equal(p.cached, 1);
    assert_string_equal(p.path, path);
    assert_string_equal(p.warning, "");
    assert_int_equal(access(path, R_OK), 0);
    peak_cache_describe(&p, line, sizeof(line));
    snprintf(want, sizeof(want),
             "the sgemm peak measured now (n=%d, median of %d runs, 2 threads, OpenBLAS %s kernels) "
             "and cached at %s", PEAK_CACHE_N, PEAK_CACHE_RUNS, openblas_get_corename(), path);
    assert_string_equal(line, want);
    for (int i = 0; i < 3; i++) {
        assert_true(peak_cache_get(0, 2, fake_measure, &q) == p.gflops); /* bitwise: %.17g */
        assert_int_equal(q.from, PEAK_CACHED);
        assert_string_equal(q.warning, "");
        assert_int_equal(g_calls, 1);
        assert_true(q.entry.native == p.entry.native && q.entry.pooled == p.entry.pooled);
        assert_true(q.entry.measured == p.entry.measured);
    }
    peak_cache_describe(&q, line, sizeof(line));
    snprintf(want, sizeof(want), "the sgemm peak from the cache %s (", path);
    assert_non_null(strstr(line, want));
    assert_non_null(strstr(line, "; measured 20"));
    /* another thread count is another set-up: measured for itself */
    assert_true(peak_cache_get(0, 3, fake_measure, &q) == 100 + 2 + 1.0 / 3);
    assert_int_equal(q.from, PEAK_MEASURED);
    assert_non_null(strstr(q.warning, "threads '2', here '3'"));
}

static void test_peak_cache_round_trips_every_field(void **state)
{
    const char *path = use_cache("trip");
    peak_cache_entry_t e, r;
    char err[512];
    memset(&e, 0, sizeof(e));
    peak_cache_key(&e.key, 7);
    e.native = 0.1, e.pooled = 1e300 / 7, e.gflops = e.pooled, e.measured = 1795587001LL;
    assert_int_equal(peak_cache_write(path, &e, err, sizeof(err)), 0);
    assert_int_equal(peak_cache_read(path, &r, err, sizeof(err)), 0);
    assert_memory_equal(&r.key, &e.key, sizeof(e.key));
    assert_true(r.native == e.native && r.pooled == e.pooled && r.gflops == e.gflops);
    assert_true(r.measured == e.measured);
    assert_int_equal(peak_cache_read("/nonexistent/peak", &r, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "/nonexistent/peak"));
}

/* Each malformed file: passed over with a warning naming the file (and the line) and what is
 * wrong, measured again, and replaced by a good file. */
static void test_peak_cache_bad_file_is_measured_again_with_a_warning(void **state)
{
    peak_cache_entry_t e;
    memset(&e, 0, sizeof(e));
    peak_cache_key(&e.key, 2);
    e.native = 1, e.pooled = 2, e.gflops = 2, e.measured = 1;
    char good[4096], err[512];
    const char *path = use_cache("bad");
    assert_int_equal(peak_cache_write(path, &e, err, sizeof(err)), 0);
    tu_read_file(path, good, sizeof(good));
    static char big[5000];
    memset(big, 'x', sizeof(big));
    char nul[] = "ctitan sgemm peak cache 1\ncpu a\0b\n";
    char edited[4096], cut[4096];
    snprintf(cut, sizeof(cut), "%.*s", (int)(strstr(good, "gflops 2") - good + 7), good); /* "gflops " */
    struct {
        const char *text;
        size_t n;
        const char *why;
    } cases[] = {
        {"garbage\n", 8, ":1: not a ctitan peak cache (expected 'ctitan sgemm peak cache 1')"},
        {"", 0, ":1: the end of the file where the version line was expected"},
        {"ctitan sgemm peak cache 2\n", 26, ":1: a peak cache of version 2 (this build reads 1)"},
        {nul, sizeof(nul) - 1, ": holds a NUL byte"},
        {big, sizeof(big), ": more than 4096 bytes"},
        {cut, strlen(cut), ":8: a line without its newline where gflops was expected"},
        {"ctitan sgemm peak cache 1\nthreads 2\n", 36, ":2: expected 'cpu VALUE'"},
        {NULL, 0, ":8: gflops: expected a finite number > 0, got '-2'"},
        {NULL, 0, ":3: threads: expected a whole number from 1 to 1048576, got '2x'"},
        {NULL, 0, ": gflops 3 is not the higher of native and pooled"},
        {NULL, 0, ":12: unexpected text after the last field"},
    };
    const char *edits[][2] = {{"gflops 2", "gflops -2"}, {"threads 2", "threads 2x"}, {"gflops 2", "gflops 3"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *text = cases[i].text;
        size_t n = cases[i].n;
        if (!text && i < 10) { /* the good file with one line changed */
            const char *from = edits[i - 7][0], *to = edits[i - 7][1], *at = strstr(good, from);
            snprintf(edited, sizeof(edited), "%.*s%s%s", (int)(at - good), good, to, at + strlen(from));
            text = edited, n = strlen(edited);
        } else if (!text) {
            snprintf(edited, sizeof(edited), "%sextra 1\n", good);
            text = edited, n = strlen(edited);
        }
        path = use_cache("bad");
        write_text(path, text, n);
        peak_cache_t p;
        char want[512];
        assert_true(peak_cache_get(0, 2, fake_measure, &p) > 100);
        snprintf(want, sizeof(want), "%s%s", path, cases[i].why);
        if (!strstr(p.warning, want) || !strstr(p.warning, ": measuring again"))
            fail_msg("case %zu: warning '%s', expected '%s'", i, p.warning, want);
        assert_int_equal(p.from, PEAK_MEASURED);
        assert_int_equal(p.cached, 1);
        assert_int_equal(g_calls, 1);
        assert_true(peak_cache_get(0, 2, fake_measure, &p) > 100); /* the bad file was replaced */
        assert_int_equal(p.from, PEAK_CACHED);
        assert_int_equal(g_calls, 1);
    }
}

/* A good file of another set-up (another OpenBLAS kernel set, another CPU) is not used: a
 * warning names the file and the difference, and the peak is measured for this one. */
static void test_peak_cache_foreign_file_is_measured_again_with_a_warning(void **state)
{
    const char *fields[] = {"core", "cpu", "blas"};
    for (int i = 0; i < 3; i++) {
        const char *path = use_cache("foreign");
        peak_cache_entry_t e;
        char err[512], want[1024];
        memset(&e, 0, sizeof(e));
        peak_cache_key(&e.key, 2);
        char here[256];
        if (i == 0)
            snprintf(here, sizeof(here), "%s", e.key.core), snprintf(e.key.core, sizeof(e.key.core), "Elsewhere");
        else if (i == 1)
            snprintf(here, sizeof(here), "%s", e.key.cpu), snprintf(e.key.cpu, sizeof(e.key.cpu), "Elsewhere");
        else
            snprintf(here, sizeof(here), "%s", e.key.blas), snprintf(e.key.blas, sizeof(e.key.blas), "Elsewhere");
        e.native = 1, e.pooled = 999, e.gflops = 999, e.measured = 1;
        assert_int_equal(peak_cache_write(path, &e, err, sizeof(err)), 0);
        peak_cache_t p;
        assert_true(peak_cache_get(0, 2, fake_measure, &p) == 100 + 1 + 1.0 / 3);
        snprintf(want, sizeof(want),
                 "%s: a peak measured for another set-up (%s 'Elsewhere', here '%s'): measuring again", path,
                 fields[i], here);
        assert_string_equal(p.warning, want);
        assert_int_equal(p.from, PEAK_MEASURED);
        assert_int_equal(p.cached, 1);
        assert_int_equal(peak_cache_read(path, &e, err, sizeof(err)), 0);
        assert_true(e.gflops == p.gflops); /* this set-up's now */
    }
}

static void test_peak_cache_given_peak_wins_and_touches_nothing(void **state)
{
    const char *path = use_cache("given");
    peak_cache_t p;
    char line[512];
    assert_true(peak_cache_get(1500, 2, fake_measure, &p) == 1500);
    assert_int_equal(p.from, PEAK_GIVEN);
    assert_int_equal(g_calls, 0);
    assert_int_not_equal(access(path, F_OK), 0);
    peak_cache_describe(&p, line, sizeof(line));
    assert_string_equal(line, "given by metrics.peak_tflops = 1.5");
    /* and over a cached one */
    assert_true(peak_cache_get(0, 2, fake_measure, &p) > 100);
    assert_true(peak_cache_get(1500, 2, fake_measure, &p) == 1500);
    assert_int_equal(p.from, PEAK_GIVEN);
    assert_int_equal(g_calls, 1);
}

/* A cache that cannot be written (its folder would be under a file) costs a measurement at
 * every launch and says so; the peak is still measured and used. */
static void test_peak_cache_unwritable_file_still_gives_a_peak(void **state)
{
    char file[256], path[300], line[8192];
    snprintf(file, sizeof(file), "%s/a-file", g_dir);
    write_text(file, "x", 1);
    snprintf(path, sizeof(path), "%s/peak", file);
    setenv("CTITAN_PEAK_CACHE", path, 1);
    g_calls = 0;
    peak_cache_t p;
    assert_true(peak_cache_get(0, 2, fake_measure, &p) > 100);
    assert_int_equal(p.from, PEAK_MEASURED);
    assert_int_equal(p.cached, 0);
    assert_non_null(strstr(p.warning, "not cached: "));
    assert_non_null(strstr(p.warning, path));
    peak_cache_describe(&p, line, sizeof(line));
    assert_non_null(strstr(line, "measured now ("));
    assert_non_null(strstr(line, "), not cached"));
    assert_true(peak_cache_get(0, 2, fake_measure, &p) > 100);
    assert_int_equal(g_calls, 2);
}

/* $CTITAN_PEAK_CACHE names the file; else one file per key under $XDG_CACHE_HOME/ctitan (an
 * absolute one), else under $HOME/.cache/ctitan; with none of them, no cache. */
static void test_peak_cache_path_follows_the_environment(void **state)
{
    peak_cache_key_t k, k3;
    peak_cache_key(&k, 2);
    peak_cache_key(&k3, 3);
    char a[512], b[512], want[1024];
    setenv("CTITAN_PEAK_CACHE", "/x/own", 1);
    setenv("XDG_CACHE_HOME", "/x/xdg", 1);
    setenv("HOME", "/x/home", 1);
    assert_int_equal(peak_cache_path(&k, a, sizeof(a)), 0);
    assert_string_equal(a, "/x/own");
    unsetenv("CTITAN_PEAK_CACHE");
    assert_int_equal(peak_cache_path(&k, a, sizeof(a)), 0);
    assert_int_equal(peak_cache_path(&k3, b, sizeof(b)), 0);
    assert_int_equal(strncmp(a, "/x/xdg/ctitan/peak-", 19), 0);
    assert_int_equal(strlen(a), 19 + 16);
    assert_string_not_equal(a, b);
    setenv("XDG_CACHE_HOME", "relative", 1);
    assert_int_equal(peak_cache_path(&k, b, sizeof(b)), 0);
    snprintf(want, sizeof(want), "/x/home/.cache/ctitan/%s", a + 14);
    assert_string_equal(b, want);
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    assert_int_equal(peak_cache_path(&k, b, sizeof(b)), -ENOENT);
    peak_cache_t p;
    g_calls = 0;
    assert_true(peak_cache_get(0, 2, fake_measure, &p) > 100);
    assert_int_equal(p.from, PEAK_MEASURED);
    assert_int_equal(p.cached, 0);
    assert_string_equal(p.path, "");
    assert_non_null(strstr(p.warning, "none of CTITAN_PEAK_CACHE, XDG_CACHE_HOME and HOME is set"));
}

/* The key is this machine's: /proc/cpuinfo's model name as `grep` finds it, OpenBLAS's kernel
 * set in use. */
static void test_peak_cache_key_is_this_machine(void **state)
{
    peak_cache_key_t k;
    peak_cache_key(&k, 5);
    char out[512];
    if (tu_run("grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: *//' | tr -d '\\n'", out, sizeof(out)) ||
        !out[0])
        snprintf(out, sizeof(out), "unknown");
    assert_string_equal(k.cpu, out);
    assert_string_equal(k.core, openblas_get_corename());
    assert_int_equal(k.threads, 5);
    assert_int_equal(k.n, 2048);
    assert_true(k.runs >= 3);
    assert_non_null(strstr(k.blas, "OpenBLAS"));
}

/* The GPU stand-in: 700000 + calls GFLOP/s; g_gpu_fail makes it fail (0). */
static int g_gpu_fail;
static double fake_gpu(void *arg)
{
    assert_ptr_equal(arg, &g_gpu_fail);
    g_calls++;
    return g_gpu_fail ? 0 : 700000 + g_calls;
}

/* A GPU job's peak is the GPU's, cached per GPU model (issue 25: it was the CPU's sgemm peak,
 * and the progress line read mfu 517%): measured once, then read; another model measures again;
 * the CPU's entry in the same file is not taken for it. */
static void test_peak_cache_gpu_peak_is_the_gpus_cached_per_model(void **state)
{
    use_cache("gpu");
    peak_cache_t p, q;
    char line[8192];
    setenv("CTITAN_GPU_MODEL", "  NVIDIA Test GPU 80GB\n", 1);
    char model[128];
    assert_int_equal(peak_gpu_model(model, sizeof(model)), 0);
    assert_string_equal(model, "NVIDIA Test GPU 80GB");
    g_gpu_fail = 0;
    assert_true(peak_cache_get_gpu(0, fake_gpu, &g_gpu_fail, &p) == 700001);
    assert_int_equal(p.from, PEAK_MEASURED);
    assert_int_equal(p.cached, 1);
    assert_string_equal(p.warning, "");
    peak_cache_describe(&p, line, sizeof(line));
    assert_non_null(strstr(line, "the GPU's bf16 peak measured now (NVIDIA Test GPU 80GB, cuBLASLt 8192^3) and cached at"));
    assert_true(peak_cache_get_gpu(0, fake_gpu, &g_gpu_fail, &q) == 700001);
    assert_int_equal(q.from, PEAK_CACHED);
    assert_int_equal(g_calls, 1);
    peak_cache_describe(&q, line, sizeof(line));
    assert_non_null(strstr(line, "the GPU's bf16 peak from the cache"));
    /* the CPU's peak in the same file is another key: measured for the CPU, not read */
    assert_true(peak_cache_get(0, 2, fake_measure, &q) > 100 && peak_cache_get(0, 2, fake_measure, &q) < 200);
    assert_int_equal(q.from, PEAK_CACHED);
    assert_true(peak_cache_get_gpu(0, fake_gpu, &g_gpu_fail, &q) == 700000 + g_calls);
    assert_int_equal(q.from, PEAK_MEASURED);
    assert_non_null(strstr(q.warning, "another set-up"));
    /* another GPU model is another set-up */
    setenv("CTITAN_GPU_MODEL", "NVIDIA Other GPU", 1);
    int before = g_calls;
    assert_true(peak_cache_get_gpu(0, fake_gpu, &g_gpu_fail, &q) == 700000 + before + 1);
    assert_non_null(strstr(q.warning, "'NVIDIA Test GPU 80GB', here 'NVIDIA Other GPU'"));
    /* metrics.peak_tflops wins and measures nothing */
    before = g_calls;
    assert_true(peak_cache_get_gpu(5e5, fake_gpu, &g_gpu_fail, &q) == 5e5);
    assert_int_equal(q.from, PEAK_GIVEN);
    assert_int_equal(g_calls, before);
    unsetenv("CTITAN_GPU_MODEL");
}

/* No GPU to name, or one whose peak cannot be measured: no peak (0) and no MFU, never the CPU's
 * sgemm peak in its place; the reason is what the banner prints. */
static void test_peak_cache_gpu_without_a_peak_gives_none(void **state)
{
    use_cache("gpu-none");
    peak_cache_t p;
    char line[8192];
    setenv("CTITAN_GPU_MODEL", "NVIDIA Broken GPU", 1);
    g_gpu_fail = 1;
    assert_true(peak_cache_get_gpu(0, fake_gpu, &g_gpu_fail, &p) == 0);
    assert_int_equal(p.from, PEAK_NONE);
    assert_int_equal(p.cached, 0);
    assert_int_equal(access(getenv("CTITAN_PEAK_CACHE"), F_OK), -1); /* a failure is not cached */
    peak_cache_describe(&p, line, sizeof(line));
    assert_string_equal(line, "no GPU peak (the bf16 peak of the NVIDIA Broken GPU could not be measured): MFU is "
                              "not computed; set metrics.peak_tflops");
    g_gpu_fail = 0;
    unsetenv("CTITAN_GPU_MODEL");
    if (access("/proc/driver/nvidia/gpus", F_OK) == 0)
        skip(); /* this machine has a GPU to name */
    g_calls = 0;
    assert_true(peak_cache_get_gpu(0, fake_gpu, &g_gpu_fail, &p) == 0);
    assert_int_equal(p.from, PEAK_NONE);
    assert_int_equal(g_calls, 0);
    assert_non_null(strstr(p.warning, "no NVIDIA GPU in /proc/driver/nvidia/gpus"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peak_cache_measures_once_then_reads_the_file),
        cmocka_unit_test(test_peak_cache_round_trips_every_field),
        cmocka_unit_test(test_peak_cache_bad_file_is_measured_again_with_a_warning),
        cmocka_unit_test(test_peak_cache_foreign_file_is_measured_again_with_a_warning),
        cmocka_unit_test(test_peak_cache_given_peak_wins_and_touches_nothing),
        cmocka_unit_test(test_peak_cache_unwritable_file_still_gives_a_peak),
        cmocka_unit_test(test_peak_cache_path_follows_the_environment),
        cmocka_unit_test(test_peak_cache_key_is_this_machine),
        cmocka_unit_test(test_peak_cache_gpu_peak_is_the_gpus_cached_per_model),
        cmocka_unit_test(test_peak_cache_gpu_without_a_peak_gives_none),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
