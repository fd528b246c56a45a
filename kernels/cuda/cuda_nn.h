/* C declarations of the bf16 CUDA kernels of the Llama layers (kernels/cuda/{embed,rmsnorm,rope,
 * swiglu,xent}.cu): the GPU twins of the ops in kernels/ops.h, with the same shapes, layouts and
 * "adds into" conventions. Activations, weights and their gradients live as bf16 (uint16_t
 * here: the top 16 bits of an fp32, rounded to nearest even), every sum runs in fp32, and the
 * gradients that are summed over tokens (dtable, dw) are fp32.
 *
 * Every launcher queues its work on `stream` (NULL: the legacy default stream), checks its
 * arguments and the launch, and returns 0, -EINVAL (bad shape or NULL pointer; nothing is
 * launched), -ENODEV (no usable device) or -EIO (other CUDA error). The message of the last
 * failure in the calling thread is cuda_nn_last_error() (cuda_last_error() of cuda_ops.h only
 * covers adamw.cu). All pointers except the host helpers' are device pointers.
 *
 * Determinism: no atomics; every output element is computed by one thread in an order fixed
 * by the shape, so results are bitwise the same from run to run. */
#ifndef CTITAN_CUDA_NN_H
#define CTITAN_CUDA_NN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Host helpers: fp32 -> bf16 rounds to nearest even (NaN stays a quiet NaN of the same sign,
 * overflow gives inf), bf16 -> fp32 is exact. Same rounding as the kernels use. */
void cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n);

/* Text of the last failure of a launcher below in this thread. */
const char *cuda_nn_last_error(void);

/* out[n,:] = table[tok[n],:]; table [V,D], out [N,D]. A token outside [0,V) gives a row of
 * zeros (the host cannot check device tokens without a sync; this keeps memory safe). */
int cuda_embed_fwd(uint16_t *out, const uint16_t *table, const int32_t *tok, int N, int V, int D,
                   void *stream);
/* dtable[tok[n],:] += dout[n,:] (adds into fp32 dtable [V,D]); each row receives its tokens in
 * token order, so the bits equal ops_embed_bwd's on the same values. Tokens outside [0,V) are
 * ignored. */
int cuda_embed_bwd(float *dtable, const uint16_t *dout, const int32_t *tok, int N, int V, int D,
                   void *stream);

/* out = x * rstd * w, rstd[n] = 1/sqrt(mean(x[n,:]^2) + eps); x, out [N,D], w [D], rstd [N]
 * fp32. out may alias x. */
int cuda_rmsnorm_fwd(uint16_t *out, float *rstd, const uint16_t *x, const uint16_t *w, int N, int D,
                     float eps, void *stream);
/* Input gradient dx = r g - r^3 x (g.x)/D with g = dout*w (see ref_rmsnorm_bwd_x), plus res
 * when res is not NULL (one bf16 rounding of res + new, as ops_rmsnorm_bwd_x's accumulation):
 * res = dx adds into dx, another array adds the residual's gradient on the way (the model's
 * dh1 = df + ..., without a copy of df into dh1 first). */
int cuda_rmsnorm_bwd_x(uint16_t *dx, const uint16_t *dout, const uint16_t *x, const float *rstd,
                       const uint16_t *w, int N, int D, const uint16_t *res, void *stream);
/* Weight gradient dw[i] += sum_n dout[n,i] * x[n,i] * rstd[n] (fp32 dw [D], adds into). */
int cuda_rmsnorm_bwd_w(float *dw, const uint16_t *dout, const uint16_t *x, const float *rstd, int N,
                       int D, void *stream);

/* Rotary tables fp32 [T, hd/2] as ops_rope_table: angle = t * theta^(-2i/hd), computed in
 * double on the device and rounded once. hd must be even. */
int cuda_rope_table(float *cos, float *sin, int T, int hd, double theta, void *stream);
/* The same from given inverse frequencies (config_rope_inv_freq: Llama 3.1's rotary scaling),
 * inv_freq a device array of hd/2 doubles: angle = t * inv_freq[i], in double, rounded once
 * (ops_rope_table_freq's bits). */
int cuda_rope_table_freq(float *cos, float *sin, int T, int hd, const double *inv_freq, void *stream);
/* Rotates every head of x [B,T,H,hd] in place, Hugging Face rotate_half (pairs i, i+hd/2):
 *   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin. */
int cuda_rope_fwd(uint16_t *x, const float *cos, const float *sin, int B, int T, int H, int hd,
                  void *stream);
/* Backward of cuda_rope_fwd, in place on the gradient (the inverse rotation). */
int cuda_rope_bwd(uint16_t *dx, const float *cos, const float *sin, int B, int T, int H, int hd,
                  void *stream);

/* m = silu(a) * b over n elements. m may alias a or b. */
int cuda_swiglu_fwd(uint16_t *m, const uint16_t *a, const uint16_t *b, size_t n, void *stream);
/* da = dm * b * silu'(a), db = dm * silu(a). da, db may alias a, b, dm element for element. */
int cuda_swiglu_bwd(uint16_t *da, uint16_t *db, const uint16_t *dm, const uint16_t *a,
                    const uint16_t *b, size_t n, void *stream);

/* Fused softmax cross-entropy over bf16 logits [N,V], as ops_xent: loss[n] (fp32) =
 * logsumexp(logits[n,:]) - logits[n,targets[n]] (the caller sums the N losses);
 * dlogits (bf16) = (softmax - onehot) * dscale. dlogits may alias logits. A target outside
 * [0,V) gives loss NaN (so it shows in the sum) and a dlogits row without the onehot. */
int cuda_xent(uint16_t *dlogits, float *loss, const uint16_t *logits, const int32_t *targets, int N,
              int V, float dscale, void *stream);

#ifdef __cplusplus
}
#endif

#endif
