/* Small helpers shared by the tools and libraries: error strings for the
 * "return -errno and say why in err" convention, and a monotonic clock. */
#ifndef CTITAN_UTIL_H
#define CTITAN_UTIL_H

#include <stddef.h>

/* Formats the message into err (when err and errlen are set) and returns rc. */
int util_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Opens a regular file read-only; returns the descriptor (size in *size) or -errno with
 * "PATH: cannot open: ..." / "PATH: not a regular file" in err. */
int util_open_regular(const char *path, size_t *size, char *err, size_t errlen);
/* Seconds on CLOCK_MONOTONIC. */
double util_now(void);

#endif
