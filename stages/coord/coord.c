/* The coordinator (see coord.h): coord_run's order of things, the step loop, and coord_fail,
 * which tells a failure that the coordinator's own stop caused (a watch thread). The other
 * concerns are in coord_*.c, listed in coord_priv.h. */
#include "stages/coord/coord.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc/log.h"
#include "ipc/util.h"
#include "stages/coord/coord_priv.h"
#include "stages/job/staging.h"
#include "stages/runtime/plane.h"

/* ---- the coordinator's own stops ---- */

/* Notes the time every 20 ms while this process runs: a longer gap between two notes means it
 * did not run (stopped, or starved). Its workers leave a coordinator that does not answer for
 * heartbeat_timeout_ms, so a failure right after such a gap is the gap's doing. */
static void *watch_stops(void *arg)
{
    coord_t *c = arg;
    double last = util_now();
    while (!atomic_load(&c->watch_quit)) {
        nanosleep(&(struct timespec){0, 20000000L}, NULL);
        double now = util_now();
        if (now - last > 0.25) {
            atomic_store(&c->gap_s, now - last);
            atomic_store(&c->gap_end, now);
        }
        atomic_store(&c->tick, now);
        last = now;
    }
    return NULL;
}

/* Blocks SIGCONT (it stays pending until stopped_for looks: a stopped process is continued all
 * the same) and starts the watch. */
static void start_watch(coord_t *c)
{
    sigset_t cont;
    sigemptyset(&cont);
    sigaddset(&cont, SIGCONT);
    sigprocmask(SIG_BLOCK, &cont, NULL);
    atomic_store(&c->tick, util_now());
    c->watching = pthread_create(&c->watch, NULL, watch_stops, c) == 0;
}

static void stop_watch(coord_t *c)
{
    if (!c->watching)
        return;
    atomic_store(&c->watch_quit, 1);
    pthread_join(c->watch, NULL);
    c->watching = 0;
}

/* How long this process was stopped just before now (a SIGCONT came since the last look, and
 * the watch saw a gap or has not run since), or 0. Looked at once per step and at a failure. */
static double stopped_for(coord_t *c)
{
    sigset_t cont, pending;
    sigemptyset(&cont);
    sigaddset(&cont, SIGCONT);
    if (!sigpending(&pending) && sigismember(&pending, SIGCONT) &&
        sigtimedwait(&cont, NULL, &(struct timespec){0, 0}) == SIGCONT)
        c->continued_at = util_now();
    double now = util_now(), limit = c->m->heartbeat_timeout_ms * 1e-3, window = 2 * limit + 1;
    if (!(c->continued_at > 0 && now - c->continued_at < window))
        return 0;
    double since_tick = now - atomic_load(&c->tick); /* the watch has not run since the stop */
    double gap = now - atomic_load(&c->gap_end) < window ? atomic_load(&c->gap_s) : 0; /* or saw it */
    return since_tick > gap ? since_tick : gap;
}

static void vfail(coord_t *c, const coord_proc_t *p, const char *fmt, va_list ap)
{
    if (c->failed)
        return; /* the first reason is the cause; what follows is fallout */
    char what[sizeof(c->why)];
    vsnprintf(what, sizeof(what), fmt, ap);
    c->culprit = p;
    /* a worker leaves after heartbeat_timeout_ms without an answer, counted from its last one,
     * which can precede our last look: half the timeout is already suspect */
    double stopped = stopped_for(c);
    if (stopped > c->m->heartbeat_timeout_ms * 0.5e-3) {
        snprintf(c->why, sizeof(c->why), "the coordinator itself was not running for %.1f s (stopped, e.g. by "
                 "SIGSTOP; job.heartbeat_timeout_ms = %d): its workers gave up on it (found first: %.1200s)", stopped,
                 c->m->heartbeat_timeout_ms, what);
        c->culprit = NULL;
    } else {
        snprintf(c->why, sizeof(c->why), "%s", what);
    }
    c->failed = 1;
}

