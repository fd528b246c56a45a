/* The GPU data plane over NCCL (plane.h "nccl"; [parallelism] data_plane = "nccl"): each link
 * is a two-rank communicator with one neighbour whose transfers run on a stream of their own
 * (so a send waiting for its receiver never holds up the model's stream), into or out of M
 * device slots, one per microbatch. Two events per slot order reuse: moved[i] (recorded on
 * the link's stream after slot i's transfer) and ready[i] (recorded on the model's stream once
 * it has filled or read slot i). Around a step, the replicas of this pipeline rank all-gather
 * the weights (each replica's optimizer shard updated one chunk) and reduce-scatter the
 * gradients (replica r keeps the sum of chunk r, where its shard reads it). With parameter
 * sharding (plane_shard_io) replica r holds only its chunk of the weights and gradients: each
 * piece's weights are broadcast from the chunks' owners into one of two piece buffers before
 * the model uses them (the one it holds already, if so: a recompute's), and each piece's
 * gradients reduced to the owners of its parts, who add them to their chunk, all on the
 * model's stream. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"
#include "stages/runtime/plane_link.h"

typedef struct {
    plane_end_t base;
    cuda_nccl_t *comm;
    int peer;                    /* the neighbour's rank in comm */
    void *stream;
    char *slots;                 /* device: M slots of lay.dev_slot bytes */
    void **moved, **ready;       /* (M) */
    int mb;                      /* the slot in hand */
} nccl_end_t;

/* The replicas of this pipeline rank. */
typedef struct {
    cuda_nccl_t *dp;
    uint16_t *w;                 /* the model's weights and gradients: n elements and room for dp */
    float *g;                    /* chunks (CUDA_MODEL_SLACK); with sharding only this replica's chunk */
    size_t n;
    /* parameter sharding */
    size_t sb, chunk;            /* the stage's range starts at sb; replica k owns chunk k */
    uint16_t *piece[2];          /* two pieces' weights (lay.fsdp_unit[vstage] elements each) */
    size_t piece_lo[2];          /* which (their lo; SIZE_MAX: none) */
    int next;                    /* the buffer the next gather fills */
    float *gbuf, *sum;           /* a piece's gradients, and an owner's sum of its part */
} nccl_ctx_t;

#define CU(p) (p)->cu

/* A CUDA or NCCL call failed: what it was for and the plugin's reason. */
static int failed(plane_t *p, const char *what) { return plane_fail(p, -EIO, "%s: %s", what, CU(p)->last_error()); }

static char *slot_of(nccl_end_t *l, int mb) { return l->slots + (size_t)mb * l->base.p->lay.dev_slot; }

/* Slot mb of an incoming link, the model's stream ordered after its arrival. */
static int end_recv(plane_end_t *e, int64_t step, int mb, void **slot)
{
    nccl_end_t *l = (nccl_end_t *)e;
    plane_t *p = e->p;
    const cuda_plugin_t *cu = CU(p);
    l->mb = mb;
    *slot = slot_of(l, mb);
    if (cu->stream_wait(l->stream, l->ready[mb]) || /* its last use has read it */
        cu->nccl_recv(l->comm, *slot, p->lay.dev_slot, l->peer, l->stream) ||
        cu->event_record(l->moved[mb], l->stream) ||
        (plane_event_waits() && cu->stream_wait(p->cfg.stream, l->moved[mb])))
        return failed(p, "NCCL receive");
    return 0;
}

/* The model's stream is done reading the slot: it may be received into again. */
static int end_done(plane_end_t *e)
{
    nccl_end_t *l = (nccl_end_t *)e;
    return CU(e->p)->event_record(l->ready[l->mb], e->p->cfg.stream) ? failed(e->p, "NCCL receive") : 0;
}

/* Slot mb of an outgoing link, once its last send has left. */
static int end_reserve(plane_end_t *e, int64_t step, int mb, void **slot)
{
    nccl_end_t *l = (nccl_end_t *)e;
    l->mb = mb;
    *slot = slot_of(l, mb);
    return CU(e->p)->stream_wait(e->p->cfg.stream, l->moved[mb]) ? failed(e->p, "NCCL send") : 0;
}

