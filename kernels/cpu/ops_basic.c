/* Fast fp32 CPU versions of the non-attention ops in kernels/ops.h: embedding, RMSNorm,
 * linear layers (OpenBLAS sgemm per output tile), SwiGLU, softmax cross-entropy, AdamW.
 * Determinism: every op cuts its work into tasks whose boundaries depend only on the problem
 * size, and each output element is produced by one task in a fixed order, so the bits do not
 * depend on the pool size. */
#include "kernels/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <immintrin.h>
#undef I /* openblas_config.h pulls in <complex.h>, whose I would clobber the I parameters */

#include "kernels/adamw.h"

/* Element-wise and row-wise tasks cover at least this many floats: large enough that the
 * pool's hand-off cost vanishes, small enough for many tasks on big tensors. */
#define ELEMS_PER_TASK 32768

static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }
static int imin(int a, int b) { return a < b ? a : b; }

/* Rows per task so that a task touches about ELEMS_PER_TASK floats of rows of width D. */
static int rows_per_task(int D)
{
    int r = ELEMS_PER_TASK / (D > 0 ? D : 1);
    return r < 1 ? 1 : r;
}

/* exp(x) in fp32 with plain arithmetic so that loops calling it vectorise (glibc's vector
 * expf is only used under -ffast-math). Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6
 * polynomial, about 1 ulp. Returns 0 below -87.3 (where expf goes denormal) and saturates
 * at exp(88) instead of overflowing. */
