// A CPU emulator of the CUDA subset kernels/cuda/ uses, so `make test` runs the real kernels
// without a GPU: one fiber per CUDA thread (sim.cpp), barriers for
// __syncthreads/__syncwarp/shuffles, WMMA with its documented semantics (lane 0 does the work),
// and kernels/cuda/mma.cuh's mma.sync, ldmatrix and cp.async per lane, from the PTX ISA's
// fragment layouts (tests/gpu/test_cuda_mma.c checks those against the GPU).
// Static __shared__ arrays become function statics (one block runs at a time, so they are the
// block's). Its WMMA fragment layouts are our reading of the documentation: a misreading would agree
// with the kernel here and show only on a GPU (tests/gpu on the real device is the authority).
#pragma once
#define __CUDACC__ 1 /* the kernels' device-side code paths */
#define CTITAN_CUDASIM 1 /* host code that must differ (nccl.cu: the stand-in, not libnccl) */
#include <cassert>
#include <cmath>
#include <functional>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>
#include <algorithm>
using std::min;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
struct dim3 { unsigned x, y, z; constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct uint3_ { unsigned x, y, z; };
/* The emulator's per-thread state, read by every emulated instruction: constinit (no TLS wrapper
 * function on each read) and the initial-exec model (an offset from the thread pointer, not a
 * __tls_get_addr call, which in the dlopened plugin took a third of an emulated job's CPU). The
 * few bytes come from the static TLS space glibc keeps for libraries loaded later. */
#define SIM_TLS thread_local constinit
#define SIM_TLS_IE __attribute__((tls_model("initial-exec")))
extern SIM_TLS uint3_ threadIdx SIM_TLS_IE, blockIdx SIM_TLS_IE;
extern SIM_TLS dim3 gridDim SIM_TLS_IE, blockDim SIM_TLS_IE;
extern SIM_TLS unsigned char *sim_smem SIM_TLS_IE;
extern SIM_TLS size_t sim_smem_size SIM_TLS_IE;
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct alignas(8) uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
struct __nv_bfloat16 { uint16_t x; };
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1); return {(uint16_t)(u >> 16)};
}
/* one operation each, rounded to nearest: never fused (the emulator builds with -ffp-contract=off
 * for a target without FMA, so plain C++ is these) */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float __bfloat162float(__nv_bfloat16 h) { uint32_t u = (uint32_t)h.x << 16; float f; memcpy(&f, &u, 4); return f; }

/* CUDA threads are fibers (ucontext) on the calling OS thread: a block's fibers run in turn
 * until each reaches a barrier or ends; a barrier is released once every live thread of the
 * block (or of the warp) waits on it. Warp exchanges go through xch. */
struct BlockSync {
    float xch[32][32];
    double xchd[32][32];
    int any = 0;
    /* kernels/cuda/mma.cuh's exchanges: per warp two slots used in turn, six words per lane;
     * xpar[tid] is the slot a thread posts in next (reset for each block) */
    uint64_t wx[32][2][32][6];
    unsigned char xpar[1024];
    /* each thread's cp.async copies not yet waited for (cleared for each block) */
    struct Copy { void *dst; const void *src; bool valid; };
    std::vector<Copy> cp_pending[1024];
};
extern SIM_TLS BlockSync *sim_bs SIM_TLS_IE;
void sim_wait(int warp); /* -1: the block's barrier; w >= 0: warp w's */
inline int sim_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline void __syncthreads() { sim_wait(-1); }
inline void __syncwarp(unsigned = 0xffffffffu) { sim_wait(sim_tid() / 32); }
inline int __syncthreads_or(int p) {
    if (p) sim_bs->any = 1;
    __syncthreads(); int r = sim_bs->any; __syncthreads();
    if (sim_tid() == 0) sim_bs->any = 0;
    __syncthreads(); return r;
}
inline float __shfl_xor_sync(unsigned, float v, int o) {
    int w = sim_tid() / 32, l = sim_tid() % 32;
    sim_bs->xch[w][l] = v; __syncwarp(); float r = sim_bs->xch[w][l ^ o]; __syncwarp(); return r;
}
inline double __shfl_xor_sync(unsigned, double v, int o) {
    int w = sim_tid() / 32, l = sim_tid() % 32;
    sim_bs->xchd[w][l] = v; __syncwarp(); double r = sim_bs->xchd[w][l ^ o]; __syncwarp(); return r;
}

