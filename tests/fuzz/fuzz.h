/* What the libFuzzer harnesses of tests/fuzz/ share: a check that crashes the run when a
 * property of a decoder fails (a crash is what libFuzzer records), and a memfd standing in for
 * a file for the readers that take paths. Header-only: each harness is one program. */
#ifndef CTITAN_FUZZ_H
#define CTITAN_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property every accepted input must have (a round trip, a bound): abort with where and why. */
#define FUZZ_CHECK(cond, ...)                                                   \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* /proc/self/fd/N of one memfd per process holding exactly data[0, size): the readers open
 * and map it like a file, and nothing is left on disk. NULL if the memfd cannot be written. */
static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("ctitan-fuzz", MFD_CLOEXEC);
        if (fd < 0)
            return NULL;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) || ftruncate(fd, (off_t)size))
        return NULL;
    size_t off = 0;
    while (off < size) {
        ssize_t k = pwrite(fd, data + off, size - off, (off_t)off);
        if (k <= 0)
            return NULL;
        off += (size_t)k;
    }
    return path;
}

#endif
