/* The supervisor of `ctitan launch` (see supervise.h). One run is: fork the coordinator into a
 * process group of its own, wait for it (passing stop signals on), kill and reap its group,
 * remove its leftovers. What the run did and why it failed comes back in a coord_outcome_t in
 * memory shared with it (MAP_SHARED, made before the fork), so a kill -9 loses none of it.
 * This process is a child subreaper: workers orphaned by a dead coordinator become its
 * children, and it reaps them. */
#include "stages/supervise/supervise.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "stages/coord/coord.h"
#include "stages/plan/plan.h"

#define SUP_SAVED_MAX 256 /* checkpoints of this job remembered (the newest) */
/* After a stop signal the coordinator stops the job itself (coord_stop_all_now); one still
 * running this long after it (busy in a set-up step that reads no signal: an sgemm peak
 * measured, the validation at the end) is killed with its whole group, and its segments
 * removed here, so that a Ctrl-C ends the job within a second wherever it is. */
#define SUP_STOP_S 0.6

typedef struct {
    const manifest_t *given;
    manifest_t m;                 /* this run's: checkpoint.load is the restart's checkpoint */
    coord_outcome_t *out;         /* shared with the run */
    coord_super_t sup;
    int sigfd;
    pid_t self, pid;              /* this process; the coordinator running (0: none) */
    int stop_sig;                 /* SIGINT, SIGTERM or SIGHUP came: no restart */
    double stop_t;                /* when */
    int stop_killed;              /* the coordinator did not end in SUP_STOP_S: killed */
    double started;               /* when the current run was forked */
    int stepped;                  /* some run completed a step */
    int restarts, in_a_row;       /* restarts so far; in a row from the current `from` */
    int64_t from;                 /* steps completed when the current run started */
    int64_t origin;               /* ... when the first one did (checkpoint.load's step, or 0) */
    char folder[PATH_MAX];        /* the job's own checkpoints ("": none here to resume from) */
    int storage;                  /* they go to a storage host (checkpoint.endpoint) instead */
    int64_t saved[SUP_SAVED_MAX]; /* steps of the checkpoints this job saved */
    int n_saved;
} sup_t;

/* What the failed run was, for the progress line and the restart record. */
typedef struct {
    char role[16];
    int rank, replica;
    char reason[1600];            /* the run's reason ("the coordinator was killed by signal 9 ...") */
    char line[1700];              /* "the coordinator exited with status 1 (reason)" */
    int64_t resume;               /* the step it resumes after */
    char ckpt[PATH_MAX];          /* its checkpoint ("": none of this job's; "latest": the storage
                                   * host's newest) */
    int64_t lost_steps;
    double lost_s;
} failure_t;

int sup_restart_number(int in_a_row, int64_t from, int64_t resume, int max_restarts)
{
    int n = resume > from ? 1 : in_a_row + 1;
    return n <= max_restarts ? n : 0;
}

int sup_backoff_ms(int base_ms, int in_a_row)
{
    long long ms = base_ms;
    for (int i = 1; i < in_a_row && ms < MANIFEST_MAX_BACKOFF_MS; i++)
        ms *= 2;
    return ms < MANIFEST_MAX_BACKOFF_MS ? (int)ms : MANIFEST_MAX_BACKOFF_MS;
}

/* ---- one run ---- */

/* Passes SIGINT, SIGTERM and SIGHUP on to the coordinator; the first one means: no restart. */
static void read_signals(sup_t *s)
{
    struct signalfd_siginfo si;
    while (read(s->sigfd, &si, sizeof(si)) == sizeof(si)) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD)
            continue;
        if (!s->stop_sig) {
            s->stop_sig = sig;
            s->stop_t = util_now();
        }
        if (s->pid > 0)
            kill(s->pid, sig);
    }
}

/* In the child: the coordinator, leader of a new process group its workers stay in (the
 * signals the supervisor blocked stay blocked: its signalfd reads them). */
