/* GPU optimizer shards' clip factor made on the device (devnorm.h): the shard's block norms in
 * shared device memory, the others' mapped, one sum each. */
#include "stages/runtime/devnorm.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc/shm.h"
#include "ipc/util.h"
#include "kernels/cuda_plugin.h"
#include "kernels/norm_order.h"
#include "stages/job/devdir.h"
#include "stages/job/manifest.h"

struct devnorm {
    job_layout_t lay;
    int k;
    const backend_t *be;
    const cuda_plugin_t *cu;
    void *stream;
    shm_seg_t *dev;
    devdir_shard_t *entry;
    size_t nb;                   /* blocks of the slice */
    double *norms;               /* (2, nb) IPC memory: the block norms of even steps, then odd ones */
    void *normed;                /* recorded once a step's block norms are in */
    void *sq_ev;                 /* recorded once the sum's read back is queued */
    struct {                     /* in the backend's memory, one allocation (mem) */
        void *mem;
        const double **runs[2];  /* (shards) each shard's block norms of even and odd steps */
        size_t *lens;            /* (shards) their counts */
        double *lanes;           /* (NORM_LANES) the sum's running sums */
        double *sq;              /* the sum */
        float *scale;            /* its clip factor */
    } dev_mem;
    double *host_sq;             /* pinned where it can be: the sum read back */
    int host_sq_pinned;
    int opened;                  /* the others' parts mapped (at the first step) */
    void **peer_mem, **peer_ev;  /* (shards) the others' mapped memory and events (NULL at k) */
    char err[512];
};

/* Says why in d->err and returns rc. */
#define fail(d, rc, ...) util_fail((d)->err, sizeof((d)->err), rc, __VA_ARGS__)

const char *devnorm_error(const devnorm_t *d) { return d->err; }

