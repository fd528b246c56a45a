/* In-place recovery (see coord_recover.h; DESIGN.md "Recovery"). A stage or optimizer shard that
 * dies during training, is killed for missing heartbeats (stopped), or is stopped by the step
 * watchdog (a main thread that makes no progress) is replaced alone: the others keep running
 * and keep their state. The weights live in the params segment and the shards' state in the
 * optstate segment, so a replacement only attaches to them. A stage lost inside the STEP round
 * takes the step with it: every stage leaves the step (the rings are closed), the gradients
 * and rings go back to the step's start, the loader starts again from the step's cursor, and
 * the step is sent again: the same bits as an undisturbed run. A shard gets again the round it
 * owed (and a snapshot it owed); its rounds are idempotent (stages/roles/optshard.c).
 *
 * A GPU job on one host's IPC plane replaces a lost stage with every stage (restage): its
 * neighbours' device rings and events are mapped into the dead process, whose memory CUDA
 * frees, so they are made anew by new processes; the shards keep their state (GPU shards their
 * fp32 masters, mapping the new stages' buffers and writing the weights into them on REMAP;
 * CPU shards, offload mode, the optstate segment, and are themselves replaced alone). The step
 * is redone when the stages held a part of it: the STEP round, and with GPU shards until the
 * update (the gradients are device memory of the stages). A GPU shard lost, or a stage while
 * GPU shards read the stages' memory (REDUCE, UPDATE), rewinds the job (coord_rewind.c); so does
 * a CPU shard whose one bank of state (optshard.host_banks = 1) its update was writing. */
#include "stages/coord/coord_recover.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/ring.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "stages/coord/coord_ckpt.h"
#include "stages/coord/coord_ctl.h"
#include "stages/coord/coord_proc.h"
#include "stages/coord/coord_report.h"
#include "stages/coord/coord_rewind.h"
#include "stages/coord/coord_setup.h"
#include "stages/job/devdir.h"
#include "stages/job/job.h"
#include "stages/job/ldr_seg.h"
#include "stages/runtime/plane.h"

struct coord_recovery {
    int alone;                        /* a dead stage or shard is replaced alone (its state in shared
                                       * memory: the transport recovers in place, one host) */
    int restage;                      /* a lost stage is replaced with every stage, the shards kept (the
                                       * IPC plane on one host); neither: the job rewinds */
    int redo;                         /* a stage died inside the STEP round: the step runs again */
    double lost_at;                   /* when the first of the lost was found dead */
    char lost_why[512];               /* what happened to it */
    const coord_proc_t *lost_first;
    uint8_t *remap_due;               /* (shards) a GPU shard was sent REMAP, REMAPPED not back yet */
    int recoveries;                   /* this run's */
    int64_t recover_step;             /* the step of the last recovery, */
    int recover_tries;                /* and how many it has had */
    char last_recovery[600];
};

int coord_recoveries(const coord_t *c, const char **last)
{
    *last = c->rec->last_recovery;
    return c->rec->recoveries;
}

static int can_recover(const coord_t *c, const coord_proc_t *p)
{
    if (!c->training || c->failed || c->interrupted)
        return 0;
    if (p->remote) /* its agent restarts it, and every other process, at a rewind */
        return p->role != COORD_CKPTD;
    return p->role == COORD_STAGE || p->role == COORD_OPTSHARD; /* in place, with its peers or by a rewind: plan() */
}

static void lost(coord_t *c, coord_proc_t *p, const char *how)
{
    struct coord_recovery *r = c->rec;
    char name[64];
    coord_who(p, name, sizeof(name));
    if (!c->n_lost) {
        r->lost_at = util_now();
        r->lost_first = p;
        snprintf(r->lost_why, sizeof(r->lost_why), "%s %s", name, how);
    }
    c->n_lost++;
    p->lost = 1;
    if (p->role == COORD_STAGE && p->await == MSG_STEP_DONE)
        r->redo = 1; /* its part of the step in progress is gone */
    p->await = 0;
    LOG_W("%s %s: replacing it", name, how);
}

/* ---- leaving the step ---- */

