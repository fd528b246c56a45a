/* Control-plane sockets (see ctl.h): a ROUTER for the coordinator with its own context and
 * ZAP thread, DEALERs for workers, each frame a msg_t encoded by ipc/msg.c, all over CURVE.
 * Clients of a process share one ZeroMQ context, created with the first and terminated with
 * the last; a server's context is its own, since the ZAP handler's address is one per
 * context (and a test process may run a server beside its clients). */
#include "ipc/ctl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "ipc/log.h"
#include "ipc/util.h"

#define CTL_CLIENT_LINGER_MS 100
#define CTL_ENDPOINT_MAX 512
#define ZAP_ENDPOINT "inproc://zeromq.zap.01" /* where libzmq asks (RFC 27) */
#define MONITOR_ENDPOINT "inproc://ctl-monitor"

typedef struct {
    uint8_t key[32];
    char user[CTL_USER_MAX];
} allowed_t;

struct ctl {
    void *sock;
    bool server;
    pid_t pid; /* the process that owns sock (a forked child must not touch it) */
    char endpoint[CTL_ENDPOINT_MAX];
    char route[CTL_ROUTE_MAX]; /* a client's routing id */
    /* a server's: its context, and its guard thread with the ZAP handler's socket and the
     * ROUTER's monitor (handshakes that fail before ZAP is asked) */
    void *ctx, *zap, *mon;
    pthread_t guard;
    bool guard_started;
    pthread_mutex_t lock; /* allowed */
    allowed_t *allowed;
    int n_allowed, cap_allowed;
    _Atomic uint64_t refused_keys, refused_handshakes;
};

/* The clients' context is thread-safe and shared; sockets are not, so each thread uses its own ctl_t. */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static void *ctx;
static int ctx_users;

/* A forked child inherits the parent's context pointer but none of its I/O threads: it must
 * start afresh (and never close the parent's sockets). */
static void ctx_after_fork_in_child(void)
{
    pthread_mutex_init(&ctx_lock, NULL);
    ctx = NULL;
    ctx_users = 0;
}

static void ctx_register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, ctx_after_fork_in_child);
}

static void *ctx_acquire(void)
{
    pthread_once(&ctx_once, ctx_register_fork_handler);
    pthread_mutex_lock(&ctx_lock);
    if (!ctx) ctx = zmq_ctx_new();
    void *c = ctx;
    if (c) ctx_users++;
    pthread_mutex_unlock(&ctx_lock);
    return c;
}

static void ctx_release(void)
{
    pthread_mutex_lock(&ctx_lock);
    if (--ctx_users == 0) {
        /* every socket is closed; this waits at most for a client's linger */
        while (zmq_ctx_term(ctx) != 0 && errno == EINTR) {}
        ctx = NULL;
    }
    pthread_mutex_unlock(&ctx_lock);
}

static int ctl_alloc(ctl_t **out, int type, char *err, size_t errlen)
{
    *out = NULL;
    ctl_t *c = calloc(1, sizeof *c);
    if (!c) return util_fail(err, errlen, -ENOMEM, "out of memory");
    c->server = type == ZMQ_ROUTER;
    void *z = c->server ? (c->ctx = zmq_ctx_new()) : ctx_acquire();
    if (!z) {
        free(c);
        return util_fail(err, errlen, -ENOMEM, "cannot create a ZeroMQ context: %s",
                         zmq_strerror(errno));
    }
    pthread_mutex_init(&c->lock, NULL);
    c->sock = zmq_socket(z, type);
    if (!c->sock) {
        int e = errno;
        if (c->server)
            zmq_ctx_term(c->ctx);
        else
            ctx_release();
        free(c);
        return util_fail(err, errlen, -e, "cannot create a ZeroMQ socket: %s", zmq_strerror(e));
    }
    c->pid = getpid();
    *out = c;
    return 0;
}

