/* Jobs across hosts (issue 13: stages/coord/coord_agent.c, stages/supervise/supervise.c) with real processes:
 * two "hosts" on this machine, as in test_launch_gpu (host 1's `ctitan launch` placed as under
 * srun, its segments named -h1, both on the emulated CUDA backend with the NCCL plane, loopback
 * TCP), each test's ending compared with the same job run on one host: every step's loss the
 * same bits, and nothing of either host left behind. A worker of host 1 lost rewinds the job
 * on both hosts; the coordinator killed -9 is relaunched by host 0's supervisor and host 1's
 * agent joins the new one; host 1 lost outright fails the run, whose relaunch waits for host 1
 * to be started again, or gives up after job.host_timeout_s when it never is. */
#include <dirent.h>
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

#include "checkpointd/ckpt.h"
#include "ipc/util.h"
#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("hosts"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 'h', what); }

#define QUIET "--metrics.log_freq 100000 "
#define GPU_SHAPE "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.seq_len 16 " \
                  "--training.local_batch_size 2 --job.device cuda "
/* data parallel 2 on the NCCL plane (one replica per host), no wait before a relaunch */
#define DP2 GPU_SHAPE "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_plane nccl " \
                      "--job.restart_backoff_ms 0 "
/* 4 steps, an in-memory snapshot every 2 */
#define SNAP4 DP2 "--training.steps 4 --checkpoint.snapshot_interval 2"
/* 8 steps, long enough to be killed in the middle */
#define STEPS8 DP2 "--training.steps 8"
/* checkpoints of steps 3, 6 and 7 */
#define CK7 DP2 "--training.steps 7 --checkpoint.enable true --checkpoint.interval 3"
/* parameter sharding: the two replicas one group, 3 steps, a checkpoint of the last */
#define FSDP3 GPU_SHAPE "--parallelism.data_parallel_shard_degree 2 --parallelism.data_plane nccl " \
                        "--job.restart_backoff_ms 0 --training.steps 3 --checkpoint.enable true --checkpoint.interval 3"
/* checkpoints every 3 steps of 9 */
#define CK9 DP2 "--training.steps 9 --checkpoint.enable true --checkpoint.interval 3"

/* Both hosts of h started (host 1 in the background, then host 0), once host 0's job has
 * reached step 3: a moment in the middle of a run for a test to break something. */
static void start_both(const tj_hosts_t *h, pid_t *host1, pid_t *host0)
{
    *host1 = tj_start_host1(h, "");
    *host0 = tj_launch_bg(h->j, h->extra);
    assert_true(*host0 > 0);
    assert_int_equal(tj_wait_step(h->j, 3, 60), 0);
}

static int run_one_host(const char *job, const char *base, char *out, size_t outlen)
{
    char extra[1200];
    snprintf(extra, sizeof(extra), QUIET "%s", base);
    return tj_launch("", 120, job, extra, out, outlen);
}

/* The same job on one host, run to its end (once per argument string). */
static const char *reference(const char *base) { return tj_reference('h', base, run_one_host); }

/* Waits until `file` (under the temp folder) contains `needle`; 0 or -1 after timeout_s. */
static int wait_text(const char *file, const char *needle, int timeout_s)
{
    static char buf[1 << 17];
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", tj_dir, file);
    for (int i = 0; i < timeout_s * 100; i++) {
        tu_read_file(path, buf, sizeof(buf));
        if (strstr(buf, needle))
            return 0;
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    }
    return -1;
}

/* DIR/runs/JOB/checkpoint/step-N */
static void ckpt_dir(char *buf, size_t n, const char *job, int step)
{
    char folder[256];
    snprintf(folder, sizeof(folder), "%s/runs/%s/checkpoint", tj_dir, job);
    ckpt_step_path(buf, n, folder, step);
}

/* Checkpoints a and b hold the same tensors, bit for bit (their files may be laid out
 * differently: one part per host, or one). */
