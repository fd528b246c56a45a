/* CPU Llama model over a run of pieces: forward, backward B (input gradients) and
 * backward W (weight gradients). See model.h; the equations are in the comments of
 * layer_forward / layer_backward_b / layer_backward_w. */
#include "kernels/cpu/model.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/act_bytes.h"
#include "kernels/act_groups.h"
#include "kernels/ops.h"

typedef struct {
    float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w3, *w2; /* views into params */
    float *d_attn_norm, *dwq, *dwk, *dwv, *dwo, *d_ffn_norm, *dw1, *dw3, *dw2;
} layer_w_t;

struct model {
    model_config_t cfg;
    param_table_t tab;
    int piece_begin, piece_end;
    int layer0, nl;   /* first global layer held, layers held */
    int has_embed, has_head;
    size_t param_begin, param_end;
    float *params, *grads;
    pool_t *pool;
    int D, hd, QD, KD, F, V;
    float *rope_cos, *rope_sin; /* (max_seq_len, hd/2) */
    layer_w_t *lw;
    float *embed, *d_embed, *norm, *d_norm, *out, *d_out;
    /* Work sets shared by every microbatch (kernels/act_groups.h): WS_W of a checkpointed layer
     * from its recompute to its W, WS_B from its recompute to the end of its B (a forward
     * borrows both per layer); WS_G, the gradients for W of another layer, from the B of the
     * layer above to its own W. */
    act_wset_t ws[WS_KINDS];
    int status;         /* the first failure since model_status (-ENOMEM, io's -ECANCELED) */
    shard_io_t io;       /* parameter sharding: where each piece's W goes (take NULL: grads) */
};

typedef struct {
    float *h_in;       /* (N, D) layer input */
    float *r1;         /* (N) */
    float *xn1;        /* (N, D) */
    float *q;          /* (N, QD) after rope */
    float *k, *v;      /* (N, KD), k after rope */
    float *probs;      /* (B, Hq, T, T) */
    float *y;          /* (N, QD) attention output */
    float *h1;         /* (N, D) after the attention residual */
    float *r2;         /* (N) */
    float *xn2;        /* (N, D) */
    float *a, *b, *m;  /* (N, F) gate, up, silu(gate)*up */
    /* kept by backward B for backward W */
    float *df;         /* (N, D) gradient of the layer output */
    float *da, *db;    /* (N, F) */
    float *dxn2;       /* (N, D) */
    float *dh1;        /* (N, D) */
    float *dq, *dk, *dv; /* (N, QD), (N, KD), (N, KD) before rope */
    float *dxn1;       /* (N, D) */
} layer_acts_t;

struct model_acts {
    int B, T, N;
    size_t bytes;
    float *base;          /* the one allocation */
    int32_t *tokens;      /* (N) copy, for the embedding's weight gradient */
    layer_acts_t *l;      /* nl */
    float *h_top;         /* (N, D) input of the head (with the head) */
    float *rf, *hf;       /* (N), (N, D) final norm */
    float *logits;        /* (N, V): dlogits after the forward */
    float *dhf;           /* (N, D) */
    float *dh0;           /* (N, D) gradient of the embedding output */
    float *s_dm;          /* scratch (N, F) */
    float *s_dy;          /* scratch (N, QD), also (N, D) */
    float **unit;         /* (nl, WS_KINDS) the work sets bound to layer i (WS_W, WS_B, WS_G), or NULL */
};

static config_keep_t keep_of(const model_t *m, int i) { return config_ac_keep(&m->cfg, m->layer0 + i); }

/* What a microbatch's storage holds of layer i, and the kind of work set its gradients for W
 * are in (kernels/act_groups.h). */
static int held_mask(const model_t *m, int i) { return act_held_mask(keep_of(m, i)); }
static int grads_kind(const model_t *m, int i) { return act_grads_kind(keep_of(m, i)); }

/* Tensor (kind, layer) in a buffer that holds the flat space from offset `at`. */
static float *tptr(model_t *m, float *base, size_t at, param_kind_t kind, int layer)
{
    if (!base)
        return NULL;
    const param_info_t *p = &m->tab.t[params_find(&m->tab, kind, layer)];
    return base + (p->offset - at);
}

