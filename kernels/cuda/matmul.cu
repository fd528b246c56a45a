// bf16 Linear-layer products (forward, input gradient, weight gradient) through cuBLASLt, and the
// bf16 peak-throughput probe behind MFU; the CPU twins are ops_matmul_* (kernels/cpu/ops_basic.c).
//
// cuBLASLt is column-major: a row-major [R,C] buffer is, to it, the column-major [C,R] matrix,
// i.e. the transpose. Each row-major product below is therefore computed as its transpose:
//   fwd    y = x W^T     ->  y^T [Dout,N]  = op(W^T as stored)=T  . (x^T as stored)=N   "TN"
//   bwd_x  dx = dy W     ->  dx^T [Din,N]  = (W^T as stored)=N    . (dy^T as stored)=N  "NN"
//   bwd_w  dW = dy^T x   ->  dW^T [Din,Dout] = (x^T as stored)=N  . op(dy^T as stored)=T "NT"
// so no operand is ever copied or transposed in memory, and every leading dimension is the
// row length of the row-major buffer (Din for x, dx, W, dW; Dout for y, dy).
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_matmul.h"

#define WORKSPACE_BYTES ((size_t)32 << 20) // what NVIDIA recommends for cuBLAS(Lt) on Hopper
#define PLAN_SLOTS 64 // a Llama stage has ~6 shapes x 3 products; more just replaces old plans

extern "C" const char *cuda_matmul_last_error(void) { return cuda_err_text(); }


static int lt_check(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    return cuda_err(-EIO, "%s: %s (%d)", what, cublasLtGetStatusName(s), (int)s);
}

enum { MM_FWD, MM_BWD_X, MM_BWD_W };
static const char *const mm_name[] = {"cuda_matmul_fwd", "cuda_matmul_bwd_x", "cuda_matmul_bwd_w"};

// One cached product: descriptors (opaque structs initialised in place, nothing to destroy)
// and the algorithm the heuristic chose for this shape and these pointer alignments.
struct plan {
    int used;
    int kind, N, Din, Dout;
    uint32_t align_a, align_b, align_d; // C is D, so C's alignment is D's
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t a, b, d; // d describes both C and D
    cublasLtMatmulAlgo_t algo;
};

struct cuda_matmul_ctx {
    cublasLtHandle_t lt;
    void *workspace; // WORKSPACE_BYTES on `device`
    int device;
    int next; // slot taken when every slot is used
    struct plan plans[PLAN_SLOTS];
};

extern "C" int cuda_matmul_ctx_new(cuda_matmul_ctx_t **out)
{
    if (!out)
        return cuda_err(-EINVAL, "cuda_matmul_ctx_new: NULL out");
    *out = NULL;
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        cudaGetLastError(); // clear the sticky "no device" error
        // The reason matters on a GPU machine: a driver too old for this runtime reads as no device.
        return cuda_err(-ENODEV, "cuda_matmul_ctx_new: no usable CUDA device (%s)",
                    e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    cuda_matmul_ctx_t *c = (cuda_matmul_ctx_t *)calloc(1, sizeof(*c));
    if (!c)
        return cuda_err(-ENOMEM, "cuda_matmul_ctx_new: out of host memory");
    int rc = cuda_err_status(cudaGetDevice(&c->device), "cuda_matmul_ctx_new: cudaGetDevice");
    if (!rc)
        rc = cuda_err_status(cudaMalloc(&c->workspace, WORKSPACE_BYTES), "cuda_matmul_ctx_new: workspace");
    if (!rc)
        rc = lt_check(cublasLtCreate(&c->lt), "cuda_matmul_ctx_new: cublasLtCreate");
    if (rc) {
        cuda_matmul_ctx_destroy(&c);
        return rc;
    }
    *out = c;
    return 0;
}

extern "C" void cuda_matmul_ctx_destroy(cuda_matmul_ctx_t **ctx)
{
    if (!ctx || !*ctx)
        return;
    cuda_matmul_ctx_t *c = *ctx;
    if (c->lt)
        cublasLtDestroy(c->lt);
    if (c->workspace)
        cudaFree(c->workspace); // synchronises: no matmul can still be using it
    free(c);
    *ctx = NULL;
}

// Largest power of two up to 256 dividing the address: what the heuristic is told to assume.
static uint32_t align_of(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a)
        a /= 2;
    return a;
}

