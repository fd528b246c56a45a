/* bf16 Linear-layer products on the GPU through cuBLASLt, the CUDA twins of ops_matmul_fwd,
 * ops_matmul_bwd_x and ops_matmul_bwd_w (kernels/ops.h): same row-major layouts, W is
 * [Dout,Din] as in PyTorch's nn.Linear. bf16 buffers are uint16_t (the bits of a bfloat16).
 * Every call returns 0 or a negative errno-style code: -EINVAL for bad arguments, -ENODEV
 * without a usable device, -ENOMEM, -EIO for CUDA or cuBLASLt failures; the text of the last
 * error of this thread is cuda_matmul_last_error(). */
#ifndef CTITAN_CUDA_MATMUL_H
#define CTITAN_CUDA_MATMUL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A cuBLASLt handle, a 32 MiB workspace on the device current at creation, and a small cache of
 * matmul descriptors and chosen algorithms per (product, shape, pointer alignment): the same
 * call always runs the same algorithm, so results are bitwise repeatable.
 * Not thread-safe. The workspace is shared by every call on the context, so calls that may run
 * concurrently (different streams without ordering between them) need different contexts. */
typedef struct cuda_matmul_ctx cuda_matmul_ctx_t;

/* *out is owned by the caller, released with cuda_matmul_ctx_destroy. */
int cuda_matmul_ctx_new(cuda_matmul_ctx_t **out);
/* Frees the context and sets *ctx = NULL (no-op on NULL); waits for the device to be idle. */
void cuda_matmul_ctx_destroy(cuda_matmul_ctx_t **ctx);

/* y[N,Dout] = x[N,Din] · w[Dout,Din]^T. y must not overlap x or w. stream may be NULL. */
int cuda_matmul_fwd(cuda_matmul_ctx_t *ctx, uint16_t *y, const uint16_t *x, const uint16_t *w,
                    int N, int Din, int Dout, void *stream);
/* dx[N,Din] = dy[N,Dout] · w[Dout,Din]; adds into dx (rounded to bf16 once, after the fp32
 * sum) when accumulate != 0, like ops_matmul_bwd_x. dx must not overlap dy or w. */
int cuda_matmul_bwd_x(cuda_matmul_ctx_t *ctx, uint16_t *dx, const uint16_t *dy, const uint16_t *w,
                      int N, int Din, int Dout, int accumulate, void *stream);
/* dw[Dout,Din] += dy[N,Dout]^T · x[N,Din], fp32 gradient accumulated over microbatches, like
 * ops_matmul_bwd_w (zero dw before the first microbatch). */
int cuda_matmul_bwd_w(cuda_matmul_ctx_t *ctx, float *dw, const uint16_t *dy, const uint16_t *x,
                      int N, int Din, int Dout, void *stream);

/* Measured bf16 throughput of n x n x n products (fp32 accumulation, bf16 output, the forward's
 * layout) on the current device, in TFLOP/s: the best of a few timed runs, the denominator of
 * MFU. n = 8192 is a good size on an H100; takes well under a second. */
int cuda_matmul_peak_tflops(int n, double *tflops);

/* Text of the last error seen by a function of this header in this thread. */
const char *cuda_matmul_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
