/* Job shared-memory segments (see shm.h). */
#include "ipc/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/util.h"

#define NAME_LEN_MAX 63
/* "/ctitan.<job>.<name>" with the longest job and name shm_name_ok accepts, and the NUL */
#define SEG_PATH_MAX (sizeof("/" SHM_PREFIX) + NAME_LEN_MAX + 1 + NAME_LEN_MAX)

struct shm_seg {
    void *data;
    size_t size;
};

int shm_name_ok(const char *s)
{
    if (!s || !*s || strlen(s) > NAME_LEN_MAX)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-'))
            return 0;
    return 1;
}

static int seg_path(char *out, const char *job, const char *name, char *err, size_t errlen)
{
    if (!shm_name_ok(job) || !shm_name_ok(name))
        return util_fail(err, errlen, -EINVAL, "bad shared-memory name '%s.%s' (want [A-Za-z0-9_-])",
                         job ? job : "", name ? name : "");
    snprintf(out, SEG_PATH_MAX, "/" SHM_PREFIX "%s.%s", job, name);
    return 0;
}

/* Maps fd read-write, shared, without MAP_POPULATE: a process's page table gets only the pages
 * it touches (a shard its slice, a stage its stage's), each on first touch. Populating every
 * segment whole in every worker made each of them map all of every segment at set-up and at
 * each restart (a replaced shard of a ~160M job took 0.35 s to be ready, now 0.01 s) and held
 * page tables for all of it (BENCHMARKS.md "Segments mapped as touched"). The pages themselves
 * are allocated when the segment is made (shm_create), so a first touch never finds one
 * missing. */
static int map_fd(shm_seg_t **out, int fd, size_t size, const char *path, char *err, size_t errlen)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return util_fail(err, errlen, -errno, "%s: cannot map %zu bytes: %s", path, size,
                         strerror(errno));
    shm_seg_t *s = malloc(sizeof(*s));
    if (!s) {
        munmap(p, size);
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    }
    s->data = p;
    s->size = size;
    *out = s;
    return 0;
}

static shm_progress_fn progress_fn;
static void *progress_arg;

void shm_progress_hook(shm_progress_fn fn, void *arg)
{
    progress_fn = fn;
    progress_arg = arg;
}

int shm_create(shm_seg_t **out, const char *job, const char *name, size_t bytes, char *err,
               size_t errlen)
{
    char path[SEG_PATH_MAX];
    int rc = seg_path(path, job, name, err, errlen);
    if (rc)
        return rc;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes > SIZE_MAX - page) /* would wrap to a tiny segment below */
        return util_fail(err, errlen, -EINVAL, "%s: cannot create: size %zu too large", path,
                         bytes);
    size_t size = (bytes + page - 1) / page * page;
    if (!size)
        size = page;
    int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return util_fail(err, errlen, -errno, "%s: cannot create: %s", path, strerror(errno));
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = util_fail(err, errlen, -errno, "%s: cannot size to %zu bytes: %s", path, size,
                       strerror(errno));
        goto out;
    }
    /* Every page allocated now (a page missing later would be a SIGBUS in a worker, or a stall
     * on the hot path): fallocate, a piece at a time so that the progress hook can stop it. It
     * allocates tmpfs pages several times faster than faulting them in through a mapping, and
     * fills no page table of this process (no MAP_POPULATE): the creator, the coordinator,
     * maps only the pages it touches. A file system without fallocate has its pages touched. */
    int touch = 0;
    for (size_t at = 0; at < size && !touch; at += SHM_PROGRESS_BYTES) {
        size_t n = size - at < SHM_PROGRESS_BYTES ? size - at : SHM_PROGRESS_BYTES;
        if (fallocate(fd, 0, (off_t)at, (off_t)n) < 0) {
            if (errno == EOPNOTSUPP) {
                touch = 1;
                break;
            }
            rc = util_fail(err, errlen, -errno, "%s: cannot allocate %zu bytes: %s", path, size, strerror(errno));
            goto out;
        }
        if (progress_fn && progress_fn(progress_arg, name, at + n, size)) {
            rc = util_fail(err, errlen, -ECANCELED, "%s: set-up stopped", path);
            goto out;
        }
    }
    rc = map_fd(out, fd, size, path, err, errlen);
    if (rc || !touch)
        goto out;
    volatile char *p = (*out)->data;
    for (size_t i = 0; i < size; i += page) {
        p[i] = 0;
        if (progress_fn && (i + page) % SHM_PROGRESS_BYTES == 0 && progress_fn(progress_arg, name, i + page, size)) {
            shm_detach(out);
            rc = util_fail(err, errlen, -ECANCELED, "%s: set-up stopped", path);
            goto out;
        }
    }
