/* `ctitan launch` with checkpoints, end to end (real processes, files and sockets; the job
 * helpers are tests/testjob.h's): a resume in any topology is bitwise (and the run's sample is
 * `ctitan generate`'s on its last checkpoint), `latest` passes over a
 * damaged checkpoint, retention, a checkpoint due while one is written, checkpointd killed
 * mid-write, checkpoints streamed to a remote checkpointd and resumed from it, bad checkpoint
 * settings named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"

#include "tests/testjob.h"

/* Every job here runs 12 steps unless its arguments say otherwise. */
static int setup(void **state) { tj_base = "--training.steps 12"; return tj_setup("lckpt"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 't', what); }

static void test_launch_resume_is_bitwise_in_any_topology(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], c[32], d[32], dir[256], extra[512];
    job_name(a, sizeof(a), "ck");
    snprintf(extra, sizeof(extra), "--checkpoint.enable true --checkpoint.interval 4 --model.tokenizer_path "
             "%s/data/tokenizer.bin --sample.tokens 12 --sample.temperature 1.5 --training.seed 7", tj_dir);
    tj_run_ok(a, extra, out, sizeof(out));
    assert_non_null(strstr(out, "checkpoint: step 4 saved to"));
    tj_assert_clean(a);
    tj_ckpt_dir(dir, sizeof(dir), a);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 3); /* 4, 8 and the last step */
    assert_int_equal(steps[0], 4);
    assert_int_equal(steps[2], 12);
    free(steps);
    /* the prompt: the first 8 training tokens (no validation set here) */
    tj_assert_sample_is_generates(out, dir, 12, "train.bin", "", "--temperature 1.5 --seed 7");
    /* pipeline 2 -> 1 and 2 -> 3 optimizer shards, from step 4: bitwise */
    job_name(b, sizeof(b), "ckb");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000004 --parallelism.pipeline_parallel_degree 1 "
             "--optshard.shards 3", dir);
    tj_run_ok(b, extra, out, sizeof(out));
    assert_non_null(strstr(out, "resuming from"));
    tj_assert_resumed_losses(a, b, 4, 12);
    tj_assert_clean(b);
    /* pipeline 3 and one shard from step 8: bitwise */
    job_name(c, sizeof(c), "ckc");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000008 --parallelism.pipeline_parallel_degree 3 "
             "--optshard.shards 1", dir);
    assert_int_equal(tj_run(c, extra, out, sizeof(out)), 0);
    tj_assert_resumed_losses(a, c, 8, 12);
    /* data parallel 2 with the same global batch from step 4: as close as dp 2 is to dp 1 */
    job_name(d, sizeof(d), "ckd");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000004 --parallelism.data_parallel_replicate_degree 2 "
             "--training.local_batch_size 2 --parallelism.pipeline_parallel_microbatches 1", dir);
    tj_run_ok(d, extra, out, sizeof(out));
    static char la[TJ_MAX_STEPS][40], ld[TJ_MAX_STEPS][40];
    assert_int_equal(tj_losses(a, la), 12);
    assert_int_equal(tj_losses_from(d, 5, ld), 8);
    for (int i = 0; i < 8; i++)
        assert_true(fabs(atof(la[4 + i]) - atof(ld[i])) <= 1e-5 * fabs(atof(la[4 + i])));
    /* a run already at its last step has nothing to do */
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000012", dir);
    assert_int_equal(tj_run(b, extra, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "nothing left to train"));
}

