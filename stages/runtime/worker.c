/* Worker-side control plane (see worker.h). */
#include "stages/runtime/worker.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc/ctl.h"
#include "ipc/log.h"
#include "ipc/util.h"

#define KEYS_MAGIC "ctitan-keys 1\n"

struct worker {
    ctl_t *ctl;
    worker_keys_t keys;
    char id[CTL_ID_MAX];
    char role[MSG_ROLE_MAX];
    int rank, replica;
    char endpoint[256];
    char job[64];
    manifest_t man;
    int64_t first_step;
    _Atomic uint64_t progress;
    _Atomic int waiting;         /* the main thread waits on a peer (worker_waiting) */
    const char *die_at, *hang_at, *drop_at, *slow_at, *mute_at; /* the test points (worker_test_point,
                                                                 * worker_test_mute), read once */
    _Atomic int quit;
    pthread_t hb;
    int hb_started;
};

static void fill_who(const worker_t *w, msg_t *m)
{
    snprintf(m->role, sizeof(m->role), "%s", w->role);
    m->rank = w->rank;
    m->replica = w->replica;
    m->pid = getpid();
}

/* Sends a heartbeat every interval and reads the coordinator's answers on the same socket;
 * a coordinator that stops answering for heartbeat_timeout_ms is gone or hung, and a worker
 * without its coordinator ends itself rather than wait on its rings forever. */
static void *heartbeat_main(void *arg)
{
    worker_t *w = arg;
    char id[CTL_ID_MAX + 4], err[256];
    sigset_t abrt; /* the watchdog's SIGABRT is for the main thread's stack (dump_stack) */
    sigemptyset(&abrt);
    sigaddset(&abrt, SIGABRT);
    pthread_sigmask(SIG_BLOCK, &abrt, NULL);
    snprintf(id, sizeof(id), "%s/hb", w->id);
    ctl_t *c = NULL;
    if (ctl_client_new(&c, w->endpoint, id, w->keys.server, &w->keys.me, err, sizeof(err))) {
        LOG_E("heartbeat: %s", err);
        return NULL;
    }
    double interval = w->man.heartbeat_interval_ms * 1e-3, limit = w->man.heartbeat_timeout_ms * 1e-3;
    double last_answer = util_now();
    while (!atomic_load(&w->quit)) {
        if (atomic_load(&w->waiting)) /* blocked on a peer is not wedged: the watchdog looks for the one */
            atomic_fetch_add(&w->progress, 1);
        msg_t m = {.type = MSG_HEARTBEAT, .progress = atomic_load(&w->progress)};
        fill_who(w, &m);
        ctl_send(c, NULL, &m);
        /* wait for answers in slices of at most 50 ms so worker_close is not held up */
        double until = util_now() + interval;
        for (double now = util_now(); now < until && !atomic_load(&w->quit); now = util_now()) {
            int ms = (int)((until - now) * 1e3) + 1;
            if (ctl_recv(c, ms < 50 ? ms : 50, NULL, &m, err, sizeof(err)) == 0) {
                last_answer = util_now();
                msg_clear(&m);
            }
        }
        if (util_now() - last_answer > limit && !atomic_load(&w->quit)) {
            LOG_E("the coordinator at %s has not answered heartbeats for %.1f s: exiting", w->endpoint,
                  util_now() - last_answer);
            _exit(1);
        }
    }
    ctl_destroy(&c);
    return NULL;
}

/* SIGABRT (the coordinator's step watchdog, or abort()): the main thread's stack to standard
 * error, then the default action. backtrace() was called once at start, so it does not load
 * libgcc from here. */
