// The self-check of the tensor-core wrappers (kernels/cuda/mma.cuh) that the attention kernels
// are built from: one warp, 16x16 and 16x8 bf16 matrices through ldmatrix and mma_16816, for
// tests/gpu/test_cuda_mma.c to compare with plain products (on a GPU this is what shows a
// misread fragment layout; on the emulator, that the emulation agrees with the product).
#include <errno.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_mma.h"
#include "kernels/cuda/mma.cuh"

typedef __nv_bfloat16 bf16;

#define LD 24 // bf16 pitch of the shared copies: 48-byte rows, 16-byte aligned

// rows x cols of src (row-major, dense) into dst with pitch LD.
__device__ void copy_in(bf16 *dst, const bf16 *src, int rows, int cols)
{
    for (int i = threadIdx.x; i < rows * cols; i += 32)
        dst[(i / cols) * LD + i % cols] = src[i];
}

__global__ void mma_check_kernel(float *d, const bf16 *a, const bf16 *b, const bf16 *e,
                                 const float *c, int mode)
{
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sA = (bf16 *)smem, *sB = sA + 16 * LD, *sE = sB + 16 * LD;
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    copy_in(sA, a, 16, 16);
    copy_in(sB, b, mode == CUDA_MMA_TRANS ? 16 : mode == CUDA_MMA_PLAIN ? 8 : 16,
            mode == CUDA_MMA_TRANS ? 8 : 16);
    if (mode == CUDA_MMA_CHAIN)
        copy_in(sE, e, 16, 8);
    __syncthreads();

    float acc[4] = {0, 0, 0, 0};
    uint32_t af[4], bf[2];
    if (mode != CUDA_MMA_CHAIN)
        for (int i = 0; i < 4; i++)
            acc[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    if (mode == CUDA_MMA_PLAIN) {
        // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
        ldmatrix_x4(af, sA + (l % 16) * LD + (l / 16) * 8);
        // B^T rows are n: matrices (n 0-7, k 0-7), (n 0-7, k 8-15); lanes 16-31 repeat 0-15
        ldmatrix_x2(bf, sB + (l % 8) * LD + ((l / 8) % 2) * 8);
        mma_16816(acc, af, bf, acc);
    } else if (mode == CUDA_MMA_TRANS) {
        // A^T rows are k: matrix i is the transpose of (k (i/2)*8.., m (i%2)*8..)
        ldmatrix_x4_trans(af, sA + ((l / 16) * 8 + l % 8) * LD + ((l / 8) % 2) * 8);
        // B rows are k: matrices (k 0-7), (k 8-15)
        ldmatrix_x2_trans(bf, sB + (l % 16) * LD);
        mma_16816(acc, af, bf, acc);
    } else {
        // X = A B, 16x16 as two n-blocks; B^T's four matrices (n 0-7, k 0-7), (n 0-7, k 8-15),
        // (n 8-15, k 0-7), (n 8-15, k 8-15)
        uint32_t bq[4];
        float x[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
        ldmatrix_x4(af, sA + (l % 16) * LD + (l / 16) * 8);
        ldmatrix_x4(bq, sB + ((l / 16) * 8 + l % 8) * LD + ((l / 8) % 2) * 8);
        mma_16816(x[0], af, bq, x[0]);
        mma_16816(x[1], af, bq + 2, x[1]);
        // X's accumulators are its A fragment: n-block 0 holds k 0-7, n-block 1 k 8-15.
        uint32_t xa[4] = {pack_bf16x2(x[0][0], x[0][1]), pack_bf16x2(x[0][2], x[0][3]),
                          pack_bf16x2(x[1][0], x[1][1]), pack_bf16x2(x[1][2], x[1][3])};
        ldmatrix_x2_trans(bf, sE + (l % 16) * LD);
        mma_16816(acc, xa, bf, acc);
    }
    for (int i = 0; i < 4; i++)
        d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = acc[i];
}

extern "C" int cuda_mma_check(float *d, const uint16_t *a, const uint16_t *b, const uint16_t *e,
                              const float *c, int mode)
{
    if (mode < CUDA_MMA_PLAIN || mode > CUDA_MMA_CHAIN)
        return cuda_err(-EINVAL, "cuda_mma_check: mode %d (0, 1 or 2)", mode);
    if (!d || !a || !b || (mode == CUDA_MMA_CHAIN ? !e : !c))
        return cuda_err(-EINVAL, "cuda_mma_check: NULL pointer");
    mma_check_kernel<<<1, 32, 3 * 16 * LD * sizeof(bf16), (cudaStream_t)0>>>(d, (const bf16 *)a, (const bf16 *)b,
                                                           (const bf16 *)e, c, mode);
    int rc = cuda_err_status(cudaGetLastError(), "cuda_mma_check launch");
    if (rc < 0)
        return rc;
    return cuda_err_status(cudaDeviceSynchronize(), "cuda_mma_check");
}
