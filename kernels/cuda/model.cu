// The Llama model on one GPU (cuda_model.h): the CPU model's equations (kernels/cpu/model.c)
// with the CUDA kernels, one stream per model, bf16 tensors and fp32 accumulation.
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "kernels/act_groups.h"
#include "kernels/params.h"
}
#include "kernels/cuda/cuda_attn.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_matmul.h"
#include "kernels/cuda/cuda_model.h"
#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/cudnn_sdpa.h"
#include "kernels/cuda/nn_common.cuh"

extern "C" const char *cuda_model_last_error(void) { return cuda_err_text(); }

static int cuda_rc(cudaError_t e, const char *what) { return cuda_err_status(e, what); }

/* An op's return code, its message prefixed with the call (copied first: the text is shared). */
#define OP(call)                                                                              \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_) {                                                                           \
            char why_[512];                                                                  \
            snprintf(why_, sizeof(why_), "%s", cuda_err_text());                             \
            return cuda_err(rc_, "%s (%s:%d): %s", #call, __FILE__, __LINE__, why_);         \
        }                                                                                    \
    } while (0)
#define NN(call) OP(call)
#define MM(call) OP(call)
#define AT(call) OP(call)
#define CU(call)                                                                              \
    do {                                                                                     \
        int rc_ = cuda_rc((call), #call);                                                    \
        if (rc_)                                                                             \
            return rc_;                                                                      \
    } while (0)

typedef uint16_t bf16_t; /* the bits of a bfloat16 */

typedef struct {
    bf16_t *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w3, *w2;  /* into the weights */
    float *d_attn_norm, *dwq, *dwk, *dwv, *dwo, *d_ffn_norm, *dw1, *dw3, *dw2; /* into grads */
} layer_w_t;

typedef struct {
    float *h;      /* pinned */
    size_t cap, n; /* floats: room, and this step's */
} kept_loss_t;

struct cuda_model {
    model_config_t cfg;
    param_table_t tab;
    int has_embed, has_head, layer0, nl;
    size_t begin, end;              /* flat range of the held pieces */
    size_t own_b, own_e;            /* the part of it w and g hold: all of it, or with parameter
                                     * sharding this replica's (cfg own_begin, own_end) */
    shard_io_t io;                  /* parameter sharding: each piece's weights gathered, its
                                     * gradients given (params.h); none: w and g are whole */
    int D, H, K, hd, QD, KD, F, V;
    bf16_t *w;                      /* (own_e - own_b + CUDA_MODEL_SLACK) bf16 weights */
    float *g;                       /* (own_e - own_b + CUDA_MODEL_SLACK) fp32 weight gradients */
    float *rope_cos, *rope_sin;     /* (max_seq_len, hd/2) */
    layer_w_t *lw;
    bf16_t *embed, *norm, *out;
    float *d_embed, *d_norm, *d_out;
    cudaStream_t stream;
    cuda_matmul_ctx_t *mm;
    /* Work sets (kernels/cpu/model.c's scheme) shared by every microbatch: of a checkpointed
     * layer what W reads too (WS_W) and what only B reads (WS_B); of a layer that keeps the rest
     * the gradients B keeps for W (WS_G). Made with cudaMalloc as needed (first at acts_new)
     * and kept. */
    act_wset_t ws[WS_KINDS];
    /* The losses kept by forwards given loss NULL (cuda_model_loss_take): forward k of a step
     * copies its per-token losses into pinned block k (made at its first use, kept), read once
     * the event recorded after the last copy has completed (not the whole stream: the backward
     * that follows the head's forward may still run, its gradients ordered for their readers
     * by the data plane). */
    kept_loss_t *kept;
    int n_kept, kept_cap;
    cudaEvent_t kept_ev;
    /* The attention (cfg.attn): cuDNN's fused kernels while sdpa is open, else attn.cu's. The
     * first forward of a (B, T) decides for both directions against attn.cu's (attn_decide); the
     * shapes so decided are kept. */
    cudnn_sdpa_t *sdpa;
    struct { int B, T; bool cudnn; } seen[8];
    int n_seen;
    /* The head's logits, act_head_rows of them at a time (forward): one chunk for every
     * microbatch, made at acts_new for the largest and kept. */
    bf16_t *head_buf;
    size_t head_bytes;
};

typedef struct {
    bf16_t *h_in, *xn1, *q, *k, *v, *y, *h1, *xn2, *a, *b, *m;   /* forward */
    float *r1, *r2, *lse;
    bf16_t *df, *da, *db, *dxn2, *dh1, *dq, *dk, *dv, *dxn1;      /* kept by backward B for W */
} layer_acts_t;

struct cuda_model_acts {
    int B, T, N;
    void *base;                     /* the one device allocation */
    layer_acts_t *l;
    int32_t *tokens, *targets;      /* (N) device */
    float *io;                      /* (N, D) fp32 device: hand-offs in and out (none when the
                                     * model holds both the embedding and the head) */
    bf16_t *x_first, *x_top;        /* (N, D): input of the first layer, output of the last */
    bf16_t *hf, *dhf;               /* head: (N, D), (N, D): the final norm's output, its gradient
                                     * (the logits are the model's head_buf, a chunk at a time) */
    float *rf, *loss;               /* (N) */
    bf16_t *d_bottom;               /* (N, D): gradient of the held pieces' input */
    bf16_t *s_dm, *s_dy;            /* scratch (N, F), (N, max(QD, D)) */
    float *delta;                   /* (B, H, T) attention backward scratch */
    size_t bytes;                   /* of base */
    void **unit;                    /* (nl, WS_KINDS) the work sets bound to layer i, or NULL */
};

static config_keep_t keep_of(const cuda_model_t *m, int i) { return config_ac_keep(&m->cfg, m->layer0 + i); }

/* What a microbatch's storage holds of layer i, and the kind of work set its gradients for W
 * are in (kernels/act_groups.h). */
static int held_mask(const cuda_model_t *m, int i) { return act_held_mask(keep_of(m, i)); }
static int grads_kind(const cuda_model_t *m, int i) { return act_grads_kind(keep_of(m, i)); }

// ---- small kernels ----

// y = x + r (the residual adds): elements [0, 8 n8) eight at a time (nn_load8: every array
// 16-byte aligned), the rest one by one, the same bits both ways; y may alias x or r.
__global__ static void k_add(bf16_t *y, const bf16_t *x, const bf16_t *r, size_t n, size_t n8)
{
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = tid; j < n8; j += stride) {
        float a[8], b[8];
        nn_load8(a, x + 8 * j);
        nn_load8(b, r + 8 * j);
#pragma unroll
        for (int k = 0; k < 8; k++)
            a[k] += b[k];
        nn_store8(y + 8 * j, a);
    }
    for (size_t i = 8 * n8 + tid; i < n; i += stride)
        y[i] = nn_f32_to_bf16(nn_bf16_to_f32(x[i]) + nn_bf16_to_f32(r[i]));
}

__global__ static void k_to_f32(float *y, const bf16_t *x, size_t n)
{
    const __nv_bfloat16 *X = (const __nv_bfloat16 *)x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(X[i]);
}

static int add(cuda_model_t *m, bf16_t *y, const bf16_t *x, const bf16_t *r, size_t n)
{
    size_t n8 = nn_aligned16(y) && nn_aligned16(x) && nn_aligned16(r) ? n / 8 : 0;
    k_add<<<nn_grid_for(n8 + (n - 8 * n8), 256), 256, 0, m->stream>>>(y, x, r, n, n8);
    return cuda_rc(cudaGetLastError(), "add kernel");
}

static int to_bf16(cuda_model_t *m, bf16_t *y, const float *x, size_t n)
{
    return cuda_f32_to_bf16_dev(y, x, n, m->stream);
}

static int to_f32(cuda_model_t *m, float *y, const bf16_t *x, size_t n)
{
    k_to_f32<<<nn_grid_for(n, 256), 256, 0, m->stream>>>(y, x, n);
    return cuda_rc(cudaGetLastError(), "bf16 -> fp32 kernel");
}

