/* What a supervised run tells its supervisor (see coord.h, coord_outcome_t): where training
 * started, each step's end, each checkpoint begun and saved, and why the run failed, written
 * into memory the supervisor shares as they happen, so that a kill -9 of the coordinator
 * loses none of it. Also the leftovers of a coordinator that died without cleaning up. */
#include "stages/coord/coord_outcome.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ipc/util.h"
#include "stages/coord/coord_keys.h"

void coord_note_start(coord_t *c)
{
    if (!c->out)
        return;
    c->out->first_step = c->out->last_step = c->step;
}

void coord_note_step(coord_t *c)
{
    if (!c->out)
        return;
    c->out->last_step = c->step + 1;
    c->out->last_step_at = util_now();
    c->out->steps_run++;
}

void coord_note_checkpoint(coord_t *c, int64_t done)
{
    if (!c->out)
        return;
    coord_outcome_t *o = c->out;
    int i = o->n_ck % COORD_OUT_CKPTS;
    o->ck[i].step = done;
    o->ck[i].done_at = o->last_step_at;
    o->ck[i].saved = 0;
    o->n_ck++;
}

void coord_note_saved(coord_t *c, int64_t step)
{
    if (!c->out)
        return;
    coord_outcome_t *o = c->out;
    for (int k = 0; k < o->n_ck && k < COORD_OUT_CKPTS; k++)
        if (o->ck[k].step == step)
            o->ck[k].saved = 1;
}

void coord_note_load_failed(coord_t *c)
{
    if (c->out)
        c->out->load_failed = 1;
}

void coord_note_failure(coord_t *c, const char *why)
{
    if (!c->out)
        return;
    coord_outcome_t *o = c->out;
    const coord_proc_t *p = c->culprit;
    snprintf(o->role, sizeof(o->role), "%s", p ? coord_role_name(p->role) : "coordinator");
    o->rank = p ? p->rank : 0;
    o->replica = p ? p->replica : 0;
    snprintf(o->why, sizeof(o->why), "%s", why);
    o->failed = 1;
}

/* The ipc:// endpoint's socket file (a tcp:// one has none). */
static void remove_socket(const char *endpoint)
{
    if (!strncmp(endpoint, "ipc://", 6))
        unlink(endpoint + 6);
}

int coord_remove_leftovers(const char *job, pid_t owner, int async)
{
    shm_seg_t *seg = NULL;
    if (shm_attach(&seg, job, "job", NULL, 0))
        return 0; /* no job segment: nothing of a run of it (coord_make_segments makes that one first) */
    job_hdr_t h = *(job_hdr_t *)shm_data(seg);
    shm_detach(&seg);
    if (h.magic != JOB_MAGIC || h.owner_pid != owner || job_owner_alive(&h))
        return 0; /* another run's, or one still running */
    h.endpoint[sizeof(h.endpoint) - 1] = 0;
    h.run_dir[sizeof(h.run_dir) - 1] = 0;
    if (h.run_dir[0])
        coord_keys_remove_dir(h.run_dir);
    remove_socket(h.endpoint);
    return async ? shm_remove_all_async(job) : shm_remove_all(job);
}