static inline float fexp(float x)
{
    float xc = x > 88.0f ? 88.0f : x;
    xc = xc < -87.3f ? -87.3f : xc;
    const float shifter = 0x1.8p23f; /* adding it rounds to an integer in the low mantissa bits */
    float t = fmaf(xc, 0x1.715476p+0f, shifter);
    float n = t - shifter;
    float r = fmaf(n, -0x1.62e400p-1f, xc); /* ln2 split in two so n*ln2_hi is exact */
    r = fmaf(n, -0x1.7f7d1cp-20f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    uint32_t ti, si; /* unsigned: the same bits, and no overflow (undefined) for a NaN x */
    memcpy(&ti, &t, 4);
    si = (ti - 0x4B400000u + 127u) << 23; /* 0x4B400000 = bits of the shifter: ti - it = n */
    float scale;
    memcpy(&scale, &si, 4);
    return x < -87.3f ? 0.0f : p * scale;
}

/* ---- embedding ---- */

struct embed_ctx {
    float *out;
    const float *in;
    const int32_t *tok;
    int N, D, chunk;
};

static void embed_fwd_task(void *c, int t)
{
    const struct embed_ctx *e = c;
    int n0 = t * e->chunk, n1 = imin(e->N, n0 + e->chunk);
    for (int n = n0; n < n1; n++)
        memcpy(e->out + (size_t)n * e->D, e->in + (size_t)e->tok[n] * e->D, (size_t)e->D * sizeof(float));
}

void ops_embed_fwd(pool_t *p, float *out, const float *table, const int32_t *tok, int N, int D)
{
    struct embed_ctx e = {out, table, tok, N, D, rows_per_task(D)};
    pool_for(p, ceil_div(N, e.chunk), embed_fwd_task, &e);
}

/* Tasks own column slices of the table, so repeated tokens never race, and every row of
 * dtable receives its tokens' gradients in token order. */
#define EMBED_BWD_COLS 128

static void embed_bwd_task(void *c, int t)
{
    const struct embed_ctx *e = c;
    int c0 = t * EMBED_BWD_COLS, c1 = imin(e->D, c0 + EMBED_BWD_COLS);
    for (int n = 0; n < e->N; n++) {
        float *dst = e->out + (size_t)e->tok[n] * e->D;
        const float *src = e->in + (size_t)n * e->D;
#pragma omp simd
        for (int i = c0; i < c1; i++)
            dst[i] += src[i];
    }
}

void ops_embed_bwd(pool_t *p, float *dtable, const float *dout, const int32_t *tok, int N, int D)
{
    struct embed_ctx e = {dtable, dout, tok, N, D, 0};
    pool_for(p, ceil_div(D, EMBED_BWD_COLS), embed_bwd_task, &e);
}

/* ---- RMSNorm ---- */

struct rms_ctx {
    float *out, *rstd, *scratch;
    const float *x, *w, *dout, *rstd_in;
    int N, D, chunk, nblocks;
    float eps;
};

static void rms_fwd_task(void *c, int t)
{
    const struct rms_ctx *r = c;
    int D = r->D, n0 = t * r->chunk, n1 = imin(r->N, n0 + r->chunk);
    for (int n = n0; n < n1; n++) {
        const float *x = r->x + (size_t)n * D;
        float *o = r->out + (size_t)n * D;
        float ss = 0;
#pragma omp simd reduction(+:ss)
        for (int i = 0; i < D; i++)
            ss += x[i] * x[i];
        float rs = (float)(1.0 / sqrt((double)ss / D + r->eps));
        r->rstd[n] = rs;
#pragma omp simd
        for (int i = 0; i < D; i++)
            o[i] = x[i] * rs * r->w[i];
    }
}

void ops_rmsnorm_fwd(pool_t *p, float *out, float *rstd, const float *x, const float *w, int N, int D,
                     float eps)
{
    struct rms_ctx r = {.out = out, .rstd = rstd, .x = x, .w = w, .N = N, .D = D,
                        .chunk = rows_per_task(D), .eps = eps};
    pool_for(p, ceil_div(N, r.chunk), rms_fwd_task, &r);
}

/* dx = r g - r^3 x (g.x)/D with g = dout*w (derivation in kernels/ref/ref_basic.c). */
static void rms_bwd_x_task(void *c, int t)
{
    const struct rms_ctx *r = c;
    int D = r->D, n0 = t * r->chunk, n1 = imin(r->N, n0 + r->chunk);
    const float *w = r->w;
    for (int n = n0; n < n1; n++) {
        const float *x = r->x + (size_t)n * D, *g = r->dout + (size_t)n * D;
        float *dx = r->out + (size_t)n * D;
        float dot = 0;
#pragma omp simd reduction(+:dot)
        for (int i = 0; i < D; i++)
            dot += g[i] * w[i] * x[i];
        float rs = r->rstd_in[n];
        float k = rs * rs * rs * dot / (float)D;
#pragma omp simd
        for (int i = 0; i < D; i++)
            dx[i] += rs * g[i] * w[i] - k * x[i];
    }
}

void ops_rmsnorm_bwd_x(pool_t *p, float *dx, const float *dout, const float *x, const float *rstd,
                       const float *w, int N, int D)
{
    struct rms_ctx r = {.out = dx, .x = x, .w = w, .dout = dout, .rstd_in = rstd, .N = N, .D = D,
                        .chunk = rows_per_task(D)};
    pool_for(p, ceil_div(N, r.chunk), rms_bwd_x_task, &r);
}

/* dw sums over tokens. Block b of rows sums its rows in order into partial[b,:] (contiguous
 * streaming reads), then column tasks add the partials in block order. Both cuts depend only on
 * N and D. Without scratch memory the same sums run in the same order on one thread. */
static void rms_block_sum(const struct rms_ctx *r, int b, float *acc, int c0, int c1)
{
    int D = r->D, n0 = b * r->chunk, n1 = imin(r->N, n0 + r->chunk);
    for (int i = c0; i < c1; i++)
        acc[i - c0] = 0;
    for (int n = n0; n < n1; n++) {
        const float *x = r->x + (size_t)n * D, *g = r->dout + (size_t)n * D;
        float rs = r->rstd_in[n];
#pragma omp simd
        for (int i = c0; i < c1; i++)
            acc[i - c0] += g[i] * x[i] * rs;
    }
}

static void rms_bwd_w_partial_task(void *c, int t)
{
    const struct rms_ctx *r = c;
    rms_block_sum(r, t, r->scratch + (size_t)t * r->D, 0, r->D);
}

#define RMS_BWD_W_COLS 256

static void rms_bwd_w_reduce_task(void *c, int t)
{
    const struct rms_ctx *r = c;
    int c0 = t * RMS_BWD_W_COLS, c1 = imin(r->D, c0 + RMS_BWD_W_COLS);
    float tot[RMS_BWD_W_COLS] = {0};
    for (int b = 0; b < r->nblocks; b++) {
        const float *part = r->scratch + (size_t)b * r->D;
#pragma omp simd
        for (int i = c0; i < c1; i++)
            tot[i - c0] += part[i];
    }
#pragma omp simd
    for (int i = c0; i < c1; i++)
        r->out[i] += tot[i - c0];
}

void ops_rmsnorm_bwd_w(pool_t *p, float *dw, const float *dout, const float *x, const float *rstd,
                       int N, int D)
{
    struct rms_ctx r = {.out = dw, .x = x, .dout = dout, .rstd_in = rstd, .N = N, .D = D,
                        .chunk = rows_per_task(D)};
    if (N <= 0 || D <= 0)
        return;
    r.nblocks = ceil_div(N, r.chunk);
    r.scratch = malloc((size_t)r.nblocks * D * sizeof(float));
    if (r.scratch) {
        pool_for(p, r.nblocks, rms_bwd_w_partial_task, &r);
        pool_for(p, ceil_div(D, RMS_BWD_W_COLS), rms_bwd_w_reduce_task, &r);
        free(r.scratch);
        return;
    }
    for (int c0 = 0; c0 < D; c0 += RMS_BWD_W_COLS) { /* out of memory: same order, one thread */
        int c1 = imin(D, c0 + RMS_BWD_W_COLS);
        float tot[RMS_BWD_W_COLS] = {0}, acc[RMS_BWD_W_COLS];
        for (int b = 0; b < r.nblocks; b++) {
            rms_block_sum(&r, b, acc, c0, c1);
            for (int i = c0; i < c1; i++)
                tot[i - c0] += acc[i - c0];
        }
        for (int i = c0; i < c1; i++)
            dw[i] += tot[i - c0];
    }
}

/* ---- linear layers ---- */

/* Output tile of an M x Nc product for one task (one single-threaded sgemm call). Tiles as
 * large as 256 x 2048 amortise OpenBLAS's packing (measured: 32-row tiles run at ~60% of the
 * rate of 256-row tiles); they shrink until there are at least 8 tiles so that two to a few
 * threads stay busy. Depends only on the shape. */
static void tile_plan(int M, int Nc, int *mb, int *nb)
{
    int m = imin(M, 512), n = imin(Nc, 2048);
    while ((long)ceil_div(M, m) * ceil_div(Nc, n) < 8) {
        if (n >= 2 * m && n > 128)
            n = (n / 2 + 15) & ~15;
        else if (m > 32)
            m = (m / 2 + 15) & ~15;
        else if (n > 128)
            n = (n / 2 + 15) & ~15;
        else
            break;
    }
    *mb = m;
    *nb = n;
}

struct mm_ctx {
    float *c;
    const float *a, *b;
    int N, I, O, mb, nb, ntn;
    float beta;
};

/* y[N,O] = x[N,I] w[O,I]^T; tile (rows of x) x (rows of w). */
static void mm_fwd_task(void *c, int t)
{
    const struct mm_ctx *m = c;
    int r0 = (t / m->ntn) * m->mb, c0 = (t % m->ntn) * m->nb;
    int rows = imin(m->mb, m->N - r0), cols = imin(m->nb, m->O - c0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, m->I, 1.0f,
                m->a + (size_t)r0 * m->I, m->I, m->b + (size_t)c0 * m->I, m->I, 0.0f,
                m->c + (size_t)r0 * m->O + c0, m->O);
}

void ops_matmul_fwd(pool_t *p, float *y, const float *x, const float *w, int N, int I, int O)
{
    struct mm_ctx m = {y, x, w, N, I, O, 0, 0, 0, 0.0f};
    if (N <= 0 || O <= 0)
        return;
    if (I <= 0) {
        memset(y, 0, (size_t)N * O * sizeof(float));
        return;
    }
    tile_plan(N, O, &m.mb, &m.nb);
    m.ntn = ceil_div(O, m.nb);
    pool_for(p, ceil_div(N, m.mb) * m.ntn, mm_fwd_task, &m);
}

/* dx[N,I] (+)= dy[N,O] w[O,I]; tile (rows of dy) x (columns of w). */
static void mm_bwd_x_task(void *c, int t)
{
    const struct mm_ctx *m = c;
    int r0 = (t / m->ntn) * m->mb, c0 = (t % m->ntn) * m->nb;
    int rows = imin(m->mb, m->N - r0), cols = imin(m->nb, m->I - c0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, cols, m->O, 1.0f,
                m->a + (size_t)r0 * m->O, m->O, m->b + c0, m->I, m->beta,
                m->c + (size_t)r0 * m->I + c0, m->I);
}

void ops_matmul_bwd_x(pool_t *p, float *dx, const float *dy, const float *w, int N, int I, int O,
                      int accumulate)
{
    struct mm_ctx m = {dx, dy, w, N, I, O, 0, 0, 0, accumulate ? 1.0f : 0.0f};
    if (N <= 0 || I <= 0)
        return;
    if (O <= 0) {
        if (!accumulate)
            memset(dx, 0, (size_t)N * I * sizeof(float));
        return;
    }
    tile_plan(N, I, &m.mb, &m.nb);
    m.ntn = ceil_div(I, m.nb);
    pool_for(p, ceil_div(N, m.mb) * m.ntn, mm_bwd_x_task, &m);
}

/* dw[O,I] += dy[N,O]^T x[N,I]; tile (columns of dy) x (columns of x), summing all N tokens
 * inside one sgemm. */
static void mm_bwd_w_task(void *c, int t)
{
    const struct mm_ctx *m = c;
    int r0 = (t / m->ntn) * m->mb, c0 = (t % m->ntn) * m->nb;
    int rows = imin(m->mb, m->O - r0), cols = imin(m->nb, m->I - c0);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, cols, m->N, 1.0f, m->a + r0, m->O,
                m->b + c0, m->I, 1.0f, m->c + (size_t)r0 * m->I + c0, m->I);
}

