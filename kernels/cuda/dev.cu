// The GPU data plane's device calls (cuda_dev.h): IPC memory and events, devices, streams,
// and the optimizer shard's fp32 kernels.
#include <errno.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/nn_common.cuh"
#include "kernels/norm_order.h"

static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(cuda_ipc_mem_t), "IPC memory handle size");
static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(cuda_ipc_event_t), "IPC event handle size");

#define CU(call, what)                                                                        \
    do {                                                                                     \
        int rc_ = cuda_err_status((call), what);                                             \
        if (rc_)                                                                             \
            return rc_;                                                                      \
    } while (0)

extern "C" int cuda_dev_select(int ordinal, int *used)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return cuda_err(-ENODEV, "no usable CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
    }
    if (n <= 0 || ordinal < 0)
        return cuda_err(-ENODEV, "no usable CUDA device for ordinal %d (%d found)", ordinal, n);
    CU(cudaSetDevice(ordinal % n), "cudaSetDevice");
    if (used)
        *used = ordinal % n;
    return 0;
}

extern "C" int cuda_dev_mem(size_t *used, size_t *total)
{
    size_t f = 0, t = 0;
    CU(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *used = t - f;
    *total = t;
    return 0;
}

extern "C" int cuda_stream_new(void **s)
{
    CU(cudaStreamCreateWithFlags((cudaStream_t *)s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return 0;
}

extern "C" void cuda_stream_free(void *s)
{
    if (s)
        cudaStreamDestroy((cudaStream_t)s);
}

extern "C" int cuda_stream_sync(void *s)
{
    CU(cudaStreamSynchronize((cudaStream_t)s), "cudaStreamSynchronize");
    return 0;
}

extern "C" int cuda_ipc_export(void *p, cuda_ipc_mem_t *h)
{
    cudaIpcMemHandle_t mh;
    CU(cudaIpcGetMemHandle(&mh, p), "cudaIpcGetMemHandle");
    memcpy(h, &mh, sizeof(mh));
    return 0;
}

extern "C" int cuda_ipc_alloc(void **p, size_t bytes, cuda_ipc_mem_t *h)
{
    *p = NULL;
    CU(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc (shared buffer)");
    int rc = cuda_ipc_export(*p, h);
    if (rc) {
        cudaFree(*p);
        *p = NULL;
    }
    return rc;
}

extern "C" int cuda_ipc_open(void **p, const cuda_ipc_mem_t *h)
{
    cudaIpcMemHandle_t mh;
    memcpy(&mh, h, sizeof(mh));
    CU(cudaIpcOpenMemHandle(p, mh, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    return 0;
}

extern "C" int cuda_ipc_close(void *p)
{
    CU(cudaIpcCloseMemHandle(p), "cudaIpcCloseMemHandle");
    return 0;
}

extern "C" int cuda_ipc_event_new(void **ev, cuda_ipc_event_t *h)
{
    CU(cudaEventCreateWithFlags((cudaEvent_t *)ev, cudaEventDisableTiming | cudaEventInterprocess),
       "cudaEventCreateWithFlags (interprocess)");
    cudaIpcEventHandle_t eh;
    int rc = cuda_err_status(cudaIpcGetEventHandle(&eh, (cudaEvent_t)*ev), "cudaIpcGetEventHandle");
    if (rc) {
        cudaEventDestroy((cudaEvent_t)*ev);
        *ev = NULL;
        return rc;
    }
    memcpy(h, &eh, sizeof(eh));
    return 0;
}

extern "C" int cuda_ipc_event_open(void **ev, const cuda_ipc_event_t *h)
{
    cudaIpcEventHandle_t eh;
    memcpy(&eh, h, sizeof(eh));
    CU(cudaIpcOpenEventHandle((cudaEvent_t *)ev, eh), "cudaIpcOpenEventHandle");
    return 0;
}

extern "C" void cuda_event_free(void *ev)
{
    if (ev)
        cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" int cuda_event_record(void *ev, void *stream)
{
    CU(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream), "cudaEventRecord");
    return 0;
}

extern "C" int cuda_stream_wait(void *stream, void *ev)
{
    CU(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0), "cudaStreamWaitEvent");
    return 0;
}

extern "C" int cuda_event_sync(void *ev)
{
    CU(cudaEventSynchronize((cudaEvent_t)ev), "cudaEventSynchronize");
    return 0;
}

extern "C" int cuda_copy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream), "cudaMemcpyAsync");
    return 0;
}

extern "C" int cuda_host_pin(void *p, size_t bytes)
{
    CU(cudaHostRegister(p, bytes, cudaHostRegisterDefault), "cudaHostRegister");
    return 0;
}

extern "C" void cuda_host_unpin(void *p) { cudaHostUnregister(p); }

extern "C" int cuda_zero_async(void *dst, size_t bytes, void *stream)
{
    CU(cudaMemsetAsync(dst, 0, bytes, (cudaStream_t)stream), "cudaMemsetAsync");
    return 0;
}

// ---- the optimizer shard's kernels ----

__global__ static void k_add(float *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

__global__ static void k_add_bf16(float *y, const uint16_t *x, size_t n)
{
    const __nv_bfloat16 *X = (const __nv_bfloat16 *)x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += __bfloat162float(X[i]);
}

__global__ static void k_scale(float *y, float s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] *= s;
}

__global__ static void k_to_bf16(uint16_t *y, const float *x, size_t n)
{
    __nv_bfloat16 *Y = (__nv_bfloat16 *)y;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        Y[i] = __float2bfloat16(x[i]);
}

#define SUMSQ_WARPS 8 /* norm blocks a CUDA block */

/* One warp per norm block: lane l adds the squares of elements 4 (l + 32 j) + k of its block, j =
 * 0, 1, ..., k = 0..3 in that order, in double (the products exact), then a butterfly over the
 * warp (every lane the same bits, as nn_warp_sum's). With `vec` (block % 4 == 0, x 16-byte
 * aligned) a whole block's four come in one 16-byte load; one by one otherwise and in a last
 * short block: the same terms in the same order. So the same bits for the same block wherever
 * it sits. (One CUDA block of 256 threads and a shared-memory tree per norm block before: a
 * ~1B model's ~865k of them, each reading 4 KB.) */
__global__ static void k_block_sumsq(double *out, const float *x, size_t n, size_t block, size_t nb, int vec)
{
    int lane = threadIdx.x & 31;
    size_t b = blockIdx.x * (size_t)SUMSQ_WARPS + (threadIdx.x >> 5);
    size_t b0 = b * block, len = b >= nb ? 0 : b0 + block < n ? block : n - b0;
    const float *xb = x + b0;
    double s = 0;
    if (vec && len == block) {
        for (size_t q = lane; 4 * q < len; q += 32) {
            NN_ALIGNED(xb + 4 * q, 16);
            float4 v = *(const float4 *)(xb + 4 * q);
            s += (double)v.x * v.x;
            s += (double)v.y * v.y;
            s += (double)v.z * v.z;
            s += (double)v.w * v.w;
        }
    } else {
        for (size_t q = lane; 4 * q < len; q += 32)
            for (size_t i = 4 * q; i < 4 * q + 4 && i < len; i++)
                s += (double)xb[i] * xb[i];
    }
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0 && b < nb)
        out[b] = s;
}

#define NORM_THREADS 256 /* a CUDA block's; NORM_LANES / NORM_THREADS blocks take a lane each */
#define NORM_UNROLL 8    /* loads a lane has in flight */

/* kernels/norm_order.h's sum of the flat space's block norms, which come in runs (each optimizer
 * shard's slice, in flat order), and its clip factor. First one thread a lane: block b of the
 * flat space goes into lane b % NORM_LANES, each lane's blocks in increasing b (runs in order,
 * each run's in order), NORM_UNROLL loads at a time before their additions in order (a ~1B
 * model's 865k blocks are 7 MB: one load in flight a lane would take milliseconds); then one
 * CUDA block adds the lanes pairwise in shared memory. Only double additions, a sqrt and a
 * division, each rounded once: the host's bits. */
__global__ static void k_norm_lanes(double *lanes, const double *const *runs, const size_t *lens, int nruns)
{
    const size_t l = blockIdx.x * (size_t)NORM_THREADS + threadIdx.x, L = NORM_LANES;
    double acc = 0;
    size_t base = 0; /* the flat index of run r's first block */
    for (int r = 0; r < nruns; base += lens[r], r++) {
        const double *x = runs[r]; /* x[i]: block base + i of the flat space */
        size_t n = lens[r], i = (l + L - base % L) % L;
        for (; i + (NORM_UNROLL - 1) * L < n; i += NORM_UNROLL * L) {
            double v[NORM_UNROLL];
#pragma unroll
            for (int u = 0; u < NORM_UNROLL; u++)
                v[u] = x[i + u * L];
#pragma unroll
            for (int u = 0; u < NORM_UNROLL; u++)
                acc += v[u];
        }
        for (; i < n; i += L)
            acc += x[i];
    }
    lanes[l] = acc;
}

__global__ static void k_norm_clip(double *sq, float *scale, const double *lanes, double max_norm)
{
    __shared__ double lane[NORM_LANES];
    const int t = threadIdx.x;
    for (int i = t; i < NORM_LANES; i += NORM_THREADS)
        lane[i] = lanes[i];
    __syncthreads();
    for (int w = NORM_LANES / 2; w > 0; w /= 2) {
        for (int i = t; i < w; i += NORM_THREADS)
            lane[i] += lane[i + w];
        __syncthreads();
    }
    if (t == 0) {
        *sq = lane[0];
        *scale = (float)norm_clip_scale(max_norm, sqrt(lane[0]));
    }
}

#define LAUNCHED(what) return cuda_err_status(cudaGetLastError(), what)

extern "C" int cuda_f32_add(float *y, const float *x, size_t n, void *stream)
{
    if (!n)
        return 0;
    k_add<<<nn_grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(y, x, n);
    LAUNCHED("cuda_f32_add");
}

extern "C" int cuda_f32_add_bf16(float *y, const uint16_t *x, size_t n, void *stream)
{
    if (!n)
        return 0;
    k_add_bf16<<<nn_grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(y, x, n);
    LAUNCHED("cuda_f32_add_bf16");
}

extern "C" int cuda_f32_scale(float *y, float s, size_t n, void *stream)
{
    if (!n)
        return 0;
    k_scale<<<nn_grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(y, s, n);
    LAUNCHED("cuda_f32_scale");
}

extern "C" int cuda_f32_to_bf16_dev(uint16_t *y, const float *x, size_t n, void *stream)
{
    if (!n)
        return 0;
    k_to_bf16<<<nn_grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(y, x, n);
    LAUNCHED("cuda_f32_to_bf16_dev");
}

extern "C" int cuda_block_sumsq(double *out, const float *x, size_t n, size_t block, void *stream)
{
    if (!block || block > ((size_t)1 << 20))
        return cuda_err(-EINVAL, "cuda_block_sumsq: block %zu", block);
    size_t nb = (n + block - 1) / block;
    if (!nb)
        return 0;
    if (nb > 0x7fffffff)
        return cuda_err(-EINVAL, "cuda_block_sumsq: %zu blocks", nb);
    int vec = block % 4 == 0 && ((uintptr_t)x & 15) == 0;
    k_block_sumsq<<<(unsigned)((nb + SUMSQ_WARPS - 1) / SUMSQ_WARPS), 32 * SUMSQ_WARPS, 0, (cudaStream_t)stream>>>(
        out, x, n, block, nb, vec);
    LAUNCHED("cuda_block_sumsq");
}

static_assert(NORM_LANES % NORM_THREADS == 0, "whole CUDA blocks of lanes");

extern "C" int cuda_norm_clip(double *sq, float *scale, double *lanes, const double *const *runs, const size_t *lens,
                              int nruns, double max_norm, void *stream)
{
    if (nruns < 1 || !sq || !scale || !lanes || !runs || !lens)
        return cuda_err(-EINVAL, "cuda_norm_clip: bad arguments (%d runs)", nruns);
    k_norm_lanes<<<NORM_LANES / NORM_THREADS, NORM_THREADS, 0, (cudaStream_t)stream>>>(lanes, runs, lens, nruns);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return cuda_err_status(e, "cuda_norm_clip launch (lanes)");
    k_norm_clip<<<1, NORM_THREADS, 0, (cudaStream_t)stream>>>(sq, scale, lanes, max_norm);
    LAUNCHED("cuda_norm_clip");
}
