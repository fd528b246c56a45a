// Fused causal grouped-query attention in bf16, FlashAttention-2 style: forward and backward
// on tensor cores (mma.sync m16n8k16, kernels/cuda/mma.cuh) with fp32 register accumulators and
// the fp32 online softmax in registers. Checked against ref_attn_fwd / ref_attn_bwd by
// tests/gpu/test_cuda_attn.c (on a GPU and, through tests/cudasim, on the CPU emulator).
//
// Every block has NWARPS warps and each warp owns 16 rows of its block's tile, so a row's
// scores, probabilities and accumulators stay in one warp's registers: a lane holds rows g and
// g+8 (g = lane/4) of each 8-column block, columns 2(lane%4) and +1 (the mma C layout), and a
// row's max and sum are reduced over its quad with two shuffles. A product's accumulators are
// also the A fragment of the next product once packed to bf16 (P V, dS K, P^T dO, dS^T Q), so
// P and dS never go through shared memory. Shared memory holds only the bf16 input tiles, filled
// with cp.async while the previous tile is being used (two buffers), and read with ldmatrix.
//
// Forward: per query tile, over the key tiles up to the diagonal (the causal mask is applied on
// the diagonal tile only; later tiles are never visited); the query tile's A fragments stay in
// registers. Backward, as FlashAttention-2: delta = rowsum(dO * O); dK and dV per key tile over
// the query tiles at or after it, computing S^T = K Q^T and dP^T = V dO^T so that a warp owns
// key rows; dQ per query tile over the key tiles, recomputing S and dP. Fixed orders, no
// atomics: the bits do not depend on scheduling.
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_attn.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/mma.cuh"

typedef __nv_bfloat16 bf16;

#define NWARPS 4
#define NTHREADS (NWARPS * 32)
#define BR 64 // query rows per forward and dQ block: 16 per warp
#define BC 64 // keys per tile of the forward and dQ loops; keys per dK/dV block (16 per warp)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Query rows per step of the dK/dV loop: its S^T and dP^T are 16 x BQ per warp, next to dK and
// dV (16 x HD each) in registers, so fewer columns for the widest heads.
template <int HD> struct DkdvCols { static constexpr int BQ = HD == 128 ? 32 : 64; };

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles: bf16 rows of HD padded by 8 elements (16 bytes), so the eight 16-byte
// rows an ldmatrix phase reads fall in different banks and every row stays 16-byte aligned.

template <int HD> struct Smem {
    static constexpr int LDH = HD + 8;
    static constexpr size_t tile(int rows) { return (size_t)rows * LDH * sizeof(bf16); }
    static constexpr int BQ = DkdvCols<HD>::BQ;
    // forward: Q, two buffers of K and V
    static constexpr size_t fwd = tile(BR) + 4 * tile(BC);
    // dQ: Q, dO, two buffers of K and V
    static constexpr size_t dq = 2 * tile(BR) + 4 * tile(BC);
    // dK/dV: K, V, two buffers of Q and dO, two of the rows' lse (log2) and delta
    static constexpr size_t dkdv = 2 * tile(BC) + 4 * tile(BQ) + 4 * (size_t)BQ * sizeof(float);
};

// ---------------------------------------------------------------------------------------------
// Building blocks

__device__ __forceinline__ float warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Over the four lanes of a quad, which hold the same two rows.
__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Starts copying rows t0 .. t0+ROWS-1 of head h of a [B,T,nheads,HD] bf16 tensor into dst
// [ROWS][LD]; rows at or past T become zeros (finite values for the masked lanes).
template <int HD, int ROWS, int LD>
__device__ __forceinline__ void load_rows_async(bf16 *dst, const bf16 *src, int b, int t0, int h,
                                                int T, int nheads)
{
    constexpr int CH = HD / 8;
    for (int idx = threadIdx.x; idx < ROWS * CH; idx += NTHREADS) {
        const int r = idx / CH, c = idx % CH, t = t0 + r;
        const bf16 *s = t < T ? src + (((size_t)b * T + t) * nheads + h) * HD + c * 8 : src;
        cp_async_16(dst + r * LD + c * 8, s, t < T);
    }
}

