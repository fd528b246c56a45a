/* What a supervised run tells its supervisor (coord_outcome.c; coord.h coord_outcome_t); each
 * does nothing without a supervisor. */
#ifndef CTITAN_COORD_OUTCOME_H
#define CTITAN_COORD_OUTCOME_H

#include "stages/coord/coord_core.h"

/* Training starts after step c->step (the resumed checkpoint's). */
void coord_note_start(coord_t *c);
/* Step c->step has ended. */
void coord_note_step(coord_t *c);
/* A checkpoint of `done` steps begins (its step has just ended), and later: it was saved. */
void coord_note_checkpoint(coord_t *c, int64_t done);
void coord_note_saved(coord_t *c, int64_t step);
/* checkpointd could not load checkpoint.load (the run then fails, saying why). */
void coord_note_load_failed(coord_t *c);
/* The run fails with this reason, blamed on c->culprit (NULL: the coordinator). */
void coord_note_failure(coord_t *c, const char *why);

#endif
