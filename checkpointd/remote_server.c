/* The storage host's side of remote checkpoints (see remote.h): `checkpointd --listen`'s loop,
 * its ZAP handler, and a state per connection. Clients (remote_client.c) stream checkpoints
 * in; each is written through checkpointd/writer.c, so it is as atomic as a local one.
 *
 * The server keeps a state per connection (ZeroMQ routing id): none -> open (begin accepted)
 * -> none (commit, abort); an error or the idle timeout of silence aborts the checkpoint
 * and leaves the connection failed (its error is the answer to its commit) until its next
 * begin or abort, or another idle period. A fetch is a state of its own: none -> fetching
 * (the step's files going out as parts, as fast as the client takes them) -> gone (the last
 * reply sent, or any other message from the client, or the idle timeout of a client that
 * takes nothing). Only authenticated clients get this far: the ZAP handler runs in the
 * server's poll loop and answers 400 to any key not in the allow file. */
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
#define RMT_FETCH_BURST 4         /* parts a fetch sends before the loop looks at the others */
#define RMT_FETCH_WAIT_MS 2       /* the poll's wait while a fetch waits for its client */
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

typedef enum { P_OPEN, P_FAILED, P_FETCH } pstate_t;

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
    /* fetching: file `file` (0 the index, K + 1 the index's data file K) goes out from `off`
     * of `size` bytes; buf holds a part read and not yet taken by the client's queue */
    char path[PATH_MAX];      /* the step's directory */
    uint64_t fetch_seq;       /* the fetch's, in every part */
    int n_files;
    ckpt_file_t *files;       /* the index's data files */
    uint32_t file;
    int fd;                   /* of file `file`, -1 before it is opened */
    uint64_t off, size;
    int any;                  /* a part of file `file` went out (an empty file has one) */
    uint8_t *buf;
    size_t buf_n;
    int buffered;             /* buf holds the next part */
    int ended;                /* every part went out, or it failed: the reply is what is left */
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
    int n_fetch;              /* peers fetching */
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
        char user[KEYS_Z85 + 1] = "", addr[CODEC_PRINTABLE] = "?", mech[CODEC_PRINTABLE] = "?";
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

/* What a fetch holds, given back; p is no longer fetching. */
static void fetch_end(srv_t *s, peer_t *p)
{
    if (p->state != P_FETCH)
        return;
    if (p->fd >= 0)
        close(p->fd);
    free(p->files);
    free(p->buf);
    p->files = NULL, p->buf = NULL, p->fd = -1;
    p->state = P_FAILED;
    p->reason[0] = '\0';
    p->code = 0;
    s->n_fetch--;
}

