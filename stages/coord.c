/* The coordinator (see coord.h). */
#include "stages/coord.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "checkpointd/ckpt.h"
#include "stages/staging.h"
#include "ipc/ctl.h"
#include "ipc/ring.h"
#include "ipc/shm.h"
#include "kernels/cpu/model.h"
#include "stages/cuda_plugin.h"
#include "stages/devdir.h"
#include "stages/job.h"
#include "stages/ldr_seg.h"
#include "stages/evaluate.h"
#include "ipc/log.h"
#include "kernels/cpu/peak.h"
#include "ipc/util.h"

#define STARTUP_TIMEOUT_S 120.0
#define STOP_GRACE_S 5.0
#define MAX_LOADER_RESTARTS 10
#define MAX_CKPTD_RESTARTS 10

typedef enum { P_LOADER, P_STAGE, P_OPTSHARD, P_CKPTD } prole_t;
static const char *role_name[] = {"loader", "stage", "optshard", "checkpointd"};

typedef struct {
    prole_t role;
    int rank, replica;
    char id[CTL_ID_MAX];
    pid_t pid;            /* 0 when not running */
    int ready;            /* said READY since it was (re)started */
    int got;              /* replied in the current round */
    int expect_exit;      /* told to stop: its exit is no failure */
    int host;             /* job.host_rank of the host it runs on */
    int remote;           /* on another host (its agent started it): pid from its hello, never signalled
                           * or reaped here, supervised by heartbeats only */
    double started, last_hb;
    msg_t reply;          /* numbers of the last reply (never its text) */
} proc_t;

typedef struct {
    const manifest_t *m;
    job_layout_t lay;
    char *toml;                       /* the resolved manifest every worker gets */
    char job[96];                     /* this host's segment names: job.name, "-h<k>" on host k > 0 */
    shm_seg_t *seg_job, *seg_params, *seg_grads, *seg_act, *seg_batch, *seg_ckpt, *seg_dev;
    job_hdr_t *hdr;
    int segs_made;                    /* this run created the job's segments */
    ctl_t *ctl;
    char endpoint[256], sock_path[PATH_MAX];
    int sigfd;
    char bin_dir[PATH_MAX];
    proc_t *p;                        /* [0] loader, then pp*dp stages, then the shards, then
                                       * checkpointd (with [checkpoint] enable), then the other
                                       * hosts' loaders (make_table) */
    int np, n_stages;
    char loader_cmd[1024];            /* "" = the built-in loader */
    int loader_restarts;
    int swap_pending, trial, trial_failed;
    char swap_cmd[1024], swap_from[CTL_ID_MAX], trial_why[1024];
    int64_t step;
    /* checkpoints: at most one in flight, from SNAPSHOT to SAVED */
    int ck_busy, ck_snapped, ckptd_restarts;
    int64_t ck_step;
    double ck_t0;
    uint8_t resume_cursor[CKPT_CURSOR_MAX]; /* the loader's, from the checkpoint resumed */
    uint32_t resume_cursor_len;
    int failed, interrupted;
    char why[1536];
    FILE *metrics;
    double peak_gflops;
    double entropy;                   /* of the first training file (NaN with a custom loader) */
    cuda_nccl_id_t *nccl_ids;         /* data_plane "nccl": per replica and boundary an activation and a
                                       * gradient communicator, then one per pipeline rank (replicas) */
    char first_file[PATH_MAX];        /* the first file loader.dataset_path matches */
} coord_t;

static proc_t *stage_proc(coord_t *c, int rank, int replica) { return &c->p[1 + replica * c->m->pp + rank]; }
static proc_t *shard_proc(coord_t *c, int k) { return &c->p[1 + c->n_stages + k]; }
static proc_t *loader_proc(coord_t *c) { return &c->p[0]; }
static proc_t *ckptd_proc(coord_t *c) { return c->m->ckpt_enable ? &c->p[1 + c->n_stages + c->m->shards] : NULL; }

static void fail(coord_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(coord_t *c, const char *fmt, ...)
{
    if (c->failed)
        return; /* the first reason is the cause; what follows is fallout */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof(c->why), fmt, ap);
    va_end(ap);
    c->failed = 1;
}

static const char *describe_exit(int st, char *buf, size_t n)
{
    if (WIFEXITED(st))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, n, "ended (wait status %d)", st);
    return buf;
}

static const char *who(const proc_t *p, char *buf, size_t n)
{
    if (p->role == P_LOADER)
        snprintf(buf, n, "loader");
    else if (p->role == P_STAGE)
        snprintf(buf, n, "stage rank %d replica %d", p->rank, p->replica);
    else if (p->role == P_OPTSHARD)
        snprintf(buf, n, "optshard %d", p->rank);
    else
        snprintf(buf, n, "checkpointd");
    return buf;
}

/* ---- processes ---- */

static void spawn(coord_t *c, proc_t *p)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fail(c, "cannot fork: %s", strerror(errno));
        return;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        /* own process group: a Ctrl-C reaches only the coordinator, which stops the job in
         * order; the death signal ends the worker if the coordinator itself is killed */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        char host[16];
        snprintf(host, sizeof(host), "%d", c->m->host_rank);
        setenv("CTITAN_ENDPOINT", c->endpoint, 1);
        setenv("CTITAN_JOB", c->job, 1);
        setenv("CTITAN_HOST", host, 1);
        char exe[PATH_MAX + 32], a1[16], a2[16];
        snprintf(a1, sizeof(a1), "%d", p->rank);
        snprintf(a2, sizeof(a2), "%d", p->replica);
        if (p->role == P_LOADER && c->loader_cmd[0]) {
            char cmd[1100];
            snprintf(cmd, sizeof(cmd), "exec %s", c->loader_cmd);
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            snprintf(exe, sizeof(exe), "/bin/sh");
        } else {
            snprintf(exe, sizeof(exe), "%s/ctitan-%s", c->bin_dir, role_name[p->role]);
            if (p->role == P_CKPTD) {
                snprintf(exe, sizeof(exe), "%s/checkpointd", c->bin_dir);
                execl(exe, exe, "--job", c->job, (char *)NULL);
            } else if (p->role == P_LOADER)
                execl(exe, exe, (char *)NULL);
            else if (p->role == P_STAGE)
                execl(exe, exe, "--rank", a1, "--replica", a2, (char *)NULL);
            else
                execl(exe, exe, "--rank", a1, (char *)NULL);
        }
        fprintf(stderr, "ctitan: cannot run %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    p->pid = pid;
    p->ready = p->got = p->expect_exit = 0;
    p->started = p->last_hb = util_now();
}

