/* Reading checkpoints (see ckpt.h): open a step folder by its index, read tensors back with
 * every chunk's checksum checked, verify a whole checkpoint. The index format is ckpt_index.c. */
#include "checkpointd/ckpt.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ipc/util.h"

struct ckpt {
    char path[PATH_MAX];
    ckpt_index_t ix;
    int *fds;        /* per file, -1 until opened (and its header checked) */
    uint64_t *sizes; /* per file, on disk */
    uint8_t *has_hdr;/* per file: its chunks leave room for the data file header, which it must hold */
};

/* All n bytes at off, or -ENODATA when the file ends first. */
static int read_all(int fd, void *buf, size_t n, uint64_t off)
{
    long got = util_read_all(fd, buf, n, (long long)off);
    return got < 0 ? (int)got : (size_t)got < n ? -ENODATA : 0;
}

static int load_index(const char *path, ckpt_index_t *ix, char *err, size_t errlen)
{
    char ip[PATH_MAX + 8];
    snprintf(ip, sizeof(ip), "%s/index", path);
    size_t size;
    int fd = util_open_regular(ip, &size, err, errlen); /* a FIFO is refused, not waited on */
    if (fd == -EINVAL) /* not a regular file: err says so */
        return -EBADMSG;
    if (fd < 0) {
        struct stat st;
        if (fd == -ENOENT && stat(path, &st) == 0)
            return util_fail(err, errlen, -ENOENT, "%s: no index: incomplete checkpoint", path);
        return util_fail(err, errlen, fd, "%s: %s", fd == -ENOENT ? path : ip, strerror(-fd));
    }
    uint8_t *buf = NULL;
    int rc = 0;
    if (size > CKPT_INDEX_MAX)
        rc = util_fail(err, errlen, -EFBIG, "%s: %zu bytes: larger than any index", ip, size);
    else if (!(buf = malloc(size + 1)))
        rc = -ENOMEM;
    else if ((rc = read_all(fd, buf, size, 0)))
        util_fail(err, errlen, rc, "%s: cannot read: %s", ip, strerror(-rc));
    else
        rc = ckpt_index_decode(buf, size, ix, ip, err, errlen);
    free(buf);
    close(fd);
    return rc;
}

/* A directory named step-N holds the checkpoint of step N: a copy under another step's name
 * would resume at the wrong step (and latest would take it for the newer one). */
static int check_dir_name(const char *path, int64_t step, char *err, size_t errlen)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    char name[CKPT_FILE_MAX];
    if (n - b >= sizeof(name))
        return 0; /* not step-N of any step: no rule */
    memcpy(name, path + b, n - b);
    name[n - b] = 0;
    int64_t named = ckpt_step_of(name);
    if (named >= 0 && named != step)
        return util_fail(err, errlen, -EBADMSG, "%s: bad index: it is the checkpoint of step %" PRId64 ", but the "
                         "directory is named for step %" PRId64 " (copied or moved from another step?)", path, step,
                         named);
    return 0;
}

int ckpt_open(ckpt_t **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    ckpt_t *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    snprintf(c->path, sizeof(c->path), "%s", path);
    int rc = load_index(path, &c->ix, err, errlen);
    if (!rc)
        rc = check_dir_name(path, c->ix.step, err, errlen);
    if (!rc && (!(c->fds = malloc((size_t)c->ix.n_files * sizeof(int))) ||
                !(c->sizes = calloc((size_t)c->ix.n_files, sizeof(uint64_t))) ||
                !(c->has_hdr = calloc((size_t)c->ix.n_files, 1))))
        rc = -ENOMEM;
    if (rc) {
        free(c->fds);
        c->fds = NULL;
        ckpt_close(&c);
        return rc;
    }
    for (int f = 0; f < c->ix.n_files; f++) {
        c->fds[f] = -1;
        c->has_hdr[f] = c->ix.files[f].bytes >= CKPT_DATA_HDR;
    }
    for (int i = 0; i < c->ix.n_tensors; i++)
        for (uint32_t k = 0; k < c->ix.tensors[i].n_chunks; k++)
            if (c->ix.tensors[i].chunks[k].offset < CKPT_DATA_HDR)
                c->has_hdr[c->ix.tensors[i].chunks[k].file] = 0;
    *out = c;
    return 0;
}

void ckpt_close(ckpt_t **pc)
{
    ckpt_t *c = *pc;
    if (!c)
        return;
    if (c->fds)
        for (int f = 0; f < c->ix.n_files; f++)
            if (c->fds[f] >= 0)
                close(c->fds[f]);
    free(c->fds);
    free(c->sizes);
    free(c->has_hdr);
    ckpt_index_free(&c->ix);
    free(c);
    *pc = NULL;
}

