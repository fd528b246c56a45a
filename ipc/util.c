/* Shared helpers (see util.h). */
#include "ipc/util.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int util_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

int util_open_regular(const char *path, size_t *size, char *err, size_t errlen)
{
    /* non-blocking: opening a FIFO for reading would otherwise wait for a writer forever */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return util_fail(err, errlen, -errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0)
        rc = util_fail(err, errlen, -errno, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = util_fail(err, errlen, -EINVAL, "%s: not a regular file", path);
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0)
        rc = util_fail(err, errlen, -errno, "%s: cannot clear O_NONBLOCK: %s", path, strerror(errno));
    if (rc) {
        close(fd);
        return rc;
    }
    *size = (size_t)st.st_size;
    return fd;
}

int util_read_file(const char *path, size_t max, const char *what, char **buf, size_t *len, char *err,
                   size_t errlen)
{
    size_t size = 0;
    *buf = NULL;
    int fd = util_open_regular(path, &size, err, errlen);
    if (fd < 0)
        return fd;
    int rc = 0;
    char *b = NULL;
    if (size > max)
        rc = util_fail(err, errlen, -EFBIG, "%s: %zu bytes: more than a %s has (%zu)", path, size, what, max);
    else if (!(b = malloc(size + 1)))
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory for %zu bytes", path, size);
    else {
        long n = util_read_all(fd, b, size, 0);
        if (n != (long)size)
            rc = util_fail(err, errlen, n < 0 ? (int)n : -EIO, "%s: cannot read: %s", path,
                           n < 0 ? strerror((int)-n) : "it shrank while read");
    }
    close(fd);
    if (rc) {
        free(b);
        return rc;
    }
    b[size] = 0;
    *buf = b;
    *len = size;
    return 0;
}

double util_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int util_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

void util_every_start(util_every_t *e, double every_s)
{
    e->t0 = util_now();
    e->every = every_s;
    e->next = e->t0 + every_s;
}

double util_every_due(util_every_t *e)
{
    double now = util_now();
    if (now < e->next)
        return -1;
    e->next = now + e->every;
    return now - e->t0;
}

double util_say_s(void)
{
    const char *test = getenv("CTITAN_TEST_SAY_S");
    char *end;
    double s = test && *test ? strtod(test, &end) : -1;
    return s >= 0 && *end == 0 ? s : 2.0; /* not a count of seconds: the default */
}

void util_json_string(FILE *fp, const char *s)
{
    fputc('"', fp);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(fp, "\\%c", *c);
        else if (*c < 0x20 || *c == 0x7f)
            fprintf(fp, "\\u%04x", *c);
        else
            fputc(*c, fp);
    }
    fputc('"', fp);
}

long util_read_all(int fd, void *buf, size_t n, long long off)
{
    char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = off < 0 ? read(fd, p + got, n - got) : pread(fd, p + got, n - got, (off_t)(off + (long long)got));
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (long)got;
}

int util_mkdirs(const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
                return -errno;
            *p = '/';
        }
    return mkdir(tmp, 0755) < 0 && errno != EEXIST ? -errno : 0;
}

int util_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

int util_afile_begin(util_afile_t *a, const char *path, char *err, size_t errlen)
{
    a->path = path;
    a->fd = -1;
    size_t len = strlen(path) + 16;
    if (!(a->tmp = malloc(len)))
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    snprintf(a->tmp, len, "%s.tmp.XXXXXX", path); /* unique: two writers never share one */
    if ((a->fd = mkostemp(a->tmp, O_CLOEXEC)) < 0) {
        int rc = util_fail(err, errlen, -errno, "%s: cannot create a temporary file beside it: %s", path,
                           strerror(errno));
        free(a->tmp);
        a->tmp = NULL;
        return rc;
    }
    fchmod(a->fd, 0644); /* mkstemp makes 0600; data files are meant to be shared */
    return 0;
}

int util_afile_write(util_afile_t *a, const void *buf, size_t n, char *err, size_t errlen)
{
    int rc = util_write_all(a->fd, buf, n);
    return rc ? util_fail(err, errlen, rc, "%s: write failed: %s", a->tmp, strerror(-rc)) : 0;
}

void util_afile_abort(util_afile_t *a)
{
    if (a->fd >= 0)
        close(a->fd);
    if (a->tmp)
        unlink(a->tmp);
    free(a->tmp);
    a->tmp = NULL;
    a->fd = -1;
}

int util_afile_commit(util_afile_t *a, char *err, size_t errlen)
{
    int rc = 0;
    if (fsync(a->fd) < 0) {
        rc = util_fail(err, errlen, -errno, "%s: fsync failed: %s", a->tmp, strerror(errno));
        goto out;
    }
    int crc = close(a->fd);
    a->fd = -1;
    if (crc < 0) {
        rc = util_fail(err, errlen, -errno, "%s: close failed: %s", a->tmp, strerror(errno));
        goto out;
    }
    if (rename(a->tmp, a->path) < 0) {
        rc = util_fail(err, errlen, -errno, "%s: cannot rename %s to it: %s", a->path, a->tmp, strerror(errno));
        goto out;
    }
    free(a->tmp);
    a->tmp = NULL;
    char *copy = strdup(a->path); /* make the rename itself durable */
    if (!copy)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", a->path);
    rc = util_fsync_dir(dirname(copy));
    free(copy);
    if (rc)
        util_fail(err, errlen, rc, "%s: written, but syncing its directory failed: %s", a->path, strerror(-rc));
    return rc;
out:
    util_afile_abort(a);
    return rc;
}

void util_futex_wake(void *counter64) { syscall(SYS_futex, (uint32_t *)counter64, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

void util_futex_wait(void *counter64, unsigned long long seen, double slice_s)
{
    struct timespec ts = {.tv_sec = (time_t)slice_s, .tv_nsec = (long)((slice_s - (double)(time_t)slice_s) * 1e9)};
    syscall(SYS_futex, (uint32_t *)counter64, FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0);
}
