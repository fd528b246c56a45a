/* A Hugging Face Llama's config.json read into ctitan's model shape (kernels/config.h), for
 * `ctitan ckpt import` and a job's checkpoint.initial_load_path (checkpointd/hf_import.h).
 * Only what ctitan runs is taken: LlamaForCausalLM (model_type "llama"), SiLU, no biases,
 * head_dim = hidden_size / num_attention_heads, no rotary scaling or Llama 3.1's "llama3";
 * anything else is refused by name. Returns 0 or -errno, the reason in err; nothing exits. */
#ifndef CTITAN_HF_CONFIG_H
#define CTITAN_HF_CONFIG_H

#include <stddef.h>

#include "kernels/config.h"

#define HF_CONFIG_MAX (1u << 20) /* the largest config.json read */

typedef struct {
    model_config_t model; /* validated; multiple_of and ffn_dim_multiplier are the defaults (the
                           * FFN size is hidden_dim = intermediate_size) */
    int tied;             /* tie_word_embeddings: lm_head.weight is embed_tokens' (Llama 3.2) */
} hf_config_t;

/* Parses config.json's text (len bytes; `what` names it in errors, e.g. its path). Keys:
 * hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (absent: the
 * heads), intermediate_size, rms_norm_eps, rope_theta (absent: 10000), rope_scaling (absent,
 * null, or rope_type/type "llama3" with factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings), max_position_embeddings, vocab_size,
 * tie_word_embeddings (absent: false). -EINVAL naming the key for a missing or mistyped one,
 * -ENOTSUP naming what ctitan cannot run (another architecture or model_type, a bias, another
 * hidden_act, another head_dim, another rope_scaling type). */
int hf_config_parse(const char *text, size_t len, const char *what, hf_config_t *out, char *err, size_t errlen);
/* DIR/config.json read and parsed (at most 1 MiB). */
int hf_config_load(const char *dir, hf_config_t *out, char *err, size_t errlen);

#define HF_EOS_MAX 8 /* end-of-text ids a folder may name */
/* The ids that end a generation with the model of folder DIR, as transformers' generate takes
 * them: generation_config.json's eos_token_id when it has the key, else config.json's; an id or
 * a list of ids (at most HF_EOS_MAX, each below vocab), null or absent for none. *n gets how
 * many went into ids. -EINVAL naming the file and the key for another value. */
int hf_eos_ids(const char *dir, int vocab, int *ids, int *n, char *err, size_t errlen);
/* The eos_token_id of one such file's text (len bytes; `what` names it): *found when it has the
 * key; ids and *n as hf_eos_ids (none after an error). */
int hf_eos_parse(const char *text, size_t len, const char *what, int vocab, int *ids, int *n, int *found, char *err,
                 size_t errlen);

#endif
