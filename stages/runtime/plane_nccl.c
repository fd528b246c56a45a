/* The GPU data plane over NCCL (plane.h "nccl"; [parallelism] data_plane = "nccl"): each link
 * is a two-rank communicator with one neighbour whose transfers run on a stream of their own
 * (so a send waiting for its receiver never holds up the model's stream), into or out of M
 * device slots, one per microbatch. Two events per slot order reuse: moved[i] (recorded on
 * the link's stream after slot i's transfer) and ready[i] (recorded on the model's stream once
 * it has filled or read slot i). Around a step, the replicas of this pipeline rank all-gather
 * the weights (each replica's optimizer shard updated one chunk) and reduce-scatter the
 * gradients (replica r keeps the sum of chunk r, where its shard reads it). With parameter
 * sharding (plane_shard_io) replica r holds only its chunk of the weights and gradients: each
 * piece's weights are broadcast from the chunks' owners before the model uses them, and each
 * piece's gradients reduced to the owners of its parts, who add them to their chunk (below,
 * "parameter sharding"). */
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
    cuda_nccl_t *dp;             /* the replicas of this pipeline rank (with sharding: of its group) */
    cuda_nccl_t *rep;            /* sharding with replicate degree > 1: this member of every group */
    uint16_t *w;                 /* the model's weights and gradients: n elements and room for dp */
    float *g;                    /* chunks (CUDA_MODEL_SLACK); with sharding only this replica's chunk */
    size_t n;
    /* parameter sharding */
    size_t sb, chunk;            /* the stage's range starts at sb; replica k owns chunk k */
    struct nccl_shard *shard;    /* the exchange (plane_shard_io), or NULL */
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

static int shard_begin(plane_t *p, struct nccl_shard *h);
static int shard_end(plane_t *p, struct nccl_shard *h);
static void shard_destroy(plane_t *p, struct nccl_shard *h);

/* Every replica's chunk of the weights, as its optimizer shard left it (with sharding each
 * piece's, as the model asks). */
static int nccl_step_begin(plane_t *p, int64_t step)
{
    nccl_ctx_t *x = p->ctx;
    if (p->lay.fsdp > 1)
        return x->shard ? shard_begin(p, x->shard) : 0;
    size_t chunk = job_dp_chunk(&p->lay, x->n), r = (size_t)p->cfg.replica;
    if (CU(p)->nccl_all_gather_bf16(x->dp, x->w + r * chunk, x->w, chunk, p->cfg.stream))
        return failed(p, "all-gather of the weights");
    return 0;
}

/* The replicas' sum of this replica's chunk, where its shard reads it, the other chunks
 * cleared for the next step (with sharding: every piece's reduce done); every send of the step
 * on its way. */
