/* GPU AdamW against the double reference; skipped with a message where there is no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/ref/ref_ops.h"
#include "tests/testutil.h"

static void test_cuda_adamw_matches_reference_over_steps(void **state)
{
    if (cuda_device_count() == 0) {
        print_message("no CUDA device: skipping (%s)\n", cuda_last_error());
        skip();
    }
    size_t n = 100003;
    float *p = malloc(n * 4), *g = malloc(n * 4), *out = malloc(n * 4);
    double *pd = malloc(n * 8), *gd = malloc(n * 8), *md = calloc(n, 8), *vd = calloc(n, 8);
    tu_fill(pd, p, n, 1, 1.0);
    float *dp, *dg, *dm, *dv;
    assert_int_equal(cuda_alloc((void **)&dp, n * 4), 0);
    assert_int_equal(cuda_alloc((void **)&dg, n * 4), 0);
    assert_int_equal(cuda_alloc((void **)&dm, n * 4), 0);
    assert_int_equal(cuda_alloc((void **)&dv, n * 4), 0);
    cuda_copy_to_device(dp, p, n * 4);
    float *zero = calloc(n, 4);
    cuda_copy_to_device(dm, zero, n * 4);
    cuda_copy_to_device(dv, zero, n * 4);
    for (int step = 1; step <= 5; step++) {
        tu_fill(gd, g, n, 100 + step, 0.1);
        cuda_copy_to_device(dg, g, n * 4);
        assert_int_equal(cuda_adamw(dp, dg, dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, NULL), 0);
        ref_adamw(pd, gd, md, vd, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
    }
    assert_int_equal(cuda_copy_to_host(out, dp, n * 4), 0);
    assert_int_equal(tu_compare("adamw param", out, pd, n, 1e-6, 1e-5), 0);
    assert_int_equal(cuda_adamw(dp, dg, dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0, NULL), -22);
    cuda_free(dp), cuda_free(dg), cuda_free(dm), cuda_free(dv);
    free(p), free(g), free(out), free(pd), free(gd), free(md), free(vd), free(zero);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_adamw_matches_reference_over_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