static float *wptr(model_t *m, float *base, param_kind_t kind, int layer)
{
    return tptr(m, base, m->param_begin, kind, layer);
}

/* Layer i's gradient pointers into G, which holds the flat space from `at`. */
static void bind_layer_grads(model_t *m, int i, float *G, size_t at)
{
    layer_w_t *w = &m->lw[i];
    int l = m->layer0 + i;
    w->dwq = tptr(m, G, at, PARAM_WQ, l), w->dwk = tptr(m, G, at, PARAM_WK, l);
    w->dwv = tptr(m, G, at, PARAM_WV, l), w->dwo = tptr(m, G, at, PARAM_WO, l);
    w->dw1 = tptr(m, G, at, PARAM_W1, l), w->dw3 = tptr(m, G, at, PARAM_W3, l);
    w->dw2 = tptr(m, G, at, PARAM_W2, l);
    w->d_attn_norm = tptr(m, G, at, PARAM_ATTN_NORM, l);
    w->d_ffn_norm = tptr(m, G, at, PARAM_FFN_NORM, l);
}

static void bind(model_t *m)
{
    for (int i = 0; i < m->nl; i++) {
        int l = m->layer0 + i;
        layer_w_t *w = &m->lw[i];
        float *P = m->params;
        w->wq = wptr(m, P, PARAM_WQ, l), w->wk = wptr(m, P, PARAM_WK, l);
        w->wv = wptr(m, P, PARAM_WV, l), w->wo = wptr(m, P, PARAM_WO, l);
        w->w1 = wptr(m, P, PARAM_W1, l), w->w3 = wptr(m, P, PARAM_W3, l);
        w->w2 = wptr(m, P, PARAM_W2, l);
        w->attn_norm = wptr(m, P, PARAM_ATTN_NORM, l);
        w->ffn_norm = wptr(m, P, PARAM_FFN_NORM, l);
        bind_layer_grads(m, i, m->grads, m->param_begin);
    }
    if (m->has_embed) {
        m->embed = wptr(m, m->params, PARAM_EMBED, -1);
        m->d_embed = wptr(m, m->grads, PARAM_EMBED, -1);
    }
    if (m->has_head) {
        m->norm = wptr(m, m->params, PARAM_NORM, -1);
        m->out = wptr(m, m->params, PARAM_OUTPUT, -1);
        m->d_norm = wptr(m, m->grads, PARAM_NORM, -1);
        m->d_out = wptr(m, m->grads, PARAM_OUTPUT, -1);
    }
}

void model_set_shard_io(model_t *m, const shard_io_t *io)
{
    m->io = io ? *io : (shard_io_t){0};
    bind(m);
}

/* Before piece p's W: with shard io, its gradient pointers into the buffer io lends for the
 * piece's range [*lo, *hi), zeroed (W adds). Returns 0 to run the W, else it is skipped (a
 * failure: io's now, or an earlier one of this call, in m->status). */
static int grads_take(model_t *m, int piece, size_t *lo, size_t *hi)
{
    if (!m->io.take)
        return 0;
    if (m->status)
        return -1;
    params_piece_range(&m->tab, piece, piece + 1, lo, hi);
    float *G;
    int rc = m->io.take(m->io.arg, *lo, *hi, &G);
    if (rc) {
        m->status = rc;
        return -1;
    }
    memset(G, 0, (*hi - *lo) * sizeof(float));
    if (piece == 0)
        m->d_embed = tptr(m, G, *lo, PARAM_EMBED, -1);
    else if (piece == m->cfg.n_layers + 1)
        m->d_norm = tptr(m, G, *lo, PARAM_NORM, -1), m->d_out = tptr(m, G, *lo, PARAM_OUTPUT, -1);
    else
        bind_layer_grads(m, piece - 1 - m->layer0, G, *lo);
    return 0;
}

