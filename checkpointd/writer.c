/* Durable, atomic checkpoint directories through io_uring (see writer.h).
 *
 * Data goes through UW_NBUF registered buffers of UW_BUF bytes (4 KiB-aligned): the caller's
 * bytes are copied into the current buffer, a full buffer is submitted as one write at its
 * file offset, and up to UW_NBUF writes are in flight while the next buffer fills. Short
 * writes are resubmitted for the rest; a filesystem that refuses O_DIRECT (at open, or with
 * EINVAL on a write) gets the same file buffered. The last partial buffer is padded to
 * 4 KiB under O_DIRECT and the file truncated back to its size. */
#include "checkpointd/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tools/util.h"

#define UW_NBUF 8
#define UW_BUF (4u << 20)
#define UW_ALIGN 4096

typedef struct {
    struct io_uring ring;
    int ring_ok, fixed;
    uint8_t *mem;                  /* UW_NBUF * UW_BUF, aligned */
    int busy[UW_NBUF];             /* in flight */
    uint64_t off[UW_NBUF];         /* file offset of the write in flight */
    uint32_t len[UW_NBUF], done[UW_NBUF];
    int inflight;
    int cur;                       /* buffer being filled */
    uint32_t fill;
    int fd, direct, all_direct;
    uint64_t pos;                  /* bytes appended to the file so far */
    uint64_t buf_off;              /* file offset of the current buffer */
    char name[PATH_MAX];           /* for messages */
} uw_t;

static int uw_init(uw_t *u, char *err, size_t errlen)
{
    memset(u, 0, sizeof(*u));
    u->fd = -1;
    u->all_direct = 1;
    if (posix_memalign((void **)&u->mem, UW_ALIGN, (size_t)UW_NBUF * UW_BUF))
        return util_fail(err, errlen, -ENOMEM, "cannot allocate %u MiB of write buffers", UW_NBUF * UW_BUF >> 20);
    memset(u->mem, 0, (size_t)UW_NBUF * UW_BUF); /* touch: no page faults on the write path */
    int rc = io_uring_queue_init(UW_NBUF * 2, &u->ring, 0);
    if (rc < 0) {
        free(u->mem);
        u->mem = NULL;
        return util_fail(err, errlen, rc, "io_uring_queue_init: %s", strerror(-rc));
    }
    u->ring_ok = 1;
    struct iovec iov[UW_NBUF];
    for (int b = 0; b < UW_NBUF; b++)
        iov[b] = (struct iovec){u->mem + (size_t)b * UW_BUF, UW_BUF};
    /* registered buffers are pinned once instead of per write; without them (RLIMIT_MEMLOCK)
     * plain writes do the same job */
    u->fixed = io_uring_register_buffers(&u->ring, iov, UW_NBUF) == 0;
    return 0;
}

static void uw_free(uw_t *u)
{
    if (u->fd >= 0)
        close(u->fd);
    if (u->ring_ok)
        io_uring_queue_exit(&u->ring);
    free(u->mem);
    memset(u, 0, sizeof(*u));
    u->fd = -1;
}

static void submit_write(uw_t *u, int b)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring); /* never NULL: 2x UW_NBUF entries */
    uint8_t *p = u->mem + (size_t)b * UW_BUF + u->done[b];
    uint32_t n = u->len[b] - u->done[b];
    if (u->fixed)
        io_uring_prep_write_fixed(sqe, u->fd, p, n, u->off[b] + u->done[b], b);
    else
        io_uring_prep_write(sqe, u->fd, p, n, u->off[b] + u->done[b]);
    io_uring_sqe_set_data64(sqe, (uint64_t)b);
    io_uring_submit(&u->ring);
}

