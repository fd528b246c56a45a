/* NCCL for the GPU data plane ([parallelism] data_plane = "nccl", kernels/cuda/nccl.cu):
 * communicators from an id the coordinator makes and hands out over the control plane,
 * point-to-point sends and receives between pipeline neighbours, and the reduce-scatter and
 * all-gather of data-parallel replicas. libnccl.so.2 is opened with dlopen on first use (the
 * file CTITAN_NCCL_LIB names, else the loader's search path), so CUDA jobs that do not use
 * NCCL never need it. Every function returns 0 or a negative errno-style code and
 * cuda_last_error() says why. */
#ifndef CTITAN_CUDA_NCCL_H
#define CTITAN_CUDA_NCCL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
typedef struct { unsigned char b[CUDA_NCCL_ID_BYTES]; } cuda_nccl_id_t;
typedef struct cuda_nccl cuda_nccl_t;

/* A new communicator id (ncclGetUniqueId: the calling process hosts its bootstrap root, so it
 * must live until every rank has joined). */
int cuda_nccl_id(cuda_nccl_id_t *id);
/* Joins communicator id as rank of nranks on the current device; blocks until all have. */
int cuda_nccl_init(cuda_nccl_t **c, const cuda_nccl_id_t *id, int nranks, int rank);
void cuda_nccl_destroy(cuda_nccl_t **c);
/* bytes from/to peer, queued on stream; the peer's matching call moves the same bytes. */
int cuda_nccl_send(cuda_nccl_t *c, const void *buf, size_t bytes, int peer, void *stream);
int cuda_nccl_recv(cuda_nccl_t *c, void *buf, size_t bytes, int peer, void *stream);
/* recv[count] = sum over ranks of their send[rank * count + i] (fp32; in place when
 * recv == send + rank * count). */
int cuda_nccl_reduce_scatter_f32(cuda_nccl_t *c, const float *send, float *recv, size_t count, void *stream);
/* recv[r * count + i] = rank r's send[i] (bf16 bits; in place when send == recv + rank * count). */
int cuda_nccl_all_gather_bf16(cuda_nccl_t *c, const uint16_t *send, uint16_t *recv, size_t count, void *stream);

/* recv[i] = rank root's send[i] on every rank (bf16 bits; send is only read on root, in place
 * there when recv == send). */
int cuda_nccl_broadcast_bf16(cuda_nccl_t *c, const uint16_t *send, uint16_t *recv, size_t count, int root,
                             void *stream);
/* On rank root, recv[i] = sum over ranks of their send[i] (fp32; recv is only written on root). */
int cuda_nccl_reduce_f32(cuda_nccl_t *c, const float *send, float *recv, size_t count, int root, void *stream);
/* The same in bf16 (bf16 bits; NCCL's sum: each partial sum rounded to bf16). */
int cuda_nccl_reduce_bf16(cuda_nccl_t *c, const uint16_t *send, uint16_t *recv, size_t count, int root,
                          void *stream);

#ifdef __cplusplus
}
#endif

#endif
