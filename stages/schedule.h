/* Pipeline schedules as data: a pure function (pipeline degree, virtual stages per rank,
 * microbatches, kind) -> one list of actions per pipeline rank. Stage processes execute
 * their list in order; nothing else knows the schedule. The bench simulates a list with
 * measured per-action times to predict the ideal step time, and renders it as a timeline.
 *
 * Actions: F(mb) forward; B(mb) input-gradient backward; W(mb) weight-gradient backward.
 * GPipe and 1F1B emit W(mb) right after B(mb) (a plain backward); zero-bubble kinds will
 * move W later. `chunk` is the virtual stage on the rank (always 0 until interleaved kinds
 * land): rank s, chunk c holds virtual stage v = c * pp + s of pp * vstages in all.
 *
 * Dependencies between ranks: F(v, mb) needs F(v-1, mb); B(v, mb) needs B(v+1, mb), and
 * on the last virtual stage its own F(v, mb); W(v, mb) needs B(v, mb). */
#ifndef CTITAN_SCHEDULE_H
#define CTITAN_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    SCHED_GPIPE = 0, /* all forwards, then all backwards (microbatch order) */
    SCHED_1F1B = 1,  /* warmup of pp-1-rank forwards, then one forward one backward, then cooldown */
    /* appended later, never renumbered: interleaved 1F1B, ZB-H1 */
} sched_kind_t;

typedef enum { SCHED_F = 0, SCHED_B = 1, SCHED_W = 2 } sched_op_t;

typedef struct {
    uint8_t op;     /* sched_op_t */
    uint8_t chunk;  /* virtual stage on this rank, 0 .. vstages-1 */
    uint16_t pad;
    int32_t mb;     /* microbatch, 0 .. microbatches-1 */
} sched_action_t;

typedef struct {
    sched_kind_t kind;
    int pp, vstages, microbatches;
    int *n;               /* (pp) actions on each rank */
    sched_action_t **a;   /* (pp) a[rank][i], i < n[rank]; one allocation, owned */
} sched_t;

/* Parses a torchtitan schedule name, case-insensitively: "GPipe", "1F1B". Returns 0 or -EINVAL. */
int sched_kind_parse(const char *name, sched_kind_t *out);
const char *sched_kind_name(sched_kind_t kind);

/* Builds the action lists. pp >= 1, microbatches >= 1, vstages == 1 for GPipe and 1F1B.
 * Returns 0, or -EINVAL with a reason in err (e.g. "1F1B needs vstages = 1, got 2"). */
int sched_build(sched_t *out, int pp, int vstages, int microbatches, sched_kind_t kind, char *err,
                size_t errlen);
void sched_free(sched_t *s);

/* Checks a schedule: every (chunk, mb) has exactly one F, B and W on each rank, in that order,
 * and executing every rank's list in order with unbounded buffers between ranks completes
 * (the dependencies above are satisfiable, no deadlock). Returns 0 or -EINVAL with the first
 * violation in err. */
int sched_check(const sched_t *s, char *err, size_t errlen);

/* Most microbatches in flight (F done, B not yet done) at any point on rank `rank`:
 * what the rank must keep activations for. */
int sched_peak_in_flight(const sched_t *s, int rank);

/* Simulates the lists with t[rank][op] seconds per action (op = SCHED_F, SCHED_B, SCHED_W)
 * and `comm` seconds for every hand-off between ranks; a rank runs its next action as soon
 * as its dependencies are done. Returns the makespan (the ideal step time). When start is
 * not NULL, start[rank][i] receives the start time of action i (caller sizes it n[rank]). */
double sched_simulate(const sched_t *s, const double (*t)[3], double comm, double **start);

/* Draws the simulated timeline as text, one row per rank, `width` columns for the makespan:
 * F actions as the microbatch digit, B as a letter (a = 0, b = 1, ...), W as 'w', idle '.'. */
void sched_render(const sched_t *s, const double (*t)[3], int width, FILE *f);

#endif
