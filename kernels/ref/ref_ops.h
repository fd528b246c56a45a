/* Plain double-precision reference implementations of every op in kernels/ops.h:
 * obvious loops, no threads, no BLAS. The tests check the fast ops against these and
 * check these backwards by finite differences. Same argument meaning as kernels/ops.h. */
#ifndef CTITAN_REF_OPS_H
#define CTITAN_REF_OPS_H

#include <stddef.h>
#include <stdint.h>

void ref_embed_fwd(double *out, const double *table, const int32_t *tok, int N, int D);
void ref_embed_bwd(double *dtable, const double *dout, const int32_t *tok, int N, int D);

void ref_rmsnorm_fwd(double *out, double *rstd, const double *x, const double *w, int N, int D,
                     double eps);
void ref_rmsnorm_bwd_x(double *dx, const double *dout, const double *x, const double *rstd,
                       const double *w, int N, int D);
void ref_rmsnorm_bwd_w(double *dw, const double *dout, const double *x, const double *rstd, int N,
                       int D);

void ref_matmul_fwd(double *y, const double *x, const double *w, int N, int Din, int Dout);
void ref_matmul_bwd_x(double *dx, const double *dy, const double *w, int N, int Din, int Dout,
                      int accumulate);
void ref_matmul_bwd_w(double *dw, const double *dy, const double *x, int N, int Din, int Dout);

void ref_rope_table(double *cos, double *sin, int T, int hd, double theta);
/* angle = t * inv_freq[i] (config_rope_inv_freq: rotary scaling included) */
void ref_rope_table_freq(double *cos, double *sin, int T, int hd, const double *inv_freq);
void ref_rope_fwd(double *x, const double *cos, const double *sin, int B, int T, int H, int hd);
void ref_rope_bwd(double *dx, const double *cos, const double *sin, int B, int T, int H, int hd);

void ref_attn_fwd(double *y, double *probs, const double *q, const double *k, const double *v, int B,
                  int T, int Hq, int Hkv, int hd);
void ref_attn_bwd(double *dq, double *dk, double *dv, const double *dy, const double *probs,
                  const double *q, const double *k, const double *v, int B, int T, int Hq, int Hkv,
                  int hd);

void ref_swiglu_fwd(double *m, const double *a, const double *b, size_t n);
void ref_swiglu_bwd(double *da, double *db, const double *dm, const double *a, const double *b,
                    size_t n);

void ref_xent(double *dlogits, double *loss, const double *logits, const int32_t *targets, int N,
              int V, double dscale);

void ref_adamw(double *param, const double *grad, double *m, double *v, size_t n, double lr,
               double beta1, double beta2, double eps, double wd, int step);

#endif
