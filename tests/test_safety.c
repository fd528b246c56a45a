/* Safe by default (issue 22), with real processes, files and sockets: what a user saved is
 * neither overwritten nor deleted, nothing hangs without a word, and what goes wrong names the
 * manifest key it comes from. One test per finding; each failed before its fix. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "checkpointd/ckpt.h"
#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("safety"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 's', what); }

/* A launch of job j expected to fail before training, whose error names `key`. */
static void assert_job_refused_naming(const char *j, const char *extra, const char *key)
{
    static char out[1 << 16];
    int rc = tj_launch("", 60, j, extra, out, sizeof(out));
    if (rc == 0 || !strstr(out, key))
        TJ_FAIL_WITH(out, "%s: status %d, and the output should name %s", j, rc, key);
    tj_assert_clean(j);
}

/* The same for a new job named after `what`. */
static void assert_refused_naming(const char *what, const char *extra, const char *key)
{
    char j[32];
    job_name(j, sizeof(j), what);
    assert_job_refused_naming(j, extra, key);
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

/* A launch that resumes from a checkpoint keeps the earlier run's steps in the metrics file. */
static void test_safety_a_resume_appends_to_the_metrics(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    static tj_metrics_t mt;
    char j[32];
    job_name(j, sizeof(j), "append");
    launch_ok(j, "--training.steps 4 --checkpoint.enable true --checkpoint.interval 2", out, sizeof(out));
    launch_ok(j, "--training.steps 6 --checkpoint.enable true --checkpoint.interval 2 --checkpoint.load latest", out,
              sizeof(out));
    tj_parse_metrics(j, &mt);
    assert_int_equal(mt.n, 6);
    for (int i = 0; i < mt.n; i++)
        assert_int_equal(mt.step[i], i + 1);
    launch_ok(j, "--training.steps 2", out, sizeof(out)); /* from step 0: a new file */
    tj_parse_metrics(j, &mt);
    assert_int_equal(mt.n, 2);
    tj_assert_clean(j);
}

/* The loader, a program of the user's choice, holds no descriptor of the job's files (metrics,
 * trace, TensorBoard events, checkpoints) nor of its shared memory: it lists its own. */
static void test_safety_no_descriptor_of_the_job_crosses_exec(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16], fds[1 << 14];
    char j[32], ldr[256], extra[1024], path[256];
    job_name(j, sizeof(j), "fds");
    snprintf(path, sizeof(path), "%s/fds-%s", tj_dir, j);
    snprintf(extra, sizeof(extra),
             "--training.steps 4 --checkpoint.enable true --checkpoint.interval 2 --metrics.enable_tensorboard true "
             "--profiling.trace_file %s/%s.json --loader.command \"sh -c 'ls -l /proc/self/fd >%s; exec %s'\"",
             tj_dir, j, path, tu_program("ctitan-loader", ldr, sizeof(ldr)));
    launch_ok(j, extra, out, sizeof(out));
    tu_read_file(path, fds, sizeof(fds));
    int seen = 0;
    for (char *line = strtok(fds, "\n"); line; line = strtok(NULL, "\n")) {
        const char *to = strstr(line, " -> ");
        if (!to)
            continue;
        to += 4;
        seen++;
        if ((!strncmp(to, tj_dir, strlen(tj_dir)) && strcmp(to, path)) || !strncmp(to, "/dev/shm/", 9))
            fail_msg("the loader inherited %s", line);
    }
    assert_true(seen >= 3); /* at least its standard descriptors were listed */
    tj_assert_clean(j);
}

/* Makes DIR/NAME holding two files, model.bin and index; its path in buf. */
static const char *dir_with_files(char *buf, size_t n, const char *dir, const char *name)
{
    char f[512];
    snprintf(buf, n, "%s/%s", dir, name);
    assert_int_equal(mkdir(buf, 0700), 0);
    for (int i = 0; i < 2; i++) {
        snprintf(f, sizeof(f), "%s/%s", buf, i ? "index" : "model.bin");
        FILE *fp = fopen(f, "w");
        assert_non_null(fp);
        fputs("a user's file\n", fp);
        fclose(fp);
    }
    return buf;
}