void ops_matmul_bwd_w(pool_t *p, float *dw, const float *dy, const float *x, int N, int I, int O)
{
    struct mm_ctx m = {dw, dy, x, N, I, O, 0, 0, 0, 1.0f};
    if (N <= 0 || I <= 0 || O <= 0)
        return;
    tile_plan(O, I, &m.mb, &m.nb);
    m.ntn = ceil_div(I, m.nb);
    pool_for(p, ceil_div(O, m.mb) * m.ntn, mm_bwd_w_task, &m);
}

/* ---- SwiGLU ---- */

struct swiglu_ctx {
    float *m, *da, *db;
    const float *a, *b, *dm;
    size_t n;
};

static void swiglu_fwd_task(void *c, int t)
{
    const struct swiglu_ctx *s = c;
    size_t i0 = (size_t)t * ELEMS_PER_TASK, i1 = i0 + ELEMS_PER_TASK < s->n ? i0 + ELEMS_PER_TASK : s->n;
    const float *a = s->a, *b = s->b;
    float *m = s->m;
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {
        float sg = 1.0f / (1.0f + fexp(-a[i]));
        m[i] = a[i] * sg * b[i];
    }
}

void ops_swiglu_fwd(pool_t *p, float *m, const float *a, const float *b, size_t n)
{
    struct swiglu_ctx s = {.m = m, .a = a, .b = b, .n = n};
    pool_for(p, ceil_div((long)n, ELEMS_PER_TASK), swiglu_fwd_task, &s);
}

