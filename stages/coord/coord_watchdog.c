/* The step watchdog (see coord_watchdog.h): at every pump, a process that owes a reply in the
 * round in flight, or the loader (which owes the stages data all through training), whose
 * heartbeats' progress counter has not moved for the bound is stack-dumped (SIGABRT: the
 * worker's handler writes its main thread's stack to the log), then killed after
 * COORD_ABORT_GRACE_S; the recovery replaces it (the registry's policy; a loader from its
 * cursor) or the job fails. A stage blocked on a peer's ring, or a loader on full rings,
 * counts as progressing (worker_waiting), so only the wedged process is blamed. */
#include "stages/coord/coord_watchdog.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"

#define STEP_TIMES 32       /* step times the median is taken over */
#define ABORT_GRACE_S 2.0   /* after the SIGABRT (a stack dump), SIGKILL */

struct coord_watchdog {
    double step_times[STEP_TIMES]; /* the last steps' times, */
    int n_step_times;
    double auto_s;                 /* and the bound from them (0: too few yet) */
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* 10 x the median of the last steps' times + 10 s, once a step (not at each look); 0 before 3. */
void coord_note_step_time(coord_t *c, double secs)
{
    struct coord_watchdog *w = c->wd;
    w->step_times[w->n_step_times++ % STEP_TIMES] = secs;
    int n = w->n_step_times < STEP_TIMES ? w->n_step_times : STEP_TIMES;
    double t[STEP_TIMES];
    memcpy(t, w->step_times, (size_t)n * sizeof(double));
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    w->auto_s = n < 3 ? 0 : 10 * t[n / 2] + 10;
}

static void look(coord_t *c)
{
    if (!c->training)
        return;
    /* job.watchdog_s, or from the step times, or job.startup_timeout_s before 3 steps */
    double now = util_now(), bound = c->m->watchdog_s > 0 ? c->m->watchdog_s
                                     : c->wd->auto_s > 0 ? c->wd->auto_s : coord_startup_s(c);
    char name[64];
    for (int i = 0; i < c->np && !c->failed; i++) {
        coord_proc_t *p = &c->p[i];
        int loader = p->role == COORD_LOADER;
        if (!p->pid || p->remote || (!p->await && !loader) || !p->ready)
            continue;
        if (p->abort_sent > 0) { /* still there after its stack dump */
            if (now - p->abort_sent > ABORT_GRACE_S) {
                kill(p->pid, SIGKILL);
                p->abort_sent = now;
            }
            continue;
        }
        if (now - p->progress_at <= bound)
            continue;
        coord_who(p, name, sizeof(name));
        if (!loader && !coord_can_recover(c, p)) {
            coord_fail_proc(c, p, "%s (pid %d) made no progress for %.1f s in step %lld (the step watchdog's bound: "
                            "%.1f s): hung", name, (int)p->pid, now - p->progress_at, (long long)c->step + 1, bound);
            continue;
        }
        fprintf(stderr, "ctitan: %s (pid %d) made no progress for %.1f s in step %lld (the step watchdog's bound: "
                "%.1f s): dumping its stack (SIGABRT), then replacing it\n", name, (int)p->pid, now - p->progress_at,
                (long long)c->step + 1, bound);
        kill(p->pid, SIGABRT);
        p->abort_sent = now;
    }
}

int coord_watchdog_init(coord_t *c)
{
    if (!(c->wd = calloc(1, sizeof(*c->wd))))
        return -ENOMEM;
    coord_on_tick(c, look);
    return 0;
}

void coord_watchdog_free(coord_t *c)
{
    free(c->wd);
    c->wd = NULL;
}
