/* Loads the CUDA plugin (kernels/cuda/cuda_plugin.h: the CUDA backend table of
 * kernels/backend.h and the CUDA-only calls of the GPU data planes) into a stage,
 * optimizer-shard or coordinator process: build/lib/libctitan_cuda.so next to the running
 * program (build/bin/../lib), or the file CTITAN_CUDA_PLUGIN names (test_launch_gpu runs GPU jobs
 * on tests/cudasim's emulated plugin). backend_load("cuda") comes here. */
#ifndef CTITAN_KERNELS_CUDA_PLUGIN_H
#define CTITAN_KERNELS_CUDA_PLUGIN_H

#include <stddef.h>

#include "kernels/cuda/cuda_plugin.h"

#define CUDA_PLUGIN_ENV "CTITAN_CUDA_PLUGIN"

/* Returns the table (valid until the process exits), or NULL with err saying why. */
const cuda_plugin_t *cuda_plugin_load(char *err, size_t errlen);

#endif
