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

double ref_model_loss(const model_config_t *cfg, const param_table_t *tab, const double *w,
                      double *g, const int32_t *tokens, const int32_t *targets, int B, int T,
                      double dscale)
{
    int N = B * T, D = cfg->dim, Hq = cfg->n_heads, Hk = cfg->n_kv_heads;
    int hd = config_head_dim(cfg), QD = Hq * hd, KD = Hk * hd, F = config_ffn_hidden(cfg);
    int V = cfg->vocab_size, nl = cfg->n_layers;
    size_t nd = (size_t)N * D, probs = (size_t)B * Hq * T * T;
    size_t per = nd * 4 + 2 * (size_t)N + (size_t)N * (2 * QD + 2 * KD + 3 * F) + probs;
    size_t total = per * nl + nd * 3 + N + (size_t)N * V * 2 + (size_t)T * hd + N +
                   nd * 3 + (size_t)N * (3 * F + 2 * QD + 2 * KD);
    double *mem = calloc(total, sizeof(double));
    ref_layer_t *L = calloc((size_t)nl, sizeof(ref_layer_t));
    if (!mem || !L) {
        free(mem);
        free(L);
        return NAN;
    }
    double *p = mem;
#define TAKE(n) (p += (n), p - (n))
    for (int l = 0; l < nl; l++) {
        L[l].h_in = TAKE(nd); L[l].r1 = TAKE(N); L[l].xn1 = TAKE(nd);
        L[l].q = TAKE((size_t)N * QD); L[l].k = TAKE((size_t)N * KD); L[l].v = TAKE((size_t)N * KD);
        L[l].probs = TAKE(probs); L[l].y = TAKE((size_t)N * QD); L[l].h1 = TAKE(nd);
        L[l].r2 = TAKE(N); L[l].xn2 = TAKE(nd);
        L[l].a = TAKE((size_t)N * F); L[l].b = TAKE((size_t)N * F); L[l].m = TAKE((size_t)N * F);
    }
    double *h_top = TAKE(nd), *rf = TAKE(N), *hf = TAKE(nd), *logits = TAKE((size_t)N * V);
    double *dlogits = TAKE((size_t)N * V), *loss = TAKE(N);
    double *rcos = TAKE((size_t)T * hd / 2), *rsin = TAKE((size_t)T * hd / 2);
    double *dh = TAKE(nd), *dxn = TAKE(nd), *dh1 = TAKE(nd);
    double *dm = TAKE((size_t)N * F), *da = TAKE((size_t)N * F);
    double *dy = TAKE((size_t)N * QD), *dq = TAKE((size_t)N * QD);
    double *dk = TAKE((size_t)N * KD), *dv = TAKE((size_t)N * KD);
    double *db = TAKE((size_t)N * F);
#undef TAKE
    ref_rope_table(rcos, rsin, T, hd, cfg->rope_theta);

    /* forward */
    ref_embed_fwd(nl ? L[0].h_in : h_top, P(tab, w, PARAM_EMBED, -1), tokens, N, D);
    for (int l = 0; l < nl; l++) {
        ref_layer_t *A = &L[l];
        double *out = l + 1 < nl ? L[l + 1].h_in : h_top;
        ref_rmsnorm_fwd(A->xn1, A->r1, A->h_in, P(tab, w, PARAM_ATTN_NORM, l), N, D, cfg->norm_eps);
        ref_matmul_fwd(A->q, A->xn1, P(tab, w, PARAM_WQ, l), N, D, QD);
        ref_matmul_fwd(A->k, A->xn1, P(tab, w, PARAM_WK, l), N, D, KD);
        ref_matmul_fwd(A->v, A->xn1, P(tab, w, PARAM_WV, l), N, D, KD);
        ref_rope_fwd(A->q, rcos, rsin, B, T, Hq, hd);
        ref_rope_fwd(A->k, rcos, rsin, B, T, Hk, hd);
        ref_attn_fwd(A->y, A->probs, A->q, A->k, A->v, B, T, Hq, Hk, hd);
        ref_matmul_fwd(A->h1, A->y, P(tab, w, PARAM_WO, l), N, QD, D);
        for (size_t i = 0; i < nd; i++) A->h1[i] += A->h_in[i];
        ref_rmsnorm_fwd(A->xn2, A->r2, A->h1, P(tab, w, PARAM_FFN_NORM, l), N, D, cfg->norm_eps);
        ref_matmul_fwd(A->a, A->xn2, P(tab, w, PARAM_W1, l), N, D, F);
        ref_matmul_fwd(A->b, A->xn2, P(tab, w, PARAM_W3, l), N, D, F);
        ref_swiglu_fwd(A->m, A->a, A->b, (size_t)N * F);
        ref_matmul_fwd(out, A->m, P(tab, w, PARAM_W2, l), N, F, D);
        for (size_t i = 0; i < nd; i++) out[i] += A->h1[i];
    }
    ref_rmsnorm_fwd(hf, rf, h_top, P(tab, w, PARAM_NORM, -1), N, D, cfg->norm_eps);
    ref_matmul_fwd(logits, hf, P(tab, w, PARAM_OUTPUT, -1), N, D, V);
    ref_xent(dlogits, loss, logits, targets, N, V, dscale);
    double sum = 0;
    for (int n = 0; n < N; n++)
        sum += loss[n];
    if (!g)
        goto out;

    /* backward: dh is the gradient of the current residual stream */
    ref_matmul_bwd_x(dxn, dlogits, P(tab, w, PARAM_OUTPUT, -1), N, D, V, 0);
    ref_matmul_bwd_w(G(tab, g, PARAM_OUTPUT, -1), dlogits, hf, N, D, V);
    ref_rmsnorm_bwd_w(G(tab, g, PARAM_NORM, -1), dxn, h_top, rf, N, D);
    memset(dh, 0, nd * sizeof(double));
    ref_rmsnorm_bwd_x(dh, dxn, h_top, rf, P(tab, w, PARAM_NORM, -1), N, D);
    for (int l = nl - 1; l >= 0; l--) {
        ref_layer_t *A = &L[l];
        ref_matmul_bwd_x(dm, dh, P(tab, w, PARAM_W2, l), N, F, D, 0);
        ref_matmul_bwd_w(G(tab, g, PARAM_W2, l), dh, A->m, N, F, D);
        ref_swiglu_bwd(da, db, dm, A->a, A->b, (size_t)N * F);
        ref_matmul_bwd_x(dxn, da, P(tab, w, PARAM_W1, l), N, D, F, 0);
        ref_matmul_bwd_x(dxn, db, P(tab, w, PARAM_W3, l), N, D, F, 1);
        ref_matmul_bwd_w(G(tab, g, PARAM_W1, l), da, A->xn2, N, D, F);
        ref_matmul_bwd_w(G(tab, g, PARAM_W3, l), db, A->xn2, N, D, F);
        memcpy(dh1, dh, nd * sizeof(double));
        ref_rmsnorm_bwd_x(dh1, dxn, A->h1, A->r2, P(tab, w, PARAM_FFN_NORM, l), N, D);
        ref_rmsnorm_bwd_w(G(tab, g, PARAM_FFN_NORM, l), dxn, A->h1, A->r2, N, D);
        ref_matmul_bwd_x(dy, dh1, P(tab, w, PARAM_WO, l), N, QD, D, 0);
        ref_matmul_bwd_w(G(tab, g, PARAM_WO, l), dh1, A->y, N, QD, D);
        ref_attn_bwd(dq, dk, dv, dy, A->probs, A->q, A->k, A->v, B, T, Hq, Hk, hd);
        ref_rope_bwd(dq, rcos, rsin, B, T, Hq, hd);
        ref_rope_bwd(dk, rcos, rsin, B, T, Hk, hd);
        ref_matmul_bwd_x(dxn, dq, P(tab, w, PARAM_WQ, l), N, D, QD, 0);
        ref_matmul_bwd_x(dxn, dk, P(tab, w, PARAM_WK, l), N, D, KD, 1);
        ref_matmul_bwd_x(dxn, dv, P(tab, w, PARAM_WV, l), N, D, KD, 1);
        ref_matmul_bwd_w(G(tab, g, PARAM_WQ, l), dq, A->xn1, N, D, QD);
        ref_matmul_bwd_w(G(tab, g, PARAM_WK, l), dk, A->xn1, N, D, KD);
        ref_matmul_bwd_w(G(tab, g, PARAM_WV, l), dv, A->xn1, N, D, KD);
        memcpy(dh, dh1, nd * sizeof(double));
        ref_rmsnorm_bwd_x(dh, dxn, A->h_in, A->r1, P(tab, w, PARAM_ATTN_NORM, l), N, D);
        ref_rmsnorm_bwd_w(G(tab, g, PARAM_ATTN_NORM, l), dxn, A->h_in, A->r1, N, D);
    }
    ref_embed_bwd(G(tab, g, PARAM_EMBED, -1), dh, tokens, N, D);
out:
    free(mem);
    free(L);
    return sum;
}