static void peer_free(srv_t *s, peer_t *p)
{
    fetch_end(s, p);
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

static int reply_send(srv_t *s, const void *id, size_t idlen, uint64_t seq, int code, const char *text)
{
    rmt_hdr_t h = {.type = RMT_REPLY, .seq = seq, .ok = code == 0, .code = (uint64_t)code, .text = text,
                   .text_len = strlen(text)};
    return rmt_send(s->router, id, idlen, &h, NULL, 0, ZMQ_DONTWAIT);
}

static void reply(srv_t *s, const void *id, size_t idlen, uint64_t seq, int code, const char *text)
{
    int rc = reply_send(s, id, idlen, seq, code, text);
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

/* DIR/job for a job name a client sent (h->job, into job): a plain name, and not a link or a
 * file where its directory would be (it may not exist). 0, or -EINVAL with why in err. */
static int job_dir(srv_t *s, const rmt_hdr_t *h, char job[CKPT_FILE_MAX], char *jobdir, size_t n, char *err,
                   size_t errlen)
{
    char shown[CODEC_PRINTABLE];
    struct stat st;
    if (h->job_len == 0 || h->job_len >= CKPT_FILE_MAX || memchr(h->job, '\0', h->job_len))
        return util_fail(err, errlen, -EINVAL, "job name '%s' is not 1 to %d characters",
                         codec_printable(h->job, h->job_len, shown), CKPT_FILE_MAX - 1);
    memcpy(job, h->job, h->job_len);
    job[h->job_len] = '\0';
    if (!ckpt_safe_name(job) || snprintf(jobdir, n, "%s/%s", s->dir, job) >= (int)n)
        return util_fail(err, errlen, -EINVAL, "not a plain job name");
    if (lstat(jobdir, &st) == 0 && !S_ISDIR(st.st_mode)) /* a link: nothing of ours is there */
        return util_fail(err, errlen, -EINVAL, "%s is not a real directory: the server keeps checkpoints only in "
                         "real directories inside its --dir", jobdir);
    return 0;
}

/* list: the job's complete checkpoints, "COUNT STEP..." (the newest RMT_LIST_MAX, newest first). */
static void on_list(srv_t *s, const void *id, size_t idlen, const rmt_hdr_t *h)
{
    char job[CKPT_FILE_MAX], err[PATH_MAX + 256], jobdir[PATH_MAX];
    if (job_dir(s, h, job, jobdir, sizeof jobdir, err, sizeof err)) {
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

/* fetch: p starts sending DIR/job/step-N, whose index and data files must all be there with
 * their sizes and headers (ckpt_check_files; -ENOENT: no such step, -EBADMSG: damaged here).
 * The chunks' checksums are the loader's to check. */
static int fetch_begin(srv_t *s, peer_t *p, const rmt_hdr_t *h, char *err, size_t errlen)
{
    char jobdir[PATH_MAX], why[1024];
    int rc = job_dir(s, h, p->job, jobdir, sizeof jobdir, err, errlen), bad = 0;
    if (rc)
        return rc;
    if (h->step > CKPT_STEP_MAX)
        return util_fail(err, errlen, -EINVAL, "step %" PRIu64 " is past the last step a run can have", h->step);
    p->step = (int64_t)h->step;
    ckpt_step_path(p->path, sizeof p->path, jobdir, p->step);
    char *lines = NULL;
    size_t n = 0;
    FILE *report = open_memstream(&lines, &n); /* the problems, one a line: the first is the answer */
    rc = ckpt_check_files(p->path, report, &bad, why, sizeof why);
    if (report)
        fclose(report);
    if (rc && lines && lines[0])
        snprintf(why, sizeof why, "%.*s", (int)strcspn(lines, "\n"), lines);
    free(lines);
    if (rc == -ENOENT)
        return util_fail(err, errlen, -ENOENT, "job %s has no complete checkpoint of step %" PRId64 " here (%s)",
                         p->job, p->step, why);
    if (rc)
        return util_fail(err, errlen, rc, "%s", why);
    ckpt_t *ck;
    if ((rc = ckpt_open(&ck, p->path, err, errlen)))
        return rc;
    const ckpt_index_t *ix = ckpt_index(ck);
    p->n_files = ix->n_files;
    p->files = malloc((size_t)(ix->n_files ? ix->n_files : 1) * sizeof *p->files);
    p->buf = malloc(RMT_DATA_FRAME);
    if (p->files)
        memcpy(p->files, ix->files, (size_t)ix->n_files * sizeof *p->files);
    ckpt_close(&ck);
    p->state = P_FETCH; /* fetch_end gives back what it holds from here on */
    p->fd = -1;
    s->n_fetch++;
    if (!p->files || !p->buf)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    p->fetch_seq = h->seq;
    p->code = 0;
    p->reason[0] = '\0';
    p->file = 0;
    p->off = p->size = 0;
    p->any = p->buffered = p->ended = 0;
    p->bytes = 0;
    p->t0 = util_now();
    return 0;
}

/* The fetch's next part into p->buf (p->ended when none is left). 0, or -errno with why. */
static int fetch_read(peer_t *p, char *err, size_t errlen)
{
    for (;;) {
        if (p->fd < 0) {
            if ((int64_t)p->file > p->n_files) {
                p->ended = 1;
                return 0;
            }
            const char *name = p->file ? p->files[p->file - 1].name : "index";
            char path[PATH_MAX + CKPT_FILE_MAX];
            struct stat st;
            snprintf(path, sizeof path, "%s/%s", p->path, name);
            if ((p->fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0 || fstat(p->fd, &st))
                return util_fail(err, errlen, errno == ENOENT ? -EBADMSG : -errno, "%s: %s", path, strerror(errno));
            p->size = p->file ? p->files[p->file - 1].bytes : (uint64_t)st.st_size;
            p->off = 0;
            p->any = 0;
        }
        if (p->off == p->size && p->any) {
            close(p->fd);
            p->fd = -1;
            p->file++;
            continue;
        }
        size_t want = p->size - p->off < RMT_DATA_FRAME ? (size_t)(p->size - p->off) : RMT_DATA_FRAME;
        size_t got = 0;
        while (got < want) {
            ssize_t r = pread(p->fd, p->buf + got, want - got, (off_t)(p->off + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                const char *name = p->file ? p->files[p->file - 1].name : "index";
                return r < 0 ? util_fail(err, errlen, -errno, "%s/%s: %s", p->path, name, strerror(errno))
                             : util_fail(err, errlen, -EBADMSG, "%s/%s is cut short: %" PRIu64 " of its %" PRIu64
                                         " bytes", p->path, name, p->off + got, p->size);
            }
            got += (size_t)r;
        }
        p->buf_n = want;
        p->buffered = 1;
        return 0;
    }
}

/* Sends p's next parts until the client's queue is full, a burst went out or the fetch is
 * over (its last reply sent: p is freed). Returns the parts sent. */
static int fetch_pump(srv_t *s, peer_t *p)
{
    char err[1024];
    int sent = 0, rc;
    while (sent < RMT_FETCH_BURST) {
        if (!p->ended && !p->buffered && (rc = fetch_read(p, err, sizeof err))) {
            p->ended = 1;
            p->code = -rc;
            snprintf(p->reason, sizeof p->reason, "step %" PRId64 " of job %s: %s", p->step, p->job, err);
        }
        if (p->ended) {
            const char *text = p->code ? p->reason : p->path;
            if ((rc = reply_send(s, p->id, p->idlen, p->fetch_seq, p->code, text)) == -EAGAIN)
                return sent;
            double secs = util_now() - p->t0;
            if (p->code)
                srv_log(s, "%s step %" PRId64 " to %s: fetch failed: %s", p->job, p->step, p->who, p->reason);
            else
                srv_log(s, "%s step %" PRId64 " to %s: fetched, %.1f MB in %.2f s (%.0f MB/s)%s", p->job, p->step,
                        p->who, (double)p->bytes / 1e6, secs, secs > 0 ? (double)p->bytes / 1e6 / secs : 0.0,
                        rc ? " (the client went away before the last answer)" : "");
            peer_free(s, p);
            return sent + 1;
        }
        rmt_hdr_t h = {.type = RMT_PART, .seq = p->fetch_seq, .file = p->file, .offset = p->off, .size = p->size};
        rc = rmt_send(s->router, p->id, p->idlen, &h, p->buf, p->buf_n, ZMQ_DONTWAIT);
        if (rc == -EAGAIN)
            return sent;
        if (rc) {
            srv_log(s, "%s step %" PRId64 " to %s: fetch ended: %s", p->job, p->step, p->who,
                    rc == -EHOSTUNREACH ? "the client went away" : zmq_strerror(-rc));
            peer_free(s, p);
            return sent;
        }
        p->off += p->buf_n;
        p->bytes += p->buf_n;
        p->any = 1;
        p->buffered = 0;
        p->last = util_now();
        sent++;
    }
    return sent;
}

/* Every fetch a burst further; whether any part or reply went out. */
static int fetch_pump_all(srv_t *s)
{
    int sent = 0;
    for (int i = 0; i < RMT_MAX_PEERS && s->n_fetch; i++)
        if (s->peers[i] && s->peers[i]->state == P_FETCH)
            sent += fetch_pump(s, s->peers[i]);
    return sent > 0;
}

/* fetch: refused at once (an upload open on this connection ends too), or its parts start. */
static void on_fetch(srv_t *s, peer_t *p, const rmt_hdr_t *h)
{
    char err[PATH_MAX + 1280];
    int rc;
    if (p->state == P_OPEN) {
        snprintf(err, sizeof err, "a fetch while step %" PRId64 " of job %s was being received: that upload is "
                 "aborted", p->step, p->job);
        peer_fail(s, p, EINVAL, err);
        reply(s, p->id, p->idlen, h->seq, EINVAL, err);
        return;
    }
    if ((rc = fetch_begin(s, p, h, err, sizeof err))) {
        srv_log(s, "refused a fetch from %s: %s", p->who, err);
        reply(s, p->id, p->idlen, h->seq, -rc, err);
        peer_free(s, p);
        return;
    }
    fetch_pump(s, p);
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
        fetch_end(s, p); /* whatever it sent, a client that fetched has moved on */
    }
    if (rc) { /* cannot tell what it was */
        on_bad(s, p, id, idlen, &f[1], h.seq, rc, err);
        goto out;
    }
    if (!p && (h.type == RMT_BEGIN || h.type == RMT_DATA || h.type == RMT_FETCH)) {
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
    case RMT_FETCH: on_fetch(s, p, &h); break;
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
        if (p->state == P_FETCH) {
            srv_log(s, "%s step %" PRId64 " to %s: fetch ended: the client took nothing for %.0f s", p->job, p->step,
                    p->who, now - p->last);
            peer_free(s, p);
        } else if (p->state == P_OPEN) {
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
    keys_pair_t me;
    int rc = keys_load_secret(secret_key_path, &me, err, errlen);
    if (rc)
        return rc;
    if (!(s.allowed = malloc(RMT_MAX_KEYS * sizeof *s.allowed)))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if ((rc = keys_load(allow_path, s.allowed, NULL, RMT_MAX_KEYS, true, &s.n_allowed, err, errlen)))
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
        rmt_set_int(s.router, ZMQ_SNDHWM, RMT_HWM) ||
        zmq_setsockopt(s.router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
        rmt_set_int(s.router, ZMQ_CURVE_SERVER, 1) || zmq_setsockopt(s.router, ZMQ_CURVE_SECRETKEY, me.sec, KEYS_Z85) ||
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
    srv_log(&s, "server key %s; %d client key%s from %s; writing under %s", me.pub, s.n_allowed,
            s.n_allowed == 1 ? "" : "s", allow_path, dir);
    int sent = 0;
    while (!*stop) {
        zmq_pollitem_t it[2] = {{.socket = s.router, .events = ZMQ_POLLIN}, {.socket = s.zap, .events = ZMQ_POLLIN}};
        /* a fetch whose client's queue is full is tried again after a short wait */
        int k = zmq_poll(it, 2, !s.n_fetch ? RMT_POLL_MS : sent ? 0 : RMT_FETCH_WAIT_MS);
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
        sent = fetch_pump_all(&s);
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
    memset(me.sec, 0, sizeof me.sec);
    return rc;
}

int rmt_serve(const char *listen, const char *dir, const char *secret_key_path, const char *allow_path,
              volatile sig_atomic_t *stop, FILE *log, char *err, size_t errlen)
{
    return rmt_serve_idle(listen, dir, secret_key_path, allow_path, RMT_IDLE_TIMEOUT_MS, stop, log, err, errlen);
}
