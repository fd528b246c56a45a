/* The activation memory of a model of pieces under activation checkpointing, before any is
 * made: what a memory plan (ctitan launch --dry-run) adds up per stage. The layouts are the
 * CPU model's (kernels/cpu/model.c, fp32) and the CUDA model's (kernels/cuda/model.cu, bf16
 * tensors, fp32 statistics, each tensor rounded up to 256 bytes); tests check these figures
 * against the bytes each model allocates. */
#ifndef CTITAN_ACT_BYTES_H
#define CTITAN_ACT_BYTES_H

#include <stddef.h>

#include "kernels/config.h"

typedef enum { MODEL_ACT_CPU = 0, MODEL_ACT_CUDA = 1 } model_act_layout_t;

typedef struct {
    size_t per_mb;      /* one microbatch's storage under cfg->ac_mode (model_acts_bytes,
                         * cuda_model_acts_bytes): what each microbatch in flight holds, but
                         * the gradients B keeps for W (in work sets, below) */
    size_t per_mb_none; /* the same in mode none */
    size_t unit;        /* one recompute work set of what W reads too: one layer's tensors that a
                         * checkpointed layer does not keep, but those of unit_b (0 without
                         * checkpointing) */
    size_t unit_b;      /* the one work set of what only B reads (q, k, v, attention's softmax
                         * or statistics, the w1 and w3 products), bound from a layer's
                         * recompute to the end of its B: 0 under op (kept), else one a stage */
    int ckpt_layers;    /* held layers that recompute */
    int units_fused;    /* work sets when every W runs with its B: 0 without checkpointing, 2 when
                         * two checkpointed layers are adjacent, else 1 (also what the model makes
                         * at its first acts) */
    size_t unit_g;      /* one gradient work set: the gradients B keeps for W of one layer that
                         * is not checkpointed (a checkpointed one's are in its `unit`) */
    int keep_layers;    /* held layers that are not checkpointed */
    int units_g_fused;  /* gradient work sets when every W runs with its B: 2 when two layers
                         * that are not checkpointed are adjacent, 1 with one, else 0 */
    size_t head;        /* the CUDA head's logits chunk (act_head_rows x vocabulary, bf16), one
                         * for all microbatches: 0 on the CPU and without the head */
} model_act_size_t;

/* Pieces [p0, p1) of a validated cfg (params_piece_range order), [B, T] microbatches. Returns
 * 0, or -EINVAL for bad pieces or sizes. */
int model_act_bytes(const model_config_t *cfg, int p0, int p1, int B, int T, model_act_layout_t layout,
                    model_act_size_t *out);

/* The activation bytes of a chunk: in_flight microbatches between their F and their W
 * (sched_peak_acts) and the work sets; held_w is the most microbatches that sit between their
 * B and their W at once (sched_peak_held_w; 0 when every W runs right after its B: the stage
 * then runs them together and units_fused and units_g_fused work sets do), plus unit_b. With
 * held_w > 0 an upper bound: the work sets grow to what the schedule needs, at most
 * held_w x ckpt_layers + 1 of `unit` and held_w x keep_layers of `unit_g` (a stage that runs
 * B and W apart while its schedule has W right after B: held_w 1). The head's chunk once. */
size_t model_act_total(const model_act_size_t *s, int in_flight, int held_w);

#endif