/* After piece p's W: io takes the piece's gradients (the group's reduce-scatter). */
static void grads_give(model_t *m, size_t lo, size_t hi)
{
    int rc;
    if (m->io.give && !m->status && (rc = m->io.give(m->io.arg, lo, hi)))
        m->status = rc;
}

model_t *model_new(const model_config_t *cfg, int piece_begin, int piece_end, float *params,
                   float *grads, pool_t *pool)
{
    if (piece_begin < 0 || piece_end > cfg->n_layers + 2 || piece_begin >= piece_end)
        return NULL;
    model_t *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->cfg = *cfg;
    if (params_table_init(&m->tab, cfg)) {
        free(m);
        return NULL;
    }
    m->piece_begin = piece_begin;
    m->piece_end = piece_end;
    m->has_embed = piece_begin == 0;
    m->has_head = piece_end == cfg->n_layers + 2;
    int l0 = piece_begin > 1 ? piece_begin - 1 : 0;
    int l1 = piece_end - 1 < cfg->n_layers ? piece_end - 1 : cfg->n_layers;
    m->layer0 = l0;
    m->nl = l1 > l0 ? l1 - l0 : 0;
    params_piece_range(&m->tab, piece_begin, piece_end, &m->param_begin, &m->param_end);
    m->pool = pool;
    m->D = cfg->dim;
    m->hd = config_head_dim(cfg);
    m->QD = cfg->n_heads * m->hd;
    m->KD = cfg->n_kv_heads * m->hd;
    m->F = config_ffn_hidden(cfg);
    m->V = cfg->vocab_size;
    size_t half = (size_t)cfg->max_seq_len * (size_t)(m->hd / 2);
    m->rope_cos = malloc(half * sizeof(float));
    m->rope_sin = malloc(half * sizeof(float));
    m->lw = calloc((size_t)(m->nl ? m->nl : 1), sizeof(layer_w_t));
    if (!m->rope_cos || !m->rope_sin || !m->lw) {
        model_destroy(&m);
        return NULL;
    }
    double *freq = malloc((size_t)(m->hd / 2 + 1) * sizeof(double));
    if (!freq) {
        model_destroy(&m);
        return NULL;
    }
    for (int i = 0; i < m->hd / 2; i++)
        freq[i] = config_rope_inv_freq(cfg, i);
    ops_rope_table_freq(m->rope_cos, m->rope_sin, cfg->max_seq_len, m->hd, freq);
    free(freq);
    m->params = params;
    m->grads = grads;
    bind(m);
    act_wsets_t ws; /* kernels/act_groups.h: what each kind holds, and how many a step needs at least */
    act_wsets(cfg, m->layer0, m->layer0 + m->nl, &ws);
    for (int k = 0; k < WS_KINDS; k++)
        m->ws[k].mask = ws.mask[k], m->ws[k].min = ws.min[k];
    return m;
}

void model_destroy(model_t **pm)
{
    model_t *m = *pm;
    if (!m)
        return;
    free(m->rope_cos);
    free(m->rope_sin);
    free(m->lw);
    for (int k = 0; k < WS_KINDS; k++) {
        for (int u = 0; u < m->ws[k].n; u++)
            free(m->ws[k].u[u]);
        free(m->ws[k].u);
        free(m->ws[k].used);
    }
    params_table_free(&m->tab);
    free(m);
    *pm = NULL;
}

int model_has_embed(const model_t *m) { return m->has_embed; }
int model_has_head(const model_t *m) { return m->has_head; }

void model_set_buffers(model_t *m, float *params, float *grads)
{
    m->params = params;
    m->grads = grads;
    bind(m);
}

size_t model_acts_bytes_for(const model_config_t *cfg, int piece_begin, int piece_end, int B, int T)
{
    model_act_size_t sz;
    return model_act_bytes(cfg, piece_begin, piece_end, B, T, MODEL_ACT_CPU, &sz) ? 0 : sz.per_mb;
}

