// Host side shared by the bf16 kernels of kernels/cuda/cuda_nn.h: the fp32 <-> bf16 helpers and
// the error text of cuda_nn.h's launchers (cuda_err.h).
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/nn_common.cuh"

extern "C" const char *cuda_nn_last_error(void) { return cuda_err_text(); }

int cuda_nn_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = cuda_err_v(-EINVAL, fmt, ap);
    va_end(ap);
    return rc;
}

int cuda_nn_check(cudaError_t e, const char *what) { return cuda_err_status(e, what); }

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
