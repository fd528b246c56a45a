/* The gradient norm's one order of additions and the clip factor made from it, for the host
 * (the coordinator summing the shards' block norms in the job segment) and the device (GPU
 * optimizer shards summing each other's on the device: kernels/cuda/dev.cu cuda_norm_clip),
 * so both give the same bits from the same block norms.
 *
 * The squared norms of the flat space's blocks, x[0, n), go into NORM_LANES running sums, block
 * b into lane b % NORM_LANES in increasing b (each lane starting at 0), and the lanes are then
 * added pairwise, lane i += lane i + w for w = NORM_LANES / 2, ..., 1. Blocks are aligned to the
 * flat space, so the sum is the same for any shard count; the lanes are independent chains (the
 * host's additions pipeline, a device's threads each take some lanes). Only additions of
 * doubles: no multiply-add a compiler could fuse. The clip factor is torch's
 * clip_grad_norm_: max_norm / (norm + 1e-6) where that is below 1, rounded once to float. */
#ifndef CTITAN_NORM_ORDER_H
#define CTITAN_NORM_ORDER_H

#include <math.h>
#include <stddef.h>

#define NORM_LANES 1024

#ifdef __CUDACC__
#define NORM_FN __host__ __device__ static inline
#else
#define NORM_FN static inline
#endif

/* sqrt(sq)'s clip factor for max_norm (<= 0: no clipping, 1). */
NORM_FN double norm_clip_scale(double max_norm, double norm)
{
    double scale = max_norm > 0 ? max_norm / (norm + 1e-6) : 1.0;
    return scale < 1.0 ? scale : 1.0;
}

#ifndef __CUDACC__
/* The running sums of x[0, n) in the order above, into lane[NORM_LANES] (a row of NORM_LANES
 * blocks at a time: the lanes' additions side by side, vectorised, each lane's in increasing b). */
static inline void norm_lanes(const double *x, size_t n, double *lane)
{
    for (int i = 0; i < NORM_LANES; i++)
        lane[i] = 0;
    size_t b = 0;
    for (; b + NORM_LANES <= n; b += NORM_LANES)
        for (int i = 0; i < NORM_LANES; i++)
            lane[i] += x[b + i];
    for (int i = 0; b + i < n; i++)
        lane[i] += x[b + i];
}

/* The sum of x[0, n) in the order above. */
static inline double norm_sum(const double *x, size_t n)
{
    double lane[NORM_LANES];
    norm_lanes(x, n, lane);
    for (int w = NORM_LANES / 2; w > 0; w /= 2)
        for (int i = 0; i < w; i++)
            lane[i] += lane[i + w];
    return lane[0];
}
#endif

#endif
