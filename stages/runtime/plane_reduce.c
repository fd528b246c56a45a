/* An optimizer shard's view of the replicas (plane.h plane_reduce_*): one list of where each
 * replica holds which part of the shard's slice, made at set-up (and again after a REMAP), that
 * the steps only walk: the sum of the replicas' gradients in replica order, the new weights to
 * every replica. CPU shards (a CPU job, and offload mode) take every replica's range of the
 * params and grads segments; GPU shards the stages' device buffers, mapped through the handles in
 * their device directory entries; with NCCL (a transport whose row says `beside`) the
 * reduce-scatter summed the replicas into one stage (plane_shard_beside): only its
 * buffers, as replica 0. Block boundaries and replica order do not depend on the shard count, so any count
 * gives the same bits. */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/util.h"
#include "kernels/bf16.h"
#include "stages/runtime/plane_link.h"

struct plane_reduce {
    const plane_transport_t *tr;
    job_layout_t lay;
    char job[96];
    int k;
    size_t begin, end;
    const backend_t *be;
    void *stream;
    plane_part_t *part;          /* replicas in order, each one's parts in flat order */
    int nparts;
    float *sum;                  /* (end - begin) in the backend's memory, or the one part's own */
    int in_place;                /* one part holds the whole slice: no copy to sum */
    int bf16;                    /* CPU shards with offload in bf16 (host_bf16): no sum of the whole
                                  * slice, a range at a time (plane_reduce_sum_range) */
    const cuda_plugin_t *cu;     /* the device transports: the stage buffers mapped through CUDA IPC, */
    void **mapped;               /* to ipc_close */
    int nmapped;
    void **stage_ev;             /* IPC plane: the mapped stages' gradients events (devdir_stage_t
                                  * done), waited on before a sum reads them */
    int n_stage_ev;
    void *updated;               /* GPU shards: the event recorded once an update's weights are in
                                  * the stages (devdir_shard_t: the stages' streams wait on it) */
    shm_seg_t *params, *grads, *dev;
    char err[512];
};

static int fail(plane_reduce_t *r, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(plane_reduce_t *r, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof(r->err), fmt, ap);
    va_end(ap);
    return rc;
}

const char *plane_reduce_error(const plane_reduce_t *r) { return r->err; }

/* On the CPU: each copy's slice of the shared params and grads segments (a copy per replica, or
 * per group of replicas with parameter sharding, whose exchange summed the group's gradients
 * into its copy: stages/runtime/fsdp.h); fp32, or bf16 with offload in bf16. */
static int parts_from_segments(plane_reduce_t *r)
{
    int rc;
    if ((rc = shm_attach(&r->params, r->job, "params", r->err, sizeof(r->err))) ||
        (rc = shm_attach(&r->grads, r->job, "grads", r->err, sizeof(r->err))))
        return rc;
    float *P = shm_data(r->params), *G = shm_data(r->grads);
    uint16_t *P16 = shm_data(r->params), *G16 = shm_data(r->grads);
    if (!(r->part = calloc((size_t)r->lay.copies, sizeof(plane_part_t))))
        return fail(r, -ENOMEM, "out of memory");
    for (int rep = 0; rep < r->lay.copies; rep++) {
        size_t at = rep * r->lay.stride + r->begin;
        r->part[r->nparts++] = r->bf16 ? (plane_part_t){.w = P16 + at, .g16 = G16 + at, .lo = r->begin, .hi = r->end,
                                                        .replica = rep}
                                       : (plane_part_t){.w = P + at, .g = G + at, .lo = r->begin, .hi = r->end,
                                                        .replica = rep};
    }
    return 0;
}

/* On the GPU: the stages' device buffers that hold parts of the slice, mapped through the
 * handles in their device directory entries (waited for as the stages set up). */
