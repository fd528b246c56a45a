/* The optimizer table (kernels/optim.h): rows found by name in any case, what a row declares,
 * and the AdamW row's step: the backend's adamw with the arrays in the table's order (the
 * master weights, then exp_avg, exp_avg_sq), in place and from one bank into another, bit for
 * bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/optim.h"
#include "tests/testutil.h"

static void test_optim_rows_are_found_by_name_in_any_case(void **state)
{
    (void)state;
    const optim_t *o = optim_find("AdamW");
    assert_non_null(o);
    assert_ptr_equal(optim_find("adamw"), o);
    assert_ptr_equal(optim_find("ADAMW"), o);
    assert_null(optim_find("SGD"));
    assert_null(optim_find(""));
    char names[64];
    assert_non_null(strstr(optim_names(names, sizeof(names)), "\"AdamW\""));
    /* what the layouts derive from it */
    assert_int_equal(optim_arrays(o), 3);
    assert_string_equal(o->state[0], "exp_avg");
    assert_string_equal(o->state[1], "exp_avg_sq");
    assert_false(o->whole_tensors);
    for (int a = 0; a < o->n_state; a++)
        assert_true(strlen(o->state[a]) < OPTIM_NAME_MAX);
}

static void test_optim_adamw_step_is_the_backends_adamw_bitwise(void **state)
{
    (void)state;
    const backend_t *be = backend_cpu();
    const optim_t *o = optim_find("AdamW");
    const size_t n = 5000, bytes = n * sizeof(float);
    float *from[3], *to[3], *want[3], *g = malloc(bytes);
    assert_non_null(g);
    for (int a = 0; a < 3; a++) {
        assert_non_null(from[a] = malloc(bytes));
        assert_non_null(to[a] = malloc(bytes));
        assert_non_null(want[a] = malloc(bytes));
        tu_fill(NULL, from[a], n, 40 + a, 0.3);
    }
    for (size_t i = 0; i < n; i++)
        from[2][i] *= from[2][i]; /* second moments are not negative */
    tu_fill(NULL, g, n, 50, 0.2);
    optim_args_t args = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                         .gscale = 0.7f, .step = 4};
    assert_int_equal(o->step(be, to, (const float *const *)from, g, n, &args, NULL), 0);
    assert_int_equal(be->adamw(want[0], want[1], want[2], from[0], from[1], from[2], g, 0.7f, NULL, n, 3e-4f, 0.9f,
                               0.95f, 1e-8f, 0.1f, 4, NULL, NULL, NULL), 0);
    for (int a = 0; a < 3; a++)
        assert_memory_equal(to[a], want[a], bytes);
    /* in place: to == from, the clip factor read where gscale_at points (the one by value wrong) */
    const float clip = 0.7f;
    args.gscale = 5.0f, args.gscale_at = &clip;
    assert_int_equal(o->step(be, from, (const float *const *)from, g, n, &args, NULL), 0);
    for (int a = 0; a < 3; a++)
        assert_memory_equal(from[a], want[a], bytes);
    for (int a = 0; a < 3; a++)
        free(from[a]), free(to[a]), free(want[a]);
    free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optim_rows_are_found_by_name_in_any_case),
        cmocka_unit_test(test_optim_adamw_step_is_the_backends_adamw_bitwise),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
