/* ctitan-optshard: optimizer shard `--rank` of K. Owns one contiguous slice of the flat
 * parameter space: its training state, the fp32 master weights and the optimizer's state arrays
 * ([optimizer] name: a row of kernels/optim.h, AdamW's two moments). Each step, on REDUCE it
 * sums its slice of every replica's gradients (replica order fixed) and writes the squared norm
 * of each MANIFEST_BLOCK block into the job segment; on UPDATE (with the global clip factor the
 * coordinator computed from all blocks) it applies the optimizer's step at the step's lr and
 * writes the new weights into every replica's parameters, then clears those gradients. Block
 * boundaries do not depend on K, so any shard count gives the same bits. GPU shards on one
 * host's IPC plane get no REDUCE: UPDATE sums, and the shards make the clip factor between
 * themselves on the device from each other's block norms (stages/runtime/devnorm.h), in the
 * coordinator's order.
 *
 * Where: the vector work is the backend's (kernels/backend.h). [optshard] device = "cpu"
 * keeps the state in the job's optstate segment (stages/job/job.h); "cuda" keeps it on the GPU.
 * Where the replicas' weights and gradients are, and their sum, is the data plane's
 * (stages/runtime/plane.h plane_reduce: the fp32 params/grads segments for CPU shards, the
 * stages' device buffers for GPU ones, the new weights written as bf16 in place).
 *
 * Surviving a kill (CPU, DESIGN.md "Recovery"): the optstate segment holds two banks; an
 * update reads one and writes the other (an out-of-place step, the same bits), then commits
 * (the shard's record says which bank is whole), then publishes the weights and clears the
 * gradients. A replacement started after a kill takes the committed bank over, and whatever
 * round the coordinator sends it again comes out the same: REDUCE and UPDATE only read the
 * gradients (the clip factor is applied inside the step), which stay whole until the commit; an
 * UPDATE already committed only publishes again. With optshard.host_banks = 1 the two banks are
 * one, updated in place (12 bytes a parameter less with AdamW): a kill during an update (the
 * record's `writing` mark, set before its first write and cleared after the commit) can tear
 * it, so the coordinator then rewinds the job to its newest snapshot; a kill at any other
 * moment leaves it whole, and the shard is replaced alone as with two banks. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/log.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "kernels/backend.h"
#include "kernels/lr.h"
#include "kernels/optim.h"
#include "kernels/params.h"
#include "stages/job/job.h"
#include "stages/job/staging.h"
#include "stages/runtime/devnorm.h"
#include "stages/runtime/plane.h"
#include "stages/runtime/worker.h"

typedef struct {
    worker_t *w;
    const manifest_t *man;
    job_layout_t lay;
    param_table_t tab;
    int rank;
    size_t begin, end, n;        /* slice [begin, end) of the flat space */
    const optim_t *optim;        /* [optimizer] name */
    int arrays;                  /* of the training state: the master weights, then the optimizer's */
    const backend_t *be;
    int device;
    void *stream, *copy_stream;  /* updates; snapshots (the copier thread) */
    struct {                     /* in the backend's memory, one allocation (mem) */
        void *mem;
        double *norm;            /* (blocks of the slice) squared norms */
    } state;
    const float *g;              /* (n) the replicas' summed gradient (plane_reduce_sum); NULL with
                                  * offload in bf16, summed a chunk at a time into gbuf instead */
    float *gbuf;                 /* offload in bf16: gcap summed gradients (grads_at) */
    size_t gcap, gchunk;         /* gchunk <= gcap: the norm's chunks (grad_chunk: whole blocks) */
    struct {                     /* bank b: the state after a number of steps = b (mod 2): arrays of */
        float *a[OPTIM_ARRAYS_MAX]; /* (n) the optstate segment's bank, or for GPU shards in `state`'s
                                  * allocation: one copy both banks name (updated in place) */
    } bank[2];
    float *snap[OPTIM_ARRAYS_MAX]; /* (n) GPU shards with optshard.gpu_banks 2: a snapshot's copy of
                                  * the state on the device, which the copier takes to the host
                                  * while the updates go on; NULL: it copies from the bank */
    int64_t done;                /* steps the state holds: it is bank[done % 2] */
    _Atomic int64_t *commit;     /* CPU: this shard's record in the optstate segment (job.h) */
    _Atomic int32_t *writing;    /* CPU, one bank (optshard.host_banks 1): the record's mark of an
                                  * update writing it; NULL with two banks */
    int64_t reduced;             /* step whose summed gradient g holds (-1: none yet) */
    double *hnorm;               /* the block norms on the host: norm_out, or a private array */
    double *norm_out;            /* where they go in the job segment (NULL: see reduce) */
    double *own_hnorm;           /* hnorm when it is this process's (freed at the end) */
    void *norm_pinned;           /* GPU shards: hnorm's pages pinned (host_pin), or NULL */
    plane_reduce_t *red;         /* the replicas' parts of the slice (the data plane's view) */
    devnorm_t *dn;               /* GPU shards with the norm on the device (job_layout_t
                                  * norm_on_device): the block norms shared with the other shards,
                                  * the clip factor made there; NULL: the coordinator makes it */
    shm_seg_t *job, *params, *staging, *opt; /* staging: with [checkpoint] enable */
    float *final_w;              /* GPU shards: replica 0 of params, where the run's final fp32 weights
                                  * go (a CPU shard's publish writes them there every step) */
    /* the snapshot copier: a thread at idle CPU priority (see snapshot()) */
    pthread_t copier;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int copy_todo, copy_done, copier_stop;
    int64_t snap_step;           /* the SNAPSHOT whose copy runs, SNAPPED not said yet (-1: none) */
    void *pinned[OPTIM_ARRAYS_MAX]; /* GPU shards: the staging ranges pinned (host_pin), or NULL */
    int n_pinned;
} shard_t;