static int parts_from_stages(plane_reduce_t *r)
{
    const job_layout_t *l = &r->lay;
    char why[512];
    int rc, beside_r, beside_s;
    if (!r->cu && !(r->cu = cuda_plugin_load(why, sizeof(why))))
        return fail(r, -ENODEV, "optshard.device = \"cuda\": %s", why);
    if (!r->dev && (rc = shm_attach(&r->dev, r->job, DEVDIR_SEG, r->err, sizeof(r->err))))
        return rc;
    plane_shard_beside(r->tr->name, l, r->k, &beside_r, &beside_s);
    r->part = calloc((size_t)l->dp * l->pp, sizeof(plane_part_t));
    r->mapped = calloc((size_t)l->dp * l->pp * 2, sizeof(void *));
    r->stage_ev = calloc((size_t)l->dp * l->pp, sizeof(void *));
    if (!r->part || !r->mapped || !r->stage_ev)
        return fail(r, -ENOMEM, "out of memory");
    for (int rep = 0; rep < l->dp; rep++)
        for (int s = 0; s < l->pp; s++) {
            if (beside_r >= 0 && (rep != beside_r || s != beside_s))
                continue;
            devdir_stage_t *e = devdir_wait(shm_data(r->dev), l, rep, s, 120000);
            if (!e)
                return fail(r, -ETIMEDOUT, "stage %d of replica %d never published its device buffers", s, rep);
            size_t lo = e->begin > r->begin ? e->begin : r->begin, hi = e->end < r->end ? e->end : r->end;
            if (lo >= hi)
                continue;
            void *w, *g;
            if (r->cu->ipc_open(&w, &e->w))
                return fail(r, -EIO, "weights of stage %d replica %d: %s", s, rep, r->cu->last_error());
            r->mapped[r->nmapped++] = w;
            if (r->cu->ipc_open(&g, &e->g))
                return fail(r, -EIO, "gradients of stage %d replica %d: %s", s, rep, r->cu->last_error());
            r->mapped[r->nmapped++] = g;
            if (!r->tr->beside && r->cu->ipc_event_open(&r->stage_ev[r->n_stage_ev++], &e->done))
                return fail(r, -EIO, "the gradients' event of stage %d replica %d: %s", s, rep, r->cu->last_error());
            r->part[r->nparts++] = (plane_part_t){.w = (uint16_t *)w + (lo - e->begin),
                                                  .g = (float *)g + (lo - e->begin), .lo = lo, .hi = hi,
                                                  .replica = beside_r >= 0 ? 0 : rep};
        }
    return 0;
}

/* A GPU shard's entry in the device directory: the event its updates record (its pid last, then
 * ready), made before it waits for the stages, which open it at their first step. */
static int publish_event(plane_reduce_t *r)
{
    char why[512];
    int rc;
    if (!r->cu && !(r->cu = cuda_plugin_load(why, sizeof(why))))
        return fail(r, -ENODEV, "optshard.device = \"cuda\": %s", why);
    if (!r->dev && (rc = shm_attach(&r->dev, r->job, DEVDIR_SEG, r->err, sizeof(r->err))))
        return rc;
    devdir_shard_t *e = devdir_shard(shm_data(r->dev), &r->lay, r->k);
    if (r->cu->ipc_event_new(&r->updated, &e->updated))
        return fail(r, -EIO, "the shard's update event: %s", r->cu->last_error());
    e->pid = (int32_t)getpid();
    atomic_store(&e->ready, 1);
    return 0;
}

/* Shards on the GPU map the stages' device buffers; CPU shards read the host segments, which the
 * stages compute on (the CPU model) or copy to and from (offload: GPU stages, CPU shards). */
static int make_parts(plane_reduce_t *r) { return r->lay.gpu_shards ? parts_from_stages(r) : parts_from_segments(r); }

