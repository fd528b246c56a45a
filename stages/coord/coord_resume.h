/* checkpoint.load (coord_resume.c): the LOAD exchange with checkpointd before the others
 * start, and where the run started. */
#ifndef CTITAN_COORD_RESUME_H
#define CTITAN_COORD_RESUME_H

#include "stages/coord/coord_core.h"
#include "stages/job/ldr_info.h"

/* Where this run started. */
typedef struct {
    int64_t first_step;               /* after the checkpoint it resumed, or 0 */
    int fresh;                        /* from the initial weights (no checkpoint loaded) */
    char load[sizeof(((manifest_t *)0)->ckpt_load)]; /* checkpoint.load as resolved ("" when fresh) */
    uint8_t cursor[LDR_CURSOR_MAX];   /* the loader cursor it started at */
    size_t cursor_len;
} coord_start_t;

/* LOADED into the registry. Returns 0 or -ENOMEM. */
int coord_resume_init(coord_t *c);
void coord_resume_free(coord_t *c);
/* checkpoint.load through checkpointd; then the run's start is known (coord_resume_start).
 * Returns 0 (c->step is the first step), -1 when the job failed or was interrupted meanwhile,
 * or -errno with checkpointd's reason in err. */
int coord_resume(coord_t *c, char *err, size_t errlen);
const coord_start_t *coord_resume_start(const coord_t *c);
/* The same on a host's agent (job.hosts > 1), which has no control socket for a LOADED: a
 * checkpointd that loads checkpoint directory `dir` into this host's staging segment once and
 * exits (`--load`); its step must be `step`. Returns 0 (the staging header holds the step and
 * the cursor) or -errno with the reason in err. */
int coord_resume_host(coord_t *c, const char *dir, int64_t step, char *err, size_t errlen);

#endif
