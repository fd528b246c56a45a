/* Rotary embedding and causal grouped-query attention on the CPU (fp32). Tasks are fixed
 * by the shape: rope by blocks of tokens, attention forward by (batch, query head),
 * backward by (batch, kv head) so one task owns each dk/dv row and sums its query heads
 * in order: the bits never depend on the thread count. The T x T products go through
 * single-threaded sgemm (the pool pins OpenBLAS to one thread). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#undef I /* <complex.h>, pulled in by cblas.h */

#include "kernels/ops.h"

#define ROPE_TOKENS 64

void ops_rope_table_freq(float *cos_t, float *sin_t, int T, int hd, const double *inv_freq)
{
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double ang = t * inv_freq[i];
            cos_t[t * half + i] = (float)cos(ang);
            sin_t[t * half + i] = (float)sin(ang);
        }
}

void ops_rope_table(float *cos_t, float *sin_t, int T, int hd, double theta)
{
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double ang = t * pow(theta, -2.0 * i / hd);
            cos_t[t * half + i] = (float)cos(ang);
            sin_t[t * half + i] = (float)sin(ang);
        }
}

typedef struct {
    float *x;
    const float *c, *s;
    int B, T, H, hd;
    float sign;
} rope_job_t;

static void rope_task(void *ctx, int task)
{
    rope_job_t *j = ctx;
    int half = j->hd / 2, N = j->B * j->T;
    int n1 = (task + 1) * ROPE_TOKENS < N ? (task + 1) * ROPE_TOKENS : N;
    for (int n = task * ROPE_TOKENS; n < n1; n++) {
        int t = n % j->T;
        const float *c = j->c + (size_t)t * half, *s = j->s + (size_t)t * half;
        for (int h = 0; h < j->H; h++) {
            float *x1 = j->x + ((size_t)n * j->H + h) * j->hd, *x2 = x1 + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float a = x1[i], b = x2[i], sn = j->sign * s[i];
                x1[i] = a * c[i] - b * sn;
                x2[i] = b * c[i] + a * sn;
            }
        }
    }
}

static void rope_run(pool_t *p, float *x, const float *c, const float *s, int B, int T, int H,
                     int hd, float sign)
{
    rope_job_t j = {x, c, s, B, T, H, hd, sign};
    pool_for(p, (B * T + ROPE_TOKENS - 1) / ROPE_TOKENS, rope_task, &j);
}

void ops_rope_fwd(pool_t *p, float *x, const float *c, const float *s, int B, int T, int H, int hd)
{
    rope_run(p, x, c, s, B, T, H, hd, 1.0f);
}

void ops_rope_bwd(pool_t *p, float *dx, const float *c, const float *s, int B, int T, int H, int hd)
{
    rope_run(p, dx, c, s, B, T, H, hd, -1.0f);
}

typedef struct {
    float *y, *probs, *dq, *dk, *dv;
    const float *q, *k, *v, *dy, *cprobs;
    int B, T, Hq, Hkv, hd;
} attn_job_t;

/* Forward of one (batch, query head): S = Q K^T * scale into probs, causal softmax per row
 * (zeros above the diagonal), Y = P V. The products are single-threaded sgemm calls over
 * the full T x T square: twice the causal work, but at BLAS speed. */
static void attn_fwd_task(void *ctx, int task)
{
    attn_job_t *j = ctx;
    int T = j->T, hd = j->hd, Hq = j->Hq, Hkv = j->Hkv;
    int b = task / Hq, h = task % Hq, kh = h / (Hq / Hkv);
    float scale = 1.0f / sqrtf((float)hd);
    int qs = Hq * hd, ks = Hkv * hd;
    const float *q = j->q + (size_t)b * T * qs + (size_t)h * hd;
    const float *k = j->k + (size_t)b * T * ks + (size_t)kh * hd;
    const float *v = j->v + (size_t)b * T * ks + (size_t)kh * hd;
    float *y = j->y + (size_t)b * T * qs + (size_t)h * hd;
    float *P = j->probs + ((size_t)b * Hq + h) * T * T;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, scale, q, qs, k, ks, 0.0f, P, T);
    for (int i = 0; i < T; i++) {
        float *p = P + (size_t)i * T, mx = -INFINITY, sum = 0;
        for (int t = 0; t <= i; t++)
            mx = p[t] > mx ? p[t] : mx;
        for (int t = 0; t <= i; t++)
            sum += p[t] = expf(p[t] - mx);
        float inv = 1.0f / sum;
#pragma omp simd
        for (int t = 0; t <= i; t++)
            p[t] *= inv;
        if (i + 1 < T)
            memset(p + i + 1, 0, (size_t)(T - i - 1) * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, P, T, v, ks, 0.0f, y, qs);
}

