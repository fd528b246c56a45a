/* ctitan-optshard: optimizer shard `--rank` of K. Owns one contiguous slice of the flat
 * parameter space: its training state, the fp32 master weights and the optimizer's state arrays
 * ([optimizer] name: a row of kernels/optim.h, AdamW's two moments). Each step, on REDUCE it
 * sums its slice of every replica's gradients (replica order fixed) and writes the squared norm
 * of each MANIFEST_BLOCK block into the job segment; on UPDATE (with the global clip factor the
 * coordinator computed from all blocks) it applies the optimizer's step at the step's lr and
 * writes the new weights into every replica's parameters, then clears those gradients. Block
 * boundaries do not depend on K, so any shard count gives the same bits.
 *
 * Where: the vector work is the backend's (kernels/backend.h). [optshard] device = "cpu"
 * keeps the state in the job's optstate segment (stages/job/job.h) and works on the fp32
 * params/grads segments (the CPU job, and offload mode for GPU stages); "cuda" keeps it on the
 * GPU and works directly on the stages' device buffers, mapped through the CUDA IPC handles they
 * publish (stages/job/devdir.h), the new weights written as bf16 in place. Either way set-up
 * makes one list of where each replica holds which part of the slice, and the steps only
 * walk it.
 *
 * Surviving a kill (CPU, DESIGN.md "Recovery"): the optstate segment holds two banks; an
 * update reads one and writes the other (an out-of-place step, the same bits), then commits
 * (the shard's record says which bank is whole), then publishes the weights and clears the
 * gradients. A replacement started after a kill takes the committed bank over, and whatever
 * round the coordinator sends it again comes out the same: REDUCE and UPDATE only read the
 * gradients (the clip factor is applied inside the step), which stay whole until the commit; an
 * UPDATE already committed only publishes again. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/log.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "kernels/backend.h"
#include "kernels/cuda_plugin.h"
#include "kernels/lr.h"
#include "kernels/optim.h"
#include "kernels/params.h"
#include "stages/job/devdir.h"
#include "stages/job/job.h"
#include "stages/job/staging.h"
#include "stages/runtime/worker.h"

/* The part [lo, hi) of the shard's slice that one stage replica holds: its weights there (in
 * the backend's dtype) and its fp32 gradients. */
typedef struct {
    void *w;
    float *g;
    size_t lo, hi;
    int replica;
} part_t;

typedef struct {
    worker_t *w;
    const manifest_t *man;
    job_layout_t lay;
    param_table_t tab;
    int rank;
    size_t begin, end, n;        /* slice [begin, end) of the flat space */
    const optim_t *optim;        /* [optimizer] name */
    int arrays;                  /* of the training state: the master weights, then the optimizer's */
    float *host;                 /* (arrays, n) GPU shards: the initial or loaded state on the host;
                                  * NULL once it is in `state` */
    const backend_t *be;
    int device;
    void *stream, *copy_stream;  /* updates; snapshots (the copier thread) */
    struct {                     /* in the backend's memory, one allocation (mem) */
        void *mem;
        float *g;                /* (n) the replicas' summed gradient, or in place: the one part */
        double *norm;            /* (blocks of the slice) squared norms */
    } state;
    struct {                     /* bank b: the state after a number of steps = b (mod 2): arrays of */
        float *a[OPTIM_ARRAYS_MAX]; /* (n) the optstate segment's bank, or for GPU shards the one copy
                                  * in `state`'s allocation, both banks (updated in place) */
    } bank[2];
    int64_t done;                /* steps the state holds: it is bank[done % 2] */
    _Atomic int64_t *commit;     /* CPU: this shard's record in the optstate segment (job.h) */
    int64_t reduced;             /* step whose summed gradient state.g holds (-1: none yet) */
    int in_place;                /* one replica holds the whole slice in one part: no copy to sum */
    double *hnorm;               /* the block norms on the host */
    double *norm_out;            /* where they go in the job segment (NULL: see reduce) */
    part_t *part;                /* replicas in order, each one's parts in flat order */
    int nparts;
    const cuda_plugin_t *cu;     /* GPU: the stage buffers mapped through CUDA IPC, */
    void **mapped;               /* to ipc_close */
    int nmapped;
    shm_seg_t *job, *params, *grads, *staging, *dev, *opt; /* staging: with [checkpoint] enable */
    float *final_w;              /* replica 0 of params: where the run's final fp32 weights go */
    /* the snapshot copier: a thread at idle CPU priority (see snapshot()) */
    pthread_t copier;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int copy_todo, copy_done, copier_stop;
} shard_t;

