/* ctitan-stage: pipeline rank `--rank` of data-parallel replica `--replica`. Holds the
 * pieces of the model its rank owns, runs the schedule's action list every step: forwards
 * take tokens (rank 0) or activations from the previous rank's ring and write their output
 * straight into the next rank's ring; backwards do the same with gradients in the other
 * direction; the last rank computes the loss. Gradients accumulate into this replica's
 * slice of the shared gradient buffer, which the optimizer shards read.
 *
 * With [job] device = "cuda" the pieces run on the GPU (kernels/cuda/cuda_model.h, from the
 * plugin stages/cuda_plugin.h loads, so CPU jobs never load the CUDA libraries), and
 * activations and gradients go from stage to stage through device rings exported with CUDA
 * IPC (stages/devdir.h: the shm rings of the act segment then only order them). With
 * [optshard] device = "cuda" the optimizer shards map this stage's device weights and
 * gradients and update them in place; with "cpu" (offload) the stage uploads the shared fp32
 * weights at the start of each step and writes the step's gradients back at its end. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ipc/ring.h"
#include "ipc/shm.h"
#include "kernels/cpu/model.h"
#include "kernels/cuda/cuda_nccl.h"
#include "stages/cuda_plugin.h"
#include "stages/devdir.h"
#include "stages/job.h"
#include "stages/ldr_seg.h"
#include "stages/schedule.h"
#include "stages/worker.h"
#include "ipc/log.h"
#include "ipc/util.h"

/* One end of a device ring (stages/devdir.h): M slots and their events, this stage's own
 * (outgoing) or mapped from the neighbour that owns it (incoming). */
typedef struct {
    char *slots;                 /* device: M slots of lay.dev_slot bytes */
    void **written, **read;      /* (M) interprocess events */
    int own;
} dring_t;

/* One direction of the NCCL data plane with one neighbour: a two-rank communicator whose
 * transfers run on their own stream (so a send waiting for its receiver never holds up the
 * model's stream), into or out of M slots, one per microbatch. */
typedef struct {
    cuda_nccl_t *comm;
    int peer;                    /* the neighbour's rank in comm */
    void *stream;
    char *slots;                 /* device: M slots of lay.dev_slot bytes */
    void **moved;                /* (M) recorded on stream after slot i's transfer */
    void **ready;                /* (M) recorded on the model's stream once it has filled (send) or
                                  * read (receive) slot i */
} nclink_t;

typedef struct {
    worker_t *w;
    const manifest_t *man;
    job_layout_t lay;
    int rank, replica, first, last;
    shm_seg_t *params, *grads, *act, *batch;
    ring_t *tok_in, *tgt_in;     /* from the loader (rank 0 / last rank) */
    ring_t *act_in, *act_out;    /* activations from rank-1 / to rank+1 */
    ring_t *grad_in, *grad_out;  /* gradients from rank+1 / to rank-1 */
    pool_t *pool;
    model_t *model;
    sched_t sched;
    model_acts_t **acts;         /* (peak in flight) */
    int cuda;                    /* device = "cuda": the model is cm, its activations cacts */
    const cuda_plugin_t *cu;
    cuda_model_t *cm;
    cuda_model_acts_t **cacts;
    shm_seg_t *dev;              /* the device directory */
    dring_t d_act_in, d_act_out, d_grad_in, d_grad_out;
    nclink_t n_act_in, n_act_out, n_grad_in, n_grad_out; /* data_plane "nccl" instead of the rings */
    cuda_nccl_t *n_dp;           /* this pipeline rank's replicas */
    uint16_t *dw;                /* the model's device weights and gradients (cuda_model_buffers), */
    float *dg;                   /* dn elements of the stage's range, CUDA_MODEL_SLACK more room */
    size_t dn;
    void *stream;                /* the model's */
    int device;
    size_t mem_peak;             /* GPU: device memory in use (by every process on the device), highest
                                  * seen at a step's end; CPU: this process's peak resident set */
    float *params_base, *grads_base; /* this stage's range of the shared parameters and gradients */
    int *acts_mb;                /* microbatch each holds, -1 free */
    int nacts;
    float dscale;                /* 1 / tokens in the global batch */
    double t_op[3], t_wait;
    int n_op[3];
} stage_t;

