/* The trainer's side of remote checkpoints (see remote.h): checkpointd streams a checkpoint's
 * files to a storage host's server (remote_server.c) over CURVE, learning of the server's
 * errors at its next write or at commit, and telling a refused key, a wrong server key and a
 * missing server apart through a socket monitor; and it fetches one back to resume from. */
#include "checkpointd/remote_int.h"

#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ipc/util.h"

#define RMT_SEND_TIMEOUT_MS 60000 /* a client blocked this long on a full queue gives up */
#define RMT_LINGER_MS 1000        /* what a closing client still tries to deliver */
#define RMT_RECONNECT_MS 250

struct rmt_client {
    void *ctx, *sock, *mon;
    char endpoint[512];
    keys_pair_t me;              /* ours: to open a new socket, and for "add this key" messages */
    char server[KEYS_Z85 + 1];   /* the server's public key */
    unsigned generation;         /* of the socket: names its monitor */
    uint64_t seq;                /* of the last message sent */
    uint64_t begin_seq;          /* of the current checkpoint's begin */
    int open;                    /* the server accepted a begin and no commit yet */
    int dirty;                   /* the server may hold a checkpoint of ours: abort before a begin */
    int stuck;                   /* a send timed out: the next begin starts on a new socket */
    /* what the monitor said */
    int tcp_connected, handshake_ok, auth_failed, proto_failed, disconnected;
    uint16_t fail_event;
    uint32_t fail_value;
};

/* Reads the monitor's events (frame 1: uint16 event, uint32 value; frame 2: endpoint). */
static void mon_drain(rmt_client_t *c)
{
    for (;;) {
        zmq_msg_t f[2];
        int n;
        int rc = rmt_recv_frames(c->mon, f, 2, &n, ZMQ_DONTWAIT);
        if (!rc && zmq_msg_size(&f[0]) >= 6) {
            uint16_t ev;
            uint32_t val;
            memcpy(&ev, zmq_msg_data(&f[0]), 2);
            memcpy(&val, (uint8_t *)zmq_msg_data(&f[0]) + 2, 4);
            switch (ev) {
            case ZMQ_EVENT_CONNECTED: c->tcp_connected = 1; break;
            case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
                c->handshake_ok = 1, c->auth_failed = c->proto_failed = c->disconnected = 0;
                break;
            case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: c->auth_failed = 1, c->fail_value = val; break;
            case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
            case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                c->proto_failed = 1, c->fail_event = ev, c->fail_value = val;
                break;
            case ZMQ_EVENT_DISCONNECTED: c->disconnected = 1; break;
            }
        }
        rmt_close_frames(f, 2);
        if (rc)
            return;
    }
}

