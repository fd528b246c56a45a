/* AdamW's step, one definition of its arithmetic for the CPU (kernels/cpu/ops_basic.c
 * ops_adamw_to) and the GPU (kernels/cuda/adamw.cu cuda_adamw), so both give the same bits
 * from the same inputs. The scalars of a step, computed here once in double and rounded once:
 *
 *     decay     = 1 - lr * wd
 *     step_size = lr / (1 - beta1^step)
 *     bc2_sqrt  = sqrt(1 - beta2^step)
 *     w1, w2    = 1 - beta1, 1 - beta2 (float)
 *
 * and for each element, each operation rounded to float on its own, in this order (torch's
 * single-tensor AdamW; never a fused multiply-add: the CPU builds with -ffp-contract=off, the
 * GPU kernel spells every operation as an _rn intrinsic):
 *
 *     g = grad * gscale
 *     m = m0 + w1 * (g - m0)
 *     v = v0 * beta2 + (w2 * g) * g
 *     p = p0 * decay - step_size * (m / (sqrt(v) / bc2_sqrt + eps))
 *
 * Element i reads only element i of the sources before it writes element i of the outputs, so
 * in place and out of place, and any split of the arrays (shards, runs, vector widths), give
 * the same bits. */
#ifndef CTITAN_ADAMW_H
#define CTITAN_ADAMW_H

#include <math.h>

typedef struct {
    float gscale, decay, w1, beta2, w2, step_size, bc2_sqrt, eps;
} adamw_scalars_t;

static inline void adamw_scalars(adamw_scalars_t *s, float gscale, float lr, float beta1, float beta2, float eps,
                                 float wd, int step)
{
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    s->gscale = gscale;
    s->decay = (float)(1.0 - (double)lr * wd);
    s->w1 = 1.0f - beta1;
    s->beta2 = beta2;
    s->w2 = 1.0f - beta2;
    s->step_size = (float)(lr / bc1);
    s->bc2_sqrt = (float)sqrt(bc2);
    s->eps = eps;
}

#endif
