// The products of kernels/cuda/cuda_matmul.h in plain C++ for the emulator (cuBLASLt cannot be
// emulated): same layouts and semantics, fp32 accumulation, one bf16 rounding of bf16 results.
// Each product is queued on its stream like a kernel. It lets the CUDA model
// (kernels/cuda/model.cu) run in make test; the cuBLASLt mapping itself
// (kernels/cuda/matmul.cu) is checked only by tests/gpu/test_cuda_matmul on a GPU.
#include <cerrno>
#include <cstdlib>

#include "tests/cudasim/sim.h"

extern "C" {
#include "kernels/cuda/cuda_matmul.h"
}

struct cuda_matmul_ctx { int unused; };

static float f(uint16_t h) { return __bfloat162float(__nv_bfloat16{h}); }
static uint16_t b(float x) { return __float2bfloat16(x).x; }

extern "C" int cuda_matmul_ctx_new(cuda_matmul_ctx_t **out) { *out = new cuda_matmul_ctx{0}; return 0; }
extern "C" void cuda_matmul_ctx_destroy(cuda_matmul_ctx_t **c) { delete *c; *c = nullptr; }
extern "C" const char *cuda_matmul_last_error(void) { return "sim"; }
extern "C" int cuda_matmul_peak_tflops(int, double *t) { *t = 0; return -ENODEV; }

extern "C" int cuda_matmul_fwd(cuda_matmul_ctx_t *, uint16_t *y, const uint16_t *x, const uint16_t *w, int N, int Din,
                               int Dout, void *stream)
{
    sim_enqueue(stream, [=] {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < Dout; o++) {
            float s = 0;
            for (int i = 0; i < Din; i++)
                s += f(x[(size_t)n * Din + i]) * f(w[(size_t)o * Din + i]);
            y[(size_t)n * Dout + o] = b(s);
        }
    });
    return 0;
}

extern "C" int cuda_matmul_bwd_x(cuda_matmul_ctx_t *, uint16_t *dx, const uint16_t *dy, const uint16_t *w, int N,
                                 int Din, int Dout, int accumulate, void *stream)
{
    sim_enqueue(stream, [=] {
    for (int n = 0; n < N; n++)
        for (int i = 0; i < Din; i++) {
            float s = 0;
            for (int o = 0; o < Dout; o++)
                s += f(dy[(size_t)n * Dout + o]) * f(w[(size_t)o * Din + i]);
            uint16_t *d = &dx[(size_t)n * Din + i];
            *d = b(accumulate ? f(*d) + s : s);
        }
    });
    return 0;
}

extern "C" int cuda_matmul_bwd_w(cuda_matmul_ctx_t *, float *dw, const uint16_t *dy, const uint16_t *x, int N, int Din,
                                 int Dout, void *stream)
{
    sim_enqueue(stream, [=] {
    for (int o = 0; o < Dout; o++)
        for (int i = 0; i < Din; i++) {
            float s = 0;
            for (int n = 0; n < N; n++)
                s += f(dy[(size_t)n * Dout + o]) * f(x[(size_t)n * Din + i]);
            dw[(size_t)o * Din + i] += s;
        }
    });
    return 0;
}
