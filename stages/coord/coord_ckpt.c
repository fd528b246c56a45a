/* Checkpoints during the run (see coord_priv.h): after a checkpoint step the optimizer shards
 * copy their state into the staging segment while the next step runs (SNAPSHOT ... SNAPPED),
 * then checkpointd writes it (SAVE ... SAVED). At most one in flight. Across hosts each host's
 * shards copy into their host's staging segment, every host writes its part of the checkpoint
 * into one temporary directory of the shared checkpoint.folder (SAVE_PART ... WRITTEN: host 0's
 * checkpointd, the agents' `checkpointd --save-part`), and once all are written host 0's
 * checkpointd writes the index over them and renames it into place (COMMIT ... SAVED). */
#include "stages/coord/coord_priv.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "checkpointd/ckpt_layout.h"
#include "ipc/util.h"
#include "stages/job/ldr_seg.h"
#include "stages/job/staging.h"

static int ckpt_idle(coord_t *c, void *arg) { return !c->ck_busy || c->n_lost; }

int coord_ckpt_wait(coord_t *c)
{
    int rc;
    while (!(rc = coord_pump(c, ckpt_idle, NULL, 1e9)) && c->n_lost) /* a shard that owed its snapshot */
        if ((rc = coord_recover(c)))
            break;
    return rc;
}

/* SNAPSHOT of `done` steps to the shards (the staging segment is overwritten from now on).
 * Returns 0, or -1 with c->ck_why when no loader cursor is recorded for the next step. */
static int snapshot(coord_t *c, int64_t done, int memory)
{
    staging_hdr_t *h = shm_data(c->seg_ckpt);
    size_t len = 0;
    if (ldr_seg_cursor(shm_data(c->seg_batch), done, h->cursor, &len)) {
        snprintf(c->ck_why, sizeof(c->ck_why), "no loader cursor is recorded for step %lld", (long long)done + 1);
        c->ck_why_step = done;
        return -1;
    }
    h->cursor_len = (uint32_t)len;
    coord_rewind_point(c, -1);
    atomic_store(&h->step, done);
    c->ck_busy = 1;
    c->ck_memory = memory;
    c->ck_step = done;
    c->ck_snapped = 0;
    c->ck_saving = c->ck_save_due = 0;
    for (int k = 0; k < c->m->shards; k++)
        coord_shard(c, k)->snapped = 0;
    c->ck_t0 = util_now();
    msg_t snap = {.type = MSG_SNAPSHOT, .step = done};
    for (int k = 0; k < c->m->shards; k++)
        coord_send(c, coord_shard(c, k), &snap);
    return 0;
}

/* After `done` steps: the shards copy their state into the staging segment while the next
 * step runs (they are idle until its REDUCE, which they take only after the copy), then
 * checkpointd writes it. One snapshot at a time: if the previous one is still being written
 * training waits for it, and says so. */
int coord_start_checkpoint(coord_t *c, int64_t done)
{
    int rc;
    if (c->ck_busy && c->ck_memory && (rc = coord_ckpt_wait(c))) /* an in-memory one: a copy, soon done */
        return rc;
    if (c->ck_busy) {
        double t0 = util_now();
        fprintf(stderr, "ctitan: the checkpoint of step %lld is still being written at step %lld: waiting for it "
                "(checkpoint.interval is too short for this storage)\n", (long long)c->ck_step, (long long)done);
        if ((rc = coord_ckpt_wait(c)))
            return rc;
        fprintf(stderr, "ctitan: waited %.2f s for the checkpoint of step %lld\n", util_now() - t0,
                (long long)c->ck_step);
    }
    if (coord_pump(c, coord_proc_ready, coord_ckptd(c), COORD_STARTUP_TIMEOUT_S)) { /* a restarted checkpointd */
        coord_fail_proc(c, coord_ckptd(c), "checkpointd did not become ready in %.0f s", COORD_STARTUP_TIMEOUT_S);
        return -1;
    }
    c->ck_started++;
    if (snapshot(c, done, 0)) {
        fprintf(stderr, "ctitan: %s: no checkpoint of it\n", c->ck_why);
        return 0;
    }
    coord_note_checkpoint(c, done);
    return 0;
}

void coord_start_snapshot(coord_t *c, int64_t done)
{
    if (snapshot(c, done, 1))
        fprintf(stderr, "ctitan: %s: no in-memory snapshot of it\n", c->ck_why);
}

/* A shard has copied its slice of the checkpoint in flight; once all have, checkpointd writes it. */
const char *coord_on_snapped(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    if (!c->ck_busy || c->ck_saving || m->step != c->ck_step)
        return "no snapshot of that step is being taken";
    if (p->snapped)
        return "this shard said snapped already";
    p->snapped = 1;
    coord_trace_work(c, p, "snapshot", m->t_busy);
    if (++c->ck_snapped != c->m->shards)
        return NULL;
    /* every shard has copied its state: checkpointd takes it from here */
    coord_rewind_point(c, c->ck_step);
    if (c->ck_memory) { /* nothing to write */
        c->ck_busy = 0;
        return NULL;
    }
    c->ck_save_due = 1;
    coord_ckpt_save(c);
    return NULL;
}

/* Hands the whole snapshot in the staging segment to checkpointd (SAVE), now if it is ready,
 * else when it says ready: a checkpointd restarted while it wrote, or before it took the
 * snapshot, writes the same snapshot again, which nothing touches until SAVED. */
/* SAVE_PART to every host's writer: a new temporary directory per attempt, named for this
 * checkpointd (its retention removes the directory of one that died), so that a part written
 * for an earlier attempt is never taken for this one's. */
