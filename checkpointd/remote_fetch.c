/* The receiving end of a fetch (remote_int.h rmt_fetch_*): the parts a storage host sends of a
 * stored checkpoint, checked for shape and handed to a sink (remote.h rmt_sink_t): the index
 * once whole and decoded, then each data file's bytes in order. One sink writes the files into
 * a directory (rmt_dir_sink_*: `rmt_client_fetch_dir`, fuzz_fetch); checkpointd's LOAD streams
 * them into the staging segment (restore.c). Nothing here trusts the server beyond its CURVE
 * key: a file is named only as the index (checked by its own checksum and rules) names it,
 * and its bytes come in order, never past its size. */
#include "checkpointd/remote_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/util.h"

void rmt_fetch_init(rmt_fetch_t *F, const rmt_sink_t *sink, const char *job, int64_t step, const char *from)
{
    memset(F, 0, sizeof(*F));
    F->sink = sink, F->job = job, F->step = step, F->from = from;
}

void rmt_fetch_free(rmt_fetch_t *F)
{
    free(F->index);
    ckpt_index_free(&F->ix);
    F->index = NULL;
    F->have_ix = 0;
}

static const char *file_name(const rmt_fetch_t *F) { return F->file ? F->ix.files[F->file - 1].name : "index"; }

/* File `file` whole: the index decoded (its own checks: structure, checksum, plain file
 * names), of the step asked for, and given to the sink; a data file's end told to it. */
static int close_file(rmt_fetch_t *F, char *err, size_t errlen)
{
    const rmt_sink_t *s = F->sink;
    if (F->file)
        return s->file_done ? s->file_done(s->arg, F->file - 1, err, errlen) : 0;
    char what[PATH_MAX + 128];
    snprintf(what, sizeof what, "the index of step %lld of job %s from %s", (long long)F->step, F->job, F->from);
    int rc = ckpt_index_decode(F->index, F->size, &F->ix, what, err, errlen);
    if (rc)
        return rc == -ENOMEM ? rc : -EBADMSG;
    F->have_ix = 1;
    if (F->ix.step != F->step)
        return util_fail(err, errlen, -EBADMSG, "%s is that of step %lld", what, (long long)F->ix.step);
    return s->index(s->arg, &F->ix, F->index, F->size, err, errlen);
}

int rmt_fetch_part(rmt_fetch_t *F, const rmt_hdr_t *h, const void *data, size_t n, char *err, size_t errlen)
{
    int rc;
    if (F->any && F->got == F->size && h->file == F->file + 1) { /* the next file */
        if ((rc = close_file(F, err, errlen)))
            return rc;
        F->file++, F->any = 0, F->got = 0;
    }
    if (h->file != F->file)
        return util_fail(err, errlen, -EBADMSG, "the checkpointd at %s sent a part of file %u where one of file %u "
                         "(%llu of its %llu bytes in) was due", F->from, h->file, F->file,
                         (unsigned long long)F->got, (unsigned long long)F->size);
    if (!F->any) { /* the file's first part says its size */
        if (F->file && (!F->have_ix || F->file > (uint32_t)F->ix.n_files))
            return util_fail(err, errlen, -EBADMSG, "the checkpointd at %s sent file %u of an index with %d data "
                             "files", F->from, F->file, F->ix.n_files);
        if (F->file ? h->size != F->ix.files[F->file - 1].bytes : h->size > CKPT_INDEX_MAX)
            return util_fail(err, errlen, -EBADMSG, "the checkpointd at %s sent %s of %llu bytes (%s %llu)",
                             F->from, file_name(F), (unsigned long long)h->size,
                             F->file ? "the index says" : "at most",
                             (unsigned long long)(F->file ? F->ix.files[F->file - 1].bytes : CKPT_INDEX_MAX));
        F->size = h->size;
        if (!F->file && !(F->index = malloc(F->size ? F->size : 1)))
            return util_fail(err, errlen, -ENOMEM, "out of memory");
    } else if (h->size != F->size) {
        return util_fail(err, errlen, -EBADMSG, "the checkpointd at %s said %s is %llu bytes, then %llu", F->from,
                         file_name(F), (unsigned long long)F->size, (unsigned long long)h->size);
    }
    if (h->offset != F->got || n > F->size - F->got)
        return util_fail(err, errlen, -EBADMSG, "the checkpointd at %s sent bytes [%llu, %llu) of %s (%llu bytes) "
                         "after %llu", F->from, (unsigned long long)h->offset,
                         (unsigned long long)(h->offset + n), file_name(F), (unsigned long long)F->size,
                         (unsigned long long)F->got);
    if (!F->file)
        memcpy(F->index + F->got, data, n);
    else if ((rc = F->sink->data(F->sink->arg, F->file - 1, F->got, data, n, err, errlen)))
        return rc;
    F->got += n;
    F->any = 1;
    return 0;
}

