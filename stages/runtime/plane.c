/* The data plane's calls (plane.h): the transport table, a stage's plane made from its row,
 * each link's calls handed to its transport, and what the transports share (plane_link.h):
 * errors, the host's wait time, the act segment's rings, the loader's rings (every transport's
 * tokens and targets), and the device directory entry a GPU stage publishes. */
#include "stages/runtime/plane.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/util.h"
#include "stages/job/ldr_seg.h"
#include "stages/runtime/plane_link.h"

static const char *const link_names[PLANE_LINKS] = {"act_in", "act_out", "grad_in", "grad_out", "tokens",
                                                     "targets"};

static const plane_transport_t *const transports[] = {&plane_shm, &plane_ipc, &plane_nccl};

const plane_transport_t *plane_find(const char *name)
{
    for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
        if (!strcmp(transports[i]->name, name))
            return transports[i];
    return NULL;
}

const char *plane_transport(const job_layout_t *l) { return !l->gpu ? "shm" : l->nccl ? "nccl" : "ipc"; }

plane_recovery_t plane_recovery(const char *transport)
{
    const plane_transport_t *t = plane_find(transport);
    return t ? t->recovery : PLANE_RECOVER_REWIND;
}

int plane_uses_act_segment(const char *transport)
{
    const plane_transport_t *t = plane_find(transport);
    return t && t->act_segment;
}

int plane_fail(plane_t *p, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof(p->err), fmt, ap);
    va_end(ap);
    return rc;
}

int plane_event_waits(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("CTITAN_TEST_NO_EVENT_WAITS");
        on = !(v && !strcmp(v, "1"));
    }
    return on;
}

int plane_grad_waits(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("CTITAN_TEST_NO_EVENT_WAITS");
        on = !(v && (!strcmp(v, "1") || !strcmp(v, "grads")));
    }
    return on;
}

/* ---- the loader's rings ---- */

typedef struct {
    plane_end_t base;
    ring_t *ring;
} loader_end_t;

static int loader_recv(plane_end_t *e, int64_t step, int mb, void **slot)
{
    return plane_link_take(e->p, ((loader_end_t *)e)->ring, step, mb, slot);
}

static int loader_done(plane_end_t *e)
{
    ring_release(((loader_end_t *)e)->ring);
    return 0;
}

static int loader_reserve(plane_end_t *e, int64_t step, int mb, void **slot)
{
    return plane_fail(e->p, -EINVAL, "ring %s: a loader's ring is only received from", ring_name(((loader_end_t *)e)->ring));
}

static int loader_send(plane_end_t *e) { return loader_reserve(e, 0, 0, NULL); }

static void loader_destroy(plane_end_t *e)
{
    ring_detach(&((loader_end_t *)e)->ring);
    free(e);
}

static const plane_end_ops_t loader_ops = {loader_recv, loader_done, loader_reserve, loader_send, loader_destroy};

/* Link l (tokens or targets) of this stage's replica, from the loader's segment. */
static int loader_link(plane_t *p, plane_link_t l)
{
    loader_end_t *d = calloc(1, sizeof(*d));
    if (!d)
        return plane_fail(p, -ENOMEM, "out of memory");
    d->base = (plane_end_t){.ops = &loader_ops, .p = p};
    p->end[l] = &d->base;
    int rc;
    if (!p->batch && (rc = shm_attach(&p->batch, p->cfg.job, LDR_SEG_NAME, p->err, sizeof(p->err))))
        return rc;
    return ldr_seg_ring(shm_data(p->batch), 2 * p->cfg.replica + (l == PLANE_TARGETS), &d->ring, p->err,
                        sizeof(p->err));
}

/* ---- the device directory ---- */

/* This stage's entry (device transports): its range of the flat space, its device and, for GPU
 * optimizer shards, the handles of its weights and gradients (plane_reduce maps them). Not
 * marked ready here: the transport does once its own part is in. */
static int publish(plane_t *p)
{
    char why[512];
    int rc;
    if (!(p->cu = cuda_plugin_load(why, sizeof(why))))
        return plane_fail(p, -ENODEV, "job.device = \"cuda\": %s", why);
    if ((rc = shm_attach(&p->dev, p->cfg.job, DEVDIR_SEG, p->err, sizeof(p->err))))
        return rc;
    devdir_stage_t *e = p->entry = devdir_stage(shm_data(p->dev), &p->lay, p->cfg.replica, p->cfg.rank);
    e->begin = p->cfg.begin, e->end = p->cfg.end, e->device = p->cfg.device, e->pid = (int32_t)getpid();
    if (p->lay.gpu_shards && (p->cu->ipc_export(p->cfg.w, &e->w) || p->cu->ipc_export(p->cfg.g, &e->g)))
        return plane_fail(p, -EIO, "exporting the weights and gradients: %s", p->cu->last_error());
    if (plane_grads_ordered(p) && p->cu->ipc_event_new(&p->done_ev, &e->done))
        return plane_fail(p, -EIO, "the gradients' event: %s", p->cu->last_error());
    return 0;
}

