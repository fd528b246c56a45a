/* Host 0's side of the other hosts' agents (see coord_hosts.h; DESIGN.md "Recovery" and
 * "Launching"; the agent itself is coord_agent.c). An agent connects with its host's key as
 * "agent.<k>", says hello and sends heartbeats, and waits for START; its host's workers then
 * talk to this coordinator themselves. It tells of a worker of its host that died (LOST: the
 * registry's policy decides whether the recovery takes it), and of its part of a checkpoint
 * (WRITTEN: the registry's handler, coord_ckpt.c). An agent silent for heartbeat_timeout_ms
 * fails the job (its host is lost): the supervisor relaunches it from the newest checkpoint,
 * and that run waits for every host to be back. */
#include "stages/coord/coord_hosts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/util.h"
#include "stages/coord/coord_keys.h"
#include "stages/coord/coord_setup.h"
#include "stages/job/ldr_info.h"

typedef struct {
    char route[CTL_ROUTE_MAX];        /* its socket, from its hello ("" before): where START, REWIND
                                       * and SAVE_PART go */
    int64_t pid;                      /* its pid, from its hello */
    double last_hb;                   /* when it was last heard from (hello, heartbeat, any message) */
    int started;                      /* START was sent to it in this run */
} agent_t;

struct coord_hosts {
    agent_t *a;                       /* [h] the agent of host h > 0 */
    int go;                           /* the run knows where it starts: START to every agent that says hello */
    int64_t step;                     /* START's: the step, */
    char load[sizeof(((manifest_t *)0)->ckpt_load)]; /* the checkpoint ("" the initial weights), */
    uint8_t cursor[LDR_CURSOR_MAX];   /* the loader cursor */
    size_t cursor_len;
};

int coord_hosts_any(const coord_t *c) { return c->hosts != NULL; }

int64_t coord_hosts_pid(const coord_t *c, int h) { return c->hosts && h > 0 && h < c->m->hosts ? c->hosts->a[h].pid : 0; }

int coord_hosts_send(coord_t *c, int h, const msg_t *m)
{
    if (!c->hosts || h < 1 || h >= c->m->hosts || !c->hosts->a[h].route[0])
        return -EHOSTUNREACH;
    return ctl_send(c->ctl, c->hosts->a[h].route, m);
}

/* Host h's process that m names, or NULL. */
static coord_proc_t *named(coord_t *c, int h, const msg_t *m)
{
    for (int i = 0; i < c->np; i++) {
        coord_proc_t *p = &c->p[i];
        if (p->remote && p->host == h && p->rank == m->rank && p->replica == m->replica &&
            !strcmp(coord_role_name(p->role), m->role))
            return p;
    }
    return NULL;
}

static void send_start(coord_t *c, int h)
{
    struct coord_hosts *H = c->hosts;
    int resumed = H->load[0] != 0;
    msg_t start = {.type = MSG_START, .step = H->step, .ok = resumed, .text = H->load,
                   .text_len = strlen(H->load), .data = H->cursor, .data_len = H->cursor_len};
    if (ctl_send(c->ctl, H->a[h].route, &start))
        coord_fail(c, "cannot send START to host %d's agent", h);
    H->a[h].started = 1;
}

void coord_hosts_start(coord_t *c, int64_t step, const char *load, const uint8_t *cursor, size_t len)
{
    struct coord_hosts *H = c->hosts;
    if (!H)
        return;
    H->go = 1;
    H->step = step;
    snprintf(H->load, sizeof(H->load), "%s", load ? load : "");
    H->cursor_len = len < sizeof(H->cursor) ? len : sizeof(H->cursor);
    memcpy(H->cursor, cursor, H->cursor_len);
    for (int h = 1; h < c->m->hosts && !c->failed; h++)
        if (H->a[h].route[0] && !H->a[h].started)
            send_start(c, h);
}

int coord_hosts_started(coord_t *c, void *arg)
{
    for (int h = 1; c->hosts && h < c->m->hosts; h++)
        if (!c->hosts->a[h].started)
            return 0;
    return 1;
}