int devnorm_new(devnorm_t **out, const job_layout_t *l, const char *job, int k, size_t begin, size_t end,
                const backend_t *be, void *stream, char *err, size_t errlen)
{
    *out = NULL;
    devnorm_t *d = calloc(1, sizeof(*d));
    if (!d)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    d->lay = *l, d->k = k, d->be = be, d->stream = stream;
    d->nb = (end - begin + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK;
    char why[512];
    int rc = 0, S = l->shards;
    cuda_ipc_mem_t h;
    if (begin % MANIFEST_BLOCK)
        rc = fail(d, -EINVAL, "slice [%zu, %zu) does not start at a block of %d", begin, end, MANIFEST_BLOCK);
    else if (!(d->cu = cuda_plugin_load(why, sizeof(why))))
        rc = fail(d, -ENODEV, "optshard.device = \"cuda\": %s", why);
    else if ((rc = shm_attach(&d->dev, job, DEVDIR_SEG, d->err, sizeof(d->err))))
        ;
    else if (!(d->peer_mem = calloc((size_t)S, sizeof(void *))) || !(d->peer_ev = calloc((size_t)S, sizeof(void *))))
        rc = fail(d, -ENOMEM, "out of memory");
    else if (d->cu->ipc_alloc((void **)&d->norms, 2 * (d->nb ? d->nb : 1) * sizeof(double), &h) ||
             d->cu->ipc_event_new(&d->normed, &devdir_shard(shm_data(d->dev), l, k)->normed) ||
             d->cu->ipc_event_new(&d->sq_ev, &(cuda_ipc_event_t){{0}}))
        rc = fail(d, -EIO, "the block norms' shared memory and events: %s", d->cu->last_error());
    else if (be->alloc(&d->dev_mem.mem, (NORM_LANES + 1) * sizeof(double) + 2 * S * sizeof(double *) +
                                            S * sizeof(size_t) + sizeof(float)))
        rc = fail(d, -ENOMEM, "%s memory for the clip factor: %s", be->name, be->last_error());
    if (!rc) {
        char *p = d->dev_mem.mem;
        d->dev_mem.lanes = (double *)p, p += NORM_LANES * sizeof(double);
        d->dev_mem.sq = (double *)p, p += sizeof(double);
        d->dev_mem.runs[0] = (const double **)p, p += S * sizeof(double *);
        d->dev_mem.runs[1] = (const double **)p, p += S * sizeof(double *);
        d->dev_mem.lens = (size_t *)p, p += S * sizeof(size_t);
        d->dev_mem.scale = (float *)p;
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        if (posix_memalign((void **)&d->host_sq, page, page))
            rc = fail(d, -ENOMEM, "out of memory");
        else
            d->host_sq_pinned = be->host_pin(d->host_sq, page) == 0;
    }
    if (!rc) { /* the entry's part, before plane_reduce_new says it is ready */
        devdir_shard_t *e = d->entry = devdir_shard(shm_data(d->dev), l, k);
        e->norms = h;
        e->block0 = begin / MANIFEST_BLOCK;
        e->nblocks = d->nb;
        atomic_store(&e->normed_step, -1);
    }
    if (rc) {
        snprintf(err, errlen, "%s", d->err);
        devnorm_destroy(&d);
        return rc;
    }
    *out = d;
    return 0;
}

void devnorm_destroy(devnorm_t **pd)
{
    devnorm_t *d = *pd;
    if (!d)
        return;
    if (d->norms)
        d->be->stream_sync(d->stream); /* nothing of ours reads the memory any more */
    for (int i = 0; d->peer_mem && i < d->lay.shards; i++) {
        if (d->peer_mem[i])
            d->cu->ipc_close(d->peer_mem[i]);
        if (d->peer_ev[i])
            d->cu->event_free(d->peer_ev[i]);
    }
    if (d->normed)
        d->cu->event_free(d->normed);
    if (d->sq_ev)
        d->cu->event_free(d->sq_ev);
    if (d->norms)
        d->be->free(d->norms);
    if (d->dev_mem.mem)
        d->be->free(d->dev_mem.mem);
    if (d->host_sq_pinned)
        d->be->host_unpin(d->host_sq);
    free(d->host_sq);
    free(d->peer_mem);
    free(d->peer_ev);
    shm_detach(&d->dev);
    free(d);
    *pd = NULL;
}

double *devnorm_blocks(devnorm_t *d, int64_t step) { return d->norms + (size_t)(step & 1) * d->nb; }

/* Every shard's entry (waited for: the coordinator starts the steps once all are ready, so this
 * does not wait), the others' memory and events mapped, and the runs of block norms in flat
 * order on the device. */
static int open_peers(devnorm_t *d, int timeout_ms)
{
    int S = d->lay.shards;
    const double **runs = calloc(2 * (size_t)S, sizeof(*runs));
    size_t *lens = calloc((size_t)S, sizeof(*lens)), next = 0;
    int rc = runs && lens ? 0 : fail(d, -ENOMEM, "out of memory");
    for (int i = 0; !rc && i < S; i++) {
        devdir_shard_t *e = devdir_shard_wait(shm_data(d->dev), &d->lay, i, timeout_ms);
        void *mem = d->norms;
        if (!e)
            rc = fail(d, -ETIMEDOUT, "optimizer shard %d never published its block norms' memory", i);
        else if (e->block0 != next)
            rc = fail(d, -EPROTO, "optimizer shard %d's block norms start at block %llu, not %zu", i,
                      (unsigned long long)e->block0, next);
        else if (i != d->k && (d->cu->ipc_open(&d->peer_mem[i], &e->norms) ||
                               d->cu->ipc_event_open(&d->peer_ev[i], &e->normed)))
            rc = fail(d, -EIO, "optimizer shard %d's block norms: %s", i, d->cu->last_error());
        if (rc)
            break;
        if (i != d->k)
            mem = d->peer_mem[i];
        runs[i] = mem, runs[S + i] = (const double *)mem + e->nblocks, lens[i] = e->nblocks;
        next += e->nblocks;
    }
    if (!rc && next != d->lay.n_blocks)
        rc = fail(d, -EPROTO, "the optimizer shards' block norms cover %zu blocks of %zu", next, d->lay.n_blocks);
    if (!rc && (d->be->copy(d->dev_mem.runs[0], runs, 2 * S * sizeof(*runs), d->stream) ||
                d->be->copy(d->dev_mem.lens, lens, S * sizeof(*lens), d->stream) || d->be->stream_sync(d->stream)))
        rc = fail(d, -EIO, "the block norms' table: %s", d->be->last_error());
    free(runs);
    free(lens);
    d->opened = !rc;
    return rc;
}

int devnorm_clip(devnorm_t *d, int64_t step, double max_norm, int timeout_ms, const float **scale)
{
    const cuda_plugin_t *cu = d->cu;
    if (cu->event_record(d->normed, d->stream))
        return fail(d, -EIO, "block norms' event: %s", cu->last_error());
    atomic_store(&d->entry->normed_step, step); /* after the record is issued: devnorm.h "Order" */
    int rc;
    if (!d->opened && (rc = open_peers(d, timeout_ms)))
        return rc;
    for (int i = 0; i < d->lay.shards; i++) {
        if (i == d->k)
            continue;
        devdir_shard_t *e = devdir_shard(shm_data(d->dev), &d->lay, i);
        double t0 = util_now();
        for (int spins = 0; atomic_load(&e->normed_step) < step; spins++) {
            if (util_now() - t0 > timeout_ms / 1e3)
                return fail(d, -ETIMEDOUT, "optimizer shard %d never summed its block norms of step %lld (%d ms)", i,
                            (long long)step + 1, timeout_ms);
            if (spins > 100) /* the others got the same UPDATE at the same time: microseconds, mostly */
                nanosleep(&(struct timespec){0, 20000}, NULL);
        }
        if (cu->stream_wait(d->stream, d->peer_ev[i]))
            return fail(d, -EIO, "waiting for optimizer shard %d's block norms: %s", i, cu->last_error());
    }
    if (cu->norm_clip(d->dev_mem.sq, d->dev_mem.scale, d->dev_mem.lanes, d->dev_mem.runs[step & 1], d->dev_mem.lens,
                      d->lay.shards, max_norm, d->stream) ||
        d->be->copy(d->host_sq, d->dev_mem.sq, sizeof(double), d->stream) || cu->event_record(d->sq_ev, d->stream))
        return fail(d, -EIO, "the clip factor: %s", cu->last_error());
    *scale = d->dev_mem.scale;
    return 0;
}

int devnorm_read(devnorm_t *d, double *sq)
{
    if (d->cu->event_sync(d->sq_ev))
        return fail(d, -EIO, "the gradient norm: %s", d->cu->last_error());
    *sq = *d->host_sq;
    return 0;
}
