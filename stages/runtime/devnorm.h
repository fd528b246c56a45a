/* GPU optimizer shards making the gradient's clip factor on the device, between themselves
 * (job_layout_t norm_on_device: GPU shards on one host's IPC plane). Each shard writes its
 * slice's block norms into device memory it shares through its device directory entry
 * (devdir_shard_t: the memory, an event recorded once a step's are in, and that step's number,
 * set on the host once the record is issued); every shard then waits for the others' events on
 * its stream and sums all the blocks itself, in kernels/norm_order.h's order (the coordinator's
 * own sum on the host, bit for bit), into the clip factor its AdamW reads from device memory.
 * So a step needs no REDUCE round and no host read before the update: the shard answers UPDATE
 * with the norm read back once the sum is done, its AdamW already queued behind it.
 *
 * Order: a shard issues its record, then says so in its entry, then waits (on the host) until
 * every other shard has said so for the same step, and only then makes its stream wait on their
 * events: a stream waits on an event's last record issued, which must be this step's. The
 * block norms of even and odd steps go to two halves, so a shard writing step s + 1's never
 * overwrites what another shard's sum of step s still reads: that sum is done before its shard
 * answers the UPDATE of step s, which the coordinator waits for before any UPDATE of s + 1. */
#ifndef CTITAN_DEVNORM_H
#define CTITAN_DEVNORM_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "stages/job/job.h"

typedef struct devnorm devnorm_t;

/* Shard k's part, for its slice [begin, end) of the flat space (starting at a block boundary)
 * on `stream` of backend be (CUDA): its memory and event made and published in job's device
 * directory (its entry's ready flag still unset: the caller's plane_reduce_new sets it). Returns
 * 0 or -errno with err. */
int devnorm_new(devnorm_t **out, const job_layout_t *l, const char *job, int k, size_t begin, size_t end,
                const backend_t *be, void *stream, char *err, size_t errlen);
void devnorm_destroy(devnorm_t **d);
/* Where the block norms of step `step` go (device memory, the slice's blocks in order). */
double *devnorm_blocks(devnorm_t *d, int64_t step);
/* Once this step's block norms are queued on the stream: records that, waits for every other
 * shard's (the host until each has recorded this step's, within timeout_ms, then the stream),
 * queues the sum and the clip factor for max_norm, and its read back. *scale: the factor in
 * device memory, for the optimizer's step queued after this (optim_args_t gscale_at). Returns
 * 0 or -errno (devnorm_error says why). */
int devnorm_clip(devnorm_t *d, int64_t step, double max_norm, int timeout_ms, const float **scale);
/* The squared norm devnorm_clip summed, once its read back is done (the host waits for that
 * only, not for what was queued after it). */
int devnorm_read(devnorm_t *d, double *sq);
const char *devnorm_error(const devnorm_t *d);

#endif
