/* The error text of the CUDA code (kernels/cuda/): one buffer per thread that every module's
 * launchers write when they fail, read through cuda_last_error() or the module's own
 * *_last_error() (the same text). */
#ifndef CTITAN_CUDA_ERR_H
#define CTITAN_CUDA_ERR_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Formats the message and returns rc. */
int cuda_err(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cuda_err_v(int rc, const char *fmt, va_list ap);
/* 0 for cudaSuccess; else "what: CUDA's text" and -ENODEV (no usable device or driver),
 * -ENOMEM (allocation) or -EIO. status is a cudaError_t. */
int cuda_err_status(int status, const char *what);
const char *cuda_err_text(void);

#ifdef __cplusplus
}
#endif

#endif