static void assert_same_tensors(const char *a, const char *b)
{
    ckpt_t *ca = NULL, *cb = NULL;
    char err[512];
    if (ckpt_open(&ca, a, err, sizeof(err)) || ckpt_open(&cb, b, err, sizeof(err)))
        fail_msg("%s", err);
    const ckpt_index_t *ia = ckpt_index(ca), *ib = ckpt_index(cb);
    assert_int_equal(ia->n_tensors, ib->n_tensors);
    assert_int_equal(ia->step, ib->step);
    for (int i = 0; i < ia->n_tensors; i++) {
        const ckpt_tensor_t *t = &ia->tensors[i];
        size_t bytes = t->numel * ckpt_dtype_size(t->dtype);
        uint8_t *x = malloc(bytes ? bytes : 1), *y = malloc(bytes ? bytes : 1);
        if (ckpt_read(ca, t->name, 0, t->numel, x, err, sizeof(err)) ||
            ckpt_read(cb, t->name, 0, t->numel, y, err, sizeof(err)))
            fail_msg("%s", err);
        if (memcmp(x, y, bytes))
            fail_msg("%s differs between %s and %s", t->name, a, b);
        free(x), free(y);
    }
    ckpt_close(&ca);
    ckpt_close(&cb);
}

/* Checkpoint `step` of job holds ref's tensors, bit for bit. */
static void assert_same_step(const char *job, const char *ref, int step)
{
    char a[512], b[512];
    ckpt_dir(a, sizeof(a), job, step);
    ckpt_dir(b, sizeof(b), ref, step);
    assert_same_tensors(a, b);
}

/* The pid of the track named `name...` in trace text t (its process_name record), or -1. */
static long long track_pid(const char *t, const char *name)
{
    char want[160];
    snprintf(want, sizeof(want), "\"args\": {\"name\": \"%s", name);
    const char *at = strstr(t, want);
    if (!at)
        return -1;
    while (at > t && strncmp(at, "\"pid\": ", 7))
        at--;
    return atoll(at + 7);
}

/* A stage of host 1 killed: its agent tells the coordinator (LOST), which rewinds the job on
 * both hosts to the in-memory snapshot; host 1's agent restarts its processes there. The
 * timeline (profiling.trace_file) has host 1's stages too, on tracks named with their host,
 * their actions and the ideal ones inside the steps' rounds. */
