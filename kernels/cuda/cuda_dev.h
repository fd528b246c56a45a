/* The GPU data plane's device calls (kernels/cuda/dev.cu): memory and events that stage and
 * optimizer-shard processes share through CUDA IPC, the device a process runs on, streams,
 * and the small fp32 kernels of an optimizer shard on the GPU (summing replicas' gradients,
 * the per-block squared norms of the clip, fp32 -> bf16 weights).
 *
 * A handle is the 64 opaque bytes of cudaIpcMemHandle_t / cudaIpcEventHandle_t, so it can
 * sit in a shared-memory segment (stages/job/devdir.h). Memory is exported from its base pointer;
 * a process cannot open its own handles (CUDA's rule). Events are made with
 * cudaEventDisableTiming | cudaEventInterprocess: one process records, the other makes its
 * stream wait, and the host ring header orders the two calls.
 *
 * Every function returns 0 or a negative errno-style code; cuda_last_error() says why. */
#ifndef CTITAN_CUDA_DEV_H
#define CTITAN_CUDA_DEV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct { unsigned char b[64]; } cuda_ipc_mem_t;
typedef struct { unsigned char b[64]; } cuda_ipc_event_t;

/* Makes device (ordinal modulo the device count) current for this thread; *used = which. */
int cuda_dev_select(int ordinal, int *used);
/* Device memory in use on the current device, by every process (total - free), and the total. */
int cuda_dev_mem(size_t *used, size_t *total);

int cuda_stream_new(void **s);
void cuda_stream_free(void *s);
int cuda_stream_sync(void *s);

/* The handle of memory this process cudaMalloc'ed (p: the allocation's base). */
int cuda_ipc_export(void *p, cuda_ipc_mem_t *h);
/* cudaMalloc'ed memory and its handle. Free it with cuda_free (cuda_ops.h). */
int cuda_ipc_alloc(void **p, size_t bytes, cuda_ipc_mem_t *h);
/* Maps another process's memory (peer access enabled lazily when it is on another device). */
int cuda_ipc_open(void **p, const cuda_ipc_mem_t *h);
int cuda_ipc_close(void *p);

int cuda_ipc_event_new(void **ev, cuda_ipc_event_t *h);
int cuda_ipc_event_open(void **ev, const cuda_ipc_event_t *h);
void cuda_event_free(void *ev);
int cuda_event_record(void *ev, void *stream);
/* Work queued on stream after this waits for the event's last record (none: no wait). */
int cuda_stream_wait(void *stream, void *ev);
/* Returns once the event's last record is done (the host waits). */
int cuda_event_sync(void *ev);

/* Copies bytes in any direction (cudaMemcpyDefault) on stream; returns once queued. */
int cuda_copy_async(void *dst, const void *src, size_t bytes, void *stream);
/* Pins host memory [p, p + bytes) for fast asynchronous copies (cudaHostRegister), and undoes it. */
int cuda_host_pin(void *p, size_t bytes);
void cuda_host_unpin(void *p);
int cuda_zero_async(void *dst, size_t bytes, void *stream);

/* y[i] += x[i]. */
int cuda_f32_add(float *y, const float *x, size_t n, void *stream);
/* y[i] += x[i] (x bf16 bits). */
int cuda_f32_add_bf16(float *y, const uint16_t *x, size_t n, void *stream);
/* y[i] *= s. */
int cuda_f32_scale(float *y, float s, size_t n, void *stream);
/* out[b] = sum of x[i]^2 (as double) over block b = [b*block, (b+1)*block) of x[0, n), in a
 * fixed order (the same bits for the same block, wherever it sits). block <= 1 << 20. */
int cuda_block_sumsq(double *out, const float *x, size_t n, size_t block, void *stream);
/* *sq = the flat space's block norms summed in kernels/norm_order.h's order, and *scale its clip
 * factor for max_norm (norm_clip_scale of sqrt(*sq)), both in device memory: the bits of the
 * host's norm_sum. The block norms come as nruns runs, in flat order: run r is lens[r] doubles at
 * runs[r]; runs and lens are themselves device arrays (any process's memory mapped here); lanes:
 * NORM_LANES doubles of device memory the sum works in, which hold norm_lanes' running sums
 * after it. */
int cuda_norm_clip(double *sq, float *scale, double *lanes, const double *const *runs, const size_t *lens, int nruns,
                   double max_norm, void *stream);
/* y[i] = bf16(x[i]), round to nearest even. */
int cuda_f32_to_bf16_dev(uint16_t *y, const float *x, size_t n, void *stream);

#ifdef __cplusplus
}
#endif

#endif