static void attach_ring(stage_t *st, ring_t **r, int boundary, int grad)
{
    char name[48], err[256];
    snprintf(name, sizeof(name), "%s.%d.%d", grad ? "grad" : "act", st->replica, boundary);
    size_t off = job_act_off(&st->lay, st->replica, boundary, grad);
    int rc = ring_attach(r, (char *)shm_data(st->act) + off, st->lay.act_ring, name, err, sizeof(err));
    WORKER_CHECK(st->w, rc == 0, "%s", err);
}

static void attach_batch(stage_t *st, ring_t **r, int targets)
{
    char err[256];
    int rc = ldr_seg_ring(shm_data(st->batch), 2 * st->replica + targets, r, err, sizeof(err));
    WORKER_CHECK(st->w, rc == 0, "%s", err);
}

#define CU_CHECK(st, call, ...) WORKER_CHECK((st)->w, (call) == 0, __VA_ARGS__)
#define CU_WHY(st) (st)->cu->last_error()

static void dring_make(stage_t *st, dring_t *d, devdir_ring_t r)
{
    int M = st->lay.M;
    d->own = 1;
    d->written = calloc((size_t)M, sizeof(void *));
    d->read = calloc((size_t)M, sizeof(void *));
    WORKER_CHECK(st->w, d->written && d->read, "out of memory");
    CU_CHECK(st, st->cu->ipc_alloc((void **)&d->slots, (size_t)M * st->lay.dev_slot, r.slots),
             "device ring of %d x %zu bytes: %s", M, st->lay.dev_slot, CU_WHY(st));
    for (int i = 0; i < M; i++) {
        CU_CHECK(st, st->cu->ipc_event_new(&d->written[i], &r.written[i]), "interprocess event: %s", CU_WHY(st));
        CU_CHECK(st, st->cu->ipc_event_new(&d->read[i], &r.read[i]), "interprocess event: %s", CU_WHY(st));
    }
}

static void dring_open(stage_t *st, dring_t *d, int rank, int grad)
{
    int M = st->lay.M;
    devdir_stage_t *e = devdir_wait(shm_data(st->dev), &st->lay, st->replica, rank, 120000);
    WORKER_CHECK(st->w, e, "stage %d of replica %d never published its device buffers", rank, st->replica);
    devdir_ring_t r = devdir_ring(e, &st->lay, grad);
    d->written = calloc((size_t)M, sizeof(void *));
    d->read = calloc((size_t)M, sizeof(void *));
    WORKER_CHECK(st->w, d->written && d->read, "out of memory");
    CU_CHECK(st, st->cu->ipc_open((void **)&d->slots, r.slots), "mapping the %s ring of stage %d: %s",
             grad ? "gradient" : "activation", rank, CU_WHY(st));
    for (int i = 0; i < M; i++) {
        CU_CHECK(st, st->cu->ipc_event_open(&d->written[i], &r.written[i]), "event of stage %d: %s", rank,
                 CU_WHY(st));
        CU_CHECK(st, st->cu->ipc_event_open(&d->read[i], &r.read[i]), "event of stage %d: %s", rank, CU_WHY(st));
    }
}

static void dring_close(stage_t *st, dring_t *d)
{
    if (!d->written)
        return;
    for (int i = 0; i < st->lay.M; i++) {
        st->cu->event_free(d->written[i]);
        st->cu->event_free(d->read[i]);
    }
    if (d->slots)
        d->own ? st->cu->free(d->slots) : st->cu->ipc_close(d->slots);
    free(d->written);
    free(d->read);
    memset(d, 0, sizeof(*d));
}

static void nclink_new(stage_t *st, nclink_t *l, const cuda_nccl_id_t *id, const char *name, int rank, int peer)
{
    int M = st->lay.M;
    CU_CHECK(st, st->cu->nccl_init(&l->comm, id, 2, rank), "NCCL communicator %s: %s", name, CU_WHY(st));
    l->peer = peer;
    CU_CHECK(st, st->cu->stream_new(&l->stream), "%s", CU_WHY(st));
    CU_CHECK(st, st->cu->alloc((void **)&l->slots, (size_t)M * st->lay.dev_slot), "%s slots: %s", name, CU_WHY(st));
    l->moved = calloc((size_t)M, sizeof(void *));
    l->ready = calloc((size_t)M, sizeof(void *));
    WORKER_CHECK(st->w, l->moved && l->ready, "out of memory");
    cuda_ipc_event_t unused;
    for (int i = 0; i < M; i++) {
        CU_CHECK(st, st->cu->ipc_event_new(&l->moved[i], &unused), "%s", CU_WHY(st));
        CU_CHECK(st, st->cu->ipc_event_new(&l->ready[i], &unused), "%s", CU_WHY(st));
    }
}

