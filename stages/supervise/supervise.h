/* The supervisor of `ctitan launch` on host 0, of one host or many (issue 13; torchrun's
 * --max-restarts is the model). It runs the coordinator (stages/coord/coord.h) in a child with a process group of its own,
 * which every process of the job shares, and passes SIGINT, SIGTERM and SIGHUP on to it. When
 * the job fails (the coordinator exits 1, or dies of a signal) it kills what is left of the
 * group, removes what the coordinator could not (segments, control socket, operator key), and
 * relaunches the job from its newest complete checkpoint, after a doubling wait; at most
 * job.max_restarts times in a row from the same step. Each restart is one line on the progress
 * output and one record in metrics.file. Across hosts the other hosts' agents outlive the
 * coordinator they lose and join the relaunched one (stages/coord/coord_agent.c). */
#ifndef CTITAN_SUPERVISE_H
#define CTITAN_SUPERVISE_H

#include <stdint.h>

#include "stages/job/manifest.h"

/* Runs job m (validated; job.host_rank 0) to its end under supervision. Returns the exit
 * status: 0 done; 1 failed and not restarted (no step ever completed, job.max_restarts
 * reached, or a supervisor error: each said on stderr); the coordinator's own status
 * otherwise (128 + signal after SIGINT, SIGTERM or SIGHUP, which are never followed by a
 * restart). */
int sup_run(const manifest_t *m);

/* The restart policy. A failed run started after step `from`; the next would resume after
 * step `resume`; `in_a_row` restarts in a row resumed after `from` already. Returns the number
 * in a row the restart would be (1 when `resume` is past `from`: progress resets the count),
 * or 0 when that exceeds max_restarts: no restart. */
int sup_restart_number(int in_a_row, int64_t from, int64_t resume, int max_restarts);

/* The wait before restart number `in_a_row` of a row (1, 2, ...): base_ms doubled for each
 * restart of the row after the first, at most MANIFEST_MAX_BACKOFF_MS. */
int sup_backoff_ms(int base_ms, int in_a_row);

#endif
