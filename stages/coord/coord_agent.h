/* The agent of a host other than the coordinator's (coord_agent.c; job.host_rank > 0). */
#ifndef CTITAN_COORD_AGENT_H
#define CTITAN_COORD_AGENT_H

#include "stages/coord/coord_core.h"

/* Connects to the coordinator and waits for its START, starts this host's processes, follows
 * them, tells the coordinator of a lost one, carries out its REWIND and writes this host's part
 * of each checkpoint (SAVE_PART); when the coordinator is lost (its heartbeat answers stop, or
 * another one answers) it stops them and waits for a coordinator again, job.host_timeout_s at
 * most. Returns the exit status. */
int coord_agent(coord_t *c);

#endif