static void restart_loader(coord_t *c, const char *how)
{
    proc_t *L = loader_proc(c);
    if (++c->loader_restarts > MAX_LOADER_RESTARTS) {
        fail(c, "loader %s, and it has been restarted %d times already", how, MAX_LOADER_RESTARTS);
        return;
    }
    int64_t from;
    if (ldr_seg_prepare_restart(shm_data(c->seg_batch), &from)) {
        fail(c, "loader %s, and no cursor is recorded for the step it must resume at", how);
        return;
    }
    spawn(c, L);
    LOG_W("loader %s; restarted (pid %d) from the cursor of step %lld", how, (int)L->pid, (long long)from);
}

/* checkpointd died or was killed for hanging: the checkpoint it was writing is lost (its
 * temporary directory never becomes a checkpoint); training goes on with a new daemon. */
static void restart_ckptd(coord_t *c, const char *how)
{
    proc_t *d = ckptd_proc(c);
    if (c->ck_busy) {
        fprintf(stderr, "ctitan: checkpointd %s while writing the checkpoint of step %lld: that checkpoint is "
                "lost, training goes on\n", how, (long long)c->ck_step);
        c->ck_busy = 0;
    }
    if (++c->ckptd_restarts > MAX_CKPTD_RESTARTS) {
        fail(c, "checkpointd %s, and it has been restarted %d times already", how, MAX_CKPTD_RESTARTS);
        return;
    }
    spawn(c, d);
    LOG_W("checkpointd %s; restarted (pid %d)", how, (int)d->pid);
}

static void on_message(coord_t *c, const char *from, msg_t *m);

/* A worker that fails reports why (ERROR) and then exits; its exit can be seen before the
 * report is read. Handles control messages for up to `secs` until the job has failed, so the
 * worker's own reason wins over "exited with status 1". */
static void drain_errors(coord_t *c, double secs)
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

/* Reaps every exited child. */
static void reap(coord_t *c)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        proc_t *p = NULL;
        for (int i = 0; i < c->np; i++)
            if (c->p[i].pid == pid && !c->p[i].remote)
                p = &c->p[i];
        if (!p)
            continue;
        char how[128], name[64];
        describe_exit(st, how, sizeof(how));
        int was_ready = p->ready;
        p->pid = 0;
        p->ready = 0;
        if (p->expect_exit || c->failed || c->interrupted)
            continue;
        if (p->role == P_LOADER && c->trial) {
            snprintf(c->trial_why, sizeof(c->trial_why), "the new loader %s before it was ready", how);
            c->trial_failed = 1;
        } else if (p->role == P_CKPTD) {
            restart_ckptd(c, how);
        } else if (p->role == P_LOADER && was_ready) {
            char what[160];
            snprintf(what, sizeof(what), "(pid %d) %s", (int)pid, how);
            restart_loader(c, what);
        } else {
            if (WIFEXITED(st) && WEXITSTATUS(st) != 0) { /* it may have said why just before */
                p->pid = pid;
                drain_errors(c, 0.5);
                p->pid = 0;
            }
            fail(c, "%s (pid %d) %s%s", who(p, name, sizeof(name)), (int)pid, how,
                 was_ready ? "" : " before it was ready");
        }
    }
}

/* ---- control plane ---- */

static proc_t *find_proc(coord_t *c, const char *from)
{
    size_t n = strcspn(from, "/"); /* "stage.1.0/hb" is the heartbeat socket of stage.1.0 */
    for (int i = 0; i < c->np; i++)
        if (strlen(c->p[i].id) == n && !strncmp(c->p[i].id, from, n))
            return &c->p[i];
    return NULL;
}

static void send_to(coord_t *c, proc_t *p, msg_t *m)
{
    char name[64];
    int rc = ctl_send(c->ctl, p->id, m);
    if (rc)
        fail(c, "cannot send %s to %s: %s", msg_type_name(m->type), who(p, name, sizeof(name)), strerror(-rc));
}

