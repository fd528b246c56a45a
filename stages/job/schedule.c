/* Pipeline schedule generator, checker and simulator (see schedule.h). The builder makes the
 * per-rank lists the stage processes execute; the checker and simulator share one engine that
 * runs the lists in order against the dependencies between virtual stages. */
#include "stages/job/schedule.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ipc/util.h"

/* Upper bound on the actions of one rank, far above any real pipeline, so that sizes and
 * indices stay in int and the tables in check/simulate stay small enough to allocate. */
#define SCHED_MAX_ACTIONS (1 << 24)

/* Appends to err at *off, keeping it terminated when it runs out of room. */
static void append(char *err, size_t errlen, size_t *off, const char *fmt, ...)
{
    if (!err || !errlen || *off >= errlen - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(err + *off, errlen - *off, fmt, ap);
    va_end(ap);
    if (k > 0) *off += (size_t)k < errlen - *off ? (size_t)k : errlen - 1 - *off;
}

/* Index = sched_kind_t; appended, never reordered (the manifest lists them in this order). */
static const char *const kind_name[] = {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble",
                                        "ZBVZeroBubble", "DualPipeV"};
#define NKINDS ((int)(sizeof(kind_name) / sizeof(kind_name[0])))

int sched_kind_parse(const char *name, sched_kind_t *out)
{
    for (int k = 0; k < NKINDS; k++)
        if (!strcasecmp(name, kind_name[k])) {
            *out = (sched_kind_t)k;
            return 0;
        }
    return -EINVAL;
}

const char *sched_kind_name(sched_kind_t kind)
{
    return (int)kind >= 0 && (int)kind < NKINDS ? kind_name[kind] : "?";
}

int sched_kind_placement(sched_kind_t kind)
{
    if ((int)kind < 0 || (int)kind >= NKINDS) return -EINVAL;
    return kind == SCHED_ZBV || kind == SCHED_DUALPIPEV ? SCHED_V : SCHED_LOOP;
}

int sched_kind_vstages(sched_kind_t kind, int *min, int *max, int *dflt)
{
    int lo, hi, d;
    switch (kind) {
    case SCHED_GPIPE:
    case SCHED_1F1B: lo = hi = d = 1; break;
    /* Where ctitan differs from PyTorch: with one chunk per rank Interleaved1F1B is 1F1B with a
     * warmup twice as long (the same bubble, more activations kept); PyTorch runs it, ctitan
     * refuses it and says to name 1F1B. */
    case SCHED_INTERLEAVED_1F1B: lo = 2, hi = SCHED_MAX_VSTAGES, d = 2; break;
    case SCHED_INTERLEAVED_ZB: lo = 1, hi = SCHED_MAX_VSTAGES, d = 2; break; /* 1: ZB-H1 */
    case SCHED_ZBV:
    case SCHED_DUALPIPEV: lo = hi = d = 2; break;
    default: return -EINVAL;
    }
    if (min) *min = lo;
    if (max) *max = hi;
    if (dflt) *dflt = d;
    return 0;
}

int sched_kind_check(sched_kind_t kind, int pp, int vstages, int microbatches, char *err,
                     size_t errlen)
{
    int lo, hi;
    if (sched_kind_vstages(kind, &lo, &hi, NULL))
        return util_fail(err, errlen, -EINVAL, "unknown schedule kind %d", (int)kind);
    const char *name = kind_name[kind];
    if (pp < 1)
        return util_fail(err, errlen, -EINVAL, "%s: pipeline degree must be >= 1, got %d", name,
                    pp);
    if (microbatches < 1)
        return util_fail(err, errlen, -EINVAL, "%s: microbatches must be >= 1, got %d", name,
                    microbatches);
    if (lo == hi && vstages != lo)
        return util_fail(err, errlen, -EINVAL,
                    "%s needs exactly %d virtual stage%s per rank, got %d", name, lo,
                    lo == 1 ? "" : "s", vstages);
    if (vstages < lo || vstages > hi)
        return util_fail(err, errlen, -EINVAL,
                    "%s needs %d to %d virtual stages per rank, got %d%s", name, lo, hi, vstages,
                    kind == SCHED_INTERLEAVED_1F1B && vstages == 1 ? " (with 1 it is 1F1B)" : "");
    if (kind == SCHED_INTERLEAVED_1F1B || kind == SCHED_INTERLEAVED_ZB) {
        /* PyTorch's rule (its "flexible" interleaving): microbatches go in rounds of equal size,
         * max(1, microbatches / pp) of them, so microbatches < 2 pp always pass. Megatron's own
         * (a multiple of pp) is stricter; ctitan accepts what torchtitan accepts. */
        int rounds = microbatches / pp > 1 ? microbatches / pp : 1;
        if (microbatches % rounds)
            return util_fail(err, errlen, -EINVAL,
                        "%s: microbatches (%d) must be a multiple of the number of rounds, %d (= "
                        "microbatches / pipeline degree %d, rounded down)",
                        name, microbatches, rounds, pp);
    }
    /* PyTorch's bound: with fewer microbatches than virtual stages DualPipeV's order would run
     * microbatches that do not exist (its main part runs m - 2 pp + rank + 1 rounds). ZB-V
     * accepts any m (it drops the missing microbatches from the full order). */
    if (kind == SCHED_DUALPIPEV && microbatches < 2 * pp)
        return util_fail(err, errlen, -EINVAL,
                    "DualPipeV: microbatches (%d) must be at least the virtual stages, 2 x the "
                    "pipeline degree (%d) = %d",
                    microbatches, pp, 2 * pp);
    long long per_rank = 3LL * vstages * microbatches;
    if (per_rank > SCHED_MAX_ACTIONS || (long long)pp * per_rank > SCHED_MAX_ACTIONS)
        return util_fail(err, errlen, -EINVAL,
                    "%s: schedule too large: pp %d x %lld actions per rank exceeds %d actions",
                    name, pp, per_rank, SCHED_MAX_ACTIONS);
    return 0;
}

static const char op_letter[3] = {'F', 'B', 'W'};

/* "B(mb 3)", or "B(c1, mb 3)" once there are virtual stages, for messages. */
static const char *action_str(char *buf, size_t len, const sched_t *s, int op, int chunk, int mb)
{
    if (s->vstages == 1) snprintf(buf, len, "%c(mb %d)", op_letter[op], mb);
    else snprintf(buf, len, "%c(c%d, mb %d)", op_letter[op], chunk, mb);
    return buf;
}

/* ---- building ---------------------------------------------------------------------------- */

static void put(sched_action_t *a, int *k, int op, int chunk, int mb)
{
    a[(*k)++] = (sched_action_t){.op = (uint8_t)op, .chunk = (uint8_t)chunk, .pad = 0, .mb = mb};
}

static void emit_gpipe(sched_action_t *a, int *k, int m)
{
    for (int mb = 0; mb < m; mb++) put(a, k, SCHED_F, 0, mb);
    for (int mb = 0; mb < m; mb++) {
        put(a, k, SCHED_B, 0, mb);
        put(a, k, SCHED_W, 0, mb);
    }
}

/* Megatron's non-interleaved order; torchtitan's Schedule1F1B gives the same list (it counts
 * the first steady-state forward as part of its pp - rank warmup). */
static void emit_1f1b(sched_action_t *a, int *k, int pp, int rank, int m)
{
    int warmup = pp - 1 - rank < m ? pp - 1 - rank : m;
    int steady = m - warmup;
    for (int mb = 0; mb < warmup; mb++) put(a, k, SCHED_F, 0, mb);
    for (int i = 0; i < steady; i++) {
        put(a, k, SCHED_F, 0, warmup + i);
        put(a, k, SCHED_B, 0, i);
        put(a, k, SCHED_W, 0, i);
    }
    for (int mb = steady; mb < m; mb++) {
        put(a, k, SCHED_B, 0, mb);
        put(a, k, SCHED_W, 0, mb);
    }
}

/* Deferred weight gradients run in the order their B ran, so the next W is the B after the last
 * one given its W: scanning the list built so far needs no queue. Per chunk the Bs run in
 * microbatch order, so the Ws do too (the ordering rule). */
static void put_next_w(sched_action_t *a, int *k, int *scan)
{
    while (a[*scan].op != SCHED_B) (*scan)++;
    put(a, k, SCHED_W, a[*scan].chunk, a[*scan].mb);
    (*scan)++;
}

/* Megatron's interleaved 1F1B as PyTorch orders it (ScheduleInterleaved1F1B), and with zb its
 * ZB-H1 variant (ScheduleInterleavedZeroBubble). Microbatches go through the chunks in rounds
 * of `per`: forward op i runs chunk (i / per) % v, backward op j (counted from the first) runs
 * chunk v - 1 - (j / per) % v, each chunk's microbatches in order. A warmup of forwards fills
 * the pipeline up to the last chunk's first backward (v - 1 rounds, then two forwards per hop to
 * the last rank, or one with zb, as in plain 1F1B), then one F and one B at a time, then the
 * remaining Bs. Without zb each W follows its B. With zb rank r holds its Ws back r backwards:
 * its Bs, which the ranks before it wait for, run that much earlier, and the held Ws run at the
 * end, while the last Bs travel on to rank 0. */
static void emit_interleaved(sched_action_t *a, int *k, int pp, int v, int rank, int m, int zb)
{
    int rounds = m / pp > 1 ? m / pp : 1, per = m / rounds, total = v * m;
    int warmup = (v - 1) * per + (zb ? 1 : 2) * (pp - 1 - rank);
    if (warmup > total) warmup = total;
    int delay = zb ? rank : 0, nf[SCHED_MAX_VSTAGES] = {0}, nb[SCHED_MAX_VSTAGES] = {0};
    int bs = 0, ws = 0, scan = 0; /* Bs and Ws put, where put_next_w looks next */
    for (int i = 0; i < total + warmup; i++) {
        if (i < total) {
            int c = (i / per) % v;
            put(a, k, SCHED_F, c, nf[c]++);
        }
        if (i >= warmup) {
            int c = v - 1 - ((i - warmup) / per) % v;
            put(a, k, SCHED_B, c, nb[c]++);
            if (bs++ >= delay) {
                put_next_w(a, k, &scan);
                ws++;
            }
        }
    }
    for (; ws < bs; ws++) put_next_w(a, k, &scan);
}

/* One action of the next microbatch of `count`, unless that microbatch is beyond m. */
static void put_counted(sched_action_t *a, int *k, int op, int chunk, int *count, int m)
{
    int mb = count[chunk]++;
    if (mb < m) put(a, k, op, chunk, mb);
}

/* ZB-V (the zero-bubble paper, section 6) in PyTorch's order (ScheduleZBVZeroBubble). Chunk 0
 * runs down the V, chunk 1 back up; rank r: 2 (pp - r) - 1 forwards of chunk 0, r pairs of
 * chunk-1 and chunk-0 forwards, pp - r rounds of F B W on chunk 1, then F B W on chunk 0 and on
 * chunk 1 in turn until every forward ran, then the cooldown: r pairs of Bs with their Ws held
 * back, pp - r chunk-0 Bs each followed by the oldest held-back chunk-0 W, then the rest of
 * the held-back Ws, chunk 1's first. The order is built for max(2 pp - 1, m) microbatches (the
 * fewest that fill the V) and the microbatches beyond m dropped, as PyTorch does. */
static void emit_zbv(sched_action_t *a, int *k, int pp, int rank, int m)
{
    int n = m > 2 * pp - 1 ? m : 2 * pp - 1, f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};
    for (int i = 0; i < 2 * (pp - rank) - 1; i++) put_counted(a, k, SCHED_F, 0, f, m);
    for (int i = 0; i < rank; i++) {
        put_counted(a, k, SCHED_F, 1, f, m);
        put_counted(a, k, SCHED_F, 0, f, m);
    }
    for (int i = 0; i < pp - rank; i++) {
        put_counted(a, k, SCHED_F, 1, f, m);
        put_counted(a, k, SCHED_B, 1, b, m);
        put_counted(a, k, SCHED_W, 1, w, m);
    }
    while (f[1] < f[0] || f[0] < n) {
        if (f[0] < n) put_counted(a, k, SCHED_F, 0, f, m);
        put_counted(a, k, SCHED_B, 0, b, m);
        put_counted(a, k, SCHED_W, 0, w, m);
        put_counted(a, k, SCHED_F, 1, f, m);
        put_counted(a, k, SCHED_B, 1, b, m);
        put_counted(a, k, SCHED_W, 1, w, m);
    }
    for (int i = 0; i < rank; i++) {
        put_counted(a, k, SCHED_B, 0, b, m);
        put_counted(a, k, SCHED_B, 1, b, m);
    }
    for (int i = 0; i < pp - rank; i++) {
        put_counted(a, k, SCHED_B, 0, b, m);
        put_counted(a, k, SCHED_W, 0, w, m);
    }
    while (w[1] < b[1]) put_counted(a, k, SCHED_W, 1, w, m);
    while (w[0] < b[0]) put_counted(a, k, SCHED_W, 0, w, m);
}

