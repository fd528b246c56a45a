/* The coordinator of `ctitan launch`: owns the resolved manifest, the job's shared segments,
 * the control ROUTER and the step clock; starts, supervises and stops every process of the
 * job. With checkpoint.load, checkpointd first loads the checkpoint into the staging segment
 * (LOAD ... LOADED) and the run starts after its step. One training step is three rounds over
 * the control plane:
 *   STEP -> every stage      ... STEP_DONE (loss from the last ranks, per-action times)
 *   REDUCE -> every optshard ... REDUCED   (norm partials in the job segment)
 *   UPDATE -> every optshard ... UPDATED   (with the clip factor of the global norm)
 * Between rounds it reacts to whatever else happens: heartbeats, a process exiting (the
 * loader is restarted from its cursor; anything else fails the job), errors, Ctrl-C, and
 * `ctitan loader swap` requests, which it carries out at the next step boundary. */
#ifndef CTITAN_COORD_H
#define CTITAN_COORD_H

#include "stages/manifest.h"

/* Runs the job to the end. Returns the process exit status: 0 done, 1 failed (the reason,
 * naming the role, rank and replica, is printed), 130 interrupted. */
int coord_run(const manifest_t *m);

#endif
