/* A checkpoint folder (see ckpt.h): its step-N folders, the newest that verifies or loads (resuming),
 * and retention (the newest k, and temporaries of writers that are gone). */
#include "checkpointd/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc/util.h"

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Step directories of dir, ascending; with_index: only those holding an index. */
static int list_steps(const char *dir, int with_index, int64_t **steps)
{
    *steps = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = ckpt_step_of(e->d_name);
        struct stat st;
        /* a checkpoint is a real directory, as a writer makes it: never one through a link */
        if (s < 0 || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISDIR(st.st_mode))
            continue;
        if (with_index) {
            char p[PATH_MAX];
            snprintf(p, sizeof(p), "%s/index", e->d_name);
            if (fstatat(dirfd(d), p, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
                continue;
        }
        if (n == cap) {
            int64_t *g = realloc(*steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof(int64_t));
            if (!g) {
                closedir(d);
                free(*steps);
                *steps = NULL;
                return -ENOMEM;
            }
            *steps = g;
        }
        (*steps)[n++] = s;
    }
    closedir(d);
    if (n)
        qsort(*steps, (size_t)n, sizeof(int64_t), cmp_i64);
    return n;
}

int ckpt_list(const char *dir, int64_t **steps) { return list_steps(dir, 1, steps); }

/* What find_latest tries on each checkpoint of a folder, newest first: 0 takes it; else
 * *pass = 1 passes over it to an older one (its problems a line each on `report`, which may be
 * NULL, *n_bad of them, err the summary), *pass = 0 ends the search with that error. */
typedef int (*try_fn)(void *arg, const char *path, FILE *report, int *n_bad, int *pass, char *err, size_t errlen);

static int find_latest(const char *dir, try_fn attempt, void *arg, char *path, size_t n, FILE *log, char *err,
                       size_t errlen)
{
    int64_t *steps;
    int k = list_steps(dir, 0, &steps);
    if (k < 0)
        return util_fail(err, errlen, k, "%s: %s", dir, strerror(-k));
    if (k == 0)
        return util_fail(err, errlen, -ENOENT, "%s: no checkpoint", dir);
    for (int i = k - 1; i >= 0; i--) {
        char p[PATH_MAX], why[1024] = "", *first = NULL;
        size_t flen = 0;
        ckpt_step_path(p, sizeof(p), dir, steps[i]);
        FILE *mem = open_memstream(&first, &flen);
        int bad_n = 0, pass = 1;
        int v = attempt(arg, p, mem, &bad_n, &pass, why, sizeof(why));
        if (mem)
            fclose(mem);
        if (v == 0 || !pass) { /* taken, or the search ends */
            if (v)
                util_fail(err, errlen, v, "%s", why);
            else
                snprintf(path, n, "%s", p);
            free(first);
            free(steps);
            return v;
        }
        if (log) {
            if (first && first[0]) {
                first[strcspn(first, "\n")] = 0;
                fprintf(log, "checkpoint %s is not loadable (%s%s): falling back to an older one\n", p, first,
                        bad_n > 1 ? ", and more" : "");
            } else {
                fprintf(log, "checkpoint %s is not loadable (%s): falling back to an older one\n", p, why);
            }
        }
        free(first);
    }
    free(steps);
    return util_fail(err, errlen, -EBADMSG, "%s: no checkpoint there verifies", dir);
}

/* ckpt_find_latest's test: the whole checkpoint verifies; any problem passes over it. */
static int verify_try(void *arg, const char *path, FILE *report, int *n_bad, int *pass, char *err, size_t errlen)
{
    (void)arg;
    *pass = 1;
    return ckpt_verify(path, report, n_bad, err, errlen);
}

int ckpt_find_latest(const char *dir, char *path, size_t n, FILE *log, char *err, size_t errlen)
{
    return find_latest(dir, verify_try, NULL, path, n, log, err, errlen);
}

typedef struct {
    ckpt_load_fn load;
    void *arg;
} loading_t;

/* ckpt_find_loading's test: the files all there, then the load; damaged data passes it over. */
static int load_try(void *arg, const char *path, FILE *report, int *n_bad, int *pass, char *err, size_t errlen)
{
    const loading_t *l = arg;
    int corrupt = 0, rc = ckpt_check_files(path, report, n_bad, err, errlen);
    *pass = 1;
    if (rc)
        return rc;
    rc = l->load(l->arg, path, &corrupt, err, errlen);
    if (rc && corrupt) {
        *n_bad = 1;
        if (report)
            fprintf(report, "%s\n", err);
    }
    *pass = corrupt;
    return rc == -ENOENT ? -EBADMSG : rc; /* -ENOENT is the folder's: no checkpoint at all */
}

int ckpt_find_loading(const char *dir, ckpt_load_fn load, void *arg, char *path, size_t n, FILE *log, char *err,
                      size_t errlen)
{
    loading_t l = {load, arg};
    return find_latest(dir, load_try, &l, path, n, log, err, errlen);
}

int ckpt_remove_dir(const char *path)
{
    /* only a real directory: a link (to anywhere) is left as it is, and nothing through it */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : errno == ENOTDIR ? -ELOOP : -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -errno;
    }
    /* the index first: from then on no reader takes this for a checkpoint */
    int rc = unlinkat(dirfd(d), "index", 0) < 0 && errno != ENOENT ? -errno : 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "index") && strcmp(e->d_name, "..") && unlinkat(dirfd(d), e->d_name, 0) < 0 && !rc)
            rc = -errno;
    closedir(d);
    if (!rc && rmdir(path) < 0)
        rc = -errno;
    return rc;
}

int ckpt_set_aside(const char *path, char *aside, size_t n)
{
    struct stat st;
    if ((size_t)snprintf(aside, n, "%s.damaged", path) >= n)
        return -ENAMETOOLONG;
    for (int k = 2; k < 100 && !lstat(aside, &st); k++)
        snprintf(aside, n, "%s.damaged.%d", path, k);
    return rename(path, aside) ? -errno : 0;
}

int ckpt_retain(const char *dir, int keep)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    struct dirent *e;
    while ((e = readdir(d))) { /* .tmp-step-N.PID of writers that are gone */
        int64_t step;
        long pid;
        if (!ckpt_tmp_of(e->d_name, &step, &pid))
            continue;
        if (pid > 0 && (kill((pid_t)pid, 0) == 0 || errno != ESRCH))
            continue;
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        ckpt_remove_dir(p);
    }
    closedir(d);
    if (keep <= 0)
        return 0;
    int64_t *steps;
    int n = ckpt_list(dir, &steps), removed = 0;
    if (n < 0)
        return n;
    for (int i = 0; i + keep < n; i++) {
        char p[PATH_MAX];
        ckpt_step_path(p, sizeof(p), dir, steps[i]);
        if (ckpt_remove_dir(p) == 0)
            removed++;
    }
    free(steps);
    return removed;
}
