/* The CPU backend (kernels/backend.h): the model of model.h computing in place on the shared
 * fp32 parameters and gradients, and an optimizer shard's vector work as the plain loops the
 * CPU optimizer has always run (their order is part of the bits of training: a sequential
 * double sum per block, replicas added one after another, ops_adamw). Every call finishes
 * before it returns; streams are NULL. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "kernels/backend.h"
#include "kernels/cpu/model.h"
#include "kernels/ops.h"

struct backend_model {
    model_t *model;
    pool_t *pool;
    float *w, *g;       /* the pieces' range of the shared parameters and gradients */
    size_t begin, end;
    double kept;        /* the losses of forwards given loss NULL (loss_take) */
};

static _Thread_local char why[256];

__attribute__((format(printf, 2, 3))) static int fail(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    return rc;
}

static const char *cpu_last_error(void) { return why; }

/* ---- the model ---- */

static void cpu_model_destroy(backend_model_t **pm)
{
    backend_model_t *m = *pm;
    if (!m)
        return;
    model_destroy(&m->model);
    pool_destroy(&m->pool);
    free(m);
    *pm = NULL;
}

static int cpu_model_new(backend_model_t **out, const model_config_t *cfg, int p0, int p1, void *host_w,
                         void *host_g, int threads)
{
    *out = NULL;
    if (!host_w || !host_g)
        return fail(-EINVAL, "the CPU model computes on the shared parameters and gradients: none given");
    if (cfg->host_bf16)
        return fail(-EINVAL, "the CPU model computes on fp32 parameters and gradients: bf16 ones given");
    backend_model_t *m = calloc(1, sizeof(*m));
    if (!m)
        return fail(-ENOMEM, "out of memory");
    param_table_t tab;
    if (params_table_init(&tab, cfg)) {
        free(m);
        return fail(-ENOMEM, "out of memory");
    }
    params_piece_range(&tab, p0, p1, &m->begin, &m->end);
    params_table_free(&tab);
    m->w = host_w, m->g = host_g;
    if (!(m->pool = pool_new(threads > 0 ? threads : 1))) {
        int e = errno;
        cpu_model_destroy(&m);
        return fail(-e, "cannot start a pool of %d threads: %s", threads, strerror(e));
    }
    m->model = model_new(cfg, p0, p1, host_w, host_g, m->pool);
    if (!m->model) {
        cpu_model_destroy(&m);
        return fail(-ENOMEM, "cannot build pieces [%d, %d) of the model", p0, p1);
    }
    *out = m;
    return 0;
}

static int cpu_acts_new(backend_acts_t **out, backend_model_t *m, int B, int T)
{
    *out = (backend_acts_t *)model_acts_new(m->model, B, T);
    return *out ? 0 : fail(-ENOMEM, "out of memory for the activations of a %d x %d microbatch", B, T);
}

static void cpu_acts_destroy(backend_acts_t **a)
{
    model_acts_t *ma = (model_acts_t *)*a;
    model_acts_destroy(&ma);
    *a = NULL;
}

/* The model's failure of the call just made (activation checkpointing's work sets, or parameter
 * sharding's exchange). */
static int status(backend_model_t *m)
{
    int rc = model_status(m->model);
    if (rc == -ENOMEM)
        return fail(rc, "out of memory for the recompute work sets of activation checkpointing");
    return rc ? fail(rc, "parameter sharding's exchange: %s", strerror(-rc)) : 0;
}

static int cpu_model_shard(backend_model_t *m, const shard_io_t *io)
{
    if (io && io->weights)
        return fail(-EINVAL, "the CPU model computes on its group's shared weights: no gather to take");
    model_set_shard_io(m->model, io);
    return 0;
}

static int cpu_forward(backend_model_t *m, backend_acts_t *a, const int32_t *tokens, const void *x_in,
                       const int32_t *targets, float dscale, void *x_out, double *loss)
{
    double l = model_forward(m->model, (model_acts_t *)a, tokens, x_in, targets, dscale, x_out);
    if (loss)
        *loss = l;
    else
        m->kept += l;
    return status(m);
}

static int cpu_loss_take(backend_model_t *m, double *loss)
{
    *loss = m->kept;
    m->kept = 0;
    return 0;
}

static int cpu_backward_b(backend_model_t *m, backend_acts_t *a, const void *dy, void *dx)
{
    model_backward_b(m->model, (model_acts_t *)a, dy, dx);
    return status(m);
}

static int cpu_backward_w(backend_model_t *m, backend_acts_t *a)
{
    model_backward_w(m->model, (model_acts_t *)a);
    return status(m);
}

static int cpu_backward(backend_model_t *m, backend_acts_t *a, const void *dy, void *dx)
{
    model_backward(m->model, (model_acts_t *)a, dy, dx);
    return status(m);
}

/* The model reads and writes the shared buffers themselves: nothing to move around a step. */
static int cpu_step_begin(backend_model_t *m)
{
    m->kept = 0;
    return 0;
}

static int cpu_step_end(backend_model_t *m) { return 0; }

static void *cpu_model_stream(backend_model_t *m) { return NULL; }

