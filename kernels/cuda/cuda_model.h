/* The Llama model on one GPU for a run of pieces (kernels/cpu/model.h's CUDA twin): bf16 weights,
 * activations and activation gradients, fp32 accumulation, fp32 weight gradients, the same
 * forward / backward B / backward W split and the same equations as the CPU model, built
 * from the kernels of cuda_nn.h, cuda_attn.h and cuda_matmul.h.
 *
 * Two ways to talk to the rest of ctitan: through host memory (weights uploaded from the fp32
 * flat space once per step, gradients handed back as fp32, hand-offs as host fp32 arrays: the
 * CPU test bed and offload mode), or on the device (the *_dev calls and cuda_model_buffers:
 * CUDA IPC rings between stages, optimizer shards updating the weights in place).
 *
 * Every function returns 0 or a negative errno-style code (-EINVAL, -ENODEV, -ENOMEM, -EIO)
 * and cuda_model_last_error() says why. Not thread-safe: one model per thread. */
#ifndef CTITAN_CUDA_MODEL_H
#define CTITAN_CUDA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/config.h"
#include "kernels/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_model cuda_model_t;
typedef struct cuda_model_acts cuda_model_acts_t;

/* Pieces [p0, p1) of a validated config on the current device (params_piece_range order).
 * Head dimensions other than 16, 32, 64 and 128 are refused (the attention kernel's). */
int cuda_model_new(cuda_model_t **out, const model_config_t *cfg, int p0, int p1);
void cuda_model_destroy(cuda_model_t **m);

/* Weights of the held pieces from host fp32 (the pieces' range of the flat space). They pass
 * through the gradient buffer, so the weight gradients start over at zero. */
int cuda_model_set_weights(cuda_model_t *m, const float *host);
/* Writes the weight gradients accumulated since the last call (fp32, the pieces' range of the
 * flat space) into host, and zeroes them on the device. */
int cuda_model_take_grads(cuda_model_t *m, float *host);
/* The same with bf16 host copies (optshard.offload_dtype "bfloat16"): the weights uploaded as
 * they are (the gradients zeroed); the gradients rounded to bf16 on the device into the
 * weights' buffer, which holds nothing of use until the next upload, and copied from there. */
int cuda_model_set_weights_bf16(cuda_model_t *m, const uint16_t *host);
int cuda_model_take_grads_bf16(cuda_model_t *m, uint16_t *host);

/* Device activation storage for one [B, T] microbatch, per layer what cfg->ac_mode keeps
 * (config_ac_keep); with activation checkpointing the model's first shared work sets are made
 * here too (model_work_bytes in kernels/cpu/model.h says which). Destroy every acts before the
 * model. */
int cuda_model_acts_new(cuda_model_acts_t **out, cuda_model_t *m, int B, int T);
void cuda_model_acts_destroy(cuda_model_acts_t **a);
/* Device bytes of one microbatch's storage (model_act_bytes, kernels/act_bytes.h, with
 * MODEL_ACT_CUDA says the same beforehand), and of the model's recompute work sets (as
 * model_work_bytes in kernels/cpu/model.h) and the head's logits chunk (model_act_size_t head). */
size_t cuda_model_acts_bytes(const cuda_model_acts_t *a);
size_t cuda_model_work_bytes(const cuda_model_t *m);

/* As model_forward: tokens [B*T] with the embedding, else x_in [B*T, dim]; with the head and
 * targets, *loss is the sum of per-token losses (gradients scaled by dscale); without the head
 * x_out [B*T, dim] receives the output. Host arrays; returns when done (with the head and loss
 * NULL: once queued, the sum kept for cuda_model_loss_take). With the head and targets it also
 * runs the head's own backward, B and W (its weight gradients added here, unless the model is
 * forward_only): the logits are made a chunk at a time and never kept (model.cu head_forward). */
int cuda_model_forward(cuda_model_t *m, cuda_model_acts_t *a, const int32_t *tokens, const float *x_in,
                       const int32_t *targets, float dscale, float *x_out, double *loss);
/* As model_backward_b: dy [B*T, dim] (ignored with the head), dx [B*T, dim] unless the model
 * holds the embedding. Host arrays; returns when dx is written. */
int cuda_model_backward_b(cuda_model_t *m, cuda_model_acts_t *a, const float *dy, float *dx);
/* As model_backward_w: adds this microbatch's weight gradients into the device gradients
 * (queued; cuda_model_take_grads or cuda_model_sync waits for it). */
int cuda_model_backward_w(cuda_model_t *m, cuda_model_acts_t *a);
/* B then W of one microbatch (model_backward: the same bits; with activation checkpointing
 * each layer's W right after its B, two layers' recomputed tensors alive at a time). */
int cuda_model_backward(cuda_model_t *m, cuda_model_acts_t *a, const float *dy, float *dx);

/* The GPU data plane (stages/roles/stage.c without host hand-offs): the same two calls with device
 * bf16 hand-offs x_in, x_out, dy, dx ((B*T, dim) each, e.g. CUDA IPC ring slots). They only
 * queue work on the model's stream (the head's forward waits for its loss unless it is kept):
 * order other streams and processes after them with an event recorded on cuda_model_stream(). */
int cuda_model_forward_dev(cuda_model_t *m, cuda_model_acts_t *a, const int32_t *tokens, const uint16_t *x_in,
                           const int32_t *targets, float dscale, uint16_t *x_out, double *loss);
int cuda_model_backward_b_dev(cuda_model_t *m, cuda_model_acts_t *a, const uint16_t *dy, uint16_t *dx);
int cuda_model_backward_dev(cuda_model_t *m, cuda_model_acts_t *a, const uint16_t *dy, uint16_t *dx);
/* Waits for everything queued on the model's stream. */
int cuda_model_sync(cuda_model_t *m);
/* *loss = the sums kept by the forwards given loss NULL since the last take or drop, added in
 * their order (backend.h loss_take); waits for the model's stream once, if any was kept. Drop
 * forgets them (a step begun again). */
int cuda_model_loss_take(cuda_model_t *m, double *loss);
void cuda_model_loss_drop(cuda_model_t *m);
void *cuda_model_stream(cuda_model_t *m);
/* The device weights (bf16) and weight gradients (fp32) of the held range [*begin, *end) of the
 * flat space, each one cudaMalloc'ed block (so it can be exported with cuda_ipc_export) with
 * CUDA_MODEL_SLACK elements past the end (zero at first): room for the NCCL data plane's
 * reduce-scatter and all-gather, which take dp equal chunks (dp - 1 elements over at most). */
#define CUDA_MODEL_SLACK 4096
void cuda_model_buffers(cuda_model_t *m, uint16_t **w, float **g, size_t *begin, size_t *end);
/* Parameter sharding (backend_t.model_shard): a model made with cfg own_begin, own_end holds
 * only that part of its range (cuda_model_buffers says which); each piece's weights come from
 * io->weights before its forward and backward B, and each piece's weight gradients go to
 * io->take's buffer and io->give after its W (params.h shard_io_t). NULL: none (whole only). */
int cuda_model_shard(cuda_model_t *m, const shard_io_t *io);

const char *cuda_model_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