static int nccl_step_end(plane_t *p)
{
    nccl_ctx_t *x = p->ctx;
    const cuda_plugin_t *cu = CU(p);
    int rc;
    if (x->shard && (rc = shard_end(p, x->shard)))
        return rc;
    if (p->lay.fsdp < 2) { /* sharded: each piece's gradients were reduced to their owners already */
        size_t chunk = job_dp_chunk(&p->lay, x->n), r = (size_t)p->cfg.replica, all = chunk * (size_t)p->lay.dp;
        if (cu->nccl_reduce_scatter_f32(x->dp, x->g, x->g + r * chunk, chunk, p->cfg.stream))
            return failed(p, "reduce-scatter of the gradients");
        if (cu->backend.zero(x->g, r * chunk * sizeof(float), p->cfg.stream) ||
            cu->backend.zero(x->g + (r + 1) * chunk, (all - (r + 1) * chunk) * sizeof(float), p->cfg.stream))
            return failed(p, "clearing the gradients");
    }
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
    if (x->shard && p->cfg.stream)
        CU(p)->backend.stream_sync(p->cfg.stream);
    shard_destroy(p, x->shard);
    CU(p)->nccl_destroy(&x->dp);
    CU(p)->nccl_destroy(&x->rep);
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
                      .chunk = job_dp_chunk(&p->lay, c->stage_end - c->stage_begin)};
    int rc = 0, first = c->rank == 0, last = c->rank == p->lay.pp - 1;
    if (!first && !(rc = add_end(p, PLANE_ACT_IN, &ids[JOB_NCCL_ACT_IN], "act_in", 1, 0))) /* boundary rank - 1 */
        rc = add_end(p, PLANE_GRAD_OUT, &ids[JOB_NCCL_GRAD_OUT], "grad_out", 0, 1);       /* before boundary rank */
    if (!rc && !last && !(rc = add_end(p, PLANE_ACT_OUT, &ids[JOB_NCCL_ACT_OUT], "act_out", 0, 1)))
        rc = add_end(p, PLANE_GRAD_IN, &ids[JOB_NCCL_GRAD_IN], "grad_in", 1, 0);
    int C = job_chunks(&p->lay), hsdp = p->lay.fsdp > 1 && p->lay.copies > 1;
    if (!rc && p->cu->nccl_init(&x->dp, &ids[JOB_NCCL_DP], C, c->replica % C))
        rc = plane_fail(p, -EIO, "NCCL communicator of the replicas: %s", p->cu->last_error());
    if (!rc && hsdp && p->cu->nccl_init(&x->rep, &ids[JOB_NCCL_REP], p->lay.copies, job_copy_of(&p->lay, c->replica)))
        rc = plane_fail(p, -EIO, "NCCL communicator of the groups: %s", p->cu->last_error());
    return rc;
}

/* ---- parameter sharding ----
 *
 * Every collective of the replicas' communicator runs on one stream of its own (NCCL wants its
 * calls in the same order on every rank; one stream keeps them so), ordered against the model's
 * stream by events: a piece's broadcast waits until the model has finished with what its buffer
 * held (free), the model waits until it arrived (ready); a piece's reduce waits until its W
 * filled the gradient buffer (filled), the next W into that buffer until it was reduced
 * (reduced). While the model computes one piece the next one (the model announces it) is
 * gathered into the other buffer, and with two gradient buffers a piece's reduce runs during
 * the next piece's W. Resharded after forward ("always"): two piece buffers; never: one buffer
 * of the whole stage, each piece gathered once a step. */

enum { GBUFS = 2 };

typedef struct nccl_shard {
    void *stream;                /* the communicator's */
    int slots;                   /* piece buffers: 2, or the stage's pieces laid out as the range (never) */
    uint16_t *wbuf;              /* (slots == 2: 2 x unit, else the stage's range) bf16 */
    size_t *lo;                  /* (slots) the piece each holds, SIZE_MAX none */
    void **ready, **free_;       /* (slots) events */
    int cur;                     /* the slot the model uses */
    float *gbuf[GBUFS], *sum;    /* gradient buffers (unit each), an owner's part of a reduce */
    uint16_t *g16, *sum16;       /* a bf16 reduce: the piece rounded, an owner's part (unit each; no sum) */
    void *filled[GBUFS], *reduced[GBUFS];
    int g;                       /* the gradient buffer of the piece in W */
} nccl_shard_t;

/* This replica's place in its group. */
static int member(const plane_t *p) { return p->cfg.replica % p->lay.fsdp; }

/* Member k's chunk's overlap [*a, *b) with [lo, hi); 0 when there is none. */
static int owned(const plane_t *p, const nccl_ctx_t *x, int k, size_t lo, size_t hi, size_t *a, size_t *b)
{
    size_t c0 = x->sb + (size_t)k * x->chunk, c1 = c0 + x->chunk, end = p->cfg.stage_end;
    c1 = c1 < end ? c1 : end;
    *a = lo > c0 ? lo : c0;
    *b = hi < c1 ? hi : c1;
    return *a < *b;
}

static uint16_t *slot_buf(const plane_t *p, const nccl_shard_t *h, int j, size_t lo)
{
    return h->slots == 2 ? h->wbuf + (size_t)j * p->lay.fsdp_unit[p->cfg.vstage] : h->wbuf + (lo - p->cfg.stage_begin);
}

/* The slot a piece not held goes to: the other of two (the one the model used before the
 * current one), or, never resharding, a free one (each piece has its place in the stage's
 * buffer; there are as many slots as pieces). */
