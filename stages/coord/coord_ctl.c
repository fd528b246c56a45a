/* The coordinator's control plane (see coord_ctl.h): the event pump that waits on the ROUTER
 * socket and the signal fd, running the registry's hooks between messages (reaping, heartbeats,
 * the agents, the watchdog); who may send what and when (the registry's rules, which each
 * concern fills with its handlers, and each handler's state check: DESIGN.md "Trust"); the
 * workers' common messages; round trips of one step's commands. A message the rules refuse is
 * counted and logged at a bounded rate, never acted on. */
#include "stages/coord/coord_ctl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ipc/codec.h"
#include "ipc/util.h"
#include "stages/coord/coord_setup.h"

/* The process whose key sent a message: one key per process start, bound to "<id>@<start>";
 * on another host the host's key vouches for the processes it runs, named by the routing id
 * ("stage.2.0#..." or "stage.2.0/hb#..."). NULL when none; *old is set when the key was an
 * earlier start's of a process (what a replaced loader left in the queue). */
static coord_proc_t *sender(coord_t *c, const ctl_peer_t *from, int *old)
{
    *old = 0;
    if (!strncmp(from->user, "host.", 5)) {
        int h = atoi(from->user + 5);
        size_t n = strcspn(from->route, "/#");
        for (int i = 0; i < c->np; i++)
            if (c->p[i].remote && c->p[i].host == h && strlen(c->p[i].id) == n &&
                !strncmp(c->p[i].id, from->route, n))
                return &c->p[i];
        return NULL;
    }
    for (int i = 0; i < c->np; i++) {
        if (c->p[i].user[0] && !strcmp(c->p[i].user, from->user))
            return &c->p[i];
        *old |= c->p[i].old_user[0] && !strcmp(c->p[i].old_user, from->user);
    }
    return NULL;
}

void coord_send(coord_t *c, coord_proc_t *p, msg_t *m)
{
    char name[64];
    int rc = p->route[0] ? ctl_send(c->ctl, p->route, m) : -EHOSTUNREACH;
    if (rc == -EHOSTUNREACH && p->route[0] && !p->remote && p->pid) {
        /* its connection is gone: a process of this host that died and is not reaped yet (the
         * reaper takes it to its recovery, which sends again what it owes), or one that lives
         * without its connection (heartbeats, the watchdog) */
        LOG_W("cannot send %s to %s (pid %d): its connection is gone; waiting for its exit",
              msg_type_name(m->type), coord_who(p, name, sizeof(name)), (int)p->pid);
        return;
    }
    if (rc)
        coord_fail_proc(c, p, "cannot send %s to %s: %s", msg_type_name(m->type), coord_who(p, name, sizeof(name)),
                        p->route[0] ? strerror(-rc) : "it has not said hello");
}

void coord_reply_cli(coord_t *c, const char *to, int ok, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    msg_t m = {.type = MSG_REPLY, .ok = ok, .text = text, .text_len = strlen(text)};
    if (ctl_send(c->ctl, to, &m))
        log_limited(&c->unanswered, LOG_WARN, "cannot answer the operator (gone?): %s", text);
}

/* ---- one handler per message type ---- */

static const char *on_hello(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    if (p->hello)
        return "it said hello already";
    p->hello = 1;
    snprintf(p->route, sizeof(p->route), "%s", from->route); /* where its commands go from now on */
    msg_t cfg = {.type = MSG_CONFIG, .step = c->step, .text = c->toml, .text_len = strlen(c->toml)};
    coord_send(c, p, &cfg);
    coord_run_hooks(c, c->reg.hello, c->reg.n_hello, p);
    return NULL;
}

static const char *on_ready(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    char name[64];
    if (!p->hello)
        return "ready before hello";
    if (p->ready)
        return "it is ready already";
    p->ready = 1;
    LOG_D("%s is ready (pid %d)", coord_who(p, name, sizeof(name)), (int)p->pid);
    coord_run_hooks(c, c->reg.ready, c->reg.n_ready, p);
    return NULL;
}

/* Answered on the socket it came from (the worker's heartbeat thread): the worker's view of
 * our health. */
static const char *on_heartbeat(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    if (m->progress != p->progress) { /* the step watchdog's sign of progress */
        p->progress = m->progress;
        p->progress_at = util_now();
    }
    msg_t hb = {.type = MSG_HEARTBEAT, .rank = 0, .replica = 0, .pid = getpid()};
    snprintf(hb.role, sizeof(hb.role), "coordinator");
    if (ctl_send(c->ctl, from->route, &hb))
        LOG_D("cannot answer the heartbeat of %s", p->id);
    return NULL;
}