const ckpt_index_t *ckpt_index(const ckpt_t *c) { return &c->ix; }
const char *ckpt_path(const ckpt_t *c) { return c->path; }

/* The header of data file f (open as fd) against the index: its number and the step. */
static int check_header(ckpt_t *c, uint32_t f, int fd, const char *p, char *err, size_t errlen)
{
    uint8_t hdr[CKPT_DATA_HDR];
    char why[256];
    uint32_t file;
    int64_t step;
    long got = util_read_all(fd, hdr, sizeof(hdr), 0);
    if (got < 0)
        return util_fail(err, errlen, -EBADMSG, "%s: cannot read its header: %s", p, strerror((int)-got));
    if (ckpt_data_header_read(hdr, (size_t)got, &file, &step, why, sizeof(why)))
        return util_fail(err, errlen, -EBADMSG, "%s: %s", p, why);
    if (file != f)
        return util_fail(err, errlen, -EBADMSG, "%s: header: says file %u, but it is file %u of the index (a "
                         "header of another data file)", p, file, f);
    if (step != c->ix.step)
        return util_fail(err, errlen, -EBADMSG, "%s: header: says step %" PRId64 ", the index says step %" PRId64,
                         p, step, c->ix.step);
    return 0;
}

static int file_fd(ckpt_t *c, uint32_t f, char *err, size_t errlen)
{
    if (c->fds[f] >= 0)
        return c->fds[f];
    char p[PATH_MAX + CKPT_FILE_MAX + 2];
    snprintf(p, sizeof(p), "%s/%s", c->path, c->ix.files[f].name);
    size_t size;
    int fd = util_open_regular(p, &size, err, errlen); /* a FIFO is refused, not waited on */
    if (fd == -EINVAL) /* not a regular file: err says so */
        return -EBADMSG;
    if (fd < 0)
        return util_fail(err, errlen, -EBADMSG, "%s: missing (%s)", p, strerror(-fd));
    int rc = c->has_hdr[f] ? check_header(c, f, fd, p, err, errlen) : 0;
    if (rc) {
        close(fd);
        return rc;
    }
    c->sizes[f] = size;
    return c->fds[f] = fd;
}

/* Reads chunk ch of tensor t into buf (ch->length bytes) and checks it. */
static int read_chunk(ckpt_t *c, const ckpt_tensor_t *t, uint32_t k, void *buf, char *err, size_t errlen)
{
    const ckpt_chunk_t *ch = &t->chunks[k];
    int fd = file_fd(c, ch->file, err, errlen);
    if (fd < 0)
        return fd;
    const char *fn = c->ix.files[ch->file].name;
    if (c->sizes[ch->file] < ch->offset + ch->length)
        return util_fail(err, errlen, -EBADMSG,
                         "%s/%s: truncated: %" PRIu64 " bytes, but tensor %s (chunk %u) needs bytes up to %" PRIu64,
                         c->path, fn, c->sizes[ch->file], t->name, k, ch->offset + ch->length);
    int rc = read_all(fd, buf, ch->length, ch->offset);
    if (rc)
        return util_fail(err, errlen, -EBADMSG, "%s/%s: cannot read tensor %s (chunk %u): %s", c->path, fn, t->name,
                         k, strerror(-rc));
    if (XXH3_64bits(buf, ch->length) != ch->xxh)
        return util_fail(err, errlen, -EBADMSG,
                         "%s/%s: tensor %s chunk %u (%" PRIu64 " bytes at offset %" PRIu64 "): checksum mismatch (corrupt)",
                         c->path, fn, t->name, k, ch->length, ch->offset);
    return 0;
}

