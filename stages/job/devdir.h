/* The GPU data plane's directory: the shared segment ctitan.<job>.dev (created by the
 * coordinator when job.device = "cuda") where each stage process publishes the CUDA IPC
 * handles of its device buffers, so its pipeline neighbours and the optimizer shards can map
 * them. One entry per stage (replica r, rank s), at devdir_stage(seg, l, r, s):
 *
 *   devdir_stage_t   ready flag (set last), device, pid, the stage's range [begin, end) of
 *                    the flat space and the handles of its weights (bf16) and gradients (fp32);
 *                    on the IPC plane with GPU shards the handle of the event it records once
 *                    a step's gradients are complete (plane_step_end: the shards' streams wait
 *                    on it before they read them, and the stage does not wait for its device)
 *   ring act         its outgoing activation ring (to rank s+1; unused on the last rank):
 *                    the handle of M slots of act_slot bytes (bf16 [mb*T, dim]) and 2 x M
 *                    interprocess events: written[i] (recorded by the producer after
 *                    filling slot i) and read[i] (recorded by the consumer once it copied it)
 *   ring grad        its outgoing gradient ring (to rank s-1; unused on rank 0), the same
 *
 * The rings are the IPC data plane's (stages/runtime/plane_ipc.c), which orders them with the act
 * segment's shm rings of the same boundaries (job.h), whose slots then carry no payload.
 *
 * After the stages' entries, one per optimizer shard k (GPU shards), at devdir_shard(seg, l, k):
 *
 *   devdir_shard_t   ready flag, pid, and the handle of the interprocess event the shard records
 *                    on its stream once an UPDATE has written the new weights into the stages
 *                    (and cleared their gradients): each stage's stream waits on every shard's
 *                    before its next step's work (plane_step_begin), so the shard answers the
 *                    UPDATE without waiting for its device, and the stage queues its next step
 *                    while the update still runs. A stage started again (a recovery) finds the
 *                    shards' entries as they were: only the stages' part is cleared then.
 *                    With the norm on the device (job_layout_t norm_on_device), also the
 *                    handle of its slice's block norms (two steps' worth: even, odd), the
 *                    event it records once a step's are in, and that step's number, stored
 *                    once the record is issued (stages/runtime/devnorm.h). */
#ifndef CTITAN_DEVDIR_H
#define CTITAN_DEVDIR_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_dev.h"
#include "stages/job/job.h"

#define DEVDIR_SEG "dev"

typedef struct {
    _Atomic uint32_t ready;  /* 1 once every field and both rings are filled */
    int32_t device, pid, pad;
    uint64_t begin, end;     /* the stage's range of the flat parameter space */
    cuda_ipc_mem_t w, g;     /* (end - begin) bf16 weights, (end - begin) fp32 gradients */
    cuda_ipc_event_t done;   /* IPC plane, GPU shards: recorded after each step's gradients */
} devdir_stage_t;

typedef struct {
    cuda_ipc_mem_t *slots;              /* M slots of l->dev_slot bytes */
    cuda_ipc_event_t *written, *read;   /* (M) each */
} devdir_ring_t;

typedef struct {
    _Atomic uint32_t ready;  /* 1 once the event is there (and the norm's part, with it) */
    int32_t pid;
    cuda_ipc_event_t updated;
    cuda_ipc_mem_t norms;    /* (2, nblocks) doubles: the block norms of even steps, then of odd */
    cuda_ipc_event_t normed; /* recorded once a step's block norms are in */
    uint64_t block0, nblocks; /* the slice's blocks of the flat space */
    _Atomic int64_t normed_step; /* the step whose `normed` record is issued (-1: none yet) */
} devdir_shard_t;

/* The segment's size: the stages' part, then the shards' entries. */
size_t devdir_bytes(const job_layout_t *l);
size_t devdir_stages_bytes(const job_layout_t *l);
devdir_stage_t *devdir_stage(void *seg, const job_layout_t *l, int replica, int rank);
devdir_shard_t *devdir_shard(void *seg, const job_layout_t *l, int k);
/* Shard k's entry once it is filled (polled every ms); NULL after timeout_ms. */
devdir_shard_t *devdir_shard_wait(void *seg, const job_layout_t *l, int k, int timeout_ms);
/* The entry of stage (replica, rank) once its owner has filled it (polled every ms while the
 * stage sets up); NULL after timeout_ms. */
devdir_stage_t *devdir_wait(void *seg, const job_layout_t *l, int replica, int rank, int timeout_ms);
/* The stage's outgoing ring: activations (grad = 0) or gradients (grad = 1). */
devdir_ring_t devdir_ring(devdir_stage_t *e, const job_layout_t *l, int grad);

#endif
