/* The coordinator's process table (coord_proc.c): who runs where, starting a worker, reaping it,
 * heartbeats, stopping. */
#ifndef CTITAN_COORD_PROC_H
#define CTITAN_COORD_PROC_H

#include "stages/coord/coord_core.h"

/* Every process of the job: [0] this host's loader, the stages, the shards, checkpointd, then
 * the other hosts' loaders (job.hosts > 1); reaping and the heartbeats' check into the
 * registry. Returns 0 or -ENOMEM. */
int coord_make_table(coord_t *c);
void coord_spawn(coord_t *c, coord_proc_t *p);
/* STOP to one process and waits for its exit (SIGKILL after the grace time). */
void coord_stop_proc(coord_t *c, coord_proc_t *p);
/* Clean stop: STOP to everyone, then signals for whoever lingers. */
void coord_stop_all(coord_t *c);
/* The same after a Ctrl-C: COORD_INTERRUPT_GRACE_S for STOP, half that for SIGTERM, then
 * SIGKILL, so that the job is gone within a second (a worker busy setting up reads no STOP). */
void coord_stop_all_now(coord_t *c);
/* SIGTERM to whoever still runs, `grace` seconds, then SIGKILL; reaps them all. */
void coord_terminate_all(coord_t *c, double grace);
/* No child of this process runs. */
int coord_none_running(coord_t *c);

#endif