// The inverse for a finished bf16 tile in shared memory: rows past T are not written.
template <int HD, int ROWS, int LD>
__device__ __forceinline__ void store_rows(bf16 *dst, const bf16 *src, int b, int t0, int h,
                                           int T, int nheads)
{
    constexpr int CH = HD / 8;
    for (int idx = threadIdx.x; idx < ROWS * CH; idx += NTHREADS) {
        const int r = idx / CH, c = idx % CH, t = t0 + r;
        if (t < T)
            *(uint4 *)(dst + (((size_t)b * T + t) * nheads + h) * HD + c * 8) =
                *(const uint4 *)(src + r * LD + c * 8);
    }
}

// The A fragment of rows r0..r0+15, columns k0..k0+15 of a row-major tile.
template <int LD>
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16 *tile, int r0, int k0)
{
    const int l = threadIdx.x % 32;
    ldmatrix_x4(a, tile + (r0 + l % 16) * LD + k0 + (l / 16) * 8);
}

// B fragments of the column blocks n0..n0+7 (b[0], b[1]) and n0+8..n0+15 (b[2], b[3]) for
// k0..k0+15, from a tile whose rows are n (B^T row-major: K for Q K^T, Q for K Q^T).
template <int LD>
__device__ __forceinline__ void load_b_rows_n(uint32_t b[4], const bf16 *tile, int n0, int k0)
{
    const int l = threadIdx.x % 32;
    ldmatrix_x4(b, tile + (n0 + (l / 16) * 8 + l % 8) * LD + k0 + ((l / 8) % 2) * 8);
}

// The same from a tile whose rows are k (B row-major: V for P V, K for dS K, dO and Q for the
// dK/dV products), transposed by ldmatrix.
template <int LD>
__device__ __forceinline__ void load_b_rows_k(uint32_t b[4], const bf16 *tile, int k0, int n0)
{
    const int l = threadIdx.x % 32;
    ldmatrix_x4_trans(b, tile + (k0 + l % 8 + ((l / 8) % 2) * 8) * LD + n0 + (l / 16) * 8);
}

// acc[N/8] (a 16 x N accumulator) += A (16 x 16 k-block, in registers) times the tile's rows
// k0..k0+15, columns 0..N-1 (rows are k).
template <int N, int LD>
__device__ __forceinline__ void mma_rows_k(float (*acc)[4], const uint32_t a[4], const bf16 *tile,
                                           int k0)
{
#pragma unroll
    for (int nb = 0; nb < N / 16; nb++) {
        uint32_t b[4];
        load_b_rows_k<LD>(b, tile, k0, nb * 16);
        mma_16816(acc[2 * nb], a, b, acc[2 * nb]);
        mma_16816(acc[2 * nb + 1], a, b + 2, acc[2 * nb + 1]);
    }
}

// 16 columns of a 16 x N accumulator (blocks 2kk, 2kk+1) as the bf16 A fragment of a k-block.
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float (*acc)[4], int kk)
{
    a[0] = pack_bf16x2(acc[2 * kk][0], acc[2 * kk][1]);
    a[1] = pack_bf16x2(acc[2 * kk][2], acc[2 * kk][3]);
    a[2] = pack_bf16x2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[3] = pack_bf16x2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// A warp's 16 x HD accumulator, times a factor per row (f[0]: row g, f[1]: row g+8), as bf16
// into rows r0.. of a shared-memory tile.
template <int HD, int LD>
__device__ __forceinline__ void acc_to_smem(bf16 *tile, int r0, const float (*acc)[4],
                                            const float f[2])
{
    const int l = threadIdx.x % 32, g = l / 4, t = l % 4;
#pragma unroll
    for (int nb = 0; nb < HD / 8; nb++) {
        bf16 *p = tile + (r0 + g) * LD + nb * 8 + 2 * t;
        *(uint32_t *)p = pack_bf16x2(acc[nb][0] * f[0], acc[nb][1] * f[0]);
        *(uint32_t *)(p + 8 * LD) = pack_bf16x2(acc[nb][2] * f[1], acc[nb][3] * f[1]);
    }
}

// ---------------------------------------------------------------------------------------------
// Forward: one block per (query tile, head, batch); S = Q K^T, online softmax per row in the
// log2 domain (scores times scale*log2(e)), O = alpha O + P V.

template <int HD>
__global__ void __launch_bounds__(NTHREADS)
    attn_fwd_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T,
                    int H, int Hkv, float scale_log2)
{
    using S = Smem<HD>;
    constexpr int LD = S::LDH;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem, *sK = sQ + BR * LD, *sV = sK + 2 * BC * LD;

    const int nq = (T + BR - 1) / BR;
    const int qt = nq - 1 - (int)blockIdx.x; // the longest rows start first
    const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv), q0 = qt * BR;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row0 = q0 + warp * 16 + g; // this lane's rows: row0 and row0 + 8

    load_rows_async<HD, BR, LD>(sQ, q, b, q0, h, T, H);
    load_rows_async<HD, BC, LD>(sK, k, b, 0, hk, T, Hkv);
    load_rows_async<HD, BC, LD>(sV, v, b, 0, hk, T, Hkv);
    cp_async_commit();

    uint32_t qf[HD / 16][4];
    float o[HD / 8][4];
