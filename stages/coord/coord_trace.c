/* [profiling] trace_file (see coord_trace.h; stages/runtime/trace.h the file): each stage's actions
 * and waits as it measured them (MSG_TRACE), the schedule's ideal placement beside them, the
 * coordinator's rounds, the optimizer shards' and checkpointd's work; the processes of other
 * hosts too, on tracks named with their host, their times moved onto this host's clock. */
#include "stages/coord/coord_trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/util.h"
#include "stages/runtime/trace.h"

struct coord_trace {
    trace_t *trace;               /* NULL: no trace file (or given up) */
    int64_t *named;               /* (np) the pid whose track is named, per process (0: none yet) */
};

static const char *on_trace(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m);

int coord_trace_init(coord_t *c)
{
    if (!(c->tr = calloc(1, sizeof(*c->tr))) || !(c->tr->named = calloc((size_t)c->np, sizeof(int64_t))))
        return -ENOMEM;
    coord_handle(c, MSG_TRACE, COORD_FROM(COORD_STAGE) | COORD_FROM(COORD_LOADER), on_trace);
    return 0;
}

int coord_trace_open(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    if (!m->trace_file[0])
        return 0;
    int rc = trace_open(&c->tr->trace, m->trace_file, c->sup && c->sup->append_metrics, c->train_t0 ? c->train_t0
                                                                                                  : util_now(),
                        err, errlen);
    if (rc)
        return rc;
    trace_process(c->tr->trace, getpid(), "coordinator", 0);
    return 0;
}

/* p's track: its pid, or for a process of another host (whose pids may be this host's too)
 * the host in the bits above it. */
static int64_t track_id(const coord_proc_t *p)
{
    return p->remote ? (int64_t)p->host << 32 | (uint32_t)p->pid : (int64_t)p->pid;
}

/* Names p's track the first time its pid (a replacement's too) appears. */
static int64_t track(coord_t *c, coord_proc_t *p)
{
    int64_t *named = &c->tr->named[p - c->p];
    if (*named == p->pid)
        return track_id(p);
    char name[64], who[96];
    coord_who(p, name, sizeof(name));
    if (p->remote)
        snprintf(who, sizeof(who), "%s (host %d, pid %d)", name, p->host, (int)p->pid);
    else
        snprintf(who, sizeof(who), "%s (pid %d)", name, (int)p->pid);
    /* stages first, in replica then rank order, then the shards, the loader, checkpointd */
    int sort = 1 + (int)(p - c->p);
    if (p->role == COORD_STAGE)
        sort = 1 + p->replica * c->m->pp + p->rank;
    trace_process(c->tr->trace, track_id(p), who, sort);
    *named = p->pid;
    return track_id(p);
}

/* "F3", "B3 c1" (a chunk other than the only one), for an action's slice. */
static const char *action_name(coord_t *c, int op, int chunk, int mb, char *buf, size_t n)
{
    if (op == TRACE_WAIT)
        snprintf(buf, n, "wait");
    else if (c->lay.vs > 1)
        snprintf(buf, n, "%c%d c%d", "FBW"[op], mb, chunk);
    else
        snprintf(buf, n, "%c%d", "FBW"[op], mb);
    return buf;
}

