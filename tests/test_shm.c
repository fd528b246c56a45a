/* Tests of the job shared-memory segments (ipc/shm.c) that every ring and tensor hand-off
 * between ctitan processes lives in: naming, sizes, modes, sharing across real processes,
 * and listing/removal by job. Segments are named after this run's pid and all removed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ipc/shm.h"
#include "ipc/util.h"
#include "tests/testutil.h"

/* This run's jobs: job_a, job_ab (job_a is a prefix of it) and a longest-possible job name. */
static char job_a[32], job_ab[40], job_long[64];

static void expect_segment_count(const char *job, int want)
{
    char names[8][SHM_NAME_MAX];
    assert_int_equal(shm_list(job, names, 8), want);
}

/* ---- child processes ------------------------------------------------------------------ */

/* A child runs plain C checks, never cmocka's asserts (they would unwind into the child's
 * copy of the test runner); the first failed check prints itself and becomes exit status 1. */
#define CHECK(c)                                                                            \
    do {                                                                                    \
        if (!(c)) {                                                                         \
            fprintf(stderr, "%s:%d: check failed in child: %s\n", __FILE__, __LINE__, #c);  \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

#define MAX_KIDS 8
static pid_t kids[MAX_KIDS];

static pid_t spawn(int (*fn)(void *), void *arg)
{
    fflush(NULL); /* or buffered output would be written twice */
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30); /* last resort should the parent be gone; its own limits are shorter */
        _exit(fn(arg));
    }
    assert_true(pid > 0);
    for (int i = 0; i < MAX_KIDS; i++)
        if (!kids[i]) {
            kids[i] = pid;
            break;
        }
    return pid;
}

/* tu_reap, and the child is no longer one to clean up. */
static int reap(pid_t pid, double timeout_s)
{
    int rc = tu_reap(pid, timeout_s, NULL);
    for (int i = 0; i < MAX_KIDS; i++)
        if (kids[i] == pid)
            kids[i] = 0;
    return rc;
}

/* ---- fixture -------------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    snprintf(job_a, sizeof(job_a), "t%d", (int)getpid());
    snprintf(job_ab, sizeof(job_ab), "%sb", job_a);
    memset(job_long, 'L', 63);
    memcpy(job_long, job_a, strlen(job_a));
    job_long[63] = '\0';
    return 0;
}

/* Kills and reaps any child a failed test left behind, and removes every segment of this
 * run's jobs; fails the test if any was left over. */
static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < MAX_KIDS; i++)
        if (kids[i]) {
            kill(kids[i], SIGKILL);
            waitpid(kids[i], NULL, 0);
            kids[i] = 0;
        }
    shm_wait_freed(NULL, NULL, NULL); /* a failed test's renamed segments and the freers' lock file */
    int left = 0;
    left += shm_remove_all(job_a);
    left += shm_remove_all(job_ab);
    left += shm_remove_all(job_long);
    if (left)
        fprintf(stderr, "teardown: %d segment(s) were left over\n", left);
    return left ? -1 : 0;
}

/* ---- tests ---------------------------------------------------------------------------- */

typedef struct {
    size_t size;
} share_arg_t;

static int child_checks_and_answers(void *p)
{
    share_arg_t *a = p;
    shm_seg_t *s = NULL;
    char err[256];
    CHECK(shm_attach(&s, job_a, "share", err, sizeof(err)) == 0);
    CHECK(shm_size(s) == a->size);
    unsigned char *d = shm_data(s);
    size_t half = a->size / 2;
    for (size_t i = 0; i < half; i++)
        CHECK(d[i] == (unsigned char)(i * 7 + 1));
    for (size_t i = half; i < a->size; i++)
        d[i] = (unsigned char)(i * 3 + 5);
    shm_detach(&s);
    CHECK(s == NULL);
    return 0;
}

