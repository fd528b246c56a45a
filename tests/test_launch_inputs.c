/* Whole jobs (`ctitan launch`, real processes, segments and files) given bad inputs: a run
 * whose numbers stop being finite, a checkpoint folder nobody can write, a model too large
 * for the machine. Each must end in an error message naming what is wrong, or in output that
 * is still valid, never in a crash, a hang or a success that is not one. (test_launch holds
 * the jobs of honest inputs.) */
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

#include "ipc/shm.h"
#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("inputs"); }
static int teardown(void **state) { return tj_teardown(); }

/* A run whose loss and gradient norm become NaN (lr 1e38) keeps writing a metrics file that
 * is JSON: null for each value that is not finite, named with what it was under
 * "not_finite" (Python's json module, told to refuse NaN and Infinity, reads every line). */
static void test_inputs_metrics_stay_json_when_the_numbers_are_not_finite(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], path[256], cmd[1024];
    tj_name(j, sizeof(j), 'i', "nan");
    int rc = tj_launch("", 300, j, "--training.steps 4 --optimizer.lr 1e38 --lr_scheduler.warmup_steps 0", out,
                       sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    snprintf(path, sizeof(path), "%s/%s.jsonl", tj_dir, j);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "\"step\": 4,"));
    assert_null(strstr(out, "nan,"));
    assert_non_null(strstr(out, "\"grad_norm\": null"));
    assert_non_null(strstr(out, "\"not_finite\": {"));
    assert_non_null(strstr(out, "\"grad_norm\": \"nan\""));
    if (tu_run("python3 -c 'print(1)' 2>&1", cmd, sizeof(cmd))) {
        print_message("no python3: the metrics file is not parsed\n");
        return;
    }
    snprintf(cmd, sizeof(cmd),
             "python3 -c 'import json,sys\n"
             "def no(c): raise ValueError(c)\n"
             "for l in open(sys.argv[1]): json.loads(l, parse_constant=no)' %s 2>&1", path);
    rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    tj_assert_clean(j);
}

/* A checkpoint folder that cannot be written (under /proc) is refused before the first step,
 * naming checkpoint.folder, instead of a run whose every checkpoint fails. */
static void test_inputs_unwritable_checkpoint_folder_is_refused_at_launch(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    tj_name(j, sizeof(j), 'i', "ckproc");
    int rc = tj_launch("", 300, j, "--training.steps 4 --checkpoint.enable true --checkpoint.folder /proc/ctitan-no/ck",
                       out, sizeof(out));
    assert_int_not_equal(rc, 0);
    if (!strstr(out, "checkpoint.folder") || !strstr(out, "/proc/ctitan-no/ck") || strstr(out, "step     1"))
        fail_msg("exit status %d:\n%s", rc, out);
    tj_assert_clean(j);
}

/* A folder that stops being writable after the launch (a file put in its place): every
 * checkpoint of the run fails, so the last one does, and the job must not end as a success:
 * status 1, saying which checkpoint is missing and how many were written. */
static void test_inputs_a_run_whose_last_checkpoint_fails_does_not_succeed(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], extra[512], ck[256], path[300];
    tj_name(j, sizeof(j), 'i', "cklost");
    snprintf(ck, sizeof(ck), "%s/ck-%s", tj_dir, j);
    snprintf(extra, sizeof(extra), "--training.steps 3000 --metrics.log_freq 1000 --checkpoint.enable true "
             "--checkpoint.interval 1000 --checkpoint.folder %s --job.max_restarts 0", ck); /* the failure itself */
    pid_t pid = tj_launch_bg(j, extra);
    assert_int_equal(tj_wait_step(j, 2, 60), 0);
    assert_int_equal(tu_rmtree(ck), 0);
    FILE *f = fopen(ck, "w");
    assert_non_null(f);
    fclose(f);
    int rc = tu_reap(pid, 300, NULL);
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, j);
    tu_read_file(path, out, sizeof(out));
    if (rc != 1 || !strstr(out, "step 3000") || !strstr(out, "0 of 3"))
        fail_msg("exit status %d:\n%s", rc, out);
    tj_assert_clean(j);
}

/* A model whose segments cannot fit the machine (4096 layers of dim 2048: 824 GB of parameters
 * alone) is refused before any segment is made, saying how much memory it needs and how much
 * there is (the memory plan, stages/plan/plan.h). The ulimit is a safety net for a build without the check, which would otherwise
 * fill the machine's memory touching the segments (with it, their mmap fails instead); not in
 * an ASan build, which reserves terabytes of address space for itself. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) /* clang's way; gcc (and clang >= 17) define the macro below */
#define ASAN_BUILD 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(ASAN_BUILD)
#define MEMORY_NET ""
#else
#define MEMORY_NET "ulimit -v 16000000;"
#endif
static void test_inputs_a_model_too_large_for_the_memory_is_refused_before_any_segment(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    tj_name(j, sizeof(j), 'i', "huge");
    int rc = tj_launch(MEMORY_NET, 300, j, "--model.n_layers 4096 --model.dim 2048", out, sizeof(out));
    if (rc != 1 || !strstr(out, "needs") || !strstr(out, "GiB of host RAM") || !strstr(out, "available") ||
        strstr(out, "cannot map"))
        fail_msg("exit status %d:\n%s", rc, out);
    tj_assert_clean(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inputs_metrics_stay_json_when_the_numbers_are_not_finite),
        cmocka_unit_test(test_inputs_unwritable_checkpoint_folder_is_refused_at_launch),
        cmocka_unit_test(test_inputs_a_run_whose_last_checkpoint_fails_does_not_succeed),
        cmocka_unit_test(test_inputs_a_model_too_large_for_the_memory_is_refused_before_any_segment),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
