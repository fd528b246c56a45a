/* The Llama model on the CPU for one contiguous run of pieces (embedding, layers, head):
 * a whole model, or the part one pipeline stage holds. Forward, and backward split into
 * an input-gradient part (B) and a weight-gradient part (W) so zero-bubble schedules can
 * reorder them; a plain backward is B then W. Activations live in one model_acts_t per
 * microbatch in flight. */
#ifndef CTITAN_MODEL_H
#define CTITAN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/config.h"
#include "kernels/cpu/pool.h"
#include "kernels/params.h"

typedef struct model model_t;
typedef struct model_acts model_acts_t;

/* Holds pieces [piece_begin, piece_end) of params_piece_range. params and grads point at
 * the flat range of those pieces (not owned; grads are accumulated into, never cleared
 * here). pool may be NULL. cfg must be validated. Returns NULL on bad ranges or ENOMEM. */
model_t *model_new(const model_config_t *cfg, int piece_begin, int piece_end, float *params,
                   float *grads, pool_t *pool);
void model_destroy(model_t **m);
int model_has_embed(const model_t *m);
int model_has_head(const model_t *m);
/* Points the model at other parameter/gradient buffers of the same layout. */
void model_set_buffers(model_t *m, float *params, float *grads);

/* Where the weight gradients go with parameter sharding (params.h shard_io_t's take and give:
 * piece by piece, in the order the W runs: head, layers from the top, embedding; its weights
 * must be NULL: the group shares the params it computes on); NULL: into grads. A failure of io
 * is model_status's, and the rest of that call's W is skipped. */
void model_set_shard_io(model_t *m, const shard_io_t *io);

/* Activation storage for one [B, T] microbatch (owned by the caller). T <= max_seq_len.
 * What it holds per layer follows cfg->ac_mode (config_ac_keep); with activation
 * checkpointing the model also makes its first shared work sets here (model_work_bytes).
 * Destroy every acts before the model. */
model_acts_t *model_acts_new(model_t *m, int B, int T);
void model_acts_destroy(model_acts_t **a);
/* Bytes of one microbatch's storage (model_act_bytes, kernels/act_bytes.h, says the same
 * before any is made). */
size_t model_acts_bytes(const model_acts_t *a);
/* What model_acts_new allocates for a [B, T] microbatch of pieces [piece_begin, piece_end)
 * under cfg->ac_mode, without a model (model_act_bytes' per_mb; 0 for bad pieces): the memory
 * plan's per-microbatch activations (stages/plan/plan.h). */
size_t model_acts_bytes_for(const model_config_t *cfg, int piece_begin, int piece_end, int B, int T);
/* What a forward alone writes under full activation checkpointing, as the evaluations run it
 * (stages/report/evaluate.c: each layer's input, one layer's other tensors; the backward's
 * buffers are never touched, so never resident), whatever cfg->ac_mode says. */
size_t model_acts_forward_bytes_for(const model_config_t *cfg, int piece_begin, int piece_end, int B, int T);
/* What model_new allocates beside its tables, whatever its pieces: the rotary tables. */
size_t model_fixed_bytes(const model_config_t *cfg);
/* Bytes of the model's recompute work sets, shared by its microbatches: none without
 * checkpointing. A recomputed layer's tensors that it does not keep go to two: one of what its
 * W reads too (from the recompute to the W), one of what only its B reads (q, k, v, softmax,
 * the w1 and w3 products: for the B only; none under op, which keeps them). A forward uses one
 * of each; model_backward two and one; a model_backward_b keeps one of the first kind per
 * checkpointed layer until its model_backward_w (so schedules that hold W back grow them). */
size_t model_work_bytes(const model_t *m);
/* The first failure since the last call (-ENOMEM: a work set could not be made, and the call
 * that needed it stopped; model_forward then returned NaN; shard_io's), or 0; clears it. */
int model_status(model_t *m);
/* Logits of the last forward run without targets (NULL without the head). */
const float *model_logits(const model_acts_t *a);

/* Forward. With the embedding, tokens [B*T] are read (ids must be < vocab_size; the caller
 * validates data); otherwise x_in [B*T, dim]. With the head, targets [B*T] give the loss:
 * the return value is the sum of per-token losses and gradients are scaled by dscale
 * (1 / tokens in the global batch gives the mean); otherwise the output [B*T, dim] is
 * written to x_out and 0 is returned. With the head and targets NULL the forward stops
 * at the logits, which model_logits returns ([B*T, vocab]); used for sampling. */
double model_forward(model_t *m, model_acts_t *a, const int32_t *tokens, const float *x_in,
                     const int32_t *targets, float dscale, float *x_out);
/* Input-gradient part: dy [B*T, dim] is the gradient of the output (ignored with the
 * head); writes dx [B*T, dim] unless the model holds the embedding (dx may be NULL then).
 * Keeps what backward_w needs inside a. */
void model_backward_b(model_t *m, model_acts_t *a, const float *dy, float *dx);
/* Weight-gradient part: adds this microbatch's weight gradients into grads. */
void model_backward_w(model_t *m, model_acts_t *a);
/* Both, for a schedule that runs W right after B: the same bits as model_backward_b then
 * model_backward_w. With activation checkpointing each layer's W follows its B, so only two
 * layers' recomputed tensors are alive at a time. */
void model_backward(model_t *m, model_acts_t *a, const float *dy, float *dx);

#endif
