/* The optimizers, as a table (torchtitan's OptimizersContainer + Stateful, in C): each row
 * names an optimizer ([optimizer] name), its state arrays and what they are called in a
 * checkpoint, whether its step needs whole tensors, and its step over the backend's vector
 * kernels (kernels/backend.h). The training state of a parameter is its fp32 master weight
 * (array 0) and the optimizer's state arrays (1 ..): every layout that holds the state derives
 * from the row, the staging segment (stages/job/staging.h), the CPU shards' optstate segment
 * (stages/job/job.h), a checkpoint's files and tensor names (checkpointd/ckpt_layout.h),
 * restore and the memory estimate. AdamW is the one row today; another optimizer is one more
 * row, its kernels in the backend and its name in a manifest. */
#ifndef CTITAN_OPTIM_H
#define CTITAN_OPTIM_H

#include <stddef.h>

#include "kernels/backend.h"

#define OPTIM_STATE_MAX 3               /* state arrays of an optimizer */
#define OPTIM_ARRAYS_MAX (1 + OPTIM_STATE_MAX)
#define OPTIM_NAME_MAX 16               /* an optimizer's or a state array's name, NUL included */

/* One step's numbers for one tensor (or a part of one). */
typedef struct {
    float lr;             /* the step's, schedule applied */
    float beta1, beta2, eps;
    float weight_decay;   /* 0 where this tensor is not decayed */
    float gscale;         /* the clip factor the gradient is scaled by */
    const float *gscale_at; /* or, where not NULL, the float there in the backend's memory (made
                             * on the device: stages/runtime/devnorm.h devnorm_clip) */
    int step;             /* 1-based: steps including this one */
    /* where the step also writes the new weights in the backend's dtype and clears the
     * gradient, at the call's first element (backend.h adamw's w_out, g_clear); NULL: not */
    void *w_out;
    float *g_clear;
} optim_args_t;

typedef struct {
    const char *name;                     /* [optimizer] name, matched without case */
    int n_state;                          /* state arrays beside the master weights */
    const char *state[OPTIM_STATE_MAX];   /* their names: checkpoint files NAME.bin, tensors
                                           * optimizer.NAME.<parameter>; zeros at the start */
    int whole_tensors;                    /* its step needs each tensor whole in one shard: shard
                                           * slices end at tensor boundaries (job_shard_range) */
    /* One step over n floats: to[a] from from[a] for every array a (0 the master weights, then
     * the state), g the summed gradient; to == from updates in place, else the sources are only
     * read and must not overlap the outputs. Returns the backend's 0 or -errno. */
    int (*step)(const backend_t *be, float *const *to, const float *const *from, const float *g, size_t n,
                const optim_args_t *a, void *stream);
} optim_t;

/* The row named `name` (any case), or NULL. */
const optim_t *optim_find(const char *name);
/* Arrays of the training state per parameter: the master weights and the state arrays. */
static inline int optim_arrays(const optim_t *o) { return 1 + o->n_state; }
/* Every optimizer's name, "AdamW, ...", for an error message. Returns buf. */
const char *optim_names(char *buf, size_t n);

#endif
