/* Double-precision whole-model forward and backward from the reference ops (model_ref.h). */
#include "kernels/ref/model_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ref/ref_ops.h"

typedef struct {
    double *h_in, *r1, *xn1, *q, *k, *v, *probs, *y, *h1, *r2, *xn2, *a, *b, *m;
} ref_layer_t;

static const double *P(const param_table_t *tab, const double *base, param_kind_t k, int l)
{
    return base + tab->t[params_find(tab, k, l)].offset;
}
static double *G(const param_table_t *tab, double *base, param_kind_t k, int l)
{
    return base + tab->t[params_find(tab, k, l)].offset;
}

/* One pass: the shapes, and every activation the backward reads, carved from one allocation. */
typedef struct {
    const model_config_t *cfg;
    const param_table_t *tab;
    int B, T, N, D, Hq, Hk, hd, QD, KD, F, V, nl;
    size_t nd;
    double *mem;
    ref_layer_t *L;
    double *h_top, *rf, *hf, *logits, *dlogits, *loss, *rcos, *rsin;
    double *dh, *dxn, *dh1, *dm, *da, *dy, *dq, *dk, *dv, *db; /* backward scratch */
} ref_pass_t;

static void pass_free(ref_pass_t *r)
{
    free(r->mem);
    free(r->L);
}

static int pass_init(ref_pass_t *r, const model_config_t *cfg, const param_table_t *tab, int B, int T)
{
    int N = B * T, D = cfg->dim, Hq = cfg->n_heads, Hk = cfg->n_kv_heads;
    int hd = config_head_dim(cfg), QD = Hq * hd, KD = Hk * hd, F = config_ffn_hidden(cfg);
    int V = cfg->vocab_size, nl = cfg->n_layers;
    *r = (ref_pass_t){.cfg = cfg, .tab = tab, .B = B, .T = T, .N = N, .D = D, .Hq = Hq, .Hk = Hk, .hd = hd,
                      .QD = QD, .KD = KD, .F = F, .V = V, .nl = nl, .nd = (size_t)N * D};
    size_t nd = r->nd, probs = (size_t)B * Hq * T * T;
    size_t per = nd * 4 + 2 * (size_t)N + (size_t)N * (2 * QD + 2 * KD + 3 * F) + probs;
    size_t total = per * nl + nd * 3 + N + (size_t)N * V * 2 + (size_t)T * hd + N +
                   nd * 3 + (size_t)N * (3 * F + 2 * QD + 2 * KD);
    r->mem = calloc(total, sizeof(double));
    r->L = calloc((size_t)nl, sizeof(ref_layer_t));
    if (!r->mem || !r->L) {
        pass_free(r);
        return -1;
    }
    double *p = r->mem;
    ref_layer_t *L = r->L;
#define TAKE(n) (p += (n), p - (n))
    for (int l = 0; l < nl; l++) {
        L[l].h_in = TAKE(nd); L[l].r1 = TAKE(N); L[l].xn1 = TAKE(nd);
        L[l].q = TAKE((size_t)N * QD); L[l].k = TAKE((size_t)N * KD); L[l].v = TAKE((size_t)N * KD);
        L[l].probs = TAKE(probs); L[l].y = TAKE((size_t)N * QD); L[l].h1 = TAKE(nd);
        L[l].r2 = TAKE(N); L[l].xn2 = TAKE(nd);
        L[l].a = TAKE((size_t)N * F); L[l].b = TAKE((size_t)N * F); L[l].m = TAKE((size_t)N * F);
    }
    r->h_top = TAKE(nd), r->rf = TAKE(N), r->hf = TAKE(nd), r->logits = TAKE((size_t)N * V);
    r->dlogits = TAKE((size_t)N * V), r->loss = TAKE(N);
    r->rcos = TAKE((size_t)T * hd / 2), r->rsin = TAKE((size_t)T * hd / 2);
    r->dh = TAKE(nd), r->dxn = TAKE(nd), r->dh1 = TAKE(nd);
    r->dm = TAKE((size_t)N * F), r->da = TAKE((size_t)N * F);
    r->dy = TAKE((size_t)N * QD), r->dq = TAKE((size_t)N * QD);
    r->dk = TAKE((size_t)N * KD), r->dv = TAKE((size_t)N * KD);
    r->db = TAKE((size_t)N * F);
#undef TAKE
    return 0;
}

