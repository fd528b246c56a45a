// RMSNorm on the GPU, bf16 activations and weights with fp32 sums: before attention, before the
// MLP and before the head. CPU twins: ops_rmsnorm_fwd / _bwd_x / _bwd_w.
#include <math.h>

#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/nn_common.cuh"

#define RMS_THREADS 256 // per row; a multiple of 32 (nn_block_sum)
#define RMSW_COLS 32    // dw: columns per block, one warp wide
#define RMSW_ROWS 16    // dw: row lanes per block (blockDim.y)

// One block per row: sum of squares, rstd (in double from the fp32 sum, as the CPU), then scale.
// The reduction's barriers put every read of x before any write of out, so out may alias x.
static __global__ void rmsnorm_fwd_kernel(uint16_t *out, float *rstd, const uint16_t *x,
                                          const uint16_t *w, int D, float eps)
{
    __shared__ float sh[32];
    const uint16_t *xr = x + (size_t)blockIdx.x * D;
    uint16_t *o = out + (size_t)blockIdx.x * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = nn_bf16_to_f32(xr[i]);
        ss += v * v;
    }
    ss = nn_block_sum(ss, sh);
    float rs = (float)(1.0 / sqrt((double)ss / D + eps));
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = rs;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        o[i] = nn_f32_to_bf16(nn_bf16_to_f32(xr[i]) * rs * nn_bf16_to_f32(w[i]));
}

// One block per row: dot = sum g w x, then dx = r g w - r^3 x dot / D (+ old dx).
static __global__ void rmsnorm_bwd_x_kernel(uint16_t *dx, const uint16_t *dout, const uint16_t *x,
                                            const float *rstd, const uint16_t *w, int D,
                                            int accumulate)
{
    __shared__ float sh[32];
    size_t base = (size_t)blockIdx.x * D;
    const uint16_t *xr = x + base, *g = dout + base;
    uint16_t *d = dx + base;
    float dot = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        dot += nn_bf16_to_f32(g[i]) * nn_bf16_to_f32(w[i]) * nn_bf16_to_f32(xr[i]);
    dot = nn_block_sum(dot, sh);
    float rs = rstd[blockIdx.x];
    float k = rs * rs * rs * dot / (float)D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = rs * nn_bf16_to_f32(g[i]) * nn_bf16_to_f32(w[i]) - k * nn_bf16_to_f32(xr[i]);
        if (accumulate)
            v = nn_bf16_to_f32(d[i]) + v;
        d[i] = nn_f32_to_bf16(v);
    }
}

// dw without atomics or scratch: block b owns columns [32b, 32b+32); thread (x, y) sums rows
// y, y+16, y+32, ... of column 32b+x in order, then row lane 0 adds the 16 partial sums in
// order of y. Each warp reads 32 adjacent columns of one row.
static __global__ void rmsnorm_bwd_w_kernel(float *dw, const uint16_t *dout, const uint16_t *x,
                                            const float *rstd, int N, int D)
{
    __shared__ float part[RMSW_ROWS][RMSW_COLS];
    int c = blockIdx.x * RMSW_COLS + threadIdx.x;
    float acc = 0.0f;
    if (c < D)
        for (int n = threadIdx.y; n < N; n += RMSW_ROWS) {
            size_t k = (size_t)n * D + c;
            acc += nn_bf16_to_f32(dout[k]) * nn_bf16_to_f32(x[k]) * rstd[n];
        }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < D) {
        float s = 0.0f;
        for (int r = 0; r < RMSW_ROWS; r++)
            s += part[r][threadIdx.x];
        dw[c] += s;
    }
}

extern "C" int cuda_rmsnorm_fwd(uint16_t *out, float *rstd, const uint16_t *x, const uint16_t *w,
                                int N, int D, float eps, void *stream)
{
    if (!out || !rstd || !x || !w || N < 0 || D <= 0 || !(eps >= 0.0f))
        return cuda_nn_fail("cuda_rmsnorm_fwd: bad arguments (N %d, D %d, eps %g; out, rstd, x, w "
                            "must be device pointers)", N, D, (double)eps);
    if (N == 0)
        return 0;
    rmsnorm_fwd_kernel<<<N, RMS_THREADS, 0, (cudaStream_t)stream>>>(out, rstd, x, w, D, eps);
    return cuda_nn_check(cudaGetLastError(), "cuda_rmsnorm_fwd launch");
}

extern "C" int cuda_rmsnorm_bwd_x(uint16_t *dx, const uint16_t *dout, const uint16_t *x,
                                  const float *rstd, const uint16_t *w, int N, int D, int accumulate,
                                  void *stream)
{
    if (!dx || !dout || !x || !rstd || !w || N < 0 || D <= 0)
        return cuda_nn_fail("cuda_rmsnorm_bwd_x: bad arguments (N %d, D %d; dx, dout, x, rstd, w "
                            "must be device pointers)", N, D);
    if (N == 0)
        return 0;
    rmsnorm_bwd_x_kernel<<<N, RMS_THREADS, 0, (cudaStream_t)stream>>>(dx, dout, x, rstd, w, D,
                                                                       accumulate != 0);
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
    rmsnorm_bwd_w_kernel<<<blocks, dim3(RMSW_COLS, RMSW_ROWS), 0, (cudaStream_t)stream>>>(
        dw, dout, x, rstd, N, D);
    return cuda_nn_check(cudaGetLastError(), "cuda_rmsnorm_bwd_w launch");
}
