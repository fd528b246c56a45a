/* The GPU data plane on one host (plane.h "ipc"): each link is a device ring of M bf16 slots
 * that its producer allocates and publishes in the device directory (stages/job/devdir.h) and its
 * consumer maps through CUDA IPC, ordered by the act segment's shm ring of the same boundary,
 * whose slots then carry only the (step, mb) tags:
 *
 *   producer: ring_reserve, its stream waits on read[i]; fills slot i; records written[i],
 *             ring_commit
 *   consumer: ring_peek (tags checked), its stream waits on written[i]; reads slot i; records
 *             read[i], ring_release
 *
 * so the host ring's sequence numbers decide which record each wait sees, and no host waits
 * for the device. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "stages/job/devdir.h"
#include "stages/runtime/plane_link.h"

typedef struct {
    plane_end_t base;
    ring_t *ring;
    char *slots;                 /* device: M slots of lay.dev_slot bytes */
    void **written, **read;      /* (M) interprocess events */
    int own;                     /* this stage's outgoing ring (else mapped from the neighbour) */
    uint32_t slot;               /* the slot in hand */
    int64_t step;                /* the tags of the reserved slot */
    int mb;
} ipc_end_t;

#define CU(p) (p)->cu

/* The stream waits for ev's last record (unless the test hook drops the wait). */
static int wait_for(ipc_end_t *d, void *ev)
{
    plane_t *p = d->base.p;
    if (plane_event_waits() && CU(p)->stream_wait(p->cfg.stream, ev))
        return plane_fail(p, -EIO, "ring %s: %s", ring_name(d->ring), CU(p)->last_error());
    return 0;
}

static int record(ipc_end_t *d, void *ev)
{
    plane_t *p = d->base.p;
    if (CU(p)->event_record(ev, p->cfg.stream))
        return plane_fail(p, -EIO, "ring %s: %s", ring_name(d->ring), CU(p)->last_error());
    return 0;
}

static void *device_slot(ipc_end_t *d) { return d->slots + (size_t)d->slot * d->base.p->lay.dev_slot; }

static int end_recv(plane_end_t *e, int64_t step, int mb, void **slot)
{
    ipc_end_t *d = (ipc_end_t *)e;
    void *host;
    int rc = plane_link_take(e->p, d->ring, step, mb, &host);
    if (rc)
        return rc;
    d->slot = ring_slot_of(d->ring, host);
    *slot = device_slot(d);
    return wait_for(d, d->written[d->slot]);
}

static int end_done(plane_end_t *e)
{
    ipc_end_t *d = (ipc_end_t *)e;
    int rc = record(d, d->read[d->slot]);
    ring_release(d->ring);
    return rc;
}

static int end_reserve(plane_end_t *e, int64_t step, int mb, void **slot)
{
    ipc_end_t *d = (ipc_end_t *)e;
    void *host;
    d->step = step, d->mb = mb;
    int rc = plane_link_reserve(e->p, d->ring, &host);
    if (rc)
        return rc;
    d->slot = ring_slot_of(d->ring, host);
    *slot = device_slot(d);
    return wait_for(d, d->read[d->slot]);
}

static int end_send(plane_end_t *e)
{
    ipc_end_t *d = (ipc_end_t *)e;
    int rc = record(d, d->written[d->slot]);
    if (rc)
        return rc;
    rc = ring_commit(d->ring, (uint64_t)d->step, (uint64_t)d->mb, e->p->lay.act_slot);
    return rc ? plane_fail(e->p, rc, "ring %s: nothing reserved to send", ring_name(d->ring)) : 0;
}

static void end_destroy(plane_end_t *e)
{
    ipc_end_t *d = (ipc_end_t *)e;
    const cuda_plugin_t *cu = CU(e->p);
    for (int i = 0; d->written && i < e->p->lay.M; i++) {
        cu->event_free(d->written[i]);
        cu->event_free(d->read[i]);
    }
    if (d->slots)
        d->own ? cu->backend.free(d->slots) : cu->ipc_close(d->slots);
    free(d->written);
    free(d->read);
    ring_detach(&d->ring);
    free(d);
}

static const plane_end_ops_t end_ops = {end_recv, end_done, end_reserve, end_send, end_destroy};