#define BE_CHECK(sh, call, ...) WORKER_CHECK((sh)->w, (call) == 0, __VA_ARGS__)
#define BE_WHY(sh) (sh)->be->last_error()

static size_t blocks(const shard_t *sh) { return (sh->n + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK; }

/* The part [*b, *e) of tensor p in this shard's slice; 0 when there is none. */
static int overlap(const shard_t *sh, const param_info_t *p, size_t *b, size_t *e)
{
    *b = p->offset > sh->begin ? p->offset : sh->begin;
    *e = p->offset + p->numel < sh->end ? p->offset + p->numel : sh->end;
    return *b < *e;
}

/* Copies this shard's slice of the training state out of the staging segment into dst[a],
 * where checkpointd loaded checkpoint.load before this process started
 * (checkpointd/restore.c): it holds the whole flat space, so any shard count, pipeline or
 * data-parallel degree takes its slice of it. */
static void load(shard_t *sh, float *const *dst)
{
    char err[256];
    shm_seg_t *seg = NULL;
    WORKER_CHECK(sh->w, shm_attach(&seg, worker_job(sh->w), STAGING_SEG, err, sizeof(err)) == 0, "%s", err);
    staging_hdr_t *h = shm_data(seg);
    WORKER_CHECK(sh->w, staging_check(h, sh->lay.total, sh->arrays, err, sizeof(err)) == 0, "%s", err);
    WORKER_CHECK(sh->w, atomic_load(&h->step) >= 0, "the staging segment holds no checkpoint of this model (%zu "
                 "parameters)", sh->lay.total);
    for (int a = 0; a < sh->arrays; a++)
        memcpy(dst[a], staging_array(h, a) + sh->begin, sh->n * sizeof(float));
    LOG_I("slice [%zu, %zu) loaded from %s (step %lld)", sh->begin, sh->end, sh->man->ckpt_load,
          (long long)atomic_load(&h->step));
    shm_detach(&seg);
}

/* Copies this shard's state into the staging segment for checkpointd. The copy runs in a
 * thread at SCHED_IDLE priority: on a machine whose CPUs the stages keep busy it takes only
 * the time they leave idle (pipeline bubbles, waits between steps) instead of slowing the
 * step that runs meanwhile. The main thread just waits for it (the next REDUCE must not start
 * before the copy is done anyway). */
static void *copier_main(void *arg)
{
    shard_t *sh = arg;
    struct sched_param none = {0};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &none))
        LOG_W("cannot lower the snapshot copier to SCHED_IDLE; it runs at normal priority");
    BE_CHECK(sh, sh->be->dev_select(sh->device, NULL), "snapshot: %s", BE_WHY(sh)); /* the device is per thread */
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (!sh->copy_todo && !sh->copier_stop)
            pthread_cond_wait(&sh->cv, &sh->mu);
        if (sh->copier_stop)
            break;
        pthread_mutex_unlock(&sh->mu);
        void *seg = shm_data(sh->staging);
        int b = (int)(sh->done % 2); /* the main thread waits: done holds still */
        for (int a = 0; a < sh->arrays; a++)
            BE_CHECK(sh, sh->be->copy(staging_array(seg, a) + sh->begin, sh->bank[b].a[a], sh->n * sizeof(float),
                                      sh->copy_stream), "snapshot: %s", BE_WHY(sh));
        BE_CHECK(sh, sh->be->stream_sync(sh->copy_stream), "snapshot: %s", BE_WHY(sh));
        pthread_mutex_lock(&sh->mu);
        sh->copy_todo = 0;
        sh->copy_done = 1;
        pthread_cond_broadcast(&sh->cv);
    }
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

