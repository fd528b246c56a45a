// SwiGLU of the MLP on the GPU, element-wise over bf16 (m = silu(gate) * up), fp32 arithmetic.
// CPU twins: ops_swiglu_fwd / ops_swiglu_bwd.
#include <math.h>

#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/nn_common.cuh"

#define SWIGLU_THREADS 256

// expf(-a) overflows to inf for a < -88.7, which gives sigmoid 0: the right limit.
__device__ static inline float nn_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

// One element: m = silu(a) b, and its gradients (silu'(a) = s + a s (1 - s) with s = sigmoid(a),
// see ref_swiglu_bwd). Both paths below call these, and the multiply-add is spelled out in _rn
// operations (nvcc may not fuse it one way in one loop and another way in the other), so they
// give the same bits.
__device__ static inline float swiglu_m(float av, float bv) { return av * nn_sigmoid(av) * bv; }

__device__ static inline void swiglu_d(float g, float av, float bv, float *dav, float *dbv)
{
    float s = nn_sigmoid(av), silu = av * s;
    *dav = __fmul_rn(__fmul_rn(g, bv), __fadd_rn(s, __fmul_rn(silu, __fsub_rn(1.0f, s))));
    *dbv = g * silu;
}

// Elements [0, 8 n8) eight at a time (every array 16-byte aligned), the rest one by one. Each
// thread reads element i of every input before writing element i of an output, so the outputs
// may alias the inputs.
static __global__ void swiglu_fwd_kernel(uint16_t *m, const uint16_t *a, const uint16_t *b, size_t n, size_t n8)
{
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = tid; j < n8; j += stride) {
        float av[8], bv[8], mv[8];
        nn_load8(av, a + 8 * j);
        nn_load8(bv, b + 8 * j);
#pragma unroll
        for (int k = 0; k < 8; k++)
            mv[k] = swiglu_m(av[k], bv[k]);
        nn_store8(m + 8 * j, mv);
    }
    for (size_t i = 8 * n8 + tid; i < n; i += stride)
        m[i] = nn_f32_to_bf16(swiglu_m(nn_bf16_to_f32(a[i]), nn_bf16_to_f32(b[i])));
}

static __global__ void swiglu_bwd_kernel(uint16_t *da, uint16_t *db, const uint16_t *dm, const uint16_t *a,
                                         const uint16_t *b, size_t n, size_t n8)
{
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = tid; j < n8; j += stride) {
        float av[8], bv[8], g[8], dav[8], dbv[8];
        nn_load8(av, a + 8 * j);
        nn_load8(bv, b + 8 * j);
        nn_load8(g, dm + 8 * j);
#pragma unroll
        for (int k = 0; k < 8; k++)
            swiglu_d(g[k], av[k], bv[k], &dav[k], &dbv[k]);
        nn_store8(da + 8 * j, dav);
        nn_store8(db + 8 * j, dbv);
    }
    for (size_t i = 8 * n8 + tid; i < n; i += stride) {
        float dav, dbv;
        swiglu_d(nn_bf16_to_f32(dm[i]), nn_bf16_to_f32(a[i]), nn_bf16_to_f32(b[i]), &dav, &dbv);
        da[i] = nn_f32_to_bf16(dav);
        db[i] = nn_f32_to_bf16(dbv);
    }
}

// Eight-element groups when every array starts 16-byte aligned, else none (all one by one).
static size_t groups8(size_t n, const void *const *p, int np)
{
    for (int k = 0; k < np; k++)
        if (!nn_aligned16(p[k]))
            return 0;
    return n / 8;
}

// Threads for n8 groups and the n - 8 n8 elements after them.
static unsigned grid8(size_t n, size_t n8) { return nn_grid_for(n8 + (n - 8 * n8), SWIGLU_THREADS); }

extern "C" int cuda_swiglu_fwd(uint16_t *m, const uint16_t *a, const uint16_t *b, size_t n,
                               void *stream)
{
    if (!m || !a || !b)
        return cuda_nn_fail("cuda_swiglu_fwd: bad arguments (n %zu; m, a, b must be device pointers)",
                            n);
    if (n == 0)
        return 0;
    const void *p[] = {m, a, b};
    size_t n8 = groups8(n, p, 3);
    swiglu_fwd_kernel<<<grid8(n, n8), SWIGLU_THREADS, 0, (cudaStream_t)stream>>>(m, a, b, n, n8);
    return cuda_nn_check(cudaGetLastError(), "cuda_swiglu_fwd launch");
}

extern "C" int cuda_swiglu_bwd(uint16_t *da, uint16_t *db, const uint16_t *dm, const uint16_t *a,
                               const uint16_t *b, size_t n, void *stream)
{
    if (!da || !db || !dm || !a || !b || da == db)
        return cuda_nn_fail("cuda_swiglu_bwd: bad arguments (n %zu; da, db, dm, a, b must be device "
                            "pointers, da != db)", n);
    if (n == 0)
        return 0;
    const void *p[] = {da, db, dm, a, b};
    size_t n8 = groups8(n, p, 5);
    swiglu_bwd_kernel<<<grid8(n, n8), SWIGLU_THREADS, 0, (cudaStream_t)stream>>>(da, db, dm, a, b, n, n8);
    return cuda_nn_check(cudaGetLastError(), "cuda_swiglu_bwd launch");
}