#define BE_CHECK(sh, call, ...) WORKER_CHECK((sh)->w, (call) == 0, __VA_ARGS__)
#define BE_WHY(sh) (sh)->be->last_error()

static size_t blocks(const shard_t *sh) { return (sh->n + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK; }

/* Offload in bf16 sums the replicas' gradients this many blocks at a time (whole blocks: the
 * block norms are those of the whole sum), so no fp32 copy of the slice's gradients is ever
 * made; the test hook CTITAN_TEST_GRAD_CHUNK_BLOCKS=N makes test-sized slices take several */
static size_t grad_chunk(void)
{
    const char *v = getenv("CTITAN_TEST_GRAD_CHUNK_BLOCKS");
    long n = v ? atol(v) : 0;
    return n > 0 ? (size_t)MANIFEST_BLOCK * (size_t)n : JOB_GRAD_CHUNK;
}

/* The summed gradients of the slice's elements [o, o + *n) (o from the slice's start): in the
 * whole sum reduce made, or with offload in bf16 summed again into gbuf, *n cut to gcap. */
static const float *grads_at(shard_t *sh, size_t o, size_t *n)
{
    if (sh->g)
        return sh->g + o;
    *n = *n < sh->gcap ? *n : sh->gcap;
    WORKER_CHECK(sh->w, plane_reduce_sum_range(sh->red, sh->begin + o, *n, sh->gbuf) == 0, "%s",
                 plane_reduce_error(sh->red));
    return sh->gbuf;
}

/* The part [*b, *e) of tensor p in this shard's slice; 0 when there is none. */
static int overlap(const shard_t *sh, const param_info_t *p, size_t *b, size_t *e)
{
    *b = p->offset > sh->begin ? p->offset : sh->begin;
    *e = p->offset + p->numel < sh->end ? p->offset + p->numel : sh->end;
    return *b < *e;
}

/* n floats from host memory src into dst: the shard's state, in the backend's memory on a GPU
 * shard (queued on its stream: the caller syncs before src goes), in the optstate segment on a
 * CPU shard. */
static void put(shard_t *sh, float *dst, const float *src, size_t n)
{
    if (sh->lay.gpu_shards)
        BE_CHECK(sh, sh->be->copy(dst, src, n * sizeof(float), sh->stream), "upload: %s", BE_WHY(sh));
    else
        memcpy(dst, src, n * sizeof(float));
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
        put(sh, dst[a], staging_array(h, a) + sh->begin, sh->n);
    if (sh->lay.gpu_shards)
        BE_CHECK(sh, sh->be->stream_sync(sh->stream), "upload: %s", BE_WHY(sh));
    LOG_I("slice [%zu, %zu) loaded from %s (step %lld)", sh->begin, sh->end, sh->man->ckpt_load,
          (long long)atomic_load(&h->step));
    shm_detach(&seg);
}

/* Copies this shard's state into the staging segment for checkpointd. The copy runs in a
 * thread at SCHED_IDLE priority: on a machine whose CPUs the stages keep busy it takes only
 * the time they leave idle (pipeline bubbles, waits between steps) instead of slowing the
 * step that runs meanwhile. The main thread goes on meanwhile: the next step's REDUCE reads
 * only gradients; the UPDATE that changes the state waits for the copy (snap_finish), and
 * SNAPPED is said as soon as it is done (next_command). A GPU shard copies into pinned staging
 * memory (pin_staging), at the bus's rate. */
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
        int b = (int)(sh->snap_step % 2); /* the state after snap_step: no UPDATE touches it meanwhile */
        for (int a = 0; a < sh->arrays; a++)
            BE_CHECK(sh, sh->be->copy(staging_array(seg, a) + sh->begin, sh->snap[0] ? sh->snap[a] : sh->bank[b].a[a],
                                      sh->n * sizeof(float), sh->copy_stream), "snapshot: %s", BE_WHY(sh));
        BE_CHECK(sh, sh->be->stream_sync(sh->copy_stream), "snapshot: %s", BE_WHY(sh));
        pthread_mutex_lock(&sh->mu);
        sh->copy_todo = 0;
        sh->copy_done = 1;
        pthread_cond_broadcast(&sh->cv);
    }
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

