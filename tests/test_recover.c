/* In-place recovery (issue 13, stages/coord/coord_recover.c) with real processes: a stage or an
 * optimizer shard killed -9 at named points of a step (CTITAN_TEST_DIE_AT) or at seeded random
 * moments, stopped (SIGSTOP), or wedged (CTITAN_TEST_HANG_AT: the step watchdog), is replaced
 * alone and the job ends with every step's loss bitwise that of an undisturbed run (each step
 * once in the metrics: a redone step is reported once), its checkpoints byte for byte the
 * same, one "recovered" line and one restart record (scope "process") per recovery, and
 * nothing of it left behind. Also: two losses in one step, a loss during a recovery, and a
 * crash that repeats at the same step, which stops after job.max_restarts. GPU jobs, on the
 * emulated CUDA backend (tests/cudasim), rewind to their newest snapshot instead
 * (stages/coord/coord_rewind.c): the steps since run again, with the same losses. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "ipc/shm.h"
#include "ipc/util.h"
#include "tests/testjob.h"


static int setup(void **state) { return tj_setup("recover"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 'v', what); }

#define QUIET "--metrics.log_freq 100000 "

/* Runs job to its end with the test points `die` and `hang` (each may be ""), each hit once (a
 * fresh CTITAN_TEST_DIE_ONCE folder); returns the exit status, the output in out. */
static int run_job(const char *job, const char *die, const char *hang, const char *extra, char *out, size_t outlen)
{
    char env[1024], once[128], args[2048];
    snprintf(env, sizeof(env), "CTITAN_TEST_DIE_ONCE=%s CTITAN_TEST_DIE_AT=%s CTITAN_TEST_HANG_AT=%s",
             tj_once_dir(once, sizeof(once), job), die, hang);
    snprintf(args, sizeof(args), QUIET "%s", extra);
    return tj_launch(env, 120, job, args, out, outlen);
}

/* testjob.h's, by their names here */
#define FAIL_WITH TJ_FAIL_WITH
#define count tj_count
#define assert_clean tj_assert_clean
#define use_sim_plugin tj_use_sim_plugin
#define assert_losses_by_step tj_assert_losses_by_step

/* Restart record k of mt holds needle; on failure every record is shown (a timing-dependent
 * outcome, e.g. a rewind to an older snapshot than the test expects, says which). */
#define ASSERT_RECORD(mt, k, needle)                                                                \
    do {                                                                                            \
        if (!strstr((mt)->restart[k], needle)) {                                                    \
            for (int r_ = 0; r_ < (mt)->restarts; r_++)                                             \
                print_message("restart record %d: %s\n", r_, (mt)->restart[r_]);                    \
            fail_msg("restart record %d has no %s", k, needle);                                     \
        }                                                                                           \
    } while (0)

/* ---- metrics ---- */

/* job ran steps 1..steps once each, every loss the undisturbed `ref`'s, with `recoveries`
 * restart records, each of scope "process". Returns the records (static). */
static const tj_metrics_t *assert_same_losses(const char *job, const char *ref, int steps, int recoveries)
{
    static tj_metrics_t a, b;
    tj_parse_metrics(ref, &a);
    tj_parse_metrics(job, &b);
    assert_int_equal(a.n, steps);
    assert_int_equal(b.n, steps);
    for (int i = 0; i < steps; i++) {
        assert_int_equal(b.step[i], i + 1);
        if (strcmp(a.loss[i], b.loss[i]))
            fail_msg("step %d: %s has loss %s, the undisturbed %s %s", i + 1, job, b.loss[i], ref, a.loss[i]);
    }
    if (b.restarts != recoveries)
        fail_msg("%s: %d restart records, expected %d", job, b.restarts, recoveries);
    for (int i = 0; i < b.restarts; i++)
        assert_non_null(strstr(b.restart[i], "\"scope\": \"process\""));
    return &b;
}

static int run_undisturbed(const char *job, const char *extra, char *out, size_t outlen)
{
    return run_job(job, "", "", extra, out, outlen);
}

/* The undisturbed run of these arguments (made once per argument string). */
static const char *reference(const char *extra) { return tj_reference('v', extra, run_undisturbed); }

/* The files of checkpoint `step` of job and ref are the same bytes. */
static void assert_same_checkpoint(const char *job, const char *ref, int step)
{
    static const char *files[] = {"model.bin", "exp_avg.bin", "exp_avg_sq.bin"};
    static char a[1 << 21], b[1 << 21];
    for (int i = 0; i < 3; i++) {
        char pa[512], pb[512];
        snprintf(pa, sizeof(pa), "%s/runs/%s/checkpoint/step-%08d/%s", tj_dir, job, step, files[i]);
        snprintf(pb, sizeof(pb), "%s/runs/%s/checkpoint/step-%08d/%s", tj_dir, ref, step, files[i]);
        FILE *fa = fopen(pa, "rb"), *fb = fopen(pb, "rb");
        if (!fa || !fb)
            fail_msg("%s or %s is missing", pa, pb);
        size_t na = fread(a, 1, sizeof(a), fa), nb = fread(b, 1, sizeof(b), fb);
        fclose(fa);
        fclose(fb);
        if (na != nb || memcmp(a, b, na))
            fail_msg("%s differs from %s", pa, pb);
    }
}

