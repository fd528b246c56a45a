/* In-place recovery (coord_recover.c; DESIGN.md "Recovery"): a stage or optimizer shard that
 * dies, stops or wedges during training is replaced alone, with every stage, or by a rewind, as
 * the job's data plane declares. */
#ifndef CTITAN_COORD_RECOVER_H
#define CTITAN_COORD_RECOVER_H

#include "stages/coord/coord_core.h"

/* The registry's recovery policy (which losses are recovered, a loss, the recovery) and its
 * messages (ABORTED, REMAPPED). Returns 0 or -ENOMEM. */
int coord_recover_init(coord_t *c);
void coord_recover_free(coord_t *c);
/* This run's in-place recoveries, and the last one's reason (`ctitan status`). */
int coord_recoveries(const coord_t *c, const char **last);

#endif
