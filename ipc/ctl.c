/* Control-plane sockets (see ctl.h): a ROUTER for the coordinator, DEALERs for workers, each
 * frame a msg_t encoded by ipc/msg.c. All sockets of a process share one ZeroMQ context,
 * created with the first socket and terminated with the last. */
#include "ipc/ctl.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "ipc/util.h"

#define CTL_CLIENT_LINGER_MS 100
#define CTL_ENDPOINT_MAX 512

struct ctl {
    void *sock;
    bool server;
    pid_t pid; /* the process that owns sock (a forked child must not touch it) */
    char endpoint[CTL_ENDPOINT_MAX];
};

/* The context is thread-safe and shared; sockets are not, so each thread uses its own ctl_t. */
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
    void *z = ctx_acquire();
    if (!z) {
        free(c);
        return util_fail(err, errlen, -ENOMEM, "cannot create a ZeroMQ context: %s",
                         zmq_strerror(errno));
    }
    c->sock = zmq_socket(z, type);
    if (!c->sock) {
        int e = errno;
        ctx_release();
        free(c);
        return util_fail(err, errlen, -e, "cannot create a ZeroMQ socket: %s", zmq_strerror(e));
    }
    c->server = type == ZMQ_ROUTER;
    c->pid = getpid();
    *out = c;
    return 0;
}

void ctl_destroy(ctl_t **pc)
{
    ctl_t *c = *pc;
    if (!c) return;
    if (c->pid == getpid()) { /* in a forked child the socket belongs to the parent */
        zmq_close(c->sock);
        ctx_release();
    }
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

int ctl_server_new(ctl_t **out, const char *endpoint, char *err, size_t errlen)
{
    ctl_t *c = NULL;
    int rc = ctl_alloc(&c, ZMQ_ROUTER, err, errlen);
    if (rc) return rc;
    if ((rc = setopt_int(c, ZMQ_ROUTER_MANDATORY, 1)) ||
        (rc = setopt_int(c, ZMQ_ROUTER_HANDOVER, 1)) || (rc = setopt_common(c, 0))) {
        rc = util_fail(err, errlen, rc, "cannot set up a ROUTER for %s: %s", endpoint,
                       zmq_strerror(-rc));
        goto out;
    }
    if (strncmp(endpoint, "ipc://", 6) == 0 && (rc = ipc_check_path(endpoint, err, errlen)))
        goto out;
    if (zmq_bind(c->sock, endpoint) != 0) {
        rc = util_fail(err, errlen, -errno, "cannot bind %s: %s", endpoint, zmq_strerror(errno));
        goto out;
    }
    size_t n = sizeof c->endpoint;
    if (zmq_getsockopt(c->sock, ZMQ_LAST_ENDPOINT, c->endpoint, &n) != 0)
        snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
out:
    if (rc) ctl_destroy(&c);
    *out = c;
    return rc;
}

int ctl_client_new(ctl_t **out, const char *endpoint, const char *id, char *err, size_t errlen)
{
    *out = NULL;
    size_t idlen = id ? strlen(id) : 0;
    if (idlen == 0 || idlen > CTL_ID_MAX - 1)
        return util_fail(err, errlen, -EINVAL, "routing id must be 1 to %d bytes, got %zu",
                         CTL_ID_MAX - 1, idlen);
    ctl_t *c = NULL;
    int rc = ctl_alloc(&c, ZMQ_DEALER, err, errlen);
    if (rc) return rc;
    if ((rc = zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, id, idlen) ? -errno : 0) ||
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
    if (c->server && (tolen == 0 || tolen > CTL_ID_MAX - 1)) return -EHOSTUNREACH;
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

int ctl_recv(ctl_t *c, int timeout_ms, char *from, msg_t *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (from) from[0] = '\0';
    double deadline = util_now() + (timeout_ms > 0 ? timeout_ms / 1000.0 : 0);
    zmq_msg_t f[2]; /* the first two frames; any further ones are only counted */
    zmq_msg_init(&f[0]);
    zmq_msg_init(&f[1]);
    int rc, nframes = 0;
    for (;;) { /* readiness can vanish before the read (a handover): wait again */
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
    if (c->server) {
        size_t n = zmq_msg_size(&f[0]);
        const char *id = zmq_msg_data(&f[0]);
        if (n == 0 || n > CTL_ID_MAX - 1 || memchr(id, '\0', n)) {
            rc = util_fail(err, errlen, -EBADMSG,
                           "message from a peer whose routing id is not a name (%zu bytes)", n);
            goto out;
        }
        if (from) {
            memcpy(from, id, n);
            from[n] = '\0';
        }
    }
    int want = c->server ? 2 : 1;
    if (nframes != want) {
        rc = util_fail(err, errlen, -EBADMSG, "expected %d frame%s, got %d", want,
                       want > 1 ? "s" : "", nframes);
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