static void dump_stack(int sig)
{
    void *frames[64];
    static const char head[] = "ctitan: SIGABRT: the stack of the main thread:\n";
    ssize_t rc = write(2, head, sizeof(head) - 1);
    (void)rc;
    backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

int worker_keys_pipe(const worker_keys_t *k)
{
    char text[256];
    int n = snprintf(text, sizeof(text), "%s%s\n%s\n%s\n", KEYS_MAGIC, k->server, k->me.pub, k->me.sec);
    int fd[2];
    if (pipe2(fd, O_CLOEXEC))
        return -errno;
    int rc = util_write_all(fd[1], text, (size_t)n); /* a pipe holds far more than these bytes */
    close(fd[1]);
    if (rc) {
        close(fd[0]);
        return rc;
    }
    return fd[0];
}

/* Every key checked, and the pair checked to match. */
int worker_keys_take(worker_keys_t *k, const char *who, char *err, size_t errlen)
{
    const char *e = getenv(WORKER_ENV_KEYS);
    char *end;
    long fd = e ? strtol(e, &end, 10) : -1;
    if (!e || !*e || *end || fd < 0 || fd > 1 << 20)
        return util_fail(err, errlen, -EINVAL, "%s: %s is not set: workers are started by `ctitan launch`", who,
                         WORKER_ENV_KEYS);
    char text[256] = "", pub[KEYS_Z85 + 1];
    long n = util_read_all((int)fd, text, sizeof(text) - 1, -1);
    close((int)fd);
    unsetenv(WORKER_ENV_KEYS);
    if (n < 0)
        return util_fail(err, errlen, (int)n, "%s: cannot read its keys from descriptor %ld: %s", who, fd,
                         strerror((int)-n));
    text[n] = 0;
    char *key[3], *p = text + strlen(KEYS_MAGIC);
    int ok = !strncmp(text, KEYS_MAGIC, strlen(KEYS_MAGIC));
    for (int i = 0; i < 3 && ok; i++) {
        key[i] = p;
        ok = (p = strchr(p, '\n')) != NULL;
        if (ok)
            *p++ = 0;
        ok = ok && keys_is_z85(key[i]);
    }
    if (!ok || keys_public(key[2], pub) || strcmp(pub, key[1]))
        return util_fail(err, errlen, -EINVAL, "%s: descriptor %ld does not hold a worker's keys", who, fd);
    snprintf(k->server, sizeof(k->server), "%s", key[0]);
    snprintf(k->me.pub, sizeof(k->me.pub), "%s", key[1]);
    snprintf(k->me.sec, sizeof(k->me.sec), "%s", key[2]);
    memset(text, 0, sizeof(text));
    return 0;
}

int worker_open(worker_t **out, const char *role, int rank, int replica, char *err, size_t errlen)
{
    log_init(role, rank, replica);
    const char *ep = getenv(WORKER_ENV_ENDPOINT), *job = getenv(WORKER_ENV_JOB);
    if (!ep || !*ep || !job || !*job)
        return util_fail(err, errlen, -EINVAL,
                         "%s: %s and %s are not set: workers are started by `ctitan launch`", role,
                         WORKER_ENV_ENDPOINT, WORKER_ENV_JOB);
    worker_t *w = calloc(1, sizeof(*w));
    if (!w)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", role);
    snprintf(w->role, sizeof(w->role), "%s", role);
    w->rank = rank;
    w->replica = replica;
    snprintf(w->endpoint, sizeof(w->endpoint), "%s", ep);
    snprintf(w->job, sizeof(w->job), "%s", job);
    snprintf(w->id, sizeof(w->id), "%s.%d.%d", role, rank, replica);
    int rc = worker_keys_take(&w->keys, role, err, errlen);
    if (!rc)
        rc = ctl_client_new(&w->ctl, ep, w->id, w->keys.server, &w->keys.me, err, errlen);
    if (rc)
        goto fail;
    msg_t hello = {.type = MSG_HELLO};
    fill_who(w, &hello);
    if ((rc = ctl_send(w->ctl, NULL, &hello))) {
        util_fail(err, errlen, rc, "%s: cannot send hello to %s", w->id, ep);
        goto fail;
    }
    double deadline = util_now() + 60;
    for (;;) {
        msg_t m;
        int left = (int)((deadline - util_now()) * 1e3);
        if (left <= 0) {
            rc = util_fail(err, errlen, -ETIMEDOUT, "%s: no config from the coordinator at %s in 60 s",
                           w->id, ep);
            goto fail;
        }
        rc = worker_recv(w, left, &m);
        if (rc == -EAGAIN || rc == -EINTR)
            continue;
        if (rc)
            goto fail;
        if (m.type == MSG_STOP) {
            rc = util_fail(err, errlen, -ECANCELED, "%s: stopped before it started", w->id);
            goto fail;
        }
        if (m.type != MSG_CONFIG) {
            LOG_W("ignoring %s before the config", msg_type_name(m.type));
            msg_clear(&m);
            continue;
        }
        manifest_defaults(&w->man);
        rc = manifest_parse(&w->man, m.text ? m.text : "", m.text_len, "config from the coordinator", err,
                            errlen);
        if (!rc)
            rc = manifest_validate(&w->man, err, errlen);
        log_set_step(m.step); /* the first step this worker takes part in */
        w->first_step = m.step;
        msg_clear(&m);
        if (rc)
            goto fail;
        break;
    }
    w->die_at = getenv("CTITAN_TEST_DIE_AT");
    w->hang_at = getenv("CTITAN_TEST_HANG_AT");
    w->drop_at = getenv("CTITAN_TEST_DROP_AT");
    w->slow_at = getenv("CTITAN_TEST_SLOW_AT");
    w->mute_at = getenv("CTITAN_TEST_MUTE_AT");
    void *frame;
    backtrace(&frame, 1);
    signal(SIGABRT, dump_stack);
    if (pthread_create(&w->hb, NULL, heartbeat_main, w) == 0)
        w->hb_started = 1;
    *out = w;
    return 0;
fail:
    worker_close(&w);
    return rc;
}

void worker_close(worker_t **pw)
{
    worker_t *w = *pw;
    if (!w)
        return;
    atomic_store(&w->quit, 1);
    if (w->hb_started)
        pthread_join(w->hb, NULL);
    ctl_destroy(&w->ctl);
    memset(&w->keys, 0, sizeof(w->keys));
    free(w);
    *pw = NULL;
}

const manifest_t *worker_manifest(const worker_t *w) { return &w->man; }
int64_t worker_first_step(const worker_t *w) { return w->first_step; }

/* Whether the list `at` (of environment variable `var`) names `want`, and this is the first
 * process to reach it when CTITAN_TEST_DIE_ONCE names a folder (a file per point there). */
static int test_point_hit(const char *var, const char *at, const char *want)
{
    const char *once = getenv("CTITAN_TEST_DIE_ONCE");
    char list[1024], flag[PATH_MAX];
    if (!at)
        return 0;
    snprintf(list, sizeof(list), "%s", at);
    for (char *save = NULL, *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        if (strcmp(item, want))
            continue;
        if (!once || snprintf(flag, sizeof(flag), "%s/%s:%s", once, var, want) >= (int)sizeof(flag))
            return 1;
        int fd = open(flag, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
        if (fd < 0)
            return 0; /* a process reached it once already */
        close(fd);
        return 1;
    }
    return 0;
}

void worker_test_point(worker_t *w, const char *point, int64_t step)
{
    /* the usual case, on the per-step path: nothing to look at */
    if (!w->die_at && !w->hang_at && !w->drop_at && !w->slow_at)
        return;
    char want[128];
    snprintf(want, sizeof(want), "%s:%s:%lld", w->id, point, (long long)step + 1);
    if (test_point_hit("CTITAN_TEST_DIE_AT", w->die_at, want)) {
        LOG_W("CTITAN_TEST_DIE_AT: killing myself with SIGKILL at %s", want);
        raise(SIGKILL);
    }
    if (test_point_hit("CTITAN_TEST_DROP_AT", w->drop_at, want)) {
        /* a death the coordinator has not reaped yet when it next sends: the route is gone */
        LOG_W("CTITAN_TEST_DROP_AT: closing my control connection at %s, SIGKILL in 1 s", want);
        ctl_linger(w->ctl, 0);
        ctl_destroy(&w->ctl);
        struct timespec second = {1, 0};
        nanosleep(&second, NULL);
        raise(SIGKILL);
    }
    if (test_point_hit("CTITAN_TEST_SLOW_AT", w->slow_at, want)) {
        /* widens a window another process's test point opens (the coordinator's next send) */
        LOG_W("CTITAN_TEST_SLOW_AT: pausing half a second at %s", want);
        struct timespec half = {0, 500000000};
        nanosleep(&half, NULL);
    }
    if (test_point_hit("CTITAN_TEST_HANG_AT", w->hang_at, want)) {
        LOG_W("CTITAN_TEST_HANG_AT: the main thread hangs at %s (heartbeats go on)", want);
        for (;;)
            pause();
    }
}

int worker_test_mute(worker_t *w, const char *point, int64_t step)
{
    if (!w->mute_at)
        return 0;
    char want[128];
    snprintf(want, sizeof(want), "%s:%s:%lld", w->id, point, (long long)step + 1);
    if (!test_point_hit("CTITAN_TEST_MUTE_AT", w->mute_at, want))
        return 0;
    LOG_W("CTITAN_TEST_MUTE_AT: not sending my message at %s", want);
    return 1;
}

const char *worker_job(const worker_t *w) { return w->job; }

int worker_send(worker_t *w, const msg_t *m) { return ctl_send(w->ctl, NULL, m); }

int worker_recv(worker_t *w, int timeout_ms, msg_t *m)
{
    for (;;) {
        char why[256];
        int rc = ctl_recv(w->ctl, timeout_ms, NULL, m, why, sizeof(why));
        if (rc == -EBADMSG) {
            LOG_W("ignoring a bad message from the coordinator: %s", why);
            continue;
        }
        if (rc == 0)
            fill_who(w, m);
        if (rc == 0 && m->type == MSG_STEP)
            log_set_step(m->step);
        return rc;
    }
}

void worker_command(worker_t *w, msg_t *m)
{
    int rc;
    while ((rc = worker_recv(w, -1, m)) == -EINTR || rc == -EAGAIN)
        ;
    if (rc)
        worker_die(w, "control socket: %s", strerror(-rc));
}

int worker_ready(worker_t *w)
{
    msg_t m = {.type = MSG_READY};
    fill_who(w, &m);
    return ctl_send(w->ctl, NULL, &m);
}

void worker_waiting(worker_t *w, int on) { atomic_store(&w->waiting, on); }

void worker_progress(worker_t *w) { atomic_fetch_add(&w->progress, 1); }

static void vreport(worker_t *w, const char *fmt, va_list ap)
{
    char text[1024];
    vsnprintf(text, sizeof(text), fmt, ap);
    LOG_E("%s", text);
    if (!w || !w->ctl)
        return;
    msg_t m = {.type = MSG_ERROR};
    fill_who(w, &m);
    m.text = text;
    m.text_len = strlen(text);
    ctl_send(w->ctl, NULL, &m);
}

void worker_report(worker_t *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(w, fmt, ap);
    va_end(ap);
}

void worker_die(worker_t *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(w, fmt, ap);
    va_end(ap);
    /* closing the socket lets its linger deliver the error before the process goes */
    worker_close(&w);
    exit(1);
}