#pragma unroll
    for (int nb = 0; nb < HD / 8; nb++)
        o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; // running max (log2), partial sum

    const int nkt = qt + 1; // BR == BC: key tiles 0 .. qt, the last one the diagonal
    for (int kt = 0; kt < nkt; kt++) {
        cp_async_wait_all();
        __syncthreads(); // tile kt is in; every warp is done with the buffer the next fills
        if (kt == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                load_a<LD>(qf[kk], sQ, warp * 16, kk * 16);
        }
        if (kt + 1 < nkt) {
            const int nxt = (kt + 1) % 2;
            load_rows_async<HD, BC, LD>(sK + nxt * BC * LD, k, b, (kt + 1) * BC, hk, T, Hkv);
            load_rows_async<HD, BC, LD>(sV + nxt * BC * LD, v, b, (kt + 1) * BC, hk, T, Hkv);
        }
        cp_async_commit();
        const bf16 *cK = sK + (kt % 2) * BC * LD, *cV = sV + (kt % 2) * BC * LD;
        const int k0 = kt * BC;

        float s[BC / 8][4];
#pragma unroll
        for (int nb = 0; nb < BC / 8; nb++)
            s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int nb = 0; nb < BC / 16; nb++) {
                uint32_t bk[4];
                load_b_rows_n<LD>(bk, cK, nb * 16, kk * 16);
                mma_16816(s[2 * nb], qf[kk], bk, s[2 * nb]);
                mma_16816(s[2 * nb + 1], qf[kk], bk + 2, s[2 * nb + 1]);
            }

        // Every row sees key k0 of every tile it visits (the diagonal tile starts at its first
        // row), so the maxima are finite and no row needs a guard against -inf - -inf.
        const bool diag = kt == qt;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < BC / 8; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float x = s[nb][i] * scale_log2;
                if (diag && k0 + nb * 8 + 2 * t + (i & 1) > row0 + 8 * (i >> 1))
                    x = -INFINITY;
                s[nb][i] = x;
                mx[i >> 1] = fmaxf(mx[i >> 1], x);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float m_new = fmaxf(m[r], quad_max(mx[r]));
            alpha[r] = exp2f(m[r] - m_new); // 0 on the first tile
            m[r] = m_new;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int nb = 0; nb < BC / 8; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float p = exp2f(s[nb][i] - m[i >> 1]); // masked: exp2(-inf) = 0
                s[nb][i] = p;
                l[i >> 1] += p;
            }
#pragma unroll
        for (int nb = 0; nb < HD / 8; nb++) {
            o[nb][0] *= alpha[0], o[nb][1] *= alpha[0];
            o[nb][2] *= alpha[1], o[nb][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t pa[4];
            acc_to_a(pa, s, kk);
            mma_rows_k<HD, LD>(o, pa, cV, kk * 16);
        }
    }

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float sum = quad_sum(l[r]);
        const int i = row0 + 8 * r;
        if (t == 0 && i < T)
            lse[((size_t)b * H + h) * T + i] = (m[r] + log2f(sum)) * LN2;
        inv[r] = 1.0f / sum; // > 0: every row sees key 0
    }
    // A warp's rows of sQ were read by it alone (into qf), so it can reuse them for its output
    // (__syncwarp: its ldmatrix reads come first, whatever the compiler would reorder).
    __syncwarp();
    acc_to_smem<HD, LD>(sQ, warp * 16, o, inv);
    __syncthreads();
    store_rows<HD, BR, LD>(out, sQ, b, q0, h, T, H);
}

// ---------------------------------------------------------------------------------------------
// Backward. Both kernels recompute P = exp2(S scale log2(e) - lse log2(e)) and
// dS = P (dP - delta) scale with dP = dO V^T; masked entries are exactly zero.

