// The CUDA plugin's table (cuda_plugin.h): the CUDA backend of kernels/backend.h over
// cuda_model.h (hand-offs as device bf16, only queued on the model's stream) and the optimizer
// kernels of cuda_dev.h / cuda_ops.h, then the CUDA-only calls of the GPU data planes.
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_model.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_plugin.h"

struct backend_model {
    cuda_model_t *m;
    void *host_w, *host_g;  /* offload: the shared weights and gradients of the range */
    int host_bf16;          /* they are bf16 (optshard.offload_dtype), else fp32 */
    void *pinned[2];        /* their pages pinned (cuda_host_pin), or NULL */
};

static cuda_model_acts_t *acts_of(backend_acts_t *a) { return (cuda_model_acts_t *)a; }

/* Offload: the range's pages of the shared weights and gradients pinned, so that the step's
 * upload and download run at the bus's rate (pageable copies go through the driver's staging
 * at a fraction of it). Where pinning fails the copies still work, pageable. */
static void pin_host(backend_model_t *m)
{
    uint16_t *w16;
    float *g;
    size_t b, e, page = (size_t)sysconf(_SC_PAGESIZE);
    cuda_model_buffers(m->m, &w16, &g, &b, &e);
    char *host[2] = {(char *)m->host_w, (char *)m->host_g};
    size_t bytes = (e - b) * (m->host_bf16 ? sizeof(uint16_t) : sizeof(float));
    for (int k = 0; k < 2 && e > b; k++) {
        uintptr_t lo = (uintptr_t)host[k] / page * page, hi = ((uintptr_t)(host[k] + bytes) + page - 1) / page * page;
        if (cuda_host_pin((void *)lo, hi - lo) == 0)
            m->pinned[k] = (void *)lo;
    }
}

static void be_model_destroy(backend_model_t **pm)
{
    backend_model_t *m = *pm;
    if (!m)
        return;
    for (int k = 0; k < 2; k++)
        if (m->pinned[k])
            cuda_host_unpin(m->pinned[k]);
    cuda_model_destroy(&m->m);
    free(m);
    *pm = NULL;
}

static int be_model_new(backend_model_t **out, const model_config_t *cfg, int p0, int p1, void *host_w,
                        void *host_g, int threads)
{
    *out = NULL;
    if (!host_w != !host_g)
        return cuda_err(-EINVAL, "offload needs both the shared weights and the shared gradients");
    backend_model_t *m = (backend_model_t *)calloc(1, sizeof(*m));
    if (!m)
        return cuda_err(-ENOMEM, "out of memory");
    m->host_w = host_w, m->host_g = host_g, m->host_bf16 = cfg->host_bf16;
    int rc = cuda_model_new(&m->m, cfg, p0, p1);
    if (rc) {
        free(m);
        return rc;
    }
    if (host_w)
        pin_host(m);
    *out = m;
    return 0;
}

static int be_acts_new(backend_acts_t **out, backend_model_t *m, int B, int T)
{
    return cuda_model_acts_new((cuda_model_acts_t **)out, m->m, B, T);
}

static void be_acts_destroy(backend_acts_t **a) { cuda_model_acts_destroy((cuda_model_acts_t **)a); }

static int be_forward(backend_model_t *m, backend_acts_t *a, const int32_t *tokens, const void *x_in,
                      const int32_t *targets, float dscale, void *x_out, double *loss)
{
    return cuda_model_forward_dev(m->m, acts_of(a), tokens, (const uint16_t *)x_in, targets, dscale,
                                  (uint16_t *)x_out, loss);
}

static int be_backward_b(backend_model_t *m, backend_acts_t *a, const void *dy, void *dx)
{
    return cuda_model_backward_b_dev(m->m, acts_of(a), (const uint16_t *)dy, (uint16_t *)dx);
}

static int be_backward_w(backend_model_t *m, backend_acts_t *a) { return cuda_model_backward_w(m->m, acts_of(a)); }

static int be_backward(backend_model_t *m, backend_acts_t *a, const void *dy, void *dx)
{
    return cuda_model_backward_dev(m->m, acts_of(a), (const uint16_t *)dy, (uint16_t *)dx);
}

