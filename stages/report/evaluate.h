/* What a trainer does with finished weights: the loss over held-out token windows, a text
 * sample, and the corpus's unigram entropy to judge the loss against. Used by `ctitan train`
 * and by the coordinator of `ctitan launch` at the end of a run. */
#ifndef CTITAN_EVALUATE_H
#define CTITAN_EVALUATE_H

#include <stdint.h>
#include <stdio.h>

#include "kernels/backend.h"
#include "kernels/config.h"
#include "kernels/cpu/pool.h"
#include "kernels/cuda/cuda_plugin.h"
#include "stages/data/tokenizer.h"
#include "stages/data/tokfile.h"

/* Fills [B, T] inputs and next-token targets from consecutive windows starting at *cursor
 * (a token index), wrapping to the start of the file when a window would pass its end.
 * window is scratch of T+1 ints. */
void eval_next_batch(const tokfile_t *tf, size_t *cursor, int B, int T, int32_t *tok, int32_t *tgt,
                     int32_t *window);

/* How a long evaluation says how far it is: on stderr, "WHO: validation: K of N batches (S s)"
 * once every_s seconds have passed and every every_s after (a large model's validation takes
 * minutes on a CPU); NULL: nothing. */
typedef struct {
    const char *who;
    double every_s;
} eval_say_t;

/* Mean per-token loss of the whole model with weights w over up to `batches` [B, T] batches
 * from the start of tf; *used gets the batches evaluated (NaN when none fit). Holds one layer's
 * activations at a time beside each layer's input (model_acts_forward_bytes_for), whatever
 * cfg->ac_mode; the same bits as a training forward of mode none. */
double eval_loss(const model_config_t *cfg, float *w, pool_t *pool, const tokfile_t *tf, int B, int T,
                 int batches, int *used, const eval_say_t *say);

/* eval_loss on a device's backend (kernels/backend.h; a GPU job's validation on its GPU, once
 * its stages are gone): the whole model's forward over the same batches, in that backend's
 * dtypes (bf16 products on CUDA: not the CPU's bits), under full activation checkpointing. On
 * the device: the weights (uploaded from w), its gradient buffer (allocated, never written) and
 * one batch's forward. Returns the mean, or NaN with err saying why (nothing fit, no device): the
 * caller may then evaluate on the CPU. */
double eval_loss_on(const backend_t *be, const model_config_t *cfg, float *w, const tokfile_t *tf, int B, int T,
                    int batches, int *used, const eval_say_t *say, char *err, size_t errlen);

/* Writes a sample of at most `ntokens` new tokens after a prompt of the first 8 tokens of
 * prompt_src to out: `ctitan generate`'s loop and sampler (stages/report/generate.h: the KV-cache
 * model, temperature 0 greedy, no top-k or top-p, the generator seeded by seed, stopping at the
 * tokenizer's EOS or the model's max_seq_len), so `ctitan generate` on the same weights with
 * these ids, temperature and seed gives the same text. gpu: the loaded CUDA plugin to run it on
 * the calling thread's GPU, NULL for the CPU (with pool). Returns 0 or -errno with err. */
#define EVAL_SAMPLE_PROMPT 8 /* the sample's prompt: the first tokens of its file */
int eval_sample(const model_config_t *cfg, const float *w, pool_t *pool, const cuda_plugin_t *gpu, tok_t *tok,
                const tokfile_t *prompt_src, int ntokens, double temperature, uint64_t seed, FILE *out, char *err,
                size_t errlen);

/* The host memory eval_sample holds on the CPU for ntokens (the memory plan's). */
size_t eval_sample_bytes(const model_config_t *cfg, int ntokens);

/* Entropy in nats of the token distribution of the first max_tokens tokens of tf (what a
 * model knowing only token frequencies would score). */
double eval_unigram_entropy(const tokfile_t *tf, size_t max_tokens);

#endif
