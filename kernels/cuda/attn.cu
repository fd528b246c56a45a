// Fused causal grouped-query attention in bf16 (FlashAttention-2 style): forward and backward
// with fp32 online softmax and fp32 accumulation, tiles in shared memory, tensor cores through
// WMMA. Checked against ref_attn_fwd / ref_attn_bwd by tests/gpu/test_cuda_attn.c.
//
// Every product is one call of mm() below: a shared-memory to shared-memory matrix product
// whose 16x16 output tiles are dealt to the warps, so the softmax, the masks and the
// rescaling are plain per-row loops over shared memory. The running output and gradient
// accumulators live in shared memory in fp32 (a WMMA accumulator's element-to-row mapping is
// unspecified, so per-row rescaling has to go through memory anyway). Simple rather than fast:
// a first version to be tuned once it has been seen to pass on a GPU.
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <type_traits>

#include "kernels/cuda/cuda_attn.h"
#include "kernels/cuda/cuda_err.h"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define NWARPS 8
#define NTHREADS (NWARPS * 32)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// ---------------------------------------------------------------------------------------------
// Shared-memory layouts. Row pitches are padded (bf16 rows by 8 elements, fp32 rows by 4) to
// spread the rows over the banks; WMMA needs pitches that are multiples of 16 bytes and tile
// pointers aligned to 32 bytes, which holds because every tile starts at a multiple of 16 rows
// and 16 columns of a 128-byte-aligned array.

static constexpr size_t align128(size_t x) { return (x + 127) & ~(size_t)127; }

template <int HD, int BR, int BC> struct Layout {
    static_assert(HD % 16 == 0 && BR % 16 == 0 && BC % 32 == 0, "tile shapes");
    static constexpr int LDH = HD + 8; // bf16 rows of hd: Q, dO, K, V
    static constexpr int LDS = BC + 4; // fp32 rows of scores: S, dP
    static constexpr int LDP = BC + 8; // bf16 rows of probabilities: P, dS
    static constexpr int LDA = HD + 4; // fp32 rows of hd: accumulators O, dQ, dK, dV
    static constexpr size_t q_tile = align128((size_t)BR * LDH * 2);
    static constexpr size_t k_tile = align128((size_t)BC * LDH * 2);
    static constexpr size_t s_tile = align128((size_t)BR * LDS * 4);
    static constexpr size_t p_tile = align128((size_t)BR * LDP * 2);
    static constexpr size_t qacc_tile = align128((size_t)BR * LDA * 4);
    static constexpr size_t kacc_tile = align128((size_t)BC * LDA * 4);
    static constexpr size_t rows = align128((size_t)BR * 4);
    // forward: Q, K, V, S, P, O, row max, row sum
    static constexpr size_t fwd = 1 * q_tile + 2 * k_tile + s_tile + p_tile + qacc_tile + 2 * rows;
    // dq: Q, dO, K, V, S, dP, dS, dQ, lse, delta
    static constexpr size_t dq = 2 * q_tile + 2 * k_tile + 2 * s_tile + p_tile + qacc_tile + 2 * rows;
    // dk/dv: K, V, Q, dO, S, dP, P, dS, dK, dV, lse, delta
    static constexpr size_t dkdv =
        2 * k_tile + 2 * q_tile + 2 * s_tile + 2 * p_tile + 2 * kacc_tile + 2 * rows;
};

// Carves consecutive arrays out of the dynamic shared memory.
struct Carver {
    unsigned char *p;
    template <typename T> __device__ T *take(size_t bytes)
    {
        T *r = (T *)p;
        p += bytes;
        return r;
    }
};

// ---------------------------------------------------------------------------------------------
// Building blocks

__device__ __forceinline__ float warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Rows t0 .. t0+ROWS-1 of head h of a [B,T,nheads,HD] bf16 tensor into dst [ROWS][LD], 16 bytes
// per thread and step; rows at or past T become zeros (finite values for the masked lanes).
template <int HD, int ROWS, int LD>
__device__ void load_rows(bf16 *dst, const bf16 *src, int b, int t0, int h, int T, int nheads)
{
    constexpr int CH = HD / 8;
    for (int idx = threadIdx.x; idx < ROWS * CH; idx += NTHREADS) {
        int r = idx / CH, c = idx % CH, t = t0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (t < T)
            val = *(const uint4 *)(src + (((size_t)b * T + t) * nheads + h) * HD + c * 8);
        *(uint4 *)(dst + r * LD + c * 8) = val;
    }
}

