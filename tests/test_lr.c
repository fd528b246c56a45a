/* The lr schedule against values worked out from torchtitan's formula. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>

#include "kernels/lr.h"

static void test_lr_warmup_is_linear_from_one_over_warmup_plus_one(void **state)
{
    lr_schedule_t s = lr_schedule_default(1000); /* warmup 200, linear decay over 800 */
    assert_true(fabs(lr_factor(&s, 0) - 1.0 / 201) < 1e-12);
    assert_true(fabs(lr_factor(&s, 99) - 100.0 / 201) < 1e-12);
    assert_true(fabs(lr_factor(&s, 199) - 200.0 / 201) < 1e-12);
}

static void test_lr_linear_decay_reaches_min_at_the_last_step(void **state)
{
    lr_schedule_t s = lr_schedule_default(1000);
    s.lr_min = 0.1;
    assert_true(fabs(lr_factor(&s, 200) - (0.1 + 0.9 * (1 - 1.0 / 800))) < 1e-12);
    assert_true(fabs(lr_factor(&s, 599) - (0.1 + 0.9 * 0.5)) < 1e-12);
    assert_true(fabs(lr_factor(&s, 999) - 0.1) < 1e-12);
}

static void test_lr_cosine_and_stable_phase(void **state)
{
    lr_schedule_t s = {.steps = 100, .warmup_steps = 10, .decay_ratio = 0.5,
                       .decay_type = LR_DECAY_COSINE, .lr_min = 0};
    /* decay over the last 45 steps; 10..54 stable */
    assert_true(lr_factor(&s, 10) == 1.0 && lr_factor(&s, 54) == 1.0);
    assert_true(fabs(lr_factor(&s, 55) - 0.5 * (1 + cos(M_PI / 45))) < 1e-12);
    assert_true(fabs(lr_factor(&s, 99)) < 1e-12);
    lr_decay_t d;
    assert_int_equal(lr_decay_parse("sqrt", &d), 0);
    assert_int_equal(d, LR_DECAY_SQRT);
    assert_int_not_equal(lr_decay_parse("exp", &d), 0);
    for (lr_decay_t t = LR_DECAY_LINEAR; t <= LR_DECAY_COSINE; t++) { /* names read back */
        assert_int_equal(lr_decay_parse(lr_decay_name(t), &d), 0);
        assert_int_equal(d, t);
    }
    assert_string_equal(lr_decay_name((lr_decay_t)7), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lr_warmup_is_linear_from_one_over_warmup_plus_one),
        cmocka_unit_test(test_lr_linear_decay_reaches_min_at_the_last_step),
        cmocka_unit_test(test_lr_cosine_and_stable_phase),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
