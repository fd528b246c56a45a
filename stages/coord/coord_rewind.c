/* Recovery by rewinding (see coord_rewind.h; DESIGN.md "Recovery"). A GPU stage's
 * weights and a GPU shard's master weights and moments are device memory that its process
 * owns and that dies with it, and the device rings and NCCL communicators of its neighbours
 * point into it. So on a GPU job a lost stage or shard takes every stage and shard with it:
 * all are started again, as at a resume, from the newest whole snapshot in the staging segment
 * (the checkpoints' snapshots, no disk read), or from the initial weights when the run started
 * from them and no snapshot is whole, and the steps since then run again. The same bits as an
 * undisturbed run: the state is the snapshot's, and each step after it is a function of that
 * state and the loader's cursor. A CPU job whose shards keep one bank of state
 * (optshard.host_banks = 1) rewinds the same way when a shard is lost in its update: its state
 * is torn. */
#include "stages/coord/coord_rewind.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"
#include "stages/coord/coord_ckpt.h"
#include "stages/coord/coord_ctl.h"
#include "stages/coord/coord_hosts.h"
#include "stages/coord/coord_plane.h"
#include "stages/coord/coord_proc.h"
#include "stages/coord/coord_resume.h"
#include "stages/coord/coord_setup.h"
#include "stages/job/devdir.h"
#include "stages/job/ldr_info.h"
#include "stages/job/staging.h"

static int workers_gone(coord_t *c, void *arg)
{
    for (int i = 0; i < c->np; i++)
        if (c->p[i].pid && !c->p[i].remote && c->p[i].role != COORD_CKPTD)
            return 0;
    return 1;
}

static int ready_or_lost(coord_t *c, void *arg) { return c->n_lost || coord_all_ready(c, NULL); }

/* Where the state of step `to` comes from: 1 the staging segment, 0 the initial weights; -1
 * when there is none (the job failed, saying why, blaming first). *since: when it was current. */
static int source(coord_t *c, const coord_proc_t *first, const char *why, int64_t *to, double *since)
{
    int wholes;
    int64_t snap = coord_ckpt_whole(c, since, &wholes), busy_step;
    const coord_start_t *start = coord_resume_start(c);
    if (snap >= 0) {
        staging_hdr_t *h = shm_data(c->seg_ckpt);
        if (atomic_load(&h->step) != snap || h->cursor_len > LDR_CURSOR_MAX) {
            coord_fail(c, "rewind: the staging segment holds step %lld, not the snapshot of step %lld",
                       (long long)atomic_load(&h->step), (long long)snap);
            return -1;
        }
        *to = snap;
        return 1;
    }
    if (start->fresh && !wholes) {
        *to = start->first_step;
        *since = c->train_t0;
        return 0;
    }
    if (coord_ckpt_busy(c, &busy_step))
        coord_fail_proc(c, first, "%s; the job goes back to its newest whole snapshot, and the snapshot "
                        "of step %lld was overwriting it: not recovered in place", why, (long long)busy_step);
    else
        coord_fail_proc(c, first, "%s; the job goes back to its newest whole snapshot, and it has none "
                        "(checkpoint.enable = false, resumed from %s): not recovered in place", why, start->load);
    return -1;
}

int coord_rewind_segments(coord_t *c, int64_t to, int from_staging, const uint8_t *cursor, size_t len, char *err,
                          size_t errlen)
{
    const manifest_t *m = c->m;
    if (len > LDR_CURSOR_MAX)
        return util_fail(err, errlen, -EINVAL, "a loader cursor of %zu bytes (at most %d)", len, LDR_CURSOR_MAX);
    if (from_staging) { /* the shards load from it: its header names the step (an agent's had none) */
        if (!c->seg_ckpt)
            return util_fail(err, errlen, -ENOENT, "no staging segment on this host to rewind to step %lld from",
                             (long long)to);
        staging_hdr_t *h = shm_data(c->seg_ckpt);
        memcpy(h->cursor, cursor, len);
        h->cursor_len = (uint32_t)len;
        atomic_store(&h->step, to);
    }
    if (c->seg_grads)
        memset(shm_data(c->seg_grads), 0, job_params_bytes(&c->lay));
    coord_reset_rings(c);
    if (c->seg_dev) /* the new stages publish their device buffers there */
        memset(shm_data(c->seg_dev), 0, devdir_bytes(&c->lay));
    for (int k = 0; c->seg_opt && k < m->shards; k++) { /* CPU shards make their state anew */
        atomic_store(&job_optstate_rec(shm_data(c->seg_opt), k)->done, -1);
        atomic_store(&job_optstate_rec(shm_data(c->seg_opt), k)->writing, 0);
    }
    c->step = to;
    return coord_make_batch(c, to, cursor, len, err, errlen);
}

