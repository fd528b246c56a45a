/* The coordinator's process table and its supervision (see coord_proc.h): who runs where,
 * starting a worker, reaping it (the loader and checkpointd are restarted, a stage or shard is
 * the recovery's to replace when the registry's policy says so, anything else fails the job),
 * heartbeats, stopping. */
#include "stages/coord/coord_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/log.h"
#include "ipc/util.h"
#include "stages/coord/coord_ctl.h"
#include "stages/coord/coord_keys.h"
#include "stages/job/ldr_seg.h"
#include "stages/runtime/plane.h"

#define MAX_LOADER_RESTARTS 10
#define MAX_CKPTD_RESTARTS 10

static void reap(coord_t *c);
static void check_heartbeats(coord_t *c);

/* Every process of the job: [0] this host's loader, the stages, the shards, checkpointd, then
 * the other hosts' loaders (job.hosts > 1). Host h runs replicas [h * dp / hosts, ...): their
 * stages, their NCCL shards, a loader. The coordinator marks other hosts' processes remote;
 * an agent keeps only its own. */
int coord_make_table(coord_t *c)
{
    const manifest_t *m = c->m;
    c->n_stages = m->pp * m->dp;
    c->has_ckptd = m->ckpt_enable || manifest_loads(m);
    c->np = 1 + c->n_stages + m->shards + c->has_ckptd + (m->hosts - 1);
    if (!(c->p = calloc((size_t)c->np, sizeof(coord_proc_t))))
        return -ENOMEM;
    coord_on_signal(c, reap);
    coord_on_tick(c, check_heartbeats);
    c->p[0] = (coord_proc_t){.role = COORD_LOADER, .rank = m->host_rank, .host = m->host_rank};
    for (int r = 0; r < m->dp; r++)
        for (int s = 0; s < m->pp; s++)
            *coord_stage(c, s, r) = (coord_proc_t){.role = COORD_STAGE, .rank = s, .replica = r,
                                                   .host = job_host_of(&c->lay, r)};
    for (int k = 0; k < m->shards; k++) { /* beside the stage its slice's sum is in, or on host 0 */
        int r, s;
        plane_shard_beside(plane_transport(&c->lay), &c->lay, k, &r, &s);
        *coord_shard(c, k) = (coord_proc_t){.role = COORD_OPTSHARD, .rank = k,
                                            .host = r >= 0 ? job_host_of(&c->lay, r) : 0};
    }
    if (c->has_ckptd)
        *coord_ckptd(c) = (coord_proc_t){.role = COORD_CKPTD};
    for (int h = 1, i = c->np - (m->hosts - 1); h < m->hosts; h++, i++) /* host 0's loader is [0] */
        c->p[i] = (coord_proc_t){.role = COORD_LOADER, .rank = h == m->host_rank ? 0 : h,
                                 .host = h == m->host_rank ? 0 : h};
    for (int i = 0; i < c->np; i++) {
        snprintf(c->p[i].id, sizeof(c->p[i].id), "%s.%d.%d", coord_role_name(c->p[i].role), c->p[i].rank,
                 c->p[i].replica);
        c->p[i].remote = c->p[i].host != m->host_rank;
    }
    return 0;
}

/* In the child: its own process group and death signal, its keys' descriptor (keys_fd, kept
 * across exec), then the role's program; a loader command is exec'ed as the argument vector
 * it is (cmd), never through a shell. */
