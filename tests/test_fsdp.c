/* Parameter sharding (parallelism.data_parallel_shard_degree, stages/runtime/fsdp.c) with real
 * processes: a group of S replicas computing on one shared copy of the weights and gradients
 * trains like S unsharded replicas, holds 1/S of their params and grads segments, writes the same
 * checkpoints, recovers in place from kill -9 bitwise, and is refused where it is not built; on
 * the emulated GPU (tests/cudasim), the NCCL data plane's sharding (test 6).
 * Which jobs run (all of manifests/tiny.toml, 4 or 6 steps; 2 cores, so at most 8 stages a job):
 * pipeline 1 with 1 microbatch, where the exchange adds the replicas' gradients in the order the
 * optimizer shards add unsharded copies: S2 against R2 and S4 against R4 bitwise, S2 x R2 against
 * R4 within 1e-6 (its shards add two sums of two: another order); pipeline 2 with 2 microbatches
 * (the exchange adds per microbatch: another order) S2 against R2, S4 and S2 x R2 against R4
 * within 1e-6. S4 x R2 (8 replicas, 16 stages at pipeline 2) is left out: it adds no order of sums
 * that S4 and S2 x R2 do not, and would oversubscribe two cores eight times. The runs are made
 * once (reference()); the pipeline-1 ones write checkpoints, which the resume test reads. The
 * program takes ~6 s on two cores (~9 s under ASan + UBSan). */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "ipc/shm.h"
#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("fsdp"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 'f', what); }

#define QUIET "--metrics.log_freq 100000 "
#define SHARD "--parallelism.data_parallel_shard_degree "
#define REPL "--parallelism.data_parallel_replicate_degree "
/* pipeline 1, 1 microbatch, a checkpoint every 2 steps (test 3 reads them) */
#define PP1 "--training.steps 4 --parallelism.pipeline_parallel_degree 1 --parallelism.pipeline_parallel_microbatches 1 " \
            "--checkpoint.enable true --checkpoint.interval 2 "
/* the manifest's pipeline 2, 2 microbatches */
#define PP2 "--training.steps 4 "
#define MB4 "--parallelism.pipeline_parallel_microbatches 4 --loader.prefetch 2 "

/* Runs job to its end; its output in out, nothing of it left once it succeeded. */
static int run_clean(const char *job, const char *extra, char *out, size_t outlen)
{
    char args[2048];
    snprintf(args, sizeof(args), QUIET "%s", extra);
    int rc = tj_launch("", 120, job, args, out, outlen);
    if (!rc)
        tj_assert_clean(job);
    return rc;
}

/* The same, which must end with status 0. */
static void run_ok(const char *job, const char *extra, char *out, size_t outlen)
{
    int rc = run_clean(job, extra, out, outlen);
    if (rc)
        TJ_FAIL_WITH(out, "%s: status %d", job, rc);
}

/* The run of these arguments (made once per argument string, shared between the tests). */
static const char *reference(const char *extra) { return tj_reference('f', extra, run_clean); }

/* Every step of `job` from `from` on has the loss of `ref` at that step: the same string
 * (rtol 0) or within rtol of it. Returns the largest relative difference. */
static double assert_losses(const char *job, const char *ref, int from, int last, double rtol)
{
    static tj_metrics_t a, b;
    tj_parse_metrics(ref, &a);
    tj_parse_metrics(job, &b);
    double worst = 0;
    int seen = 0;
    for (int s = from; s <= last; s++) {
        const char *la = NULL, *lb = NULL;
        for (int i = 0; i < a.n; i++)
            la = a.step[i] == s ? a.loss[i] : la;
        for (int i = 0; i < b.n; i++)
            lb = b.step[i] == s ? b.loss[i] : lb;
        if (!la || !lb)
            fail_msg("step %d: missing in %s or %s", s, ref, job);
        double x = atof(la), y = atof(lb), d = fabs(x - y) / fabs(x);
        worst = d > worst ? d : worst;
        if (rtol == 0 ? strcmp(la, lb) != 0 : !(d <= rtol))
            fail_msg("step %d: %s has loss %s, %s %s (relative %.3g, allowed %.3g)", s, job, lb, ref, la, d, rtol);
        seen++;
    }
    assert_int_equal(seen, last - from + 1);
    return worst;
}