static void swiglu_bwd_task(void *c, int t)
{
    const struct swiglu_ctx *s = c;
    size_t i0 = (size_t)t * ELEMS_PER_TASK, i1 = i0 + ELEMS_PER_TASK < s->n ? i0 + ELEMS_PER_TASK : s->n;
    const float *a = s->a, *b = s->b, *dm = s->dm;
    float *da = s->da, *db = s->db;
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {
        float sg = 1.0f / (1.0f + fexp(-a[i]));
        float silu = a[i] * sg;
        da[i] = dm[i] * b[i] * (sg + silu * (1.0f - sg));
        db[i] = dm[i] * silu;
    }
}

void ops_swiglu_bwd(pool_t *p, float *da, float *db, const float *dm, const float *a, const float *b,
                    size_t n)
{
    struct swiglu_ctx s = {.da = da, .db = db, .a = a, .b = b, .dm = dm, .n = n};
    pool_for(p, ceil_div((long)n, ELEMS_PER_TASK), swiglu_bwd_task, &s);
}

/* ---- softmax cross-entropy ---- */

struct xent_ctx {
    float *dlogits, *loss;
    const float *logits;
    const int32_t *targets;
    int N, V, chunk;
    float dscale;
};

/* Three passes over a row (max; exp stored into dlogits and summed; scale), each on a row that
 * stays in L2 (50304 floats = 200 KB). dlogits may alias logits: every pass is element-wise
 * and the target logit is read first. */
