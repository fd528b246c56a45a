/* The job's keys (coord_keys.c; DESIGN.md "Trust"). */
#ifndef CTITAN_COORD_KEYS_H
#define CTITAN_COORD_KEYS_H

#include "stages/coord/coord_core.h"
#include "stages/runtime/worker.h"

/* This host's keys: the coordinator's fresh pair, or from job.keys across hosts; on host 0 the
 * run folder with the operator's fresh key. Before the control socket exists. */
int coord_keys_setup(coord_t *c, char *err, size_t errlen);
/* Host 0, once the control socket exists and before it is bound (ZeroMQ never retries a
 * refused client): admits the operator's key, and the hosts'. */
int coord_keys_admit(coord_t *c, char *err, size_t errlen);
/* The other hosts' keys (job.keys' host<K>.pub), each admitted as "host.<K>": part of
 * coord_keys_admit, and all that coord_farewell admits. */
int coord_keys_allow_hosts(coord_t *c, char *err, size_t errlen);
/* The keys process p starts with: on host 0 a fresh pair, bound to "<id>@<start>" (the
 * previous start's revoked); on host k the host's pair. Returns 0 or -errno. */
int coord_keys_for(coord_t *c, coord_proc_t *p, worker_keys_t *k);
/* p has exited: its key admits nobody any more. */
void coord_keys_revoke(coord_t *c, coord_proc_t *p);
/* The end of the run: the run folder and the operator's key go. */
void coord_keys_remove(coord_t *c);
/* The same for the run folder of a coordinator that is gone (coord_remove_leftovers). */
void coord_keys_remove_dir(const char *run_dir);

#endif
