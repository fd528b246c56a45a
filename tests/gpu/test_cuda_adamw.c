/* GPU AdamW against the double reference, the CPU's ops_adamw_to bit for bit wherever the
 * arrays start (four at a time or one by one), out of place the same bits as in place, and the
 * weights and the cleared gradient it writes beside (w_out, g_clear) those of the separate
 * calls; skipped with a message where there is no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
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
        assert_int_equal(cuda_adamw(dp, dm, dv, dp, dm, dv, dg, 1.0f, NULL, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step,
                                    NULL, NULL, NULL), 0);
        ref_adamw(pd, gd, md, vd, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
    }
    assert_int_equal(cuda_copy_to_host(out, dp, n * 4), 0);
    assert_int_equal(tu_compare("adamw param", out, pd, n, 1e-6, 1e-5), 0);
    assert_int_equal(cuda_adamw(dp, dm, dv, dp, dm, dv, dg, 1.0f, NULL, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0, NULL,
                                NULL, NULL), -22);
    cuda_free(dp), cuda_free(dg), cuda_free(dm), cuda_free(dv);
    free(p), free(g), free(out), free(pd), free(gd), free(md), free(vd), free(zero);
}

/* Two banks of state on the device, each step reading one and writing the other with a clip
 * factor (gscale) on the unscaled gradient: the bits of the in-place run on a gradient scaled
 * beforehand (on the host: the same float product), the bank read left as it was (the outputs
 * start as NaN, so an element left unwritten shows). Every other step the factor is read from
 * device memory (gscale_at), the one given by value wrong. */
static void test_cuda_adamw_out_of_place_is_in_place_bitwise(void **state)
{
    if (cuda_device_count() == 0) {
        print_message("no CUDA device: skipping (%s)\n", cuda_last_error());
        skip();
    }
    const size_t n = 16384 * 2 + 77, bytes = n * sizeof(float);
    float *h = malloc(bytes), *nan = malloc(bytes), *got = malloc(bytes), *want = malloc(bytes);
    float *saved = malloc(3 * bytes);
    float *in[3], *bank[2][3], *dg, *dscaled, *dclip; /* in place: p, m, v; banks of p, m, v */
    assert_int_equal(cuda_alloc((void **)&dg, bytes), 0);
    assert_int_equal(cuda_alloc((void **)&dclip, sizeof(float)), 0);
    assert_int_equal(cuda_alloc((void **)&dscaled, bytes), 0);
    for (size_t i = 0; i < n; i++)
        nan[i] = NAN;
    for (int j = 0; j < 3; j++) {
        tu_fill(NULL, h, n, 500 + j, j ? 0.1 : 1.0);
        if (j == 2)
            for (size_t i = 0; i < n; i++)
                h[i] *= h[i]; /* second moments are >= 0 */
        assert_int_equal(cuda_alloc((void **)&in[j], bytes), 0);
        assert_int_equal(cuda_alloc((void **)&bank[0][j], bytes), 0);
        assert_int_equal(cuda_alloc((void **)&bank[1][j], bytes), 0);
        assert_int_equal(cuda_copy_to_device(in[j], h, bytes), 0);
        assert_int_equal(cuda_copy_to_device(bank[0][j], h, bytes), 0);
        assert_int_equal(cuda_copy_to_device(bank[1][j], nan, bytes), 0);
    }
    for (int step = 1; step <= 4; step++) {
        float *const *src = bank[(step - 1) % 2], *const *dst = bank[step % 2];
        tu_fill(NULL, h, n, 510 + step, step % 2 ? 0.1 : 2.0);
        assert_int_equal(cuda_copy_to_device(dg, h, bytes), 0);
        const float clip = step == 2 ? 1.0f : 0.4f + 0.1f * step;
        for (size_t i = 0; i < n; i++)
            h[i] *= clip;
        assert_int_equal(cuda_copy_to_device(dscaled, h, bytes), 0);
        for (int j = 0; j < 3; j++)
            assert_int_equal(cuda_copy_to_host(saved + j * n, src[j], bytes), 0);
        assert_int_equal(cuda_adamw(in[0], in[1], in[2], in[0], in[1], in[2], dscaled, 1.0f, NULL, n, 1e-3f, 0.9f,
                                    0.95f, 1e-8f, 0.1f, step, NULL, NULL, NULL),
                         0);
        /* odd steps: the clip factor in device memory (as cuda_norm_clip leaves it), the one
         * passed by value wrong */
        assert_int_equal(cuda_copy_to_device(dclip, &clip, sizeof(float)), 0);
        assert_int_equal(cuda_adamw(dst[0], dst[1], dst[2], src[0], src[1], src[2], dg, step % 2 ? 5.0f : clip,
                                    step % 2 ? dclip : NULL, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, NULL, NULL,
                                    NULL),
                         0);
        for (int j = 0; j < 3; j++) {
            assert_int_equal(cuda_copy_to_host(got, dst[j], bytes), 0);
            assert_int_equal(cuda_copy_to_host(want, in[j], bytes), 0);
            assert_memory_equal(got, want, bytes);
            assert_int_equal(cuda_copy_to_host(got, src[j], bytes), 0);
            assert_memory_equal(got, saved + j * n, bytes);
        }
    }
    for (int j = 0; j < 3; j++)
        cuda_free(in[j]), cuda_free(bank[0][j]), cuda_free(bank[1][j]);
    cuda_free(dg);
    cuda_free(dscaled);
    cuda_free(dclip);
    free(h), free(nan), free(got), free(want), free(saved);
}