// ---- the model ----

/* Offset of tensor (kind, layer) in a buffer that holds the flat space from `at`. */
static size_t woff(cuda_model_t *m, param_kind_t kind, int layer, size_t at)
{
    return m->tab.t[params_find(&m->tab, kind, layer)].offset - at;
}

/* Piece p's weight pointers into W and its gradient pointers into G (either NULL: left as
 * they are), each holding the flat space from `at`. */
static void bind_piece(cuda_model_t *m, int p, bf16_t *W, float *G, size_t at)
{
    if (p == 0 && m->has_embed) {
        if (W)
            m->embed = W + woff(m, PARAM_EMBED, -1, at);
        if (G)
            m->d_embed = G + woff(m, PARAM_EMBED, -1, at);
        return;
    }
    if (p == m->cfg.n_layers + 1 && m->has_head) {
        if (W)
            m->norm = W + woff(m, PARAM_NORM, -1, at), m->out = W + woff(m, PARAM_OUTPUT, -1, at);
        if (G)
            m->d_norm = G + woff(m, PARAM_NORM, -1, at), m->d_out = G + woff(m, PARAM_OUTPUT, -1, at);
        return;
    }
    int i = p - 1 - m->layer0, l = p - 1;
    if (i < 0 || i >= m->nl)
        return;
    layer_w_t *w = &m->lw[i];
#define B2(f, d, k)                                    \
    do {                                               \
        if (W)                                         \
            w->f = W + woff(m, k, l, at);              \
        if (G)                                         \
            w->d = G + woff(m, k, l, at);              \
    } while (0)
    B2(attn_norm, d_attn_norm, PARAM_ATTN_NORM); B2(wq, dwq, PARAM_WQ); B2(wk, dwk, PARAM_WK);
    B2(wv, dwv, PARAM_WV); B2(wo, dwo, PARAM_WO); B2(ffn_norm, d_ffn_norm, PARAM_FFN_NORM);
    B2(w1, dw1, PARAM_W1); B2(w3, dw3, PARAM_W3); B2(w2, dw2, PARAM_W2);
#undef B2
}

/* Whole weights and gradients: every piece's pointers into w and g, once. With parameter
 * sharding each piece is bound as it is used (piece_weights, grads_take). */
static void bind(cuda_model_t *m)
{
    if (m->own_b != m->begin || m->own_e != m->end)
        return;
    int p0 = m->has_embed ? 0 : m->layer0 + 1, p1 = m->layer0 + m->nl + 1 + m->has_head;
    for (int p = p0; p < p1; p++)
        bind_piece(m, p, m->w, m->g, m->begin);
}

/* Parameter sharding: before piece p's forward or backward, its weights gathered; `next` the
 * piece that will be asked for after it (-1: none), which io may gather meanwhile. */
static int piece_weights(cuda_model_t *m, int p, int next)
{
    if (!m->io.weights)
        return m->own_b == m->begin && m->own_e == m->end
                   ? 0 : cuda_err(-EINVAL, "parameter sharding: the model holds a part of its weights and no shard io");
    size_t lo, hi, nlo = 0, nhi = 0;
    params_piece_range(&m->tab, p, p + 1, &lo, &hi);
    if (next >= 0)
        params_piece_range(&m->tab, next, next + 1, &nlo, &nhi);
    void *w;
    char why[512];
    int rc = m->io.weights(m->io.arg, lo, hi, nlo, nhi, &w);
    if (rc) { /* the text is shared: copied first */
        snprintf(why, sizeof(why), "%s", cuda_err_text());
        return cuda_err(rc, "parameter sharding: the weights of piece %d: %s", p, why);
    }
    bind_piece(m, p, (bf16_t *)w, NULL, lo);
    return 0;
}

/* Parameter sharding: before piece p's W, its gradients into the buffer io lends, zeroed. */
static int grads_take(cuda_model_t *m, int p, size_t *lo, size_t *hi)
{
    if (!m->io.take)
        return m->own_b == m->begin && m->own_e == m->end
                   ? 0 : cuda_err(-EINVAL, "parameter sharding: the model holds a part of its gradients and no shard io");
    params_piece_range(&m->tab, p, p + 1, lo, hi);
    float *g;
    char why[512];
    int rc = m->io.take(m->io.arg, *lo, *hi, &g);
    if (rc) {
        snprintf(why, sizeof(why), "%s", cuda_err_text());
        return cuda_err(rc, "parameter sharding: a buffer for the gradients of piece %d: %s", p, why);
    }
    CU(cudaMemsetAsync(g, 0, (*hi - *lo) * sizeof(float), m->stream));
    bind_piece(m, p, NULL, g, *lo);
    return 0;
}

/* ... and after it, the group's reduce-scatter of them. */
static int grads_give(cuda_model_t *m, size_t lo, size_t hi)
{
    char why[512];
    int rc = m->io.give ? m->io.give(m->io.arg, lo, hi) : 0;
    if (!rc)
        return 0;
    snprintf(why, sizeof(why), "%s", cuda_err_text());
    return cuda_err(rc, "parameter sharding: the reduce-scatter of [%zu, %zu): %s", lo, hi, why);
}

extern "C" void cuda_model_destroy(cuda_model_t **pm)
{
    cuda_model_t *m = *pm;
    if (!m)
        return;
    if (m->stream)
        cudaStreamSynchronize(m->stream);
    cuda_matmul_ctx_destroy(&m->mm);
    cudnn_sdpa_close(&m->sdpa);
    cudaFree(m->w);
    cudaFree(m->g);
    cudaFree(m->head_buf);
    cudaFree(m->rope_cos);
    cudaFree(m->rope_sin);
    for (int k = 0; k < m->kept_cap; k++)
        cudaFreeHost(m->kept[k].h);
    free(m->kept);
    if (m->kept_ev)
        cudaEventDestroy(m->kept_ev);
    for (int k = 0; k < WS_KINDS; k++) {
        for (int u = 0; u < m->ws[k].n; u++)
            cudaFree(m->ws[k].u[u]);
        free(m->ws[k].u);
        free(m->ws[k].used);
    }
    if (m->stream)
        cudaStreamDestroy(m->stream);
    free(m->lw);
    params_table_free(&m->tab);
    free(m);
    *pm = NULL;
}

/* The rotary tables. Without scaling the device computes theta^(-2i/hd) itself (the bits the
 * tables always had); with Llama 3.1's scaling the host's config_rope_inv_freq gives the
 * frequencies, uploaded on the model's stream (ordered before the table kernel; synced before
 * freq goes out of scope), so that CPU and GPU use the same frequencies. */
static int rope_tables(cuda_model_t *m, const model_config_t *cfg)
{
    if (!(cfg->rope_scaling_factor > 0)) {
        NN(cuda_rope_table(m->rope_cos, m->rope_sin, cfg->max_seq_len, m->hd, cfg->rope_theta, m->stream));
        return 0;
    }
    double freq[64]; /* hd <= 128 (model_init) */
    for (int i = 0; i < m->hd / 2; i++)
        freq[i] = config_rope_inv_freq(cfg, i);
    double *dfreq = NULL;
    CU(cudaMalloc((void **)&dfreq, sizeof(freq)));
    int rc = cuda_rc(cudaMemcpyAsync(dfreq, freq, (size_t)(m->hd / 2) * sizeof(double), cudaMemcpyHostToDevice,
                                     m->stream), "cudaMemcpyAsync rope frequencies");
    if (!rc)
        rc = cuda_rope_table_freq(m->rope_cos, m->rope_sin, cfg->max_seq_len, m->hd, dfreq, m->stream);
    if (!rc)
        rc = cuda_rc(cudaStreamSynchronize(m->stream), "cudaStreamSynchronize");
    cudaFree(dfreq);
    return rc;
}