// One warp per (b, t, h) row of dout/out; delta is [B,H,T].
__global__ void __launch_bounds__(NTHREADS)
    attn_delta_kernel(float *delta, const bf16 *dout, const bf16 *out, size_t rows, int T, int H,
                      int hd)
{
    const int lane = threadIdx.x % 32;
    for (size_t w = (size_t)blockIdx.x * NWARPS + threadIdx.x / 32; w < rows;
         w += (size_t)gridDim.x * NWARPS) {
        float acc = 0.0f;
        for (int d = lane; d < hd; d += 32)
            acc += __bfloat162float(dout[w * hd + d]) * __bfloat162float(out[w * hd + d]);
        acc = warp_sum(acc);
        if (lane == 0) {
            const size_t b = w / ((size_t)T * H), t = (w / H) % T, h = w % H;
            delta[(b * H + h) * T + t] = acc;
        }
    }
}

// dQ = sum over key tiles of dS K; one block per (query tile, head, batch).
template <int HD>
__global__ void __launch_bounds__(NTHREADS)
    attn_bwd_dq_kernel(bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                       const float *lse, const float *delta, int T, int H, int Hkv, float scale,
                       float scale_log2)
{
    using S = Smem<HD>;
    constexpr int LD = S::LDH;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem, *sdO = sQ + BR * LD, *sK = sdO + BR * LD, *sV = sK + 2 * BC * LD;

    const int nq = (T + BR - 1) / BR;
    const int qt = nq - 1 - (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv), q0 = qt * BR;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row0 = q0 + warp * 16 + g;

    load_rows_async<HD, BR, LD>(sQ, q, b, q0, h, T, H);
    load_rows_async<HD, BR, LD>(sdO, dout, b, q0, h, T, H);
    load_rows_async<HD, BC, LD>(sK, k, b, 0, hk, T, Hkv);
    load_rows_async<HD, BC, LD>(sV, v, b, 0, hk, T, Hkv);
    cp_async_commit();

    float lse2[2], dlt[2]; // rows row0, row0 + 8; zeros past T (those rows are not stored)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row0 + 8 * r;
        const size_t at = ((size_t)b * H + h) * T + i;
        lse2[r] = i < T ? lse[at] * LOG2E : 0.0f;
        dlt[r] = i < T ? delta[at] : 0.0f;
    }
    float acc[HD / 8][4];
#pragma unroll
    for (int nb = 0; nb < HD / 8; nb++)
        acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;

    const int nkt = qt + 1;
    for (int kt = 0; kt < nkt; kt++) {
        cp_async_wait_all();
        __syncthreads();
        if (kt + 1 < nkt) {
            const int nxt = (kt + 1) % 2;
            load_rows_async<HD, BC, LD>(sK + nxt * BC * LD, k, b, (kt + 1) * BC, hk, T, Hkv);
            load_rows_async<HD, BC, LD>(sV + nxt * BC * LD, v, b, (kt + 1) * BC, hk, T, Hkv);
        }
        cp_async_commit();
        const bf16 *cK = sK + (kt % 2) * BC * LD, *cV = sV + (kt % 2) * BC * LD;
        const int k0 = kt * BC;

        float s[BC / 8][4], dp[BC / 8][4];
#pragma unroll
        for (int nb = 0; nb < BC / 8; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                s[nb][i] = dp[nb][i] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t qa[4], da[4];
            load_a<LD>(qa, sQ, warp * 16, kk * 16);
            load_a<LD>(da, sdO, warp * 16, kk * 16);
#pragma unroll
            for (int nb = 0; nb < BC / 16; nb++) {
                uint32_t bk[4], bv[4];
                load_b_rows_n<LD>(bk, cK, nb * 16, kk * 16);
                load_b_rows_n<LD>(bv, cV, nb * 16, kk * 16);
                mma_16816(s[2 * nb], qa, bk, s[2 * nb]);
                mma_16816(s[2 * nb + 1], qa, bk + 2, s[2 * nb + 1]);
                mma_16816(dp[2 * nb], da, bv, dp[2 * nb]);
                mma_16816(dp[2 * nb + 1], da, bv + 2, dp[2 * nb + 1]);
            }
        }
        const bool diag = kt == qt;
#pragma unroll
        for (int nb = 0; nb < BC / 8; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1;
                float ds = 0.0f;
                if (!diag || k0 + nb * 8 + 2 * t + (i & 1) <= row0 + 8 * r) {
                    const float p = exp2f(s[nb][i] * scale_log2 - lse2[r]);
                    ds = p * (dp[nb][i] - dlt[r]) * scale;
                }
                s[nb][i] = ds;
            }
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t dsa[4];
            acc_to_a(dsa, s, kk);
            mma_rows_k<HD, LD>(acc, dsa, cK, kk * 16);
        }
    }
    // As in the forward: a warp's rows of sQ are its own.
    const float one[2] = {1.0f, 1.0f};
    __syncwarp();
    acc_to_smem<HD, LD>(sQ, warp * 16, acc, one);
    __syncthreads();
    store_rows<HD, BR, LD>(dq, sQ, b, q0, h, T, H);
}

