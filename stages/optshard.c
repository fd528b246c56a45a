/* ctitan-optshard: optimizer shard `--rank` of K. Owns one contiguous slice of the flat
 * parameter space: fp32 master weights and AdamW moments. Each step, on REDUCE it sums its
 * slice of every replica's gradients (replica order fixed) and writes the squared norm of
 * each MANIFEST_BLOCK block into the job segment; on UPDATE (with the global clip factor the
 * coordinator computed from all blocks) it applies AdamW at the step's lr and writes the new
 * weights into every replica's parameters, then clears those gradients. Block boundaries do
 * not depend on K, so any shard count gives the same bits. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/staging.h"
#include "ipc/shm.h"
#include "kernels/lr.h"
#include "kernels/ops.h"
#include "kernels/params.h"
#include "stages/job.h"
#include "stages/worker.h"
#include "tools/log.h"
#include "tools/util.h"

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
} shard_t;

/* The part [*b, *e) of tensor p in this shard's slice; 0 when there is none. */
static int overlap(const shard_t *sh, const param_info_t *p, size_t *b, size_t *e)
{
    *b = p->offset > sh->begin ? p->offset : sh->begin;
    *e = p->offset + p->numel < sh->end ? p->offset + p->numel : sh->end;
    return *b < *e;
}

/* Reads this shard's slice of the master weights and moments from checkpoint.load (the
 * coordinator resolved it to a directory that verified): any shard count, pipeline or
 * data-parallel degree reads the same flat space by tensor name. */
