/* Activation bytes per microbatch and per recompute work set, the CPU and CUDA models'
 * layouts (see act_bytes.h): the same tensors as their carves, in groups by what activation
 * checkpointing keeps. */
#include "kernels/act_bytes.h"

#include <errno.h>

#include "kernels/act_groups.h"

typedef struct {
    int cuda;
    size_t bytes;
} acc_t;

static void add(acc_t *a, size_t n, size_t es_cuda)
{
    a->bytes += a->cuda ? (n * es_cuda + 255) / 256 * 256 : n * 4;
}

/* One layer's tensors of the groups in mask. */
static size_t layer_bytes(const model_config_t *c, int cuda, int mask, int B, int T)
{
    size_t N = (size_t)B * T, D = c->dim, hd = (size_t)config_head_dim(c), QD = c->n_heads * hd,
           KD = c->n_kv_heads * hd, F = (size_t)config_ffn_hidden(c);
    size_t att = cuda ? (size_t)B * c->n_heads * T : (size_t)B * c->n_heads * T * T; /* lse or probs */
    acc_t a = {cuda, 0};
    if (mask & G_IN)
        add(&a, N * D, 2);
    if (mask & G_REST) {
        add(&a, N * D, 2), add(&a, N * D, 2), add(&a, N * F, 2); /* xn1, xn2, m */
        add(&a, N, 4), add(&a, N, 4);                             /* r1, r2 */
    }
    if (mask & G_OPB) {
        add(&a, N * QD, 2), add(&a, N * KD, 2), add(&a, N * KD, 2); /* q, k, v */
        add(&a, N * F, 2), add(&a, N * F, 2);                       /* a, b */
        add(&a, att, 4);
    }
    if (mask & G_OPW)
        add(&a, N * QD, 2), add(&a, N * D, 2); /* y, h1 */
    if (mask & G_GRAD) {
        add(&a, N * D, 2), add(&a, N * F, 2), add(&a, N * F, 2);   /* df, da, db */
        add(&a, N * D, 2), add(&a, N * D, 2);                      /* dxn2, dh1 */
        add(&a, N * QD, 2), add(&a, N * KD, 2), add(&a, N * KD, 2); /* dq, dk, dv */
        add(&a, N * D, 2);                                         /* dxn1 */
    }
    return a.bytes;
}

/* What a microbatch holds besides its layers: scratch, tokens, the head's, the embedding's. */
static size_t rest_bytes(const model_config_t *c, int cuda, int head, int embed, int B, int T)
{
    size_t N = (size_t)B * T, D = c->dim, QD = (size_t)c->n_heads * config_head_dim(c),
           F = (size_t)config_ffn_hidden(c), V = c->vocab_size, S = QD > D ? QD : D;
    acc_t a = {cuda, 0};
    if (!cuda) {
        add(&a, N * F, 4), add(&a, N * S, 4), add(&a, N, 4); /* s_dm, s_dy, tokens */
        if (head)
            add(&a, N * D, 4), add(&a, N, 4), add(&a, N * D, 4), add(&a, N * V, 4), add(&a, N * D, 4);
        if (embed)
            add(&a, N * D, 4); /* dh0 */
        return a.bytes;
    }
    add(&a, N, 4), add(&a, N, 4);                       /* tokens, targets */
    if (!head || !embed)
        add(&a, N * D, 4);                              /* io: host hand-offs */
    add(&a, N * D, 2), add(&a, N * D, 2);               /* x_top, d_bottom */
    add(&a, N * F, 2), add(&a, N * S, 2);               /* s_dm, s_dy */
    add(&a, (size_t)B * c->n_heads * T, 4);             /* delta */
    if (head) {
        add(&a, N * D, 2), add(&a, N * D, 2);            /* hf, dhf (the logits: model_act_size_t head) */
        add(&a, N, 4), add(&a, N, 4);                            /* rf, loss */
    }
    return a.bytes;
}

int model_act_bytes(const model_config_t *cfg, int p0, int p1, int B, int T, model_act_layout_t layout,
                    model_act_size_t *out)
{
    if (p0 < 0 || p1 > cfg->n_layers + 2 || p0 >= p1 || B <= 0 || T <= 0 || T > cfg->max_seq_len)
        return -EINVAL;
    int cuda = layout == MODEL_ACT_CUDA;
    int l0 = p0 > 1 ? p0 - 1 : 0, l1 = p1 - 1 < cfg->n_layers ? p1 - 1 : cfg->n_layers;
    size_t rest = rest_bytes(cfg, cuda, p1 == cfg->n_layers + 2, p0 == 0, B, T);
    *out = (model_act_size_t){.per_mb = rest, .per_mb_none = rest};
    for (int l = l0; l < l1; l++) {
        config_keep_t k = config_ac_keep(cfg, l);
        out->per_mb += layer_bytes(cfg, cuda, act_held_mask(k), B, T);
        out->per_mb_none += layer_bytes(cfg, cuda, act_held_mask(CONFIG_KEEP_ALL), B, T);
        out->keep_layers += k == CONFIG_KEEP_ALL;
        out->ckpt_layers += k != CONFIG_KEEP_ALL;
    }
    act_wsets_t w; /* the models' own work sets, as they make them */
    act_wsets(cfg, l0, l1, &w);
    out->unit = layer_bytes(cfg, cuda, w.mask[WS_W], B, T);
    out->unit_b = layer_bytes(cfg, cuda, w.mask[WS_B], B, T);
    out->unit_g = layer_bytes(cfg, cuda, w.mask[WS_G], B, T);
    out->units_fused = w.min[WS_W];
    out->units_g_fused = w.min[WS_G];
    if (cuda && p1 == cfg->n_layers + 2) {
        acc_t h = {1, 0};
        add(&h, (size_t)act_head_rows(cfg, B * T) * cfg->vocab_size, 2);
        out->head = h.bytes;
    }
    return 0;
}

size_t model_act_total(const model_act_size_t *s, int in_flight, int held_w)
{
    size_t units = (size_t)s->units_fused, units_g = (size_t)s->units_g_fused;
    if (held_w > 0 && (size_t)held_w * (size_t)s->ckpt_layers + 1 > units)
        units = (size_t)held_w * (size_t)s->ckpt_layers + 1;
    if ((size_t)held_w * (size_t)s->keep_layers > units_g) /* each held microbatch: all of its layers' */
        units_g = (size_t)held_w * (size_t)s->keep_layers;
    return (size_t)in_flight * s->per_mb + units * s->unit + s->unit_b + units_g * s->unit_g + s->head;
}