template <int ROWS, int COLS, int LD> __device__ void zero_rows(float *dst)
{
    for (int idx = threadIdx.x; idx < ROWS * COLS; idx += NTHREADS)
        dst[(idx / COLS) * LD + idx % COLS] = 0.0f;
}

// The inverse of load_rows for an fp32 accumulator, times a per-row factor (NULL: 1).
template <int HD, int ROWS, int LD>
__device__ void store_rows(bf16 *dst, const float *src, const float *rowscale, int b, int t0,
                           int h, int T, int nheads)
{
    for (int idx = threadIdx.x; idx < ROWS * HD; idx += NTHREADS) {
        int r = idx / HD, d = idx % HD, t = t0 + r;
        if (t < T) {
            float x = src[r * LD + d] * (rowscale ? rowscale[r] : 1.0f);
            dst[(((size_t)b * T + t) * nheads + h) * HD + d] = __float2bfloat16(x);
        }
    }
}

template <typename L> __device__ __forceinline__ int at(int row, int col, int ld)
{
    return std::is_same<L, wmma::row_major>::value ? row * ld + col : col * ld + row;
}

// C[M,N] (fp32, row-major, pitch ldc) = (ACC ? C : 0) + A[M,K] B[K,N], A and B bf16 in shared
// memory, each stored row- or column-major (LA, LB) with pitch lda, ldb. Output tiles are
// dealt to the warps, so a warp reads and writes only its own tiles of C. The caller puts a
// __syncthreads() between this and anything that reads C or writes A, B.
template <int M, int N, int K, typename LA, typename LB, bool ACC>
__device__ void mm(float *C, int ldc, const bf16 *A, int lda, const bf16 *B, int ldb)
{
    static_assert(M % 16 == 0 && N % 16 == 0 && K % 16 == 0, "mm shapes");
    constexpr int TN = N / 16, TILES = (M / 16) * TN;
    for (int t = threadIdx.x / 32; t < TILES; t += NWARPS) {
        const int m0 = (t / TN) * 16, n0 = (t % TN) * 16;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
        if constexpr (ACC)
            wmma::load_matrix_sync(c, C + m0 * ldc + n0, ldc, wmma::mem_row_major);
        else
            wmma::fill_fragment(c, 0.0f);
        for (int k0 = 0; k0 < K; k0 += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LA> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LB> bb;
            wmma::load_matrix_sync(a, A + at<LA>(m0, k0, lda), lda);
            wmma::load_matrix_sync(bb, B + at<LB>(k0, n0, ldb), ldb);
            wmma::mma_sync(c, a, bb, c);
        }
        wmma::store_matrix_sync(C + m0 * ldc + n0, c, ldc, wmma::mem_row_major);
    }
}

using RM = wmma::row_major;
using CM = wmma::col_major;

// ---------------------------------------------------------------------------------------------
// Forward: one block per (query tile, head, batch). For each key tile up to the diagonal:
// S = Q K^T, online softmax per row (log2 domain: scores times scale*log2(e)), O = alpha O + P V.

