/* The step watchdog (coord_watchdog.c): a process that owes a reply and makes no progress for
 * job.watchdog_s (0: 10 x the median step time + 10 s, 120 s before three steps) has its stack
 * dumped (SIGABRT) and is killed; its death is a loss like any other. */
#ifndef CTITAN_COORD_WATCHDOG_H
#define CTITAN_COORD_WATCHDOG_H

#include "stages/coord/coord_core.h"

/* Its look at every pump into the registry. Returns 0 or -ENOMEM. */
int coord_watchdog_init(coord_t *c);
void coord_watchdog_free(coord_t *c);
/* A step's time, for the automatic bound. */
void coord_note_step_time(coord_t *c, double secs);

#endif