static void cpu_model_buffers(backend_model_t *m, void **w, float **g, size_t *begin, size_t *end)
{
    *w = m->w;
    *g = m->g;
    *begin = m->begin;
    *end = m->end;
}

static int cpu_mem_used(size_t *bytes)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru))
        return fail(-errno, "getrusage: %s", strerror(errno));
    *bytes = (size_t)ru.ru_maxrss * 1024;
    return 0;
}

/* ---- an optimizer shard's vectors ---- */

static int cpu_dev_select(int ordinal, int *used)
{
    if (used)
        *used = 0;
    return 0;
}

static int cpu_alloc(void **p, size_t bytes)
{
    if (posix_memalign(p, 64, bytes ? bytes : 1)) {
        *p = NULL;
        return fail(-ENOMEM, "out of memory for %zu bytes", bytes);
    }
    return 0;
}

static int cpu_free(void *p)
{
    free(p);
    return 0;
}

static int cpu_stream_new(void **s)
{
    *s = NULL;
    return 0;
}

static void cpu_stream_free(void *s) {}
static int cpu_stream_sync(void *s) { return 0; }

static int cpu_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    if (dst != src)
        memcpy(dst, src, bytes);
    return 0;
}

static int cpu_zero(void *dst, size_t bytes, void *stream)
{
    memset(dst, 0, bytes);
    return 0;
}

static int cpu_f32_add(float *y, const float *x, size_t n, void *stream)
{
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
    return 0;
}

/* The CUDA backend's order (kernels/cuda/dev.cu k_block_sumsq: a warp a block), so CPU and GPU
 * optimizer shards give the same block norms from the same gradients, and so the same clip
 * factor: 32 lanes, lane l adding the squares of the block's elements 4 (l + 32 j) + k, j = 0,
 * 1, ..., k = 0..3, in that order (each square exact in double), then the lanes pairwise, lane
 * l += lane l + o for o = 16, 8, 4, 2, 1 (the warp's butterfly as lane 0 sees it). */
static int cpu_block_sumsq(double *out, const float *x, size_t n, size_t block, void *stream)
{
    if (!block)
        return fail(-EINVAL, "blocks of 0 elements");
    for (size_t b = 0; b < n; b += block) {
        size_t len = b + block < n ? block : n - b;
        const float *xb = x + b;
        double lane[32] = {0};
        for (size_t row = 0; row < len; row += 4 * 32)
            for (int l = 0; l < 32; l++)
                for (size_t i = row + 4 * (size_t)l; i < row + 4 * (size_t)l + 4 && i < len; i++)
                    lane[l] += (double)xb[i] * xb[i];
        for (int o = 16; o > 0; o >>= 1)
            for (int l = 0; l < o; l++)
                lane[l] += lane[l + o];
        out[b / block] = lane[0];
    }
    return 0;
}

static int cpu_adamw(float *w, float *m, float *v, const float *w0, const float *m0, const float *v0,
                     const float *g, float gscale, const float *gscale_at, size_t n, float lr, float beta1,
                     float beta2, float eps, float wd, int step, void *w_out, float *g_clear, void *stream)
{
    if (gscale_at)
        gscale = *gscale_at; /* the CPU's memory is the host's */
    ops_adamw_to(NULL, w, m, v, w0, m0, v0, g, gscale, n, lr, beta1, beta2, eps, wd, step);
    if (w_out)
        memcpy(w_out, w, n * sizeof(float)); /* the CPU's weights are fp32 */
    if (g_clear)
        memset(g_clear, 0, n * sizeof(float));
    return 0;
}

static int cpu_host_pin(void *p, size_t bytes) { return 0; }
static void cpu_host_unpin(void *p) {}

static int cpu_to_weights(void *w, const float *x, size_t n, void *stream)
{
    return cpu_copy(w, x, n * sizeof(float), stream);
}

static const backend_t table = {
    .name = "cpu",
    .model_new = cpu_model_new,
    .model_destroy = cpu_model_destroy,
    .acts_new = cpu_acts_new,
    .acts_destroy = cpu_acts_destroy,
    .forward = cpu_forward,
    .backward_b = cpu_backward_b,
    .backward_w = cpu_backward_w,
    .backward = cpu_backward,
    .step_begin = cpu_step_begin,
    .step_end = cpu_step_end,
    .loss_take = cpu_loss_take,
    .model_shard = cpu_model_shard,
    .model_stream = cpu_model_stream,
    .model_buffers = cpu_model_buffers,
    .mem_used = cpu_mem_used,
    .dev_select = cpu_dev_select,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .stream_new = cpu_stream_new,
    .stream_free = cpu_stream_free,
    .stream_sync = cpu_stream_sync,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .f32_add = cpu_f32_add,
    .block_sumsq = cpu_block_sumsq,
    .adamw = cpu_adamw,
    .to_weights = cpu_to_weights,
    .host_pin = cpu_host_pin,
    .host_unpin = cpu_host_unpin,
    .last_error = cpu_last_error,
};

const backend_t *backend_cpu(void) { return &table; }
