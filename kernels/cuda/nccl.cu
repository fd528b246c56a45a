// NCCL for the GPU data plane (cuda_nccl.h), through dlopen. On the CPU emulator
// (tests/cudasim) the same calls go to its multi-process stand-in (nccl_sim.cpp).
#include <dlfcn.h>
#include <errno.h>
#include <mutex>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_nccl.h"

static_assert(sizeof(ncclUniqueId) == sizeof(cuda_nccl_id_t), "ncclUniqueId size");

struct cuda_nccl {
    ncclComm_t comm;
    int rank, nranks;
};

/* The NCCL calls used, resolved once. */
static struct {
    ncclResult_t (*get_id)(ncclUniqueId *);
    ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                   cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                           cudaStream_t);
    const char *(*error)(ncclResult_t);
    int loaded;
    char why[400];
} api;
static std::mutex api_mu;

static int load(void)
{
    std::lock_guard<std::mutex> g(api_mu);
    if (api.loaded)
        return api.loaded > 0 ? 0 : cuda_err(-ENODEV, "%s", api.why);
#ifdef CTITAN_CUDASIM
    api.get_id = ncclGetUniqueId, api.init = ncclCommInitRank, api.destroy = ncclCommDestroy;
    api.send = ncclSend, api.recv = ncclRecv, api.reduce_scatter = ncclReduceScatter;
    api.all_gather = ncclAllGather, api.error = ncclGetErrorString;
    api.broadcast = ncclBroadcast, api.reduce = ncclReduce;
#else
    const char *path = getenv("CTITAN_NCCL_LIB");
    if (!path || !path[0])
        path = "libnccl.so.2";
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        snprintf(api.why, sizeof(api.why), "cannot load NCCL (%s): %s (set CTITAN_NCCL_LIB or LD_LIBRARY_PATH)", path,
                 dlerror());
        api.loaded = -1;
        return cuda_err(-ENODEV, "%s", api.why);
    }
#define SYM(f, name) *(void **)&api.f = dlsym(so, name)
    SYM(get_id, "ncclGetUniqueId"); SYM(init, "ncclCommInitRank"); SYM(destroy, "ncclCommDestroy");
    SYM(send, "ncclSend"); SYM(recv, "ncclRecv"); SYM(reduce_scatter, "ncclReduceScatter");
    SYM(all_gather, "ncclAllGather"); SYM(error, "ncclGetErrorString");
    SYM(broadcast, "ncclBroadcast"); SYM(reduce, "ncclReduce");
#undef SYM
    if (!api.get_id || !api.init || !api.destroy || !api.send || !api.recv || !api.reduce_scatter ||
        !api.all_gather || !api.error || !api.broadcast || !api.reduce) {
        snprintf(api.why, sizeof(api.why), "%s lacks the NCCL 2.7+ calls ctitan uses", path);
        api.loaded = -1;
        return cuda_err(-ENODEV, "%s", api.why);
    }
#endif
    api.loaded = 1;
    return 0;
}

static int nc(ncclResult_t r, const char *what)
{
    return r == ncclSuccess ? 0 : cuda_err(-EIO, "%s: %s", what, api.error(r));
}

extern "C" int cuda_nccl_id(cuda_nccl_id_t *id)
{
    int rc = load();
    if (rc)
        return rc;
    ncclUniqueId u;
    if ((rc = nc(api.get_id(&u), "ncclGetUniqueId")))
        return rc;
    memcpy(id, &u, sizeof(u));
    return 0;
}

extern "C" int cuda_nccl_init(cuda_nccl_t **out, const cuda_nccl_id_t *id, int nranks, int rank)
{
    *out = NULL;
    int rc = load();
    if (rc)
        return rc;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return cuda_err(-EINVAL, "NCCL rank %d of %d", rank, nranks);
    cuda_nccl_t *c = (cuda_nccl_t *)calloc(1, sizeof(*c));
    if (!c)
        return cuda_err(-ENOMEM, "out of memory");
    ncclUniqueId u;
    memcpy(&u, id, sizeof(u));
    if ((rc = nc(api.init(&c->comm, nranks, u, rank), "ncclCommInitRank"))) {
        free(c);
        return rc;
    }
    c->rank = rank, c->nranks = nranks;
    *out = c;
    return 0;
}

extern "C" void cuda_nccl_destroy(cuda_nccl_t **pc)
{
    if (!*pc)
        return;
    api.destroy((*pc)->comm);
    free(*pc);
    *pc = NULL;
}

extern "C" int cuda_nccl_send(cuda_nccl_t *c, const void *buf, size_t bytes, int peer, void *stream)
{
    return nc(api.send(buf, bytes, ncclUint8, peer, c->comm, (cudaStream_t)stream), "ncclSend");
}

extern "C" int cuda_nccl_recv(cuda_nccl_t *c, void *buf, size_t bytes, int peer, void *stream)
{
    return nc(api.recv(buf, bytes, ncclUint8, peer, c->comm, (cudaStream_t)stream), "ncclRecv");
}

extern "C" int cuda_nccl_reduce_scatter_f32(cuda_nccl_t *c, const float *send, float *recv, size_t count,
                                            void *stream)
{
    return nc(api.reduce_scatter(send, recv, count, ncclFloat32, ncclSum, c->comm, (cudaStream_t)stream),
              "ncclReduceScatter");
}

extern "C" int cuda_nccl_all_gather_bf16(cuda_nccl_t *c, const uint16_t *send, uint16_t *recv, size_t count,
                                         void *stream)
{
    return nc(api.all_gather(send, recv, count, ncclBfloat16, c->comm, (cudaStream_t)stream), "ncclAllGather");
}

extern "C" int cuda_nccl_broadcast_bf16(cuda_nccl_t *c, const uint16_t *send, uint16_t *recv, size_t count, int root,
                                        void *stream)
{
    return nc(api.broadcast(send, recv, count, ncclBfloat16, root, c->comm, (cudaStream_t)stream), "ncclBroadcast");
}

extern "C" int cuda_nccl_reduce_f32(cuda_nccl_t *c, const float *send, float *recv, size_t count, int root,
                                    void *stream)
{
    return nc(api.reduce(send, recv, count, ncclFloat32, ncclSum, root, c->comm, (cudaStream_t)stream), "ncclReduce");
}

extern "C" int cuda_nccl_reduce_bf16(cuda_nccl_t *c, const uint16_t *send, uint16_t *recv, size_t count, int root,
                                     void *stream)
{
    return nc(api.reduce(send, recv, count, ncclBfloat16, ncclSum, root, c->comm, (cudaStream_t)stream), "ncclReduce");
}