static _Noreturn void exec_worker(coord_t *c, coord_proc_t *p, pid_t parent, int keys_fd, char *const *cmd)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    /* a Ctrl-C must reach only the coordinator, which stops the job in order: unsupervised, each
     * worker takes a process group of its own; under a supervisor the coordinator's group is
     * not the terminal's already, and the worker stays in it, so the supervisor's kill of the
     * group reaches every process of the job. The death signal ends the worker if the
     * coordinator itself is killed. */
    if (!c->sup)
        setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1);
    char host[16], fd[16];
    snprintf(host, sizeof(host), "%d", c->m->host_rank);
    snprintf(fd, sizeof(fd), "%d", keys_fd);
    fcntl(keys_fd, F_SETFD, 0);
    setenv("CTITAN_ENDPOINT", c->endpoint, 1);
    setenv("CTITAN_JOB", c->job, 1);
    setenv("CTITAN_HOST", host, 1);
    setenv(WORKER_ENV_KEYS, fd, 1);
    char exe[PATH_MAX + 32], a1[16], a2[16];
    snprintf(a1, sizeof(a1), "%d", p->rank);
    snprintf(a2, sizeof(a2), "%d", p->replica);
    if (cmd) {
        execvp(cmd[0], cmd);
        snprintf(exe, sizeof(exe), "%s", cmd[0]);
    } else {
        snprintf(exe, sizeof(exe), "%s/ctitan-%s", c->bin_dir, coord_role_name(p->role));
        if (p->role == COORD_CKPTD) {
            snprintf(exe, sizeof(exe), "%s/checkpointd", c->bin_dir);
            execl(exe, exe, "--job", c->job, (char *)NULL);
        } else if (p->role == COORD_LOADER)
            execl(exe, exe, (char *)NULL);
        else if (p->role == COORD_STAGE)
            execl(exe, exe, "--rank", a1, "--replica", a2, (char *)NULL);
        else
            execl(exe, exe, "--rank", a1, (char *)NULL);
    }
    fprintf(stderr, "ctitan: cannot run %s: %s\n", exe, strerror(errno));
    _exit(127);
}

void coord_spawn(coord_t *c, coord_proc_t *p)
{
    char name[64], err[256] = "";
    worker_keys_t k;
    argv_t cmd = {0};
    int rc = coord_keys_for(c, p, &k), fd = -1;
    if (rc || (fd = worker_keys_pipe(&k)) < 0) {
        coord_fail_proc(c, p, "cannot make the keys of %s: %s", coord_who(p, name, sizeof(name)),
                        strerror(rc ? -rc : -fd));
        return;
    }
    memset(&k, 0, sizeof(k));
    if (p->role == COORD_LOADER && c->loader_argv_len &&
        argv_unpack(c->loader_argv, c->loader_argv_len, &cmd, err, sizeof(err))) {
        close(fd);
        coord_fail_proc(c, p, "the loader command: %s", err);
        return;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        coord_fail(c, "cannot fork: %s", strerror(errno));
        close(fd);
        argv_free(&cmd);
        return;
    }
    if (pid == 0)
        exec_worker(c, p, parent, fd, cmd.argv);
    close(fd);
    argv_free(&cmd);
    p->pid = pid;
    p->ready = p->got = p->expect_exit = p->hello = 0;
    p->await = 0;
    p->abort_sent = p->hb_killed = 0;
    p->progress = 0;
    p->route[0] = '\0';
    p->started = p->last_hb = p->progress_at = util_now();
}

static void restart_loader(coord_t *c, const char *how)
{
    coord_proc_t *L = coord_loader(c);
    if (++c->loader_restarts > MAX_LOADER_RESTARTS) {
        coord_fail_proc(c, L, "loader %s, and it has been restarted %d times already", how, MAX_LOADER_RESTARTS);
        return;
    }
    int64_t from;
    if (ldr_seg_prepare_restart(shm_data(c->seg_batch), &from)) {
        coord_fail_proc(c, L, "loader %s, and no cursor is recorded for the step it must resume at", how);
        return;
    }
    coord_spawn(c, L);
    LOG_W("loader %s; restarted (pid %d) from the cursor of step %lld", how, (int)L->pid, (long long)from);
}

/* checkpointd died or was killed for hanging: its temporary directory never becomes a
 * checkpoint, and the new daemon writes the checkpoint in flight again from the staging
 * segment (the registry's restart hooks: coord_ckpt.c, which sends it once it is ready);
 * training goes on meanwhile. */
