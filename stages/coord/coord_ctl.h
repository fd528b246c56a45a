/* The coordinator's control plane (coord_ctl.c): the pump that waits on the ROUTER socket and
 * the signals and runs the registry's handlers and hooks, round trips of one step's commands,
 * sending. */
#ifndef CTITAN_COORD_CTL_H
#define CTITAN_COORD_CTL_H

#include "stages/coord/coord_core.h"

/* The workers' common messages (hello, ready, heartbeat, error, the rounds' replies) into the
 * registry. */
void coord_ctl_init(coord_t *c);
/* Handles events until cond(c, arg) holds. Returns 0, -1 once the job failed or was
 * interrupted, or -ETIMEDOUT after `timeout` seconds. */
int coord_pump(coord_t *c, int (*cond)(coord_t *, void *), void *arg, double timeout);
/* The same without a timeout, recovering (the registry's) whatever is lost meanwhile: 0 once
 * cond holds, COORD_REWOUND (the job went back to c->step) or -1. */
int coord_wait(coord_t *c, int (*cond)(coord_t *, void *), void *arg);
/* Handles control messages for up to `secs` until the job has failed (a worker's report
 * arriving after its exit). */
void coord_drain_errors(coord_t *c, double secs);
void coord_send(coord_t *c, coord_proc_t *p, msg_t *m);
void coord_reply_cli(coord_t *c, const char *to, int ok, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Sends m to procs [first, first+count) and waits for each one's reply to this step. Returns
 * 0, COORD_REWOUND, or -1. */
int coord_round_trip(coord_t *c, int first, int count, msg_t *m);
/* pump conditions */
int coord_all_ready(coord_t *c, void *arg);       /* every process not told to stop */
int coord_proc_gone(coord_t *c, void *proc);
int coord_proc_ready(coord_t *c, void *proc);

#endif
