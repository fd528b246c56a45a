// RMSNorm on the GPU, bf16 activations and weights with fp32 sums: before attention, before the
// MLP and before the head. CPU twins: ops_rmsnorm_fwd / _bwd_x / _bwd_w.
#include <math.h>

#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/nn_common.cuh"

#define RMS_THREADS 256 // per row; a multiple of 32 (nn_block_sum)
#define RMSW_COLS 16    // dw: columns per block (two groups of 8: one 32-byte sector of a row)
#define RMSW_LANES 128  // dw: row lanes per block (blockDim.y)

// A row is read in chunks of 8 elements, chunk c = [8c, 8c + 8) (nn_load_group: with `vec`, D %
// 8 == 0 and the arrays 16-byte aligned, in one 16-byte access, else one by one, the elements
// past D read as 0, which adds nothing to the sums below). Thread t takes chunks t, t +
// blockDim.x, ...: both ways add the same terms in the same order, so they give the same bits.
__device__ static inline void rms_load(float *f, const uint16_t *row, int c, int D, int vec)
{
    nn_load_group(f, row, c, D, vec, 0.0f);
}

__device__ static inline void rms_store(uint16_t *row, int c, int D, int vec, const float *f)
{
    if (vec) {
        nn_store8(row + 8 * c, f);
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (8 * c + k < D)
            row[8 * c + k] = nn_f32_to_bf16(f[k]);
}

// One block per row: sum of squares, rstd (in double from the fp32 sum, as the CPU), then scale.
// The reduction's barriers put every read of x before any write of out, so out may alias x.
static __global__ void rmsnorm_fwd_kernel(uint16_t *out, float *rstd, const uint16_t *x,
                                          const uint16_t *w, int D, float eps, int vec)
{
    __shared__ float sh[32];
    const uint16_t *xr = x + (size_t)blockIdx.x * D;
    uint16_t *o = out + (size_t)blockIdx.x * D;
    int nc = (D + 7) / 8;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
        float v[8];
        rms_load(v, xr, c, D, vec);
#pragma unroll
        for (int k = 0; k < 8; k++)
            ss += v[k] * v[k];
    }
    ss = nn_block_sum(ss, sh);
    float rs = (float)(1.0 / sqrt((double)ss / D + eps));
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = rs;
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
        float v[8], wv[8], y[8];
        rms_load(v, xr, c, D, vec);
        rms_load(wv, w, c, D, vec);
#pragma unroll
        for (int k = 0; k < 8; k++)
            y[k] = v[k] * rs * wv[k];
        rms_store(o, c, D, vec, y);
    }
}

// One block per row: dot = sum g w x, then dx = r g w - r^3 x dot / D (+ res). Each thread
// reads its chunk of res before it writes that chunk of dx, so res may be dx.
static __global__ void rmsnorm_bwd_x_kernel(uint16_t *dx, const uint16_t *dout, const uint16_t *x,
                                            const float *rstd, const uint16_t *w, int D,
                                            const uint16_t *res, int vec)
{
    __shared__ float sh[32];
    size_t base = (size_t)blockIdx.x * D;
    const uint16_t *xr = x + base, *g = dout + base;
    uint16_t *d = dx + base;
    const uint16_t *rr = res ? res + base : NULL;
    int nc = (D + 7) / 8;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
        float gv[8], wv[8], xv[8];
        rms_load(gv, g, c, D, vec);
        rms_load(wv, w, c, D, vec);
        rms_load(xv, xr, c, D, vec);
#pragma unroll
        for (int k = 0; k < 8; k++)
            dot += gv[k] * wv[k] * xv[k];
    }
    dot = nn_block_sum(dot, sh);
    float rs = rstd[blockIdx.x];
    float kk = rs * rs * rs * dot / (float)D;
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
        float gv[8], wv[8], xv[8], y[8], old[8];
        rms_load(gv, g, c, D, vec);
        rms_load(wv, w, c, D, vec);
        rms_load(xv, xr, c, D, vec);
        if (rr)
            rms_load(old, rr, c, D, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float v = rs * gv[k] * wv[k] - kk * xv[k];
            y[k] = rr ? old[k] + v : v;
        }
        rms_store(d, c, D, vec, y);
    }
}

