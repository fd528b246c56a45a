/* The CUDA backend as one table of functions: build/lib/libctitan_cuda.so exports
 * ctitan_cuda_plugin(), and stage and optimizer-shard processes load it with dlopen
 * (stages/cuda_plugin.h) only when the manifest asks for the GPU, so CPU jobs never load the
 * CUDA libraries. Fields are only ever appended (version counts them). */
#ifndef CTITAN_CUDA_PLUGIN_H
#define CTITAN_CUDA_PLUGIN_H

#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_model.h"
#include "kernels/cuda/cuda_nccl.h"

#define CUDA_PLUGIN_VERSION 3

typedef struct {
    int version;
    /* cuda_model.h */
    int (*model_new)(cuda_model_t **, const model_config_t *, int, int);
    void (*model_destroy)(cuda_model_t **);
    int (*set_weights)(cuda_model_t *, const float *);
    int (*take_grads)(cuda_model_t *, float *);
    int (*acts_new)(cuda_model_acts_t **, const cuda_model_t *, int, int);
    void (*acts_destroy)(cuda_model_acts_t **);
    int (*forward)(cuda_model_t *, cuda_model_acts_t *, const int32_t *, const float *, const int32_t *, float,
                   float *, double *);
    int (*backward_b)(cuda_model_t *, cuda_model_acts_t *, const float *, float *);
    int (*backward_w)(cuda_model_t *, cuda_model_acts_t *);
    int (*forward_dev)(cuda_model_t *, cuda_model_acts_t *, const int32_t *, const uint16_t *, const int32_t *,
                       float, uint16_t *, double *);
    int (*backward_b_dev)(cuda_model_t *, cuda_model_acts_t *, const uint16_t *, uint16_t *);
    int (*model_sync)(cuda_model_t *);
    void *(*model_stream)(cuda_model_t *);
    void (*model_buffers)(cuda_model_t *, uint16_t **, float **, size_t *, size_t *);
    /* cuda_dev.h */
    int (*dev_select)(int, int *);
    int (*dev_mem)(size_t *, size_t *);
    int (*stream_new)(void **);
    void (*stream_free)(void *);
    int (*stream_sync)(void *);
    int (*ipc_export)(void *, cuda_ipc_mem_t *);
    int (*ipc_alloc)(void **, size_t, cuda_ipc_mem_t *);
    int (*ipc_open)(void **, const cuda_ipc_mem_t *);
    int (*ipc_close)(void *);
    int (*ipc_event_new)(void **, cuda_ipc_event_t *);
    int (*ipc_event_open)(void **, const cuda_ipc_event_t *);
    void (*event_free)(void *);
    int (*event_record)(void *, void *);
    int (*stream_wait)(void *, void *);
    int (*copy_async)(void *, const void *, size_t, void *);
    int (*zero_async)(void *, size_t, void *);
    int (*f32_add)(float *, const float *, size_t, void *);
    int (*f32_scale)(float *, float, size_t, void *);
    int (*block_sumsq)(double *, const float *, size_t, size_t, void *);
    int (*f32_to_bf16)(uint16_t *, const float *, size_t, void *);
    /* cuda_ops.h */
    int (*adamw)(float *, const float *, float *, float *, size_t, float, float, float, float, float, int, void *);
    int (*alloc)(void **, size_t);
    int (*free)(void *);
    /* the calling thread's last error text, whichever call failed */
    const char *(*last_error)(void);
    /* cuda_nccl.h (version 2) */
    int (*nccl_id)(cuda_nccl_id_t *);
    int (*nccl_init)(cuda_nccl_t **, const cuda_nccl_id_t *, int, int);
    void (*nccl_destroy)(cuda_nccl_t **);
    int (*nccl_send)(cuda_nccl_t *, const void *, size_t, int, void *);
    int (*nccl_recv)(cuda_nccl_t *, void *, size_t, int, void *);
    int (*nccl_reduce_scatter_f32)(cuda_nccl_t *, const float *, float *, size_t, void *);
    int (*nccl_all_gather_bf16)(cuda_nccl_t *, const uint16_t *, uint16_t *, size_t, void *);
    /* version 3 */
    int (*device_count)(void);
} cuda_plugin_t;

#ifdef __cplusplus
extern "C" {
#endif
const cuda_plugin_t *ctitan_cuda_plugin(void);
#ifdef __cplusplus
}
#endif

#endif
