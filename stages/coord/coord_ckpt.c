/* Checkpoints during the run (see coord_ckpt.h): after a checkpoint step the optimizer shards
 * copy their state into the staging segment while the next step runs (SNAPSHOT ... SNAPPED),
 * then checkpointd writes it (SAVE ... SAVED). At most one in flight. Across hosts each host's
 * shards copy into their host's staging segment, every host writes its part of the checkpoint
 * into one temporary directory of the shared checkpoint.folder (SAVE_PART ... WRITTEN: host 0's
 * checkpointd, the agents' `checkpointd --save-part`), and once all are written host 0's
 * checkpointd writes the index over them and renames it into place (COMMIT ... SAVED). Once
 * every shard has copied its slice the snapshot is whole: the newest whole one is what a GPU
 * job rewinds to (coord_rewind.c asks coord_ckpt_whole). */
#include "stages/coord/coord_ckpt.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpointd/ckpt_layout.h"
#include "ipc/util.h"
#include "stages/coord/coord_ctl.h"
#include "stages/coord/coord_hosts.h"
#include "stages/coord/coord_outcome.h"
#include "stages/coord/coord_trace.h"
#include "stages/job/ldr_seg.h"
#include "stages/job/staging.h"

struct coord_ckpt {
    /* the one in flight, from SNAPSHOT to SAVED */
    int busy;
    int memory;                       /* in memory only (snapshot_interval) */
    int n_snapped;                    /* shards that copied their slice, */
    uint8_t *snapped;                 /* (shards) and which */
    int saving;                       /* SAVE sent: checkpointd writes it, SAVED is expected */
    int save_due;                     /* the snapshot is whole but no checkpointd took it yet (a new
                                       * one not ready): SAVE goes when it is */
    int64_t step;
    int64_t save_sent;                /* the newest step SAVE was sent for in this run (0: none) */
    double t0;
    /* across hosts a checkpoint is written in parts, one per host, into one temporary directory
     * of checkpoint.folder, then committed by this host's checkpointd */
    char tmp[64];                     /* that directory's name for the attempt in flight */
    int n_written;                    /* parts written (WRITTEN), */
    uint8_t *written;                 /* (hosts) and whose */
    int committing;                   /* COMMIT sent: SAVED is expected */
    uint64_t part_bytes;              /* what the parts wrote, */
    double part_busy;                 /* and the longest part's time */
    char part_why[800];               /* the first part that failed and why ("" none) */
    /* this run's */
    int started, saved;               /* checkpoints: snapshots begun, SAVED ok */
    int last_saved;                   /* that of training.steps was written */
    int64_t why_step;                 /* the last one that failed saying why, and why */
    char why[1152];
    /* the staging segment holds the whole state after this step (-1: no) */
    int64_t whole_step;
    double whole_at;                  /* when that step ended */
    int wholes;                       /* snapshots made whole in this run */
};

static const char *on_snapped(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);
static const char *on_written(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);
static const char *on_saved(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);
static void save(coord_t *c);

/* checkpointd said ready: a checkpoint its predecessor did not finish goes to it. */
static void on_ready(coord_t *c, coord_proc_t *p)
{
    if (p->role == COORD_CKPTD)
        save(c);
}

/* checkpointd died or hung while writing: its temporary directory never becomes a checkpoint,
 * and the new one writes the same snapshot again (nothing touches it until SAVED). */
static void on_restart(coord_t *c, coord_proc_t *p, const char *how)
{
    struct coord_ckpt *k = c->ck;
    if (p->role != COORD_CKPTD || !k->saving)
        return;
    fprintf(stderr, "ctitan: checkpointd %s while writing the checkpoint of step %lld: a new checkpointd "
            "writes it again, training goes on\n", how, (long long)k->step);
    k->saving = 0;
    k->save_due = 1;
}

