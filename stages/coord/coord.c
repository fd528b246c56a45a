/* The coordinator (see coord.h): coord_run's order of things and the step loop, at the top of
 * the coordinator's tree (coord_core.h lists its files, bottom first): it sets every concern up,
 * which hooks its messages into the registry, and calls them in the order of a run. */
#include "stages/coord/coord.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/log.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "kernels/norm_order.h"
#include "stages/coord/coord_agent.h"
#include "stages/coord/coord_ckpt.h"
#include "stages/coord/coord_core.h"
#include "stages/coord/coord_ctl.h"
#include "stages/coord/coord_hosts.h"
#include "stages/coord/coord_keys.h"
#include "stages/coord/coord_outcome.h"
#include "stages/coord/coord_plane.h"
#include "stages/coord/coord_proc.h"
#include "stages/coord/coord_recover.h"
#include "stages/coord/coord_report.h"
#include "stages/coord/coord_resume.h"
#include "stages/coord/coord_setup.h"
#include "stages/coord/coord_swap.h"
#include "stages/coord/coord_trace.h"
#include "stages/coord/coord_watchdog.h"
#include "stages/job/staging.h"

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
    double sq = 0;
    if (!job_norm_by_blocks(&c->lay)) /* shard order (the slices do not follow the blocks) */
        for (int k = 0; k < c->m->shards; k++)
            sq += coord_shard(c, k)->reply.grad_norm;
    else /* block order, kernels/norm_order.h's: the same sum for any shard count, and the one GPU
          * shards make on the device */
        sq = norm_sum(job_norm_blocks(c->hdr), c->lay.n_blocks);
    return sqrt(sq);
}

/* GPU shards that sum the norm on the device (job_layout_t norm_on_device) each answer UPDATE
 * with it: the same sum of the same blocks, so the same bits, or something is wrong. */
static int device_norm(coord_t *c, double *norm)
{
    *norm = coord_shard(c, 0)->reply.grad_norm;
    for (int k = 1; k < c->m->shards; k++)
        if (memcmp(&coord_shard(c, k)->reply.grad_norm, norm, sizeof(*norm))) {
            coord_fail(c, "the optimizer shards summed different gradient norms for step %lld (shard 0: %.17g, "
                       "shard %d: %.17g): the same blocks must give the same bits", (long long)c->step + 1, *norm,
                       k, coord_shard(c, k)->reply.grad_norm);
            return -1;
        }
    return 0;
}

/* One training step, three rounds: forward and backward on every stage, the shards sum the
 * replicas' gradients, then update with the clip factor of the global norm; then what the
 * step's end brings (a checkpoint, a loader swap). GPU shards that sum the norm on the device
 * need no REDUCE round: UPDATE does both, the clip factor never leaving the device, and its
 * answers carry the norm. Returns 0, COORD_REWOUND (a GPU job went back to step c->step:
 * coord_rewind.c), or -1 once the job failed or was interrupted. */
static int step(coord_t *c)
{
    const manifest_t *m = c->m;
    int first_shard = 1 + c->n_stages, rc;
    coord_stopped_for(c); /* a stop between steps that did no harm is forgotten after a while */
    atomic_store(&c->hdr->step, c->step);
    double t0 = c->round_t0 = util_now();
    msg_t run = {.type = MSG_STEP, .step = c->step};
    c->grads_held = c->lay.gpu_shards; /* until the update: a stage lost takes its part of them */
    if ((rc = coord_round_trip(c, 1, c->n_stages, &run)))
        return rc;
    double t1 = util_now(), t2 = t1, t_reduce = 0, norm = 0;
    coord_trace_round(c, "stages", 1, c->n_stages, t0, t1);
    if (!c->lay.norm_on_device) {
        msg_t reduce = {.type = MSG_REDUCE, .step = c->step};
        if ((rc = coord_round_trip(c, first_shard, m->shards, &reduce)))
            return rc;
        t2 = util_now(), t_reduce = shards_busy(c), norm = grad_norm(c);
        coord_trace_round(c, "reduce", first_shard, m->shards, t1, t2);
    }
    msg_t update = {.type = MSG_UPDATE, .step = c->step, .grad_norm = norm,
                    .scale = norm_clip_scale(m->max_norm, norm)};
    if ((rc = coord_round_trip(c, first_shard, m->shards, &update)))
        return rc;
    if (c->lay.norm_on_device && device_norm(c, &norm))
        return -1;
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
    } else if (m->snapshot_interval > 0 && done % m->snapshot_interval == 0 && !coord_ckpt_busy(c, NULL)) {
        coord_start_snapshot(c, done); /* in memory only; none while a checkpoint is written */
    }
    if (coord_swap_due(c))
        coord_do_swap(c);
    return coord_over(c) ? -1 : 0;
}