static void test_launch_latest_falls_back_past_a_corrupt_checkpoint(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], dir[256], p[400], extra[512];
    job_name(a, sizeof(a), "cl");
    assert_int_equal(tj_run(a, "--checkpoint.enable true --checkpoint.interval 4", out, sizeof(out)), 0);
    tj_ckpt_dir(dir, sizeof(dir), a);
    /* 12 loses its index (as if the machine died before the rename), 8 gets a flipped byte */
    snprintf(p, sizeof(p), "%s/step-00000012/index", dir);
    assert_int_equal(unlink(p), 0);
    snprintf(p, sizeof(p), "%s/step-00000008/exp_avg_sq.bin", dir);
    assert_int_equal(tu_flip_byte(p, 4096 + 100), 0);
    /* an explicit path to the corrupt one is refused, naming the tensor and the file */
    job_name(b, sizeof(b), "clb");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000008", dir);
    assert_int_equal(tj_run(b, extra, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "exp_avg_sq.bin"));
    assert_non_null(strstr(out, "optimizer.exp_avg_sq.model.embed_tokens.weight"));
    assert_non_null(strstr(out, "not resuming from it"));
    tj_assert_clean(b);
    /* latest: 12 and 8 are passed over, saying why; 4 is loaded */
    snprintf(extra, sizeof(extra), "--checkpoint.load latest --checkpoint.folder %s", dir);
    tj_run_ok(b, extra, out, sizeof(out));
    assert_non_null(strstr(out, "step-00000012 is not loadable"));
    assert_non_null(strstr(out, "incomplete"));
    assert_non_null(strstr(out, "step-00000008 is not loadable"));
    assert_non_null(strstr(out, "checksum mismatch"));
    assert_non_null(strstr(out, "resuming from"));
    tj_assert_resumed_losses(a, b, 4, 12);
    /* an empty folder: latest is a fresh start */
    snprintf(extra, sizeof(extra), "--checkpoint.load latest --checkpoint.folder %s/none", tj_dir);
    assert_int_equal(tj_run(b, extra, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "starting from step 0"));
    tj_assert_same_losses(a, b, 12);
    /* a different model is refused by name */
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000004 --model.dim 64", dir);
    assert_int_equal(tj_run(b, extra, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "its model.dim = 32, this run's is 64"));
}

static void test_launch_keeps_the_latest_k_checkpoints(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], dir[256];
    job_name(a, sizeof(a), "ck2");
    assert_int_equal(tj_run(a, "--checkpoint.enable true --checkpoint.interval 2 --checkpoint.keep_latest_k 2", out,
                            sizeof(out)), 0);
    tj_ckpt_dir(dir, sizeof(dir), a);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 2);
    assert_int_equal(steps[0], 10);
    assert_int_equal(steps[1], 12);
    free(steps);
    DIR *dd = opendir(dir);
    struct dirent *e;
    int entries = 0;
    while ((e = readdir(dd)))
        entries += e->d_name[0] != '.';
    closedir(dd);
    assert_int_equal(entries, 2);
}

static void test_launch_checkpoint_due_while_one_is_written_waits_and_says_so(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], ref[32], dir[256], p[300], err[512];
    job_name(ref, sizeof(ref), "ckwref");
    assert_int_equal(tj_run(ref, "", out, sizeof(out)), 0);
    job_name(a, sizeof(a), "ckw");
    setenv("CTITAN_TEST_CKPT_DELAY_MS", "100", 1); /* each write takes > 2 tiny steps */
    int rc = tj_run(a, "--checkpoint.enable true --checkpoint.interval 2 --checkpoint.keep_latest_k 0", out,
                    sizeof(out));
    unsetenv("CTITAN_TEST_CKPT_DELAY_MS");
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "is still being written at step"));
    /* none dropped, none damaged, and the losses are those of a run without checkpoints */
    tj_ckpt_dir(dir, sizeof(dir), a);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 6);
    for (int i = 0; i < 6; i++) {
        int bad;
        assert_int_equal(steps[i], 2 * (i + 1));
        ckpt_step_path(p, sizeof(p), dir, steps[i]);
        assert_int_equal(ckpt_verify(p, NULL, &bad, err, sizeof(err)), 0);
    }
    free(steps);
    tj_assert_same_losses(ref, a, 12);
}

/* checkpointd killed while it writes step 4: a new one writes step 4 again from the staging
 * segment (no checkpoint lost, issue 13), the killed one's temporary directory never becomes a
 * checkpoint, and training goes on bitwise. */