static inline void sim_check_smem(const void *p, size_t bytes) {
    const unsigned char *c = (const unsigned char *)p;
    if (!(c >= sim_smem && c + bytes <= sim_smem + sim_smem_size)) { fprintf(stderr, "wmma, ldmatrix or cp.async access outside smem\n"); abort(); }
}

/* kernels/cuda/mma.cuh's warp-wide operations, from the PTX ISA's fragment layouts (written out
 * there). Each lane posts its operands in its warp's exchange slot, waits at the warp's barrier
 * and then reads the others'. One barrier suffices because a warp's slots alternate: a lane posts
 * in a slot again only after passing the next operation's barrier, which every lane reaches only
 * once done reading this one. */
inline uint64_t (*sim_exchange())[6] {
    int tid = sim_tid();
    unsigned char &par = sim_bs->xpar[tid];
    uint64_t (*x)[6] = sim_bs->wx[tid / 32][par];
    par ^= 1;
    return x;
}
/* the two bf16 of a fragment register, lower half first */
inline void sim_bf16_pair(float f[2], uint64_t reg) {
    uint32_t lo = (uint32_t)reg << 16, hi = (uint32_t)reg & 0xffff0000u;
    memcpy(&f[0], &lo, 4), memcpy(&f[1], &hi, 4);
}
inline void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    int l = sim_tid() % 32, g = l / 4, t = l % 4;
    uint64_t (*x)[6] = sim_exchange();
    for (int i = 0; i < 4; i++) x[l][i] = a[i];
    x[l][4] = b[0], x[l][5] = b[1];
    __syncwarp();
    /* this lane's rows of A, g and g+8: lane 4 g + (k % 8) / 2, register 2 (k >= 8) (+1 for
     * g+8); its columns of B, 2t and 2t+1: lane 4 n + (k % 8) / 2, register (k >= 8); the
     * element in half k % 2 of either */
    float ag[16], ag8[16], bt0[16], bt1[16];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) { /* k = 2 (j % 4) + 8 (j / 4) and k + 1: one register each */
        int k = 2 * (j % 4) + 8 * (j / 4), q = j % 4, hi = j / 4;
        sim_bf16_pair(&ag[k], x[4 * g + q][2 * hi]);
        sim_bf16_pair(&ag8[k], x[4 * g + q][2 * hi + 1]);
        sim_bf16_pair(&bt0[k], x[4 * (2 * t) + q][4 + hi]);
        sim_bf16_pair(&bt1[k], x[4 * (2 * t + 1) + q][4 + hi]);
    }
    float r[4] = {c[0], c[1], c[2], c[3]}; /* D (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) */
    for (int k = 0; k < 16; k++) {
        r[0] += ag[k] * bt0[k], r[1] += ag[k] * bt1[k];
        r[2] += ag8[k] * bt0[k], r[3] += ag8[k] * bt1[k];
    }
    memcpy(d, r, sizeof r);
}
inline void sim_ldmatrix(uint32_t *r, int n, bool trans, const void *row) {
    int l = sim_tid() % 32;
    uint64_t (*x)[6] = sim_exchange();
    x[l][0] = (uint64_t)(uintptr_t)row;
    __syncwarp();
    for (int i = 0; i < n; i++) {
        uint32_t e[2];
        for (int j = 0; j < 2; j++) {
            /* row l/4, elements 2(l%4)+j of matrix i; transposed: row 2(l%4)+j, element l/4 */
            int rr = trans ? 2 * (l % 4) + j : l / 4, cc = trans ? l / 4 : 2 * (l % 4) + j;
            const uint16_t *p = (const uint16_t *)(uintptr_t)x[8 * i + rr][0];
            if ((uintptr_t)p % 16) { fprintf(stderr, "ldmatrix: row address not 16-byte aligned\n"); abort(); }
            sim_check_smem(p, 16);
            e[j] = p[cc];
        }
        r[i] = e[0] | e[1] << 16;
    }
}
inline void ldmatrix_x4(uint32_t r[4], const void *row) { sim_ldmatrix(r, 4, false, row); }
inline void ldmatrix_x4_trans(uint32_t r[4], const void *row) { sim_ldmatrix(r, 4, true, row); }
inline void ldmatrix_x2(uint32_t r[2], const void *row) { sim_ldmatrix(r, 2, false, row); }
inline void ldmatrix_x2_trans(uint32_t r[2], const void *row) { sim_ldmatrix(r, 2, true, row); }
/* cp.async: the copy lands when its thread waits for it, the latest it may on a GPU, so that
 * reading a tile before waiting shows as the previous contents (or the NaN garbage of fresh
 * shared memory); zeros when !valid. */