/* An error about the connection itself, from what the monitor saw (0 when nothing wrong). */
static int conn_error(rmt_client_t *c, char *err, size_t errlen)
{
    if (c->auth_failed)
        return util_fail(err, errlen, -EACCES, "the checkpointd at %s refused our key (not in its allow list; "
                         "status %u): add %s to its --allow file", c->endpoint, c->fail_value, c->me.pub);
    if (c->proto_failed && !c->handshake_ok) {
        char why[128];
        if (c->fail_event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
            snprintf(why, sizeof why, "ZMTP protocol error 0x%x", c->fail_value);
        else /* the value is an errno */
            snprintf(why, sizeof why, "the connection ended: %s", strerror((int)c->fail_value));
        return util_fail(err, errlen, -EPROTO, "the CURVE handshake with %s failed (%s): is the server public key "
                         "we were given the one of that checkpointd?", c->endpoint, why);
    }
    return 0;
}

static int timeout_error(rmt_client_t *c, const char *what, int timeout_ms, char *err, size_t errlen)
{
    int rc = conn_error(c, err, errlen);
    if (rc)
        return rc;
    if (!c->tcp_connected)
        return util_fail(err, errlen, -ETIMEDOUT, "no checkpointd at %s: could not connect within %d ms",
                         c->endpoint, timeout_ms);
    if (!c->handshake_ok)
        return util_fail(err, errlen, -ETIMEDOUT, "connected to %s but the CURVE handshake did not finish within "
                         "%d ms (not a checkpointd, or a wrong server public key?)", c->endpoint, timeout_ms);
    return util_fail(err, errlen, -ETIMEDOUT, "the checkpointd at %s did not answer %s within %d ms%s", c->endpoint,
                     what, timeout_ms, c->disconnected ? " (the connection was lost)" : "");
}

/* An error reply: its code (an errno; EIO when it is none) and the server's own text, shown as
 * it is, cut to size, control characters blanked. */
static int refusal(rmt_client_t *c, const rmt_hdr_t *h, char *err, size_t errlen)
{
    char shown[1024];
    size_t k = h->text_len < sizeof shown - 1 ? h->text_len : sizeof shown - 1;
    memcpy(shown, h->text, k);
    shown[k] = '\0';
    for (size_t i = 0; i < k; i++)
        if ((unsigned char)shown[i] < 0x20)
            shown[i] = ' ';
    int code = h->code > 0 && h->code < 4096 ? (int)h->code : EIO;
    return util_fail(err, errlen, -code, "the checkpointd at %s refused: %s", c->endpoint, shown);
}

/* Handles one reply. Returns 1 when it is the answer to seq `want` (ok; text into out), a
 * negative errno for an error reply about the current checkpoint (err says why), 0 for a
 * stale reply (to an earlier checkpoint) or one still to wait past. */
static int take_reply(rmt_client_t *c, uint64_t want, char *out, size_t outlen, char *err, size_t errlen)
{
    zmq_msg_t f[2];
    int n;
    int rc = rmt_recv_frames(c->sock, f, 2, &n, ZMQ_DONTWAIT);
    if (rc) {
        rmt_close_frames(f, 2);
        return rc == -EAGAIN ? 0 : rc;
    }
    rmt_hdr_t h;
    char perr[512];
    rc = n > 2 ? util_fail(perr, sizeof perr, -EBADMSG, "%d frames", n)
               : rmt_hdr_decode(zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), n == 2, &h, perr, sizeof perr);
    if (!rc && h.type != RMT_REPLY)
        rc = util_fail(perr, sizeof perr, -EBADMSG, "a '%s' message where a reply was expected", rmt_type_name(h.type));
    if (rc) {
        rc = util_fail(err, errlen, -EPROTO, "the checkpointd at %s sent a bad message: %s", c->endpoint, perr);
    } else if (h.seq < c->begin_seq) {
        rc = 0;
    } else if (!h.ok) {
        rc = refusal(c, &h, err, errlen);
    } else if (h.seq == want) {
        if (out && outlen) {
            size_t k = h.text_len < outlen - 1 ? h.text_len : outlen - 1;
            memcpy(out, h.text, k);
            out[k] = '\0';
        }
        rc = 1;
    }
    rmt_close_frames(f, 2);
    return rc;
}

/* Waits up to timeout_ms for the answer to seq want; 0 or -errno. */
static int wait_reply(rmt_client_t *c, uint64_t want, const char *what, int timeout_ms, char *out, size_t outlen,
                      char *err, size_t errlen)
{
    double deadline = util_now() + (timeout_ms > 0 ? timeout_ms : 0) / 1000.0;
    for (;;) {
        int rc = take_reply(c, want, out, outlen, err, errlen);
        if (rc)
            return rc > 0 ? 0 : rc;
        mon_drain(c);
        if ((rc = conn_error(c, err, errlen)))
            return rc;
        double left = deadline - util_now();
        if (left <= 0)
            return timeout_error(c, what, timeout_ms, err, errlen);
        zmq_pollitem_t it[2] = {{.socket = c->sock, .events = ZMQ_POLLIN}, {.socket = c->mon, .events = ZMQ_POLLIN}};
        if (zmq_poll(it, 2, (long)(left * 1000) + 1) < 0 && errno != EINTR)
            return util_fail(err, errlen, -errno, "poll: %s", zmq_strerror(errno));
    }
}

static int client_send(rmt_client_t *c, rmt_hdr_t *h, const void *payload, size_t n, char *err, size_t errlen)
{
    h->seq = ++c->seq;
    int rc = rmt_send(c->sock, NULL, 0, h, payload, n, 0);
    if (rc == -EAGAIN)
        c->stuck = 1;
    if (rc == -EAGAIN)
        return util_fail(err, errlen, -ETIMEDOUT, "the checkpointd at %s took no data for %d s%s", c->endpoint,
                         RMT_SEND_TIMEOUT_MS / 1000, c->disconnected ? " (the connection was lost)" : "");
    if (rc)
        return util_fail(err, errlen, rc, "cannot send to %s: %s", c->endpoint, zmq_strerror(-rc));
    return 0;
}

/* Closes the socket and its monitor. linger: whether queued messages may still go out. */
static void client_close(rmt_client_t *c, bool linger)
{
    if (c->sock) {
        if (!linger)
            rmt_set_int(c->sock, ZMQ_LINGER, 0);
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->sock);
    }
    if (c->mon)
        zmq_close(c->mon);
    c->sock = c->mon = NULL;
}