void ctl_destroy(ctl_t **pc)
{
    ctl_t *c = *pc;
    if (!c) return;
    if (c->pid == getpid()) { /* in a forked child the sockets belong to the parent */
        if (c->sock)
            zmq_close(c->sock);
        if (c->server) {
            /* the guard thread's poll ends with ETERM; it closes its sockets and returns */
            zmq_ctx_shutdown(c->ctx);
            if (c->guard_started)
                pthread_join(c->guard, NULL);
            else if (c->zap)
                zmq_close(c->zap);
            if (!c->guard_started && c->mon)
                zmq_close(c->mon);
            while (zmq_ctx_term(c->ctx) != 0 && errno == EINTR) {}
        } else {
            ctx_release();
        }
    }
    pthread_mutex_destroy(&c->lock);
    free(c->allowed);
    free(c);
    *pc = NULL;
}

static int setopt_int(ctl_t *c, int opt, int v)
{
    return zmq_setsockopt(c->sock, opt, &v, sizeof v) == 0 ? 0 : -errno;
}

/* Options both ends share: a peer sending a frame over MSG_MAX_BYTES is disconnected by
 * ZeroMQ before the frame is buffered, so no peer can make us allocate more. */
static int setopt_common(ctl_t *c, int linger_ms)
{
    int64_t max = MSG_MAX_BYTES;
    if (zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &max, sizeof max) != 0) return -errno;
    return setopt_int(c, ZMQ_LINGER, linger_ms);
}

int ctl_linger(ctl_t *c, int ms) { return setopt_int(c, ZMQ_LINGER, ms); }

/* For ipc://PATH: libzmq unlinks whatever is at PATH before binding. We only let it replace
 * a dead socket file: not a live server's (two coordinators on one path) nor a regular file. */
static int ipc_check_path(const char *endpoint, char *err, size_t errlen)
{
    const char *path = endpoint + strlen("ipc://");
    if (path[0] == '@' || path[0] == '\0') return 0; /* abstract namespace: no file */
    struct stat st;
    if (lstat(path, &st) != 0) return 0;
    if (!S_ISSOCK(st.st_mode))
        return util_fail(err, errlen, -EEXIST, "cannot bind %s: %s exists and is not a socket",
                         endpoint, path);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) return 0; /* zmq reports the long name */
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return util_fail(err, errlen, -errno, "cannot bind %s: socket: %s", endpoint,
                                 strerror(errno));
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    close(fd);
    if (rc == 0)
        return util_fail(err, errlen, -EADDRINUSE,
                         "cannot bind %s: a server is already listening there", endpoint);
    if (e == ECONNREFUSED && unlink(path) != 0 && errno != ENOENT)
        return util_fail(err, errlen, -errno, "cannot bind %s: cannot remove stale %s: %s",
                         endpoint, path, strerror(errno));
    return 0;
}

/* ---- the server's guard: ZAP answers and failed handshakes ---- */

/* ZAP (RFC 27): request frames version, request id, domain, address, routing id (the
 * server's own, not the peer's: libzmq's), mechanism, credentials (CURVE: the client's
 * public key); the answer: version, request id, status code and text, user id, metadata. */