/* Sends the slot once the model's stream has filled it. */
static int end_send(plane_end_t *e)
{
    nccl_end_t *l = (nccl_end_t *)e;
    plane_t *p = e->p;
    const cuda_plugin_t *cu = CU(p);
    int mb = l->mb;
    if (cu->event_record(l->ready[mb], p->cfg.stream) || cu->stream_wait(l->stream, l->ready[mb]) ||
        cu->nccl_send(l->comm, slot_of(l, mb), p->lay.dev_slot, l->peer, l->stream) ||
        cu->event_record(l->moved[mb], l->stream))
        return failed(p, "NCCL send");
    return 0;
}

static void end_destroy(plane_end_t *e)
{
    nccl_end_t *l = (nccl_end_t *)e;
    const cuda_plugin_t *cu = CU(e->p);
    if (l->stream)
        cu->backend.stream_sync(l->stream);
    for (int i = 0; l->moved && i < e->p->lay.M; i++) {
        cu->event_free(l->moved[i]);
        cu->event_free(l->ready[i]);
    }
    cu->nccl_destroy(&l->comm);
    if (l->slots)
        cu->backend.free(l->slots);
    cu->backend.stream_free(l->stream);
    free(l->moved);
    free(l->ready);
    free(l);
}

static const plane_end_ops_t end_ops = {end_recv, end_done, end_reserve, end_send, end_destroy};

/* Link l: communicator id as `rank` of two, the neighbour being `peer`. */
static int add_end(plane_t *p, plane_link_t l, const cuda_nccl_id_t *id, const char *name, int rank, int peer)
{
    const cuda_plugin_t *cu = CU(p);
    int M = p->lay.M;
    nccl_end_t *n = calloc(1, sizeof(*n));
    if (!n)
        return plane_fail(p, -ENOMEM, "out of memory");
    n->base = (plane_end_t){.ops = &end_ops, .p = p};
    p->end[l] = &n->base;
    n->peer = peer;
    if (cu->nccl_init(&n->comm, id, 2, rank))
        return plane_fail(p, -EIO, "NCCL communicator %s: %s", name, cu->last_error());
    if (cu->backend.stream_new(&n->stream))
        return failed(p, name);
    if (cu->backend.alloc((void **)&n->slots, (size_t)M * p->lay.dev_slot))
        return plane_fail(p, -EIO, "%s slots: %s", name, cu->last_error());
    n->moved = calloc((size_t)M, sizeof(void *));
    n->ready = calloc((size_t)M, sizeof(void *));
    if (!n->moved || !n->ready)
        return plane_fail(p, -ENOMEM, "out of memory");
    cuda_ipc_event_t unused; /* local events; the interprocess kind costs nothing more here */
    for (int i = 0; i < M; i++)
        if (cu->ipc_event_new(&n->moved[i], &unused) || cu->ipc_event_new(&n->ready[i], &unused))
            return failed(p, name);
    return 0;
}

/* Every replica's chunk of the weights, as its optimizer shard left it (with sharding each
 * piece's, as the model asks). */
static int nccl_step_begin(plane_t *p, int64_t step)
{
    nccl_ctx_t *x = p->ctx;
    if (p->lay.fsdp > 1) {
        x->piece_lo[0] = x->piece_lo[1] = SIZE_MAX; /* the shards updated the chunks */
        return 0;
    }
    size_t chunk = job_dp_chunk(&p->lay, x->n), r = (size_t)p->cfg.replica;
    if (CU(p)->nccl_all_gather_bf16(x->dp, x->w + r * chunk, x->w, chunk, p->cfg.stream))
        return failed(p, "all-gather of the weights");
    return 0;
}

/* The replicas' sum of this replica's chunk, where its shard reads it, the other chunks
 * cleared for the next step; every send of the step on its way. */
