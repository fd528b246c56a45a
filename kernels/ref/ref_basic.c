/* Double-precision references for the non-attention ops of kernels/ops.h (embedding, RMSNorm,
 * linear layers, SwiGLU, softmax cross-entropy, AdamW): obvious loops, no threads, no BLAS.
 * tests/test_ops_basic.c checks the fast fp32 ops against these and these by finite differences. */
#include "kernels/ref/ref_ops.h"

#include <math.h>
#include <string.h>

void ref_embed_fwd(double *out, const double *table, const int32_t *tok, int N, int D)
{
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * D, table + (size_t)tok[n] * D, (size_t)D * sizeof(double));
}

void ref_embed_bwd(double *dtable, const double *dout, const int32_t *tok, int N, int D)
{
    for (int n = 0; n < N; n++)
        for (int i = 0; i < D; i++)
            dtable[(size_t)tok[n] * D + i] += dout[(size_t)n * D + i];
}

void ref_rmsnorm_fwd(double *out, double *rstd, const double *x, const double *w, int N, int D,
                     double eps)
{
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * D;
        double ss = 0;
        for (int i = 0; i < D; i++)
            ss += xr[i] * xr[i];
        double r = 1.0 / sqrt(ss / D + eps);
        rstd[n] = r;
        for (int i = 0; i < D; i++)
            out[(size_t)n * D + i] = xr[i] * r * w[i];
    }
}

/* y_i = x_i r w_i with r = (mean(x^2)+eps)^-1/2, dr/dx_j = -r^3 x_j / D, so with g = dout*w:
 * dx_j = r g_j - r^3 x_j (sum_i g_i x_i) / D. */
void ref_rmsnorm_bwd_x(double *dx, const double *dout, const double *x, const double *rstd,
                       const double *w, int N, int D)
{
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * D, *gr = dout + (size_t)n * D;
        double r = rstd[n], dot = 0;
        for (int i = 0; i < D; i++)
            dot += gr[i] * w[i] * xr[i];
        for (int i = 0; i < D; i++)
            dx[(size_t)n * D + i] += r * gr[i] * w[i] - r * r * r * xr[i] * dot / D;
    }
}

void ref_rmsnorm_bwd_w(double *dw, const double *dout, const double *x, const double *rstd, int N,
                       int D)
{
    for (int n = 0; n < N; n++)
        for (int i = 0; i < D; i++)
            dw[i] += dout[(size_t)n * D + i] * x[(size_t)n * D + i] * rstd[n];
}

void ref_matmul_fwd(double *y, const double *x, const double *w, int N, int I, int O)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double s = 0;
            for (int i = 0; i < I; i++)
                s += x[(size_t)n * I + i] * w[(size_t)o * I + i];
            y[(size_t)n * O + o] = s;
        }
}

void ref_matmul_bwd_x(double *dx, const double *dy, const double *w, int N, int I, int O,
                      int accumulate)
{
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) {
            double s = 0;
            for (int o = 0; o < O; o++)
                s += dy[(size_t)n * O + o] * w[(size_t)o * I + i];
            dx[(size_t)n * I + i] = accumulate ? dx[(size_t)n * I + i] + s : s;
        }
}

void ref_matmul_bwd_w(double *dw, const double *dy, const double *x, int N, int I, int O)
{
    for (int o = 0; o < O; o++)
        for (int i = 0; i < I; i++) {
            double s = 0;
            for (int n = 0; n < N; n++)
                s += dy[(size_t)n * O + o] * x[(size_t)n * I + i];
            dw[(size_t)o * I + i] += s;
        }
}

static double sigmoid(double a) { return 1.0 / (1.0 + exp(-a)); }

void ref_swiglu_fwd(double *m, const double *a, const double *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        m[i] = a[i] * sigmoid(a[i]) * b[i];
}

/* silu'(a) = s + a s (1 - s) with s = sigmoid(a). */
void ref_swiglu_bwd(double *da, double *db, const double *dm, const double *a, const double *b,
                    size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double s = sigmoid(a[i]);
        da[i] = dm[i] * b[i] * (s + a[i] * s * (1.0 - s));
        db[i] = dm[i] * a[i] * s;
    }
}

void ref_xent(double *dlogits, double *loss, const double *logits, const int32_t *targets, int N,
              int V, double dscale)
{
    for (int n = 0; n < N; n++) {
        const double *l = logits + (size_t)n * V;
        double *d = dlogits + (size_t)n * V;
        double mx = l[0];
        for (int j = 1; j < V; j++)
            mx = l[j] > mx ? l[j] : mx;
        double s = 0;
        for (int j = 0; j < V; j++)
            s += exp(l[j] - mx);
        double lt = l[targets[n]];
        loss[n] = mx + log(s) - lt;
        for (int j = 0; j < V; j++) /* element-wise, so dlogits may alias logits */
            d[j] = exp(l[j] - mx) / s * dscale;
        d[targets[n]] -= dscale;
    }
}

/* torch.optim.AdamW (amsgrad=False, maximize=False): decoupled decay first, then the Adam step
 * with bias corrections; eps is added after sqrt(v_hat). */
void ref_adamw(double *param, const double *grad, double *m, double *v, size_t n, double lr,
               double beta1, double beta2, double eps, double wd, int step)
{
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    for (size_t i = 0; i < n; i++) {
        param[i] -= lr * wd * param[i];
        m[i] = beta1 * m[i] + (1.0 - beta1) * grad[i];
        v[i] = beta2 * v[i] + (1.0 - beta2) * grad[i] * grad[i];
        double mhat = m[i] / bc1, vhat = v[i] / bc2;
        param[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
}