/* ---- named points ---- */

#define STEPS20 "--training.steps 20"

/* A stage killed -9 as a step begins, in its middle and at its end, on either rank: each time a
 * new stage takes its place, every stage redoes the step, and the losses stay bitwise. */
static void test_recover_a_stage_killed_at_points_of_a_step_is_replaced_bitwise(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "stage");
    const char *ref = reference(STEPS20);
    int rc = run_job(j, "stage.0.0:begin:3,stage.1.0:mid:6,stage.1.0:end:9,stage.0.0:mid:12", "", STEPS20, out,
                     sizeof(out));
    if (rc || count(out, "(in place, at step ") != 4)
        FAIL_WITH(out, "status %d, %d recoveries", rc, count(out, "(in place, at step "));
    const tj_metrics_t *mt = assert_same_losses(j, ref, 20, 4);
    ASSERT_RECORD(mt, 0, "\"role\": \"stage\", \"rank\": 0, \"replica\": 0");
    ASSERT_RECORD(mt, 1, "\"role\": \"stage\", \"rank\": 1, \"replica\": 0");
    ASSERT_RECORD(mt, 1, "\"step\": 6, \"redone\": true");
    ASSERT_RECORD(mt, 0, "killed by signal 9");
    assert_non_null(strstr(out, "recovered 2 (in place, at step 6): stage rank 1 replica 0 (pid "));
    assert_non_null(strstr(out, "the step redone by every stage"));
    assert_null(strstr(out, "\nrestart ")); /* no relaunch of the job */
    assert_clean(j);
}

/* A stage whose control connection is gone when the coordinator next sends to it, before its
 * exit is reaped (CTITAN_TEST_DROP_AT: it closes the connection after its STEP_DONE and dies a
 * second later, the window a kill -9 at a random moment can fall in): the send is not the job's
 * failure; the exit is reaped and the stage replaced in place, bitwise (the random kill test
 * once relaunched the whole job from a checkpoint here: "cannot send step ...: No route to host"). */
static void test_recover_a_stage_gone_before_its_exit_is_reaped_is_replaced_in_place(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], env[1024], once[128];
    job_name(j, sizeof(j), "drop");
    const char *ref = reference(STEPS20);
    /* stage 0 pauses before its STEP_DONE, so the coordinator's next send (step 4) surely comes
     * after stage 1's connection is gone, however loaded the machine (without the pause, a
     * loaded machine could queue step 4 before stage 1's close went through) */
    snprintf(env, sizeof(env),
             "CTITAN_TEST_DIE_ONCE=%s CTITAN_TEST_DROP_AT=stage.1.0:done:3 CTITAN_TEST_SLOW_AT=stage.0.0:end:3",
             tj_once_dir(once, sizeof(once), j));
    int rc = tj_launch(env, 120, j, QUIET STEPS20, out, sizeof(out));
    if (rc || count(out, "(in place, at step ") != 1 || !strstr(out, "its connection is gone; waiting for its exit"))
        FAIL_WITH(out, "status %d, %d recoveries", rc, count(out, "(in place, at step "));
    assert_same_losses(j, ref, 20, 1);
    assert_null(strstr(out, "\nrestart ")); /* no relaunch of the job */
    assert_clean(j);
}

/* An optimizer shard killed -9 in REDUCE, in the middle of AdamW, right after its commit, after
 * its update and before its snapshot: its replacement takes the state over from the optstate
 * segment; losses and checkpoints are the same bytes. */
static void test_recover_a_shard_killed_at_points_of_its_rounds_keeps_its_state_bitwise(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "shard");
    const char *args = STEPS20 " --checkpoint.enable true --checkpoint.interval 5";
    const char *ref = reference(args);
    int rc = run_job(j, "optshard.0.0:reduce:3,optshard.1.0:adamw:5,optshard.0.0:committed:8,"
                     "optshard.1.0:updated:11,optshard.1.0:snapshot:15", "", args, out, sizeof(out));
    if (rc || count(out, "(in place, at step ") != 5)
        FAIL_WITH(out, "status %d, %d recoveries", rc, count(out, "(in place, at step "));
    const tj_metrics_t *mt = assert_same_losses(j, ref, 20, 5);
    ASSERT_RECORD(mt, 1, "\"role\": \"optshard\", \"rank\": 1");
    ASSERT_RECORD(mt, 1, "\"redone\": false");
    for (int s = 5; s <= 20; s += 5)
        assert_same_checkpoint(j, ref, s);
    assert_clean(j);
}

/* optshard.host_banks 1 (one bank of the CPU shards' state, updated in place): the same losses
 * and checkpoint bytes as two banks. A shard killed in its update (the bank half written)
 * rewinds the job to its newest snapshot: in its first steps, before any, to the initial
 * weights; later to the checkpoint's. Killed at other moments (in its REDUCE, after its commit)
 * it is replaced alone, as is a stage; every loss and checkpoint stays bitwise. */
