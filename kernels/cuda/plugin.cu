// The table the stage and optimizer-shard processes load (cuda_plugin.h).
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_plugin.h"

static const cuda_plugin_t table = {
    CUDA_PLUGIN_VERSION,
    cuda_model_new, cuda_model_destroy, cuda_model_set_weights, cuda_model_take_grads, cuda_model_acts_new,
    cuda_model_acts_destroy, cuda_model_forward, cuda_model_backward_b, cuda_model_backward_w,
    cuda_model_forward_dev, cuda_model_backward_b_dev, cuda_model_sync, cuda_model_stream, cuda_model_buffers,
    cuda_dev_select, cuda_dev_mem, cuda_stream_new, cuda_stream_free, cuda_stream_sync, cuda_ipc_export,
    cuda_ipc_alloc, cuda_ipc_open, cuda_ipc_close, cuda_ipc_event_new, cuda_ipc_event_open, cuda_event_free,
    cuda_event_record, cuda_stream_wait, cuda_copy_async, cuda_zero_async, cuda_f32_add, cuda_f32_scale,
    cuda_block_sumsq, cuda_f32_to_bf16_dev,
    cuda_adamw, cuda_alloc, cuda_free,
    cuda_err_text,
    cuda_nccl_id, cuda_nccl_init, cuda_nccl_destroy, cuda_nccl_send, cuda_nccl_recv, cuda_nccl_reduce_scatter_f32,
    cuda_nccl_all_gather_bf16,
    cuda_device_count,
};

extern "C" const cuda_plugin_t *ctitan_cuda_plugin(void) { return &table; }