static void reply_cli(coord_t *c, const char *to, int ok, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void reply_cli(coord_t *c, const char *to, int ok, const char *fmt, ...)
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

/* ---- the NCCL data plane: communicator ids, handed to the stages over the control plane ---- */

static cuda_nccl_id_t *nccl_id(coord_t *c, int kind, int replica, int boundary_or_rank)
{
    int pp = c->m->pp, dp = c->m->dp;
    size_t i = kind < 2 ? ((size_t)replica * (pp - 1) + boundary_or_rank) * 2 + kind
                        : (size_t)dp * (pp - 1) * 2 + boundary_or_rank;
    return &c->nccl_ids[i];
}

/* One id per communicator (ncclGetUniqueId: this process hosts each one's bootstrap root). */
static int make_nccl_ids(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    size_t n = (size_t)m->dp * (m->pp - 1) * 2 + m->pp;
    char why[512];
    const cuda_plugin_t *cu = cuda_plugin_load(why, sizeof(why));
    if (!cu)
        return util_fail(err, errlen, -ENODEV, "parallelism.data_plane = \"nccl\": %s", why);
    if (!(c->nccl_ids = calloc(n, sizeof(cuda_nccl_id_t))))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (cu->nccl_id(&c->nccl_ids[i]))
            return util_fail(err, errlen, -EIO, "parallelism.data_plane = \"nccl\": %s", cu->last_error());
    return 0;
}

/* The communicators stage (rank, replica) joins, as MSG_NCCL's data (stages/job.h's order). */
static void send_nccl_ids(coord_t *c, proc_t *p)
{
    cuda_nccl_id_t ids[JOB_NCCL_COMMS];
    int s = p->rank, r = p->replica, pp = c->m->pp;
    memset(ids, 0, sizeof(ids));
    if (s > 0) {
        ids[JOB_NCCL_ACT_IN] = *nccl_id(c, 0, r, s - 1);
        ids[JOB_NCCL_GRAD_OUT] = *nccl_id(c, 1, r, s - 1);
    }
    if (s < pp - 1) {
        ids[JOB_NCCL_ACT_OUT] = *nccl_id(c, 0, r, s);
        ids[JOB_NCCL_GRAD_IN] = *nccl_id(c, 1, r, s);
    }
    ids[JOB_NCCL_DP] = *nccl_id(c, 2, 0, s);
    msg_t m = {.type = MSG_NCCL, .data = (uint8_t *)ids, .data_len = sizeof(ids)};
    send_to(c, p, &m);
}

static void on_message(coord_t *c, const char *from, msg_t *m)
{
    char name[64];
    if (m->type == MSG_SWAP) {
        if (c->swap_pending)
            reply_cli(c, from, 0, "a loader swap is already pending");
        else if (!m->text || !m->text[0] || strlen(m->text) >= sizeof(c->swap_cmd))
            reply_cli(c, from, 0, "swap: the command is empty or too long");
        else {
            c->swap_pending = 1;
            snprintf(c->swap_cmd, sizeof(c->swap_cmd), "%s", m->text);
            snprintf(c->swap_from, sizeof(c->swap_from), "%s", from);
            LOG_I("loader swap requested by %s: '%s' (at the end of step %lld)", from, m->text,
                  (long long)c->step + 1);
        }
        return;
    }
    if (m->type == MSG_STATUS) {
        reply_cli(c, from, 1, "job %s: step %lld of %d, loader pid %d", c->m->name, (long long)c->step + 1,
                  c->m->steps, (int)loader_proc(c)->pid);
        return;
    }
    proc_t *p = find_proc(c, from);
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
    switch (m->type) {
    case MSG_HELLO: {
        msg_t cfg = {.type = MSG_CONFIG, .step = c->step, .text = c->toml, .text_len = strlen(c->toml)};
        send_to(c, p, &cfg);
        if (c->nccl_ids && p->role == P_STAGE)
            send_nccl_ids(c, p);
        break;
    }
    case MSG_READY:
        p->ready = 1;
        LOG_D("%s is ready (pid %d)", who(p, name, sizeof(name)), (int)p->pid);
        break;
    case MSG_HEARTBEAT: { /* answered on the heartbeat socket: the worker's view of our health */
        msg_t hb = {.type = MSG_HEARTBEAT, .rank = 0, .replica = 0, .pid = getpid()};
        snprintf(hb.role, sizeof(hb.role), "coordinator");
        if (ctl_send(c->ctl, from, &hb))
            LOG_D("cannot answer the heartbeat of %s", from);
        break;
    }
    case MSG_ERROR:
        if (p->role == P_LOADER && c->trial) {
            snprintf(c->trial_why, sizeof(c->trial_why), "the new loader failed: %s", m->text ? m->text : "");
            c->trial_failed = 1;
        } else {
            fail(c, "%s: %s", who(p, name, sizeof(name)), m->text ? m->text : "(no reason given)");
        }
        break;
    case MSG_SNAPPED:
        if (c->ck_busy && m->step == c->ck_step && ++c->ck_snapped == c->m->shards) {
            /* every shard has copied its state: checkpointd takes it from here */
            msg_t save = {.type = MSG_SAVE, .step = c->ck_step};
            if (ctl_send(c->ctl, ckptd_proc(c)->id, &save)) { /* it just died: reap() restarts it */
                fprintf(stderr, "ctitan: cannot reach checkpointd: no checkpoint of step %lld\n",
                        (long long)c->ck_step);
                c->ck_busy = 0;
            }
        }
        break;
    case MSG_SAVED:
        if (!c->ck_busy || m->step != c->ck_step)
            break;
        c->ck_busy = 0;
        if (m->ok) {
            double dt = util_now() - c->ck_t0;
            printf("checkpoint: step %lld saved to %s (%.1f MiB written in %.2f s, %.2f GB/s; %.2f s after the "
                   "snapshot)\n", (long long)m->step, m->text ? m->text : "?", m->progress / 1048576.0, m->t_busy,
                   m->t_busy > 0 ? m->progress / m->t_busy / 1e9 : 0.0, dt);
            fflush(stdout);
        } else {
            fprintf(stderr, "ctitan: checkpoint of step %lld failed: %s (training goes on)\n", (long long)m->step,
                    m->text ? m->text : "(no reason given)");
        }
        break;
    case MSG_STEP_DONE:
    case MSG_REDUCED:
    case MSG_UPDATED:
        if (m->step == c->step) {
            p->got = 1;
            p->reply = *m;
            p->reply.text = NULL;
        }
        break;
    default:
        LOG_W("ignoring unexpected %s from %s", msg_type_name(m->type), from);
    }
}

static void check_heartbeats(coord_t *c)
{
    double now = util_now(), limit = c->m->heartbeat_timeout_ms * 1e-3;
    char name[64];
    for (int i = 0; i < c->np && !c->failed; i++) {
        proc_t *p = &c->p[i];
        if (p->pid == 0 || p->expect_exit)
            continue;
        if (!p->ready) {
            if (now - p->started > STARTUP_TIMEOUT_S)
                fail(c, "%s (pid %d) did not become ready in %.0f s", who(p, name, sizeof(name)), (int)p->pid,
                     STARTUP_TIMEOUT_S);
        } else if (now - p->last_hb <= limit) {
            continue;
        } else if ((p->role == P_LOADER || p->role == P_CKPTD) && !p->remote) {
            /* a hung loader or checkpointd is replaced like a dead one: kill it, reap() restarts it */
            LOG_W("%s (pid %d): no heartbeat for %.1f s: killing it to restart it", who(p, name, sizeof(name)),
                  (int)p->pid, now - p->last_hb);
            kill(p->pid, SIGKILL);
            p->last_hb = now;
        } else {
            fail(c, "%s (pid %d): no heartbeat for %.1f s (hung, stopped or dead)", who(p, name, sizeof(name)),
                 (int)p->pid, now - p->last_hb);
        }
    }
}

/* Handles events until cond(c, arg) holds. Returns 0, -1 once the job failed or was
 * interrupted, or -ETIMEDOUT after `timeout` seconds. */
static int pump(coord_t *c, int (*cond)(coord_t *, void *), void *arg, double timeout)
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
        int ms = (int)(left * 1e3) + 1;
        int hb = c->m->heartbeat_interval_ms;
        ms = ms < hb ? ms : hb;
        zmq_pollitem_t items[2] = {{.socket = ctl_socket(c->ctl), .events = ZMQ_POLLIN},
                                   {.fd = c->sigfd, .events = ZMQ_POLLIN}};
        zmq_poll(items, 2, ms);
        if (items[1].revents & ZMQ_POLLIN) {
            struct signalfd_siginfo si;
            while (read(c->sigfd, &si, sizeof(si)) == sizeof(si))
                if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM || si.ssi_signo == SIGHUP)
                    c->interrupted = (int)si.ssi_signo;
            reap(c);
        }
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
        check_heartbeats(c);
    }
}

static int all_ready(coord_t *c, void *arg)
{
    (void)arg;
    for (int i = 0; i < c->np; i++)
        if (!c->p[i].ready)
            return 0;
    return 1;
}

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

static int proc_gone(coord_t *c, void *arg)
{
    (void)c;
    return ((proc_t *)arg)->pid == 0;
}

static int loader_settled(coord_t *c, void *arg)
{
    (void)arg;
    return loader_proc(c)->ready || c->trial_failed;
}

/* Sends m to procs [first, first+count) and waits for each one's reply to this step. */
static int round_trip(coord_t *c, int first, int count, msg_t *m)
{
    for (int i = first; i < first + count; i++) {
        c->p[i].got = 0;
        send_to(c, &c->p[i], m);
    }
    span_t s = {first, count};
    return pump(c, span_got, &s, 1e9);
}

/* ---- loader swap ---- */

