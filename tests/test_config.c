/* Model config: presets, text setters and the validation messages users see. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <string.h>

#include "kernels/config.h"

static model_config_t valid(void)
{
    model_config_t c;
    assert_int_equal(config_preset("debugmodel", &c), 0);
    return c;
}

static void expect_invalid(model_config_t c, const char *needle)
{
    char err[256] = "";
    assert_int_equal(config_validate(&c, err, sizeof(err)), -EINVAL);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not mention '%s'", err, needle);
}

static void test_config_presets_are_valid(void **state)
{
    const char *names[] = {"debugmodel", "gpt2s", "llama1b", "tiny"};
    for (size_t i = 0; i < 4; i++) {
        model_config_t c;
        char err[256];
        assert_int_equal(config_preset(names[i], &c), 0);
        assert_int_equal(config_validate(&c, err, sizeof(err)), 0);
    }
    model_config_t c;
    assert_int_equal(config_preset("no-such-model", &c), -EINVAL);
}

static void test_config_ffn_hidden_follows_torchtitan(void **state)
{
    model_config_t c = valid(); /* dim 256: 4*256*2/3 = 682 -> 768 */
    assert_int_equal(config_ffn_hidden(&c), 768);
    assert_int_equal(config_preset("gpt2s", &c), 0); /* 2048 exactly */
    assert_int_equal(config_ffn_hidden(&c), 2048);
    c.dim = 4096, c.multiple_of = 1024, c.ffn_dim_multiplier = 1.3; /* Llama-3 8B: 14336 */
    assert_int_equal(config_ffn_hidden(&c), 14336);
}

static void test_config_rejects_dim_not_divisible_by_heads(void **state)
{
    model_config_t c = valid();
    c.dim = 250;
    expect_invalid(c, "model.dim (250) is not divisible by model.n_heads (16)");
}

static void test_config_rejects_bad_kv_heads(void **state)
{
    model_config_t c = valid();
    c.n_kv_heads = 5;
    expect_invalid(c, "model.n_heads (16) is not divisible by model.n_kv_heads (5)");
    c.n_kv_heads = 32;
    expect_invalid(c, "model.n_kv_heads");
}

static void test_config_rejects_odd_head_dim_and_nonpositive_fields(void **state)
{
    model_config_t c = valid();
    c.dim = 16 * 3;
    expect_invalid(c, "must be even");
    c = valid(), c.n_layers = 0;
    expect_invalid(c, "model.n_layers");
    /* the parameter table of 20 million small layers took 20 GB (found by fuzz_manifest) */
    c = valid(), c.n_layers = CONFIG_MAX_LAYERS + 1;
    expect_invalid(c, "model.n_layers must be between 1 and 4096 (got 4097)");
    c = valid(), c.n_layers = CONFIG_MAX_LAYERS;
    assert_int_equal(config_validate(&c, (char[256]){0}, 256), 0);
    c = valid(), c.norm_eps = 0;
    expect_invalid(c, "model.norm_eps");
    c = valid(), c.vocab_size = 1;
    expect_invalid(c, "model.vocab_size");
    c = valid(), c.rope_theta = -1;
    expect_invalid(c, "model.rope_theta");
}

static void test_config_kv_heads_default_to_heads(void **state)
{
    model_config_t c = valid();
    char err[256];
    c.n_kv_heads = 0;
    assert_int_equal(config_validate(&c, err, sizeof(err)), 0);
    assert_int_equal(c.n_kv_heads, c.n_heads);
}

static void test_config_set_parses_and_reports_type_errors(void **state)
{
    model_config_t c = config_defaults();
    char err[256] = "";
    assert_int_equal(config_set(&c, "dim", "512", err, sizeof(err)), 0);
    assert_int_equal(c.dim, 512);
    assert_int_equal(config_set(&c, "rope_theta", "5e5", err, sizeof(err)), 0);
    assert_true(c.rope_theta == 500000.0);
    assert_int_equal(config_set(&c, "dim", "12.5", err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "model.dim: expected an integer, got '12.5'"));
    assert_int_equal(config_set(&c, "norm_eps", "tiny", err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "model.norm_eps: expected a number"));
    assert_int_equal(config_set(&c, "dimension", "1", err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "model.dimension: unknown key"));
}

static void test_config_diff_names_the_first_key_that_differs(void **state)
{
    model_config_t a = valid(), b = valid();
    double va = 0, vb = 0;
    assert_null(config_diff(&a, &b, &va, &vb));
    b.max_seq_len *= 2; /* the same weights */
    assert_null(config_diff(&a, &b, &va, &vb));
    b.rope_theta = 10000;
    b.n_kv_heads = 4;
    assert_string_equal(config_diff(&a, &b, &va, &vb), "n_kv_heads");
    assert_true(va == 16 && vb == 4);
    b = valid();
    b.norm_eps = 1e-6;
    assert_string_equal(config_diff(&a, &b, &va, &vb), "norm_eps");
    assert_true(va == 1e-5 && vb == 1e-6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_presets_are_valid),
        cmocka_unit_test(test_config_ffn_hidden_follows_torchtitan),
        cmocka_unit_test(test_config_rejects_dim_not_divisible_by_heads),
        cmocka_unit_test(test_config_rejects_bad_kv_heads),
        cmocka_unit_test(test_config_rejects_odd_head_dim_and_nonpositive_fields),
        cmocka_unit_test(test_config_kv_heads_default_to_heads),
        cmocka_unit_test(test_config_set_parses_and_reports_type_errors),
        cmocka_unit_test(test_config_diff_names_the_first_key_that_differs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