static void zap_answer(ctl_t *c, log_limit_t *lim)
{
    zmq_msg_t f[8]; /* the first 8 frames; a longer request is malformed anyway */
    int n = 0;
    for (bool more = true; more;) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, c->zap, ZMQ_DONTWAIT) < 0) { /* only libzmq asks: never seen */
            zmq_msg_close(&part);
            break;
        }
        more = zmq_msg_more(&part);
        if (n < 8) {
            zmq_msg_init(&f[n]);
            zmq_msg_move(&f[n++], &part);
        }
        zmq_msg_close(&part);
    }
    char user[CTL_USER_MAX] = "", key[KEYS_Z85 + 1] = "?", addr[64] = "?";
    const char *status = "400", *text = "key not allowed";
    bool curve = n == 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
                 zmq_msg_size(&f[6]) == 32;
    if (n >= 4)
        snprintf(addr, sizeof addr, "%.*s", (int)(zmq_msg_size(&f[3]) < 60 ? zmq_msg_size(&f[3]) : 60),
                 (const char *)zmq_msg_data(&f[3]));
    if (curve) {
        zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
        pthread_mutex_lock(&c->lock);
        for (int i = 0; i < c->n_allowed; i++)
            if (!memcmp(c->allowed[i].key, zmq_msg_data(&f[6]), 32)) {
                memcpy(user, c->allowed[i].user, sizeof user);
                status = "200", text = "OK";
            }
        pthread_mutex_unlock(&c->lock);
    }
    if (*status != '2') {
        atomic_fetch_add(&c->refused_keys, 1);
        if (curve)
            log_limited(lim, LOG_WARN, "control plane: refused a connection from %s: key %.8s... is not one of this "
                        "job's", addr, key);
        else
            log_limited(lim, LOG_WARN, "control plane: refused a connection from %s: not a CURVE handshake", addr);
    }
    const void *rf[6] = {"1.0", n >= 2 ? zmq_msg_data(&f[1]) : "", status, text, user, ""};
    size_t rn[6] = {3, n >= 2 ? zmq_msg_size(&f[1]) : 0, 3, strlen(text), strlen(user), 0};
    for (int i = 0; i < 6; i++)
        if (zmq_send(c->zap, rf[i], rn[i], i < 5 ? ZMQ_SNDMORE : 0) < 0)
            break;
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

/* A monitor event (two frames: event and value, then the endpoint): a connection that failed
 * its handshake before ZAP was asked (not CURVE, not our server key, not ZMTP at all). */
static void monitor_event(ctl_t *c, log_limit_t *lim)
{
    uint8_t ev[6];
    char where[256];
    int n = zmq_recv(c->mon, ev, sizeof ev, ZMQ_DONTWAIT);
    if (n < 0)
        return;
    int more = 0;
    size_t ml = sizeof more;
    zmq_getsockopt(c->mon, ZMQ_RCVMORE, &more, &ml);
    int w = more ? zmq_recv(c->mon, where, sizeof where - 1, 0) : 0;
    where[w > 0 ? (w < (int)sizeof where - 1 ? w : (int)sizeof where - 1) : 0] = '\0';
    uint16_t event;
    memcpy(&event, ev, sizeof event);
    if (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)) {
        atomic_fetch_add(&c->refused_handshakes, 1);
        log_limited(lim, LOG_WARN, "control plane: refused a connection to %s: its handshake failed (not CURVE "
                    "with this job's server key)", where);
    }
}

