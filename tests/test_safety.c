/* Safe by default (issue 22), with real processes, files and sockets: what a user saved is
 * neither overwritten nor deleted, nothing hangs without a word, and what goes wrong names the
 * manifest key it comes from. One test per finding; each failed before its fix. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("safety"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 's', what); }

/* A launch expected to fail before training, whose error names `key`. */
static void assert_refused_naming(const char *what, const char *extra, const char *key)
{
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), what);
    int rc = tj_launch("", 60, j, extra, out, sizeof(out));
    if (rc == 0 || !strstr(out, key))
        TJ_FAIL_WITH(out, "%s: status %d, and the output should name %s", what, rc, key);
    tj_assert_clean(j);
}

/* A missing validation file, tokenizer or training file: the error names its manifest key. */
static void test_safety_a_missing_data_file_is_named_by_its_key(void **state)
{
    TU_NEED_BIN();
    assert_refused_naming("val", "--validation.enable true --validation.dataset_path /nonexistent/val.bin",
                          "validation.dataset_path");
    assert_refused_naming("tok", "--sample.tokens 4 --model.tokenizer_path /nonexistent/tokenizer.bin",
                          "model.tokenizer_path");
}

/* A launch expected to train to its end: its output in out. */
static void launch_ok(const char *j, const char *extra, char *out, size_t n)
{
    int rc = tj_launch("", 120, j, extra, out, n);
    if (rc)
        TJ_FAIL_WITH(out, "%s: status %d", j, rc);
}

/* A warmup longer than the run, and a resume whose training.steps (hence schedule) changed,
 * are said, not done silently. */
static void test_safety_a_changed_schedule_is_said(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "warm");
    launch_ok(j, "--training.steps 4 --lr_scheduler.warmup_steps 10", out, sizeof(out));
    if (!strstr(out, "lr_scheduler.warmup_steps = 10 is more than training.steps = 4"))
        TJ_FAIL_WITH(out, "the banner should say the warmup was cut to the run");
    launch_ok(j, "--training.steps 4", out, sizeof(out));
    if (strstr(out, "warmup_steps"))
        TJ_FAIL_WITH(out, "a warmup shorter than the run needs no note");

    job_name(j, sizeof(j), "sched");
    launch_ok(j, "--training.steps 4 --checkpoint.enable true --checkpoint.interval 2", out, sizeof(out));
    launch_ok(j, "--training.steps 6 --checkpoint.enable true --checkpoint.interval 2 --checkpoint.load latest", out,
              sizeof(out));
    if (!strstr(out, "training.steps differs from the run that wrote"))
        TJ_FAIL_WITH(out, "a resume with more steps should say the schedule changed");
    launch_ok(j, "--training.steps 6 --checkpoint.enable true --checkpoint.interval 2 --checkpoint.load latest", out,
              sizeof(out));
    if (strstr(out, "differs from the run that wrote"))
        TJ_FAIL_WITH(out, "a resume of the same schedule needs no note");
    tj_assert_clean(j);
}

/* `ctitan loader swap --cmd ./ctitan-loader` from the programs' folder, not the job's: the
 * program is the caller's, and the swap lands. */
static void test_safety_a_relative_swap_program_is_the_callers(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], bin[256], cmd[1024];
    job_name(j, sizeof(j), "relswap");
    tu_program("ctitan-loader", bin, sizeof(bin));
    *strrchr(bin, '/') = '\0';
    pid_t pid = tj_launch_bg(j, "--training.steps 3000");
    assert_int_equal(tj_wait_step(j, 3, 60), 0);
    snprintf(cmd, sizeof(cmd), "cd %s && %s loader swap --job %s --cmd './ctitan-loader' 2>&1", bin, tu_ctitan(), j);
    int rc = tu_run(cmd, out, sizeof(out));
    int ended = tu_reap(pid, 120, NULL);
    if (rc || !strstr(out, "after step"))
        TJ_FAIL_WITH(out, "the swap from %s: status %d", bin, rc);
    assert_int_equal(ended, 0);
    tj_assert_clean(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safety_a_missing_data_file_is_named_by_its_key),
        cmocka_unit_test(test_safety_a_changed_schedule_is_said),
        cmocka_unit_test(test_safety_a_relative_swap_program_is_the_callers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
