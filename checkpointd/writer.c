/* Durable, atomic checkpoint directories (see writer.h): the directory protocol over the
 * io_uring stream of checkpointd/uring.h. Checksums are taken from the bytes as they stream
 * through (XXH3, one state per chunk), so they cost no pass of their own and, on a storage
 * host, cover what arrived. */
#include "checkpointd/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "checkpointd/uring.h"
#include "ipc/util.h"

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
    char tmp[PATH_MAX], file[PATH_MAX + 16], probe[32];
    int rc = util_mkdirs(dir);
    if (rc)
        return util_fail(err, errlen, rc, "%s: cannot create: %s", dir, strerror(-rc));
    ckpt_probe_name(probe, sizeof(probe), (int)getpid());
    if (snprintf(tmp, sizeof(tmp), "%s/%s", dir, probe) >= (int)sizeof(tmp))
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

/* Whether plan is one of a checkpoint in n_parts parts: as many files for each part, each named
 * for the part it is in (ckpt_layout.h). Returns 0 or -EINVAL with err. */
static int check_parts(const ckpt_index_t *plan, int n_parts, char *err, size_t errlen)
{
    if (n_parts < 1 || plan->n_files % n_parts)
        return util_fail(err, errlen, -EINVAL, "%d parts: the plan has %d data files, not as many for each part",
                         n_parts, plan->n_files);
    for (int f = 0; f < plan->n_files && n_parts > 1; f++)
        if (ckpt_file_name_part(plan->files[f].name) != ckpt_part_of_file((uint32_t)f, plan->n_files, n_parts))
            return util_fail(err, errlen, -EINVAL, "%d parts: the plan's file %d, %s, is not of part %d", n_parts, f,
                             plan->files[f].name, ckpt_part_of_file((uint32_t)f, plan->n_files, n_parts));
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
        int rc = ckpt_tmp_check(tmp_name, plan->step, err, errlen);
        if (rc)
            return rc;
        if (part >= n_parts)
            return util_fail(err, errlen, -EINVAL, "part %d of %d: no such part", part, n_parts);
        if ((rc = check_parts(plan, n_parts, err, errlen)))
            return rc;
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
    int per_part = w->plan.n_files / n_parts; /* ckpt_layout.h: part-major */
    w->first = part >= 0 ? per_part * part : 0;
    w->end = part >= 0 ? per_part * (part + 1) : w->plan.n_files;
    w->file = w->first - 1;
    ckpt_step_path(w->final, sizeof(w->final), dir, plan->step);
    if (part < 0) {
        char name[64];
        ckpt_tmp_name(name, sizeof(name), plan->step, (int)getpid());
        snprintf(w->tmp, sizeof(w->tmp), "%s/%s", dir, name);
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
    if (uw_pos(w->uw) != f->bytes)
        return util_fail(err, errlen, -EINVAL, "%s: %" PRIu64 " bytes sent, the plan says %" PRIu64, f->name,
                         uw_pos(w->uw), f->bytes);
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
    if (offset != uw_pos(w->uw) || n > f->bytes - uw_pos(w->uw))
        return util_fail(err, errlen, -EINVAL, "%s: %zu bytes at offset %" PRIu64 ": expected offset %" PRIu64
                         " and at most %" PRIu64 " bytes", f->name, n, offset, uw_pos(w->uw), f->bytes - uw_pos(w->uw));
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
    return rc ? rc : uw_sync(w->uw, err, errlen);
}

/* Whether data file f of ix starts with a header, as its readers take it (ckpt_open): room for
 * one, and no chunk in it. */
static int has_header(const ckpt_index_t *ix, int f)
{
    if (ix->files[f].bytes < CKPT_DATA_HDR)
        return 0;
    for (int i = 0; i < ix->n_tensors; i++)
        for (uint32_t k = 0; k < ix->tensors[i].n_chunks; k++)
            if (ix->tensors[i].chunks[k].file == (uint32_t)f && ix->tensors[i].chunks[k].offset < CKPT_DATA_HDR)
                return 0;
    return 1;
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
    if (!has_header(ix, f))
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

int ckw_commit(ckw_t **pw, char *path, size_t pathlen, ckw_stats_t *st, char *err, size_t errlen)
{
    ckw_t *w = *pw;
    *pw = NULL;
    int rc = 0;
    if (w->part >= 0)
        rc = util_fail(err, errlen, -EINVAL, "part %d: a part's writer ends with ckw_commit_part", w->part);
    if (!rc)
        rc = end_files(w, err, errlen);
    for (int f = 0; f < w->plan.n_files && !rc; f++) /* the headers: the one part no checksum covers */
        rc = check_data_file(w->tmpfd, w->tmp, &w->plan, f, err, errlen);
    if (!rc)
        rc = publish(w->tmpfd, w->tmp, w->dir, w->final, &w->plan, err, errlen);
    if (st) {
        *st = (ckw_stats_t){.bytes = w->bytes, .secs = util_now() - w->t0};
        uw_modes(w->uw, &st->direct, &st->fixed);
    }
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
            n += ckpt_part_of_file(ix->tensors[i].chunks[c].file, ix->n_files, n_parts) == part;
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
                if (ckpt_part_of_file(w->plan.tensors[i].chunks[c].file, w->plan.n_files, w->n_parts) == w->part)
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
    if (st) {
        *st = (ckw_stats_t){.bytes = w->bytes, .secs = util_now() - w->t0};
        uw_modes(w->uw, &st->direct, &st->fixed);
    }
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
                if (ckpt_part_of_file(ix->tensors[i].chunks[c].file, ix->n_files, n_parts) == part)
                    ix->tensors[i].chunks[c].xxh = ps.xxh[j++];
    }
    ckpt_part_sums_free(&ps);
    return rc;
}

int ckw_commit_parts(const char *dir, const char *tmp_name, const ckpt_index_t *plan, int n_parts, char *path,
                     size_t pathlen, ckw_stats_t *st, char *err, size_t errlen)
{
    double t0 = util_now();
    int rc = ckpt_tmp_check(tmp_name, plan->step, err, errlen);
    if (rc)
        return rc;
    if ((rc = check_parts(plan, n_parts, err, errlen)))
        return rc;
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
    int rc = ckpt_tmp_check(tmp_name, step, err, errlen);
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