int ckpt_read(ckpt_t *c, const char *tensor, uint64_t first, uint64_t n, void *dst, char *err, size_t errlen)
{
    const ckpt_tensor_t *t = ckpt_index_find(&c->ix, tensor);
    if (!t)
        return util_fail(err, errlen, -ENOENT, "%s: no tensor %s", c->path, tensor);
    if (first > t->numel || n > t->numel - first)
        return util_fail(err, errlen, -EINVAL, "%s: tensor %s has %" PRIu64 " elements, asked for [%" PRIu64
                         ", %" PRIu64 ")", c->path, tensor, t->numel, first, first + n);
    size_t es = ckpt_dtype_size(t->dtype);
    uint64_t lo = first * es, hi = (first + n) * es, pos = 0;
    char *buf = NULL;
    int rc = 0;
    for (uint32_t k = 0; k < t->n_chunks && !rc && pos < hi; k++) {
        const ckpt_chunk_t *ch = &t->chunks[k];
        uint64_t b = pos, e = pos + ch->length;
        pos = e;
        if (e <= lo)
            continue;
        if (!buf && !(buf = malloc(CKPT_CHUNK_BYTES > ch->length ? CKPT_CHUNK_BYTES : ch->length)))
            return -ENOMEM;
        if (ch->length > CKPT_CHUNK_BYTES) { /* chunks of other writers may be larger */
            char *big = realloc(buf, ch->length);
            if (!big) {
                rc = -ENOMEM;
                break;
            }
            buf = big;
        }
        if ((rc = read_chunk(c, t, k, buf, err, errlen)))
            break;
        uint64_t from = lo > b ? lo : b, to = hi < e ? hi : e;
        memcpy((char *)dst + (from - lo), buf + (from - b), to - from);
    }
    free(buf);
    return rc;
}

const char *ckpt_master_name(const ckpt_t *c, const char *name, char *buf, size_t n)
{
    return ckpt_index_find(&c->ix, ckpt_master_tensor(name, buf, n)) ? buf : name;
}

/* ckpt_verify and ckpt_check_files: the index, every file, and with `chunks` every chunk. */
static int check(const char *path, int chunks, FILE *report, int *n_bad, char *err, size_t errlen)
{
    ckpt_t *c;
    *n_bad = 0;
    int rc = ckpt_open(&c, path, err, errlen);
    if (rc) {
        if (rc == -EBADMSG || rc == -ENOENT) {
            *n_bad = 1;
            if (report)
                fprintf(report, "%s\n", err);
        }
        return rc;
    }
    char msg[1024];
    char *missing = calloc((size_t)c->ix.n_files, 1);
    if (!missing) {
        ckpt_close(&c);
        return -ENOMEM;
    }
    for (int f = 0; f < c->ix.n_files; f++) {
        if (file_fd(c, (uint32_t)f, msg, sizeof(msg)) < 0) {
            missing[f] = 1;
            (*n_bad)++;
            if (report)
                fprintf(report, "%s\n", msg);
        } else if (c->sizes[f] != c->ix.files[f].bytes) {
            (*n_bad)++;
            if (report)
                fprintf(report, "%s/%s: %s: %" PRIu64 " bytes, the index says %" PRIu64 "\n", path,
                        c->ix.files[f].name, c->sizes[f] < c->ix.files[f].bytes ? "truncated" : "wrong size",
                        c->sizes[f], c->ix.files[f].bytes);
        }
    }
    uint64_t biggest = 0;
    for (int i = 0; i < c->ix.n_tensors && chunks; i++)
        for (uint32_t k = 0; k < c->ix.tensors[i].n_chunks; k++)
            biggest = c->ix.tensors[i].chunks[k].length > biggest ? c->ix.tensors[i].chunks[k].length : biggest;
    char *buf = chunks ? malloc(biggest ? biggest : 1) : NULL;
    if (chunks && !buf)
        rc = -ENOMEM;
    for (int i = 0; i < c->ix.n_tensors && buf; i++) {
        const ckpt_tensor_t *t = &c->ix.tensors[i];
        /* one line per damaged tensor, however many of its chunks are bad (a truncated
         * file would otherwise give one per chunk) */
        uint32_t bad_chunks = 0;
        for (uint32_t k = 0; k < t->n_chunks; k++) {
            if (missing[t->chunks[k].file])
                continue;
            char *where = bad_chunks ? NULL : msg;
            if (read_chunk(c, t, k, buf, where, where ? sizeof(msg) : 0))
                bad_chunks++;
        }
        if (bad_chunks) {
            (*n_bad)++;
            if (report)
                fprintf(report, "%s%s\n", msg, bad_chunks > 1 ? " (and more of its chunks)" : "");
        }
    }
    free(buf);
    free(missing);
    ckpt_close(&c);
    if (!rc && *n_bad)
        rc = util_fail(err, errlen, -EBADMSG, "%s: %d problem%s", path, *n_bad, *n_bad == 1 ? "" : "s");
    return rc;
}

int ckpt_verify(const char *path, FILE *report, int *n_bad, char *err, size_t errlen)
{
    return check(path, 1, report, n_bad, err, errlen);
}

int ckpt_check_files(const char *path, FILE *report, int *n_bad, char *err, size_t errlen)
{
    return check(path, 0, report, n_bad, err, errlen);
}