static void test_hosts_a_stage_lost_on_another_host_is_restarted_by_its_agent(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16], agent_out[1 << 16];
    char once[128];
    tj_hosts_t h;
    const char *ref = reference(SNAP4);
    tj_two_hosts(&h, 'h', "stage", SNAP4);
    setenv("CTITAN_TEST_DIE_ONCE", tj_once_dir(once, sizeof(once), h.j), 1);
    /* replica 1 runs on host 1; in step 4, the snapshot of step 2 is whole (step 3's update
     * waited for its copy, said before it answered; in step 3 it may still be copying, and the
     * job would rightly go back to step 0) */
    setenv("CTITAN_TEST_DIE_AT", "stage.1.1:mid:4", 1);
    pid_t agent = tj_start_host1(&h, "");
    char extra[2400], trace[256];
    snprintf(trace, sizeof(trace), "%s/%s-trace.json", tj_dir, h.j);
    snprintf(extra, sizeof(extra), "%s --profiling.trace_file %s", h.extra, trace);
    int rc = tj_launch("", 120, h.j, extra, out, sizeof(out));
    int arc = tu_reap(agent, 60, NULL);
    unsetenv("CTITAN_TEST_DIE_ONCE");
    unsetenv("CTITAN_TEST_DIE_AT");
    unsetenv("CTITAN_CUDA_PLUGIN");
    static char tr[1 << 20];
    tu_read_file(trace, tr, sizeof(tr));
    long long remote = track_pid(tr, "stage rank 0 replica 1 (host 1, pid "), local = track_pid(tr, "stage rank 0 "
                                                                                                    "replica 0 (pid ");
    if (remote < (1LL << 32) || local <= 0 || local >= (1LL << 32))
        fail_msg("tracks: host 1's stage %lld, host 0's %lld, in:\n%.3000s", remote, local, tr);
    char span[128];
    for (int tid = 1; tid <= 2; tid++) { /* its actions, and the ideal ones */
        snprintf(span, sizeof(span), "\"name\": \"F0\", \"cat\": \"%s\", \"pid\": %lld, \"tid\": %d, \"ts\": ",
                 tid == 1 ? "F" : "ideal", remote, tid);
        const char *at = strstr(tr, span);
        if (!at)
            fail_msg("no %s in the trace", span);
        double ts = atof(at + strlen(span));
        assert_true(ts > 0 && ts < 120e6); /* on the run's clock: microseconds since it began */
    }
    /* the killed stage and its replacement: a track each */
    assert_int_equal(tj_count(tr, "\"args\": {\"name\": \"stage rank 1 replica 1 (host 1, pid "), 2);
    char cmd[400], said[256];
    snprintf(cmd, sizeof(cmd), "command -v python3 >/dev/null || exit 0; python3 -c 'import json, sys; "
             "json.load(open(sys.argv[1]))' %s 2>&1", trace);
    if (tu_run(cmd, said, sizeof(said))) /* one JSON array, where python3 can say */
        fail_msg("%s: %s", trace, said);
    tj_read_out(h.jh1, agent_out, sizeof(agent_out));
    if (rc || tj_count(out, "(rewound, at step 4): stage rank 1 replica 1 (pid ") != 1)
        TJ_FAIL_WITH(out, "status %d", rc);
    if (arc || !strstr(agent_out, "launch: host 1: the job was rewound to step 2: its processes started again"))
        TJ_FAIL_WITH(agent_out, "the agent: status %d", arc);
    assert_non_null(strstr(out, "was killed by signal 9 (Killed) on host 1; every stage and optimizer shard"));
    tj_assert_losses_by_step(h.j, ref, 4, 1, "\"rewound_to\": 2, \"step\": 4");
    tj_assert_clean(h.j);
    tj_assert_clean(h.jh1);
}

/* kill -9 of host 0's coordinator at step 3: its workers die with it, the supervisor relaunches
 * the job (no checkpoint: from step 0), and host 1's agent, which sees another coordinator
 * answer (or none), stops its processes and starts them again at the new run's START. */
static void test_hosts_a_killed_coordinator_is_relaunched_and_the_other_host_joins_it(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16], agent_out[1 << 16];
    tj_hosts_t h;
    const char *ref = reference(STEPS8);
    tj_two_hosts(&h, 'h', "coord", STEPS8);
    pid_t agent, host0;
    start_both(&h, &agent, &host0);
    pid_t coord = tu_descendant_named(host0, "ctitan-coord");
    assert_true(coord > 0);
    kill(coord, SIGKILL);
    int rc = tu_reap(host0, 120, NULL), arc = tu_reap(agent, 60, NULL);
    unsetenv("CTITAN_CUDA_PLUGIN");
    tj_read_out(h.j, out, sizeof(out));
    tj_read_out(h.jh1, agent_out, sizeof(agent_out));
    if (rc || tj_count(out, "\nrestart 1 (1 of job.max_restarts = 3 in a row after step 0): the coordinator was "
                            "killed by signal 9 (Killed); no checkpoint of this run: starting again from step 0") != 1)
        TJ_FAIL_WITH(out, "host 0: status %d", rc);
    if (arc || tj_count(agent_out, "processes of job") != 2 ||
        (!strstr(agent_out, "launch: host 1: another coordinator (pid ") &&
         !strstr(agent_out, "launch: host 1: the coordinator has not answered for ")))
        TJ_FAIL_WITH(agent_out, "host 1: status %d", arc);
    tj_assert_losses_by_step(h.j, ref, 8, 1, "\"scope\": \"job\"");
    tj_assert_clean(h.j);
    tj_assert_clean(h.jh1);
}

/* Host 1 lost outright (its launch killed -9, its workers with it by their parent-death
 * signal) at step 3: host 0 hears nothing from its agent (or its workers) for
 * job.heartbeat_timeout_ms and fails the run, naming the host; the relaunch waits for host 1, which is started again, and the job
 * ends as on one host. */