static void snapshot(shard_t *sh, int64_t step)
{
    /* with a snapshot copy on the device, the state goes there first, behind the update on the
     * shard's stream (a device-to-device copy: ~1 ms for 160M parameters), and the next
     * updates need not wait for the copier */
    for (int a = 0; sh->snap[0] && a < sh->arrays; a++)
        BE_CHECK(sh, sh->be->copy(sh->snap[a], sh->bank[step % 2].a[a], sh->n * sizeof(float), sh->stream),
                 "snapshot: %s", BE_WHY(sh));
    /* a GPU shard's UPDATE answered before its device was done: the copier's stream reads it */
    if (sh->lay.gpu_shards)
        BE_CHECK(sh, sh->be->stream_sync(sh->stream), "snapshot: %s", BE_WHY(sh));
    pthread_mutex_lock(&sh->mu);
    sh->copy_done = 0;
    sh->copy_todo = 1;
    sh->snap_step = step;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

/* The running snapshot's copy: waited for (wait) or only looked at; once it is done, SNAPPED is
 * said (say). */
static void snap_finish(shard_t *sh, int wait, int say)
{
    if (sh->snap_step < 0)
        return;
    pthread_mutex_lock(&sh->mu);
    while (wait && !sh->copy_done)
        pthread_cond_wait(&sh->cv, &sh->mu);
    int done = sh->copy_done;
    pthread_mutex_unlock(&sh->mu);
    if (!done)
        return;
    msg_t snapped = {.type = MSG_SNAPPED, .step = sh->snap_step};
    sh->snap_step = -1;
    if (say && !worker_test_mute(sh->w, "snapped", snapped.step - 1))
        WORKER_CHECK(sh->w, worker_send(sh->w, &snapped) == 0, "cannot reach the coordinator");
}

/* The next command; while a snapshot's copy runs, SNAPPED goes out within a millisecond of its
 * end (the coordinator waits for it at the end of the run, with no further command to wake us). */
static void next_command(shard_t *sh, msg_t *m)
{
    for (snap_finish(sh, 0, 1); sh->snap_step >= 0; snap_finish(sh, 0, 1)) {
        int rc = worker_recv(sh->w, 1, m);
        if (rc == 0)
            return;
        if (rc != -EAGAIN && rc != -EINTR)
            worker_die(sh->w, "control socket: %s", strerror(-rc));
    }
    worker_command(sh->w, m);
}

/* GPU shards: pins this shard's ranges of the staging segment (each array's slice, whole pages,
 * ranges that share a page merged) so that the snapshot's device-to-host copies run at the
 * bus's rate and asynchronously; a range that cannot be pinned stays pageable, slower. */
static void pin_staging(shard_t *sh)
{
    if (!sh->lay.gpu_shards || !sh->n)
        return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = 0, hi = 0;
    double t0 = util_now();
    for (int a = 0; a <= sh->arrays; a++) {
        uintptr_t b = 0, e = 0;
        if (a < sh->arrays) {
            b = (uintptr_t)(staging_array(shm_data(sh->staging), a) + sh->begin) / page * page;
            e = ((uintptr_t)(staging_array(shm_data(sh->staging), a) + sh->end) + page - 1) / page * page;
        }
        if (a < sh->arrays && hi && b <= hi) { /* shares a page with the range before: one range */
            hi = e > hi ? e : hi;
            continue;
        }
        if (hi) {
            if (sh->be->host_pin((void *)lo, hi - lo))
                LOG_W("cannot pin %zu bytes of the staging segment (snapshots copy at pageable speed): %s",
                      (size_t)(hi - lo), BE_WHY(sh));
            else
                sh->pinned[sh->n_pinned++] = (void *)lo;
        }
        lo = b, hi = e;
    }
    LOG_D("staging: %d ranges pinned in %.2f s", sh->n_pinned, util_now() - t0);
}

static void make_state(shard_t *sh, float *const *dst);

/* The working memory in the backend's: the block norms; GPU shards also keep the state there,
 * made in bank done % 2 (make_state: never whole on the host); both banks name that one copy
 * (updated in place), and with optshard.gpu_banks 2 a second copy holds a snapshot's state on
 * its way to the host (snap). */
static void move_state(shard_t *sh)
{
    const backend_t *be = sh->be;
    int gpu = sh->lay.gpu_shards, banks = gpu ? sh->man->gpu_banks : 0, arrays = banks * sh->arrays;
    size_t n = sh->n ? sh->n : 1, nb = sh->dn ? 0 : blocks(sh) ? blocks(sh) : 1; /* dn: its own */
    size_t fbytes = (arrays * n * sizeof(float) + 63) / 64 * 64;
    BE_CHECK(sh, be->alloc(&sh->state.mem, fbytes + nb * sizeof(double)), "%s memory for %zu parameters: %s",
             be->name, sh->n, BE_WHY(sh));
    float *f = sh->state.mem;
    sh->state.norm = (double *)((char *)sh->state.mem + fbytes);
    /* the block norms come straight into the job segment when the coordinator sums them there */
    if (!sh->dn && !(sh->hnorm = sh->norm_out))
        WORKER_CHECK(sh->w, sh->hnorm = sh->own_hnorm = calloc(nb, sizeof(double)), "out of memory");
    if (!gpu)
        return;
    /* every step copies them off the device (4 MB a shard for a ~1B model), unless they stay
     * there (dn): pinned, at the bus's rate rather than through the driver's pageable staging;
     * pageable if it cannot be pinned */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = sh->dn ? 0 : (uintptr_t)sh->hnorm / page * page,
              hi = sh->dn ? 0 : ((uintptr_t)(sh->hnorm + blocks(sh)) + page - 1) / page * page;
    if (lo < hi && be->host_pin((void *)lo, hi - lo) == 0)
        sh->norm_pinned = (void *)lo;
    else if (lo < hi)
        LOG_W("cannot pin the %zu bytes of block norms (copied at pageable speed): %s", blocks(sh) * sizeof(double),
              BE_WHY(sh));
    int b0 = (int)(sh->done % 2);
    for (int a = 0; a < sh->arrays; a++) {
        sh->bank[b0].a[a] = sh->bank[1 - b0].a[a] = f + a * n;
        sh->snap[a] = banks > 1 ? f + (sh->arrays + a) * n : NULL;
    }
    make_state(sh, sh->bank[b0].a);
}

/* Every replica's weights from the master (in the backend's dtype, where the stages read
 * them), their gradients cleared, unless the step's own pass did (`written`: step_run). A GPU
 * shard's returns once that is queued (the stages' streams wait on its event: plane.h); with
 * `wait` once it is done. */
static void publish(shard_t *sh, int written, int wait)
{
    WORKER_CHECK(sh->w, plane_reduce_publish(sh->red, sh->bank[sh->done % 2].a[0], written) == 0, "%s",
                 plane_reduce_error(sh->red));
    if (wait)
        BE_CHECK(sh, sh->be->stream_sync(sh->stream), "publish: %s", BE_WHY(sh));
}

/* REMAP (GPU shards): the stages were started again (a stage was lost: DESIGN.md "Recovery").
 * The old mappings go, the new stages' buffers are mapped, and the master weights written
 * into them: the weights the stages had, bit for bit. */
static void remap(shard_t *sh)
{
    WORKER_CHECK(sh->w, plane_reduce_remap(sh->red) == 0, "%s", plane_reduce_error(sh->red));
    publish(sh, 0, 1);
}

/* The state at the first step: the checkpoint's (checkpoint.load) or the initial weights
 * with the optimizer's state at zero, into dst[a]: the optstate segment's bank on a CPU shard;
 * a GPU shard's device memory, where the moments are zeroed and the weights come in pieces
 * through one host buffer of a piece (pinned where it can be), so that a large slice never
 * sits whole on the host (12 bytes a parameter: 90 GiB at the 8B). Returns once it is there. */
static void make_state(shard_t *sh, float *const *dst)
{
    const size_t piece = JOB_STATE_PIECE;
    int gpu = sh->lay.gpu_shards;
    if (sh->man->ckpt_load[0]) {
        load(sh, dst);
        return;
    }
    for (int a = 1; a < sh->arrays; a++)
        if (gpu)
            BE_CHECK(sh, sh->be->zero(dst[a], sh->n * sizeof(float), sh->stream), "upload: %s", BE_WHY(sh));
        else
            memset(dst[a], 0, sh->n * sizeof(float));
    float *buf = NULL;
    int pinned = 0;
    if (gpu) {
        size_t bytes = (sh->n < piece ? (sh->n ? sh->n : 1) : piece) * sizeof(float);
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        bytes = (bytes + page - 1) / page * page;
        WORKER_CHECK(sh->w, posix_memalign((void **)&buf, page, bytes) == 0, "out of memory");
        pinned = sh->be->host_pin(buf, bytes) == 0;
    }
    /* in pieces (any split gives the same bits), saying how far every util_say_s(): a large
     * model's slice takes a while, and the launch would otherwise say nothing */
    util_every_t say;
    util_every_start(&say, util_say_s());
    for (size_t at = sh->begin; at < sh->end; at += piece) {
        size_t e = sh->end - at > piece ? at + piece : sh->end;
        float *into = dst[0] + (at - sh->begin);
        params_init(&sh->tab, &sh->man->model, sh->man->seed, gpu ? buf : into, at, e);
        if (gpu) { /* the buffer is written again next: this piece must be on the device first */
            put(sh, into, buf, e - at);
            BE_CHECK(sh, sh->be->stream_sync(sh->stream), "upload: %s", BE_WHY(sh));
        }
        double s = util_every_due(&say);
        if (s >= 0)
            LOG_I("initialising the weights of its slice: %.0f of %.0f M parameters (%.0f s)",
                  (double)(e - sh->begin) / 1e6, (double)sh->n / 1e6, s);
    }
    if (gpu) {
        BE_CHECK(sh, sh->be->stream_sync(sh->stream), "upload: %s", BE_WHY(sh));
        if (pinned)
            sh->be->host_unpin(buf);
        free(buf);
    }
}

/* CPU shards: the banks in the optstate segment (one, named twice, with optshard.host_banks = 1:
 * job_optstate_array). Returns 1 when this process replaces a shard
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
    if (sh->lay.host_banks < 2)
        sh->writing = &job_optstate_rec(mem, sh->rank)->writing;
    int64_t done = atomic_load(sh->commit);
    if (done >= 0) {
        WORKER_CHECK(sh->w, !sh->writing || !atomic_load(sh->writing), "slice [%zu, %zu): the optstate segment's one "
                     "bank (optshard.host_banks = 1) was being updated from the state after step %lld when the "
                     "shard before this one died: torn; only a rewind starts a shard of such a job again", sh->begin,
                     sh->end, (long long)done);
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
    if (sh->lay.gpu_shards) { /* CPU shards reach the params segment through the plane's view */
        WORKER_CHECK(sh->w, shm_attach(&sh->params, job, "params", err, sizeof(err)) == 0, "%s", err);
        sh->final_w = shm_data(sh->params);
    }
    if (job_norm_by_blocks(&sh->lay)) /* else the slices do not start at block boundaries: see reduce */
        sh->norm_out = job_norm_blocks(shm_data(sh->job)) + sh->begin / MANIFEST_BLOCK;
    int took_over = 0;
    if (sh->lay.gpu_shards)
        sh->done = worker_first_step(sh->w); /* its state is made on the device: move_state */
    else
        took_over = state_in_segment(sh);

    const char *device = sh->lay.gpu_shards ? "cuda" : "cpu", *plane = plane_transport(&sh->lay);
    WORKER_CHECK(sh->w, sh->be = backend_load(device, err, sizeof(err)), "optshard.device = \"%s\": %s", device, err);
    int r, s; /* beside the stage that holds its slice's sum, or device k */
    plane_shard_beside(plane, &sh->lay, sh->rank, &r, &s);
    BE_CHECK(sh, sh->be->dev_select(r >= 0 ? job_local_ordinal(&sh->lay, r, s) : sh->rank, &sh->device), "%s",
             BE_WHY(sh));
    BE_CHECK(sh, sh->be->stream_new(&sh->stream), "%s", BE_WHY(sh));
    BE_CHECK(sh, sh->be->stream_new(&sh->copy_stream), "%s", BE_WHY(sh));
    if (sh->lay.norm_on_device) /* its part of the device directory entry, which plane_reduce_new publishes */
        WORKER_CHECK(sh->w, devnorm_new(&sh->dn, &sh->lay, job, sh->rank, sh->begin, sh->end, sh->be, sh->stream, err,
                                        sizeof(err)) == 0, "%s", err);
    WORKER_CHECK(sh->w, plane_reduce_new(&sh->red, plane, &sh->lay, job, sh->rank, sh->begin, sh->end, sh->be,
                                         sh->stream, err, sizeof(err)) == 0, "%s", err);
    if (plane_reduce_bf16(sh->red)) { /* a chunk, or the largest tensor's part for an optimizer of whole tensors */
        sh->gcap = sh->gchunk = grad_chunk();
        for (int t = 0; t < sh->tab.n && sh->optim->whole_tensors; t++) {
            size_t b, e;
            if (overlap(sh, &sh->tab.t[t], &b, &e) && e - b > sh->gcap)
                sh->gcap = e - b;
        }
        WORKER_CHECK(sh->w, sh->gbuf = malloc(sh->gcap * sizeof(float)), "out of memory for %zu gradients", sh->gcap);
    }
    move_state(sh);
    if (!took_over) { /* a replacement leaves the stages' weights alone: a step may be running */
        publish(sh, 0, 1);
        if (sh->commit)
            atomic_store(sh->commit, sh->done);
    }

    if (manifest_snapshots(m)) {
        WORKER_CHECK(sh->w, shm_attach(&sh->staging, job, STAGING_SEG, err, sizeof(err)) == 0, "%s", err);
        pthread_mutex_init(&sh->mu, NULL);
        pthread_cond_init(&sh->cv, NULL);
        WORKER_CHECK(sh->w, pthread_create(&sh->copier, NULL, copier_main, sh) == 0, "cannot start a thread");
        pin_staging(sh);
    }
    LOG_D("slice [%zu, %zu) of %zu parameters on the %s", sh->begin, sh->end, sh->lay.total,
          sh->lay.gpu_shards ? "GPU" : "CPU");
}