static void test_recover_a_shard_of_one_bank_killed_in_its_update_rewinds_the_job_bitwise(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "bank1");
    const char *two = STEPS20 " --checkpoint.enable true --checkpoint.interval 5";
    const char *args = STEPS20 " --checkpoint.enable true --checkpoint.interval 5 --optshard.host_banks 1";
    const char *ref = reference(two), *ref1 = reference(args);
    assert_same_losses(ref1, ref, 20, 0);
    for (int s = 5; s <= 20; s += 5)
        assert_same_checkpoint(ref1, ref, s);
    int rc = run_job(j, "optshard.0.0:adamw:2,optshard.1.0:adamw:7,optshard.0.0:reduce:9,optshard.1.0:committed:11,"
                     "stage.1.0:mid:13", "", args, out, sizeof(out));
    if (rc || count(out, "(rewound, at step ") != 2 || count(out, "(in place, at step ") != 3 ||
        !strstr(out, "started again from the initial weights in ") ||
        !strstr(out, "started again from the in-memory snapshot of step 5 "))
        FAIL_WITH(out, "status %d: expected two rewinds and three replacements in place", rc);
    const tj_metrics_t *mt = assert_losses_by_step(j, ref, 20, 5, "\"scope\": \"");
    ASSERT_RECORD(mt, 0, "\"scope\": \"rewind\", \"role\": \"optshard\", \"rank\": 0");
    ASSERT_RECORD(mt, 0, "\"rewound_to\": 0, \"step\": 2");
    ASSERT_RECORD(mt, 1, "\"rewound_to\": 5, \"step\": 7");
    ASSERT_RECORD(mt, 2, "\"scope\": \"process\", \"role\": \"optshard\", \"rank\": 0");
    ASSERT_RECORD(mt, 3, "\"scope\": \"process\", \"role\": \"optshard\", \"rank\": 1");
    ASSERT_RECORD(mt, 4, "\"scope\": \"process\", \"role\": \"stage\"");
    for (int s = 5; s <= 20; s += 5)
        assert_same_checkpoint(j, ref, s);
    assert_clean(j);
    /* the shard copied step 10's snapshot, updated to step 11 and died before the coordinator
     * read its SNAPPED (CTITAN_TEST_MUTE_AT: never sent): its replacement is owed that SNAPSHOT
     * with the state of step 11 in its one bank. The copy was done; copying again would put step
     * 11's state into step 10's checkpoint. */
    char env[1024], once[128];
    job_name(j, sizeof(j), "bank1s");
    snprintf(env, sizeof(env), "CTITAN_TEST_DIE_ONCE=%s CTITAN_TEST_MUTE_AT=optshard.1.0:snapped:10 "
             "CTITAN_TEST_DIE_AT=optshard.1.0:committed:11", tj_once_dir(once, sizeof(once), j));
    char full[2048];
    snprintf(full, sizeof(full), QUIET "%s", args);
    rc = tj_launch(env, 120, j, full, out, sizeof(out));
    if (rc || count(out, "(in place, at step 11)") != 1 || !strstr(out, "copied by the shard this one replaces"))
        FAIL_WITH(out, "status %d: expected the replacement to answer the SNAPSHOT it was owed", rc);
    assert_losses_by_step(j, ref, 20, 1, "\"scope\": \"process\"");
    for (int s = 5; s <= 20; s += 5)
        assert_same_checkpoint(j, ref, s);
    assert_clean(j);
}

/* Two losses in one step (both stages as it begins, and a shard in its REDUCE), and losses during
 * a recovery (the replacement itself killed while it sets up): one recovery each, counted. */
static void test_recover_two_losses_in_a_step_and_a_loss_during_a_recovery(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "two");
    const char *ref = reference(STEPS20);
    int rc = run_job(j, "stage.0.0:begin:4,stage.1.0:begin:4,optshard.0.0:reduce:4,stage.1.0:mid:8,"
                     "stage.1.0:setup:8,optshard.1.0:adamw:12,optshard.1.0:setup:12", "", STEPS20, out, sizeof(out));
    if (rc)
        FAIL_WITH(out, "status %d", rc);
    const tj_metrics_t *mt = assert_same_losses(j, ref, 20, count(out, "(in place, at step "));
    assert_true(mt->restarts >= 3);
    assert_non_null(strstr(out, "(1 more lost during the recovery), the step redone by every stage"));
    assert_non_null(strstr(out, "optshard 1 (pid "));
    assert_int_equal(count(out, "(1 more lost during the recovery)"), 2);
    assert_clean(j);
}

/* A stage that dies at the same point every time (no CTITAN_TEST_DIE_ONCE): after job.max_restarts
 * in-place tries at that step the job fails, the supervisor relaunches it, which fails the same
 * way, and the launch gives up with status 1 and the reason. */