/* Every stage has left the step (replied, aborted or lost) and the loader is gone. */
static int step_left(coord_t *c, void *arg)
{
    if (coord_loader(c)->pid)
        return 0;
    for (int r = 0; r < c->m->dp; r++)
        for (int s = 0; s < c->m->pp; s++) {
            const coord_proc_t *p = coord_stage(c, s, r);
            if (!p->lost && p->await == MSG_STEP_DONE)
                return 0;
        }
    return 1;
}

/* The loader killed and every ring (and parameter sharding's exchanges) closed: a stage waiting
 * on one leaves the step (ABORTED), one that had all it needed finishes it (STEP_DONE). Then the
 * gradients, the rings and the loader's resume point go back to the step's start. Returns 0 or
 * -1 (the job failed). */
static int stop_step(coord_t *c)
{
    coord_proc_t *L = coord_loader(c);
    if (L->pid) {
        L->expect_exit = 1;
        kill(L->pid, SIGKILL);
    }
    coord_each_ring(c, ring_close, 1);
    if (c->seg_fsdp)
        job_fsdp_set_closed(shm_data(c->seg_fsdp), &c->lay, 1);
    double limit = 2 * c->m->heartbeat_timeout_ms * 1e-3 + 10;
    int rc = coord_pump(c, step_left, NULL, limit);
    if (rc == -ETIMEDOUT)
        coord_fail(c, "recovery: the stages did not leave step %lld within %.0f s of closing the rings",
                   (long long)c->step + 1, limit);
    if (rc)
        return -1;
    memset(shm_data(c->seg_grads), 0, job_params_bytes(&c->lay));
    coord_reset_rings(c);
    if (ldr_seg_prepare_swap(shm_data(c->seg_batch), c->step)) { /* resets the loader's rings too */
        coord_fail(c, "recovery: no loader cursor is recorded for step %lld", (long long)c->step + 1);
        return -1;
    }
    return 0;
}

/* ---- GPU stages: all of them again ---- */

static int stages_gone(coord_t *c, void *redo)
{
    if (*(int *)redo && coord_loader(c)->pid)
        return 0;
    for (int i = 1; i <= c->n_stages; i++)
        if (c->p[i].pid)
            return 0;
    return 1;
}

/* Every stage killed and marked for replacement, and with `redo` the loader; once they are gone,
 * the act rings and the device directory cleared and, with redo, the gradients (offload: the
 * grads segment; GPU shards: they died with the stages) and the loader's resume point back at
 * the step's start. Returns 0 or -1 (the job failed). */
static int stop_stages(coord_t *c, int redo)
{
    coord_proc_t *L = coord_loader(c);
    if (redo && L->pid) {
        L->expect_exit = 1;
        kill(L->pid, SIGKILL);
    }
    for (int i = 1; i <= c->n_stages; i++) {
        coord_proc_t *p = &c->p[i];
        if (p->pid) {
            p->expect_exit = 1;
            kill(p->pid, SIGKILL);
        }
        p->lost = 1;
        p->await = 0;
    }
    int rc = coord_pump(c, stages_gone, &redo, coord_startup_s(c));
    if (rc == -ETIMEDOUT)
        coord_fail(c, "recovery: the stages did not exit in %.0f s of SIGKILL", coord_startup_s(c));
    if (rc)
        return -1;
    coord_reset_rings(c);
    memset(shm_data(c->seg_dev), 0, devdir_stages_bytes(&c->lay)); /* the new stages publish there; the
                                                                      * shards' entries stay theirs */
    if (!redo)
        return 0;
    if (c->seg_grads)
        memset(shm_data(c->seg_grads), 0, job_params_bytes(&c->lay));
    if (ldr_seg_prepare_swap(shm_data(c->seg_batch), c->step)) {
        coord_fail(c, "recovery: no loader cursor is recorded for step %lld", (long long)c->step + 1);
        return -1;
    }
    return 0;
}

static int remapped_or_lost(coord_t *c, void *arg)
{
    if (c->n_lost)
        return 1;
    for (int k = 0; k < c->m->shards; k++)
        if (c->rec->remap_due[k])
            return 0;
    return 1;
}