static void test_hosts_a_lost_host_started_again_rejoins_the_relaunched_job(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16], agent_out[1 << 16];
    tj_hosts_t h;
    const char *ref = reference(STEPS8);
    tj_two_hosts(&h, 'h', "lost", STEPS8);
    pid_t agent, host0;
    start_both(&h, &agent, &host0);
    kill(agent, SIGKILL);
    assert_true(tu_reap(agent, 30, NULL) == 128 + SIGKILL);
    char file[64];
    snprintf(file, sizeof(file), "%s.out", h.j);
    if (wait_text(file, "\nrestart 1 ", 60)) {
        tj_read_out(h.j, out, sizeof(out));
        TJ_FAIL_WITH(out, "no relaunch after host 1 was lost");
    }
    agent = tj_start_host1(&h, ""); /* the operator (or the scheduler) starts it again */
    int rc = tu_reap(host0, 120, NULL), arc = tu_reap(agent, 60, NULL);
    unsetenv("CTITAN_CUDA_PLUGIN");
    tj_read_out(h.j, out, sizeof(out));
    tj_read_out(h.jh1, agent_out, sizeof(agent_out));
    /* found by the agent's silence, or by its workers' (a rewind that cannot reach the agent) */
    if (rc || !strstr(out, "host 1's agent (pid ") || !strstr(out, "the host is lost or cut off"))
        TJ_FAIL_WITH(out, "host 0: status %d", rc);
    if (arc)
        TJ_FAIL_WITH(agent_out, "host 1 started again: status %d", arc);
    const tj_metrics_t *mt = tj_assert_losses_by_step(h.j, ref, 8, 1, "\"scope\": \"job\"");
    assert_non_null(strstr(mt->restart[0], "\"role\": \"coordinator\""));
    assert_non_null(strstr(mt->restart[0], "host 1's agent"));
    tj_assert_clean(h.j);
    tj_assert_clean(h.jh1);
}

/* Host 1 lost and never started again: each relaunch waits job.host_timeout_s (2 s) for it and
 * fails saying so; after job.max_restarts (1) the launch gives up with status 1 and the reason. */
static void test_hosts_a_host_that_never_comes_back_ends_the_job_after_max_restarts(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16];
    tj_hosts_t h;
    tj_two_hosts(&h, 'h', "gone", STEPS8 " --job.host_timeout_s 2 --job.max_restarts 1");
    pid_t agent, host0;
    start_both(&h, &agent, &host0);
    kill(agent, SIGKILL);
    assert_true(tu_reap(agent, 30, NULL) == 128 + SIGKILL);
    int rc = tu_reap(host0, 120, NULL);
    unsetenv("CTITAN_CUDA_PLUGIN");
    tj_read_out(h.j, out, sizeof(out));
    if (rc != 1 || tj_count(out, "\nrestart ") != 1 ||
        !strstr(out, "the agent of host 1 did not connect to tcp://127.0.0.1:") ||
        !strstr(out, "in 2 s (job.host_timeout_s)") || !strstr(out, "giving up after 1 restart in a row"))
        TJ_FAIL_WITH(out, "host 0: status %d", rc);
    tj_assert_clean(h.j);
    assert_int_equal(tj_job_procs(h.jh1), 0); /* host 1 died outright: its segments are the next launch's */
    tj_remove_leftovers(h.jh1);
}

/* Host 0 lost outright (its launch and its coordinator killed -9, the workers dying with it):
 * host 1's agent stops its processes, waits job.host_timeout_s (2 s) for a coordinator, then
 * gives up with status 1, saying so, and leaves nothing behind. */