static void test_shm_create_attach_detach_shares_data_between_processes(void **state)
{
    shm_seg_t *s = NULL;
    char err[256] = "";
    assert_int_equal(shm_create(&s, job_a, "share", 3 * 4096, err, sizeof(err)), 0);
    unsigned char *d = shm_data(s);
    size_t size = shm_size(s), half = size / 2;
    for (size_t i = 0; i < half; i++)
        d[i] = (unsigned char)(i * 7 + 1);
    share_arg_t a = {.size = size};
    assert_int_equal(reap(spawn(child_checks_and_answers, &a), 5), 0);
    for (size_t i = half; i < size; i++)
        if (d[i] != (unsigned char)(i * 3 + 5))
            fail_msg("byte %zu written by the child reads %u", i, d[i]);
    shm_detach(&s);
    assert_null(s);
    assert_int_equal(shm_unlink_name(job_a, "share"), 0);
}

static void test_shm_create_of_existing_segment_fails_with_eexist_naming_it(void **state)
{
    shm_seg_t *s = NULL, *t = NULL;
    char err[256] = "", want[128];
    assert_int_equal(shm_create(&s, job_a, "dup", 4096, err, sizeof(err)), 0);
    ((char *)shm_data(s))[0] = 42;
    assert_int_equal(shm_create(&t, job_a, "dup", 4096, err, sizeof(err)), -EEXIST);
    assert_null(t);
    snprintf(want, sizeof(want), "ctitan.%s.dup", job_a);
    assert_non_null(strstr(err, want));
    /* the failed create must leave the existing segment alone */
    assert_int_equal(shm_attach(&t, job_a, "dup", err, sizeof(err)), 0);
    assert_int_equal(((char *)shm_data(t))[0], 42);
    shm_detach(&t);
    shm_detach(&s);
    assert_int_equal(shm_unlink_name(job_a, "dup"), 0);
}

static void test_shm_attach_of_missing_segment_fails_naming_it(void **state)
{
    shm_seg_t *s = NULL;
    char err[256] = "", want[128];
    assert_int_equal(shm_attach(&s, job_a, "missing", err, sizeof(err)), -ENOENT);
    assert_null(s);
    snprintf(want, sizeof(want), "ctitan.%s.missing", job_a);
    assert_non_null(strstr(err, want));
    assert_int_equal(shm_unlink_name(job_a, "missing"), -ENOENT);
}

static void test_shm_segment_mode_is_0600_whatever_the_umask(void **state)
{
    shm_seg_t *s = NULL;
    char err[256] = "", path[160];
    mode_t old = umask(0);
    int rc = shm_create(&s, job_a, "mode", 1, err, sizeof(err));
    umask(old);
    assert_int_equal(rc, 0);
    snprintf(path, sizeof(path), "/dev/shm/ctitan.%s.mode", job_a);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(st.st_uid, getuid());
    shm_detach(&s);
    assert_int_equal(shm_unlink_name(job_a, "mode"), 0);
    assert_int_equal(stat(path, &st), -1);
}

static void test_shm_sizes_round_up_to_a_page(void **state)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct {
        size_t ask, want;
    } cases[] = {{0, page}, {1, page}, {page - 1, page}, {page, page}, {page + 1, 2 * page},
                 {5 * page + 17, 6 * page}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        shm_seg_t *s = NULL, *t = NULL;
        char err[256] = "", path[160];
        assert_int_equal(shm_create(&s, job_a, "size", cases[i].ask, err, sizeof(err)), 0);
        assert_int_equal(shm_size(s), cases[i].want);
        snprintf(path, sizeof(path), "/dev/shm/ctitan.%s.size", job_a);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal((size_t)st.st_size, cases[i].want);
        /* every page is allocated already, not left to a first touch on the hot path */
        assert_true((size_t)st.st_blocks * 512 >= cases[i].want);
        assert_int_equal(shm_attach(&t, job_a, "size", err, sizeof(err)), 0);
        assert_int_equal(shm_size(t), cases[i].want);
        ((volatile char *)shm_data(t))[cases[i].want - 1] = 1; /* the last byte is mapped */
        shm_detach(&t);
        shm_detach(&s);
        assert_int_equal(shm_unlink_name(job_a, "size"), 0);
    }
}