static int nccl_step_end(plane_t *p)
{
    nccl_ctx_t *x = p->ctx;
    const cuda_plugin_t *cu = CU(p);
    size_t chunk = job_dp_chunk(&p->lay, x->n), r = (size_t)p->cfg.replica, all = chunk * (size_t)p->lay.dp;
    if (p->lay.fsdp < 2 && cu->nccl_reduce_scatter_f32(x->dp, x->g, x->g + r * chunk, chunk, p->cfg.stream))
        return failed(p, "reduce-scatter of the gradients");
    if (p->lay.fsdp < 2 && (cu->backend.zero(x->g, r * chunk * sizeof(float), p->cfg.stream) ||
                            cu->backend.zero(x->g + (r + 1) * chunk, (all - (r + 1) * chunk) * sizeof(float),
                                             p->cfg.stream)))
        return failed(p, "clearing the gradients");
    plane_link_t out[] = {PLANE_ACT_OUT, PLANE_GRAD_OUT};
    for (int i = 0; i < 2; i++)
        if (p->end[out[i]] && cu->backend.stream_sync(((nccl_end_t *)p->end[out[i]])->stream))
            return failed(p, "NCCL sends");
    return 0;
}

static void nccl_ctx_destroy(plane_t *p)
{
    nccl_ctx_t *x = p->ctx;
    if (!x)
        return;
    void *bufs[] = {x->piece[0], x->piece[1], x->gbuf, x->sum};
    if (bufs[0] && p->cfg.stream)
        CU(p)->backend.stream_sync(p->cfg.stream);
    for (int i = 0; i < 4; i++)
        if (bufs[i])
            CU(p)->backend.free(bufs[i]);
    CU(p)->nccl_destroy(&x->dp);
    free(x);
    p->ctx = NULL;
}

static const plane_ops_t nccl_ops = {nccl_step_begin, nccl_step_end, nccl_ctx_destroy};

/* The communicators are joined in the coordinator's order of their ids (activations and
 * gradients of each replica's boundaries, then the replicas of each pipeline rank), so every
 * pair of neighbours meets in the same order and no one waits for a join that waits for it.
 * In an activation communicator the sender (rank b) is 0; in a gradient one the sender (b + 1). */
static int links(plane_t *p)
{
    const plane_cfg_t *c = &p->cfg;
    cuda_nccl_id_t ids[JOB_NCCL_COMMS];
    int ordinal = job_local_ordinal(&p->lay, c->replica, c->rank);
    if (c->device != ordinal)
        return plane_fail(p, -EINVAL, "parallelism.data_plane = \"nccl\" needs a GPU per stage process (NCCL "
                          "refuses two ranks on one device), and this host has %d for %d stage processes: use "
                          "data_plane = \"ipc\" to share GPUs", p->cu->device_count(), p->lay.pp * p->lay.dp);
    atomic_store(&p->entry->ready, 1); /* the optimizer shards only need the buffers */
    long n = c->boot ? c->boot(c->arg, ids, sizeof(ids)) : -EINVAL;
    if (n != (long)sizeof(ids))
        return plane_fail(p, -EPROTO, "the coordinator's NCCL ids: %ld bytes, expected %zu", n, sizeof(ids));
    nccl_ctx_t *x = p->ctx = calloc(1, sizeof(nccl_ctx_t));
    if (!x)
        return plane_fail(p, -ENOMEM, "out of memory");
    p->ops = &nccl_ops;
    *x = (nccl_ctx_t){.w = c->w, .g = c->g, .n = c->end - c->begin, .sb = c->stage_begin,
                      .chunk = job_dp_chunk(&p->lay, c->stage_end - c->stage_begin), .piece_lo = {SIZE_MAX, SIZE_MAX}};
    int rc = 0, first = c->rank == 0, last = c->rank == p->lay.pp - 1;
    if (!first && !(rc = add_end(p, PLANE_ACT_IN, &ids[JOB_NCCL_ACT_IN], "act_in", 1, 0))) /* boundary rank - 1 */
        rc = add_end(p, PLANE_GRAD_OUT, &ids[JOB_NCCL_GRAD_OUT], "grad_out", 0, 1);       /* before boundary rank */
    if (!rc && !last && !(rc = add_end(p, PLANE_ACT_OUT, &ids[JOB_NCCL_ACT_OUT], "act_out", 0, 1)))
        rc = add_end(p, PLANE_GRAD_IN, &ids[JOB_NCCL_GRAD_IN], "grad_in", 1, 0);
    if (!rc && p->cu->nccl_init(&x->dp, &ids[JOB_NCCL_DP], p->lay.dp, c->replica))
        rc = plane_fail(p, -EIO, "NCCL communicator of the replicas: %s", p->cu->last_error());
    return rc;
}

