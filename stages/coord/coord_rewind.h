/* Recovery by rewinding (GPU jobs; CPU jobs with optshard.host_banks = 1) (coord_rewind.c; DESIGN.md "Recovery"). */
#ifndef CTITAN_COORD_REWIND_H
#define CTITAN_COORD_REWIND_H

#include "stages/coord/coord_core.h"

/* Every stage, shard and the loader (on every host) killed and started again from the staging
 * segment's newest whole snapshot, or from the run's first step when it started from the
 * initial weights and none is whole; `why` names the loss (blamed on `first`). Sets c->step, and
 * *since: when the state rewound to was current (the work since then is lost). Returns 0 once
 * all are ready, 0 with c->n_lost set when one was lost meanwhile (rewind again), or -1 (the job
 * failed: no snapshot to go back to). */
int coord_rewind(coord_t *c, const coord_proc_t *first, const char *why, double *since);
/* This host's segments as at the start of step `to` (host 0 and every agent): gradients, act
 * rings, device directory and commit records cleared, the loader segment made again at
 * `cursor`, and with from_staging the staging header set to the step. Sets c->step. Returns 0
 * or -errno with err. */
int coord_rewind_segments(coord_t *c, int64_t to, int from_staging, const uint8_t *cursor, size_t len, char *err,
                          size_t errlen);

#endif
