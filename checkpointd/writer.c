/* Durable, atomic checkpoint directories through io_uring (see writer.h).
 *
 * Data goes through UW_NBUF registered buffers of UW_BUF bytes (4 KiB-aligned): the caller's
 * bytes are copied into the current buffer, a full buffer is submitted as one write at its
 * file offset, and up to UW_NBUF writes are in flight while the next buffer fills, across file
 * boundaries (a finished file is not waited for; its last partial buffer is padded to 4 KiB
 * under O_DIRECT and the file truncated back to its size at the end). At commit every file
 * gets its fsync at once, so the journal commits and device flushes are shared. Short writes
 * are resubmitted for the rest; a filesystem that refuses O_DIRECT (at open, or with EINVAL on
 * a write) gets the same file buffered.
 *
 * Checksums are taken from the bytes as they stream through (XXH3, one state per chunk), so
 * they cost no pass of their own and, on a storage host, cover what arrived. */
#include "checkpointd/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

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

typedef struct {
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
} uw_t;

static int uw_init(uw_t *u, char *err, size_t errlen)
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

static void uw_close_files(uw_t *u)
{
    for (int i = 0; i < u->nf; i++)
        if (u->files[i].fd >= 0)
            close(u->files[i].fd);
    u->nf = u->open = 0;
}