int coord_ckpt_init(coord_t *c)
{
    struct coord_ckpt *k = c->ck = calloc(1, sizeof(*c->ck));
    if (!k || !(k->snapped = calloc((size_t)c->m->shards, 1)) || !(k->written = calloc((size_t)c->m->hosts, 1)))
        return -ENOMEM;
    k->whole_step = -1;
    coord_handle(c, MSG_SNAPPED, COORD_FROM(COORD_OPTSHARD), on_snapped);
    coord_handle(c, MSG_SAVED, COORD_FROM(COORD_CKPTD), on_saved);
    coord_handle(c, MSG_WRITTEN, COORD_FROM(COORD_CKPTD) | COORD_FROM_AGENT, on_written);
    coord_on_ready(c, on_ready);
    coord_on_restart(c, on_restart);
    return 0;
}

void coord_ckpt_free(coord_t *c)
{
    if (!c->ck)
        return;
    free(c->ck->snapped);
    free(c->ck->written);
    free(c->ck);
    c->ck = NULL;
}

void coord_ckpt_begin(coord_t *c, int64_t whole)
{
    c->ck->whole_step = whole;
    c->ck->whole_at = c->train_t0;
    c->ck->wholes = whole >= 0;
}

int coord_ckpt_busy(const coord_t *c, int64_t *step)
{
    if (step)
        *step = c->ck->step;
    return c->ck->busy;
}

int64_t coord_ckpt_whole(const coord_t *c, double *at, int *count)
{
    if (at)
        *at = c->ck->whole_at;
    if (count)
        *count = c->ck->wholes;
    return c->ck->whole_step;
}

/* The staging segment's snapshot of `step` is whole (every shard copied its slice), or is
 * being overwritten (step -1). */
static void whole(coord_t *c, int64_t step)
{
    struct coord_ckpt *k = c->ck;
    k->whole_step = step;
    if (step >= 0) {
        k->whole_at = k->t0;
        k->wholes++;
    }
}

static int idle(coord_t *c, void *arg) { return !c->ck->busy || c->n_lost; }

int coord_ckpt_wait(coord_t *c) { return coord_wait(c, idle, NULL); /* a shard that owed its snapshot */ }

/* SNAPSHOT of `done` steps to the shards (the staging segment is overwritten from now on).
 * Returns 0, or -1 with the reason in k->why when no loader cursor is recorded for the next step. */
static int snapshot(coord_t *c, int64_t done, int memory)
{
    struct coord_ckpt *k = c->ck;
    staging_hdr_t *h = shm_data(c->seg_ckpt);
    size_t len = 0;
    if (ldr_seg_cursor(shm_data(c->seg_batch), done, h->cursor, &len)) {
        snprintf(k->why, sizeof(k->why), "no loader cursor is recorded for step %lld", (long long)done + 1);
        k->why_step = done;
        return -1;
    }
    h->cursor_len = (uint32_t)len;
    whole(c, -1);
    atomic_store(&h->step, done);
    k->busy = 1;
    k->memory = memory;
    k->step = done;
    k->n_snapped = 0;
    k->saving = k->save_due = 0;
    memset(k->snapped, 0, (size_t)c->m->shards);
    k->t0 = util_now();
    msg_t snap = {.type = MSG_SNAPSHOT, .step = done};
    for (int s = 0; s < c->m->shards; s++)
        coord_send(c, coord_shard(c, s), &snap);
    return 0;
}

/* After `done` steps: the shards copy their state into the staging segment while the next
 * step runs (they are idle until its REDUCE, which they take only after the copy), then
 * checkpointd writes it. One snapshot at a time: if the previous one is still being written
 * training waits for it, and says so. */
int coord_start_checkpoint(coord_t *c, int64_t done)
{
    struct coord_ckpt *k = c->ck;
    int rc;
    if (k->busy && k->memory && (rc = coord_ckpt_wait(c))) /* an in-memory one: a copy, soon done */
        return rc;
    if (k->busy) {
        double t0 = util_now();
        fprintf(stderr, "ctitan: the checkpoint of step %lld is still being written at step %lld: waiting for it "
                "(checkpoint.interval is too short for this storage)\n", (long long)k->step, (long long)done);
        if ((rc = coord_ckpt_wait(c)))
            return rc;
        fprintf(stderr, "ctitan: waited %.2f s for the checkpoint of step %lld\n", util_now() - t0,
                (long long)k->step);
    }
    if (coord_pump(c, coord_proc_ready, coord_ckptd(c), coord_startup_s(c))) { /* a restarted checkpointd */
        coord_fail_proc(c, coord_ckptd(c), "checkpointd did not become ready in %.0f s", coord_startup_s(c));
        return -1;
    }
    k->started++;
    if (snapshot(c, done, 0)) {
        fprintf(stderr, "ctitan: %s: no checkpoint of it\n", k->why);
        return 0;
    }
    coord_note_checkpoint(c, done);
    return 0;
}