static void load(shard_t *sh)
{
    const char *path = sh->man->ckpt_load;
    char err[1024], mname[CKPT_NAME_MAX + 32];
    ckpt_t *ck;
    WORKER_CHECK(sh->w, ckpt_open(&ck, path, err, sizeof(err)) == 0, "%s", err);
    for (int t = 0; t < sh->tab.n; t++) {
        const param_info_t *p = &sh->tab.t[t];
        size_t b, e;
        if (!overlap(sh, p, &b, &e))
            continue;
        char names[3][CKPT_NAME_MAX + 32];
        snprintf(names[0], sizeof(names[0]), "%s", ckpt_master_name(ck, p->name, mname, sizeof(mname)));
        snprintf(names[1], sizeof(names[1]), "optimizer.exp_avg.%s", p->name);
        snprintf(names[2], sizeof(names[2]), "optimizer.exp_avg_sq.%s", p->name);
        float *dst[3] = {sh->master, sh->m1, sh->m2};
        for (int a = 0; a < 3; a++) {
            const char *name = names[a];
            const ckpt_tensor_t *ct = ckpt_index_find(ckpt_index(ck), name);
            WORKER_CHECK(sh->w, ct, "checkpoint %s has no tensor %s", path, name);
            WORKER_CHECK(sh->w, !strcmp(ct->dtype, "F32") && ct->numel == p->numel,
                         "checkpoint %s: tensor %s is %s with %llu elements; the model needs F32 with %zu", path,
                         name, ct->dtype, (unsigned long long)ct->numel, p->numel);
            WORKER_CHECK(sh->w, ckpt_read(ck, name, b - p->offset, e - b, dst[a] + (b - sh->begin), err,
                                          sizeof(err)) == 0, "%s", err);
        }
    }
    ckpt_close(&ck);
    LOG_I("slice [%zu, %zu) loaded from %s", sh->begin, sh->end, path);
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
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (!sh->copy_todo && !sh->copier_stop)
            pthread_cond_wait(&sh->cv, &sh->mu);
        if (sh->copier_stop)
            break;
        pthread_mutex_unlock(&sh->mu);
        void *seg = shm_data(sh->staging);
        size_t n = sh->n * sizeof(float);
        memcpy(staging_array(seg, 0) + sh->begin, sh->master, n);
        memcpy(staging_array(seg, 1) + sh->begin, sh->m1, n);
        memcpy(staging_array(seg, 2) + sh->begin, sh->m2, n);
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

static void setup(shard_t *sh)
{
    const manifest_t *m = sh->man;
    char err[256];
    WORKER_CHECK(sh->w, job_layout(&sh->lay, m) == 0 && params_table_init(&sh->tab, &m->model) == 0,
                 "out of memory");
    manifest_shard_range(sh->lay.total, m->shards, sh->rank, &sh->begin, &sh->end);
    sh->n = sh->end - sh->begin;
    size_t bytes = (sh->n ? sh->n : 1) * sizeof(float);
    int own_g = m->dp > 1;
    float *all = malloc((3 + own_g) * bytes); /* one allocation: master, m1, m2 (and g) */
    WORKER_CHECK(sh->w, all, "out of memory for %zu parameters", sh->n);
    sh->master = all;
    sh->m1 = (float *)((char *)all + bytes);
    sh->m2 = (float *)((char *)all + 2 * bytes);
    memset(sh->m1, 0, 2 * bytes);
    const char *job = worker_job(sh->w);
    WORKER_CHECK(sh->w, shm_attach(&sh->job, job, "job", err, sizeof(err)) == 0, "%s", err);
    WORKER_CHECK(sh->w, shm_attach(&sh->params, job, "params", err, sizeof(err)) == 0, "%s", err);
    WORKER_CHECK(sh->w, shm_attach(&sh->grads, job, "grads", err, sizeof(err)) == 0, "%s", err);
    sh->P = shm_data(sh->params);
    sh->G = shm_data(sh->grads);
    sh->norm = job_norm_blocks(shm_data(sh->job));
    sh->g = own_g ? (float *)((char *)all + 3 * bytes) : sh->G + sh->begin;
    if (m->ckpt_load[0])
        load(sh);
    else
        params_init(&sh->tab, &m->model, m->seed, sh->master, sh->begin, sh->end);
    if (m->ckpt_enable) {
        WORKER_CHECK(sh->w, shm_attach(&sh->staging, job, STAGING_SEG, err, sizeof(err)) == 0, "%s", err);
        pthread_mutex_init(&sh->mu, NULL);
        pthread_cond_init(&sh->cv, NULL);
        WORKER_CHECK(sh->w, pthread_create(&sh->copier, NULL, copier_main, sh) == 0, "cannot start a thread");
    }
    for (int r = 0; r < m->dp; r++)
        memcpy(sh->P + r * sh->lay.stride + sh->begin, sh->master, sh->n * sizeof(float));
    LOG_D("slice [%zu, %zu) of %zu parameters", sh->begin, sh->end, sh->lay.total);
}

static void reduce(shard_t *sh)
{
    const float *g0 = sh->G + sh->begin;
    if (sh->g != g0) { /* replicas summed in their order: a fixed sum */
        memcpy(sh->g, g0, sh->n * sizeof(float));
        for (int r = 1; r < sh->man->dp; r++) {
            const float *gr = g0 + r * sh->lay.stride;
            for (size_t i = 0; i < sh->n; i++)
                sh->g[i] += gr[i];
        }
    }
    for (size_t b = sh->begin; b < sh->end; b += MANIFEST_BLOCK) {
        size_t e = b + MANIFEST_BLOCK < sh->end ? b + MANIFEST_BLOCK : sh->end;
        double sq = 0;
        for (size_t i = b; i < e; i++)
            sq += (double)sh->g[i - sh->begin] * sh->g[i - sh->begin];
        sh->norm[b / MANIFEST_BLOCK] = sq;
    }
}

static double update(shard_t *sh, int64_t step, double scale)
{
    const manifest_t *m = sh->man;
    if (scale != 1.0)
        for (size_t i = 0; i < sh->n; i++)
            sh->g[i] *= (float)scale;
    double lr = m->lr * lr_factor(&m->lr_sched, (int)step);
    for (int t = 0; t < sh->tab.n; t++) {
        const param_info_t *p = &sh->tab.t[t];
        size_t b, e;
        if (!overlap(sh, p, &b, &e))
            continue;
        int decay = m->decay_embed_and_norms || params_is_decayed(p->kind);
        size_t o = b - sh->begin;
        ops_adamw(NULL, sh->master + o, sh->g + o, sh->m1 + o, sh->m2 + o, e - b, (float)lr,
                  (float)m->beta1, (float)m->beta2, (float)m->eps, decay ? (float)m->weight_decay : 0.0f,
                  (int)step + 1);
    }
    for (int r = 0; r < m->dp; r++) {
        memcpy(sh->P + r * sh->lay.stride + sh->begin, sh->master, sh->n * sizeof(float));
        memset(sh->G + r * sh->lay.stride + sh->begin, 0, sh->n * sizeof(float));
    }
    return lr;
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
            reduce(&sh);
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
    free(sh.master);
    params_table_free(&sh.tab);
    shm_detach(&sh.job);
    shm_detach(&sh.params);
    shm_detach(&sh.grads);
    shm_detach(&sh.staging);
    worker_close(&sh.w);
    return 0;
}
