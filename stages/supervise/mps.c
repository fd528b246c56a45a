/* NVIDIA's Multi-Process Service for one host's part of a job (see mps.h). */
#include "stages/supervise/mps.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/shm.h"
#include "ipc/util.h"

#define MPS_READY_S 10.0 /* the daemon's control socket appears within this */
#define MPS_QUIT_S 5.0   /* the daemon leaves within this after "quit" (then it is killed) */

extern char **environ;

/* Whether `name` is an executable file in a folder of PATH. */
static int on_path(const char *name)
{
    const char *path = getenv("PATH");
    char file[PATH_MAX];
    for (const char *at = path ? path : ""; *at;) {
        size_t len = strcspn(at, ":");
        if (len && len + strlen(name) + 2 <= sizeof(file)) {
            snprintf(file, sizeof(file), "%.*s/%s", (int)len, at, name);
            struct stat st;
            if (!stat(file, &st) && S_ISREG(st.st_mode) && !access(file, X_OK))
                return 1;
        }
        at += len + (at[len] == ':');
    }
    return 0;
}

int mps_available(void) { return on_path(MPS_CONTROL); }

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* `MPS_CONTROL` run as a client of the daemon whose pipe folder this process exports
 * (export_dirs), told "quit": 0 when it said it was done within MPS_QUIT_S, else -1. */
