/* Tests of tools/gpu_check.sh, the one command of a GPU lease, rehearsed here without a GPU on
 * the emulated CUDA plugin so that it cannot rot between leases: the whole check in order,
 * failures that do not stop the steps after them, a spent budget, and bad usage. Real runs of
 * the script with real jobs; the report and the logs are read back. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/testutil.h"

static char g_dir[256];

static int setup(void **state)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/ctitan-gpucheck-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    tu_rmtree(g_dir);
    return 0;
}

/* Runs the check into DIR/sub with the environment prefix env; returns its exit status and
 * the report in report (empty when there is none). */
static int check(const char *env, const char *args, const char *sub, char *report, size_t n)
{
    char bin[256], cmd[2048], out[8192], path[512];
    tu_program("ctitan", bin, sizeof(bin)); /* BUILD/bin/ctitan: the check runs this build */
    *strrchr(bin, '/') = 0;
    snprintf(cmd, sizeof(cmd), "%s CTITAN_BUILD=%s/.. bash tools/gpu_check.sh %s %s/%s 2>&1", env, bin, args, g_dir,
             sub);
    int rc = tu_run(cmd, out, sizeof(out));
    snprintf(path, sizeof(path), "%s/%s/report.md", g_dir, sub);
    report[0] = 0;
    if (access(path, R_OK) == 0)
        tu_read_file(path, report, n);
    return rc;
}

/* The table row of step `name` (from "| name |" to the end of its line), or NULL. */
static const char *row_of(const char *report, const char *name, char *buf, size_t n)
{
    char key[128];
    snprintf(key, sizeof(key), "| %s |", name);
    const char *p = strstr(report, key);
    if (!p)
        return NULL;
    size_t k = strcspn(p, "\n");
    snprintf(buf, n, "%.*s", (int)(k < n - 1 ? k : n - 1), p);
    return buf;
}

#define ASSERT_ROW(report, name, want)                                                              \
    do {                                                                                            \
        char row_[512];                                                                             \
        if (!row_of(report, name, row_, sizeof(row_)))                                              \
            fail_msg("no row for step '%s' in the report", name);                                   \
        if (!strstr(row_, want))                                                                    \
            fail_msg("step '%s': expected '%s' in: %s", name, want, row_);                          \
    } while (0)

static void need_sim(char *env, size_t n)
{
    char so[256];
    tu_lib("libctitan_cuda_sim.so", so, sizeof(so));
    if (access(so, R_OK) || access(tu_ctitan(), X_OK)) {
        print_message("%s or ctitan not built: skipping\n", so);
        skip();
    }
    snprintf(env, n, "CTITAN_CUDA_PLUGIN=%s", so);
}

static void test_gpu_check_rehearsal_runs_every_step_in_order(void **state)
{
    static char report[1 << 16];
    char env[300], path[400];
    need_sim(env, sizeof(env));
    char args[600];
    snprintf(args, sizeof(args), "--rehearse --budget 300 --export %s/export", g_dir);
    assert_int_equal(check(env, args, "ok", report, sizeof(report)), 0);
    ASSERT_ROW(report, "device facts", "skipped: no GPU");
    ASSERT_ROW(report, "test_model", "| ok |");
    ASSERT_ROW(report, "test_backend", "| ok |");
    ASSERT_ROW(report, "data (ctitan prep)", "| ok |");
    ASSERT_ROW(report, "model pp 1, GPU shards", "3 of 3 steps");
    ASSERT_ROW(report, "model pp 2, GPU shards", "| ok |");
    ASSERT_ROW(report, "clip factor on the device", "bitwise the host's sum");
    ASSERT_ROW(report, "model pp 2, offload", "| ok |");
    ASSERT_ROW(report, "offload = GPU shards, bitwise", "the same bits");
    ASSERT_ROW(report, "model pp 1, NCCL plane (one rank)", "| ok |");
    ASSERT_ROW(report, "validation on the GPU", "| ok |");
    ASSERT_ROW(report, "sample on the GPU", "| ok |");
    ASSERT_ROW(report, "checkpoint and resume", "bitwise the uninterrupted run");
    ASSERT_ROW(report, "recovery (stage, shard killed)", "3 recoveries (");
    ASSERT_ROW(report, "recovery (stage, shard killed)", "every loss bitwise the undisturbed run's");
    ASSERT_ROW(report, "bench-gpu (ctitan vs PyTorch)", "skipped: no GPU");
    ASSERT_ROW(report, "issue 24: 8B plan, 8B and 3B runs on a GPU", "skipped: no GPU");
    ASSERT_ROW(report, "activation checkpointing (~160M, 4x1024)", "skipped: no GPU");
    ASSERT_ROW(report, "plan: ~1B Llama on the CPU, planned against measured", "skipped: no GPU");
    char gpu_tests[256];
    tu_built("tests", "gpu", gpu_tests, sizeof(gpu_tests));
    if (access(gpu_tests, F_OK) == 0) /* built where nvcc is */
        ASSERT_ROW(report, "test_cuda_attn", "skipped: no GPU");
    /* the order of the steps, and the per-step losses against the CPU */
    assert_true(strstr(report, "| device facts |") < strstr(report, "| test_model |"));
    assert_true(strstr(report, "| test_model |") < strstr(report, "| model pp 1, GPU shards |"));
    assert_true(strstr(report, "| checkpoint and resume |") < strstr(report, "| recovery (stage, shard killed) |"));
    assert_true(strstr(report, "| recovery (stage, shard killed) |") < strstr(report, "| bench-gpu"));
    assert_non_null(strstr(report, "| step | GPU | CPU | relative difference |"));
    snprintf(path, sizeof(path), "%s/ok/logs/gpu2.log", g_dir);
    assert_int_equal(access(path, R_OK), 0);
    /* --export: the same report and one archive of the logs and metrics, and nothing else (the
     * device tool brings back 8 files) */
    static char exported[1 << 16];
    snprintf(path, sizeof(path), "%s/export/report.md", g_dir);
    tu_read_file(path, exported, sizeof(exported));
    assert_true(exported[0] != 0);
    assert_string_equal(exported, report);
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof(cmd), "ls -A %s/export && tar tzf %s/export/raw.tgz", g_dir, g_dir);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    assert_true(strncmp(out, "raw.tgz\nreport.md\n./", 20) == 0);
    assert_non_null(strstr(out, "./logs/gpu2.log\n"));
    assert_non_null(strstr(out, "./gpu1.jsonl\n"));
    assert_null(strstr(out, "./data/"));
}

