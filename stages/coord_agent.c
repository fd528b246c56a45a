/* Jobs across hosts (see coord_priv.h; DESIGN.md "Recovery"). Host k > 0 runs an agent
 * (`ctitan launch` with job.host_rank k) that starts its host's workers, connects to the
 * coordinator with the host's key as "agent.<k>", tells it at once when one of its workers
 * dies (LOST), and on REWIND kills every worker of its host and starts them all again at the
 * step the coordinator rewound the job to (coord_rewind.c), its host's segments reset as the
 * coordinator resets its own. On host 0, coord_on_agent takes the agents' messages. */
#include "stages/coord_priv.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/util.h"
#include "stages/staging.h"

/* ---- host 0 ---- */

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

const char *coord_on_agent(coord_t *c, int h, const ctl_peer_t *from, const msg_t *m)
{
    char want[32], name[320];
    int n = snprintf(want, sizeof(want), "agent.%d", h);
    if (!c->agents || h < 1 || h >= c->m->hosts)
        return "no agent of that host in this job";
    if (strncmp(from->route, want, (size_t)n) || (from->route[n] != '#' && from->route[n] != '/'))
        return "an agent speaks for its own host only";
    coord_agent_t *a = &c->agents[h];
    if (m->type == MSG_HELLO) {
        if (strcmp(m->role, "agent") || m->rank != h)
            return "an agent's hello names the role agent and its host";
        snprintf(a->route, sizeof(a->route), "%s", from->route);
        LOG_D("host %d's agent (pid %lld) is connected", h, (long long)m->pid);
        return NULL;
    }
    if (m->type != MSG_LOST)
        return "an agent does not send it";
    if (!a->route[0] || strcmp(from->route, a->route))
        return "not from the socket it said hello on";
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

/* ---- host k > 0: the agent ---- */

/* Connects to the coordinator with the host's key and says hello; without it (a warning) a
 * worker's death ends this host's part of the job, as before rewinds. */
static void connect_up(coord_t *c)
{
    char id[32], err[256];
    snprintf(id, sizeof(id), "agent.%d", c->m->host_rank);
    msg_t hello = {.type = MSG_HELLO, .rank = c->m->host_rank, .pid = getpid()};
    snprintf(hello.role, sizeof(hello.role), "agent");
    if (ctl_client_new(&c->up, c->endpoint, id, c->server_pub, &c->keys, err, sizeof(err)) ||
        ctl_send(c->up, NULL, &hello)) {
        LOG_W("host %d: cannot reach the coordinator at %s (%s): a lost worker fails the job", c->m->host_rank,
              c->endpoint, err);
        ctl_destroy(&c->up);
    }
}

/* REWIND: every worker of this host killed, the host's segments back to the step, all
 * started again (they get their config from the coordinator). */
static void rewind_host(coord_t *c, const msg_t *m)
{
    char err[512];
    for (int i = 0; i < c->np; i++)
        if (!c->p[i].remote && c->p[i].pid) {
            c->p[i].expect_exit = 1;
            kill(c->p[i].pid, SIGKILL);
        }
    for (int i = 0; i < c->np; i++)
        if (!c->p[i].remote && c->p[i].pid) {
            while (waitpid(c->p[i].pid, NULL, 0) < 0 && errno == EINTR)
                ;
            c->p[i].pid = 0;
        }
    if (coord_rewind_segments(c, m->step, m->ok, m->data, m->data_len, err, sizeof(err))) {
        fprintf(stderr, "launch: host %d: cannot rewind to step %lld: %s\n", c->m->host_rank, (long long)m->step,
                err);
        return; /* nothing runs: the agent ends, and the coordinator fails the job by the heartbeats */
    }
    for (int i = 0; i < c->np; i++)
        if (!c->p[i].remote)
            coord_spawn(c, &c->p[i]);
    printf("launch: host %d: the job was rewound to step %lld: its processes started again\n", c->m->host_rank,
           (long long)m->step);
    fflush(stdout);
}

int coord_agent(coord_t *c)
{
    const manifest_t *m = c->m;
    if (c->step >= m->steps) { /* the coordinator says so too, and stops */
        printf("launch: host %d: the checkpoint is at step %lld: nothing left to train\n", m->host_rank,
               (long long)c->step);
        return 0;
    }
    int n = 0;
    for (int i = 0; i < c->np; i++)
        if (!c->p[i].remote) {
            coord_spawn(c, &c->p[i]);
            n++;
        }
    printf("launch: host %d of %d: %d processes of job %s, coordinator at %s\n", m->host_rank, m->hosts, n, m->name,
           c->endpoint);
    fflush(stdout);
    connect_up(c);
    int status = 0;
    double failed_at = 0;
    while (!coord_none_running(c)) {
        coord_read_signals(c);
        int st;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
            for (int i = 0; i < c->np; i++) {
                coord_proc_t *p = &c->p[i];
                if (p->pid != pid || p->remote)
                    continue;
                p->pid = 0;
                if (!WIFEXITED(st) || WEXITSTATUS(st)) {
                    char how[128], name[64];
                    coord_describe_exit(st, how, sizeof(how));
                    fprintf(stderr, "launch: host %d: %s %s\n", m->host_rank, coord_who(p, name, sizeof(name)), how);
                    status = 1;
                    msg_t lost = {.type = MSG_LOST, .rank = p->rank, .replica = p->replica, .pid = pid,
                                  .text = how, .text_len = strlen(how)};
                    snprintf(lost.role, sizeof(lost.role), "%s", coord_role_name(p->role));
                    /* a worker killed is the coordinator's to recover (a rewind); one that
                     * reported an error fails the job, so the others end soon */
                    if (!(c->up && WIFSIGNALED(st) && ctl_send(c->up, NULL, &lost) == 0))
                        failed_at = failed_at > 0 ? failed_at : util_now();
                }
            }
        if (c->interrupted || (failed_at > 0 && util_now() - failed_at > m->heartbeat_timeout_ms * 2e-3)) {
            coord_terminate_all(c, 2.0);
            break;
        }
        ctl_peer_t from;
        msg_t cmd;
        char err[256];
        if (!c->up) {
            nanosleep(&(struct timespec){0, 20000000L}, NULL);
        } else if (ctl_recv(c->up, 20, &from, &cmd, err, sizeof(err)) == 0) {
            if (cmd.type == MSG_REWIND) {
                rewind_host(c, &cmd);
                status = 0;
            }
            msg_clear(&cmd);
        }
    }
    ctl_destroy(&c->up);
    return c->interrupted ? 128 + c->interrupted : status;
}
