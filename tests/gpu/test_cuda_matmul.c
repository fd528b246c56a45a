/* cuBLASLt Linear products (kernels/cuda/matmul.cu) against the double reference ops on the
 * same bf16-rounded inputs; argument checks run everywhere, the rest is skipped with a message
 * where there is no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_matmul.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ref/ref_ops.h"
#include "tests/testutil.h"

/* Tolerances: |got - ref| <= ATOL * rms(ref) + RTOL * |ref|, ref in double from the same
 * bf16 inputs (bf16 x bf16 products are exact in fp32, so input rounding is not an error).
 * The absolute part is relative to the output's typical size because the fp32 sum's error is:
 * it scales with the partial sums, not with the element, and covers elements that cancel.
 * bf16 outputs (fwd, bwd_x): fp32 sum rounded once to bf16 (matmul.cu keeps split-K partials in
 * fp32): one rounding is at most 2^-8 = 3.9e-3 relative -> RTOL 5e-3. Tensor cores truncate
 * when they add into the fp32 accumulator, a bias of up to 2^-23 per 16-deep step: for
 * K = 5632 that is ~352 * 1.2e-7 = 4e-5 of the partial sums -> ATOL 1e-3 (25x margin, still
 * 4x below one bf16 rounding of a typical element).
 * fp32 output (bwd_w, K = N <= 1024): the same truncation, ~64 * 1.2e-7 = 8e-6 -> 1e-4 both
 * ways; an extra bf16 rounding anywhere (4e-3) or a wrong layout (O(1)) fails by far. */
#define BF16_RTOL 5e-3
#define BF16_ATOL 1e-3
#define F32_RTOL 1e-4
#define F32_ATOL 1e-4
/* Outputs of big shapes are checked on this many rows (first, last and spread between): the
 * double reference of a whole 1024 x 2048 x 5632 product takes minutes on a CPU. */
#define CHECK_ROWS 48

struct shape {
    int N, Din, Dout;
};
static const struct shape shapes[] = {
    {1, 1, 1},
    {37, 96, 50}, /* odd: leading dimensions not multiples of 8 elements */
    {64, 128, 256},
    {1024, 2048, 5632}, /* a Llama-7B-like MLP at 1024 tokens */
};
#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

static int need_gpu(void)
{
    if (cuda_device_count() > 0)
        return 1;
    cuda_matmul_ctx_t *ctx = NULL;
    cuda_matmul_ctx_new(&ctx); /* fails, and says why (no GPU, or a driver too old) */
    print_message("skipping: %s\n", cuda_matmul_last_error());
    return 0;
}

/* Rows to check out of `total`: all of them, or CHECK_ROWS spread over them with both ends. */
static int pick_rows(int total, int *rows)
{
    if (total <= CHECK_ROWS) {
        for (int i = 0; i < total; i++)
            rows[i] = i;
        return total;
    }
    for (int i = 0; i < CHECK_ROWS; i++)
        rows[i] = (int)((int64_t)i * (total - 1) / (CHECK_ROWS - 1));
    return CHECK_ROWS;
}

static double rms(const double *a, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * a[i];
    return sqrt(s / (double)n);
}

static size_t compare_bf16(const char *what, const uint16_t *got, const double *ref, size_t n)
{
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = tu_bf16_to_f32(got[i]);
    size_t bad = tu_compare(what, f, ref, n, BF16_ATOL * rms(ref, n), BF16_RTOL);
    free(f);
    return bad;
}

/* got = C + P (C the bf16 output added to, P the exact product), with the rounding of the
 * result and also one of the product: on an H200 (cuBLASLt 13.0, its sm90 kernels) beta 1 into
 * a bf16 output gave bf16(bf16(P) + C) in 8191 of 8192 elements, as if the product were stored
 * before the add, as PyTorch's bf16 autograd adds separately rounded gradients; older kernels
 * (odd shapes) round once. Ignoring C, adding it twice or a wrong layout still fails by far. */
