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

int main(void)
{
    if (!mkdtemp(g_dir))
        return 1;
    setenv("CTITAN_GPUPROF_DIR", g_dir, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_is_the_last_ms_and_busy_is_the_union),
        cmocka_unit_test(test_no_last_ms_keeps_everything),
        cmocka_unit_test(test_copies_by_direction_and_bad_spans),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_dir);
    return rc;
}