static void restart_ckptd(coord_t *c, const char *how)
{
    coord_proc_t *d = coord_ckptd(c);
    for (int i = 0; i < c->reg.n_restart; i++)
        c->reg.restart[i](c, d, how);
    if (++c->ckptd_restarts > MAX_CKPTD_RESTARTS) {
        coord_fail_proc(c, d, "checkpointd %s, and it has been restarted %d times already", how, MAX_CKPTD_RESTARTS);
        return;
    }
    coord_spawn(c, d);
    LOG_W("checkpointd %s; restarted (pid %d)", how, (int)d->pid);
}

/* Reaps exited children: the loader and checkpointd are restarted, a stage or shard lost
 * while it may be recovered is the recovery's, anything else fails the job. */
static void reap(coord_t *c)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        coord_proc_t *p = NULL;
        for (int i = 0; i < c->np; i++)
            if (c->p[i].pid == pid && !c->p[i].remote)
                p = &c->p[i];
        if (!p)
            continue;
        char exited[128], how[256], what[320], name[64];
        coord_describe_exit(st, exited, sizeof(exited));
        if (p->abort_sent > 0) /* the step watchdog's doing */
            snprintf(how, sizeof(how), "hung (the step watchdog dumped its stack and stopped it: it %s)", exited);
        else if (p->hb_killed > 0)
            snprintf(how, sizeof(how), "sent no heartbeat for %.1f s (stopped or hung) and was killed", p->hb_killed);
        else
            snprintf(how, sizeof(how), "%s", exited);
        snprintf(what, sizeof(what), "(pid %d) %s", (int)pid, how);
        int was_ready = p->ready;
        p->pid = 0;
        p->ready = 0;
        coord_keys_revoke(c, p);
        if (p->expect_exit || c->failed || c->interrupted)
            continue;
        if (p == c->trial.p) {
            snprintf(c->trial.why, sizeof(c->trial.why), "the new loader %s before it was ready", how);
            c->trial.failed = 1;
        } else if (p->role == COORD_CKPTD && !p->no_restart) { /* a LOAD only it can answer fails the job */
            restart_ckptd(c, how);
        } else if (p->role == COORD_LOADER && was_ready) {
            restart_loader(c, what);
        } else if (WIFSIGNALED(st) && coord_can_recover(c, p)) { /* an exit with a status said why */
            coord_lost(c, p, what);
        } else {
            if (WIFEXITED(st) && WEXITSTATUS(st) != 0) { /* it may have said why just before */
                p->pid = pid;
                coord_drain_errors(c, 0.5);
                p->pid = 0;
            }
            coord_fail_proc(c, p, "%s %s%s", coord_who(p, name, sizeof(name)), what,
                            was_ready ? "" : " before it was ready");
        }
    }
}

/* A process silent for job.heartbeat_timeout_ms is killed to be replaced like a dead one (the
 * loader, checkpointd, a stage or shard the recovery takes) or fails the job. */
