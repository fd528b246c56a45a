/* The flat parameter space: every tensor of the model with its Hugging Face Llama name,
 * dtype and shape, in one fixed order, and its offset in one flat fp32 array. Pipeline
 * stages hold contiguous "pieces" of it (embedding, each layer, head); optimizer shards
 * hold contiguous slices. Initialisation is a pure function of (seed, tensor, element), so
 * any slice can be initialised alone and every topology starts from the same weights. */
#ifndef CTITAN_PARAMS_H
#define CTITAN_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/config.h"

typedef enum {
    PARAM_EMBED,      /* model.embed_tokens.weight                      (vocab, dim) */
    PARAM_ATTN_NORM,  /* model.layers.L.input_layernorm.weight          (dim) */
    PARAM_WQ,         /* model.layers.L.self_attn.q_proj.weight         (n_heads*hd, dim) */
    PARAM_WK,         /* model.layers.L.self_attn.k_proj.weight         (n_kv_heads*hd, dim) */
    PARAM_WV,         /* model.layers.L.self_attn.v_proj.weight         (n_kv_heads*hd, dim) */
    PARAM_WO,         /* model.layers.L.self_attn.o_proj.weight         (dim, n_heads*hd) */
    PARAM_FFN_NORM,   /* model.layers.L.post_attention_layernorm.weight (dim) */
    PARAM_W1,         /* model.layers.L.mlp.gate_proj.weight            (hidden, dim) */
    PARAM_W3,         /* model.layers.L.mlp.up_proj.weight              (hidden, dim) */
    PARAM_W2,         /* model.layers.L.mlp.down_proj.weight            (dim, hidden) */
    PARAM_NORM,       /* model.norm.weight                              (dim) */
    PARAM_OUTPUT,     /* lm_head.weight                                 (vocab, dim) */
} param_kind_t;
#define PARAM_PER_LAYER 9 /* PARAM_ATTN_NORM .. PARAM_W2 */

typedef struct {
    char name[64];
    param_kind_t kind;
    int layer;        /* -1 outside the layers */
    int ndim;         /* 1 or 2 */
    int64_t shape[2];
    size_t offset;    /* in floats, into the flat space */
    size_t numel;
} param_info_t;

typedef struct {
    int n;             /* tensors */
    param_info_t *t;   /* owned */
    size_t total;      /* floats in the flat space */
    int n_layers;
} param_table_t;

/* Builds the table for a validated config. Returns 0 or -ENOMEM. */
int params_table_init(param_table_t *tab, const model_config_t *cfg);
void params_table_free(param_table_t *tab);

/* Pieces: 0 = embedding, 1..n_layers = layer piece-1, n_layers+1 = head (final norm and
 * lm_head). Returns the flat range [begin, end) of pieces [p0, p1). */
void params_piece_range(const param_table_t *tab, int p0, int p1, size_t *begin, size_t *end);
/* The first tensor boundary at or after flat offset `at` (a tensor's offset, or total). */
size_t params_next_boundary(const param_table_t *tab, size_t at);
/* Index in tab->t of the tensor of this kind (layer ignored outside the layers), or -1. */
int params_find(const param_table_t *tab, param_kind_t kind, int layer);
/* Index of the tensor with this Hugging Face name, or -1. */
int params_find_name(const param_table_t *tab, const char *name);

/* A model's pieces under parameter sharding (DESIGN.md "Parameter sharding"), one piece
 * (params_piece_range) at a time, from its group's transport (stages/runtime/fsdp.h on the CPU,
 * the NCCL data plane on GPUs):
 *   weights(arg, lo, hi, next_lo, next_hi, &w): before the piece's forward or backward, its
 *     weights [lo, hi) of the flat space gathered in the backend's memory and dtype (ready in the
 *     model's stream's order; valid until the next call but one), and [next_lo, next_hi) the
 *     piece the model will ask for next (next_lo == next_hi: none), which io may gather
 *     meanwhile; NULL: the model's own weights are whole (the CPU's group shares one copy:
 *     shared memory is the all-gather).
 *   take(arg, lo, hi, &buf): before the piece's W, a buffer of hi - lo fp32 for its gradients,
 *     which the model zeroes and adds the microbatch's gradients into;
 *   give(arg, lo, hi): after it, the group's reduce-scatter of them into the owners' parts.
 * Each returns 0 or a negative errno (-ECANCELED: closed for a recovery). */
typedef struct {
    int (*weights)(void *arg, size_t lo, size_t hi, size_t next_lo, size_t next_hi, void **w);
    int (*take)(void *arg, size_t lo, size_t hi, float **buf);
    int (*give)(void *arg, size_t lo, size_t hi);
    void *arg;
} shard_io_t;

/* Initialises flat[i - begin] for i in [begin, end) following torchtitan's Llama scheme:
 * embedding N(0,1); q,k,v and gate_proj trunc-normal std 0.02; o_proj, up_proj and down_proj
 * trunc-normal std 0.02/sqrt(2*(layer+1)) (depth init); norms 1; lm_head trunc-normal
 * std dim^-0.5 cut at 3 std. Any split of [0,total) gives the same bits. */
void params_init(const param_table_t *tab, const model_config_t *cfg, uint64_t seed, float *flat,
                 size_t begin, size_t end);

/* Whether AdamW decays this tensor when norms and embeddings are exempt. */
int params_is_decayed(param_kind_t kind);

#endif