static void snapshot(shard_t *sh)
{
    pthread_mutex_lock(&sh->mu);
    sh->copy_done = 0;
    sh->copy_todo = 1;
    pthread_cond_broadcast(&sh->cv);
    while (!sh->copy_done)
        pthread_cond_wait(&sh->cv, &sh->mu);
    pthread_mutex_unlock(&sh->mu);
}

/* On the CPU: each replica's slice of the shared fp32 params and grads segments. */
static void parts_from_segments(shard_t *sh)
{
    char err[256];
    WORKER_CHECK(sh->w, shm_attach(&sh->grads, worker_job(sh->w), "grads", err, sizeof(err)) == 0, "%s", err);
    float *P = shm_data(sh->params), *G = shm_data(sh->grads);
    WORKER_CHECK(sh->w, sh->part = calloc((size_t)sh->man->dp, sizeof(part_t)), "out of memory");
    for (int r = 0; r < sh->man->dp; r++) {
        size_t at = r * sh->lay.stride + sh->begin;
        sh->part[sh->nparts++] = (part_t){.w = P + at, .g = G + at, .lo = sh->begin, .hi = sh->end, .replica = r};
    }
}

/* On the GPU: the stages' device buffers that hold parts of the slice, mapped through the
 * handles in their device directory entries. With NCCL the reduce-scatter summed the
 * replicas into one stage (replica k % dp, rank k / dp): only its buffers, as replica 0. */
static void parts_from_stages(shard_t *sh)
{
    const manifest_t *m = sh->man;
    char err[512];
    WORKER_CHECK(sh->w, sh->cu = cuda_plugin_load(err, sizeof(err)), "optshard.device = \"cuda\": %s", err);
    WORKER_CHECK(sh->w, shm_attach(&sh->dev, worker_job(sh->w), DEVDIR_SEG, err, sizeof(err)) == 0, "%s", err);
    sh->part = calloc((size_t)m->dp * m->pp, sizeof(part_t));
    sh->mapped = calloc((size_t)m->dp * m->pp * 2, sizeof(void *));
    WORKER_CHECK(sh->w, sh->part && sh->mapped, "out of memory");
    for (int r = 0; r < m->dp; r++)
        for (int s = 0; s < m->pp; s++) {
            if (sh->lay.nccl && (r != sh->rank % m->dp || s != sh->rank / m->dp))
                continue;
            devdir_stage_t *e = devdir_wait(shm_data(sh->dev), &sh->lay, r, s, 120000);
            WORKER_CHECK(sh->w, e, "stage %d of replica %d never published its device buffers", s, r);
            size_t lo = e->begin > sh->begin ? e->begin : sh->begin, hi = e->end < sh->end ? e->end : sh->end;
            if (lo >= hi)
                continue;
            void *w, *g;
            WORKER_CHECK(sh->w, sh->cu->ipc_open(&w, &e->w) == 0, "weights of stage %d replica %d: %s", s, r,
                         sh->cu->last_error());
            sh->mapped[sh->nmapped++] = w;
            WORKER_CHECK(sh->w, sh->cu->ipc_open(&g, &e->g) == 0, "gradients of stage %d replica %d: %s", s, r,
                         sh->cu->last_error());
            sh->mapped[sh->nmapped++] = g;
            sh->part[sh->nparts++] = (part_t){.w = (uint16_t *)w + (lo - e->begin), .g = (float *)g + (lo - e->begin),
                                              .lo = lo, .hi = hi, .replica = sh->lay.nccl ? 0 : r};
        }
}

/* The working memory in the backend's: the summed gradient (unless in place) and the block
 * norms; GPU shards also keep the state there: the host arrays (initialised or loaded) are
 * copied in and freed, and both banks name that one copy (updated in place). */