static void nclink_free(stage_t *st, nclink_t *l)
{
    if (!l->comm)
        return;
    if (l->stream)
        st->cu->stream_sync(l->stream);
    for (int i = 0; i < st->lay.M; i++) {
        st->cu->event_free(l->moved[i]);
        st->cu->event_free(l->ready[i]);
    }
    st->cu->nccl_destroy(&l->comm);
    st->cu->free(l->slots);
    st->cu->stream_free(l->stream);
    free(l->moved);
    free(l->ready);
    memset(l, 0, sizeof(*l));
}

/* The NCCL data plane: the ids come from the coordinator right after the config; the
 * communicators are joined in the coordinator's order of them (activations and gradients of
 * each replica's boundaries, then the replicas of each pipeline rank), so every pair of
 * neighbours meets in the same order and no one waits for a join that waits for it. In an
 * activation communicator the sender (rank b) is 0; in a gradient one the sender (b + 1). */
static void setup_nccl(stage_t *st)
{
    msg_t m;
    worker_command(st->w, &m);
    WORKER_CHECK(st->w, m.type == MSG_NCCL, "expected the NCCL ids from the coordinator, got %s",
                 msg_type_name(m.type) ? msg_type_name(m.type) : "?");
    WORKER_CHECK(st->w, m.data_len == JOB_NCCL_COMMS * sizeof(cuda_nccl_id_t),
                 "nccl message from the coordinator: %zu bytes of ids, expected %zu", m.data_len,
                 JOB_NCCL_COMMS * sizeof(cuda_nccl_id_t));
    const cuda_nccl_id_t *ids = (const cuda_nccl_id_t *)m.data;
    if (!st->first) { /* boundary rank - 1 comes before boundary rank */
        nclink_new(st, &st->n_act_in, &ids[JOB_NCCL_ACT_IN], "act_in", 1, 0);
        nclink_new(st, &st->n_grad_out, &ids[JOB_NCCL_GRAD_OUT], "grad_out", 0, 1);
    }
    if (!st->last) {
        nclink_new(st, &st->n_act_out, &ids[JOB_NCCL_ACT_OUT], "act_out", 0, 1);
        nclink_new(st, &st->n_grad_in, &ids[JOB_NCCL_GRAD_IN], "grad_in", 1, 0);
    }
    CU_CHECK(st, st->cu->nccl_init(&st->n_dp, &ids[JOB_NCCL_DP], st->lay.dp, st->replica), "NCCL communicator of the replicas: %s",
             CU_WHY(st));
    msg_clear(&m);
}

/* The GPU: the model of pieces [p0, p1), this stage's directory entry (its weights and
 * gradients for GPU optimizer shards, its outgoing rings), then its neighbours' rings. */
static void setup_cuda(stage_t *st, int p0, int p1)
{
    char err[512];
    WORKER_CHECK(st->w, st->cu = cuda_plugin_load(err, sizeof(err)), "job.device = \"cuda\": %s", err);
    int ordinal = job_local_ordinal(&st->lay, st->replica, st->rank);
    CU_CHECK(st, st->cu->dev_select(ordinal, &st->device), "%s", CU_WHY(st));
    WORKER_CHECK(st->w, !st->lay.nccl || st->device == ordinal,
                 "parallelism.data_plane = \"nccl\" needs a GPU per stage process (NCCL refuses two ranks on one "
                 "device), and this host has %d for %d stage processes: use data_plane = \"ipc\" to share GPUs",
                 st->cu->device_count(), st->lay.pp * st->lay.dp);
    CU_CHECK(st, st->cu->model_new(&st->cm, &st->man->model, p0, p1), "CUDA model of pieces [%d, %d): %s", p0, p1,
             CU_WHY(st));
    st->stream = st->cu->model_stream(st->cm);
    WORKER_CHECK(st->w, shm_attach(&st->dev, worker_job(st->w), DEVDIR_SEG, err, sizeof(err)) == 0, "%s", err);
    devdir_stage_t *e = devdir_stage(shm_data(st->dev), &st->lay, st->replica, st->rank);
    uint16_t *w;
    float *g;
    size_t begin, end;
    st->cu->model_buffers(st->cm, &w, &g, &begin, &end);
    e->begin = begin, e->end = end, e->device = st->device, e->pid = (int32_t)getpid();
    if (st->lay.gpu_shards) {
        CU_CHECK(st, st->cu->ipc_export(w, &e->w), "exporting the weights: %s", CU_WHY(st));
        CU_CHECK(st, st->cu->ipc_export(g, &e->g), "exporting the gradients: %s", CU_WHY(st));
    }
    st->dw = w, st->dg = g, st->dn = end - begin;
    if (st->lay.nccl) { /* the optimizer shards only need the buffers */
        atomic_store(&e->ready, 1);
        setup_nccl(st);
        return;
    }
    if (!st->last)
        dring_make(st, &st->d_act_out, devdir_ring(e, &st->lay, 0));
    if (!st->first)
        dring_make(st, &st->d_grad_out, devdir_ring(e, &st->lay, 1));
    atomic_store(&e->ready, 1);
    if (!st->first)
        dring_open(st, &st->d_act_in, st->rank - 1, 0);
    if (!st->last)
        dring_open(st, &st->d_grad_in, st->rank + 1, 1);
}