static void stop_loader(coord_t *c)
{
    proc_t *L = loader_proc(c);
    if (!L->pid)
        return;
    L->expect_exit = 1;
    msg_t stop = {.type = MSG_STOP};
    ctl_send(c->ctl, L->id, &stop);
    if (pump(c, proc_gone, L, STOP_GRACE_S) == -ETIMEDOUT && L->pid) {
        LOG_W("loader (pid %d) did not stop in %.0f s: killing it", (int)L->pid, STOP_GRACE_S);
        kill(L->pid, SIGKILL);
        pump(c, proc_gone, L, STOP_GRACE_S);
    }
}

/* Replaces the loader at the boundary after step c->step (stages and shards are idle). */
static void do_swap(coord_t *c)
{
    c->swap_pending = 0;
    int64_t next = c->step + 1;
    if (next >= c->m->steps) {
        reply_cli(c, c->swap_from, 0, "the job ended at step %lld before the swap", (long long)next);
        return;
    }
    proc_t *L = loader_proc(c);
    stop_loader(c);
    if (c->failed || c->interrupted)
        return;
    char old[sizeof(c->loader_cmd)];
    snprintf(old, sizeof(old), "%s", c->loader_cmd);
    for (int attempt = 0; attempt < 2; attempt++) {
        if (ldr_seg_prepare_swap(shm_data(c->seg_batch), next)) {
            fail(c, "loader swap: no loader cursor recorded for step %lld", (long long)next);
            return;
        }
        snprintf(c->loader_cmd, sizeof(c->loader_cmd), "%s", attempt == 0 ? c->swap_cmd : old);
        c->trial = attempt == 0;
        c->trial_failed = 0;
        spawn(c, L);
        int rc = pump(c, loader_settled, NULL, STARTUP_TIMEOUT_S);
        c->trial = 0;
        if (rc == 0 && L->ready) {
            if (attempt == 0) {
                LOG_I("loader swapped after step %lld: '%s' (pid %d)", (long long)next, c->loader_cmd, (int)L->pid);
                reply_cli(c, c->swap_from, 1, "loader swapped after step %lld: '%s' (pid %d)",
                          (long long)next, c->loader_cmd, (int)L->pid);
            }
            return;
        }
        if (c->failed || c->interrupted)
            return;
        if (attempt == 1) {
            fail(c, "loader swap failed and the previous loader did not come back either");
            return;
        }
        if (rc == -ETIMEDOUT)
            snprintf(c->trial_why, sizeof(c->trial_why), "the new loader did not become ready in %.0f s",
                     STARTUP_TIMEOUT_S);
        LOG_W("loader swap failed: %s; back to the previous loader", c->trial_why);
        reply_cli(c, c->swap_from, 0, "loader swap failed: %s; the previous loader continues", c->trial_why);
        stop_loader(c);
        if (c->failed || c->interrupted)
            return;
    }
}

/* ---- set-up and tear-down ---- */

static int make_segments(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    char names[256][SHM_NAME_MAX];
    int n = shm_list(c->job, names, 256);
    if (n > 0) {
        shm_seg_t *old = NULL;
        if (shm_attach(&old, c->job, "job", NULL, 0) == 0) {
            job_hdr_t h = *(job_hdr_t *)shm_data(old);
            shm_detach(&old);
            if (h.magic == JOB_MAGIC && job_owner_alive(&h))
                return util_fail(err, errlen, -EBUSY,
                                 "job '%s' is already running (coordinator pid %lld): stop it or set job.name",
                                 c->job, (long long)h.owner_pid);
        }
        int removed = shm_remove_all(c->job);
        LOG_W("removed %d stale shared-memory segments of job '%s' left by an earlier run that did not "
              "shut down", removed, c->job);
    }
    int rc;
    if ((rc = shm_create(&c->seg_job, c->job, "job", job_seg_bytes(&c->lay), err, errlen)))
        return rc;
    c->segs_made = 1;
    c->hdr = shm_data(c->seg_job);
    *c->hdr = (job_hdr_t){.magic = JOB_MAGIC, .version = JOB_VERSION, .owner_pid = getpid(),
                          .owner_start = job_proc_start(getpid()), .n_blocks = c->lay.n_blocks};
    if ((rc = shm_create(&c->seg_params, c->job, "params", job_params_bytes(&c->lay), err, errlen)) ||
        (!c->lay.gpu_shards &&
         (rc = shm_create(&c->seg_grads, c->job, "grads", job_params_bytes(&c->lay), err, errlen))) ||
        (c->lay.gpu && (rc = shm_create(&c->seg_dev, c->job, DEVDIR_SEG, devdir_bytes(&c->lay), err, errlen))))
        return rc;
    if (m->pp > 1 && !c->lay.nccl) {
        if ((rc = shm_create(&c->seg_act, c->job, "act", job_act_bytes(&c->lay), err, errlen)))
            return rc;
        for (int r = 0; r < m->dp; r++)
            for (int b = 0; b < m->pp - 1; b++)
                for (int g = 0; g < 2; g++)
                    ring_format((char *)shm_data(c->seg_act) + job_act_off(&c->lay, r, b, g), c->lay.act_ring,
                                (uint32_t)m->microbatches, c->lay.act_slot, 0);
    }
    if (m->ckpt_enable) {
        if ((rc = shm_create(&c->seg_ckpt, c->job, STAGING_SEG, staging_bytes(c->lay.total), err, errlen)))
            return rc;
        staging_hdr_t *h = shm_data(c->seg_ckpt);
        *h = (staging_hdr_t){.magic = STAGING_MAGIC, .version = STAGING_VERSION, .total = c->lay.total,
                             .stride = staging_stride(c->lay.total)};
        atomic_store(&h->step, -1);
    }
    int per_host = m->dp / m->hosts;
    ldr_info_t info = {.dp = m->dp, .microbatches = m->microbatches, .seqs = c->lay.mb, .seq_len = m->seq_len,
                       .vocab_size = m->model.vocab_size, .shuffle = m->shuffle, .seed = m->seed,
                       .first_step = c->step, .steps = m->steps, .replica0 = m->host_rank * per_host,
                       .replicas = per_host};
    snprintf(info.dataset_path, sizeof(info.dataset_path), "%s", m->dataset_path);
    size_t bytes = ldr_seg_bytes(m->dp, m->prefetch, c->lay.mb, m->seq_len);
    if ((rc = shm_create(&c->seg_batch, c->job, LDR_SEG_NAME, bytes, err, errlen)))
        return rc;
    return ldr_seg_format(shm_data(c->seg_batch), bytes, &info, m->prefetch, c->resume_cursor,
                          c->resume_cursor_len);
}

static void remove_segments(coord_t *c)
{
    shm_seg_t **segs[] = {&c->seg_job,   &c->seg_params, &c->seg_grads, &c->seg_act,
                          &c->seg_batch, &c->seg_ckpt,   &c->seg_dev};
    for (size_t i = 0; i < sizeof(segs) / sizeof(segs[0]); i++)
        shm_detach(segs[i]);
    if (c->segs_made)
        shm_remove_all(c->job);
}