/* Layer l: L[l].h_in -> out (the next layer's input, or h_top). */
static void layer_fwd(ref_pass_t *r, const double *w, int l, double *out)
{
    const param_table_t *tab = r->tab;
    ref_layer_t *A = &r->L[l];
    int N = r->N, D = r->D, QD = r->QD, KD = r->KD, F = r->F;
    double eps = r->cfg->norm_eps;
    ref_rmsnorm_fwd(A->xn1, A->r1, A->h_in, P(tab, w, PARAM_ATTN_NORM, l), N, D, eps);
    ref_matmul_fwd(A->q, A->xn1, P(tab, w, PARAM_WQ, l), N, D, QD);
    ref_matmul_fwd(A->k, A->xn1, P(tab, w, PARAM_WK, l), N, D, KD);
    ref_matmul_fwd(A->v, A->xn1, P(tab, w, PARAM_WV, l), N, D, KD);
    ref_rope_fwd(A->q, r->rcos, r->rsin, r->B, r->T, r->Hq, r->hd);
    ref_rope_fwd(A->k, r->rcos, r->rsin, r->B, r->T, r->Hk, r->hd);
    ref_attn_fwd(A->y, A->probs, A->q, A->k, A->v, r->B, r->T, r->Hq, r->Hk, r->hd);
    ref_matmul_fwd(A->h1, A->y, P(tab, w, PARAM_WO, l), N, QD, D);
    for (size_t i = 0; i < r->nd; i++) A->h1[i] += A->h_in[i];
    ref_rmsnorm_fwd(A->xn2, A->r2, A->h1, P(tab, w, PARAM_FFN_NORM, l), N, D, eps);
    ref_matmul_fwd(A->a, A->xn2, P(tab, w, PARAM_W1, l), N, D, F);
    ref_matmul_fwd(A->b, A->xn2, P(tab, w, PARAM_W3, l), N, D, F);
    ref_swiglu_fwd(A->m, A->a, A->b, (size_t)N * F);
    ref_matmul_fwd(out, A->m, P(tab, w, PARAM_W2, l), N, F, D);
    for (size_t i = 0; i < r->nd; i++) out[i] += A->h1[i];
}

/* Layer l backward: dh (the gradient of its output) becomes the gradient of its input; its
 * weights' gradients go into g. */
static void layer_bwd(ref_pass_t *r, const double *w, double *g, int l)
{
    const param_table_t *tab = r->tab;
    ref_layer_t *A = &r->L[l];
    int N = r->N, D = r->D, QD = r->QD, KD = r->KD, F = r->F;
    double *dh = r->dh, *dxn = r->dxn, *dh1 = r->dh1, *dq = r->dq, *dk = r->dk, *dv = r->dv;
    ref_matmul_bwd_x(r->dm, dh, P(tab, w, PARAM_W2, l), N, F, D, 0);
    ref_matmul_bwd_w(G(tab, g, PARAM_W2, l), dh, A->m, N, F, D);
    ref_swiglu_bwd(r->da, r->db, r->dm, A->a, A->b, (size_t)N * F);
    ref_matmul_bwd_x(dxn, r->da, P(tab, w, PARAM_W1, l), N, D, F, 0);
    ref_matmul_bwd_x(dxn, r->db, P(tab, w, PARAM_W3, l), N, D, F, 1);
    ref_matmul_bwd_w(G(tab, g, PARAM_W1, l), r->da, A->xn2, N, D, F);
    ref_matmul_bwd_w(G(tab, g, PARAM_W3, l), r->db, A->xn2, N, D, F);
    memcpy(dh1, dh, r->nd * sizeof(double));
    ref_rmsnorm_bwd_x(dh1, dxn, A->h1, A->r2, P(tab, w, PARAM_FFN_NORM, l), N, D);
    ref_rmsnorm_bwd_w(G(tab, g, PARAM_FFN_NORM, l), dxn, A->h1, A->r2, N, D);
    ref_matmul_bwd_x(r->dy, dh1, P(tab, w, PARAM_WO, l), N, QD, D, 0);
    ref_matmul_bwd_w(G(tab, g, PARAM_WO, l), dh1, A->y, N, QD, D);
    ref_attn_bwd(dq, dk, dv, r->dy, A->probs, A->q, A->k, A->v, r->B, r->T, r->Hq, r->Hk, r->hd);
    ref_rope_bwd(dq, r->rcos, r->rsin, r->B, r->T, r->Hq, r->hd);
    ref_rope_bwd(dk, r->rcos, r->rsin, r->B, r->T, r->Hk, r->hd);
    ref_matmul_bwd_x(dxn, dq, P(tab, w, PARAM_WQ, l), N, D, QD, 0);
    ref_matmul_bwd_x(dxn, dk, P(tab, w, PARAM_WK, l), N, D, KD, 1);
    ref_matmul_bwd_x(dxn, dv, P(tab, w, PARAM_WV, l), N, D, KD, 1);
    ref_matmul_bwd_w(G(tab, g, PARAM_WQ, l), dq, A->xn1, N, D, QD);
    ref_matmul_bwd_w(G(tab, g, PARAM_WK, l), dk, A->xn1, N, D, KD);
    ref_matmul_bwd_w(G(tab, g, PARAM_WV, l), dv, A->xn1, N, D, KD);
    memcpy(dh, dh1, r->nd * sizeof(double));
    ref_rmsnorm_bwd_x(dh, dxn, A->h_in, A->r1, P(tab, w, PARAM_ATTN_NORM, l), N, D);
    ref_rmsnorm_bwd_w(G(tab, g, PARAM_ATTN_NORM, l), dxn, A->h_in, A->r1, N, D);
}