/* ---- 1. losses ---- */

/* S replicas sharing one copy train like S unsharded replicas: bitwise where the sums are
 * ordered alike (pipeline 1, 1 microbatch, no replication), within 1e-6 elsewhere. */
static void test_fsdp_cpu_sharded_losses_match_the_unsharded_job(void **state)
{
    TU_NEED_BIN();
    static const struct {
        const char *what, *sharded, *unsharded;
        double rtol;
    } cases[] = {
        {"pp 1: S2 vs R2", PP1 SHARD "2", PP1 REPL "2", 0},
        {"pp 1: S4 vs R4", PP1 SHARD "4", PP1 REPL "4", 0},
        {"pp 1: S2 x R2 vs R4", PP1 SHARD "2 " REPL "2", PP1 REPL "4", 1e-6},
        {"pp 2: S2 vs R2", PP2 SHARD "2", PP2 REPL "2", 1e-6},
        {"pp 2: S4 vs R4", PP2 SHARD "4", PP2 REPL "4", 1e-6},
        {"pp 2: S2 x R2 vs R4", PP2 SHARD "2 " REPL "2", PP2 REPL "4", 1e-6},
        /* more microbatches than the loader's prefetch: the replicas, which wait for each other in
         * every backward, must each find their whole step in their rings (the loader fills one
         * replica's step before the next's; with 2 slots this hung) */
        {"pp 2, 4 microbatches, prefetch 2: S2 vs R2", PP2 MB4 SHARD "2", PP2 MB4 REPL "2", 1e-6},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *s = reference(cases[i].sharded), *u = reference(cases[i].unsharded);
        double d = assert_losses(s, u, 1, 4, cases[i].rtol);
        print_message("%-20s: largest relative difference of a loss %.3g (allowed %.3g)\n", cases[i].what, d,
                      cases[i].rtol);
    }
}

/* ---- 2. memory ---- */

static long long s2_fsdp_bytes; /* the S2 job's exchange (fp32), measured in test 2 (test 7 compares) */

typedef struct {
    long long size, resident; /* st_size, st_blocks * 512 */
} seg_bytes_t;

static seg_bytes_t seg_bytes(const char *job, const char *what)
{
    char path[256];
    struct stat sb;
    snprintf(path, sizeof(path), "/dev/shm/ctitan.%s.%s", job, what);
    if (stat(path, &sb))
        return (seg_bytes_t){-1, -1};
    return (seg_bytes_t){(long long)sb.st_size, (long long)sb.st_blocks * 512};
}

#define MAX_STAGES 8

/* The RssAnon (kB) of each stage process of job, by replica * pp + rank; returns how many. */
static int stage_rss(const char *job, int pp, long long *rss)
{
    char want[128], path[300], buf[16384];
    int wl = snprintf(want, sizeof(want), "CTITAN_JOB=%s", job) + 1, n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/comm", e->d_name);
        buf[0] = 0;
        tu_read_file(path, buf, sizeof(buf));
        if (strcmp(buf, "ctitan-stage\n"))
            continue;
        snprintf(path, sizeof(path), "/proc/%s/environ", e->d_name);
        FILE *f = fopen(path, "r");
        size_t k = f ? fread(buf, 1, sizeof(buf), f) : 0, i = 0;
        if (f)
            fclose(f);
        while (i + (size_t)wl <= k && memcmp(buf + i, want, (size_t)wl))
            i += strnlen(buf + i, k - i) + 1;
        if (i + (size_t)wl > k)
            continue;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        f = fopen(path, "r");
        k = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        int rank = -1, replica = -1;
        for (i = 0; i < k; i += strnlen(buf + i, k - i) + 1) {
            if (!strcmp(buf + i, "--rank") && i + 7 < k)
                rank = atoi(buf + i + 7);
            if (!strcmp(buf + i, "--replica") && i + 10 < k)
                replica = atoi(buf + i + 10);
        }
        snprintf(path, sizeof(path), "/proc/%s/status", e->d_name);
        buf[0] = 0;
        tu_read_file(path, buf, sizeof(buf));
        char *p = strstr(buf, "RssAnon:");
        int at = replica * pp + rank;
        if (p && rank >= 0 && replica >= 0 && at < MAX_STAGES) {
            rss[at] = atoll(p + 8);
            n++;
        }
    }
    closedir(d);
    return n;
}