static void test_hosts_an_agent_without_a_coordinator_gives_up_after_host_timeout(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char agent_out[1 << 16];
    tj_hosts_t h;
    tj_two_hosts(&h, 'h', "nocoord", STEPS8 " --job.host_timeout_s 2");
    pid_t agent, host0;
    start_both(&h, &agent, &host0);
    /* host 0 killed outright, its coordinator too: stopped first, so that it does not take its
     * launcher's death as a stop (which ends the other hosts in order) */
    pid_t coord = tu_descendant_named(host0, "ctitan-coord");
    assert_true(coord > 0);
    kill(coord, SIGSTOP);
    kill(host0, SIGKILL);
    tu_reap(host0, 30, NULL);
    kill(coord, SIGKILL);
    double t0 = util_now();
    int arc = tu_reap(agent, 60, NULL);
    double waited = util_now() - t0;
    unsetenv("CTITAN_CUDA_PLUGIN");
    tj_read_out(h.jh1, agent_out, sizeof(agent_out));
    if (arc != 1 || !strstr(agent_out, "its processes stopped; waiting up to 2 s (job.host_timeout_s)") ||
        !strstr(agent_out, "started the job in 2 s (job.host_timeout_s): giving up"))
        TJ_FAIL_WITH(agent_out, "host 1: status %d", arc);
    print_message("host 1 gave up %.1f s after host 0 was killed\n", waited);
    tj_assert_clean(h.jh1);
    assert_int_equal(tj_job_procs(h.j), 0); /* host 0 died outright: its segments are the next launch's */
    tj_remove_leftovers(h.j);
}

/* Checkpoints across hosts: every host writes its part (its shards' slices) into one temporary
 * directory of the folder both see, host 0 commits the index over them. Each checkpoint is
 * whole (ctitan ckpt verify), holds the same tensors as the one-host job's, and a one-host run
 * resumes from it with the same losses. */
static void test_hosts_checkpoints_are_written_in_parts_and_resume_on_one_host(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16], agent_out[1 << 16];
    char cmd[2048], path[512], ref_path[512], names[16][64], r1[32], extra[2400];
    tj_hosts_t h;
    const char *ref = reference(CK7);
    tj_two_hosts(&h, 'h', "ckpt", CK7);
    int arc, rc = tj_run_both(&h, out, sizeof(out), agent_out, sizeof(agent_out), &arc);
    if (rc || !strstr(out, "checkpoint: step 3 saved to ") || !strstr(out, "checkpoint: step 6 saved to ") ||
        !strstr(out, "checkpoint: step 7 saved to "))
        TJ_FAIL_WITH(out, "host 0: status %d", rc);
    if (arc)
        TJ_FAIL_WITH(agent_out, "host 1: status %d", arc);
    tj_assert_losses_by_step(h.j, ref, 7, 0, "");
    for (int step = 3; step <= 7; step += step == 6 ? 1 : 3) {
        ckpt_dir(path, sizeof(path), h.j, step);
        ckpt_dir(ref_path, sizeof(ref_path), ref, step);
        snprintf(cmd, sizeof(cmd), "%s ckpt verify %s 2>&1 && ls %s", tu_ctitan(), path, path);
        if (tu_run(cmd, out, sizeof(out)))
            TJ_FAIL_WITH(out, "%s does not verify", path);
        /* one data file per array and host, the index; no part checksums left */
        int n = 0;
        for (char *t = strtok(strstr(out, "exp_avg") ? strstr(out, "exp_avg") : out, "\n"); t && n < 16;
             t = strtok(NULL, "\n"))
            snprintf(names[n++], sizeof(names[0]), "%s", t);
        assert_int_equal(n, 7);
        assert_string_equal(names[0], "exp_avg.h0.bin");
        assert_string_equal(names[1], "exp_avg.h1.bin");
        assert_string_equal(names[4], "index");
        assert_string_equal(names[5], "model.h0.bin");
        assert_string_equal(names[6], "model.h1.bin");
        assert_same_tensors(path, ref_path);
    }
    /* a one-host run from the two hosts' checkpoint of step 6: step 7 as the reference */
    job_name(r1, sizeof(r1), "ckone");
    ckpt_dir(path, sizeof(path), h.j, 6);
    snprintf(extra, sizeof(extra), QUIET CK7 " --checkpoint.load %s", path);
    rc = tj_launch("", 120, r1, extra, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc || !strstr(out, "checkpoint: resuming from "))
        TJ_FAIL_WITH(out, "the one-host resume: status %d", rc);
    static tj_metrics_t a, b;
    tj_parse_metrics(ref, &a);
    tj_parse_metrics(r1, &b);
    assert_int_equal(b.n, 1);
    assert_int_equal(b.step[0], 7);
    assert_string_equal(b.loss[0], a.loss[6]);
    tj_assert_clean(h.j);
    tj_assert_clean(h.jh1);
    tj_assert_clean(r1);
}