static int next_slot(const nccl_shard_t *h, int cur)
{
    if (h->slots == 2)
        return 1 - cur;
    int j = 0;
    while (j < h->slots - 1 && h->lo[j] != SIZE_MAX)
        j++;
    return j;
}

static int held(const nccl_shard_t *h, size_t lo)
{
    for (int j = 0; j < h->slots; j++)
        if (h->lo[j] == lo)
            return j;
    return -1;
}

/* Piece [lo, hi) broadcast by the owner of each part into slot j, on the communicator's stream,
 * once the model is done with what the slot held. */
static int gather(plane_t *p, nccl_shard_t *h, int j, size_t lo, size_t hi)
{
    nccl_ctx_t *x = p->ctx;
    const cuda_plugin_t *cu = CU(p);
    uint16_t *buf = slot_buf(p, h, j, lo);
    if (hi - lo > (h->slots == 2 ? p->lay.fsdp_unit[p->cfg.vstage] : p->cfg.stage_end - lo))
        return plane_fail(p, -EINVAL, "piece [%zu, %zu) is larger than the gather buffers", lo, hi);
    if (cu->event_record(h->free_[j], p->cfg.stream) || cu->stream_wait(h->stream, h->free_[j]))
        return failed(p, "ordering a gather");
    for (int k = 0; k < p->lay.fsdp; k++) {
        size_t a, b;
        if (owned(p, x, k, lo, hi, &a, &b) &&
            cu->nccl_broadcast_bf16(x->dp, k == member(p) ? x->w + (a - p->cfg.begin) : buf + (a - lo),
                                    buf + (a - lo), b - a, k, h->stream))
            return failed(p, "broadcast of a piece's weights");
    }
    if (cu->event_record(h->ready[j], h->stream))
        return failed(p, "ordering a gather");
    h->lo[j] = lo;
    return 0;
}

static int shard_weights(void *arg, size_t lo, size_t hi, size_t next_lo, size_t next_hi, void **w)
{
    plane_t *p = arg;
    nccl_shard_t *h = ((nccl_ctx_t *)p->ctx)->shard;
    int rc, j = held(h, lo);
    if (j < 0 && (rc = gather(p, h, j = next_slot(h, h->cur), lo, hi)))
        return rc;
    if (CU(p)->stream_wait(p->cfg.stream, h->ready[j]))
        return failed(p, "waiting for a piece's weights");
    h->cur = j;
    *w = slot_buf(p, h, j, lo);
    if (next_lo < next_hi && held(h, next_lo) < 0) /* prefetched while this piece computes */
        return gather(p, h, next_slot(h, j), next_lo, next_hi);
    return 0;
}

static int shard_take(void *arg, size_t lo, size_t hi, float **g)
{
    plane_t *p = arg;
    nccl_shard_t *h = ((nccl_ctx_t *)p->ctx)->shard;
    if (hi - lo > p->lay.fsdp_unit[p->cfg.vstage])
        return plane_fail(p, -EINVAL, "piece [%zu, %zu) is larger than the gradient buffers", lo, hi);
    h->g = (h->g + 1) % GBUFS;
    if (CU(p)->stream_wait(p->cfg.stream, h->reduced[h->g])) /* its last reduce has read it */
        return failed(p, "ordering a piece's gradients");
    *g = h->gbuf[h->g];
    return 0;
}

