// Internal to the bf16 kernels of kernels/cuda/cuda_nn.h: bf16 bit conversions (the same code on
// host and device, so tests round exactly as the kernels do), deterministic block reductions,
// and the error reporting behind cuda_nn_last_error() (defined in nn_common.cu).
#ifndef CTITAN_NN_COMMON_CUH
#define CTITAN_NN_COMMON_CUH

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

__host__ __device__ static inline float nn_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

// Round to nearest even on the bits: add 0x7fff plus the lowest kept bit, keep the top half.
// NaN is kept a quiet NaN (the addition could carry it into inf); overflow rounds to inf.
__host__ __device__ static inline uint16_t nn_f32_to_bf16(float f)
{
#ifdef __CUDA_ARCH__
    uint32_t u = __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
#endif
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// Whether p starts a 16-byte boundary: the eight-at-a-time paths (nn_load8, nn_store8) need it.
static inline int nn_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// A wide access's alignment, checked where the kernels run on the CPU emulator (tests/cudasim:
// x86 takes a misaligned 16-byte load that a GPU faults on); nothing on the device.
#ifndef __CUDA_ARCH__
static inline void nn_misaligned(const char *file, int line, const void *p, int n)
{
    fprintf(stderr, "%s:%d: a %d-byte access at %p, not %d-byte aligned\n", file, line, n, p, n);
    abort();
}
#define NN_ALIGNED(p, n) ((uintptr_t)(p) % (n) ? nn_misaligned(__FILE__, __LINE__, (const void *)(p), (n)) : (void)0)
#else
#define NN_ALIGNED(p, n) ((void)0)
#endif

#ifdef __CUDACC__
// Eight bf16 in one 16-byte load or store (p 16-byte aligned): element k is bits [16 (k % 2),
// 16 (k % 2) + 16) of word k / 2, as memory holds them. The element-wise kernels move their
// rows this way (scalar 2-byte accesses leave most of the memory system's width unused); each
// element's arithmetic is the one-at-a-time path's, so both give the same bits.
__device__ static inline void nn_load8(float *f, const uint16_t *p)
{
    NN_ALIGNED(p, 16);
    uint4 u = *(const uint4 *)p;
    unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        f[2 * k] = nn_bf16_to_f32((uint16_t)(w[k] & 0xffffu));
        f[2 * k + 1] = nn_bf16_to_f32((uint16_t)(w[k] >> 16));
    }
}

__device__ static inline void nn_store8(uint16_t *p, const float *f)
{
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        w[k] = (unsigned)nn_f32_to_bf16(f[2 * k]) | (unsigned)nn_f32_to_bf16(f[2 * k + 1]) << 16;
    NN_ALIGNED(p, 16);
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
}

// Group c of a row of n elements, [8c, 8c + 8): with `vec` (n % 8 == 0, the row 16-byte
// aligned) in one 16-byte access, else one by one with the elements past n read as `past` (what
// adds nothing to the caller's sums). Both ways the same values in the same order.
__device__ static inline void nn_load_group(float *f, const uint16_t *row, int c, int n, int vec, float past)
{
    if (vec) {
        nn_load8(f, row + 8 * c);
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        f[k] = 8 * c + k < n ? nn_bf16_to_f32(row[8 * c + k]) : past;
}

// Butterfly sum over a warp. Every lane ends with the same bits: at each step lanes i and i^o add
// the same two values, and IEEE addition is commutative.
__device__ static inline float nn_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32 (the
// launchers use fixed sizes); sh is __shared__ float[32]. The order of the additions depends
// only on blockDim, so the result is the same bits on every run. May be called repeatedly
// with the same sh.
__device__ static inline float nn_block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = nn_warp_sum(v);
    __syncthreads(); // a previous call may still be reading sh
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return nn_warp_sum(v);
}
#endif

// Records a bad-argument message and returns -EINVAL.
int cuda_nn_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// 0 for cudaSuccess; otherwise records "what: CUDA's message" and returns -ENODEV or -EIO.
int cuda_nn_check(cudaError_t e, const char *what);

// Blocks for a grid-stride loop over n elements with `threads` per block: enough to cover n,
// capped (each thread then loops) so the grid stays within limits for any size_t n.
static inline unsigned nn_grid_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 65535u * 8u ? 65535u * 8u : (b ? b : 1));
}

#endif