static int overlaps(const void *a, size_t abytes, const void *b, size_t bbytes)
{
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a0 < b0 + bbytes && b0 < a0 + abytes;
}

static int plan_init(cuda_matmul_ctx_t *ctx, struct plan *p)
{
    const char *what = mm_name[p->kind];
    // Row-major shapes to column-major operands, see the top of the file.
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    cudaDataType_t dtype = CUDA_R_16BF;
    uint64_t ar, ac, br, bc, dr, dc; // rows, cols of the stored column-major A, B, D
    if (p->kind == MM_FWD) {        // A = W: [Din,Dout]; B = x: [Din,N]; D = y: [Dout,N]
        ta = CUBLAS_OP_T;
        ar = p->Din, ac = p->Dout, br = p->Din, bc = p->N, dr = p->Dout, dc = p->N;
    } else if (p->kind == MM_BWD_X) { // A = W: [Din,Dout]; B = dy: [Dout,N]; D = dx: [Din,N]
        ar = p->Din, ac = p->Dout, br = p->Dout, bc = p->N, dr = p->Din, dc = p->N;
    } else { // A = x: [Din,N]; B = dy: [Dout,N]; D = dW: [Din,Dout] fp32
        tb = CUBLAS_OP_T;
        dtype = CUDA_R_32F;
        ar = p->Din, ac = p->N, br = p->Dout, bc = p->N, dr = p->Din, dc = p->Dout;
    }
    // fp32 accumulation and fp32 alpha/beta whatever the output type.
    int rc = lt_check(cublasLtMatmulDescInit(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
    if (!rc)
        rc = lt_check(cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
                      what);
    if (!rc)
        rc = lt_check(cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
                      what);
    // Column-major leading dimension = number of stored rows (the buffers are dense).
    if (!rc)
        rc = lt_check(cublasLtMatrixLayoutInit(&p->a, CUDA_R_16BF, ar, ac, (int64_t)ar), what);
    if (!rc)
        rc = lt_check(cublasLtMatrixLayoutInit(&p->b, CUDA_R_16BF, br, bc, (int64_t)br), what);
    if (!rc)
        rc = lt_check(cublasLtMatrixLayoutInit(&p->d, dtype, dr, dc, (int64_t)dr), what);
    if (rc)
        return rc;

    cublasLtMatmulPreferenceOpaque_t pref;
    uint64_t ws = WORKSPACE_BYTES;
    // Split-K only with fp32 partials reduced in a separate, fixed-order pass (NONE, no split,
    // always passes the mask): OUTPUT_TYPE and INPLACE would add partials in bf16 for a bf16
    // output (rounding more than once), and INPLACE's order of arrival is not a fixed order.
    uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    rc = lt_check(cublasLtMatmulPreferenceInit(&pref), what);
    if (!rc)
        rc = lt_check(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &ws, sizeof(ws)),
                      what);
    if (!rc)
        rc = lt_check(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                           &reduction, sizeof(reduction)),
                      what);
    // The default assumption is 256-byte aligned buffers; a tensor at an offset inside an
    // allocation may be less aligned, and an algorithm that needs more would fail or misread.
    if (!rc)
        rc = lt_check(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                           &p->align_a, sizeof(p->align_a)),
                      what);
    if (!rc)
        rc = lt_check(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                           &p->align_b, sizeof(p->align_b)),
                      what);
    if (!rc)
        rc = lt_check(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                           &p->align_d, sizeof(p->align_d)),
                      what);
    if (!rc)
        rc = lt_check(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                           &p->align_d, sizeof(p->align_d)),
                      what);
    if (rc)
        return rc;

    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    rc = lt_check(cublasLtMatmulAlgoGetHeuristic(ctx->lt, &p->op, &p->a, &p->b, &p->d, &p->d, &pref, 1,
                                                 &res, &found),
                  what);
    if (rc)
        return rc;
    if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS)
        return cuda_err(-EIO, "%s: cuBLASLt has no algorithm for N=%d Din=%d Dout=%d (alignments %u/%u/%u)",
                    what, p->N, p->Din, p->Dout, p->align_a, p->align_b, p->align_d);
    p->algo = res.algo;
    return 0;
}