// dV = sum P^T dO, dK = sum dS^T Q over the group's query heads (in order) and the query tiles
// at or after the key tile (in order); one block per (key tile, kv head, batch). A warp owns 16
// keys: S^T = K Q^T and dP^T = V dO^T put a key's row in its registers.
template <int HD>
__global__ void __launch_bounds__(NTHREADS)
    attn_bwd_dkdv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k,
                         const bf16 *v, const float *lse, const float *delta, int T, int H,
                         int Hkv, float scale, float scale_log2)
{
    using S = Smem<HD>;
    constexpr int LD = S::LDH, BQ = S::BQ;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sK = (bf16 *)smem, *sV = sK + BC * LD, *sQ = sV + BC * LD, *sdO = sQ + 2 * BQ * LD;
    float *sL = (float *)(sdO + 2 * BQ * LD), *sD = sL + 2 * BQ; // [2][BQ] each

    const int kt = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, group = H / Hkv, k0 = kt * BC;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int key0 = k0 + warp * 16 + g; // this lane's keys: key0 and key0 + 8
    // Query tiles before k0 / BQ see none of these keys; the steps run over (head, query tile).
    const int qt0 = k0 / BQ, nqt = (T + BQ - 1) / BQ - qt0, steps = group * nqt;

    // Step n's Q, dO, lse (log2) and delta rows into buffer n % 2.
    auto load_step = [&](int n) {
        const int h = hk * group + n / nqt, q0 = (qt0 + n % nqt) * BQ, buf = n % 2;
        load_rows_async<HD, BQ, LD>(sQ + buf * BQ * LD, q, b, q0, h, T, H);
        load_rows_async<HD, BQ, LD>(sdO + buf * BQ * LD, dout, b, q0, h, T, H);
        for (int r = threadIdx.x; r < BQ; r += NTHREADS) {
            const int i = q0 + r;
            const size_t at = ((size_t)b * H + h) * T + i;
            sL[buf * BQ + r] = i < T ? lse[at] * LOG2E : 0.0f;
            sD[buf * BQ + r] = i < T ? delta[at] : 0.0f;
        }
    };
    load_rows_async<HD, BC, LD>(sK, k, b, k0, hk, T, Hkv);
    load_rows_async<HD, BC, LD>(sV, v, b, k0, hk, T, Hkv);
    load_step(0);
    cp_async_commit();

    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int nb = 0; nb < HD / 8; nb++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            dka[nb][i] = dva[nb][i] = 0.0f;

    for (int n = 0; n < steps; n++) {
        cp_async_wait_all();
        __syncthreads();
        if (n + 1 < steps)
            load_step(n + 1);
        cp_async_commit();
        const int q0 = (qt0 + n % nqt) * BQ, buf = n % 2;
        const bf16 *cQ = sQ + buf * BQ * LD, *cdO = sdO + buf * BQ * LD;
        const float *cL = sL + buf * BQ, *cD = sD + buf * BQ;

        float s[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
        for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                s[nb][i] = dp[nb][i] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t ka[4], va[4];
            load_a<LD>(ka, sK, warp * 16, kk * 16);
            load_a<LD>(va, sV, warp * 16, kk * 16);
#pragma unroll
            for (int nb = 0; nb < BQ / 16; nb++) {
                uint32_t bq[4], bo[4];
                load_b_rows_n<LD>(bq, cQ, nb * 16, kk * 16);
                load_b_rows_n<LD>(bo, cdO, nb * 16, kk * 16);
                mma_16816(s[2 * nb], ka, bq, s[2 * nb]);
                mma_16816(s[2 * nb + 1], ka, bq + 2, s[2 * nb + 1]);
                mma_16816(dp[2 * nb], va, bo, dp[2 * nb]);
                mma_16816(dp[2 * nb + 1], va, bo + 2, dp[2 * nb + 1]);
            }
        }
        // Masks where a query precedes a key (tiles reaching back over the key tile) or is past
        // T; elsewhere every entry counts.
        const bool edge = q0 < k0 + BC - 1 || q0 + BQ > T;
#pragma unroll
        for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int c = nb * 8 + 2 * t + (i & 1), i_q = q0 + c;
                float p = 0.0f, ds = 0.0f;
                if (!edge || (i_q >= key0 + 8 * (i >> 1) && i_q < T)) {
                    p = exp2f(s[nb][i] * scale_log2 - cL[c]);
                    ds = p * (dp[nb][i] - cD[c]) * scale;
                }
                s[nb][i] = p;
                dp[nb][i] = ds;
            }
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t pa[4], dsa[4];
            acc_to_a(pa, s, kk);
            acc_to_a(dsa, dp, kk);
            mma_rows_k<HD, LD>(dva, pa, cdO, kk * 16);
            mma_rows_k<HD, LD>(dka, dsa, cQ, kk * 16);
        }
    }
    // A warp's rows of sK and sV were read by it alone.
    const float one[2] = {1.0f, 1.0f};
    __syncwarp();
    acc_to_smem<HD, LD>(sK, warp * 16, dka, one);
    acc_to_smem<HD, LD>(sV, warp * 16, dva, one);
    __syncthreads();
    store_rows<HD, BC, LD>(dk, sK, b, k0, hk, T, Hkv);
    store_rows<HD, BC, LD>(dv, sV, b, k0, hk, T, Hkv);
}