/* ---- parameter sharding ---- */

/* Replica k's chunk's overlap [*a, *b) with [lo, hi); 0 when there is none. */
static int owned(const plane_t *p, const nccl_ctx_t *x, int k, size_t lo, size_t hi, size_t *a, size_t *b)
{
    size_t c0 = x->sb + (size_t)k * x->chunk, c1 = c0 + x->chunk, end = p->cfg.stage_end;
    c1 = c1 < end ? c1 : end;
    *a = lo > c0 ? lo : c0;
    *b = hi < c1 ? hi : c1;
    return *a < *b;
}

/* Piece [lo, hi)'s weights, broadcast by the owner of each part into a piece buffer. */
static int shard_weights(void *arg, size_t lo, size_t hi, void **w)
{
    plane_t *p = arg;
    nccl_ctx_t *x = p->ctx;
    const cuda_plugin_t *cu = CU(p);
    for (int j = 0; j < 2; j++)
        if (x->piece_lo[j] == lo) {
            *w = x->piece[j];
            return 0;
        }
    if (hi - lo > p->lay.fsdp_unit[p->cfg.vstage])
        return plane_fail(p, -EINVAL, "piece [%zu, %zu) is larger than the gather buffers", lo, hi);
    int j = x->next;
    x->next = 1 - j;
    uint16_t *own = x->w;
    for (int k = 0; k < p->lay.dp; k++) {
        size_t a, b;
        if (owned(p, x, k, lo, hi, &a, &b) &&
            cu->nccl_broadcast_bf16(x->dp, k == p->cfg.replica ? own + (a - p->cfg.begin) : x->piece[j] + (a - lo),
                                    x->piece[j] + (a - lo), b - a, k, p->cfg.stream))
            return failed(p, "broadcast of a piece's weights");
    }
    x->piece_lo[j] = lo;
    *w = x->piece[j];
    return 0;
}

static int shard_take(void *arg, size_t lo, size_t hi, float **g)
{
    plane_t *p = arg;
    if (hi - lo > p->lay.fsdp_unit[p->cfg.vstage])
        return plane_fail(p, -EINVAL, "piece [%zu, %zu) is larger than the gradient buffer", lo, hi);
    *g = ((nccl_ctx_t *)p->ctx)->gbuf;
    return 0;
}

/* Piece [lo, hi)'s gradients reduced to the owner of each part, who adds them to its chunk. */
static int shard_give(void *arg, size_t lo, size_t hi)
{
    plane_t *p = arg;
    nccl_ctx_t *x = p->ctx;
    const cuda_plugin_t *cu = CU(p);
    for (int k = 0; k < p->lay.dp; k++) {
        size_t a, b;
        if (!owned(p, x, k, lo, hi, &a, &b))
            continue;
        if (cu->nccl_reduce_f32(x->dp, x->gbuf + (a - lo), x->sum, b - a, k, p->cfg.stream))
            return failed(p, "reduce of a piece's gradients");
        if (k == p->cfg.replica && cu->backend.f32_add(x->g + (a - p->cfg.begin), x->sum, b - a, p->cfg.stream))
            return failed(p, "adding a piece's gradients");
    }
    return 0;
}