/* A child of this process (not one an agent started on another host). */
static int local_child(const proc_t *p) { return p->pid > 0 && !p->remote; }

static void kill_all(coord_t *c, int sig)
{
    for (int i = 0; i < c->np; i++)
        if (local_child(&c->p[i]))
            kill(c->p[i].pid, sig);
}

static int none_running(coord_t *c, void *arg)
{
    (void)arg;
    for (int i = 0; i < c->np; i++)
        if (local_child(&c->p[i]))
            return 0;
    return 1;
}

/* Waits until every child is reaped, at most `secs`. */
static void wait_children(coord_t *c, double secs)
{
    double deadline = util_now() + secs;
    while (!none_running(c, NULL) && util_now() < deadline) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            for (int i = 0; i < c->np; i++)
                if (c->p[i].pid == pid && !c->p[i].remote)
                    c->p[i].pid = 0;
        } else {
            nanosleep(&(struct timespec){0, 10000000L}, NULL);
        }
    }
}

/* SIGTERM to whoever still runs, `grace` seconds, then SIGKILL; reaps them all. */
static void terminate_all(coord_t *c, double grace)
{
    kill_all(c, SIGTERM);
    wait_children(c, grace);
    kill_all(c, SIGKILL);
    wait_children(c, 5.0);
}

/* Clean stop: STOP to everyone, then signals for whoever lingers. */
static void stop_all(coord_t *c)
{
    msg_t stop = {.type = MSG_STOP};
    for (int i = 0; i < c->np; i++)
        if (c->p[i].pid > 0) {
            c->p[i].expect_exit = 1;
            ctl_send(c->ctl, c->p[i].id, &stop);
        }
    wait_children(c, STOP_GRACE_S);
    terminate_all(c, 1.0);
}

static int setup_signals(coord_t *c)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
        return -errno;
    signal(SIGPIPE, SIG_IGN);
    c->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    return c->sigfd < 0 ? -errno : 0;
}

/* Checks the data before any process starts, so a wrong path is one clear error: the
 * dataset pattern must match, and its first file must be a valid token file (the loader
 * checks the others as it opens them). */
static int check_data(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    tokfile_t *tf = NULL;
    int rc = 0;
    c->entropy = NAN;
    if (!m->command[0]) {
        glob_t g;
        if (glob(m->dataset_path, GLOB_ERR, NULL, &g)) {
            globfree(&g);
            return util_fail(err, errlen, -ENOENT, "loader.dataset_path %s: no such file", m->dataset_path);
        }
        snprintf(c->first_file, sizeof(c->first_file), "%s", g.gl_pathv[0]);
        rc = tokfile_open(&tf, c->first_file, m->model.vocab_size, err, errlen);
        if (!rc)
            c->entropy = eval_unigram_entropy(tf, (size_t)1 << 24);
        tokfile_close(&tf);
        globfree(&g);
        if (rc)
            return rc;
    }
    if (m->val_enable) {
        if ((rc = tokfile_open(&tf, m->val_dataset_path, m->model.vocab_size, err, errlen)))
            return rc;
        tokfile_close(&tf);
    }
    if (m->sample_tokens > 0 && m->tokenizer_path[0]) {
        tok_t *tok = NULL;
        if ((rc = tok_load(&tok, m->tokenizer_path, err, errlen)))
            return rc;
        if (tok_vocab_size(tok) > m->model.vocab_size)
            rc = util_fail(err, errlen, -EINVAL, "%s has %d tokens but model.vocab_size is %d", m->tokenizer_path,
                           tok_vocab_size(tok), m->model.vocab_size);
        tok_destroy(&tok);
    }
    return rc;
}

/* ---- the run ---- */

static void end_of_run(coord_t *c, int64_t first, double secs)
{
    const manifest_t *m = c->m;
    float *w = shm_data(c->seg_params); /* replica 0 */
    pool_t *pool = pool_new((int)sysconf(_SC_NPROCESSORS_ONLN));
    tokfile_t *val = NULL;
    char err[512];
    if (first > 0)
        printf("done: steps %lld to %d in %.1f s", (long long)first + 1, m->steps, secs);
    else
        printf("done: %d steps in %.1f s", m->steps, secs);
    if (m->val_enable && tokfile_open(&val, m->val_dataset_path, m->model.vocab_size, err, sizeof(err)) == 0) {
        int used;
        double vl = eval_loss(&m->model, w, pool, val, m->local_batch_size, m->seq_len, m->val_steps, &used);
        printf("; validation loss %.4f over %d batches", vl, used);
    }
    if (!isnan(c->entropy))
        printf("; training data unigram entropy %.4f", c->entropy);
    printf("\n");
    if (m->sample_tokens > 0 && m->tokenizer_path[0]) {
        tok_t *tok = NULL;
        tokfile_t *src = val; /* the prompt comes from held-out text, else from the training data */
        if (!src && c->first_file[0])
            tokfile_open(&src, c->first_file, m->model.vocab_size, NULL, 0);
        if (src && tok_load(&tok, m->tokenizer_path, err, sizeof(err)) == 0)
            eval_sample(&m->model, w, pool, tok, src, m->sample_tokens, m->sample_temperature, m->seed, stdout);
        tok_destroy(&tok);
        if (src != val)
            tokfile_close(&src);
    }
    tokfile_close(&val);
    pool_destroy(&pool);
    fflush(stdout);
}

static void report_step(coord_t *c, double norm, double t_step, double t_reduce, double t_update)
{
    const manifest_t *m = c->m;
    double loss = 0, t_stages = 0;
    uint64_t mem = 0; /* the largest stage's (on a GPU: the device's use, every process on it) */
    for (int r = 0; r < m->dp; r++)
        loss += stage_proc(c, m->pp - 1, r)->reply.loss; /* replica order: a fixed sum */
    for (int i = 1; i <= c->n_stages; i++) {
        double t = c->p[i].reply.t_busy + c->p[i].reply.t_wait;
        t_stages = t > t_stages ? t : t_stages;
        mem = c->p[i].reply.mem > mem ? c->p[i].reply.mem : mem;
    }
    double tokens = (double)m->dp * m->local_batch_size * m->seq_len;
    loss /= tokens;
    proc_t *s0 = shard_proc(c, 0);
    double lr = s0->reply.lr, tps = tokens / t_step;
    double mfu = config_flops_per_token(&m->model, m->seq_len) * tps / (c->peak_gflops * 1e9);
    double ctl = t_step - t_stages - t_reduce - t_update;
    int step = (int)c->step + 1;
    if (step % m->log_freq == 0 || step == m->steps || step == 1) {
        printf("step %5d  loss %7.4f  grad_norm %7.3f  lr %.2e  tokens/s %7.0f  mfu %5.2f%%  %6.0f ms  mem %.2f GiB\n",
               step, loss, norm, lr, tps, 100 * mfu, t_step * 1e3, mem / 1073741824.0);
        fflush(stdout);
    }
    if (c->metrics) {
        uint8_t cur[LDR_CURSOR_MAX];
        size_t clen;
        uint64_t sample = 0;
        int have = ldr_seg_cursor(shm_data(c->seg_batch), c->step + 1, cur, &clen) == 0 &&
                   ldr_cursor_get(cur, clen, "sample", &sample) == 0;
        fprintf(c->metrics,
                "{\"step\": %d, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.17g, \"tokens_per_s\": %.1f, "
                "\"mfu\": %.5f, \"step_time_ms\": %.3f, \"ctl_overhead_ms\": %.3f, \"optimizer_ms\": %.3f, "
                "\"mem_peak_bytes\": %llu",
                step, loss, norm, lr, tps, mfu, t_step * 1e3, ctl * 1e3, (t_reduce + t_update) * 1e3,
                (unsigned long long)mem);
        if (have)
            fprintf(c->metrics, ", \"loader_sample\": %llu", (unsigned long long)sample);
        fprintf(c->metrics, ", \"stage_ms\": [");
        for (int s = 0; s < m->pp; s++) {
            const msg_t *r = &stage_proc(c, s, 0)->reply;
            fprintf(c->metrics, "%s[%.4f, %.4f, %.4f]", s ? ", " : "", r->t_f * 1e3, r->t_b * 1e3, r->t_w * 1e3);
        }
        fprintf(c->metrics, "]}\n");
        fflush(c->metrics);
    }
}

