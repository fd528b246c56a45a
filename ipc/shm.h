/* Named POSIX shared-memory segments of one job: /dev/shm/ctitan.<job>.<name>. The
 * coordinator creates each once (mode 0600, exclusive), sizes it and allocates every page
 * (fallocate), and removes them all at exit; workers map the existing segments for their whole
 * life, each page entering a worker's page table when it first touches it (a minor fault, never
 * a missing page: BENCHMARKS.md "Segments mapped as touched"). */
#ifndef CTITAN_SHM_H
#define CTITAN_SHM_H

#include <stddef.h>

#define SHM_PREFIX "ctitan."
#define SHM_NAME_MAX 128

typedef struct shm_seg shm_seg_t;

/* Told, while shm_create touches the pages of a new segment, how far it is (every
 * SHM_PROGRESS_BYTES); a nonzero return gives the segment up: shm_create
 * removes it and returns -ECANCELED. One hook for the process (the coordinator's set-up sets
 * it: a Ctrl-C stops a long set-up at once, and it says how far it is); NULL: none. */
#define SHM_PROGRESS_BYTES ((size_t)64 << 20)
typedef int (*shm_progress_fn)(void *arg, const char *name, size_t done, size_t total);
void shm_progress_hook(shm_progress_fn fn, void *arg);
/* Creates /ctitan.<job>.<name> of `bytes` (rounded up to a page), zero-filled, every page allocated.
 * job and name are [A-Za-z0-9_-]. Returns 0, -EEXIST when it exists, -ECANCELED when the
 * progress hook gave it up, or -errno; err says
 * which segment and why. The caller owns *out. */
int shm_create(shm_seg_t **out, const char *job, const char *name, size_t bytes, char *err,
               size_t errlen);
/* Maps an existing segment read-write, whole; its pages enter this process's page table as it
 * touches them (no MAP_POPULATE). */
int shm_attach(shm_seg_t **out, const char *job, const char *name, char *err, size_t errlen);
/* Unmaps (never unlinks). */
void shm_detach(shm_seg_t **s);

void *shm_data(const shm_seg_t *s);
size_t shm_size(const shm_seg_t *s);

/* Removes /ctitan.<job>.<name>; 0 or -errno (-ENOENT when absent). */
int shm_unlink_name(const char *job, const char *name);
/* Names (the <name> part) of the job's segments present now, up to max; returns the count
 * or -errno. */
int shm_list(const char *job, char (*names)[SHM_NAME_MAX], int max);
/* Removes every segment of the job; returns how many or -errno. The kernel frees a segment's
 * memory as it is unlinked (~7 GB/s on the development VM): seconds for a large job. */
int shm_remove_all(const char *job);
/* The same, returning before that memory is freed, for a stop that must not wait for it (a
 * Ctrl-C): each segment is renamed out of the job's names at once (/dev/shm/ctitan-free.<pid>.<k>;
 * the job's names are free for its next launch) and a detached process (its own session: the
 * job's process-group kill spares it) unlinks them, holding a shared lock on
 * /dev/shm/ctitan-free.lock while it does (the last such process removes the file);
 * shm_wait_freed waits for that. Where no process can be started they are unlinked here.
 * Returns how many or -errno. */
int shm_remove_all_async(const char *job);
/* Before a launch sizes itself against the host's memory: waits until the memory of segments
 * shm_remove_all_async removed is freed (the lock's exclusive side), calling say(arg, bytes
 * still held) every SHM_WAIT_SAY_S seconds and stop(arg) every SHM_WAIT_POLL_S while it waits
 * (either may be NULL; a nonzero return of either stops the wait: -ECANCELED, so that a Ctrl-C
 * the caller reads itself ends it within SHM_WAIT_POLL_S), then unlinks any such segment whose
 * freer died. Returns 0, -ECANCELED or -errno. */
#define SHM_WAIT_SAY_S 2.0
#define SHM_WAIT_POLL_S 0.02
int shm_wait_freed(int (*say)(void *arg, double bytes), int (*stop)(void *arg), void *arg);
/* A `say` that says so on stderr, its line starting with who (a const char *): "WHO: waiting
 * for the memory of a stopped run to be freed (N GiB left)"; returns 0. */
int shm_say_freeing(void *who, double bytes);

/* The job name's exclusive lock, /dev/shm/ctitan-lock.<job> (outside the job's segments'
 * names, which shm_remove_all removes): held by the process that launches the job for the
 * job's whole life (its fork()ed coordinator shares it; exec'ed workers do not), released by
 * the kernel when every holder is gone, however it ended. Returns the lock's descriptor, or
 * -EBUSY naming the pid that holds it (another launch of this name, starting or running), or
 * -errno. */
int shm_job_lock(const char *job, char *err, size_t errlen);
/* Removes the lock file while holding it, then closes fd (fd < 0: nothing). */
void shm_job_unlock(const char *job, int fd);

/* Whether s is a valid job or segment name. */
int shm_name_ok(const char *s);

#endif