out:
    close(fd);
    if (rc)
        shm_unlink(path);
    return rc;
}

int shm_attach(shm_seg_t **out, const char *job, const char *name, char *err, size_t errlen)
{
    char path[SEG_PATH_MAX];
    int rc = seg_path(path, job, name, err, errlen);
    if (rc)
        return rc;
    int fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return util_fail(err, errlen, -errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0)
        rc = util_fail(err, errlen, -errno, "%s: cannot stat: %s", path, strerror(errno));
    else if (st.st_size <= 0)
        rc = util_fail(err, errlen, -EINVAL, "%s: empty segment", path);
    else
        rc = map_fd(out, fd, (size_t)st.st_size, path, err, errlen);
    close(fd);
    return rc;
}

void shm_detach(shm_seg_t **ps)
{
    shm_seg_t *s = *ps;
    if (!s)
        return;
    munmap(s->data, s->size);
    free(s);
    *ps = NULL;
}

void *shm_data(const shm_seg_t *s) { return s->data; }
size_t shm_size(const shm_seg_t *s) { return s->size; }

int shm_unlink_name(const char *job, const char *name)
{
    char path[SEG_PATH_MAX];
    int rc = seg_path(path, job, name, NULL, 0);
    if (rc)
        return rc;
    return shm_unlink(path) < 0 ? -errno : 0;
}

int shm_list(const char *job, char (*names)[SHM_NAME_MAX], int max)
{
    if (!shm_name_ok(job))
        return -EINVAL;
    char prefix[SHM_NAME_MAX];
    int plen = snprintf(prefix, sizeof(prefix), SHM_PREFIX "%s.", job);
    DIR *d = opendir("/dev/shm");
    if (!d)
        return -errno;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, (size_t)plen) || !shm_name_ok(e->d_name + plen))
            continue;
        if (n < max)
            snprintf(names[n], SHM_NAME_MAX, "%s", e->d_name + plen);
        n++;
    }
    closedir(d);
    return n < max ? n : max;
}

int shm_remove_all(const char *job)
{
    char names[256][SHM_NAME_MAX];
    int removed = 0;
    for (;;) { /* a full listing may have left names out: list again until one is not full */
        int n = shm_list(job, names, 256), now = 0;
        if (n < 0)
            return n;
        for (int i = 0; i < n; i++)
            if (shm_unlink_name(job, names[i]) == 0)
                now++;
        removed += now;
        if (n < 256 || now == 0)
            return removed;
    }
}

/* ---- removing without waiting for the memory (shm_remove_all_async, shm_wait_freed) ---- */
/* A freer holds the shared side of FREE_LOCK while it unlinks; a launch waits for the exclusive
 * side. Whoever removes the file holds the exclusive side, and a holder checks that the file it
 * locked is still the one named, so a removed file is never waited on by mistake. */

#define FREE_PREFIX "ctitan-free."
#define FREE_LOCK "/dev/shm/" FREE_PREFIX "lock"
#define FREE_MAX 256
#define FREE_PATH_MAX 64