/* DualPipeV as PyTorch orders it (ScheduleDualPipeV, after DeepSeek's DualPipe cut in half):
 * rank r runs 2 (pp - r - 1) forwards of chunk 0, r + 1 pairs of chunk-0 and chunk-1 forwards,
 * pp - r - 1 rounds of chunk-1 B W F, then the main part, m - 2 pp + r + 1 rounds of an F on
 * one chunk with a B of the other (F0 with B1, then F1 with B0: DualPipe overlaps each pair,
 * one thread per stage runs them one after the other), pp - r - 1 rounds of B1 then F1 with
 * B0, then r + 1 rounds of B1 B0 of which the second half hold their Ws back (the odd ranks
 * from B1 of the middle round, the even ones from its B0), pp - r - 1 rounds of one held-back
 * W and a B0 that holds its W back too, and the held-back Ws. Rank pp - 1 runs its first F0 B1
 * pair without overlap in PyTorch; run in sequence, that is the same order. */
static void emit_dualpipev(sched_action_t *a, int *k, int pp, int rank, int m)
{
    int f[2] = {0, 0}, b[2] = {0, 0}, held = 0, scan = 0;
#define PUT_F(c) put(a, k, SCHED_F, c, f[c]++)
#define PUT_BW(c) do { put(a, k, SCHED_B, c, b[c]); put(a, k, SCHED_W, c, b[c]++); } while (0)
    for (int i = 0; i < 2 * (pp - rank - 1); i++) PUT_F(0);
    for (int i = 0; i <= rank; i++) {
        PUT_F(0);
        PUT_F(1);
    }
    for (int i = 0; i < pp - rank - 1; i++) {
        PUT_BW(1);
        PUT_F(1);
    }
    for (int i = 0; i < m - 2 * pp + rank + 1; i++) {
        PUT_F(0);
        PUT_BW(1);
        PUT_F(1);
        PUT_BW(0);
    }
    for (int i = 0; i < pp - rank - 1; i++) {
        PUT_BW(1);
        PUT_F(1);
        PUT_BW(0);
    }
    /* From here on a B holds its W back: put_next_w finds them from `scan` on, in B order. */
    for (int i = 0; i <= rank; i++) {
        for (int c = 1; c >= 0; c--) {
            if (i == (rank + 1) / 2 && rank % 2 == c && !held) {
                held = 1;
                scan = *k;
            }
            if (held) put(a, k, SCHED_B, c, b[c]++);
            else PUT_BW(c);
        }
    }
    for (int i = 0; i < pp - rank - 1; i++) {
        put_next_w(a, k, &scan);
        put(a, k, SCHED_B, 0, b[0]++);
    }
    for (int i = 0; i <= rank; i++) put_next_w(a, k, &scan);
#undef PUT_F
#undef PUT_BW
}