void coord_fail(coord_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c, NULL, fmt, ap);
    va_end(ap);
}

void coord_fail_proc(coord_t *c, const coord_proc_t *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c, p, fmt, ap);
    va_end(ap);
}

/* ---- the step loop ---- */

/* The longest optimizer shard's busy time of the last round. */
static double shards_busy(coord_t *c)
{
    double t = 0;
    for (int k = 0; k < c->m->shards; k++)
        t = coord_shard(c, k)->reply.t_busy > t ? coord_shard(c, k)->reply.t_busy : t;
    return t;
}

/* The global gradient norm from the shards' partials of this step. */
static double grad_norm(coord_t *c)
{
    double sq = 0, *blocks = job_norm_blocks(c->hdr);
    if (!job_norm_by_blocks(&c->lay)) /* shard order (the slices do not follow the blocks) */
        for (int k = 0; k < c->m->shards; k++)
            sq += coord_shard(c, k)->reply.grad_norm;
    else /* block order: the same sum for any shard count */
        for (size_t b = 0; b < c->lay.n_blocks; b++)
            sq += blocks[b];
    return sqrt(sq);
}

/* torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is < 1. */
static double clip_scale(const manifest_t *m, double norm)
{
    double scale = m->max_norm > 0 ? m->max_norm / (norm + 1e-6) : 1.0;
    return scale < 1.0 ? scale : 1.0;
}

/* One training step, three rounds: forward and backward on every stage, the shards sum the
 * replicas' gradients, then update with the clip factor of the global norm; then what the
 * step's end brings (a checkpoint, a loader swap). Returns 0, COORD_REWOUND (a GPU job went
 * back to step c->step: coord_rewind.c), or -1 once the job failed or was interrupted. */
static int step(coord_t *c)
{
    const manifest_t *m = c->m;
    int first_shard = 1 + c->n_stages, rc;
    stopped_for(c); /* a stop between steps that did no harm is forgotten after a while */
    atomic_store(&c->hdr->step, c->step);
    double t0 = c->round_t0 = util_now();
    msg_t run = {.type = MSG_STEP, .step = c->step};
    c->grads_held = c->lay.gpu_shards; /* until the update: a stage lost takes its part of them */
    if ((rc = coord_round_trip(c, 1, c->n_stages, &run)))
        return rc;
    double t1 = util_now();
    coord_trace_round(c, "stages", 1, c->n_stages, t0, t1);
    msg_t reduce = {.type = MSG_REDUCE, .step = c->step};
    if ((rc = coord_round_trip(c, first_shard, m->shards, &reduce)))
        return rc;
    double t2 = util_now(), t_reduce = shards_busy(c), norm = grad_norm(c);
    coord_trace_round(c, "reduce", first_shard, m->shards, t1, t2);
    msg_t update = {.type = MSG_UPDATE, .step = c->step, .grad_norm = norm, .scale = clip_scale(m, norm)};
    if ((rc = coord_round_trip(c, first_shard, m->shards, &update)))
        return rc;
    c->grads_held = 0;
    coord_trace_round(c, "update", first_shard, m->shards, t2, util_now());
    double t_update = shards_busy(c), t_step = util_now() - t0;
    coord_note_step_time(c, t_step);
    coord_report_step(c, norm, t_step, t_reduce, t_update);
    coord_note_step(c);
    int64_t done = c->step + 1;
    if (m->ckpt_enable && (done % m->ckpt_interval == 0 || done == m->steps)) {
        if ((rc = coord_start_checkpoint(c, done)))
            return rc;
    } else if (m->snapshot_interval > 0 && done % m->snapshot_interval == 0 && !c->ck_busy) {
        coord_start_snapshot(c, done); /* in memory only; none while a checkpoint is written */
    }
    if (c->swap_pending)
        coord_do_swap(c);
    return c->failed || c->interrupted ? -1 : 0;
}

