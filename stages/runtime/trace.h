/* A timeline of a run (issue 14, `[profiling] trace_file`): a Chrome trace-event file in the
 * JSON array format, which Perfetto (ui.perfetto.dev) and chrome://tracing open. The
 * coordinator writes it as steps end, one process track per job process:
 *
 *   stage R (replica P)   track "actions": every F, B and W of every step at the times the
 *                         stage measured (one CLOCK_MONOTONIC for every process of a host;
 *                         another host's moved onto the coordinator's: TRACE_SENT), the
 *                         waits on its rings and the loader's inside them; track "ideal": the
 *                         schedule simulated with the step's measured action times, from the
 *                         step's start (stages/job/schedule.h sched_simulate)
 *   loader                each microbatch's fill of its token and target slots, and its
 *                         waits for a free slot (rings full: the stages behind)
 *   coordinator           each step, and its REDUCE and UPDATE rounds
 *   optshard K            its reduce, update and snapshot work (as long as it said it took,
 *                         ending when its reply came)
 *   checkpointd           each checkpoint's write
 *
 * Times are microseconds from the run's start. The closing bracket is written when the run
 * ends; a file cut short (a killed coordinator) still opens, as the format allows, and a
 * supervisor's relaunch appends its run to the same file. Stages send their records
 * (trace_rec_t) in MSG_TRACE before their STEP_DONE, the loader its step's as the step's last
 * slot is filled (it runs ahead of the stages). */
#ifndef CTITAN_TRACE_H
#define CTITAN_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define TRACE_WAIT 3 /* a record's op beside SCHED_F, SCHED_B, SCHED_W: the stage (or loader) waited */
#define TRACE_FILL 4 /* the loader filled a microbatch's token and target slots */
#define TRACE_SENT 5 /* a message's last record: the sender's clock (t0 = t1) as it sent it */
#define TRACE_RECS_MAX 16384 /* records of one stage's step (MSG_TRACE's data), TRACE_SENT's included */

/* One interval of a stage's step, as MSG_TRACE carries it (native byte order: a job's hosts
 * run one build). Another host's clock is not this one's: the coordinator moves its records
 * by its receipt time less TRACE_SENT's (so they may be late by the network's latency). */
typedef struct {
    uint8_t op;     /* SCHED_F, SCHED_B, SCHED_W, TRACE_WAIT or TRACE_FILL */
    uint8_t chunk;  /* the virtual stage's chunk on its rank (a stage's) */
    uint16_t pad;   /* the replica (the loader's), else 0 */
    int32_t mb;     /* microbatch (-1 for a wait outside an action) */
    double t0, t1;  /* util_now() */
} trace_rec_t;

typedef struct trace trace_t;

/* Opens path for the run that starts at util_now() time t0: a new file, or (append, a
 * relaunch) the end of the one a run before this one wrote, its closing bracket taken off.
 * Returns 0, or -errno with "PATH: ..." and the reason in err. */
int trace_open(trace_t **out, const char *path, int append, double t0, char *err, size_t errlen);

/* Names process `pid`'s track (once per pid; `sort` orders the tracks) and its two threads. */
void trace_process(trace_t *t, int64_t pid, const char *name, int sort);

/* A slice [t0, t1] (util_now() times) on thread `tid` (1 actions, 2 ideal) of process pid:
 * its name, its category, and `args` (a JSON object's members, e.g. "\"step\": 3", or NULL). */
void trace_span(trace_t *t, int64_t pid, int tid, const char *name, const char *cat, double t0, double t1,
                const char *args);

#define TRACE_MIN_WAIT_S 20e-6 /* a shorter wait is no wait (the slot was there): not recorded */

/* Appends r to the *n records of recs (room for TRACE_RECS_MAX): nothing when recs is NULL (not
 * tracing), when only TRACE_SENT's place is left, or for a wait shorter than TRACE_MIN_WAIT_S. */
void trace_note(trace_rec_t *recs, int *n, trace_rec_t r);

/* Appends the TRACE_SENT record (util_now() now) to the n records (n < TRACE_RECS_MAX:
 * trace_note keeps its place) and returns how many to send. */
int trace_seal(trace_rec_t *recs, int n);

/* Checks a MSG_TRACE payload (`len` bytes from another process): whole records, at most
 * TRACE_RECS_MAX, every op up to max_op (TRACE_WAIT from a stage, TRACE_FILL from a loader) and
 * chunk below `chunks`, finite times with t1 >= t0, and TRACE_SENT (finite) last and only
 * there. Returns how many records come before TRACE_SENT, or -EINVAL with why in err. */
int trace_recs_check(const void *data, size_t len, int max_op, int chunks, char *err, size_t errlen);

/* Writes what is buffered to the file. Returns 0, or -errno with "PATH: ..." in err; after a
 * failure the writer stays failed (each later call says so again). */
int trace_flush(trace_t *t, char *err, size_t errlen);

/* The closing bracket, then closes the file and frees *t (NULL: nothing); *t = NULL. */
void trace_close(trace_t **t);

#endif