/* Piece [lo, hi)'s gradients reduced to the owner of each part, who adds them to its chunk. */
static int shard_give(void *arg, size_t lo, size_t hi)
{
    plane_t *p = arg;
    nccl_ctx_t *x = p->ctx;
    nccl_shard_t *h = x->shard;
    const cuda_plugin_t *cu = CU(p);
    float *gb = h->gbuf[h->g];
    if (cu->event_record(h->filled[h->g], p->cfg.stream) || cu->stream_wait(h->stream, h->filled[h->g]))
        return failed(p, "ordering a piece's gradients");
    if (h->g16 && cu->backend.to_weights(h->g16, gb, hi - lo, h->stream)) /* bf16, round to nearest even */
        return failed(p, "rounding a piece's gradients to bf16");
    for (int k = 0; k < p->lay.fsdp; k++) {
        size_t a, b;
        if (!owned(p, x, k, lo, hi, &a, &b))
            continue;
        if (h->g16 ? cu->nccl_reduce_bf16(x->dp, h->g16 + (a - lo), h->sum16, b - a, k, h->stream)
                   : cu->nccl_reduce_f32(x->dp, gb + (a - lo), h->sum, b - a, k, h->stream))
            return failed(p, "reduce of a piece's gradients");
        if (k != member(p))
            continue;
        float *mine = x->g + (a - p->cfg.begin); /* only this member's part is in its chunk */
        if (h->g16 ? cu->f32_add_bf16(mine, h->sum16, b - a, h->stream)
                   : cu->backend.f32_add(mine, h->sum, b - a, h->stream))
            return failed(p, "adding a piece's gradients");
    }
    return cu->event_record(h->reduced[h->g], h->stream) ? failed(p, "ordering a piece's gradients") : 0;
}

static void shard_forget(nccl_shard_t *h)
{
    for (int j = 0; j < h->slots; j++)
        h->lo[j] = SIZE_MAX;
}

/* Before a step: the shards updated the chunks, so no piece is held; with several groups (HSDP)
 * group 0's chunk, which its shard updated, goes to the same member of every other group. */
static int shard_begin(plane_t *p, nccl_shard_t *h)
{
    nccl_ctx_t *x = p->ctx;
    shard_forget(h);
    int rc = plane_shard_waits(p, h->stream); /* the gathers and reduces run there */
    if (rc)
        return rc;
    if (x->rep && CU(p)->nccl_broadcast_bf16(x->rep, x->w, x->w, x->n, 0, h->stream))
        return failed(p, "broadcast of the weights to the other groups");
    return 0;
}

/* After it: with several groups every group's chunk of the gradients summed into group 0's
 * (its shard reads them there; the others start again from zero); every reduce done. */
static int shard_end(plane_t *p, nccl_shard_t *h)
{
    nccl_ctx_t *x = p->ctx;
    const cuda_plugin_t *cu = CU(p);
    if (x->rep && (cu->nccl_reduce_f32(x->rep, x->g, x->g, x->n, 0, h->stream) ||
                   (job_copy_of(&p->lay, p->cfg.replica) > 0 && cu->backend.zero(x->g, x->n * sizeof(float), h->stream))))
        return failed(p, "reduce of the gradients to the first group");
    return cu->backend.stream_sync(h->stream) ? failed(p, "the reduces of the gradients") : 0;
}

static void shard_destroy(plane_t *p, nccl_shard_t *h)
{
    const cuda_plugin_t *cu = CU(p);
    if (!h)
        return;
    if (h->stream)
        cu->backend.stream_sync(h->stream);
    for (int j = 0; h->ready && j < h->slots; j++) {
        cu->event_free(h->ready[j]);
        cu->event_free(h->free_[j]);
    }
    for (int j = 0; j < GBUFS; j++) {
        cu->event_free(h->filled[j]);
        cu->event_free(h->reduced[j]);
        cu->backend.free(h->gbuf[j]);
    }
    cu->backend.free(h->sum);
    cu->backend.free(h->g16);
    cu->backend.free(h->sum16);
    cu->backend.free(h->wbuf);
    cu->backend.stream_free(h->stream);
    free(h->lo);
    free(h->ready);
    free(h->free_);
    free(h);
}

