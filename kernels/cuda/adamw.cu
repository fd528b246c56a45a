// Fused AdamW over fp32 master weights on the GPU, and the small runtime helpers the
// host code uses; the CPU twin is ops_adamw (kernels/cpu/ops_basic.c).
#include <errno.h>
#include <math.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_ops.h"

extern "C" int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    return n;
}

// Element i reads only element i of p0, m0, v0 before it writes p, m, v, so in place and out
// of place give the same bits. The gradient g * gs is rounded on its own (__fmul_rn: never
// fused into what follows), the same float a scaled copy of the gradient would hold.
__global__ void adamw_kernel(float *p, float *m, float *v, const float *p0, const float *m0, const float *v0,
                             const float *g, float gs, size_t n, float lr, float b1, float b2, float eps,
                             float wd, float bc1, float bc2)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = __fmul_rn(g[i], gs), p0i = p0[i];
        float pi = p0i - lr * wd * p0i;
        float mi = b1 * m0[i] + (1.0f - b1) * gi;
        float vi = b2 * v0[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

extern "C" int cuda_adamw(float *param, float *m, float *v, const float *param0, const float *m0,
                          const float *v0, const float *grad, float gscale, size_t n, float lr, float beta1,
                          float beta2, float eps, float wd, int step, void *stream)
{
    if (step < 1 || !param || !m || !v || !param0 || !m0 || !v0 || !grad) {
        return cuda_err(-EINVAL, "cuda_adamw: bad arguments (step %d)", step);
    }
    if (n == 0)
        return 0;
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535 * 8)
        blocks = 65535 * 8;
    adamw_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(param, m, v, param0, m0, v0, grad, gscale, n,
                                                                      lr, beta1, beta2, eps, wd, bc1, bc2);
    return cuda_err_status(cudaGetLastError(), "cuda_adamw launch");
}

extern "C" int cuda_alloc(void **p, size_t bytes) { return cuda_err_status(cudaMalloc(p, bytes), "cudaMalloc"); }
extern "C" int cuda_free(void *p) { return cuda_err_status(cudaFree(p), "cudaFree"); }
extern "C" int cuda_copy_to_device(void *dst, const void *src, size_t bytes)
{
    return cuda_err_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
extern "C" int cuda_copy_to_host(void *dst, const void *src, size_t bytes)
{
    return cuda_err_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
