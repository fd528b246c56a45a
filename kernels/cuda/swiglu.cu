// SwiGLU of the MLP on the GPU, element-wise over bf16 (m = silu(gate) * up), fp32 arithmetic.
// CPU twins: ops_swiglu_fwd / ops_swiglu_bwd.
#include <math.h>

#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/nn_common.cuh"

#define SWIGLU_THREADS 256

// expf(-a) overflows to inf for a < -88.7, which gives sigmoid 0: the right limit.
__device__ static inline float nn_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

// Each thread reads element i of every input before writing element i of an output, so the
// outputs may alias the inputs.
static __global__ void swiglu_fwd_kernel(uint16_t *m, const uint16_t *a, const uint16_t *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float av = nn_bf16_to_f32(a[i]), bv = nn_bf16_to_f32(b[i]);
        m[i] = nn_f32_to_bf16(av * nn_sigmoid(av) * bv);
    }
}

// silu'(a) = s + a s (1 - s) with s = sigmoid(a) (see ref_swiglu_bwd).
static __global__ void swiglu_bwd_kernel(uint16_t *da, uint16_t *db, const uint16_t *dm,
                                         const uint16_t *a, const uint16_t *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float av = nn_bf16_to_f32(a[i]), bv = nn_bf16_to_f32(b[i]), g = nn_bf16_to_f32(dm[i]);
        float s = nn_sigmoid(av), silu = av * s;
        float dav = g * bv * (s + silu * (1.0f - s)), dbv = g * silu;
        da[i] = nn_f32_to_bf16(dav);
        db[i] = nn_f32_to_bf16(dbv);
    }
}

extern "C" int cuda_swiglu_fwd(uint16_t *m, const uint16_t *a, const uint16_t *b, size_t n,
                               void *stream)
{
    if (!m || !a || !b)
        return cuda_nn_fail("cuda_swiglu_fwd: bad arguments (n %zu; m, a, b must be device pointers)",
                            n);
    if (n == 0)
        return 0;
    swiglu_fwd_kernel<<<nn_grid_for(n, SWIGLU_THREADS), SWIGLU_THREADS, 0, (cudaStream_t)stream>>>(
        m, a, b, n);
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
    swiglu_bwd_kernel<<<nn_grid_for(n, SWIGLU_THREADS), SWIGLU_THREADS, 0, (cudaStream_t)stream>>>(
        da, db, dm, a, b, n);
    return cuda_nn_check(cudaGetLastError(), "cuda_swiglu_bwd launch");
}
