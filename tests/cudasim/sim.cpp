// The emulator's per-thread state and the stand-ins for cuda_ops.h's runtime helpers (host memory).
#include "sim.h"
thread_local uint3_ threadIdx, blockIdx;
thread_local dim3 gridDim, blockDim;
thread_local unsigned char *sim_smem;
thread_local size_t sim_smem_size;
thread_local BlockSync *sim_bs;
extern "C" {
static char msg[64] = "no error";
int cuda_device_count(void) { return 1; }
const char *cuda_last_error(void) { return msg; }
int cuda_alloc(void **p, size_t b) { if (posix_memalign(p, 256, b)) return -12; memset(*p, 0xff, b); return 0; }
int cuda_free(void *p) { free(p); return 0; }
int cuda_copy_to_device(void *d, const void *s, size_t b) { memcpy(d, s, b); return 0; }
int cuda_copy_to_host(void *d, const void *s, size_t b) { memcpy(d, s, b); return 0; }
}