// dw without atomics or scratch: block b owns columns [16b, 16b + 16), two groups of 8 (x);
// thread (x, y) sums rows y, y + RMSW_LANES, ... of its group's 8 columns in order (one 16-byte
// access a row with `vec`: D % 8 == 0 and dout, x 16-byte aligned), then the first 16 threads
// add the RMSW_LANES partial sums of one column each in order of y. A warp reads 16 rows' 32
// bytes each: whole sectors; the 128 lanes keep enough reads in flight with D / 16 blocks.
static __global__ void rmsnorm_bwd_w_kernel(float *dw, const uint16_t *dout, const uint16_t *x,
                                            const float *rstd, int N, int D, int vec)
{
    __shared__ float part[RMSW_LANES][RMSW_COLS];
    int c = blockIdx.x * (RMSW_COLS / 8) + threadIdx.x; /* chunk of 8 columns */
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (8 * c < D)
#pragma unroll 4 /* several rows' loads in flight; the sums stay in row order */
        for (int n = threadIdx.y; n < N; n += RMSW_LANES) {
            float gv[8], xv[8], r = rstd[n];
            rms_load(gv, dout + (size_t)n * D, c, D, vec);
            rms_load(xv, x + (size_t)n * D, c, D, vec);
#pragma unroll
            for (int k = 0; k < 8; k++)
                acc[k] += gv[k] * xv[k] * r;
        }
#pragma unroll
    for (int k = 0; k < 8; k++)
        part[threadIdx.y][8 * threadIdx.x + k] = acc[k];
    __syncthreads();
    int t = threadIdx.y * blockDim.x + threadIdx.x, col = blockIdx.x * RMSW_COLS + t;
    if (t < RMSW_COLS && col < D) {
        float s = 0.0f;
        for (int r = 0; r < RMSW_LANES; r++)
            s += part[r][t];
        dw[col] += s;
    }
}

// The eight-at-a-time path: rows of whole chunks, every array 16-byte aligned.
static int rms_vec(int D, const void *a, const void *b, const void *c, const void *d)
{
    return D % 8 == 0 && nn_aligned16(a) && nn_aligned16(b) && (!c || nn_aligned16(c)) && (!d || nn_aligned16(d));
}

extern "C" int cuda_rmsnorm_fwd(uint16_t *out, float *rstd, const uint16_t *x, const uint16_t *w,
                                int N, int D, float eps, void *stream)
{
    if (!out || !rstd || !x || !w || N < 0 || D <= 0 || !(eps >= 0.0f))
        return cuda_nn_fail("cuda_rmsnorm_fwd: bad arguments (N %d, D %d, eps %g; out, rstd, x, w "
                            "must be device pointers)", N, D, (double)eps);
    if (N == 0)
        return 0;
    rmsnorm_fwd_kernel<<<N, RMS_THREADS, 0, (cudaStream_t)stream>>>(out, rstd, x, w, D, eps,
                                                                     rms_vec(D, out, x, w, NULL));
    return cuda_nn_check(cudaGetLastError(), "cuda_rmsnorm_fwd launch");
}

extern "C" int cuda_rmsnorm_bwd_x(uint16_t *dx, const uint16_t *dout, const uint16_t *x,
                                  const float *rstd, const uint16_t *w, int N, int D, const uint16_t *res,
                                  void *stream)
{
    if (!dx || !dout || !x || !rstd || !w || N < 0 || D <= 0)
        return cuda_nn_fail("cuda_rmsnorm_bwd_x: bad arguments (N %d, D %d; dx, dout, x, rstd, w "
                            "must be device pointers)", N, D);
    if (N == 0)
        return 0;
    int vec = rms_vec(D, dx, dout, x, w) && (!res || nn_aligned16(res));
    rmsnorm_bwd_x_kernel<<<N, RMS_THREADS, 0, (cudaStream_t)stream>>>(dx, dout, x, rstd, w, D, res, vec);
    return cuda_nn_check(cudaGetLastError(), "cuda_rmsnorm_bwd_x launch");
}

extern "C" int cuda_rmsnorm_bwd_w(float *dw, const uint16_t *dout, const uint16_t *x,
                                  const float *rstd, int N, int D, void *stream)
{
    if (!dw || !dout || !x || !rstd || N < 0 || D <= 0)
        return cuda_nn_fail("cuda_rmsnorm_bwd_w: bad arguments (N %d, D %d; dw, dout, x, rstd "
                            "must be device pointers)", N, D);
    if (N == 0)
        return 0;
    unsigned blocks = (unsigned)((D - 1) / RMSW_COLS + 1);
    rmsnorm_bwd_w_kernel<<<blocks, dim3(RMSW_COLS / 8, RMSW_LANES), 0, (cudaStream_t)stream>>>(
        dw, dout, x, rstd, N, D, rms_vec(D, dout, x, NULL, NULL));
    return cuda_nn_check(cudaGetLastError(), "cuda_rmsnorm_bwd_w launch");
}