static void move_state(shard_t *sh)
{
    const backend_t *be = sh->be;
    int gpu = sh->lay.gpu_shards, arrays = gpu ? sh->arrays : 0;
    sh->in_place = sh->nparts == 1 && sh->part[0].lo == sh->begin && sh->part[0].hi == sh->end;
    size_t n = sh->n ? sh->n : 1, nb = blocks(sh) ? blocks(sh) : 1;
    size_t fbytes = ((arrays + !sh->in_place) * n * sizeof(float) + 63) / 64 * 64;
    BE_CHECK(sh, be->alloc(&sh->state.mem, fbytes + nb * sizeof(double)), "%s memory for %zu parameters: %s",
             be->name, sh->n, BE_WHY(sh));
    float *f = sh->state.mem;
    sh->state.g = sh->in_place ? sh->part[0].g : f + arrays * n;
    sh->state.norm = (double *)((char *)sh->state.mem + fbytes);
    WORKER_CHECK(sh->w, sh->hnorm = calloc(nb, sizeof(double)), "out of memory");
    if (!gpu)
        return;
    for (int a = 0; a < sh->arrays; a++) {
        sh->bank[0].a[a] = sh->bank[1].a[a] = f + a * n;
        BE_CHECK(sh, be->copy(f + a * n, sh->host + a * sh->n, sh->n * sizeof(float), sh->stream), "upload: %s",
                 BE_WHY(sh));
    }
    BE_CHECK(sh, be->stream_sync(sh->stream), "upload: %s", BE_WHY(sh));
    free(sh->host);
    sh->host = NULL;
}

/* Every replica's weights from the master (in the backend's dtype, where the stages read
 * them), their gradients cleared. Returns once done. */
static void publish(shard_t *sh)
{
    const backend_t *be = sh->be;
    const float *master = sh->bank[sh->done % 2].a[0];
    for (int i = 0; i < sh->nparts; i++) {
        const part_t *q = &sh->part[i];
        BE_CHECK(sh, be->to_weights(q->w, master + (q->lo - sh->begin), q->hi - q->lo, sh->stream),
                 "weights: %s", BE_WHY(sh));
        BE_CHECK(sh, be->zero(q->g, (q->hi - q->lo) * sizeof(float), sh->stream), "gradients: %s", BE_WHY(sh));
    }
    BE_CHECK(sh, be->stream_sync(sh->stream), "weights: %s", BE_WHY(sh));
}

/* REMAP (GPU shards): the stages were started again (a stage was lost: DESIGN.md "Recovery").
 * The old mappings go, the new stages' buffers are mapped, and the master weights written
 * into them: the weights the stages had, bit for bit. */
static void remap(shard_t *sh)
{
    for (int i = 0; i < sh->nmapped; i++)
        sh->cu->ipc_close(sh->mapped[i]);
    free(sh->part);
    free(sh->mapped);
    sh->part = NULL;
    sh->mapped = NULL;
    sh->nparts = sh->nmapped = 0;
    parts_from_stages(sh);
    if (sh->in_place) /* the same layout: the one part is again the whole slice */
        sh->state.g = sh->part[0].g;
    publish(sh);
}

/* The state at the first step: the checkpoint's (checkpoint.load) or the initial weights
 * with the optimizer's state at zero, into dst[a]. */
static void make_state(shard_t *sh, float *const *dst)
{
    for (int a = 1; a < sh->arrays; a++)
        memset(dst[a], 0, sh->n * sizeof(float));
    if (sh->man->ckpt_load[0])
        load(sh, dst);
    else
        params_init(&sh->tab, &sh->man->model, sh->man->seed, dst[0], sh->begin, sh->end);
}

/* CPU shards: the banks in the optstate segment. Returns 1 when this process replaces a shard
 * that was killed (its record is committed): it takes the state over as the record says; else
 * it makes the state of the first step in that step's bank (committed once published). */
static int state_in_segment(shard_t *sh)
{
    char err[256];
    WORKER_CHECK(sh->w, shm_attach(&sh->opt, worker_job(sh->w), JOB_OPTSTATE_SEG, err, sizeof(err)) == 0, "%s", err);
    void *mem = shm_data(sh->opt);
    WORKER_CHECK(sh->w, job_optstate_check(mem, &sh->lay, sh->man->shards, err, sizeof(err)) == 0, "%s", err);
    for (int b = 0; b < 2; b++)
        for (int a = 0; a < sh->arrays; a++)
            sh->bank[b].a[a] = job_optstate_array(mem, b, a) + sh->begin;
    sh->commit = &job_optstate_rec(mem, sh->rank)->done;
    int64_t done = atomic_load(sh->commit);
    if (done >= 0) {
        sh->done = done;
        LOG_I("slice [%zu, %zu): taking over the state after step %lld from the optstate segment", sh->begin,
              sh->end, (long long)done);
        return 1;
    }
    sh->done = worker_first_step(sh->w);
    make_state(sh, sh->bank[sh->done % 2].a);
    return 0;
}