typedef struct {
    seg_bytes_t params, grads, fsdp;
    long long rss[MAX_STAGES];
    int stages;
} job_mem_t;

/* Starts job (training for long), measures it at step 3, stops it (SIGINT) and checks that
 * nothing of it is left. */
static void measure(const char *job, const char *extra, int pp, job_mem_t *m)
{
    char args[1024], out[8192];
    snprintf(args, sizeof(args), QUIET "--training.steps 100000 %s", extra);
    pid_t pid = tj_launch_bg(job, args);
    assert_true(pid > 0);
    int rc = tj_wait_step(job, 3, 60);
    memset(m, 0, sizeof(*m));
    if (!rc) {
        m->params = seg_bytes(job, "params");
        m->grads = seg_bytes(job, "grads");
        m->fsdp = seg_bytes(job, "fsdp");
        m->stages = stage_rss(job, pp, m->rss);
    }
    kill(pid, SIGINT);
    int status = tu_reap(pid, 30, NULL);
    tj_read_out(job, out, sizeof(out));
    if (rc || status != 130)
        TJ_FAIL_WITH(out, "%s: %s, status %d after SIGINT", job, rc ? "no step 3 within 60 s" : "measured", status);
    tj_assert_clean(job);
}

/* The params and grads segments of S replicas sharing a copy are 1/S of the unsharded job's
 * (stat of the tmpfs files while the jobs run: size and resident bytes); the only new shared
 * memory is the exchange (the fsdp segment), and no stage holds more private memory (RssAnon)
 * than its unsharded counterpart plus that exchange's size. */
static void test_fsdp_cpu_params_and_grads_segments_are_one_over_s(void **state)
{
    TU_NEED_BIN();
    static const struct {
        const char *sharded, *unsharded;
        int S, dp;
    } cases[] = {{SHARD "2", REPL "2", 2, 2}, {SHARD "4", REPL "4", 4, 4}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char js[32], ju[32];
        job_name(js, sizeof(js), c ? "mems4" : "mems2");
        job_name(ju, sizeof(ju), c ? "memr4" : "memr2");
        static job_mem_t s, u;
        measure(ju, cases[c].unsharded, 2, &u);
        measure(js, cases[c].sharded, 2, &s);
        int S = cases[c].S, n = cases[c].dp * 2;
        assert_int_equal(u.stages, n);
        assert_int_equal(s.stages, n);
        assert_int_equal(u.fsdp.size, -1); /* no exchange without sharding */
        assert_true(s.fsdp.size > 0);
        const struct {
            const char *what;
            seg_bytes_t a, b;
        } segs[] = {{"params", s.params, u.params}, {"grads", s.grads, u.grads}};
        for (int i = 0; i < 2; i++) {
            print_message("S=%d vs R=%d: %s %lld bytes (%lld resident) vs %lld (%lld resident)\n", S, S, segs[i].what,
                          segs[i].a.size, segs[i].a.resident, segs[i].b.size, segs[i].b.resident);
            double r = (double)segs[i].a.size / (double)segs[i].b.size;
            double q = (double)segs[i].a.resident / (double)segs[i].b.resident;
            if (!(r >= 0.9 / S && r <= 1.1 / S) || !(q >= 0.9 / S && q <= 1.1 / S))
                fail_msg("%s: sharded/unsharded = %.3f (resident %.3f), expected about 1/%d", segs[i].what, r, q, S);
        }
        print_message("S=%d: the fsdp segment %lld bytes (%lld resident)\n", S, s.fsdp.size, s.fsdp.resident);
        if (S == 2)
            s2_fsdp_bytes = s.fsdp.size;
        /* RssAnon (private memory: the weights and gradients live in shared memory) is steady in
         * the plain build, the same to a few kB over runs, but under ASan it swings by ~250 kB (its
         * quarantine and shadow): no more than the unsharded stage's with 10% and the exchange's
         * size as slack. At this model's size that slack would hide a private copy of a stage's
         * weights (~170 kB): the segments above are the measure; this only bounds the rest */
        for (int r = 0; r < 2; r++)
            for (int d = 0; d < cases[c].dp; d++) {
                long long a = s.rss[d * 2 + r], b = u.rss[d * 2 + r];
                print_message("S=%d vs R=%d: stage rank %d replica %d RssAnon %lld kB vs %lld kB\n", S, S, r, d, a, b);
                assert_true(a > 0 && b > 0);
                if (a * 1024.0 > b * 1024.0 * 1.1 + (double)s.fsdp.size)
                    fail_msg("stage rank %d replica %d: RssAnon %lld kB sharded, %lld kB unsharded (+ 10%% and %lld "
                             "bytes of exchange allowed)", r, d, a, b, s.fsdp.size);
            }
    }
}

