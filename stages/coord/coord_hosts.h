/* Host 0's side of the other hosts' agents (coord_hosts.c; job.hosts > 1): their hello and
 * heartbeats, START (where the run begins) and STOP, a worker of theirs lost (LOST), and the
 * messages the other concerns send them. */
#ifndef CTITAN_COORD_HOSTS_H
#define CTITAN_COORD_HOSTS_H

#include "stages/coord/coord_core.h"

/* On host 0 of a job across hosts: the agents' table, their messages and the check that each
 * is heard from (every pump) into the registry; elsewhere nothing. Returns 0 or -ENOMEM. */
int coord_hosts_init(coord_t *c);
void coord_hosts_free(coord_t *c);
/* Whether this coordinator has other hosts' agents. */
int coord_hosts_any(const coord_t *c);
/* START to every agent connected and not started yet: the run begins after step `step`, from
 * checkpoint directory `load` ("" or NULL: the initial weights) at loader cursor `cursor`; an
 * agent that says hello later gets it then. */
void coord_hosts_start(coord_t *c, int64_t step, const char *load, const uint8_t *cursor, size_t len);
/* Pump condition: every other host's agent has been sent START. */
int coord_hosts_started(coord_t *c, void *arg);
/* The hosts whose agents have not been sent START, "1, 3". Returns buf. */
const char *coord_hosts_missing(coord_t *c, char *buf, size_t n);
/* The job has ended (done, or stopped by a signal): STOP to every agent, which ends its host's
 * part; sent so that it goes out before the socket closes. */
void coord_hosts_stop(coord_t *c);
/* m to host h's agent: 0, or -EHOSTUNREACH when it never connected, or ctl_send's -errno. */
int coord_hosts_send(coord_t *c, int h, const msg_t *m);
/* Host h's agent's pid, from its hello (0: none). */
int64_t coord_hosts_pid(const coord_t *c, int h);

#endif