/* Whether descriptor fd is the file FREE_LOCK names now (not one removed meanwhile). */
static int free_lock_current(int fd)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(FREE_LOCK, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

/* Whether fd is this user's file: another user's (one that could hold it forever and make every
 * launch wait) is not taken as a freer's lock. */
static int free_lock_ours(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && st.st_uid == geteuid();
}

/* The freers' lock file opened (made when `make`) and flock()ed with `how`, the one named there
 * (whoever removes it does so holding its exclusive side); its descriptor, or -errno (-ENOENT:
 * there is none). The file lives only while freers run and is removed by the last of them, or
 * by shm_wait_freed, so nothing stays in /dev/shm. */
static int free_lock(int how, int make)
{
    for (;;) {
        int fd = open(FREE_LOCK, O_RDWR | O_NOFOLLOW | O_CLOEXEC | (make ? O_CREAT : 0), 0600);
        if (fd < 0)
            return -errno;
        if (!free_lock_ours(fd)) {
            close(fd);
            return -EACCES;
        }
        if (flock(fd, how) < 0) {
            int e = errno;
            close(fd);
            return -e;
        }
        if (free_lock_current(fd))
            return fd;
        close(fd);
    }
}

/* A detached process that unlinks paths[0, n) holding lk (the lock's shared side), in a session
 * of its own (the job's process-group kill spares it), every other descriptor closed and the
 * standard ones on /dev/null (a reader of the launch's output sees its end at once): the
 * intermediate child closes them before it forks the freer and is waited for, so once this
 * returns no descriptor of the caller's (the job's lock among them) is held by anyone else.
 * Only async-signal-safe calls after fork: the parent has threads. 0 or -errno. */
static int spawn_freer(char (*paths)[FREE_PATH_MAX], int n, int lk)
{
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        setsid();
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && null >= 0; fd++)
            dup2(null, fd);
        if (lk > 3)
            close_range(3, (unsigned)lk - 1, 0);
        close_range((unsigned)lk + 1, ~0U, 0);
        if (fork() != 0)
            _exit(0);
        for (int i = 0; i < n; i++)
            unlink(paths[i]);
        /* the last freer (none other holds the shared side) removes the lock file */
        if (flock(lk, LOCK_EX | LOCK_NB) == 0 && free_lock_current(lk))
            unlink(FREE_LOCK);
        _exit(0);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return 0;
}

int shm_remove_all_async(const char *job)
{
    static unsigned seq; /* this process's renames, numbered */
    char names[FREE_MAX][SHM_NAME_MAX], paths[FREE_MAX][FREE_PATH_MAX];
    int n = shm_list(job, names, FREE_MAX), moved = 0, removed = 0;
    if (n <= 0)
        return n;
    int lk = free_lock(LOCK_SH | LOCK_NB, 1);
    for (int i = 0; i < n; i++) {
        char from[SEG_PATH_MAX + 16];
        int done = 0;
        if ((size_t)snprintf(from, sizeof(from), "/dev/shm/" SHM_PREFIX "%s.%s", job, names[i]) >= sizeof(from))
            continue; /* not a name shm_list gives */
        for (int tries = 0; lk >= 0 && !done && tries < 8; tries++) { /* a name a dead process left: the next */
            snprintf(paths[moved], FREE_PATH_MAX, "/dev/shm/" FREE_PREFIX "%d.%u", (int)getpid(), seq++);
            done = renameat2(AT_FDCWD, from, AT_FDCWD, paths[moved], RENAME_NOREPLACE) == 0;
            if (!done && errno != EEXIST)
                break;
        }
        if (done)
            moved++, removed++;
        else
            removed += shm_unlink_name(job, names[i]) == 0;
    }
    if (moved && spawn_freer(paths, moved, lk))
        for (int i = 0; i < moved; i++)
            unlink(paths[i]);
    if (lk >= 0)
        close(lk);
    if (n == FREE_MAX) /* more than a listing holds: the rest as shm_remove_all does */
        removed += shm_remove_all(job);
    return removed;
}

/* Whether d_name is a segment renamed by shm_remove_all_async (not the lock). */
static int is_freed_name(const char *name)
{
    return !strncmp(name, FREE_PREFIX, strlen(FREE_PREFIX)) && strcmp(name, FREE_PREFIX "lock");
}