/* Host 0's part: the checkpoint in flight, the NCCL ids, checkpoint.load, then the segments. */
static int reset_state(coord_t *c, int64_t to, int from_staging)
{
    manifest_t *m = c->m;
    char err[512];
    coord_ckpt_drop(c);
    if (coord_make_boot(c, err, sizeof(err))) { /* the old communicators died with their ranks */
        coord_fail(c, "rewind: %s", err);
        return -1;
    }
    if (from_staging)
        snprintf(m->ckpt_load, sizeof(m->ckpt_load), "the in-memory snapshot of step %lld (the staging segment)",
                 (long long)to);
    else
        m->ckpt_load[0] = '\0';
    char *toml = manifest_to_toml(m); /* the shards read checkpoint.load: the staging segment, or none */
    if (!toml) {
        coord_fail(c, "rewind: out of memory");
        return -1;
    }
    free(c->toml);
    c->toml = toml;
    staging_hdr_t *h = from_staging ? shm_data(c->seg_ckpt) : NULL;
    uint8_t cursor[sizeof(h->cursor)];
    size_t len = h ? h->cursor_len : 0;
    if (h)
        memcpy(cursor, h->cursor, len);
    if (coord_rewind_segments(c, to, from_staging, cursor, len, err, sizeof(err))) {
        coord_fail(c, "rewind: %s", err);
        return -1;
    }
    msg_t rw = {.type = MSG_REWIND, .step = to, .ok = from_staging, .data = cursor, .data_len = len};
    for (int h = 1; coord_hosts_any(c) && h < m->hosts; h++) /* the other hosts do the same */
        if (coord_hosts_send(c, h, &rw)) {
            coord_fail(c, "rewind: host %d's agent (pid %lld) cannot be reached: the host is lost or cut off, and its "
                       "processes with it", h, (long long)coord_hosts_pid(c, h));
            return -1;
        }
    return 0;
}

/* Every process but checkpointd, on every host; those of other hosts are their agents' to
 * kill and start, and are forgotten here until they say hello again. */
static int rewound(const coord_proc_t *p) { return p->role != COORD_CKPTD; }

int coord_rewind(coord_t *c, const coord_proc_t *first, const char *why, double *since)
{
    int64_t to;
    int from = source(c, first, why, &to, since);
    if (from < 0)
        return -1;
    for (int h = 1; coord_hosts_any(c) && h < c->m->hosts; h++)
        if (!coord_hosts_pid(c, h)) {
            coord_fail_proc(c, first, "%s; host %d's agent never connected: not recovered", why, h);
            return -1;
        }
    for (int i = 0; i < c->np; i++) {
        coord_proc_t *p = &c->p[i];
        if (!rewound(p))
            continue;
        p->lost = 0;
        if (p->remote) {
            p->pid = 0;
            p->hello = p->ready = p->got = 0;
            p->await = 0;
            p->route[0] = '\0';
        } else if (p->pid) {
            p->expect_exit = 1;
            kill(p->pid, SIGKILL);
        }
    }
    c->n_lost = 0;
    c->round.type = 0;
    c->grads_held = 0;
    int rc = coord_pump(c, workers_gone, NULL, coord_startup_s(c));
    if (rc == -ETIMEDOUT)
        coord_fail(c, "rewind: the stages and shards did not exit in %.0f s of SIGKILL", coord_startup_s(c));
    if (rc || reset_state(c, to, from))
        return -1;
    for (int i = 0; i < c->np && !c->failed; i++)
        if (rewound(&c->p[i]) && !c->p[i].remote)
            coord_spawn(c, &c->p[i]);
    rc = coord_pump(c, ready_or_lost, NULL, coord_startup_s(c));
    if (rc == -ETIMEDOUT)
        coord_fail(c, "rewind: the restarted processes did not become ready in %.0f s", coord_startup_s(c));
    return rc ? -1 : 0;
}