static size_t compare_bf16_sum(const char *what, const uint16_t *got, const double *c, const double *p,
                               size_t n)
{
    double *ref = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        ref[i] = c[i] + p[i];
    double atol = BF16_ATOL * rms(ref, n), worst = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs(tu_bf16_to_f32(got[i]) - ref[i]);
        double tol = atol + BF16_RTOL * fabs(ref[i]) + BF16_RTOL * fabs(p[i]);
        if (!(err <= tol) && bad++ < 5)
            fprintf(stderr, "%s[%zu]: got %.9g want %.9g (err %.3g > tol %.3g)\n", what, i,
                    (double)tu_bf16_to_f32(got[i]), ref[i], err, tol);
        if (err > worst)
            worst = err;
    }
    if (bad)
        fprintf(stderr, "%s: %zu of %zu outside tolerance, worst abs err %.3g\n", what, bad, n, worst);
    free(ref);
    return bad;
}

static void *dev_upload(const void *h, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cuda_alloc(&d, bytes), 0);
    if (h)
        assert_int_equal(cuda_copy_to_device(d, h, bytes), 0);
    return d;
}

/* Copies rows `rows` of a [*, cols] array (elements of `es` bytes) into dst. */
static void gather_rows(void *dst, const void *src, const int *rows, int k, int cols, size_t es)
{
    for (int j = 0; j < k; j++)
        memcpy((char *)dst + (size_t)j * cols * es, (const char *)src + (size_t)rows[j] * cols * es,
               cols * es);
}

static void test_cuda_matmul_fwd_matches_reference(void **state)
{
    if (!need_gpu())
        skip();
    cuda_matmul_ctx_t *ctx = NULL;
    assert_int_equal(cuda_matmul_ctx_new(&ctx), 0);
    for (size_t s = 0; s < NSHAPES; s++) {
        int N = shapes[s].N, I = shapes[s].Din, O = shapes[s].Dout;
        size_t nx = (size_t)N * I, nw = (size_t)O * I, ny = (size_t)N * O;
        uint16_t *x = malloc(nx * 2), *w = malloc(nw * 2), *y = malloc(ny * 2), *y2 = malloc(ny * 2);
        double *xd = malloc(nx * 8), *wd = malloc(nw * 8);
        tu_fill_bf16(x, xd, nx, 10 + s, 1.0);
        tu_fill_bf16(w, wd, nw, 20 + s, 1.0);
        uint16_t *dx_ = dev_upload(x, nx * 2), *dw_ = dev_upload(w, nw * 2), *dy_ = dev_upload(NULL, ny * 2);
        assert_int_equal(cuda_matmul_fwd(ctx, dy_, dx_, dw_, N, I, O, NULL), 0);
        assert_int_equal(cuda_copy_to_host(y, dy_, ny * 2), 0);

        int rows[CHECK_ROWS], k = pick_rows(N, rows);
        double *xs = malloc((size_t)k * I * 8), *ref = malloc((size_t)k * O * 8);
        uint16_t *ys = malloc((size_t)k * O * 2);
        gather_rows(xs, xd, rows, k, I, 8);
        gather_rows(ys, y, rows, k, O, 2);
        ref_matmul_fwd(ref, xs, wd, k, I, O);
        char what[64];
        snprintf(what, sizeof(what), "fwd %dx%dx%d", N, I, O);
        assert_int_equal(compare_bf16(what, ys, ref, (size_t)k * O), 0);

        /* Same call, same plan, same bits. */
        assert_int_equal(cuda_matmul_fwd(ctx, dy_, dx_, dw_, N, I, O, NULL), 0);
        assert_int_equal(cuda_copy_to_host(y2, dy_, ny * 2), 0);
        assert_memory_equal(y, y2, ny * 2);

        cuda_free(dx_), cuda_free(dw_), cuda_free(dy_);
        free(x), free(w), free(y), free(y2), free(xd), free(wd), free(xs), free(ref), free(ys);
    }
    cuda_matmul_ctx_destroy(&ctx);
    assert_null(ctx);
}

/* dx = dy W with accumulate 0 on a dx full of NaN (beta 0 must not read it), then accumulate 1
 * adds a second product to the bf16 result of the first (compare_bf16_sum: two roundings). */