template <int HD, int BR, int BC>
__global__ void __launch_bounds__(NTHREADS)
    attn_fwd_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T,
                    int H, int Hkv, float scale_log2)
{
    using L = Layout<HD, BR, BC>;
    extern __shared__ __align__(128) unsigned char smem[];
    Carver cv{smem};
    bf16 *sQ = cv.take<bf16>(L::q_tile), *sK = cv.take<bf16>(L::k_tile),
         *sV = cv.take<bf16>(L::k_tile);
    float *sS = cv.take<float>(L::s_tile);
    bf16 *sP = cv.take<bf16>(L::p_tile);
    float *sO = cv.take<float>(L::qacc_tile), *sM = cv.take<float>(L::rows),
          *sL = cv.take<float>(L::rows);

    const int nq = (T + BR - 1) / BR;
    const int qt = nq - 1 - (int)blockIdx.x; // the longest rows start first
    const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
    const int q0 = qt * BR, warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    load_rows<HD, BR, L::LDH>(sQ, q, b, q0, h, T, H);
    zero_rows<BR, HD, L::LDA>(sO);
    for (int r = threadIdx.x; r < BR; r += NTHREADS) {
        sM[r] = -INFINITY;
        sL[r] = 0.0f;
    }

    const int kend = min(q0 + BR, T); // keys this tile's rows can see: [0, kend)
    const int nkt = (kend + BC - 1) / BC;
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BC;
        __syncthreads(); // the previous P V has read sP, sV
        load_rows<HD, BC, L::LDH>(sK, k, b, k0, hk, T, Hkv);
        load_rows<HD, BC, L::LDH>(sV, v, b, k0, hk, T, Hkv);
        __syncthreads();
        mm<BR, BC, HD, RM, CM, false>(sS, L::LDS, sQ, L::LDH, sK, L::LDH);
        __syncthreads();
        // A warp owns rows warp, warp+NWARPS, ...: their P, their running max and sum, and the
        // rescaling of their O rows.
        for (int r = warp; r < BR; r += NWARPS) {
            const int i = q0 + r;
            float s[BC / 32], mx = -INFINITY;
#pragma unroll
            for (int c = 0; c < BC / 32; c++) {
                const int col = lane + 32 * c, j = k0 + col;
                s[c] = (j <= i && j < T && i < T) ? sS[r * L::LDS + col] * scale_log2 : -INFINITY;
                mx = fmaxf(mx, s[c]);
            }
            mx = warp_max(mx);
            const float m_old = sM[r], l_old = sL[r];
            const float m_new = fmaxf(m_old, mx);
            const float m_use = m_new == -INFINITY ? 0.0f : m_new; // a row with nothing seen yet
            float sum = 0.0f;
#pragma unroll
            for (int c = 0; c < BC / 32; c++) {
                const float p = exp2f(s[c] - m_use); // masked: exp2(-inf) = 0
                sP[r * L::LDP + lane + 32 * c] = __float2bfloat16(p);
                sum += p;
            }
            sum = warp_sum(sum);
            const float alpha = exp2f(m_old - m_use); // 0 on the first tile
            for (int d = lane; d < HD; d += 32)
                sO[r * L::LDA + d] *= alpha;
            __syncwarp(); // every lane has read sM[r], sL[r]
            if (lane == 0) {
                sM[r] = m_new;
                sL[r] = l_old * alpha + sum;
            }
        }
        __syncthreads();
        mm<BR, HD, BC, RM, RM, true>(sO, L::LDA, sP, L::LDP, sV, L::LDH);
    }
    __syncthreads();
    for (int r = threadIdx.x; r < BR; r += NTHREADS) {
        const int i = q0 + r;
        const float l = sL[r];
        if (i < T)
            lse[((size_t)b * H + h) * T + i] = (sM[r] + log2f(l)) * LN2;
        sL[r] = l > 0.0f ? 1.0f / l : 0.0f; // now the row factor for the output
    }
    __syncthreads();
    store_rows<HD, BR, L::LDA>(out, sO, sL, b, q0, h, T, H);
}

// ---------------------------------------------------------------------------------------------
// Backward. delta = rowsum(dO * O) first; then dQ per query tile over key tiles, and dK, dV per
// key tile over the query heads of its group and the query tiles, each in a fixed order, so
// there are no atomics and the bits do not depend on scheduling. Both recompute
// P = exp(S - lse) and dS = P (dP - delta) scale, with dP = dO V^T.

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

// P and dS of rows [q0, q0+BR) against keys [k0, k0+BC) from S and dP; sP may be NULL (the dQ
// kernel needs only dS). Masked entries are exactly zero.
template <int HD, int BR, int BC>
__device__ void probs_and_dscores(bf16 *sP, bf16 *sdS, const float *sS, const float *sdP,
                                  const float *sLse2, const float *sDelta, int q0, int k0, int T,
                                  float scale, float scale_log2)
{
    using L = Layout<HD, BR, BC>;
    for (int idx = threadIdx.x; idx < BR * BC; idx += NTHREADS) {
        const int r = idx / BC, c = idx % BC, i = q0 + r, j = k0 + c;
        float p = 0.0f, ds = 0.0f;
        if (j <= i && j < T && i < T) {
            p = exp2f(sS[r * L::LDS + c] * scale_log2 - sLse2[r]);
            ds = p * (sdP[r * L::LDS + c] - sDelta[r]) * scale;
        }
        if (sP)
            sP[r * L::LDP + c] = __float2bfloat16(p);
        sdS[r * L::LDP + c] = __float2bfloat16(ds);
    }
}