static void test_launch_checkpointd_killed_mid_write_is_restarted_and_rewrites_it(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], ref[32], dir[256], tmp_prefix[64];
    job_name(ref, sizeof(ref), "ckref");
    assert_int_equal(tj_run(ref, "", out, sizeof(out)), 0);
    job_name(a, sizeof(a), "ckk");
    tj_ckpt_dir(dir, sizeof(dir), a);
    setenv("CTITAN_TEST_CKPT_DELAY_MS", "300", 1); /* checkpointd pauses after each data file */
    pid_t pid = tj_launch_bg(a, "--checkpoint.enable true --checkpoint.interval 4");
    unsetenv("CTITAN_TEST_CKPT_DELAY_MS");
    /* wait for the temporary directory of step 4 to appear, then kill the writer */
    snprintf(tmp_prefix, sizeof(tmp_prefix), ".tmp-step-00000004.");
    int seen = 0;
    for (int i = 0; i < 1000 && !seen; i++) {
        DIR *dd = opendir(dir);
        struct dirent *e;
        while (dd && (e = readdir(dd)))
            seen |= !strncmp(e->d_name, tmp_prefix, strlen(tmp_prefix));
        if (dd)
            closedir(dd);
        if (!seen)
            tj_sleep_ms(10);
    }
    assert_true(seen);
    pid_t ck = tu_descendant_named(pid, "checkpointd");
    assert_true(ck > 0);
    kill(ck, SIGKILL);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, a);
    tu_read_file(path, out, sizeof(out));
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        print_error("%s\n", out);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_non_null(strstr(out, "while writing the checkpoint of step 4: a new checkpointd writes it again"));
    assert_non_null(strstr(out, "checkpoint: step 4 saved to"));
    assert_non_null(strstr(out, "checkpoint: step 8 saved to"));
    /* the killed writer's temporary directory never became a checkpoint and is gone; step 4,
     * written again from the staging segment, 8 and 12 verify */
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 3);
    assert_int_equal(steps[0], 4);
    assert_int_equal(steps[1], 8);
    assert_int_equal(steps[2], 12);
    free(steps);
    DIR *dd = opendir(dir);
    struct dirent *e;
    while ((e = readdir(dd)))
        assert_true(strncmp(e->d_name, ".tmp-", 5));
    closedir(dd);
    char p8[300], err[512];
    int bad;
    snprintf(p8, sizeof(p8), "%s/step-00000008", dir);
    assert_int_equal(ckpt_verify(p8, NULL, &bad, err, sizeof(err)), 0);
    snprintf(p8, sizeof(p8), "%s/step-00000004", dir);
    assert_int_equal(ckpt_verify(p8, NULL, &bad, err, sizeof(err)), 0);
    /* and training never noticed */
    tj_assert_same_losses(ref, a, 12);
    tj_assert_clean(a);
    /* the rewritten step 4 is the real one: a run resumed from it goes on as the reference */
    char b[32], extra[400];
    job_name(b, sizeof(b), "ckkb");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000004", dir);
    assert_int_equal(tj_run(b, extra, out, sizeof(out)), 0);
    tj_assert_resumed_losses(ref, b, 4, 12);
}