static void setup(stage_t *st)
{
    const manifest_t *m = st->man;
    char err[256];
    WORKER_CHECK(st->w, job_layout(&st->lay, m) == 0, "out of memory");
    const char *job = worker_job(st->w);
    if (!st->lay.gpu_shards) {
        WORKER_CHECK(st->w, shm_attach(&st->params, job, "params", err, sizeof(err)) == 0, "%s", err);
        WORKER_CHECK(st->w, shm_attach(&st->grads, job, "grads", err, sizeof(err)) == 0, "%s", err);
    }
    if (m->pp > 1 && !st->lay.nccl)
        WORKER_CHECK(st->w, shm_attach(&st->act, job, "act", err, sizeof(err)) == 0, "%s", err);
    if (st->first || st->last)
        WORKER_CHECK(st->w, shm_attach(&st->batch, job, LDR_SEG_NAME, err, sizeof(err)) == 0, "%s", err);
    if (st->first)
        attach_batch(st, &st->tok_in, 0);
    if (st->last)
        attach_batch(st, &st->tgt_in, 1);
    if (!st->first && !st->lay.nccl) {
        attach_ring(st, &st->act_in, st->rank - 1, 0);
        attach_ring(st, &st->grad_out, st->rank - 1, 1);
    }
    if (!st->last && !st->lay.nccl) {
        attach_ring(st, &st->act_out, st->rank, 0);
        attach_ring(st, &st->grad_in, st->rank, 1);
    }
    int p0, p1;
    WORKER_CHECK(st->w, manifest_stage_pieces(m, st->rank, &p0, &p1) == 0, "out of memory");
    param_table_t tab;
    WORKER_CHECK(st->w, params_table_init(&tab, &m->model) == 0, "out of memory");
    size_t begin, end;
    params_piece_range(&tab, p0, p1, &begin, &end);
    params_table_free(&tab);
    size_t base = (size_t)st->replica * st->lay.stride + begin;
    int threads = m->threads;
    if (threads <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int)(cpus / (m->pp * m->dp));
        threads = threads < 1 ? 1 : threads;
    }
    if (st->params) {
        st->params_base = (float *)shm_data(st->params) + base;
        st->grads_base = (float *)shm_data(st->grads) + base;
    }
    st->cuda = st->lay.gpu;
    if (st->cuda) {
        setup_cuda(st, p0, p1);
    } else {
        st->pool = pool_new(threads);
        st->model = model_new(&m->model, p0, p1, st->params_base, st->grads_base, st->pool);
        WORKER_CHECK(st->w, st->model, "cannot build pieces [%d, %d) of the model", p0, p1);
    }
    WORKER_CHECK(st->w, sched_build(&st->sched, m->pp, 1, m->microbatches, m->schedule, err, sizeof(err)) == 0,
                 "%s", err);
    st->nacts = sched_peak_in_flight(&st->sched, st->rank);
    st->acts = calloc((size_t)st->nacts, sizeof(*st->acts));
    st->cacts = calloc((size_t)st->nacts, sizeof(*st->cacts));
    st->acts_mb = malloc((size_t)st->nacts * sizeof(int));
    WORKER_CHECK(st->w, st->acts && st->cacts && st->acts_mb, "out of memory");
    for (int i = 0; i < st->nacts; i++) {
        if (st->cuda)
            CU_CHECK(st, st->cu->acts_new(&st->cacts[i], st->cm, st->lay.mb, st->lay.T),
                     "CUDA activations of %d microbatches: %s", st->nacts, CU_WHY(st));
        else
            WORKER_CHECK(st->w, st->acts[i] = model_acts_new(st->model, st->lay.mb, st->lay.T),
                         "out of memory for activations of %d microbatches", st->nacts);
        st->acts_mb[i] = -1;
    }
    st->dscale = 1.0f / (float)((double)m->dp * m->local_batch_size * m->seq_len);
    LOG_D("pieces [%d, %d) (%zu parameters), %d threads, schedule %s, %d activation buffers", p0, p1,
          end - begin, threads, sched_kind_name(m->schedule), st->nacts);
}

