/* C declarations of the fused causal grouped-query attention on the GPU (kernels/cuda/attn.cu):
 * bf16 tensors, fp32 softmax and accumulation, no T x T matrix in memory. Same math as
 * ref_attn_fwd / ref_attn_bwd (kernels/ref/ref_attn.c): query head h reads kv head h / (H/Hkv),
 * key j is seen by query i when j <= i, scale 1/sqrt(hd). */
#ifndef CTITAN_CUDA_ATTN_H
#define CTITAN_CUDA_ATTN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Forward. Device pointers, bf16 stored as uint16_t, each 16-byte aligned:
 *   q [B,T,H,hd], k and v [B,T,Hkv,hd]  ->  out [B,T,H,hd] and
 *   lse [B,H,T] fp32: natural log of sum_{j<=t} exp(q_t . k_j / sqrt(hd)), kept for the backward.
 * H % Hkv == 0; hd 16, 32, 64 or 128. stream may be NULL. Returns 0, -EINVAL (bad arguments),
 * -ENODEV (no usable device) or -EIO (CUDA error); cuda_attn_last_error() says why. */
int cuda_attn_fwd(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                  const uint16_t *v, int B, int T, int H, int Hkv, int hd, void *stream);

/* Backward of cuda_attn_fwd: from dout [B,T,H,hd] and the forward's inputs, out and lse, writes
 * dq [B,T,H,hd], dk and dv [B,T,Hkv,hd] (overwritten, not accumulated). delta [B,H,T] fp32 is
 * caller-owned scratch (rowsum(dout * out)), overwritten. Deterministic: the same inputs give
 * the same bits. Same shape rules and return codes as the forward. */
int cuda_attn_bwd(uint16_t *dq, uint16_t *dk, uint16_t *dv, float *delta, const uint16_t *dout,
                  const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *out,
                  const float *lse, int B, int T, int H, int Hkv, int hd, void *stream);

/* Text of the last error a cuda_attn_* launcher returned in this thread. */
const char *cuda_attn_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
