/* The CUDA backend plugin as the stage, optimizer-shard and coordinator processes load it
 * (kernels/cuda_plugin.h): the real build/lib/libctitan_cuda.so on this machine (with or without
 * a GPU), the emulated one, and a missing one. On a machine without a GPU the real plugin must
 * say so clearly, and its NCCL path (dlopen of libnccl, ncclGetUniqueId: what the coordinator
 * does for the NCCL data plane) must still work. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda_plugin.h"
#include "tests/testutil.h"

/* build/lib/NAME next to this test (build/tests), or skip. */
static void lib_path(char *buf, size_t n, const char *name)
{
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    assert_true(k > 0);
    exe[k] = 0;
    *strrchr(exe, '/') = 0;
    snprintf(buf, n, "%s/../lib/%s", exe, name);
    if (access(buf, R_OK)) {
        print_message("%s not built (make CUDA=0?): skipping\n", buf);
        skip();
    }
}

static void assert_complete(const cuda_plugin_t *t)
{
    assert_int_equal(t->version, CUDA_PLUGIN_VERSION);
    /* every entry is set: the table is a run of pointers after the version (the backend's name, then
     * functions) */
    const void *const *f = (const void *const *)((const char *)t + offsetof(cuda_plugin_t, backend));
    size_t n = (sizeof(*t) - offsetof(cuda_plugin_t, backend)) / sizeof(void *);
    for (size_t i = 0; i < n; i++)
        if (!f[i])
            fail_msg("entry %zu of the table is NULL", i);
}

static void test_cuda_plugin_real_one_loads_and_says_whether_there_is_a_gpu(void **state)
{
    char path[PATH_MAX + 32], err[512];
    lib_path(path, sizeof(path), "libctitan_cuda.so");
    unsetenv(CUDA_PLUGIN_ENV); /* the default: next to the program */
    const cuda_plugin_t *t = cuda_plugin_load(err, sizeof(err));
    if (!t)
        fail_msg("%s", err);
    assert_complete(t);
    int n = t->device_count();
    if (access("/dev/nvidiactl", F_OK) == 0) {
        print_message("%d CUDA devices\n", n);
        assert_true(n > 0);
        assert_int_equal(t->backend.dev_select(n, NULL), 0); /* ordinals wrap around the devices */
    } else {
        assert_int_equal(n, 0);
        int used = -1;
        assert_int_equal(t->backend.dev_select(0, &used), -ENODEV);
        assert_non_null(strstr(t->last_error(), "no usable CUDA device"));
        assert_int_equal(used, -1);
    }
}

static void test_cuda_plugin_real_one_makes_nccl_ids_without_a_gpu(void **state)
{
    char path[PATH_MAX + 32], err[512];
    lib_path(path, sizeof(path), "libctitan_cuda.so");
    unsetenv(CUDA_PLUGIN_ENV);
    const cuda_plugin_t *t = cuda_plugin_load(err, sizeof(err));
    assert_non_null(t);
    cuda_nccl_id_t a, b, zero = {{0}};
    int rc = t->nccl_id(&a);
    if (rc && strstr(t->last_error(), "cannot load NCCL")) {
        print_message("%s: skipping\n", t->last_error());
        skip();
    }
    if (rc)
        fail_msg("%s", t->last_error());
    assert_int_equal(t->nccl_id(&b), 0);
    assert_memory_not_equal(&a, &zero, sizeof(a));
    assert_memory_not_equal(&a, &b, sizeof(a)); /* each id is its own communicator */
}

static void test_cuda_plugin_emulated_one_and_missing_ones(void **state)
{
    char path[PATH_MAX + 32], err[512];
    lib_path(path, sizeof(path), "libctitan_cuda_sim.so");
    setenv(CUDA_PLUGIN_ENV, path, 1);
    const cuda_plugin_t *t = cuda_plugin_load(err, sizeof(err));
    if (!t)
        fail_msg("%s", err);
    assert_complete(t);
    assert_int_equal(t->device_count(), 4); /* the emulator's */
    int used = -1;
    assert_int_equal(t->backend.dev_select(6, &used), 0);
    assert_int_equal(used, 2);
    setenv(CUDA_PLUGIN_ENV, "/nonexistent/libctitan_cuda.so", 1);
    assert_null(cuda_plugin_load(err, sizeof(err)));
    assert_non_null(strstr(err, "cannot load the CUDA backend /nonexistent/libctitan_cuda.so"));
    setenv(CUDA_PLUGIN_ENV, "libm.so.6", 1); /* a library, but not a plugin */
    assert_null(cuda_plugin_load(err, sizeof(err)));
    assert_non_null(strstr(err, "no ctitan_cuda_plugin table"));
    unsetenv(CUDA_PLUGIN_ENV);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_plugin_real_one_loads_and_says_whether_there_is_a_gpu),
        cmocka_unit_test(test_cuda_plugin_real_one_makes_nccl_ids_without_a_gpu),
        cmocka_unit_test(test_cuda_plugin_emulated_one_and_missing_ones),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
