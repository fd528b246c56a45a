/* The schedule engine (see schedule.h): one run of the per-rank lists in order against the
 * dependencies between virtual stages, which checking (every action once, no deadlock, the
 * ordering rule that keeps losses bitwise), simulating with measured times and rendering
 * share. The generators are schedule.c. */
#include "stages/job/schedule.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"

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

static const char op_letter[3] = {'F', 'B', 'W'};

/* "B(mb 3)", or "B(c1, mb 3)" once there are virtual stages, for messages. */
static const char *action_str(char *buf, size_t len, const sched_t *s, int op, int chunk, int mb)
{
    if (s->vstages == 1) snprintf(buf, len, "%c(mb %d)", op_letter[op], mb);
    else snprintf(buf, len, "%c(c%d, mb %d)", op_letter[op], chunk, mb);
    return buf;
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

int sched_peak_held_w(const sched_t *s, int rank, int chunk)
{
    if (!s || !s->n || !s->a || rank < 0 || rank >= s->pp || chunk < -1 || chunk >= s->vstages)
        return -EINVAL;
    int live = 0, peak = 0;
    const sched_action_t *a = s->a[rank];
    for (int i = 0; i < s->n[rank]; i++) {
        if (chunk >= 0 && a[i].chunk != chunk)
            continue;
        int fused = a[i].op == SCHED_B && i + 1 < s->n[rank] && a[i + 1].op == SCHED_W &&
                    a[i + 1].chunk == a[i].chunk && a[i + 1].mb == a[i].mb;
        if (a[i].op == SCHED_B && fused)
            i++; /* its W with it (a W of another chunk never sits between them) */
        else if (a[i].op == SCHED_B && ++live > peak)
            peak = live;
        else if (a[i].op == SCHED_W)
            live--;
    }
    return peak;
}

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
