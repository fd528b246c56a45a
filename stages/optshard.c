/* ctitan-optshard: optimizer shard `--rank` of K. Owns one contiguous slice of the flat
 * parameter space: fp32 master weights and AdamW moments. Each step, on REDUCE it sums its
 * slice of every replica's gradients (replica order fixed) and writes the squared norm of
 * each MANIFEST_BLOCK block into the job segment; on UPDATE (with the global clip factor the
 * coordinator computed from all blocks) it applies AdamW at the step's lr and writes the new
 * weights into every replica's parameters, then clears those gradients. Block boundaries do
 * not depend on K, so any shard count gives the same bits.
 *
 * Where: [optshard] device = "cpu" keeps the state in this process's memory and works on the
 * fp32 params/grads segments (the CPU backend, and offload mode for GPU stages). "cuda" keeps
 * master weights, moments and the summed gradient on the GPU and works directly on the
 * stages' device buffers, mapped through the CUDA IPC handles they publish (stages/devdir.h):
 * the same steps with kernels (cuda_dev.h), the new weights written as bf16 in place. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stages/staging.h"
#include "ipc/shm.h"
#include "kernels/lr.h"
#include "kernels/ops.h"
#include "kernels/params.h"
#include "stages/cuda_plugin.h"
#include "stages/devdir.h"
#include "stages/job.h"
#include "stages/worker.h"
#include "ipc/log.h"
#include "ipc/util.h"

/* The part [lo, hi) of a GPU shard's slice that one stage replica holds, in that stage's
 * device buffers (mapped). */
typedef struct {
    uint16_t *w;                 /* bf16 weights of [lo, hi) */
    float *g;                    /* fp32 gradients of [lo, hi) */
    size_t lo, hi;
    int replica;
} gseg_t;

/* A shard on the GPU ([optshard] device = "cuda"). */
typedef struct {
    const cuda_plugin_t *cu;
    int device;
    void *stream, *copy_stream;  /* updates; snapshots (the copier thread) */
    float *state;                /* device: master, m1, m2, g, (n) each, one allocation */
    float *master, *m1, *m2, *g;
    double *norm;                /* device: (blocks of the slice) */
    double *hnorm;               /* the same on the host */
    gseg_t *seg;                 /* replicas in order, each rank's part in flat order */
    int nseg;
    void **mapped;               /* stage buffers to ipc_close */
    int nmapped;
    shm_seg_t *dev;
} gpu_t;

typedef struct {
    worker_t *w;
    const manifest_t *man;
    job_layout_t lay;
    param_table_t tab;
    int rank;
    size_t begin, end, n;        /* slice [begin, end) of the flat space */
    float *master;               /* (n) fp32 master weights */
    float *m1, *m2;              /* (n) AdamW moments */
    float *g;                    /* (n) summed gradient: own memory, or with one replica its
                                  * slice of the shared buffer (cleared after the update anyway) */
    shm_seg_t *job, *params, *grads, *staging; /* staging: with [checkpoint] enable */
    float *P, *G;                /* replica 0 of params / grads; replica r is stride floats on */
    double *norm;                /* the job's per-block squared norms */
    /* the snapshot copier: a thread at idle CPU priority (see snapshot()) */
    pthread_t copier;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int copy_todo, copy_done, copier_stop;
    gpu_t *gpu;                  /* [optshard] device = "cuda"; then master/m1/m2 are NULL after set-up */
} shard_t;

#define CU_CHECK(sh, call, ...) WORKER_CHECK((sh)->w, (call) == 0, __VA_ARGS__)
#define CU_WHY(sh) (sh)->gpu->cu->last_error()

/* The part [*b, *e) of tensor p in this shard's slice; 0 when there is none. */
static int overlap(const shard_t *sh, const param_info_t *p, size_t *b, size_t *e)
{
    *b = p->offset > sh->begin ? p->offset : sh->begin;
    *e = p->offset + p->numel < sh->end ? p->offset + p->numel : sh->end;
    return *b < *e;
}