int sched_build(sched_t *out, int pp, int vstages, int microbatches, sched_kind_t kind, char *err,
                size_t errlen)
{
    memset(out, 0, sizeof(*out));
    int rc = sched_kind_check(kind, pp, vstages, microbatches, err, errlen);
    if (rc) return rc;
    size_t per_rank = 3 * (size_t)vstages * (size_t)microbatches; /* bounded by the check */

    /* One block: the row pointers first (so freeing a frees everything), then the rows, then
     * n; each part's size keeps the next one aligned. */
    size_t rows = (size_t)pp * sizeof(sched_action_t *);
    size_t acts = (size_t)pp * per_rank * sizeof(sched_action_t);
    char *base = malloc(rows + acts + (size_t)pp * sizeof(int));
    if (!base) return util_fail(err, errlen, -ENOMEM, "out of memory for %d action lists", pp);
    out->a = (sched_action_t **)base;
    sched_action_t *rowbase = (sched_action_t *)(base + rows); /* (pp, per_rank) */
    out->n = (int *)(base + rows + acts);                      /* (pp) */
    out->kind = kind;
    out->placement = (sched_placement_t)sched_kind_placement(kind);
    out->pp = pp;
    out->vstages = vstages;
    out->microbatches = microbatches;
    for (int r = 0; r < pp; r++) {
        sched_action_t *a = out->a[r] = rowbase + (size_t)r * per_rank;
        int k = 0;
        switch (kind) {
        case SCHED_GPIPE: emit_gpipe(a, &k, microbatches); break;
        case SCHED_1F1B: emit_1f1b(a, &k, pp, r, microbatches); break;
        case SCHED_INTERLEAVED_1F1B:
            emit_interleaved(a, &k, pp, vstages, r, microbatches, 0);
            break;
        case SCHED_INTERLEAVED_ZB:
            emit_interleaved(a, &k, pp, vstages, r, microbatches, 1);
            break;
        case SCHED_ZBV: emit_zbv(a, &k, pp, r, microbatches); break;
        case SCHED_DUALPIPEV: emit_dualpipev(a, &k, pp, r, microbatches); break;
        }
        out->n[r] = k;
    }
    return 0;
}

