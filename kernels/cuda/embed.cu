// Token embedding on the GPU (bf16 table and activations, fp32 table gradient): the first piece
// of a stage that holds the embedding. CPU twins: ops_embed_fwd / ops_embed_bwd.

#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/nn_common.cuh"

#define EMBED_THREADS 256 // a multiple of 32: the backward's ballots need whole warps

// One block per token copies its row.
static __global__ void embed_fwd_kernel(uint16_t *out, const uint16_t *table, const int32_t *tok,
                                        int V, int D)
{
    int v = tok[blockIdx.x];
    bool ok = v >= 0 && v < V;
    const uint16_t *src = table + (size_t)(ok ? v : 0) * D;
    uint16_t *dst = out + (size_t)blockIdx.x * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        dst[i] = ok ? src[i] : (uint16_t)0;
}

// One block per token n; the block of the first occurrence of a token id owns that dtable row
// and adds the rows of all its occurrences in token order (the CPU's order), so there are no
// atomics and no races: every dtable element is read and written by one thread. The other
// blocks of the id return at once. Cost: O(n) token reads to find out whether n is a first
// occurrence, and for owners O(N - n) token reads per 256 columns (warp ballots make them 32 at
// a time), which is small next to the D columns of dout read per occurrence.
static __global__ void embed_bwd_kernel(float *dtable, const uint16_t *dout, const int32_t *tok,
                                        int N, int V, int D)
{
    int n = blockIdx.x;
    int v = tok[n];
    if (v < 0 || v >= V) // the same for the whole block
        return;
    int seen = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        seen |= tok[j] == v;
    if (__syncthreads_or(seen))
        return;
    int lane = threadIdx.x & 31;
    float *row = dtable + (size_t)v * D;
    // Loop bounds are uniform over the block, so every lane of every warp reaches each ballot.
    for (int c0 = 0; c0 < D; c0 += blockDim.x) {
        int c = c0 + threadIdx.x;
        float acc = c < D ? row[c] : 0.0f;
        for (int j0 = n; j0 < N; j0 += 32) {
            int j = j0 + lane;
            unsigned hits = __ballot_sync(0xffffffffu, j < N && tok[j] == v);
            while (hits) { // set bits in increasing order = token order
                int b = __ffs((int)hits) - 1;
                hits &= hits - 1;
                if (c < D)
                    acc += nn_bf16_to_f32(dout[(size_t)(j0 + b) * D + c]);
            }
        }
        if (c < D)
            row[c] = acc;
    }
}

extern "C" int cuda_embed_fwd(uint16_t *out, const uint16_t *table, const int32_t *tok, int N, int V,
                              int D, void *stream)
{
    if (!out || !table || !tok || N < 0 || V <= 0 || D <= 0)
        return cuda_nn_fail("cuda_embed_fwd: bad arguments (N %d, V %d, D %d; out, table and tok "
                            "must be device pointers)", N, V, D);
    if (N == 0)
        return 0;
    embed_fwd_kernel<<<N, EMBED_THREADS, 0, (cudaStream_t)stream>>>(out, table, tok, V, D);
    return cuda_nn_check(cudaGetLastError(), "cuda_embed_fwd launch");
}

extern "C" int cuda_embed_bwd(float *dtable, const uint16_t *dout, const int32_t *tok, int N, int V,
                              int D, void *stream)
{
    if (!dtable || !dout || !tok || N < 0 || V <= 0 || D <= 0)
        return cuda_nn_fail("cuda_embed_bwd: bad arguments (N %d, V %d, D %d; dtable, dout and tok "
                            "must be device pointers)", N, V, D);
    if (N == 0)
        return 0;
    embed_bwd_kernel<<<N, EMBED_THREADS, 0, (cudaStream_t)stream>>>(dtable, dout, tok, N, V, D);
    return cuda_nn_check(cudaGetLastError(), "cuda_embed_bwd launch");
}