/* A size near SIZE_MAX must not wrap around to a one-page segment, and a size tmpfs cannot
 * hold must fail without leaving the segment behind. */
static void test_shm_create_rejects_sizes_that_overflow(void **state)
{
    size_t huge[] = {SIZE_MAX, SIZE_MAX - 100, (SIZE_MAX >> 1) + 1};
    for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
        shm_seg_t *s = NULL;
        char err[256] = "", want[128];
        int rc = shm_create(&s, job_a, "huge", huge[i], err, sizeof(err));
        if (rc == 0) {
            size_t got = shm_size(s);
            shm_detach(&s);
            fail_msg("created a segment of %zu bytes when asked for %zu", got, huge[i]);
        }
        assert_true(rc < 0);
        assert_null(s);
        snprintf(want, sizeof(want), "ctitan.%s.huge", job_a);
        assert_non_null(strstr(err, want));
        expect_segment_count(job_a, 0);
    }
}

static void test_shm_bad_names_are_rejected(void **state)
{
    char n63[64], n64[65];
    memset(n63, 'x', 63);
    n63[63] = '\0';
    memset(n64, 'x', 64);
    n64[64] = '\0';
    const char *bad[] = {"", "a/b", "/a", "a.b", ".", "..", "a b", "a\nb", "tab\t", "é", n64};
    const char *good[] = {"a", "A-Z_09", "-", n63};
    assert_false(shm_name_ok(NULL));
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        shm_seg_t *s = NULL;
        char err[256] = "";
        if (shm_name_ok(bad[i]))
            fail_msg("accepted bad name '%s'", bad[i]);
        assert_int_equal(shm_create(&s, job_a, bad[i], 4096, err, sizeof(err)), -EINVAL);
        assert_null(s);
        assert_non_null(strstr(err, "bad shared-memory name"));
        assert_int_equal(shm_create(&s, bad[i], "seg", 4096, err, sizeof(err)), -EINVAL);
        assert_int_equal(shm_attach(&s, job_a, bad[i], err, sizeof(err)), -EINVAL);
        assert_int_equal(shm_attach(&s, bad[i], "seg", err, sizeof(err)), -EINVAL);
        assert_null(s);
        assert_int_equal(shm_unlink_name(job_a, bad[i]), -EINVAL);
        assert_int_equal(shm_unlink_name(bad[i], "seg"), -EINVAL);
        char names[1][SHM_NAME_MAX];
        assert_int_equal(shm_list(bad[i], names, 1), -EINVAL);
        assert_int_equal(shm_remove_all(bad[i]), -EINVAL);
    }
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (!shm_name_ok(good[i]))
            fail_msg("rejected good name '%s'", good[i]);
    shm_seg_t *s = NULL;
    assert_int_equal(shm_create(&s, NULL, "seg", 4096, NULL, 0), -EINVAL);
    assert_int_equal(shm_create(&s, job_a, NULL, 4096, NULL, 0), -EINVAL);
    expect_segment_count(job_a, 0);
}

/* Every pair of names shm_name_ok accepts must give its own segment, even the longest ones
 * (the path was once cut to SHM_NAME_MAX bytes, so long names collided). */
static void test_shm_longest_names_make_distinct_segments(void **state)
{
    char n1[64], n2[64], err[256] = "";
    memset(n1, 'n', 63);
    n1[63] = '\0';
    memcpy(n2, n1, sizeof(n1));
    n2[62] = 'm';
    shm_seg_t *s1 = NULL, *s2 = NULL;
    assert_int_equal(shm_create(&s1, job_long, n1, 4096, err, sizeof(err)), 0);
    if (shm_create(&s2, job_long, n2, 4096, err, sizeof(err))) {
        shm_detach(&s1);
        fail_msg("second long name: %s", err);
    }
    assert_ptr_not_equal(shm_data(s1), shm_data(s2));
    ((char *)shm_data(s1))[0] = 1;
    ((char *)shm_data(s2))[0] = 2;
    assert_int_equal(((char *)shm_data(s1))[0], 1);

    char names[4][SHM_NAME_MAX];
    assert_int_equal(shm_list(job_long, names, 4), 2);
    assert_true((!strcmp(names[0], n1) && !strcmp(names[1], n2)) ||
                (!strcmp(names[0], n2) && !strcmp(names[1], n1)));
    char path[300];
    snprintf(path, sizeof(path), "/dev/shm/ctitan.%s.%s", job_long, n1);
    assert_int_equal(access(path, F_OK), 0);
    shm_detach(&s1);
    shm_detach(&s2);
    assert_int_equal(shm_remove_all(job_long), 2);
    assert_int_equal(access(path, F_OK), -1);
}

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

