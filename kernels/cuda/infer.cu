// KV-cache inference on the GPU in fp32 (see cuda_infer.h): kernels/cpu/infer.c's layer step,
// op for op, on one stream. Products of a few rows (decoding: one token) are matrix-vector
// products, a warp per output reading its weight row once; larger ones (a prompt) a tiled
// product. Attention is one block per (token, query head) over the cache up to the token's own
// position, with the scores in a device scratch row (contexts longer than shared memory).
// Simple and memory-bound by design: decoding reads every weight once per token either way.
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "kernels/config.h"
#include "kernels/params.h"
}
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_infer.h"
#include "kernels/cuda/nn_common.cuh"

#define THREADS 256     // per block of the row kernels; a multiple of 32 (nn_block_sum)
#define GEMV_ROWS 4     // products of at most this many rows are matrix-vector products
#define GEMV_WARPS 8    // outputs per block of the matrix-vector product
#define TILE 16         // the tiled product's tile: TILE x TILE outputs per block

typedef struct {
    const float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w3, *w2; // views into w
    float *kc, *vc; // (capacity, KD) cache, keys after rope
} layer_t;

struct cuda_infer {
    model_config_t cfg;
    int D, hd, QD, KD, F, V, cap, max_batch, pos;
    cudaStream_t stream;
    float *w;                   // the whole model's weights (params.h order)
    const float *embed, *norm, *out;
    layer_t *l;                 // host array of device views
    float *mem;                 // one allocation: caches, tables and buffers below
    float *rope_cos, *rope_sin; // (capacity, hd/2)
    float *x, *xn, *q, *y, *a, *b; // (B, D) (B, D) (B, QD) (B, QD) (B, F) (B, F)
    float *scores;              // (B, n_heads, capacity)
    float *logits;              // (V)
    int32_t *tokens;            // (B)
    size_t bytes;
};

// ---- kernels ----

static __global__ void embed_kernel(float *x, const float *table, const int32_t *tok, int D)
{
    const float *row = table + (size_t)tok[blockIdx.x] * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        x[(size_t)blockIdx.x * D + i] = row[i];
}

// One block per row, as ops_rmsnorm_fwd: rstd in double from the fp32 sum of squares.
static __global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int D, float eps)
{
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * D;
    float *o = out + (size_t)blockIdx.x * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = nn_block_sum(ss, sh);
    float rs = (float)(1.0 / sqrt((double)ss / D + eps));
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        o[i] = xr[i] * rs * w[i];
}

// y[n, o] = sum_k x[n, k] w[o, k] for n < N <= GEMV_ROWS: warp per output o, lanes over k.
static __global__ void gemv_kernel(float *y, const float *x, const float *w, int N, int Din, int Dout)
{
    int o = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    float acc[GEMV_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (o < Dout) {
        const float *wr = w + (size_t)o * Din;
        for (int k = lane; k < Din; k += 32) {
            float wk = wr[k];
            for (int n = 0; n < N; n++)
                acc[n] += x[(size_t)n * Din + k] * wk;
        }
    }
    for (int n = 0; n < N; n++) { // every lane takes part in the shuffles
        float s = nn_warp_sum(acc[n]);
        if (o < Dout && lane == 0)
            y[(size_t)n * Dout + o] = s;
    }
}

// The same for any N: a TILE x TILE block of y per block, k in steps of TILE through shared memory.
static __global__ void gemm_kernel(float *y, const float *x, const float *w, int N, int Din, int Dout)
{
    __shared__ float xs[TILE][TILE + 1], ws[TILE][TILE + 1];
    int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
    int n = blockIdx.y * TILE + ty, o = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < Din; k0 += TILE) {
        int xr = blockIdx.y * TILE + ty, wr = blockIdx.x * TILE + ty, k = k0 + tx;
        xs[ty][tx] = xr < N && k < Din ? x[(size_t)xr * Din + k] : 0.0f;
        ws[ty][tx] = wr < Dout && k < Din ? w[(size_t)wr * Din + k] : 0.0f;
        __syncthreads();
        for (int j = 0; j < TILE; j++)
            acc += xs[ty][j] * ws[tx][j];
        __syncthreads();
    }
    if (n < N && o < Dout)
        y[(size_t)n * Dout + o] = acc;
}