static void test_cuda_matmul_bwd_x_matches_reference_and_accumulates(void **state)
{
    if (!need_gpu())
        skip();
    cuda_matmul_ctx_t *ctx = NULL;
    assert_int_equal(cuda_matmul_ctx_new(&ctx), 0);
    for (size_t s = 0; s < NSHAPES; s++) {
        int N = shapes[s].N, I = shapes[s].Din, O = shapes[s].Dout;
        size_t nx = (size_t)N * I, nw = (size_t)O * I, ny = (size_t)N * O;
        uint16_t *g1 = malloc(ny * 2), *g2 = malloc(ny * 2), *w = malloc(nw * 2), *dx = malloc(nx * 2);
        double *g1d = malloc(ny * 8), *g2d = malloc(ny * 8), *wd = malloc(nw * 8);
        tu_fill_bf16(g1, g1d, ny, 30 + s, 1.0);
        tu_fill_bf16(g2, g2d, ny, 40 + s, 1.0);
        tu_fill_bf16(w, wd, nw, 50 + s, 1.0);
        for (size_t i = 0; i < nx; i++)
            dx[i] = 0x7fc0; /* NaN */
        uint16_t *dg1 = dev_upload(g1, ny * 2), *dg2 = dev_upload(g2, ny * 2), *dw_ = dev_upload(w, nw * 2);
        uint16_t *ddx = dev_upload(dx, nx * 2);

        int rows[CHECK_ROWS], k = pick_rows(N, rows);
        double *gs = malloc((size_t)k * O * 8), *ref = malloc((size_t)k * I * 8);
        uint16_t *dxs = malloc((size_t)k * I * 2);
        char what[64];

        assert_int_equal(cuda_matmul_bwd_x(ctx, ddx, dg1, dw_, N, I, O, 0, NULL), 0);
        assert_int_equal(cuda_copy_to_host(dx, ddx, nx * 2), 0);
        gather_rows(gs, g1d, rows, k, O, 8);
        gather_rows(dxs, dx, rows, k, I, 2);
        ref_matmul_bwd_x(ref, gs, wd, k, I, O, 0);
        snprintf(what, sizeof(what), "bwd_x %dx%dx%d", N, I, O);
        assert_int_equal(compare_bf16(what, dxs, ref, (size_t)k * I), 0);

        /* The reference starts from the GPU's bf16 first result (C) and adds the exact product. */
        double *c = malloc((size_t)k * I * 8), *prod = malloc((size_t)k * I * 8);
        for (size_t i = 0; i < (size_t)k * I; i++)
            c[i] = tu_bf16_to_f32(dxs[i]);
        assert_int_equal(cuda_matmul_bwd_x(ctx, ddx, dg2, dw_, N, I, O, 1, NULL), 0);
        assert_int_equal(cuda_copy_to_host(dx, ddx, nx * 2), 0);
        gather_rows(gs, g2d, rows, k, O, 8);
        gather_rows(dxs, dx, rows, k, I, 2);
        ref_matmul_bwd_x(prod, gs, wd, k, I, O, 0);
        snprintf(what, sizeof(what), "bwd_x accumulated %dx%dx%d", N, I, O);
        assert_int_equal(compare_bf16_sum(what, dxs, c, prod, (size_t)k * I), 0);
        free(c), free(prod);

        cuda_free(dg1), cuda_free(dg2), cuda_free(dw_), cuda_free(ddx);
        free(g1), free(g2), free(w), free(dx), free(g1d), free(g2d), free(wd), free(gs), free(ref), free(dxs);
    }
    cuda_matmul_ctx_destroy(&ctx);
}

