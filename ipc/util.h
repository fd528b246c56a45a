/* Small helpers shared by the tools and libraries: error strings for the
 * "return -errno and say why in err" convention, whole writes and durable files, and a
 * monotonic clock. */
#ifndef CTITAN_UTIL_H
#define CTITAN_UTIL_H

#include <stddef.h>
#include <stdio.h>

/* Formats the message into err (when err and errlen are set) and returns rc. */
int util_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Opens a regular file read-only; returns the descriptor (size in *size) or -errno with
 * "PATH: cannot open: ..." / "PATH: not a regular file" (-EINVAL) in err. A FIFO or a device
 * is refused without blocking: the open itself is non-blocking. */
int util_open_regular(const char *path, size_t *size, char *err, size_t errlen);
/* A whole regular file of at most max bytes (util_open_regular) into a malloc'ed buffer, NUL
 * after its *len bytes (caller frees *buf). -EFBIG past max ("PATH: N bytes: more than a WHAT
 * has (MAX)"), -EIO when it shrank while read, other -errno; *buf is NULL on failure. */
int util_read_file(const char *path, size_t max, const char *what, char **buf, size_t *len, char *err,
                   size_t errlen);
/* write(2) until all n bytes are written (EINTR, EAGAIN and short writes retried).
 * Returns 0 or -errno. */
int util_write_all(int fd, const void *buf, size_t n);
/* read(2) (off < 0: at the file position) or pread(2) at off until n bytes are read or end of
 * file (EINTR, EAGAIN and short reads retried). Returns the bytes read (< n only at end of
 * file) or -errno. */
long util_read_all(int fd, void *buf, size_t n, long long off);
/* A long loop's "how far it is" lines: due once every_s seconds have passed since the start,
 * then every every_s after. util_every_due returns the seconds since the start when a line is
 * due (and counts it said), else -1. */
typedef struct {
    double t0, next, every;
} util_every_t;
void util_every_start(util_every_t *e, double every_s);
double util_every_due(util_every_t *e);
/* The interval of such lines (the launch's set-up, a shard's weight initialisation, the
 * end-of-run validation, checkpoint loads, imports, exports): 2 s, or for tests
 * CTITAN_TEST_SAY_S's seconds. */
double util_say_s(void);
/* Writes s to fp as a JSON string: quoted, '"' and '\\' escaped, control characters as \u00XX. */
void util_json_string(FILE *fp, const char *s);
/* mkdir -p with mode 0755. Returns 0 or -errno. */
int util_mkdirs(const char *path);
/* fsync of a directory (after a rename into it). Returns 0 or -errno. */
int util_fsync_dir(const char *dir);

/* A file written durably: PATH.tmp.XXXXXX beside it (mode 0644), then fsync, rename onto
 * PATH, fsync of its directory. PATH is never seen half-written; abort removes the
 * temporary file. Errors name the file. */
typedef struct {
    const char *path;
    char *tmp;
    int fd;
} util_afile_t;
int util_afile_begin(util_afile_t *a, const char *path, char *err, size_t errlen);
int util_afile_write(util_afile_t *a, const void *buf, size_t n, char *err, size_t errlen);
int util_afile_commit(util_afile_t *a, char *err, size_t errlen); /* aborts on failure */
void util_afile_abort(util_afile_t *a);

/* Shared-memory layouts (rings, the loader's segment) put headers and slots on their own pages. */
#define UTIL_PAGE 4096u
static inline size_t util_round_page(size_t n) { return (n + UTIL_PAGE - 1) / UTIL_PAGE * UTIL_PAGE; }

/* Seconds on CLOCK_MONOTONIC. */
double util_now(void);
/* Futexes on a 64-bit counter in shared memory, on its low 32 bits (x86-64 is little-endian):
 * wake every waiter; sleep while the counter still holds `seen` (low 32 bits), at most
 * `slice_s` seconds (EAGAIN, EINTR and a wake just return: the caller checks again). */
void util_futex_wake(void *counter64);
void util_futex_wait(void *counter64, unsigned long long seen, double slice_s);

#endif