/* ---- 3. checkpoints ---- */

/* Whether file `name` of checkpoint `step` of jobs a and b holds the same bytes. */
static void assert_same_file(const char *a, const char *b, int step, const char *name)
{
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof(cmd), "cmp %s/runs/%s/checkpoint/step-%08d/%s %s/runs/%s/checkpoint/step-%08d/%s 2>&1",
             tj_dir, a, step, name, tj_dir, b, step, name);
    if (tu_run(cmd, out, sizeof(out)))
        fail_msg("%s", out);
}

static void assert_same_checkpoint(const char *a, const char *b, int step)
{
    static const char *files[] = {"model.bin", "exp_avg.bin", "exp_avg_sq.bin"};
    for (int i = 0; i < 3; i++)
        assert_same_file(a, b, step, files[i]);
}

static void verify_ok(const char *job, int step)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof(cmd), "%s ckpt verify %s/runs/%s/checkpoint/step-%08d 2>&1", tu_ctitan(), tj_dir, job, step);
    if (tu_run(cmd, out, sizeof(out)))
        TJ_FAIL_WITH(out, "ckpt verify of %s step %d failed", job, step);
}

/* An S=2 job and an unsharded R=2 job (pipeline 1, 1 microbatch: bitwise equal) write the same
 * checkpoint bytes; the S=2 checkpoint resumed at S=2 continues exactly as the uninterrupted
 * run, and resumed at S=4 exactly as at R=4 (same checkpoint, same order of sums). */
static void test_fsdp_cpu_checkpoints_resume_at_another_degree_bitwise(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    const char *s2 = reference(PP1 SHARD "2"), *r2 = reference(PP1 REPL "2");
    for (int step = 2; step <= 4; step += 2) {
        assert_same_checkpoint(s2, r2, step);
        verify_ok(s2, step);
    }
    char extra[1024], j2[32], j4[32], jr4[32];
    job_name(j2, sizeof(j2), "ress2");
    job_name(j4, sizeof(j4), "ress4");
    job_name(jr4, sizeof(jr4), "resr4");
    snprintf(extra, sizeof(extra), PP1 SHARD "2 --checkpoint.load %s/runs/%s/checkpoint/step-00000002", tj_dir, s2);
    run_ok(j2, extra, out, sizeof(out));
    assert_non_null(strstr(out, "resuming from"));
    assert_losses(j2, s2, 3, 4, 0);
    assert_same_checkpoint(j2, s2, 4);
    snprintf(extra, sizeof(extra), PP1 SHARD "4 --checkpoint.load %s/runs/%s/checkpoint/step-00000002", tj_dir, s2);
    run_ok(j4, extra, out, sizeof(out));
    assert_non_null(strstr(out, "resuming from"));
    snprintf(extra, sizeof(extra), PP1 REPL "4 --checkpoint.load %s/runs/%s/checkpoint/step-00000002", tj_dir, s2);
    run_ok(jr4, extra, out, sizeof(out));
    assert_losses(j4, jr4, 3, 4, 0);
    assert_same_checkpoint(j4, jr4, 4);
    verify_ok(j4, 4);
}

/* ---- 4. kill -9 ---- */

