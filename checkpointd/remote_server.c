/* The storage host's side of remote checkpoints (see remote.h): `checkpointd --listen`'s loop,
 * its ZAP handler, and a state per connection. Clients (remote_client.c) stream checkpoints
 * in; each is written through checkpointd/writer.c, so it is as atomic as a local one.
 *
 * The server keeps a state per connection (ZeroMQ routing id): none -> open (begin accepted)
 * -> none (commit, abort); an error or the idle timeout of silence aborts the checkpoint
 * and leaves the connection failed (its error is the answer to its commit) until its next
 * begin or abort, or another idle period. Only authenticated clients get this far: the ZAP
 * handler runs in the server's poll loop and answers 400 to any key not in the allow file. */
#include "checkpointd/remote_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zmq.h>

#include "checkpointd/restore.h"
#include "checkpointd/writer.h"
#include "ipc/codec.h"
#include "ipc/util.h"

#define RMT_MAX_PEERS 64          /* connections with a state on the server */
#define RMT_MAX_OPEN 8            /* checkpoints being written at once (32 MiB of buffers each) */
#define RMT_MAX_KEYS 4096         /* in an allow file */
#define RMT_POLL_MS 100           /* < 200: remote.h promises to look at *stop that often */
#define RMT_REFUSAL_QUIET_S 60    /* a refused client that keeps retrying is logged once per */
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

typedef enum { P_OPEN, P_FAILED } pstate_t;

typedef struct {
    uint8_t id[256];          /* routing id */
    size_t idlen;
    pstate_t state;
    ckw_t *w;                 /* open */
    char job[CKPT_FILE_MAX];
    int keep;
    int64_t step;
    char who[128];            /* "ADDR (key ABCDEFGH...)" for log lines */
    double t0, last;          /* begin, last message */
    uint64_t bytes;
    uint64_t planned;         /* open: the bytes its plan's files hold */
    int made_dir;             /* open: its begin created DIR/job, which goes if it is not committed */
    uint64_t seq;             /* of its last message */
    int code;                 /* failed: the answer to its commit */
    char reason[1152];
} peer_t;

typedef struct {
    const char *dir, *allow_path;
    FILE *log;
    int idle_ms;
    void *ctx, *router, *zap;
    uint8_t (*allowed)[32];
    int n_allowed;
    peer_t *peers[RMT_MAX_PEERS];
    int n_open;
    char last_refused[512];   /* refused-connection log lines are not repeated for a while */
    double last_refused_t;
    int refused_repeats;
} srv_t;