/* A new socket connected to the server, with a monitor; the old one, if any, closed first
 * (nothing it queued goes out: a refused handshake may never be retried on it by libzmq). */
static int client_open(rmt_client_t *c, char *err, size_t errlen)
{
    client_close(c, false);
    c->tcp_connected = c->handshake_ok = c->auth_failed = c->proto_failed = c->disconnected = 0;
    c->open = c->dirty = c->stuck = 0;
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://monitor-%u", ++c->generation);
    int64_t maxmsg = RMT_DATA_FRAME + 4096; /* headers, and the parts of a fetch (the limit is on the
                                              * frame as it comes, CURVE's box and flags included) */
    if (!(c->sock = zmq_socket(c->ctx, ZMQ_DEALER)) || rmt_set_int(c->sock, ZMQ_LINGER, RMT_LINGER_MS) ||
        rmt_set_int(c->sock, ZMQ_SNDHWM, RMT_HWM) || rmt_set_int(c->sock, ZMQ_RCVHWM, RMT_HWM) ||
        rmt_set_int(c->sock, ZMQ_SNDTIMEO, RMT_SEND_TIMEOUT_MS) ||
        rmt_set_int(c->sock, ZMQ_RECONNECT_IVL, RMT_RECONNECT_MS) ||
        rmt_set_int(c->sock, ZMQ_HEARTBEAT_IVL, 5000) || rmt_set_int(c->sock, ZMQ_HEARTBEAT_TIMEOUT, 30000) ||
        zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, c->server, KEYS_Z85) ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, c->me.pub, KEYS_Z85) ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, c->me.sec, KEYS_Z85))
        return util_fail(err, errlen, -errno, "cannot set up a client socket: %s", zmq_strerror(errno));
    /* the monitor is how a refused key is told apart from a server that is not there */
    if (zmq_socket_monitor(c->sock, mon,
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0 ||
        !(c->mon = zmq_socket(c->ctx, ZMQ_PAIR)) || rmt_set_int(c->mon, ZMQ_LINGER, 0) || zmq_connect(c->mon, mon) != 0)
        return util_fail(err, errlen, -errno, "cannot monitor the client socket: %s", zmq_strerror(errno));
    if (zmq_connect(c->sock, c->endpoint) != 0)
        return util_fail(err, errlen, -errno, "cannot connect %s: %s", c->endpoint, zmq_strerror(errno));
    return 0;
}

int rmt_client_new(rmt_client_t **out, const char *endpoint, const char *server_pub_path,
                   const char *client_secret_path, char *err, size_t errlen)
{
    *out = NULL;
    rmt_client_t *c = calloc(1, sizeof *c);
    if (!c)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    int rc;
    if ((rc = keys_load_one(server_pub_path, c->server, err, errlen)) ||
        (rc = keys_load_secret(client_secret_path, &c->me, err, errlen)))
        goto out;
    if (!(c->ctx = zmq_ctx_new())) {
        rc = util_fail(err, errlen, -errno, "cannot create a ZeroMQ context: %s", zmq_strerror(errno));
        goto out;
    }
    rc = client_open(c, err, errlen);
out:
    if (rc)
        rmt_client_destroy(&c);
    *out = c;
    return rc;
}

void rmt_client_destroy(rmt_client_t **pc)
{
    rmt_client_t *c = *pc;
    if (!c)
        return;
    if (c->mon)
        mon_drain(c);
    bool abort = c->sock && c->dirty && c->handshake_ok && !c->stuck;
    if (abort) { /* so the server drops it now, not after its idle timeout */
        rmt_hdr_t h = {.type = RMT_ABORT, .seq = ++c->seq};
        rmt_send(c->sock, NULL, 0, &h, NULL, 0, ZMQ_DONTWAIT);
    }
    client_close(c, abort); /* a socket that never got through has nothing worth waiting for */
    if (c->ctx)
        while (zmq_ctx_term(c->ctx) != 0 && errno == EINTR) {}
    memset(c->me.sec, 0, sizeof c->me.sec);
    free(c);
    *pc = NULL;
}

int rmt_client_begin(rmt_client_t *c, const char *job, int keep, const ckpt_index_t *plan, int timeout_ms,
                     char *err, size_t errlen)
{
    return rmt_client_begin_replace(c, job, keep, 0, plan, timeout_ms, err, errlen);
}