/* The mappings and the list go (a REMAP makes them anew), once the stream has done with them. */
static void drop_parts(plane_reduce_t *r)
{
    if (r->nmapped)
        r->be->stream_sync(r->stream);
    for (int i = 0; i < r->nmapped; i++)
        r->cu->ipc_close(r->mapped[i]);
    for (int i = 0; i < r->n_stage_ev; i++)
        if (r->stage_ev[i])
            r->cu->event_free(r->stage_ev[i]);
    free(r->part);
    free(r->mapped);
    free(r->stage_ev);
    r->part = NULL;
    r->mapped = NULL;
    r->stage_ev = NULL;
    r->nparts = r->nmapped = r->n_stage_ev = 0;
}

/* Where the sum goes: the one part itself when it holds the whole slice, else a buffer of the
 * backend's (kept across a REMAP: the slice's layout does not change). */
static int place_sum(plane_reduce_t *r)
{
    if (r->bf16)
        return 0;
    int was_in_place = r->in_place;
    r->in_place = r->nparts == 1 && r->part[0].lo == r->begin && r->part[0].hi == r->end;
    if (r->in_place) {
        if (!was_in_place && r->sum && r->be->free(r->sum))
            return fail(r, -EIO, "%s", r->be->last_error());
        r->sum = r->part[0].g;
        return 0;
    }
    if (r->sum && !was_in_place)
        return 0;
    size_t n = r->end > r->begin ? r->end - r->begin : 1;
    void *mem;
    if (r->be->alloc(&mem, n * sizeof(float)))
        return fail(r, -ENOMEM, "%s memory for %zu gradients: %s", r->be->name, n, r->be->last_error());
    r->sum = mem;
    return 0;
}

int plane_reduce_new(plane_reduce_t **out, const char *transport, const job_layout_t *l, const char *job, int k,
                     size_t begin, size_t end, const backend_t *be, void *stream, char *err, size_t errlen)
{
    *out = NULL;
    plane_reduce_t *r = calloc(1, sizeof(*r));
    if (!r)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    r->tr = plane_find(transport);
    r->lay = *l;
    snprintf(r->job, sizeof(r->job), "%s", job);
    r->k = k, r->begin = begin, r->end = end, r->be = be, r->stream = stream;
    r->bf16 = l->host_bf16 && !l->gpu_shards;
    int rc = r->tr ? 0 : fail(r, -EINVAL, "no data plane transport \"%s\"", transport);
    if (!rc && l->gpu_shards)
        rc = publish_event(r);
    if (!rc)
        rc = make_parts(r);
    if (!rc)
        rc = place_sum(r);
    if (rc) {
        snprintf(err, errlen, "%s", r->err);
        plane_reduce_destroy(&r);
        return rc;
    }
    *out = r;
    return 0;
}

void plane_reduce_destroy(plane_reduce_t **pr)
{
    plane_reduce_t *r = *pr;
    if (!r)
        return;
    if (r->sum && !r->in_place)
        r->be->free(r->sum);
    drop_parts(r);
    if (r->updated)
        r->cu->event_free(r->updated);
    shm_detach(&r->params);
    shm_detach(&r->grads);
    shm_detach(&r->dev);
    free(r);
    *pr = NULL;
}

int plane_reduce_sum(plane_reduce_t *r, const float **sum)
{
    const backend_t *be = r->be;
    if (r->bf16)
        return fail(r, -EINVAL, "bf16 gradients are summed a range at a time (plane_reduce_sum_range)");
    for (int i = 0; i < r->n_stage_ev && plane_grad_waits(); i++) /* the stages' steps are done */
        if (r->stage_ev[i] && r->cu->stream_wait(r->stream, r->stage_ev[i]))
            return fail(r, -EIO, "waiting for a stage's gradients: %s", r->cu->last_error());
    for (int i = 0; i < r->nparts && !r->in_place; i++) {
        const plane_part_t *q = &r->part[i];
        float *dst = r->sum + (q->lo - r->begin);
        size_t n = q->hi - q->lo;
        if (q->replica == 0 ? be->copy(dst, q->g, n * sizeof(float), r->stream) : be->f32_add(dst, q->g, n, r->stream))
            return fail(r, -EIO, "reduce: %s", be->last_error());
    }
    *sum = r->sum;
    return 0;
}

