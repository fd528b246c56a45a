/* Pipeline schedules as data: a pure function (pipeline degree, virtual stages per rank,
 * microbatches, kind) -> one list of actions per pipeline rank. Stage processes execute
 * their list in order, one model chunk per virtual stage; nothing else knows the schedule. The
 * bench simulates a list with measured per-action times to predict the ideal step time, and
 * renders it as a timeline.
 *
 * Actions: F(chunk, mb) forward; B(chunk, mb) input-gradient backward (what the previous
 * virtual stage waits for); W(chunk, mb) weight-gradient backward. GPipe, 1F1B and
 * Interleaved1F1B emit W right after its B (a plain backward); the zero-bubble kinds move W
 * later, into what would be bubbles, at the price of keeping that microbatch's activations
 * until its W (sched_peak_acts).
 *
 * Placement: the model is cut into pp * vstages virtual stages, in order; `chunk` is the
 * virtual stage's index on its rank. Loop (GPipe, 1F1B, Interleaved*): rank s, chunk c holds
 * virtual stage c * pp + s. V (ZBVZeroBubble, DualPipeV; vstages = 2): rank s holds virtual
 * stage s as chunk 0 and 2 pp - 1 - s as chunk 1, so rank 0 holds the first and the last, and
 * the middle hand-off (pp - 1 to pp) stays inside rank pp - 1.
 *
 * Dependencies between virtual stages: F(k, mb) needs F(k-1, mb); B(k, mb) needs B(k+1, mb),
 * and on the last virtual stage its own F(k, mb); W(k, mb) needs B(k, mb).
 *
 * Ordering rule (what keeps losses bitwise equal across kinds and chunk counts): on every
 * rank, each chunk's W actions run in increasing microbatch order (its weight gradients are
 * summed in that order), and the last virtual stage's F actions run in increasing microbatch
 * order (the loss is summed in that order). Every built list obeys it; sched_check verifies it. */
#ifndef CTITAN_SCHEDULE_H
#define CTITAN_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Most virtual stages per rank: sched_action_t.chunk is one byte. */
#define SCHED_MAX_VSTAGES 256
/* Upper bound on the actions of one rank, far above any real pipeline, so that sizes and
 * indices stay in int and the tables in check/simulate stay small enough to allocate. */
#define SCHED_MAX_ACTIONS (1 << 24)

typedef enum {
    SCHED_GPIPE = 0, /* all forwards, then all backwards (microbatch order) */
    SCHED_1F1B = 1,  /* warmup of pp-1-rank forwards, then one forward one backward, then cooldown */
    SCHED_INTERLEAVED_1F1B = 2, /* Megatron's interleaved 1F1B, vstages >= 2 loop chunks */
    SCHED_INTERLEAVED_ZB = 3,   /* ZB-H1 on loop chunks (vstages >= 1): rank r defers r Ws */
    SCHED_ZBV = 4,              /* ZB-V: V placement, W fills the cooldown */
    SCHED_DUALPIPEV = 5,        /* DeepSeek's DualPipe cut to a V (PyTorch's ScheduleDualPipeV) */
    /* appended later, never renumbered */
} sched_kind_t;

typedef enum { SCHED_F = 0, SCHED_B = 1, SCHED_W = 2 } sched_op_t;

typedef enum {
    SCHED_LOOP = 0, /* rank s, chunk c: virtual stage c * pp + s */
    SCHED_V = 1,    /* vstages = 2; rank s, chunk 0: virtual stage s; chunk 1: 2 pp - 1 - s */
} sched_placement_t;

typedef struct {
    uint8_t op;     /* sched_op_t */
    uint8_t chunk;  /* virtual stage on this rank, 0 .. vstages-1 */
    uint16_t pad;
    int32_t mb;     /* microbatch, 0 .. microbatches-1 */
} sched_action_t;

typedef struct {
    sched_kind_t kind;
    sched_placement_t placement;
    int pp, vstages, microbatches;
    int *n;               /* (pp) actions on each rank */
    sched_action_t **a;   /* (pp) a[rank][i], i < n[rank]; one allocation, owned */
} sched_t;

/* Parses a torchtitan schedule name, case-insensitively: "GPipe", "1F1B", "Interleaved1F1B",
 * "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV". Returns 0 or -EINVAL. */
int sched_kind_parse(const char *name, sched_kind_t *out);
const char *sched_kind_name(sched_kind_t kind); /* "?" for a value that is no kind */

/* What a kind needs, without building: its placement (SCHED_LOOP or SCHED_V, or -EINVAL for no
 * kind), and the virtual stages per rank it accepts (min .. max) and uses when the manifest
 * names none (dflt: torchtitan's, 1 for single-stage kinds and 2 for the others). Any out
 * pointer may be NULL. Returns 0 or -EINVAL. */