static int shard(plane_t *p, shard_io_t *io)
{
    nccl_ctx_t *x = p->ctx;
    const cuda_plugin_t *cu = CU(p);
    const backend_t *be = &cu->backend;
    size_t unit = p->lay.fsdp_unit[p->cfg.vstage], range = p->cfg.stage_end - p->cfg.stage_begin;
    if (!x->shard) {
        nccl_shard_t *h = x->shard = calloc(1, sizeof(nccl_shard_t));
        if (!h)
            return plane_fail(p, -ENOMEM, "out of memory");
        h->slots = p->lay.fsdp_reshard ? 2 : p->lay.fsdp_pieces[p->cfg.vstage];
        h->lo = malloc((size_t)h->slots * sizeof(size_t));
        h->ready = calloc((size_t)h->slots, sizeof(void *));
        h->free_ = calloc((size_t)h->slots, sizeof(void *));
        if (!h->lo || !h->ready || !h->free_)
            return plane_fail(p, -ENOMEM, "out of memory");
        shard_forget(h);
        cuda_ipc_event_t unused;
        for (int j = 0; j < h->slots; j++)
            if (cu->ipc_event_new(&h->ready[j], &unused) || cu->ipc_event_new(&h->free_[j], &unused))
                return failed(p, "parameter sharding's events");
        for (int j = 0; j < GBUFS; j++)
            if (cu->ipc_event_new(&h->filled[j], &unused) || cu->ipc_event_new(&h->reduced[j], &unused) ||
                be->alloc((void **)&h->gbuf[j], unit * 4))
                return plane_fail(p, -ENOMEM, "parameter sharding's gradient buffers: %s", cu->last_error());
        size_t wn = h->slots == 2 ? 2 * unit : range;
        int bf16 = p->lay.fsdp_bf16;
        if (be->stream_new(&h->stream) || be->alloc((void **)&h->wbuf, wn * 2) ||
            (bf16 ? be->alloc((void **)&h->g16, unit * 2) || be->alloc((void **)&h->sum16, unit * 2)
                  : be->alloc((void **)&h->sum, unit * 4)))
            return plane_fail(p, -ENOMEM, "parameter sharding's piece buffers (%zu + %zu elements): %s", wn, unit,
                              cu->last_error());
    }
    *io = (shard_io_t){.weights = shard_weights, .take = shard_take, .give = shard_give, .arg = p};
    return 0;
}

/* ---- the coordinator's part: every communicator's id ---- */

/* Groups of replicas with a communicator of their own at each pipeline rank: one of every
 * replica, or with sharding one a group. */
static int dp_comms(const job_layout_t *l) { return l->fsdp > 1 ? l->copies : 1; }

/* kind 0: the activation communicator of (replica, boundary), 1: its gradient one, 2: the
 * replicas' communicator of pipeline rank `boundary_or_rank` (with sharding, of the replica's
 * group), 3: with sharding and several groups, that of the replica's member of every group. */
static size_t id_index(const job_layout_t *l, int kind, int replica, int boundary_or_rank)
{
    size_t links = (size_t)l->dp * (l->pp - 1) * 2, dps = (size_t)l->pp * dp_comms(l);
    if (kind < 2)
        return ((size_t)replica * (l->pp - 1) + boundary_or_rank) * 2 + kind;
    if (kind == 2)
        return links + (size_t)boundary_or_rank * dp_comms(l) + (l->fsdp > 1 ? (size_t)job_copy_of(l, replica) : 0);
    return links + dps + (size_t)boundary_or_rank * l->fsdp + (size_t)(replica % l->fsdp);
}

/* The coordinator makes every id (ncclGetUniqueId: it hosts each communicator's bootstrap root). */
static int boot_make(const job_layout_t *l, void **boot, size_t *len, char *err, size_t errlen)
{
    int hsdp = l->fsdp > 1 && l->copies > 1;
    size_t n = (size_t)l->dp * (l->pp - 1) * 2 + (size_t)l->pp * dp_comms(l) + (hsdp ? (size_t)l->pp * l->fsdp : 0);
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
    ids[JOB_NCCL_DP] = all[id_index(l, 2, replica, rank)];
    if (l->fsdp > 1 && l->copies > 1)
        ids[JOB_NCCL_REP] = all[id_index(l, 3, replica, rank)];
    memcpy(buf, ids, sizeof(ids));
    return (long)sizeof(ids);
}

/* Its communicators die with any of their ranks: a loss rewinds the job. */
const plane_transport_t plane_nccl = {.name = "nccl", .recovery = PLANE_RECOVER_REWIND, .device = 1, .beside = 1,
                                      .links = links, .boot_make = boot_make, .boot_share = boot_share,
                                      .shard = shard};