/* The GPU's step is the CPU's, bit for bit (kernels/adamw.h: the same operations in the same
 * order, none fused), over 3 steps with a clip factor and weight decay: for arrays that start
 * 16-byte aligned (the kernel's four-at-a-time body, and its one-by-one edges when n is not a
 * multiple of 4), that start 4, 8 or 12 bytes in (the head one by one), and whose starts
 * differ in alignment (all one by one). On a GPU this is what checks that nvcc fused nothing. */
static void test_cuda_adamw_is_the_cpu_step_bitwise(void **state)
{
    if (cuda_device_count() == 0) {
        print_message("no CUDA device: skipping (%s)\n", cuda_last_error());
        skip();
    }
    const size_t n = 40009, cap = n + 8, bytes = cap * sizeof(float);
    /* start of p, m, v, p0, m0, v0, g (in floats) */
    static const size_t at[][7] = {{0, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1, 1}, {3, 3, 3, 3, 3, 3, 3},
                                   {2, 2, 2, 6, 6, 6, 2}, {0, 1, 2, 3, 0, 1, 5}};
    float *h[7], *d[7], *got = malloc(bytes);
    for (int k = 0; k < 7; k++) {
        h[k] = malloc(bytes);
        assert_int_equal(cuda_alloc((void **)&d[k], bytes), 0);
    }
    for (size_t c = 0; c < sizeof(at) / sizeof(at[0]); c++) {
        for (int k = 0; k < 7; k++) {
            tu_fill(NULL, h[k], cap, 700 + 10 * c + k, k == 3 ? 1.0 : 0.1);
            if (k == 2 || k == 5) /* second moments are >= 0: a later step reads v's edges as v0 */
                for (size_t i = 0; i < cap; i++)
                    h[k][i] *= h[k][i];
            assert_int_equal(cuda_copy_to_device(d[k], h[k], bytes), 0);
        }
        for (int step = 1; step <= 3; step++) {
            float gs = step == 2 ? 0.37f : 1.0f, lr = 3e-4f * step, wd = step == 3 ? 0.0f : 0.1f;
            const size_t *o = at[c];
            ops_adamw_to(NULL, h[0] + o[0], h[1] + o[1], h[2] + o[2], h[3] + o[3], h[4] + o[4], h[5] + o[5],
                         h[6] + o[6], gs, n, lr, 0.9f, 0.95f, 1e-8f, wd, step);
            assert_int_equal(cuda_adamw(d[0] + o[0], d[1] + o[1], d[2] + o[2], d[3] + o[3], d[4] + o[4],
                                        d[5] + o[5], d[6] + o[6], gs, NULL, n, lr, 0.9f, 0.95f, 1e-8f, wd, step, NULL,
                                        NULL, NULL),
                             0);
            for (int k = 0; k < 3; k++) {
                assert_int_equal(cuda_copy_to_host(got, d[k], bytes), 0);
                for (size_t i = 0; i < cap; i++)
                    if (memcmp(&got[i], &h[k][i], sizeof(float)))
                        fail_msg("case %zu step %d: %s[%zu] is %.9g on the GPU, %.9g on the CPU", c, step,
                                 k == 0 ? "param" : k == 1 ? "m" : "v", i, got[i], h[k][i]);
            }
            /* the next step from what this one wrote, as a run's banks alternate */
            for (int k = 0; k < 3; k++) {
                memcpy(h[k + 3], h[k], bytes);
                assert_int_equal(cuda_copy_to_device(d[k + 3], h[k], bytes), 0);
            }
        }
    }
    for (int k = 0; k < 7; k++)
        cuda_free(d[k]), free(h[k]);
    free(got);
}

/* The optimizer shard's publish in AdamW's pass (w_out, g_clear) gives the bits of the separate
 * calls it replaces (cuda_f32_to_bf16_dev of the new weights, a zeroed gradient) and the same
 * state, and writes nothing outside [0, n): with every array aligned (four at a time), with
 * w_out or g_clear alone off the alignment (one by one), with the gradient cleared in place and
 * elsewhere, over a NaN and an infinity among the weights. */