/* Index of the activation buffer holding microbatch mb (take: a free one, now mb's). */
static int acts_for(stage_t *st, int mb, int take)
{
    for (int i = 0; i < st->nacts; i++)
        if (st->acts_mb[i] == (take ? -1 : mb)) {
            if (take)
                st->acts_mb[i] = mb;
            return i;
        }
    worker_die(st->w, "schedule bug: no activation buffer %s microbatch %d", take ? "free for" : "holds", mb);
}

static void acts_free(stage_t *st, int mb)
{
    for (int i = 0; i < st->nacts; i++)
        if (st->acts_mb[i] == mb)
            st->acts_mb[i] = -1;
}

/* The next slot of an incoming ring, which must carry (step, mb). */
static void *take(stage_t *st, ring_t *r, int64_t step, int mb)
{
    void *p;
    ring_meta_t meta;
    double t0 = util_now();
    int rc = ring_peek(r, -1, &p, &meta);
    st->t_wait += util_now() - t0;
    WORKER_CHECK(st->w, rc == 0, "ring %s: %s", ring_name(r), strerror(-rc));
    WORKER_CHECK(st->w, meta.tag[0] == (uint64_t)step && meta.tag[1] == (uint64_t)mb,
                 "ring %s delivered step %llu microbatch %llu, expected step %lld microbatch %d",
                 ring_name(r), (unsigned long long)meta.tag[0], (unsigned long long)meta.tag[1],
                 (long long)step, mb);
    return p;
}

static void *reserve(stage_t *st, ring_t *r)
{
    void *p;
    double t0 = util_now();
    int rc = ring_reserve(r, -1, &p);
    st->t_wait += util_now() - t0;
    WORKER_CHECK(st->w, rc == 0, "ring %s: %s", ring_name(r), strerror(-rc));
    return p;
}

/* Token ids from a loader are checked before they index the embedding: a bad loader must
 * fail the job with a reason, not read outside the table. */
static void check_ids(stage_t *st, const int32_t *ids, const char *what, int64_t step, int mb)
{
    int n = st->lay.mb * st->lay.T, V = st->man->model.vocab_size;
    for (int i = 0; i < n; i++)
        WORKER_CHECK(st->w, ids[i] >= 0 && ids[i] < V,
                     "the loader sent %s id %d at step %lld microbatch %d position %d: not in [0, %d)",
                     what, ids[i], (long long)step, mb, i, V);
}

/* Test hook: CTITAN_TEST_NO_EVENT_WAITS=1 drops the waits on the neighbours' events, so
 * test_launch can show that the emulated GPU catches a missing one. */
static int event_waits(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("CTITAN_TEST_NO_EVENT_WAITS");
        on = !(v && v[0] == '1');
    }
    return on;
}

/* Device ring slot of a host slot: makes the stream wait for `after` of that slot first. */
static uint16_t *dslot(stage_t *st, const dring_t *d, ring_t *r, void *host, void **after, uint32_t *slot)
{
    *slot = ring_slot_of(r, host);
    if (event_waits())
        CU_CHECK(st, st->cu->stream_wait(st->stream, after[*slot]), "ring %s: %s", ring_name(r), CU_WHY(st));
    return (uint16_t *)(d->slots + (size_t)*slot * st->lay.dev_slot);
}

static void drecord(stage_t *st, void *ev, ring_t *r)
{
    CU_CHECK(st, st->cu->event_record(ev, st->stream), "ring %s: %s", ring_name(r), CU_WHY(st));
}

/* NCCL data plane: slot mb of an incoming link, the model's stream ordered after its arrival. */
static const uint16_t *nrecv(stage_t *st, nclink_t *l, int mb)
{
    char *slot = l->slots + (size_t)mb * st->lay.dev_slot;
    CU_CHECK(st, st->cu->stream_wait(l->stream, l->ready[mb]), "%s", CU_WHY(st)); /* last use read it */
    CU_CHECK(st, st->cu->nccl_recv(l->comm, slot, st->lay.dev_slot, l->peer, l->stream), "%s", CU_WHY(st));
    CU_CHECK(st, st->cu->event_record(l->moved[mb], l->stream), "%s", CU_WHY(st));
    if (event_waits())
        CU_CHECK(st, st->cu->stream_wait(st->stream, l->moved[mb]), "%s", CU_WHY(st));
    return (const uint16_t *)slot;
}