static double max_busy(coord_t *c)
{
    double t = 0;
    for (int k = 0; k < c->m->shards; k++)
        t = shard_proc(c, k)->reply.t_busy > t ? shard_proc(c, k)->reply.t_busy : t;
    return t;
}

/* ---- checkpoints ---- */

static int ckpt_idle(coord_t *c, void *arg)
{
    (void)arg;
    return !c->ck_busy;
}

static int ckptd_ready(coord_t *c, void *arg)
{
    (void)arg;
    return ckptd_proc(c)->ready;
}

/* After `done` steps: the shards copy their state into the staging segment while the next
 * step runs (they are idle until its REDUCE, which they take only after the copy), then
 * checkpointd writes it. One snapshot at a time: if the previous one is still being written
 * training waits for it, and says so. */
static void start_checkpoint(coord_t *c, int64_t done)
{
    if (c->ck_busy) {
        double t0 = util_now();
        fprintf(stderr, "ctitan: the checkpoint of step %lld is still being written at step %lld: waiting for it "
                "(checkpoint.interval is too short for this storage)\n", (long long)c->ck_step, (long long)done);
        if (pump(c, ckpt_idle, NULL, 1e9))
            return;
        fprintf(stderr, "ctitan: waited %.2f s for the checkpoint of step %lld\n", util_now() - t0,
                (long long)c->ck_step);
    }
    if (pump(c, ckptd_ready, NULL, STARTUP_TIMEOUT_S)) { /* a restarted checkpointd */
        fail(c, "checkpointd did not become ready in %.0f s", STARTUP_TIMEOUT_S);
        return;
    }
    staging_hdr_t *h = shm_data(c->seg_ckpt);
    size_t len = 0;
    if (ldr_seg_cursor(shm_data(c->seg_batch), done, h->cursor, &len)) {
        fprintf(stderr, "ctitan: no loader cursor is recorded for step %lld: no checkpoint of it\n",
                (long long)done + 1);
        return;
    }
    h->cursor_len = (uint32_t)len;
    atomic_store(&h->step, done);
    c->ck_busy = 1;
    c->ck_step = done;
    c->ck_snapped = 0;
    c->ck_t0 = util_now();
    msg_t snap = {.type = MSG_SNAPSHOT, .step = done};
    for (int k = 0; k < c->m->shards; k++)
        send_to(c, shard_proc(c, k), &snap);
}

static void train(coord_t *c)
{
    const manifest_t *m = c->m;
    double t_start = util_now();
    int64_t first = c->step;
    int first_shard = 1 + c->n_stages;
    for (; c->step < m->steps; c->step++) {
        atomic_store(&c->hdr->step, c->step);
        double t0 = util_now();
        msg_t step = {.type = MSG_STEP, .step = c->step};
        if (round_trip(c, 1, c->n_stages, &step))
            return;
        msg_t reduce = {.type = MSG_REDUCE, .step = c->step};
        if (round_trip(c, first_shard, m->shards, &reduce))
            return;
        double t_reduce = max_busy(c);
        double sq = 0, *blocks = job_norm_blocks(c->hdr);
        if (c->lay.nccl) /* shard order (NCCL slices do not follow the blocks) */
            for (int k = 0; k < m->shards; k++)
                sq += shard_proc(c, k)->reply.grad_norm;
        else /* block order: the same sum for any shard count */
            for (size_t b = 0; b < c->lay.n_blocks; b++)
                sq += blocks[b];
        double norm = sqrt(sq);
        /* torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is < 1 */
        double scale = m->max_norm > 0 ? m->max_norm / (norm + 1e-6) : 1.0;
        scale = scale < 1.0 ? scale : 1.0;
        msg_t update = {.type = MSG_UPDATE, .step = c->step, .grad_norm = norm, .scale = scale};
        if (round_trip(c, first_shard, m->shards, &update))
            return;
        double t_update = max_busy(c), t_step = util_now() - t0;
        report_step(c, norm, t_step, t_reduce, t_update);
        int64_t done = c->step + 1;
        if (m->ckpt_enable && (done % m->ckpt_interval == 0 || done == m->steps))
            start_checkpoint(c, done);
        if (c->swap_pending)
            do_swap(c);
        if (c->failed || c->interrupted)
            return;
    }
    if (pump(c, ckpt_idle, NULL, 1e9)) /* the last checkpoint */
        return;
    stop_all(c);
    end_of_run(c, first, util_now() - t_start);
}

/* checkpoint.load: "latest" becomes the newest checkpoint of the folder that verifies (none
 * at all: a fresh start), a path must verify; the run then starts after its step with its
 * loader cursor, and the optimizer shards read their slices from it (m->ckpt_load is set to
 * the directory, or emptied). The model must be the one the checkpoint was written for. */