/* Sharded stages killed -9 at each point of a step (pipeline 2: as it begins, mid-step, at its
 * end, after their reply), an optimizer shard in its REDUCE (it sums the copies), and a stage
 * killed while its group's other member waits for its gradients in the exchange (pipeline 1, 1
 * microbatch: it dies after its forward, and its peer cannot finish the backward without its
 * gradients and has no ring to wait on, so only the coordinator closing the exchange ends that
 * wait; the peer says it left the step), whose replacement is killed too as it sets up; the same
 * under ZBVZeroBubble (two chunks per stage: two exchanges each); and a sharded stage wedged
 * mid-step (CTITAN_TEST_HANG_AT) while its peer waits in the exchange: the step watchdog replaces
 * the wedged one only (the waiting peer made no progress either, but it said it waits). Each loss
 * is recovered in place, every stage redoes the step, and every loss is bitwise the undisturbed
 * run's. */
static void test_fsdp_cpu_a_sharded_stage_killed_is_replaced_bitwise(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
#define S2PP2 "--training.steps 6 " SHARD "2"
#define S2PP1 S2PP2 " --parallelism.pipeline_parallel_degree 1 --parallelism.pipeline_parallel_microbatches 1"
#define S2ZBV S2PP2 " --parallelism.pipeline_parallel_schedule ZBVZeroBubble --parallelism.pipeline_parallel_microbatches 4"
    static const struct {
        const char *args, *ref, *die, *hang;
        int recoveries, left; /* "(in place, at step " lines; least "left unfinished" lines */
    } cases[] = {
        {S2PP2, S2PP2, "stage.1.1:done:2,stage.0.1:mid:3,optshard.1.0:reduce:4,stage.1.0:end:5,stage.0.0:begin:6", "",
         5, 0},
        {S2PP1, S2PP1, "stage.0.1:mid:2,stage.0.1:setup:2,stage.0.0:mid:4", "", 2, 2},
        {S2ZBV, S2ZBV, "stage.0.1:mid:2,stage.1.0:mid:3,stage.1.1:end:4", "", 3, 0},
        {S2PP1 " --job.watchdog_s 2", S2PP1, "", "stage.0.1:mid:3", 1, 1},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char j[32], what[16], env[1024], once[128], args[2048];
        snprintf(what, sizeof(what), "kill%zu", c);
        job_name(j, sizeof(j), what);
        const char *ref = reference(cases[c].ref);
        snprintf(env, sizeof(env), "CTITAN_LOG=info CTITAN_TEST_DIE_ONCE=%s CTITAN_TEST_DIE_AT=%s CTITAN_TEST_HANG_AT=%s",
                 tj_once_dir(once, sizeof(once), j), cases[c].die, cases[c].hang);
        snprintf(args, sizeof(args), QUIET "%s", cases[c].args);
        int rc = tj_launch(env, 120, j, args, out, sizeof(out));
        if (rc || tj_count(out, "(in place, at step ") != cases[c].recoveries ||
            tj_count(out, " left unfinished: ") < cases[c].left)
            TJ_FAIL_WITH(out, "%s: status %d, %d recoveries, %d stages left a step", j, rc,
                         tj_count(out, "(in place, at step "), tj_count(out, " left unfinished: "));
        tj_assert_losses_by_step(j, ref, 6, cases[c].recoveries, "\"scope\": \"process\"");
        if (c == 1) {
            assert_non_null(strstr(out, "] I step 2 left unfinished: "));
            assert_non_null(strstr(out, "] I step 4 left unfinished: "));
            assert_int_equal(tj_count(out, "(1 more lost during the recovery)"), 1);
        }
        if (c == 3) {
            assert_non_null(strstr(out, "recovered 1 (in place, at step 3): stage rank 0 replica 1 (pid "));
            assert_non_null(strstr(out, "hung (the step watchdog dumped its stack"));
            assert_null(strstr(out, "stage rank 0 replica 0 (pid ")); /* it only waited */
        }
        assert_null(strstr(out, "\nrestart ")); /* no relaunch of the job */
        tj_assert_clean(j);
    }
}

/* ---- 6. on the emulated GPU: the NCCL data plane's sharding ---- */