static void test_recover_a_crash_that_repeats_stops_after_max_restarts(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "repeat");
    int rc = tj_launch("CTITAN_TEST_DIE_AT=stage.1.0:mid:4", 120, j,
                       QUIET STEPS20 " --job.max_restarts 1 --job.restart_backoff_ms 0", out, sizeof(out));
    if (rc != 1 || !strstr(out, "not replaced: 1 in-place recoveries at step 4 already (job.max_restarts = 1)") ||
        !strstr(out, "giving up after 1 restart"))
        FAIL_WITH(out, "status %d", rc);
    assert_int_equal(count(out, "\nrestart 1 "), 1);
    assert_clean(j);
}

/* ---- hangs ---- */

/* A stage and a shard stopped with SIGSTOP mid-run: after job.heartbeat_timeout_ms without a
 * heartbeat each is killed and replaced; the losses stay bitwise. */
static void test_recover_a_stopped_stage_or_shard_is_killed_and_replaced(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "stop");
    const char *args = "--training.steps 3000 --job.heartbeat_timeout_ms 1000";
    const char *ref = reference(args);
    char full[512];
    snprintf(full, sizeof(full), QUIET "%s", args);
    pid_t pid = tj_launch_bg(j, full);
    assert_int_equal(tj_wait_step(j, 200, 60), 0);
    pid_t st = tu_stage_pid(pid, 1);
    assert_true(st > 0);
    kill(st, SIGSTOP);
    for (int i = 0; i < 1000 && !strstr(out, "recovered 1 "); i++, tj_sleep_ms(10))
        tj_read_out(j, out, sizeof(out));
    pid_t sh = tu_descendant_named(pid, "ctitan-optshard");
    assert_true(sh > 0);
    kill(sh, SIGSTOP);
    int rc = tu_reap(pid, 60, NULL);
    tj_read_out(j, out, sizeof(out));
    if (rc || count(out, "(in place, at step ") != 2)
        FAIL_WITH(out, "status %d, %d recoveries", rc, count(out, "(in place, at step "));
    assert_non_null(strstr(out, "stage rank 1 replica 0 (pid "));
    assert_int_equal(count(out, "(stopped or hung) and was killed; replaced: "), 2);
    assert_same_losses(j, ref, 3000, 2);
    assert_true(kill(st, 0) < 0 && kill(sh, 0) < 0);
    assert_clean(j);
}

/* A main thread that hangs while its heartbeats go on (CTITAN_TEST_HANG_AT): the step watchdog
 * (job.watchdog_s) dumps its stack to the log, kills it and replaces it, a stage and a shard;
 * the stages waiting on the hung one are not blamed. */
static void test_recover_the_watchdog_dumps_and_replaces_a_wedged_stage_or_shard(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "hang");
    const char *ref = reference(STEPS20);
    int rc = run_job(j, "", "stage.0.0:mid:6,optshard.1.0:adamw:9", STEPS20 " --job.watchdog_s 1", out, sizeof(out));
    if (rc || count(out, "(in place, at step ") != 2)
        FAIL_WITH(out, "status %d, %d recoveries", rc, count(out, "(in place, at step "));
    assert_int_equal(count(out, "dumping its stack (SIGABRT), then replacing it"), 2);
    assert_int_equal(count(out, "ctitan: SIGABRT: the stack of the main thread:"), 2);
    assert_non_null(strstr(out, "(worker_test_point+")); /* the functions are named (-rdynamic) */
    assert_non_null(strstr(out, "stage rank 0 replica 0 (pid "));
    assert_null(strstr(out, "stage rank 1 replica 0 (pid ")); /* it only waited */
    assert_non_null(strstr(out, "hung (the step watchdog dumped its stack and stopped it"));
    assert_same_losses(j, ref, 20, 2);
    assert_clean(j);
}

/* A loader whose main thread hangs after it became ready while its heartbeats go on (the
 * stages then wait on its token ring, which counts as progress for them): the step watchdog
 * names it, dumps its stack and replaces it from its cursor; the losses stay bitwise. */
static void test_recover_the_watchdog_replaces_a_wedged_loader(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "ldrhang");
    const char *ref = reference(STEPS20 " --loader.prefetch 1");
    int rc = run_job(j, "", "loader.0.0:next:8", STEPS20 " --loader.prefetch 1 --job.watchdog_s 1", out, sizeof(out));
    if (rc || !strstr(out, "loader (pid ") || !strstr(out, "dumping its stack (SIGABRT), then replacing it") ||
        !strstr(out, "restarted (pid "))
        FAIL_WITH(out, "status %d", rc);
    assert_int_equal(count(out, "ctitan: SIGABRT: the stack of the main thread:"), 1);
    assert_null(strstr(out, "stage rank 0 replica 0 (pid ")); /* it only waited */
    static tj_metrics_t a, b;
    tj_parse_metrics(ref, &a);
    tj_parse_metrics(j, &b);
    assert_int_equal(b.n, 20);
    for (int i = 0; i < 20; i++)
        if (strcmp(a.loss[i], b.loss[i]))
            FAIL_WITH(out, "step %d: loss %s, the undisturbed run's %s", i + 1, b.loss[i], a.loss[i]);
    assert_clean(j);
}