static void setup(shard_t *sh)
{
    const manifest_t *m = sh->man;
    char err[512];
    WORKER_CHECK(sh->w, job_layout(&sh->lay, m) == 0 && params_table_init(&sh->tab, &m->model) == 0,
                 "out of memory");
    WORKER_CHECK(sh->w, job_shard_range(&sh->lay, m, sh->rank, &sh->begin, &sh->end) == 0, "out of memory");
    sh->n = sh->end - sh->begin;
    sh->optim = sh->lay.opt;
    sh->arrays = sh->lay.arrays;
    sh->reduced = -1;
    const char *job = worker_job(sh->w);
    WORKER_CHECK(sh->w, shm_attach(&sh->job, job, "job", err, sizeof(err)) == 0, "%s", err);
    WORKER_CHECK(sh->w, shm_attach(&sh->params, job, "params", err, sizeof(err)) == 0, "%s", err);
    sh->final_w = shm_data(sh->params);
    if (job_norm_by_blocks(&sh->lay)) /* else the slices do not start at block boundaries: see reduce */
        sh->norm_out = job_norm_blocks(shm_data(sh->job)) + sh->begin / MANIFEST_BLOCK;
    int took_over = 0;
    if (sh->lay.gpu_shards) {
        float *host[OPTIM_ARRAYS_MAX];
        WORKER_CHECK(sh->w, sh->host = malloc((size_t)sh->arrays * (sh->n ? sh->n : 1) * sizeof(float)),
                     "out of memory for %zu parameters", sh->n); /* one allocation: array a at a * n */
        for (int a = 0; a < sh->arrays; a++)
            host[a] = sh->host + a * sh->n;
        sh->done = worker_first_step(sh->w);
        make_state(sh, host);
    } else {
        took_over = state_in_segment(sh);
    }

    const char *device = sh->lay.gpu_shards ? "cuda" : "cpu";
    WORKER_CHECK(sh->w, sh->be = backend_load(device, err, sizeof(err)), "optshard.device = \"%s\": %s", device, err);
    int k = sh->rank, dp = m->dp; /* NCCL: next to its stage (replica k % dp, rank k / dp) */
    BE_CHECK(sh, sh->be->dev_select(sh->lay.nccl ? job_local_ordinal(&sh->lay, k % dp, k / dp) : k, &sh->device),
             "%s", BE_WHY(sh));
    BE_CHECK(sh, sh->be->stream_new(&sh->stream), "%s", BE_WHY(sh));
    BE_CHECK(sh, sh->be->stream_new(&sh->copy_stream), "%s", BE_WHY(sh));
    if (sh->lay.gpu_shards)
        parts_from_stages(sh);
    else
        parts_from_segments(sh);
    move_state(sh);
    if (!took_over) { /* a replacement leaves the stages' weights alone: a step may be running */
        publish(sh);
        if (sh->commit)
            atomic_store(sh->commit, sh->done);
    }

    if (manifest_snapshots(m)) {
        WORKER_CHECK(sh->w, shm_attach(&sh->staging, job, STAGING_SEG, err, sizeof(err)) == 0, "%s", err);
        pthread_mutex_init(&sh->mu, NULL);
        pthread_cond_init(&sh->cv, NULL);
        WORKER_CHECK(sh->w, pthread_create(&sh->copier, NULL, copier_main, sh) == 0, "cannot start a thread");
    }
    LOG_D("slice [%zu, %zu) of %zu parameters on the %s", sh->begin, sh->end, sh->lay.total,
          sh->lay.gpu_shards ? "GPU" : "CPU");
}

/* REDUCE: the replicas' gradients summed in replica order (with NCCL the reduce-scatter did
 * that), the block norms to the job segment. Returns the slice's squared norm. When the slices
 * do not start at block boundaries (job_norm_by_blocks) the coordinator sums the shards' norms
 * instead (in shard order) and the block norms stay here. */