void coord_start_snapshot(coord_t *c, int64_t done)
{
    if (snapshot(c, done, 1))
        fprintf(stderr, "ctitan: %s: no in-memory snapshot of it\n", c->ck->why);
}

void coord_ckpt_drop(coord_t *c)
{
    struct coord_ckpt *k = c->ck;
    if (k->busy && !k->saving && !k->save_due) { /* its shards are gone: taken again when its step is */
        fprintf(stderr, "ctitan: the snapshot of step %lld was being taken: dropped\n", (long long)k->step);
        k->busy = 0;
    }
}

void coord_ckpt_resend(coord_t *c, coord_proc_t *p)
{
    struct coord_ckpt *k = c->ck;
    if (p->role != COORD_OPTSHARD || !k->busy || k->saving || k->save_due || k->snapped[p->rank])
        return;
    msg_t snap = {.type = MSG_SNAPSHOT, .step = k->step};
    coord_send(c, p, &snap);
}

/* A shard has copied its slice of the checkpoint in flight; once all have, checkpointd writes it. */
static const char *on_snapped(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    struct coord_ckpt *k = c->ck;
    if (!k->busy || k->saving || m->step != k->step)
        return "no snapshot of that step is being taken";
    if (k->snapped[p->rank])
        return "this shard said snapped already";
    k->snapped[p->rank] = 1;
    coord_trace_work(c, p, "snapshot", m->t_busy);
    if (++k->n_snapped != c->m->shards)
        return NULL;
    /* every shard has copied its state: checkpointd takes it from here */
    whole(c, k->step);
    if (k->memory) { /* nothing to write */
        k->busy = 0;
        return NULL;
    }
    k->save_due = 1;
    save(c);
    return NULL;
}

/* SAVE_PART to every host's writer: a new temporary directory per attempt, named for this
 * checkpointd (its retention removes the directory of one that died), so that a part written
 * for an earlier attempt is never taken for this one's. */
static void save_parts(coord_t *c, coord_proc_t *d)
{
    struct coord_ckpt *k = c->ck;
    ckpt_tmp_name(k->tmp, sizeof(k->tmp), k->step, (int)d->pid);
    msg_t part = {.type = MSG_SAVE_PART, .step = k->step, .text = k->tmp, .text_len = strlen(k->tmp)};
    if (ctl_send(c->ctl, d->route, &part)) /* it just died: it is restarted, and SAVE waits */
        return;
    k->n_written = k->committing = 0;
    memset(k->written, 0, (size_t)c->m->hosts);
    k->part_bytes = 0;
    k->part_busy = 0;
    k->part_why[0] = '\0';
    for (int h = 1; h < c->m->hosts; h++)
        if (coord_hosts_send(c, h, &part))
            coord_fail(c, "cannot send SAVE_PART to host %d's agent", h);
    k->save_due = 0;
    k->saving = 1;
}

/* Hands the whole snapshot in the staging segment to checkpointd (SAVE), now if it is ready,
 * else when it says ready: a checkpointd restarted while it wrote, or before it took the
 * snapshot, writes the same snapshot again, which nothing touches until SAVED. */
static void save(coord_t *c)
{
    struct coord_ckpt *k = c->ck;
    coord_proc_t *d = coord_ckptd(c);
    if (!k->save_due || !d->ready)
        return;
    if (c->m->hosts > 1) {
        save_parts(c, d);
        return;
    }
    msg_t msg = {.type = MSG_SAVE, .step = k->step, .ok = k->step <= k->save_sent};
    if (ctl_send(c->ctl, d->route, &msg)) /* it just died: it is restarted, and SAVE waits */
        return;
    if (k->step > k->save_sent)
        k->save_sent = k->step;
    k->save_due = 0;
    k->saving = 1;
}

