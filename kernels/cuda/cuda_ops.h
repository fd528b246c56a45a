/* C declarations of the CUDA launchers in kernels/cuda/ (one .cu per op). Every launcher takes a
 * stream, checks its arguments and the launch, and returns 0 or a negative errno-style
 * code (-ENODEV without a usable device, -EINVAL for bad shapes, -EIO for CUDA errors). */
#ifndef CTITAN_CUDA_OPS_H
#define CTITAN_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices (0 when there is no driver or no GPU). */
int cuda_device_count(void);
/* Text of the last CUDA error seen by a launcher in this thread. */
const char *cuda_last_error(void);

/* AdamW over fp32 device arrays, as torch.optim.AdamW, the bits of the CPU's ops_adamw_to
 * (kernels/adamw.h): reads param0, m0, v0 and writes param, m, v (the same arrays: in place;
 * otherwise the sources are left untouched); the gradient is grad * gscale rounded to float
 * (gscale_at not NULL: the device float there, read when the kernel runs).
 * With w_out the new weights also go there as bf16 (cuda_f32_to_bf16_dev's bits), with g_clear
 * (grad itself or another array) zeros there once element i is read: the optimizer shard's
 * publish in the same pass (NULL: neither). Four elements at a time where all the arrays share
 * their alignment (any alignment gives the same bits). stream may be NULL. */
int cuda_adamw(float *param, float *m, float *v, const float *param0, const float *m0, const float *v0,
               const float *grad, float gscale, const float *gscale_at, size_t n, float lr, float beta1,
               float beta2, float eps, float wd, int step, uint16_t *w_out, float *g_clear, void *stream);

/* Plain device memory helpers for tests and host code. */
int cuda_alloc(void **p, size_t bytes);
int cuda_free(void *p);
int cuda_copy_to_device(void *dst, const void *src, size_t bytes);
int cuda_copy_to_host(void *dst, const void *src, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