static int resolve_load(coord_t *c, manifest_t *m, char *err, size_t errlen)
{
    char path[PATH_MAX], folder[PATH_MAX];
    int rc, nbad;
    if (!m->ckpt_load[0])
        return 0;
    if (!strcmp(m->ckpt_load, "latest")) {
        manifest_ckpt_folder(m, folder, sizeof(folder));
        rc = ckpt_find_latest(folder, path, sizeof(path), stderr, err, errlen);
        if (rc == -ENOENT) {
            printf("checkpoint: none in %s: starting from step 0\n", folder);
            m->ckpt_load[0] = 0;
            return 0;
        }
        if (rc)
            return rc;
    } else {
        snprintf(path, sizeof(path), "%s", m->ckpt_load);
        struct stat st;
        if (stat(path, &st))
            return util_fail(err, errlen, -errno, "checkpoint.load %s is not loadable (%s): not resuming from it",
                             path, errno == ENOENT ? "no such directory" : strerror(errno));
        char why[512];
        if ((rc = ckpt_verify(path, stderr, &nbad, why, sizeof(why))))
            return util_fail(err, errlen, rc, "checkpoint.load %s is not loadable (%s): not resuming from it",
                             path, rc == -EBADMSG ? "corrupt: see above" : why);
    }
    ckpt_t *ck;
    if ((rc = ckpt_open(&ck, path, err, errlen)))
        return rc;
    const ckpt_index_t *ix = ckpt_index(ck);
    manifest_t *old = malloc(sizeof(*old));
    char e2[512];
    if (!old) {
        ckpt_close(&ck);
        return -ENOMEM;
    }
    manifest_defaults(old);
    if (manifest_parse(old, ix->manifest, strlen(ix->manifest), path, e2, sizeof(e2)) == 0) {
        const model_config_t *a = &old->model, *b = &m->model;
        const struct {
            const char *key;
            double was, is;
        } keys[] = {{"dim", a->dim, b->dim}, {"n_layers", a->n_layers, b->n_layers},
                    {"n_heads", a->n_heads, b->n_heads}, {"n_kv_heads", a->n_kv_heads, b->n_kv_heads},
                    {"vocab_size", a->vocab_size, b->vocab_size}, {"multiple_of", a->multiple_of, b->multiple_of},
                    {"ffn_dim_multiplier", a->ffn_dim_multiplier, b->ffn_dim_multiplier},
                    {"norm_eps", a->norm_eps, b->norm_eps}, {"rope_theta", a->rope_theta, b->rope_theta}};
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]) && !rc; k++)
            if (keys[k].was != keys[k].is)
                rc = util_fail(err, errlen, -EINVAL, "checkpoint %s was written for another model: its model.%s = %g, "
                               "this run's is %g", path, keys[k].key, keys[k].was, keys[k].is);
        if (!rc && (old->seed != m->seed || strcmp(old->dataset_path, m->dataset_path) || old->shuffle != m->shuffle))
            fprintf(stderr, "ctitan: note: training.seed, loader.dataset_path or loader.shuffle differ from the run "
                    "that wrote %s: the data order will differ from that run's\n", path);
    } else {
        fprintf(stderr, "ctitan: note: the manifest inside %s does not parse (%s); the tensors are checked "
                "against the model as they load\n", path, e2);
    }
    free(old);
    if (!rc) {
        c->step = ix->step;
        memcpy(c->resume_cursor, ix->cursor, ix->cursor_len);
        c->resume_cursor_len = ix->cursor_len;
        if (strlen(path) >= sizeof(m->ckpt_load))
            rc = util_fail(err, errlen, -ENAMETOOLONG, "checkpoint path %s is too long", path);
        else
            memcpy(m->ckpt_load, path, strlen(path) + 1);
    }
    if (!rc)
        printf("checkpoint: resuming from %s (after step %lld)\n", path, (long long)ix->step);
    ckpt_close(&ck);
    return rc;
}

static int resolve_endpoint(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    if (m->endpoint[0]) {
        snprintf(c->endpoint, sizeof(c->endpoint), "%s", m->endpoint);
        return 0;
    }
    char abs[PATH_MAX];
    if (!realpath(m->dump_folder, abs))
        return util_fail(err, errlen, -errno, "job.dump_folder %s: %s", m->dump_folder, strerror(errno));
    int n = snprintf(c->sock_path, sizeof(c->sock_path), "%s/ctl.sock", abs);
    if (n >= 100) /* sun_path holds 108 bytes */
        return util_fail(err, errlen, -ENAMETOOLONG,
                         "control socket path %s is too long for a Unix socket: set job.endpoint "
                         "(e.g. ipc:///tmp/%s.sock) or a shorter job.dump_folder", c->sock_path, m->name);
    snprintf(c->endpoint, sizeof(c->endpoint), "ipc://%.200s", c->sock_path); /* < 100 bytes, checked */
    return 0;
}

/* Every process of the job: [0] this host's loader, the stages, the shards, checkpointd, then
 * the other hosts' loaders (job.hosts > 1). Host h runs replicas [h * dp / hosts, ...): their
 * stages, their NCCL shards, a loader. The coordinator marks other hosts' processes remote;
 * an agent keeps only its own. */
static int make_table(coord_t *c)
{
    const manifest_t *m = c->m;
    c->n_stages = m->pp * m->dp;
    c->np = 1 + c->n_stages + m->shards + (m->ckpt_enable ? 1 : 0) + (m->hosts - 1);
    if (!(c->p = calloc((size_t)c->np, sizeof(proc_t))))
        return -ENOMEM;
    c->p[0] = (proc_t){.role = P_LOADER, .rank = m->host_rank, .host = m->host_rank};
    for (int r = 0; r < m->dp; r++)
        for (int s = 0; s < m->pp; s++)
            *stage_proc(c, s, r) = (proc_t){.role = P_STAGE, .rank = s, .replica = r, .host = job_host_of(&c->lay, r)};
    for (int k = 0; k < m->shards; k++)
        *shard_proc(c, k) = (proc_t){.role = P_OPTSHARD, .rank = k,
                                     .host = c->lay.nccl ? job_host_of(&c->lay, k % m->dp) : 0};
    if (m->ckpt_enable)
        *ckptd_proc(c) = (proc_t){.role = P_CKPTD};
    for (int h = 1, i = c->np - (m->hosts - 1); h < m->hosts; h++, i++) /* host 0's loader is [0] */
        c->p[i] = (proc_t){.role = P_LOADER, .rank = h == m->host_rank ? 0 : h, .host = h == m->host_rank ? 0 : h};
    for (int i = 0; i < c->np; i++) {
        snprintf(c->p[i].id, sizeof(c->p[i].id), "%s.%d.%d", role_name[c->p[i].role], c->p[i].rank, c->p[i].replica);
        c->p[i].remote = c->p[i].host != m->host_rank;
    }
    return 0;
}

/* job.host_rank > 0: starts this host's processes against the coordinator's endpoint and
 * waits for them; their supervision is the coordinator's (heartbeats), so an agent only
 * follows them: the first to fail ends the others after the heartbeat timeout. Returns the
 * exit status. */