static void assert_files_kept(const char *dir)
{
    char f[512];
    struct stat st;
    for (int i = 0; i < 2; i++) {
        snprintf(f, sizeof(f), "%s/%s", dir, i ? "index" : "model.bin");
        if (stat(f, &st))
            fail_msg("%s was deleted through a link", f);
    }
}

/* Retention (keep_latest_k = 1) with a step-N link and a writer's temporary name as a link in
 * the checkpoint folder: neither the links nor what they name are touched. */
static void test_safety_retention_never_deletes_through_a_link(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], ck[256], away[256], away2[256], link[512];
    job_name(j, sizeof(j), "links");
    dir_with_files(away, sizeof(away), tj_dir, "elsewhere");
    dir_with_files(away2, sizeof(away2), tj_dir, "elsewhere2");
    snprintf(ck, sizeof(ck), "%s/runs", tj_dir); /* not there yet when this test runs alone */
    assert_true(mkdir(ck, 0700) == 0 || errno == EEXIST);
    snprintf(ck, sizeof(ck), "%s/runs/%s", tj_dir, j);
    assert_int_equal(mkdir(ck, 0700), 0);
    snprintf(ck, sizeof(ck), "%s/runs/%s/checkpoint", tj_dir, j);
    assert_int_equal(mkdir(ck, 0700), 0);
    snprintf(link, sizeof(link), "%s/step-00000001", ck);
    assert_int_equal(symlink(away, link), 0);
    snprintf(link, sizeof(link), "%s/.tmp-step-00000003", ck); /* a leftover whose writer is gone */
    assert_int_equal(symlink(away2, link), 0);
    launch_ok(j, "--training.steps 6 --checkpoint.enable true --checkpoint.interval 2 --checkpoint.keep_latest_k 1",
              out, sizeof(out));
    assert_files_kept(away);
    assert_files_kept(away2);
    struct stat st;
    assert_int_equal(lstat(link, &st), 0); /* the links themselves stay too */
    snprintf(link, sizeof(link), "%s/step-00000004", ck); /* and retention still did its work */
    assert_int_not_equal(stat(link, &st), 0);
    snprintf(link, sizeof(link), "%s/step-00000006", ck);
    assert_int_equal(stat(link, &st), 0);
    tj_assert_clean(j);
}

/* A relaunch of a job whose folder holds checkpoints resumes from the newest; starting over
 * there (checkpoint.load none) or from an older step is refused: no saved step is written over. */
static void test_safety_a_relaunch_resumes_and_never_writes_over_a_saved_step(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16], before[1 << 16], after[1 << 16];
    static tj_metrics_t mt;
    char j[32], idx[256], extra[512];
    job_name(j, sizeof(j), "resume");
    const char *ck = "--checkpoint.enable true --checkpoint.interval 2";
    snprintf(extra, sizeof(extra), "%s --training.steps 4", ck);
    launch_ok(j, extra, out, sizeof(out));
    snprintf(idx, sizeof(idx), "%s/runs/%s/checkpoint/step-00000004/index", tj_dir, j);
    tu_read_file(idx, before, sizeof(before));
    assert_true(before[0] != '\0');

    /* the same job again, another lr and more steps: it resumes after step 4 */
    snprintf(extra, sizeof(extra), "%s --training.steps 6 --optimizer.lr 2e-2", ck);
    launch_ok(j, extra, out, sizeof(out));
    if (!strstr(out, "resuming from") || !strstr(out, "step-00000004 (after step 4)"))
        TJ_FAIL_WITH(out, "a relaunch should resume from the newest checkpoint");
    tj_parse_metrics(j, &mt);
    assert_int_equal(mt.n, 6);
    assert_int_equal(mt.step[4], 5);

    /* starting over, or from step 2, in that folder: refused, naming the way out */
    snprintf(extra, sizeof(extra), "%s --training.steps 6 --checkpoint.load none", ck);
    assert_job_refused_naming(j, extra, "would write over");
    snprintf(extra, sizeof(extra), "%s --training.steps 6 --checkpoint.load %s/runs/%s/checkpoint/step-00000002", ck,
             tj_dir, j);
    assert_job_refused_naming(j, extra, "checkpoint.load = latest");
    tu_read_file(idx, after, sizeof(after));
    assert_string_equal(before, after);
    /* a fresh folder starts over */
    snprintf(extra, sizeof(extra), "%s --training.steps 2 --checkpoint.load none --checkpoint.folder %s/runs/%s/again",
             ck, tj_dir, j);
    launch_ok(j, extra, out, sizeof(out));
    if (!strstr(out, "starting from step 0 (checkpoint.load = none)"))
        TJ_FAIL_WITH(out, "checkpoint.load none in an empty folder starts over, saying so");
}

