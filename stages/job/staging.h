/* The staging segment (ctitan.<job>.ckpt) between the optimizer shards and checkpointd: at a
 * checkpoint step each shard copies its slice of the training state (the fp32 master weights
 * and the optimizer's state arrays: kernels/optim.h) here (it is idle while the next step's forward and backward run), the coordinator adds the
 * step and the loader cursor, and checkpointd streams it to disk (or to a remote checkpointd)
 * while training goes on. One snapshot at a time: the coordinator starts the next only after
 * checkpointd has answered for the previous one. On resume the other way round: checkpointd
 * reads the checkpoint into it, step and cursor included (checkpointd/restore.h), before the
 * shards start, and each shard copies its slice out as it sets up.
 *
 *   header (4 KiB)   staging_hdr_t
 *   arrays           the optimizer's (optim_arrays): the master weights, then its state
 *                    arrays; `total` floats each, `stride` apart (a multiple of 1024 floats,
 *                    so every array is 4 KiB-aligned) */
#ifndef CTITAN_STAGING_H
#define CTITAN_STAGING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc/shm.h"

#define STAGING_SEG "ckpt"
#define STAGING_MAGIC 0x3154504b43544943ULL /* "CITCKPT1" */
#define STAGING_VERSION 1u
#define STAGING_HDR 4096

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t arrays;             /* the training state's arrays (optim_arrays) */
    uint64_t total;              /* floats per array */
    uint64_t stride;             /* floats between arrays */
    _Atomic int64_t step;        /* steps completed in the snapshot; -1 when none */
    uint32_t cursor_len;         /* loader cursor at the start of the next step */
    uint8_t cursor[240];
} staging_hdr_t;

static inline size_t staging_stride(size_t total) { return (total + 1023) / 1024 * 1024; }
static inline size_t staging_bytes(size_t total, int arrays)
{
    return STAGING_HDR + (size_t)arrays * staging_stride(total) * sizeof(float);
}
/* Creates ctitan.<job>.ckpt for `arrays` arrays of `total` floats, its header formatted with no
 * snapshot in it (step -1). Returns 0 or -errno with err. The caller owns *out. */
int staging_create(shm_seg_t **out, const char *job, size_t total, int arrays, char *err, size_t errlen);
/* 0 when seg holds a staging segment of this version for `arrays` arrays of `total` floats;
 * -EINVAL with err saying what it holds. */
int staging_check(const void *seg, size_t total, int arrays, char *err, size_t errlen);
/* Array a (0 the master weights, then the optimizer's state arrays) of a mapped segment. */
static inline float *staging_array(void *seg, int a)
{
    const staging_hdr_t *h = seg;
    return (float *)((char *)seg + STAGING_HDR + (size_t)a * h->stride * sizeof(float));
}

#endif