/* Parameter sharding across hosts: the two members of one group on two hosts (their
 * communicators span them), each keeping its chunk of the weights and gradients; the losses and
 * the checkpoint (written in parts, one a host) are those of the same job on one host, bit for bit. */
static void test_hosts_a_sharded_group_across_two_hosts_trains_as_on_one(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16], agent_out[1 << 16];
    char path[512], ref_path[512];
    tj_hosts_t h;
    const char *ref = reference(FSDP3);
    tj_two_hosts(&h, 'h', "fsdp", FSDP3);
    int arc, rc = tj_run_both(&h, out, sizeof(out), agent_out, sizeof(agent_out), &arc);
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc || !strstr(out, "(weights and gradients sharded: FSDP)"))
        TJ_FAIL_WITH(out, "host 0: status %d", rc);
    if (arc)
        TJ_FAIL_WITH(agent_out, "host 1: status %d", arc);
    tj_assert_losses_by_step(h.j, ref, 3, 0, "");
    ckpt_dir(path, sizeof(path), h.j, 3);
    ckpt_dir(ref_path, sizeof(ref_path), ref, 3);
    assert_same_tensors(path, ref_path);
    tj_assert_clean(h.j);
    tj_assert_clean(h.jh1);
}

/* kill -9 of host 0's coordinator once the checkpoint of step 6 is saved: the relaunch resumes
 * from the newest checkpoint (6, or 9 when the kill came late), and host 1's agent loads the
 * same directory (START names it) before it starts its processes again. */
static void test_hosts_a_killed_coordinator_resumes_every_host_from_the_newest_checkpoint(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16], agent_out[1 << 16];
    char file[64];
    tj_hosts_t h;
    const char *ref = reference(CK9);
    tj_two_hosts(&h, 'h', "ckcoord", CK9);
    pid_t agent = tj_start_host1(&h, "");
    pid_t host0 = tj_launch_bg(h.j, h.extra);
    snprintf(file, sizeof(file), "%s.out", h.j);
    assert_int_equal(wait_text(file, "checkpoint: step 6 saved", 60), 0);
    pid_t coord = tu_descendant_named(host0, "ctitan-coord");
    assert_true(coord > 0);
    kill(coord, SIGKILL);
    int rc = tu_reap(host0, 120, NULL), arc = tu_reap(agent, 60, NULL);
    unsetenv("CTITAN_CUDA_PLUGIN");
    tj_read_out(h.j, out, sizeof(out));
    tj_read_out(h.jh1, agent_out, sizeof(agent_out));
    const char *resumed = strstr(out, "killed by signal 9 (Killed); resuming after step ");
    if (rc || tj_count(out, "\nrestart ") != 1 || !resumed)
        TJ_FAIL_WITH(out, "host 0: status %d", rc);
    int from = atoi(resumed + strlen("killed by signal 9 (Killed); resuming after step "));
    assert_true(from == 6 || from == 9);
    char want[160];
    snprintf(want, sizeof(want), "launch: host 1: checkpoint of step %d loaded", from);
    if (arc || !strstr(agent_out, want))
        TJ_FAIL_WITH(agent_out, "host 1: status %d", arc);
    const tj_metrics_t *mt = tj_assert_losses_by_step(h.j, ref, 9, 1, "\"scope\": \"job\"");
    char resume[64];
    snprintf(resume, sizeof(resume), "\"resume_step\": %d", from);
    assert_non_null(strstr(mt->restart[0], resume));
    tj_assert_clean(h.j);
    tj_assert_clean(h.jh1);
}

