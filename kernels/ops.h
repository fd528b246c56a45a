/* The model's ops on the CPU (fp32, OpenBLAS for matrix products, a deterministic pool
 * for threads). Each has a double-precision twin in kernels/ref/ref_ops.h that the tests
 * compare against; every backward op is also checked by finite differences.
 *
 * Conventions (all row-major, contiguous):
 *   N = B*T tokens, token n = b*T + t.  Activations are [N, C].
 *   q is [N, Hq*hd] = [B, T, Hq, hd]; k and v are [N, Hkv*hd].  Hq % Hkv == 0, query head h
 *   reads kv head h / (Hq/Hkv).  probs is [B, Hq, T, T] (entries above the diagonal are 0).
 *   (No parameter is called I: OpenBLAS headers pull in <complex.h>, which defines I.)
 *   Linear weights are [out, in] as in PyTorch/Hugging Face: y = x W^T.
 *   "adds into" means the output is accumulated (+=), otherwise it is overwritten.
 * Results are bitwise identical for any pool size (pool may be NULL: single thread). */
#ifndef CTITAN_OPS_H
#define CTITAN_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/pool.h"

/* out[n,:] = table[tok[n],:].  table [V,D].  Token ids must be in [0, V) (caller checks). */
void ops_embed_fwd(pool_t *p, float *out, const float *table, const int32_t *tok, int N, int D);
/* dtable[tok[n],:] += dout[n,:] (adds into dtable, in token order for every row). */
void ops_embed_bwd(pool_t *p, float *dtable, const float *dout, const int32_t *tok, int N, int D);

/* out = x * rstd * w, rstd[n] = 1/sqrt(mean(x[n,:]^2) + eps). */
void ops_rmsnorm_fwd(pool_t *p, float *out, float *rstd, const float *x, const float *w, int N, int D,
                     float eps);
/* Input gradient, adds into dx. */
void ops_rmsnorm_bwd_x(pool_t *p, float *dx, const float *dout, const float *x, const float *rstd,
                       const float *w, int N, int D);
/* Weight gradient: dw[i] += sum_n dout[n,i] * x[n,i] * rstd[n]. */
void ops_rmsnorm_bwd_w(pool_t *p, float *dw, const float *dout, const float *x, const float *rstd,
                       int N, int D);

/* y[N,Dout] = x[N,Din] w[Dout,Din]^T. */
void ops_matmul_fwd(pool_t *p, float *y, const float *x, const float *w, int N, int Din, int Dout);
/* dx[N,Din] = dy[N,Dout] w[Dout,Din]; adds into dx when accumulate != 0. */
void ops_matmul_bwd_x(pool_t *p, float *dx, const float *dy, const float *w, int N, int Din, int Dout,
                      int accumulate);
/* dw[Dout,Din] += dy[N,Dout]^T x[N,Din]. */
void ops_matmul_bwd_w(pool_t *p, float *dw, const float *dy, const float *x, int N, int Din, int Dout);

/* Rotary table, Hugging Face convention: for t < T, i < hd/2,
 * angle = t * theta^(-2i/hd); cos[t*hd/2 + i], sin[...]. */
void ops_rope_table(float *cos, float *sin, int T, int hd, double theta);
/* The same with the inverse frequencies given (hd/2 of them: config_rope_inv_freq, which
 * with no rotary scaling is theta^(-2i/hd) exactly, so both tables are the same bits):
 * angle = t * inv_freq[i]. */
void ops_rope_table_freq(float *cos, float *sin, int T, int hd, const double *inv_freq);
/* Rotates every head of x [B,T,H,hd] in place by position t (rotate_half pairs i, i+hd/2):
 *   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin. */
void ops_rope_fwd(pool_t *p, float *x, const float *cos, const float *sin, int B, int T, int H, int hd);
/* Backward of ops_rope_fwd, in place on the gradient (the inverse rotation). */
void ops_rope_bwd(pool_t *p, float *dx, const float *cos, const float *sin, int B, int T, int H, int hd);

/* Causal grouped-query attention, scale 1/sqrt(hd): y [N, Hq*hd], probs [B,Hq,T,T]. */
void ops_attn_fwd(pool_t *p, float *y, float *probs, const float *q, const float *k, const float *v,
                  int B, int T, int Hq, int Hkv, int hd);
/* Writes dq [N,Hq*hd], dk and dv [N,Hkv*hd] from dy [N,Hq*hd]. */
void ops_attn_bwd(pool_t *p, float *dq, float *dk, float *dv, const float *dy, const float *probs,
                  const float *q, const float *k, const float *v, int B, int T, int Hq, int Hkv, int hd);

/* m = silu(a) * b over n elements. */
void ops_swiglu_fwd(pool_t *p, float *m, const float *a, const float *b, size_t n);
/* da = dm * b * silu'(a), db = dm * silu(a). */
void ops_swiglu_bwd(pool_t *p, float *da, float *db, const float *dm, const float *a, const float *b,
                    size_t n);

/* Fused softmax cross-entropy over logits [N,V] with targets in [0,V):
 * loss[n] = logsumexp(logits[n,:]) - logits[n,target[n]];
 * dlogits = (softmax - onehot) * dscale (dscale = 1/tokens in the global batch for a mean).
 * dlogits may alias logits. */
void ops_xent(pool_t *p, float *dlogits, float *loss, const float *logits, const int32_t *targets,
              int N, int V, float dscale);

/* AdamW as torch.optim.AdamW: p -= lr*wd*p; m,v moments; bias-corrected step (step >= 1).
 * Reads param0, m0, v0 and writes param, m, v: each output either is its source (in place)
 * or overlaps no source, and then the sources are left untouched (an optimizer that keeps
 * two banks of state). The same bits either way. The gradient is grad[i] * gscale, rounded to
 * float as a scaled copy would hold it (the clip factor, applied without writing the gradient:
 * 1 for none), so grad is only read. */
void ops_adamw_to(pool_t *p, float *param, float *m, float *v, const float *param0, const float *m0,
                  const float *v0, const float *grad, float gscale, size_t n, float lr, float beta1, float beta2,
                  float eps, float wd, int step);
/* ops_adamw_to in place, gradient unscaled. */
void ops_adamw(pool_t *p, float *param, const float *grad, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float wd, int step);

#endif