static int model_init(cuda_model_t *m, const model_config_t *cfg, int p0, int p1)
{
    m->cfg = *cfg;
    if (params_table_init(&m->tab, cfg))
        return cuda_err(-ENOMEM, "out of memory for the parameter table");
    m->has_embed = p0 == 0;
    m->has_head = p1 == cfg->n_layers + 2;
    int l0 = p0 > 1 ? p0 - 1 : 0, l1 = p1 - 1 < cfg->n_layers ? p1 - 1 : cfg->n_layers;
    m->layer0 = l0;
    m->nl = l1 > l0 ? l1 - l0 : 0;
    params_piece_range(&m->tab, p0, p1, &m->begin, &m->end);
    m->own_b = m->begin, m->own_e = m->end;
    if (cfg->own_end) {
        if (cfg->own_begin < m->begin || cfg->own_end > m->end || cfg->own_begin > cfg->own_end)
            return cuda_err(-EINVAL, "parameter sharding: part [%zu, %zu) outside the pieces' range [%zu, %zu)",
                            cfg->own_begin, cfg->own_end, m->begin, m->end);
        m->own_b = cfg->own_begin, m->own_e = cfg->own_end;
    }
    m->D = cfg->dim, m->H = cfg->n_heads, m->K = cfg->n_kv_heads, m->hd = config_head_dim(cfg);
    m->QD = m->H * m->hd, m->KD = m->K * m->hd, m->F = config_ffn_hidden(cfg), m->V = cfg->vocab_size;
    if (m->hd != 16 && m->hd != 32 && m->hd != 64 && m->hd != 128)
        return cuda_err(-EINVAL, "head dimension %d (dim %d / n_heads %d): the CUDA attention takes 16, 32, 64 or 128",
                    m->hd, m->D, m->H);
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0)
        return cuda_err(-ENODEV, "no usable CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    if (!(m->lw = (layer_w_t *)calloc(m->nl ? m->nl : 1, sizeof(layer_w_t))))
        return cuda_err(-ENOMEM, "out of memory");
    size_t n = m->own_e - m->own_b, half = (size_t)cfg->max_seq_len * (m->hd / 2);
    CU(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&m->kept_ev, cudaEventDisableTiming));
    CU(cudaMalloc((void **)&m->w, (n + CUDA_MODEL_SLACK) * sizeof(bf16_t)));
    CU(cudaMalloc((void **)&m->g, (n + CUDA_MODEL_SLACK) * sizeof(float)));
    CU(cudaMemsetAsync(m->w, 0, (n + CUDA_MODEL_SLACK) * sizeof(bf16_t), m->stream));
    CU(cudaMemsetAsync(m->g, 0, (n + CUDA_MODEL_SLACK) * sizeof(float), m->stream));
    CU(cudaMalloc((void **)&m->rope_cos, half * sizeof(float)));
    CU(cudaMalloc((void **)&m->rope_sin, half * sizeof(float)));
    int rc = rope_tables(m, cfg);
    if (rc)
        return rc;
    MM(cuda_matmul_ctx_new(&m->mm));
    bind(m);
    act_wsets_t ws; /* kernels/act_groups.h: what each kind holds, and how many a step needs at least */
    act_wsets(cfg, m->layer0, m->layer0 + m->nl, &ws);
    for (int k = 0; k < WS_KINDS; k++)
        m->ws[k].mask = ws.mask[k], m->ws[k].min = ws.min[k];
    CU(cudaStreamSynchronize(m->stream));
    return 0;
}

static int attn_open(cuda_model_t *m);

extern "C" int cuda_model_new(cuda_model_t **out, const model_config_t *cfg, int p0, int p1)
{
    *out = NULL;
    if (p0 < 0 || p1 > cfg->n_layers + 2 || p0 >= p1)
        return cuda_err(-EINVAL, "pieces [%d, %d) of a model with %d", p0, p1, cfg->n_layers + 2);
    cuda_model_t *m = (cuda_model_t *)calloc(1, sizeof(*m));
    if (!m)
        return cuda_err(-ENOMEM, "out of memory");
    int rc = model_init(m, cfg, p0, p1);
    if (!rc)
        rc = attn_open(m);
    if (rc) {
        cuda_model_destroy(&m);
        return rc;
    }
    *out = m;
    return 0;
}

/* The fp32 weights land in the gradient buffer, free between steps (take_grads left it zero),
 * are converted from there and the buffer zeroed again: no host staging (a pinned copy of the
 * range was 4 bytes a parameter of every GPU stage's host memory). From pinned memory (offload
 * pins its range of the shared segment: plugin.cu pin_host) the copy runs at the bus's rate. */
extern "C" int cuda_model_set_weights(cuda_model_t *m, const float *host)
{
    size_t n = m->own_e - m->own_b;
    CU(cudaMemcpyAsync(m->g, host, n * sizeof(float), cudaMemcpyHostToDevice, m->stream));
    int rc = to_bf16(m, m->w, m->g, n);
    if (rc)
        return rc;
    CU(cudaMemsetAsync(m->g, 0, n * sizeof(float), m->stream));
    CU(cudaStreamSynchronize(m->stream));
    return 0;
}