/* Slot mb of an outgoing link, once its last send has left. */
static uint16_t *nslot(stage_t *st, nclink_t *l, int mb)
{
    CU_CHECK(st, st->cu->stream_wait(st->stream, l->moved[mb]), "%s", CU_WHY(st));
    return (uint16_t *)(l->slots + (size_t)mb * st->lay.dev_slot);
}

/* The model's stream is done with slot mb: an incoming slot may be received into again, an
 * outgoing one is sent. */
static void ndone(stage_t *st, nclink_t *l, int mb, int send)
{
    CU_CHECK(st, st->cu->event_record(l->ready[mb], st->stream), "%s", CU_WHY(st));
    if (!send)
        return;
    CU_CHECK(st, st->cu->stream_wait(l->stream, l->ready[mb]), "%s", CU_WHY(st));
    CU_CHECK(st, st->cu->nccl_send(l->comm, l->slots + (size_t)mb * st->lay.dev_slot, st->lay.dev_slot, l->peer,
                                   l->stream), "%s", CU_WHY(st));
    CU_CHECK(st, st->cu->event_record(l->moved[mb], l->stream), "%s", CU_WHY(st));
}

static double forward(stage_t *st, int64_t step, int mb)
{
    int a = acts_for(st, mb, 1), nccl = st->lay.nccl;
    const int32_t *tok = NULL, *tgt = NULL;
    void *x_in = NULL, *x_out = NULL;
    uint32_t si = 0, so = 0;
    if (st->first)
        check_ids(st, tok = take(st, st->tok_in, step, mb), "token", step, mb);
    else if (!nccl)
        x_in = take(st, st->act_in, step, mb);
    if (st->last)
        check_ids(st, tgt = take(st, st->tgt_in, step, mb), "target", step, mb);
    else if (!nccl)
        x_out = reserve(st, st->act_out);
    double t0 = util_now();
    double loss = 0;
    if (nccl) {
        const uint16_t *din = st->first ? NULL : nrecv(st, &st->n_act_in, mb);
        uint16_t *dout = st->last ? NULL : nslot(st, &st->n_act_out, mb);
        CU_CHECK(st, st->cu->forward_dev(st->cm, st->cacts[a], tok, din, tgt, st->dscale, dout, &loss),
                 "CUDA forward: %s", CU_WHY(st));
        if (din)
            ndone(st, &st->n_act_in, mb, 0);
        if (dout)
            ndone(st, &st->n_act_out, mb, 1);
    } else if (st->cuda) {
        const uint16_t *din = x_in ? dslot(st, &st->d_act_in, st->act_in, x_in, st->d_act_in.written, &si) : NULL;
        uint16_t *dout = x_out ? dslot(st, &st->d_act_out, st->act_out, x_out, st->d_act_out.read, &so) : NULL;
        CU_CHECK(st, st->cu->forward_dev(st->cm, st->cacts[a], tok, din, tgt, st->dscale, dout, &loss),
                 "CUDA forward: %s", CU_WHY(st));
        if (din)
            drecord(st, st->d_act_in.read[si], st->act_in);
        if (dout)
            drecord(st, st->d_act_out.written[so], st->act_out);
    } else {
        loss = model_forward(st->model, st->acts[a], tok, x_in, tgt, st->dscale, x_out);
    }
    st->t_op[SCHED_F] += util_now() - t0;
    st->n_op[SCHED_F]++;
    if (st->first)
        ring_release(st->tok_in);
    else if (!nccl)
        ring_release(st->act_in);
    if (st->last)
        ring_release(st->tgt_in);
    else if (!nccl)
        ring_commit(st->act_out, (uint64_t)step, (uint64_t)mb, st->lay.act_slot);
    return loss;
}

