/* Inference of the whole Llama model on the CPU with a KV cache (fp32): `ctitan generate`'s
 * model. A prompt goes through in one pass (prefill), then one token at a time attends to the
 * keys and values kept from every earlier position, instead of recomputing the window as
 * kernels/cpu/model.h does. The same ops (kernels/ops.h) and the same weights layout (the flat
 * space of kernels/params.h); rotary angles are t * config_rope_inv_freq(cfg, i), so Llama
 * 3.1's frequency scaling applies. */
#ifndef CTITAN_INFER_H
#define CTITAN_INFER_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/config.h"
#include "kernels/cpu/pool.h"

typedef struct infer infer_t;

/* A model over the flat weights w (not owned; kernels/params.h order, the whole model) with a
 * cache of `capacity` positions (1..max_seq_len) and room for up to `max_batch` tokens per
 * infer_forward call; all_logits: room for the logits of every token of a call (max_batch x
 * vocab floats), else for the last token's only. cfg must be validated. pool may be NULL. NULL on
 * bad sizes or ENOMEM. */
infer_t *infer_new(const model_config_t *cfg, const float *w, int capacity, int max_batch, int all_logits,
                   pool_t *pool);
void infer_destroy(infer_t **s);
/* Positions held in the cache (the next token's position). */
int infer_pos(const infer_t *s);
int infer_capacity(const infer_t *s);
/* Forgets the cache (the next token is at position 0). */
void infer_reset(infer_t *s);
/* Bytes of the cache and the buffers. */
size_t infer_bytes(const infer_t *s);
/* What infer_new(cfg, ..., capacity, max_batch, all_logits) allocates for them (the plan's). */
size_t infer_bytes_for(const model_config_t *cfg, int capacity, int max_batch, int all_logits);

/* Runs tokens[0..n) at positions infer_pos()..+n (1 <= n <= max_batch, the end within the
 * capacity; ids < vocab_size, checked by the caller), appending their keys and values to the
 * cache. Returns the logits: [n, vocab] with all_logits, else those of the last token only
 * ([vocab]); valid until the next call. NULL when n or the position is out of range, or for
 * all_logits (n > 1) from a model made without room for them. */
const float *infer_forward(infer_t *s, const int32_t *tokens, int n, int all_logits);

#endif