size_t model_acts_forward_bytes_for(const model_config_t *cfg, int piece_begin, int piece_end, int B, int T)
{
    int l0 = piece_begin > 1 ? piece_begin - 1 : 0;
    int l1 = piece_end - 1 < cfg->n_layers ? piece_end - 1 : cfg->n_layers, nl = l1 > l0 ? l1 - l0 : 0;
    size_t N = (size_t)B * T, D = (size_t)cfg->dim, hd = (size_t)config_head_dim(cfg);
    size_t QD = (size_t)cfg->n_heads * hd, KD = (size_t)cfg->n_kv_heads * hd, F = (size_t)config_ffn_hidden(cfg);
    /* each layer's input h_in (kept), and of one layer (the work sets every layer reuses) r1,
     * xn1, q, k, v, probs, y, h1, r2, xn2, a, b, m (layer_forward); the tokens */
    size_t floats = (size_t)nl * N * D + N;
    if (nl)
        floats += N * (3 * D + 2 + 2 * QD + 2 * KD + 3 * F) + (size_t)B * cfg->n_heads * T * T;
    if (piece_end == cfg->n_layers + 2) /* h_top, rf, hf, the logits, the loss in s_dy */
        floats += N * (2 * D + 2 + (size_t)cfg->vocab_size);
    return floats * sizeof(float);
}

size_t model_fixed_bytes(const model_config_t *cfg)
{
    return 2 * (size_t)cfg->max_seq_len * (size_t)(config_head_dim(cfg) / 2) * sizeof(float);
}

static float *take(float *base, size_t *off, size_t n)
{
    float *r = base ? base + *off : NULL;
    *off += n;
    return r;
}

/* Points the tensors of the groups in mask at base (NULL: at nothing), in the layout of mode
 * none; returns how many floats they take. Other groups' pointers are left alone. */
static size_t carve_layer(const model_t *m, layer_acts_t *L, float *base, int mask, int B, int T)
{
    size_t N = (size_t)B * T, D = m->D, QD = m->QD, KD = m->KD, F = m->F, off = 0;
    size_t probs = (size_t)B * m->cfg.n_heads * T * T;
#define G(g, f, n) (L->f = (mask & (g)) ? take(base, &off, (n)) : L->f)
    G(G_IN, h_in, N * D); G(G_REST, r1, N); G(G_REST, xn1, N * D);
    G(G_OPB, q, N * QD); G(G_OPB, k, N * KD); G(G_OPB, v, N * KD);
    G(G_OPB, probs, probs); G(G_OPW, y, N * QD); G(G_OPW, h1, N * D);
    G(G_REST, r2, N); G(G_REST, xn2, N * D);
    G(G_OPB, a, N * F); G(G_OPB, b, N * F); G(G_REST, m, N * F);
    G(G_GRAD, df, N * D); G(G_GRAD, da, N * F); G(G_GRAD, db, N * F);
    G(G_GRAD, dxn2, N * D); G(G_GRAD, dh1, N * D);
    G(G_GRAD, dq, N * QD); G(G_GRAD, dk, N * KD); G(G_GRAD, dv, N * KD);
    G(G_GRAD, dxn1, N * D);
#undef G
    return off;
}

/* Floats of one microbatch's storage (the layers' kept groups, scratch, tokens, the head's). */
static size_t acts_floats(const model_t *m, model_acts_t *a, float *base)
{
    size_t N = (size_t)a->N, D = m->D, QD = m->QD, F = m->F, V = m->V, off = 0;
    for (int i = 0; i < m->nl; i++)
        off += carve_layer(m, &a->l[i], base ? base + off : NULL, held_mask(m, i), a->B, a->T);
    a->s_dm = take(base, &off, N * F);
    a->s_dy = take(base, &off, N * (QD > D ? QD : D));
    a->tokens = (int32_t *)take(base, &off, N);
    if (m->has_head) {
        a->h_top = take(base, &off, N * D); a->rf = take(base, &off, N); a->hf = take(base, &off, N * D);
        a->logits = take(base, &off, N * V); a->dhf = take(base, &off, N * D);
    }
    if (m->has_embed)
        a->dh0 = take(base, &off, N * D);
    return off;
}

/* Sizes the model's work sets for [B, T] microbatches: the first acts fixes the size (every
 * stage's microbatches are alike); a larger one made while none is in use replaces them. */
