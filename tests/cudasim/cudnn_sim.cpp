// A stand-in for cuDNN's attention (kernels/cuda/cudnn_sdpa.h) on the emulator, where cuDNN
// cannot run: it lets make test drive the model's choice between cuDNN's attention and attn.cu's
// (kernels/cuda/model.cu attn_decide) through each of its outcomes. CTITAN_SIM_CUDNN says
// what "cuDNN" is: unset or empty, not loadable; "same", attn.cu's kernels (so cuDNN's results
// agree, bit for bit); "wrong", attn.cu's kernels with k in place of v (a graph with a wrong
// input: disagrees); "nobwd", a backward no engine plans. The graph check and the device
// description are cuDNN's own (tests/cudnn/test_cudnn_graph on the CPU).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tests/cudasim/sim.h"

extern "C" {
#include "kernels/cuda/cuda_attn.h"
#include "kernels/cuda/cudnn_sdpa.h"
}

enum { SAME, WRONG, NOBWD };
struct cudnn_sdpa { int mode; char err[256]; };

// Calls of the forward and backward that returned 0, for the tests to see which path ran.
extern "C" long cudnn_sim_calls[2];
long cudnn_sim_calls[2];

extern "C" int cudnn_sdpa_open(cudnn_sdpa_t **out, char *why, size_t whylen)
{
    *out = nullptr;
    const char *m = getenv("CTITAN_SIM_CUDNN");
    int mode = !m || !m[0] ? -1 : !strcmp(m, "same") ? SAME : !strcmp(m, "wrong") ? WRONG : !strcmp(m, "nobwd") ? NOBWD : -2;
    if (mode < 0) {
        snprintf(why, whylen, mode == -1 ? "cuDNN does not run on the emulator (CTITAN_SIM_CUDNN unset)"
                                         : "CTITAN_SIM_CUDNN: expected same, wrong or nobwd");
        return -ENOSYS;
    }
    *out = new cudnn_sdpa{mode, ""};
    return 0;
}
extern "C" void cudnn_sdpa_close(cudnn_sdpa_t **s) { delete *s; *s = nullptr; }
extern "C" long cudnn_sdpa_version(const cudnn_sdpa_t *) { return 0; }
extern "C" size_t cudnn_sdpa_workspace_bytes(const cudnn_sdpa_t *) { return 0; }
extern "C" const char *cudnn_sdpa_error(const cudnn_sdpa_t *s) { return s ? s->err : "no cuDNN"; }
extern "C" int cudnn_sdpa_graph_check(cudnn_sdpa_t *, int, int, int, int, int, int) { return -ENOSYS; }
extern "C" int cudnn_sdpa_device_json(cudnn_sdpa_t *, char **json) { *json = nullptr; return -ENOSYS; }

extern "C" int cudnn_sdpa_fwd(cudnn_sdpa_t *s, uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                              const uint16_t *v, int B, int T, int H, int Hkv, int hd, void *stream)
{
    int rc = cuda_attn_fwd(out, lse, q, k, s->mode == WRONG ? k : v, B, T, H, Hkv, hd, stream);
    if (rc)
        snprintf(s->err, sizeof s->err, "%s", cuda_attn_last_error());
    cudnn_sim_calls[0] += rc == 0;
    return rc;
}

extern "C" int cudnn_sdpa_bwd(cudnn_sdpa_t *s, uint16_t *dq, uint16_t *dk, uint16_t *dv, float *delta,
                              const uint16_t *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                              const uint16_t *out, const float *lse, int B, int T, int H, int Hkv, int hd,
                              void *stream)
{
    if (s->mode == NOBWD) {
        snprintf(s->err, sizeof s->err, "cuDNN attention backward: no engine plans it (emulated)");
        return -ENOTSUP;
    }
    int rc = cuda_attn_bwd(dq, dk, dv, delta, dout, q, k, s->mode == WRONG ? k : v, out, lse, B, T, H, Hkv, hd,
                           stream);
    if (rc)
        snprintf(s->err, sizeof s->err, "%s", cuda_attn_last_error());
    cudnn_sim_calls[1] += rc == 0;
    return rc;
}