static void backward_b(stage_t *st, int64_t step, int mb)
{
    int a = acts_for(st, mb, 0), nccl = st->lay.nccl;
    void *dy = st->last || nccl ? NULL : take(st, st->grad_in, step, mb);
    void *dx = st->first || nccl ? NULL : reserve(st, st->grad_out);
    double t0 = util_now();
    if (nccl) {
        const uint16_t *din = st->last ? NULL : nrecv(st, &st->n_grad_in, mb);
        uint16_t *dout = st->first ? NULL : nslot(st, &st->n_grad_out, mb);
        CU_CHECK(st, st->cu->backward_b_dev(st->cm, st->cacts[a], din, dout), "CUDA backward: %s", CU_WHY(st));
        if (din)
            ndone(st, &st->n_grad_in, mb, 0);
        if (dout)
            ndone(st, &st->n_grad_out, mb, 1);
    } else if (st->cuda) {
        uint32_t si = 0, so = 0;
        const uint16_t *din = dy ? dslot(st, &st->d_grad_in, st->grad_in, dy, st->d_grad_in.written, &si) : NULL;
        uint16_t *dout = dx ? dslot(st, &st->d_grad_out, st->grad_out, dx, st->d_grad_out.read, &so) : NULL;
        CU_CHECK(st, st->cu->backward_b_dev(st->cm, st->cacts[a], din, dout), "CUDA backward: %s", CU_WHY(st));
        if (din)
            drecord(st, st->d_grad_in.read[si], st->grad_in);
        if (dout)
            drecord(st, st->d_grad_out.written[so], st->grad_out);
    } else {
        model_backward_b(st->model, st->acts[a], dy, dx);
    }
    st->t_op[SCHED_B] += util_now() - t0;
    st->n_op[SCHED_B]++;
    if (!st->last && !nccl)
        ring_release(st->grad_in);
    if (!st->first && !nccl)
        ring_commit(st->grad_out, (uint64_t)step, (uint64_t)mb, st->lay.act_slot);
}

static void backward_w(stage_t *st, int mb)
{
    double t0 = util_now();
    int a = acts_for(st, mb, 0);
    if (st->cuda)
        CU_CHECK(st, st->cu->backward_w(st->cm, st->cacts[a]), "CUDA weight gradients: %s", CU_WHY(st));
    else
        model_backward_w(st->model, st->acts[a]);
    st->t_op[SCHED_W] += util_now() - t0;
    st->n_op[SCHED_W]++;
    acts_free(st, mb);
}

static void run_step(stage_t *st, int64_t step)
{
    memset(st->t_op, 0, sizeof(st->t_op));
    memset(st->n_op, 0, sizeof(st->n_op));
    st->t_wait = 0;
    double loss = 0, t0 = util_now();
    if (st->cuda && !st->lay.gpu_shards) /* offload: this step's weights, as the CPU shards left them */
        CU_CHECK(st, st->cu->set_weights(st->cm, st->params_base), "CUDA weights: %s", CU_WHY(st));
    size_t chunk = job_dp_chunk(&st->lay, st->dn), r = (size_t)st->replica;
    if (st->lay.nccl) /* every replica's chunk of the weights, as its optimizer shard left it */
        CU_CHECK(st, st->cu->nccl_all_gather_bf16(st->n_dp, st->dw + r * chunk, st->dw, chunk, st->stream),
                 "all-gather of the weights: %s", CU_WHY(st));
    const sched_action_t *a = st->sched.a[st->rank];
    for (int i = 0; i < st->sched.n[st->rank]; i++) {
        switch (a[i].op) {
        case SCHED_F: loss += forward(st, step, a[i].mb); break; /* microbatch order: fixed sum */
        case SCHED_B: backward_b(st, step, a[i].mb); break;
        case SCHED_W: backward_w(st, a[i].mb); break;
        }
        worker_progress(st->w);
    }
    if (st->lay.nccl) { /* the replicas' sum of this replica's chunk, where its shard reads it */
        size_t all = chunk * (size_t)st->lay.dp;
        CU_CHECK(st, st->cu->nccl_reduce_scatter_f32(st->n_dp, st->dg, st->dg + r * chunk, chunk, st->stream),
                 "reduce-scatter of the gradients: %s", CU_WHY(st));
        CU_CHECK(st, st->cu->zero_async(st->dg, r * chunk * sizeof(float), st->stream), "%s", CU_WHY(st));
        CU_CHECK(st, st->cu->zero_async(st->dg + (r + 1) * chunk, (all - (r + 1) * chunk) * sizeof(float), st->stream),
                 "%s", CU_WHY(st));
        nclink_t *out[] = {&st->n_act_out, &st->n_grad_out};
        for (int i = 0; i < 2; i++)
            if (out[i]->comm)
                CU_CHECK(st, st->cu->stream_sync(out[i]->stream), "NCCL sends: %s", CU_WHY(st));
    }
    if (st->cuda) {
        if (st->lay.gpu_shards) /* the gradients are complete where the shards read them */
            CU_CHECK(st, st->cu->model_sync(st->cm), "CUDA step: %s", CU_WHY(st));
        else /* offload: the step's gradients, where the CPU shards read them */
            CU_CHECK(st, st->cu->take_grads(st->cm, st->grads_base), "CUDA gradients: %s", CU_WHY(st));
        size_t used, total;
        if (st->cu->dev_mem(&used, &total) == 0 && used > st->mem_peak)
            st->mem_peak = used;
    }
    if (!st->cuda) {
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0)
            st->mem_peak = (size_t)ru.ru_maxrss * 1024;
    }
    double total = util_now() - t0;
    msg_t m = {.type = MSG_STEP_DONE, .step = step, .loss = loss, .t_wait = st->t_wait,
               .t_busy = total - st->t_wait, .mem = st->mem_peak};
    m.t_f = st->n_op[SCHED_F] ? st->t_op[SCHED_F] / st->n_op[SCHED_F] : 0;
    m.t_b = st->n_op[SCHED_B] ? st->t_op[SCHED_B] / st->n_op[SCHED_B] : 0;
    m.t_w = st->n_op[SCHED_W] ? st->t_op[SCHED_W] / st->n_op[SCHED_W] : 0;
    WORKER_CHECK(st->w, worker_send(st->w, &m) == 0, "cannot reach the coordinator");
}