extern "C" int cuda_model_take_grads(cuda_model_t *m, float *host)
{
    size_t n = m->own_e - m->own_b;
    CU(cudaMemcpyAsync(host, m->g, n * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    CU(cudaMemsetAsync(m->g, 0, n * sizeof(float), m->stream));
    CU(cudaStreamSynchronize(m->stream));
    return 0;
}

extern "C" int cuda_model_set_weights_bf16(cuda_model_t *m, const uint16_t *host)
{
    size_t n = m->own_e - m->own_b;
    CU(cudaMemcpyAsync(m->w, host, n * sizeof(uint16_t), cudaMemcpyHostToDevice, m->stream));
    CU(cudaMemsetAsync(m->g, 0, n * sizeof(float), m->stream)); /* as the fp32 upload leaves them */
    CU(cudaStreamSynchronize(m->stream));
    return 0;
}

extern "C" int cuda_model_take_grads_bf16(cuda_model_t *m, uint16_t *host)
{
    size_t n = m->own_e - m->own_b;
    int rc = to_bf16(m, m->w, m->g, n);
    if (rc)
        return rc;
    CU(cudaMemcpyAsync(host, m->w, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, m->stream));
    CU(cudaMemsetAsync(m->g, 0, n * sizeof(float), m->stream));
    CU(cudaStreamSynchronize(m->stream));
    return 0;
}

// ---- activations ----

extern "C" void cuda_model_acts_destroy(cuda_model_acts_t **pa)
{
    cuda_model_acts_t *a = *pa;
    if (!a)
        return;
    cudaFree(a->base);
    free(a->l);
    free(a->unit);
    free(a);
    *pa = NULL;
}

/* Carves n elements of size es, 256-byte aligned, at offset *off of base (or just counts when
 * base is 0: no pointer arithmetic on a null pointer, which is undefined). */
static void *take(char *base, size_t *off, size_t n, size_t es)
{
    char *r = base ? base + *off : NULL;
    *off += (n * es + 255) / 256 * 256;
    return r;
}

/* Points the tensors of the groups in mask at base (NULL: at nothing) in mode none's layout;
 * returns the bytes they take. Other groups' pointers are left alone. */
static size_t carve_layer(const cuda_model_t *m, layer_acts_t *L, char *base, int mask, int B, int T)
{
    size_t N = (size_t)B * T, D = m->D, QD = m->QD, KD = m->KD, F = m->F, BHT = (size_t)B * m->H * T;
    size_t off = 0;
#define G16(g, f, n) (L->f = (mask & (g)) ? (bf16_t *)take(base, &off, (n), 2) : L->f)
#define G32(g, f, n) (L->f = (mask & (g)) ? (float *)take(base, &off, (n), 4) : L->f)
    G16(G_IN, h_in, N * D); G16(G_REST, xn1, N * D);
    G16(G_OPB, q, N * QD); G16(G_OPB, k, N * KD); G16(G_OPB, v, N * KD);
    G16(G_OPW, y, N * QD); G16(G_OPW, h1, N * D); G16(G_REST, xn2, N * D);
    G16(G_OPB, a, N * F); G16(G_OPB, b, N * F); G16(G_REST, m, N * F);
    G32(G_REST, r1, N); G32(G_REST, r2, N); G32(G_OPB, lse, BHT);
    G16(G_GRAD, df, N * D); G16(G_GRAD, da, N * F); G16(G_GRAD, db, N * F); G16(G_GRAD, dxn2, N * D);
    G16(G_GRAD, dh1, N * D); G16(G_GRAD, dq, N * QD); G16(G_GRAD, dk, N * KD); G16(G_GRAD, dv, N * KD);
    G16(G_GRAD, dxn1, N * D);
#undef G16
#undef G32
    return off;
}

static size_t carve(const cuda_model_t *m, cuda_model_acts_t *a, char *base)
{
    size_t N = a->N, D = m->D, QD = m->QD, F = m->F, BHT = (size_t)a->B * m->H * a->T;
    size_t off = 0;
#define T16(n) (bf16_t *)take(base, &off, (n), 2)
#define T32(n) (float *)take(base, &off, (n), 4)
    for (int i = 0; i < m->nl; i++)
        off += carve_layer(m, &a->l[i], base ? base + off : NULL, held_mask(m, i), a->B, a->T);
    a->tokens = (int32_t *)take(base, &off, N, 4);
    a->targets = (int32_t *)take(base, &off, N, 4);
    a->io = m->has_embed && m->has_head ? NULL : T32(N * D);
    a->x_top = T16(N * D);
    a->d_bottom = T16(N * D);
    a->s_dm = T16(N * F);
    a->s_dy = T16(N * (QD > D ? QD : D));
    a->delta = T32(BHT);
    if (m->has_head) {
        a->hf = T16(N * D); a->dhf = T16(N * D);
        a->rf = T32(N); a->loss = T32(N);
    }
#undef T16
#undef T32
    return off;
}

static int dev_alloc(void **p, size_t bytes) { return cuda_rc(cudaMalloc(p, bytes), "cudaMalloc (a work set)"); }

/* The head's chunk for N-row microbatches (act_head_rows; the same rounding as act_bytes.c's):
 * a larger one replaces it, once the stream has run what reads it. */
static int head_fit(cuda_model_t *m, int N)
{
    if (!m->has_head)
        return 0;
    size_t need = ((size_t)act_head_rows(&m->cfg, N) * m->V * 2 + 255) / 256 * 256;
    if (need <= m->head_bytes)
        return 0;
    CU(cudaStreamSynchronize(m->stream));
    cudaFree(m->head_buf);
    m->head_buf = NULL, m->head_bytes = 0;
    CU(cudaMalloc((void **)&m->head_buf, need));
    m->head_bytes = need;
    return 0;
}

/* Sizes the work sets for [B, T] microbatches (a larger one made while none is in use replaces
 * them) and makes what a forward and a backward with its W hold (min). */
static int units_fit(cuda_model_t *m, int B, int T)
{
    for (int k = 0; k < WS_KINDS; k++) {
        act_wset_t *w = &m->ws[k];
        if (!w->mask)
            continue;
        layer_acts_t tmp;
        memset(&tmp, 0, sizeof(tmp));
        size_t need = carve_layer(m, &tmp, NULL, w->mask, B, T);
        if (need > w->bytes) {
            for (int u = 0; u < w->n; u++)
                if (w->used[u])
                    return cuda_err(-EBUSY, "activations of a larger microbatch while the work sets are in use");
            CU(cudaStreamSynchronize(m->stream));
            for (int u = 0; u < w->n; u++)
                cudaFree(w->u[u]);
            w->n = 0;
            w->bytes = need;
        }
        while (w->n < w->min) {
            int u = act_wset_new(w, dev_alloc);
            if (u < 0)
                return u == -ENOMEM ? cuda_err(u, "out of memory") : u;
        }
    }
    return 0;
}

/* Binds layer i of a to a free work set of kind k (a new one when all are in use: a schedule
 * that holds W back); nothing when the model has none of that kind. Stream order keeps reuse
 * safe: the work set's last reader was queued before. */
static int unit_take(cuda_model_t *m, cuda_model_acts_t *a, int i, int k)
{
    act_wset_t *w = &m->ws[k];
    if (!w->mask)
        return 0;
    int rc = 0;
    void *p = act_wset_take(w, dev_alloc, &rc);
    if (!p)
        return rc == -ENOMEM ? cuda_err(rc, "out of memory") : rc;
    a->unit[WS_KINDS * i + k] = p;
    carve_layer(m, &a->l[i], (char *)p, w->mask, a->B, a->T);
    return 0;
}

static void unit_give(cuda_model_t *m, cuda_model_acts_t *a, int i, int k)
{
    void *p = a->unit[WS_KINDS * i + k];
    if (!p)
        return;
    act_wset_give(&m->ws[k], p);
    carve_layer(m, &a->l[i], NULL, m->ws[k].mask, a->B, a->T);
    a->unit[WS_KINDS * i + k] = NULL;
}

extern "C" int cuda_model_acts_new(cuda_model_acts_t **out, cuda_model_t *m, int B, int T)
{
    *out = NULL;
    if (B <= 0 || T <= 0 || T > m->cfg.max_seq_len)
        return cuda_err(-EINVAL, "microbatch %d x %d (max_seq_len %d)", B, T, m->cfg.max_seq_len);
    cuda_model_acts_t *a = (cuda_model_acts_t *)calloc(1, sizeof(*a));
    if (!a)
        return cuda_err(-ENOMEM, "out of memory");
    a->B = B, a->T = T, a->N = B * T;
    a->l = (layer_acts_t *)calloc(m->nl ? m->nl : 1, sizeof(layer_acts_t));
    a->unit = (void **)calloc((size_t)(m->nl ? m->nl : 1) * WS_KINDS, sizeof(void *));
    int rc = a->l && a->unit ? 0 : cuda_err(-ENOMEM, "out of memory");
    size_t bytes = rc ? 0 : carve(m, a, NULL); /* sizes only: offsets from 0 */
    a->bytes = bytes;
    if (!rc)
        rc = cuda_rc(cudaMalloc(&a->base, bytes), "cudaMalloc (activations)");
    if (!rc)
        rc = units_fit(m, B, T);
    if (!rc)
        rc = head_fit(m, a->N);
    if (rc) {
        cuda_model_acts_destroy(&a);
        return rc;
    }
    carve(m, a, (char *)a->base);
    a->x_first = m->nl ? a->l[0].h_in : a->x_top;
    *out = a;
    return 0;
}

// ---- attention: cuDNN's or attn.cu's ----

/* cfg.attn auto: cuDNN if it loads (a note on stderr when not); cudnn: or fail; ctitan: never.
 * On the emulator "cuDNN" is tests/cudasim/cudnn_sim.cpp's stand-in, absent unless a test asks. */
static int attn_open(cuda_model_t *m)
{
    if (m->cfg.attn == CONFIG_ATTN_OWN)
        return 0;
    char why[512];
    int rc = cudnn_sdpa_open(&m->sdpa, why, sizeof why);
    if (rc && m->cfg.attn == CONFIG_ATTN_CUDNN)
        return cuda_err(rc, "training.attention = \"cudnn\": %s", why);
#ifndef CTITAN_CUDASIM
    if (rc)
        fprintf(stderr, "note: attention on ctitan's kernels (kernels/cuda/attn.cu): %s\n", why);
#endif
    return 0;
}

static float bf16_value(bf16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* sqrt(sum (a-b)^2 / sum b^2) of n device values (bf16 when es is 2, else fp32). */
static int rel_rms(double *out, const void *da, const void *db, size_t n, size_t es)
{
    void *ha = malloc(n * es), *hb = malloc(n * es);
    if (!ha || !hb) {
        free(ha), free(hb);
        return cuda_err(-ENOMEM, "out of host memory");
    }
    int rc = cuda_rc(cudaMemcpy(ha, da, n * es, cudaMemcpyDeviceToHost), "copy for the attention check");
    if (!rc)
        rc = cuda_rc(cudaMemcpy(hb, db, n * es, cudaMemcpyDeviceToHost), "copy for the attention check");
    double num = 0, den = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        double a = es == 2 ? bf16_value(((bf16_t *)ha)[i]) : ((float *)ha)[i];
        double b = es == 2 ? bf16_value(((bf16_t *)hb)[i]) : ((float *)hb)[i];
        num += (a - b) * (a - b), den += b * b;
    }
    *out = den > 0 ? sqrt(num / den) : sqrt(num);
    if (num != num)
        *out = INFINITY;
    free(ha), free(hb);
    return rc;
}

/* Whether cuDNN's results (cud, on the device) agree with attn.cu's (own) on the same inputs:
 * each array's relative RMS difference within tol (bf16 rounding of the outputs and of P, dS
 * before their products is ~4e-3; a wrong mask, scale or head mapping is O(0.1..1)). */
typedef struct { const char *name; void *cud, *own; size_t n, es; } cmp_t;
static int attn_agrees(bool *ok, char *what, size_t wlen, const cmp_t *c, int nc, double tol)
{
    *ok = true;
    size_t off = 0;
    what[0] = 0;
    for (int i = 0; i < nc; i++) {
        double r = 0;
        int rc = rel_rms(&r, c[i].cud, c[i].own, c[i].n, c[i].es);
        if (rc)
            return rc;
        *ok = *ok && r <= tol;
        if (off < wlen)
            off += (size_t)snprintf(what + off, wlen - off, "%s%s %.2e", i ? ", " : "", c[i].name, r);
    }
    return 0;
}

/* The decided shape (B, T): its index, or -1. */
static int attn_shape(const cuda_model_t *m, int B, int T)
{
    for (int i = 0; i < m->n_seen; i++)
        if (m->seen[i].B == B && m->seen[i].T == T)
            return i;
    return -1;
}

/* attn.cu's for a shape whose cuDNN call failed or disagreed (auto; an error for "cudnn"). */
static int attn_give_up(cuda_model_t *m, const char *why)
{
    if (m->cfg.attn == CONFIG_ATTN_CUDNN)
        return cuda_err(-EIO, "training.attention = \"cudnn\": %s", why);
    fprintf(stderr, "note: attention on ctitan's kernels (kernels/cuda/attn.cu): cuDNN's %s\n", why);
    return 0;
}

static void *scratch(size_t bytes)
{
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

/* The first forward of a shape decides for both directions, before any cuDNN result is kept
 * past it: cuDNN's forward into the layer's out and lse, attn.cu's into scratch, compared; then
 * both backwards on the same inputs into scratch, with the layer's q standing in for the
 * upstream gradient, compared. On disagreement or a failure attn.cu's forward results replace
 * cuDNN's and the shape stays on attn.cu's ("auto"; "cudnn" fails): a fresh process replaying
 * the step, or a resumed run, decides the same way on the same inputs. */
static int attn_decide(cuda_model_t *m, cuda_model_acts_t *a, layer_acts_t *L)
{
    int slot = m->n_seen++;
    m->seen[slot].B = a->B, m->seen[slot].T = a->T, m->seen[slot].cudnn = false;
    int B = a->B, T = a->T, H = m->H, K = m->K, hd = m->hd;
    void *s = m->stream;
    size_t nq = (size_t)a->N * m->QD, nk = (size_t)a->N * m->KD, nr = (size_t)B * H * T;
    char why[768];
    int rc = cudnn_sdpa_fwd(m->sdpa, L->y, L->lse, L->q, L->k, L->v, B, T, H, K, hd, s);
    if (rc) {
        snprintf(why, sizeof why, "forward for B %d T %d: %s", B, T, cudnn_sdpa_error(m->sdpa));
        rc = attn_give_up(m, why);
        if (!rc)
            rc = cuda_attn_fwd(L->y, L->lse, L->q, L->k, L->v, B, T, H, K, hd, s);
        return rc;
    }
    /* scratch: attn.cu's forward; each side's dq, dk, dv and delta */
    size_t bytes[] = {nq * 2, nr * 4, nq * 2, nk * 2, nk * 2, nr * 4, nq * 2, nk * 2, nk * 2, nr * 4};
    void *p[10] = {0};
    size_t total = 0;
    bool have = true;
    for (int i = 0; i < 10; i++) {
        p[i] = scratch(bytes[i]);
        have = have && p[i];
        total += bytes[i];
    }
    bf16_t *y2 = (bf16_t *)p[0], *dq1 = (bf16_t *)p[2], *dk1 = (bf16_t *)p[3], *dv1 = (bf16_t *)p[4];
    bf16_t *dq2 = (bf16_t *)p[6], *dk2 = (bf16_t *)p[7], *dv2 = (bf16_t *)p[8];
    float *lse2 = (float *)p[1], *dl1 = (float *)p[5], *dl2 = (float *)p[9];
    rc = have ? 0 : cuda_err(-ENOMEM, "attention check: %zu bytes of device memory", total);
    if (!rc)
        rc = cuda_attn_fwd(y2, lse2, L->q, L->k, L->v, B, T, H, K, hd, s);
    bool ok = false, bwd_ok = false;
    char fwd_what[128] = "", bwd_what[160] = "";
    if (!rc) {
        /* cuDNN's backward may fail to plan: that is a disagreement, not an error */
        int brc = cudnn_sdpa_bwd(m->sdpa, dq1, dk1, dv1, dl1, L->q, L->q, L->k, L->v, L->y, L->lse, B, T, H, K, hd, s);
        if (brc)
            snprintf(bwd_what, sizeof bwd_what, "%s", cudnn_sdpa_error(m->sdpa));
        rc = cuda_attn_bwd(dq2, dk2, dv2, dl2, L->q, L->q, L->k, L->v, y2, lse2, B, T, H, K, hd, s);
        if (!rc)
            rc = cuda_rc(cudaStreamSynchronize(m->stream), "attention check");
        cmp_t f[] = {{"out", L->y, y2, nq, 2}, {"lse", L->lse, lse2, nr, 4}};
        if (!rc)
            rc = attn_agrees(&ok, fwd_what, sizeof fwd_what, f, 2, 2e-2);
        cmp_t g[] = {{"dq", dq1, dq2, nq, 2}, {"dk", dk1, dk2, nk, 2}, {"dv", dv1, dv2, nk, 2}};
        if (!rc && !brc)
            rc = attn_agrees(&bwd_ok, bwd_what, sizeof bwd_what, g, 3, 2e-2);
    }
    if (!rc && ok && bwd_ok) {
        m->seen[slot].cudnn = true;
        fprintf(stderr, "note: attention on cuDNN %ld's fused kernels for B %d T %d: they agree with ctitan's "
                        "(relative RMS: forward %s; backward %s)\n",
                cudnn_sdpa_version(m->sdpa), B, T, fwd_what, bwd_what);
    } else if (!rc) {
        rc = cuda_rc(cudaMemcpyAsync(L->y, y2, nq * 2, cudaMemcpyDeviceToDevice, m->stream), "copy");
        if (!rc)
            rc = cuda_rc(cudaMemcpyAsync(L->lse, lse2, nr * 4, cudaMemcpyDeviceToDevice, m->stream), "copy");
        if (!rc)
            rc = cuda_rc(cudaStreamSynchronize(m->stream), "attention check");
        snprintf(why, sizeof why, "attention for B %d T %d is not ctitan's (forward, relative RMS: %s; backward: %s)",
                 B, T, fwd_what, bwd_what);
        if (!rc)
            rc = attn_give_up(m, why);
    }
    for (int i = 0; i < 10; i++)
        cudaFree(p[i]);
    return rc;
}

static int attn_fwd(cuda_model_t *m, cuda_model_acts_t *a, layer_acts_t *L)
{
    void *s = m->stream;
    int k = m->sdpa ? attn_shape(m, a->B, a->T) : -1;
    if (m->sdpa && k < 0 && m->n_seen < (int)(sizeof m->seen / sizeof m->seen[0]))
        return attn_decide(m, a, L);
    if (k >= 0 && m->seen[k].cudnn) {
        int rc = cudnn_sdpa_fwd(m->sdpa, L->y, L->lse, L->q, L->k, L->v, a->B, a->T, m->H, m->K, m->hd, s);
        return rc ? cuda_err(rc, "cuDNN attention forward: %s", cudnn_sdpa_error(m->sdpa)) : 0;
    }
    AT(cuda_attn_fwd(L->y, L->lse, L->q, L->k, L->v, a->B, a->T, m->H, m->K, m->hd, s));
    return 0;
}

/* As the forward of the same shape decided (a backward always follows its shape's forward). */
static int attn_bwd(cuda_model_t *m, cuda_model_acts_t *a, layer_acts_t *L)
{
    void *s = m->stream;
    int k = m->sdpa ? attn_shape(m, a->B, a->T) : -1;
    if (k >= 0 && m->seen[k].cudnn) {
        int rc = cudnn_sdpa_bwd(m->sdpa, L->dq, L->dk, L->dv, a->delta, a->s_dy, L->q, L->k, L->v, L->y, L->lse,
                                a->B, a->T, m->H, m->K, m->hd, s);
        return rc ? cuda_err(rc, "cuDNN attention backward: %s", cudnn_sdpa_error(m->sdpa)) : 0;
    }
    AT(cuda_attn_bwd(L->dq, L->dk, L->dv, a->delta, a->s_dy, L->q, L->k, L->v, L->y, L->lse, a->B, a->T, m->H,
                     m->K, m->hd, s));
    return 0;
}

// ---- forward and backward (the equations are kernels/cpu/model.c's) ----

/* out NULL: a recompute for the backward, which needs everything but the output. */
static int layer_forward(cuda_model_t *m, cuda_model_acts_t *a, int i, bf16_t *out)
{
    layer_w_t *w = &m->lw[i];
    layer_acts_t *L = &a->l[i];
    int N = a->N, D = m->D, QD = m->QD, KD = m->KD, F = m->F;
    void *s = m->stream;
    float eps = (float)m->cfg.norm_eps;
    NN(cuda_rmsnorm_fwd(L->xn1, L->r1, L->h_in, w->attn_norm, N, D, eps, s));
    MM(cuda_matmul_fwd(m->mm, L->q, L->xn1, w->wq, N, D, QD, s));
    MM(cuda_matmul_fwd(m->mm, L->k, L->xn1, w->wk, N, D, KD, s));
    MM(cuda_matmul_fwd(m->mm, L->v, L->xn1, w->wv, N, D, KD, s));
    NN(cuda_rope_fwd(L->q, m->rope_cos, m->rope_sin, a->B, a->T, m->H, m->hd, s));
    NN(cuda_rope_fwd(L->k, m->rope_cos, m->rope_sin, a->B, a->T, m->K, m->hd, s));
    int rc = attn_fwd(m, a, L);
    if (rc)
        return rc;
    MM(cuda_matmul_fwd(m->mm, L->h1, L->y, w->wo, N, QD, D, s));
    rc = add(m, L->h1, L->h1, L->h_in, (size_t)N * D);
    if (rc)
        return rc;
    NN(cuda_rmsnorm_fwd(L->xn2, L->r2, L->h1, w->ffn_norm, N, D, eps, s));
    MM(cuda_matmul_fwd(m->mm, L->a, L->xn2, w->w1, N, D, F, s));
    MM(cuda_matmul_fwd(m->mm, L->b, L->xn2, w->w3, N, D, F, s));
    NN(cuda_swiglu_fwd(L->m, L->a, L->b, (size_t)N * F, s));
    if (!out)
        return 0;
    MM(cuda_matmul_fwd(m->mm, out, L->m, w->w2, N, F, D, s));
    return add(m, out, out, L->h1, (size_t)N * D);
}

/* What a checkpointed layer did not keep, made again by its forward's kernels on the same
 * inputs: the same bits. */
static int layer_recompute(cuda_model_t *m, cuda_model_acts_t *a, int i)
{
    if (keep_of(m, i) == CONFIG_KEEP_INPUT)
        return layer_forward(m, a, i, NULL);
    layer_w_t *w = &m->lw[i];
    layer_acts_t *L = &a->l[i];
    int N = a->N, D = m->D, F = m->F;
    void *s = m->stream;
    float eps = (float)m->cfg.norm_eps;
    NN(cuda_rmsnorm_fwd(L->xn1, L->r1, L->h_in, w->attn_norm, N, D, eps, s));
    NN(cuda_rmsnorm_fwd(L->xn2, L->r2, L->h1, w->ffn_norm, N, D, eps, s));
    NN(cuda_swiglu_fwd(L->m, L->a, L->b, (size_t)N * F, s));
    return 0;
}

static int layer_backward_b(cuda_model_t *m, cuda_model_acts_t *a, int i, bf16_t *dh_in)
{
    layer_w_t *w = &m->lw[i];
    layer_acts_t *L = &a->l[i];
    int N = a->N, D = m->D, QD = m->QD, KD = m->KD, F = m->F;
    void *s = m->stream;
    MM(cuda_matmul_bwd_x(m->mm, a->s_dm, L->df, w->w2, N, F, D, 0, s));
    NN(cuda_swiglu_bwd(L->da, L->db, a->s_dm, L->a, L->b, (size_t)N * F, s));
    MM(cuda_matmul_bwd_x(m->mm, L->dxn2, L->da, w->w1, N, D, F, 0, s));
    MM(cuda_matmul_bwd_x(m->mm, L->dxn2, L->db, w->w3, N, D, F, 1, s));
    NN(cuda_rmsnorm_bwd_x(L->dh1, L->dxn2, L->h1, L->r2, w->ffn_norm, N, D, L->df, s)); /* + the residual's */
    MM(cuda_matmul_bwd_x(m->mm, a->s_dy, L->dh1, w->wo, N, QD, D, 0, s));
    int rc = attn_bwd(m, a, L);
    if (rc)
        return rc;
    NN(cuda_rope_bwd(L->dq, m->rope_cos, m->rope_sin, a->B, a->T, m->H, m->hd, s));
    NN(cuda_rope_bwd(L->dk, m->rope_cos, m->rope_sin, a->B, a->T, m->K, m->hd, s));
    MM(cuda_matmul_bwd_x(m->mm, L->dxn1, L->dq, w->wq, N, D, QD, 0, s));
    MM(cuda_matmul_bwd_x(m->mm, L->dxn1, L->dk, w->wk, N, D, KD, 1, s));
    MM(cuda_matmul_bwd_x(m->mm, L->dxn1, L->dv, w->wv, N, D, KD, 1, s));
    NN(cuda_rmsnorm_bwd_x(dh_in, L->dxn1, L->h_in, L->r1, w->attn_norm, N, D, L->dh1, s));
    return 0;
}

static int layer_backward_w(cuda_model_t *m, cuda_model_acts_t *a, int i)
{
    size_t lo = 0, hi = 0;
    int rc = grads_take(m, m->layer0 + i + 1, &lo, &hi);
    if (rc)
        return rc;
    layer_w_t *w = &m->lw[i];
    layer_acts_t *L = &a->l[i];
    int N = a->N, D = m->D, QD = m->QD, KD = m->KD, F = m->F;
    void *s = m->stream;
    MM(cuda_matmul_bwd_w(m->mm, w->dw2, L->df, L->m, N, F, D, s));
    MM(cuda_matmul_bwd_w(m->mm, w->dw1, L->da, L->xn2, N, D, F, s));
    MM(cuda_matmul_bwd_w(m->mm, w->dw3, L->db, L->xn2, N, D, F, s));
    NN(cuda_rmsnorm_bwd_w(w->d_ffn_norm, L->dxn2, L->h1, L->r2, N, D, s));
    MM(cuda_matmul_bwd_w(m->mm, w->dwo, L->dh1, L->y, N, QD, D, s));
    MM(cuda_matmul_bwd_w(m->mm, w->dwq, L->dq, L->xn1, N, D, QD, s));
    MM(cuda_matmul_bwd_w(m->mm, w->dwk, L->dk, L->xn1, N, D, KD, s));
    MM(cuda_matmul_bwd_w(m->mm, w->dwv, L->dv, L->xn1, N, D, KD, s));
    NN(cuda_rmsnorm_bwd_w(w->d_attn_norm, L->dxn1, L->h_in, L->r1, N, D, s));
    return grads_give(m, lo, hi);
}

/* The pinned block of the step's next kept loss, of room for n floats (made or grown only in a
 * step that finds it missing or short, after waiting for the copies into it). */
static int kept_block(cuda_model_t *m, size_t n, float **h)
{
    if (m->n_kept == m->kept_cap) {
        void *p = realloc(m->kept, (size_t)(m->kept_cap + 1) * sizeof(*m->kept));
        if (!p)
            return cuda_err(-ENOMEM, "out of memory");
        m->kept = (kept_loss_t *)p;
        memset(&m->kept[m->kept_cap++], 0, sizeof(kept_loss_t));
    }
    kept_loss_t *b = &m->kept[m->n_kept];
    if (b->cap < n) {
        CU(cudaStreamSynchronize(m->stream)); /* a step dropped at a recovery may still copy into it */
        cudaFreeHost(b->h);
        b->h = NULL, b->cap = 0;
        CU(cudaMallocHost((void **)&b->h, n * sizeof(float)));
        b->cap = n;
    }
    b->n = n;
    m->n_kept++;
    *h = b->h;
    return 0;
}

/* One forward's loss: its tokens' in token order, as the CPU model sums them. */
static double kept_sum(const kept_loss_t *b)
{
    double sum = 0;
    for (size_t n = 0; n < b->n; n++)
        sum += b->h[n];
    return sum;
}

extern "C" int cuda_model_loss_take(cuda_model_t *m, double *loss)
{
    *loss = 0;
    if (!m->n_kept)
        return 0;
    int k = m->n_kept;
    m->n_kept = 0;
    CU(cudaEventSynchronize(m->kept_ev)); /* the last copy, and so every one before it */
    for (int i = 0; i < k; i++)
        *loss += kept_sum(&m->kept[i]);
    return 0;
}

extern "C" void cuda_model_loss_drop(cuda_model_t *m) { m->n_kept = 0; }

/* The head past its norm, act_head_rows rows at a time in head_buf: their logits, each token's
 * loss and the loss's gradient in the logits' place (cuda_xent), then, unless the model is
 * forward_only, the head's B for those rows (dhf's) and its W (the output projection's
 * gradient; the final norm's once dhf is whole). A backward then needs no logits, so no
 * microbatch keeps its N x V of them. The head's W thus runs in its forward, in the forwards'
 * microbatch order, the order every schedule keeps W in (sched_check), adding into gradients
 * the shards cleared at the last UPDATE, which the stream waited for at the step's begin
 * (plane_step_begin). */
static int head_forward(cuda_model_t *m, cuda_model_acts_t *a, float dscale)
{
    int N = a->N, D = m->D, V = m->V, rows = act_head_rows(&m->cfg, N), grads = !m->cfg.forward_only, rc;
    void *s = m->stream;
    size_t lo = 0, hi = 0;
    if (grads && (rc = grads_take(m, m->cfg.n_layers + 1, &lo, &hi)))
        return rc;
    for (int r = 0; r < N; r += rows) {
        int n = N - r < rows ? N - r : rows;
        const bf16_t *hf = a->hf + (size_t)r * D;
        MM(cuda_matmul_fwd(m->mm, m->head_buf, hf, m->out, n, D, V, s));
        NN(cuda_xent(m->head_buf, a->loss + r, m->head_buf, a->targets + r, n, V, dscale, s)); /* in place */
        if (!grads)
            continue;
        MM(cuda_matmul_bwd_x(m->mm, a->dhf + (size_t)r * D, m->head_buf, m->out, n, D, V, 0, s));
        MM(cuda_matmul_bwd_w(m->mm, m->d_out, m->head_buf, hf, n, D, V, s));
    }
    if (!grads)
        return 0;
    NN(cuda_rmsnorm_bwd_w(m->d_norm, a->dhf, a->x_top, a->rf, N, D, s));
    return grads_give(m, lo, hi);
}

/* The forward with host fp32 hand-offs (dev = 0) or device bf16 ones (dev = 1). */
static int forward(cuda_model_t *m, cuda_model_acts_t *a, const int32_t *tokens, const void *x_in,
                   const int32_t *targets, float dscale, void *x_out, double *loss, int dev)
{
    size_t N = a->N, D = m->D;
    void *s = m->stream;
    int rc;
    if (loss)
        *loss = 0;
    if (m->has_embed) {
        if ((rc = piece_weights(m, 0, m->nl ? m->layer0 + 1 : m->has_head ? m->cfg.n_layers + 1 : -1)))
            return rc;
        CU(cudaMemcpyAsync(a->tokens, tokens, N * sizeof(int32_t), cudaMemcpyHostToDevice, m->stream));
        NN(cuda_embed_fwd(a->x_first, m->embed, a->tokens, (int)N, m->V, (int)D, s));
    } else if (dev) { /* kept for the backward: the ring slot is the producer's again after this */
        CU(cudaMemcpyAsync(a->x_first, x_in, N * D * sizeof(bf16_t), cudaMemcpyDeviceToDevice, m->stream));
    } else {
        CU(cudaMemcpyAsync(a->io, x_in, N * D * sizeof(float), cudaMemcpyHostToDevice, m->stream));
        if ((rc = to_bf16(m, a->x_first, a->io, N * D)))
            return rc;
    }
    /* device hand-off without the head: the last layer writes the ring slot itself (nothing
     * reads x_top afterwards); a stage without layers copies its input through */
    bf16_t *top = dev && !m->has_head && m->nl ? (bf16_t *)x_out : a->x_top;
    for (int i = 0; i < m->nl; i++) /* a step left unfinished: a backward without its W */
        for (int k = 0; k < WS_KINDS; k++)
            unit_give(m, a, i, k);
    for (int i = 0; i < m->nl; i++) {
        int ck = keep_of(m, i) != CONFIG_KEEP_ALL;
        if (ck && ((rc = unit_take(m, a, i, WS_W)) || (rc = unit_take(m, a, i, WS_B))))
            return rc;
        int next = i + 1 < m->nl ? m->layer0 + i + 2 : m->has_head ? m->cfg.n_layers + 1 : -1;
        if ((rc = piece_weights(m, m->layer0 + i + 1, next)) ||
            (rc = layer_forward(m, a, i, i + 1 < m->nl ? a->l[i + 1].h_in : top)))
            return rc;
        if (ck)
            unit_give(m, a, i, WS_W), unit_give(m, a, i, WS_B);
    }
    if (!m->has_head && dev) {
        if (top != x_out)
            CU(cudaMemcpyAsync(x_out, a->x_top, N * D * sizeof(bf16_t), cudaMemcpyDeviceToDevice, m->stream));
        return 0;
    }
    if (!m->has_head) {
        if ((rc = to_f32(m, a->io, a->x_top, N * D)))
            return rc;
        CU(cudaMemcpyAsync(x_out, a->io, N * D * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
        CU(cudaStreamSynchronize(m->stream));
        return 0;
    }
    if ((rc = piece_weights(m, m->cfg.n_layers + 1, -1)))
        return rc;
    NN(cuda_rmsnorm_fwd(a->hf, a->rf, a->x_top, m->norm, (int)N, (int)D, (float)m->cfg.norm_eps, s));
    if (!targets) { /* nothing reads logits made here (the CPU model's sampling has its own) */
        CU(cudaStreamSynchronize(m->stream));
        return 0;
    }
    CU(cudaMemcpyAsync(a->targets, targets, N * sizeof(int32_t), cudaMemcpyHostToDevice, m->stream));
    if ((rc = head_forward(m, a, dscale)))
        return rc;
    float *h; /* kept: the copy lands by the take's synchronisation */
    if ((rc = kept_block(m, N, &h)))
        return rc;
    CU(cudaMemcpyAsync(h, a->loss, N * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    CU(cudaEventRecord(m->kept_ev, m->stream));
    if (!loss)
        return 0;
    m->n_kept--; /* wanted now: this one only, the kept ones before it stay */
    CU(cudaStreamSynchronize(m->stream));
    *loss = kept_sum(&m->kept[m->n_kept]);
    return 0;
}

extern "C" int cuda_model_forward(cuda_model_t *m, cuda_model_acts_t *a, const int32_t *tokens, const float *x_in,
                                  const int32_t *targets, float dscale, float *x_out, double *loss)
{
    return forward(m, a, tokens, x_in, targets, dscale, x_out, loss, 0);
}

extern "C" int cuda_model_forward_dev(cuda_model_t *m, cuda_model_acts_t *a, const int32_t *tokens,
                                      const uint16_t *x_in, const int32_t *targets, float dscale, uint16_t *x_out,
                                      double *loss)
{
    return forward(m, a, tokens, x_in, targets, dscale, x_out, loss, 1);
}

static int backward_w_embed(cuda_model_t *m, cuda_model_acts_t *a);

/* Backward B, and with fuse each layer's W right after its B (the same bits as B then W: a W
 * adds into its own layer's gradients, which no B reads). A layer's gradients for its W are in
 * a work set bound before the layer above writes its output gradient there, kept until its W
 * (with fuse two at a time, without one per layer): WS_W, into which a checkpointed layer also
 * recomputes, or WS_G. */
static int backward_b(cuda_model_t *m, cuda_model_acts_t *a, const void *dy, void *dx, int dev, int fuse)
{
    size_t N = a->N, D = m->D;
    void *s = m->stream;
    int rc, L = m->nl;
    if (m->cfg.forward_only)
        return cuda_err(-EINVAL, "a backward of a model made forward_only");
    if (L && (rc = unit_take(m, a, L - 1, grads_kind(m, L - 1))))
        return rc;
    bf16_t *top = m->nl ? a->l[m->nl - 1].df : a->d_bottom;
    if (m->has_head) {
        if ((rc = piece_weights(m, m->cfg.n_layers + 1, m->nl ? m->layer0 + m->nl : -1)))
            return rc;
        /* dhf and the head's W came with its forward (head_forward) */
        NN(cuda_rmsnorm_bwd_x(top, a->dhf, a->x_top, a->rf, m->norm, (int)N, (int)D, NULL, s));
    } else if (dev) {
        CU(cudaMemcpyAsync(top, dy, N * D * sizeof(bf16_t), cudaMemcpyDeviceToDevice, m->stream));
    } else {
        CU(cudaMemcpyAsync(a->io, dy, N * D * sizeof(float), cudaMemcpyHostToDevice, m->stream));
        if ((rc = to_bf16(m, top, a->io, N * D)))
            return rc;
    }
    /* device hand-off without the embedding: the first layer writes the ring slot itself (only
     * the embedding's W reads d_bottom) */
    bf16_t *bottom = dev && !m->has_embed && m->nl ? (bf16_t *)dx : a->d_bottom;
    for (int i = m->nl - 1; i >= 0; i--) {
        int ck = keep_of(m, i) != CONFIG_KEEP_ALL;
        if (i > 0 && (rc = unit_take(m, a, i - 1, grads_kind(m, i - 1))))
            return rc;
        if ((rc = piece_weights(m, m->layer0 + i + 1, i > 0 ? m->layer0 + i : -1)) ||
            (ck && ((rc = unit_take(m, a, i, WS_B)) || (rc = layer_recompute(m, a, i)))))
            return rc;
        if ((rc = layer_backward_b(m, a, i, i > 0 ? a->l[i - 1].df : bottom)))
            return rc;
        unit_give(m, a, i, WS_B);
        if (fuse) {
            if ((rc = layer_backward_w(m, a, i)))
                return rc;
            unit_give(m, a, i, grads_kind(m, i));
        }
    }
    if (fuse && m->has_embed && (rc = backward_w_embed(m, a)))
        return rc;
    if (m->has_embed)
        return dev ? 0 : cuda_rc(cudaStreamSynchronize(m->stream), "cudaStreamSynchronize");
    if (dev) {
        if (bottom != dx)
            CU(cudaMemcpyAsync(dx, a->d_bottom, N * D * sizeof(bf16_t), cudaMemcpyDeviceToDevice, m->stream));
        return 0;
    }
    if ((rc = to_f32(m, a->io, a->d_bottom, N * D)))
        return rc;
    CU(cudaMemcpyAsync(dx, a->io, N * D * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    CU(cudaStreamSynchronize(m->stream));
    return 0;
}

extern "C" int cuda_model_backward_b(cuda_model_t *m, cuda_model_acts_t *a, const float *dy, float *dx)
{
    return backward_b(m, a, dy, dx, 0, 0);
}

extern "C" int cuda_model_backward_b_dev(cuda_model_t *m, cuda_model_acts_t *a, const uint16_t *dy, uint16_t *dx)
{
    return backward_b(m, a, dy, dx, 1, 0);
}

extern "C" int cuda_model_backward(cuda_model_t *m, cuda_model_acts_t *a, const float *dy, float *dx)
{
    return backward_b(m, a, dy, dx, 0, 1);
}

extern "C" int cuda_model_backward_dev(cuda_model_t *m, cuda_model_acts_t *a, const uint16_t *dy, uint16_t *dx)
{
    return backward_b(m, a, dy, dx, 1, 1);
}

extern "C" size_t cuda_model_acts_bytes(const cuda_model_acts_t *a) { return a->bytes; }

extern "C" size_t cuda_model_work_bytes(const cuda_model_t *m)
{
    size_t bytes = 0;
    for (int k = 0; k < WS_KINDS; k++)
        bytes += (size_t)m->ws[k].n * m->ws[k].bytes;
    return bytes + m->head_bytes;
}

static int backward_w_embed(cuda_model_t *m, cuda_model_acts_t *a)
{
    size_t lo = 0, hi = 0;
    int rc = grads_take(m, 0, &lo, &hi);
    if (rc)
        return rc;
    NN(cuda_embed_bwd(m->d_embed, a->d_bottom, a->tokens, a->N, m->V, m->D, m->stream));
    return grads_give(m, lo, hi);
}

extern "C" int cuda_model_backward_w(cuda_model_t *m, cuda_model_acts_t *a)
{
    int rc;
    for (int i = m->nl - 1; i >= 0; i--) { /* the head's W ran in its forward */
        if ((rc = layer_backward_w(m, a, i)))
            return rc;
        unit_give(m, a, i, grads_kind(m, i));
    }
    if (m->has_embed && (rc = backward_w_embed(m, a)))
        return rc;
    return 0; /* stream order: take_grads, cuda_model_sync or the next op waits for it */
}

extern "C" int cuda_model_sync(cuda_model_t *m)
{
    CU(cudaStreamSynchronize(m->stream));
    return 0;
}

extern "C" void *cuda_model_stream(cuda_model_t *m) { return m->stream; }

extern "C" void cuda_model_buffers(cuda_model_t *m, uint16_t **w, float **g, size_t *begin, size_t *end)
{
    *w = m->w;
    *g = m->g;
    *begin = m->own_b;
    *end = m->own_e;
}

extern "C" int cuda_model_shard(cuda_model_t *m, const shard_io_t *io)
{
    if (io && (!io->weights || !io->take || !io->give))
        return cuda_err(-EINVAL, "parameter sharding on the GPU needs the weights gathered and the gradients given");
    if (io && m->own_b == m->begin && m->own_e == m->end && m->begin < m->end)
        return cuda_err(-EINVAL, "parameter sharding: the model holds all its weights (model_config_t own_end 0)");
    m->io = io ? *io : (shard_io_t){0};
    return 0;
}