/* REDUCE: the replicas' gradients summed in replica order (with NCCL the reduce-scatter did
 * that), the block norms to the job segment, where the coordinator sums them (0 is returned:
 * a ~1B model's slice has ~430k blocks, ~0.5 ms of additions a step nobody would read). When the
 * slices do not start at block boundaries (job_norm_by_blocks) the block norms stay here and
 * the slice's squared norm is returned; the coordinator sums those in shard order. With the
 * norm on the device (dn) they stay there, queued, for the UPDATE's sum (0 is returned). */
static double reduce(shard_t *sh, int64_t step)
{
    const backend_t *be = sh->be;
    if (!sh->gbuf)
        WORKER_CHECK(sh->w, plane_reduce_sum(sh->red, &sh->g) == 0, "%s", plane_reduce_error(sh->red));
    size_t nb = blocks(sh);
    double *norm = sh->dn ? devnorm_blocks(sh->dn, step) : sh->state.norm;
    for (size_t o = 0, n; o < sh->n; o += n) { /* one pass, or a chunk at a time (whole blocks) */
        n = sh->g || sh->n - o < sh->gchunk ? sh->n - o : sh->gchunk;
        const float *g = grads_at(sh, o, &n);
        BE_CHECK(sh, be->block_sumsq(norm + o / MANIFEST_BLOCK, g, n, MANIFEST_BLOCK, sh->stream), "norm: %s",
                 BE_WHY(sh));
    }
    if (sh->dn) {
        sh->reduced = step;
        return 0;
    }
    BE_CHECK(sh, be->copy(sh->hnorm, sh->state.norm, nb * sizeof(double), sh->stream), "norm: %s", BE_WHY(sh));
    BE_CHECK(sh, be->stream_sync(sh->stream), "reduce: %s", BE_WHY(sh));
    sh->reduced = step;
    double sq = 0;
    for (size_t b = 0; b < nb && !sh->norm_out; b++)
        sq += sh->hnorm[b];
    return sq;
}