// ---------------------------------------------------------------------------------------------
// Launchers

extern "C" const char *cuda_attn_last_error(void) { return cuda_err_text(); }


static bool aligned16(const void *p) { return p && (uintptr_t)p % 16 == 0; }
static bool aligned4(const void *p) { return p && (uintptr_t)p % 4 == 0; }

// Tiles: BR = BC = 64 for every head size, 4 warps. Shared memory per block for hd 64 / 128:
// forward 45 / 85 KiB, dQ 54 / 102 KiB, dK/dV 55 / 68.5 KiB (dK/dV steps over 64 / 32 query
// rows); registers per thread (nvcc 13, sm_90, no spills): forward 127 / 177, dQ 168 / 168,
// dK/dV 191 / 233. Both limits allow two blocks (8 warps) per SM at hd 128.

static int check_shape(const char *fn, int B, int T, int H, int Hkv, int hd)
{
    if (B <= 0 || T <= 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0)
        return cuda_err(-EINVAL, "%s: bad shape B=%d T=%d H=%d Hkv=%d (all > 0, H %% Hkv == 0)", fn, B,
                    T, H, Hkv);
    if (hd != 16 && hd != 32 && hd != 64 && hd != 128)
        return cuda_err(-EINVAL, "%s: head dim %d not supported (16, 32, 64 or 128)", fn, hd);
    if (H > 65535 || B > 65535)
        return cuda_err(-EINVAL, "%s: B=%d H=%d over the grid limit 65535", fn, B, H);
    return 0;
}

// Checks the dynamic shared memory a kernel asks for against the device and opts in above the
// default 48 KiB.
template <typename F> static int prepare(F kernel, size_t smem, const char *fn)
{
    int dev = 0, optin = 0, rc;
    if ((rc = cuda_err_status(cudaGetDevice(&dev), fn)) < 0)
        return rc;
    if ((rc = cuda_err_status(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                    fn)) < 0)
        return rc;
    if (smem > (size_t)optin)
        return cuda_err(-EINVAL, "%s: needs %zu bytes of shared memory per block, device %d allows %d",
                    fn, smem, dev, optin);
    if (smem > 48 * 1024)
        return cuda_err_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)smem),
                     fn);
    return 0;
}

template <int HD>
static int fwd_launch(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B,
                      int T, int H, int Hkv, cudaStream_t st)
{
    auto kernel = attn_fwd_kernel<HD>;
    const size_t smem = Smem<HD>::fwd;
    int rc = prepare(kernel, smem, "cuda_attn_fwd");
    if (rc < 0)
        return rc;
    dim3 grid((T + BR - 1) / BR, H, B);
    kernel<<<grid, NTHREADS, smem, st>>>(out, lse, q, k, v, T, H, Hkv,
                                         (float)(LOG2E / sqrt((double)HD)));
    return cuda_err_status(cudaGetLastError(), "cuda_attn_fwd launch");
}