#define GPU "--job.device cuda --parallelism.data_plane nccl --training.seq_len 16 --training.local_batch_size 2 "
/* pipeline 1, 4 replicas, a deeper model (its layers, not its embedding, hold most weights) */
#define GPU_PP1 GPU "--parallelism.pipeline_parallel_degree 1 --parallelism.pipeline_parallel_microbatches 1 " \
                "--training.steps 2 --model.dim 64 --model.n_layers 6 --model.n_heads 4 --model.n_kv_heads 2 "
/* pipeline 2, 4 replicas (8 emulated GPUs), checkpoints and an in-memory snapshot every 2 steps */
#define GPU_PP2 GPU "--training.steps 4 --checkpoint.enable true --checkpoint.interval 2 " \
                "--checkpoint.snapshot_interval 2 --model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 "

static long long mem_peak(const char *job)
{
    char path[256], buf[1 << 14];
    snprintf(path, sizeof(path), "%s/%s.jsonl", tj_dir, job);
    tu_read_file(path, buf, sizeof(buf));
    char *p = strstr(buf, "\"mem_peak_bytes\": ");
    assert_non_null(p);
    return atoll(p + 18);
}

/* Each replica keeps its chunk of the weights and gradients on its GPU, each piece's weights
 * broadcast before it runs and its gradients reduced after its W; with groups (HSDP) group 0's
 * chunks go to the others before a step and theirs are summed into group 0's after it. Against
 * the unsharded NCCL job with as many replicas: the losses within 1e-6 (S4 at pipeline 1, R2 x
 * S2 at pipeline 2), less device memory a stage (the emulator counts each process's
 * allocations), the same losses whether pieces are gathered again for the backward or kept for
 * the step (which holds more); the checkpoint verifies; a stage killed -9 rewinds an HSDP job to
 * its snapshot with the undisturbed losses. (Resuming at other degrees, and the rest of the
 * matrix, on the CPU above: the GPU's checkpoints are the same flat files.) */