void sched_free(sched_t *s)
{
    if (!s) return;
    free(s->a); /* n and every row live in the same block */
    memset(s, 0, sizeof(*s));
}

/* ---- the engine shared by checking and simulation ------------------------------------------- */

/* Per-(virtual stage, mb, op) tables are indexed by slot(); vstage_of() and owner() are the
 * placement without the range checks (check_lists has checked every chunk before the engine
 * runs). */
static int vstage_of(const sched_t *s, int rank, int chunk)
{
    if (s->placement == SCHED_V) return chunk ? 2 * s->pp - 1 - rank : rank;
    return chunk * s->pp + rank;
}

int sched_placement_rank(sched_placement_t placement, int pp, int vstage, int *chunk)
{
    int c = vstage / pp, r = vstage % pp;
    if (placement == SCHED_V && c) r = 2 * pp - 1 - vstage;
    if (chunk) *chunk = c;
    return r;
}

static int owner(const sched_t *s, int v, int *chunk) { return sched_placement_rank(s->placement, s->pp, v, chunk); }

static size_t slot(const sched_t *s, int v, int mb, int op)
{
    return ((size_t)v * (size_t)s->microbatches + (size_t)mb) * 3 + (size_t)op;
}

typedef struct {
    int v, op;
} dep_t;