/* ---- GPU jobs: rewinding (on the emulated CUDA backend) ---- */

#define GPU_SHAPE "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.seq_len 16 " \
                  "--training.local_batch_size 2 --job.device cuda "
/* data parallel 2 on the NCCL plane, 3 steps, an in-memory snapshot every 2 */
#define GPU_NCCL \
    GPU_SHAPE "--training.steps 3 --checkpoint.snapshot_interval 2 --parallelism.data_parallel_replicate_degree 2 " \
              "--parallelism.data_plane nccl"
/* 7 steps, a checkpoint every 3 (and of the last) */
#define GPU_CKPT \
    GPU_SHAPE "--training.steps 7 --checkpoint.enable true --checkpoint.interval 3 --job.restart_backoff_ms 0"

/* A GPU job (device rings through CUDA IPC, shards on the GPU) whose stage is killed starts
 * every stage again, the shards keeping their state: they map the new stages' buffers and write
 * the master weights into them (REMAP), and the step is redone, with the same losses; once a
 * replacement dies while it sets up (counted, recovered again). A GPU shard killed, also while
 * it maps the new stages, rewinds the job: every stage and shard starts again from the newest
 * whole snapshot (the checkpoint's in the staging segment) and the steps since run again. The
 * checkpoints are the same bytes. */
static void test_recover_a_gpu_stage_is_replaced_with_its_peers_and_a_gpu_shard_rewinds(void **state)
{
    TU_NEED_BIN();
    if (use_sim_plugin())
        skip();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "gpu");
    const char *ref = reference(GPU_CKPT);
    int rc = run_job(j, "stage.0.0:begin:2,stage.1.0:begin:4,optshard.1.0:remap:4,stage.1.0:mid:5,stage.0.0:setup:5,"
                     "optshard.0.0:adamw:7", "", GPU_CKPT, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc || count(out, "(every stage started again, at step ") != 2 || count(out, "(rewound, at step ") != 2)
        FAIL_WITH(out, "status %d", rc);
    const tj_metrics_t *mt = assert_losses_by_step(j, ref, 7, 4, "\"scope\": \"");
    ASSERT_RECORD(mt, 0, "\"scope\": \"stages\", \"role\": \"stage\", \"rank\": 0, \"replica\": 0");
    ASSERT_RECORD(mt, 0, "\"step\": 2, \"redone\": true, \"replaced\": 2, \"lost_during\": 0");
    ASSERT_RECORD(mt, 1, "\"scope\": \"rewind\", \"role\": \"stage\", \"rank\": 1");
    /* to the step-3 checkpoint's snapshot, or to the start when its copy was not whole yet: the
     * shards copy at idle CPU priority, so under a loaded machine (CI's ASan run, two programs at
     * once) the kill at step 4 can come first; both are the newest whole snapshot */
    if (!strstr(mt->restart[1], "\"rewound_to\": 3, \"step\": 4, \"redone\": true"))
        ASSERT_RECORD(mt, 1, "\"rewound_to\": 0, \"step\": 4, \"redone\": true");
    ASSERT_RECORD(mt, 1, "\"lost_during\": 1");
    ASSERT_RECORD(mt, 2, "\"scope\": \"stages\", \"role\": \"stage\", \"rank\": 1");
    ASSERT_RECORD(mt, 2, "\"step\": 5, \"redone\": true, \"replaced\": 2, \"lost_during\": 1");
    ASSERT_RECORD(mt, 3, "\"scope\": \"rewind\", \"role\": \"optshard\", \"rank\": 0");
    ASSERT_RECORD(mt, 3, "\"rewound_to\": 6, \"step\": 7");
    assert_non_null(strstr(out, "(every stage started again, at step 2): stage rank 0 replica 0 (pid "));
    assert_non_null(strstr(out, "the step redone by every stage"));
    assert_non_null(strstr(out, ": steps 7 to 7 run again"));
    for (int s = 3; s <= 6; s += 3)
        assert_same_checkpoint(j, ref, s);
    assert_same_checkpoint(j, ref, 7);
    assert_null(strstr(out, "\nrestart ")); /* no relaunch of the job */
    assert_clean(j);
}

/* A GPU stage stopped (SIGSTOP: killed after the heartbeat timeout) and one wedged (its main
 * thread hangs, heartbeats go on: the step watchdog) are replaced with every stage; bitwise. */
