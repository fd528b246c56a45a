/* One table for everything a stage or an optimizer shard computes or keeps in its device's
 * memory: the model of a run of pieces (forward, backward B and W, the step's begin and end)
 * and the optimizer shard's vector work (sums of replicas, norms, AdamW, weights in the
 * backend's dtype). stages/ calls nothing else that depends on the device; the manifest's
 * device picks the table: "cpu" is built in (kernels/cpu/backend_cpu.c, over model.h and
 * ops.h), "cuda" comes from the plugin (kernels/cuda/plugin.cu, over cuda_model.h and
 * cuda_dev.h), so CPU jobs never load the CUDA libraries.
 *
 * Memory and dtypes: weights and hand-off slots (a microbatch's activations and their
 * gradients, [mb*T, dim]) live in the backend's memory and weight dtype: host fp32 on the CPU,
 * device bf16 on CUDA. Weight gradients and the optimizer's state are fp32 in both.
 * Streams: on CUDA a call that takes a stream only queues work on it (stream_sync waits); the
 * CPU backend finishes every call before it returns and its streams are NULL.
 * Every call returns 0 or a negative errno (-ENOMEM, -ENODEV, -EINVAL, -EIO) and last_error()
 * says why (this thread's last failure). */
#ifndef CTITAN_BACKEND_H
#define CTITAN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/config.h"
#include "kernels/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct backend_model backend_model_t; /* each backend defines its own */
typedef struct backend_acts backend_acts_t;