/* What action `a` of rank `rank` waits for (at most one other action); the header's
 * dependency rules. */
static int deps_of(const sched_t *s, int rank, const sched_action_t *a, dep_t d[2])
{
    int nv = s->pp * s->vstages, v = vstage_of(s, rank, a->chunk), k = 0;
    switch (a->op) {
    case SCHED_F:
        if (v > 0) d[k++] = (dep_t){v - 1, SCHED_F};
        break;
    case SCHED_B:
        if (v < nv - 1) d[k++] = (dep_t){v + 1, SCHED_B};
        else d[k++] = (dep_t){v, SCHED_F};
        break;
    case SCHED_W:
        d[k++] = (dep_t){v, SCHED_B};
        break;
    }
    return k;
}

typedef struct {
    uint8_t *done;   /* (slots) the action has run */
    double *finish;  /* (slots) its end time; NULL when only checking order */
    double *free_at; /* (pp) when the rank finishes its last action; NULL with finish */
    int *pc;         /* (pp) next action of each rank */
} engine_t;

/* Runs every rank's list strictly in order, each action as soon as its dependencies are done
 * (and, with times, once the rank is free: start = max(rank free, dependency end [+ comm])).
 * The result does not depend on the sweep order because every start time is a max over
 * already-final values. Returns the number of actions run; pc says where each rank stopped. */
static long run_lists(const sched_t *s, engine_t *e, const double (*t)[3], double comm,
                      double **start)
{
    long ran = 0;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < s->pp; r++) {
            while (e->pc[r] < s->n[r]) {
                const sched_action_t *a = &s->a[r][e->pc[r]];
                dep_t d[2];
                int nd = deps_of(s, r, a, d), ready = 1;
                for (int i = 0; i < nd; i++)
                    if (!e->done[slot(s, d[i].v, a->mb, d[i].op)]) ready = 0;
                if (!ready) break;
                size_t me = slot(s, vstage_of(s, r, a->chunk), a->mb, a->op);
                if (e->finish) {
                    double t0 = e->free_at[r];
                    for (int i = 0; i < nd; i++) {
                        double ready_at = e->finish[slot(s, d[i].v, a->mb, d[i].op)];
                        if (owner(s, d[i].v, NULL) != r) ready_at += comm;
                        if (ready_at > t0) t0 = ready_at;
                    }
                    if (start) start[r][e->pc[r]] = t0;
                    e->finish[me] = e->free_at[r] = t0 + t[r][a->op];
                }
                e->done[me] = 1;
                e->pc[r]++;
                ran++;
                progress = 1;
            }
        }
    }
    return ran;
}

int sched_vstage(const sched_t *s, int rank, int chunk)
{
    if (!s || rank < 0 || rank >= s->pp || chunk < 0 || chunk >= s->vstages) return -EINVAL;
    return vstage_of(s, rank, chunk);
}

int sched_rank_of(const sched_t *s, int vstage, int *chunk)
{
    if (!s || s->pp < 1 || vstage < 0 || vstage >= s->pp * s->vstages) return -EINVAL;
    return owner(s, vstage, chunk);
}

/* ---- checking ------------------------------------------------------------------------------ */

/* Everything but the deadlock test: shape, ranges, exactly one F, B, W per (chunk, mb) on each
 * rank, in that order. pos is scratch of nslots ints. */