extern "C" int cuda_attn_fwd(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                             const uint16_t *v, int B, int T, int H, int Hkv, int hd, void *stream)
{
    int rc = check_shape("cuda_attn_fwd", B, T, H, Hkv, hd);
    if (rc < 0)
        return rc;
    if (!aligned16(out) || !aligned4(lse) || !aligned16(q) || !aligned16(k) || !aligned16(v))
        return cuda_err(-EINVAL, "cuda_attn_fwd: NULL or misaligned pointer (out, q, k, v need 16 "
                             "bytes, lse 4)");
    cudaStream_t st = (cudaStream_t)stream;
    switch (hd) {
#define FWD(D) case D: return fwd_launch<D>((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, B, T, \
                                            H, Hkv, st)
    FWD(16); FWD(32); FWD(64);
    default: FWD(128);
#undef FWD
    }
}

template <int HD>
static int bwd_launch(bf16 *dq, bf16 *dk, bf16 *dv, float *delta, const bf16 *dout,
                      const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                      const float *lse, int B, int T, int H, int Hkv, cudaStream_t st)
{
    using L = Smem<HD>;
    auto dq_kernel = attn_bwd_dq_kernel<HD>;
    auto dkdv_kernel = attn_bwd_dkdv_kernel<HD>;
    int rc;
    if ((rc = prepare(dq_kernel, L::dq, "cuda_attn_bwd")) < 0 ||
        (rc = prepare(dkdv_kernel, L::dkdv, "cuda_attn_bwd")) < 0)
        return rc;
    const float scale = (float)(1.0 / sqrt((double)HD)), scale_log2 = (float)(LOG2E / sqrt((double)HD));

    const size_t rows = (size_t)B * T * H;
    size_t blocks = (rows + NWARPS - 1) / NWARPS;
    if (blocks > 65535 * 16)
        blocks = 65535 * 16;
    attn_delta_kernel<<<(unsigned)blocks, NTHREADS, 0, st>>>(delta, dout, out, rows, T, H, HD);
    if ((rc = cuda_err_status(cudaGetLastError(), "cuda_attn_bwd delta launch")) < 0)
        return rc;

    dim3 qgrid((T + BR - 1) / BR, H, B);
    dq_kernel<<<qgrid, NTHREADS, L::dq, st>>>(dq, dout, q, k, v, lse, delta, T, H, Hkv, scale,
                                               scale_log2);
    if ((rc = cuda_err_status(cudaGetLastError(), "cuda_attn_bwd dq launch")) < 0)
        return rc;

    dim3 kgrid((T + BC - 1) / BC, Hkv, B);
    dkdv_kernel<<<kgrid, NTHREADS, L::dkdv, st>>>(dk, dv, dout, q, k, v, lse, delta, T, H, Hkv,
                                                   scale, scale_log2);
    return cuda_err_status(cudaGetLastError(), "cuda_attn_bwd dk/dv launch");
}

extern "C" int cuda_attn_bwd(uint16_t *dq, uint16_t *dk, uint16_t *dv, float *delta,
                             const uint16_t *dout, const uint16_t *q, const uint16_t *k,
                             const uint16_t *v, const uint16_t *out, const float *lse, int B,
                             int T, int H, int Hkv, int hd, void *stream)
{
    int rc = check_shape("cuda_attn_bwd", B, T, H, Hkv, hd);
    if (rc < 0)
        return rc;
    if (!aligned16(dq) || !aligned16(dk) || !aligned16(dv) || !aligned4(delta) ||
        !aligned16(dout) || !aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out) ||
        !aligned4(lse))
        return cuda_err(-EINVAL, "cuda_attn_bwd: NULL or misaligned pointer (bf16 tensors need 16 "
                             "bytes, delta and lse 4)");
    cudaStream_t st = (cudaStream_t)stream;
    switch (hd) {
#define BWD(D) case D: return bwd_launch<D>((bf16 *)dq, (bf16 *)dk, (bf16 *)dv, delta, (const bf16 *)dout,  \
                                            (const bf16 *)q, (const bf16 *)k, (const bf16 *)v,             \
                                            (const bf16 *)out, lse, B, T, H, Hkv, st)
    BWD(16); BWD(32); BWD(64);
    default: BWD(128);
#undef BWD
    }
}