/* The optimizer's step over the slice's elements [rb, re), bank `from` into bank `to`; with
 * `out`, in pieces that each write the stages' weights and clear their gradients in the same
 * pass where plane_reduce_out says they can (an elementwise step: any split, the same bits). */
static void step_run(shard_t *sh, int from, int to, size_t rb, size_t re, int out, optim_args_t args, int64_t step)
{
    for (size_t at = rb, n; at < re; at += n) {
        args.w_out = NULL, args.g_clear = NULL, n = re - at;
        size_t held;
        if (out && plane_reduce_out(sh->red, at, &args.w_out, &args.g_clear, &held) && held < n)
            n = held;
        size_t o = at - sh->begin;
        const float *g = grads_at(sh, o, &n);
        float *dst[OPTIM_ARRAYS_MAX];
        const float *src[OPTIM_ARRAYS_MAX];
        for (int a = 0; a < sh->arrays; a++)
            dst[a] = sh->bank[to].a[a] + o, src[a] = sh->bank[from].a[a] + o;
        BE_CHECK(sh, sh->optim->step(sh->be, dst, src, g, n, &args, sh->stream), "%s: %s", sh->optim->name,
                 BE_WHY(sh));
    }
    worker_test_point(sh->w, "adamw", step);
}

/* UPDATE of step `step` (0-based): the optimizer's step from bank step % 2 into the other, the
 * commit, then the new weights to every replica (GPU shards: in the step's own pass where they
 * can, the gradients read by nothing after it and no commit record to wait for; the answer goes
 * once it is queued, the stages' next steps waiting for it on their devices: publish). With the
 * norm on the device (dn), *norm is the one this shard made; else it is left alone. */