inline void cp_async_16(void *dst, const void *src, bool valid) {
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) { fprintf(stderr, "cp.async: address not 16-byte aligned\n"); abort(); }
    sim_check_smem(dst, 16);
    sim_bs->cp_pending[sim_tid()].push_back({dst, src, valid});
}
inline void cp_async_commit(void) {}
inline void cp_async_wait_all(void) {
    auto &pending = sim_bs->cp_pending[sim_tid()];
    for (auto &c : pending)
        if (c.valid) memcpy(c.dst, c.src, 16); else memset(c.dst, 0, 16);
    pending.clear();
}

typedef int cudaError_t; typedef void *cudaStream_t; typedef void *cudaEvent_t;
#define cudaStreamLegacy ((cudaStream_t)0) /* the legacy stream: NULL here, as cudaStreamSynchronize takes it */
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInsufficientDriver = 35,
       cudaErrorInitializationError = 3, cudaErrorInvalidDevice = 101, cudaErrorNoDevice = 100, cudaErrorMapBufferObjectFailed = 205,
       cudaErrorHostMemoryAlreadyRegistered = 712, cudaErrorHostMemoryNotRegistered = 713 };
/* The runtime calls the CUDA code makes, on host memory. Device memory is a memfd mapping
 * (sim.cpp), which is what lets CUDA IPC work between real processes: a handle names the
 * exporter's pid and descriptor, and cudaIpcOpenMemHandle maps /proc/PID/fd/FD.
 * Streams are asynchronous as on a GPU: each created stream is a thread that runs its queue in
 * order, after a random pause of up to 100 us before each operation, so work that is not
 * ordered by an event, a stream synchronisation or a blocking copy runs late and shows as wrong
 * numbers. Events count records (issued when cudaEventRecord is called, completed when its
 * stream reaches it) in shared memory, so interprocess events work too; a stream wait waits for
 * the records issued when it was called. The legacy stream (NULL) runs in the caller. Copies
 * from pageable host memory take the bytes at the call; copies to pageable host memory wait
 * for their stream first (CUDA's rules for pageable memory). Kernels and copies run one at a
 * time (one device lock); NCCL operations and event waits do not take it. */
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
enum { cudaStreamNonBlocking = 1 };
enum { cudaEventDisableTiming = 2, cudaEventInterprocess = 4 };
enum { cudaIpcMemLazyEnablePeerAccess = 1 };
struct cudaIpcMemHandle_t { char reserved[64]; };
struct cudaIpcEventHandle_t { char reserved[64]; };
/* Four devices (CTITAN_SIM_GPUS: 1 to 16), all of them this host's memory (so multi-GPU code
 * paths run; NCCL's stand-in takes one rank per device as NCCL does). */
inline cudaError_t cudaGetDeviceCount(int *n)
{
    const char *e = getenv("CTITAN_SIM_GPUS");
    int k = e ? atoi(e) : 4;
    *n = k >= 1 && k <= 16 ? k : 4;
    return 0;
}
inline int &sim_device() { static thread_local int d = 0; return d; }
/* CUDA belongs to the process that set it up: a child forked after that gets
 * cudaErrorInitializationError (real CUDA fails or hangs it) from the calls that set up a device,
 * memory, streams and events. 0 where this process may use it. */
cudaError_t sim_owner_check();
inline cudaError_t cudaSetDevice(int d)
{
    if (cudaError_t e = sim_owner_check())
        return e;
    int n;
    cudaGetDeviceCount(&n);
    return d >= 0 && d < n ? (sim_device() = d, cudaSuccess) : cudaErrorInvalidDevice;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t); /* an 80 GiB device used by this process alone */