/* A step that fails says why and the steps after it still run; the status says one failed. */
static void test_gpu_check_failures_do_not_stop_the_check(void **state)
{
    static char report[1 << 16];
    char env[300];
    need_sim(env, sizeof(env));
    snprintf(env, sizeof(env), "CTITAN_CUDA_PLUGIN=%s/no-such-plugin.so", g_dir);
    assert_int_equal(check(env, "--rehearse --budget 300", "bad", report, sizeof(report)), 1);
    ASSERT_ROW(report, "test_model", "| ok |");
    ASSERT_ROW(report, "model pp 1, GPU shards", "FAILED");
    ASSERT_ROW(report, "model pp 1, GPU shards", "no-such-plugin.so");
    ASSERT_ROW(report, "model pp 2, offload", "FAILED");
    ASSERT_ROW(report, "checkpoint and resume", "FAILED");
    ASSERT_ROW(report, "recovery (stage, shard killed)", "skipped: no undisturbed pp 2 run");
    ASSERT_ROW(report, "bench-gpu (ctitan vs PyTorch)", "skipped: no GPU");
}

/* A spent budget: nothing runs, every step says so, and the report is still written. */
static void test_gpu_check_spent_budget_is_reported_per_step(void **state)
{
    static char report[1 << 16];
    char env[300];
    need_sim(env, sizeof(env));
    assert_int_equal(check(env, "--rehearse --budget 3", "late", report, sizeof(report)), 0);
    ASSERT_ROW(report, "test_model", "skipped: out of budget");
    ASSERT_ROW(report, "model pp 1, GPU shards", "skipped: out of budget");
    ASSERT_ROW(report, "validation on the GPU", "skipped: out of budget");
    ASSERT_ROW(report, "sample on the GPU", "skipped: out of budget");
    ASSERT_ROW(report, "checkpoint and resume", "skipped: out of budget");
    assert_null(strstr(report, "| ok |"));
}

/* --only picks steps: "waits" is the breakdown's ~1B row alone (a lease's first call takes it
 * with bench-gpu), "breakdown" every row of it. */
static void test_gpu_check_only_waits_is_the_1b_breakdown_alone(void **state)
{
    static char report[1 << 16];
    char env[300], buf[512];
    need_sim(env, sizeof(env));
    const char *b1 = "breakdown: ~1B Llama, pp 1, 4x2048", *demo = "breakdown: demo, pp 1, 8x256";
    assert_int_equal(check(env, "--rehearse --budget 60 --only waits", "waits", report, sizeof(report)), 0);
    ASSERT_ROW(report, b1, "skipped: no GPU");
    assert_null(row_of(report, demo, buf, sizeof(buf)));
    assert_null(row_of(report, "test_model", buf, sizeof(buf)));
    assert_int_equal(check(env, "--rehearse --budget 60 --only breakdown", "bd", report, sizeof(report)), 0);
    ASSERT_ROW(report, b1, "skipped: no GPU");
    ASSERT_ROW(report, demo, "skipped: no GPU");
}

static void test_gpu_check_rejects_bad_usage(void **state)
{
    char out[1024];
    assert_int_equal(tu_run("bash tools/gpu_check.sh --budget ten /tmp/x 2>&1", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "--budget takes whole seconds, got 'ten'"));
    assert_int_equal(tu_run("bash tools/gpu_check.sh 2>&1", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "usage:"));
    assert_int_equal(tu_run("bash tools/gpu_check.sh --fast /tmp/x 2>&1", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "unknown option --fast"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_check_rehearsal_runs_every_step_in_order),
        cmocka_unit_test(test_gpu_check_failures_do_not_stop_the_check),
        cmocka_unit_test(test_gpu_check_spent_budget_is_reported_per_step),
        cmocka_unit_test(test_gpu_check_only_waits_is_the_1b_breakdown_alone),
        cmocka_unit_test(test_gpu_check_rejects_bad_usage),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
