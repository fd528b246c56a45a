/* cuDNN's attention graphs (kernels/cuda/cudnn_sdpa.c) built and finalized on the CPU: cuDNN's
 * backend checks every operation's shapes and types and the graph's wiring at finalize without
 * a device, so a wrong stride, dimension or link in either graph fails here, in make test, long
 * before a GPU is lent. Then cuDNN's own planning for an H100 described in JSON (its DEVICEPROP
 * form), with the CUDA toolkit's stub of the driver library standing in for libcuda.so.1 (the
 * program runs itself again with it on its library path): cuDNN's attention engines must take
 * both graphs and build their kernels, failing only where the stub cannot load them onto a device
 * (cuLibraryLoadData). A graph its SDPA pattern matcher does not take fails there (a softmax
 * without its division did, "tag_mha_graph"). The numbers are tests/gpu/test_cuda_attn's, on a
 * GPU. Skipped where cuDNN 9 cannot be loaded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* An H100 80GB HBM3 (SXM5) as cuDNN 9.19's DEVICEPROP JSON takes it: the keys its parser asks
 * for, the card's published figures where there are some (132 SMs, 227 KiB of shared memory a
 * block, 50 MiB of L2, 1980 / 2619 MHz, PCI id 0x2330) and sm_90's limits, CUDA 13's driver.
 * Written by hand (no GPU here); the GPU test writes the card's own (CTITAN_CUDNN_DEVICEPROP)
 * to put in its place. */
static const char h100_json[] =
    "{\"maxGridSize\":[2147483647,65535,65535],\"maxBlockSize\":[1024,1024,64],\"regsPerBlock\":65536,"
    "\"multiProcessorCount\":132,\"warpSize\":32,\"maxSharedMemoryPerBlock\":49152,"
    "\"maxSharedMemoryPerBlockOptin\":232448,\"reservedSharedMemoryPerBlock\":1024,\"maxRegistersPerSM\":65536,"
    "\"maxCtasPerSM\":32,\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,\"pciDeviceId\":9008,"
    "\"isTccDriver\":0,\"supportCoopLaunch\":1,\"smClockRateKHz\":1980000,\"memClockRateKHz\":2619000,"
    "\"l2CacheSize\":52428800,\"deviceName\":\"NVIDIA H100 80GB HBM3\",\"deviceVer\":900,"
    "\"driverVer\":13000,\"totalGlobalMem\":85029158912,\"cudaDeviceId\":0}";

static void test_engines_take_the_graphs_for_an_h100(void **state)
{
    NEED_CUDNN();
    if (!getenv("CTITAN_TEST_CUDA_STUB")) {
        print_message("no stub of libcuda.so.1 (CUDA toolkit lib64/stubs): skipping\n");
        skip();
    }
    /* the ~1B's, the demo's, a ragged grouped-query one (~2 s each) */
    static const int shapes[][5] = {{4, 2048, 16, 8, 128}, {8, 256, 16, 16, 16}, {2, 100, 4, 2, 64}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bwd = 0; bwd < 2; bwd++) {
            long long engine = -1, ws = -1;
            int rc = cudnn_sdpa_plan_for(g_s, h100_json, bwd, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3],
                                         shapes[i][4], &engine, &ws);
            const char *why = cudnn_sdpa_error(g_s);
            print_message("%s B %d T %d H %d/%d hd %d: %s\n", bwd ? "backward" : "forward", shapes[i][0],
                          shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], rc ? why : "planned");
            /* built, and failed only at loading the module onto the (stub) driver */
            assert_true(rc == 0 || (rc == -ENOTSUP && strstr(why, "cuLibraryLoadData")));
        }
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

/* The program again with a folder holding libcuda.so.1 -> the toolkit's stub first on its library
 * path (cuDNN loads the driver library when it builds kernels); the folder goes at exit. */
static void remove_stub(void)
{
    const char *dir = getenv("CTITAN_TEST_CUDA_STUB");
    char link[300];
    snprintf(link, sizeof link, "%s/libcuda.so.1", dir);
    unlink(link);
    rmdir(dir);
}

static void with_stub(char **argv)
{
    if (getenv("CTITAN_TEST_CUDA_STUB")) {
        atexit(remove_stub);
        return;
    }
    const char *stub = CTITAN_CUDA_HOME "/lib64/stubs/libcuda.so";
    char tmpl[] = "/tmp/ctitan-cudastub-XXXXXX", link[300], path[4096];
    if (access(stub, R_OK) != 0 || !mkdtemp(tmpl))
        return;
    snprintf(link, sizeof link, "%s/libcuda.so.1", tmpl);
    if (symlink(stub, link) != 0) {
        rmdir(tmpl);
        return;
    }
    const char *old = getenv("LD_LIBRARY_PATH");
    snprintf(path, sizeof path, "%s%s%s", tmpl, old && old[0] ? ":" : "", old ? old : "");
    setenv("LD_LIBRARY_PATH", path, 1);
    setenv("CTITAN_TEST_CUDA_STUB", tmpl, 1);
    execv("/proc/self/exe", argv);
    unlink(link); /* exec failed: run without */
    rmdir(tmpl);
    unsetenv("CTITAN_TEST_CUDA_STUB");
}

int main(int argc, char **argv)
{
    (void)argc;
    with_stub(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graphs_finalize_for_the_models_shapes),
        cmocka_unit_test(test_engines_take_the_graphs_for_an_h100),
        cmocka_unit_test(test_bad_shapes_are_refused_before_cudnn),
        cmocka_unit_test(test_running_without_a_device_says_why),
        cmocka_unit_test(test_a_missing_library_is_named),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