/* Maps bytes of another process's memfd (its descriptor fd, through /proc/PID/fd); NULL if not. */
void *sim_map_other(int pid, int fd, size_t bytes);
cudaError_t cudaMalloc(void **p, size_t b);
cudaError_t cudaFree(void *p);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p);
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void *p);
cudaError_t cudaMallocHost(void **p, size_t b); /* pinned: copies to it stay asynchronous */
enum { cudaHostRegisterDefault = 0 };
cudaError_t cudaHostRegister(void *p, size_t b, unsigned flags); /* pinned from now on, as cudaMallocHost's */
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *d, const void *s, size_t b, cudaMemcpyKind);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t b, cudaMemcpyKind, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *d, int v, size_t b, cudaStream_t st);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e);
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t h);
/* Queues op on stream s (NULL: runs it now). device: it touches device memory (kernels,
 * copies), so it runs under the device lock; NCCL's stand-in passes false. */
void sim_enqueue(cudaStream_t s, std::function<void()> op, bool device = true);
enum { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
inline cudaError_t cudaGetDevice(int *d) { *d = sim_device(); return 0; }
inline cudaError_t cudaDeviceGetAttribute(int *v, int, int) { *v = 232448; return 0; }
template <typename F> cudaError_t cudaFuncSetAttribute(F, int, int v) { return v > 232448; }
inline cudaError_t cudaGetLastError() { return 0; }
inline const char *cudaGetErrorString(cudaError_t) { return "sim error"; }


namespace nvcuda { namespace wmma {
struct row_major {}; struct col_major {}; struct matrix_a {}; struct matrix_b {}; struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename L = void> struct fragment { float x[16][16]; };
template <typename F> void fill_fragment(F &f, float v) { for (auto &r : f.x) for (auto &e : r) e = v; }
template <typename Use, typename L>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L> &f, const __nv_bfloat16 *p, unsigned ldm) {
    if (sim_tid() % 32) return;
    if ((uintptr_t)p % 32 || ldm % 8) { fprintf(stderr, "wmma bf16 load misaligned\n"); abort(); }
    bool rm = std::is_same<L, row_major>::value;
    for (int r = 0; r < 16; r++) for (int c = 0; c < 16; c++) {
        const __nv_bfloat16 *e = rm ? p + r * ldm + c : p + c * ldm + r;
        sim_check_smem(e, 2); f.x[r][c] = __bfloat162float(*e);
    }
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm, layout_t l) {
    if (sim_tid() % 32) return;
    if ((uintptr_t)p % 32 || ldm % 4 || l != mem_row_major) { fprintf(stderr, "wmma f32 load bad\n"); abort(); }
    for (int r = 0; r < 16; r++) for (int c = 0; c < 16; c++) { sim_check_smem(p + r * ldm + c, 4); f.x[r][c] = p[r * ldm + c]; }
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t l) {
    if (sim_tid() % 32) return;
    if ((uintptr_t)p % 32 || ldm % 4 || l != mem_row_major) { fprintf(stderr, "wmma store bad\n"); abort(); }
    for (int r = 0; r < 16; r++) for (int c = 0; c < 16; c++) { sim_check_smem(p + r * ldm + c, 4); p[r * ldm + c] = f.x[r][c]; }
}
template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b, const fragment<accumulator, 16, 16, 16, float> &c) {
    if (sim_tid() % 32) return;
    float t[16][16];
    for (int m = 0; m < 16; m++) for (int n = 0; n < 16; n++) { float s = c.x[m][n]; for (int k = 0; k < 16; k++) s += a.x[m][k] * b.x[k][n]; t[m][n] = s; }
    memcpy(d.x, t, sizeof t);
}
}}

inline unsigned __ballot_sync(unsigned, int pred) {
    int w = sim_tid() / 32, l = sim_tid() % 32;
    sim_bs->xch[w][l] = pred ? 1.0f : 0.0f; __syncwarp();
    unsigned m = 0;
    for (int i = 0; i < 32; i++) m |= (sim_bs->xch[w][i] != 0.0f ? 1u : 0u) << i;
    __syncwarp(); return m;
}
inline int __ffs(int x) { return __builtin_ffs(x); }

void sim_run(dim3 grid, dim3 block, size_t smem, const std::function<void()> &kernel);

template <typename... KA, typename... A>
void sim_launch(void (*k)(KA...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
    sim_enqueue(s, [=] { sim_run(grid, block, smem, [&] { k(args...); }); });
}
