// The per-thread error text shared by the CUDA modules (cuda_err.h).
#include <errno.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_err.h"

static thread_local char text[512] = "no error";

extern "C" int cuda_err_v(int rc, const char *fmt, va_list ap)
{
    vsnprintf(text, sizeof(text), fmt, ap);
    return rc;
}

extern "C" int cuda_err(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cuda_err_v(rc, fmt, ap);
    va_end(ap);
    return rc;
}

extern "C" int cuda_err_status(int status, const char *what)
{
    cudaError_t e = (cudaError_t)status;
    if (e == cudaSuccess)
        return 0;
    int rc = e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? -ENODEV
             : e == cudaErrorMemoryAllocation                             ? -ENOMEM
                                                                          : -EIO;
    return cuda_err(rc, "%s: %s", what, cudaGetErrorString(e));
}

extern "C" const char *cuda_err_text(void) { return text; }

extern "C" const char *cuda_last_error(void) { return text; }