/* Waits for one completion; resubmits short writes. */
static int reap_one(uw_t *u, char *err, size_t errlen)
{
    struct io_uring_cqe *cqe;
    int rc;
    do
        rc = io_uring_wait_cqe(&u->ring, &cqe);
    while (rc == -EINTR);
    if (rc < 0)
        return util_fail(err, errlen, rc, "%s: io_uring wait: %s", u->name, strerror(-rc));
    int b = (int)io_uring_cqe_get_data64(cqe), res = cqe->res;
    io_uring_cqe_seen(&u->ring, cqe);
    if (res == -EINVAL && u->direct) {
        /* the filesystem takes O_DIRECT at open but not for this write: go buffered */
        fcntl(u->fd, F_SETFL, fcntl(u->fd, F_GETFL) & ~O_DIRECT);
        u->direct = u->all_direct = 0;
        submit_write(u, b);
        return 0;
    }
    if (res == -EINTR || res == -EAGAIN) {
        submit_write(u, b);
        return 0;
    }
    if (res < 0)
        return util_fail(err, errlen, res, "%s: write at %" PRIu64 ": %s", u->name, u->off[b] + u->done[b],
                         strerror(-res));
    if (res == 0)
        return util_fail(err, errlen, -EIO, "%s: write at %" PRIu64 " wrote nothing", u->name, u->off[b] + u->done[b]);
    u->done[b] += (uint32_t)res;
    if (u->done[b] < u->len[b]) { /* short write: the rest, unaligned ones buffered */
        if (u->direct && (u->done[b] % UW_ALIGN)) {
            fcntl(u->fd, F_SETFL, fcntl(u->fd, F_GETFL) & ~O_DIRECT);
            u->direct = u->all_direct = 0;
        }
        submit_write(u, b);
        return 0;
    }
    u->busy[b] = 0;
    u->inflight--;
    return 0;
}

static int uw_open(uw_t *u, int dirfd, const char *name, const char *shown, char *err, size_t errlen)
{
    snprintf(u->name, sizeof(u->name), "%s", shown);
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    u->fd = openat(dirfd, name, flags | O_DIRECT, 0644);
    u->direct = u->fd >= 0;
    if (u->fd < 0 && errno == EINVAL)
        u->fd = openat(dirfd, name, flags, 0644);
    if (u->fd < 0)
        return util_fail(err, errlen, -errno, "%s: cannot create: %s", shown, strerror(errno));
    if (!u->direct)
        u->all_direct = 0;
    u->pos = u->buf_off = 0;
    u->fill = 0;
    return 0;
}