static void test_launch_streams_checkpoints_to_a_remote_checkpointd(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char keys[256], store[256], ep[256], cmd[2048], a[32], b[32], c[32], extra[1024], p[512];
    snprintf(keys, sizeof(keys), "%s/keys", tj_dir);
    snprintf(store, sizeof(store), "%s/storage", tj_dir);
    mkdir(keys, 0700);
    snprintf(cmd, sizeof(cmd), "%s ckpt keygen %s/storage && %s ckpt keygen %s/trainer && %s ckpt keygen %s/intruder",
             tu_ctitan(), keys, tu_ctitan(), keys, tu_ctitan(), keys);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    pid_t srv = tu_start_storage(store, keys, ep, sizeof(ep));
    assert_true(srv > 0);
    assert_true(ep[0]);
    /* a trainer with an accepted key: every checkpoint lands on the storage side */
    job_name(a, sizeof(a), "rem");
    snprintf(extra, sizeof(extra), "--checkpoint.enable true --checkpoint.interval 4 --checkpoint.endpoint %s "
             "--checkpoint.server_key %s/storage.pub --checkpoint.client_key %s/trainer.key", ep, keys, keys);
    tj_run_ok(a, extra, out, sizeof(out));
    assert_non_null(strstr(out, "checkpoint: step 12 saved to"));
    snprintf(p, sizeof(p), "%s/%s", store, a);
    int64_t *steps;
    assert_int_equal(ckpt_list(p, &steps), 3);
    free(steps);
    /* nothing was written on the trainer's side */
    char local[256];
    tj_ckpt_dir(local, sizeof(local), a);
    assert_int_equal(access(local, F_OK), -1);
    /* resuming from the storage copy is bitwise */
    job_name(b, sizeof(b), "remb");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/%s/step-00000004", store, a);
    assert_int_equal(tj_run(b, extra, out, sizeof(out)), 0);
    tj_assert_resumed_losses(a, b, 4, 12);
    /* a trainer whose key is not allowed: with checkpoint.load = latest (the default) it does not
     * start, as it cannot learn what the host holds; started over on purpose (load none) every
     * checkpoint fails, saying why; training does not, but with its last checkpoint not written
     * the job does not end as a success (README) */
    job_name(c, sizeof(c), "remc");
    snprintf(extra, sizeof(extra), "--checkpoint.enable true --checkpoint.interval 6 --checkpoint.endpoint %s "
             "--checkpoint.server_key %s/storage.pub --checkpoint.client_key %s/intruder.key", ep, keys, keys);
    assert_int_equal(tj_run(c, extra, out, sizeof(out)), 1);
    if (!strstr(out, "cannot ask the storage host what it holds of job") || !strstr(out, "refused our key") ||
        strstr(out, "step 1 "))
        fail_msg("a launch with a refused key: %s", out);
    strcat(extra, " --checkpoint.load none");
    assert_int_equal(tj_run(c, extra, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "checkpoint of step 6 failed"));
    assert_non_null(strstr(out, "refused our key"));
    assert_non_null(strstr(out, "the checkpoint of step 12, the last, was not written"));
    assert_non_null(strstr(out, "0 of 2 checkpoints"));
    tj_assert_same_losses(a, c, 12);
    snprintf(p, sizeof(p), "%s/%s", store, c);
    assert_int_equal(access(p, F_OK), -1);
    /* a launch of job a again resumes from the storage host (checkpoint.load = latest, the
     * default). There step 12 is gone and step 8 damaged (a byte of its weights flipped, which
     * only the load's checksums see): step 8 is fetched, passed over as it loads, and step 4
     * fetched and loaded; steps 5-12 train again bit for bit, step 8 is written again over the
     * damaged one. Nothing of it is written on the trainer's side. */
    snprintf(p, sizeof(p), "%s/%s/step-00000012", store, a);
    assert_int_equal(tu_rmtree(p), 0);
    snprintf(p, sizeof(p), "%s/%s/step-00000008/model.bin", store, a);
    assert_int_equal(tu_flip_byte(p, 4096 + 100), 0);
    char again[40];
    snprintf(again, sizeof(again), "%sx", a);
    snprintf(extra, sizeof(extra), "--checkpoint.enable true --checkpoint.interval 4 --checkpoint.endpoint %s "
             "--checkpoint.server_key %s/storage.pub --checkpoint.client_key %s/trainer.key --metrics.file %s/%s.jsonl",
             ep, keys, keys, tj_dir, again);
    int rc = tj_run(a, extra, out, sizeof(out));
    /* and a fresh start over the host's checkpoints is refused (it would write over them) */
    static char fresh_out[1 << 16];
    char fresh[1280];
    snprintf(fresh, sizeof(fresh), "--checkpoint.enable true --checkpoint.endpoint %s --checkpoint.server_key "
             "%s/storage.pub --checkpoint.client_key %s/trainer.key --checkpoint.load none --metrics.file %s/%sn.jsonl",
             ep, keys, keys, tj_dir, a);
    int fresh_rc = tj_run(a, fresh, fresh_out, sizeof(fresh_out));
    kill(srv, SIGTERM); /* first: a test that fails must not leave it running */
    int st;
    assert_int_equal(waitpid(srv, &st, 0), srv);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (fresh_rc != 1 || !strstr(fresh_out, "the storage host's folder of job") || !strstr(fresh_out, "would write over"))
        fail_msg("a fresh start against the storage host (rc %d): %s", fresh_rc, fresh_out);
    char want[512];
    snprintf(want, sizeof(want), "resuming from %s/%s/step-00000004 on %s (after step 4)", store, a, ep);
    if (rc || !strstr(out, "step 8 of job") || !strstr(out, "not loading it") || !strstr(out, want))
        fail_msg("a relaunch against the storage host (rc %d): %s", rc, out);
    tj_assert_resumed_losses(a, again, 4, 12);
    for (int step = 8; step <= 12; step += 4) {
        snprintf(p, sizeof(p), "%s/%s/step-%08d", store, a, step);
        int bad = -1;
        assert_int_equal(ckpt_verify(p, NULL, &bad, out, sizeof(out)), 0);
    }
    snprintf(p, sizeof(p), "%s/%s", store, a);
    assert_int_equal(ckpt_list(p, &steps), 3);
    free(steps);
    assert_int_equal(access(local, F_OK), -1); /* streamed into memory: nothing on the trainer's disk */
    tj_assert_clean(a);
    tj_assert_clean(c);
}