static int check_lists(const sched_t *s, int *pos, size_t nslots, char *err, size_t errlen)
{
    char b1[48], b2[48];
    for (size_t i = 0; i < nslots; i++) pos[i] = -1;
    for (int r = 0; r < s->pp; r++) {
        if (s->n[r] < 0 || s->n[r] > SCHED_MAX_ACTIONS || (s->n[r] > 0 && !s->a[r]))
            return util_fail(err, errlen, -EINVAL, "rank %d: bad action count %d", r, s->n[r]);
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action_t *a = &s->a[r][i];
            if (a->op > SCHED_W)
                return util_fail(err, errlen, -EINVAL, "rank %d action %d: unknown op %d", r, i,
                            a->op);
            if (a->chunk >= s->vstages)
                return util_fail(err, errlen, -EINVAL,
                            "rank %d action %d: chunk %d out of range [0, %d)", r, i, a->chunk,
                            s->vstages);
            if (a->mb < 0 || a->mb >= s->microbatches)
                return util_fail(err, errlen, -EINVAL,
                            "rank %d action %d: microbatch %d out of range [0, %d)", r, i, a->mb,
                            s->microbatches);
            int *p = &pos[slot(s, vstage_of(s, r, a->chunk), a->mb, a->op)];
            if (*p >= 0)
                return util_fail(err, errlen, -EINVAL, "rank %d: %s appears twice (actions %d and %d)",
                            r, action_str(b1, sizeof(b1), s, a->op, a->chunk, a->mb), *p, i);
            *p = i;
        }
        for (int c = 0; c < s->vstages; c++) {
            for (int mb = 0; mb < s->microbatches; mb++) {
                const int *p = &pos[slot(s, vstage_of(s, r, c), mb, 0)];
                for (int op = SCHED_F; op <= SCHED_W; op++)
                    if (p[op] < 0)
                        return util_fail(err, errlen, -EINVAL, "rank %d: %s is missing", r,
                                    action_str(b1, sizeof(b1), s, op, c, mb));
                for (int op = SCHED_B; op <= SCHED_W; op++)
                    if (p[op] < p[op - 1])
                        return util_fail(err, errlen, -EINVAL,
                                    "rank %d: %s at action %d comes before %s at action %d", r,
                                    action_str(b1, sizeof(b1), s, op, c, mb), p[op],
                                    action_str(b2, sizeof(b2), s, op - 1, c, mb), p[op - 1]);
            }
        }
    }
    return 0;
}

/* The ordering rule (schedule.h), on lists that passed check_lists, whose positions pos holds:
 * each chunk's Ws in microbatch order, and the last virtual stage's Fs. */
static int check_order(const sched_t *s, const int *pos, char *err, size_t errlen)
{
    char b1[48], b2[48];
    int last = s->pp * s->vstages - 1;
    for (int r = 0; r < s->pp; r++) {
        for (int c = 0; c < s->vstages; c++) {
            int v = vstage_of(s, r, c);
            for (int mb = 1; mb < s->microbatches; mb++) {
                const int *p = &pos[slot(s, v, mb, 0)], *q = &pos[slot(s, v, mb - 1, 0)];
                if (p[SCHED_W] < q[SCHED_W])
                    return util_fail(err, errlen, -EINVAL,
                                "rank %d: %s at action %d comes before %s at action %d: a "
                                "chunk's W actions must run in microbatch order (its weight "
                                "gradients are summed in that order)",
                                r, action_str(b1, sizeof(b1), s, SCHED_W, c, mb), p[SCHED_W],
                                action_str(b2, sizeof(b2), s, SCHED_W, c, mb - 1), q[SCHED_W]);
                if (v == last && p[SCHED_F] < q[SCHED_F])
                    return util_fail(err, errlen, -EINVAL,
                                "rank %d: %s at action %d comes before %s at action %d: the last "
                                "virtual stage's F actions must run in microbatch order (the loss "
                                "is summed in that order)",
                                r, action_str(b1, sizeof(b1), s, SCHED_F, c, mb), p[SCHED_F],
                                action_str(b2, sizeof(b2), s, SCHED_F, c, mb - 1), q[SCHED_F]);
            }
        }
    }
    return 0;
}

/* Scratch for check and simulate in one block: done (slots bytes) after the doubles and ints so
 * that every part stays aligned. */
typedef struct {
    void *block;
    int *pos;    /* (slots) */
    int *pc;     /* (pp) */
    double *finish;  /* (slots) */
    double *free_at; /* (pp) */
    uint8_t *done;   /* (slots) */
} scratch_t;

