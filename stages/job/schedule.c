/* Pipeline schedule generators (see schedule.h): the kinds and their rules, and the builder that
 * makes the per-rank lists the stage processes execute. Checking, simulating and rendering a
 * schedule is schedule_engine.c. */
#include "stages/job/schedule.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ipc/util.h"

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
