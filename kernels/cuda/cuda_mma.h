/* C declaration of the self-check of kernels/cuda/mma.cuh's tensor-core wrappers
 * (kernels/cuda/mma_check.cu): one warp multiplies small bf16 matrices through ldmatrix and
 * mma.sync, so tests/gpu/test_cuda_mma.c can compare with a plain product. */
#ifndef CTITAN_CUDA_MMA_H
#define CTITAN_CUDA_MMA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which loads the check goes through. Device pointers, bf16 as uint16_t, all row-major:
 *   CUDA_MMA_PLAIN: a = A [16,16], b = B^T [8,16], c = C [16,8]: d = A B + C
 *                   (ldmatrix_x4 for A, ldmatrix_x2 for B)
 *   CUDA_MMA_TRANS: a = A^T [16,16], b = B [16,8], c = C [16,8]: d = A B + C
 *                   (ldmatrix_x4_trans for A, ldmatrix_x2_trans for B)
 *   CUDA_MMA_CHAIN: a = A [16,16], b = B^T [16,16], e = E [16,8], c unused:
 *                   d = bf16(A B) E, the 16x16 product's accumulators packed into the A
 *                   fragment of the second (ldmatrix_x4 for B's two halves, ldmatrix_x2_trans
 *                   for E), as the attention kernels reuse P.
 * d is [16,8] fp32. e may be NULL unless CUDA_MMA_CHAIN. Returns 0 or a negative errno
 * (cuda_last_error() says why). */
enum { CUDA_MMA_PLAIN = 0, CUDA_MMA_TRANS = 1, CUDA_MMA_CHAIN = 2 };
int cuda_mma_check(float *d, const uint16_t *a, const uint16_t *b, const uint16_t *e,
                   const float *c, int mode);

#ifdef __cplusplus
}
#endif

#endif
