// Fused AdamW over fp32 master weights on the GPU (kernels/adamw.h's arithmetic: the bits of the
// CPU twin, ops_adamw_to in kernels/cpu/ops_basic.c), and the small runtime helpers the host
// code uses.
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/adamw.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/nn_common.cuh"

extern "C" int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    return n;
}

// One element of kernels/adamw.h's step, every operation an _rn intrinsic, so nvcc never fuses
// a multiply-add: the CPU's ops_adamw_to does the same operations in the same order (keep the
// two in step), and the two give the same bits.
__device__ __forceinline__ void adamw_elem(float &p, float &m, float &v, float p0, float m0, float v0, float g,
                                           const adamw_scalars_t &s)
{
    float gi = __fmul_rn(g, s.gscale);
    m = __fadd_rn(m0, __fmul_rn(s.w1, __fsub_rn(gi, m0)));
    v = __fadd_rn(__fmul_rn(v0, s.beta2), __fmul_rn(__fmul_rn(s.w2, gi), gi));
    float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
    p = __fsub_rn(__fmul_rn(p0, s.decay), __fmul_rn(s.step_size, __fdiv_rn(m, den)));
}

// The outputs beside the state, when asked (wo, gc not NULL): the new master's bf16 (the
// stages' weights, __float2bfloat16 as cuda_f32_to_bf16_dev rounds) and the gradient cleared,
// each once element i's sources are read: the publish's two passes (plane_reduce_publish) in
// this one.
__device__ __forceinline__ unsigned bf16_bits(float f)
{
    __nv_bfloat16 h = __float2bfloat16(f);
    return *(const uint16_t *)&h;
}

__device__ __forceinline__ void adamw_out(uint16_t *wo, float *gc, size_t i, float p)
{
    if (wo)
        ((__nv_bfloat16 *)wo)[i] = __float2bfloat16(p);
    if (gc)
        gc[i] = 0.0f;
}

// Elements [head, head + 4 n4) four at a time (every array 16-byte aligned at head, wo 8-byte),
// the ones before and after one by one; head = n and n4 = 0 when the arrays' alignments differ.
// Element i reads only element i of the sources before it writes the outputs: in place and out
// of place, and any split of the arrays, give the same bits. gs: the clip factor made on the
// device (cuda_norm_clip), or NULL for s's.
__global__ void adamw_kernel(float *p, float *m, float *v, const float *p0, const float *m0, const float *v0,
                             const float *g, size_t n, size_t head, size_t n4, adamw_scalars_t s, const float *gs,
                             uint16_t *wo, float *gc)
{
    if (gs)
        s.gscale = *gs;
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = tid; i < head; i += stride) {
        adamw_elem(p[i], m[i], v[i], p0[i], m0[i], v0[i], g[i], s);
        adamw_out(wo, gc, i, p[i]);
    }
    for (size_t i = head + 4 * n4 + tid; i < n; i += stride) {
        adamw_elem(p[i], m[i], v[i], p0[i], m0[i], v0[i], g[i], s);
        adamw_out(wo, gc, i, p[i]);
    }
    for (size_t j = tid; j < n4; j += stride) {
        size_t i = head + 4 * j;
        NN_ALIGNED(p + i, 16), NN_ALIGNED(g + i, 16);
        float4 P0 = *(const float4 *)(p0 + i), M0 = *(const float4 *)(m0 + i), V0 = *(const float4 *)(v0 + i);
        float4 G = *(const float4 *)(g + i), P, M, V;
        adamw_elem(P.x, M.x, V.x, P0.x, M0.x, V0.x, G.x, s);
        adamw_elem(P.y, M.y, V.y, P0.y, M0.y, V0.y, G.y, s);
        adamw_elem(P.z, M.z, V.z, P0.z, M0.z, V0.z, G.z, s);
        adamw_elem(P.w, M.w, V.w, P0.w, M0.w, V0.w, G.w, s);
        *(float4 *)(p + i) = P;
        *(float4 *)(m + i) = M;
        *(float4 *)(v + i) = V;
        if (wo) /* four bf16 in one 8-byte store, element i in the low half */
            NN_ALIGNED(wo + i, 8), *(uint2 *)(wo + i) = make_uint2(bf16_bits(P.x) | bf16_bits(P.y) << 16, bf16_bits(P.z) | bf16_bits(P.w) << 16);
        if (gc)
            NN_ALIGNED(gc + i, 16), *(float4 *)(gc + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

extern "C" int cuda_adamw(float *param, float *m, float *v, const float *param0, const float *m0,
                          const float *v0, const float *grad, float gscale, const float *gscale_at, size_t n,
                          float lr, float beta1, float beta2, float eps, float wd, int step, uint16_t *w_out,
                          float *g_clear, void *stream)
{
    if (step < 1 || !param || !m || !v || !param0 || !m0 || !v0 || !grad) {
        return cuda_err(-EINVAL, "cuda_adamw: bad arguments (step %d)", step);
    }
    if (n == 0)
        return 0;
    adamw_scalars_t s;
    adamw_scalars(&s, gscale, lr, beta1, beta2, eps, wd, step);
    uintptr_t at = (uintptr_t)param & 15;
    const void *all[] = {m, v, param0, m0, v0, grad};
    int same = at % sizeof(float) == 0;
    for (int k = 0; k < 6; k++)
        same = same && ((uintptr_t)all[k] & 15) == at;
    size_t head = same ? ((16 - at) & 15) / sizeof(float) : n;
    if (head > n)
        head = n;
    if ((w_out && ((uintptr_t)(w_out + head) & 7)) || (g_clear && ((uintptr_t)(g_clear + head) & 15)))
        head = n; /* the outputs' four at a time would not be aligned there */
    size_t n4 = (n - head) / 4, items = n4 + (n - head - 4 * n4) + head;
    size_t blocks = (items + 255) / 256;
    if (blocks > 65535 * 8)
        blocks = 65535 * 8;
    adamw_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(param, m, v, param0, m0, v0, grad, n, head, n4,
                                                                      s, gscale_at, w_out, g_clear);
    return cuda_err_status(cudaGetLastError(), "cuda_adamw launch");
}

extern "C" int cuda_alloc(void **p, size_t bytes) { return cuda_err_status(cudaMalloc(p, bytes), "cudaMalloc"); }
extern "C" int cuda_free(void *p) { return cuda_err_status(cudaFree(p), "cudaFree"); }
/* cudaMemcpy from pageable memory returns once the bytes are staged, before they reach the
 * device; work on a non-blocking stream (every stream of ours) could run first and see the old
 * bytes. Waiting for the legacy stream makes "on the device when this returns" true. */
extern "C" int cuda_copy_to_device(void *dst, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cudaStreamLegacy);
    return cuda_err_status(e, "cudaMemcpy H2D");
}
extern "C" int cuda_copy_to_host(void *dst, const void *src, size_t bytes)
{
    return cuda_err_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
