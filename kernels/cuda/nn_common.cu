// Host side shared by the bf16 kernels of kernels/cuda/cuda_nn.h: the fp32 <-> bf16 helpers and
// the per-thread error message. Kept apart from adamw.cu's buffer so the files stay independent.
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/nn_common.cuh"

static thread_local char nn_error[256] = "no error";

extern "C" const char *cuda_nn_last_error(void) { return nn_error; }

int cuda_nn_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nn_error, sizeof(nn_error), fmt, ap);
    va_end(ap);
    return -EINVAL;
}

int cuda_nn_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    snprintf(nn_error, sizeof(nn_error), "%s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? -ENODEV : -EIO;
}

extern "C" void cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = nn_f32_to_bf16(src[i]);
}

extern "C" void cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = nn_bf16_to_f32(src[i]);
}