static void test_recover_a_stopped_or_wedged_gpu_stage_is_replaced_with_its_peers(void **state)
{
    TU_NEED_BIN();
    if (use_sim_plugin())
        skip();
    static char out[1 << 16];
    char j[32], full[512];
    job_name(j, sizeof(j), "gpustop");
    const char *args = GPU_SHAPE "--training.steps 8 --job.heartbeat_timeout_ms 1000 --job.watchdog_s 3";
    const char *ref = reference(args);
    char once[128];
    setenv("CTITAN_TEST_DIE_ONCE", tj_once_dir(once, sizeof(once), j), 1);
    setenv("CTITAN_TEST_HANG_AT", "stage.0.0:mid:7", 1);
    snprintf(full, sizeof(full), QUIET "%s", args);
    pid_t pid = tj_launch_bg(j, full);
    unsetenv("CTITAN_TEST_DIE_ONCE");
    unsetenv("CTITAN_TEST_HANG_AT");
    assert_int_equal(tj_wait_step(j, 2, 60), 0);
    pid_t st = tu_stage_pid(pid, 1);
    assert_true(st > 0);
    kill(st, SIGSTOP);
    int rc = tu_reap(pid, 120, NULL);
    unsetenv("CTITAN_CUDA_PLUGIN");
    tj_read_out(j, out, sizeof(out));
    if (rc || count(out, "(every stage started again, at step ") != 2)
        FAIL_WITH(out, "status %d", rc);
    assert_non_null(strstr(out, "(stopped or hung) and was killed; replaced: "));
    assert_non_null(strstr(out, "hung (the step watchdog dumped its stack and stopped it"));
    assert_losses_by_step(j, ref, 8, 2, "\"scope\": \"stages\"");
    assert_true(kill(st, 0) < 0);
    assert_clean(j);
}

/* Before the first snapshot a GPU shard's loss rewinds the job to the initial weights; a stage
 * lost right after its reply (in the step's round, between rounds, or while the shards reduce:
 * then a rewind, since GPU shards read the stages' gradients) is recovered the same way. */
static void test_recover_a_gpu_job_rewinds_to_the_initial_weights_and_a_stage_lost_after_its_reply(void **state)
{
    TU_NEED_BIN();
    if (use_sim_plugin())
        skip();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "gpu0");
    const char *ref = reference(GPU_CKPT);
    int rc = run_job(j, "optshard.1.0:reduce:2,stage.1.0:done:4,stage.0.0:done:5", "", GPU_CKPT, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    int stages = count(out, "(every stage started again, at step "), rewinds = count(out, "(rewound, at step ");
    if (rc || stages + rewinds != 3 || !strstr(out, "started again from the initial weights in "))
        FAIL_WITH(out, "status %d", rc);
    const tj_metrics_t *mt = assert_losses_by_step(j, ref, 7, 3, "\"scope\": \"");
    ASSERT_RECORD(mt, 0, "\"rewound_to\": 0, \"step\": 2");
    ASSERT_RECORD(mt, 1, "\"step\": 4, \"redone\": true");
    /* stage 0 dies after its reply of step 5: seen in step 5's later rounds, or (the GPU shards
     * answer UPDATE without waiting for their device, so those rounds are short) in step 6's */
    if (!strstr(mt->restart[2], "\"step\": 6, \"redone\": true"))
        ASSERT_RECORD(mt, 2, "\"step\": 5, \"redone\": true");
    assert_same_checkpoint(j, ref, 3);
    assert_same_checkpoint(j, ref, 6);
    assert_clean(j);
}

/* The NCCL data plane (data parallel 2 x pipeline 2: its communicators die with any rank, so
 * they are made again) rewinds, here with in-memory snapshots only (checkpoint.snapshot_interval,
 * no checkpoint written). Offload mode (GPU stages, CPU shards in the optstate segment) recovers
 * in place: a shard alone, a stage with every stage, the step redone; and so does data parallel
 * 2 on the IPC plane with GPU shards (all four stages started again, mapped by the shards). */
static void test_recover_gpu_jobs_on_the_nccl_plane_rewind_and_in_offload_mode_recover_in_place(void **state)
{
    TU_NEED_BIN();
    if (use_sim_plugin())
        skip();
    static char out[1 << 16];
    char j[32], k[32];
    job_name(j, sizeof(j), "nccl");
    job_name(k, sizeof(k), "offload");
    const char *nccl = GPU_NCCL;
    const char *offload = GPU_SHAPE "--training.steps 3 --checkpoint.enable true --checkpoint.interval 2 "
                                    "--optshard.device cpu";
    const char *ref_nccl = reference(nccl), *ref_offload = reference(offload);
    int rc = run_job(j, "optshard.3.0:reduce:3", "", nccl, out, sizeof(out));
    if (rc || count(out, "(rewound, at step 3)") != 1 || !strstr(out, "from the in-memory snapshot of step 2 ("))
        FAIL_WITH(out, "status %d", rc);
    assert_losses_by_step(j, ref_nccl, 3, 1, "\"rewound_to\": 2, \"step\": 3");
    assert_clean(j);
    rc = run_job(k, "optshard.1.0:adamw:2,stage.1.0:end:3", "", offload, out, sizeof(out));
    if (rc || count(out, "(in place, at step 2): optshard 1 (pid ") != 1 ||
        count(out, "(every stage started again, at step 3): stage rank 1 replica 0 (pid ") != 1)
        FAIL_WITH(out, "status %d", rc);
    const tj_metrics_t *mt = assert_losses_by_step(k, ref_offload, 3, 2, "\"redone\": ");
    ASSERT_RECORD(mt, 0, "\"scope\": \"process\", \"role\": \"optshard\"");
    ASSERT_RECORD(mt, 1, "\"scope\": \"stages\", \"role\": \"stage\"");
    ASSERT_RECORD(mt, 1, "\"step\": 3, \"redone\": true");
    assert_same_checkpoint(k, ref_offload, 2);
    assert_same_checkpoint(k, ref_offload, 3);
    assert_clean(k);
    /* data parallel 2 on the IPC plane: the shards sum both replicas' stages, and map all four anew */
    const char *dp2 = GPU_SHAPE "--training.steps 3 --parallelism.data_parallel_replicate_degree 2";
    const char *ref_dp2 = reference(dp2);
    job_name(k, sizeof(k), "ipcdp2");
    rc = run_job(k, "stage.0.1:mid:2", "", dp2, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc || count(out, "(every stage started again, at step 2): stage rank 0 replica 1 (pid ") != 1)
        FAIL_WITH(out, "status %d", rc);
    mt = assert_losses_by_step(k, ref_dp2, 3, 1, "\"replaced\": 4, ");
    assert_clean(k);
}

