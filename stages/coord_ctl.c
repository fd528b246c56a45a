/* The coordinator's control plane (see coord_priv.h): the event pump that waits on the ROUTER
 * socket and the signal fd, reaps and checks heartbeats between messages, and dispatches
 * each message to the handler of its type; round trips of one step's commands. */
#include "stages/coord_priv.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ipc/log.h"
#include "ipc/util.h"

typedef void (*handler_t)(coord_t *c, coord_proc_t *p, const char *from, const msg_t *m);

static coord_proc_t *find_proc(coord_t *c, const char *from)
{
    size_t n = strcspn(from, "/"); /* "stage.1.0/hb" is the heartbeat socket of stage.1.0 */
    for (int i = 0; i < c->np; i++)
        if (strlen(c->p[i].id) == n && !strncmp(c->p[i].id, from, n))
            return &c->p[i];
    return NULL;
}

void coord_send(coord_t *c, coord_proc_t *p, msg_t *m)
{
    char name[64];
    int rc = ctl_send(c->ctl, p->id, m);
    if (rc)
        coord_fail(c, "cannot send %s to %s: %s", msg_type_name(m->type), coord_who(p, name, sizeof(name)),
                   strerror(-rc));
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
        LOG_W("cannot answer %s (gone?): %s", to, text);
}

/* ---- one handler per message type ---- */

static void on_status(coord_t *c, coord_proc_t *p, const char *from, const msg_t *m)
{
    coord_reply_cli(c, from, 1, "job %s: step %lld of %d, loader pid %d", c->m->name, (long long)c->step + 1,
                    c->m->steps, (int)coord_loader(c)->pid);
}

static void on_hello(coord_t *c, coord_proc_t *p, const char *from, const msg_t *m)
{
    msg_t cfg = {.type = MSG_CONFIG, .step = c->step, .text = c->toml, .text_len = strlen(c->toml)};
    coord_send(c, p, &cfg);
    if (c->nccl_ids && p->role == COORD_STAGE)
        coord_send_nccl_ids(c, p);
}

static void on_ready(coord_t *c, coord_proc_t *p, const char *from, const msg_t *m)
{
    char name[64];
    p->ready = 1;
    LOG_D("%s is ready (pid %d)", coord_who(p, name, sizeof(name)), (int)p->pid);
}

/* Answered on the heartbeat socket: the worker's view of our health. */
static void on_heartbeat(coord_t *c, coord_proc_t *p, const char *from, const msg_t *m)
{
    msg_t hb = {.type = MSG_HEARTBEAT, .rank = 0, .replica = 0, .pid = getpid()};
    snprintf(hb.role, sizeof(hb.role), "coordinator");
    if (ctl_send(c->ctl, from, &hb))
        LOG_D("cannot answer the heartbeat of %s", from);
}

static void on_error(coord_t *c, coord_proc_t *p, const char *from, const msg_t *m)
{
    char name[64];
    if (p->role == COORD_LOADER && c->trial) {
        snprintf(c->trial_why, sizeof(c->trial_why), "the new loader failed: %s", m->text ? m->text : "");
        c->trial_failed = 1;
    } else {
        coord_fail(c, "%s: %s", coord_who(p, name, sizeof(name)), m->text ? m->text : "(no reason given)");
    }
}

/* STEP_DONE, REDUCED, UPDATED: a reply of the round in progress. */
static void on_reply(coord_t *c, coord_proc_t *p, const char *from, const msg_t *m)
{
    if (m->step == c->step) {
        p->got = 1;
        p->reply = *m;
        p->reply.text = NULL;
        p->reply.data = NULL;
    }
}

/* From the `ctitan` command (no process of the job). */
static const handler_t cli_handlers[MSG_TYPE_END] = {
    [MSG_SWAP] = coord_on_swap,
    [MSG_STATUS] = on_status,
};

/* From the job's processes. */
static const handler_t proc_handlers[MSG_TYPE_END] = {
    [MSG_HELLO] = on_hello,
    [MSG_READY] = on_ready,
    [MSG_HEARTBEAT] = on_heartbeat,
    [MSG_ERROR] = on_error,
    [MSG_STEP_DONE] = on_reply,
    [MSG_REDUCED] = on_reply,
    [MSG_UPDATED] = on_reply,
    [MSG_SNAPPED] = coord_on_snapped,
    [MSG_SAVED] = coord_on_saved,
    [MSG_LOADED] = coord_on_loaded,
};

static void on_message(coord_t *c, const char *from, const msg_t *m)
{
    if ((unsigned)m->type >= MSG_TYPE_END) /* the decoder lets none through; the tables end there */
        return;
    if (cli_handlers[m->type]) {
        cli_handlers[m->type](c, NULL, from, m);
        return;
    }
    coord_proc_t *p = find_proc(c, from);
    if (p && p->remote && p->pid == 0 && m->type == MSG_HELLO) { /* started by its host's agent */
        p->pid = (pid_t)m->pid;
        p->ready = p->got = 0;
        p->started = util_now();
    }
    /* messages that name their sender's pid are dropped when it is not the running
     * process: leftovers of a loader that was replaced */
    int has_pid = m->type == MSG_HELLO || m->type == MSG_READY || m->type == MSG_HEARTBEAT || m->type == MSG_ERROR;
    if (!p || p->pid == 0 || (has_pid && m->pid != p->pid)) {
        LOG_D("ignoring %s from %s (pid %lld): not a running process of this job", msg_type_name(m->type),
              from, (long long)m->pid);
        return;
    }
    p->last_hb = util_now();
    if (proc_handlers[m->type])
        proc_handlers[m->type](c, p, from, m);
    else
        LOG_W("ignoring unexpected %s from %s", msg_type_name(m->type), from);
}

/* ---- waiting ---- */

/* Every message waiting on the socket. */
static void receive_all(coord_t *c)
{
    for (;;) {
        char from[CTL_ID_MAX], err[256];
        msg_t m;
        int rc = ctl_recv(c->ctl, 0, from, &m, err, sizeof(err));
        if (rc == -EAGAIN)
            break;
        if (rc == -EBADMSG) {
            LOG_W("rejected a control message: %s", err);
            continue;
        }
        if (rc)
            break;
        on_message(c, from, &m);
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
            coord_reap(c);
        }
        receive_all(c);
        coord_check_heartbeats(c);
    }
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
        char from[CTL_ID_MAX], err[256];
        msg_t m;
        while (!c->failed && ctl_recv(c->ctl, 0, from, &m, err, sizeof(err)) == 0) {
            on_message(c, from, &m);
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

static int span_got(coord_t *c, void *arg)
{
    span_t *s = arg;
    for (int i = s->first; i < s->first + s->count; i++)
        if (!c->p[i].got)
            return 0;
    return 1;
}

int coord_round_trip(coord_t *c, int first, int count, msg_t *m)
{
    for (int i = first; i < first + count; i++) {
        c->p[i].got = 0;
        coord_send(c, &c->p[i], m);
    }
    span_t s = {first, count};
    return coord_pump(c, span_got, &s, 1e9);
}