// Rotates the H heads of row blockIdx.x (position p0 + row) in place: pairs i, i + hd/2.
static __global__ void rope_kernel(float *x, const float *cs, const float *sn, int p0, int H, int hd)
{
    int half = hd / 2;
    const float *c = cs + (size_t)(p0 + blockIdx.x) * half, *s = sn + (size_t)(p0 + blockIdx.x) * half;
    float *row = x + (size_t)blockIdx.x * H * hd;
    for (int j = threadIdx.x; j < H * half; j += blockDim.x) {
        int h = j / half, i = j % half;
        float *v = row + (size_t)h * hd;
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c[i] - x2 * s[i];
        v[i + half] = x2 * c[i] + x1 * s[i];
    }
}

// Block (row, head): scores against the cache rows 0..p0+row, softmax, the weighted values.
static __global__ void attn_kernel(float *y, float *scores, const float *q, const float *kc, const float *vc,
                                   int p0, int Hq, int Hkv, int hd, int cap)
{
    __shared__ float sh[32];
    int row = blockIdx.x, h = blockIdx.y, kh = h / (Hq / Hkv), len = p0 + row + 1;
    int QD = Hq * hd, KD = Hkv * hd;
    const float *qr = q + (size_t)row * QD + (size_t)h * hd;
    float *sc = scores + ((size_t)row * Hq + h) * cap, scale = 1.0f / sqrtf((float)hd);
    float mx = -INFINITY;
    for (int t = threadIdx.x; t < len; t += blockDim.x) {
        const float *k = kc + (size_t)t * KD + (size_t)kh * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d++)
            s += qr[d] * k[d];
        sc[t] = s * scale;
        mx = fmaxf(mx, sc[t]);
    }
    // the block's max, as nn_block_sum does the sum
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++)
        mx = fmaxf(mx, sh[i]);
    float sum = 0.0f;
    for (int t = threadIdx.x; t < len; t += blockDim.x)
        sum += sc[t] = expf(sc[t] - mx);
    sum = nn_block_sum(sum, sh); // its barriers also order the writes of sc before the reads below
    float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < len; t++)
            acc += sc[t] * vc[(size_t)t * KD + (size_t)kh * hd + d];
        y[(size_t)row * QD + (size_t)h * hd + d] = acc * inv;
    }
}

// a = silu(a) * b, as ops_swiglu_fwd.
static __global__ void swiglu_kernel(float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float sg = 1.0f / (1.0f + expf(-a[i]));
        a[i] = a[i] * sg * b[i];
    }
}

static __global__ void add_kernel(float *x, const float *r, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += r[i];
}

// ---- host ----