int plane_grads_ordered(const plane_t *p)
{
    return p->tr->device && !p->tr->beside && p->lay.gpu_shards;
}

/* ---- a stage's plane ---- */

void plane_destroy(plane_t **pp)
{
    plane_t *p = *pp;
    if (!p)
        return;
    for (int l = 0; l < PLANE_LINKS; l++)
        if (p->end[l])
            p->end[l]->ops->destroy(p->end[l]);
    if (p->ops && p->ops->destroy)
        p->ops->destroy(p);
    for (int k = 0; k < p->n_shard_ev; k++)
        if (p->shard_ev[k])
            p->cu->event_free(p->shard_ev[k]);
    free(p->shard_ev);
    if (p->done_ev)
        p->cu->event_free(p->done_ev);
    shm_detach(&p->act);
    shm_detach(&p->batch);
    shm_detach(&p->dev);
    free(p);
    *pp = NULL;
}

int plane_new(plane_t **out, const char *transport, const plane_cfg_t *c, char *err, size_t errlen)
{
    *out = NULL;
    const plane_transport_t *t = plane_find(transport);
    if (!t)
        return util_fail(err, errlen, -EINVAL, "no data plane transport \"%s\"", transport);
    plane_t *p = calloc(1, sizeof(*p));
    if (!p)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    p->cfg = *c;
    p->lay = *c->lay;
    p->cfg.lay = &p->lay;
    p->tr = t;
    int rc = 0, v = c->vstage;
    if (v == 0)
        rc = loader_link(p, PLANE_TOKENS);
    if (!rc && v == p->lay.S - 1)
        rc = loader_link(p, PLANE_TARGETS);
    if (!rc && t->device)
        rc = publish(p);
    if (!rc)
        rc = t->links(p);
    if (rc) {
        snprintf(err, errlen, "%s", p->err);
        plane_destroy(&p);
        return rc;
    }
    *out = p;
    return 0;
}

/* The link's end; NULL (p->err saying so) when this stage has no such link. */
static plane_end_t *end_of(plane_t *p, plane_link_t l)
{
    if ((unsigned)l < PLANE_LINKS && p->end[l])
        return p->end[l];
    char where[48] = "";
    if (p->cfg.lay->vs > 1)
        snprintf(where, sizeof(where), " (virtual stage %d)", p->cfg.vstage);
    plane_fail(p, -EINVAL, "stage %d%s of replica %d has no link %s", p->cfg.rank, where, p->cfg.replica,
               (unsigned)l < PLANE_LINKS ? link_names[l] : "?");
    return NULL;
}

int plane_recv(plane_t *p, plane_link_t l, int64_t step, int mb, void **slot)
{
    plane_end_t *e = end_of(p, l);
    return e ? e->ops->recv(e, step, mb, slot) : -EINVAL;
}

int plane_done(plane_t *p, plane_link_t l)
{
    plane_end_t *e = end_of(p, l);
    return e ? e->ops->done(e) : -EINVAL;
}

int plane_reserve(plane_t *p, plane_link_t l, int64_t step, int mb, void **slot)
{
    plane_end_t *e = end_of(p, l);
    return e ? e->ops->reserve(e, step, mb, slot) : -EINVAL;
}

int plane_send(plane_t *p, plane_link_t l)
{
    plane_end_t *e = end_of(p, l);
    return e ? e->ops->send(e) : -EINVAL;
}

/* GPU shards: a stream waits until the shards' last UPDATE has written this stage's weights
 * and cleared its gradients (each shard records its event after that, and answers the UPDATE
 * without waiting for its device). The shards that write here: every one (one host), or on a
 * transport that sums the replicas beside a stage only those beside this one (the others' weights
 * come from it through the transport, ordered after this wait). Their events are opened at the
 * first step: the shards made them before they said READY. */
int plane_shard_waits(plane_t *p, void *stream)
{
    if (!p->tr->device || !p->lay.gpu_shards)
        return 0;
    if (!p->shard_ev) {
        if (!(p->shard_ev = calloc((size_t)p->lay.shards, sizeof(void *))))
            return plane_fail(p, -ENOMEM, "out of memory");
        p->n_shard_ev = p->lay.shards;
        for (int k = 0; k < p->lay.shards; k++) {
            int r, s;
            plane_shard_beside(p->tr->name, &p->lay, k, &r, &s);
            if (p->tr->beside && (r != p->cfg.replica || s != p->cfg.rank))
                continue;
            devdir_shard_t *e = devdir_shard_wait(shm_data(p->dev), &p->lay, k, 120000);
            if (!e)
                return plane_fail(p, -ETIMEDOUT, "optimizer shard %d never published its update event", k);
            if (p->cu->ipc_event_open(&p->shard_ev[k], &e->updated))
                return plane_fail(p, -EIO, "optimizer shard %d's update event: %s", k, p->cu->last_error());
        }
    }
    for (int k = 0; k < p->n_shard_ev && plane_event_waits(); k++)
        if (p->shard_ev[k] && p->cu->stream_wait(stream, p->shard_ev[k]))
            return plane_fail(p, -EIO, "waiting for optimizer shard %d's update: %s", k, p->cu->last_error());
    return 0;
}