int plane_reduce_bf16(const plane_reduce_t *r) { return r->bf16; }

/* In replica order, each part's bf16 exact in fp32, so the sum is the fp32 path's of the same
 * gradients (replica 0's copied, the others added: plane_reduce_sum). */
int plane_reduce_sum_range(plane_reduce_t *r, size_t lo, size_t n, float *dst)
{
    if (!r->bf16)
        return fail(r, -EINVAL, "plane_reduce_sum_range is for bf16 gradients (offload in bf16)");
    if (lo < r->begin || lo > r->end || n > r->end - lo)
        return fail(r, -EINVAL, "gradients [%zu, %zu) are not in the slice [%zu, %zu)", lo, lo + n, r->begin, r->end);
    for (int i = 0; i < r->nparts; i++) {
        const uint16_t *g = r->part[i].g16 + (lo - r->part[i].lo);
        if (i == 0)
            for (size_t j = 0; j < n; j++)
                dst[j] = bf16_float(g[j]);
        else
            for (size_t j = 0; j < n; j++)
                dst[j] += bf16_float(g[j]);
    }
    return 0;
}

/* One copy of the slice on the GPU: every element in exactly one part (the parts of one
 * replica, or of the stage the transport summed the replicas into, in flat order). */
static int one_copy(const plane_reduce_t *r)
{
    if (!r->lay.gpu_shards)
        return 0;
    size_t at = r->begin;
    for (int i = 0; i < r->nparts; i++) {
        if (r->part[i].replica != 0 || r->part[i].lo != at)
            return 0;
        at = r->part[i].hi;
    }
    return at == r->end;
}

int plane_reduce_out(const plane_reduce_t *r, size_t at, void **w, float **g, size_t *n)
{
    if (!one_copy(r))
        return 0;
    for (int i = 0; i < r->nparts; i++) {
        const plane_part_t *q = &r->part[i];
        if (at >= q->lo && at < q->hi) {
            *w = (uint16_t *)q->w + (at - q->lo); /* GPU shards: bf16 weights */
            *g = q->g + (at - q->lo);
            *n = q->hi - at;
            return 1;
        }
    }
    return 0;
}

int plane_reduce_publish(plane_reduce_t *r, const float *master, int written)
{
    const backend_t *be = r->be;
    for (int i = 0; i < r->nparts && !(written && one_copy(r)); i++) {
        const plane_part_t *q = &r->part[i];
        if (q->g16) { /* CPU shards, offload in bf16: the host's rounding, the GPU's (bf16.h) */
            const float *x = master + (q->lo - r->begin);
            uint16_t *w = q->w;
            for (size_t j = 0; j < q->hi - q->lo; j++)
                w[j] = bf16_of(x[j]);
            memset(q->g16, 0, (q->hi - q->lo) * sizeof(uint16_t));
            continue;
        }
        if (be->to_weights(q->w, master + (q->lo - r->begin), q->hi - q->lo, r->stream))
            return fail(r, -EIO, "weights: %s", be->last_error());
        if (be->zero(q->g, (q->hi - q->lo) * sizeof(float), r->stream))
            return fail(r, -EIO, "gradients: %s", be->last_error());
    }
    if (r->updated) /* the stages' streams wait on this; nothing here waits for the device */
        return r->cu->event_record(r->updated, r->stream) ? fail(r, -EIO, "update event: %s", r->cu->last_error()) : 0;
    return be->stream_sync(r->stream) ? fail(r, -EIO, "weights: %s", be->last_error()) : 0;
}

int plane_reduce_remap(plane_reduce_t *r)
{
    if (!r->lay.gpu_shards)
        return 0;
    drop_parts(r);
    int rc = make_parts(r);
    return rc ? rc : place_sum(r);
}