static void usage(void) { fprintf(stderr, "usage: ctitan-stage --rank S --replica R (started by `ctitan launch`)\n"); }

int main(int argc, char **argv)
{
    stage_t st = {.rank = -1, .replica = -1};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rank")) st.rank = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--replica")) st.replica = atoi(argv[i + 1]);
    }
    if (st.rank < 0 || st.replica < 0) {
        usage();
        return 2;
    }
    char err[512];
    if (worker_open(&st.w, "stage", st.rank, st.replica, err, sizeof(err))) {
        fprintf(stderr, "ctitan-stage: %s\n", err);
        return 1;
    }
    st.man = worker_manifest(st.w);
    WORKER_CHECK(st.w, st.rank < st.man->pp && st.replica < st.man->dp,
                 "rank %d replica %d is outside the topology (pp %d, dp %d)", st.rank, st.replica,
                 st.man->pp, st.man->dp);
    st.first = st.rank == 0;
    st.last = st.rank == st.man->pp - 1;
    setup(&st);
    WORKER_CHECK(st.w, worker_ready(st.w) == 0, "cannot reach the coordinator");
    for (;;) {
        msg_t m;
        worker_command(st.w, &m);
        msg_type_t type = m.type;
        int64_t step = m.step;
        msg_clear(&m);
        if (type == MSG_STOP)
            break;
        if (type == MSG_STEP)
            run_step(&st, step);
    }
    for (int i = 0; i < st.nacts; i++) {
        model_acts_destroy(&st.acts[i]);
        if (st.cacts[i])
            st.cu->acts_destroy(&st.cacts[i]);
    }
    if (st.cu) {
        dring_t *d[] = {&st.d_act_in, &st.d_act_out, &st.d_grad_in, &st.d_grad_out};
        for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++)
            dring_close(&st, d[i]);
        nclink_t *l[] = {&st.n_act_in, &st.n_act_out, &st.n_grad_in, &st.n_grad_out};
        for (size_t i = 0; i < sizeof(l) / sizeof(l[0]); i++)
            nclink_free(&st, l[i]);
        if (st.n_dp)
            st.cu->nccl_destroy(&st.n_dp);
    }
    if (st.cm)
        st.cu->model_destroy(&st.cm);
    free(st.acts);
    free(st.cacts);
    free(st.acts_mb);
    sched_free(&st.sched);
    model_destroy(&st.model);
    pool_destroy(&st.pool);
    ring_t **rings[] = {&st.tok_in, &st.tgt_in, &st.act_in, &st.act_out, &st.grad_in, &st.grad_out};
    for (size_t i = 0; i < sizeof(rings) / sizeof(rings[0]); i++)
        ring_detach(rings[i]);
    shm_detach(&st.params);
    shm_detach(&st.grads);
    shm_detach(&st.act);
    shm_detach(&st.batch);
    shm_detach(&st.dev);
    worker_close(&st.w);
    return 0;
}
