/* Jobs across hosts (see coord_agent.h; DESIGN.md "Recovery" and "Launching"). Host k > 0 runs
 * an agent (`ctitan launch` with job.host_rank k) that connects to the coordinator with the
 * host's key as "agent.<k>", says hello and sends heartbeats, and waits for START: where the
 * run begins (the checkpoint the coordinator resumed, loaded into the host's staging segment,
 * or the initial weights). It then starts its host's workers, tells the coordinator at once
 * when one dies (LOST), on REWIND kills every worker of its host and starts them all again at
 * the step the coordinator rewound the job to (coord_rewind.c), and on SAVE_PART writes its
 * host's part of a checkpoint (`checkpointd --save-part`, one process per attempt) and says
 * WRITTEN. A coordinator that stops answering its heartbeats, or another coordinator answering
 * (the supervisor on host 0 relaunched the job), is lost: the agent stops its workers and waits
 * for a coordinator to send START again, job.host_timeout_s at most. Host 0's side of it is
 * coord_hosts.c. */
#include "stages/coord/coord_agent.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/util.h"
#include "stages/coord/coord_proc.h"
#include "stages/coord/coord_resume.h"
#include "stages/coord/coord_rewind.h"
#include "stages/coord/coord_setup.h"
#include "stages/job/staging.h"

/* ---- host k > 0: the agent ---- */

#define PART_TRIES 3 /* a part writer killed is started again this many times in all */

typedef struct {
    ctl_t *up;                /* the connection to the coordinator */
    int running;              /* START carried out: this host's workers run (or ran) */
    double stopped;           /* the coordinator said STOP then (the job ended): exit once they have */
    char given_up[512];       /* host 0's supervisor gave the job up (GIVEN_UP): why; exit 1 */
    int failed;               /* a worker of this host failed (the job fails: a relaunch may follow) */
    double failed_at;
    double last_answer;       /* the coordinator's last heartbeat answer, */
    int64_t coord_pid;        /* and its pid (0: none since START) */
    double last_beat, last_hello;
    double deadline;          /* waiting for START: give up then */
    pid_t part;               /* the checkpoint part being written (0: none), */
    int part_out;             /* its standard output (the "written BYTES SECONDS" line) */
    int64_t part_step;
    char part_tmp[64];
    int part_tries;
    double part_t0;
} agent_t;

/* Connects to the coordinator with the host's key (a new socket: ZeroMQ would keep a dead
 * coordinator's queue) and says hello. Without a socket (a warning) it is tried again. */
static void connect_up(coord_t *c, agent_t *a)
{
    char id[32], err[256];
    ctl_destroy(&a->up);
    snprintf(id, sizeof(id), "agent.%d", c->m->host_rank);
    msg_t hello = {.type = MSG_HELLO, .rank = c->m->host_rank, .pid = getpid()};
    snprintf(hello.role, sizeof(hello.role), "agent");
    a->last_hello = util_now();
    if (ctl_client_new(&a->up, c->endpoint, id, c->server_pub, &c->keys, err, sizeof(err)) ||
        ctl_send(a->up, NULL, &hello)) {
        LOG_W("host %d: cannot reach the coordinator at %s (%s): trying again", c->m->host_rank, c->endpoint, err);
        ctl_destroy(&a->up);
    }
}

/* A line of the progress output, at once (the tests and an operator read it as it comes). */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static void kill_workers(coord_t *c)
{
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
}

