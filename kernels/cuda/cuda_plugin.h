/* The CUDA plugin's one table: build/lib/libctitan_cuda.so exports ctitan_cuda_plugin(), and
 * stage, optimizer-shard and (for NCCL ids) coordinator processes load it with dlopen
 * (kernels/cuda_plugin.h) only when the manifest asks for the GPU, so CPU jobs never load the
 * CUDA libraries. It holds the CUDA backend (kernels/backend.h: the model and the optimizer's
 * vector work, as the CPU's) and, after it, the CUDA-only calls of the GPU data planes
 * (stages/runtime/plane_ipc.c, plane_nccl.c): IPC memory and events, and NCCL.
 *
 * version counts layouts, and the loader takes only its own: version 4 moved the model and
 * the optimizer's calls into the backend table, version 5 gave the backend's adamw separate
 * sources and outputs (a changed signature, not an appended field, so a plugin of another
 * version is refused whichever is newer); version 7 appended the KV-cache inference of
 * `ctitan generate --device cuda` (cuda_infer.h), version 8 the backend's host_pin/unpin, version
 * 9 the backend's backward (B then W: activation checkpointing) after backward_w, version 10
 * NCCL's broadcast and reduce (parameter sharding), version 11 the bf16 reduce and the
 * bf16-into-fp32 add of a bf16 gradient reduce (training.mixed_precision_reduce), version 12
 * the backend's loss_take after step_end (the head's loss read once a step), version 13
 * model_config_t's head_rows and forward_only (the head's logits a chunk at a time), version 14
 * adamw's w_out and g_clear (the shard's publish in its AdamW pass), version 15 adamw's gscale_at
 * and, at the end, norm_clip and event_sync (GPU shards make the clip factor on the device). */
#ifndef CTITAN_CUDA_PLUGIN_H
#define CTITAN_CUDA_PLUGIN_H

#include "kernels/backend.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_infer.h"
#include "kernels/cuda/cuda_nccl.h"

#define CUDA_PLUGIN_VERSION 15

typedef struct {
    int version;
    backend_t backend;
    /* cuda_ops.h */
    int (*device_count)(void);
    /* cuda_dev.h: memory and events shared between processes, ordering of streams */
    int (*ipc_export)(void *, cuda_ipc_mem_t *);
    int (*ipc_alloc)(void **, size_t, cuda_ipc_mem_t *);
    int (*ipc_open)(void **, const cuda_ipc_mem_t *);
    int (*ipc_close)(void *);
    int (*ipc_event_new)(void **, cuda_ipc_event_t *);
    int (*ipc_event_open)(void **, const cuda_ipc_event_t *);
    void (*event_free)(void *);
    int (*event_record)(void *, void *);
    int (*stream_wait)(void *, void *);
    /* cuda_nccl.h */
    int (*nccl_id)(cuda_nccl_id_t *);
    int (*nccl_init)(cuda_nccl_t **, const cuda_nccl_id_t *, int, int);
    void (*nccl_destroy)(cuda_nccl_t **);
    int (*nccl_send)(cuda_nccl_t *, const void *, size_t, int, void *);
    int (*nccl_recv)(cuda_nccl_t *, void *, size_t, int, void *);
    int (*nccl_reduce_scatter_f32)(cuda_nccl_t *, const float *, float *, size_t, void *);
    int (*nccl_all_gather_bf16)(cuda_nccl_t *, const uint16_t *, uint16_t *, size_t, void *);
    int (*nccl_broadcast_bf16)(cuda_nccl_t *, const uint16_t *, uint16_t *, size_t, int, void *);
    int (*nccl_reduce_f32)(cuda_nccl_t *, const float *, float *, size_t, int, void *);
    /* the calling thread's last error text, whichever call failed (backend.last_error too) */
    const char *(*last_error)(void);
    /* cuda_infer.h: `ctitan generate --device cuda` */
    int (*infer_new)(cuda_infer_t **, const model_config_t *, const float *, int, int);
    void (*infer_destroy)(cuda_infer_t **);
    int (*infer_forward)(cuda_infer_t *, const int32_t *, int, float *);
    /* parameter sharding's bf16 reduce (cuda_nccl.h, cuda_dev.h) */
    int (*nccl_reduce_bf16)(cuda_nccl_t *, const uint16_t *, uint16_t *, size_t, int, void *);
    int (*f32_add_bf16)(float *, const uint16_t *, size_t, void *);
    /* the optimizer shards' norm on the device (cuda_dev.h) */
    int (*norm_clip)(double *, float *, double *, const double *const *, const size_t *, int, double, void *);
    int (*event_sync)(void *);
} cuda_plugin_t;

#ifdef __cplusplus
extern "C" {
#endif
const cuda_plugin_t *ctitan_cuda_plugin(void);
#ifdef __cplusplus
}
#endif

#endif