/* Four launches of one job name at the same moment: exactly one trains, the others are
 * refused naming the job, and none removes the segments of another. */
static void test_safety_one_launch_of_a_name_at_a_time(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], name[64];
    job_name(j, sizeof(j), "twice");
    pid_t pid[4];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof(name), "%s-%d", j, i);
        pid[i] = tj_launch_bg_to(j, name, "--training.steps 300");
    }
    int ran = 0, refused = 0;
    for (int i = 0; i < 4; i++) {
        int st = tu_reap(pid[i], 120, NULL);
        snprintf(name, sizeof(name), "%s-%d", j, i);
        tj_read_out(name, out, sizeof(out));
        if (strstr(out, "stale"))
            TJ_FAIL_WITH(out, "launch %d took another's segments for stale ones", i);
        if (st == 0 && strstr(out, "done: 300 steps"))
            ran++;
        else if (st != 0 && strstr(out, "is already running or being launched"))
            refused++;
        else
            TJ_FAIL_WITH(out, "launch %d: status %d, neither trained nor refused", i, st);
    }
    assert_int_equal(ran, 1);
    assert_int_equal(refused, 3);
    static tj_metrics_t mt;
    tj_parse_metrics(j, &mt);
    assert_int_equal(mt.n, 300);
    tj_assert_clean(j);
}

/* kill -9 of `ctitan launch` mid-run: within a few seconds nothing of the job is left (its
 * processes, segments, operator key, name lock), and the job's name can be launched again. */
static void test_safety_a_killed_launcher_leaves_nothing_behind(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], key[256], lock[128];
    char names[64][SHM_NAME_MAX];
    job_name(j, sizeof(j), "orphan");
    pid_t pid = tj_launch_bg(j, "--training.steps 1000000");
    assert_int_equal(tj_wait_step(j, 3, 60), 0);
    snprintf(key, sizeof(key), "%s/runs/%s/run/operator.key", tj_dir, j);
    snprintf(lock, sizeof(lock), "/dev/shm/ctitan-lock.%s", j);
    assert_int_equal(access(key, F_OK), 0);
    assert_int_equal(access(lock, F_OK), 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(tu_reap(pid, 10, NULL), 128 + SIGKILL);
    int left = 1;
    for (int i = 0; i < 100 && left; i++) { /* 10 s */
        left = tj_job_procs(j) + shm_list(j, names, 64) + !access(key, F_OK) + !access(lock, F_OK);
        if (left)
            nanosleep(&(struct timespec){0, 100000000L}, NULL);
    }
    if (left) {
        tj_read_out(j, out, sizeof(out));
        TJ_FAIL_WITH(out, "10 s after the launcher's kill: %d processes, %d segments, key %s, lock %s", tj_job_procs(j),
                     shm_list(j, names, 64), access(key, F_OK) ? "gone" : "left", access(lock, F_OK) ? "gone" : "left");
    }
    launch_ok(j, "--training.steps 2 --checkpoint.load none", out, sizeof(out));
    tj_assert_clean(j);
}

/* Rewrites the index of checkpoint dir with tensor `name` given shape [a, b] (the checksum
 * made anew, as a forger would). */
static void forge_shape(const char *dir, const char *name, int64_t a, int64_t b)
{
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/index", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    ckpt_index_t ix;
    if (ckpt_index_decode(buf, n, &ix, path, err, sizeof(err)))
        fail_msg("%s", err);
    ckpt_tensor_t *t = (ckpt_tensor_t *)ckpt_index_find(&ix, name);
    assert_non_null(t);
    assert_int_equal(t->numel, (uint64_t)(a * b));
    t->ndim = 2;
    t->shape[0] = a;
    t->shape[1] = b;
    uint8_t *out;
    size_t len;
    assert_int_equal(ckpt_index_encode(&ix, &out, &len), 0);
    ckpt_index_free(&ix);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(out, 1, len, f), len);
    fclose(f);
    free(out);
}

