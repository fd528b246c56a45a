/* Tests of the CUPTI injection library's bookkeeping (tools/gpuprof/inject.c, what
 * tools/gpu_breakdown.sh sums): records are fed to it as CUPTI's buffers would deliver them
 * (out of time order) and the table it writes at exit is read back. CUPTI itself needs a GPU;
 * this needs only its headers and library to link, so it runs in make test where the CUDA
 * toolkit is installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/gpuprof/inject.c"

static char g_dir[] = "/tmp/ctitan-gpuprof-XXXXXX";

/* A fresh folder under g_dir, which main removes whole however the tests end. */
static char *subdir(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s-XXXXXX", g_dir, name);
    return mkdtemp(buf);
}

/* The table written for this process: header numbers and the row of kind/name. */
typedef struct { unsigned long long window, busy, skipped, count, ns; } table_t;

static void reset(void)
{
    for (size_t i = 0; i < n_names; i++)
        free(names[i].name);
    memset(names, 0, sizeof(names));
    n_names = 0;
    n_recs = 0;
}

static table_t written(const char *kind, const char *name)
{
    char path[256], line[512];
    snprintf(path, sizeof(path), "%s/gpuprof-%ld.tsv", g_dir, (long)getpid());
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    table_t t = {0};
    assert_non_null(fgets(line, sizeof(line), f));
    assert_int_equal(sscanf(line, "# window_ns %llu busy_ns %llu skipped %llu", &t.window, &t.busy, &t.skipped), 3);
    char want[256];
    snprintf(want, sizeof(want), "%s\t%s\t", kind, name);
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, want, strlen(want)))
            assert_int_equal(sscanf(line + strlen(want), "%llu\t%llu", &t.count, &t.ns), 2);
    fclose(f);
    unlink(path);
    return t;
}

#define MS 1000000ull

/* The window is the last LAST_MS before the last record's end; what starts earlier is only
 * counted as skipped; overlapping records count once in busy. */
static void test_window_is_the_last_ms_and_busy_is_the_union(void **state)
{
    (void)state;
    reset();
    setenv("CTITAN_GPUPROF_LAST_MS", "10", 1);
    note("memcpy", "DtoH", 106 * MS, 110 * MS); /* delivered before the earlier records */
    note("kernel", "set-up", 0, 5 * MS);       /* before the window */
    note("kernel", "attn", 100 * MS, 103 * MS);
    note("kernel", "gemm", 102 * MS, 104 * MS); /* overlaps attn: busy 100..104 */
    note("kernel", "attn", 104 * MS, 105 * MS);
    write_locked();
    table_t t = written("kernel", "attn");
    assert_int_equal(t.window, 10 * MS);
    assert_int_equal(t.busy, (5 + 4) * MS);
    assert_int_equal(t.skipped, 1);
    assert_int_equal(t.count, 2);
    assert_int_equal(t.ns, 4 * MS);
    reset();
    note("kernel", "set-up", 0, 5 * MS);
    note("kernel", "gemm", 102 * MS, 104 * MS);
    write_locked();
    t = written("kernel", "set-up");
    assert_int_equal(t.count, 0); /* a name with nothing in the window has no row */
}

/* Without CTITAN_GPUPROF_LAST_MS (or one longer than the run) the window is the whole run. */
static void test_no_last_ms_keeps_everything(void **state)
{
    (void)state;
    reset();
    unsetenv("CTITAN_GPUPROF_LAST_MS");
    note("kernel", "a", 10 * MS, 12 * MS);
    note("kernel", "a", 20 * MS, 21 * MS);
    write_locked();
    table_t t = written("kernel", "a");
    assert_int_equal(t.window, 11 * MS);
    assert_int_equal(t.busy, 3 * MS);
    assert_int_equal(t.skipped, 0);
    assert_int_equal(t.count, 2);
    assert_int_equal(t.ns, 3 * MS);
    reset();
    setenv("CTITAN_GPUPROF_LAST_MS", "1000", 1);
    note("kernel", "a", 10 * MS, 12 * MS);
    write_locked();
    t = written("kernel", "a");
    assert_int_equal(t.window, 2 * MS);
    assert_int_equal(t.skipped, 0);
}

