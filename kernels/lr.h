/* Learning-rate schedule as torchtitan's linear_warmup_stable_decay: linear warmup, a
 * stable phase, then linear, sqrt or cosine decay to lr_min (a fraction of the peak). */
#ifndef CTITAN_LR_H
#define CTITAN_LR_H

#include <stddef.h>

typedef enum { LR_DECAY_LINEAR, LR_DECAY_SQRT, LR_DECAY_COSINE } lr_decay_t;

typedef struct {
    int steps;          /* training.steps */
    int warmup_steps;   /* lr_scheduler.warmup_steps (torchtitan default 200) */
    double decay_ratio; /* share of the post-warmup steps that decay; < 0 = all of them */
    lr_decay_t decay_type;
    double lr_min;      /* lr_scheduler.min_lr_factor, fraction of the peak lr */
} lr_schedule_t;

/* torchtitan's defaults for a run of `steps` steps (warmup clipped to steps). */
lr_schedule_t lr_schedule_default(int steps);
/* Parses "linear", "sqrt" or "cosine"; returns 0 or -EINVAL. */
int lr_decay_parse(const char *s, lr_decay_t *out);
/* The name lr_decay_parse reads, or "?" for a value out of the enum. */
const char *lr_decay_name(lr_decay_t d);
/* Multiplier of the peak lr for 0-based step index `step`. */
double lr_factor(const lr_schedule_t *s, int step);

#endif