// lse (as log2) and delta of rows [q0, q0+BR) of head h; zeros past T.
template <int BR>
__device__ void load_row_stats(float *sLse2, float *sDelta, const float *lse, const float *delta,
                               int b, int h, int q0, int T, int H)
{
    for (int r = threadIdx.x; r < BR; r += NTHREADS) {
        const int i = q0 + r;
        const size_t at = ((size_t)b * H + h) * T + i;
        sLse2[r] = i < T ? lse[at] * LOG2E : 0.0f;
        sDelta[r] = i < T ? delta[at] : 0.0f;
    }
}

// dQ = sum over key tiles of dS K; one block per (query tile, head, batch).
template <int HD, int BR, int BC>
__global__ void __launch_bounds__(NTHREADS)
    attn_bwd_dq_kernel(bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                       const float *lse, const float *delta, int T, int H, int Hkv, float scale,
                       float scale_log2)
{
    using L = Layout<HD, BR, BC>;
    extern __shared__ __align__(128) unsigned char smem[];
    Carver cv{smem};
    bf16 *sQ = cv.take<bf16>(L::q_tile), *sdO = cv.take<bf16>(L::q_tile),
         *sK = cv.take<bf16>(L::k_tile), *sV = cv.take<bf16>(L::k_tile);
    float *sS = cv.take<float>(L::s_tile), *sdP = cv.take<float>(L::s_tile);
    bf16 *sdS = cv.take<bf16>(L::p_tile);
    float *sdQ = cv.take<float>(L::qacc_tile), *sLse2 = cv.take<float>(L::rows),
          *sDelta = cv.take<float>(L::rows);

    const int nq = (T + BR - 1) / BR;
    const int qt = nq - 1 - (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv), q0 = qt * BR;

    load_rows<HD, BR, L::LDH>(sQ, q, b, q0, h, T, H);
    load_rows<HD, BR, L::LDH>(sdO, dout, b, q0, h, T, H);
    load_row_stats<BR>(sLse2, sDelta, lse, delta, b, h, q0, T, H);
    zero_rows<BR, HD, L::LDA>(sdQ);

    const int nkt = (min(q0 + BR, T) + BC - 1) / BC;
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BC;
        __syncthreads(); // the previous dS K has read sK, sdS
        load_rows<HD, BC, L::LDH>(sK, k, b, k0, hk, T, Hkv);
        load_rows<HD, BC, L::LDH>(sV, v, b, k0, hk, T, Hkv);
        __syncthreads();
        mm<BR, BC, HD, RM, CM, false>(sS, L::LDS, sQ, L::LDH, sK, L::LDH);
        mm<BR, BC, HD, RM, CM, false>(sdP, L::LDS, sdO, L::LDH, sV, L::LDH);
        __syncthreads();
        probs_and_dscores<HD, BR, BC>(NULL, sdS, sS, sdP, sLse2, sDelta, q0, k0, T, scale,
                                      scale_log2);
        __syncthreads();
        mm<BR, HD, BC, RM, RM, true>(sdQ, L::LDA, sdS, L::LDP, sK, L::LDH);
    }
    __syncthreads();
    store_rows<HD, BR, L::LDA>(dq, sdQ, NULL, b, q0, h, T, H);
}