int plane_step_begin(plane_t *p, int64_t step)
{
    int rc = plane_shard_waits(p, p->cfg.stream);
    if (rc)
        return rc;
    return p->ops && p->ops->step_begin ? p->ops->step_begin(p, step) : 0;
}

int plane_shard_io(plane_t *p, shard_io_t *io)
{
    *io = (shard_io_t){0};
    if (p->lay.fsdp < 2)
        return 0;
    if (!p->tr->shard)
        return plane_fail(p, -ENOTSUP, "parallelism.data_parallel_shard_degree = %d: parameter sharding is not built "
                          "on the %s data plane", p->lay.fsdp, p->tr->name);
    return p->tr->shard(p, io);
}

int plane_step_end(plane_t *p)
{
    int rc = p->ops && p->ops->step_end ? p->ops->step_end(p) : 0;
    if (!rc && p->done_ev && p->cu->event_record(p->done_ev, p->cfg.stream))
        rc = plane_fail(p, -EIO, "recording the gradients' event: %s", p->cu->last_error());
    return rc;
}

double plane_waited(plane_t *p)
{
    double w = p->waited;
    p->waited = 0;
    return w;
}

const char *plane_error(const plane_t *p) { return p->err; }

/* ---- the coordinator's part ---- */

int plane_boot_make(const char *transport, const job_layout_t *l, void **boot, size_t *len, char *err,
                    size_t errlen)
{
    const plane_transport_t *t = plane_find(transport);
    *boot = NULL;
    *len = 0;
    if (!t)
        return util_fail(err, errlen, -EINVAL, "no data plane transport \"%s\"", transport);
    return t->boot_make ? t->boot_make(l, boot, len, err, errlen) : 0;
}

long plane_boot_share(const char *transport, const job_layout_t *l, const void *boot, int replica, int rank,
                      void *buf, size_t cap)
{
    const plane_transport_t *t = plane_find(transport);
    if (!t)
        return -EINVAL;
    return t->boot_share && boot ? t->boot_share(l, boot, replica, rank, buf, cap) : 0;
}

void plane_shard_beside(const char *transport, const job_layout_t *l, int k, int *replica, int *rank)
{
    const plane_transport_t *t = plane_find(transport);
    *replica = t && t->beside ? k % job_chunks(l) : -1;
    *rank = t && t->beside ? k / job_chunks(l) : -1;
}

/* ---- the act segment's rings ---- */

int plane_link_attach(plane_t *p, ring_t **r, int boundary, int grad)
{
    int rc;
    if (!p->act && (rc = shm_attach(&p->act, p->cfg.job, "act", p->err, sizeof(p->err))))
        return rc;
    char name[48];
    snprintf(name, sizeof(name), "%s.%d.%d", grad ? "grad" : "act", p->cfg.replica, boundary);
    size_t off = job_act_off(&p->lay, p->cfg.replica, boundary, grad);
    return ring_attach(r, (char *)shm_data(p->act) + off, p->lay.act_ring, name, p->err, sizeof(p->err));
}

int plane_link_take(plane_t *p, ring_t *r, int64_t step, int mb, void **payload)
{
    ring_meta_t meta;
    double t0 = util_now();
    int rc = ring_peek(r, -1, payload, &meta);
    p->waited += util_now() - t0;
    if (rc)
        return plane_fail(p, rc, "ring %s: %s", ring_name(r), strerror(-rc));
    if (meta.tag[0] != (uint64_t)step || meta.tag[1] != (uint64_t)mb)
        return plane_fail(p, -EPROTO, "ring %s delivered step %llu microbatch %llu, expected step %lld microbatch %d",
                          ring_name(r), (unsigned long long)meta.tag[0], (unsigned long long)meta.tag[1],
                          (long long)step, mb);
    return 0;
}

int plane_link_reserve(plane_t *p, ring_t *r, void **payload)
{
    double t0 = util_now();
    int rc = ring_reserve(r, -1, payload);
    p->waited += util_now() - t0;
    return rc ? plane_fail(p, rc, "ring %s: %s", ring_name(r), strerror(-rc)) : 0;
}