static void save_parts(coord_t *c, coord_proc_t *d)
{
    ckpt_tmp_name(c->ck_tmp, sizeof(c->ck_tmp), c->ck_step, (int)d->pid);
    msg_t part = {.type = MSG_SAVE_PART, .step = c->ck_step, .text = c->ck_tmp, .text_len = strlen(c->ck_tmp)};
    if (ctl_send(c->ctl, d->route, &part)) /* it just died: coord_reap() restarts it, and SAVE waits */
        return;
    c->ck_n_written = c->ck_written0 = c->ck_committing = 0;
    c->ck_part_bytes = 0;
    c->ck_part_busy = 0;
    c->ck_part_why[0] = '\0';
    for (int h = 1; h < c->m->hosts; h++) {
        c->agents[h].written = 0;
        if (ctl_send(c->ctl, c->agents[h].route, &part))
            coord_fail(c, "cannot send SAVE_PART to host %d's agent", h);
    }
    c->ck_save_due = 0;
    c->ck_saving = 1;
}

void coord_ckpt_save(coord_t *c)
{
    coord_proc_t *d = coord_ckptd(c);
    if (!c->ck_save_due || !d->ready)
        return;
    if (c->m->hosts > 1) {
        save_parts(c, d);
        return;
    }
    msg_t save = {.type = MSG_SAVE, .step = c->ck_step};
    if (ctl_send(c->ctl, d->route, &save)) /* it just died: coord_reap() restarts it, and SAVE waits */
        return;
    c->ck_save_due = 0;
    c->ck_saving = 1;
}

const char *coord_on_written(coord_t *c, int host, const msg_t *m)
{
    size_t n = strlen(c->ck_tmp);
    const char *text = m->text ? m->text : "";
    if (c->ck_save_due && m->step == c->ck_step)
        return NULL; /* an attempt whose checkpointd died: the next one is due */
    if (!c->ck_saving || c->ck_committing || m->step != c->ck_step || c->m->hosts == 1)
        return "no part of that checkpoint is being written";
    /* an agent's names its attempt's directory, then ": why" when it failed (host 0's checkpointd
     * says only why: it cannot outlive its attempt, and what a dead one left is dropped) */
    const char *why = text;
    if (host > 0) {
        if (strncmp(text, c->ck_tmp, n) || (text[n] && text[n] != ':'))
            return NULL; /* an attempt before this one (its checkpointd died): gone with its directory */
        why = text[n] == ':' ? text + n + 1 + (text[n + 1] == ' ') : "";
    }
    int *done = host ? &c->agents[host].written : &c->ck_written0;
    if (*done)
        return "this host's part is written already";
    *done = 1;
    c->ck_n_written++;
    c->ck_part_bytes += m->progress;
    c->ck_part_busy = m->t_busy > c->ck_part_busy ? m->t_busy : c->ck_part_busy;
    if (!m->ok && !c->ck_part_why[0])
        snprintf(c->ck_part_why, sizeof(c->ck_part_why), "host %d: %.700s", host, why[0] ? why : "no reason given");
    if (c->ck_n_written < c->m->hosts)
        return NULL;
    /* every part is in: the index over them (or, with one failed, nothing) */
    msg_t commit = {.type = MSG_COMMIT, .step = c->ck_step, .ok = !c->ck_part_why[0], .text = c->ck_tmp,
                    .text_len = n};
    if (ctl_send(c->ctl, coord_ckptd(c)->route, &commit) == 0)
        c->ck_committing = 1; /* else it just died: restart_ckptd() makes it an attempt again */
    return NULL;
}

/* Only the answer to the SAVE in flight ends a checkpoint: until then checkpointd reads the
 * staging segment, which no new snapshot may touch. */
const char *coord_on_saved(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    int parts = c->m->hosts > 1;
    if (!c->ck_saving || m->step != c->ck_step || (parts && !c->ck_committing))
        return "no checkpoint of that step is being written";
    c->ck_busy = c->ck_saving = c->ck_committing = 0;
    /* across hosts: what every part wrote, in the longest part's time */
    double bytes = parts ? (double)c->ck_part_bytes : (double)m->progress, secs = parts ? c->ck_part_busy : m->t_busy;
    coord_trace_work(c, p, "save", m->t_busy);
    if (m->ok) {
        c->ck_saved++;
        coord_note_saved(c, m->step);
        c->ck_last_saved |= m->step == c->m->steps;
        double dt = util_now() - c->ck_t0;
        printf("checkpoint: step %lld saved to %s (%.1f MiB written in %.2f s, %.2f GB/s; %.2f s after the "
               "snapshot)\n", (long long)m->step, m->text ? m->text : "?", bytes / 1048576.0, secs,
               secs > 0 ? bytes / secs / 1e9 : 0.0, dt);
        fflush(stdout);
    } else {
        /* a part that failed says why; checkpointd then only gave the checkpoint up */
        snprintf(c->ck_why, sizeof(c->ck_why), "%s",
                 c->ck_part_why[0] ? c->ck_part_why : m->text ? m->text : "(no reason given)");
        c->ck_why_step = m->step;
        fprintf(stderr, "ctitan: checkpoint of step %lld failed: %s (training goes on)\n", (long long)m->step,
                c->ck_why);
    }
    return NULL;
}

void coord_ckpt_check_last(coord_t *c)
{
    const manifest_t *m = c->m;
    if (!m->ckpt_enable || c->ck_last_saved)
        return;
    coord_fail(c, "the checkpoint of step %d, the last, was not written (%s): the run's final state is not "
               "saved (%d of %d checkpoint%s of this run written)", m->steps,
               c->ck_why_step == m->steps && c->ck_why[0] ? c->ck_why
                                                          : "checkpointd died or could not be reached: see above",
               c->ck_saved, c->ck_started, c->ck_started == 1 ? "" : "s");
}