/* WRITTEN from a host's writer (p: host 0's checkpointd; else another host's agent): once every
 * host's part of the attempt in flight is written, COMMIT (or, when one failed, the whole
 * checkpoint given up). */
static const char *on_written(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    struct coord_ckpt *k = c->ck;
    int host = p ? 0 : coord_peer_host(from);
    size_t n = strlen(k->tmp);
    const char *text = m->text ? m->text : "";
    if (k->save_due && m->step == k->step)
        return NULL; /* an attempt whose checkpointd died: the next one is due */
    if (!k->saving || k->committing || m->step != k->step || c->m->hosts == 1)
        return "no part of that checkpoint is being written";
    /* an agent's names its attempt's directory, then ": why" when it failed (host 0's checkpointd
     * says only why: it cannot outlive its attempt, and what a dead one left is dropped) */
    const char *why = text;
    if (host > 0) {
        if (strncmp(text, k->tmp, n) || (text[n] && text[n] != ':'))
            return NULL; /* an attempt before this one (its checkpointd died): gone with its directory */
        why = text[n] == ':' ? text + n + 1 + (text[n + 1] == ' ') : "";
    }
    if (k->written[host])
        return "this host's part is written already";
    k->written[host] = 1;
    k->n_written++;
    k->part_bytes += m->progress;
    k->part_busy = m->t_busy > k->part_busy ? m->t_busy : k->part_busy;
    if (!m->ok && !k->part_why[0])
        snprintf(k->part_why, sizeof(k->part_why), "host %d: %.700s", host, why[0] ? why : "no reason given");
    if (k->n_written < c->m->hosts)
        return NULL;
    /* every part is in: the index over them (or, with one failed, nothing) */
    msg_t commit = {.type = MSG_COMMIT, .step = k->step, .ok = !k->part_why[0], .text = k->tmp, .text_len = n};
    if (ctl_send(c->ctl, coord_ckptd(c)->route, &commit) == 0)
        k->committing = 1; /* else it just died: its restart makes it an attempt again */
    return NULL;
}

/* Only the answer to the SAVE in flight ends a checkpoint: until then checkpointd reads the
 * staging segment, which no new snapshot may touch. */
static const char *on_saved(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    struct coord_ckpt *k = c->ck;
    int parts = c->m->hosts > 1;
    if (!k->saving || m->step != k->step || (parts && !k->committing))
        return "no checkpoint of that step is being written";
    k->busy = k->saving = k->committing = 0;
    /* across hosts: what every part wrote, in the longest part's time */
    double bytes = parts ? (double)k->part_bytes : (double)m->progress, secs = parts ? k->part_busy : m->t_busy;
    coord_trace_work(c, p, "save", m->t_busy);
    if (m->ok) {
        k->saved++;
        coord_note_saved(c, m->step);
        k->last_saved |= m->step == c->m->steps;
        double dt = util_now() - k->t0;
        printf("checkpoint: step %lld saved to %s (%.1f MiB written in %.2f s, %.2f GB/s; %.2f s after the "
               "snapshot)\n", (long long)m->step, m->text ? m->text : "?", bytes / 1048576.0, secs,
               secs > 0 ? bytes / secs / 1e9 : 0.0, dt);
        fflush(stdout);
    } else {
        /* a part that failed says why; checkpointd then only gave the checkpoint up */
        snprintf(k->why, sizeof(k->why), "%s", k->part_why[0] ? k->part_why : m->text ? m->text : "(no reason given)");
        k->why_step = m->step;
        fprintf(stderr, "ctitan: checkpoint of step %lld failed: %s (training goes on)\n", (long long)m->step, k->why);
    }
    return NULL;
}

void coord_ckpt_check_last(coord_t *c)
{
    const manifest_t *m = c->m;
    struct coord_ckpt *k = c->ck;
    if (!m->ckpt_enable || k->last_saved)
        return;
    coord_fail(c, "the checkpoint of step %d, the last, was not written (%s): the run's final state is not "
               "saved (%d of %d checkpoint%s of this run written)", m->steps,
               k->why_step == m->steps && k->why[0] ? k->why : "checkpointd died or could not be reached: see above",
               k->saved, k->started, k->started == 1 ? "" : "s");
}