static int units_fit(model_t *m, int B, int T)
{
    for (int k = 0; k < WS_KINDS; k++) {
        act_wset_t *w = &m->ws[k];
        layer_acts_t tmp = {0};
        size_t need = w->mask ? carve_layer(m, &tmp, NULL, w->mask, B, T) * sizeof(float) : 0;
        if (need <= w->bytes)
            continue;
        for (int u = 0; u < w->n; u++)
            if (w->used[u])
                return -EBUSY;
        for (int u = 0; u < w->n; u++)
            free(w->u[u]);
        w->n = 0;
        w->bytes = need;
    }
    return 0;
}

static int host_alloc(void **p, size_t bytes) { return (*p = malloc(bytes)) ? 0 : -ENOMEM; }

/* Binds layer i of a to a free work set of kind k (a new one when all are in use); nothing when
 * the model has none of that kind. */
static int unit_take(model_t *m, model_acts_t *a, int i, int k)
{
    act_wset_t *w = &m->ws[k];
    if (!w->mask)
        return 0;
    int rc = 0;
    float *p = act_wset_take(w, host_alloc, &rc);
    if (!p)
        return m->status = rc;
    a->unit[WS_KINDS * i + k] = p;
    carve_layer(m, &a->l[i], p, w->mask, a->B, a->T);
    return 0;
}

static void unit_give(model_t *m, model_acts_t *a, int i, int k)
{
    float *p = a->unit[WS_KINDS * i + k];
    if (!p)
        return;
    act_wset_give(&m->ws[k], p);
    carve_layer(m, &a->l[i], NULL, m->ws[k].mask, a->B, a->T);
    a->unit[WS_KINDS * i + k] = NULL;
}

model_acts_t *model_acts_new(model_t *m, int B, int T)
{
    if (B <= 0 || T <= 0 || T > m->cfg.max_seq_len)
        return NULL;
    model_acts_t *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->B = B, a->T = T, a->N = B * T;
    a->l = calloc((size_t)(m->nl ? m->nl : 1), sizeof(layer_acts_t));
    a->unit = calloc((size_t)(m->nl ? m->nl : 1) * WS_KINDS, sizeof(float *));
    size_t total = a->l ? acts_floats(m, a, NULL) : 0;
    a->base = malloc(total * sizeof(float));
    if (!a->l || !a->unit || !a->base || units_fit(m, B, T)) {
        model_acts_destroy(&a);
        return NULL;
    }
    acts_floats(m, a, a->base);
    a->bytes = total * sizeof(float);
    /* what a forward and a backward with its W hold: made now, not mid-step */
    for (int k = 0; k < WS_KINDS; k++)
        while (m->ws[k].n < m->ws[k].min)
            if (act_wset_new(&m->ws[k], host_alloc) < 0) {
                model_acts_destroy(&a);
                return NULL;
            }
    return a;
}

void model_acts_destroy(model_acts_t **pa)
{
    model_acts_t *a = *pa;
    if (!a)
        return;
    free(a->base);
    free(a->l);
    free(a->unit);
    free(a);
    *pa = NULL;
}

size_t model_acts_bytes(const model_acts_t *a) { return a->bytes; }

size_t model_work_bytes(const model_t *m)
{
    size_t bytes = 0;
    for (int k = 0; k < WS_KINDS; k++)
        bytes += (size_t)m->ws[k].n * m->ws[k].bytes;
    return bytes;
}

int model_status(model_t *m)
{
    int rc = m->status;
    m->status = 0;
    return rc;
}

const float *model_logits(const model_acts_t *a) { return a->logits; }

/* y = x + r over n floats (y may alias x). */
static void add_into(float *y, const float *x, const float *r, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] + r[i];
}

/* h1 = h + wo(attn(rope(wq xn1), rope(wk xn1), wv xn1)),  xn1 = rmsnorm(h)
 * out = h1 + w2(silu(w1 xn2) * w3 xn2),                    xn2 = rmsnorm(h1)
 * out NULL: a recompute for the backward, which needs everything but the output. */
