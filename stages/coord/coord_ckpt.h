/* Checkpoints during the run (coord_ckpt.c): SNAPSHOT to the shards, SAVE to checkpointd (across
 * hosts SAVE_PART to every host, then COMMIT), and the newest whole snapshot in the staging
 * segment, which a GPU job rewinds to. At most one in flight. */
#ifndef CTITAN_COORD_CKPT_H
#define CTITAN_COORD_CKPT_H

#include "stages/coord/coord_core.h"

/* Its state, its messages (SNAPPED, SAVED, WRITTEN) and hooks (checkpointd ready, restarted)
 * into the registry. Returns 0 or -ENOMEM. */
int coord_ckpt_init(coord_t *c);
void coord_ckpt_free(coord_t *c);
/* Training starts: the staging segment holds the whole state of step `whole` (a resumed
 * checkpoint that stays there until the first snapshot), or none (-1). */
void coord_ckpt_begin(coord_t *c, int64_t whole);
/* After `done` steps: a snapshot to the staging segment, then checkpointd writes it. Returns
 * 0, COORD_REWOUND (waiting for the previous one, the job was rewound: none is taken) or -1. */
int coord_start_checkpoint(coord_t *c, int64_t done);
/* After `done` steps, none in flight: an in-memory snapshot only (checkpoint.snapshot_interval),
 * what a GPU job rewinds to. */
void coord_start_snapshot(coord_t *c, int64_t done);
/* Waits for the checkpoint in flight. Returns 0, COORD_REWOUND, or -1 once the job failed or
 * was interrupted. */
int coord_ckpt_wait(coord_t *c);
/* Whether a checkpoint or snapshot is in flight, and of which step. */
int coord_ckpt_busy(const coord_t *c, int64_t *step);
/* The newest whole snapshot in the staging segment: its step (-1: none is whole), when that
 * step ended, and how many this run made whole (a resumed checkpoint counts). */
int64_t coord_ckpt_whole(const coord_t *c, double *at, int *count);
/* A rewind: a snapshot being taken is dropped (its shards are gone: taken again when its step
 * is); one that checkpointd is writing goes on. */
void coord_ckpt_drop(coord_t *c);
/* Shard p was replaced: it gets again the SNAPSHOT it owed (before any round: commands come in
 * order). */
void coord_ckpt_resend(coord_t *c, coord_proc_t *p);
/* After the last step: a run whose last checkpoint was not written fails (its final state is
 * not saved), saying why and how many of its checkpoints were written. */
void coord_ckpt_check_last(coord_t *c);

#endif