static void stop_part(agent_t *a)
{
    if (a->part > 0) {
        kill(a->part, SIGKILL);
        while (waitpid(a->part, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    if (a->part_out >= 0)
        close(a->part_out);
    a->part = 0;
    a->part_out = -1;
}

/* This host's workers stopped, and a coordinator awaited: `why` says what happened. */
static void lose_coordinator(coord_t *c, agent_t *a, const char *why)
{
    kill_workers(c);
    stop_part(a);
    a->running = a->failed = 0;
    a->coord_pid = 0;
    a->deadline = util_now() + c->m->host_timeout_s;
    say("launch: host %d: %s: its processes stopped; waiting up to %d s (job.host_timeout_s) for the coordinator "
        "at %s", c->m->host_rank, why, c->m->host_timeout_s, c->endpoint);
    connect_up(c, a);
}

/* START: this host's segments as at the start of step m->step, from the checkpoint it names
 * (loaded into the staging segment) or the initial weights, then every worker started. */
static int start_host(coord_t *c, agent_t *a, const msg_t *m)
{
    char err[1024];
    int from = m->ok && m->text && m->text[0];
    if (from && coord_resume_host(c, m->text, m->step, err, sizeof(err))) {
        fprintf(stderr, "launch: %s\n", err);
        return -1;
    }
    if (coord_rewind_segments(c, m->step, from, m->data, m->data_len, err, sizeof(err))) {
        fprintf(stderr, "launch: host %d: cannot start at step %lld: %s\n", c->m->host_rank, (long long)m->step, err);
        return -1;
    }
    int n = 0;
    for (int i = 0; i < c->np; i++)
        if (!c->p[i].remote) {
            coord_spawn(c, &c->p[i]);
            n++;
        }
    a->running = 1;
    a->failed = 0;
    a->coord_pid = 0;
    a->last_answer = util_now();
    say("launch: host %d of %d: %d processes of job %s from step %lld (%s), coordinator at %s", c->m->host_rank,
        c->m->hosts, n, c->m->name, (long long)m->step + 1, from ? m->text : "the initial weights", c->endpoint);
    return 0;
}

/* REWIND: every worker of this host killed, the host's segments back to the step, all
 * started again (they get their config from the coordinator). */
static void rewind_host(coord_t *c, agent_t *a, const msg_t *m)
{
    char err[512];
    kill_workers(c);
    if (coord_rewind_segments(c, m->step, m->ok, m->data, m->data_len, err, sizeof(err))) {
        fprintf(stderr, "launch: host %d: cannot rewind to step %lld: %s\n", c->m->host_rank, (long long)m->step,
                err);
        lose_coordinator(c, a, "it could not rewind"); /* the job fails without this host's processes */
        return;
    }
    for (int i = 0; i < c->np; i++)
        if (!c->p[i].remote)
            coord_spawn(c, &c->p[i]);
    say("launch: host %d: the job was rewound to step %lld: its processes started again", c->m->host_rank,
        (long long)m->step);
}

/* `checkpointd --job JOB --save-part TMP --step N` with the manifest on its standard input,
 * at idle priority (it lowers itself): this host's part of the checkpoint in flight. */
static void start_part(coord_t *c, agent_t *a)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC))
        return;
    if (pipe2(out, O_CLOEXEC)) {
        close(in[0]), close(in[1]);
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        char exe[PATH_MAX + 32], step[24];
        snprintf(exe, sizeof(exe), "%s/checkpointd", c->bin_dir);
        snprintf(step, sizeof(step), "%" PRId64, a->part_step);
        execl(exe, exe, "--job", c->job, "--save-part", a->part_tmp, "--step", step, (char *)NULL);
        fprintf(stderr, "launch: cannot run %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (pid < 0) {
        close(in[1]), close(out[0]);
        return;
    }
    util_write_all(in[1], c->toml, strlen(c->toml)); /* one that died early says why itself */
    close(in[1]);
    a->part = pid;
    a->part_out = out[0];
    a->part_tries++;
}

static void save_part(coord_t *c, agent_t *a, const msg_t *m)
{
    stop_part(a); /* an earlier attempt's: its directory is gone with the checkpointd that named it */
    if (c->seg_ckpt) /* every shard of every host has copied its slice: this host's snapshot of the step
                      * is whole (host 0 keeps the loader cursor, which goes into the index) */
        atomic_store(&((staging_hdr_t *)shm_data(c->seg_ckpt))->step, m->step);
    a->part_step = m->step;
    snprintf(a->part_tmp, sizeof(a->part_tmp), "%s", m->text ? m->text : "");
    a->part_tries = 0;
    a->part_t0 = util_now();
    start_part(c, a);
    if (a->part <= 0) {
        msg_t w = {.type = MSG_WRITTEN, .step = a->part_step, .ok = 0};
        char text[160];
        snprintf(text, sizeof(text), "%s: host %d cannot start checkpointd: %s", a->part_tmp, c->m->host_rank,
                 strerror(errno));
        w.text = text, w.text_len = strlen(text);
        ctl_send(a->up, NULL, &w);
    }
}

/* The part writer ended (wait status st): WRITTEN, or once more after a kill. */
static void part_ended(coord_t *c, agent_t *a, int st)
{
    char line[128] = "", text[400], how[128];
    ssize_t n = read(a->part_out, line, sizeof(line) - 1);
    line[n > 0 ? n : 0] = 0;
    close(a->part_out);
    a->part = 0;
    a->part_out = -1;
    unsigned long long bytes = 0;
    double secs = 0;
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0 && sscanf(line, "written %llu %lf", &bytes, &secs) == 2;
    if (!ok && WIFSIGNALED(st) && a->part_tries < PART_TRIES) {
        fprintf(stderr, "launch: host %d: the writer of its part of the checkpoint of step %lld %s: writing it "
                "again\n", c->m->host_rank, (long long)a->part_step, coord_describe_exit(st, how, sizeof(how)));
        start_part(c, a);
        if (a->part > 0)
            return;
    }
    if (ok)
        snprintf(text, sizeof(text), "%s", a->part_tmp);
    else
        snprintf(text, sizeof(text), "%s: host %d's checkpointd --save-part %s (its reason is in host %d's output)",
                 a->part_tmp, c->m->host_rank, coord_describe_exit(st, how, sizeof(how)), c->m->host_rank);
    msg_t w = {.type = MSG_WRITTEN, .step = a->part_step, .ok = ok, .text = text, .text_len = strlen(text),
               .t_busy = util_now() - a->part_t0, .progress = bytes};
    if (!a->up || ctl_send(a->up, NULL, &w))
        LOG_W("host %d: cannot tell the coordinator that its part of step %lld is written", c->m->host_rank,
              (long long)a->part_step);
}

/* Children that ended: a worker (LOST when killed; its failure noted) or the part writer. */
static void reap(coord_t *c, agent_t *a)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        if (pid == a->part) {
            part_ended(c, a, st);
            continue;
        }
        for (int i = 0; i < c->np; i++) {
            coord_proc_t *p = &c->p[i];
            if (p->pid != pid || p->remote)
                continue;
            p->pid = 0;
            if (WIFEXITED(st) && !WEXITSTATUS(st))
                continue; /* told to stop */
            char how[128], name[64];
            coord_describe_exit(st, how, sizeof(how));
            fprintf(stderr, "launch: host %d: %s %s\n", c->m->host_rank, coord_who(p, name, sizeof(name)), how);
            msg_t lost = {.type = MSG_LOST, .rank = p->rank, .replica = p->replica, .pid = pid, .text = how,
                          .text_len = strlen(how)};
            snprintf(lost.role, sizeof(lost.role), "%s", coord_role_name(p->role));
            /* a worker killed is the coordinator's to recover (a rewind); one that reported an
             * error fails the job, whose relaunch (if any) this agent waits for */
            if (!(a->up && WIFSIGNALED(st) && ctl_send(a->up, NULL, &lost) == 0) && !a->failed) {
                a->failed = 1;
                a->failed_at = util_now();
            }
        }
    }
}

