/* Learning-rate schedule (see lr.h); the formula follows torchtitan's
 * linear_warmup_stable_decay, including its 0-based step +1 adjustments. */
#include "kernels/lr.h"

#include <errno.h>
#include <math.h>
#include <string.h>

lr_schedule_t lr_schedule_default(int steps)
{
    lr_schedule_t s = {.steps = steps, .warmup_steps = 200, .decay_ratio = -1,
                       .decay_type = LR_DECAY_LINEAR, .lr_min = 0.0};
    if (s.warmup_steps > steps)
        s.warmup_steps = steps;
    return s;
}

int lr_decay_parse(const char *str, lr_decay_t *out)
{
    if (!strcmp(str, "linear")) *out = LR_DECAY_LINEAR;
    else if (!strcmp(str, "sqrt")) *out = LR_DECAY_SQRT;
    else if (!strcmp(str, "cosine")) *out = LR_DECAY_COSINE;
    else return -EINVAL;
    return 0;
}

const char *lr_decay_name(lr_decay_t d)
{
    switch (d) {
    case LR_DECAY_LINEAR: return "linear";
    case LR_DECAY_SQRT: return "sqrt";
    case LR_DECAY_COSINE: return "cosine";
    }
    return "?";
}

double lr_factor(const lr_schedule_t *s, int step)
{
    int warmup = s->warmup_steps < s->steps ? s->warmup_steps : s->steps;
    int decay = s->steps - warmup;
    if (s->decay_ratio >= 0)
        decay = (int)lround((s->steps - warmup) * s->decay_ratio);
    int stable_end = s->steps - decay;
    if (step < warmup)
        return (double)(step + 1) / (warmup + 1);
    if (step < stable_end || decay <= 0)
        return 1.0;
    double progress = (double)(step + 1 - stable_end) / decay;
    if (progress > 1)
        progress = 1;
    double f;
    switch (s->decay_type) {
    case LR_DECAY_SQRT: f = 1.0 - sqrt(progress); break;
    case LR_DECAY_COSINE: f = 0.5 * (1.0 + cos(M_PI * progress)); break;
    default: f = 1.0 - progress; break;
    }
    return s->lr_min + (1.0 - s->lr_min) * f;
}