/* GPU shards: REMAP to each (after any round it is in: commands come in order), and its answer. */
static int remap(coord_t *c)
{
    msg_t rm = {.type = MSG_REMAP, .step = c->step};
    for (int k = 0; k < c->m->shards; k++) {
        c->rec->remap_due[k] = 1;
        coord_send(c, coord_shard(c, k), &rm);
    }
    int rc = coord_pump(c, remapped_or_lost, NULL, coord_startup_s(c));
    if (rc == -ETIMEDOUT)
        coord_fail(c, "recovery: the optimizer shards did not map the new stages in %.0f s", coord_startup_s(c));
    return rc ? -1 : 0;
}

/* REMAPPED from a GPU shard: it mapped the restarted stages and wrote their weights. */
static const char *on_remapped(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    if (!c->rec->remap_due[p->rank])
        return "no remap was asked of it";
    if (m->step != c->step)
        return "not the step in progress";
    c->rec->remap_due[p->rank] = 0;
    return NULL;
}

enum { ALONE, STAGES, REWIND };

/* Whether CPU shard k's state may be torn: one bank (optshard.host_banks = 1) that its update
 * was writing when it died (stages/job/job.h), or a record this host cannot read. */
static int torn(const coord_t *c, int k)
{
    if (c->lay.gpu_shards || c->lay.host_banks > 1)
        return 0;
    return !c->seg_opt || atomic_load(&job_optstate_rec(shm_data(c->seg_opt), k)->writing);
}

/* How the lost processes come back: each alone (CPU jobs; CPU shards of an offload job), with
 * every stage (a GPU stage), or by a rewind (a GPU shard; a CPU shard of one bank killed while
 * its update wrote it: torn; a stage while GPU shards read the stages' memory; across hosts). */
static int plan(const coord_t *c)
{
    for (int i = 0; i < c->np; i++)
        if (c->p[i].lost && c->p[i].role == COORD_OPTSHARD && torn(c, c->p[i].rank))
            return REWIND;
    if (c->rec->alone)
        return ALONE;
    int stages = 0, shards_read = c->round.type == MSG_REDUCE || c->round.type == MSG_UPDATE;
    for (int i = 0; i < c->np; i++) {
        const coord_proc_t *p = &c->p[i];
        if (!p->lost)
            continue;
        if (p->role == COORD_OPTSHARD && !c->lay.gpu_shards && c->lay.hosts == 1)
            continue;
        if (p->role == COORD_STAGE && c->rec->restage && !(c->lay.gpu_shards && shards_read)) {
            stages = 1;
            continue;
        }
        return REWIND;
    }
    return stages ? STAGES : ALONE;
}

/* ---- replacing ---- */

static int ready_or_lost(coord_t *c, void *arg) { return c->n_lost || coord_all_ready(c, NULL); }

/* A new process for p, which keeps what its predecessor had answered in the round in flight
 * (and in the snapshot in flight: coord_ckpt.c keeps that). */
static void replace(coord_t *c, coord_proc_t *p)
{
    int got = p->got;
    p->lost = 0;
    coord_spawn(c, p);
    p->got = got;
}

/* What the replacements (and, for a step redone, every stage) are owed. */
static void resend(coord_t *c, int redo, const int *replaced, int n)
{
    double now = util_now();
    if (redo)
        for (int i = 1; i <= c->n_stages; i++) {
            coord_proc_t *s = &c->p[i];
            s->got = 0;
            s->await = MSG_STEP_DONE;
            s->progress_at = now;
            coord_send(c, s, &c->round);
        }
    for (int j = 0; j < n; j++) {
        coord_proc_t *p = &c->p[replaced[j]];
        if (p->role != COORD_OPTSHARD)
            continue;
        coord_ckpt_resend(c, p); /* commands come in order */
        if ((c->round.type == MSG_REDUCE || c->round.type == MSG_UPDATE) && !p->got) {
            p->await = c->round.type == MSG_REDUCE ? MSG_REDUCED : MSG_UPDATED;
            p->progress_at = now;
            coord_send(c, p, &c->round);
        }
    }
}

/* One line on the progress output, a record in the metrics file. `back_to`: the step a GPU job
 * was rewound to (the time lost then is all since `since`, when that state was current); -1:
 * replaced in place; -2: in place, every stage started again (a GPU stage lost). */