static int scratch_alloc(const sched_t *s, scratch_t *sc, size_t *nslots)
{
    *nslots = (size_t)s->pp * (size_t)s->vstages * (size_t)s->microbatches * 3;
    size_t nd = *nslots + (size_t)s->pp, ni = *nslots + (size_t)s->pp;
    char *b = calloc(1, nd * sizeof(double) + ni * sizeof(int) + *nslots);
    if (!b) return -ENOMEM;
    sc->block = b;
    sc->finish = (double *)b;
    sc->free_at = sc->finish + *nslots;
    sc->pos = (int *)(b + nd * sizeof(double));
    sc->pc = sc->pos + *nslots;
    sc->done = (uint8_t *)(sc->pc + s->pp);
    return 0;
}

static int check_header(const sched_t *s, char *err, size_t errlen)
{
    if (!s || s->pp < 1 || s->vstages < 1 || s->vstages > SCHED_MAX_VSTAGES ||
        s->microbatches < 1 || !s->n || !s->a)
        return util_fail(err, errlen, -EINVAL,
                    "bad schedule shape: pp %d, vstages %d, microbatches %d (or no lists)",
                    s ? s->pp : 0, s ? s->vstages : 0, s ? s->microbatches : 0);
    if (s->placement != SCHED_LOOP && s->placement != SCHED_V)
        return util_fail(err, errlen, -EINVAL, "bad schedule placement %d", (int)s->placement);
    if (s->placement == SCHED_V && s->vstages != 2)
        return util_fail(err, errlen, -EINVAL,
                    "the V placement needs exactly 2 virtual stages per rank, got %d", s->vstages);
    if ((long long)s->pp * s->vstages * s->microbatches * 3 > SCHED_MAX_ACTIONS)
        return util_fail(err, errlen, -EINVAL, "schedule too large: pp %d, vstages %d, microbatches %d",
                    s->pp, s->vstages, s->microbatches);
    return 0;
}

/* Full check into sc (left allocated on success for the caller's own run). */
static int check_into(const sched_t *s, scratch_t *sc, char *err, size_t errlen)
{
    int rc = check_header(s, err, errlen);
    if (rc) return rc;
    size_t nslots;
    if (scratch_alloc(s, sc, &nslots))
        return util_fail(err, errlen, -ENOMEM, "out of memory checking the schedule");
    rc = check_lists(s, sc->pos, nslots, err, errlen);
    if (rc) goto out;

    engine_t e = {.done = sc->done, .pc = sc->pc};
    long total = 0;
    for (int r = 0; r < s->pp; r++) total += s->n[r];
    long ran = run_lists(s, &e, NULL, 0, NULL);
    if (ran == total) {
        /* after the deadlock test: a list that cannot run at all says so first */
        rc = check_order(s, sc->pos, err, errlen);
        goto out;
    }

    /* Deadlock: name each stuck rank, its action and what that action waits for. */
    rc = -EINVAL;
    size_t off = 0;
    char b1[48], b2[48];
    append(err, errlen, &off, "deadlock after %ld of %ld actions:", ran, total);
    for (int r = 0; r < s->pp; r++) {
        if (e.pc[r] == s->n[r]) continue;
        const sched_action_t *a = &s->a[r][e.pc[r]];
        dep_t d[2];
        int nd = deps_of(s, r, a, d);
        append(err, errlen, &off, " rank %d at action %d %s waits for", r, e.pc[r],
               action_str(b1, sizeof(b1), s, a->op, a->chunk, a->mb));
        for (int i = 0; i < nd; i++) {
            int c, owner_rank = owner(s, d[i].v, &c);
            if (!e.done[slot(s, d[i].v, a->mb, d[i].op)])
                append(err, errlen, &off, " %s on rank %d;",
                       action_str(b2, sizeof(b2), s, d[i].op, c, a->mb), owner_rank);
        }
    }
    if (off && err[off - 1] == ';') err[off - 1] = '\0';
out:
    if (rc) {
        free(sc->block);
        sc->block = NULL;
    }
    return rc;
}

int sched_check(const sched_t *s, char *err, size_t errlen)
{
    scratch_t sc = {0};
    int rc = check_into(s, &sc, err, errlen);
    free(sc.block);
    return rc;
}

/* The most (chunk, mb) pairs of rank `rank` (of chunk `chunk`, or -1: all) open at once, each
 * opened by its F and closed by its `closer` action: a count suffices, since each closer closes
 * one F of its chunk. */