static void test_launch_rejects_bad_checkpoint_keys(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32];
    job_name(a, sizeof(a), "ckbad");
    assert_int_equal(tj_run(a, "--checkpoint.endpoint http://x:1", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "--checkpoint.endpoint"));
    assert_int_equal(tj_run(a, "--checkpoint.endpoint tcp://127.0.0.1:9 --checkpoint.client_key k", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "checkpoint.server_key"));
    assert_int_equal(tj_run(a, "--checkpoint.interval 0", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "checkpoint.interval = 0 must be >= 1"));
    assert_int_equal(tj_run(a, "--checkpoint.load /nonexistent/step-00000004", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "/nonexistent/step-00000004"));
}

/* checkpoint.load without checkpoint.enable: checkpointd loads, then stops; the run has the
 * processes of one without checkpoints and writes none. */
static void test_launch_load_without_enable_only_loads(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], dir[256], extra[512];
    job_name(a, sizeof(a), "lo");
    tj_run_ok(a, "--checkpoint.enable true --checkpoint.interval 4", out, sizeof(out));
    tj_ckpt_dir(dir, sizeof(dir), a);
    job_name(b, sizeof(b), "lob");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000004 --checkpoint.enable false", dir);
    tj_run_ok(b, extra, out, sizeof(out));
    assert_non_null(strstr(out, "2 optimizer shards; 5 processes")); /* loader, 2 stages, 2 shards */
    assert_null(strstr(out, "saved to"));
    tj_ckpt_dir(dir, sizeof(dir), b);
    assert_int_equal(access(dir, F_OK), -1);
    tj_assert_resumed_losses(a, b, 4, 12);
    tj_assert_clean(b);
}

/* A checkpoint.load directory that does not exist: one line that names it once and says why
 * (it used to print its own message inside itself, with an empty reason). */
static void test_launch_missing_checkpoint_is_named_once_with_the_reason(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], path[300], extra[400];
    job_name(a, sizeof(a), "cknone");
    snprintf(path, sizeof(path), "%s/missing/step-00000004", tj_dir);
    snprintf(extra, sizeof(extra), "--checkpoint.load %s", path);
    assert_int_equal(tj_run(a, extra, out, sizeof(out)), 1);
    char *line = strstr(out, "launch: checkpoint.load");
    assert_non_null(line);
    *strchrnul(line, '\n') = 0;
    char *again = strstr(line, path);
    assert_non_null(again);
    if (strstr(again + 1, path))
        print_error("the path twice: %s\n", line);
    assert_null(strstr(again + 1, path));
    assert_non_null(strstr(line, "is not loadable (no such directory): not resuming from it"));
    tj_assert_clean(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch_resume_is_bitwise_in_any_topology),
        cmocka_unit_test(test_launch_latest_falls_back_past_a_corrupt_checkpoint),
        cmocka_unit_test(test_launch_keeps_the_latest_k_checkpoints),
        cmocka_unit_test(test_launch_checkpoint_due_while_one_is_written_waits_and_says_so),
        cmocka_unit_test(test_launch_checkpointd_killed_mid_write_is_restarted_and_rewrites_it),
        cmocka_unit_test(test_launch_streams_checkpoints_to_a_remote_checkpointd),
        cmocka_unit_test(test_launch_rejects_bad_checkpoint_keys),
        cmocka_unit_test(test_launch_missing_checkpoint_is_named_once_with_the_reason),
        cmocka_unit_test(test_launch_load_without_enable_only_loads),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
