/* The io_uring streaming writer under checkpointd/writer.h (see uring.h).
 *
 * Data goes through UW_NBUF registered buffers of UW_BUF bytes (4 KiB-aligned): the caller's
 * bytes are copied into the current buffer, a full buffer is submitted as one write at its
 * file offset, and up to UW_NBUF writes are in flight while the next buffer fills, across file
 * boundaries (a finished file is not waited for; its last partial buffer is padded to 4 KiB
 * under O_DIRECT and the file truncated back to its size at the end). At commit every file
 * gets its fsync at once, so the journal commits and device flushes are shared. Short writes
 * are resubmitted for the rest; a filesystem that refuses O_DIRECT (at open, or with EINVAL on
 * a write) gets the same file buffered. */
#include "checkpointd/uring.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ipc/util.h"

#define UW_NBUF 8
#define UW_BUF (4u << 20)
#define UW_ALIGN 4096
#define UW_MAX_OPEN 16 /* finished files kept open (unsynced) before they are synced early */
#define UW_HUGE (2u << 20)
#define UW_MAP ((size_t)UW_NBUF * UW_BUF + UW_HUGE)

typedef struct {
    int fd, direct, padded;
    uint64_t size;
    char name[PATH_MAX + 128];     /* for messages */
} uwf_t;

struct uw {
    struct io_uring ring;
    int ring_ok, fixed;
    uint8_t *mem;                  /* UW_NBUF * UW_BUF, 2 MiB-aligned, in base */
    void *base;                    /* the mapping: UW_MAP bytes */
    int busy[UW_NBUF];             /* in flight */
    int file[UW_NBUF];             /* index into files of the write in flight */
    uint64_t off[UW_NBUF];         /* its file offset */
    uint32_t len[UW_NBUF], done[UW_NBUF];
    int inflight;
    int cur;                       /* buffer being filled */
    uint32_t fill;
    uint64_t pos;                  /* bytes appended to the current file */
    uint64_t buf_off;              /* file offset of the current buffer */
    uwf_t files[UW_MAX_OPEN];      /* files[nf - 1] is the current one while open */
    int nf, open;                  /* open: the current file takes appends */
    int all_direct;
    pid_t owner;                   /* a forked child must not use its parent's ring */
};