// The plan for this product, shape and alignments, made on first use.
static int plan_get(cuda_matmul_ctx_t *ctx, int kind, int N, int Din, int Dout, const void *A,
                    const void *B, const void *D, struct plan **out)
{
    uint32_t aa = align_of(A), ab = align_of(B), ad = align_of(D);
    for (int i = 0; i < PLAN_SLOTS; i++) {
        struct plan *p = &ctx->plans[i];
        if (p->used && p->kind == kind && p->N == N && p->Din == Din && p->Dout == Dout &&
            p->align_a == aa && p->align_b == ab && p->align_d == ad) {
            *out = p;
            return 0;
        }
    }
    int slot = -1;
    for (int i = 0; i < PLAN_SLOTS && slot < 0; i++)
        if (!ctx->plans[i].used)
            slot = i;
    if (slot < 0) {
        slot = ctx->next;
        ctx->next = (ctx->next + 1) % PLAN_SLOTS;
    }
    struct plan *p = &ctx->plans[slot];
    p->used = 0;
    p->kind = kind, p->N = N, p->Din = Din, p->Dout = Dout;
    p->align_a = aa, p->align_b = ab, p->align_d = ad;
    int rc = plan_init(ctx, p);
    if (rc)
        return rc;
    p->used = 1;
    *out = p;
    return 0;
}

// Checks everything that can be checked without the device first, so bad arguments are
// reported the same with or without a GPU. A is the first input, B the second, D the output.
static int run(cuda_matmul_ctx_t *ctx, int kind, void *D, const void *A, const void *B, int N, int Din,
               int Dout, float beta, void *stream)
{
    const char *what = mm_name[kind];
    if (!D || !A || !B)
        return cuda_err(-EINVAL, "%s: NULL buffer", what);
    if (N < 1 || Din < 1 || Dout < 1)
        return cuda_err(-EINVAL, "%s: shape N=%d Din=%d Dout=%d, every dimension must be >= 1", what, N, Din,
                    Dout);
    // Element counts of the buffers as (A, B, D).
    size_t nx = (size_t)N * Din, nw = (size_t)Dout * Din, ny = (size_t)N * Dout;
    size_t na = kind == MM_BWD_W ? nx : nw, nb = kind == MM_FWD ? nx : ny;
    size_t nd = kind == MM_FWD ? ny : kind == MM_BWD_X ? nx : nw;
    size_t dsize = kind == MM_BWD_W ? 4 : 2;
    if ((uintptr_t)A % 2 || (uintptr_t)B % 2 || (uintptr_t)D % dsize)
        return cuda_err(-EINVAL, "%s: misaligned buffer (bf16 needs 2 bytes, fp32 4)", what);
    if (overlaps(D, nd * dsize, A, na * 2) || overlaps(D, nd * dsize, B, nb * 2))
        return cuda_err(-EINVAL, "%s: the output overlaps an input", what);
    if (!ctx)
        return cuda_err(-EINVAL, "%s: NULL context", what);
    int dev = -1;
    int rc = cuda_err_status(cudaGetDevice(&dev), what);
    if (rc)
        return rc;
    if (dev != ctx->device)
        return cuda_err(-EINVAL, "%s: context made on device %d, current device is %d", what, ctx->device, dev);

    struct plan *p;
    rc = plan_get(ctx, kind, N, Din, Dout, A, B, D, &p);
    if (rc)
        return rc;
    const float alpha = 1.0f;
    // beta == 0: cuBLASLt does not read C, so D's old contents (even NaN) do not matter.
    rc = lt_check(cublasLtMatmul(ctx->lt, &p->op, &alpha, A, &p->a, B, &p->b, &beta, D, &p->d, D, &p->d,
                                 &p->algo, ctx->workspace, WORKSPACE_BYTES, (cudaStream_t)stream),
                  what);
    if (rc)
        return rc;
    return cuda_err_status(cudaGetLastError(), what);
}

extern "C" int cuda_matmul_fwd(cuda_matmul_ctx_t *ctx, uint16_t *y, const uint16_t *x, const uint16_t *w,
                               int N, int Din, int Dout, void *stream)
{
    return run(ctx, MM_FWD, y, w, x, N, Din, Dout, 0.0f, stream);
}

extern "C" int cuda_matmul_bwd_x(cuda_matmul_ctx_t *ctx, uint16_t *dx, const uint16_t *dy,
                                 const uint16_t *w, int N, int Din, int Dout, int accumulate, void *stream)
{
    return run(ctx, MM_BWD_X, dx, w, dy, N, Din, Dout, accumulate ? 1.0f : 0.0f, stream);
}