/* A copy's name is its direction; a record whose end precedes its start counts zero time. */
static void test_copies_by_direction_and_bad_spans(void **state)
{
    (void)state;
    reset();
    unsetenv("CTITAN_GPUPROF_LAST_MS");
    assert_string_equal(copy_kind(CUPTI_ACTIVITY_MEMCPY_KIND_DTOH), "DtoH");
    assert_string_equal(copy_kind(CUPTI_ACTIVITY_MEMCPY_KIND_PTOP), "PtoP");
    assert_string_equal(copy_kind(CUPTI_ACTIVITY_MEMCPY_KIND_ATOA), "other");
    note("kernel", "k", 5 * MS, 4 * MS);
    note("kernel", "k", 6 * MS, 7 * MS);
    write_locked();
    table_t t = written("kernel", "k");
    assert_int_equal(t.count, 2);
    assert_int_equal(t.ns, 1 * MS);
    assert_int_equal(t.busy, 1 * MS);
}

/* With CTITAN_GPUPROF_TRACE=1 every record goes to gpuprof-<pid>.trace, the window's and the
 * earlier ones, in start order; without it there is no trace. */
static void test_trace_is_every_record_in_start_order(void **state)
{
    (void)state;
    char path[256], line[512];
    snprintf(path, sizeof(path), "%s/gpuprof-%ld.trace", g_dir, (long)getpid());
    for (int traced = 0; traced < 2; traced++) {
        reset();
        setenv("CTITAN_GPUPROF_LAST_MS", "10", 1);
        setenv("CTITAN_GPUPROF_TRACE", traced ? "1" : "0", 1);
        note("kernel", "gemm", 102 * MS, 104 * MS);
        note("memcpy", "DtoH", 106 * MS, 110 * MS);
        note("kernel", "set-up", 0, 5 * MS); /* before the window: traced all the same */
        write_locked();
        (void)written("kernel", "gemm");
        FILE *f = fopen(path, "r");
        if (!traced) {
            assert_null(f);
            continue;
        }
        assert_non_null(f);
        const char *want[] = {"# base 0\n", "0\t5000000\tkernel\tset-up\n", "102000000\t104000000\tkernel\tgemm\n",
                              "106000000\t110000000\tmemcpy\tDtoH\n"};
        for (int i = 0; i < 4; i++) {
            assert_non_null(fgets(line, sizeof(line), f));
            assert_string_equal(line, want[i]);
        }
        assert_null(fgets(line, sizeof(line), f));
        fclose(f);
        unlink(path);
    }
    /* the base: the first record's start, down to a multiple of 2^32 ns; times from it */
    reset();
    unsetenv("CTITAN_GPUPROF_LAST_MS");
    setenv("CTITAN_GPUPROF_TRACE", "1", 1);
    note("kernel", "k", (3ull << 32) + 7, (3ull << 32) + 9);
    write_locked();
    (void)written("kernel", "k");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    assert_string_equal(line, "# base 12884901888\n");
    assert_non_null(fgets(line, sizeof(line), f));
    assert_string_equal(line, "7\t9\tkernel\tk\n");
    fclose(f);
    unlink(path);
    unsetenv("CTITAN_GPUPROF_TRACE");
}

/* tools/gpu_breakdown.sh's tables (tools/gpuprof/breakdown.awk over the per-process tables):
 * per step over the widest window, shares of it, each process's busy and top operations. */