/* dW starts from fp32 values and takes two microbatches: dW0 + dy1^T x1 + dy2^T x2. */
static void test_cuda_matmul_bwd_w_accumulates_microbatches(void **state)
{
    if (!need_gpu())
        skip();
    cuda_matmul_ctx_t *ctx = NULL;
    assert_int_equal(cuda_matmul_ctx_new(&ctx), 0);
    for (size_t s = 0; s < NSHAPES; s++) {
        int N = shapes[s].N, I = shapes[s].Din, O = shapes[s].Dout;
        size_t nx = (size_t)N * I, nw = (size_t)O * I, ny = (size_t)N * O;
        uint16_t *x[2], *g[2];
        double *xd[2], *gd[2];
        uint16_t *dxb[2], *dgb[2];
        for (int m = 0; m < 2; m++) {
            x[m] = malloc(nx * 2), g[m] = malloc(ny * 2), xd[m] = malloc(nx * 8), gd[m] = malloc(ny * 8);
            tu_fill_bf16(x[m], xd[m], nx, 60 + 10 * s + m, 1.0);
            tu_fill_bf16(g[m], gd[m], ny, 70 + 10 * s + m, 1.0);
            dxb[m] = dev_upload(x[m], nx * 2), dgb[m] = dev_upload(g[m], ny * 2);
        }
        float *dw = malloc(nw * 4);
        double *dw0 = malloc(nw * 8);
        tu_fill(dw0, dw, nw, 80 + s, 1.0);
        float *ddw = dev_upload(dw, nw * 4);
        for (int m = 0; m < 2; m++)
            assert_int_equal(cuda_matmul_bwd_w(ctx, ddw, dgb[m], dxb[m], N, I, O, NULL), 0);
        assert_int_equal(cuda_copy_to_host(dw, ddw, nw * 4), 0);

        /* Rows o of dW need columns o of dy. */
        int rows[CHECK_ROWS], k = pick_rows(O, rows);
        double *ref = malloc((size_t)k * I * 8), *gs = malloc((size_t)N * k * 8);
        float *dws = malloc((size_t)k * I * 4);
        gather_rows(ref, dw0, rows, k, I, 8);
        gather_rows(dws, dw, rows, k, I, 4);
        for (int m = 0; m < 2; m++) {
            for (int n = 0; n < N; n++)
                for (int j = 0; j < k; j++)
                    gs[(size_t)n * k + j] = gd[m][(size_t)n * O + rows[j]];
            ref_matmul_bwd_w(ref, gs, xd[m], N, I, k);
        }
        char what[64];
        snprintf(what, sizeof(what), "bwd_w %dx%dx%d", N, I, O);
        size_t n = (size_t)k * I;
        assert_int_equal(tu_compare(what, dws, ref, n, F32_ATOL * rms(ref, n), F32_RTOL), 0);

        for (int m = 0; m < 2; m++) {
            cuda_free(dxb[m]), cuda_free(dgb[m]);
            free(x[m]), free(g[m]), free(xd[m]), free(gd[m]);
        }
        cuda_free(ddw);
        free(dw), free(dw0), free(ref), free(gs), free(dws);
    }
    cuda_matmul_ctx_destroy(&ctx);
}

/* Tensors at an offset inside an allocation are only 2-byte (bf16) or 4-byte (fp32) aligned:
 * the plan must not assume cudaMalloc's 256 bytes. */
static void test_cuda_matmul_handles_unaligned_buffers(void **state)
{
    if (!need_gpu())
        skip();
    cuda_matmul_ctx_t *ctx = NULL;
    assert_int_equal(cuda_matmul_ctx_new(&ctx), 0);
    int N = 37, I = 96, O = 50;
    size_t nx = (size_t)N * I, nw = (size_t)O * I, ny = (size_t)N * O;
    uint16_t *x = malloc(nx * 2), *w = malloc(nw * 2), *y = malloc(ny * 2);
    double *xd = malloc(nx * 8), *wd = malloc(nw * 8), *gd = malloc(ny * 8), *ref = malloc(nw * 8);
    tu_fill_bf16(x, xd, nx, 91, 1.0);
    tu_fill_bf16(w, wd, nw, 92, 1.0);
    uint16_t *bx = dev_upload(NULL, nx * 2 + 2), *bw = dev_upload(NULL, nw * 2 + 2), *by = dev_upload(NULL, ny * 2 + 2);
    float *bdw = dev_upload(NULL, nw * 4 + 4), *dw = malloc(nw * 4);
    assert_int_equal(cuda_copy_to_device(bx + 1, x, nx * 2), 0);
    assert_int_equal(cuda_copy_to_device(bw + 1, w, nw * 2), 0);

    assert_int_equal(cuda_matmul_fwd(ctx, by + 1, bx + 1, bw + 1, N, I, O, NULL), 0);
    assert_int_equal(cuda_copy_to_host(y, by + 1, ny * 2), 0);
    ref_matmul_fwd(gd, xd, wd, N, I, O);
    assert_int_equal(compare_bf16("fwd unaligned", y, gd, ny), 0);

    /* y (bf16-rounded, held in gd) as dy: dW = y^T x from zero. */
    for (size_t i = 0; i < ny; i++)
        gd[i] = tu_bf16_to_f32(y[i]);
    float *zero = calloc(nw, 4);
    assert_int_equal(cuda_copy_to_device(bdw + 1, zero, nw * 4), 0);
    assert_int_equal(cuda_matmul_bwd_w(ctx, bdw + 1, by + 1, bx + 1, N, I, O, NULL), 0);
    assert_int_equal(cuda_copy_to_host(dw, bdw + 1, nw * 4), 0);
    memset(ref, 0, nw * 8);
    ref_matmul_bwd_w(ref, gd, xd, N, I, O);
    assert_int_equal(tu_compare("bwd_w unaligned", dw, ref, nw, F32_ATOL * rms(ref, nw), F32_RTOL), 0);

    cuda_free(bx), cuda_free(bw), cuda_free(by), cuda_free(bdw);
    free(x), free(w), free(y), free(xd), free(wd), free(gd), free(ref), free(dw), free(zero);
    cuda_matmul_ctx_destroy(&ctx);
}

