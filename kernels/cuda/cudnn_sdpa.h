/* cuDNN's fused flash attention (cuDNN 9's graph API) as the model's attention on the GPU, in
 * place of kernels/cuda/attn.cu's kernels: the same causal grouped-query attention with the same
 * layouts and outputs (cuda_attn.h), so either may run a layer's forward and the other its
 * backward. cuDNN is loaded at run time (dlopen: CTITAN_CUDNN_LIB, else libcudnn.so.9 by the
 * loader's search path), never linked: its libraries are far over what a lent GPU machine is
 * carried, and a machine without it trains on attn.cu's kernels.
 *
 * The operation graphs are the ones cudnn-frontend builds for its composite SDPA nodes (causal
 * mask top-left aligned, softmax statistics out of the forward, bf16 in and out, fp32 inside),
 * written against the backend API: built without a device (cudnn_sdpa_graph_check), then planned
 * per shape on the device by cuDNN's heuristics. The backward is the deterministic one (dQ as a
 * plain product, no atomic accumulation), and an engine whose numerical notes say
 * "nondeterministic" is passed over: a replayed step gives the same bits, as recovery and
 * resume promise.
 *
 * Every call returns 0 or a negative errno-style code (-ENOSYS: cuDNN not loadable or not
 * built in; -ENOTSUP: no engine for the shape; -EINVAL, -ENOMEM, -EIO) and cudnn_sdpa_error()
 * says why. One object per thread and device. */
#ifndef CTITAN_CUDNN_SDPA_H
#define CTITAN_CUDNN_SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cudnn_sdpa cudnn_sdpa_t;

/* Loads cuDNN (no device needed). -ENOSYS with the reason when it cannot. */
int cudnn_sdpa_open(cudnn_sdpa_t **out, char *why, size_t whylen);
void cudnn_sdpa_close(cudnn_sdpa_t **s);
/* Loaded library's version (e.g. 91900). */
long cudnn_sdpa_version(const cudnn_sdpa_t *s);

/* Builds and finalizes the forward (bwd 0) or backward operation graph for the shape, without a
 * device: the check that the graph is well formed, and what the tests run on a CPU machine. */
int cudnn_sdpa_graph_check(cudnn_sdpa_t *s, int bwd, int B, int T, int H, int Hkv, int hd);

/* cuda_attn_fwd / cuda_attn_bwd's contracts (q, out, dq, dout [B,T,H,hd]; k, v, dk, dv
 * [B,T,Hkv,hd]; lse and delta [B,H,T] fp32, delta caller-owned scratch), on the given stream.
 * The first call for a shape plans it (heuristics, a device workspace grown as needed). */
int cudnn_sdpa_fwd(cudnn_sdpa_t *s, uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                   const uint16_t *v, int B, int T, int H, int Hkv, int hd, void *stream);
int cudnn_sdpa_bwd(cudnn_sdpa_t *s, uint16_t *dq, uint16_t *dk, uint16_t *dv, float *delta,
                   const uint16_t *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                   const uint16_t *out, const float *lse, int B, int T, int H, int Hkv, int hd,
                   void *stream);

/* cuDNN's description of the current device (its DEVICEPROP descriptor's JSON, cuDNN >= 9.8), in
 * a malloc'd string: what lets heuristics and plans be asked for this GPU on a machine without
 * one (the next step of test_cudnn_graph once a lease has written it). */
int cudnn_sdpa_device_json(cudnn_sdpa_t *s, char **json);

/* Plans the shape for the device device_json describes (cudnn_sdpa_device_json's form), without a
 * device: the engine cuDNN's heuristics pick first among the deterministic ones that finalize,
 * and its workspace bytes. What tells, on a CPU machine, whether cuDNN's fused engines take the
 * graphs at all. */
int cudnn_sdpa_plan_for(cudnn_sdpa_t *s, const char *device_json, int bwd, int B, int T, int H, int Hkv, int hd,
                        long long *engine, long long *workspace);

/* Device bytes of the workspace the plans so far need (one buffer, shared by every plan). */
size_t cudnn_sdpa_workspace_bytes(const cudnn_sdpa_t *s);
/* The last failure's text. */
const char *cudnn_sdpa_error(const cudnn_sdpa_t *s);

#ifdef __cplusplus
}
#endif

#endif