int rmt_fetch_done(rmt_fetch_t *F, char *err, size_t errlen)
{
    int rc;
    if (F->any && F->got == F->size && (rc = close_file(F, err, errlen)))
        return rc;
    if (!F->have_ix || !F->any || F->got != F->size || F->file != (uint32_t)F->ix.n_files)
        return util_fail(err, errlen, -EBADMSG, "the checkpointd at %s ended the fetch of step %lld of job %s with "
                         "%s incomplete", F->from, (long long)F->step, F->job,
                         F->have_ix ? file_name(F) : "the index");
    return 0;
}

/* ---- the directory sink: the files as the server holds them ---- */

static int write_all(int fd, const void *buf, size_t n, uint64_t off)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        p += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return 0;
}

/* DIR/name, a new file (never one that is there, never through a link). */
static int create(const rmt_dir_sink_t *d, const char *name, char *path, size_t n, char *err, size_t errlen)
{
    snprintf(path, n, "%s/%s", d->dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    return fd >= 0 ? fd : util_fail(err, errlen, -errno, "%s: %s", path, strerror(errno));
}

static int dir_index(void *arg, const ckpt_index_t *ix, const void *bytes, size_t n, char *err, size_t errlen)
{
    rmt_dir_sink_t *d = arg;
    char path[PATH_MAX + 16];
    int fd = create(d, "index", path, sizeof path, err, errlen);
    if (fd < 0)
        return fd;
    int rc = write_all(fd, bytes, n, 0), closed = close(fd) ? -errno : 0;
    if ((rc = rc ? rc : closed))
        return util_fail(err, errlen, rc, "%s: %s", path, strerror(-rc));
    d->ix = ix;
    if ((rc = ckpt_stream_begin(&d->cs, ix, d->shown, err, errlen)))
        return rc;
    ckpt_stream_add_all(&d->cs);
    return ckpt_stream_ready(&d->cs, err, errlen);
}

static int dir_data(void *arg, uint32_t k, uint64_t off, const void *p, size_t n, char *err, size_t errlen)
{
    rmt_dir_sink_t *d = arg;
    char path[PATH_MAX + CKPT_FILE_MAX];
    if (off == 0 && (d->fd = create(d, d->ix->files[k].name, path, sizeof path, err, errlen)) < 0)
        return d->fd;
    int rc = n ? write_all(d->fd, p, n, off) : 0;
    if (rc)
        return util_fail(err, errlen, rc, "%s/%s: cannot write: %s", d->dir, d->ix->files[k].name, strerror(-rc));
    return ckpt_stream_data(&d->cs, k, off, p, n, err, errlen);
}

static int dir_file_done(void *arg, uint32_t k, char *err, size_t errlen)
{
    rmt_dir_sink_t *d = arg;
    int rc = close(d->fd) ? -errno : 0;
    d->fd = -1;
    if (rc)
        return util_fail(err, errlen, rc, "%s/%s: %s", d->dir, d->ix->files[k].name, strerror(-rc));
    return ckpt_stream_file_done(&d->cs, k, err, errlen);
}

void rmt_dir_sink_init(rmt_dir_sink_t *d, const char *dir, const char *shown)
{
    memset(d, 0, sizeof(*d));
    d->dir = dir;
    d->fd = -1;
    d->shown = shown;
    d->sink = (rmt_sink_t){.index = dir_index, .data = dir_data, .file_done = dir_file_done, .arg = d};
}

int rmt_dir_sink_finish(rmt_dir_sink_t *d, char *err, size_t errlen)
{
    if (!d->ix)
        return util_fail(err, errlen, -EBADMSG, "checkpoint %s: no index came", d->shown);
    return ckpt_stream_finish(&d->cs, err, errlen);
}

void rmt_dir_sink_close(rmt_dir_sink_t *d)
{
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
    ckpt_stream_free(&d->cs);
}
