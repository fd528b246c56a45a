/* The tensor-core wrappers of kernels/cuda/mma.cuh (ldmatrix, mma.sync m16n8k16 bf16, the
 * accumulator-to-A-fragment packing) against plain products, through kernels/cuda/mma_check.cu.
 * The entries are small integers, so every product and sum is exact in bf16 and fp32 and the
 * comparison is bitwise: an element read from the wrong place changes the result. Skipped with
 * a message where there is no GPU. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_mma.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/testutil.h"

#define SKIP_WITHOUT_GPU()                                                                         \
    do {                                                                                           \
        if (cuda_device_count() == 0) {                                                            \
            print_message("no CUDA device (cuda_device_count() == 0): skipping\n");               \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* n integers in [-4, 4] as bf16 (exact) and as double. */
static void fill_ints(uint16_t *h, double *d, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        double x = (double)(int)(tu_uniform(&seed, 4.5));
        h[i] = tu_f32_to_bf16((float)x);
        d[i] = x;
    }
}

/* Runs cuda_mma_check on the device and returns d [16,8]. */
static void run(float d[128], int mode, const uint16_t *a, int na, const uint16_t *b, int nb,
                const uint16_t *e, int ne, const float *c)
{
    void *ga = NULL, *gb = NULL, *ge = NULL, *gc = NULL, *gd = NULL;
    assert_int_equal(cuda_alloc(&ga, na * 2), 0);
    assert_int_equal(cuda_alloc(&gb, nb * 2), 0);
    assert_int_equal(cuda_alloc(&gd, 128 * 4), 0);
    assert_int_equal(cuda_copy_to_device(ga, a, na * 2), 0);
    assert_int_equal(cuda_copy_to_device(gb, b, nb * 2), 0);
    if (e) {
        assert_int_equal(cuda_alloc(&ge, ne * 2), 0);
        assert_int_equal(cuda_copy_to_device(ge, e, ne * 2), 0);
    }
    if (c) {
        assert_int_equal(cuda_alloc(&gc, 128 * 4), 0);
        assert_int_equal(cuda_copy_to_device(gc, c, 128 * 4), 0);
    }
    int rc = cuda_mma_check(gd, ga, gb, ge, gc, mode);
    if (rc)
        fprintf(stderr, "cuda_mma_check: %d (%s)\n", rc, cuda_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(cuda_copy_to_host(d, gd, 128 * 4), 0);
    cuda_free(ga), cuda_free(gb), cuda_free(ge), cuda_free(gc), cuda_free(gd);
}

static void assert_equal_16x8(const float *got, const double *want)
{
    int bad = 0;
    for (int i = 0; i < 128; i++)
        if ((double)got[i] != want[i]) {
            if (bad++ < 8)
                fprintf(stderr, "d[%d][%d] = %g, want %g\n", i / 8, i % 8, got[i], want[i]);
        }
    assert_int_equal(bad, 0);
}

/* d = A B + C with A row-major and B given as B^T (ldmatrix_x4, ldmatrix_x2). */
static void test_cuda_mma_plain_loads_give_the_product(void **state)
{
    SKIP_WITHOUT_GPU();
    uint16_t a[256], bt[128];
    double ad[256], btd[128], cd[128], want[128];
    float c[128], d[128];
    fill_ints(a, ad, 256, 1);
    fill_ints(bt, btd, 128, 2);
    uint16_t ch[128];
    fill_ints(ch, cd, 128, 3);
    for (int i = 0; i < 128; i++)
        c[i] = (float)cd[i];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double s = cd[m * 8 + n];
            for (int k = 0; k < 16; k++)
                s += ad[m * 16 + k] * btd[n * 16 + k];
            want[m * 8 + n] = s;
        }
    run(d, CUDA_MMA_PLAIN, a, 256, bt, 128, NULL, 0, c);
    assert_equal_16x8(d, want);
}

/* d = A B + C with A given as A^T and B row-major [k][n] (ldmatrix_x4_trans, ldmatrix_x2_trans). */
static void test_cuda_mma_transposing_loads_give_the_product(void **state)
{
    SKIP_WITHOUT_GPU();
    uint16_t at[256], b[128], ch[128];
    double atd[256], bd[128], cd[128], want[128];
    float c[128], d[128];
    fill_ints(at, atd, 256, 4);
    fill_ints(b, bd, 128, 5);
    fill_ints(ch, cd, 128, 6);
    for (int i = 0; i < 128; i++)
        c[i] = (float)cd[i];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double s = cd[m * 8 + n];
            for (int k = 0; k < 16; k++)
                s += atd[k * 16 + m] * bd[k * 8 + n];
            want[m * 8 + n] = s;
        }
    run(d, CUDA_MMA_TRANS, at, 256, b, 128, NULL, 0, c);
    assert_equal_16x8(d, want);
}

/* d = (A B) E with A B's accumulators packed into the next product's A fragment, as the
 * attention kernels use P and dS; |A B| <= 256, so its bf16 rounding is exact too. */
static void test_cuda_mma_accumulators_chain_into_the_next_product(void **state)
{
    SKIP_WITHOUT_GPU();
    uint16_t a[256], bt[256], e[128];
    double ad[256], btd[256], ed[128], x[256], want[128];
    float d[128];
    fill_ints(a, ad, 256, 7);
    fill_ints(bt, btd, 256, 8);
    fill_ints(e, ed, 128, 9);
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            double s = 0;
            for (int k = 0; k < 16; k++)
                s += ad[m * 16 + k] * btd[n * 16 + k];
            x[m * 16 + n] = s;
        }
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double s = 0;
            for (int k = 0; k < 16; k++)
                s += x[m * 16 + k] * ed[k * 8 + n];
            want[m * 8 + n] = s;
        }
    run(d, CUDA_MMA_CHAIN, a, 256, bt, 256, e, 128, NULL);
    assert_equal_16x8(d, want);
}

static void test_cuda_mma_rejects_bad_arguments(void **state)
{
    static float d[128], c[128];
    static uint16_t a[256];
    assert_int_equal(cuda_mma_check(d, a, a, NULL, c, 3), -EINVAL);
    assert_non_null(strstr(cuda_last_error(), "mode 3"));
    assert_int_equal(cuda_mma_check(d, a, a, NULL, NULL, CUDA_MMA_CHAIN), -EINVAL);
    assert_int_equal(cuda_mma_check(NULL, a, a, a, c, CUDA_MMA_PLAIN), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_mma_plain_loads_give_the_product),
        cmocka_unit_test(test_cuda_mma_transposing_loads_give_the_product),
        cmocka_unit_test(test_cuda_mma_accumulators_chain_into_the_next_product),
        cmocka_unit_test(test_cuda_mma_rejects_bad_arguments),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