static void test_shm_list_and_remove_all_see_exactly_the_jobs_segments(void **state)
{
    const char *mine[] = {"a", "b-1", "c_2"}, *theirs[] = {"a", "x"};
    char err[256] = "";
    for (int i = 0; i < 3; i++) {
        shm_seg_t *s = NULL;
        assert_int_equal(shm_create(&s, job_a, mine[i], 4096, err, sizeof(err)), 0);
        shm_detach(&s);
    }
    for (int i = 0; i < 2; i++) {
        shm_seg_t *s = NULL;
        assert_int_equal(shm_create(&s, job_ab, theirs[i], 4096, err, sizeof(err)), 0);
        shm_detach(&s);
    }
    char names[8][SHM_NAME_MAX];
    int n = shm_list(job_a, names, 8);
    assert_int_equal(n, 3);
    qsort(names, (size_t)n, SHM_NAME_MAX, cmp_name);
    for (int i = 0; i < 3; i++)
        assert_string_equal(names[i], mine[i]);
    n = shm_list(job_ab, names, 8);
    assert_int_equal(n, 2);
    qsort(names, (size_t)n, SHM_NAME_MAX, cmp_name);
    assert_string_equal(names[0], "a");
    assert_string_equal(names[1], "x");
    assert_int_equal(shm_list(job_a, names, 2), 2); /* at most max */
    assert_int_equal(shm_list(job_a, names, 0), 0);

    assert_int_equal(shm_remove_all(job_a), 3);
    expect_segment_count(job_a, 0);
    expect_segment_count(job_ab, 2); /* the job whose name merely starts the same is untouched */
    shm_seg_t *s = NULL;
    assert_int_equal(shm_attach(&s, job_ab, "x", err, sizeof(err)), 0);
    shm_detach(&s);
    assert_int_equal(shm_remove_all(job_a), 0);
    assert_int_equal(shm_remove_all(job_ab), 2);
    expect_segment_count(job_ab, 0);
}

/* shm_list reports at most the 256 names shm_remove_all asks for at a time; removing them
 * all must still remove every one. */
static void test_shm_remove_all_removes_more_segments_than_one_listing_holds(void **state)
{
    enum { N = 300 };
    char err[256] = "", name[16];
    for (int i = 0; i < N; i++) {
        shm_seg_t *s = NULL;
        snprintf(name, sizeof(name), "s%d", i);
        assert_int_equal(shm_create(&s, job_a, name, 1, err, sizeof(err)), 0);
        shm_detach(&s);
    }
    assert_int_equal(shm_remove_all(job_a), N);
    expect_segment_count(job_a, 0);
}

static void test_shm_segments_are_zero_filled(void **state)
{
    char err[256] = "";
    for (int round = 0; round < 2; round++) {
        shm_seg_t *s = NULL;
        /* the second round reuses the name: a new segment never shows the old one's bytes */
        assert_int_equal(shm_create(&s, job_a, "zero", 3 * 4096 + 1, err, sizeof(err)), 0);
        const unsigned char *d = shm_data(s);
        for (size_t i = 0; i < shm_size(s); i++)
            if (d[i])
                fail_msg("round %d: byte %zu is %u", round, i, d[i]);
        memset(shm_data(s), 0xff, shm_size(s));
        shm_detach(&s);
        assert_int_equal(shm_unlink_name(job_a, "zero"), 0);
    }
}

