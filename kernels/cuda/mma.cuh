// The tensor-core building blocks of the attention kernels (kernels/cuda/attn.cu): one warp-wide
// m16n8k16 bf16 product with fp32 accumulators (mma.sync), the ldmatrix loads that fill its
// fragments from shared memory, and cp.async copies from global to shared memory.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4 * g + t:
//   A (16x16, row): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   B (16x8, col):  b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g)
//   C, D (16x8):    c[0], c[1] = (g, 2t), (g, 2t+1); c[2], c[3] = (g+8, 2t), (g+8, 2t+1)
// where a register holds two bf16, the lower index in the lower half. ldmatrix: lanes 8i..8i+7
// give the row addresses (16 bytes each, 16-byte aligned) of 8x8 matrix i; each lane receives
// register i = row lane/4, elements 2(lane%4), +1 of matrix i; .trans receives the transpose,
// rows 2(lane%4), +1 of column lane/4.
//
// Under the CPU emulator (tests/cudasim/sim.h, CTITAN_CUDASIM) the same functions are emulated
// there from these layouts; the PTX below is the GPU's.
#pragma once

#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>

#ifndef CTITAN_CUDASIM

// d = a b + c for the warp's 16x8 tile of D. d may be c.
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2],
                                          const float c[4])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
                   "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

// row: this lane's row address in shared memory (see above for which matrix it belongs to).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

// Two matrices: the addresses of lanes 0..15 count (the others' must still be valid).
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(row)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(row)));
}

// 16 bytes from global to shared memory without passing through registers; zeros instead when
// !valid (src is then not read but must be a valid address). Completes at cp_async_wait_all.
__device__ __forceinline__ void cp_async_16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }

// Waits for this thread's copies; a __syncthreads() after it makes every thread's visible.
__device__ __forceinline__ void cp_async_wait_all(void)
{
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

#endif

// Two floats as bf16x2 (round to nearest even), lo in the lower half: an A fragment register.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    __nv_bfloat16 l = __float2bfloat16(lo), h = __float2bfloat16(hi);
    uint16_t ul, uh;
    memcpy(&ul, &l, 2);
    memcpy(&uh, &h, 2);
    return (uint32_t)ul | (uint32_t)uh << 16;
}
