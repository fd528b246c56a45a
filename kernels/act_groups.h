/* A layer's activation tensors in groups, by what activation checkpointing keeps (config.h
 * config_ac_keep) and who reads them, as the CPU model (kernels/cpu/model.c), the CUDA model
 * (kernels/cuda/model.cu) carve them and kernels/act_bytes.c counts them: the input; the
 * products' and attention's outputs that only B reads (q, k, v, the softmax or its statistics,
 * the w1 and w3 products) and those W reads too (attention's output y, h1); what the norms and
 * SwiGLU make; the gradients B keeps for W. And the work sets the models share across their
 * microbatches: of a checkpointed layer what W reads too (WS_W, its gradients for W among them)
 * and what only B reads (WS_B); of a layer that keeps everything, its gradients for W (WS_G). */
#ifndef CTITAN_ACT_GROUPS_H
#define CTITAN_ACT_GROUPS_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/config.h"

enum { G_IN = 1, G_OPB = 2, G_REST = 4, G_GRAD = 8, G_OPW = 16, G_ALL = 31 };
enum { WS_W = 0, WS_B = 1, WS_G = 2, WS_KINDS = 3 };

/* The CUDA head's logits chunk (kernels/cuda/model.cu): a microbatch's N rows go through the
 * head this many at a time (cfg->head_rows, else as many as ACT_HEAD_CHUNK_BYTES of bf16 logits
 * hold, a multiple of 64, at least 64), each chunk's logits, loss gradients and products made in
 * one buffer the model's microbatches share, so no microbatch keeps its N x V logits. */
#define ACT_HEAD_CHUNK_BYTES ((size_t)64 << 20)
static inline int act_head_rows(const model_config_t *cfg, int N)
{
    size_t r = cfg->head_rows > 0 ? (size_t)cfg->head_rows
                                  : ACT_HEAD_CHUNK_BYTES / (2 * (size_t)cfg->vocab_size) / 64 * 64;
    if (r < 64 && cfg->head_rows <= 0)
        r = 64;
    return r < (size_t)N ? (int)r : N;
}

/* The groups a layer that keeps k keeps from its F to its backward. */
static inline int act_keep_mask(config_keep_t k)
{
    return k == CONFIG_KEEP_INPUT ? G_IN : k == CONFIG_KEEP_OPS ? G_IN | G_OPB | G_OPW : G_ALL;
}

/* ... of which a microbatch's storage holds all but the gradients for W (in work sets). */
static inline int act_held_mask(config_keep_t k) { return act_keep_mask(k) & ~G_GRAD; }

/* The kind of work set that holds a layer's gradients for its W. */
static inline int act_grads_kind(config_keep_t k) { return k != CONFIG_KEEP_ALL ? WS_W : WS_G; }

/* The work sets of layers [l0, l1) of cfg: each kind's groups (0: none of that kind) and how
 * many a backward with each W inside its B holds at once, made with the first microbatch's
 * storage (WS_W, WS_G: 2 when two layers of their kind touch, since the layer above binds the
 * next one's before it frees its own; else 1; WS_B: 1). One kind of checkpointed layer a
 * model: op, or full layers. */
typedef struct {
    int mask[WS_KINDS], min[WS_KINDS];
} act_wsets_t;

static inline void act_wsets(const model_config_t *cfg, int l0, int l1, act_wsets_t *w)
{
    memset(w, 0, sizeof(*w));
    for (int l = l0; l < l1; l++) {
        config_keep_t k = config_ac_keep(cfg, l);
        int kind = act_grads_kind(k);
        int adjacent = l > l0 && act_grads_kind(config_ac_keep(cfg, l - 1)) == kind;
        w->min[kind] = adjacent || w->min[kind] == 2 ? 2 : 1;
        if (k == CONFIG_KEEP_ALL) {
            w->mask[WS_G] = G_GRAD;
            continue;
        }
        w->mask[WS_W] = G_ALL & ~act_keep_mask(k) & ~G_OPB;
        w->mask[WS_B] = G_OPB & ~act_keep_mask(k);
        w->min[WS_B] = w->mask[WS_B] ? 1 : 0;
    }
}

/* Work sets of one kind, shared by a model's microbatches: n units of `bytes` each, made by the
 * model's allocator (malloc, cudaMalloc) as needed and kept; the models free them. */
typedef struct {
    int mask;    /* the groups each holds; 0: none of this kind */
    int min;     /* made with the first microbatch's storage (act_wsets) */
    void **u;    /* (n) */
    int *used;   /* (n) */
    int n;
    size_t bytes;
} act_wset_t;

/* One more unit; its index, or a negative code (alloc's, or -ENOMEM). */
static inline int act_wset_new(act_wset_t *w, int (*alloc)(void **p, size_t bytes))
{
    int u = w->n;
    void **nu = (void **)realloc(w->u, (size_t)(u + 1) * sizeof(*nu));
    if (nu)
        w->u = nu;
    int *nf = nu ? (int *)realloc(w->used, (size_t)(u + 1) * sizeof(*nf)) : NULL;
    if (nf)
        w->used = nf;
    if (!nu || !nf)
        return -ENOMEM;
    int rc = alloc(&w->u[u], w->bytes);
    if (rc)
        return rc < 0 ? rc : -ENOMEM;
    w->used[u] = 0;
    w->n++;
    return u;
}

/* A free unit, marked used (a new one when all are in use: a schedule that holds W back); NULL
 * with *rc set when none could be made. */
static inline void *act_wset_take(act_wset_t *w, int (*alloc)(void **p, size_t bytes), int *rc)
{
    int u = 0;
    while (u < w->n && w->used[u])
        u++;
    if (u == w->n && (u = act_wset_new(w, alloc)) < 0) {
        *rc = u;
        return NULL;
    }
    w->used[u] = 1;
    return w->u[u];
}

/* The unit at p free again. */
static inline void act_wset_give(act_wset_t *w, const void *p)
{
    for (int u = 0; u < w->n; u++)
        if (w->u[u] == p)
            w->used[u] = 0;
}

#endif