static int agent(coord_t *c)
{
    const manifest_t *m = c->m;
    int n = 0;
    for (int i = 0; i < c->np; i++)
        if (!c->p[i].remote) {
            spawn(c, &c->p[i]);
            n++;
        }
    printf("launch: host %d of %d: %d processes of job %s, coordinator at %s\n", m->host_rank, m->hosts, n, m->name,
           c->endpoint);
    fflush(stdout);
    int status = 0;
    double failed_at = 0;
    while (!none_running(c, NULL)) {
        struct signalfd_siginfo si;
        while (read(c->sigfd, &si, sizeof(si)) == sizeof(si))
            if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM || si.ssi_signo == SIGHUP)
                c->interrupted = (int)si.ssi_signo;
        int st;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
            for (int i = 0; i < c->np; i++)
                if (c->p[i].pid == pid && !c->p[i].remote) {
                    c->p[i].pid = 0;
                    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
                        char how[128], name[64];
                        fprintf(stderr, "launch: host %d: %s %s\n", m->host_rank, who(&c->p[i], name, sizeof(name)),
                                describe_exit(st, how, sizeof(how)));
                        status = 1;
                        failed_at = failed_at > 0 ? failed_at : util_now();
                    }
                }
        if (c->interrupted || (failed_at > 0 && util_now() - failed_at > m->heartbeat_timeout_ms * 2e-3)) {
            terminate_all(c, 2.0);
            break;
        }
        nanosleep(&(struct timespec){0, 20000000L}, NULL);
    }
    return c->interrupted ? 128 + c->interrupted : status;
}

int coord_run(const manifest_t *given)
{
    coord_t c = {.sigfd = -1};
    char err[1024];
    int status = 1;
    log_init("", 0, 0);
    manifest_t *m = malloc(sizeof(*m)); /* ours: checkpoint.load gets resolved */
    if (!m) {
        fprintf(stderr, "launch: out of memory\n");
        return 1;
    }
    *m = *given;
    c.m = m;
    if (m->host_rank > 0)
        snprintf(c.job, sizeof(c.job), "%s-h%d", m->name, m->host_rank);
    else
        snprintf(c.job, sizeof(c.job), "%s", m->name);
    if (resolve_load(&c, m, err, sizeof(err))) {
        fprintf(stderr, "launch: %s\n", err);
        free(m);
        return 1;
    }
    if (c.step >= m->steps) {
        printf("launch: the checkpoint is at step %lld and training.steps = %d: nothing left to train\n",
               (long long)c.step, m->steps);
        free(m);
        return 0;
    }
    ssize_t n = readlink("/proc/self/exe", c.bin_dir, sizeof(c.bin_dir) - 1);
    if (n <= 0) {
        fprintf(stderr, "launch: cannot find my own executable: %s\n", strerror(errno));
        return 1;
    }
    c.bin_dir[n] = 0;
    *strrchr(c.bin_dir, '/') = 0;
    snprintf(c.loader_cmd, sizeof(c.loader_cmd), "%s", m->command);
    c.toml = manifest_to_toml(m);
    int rc = c.toml ? 0 : -ENOMEM;
    if (!rc && (rc = job_layout(&c.lay, m)))
        snprintf(err, sizeof(err), "out of memory");
    if (!rc && (rc = util_mkdirs(m->dump_folder)))
        snprintf(err, sizeof(err), "job.dump_folder %s: cannot create: %s", m->dump_folder, strerror(-rc));
    if (!rc)
        rc = resolve_endpoint(&c, err, sizeof(err));
    if (!rc)
        rc = check_data(&c, err, sizeof(err));
    if (!rc && !m->host_rank && m->metrics_file[0] && !(c.metrics = fopen(m->metrics_file, "w"))) {
        rc = -errno;
        snprintf(err, sizeof(err), "metrics.file %s: cannot open: %s", m->metrics_file, strerror(errno));
    }
    if (!rc && (rc = setup_signals(&c)))
        snprintf(err, sizeof(err), "cannot set up signal handling: %s", strerror(-rc));
    if (!rc)
        rc = make_segments(&c, err, sizeof(err));
    if (!rc && m->host_rank > 0) { /* an agent: this host's processes only */
        snprintf(c.hdr->endpoint, sizeof(c.hdr->endpoint), "%s", c.endpoint);
        if (make_table(&c) == 0)
            status = agent(&c);
        goto out;
    }
    if (!rc && c.lay.nccl)
        rc = make_nccl_ids(&c, err, sizeof(err));
    if (!rc && !(rc = ctl_server_new(&c.ctl, c.endpoint, err, sizeof(err)))) {
        /* tcp://HOST:* binds a free port: workers and `ctitan loader swap` need the real one */
        snprintf(c.endpoint, sizeof(c.endpoint), "%s", ctl_endpoint(c.ctl));
        snprintf(c.hdr->endpoint, sizeof(c.hdr->endpoint), "%s", c.endpoint);
    }
    if (rc) {
        fprintf(stderr, "launch: %s\n", err);
        goto out;
    }
    c.peak_gflops = m->peak_tflops > 0 ? m->peak_tflops * 1e3
                                       : peak_sgemm_gflops((int)sysconf(_SC_NPROCESSORS_ONLN), 1024, NULL, NULL);
    if (make_table(&c))
        goto out;
    printf("launch: job %s: %s %s, %.2fM parameters; pipeline %d (%s, %d microbatches of %dx%d), data parallel %d, "
           "%d optimizer shards; %d processes; MFU against %.0f GFLOP/s\n",
           m->name, m->model_name, m->flavor, c.lay.total / 1e6, m->pp, sched_kind_name(m->schedule),
           m->microbatches, c.lay.mb, m->seq_len, m->dp, m->shards, c.np, c.peak_gflops);
    if (!isnan(c.entropy))
        printf("launch: data %s, unigram entropy %.4f nats/token (first file)\n", m->dataset_path, c.entropy);
    fflush(stdout);
    for (int i = 0; i < c.np && !c.failed; i++)
        if (!c.p[i].remote)
            spawn(&c, &c.p[i]);
    if (pump(&c, all_ready, NULL, STARTUP_TIMEOUT_S) == -ETIMEDOUT)
        fail(&c, "the job's processes did not all become ready in %.0f s", STARTUP_TIMEOUT_S);
    if (!c.failed && !c.interrupted)
        train(&c);
    if (c.failed) {
        fprintf(stderr, "ctitan: job %s failed: %s\n", m->name, c.why);
        terminate_all(&c, 2.0);
    } else if (c.interrupted) {
        fprintf(stderr, "ctitan: job %s interrupted by %s: stopping every process\n", m->name,
                strsignal(c.interrupted));
        stop_all(&c);
        status = 128 + c.interrupted;
    } else {
        status = 0;
    }
out:
    if (c.ctl && c.sock_path[0]) /* only a socket we bound: another run of this job may own the file */
        unlink(c.sock_path);
    ctl_destroy(&c.ctl);
    remove_segments(&c);
    if (c.metrics)
        fclose(c.metrics);
    if (c.sigfd >= 0)
        close(c.sigfd);
    free(c.p);
    free(c.toml);
    free(c.nccl_ids);
    free(m);
    return status;
}