double ref_model_loss(const model_config_t *cfg, const param_table_t *tab, const double *w,
                      double *g, const int32_t *tokens, const int32_t *targets, int B, int T,
                      double dscale)
{
    ref_pass_t r;
    if (pass_init(&r, cfg, tab, B, T))
        return NAN;
    int N = r.N, D = r.D, V = r.V, nl = r.nl;
    double *freq = malloc((size_t)(r.hd / 2 + 1) * sizeof(double));
    if (!freq) {
        pass_free(&r);
        return NAN;
    }
    for (int i = 0; i < r.hd / 2; i++)
        freq[i] = config_rope_inv_freq(cfg, i);
    ref_rope_table_freq(r.rcos, r.rsin, T, r.hd, freq);
    free(freq);

    /* forward */
    ref_embed_fwd(nl ? r.L[0].h_in : r.h_top, P(tab, w, PARAM_EMBED, -1), tokens, N, D);
    for (int l = 0; l < nl; l++)
        layer_fwd(&r, w, l, l + 1 < nl ? r.L[l + 1].h_in : r.h_top);
    ref_rmsnorm_fwd(r.hf, r.rf, r.h_top, P(tab, w, PARAM_NORM, -1), N, D, cfg->norm_eps);
    ref_matmul_fwd(r.logits, r.hf, P(tab, w, PARAM_OUTPUT, -1), N, D, V);
    ref_xent(r.dlogits, r.loss, r.logits, targets, N, V, dscale);
    double sum = 0;
    for (int n = 0; n < N; n++)
        sum += r.loss[n];

    /* backward: dh is the gradient of the current residual stream */
    if (g) {
        ref_matmul_bwd_x(r.dxn, r.dlogits, P(tab, w, PARAM_OUTPUT, -1), N, D, V, 0);
        ref_matmul_bwd_w(G(tab, g, PARAM_OUTPUT, -1), r.dlogits, r.hf, N, D, V);
        ref_rmsnorm_bwd_w(G(tab, g, PARAM_NORM, -1), r.dxn, r.h_top, r.rf, N, D);
        memset(r.dh, 0, r.nd * sizeof(double));
        ref_rmsnorm_bwd_x(r.dh, r.dxn, r.h_top, r.rf, P(tab, w, PARAM_NORM, -1), N, D);
        for (int l = nl - 1; l >= 0; l--)
            layer_bwd(&r, w, g, l);
        ref_embed_bwd(G(tab, g, PARAM_EMBED, -1), r.dh, tokens, N, D);
    }
    pass_free(&r);
    return sum;
}