static double update(shard_t *sh, int64_t step, double scale, double *norm)
{
    const manifest_t *m = sh->man;
    const backend_t *be = sh->be;
    double lr = m->lr * lr_factor(&m->lr_sched, (int)step);
    if (sh->commit && atomic_load(sh->commit) == step + 1) { /* committed by the shard this one replaces */
        sh->done = step + 1;
        publish(sh, 0, 0);
        return lr;
    }
    /* (a GPU shard's count is only the config's step, which another host's process may have had
     * before the coordinator resumed: its state is one copy, updated in place, so no bank to pick) */
    WORKER_CHECK(sh->w, !sh->commit || sh->done == step, "UPDATE of step %lld, but the state is that after step %lld",
                 (long long)step + 1, (long long)sh->done);
    if (sh->dn) /* no REDUCE came: its test point is here */
        worker_test_point(sh->w, "reduce", step);
    if (sh->reduced != step) /* a replacement (the gradients stay whole until the commit); dn: always */
        reduce(sh, step);
    /* CPU shards' gradients are only read (clipped inside the step), whole for a replacement */
    int from = (int)(step % 2), to = 1 - from, out = !sh->commit && !sh->optim->whole_tensors;
    if (sh->writing) /* one bank: torn from here until the commit (job.h) */
        atomic_store(sh->writing, 1);
    optim_args_t args = {.lr = (float)lr, .beta1 = (float)m->beta1, .beta2 = (float)m->beta2, .eps = (float)m->eps,
                         .gscale = (float)scale, .step = (int)step + 1};
    if (sh->dn) /* the clip factor of every shard's blocks, made on the device behind them */
        WORKER_CHECK(sh->w, devnorm_clip(sh->dn, step, m->max_norm, 120000, &args.gscale_at) == 0, "%s",
                     devnorm_error(sh->dn));
    /* one call per run of adjacent tensors with the same weight decay (an elementwise step: the
     * same bits as one call a tensor, a fraction of the launches on a GPU), or per tensor when the
     * optimizer needs whole tensors */
    size_t rb = 0, re = 0;
    int rdecay = -1;
    for (int t = 0; t <= sh->tab.n; t++) {
        const param_info_t *p = t < sh->tab.n ? &sh->tab.t[t] : NULL;
        size_t b = 0, e = 0;
        if (p && !overlap(sh, p, &b, &e))
            continue;
        int decay = p && (m->decay_embed_and_norms || params_is_decayed(p->kind));
        if (p && rdecay == decay && b == re && !sh->optim->whole_tensors) {
            re = e;
            continue;
        }
        if (rdecay >= 0) { /* the run so far */
            args.weight_decay = rdecay ? (float)m->weight_decay : 0.0f;
            step_run(sh, from, to, rb, re, out, args, step);
        }
        rb = b, re = e, rdecay = p ? decay : -1;
    }
    /* the commit record says the new bank is whole: only once it is; a GPU shard has none (its
     * state is one copy, a loss rewinds the job), and its publish queues behind the step */
    if (sh->commit)
        BE_CHECK(sh, be->stream_sync(sh->stream), "%s: %s", sh->optim->name, BE_WHY(sh));
    sh->done = step + 1;
    if (sh->commit)
        atomic_store(sh->commit, sh->done);
    if (sh->writing)
        atomic_store(sh->writing, 0);
    worker_test_point(sh->w, "committed", step);
    publish(sh, out, 0);
    if (sh->dn) { /* the norm for the coordinator's report: the host waits for the sum, not the update */
        double sq;
        WORKER_CHECK(sh->w, devnorm_read(sh->dn, &sq) == 0, "%s", devnorm_error(sh->dn));
        *norm = sqrt(sq);
    }
    return lr;
}

