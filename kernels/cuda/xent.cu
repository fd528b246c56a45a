// Fused softmax cross-entropy on the GPU over bf16 logits [N,V] (V up to Llama 3's 128256): the
// loss and the logits' gradient of the head in one kernel. CPU twin: ops_xent.
#include <math.h>

#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/nn_common.cuh"

#define XENT_THREADS 512 // per row; a multiple of 32

// Merges the running (max, sum of exp(l - max)) pair (m2, s2) into (m, s). An empty pair is
// (-inf, 0); the selects keep -inf - -inf (NaN) out of expf. Symmetric in its two pairs, so the
// butterfly below leaves the same bits in every lane.
__device__ static inline void ms_merge(float &m, float &s, float m2, float s2)
{
    float mx = fmaxf(m, m2);
    float a = m == -INFINITY ? 0.0f : s * expf(m - mx);
    float b = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mx);
    m = mx;
    s = a + b;
}

// (max, sum) over the block, returned to every thread; same structure as nn_block_sum.
__device__ static void ms_block(float &m, float &s, float *shm, float *shs)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    __syncthreads();
    if (lane == 0)
        shm[warp] = m, shs[warp] = s;
    __syncthreads();
    m = lane < nw ? shm[lane] : -INFINITY;
    s = lane < nw ? shs[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1)
        ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// A row in chunks of 8 elements, chunk c = [8c, 8c + 8), as rmsnorm.cu reads (nn_load_group:
// with `vec`, V % 8 == 0 and both arrays 16-byte aligned, one 16-byte access); elements past V
// read as -inf (nothing to the max and the sum) and are not written.
__device__ static inline void xent_load(float *f, const uint16_t *row, int c, int V, int vec)
{
    nn_load_group(f, row, c, V, vec, -INFINITY);
}

// One block per row, two passes over it. Pass 1: each thread keeps an online (max, sum) over
// its chunks' elements in order (one expf per element), then the block merges them. Pass 2:
// dlogits = exp(l - max) * (dscale / sum), minus dscale at the target. Every read of the row
// (pass 1 and the target logit) comes before the barriers of the merge and each thread writes
// only the elements it reads in pass 2, so dlogits may alias logits. Thread t takes chunks t,
// t + blockDim.x, ... either way: the same bits both ways.
static __global__ void xent_kernel(uint16_t *dlogits, float *loss, const uint16_t *logits,
                                   const int32_t *targets, int V, float dscale, int vec)
{
    __shared__ float shm[32], shs[32];
    size_t base = (size_t)blockIdx.x * V;
    const uint16_t *l = logits + base;
    uint16_t *d = dlogits + base;
    int tg = targets[blockIdx.x], nc = (V + 7) / 8;
    bool tg_ok = tg >= 0 && tg < V;
    float lt = tg_ok ? nn_bf16_to_f32(l[tg]) : NAN;
    float m = -INFINITY, s = 0.0f;
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
        float x[8];
        xent_load(x, l, c, V, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            if (x[k] > m) {
                s = s * expf(m - x[k]) + 1.0f; // m = -inf at the first element: 0 * 0 + 1
                m = x[k];
            } else if (x[k] != -INFINITY) {
                s += expf(x[k] - m);
            }
        }
    }
    ms_block(m, s, shm, shs);
    if (threadIdx.x == 0)
        loss[blockIdx.x] = (float)((double)m + log((double)s) - (double)lt);
    float kk = dscale / s;
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
        float x[8], g[8];
        xent_load(x, l, c, V, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            g[k] = expf(x[k] - m) * kk;
            if (8 * c + k == tg)
                g[k] -= dscale;
        }
        if (vec) {
            nn_store8(d + 8 * c, g);
        } else {
            for (int k = 0; k < 8; k++)
                if (8 * c + k < V)
                    d[8 * c + k] = nn_f32_to_bf16(g[k]);
        }
    }
}

extern "C" int cuda_xent(uint16_t *dlogits, float *loss, const uint16_t *logits, const int32_t *targets,
                         int N, int V, float dscale, void *stream)
{
    if (!dlogits || !loss || !logits || !targets || N < 0 || V <= 0 || !isfinite(dscale))
        return cuda_nn_fail("cuda_xent: bad arguments (N %d, V %d, dscale %g; dlogits, loss, logits, "
                            "targets must be device pointers)", N, V, (double)dscale);
    if (N == 0)
        return 0;
    int vec = V % 8 == 0 && nn_aligned16(dlogits) && nn_aligned16(logits);
    xent_kernel<<<N, XENT_THREADS, 0, (cudaStream_t)stream>>>(dlogits, loss, logits, targets, V,
                                                              dscale, vec);
    return cuda_nn_check(cudaGetLastError(), "cuda_xent launch");
}