static int shard(plane_t *p, shard_io_t *io)
{
    nccl_ctx_t *x = p->ctx;
    const backend_t *be = &CU(p)->backend;
    size_t n = p->lay.fsdp_unit[p->cfg.vstage];
    if (p->lay.copies != 1)
        return plane_fail(p, -ENOTSUP, "parallelism.data_parallel_replicate_degree = %d with sharding: HSDP on the "
                          "NCCL data plane is not built (shard over every replica)", p->lay.copies);
    if (!x->gbuf && (be->alloc((void **)&x->piece[0], n * 2) || be->alloc((void **)&x->piece[1], n * 2) ||
                     be->alloc((void **)&x->gbuf, n * 4) || be->alloc((void **)&x->sum, n * 4)))
        return plane_fail(p, -ENOMEM, "parameter sharding's piece buffers (%zu elements): %s", n,
                          CU(p)->last_error());
    *io = (shard_io_t){.weights = shard_weights, .take = shard_take, .give = shard_give, .arg = p};
    return 0;
}

/* ---- the coordinator's part: every communicator's id ---- */

/* kind 0: the activation communicator of (replica, boundary), 1: its gradient one, 2: the
 * replicas' communicator of pipeline rank `boundary_or_rank`. */
static size_t id_index(const job_layout_t *l, int kind, int replica, int boundary_or_rank)
{
    return kind < 2 ? ((size_t)replica * (l->pp - 1) + boundary_or_rank) * 2 + kind
                    : (size_t)l->dp * (l->pp - 1) * 2 + boundary_or_rank;
}

/* The coordinator makes every id (ncclGetUniqueId: it hosts each communicator's bootstrap root). */
static int boot_make(const job_layout_t *l, void **boot, size_t *len, char *err, size_t errlen)
{
    size_t n = (size_t)l->dp * (l->pp - 1) * 2 + l->pp;
    char why[512];
    const cuda_plugin_t *cu = cuda_plugin_load(why, sizeof(why));
    if (!cu)
        return util_fail(err, errlen, -ENODEV, "parallelism.data_plane = \"nccl\": %s", why);
    cuda_nccl_id_t *ids = calloc(n, sizeof(cuda_nccl_id_t));
    if (!ids)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (cu->nccl_id(&ids[i])) {
            free(ids);
            return util_fail(err, errlen, -EIO, "parallelism.data_plane = \"nccl\": %s", cu->last_error());
        }
    *boot = ids;
    *len = n * sizeof(cuda_nccl_id_t);
    return 0;
}

/* The communicators stage (replica, rank) joins, in stages/job/job.h's JOB_NCCL_* order (one it
 * does not join, such as act_in on rank 0, all zeros). */
static long boot_share(const job_layout_t *l, const void *boot, int replica, int rank, void *buf, size_t cap)
{
    const cuda_nccl_id_t *all = boot;
    cuda_nccl_id_t ids[JOB_NCCL_COMMS];
    if (cap < sizeof(ids) || replica < 0 || replica >= l->dp || rank < 0 || rank >= l->pp)
        return -EINVAL;
    memset(ids, 0, sizeof(ids));
    if (rank > 0) {
        ids[JOB_NCCL_ACT_IN] = all[id_index(l, 0, replica, rank - 1)];
        ids[JOB_NCCL_GRAD_OUT] = all[id_index(l, 1, replica, rank - 1)];
    }
    if (rank < l->pp - 1) {
        ids[JOB_NCCL_ACT_OUT] = all[id_index(l, 0, replica, rank)];
        ids[JOB_NCCL_GRAD_IN] = all[id_index(l, 1, replica, rank)];
    }
    ids[JOB_NCCL_DP] = all[id_index(l, 2, 0, rank)];
    memcpy(buf, ids, sizeof(ids));
    return (long)sizeof(ids);
}

/* Its communicators die with any of their ranks: a loss rewinds the job. */
const plane_transport_t plane_nccl = {.name = "nccl", .recovery = PLANE_RECOVER_REWIND, .device = 1, .beside = 1,
                                      .links = links, .boot_make = boot_make, .boot_share = boot_share,
                                      .shard = shard};