static void train(coord_t *c)
{
    double t_start = util_now();
    int64_t first = c->step;
    int rc;
    c->training = 1;
    c->train_t0 = c->snap_at = t_start; /* a rewind to the first step loses everything since now */
    for (;;) {
        if (c->step < c->m->steps)
            rc = step(c);
        else if (!(rc = coord_ckpt_wait(c))) /* the last checkpoint */
            break;
        if (rc < 0)
            return;
        if (rc == 0)
            c->step++;
        /* else COORD_REWOUND: the job went back to c->step */
    }
    c->training = 0;
    coord_stop_all(c);
    coord_end_of_run(c, first, util_now() - t_start);
    coord_ckpt_check_last(c);
}

/* ---- the run ---- */

/* Everything before any process starts, on every host. */
static int set_up(coord_t *c, char *err, size_t errlen)
{
    manifest_t *m = c->m;
    ssize_t n = readlink("/proc/self/exe", c->bin_dir, sizeof(c->bin_dir) - 1);
    if (n <= 0)
        return util_fail(err, errlen, -errno, "cannot find my own executable: %s", strerror(errno));
    c->bin_dir[n] = 0;
    *strrchr(c->bin_dir, '/') = 0;
    int rc;
    argv_t cmd;
    if (m->command[0]) { /* manifest_validate checked that it splits */
        if ((rc = argv_split(m->command, &cmd, err, errlen)))
            return rc;
        rc = argv_pack(&cmd, c->loader_argv, &c->loader_argv_len);
        argv_free(&cmd);
        if (rc)
            return util_fail(err, errlen, rc, "loader.command is too long");
    }
    if (!(c->toml = manifest_to_toml(m)) || job_layout(&c->lay, m))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if ((rc = sched_build(&c->sched, m->pp, c->lay.vs, m->microbatches, m->schedule, err, errlen)))
        return rc; /* cannot happen: the manifest was checked against the schedule's rules */
    /* in-place recovery: the weights and the shards' state live in this host's segments (CPU);
     * on the GPU (and so across hosts) they live in the processes, and a loss rewinds the job,
     * every host's agent taking part (coord_rewind.c, coord_agent.c), but for a stage on one
     * host's IPC plane: the shards keep the state, the stages are started again (coord_recover.c) */
    plane_recovery_t how = plane_recovery(plane_transport(&c->lay));
    c->recover = how == PLANE_RECOVER_IN_PLACE && c->lay.hosts == 1;
    c->restage = how == PLANE_RECOVER_RESTAGE && c->lay.hosts == 1;
    if ((rc = util_mkdirs(m->dump_folder)))
        return util_fail(err, errlen, rc, "job.dump_folder %s: cannot create: %s", m->dump_folder, strerror(-rc));
    if ((rc = coord_resolve_endpoint(c, err, errlen)) || (rc = coord_check_data(c, err, errlen)) ||
        (rc = coord_keys_setup(c, err, errlen)))
        return rc;
    if ((rc = coord_setup_signals(c)))
        return util_fail(err, errlen, rc, "cannot set up signal handling: %s", strerror(-rc));
    start_watch(c); /* after the signal mask is set: the thread inherits it */
    if ((rc = job_check_memory(&c->lay, m, err, errlen)) || (rc = coord_make_segments(c, err, errlen)))
        return rc;
    if (coord_make_table(c))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if (m->host_rank > 0) { /* an agent: the rest comes with the coordinator's START (coord_agent.c) */
        snprintf(c->hdr->endpoint, sizeof(c->hdr->endpoint), "%s", c->endpoint);
        return 0;
    }
    if ((rc = coord_make_boot(c, err, errlen)))
        return rc;
    if ((rc = ctl_server_new(&c->ctl, c->keys.sec, err, errlen)) || (rc = coord_keys_admit(c, err, errlen)) ||
        (rc = ctl_bind(c->ctl, c->endpoint, err, errlen)))
        return rc;
    /* tcp://HOST:* binds a free port: workers and `ctitan loader swap` need the real one */
    snprintf(c->endpoint, sizeof(c->endpoint), "%s", ctl_endpoint(c->ctl));
    snprintf(c->hdr->endpoint, sizeof(c->hdr->endpoint), "%s", c->endpoint);
    return 0;
}