static void layer_forward(model_t *m, model_acts_t *a, int i, float *out)
{
    layer_w_t *w = &m->lw[i];
    layer_acts_t *L = &a->l[i];
    pool_t *P = m->pool;
    int N = a->N, D = m->D, QD = m->QD, KD = m->KD, F = m->F;
    float eps = (float)m->cfg.norm_eps;
    ops_rmsnorm_fwd(P, L->xn1, L->r1, L->h_in, w->attn_norm, N, D, eps);
    ops_matmul_fwd(P, L->q, L->xn1, w->wq, N, D, QD);
    ops_matmul_fwd(P, L->k, L->xn1, w->wk, N, D, KD);
    ops_matmul_fwd(P, L->v, L->xn1, w->wv, N, D, KD);
    ops_rope_fwd(P, L->q, m->rope_cos, m->rope_sin, a->B, a->T, m->cfg.n_heads, m->hd);
    ops_rope_fwd(P, L->k, m->rope_cos, m->rope_sin, a->B, a->T, m->cfg.n_kv_heads, m->hd);
    ops_attn_fwd(P, L->y, L->probs, L->q, L->k, L->v, a->B, a->T, m->cfg.n_heads,
                 m->cfg.n_kv_heads, m->hd);
    ops_matmul_fwd(P, L->h1, L->y, w->wo, N, QD, D);
    add_into(L->h1, L->h1, L->h_in, (size_t)N * D);
    ops_rmsnorm_fwd(P, L->xn2, L->r2, L->h1, w->ffn_norm, N, D, eps);
    ops_matmul_fwd(P, L->a, L->xn2, w->w1, N, D, F);
    ops_matmul_fwd(P, L->b, L->xn2, w->w3, N, D, F);
    ops_swiglu_fwd(P, L->m, L->a, L->b, (size_t)N * F);
    if (!out)
        return;
    ops_matmul_fwd(P, out, L->m, w->w2, N, F, D);
    add_into(out, out, L->h1, (size_t)N * D);
}

/* What a checkpointed layer did not keep, made again from what it kept, by the same calls on
 * the same inputs as its forward: the same bits. */
static void layer_recompute(model_t *m, model_acts_t *a, int i)
{
    config_keep_t k = keep_of(m, i);
    if (k == CONFIG_KEEP_INPUT) {
        layer_forward(m, a, i, NULL);
        return;
    }
    layer_w_t *w = &m->lw[i];
    layer_acts_t *L = &a->l[i];
    int N = a->N, D = m->D, F = m->F;
    float eps = (float)m->cfg.norm_eps;
    ops_rmsnorm_fwd(m->pool, L->xn1, L->r1, L->h_in, w->attn_norm, N, D, eps);
    ops_rmsnorm_fwd(m->pool, L->xn2, L->r2, L->h1, w->ffn_norm, N, D, eps);
    ops_swiglu_fwd(m->pool, L->m, L->a, L->b, (size_t)N * F);
}

/* Input gradients of one layer, from L->df (gradient of its output) to dh_in. */
static void layer_backward_b(model_t *m, model_acts_t *a, int i, float *dh_in)
{
    layer_w_t *w = &m->lw[i];
    layer_acts_t *L = &a->l[i];
    pool_t *P = m->pool;
    int N = a->N, D = m->D, QD = m->QD, KD = m->KD, F = m->F;
    size_t ND = (size_t)N * D;
    ops_matmul_bwd_x(P, a->s_dm, L->df, w->w2, N, F, D, 0);
    ops_swiglu_bwd(P, L->da, L->db, a->s_dm, L->a, L->b, (size_t)N * F);
    ops_matmul_bwd_x(P, L->dxn2, L->da, w->w1, N, D, F, 0);
    ops_matmul_bwd_x(P, L->dxn2, L->db, w->w3, N, D, F, 1);
    memcpy(L->dh1, L->df, ND * sizeof(float));
    ops_rmsnorm_bwd_x(P, L->dh1, L->dxn2, L->h1, L->r2, w->ffn_norm, N, D);
    ops_matmul_bwd_x(P, a->s_dy, L->dh1, w->wo, N, QD, D, 0);
    ops_attn_bwd(P, L->dq, L->dk, L->dv, a->s_dy, L->probs, L->q, L->k, L->v, a->B, a->T,
                 m->cfg.n_heads, m->cfg.n_kv_heads, m->hd);
    ops_rope_bwd(P, L->dq, m->rope_cos, m->rope_sin, a->B, a->T, m->cfg.n_heads, m->hd);
    ops_rope_bwd(P, L->dk, m->rope_cos, m->rope_sin, a->B, a->T, m->cfg.n_kv_heads, m->hd);
    ops_matmul_bwd_x(P, L->dxn1, L->dq, w->wq, N, D, QD, 0);
    ops_matmul_bwd_x(P, L->dxn1, L->dk, w->wk, N, D, KD, 1);
    ops_matmul_bwd_x(P, L->dxn1, L->dv, w->wv, N, D, KD, 1);
    memcpy(dh_in, L->dh1, ND * sizeof(float));
    ops_rmsnorm_bwd_x(P, dh_in, L->dxn1, L->h_in, L->r1, w->attn_norm, N, D);
}