/* Copies this shard's slice of the master weights and moments out of the staging segment,
 * where checkpointd loaded checkpoint.load before this process started (checkpointd/restore.c):
 * it holds the whole flat space, so any shard count, pipeline or data-parallel degree takes
 * its slice of it. */
static void load(shard_t *sh)
{
    char err[256];
    shm_seg_t *seg = NULL;
    WORKER_CHECK(sh->w, shm_attach(&seg, worker_job(sh->w), STAGING_SEG, err, sizeof(err)) == 0, "%s", err);
    staging_hdr_t *h = shm_data(seg);
    WORKER_CHECK(sh->w, h->magic == STAGING_MAGIC && h->version == STAGING_VERSION && h->total == sh->lay.total &&
                 atomic_load(&h->step) >= 0, "the staging segment holds no checkpoint of this model (%zu parameters)",
                 sh->lay.total);
    float *dst[STAGING_ARRAYS] = {sh->master, sh->m1, sh->m2};
    for (int a = 0; a < STAGING_ARRAYS; a++)
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
    if (sh->gpu) /* the device is per thread */
        CU_CHECK(sh, sh->gpu->cu->dev_select(sh->gpu->device, NULL), "snapshot: %s", CU_WHY(sh));
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (!sh->copy_todo && !sh->copier_stop)
            pthread_cond_wait(&sh->cv, &sh->mu);
        if (sh->copier_stop)
            break;
        pthread_mutex_unlock(&sh->mu);
        void *seg = shm_data(sh->staging);
        size_t n = sh->n * sizeof(float);
        gpu_t *G = sh->gpu;
        const float *src[3] = {G ? G->master : sh->master, G ? G->m1 : sh->m1, G ? G->m2 : sh->m2};
        for (int a = 0; a < 3; a++)
            if (G)
                CU_CHECK(sh, G->cu->copy_async(staging_array(seg, a) + sh->begin, src[a], n, G->copy_stream),
                         "snapshot: %s", CU_WHY(sh));
            else
                memcpy(staging_array(seg, a) + sh->begin, src[a], n);
        if (G)
            CU_CHECK(sh, G->cu->stream_sync(G->copy_stream), "snapshot: %s", CU_WHY(sh));
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

/* The GPU shard: its state on the device, the stages' buffers mapped, every replica's
 * weights written. The host arrays (initialised or loaded) are uploaded and freed. */
static void setup_gpu(shard_t *sh)
{
    const manifest_t *m = sh->man;
    char err[512];
    gpu_t *G = sh->gpu = calloc(1, sizeof(*G));
    WORKER_CHECK(sh->w, G, "out of memory");
    WORKER_CHECK(sh->w, G->cu = cuda_plugin_load(err, sizeof(err)), "optshard.device = \"cuda\": %s", err);
    int k = sh->rank, dp = m->dp; /* NCCL: next to its stage (replica k % dp, rank k / dp) */
    CU_CHECK(sh, G->cu->dev_select(sh->lay.nccl ? job_local_ordinal(&sh->lay, k % dp, k / dp) : k, &G->device), "%s",
             CU_WHY(sh));
    CU_CHECK(sh, G->cu->stream_new(&G->stream), "%s", CU_WHY(sh));
    CU_CHECK(sh, G->cu->stream_new(&G->copy_stream), "%s", CU_WHY(sh));
    size_t n = sh->n ? sh->n : 1, nb = (sh->n + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK;
    CU_CHECK(sh, G->cu->alloc((void **)&G->state, 4 * n * sizeof(float) + (nb ? nb : 1) * sizeof(double)),
             "device memory for %zu parameters: %s", sh->n, CU_WHY(sh));
    G->master = G->state, G->m1 = G->state + n, G->m2 = G->state + 2 * n, G->g = G->state + 3 * n;
    G->norm = (double *)(G->state + 4 * n);
    WORKER_CHECK(sh->w, G->hnorm = calloc(nb ? nb : 1, sizeof(double)), "out of memory");
    const float *host[3] = {sh->master, sh->m1, sh->m2};
    float *dev[3] = {G->master, G->m1, G->m2};
    for (int a = 0; a < 3; a++)
        CU_CHECK(sh, G->cu->copy_async(dev[a], host[a], sh->n * sizeof(float), G->stream), "upload: %s", CU_WHY(sh));
    CU_CHECK(sh, G->cu->stream_sync(G->stream), "upload: %s", CU_WHY(sh));
    free(sh->master);
    sh->master = sh->m1 = sh->m2 = sh->g = NULL;

    WORKER_CHECK(sh->w, shm_attach(&G->dev, worker_job(sh->w), DEVDIR_SEG, err, sizeof(err)) == 0, "%s", err);
    G->seg = calloc((size_t)m->dp * m->pp, sizeof(gseg_t));
    G->mapped = calloc((size_t)m->dp * m->pp * 2, sizeof(void *));
    WORKER_CHECK(sh->w, G->seg && G->mapped, "out of memory");
    for (int r = 0; r < m->dp; r++)
        for (int s = 0; s < m->pp; s++) {
            if (sh->lay.nccl && (r != sh->rank % m->dp || s != sh->rank / m->dp)) /* the reduce-scatter summed */
                continue;                                                       /* the replicas into its stage */
            devdir_stage_t *e = devdir_wait(shm_data(G->dev), &sh->lay, r, s, 120000);
            WORKER_CHECK(sh->w, e, "stage %d of replica %d never published its device buffers", s, r);
            size_t lo = e->begin > sh->begin ? e->begin : sh->begin, hi = e->end < sh->end ? e->end : sh->end;
            if (lo >= hi)
                continue;
            void *w, *g;
            CU_CHECK(sh, G->cu->ipc_open(&w, &e->w), "weights of stage %d replica %d: %s", s, r, CU_WHY(sh));
            G->mapped[G->nmapped++] = w;
            CU_CHECK(sh, G->cu->ipc_open(&g, &e->g), "gradients of stage %d replica %d: %s", s, r, CU_WHY(sh));
            G->mapped[G->nmapped++] = g;
            G->seg[G->nseg++] = (gseg_t){.w = (uint16_t *)w + (lo - e->begin), .g = (float *)g + (lo - e->begin),
                                         .lo = lo, .hi = hi, .replica = sh->lay.nccl ? 0 : r};
        }
}

/* Every replica's weights from the GPU master (bf16, in the stages' buffers); gradients
 * cleared. Returns once done. */
static void publish_gpu(shard_t *sh)
{
    gpu_t *G = sh->gpu;
    for (int i = 0; i < G->nseg; i++) {
        gseg_t *q = &G->seg[i];
        CU_CHECK(sh, G->cu->f32_to_bf16(q->w, G->master + (q->lo - sh->begin), q->hi - q->lo, G->stream),
                 "weights: %s", CU_WHY(sh));
        CU_CHECK(sh, G->cu->zero_async(q->g, (q->hi - q->lo) * sizeof(float), G->stream), "gradients: %s",
                 CU_WHY(sh));
    }
    CU_CHECK(sh, G->cu->stream_sync(G->stream), "weights: %s", CU_WHY(sh));
}

static void setup(shard_t *sh)
{
    const manifest_t *m = sh->man;
    char err[256];
    WORKER_CHECK(sh->w, job_layout(&sh->lay, m) == 0 && params_table_init(&sh->tab, &m->model) == 0,
                 "out of memory");
    WORKER_CHECK(sh->w, job_shard_range(&sh->lay, m, sh->rank, &sh->begin, &sh->end) == 0, "out of memory");
    sh->n = sh->end - sh->begin;
    size_t bytes = (sh->n ? sh->n : 1) * sizeof(float);
    int gpu = sh->lay.gpu_shards, own_g = !gpu && m->dp > 1;
    float *all = malloc((3 + own_g) * bytes); /* one allocation: master, m1, m2 (and g) */
    WORKER_CHECK(sh->w, all, "out of memory for %zu parameters", sh->n);
    sh->master = all;
    sh->m1 = (float *)((char *)all + bytes);
    sh->m2 = (float *)((char *)all + 2 * bytes);
    memset(sh->m1, 0, 2 * bytes);
    const char *job = worker_job(sh->w);
    WORKER_CHECK(sh->w, shm_attach(&sh->job, job, "job", err, sizeof(err)) == 0, "%s", err);
    WORKER_CHECK(sh->w, shm_attach(&sh->params, job, "params", err, sizeof(err)) == 0, "%s", err);
    sh->P = shm_data(sh->params);
    if (!gpu) {
        WORKER_CHECK(sh->w, shm_attach(&sh->grads, job, "grads", err, sizeof(err)) == 0, "%s", err);
        sh->G = shm_data(sh->grads);
        sh->g = own_g ? (float *)((char *)all + 3 * bytes) : sh->G + sh->begin;
    }
    sh->norm = job_norm_blocks(shm_data(sh->job));
    if (m->ckpt_load[0])
        load(sh);
    else
        params_init(&sh->tab, &m->model, m->seed, sh->master, sh->begin, sh->end);
    if (gpu) {
        setup_gpu(sh);
        publish_gpu(sh);
    } else {
        for (int r = 0; r < m->dp; r++)
            memcpy(sh->P + r * sh->lay.stride + sh->begin, sh->master, sh->n * sizeof(float));
    }
    if (m->ckpt_enable) {
        WORKER_CHECK(sh->w, shm_attach(&sh->staging, job, STAGING_SEG, err, sizeof(err)) == 0, "%s", err);
        pthread_mutex_init(&sh->mu, NULL);
        pthread_cond_init(&sh->cv, NULL);
        WORKER_CHECK(sh->w, pthread_create(&sh->copier, NULL, copier_main, sh) == 0, "cannot start a thread");
    }
    LOG_D("slice [%zu, %zu) of %zu parameters on the %s", sh->begin, sh->end, sh->lay.total, gpu ? "GPU" : "CPU");
}

/* REDUCE on the GPU: the replicas' gradients summed in replica order (with NCCL the
 * reduce-scatter did that), the block norms to the job segment; returns the slice's squared
 * norm. */
static double reduce_gpu(shard_t *sh)
{
    gpu_t *G = sh->gpu;
    for (int i = 0; i < G->nseg; i++) {
        gseg_t *q = &G->seg[i];
        float *dst = G->g + (q->lo - sh->begin);
        if (q->replica == 0)
            CU_CHECK(sh, G->cu->copy_async(dst, q->g, (q->hi - q->lo) * sizeof(float), G->stream), "reduce: %s",
                     CU_WHY(sh));
        else
            CU_CHECK(sh, G->cu->f32_add(dst, q->g, q->hi - q->lo, G->stream), "reduce: %s", CU_WHY(sh));
    }
    size_t nb = (sh->n + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK;
    CU_CHECK(sh, G->cu->block_sumsq(G->norm, G->g, sh->n, MANIFEST_BLOCK, G->stream), "norm: %s", CU_WHY(sh));
    CU_CHECK(sh, G->cu->copy_async(G->hnorm, G->norm, nb * sizeof(double), G->stream), "norm: %s", CU_WHY(sh));
    CU_CHECK(sh, G->cu->stream_sync(G->stream), "reduce: %s", CU_WHY(sh));
    double sq = 0;
    for (size_t b = 0; b < nb; b++)
        sq += G->hnorm[b];
    if (!sh->lay.nccl) /* NCCL slices do not start at block boundaries: the coordinator sums sq */
        memcpy(sh->norm + sh->begin / MANIFEST_BLOCK, G->hnorm, nb * sizeof(double));
    return sq;
}

/* Returns the squared norm of the slice's summed gradient. */
static double reduce(shard_t *sh)
{
    if (sh->gpu)
        return reduce_gpu(sh);
    const float *g0 = sh->G + sh->begin;
    if (sh->g != g0) { /* replicas summed in their order: a fixed sum */
        memcpy(sh->g, g0, sh->n * sizeof(float));
        for (int r = 1; r < sh->man->dp; r++) {
            const float *gr = g0 + r * sh->lay.stride;
            for (size_t i = 0; i < sh->n; i++)
                sh->g[i] += gr[i];
        }
    }
    double total = 0;
    for (size_t b = sh->begin; b < sh->end; b += MANIFEST_BLOCK) {
        size_t e = b + MANIFEST_BLOCK < sh->end ? b + MANIFEST_BLOCK : sh->end;
        double sq = 0;
        for (size_t i = b; i < e; i++)
            sq += (double)sh->g[i - sh->begin] * sh->g[i - sh->begin];
        sh->norm[b / MANIFEST_BLOCK] = sq;
        total += sq;
    }
    return total;
}

static double update(shard_t *sh, int64_t step, double scale)
{
    const manifest_t *m = sh->man;
    gpu_t *G = sh->gpu;
    if (scale != 1.0) {
        if (G)
            CU_CHECK(sh, G->cu->f32_scale(G->g, (float)scale, sh->n, G->stream), "clip: %s", CU_WHY(sh));
        else
            for (size_t i = 0; i < sh->n; i++)
                sh->g[i] *= (float)scale;
    }
    double lr = m->lr * lr_factor(&m->lr_sched, (int)step);
    float *master = G ? G->master : sh->master, *g = G ? G->g : sh->g, *m1 = G ? G->m1 : sh->m1,
          *m2 = G ? G->m2 : sh->m2;
    for (int t = 0; t < sh->tab.n; t++) {
        const param_info_t *p = &sh->tab.t[t];
        size_t b, e;
        if (!overlap(sh, p, &b, &e))
            continue;
        int decay = m->decay_embed_and_norms || params_is_decayed(p->kind);
        size_t o = b - sh->begin;
        float wd = decay ? (float)m->weight_decay : 0.0f;
        if (G)
            CU_CHECK(sh, G->cu->adamw(master + o, g + o, m1 + o, m2 + o, e - b, (float)lr, (float)m->beta1,
                                      (float)m->beta2, (float)m->eps, wd, (int)step + 1, G->stream),
                     "AdamW: %s", CU_WHY(sh));
        else
            ops_adamw(NULL, master + o, g + o, m1 + o, m2 + o, e - b, (float)lr, (float)m->beta1, (float)m->beta2,
                      (float)m->eps, wd, (int)step + 1);
    }
    if (G) {
        publish_gpu(sh);
        return lr;
    }
    for (int r = 0; r < m->dp; r++) {
        memcpy(sh->P + r * sh->lay.stride + sh->begin, sh->master, sh->n * sizeof(float));
        memset(sh->G + r * sh->lay.stride + sh->begin, 0, sh->n * sizeof(float));
    }
    return lr;
}

/* At the end of a GPU run: the fp32 master into replica 0 of the params segment, where the
 * coordinator's evaluation and sampling read the final weights. */
static void finish_gpu(shard_t *sh)
{
    gpu_t *G = sh->gpu;
    CU_CHECK(sh, G->cu->copy_async(sh->P + sh->begin, G->master, sh->n * sizeof(float), G->stream), "%s",
             CU_WHY(sh));
    CU_CHECK(sh, G->cu->stream_sync(G->stream), "final weights: %s", CU_WHY(sh));
    for (int i = 0; i < G->nmapped; i++)
        G->cu->ipc_close(G->mapped[i]);
    G->cu->free(G->state);
    G->cu->stream_free(G->stream);
    G->cu->stream_free(G->copy_stream);
    free(G->seg);
    free(G->mapped);
    free(G->hnorm);
    shm_detach(&G->dev);
    free(G);
    sh->gpu = NULL;
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
            reply.grad_norm = reduce(&sh);
            reply.type = MSG_REDUCED;
        } else if (m.type == MSG_SNAPSHOT) {
            WORKER_CHECK(sh.w, sh.staging, "snapshot without a staging segment (checkpoint.enable is false)");
            snapshot(&sh);
            reply.type = MSG_SNAPPED;
        } else if (m.type == MSG_UPDATE) {
            reply.lr = update(&sh, m.step, m.scale);
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
    if (sh.gpu)
        finish_gpu(&sh);
    free(sh.master);
    params_table_free(&sh.tab);
    shm_detach(&sh.job);
    shm_detach(&sh.params);
    shm_detach(&sh.grads);
    shm_detach(&sh.staging);
    worker_close(&sh.w);
    return 0;
}