const char *coord_hosts_missing(coord_t *c, char *buf, size_t n)
{
    buf[0] = 0;
    for (int h = 1; c->hosts && h < c->m->hosts && strlen(buf) < n - 16; h++)
        if (!c->hosts->a[h].started)
            snprintf(buf + strlen(buf), n - strlen(buf), "%s%d", buf[0] ? ", " : "", h);
    return buf;
}

void coord_hosts_stop(coord_t *c)
{
    if (!c->hosts)
        return;
    msg_t stop = {.type = MSG_STOP};
    for (int h = 1; c->hosts && h < c->m->hosts; h++)
        if (c->hosts->a[h].route[0])
            ctl_send(c->ctl, c->hosts->a[h].route, &stop);
    ctl_linger(c->ctl, 2000);
}

/* An agent silent for job.heartbeat_timeout_ms (its host died, or is cut off) fails the job. */
static void check(coord_t *c)
{
    double now = util_now(), limit = c->m->heartbeat_timeout_ms * 1e-3;
    for (int h = 1; h < c->m->hosts && !c->failed; h++) {
        agent_t *a = &c->hosts->a[h];
        if (a->route[0] && now - a->last_hb > limit)
            coord_fail(c, "host %d's agent (pid %lld) has not been heard from for %.1f s: the host is lost or cut "
                       "off, and its processes with it", h, (long long)a->pid, now - a->last_hb);
    }
}

/* LOST: a worker of host h died; the recovery takes it, or the job fails. */
static const char *on_lost(coord_t *c, int h, const msg_t *m)
{
    char name[320];
    coord_proc_t *p = named(c, h, m);
    if (!p)
        return "no such process on that host";
    if (p->pid != (pid_t)m->pid || p->lost)
        return NULL; /* a predecessor's, or known already */
    snprintf(name, sizeof(name), "(pid %lld) %.200s on host %d", (long long)m->pid, m->text ? m->text : "died", h);
    if (coord_can_recover(c, p)) {
        p->pid = 0;
        coord_lost(c, p, name);
    } else {
        char who[64];
        coord_fail_proc(c, p, "%s %s", coord_who(p, who, sizeof(who)), name);
    }
    return NULL;
}

/* A message from host h's agent (its key is the host's, its route "agent.<h>..."): its HELLO
 * (where START, REWIND and SAVE_PART go), HEARTBEAT (answered), LOST, and what the registry
 * takes from agents (WRITTEN). Returns NULL or why it is refused. */
static const char *on_agent(coord_t *c, int h, const ctl_peer_t *from, const msg_t *m)
{
    char want[32];
    int n = snprintf(want, sizeof(want), "agent.%d", h);
    if (h < 1 || h >= c->m->hosts)
        return "no agent of that host in this job";
    if (strncmp(from->route, want, (size_t)n) || (from->route[n] != '#' && from->route[n] != '/'))
        return "an agent speaks for its own host only";
    agent_t *a = &c->hosts->a[h];
    if (m->type == MSG_HEARTBEAT) {
        /* answered whoever it is: an agent that still follows a coordinator before this one
         * learns from the pid that it was replaced */
        msg_t hb = {.type = MSG_HEARTBEAT, .pid = getpid()};
        snprintf(hb.role, sizeof(hb.role), "coordinator");
        ctl_send(c->ctl, from->route, &hb);
        if (a->route[0] && !strcmp(from->route, a->route))
            a->last_hb = util_now();
        return NULL;
    }
    if (m->type == MSG_HELLO) {
        if (strcmp(m->role, "agent") || m->rank != h)
            return "an agent's hello names the role agent and its host";
        if (a->route[0] && !strcmp(from->route, a->route))
            return NULL; /* said again while it waited for START */
        if (a->started) { /* it lost this coordinator and stopped its processes: the job cannot go on */
            coord_fail(c, "host %d's agent (pid %lld) lost the coordinator and said hello again: its processes "
                       "were stopped", h, (long long)m->pid);
            return NULL;
        }
        snprintf(a->route, sizeof(a->route), "%s", from->route); /* the newest socket of a waiting agent */
        a->pid = m->pid;
        a->last_hb = util_now();
        LOG_D("host %d's agent (pid %lld) is connected", h, (long long)m->pid);
        if (c->hosts->go)
            send_start(c, h);
        return NULL;
    }
    if (!a->route[0] || strcmp(from->route, a->route))
        return "not from the socket it said hello on";
    a->last_hb = util_now();
    if (m->type == MSG_LOST)
        return on_lost(c, h, m);
    if (c->reg.rules[m->type].who & COORD_FROM_AGENT)
        return c->reg.rules[m->type].fn(c, NULL, from, m);
    return "an agent does not send it";
}