static void report(coord_t *c, const coord_proc_t *first, const char *why, double t_dead, double t_round, int redo,
                   int again, const int *replaced, int n, int64_t at, int64_t back_to, double since)
{
    struct coord_recovery *r = c->rec;
    FILE *f = coord_report_metrics(c);
    double now = util_now(), lost = back_to >= 0 ? now - since : redo ? now - t_round : now - t_dead;
    char what[640] = "", more[96] = "";
    if (back_to >= 0) {
        snprintf(what, sizeof(what), "every stage and optimizer shard started again from %s",
                 c->m->ckpt_load[0] ? c->m->ckpt_load : "the initial weights");
    } else {
        int k = snprintf(what, sizeof(what), "replaced: ");
        for (int j = 0; j < n; j++)
            k += snprintf(what + k, sizeof(what) - (size_t)k, "%s%s (pid %d)", j ? ", " : "", c->p[replaced[j]].id,
                          (int)c->p[replaced[j]].pid);
    }
    r->recoveries++;
    snprintf(r->last_recovery, sizeof(r->last_recovery), "%.560s", why);
    if (again)
        snprintf(more, sizeof(more), " (%d more lost during the recovery)", again);
    if (back_to >= 0)
        printf("recovered %d (rewound, at step %lld): %s; %s in %.2f s%s: steps %lld to %lld run again\n",
               r->recoveries, (long long)at + 1, why, what, now - t_dead, more, (long long)back_to + 1,
               (long long)at + 1);
    else
        printf("recovered %d (%s, at step %lld): %s; %s in %.2f s%s%s\n", r->recoveries,
               back_to == -2 ? "every stage started again" : "in place", (long long)at + 1, why, what, now - t_dead,
               more, redo ? ", the step redone by every stage" : "");
    fflush(stdout);
    if (!f)
        return;
    fprintf(f, "{\"restart\": %d, \"scope\": \"%s\", \"role\": \"%s\", \"rank\": %d, \"replica\": %d, "
            "\"reason\": ", r->recoveries, back_to >= 0 ? "rewind" : back_to == -2 ? "stages" : "process",
            coord_role_name(first->role), first->rank, first->replica);
    util_json_string(f, why);
    if (back_to >= 0)
        fprintf(f, ", \"rewound_to\": %lld", (long long)back_to);
    fprintf(f, ", \"step\": %lld, \"redone\": %s, \"replaced\": %d, \"lost_during\": %d, "
            "\"recovery_s\": %.3f, \"time_lost_s\": %.3f}\n", (long long)at + 1,
            redo || back_to >= 0 ? "true" : "false", n, again, now - t_dead, lost);
    fflush(f);
}

/* Replaces every lost process; with a stage lost inside the STEP round, every stage leaves the
 * step, the rings, gradients and loader go back to its start, and the step is sent again; a
 * shard gets the round it owed again. A GPU job on one host's IPC plane (restage) replaces a
 * lost stage with every stage, the shards keeping their state (GPU shards map the new ones
 * and write their weights: REMAP); other losses of a GPU job rewind it (coord_rewind).
 * Returns 0, COORD_REWOUND (c->step is now the step to run next: the round in flight is void),
 * or -1 once the job failed or was interrupted. */