/* Offload mode (GPU stages, CPU shards) with one bank of shard state (optshard.host_banks 1):
 * a shard killed in its AdamW rewinds the job (to the initial weights before any snapshot, then
 * to the checkpoint's), one killed in its REDUCE is replaced alone; the losses and checkpoints
 * are those of the two-bank run. The same with offload's copies in bf16 (optshard.offload_dtype:
 * the shared weights and gradients bf16, which the replacement sums again a chunk at a time and
 * every rewind publishes again), against the two-bank bf16 run. */
static void test_recover_offload_with_one_bank_rewinds_only_for_a_shard_lost_in_its_update(void **state)
{
    TU_NEED_BIN();
    if (use_sim_plugin())
        skip();
    static char out[1 << 16];
    static const char *dtype[] = {"", "--optshard.offload_dtype bfloat16 "};
    for (int d = 0; d < 2; d++) {
        char j[32], refargs[1024], args[1100];
        job_name(j, sizeof(j), d ? "offb1h" : "offb1");
        snprintf(refargs, sizeof(refargs), "%s--optshard.device cpu --training.steps 7 --checkpoint.enable true "
                 "--checkpoint.interval 3 %s", GPU_SHAPE, dtype[d]);
        snprintf(args, sizeof(args), "%s--optshard.host_banks 1", refargs);
        const char *ref = reference(refargs);
        if (d) /* a replacement's sums in several chunks */
            setenv("CTITAN_TEST_GRAD_CHUNK_BLOCKS", "3", 1);
        int rc = run_job(j, "optshard.1.0:adamw:2,optshard.0.0:adamw:5,optshard.1.0:reduce:6", "", args, out,
                         sizeof(out));
        unsetenv("CTITAN_TEST_GRAD_CHUNK_BLOCKS");
        if (rc || count(out, "(rewound, at step ") != 2 || count(out, "(in place, at step 6)") != 1 ||
            !strstr(out, "started again from the initial weights in ") ||
            !strstr(out, "started again from the in-memory snapshot of step 3 "))
            FAIL_WITH(out, "%s: status %d: expected two rewinds and a shard replaced in place", j, rc);
        const tj_metrics_t *mt = assert_losses_by_step(j, ref, 7, 3, "\"scope\": \"");
        ASSERT_RECORD(mt, 2, "\"scope\": \"process\", \"role\": \"optshard\", \"rank\": 1");
        assert_same_checkpoint(j, ref, 3);
        assert_same_checkpoint(j, ref, 6);
        assert_clean(j);
    }
    unsetenv("CTITAN_CUDA_PLUGIN");
}

/* A GPU shard lost while it copies its snapshot leaves no whole snapshot in memory (the new one
 * was overwriting the last): the job fails, saying so, and the supervisor relaunches it from
 * the newest checkpoint on disk; the losses stay those of the undisturbed run. */
static void test_recover_a_gpu_job_without_a_whole_snapshot_is_relaunched_from_disk(void **state)
{
    TU_NEED_BIN();
    if (use_sim_plugin())
        skip();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "gpudisk");
    const char *ref = reference(GPU_CKPT);
    int rc = run_job(j, "optshard.1.0:snapshot:6", "", GPU_CKPT, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc || !strstr(out, "and the snapshot of step 6 was overwriting it: not recovered in place") ||
        count(out, "\nrestart 1 ") != 1)
        FAIL_WITH(out, "status %d", rc);
    assert_losses_by_step(j, ref, 7, 1, "\"scope\": \"job\"");
    assert_same_checkpoint(j, ref, 6);
    assert_same_checkpoint(j, ref, 7);
    assert_clean(j);
}

/* ---- kill -9 at random moments ---- */

/* The worker of `comm` ("ctitan-stage", "ctitan-optshard", ...) with `--rank rank` that the launch
 * `ancestor` runs (any: rank -1), or 0. */
static pid_t worker_pid(pid_t ancestor, const char *comm, int rank)
{
    if (rank < 0)
        return tu_descendant_named(ancestor, comm);
    char want[32];
    int wl = snprintf(want, sizeof(want), "--rank%c%d", 0, rank) + 1;
    return tu_worker_pid(ancestor, comm, want, (size_t)wl);
}