typedef struct {
    const char *name; /* "cpu", "cuda" */

    /* ---- the model of pieces [p0, p1) (params_piece_range order) ---- */
    /* host_w, host_g: the pieces' range of the shared parameters and gradients, or NULL; fp32,
     * or bf16 where cfg->host_bf16 says so (CUDA only). The CPU model computes on them in place
     * (both needed, fp32). CUDA keeps its weights and gradients on the device: with host_w,
     * step_begin uploads them from it and step_end writes the step's gradients into host_g
     * (offload: CPU optimizer shards); without, GPU optimizer shards update them in place
     * (model_buffers). threads: the CPU's. */
    int (*model_new)(backend_model_t **out, const model_config_t *cfg, int p0, int p1, void *host_w,
                     void *host_g, int threads);
    void (*model_destroy)(backend_model_t **m);
    /* Activation storage for one [B, T] microbatch. */
    int (*acts_new)(backend_acts_t **out, backend_model_t *m, int B, int T);
    void (*acts_destroy)(backend_acts_t **a);
    /* As model_forward (kernels/cpu/model.h): host tokens [B*T] with the embedding, else
     * x_in; host targets [B*T] with the head (*loss = the sum of per-token losses, gradients
     * scaled by dscale), else the output into x_out. x_in, x_out: hand-off slots. With the
     * head and loss NULL the sum is kept for loss_take instead: on CUDA the call then returns
     * without waiting for the device (no host synchronisation inside a step). */
    int (*forward)(backend_model_t *m, backend_acts_t *a, const int32_t *tokens, const void *x_in,
                   const int32_t *targets, float dscale, void *x_out, double *loss);
    /* As model_backward_b: dy (ignored with the head), dx unless the model holds the
     * embedding; hand-off slots. */
    int (*backward_b)(backend_model_t *m, backend_acts_t *a, const void *dy, void *dx);
    /* As model_backward_w: adds this microbatch's weight gradients. */
    int (*backward_w)(backend_model_t *m, backend_acts_t *a);
    /* As model_backward: backward_b then backward_w, the same bits; with activation
     * checkpointing ([activation_checkpoint], cfg->ac_mode) the stage calls it where W follows
     * B, so that each layer's W runs after its B and two layers' recomputes are alive at a time. */
    int (*backward)(backend_model_t *m, backend_acts_t *a, const void *dy, void *dx);
    /* Around a step's actions: the weights in place before, the gradients complete where the
     * optimizer shards read them after (see model_new). */
    int (*step_begin)(backend_model_t *m);
    int (*step_end)(backend_model_t *m);
    /* *loss = the kept sums of the forwards given loss NULL since the last loss_take or
     * step_begin, added in their order (each a token-ordered sum: the bits of adding forward's
     * *loss one after another), and none kept after it. */
    int (*loss_take)(backend_model_t *m, double *loss);
    /* Parameter sharding: the pieces' weights come from, and their weight gradients go to,
     * io (params.h shard_io_t) instead of the model's own; NULL: back to them. io's failure is
     * the failing call's return value (-ECANCELED: closed for a recovery). On CUDA the model
     * then holds only its part of the weights and gradients (model_config_t own_begin,
     * own_end: what model_buffers gives). */
    int (*model_shard)(backend_model_t *m, const shard_io_t *io);
    /* The stream hand-offs are ordered on (NULL on the CPU). */
    void *(*model_stream)(backend_model_t *m);
    /* The weights (backend dtype) and fp32 gradients of the held range [*begin, *end) of the
     * flat space, for the GPU planes and optimizer shards (CUDA: one allocation each, with
     * CUDA_MODEL_SLACK elements more; cuda_model.h). */
    void (*model_buffers)(backend_model_t *m, void **w, float **g, size_t *begin, size_t *end);
    /* Memory in use: on a GPU the current device's (every process on it), on the CPU this
     * process's peak resident set. */
    int (*mem_used)(size_t *bytes);

    /* ---- an optimizer shard's vectors (fp32 unless said) ---- */
    /* Binds the calling thread to device `ordinal` (modulo the count); *used = which (may be
     * NULL). The CPU has one device, 0. */
    int (*dev_select)(int ordinal, int *used);
    int (*alloc)(void **p, size_t bytes);
    int (*free)(void *p);
    int (*stream_new)(void **s);
    void (*stream_free)(void *s);
    int (*stream_sync)(void *s);
    /* bytes between any two of host and backend memory */
    int (*copy)(void *dst, const void *src, size_t bytes, void *stream);
    int (*zero)(void *dst, size_t bytes, void *stream);
    /* y[i] += x[i] */
    int (*f32_add)(float *y, const float *x, size_t n, void *stream);
    /* out[b] = sum over block b = [b*block, (b+1)*block) of x[0, n) of x[i]^2 as double, in a
     * fixed order, one on every backend (32 lanes and their butterfly: backend_cpu.c): the same
     * bits for the same block wherever it sits, and on the CPU and the GPU */
    int (*block_sumsq)(double *out, const float *x, size_t n, size_t block, void *stream);
    /* AdamW as torch.optim.AdamW (ops_adamw_to): reads w0, m0, v0, writes w, m, v (the same
     * arrays: in place; otherwise the sources are left untouched, and must not overlap the
     * outputs); the gradient is g * gscale rounded to float (the clip factor; where gscale_at is
     * not NULL, the float there in the backend's memory, read once the step runs). Beside them, when
     * not NULL: w_out = to_weights(w) (the weights a stage reads, in the backend's dtype) and
     * g_clear zeroed (g itself, or another array) once element i is read, the bits of the
     * separate calls in one pass over the state */
    int (*adamw)(float *w, float *m, float *v, const float *w0, const float *m0, const float *v0, const float *g,
                 float gscale, const float *gscale_at, size_t n, float lr, float beta1, float beta2, float eps,
                 float wd, int step, void *w_out, float *g_clear, void *stream);
    /* w[i] = x[i] in the backend's weight dtype (a copy on the CPU, bf16 round to nearest even
     * on CUDA) */
    int (*to_weights)(void *w, const float *x, size_t n, void *stream);
    /* Pins host memory [p, p + bytes) (a shared-memory segment's range) so that copies between
     * it and the device run at the bus's rate and asynchronously (CUDA: cudaHostRegister);
     * the CPU has nothing to do. host_unpin(p) undoes it before the memory goes. */
    int (*host_pin)(void *p, size_t bytes);
    void (*host_unpin)(void *p);

    const char *(*last_error)(void);
} backend_t;

/* The table of device "cpu" or "cuda" (kernels/cuda_plugin.h loads the plugin), valid until
 * the process exits; NULL with err saying why. */
const backend_t *backend_load(const char *device, char *err, size_t errlen);
/* The CPU's, built in. */
const backend_t *backend_cpu(void);

#ifdef __cplusplus
}
#endif

#endif