static void train(coord_t *c)
{
    double t_start = util_now();
    int64_t first = c->step;
    int rc;
    c->training = 1;
    c->train_t0 = t_start; /* a rewind to the first step loses everything since now */
    /* a resumed checkpoint stays whole in the staging segment until the first snapshot */
    coord_ckpt_begin(c, !coord_resume_start(c)->fresh && manifest_snapshots(c->m) ? c->step : -1);
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

/* `ctitan status`: the step, the loader, the supervisor's restarts and the in-place recoveries. */
static const char *on_status(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    char restarts[400] = "";
    const char *last;
    int recoveries = coord_recoveries(c, &last);
    if (c->sup && c->sup->restarts)
        snprintf(restarts, sizeof(restarts), "; restarts so far: %d (last: %.300s)", c->sup->restarts,
                 c->sup->last_restart);
    else if (c->sup)
        snprintf(restarts, sizeof(restarts), "; restarts so far: 0");
    size_t n = strlen(restarts);
    if (recoveries)
        snprintf(restarts + n, sizeof(restarts) - n, "; in-place recoveries: %d (last: %.200s)", recoveries, last);
    coord_reply_cli(c, from->route, 1, "job %s: step %lld of %d, loader pid %d%s", c->m->name, (long long)c->step + 1,
                    c->m->steps, (int)coord_loader(c)->pid, restarts);
    return NULL;
}

/* Every concern's state (the report's is made first: the data check needs it), its messages
 * and hooks into the registry, in the order the pump runs its hooks (heartbeats, agents,
 * watchdog: coord_make_table registers the first). */
static int init_concerns(coord_t *c)
{
    coord_ctl_init(c);
    coord_plane_init(c);
    coord_handle(c, MSG_STATUS, COORD_FROM_OPERATOR, on_status);
    if (coord_make_table(c) || coord_hosts_init(c) || coord_watchdog_init(c) || coord_trace_init(c) ||
        coord_resume_init(c) || coord_ckpt_init(c) || coord_swap_init(c) || coord_recover_init(c))
        return -ENOMEM;
    return 0;
}

static void free_concerns(coord_t *c)
{
    coord_recover_free(c);
    coord_swap_free(c);
    coord_ckpt_free(c);
    coord_resume_free(c);
    coord_report_close(c);
    coord_trace_close(c);
    coord_watchdog_free(c);
    coord_hosts_free(c);
}

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
    if ((rc = util_mkdirs(m->dump_folder)))
        return util_fail(err, errlen, rc, "job.dump_folder %s: cannot create: %s", m->dump_folder, strerror(-rc));
    if ((rc = coord_report_init(c)))
        return util_fail(err, errlen, rc, "out of memory");
    if ((rc = coord_resolve_endpoint(c, err, errlen)) || (rc = coord_check_data(c, err, errlen)) ||
        (rc = coord_keys_setup(c, err, errlen)))
        return rc;
    if ((rc = coord_setup_signals(c)))
        return util_fail(err, errlen, rc, "cannot set up signal handling: %s", strerror(-rc));
    coord_watch_start(c); /* after the signal mask is set: the thread inherits it */
    if ((rc = job_check_memory(&c->lay, m, err, errlen)) || (rc = coord_make_segments(c, err, errlen)))
        return rc;
    if (init_concerns(c))
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

/* coord_all_ready, and after 2 s of set-up a line every 2 s: how many processes are ready,
 * which are not (a large model's optimizer shards initialise the weights meanwhile). */
static int all_ready_say(coord_t *c, void *arg)
{
    if (coord_all_ready(c, arg))
        return 1;
    double s = util_every_due(&c->setup_say);
    if (s < 0)
        return 0;
    int ready = 0, n = 0;
    char waiting[256] = "";
    size_t at = 0;
    for (int i = 0; i < c->np; i++) {
        if (c->p[i].expect_exit)
            continue;
        n++;
        if (c->p[i].ready)
            ready++;
        else if (at < sizeof(waiting) - 1)
            at += (size_t)snprintf(waiting + at, sizeof(waiting) - at, "%s%s", at ? ", " : "", c->p[i].id);
    }
    printf("launch: set-up: %d of %d processes ready (%.0f s); setting up: %s (the optimizer shards initialise "
           "the weights, the stages their activations)\n", ready, n, s, waiting);
    fflush(stdout);
    return 0;
}

/* Once the first step and its loader cursor are known: the loader segment, the metrics file
 * and the TensorBoard event file (a path that cannot be written fails the launch now, not
 * after training), the banner (with the peak, measured before any process computes), then
 * every process not started yet; waits until all are ready. */
static int start(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    const coord_start_t *s = coord_resume_start(c);
    int rc = coord_make_batch(c, c->step, s->cursor, s->cursor_len, err, errlen);
    if (rc || (rc = coord_report_open(c, err, errlen)))
        return rc;
    char why[PATH_MAX + 256];
    if ((rc = coord_trace_open(c, why, sizeof(why))))
        return util_fail(err, errlen, rc, "profiling.trace_file: %s", why);
    coord_banner(c);
    if (coord_hosts_any(c)) { /* every other host first: its stages are NCCL peers of ours */
        coord_hosts_start(c, s->first_step, s->fresh ? "" : s->load, s->cursor, s->cursor_len);
        if (coord_pump(c, coord_hosts_started, NULL, m->host_timeout_s) == -ETIMEDOUT) {
            char missing[256];
            coord_fail(c, "the agent of host %s did not connect to %s in %d s (job.host_timeout_s): start `ctitan "
                       "launch` there with the same manifest", coord_hosts_missing(c, missing, sizeof(missing)),
                       c->endpoint, m->host_timeout_s);
        }
    }
    for (int i = 0; i < c->np && !c->failed; i++)
        if (!c->p[i].remote && !c->p[i].pid && !c->p[i].expect_exit)
            coord_spawn(c, &c->p[i]);
    if (coord_pump(c, all_ready_say, NULL, coord_startup_s(c)) == -ETIMEDOUT)
        coord_fail(c, "the job's processes did not all become ready in %.0f s", coord_startup_s(c));
    if (c->seg_ckpt && !manifest_snapshots(m) && !c->failed) {
        /* the shards have their slices: a run that writes no checkpoint frees the bytes a
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
    if (!rc)
        coord_note_start(c);
    if (!rc && c->step >= m->steps) {
        printf("launch: the checkpoint is at step %lld and training.steps = %d: nothing left to train (raise "
               "training.steps to train on; --checkpoint.load none with another job.dump_folder starts over)\n",
               (long long)c->step, m->steps);
        coord_stop_all(c);
        return 0;
    }
    if (!rc)
        rc = start(c, err, sizeof(err));
    if (!rc && !coord_over(c))
        train(c);
    if (c->failed) {
        fprintf(stderr, "ctitan: job %s failed: %s\n", m->name, c->why);
        coord_note_failure(c, c->why);
        coord_terminate_all(c, 2.0);
        return 1;
    }
    if (c->interrupted) {
        if (c->sup && getppid() != c->sup->supervisor) /* the SIGTERM of its parent's death */
            fprintf(stderr, "ctitan: job %s: its launcher (pid %d) is gone: stopping every process and removing "
                    "the job's segments and operator key\n", m->name, (int)c->sup->supervisor);
        else
            fprintf(stderr, "ctitan: job %s interrupted by %s: stopping every process\n", m->name,
                    strsignal(c->interrupted));
        coord_stop_all_now(c);
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
    log_limit_flush(&c->unanswered, LOG_WARN);
    ctl_refusals(c->ctl, &keys, &handshakes);
    if (c->rejected.total || keys || handshakes)
        LOG_W("the control plane rejected %llu messages and refused %llu connections (%llu keys not the job's, "
              "%llu failed handshakes)", (unsigned long long)c->rejected.total,
              (unsigned long long)(keys + handshakes), (unsigned long long)keys, (unsigned long long)handshakes);
}

int coord_run(const manifest_t *given, const coord_super_t *sup)
{
    coord_t c = {.sigfd = -1, .rejected = {.what = "rejected control messages"},
                 .unanswered = {.what = "replies the operator was not sent"}, .sup = sup,
                 .out = sup ? sup->out : NULL};
    util_every_start(&c.setup_say, util_say_s());
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
    int lock = sup ? -1 : shm_job_lock(c.job, err, sizeof(err)); /* under a supervisor: its lock, shared */
    if (lock < 0 && !sup) {
        fprintf(stderr, "launch: %s\n", err);
        free(m);
        return 1;
    }
    if (set_up(&c, err, sizeof(err))) {
        if (c.interrupted) { /* a Ctrl-C in the set-up: nothing started yet */
            fprintf(stderr, "ctitan: job %s interrupted by %s during its set-up: removing its segments\n", m->name,
                    strsignal(c.interrupted));
            status = 128 + c.interrupted;
        } else {
            fprintf(stderr, "launch: %s\n", err);
            coord_note_failure(&c, err);
        }
    } else {
        status = m->host_rank > 0 ? coord_agent(&c) : run(&c);
        if (status != 1) /* done, or stopped: the other hosts end too (a failure waits for a relaunch) */
            coord_hosts_stop(&c);
    }
    coord_watch_stop(&c);
    if (c.ctl && c.sock_path[0]) /* only a socket we bound: another run of this job may own the file */
        unlink(c.sock_path);
    if (c.ctl)
        report_rejections(&c);
    ctl_destroy(&c.ctl);
    coord_keys_remove(&c);
    coord_remove_segments(&c);
    free_concerns(&c);
    sched_free(&c.sched);
    if (c.sigfd >= 0)
        close(c.sigfd);
    free(c.p);
    free(c.toml);
    free(c.boot);
    shm_job_unlock(c.job, lock);
    if (sup && getppid() != sup->supervisor) /* orphaned: the lock's last holder */
        shm_job_unlock(c.job, sup->lock_fd);
    free(m);
    return status;
}