/* A checkpoint whose index gives a tensor another shape of the same size (with a valid
 * checksum) is refused by verify, export and load, each naming the tensor. */
static void test_safety_a_tensor_of_another_shape_is_refused_everywhere(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], dir[256], cmd[1024], extra[512];
    job_name(j, sizeof(j), "shape");
    launch_ok(j, "--training.steps 2 --checkpoint.enable true", out, sizeof(out));
    snprintf(dir, sizeof(dir), "%s/runs/%s/checkpoint/step-00000002", tj_dir, j);
    forge_shape(dir, "model.embed_tokens.weight", 150, 64); /* [300, 32] */
    snprintf(cmd, sizeof(cmd), "%s ckpt verify %s 2>&1", tu_ctitan(), dir);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc == 0 || !strstr(out, "model.embed_tokens.weight is [150, 64]") || !strstr(out, "[300, 32]"))
        TJ_FAIL_WITH(out, "verify: status %d", rc);
    snprintf(cmd, sizeof(cmd), "%s ckpt export %s --safetensors %s/%s.safetensors 2>&1", tu_ctitan(), dir, tj_dir, j);
    rc = tu_run(cmd, out, sizeof(out));
    if (rc == 0 || !strstr(out, "model.embed_tokens.weight is [150, 64]"))
        TJ_FAIL_WITH(out, "export: status %d", rc);
    snprintf(extra, sizeof(extra), "--training.steps 4 --checkpoint.load %s", dir);
    assert_refused_naming("shape2", extra, "model.embed_tokens.weight is [150, 64]");
    /* an optimizer state's tensor, forged alone: the load checks against its own model */
    forge_shape(dir, "model.embed_tokens.weight", 300, 32);
    forge_shape(dir, "optimizer.exp_avg.model.norm.weight", 1, 32); /* [32] */
    assert_refused_naming("shape3", extra, "optimizer.exp_avg.model.norm.weight is [1, 32]");
}

/* A swapped-in loader that never becomes ready: the swap falls back to the previous loader
 * after job.startup_timeout_s, says so to `ctitan loader swap`, and the job trains on. */
static void test_safety_a_swapped_loader_never_ready_falls_back(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    static tj_metrics_t mt;
    char j[32], cmd[1024];
    job_name(j, sizeof(j), "deadswap");
    pid_t pid = tj_launch_bg(j, "--training.steps 3000 --job.startup_timeout_s 2");
    assert_int_equal(tj_wait_step(j, 3, 60), 0);
    snprintf(cmd, sizeof(cmd), "%s loader swap --job %s --cmd 'sleep 1000' 2>&1", tu_ctitan(), j);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc != 1 || !strstr(out, "did not become ready in 2 s") || !strstr(out, "the previous loader continues"))
        TJ_FAIL_WITH(out, "the swap: status %d", rc);
    int ended = tu_reap(pid, 120, NULL);
    tj_read_out(j, out, sizeof(out));
    if (ended)
        TJ_FAIL_WITH(out, "the job: status %d", ended);
    tj_parse_metrics(j, &mt);
    assert_int_equal(mt.n, 3000);
    tj_assert_clean(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safety_a_missing_data_file_is_named_by_its_key),
        cmocka_unit_test(test_safety_a_changed_schedule_is_said),
        cmocka_unit_test(test_safety_a_relative_swap_program_is_the_callers),
        cmocka_unit_test(test_safety_a_resume_appends_to_the_metrics),
        cmocka_unit_test(test_safety_no_descriptor_of_the_job_crosses_exec),
        cmocka_unit_test(test_safety_retention_never_deletes_through_a_link),
        cmocka_unit_test(test_safety_a_relaunch_resumes_and_never_writes_over_a_saved_step),
        cmocka_unit_test(test_safety_one_launch_of_a_name_at_a_time),
        cmocka_unit_test(test_safety_a_killed_launcher_leaves_nothing_behind),
        cmocka_unit_test(test_safety_a_tensor_of_another_shape_is_refused_everywhere),
        cmocka_unit_test(test_safety_a_swapped_loader_never_ready_falls_back),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