/* offload: this step's weights, as the CPU optimizer shards left them */
static int be_step_begin(backend_model_t *m)
{
    cuda_model_loss_drop(m->m);
    if (!m->host_w)
        return 0;
    return m->host_bf16 ? cuda_model_set_weights_bf16(m->m, (const uint16_t *)m->host_w)
                        : cuda_model_set_weights(m->m, (const float *)m->host_w);
}

static int be_loss_take(backend_model_t *m, double *loss) { return cuda_model_loss_take(m->m, loss); }

/* The step's gradients complete where the optimizer shards read them: handed back to the host
 * (offload), or on the device once the stream has run. */
static int be_step_end(backend_model_t *m)
{
    if (!m->host_g)
        return cuda_model_sync(m->m);
    return m->host_bf16 ? cuda_model_take_grads_bf16(m->m, (uint16_t *)m->host_g)
                        : cuda_model_take_grads(m->m, (float *)m->host_g);
}

static void *be_model_stream(backend_model_t *m) { return cuda_model_stream(m->m); }

static int be_model_shard(backend_model_t *m, const shard_io_t *io)
{
    if (io && m->host_w)
        return cuda_err(-EINVAL, "parameter sharding with offload (optshard.device = \"cpu\") is not built");
    return cuda_model_shard(m->m, io);
}

static void be_model_buffers(backend_model_t *m, void **w, float **g, size_t *begin, size_t *end)
{
    uint16_t *w16;
    cuda_model_buffers(m->m, &w16, g, begin, end);
    *w = w16;
}

static int be_mem_used(size_t *bytes)
{
    size_t total;
    return cuda_dev_mem(bytes, &total);
}

static int be_adamw(float *w, float *m, float *v, const float *w0, const float *m0, const float *v0, const float *g,
                    float gscale, const float *gscale_at, size_t n, float lr, float beta1, float beta2, float eps,
                    float wd, int step, void *w_out, float *g_clear, void *stream)
{
    return cuda_adamw(w, m, v, w0, m0, v0, g, gscale, gscale_at, n, lr, beta1, beta2, eps, wd, step, (uint16_t *)w_out,
                      g_clear, stream);
}

static int be_to_weights(void *w, const float *x, size_t n, void *stream)
{
    return cuda_f32_to_bf16_dev((uint16_t *)w, x, n, stream);
}

static const cuda_plugin_t table = {
    CUDA_PLUGIN_VERSION,
    {
        "cuda",
        be_model_new, be_model_destroy, be_acts_new, be_acts_destroy, be_forward, be_backward_b, be_backward_w, be_backward,
        be_step_begin, be_step_end, be_loss_take, be_model_shard, be_model_stream, be_model_buffers, be_mem_used,
        cuda_dev_select, cuda_alloc, cuda_free, cuda_stream_new, cuda_stream_free, cuda_stream_sync,
        cuda_copy_async, cuda_zero_async, cuda_f32_add, cuda_block_sumsq, be_adamw,
        be_to_weights, cuda_host_pin, cuda_host_unpin,
        cuda_err_text,
    },
    cuda_device_count,
    cuda_ipc_export, cuda_ipc_alloc, cuda_ipc_open, cuda_ipc_close, cuda_ipc_event_new, cuda_ipc_event_open,
    cuda_event_free, cuda_event_record, cuda_stream_wait,
    cuda_nccl_id, cuda_nccl_init, cuda_nccl_destroy, cuda_nccl_send, cuda_nccl_recv, cuda_nccl_reduce_scatter_f32,
    cuda_nccl_all_gather_bf16, cuda_nccl_broadcast_bf16, cuda_nccl_reduce_f32,
    cuda_err_text,
    cuda_infer_new, cuda_infer_destroy, cuda_infer_forward,
    cuda_nccl_reduce_bf16, cuda_f32_add_bf16,
    cuda_norm_clip, cuda_event_sync,
};

extern "C" const cuda_plugin_t *ctitan_cuda_plugin(void) { return &table; }
