/* KV-cache inference on the CPU (see infer.h). Each layer writes the new tokens' keys and
 * values (after rope) straight into its cache rows; attention is by query head, one query row
 * at a time against the cache (two matrix-vector products), so nothing of size T x T is ever
 * held. Tasks are fixed by the shape: the bits never depend on the thread count. */
#include "kernels/cpu/infer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#undef I /* <complex.h>, pulled in by cblas.h */

#include "kernels/ops.h"
#include "kernels/params.h"

typedef struct {
    const float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w3, *w2; /* views into w */
    float *kc, *vc; /* (capacity, KD) cache, keys after rope */
} infer_layer_t;

struct infer {
    model_config_t cfg;
    pool_t *pool;
    int D, hd, QD, KD, F, V, cap, max_batch, logit_rows, pos;
    const float *embed, *norm, *out;
    infer_layer_t *l;
    float *rope_cos, *rope_sin; /* (capacity, hd/2) */
    size_t bytes;
    float *base; /* the one allocation of everything below and the caches */
    float *x, *xn, *q, *y, *a, *b, *r; /* (B, D) (B, D) (B, QD) (B, QD) (B, F) (B, F) (B) */
    float *scores;  /* (n_heads, capacity) */
    float *logits;  /* (logit_rows, V) */
};

static const float *weight(const param_table_t *tab, const float *w, param_kind_t kind, int layer)
{
    return w + tab->t[params_find(tab, kind, layer)].offset;
}

static int bind_weights(infer_t *s, const float *w)
{
    param_table_t tab;
    if (params_table_init(&tab, &s->cfg))
        return -1;
    s->embed = weight(&tab, w, PARAM_EMBED, -1);
    s->norm = weight(&tab, w, PARAM_NORM, -1);
    s->out = weight(&tab, w, PARAM_OUTPUT, -1);
    for (int i = 0; i < s->cfg.n_layers; i++) {
        infer_layer_t *L = &s->l[i];
        L->attn_norm = weight(&tab, w, PARAM_ATTN_NORM, i);
        L->wq = weight(&tab, w, PARAM_WQ, i);
        L->wk = weight(&tab, w, PARAM_WK, i);
        L->wv = weight(&tab, w, PARAM_WV, i);
        L->wo = weight(&tab, w, PARAM_WO, i);
        L->ffn_norm = weight(&tab, w, PARAM_FFN_NORM, i);
        L->w1 = weight(&tab, w, PARAM_W1, i);
        L->w3 = weight(&tab, w, PARAM_W3, i);
        L->w2 = weight(&tab, w, PARAM_W2, i);
    }
    params_table_free(&tab);
    return 0;
}

/* cos and sin of t * inv_freq(i), computed in double and rounded once. */
static void rope_tables(infer_t *s)
{
    int half = s->hd / 2;
    for (int i = 0; i < half; i++) {
        double f = config_rope_inv_freq(&s->cfg, i);
        for (int t = 0; t < s->cap; t++) {
            s->rope_cos[(size_t)t * half + i] = (float)cos(t * f);
            s->rope_sin[(size_t)t * half + i] = (float)sin(t * f);
        }
    }
}

size_t infer_bytes_for(const model_config_t *cfg, int capacity, int max_batch, int all_logits)
{
    size_t B = max_batch, C = capacity, D = cfg->dim, hd = config_head_dim(cfg), QD = cfg->n_heads * hd;
    size_t KD = cfg->n_kv_heads * hd, F = config_ffn_hidden(cfg), V = cfg->vocab_size, nl = cfg->n_layers;
    size_t total = nl * 2 * C * KD + 2 * C * (hd / 2) + B * (2 * D + 2 * QD + 2 * F + 1) + (all_logits ? B : 1) * V +
                   (size_t)cfg->n_heads * C;
    return total * sizeof(float);
}

/* Carves every buffer from one allocation (infer_bytes_for's). */
static int alloc_buffers(infer_t *s)
{
    size_t B = s->max_batch, C = s->cap, D = s->D, QD = s->QD, KD = s->KD, F = s->F, V = s->V;
    size_t half = s->hd / 2, nl = s->cfg.n_layers;
    size_t total = infer_bytes_for(&s->cfg, s->cap, s->max_batch, s->logit_rows > 1) / sizeof(float);
    if (!(s->base = malloc(total * sizeof(float))))
        return -1;
    float *p = s->base;
#define TAKE(n) (p += (n), p - (n))
    for (size_t i = 0; i < nl; i++) {
        s->l[i].kc = TAKE(C * KD);
        s->l[i].vc = TAKE(C * KD);
    }
    s->rope_cos = TAKE(C * half); s->rope_sin = TAKE(C * half);
    s->x = TAKE(B * D); s->xn = TAKE(B * D); s->q = TAKE(B * QD); s->y = TAKE(B * QD);
    s->a = TAKE(B * F); s->b = TAKE(B * F); s->r = TAKE(B); s->logits = TAKE((size_t)s->logit_rows * V);
    s->scores = TAKE((size_t)s->cfg.n_heads * C);
#undef TAKE
    s->bytes = total * sizeof(float);
    return 0;
}