static void check_heartbeats(coord_t *c)
{
    double now = util_now(), limit = c->m->heartbeat_timeout_ms * 1e-3;
    char name[64];
    for (int i = 0; i < c->np && !c->failed; i++) {
        coord_proc_t *p = &c->p[i];
        if (p->pid == 0 || p->expect_exit || p->lost)
            continue;
        if (!p->ready) { /* a swap's new loader: the swap times it, and falls back */
            if (p != c->trial.p && now - p->started > coord_startup_s(c))
                coord_fail_proc(c, p, "%s (pid %d) did not become ready in %.0f s", coord_who(p, name, sizeof(name)),
                                (int)p->pid, coord_startup_s(c));
        } else if (now - p->last_hb <= limit) {
            continue;
        } else if (p->remote && coord_can_recover(c, p)) { /* its agent kills it at the rewind */
            char how[128];
            snprintf(how, sizeof(how), "(pid %d) on host %d sent no heartbeat for %.1f s", (int)p->pid, p->host,
                     now - p->last_hb);
            p->pid = 0;
            coord_lost(c, p, how);
        } else if (((p->role == COORD_LOADER || (p->role == COORD_CKPTD && !p->no_restart)) && !p->remote) ||
                   coord_can_recover(c, p)) {
            /* a hung (or stopped) loader, checkpointd, stage or shard is replaced like a dead one: kill
             * it, reap() replaces it */
            LOG_W("%s (pid %d): no heartbeat for %.1f s: killing it to restart it", coord_who(p, name, sizeof(name)),
                  (int)p->pid, now - p->last_hb);
            kill(p->pid, SIGKILL);
            p->hb_killed = now - p->last_hb;
            p->last_hb = now;
        } else {
            coord_fail_proc(c, p, "%s (pid %d): no heartbeat for %.1f s (hung, stopped or dead)",
                            coord_who(p, name, sizeof(name)), (int)p->pid, now - p->last_hb);
        }
    }
}

/* A child of this process (not one an agent started on another host). */
static int local_child(const coord_proc_t *p) { return p->pid > 0 && !p->remote; }

static void kill_all(coord_t *c, int sig)
{
    for (int i = 0; i < c->np; i++)
        if (local_child(&c->p[i]))
            kill(c->p[i].pid, sig);
}

int coord_none_running(coord_t *c)
{
    for (int i = 0; i < c->np; i++)
        if (local_child(&c->p[i]))
            return 0;
    return 1;
}

/* Waits until every child is reaped, at most `secs`. */
static void wait_children(coord_t *c, double secs)
{
    double deadline = util_now() + secs;
    while (!coord_none_running(c) && util_now() < deadline) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            for (int i = 0; i < c->np; i++)
                if (c->p[i].pid == pid && !c->p[i].remote) {
                    c->p[i].pid = 0;
                    coord_keys_revoke(c, &c->p[i]);
                }
        } else {
            nanosleep(&(struct timespec){0, 10000000L}, NULL);
        }
    }
}

void coord_terminate_all(coord_t *c, double grace)
{
    kill_all(c, SIGTERM);
    wait_children(c, grace);
    kill_all(c, SIGKILL);
    wait_children(c, 5.0);
}

static void stop_all(coord_t *c, double grace, double term_grace)
{
    msg_t stop = {.type = MSG_STOP};
    for (int i = 0; i < c->np; i++)
        if (c->p[i].pid > 0) {
            c->p[i].expect_exit = 1;
            if (c->p[i].route[0]) /* one that never said hello gets signals instead */
                ctl_send(c->ctl, c->p[i].route, &stop);
        }
    wait_children(c, grace);
    coord_terminate_all(c, term_grace);
}

void coord_stop_all(coord_t *c) { stop_all(c, COORD_STOP_GRACE_S, 1.0); }

void coord_stop_all_now(coord_t *c) { stop_all(c, COORD_INTERRUPT_GRACE_S, COORD_INTERRUPT_GRACE_S / 2); }

void coord_stop_proc(coord_t *c, coord_proc_t *p)
{
    char name[64];
    if (!p->pid)
        return;
    p->expect_exit = 1;
    msg_t stop = {.type = MSG_STOP};
    if (p->route[0])
        ctl_send(c->ctl, p->route, &stop);
    if (coord_pump(c, coord_proc_gone, p, COORD_STOP_GRACE_S) == -ETIMEDOUT && p->pid) {
        LOG_W("%s (pid %d) did not stop in %.0f s: killing it", coord_who(p, name, sizeof(name)), (int)p->pid,
              COORD_STOP_GRACE_S);
        kill(p->pid, SIGKILL);
        coord_pump(c, coord_proc_gone, p, COORD_STOP_GRACE_S);
    }
}