static void *guard_main(void *arg)
{
    ctl_t *c = arg;
    log_limit_t lim = {.what = "refused connections"};
    for (;;) {
        zmq_pollitem_t it[2] = {{.socket = c->zap, .events = ZMQ_POLLIN}, {.socket = c->mon, .events = ZMQ_POLLIN}};
        if (zmq_poll(it, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break; /* ETERM: ctl_destroy */
        }
        if (it[0].revents & ZMQ_POLLIN) zap_answer(c, &lim);
        if (it[1].revents & ZMQ_POLLIN) monitor_event(c, &lim);
    }
    log_limit_flush(&lim, LOG_WARN);
    zmq_close(c->zap);
    zmq_close(c->mon);
    return NULL;
}

/* The ZAP handler is bound, and the monitor attached, before the ROUTER binds: without a
 * handler, libzmq would admit any CURVE key. */
static int start_guard(ctl_t *c, char *err, size_t errlen)
{
    int zero = 0;
    if (!(c->zap = zmq_socket(c->ctx, ZMQ_REP)) || zmq_setsockopt(c->zap, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_bind(c->zap, ZAP_ENDPOINT))
        return util_fail(err, errlen, -errno, "cannot start the control plane's ZAP handler: %s", zmq_strerror(errno));
    if (zmq_socket_monitor(c->sock, MONITOR_ENDPOINT,
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) ||
        !(c->mon = zmq_socket(c->ctx, ZMQ_PAIR)) || zmq_setsockopt(c->mon, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_connect(c->mon, MONITOR_ENDPOINT))
        return util_fail(err, errlen, -errno, "cannot monitor the control socket: %s", zmq_strerror(errno));
    int rc = pthread_create(&c->guard, NULL, guard_main, c);
    if (rc)
        return util_fail(err, errlen, -rc, "cannot start the control plane's ZAP thread: %s", strerror(rc));
    c->guard_started = true;
    return 0;
}

int ctl_server_new(ctl_t **out, const char *server_sec, char *err, size_t errlen)
{
    *out = NULL;
    if (!server_sec || !keys_is_z85(server_sec))
        return util_fail(err, errlen, -EINVAL, "cannot make a ROUTER: the server's secret key is not a CURVE key");
    ctl_t *c = NULL;
    int rc = ctl_alloc(&c, ZMQ_ROUTER, err, errlen);
    if (rc) return rc;
    if ((rc = setopt_int(c, ZMQ_ROUTER_MANDATORY, 1)) || (rc = setopt_int(c, ZMQ_CURVE_SERVER, 1)) ||
        (rc = zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, server_sec, KEYS_Z85) ? -errno : 0) ||
        (rc = zmq_setsockopt(c->sock, ZMQ_ZAP_DOMAIN, "ctitan-ctl", 10) ? -errno : 0) ||
        (rc = setopt_common(c, 0))) {
        rc = util_fail(err, errlen, rc, "cannot set up a ROUTER: %s", zmq_strerror(-rc));
        goto out;
    }
    rc = start_guard(c, err, errlen);
out:
    if (rc) ctl_destroy(&c);
    *out = c;
    return rc;
}

int ctl_bind(ctl_t *c, const char *endpoint, char *err, size_t errlen)
{
    int rc;
    if (!c->server)
        return util_fail(err, errlen, -EINVAL, "cannot bind %s: not a server", endpoint);
    if (strncmp(endpoint, "ipc://", 6) == 0 && (rc = ipc_check_path(endpoint, err, errlen)))
        return rc;
    if (zmq_bind(c->sock, endpoint) != 0)
        return util_fail(err, errlen, -errno, "cannot bind %s: %s", endpoint, zmq_strerror(errno));
    size_t n = sizeof c->endpoint;
    if (zmq_getsockopt(c->sock, ZMQ_LAST_ENDPOINT, c->endpoint, &n) != 0)
        snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    return 0;
}

int ctl_allow(ctl_t *c, const char *pub, const char *user)
{
    uint8_t key[32];
    if (!c->server || !pub || !keys_is_z85(pub) || !zmq_z85_decode(key, pub) || !user || !*user ||
        strlen(user) >= CTL_USER_MAX)
        return -EINVAL;
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    int i = 0;
    while (i < c->n_allowed && memcmp(c->allowed[i].key, key, 32)) i++;
    if (i == c->n_allowed && c->n_allowed == c->cap_allowed) {
        int cap = c->cap_allowed ? 2 * c->cap_allowed : 16;
        allowed_t *a = realloc(c->allowed, (size_t)cap * sizeof *a);
        if (a) {
            c->allowed = a;
            c->cap_allowed = cap;
        } else {
            rc = -ENOMEM;
        }
    }
    if (!rc) {
        memcpy(c->allowed[i].key, key, 32);
        snprintf(c->allowed[i].user, sizeof c->allowed[i].user, "%s", user);
        c->n_allowed += i == c->n_allowed;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void ctl_revoke(ctl_t *c, const char *pub)
{
    uint8_t key[32];
    if (!c || !c->server || !pub || !keys_is_z85(pub) || !zmq_z85_decode(key, pub))
        return;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < c->n_allowed; i++)
        if (!memcmp(c->allowed[i].key, key, 32))
            c->allowed[i--] = c->allowed[--c->n_allowed];
    pthread_mutex_unlock(&c->lock);
}

void ctl_refusals(ctl_t *c, uint64_t *keys, uint64_t *handshakes)
{
    *keys = atomic_load(&c->refused_keys);
    *handshakes = atomic_load(&c->refused_handshakes);
}

/* CTL_NONCE random letters and digits: a route nobody can guess, and a fresh one at each
 * connect, so a restarted worker never collides with its predecessor's connection. */
static int nonce(char *out)
{
    static const char set[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint8_t r[CTL_NONCE];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return -EIO;
    for (int i = 0; i < CTL_NONCE; i++)
        out[i] = set[r[i] % (sizeof set - 1)];
    out[CTL_NONCE] = '\0';
    return 0;
}

int ctl_client_new(ctl_t **out, const char *endpoint, const char *id, const char *server_pub, const keys_pair_t *me,
                   char *err, size_t errlen)
{
    *out = NULL;
    size_t idlen = id ? strlen(id) : 0;
    if (idlen == 0 || idlen > CTL_ID_MAX - 1)
        return util_fail(err, errlen, -EINVAL, "routing id must be 1 to %d bytes, got %zu",
                         CTL_ID_MAX - 1, idlen);
    if (!server_pub || !keys_is_z85(server_pub) || !me || !keys_is_z85(me->pub) || !keys_is_z85(me->sec))
        return util_fail(err, errlen, -EINVAL, "cannot connect %s: the keys given are not CURVE keys", endpoint);
    char suffix[CTL_NONCE + 1];
    if (nonce(suffix))
        return util_fail(err, errlen, -EIO, "cannot draw a random routing id: %s", strerror(errno));
    ctl_t *c = NULL;
    int rc = ctl_alloc(&c, ZMQ_DEALER, err, errlen);
    if (rc) return rc;
    snprintf(c->route, sizeof c->route, "%s#%s", id, suffix);
    if ((rc = zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, c->route, strlen(c->route)) ? -errno : 0) ||
        (rc = zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, server_pub, KEYS_Z85) ? -errno : 0) ||
        (rc = zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, me->pub, KEYS_Z85) ? -errno : 0) ||
        (rc = zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, me->sec, KEYS_Z85) ? -errno : 0) ||
        (rc = setopt_common(c, CTL_CLIENT_LINGER_MS))) {
        rc = util_fail(err, errlen, rc, "cannot set up a DEALER '%s' for %s: %s", id, endpoint,
                       zmq_strerror(-rc));
        goto out;
    }
    if (zmq_connect(c->sock, endpoint) != 0) {
        rc = util_fail(err, errlen, -errno, "cannot connect %s: %s", endpoint, zmq_strerror(errno));
        goto out;
    }
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
out:
    if (rc) ctl_destroy(&c);
    *out = c;
    return rc;
}