extern "C" int cuda_matmul_bwd_w(cuda_matmul_ctx_t *ctx, float *dw, const uint16_t *dy, const uint16_t *x,
                                 int N, int Din, int Dout, void *stream)
{
    return run(ctx, MM_BWD_W, dw, x, dy, N, Din, Dout, 1.0f, stream);
}

// Values in [-1, 1) from a hash of the index: zeros would flatter the peak (tensor cores draw
// less power on them and clocks stay higher).
__global__ void fill_bf16_kernel(__nv_bfloat16 *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16, h *= 0x7feb352du, h ^= h >> 15, h *= 0x846ca68bu, h ^= h >> 16;
        p[i] = __float2bfloat16((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

extern "C" int cuda_matmul_peak_tflops(int n, double *tflops)
{
    if (!tflops || n < 1 || n > 32768)
        return cuda_err(-EINVAL, "cuda_matmul_peak_tflops: n=%d, want 1..32768 and a result pointer", n);
    *tflops = 0;
    cuda_matmul_ctx_t *ctx = NULL;
    uint16_t *a = NULL, *b = NULL, *c = NULL;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    size_t elems = (size_t)n * n;
    double flops = 2.0 * n * n * (double)n;
    // About 1e13 flops per timed run (~15 ms on an H100), so event resolution and launch gaps
    // do not matter; small n are capped at 1000 launches.
    int reps = (int)(1e13 / flops) + 1, trials = 5;
    if (reps > 1000)
        reps = 1000;
    float best_ms = 0;
    int rc = cuda_matmul_ctx_new(&ctx);
    if (!rc)
        rc = cuda_err_status(cudaMalloc((void **)&a, elems * 2), "cuda_matmul_peak_tflops: cudaMalloc");
    if (!rc)
        rc = cuda_err_status(cudaMalloc((void **)&b, elems * 2), "cuda_matmul_peak_tflops: cudaMalloc");
    if (!rc)
        rc = cuda_err_status(cudaMalloc((void **)&c, elems * 2), "cuda_matmul_peak_tflops: cudaMalloc");
    if (!rc)
        rc = cuda_err_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cuda_matmul_peak_tflops: stream");
    if (!rc)
        rc = cuda_err_status(cudaEventCreate(&e0), "cuda_matmul_peak_tflops: event");
    if (!rc)
        rc = cuda_err_status(cudaEventCreate(&e1), "cuda_matmul_peak_tflops: event");
    if (rc)
        goto out;
    fill_bf16_kernel<<<1024, 256, 0, s>>>((__nv_bfloat16 *)a, elems, 1);
    fill_bf16_kernel<<<1024, 256, 0, s>>>((__nv_bfloat16 *)b, elems, 2);
    if ((rc = cuda_err_status(cudaGetLastError(), "cuda_matmul_peak_tflops: fill")))
        goto out;
    for (int i = 0; i < 3 && !rc; i++) // warm-up: plan, clocks, caches
        rc = cuda_matmul_fwd(ctx, c, a, b, n, n, n, s);
    for (int t = 0; t < trials && !rc; t++) {
        rc = cuda_err_status(cudaEventRecord(e0, s), "cuda_matmul_peak_tflops: event");
        for (int i = 0; i < reps && !rc; i++)
            rc = cuda_matmul_fwd(ctx, c, a, b, n, n, n, s);
        if (!rc)
            rc = cuda_err_status(cudaEventRecord(e1, s), "cuda_matmul_peak_tflops: event");
        if (!rc)
            rc = cuda_err_status(cudaEventSynchronize(e1), "cuda_matmul_peak_tflops: sync");
        float ms = 0;
        if (!rc)
            rc = cuda_err_status(cudaEventElapsedTime(&ms, e0, e1), "cuda_matmul_peak_tflops: elapsed");
        if (!rc && ms > 0 && (best_ms == 0 || ms < best_ms))
            best_ms = ms;
    }
    if (!rc && best_ms <= 0)
        rc = cuda_err(-EIO, "cuda_matmul_peak_tflops: no timing measured");
    if (!rc)
        *tflops = flops * reps / (best_ms * 1e-3) / 1e12;
out:
    if (s)
        cudaStreamSynchronize(s);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (s)
        cudaStreamDestroy(s);
    cudaFree(a), cudaFree(b), cudaFree(c);
    cuda_matmul_ctx_destroy(&ctx);
    return rc;
}