static int init(uw_t *u, char *err, size_t errlen)
{
    memset(u, 0, sizeof(*u));
    u->all_direct = 1;
    u->owner = getpid();
    /* Huge pages where the kernel has them: a 4 MiB write is then 2 physically contiguous
     * segments instead of up to 1024 scattered pages, which the block layer would split into
     * several requests (measured: writes from fragmented 4 KiB pages ran ~3x slower on a
     * virtio disk). */
    u->base = mmap(NULL, UW_MAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (u->base == MAP_FAILED) {
        u->base = NULL;
        return util_fail(err, errlen, -ENOMEM, "cannot map %u MiB of write buffers", UW_NBUF * UW_BUF >> 20);
    }
    u->mem = (uint8_t *)(((uintptr_t)u->base + UW_HUGE - 1) / UW_HUGE * UW_HUGE);
    madvise(u->mem, (size_t)UW_NBUF * UW_BUF, MADV_HUGEPAGE); /* a hint: 4 KiB pages work too */
    memset(u->mem, 0, (size_t)UW_NBUF * UW_BUF); /* touch: no page faults on the write path */
    int rc = io_uring_queue_init(UW_NBUF * 2 + UW_MAX_OPEN, &u->ring, 0);
    if (rc < 0) {
        munmap(u->base, UW_MAP);
        u->base = u->mem = NULL;
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

static void close_files(uw_t *u)
{
    for (int i = 0; i < u->nf; i++)
        if (u->files[i].fd >= 0)
            close(u->files[i].fd);
    u->nf = u->open = 0;
}

static void uw_free_bufs(uw_t *u)
{
    close_files(u);
    if (u->ring_ok)
        io_uring_queue_exit(&u->ring);
    if (u->base)
        munmap(u->base, UW_MAP);
    memset(u, 0, sizeof(*u));
}

static void submit_write(uw_t *u, int b)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring); /* never NULL: more entries than buffers */
    uint8_t *p = u->mem + (size_t)b * UW_BUF + u->done[b];
    uint32_t n = u->len[b] - u->done[b];
    int fd = u->files[u->file[b]].fd;
    if (u->fixed)
        io_uring_prep_write_fixed(sqe, fd, p, n, u->off[b] + u->done[b], b);
    else
        io_uring_prep_write(sqe, fd, p, n, u->off[b] + u->done[b]);
    io_uring_sqe_set_data64(sqe, (uint64_t)b);
    io_uring_submit(&u->ring);
}

static void go_buffered(uw_t *u, uwf_t *f)
{
    fcntl(f->fd, F_SETFL, fcntl(f->fd, F_GETFL) & ~O_DIRECT);
    f->direct = u->all_direct = 0;
}

/* Waits for one write completion; resubmits short writes. */
static int reap_one(uw_t *u, char *err, size_t errlen)
{
    struct io_uring_cqe *cqe;
    int rc;
    do
        rc = io_uring_wait_cqe(&u->ring, &cqe);
    while (rc == -EINTR);
    if (rc < 0)
        return util_fail(err, errlen, rc, "io_uring wait: %s", strerror(-rc));
    int b = (int)io_uring_cqe_get_data64(cqe), res = cqe->res;
    io_uring_cqe_seen(&u->ring, cqe);
    uwf_t *f = &u->files[u->file[b]];
    if (res == -EINVAL && f->direct) {
        /* the filesystem takes O_DIRECT at open but not for this write: go buffered */
        go_buffered(u, f);
        submit_write(u, b);
        return 0;
    }
    if (res == -EINTR || res == -EAGAIN) {
        submit_write(u, b);
        return 0;
    }
    u->busy[b] = 0; /* from here on the write is over, for better or worse */
    u->inflight--;
    if (res < 0)
        return util_fail(err, errlen, res, "%s: write at %" PRIu64 ": %s", f->name, u->off[b] + u->done[b],
                         strerror(-res));
    if (res == 0)
        return util_fail(err, errlen, -EIO, "%s: write at %" PRIu64 " wrote nothing", f->name, u->off[b] + u->done[b]);
    u->done[b] += (uint32_t)res;
    if (u->done[b] < u->len[b]) { /* short write: the rest, unaligned ones buffered */
        if (f->direct && (u->done[b] % UW_ALIGN))
            go_buffered(u, f);
        u->busy[b] = 1;
        u->inflight++;
        submit_write(u, b);
    }
    return 0;
}

/* Collects every write in flight; the first error wins. */
static int drain(uw_t *u, char *err, size_t errlen)
{
    int rc = 0;
    while (u->inflight) {
        int r = reap_one(u, rc ? NULL : err, rc ? 0 : errlen);
        rc = rc ? rc : r;
    }
    return rc;
}

/* Syncs, truncates and closes every finished file, all fsyncs in flight at once. */
int uw_sync(uw_t *u, char *err, size_t errlen)
{
    int rc = drain(u, err, errlen), last = u->open ? u->nf - 1 : u->nf;
    int queued = 0;
    for (int i = 0; i < last && !rc; i++) {
        uwf_t *f = &u->files[i];
        if (f->padded && ftruncate(f->fd, (off_t)f->size) < 0)
            rc = util_fail(err, errlen, -errno, "%s: truncate: %s", f->name, strerror(errno));
        struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
        if (!rc && sqe) {
            io_uring_prep_fsync(sqe, f->fd, 0);
            io_uring_sqe_set_data64(sqe, (uint64_t)i);
            queued++;
        } else if (!rc && fsync(f->fd) < 0) {
            rc = util_fail(err, errlen, -errno, "%s: fsync: %s", f->name, strerror(errno));
        }
    }
    if (queued)
        io_uring_submit(&u->ring);
    for (int k = 0; k < queued; k++) {
        struct io_uring_cqe *cqe;
        int r;
        do
            r = io_uring_wait_cqe(&u->ring, &cqe);
        while (r == -EINTR);
        if (r < 0) {
            rc = rc ? rc : util_fail(err, errlen, r, "io_uring wait: %s", strerror(-r));
            break;
        }
        int i = (int)io_uring_cqe_get_data64(cqe), res = cqe->res;
        io_uring_cqe_seen(&u->ring, cqe);
        if (res < 0 && !rc)
            rc = util_fail(err, errlen, res, "%s: fsync: %s", u->files[i].name, strerror(-res));
    }
    for (int i = 0; i < last; i++) {
        if (close(u->files[i].fd) < 0 && !rc)
            rc = util_fail(err, errlen, -errno, "%s: close: %s", u->files[i].name, strerror(errno));
        u->files[i].fd = -1;
    }
    if (last < u->nf) /* the open one moves to the front */
        u->files[0] = u->files[last];
    u->nf -= last;
    return rc;
}

/* Submits the current buffer (len bytes) and moves to a free one. */
static int flush_buf(uw_t *u, uint32_t len, char *err, size_t errlen)
{
    int b = u->cur;
    u->file[b] = u->nf - 1;
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

int uw_open(uw_t *u, int dirfd, const char *name, const char *shown, char *err, size_t errlen)
{
    int rc;
    if (u->nf == UW_MAX_OPEN && (rc = uw_sync(u, err, errlen)))
        return rc;
    uwf_t *f = &u->files[u->nf];
    snprintf(f->name, sizeof(f->name), "%s", shown);
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    f->fd = openat(dirfd, name, flags | O_DIRECT | O_CLOEXEC, 0644);
    f->direct = f->fd >= 0;
    if (f->fd < 0 && errno == EINVAL)
        f->fd = openat(dirfd, name, flags | O_CLOEXEC, 0644);
    if (f->fd < 0)
        return util_fail(err, errlen, -errno, "%s: cannot create: %s", shown, strerror(errno));
    if (!f->direct)
        u->all_direct = 0;
    f->padded = 0;
    u->nf++;
    u->open = 1;
    u->pos = u->buf_off = 0;
    u->fill = 0;
    return 0;
}

int uw_append(uw_t *u, const void *data, size_t n, char *err, size_t errlen)
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

/* Ends the current file: submits what is left of it, without waiting. */
int uw_end_file(uw_t *u, char *err, size_t errlen)
{
    uwf_t *f = &u->files[u->nf - 1];
    f->size = u->pos;
    u->open = 0;
    if (!u->fill)
        return 0;
    uint32_t len = u->fill;
    if (f->direct) { /* O_DIRECT writes whole blocks: pad, truncate at sync time */
        uint32_t padded = (len + UW_ALIGN - 1) / UW_ALIGN * UW_ALIGN;
        memset(u->mem + (size_t)u->cur * UW_BUF + len, 0, padded - len);
        f->padded = padded != len;
        len = padded;
    }
    return flush_buf(u, len, err, errlen);
}

/* One writer (ring, registered buffers) is kept for the next checkpoint: setting one up
 * costs page faults on 32 MiB and pinning them, tens of ms of CPU that would be taken from
 * training at every checkpoint. ckw_* is for one thread; a process writing several
 * checkpoints at once (the remote server) gets a new writer for each beyond the first. */
static uw_t *spare;

int uw_get(uw_t **out, char *err, size_t errlen)
{
    if (spare && spare->owner != getpid()) {
        /* inherited through fork: its registered buffers are the parent's pages (the child
         * writes into copies the ring never sees) and its ring is shared with the parent */
        uw_free_bufs(spare);
        free(spare);
        spare = NULL;
    }
    if (spare) {
        *out = spare;
        spare = NULL;
        return 0;
    }
    uw_t *u = malloc(sizeof(*u));
    if (!u)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    int rc = init(u, err, errlen);
    if (rc) {
        free(u);
        return rc;
    }
    *out = u;
    return 0;
}

/* Takes a writer back: whatever is still in flight or open is finished (errors ignored: the
 * caller has failed already or succeeded). */
void uw_put(uw_t *u)
{
    if (!u)
        return;
    drain(u, NULL, 0);
    close_files(u);
    if (spare) {
        uw_free_bufs(u);
        free(u);
        return;
    }
    u->all_direct = 1;
    u->fill = 0;
    u->cur = 0;
    spare = u;
}


uint64_t uw_pos(const uw_t *u) { return u->pos; }

void uw_modes(const uw_t *u, int *direct, int *fixed)
{
    *direct = u->all_direct;
    *fixed = u->fixed;
}

int uw_raw_write(const char *path, uint64_t bytes, double *secs, int *direct, char *err, size_t errlen)
{
    uw_t u;
    int rc = init(&u, err, errlen);
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
        if (!rc)
            rc = uw_end_file(&u, err, errlen);
        int rc2 = uw_sync(&u, err, errlen);
        rc = rc ? rc : rc2;
    }
    *secs = util_now() - t0;
    *direct = u.all_direct;
    uw_free_bufs(&u);
    return rc;
}