static void layer_backward_w(model_t *m, model_acts_t *a, int i)
{
    size_t lo = 0, hi = 0;
    if (grads_take(m, m->layer0 + i + 1, &lo, &hi))
        return;
    layer_w_t *w = &m->lw[i];
    layer_acts_t *L = &a->l[i];
    pool_t *P = m->pool;
    int N = a->N, D = m->D, QD = m->QD, KD = m->KD, F = m->F;
    ops_matmul_bwd_w(P, w->dw2, L->df, L->m, N, F, D);
    ops_matmul_bwd_w(P, w->dw1, L->da, L->xn2, N, D, F);
    ops_matmul_bwd_w(P, w->dw3, L->db, L->xn2, N, D, F);
    ops_rmsnorm_bwd_w(P, w->d_ffn_norm, L->dxn2, L->h1, L->r2, N, D);
    ops_matmul_bwd_w(P, w->dwo, L->dh1, L->y, N, QD, D);
    ops_matmul_bwd_w(P, w->dwq, L->dq, L->xn1, N, D, QD);
    ops_matmul_bwd_w(P, w->dwk, L->dk, L->xn1, N, D, KD);
    ops_matmul_bwd_w(P, w->dwv, L->dv, L->xn1, N, D, KD);
    ops_rmsnorm_bwd_w(P, w->d_attn_norm, L->dxn1, L->h_in, L->r1, N, D);
    grads_give(m, lo, hi);
}

/* The head's weight gradients (final norm, output). */
static void head_backward_w(model_t *m, model_acts_t *a)
{
    size_t lo = 0, hi = 0;
    int N = a->N, D = m->D;
    if (grads_take(m, m->cfg.n_layers + 1, &lo, &hi))
        return;
    ops_matmul_bwd_w(m->pool, m->d_out, a->logits, a->hf, N, D, m->V);
    ops_rmsnorm_bwd_w(m->pool, m->d_norm, a->dhf, a->h_top, a->rf, N, D);
    grads_give(m, lo, hi);
}

static void embed_backward_w(model_t *m, model_acts_t *a)
{
    size_t lo = 0, hi = 0;
    if (grads_take(m, 0, &lo, &hi))
        return;
    ops_embed_bwd(m->pool, m->d_embed, a->dh0, a->tokens, a->N, m->D);
    grads_give(m, lo, hi);
}