/* Submits the current buffer (len bytes) and moves to a free one. */
static int flush_buf(uw_t *u, uint32_t len, char *err, size_t errlen)
{
    int b = u->cur;
    u->off[b] = u->buf_off;
    u->len[b] = len;
    u->done[b] = 0;
    u->busy[b] = 1;
    u->inflight++;
    submit_write(u, b);
    u->buf_off += u->fill;
    u->fill = 0;
    u->cur = (u->cur + 1) % UW_NBUF;
    while (u->busy[u->cur]) {
        int rc = reap_one(u, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

static int uw_append(uw_t *u, const void *data, size_t n, char *err, size_t errlen)
{
    const uint8_t *p = data;
    while (n) {
        uint32_t k = UW_BUF - u->fill < n ? UW_BUF - u->fill : (uint32_t)n;
        if (p)
            memcpy(u->mem + (size_t)u->cur * UW_BUF + u->fill, p, k);
        u->fill += k;
        u->pos += k;
        n -= k;
        if (p)
            p += k;
        if (u->fill == UW_BUF) {
            int rc = flush_buf(u, UW_BUF, err, errlen);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Writes what is left, waits for everything, syncs and closes the file. */
static int uw_finish(uw_t *u, char *err, size_t errlen)
{
    int rc = 0;
    uint64_t size = u->pos;
    if (u->fill) {
        uint32_t len = u->fill;
        if (u->direct) { /* O_DIRECT writes whole blocks: pad, truncate afterwards */
            uint32_t padded = (len + UW_ALIGN - 1) / UW_ALIGN * UW_ALIGN;
            memset(u->mem + (size_t)u->cur * UW_BUF + len, 0, padded - len);
            len = padded;
        }
        rc = flush_buf(u, len, err, errlen);
    }
    while (!rc && u->inflight)
        rc = reap_one(u, err, errlen);
    while (rc && u->inflight) { /* on an error still collect what is in flight */
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&u->ring, &cqe) < 0)
            break;
        io_uring_cqe_seen(&u->ring, cqe);
        u->inflight--;
    }
    memset(u->busy, 0, sizeof(u->busy));
    u->inflight = 0;
    if (!rc && ftruncate(u->fd, (off_t)size) < 0)
        rc = util_fail(err, errlen, -errno, "%s: truncate: %s", u->name, strerror(errno));
    if (!rc && fsync(u->fd) < 0)
        rc = util_fail(err, errlen, -errno, "%s: fsync: %s", u->name, strerror(errno));
    if (close(u->fd) < 0 && !rc)
        rc = util_fail(err, errlen, -errno, "%s: close: %s", u->name, strerror(errno));
    u->fd = -1;
    return rc;
}

/* One writer (ring, registered buffers) is kept for the next checkpoint: setting one up
 * costs page faults on 32 MiB and pinning them, tens of ms of CPU that would be taken from
 * training at every checkpoint. Daemons write one checkpoint at a time, so one is enough
 * (ckw_* is not meant for concurrent use from several threads). */
static uw_t *spare;

static int uw_get(uw_t **out, char *err, size_t errlen)
{
    if (spare) {
        *out = spare;
        spare = NULL;
        return 0;
    }
    uw_t *u = malloc(sizeof(*u));
    if (!u)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    int rc = uw_init(u, err, errlen);
    if (rc) {
        free(u);
        return rc;
    }
    *out = u;
    return 0;
}

static void uw_put(uw_t *u)
{
    if (!u)
        return;
    if (u->fd >= 0 || u->inflight || spare) { /* not reusable as it is, or one is kept already */
        uw_free(u);
        free(u);
        return;
    }
    u->all_direct = 1;
    u->fill = 0;
    u->cur = 0;
    spare = u;
}

/* ---- checkpoint directories ---- */

struct ckw {
    char dir[PATH_MAX], tmp[PATH_MAX + 64], final[PATH_MAX + 32];
    int tmpfd;
    ckpt_index_t plan;
    uw_t *uw;
    int file;            /* data file being written, -1 before the first */
    double t0;
    uint64_t bytes;
};

static void ckw_free(ckw_t *w)
{
    uw_put(w->uw);
    if (w->tmpfd >= 0)
        close(w->tmpfd);
    ckpt_index_free(&w->plan);
    free(w);
}

int ckw_begin(ckw_t **out, const char *dir, const ckpt_index_t *plan, char *err, size_t errlen)
{
    *out = NULL;
    ckw_t *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->tmpfd = -1;
    w->file = -1;
    w->t0 = util_now();
    snprintf(w->dir, sizeof(w->dir), "%s", dir);
    int rc;
    uint8_t *enc = NULL;
    size_t enc_len;
    /* a deep copy of the plan that is also a check of it */
    if ((rc = ckpt_index_encode(plan, &enc, &enc_len)) == 0)
        rc = ckpt_index_decode(enc, enc_len, &w->plan, "checkpoint plan", err, errlen);
    free(enc);
    if (rc) {
        free(w);
        return rc == -ENOMEM ? util_fail(err, errlen, rc, "out of memory") : rc;
    }
    if ((rc = util_mkdirs(dir))) {
        util_fail(err, errlen, rc, "%s: cannot create: %s", dir, strerror(-rc));
        goto out;
    }
    snprintf(w->tmp, sizeof(w->tmp), "%s/.tmp-step-%08" PRId64 ".%d", dir, plan->step, (int)getpid());
    ckpt_step_path(w->final, sizeof(w->final), dir, plan->step);
    ckpt_remove_dir(w->tmp); /* ours from an attempt that failed */
    if (mkdir(w->tmp, 0755) < 0) {
        rc = util_fail(err, errlen, -errno, "%s: cannot create: %s", w->tmp, strerror(errno));
        goto out;
    }
    if ((w->tmpfd = open(w->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        rc = util_fail(err, errlen, -errno, "%s: %s", w->tmp, strerror(errno));
        goto out;
    }
    if ((rc = uw_get(&w->uw, err, errlen)))
        goto out;
    *out = w;
    return 0;
out:
    ckpt_remove_dir(w->tmp);
    ckw_free(w);
    return rc;
}

int ckw_write(ckw_t *w, uint32_t file, uint64_t offset, const void *data, size_t n, char *err, size_t errlen)
{
    int rc;
    if ((int)file != w->file) {
        if ((int)file != w->file + 1 || file >= (uint32_t)w->plan.n_files)
            return util_fail(err, errlen, -EINVAL, "data for file %u after file %d: files come in order", file,
                             w->file);
        if (w->file >= 0) {
            const ckpt_file_t *f = &w->plan.files[w->file];
            if (w->uw->pos != f->bytes)
                return util_fail(err, errlen, -EINVAL, "%s: %" PRIu64 " bytes sent, the plan says %" PRIu64, f->name,
                                 w->uw->pos, f->bytes);
            if ((rc = uw_finish(w->uw, err, errlen)))
                return rc;
        }
        w->file = (int)file;
        char shown[PATH_MAX + 128];
        snprintf(shown, sizeof(shown), "%s/%s", w->tmp, w->plan.files[file].name);
        if ((rc = uw_open(w->uw, w->tmpfd, w->plan.files[file].name, shown, err, errlen)))
            return rc;
    }
    const ckpt_file_t *f = &w->plan.files[file];
    if (offset != w->uw->pos || n > f->bytes - w->uw->pos)
        return util_fail(err, errlen, -EINVAL, "%s: %zu bytes at offset %" PRIu64 ": expected offset %" PRIu64
                         " and at most %" PRIu64 " bytes", f->name, n, offset, w->uw->pos, f->bytes - w->uw->pos);
    w->bytes += n;
    return uw_append(w->uw, data, n, err, errlen);
}

void ckw_abort(ckw_t **pw)
{
    ckw_t *w = *pw;
    if (!w)
        return;
    if (w->uw && w->uw->fd >= 0) {
        char e[8];
        uw_finish(w->uw, e, 0);
    }
    ckpt_remove_dir(w->tmp);
    ckw_free(w);
    *pw = NULL;
}

static int write_index(ckw_t *w, char *err, size_t errlen)
{
    uint8_t *buf;
    size_t len;
    int rc = ckpt_index_encode(&w->plan, &buf, &len);
    if (rc)
        return util_fail(err, errlen, rc, "out of memory");
    int fd = openat(w->tmpfd, "index", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    rc = fd < 0 ? -errno : util_write_all(fd, buf, len);
    if (!rc && fsync(fd) < 0)
        rc = -errno;
    if (fd >= 0 && close(fd) < 0 && !rc)
        rc = -errno;
    free(buf);
    return rc ? util_fail(err, errlen, rc, "%s/index: %s", w->tmp, strerror(-rc)) : 0;
}

int ckw_commit(ckw_t **pw, char *path, size_t pathlen, ckw_stats_t *st, char *err, size_t errlen)
{
    ckw_t *w = *pw;
    *pw = NULL;
    int rc = 0;
    /* every file, in order, to its size */
    if (w->file != w->plan.n_files - 1)
        rc = util_fail(err, errlen, -EINVAL, "%s: no data was sent for it",
                       w->plan.files[w->file + 1].name);
    else if (w->uw->pos != w->plan.files[w->file].bytes)
        rc = util_fail(err, errlen, -EINVAL, "%s: %" PRIu64 " bytes sent, the plan says %" PRIu64,
                       w->plan.files[w->file].name, w->uw->pos, w->plan.files[w->file].bytes);
    if (!rc)
        rc = uw_finish(w->uw, err, errlen);
    if (!rc)
        rc = write_index(w, err, errlen);
    if (!rc && fsync(w->tmpfd) < 0)
        rc = util_fail(err, errlen, -errno, "%s: fsync: %s", w->tmp, strerror(errno));
    if (!rc) {
        struct stat sb;
        if (stat(w->final, &sb) == 0) {
            /* replaced atomically; the old one ends up under the temporary name */
            if (renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->final, RENAME_EXCHANGE) < 0)
                rc = util_fail(err, errlen, -errno, "%s: cannot replace: %s", w->final, strerror(errno));
        } else if (rename(w->tmp, w->final) < 0) {
            rc = util_fail(err, errlen, -errno, "%s -> %s: %s", w->tmp, w->final, strerror(errno));
        }
    }
    if (!rc && (rc = util_fsync_dir(w->dir)))
        util_fail(err, errlen, rc, "%s: fsync: %s", w->dir, strerror(-rc));
    if (st)
        *st = (ckw_stats_t){.direct = w->uw->all_direct, .fixed = w->uw->fixed, .bytes = w->bytes,
                            .secs = util_now() - w->t0};
    if (!rc && path)
        snprintf(path, pathlen, "%s", w->final);
    ckpt_remove_dir(w->tmp); /* on failure the partial one; after an exchange the old one */
    ckw_free(w);
    return rc;
}

int ckw_raw_write(const char *path, uint64_t bytes, double *secs, int *direct, char *err, size_t errlen)
{
    uw_t u;
    int rc = uw_init(&u, err, errlen);
    if (rc)
        return rc;
    /* incompressible bytes, like a checkpoint's: storage may treat zeros specially */
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < (size_t)UW_NBUF * UW_BUF / 8; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ((uint64_t *)u.mem)[i] = x;
    }
    double t0 = util_now();
    if (!(rc = uw_open(&u, AT_FDCWD, path, path, err, errlen))) {
        rc = uw_append(&u, NULL, bytes, err, errlen); /* the buffers as they are: no copy */
        int rc2 = uw_finish(&u, err, errlen);
        rc = rc ? rc : rc2;
    }
    *secs = util_now() - t0;
    *direct = u.all_direct;
    uw_free(&u);
    return rc;
}