int rmt_client_begin_replace(rmt_client_t *c, const char *job, int keep, int replace, const ckpt_index_t *plan,
                             int timeout_ms, char *err, size_t errlen)
{
    int rc;
    mon_drain(c);
    if (c->auth_failed || c->proto_failed || c->stuck) { /* a new connection rather than wait on this one */
        if ((rc = client_open(c, err, errlen)))
            return rc;
    } else if (c->dirty) { /* an unfinished one, or a begin that was not answered: drop it on the server */
        rmt_hdr_t a = {.type = RMT_ABORT};
        if ((rc = client_send(c, &a, NULL, 0, err, errlen)))
            return rc;
    }
    c->open = 0;
    c->dirty = 1;
    uint8_t *buf = NULL;
    size_t len = 0;
    if ((rc = ckpt_index_encode(plan, &buf, &len)))
        return util_fail(err, errlen, rc, "cannot encode the index of step %" PRId64 ": %s", plan->step,
                         strerror(-rc));
    if (len > RMT_FRAME_MAX) {
        free(buf);
        return util_fail(err, errlen, -EMSGSIZE, "the index of step %" PRId64 " is %zu bytes, at most %u can be "
                         "sent", plan->step, len, RMT_FRAME_MAX);
    }
    rmt_hdr_t h = {.type = RMT_BEGIN, .job = job, .job_len = strlen(job), .keep = keep < 0 ? 0 : keep,
                   .replace = replace != 0, .step = (uint64_t)plan->step};
    rc = client_send(c, &h, buf, len, err, errlen);
    free(buf);
    if (rc)
        return rc;
    c->begin_seq = h.seq;
    char what[64];
    snprintf(what, sizeof what, "the begin of step %" PRId64, plan->step);
    if ((rc = wait_reply(c, h.seq, what, timeout_ms, NULL, 0, err, errlen)))
        return rc;
    c->open = 1;
    return 0;
}

int rmt_client_write(rmt_client_t *c, uint32_t file, uint64_t offset, const void *data, size_t n, char *err,
                     size_t errlen)
{
    if (!c->open)
        return util_fail(err, errlen, -EINVAL, "no checkpoint is open on %s (begin first; an error ends one)",
                         c->endpoint);
    const uint8_t *p = data;
    do {
        /* an error the server sent about an earlier piece ends the checkpoint here */
        int rc = take_reply(c, 0, NULL, 0, err, errlen);
        if (rc < 0) {
            c->open = 0;
            return rc;
        }
        if (rc == 0) {
            mon_drain(c);
            size_t k = n < RMT_DATA_FRAME ? n : RMT_DATA_FRAME;
            rmt_hdr_t h = {.type = RMT_DATA, .file = file, .offset = offset};
            if ((rc = client_send(c, &h, p, k, err, errlen))) {
                c->open = 0;
                return rc;
            }
            p += k, offset += k, n -= k;
        }
    } while (n);
    return 0;
}

int rmt_client_list(rmt_client_t *c, const char *job, int64_t steps[RMT_LIST_MAX], int *n, int timeout_ms,
                    char *err, size_t errlen)
{
    int rc;
    *n = 0;
    mon_drain(c);
    if ((c->auth_failed || c->proto_failed || c->stuck) && (rc = client_open(c, err, errlen)))
        return rc;
    rmt_hdr_t h = {.type = RMT_LIST, .job = job, .job_len = strlen(job)};
    if ((rc = client_send(c, &h, NULL, 0, err, errlen)))
        return rc;
    c->begin_seq = h.seq; /* earlier answers are not this one's */
    char text[1024] = "";
    if ((rc = wait_reply(c, h.seq, "the list of checkpoints", timeout_ms, text, sizeof text, err, errlen)))
        return rc;
    /* "COUNT STEP..." (newest first) */
    char *p = text, *end;
    long long count = strtoll(p, &end, 10);
    if (end == p || count < 0 || count > INT_MAX)
        return util_fail(err, errlen, -EPROTO, "the checkpointd at %s answered the list with '%.100s'", c->endpoint,
                         text);
    *n = (int)count;
    for (int i = 0; i < RMT_LIST_MAX && i < count; i++) {
        p = end;
        long long s = strtoll(p, &end, 10);
        if (end == p || s < 0)
            return util_fail(err, errlen, -EPROTO, "the checkpointd at %s answered the list with '%.100s'",
                             c->endpoint, text);
        steps[i] = s;
    }
    return 0;
}

int rmt_client_commit(rmt_client_t *c, char *path, size_t pathlen, int timeout_ms, char *err, size_t errlen)
{
    if (!c->open)
        return util_fail(err, errlen, -EINVAL, "no checkpoint is open on %s (begin first; an error ends one)",
                         c->endpoint);
    c->open = 0;
    rmt_hdr_t h = {.type = RMT_COMMIT};
    int rc = client_send(c, &h, NULL, 0, err, errlen);
    if (!rc)
        rc = wait_reply(c, h.seq, "the commit", timeout_ms, path, pathlen, err, errlen);
    if (!rc || rc != -ETIMEDOUT)
        c->dirty = 0; /* answered: the server holds nothing of ours */
    return rc;
}