static void test_breakdown_tables(void **state)
{
    (void)state;
    char dir[64], path[256], cmd[512], out[8192] = "";
    assert_non_null(subdir(dir, sizeof(dir), "bd"));
    snprintf(path, sizeof(path), "%s/gpuprof-11.tsv", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "# window_ns 20000000 busy_ns 15000000 skipped 3\nkernel\t_Z15attn_fwd_kernelILi16E\t4\t8000000\n"
               "memcpy\tDtoH\t2\t2000000\n");
    fclose(f);
    snprintf(path, sizeof(path), "%s/gpuprof-12.tsv", dir);
    f = fopen(path, "w");
    fprintf(f, "# window_ns 10000000 busy_ns 5000000 skipped 0\nkernel\t_Z12adamw_kernelPfS_\t2\t5000000\n");
    fclose(f);
    snprintf(cmd, sizeof(cmd),
             "awk -F'\\t' -v step=10 -f tools/gpuprof/ops.awk -f tools/gpuprof/breakdown.awk %s/gpuprof-*.tsv 2>&1", dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    const char *want[] = {"| attention forward | 4.000 | 2.0 | 40.0% |", "| AdamW | 2.500 | 1.0 | 25.0% |",
                          "| copy DtoH | 1.000 | 1.0 | 10.0% |", "| (all GPU work) | 7.500 | | 75.0% |",
                          "| pid 11 | 0.02 | 75.0% | 25.0% | attention forward 4.000, copy DtoH 1.000 |",
                          "| pid 12 | 0.01 | 50.0% | 50.0% | AdamW 2.500 |",
                          "| `kernel _Z15attn_fwd_kernelILi16E` | 4.000 | 2.0 |"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (!strstr(out, want[i]))
            fail_msg("no \"%s\" in:\n%s", want[i], out);
    assert_true(strstr(out, "| attention forward |") < strstr(out, "| AdamW |")); /* costliest first */
    snprintf(cmd, sizeof(cmd), "rm -r %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Synthetic traces as inject.c writes them: times from the file's "# base", a multiple of 2^32
 * ns. The test's clock: epoch-sized (past 2^53, as CUPTI's may be), its events T_MS ms after
 * ORIGIN; a file of base k has base ORIGIN + k * 2^32 ns (~4.3 s later). */
#define ORIGIN (1764000000000000000ull & ~0xffffffffull)
#define T_NS 5000000000ull

static FILE *trace_open(const char *dir, int pid, int k)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/gpuprof-%d.trace", dir, pid);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "# base %llu\n", ORIGIN + ((unsigned long long)k << 32));
    return f;
}

/* One record over [a, b) ms of the test's clock, in a file of base k. */
static void trace_line(FILE *f, int k, double a, double b, const char *kind, const char *name)
{
    unsigned long long base = (unsigned long long)k << 32;
    fprintf(f, "%llu\t%llu\t%s\t%s\n", T_NS + (unsigned long long)(a * MS) - base,
            T_NS + (unsigned long long)(b * MS) - base, kind, name);
}

/* The row tools/gpuprof/waits.sh prints for this pid's stage. */
static void waits_row(const char *out, const char *pid, char *row, size_t size)
{
    char head[32];
    snprintf(head, sizeof(head), "| pid %s |", pid);
    const char *p = strstr(out, head);
    if (!p)
        fail_msg("no row for pid %s in:\n%s", pid, out);
    size_t n = strcspn(p, "\n");
    snprintf(row, size, "%.*s", (int)(n < size ? n : size - 1), p);
}

/* tools/gpuprof/waits.sh: each stage process (one that ran an attention forward) gets the time
 * it had nothing on the device, in the window that ends with the stages' last record, split by
 * what the others ran meanwhile: kernels before copies, "nothing" when no process ran
 * anything; records outside the window do not count. Two stages (pp 2): each sees the other's
 * work as another process's. */
static void test_waits_splits_a_stage_idle_time(void **state)
{
    (void)state;
    char dir[64], cmd[512], out[8192] = "", row[1024];
    assert_non_null(subdir(dir, sizeof(dir), "waits"));
    FILE *f = trace_open(dir, 100, 0); /* a stage */
    trace_line(f, 0, 5, 10, "kernel", "_Z15attn_fwd_kernelILi128EEvP13__nv_bfloat16");
    trace_line(f, 0, 15, 25, "kernel", "nvjet_sm90_tst_256x128");
    fclose(f);
    f = trace_open(dir, 300, 0); /* another stage */
    trace_line(f, 0, 0, 3, "kernel", "_Z12adamw_kernel"); /* before the window */
    trace_line(f, 0, 10, 11, "kernel", "_Z15attn_fwd_kernelILi16E");
    fclose(f);
    f = trace_open(dir, 200, 1); /* an optimizer shard, started later: another base */
    trace_line(f, 1, 9, 14, "memcpy", "DtoH");
    trace_line(f, 1, 11, 12, "kernel", "_Z12adamw_kernelPfS_");
    trace_line(f, 1, 30, 31, "kernel", "_Z12adamw_kernelPfS_"); /* after the stages' last record */
    fclose(f);
    snprintf(cmd, sizeof(cmd), "bash tools/gpuprof/waits.sh %s 20 10 2>&1", dir); /* 2 steps of 10 ms */
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    /* stage 100 idle over [10, 15): the other stage's attention 1 ms, AdamW 1, the copy 2 (a
     * kernel runs beside it before), nothing 1 */
    waits_row(out, "100", row, sizeof(row));
    assert_non_null(strstr(row, "| pid 100 | 2.500 | 0.500 |"));
    assert_non_null(strstr(row, "copy DtoH [200] 1.000"));
    assert_non_null(strstr(row, "attention forward [300] 0.500"));
    assert_non_null(strstr(row, "AdamW [200] 0.500"));
    /* stage 300 busy only over [10, 11) of [5, 25) */
    waits_row(out, "300", row, sizeof(row));
    assert_non_null(strstr(row, "| pid 300 | 9.500 | 0.500 | matrix products (cuBLASLt) [100] 5.000, attention forward [100] 2.500, copy DtoH [200] 1.000, AdamW [200] 0.500 |"));
    assert_null(strstr(out, "pid 200"));
    snprintf(cmd, sizeof(cmd), "rm %s/gpuprof-*.trace", dir);
    assert_int_equal(system(cmd), 0);
    /* no trace: said, and a failure */
    snprintf(cmd, sizeof(cmd), "bash tools/gpuprof/waits.sh %s 20 10 2>&1", dir);
    assert_non_null(p = popen(cmd, "r"));
    n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    assert_int_not_equal(pclose(p), 0);
    assert_non_null(strstr(out, "no gpuprof-*.trace in"));
    assert_int_equal(rmdir(dir), 0);
}

/* The whole of a small file into buf (NUL-terminated). */
static void slurp(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* tools/gpuprof/window.sh: one window for every process, the last LAST_MS before the stages'
 * last record (not each process's own: the shard's last record comes long after), and each
 * trace's table over it in inject.c's format: records clipped to it, one that ends before it
 * counted as skipped, one that starts after it not at all. */
static void test_window_is_one_for_every_process(void **state)
{
    (void)state;
    char dir[64], path[256], cmd[512], out[4096] = "", got[1024];
    assert_non_null(subdir(dir, sizeof(dir), "window"));
    FILE *f = trace_open(dir, 100, 0); /* the stage */
    trace_line(f, 0, 2, 4, "kernel", "_Z12embed_fwd_kernel"); /* ends before the window */
    trace_line(f, 0, 5, 10, "kernel", "_Z15attn_fwd_kernelILi128E");
    trace_line(f, 0, 15, 25, "kernel", "nvjet_sm90");
    fclose(f);
    f = trace_open(dir, 200, 1); /* a shard, another base */
    trace_line(f, 1, 3, 7, "kernel", "_Z12adamw_kernel"); /* straddles the window's start */
    trace_line(f, 1, 9, 14, "memcpy", "DtoH");
    trace_line(f, 1, 12, 13, "kernel", "_Z12adamw_kernel");
    trace_line(f, 1, 40, 60, "memcpy", "DtoH"); /* the end's copy of the weights: after the window */
    fclose(f);
    snprintf(cmd, sizeof(cmd), "bash tools/gpuprof/window.sh %s 20 %s/common 2>&1", dir, dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    char want[512];
    snprintf(want, sizeof(want), "%llu %llu %llu %s/gpuprof-100.trace\n", ORIGIN, T_NS + 5 * MS, T_NS + 25 * MS, dir);
    assert_string_equal(out, want);
    snprintf(path, sizeof(path), "%s/common/gpuprof-200.tsv", dir);
    slurp(path, got, sizeof(got));
    assert_string_equal(got, "# window_ns 20000000 busy_ns 7000000 skipped 0\n"
                             "kernel\t_Z12adamw_kernel\t2\t3000000\nmemcpy\tDtoH\t1\t5000000\n");
    snprintf(path, sizeof(path), "%s/common/gpuprof-100.tsv", dir);
    slurp(path, got, sizeof(got));
    assert_string_equal(got, "# window_ns 20000000 busy_ns 15000000 skipped 1\n"
                             "kernel\t_Z15attn_fwd_kernelILi128E\t1\t5000000\nkernel\tnvjet_sm90\t1\t10000000\n");
    snprintf(cmd, sizeof(cmd), "rm -r %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    if (!mkdtemp(g_dir))
        return 1;
    setenv("CTITAN_GPUPROF_DIR", g_dir, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_is_the_last_ms_and_busy_is_the_union),
        cmocka_unit_test(test_no_last_ms_keeps_everything),
        cmocka_unit_test(test_copies_by_direction_and_bad_spans),
        cmocka_unit_test(test_trace_is_every_record_in_start_order),
        cmocka_unit_test(test_breakdown_tables),
        cmocka_unit_test(test_waits_splits_a_stage_idle_time),
        cmocka_unit_test(test_window_is_one_for_every_process),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir); /* what a failed assertion left too */
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return rc;
}