double model_forward(model_t *m, model_acts_t *a, const int32_t *tokens, const float *x_in,
                     const int32_t *targets, float dscale, float *x_out)
{
    size_t N = (size_t)a->N, D = m->D;
    /* where the output of the pieces below the head goes */
    float *top = m->has_head ? a->h_top : x_out;
    float *first = m->nl ? a->l[0].h_in : top;
    if (m->has_embed) {
        memcpy(a->tokens, tokens, N * sizeof(int32_t));
        ops_embed_fwd(m->pool, first, m->embed, tokens, (int)N, (int)D);
    } else if (first != x_in) {
        memcpy(first, x_in, N * D * sizeof(float));
    }
    for (int i = 0; i < m->nl; i++) /* a step left unfinished: a backward without its W */
        for (int k = 0; k < WS_KINDS; k++)
            unit_give(m, a, i, k);
    for (int i = 0; i < m->nl; i++) {
        int ck = keep_of(m, i) != CONFIG_KEEP_ALL;
        if (ck && (unit_take(m, a, i, WS_W) || unit_take(m, a, i, WS_B)))
            return NAN;
        layer_forward(m, a, i, i + 1 < m->nl ? a->l[i + 1].h_in : top);
        if (ck)
            unit_give(m, a, i, WS_W), unit_give(m, a, i, WS_B);
    }
    if (!m->has_head)
        return 0;
    ops_rmsnorm_fwd(m->pool, a->hf, a->rf, a->h_top, m->norm, (int)N, (int)D,
                    (float)m->cfg.norm_eps);
    ops_matmul_fwd(m->pool, a->logits, a->hf, m->out, (int)N, (int)D, m->V);
    if (!targets)
        return 0;
    float *loss = a->s_dy; /* N floats of scratch */
    ops_xent(m->pool, a->logits, loss, a->logits, targets, (int)N, m->V, dscale);
    double sum = 0;
    for (size_t n = 0; n < N; n++)
        sum += loss[n];
    return sum;
}

/* Backward B, and with fuse each layer's W right after its B (the same bits as B then W: each
 * W adds into its own layer's gradients, which B never reads). A layer's gradients for its W
 * are in a work set bound before the layer above writes its output gradient there and kept
 * until its W (with fuse two at a time, without one per layer): WS_W, with what a checkpointed
 * layer recomputes, or WS_G; a checkpointed layer's WS_B is bound for its recompute and B only
 * (one at a time). */
static void backward(model_t *m, model_acts_t *a, const float *dy, float *dx, int fuse)
{
    size_t N = (size_t)a->N, D = m->D;
    int L = m->nl;
    if (L && unit_take(m, a, L - 1, grads_kind(m, L - 1)))
        return;
    /* gradient of the input of the lowest held piece above the embedding */
    float *bottom = m->has_embed ? a->dh0 : dx;
    float *top = L ? a->l[L - 1].df : bottom;
    if (m->has_head) {
        ops_matmul_bwd_x(m->pool, a->dhf, a->logits, m->out, (int)N, (int)D, m->V, 0);
        memset(top, 0, N * D * sizeof(float));
        ops_rmsnorm_bwd_x(m->pool, top, a->dhf, a->h_top, a->rf, m->norm, (int)N, (int)D);
    } else if (top != dy) {
        memcpy(top, dy, N * D * sizeof(float));
    }
    if (fuse && m->has_head)
        head_backward_w(m, a);
    for (int i = L - 1; i >= 0; i--) {
        int ck = keep_of(m, i) != CONFIG_KEEP_ALL;
        if (i > 0 && unit_take(m, a, i - 1, grads_kind(m, i - 1)))
            return;
        if (ck && unit_take(m, a, i, WS_B))
            return;
        if (ck)
            layer_recompute(m, a, i);
        layer_backward_b(m, a, i, i > 0 ? a->l[i - 1].df : bottom);
        unit_give(m, a, i, WS_B);
        if (fuse) {
            layer_backward_w(m, a, i);
            unit_give(m, a, i, grads_kind(m, i));
        }
    }
    if (fuse && m->has_embed)
        embed_backward_w(m, a);
}

void model_backward_b(model_t *m, model_acts_t *a, const float *dy, float *dx) { backward(m, a, dy, dx, 0); }

void model_backward(model_t *m, model_acts_t *a, const float *dy, float *dx) { backward(m, a, dy, dx, 1); }

void model_backward_w(model_t *m, model_acts_t *a)
{
    if (m->has_head)
        head_backward_w(m, a);
    for (int i = m->nl - 1; i >= 0; i--) {
        layer_backward_w(m, a, i);
        unit_give(m, a, i, grads_kind(m, i));
    }
    if (m->has_embed)
        embed_backward_w(m, a);
}
