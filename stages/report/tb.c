/* TensorBoard event files (see tb.h): Events encoded by protobuf-c from stages/report/tb_event.proto
 * (the Makefile runs protoc-c into the build folder), framed as TFRecords, whose checksums are
 * ISA-L's CRC32C (Debian has no package of Google's crc32c; libisal's crc32_iscsi is the same
 * Castagnoli CRC, with SSE4.2 and PCLMUL code). */
#include "stages/report/tb.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <isa-l/crc.h>

#include "ipc/util.h"
#include "stages/report/tb_event.pb-c.h"

/* The most names tried for one open (the last number of the name) before giving up. */
#define TB_MAX_TRIES 1000

struct tb {
    int fd;
    int rc;         /* the first failure (-errno), also every later tb_flush's */
    uint8_t *buf;   /* the records tb_flush has not written yet */
    size_t len, cap;
    char path[PATH_MAX];
};

/* TFRecord's checksum: CRC32C (crc32_iscsi leaves out the final inversion), rotated and offset
 * so that a CRC over data holding CRCs is not degenerate. */
static uint32_t masked_crc(const uint8_t *p, size_t n)
{
    uint32_t crc = ~crc32_iscsi((unsigned char *)p, (int)n, 0xffffffffu); /* it only reads p */
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* One record into the buffer: length (8 bytes, little-endian), its masked CRC, the packed
 * Event, the Event's masked CRC. */
static int put_event(tb_t *tb, const Tensorboard__Event *ev)
{
    if (tb->rc)
        return tb->rc;
    size_t n = tensorboard__event__get_packed_size(ev), need = tb->len + 8 + 4 + n + 4;
    if (need > tb->cap) {
        size_t cap = need > 2 * tb->cap ? need : 2 * tb->cap;
        uint8_t *b = realloc(tb->buf, cap);
        if (!b)
            return tb->rc = -ENOMEM;
        tb->buf = b;
        tb->cap = cap;
    }
    uint8_t *p = tb->buf + tb->len;
    put_le(p, n, 8);
    put_le(p + 8, masked_crc(p, 8), 4);
    tensorboard__event__pack(ev, p + 12);
    put_le(p + 12 + n, masked_crc(p + 12, n), 4);
    tb->len = need;
    return 0;
}

double tb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *tb_path(const tb_t *tb) { return tb->path; }

int tb_scalar(tb_t *tb, const char *tag, int64_t step, double value, double wall_time)
{
    Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag; /* packing only reads it */
    v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE; /* a oneof: 0.0 is written too */
    v.simple_value = (float)value;
    Tensorboard__Summary__Value *vs[] = {&v};
    Tensorboard__Summary s = TENSORBOARD__SUMMARY__INIT;
    s.n_value = 1;
    s.value = vs;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &s;
    return put_event(tb, &ev);
}

int tb_flush(tb_t *tb, char *err, size_t errlen)
{
    if (!tb->rc && tb->len) {
        tb->rc = util_write_all(tb->fd, tb->buf, tb->len);
        tb->len = 0;
    }
    if (tb->rc)
        return util_fail(err, errlen, tb->rc, "%s: cannot write: %s", tb->path, strerror(-tb->rc));
    return 0;
}

void tb_close(tb_t **p)
{
    tb_t *tb = *p;
    if (!tb)
        return;
    if (tb->fd >= 0)
        close(tb->fd);
    free(tb->buf);
    free(tb);
    *p = NULL;
}

/* The largest <unix time> in the names of dir's event files, or -1. */
static long long newest_file_time(const char *dir)
{
    long long newest = -1;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *p = e->d_name + strlen(TB_FILE_PREFIX);
        char *end;
        if (strncmp(e->d_name, TB_FILE_PREFIX, strlen(TB_FILE_PREFIX)) || *p < '0' || *p > '9')
            continue;
        long long t = strtoll(p, &end, 10);
        if (*end == '.' && t > newest)
            newest = t;
    }
    if (d)
        closedir(d);
    return newest;
}

/* A new file of the TensorFlow name in dir: the first free last number. */
static int create_file(tb_t *tb, const char *dir, long long now, char *err, size_t errlen)
{
    char host[256];
    if (gethostname(host, sizeof(host)) < 0)
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = 0;
    for (int i = 0; i < TB_MAX_TRIES; i++) {
        int n = snprintf(tb->path, sizeof(tb->path), "%s/" TB_FILE_PREFIX "%lld.%s.%d.%d", dir, now, host,
                         (int)getpid(), i);
        if (n < 0 || (size_t)n >= sizeof(tb->path))
            return util_fail(err, errlen, -ENAMETOOLONG, "%s: the event file's name is too long", dir);
        tb->fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (tb->fd >= 0)
            return 0;
        if (errno != EEXIST)
            return util_fail(err, errlen, -errno, "%s: cannot create: %s", tb->path, strerror(errno));
    }
    return util_fail(err, errlen, -EEXIST, "%s: %d event files of this second and process exist already", dir,
                     TB_MAX_TRIES);
}

int tb_open(tb_t **out, const char *dir, int64_t first_step, char *err, size_t errlen)
{
    *out = NULL;
    tb_t *tb = calloc(1, sizeof(*tb));
    if (!tb)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", dir);
    tb->fd = -1;
    int rc = util_mkdirs(dir);
    if (rc) {
        tb_close(&tb);
        return util_fail(err, errlen, rc, "%s: cannot create the folder: %s", dir, strerror(-rc));
    }
    /* TensorBoard reads a folder's files in name order and at our START drops the steps it has
     * read from that step on: a new file must sort after the folder's others. One opened in the
     * same second as the newest (a relaunch without backoff) waits for the next second; a name
     * further ahead (another machine's clock) is left as it is. */
    double now = tb_now();
    long long newest = newest_file_time(dir);
    while (newest == (long long)now) {
        long ns = (long)(((double)(newest + 1) - now) * 1e9) + 1000;
        nanosleep(&(struct timespec){ns / 1000000000L, ns % 1000000000L}, NULL);
        now = tb_now();
    }
    if ((rc = create_file(tb, dir, (long long)now, err, errlen))) {
        tb_close(&tb);
        return rc;
    }
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT, start = TENSORBOARD__EVENT__INIT;
    ev.wall_time = now;
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = TB_FILE_VERSION;
    Tensorboard__SessionLog log = TENSORBOARD__SESSION_LOG__INIT;
    log.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
    start.wall_time = now;
    start.step = first_step;
    start.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
    start.session_log = &log;
    if ((rc = put_event(tb, &ev)) || (rc = put_event(tb, &start)) || (rc = tb_flush(tb, err, errlen))) {
        if (rc == -ENOMEM)
            util_fail(err, errlen, rc, "%s: out of memory", tb->path);
        unlink(tb->path); /* without its first records: no event file */
        tb_close(&tb);
        return rc;
    }
    *out = tb;
    return 0;
}