int sched_kind_placement(sched_kind_t kind);
int sched_kind_vstages(sched_kind_t kind, int *min, int *max, int *dflt);

/* The rules sched_build applies, without building: 0, or -EINVAL with a message that names the
 * schedule and the rule (e.g. "ZBVZeroBubble needs exactly 2 virtual stages per rank, got 3").
 * Per kind (pp >= 1 and microbatches >= 1 for all):
 *   GPipe, 1F1B             vstages 1
 *   Interleaved1F1B         vstages 2 .. SCHED_MAX_VSTAGES; microbatches a multiple of the
 *                           rounds, max(1, microbatches / pp) (PyTorch's rule)
 *   InterleavedZeroBubble   vstages 1 .. SCHED_MAX_VSTAGES; microbatches as Interleaved1F1B
 *   ZBVZeroBubble           vstages 2; any microbatches
 *   DualPipeV               vstages 2; microbatches >= 2 pp (the virtual stages) */
int sched_kind_check(sched_kind_t kind, int pp, int vstages, int microbatches, char *err,
                     size_t errlen);

/* Builds the action lists under sched_kind_check's rules. Returns 0, or -EINVAL with the
 * reason in err. */
int sched_build(sched_t *out, int pp, int vstages, int microbatches, sched_kind_t kind, char *err,
                size_t errlen);
void sched_free(sched_t *s);

/* The placement: the virtual stage that rank `rank` runs as chunk `chunk`, and the rank (and in
 * *chunk, when not NULL, the chunk) that runs virtual stage `vstage`. -EINVAL out of range. */
int sched_vstage(const sched_t *s, int rank, int chunk);
int sched_rank_of(const sched_t *s, int vstage, int *chunk);
/* The same without a built schedule: the rank (and chunk) of virtual stage `vstage` under
 * `placement` with pp ranks; the caller keeps vstage in range. */
int sched_placement_rank(sched_placement_t placement, int pp, int vstage, int *chunk);

/* Checks a schedule: every (chunk, mb) has exactly one F, B and W on each rank, in that order;
 * executing every rank's list in order with unbounded buffers between ranks completes (the
 * dependencies above are satisfiable, no deadlock); and the ordering rule above holds.
 * Returns 0 or -EINVAL with the first violation in err. */
int sched_check(const sched_t *s, char *err, size_t errlen);

/* Most microbatches in flight (F done, B not yet done) at any point on rank `rank`, over all its
 * chunks. */
int sched_peak_in_flight(const sched_t *s, int rank);

/* Most microbatches whose activations chunk `chunk` of rank `rank` must keep at any point (F
 * done, W not yet done: W needs the layer inputs), or with chunk = -1 the most summed over the
 * rank's chunks at any one point. What the runtime sizes its activation storage from; with W
 * right after B it equals the in-flight count. -EINVAL out of range. */
int sched_peak_acts(const sched_t *s, int rank, int chunk);

/* Most microbatches of chunk `chunk` of rank `rank` (-1: summed over its chunks) that sit
 * between their B and their W at any point, where a W right after its own B in the list does
 * not count (the stage runs the two together under activation checkpointing): 0 for GPipe,
 * 1F1B and Interleaved1F1B. model_act_total's held_w (kernels/act_bytes.h). -EINVAL out of
 * range. */
int sched_peak_held_w(const sched_t *s, int rank, int chunk);

/* Simulates the lists with t[rank][op] seconds per action (op = SCHED_F, SCHED_B, SCHED_W; the
 * same for every chunk of a rank) and `comm` seconds for every hand-off between ranks (none
 * between chunks of one rank); a rank runs its next action as soon as its dependencies are done.
 * Returns the makespan (the ideal step time), or a negative -errno for a list that fails
 * sched_check. When start is not NULL, start[rank][i] receives the start time of action i
 * (caller sizes it n[rank]). */
double sched_simulate(const sched_t *s, const double (*t)[3], double comm, double **start);

/* The bubble fraction of that simulation: 1 - (busy time summed over ranks) / (pp x makespan),
 * the share of the ranks' time spent idle; 0 when the makespan is 0, a negative -errno for a
 * list that fails sched_check. */
double sched_bubble(const sched_t *s, const double (*t)[3], double comm);

/* Draws the simulated timeline as text, `width` columns for the makespan, idle as '.': F
 * actions as the microbatch digit, B as a letter (a = 0, b = 1, ...), W as 'w'. With one chunk
 * per rank, one row per rank; with more, each rank's row is followed by a row that shows the
 * chunk (a digit) of the action above it. */
void sched_render(const sched_t *s, const double (*t)[3], int width, FILE *f);

#endif
