/* The CPU kernels' thread pool (kernels/cpu/pool.h): every task runs once for any thread
 * count, and a pool whose threads cannot all start is an error the caller sees (NULL with
 * errno), never a pool quietly smaller than asked for or a crash. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <cmocka.h>

#include "kernels/cpu/pool.h"
#include "tests/testutil.h"

static void count_task(void *ctx, int t) { __atomic_fetch_add(&((int *)ctx)[t], 1, __ATOMIC_RELAXED); }

static void test_pool_runs_every_task_once_for_any_thread_count(void **state)
{
    static int hits[1000];
    const int threads[] = {1, 2, 3, 8};
    for (size_t i = 0; i < sizeof(threads) / sizeof(threads[0]); i++) {
        pool_t *p = pool_new(threads[i]);
        assert_non_null(p);
        assert_int_equal(pool_threads(p), threads[i]);
        for (int round = 0; round < 3; round++) {
            memset(hits, 0, sizeof(hits));
            pool_for(p, 1000, count_task, hits);
            for (int t = 0; t < 1000; t++)
                assert_int_equal(hits[t], 1);
        }
        pool_destroy(&p);
        assert_null(p);
    }
    memset(hits, 0, sizeof(hits));
    pool_for(NULL, 5, count_task, hits); /* no pool: inline */
    assert_int_equal(hits[4], 1);
}

/* More threads than POOL_MAX_THREADS run POOL_MAX_THREADS. */
static void test_pool_new_caps_the_thread_count(void **state)
{
    static int hits[3000];
    pool_t *p = pool_new(POOL_MAX_THREADS + 1000);
    assert_non_null(p);
    assert_int_equal(pool_threads(p), POOL_MAX_THREADS);
    pool_for(p, 3000, count_task, hits);
    for (int t = 0; t < 3000; t++)
        assert_int_equal(hits[t], 1);
    pool_destroy(&p);
}

/* The address space this process uses now (VmSize), in bytes. */
static size_t vm_size(void)
{
    char buf[4096];
    tu_read_file("/proc/self/status", buf, sizeof(buf));
    const char *p = strstr(buf, "VmSize:");
    return p ? (size_t)strtoull(p + 7, NULL, 10) * 1024 : 0;
}

/* With too little address space left for a thread's stack, pool_new fails as a whole (NULL,
 * errno set) instead of running with the threads that happened to start; with room again it
 * works. In a child, whose limit goes with it. */
static void test_pool_new_fails_cleanly_when_its_threads_cannot_start(void **state)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        pool_t *warm = pool_new(2); /* OpenBLAS's first-use set-up, before the limit */
        pool_destroy(&warm);
        struct rlimit was, lim;
        if (getrlimit(RLIMIT_AS, &was))
            _exit(2);
        lim = was;
        lim.rlim_cur = vm_size() + (16u << 20); /* room for one 8 MiB stack at most */
        if (setrlimit(RLIMIT_AS, &lim))
            _exit(3);
        errno = 0;
        pool_t *p = pool_new(64);
        int e = errno;
        if (p)
            _exit(4); /* a pool of fewer threads than asked for, or of 64 */
        if (e != EAGAIN && e != ENOMEM)
            _exit(5);
        if (setrlimit(RLIMIT_AS, &was) || !(p = pool_new(4)) || pool_threads(p) != 4)
            _exit(6);
        pool_destroy(&p);
        _exit(0);
    }
    assert_int_equal(tu_reap(pid, 60, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_runs_every_task_once_for_any_thread_count),
        cmocka_unit_test(test_pool_new_caps_the_thread_count),
        cmocka_unit_test(test_pool_new_fails_cleanly_when_its_threads_cannot_start),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