static _Noreturn void coordinator(sup_t *s)
{
    close(s->sigfd);
    setpgid(0, 0);
    /* a supervisor killed outright stops the job: SIGTERM, which the coordinator takes as a
     * stop, so that its workers, segments and operator key go with it (coord_run) */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != s->self)
        _exit(1);
    prctl(PR_SET_NAME, "ctitan-coord");
    exit(coord_run(&s->m, &s->sup));
}

/* Waits for the coordinator's end, then kills whatever is left of its group and reaps it all.
 * Returns the coordinator's wait status. */
static int wait_run(sup_t *s)
{
    for (;;) {
        read_signals(s);
        siginfo_t si = {0};
        /* WNOWAIT: unreaped, it keeps its group's id from being reused until the kill below */
        if (waitid(P_PID, (id_t)s->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == s->pid)
            break;
        int ms = -1;
        if (s->stop_sig) {
            double left = s->stop_t + SUP_STOP_S - util_now();
            if (left <= 0) {
                kill(-s->pid, SIGKILL);
                s->stop_killed = 1;
                break;
            }
            ms = (int)(left * 1e3) + 1;
        }
        struct pollfd p = {.fd = s->sigfd, .events = POLLIN};
        poll(&p, 1, ms);
    }
    kill(-s->pid, SIGKILL);
    int status = 0, st;
    pid_t pid;
    while ((pid = waitpid(-s->pid, &st, 0)) > 0 || (pid < 0 && errno == EINTR))
        if (pid == s->pid)
            status = st;
    while (waitpid(-1, &st, WNOHANG) > 0)
        ; /* a worker that left the group: orphaned to us, and gone by its parent-death signal */
    return status;
}

/* Forks the coordinator with this run's manifest and waits for the end of its group. Returns
 * its wait status, or -errno when it could not be started. */
static int run_once(sup_t *s)
{
    memset(s->out, 0, sizeof(*s->out));
    s->sup.out = s->out;
    s->sup.restarts = s->restarts;
    s->sup.append_metrics = s->restarts > 0;
    s->sup.supervisor = s->self;
    fflush(NULL); /* the child must not write this process's buffers again */
    s->started = util_now();
    s->pid = fork();
    if (s->pid < 0) {
        s->pid = 0;
        return -errno;
    }
    if (s->pid == 0)
        coordinator(s);
    setpgid(s->pid, s->pid); /* both sides: whichever runs first */
    pid_t pid = s->pid;
    int st = wait_run(s);
    s->pid = 0;
    if (s->stop_killed) {
        coord_remove_leftovers(s->given->name, pid, 1);
        fprintf(stderr, "ctitan: job %s did not stop within %.1f s of %s: killed every process of it and removed "
                "its shared-memory segments\n", s->given->name, SUP_STOP_S, strsignal(s->stop_sig));
    } else if (WIFSIGNALED(st) && coord_remove_leftovers(s->given->name, pid, 0) > 0) {
        fprintf(stderr, "ctitan: removed the shared-memory segments, control socket and operator key the dead "
                "coordinator left\n");
    }
    return st;
}

/* ---- after a failure ---- */

/* Adds step to the job's list of its checkpoints (the newest SUP_SAVED_MAX). */
static void remember(sup_t *s, int64_t step)
{
    for (int i = 0; i < s->n_saved; i++)
        if (s->saved[i] == step)
            return;
    if (s->n_saved < SUP_SAVED_MAX) {
        s->saved[s->n_saved++] = step;
        return;
    }
    int oldest = 0; /* full: the oldest makes room */
    for (int i = 1; i < s->n_saved; i++)
        oldest = s->saved[i] < s->saved[oldest] ? i : oldest;
    if (step > s->saved[oldest])
        s->saved[oldest] = step;
}

/* Adds the checkpoints the run saved to the job's list: those it was told of, and those in the
 * folder after the first run's start, which only this job can have written (the first run
 * refused to start with a complete checkpoint there after its start; the job's lock keeps other
 * launches of it out) but whose SAVED may not have reached the coordinator before it died: the
 * group is reaped, so nothing commits one any more. Whether each is whole is newest_checkpoint's. */
static void remember_saved(sup_t *s)
{
    const coord_outcome_t *o = s->out;
    for (int k = 0; k < o->n_ck && k < COORD_OUT_CKPTS; k++)
        if (o->ck[k].saved)
            remember(s, o->ck[k].step);
    int64_t *steps = NULL;
    int n = s->folder[0] ? ckpt_list(s->folder, &steps) : 0;
    for (int i = 0; i < n; i++)
        if (steps[i] > s->origin)
            remember(s, steps[i]);
    free(steps);
}

/* The run that failed was a restart that could not load the checkpoint it picked: when that
 * one does not verify (its LOAD read data whose checksums were wrong, the files being all there
 * when it was picked; only now is it read whole), it is moved aside to DIR/step-N.damaged
 * (kept, as no loader takes that name): no restart takes it again, and the older checkpoint the
 * next one takes is not refused for writing over a complete one after it. One that cannot be
 * moved stays, and the restarts end at job.max_restarts saying why. */
static void set_aside_damaged(sup_t *s)
{
    const char *slash = strrchr(s->m.ckpt_load, '/');
    char err[512];
    int n_bad = 0;
    if (!s->folder[0] || !s->out->load_failed || !s->restarts ||
        ckpt_step_of(slash ? slash + 1 : "") < 0 || /* not a step-N */
        ckpt_verify(s->m.ckpt_load, NULL, &n_bad, err, sizeof(err)) != -EBADMSG)
        return;
    char aside[PATH_MAX + 32];
    int rc = ckpt_set_aside(s->m.ckpt_load, aside, sizeof(aside));
    if (rc)
        fprintf(stderr, "ctitan: %s could not be loaded, and cannot be moved aside to %s: %s\n", s->m.ckpt_load, aside,
                strerror(-rc));
    else
        fprintf(stderr, "ctitan: %s could not be loaded (damaged, see above): moved aside to %s\n", s->m.ckpt_load,
                aside);
}

/* The newest checkpoint this job saved whose files are all there (the index, each data file of
 * its size and header: `ckpt_check_files`; the data itself is checked as the run loads it, one
 * read of it, and one found damaged so is set aside: set_aside_damaged), into f->ckpt and
 * f->resume; none: "" and where the first run started. On a storage host: the newest it
 * committed, and "latest" (the relaunch fetches it, or an older one when it proves damaged). */
static void newest_checkpoint(sup_t *s, failure_t *f, int64_t origin)
{
    f->ckpt[0] = 0;
    f->resume = origin;
    int64_t below = INT64_MAX;
    if (s->storage) { /* the storage host committed them: the relaunch's latest fetches the newest */
        for (int i = 0; i < s->n_saved; i++)
            f->resume = s->saved[i] > f->resume ? s->saved[i] : f->resume;
        if (s->n_saved)
            snprintf(f->ckpt, sizeof(f->ckpt), "latest");
        return;
    }
    while (s->folder[0]) {
        int64_t best = -1;
        for (int i = 0; i < s->n_saved; i++)
            best = s->saved[i] < below && s->saved[i] > best ? s->saved[i] : best;
        if (best < 0)
            return;
        char path[PATH_MAX], err[512];
        int bad = 0, rc;
        ckpt_step_path(path, sizeof(path), s->folder, best);
        if ((rc = ckpt_check_files(path, NULL, &bad, err, sizeof(err))) == 0) {
            snprintf(f->ckpt, sizeof(f->ckpt), "%s", path);
            f->resume = best;
            return;
        }
        if (rc != -ENOENT) /* not one retention removed: say why it is passed over */
            fprintf(stderr, "ctitan: %s: %s: not resuming from it\n", path, err);
        below = best;
    }
}

/* Who failed and why, from the wait status and the outcome. */
static void describe(sup_t *s, int st, failure_t *f)
{
    const coord_outcome_t *o = s->out;
    if (WIFSIGNALED(st) || !o->failed) {
        snprintf(f->role, sizeof(f->role), "coordinator");
        f->rank = f->replica = 0;
        if (WIFSIGNALED(st))
            snprintf(f->reason, sizeof(f->reason), "the coordinator was killed by signal %d (%s)", WTERMSIG(st),
                     strsignal(WTERMSIG(st)));
        else
            snprintf(f->reason, sizeof(f->reason), "the coordinator exited with status %d", WEXITSTATUS(st));
        snprintf(f->line, sizeof(f->line), "%s", f->reason);
        return;
    }
    snprintf(f->role, sizeof(f->role), "%s", o->role);
    f->rank = o->rank;
    f->replica = o->replica;
    snprintf(f->reason, sizeof(f->reason), "%s", o->why);
    snprintf(f->line, sizeof(f->line), "the coordinator exited with status %d (%.1600s)", WEXITSTATUS(st), o->why);
}

/* What the restart costs: the steps after f->resume that the run had completed, and the time
 * since the job last stood at f->resume (that step's end in this run, or the run's start)
 * until the relaunch, `wait_s` from now. */
static void count_losses(sup_t *s, failure_t *f, double wait_s)
{
    const coord_outcome_t *o = s->out;
    double since = s->started;
    for (int k = 0; k < o->n_ck && k < COORD_OUT_CKPTS; k++)
        if (o->ck[k].step == f->resume && f->resume > s->from)
            since = o->ck[k].done_at;
    f->lost_steps = o->last_step > f->resume ? o->last_step - f->resume : 0;
    f->lost_s = util_now() + wait_s - since;
}

/* The restart's line on the progress output, before its back-off. */
static void say_restart(sup_t *s, const failure_t *f, int wait_ms)
{
    const manifest_t *m = s->given;
    char whence[PATH_MAX + 128];
    if (f->ckpt[0] && s->storage)
        snprintf(whence, sizeof(whence), "resuming from the newest checkpoint on the storage host at %s (step %lld "
                 "or a later one: checkpoint.load = latest)", m->ckpt_endpoint, (long long)f->resume);
    else if (f->ckpt[0])
        snprintf(whence, sizeof(whence), "resuming after step %lld (checkpoint %s)", (long long)f->resume, f->ckpt);
    else if (m->ckpt_load[0])
        snprintf(whence, sizeof(whence), "no checkpoint of this run: resuming from checkpoint.load = %s again",
                 m->ckpt_load);
    else
        snprintf(whence, sizeof(whence), "no checkpoint of this run: starting again from step 0");
    printf("restart %d (%d of job.max_restarts = %d in a row after step %lld): %s; %s, %lld step%s lost, %.1f s; "
           "relaunching in %d ms\n",
           s->restarts, s->in_a_row, m->max_restarts, (long long)f->resume, f->line, whence,
           (long long)f->lost_steps, f->lost_steps == 1 ? "" : "s", f->lost_s, wait_ms);
    fflush(stdout);
}

/* Its record in metrics.file, once the relaunch is going ahead (a stop signal in the back-off or
 * a refusal by the memory plan leaves none: no restart happened). */
static void record_restart(sup_t *s, const failure_t *f)
{
    const manifest_t *m = s->given;
    FILE *fp = m->metrics_file[0] ? fopen(m->metrics_file, "ae") : NULL;
    if (m->metrics_file[0] && !fp) {
        fprintf(stderr, "ctitan: metrics.file %s: cannot append the restart record: %s\n", m->metrics_file,
                strerror(errno));
        return;
    }
    if (!fp)
        return;
    fprintf(fp, "{\"restart\": %d, \"scope\": \"job\", \"role\": ", s->restarts);
    util_json_string(fp, f->role);
    fprintf(fp, ", \"rank\": %d, \"replica\": %d, \"reason\": ", f->rank, f->replica);
    util_json_string(fp, f->reason);
    fprintf(fp, ", \"resume_step\": %lld, \"steps_lost\": %lld, \"time_lost_s\": %.3f}\n", (long long)f->resume,
            (long long)f->lost_steps, f->lost_s);
    fclose(fp);
}

/* Sleeps ms, or until a stop signal. Returns 0, or the signal. */
static int backoff(sup_t *s, int ms)
{
    double end = util_now() + ms * 1e-3;
    for (double left = ms * 1e-3; left > 0 && !s->stop_sig; left = end - util_now()) {
        struct pollfd p = {.fd = s->sigfd, .events = POLLIN};
        poll(&p, 1, (int)(left * 1e3) + 1);
        read_signals(s);
    }
    return s->stop_sig;
}

static int relaunch_stopped(void *arg);

/* No run follows: the other hosts' agents, which would wait job.host_timeout_s for a
 * coordinator, are told so (coord_farewell) as their next hello or heartbeat comes: a few
 * seconds at most (a Ctrl-C ends it). */
static void farewell(sup_t *s, const char *why)
{
    const manifest_t *m = s->given;
    if (m->hosts < 2)
        return;
    double beat = m->heartbeat_interval_ms * 1e-3 > 1.0 ? m->heartbeat_interval_ms * 1e-3 : 1.0;
    coord_farewell(&s->m, why, 2 * beat + 3.0, relaunch_stopped, s);
}

/* No restart: says why, where the coordinator has not (and tells the other hosts). Returns the
 * exit status, 1. */
static int give_up(sup_t *s, const failure_t *f, int64_t from)
{
    const manifest_t *m = s->given;
    if (s->stepped && m->max_restarts > 0)
        fprintf(stderr, "ctitan: job %s: giving up after %d restart%s in a row after step %lld "
                "(job.max_restarts = %d): it failed at step %lld again: %s\n", m->name, s->in_a_row,
                s->in_a_row == 1 ? "" : "s", (long long)from, m->max_restarts, (long long)s->out->last_step + 1,
                f->line);
    else if (!s->out->failed) /* the coordinator itself died: nobody else said it */
        fprintf(stderr, "ctitan: job %s failed: %s (not restarted: %s)\n", m->name, f->reason,
                s->stepped ? "job.max_restarts = 0" : "no step was completed");
    char why[600];
    snprintf(why, sizeof(why), "not relaunched after: %.500s", f->reason);
    farewell(s, why);
    return 1;
}

/* shm_wait_freed's stop before a relaunch: a stop signal ends the wait (the supervisor's signals
 * are blocked: read from the signalfd). */
static int relaunch_stopped(void *arg)
{
    sup_t *s = arg;
    read_signals(s);
    return s->stop_sig;
}

/* ... and its report, as the launch's wait says it. */
static int relaunch_say(void *arg, double bytes)
{
    (void)arg;
    return shm_say_freeing((void *)"ctitan", bytes);
}

/* The memory plan of the relaunch, as `ctitan launch` checks it before the first run, once the
 * failed run's memory is freed (its segments go to a detached freer: shm.h): another process may
 * have taken the memory since. 0, the exit status after a stop signal, or 1 (said on stderr):
 * not relaunched. */
static int plan_relaunch(sup_t *s)
{
    char err[4096];
    if (shm_wait_freed(relaunch_say, relaunch_stopped, s) == -ECANCELED)
        return 128 + s->stop_sig;
    int rc = plan_fits(&s->m, err, sizeof(err));
    if (!rc)
        return 0;
    fprintf(stderr, "ctitan: job %s: not relaunched: %s%s\n", s->given->name,
            rc == -ENOMEM ? "the memory plan refuses it now: " : "its memory plan failed: ", err);
    farewell(s, "not relaunched: the memory plan refuses the relaunch on host 0");
    return 1;
}

/* After a failed run: either the next run's manifest is set and 0 is returned, or the exit
 * status (no restart). */
static int plan_restart(sup_t *s, int st)
{
    failure_t f;
    if (!s->restarts)
        s->from = s->origin = s->out->first_step;
    int64_t from = s->from;
    describe(s, st, &f);
    s->stepped |= s->out->steps_run > 0;
    set_aside_damaged(s);
    remember_saved(s);
    newest_checkpoint(s, &f, s->origin);
    int n = s->stepped ? sup_restart_number(s->in_a_row, from, f.resume, s->given->max_restarts) : 0;
    if (!n)
        return give_up(s, &f, from);
    int wait_ms = sup_backoff_ms(s->given->restart_backoff_ms, n);
    count_losses(s, &f, wait_ms * 1e-3);
    s->restarts++;
    s->in_a_row = n;
    s->from = f.resume;
    say_restart(s, &f, wait_ms);
    snprintf(s->sup.last_restart, sizeof(s->sup.last_restart), "%.500s", f.reason);
    if (backoff(s, wait_ms))
        return 128 + s->stop_sig;
    if (!f.ckpt[0])
        memcpy(s->m.ckpt_load, s->given->ckpt_load, sizeof(s->m.ckpt_load));
    else if (strlen(f.ckpt) < sizeof(s->m.ckpt_load))
        snprintf(s->m.ckpt_load, sizeof(s->m.ckpt_load), "%s", f.ckpt);
    else /* too long for the key: latest finds the same one (and passes a damaged one over) */
        snprintf(s->m.ckpt_load, sizeof(s->m.ckpt_load), "latest");
    int rc = plan_relaunch(s);
    if (!rc)
        record_restart(s, &f);
    return rc;
}

/* ---- the supervisor ---- */

static int set_up(sup_t *s)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &set, NULL) || (s->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0)
        return -errno;
    if (prctl(PR_SET_CHILD_SUBREAPER, 1))
        return -errno;
    s->out = mmap(NULL, sizeof(*s->out), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s->out == MAP_FAILED) {
        s->out = NULL;
        return -errno;
    }
    s->self = getpid();
    s->m = *s->given;
    if (s->given->ckpt_enable && !s->given->ckpt_endpoint[0])
        manifest_ckpt_folder(s->given, s->folder, sizeof(s->folder));
    s->storage = s->given->ckpt_enable && s->given->ckpt_endpoint[0];
    return 0;
}