static const char *on_error(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    char name[64];
    if (p == c->trial.p) {
        snprintf(c->trial.why, sizeof(c->trial.why), "the new loader failed: %s", m->text ? m->text : "");
        c->trial.failed = 1;
    } else {
        coord_fail_proc(c, p, "%s: %s", coord_who(p, name, sizeof(name)), m->text ? m->text : "(no reason given)");
    }
    return NULL;
}

/* STEP_DONE, REDUCED, UPDATED: the reply p owes in the round in progress, once. */
static const char *on_reply(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    if (p->await != m->type)
        return "no round is waiting for it from this process";
    if (m->step != c->step)
        return "not the step in progress";
    p->await = 0;
    p->got = 1;
    p->replied_at = util_now();
    p->reply = *m;
    p->reply.text = NULL;
    p->reply.data = NULL;
    return NULL;
}

/* ---- who may send what ---- */

void coord_ctl_init(coord_t *c)
{
    coord_handle(c, MSG_HELLO, COORD_FROM_WORKERS, on_hello);
    coord_handle(c, MSG_READY, COORD_FROM_WORKERS, on_ready);
    coord_handle(c, MSG_HEARTBEAT, COORD_FROM_WORKERS, on_heartbeat);
    coord_handle(c, MSG_ERROR, COORD_FROM_WORKERS, on_error);
    coord_handle(c, MSG_STEP_DONE, COORD_FROM(COORD_STAGE), on_reply);
    coord_handle(c, MSG_REDUCED, COORD_FROM(COORD_OPTSHARD), on_reply);
    coord_handle(c, MSG_UPDATED, COORD_FROM(COORD_OPTSHARD), on_reply);
}

static const char *role_names[] = {"loader", "stage", "optimizer shard", "checkpointd"};

static void reject(coord_t *c, const ctl_peer_t *from, const char *type, const char *why)
{
    char route[CODEC_PRINTABLE];
    codec_printable(from->route, strlen(from->route), route);
    log_limited(&c->rejected, LOG_WARN, "rejected a control message: %s from %s (route '%s'): %s", type,
                from->user[0] ? from->user : "?", route, why);
}

/* Whether p may send m on that connection now; NULL if so, else why not. The registry holds each
 * type a worker, the operator or an agent may send, its handler and who may send it (the state
 * in which it is expected is the handler's to check); a type no concern registered (the
 * coordinator's own commands: config, step, reduce, update, stop, reply, snapshot, save, nccl,
 * load, remap) is accepted from nobody. */
static const char *check_sender(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m, char *buf,
                                size_t n)
{
    if (!(c->reg.rules[m->type].who & COORD_FROM(p->role))) {
        snprintf(buf, n, "a %s does not send it", role_names[p->role]);
        return buf;
    }
    /* the messages that name a pid must name the process's (remote ones learn it from hello) */
    int has_pid = m->type == MSG_HELLO || m->type == MSG_READY || m->type == MSG_HEARTBEAT || m->type == MSG_ERROR;
    if (has_pid && m->pid != p->pid) {
        snprintf(buf, n, "it claims pid %lld, the process is pid %d", (long long)m->pid, (int)p->pid);
        return buf;
    }
    if (p->hello && m->type != MSG_HEARTBEAT && strcmp(from->route, p->route))
        return "not from the socket it said hello on";
    return NULL;
}

static void on_message(coord_t *c, const ctl_peer_t *from, const msg_t *m)
{
    if ((unsigned)m->type >= MSG_TYPE_END) /* the decoder lets none through; the table ends there */
        return;
    const char *type = msg_type_name(m->type), *why;
    char buf[128];
    if (!strcmp(from->user, COORD_OPERATOR)) {
        why = c->reg.rules[m->type].who & COORD_FROM_OPERATOR ? c->reg.rules[m->type].fn(c, NULL, from, m)
                                                              : "the operator does not send it";
        if (why)
            reject(c, from, type, why);
        return;
    }
    if (coord_peer_host(from) >= 0 && !strncmp(from->route, "agent.", 6)) { /* another host's agent */
        why = c->on_agent ? c->on_agent(c, coord_peer_host(from), from, m) : "no agent of that host in this job";
        if (why)
            reject(c, from, type, why);
        return;
    }
    int old;
    coord_proc_t *p = sender(c, from, &old);
    if (p && p->remote && p->pid == 0 && m->type == MSG_HELLO && !p->hello) { /* started by its host's agent */
        p->pid = (pid_t)m->pid;
        p->ready = p->got = 0;
        p->started = util_now();
    }
    if (old || (p && p->pid == 0)) { /* what a process that ended left in the queue */
        LOG_D("ignoring %s from %s: not a running process of this job", type, from->user);
        return;
    }
    if (!p)
        why = "not a process of this job";
    else if (!(why = check_sender(c, p, from, m, buf, sizeof(buf))))
        why = c->reg.rules[m->type].fn(c, p, from, m);
    if (why)
        reject(c, from, type, why);
    else
        p->last_hb = util_now(); /* only what was taken counts as a sign of life */
}