/* Once the first step and its loader cursor are known: the loader segment, the metrics file
 * and the TensorBoard event file (a path that cannot be written fails the launch now, not
 * after training), the banner (with the peak, measured before any process computes), then
 * every process not started yet; waits until all are ready. */
static int start(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    int rc = coord_make_batch(c, err, errlen);
    if (rc)
        return rc;
    /* a supervisor's relaunch appends: the file keeps the failed run's steps and the restart */
    const char *mode = c->sup && c->sup->append_metrics ? "a" : "w";
    if (m->metrics_file[0] && !(c->metrics = fopen(m->metrics_file, mode)))
        return util_fail(err, errlen, -errno, "metrics.file %s: cannot open: %s", m->metrics_file, strerror(errno));
    if (m->tb_enable) { /* a new file each run, whose steps TensorBoard shows over earlier files' */
        char dir[PATH_MAX], why[PATH_MAX + 256];
        manifest_tb_folder(m, dir, sizeof(dir));
        if ((rc = tb_open(&c->tb, dir, c->step + 1, why, sizeof(why))))
            return util_fail(err, errlen, rc, "metrics.save_tb_folder: %s", why);
    }
    char why[PATH_MAX + 256];
    if ((rc = coord_trace_open(c, why, sizeof(why))))
        return util_fail(err, errlen, rc, "profiling.trace_file: %s", why);
    coord_banner(c);
    if (c->agents) { /* every other host first: its stages are NCCL peers of ours */
        coord_start_agents(c);
        if (coord_pump(c, coord_agents_started, NULL, m->host_timeout_s) == -ETIMEDOUT) {
            char missing[256] = "";
            for (int h = 1; h < m->hosts && strlen(missing) < sizeof(missing) - 16; h++)
                if (!c->agents[h].started)
                    snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), "%s%d",
                             missing[0] ? ", " : "", h);
            coord_fail(c, "the agent of host %s did not connect to %s in %d s (job.host_timeout_s): start `ctitan "
                       "launch` there with the same manifest", missing, c->endpoint, m->host_timeout_s);
        }
    }
    for (int i = 0; i < c->np && !c->failed; i++)
        if (!c->p[i].remote && !c->p[i].pid && !c->p[i].expect_exit)
            coord_spawn(c, &c->p[i]);
    if (coord_pump(c, coord_all_ready, NULL, COORD_STARTUP_TIMEOUT_S) == -ETIMEDOUT)
        coord_fail(c, "the job's processes did not all become ready in %.0f s", COORD_STARTUP_TIMEOUT_S);
    if (c->seg_ckpt && !manifest_snapshots(m) && !c->failed) {
        /* the shards have their slices: a run that writes no checkpoint frees the 12 bytes a
         * parameter the staging segment holds */
        shm_detach(&c->seg_ckpt);
        shm_unlink_name(c->job, STAGING_SEG);
    }
    return 0;
}

