/* Parameter sharding's reduce-scatter on one host (DESIGN.md "Parameter sharding"): the fsdp
 * replicas of a group compute on one shared copy of their stage's weights (the params segment:
 * shared memory is the all-gather) and gradients, and each is the owner of 1/fsdp of every
 * piece's gradients. A replica's model hands each piece's weight gradients of a microbatch to
 * this exchange (a shard_io_t's take and give) instead of adding them into the copy: it writes
 * them into its own buffer of the fsdp segment, and once every member has, each adds the sum of
 * the members' buffers, in member order, into the part of the copy it owns; then the buffers
 * are free for the next piece. Members wait for each other on futexes on their sequence numbers; every
 * member of a group runs the same schedule, so they hand over the same pieces in the same
 * order. The coordinator closes the exchanges for a recovery (job_fsdp_set_closed): every wait
 * returns -ECANCELED. */
#ifndef CTITAN_FSDP_H
#define CTITAN_FSDP_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/params.h"
#include "stages/job/job.h"

typedef struct fsdp fsdp_t;

/* Member `member` of group `group`'s exchange for virtual stage `vstage` in the fsdp segment
 * `seg`; grads: the group's copy of the gradients (the flat space from offset 0). The seconds
 * spent waiting for the other members add to *waited; waiting(arg, on) is called around each
 * such wait (may be NULL). */
int fsdp_new(fsdp_t **out, void *seg, const job_layout_t *l, int group, int member, int vstage, float *grads,
             double *waited, void (*waiting)(void *arg, int on), void *arg, char *err, size_t errlen);
void fsdp_destroy(fsdp_t **x);
/* At the start of each step (and of a step done again): the sequence numbers of its pieces. */
void fsdp_step(fsdp_t *x, int64_t step);
/* What to give the model (backend_t.model_shard): no weights to gather, the exchange's take and give. */
shard_io_t fsdp_io(fsdp_t *x);

#endif