/* ---- fetching a checkpoint back ---- */

int rmt_client_fetch(rmt_client_t *c, const char *job, int64_t step, const rmt_sink_t *sink, char *path,
                     size_t pathlen, int idle_ms, char *err, size_t errlen)
{
    int rc;
    mon_drain(c);
    if ((c->auth_failed || c->proto_failed || c->stuck) && (rc = client_open(c, err, errlen)))
        return rc;
    if (step < 0)
        return util_fail(err, errlen, -EINVAL, "step %lld", (long long)step);
    rmt_hdr_t h = {.type = RMT_FETCH, .job = job, .job_len = strlen(job), .step = (uint64_t)step};
    if ((rc = client_send(c, &h, NULL, 0, err, errlen)))
        return rc;
    uint64_t want = c->begin_seq = h.seq; /* earlier answers are not this one's */
    rmt_fetch_t F;
    rmt_fetch_init(&F, sink, job, step, c->endpoint);
    char what[96];
    snprintf(what, sizeof what, "the fetch of step %lld", (long long)step);
    for (rc = 1; rc > 0;) {
        zmq_msg_t f[2];
        int n;
        rc = rmt_recv_frames(c->sock, f, 2, &n, ZMQ_DONTWAIT);
        if (rc == -EAGAIN) { /* nothing for idle_ms is the end */
            rmt_close_frames(f, 2);
            mon_drain(c);
            if ((rc = conn_error(c, err, errlen)))
                break;
            zmq_pollitem_t it[2] = {{.socket = c->sock, .events = ZMQ_POLLIN}, {.socket = c->mon, .events = ZMQ_POLLIN}};
            int k = zmq_poll(it, 2, idle_ms > 0 ? idle_ms : 0);
            if (k < 0 && errno != EINTR)
                rc = util_fail(err, errlen, -errno, "poll: %s", zmq_strerror(errno));
            else if (k == 0)
                rc = timeout_error(c, what, idle_ms, err, errlen);
            else
                rc = 1;
            continue;
        }
        if (rc) {
            rmt_close_frames(f, 2);
            rc = util_fail(err, errlen, rc, "receiving from %s: %s", c->endpoint, zmq_strerror(-rc));
            break;
        }
        rmt_hdr_t r;
        char perr[512];
        rc = n > 2 ? util_fail(perr, sizeof perr, -EBADMSG, "%d frames", n)
                   : rmt_hdr_decode(zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), n == 2, &r, perr, sizeof perr);
        if (rc)
            rc = util_fail(err, errlen, -EPROTO, "the checkpointd at %s sent a bad message: %s", c->endpoint, perr);
        else if (r.seq != want) /* an answer to something earlier */
            rc = 1;
        else if (r.type == RMT_PART)
            rc = (rc = rmt_fetch_part(&F, &r, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), err, errlen)) ? rc : 1;
        else if (r.type != RMT_REPLY)
            rc = util_fail(err, errlen, -EPROTO, "the checkpointd at %s sent a '%s' message during a fetch",
                           c->endpoint, rmt_type_name(r.type));
        else if (!r.ok)
            rc = refusal(c, &r, err, errlen);
        else if (!(rc = rmt_fetch_done(&F, err, errlen)) && path && pathlen)
            snprintf(path, pathlen, "%.*s", (int)(r.text_len < pathlen ? r.text_len : pathlen - 1), r.text);
        rmt_close_frames(f, 2);
    }
    rmt_fetch_free(&F);
    if (rc)
        c->stuck = 1; /* the server may still be sending: the next request starts on a new socket */
    return rc;
}

int rmt_client_fetch_dir(rmt_client_t *c, const char *job, int64_t step, const char *dir, char *path,
                         size_t pathlen, int idle_ms, char *err, size_t errlen)
{
    rmt_dir_sink_t d;
    char shown[640];
    snprintf(shown, sizeof(shown), "step %lld of job %s from the storage host at %s", (long long)step, job,
             c->endpoint);
    rmt_dir_sink_init(&d, dir, shown);
    int rc = rmt_client_fetch(c, job, step, &d.sink, path, pathlen, idle_ms, err, errlen);
    if (!rc)
        rc = rmt_dir_sink_finish(&d, err, errlen);
    rmt_dir_sink_close(&d);
    return rc;
}