/* Host 0: resume, start, train. Returns the exit status. */
static int run(coord_t *c)
{
    const manifest_t *m = c->m;
    char err[1024] = "";
    int rc = coord_resume(c, err, sizeof(err));
    if (!rc) {
        coord_note_start(c);
        c->first_step = c->step;
        c->fresh = !m->ckpt_load[0];
        snprintf(c->start_load, sizeof(c->start_load), "%s", m->ckpt_load);
        memcpy(c->start_cursor, c->resume_cursor, c->resume_cursor_len);
        c->start_cursor_len = c->resume_cursor_len;
        /* a resumed checkpoint stays whole in the staging segment until the first snapshot */
        c->snap_step = !c->fresh && manifest_snapshots(m) ? c->step : -1;
        c->snaps = c->snap_step >= 0;
    }
    if (!rc && c->step >= m->steps) {
        printf("launch: the checkpoint is at step %lld and training.steps = %d: nothing left to train\n",
               (long long)c->step, m->steps);
        coord_stop_all(c);
        return 0;
    }
    if (!rc)
        rc = start(c, err, sizeof(err));
    if (!rc && !c->failed && !c->interrupted)
        train(c);
    if (c->failed) {
        fprintf(stderr, "ctitan: job %s failed: %s\n", m->name, c->why);
        coord_note_failure(c, c->why);
        coord_terminate_all(c, 2.0);
        return 1;
    }
    if (c->interrupted) {
        fprintf(stderr, "ctitan: job %s interrupted by %s: stopping every process\n", m->name,
                strsignal(c->interrupted));
        coord_stop_all(c);
        return 128 + c->interrupted;
    }
    if (rc) { /* before training: checkpointd's reason, or the set-up's */
        fprintf(stderr, "launch: %s\n", err);
        coord_note_failure(c, err);
        coord_stop_all(c);
        return 1;
    }
    return 0;
}

/* What the control plane refused during the run, if anything: peers may cause it at will, so
 * the log had only a bounded number of lines about it. */
static void report_rejections(coord_t *c)
{
    uint64_t keys, handshakes;
    log_limit_flush(&c->rejected, LOG_WARN);
    ctl_refusals(c->ctl, &keys, &handshakes);
    if (c->rejected.total || keys || handshakes)
        LOG_W("the control plane rejected %llu messages and refused %llu connections (%llu keys not the job's, "
              "%llu failed handshakes)", (unsigned long long)c->rejected.total,
              (unsigned long long)(keys + handshakes), (unsigned long long)keys, (unsigned long long)handshakes);
}

int coord_run(const manifest_t *given, const coord_super_t *sup)
{
    coord_t c = {.sigfd = -1, .rejected = {.what = "rejected control messages"}, .sup = sup,
                 .out = sup ? sup->out : NULL};
    char err[1024];
    int status = 1;
    log_init("", 0, 0);
    manifest_t *m = malloc(sizeof(*m)); /* ours: checkpoint.load gets resolved */
    if (!m) {
        fprintf(stderr, "launch: out of memory\n");
        return 1;
    }
    *m = *given;
    c.m = m;
    if (m->host_rank > 0)
        snprintf(c.job, sizeof(c.job), "%s-h%d", m->name, m->host_rank);
    else
        snprintf(c.job, sizeof(c.job), "%s", m->name);
    coord_note_start(&c);
    if (set_up(&c, err, sizeof(err))) {
        fprintf(stderr, "launch: %s\n", err);
        coord_note_failure(&c, err);
    } else {
        status = m->host_rank > 0 ? coord_agent(&c) : run(&c);
        if (c.agents && status != 1) /* done, or stopped: the other hosts end too (a failure waits for a relaunch) */
            coord_stop_agents(&c);
    }
    stop_watch(&c);
    if (c.ctl && c.sock_path[0]) /* only a socket we bound: another run of this job may own the file */
        unlink(c.sock_path);
    if (c.ctl)
        report_rejections(&c);
    ctl_destroy(&c.ctl);
    coord_keys_remove(&c);
    coord_remove_segments(&c);
    if (c.metrics)
        fclose(c.metrics);
    tb_close(&c.tb);
    coord_trace_close(&c);
    sched_free(&c.sched);
    if (c.sigfd >= 0)
        close(c.sigfd);
    free(c.p);
    free(c.agents);
    free(c.toml);
    free(c.boot);
    free(m);
    return status;
}