static void test_cuda_adamw_writes_the_weights_and_clears_the_gradient_as_the_separate_calls(void **state)
{
    if (cuda_device_count() == 0) {
        print_message("no CUDA device: skipping (%s)\n", cuda_last_error());
        skip();
    }
    const size_t n = 20011, cap = n + 16, fb = cap * sizeof(float), hb = cap * sizeof(uint16_t);
    /* in floats (bf16 for w_out): the start of the state arrays, of w_out, of g_clear (-1: g itself) */
    static const long at[][3] = {{0, 0, -1}, {0, 0, 8}, {4, 1, -1}, {0, 2, 3}, {1, 1, -1}};
    float *h[4], *d[4], *ref[3], *dc, *got = malloc(fb);
    uint16_t *dw, *dwant, *hw = malloc(hb), *hwant = malloc(hb);
    for (int k = 0; k < 4; k++) {
        h[k] = malloc(fb);
        assert_int_equal(cuda_alloc((void **)&d[k], fb), 0);
    }
    for (int k = 0; k < 3; k++)
        assert_int_equal(cuda_alloc((void **)&ref[k], fb), 0);
    assert_int_equal(cuda_alloc((void **)&dc, fb), 0);
    assert_int_equal(cuda_alloc((void **)&dw, hb), 0);
    assert_int_equal(cuda_alloc((void **)&dwant, hb), 0);
    for (size_t c = 0; c < sizeof(at) / sizeof(at[0]); c++) {
        size_t o = (size_t)at[c][0], ow = (size_t)at[c][1];
        for (int k = 0; k < 4; k++) { /* p, m, v, g */
            tu_fill(NULL, h[k], cap, 900 + 10 * c + k, k == 0 ? 1.0 : 0.1);
            if (k == 2)
                for (size_t i = 0; i < cap; i++)
                    h[k][i] *= h[k][i];
            assert_int_equal(cuda_copy_to_device(d[k], h[k], fb), 0);
            if (k < 3)
                assert_int_equal(cuda_copy_to_device(ref[k], h[k], fb), 0);
        }
        h[0][o + 5] = NAN, h[0][o + 6] = INFINITY;
        assert_int_equal(cuda_copy_to_device(d[0], h[0], fb), 0);
        assert_int_equal(cuda_copy_to_device(ref[0], h[0], fb), 0);
        memset(hw, 0x5a, hb);
        assert_int_equal(cuda_copy_to_device(dw, hw, hb), 0);
        assert_int_equal(cuda_copy_to_device(dwant, hw, hb), 0);
        float *clear = at[c][2] < 0 ? d[3] + o : dc + at[c][2];
        if (at[c][2] >= 0)
            assert_int_equal(cuda_copy_to_device(dc, h[3], fb), 0); /* anything but zeros */
        /* the separate calls: the step in place, the weights converted, the gradient cleared */
        assert_int_equal(cuda_adamw(ref[0] + o, ref[1] + o, ref[2] + o, ref[0] + o, ref[1] + o, ref[2] + o, d[3] + o,
                                    0.5f, NULL, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, NULL, NULL, NULL),
                         0);
        assert_int_equal(cuda_f32_to_bf16_dev(dwant + ow, ref[0] + o, n, NULL), 0);
        /* in one pass */
        assert_int_equal(cuda_adamw(d[0] + o, d[1] + o, d[2] + o, d[0] + o, d[1] + o, d[2] + o, d[3] + o, 0.5f, NULL, n,
                                    1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, dw + ow, clear, NULL),
                         0);
        assert_int_equal(cuda_stream_sync(NULL), 0);
        float *want = malloc(fb);
        for (int k = 0; k < 3; k++) {
            assert_int_equal(cuda_copy_to_host(got, d[k], fb), 0);
            assert_int_equal(cuda_copy_to_host(want, ref[k], fb), 0);
            assert_memory_equal(got, want, fb);
        }
        free(want);
        assert_int_equal(cuda_copy_to_host(hw, dw, hb), 0);
        assert_int_equal(cuda_copy_to_host(hwant, dwant, hb), 0);
        for (size_t i = 0; i < cap; i++)
            if (hw[i] != hwant[i])
                fail_msg("case %zu: w_out[%zu] is 0x%04x, the separate conversion's 0x%04x", c, i, hw[i], hwant[i]);
        /* the cleared range is zeros, the rest of that array as it was */
        float *cleared = at[c][2] < 0 ? d[3] : dc;
        size_t c0 = at[c][2] < 0 ? o : (size_t)at[c][2];
        assert_int_equal(cuda_copy_to_host(got, cleared, fb), 0);
        for (size_t i = 0; i < cap; i++) {
            int in = i >= c0 && i < c0 + n;
            if (in ? got[i] != 0.0f || signbit(got[i]) : memcmp(&got[i], &h[3][i], sizeof(float)))
                fail_msg("case %zu: the gradient at %zu is %.9g (%s)", c, i, got[i], in ? "cleared" : "outside");
        }
    }
    for (int k = 0; k < 4; k++)
        cuda_free(d[k]), free(h[k]);
    for (int k = 0; k < 3; k++)
        cuda_free(ref[k]);
    cuda_free(dc), cuda_free(dw), cuda_free(dwant);
    free(got), free(hw), free(hwant);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_adamw_matches_reference_over_steps),
        cmocka_unit_test(test_cuda_adamw_out_of_place_is_in_place_bitwise),
        cmocka_unit_test(test_cuda_adamw_is_the_cpu_step_bitwise),
        cmocka_unit_test(test_cuda_adamw_writes_the_weights_and_clears_the_gradient_as_the_separate_calls),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