static void free_buf(void *data, void *hint)
{
    (void)hint;
    free(data);
}

int ctl_send(ctl_t *c, const char *to, const msg_t *m)
{
    if (c->server != (to != NULL)) return -EINVAL;
    size_t tolen = to ? strlen(to) : 0;
    if (c->server && (tolen == 0 || tolen > CTL_ROUTE_MAX - 1)) return -EHOSTUNREACH;
    uint8_t *buf;
    size_t len;
    int rc = msg_encode(m, &buf, &len);
    if (rc) return rc;
    /* Never block: a full queue means the peer is gone or stuck, which the caller handles. */
    if (c->server && zmq_send(c->sock, to, tolen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        rc = -errno;
        free(buf);
        return rc;
    }
    zmq_msg_t frame;
    if (zmq_msg_init_data(&frame, buf, len, free_buf, NULL) != 0) {
        free(buf);
        return -ENOMEM;
    }
    if (zmq_msg_send(&frame, c->sock, ZMQ_DONTWAIT) < 0) {
        rc = -errno;
        zmq_msg_close(&frame);
    }
    return rc;
}

/* Waits for the socket to be readable; 0, -EAGAIN at the deadline, -EINTR. */
static int wait_readable(ctl_t *c, int timeout_ms, double deadline)
{
    int ms = timeout_ms;
    if (timeout_ms > 0) {
        double left = deadline - util_now();
        ms = left > 0 ? (int)(left * 1000 + 0.999) : 0;
    }
    zmq_pollitem_t it = {.socket = c->sock, .events = ZMQ_POLLIN};
    int n = zmq_poll(&it, 1, ms);
    if (n < 0) return -errno;
    return n == 0 ? -EAGAIN : 0;
}

/* The sender of a message on a server: its route (frame 0) and the user ZeroMQ attached to
 * the payload's connection (ZAP's answer). Returns 0 or -EBADMSG. */
static int sender(zmq_msg_t *f, int nframes, ctl_peer_t *from, char *err, size_t errlen)
{
    size_t n = zmq_msg_size(&f[0]);
    const char *id = zmq_msg_data(&f[0]);
    const char *user = nframes >= 2 ? zmq_msg_gets(&f[1], "User-Id") : NULL;
    if (from && user)
        snprintf(from->user, sizeof from->user, "%s", user);
    if (n == 0 || n > CTL_ROUTE_MAX - 1 || memchr(id, '\0', n))
        return util_fail(err, errlen, -EBADMSG, "message from a peer whose routing id is not a name (%zu bytes)", n);
    if (from) {
        memcpy(from->route, id, n);
        from->route[n] = '\0';
    }
    return 0;
}

int ctl_recv(ctl_t *c, int timeout_ms, ctl_peer_t *from, msg_t *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (from) memset(from, 0, sizeof *from);
    double deadline = util_now() + (timeout_ms > 0 ? timeout_ms / 1000.0 : 0);
    zmq_msg_t f[2]; /* the first two frames; any further ones are only counted */
    zmq_msg_init(&f[0]);
    zmq_msg_init(&f[1]);
    int rc, nframes = 0;
    for (;;) { /* readiness can vanish before the read: wait again */
        rc = wait_readable(c, timeout_ms, deadline);
        if (rc) goto out;
        if (zmq_msg_recv(&f[0], c->sock, ZMQ_DONTWAIT) >= 0) break;
        if (errno != EAGAIN) {
            rc = -errno;
            goto out;
        }
        if (timeout_ms == 0) {
            rc = -EAGAIN;
            goto out;
        }
    }
    nframes = 1;
    /* the rest of a multipart message is already here: drain it all, whatever happens */
    for (bool more = zmq_msg_more(&f[0]); more; nframes++) {
        zmq_msg_t extra, *dst = nframes == 1 ? &f[1] : &extra;
        if (dst == &extra) zmq_msg_init(&extra);
        int r;
        while ((r = zmq_msg_recv(dst, c->sock, 0)) < 0 && errno == EINTR) {}
        if (r < 0) {
            rc = -errno;
            if (dst == &extra) zmq_msg_close(&extra);
            goto out;
        }
        more = zmq_msg_more(dst);
        if (dst == &extra) zmq_msg_close(&extra);
    }
    if (c->server && (rc = sender(f, nframes, from, err, errlen)))
        goto out;
    int want = c->server ? 2 : 1;
    if (nframes != want) {
        rc = util_fail(err, errlen, -EBADMSG, "expected %d frame%s, got %d", want,
                       want > 1 ? "s" : "", nframes);
        goto out;
    }
    const char *user = c->server ? zmq_msg_gets(&f[1], "User-Id") : NULL;
    if (c->server && (!user || !*user)) { /* ZAP admits no key without one: never seen */
        rc = util_fail(err, errlen, -EBADMSG, "a message without an authenticated key");
        goto out;
    }
    zmq_msg_t *payload = &f[want - 1];
    if (msg_decode(zmq_msg_data(payload), zmq_msg_size(payload), m, err, errlen) != 0)
        rc = -EBADMSG;
out:
    zmq_msg_close(&f[0]);
    zmq_msg_close(&f[1]);
    return rc;
}

void *ctl_socket(ctl_t *c)
{
    return c->sock;
}

const char *ctl_endpoint(ctl_t *c)
{
    return c->endpoint;
}

const char *ctl_route(ctl_t *c)
{
    return c->route;
}