static void expect_einval(int rc, const char *needle)
{
    assert_int_equal(rc, -EINVAL);
    if (!strstr(cuda_matmul_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", cuda_matmul_last_error(), needle);
}

/* Checked before the device is touched, so this part runs without a GPU too. */
static void check_bad_arguments(cuda_matmul_ctx_t *ctx)
{
    static uint16_t a[64], b[64], c[64];
    static float f[64];
    expect_einval(cuda_matmul_fwd(ctx, c, a, b, 0, 4, 4, NULL), "shape");
    expect_einval(cuda_matmul_fwd(ctx, c, a, b, 4, -1, 4, NULL), "shape");
    expect_einval(cuda_matmul_bwd_x(ctx, c, a, b, 4, 4, 0, 1, NULL), "shape");
    expect_einval(cuda_matmul_fwd(ctx, NULL, a, b, 4, 4, 4, NULL), "NULL");
    expect_einval(cuda_matmul_bwd_w(ctx, f, NULL, b, 4, 4, 4, NULL), "NULL");
    expect_einval(cuda_matmul_fwd(ctx, a + 8, a, b, 4, 4, 4, NULL), "overlaps");
    expect_einval(cuda_matmul_bwd_x(ctx, c, a, c + 15, 4, 4, 4, 0, NULL), "overlaps");
    expect_einval(cuda_matmul_fwd(ctx, c, (uint16_t *)((char *)a + 1), b, 4, 4, 4, NULL), "misaligned");
    expect_einval(cuda_matmul_bwd_w(ctx, (float *)((char *)f + 2), a, b, 4, 4, 4, NULL), "misaligned");
    double t = 1;
    expect_einval(cuda_matmul_peak_tflops(0, &t), "n=0");
    expect_einval(cuda_matmul_peak_tflops(1024, NULL), "n=1024");
    expect_einval(cuda_matmul_ctx_new(NULL), "NULL");
}

static void test_cuda_matmul_rejects_bad_arguments(void **state)
{
    static uint16_t a[64], b[64], c[64];
    check_bad_arguments(NULL);
    expect_einval(cuda_matmul_fwd(NULL, c, a, b, 4, 4, 4, NULL), "NULL context");
    cuda_matmul_ctx_t *ctx = (cuda_matmul_ctx_t *)1;
    if (cuda_device_count() == 0) {
        assert_int_equal(cuda_matmul_ctx_new(&ctx), -ENODEV);
        assert_null(ctx);
        print_message("no CUDA device: checked arguments without a context only\n");
        return;
    }
    assert_int_equal(cuda_matmul_ctx_new(&ctx), 0);
    check_bad_arguments(ctx);
    cuda_matmul_ctx_destroy(&ctx);
    assert_null(ctx);
    cuda_matmul_ctx_destroy(&ctx); /* no-op */
}

static void test_cuda_matmul_peak_tflops_is_measured(void **state)
{
    if (!need_gpu())
        skip();
    double t = 0;
    assert_int_equal(cuda_matmul_peak_tflops(8192, &t), 0);
    print_message("bf16 8192^3 peak: %.1f TFLOP/s\n", t);
    assert_true(t > 1 && t < 10000); /* an H100 SXM's dense bf16 spec is 989 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_matmul_rejects_bad_arguments),
        cmocka_unit_test(test_cuda_matmul_fwd_matches_reference),
        cmocka_unit_test(test_cuda_matmul_bwd_x_matches_reference_and_accumulates),
        cmocka_unit_test(test_cuda_matmul_bwd_w_accumulates_microbatches),
        cmocka_unit_test(test_cuda_matmul_handles_unaligned_buffers),
        cmocka_unit_test(test_cuda_matmul_peak_tflops_is_measured),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