int coord_hosts_init(coord_t *c)
{
    if (c->m->hosts < 2 || c->m->host_rank != 0)
        return 0;
    if (!(c->hosts = calloc(1, sizeof(*c->hosts))) || !(c->hosts->a = calloc((size_t)c->m->hosts, sizeof(agent_t))))
        return -ENOMEM;
    c->on_agent = on_agent;
    coord_on_tick(c, check);
    return 0;
}

void coord_hosts_free(coord_t *c)
{
    if (!c->hosts)
        return;
    free(c->hosts->a);
    free(c->hosts);
    c->hosts = NULL;
}

/* ---- after the last run: the other hosts told that no coordinator will come ---- */

int coord_farewell(const manifest_t *m, const char *why, double wait_s, int (*stop)(void *arg), void *arg)
{
    if (m->hosts < 2 || m->host_rank != 0)
        return 0;
    coord_t c = {.m = (manifest_t *)m, .sigfd = -1};
    char err[512];
    int rc, *told = calloc((size_t)m->hosts, sizeof(int)), left = m->hosts - 1;
    if (!told)
        return -ENOMEM;
    if ((rc = coord_resolve_endpoint(&c, err, sizeof(err))) || (rc = coord_keys_setup(&c, err, sizeof(err))) ||
        (rc = ctl_server_new(&c.ctl, c.keys.sec, err, sizeof(err))) ||
        (rc = coord_keys_allow_hosts(&c, err, sizeof(err))) || (rc = ctl_bind(c.ctl, c.endpoint, err, sizeof(err)))) {
        fprintf(stderr, "ctitan: job %s: cannot tell the other hosts that it ended: %s\n", m->name, err);
        goto out;
    }
    msg_t bye = {.type = MSG_GIVEN_UP, .text = (char *)why, .text_len = strlen(why)};
    for (double end = util_now() + wait_s; left > 0 && util_now() < end && !(stop && stop(arg));) {
        ctl_peer_t from;
        msg_t in;
        if (ctl_recv(c.ctl, 50, &from, &in, err, sizeof(err)))
            continue;
        /* an agent's hello or heartbeat, from its own host's key and socket: answered once */
        int h = !strncmp(from.user, "host.", 5) ? atoi(from.user + 5) : 0;
        char want[32];
        int n = snprintf(want, sizeof(want), "agent.%d", h);
        if (h > 0 && h < m->hosts && !told[h] && (in.type == MSG_HELLO || in.type == MSG_HEARTBEAT) &&
            !strcmp(in.role, "agent") && !strncmp(from.route, want, (size_t)n) &&
            (from.route[n] == '#' || from.route[n] == '/') && ctl_send(c.ctl, from.route, &bye) == 0) {
            told[h] = 1;
            left--;
        }
        msg_clear(&in);
    }
    if (left > 0)
        fprintf(stderr, "ctitan: job %s: %d other host%s did not answer within %.0f s: %s agent%s wait%s "
                "job.host_timeout_s (%d s) for a coordinator\n", m->name, left, left == 1 ? "" : "s", wait_s,
                left == 1 ? "its" : "their", left == 1 ? "" : "s", left == 1 ? "s" : "", m->host_timeout_s);
    ctl_linger(c.ctl, 2000);
out:
    ctl_destroy(&c.ctl);
    free(told);
    return rc;
}
