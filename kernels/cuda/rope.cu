// Rotary position embedding on the GPU, in place on bf16 q or k [B,T,H,hd] (and on their
// gradients), Hugging Face rotate_half convention. CPU twins: ops_rope_table / _fwd / _bwd.
#include <math.h>

#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/nn_common.cuh"

#define ROPE_THREADS 256

// Same expression as ops_rope_table / ref_rope_table, in double, rounded once to fp32.
static __global__ void rope_table_kernel(float *cos_t, float *sin_t, size_t n, int half, int hd,
                                         double theta)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(k / half), i = (int)(k % half);
        double ang = t * pow(theta, -2.0 * i / hd);
        cos_t[k] = (float)cos(ang);
        sin_t[k] = (float)sin(ang);
    }
}

// angle = t * inv_freq[i] (inv_freq: config_rope_inv_freq, computed on the host)
static __global__ void rope_table_freq_kernel(float *cos_t, float *sin_t, size_t n, int half,
                                              const double *inv_freq)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(k / half), i = (int)(k % half);
        double ang = t * inv_freq[i];
        cos_t[k] = (float)cos(ang);
        sin_t[k] = (float)sin(ang);
    }
}

// One pair rotated: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s). Both kernels below call it, each
// operation an _rn one (nvcc may not fuse a multiply-add one way in one kernel and another way
// in the other), so they give the same bits.
__device__ static inline void rope_rot(float x1, float x2, float c, float s, float *y1, float *y2)
{
    *y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    *y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// One thread per pair (i, i + hd/2) of one head of one token: it reads both and writes both, so
// no two threads touch the same element. Pair p = row * half + i with row = (b*T + t)*H + h.
// sign -1 applies the transposed (inverse) rotation.
static __global__ void rope_kernel(uint16_t *x, const float *cos_t, const float *sin_t,
                                   size_t pairs, int T, int H, int half, float sign)
{
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pairs;
         p += (size_t)gridDim.x * blockDim.x) {
        size_t row = p / half;
        int i = (int)(p % half);
        int t = (int)((row / H) % T);
        uint16_t *v = x + row * (size_t)(2 * half) + i;
        float y1, y2;
        rope_rot(nn_bf16_to_f32(v[0]), nn_bf16_to_f32(v[half]), cos_t[(size_t)t * half + i],
                 sign * sin_t[(size_t)t * half + i], &y1, &y2);
        v[0] = nn_f32_to_bf16(y1);
        v[half] = nn_f32_to_bf16(y2);
    }
}

// Eight pairs a thread (half % 8 == 0, x and the tables 16-byte aligned): i .. i + 7 and their
// partners, two 16-byte accesses each way and the tables' rows in 16-byte pieces. Group
// p = row * (half / 8) + i / 8.
static __global__ void rope8_kernel(uint16_t *x, const float *cos_t, const float *sin_t, size_t groups,
                                    int T, int H, int half, float sign)
{
    int h8 = half / 8;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < groups;
         p += (size_t)gridDim.x * blockDim.x) {
        size_t row = p / h8;
        int i = (int)(p % h8) * 8;
        int t = (int)((row / H) % T);
        uint16_t *v = x + row * (size_t)(2 * half) + i;
        const float *cr = cos_t + (size_t)t * half + i, *sr = sin_t + (size_t)t * half + i;
        NN_ALIGNED(cr, 16), NN_ALIGNED(sr, 16);
        float4 c0 = *(const float4 *)cr, c1 = *(const float4 *)(cr + 4), s0 = *(const float4 *)sr,
               s1 = *(const float4 *)(sr + 4);
        float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w},
              s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
        float x1[8], x2[8], y1[8], y2[8];
        nn_load8(x1, v);
        nn_load8(x2, v + half);
#pragma unroll
        for (int k = 0; k < 8; k++)
            rope_rot(x1[k], x2[k], c[k], sign * s[k], &y1[k], &y2[k]);
        nn_store8(v, y1);
        nn_store8(v + half, y2);
    }
}

extern "C" int cuda_rope_table(float *cos_t, float *sin_t, int T, int hd, double theta, void *stream)
{
    if (!cos_t || !sin_t || T < 0 || hd <= 0 || hd % 2 || !(theta > 0.0))
        return cuda_nn_fail("cuda_rope_table: bad arguments (T %d, hd %d (must be even), theta %g; "
                            "cos and sin must be device pointers)", T, hd, theta);
    size_t n = (size_t)T * (hd / 2);
    if (n == 0)
        return 0;
    rope_table_kernel<<<nn_grid_for(n, ROPE_THREADS), ROPE_THREADS, 0, (cudaStream_t)stream>>>(
        cos_t, sin_t, n, hd / 2, hd, theta);
    return cuda_nn_check(cudaGetLastError(), "cuda_rope_table launch");
}

extern "C" int cuda_rope_table_freq(float *cos_t, float *sin_t, int T, int hd, const double *inv_freq,
                                    void *stream)
{
    if (!cos_t || !sin_t || !inv_freq || T < 0 || hd <= 0 || hd % 2)
        return cuda_nn_fail("cuda_rope_table_freq: bad arguments (T %d, hd %d (must be even); cos, sin "
                            "and inv_freq must be device pointers)", T, hd);
    size_t n = (size_t)T * (hd / 2);
    if (n == 0)
        return 0;
    rope_table_freq_kernel<<<nn_grid_for(n, ROPE_THREADS), ROPE_THREADS, 0, (cudaStream_t)stream>>>(
        cos_t, sin_t, n, hd / 2, inv_freq);
    return cuda_nn_check(cudaGetLastError(), "cuda_rope_table_freq launch");
}

static int rope_run(const char *who, uint16_t *x, const float *cos_t, const float *sin_t, int B, int T,
                    int H, int hd, float sign, void *stream)
{
    if (!x || !cos_t || !sin_t || B < 0 || T < 0 || H < 0 || hd <= 0 || hd % 2)
        return cuda_nn_fail("%s: bad arguments (B %d, T %d, H %d, hd %d (must be even); x, cos, sin "
                            "must be device pointers)", who, B, T, H, hd);
    size_t pairs = (size_t)B * T * H * (hd / 2);
    if (pairs == 0)
        return 0;
    int half = hd / 2;
    if (half % 8 == 0 && nn_aligned16(x) && nn_aligned16(cos_t) && nn_aligned16(sin_t))
        rope8_kernel<<<nn_grid_for(pairs / 8, ROPE_THREADS), ROPE_THREADS, 0, (cudaStream_t)stream>>>(
            x, cos_t, sin_t, pairs / 8, T, H, half, sign);
    else
        rope_kernel<<<nn_grid_for(pairs, ROPE_THREADS), ROPE_THREADS, 0, (cudaStream_t)stream>>>(
            x, cos_t, sin_t, pairs, T, H, half, sign);
    return cuda_nn_check(cudaGetLastError(), who);
}

extern "C" int cuda_rope_fwd(uint16_t *x, const float *cos_t, const float *sin_t, int B, int T, int H,
                             int hd, void *stream)
{
    return rope_run("cuda_rope_fwd", x, cos_t, sin_t, B, T, H, hd, 1.0f, stream);
}

extern "C" int cuda_rope_bwd(uint16_t *dx, const float *cos_t, const float *sin_t, int B, int T,
                             int H, int hd, void *stream)
{
    return rope_run("cuda_rope_bwd", dx, cos_t, sin_t, B, T, H, hd, -1.0f, stream);
}
