/* Text generation from finished weights (`ctitan generate`): the sampler (temperature, then
 * top-k, then top-p, in the order of transformers' logits warpers, from a seeded generator),
 * the generation loop over the KV-cache model (kernels/cpu/infer.h, or the GPU's
 * kernels/cuda/cuda_infer.h through the CUDA plugin), and the UTF-8 hold-back that lets tokens
 * stream as text. */
#ifndef CTITAN_GENERATE_H
#define CTITAN_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/config.h"
#include "kernels/cpu/pool.h"
#include "kernels/cuda/cuda_plugin.h"

typedef struct {
    double temperature; /* 0 = greedy: the highest logit, the lowest id among equal ones */
    int top_k;          /* 0 = off: else only the k highest logits (ties with the k-th kept) */
    double top_p;       /* 1 = off: else the fewest highest tokens whose probability reaches p */
    uint64_t seed;
} gen_params_t;

/* Checks the values; -EINVAL with a message naming the flag (--temperature, --top-k,
 * --top-p) in err. */
int gen_params_check(const gen_params_t *p, char *err, size_t errlen);

typedef struct gen_sampler gen_sampler_t;
/* A sampler over V logits with p's settings (checked) and a generator seeded by p->seed. NULL
 * on ENOMEM. */
gen_sampler_t *gen_sampler_new(const gen_params_t *p, int V);
void gen_sampler_destroy(gen_sampler_t **s);
/* The next token from logits[0..limit) (limit <= V: ids from limit on are never picked, e.g. a
 * model vocabulary padded past the tokenizer's). Advances the generator unless greedy. */
int gen_sample(gen_sampler_t *s, const float *logits, int limit);

/* The distribution gen_sample draws from: *ids (most likely first) and their *probs (summing to
 * 1), pointers into s valid until its next call; returns how many. Greedy: the one token. */
int gen_distribution(gen_sampler_t *s, const float *logits, int limit, const int **ids, const double **probs);

/* How many bytes of buf[0..n) may be written now: all but an incomplete UTF-8 sequence at the
 * end (one that more bytes could complete). Invalid bytes are not held. */
size_t gen_utf8_ready(const uint8_t *buf, size_t n);

/* Whether token is one of eos[0..n). */
static inline int gen_is_eos(const int *eos, int n, int32_t token)
{
    for (int i = 0; i < n; i++)
        if (eos[i] == token)
            return 1;
    return 0;
}

/* Called with each new token; a nonzero return stops the generation (after that token). */
typedef int (*gen_token_fn)(void *ctx, uint32_t token);

typedef struct {
    int prompt_tokens, new_tokens;
    double prefill_s, decode_s; /* seconds in the prompt's pass, and in the tokens after it */
    const char *stop;           /* "eos", "max tokens", "max_seq_len", "callback" */
} gen_stats_t;

/* Continues prompt[0..n_prompt) (ids < cfg->vocab_size, n_prompt >= 1) with the whole model
 * of weights w: at most max_tokens new tokens, stopping after any of eos[0..n_eos) (a model's
 * end-of-text ids: a Llama 3 instruct has three) or when the model's max_seq_len positions are
 * used; each new token goes to fn. vocab_limit bounds the ids sampled (cfg->vocab_size for
 * all). gpu: the loaded CUDA plugin to run the model on the calling thread's current GPU, NULL
 * for the CPU (with pool). Returns 0, -EINVAL (bad prompt, params or a prompt of max_seq_len
 * tokens or more: err says which), -ENOMEM, or the GPU's error (err has its text). */
/* The host memory gen_run holds on the CPU for such a prompt and max_tokens (the plan's). */
size_t gen_run_bytes(const model_config_t *cfg, int n_prompt, int max_tokens);

int gen_run(const model_config_t *cfg, const float *w, pool_t *pool, const cuda_plugin_t *gpu,
            const gen_params_t *p, const uint32_t *prompt, int n_prompt, int max_tokens, const int *eos, int n_eos,
            int vocab_limit, gen_token_fn fn, void *ctx, gen_stats_t *st, char *err, size_t errlen);

#endif