/* A part's writer killed as it writes (host 1's checkpointd --save-part, slowed by
 * CTITAN_TEST_CKPT_DELAY_MS): its agent writes the part again, and the checkpoint is whole. */
static void test_hosts_a_part_writer_killed_mid_write_writes_its_part_again(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16], agent_out[1 << 16];
    tj_hosts_t h;
    const char *ref = reference(CK7);
    tj_two_hosts(&h, 'h', "ckpart", CK7);
    setenv("CTITAN_TEST_CKPT_DELAY_MS", "400", 1); /* host 1's writer only: a pause after each file */
    pid_t agent = tj_start_host1(&h, "");
    unsetenv("CTITAN_TEST_CKPT_DELAY_MS");
    pid_t host0 = tj_launch_bg(h.j, h.extra), writer = 0;
    for (int i = 0; i < 6000 && !writer; i++) {
        writer = tu_descendant_named(agent, "checkpointd");
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    }
    assert_true(writer > 0);
    nanosleep(&(struct timespec){0, 200000000L}, NULL); /* inside its first file */
    kill(writer, SIGKILL);
    int rc = tu_reap(host0, 120, NULL), arc = tu_reap(agent, 60, NULL);
    unsetenv("CTITAN_CUDA_PLUGIN");
    tj_read_out(h.j, out, sizeof(out));
    tj_read_out(h.jh1, agent_out, sizeof(agent_out));
    if (rc || !strstr(out, "checkpoint: step 3 saved to ") || strstr(out, "failed"))
        TJ_FAIL_WITH(out, "host 0: status %d", rc);
    if (arc || !strstr(agent_out, "launch: host 1: the writer of its part of the checkpoint of step 3 was killed by "
                                  "signal 9 (Killed): writing it again"))
        TJ_FAIL_WITH(agent_out, "host 1: status %d", arc);
    tj_assert_losses_by_step(h.j, ref, 7, 0, "");
    assert_same_step(h.j, ref, 3);
    tj_assert_clean(h.j);
    tj_assert_clean(h.jh1);
}

/* Host 0's checkpointd killed while it writes its part (slowed by CTITAN_TEST_CKPT_DELAY_MS on
 * host 0 only): the coordinator starts another, and the checkpoint is written again, every
 * host's part, into a directory named for the new one; whatever the first attempt's parts
 * said is dropped, and the checkpoint holds the one-host job's tensors. */
static void test_hosts_checkpointd_killed_mid_part_writes_the_checkpoint_again(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16], agent_out[1 << 16];
    tj_hosts_t h;
    const char *ref = reference(CK7);
    tj_two_hosts(&h, 'h', "ckd0", CK7);
    pid_t agent = tj_start_host1(&h, "");
    setenv("CTITAN_TEST_CKPT_DELAY_MS", "400", 1); /* host 0's checkpointd only */
    pid_t host0 = tj_launch_bg(h.j, h.extra), ckptd = 0;
    unsetenv("CTITAN_TEST_CKPT_DELAY_MS");
    char folder[300];
    snprintf(folder, sizeof(folder), "%s/runs/%s/checkpoint", tj_dir, h.j);
    for (int i = 0; i < 6000 && !ckptd; i++) { /* part 0 of step 3 being written (for 1.2 s) */
        DIR *d = opendir(folder);
        struct dirent *e;
        while (d && (e = readdir(d)) && !ckptd)
            if (!strncmp(e->d_name, ".tmp-step-00000003.", 19))
                ckptd = atoi(e->d_name + 19); /* the directory is named for its checkpointd */
        if (d)
            closedir(d);
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    }
    assert_true(ckptd > 0);
    assert_int_equal(tu_descendant_named(host0, "checkpointd"), ckptd);
    kill(ckptd, SIGKILL);
    int rc = tu_reap(host0, 120, NULL), arc = tu_reap(agent, 60, NULL);
    unsetenv("CTITAN_CUDA_PLUGIN");
    tj_read_out(h.j, out, sizeof(out));
    tj_read_out(h.jh1, agent_out, sizeof(agent_out));
    if (rc || !strstr(out, "checkpointd was killed by signal 9 (Killed) while writing the checkpoint of step 3: a new "
                           "checkpointd writes it again") ||
        !strstr(out, "checkpoint: step 3 saved to ") || strstr(out, "checkpoint of step 3 failed"))
        TJ_FAIL_WITH(out, "host 0: status %d", rc);
    if (arc)
        TJ_FAIL_WITH(agent_out, "host 1: status %d", arc);
    tj_assert_losses_by_step(h.j, ref, 7, 0, "");
    for (int step = 3; step <= 7; step += step == 6 ? 1 : 3)
        assert_same_step(h.j, ref, step);
    tj_assert_clean(h.j);
    tj_assert_clean(h.jh1);
}