void ops_attn_fwd(pool_t *p, float *y, float *probs, const float *q, const float *k, const float *v,
                  int B, int T, int Hq, int Hkv, int hd)
{
    attn_job_t j = {.y = y, .probs = probs, .q = q, .k = k, .v = v,
                    .B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .hd = hd};
    pool_for(p, B * Hq, attn_fwd_task, &j);
}

/* Backward of one (batch, kv head), its query heads in order so dk and dv sum in a fixed
 * order: dV += P^T dY;  dP = dY V^T;  dS = P (dP - rowsum(P dP)) * scale;
 * dQ = dS K;  dK += dS^T Q. */
static void attn_bwd_task(void *ctx, int task)
{
    attn_job_t *j = ctx;
    int T = j->T, hd = j->hd, Hq = j->Hq, Hkv = j->Hkv, group = Hq / Hkv;
    int b = task / Hkv, kh = task % Hkv;
    float scale = 1.0f / sqrtf((float)hd);
    int qs = Hq * hd, ks = Hkv * hd;
    const float *k = j->k + (size_t)b * T * ks + (size_t)kh * hd;
    const float *v = j->v + (size_t)b * T * ks + (size_t)kh * hd;
    float *dk = j->dk + (size_t)b * T * ks + (size_t)kh * hd;
    float *dv = j->dv + (size_t)b * T * ks + (size_t)kh * hd;
    float *dS = malloc((size_t)T * T * sizeof(float));
    if (!dS) {
        fprintf(stderr, "ops_attn_bwd: out of memory for a %dx%d score block\n", T, T);
        abort();
    }
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        const float *q = j->q + (size_t)b * T * qs + (size_t)h * hd;
        const float *dy = j->dy + (size_t)b * T * qs + (size_t)h * hd;
        float *dq = j->dq + (size_t)b * T * qs + (size_t)h * hd;
        const float *P = j->cprobs + ((size_t)b * Hq + h) * T * T;
        float first = h == kh * group ? 0.0f : 1.0f;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, P, T, dy, qs, first,
                    dv, ks);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1.0f, dy, qs, v, ks, 0.0f,
                    dS, T);
        for (int i = 0; i < T; i++) {
            const float *p = P + (size_t)i * T;
            float *d = dS + (size_t)i * T, s = 0;
#pragma omp simd reduction(+ : s)
            for (int t = 0; t <= i; t++)
                s += p[t] * d[t];
#pragma omp simd
            for (int t = 0; t <= i; t++)
                d[t] = p[t] * (d[t] - s) * scale;
            if (i + 1 < T)
                memset(d + i + 1, 0, (size_t)(T - i - 1) * sizeof(float));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, dS, T, k, ks, 0.0f,
                    dq, qs);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, dS, T, q, qs, first,
                    dk, ks);
    }
    free(dS);
}

void ops_attn_bwd(pool_t *p, float *dq, float *dk, float *dv, const float *dy, const float *probs,
                  const float *q, const float *k, const float *v, int B, int T, int Hq, int Hkv, int hd)
{
    attn_job_t j = {.dq = dq, .dk = dk, .dv = dv, .dy = dy, .cprobs = probs, .q = q, .k = k, .v = v,
                    .B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .hd = hd};
    pool_for(p, B * Hkv, attn_bwd_task, &j);
}