static double reduce(shard_t *sh, int64_t step)
{
    const backend_t *be = sh->be;
    float *sum = sh->state.g;
    for (int i = 0; i < sh->nparts && !sh->in_place; i++) {
        const part_t *q = &sh->part[i];
        float *dst = sum + (q->lo - sh->begin);
        size_t n = q->hi - q->lo;
        BE_CHECK(sh, q->replica == 0 ? be->copy(dst, q->g, n * sizeof(float), sh->stream)
                                     : be->f32_add(dst, q->g, n, sh->stream), "reduce: %s", BE_WHY(sh));
    }
    size_t nb = blocks(sh);
    BE_CHECK(sh, be->block_sumsq(sh->state.norm, sum, sh->n, MANIFEST_BLOCK, sh->stream), "norm: %s", BE_WHY(sh));
    BE_CHECK(sh, be->copy(sh->hnorm, sh->state.norm, nb * sizeof(double), sh->stream), "norm: %s", BE_WHY(sh));
    BE_CHECK(sh, be->stream_sync(sh->stream), "reduce: %s", BE_WHY(sh));
    double sq = 0;
    for (size_t b = 0; b < nb; b++)
        sq += sh->hnorm[b];
    if (sh->norm_out)
        memcpy(sh->norm_out, sh->hnorm, nb * sizeof(double));
    sh->reduced = step;
    return sq;
}

/* UPDATE of step `step` (0-based): the optimizer's step from bank step % 2 into the other, the
 * commit, then the new weights to every replica. */
static double update(shard_t *sh, int64_t step, double scale)
{
    const manifest_t *m = sh->man;
    const backend_t *be = sh->be;
    double lr = m->lr * lr_factor(&m->lr_sched, (int)step);
    if (sh->commit && atomic_load(sh->commit) == step + 1) { /* committed by the shard this one replaces */
        sh->done = step + 1;
        publish(sh);
        return lr;
    }
    /* (a GPU shard's count is only the config's step, which another host's process may have had
     * before the coordinator resumed: its state is one copy, updated in place, so no bank to pick) */
    WORKER_CHECK(sh->w, !sh->commit || sh->done == step, "UPDATE of step %lld, but the state is that after step %lld",
                 (long long)step + 1, (long long)sh->done);
    if (sh->reduced != step) /* a replacement: the gradients stay whole until the commit */
        reduce(sh, step);
    const float *g = sh->state.g; /* only read: clipped inside the step, whole for a replacement */
    int from = (int)(step % 2), to = 1 - from;
    optim_args_t args = {.lr = (float)lr, .beta1 = (float)m->beta1, .beta2 = (float)m->beta2, .eps = (float)m->eps,
                         .gscale = (float)scale, .step = (int)step + 1};
    for (int t = 0; t < sh->tab.n; t++) {
        const param_info_t *p = &sh->tab.t[t];
        size_t b, e;
        if (!overlap(sh, p, &b, &e))
            continue;
        int decay = m->decay_embed_and_norms || params_is_decayed(p->kind);
        size_t o = b - sh->begin;
        float *dst[OPTIM_ARRAYS_MAX];
        const float *src[OPTIM_ARRAYS_MAX];
        for (int a = 0; a < sh->arrays; a++)
            dst[a] = sh->bank[to].a[a] + o, src[a] = sh->bank[from].a[a] + o;
        args.weight_decay = decay ? (float)m->weight_decay : 0.0f;
        BE_CHECK(sh, sh->optim->step(be, dst, src, g + o, e - b, &args, sh->stream), "%s: %s", sh->optim->name,
                 BE_WHY(sh));
        worker_test_point(sh->w, "adamw", step);
    }
    BE_CHECK(sh, be->stream_sync(sh->stream), "%s: %s", sh->optim->name, BE_WHY(sh));
    sh->done = step + 1;
    if (sh->commit)
        atomic_store(sh->commit, sh->done);
    worker_test_point(sh->w, "committed", step);
    publish(sh);
    return lr;
}

/* At the end of the run: the fp32 master into replica 0 of the params segment, where the
 * coordinator's evaluation and sampling read the final weights (on the CPU they are there
 * already, bit for bit), then the backend's memory and mappings given back. */
