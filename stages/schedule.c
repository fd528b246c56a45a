/* Pipeline schedule generator, checker and simulator (see schedule.h). The builder makes the
 * per-rank lists the stage processes execute; the checker and simulator share one engine that
 * runs the lists in order against the cross-rank dependencies. */
#include "stages/schedule.h"

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

int sched_kind_parse(const char *name, sched_kind_t *out)
{
    if (!strcasecmp(name, "GPipe")) *out = SCHED_GPIPE;
    else if (!strcasecmp(name, "1F1B")) *out = SCHED_1F1B;
    else return -EINVAL;
    return 0;
}

const char *sched_kind_name(sched_kind_t kind)
{
    switch (kind) {
    case SCHED_GPIPE: return "GPipe";
    case SCHED_1F1B: return "1F1B";
    }
    return "?";
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

static void put(sched_action_t *a, int *k, int op, int mb)
{
    a[(*k)++] = (sched_action_t){.op = (uint8_t)op, .chunk = 0, .pad = 0, .mb = mb};
}

static void emit_gpipe(sched_action_t *a, int *k, int m)
{
    for (int mb = 0; mb < m; mb++) put(a, k, SCHED_F, mb);
    for (int mb = 0; mb < m; mb++) {
        put(a, k, SCHED_B, mb);
        put(a, k, SCHED_W, mb);
    }
}

/* Megatron's non-interleaved order; torchtitan's Schedule1F1B gives the same list (it counts
 * the first steady-state forward as part of its pp - rank warmup). */
static void emit_1f1b(sched_action_t *a, int *k, int pp, int rank, int m)
{
    int warmup = pp - 1 - rank < m ? pp - 1 - rank : m;
    int steady = m - warmup;
    for (int mb = 0; mb < warmup; mb++) put(a, k, SCHED_F, mb);
    for (int i = 0; i < steady; i++) {
        put(a, k, SCHED_F, warmup + i);
        put(a, k, SCHED_B, i);
        put(a, k, SCHED_W, i);
    }
    for (int mb = steady; mb < m; mb++) {
        put(a, k, SCHED_B, mb);
        put(a, k, SCHED_W, mb);
    }
}

int sched_build(sched_t *out, int pp, int vstages, int microbatches, sched_kind_t kind, char *err,
                size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (pp < 1) return util_fail(err, errlen, -EINVAL, "pipeline degree must be >= 1, got %d", pp);
    if (microbatches < 1)
        return util_fail(err, errlen, -EINVAL, "microbatches must be >= 1, got %d", microbatches);
    if (kind != SCHED_GPIPE && kind != SCHED_1F1B)
        return util_fail(err, errlen, -EINVAL, "unknown schedule kind %d", (int)kind);
    if (vstages != 1)
        return util_fail(err, errlen, -EINVAL, "%s needs vstages = 1, got %d", sched_kind_name(kind),
                    vstages);
    long long per_rank = 3LL * vstages * microbatches;
    if (per_rank > SCHED_MAX_ACTIONS || (long long)pp * per_rank > SCHED_MAX_ACTIONS)
        return util_fail(err, errlen, -EINVAL,
                    "schedule too large: pp %d x %lld actions per rank exceeds %d actions", pp,
                    per_rank, SCHED_MAX_ACTIONS);

    /* One block: the row pointers first (so freeing a frees everything), then the rows, then
     * n; each part's size keeps the next one aligned. */
    size_t rows = (size_t)pp * sizeof(sched_action_t *);
    size_t acts = (size_t)pp * (size_t)per_rank * sizeof(sched_action_t);
    char *base = malloc(rows + acts + (size_t)pp * sizeof(int));
    if (!base) return util_fail(err, errlen, -ENOMEM, "out of memory for %d action lists", pp);
    out->a = (sched_action_t **)base;
    sched_action_t *rowbase = (sched_action_t *)(base + rows); /* (pp, per_rank) */
    out->n = (int *)(base + rows + acts);                      /* (pp) */
    out->kind = kind;
    out->pp = pp;
    out->vstages = vstages;
    out->microbatches = microbatches;
    for (int r = 0; r < pp; r++) {
        out->a[r] = rowbase + (size_t)r * (size_t)per_rank;
        int k = 0;
        if (kind == SCHED_GPIPE) emit_gpipe(out->a[r], &k, microbatches);
        else emit_1f1b(out->a[r], &k, pp, r, microbatches);
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

/* Per-(virtual stage, mb, op) tables are indexed by slot(); v = chunk * pp + rank. */
static size_t slot(const sched_t *s, int v, int mb, int op)
{
    return ((size_t)v * (size_t)s->microbatches + (size_t)mb) * 3 + (size_t)op;
}

typedef struct {
    int v, op;
} dep_t;

/* What action `a` of rank `rank` waits for (at most two); the header's dependency rules. */
static int deps_of(const sched_t *s, int rank, const sched_action_t *a, dep_t d[2])
{
    int nv = s->pp * s->vstages, v = a->chunk * s->pp + rank, k = 0;
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
                size_t me = slot(s, a->chunk * s->pp + r, a->mb, a->op);
                if (e->finish) {
                    double t0 = e->free_at[r];
                    for (int i = 0; i < nd; i++) {
                        double ready_at = e->finish[slot(s, d[i].v, a->mb, d[i].op)];
                        if (d[i].v % s->pp != r) ready_at += comm;
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
            int *p = &pos[slot(s, a->chunk * s->pp + r, a->mb, a->op)];
            if (*p >= 0)
                return util_fail(err, errlen, -EINVAL, "rank %d: %s appears twice (actions %d and %d)",
                            r, action_str(b1, sizeof(b1), s, a->op, a->chunk, a->mb), *p, i);
            *p = i;
        }
        for (int c = 0; c < s->vstages; c++) {
            for (int mb = 0; mb < s->microbatches; mb++) {
                const int *p = &pos[slot(s, c * s->pp + r, mb, 0)];
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
    if (!s || s->pp < 1 || s->vstages < 1 || s->vstages > 256 || s->microbatches < 1 || !s->n ||
        !s->a)
        return util_fail(err, errlen, -EINVAL,
                    "bad schedule shape: pp %d, vstages %d, microbatches %d (or no lists)",
                    s ? s->pp : 0, s ? s->vstages : 0, s ? s->microbatches : 0);
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
    if (ran == total) goto out;

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
        for (int i = 0; i < nd; i++)
            if (!e.done[slot(s, d[i].v, a->mb, d[i].op)])
                append(err, errlen, &off, " %s on rank %d;",
                       action_str(b2, sizeof(b2), s, d[i].op, d[i].v / s->pp, a->mb),
                       d[i].v % s->pp);
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

int sched_peak_in_flight(const sched_t *s, int rank)
{
    if (!s || !s->n || !s->a || rank < 0 || rank >= s->pp) return -EINVAL;
    /* Activations are held per (chunk, mb): a count suffices because each B closes one F. */
    int live = 0, peak = 0;
    for (int i = 0; i < s->n[rank]; i++) {
        if (s->a[rank][i].op == SCHED_F && ++live > peak) peak = live;
        else if (s->a[rank][i].op == SCHED_B) live--;
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
        if (makespan >= 0) {
            for (int r = 0; r < s->pp; r++) {
                memset(line, '.', (size_t)width);
                /* A column shows the action running at its midpoint, so an action covers about
                 * duration / makespan * width columns however short the others are. */
                for (int i = 0; i < s->n[r] && makespan > 0; i++) {
                    const sched_action_t *a = &s->a[r][i];
                    double t0 = start[r][i], t1 = t0 + t[r][a->op];
                    char ch = a->op == SCHED_F   ? (char)('0' + a->mb % 10)
                              : a->op == SCHED_B ? (char)('a' + a->mb % 26)
                                                 : 'w';
                    for (int c = 0; c < width; c++) {
                        double mid = (c + 0.5) * makespan / width;
                        if (mid >= t0 && mid < t1) line[c] = ch;
                    }
                }
                line[width] = '\n';
                line[width + 1] = '\0';
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