static void test_shm_mapping_outlives_unlink_until_detach(void **state)
{
    shm_seg_t *s = NULL, *t = NULL;
    char err[256] = "";
    assert_int_equal(shm_create(&s, job_a, "gone", 4096, err, sizeof(err)), 0);
    assert_int_equal(shm_attach(&t, job_a, "gone", err, sizeof(err)), 0);
    assert_int_equal(shm_unlink_name(job_a, "gone"), 0);
    assert_int_equal(shm_unlink_name(job_a, "gone"), -ENOENT);
    expect_segment_count(job_a, 0);
    ((char *)shm_data(s))[100] = 7; /* both mappings still reach the same pages */
    assert_int_equal(((char *)shm_data(t))[100], 7);
    shm_detach(&s);
    shm_detach(&t);
    shm_detach(&t); /* detaching twice is harmless */
}

/* The job lock: one holder, shared with a fork()ed child (which keeps it after the parent
 * lets go of its descriptor), free again once every holder is gone; not one of the job's
 * segments, and removed by its holder. */
static void test_shm_job_lock_is_exclusive_and_shared_with_a_forked_child(void **state)
{
    char err[256] = "", path[128];
    int fd = shm_job_lock(job_a, err, sizeof(err));
    assert_true(fd >= 0);
    char names[8][SHM_NAME_MAX];
    assert_int_equal(shm_list(job_a, names, 8), 0);
    assert_int_equal(shm_job_lock(job_a, err, sizeof(err)), -EBUSY);
    char pid[16];
    snprintf(pid, sizeof(pid), "pid %d", (int)getpid());
    if (!strstr(err, pid) || !strstr(err, job_a))
        fail_msg("the refusal should name the job and the holder's pid: %s", err);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t child = fork();
    if (child == 0) { /* holds the lock it inherited until the parent writes */
        char b;
        close(pipefd[1]);
        _exit(read(pipefd[0], &b, 1) < 0);
    }
    close(pipefd[0]);
    close(fd); /* the parent's descriptor gone, the child's holds it */
    assert_int_equal(shm_job_lock(job_a, err, sizeof(err)), -EBUSY);
    close(pipefd[1]);
    int st;
    assert_int_equal(waitpid(child, &st, 0), child);
    fd = shm_job_lock(job_a, err, sizeof(err));
    assert_true(fd >= 0);
    shm_job_unlock(job_a, fd);
    snprintf(path, sizeof(path), "/dev/shm/ctitan-lock.%s", job_a);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(shm_job_lock("bad/name", err, sizeof(err)), -EINVAL);
}

/* The ctitan-free.<pid>.* files of this process (shm_remove_all_async's renames) present now. */
static int my_freed_files(void)
{
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "ctitan-free.%d.", (int)getpid());
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d)
        closedir(d);
    return n;
}

/* A stop that must not wait for the kernel to free a job's memory: the job's names are gone at
 * once (its next launch may make them again), another job's untouched, a mapping still reaches
 * its pages, the job's lock is not kept by the process that frees them, and once shm_wait_freed
 * returns the memory is freed (no renamed file left). */