static void finish(shard_t *sh)
{
    const backend_t *be = sh->be;
    BE_CHECK(sh, be->copy(sh->final_w + sh->begin, sh->bank[sh->done % 2].a[0], sh->n * sizeof(float),
                          sh->stream), "%s", BE_WHY(sh));
    BE_CHECK(sh, be->stream_sync(sh->stream), "final weights: %s", BE_WHY(sh));
    for (int i = 0; i < sh->nmapped; i++)
        sh->cu->ipc_close(sh->mapped[i]);
    be->free(sh->state.mem);
    be->stream_free(sh->stream);
    be->stream_free(sh->copy_stream);
    free(sh->part);
    free(sh->mapped);
    free(sh->hnorm);
}

int main(int argc, char **argv)
{
    shard_t sh = {.rank = -1};
    for (int i = 1; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--rank"))
            sh.rank = atoi(argv[i + 1]);
    if (sh.rank < 0) {
        fprintf(stderr, "usage: ctitan-optshard --rank K (started by `ctitan launch`)\n");
        return 2;
    }
    char err[512];
    if (worker_open(&sh.w, "optshard", sh.rank, 0, err, sizeof(err))) {
        fprintf(stderr, "ctitan-optshard: %s\n", err);
        return 1;
    }
    sh.man = worker_manifest(sh.w);
    WORKER_CHECK(sh.w, sh.rank < sh.man->shards, "shard %d of %d does not exist", sh.rank, sh.man->shards);
    worker_test_point(sh.w, "setup", worker_first_step(sh.w));
    setup(&sh);
    WORKER_CHECK(sh.w, worker_ready(sh.w) == 0, "cannot reach the coordinator");
    for (;;) {
        msg_t m;
        worker_command(sh.w, &m);
        msg_t reply = {.step = m.step};
        double t0 = util_now();
        if (m.type == MSG_STOP) {
            msg_clear(&m);
            break;
        } else if (m.type == MSG_REDUCE) {
            worker_test_point(sh.w, "reduce", m.step);
            reply.grad_norm = reduce(&sh, m.step);
            reply.type = MSG_REDUCED;
        } else if (m.type == MSG_SNAPSHOT) {
            WORKER_CHECK(sh.w, sh.staging, "snapshot without a staging segment (checkpoint.enable is false, and "
                         "no snapshot_interval)");
            WORKER_CHECK(sh.w, !sh.commit || sh.done == m.step,
                         "SNAPSHOT of step %lld, but the state is that after step %lld", (long long)m.step,
                         (long long)sh.done);
            worker_test_point(sh.w, "snapshot", m.step - 1);
            snapshot(&sh);
            reply.type = MSG_SNAPPED;
        } else if (m.type == MSG_REMAP) {
            WORKER_CHECK(sh.w, sh.lay.gpu_shards, "REMAP to a shard on the CPU (its weights are the params segment)");
            worker_test_point(sh.w, "remap", m.step);
            remap(&sh);
            reply.type = MSG_REMAPPED;
        } else if (m.type == MSG_UPDATE) {
            reply.lr = update(&sh, m.step, m.scale);
            worker_test_point(sh.w, "updated", m.step);
            reply.type = MSG_UPDATED;
        }
        msg_clear(&m);
        if (reply.type) {
            reply.t_busy = util_now() - t0;
            worker_progress(sh.w);
            WORKER_CHECK(sh.w, worker_send(sh.w, &reply) == 0, "cannot reach the coordinator");
        }
    }
    if (sh.staging) {
        pthread_mutex_lock(&sh.mu);
        sh.copier_stop = 1;
        pthread_cond_broadcast(&sh.cv);
        pthread_mutex_unlock(&sh.mu);
        pthread_join(sh.copier, NULL);
    }
    finish(&sh);
    free(sh.host);
    params_table_free(&sh.tab);
    shm_detach(&sh.job);
    shm_detach(&sh.params);
    shm_detach(&sh.grads);
    shm_detach(&sh.staging);
    shm_detach(&sh.dev);
    shm_detach(&sh.opt);
    worker_close(&sh.w);
    return 0;
}
