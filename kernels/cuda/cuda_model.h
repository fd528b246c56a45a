/* The Llama model on one GPU for a run of pieces (kernels/model.h's CUDA twin): bf16 weights,
 * activations and activation gradients, fp32 accumulation, fp32 weight gradients, the same
 * forward / backward B / backward W split and the same equations as the CPU model, built
 * from the kernels of cuda_nn.h, cuda_attn.h and cuda_matmul.h.
 *
 * This first version talks to the rest of ctitan through host memory: weights are uploaded
 * from the fp32 flat space (rounded to bf16) once per step, gradients handed back as fp32,
 * and pipeline hand-offs (x_in, x_out, dy, dx) are host fp32 arrays, so a stage process can
 * keep using the shared-memory rings and the CPU optimizer shards ("offload" mode). CUDA IPC
 * rings and GPU optimizer shards come later (NOTES.md).
 *
 * Every function returns 0 or a negative errno-style code (-EINVAL, -ENODEV, -ENOMEM, -EIO)
 * and cuda_model_last_error() says why. Not thread-safe: one model per thread. */
#ifndef CTITAN_CUDA_MODEL_H
#define CTITAN_CUDA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_model cuda_model_t;
typedef struct cuda_model_acts cuda_model_acts_t;

/* Pieces [p0, p1) of a validated config on the current device (params_piece_range order).
 * Head dimensions other than 16, 32, 64 and 128 are refused (the attention kernel's). */
int cuda_model_new(cuda_model_t **out, const model_config_t *cfg, int p0, int p1);
void cuda_model_destroy(cuda_model_t **m);

/* Weights of the held pieces from host fp32 (the pieces' range of the flat space). */
int cuda_model_set_weights(cuda_model_t *m, const float *host);
/* Writes the weight gradients accumulated since the last call (fp32, the pieces' range of the
 * flat space) into host, and zeroes them on the device. */
int cuda_model_take_grads(cuda_model_t *m, float *host);

/* Device activation storage for one [B, T] microbatch. */
int cuda_model_acts_new(cuda_model_acts_t **out, const cuda_model_t *m, int B, int T);
void cuda_model_acts_destroy(cuda_model_acts_t **a);

/* As model_forward: tokens [B*T] with the embedding, else x_in [B*T, dim]; with the head and
 * targets, *loss is the sum of per-token losses (gradients scaled by dscale); without the head
 * x_out [B*T, dim] receives the output. Host arrays; returns when done. */
int cuda_model_forward(cuda_model_t *m, cuda_model_acts_t *a, const int32_t *tokens, const float *x_in,
                       const int32_t *targets, float dscale, float *x_out, double *loss);
/* As model_backward_b: dy [B*T, dim] (ignored with the head), dx [B*T, dim] unless the model
 * holds the embedding. Host arrays; returns when dx is written. */
int cuda_model_backward_b(cuda_model_t *m, cuda_model_acts_t *a, const float *dy, float *dx);
/* As model_backward_w: adds this microbatch's weight gradients into the device gradients. */
int cuda_model_backward_w(cuda_model_t *m, cuda_model_acts_t *a);

const char *cuda_model_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