static void test_shm_remove_all_async_frees_the_names_at_once_and_the_memory_after(void **state)
{
    char err[256] = "";
    const char *names[] = {"params", "grads", "optstate"};
    shm_seg_t *kept = NULL, *s = NULL;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(shm_create(&s, job_a, names[i], (size_t)16 << 20, err, sizeof(err)), 0);
        shm_detach(&s);
    }
    assert_int_equal(shm_create(&s, job_ab, "params", 4096, err, sizeof(err)), 0);
    shm_detach(&s);
    assert_int_equal(shm_attach(&kept, job_a, "grads", err, sizeof(err)), 0);
    ((char *)shm_data(kept))[12345] = 42;
    int lock = shm_job_lock(job_a, err, sizeof(err)); /* held as a coordinator holds it */
    assert_true(lock >= 0);

    assert_int_equal(shm_remove_all_async(job_a), 3);
    expect_segment_count(job_a, 0);
    expect_segment_count(job_ab, 1);
    assert_int_equal(((char *)shm_data(kept))[12345], 42);
    assert_int_equal(shm_create(&s, job_a, "params", 4096, err, sizeof(err)), 0); /* the name is free */
    shm_detach(&s);
    close(lock);
    lock = shm_job_lock(job_a, err, sizeof(err)); /* the freer did not take the job's lock along */
    if (lock < 0)
        fail_msg("%s", err);
    shm_job_unlock(job_a, lock);

    shm_detach(&kept);
    /* the freer, the last, removes the freers' lock file itself: nothing stays in /dev/shm */
    for (int i = 0; i < 1000 && access("/dev/shm/ctitan-free.lock", F_OK) == 0; i++)
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    assert_int_not_equal(access("/dev/shm/ctitan-free.lock", F_OK), 0);
    assert_int_equal(shm_wait_freed(NULL, NULL, NULL), 0);
    assert_int_equal(my_freed_files(), 0);
    assert_int_equal(shm_remove_all_async(job_a), 1);
    assert_int_equal(shm_remove_all_async(job_a), 0);
    assert_int_equal(shm_wait_freed(NULL, NULL, NULL), 0);
    assert_int_not_equal(access("/dev/shm/ctitan-free.lock", F_OK), 0);
    assert_int_equal(shm_remove_all(job_ab), 1);
}

static int child_holds_the_freers_lock(void *p)
{
    int *fds = p; /* [0]: the end to say "locked" on, [1]: the end to wait on, [2]: its other end */
    close(fds[2]);
    int lk = open("/dev/shm/ctitan-free.lock", O_RDWR | O_CREAT, 0600);
    CHECK(lk >= 0 && flock(lk, LOCK_SH) == 0);
    CHECK(write(fds[0], "L", 1) == 1);
    char b;
    CHECK(read(fds[1], &b, 1) >= 0);
    char path[64];
    snprintf(path, sizeof(path), "/dev/shm/ctitan-free.%d.marker", (int)getppid());
    int m = open(path, O_WRONLY | O_CREAT, 0600); /* what it "freed" last, as it ends */
    CHECK(m >= 0 && close(m) == 0);
    return 0;
}

static int count_waits(void *arg, double bytes)
{
    (void)bytes;
    ++*(int *)arg;
    return 0;
}

/* shm_wait_freed returns only once no freer holds the lock (a child holding its shared side,
 * which leaves a file behind as it ends), saying so while it waits, and removes what such a
 * process left (here the child's file, and a renamed segment whose freer died). */
static void test_shm_wait_freed_waits_for_a_freer_and_removes_what_a_dead_one_left(void **state)
{
    char err[256] = "", from[128], to[128];
    shm_seg_t *s = NULL;
    assert_int_equal(shm_create(&s, job_a, "left", 4096, err, sizeof(err)), 0);
    shm_detach(&s);
    snprintf(from, sizeof(from), "/dev/shm/ctitan.%s.left", job_a);
    snprintf(to, sizeof(to), "/dev/shm/ctitan-free.%d.999", (int)getpid());
    assert_int_equal(rename(from, to), 0);
    int said[2], go[2];
    assert_int_equal(pipe(said), 0);
    assert_int_equal(pipe(go), 0);
    int ends[3] = {said[1], go[0], go[1]};
    pid_t child = spawn(child_holds_the_freers_lock, ends);
    char b;
    assert_int_equal(read(said[0], &b, 1), 1);
    close(go[0]);
    /* the child lets go after the first report (SHM_WAIT_SAY_S in): the writer end closing */
    pid_t closer = fork();
    if (closer == 0) {
        struct timespec t = {(time_t)SHM_WAIT_SAY_S + 1, 0}; /* a second past the report */
        nanosleep(&t, NULL);
        _exit(0); /* its copy of go[1] goes with it */
    }
    close(go[1]);
    int reports = 0;
    assert_int_equal(shm_wait_freed(count_waits, NULL, &reports), 0);
    assert_true(reports >= 1);
    assert_int_equal(reap(child, 10), 0);
    /* the child's marker, made just before it let go, and the dead freer's file: both removed,
     * so the sweep came after the child had let go; and the lock file with them */
    assert_int_equal(my_freed_files(), 0);
    assert_int_not_equal(access("/dev/shm/ctitan-free.lock", F_OK), 0);
    waitpid(closer, NULL, 0);
    close(said[0]), close(said[1]);
}