static int peak_open(const sched_t *s, int rank, int chunk, int closer)
{
    if (!s || !s->n || !s->a || rank < 0 || rank >= s->pp || chunk < -1 || chunk >= s->vstages)
        return -EINVAL;
    int live = 0, peak = 0;
    for (int i = 0; i < s->n[rank]; i++) {
        const sched_action_t *a = &s->a[rank][i];
        if (chunk >= 0 && a->chunk != chunk) continue;
        if (a->op == SCHED_F && ++live > peak) peak = live;
        else if (a->op == closer) live--;
    }
    return peak;
}

int sched_peak_in_flight(const sched_t *s, int rank) { return peak_open(s, rank, -1, SCHED_B); }

int sched_peak_acts(const sched_t *s, int rank, int chunk) { return peak_open(s, rank, chunk, SCHED_W); }

/* ---- simulation and rendering ---------------------------------------------------------------- */

double sched_simulate(const sched_t *s, const double (*t)[3], double comm, double **start)
{
    /* A list that does not check cannot be timed; say so with a negative -errno, which no
     * makespan can be. */
    scratch_t sc = {0};
    int rc = check_into(s, &sc, NULL, 0);
    if (rc) return (double)rc;
    memset(sc.done, 0, (size_t)s->pp * (size_t)s->vstages * (size_t)s->microbatches * 3);
    for (int r = 0; r < s->pp; r++) {
        sc.pc[r] = 0;
        sc.free_at[r] = 0;
    }
    engine_t e = {.done = sc.done, .finish = sc.finish, .free_at = sc.free_at, .pc = sc.pc};
    run_lists(s, &e, t, comm, start);
    double makespan = 0;
    for (int r = 0; r < s->pp; r++)
        if (sc.free_at[r] > makespan) makespan = sc.free_at[r];
    free(sc.block);
    return makespan;
}

double sched_bubble(const sched_t *s, const double (*t)[3], double comm)
{
    double makespan = sched_simulate(s, t, comm, NULL);
    if (makespan <= 0) return makespan; /* a -errno, or nothing ran long enough to idle */
    double busy = 0;
    for (int r = 0; r < s->pp; r++)
        for (int i = 0; i < s->n[r]; i++) busy += t[r][s->a[r][i].op];
    return 1 - busy / (s->pp * makespan);
}

/* One drawn row of rank r: its actions, or with chunks the chunk of each. A column shows the
 * action running at its midpoint, so an action covers about duration / makespan * width columns
 * however short the others are. */
static void render_row(const sched_t *s, const double (*t)[3], const double *start, double makespan,
                       int r, int chunks, char *line, int width)
{
    memset(line, '.', (size_t)width);
    for (int i = 0; i < s->n[r] && makespan > 0; i++) {
        const sched_action_t *a = &s->a[r][i];
        double t0 = start[i], t1 = t0 + t[r][a->op];
        char ch = chunks              ? (char)('0' + a->chunk % 10)
                  : a->op == SCHED_F ? (char)('0' + a->mb % 10)
                  : a->op == SCHED_B ? (char)('a' + a->mb % 26)
                                     : 'w';
        for (int c = 0; c < width; c++) {
            double mid = (c + 0.5) * makespan / width;
            if (mid >= t0 && mid < t1) line[c] = ch;
        }
    }
    line[width] = '\n';
    line[width + 1] = '\0';
}

void sched_render(const sched_t *s, const double (*t)[3], int width, FILE *f)
{
    if (width < 1) return;
    int total = 0;
    if (s && s->n && s->pp > 0)
        for (int r = 0; r < s->pp; r++) total += s->n[r] > 0 ? s->n[r] : 0;
    /* start times: one block of row pointers then rows, like the lists themselves */
    size_t rows = s && s->pp > 0 ? (size_t)s->pp * sizeof(double *) : 0;
    char *block = malloc(rows + (size_t)total * sizeof(double) + 1);
    char *line = malloc((size_t)width + 2);
    double makespan = block && line ? -EINVAL : -ENOMEM;
    if (block && line && rows) {
        double **start = (double **)block;
        double *p = (double *)(block + rows);
        for (int r = 0; r < s->pp; r++) {
            start[r] = p;
            p += s->n[r] > 0 ? s->n[r] : 0;
        }
        makespan = sched_simulate(s, t, 0, start);
        for (int r = 0; r < s->pp && makespan >= 0; r++) {
            for (int chunks = 0; chunks <= (s->vstages > 1); chunks++) {
                render_row(s, t, start[r], makespan, r, chunks, line, width);
                fputs(line, f);
            }
        }
    }
    if (makespan < 0)
        fprintf(f, "(schedule cannot be drawn: %s)\n",
                makespan == -ENOMEM ? "out of memory" : "it does not pass sched_check");
    free(line);
    free(block);
}