/* MSG_TRACE from stage p: its step's actions and waits, on its track; from the loader its fills. */
static const char *on_trace(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    static const char *const cats[] = {"F", "B", "W", "wait", "fill"}; /* by op: SCHED_F, _B, _W, TRACE_WAIT, _FILL */
    if (!c->tr->trace)
        return "no trace is being written";
    if (p->role == COORD_STAGE && (p->await != MSG_STEP_DONE || m->step != c->step))
        return "not the step in progress";
    if (p->role == COORD_LOADER && (m->step < c->step || m->step > c->step + 64)) /* it runs ahead */
        return "not a step the loader can be filling";
    static char why[160]; /* the reply is read before the next message */
    int n = trace_recs_check(m->data, m->data_len, p->role == COORD_LOADER ? TRACE_FILL : TRACE_WAIT, c->lay.vs,
                             why, sizeof(why));
    if (n < 0)
        return why;
    const trace_rec_t *r = (const trace_rec_t *)m->data;
    /* another host's clock onto ours: its records end by the time it sent them, which we take
     * as now (this host's own share one clock) */
    double shift = p->remote ? util_now() - r[n].t0 : 0;
    int64_t id = track(c, p);
    for (int i = 0; i < n; i++) {
        char name[32], args[96];
        if (r[i].op == TRACE_FILL)
            snprintf(name, sizeof(name), "fill r%d mb%d", r[i].pad, r[i].mb);
        snprintf(args, sizeof(args), "\"step\": %lld, \"mb\": %d, \"chunk\": %d", (long long)m->step + 1, r[i].mb,
                 r[i].chunk);
        trace_span(c->tr->trace, id, 1,
                   r[i].op == TRACE_FILL ? name : action_name(c, r[i].op, r[i].chunk, r[i].mb, name, sizeof(name)),
                   cats[r[i].op], r[i].t0 + shift, r[i].t1 + shift, args);
    }
    return NULL;
}

void coord_trace_round(coord_t *c, const char *name, int first, int count, double t0, double t1)
{
    if (!c->tr->trace)
        return;
    char args[48];
    snprintf(args, sizeof(args), "\"step\": %lld", (long long)c->step + 1);
    trace_span(c->tr->trace, getpid(), 1, name, "round", t0, t1, args);
    for (int i = first; i < first + count; i++) {
        coord_proc_t *p = &c->p[i];
        if (!p->pid || p->role == COORD_STAGE) /* stages say their own */
            continue;
        trace_span(c->tr->trace, track(c, p), 1, name, "work", p->replied_at - p->reply.t_busy, p->replied_at, args);
    }
}

void coord_trace_work(coord_t *c, coord_proc_t *p, const char *name, double busy)
{
    if (!c->tr->trace || !p->pid)
        return;
    double now = util_now();
    trace_span(c->tr->trace, track(c, p), 1, name, "work", now - busy, now, NULL);
}

void coord_trace_step(coord_t *c, const double (*t)[3])
{
    if (!c->tr->trace)
        return;
    const sched_t *s = &c->sched;
    double **start = calloc((size_t)s->pp, sizeof(double *));
    int ok = start != NULL;
    for (int r = 0; ok && r < s->pp; r++)
        ok = (start[r] = malloc((size_t)s->n[r] * sizeof(double))) != NULL;
    char args[48];
    snprintf(args, sizeof(args), "\"step\": %lld", (long long)c->step + 1);
    if (ok && sched_simulate(s, t, 0, start) >= 0)
        for (int rep = 0; rep < c->m->dp; rep++)
            for (int r = 0; r < s->pp; r++) {
                coord_proc_t *p = coord_stage(c, r, rep);
                if (!p->pid)
                    continue;
                int64_t id = track(c, p);
                for (int i = 0; i < s->n[r]; i++) {
                    const sched_action_t *a = &s->a[r][i];
                    char name[32];
                    double b = c->round_t0 + start[r][i];
                    trace_span(c->tr->trace, id, 2, action_name(c, a->op, a->chunk, a->mb, name, sizeof(name)),
                               "ideal", b, b + t[r][a->op], args);
                }
            }
    for (int r = 0; start && r < s->pp; r++)
        free(start[r]);
    free(start);
    char err[PATH_MAX + 256];
    if (trace_flush(c->tr->trace, err, sizeof(err))) {
        fprintf(stderr, "launch: warning: %s: no more of the trace in this run\n", err);
        trace_close(&c->tr->trace);
    }
}

void coord_trace_close(coord_t *c)
{
    if (!c->tr)
        return;
    trace_close(&c->tr->trace);
    free(c->tr->named);
    free(c->tr);
    c->tr = NULL;
}