/* count_waits's count (first: it takes an int *) and stop_after's time. */
typedef struct {
    int reports;
    double at;
} waits_t;

/* stop's answer, every SHM_WAIT_POLL_S: ends the wait once the time in it has passed. */
static int stop_after(void *arg)
{
    return util_now() >= ((waits_t *)arg)->at;
}

/* A wait whose stop says so ends at once with -ECANCELED, not at its next report: a Ctrl-C
 * during a relaunch's wait is seen within a second (the supervisor's stop reads its signals). */
static void test_shm_wait_freed_ends_when_stop_says_so_between_reports(void **state)
{
    int fd = open("/dev/shm/ctitan-free.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_SH), 0); /* as a freer holds it */
    double t0 = util_now();
    waits_t w = {0, t0 + 0.3};
    assert_int_equal(shm_wait_freed(count_waits, stop_after, &w), -ECANCELED);
    double secs = util_now() - t0;
    assert_true(secs >= 0.3 && secs < 0.3 + 0.5);
    assert_int_equal(w.reports, 0); /* before the first report, SHM_WAIT_SAY_S in */
    close(fd);
    assert_int_equal(unlink("/dev/shm/ctitan-free.lock"), 0);
}

/* A lock file another user made (and could hold forever) is not a freer's: a launch's wait does
 * not wait on it, and a stop then frees in place. Needs root, to give the file away. */
static void test_shm_another_users_lock_file_is_not_waited_on(void **state)
{
    if (geteuid() != 0)
        skip();
    int fd = open("/dev/shm/ctitan-free.lock", O_RDWR | O_CREAT | O_EXCL, 0666);
    assert_true(fd >= 0);
    assert_int_equal(fchown(fd, 65534, 65534), 0);
    assert_int_equal(flock(fd, LOCK_SH), 0); /* as if that user's process held it */
    int reports = 0;
    assert_int_equal(shm_wait_freed(count_waits, NULL, &reports), 0);
    assert_int_equal(reports, 0);
    char err[256] = "";
    shm_seg_t *s = NULL;
    assert_int_equal(shm_create(&s, job_a, "x", 4096, err, sizeof(err)), 0);
    shm_detach(&s);
    assert_int_equal(shm_remove_all_async(job_a), 1);
    expect_segment_count(job_a, 0);
    assert_int_equal(my_freed_files(), 0); /* freed here, not renamed */
    close(fd);
    assert_int_equal(unlink("/dev/shm/ctitan-free.lock"), 0);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_shm_create_attach_detach_shares_data_between_processes),
        T(test_shm_create_of_existing_segment_fails_with_eexist_naming_it),
        T(test_shm_attach_of_missing_segment_fails_naming_it),
        T(test_shm_segment_mode_is_0600_whatever_the_umask),
        T(test_shm_sizes_round_up_to_a_page),
        T(test_shm_create_rejects_sizes_that_overflow),
        T(test_shm_bad_names_are_rejected),
        T(test_shm_longest_names_make_distinct_segments),
        T(test_shm_list_and_remove_all_see_exactly_the_jobs_segments),
        T(test_shm_remove_all_removes_more_segments_than_one_listing_holds),
        T(test_shm_segments_are_zero_filled),
        T(test_shm_mapping_outlives_unlink_until_detach),
        T(test_shm_job_lock_is_exclusive_and_shared_with_a_forked_child),
        T(test_shm_remove_all_async_frees_the_names_at_once_and_the_memory_after),
        T(test_shm_wait_freed_waits_for_a_freer_and_removes_what_a_dead_one_left),
        T(test_shm_wait_freed_ends_when_stop_says_so_between_reports),
        T(test_shm_another_users_lock_file_is_not_waited_on),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
