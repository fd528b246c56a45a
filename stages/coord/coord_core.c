/* The coordinator's core (see coord_core.h): a failure and its reason, which the coordinator's
 * own stops can explain (a watch thread notes the time while this process runs), the names of
 * processes and exits, and the registry the concerns hook themselves into. */
#include "stages/coord/coord_core.h"

#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "ipc/util.h"

/* ---- the coordinator's own stops ---- */

/* Notes the time every 20 ms while this process runs: a longer gap between two notes means it
 * did not run (stopped, or starved). Its workers leave a coordinator that does not answer for
 * heartbeat_timeout_ms, so a failure right after such a gap is the gap's doing. */
static void *watch_stops(void *arg)
{
    coord_t *c = arg;
    double last = util_now();
    while (!atomic_load(&c->watch_quit)) {
        nanosleep(&(struct timespec){0, 20000000L}, NULL);
        double now = util_now();
        if (now - last > 0.25) {
            atomic_store(&c->gap_s, now - last);
            atomic_store(&c->gap_end, now);
        }
        atomic_store(&c->tick, now);
        last = now;
    }
    return NULL;
}

/* Blocks SIGCONT (it stays pending until coord_stopped_for looks: a stopped process is continued
 * all the same) and starts the watch. */
void coord_watch_start(coord_t *c)
{
    sigset_t cont;
    sigemptyset(&cont);
    sigaddset(&cont, SIGCONT);
    sigprocmask(SIG_BLOCK, &cont, NULL);
    atomic_store(&c->tick, util_now());
    c->watching = pthread_create(&c->watch, NULL, watch_stops, c) == 0;
}

void coord_watch_stop(coord_t *c)
{
    if (!c->watching)
        return;
    atomic_store(&c->watch_quit, 1);
    pthread_join(c->watch, NULL);
    c->watching = 0;
}

/* How long this process was stopped just before now (a SIGCONT came since the last look, and
 * the watch saw a gap or has not run since), or 0. Looked at once per step and at a failure. */
double coord_stopped_for(coord_t *c)
{
    sigset_t cont, pending;
    sigemptyset(&cont);
    sigaddset(&cont, SIGCONT);
    if (!sigpending(&pending) && sigismember(&pending, SIGCONT) &&
        sigtimedwait(&cont, NULL, &(struct timespec){0, 0}) == SIGCONT)
        c->continued_at = util_now();
    double now = util_now(), limit = c->m->heartbeat_timeout_ms * 1e-3, window = 2 * limit + 1;
    if (!(c->continued_at > 0 && now - c->continued_at < window))
        return 0;
    double since_tick = now - atomic_load(&c->tick); /* the watch has not run since the stop */
    double gap = now - atomic_load(&c->gap_end) < window ? atomic_load(&c->gap_s) : 0; /* or saw it */
    return since_tick > gap ? since_tick : gap;
}

/* ---- failures ---- */

static void vfail(coord_t *c, const coord_proc_t *p, const char *fmt, va_list ap)
{
    if (c->failed)
        return; /* the first reason is the cause; what follows is fallout */
    char what[sizeof(c->why)];
    vsnprintf(what, sizeof(what), fmt, ap);
    c->culprit = p;
    /* a worker leaves after heartbeat_timeout_ms without an answer, counted from its last one,
     * which can precede our last look: half the timeout is already suspect */
    double stopped = coord_stopped_for(c);
    if (stopped > c->m->heartbeat_timeout_ms * 0.5e-3) {
        snprintf(c->why, sizeof(c->why), "the coordinator itself was not running for %.1f s (stopped, e.g. by "
                 "SIGSTOP; job.heartbeat_timeout_ms = %d): its workers gave up on it (found first: %.1200s)", stopped,
                 c->m->heartbeat_timeout_ms, what);
        c->culprit = NULL;
    } else {
        snprintf(c->why, sizeof(c->why), "%s", what);
    }
    c->failed = 1;
}

void coord_fail(coord_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c, NULL, fmt, ap);
    va_end(ap);
}

void coord_fail_proc(coord_t *c, const coord_proc_t *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c, p, fmt, ap);
    va_end(ap);
}

/* ---- names ---- */

static const char *role_name[] = {"loader", "stage", "optshard", "checkpointd"};

const char *coord_role_name(coord_role_t role) { return role_name[role]; }

const char *coord_who(const coord_proc_t *p, char *buf, size_t n)
{
    if (p->role == COORD_LOADER)
        snprintf(buf, n, "loader");
    else if (p->role == COORD_STAGE)
        snprintf(buf, n, "stage rank %d replica %d", p->rank, p->replica);
    else if (p->role == COORD_OPTSHARD)
        snprintf(buf, n, "optshard %d", p->rank);
    else
        snprintf(buf, n, "checkpointd");
    return buf;
}

const char *coord_describe_exit(int st, char *buf, size_t n)
{
    if (WIFEXITED(st))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, n, "ended (wait status %d)", st);
    return buf;
}

int coord_peer_host(const ctl_peer_t *from) { return strncmp(from->user, "host.", 5) ? -1 : atoi(from->user + 5); }

/* ---- the registry ---- */

void coord_handle(coord_t *c, msg_type_t type, unsigned who, coord_handler_t fn)
{
    c->reg.rules[type].fn = fn;
    c->reg.rules[type].who = who;
}

/* Each kind holds at most COORD_HOOKS, a fixed number the concerns use. */
#define ADD(list, n, fn) do { if ((n) < COORD_HOOKS) (list)[(n)++] = (fn); } while (0)

void coord_on_signal(coord_t *c, coord_hook_t fn) { ADD(c->reg.signal, c->reg.n_signal, fn); }
void coord_on_tick(coord_t *c, coord_hook_t fn) { ADD(c->reg.tick, c->reg.n_tick, fn); }
void coord_on_hello(coord_t *c, coord_proc_hook_t fn) { ADD(c->reg.hello, c->reg.n_hello, fn); }
void coord_on_ready(coord_t *c, coord_proc_hook_t fn) { ADD(c->reg.ready, c->reg.n_ready, fn); }
void coord_on_restart(coord_t *c, coord_restart_hook_t fn) { ADD(c->reg.restart, c->reg.n_restart, fn); }

void coord_run_hooks(coord_t *c, coord_proc_hook_t *hooks, int n, coord_proc_t *p)
{
    for (int i = 0; i < n; i++)
        hooks[i](c, p);
}

int coord_can_recover(const coord_t *c, const coord_proc_t *p)
{
    return c->reg.can_recover && c->reg.can_recover(c, p);
}

void coord_lost(coord_t *c, coord_proc_t *p, const char *how)
{
    if (c->reg.lost)
        c->reg.lost(c, p, how);
}