/* One message from the coordinator. */
static int on_command(coord_t *c, agent_t *a, const msg_t *m)
{
    if (m->type == MSG_HEARTBEAT) {
        a->last_answer = util_now();
        if (a->running && a->coord_pid && m->pid != a->coord_pid) {
            char why[96];
            snprintf(why, sizeof(why), "another coordinator (pid %lld) answers: the job was relaunched",
                     (long long)m->pid);
            lose_coordinator(c, a, why);
        } else if (a->running) {
            a->coord_pid = m->pid;
        }
    } else if (m->type == MSG_START) {
        if (a->running) /* a coordinator this agent had not noticed was replaced */
            lose_coordinator(c, a, "a new coordinator sent START");
        return start_host(c, a, m);
    } else if (m->type == MSG_REWIND && a->running) {
        rewind_host(c, a, m);
    } else if (m->type == MSG_SAVE_PART && a->running) {
        save_part(c, a, m);
    } else if (m->type == MSG_STOP) {
        a->stopped = util_now();
    } else if (m->type == MSG_GIVEN_UP && !a->given_up[0]) {
        snprintf(a->given_up, sizeof(a->given_up), "%.*s", (int)(m->text_len < 500 ? m->text_len : 500),
                 m->text_len ? m->text : "(no reason given)");
        a->stopped = util_now(); /* the workers go as the agent exits */
    }
    return 0;
}