#define CU(call)                                                                                  \
    do {                                                                                          \
        int rc_ = cuda_err_status((int)(call), #call);                                            \
        if (rc_)                                                                                  \
            return rc_;                                                                           \
    } while (0)

static int launched(const char *what) { return cuda_err_status((int)cudaGetLastError(), what); }

static unsigned grid_for(size_t n) { return (unsigned)(n / THREADS + 1 < 4096 ? n / THREADS + 1 : 4096); }

static int matmul(cuda_infer_t *s, float *y, const float *x, const float *w, int N, int Din, int Dout)
{
    if (N <= GEMV_ROWS)
        gemv_kernel<<<(Dout + GEMV_WARPS - 1) / GEMV_WARPS, GEMV_WARPS * 32, 0, s->stream>>>(y, x, w, N, Din, Dout);
    else
        gemm_kernel<<<dim3((Dout + TILE - 1) / TILE, (N + TILE - 1) / TILE), TILE * TILE, 0, s->stream>>>(
            y, x, w, N, Din, Dout);
    return launched("infer matmul");
}

static int layer_step(cuda_infer_t *s, const layer_t *L, int n)
{
    int D = s->D, QD = s->QD, KD = s->KD, F = s->F, p0 = s->pos, rc;
    float eps = (float)s->cfg.norm_eps, *kc = L->kc + (size_t)p0 * KD, *vc = L->vc + (size_t)p0 * KD;
    rmsnorm_kernel<<<n, THREADS, 0, s->stream>>>(s->xn, s->x, L->attn_norm, D, eps);
    if ((rc = launched("infer rmsnorm")) || (rc = matmul(s, s->q, s->xn, L->wq, n, D, QD)) ||
        (rc = matmul(s, kc, s->xn, L->wk, n, D, KD)) || (rc = matmul(s, vc, s->xn, L->wv, n, D, KD)))
        return rc;
    rope_kernel<<<n, THREADS, 0, s->stream>>>(s->q, s->rope_cos, s->rope_sin, p0, s->cfg.n_heads, s->hd);
    rope_kernel<<<n, THREADS, 0, s->stream>>>(kc, s->rope_cos, s->rope_sin, p0, s->cfg.n_kv_heads, s->hd);
    attn_kernel<<<dim3(n, s->cfg.n_heads), 128, 0, s->stream>>>(s->y, s->scores, s->q, L->kc, L->vc, p0,
                                                                 s->cfg.n_heads, s->cfg.n_kv_heads, s->hd, s->cap);
    if ((rc = launched("infer attention")) || (rc = matmul(s, s->xn, s->y, L->wo, n, QD, D)))
        return rc;
    add_kernel<<<grid_for((size_t)n * D), THREADS, 0, s->stream>>>(s->x, s->xn, (size_t)n * D);
    rmsnorm_kernel<<<n, THREADS, 0, s->stream>>>(s->xn, s->x, L->ffn_norm, D, eps);
    if ((rc = launched("infer rmsnorm")) || (rc = matmul(s, s->a, s->xn, L->w1, n, D, F)) ||
        (rc = matmul(s, s->b, s->xn, L->w3, n, D, F)))
        return rc;
    swiglu_kernel<<<grid_for((size_t)n * F), THREADS, 0, s->stream>>>(s->a, s->b, (size_t)n * F);
    if ((rc = launched("infer swiglu")) || (rc = matmul(s, s->xn, s->a, L->w2, n, F, D)))
        return rc;
    add_kernel<<<grid_for((size_t)n * D), THREADS, 0, s->stream>>>(s->x, s->xn, (size_t)n * D);
    return launched("infer add");
}

extern "C" int cuda_infer_forward(cuda_infer_t *s, const int32_t *tokens, int n, float *logits)
{
    if (n < 1 || n > s->max_batch || n > s->cap - s->pos)
        return cuda_err(-EINVAL, "infer: %d tokens at position %d (at most %d a call, %d positions)", n, s->pos,
                        s->max_batch, s->cap);
    int rc;
    CU(cudaMemcpyAsync(s->tokens, tokens, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, s->stream));
    embed_kernel<<<n, THREADS, 0, s->stream>>>(s->x, s->embed, s->tokens, s->D);
    if ((rc = launched("infer embedding")))
        return rc;
    for (int i = 0; i < s->cfg.n_layers; i++)
        if ((rc = layer_step(s, &s->l[i], n)))
            return rc;
    rmsnorm_kernel<<<1, THREADS, 0, s->stream>>>(s->xn, s->x + (size_t)(n - 1) * s->D, s->norm, s->D,
                                                 (float)s->cfg.norm_eps);
    if ((rc = launched("infer rmsnorm")) || (rc = matmul(s, s->logits, s->xn, s->out, 1, s->D, s->V)))
        return rc;
    CU(cudaMemcpyAsync(logits, s->logits, (size_t)s->V * sizeof(float), cudaMemcpyDeviceToHost, s->stream));
    CU(cudaStreamSynchronize(s->stream));
    s->pos += n;
    return 0;
}

extern "C" void cuda_infer_destroy(cuda_infer_t **ps)
{
    cuda_infer_t *s = *ps;
    if (!s)
        return;
    if (s->stream)
        cudaStreamSynchronize(s->stream);
    cudaFree(s->w);
    cudaFree(s->mem);
    if (s->stream)
        cudaStreamDestroy(s->stream);
    free(s->l);
    free(s);
    *ps = NULL;
}

extern "C" int cuda_infer_pos(const cuda_infer_t *s) { return s->pos; }
extern "C" size_t cuda_infer_bytes(const cuda_infer_t *s) { return s->bytes; }

// The weights' device views, from the flat layout of kernels/params.h.
static void bind(cuda_infer_t *s, const param_table_t *tab)
{
#define AT(kind, layer) (s->w + tab->t[params_find(tab, kind, layer)].offset)
    s->embed = AT(PARAM_EMBED, -1);
    s->norm = AT(PARAM_NORM, -1);
    s->out = AT(PARAM_OUTPUT, -1);
    for (int i = 0; i < s->cfg.n_layers; i++) {
        layer_t *L = &s->l[i];
        L->attn_norm = AT(PARAM_ATTN_NORM, i);
        L->wq = AT(PARAM_WQ, i);
        L->wk = AT(PARAM_WK, i);
        L->wv = AT(PARAM_WV, i);
        L->wo = AT(PARAM_WO, i);
        L->ffn_norm = AT(PARAM_FFN_NORM, i);
        L->w1 = AT(PARAM_W1, i);
        L->w3 = AT(PARAM_W3, i);
        L->w2 = AT(PARAM_W2, i);
    }
#undef AT
}

// Caches, tables and buffers from one allocation; the rotary tables as the CPU's (double, rounded once).
static int carve(cuda_infer_t *s)
{
    size_t B = s->max_batch, C = s->cap, D = s->D, QD = s->QD, KD = s->KD, F = s->F, V = s->V;
    size_t half = s->hd / 2, nl = s->cfg.n_layers, H = s->cfg.n_heads;
    size_t floats = nl * 2 * C * KD + 2 * C * half + B * (2 * D + 2 * QD + 2 * F) + B * H * C + V + B;
    CU(cudaMalloc((void **)&s->mem, floats * sizeof(float)));
    s->bytes += floats * sizeof(float);
    float *p = s->mem;
#define TAKE(n) (p += (n), p - (n))
    for (size_t i = 0; i < nl; i++) {
        s->l[i].kc = TAKE(C * KD);
        s->l[i].vc = TAKE(C * KD);
    }
    s->rope_cos = TAKE(C * half); s->rope_sin = TAKE(C * half);
    s->x = TAKE(B * D); s->xn = TAKE(B * D); s->q = TAKE(B * QD); s->y = TAKE(B * QD);
    s->a = TAKE(B * F); s->b = TAKE(B * F); s->scores = TAKE(B * H * C); s->logits = TAKE(V);
    s->tokens = (int32_t *)TAKE(B);
#undef TAKE
    float *cs = (float *)malloc(2 * C * half * sizeof(float));
    if (!cs)
        return cuda_err(-ENOMEM, "infer: out of memory for the rotary tables");
    for (size_t i = 0; i < half; i++) {
        double f = config_rope_inv_freq(&s->cfg, (int)i);
        for (size_t t = 0; t < C; t++) {
            cs[t * half + i] = (float)cos((double)t * f);
            cs[C * half + t * half + i] = (float)sin((double)t * f);
        }
    }
    int rc = cuda_err_status((int)cudaMemcpy(s->rope_cos, cs, 2 * C * half * sizeof(float), cudaMemcpyHostToDevice),
                             "infer: the rotary tables");
    free(cs);
    return rc;
}

extern "C" int cuda_infer_new(cuda_infer_t **out, const model_config_t *cfg, const float *w, int capacity,
                              int max_batch)
{
    *out = NULL;
    if (capacity < 1 || capacity > cfg->max_seq_len || max_batch < 1 || max_batch > capacity)
        return cuda_err(-EINVAL, "infer: a cache of %d positions with %d tokens a call (max_seq_len %d)", capacity,
                        max_batch, cfg->max_seq_len);
    cuda_infer_t *s = (cuda_infer_t *)calloc(1, sizeof(*s));
    if (!s || !(s->l = (layer_t *)calloc((size_t)cfg->n_layers, sizeof(layer_t)))) {
        free(s);
        return cuda_err(-ENOMEM, "infer: out of memory");
    }
    s->cfg = *cfg;
    s->D = cfg->dim;
    s->hd = config_head_dim(cfg);
    s->QD = cfg->n_heads * s->hd;
    s->KD = cfg->n_kv_heads * s->hd;
    s->F = config_ffn_hidden(cfg);
    s->V = cfg->vocab_size;
    s->cap = capacity;
    s->max_batch = max_batch;
    param_table_t tab;
    if (params_table_init(&tab, cfg)) {
        cuda_infer_destroy(&s);
        return cuda_err(-ENOMEM, "infer: out of memory for the parameter table");
    }
    size_t nw = tab.total * sizeof(float);
    int rc = cuda_err_status((int)cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "infer: a stream");
    if (!rc)
        rc = cuda_err_status((int)cudaMalloc((void **)&s->w, nw), "infer: the weights");
    if (!rc) {
        s->bytes += nw;
        rc = cuda_err_status((int)cudaMemcpy(s->w, w, nw, cudaMemcpyHostToDevice), "infer: the weights");
    }
    if (!rc) {
        bind(s, &tab);
        rc = carve(s);
    }
    params_table_free(&tab);
    if (rc) {
        cuda_infer_destroy(&s);
        return rc;
    }
    *out = s;
    return 0;
}