/* The bytes such segments still hold; with do_unlink, each unlinked (a dead freer's). */
static double freed_segments(int do_unlink)
{
    DIR *d = opendir("/dev/shm");
    double bytes = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        struct stat st;
        if (!is_freed_name(e->d_name) || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
            continue;
        bytes += (double)st.st_blocks * 512;
        if (do_unlink)
            unlinkat(dirfd(d), e->d_name, 0);
    }
    if (d)
        closedir(d);
    return bytes;
}

int shm_wait_freed(int (*say)(void *arg, double bytes), int (*stop)(void *arg), void *arg)
{
    util_every_t every;
    util_every_start(&every, SHM_WAIT_SAY_S);
    int fd;
    while ((fd = free_lock(LOCK_EX | LOCK_NB, 0)) == -EWOULDBLOCK) {
        if (stop && stop(arg))
            return -ECANCELED;
        if (say && util_every_due(&every) >= 0 && say(arg, freed_segments(0)))
            return -ECANCELED;
        nanosleep(&(struct timespec){0, (long)(SHM_WAIT_POLL_S * 1e9)}, NULL);
    }
    if (fd == -ENOENT) { /* no freer runs: only what a dead one left */
        freed_segments(1);
        return 0;
    }
    if (fd < 0) /* no lock to be had (another user's file): nothing of ours to wait for */
        return fd == -EACCES ? 0 : fd;
    freed_segments(1);
    unlink(FREE_LOCK);
    close(fd);
    return 0;
}

int shm_say_freeing(void *who, double bytes)
{
    fprintf(stderr, "%s: waiting for the memory of a stopped run to be freed (%.2f GiB left)\n", (const char *)who,
            bytes / (1024.0 * 1024.0 * 1024.0));
    return 0;
}

static int lock_path(char *out, const char *job, char *err, size_t errlen)
{
    if (!shm_name_ok(job))
        return util_fail(err, errlen, -EINVAL, "bad job name '%s' (want [A-Za-z0-9_-])", job ? job : "");
    snprintf(out, SEG_PATH_MAX, "/ctitan-lock.%s", job);
    return 0;
}

int shm_job_lock(const char *job, char *err, size_t errlen)
{
    char path[SEG_PATH_MAX], pid[32];
    int rc = lock_path(path, job, err, errlen);
    if (rc)
        return rc;
    for (;;) {
        int fd = shm_open(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0600);
        if (fd < 0)
            return util_fail(err, errlen, -errno, "/dev/shm%s: cannot open the job's lock: %s", path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
            int e = errno;
            ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
            close(fd);
            pid[n > 0 ? n : 0] = '\0';
            pid[strcspn(pid, "\n")] = '\0';
            if (e == EWOULDBLOCK)
                return util_fail(err, errlen, -EBUSY, "job '%s' is already running or being launched (the launch "
                                 "with pid %s holds /dev/shm%s): stop it or set job.name", job, pid[0] ? pid : "?",
                                 path);
            return util_fail(err, errlen, -e, "/dev/shm%s: cannot lock: %s", path, strerror(e));
        }
        /* the file may have been removed by the holder we waited on: ours must be the one named */
        struct stat a, b;
        char full[SEG_PATH_MAX + 16];
        snprintf(full, sizeof(full), "/dev/shm%s", path);
        if (fstat(fd, &a) == 0 && stat(full, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
            int k = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
            int told = ftruncate(fd, 0) == 0 && pwrite(fd, pid, (size_t)k, 0) == k;
            (void)told; /* the pid is only for the message of a launch refused */
            return fd;
        }
        close(fd);
    }
}

void shm_job_unlock(const char *job, int fd)
{
    char path[SEG_PATH_MAX];
    if (fd < 0)
        return;
    if (!lock_path(path, job, NULL, 0))
        shm_unlink(path);
    close(fd);
}