int coord_agent(coord_t *c)
{
    const manifest_t *m = c->m;
    agent_t a = {.part_out = -1, .deadline = util_now() + m->host_timeout_s};
    double beat = m->heartbeat_interval_ms * 1e-3, limit = m->heartbeat_timeout_ms * 1e-3;
    int status = 1;
    say("launch: host %d of %d: job %s, waiting for the coordinator at %s", m->host_rank, m->hosts, m->name,
        c->endpoint);
    connect_up(c, &a);
    for (;;) {
        coord_read_signals(c);
        if (c->interrupted) {
            status = 128 + c->interrupted;
            break;
        }
        reap(c, &a);
        double now = util_now();
        if (a.stopped > 0) { /* the job ended: its workers were told to stop too */
            if (a.given_up[0]) {
                fprintf(stderr, "launch: host %d: host 0 gave the job up, no coordinator will come: %s\n",
                        m->host_rank, a.given_up);
                break;
            }
            if (coord_none_running(c) || now - a.stopped > COORD_STOP_GRACE_S) {
                say("launch: host %d: the job has ended", m->host_rank);
                status = 0;
                break;
            }
            nanosleep(&(struct timespec){0, 20000000L}, NULL);
            continue;
        }
        if (a.running && now - a.last_answer > limit) {
            char why[128];
            snprintf(why, sizeof(why), "the coordinator has not answered for %.1f s", now - a.last_answer);
            lose_coordinator(c, &a, why);
        } else if (a.running && a.failed && now - a.failed_at > 2 * limit) {
            lose_coordinator(c, &a, "a process of this host failed and the job did not go on");
        }
        if (!a.running && now > a.deadline) {
            fprintf(stderr, "launch: host %d: no coordinator at %s started the job in %d s (job.host_timeout_s): "
                    "giving up\n", m->host_rank, c->endpoint, m->host_timeout_s);
            break;
        }
        if (!a.running && !a.up && now - a.last_hello > 1.0) {
            connect_up(c, &a); /* again: the socket could not be made */
        } else if (!a.running && now - a.last_hello > 1.0) { /* again, on the same socket: a coordinator
                                                               * that was not there yet gets it */
            msg_t hello = {.type = MSG_HELLO, .rank = m->host_rank, .pid = getpid()};
            snprintf(hello.role, sizeof(hello.role), "agent");
            ctl_send(a.up, NULL, &hello);
            a.last_hello = now;
        }
        if (a.up && now - a.last_beat >= beat) {
            msg_t hb = {.type = MSG_HEARTBEAT, .rank = m->host_rank, .pid = getpid()};
            snprintf(hb.role, sizeof(hb.role), "agent");
            ctl_send(a.up, NULL, &hb);
            a.last_beat = now;
        }
        ctl_peer_t from;
        msg_t cmd;
        char err[256];
        if (!a.up) {
            nanosleep(&(struct timespec){0, 20000000L}, NULL);
        } else if (ctl_recv(a.up, 20, &from, &cmd, err, sizeof(err)) == 0) {
            int rc = on_command(c, &a, &cmd);
            msg_clear(&cmd);
            if (rc)
                break; /* cannot start: the coordinator fails the job when this host does not come */
        }
    }
    coord_terminate_all(c, 2.0);
    stop_part(&a);
    ctl_destroy(&a.up);
    return status;
}
