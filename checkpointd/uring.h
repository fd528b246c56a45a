/* The io_uring stream under a checkpoint's writer (checkpointd/writer.h): files written
 * sequentially, each from offset 0, through a few registered 4 KiB-aligned buffers with
 * O_DIRECT where the filesystem takes it (buffered where it does not, e.g. tmpfs), several
 * writes in flight across file boundaries, every finished file fsynced at once at the end.
 * One stream per thread at a time; a process keeps one for its next checkpoint (setting one
 * up costs page faults on 32 MiB and pinning them). Not fork-safe: a child gets a new one.
 * Functions return 0 or -errno with the reason in err. */
#ifndef CTITAN_URING_H
#define CTITAN_URING_H

#include <stddef.h>
#include <stdint.h>

typedef struct uw uw_t;

/* A stream: the process's spare one, or a new one. */
int uw_get(uw_t **out, char *err, size_t errlen);
/* Gives it back: whatever is in flight or open is finished first (errors ignored: the caller
 * has failed already or succeeded), then it is kept as the spare or freed. */
void uw_put(uw_t *u);
/* Starts file `name` in directory dirfd (shown: its path in messages), truncated; the previous
 * file must have been ended. */
int uw_open(uw_t *u, int dirfd, const char *name, const char *shown, char *err, size_t errlen);
/* Appends n bytes to the open file. */
int uw_append(uw_t *u, const void *data, size_t n, char *err, size_t errlen);
/* Ends the open file: what is left of it is submitted, not waited for. */
int uw_end_file(uw_t *u, char *err, size_t errlen);
/* Every write collected, every ended file truncated to its size, fsynced and closed. */
int uw_sync(uw_t *u, char *err, size_t errlen);
/* Bytes appended to the open (or last) file; whether every file went O_DIRECT and whether
 * registered buffers were used. */
uint64_t uw_pos(const uw_t *u);
void uw_modes(const uw_t *u, int *direct, int *fixed);

/* The raw rate to compare against (bench): writes `bytes` to PATH sequentially through the
 * same path (O_DIRECT when possible, fsync included). Returns 0 and the seconds. */
int uw_raw_write(const char *path, uint64_t bytes, double *secs, int *direct, char *err, size_t errlen);

#endif
