/* The CPU's data plane (plane.h "shm"): each link is one of the act segment's shared-memory
 * rings (stages/job/job.h), M slots of [mb*T, dim] fp32. A consumer reads the producer's slot in
 * place and a producer writes its output straight into the slot it reserved: no copies. */
#include <errno.h>
#include <stdlib.h>

#include "stages/runtime/fsdp.h"
#include "stages/runtime/plane_link.h"

typedef struct {
    plane_end_t base;
    ring_t *ring;
    int64_t step;                /* the tags of the reserved slot */
    int mb;
} shm_end_t;

static int end_recv(plane_end_t *e, int64_t step, int mb, void **slot)
{
    shm_end_t *s = (shm_end_t *)e;
    return plane_link_take(e->p, s->ring, step, mb, slot);
}

static int end_done(plane_end_t *e)
{
    ring_release(((shm_end_t *)e)->ring);
    return 0;
}

static int end_reserve(plane_end_t *e, int64_t step, int mb, void **slot)
{
    shm_end_t *s = (shm_end_t *)e;
    s->step = step, s->mb = mb;
    return plane_link_reserve(e->p, s->ring, slot);
}

static int end_send(plane_end_t *e)
{
    shm_end_t *s = (shm_end_t *)e;
    int rc = ring_commit(s->ring, (uint64_t)s->step, (uint64_t)s->mb, e->p->lay.act_slot);
    return rc ? plane_fail(e->p, rc, "ring %s: nothing reserved to send", ring_name(s->ring)) : 0;
}

static void end_destroy(plane_end_t *e)
{
    ring_detach(&((shm_end_t *)e)->ring);
    free(e);
}

static const plane_end_ops_t end_ops = {end_recv, end_done, end_reserve, end_send, end_destroy};

static int add_end(plane_t *p, plane_link_t l, int boundary, int grad)
{
    shm_end_t *s = calloc(1, sizeof(*s));
    if (!s)
        return plane_fail(p, -ENOMEM, "out of memory");
    s->base = (plane_end_t){.ops = &end_ops, .p = p};
    p->end[l] = &s->base;
    return plane_link_attach(p, &s->ring, boundary, grad);
}

/* The links of p->cfg's virtual stage: to the one before it and the one after it. */
static int links(plane_t *p)
{
    int rc = 0, v = p->cfg.vstage;
    if (v > 0 && !(rc = add_end(p, PLANE_ACT_IN, v - 1, 0)))
        rc = add_end(p, PLANE_GRAD_OUT, v - 1, 1);
    if (!rc && v < p->lay.S - 1 && !(rc = add_end(p, PLANE_ACT_OUT, v, 0)))
        rc = add_end(p, PLANE_GRAD_IN, v, 1);
    return rc;
}

/* ---- parameter sharding: the group's exchange in the fsdp segment (fsdp.h) ---- */

typedef struct {
    shm_seg_t *seg;
    fsdp_t *x;
} shm_shard_t;

static int shard_step_begin(plane_t *p, int64_t step)
{
    fsdp_step(((shm_shard_t *)p->ctx)->x, step);
    return 0;
}

static void shard_destroy(plane_t *p)
{
    shm_shard_t *s = p->ctx;
    if (!s)
        return;
    fsdp_destroy(&s->x);
    shm_detach(&s->seg);
    free(s);
    p->ctx = NULL;
}

static const plane_ops_t shard_ops = {.step_begin = shard_step_begin, .destroy = shard_destroy};

/* Replica r is member r % fsdp of group r / fsdp, whose copy of the gradients cfg.g is part of
 * (its range [begin, end) of the flat space). */
static int shard(plane_t *p, shard_io_t *io)
{
    const plane_cfg_t *c = &p->cfg;
    shm_shard_t *s = p->ctx;
    int rc;
    if (!s) {
        if (!(s = p->ctx = calloc(1, sizeof(*s))))
            return plane_fail(p, -ENOMEM, "out of memory");
        p->ops = &shard_ops;
        if ((rc = shm_attach(&s->seg, c->job, JOB_FSDP_SEG, p->err, sizeof(p->err))) ||
            (rc = fsdp_new(&s->x, shm_data(s->seg), &p->lay, job_copy_of(&p->lay, c->replica),
                           c->replica % p->lay.fsdp, c->vstage, c->g - c->begin, &p->waited, c->waiting, c->arg,
                           p->err, sizeof(p->err))))
            return rc;
    }
    *io = fsdp_io(s->x);
    return 0;
}

/* A CPU job's state lives in shared memory (the weights in params, the shards' in optstate):
 * whoever is lost is replaced alone. */
const plane_transport_t plane_shm = {.name = "shm", .recovery = PLANE_RECOVER_IN_PLACE, .act_segment = 1,
                                     .links = links, .shard = shard};