/* ---- waiting ---- */

/* Every message waiting on the socket. */
static void receive_all(coord_t *c)
{
    for (;;) {
        ctl_peer_t from;
        char err[256];
        msg_t m;
        int rc = ctl_recv(c->ctl, 0, &from, &m, err, sizeof(err));
        if (rc == -EAGAIN)
            break;
        if (rc == -EBADMSG) {
            reject(c, &from, "a message", err);
            continue;
        }
        if (rc)
            break;
        on_message(c, &from, &m);
        msg_clear(&m);
    }
}

int coord_pump(coord_t *c, int (*cond)(coord_t *, void *), void *arg, double timeout)
{
    double deadline = util_now() + timeout;
    for (;;) {
        if (c->failed || c->interrupted)
            return -1;
        if (cond(c, arg))
            return 0;
        double left = deadline - util_now();
        if (left <= 0)
            return -ETIMEDOUT;
        int hb = c->m->heartbeat_interval_ms;
        /* compared as a double first: the round trips wait up to 1e9 s, past an int's range */
        int ms = left * 1e3 < hb ? (int)(left * 1e3) + 1 : hb;
        zmq_pollitem_t items[2] = {{.socket = ctl_socket(c->ctl), .events = ZMQ_POLLIN},
                                   {.fd = c->sigfd, .events = ZMQ_POLLIN}};
        zmq_poll(items, 2, ms);
        if (items[1].revents & ZMQ_POLLIN) {
            coord_read_signals(c);
            for (int i = 0; i < c->reg.n_signal; i++)
                c->reg.signal[i](c);
        }
        receive_all(c);
        for (int i = 0; i < c->reg.n_tick; i++)
            c->reg.tick[i](c);
    }
}

int coord_wait(coord_t *c, int (*cond)(coord_t *, void *), void *arg)
{
    int rc;
    while (!(rc = coord_pump(c, cond, arg, 1e9)) && c->n_lost)
        if ((rc = c->reg.recover ? c->reg.recover(c) : -1))
            break;
    return rc;
}

/* A worker that fails reports why (ERROR) and then exits; its exit can be seen before the
 * report is read. Handles control messages for up to `secs` until the job has failed, so the
 * worker's own reason wins over "exited with status 1". */
void coord_drain_errors(coord_t *c, double secs)
{
    double deadline = util_now() + secs;
    while (!c->failed && util_now() < deadline) {
        zmq_pollitem_t item = {.socket = ctl_socket(c->ctl), .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, 10) <= 0)
            continue;
        ctl_peer_t from;
        char err[256];
        msg_t m;
        while (!c->failed && ctl_recv(c->ctl, 0, &from, &m, err, sizeof(err)) == 0) {
            on_message(c, &from, &m);
            msg_clear(&m);
        }
    }
}

int coord_all_ready(coord_t *c, void *arg)
{
    for (int i = 0; i < c->np; i++)
        if (!c->p[i].ready && !c->p[i].expect_exit)
            return 0;
    return 1;
}

int coord_proc_gone(coord_t *c, void *proc) { return ((coord_proc_t *)proc)->pid == 0; }

int coord_proc_ready(coord_t *c, void *proc) { return ((coord_proc_t *)proc)->ready; }

typedef struct {
    int first, count;
} span_t;

/* Every process of the span replied, or one of the job's was lost (the registry's recover). */
static int span_got(coord_t *c, void *arg)
{
    span_t *s = arg;
    if (c->n_lost)
        return 1;
    for (int i = s->first; i < s->first + s->count; i++)
        if (!c->p[i].got)
            return 0;
    return 1;
}

int coord_round_trip(coord_t *c, int first, int count, msg_t *m)
{
    msg_type_t reply = m->type == MSG_STEP ? MSG_STEP_DONE : m->type == MSG_REDUCE ? MSG_REDUCED : MSG_UPDATED;
    span_t s = {first, count};
    int rc;
    if (c->n_lost && (rc = c->reg.recover ? c->reg.recover(c) : -1)) /* lost between rounds */
        return rc;
    c->round = *m;
    double now = util_now();
    for (int i = first; i < first + count; i++) {
        c->p[i].got = 0;
        c->p[i].await = reply;
        c->p[i].progress_at = now;
        coord_send(c, &c->p[i], m);
    }
    rc = coord_wait(c, span_got, &s);
    c->round.type = 0;
    return rc;
}
