/* cuDNN's attention graphs (kernels/cuda/cudnn_sdpa.c) built and finalized on the CPU: cuDNN's
 * backend checks every operation's shapes and types and the graph's wiring at finalize without
 * a device, so a wrong stride, dimension or link in either graph fails here, in make test, long
 * before a GPU is lent. Whether an engine takes the graph, and the numbers, are
 * tests/gpu/test_cuda_attn's (on a GPU). Skipped where cuDNN 9 cannot be loaded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cudnn_sdpa.h"
#include "tests/testutil.h"

static cudnn_sdpa_t *g_s;
static char g_why[512];

static int setup(void **state)
{
    (void)state;
    if (cudnn_sdpa_open(&g_s, g_why, sizeof g_why) != 0)
        g_s = NULL;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cudnn_sdpa_close(&g_s);
    return 0;
}

#define NEED_CUDNN()                                                                  \
    do {                                                                              \
        if (!g_s) {                                                                   \
            print_message("cuDNN not loadable (%s): skipping\n", g_why);             \
            skip();                                                                   \
        }                                                                             \
    } while (0)

static void graph_ok(int bwd, int B, int T, int H, int Hkv, int hd)
{
    int rc = cudnn_sdpa_graph_check(g_s, bwd, B, T, H, Hkv, hd);
    if (rc)
        fprintf(stderr, "%s graph B %d T %d H %d/%d hd %d: %s\n", bwd ? "backward" : "forward", B, T, H, Hkv,
                hd, cudnn_sdpa_error(g_s));
    assert_int_equal(rc, 0);
}

/* The model's shapes: bench-gpu's ~1B (grouped-query, hd 128), the ~160M and the demo's (all heads
 * their own), a sequence no tile divides, four query heads a kv head. */
static void test_graphs_finalize_for_the_models_shapes(void **state)
{
    NEED_CUDNN();
    assert_true(cudnn_sdpa_version(g_s) >= 90000);
    static const int shapes[][5] = {
        {4, 2048, 16, 8, 128}, {4, 1024, 8, 8, 128}, {8, 256, 4, 4, 64}, {1, 67, 8, 2, 32}, {2, 129, 4, 1, 16},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bwd = 0; bwd < 2; bwd++)
            graph_ok(bwd, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4]);
}

static void test_bad_shapes_are_refused_before_cudnn(void **state)
{
    NEED_CUDNN();
    assert_int_equal(cudnn_sdpa_graph_check(g_s, 0, 1, 64, 6, 4, 64), -EINVAL);
    assert_non_null(strstr(cudnn_sdpa_error(g_s), "kv heads 4"));
    assert_int_equal(cudnn_sdpa_graph_check(g_s, 1, 1, 64, 4, 2, 12), -EINVAL);
    assert_non_null(strstr(cudnn_sdpa_error(g_s), "head dim 12"));
    assert_int_equal(cudnn_sdpa_graph_check(g_s, 0, 0, 64, 4, 2, 64), -EINVAL);
}

/* Without a device the run calls stop at cuDNN's handle, saying so, and change nothing. */
static void test_running_without_a_device_says_why(void **state)
{
    NEED_CUDNN();
    int rc = cudnn_sdpa_fwd(g_s, NULL, NULL, NULL, NULL, NULL, 1, 64, 4, 2, 64, NULL);
    assert_int_equal(rc, -ENODEV);
    assert_non_null(strstr(cudnn_sdpa_error(g_s), "cudnnCreate"));
    assert_int_equal(cudnn_sdpa_workspace_bytes(g_s), 0);
}

static void test_a_missing_library_is_named(void **state)
{
    (void)state;
    setenv("CTITAN_CUDNN_LIB", "/nonexistent/libcudnn.so.9", 1);
    cudnn_sdpa_t *s = NULL;
    char why[512];
    assert_int_equal(cudnn_sdpa_open(&s, why, sizeof why), -ENOSYS);
    assert_null(s);
    assert_non_null(strstr(why, "/nonexistent/libcudnn.so.9"));
    unsetenv("CTITAN_CUDNN_LIB");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graphs_finalize_for_the_models_shapes),
        cmocka_unit_test(test_bad_shapes_are_refused_before_cudnn),
        cmocka_unit_test(test_running_without_a_device_says_why),
        cmocka_unit_test(test_a_missing_library_is_named),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