static void test_fsdp_gpu_on_the_emulated_nccl_plane(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    setenv("CTITAN_SIM_GPUS", "8", 1); /* 4 replicas x pipeline 2, a GPU a stage process */
    static char out[1 << 16];
    const char *r4 = reference(GPU_PP1 REPL "4"), *s4 = reference(GPU_PP1 SHARD "4");
    const char *s4k = reference(GPU_PP1 SHARD "4 --parallelism.fsdp_reshard_after_forward never");
    double d = assert_losses(s4, r4, 1, 2, 1e-6);
    assert_losses(s4k, s4, 1, 2, 0);
    long long m_r4 = mem_peak(r4), m_s4 = mem_peak(s4), m_s4k = mem_peak(s4k);
    print_message("pp 1, 4 GPUs: losses of S4 within %.3g of R4; device bytes a stage: R4 %lld, S4 %lld (%.2f), S4 "
                  "never resharded %lld\n", d, m_r4, m_s4, (double)m_s4 / m_r4, m_s4k);
    assert_true(m_s4 < m_r4);
    assert_true(m_s4 < m_s4k);
    const char *p4 = reference(GPU_PP2 REPL "4"), *ph = reference(GPU_PP2 SHARD "2 " REPL "2");
    d = assert_losses(ph, p4, 1, 4, 1e-6);
    print_message("pp 2, 8 GPUs: losses of R2 x S2 within %.3g of R4\n", d);
    verify_ok(ph, 2);
    char j[32], env[512], once[128], args[1024];
    job_name(j, sizeof(j), "gpukill");
    /* in step 4: the snapshot of step 2 is whole by then (step 3's update waited for its copy,
     * and the shard said so before it answered); in step 3 it may still be copying, and the job
     * would rightly go back to step 0 */
    snprintf(env, sizeof(env), "CTITAN_TEST_DIE_ONCE=%s CTITAN_TEST_DIE_AT=stage.1.3:mid:4", tj_once_dir(once, sizeof(once), j));
    snprintf(args, sizeof(args), QUIET GPU_PP2 SHARD "2 " REPL "2");
    int rc = tj_launch(env, 120, j, args, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    unsetenv("CTITAN_SIM_GPUS");
    if (rc || tj_count(out, "(rewound, at step 4)") != 1)
        TJ_FAIL_WITH(out, "status %d", rc);
    tj_assert_losses_by_step(j, ph, 4, 1, "\"rewound_to\": 2, \"step\": 4");
    tj_assert_clean(j);
}

/* ---- 7. a bf16 reduce (training.mixed_precision_reduce) ---- */

#define BF16 "--training.mixed_precision_reduce bfloat16 "

/* Whether any step of `a` from `from` to `last` has another loss string than `b`'s. */
static int losses_differ(const char *a, const char *b, int from, int last)
{
    static tj_metrics_t x, y;
    tj_parse_metrics(a, &x);
    tj_parse_metrics(b, &y);
    for (int i = 0; i < x.n; i++)
        for (int j = 0; j < y.n; j++)
            if (x.step[i] == y.step[j] && x.step[i] >= from && x.step[i] <= last && strcmp(x.loss[i], y.loss[j]))
                return 1;
    return 0;
}

/* Gradients reduced in bf16 among a group's members (each member's piece rounded to bf16, each
 * partial sum of the member-ordered sum rounded again, as a bf16 collective does; the fp32
 * gradient copy takes the result): the first step's loss (before any update) is the fp32 job's
 * bit for bit, the later ones move (the knob acts) but stay within 1e-4 of it (one member left
 * out of the sum moves them 2e-3); on the CPU the exchange's buffers are bf16, so the fsdp
 * segment is half the fp32 job's. On the emulated GPU (the next test) the same losses hold for
 * the NCCL plane's bf16 reduce (S2 at pipeline 1; make test runs it under ASan + UBSan too). */
static void test_fsdp_cpu_a_bf16_reduce_stays_near_fp32_and_halves_the_exchange(void **state)
{
    TU_NEED_BIN();
    const char *f32 = reference(PP1 SHARD "2"), *b16 = reference(PP1 SHARD "2 " BF16);
    assert_losses(b16, f32, 1, 1, 0);
    double d = assert_losses(b16, f32, 2, 4, 1e-4);
    assert_true(losses_differ(b16, f32, 2, 4));
    print_message("CPU S2: bf16 reduce's losses within %.3g of fp32's (step 1 bitwise)\n", d);
    if (!s2_fsdp_bytes) { /* test 2 did not run (a filter): measure the fp32 exchange here */
        char j[32];
        static job_mem_t m;
        job_name(j, sizeof(j), "mems2f");
        measure(j, SHARD "2", 2, &m);
        s2_fsdp_bytes = m.fsdp.size;
    }
    char j[32];
    static job_mem_t m;
    job_name(j, sizeof(j), "mems2b");
    measure(j, SHARD "2 " BF16, 2, &m);
    double r = (double)m.fsdp.size / (double)s2_fsdp_bytes;
    print_message("CPU S2: the fsdp segment %lld bytes with a bf16 reduce, %lld fp32 (%.3f)\n", m.fsdp.size,
                  s2_fsdp_bytes, r);
    if (!(r > 0.45 && r < 0.55))
        fail_msg("the bf16 exchange is %.3f of the fp32 one, expected about 1/2", r);
}

static void test_fsdp_gpu_a_bf16_reduce_stays_near_fp32(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    setenv("CTITAN_SIM_GPUS", "4", 1);
    const char *g32 = reference(GPU_PP1 SHARD "2"), *g16 = reference(GPU_PP1 SHARD "2 " BF16);
    unsetenv("CTITAN_CUDA_PLUGIN");
    unsetenv("CTITAN_SIM_GPUS");
    assert_losses(g16, g32, 1, 1, 0);
    double d = assert_losses(g16, g32, 2, 2, 1e-4);
    assert_true(losses_differ(g16, g32, 2, 2));
    print_message("emulated GPU S2: bf16 reduce's losses within %.3g of fp32's (step 1 bitwise)\n", d);
}

/* ---- 5. bad input ---- */

/* Shard degree on a GPU job off the NCCL data plane, 0 and 33 are refused naming the key (on the
 * command line, and in a manifest file with its line), before any process starts: status 2, no
 * metrics, no dump folder, no segment, no process; so are a reduce dtype other than float32 and
 * bfloat16, and bfloat16 without sharding. */
static void test_fsdp_cpu_bad_shard_degrees_are_refused_naming_the_key(void **state)
{
    TU_NEED_BIN();
    static const char *bad[] = {SHARD "2 --job.device cuda", SHARD "0", SHARD "33"};
    static const char *why[] = {"on GPUs runs on the NCCL data plane", "must be >= 1", "at most 32"};
    static const char *toml[] = {"[job]\nname = \"%s\"\ndevice = \"cuda\"\n[parallelism]\ndata_parallel_shard_degree = 2\n",
                                 "[job]\nname = \"%s\"\n[parallelism]\ndata_parallel_shard_degree = 0\n",
                                 "[job]\nname = \"%s\"\n[parallelism]\ndata_parallel_shard_degree = 33\n"};
    char out[8192], j[32], path[256], cmd[1024], want[512];
    job_name(j, sizeof(j), "bad");
    for (int i = 0; i < 3; i++) {
        int rc = tj_launch("", 30, j, bad[i], out, sizeof(out));
        if (rc != 2 || !strstr(out, "parallelism.data_parallel_shard_degree") || !strstr(out, why[i]))
            TJ_FAIL_WITH(out, "%s: status %d", bad[i], rc);
        snprintf(path, sizeof(path), "%s/%s.jsonl", tj_dir, j);
        assert_int_not_equal(access(path, F_OK), 0);
        snprintf(path, sizeof(path), "%s/runs/%s", tj_dir, j);
        assert_int_not_equal(access(path, F_OK), 0);
        tj_assert_clean(j);
        /* the same in a manifest file: its path and the line of the key */
        snprintf(path, sizeof(path), "%s/bad%d.toml", tj_dir, i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, toml[i], j);
        fclose(f);
        snprintf(cmd, sizeof(cmd), "cd %s && %s launch bad%d.toml --loader.dataset_path data/train.bin 2>&1", tj_dir,
                 tu_ctitan(), i);
        rc = tu_run(cmd, out, sizeof(out));
        snprintf(want, sizeof(want), "bad%d.toml:%d: parallelism.data_parallel_shard_degree = ", i, i ? 4 : 5);
        if (rc != 2 || !strstr(out, want) || !strstr(out, why[i]))
            TJ_FAIL_WITH(out, "bad%d.toml: status %d, expected \"%s\"", i, rc, want);
        tj_assert_clean(j);
    }
    /* the reduce's dtype: a name it does not know, and bf16 where nothing is sharded */
    static const char *bad_mp[] = {SHARD "2 --training.mixed_precision_reduce float16", REPL "2 " BF16};
    static const char *why_mp[] = {"expected \"float32\" or \"bfloat16\"",
                                   "needs parallelism.data_parallel_shard_degree > 1"};
    for (int i = 0; i < 2; i++) {
        int rc = tj_launch("", 30, j, bad_mp[i], out, sizeof(out));
        if (rc != 2 || !strstr(out, "training.mixed_precision_reduce") || !strstr(out, why_mp[i]))
            TJ_FAIL_WITH(out, "%s: status %d", bad_mp[i], rc);
        tj_assert_clean(j);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsdp_cpu_sharded_losses_match_the_unsharded_job),
        cmocka_unit_test(test_fsdp_cpu_params_and_grads_segments_are_one_over_s),
        cmocka_unit_test(test_fsdp_cpu_checkpoints_resume_at_another_degree_bitwise),
        cmocka_unit_test(test_fsdp_cpu_a_sharded_stage_killed_is_replaced_bitwise),
        cmocka_unit_test(test_fsdp_cpu_bad_shard_degrees_are_refused_naming_the_key),
        cmocka_unit_test(test_fsdp_gpu_on_the_emulated_nccl_plane),
        cmocka_unit_test(test_fsdp_cpu_a_bf16_reduce_stays_near_fp32_and_halves_the_exchange),
        cmocka_unit_test(test_fsdp_gpu_a_bf16_reduce_stays_near_fp32),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