int sup_run(const manifest_t *m)
{
    sup_t *s = calloc(1, sizeof(*s));
    if (!s) {
        fprintf(stderr, "launch: out of memory\n");
        return 1;
    }
    s->given = m;
    s->sigfd = -1;
    char err[512];
    /* one launch of a name at a time, whatever the timing: the coordinators it forks share the
     * lock, so it is held until the last process of the job that could touch its segments is gone */
    int lock = shm_job_lock(m->name, err, sizeof(err));
    if (lock < 0) {
        fprintf(stderr, "launch: %s\n", err);
        free(s);
        return 1;
    }
    s->sup.lock_fd = lock;
    int rc = set_up(s), status = 1;
    if (rc)
        fprintf(stderr, "launch: cannot set up the job's supervisor: %s\n", strerror(-rc));
    while (!rc) {
        int st = run_once(s);
        if (st < 0) {
            fprintf(stderr, "launch: cannot start the coordinator: %s\n", strerror(-st));
            break;
        }
        read_signals(s); /* a stop that came while the group was reaped */
        status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (s->stop_killed)
            status = 128 + s->stop_sig;
        if (status == 0 || s->stop_sig || (WIFEXITED(st) && status != 1))
            break; /* done, stopped, or a status no restart changes */
        if ((status = plan_restart(s, st)))
            break;
    }
    if (s->out)
        munmap(s->out, sizeof(*s->out));
    if (s->sigfd >= 0)
        close(s->sigfd);
    free(s);
    shm_job_unlock(m->name, lock);
    return status;
}
