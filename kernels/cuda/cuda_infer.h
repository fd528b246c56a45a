/* KV-cache inference of the whole Llama model on the GPU, in fp32: `ctitan generate --device
 * cuda` (kernels/cuda/infer.cu). The GPU twin of kernels/cpu/infer.h: the same weights (the
 * flat fp32 space of kernels/params.h, copied to the device once), the same rotary tables (t *
 * config_rope_inv_freq, computed in double on the host and rounded once, so Llama 3.1's
 * frequency scaling applies), the same order of operations; only sums are ordered differently,
 * so logits agree with the CPU's to float rounding (tests/gpu/test_cuda_infer.c). fp32 rather
 * than training's bf16: generation is bound by reading the weights once per token, and greedy
 * text should be the CPU's (and transformers') text. */
#ifndef CTITAN_CUDA_INFER_H
#define CTITAN_CUDA_INFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/config.h"

typedef struct cuda_infer cuda_infer_t;

/* A model over the host weights w (kernels/params.h order, the whole model; copied, not kept)
 * with a cache of `capacity` positions (1..max_seq_len) and room for up to max_batch tokens a
 * call, on the calling thread's current device. cfg must be validated. Returns 0, -EINVAL for
 * bad sizes, or the CUDA error (cuda_err_text() says why). */
int cuda_infer_new(cuda_infer_t **out, const model_config_t *cfg, const float *w, int capacity, int max_batch);
void cuda_infer_destroy(cuda_infer_t **s);
/* Positions held in the cache (the next token's position). */
int cuda_infer_pos(const cuda_infer_t *s);
/* Device bytes held: weights, cache and buffers. */
size_t cuda_infer_bytes(const cuda_infer_t *s);
/* Runs tokens[0..n) (host ids < vocab_size, checked by the caller) at positions pos..pos+n-1,
 * appending their keys and values to the cache, and writes the last token's logits (vocab
 * floats) to the host array logits. Returns 0, -EINVAL when n or the position is out of range,
 * or the CUDA error. */
int cuda_infer_forward(cuda_infer_t *s, const int32_t *tokens, int n, float *logits);

#ifdef __cplusplus
}
#endif

#endif