/* kill -9 of a random role (two stages, two shards, the loader, checkpointd) at random moments
 * of a 3000-step run with a checkpoint every 500 steps (the seed is printed; CTITAN_TEST_SEED
 * picks one): the job ends with status 0, the losses and every checkpoint as undisturbed. Each
 * kill waits for the job to have gone two steps past the one before (its recovery done): on a
 * loaded machine a recovery outlasted the pause, three kills fell on one step, and
 * job.max_restarts' cap on in-place recoveries at one step relaunched the job, as it should
 * (several losses in one step are the test of that name). */
static void test_recover_kill_9_of_random_roles_at_random_moments_is_bitwise(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "random");
    const char *args = "--training.steps 3000 --checkpoint.enable true --checkpoint.interval 500";
    const char *ref = reference(args);
    unsigned seed = getenv("CTITAN_TEST_SEED") ? (unsigned)atoi(getenv("CTITAN_TEST_SEED")) : (unsigned)time(NULL);
    print_message("seed %u (CTITAN_TEST_SEED)\n", seed);
    srand(seed);
    static const struct {
        const char *comm;
        int rank;
    } roles[] = {{"ctitan-stage", 0}, {"ctitan-stage", 1}, {"ctitan-optshard", 0},
                 {"ctitan-optshard", 1}, {"ctitan-loader", -1}, {"checkpointd", -1}};
    char full[512];
    snprintf(full, sizeof(full), QUIET "%s", args);
    pid_t pid = tj_launch_bg(j, full);
    assert_int_equal(tj_wait_step(j, 50, 60), 0);
    int kills = 0, stage_or_shard = 0;
    for (int k = 0; k < 6; k++) {
        tj_sleep_ms(100 + rand() % 400);
        int r = rand() % 6;
        pid_t victim = worker_pid(pid, roles[r].comm, roles[r].rank);
        if (victim <= 0)
            continue; /* between its death and its replacement, or the run ended */
        int at = tj_last_step(j);
        kill(victim, SIGKILL);
        print_message("kill -9 %s rank %d (pid %d) after step %d\n", roles[r].comm, roles[r].rank, (int)victim, at);
        kills++;
        stage_or_shard += r < 4;
        for (int w = 0; w < 3000 && tj_last_step(j) < at + 2 && at + 2 <= 3000; w++)
            tj_sleep_ms(10); /* recovered: two steps on (30 s at most) */
    }
    int rc = tu_reap(pid, 90, NULL);
    tj_read_out(j, out, sizeof(out));
    if (rc)
        FAIL_WITH(out, "status %d", rc);
    assert_true(kills >= 3);
    if (strstr(out, "\nrestart ")) /* the supervisor relaunched it: the output says why (seen once, 2026-11-27) */
        FAIL_WITH(out, "the job was relaunched, not recovered in place");
    const tj_metrics_t *mt = assert_same_losses(j, ref, 3000, count(out, "(in place, at step "));
    assert_true(mt->restarts <= stage_or_shard);
    for (int s = 500; s <= 3000; s += 500)
        assert_same_checkpoint(j, ref, s);
    assert_clean(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recover_a_stage_killed_at_points_of_a_step_is_replaced_bitwise),
        cmocka_unit_test(test_recover_a_stage_gone_before_its_exit_is_reaped_is_replaced_in_place),
        cmocka_unit_test(test_recover_a_shard_killed_at_points_of_its_rounds_keeps_its_state_bitwise),
        cmocka_unit_test(test_recover_a_shard_of_one_bank_killed_in_its_update_rewinds_the_job_bitwise),
        cmocka_unit_test(test_recover_two_losses_in_a_step_and_a_loss_during_a_recovery),
        cmocka_unit_test(test_recover_a_crash_that_repeats_stops_after_max_restarts),
        cmocka_unit_test(test_recover_a_stopped_stage_or_shard_is_killed_and_replaced),
        cmocka_unit_test(test_recover_the_watchdog_dumps_and_replaces_a_wedged_stage_or_shard),
        cmocka_unit_test(test_recover_the_watchdog_replaces_a_wedged_loader),
        cmocka_unit_test(test_recover_kill_9_of_random_roles_at_random_moments_is_bitwise),
        cmocka_unit_test(test_recover_a_gpu_stage_is_replaced_with_its_peers_and_a_gpu_shard_rewinds),
        cmocka_unit_test(test_recover_a_gpu_job_rewinds_to_the_initial_weights_and_a_stage_lost_after_its_reply),
        cmocka_unit_test(test_recover_a_stopped_or_wedged_gpu_stage_is_replaced_with_its_peers),
        cmocka_unit_test(test_recover_gpu_jobs_on_the_nccl_plane_rewind_and_in_offload_mode_recover_in_place),
        cmocka_unit_test(test_recover_a_gpu_job_without_a_whole_snapshot_is_relaunched_from_disk),
        cmocka_unit_test(test_recover_offload_with_one_bank_rewinds_only_for_a_shard_lost_in_its_update),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
