/* The model's shape, with torchtitan's Llama keys, plus checks and presets.
 * Every process of a job derives the same parameter table from this. */
#ifndef CTITAN_CONFIG_H
#define CTITAN_CONFIG_H

#include <stddef.h>

/* The most layers a model may have: every process builds a table of 9 tensors a layer (112
 * bytes each), whatever the layers' size; the deepest Llama has 126. */
#define CONFIG_MAX_LAYERS 4096

typedef struct {
    int dim;
    int n_layers;
    int n_heads;
    int n_kv_heads;           /* 0 in a manifest means "same as n_heads"; validated configs have it set */
    int vocab_size;
    int multiple_of;          /* FFN hidden size is rounded up to a multiple of this */
    double ffn_dim_multiplier; /* 0 = none */
    double norm_eps;
    double rope_theta;
    int max_seq_len;
    int hidden_dim;           /* FFN hidden size as Hugging Face's intermediate_size; 0 = torchtitan's
                               * formula from dim, ffn_dim_multiplier and multiple_of */
    /* Llama 3.1's rotary frequency scaling (Hugging Face rope_scaling {"rope_type": "llama3"});
     * rope_scaling_factor 0 = none */
    double rope_scaling_factor;
    double rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_seq_len; /* original_max_position_embeddings */
    /* Activation checkpointing ([activation_checkpoint], torchtitan's): how the model computes,
     * not what it is (config_diff ignores it, no checkpoint holds it). config_ac_keep says what
     * each layer keeps. */
    int ac_mode;              /* CONFIG_AC_NONE (0), CONFIG_AC_FULL, CONFIG_AC_SELECTIVE */
    int ac_every;             /* selective: every ac_every-th layer as full; 0 = "op" */
    /* The GPU model's attention ([training] attention): CONFIG_ATTN_AUTO (0) cuDNN's fused
     * kernels where cuDNN 9 loads and checks out at first use, else kernels/cuda/attn.cu's;
     * CONFIG_ATTN_CUDNN cuDNN's or fail; CONFIG_ATTN_OWN attn.cu's. How the model computes (as
     * ac_mode). */
    int attn;
    /* Parameter sharding on a device (backend_t.model_shard): the part [own_begin, own_end) of
     * the held pieces' range whose weights and gradients this replica keeps; 0, 0: all of it.
     * How the model is held, not what it is (as ac_mode). */
    size_t own_begin, own_end;
    /* The CUDA head makes its logits a chunk of rows at a time, the loss's gradients and the
     * head's products with each (act_head_rows): rows a chunk, 0 = as many as fit
     * ACT_HEAD_CHUNK_BYTES (tests give fewer). How the model computes (as ac_mode). */
    int head_rows;
    /* A model whose forwards no backward follows (the evaluations): the CUDA head then computes
     * the loss alone, not its gradients. How the model computes (as ac_mode). */
    int forward_only;
    /* Offload's shared host copies (backend_t.model_new's host_w and host_g) hold bf16, not fp32
     * (optshard.offload_dtype "bfloat16"; CUDA only). How the model is held (as own_begin). */
    int host_bf16;
} model_config_t;

typedef enum { CONFIG_AC_NONE = 0, CONFIG_AC_FULL = 1, CONFIG_AC_SELECTIVE = 2 } config_ac_mode_t;
typedef enum { CONFIG_ATTN_AUTO = 0, CONFIG_ATTN_CUDNN = 1, CONFIG_ATTN_OWN = 2 } config_attn_t;
/* "auto", "cudnn", "ctitan" -> config_attn_t: 0, or -1 for another name. */
int config_attn_parse(const char *name, int *attn);

/* What one layer keeps from its forward for its backward. ALL: every intermediate (mode
 * none). INPUT: only its input; the backward recomputes its forward first (full, and every
 * Nth layer of selective N). OPS: its input and the outputs of the matrix products, attention
 * and its softmax statistics; the backward recomputes the norms and SwiGLU (selective "op";
 * q and k are kept rotated, the products being rotated in place). */
typedef enum { CONFIG_KEEP_ALL = 0, CONFIG_KEEP_INPUT = 1, CONFIG_KEEP_OPS = 2 } config_keep_t;

/* "none", "full", "selective" (mode's manifest names; "?" outside), and back: 0 or -EINVAL. */
const char *config_ac_mode_name(int mode);
int config_ac_mode_parse(const char *name, int *mode);

/* Layer `layer` (0-based, of the whole model) under cfg's mode: selective N takes layers N-1,
 * 2N-1, ... (torchtitan counts blocks from 1 and wraps every N-th). */
config_keep_t config_ac_keep(const model_config_t *cfg, int layer);

/* torchtitan's Llama defaults (ModelArgs): n_kv_heads = n_heads, multiple_of 256, eps 1e-5,
 * rope_theta 10000, max_seq_len 2048; shape fields are 0 and must be set. */
model_config_t config_defaults(void);

/* Named shapes: "debugmodel" (torchtitan's debug Llama: dim 256, 6 layers, 16 heads,
 * vocab 2048), "gpt2s" (GPT-2-small-sized Llama: dim 768, 12 layers, 12 heads, vocab 50304),
 * "llama1b" (dim 2048, 16 layers, 16 heads, 8 kv heads, vocab 32000), "tiny" (for tests).
 * Returns 0, or -EINVAL for an unknown name. */
int config_preset(const char *name, model_config_t *cfg);

/* Sets one key from text ("dim", "rope_theta", ...). Returns 0 or -EINVAL with a message
 * in err naming the key and the expected type. */
int config_set(model_config_t *cfg, const char *key, const char *value, char *err, size_t errlen);

/* Fills defaults (n_kv_heads 0 -> n_heads) and checks every field and their relations.
 * Returns 0 or -EINVAL with a message naming the field, e.g.
 * "model.dim (250) is not divisible by model.n_heads (16)". */
int config_validate(model_config_t *cfg, char *err, size_t errlen);

/* The first key, in the order of the struct, whose value differs between a and b ("dim",
 * "rope_theta", ...), with a's and b's values in *va and *vb; NULL when they describe the same
 * model. max_seq_len is not compared: it bounds the sequence length, and the same weights
 * train at any length. */
const char *config_diff(const model_config_t *a, const model_config_t *b, double *va, double *vb);

int config_head_dim(const model_config_t *cfg);
/* The rotary inverse frequency of pair i of a head (0 <= i < head_dim / 2): theta^(-2i/hd),
 * scaled as Llama 3.1's rope_scaling "llama3" says when rope_scaling_factor > 0. Position t's
 * angle is t times it. */
double config_rope_inv_freq(const model_config_t *cfg, int i);
/* The FFN hidden size: hidden_dim when set, else torchtitan's FeedForward size: h = 4*dim;
 * h = 2h/3; h *= multiplier; round up to multiple_of. */
int config_ffn_hidden(const model_config_t *cfg);

/* Model FLOPs per token for forward+backward (PaLM convention): 6 * (matmul parameters,
 * lm_head included, embedding excluded) + 12 * n_layers * dim * T. */
double config_flops_per_token(const model_config_t *cfg, int T);

#endif