/* At the end of the run: GPU shards copy the fp32 master into replica 0 of the params segment,
 * where the coordinator's evaluation and sampling read the final weights (CPU shards published
 * them there with every step, bit for bit), then the backend's memory and mappings given back. */
static void finish(shard_t *sh)
{
    const backend_t *be = sh->be;
    if (sh->final_w) {
        BE_CHECK(sh, be->copy(sh->final_w + sh->begin, sh->bank[sh->done % 2].a[0], sh->n * sizeof(float),
                              sh->stream), "%s", BE_WHY(sh));
        BE_CHECK(sh, be->stream_sync(sh->stream), "final weights: %s", BE_WHY(sh));
    }
    plane_reduce_destroy(&sh->red);
    devnorm_destroy(&sh->dn);
    be->free(sh->state.mem);
    be->stream_free(sh->stream);
    be->stream_free(sh->copy_stream);
    if (sh->norm_pinned)
        be->host_unpin(sh->norm_pinned);
    free(sh->own_hnorm);
    free(sh->gbuf);
}

int main(int argc, char **argv)
{
    shard_t sh = {.rank = -1, .snap_step = -1};
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
        next_command(&sh, &m);
        msg_t reply = {.step = m.step};
        double t0 = util_now();
        if (m.type == MSG_STOP) {
            snap_finish(&sh, 1, 0); /* the copier must not stop halfway */
            msg_clear(&m);
            break;
        } else if (m.type == MSG_REDUCE) {
            worker_test_point(sh.w, "reduce", m.step);
            reply.grad_norm = reduce(&sh, m.step);
            reply.type = MSG_REDUCED;
        } else if (m.type == MSG_SNAPSHOT) {
            WORKER_CHECK(sh.w, sh.staging, "snapshot without a staging segment (checkpoint.enable is false, and "
                         "no snapshot_interval)");
            /* done == step + 1: a replacement of a shard that died owing this SNAPPED after the next
             * UPDATE (its SNAPPED unread when the coordinator saw it die). With two banks that
             * update wrote the other bank, running on during the copy or after it: the bank
             * step % 2 still holds the state after step. With one it waited for the copy to be
             * done before writing (below): the staging segment holds the slice already. */
            WORKER_CHECK(sh.w, !sh.commit || sh.done == m.step || sh.done == m.step + 1,
                         "SNAPSHOT of step %lld, but the state is that after step %lld", (long long)m.step,
                         (long long)sh.done);
            worker_test_point(sh.w, "snapshot", m.step - 1);
            snap_finish(&sh, 1, 1);
            if (sh.lay.host_banks == 1 && sh.done == m.step + 1) {
                LOG_I("SNAPSHOT of step %lld: copied by the shard this one replaces", (long long)m.step);
                reply.type = MSG_SNAPPED;
            } else {
                snapshot(&sh, m.step); /* SNAPPED once the copy is done */
            }
        } else if (m.type == MSG_REMAP) {
            WORKER_CHECK(sh.w, sh.lay.gpu_shards, "REMAP to a shard on the CPU (its weights are the params segment)");
            worker_test_point(sh.w, "remap", m.step);
            remap(&sh);
            reply.type = MSG_REMAPPED;
        } else if (m.type == MSG_UPDATE) {
            /* it writes bank (step + 1) % 2: a snapshot's copy from it must be done (a CPU shard's
             * two banks let the copy run on through the next update, waiting only before the one
             * after; a GPU shard's one bank makes every update wait, unless its snapshot is
             * copied on the device first: optshard.gpu_banks 2; likewise a CPU shard's one bank,
             * optshard.host_banks 1) */
            int overwrites = sh.snap_step >= 0 && !sh.snap[0] &&
                             sh.bank[(m.step + 1) % 2].a[0] == sh.bank[sh.snap_step % 2].a[0];
            snap_finish(&sh, overwrites, 1);
            reply.lr = update(&sh, m.step, m.scale, &reply.grad_norm);
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
    for (int i = 0; i < sh.n_pinned; i++)
        sh.be->host_unpin(sh.pinned[i]);
    finish(&sh);
    params_table_free(&sh.tab);
    shm_detach(&sh.job);
    shm_detach(&sh.params);
    shm_detach(&sh.staging);
    shm_detach(&sh.opt);
    worker_close(&sh.w);
    return 0;
}
