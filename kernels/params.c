/* Parameter table and topology-independent initialisation (see params.h). */
#include "kernels/params.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *layer_names[PARAM_PER_LAYER] = {
    "input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
    "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
};

static void add(param_table_t *tab, param_kind_t kind, int layer, int64_t d0, int64_t d1)
{
    param_info_t *p = &tab->t[tab->n++];
    p->kind = kind;
    p->layer = layer;
    if (kind == PARAM_EMBED)
        snprintf(p->name, sizeof(p->name), "model.embed_tokens.weight");
    else if (kind == PARAM_NORM)
        snprintf(p->name, sizeof(p->name), "model.norm.weight");
    else if (kind == PARAM_OUTPUT)
        snprintf(p->name, sizeof(p->name), "lm_head.weight");
    else
        snprintf(p->name, sizeof(p->name), "model.layers.%d.%s.weight", layer,
                 layer_names[kind - PARAM_ATTN_NORM]);
    p->ndim = d1 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->numel = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    p->offset = tab->total;
    tab->total += p->numel;
}

int params_table_init(param_table_t *tab, const model_config_t *c)
{
    memset(tab, 0, sizeof(*tab));
    tab->n_layers = c->n_layers;
    tab->t = calloc((size_t)c->n_layers * PARAM_PER_LAYER + 3, sizeof(param_info_t));
    if (!tab->t)
        return -ENOMEM;
    int64_t D = c->dim, hd = config_head_dim(c), F = config_ffn_hidden(c);
    int64_t q = c->n_heads * hd, kv = c->n_kv_heads * hd;
    add(tab, PARAM_EMBED, -1, c->vocab_size, D);
    for (int l = 0; l < c->n_layers; l++) {
        add(tab, PARAM_ATTN_NORM, l, D, 0);
        add(tab, PARAM_WQ, l, q, D);
        add(tab, PARAM_WK, l, kv, D);
        add(tab, PARAM_WV, l, kv, D);
        add(tab, PARAM_WO, l, D, q);
        add(tab, PARAM_FFN_NORM, l, D, 0);
        add(tab, PARAM_W1, l, F, D);
        add(tab, PARAM_W3, l, F, D);
        add(tab, PARAM_W2, l, D, F);
    }
    add(tab, PARAM_NORM, -1, D, 0);
    add(tab, PARAM_OUTPUT, -1, c->vocab_size, D);
    return 0;
}

void params_table_free(param_table_t *tab)
{
    free(tab->t);
    memset(tab, 0, sizeof(*tab));
}

/* First tensor index of piece p; piece n_layers+2 is one past the end. */
static int piece_first(const param_table_t *tab, int p)
{
    if (p <= 0)
        return 0;
    if (p > tab->n_layers + 1)
        return tab->n;
    return 1 + (p - 1) * PARAM_PER_LAYER;
}

void params_piece_range(const param_table_t *tab, int p0, int p1, size_t *begin, size_t *end)
{
    int a = piece_first(tab, p0), b = piece_first(tab, p1);
    *begin = a < tab->n ? tab->t[a].offset : tab->total;
    *end = b < tab->n ? tab->t[b].offset : tab->total;
}

size_t params_next_boundary(const param_table_t *tab, size_t at)
{
    int lo = 0, hi = tab->n; /* the first tensor whose offset is >= at */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (tab->t[mid].offset < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < tab->n ? tab->t[lo].offset : tab->total;
}

int params_find(const param_table_t *tab, param_kind_t kind, int layer)
{
    switch (kind) {
    case PARAM_EMBED: return 0;
    case PARAM_NORM: return tab->n - 2;
    case PARAM_OUTPUT: return tab->n - 1;
    default:
        if (layer < 0 || layer >= tab->n_layers)
            return -1;
        return 1 + layer * PARAM_PER_LAYER + (int)(kind - PARAM_ATTN_NORM);
    }
}

int params_find_name(const param_table_t *tab, const char *name)
{
    for (int i = 0; i < tab->n; i++)
        if (!strcmp(tab->t[i].name, name))
            return i;
    return -1;
}

int params_is_decayed(param_kind_t kind)
{
    return !(kind == PARAM_EMBED || kind == PARAM_ATTN_NORM || kind == PARAM_FFN_NORM ||
             kind == PARAM_NORM);
}

/* Counter-based randomness: each value is a hash of (seed, tensor, element, draw), so a
 * slice needs no state from the elements before it. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double unit_open(uint64_t h) /* (0, 1) */
{
    return ((double)(h >> 11) + 0.5) * 0x1.0p-53;
}

static double normal_at(uint64_t key, uint64_t i, uint64_t draw)
{
    uint64_t base = mix64(key ^ mix64(i * 0x9e3779b97f4a7c15ULL + draw * 0xd1b54a32d192ed03ULL));
    double u1 = unit_open(mix64(base + 1)), u2 = unit_open(mix64(base + 2));
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Normal(0, std) redrawn until inside [lo, hi] (torch.nn.init.trunc_normal_'s bounds). */
static double trunc_normal_at(uint64_t key, uint64_t i, double std, double lo, double hi)
{
    for (uint64_t draw = 0;; draw++) {
        double x = std * normal_at(key, i, draw);
        if (x >= lo && x <= hi)
            return x;
    }
}

void params_init(const param_table_t *tab, const model_config_t *cfg, uint64_t seed, float *flat,
                 size_t begin, size_t end)
{
    for (int ti = 0; ti < tab->n; ti++) {
        const param_info_t *p = &tab->t[ti];
        size_t a = p->offset > begin ? p->offset : begin;
        size_t b = p->offset + p->numel < end ? p->offset + p->numel : end;
        if (a >= b)
            continue;
        uint64_t key = mix64(seed * 0x9e3779b97f4a7c15ULL + (uint64_t)ti + 1);
        double depth_std = 0.02 / sqrt(2.0 * (p->layer + 1));
        for (size_t g = a; g < b; g++) {
            uint64_t i = g - p->offset;
            double x;
            switch (p->kind) {
            case PARAM_EMBED: x = normal_at(key, i, 0); break;
            case PARAM_ATTN_NORM: case PARAM_FFN_NORM: case PARAM_NORM: x = 1.0; break;
            case PARAM_WQ: case PARAM_WK: case PARAM_WV: case PARAM_W1:
                x = trunc_normal_at(key, i, 0.02, -2.0, 2.0);
                break;
            case PARAM_WO: case PARAM_W2: case PARAM_W3:
                x = trunc_normal_at(key, i, depth_std, -2.0, 2.0);
                break;
            case PARAM_OUTPUT: {
                double std = 1.0 / sqrt((double)cfg->dim);
                x = trunc_normal_at(key, i, std, -3 * std, 3 * std);
                break;
            }
            default: x = 0; break;
            }
            flat[g - begin] = (float)x;
        }
    }
}