/* This stage's end of link l over boundary b, its host ring attached and its event arrays
 * allocated. */
static int add_end(plane_t *p, plane_link_t l, int boundary, int grad, ipc_end_t **out)
{
    ipc_end_t *d = *out = calloc(1, sizeof(*d));
    if (!d)
        return plane_fail(p, -ENOMEM, "out of memory");
    d->base = (plane_end_t){.ops = &end_ops, .p = p};
    p->end[l] = &d->base;
    d->written = calloc((size_t)p->lay.M, sizeof(void *));
    d->read = calloc((size_t)p->lay.M, sizeof(void *));
    if (!d->written || !d->read)
        return plane_fail(p, -ENOMEM, "out of memory");
    return plane_link_attach(p, &d->ring, boundary, grad);
}

/* An outgoing ring: M device slots and 2M events, their handles into this stage's entry. */
static int make_ring(plane_t *p, plane_link_t l, int boundary, int grad)
{
    const cuda_plugin_t *cu = CU(p);
    int M = p->lay.M;
    ipc_end_t *d;
    int rc = add_end(p, l, boundary, grad, &d);
    if (rc)
        return rc;
    devdir_ring_t r = devdir_ring(p->entry, &p->lay, grad);
    d->own = 1;
    if (cu->ipc_alloc((void **)&d->slots, (size_t)M * p->lay.dev_slot, r.slots))
        return plane_fail(p, -EIO, "device ring of %d x %zu bytes: %s", M, p->lay.dev_slot, cu->last_error());
    for (int i = 0; i < M; i++)
        if (cu->ipc_event_new(&d->written[i], &r.written[i]) || cu->ipc_event_new(&d->read[i], &r.read[i]))
            return plane_fail(p, -EIO, "interprocess event: %s", cu->last_error());
    return 0;
}

/* An incoming ring: the neighbour's outgoing one, once it has published it. */
static int open_ring(plane_t *p, plane_link_t l, int boundary, int grad)
{
    const cuda_plugin_t *cu = CU(p);
    int M = p->lay.M, rank = grad ? boundary + 1 : boundary;
    ipc_end_t *d;
    int rc = add_end(p, l, boundary, grad, &d);
    if (rc)
        return rc;
    devdir_stage_t *e = devdir_wait(shm_data(p->dev), &p->lay, p->cfg.replica, rank, 120000);
    if (!e)
        return plane_fail(p, -ETIMEDOUT, "stage %d of replica %d never published its device buffers", rank,
                          p->cfg.replica);
    devdir_ring_t r = devdir_ring(e, &p->lay, grad);
    if (cu->ipc_open((void **)&d->slots, r.slots))
        return plane_fail(p, -EIO, "mapping the %s ring of stage %d: %s", grad ? "gradient" : "activation", rank,
                          cu->last_error());
    for (int i = 0; i < M; i++)
        if (cu->ipc_event_open(&d->written[i], &r.written[i]) || cu->ipc_event_open(&d->read[i], &r.read[i]))
            return plane_fail(p, -EIO, "event of stage %d: %s", rank, cu->last_error());
    return 0;
}

/* This stage's outgoing rings into its directory entry, the entry marked ready, then its
 * neighbours' mapped as they publish theirs. */
static int links(plane_t *p)
{
    int rc = 0, r = p->cfg.rank, first = r == 0, last = r == p->lay.pp - 1;
    if (!last)
        rc = make_ring(p, PLANE_ACT_OUT, r, 0);
    if (!rc && !first)
        rc = make_ring(p, PLANE_GRAD_OUT, r - 1, 1);
    if (rc)
        return rc;
    atomic_store(&p->entry->ready, 1); /* the neighbours may map this stage's rings now */
    if (!first)
        rc = open_ring(p, PLANE_ACT_IN, r - 1, 0);
    if (!rc && !last)
        rc = open_ring(p, PLANE_GRAD_IN, r, 1);
    return rc;
}

/* A lost stage's neighbours map its device memory, which dies with it: every stage starts
 * again; the shards keep their state and map the new ones (REMAP). */
const plane_transport_t plane_ipc = {.name = "ipc", .recovery = PLANE_RECOVER_RESTAGE, .act_segment = 1,
                                     .device = 1, .links = links};