/* checkpoint.folder not one folder for both hosts (host 1 writes its part elsewhere): every
 * checkpoint fails naming the missing part and the shared folder it needs, and the run fails
 * at its end (its last checkpoint not written); with job.max_restarts 0 nothing relaunches it,
 * and host 0's supervisor tells host 1's agent so (GIVEN_UP, coord_farewell): the agent exits
 * 1 at once, saying why, not after job.host_timeout_s (100 s here). */
static void test_hosts_a_checkpoint_folder_not_shared_fails_saying_so(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16], agent_out[1 << 16];
    char elsewhere[300];
    tj_hosts_t h;
    tj_two_hosts(&h, 'h', "ckapart", CK7 " --job.max_restarts 0 --job.host_timeout_s 100");
    snprintf(elsewhere, sizeof(elsewhere), "--checkpoint.folder %s/elsewhere-%s", tj_dir, h.j);
    pid_t agent = tj_start_host1(&h, elsewhere);
    int rc = tj_launch("", 120, h.j, h.extra, out, sizeof(out));
    double t0 = util_now();
    int arc = tu_reap(agent, 60, NULL);
    double waited = util_now() - t0;
    unsetenv("CTITAN_CUDA_PLUGIN");
    tj_read_out(h.jh1, agent_out, sizeof(agent_out));
    if (rc != 1 || tj_count(out, "part-1.xxh: missing: part 1 of 2 was not written (or not to its end, or not here: "
                                 "every host must see checkpoint.folder as one shared folder)") < 3 ||
        !strstr(out, "the checkpoint of step 7, the last, was not written") || strstr(out, "saved to"))
        TJ_FAIL_WITH(out, "host 0: status %d", rc);
    print_message("host 1 exited %.1f s after host 0's launch\n", waited);
    if (arc != 1 || waited > 20 || !strstr(agent_out, "host 0 gave the job up, no coordinator will come: not "
                                                      "relaunched after: "))
        TJ_FAIL_WITH(agent_out, "host 1: status %d after %.1f s", arc, waited);
    tj_assert_clean(h.j);
    tj_assert_clean(h.jh1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hosts_a_stage_lost_on_another_host_is_restarted_by_its_agent),
        cmocka_unit_test(test_hosts_a_killed_coordinator_is_relaunched_and_the_other_host_joins_it),
        cmocka_unit_test(test_hosts_a_lost_host_started_again_rejoins_the_relaunched_job),
        cmocka_unit_test(test_hosts_a_host_that_never_comes_back_ends_the_job_after_max_restarts),
        cmocka_unit_test(test_hosts_an_agent_without_a_coordinator_gives_up_after_host_timeout),
        cmocka_unit_test(test_hosts_checkpoints_are_written_in_parts_and_resume_on_one_host),
        cmocka_unit_test(test_hosts_a_sharded_group_across_two_hosts_trains_as_on_one),
        cmocka_unit_test(test_hosts_a_killed_coordinator_resumes_every_host_from_the_newest_checkpoint),
        cmocka_unit_test(test_hosts_a_part_writer_killed_mid_write_writes_its_part_again),
        cmocka_unit_test(test_hosts_checkpointd_killed_mid_part_writes_the_checkpoint_again),
        cmocka_unit_test(test_hosts_a_checkpoint_folder_not_shared_fails_saying_so),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