static void uw_free(uw_t *u)
{
    uw_close_files(u);
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
static int sync_files(uw_t *u, char *err, size_t errlen)
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

static int uw_open(uw_t *u, int dirfd, const char *name, const char *shown, char *err, size_t errlen)
{
    int rc;
    if (u->nf == UW_MAX_OPEN && (rc = sync_files(u, err, errlen)))
        return rc;
    uwf_t *f = &u->files[u->nf];
    snprintf(f->name, sizeof(f->name), "%s", shown);
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    f->fd = openat(dirfd, name, flags | O_DIRECT, 0644);
    f->direct = f->fd >= 0;
    if (f->fd < 0 && errno == EINVAL)
        f->fd = openat(dirfd, name, flags, 0644);
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

/* Ends the current file: submits what is left of it, without waiting. */
static int uw_end_file(uw_t *u, char *err, size_t errlen)
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

static int uw_get(uw_t **out, char *err, size_t errlen)
{
    if (spare && spare->owner != getpid()) {
        /* inherited through fork: its registered buffers are the parent's pages (the child
         * writes into copies the ring never sees) and its ring is shared with the parent */
        uw_free(spare);
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
    int rc = uw_init(u, err, errlen);
    if (rc) {
        free(u);
        return rc;
    }
    *out = u;
    return 0;
}

/* Takes a writer back: whatever is still in flight or open is finished (errors ignored: the
 * caller has failed already or succeeded). */
static void uw_put(uw_t *u)
{
    if (!u)
        return;
    drain(u, NULL, 0);
    uw_close_files(u);
    if (spare) {
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

typedef struct {
    uint64_t offset, length;
    uint64_t *xxh;                 /* into the plan */
} span_t;

struct ckw {
    char dir[PATH_MAX], tmp[PATH_MAX + 64], final[PATH_MAX + 32];
    int tmpfd;
    ckpt_index_t plan;
    uw_t *uw;
    int part, n_parts;   /* ckw_begin_part's part of n_parts; -1 for a whole checkpoint */
    int first, end;      /* the data files this writer writes: [first, end) of the plan's */
    int file;            /* data file being written, first - 1 before the first */
    double t0;
    uint64_t bytes;
    /* checksums of the current file's chunks, in offset order, as its bytes go by */
    span_t *spans;
    int n_spans, next;
    uint64_t span_pos;   /* bytes of spans[next] hashed so far */
    XXH3_state_t *hs;
    int check;           /* the plan carried checksums: compare instead of filling in */
};

static void ckw_free(ckw_t *w)
{
    uw_put(w->uw);
    if (w->tmpfd >= 0)
        close(w->tmpfd);
    ckpt_index_free(&w->plan);
    free(w->spans);
    XXH3_freeState(w->hs);
    free(w);
}

static int cmp_span(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The chunks of data file f in offset order. Overlapping chunks cannot be checksummed in one
 * pass and are refused. */
static int file_spans(ckw_t *w, uint32_t f, char *err, size_t errlen)
{
    w->n_spans = w->next = 0;
    w->span_pos = 0;
    for (int i = 0; i < w->plan.n_tensors; i++)
        for (uint32_t c = 0; c < w->plan.tensors[i].n_chunks; c++) {
            ckpt_chunk_t *ch = &w->plan.tensors[i].chunks[c];
            if (ch->file == f)
                w->spans[w->n_spans++] = (span_t){ch->offset, ch->length, &ch->xxh};
        }
    qsort(w->spans, (size_t)w->n_spans, sizeof(span_t), cmp_span);
    for (int s = 1; s < w->n_spans; s++)
        if (w->spans[s].offset < w->spans[s - 1].offset + w->spans[s - 1].length)
            return util_fail(err, errlen, -EINVAL, "%s: chunks overlap at offset %" PRIu64, w->plan.files[f].name,
                             w->spans[s].offset);
    XXH3_64bits_reset(w->hs);
    return 0;
}

/* Feeds bytes [off, off + n) of the current file to the checksums of the chunks they hold. */
static int hash_bytes(ckw_t *w, uint64_t off, const uint8_t *p, size_t n, char *err, size_t errlen)
{
    uint64_t end = off + n;
    while (w->next < w->n_spans) {
        span_t *s = &w->spans[w->next];
        uint64_t b = s->offset + w->span_pos, e = s->offset + s->length;
        if (b >= end)
            return 0;
        if (b < off) /* cannot happen: bytes come in order */
            return util_fail(err, errlen, -EINVAL, "checksum stream out of order");
        uint64_t to = e < end ? e : end;
        XXH3_64bits_update(w->hs, p + (b - off), (size_t)(to - b));
        w->span_pos += to - b;
        if (to < e)
            return 0;
        uint64_t h = XXH3_64bits_digest(w->hs);
        if (w->check && *s->xxh != h)
            return util_fail(err, errlen, -EBADMSG,
                             "%s: the %" PRIu64 " bytes at offset %" PRIu64 " do not match their checksum in the plan "
                             "(damaged on the way?)", w->plan.files[w->file].name, s->length, s->offset);
        *s->xxh = h;
        XXH3_64bits_reset(w->hs);
        w->next++;
        w->span_pos = 0;
    }
    return 0;
}

int ckw_check_dir(const char *dir, char *err, size_t errlen)
{
    char tmp[PATH_MAX], file[PATH_MAX + 16];
    int rc = util_mkdirs(dir);
    if (rc)
        return util_fail(err, errlen, rc, "%s: cannot create: %s", dir, strerror(-rc));
    if (snprintf(tmp, sizeof(tmp), "%s/.tmp-probe.%d", dir, (int)getpid()) >= (int)sizeof(tmp))
        return util_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);
    snprintf(file, sizeof(file), "%s/index", tmp);
    ckpt_remove_dir(tmp); /* ours from an earlier start that died in between */
    if (mkdir(tmp, 0755) < 0)
        return util_fail(err, errlen, -errno, "%s: cannot create a directory in it: %s", dir, strerror(errno));
    int fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        rc = util_fail(err, errlen, -errno, "%s: cannot create a file in it: %s", dir, strerror(errno));
    else
        close(fd);
    ckpt_remove_dir(tmp);
    return rc;
}

/* Whether name is .tmp-step-NNNNNNNN.PID for `step` (a PID of 1 to 10 digits, no leading 0):
 * the one form ckpt_retain knows (it removes such a directory once no process has the PID), and
 * so a name that cannot point outside the folder. */
static int check_tmp_name(const char *name, int64_t step, char *err, size_t errlen)
{
    char want[48];
    size_t n = (size_t)snprintf(want, sizeof(want), ".tmp-step-%08" PRId64 ".", step), k = strnlen(name, 64);
    int ok = k > n && k - n <= 10 && !strncmp(name, want, n) && name[n] != '0';
    for (size_t i = n; ok && i < k; i++)
        ok = name[i] >= '0' && name[i] <= '9';
    if (!ok || strtoll(name + n, NULL, 10) > INT_MAX)
        return util_fail(err, errlen, -EINVAL, "'%.64s' is not the name of a temporary directory of step %" PRId64
                         " (%sPID, PID that of the committing checkpointd)", name, step, want);
    return 0;
}

/* Removes this part's files from the temporary directory, its checksum file first (the mark of a
 * part written whole). Returns 0 or -errno with err. */
static int remove_part_files(ckw_t *w, char *err, size_t errlen)
{
    char name[CKPT_FILE_MAX];
    ckpt_part_sums_name(name, sizeof(name), w->part);
    if (unlinkat(w->tmpfd, name, 0) < 0 && errno != ENOENT)
        return util_fail(err, errlen, -errno, "%s/%s: cannot remove: %s", w->tmp, name, strerror(errno));
    for (int f = w->first; f < w->end; f++)
        if (unlinkat(w->tmpfd, w->plan.files[f].name, 0) < 0 && errno != ENOENT)
            return util_fail(err, errlen, -errno, "%s/%s: cannot remove: %s", w->tmp, w->plan.files[f].name,
                             strerror(errno));
    return 0;
}

/* What a failed or abandoned writer leaves: nothing of a whole checkpoint; of a part, the other
 * parts' files (the directory is theirs too). */
static void discard(ckw_t *w)
{
    if (w->part < 0 && w->tmp[0])
        ckpt_remove_dir(w->tmp);
    else if (w->part >= 0 && w->tmpfd >= 0)
        remove_part_files(w, NULL, 0);
}

/* ckw_begin (part -1) and ckw_begin_part. */
static int begin(ckw_t **out, const char *dir, const char *tmp_name, const ckpt_index_t *plan, int part, int n_parts,
                 char *err, size_t errlen)
{
    *out = NULL;
    if (part >= 0) {
        int rc = check_tmp_name(tmp_name, plan->step, err, errlen);
        if (rc)
            return rc;
        if (n_parts < 1 || part >= n_parts || plan->n_files != 3 * n_parts)
            return util_fail(err, errlen, -EINVAL, "part %d of %d: the plan has %d data files, not 3 for each part",
                             part, n_parts, plan->n_files);
    }
    ckw_t *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->tmpfd = -1;
    w->part = part;
    w->n_parts = n_parts;
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
    size_t chunks = 0;
    for (int i = 0; i < w->plan.n_tensors; i++)
        for (uint32_t c = 0; c < w->plan.tensors[i].n_chunks; c++) {
            chunks++;
            w->check |= w->plan.tensors[i].chunks[c].xxh != 0;
        }
    if (!(w->spans = malloc((chunks ? chunks : 1) * sizeof(span_t))) || !(w->hs = XXH3_createState())) {
        rc = util_fail(err, errlen, -ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = util_mkdirs(dir))) {
        util_fail(err, errlen, rc, "%s: cannot create: %s", dir, strerror(-rc));
        goto out;
    }
    w->first = part >= 0 ? 3 * part : 0;
    w->end = part >= 0 ? 3 * part + 3 : w->plan.n_files;
    w->file = w->first - 1;
    ckpt_step_path(w->final, sizeof(w->final), dir, plan->step);
    if (part < 0) {
        snprintf(w->tmp, sizeof(w->tmp), "%s/.tmp-step-%08" PRId64 ".%d", dir, plan->step, (int)getpid());
        ckpt_remove_dir(w->tmp); /* ours from an attempt that failed */
        if (mkdir(w->tmp, 0755) < 0) {
            rc = util_fail(err, errlen, -errno, "%s: cannot create: %s", w->tmp, strerror(errno));
            goto out;
        }
    } else {
        snprintf(w->tmp, sizeof(w->tmp), "%s/%s", dir, tmp_name);
        /* the first part to begin creates it; the others' files stay */
        if (mkdir(w->tmp, 0755) < 0 && errno != EEXIST) {
            rc = util_fail(err, errlen, -errno, "%s: cannot create: %s", w->tmp, strerror(errno));
            goto out;
        }
    }
    if ((w->tmpfd = open(w->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
        rc = util_fail(err, errlen, -errno, "%s: %s", w->tmp, strerror(errno));
        goto out;
    }
    if (part >= 0 && (rc = remove_part_files(w, err, errlen))) /* an earlier attempt at this part */
        goto out;
    if ((rc = uw_get(&w->uw, err, errlen)))
        goto out;
    *out = w;
    return 0;
out:
    discard(w);
    ckw_free(w);
    return rc;
}

int ckw_begin(ckw_t **out, const char *dir, const ckpt_index_t *plan, char *err, size_t errlen)
{
    return begin(out, dir, NULL, plan, -1, 1, err, errlen);
}

int ckw_begin_part(ckw_t **out, const char *dir, const char *tmp_name, const ckpt_index_t *plan, int part,
                   int n_parts, char *err, size_t errlen)
{
    if (part < 0)
        return util_fail(err, errlen, -EINVAL, "part %d: parts are numbered from 0", part);
    return begin(out, dir, tmp_name, plan, part, n_parts, err, errlen);
}

/* Ends the current file: all of its bytes given, every chunk in it checksummed. */
static int end_file(ckw_t *w, char *err, size_t errlen)
{
    const ckpt_file_t *f = &w->plan.files[w->file];
    if (w->uw->pos != f->bytes)
        return util_fail(err, errlen, -EINVAL, "%s: %" PRIu64 " bytes sent, the plan says %" PRIu64, f->name,
                         w->uw->pos, f->bytes);
    if (w->next != w->n_spans) /* cannot happen: the decoder keeps chunks inside their file */
        return util_fail(err, errlen, -EINVAL, "%s: chunk at %" PRIu64 " never complete", f->name,
                         w->spans[w->next].offset);
    return uw_end_file(w->uw, err, errlen);
}

int ckw_write(ckw_t *w, uint32_t file, uint64_t offset, const void *data, size_t n, char *err, size_t errlen)
{
    int rc;
    if ((int)file != w->file) {
        if (w->part >= 0 && (file < (uint32_t)w->first || file >= (uint32_t)w->end))
            return util_fail(err, errlen, -EINVAL, "data for file %u: part %d writes files %d to %d", file, w->part,
                             w->first, w->end - 1);
        if ((int)file != w->file + 1 || file >= (uint32_t)w->end)
            return util_fail(err, errlen, -EINVAL, "data for file %u after file %d: files come in order", file,
                             w->file);
        if (w->file >= w->first && (rc = end_file(w, err, errlen)))
            return rc;
        w->file = (int)file;
        char shown[PATH_MAX + 128];
        snprintf(shown, sizeof(shown), "%s/%s", w->tmp, w->plan.files[file].name);
        if ((rc = file_spans(w, file, err, errlen)) ||
            (rc = uw_open(w->uw, w->tmpfd, w->plan.files[file].name, shown, err, errlen)))
            return rc;
    }
    const ckpt_file_t *f = &w->plan.files[file];
    if (offset != w->uw->pos || n > f->bytes - w->uw->pos)
        return util_fail(err, errlen, -EINVAL, "%s: %zu bytes at offset %" PRIu64 ": expected offset %" PRIu64
                         " and at most %" PRIu64 " bytes", f->name, n, offset, w->uw->pos, f->bytes - w->uw->pos);
    if (n && (rc = hash_bytes(w, offset, data, n, err, errlen)))
        return rc;
    w->bytes += n;
    return uw_append(w->uw, data, n, err, errlen);
}

void ckw_abort(ckw_t **pw)
{
    ckw_t *w = *pw;
    if (!w)
        return;
    uw_put(w->uw); /* finishes and closes what is in flight before the files go */
    w->uw = NULL;
    discard(w);
    ckw_free(w);
    *pw = NULL;
}

/* A small file written whole into the temporary directory and synced (the index, a part's
 * checksum file). */
static int write_small(int dirfd, const char *tmp, const char *name, const uint8_t *buf, size_t len, char *err,
                       size_t errlen)
{
    int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    int rc = fd < 0 ? -errno : util_write_all(fd, buf, len);
    if (!rc && fsync(fd) < 0)
        rc = -errno;
    if (fd >= 0 && close(fd) < 0 && !rc)
        rc = -errno;
    return rc ? util_fail(err, errlen, rc, "%s/%s: %s", tmp, name, strerror(-rc)) : 0;
}

/* The end of every commit, once the data files are synced: the index written and synced last
 * into the temporary directory tmp (open as tmpfd), tmp synced, renamed to final (exchanged
 * when final exists: replaced atomically, the old one then under the temporary name), dir
 * synced. */
static int publish(int tmpfd, const char *tmp, const char *dir, const char *final, const ckpt_index_t *ix, char *err,
                   size_t errlen)
{
    uint8_t *buf;
    size_t len;
    int rc = ckpt_index_encode(ix, &buf, &len);
    if (rc)
        return util_fail(err, errlen, rc, "out of memory");
    rc = write_small(tmpfd, tmp, "index", buf, len, err, errlen);
    free(buf);
    if (!rc && fsync(tmpfd) < 0)
        rc = util_fail(err, errlen, -errno, "%s: fsync: %s", tmp, strerror(errno));
    if (!rc) {
        struct stat sb;
        if (stat(final, &sb) == 0) {
            if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) < 0)
                rc = util_fail(err, errlen, -errno, "%s: cannot replace: %s", final, strerror(errno));
        } else if (rename(tmp, final) < 0) {
            rc = util_fail(err, errlen, -errno, "%s -> %s: %s", tmp, final, strerror(errno));
        }
    }
    if (!rc && (rc = util_fsync_dir(dir)))
        util_fail(err, errlen, rc, "%s: fsync: %s", dir, strerror(-rc));
    return rc;
}

/* Every file of the writer, in order, to its size: the last one ended, all synced. */
static int end_files(ckw_t *w, char *err, size_t errlen)
{
    int rc;
    if (w->file != w->end - 1)
        rc = util_fail(err, errlen, -EINVAL, "%s: no data was sent for it", w->plan.files[w->file + 1].name);
    else
        rc = end_file(w, err, errlen);
    return rc ? rc : sync_files(w->uw, err, errlen);
}

int ckw_commit(ckw_t **pw, char *path, size_t pathlen, ckw_stats_t *st, char *err, size_t errlen)
{
    ckw_t *w = *pw;
    *pw = NULL;
    int rc = 0;
    if (w->part >= 0)
        rc = util_fail(err, errlen, -EINVAL, "part %d: a part's writer ends with ckw_commit_part", w->part);
    if (!rc)
        rc = end_files(w, err, errlen);
    if (!rc)
        rc = publish(w->tmpfd, w->tmp, w->dir, w->final, &w->plan, err, errlen);
    if (st)
        *st = (ckw_stats_t){.direct = w->uw->all_direct, .fixed = w->uw->fixed, .bytes = w->bytes,
                            .secs = util_now() - w->t0};
    if (!rc && path)
        snprintf(path, pathlen, "%s", w->final);
    uw_put(w->uw); /* in flight and open files finished before they are removed */
    w->uw = NULL;
    if (w->part < 0)
        ckpt_remove_dir(w->tmp); /* on failure the partial one; after an exchange the old one */
    else
        discard(w);
    ckw_free(w);
    return rc;
}

/* ---- checkpoints in parts ---- */

/* How many chunks of ix lie in the files of `part`. */
static uint64_t part_chunk_count(const ckpt_index_t *ix, int part, int n_parts)
{
    uint64_t n = 0;
    for (int i = 0; i < ix->n_tensors; i++)
        for (uint32_t c = 0; c < ix->tensors[i].n_chunks; c++)
            n += ckpt_part_of_file(ix->tensors[i].chunks[c].file, n_parts) == part;
    return n;
}

int ckw_commit_part(ckw_t **pw, ckw_stats_t *st, char *err, size_t errlen)
{
    ckw_t *w = *pw;
    *pw = NULL;
    int rc = 0;
    ckpt_part_sums_t ps = {.step = w->plan.step, .part = (uint32_t)w->part, .n_parts = (uint32_t)w->n_parts};
    uint8_t *buf = NULL;
    size_t len;
    if (w->part < 0)
        rc = util_fail(err, errlen, -EINVAL, "a whole checkpoint's writer ends with ckw_commit");
    if (!rc)
        rc = end_files(w, err, errlen);
    if (!rc) {
        ps.count = part_chunk_count(&w->plan, w->part, w->n_parts);
        if (!(ps.xxh = malloc(ps.count ? (size_t)ps.count * 8 : 1)))
            rc = util_fail(err, errlen, -ENOMEM, "out of memory");
    }
    if (!rc) { /* filled in as the bytes went by (hash_bytes) */
        uint64_t j = 0;
        for (int i = 0; i < w->plan.n_tensors; i++)
            for (uint32_t c = 0; c < w->plan.tensors[i].n_chunks; c++)
                if (ckpt_part_of_file(w->plan.tensors[i].chunks[c].file, w->n_parts) == w->part)
                    ps.xxh[j++] = w->plan.tensors[i].chunks[c].xxh;
        if ((rc = ckpt_part_sums_encode(&ps, &buf, &len)))
            util_fail(err, errlen, rc, "out of memory");
    }
    char name[CKPT_FILE_MAX];
    ckpt_part_sums_name(name, sizeof(name), w->part);
    if (!rc)
        rc = write_small(w->tmpfd, w->tmp, name, buf, len, err, errlen);
    if (!rc && fsync(w->tmpfd) < 0)
        rc = util_fail(err, errlen, -errno, "%s: fsync: %s", w->tmp, strerror(errno));
    if (st)
        *st = (ckw_stats_t){.direct = w->uw->all_direct, .fixed = w->uw->fixed, .bytes = w->bytes,
                            .secs = util_now() - w->t0};
    free(buf);
    free(ps.xxh);
    uw_put(w->uw);
    w->uw = NULL;
    if (rc)
        discard(w);
    ckw_free(w);
    return rc;
}

/* Part K's checksum file in the temporary directory, checked whole against the plan; its
 * checksums go into ix's chunks of part K's files. */
static int take_part_sums(const char *tmp, ckpt_index_t *ix, int part, int n_parts, char *err, size_t errlen)
{
    char path[PATH_MAX + 128], name[CKPT_FILE_MAX];
    ckpt_part_sums_name(name, sizeof(name), part);
    snprintf(path, sizeof(path), "%s/%s", tmp, name);
    uint64_t want = part_chunk_count(ix, part, n_parts);
    size_t size, need = ckpt_part_sums_bytes(want);
    int fd = util_open_regular(path, &size, err, errlen);
    if (fd == -ENOENT)
        return util_fail(err, errlen, -ENOENT, "%s: missing: part %d of %d was not written (or not to its end, "
                         "or not here: every host must see checkpoint.folder as one shared folder)", path, part,
                         n_parts);
    if (fd < 0)
        return fd;
    uint8_t *buf = NULL;
    ckpt_part_sums_t ps = {0};
    int rc = 0;
    long got = 0;
    if (size > need + 4096) /* far from any version of it: not read into memory */
        rc = util_fail(err, errlen, -EBADMSG, "%s: %zu bytes; part %d's checksum file is %zu", path, size, part, need);
    else if (!(buf = malloc(size ? size : 1)))
        rc = util_fail(err, errlen, -ENOMEM, "out of memory");
    else if ((got = util_read_all(fd, buf, size, 0)) < 0)
        rc = util_fail(err, errlen, (int)got, "%s: cannot read: %s", path, strerror((int)-got));
    else
        rc = ckpt_part_sums_decode(buf, (size_t)got, &ps, path, err, errlen);
    close(fd);
    free(buf);
    if (!rc && ps.step != ix->step)
        rc = util_fail(err, errlen, -EBADMSG, "%s: part %u of step %" PRId64 ", but this checkpoint is step %" PRId64
                       " (left from another checkpoint?)", path, ps.part, ps.step, ix->step);
    else if (!rc && (ps.part != (uint32_t)part || ps.n_parts != (uint32_t)n_parts))
        rc = util_fail(err, errlen, -EBADMSG, "%s: says part %u of %u, its name and the plan part %d of %d", path,
                       ps.part, ps.n_parts, part, n_parts);
    else if (!rc && ps.count != want)
        rc = util_fail(err, errlen, -EBADMSG, "%s: %" PRIu64 " checksums, but part %d's files hold %" PRIu64 " chunks "
                       "in the plan (written from another plan?)", path, ps.count, part, want);
    if (!rc) {
        uint64_t j = 0;
        for (int i = 0; i < ix->n_tensors; i++)
            for (uint32_t c = 0; c < ix->tensors[i].n_chunks; c++)
                if (ckpt_part_of_file(ix->tensors[i].chunks[c].file, n_parts) == part)
                    ix->tensors[i].chunks[c].xxh = ps.xxh[j++];
    }
    ckpt_part_sums_free(&ps);
    return rc;
}

/* Data file f of the plan in the temporary directory: a regular file of the plan's size, whose
 * header names it and the step (the data itself is checked by every reader, chunk by chunk). */
static int check_data_file(int tmpfd, const char *tmp, const ckpt_index_t *ix, int f, char *err, size_t errlen)
{
    const ckpt_file_t *cf = &ix->files[f];
    struct stat sb;
    if (fstatat(tmpfd, cf->name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
        return util_fail(err, errlen, -errno, "%s/%s: %s", tmp, cf->name,
                         errno == ENOENT ? "missing (though its part's checksum file is there)" : strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return util_fail(err, errlen, -EBADMSG, "%s/%s: not a regular file", tmp, cf->name);
    if ((uint64_t)sb.st_size != cf->bytes)
        return util_fail(err, errlen, -EBADMSG, "%s/%s: %lld bytes, the plan says %" PRIu64, tmp, cf->name,
                         (long long)sb.st_size, cf->bytes);
    if (cf->bytes < CKPT_DATA_HDR)
        return 0;
    uint8_t hdr[CKPT_DATA_HDR];
    char why[256];
    uint32_t file;
    int64_t step;
    int fd = openat(tmpfd, cf->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    long got = fd < 0 ? -errno : util_read_all(fd, hdr, sizeof(hdr), 0);
    if (fd >= 0)
        close(fd);
    if (got < 0)
        return util_fail(err, errlen, (int)got, "%s/%s: cannot read: %s", tmp, cf->name, strerror((int)-got));
    if (ckpt_data_header_read(hdr, (size_t)got, &file, &step, why, sizeof(why)))
        return util_fail(err, errlen, -EBADMSG, "%s/%s: %s", tmp, cf->name, why);
    if (file != (uint32_t)f || step != ix->step)
        return util_fail(err, errlen, -EBADMSG, "%s/%s: header: file %u of step %" PRId64 ", the plan's is file %d "
                         "of step %" PRId64, tmp, cf->name, file, step, f, ix->step);
    return 0;
}

int ckw_commit_parts(const char *dir, const char *tmp_name, const ckpt_index_t *plan, int n_parts, char *path,
                     size_t pathlen, ckw_stats_t *st, char *err, size_t errlen)
{
    double t0 = util_now();
    int rc = check_tmp_name(tmp_name, plan->step, err, errlen);
    if (rc)
        return rc;
    if (n_parts < 1 || plan->n_files != 3 * n_parts)
        return util_fail(err, errlen, -EINVAL, "%d parts: the plan has %d data files, not 3 for each part", n_parts,
                         plan->n_files);
    char tmp[PATH_MAX + 64], final[PATH_MAX + 32];
    snprintf(tmp, sizeof(tmp), "%s/%s", dir, tmp_name);
    ckpt_step_path(final, sizeof(final), dir, plan->step);
    ckpt_index_t ix = {0};
    uint8_t *enc = NULL;
    size_t enc_len;
    /* a copy to fill in, as ckw_begin's */
    if ((rc = ckpt_index_encode(plan, &enc, &enc_len)) == 0)
        rc = ckpt_index_decode(enc, enc_len, &ix, "checkpoint plan", err, errlen);
    free(enc);
    if (rc)
        return rc == -ENOMEM ? util_fail(err, errlen, rc, "out of memory") : rc;
    int tmpfd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (tmpfd < 0)
        rc = util_fail(err, errlen, -errno, "%s: %s", tmp, errno == ENOENT ? "missing: no part was written" :
                       strerror(errno));
    for (int k = 0; k < n_parts && !rc; k++)
        rc = take_part_sums(tmp, &ix, k, n_parts, err, errlen);
    uint64_t bytes = 0;
    for (int f = 0; f < ix.n_files && !rc; f++) {
        rc = check_data_file(tmpfd, tmp, &ix, f, err, errlen);
        bytes += ix.files[f].bytes;
    }
    for (int k = 0; k < n_parts && !rc; k++) { /* a committed checkpoint holds only the index and data */
        char name[CKPT_FILE_MAX];
        ckpt_part_sums_name(name, sizeof(name), k);
        if (unlinkat(tmpfd, name, 0) < 0)
            rc = util_fail(err, errlen, -errno, "%s/%s: cannot remove: %s", tmp, name, strerror(errno));
    }
    if (!rc)
        rc = publish(tmpfd, tmp, dir, final, &ix, err, errlen);
    if (st)
        *st = (ckw_stats_t){.bytes = rc ? 0 : bytes, .secs = util_now() - t0};
    if (!rc && path)
        snprintf(path, pathlen, "%s", final);
    if (tmpfd >= 0) {
        close(tmpfd);
        ckpt_remove_dir(tmp); /* on failure every part; after an exchange the old checkpoint */
    }
    ckpt_index_free(&ix);
    return rc;
}

int ckw_abort_parts(const char *dir, const char *tmp_name, int64_t step, char *err, size_t errlen)
{
    int rc = check_tmp_name(tmp_name, step, err, errlen);
    if (rc)
        return rc;
    char tmp[PATH_MAX + 64];
    snprintf(tmp, sizeof(tmp), "%s/%s", dir, tmp_name);
    int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); /* a directory, not a link to one */
    if (fd < 0)
        return errno == ENOENT ? 0 : util_fail(err, errlen, -errno, "%s: %s", tmp, strerror(errno));
    close(fd);
    if ((rc = ckpt_remove_dir(tmp)))
        util_fail(err, errlen, rc, "%s: cannot remove: %s", tmp, strerror(-rc));
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
        if (!rc)
            rc = uw_end_file(&u, err, errlen);
        int rc2 = sync_files(&u, err, errlen);
        rc = rc ? rc : rc2;
    }
    *secs = util_now() - t0;
    *direct = u.all_direct;
    uw_free(&u);
    return rc;
}