static int recover(coord_t *c)
{
    struct coord_recovery *r = c->rec;
    char why[sizeof(r->lost_why)]; /* the first loss names the recovery; the others during it are counted */
    snprintf(why, sizeof(why), "%s", r->lost_why);
    const coord_proc_t *first = r->lost_first;
    double t_dead = r->lost_at;
    int64_t at = c->step;
    int again = -1, rewound = 0;
    while (c->n_lost && !c->failed && !c->interrupted) {
        again++;
        if (c->step != r->recover_step) {
            r->recover_step = c->step;
            r->recover_tries = 0;
        }
        if (++r->recover_tries > c->m->max_restarts) {
            if (!c->m->max_restarts)
                coord_fail_proc(c, r->lost_first, "%s; not replaced: job.max_restarts = 0", r->lost_why);
            else
                coord_fail_proc(c, r->lost_first, "%s; not replaced: %d in-place recoveries at step %lld already "
                                "(job.max_restarts = %d)", r->lost_why, c->m->max_restarts, (long long)c->step + 1,
                                c->m->max_restarts);
            return -1;
        }
        int how = plan(c);
        if (how == REWIND) { /* every stage and shard again, from the newest snapshot */
            double since;
            r->redo = 0;
            if (coord_rewind(c, r->lost_first, r->lost_why, &since))
                return -1;
            memset(r->remap_due, 0, (size_t)c->m->shards); /* every shard is new: none owes REMAPPED */
            rewound = 1;
            if (!c->n_lost)
                report(c, first, why, t_dead, c->round_t0, 0, again, NULL, coord_n_workers(c), at, c->step, since);
            continue;
        }
        int redo = r->redo && c->round.type == MSG_STEP, step_again = 0;
        if (how == STAGES) {
            redo = c->round.type == MSG_STEP || c->grads_held;
            step_again = redo && c->round.type != MSG_STEP; /* between its rounds: the step loop's */
            int lost = c->n_lost;
            if (stop_stages(c, redo))
                return -1;
            if (c->n_lost > lost) /* another one died meanwhile: planned again */
                continue;
        } else if (redo && stop_step(c)) {
            return -1;
        }
        int replaced[c->np], n = 0;
        c->n_lost = 0;
        r->redo = 0;
        for (int i = 0; i < c->np; i++)
            if (c->p[i].lost) {
                replace(c, &c->p[i]);
                replaced[n++] = i;
            }
        if (redo)
            coord_spawn(c, coord_loader(c)); /* from the step's cursor (stop_step) */
        int rc = coord_pump(c, ready_or_lost, NULL, coord_startup_s(c));
        if (rc == -ETIMEDOUT)
            coord_fail(c, "recovery: the replacements did not become ready in %.0f s", coord_startup_s(c));
        if (rc)
            return -1;
        if (!c->n_lost && how == STAGES && c->lay.gpu_shards && remap(c))
            return -1;
        if (c->n_lost) { /* one died during the recovery: again, counted */
            r->redo |= redo;
            continue;
        }
        resend(c, redo && !step_again, replaced, n);
        report(c, first, why, t_dead, c->round_t0, redo, again, replaced, n, at, how == STAGES ? -2 : -1, 0);
        rewound |= step_again;
    }
    return c->failed || c->interrupted ? -1 : rewound ? COORD_REWOUND : 0;
}

/* ---- ABORTED ---- */

/* ABORTED from a stage: it left the step in progress. */
static const char *on_aborted(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    if (p->await != MSG_STEP_DONE || m->step != c->step)
        return "no step in progress waits for this stage";
    p->await = 0; /* it is out of the step (step_left) */
    return NULL;
}

/* ---- the registry ---- */

int coord_recover_init(coord_t *c)
{
    struct coord_recovery *r = c->rec = calloc(1, sizeof(*c->rec));
    if (!r || !(r->remap_due = calloc((size_t)c->m->shards, 1)))
        return -ENOMEM;
    /* the weights and the shards' state live in this host's segments (CPU), or in the processes
     * (GPU, and so across hosts), where a loss rewinds the job, every host's agent taking part,
     * but for a stage on one host's IPC plane: the shards keep the state, the stages are
     * started again */
    plane_recovery_t how = plane_recovery(plane_transport(&c->lay));
    r->alone = how == PLANE_RECOVER_IN_PLACE && c->lay.hosts == 1;
    r->restage = how == PLANE_RECOVER_RESTAGE && c->lay.hosts == 1;
    c->reg.can_recover = can_recover;
    c->reg.lost = lost;
    c->reg.recover = recover;
    coord_handle(c, MSG_ABORTED, COORD_FROM(COORD_STAGE), on_aborted);
    coord_handle(c, MSG_REMAPPED, COORD_FROM(COORD_OPTSHARD), on_remapped);
    return 0;
}

void coord_recover_free(coord_t *c)
{
    if (!c->rec)
        return;
    free(c->rec->remap_due);
    free(c->rec);
    c->rec = NULL;
}
