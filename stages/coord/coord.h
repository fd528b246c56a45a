/* The coordinator of `ctitan launch`: owns the resolved manifest, the job's shared segments,
 * the control ROUTER and the step clock; starts, supervises and stops every process of the
 * job. With checkpoint.load, checkpointd first loads the checkpoint into the staging segment
 * (LOAD ... LOADED) and the run starts after its step. One training step is three rounds over
 * the control plane:
 *   STEP -> every stage      ... STEP_DONE (loss from the last ranks, per-action times)
 *   REDUCE -> every optshard ... REDUCED   (norm partials in the job segment)
 *   UPDATE -> every optshard ... UPDATED   (with the clip factor of the global norm)
 * Between rounds it reacts to whatever else happens: heartbeats, a process exiting (the
 * loader and checkpointd are restarted; on a CPU job a stage or shard is replaced in place,
 * coord_recover.c; anything else fails the job), errors, Ctrl-C, and `ctitan loader swap`
 * requests, which it carries out at the next step boundary.
 *
 * On one host the coordinator runs under a supervisor (stages/supervise/supervise.h), which relaunches a
 * failed job from its newest checkpoint: the run tells it how far it got and why it failed in
 * a coord_outcome_t in memory the two share, so the supervisor knows even after a kill -9. */
#ifndef CTITAN_COORD_H
#define CTITAN_COORD_H

#include <stdint.h>
#include <sys/types.h>

#include "stages/job/manifest.h"

#define COORD_OUT_CKPTS 64 /* the newest checkpoints an outcome remembers */

/* What a run leaves for its supervisor, written as it goes (MAP_SHARED memory the supervisor
 * made before the fork, read once the run is over). Times are util_now()'s (CLOCK_MONOTONIC). */
typedef struct {
    int64_t first_step;           /* steps completed when training started (the resumed checkpoint's) */
    int64_t last_step;            /* steps completed so far (first_step until a step of this run ends) */
    double last_step_at;          /* when the last one ended (0: none yet) */
    int steps_run;                /* steps this run completed */
    struct {
        int64_t step;             /* a checkpoint of this run: steps completed */
        double done_at;           /* when that step ended (its snapshot began) */
        int saved;                /* checkpointd said SAVED (it is complete on disk) */
    } ck[COORD_OUT_CKPTS];        /* ring: checkpoint i is ck[i % COORD_OUT_CKPTS] */
    int n_ck;
    int load_failed;              /* checkpointd could not load the run's checkpoint.load (why is
                                   * below; a restart's pick whose data proved damaged, say) */
    int failed;                   /* the run failed (exit 1) for the reason below */
    char role[16];                /* "stage", "optshard", "loader", "checkpointd", or "coordinator"
                                   * (its own reason: set-up, a checkpoint, itself stopped) */
    int rank, replica;
    char why[1536];
} coord_outcome_t;

/* How a supervised run is run (coord_run's second argument; NULL: unsupervised, as another host's agent). */
typedef struct {
    coord_outcome_t *out;         /* shared with the supervisor; the run fills it */
    int restarts;                 /* restarts of this job so far (`ctitan status` shows them) */
    char last_restart[512];       /* the last one's reason */
    int append_metrics;           /* a relaunch: metrics.file is appended to, not truncated */
    pid_t supervisor;             /* its pid: a coordinator whose parent is no longer that is
                                   * told by SIGTERM, stops the job in order and cleans up */
    int lock_fd;                  /* the job name's lock (ipc/shm.h), shared: the coordinator
                                   * removes it when the supervisor died before it */
} coord_super_t;

/* Runs the job to the end. Returns the process exit status: 0 done, 1 failed (the reason,
 * naming the role, rank and replica, is printed), 128 + signal when interrupted. With sup, the
 * job's workers stay in this process's process group (the supervisor's kill of the group
 * reaches them all) and the outcome is written to sup->out. */
int coord_run(const manifest_t *m, const coord_super_t *sup);

/* Host 0 of a job across hosts (job.hosts > 1), once its supervisor gives the job up (no run
 * follows): binds the coordinator's endpoint with its keys and answers each other host's
 * agent, as its hello or heartbeat comes, with GIVEN_UP and `why`, so that the agent stops its
 * host's workers and exits 1 at once instead of waiting job.host_timeout_s for a coordinator.
 * Waits wait_s at most, or until stop(arg). Returns 0 or -errno (said on stderr). */
int coord_farewell(const manifest_t *m, const char *why, double wait_s, int (*stop)(void *arg), void *arg);

/* After a coordinator of job `job` (this host's segment name) died without cleaning up: if the
 * job segment says `owner` made it, removes the operator's key from the run folder, the ipc://
 * control socket file and every segment of the job (async: without waiting for their memory to
 * be freed, shm_remove_all_async: a stop on a signal). Returns the number of segments removed
 * (0: nothing of `owner`'s was left) or -errno. */
int coord_remove_leftovers(const char *job, pid_t owner, int async);

#endif