infer_t *infer_new(const model_config_t *cfg, const float *w, int capacity, int max_batch, int all_logits,
                   pool_t *pool)
{
    if (capacity < 1 || capacity > cfg->max_seq_len || max_batch < 1 || max_batch > capacity)
        return NULL;
    infer_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->cfg = *cfg;
    s->pool = pool;
    s->D = cfg->dim;
    s->hd = config_head_dim(cfg);
    s->QD = cfg->n_heads * s->hd;
    s->KD = cfg->n_kv_heads * s->hd;
    s->F = config_ffn_hidden(cfg);
    s->V = cfg->vocab_size;
    s->cap = capacity;
    s->max_batch = max_batch;
    s->logit_rows = all_logits ? max_batch : 1;
    s->l = calloc((size_t)cfg->n_layers, sizeof(infer_layer_t));
    if (!s->l || bind_weights(s, w) || alloc_buffers(s)) {
        infer_destroy(&s);
        return NULL;
    }
    rope_tables(s);
    return s;
}

void infer_destroy(infer_t **ps)
{
    infer_t *s = *ps;
    if (!s)
        return;
    free(s->base);
    free(s->l);
    free(s);
    *ps = NULL;
}

int infer_pos(const infer_t *s) { return s->pos; }
int infer_capacity(const infer_t *s) { return s->cap; }
void infer_reset(infer_t *s) { s->pos = 0; }
size_t infer_bytes(const infer_t *s) { return s->bytes; }

typedef struct {
    infer_t *s;
    const infer_layer_t *L;
    int n, p0;
} attn_ctx_t;

/* One query head over the n new rows: scores against the cache up to each row's own position,
 * softmax, the weighted sum of the values. */
static void attn_head(void *c, int h)
{
    const attn_ctx_t *j = c;
    const infer_t *s = j->s;
    int hd = s->hd, kh = h / (s->cfg.n_heads / s->cfg.n_kv_heads);
    float scale = 1.0f / sqrtf((float)hd), *sc = s->scores + (size_t)h * s->cap;
    const float *k = j->L->kc + (size_t)kh * hd, *v = j->L->vc + (size_t)kh * hd;
    for (int i = 0; i < j->n; i++) {
        int len = j->p0 + i + 1;
        const float *q = s->q + (size_t)i * s->QD + (size_t)h * hd;
        float *y = s->y + (size_t)i * s->QD + (size_t)h * hd;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, len, hd, scale, k, s->KD, q, 1, 0.0f, sc, 1);
        float mx = -INFINITY, sum = 0;
        for (int t = 0; t < len; t++)
            mx = sc[t] > mx ? sc[t] : mx;
        for (int t = 0; t < len; t++)
            sum += sc[t] = expf(sc[t] - mx);
        cblas_sgemv(CblasRowMajor, CblasTrans, len, hd, 1.0f / sum, v, s->KD, sc, 1, 0.0f, y, 1);
    }
}

static void add_into(float *y, const float *r, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        y[i] += r[i];
}

/* x += wo(attn(rope(wq xn), cache)); x += w2(silu(w1 xn') * w3 xn'), as model.c's layer. */
static void layer_step(infer_t *s, const infer_layer_t *L, int n)
{
    pool_t *P = s->pool;
    int D = s->D, QD = s->QD, KD = s->KD, F = s->F, half = s->hd / 2, p0 = s->pos;
    float eps = (float)s->cfg.norm_eps, *kc = L->kc + (size_t)p0 * KD, *vc = L->vc + (size_t)p0 * KD;
    const float *c = s->rope_cos + (size_t)p0 * half, *sn = s->rope_sin + (size_t)p0 * half;
    ops_rmsnorm_fwd(P, s->xn, s->r, s->x, L->attn_norm, n, D, eps);
    ops_matmul_fwd(P, s->q, s->xn, L->wq, n, D, QD);
    ops_matmul_fwd(P, kc, s->xn, L->wk, n, D, KD);
    ops_matmul_fwd(P, vc, s->xn, L->wv, n, D, KD);
    ops_rope_fwd(P, s->q, c, sn, 1, n, s->cfg.n_heads, s->hd);
    ops_rope_fwd(P, kc, c, sn, 1, n, s->cfg.n_kv_heads, s->hd);
    attn_ctx_t j = {s, L, n, p0};
    pool_for(P, s->cfg.n_heads, attn_head, &j);
    ops_matmul_fwd(P, s->xn, s->y, L->wo, n, QD, D);
    add_into(s->x, s->xn, (size_t)n * D);
    ops_rmsnorm_fwd(P, s->xn, s->r, s->x, L->ffn_norm, n, D, eps);
    ops_matmul_fwd(P, s->a, s->xn, L->w1, n, D, F);
    ops_matmul_fwd(P, s->b, s->xn, L->w3, n, D, F);
    ops_swiglu_fwd(P, s->a, s->a, s->b, (size_t)n * F);
    ops_matmul_fwd(P, s->xn, s->a, L->w2, n, F, D);
    add_into(s->x, s->xn, (size_t)n * D);
}

const float *infer_forward(infer_t *s, const int32_t *tokens, int n, int all_logits)
{
    int rows = all_logits ? n : 1;
    if (n < 1 || n > s->max_batch || n > s->cap - s->pos || rows > s->logit_rows)
        return NULL;
    ops_embed_fwd(s->pool, s->x, s->embed, tokens, n, s->D);
    for (int i = 0; i < s->cfg.n_layers; i++)
        layer_step(s, &s->l[i], n);
    s->pos += n;
    const float *top = s->x + (size_t)(n - rows) * s->D;
    ops_rmsnorm_fwd(s->pool, s->xn, s->r, top, s->norm, rows, s->D, (float)s->cfg.norm_eps);
    ops_matmul_fwd(s->pool, s->logits, s->xn, s->out, rows, s->D, s->V);
    return s->logits;
}