static void xent_task(void *c, int t)
{
    const struct xent_ctx *x = c;
    int V = x->V, n0 = t * x->chunk, n1 = imin(x->N, n0 + x->chunk);
    for (int n = n0; n < n1; n++) {
        const float *l = x->logits + (size_t)n * V;
        float *d = x->dlogits + (size_t)n * V;
        int tg = x->targets[n];
        float lt = l[tg];
        float mx = -INFINITY;
#pragma omp simd reduction(max:mx)
        for (int j = 0; j < V; j++)
            mx = l[j] > mx ? l[j] : mx;
        float s = 0;
#pragma omp simd reduction(+:s)
        for (int j = 0; j < V; j++) {
            float e = fexp(l[j] - mx);
            d[j] = e;
            s += e;
        }
        x->loss[n] = (float)(mx + log((double)s) - lt);
        float k = x->dscale / s;
#pragma omp simd
        for (int j = 0; j < V; j++)
            d[j] *= k;
        d[tg] -= x->dscale;
    }
}

void ops_xent(pool_t *p, float *dlogits, float *loss, const float *logits, const int32_t *targets,
              int N, int V, float dscale)
{
    struct xent_ctx x = {dlogits, loss, logits, targets, N, V, rows_per_task(V), dscale};
    pool_for(p, ceil_div(N, x.chunk), xent_task, &x);
}

/* ---- AdamW ---- */

struct adamw_ctx {
    float *param, *m, *v;
    const float *param0, *m0, *v0, *grad;
    size_t n;
    adamw_scalars_t s;
};

#define ADAMW_ELEMS 16384
#define ADAMW_BLOCK 256

/* sqrt over an array. GCC will not vectorise sqrtf without -fno-math-errno (and ignores it as a
 * function attribute), so the vector instruction is spelled out; both paths are IEEE sqrt. */
static void sqrt_array(float *y, const float *x, int n)
{
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
#elif defined(__AVX__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++)
        y[i] = sqrtf(x[i]);
}

/* The arithmetic of kernels/adamw.h, operation by operation (the GPU's adamw_elem does the
 * same: keep the two in step); vectorised by the compiler, never contracted (-ffp-contract=off). */
static void adamw_task(void *c, int t)
{
    const struct adamw_ctx *a = c;
    size_t i0 = (size_t)t * ADAMW_ELEMS, i1 = i0 + ADAMW_ELEMS < a->n ? i0 + ADAMW_ELEMS : a->n;
    const float decay = a->s.decay, w1 = a->s.w1, b2 = a->s.beta2, w2 = a->s.w2;
    const float ss = a->s.step_size, bc2s = a->s.bc2_sqrt, eps = a->s.eps, gs = a->s.gscale;
    float den[ADAMW_BLOCK];
    for (size_t b0 = i0; b0 < i1; b0 += ADAMW_BLOCK) {
        int nb = (int)(i1 - b0 < ADAMW_BLOCK ? i1 - b0 : ADAMW_BLOCK);
        float *p = a->param + b0, *m = a->m + b0, *v = a->v + b0;
        const float *p0 = a->param0 + b0, *m0 = a->m0 + b0, *v0 = a->v0 + b0, *g = a->grad + b0;
#pragma omp simd
        for (int i = 0; i < nb; i++) {
            const float gi = g[i] * gs;
            m[i] = m0[i] + w1 * (gi - m0[i]);
            v[i] = v0[i] * b2 + w2 * gi * gi;
        }
        sqrt_array(den, v, nb);
#pragma omp simd
        for (int i = 0; i < nb; i++)
            p[i] = p0[i] * decay - ss * (m[i] / (den[i] / bc2s + eps));
    }
}

void ops_adamw_to(pool_t *p, float *param, float *m, float *v, const float *param0, const float *m0,
                  const float *v0, const float *grad, float gscale, size_t n, float lr, float beta1, float beta2,
                  float eps, float wd, int step)
{
    struct adamw_ctx a = {
        .param = param, .m = m, .v = v, .param0 = param0, .m0 = m0, .v0 = v0, .grad = grad, .n = n};
    adamw_scalars(&a.s, gscale, lr, beta1, beta2, eps, wd, step);
    pool_for(p, ceil_div((long)n, ADAMW_ELEMS), adamw_task, &a);
}

void ops_adamw(pool_t *p, float *param, const float *grad, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float wd, int step)
{
    ops_adamw_to(p, param, m, v, param, m, v, grad, 1.0f, n, lr, beta1, beta2, eps, wd, step);
}