static void srv_log(srv_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void srv_log(srv_t *s, const char *fmt, ...)
{
    if (!s->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(s->log, fmt, ap);
    va_end(ap);
    fputc('\n', s->log);
    fflush(s->log);
}

/* ZAP (RFC 27): request frames version, request id, domain, address, routing id, mechanism,
 * credentials; the answer: version, request id, status code and text, user id, metadata. */
static void zap_serve(srv_t *s)
{
    for (;;) {
        zmq_msg_t f[8];
        int n;
        if (rmt_recv_frames(s->zap, f, 8, &n, ZMQ_DONTWAIT) != 0) {
            rmt_close_frames(f, 8);
            return;
        }
        const char *status = "400", *text = "key not allowed";
        char user[RMT_KEY_Z85 + 1] = "", addr[CODEC_PRINTABLE] = "?", mech[CODEC_PRINTABLE] = "?";
        if (n >= 6) {
            codec_printable(zmq_msg_data(&f[3]), zmq_msg_size(&f[3]) < 40 ? zmq_msg_size(&f[3]) : 40, addr);
            codec_printable(zmq_msg_data(&f[5]), zmq_msg_size(&f[5]) < 20 ? zmq_msg_size(&f[5]) : 20, mech);
        }
        bool curve = n == 7 && !strcmp(mech, "CURVE") && zmq_msg_size(&f[6]) == 32;
        if (curve) {
            zmq_z85_encode(user, zmq_msg_data(&f[6]), 32);
            for (int i = 0; i < s->n_allowed; i++)
                if (!memcmp(s->allowed[i], zmq_msg_data(&f[6]), 32))
                    status = "200", text = "OK";
        }
        if (n < 2 || zmq_msg_size(&f[0]) != 3 || memcmp(zmq_msg_data(&f[0]), "1.0", 3)) {
            status = "500", text = "bad ZAP request";
            srv_log(s, "ZAP: a malformed request (%d frames); refusing the connection", n);
        }
        if (*status != '2') {
            char line[sizeof s->last_refused];
            if (curve)
                snprintf(line, sizeof line, "%s: key %s is not in %s", addr, user, s->allow_path);
            else
                snprintf(line, sizeof line, "%s: mechanism %s, only CURVE is accepted", addr, mech);
            double now = util_now();
            if (!strcmp(line, s->last_refused) && now - s->last_refused_t < RMT_REFUSAL_QUIET_S) {
                s->refused_repeats++;
            } else {
                if (s->refused_repeats)
                    srv_log(s, "refused %d more connection%s from %s", s->refused_repeats,
                            s->refused_repeats > 1 ? "s" : "", s->last_refused);
                srv_log(s, "refused a connection from %s", line);
                snprintf(s->last_refused, sizeof s->last_refused, "%s", line);
                s->last_refused_t = now;
                s->refused_repeats = 0;
            }
            user[0] = '\0';
        }
        /* the reply: all frames but the last with SNDMORE */
        const void *rf[6] = {"1.0", n >= 2 ? zmq_msg_data(&f[1]) : "", status, text, user, ""};
        size_t rn[6] = {3, n >= 2 ? zmq_msg_size(&f[1]) : 0, 3, strlen(text), strlen(user), 0};
        for (int i = 0; i < 6; i++)
            if (zmq_send(s->zap, rf[i], rn[i], i < 5 ? ZMQ_SNDMORE : 0) < 0)
                break;
        rmt_close_frames(f, 8);
    }
}

static peer_t *peer_find(srv_t *s, const void *id, size_t idlen, int *slot)
{
    *slot = -1;
    for (int i = 0; i < RMT_MAX_PEERS; i++) {
        peer_t *p = s->peers[i];
        if (p && p->idlen == idlen && !memcmp(p->id, id, idlen)) {
            *slot = i;
            return p;
        }
        if (!p && *slot < 0)
            *slot = i;
    }
    return NULL;
}

/* After p's checkpoint ended without a commit: the job directory its begin created goes too,
 * when nothing else is in it (an aborted upload leaves nothing in DIR). */
static void drop_job_dir(srv_t *s, peer_t *p)
{
    char jobdir[PATH_MAX];
    if (p->made_dir && snprintf(jobdir, sizeof jobdir, "%s/%s", s->dir, p->job) < (int)sizeof jobdir)
        rmdir(jobdir); /* fails, harmlessly, if anything is in it */
    p->made_dir = 0;
}

static void peer_free(srv_t *s, peer_t *p)
{
    for (int i = 0; i < RMT_MAX_PEERS; i++)
        if (s->peers[i] == p)
            s->peers[i] = NULL;
    if (p->w) {
        ckw_abort(&p->w);
        drop_job_dir(s, p);
        s->n_open--;
    }
    free(p);
}

/* Aborts p's checkpoint and keeps the reason as the answer to its commit. */
static void peer_fail(srv_t *s, peer_t *p, int code, const char *reason)
{
    if (p->w) {
        ckw_abort(&p->w);
        drop_job_dir(s, p);
        s->n_open--;
        srv_log(s, "%s step %" PRId64 " from %s: aborted: %s", p->job, p->step, p->who, reason);
        snprintf(p->reason, sizeof p->reason, "step %" PRId64 " of job %s: %s", p->step, p->job, reason);
    } else {
        snprintf(p->reason, sizeof p->reason, "%s", reason);
    }
    p->state = P_FAILED;
    p->code = code;
}

static void reply(srv_t *s, const void *id, size_t idlen, uint64_t seq, int code, const char *text)
{
    rmt_hdr_t h = {.type = RMT_REPLY, .seq = seq, .ok = code == 0, .code = (uint64_t)code, .text = text,
                   .text_len = strlen(text)};
    int rc = rmt_send(s->router, id, idlen, &h, NULL, 0, ZMQ_DONTWAIT);
    if (rc && rc != -EHOSTUNREACH) /* unreachable: it is gone, nobody to tell */
        srv_log(s, "could not answer a client (%s): %s", zmq_strerror(-rc), text);
}

/* Whether the plan's files fit what the storage holds: DIR's free space less what the other
 * open uploads still have to write. Sets p->planned. */
static int check_room(srv_t *s, peer_t *p, const ckpt_index_t *ix, char *err, size_t errlen)
{
    uint64_t need = 0, promised = 0;
    for (int f = 0; f < ix->n_files; f++)
        need = ix->files[f].bytes > UINT64_MAX - need ? UINT64_MAX : need + ix->files[f].bytes;
    for (int i = 0; i < RMT_MAX_PEERS; i++)
        if (s->peers[i] && s->peers[i] != p && s->peers[i]->w && s->peers[i]->planned > s->peers[i]->bytes)
            promised += s->peers[i]->planned - s->peers[i]->bytes;
    struct statvfs vfs;
    if (statvfs(s->dir, &vfs))
        return util_fail(err, errlen, -errno, "%s: cannot tell its free space: %s", s->dir, strerror(errno));
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize, room = avail > promised ? avail - promised : 0;
    if (need > room)
        return util_fail(err, errlen, -ENOSPC, "the plan's %d files hold %" PRIu64 " bytes, but the storage host has "
                         "%" PRIu64 " bytes free (%" PRIu64 " of them promised to other uploads)", ix->n_files, need,
                         avail, promised);
    p->planned = need;
    return 0;
}

/* DIR/job as a real directory of DIR (made if missing), never through a link: whatever is
 * in DIR, nothing is written outside it. */
static int check_job_dir(const char *dir, const char *job, char *err, size_t errlen)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), fd = -1, rc = 0;
    if (dfd < 0)
        return util_fail(err, errlen, -errno, "%s: %s", dir, strerror(errno));
    if (mkdirat(dfd, job, 0755) < 0 && errno != EEXIST)
        rc = util_fail(err, errlen, -errno, "%s/%s: cannot create: %s", dir, job, strerror(errno));
    else if ((fd = openat(dfd, job, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
        struct stat st;
        int e = errno, link = fstatat(dfd, job, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
        rc = util_fail(err, errlen, e == ELOOP || e == ENOTDIR ? -EINVAL : -e,
                       "%s/%s is %s: the server writes only into real directories inside its --dir", dir, job,
                       link ? "a symbolic link" : e == ENOTDIR ? "not a directory" : strerror(e));
    }
    if (fd >= 0)
        close(fd);
    close(dfd);
    return rc;
}

/* A step the job already holds is kept unless the trainer asks to replace it (it saves that
 * step again) or it does not verify (then it was not a checkpoint to keep). */
static int check_stored(const char *jobdir, int64_t step, char *err, size_t errlen)
{
    char path[PATH_MAX + 32], why[512];
    ckpt_step_path(path, sizeof path, jobdir, step);
    struct stat st;
    int bad;
    if (lstat(path, &st) || ckpt_verify(path, NULL, &bad, why, sizeof why))
        return 0;
    return util_fail(err, errlen, -EEXIST, "%s is stored already and verifies: an upload of step %" PRId64 " replaces "
                     "it only when the trainer saves that step again (a checkpoint of another run is never written "
                     "over)", path, step);
}

static int begin(srv_t *s, peer_t *p, const rmt_hdr_t *h, zmq_msg_t *payload, char *err, size_t errlen)
{
    char shown[CODEC_PRINTABLE];
    if (h->job_len == 0 || h->job_len >= CKPT_FILE_MAX || memchr(h->job, '\0', h->job_len))
        return util_fail(err, errlen, -EINVAL, "job name '%s' is not 1 to %d characters",
                         codec_printable(h->job, h->job_len, shown), CKPT_FILE_MAX - 1);
    memcpy(p->job, h->job, h->job_len);
    p->job[h->job_len] = '\0';
    if (!ckpt_safe_name(p->job))
        return util_fail(err, errlen, -EINVAL, "job name '%s' is not a plain name (A-Z a-z 0-9 . _ -, not "
                         "starting with '.')", codec_printable(h->job, h->job_len, shown));
    for (int i = 0; i < RMT_MAX_PEERS; i++)
        if (s->peers[i] && s->peers[i] != p && s->peers[i]->w && !strcmp(s->peers[i]->job, p->job))
            return util_fail(err, errlen, -EBUSY, "job %s: step %" PRId64 " is being received from another "
                             "connection (%s); a silent one is dropped after %d s", p->job, s->peers[i]->step,
                             s->peers[i]->who, s->idle_ms / 1000);
    if (s->n_open >= RMT_MAX_OPEN)
        return util_fail(err, errlen, -EBUSY, "%d checkpoints are being received already; try later", s->n_open);
    if (zmq_msg_size(payload) > RMT_FRAME_MAX)
        return util_fail(err, errlen, -EMSGSIZE, "index of %zu bytes, at most %u accepted", zmq_msg_size(payload),
                         RMT_FRAME_MAX);
    ckpt_index_t ix;
    char what[96];
    snprintf(what, sizeof what, "the index for job %s", p->job);
    int rc = ckpt_index_decode(zmq_msg_data(payload), zmq_msg_size(payload), &ix, what, err, errlen);
    if (rc)
        return rc == -ENOMEM ? util_fail(err, errlen, rc, "out of memory") : -EINVAL;
    for (int f = 0; f < ix.n_files && !rc; f++) /* ckpt_index_decode checks them; these become paths */
        if (!ckpt_safe_name(ix.files[f].name))
            rc = util_fail(err, errlen, -EINVAL, "%s: file '%s' is not a plain name", what,
                           codec_printable(ix.files[f].name, strlen(ix.files[f].name), shown));
    if (!rc && (uint64_t)ix.step != h->step) /* an index's step is >= 0 */
        rc = util_fail(err, errlen, -EINVAL, "begin says step %" PRIu64 ", its index says %" PRId64, h->step,
                       ix.step);
    if (!rc && restore_check_shapes(&ix, what, err, errlen) < 0) /* what `ckpt verify` would refuse */
        rc = -EINVAL;
    if (!rc)
        rc = check_room(s, p, &ix, err, errlen);
    char jobdir[PATH_MAX];
    struct stat st;
    if (!rc && snprintf(jobdir, sizeof jobdir, "%s/%s", s->dir, p->job) >= (int)sizeof jobdir)
        rc = util_fail(err, errlen, -ENAMETOOLONG, "%s/%s: path too long", s->dir, p->job);
    if (!rc) {
        p->made_dir = lstat(jobdir, &st) != 0;
        rc = check_job_dir(s->dir, p->job, err, errlen);
    }
    if (!rc && !h->replace)
        rc = check_stored(jobdir, ix.step, err, errlen);
    if (!rc)
        rc = ckw_begin(&p->w, jobdir, &ix, err, errlen);
    ckpt_index_free(&ix);
    if (rc) {
        drop_job_dir(s, p);
        return rc;
    }
    s->n_open++;
    p->state = P_OPEN;
    p->reason[0] = '\0';
    p->step = (int64_t)h->step; /* equal to the index's */
    p->keep = (int)h->keep;
    p->bytes = 0;
    p->t0 = util_now();
    return 0;
}

static void commit(srv_t *s, peer_t *p, uint64_t seq)
{
    char path[PATH_MAX], err[1024];
    ckw_stats_t st = {0};
    s->n_open--;
    int rc = ckw_commit(&p->w, path, sizeof path, &st, err, sizeof err);
    if (rc)
        drop_job_dir(s, p);
    p->made_dir = 0; /* committed: the directory holds a checkpoint */
    if (rc) {
        srv_log(s, "%s step %" PRId64 " from %s: commit failed: %s", p->job, p->step, p->who, err);
        reply(s, p->id, p->idlen, seq, -rc, err);
        return;
    }
    char jobdir[PATH_MAX];
    snprintf(jobdir, sizeof jobdir, "%s/%s", s->dir, p->job);
    int removed = ckpt_retain(jobdir, p->keep);
    double secs = util_now() - p->t0;
    char kept[160] = "";
    if (removed > 0)
        snprintf(kept, sizeof kept, "; removed %d older (keep %d)", removed, p->keep);
    else if (removed < 0)
        snprintf(kept, sizeof kept, "; could not remove older ones: %s", strerror(-removed));
    srv_log(s, "%s step %" PRId64 " from %s: %.1f MB in %.2f s (%.0f MB/s) -> %s%s", p->job, p->step, p->who,
            (double)p->bytes / 1e6, secs, secs > 0 ? (double)p->bytes / 1e6 / secs : 0.0, path, kept);
    reply(s, p->id, p->idlen, seq, 0, path);
}

/* "ADDR (key ABCDEFGH...)" of the connection a message came from, for log lines. */
static void who(zmq_msg_t *m, char *out, size_t n)
{
    const char *addr = zmq_msg_gets(m, "Peer-Address"), *key = zmq_msg_gets(m, "User-Id");
    snprintf(out, n, "%s (key %.8s...)", addr ? addr : "?", key ? key : "?");
}

/* A state for a connection; NULL when the table is full (the caller answers EBUSY). */
static peer_t *peer_new(srv_t *s, int slot, const void *id, size_t idlen, zmq_msg_t *hdr)
{
    peer_t *p;
    if (slot < 0 || idlen > sizeof p->id || !(p = calloc(1, sizeof *p)))
        return NULL;
    s->peers[slot] = p;
    memcpy(p->id, id, idlen);
    p->idlen = idlen;
    p->state = P_FAILED;
    p->last = util_now();
    who(hdr, p->who, sizeof p->who);
    return p;
}

/* begin: a second one while a checkpoint is open aborts both; else begin() answers. */
static void on_begin(srv_t *s, peer_t *p, const rmt_hdr_t *h, zmq_msg_t *payload)
{
    char err[1024], shown[CODEC_PRINTABLE];
    if (p->state == P_OPEN) {
        snprintf(err, sizeof err, "a second begin (job %s step %" PRIu64 ") while step %" PRId64
                 " of job %s was open: both aborted", codec_printable(h->job, h->job_len, shown), h->step, p->step,
                 p->job);
        peer_fail(s, p, EINVAL, err);
        reply(s, p->id, p->idlen, h->seq, EINVAL, err);
        return;
    }
    int rc = begin(s, p, h, payload, err, sizeof err);
    if (rc) {
        srv_log(s, "refused a checkpoint from %s: %s", p->who, err);
        reply(s, p->id, p->idlen, h->seq, -rc, err);
        peer_free(s, p);
        return;
    }
    reply(s, p->id, p->idlen, h->seq, 0, "");
}

/* data: written, or the checkpoint ends with the reason (answered once, at the first). */
static void on_data(srv_t *s, peer_t *p, const rmt_hdr_t *h, zmq_msg_t *payload)
{
    if (p->state != P_OPEN) {
        if (!p->reason[0]) { /* the first is answered; the rest, sent before that arrives, dropped */
            peer_fail(s, p, EINVAL, "data without a begin");
            reply(s, p->id, p->idlen, h->seq, EINVAL, p->reason);
        }
        return;
    }
    char err[1024];
    int rc;
    size_t n = zmq_msg_size(payload);
    if (n > RMT_FRAME_MAX)
        rc = util_fail(err, sizeof err, -EMSGSIZE, "a data frame of %zu bytes, at most %u accepted", n,
                       RMT_FRAME_MAX);
    else
        rc = ckw_write(p->w, h->file, h->offset, zmq_msg_data(payload), n, err, sizeof err);
    if (rc) {
        peer_fail(s, p, -rc, err);
        reply(s, p->id, p->idlen, h->seq, p->code, p->reason);
    } else {
        p->bytes += n;
    }
}

/* abort: the connection's checkpoint and state go, without an answer. */
static void on_abort(srv_t *s, peer_t *p)
{
    if (p && p->state == P_OPEN) {
        char line[1024];
        snprintf(line, sizeof line, "%s step %" PRId64 " from %s: aborted by the client", p->job, p->step, p->who);
        peer_free(s, p);
        srv_log(s, "%s", line); /* once its temporary directory is gone */
    } else if (p) {
        peer_free(s, p);
    }
}

/* A header that did not parse: answered, and the checkpoint in progress ends. */
static void on_bad(srv_t *s, peer_t *p, const void *id, size_t idlen, zmq_msg_t *hdr, uint64_t seq, int rc,
                   const char *err)
{
    char from[128];
    who(hdr, from, sizeof from);
    srv_log(s, "bad message from %s: %s", from, err);
    int code = rc == -EPROTO ? EPROTO : EINVAL;
    if (p && p->state == P_OPEN)
        peer_fail(s, p, code, err);
    reply(s, id, idlen, seq, code, err);
}

/* list: the job's complete checkpoints, "COUNT STEP..." (the newest RMT_LIST_MAX, newest first). */
static void on_list(srv_t *s, const void *id, size_t idlen, const rmt_hdr_t *h)
{
    char job[CKPT_FILE_MAX], err[PATH_MAX + 256], shown[CODEC_PRINTABLE], jobdir[PATH_MAX];
    struct stat st;
    if (h->job_len == 0 || h->job_len >= sizeof job || memchr(h->job, '\0', h->job_len)) {
        snprintf(err, sizeof err, "job name '%s' is not 1 to %d characters", codec_printable(h->job, h->job_len,
                 shown), CKPT_FILE_MAX - 1);
        reply(s, id, idlen, h->seq, EINVAL, err);
        return;
    }
    memcpy(job, h->job, h->job_len);
    job[h->job_len] = '\0';
    if (!ckpt_safe_name(job) || snprintf(jobdir, sizeof jobdir, "%s/%s", s->dir, job) >= (int)sizeof jobdir) {
        reply(s, id, idlen, h->seq, EINVAL, "not a plain job name");
        return;
    }
    if (lstat(jobdir, &st) == 0 && !S_ISDIR(st.st_mode)) { /* a link: nothing of ours is there */
        snprintf(err, sizeof err, "%s is not a real directory: the server keeps checkpoints only in real "
                 "directories inside its --dir", jobdir);
        reply(s, id, idlen, h->seq, EINVAL, err);
        return;
    }
    int64_t *steps = NULL;
    int n = ckpt_list(jobdir, &steps);
    if (n < 0) {
        snprintf(err, sizeof err, "%s: %s", jobdir, strerror(-n));
        reply(s, id, idlen, h->seq, -n, err);
        return;
    }
    char text[1024];
    size_t k = (size_t)snprintf(text, sizeof text, "%d", n);
    for (int i = n - 1; i >= 0 && i >= n - RMT_LIST_MAX && k < sizeof text; i--)
        k += (size_t)snprintf(text + k, sizeof text - k, " %" PRId64, steps[i]);
    free(steps);
    reply(s, id, idlen, h->seq, 0, text);
}

/* One message from a client: [routing id] header [payload]. Never fatal. */
static void serve_one(srv_t *s)
{
    zmq_msg_t f[3];
    int n;
    if (rmt_recv_frames(s->router, f, 3, &n, ZMQ_DONTWAIT) != 0 || n < 2) {
        rmt_close_frames(f, 3);
        return;
    }
    const void *id = zmq_msg_data(&f[0]);
    size_t idlen = zmq_msg_size(&f[0]);
    rmt_hdr_t h = {0};
    char err[1024];
    int slot = -1, rc = n > 3 ? util_fail(err, sizeof err, -EBADMSG, "%d frames, at most 2 expected", n - 1)
                              : rmt_hdr_decode(zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), n == 3, &h, err, sizeof err);
    peer_t *p = idlen <= sizeof p->id ? peer_find(s, id, idlen, &slot) : NULL;
    if (p) {
        p->last = util_now();
        p->seq = h.seq;
    }
    if (rc) { /* cannot tell what it was */
        on_bad(s, p, id, idlen, &f[1], h.seq, rc, err);
        goto out;
    }
    if (!p && (h.type == RMT_BEGIN || h.type == RMT_DATA)) {
        if (!(p = peer_new(s, slot, id, idlen, &f[1]))) {
            reply(s, id, idlen, h.seq, EBUSY, "too many clients at once");
            goto out;
        }
        p->seq = h.seq;
    }
    switch (h.type) {
    case RMT_BEGIN: on_begin(s, p, &h, &f[2]); break;
    case RMT_DATA: on_data(s, p, &h, &f[2]); break;
    case RMT_COMMIT:
        if (p && p->state == P_OPEN)
            commit(s, p, h.seq);
        else
            reply(s, id, idlen, h.seq, p ? p->code : EINVAL, p ? p->reason : "commit without a begin");
        if (p)
            peer_free(s, p);
        break;
    case RMT_ABORT: on_abort(s, p); break;
    case RMT_LIST: on_list(s, id, idlen, &h); break;
    default: /* a reply */
        snprintf(err, sizeof err, "a '%s' message sent to the server", rmt_type_name(h.type));
        if (p && p->state == P_OPEN)
            peer_fail(s, p, EINVAL, err);
        reply(s, id, idlen, h.seq, EINVAL, err);
        break;
    }
out:
    rmt_close_frames(f, 3);
}

/* Aborts checkpoints whose client went silent; forgets failed connections after as long. */
static void expire(srv_t *s)
{
    double now = util_now();
    for (int i = 0; i < RMT_MAX_PEERS; i++) {
        peer_t *p = s->peers[i];
        if (!p || (now - p->last) * 1000 < s->idle_ms)
            continue;
        if (p->state == P_OPEN) {
            char why[128];
            snprintf(why, sizeof why, "no message from the client for %.0f s", (now - p->last));
            peer_fail(s, p, ETIMEDOUT, why);
            reply(s, p->id, p->idlen, p->seq, p->code, p->reason); /* read at its next write, if it is there */
            p->last = now;
        } else {
            peer_free(s, p);
        }
    }
}

int rmt_serve_idle(const char *listen, const char *dir, const char *secret_key_path, const char *allow_path,
                   int idle_ms, volatile sig_atomic_t *stop, FILE *log, char *err, size_t errlen)
{
    srv_t s = {.dir = dir, .allow_path = allow_path, .log = log, .idle_ms = idle_ms > 0 ? idle_ms : 1};
    char sec[RMT_KEY_Z85 + 1], pub[RMT_KEY_Z85 + 1];
    int rc = rmt_secret_load(secret_key_path, sec, pub, err, errlen);
    if (rc)
        return rc;
    if (!(s.allowed = malloc(RMT_MAX_KEYS * sizeof *s.allowed)))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if ((rc = rmt_keys_load(allow_path, s.allowed, NULL, RMT_MAX_KEYS, true, &s.n_allowed, err, errlen)))
        goto out;
    struct stat st;
    if ((rc = util_mkdirs(dir)) || (rc = stat(dir, &st) ? -errno : 0) || (rc = S_ISDIR(st.st_mode) ? 0 : -ENOTDIR)) {
        rc = util_fail(err, errlen, rc, "%s: cannot use as the checkpoint directory: %s", dir, strerror(-rc));
        goto out;
    }
    if (!(s.ctx = zmq_ctx_new())) {
        rc = util_fail(err, errlen, -errno, "cannot create a ZeroMQ context: %s", zmq_strerror(errno));
        goto out;
    }
    /* The ZAP handler is bound before the ROUTER: without one libzmq lets any key in. */
    if (!(s.zap = zmq_socket(s.ctx, ZMQ_REP)) || rmt_set_int(s.zap, ZMQ_LINGER, 0) || zmq_bind(s.zap, ZAP_ENDPOINT)) {
        rc = util_fail(err, errlen, -errno, "cannot start the ZAP handler: %s", zmq_strerror(errno));
        goto out;
    }
    int64_t maxmsg = RMT_FRAME_MAX;
    if (!(s.router = zmq_socket(s.ctx, ZMQ_ROUTER)) || rmt_set_int(s.router, ZMQ_LINGER, 0) ||
        rmt_set_int(s.router, ZMQ_ROUTER_MANDATORY, 1) || rmt_set_int(s.router, ZMQ_RCVHWM, RMT_HWM) ||
        zmq_setsockopt(s.router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
        rmt_set_int(s.router, ZMQ_CURVE_SERVER, 1) || zmq_setsockopt(s.router, ZMQ_CURVE_SECRETKEY, sec, RMT_KEY_Z85) ||
        zmq_setsockopt(s.router, ZMQ_ZAP_DOMAIN, "ctitan", 6)) {
        rc = util_fail(err, errlen, -errno, "cannot set up the server socket: %s", zmq_strerror(errno));
        goto out;
    }
    if (zmq_bind(s.router, listen) != 0) {
        rc = util_fail(err, errlen, -errno, "cannot bind %s: %s", listen, zmq_strerror(errno));
        goto out;
    }
    char ep[512];
    size_t epn = sizeof ep;
    if (zmq_getsockopt(s.router, ZMQ_LAST_ENDPOINT, ep, &epn) != 0)
        snprintf(ep, sizeof ep, "%s", listen);
    srv_log(&s, "listening on %s", ep);
    srv_log(&s, "server key %s; %d client key%s from %s; writing under %s", pub, s.n_allowed,
            s.n_allowed == 1 ? "" : "s", allow_path, dir);
    while (!*stop) {
        zmq_pollitem_t it[2] = {{.socket = s.router, .events = ZMQ_POLLIN}, {.socket = s.zap, .events = ZMQ_POLLIN}};
        int k = zmq_poll(it, 2, RMT_POLL_MS);
        if (k < 0 && errno != EINTR) {
            rc = util_fail(err, errlen, -errno, "poll: %s", zmq_strerror(errno));
            break;
        }
        if (k > 0 && (it[1].revents & ZMQ_POLLIN))
            zap_serve(&s);
        /* a bounded batch, so that handshakes (ZAP) and the stop flag are never starved */
        for (int i = 0; k > 0 && i < 64 && !*stop; i++) {
            uint32_t ev = 0;
            size_t evn = sizeof ev;
            if (zmq_getsockopt(s.router, ZMQ_EVENTS, &ev, &evn) != 0 || !(ev & ZMQ_POLLIN))
                break;
            serve_one(&s);
        }
        expire(&s); /* after the queue is read, so a long commit never makes others look silent */
    }
    if (!rc && s.refused_repeats)
        srv_log(&s, "refused %d more connection%s from %s", s.refused_repeats, s.refused_repeats > 1 ? "s" : "",
                s.last_refused);
    for (int i = 0; i < RMT_MAX_PEERS; i++)
        if (s.peers[i]) {
            if (s.peers[i]->w)
                peer_fail(&s, s.peers[i], ECANCELED, "the server is stopping");
            peer_free(&s, s.peers[i]);
        }
    if (!rc)
        srv_log(&s, "stopped");
out:
    if (s.router)
        zmq_close(s.router);
    if (s.zap)
        zmq_close(s.zap);
    if (s.ctx)
        while (zmq_ctx_term(s.ctx) != 0 && errno == EINTR) {}
    free(s.allowed);
    memset(sec, 0, sizeof sec);
    return rc;
}

int rmt_serve(const char *listen, const char *dir, const char *secret_key_path, const char *allow_path,
              volatile sig_atomic_t *stop, FILE *log, char *err, size_t errlen)
{
    return rmt_serve_idle(listen, dir, secret_key_path, allow_path, RMT_IDLE_TIMEOUT_MS, stop, log, err, errlen);
}