// dV = sum P^T dO, dK = sum dS^T Q over the group's query heads (in order) and the query tiles
// at or after the key tile (in order); one block per (key tile, kv head, batch).
template <int HD, int BR, int BC>
__global__ void __launch_bounds__(NTHREADS)
    attn_bwd_dkdv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k,
                         const bf16 *v, const float *lse, const float *delta, int T, int H,
                         int Hkv, float scale, float scale_log2)
{
    using L = Layout<HD, BR, BC>;
    extern __shared__ __align__(128) unsigned char smem[];
    Carver cv{smem};
    bf16 *sK = cv.take<bf16>(L::k_tile), *sV = cv.take<bf16>(L::k_tile),
         *sQ = cv.take<bf16>(L::q_tile), *sdO = cv.take<bf16>(L::q_tile);
    float *sS = cv.take<float>(L::s_tile), *sdP = cv.take<float>(L::s_tile);
    bf16 *sP = cv.take<bf16>(L::p_tile), *sdS = cv.take<bf16>(L::p_tile);
    float *sdK = cv.take<float>(L::kacc_tile), *sdV = cv.take<float>(L::kacc_tile),
          *sLse2 = cv.take<float>(L::rows), *sDelta = cv.take<float>(L::rows);

    const int kt = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, group = H / Hkv, k0 = kt * BC;
    const int nq = (T + BR - 1) / BR;

    load_rows<HD, BC, L::LDH>(sK, k, b, k0, hk, T, Hkv);
    load_rows<HD, BC, L::LDH>(sV, v, b, k0, hk, T, Hkv);
    zero_rows<BC, HD, L::LDA>(sdK);
    zero_rows<BC, HD, L::LDA>(sdV);

    for (int g = 0; g < group; g++) {
        const int h = hk * group + g;
        for (int qt = k0 / BR; qt < nq; qt++) { // earlier query tiles see none of these keys
            const int q0 = qt * BR;
            __syncthreads(); // the previous products have read sQ, sdO, sP, sdS
            load_rows<HD, BR, L::LDH>(sQ, q, b, q0, h, T, H);
            load_rows<HD, BR, L::LDH>(sdO, dout, b, q0, h, T, H);
            load_row_stats<BR>(sLse2, sDelta, lse, delta, b, h, q0, T, H);
            __syncthreads();
            mm<BR, BC, HD, RM, CM, false>(sS, L::LDS, sQ, L::LDH, sK, L::LDH);
            mm<BR, BC, HD, RM, CM, false>(sdP, L::LDS, sdO, L::LDH, sV, L::LDH);
            __syncthreads();
            probs_and_dscores<HD, BR, BC>(sP, sdS, sS, sdP, sLse2, sDelta, q0, k0, T, scale,
                                          scale_log2);
            __syncthreads();
            // P and dS are [BR,BC] row-major, so read column-major they are P^T and dS^T.
            mm<BC, HD, BR, CM, RM, true>(sdV, L::LDA, sP, L::LDP, sdO, L::LDH);
            mm<BC, HD, BR, CM, RM, true>(sdK, L::LDA, sdS, L::LDP, sQ, L::LDH);
        }
    }
    __syncthreads();
    store_rows<HD, BC, L::LDA>(dk, sdK, NULL, b, k0, hk, T, Hkv);
    store_rows<HD, BC, L::LDA>(dv, sdV, NULL, b, k0, hk, T, Hkv);
}

// ---------------------------------------------------------------------------------------------
// Launchers

extern "C" const char *cuda_attn_last_error(void) { return cuda_err_text(); }


static bool aligned16(const void *p) { return p && (uintptr_t)p % 16 == 0; }
static bool aligned4(const void *p) { return p && (uintptr_t)p % 4 == 0; }

// Tile sizes: 64 x 64 for every head size (16, 32, 64, 128). Shared memory per block for hd 64 / 128: forward
// 70.5 / 110.5 KiB, dQ 96.5 / 144.5 KiB, dK/dV 122.5 / 186.5 KiB (H100 allows 227 KiB).
#define BR_ 64
#define BC_ 64

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
    auto kernel = attn_fwd_kernel<HD, BR_, BC_>;
    const size_t smem = Layout<HD, BR_, BC_>::fwd;
    int rc = prepare(kernel, smem, "cuda_attn_fwd");
    if (rc < 0)
        return rc;
    dim3 grid((T + BR_ - 1) / BR_, H, B);
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
    using L = Layout<HD, BR_, BC_>;
    auto dq_kernel = attn_bwd_dq_kernel<HD, BR_, BC_>;
    auto dkdv_kernel = attn_bwd_dkdv_kernel<HD, BR_, BC_>;
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

    dim3 qgrid((T + BR_ - 1) / BR_, H, B);
    dq_kernel<<<qgrid, NTHREADS, L::dq, st>>>(dq, dout, q, k, v, lse, delta, T, H, Hkv, scale,
                                               scale_log2);
    if ((rc = cuda_err_status(cudaGetLastError(), "cuda_attn_bwd dq launch")) < 0)
        return rc;

    dim3 kgrid((T + BC_ - 1) / BC_, Hkv, B);
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