static int tell_quit(void)
{
    int fd[2];
    if (pipe2(fd, O_CLOEXEC))
        return -1;
    char secs[16];
    snprintf(secs, sizeof(secs), "%g", MPS_QUIT_S);
    char *argv[] = {"timeout", secs, MPS_CONTROL, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[0], 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, "timeout", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[0]);
    if (!rc)
        util_write_all(fd[1], "quit\n", 5);
    close(fd[1]);
    int st = -1;
    while (!rc && waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return !rc && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* Waits up to secs for the daemon to end (reaped here, or by a parent's waitpid(-1) of the
 * supervisor or an agent: then its pidfd says so all the same). 1 when it ended. */
static int wait_end(mps_t *s, double secs)
{
    double end = util_now() + secs;
    for (;;) {
        int st;
        pid_t r = waitpid(s->pid, &st, WNOHANG);
        if (r == s->pid || (r < 0 && errno == ECHILD))
            return 1;
        double left = end - util_now();
        if (left <= 0)
            return 0;
        if (s->pidfd >= 0) /* readable once it has ended */
            poll(&(struct pollfd){.fd = s->pidfd, .events = POLLIN}, 1, (int)(left * 1e3) + 1);
        else
            usleep(20000);
    }
}

static void signal_daemon(mps_t *s, int sig)
{
    if (s->pidfd >= 0)
        syscall(SYS_pidfd_send_signal, s->pidfd, sig, NULL, 0);
    else
        kill(s->pid, sig);
}

/* s->dir's folder `leaf` (pipe, log, ...). */
static void sub(const mps_t *s, const char *leaf, char *buf, size_t n) { snprintf(buf, n, "%s/%s", s->dir, leaf); }

/* CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY of s->dir, for this process and every
 * process it starts after (the daemon, the job's processes, the client that says "quit"). */
static void export_dirs(const mps_t *s)
{
    char pipe_dir[sizeof(s->dir) + 8], log_dir[sizeof(s->dir) + 8];
    sub(s, "pipe", pipe_dir, sizeof(pipe_dir));
    sub(s, "log", log_dir, sizeof(log_dir));
    setenv("CUDA_MPS_PIPE_DIRECTORY", pipe_dir, 1);
    setenv("CUDA_MPS_LOG_DIRECTORY", log_dir, 1);
}

/* The folder of this host's daemon of job m (mode 0700), made afresh and exported: a folder a
 * launch killed outright left there is this user's to clear, its daemon told to quit first;
 * but not while another launch of the job holds the job's lock (its daemon serves that job),
 * and not a folder that is not this user's. */
static int make_dir(mps_t *s, const manifest_t *m, char *err, size_t errlen)
{
    char job[96]; /* the name the job's lock has on this host (coord.c: an agent's is NAME-hK) */
    if (m->host_rank)
        snprintf(job, sizeof(job), "%s-h%d", m->name, m->host_rank);
    else
        snprintf(job, sizeof(job), "%s", m->name);
    snprintf(s->dir, sizeof(s->dir), "/tmp/ctitan-mps-%u-%s-h%d", (unsigned)getuid(), m->name, m->host_rank);
    struct stat st;
    if (!lstat(s->dir, &st)) {
        char path[sizeof(s->dir)];
        snprintf(path, sizeof(path), "%s", s->dir);
        if (!S_ISDIR(st.st_mode) || st.st_uid != getuid()) {
            s->dir[0] = 0; /* not ours to remove */
            return util_fail(err, errlen, -1, "job.mps: %s is in the way (not a folder of this user's): "
                             "remove it", path);
        }
        int lock = shm_job_lock(job, err, errlen);
        if (lock < 0) { /* shm_job_lock's words: another launch of the job, whose daemon this is */
            s->dir[0] = 0;
            return -1;
        }
        shm_job_unlock(job, lock);
    }
    export_dirs(s);
    if (!lstat(s->dir, &st)) {
        char control[sizeof(s->dir) + 16];
        sub(s, "pipe/control", control, sizeof(control));
        if (!access(control, F_OK)) {
            fprintf(stderr, "launch: job.mps: an earlier launch's MPS daemon (%s) is told to quit\n", s->dir);
            tell_quit();
            /* gone when its control socket is (not a child of ours: nothing to wait on) */
            for (double end = util_now() + MPS_QUIT_S; !access(control, F_OK) && util_now() < end;)
                usleep(10000);
        }
        nftw(s->dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
    }
    const char *leaves[] = {NULL, "pipe", "log"};
    for (int i = 0; i < 3; i++) {
        char dir[sizeof(s->dir) + 8];
        if (leaves[i])
            sub(s, leaves[i], dir, sizeof(dir));
        else
            snprintf(dir, sizeof(dir), "%s", s->dir);
        if (mkdir(dir, 0700))
            return util_fail(err, errlen, -1, "job.mps: cannot make %s: %s", dir, strerror(errno));
    }
    return 0;
}

/* In the child: the daemon in the foreground, in a process group of its own, ended with its
 * parent; every GPU visible to it; its output in log/control.out. */
static _Noreturn void exec_daemon(const mps_t *s, pid_t parent)
{
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
        _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("CUDA_INJECTION64_PATH"); /* a profiler's library is the clients', not the daemon's */
    char out[sizeof(s->dir) + 16];
    sub(s, "log/control.out", out, sizeof(out));
    int in = open("/dev/null", O_RDONLY), fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || fd < 0 || dup2(in, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
        _exit(126);
    execlp(MPS_CONTROL, MPS_CONTROL, "-f", (char *)NULL);
    fprintf(stderr, "cannot run %s: %s\n", MPS_CONTROL, strerror(errno));
    _exit(127);
}

/* The last line of the daemon's output (log/control.out), for an error message. */
static void last_words(const mps_t *s, char *buf, size_t n)
{
    char path[sizeof(s->dir) + 16], *text = NULL, e[64];
    size_t len = 0;
    sub(s, "log/control.out", path, sizeof(path));
    buf[0] = 0;
    if (util_read_file(path, 1 << 16, "output", &text, &len, e, sizeof(e)))
        return;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        len--;
    size_t at = len;
    while (at && text[at - 1] != '\n')
        at--;
    snprintf(buf, n, "%.*s", (int)(len - at), text + at);
    free(text);
}

/* Starts the daemon (the folders exported: make_dir) and waits for its control socket. 0, or
 * -1 with err (nothing left). */
static int start_daemon(mps_t *s, char *err, size_t errlen)
{
    pid_t parent = getpid();
    fflush(NULL);
    s->pid = fork();
    if (s->pid < 0) {
        s->pid = 0;
        return util_fail(err, errlen, -1, "job.mps: cannot fork: %s", strerror(errno));
    }
    if (s->pid == 0)
        exec_daemon(s, parent);
    s->pidfd = (int)syscall(SYS_pidfd_open, s->pid, 0);
    char control[sizeof(s->dir) + 16], words[256];
    sub(s, "pipe/control", control, sizeof(control));
    for (double end = util_now() + MPS_READY_S; access(control, F_OK);) {
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid || util_now() > end) {
            int ended = util_now() <= end;
            last_words(s, words, sizeof(words));
            mps_stop(s);
            return util_fail(err, errlen, -1, "job.mps: %s -f %s%s%s", MPS_CONTROL,
                             ended ? "ended before it was ready" : "made no control socket in time",
                             words[0] ? ": " : "", words);
        }
        usleep(10000);
    }
    return 0;
}

int mps_start(mps_t *s, const manifest_t *m, int sharing, char *err, size_t errlen)
{
    *s = (mps_t){.pidfd = -1};
    if (!strcmp(m->mps, "off"))
        return 0;
    if (strcmp(m->device, "cuda")) {
        fprintf(stderr, "launch: job.mps = \"%s\": a CPU job has no GPU processes: no MPS daemon\n", m->mps);
        return 0;
    }
    const char *theirs = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (theirs && *theirs) {
        fprintf(stderr, "launch: job.mps = \"%s\": CUDA_MPS_PIPE_DIRECTORY is set (%s): the job's processes use "
                "that MPS daemon\n", m->mps, theirs);
        return 0;
    }
    int on = !strcmp(m->mps, "on");
    if (!on && sharing < 2)
        return 0; /* auto: one process a GPU has nothing to share */
    if (!on_path(MPS_CONTROL)) {
        if (on)
            return util_fail(err, errlen, -1, "job.mps = \"on\": %s is not on PATH (it comes with NVIDIA's driver; "
                             "job.mps = \"off\" runs without it)", MPS_CONTROL);
        fprintf(stderr, "launch: job.mps = \"auto\": %s is not on PATH: the %d processes on one GPU are "
                "time-sliced\n", MPS_CONTROL, sharing);
        return 0;
    }
    if (make_dir(s, m, err, errlen) || start_daemon(s, err, errlen)) {
        mps_stop(s);
        if (!on) { /* auto: run without it, saying why */
            fprintf(stderr, "launch: %s: the job runs without MPS\n", err);
            return 0;
        }
        return -1;
    }
    fprintf(stderr, "launch: the job's GPU processes run under MPS (a private daemon, %s)\n", s->dir);
    return 0;
}

void mps_stop(mps_t *s)
{
    if (s->pid > 0 && (tell_quit() || !wait_end(s, MPS_QUIT_S))) {
        signal_daemon(s, SIGTERM);
        if (!wait_end(s, 1.0)) {
            signal_daemon(s, SIGKILL);
            wait_end(s, 1.0);
        }
    }
    if (s->pidfd >= 0)
        close(s->pidfd);
    if (s->dir[0]) { /* ours: exported by make_dir */
        nftw(s->dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
        unsetenv("CUDA_MPS_PIPE_DIRECTORY");
        unsetenv("CUDA_MPS_LOG_DIRECTORY");
    }
    *s = (mps_t){.pidfd = -1};
}
