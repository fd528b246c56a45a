/* Parameter table (Hugging Face names, shapes, order, offsets) and the seed-driven,
 * topology-independent initialisation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/params.h"

static void test_params_table_names_shapes_and_order(void **state)
{
    model_config_t c;
    config_preset("llama1b", &c); /* GQA: 8 kv heads */
    param_table_t t;
    assert_int_equal(params_table_init(&t, &c), 0);
    assert_int_equal(t.n, 16 * 9 + 3);
    assert_string_equal(t.t[0].name, "model.embed_tokens.weight");
    assert_string_equal(t.t[1].name, "model.layers.0.input_layernorm.weight");
    assert_string_equal(t.t[3].name, "model.layers.0.self_attn.k_proj.weight");
    assert_int_equal(t.t[3].shape[0], 8 * 128);
    assert_int_equal(t.t[3].shape[1], 2048);
    assert_string_equal(t.t[9].name, "model.layers.0.mlp.down_proj.weight");
    assert_int_equal(t.t[9].shape[0], 2048);
    assert_int_equal(t.t[9].shape[1], 5632);
    assert_string_equal(t.t[t.n - 2].name, "model.norm.weight");
    assert_string_equal(t.t[t.n - 1].name, "lm_head.weight");
    /* offsets are contiguous in table order and sum to total */
    size_t off = 0;
    for (int i = 0; i < t.n; i++) {
        assert_int_equal(t.t[i].offset, off);
        off += t.t[i].numel;
    }
    assert_int_equal(off, t.total);
    /* total by the closed formula */
    size_t D = 2048, F = 5632, kv = 1024, V = 32000;
    size_t layer = D + D * D + 2 * kv * D + D * D + D + 3 * D * F;
    assert_int_equal(t.total, 2 * V * D + 16 * layer + D);
    assert_int_equal(params_find_name(&t, "model.layers.15.mlp.up_proj.weight"),
                     params_find(&t, PARAM_W3, 15));
    assert_int_equal(params_find_name(&t, "model.layers.16.mlp.up_proj.weight"), -1);
    params_table_free(&t);
}

static void test_params_piece_ranges_tile_the_flat_space(void **state)
{
    model_config_t c;
    config_preset("tiny", &c);
    param_table_t t;
    params_table_init(&t, &c);
    size_t b, e, prev = 0;
    for (int p = 0; p < c.n_layers + 2; p++) {
        params_piece_range(&t, p, p + 1, &b, &e);
        assert_int_equal(b, prev);
        assert_true(e > b);
        prev = e;
    }
    assert_int_equal(prev, t.total);
    params_piece_range(&t, 1, 2, &b, &e);
    assert_int_equal(b, t.t[params_find(&t, PARAM_ATTN_NORM, 0)].offset);
    assert_int_equal(e, t.t[params_find(&t, PARAM_ATTN_NORM, 1)].offset);
    params_table_free(&t);
}

static void test_params_init_is_independent_of_how_it_is_split(void **state)
{
    model_config_t c;
    config_preset("tiny", &c);
    param_table_t t;
    params_table_init(&t, &c);
    float *whole = malloc(t.total * sizeof(float)), *parts = malloc(t.total * sizeof(float));
    params_init(&t, &c, 1234, whole, 0, t.total);
    /* uneven cuts that split tensors in the middle */
    size_t cuts[] = {0, 7, 500, 501, 1999, t.total / 2 + 3, t.total};
    for (size_t i = 0; i + 1 < sizeof(cuts) / sizeof(cuts[0]); i++)
        params_init(&t, &c, 1234, parts + cuts[i], cuts[i], cuts[i + 1]);
    assert_memory_equal(whole, parts, t.total * sizeof(float));
    /* a different seed gives different weights */
    params_init(&t, &c, 1235, parts, 0, t.total);
    assert_memory_not_equal(whole, parts, t.total * sizeof(float));
    free(whole);
    free(parts);
    params_table_free(&t);
}

static void moments(const float *x, size_t n, double *mean, double *std, double *maxabs)
{
    double s = 0, s2 = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        s += x[i], s2 += (double)x[i] * x[i];
        if (fabs(x[i]) > m) m = fabs(x[i]);
    }
    *mean = s / n;
    *std = sqrt(s2 / n - *mean * *mean);
    *maxabs = m;
}

static void test_params_init_follows_torchtitan_scheme(void **state)
{
    model_config_t c;
    config_preset("debugmodel", &c);
    param_table_t t;
    params_table_init(&t, &c);
    float *w = malloc(t.total * sizeof(float));
    params_init(&t, &c, 42, w, 0, t.total);
    double mean, std, mx;
    const param_info_t *p = &t.t[params_find(&t, PARAM_EMBED, -1)];
    moments(w + p->offset, p->numel, &mean, &std, &mx);
    assert_true(fabs(mean) < 0.01 && fabs(std - 1.0) < 0.01);
    p = &t.t[params_find(&t, PARAM_WQ, 3)];
    moments(w + p->offset, p->numel, &mean, &std, &mx);
    assert_true(fabs(std - 0.02) < 0.0005);
    p = &t.t[params_find(&t, PARAM_W2, 3)]; /* depth init: 0.02/sqrt(2*4) */
    moments(w + p->offset, p->numel, &mean, &std, &mx);
    assert_true(fabs(std - 0.02 / sqrt(8.0)) < 0.0003);
    p = &t.t[params_find(&t, PARAM_OUTPUT, -1)]; /* std 1/16 before the cut at 3 std */
    moments(w + p->offset, p->numel, &mean, &std, &mx);
    assert_true(mx <= 3.0 / 16 + 1e-7);
    assert_true(std > 0.0560 && std < 0.0625); /* truncation at 3 std shrinks std by ~1.4% */
    p = &t.t[params_find(&t, PARAM_FFN_NORM, 5)];
    for (size_t i = 0; i < p->numel; i++)
        assert_true(w[p->offset + i] == 1.0f);
    free(w);
    params_table_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_table_names_shapes_and_order),
        cmocka_unit_test(test_params_piece_ranges_tile_the_flat_space),
        cmocka_unit_test(test_params_init_is_independent_of_how_it_is_split),
        cmocka_unit_test(test_params_init_follows_torchtitan_scheme),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
