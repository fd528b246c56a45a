/* The bf16 CUDA kernels of kernels/cuda/cuda_nn.h against the double references of kernels/ref on
 * the same bf16-rounded inputs, forward and backward, on sizes that are not multiples of the
 * block sizes; bitwise determinism where there are sums; bad arguments. Tests that need a GPU
 * skip with a message where there is none; the bf16 helpers and argument checks run anywhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/config.h"
#include "kernels/cuda/cuda_nn.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "kernels/ref/ref_ops.h"
#include "tests/testutil.h"

/* Tolerances, atol + rtol*|ref|, against the double reference run on the same bf16 values.
 * bf16 outputs: the kernel rounds its fp32 result once to 8 significant bits, up to 2^-8 = 3.9e-3
 *   relative; the fp32 arithmetic before that is ~1e-6 relative. BF16_RTOL = 2^-7 leaves a
 *   factor 2; BF16_ATOL covers fp32 cancellation (x1 cos - x2 sin, r g w - k x) on data of size
 *   ~1, whose error is ~1e-6. A wrong index or a missing term shows as errors of ~1e-1.
 *   (Where outputs are much smaller than 1, as softmax gradients, atol is scaled down with them.)
 * fp32 values computed once from a few terms (rstd, rope tables): F32_ATOL, F32_RTOL.
 * fp32 sums over many terms (dw over 1000 rows, loss over 128k exps): F32_SUM_ATOL; their
 *   typical rounding error is ~1e-5 at most, one missing row is ~1e-1. */
#define BF16_RTOL 0x1p-7
#define BF16_ATOL 1e-4
#define F32_RTOL 1e-5
#define F32_ATOL 1e-6
#define F32_SUM_ATOL 1e-4

/* Under tests/cudasim (the CPU emulator `make test` runs this program on: a fiber per CUDA
 * thread, thousands of times slower than a GPU) the largest cases are cut down. */
#ifdef CUDASIM
#define SIM_OR(sim, gpu) (sim)
#else
#define SIM_OR(sim, gpu) (gpu)
#endif

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (cuda_device_count() == 0) {                                                            \
            print_message("no CUDA device (cudaGetDeviceCount finds none): skipping\n");         \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* ---- host buffers and data ---- */

static void *hbuf(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

/* bf16 values uniform in [offset - scale, offset + scale): bits in h, the same values in d. */
static void fill_bf16(uint16_t *h, double *d, size_t n, uint64_t seed, double scale, double offset)
{
    float *f = hbuf(n * sizeof(float));
    tu_fill(NULL, f, n, seed, scale);
    for (size_t i = 0; i < n; i++)
        f[i] += (float)offset;
    cuda_f32_to_bf16(h, f, n);
    cuda_bf16_to_f32(f, h, n);
    for (size_t i = 0; i < n; i++)
        d[i] = f[i];
    free(f);
}

static int32_t *tokens(size_t n, int V, uint64_t seed)
{
    int32_t *t = hbuf(n * sizeof(int32_t));
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        t[i] = (int32_t)(tu_next(&s) % (uint64_t)V);
    return t;
}

/* ---- device buffers ---- */

/* A device buffer of `bytes`, holding a copy of src unless src is NULL. */
static void *dev_put(const void *src, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(cuda_alloc(&p, bytes ? bytes : 1), 0);
    if (src && bytes)
        assert_int_equal(cuda_copy_to_device(p, src, bytes), 0);
    return p;
}

static void dev_get(void *dst, const void *dev, size_t bytes)
{
    assert_int_equal(cuda_copy_to_host(dst, dev, bytes), 0);
}

/* n bf16 values from the device, widened to fp32 (a new host buffer). */
static float *dev_get_bf16(const uint16_t *dev, size_t n)
{
    uint16_t *h = hbuf(n * sizeof(uint16_t));
    float *f = hbuf(n * sizeof(float));
    dev_get(h, dev, n * sizeof(uint16_t));
    cuda_bf16_to_f32(f, h, n);
    free(h);
    return f;
}

static void expect_ok(int rc)
{
    if (rc != 0)
        fprintf(stderr, "launcher returned %d: %s\n", rc, cuda_nn_last_error());
    assert_int_equal(rc, 0);
}

/* ------------------------------------------------------------------------------------------
 * Host-only behaviour: runs with or without a GPU. */

static uint16_t bf(float f)
{
    uint16_t h;
    cuda_f32_to_bf16(&h, &f, 1);
    return h;
}

static void test_bf16_conversion_rounds_to_nearest_even(void **state)
{
    (void)state;
    assert_int_equal(bf(1.0f), 0x3f80);
    assert_int_equal(bf(-2.0f), 0xc000);
    assert_int_equal(bf(1.0f + 0x1p-8f), 0x3f80);          /* tie: down to the even 1.0 */
    assert_int_equal(bf(1.0f + 3 * 0x1p-8f), 0x3f82);      /* tie: up to the even 1 + 2^-6 */
    assert_int_equal(bf(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81); /* above the tie */
    assert_int_equal(bf(1.0f + 0x1p-8f - 0x1p-20f), 0x3f80); /* below the tie */
    assert_int_equal(bf(INFINITY), 0x7f80);
    assert_int_equal(bf(-INFINITY), 0xff80);
    assert_int_equal(bf(3.4028235e38f), 0x7f80); /* FLT_MAX is past bf16's largest + half ulp */
    assert_int_equal(bf(0x1p-149f), 0x0000);     /* smallest denormal rounds to zero */
    uint16_t nan = bf(NAN);
    assert_true((nan & 0x7f80) == 0x7f80 && (nan & 0x007f) != 0);
    float f;
    uint16_t back;
    for (uint32_t h = 0; h < 0x10000; h++) { /* every non-NaN bf16 survives the round trip */
        uint16_t x = (uint16_t)h;
        if ((x & 0x7f80) == 0x7f80 && (x & 0x7f))
            continue;
        cuda_bf16_to_f32(&f, &x, 1);
        cuda_f32_to_bf16(&back, &f, 1);
        assert_int_equal(back, x);
    }
}

/* Every launcher refuses bad shapes and NULL pointers before touching the device, and does
 * nothing (0) for empty work. The pointers are host arrays: never dereferenced on these paths. */
static void test_cuda_nn_rejects_bad_arguments(void **state)
{
    (void)state;
    uint16_t h[4] = {0};
    float f[4] = {0};
    int32_t t[4] = {0};
#define BAD(call, name)                                                                            \
    do {                                                                                           \
        assert_int_equal((call), -EINVAL);                                                         \
        assert_non_null(strstr(cuda_nn_last_error(), name));                                       \
    } while (0)
    BAD(cuda_embed_fwd(NULL, h, t, 4, 4, 4, NULL), "cuda_embed_fwd");
    BAD(cuda_embed_fwd(h, h, t, -1, 4, 4, NULL), "cuda_embed_fwd");
    BAD(cuda_embed_fwd(h, h, t, 4, 0, 4, NULL), "cuda_embed_fwd");
    BAD(cuda_embed_fwd(h, h, t, 4, 4, 0, NULL), "cuda_embed_fwd");
    BAD(cuda_embed_bwd(f, h, NULL, 4, 4, 4, NULL), "cuda_embed_bwd");
    BAD(cuda_embed_bwd(f, h, t, 4, 4, -3, NULL), "cuda_embed_bwd");
    BAD(cuda_rmsnorm_fwd(h, NULL, h, h, 4, 4, 1e-5f, NULL), "cuda_rmsnorm_fwd");
    BAD(cuda_rmsnorm_fwd(h, f, h, h, 4, 0, 1e-5f, NULL), "cuda_rmsnorm_fwd");
    BAD(cuda_rmsnorm_fwd(h, f, h, h, 4, 4, -1.0f, NULL), "cuda_rmsnorm_fwd");
    BAD(cuda_rmsnorm_bwd_x(h, h, h, f, NULL, 4, 4, h, NULL), "cuda_rmsnorm_bwd_x");
    BAD(cuda_rmsnorm_bwd_x(h, h, h, f, h, -2, 4, h, NULL), "cuda_rmsnorm_bwd_x");
    BAD(cuda_rmsnorm_bwd_w(f, h, h, NULL, 4, 4, NULL), "cuda_rmsnorm_bwd_w");
    BAD(cuda_rmsnorm_bwd_w(f, h, h, f, 4, 0, NULL), "cuda_rmsnorm_bwd_w");
    BAD(cuda_rope_table(f, f, 4, 7, 10000.0, NULL), "cuda_rope_table");
    BAD(cuda_rope_table(f, f, 4, 8, 0.0, NULL), "cuda_rope_table");
    BAD(cuda_rope_table(f, NULL, 4, 8, 10000.0, NULL), "cuda_rope_table");
    BAD(cuda_rope_fwd(h, f, f, 1, 2, 2, 5, NULL), "cuda_rope_fwd");
    BAD(cuda_rope_fwd(h, f, f, 1, -2, 2, 4, NULL), "cuda_rope_fwd");
    BAD(cuda_rope_bwd(NULL, f, f, 1, 2, 2, 4, NULL), "cuda_rope_bwd");
    BAD(cuda_rope_bwd(h, f, f, 1, 2, 2, 0, NULL), "cuda_rope_bwd");
    BAD(cuda_swiglu_fwd(h, NULL, h, 4, NULL), "cuda_swiglu_fwd");
    BAD(cuda_swiglu_bwd(h, h, h, h, NULL, 4, NULL), "cuda_swiglu_bwd");
    BAD(cuda_swiglu_bwd(h, h, h + 1, h + 2, h + 3, 1, NULL), "cuda_swiglu_bwd"); /* da == db */
    BAD(cuda_xent(h, f, h, NULL, 4, 4, 1.0f, NULL), "cuda_xent");
    BAD(cuda_xent(h, f, h, t, 4, 0, 1.0f, NULL), "cuda_xent");
    BAD(cuda_xent(h, f, h, t, -1, 4, 1.0f, NULL), "cuda_xent");
    BAD(cuda_xent(h, f, h, t, 4, 4, NAN, NULL), "cuda_xent");
#undef BAD
    /* empty work returns before any CUDA call */
    assert_int_equal(cuda_embed_fwd(h, h, t, 0, 4, 4, NULL), 0);
    assert_int_equal(cuda_embed_bwd(f, h, t, 0, 4, 4, NULL), 0);
    assert_int_equal(cuda_rmsnorm_fwd(h, f, h, h, 0, 4, 1e-5f, NULL), 0);
    assert_int_equal(cuda_rmsnorm_bwd_x(h, h, h, f, h, 0, 4, NULL, NULL), 0);
    assert_int_equal(cuda_rmsnorm_bwd_w(f, h, h, f, 0, 4, NULL), 0);
    assert_int_equal(cuda_rope_table(f, f, 0, 8, 10000.0, NULL), 0);
    assert_int_equal(cuda_rope_fwd(h, f, f, 0, 2, 2, 4, NULL), 0);
    assert_int_equal(cuda_swiglu_fwd(h, h, h, 0, NULL), 0);
    assert_int_equal(cuda_swiglu_bwd(h, h + 1, h, h, h, 0, NULL), 0);
    assert_int_equal(cuda_xent(h, f, h, t, 0, 4, 1.0f, NULL), 0);
}

/* ------------------------------------------------------------------------------------------
 * Embedding */

static void test_cuda_embed_fwd_copies_rows(void **state)
{
    (void)state;
    NEED_GPU();
    const int N = SIM_OR(200, 1000), V = 97, D = 777; /* D: 3 passes of 256 threads, the last partial */
    uint16_t *table = hbuf((size_t)V * D * 2);
    double *table_d = hbuf((size_t)V * D * 8), *out_d = hbuf((size_t)N * D * 8);
    fill_bf16(table, table_d, (size_t)V * D, 1, 1.0, 0.0);
    int32_t *tok = tokens(N, V, 2);
    uint16_t *dtab = dev_put(table, (size_t)V * D * 2), *dout = dev_put(NULL, (size_t)N * D * 2);
    int32_t *dtok = dev_put(tok, (size_t)N * 4);
    expect_ok(cuda_embed_fwd(dout, dtab, dtok, N, V, D, NULL));
    float *out = dev_get_bf16(dout, (size_t)N * D);
    ref_embed_fwd(out_d, table_d, tok, N, D);
    assert_int_equal(tu_compare("embed out", out, out_d, (size_t)N * D, 0, 0), 0); /* a copy */

    /* tokens outside [0, V) give rows of zeros and leave the others alone */
    tok[3] = -1;
    tok[4] = V;
    assert_int_equal(cuda_copy_to_device(dtok, tok, (size_t)N * 4), 0);
    expect_ok(cuda_embed_fwd(dout, dtab, dtok, N, V, D, NULL));
    free(out);
    out = dev_get_bf16(dout, (size_t)N * D);
    for (int n = 3; n <= 4; n++)
        for (int i = 0; i < D; i++)
            assert_true(out[(size_t)n * D + i] == 0.0f);
    assert_int_equal(tu_compare("embed row 5", out + 5 * D, out_d + 5 * D, D, 0, 0), 0);
    cuda_free(dtab), cuda_free(dout), cuda_free(dtok);
    free(table), free(table_d), free(out_d), free(tok), free(out);
}

static void test_cuda_embed_bwd_sums_rows_in_token_order(void **state)
{
    (void)state;
    NEED_GPU();
    const int N = SIM_OR(200, 1000), V = 97, D = 777;
    uint16_t *dout = hbuf((size_t)N * D * 2);
    double *dout_d = hbuf((size_t)N * D * 8), *dt_d = hbuf((size_t)V * D * 8);
    fill_bf16(dout, dout_d, (size_t)N * D, 3, 1.0, 0.0);
    int32_t *tok = tokens(N, V, 4);
    for (int n = 100; n < 170; n++) /* a long run of one id: one block sums 70+ rows */
        tok[n] = 5;
    tok[7] = -1, tok[8] = V; /* ignored */
    float *dt0 = hbuf((size_t)V * D * 4), *cpu = hbuf((size_t)V * D * 4), *got = hbuf((size_t)V * D * 4);
    tu_fill(dt_d, dt0, (size_t)V * D, 5, 1.0); /* dtable is added into */
    memcpy(cpu, dt0, (size_t)V * D * 4);

    /* CPU op and reference on the valid tokens, in the same order */
    float *dout_f = hbuf((size_t)N * D * 4);
    cuda_bf16_to_f32(dout_f, dout, (size_t)N * D);
    int32_t *vt = hbuf((size_t)N * 4);
    float *vrows = hbuf((size_t)N * D * 4);
    double *vrows_d = hbuf((size_t)N * D * 8);
    int nv = 0;
    for (int n = 0; n < N; n++) {
        if (tok[n] < 0 || tok[n] >= V)
            continue;
        vt[nv] = tok[n];
        memcpy(vrows + (size_t)nv * D, dout_f + (size_t)n * D, (size_t)D * 4);
        memcpy(vrows_d + (size_t)nv * D, dout_d + (size_t)n * D, (size_t)D * 8);
        nv++;
    }
    ops_embed_bwd(NULL, cpu, vrows, vt, nv, D);
    ref_embed_bwd(dt_d, vrows_d, vt, nv, D);

    uint16_t *ddout = dev_put(dout, (size_t)N * D * 2);
    int32_t *dtok = dev_put(tok, (size_t)N * 4);
    float *ddt = dev_put(dt0, (size_t)V * D * 4);
    expect_ok(cuda_embed_bwd(ddt, ddout, dtok, N, V, D, NULL));
    dev_get(got, ddt, (size_t)V * D * 4);
    assert_int_equal(tu_compare("embed dtable", got, dt_d, (size_t)V * D, F32_ATOL, F32_RTOL), 0);
    /* same additions in the same order as the CPU op: the same bits */
    assert_memory_equal(got, cpu, (size_t)V * D * 4);
    cuda_free(ddout), cuda_free(dtok), cuda_free(ddt);
    free(dout), free(dout_d), free(dt_d), free(tok), free(dt0), free(cpu), free(got), free(dout_f);
    free(vt), free(vrows), free(vrows_d);
}

/* ------------------------------------------------------------------------------------------
 * RMSNorm. Shapes: rows not a multiple of anything, D around and above the 256-thread block. */

static const int rms_shapes[][2] = {{SIM_OR(65, 257), 1000}, {3, 4099}, {40, 31}};

static void test_cuda_rmsnorm_fwd_matches_reference(void **state)
{
    (void)state;
    NEED_GPU();
    for (size_t s = 0; s < sizeof(rms_shapes) / sizeof(rms_shapes[0]); s++) {
        int N = rms_shapes[s][0], D = rms_shapes[s][1];
        size_t nd = (size_t)N * D;
        uint16_t *x = hbuf(nd * 2), *w = hbuf((size_t)D * 2);
        double *x_d = hbuf(nd * 8), *w_d = hbuf((size_t)D * 8), *out_d = hbuf(nd * 8);
        double *rstd_d = hbuf((size_t)N * 8);
        fill_bf16(x, x_d, nd, 10 + s, 1.0, 0.0);
        fill_bf16(w, w_d, D, 20 + s, 0.5, 1.0);
        ref_rmsnorm_fwd(out_d, rstd_d, x_d, w_d, N, D, 1e-5f);
        uint16_t *dx = dev_put(x, nd * 2), *dw = dev_put(w, (size_t)D * 2), *dout = dev_put(NULL, nd * 2);
        float *drstd = dev_put(NULL, (size_t)N * 4);
        expect_ok(cuda_rmsnorm_fwd(dout, drstd, dx, dw, N, D, 1e-5f, NULL));
        float *out = dev_get_bf16(dout, nd), *rstd = hbuf((size_t)N * 4);
        dev_get(rstd, drstd, (size_t)N * 4);
        assert_int_equal(tu_compare("rmsnorm out", out, out_d, nd, BF16_ATOL, BF16_RTOL), 0);
        assert_int_equal(tu_compare("rmsnorm rstd", rstd, rstd_d, N, F32_ATOL, F32_RTOL), 0);
        cuda_free(dx), cuda_free(dw), cuda_free(dout), cuda_free(drstd);
        free(x), free(w), free(x_d), free(w_d), free(out_d), free(rstd_d), free(out), free(rstd);
    }
}

/* Backward inputs: random dout, x, w, and rstd from the reference forward rounded to fp32 (the
 * same fp32 values go to the kernel and, widened, to the reference). */
struct rms_bwd {
    int N, D;
    uint16_t *dout, *x, *w;
    double *dout_d, *x_d, *w_d, *rstd_d;
    float *rstd;
};

static struct rms_bwd rms_bwd_inputs(int N, int D, uint64_t seed)
{
    size_t nd = (size_t)N * D;
    struct rms_bwd r = {N, D, hbuf(nd * 2), hbuf(nd * 2), hbuf((size_t)D * 2), hbuf(nd * 8),
                        hbuf(nd * 8), hbuf((size_t)D * 8), hbuf((size_t)N * 8), hbuf((size_t)N * 4)};
    fill_bf16(r.dout, r.dout_d, nd, seed, 1.0, 0.0);
    fill_bf16(r.x, r.x_d, nd, seed + 1, 1.0, 0.0);
    fill_bf16(r.w, r.w_d, D, seed + 2, 0.5, 1.0);
    double *tmp = hbuf(nd * 8);
    ref_rmsnorm_fwd(tmp, r.rstd_d, r.x_d, r.w_d, N, D, 1e-5f);
    for (int n = 0; n < N; n++) {
        r.rstd[n] = (float)r.rstd_d[n];
        r.rstd_d[n] = r.rstd[n];
    }
    free(tmp);
    return r;
}

static void rms_bwd_free(struct rms_bwd *r)
{
    free(r->dout), free(r->x), free(r->w), free(r->dout_d), free(r->x_d), free(r->w_d);
    free(r->rstd_d), free(r->rstd);
}

static void test_cuda_rmsnorm_bwd_x_matches_reference(void **state)
{
    (void)state;
    NEED_GPU();
    for (size_t s = 0; s < sizeof(rms_shapes) / sizeof(rms_shapes[0]); s++)
        for (int acc = 0; acc <= 1; acc++) {
            int N = rms_shapes[s][0], D = rms_shapes[s][1];
            size_t nd = (size_t)N * D;
            struct rms_bwd r = rms_bwd_inputs(N, D, 30 + 10 * s);
            /* dx starts random; with accumulate the reference adds into the same values, without
             * it the kernel must overwrite them */
            uint16_t *dx0 = hbuf(nd * 2);
            double *dx_d = hbuf(nd * 8);
            fill_bf16(dx0, dx_d, nd, 40 + s, 1.0, 0.0);
            if (!acc)
                memset(dx_d, 0, nd * 8);
            ref_rmsnorm_bwd_x(dx_d, r.dout_d, r.x_d, r.rstd_d, r.w_d, N, D);
            uint16_t *ddx = dev_put(dx0, nd * 2), *ddout = dev_put(r.dout, nd * 2);
            uint16_t *dxx = dev_put(r.x, nd * 2), *dw = dev_put(r.w, (size_t)D * 2);
            float *drstd = dev_put(r.rstd, (size_t)N * 4);
            /* with accumulate, the same sum from dx0 in another array (res) into a dx that holds
             * anything: the model's dh1 = df + ... */
            uint16_t *dres = dev_put(dx0, nd * 2), *dother = dev_put(r.dout, nd * 2);
            expect_ok(cuda_rmsnorm_bwd_x(ddx, ddout, dxx, drstd, dw, N, D, acc ? ddx : NULL, NULL));
            float *got = dev_get_bf16(ddx, nd);
            assert_int_equal(tu_compare(acc ? "rmsnorm dx (accumulate)" : "rmsnorm dx", got, dx_d, nd,
                                        BF16_ATOL, BF16_RTOL), 0);
            if (acc) {
                expect_ok(cuda_rmsnorm_bwd_x(dother, ddout, dxx, drstd, dw, N, D, dres, NULL));
                uint16_t *a = hbuf(nd * 2), *b = hbuf(nd * 2);
                dev_get(a, ddx, nd * 2), dev_get(b, dother, nd * 2);
                assert_memory_equal(a, b, nd * 2);
                free(a), free(b);
            }
            cuda_free(ddx), cuda_free(ddout), cuda_free(dxx), cuda_free(dw), cuda_free(drstd);
            cuda_free(dres), cuda_free(dother);
            free(dx0), free(dx_d), free(got);
            rms_bwd_free(&r);
        }
}

static void test_cuda_rmsnorm_bwd_w_matches_reference_and_repeats_bitwise(void **state)
{
    (void)state;
    NEED_GPU();
    const int shapes[][2] = {{SIM_OR(200, 1000), SIM_OR(200, 1000)}, {5, 4099}, {33, 7}}; /* rows % 16, cols % 32 != 0 */
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int N = shapes[s][0], D = shapes[s][1];
        size_t nd = (size_t)N * D;
        struct rms_bwd r = rms_bwd_inputs(N, D, 50 + 10 * s);
        float *dw0 = hbuf((size_t)D * 4), *got = hbuf((size_t)D * 4), *again = hbuf((size_t)D * 4);
        double *dw_d = hbuf((size_t)D * 8);
        tu_fill(dw_d, dw0, D, 60 + s, 1.0); /* dw is added into */
        ref_rmsnorm_bwd_w(dw_d, r.dout_d, r.x_d, r.rstd_d, N, D);
        uint16_t *ddout = dev_put(r.dout, nd * 2), *dxx = dev_put(r.x, nd * 2);
        float *drstd = dev_put(r.rstd, (size_t)N * 4), *ddw = dev_put(dw0, (size_t)D * 4);
        expect_ok(cuda_rmsnorm_bwd_w(ddw, ddout, dxx, drstd, N, D, NULL));
        dev_get(got, ddw, (size_t)D * 4);
        assert_int_equal(tu_compare("rmsnorm dw", got, dw_d, D, F32_SUM_ATOL, F32_RTOL), 0);
        assert_int_equal(cuda_copy_to_device(ddw, dw0, (size_t)D * 4), 0);
        expect_ok(cuda_rmsnorm_bwd_w(ddw, ddout, dxx, drstd, N, D, NULL));
        dev_get(again, ddw, (size_t)D * 4);
        assert_memory_equal(got, again, (size_t)D * 4);
        cuda_free(ddout), cuda_free(dxx), cuda_free(drstd), cuda_free(ddw);
        free(dw0), free(got), free(again), free(dw_d);
        rms_bwd_free(&r);
    }
}

/* ------------------------------------------------------------------------------------------
 * Rotary embedding */

static void test_cuda_rope_table_matches_reference(void **state)
{
    (void)state;
    NEED_GPU();
    const struct { int T, hd; double theta; } cases[] = {{1000, 128, 500000.0}, {37, 6, 10000.0}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int T = cases[c].T, hd = cases[c].hd;
        size_t n = (size_t)T * (hd / 2);
        double *cos_d = hbuf(n * 8), *sin_d = hbuf(n * 8);
        float *cs = hbuf(n * 4), *sn = hbuf(n * 4);
        ref_rope_table(cos_d, sin_d, T, hd, cases[c].theta);
        float *dcos = dev_put(NULL, n * 4), *dsin = dev_put(NULL, n * 4);
        expect_ok(cuda_rope_table(dcos, dsin, T, hd, cases[c].theta, NULL));
        dev_get(cs, dcos, n * 4);
        dev_get(sn, dsin, n * 4);
        assert_int_equal(tu_compare("rope cos", cs, cos_d, n, F32_ATOL, F32_RTOL), 0);
        assert_int_equal(tu_compare("rope sin", sn, sin_d, n, F32_ATOL, F32_RTOL), 0);
        cuda_free(dcos), cuda_free(dsin);
        free(cos_d), free(sin_d), free(cs), free(sn);
    }
}

/* Llama 3.1's scaled frequencies (config_rope_inv_freq, computed on the host) give the
 * reference's table, and one that differs from the unscaled table. */
static void test_cuda_rope_table_freq_matches_reference(void **state)
{
    (void)state;
    NEED_GPU();
    model_config_t c = config_defaults();
    c.dim = 1024, c.n_heads = 8, c.rope_theta = 500000.0, c.rope_scaling_factor = 8.0;
    c.rope_low_freq_factor = 1.0, c.rope_high_freq_factor = 4.0, c.rope_original_max_seq_len = 8192;
    int T = 300, hd = 128;
    size_t n = (size_t)T * (hd / 2);
    double freq[64], *cos_d = hbuf(n * 8), *sin_d = hbuf(n * 8), *cos_u = hbuf(n * 8), *sin_u = hbuf(n * 8);
    float *cs = hbuf(n * 4), *sn = hbuf(n * 4);
    for (int i = 0; i < hd / 2; i++)
        freq[i] = config_rope_inv_freq(&c, i);
    ref_rope_table_freq(cos_d, sin_d, T, hd, freq);
    ref_rope_table(cos_u, sin_u, T, hd, c.rope_theta);
    assert_true(memcmp(cos_d, cos_u, n * 8) != 0);
    double *dfreq = dev_put(freq, sizeof(freq));
    float *dcos = dev_put(NULL, n * 4), *dsin = dev_put(NULL, n * 4);
    expect_ok(cuda_rope_table_freq(dcos, dsin, T, hd, dfreq, NULL));
    dev_get(cs, dcos, n * 4);
    dev_get(sn, dsin, n * 4);
    assert_int_equal(tu_compare("scaled rope cos", cs, cos_d, n, F32_ATOL, F32_RTOL), 0);
    assert_int_equal(tu_compare("scaled rope sin", sn, sin_d, n, F32_ATOL, F32_RTOL), 0);
    assert_int_equal(cuda_rope_table_freq(dcos, dsin, T, 7, dfreq, NULL), -EINVAL);
    assert_int_equal(cuda_rope_table_freq(dcos, dsin, T, hd, NULL, NULL), -EINVAL);
    assert_non_null(strstr(cuda_nn_last_error(), "cuda_rope_table_freq"));
    cuda_free(dcos), cuda_free(dsin), cuda_free(dfreq);
    free(cos_d), free(sin_d), free(cos_u), free(sin_u), free(cs), free(sn);
}

/* Rotates random bf16 x [B,T,H,hd] on the GPU with the GPU's tables and compares with the
 * reference rotation using the same fp32 table values. */
static void rope_check(int B, int T, int H, int hd, int backward, uint64_t seed)
{
    size_t n = (size_t)B * T * H * hd, nt = (size_t)T * (hd / 2);
    uint16_t *x = hbuf(n * 2);
    double *x_d = hbuf(n * 8), *cos_d = hbuf(nt * 8), *sin_d = hbuf(nt * 8);
    float *cs = hbuf(nt * 4), *sn = hbuf(nt * 4);
    fill_bf16(x, x_d, n, seed, 1.0, 0.0);
    float *dcos = dev_put(NULL, nt * 4), *dsin = dev_put(NULL, nt * 4);
    expect_ok(cuda_rope_table(dcos, dsin, T, hd, 10000.0, NULL));
    dev_get(cs, dcos, nt * 4);
    dev_get(sn, dsin, nt * 4);
    tu_to_double(cos_d, cs, nt);
    tu_to_double(sin_d, sn, nt);
    uint16_t *dx = dev_put(x, n * 2);
    if (backward) {
        expect_ok(cuda_rope_bwd(dx, dcos, dsin, B, T, H, hd, NULL));
        ref_rope_bwd(x_d, cos_d, sin_d, B, T, H, hd);
    } else {
        expect_ok(cuda_rope_fwd(dx, dcos, dsin, B, T, H, hd, NULL));
        ref_rope_fwd(x_d, cos_d, sin_d, B, T, H, hd);
    }
    float *got = dev_get_bf16(dx, n);
    assert_int_equal(tu_compare(backward ? "rope dx" : "rope x", got, x_d, n, BF16_ATOL, BF16_RTOL), 0);
    cuda_free(dcos), cuda_free(dsin), cuda_free(dx);
    free(x), free(x_d), free(cos_d), free(sin_d), free(cs), free(sn), free(got);
}

static void test_cuda_rope_fwd_matches_reference(void **state)
{
    (void)state;
    NEED_GPU();
    rope_check(2, 37, 3, 64, 0, 70);
    rope_check(1, 129, 5, 128, 0, 71);
    rope_check(3, 5, 1, 2, 0, 72); /* one pair per head */
}

static void test_cuda_rope_bwd_matches_reference(void **state)
{
    (void)state;
    NEED_GPU();
    rope_check(2, 37, 3, 64, 1, 80);
    rope_check(1, 129, 5, 128, 1, 81);
}

/* ------------------------------------------------------------------------------------------
 * SwiGLU */

static const size_t swiglu_n = SIM_OR(20011, 1000003);

static void test_cuda_swiglu_fwd_matches_reference(void **state)
{
    (void)state;
    NEED_GPU();
    size_t n = swiglu_n;
    uint16_t *a = hbuf(n * 2), *b = hbuf(n * 2);
    double *a_d = hbuf(n * 8), *b_d = hbuf(n * 8), *m_d = hbuf(n * 8);
    fill_bf16(a, a_d, n, 90, 6.0, 0.0);
    fill_bf16(b, b_d, n, 91, 1.0, 0.0);
    ref_swiglu_fwd(m_d, a_d, b_d, n);
    uint16_t *da = dev_put(a, n * 2), *db = dev_put(b, n * 2), *dm = dev_put(NULL, n * 2);
    expect_ok(cuda_swiglu_fwd(dm, da, db, n, NULL));
    float *got = dev_get_bf16(dm, n);
    assert_int_equal(tu_compare("swiglu m", got, m_d, n, BF16_ATOL, BF16_RTOL), 0);
    cuda_free(da), cuda_free(db), cuda_free(dm);
    free(a), free(b), free(a_d), free(b_d), free(m_d), free(got);
}

static void test_cuda_swiglu_bwd_matches_reference(void **state)
{
    (void)state;
    NEED_GPU();
    size_t n = swiglu_n;
    uint16_t *a = hbuf(n * 2), *b = hbuf(n * 2), *g = hbuf(n * 2);
    double *a_d = hbuf(n * 8), *b_d = hbuf(n * 8), *g_d = hbuf(n * 8);
    double *da_d = hbuf(n * 8), *db_d = hbuf(n * 8);
    fill_bf16(a, a_d, n, 92, 6.0, 0.0);
    fill_bf16(b, b_d, n, 93, 1.0, 0.0);
    fill_bf16(g, g_d, n, 94, 1.0, 0.0);
    ref_swiglu_bwd(da_d, db_d, g_d, a_d, b_d, n);
    uint16_t *dA = dev_put(a, n * 2), *dB = dev_put(b, n * 2), *dG = dev_put(g, n * 2);
    uint16_t *dda = dev_put(NULL, n * 2), *ddb = dev_put(NULL, n * 2);
    expect_ok(cuda_swiglu_bwd(dda, ddb, dG, dA, dB, n, NULL));
    float *ga = dev_get_bf16(dda, n), *gb = dev_get_bf16(ddb, n);
    assert_int_equal(tu_compare("swiglu da", ga, da_d, n, BF16_ATOL, BF16_RTOL), 0);
    assert_int_equal(tu_compare("swiglu db", gb, db_d, n, BF16_ATOL, BF16_RTOL), 0);
    cuda_free(dA), cuda_free(dB), cuda_free(dG), cuda_free(dda), cuda_free(ddb);
    free(a), free(b), free(g), free(a_d), free(b_d), free(g_d), free(da_d), free(db_d);
    free(ga), free(gb);
}

/* ------------------------------------------------------------------------------------------
 * The element-wise kernels move rows sixteen bytes (eight bf16) at a time where a row is whole
 * groups of eight and the arrays start 16-byte aligned, else one element at a time. */

/* n bf16 of h on the device, `off` elements past a 16-byte aligned start (*base: to free). */
static uint16_t *dev_at(const uint16_t *h, size_t n, int off, uint16_t **base)
{
    *base = dev_put(NULL, (n + 8) * sizeof(uint16_t));
    if (h)
        assert_int_equal(cuda_copy_to_device(*base + off, h, n * sizeof(uint16_t)), 0);
    return *base + off;
}

/* The kernels' outputs for the arrays aligned (off 0: eight at a time) and one element off (one
 * at a time), kept for comparing: SwiGLU's m, da, db; RoPE's x after the forward and after the
 * backward; RMSNorm's out, rstd, dx (accumulated) and dw (added to); cross-entropy's losses and
 * dlogits over rows of NN8_D logits. */
typedef struct {
    uint16_t *m, *da, *db, *rope_f, *rope_b, *out, *dx, *dl;
    float *rstd, *dw, *loss;
} nn8_out_t;

#define NN8_N 1003                      /* SwiGLU's elements: 125 groups and 3 after them */
#define NN8_ROWS SIM_OR(40, 300)        /* RMSNorm's rows ... */
#define NN8_D 264                       /* ... of 33 groups: 256 threads a row and 8 more */
#define NN8_B 2
#define NN8_T 12
#define NN8_H 3
#define NN8_HD 48                       /* RoPE: half 24, three groups */

static void nn8_run(int off, nn8_out_t *o, const uint16_t *const *in, const float *rstd_in, const float *dw_in,
                    const float *dcos, const float *dsin, const uint16_t *dnw, const int32_t *dtg)
{
    const size_t n = NN8_N, nx = (size_t)NN8_B * NN8_T * NN8_H * NN8_HD, nd = (size_t)NN8_ROWS * NN8_D;
    uint16_t *b[12];
    /* SwiGLU */
    uint16_t *a = dev_at(in[0], n, off, &b[0]), *bb = dev_at(in[1], n, off, &b[1]), *g = dev_at(in[2], n, off, &b[2]);
    uint16_t *m = dev_at(NULL, n, off, &b[3]), *da = dev_at(NULL, n, off, &b[4]), *db = dev_at(NULL, n, off, &b[5]);
    expect_ok(cuda_swiglu_fwd(m, a, bb, n, NULL));
    expect_ok(cuda_swiglu_bwd(da, db, g, a, bb, n, NULL));
    o->m = hbuf(n * 2), o->da = hbuf(n * 2), o->db = hbuf(n * 2);
    dev_get(o->m, m, n * 2), dev_get(o->da, da, n * 2), dev_get(o->db, db, n * 2);
    /* RoPE, forward then backward, in place */
    uint16_t *x = dev_at(in[3], nx, off, &b[6]);
    o->rope_f = hbuf(nx * 2), o->rope_b = hbuf(nx * 2);
    expect_ok(cuda_rope_fwd(x, dcos, dsin, NN8_B, NN8_T, NN8_H, NN8_HD, NULL));
    dev_get(o->rope_f, x, nx * 2);
    expect_ok(cuda_rope_bwd(x, dcos, dsin, NN8_B, NN8_T, NN8_H, NN8_HD, NULL));
    dev_get(o->rope_b, x, nx * 2);
    /* RMSNorm: forward, dx accumulated into what is there, dw added to what is there */
    uint16_t *rx = dev_at(in[4], nd, off, &b[7]), *rout = dev_at(NULL, nd, off, &b[8]);
    uint16_t *rg = dev_at(in[5], nd, off, &b[9]), *rdx = dev_at(in[6], nd, off, &b[10]);
    float *rstd = dev_put(NULL, NN8_ROWS * 4), *r_in = dev_put(rstd_in, NN8_ROWS * 4), *dw = dev_put(dw_in, NN8_D * 4);
    expect_ok(cuda_rmsnorm_fwd(rout, rstd, rx, dnw, NN8_ROWS, NN8_D, 1e-5f, NULL));
    expect_ok(cuda_rmsnorm_bwd_x(rdx, rg, rx, r_in, dnw, NN8_ROWS, NN8_D, rdx, NULL));
    expect_ok(cuda_rmsnorm_bwd_w(dw, rg, rx, r_in, NN8_ROWS, NN8_D, NULL));
    o->out = hbuf(nd * 2), o->dx = hbuf(nd * 2), o->rstd = hbuf(NN8_ROWS * 4), o->dw = hbuf(NN8_D * 4);
    dev_get(o->out, rout, nd * 2), dev_get(o->dx, rdx, nd * 2);
    dev_get(o->rstd, rstd, NN8_ROWS * 4), dev_get(o->dw, dw, NN8_D * 4);
    /* cross-entropy over RMSNorm's input as logits, out of place */
    uint16_t *dl = dev_at(NULL, nd, off, &b[11]);
    float *loss = dev_put(NULL, NN8_ROWS * 4);
    expect_ok(cuda_xent(dl, loss, rx, dtg, NN8_ROWS, NN8_D, 0.25f, NULL));
    o->dl = hbuf(nd * 2), o->loss = hbuf(NN8_ROWS * 4);
    dev_get(o->dl, dl, nd * 2), dev_get(o->loss, loss, NN8_ROWS * 4);
    for (int k = 0; k < 12; k++)
        cuda_free(b[k]);
    cuda_free(rstd), cuda_free(r_in), cuda_free(dw), cuda_free(loss);
}

static void nn8_free(nn8_out_t *o)
{
    free(o->m), free(o->da), free(o->db), free(o->rope_f), free(o->rope_b), free(o->out), free(o->dx);
    free(o->rstd), free(o->dw), free(o->dl), free(o->loss);
}

/* Both ways give the same bits: SwiGLU and RoPE element by element (one function for an element
 * in both), RMSNorm's sums and cross-entropy's running max and sum over the same terms in the
 * same order (a thread's eight elements, then its next group). */
static void test_cuda_nn_eight_at_a_time_is_one_at_a_time_bitwise(void **state)
{
    (void)state;
    NEED_GPU();
    const size_t n = NN8_N, nx = (size_t)NN8_B * NN8_T * NN8_H * NN8_HD, nd = (size_t)NN8_ROWS * NN8_D;
    const size_t sizes[7] = {n, n, n, nx, nd, nd, nd};
    uint16_t *in[7], *nw = hbuf(NN8_D * 2);
    double *scratch = hbuf(nd * 8);
    for (int k = 0; k < 7; k++) {
        in[k] = hbuf(sizes[k] * 2);
        fill_bf16(in[k], scratch, sizes[k], 500 + k, k == 0 ? 6.0 : 1.0, 0.0);
    }
    fill_bf16(nw, scratch, NN8_D, 510, 0.5, 1.0);
    float *rstd = hbuf(NN8_ROWS * 4), *dw = hbuf(NN8_D * 4);
    tu_fill(NULL, rstd, NN8_ROWS, 511, 0.5);
    for (int i = 0; i < NN8_ROWS; i++)
        rstd[i] += 1.0f;
    tu_fill(NULL, dw, NN8_D, 512, 1.0);
    size_t nt = (size_t)NN8_T * (NN8_HD / 2);
    float *dcos = dev_put(NULL, nt * 4), *dsin = dev_put(NULL, nt * 4);
    expect_ok(cuda_rope_table(dcos, dsin, NN8_T, NN8_HD, 10000.0, NULL));
    uint16_t *dnw = dev_put(nw, NN8_D * 2);
    int32_t *tg = tokens(NN8_ROWS, NN8_D, 513), *dtg = dev_put(tg, NN8_ROWS * 4);
    nn8_out_t v, s;
    nn8_run(0, &v, (const uint16_t *const *)in, rstd, dw, dcos, dsin, dnw, dtg);
    nn8_run(1, &s, (const uint16_t *const *)in, rstd, dw, dcos, dsin, dnw, dtg);
    const struct { const char *what; const void *a, *b; size_t bytes; } cmp[] = {
        {"swiglu m", v.m, s.m, n * 2}, {"swiglu da", v.da, s.da, n * 2}, {"swiglu db", v.db, s.db, n * 2},
        {"rope forward", v.rope_f, s.rope_f, nx * 2}, {"rope backward", v.rope_b, s.rope_b, nx * 2},
        {"rmsnorm out", v.out, s.out, nd * 2}, {"rmsnorm rstd", v.rstd, s.rstd, NN8_ROWS * 4},
        {"rmsnorm dx", v.dx, s.dx, nd * 2}, {"rmsnorm dw", v.dw, s.dw, NN8_D * 4},
        {"xent loss", v.loss, s.loss, NN8_ROWS * 4}, {"xent dlogits", v.dl, s.dl, nd * 2},
    };
    for (size_t k = 0; k < sizeof(cmp) / sizeof(cmp[0]); k++)
        if (memcmp(cmp[k].a, cmp[k].b, cmp[k].bytes))
            fail_msg("%s: eight at a time and one at a time differ", cmp[k].what);
    /* and the RoPE round trip is close to where it began (the outputs are not all zeros) */
    float *back = hbuf(nx * 4), *start = hbuf(nx * 4);
    cuda_bf16_to_f32(back, v.rope_b, nx);
    cuda_bf16_to_f32(start, in[3], nx);
    double worst = 0;
    for (size_t i = 0; i < nx; i++)
        worst = fabs(back[i] - start[i]) > worst ? fabs(back[i] - start[i]) : worst;
    assert_true(worst < 0.05);
    nn8_free(&v), nn8_free(&s);
    for (int k = 0; k < 7; k++)
        free(in[k]);
    free(nw), free(scratch), free(rstd), free(dw), free(back), free(start), free(tg);
    cuda_free(dcos), cuda_free(dsin), cuda_free(dnw), cuda_free(dtg);
}

/* ------------------------------------------------------------------------------------------
 * Softmax cross-entropy: GPT-2's padded vocabulary, Llama 3's, and a small odd one. Each case
 * runs out of place and then in place (dlogits = logits, as kernels/cpu/model.c calls ops_xent):
 * the two must give the same bits. */

static void test_cuda_xent_matches_reference_in_and_out_of_place(void **state)
{
    (void)state;
    NEED_GPU();
    const int cases[][2] = {{33, 1000}, {SIM_OR(8, 64), 50304}, {3, 128256}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int N = cases[c][0], V = cases[c][1];
        size_t nv = (size_t)N * V;
        float dscale = 1.0f / (4.0f * N);
        uint16_t *lg = hbuf(nv * 2), *d1 = hbuf(nv * 2), *d2 = hbuf(nv * 2);
        double *lg_d = hbuf(nv * 8), *dl_d = hbuf(nv * 8), *loss_d = hbuf((size_t)N * 8);
        fill_bf16(lg, lg_d, nv, 100 + c, 8.0, 0.0);
        int32_t *tg = tokens(N, V, 110 + c);
        tg[0] = V - 1, tg[N - 1] = 0; /* the ends of the row */
        ref_xent(dl_d, loss_d, lg_d, tg, N, V, dscale);
        uint16_t *dlg = dev_put(lg, nv * 2), *ddl = dev_put(NULL, nv * 2);
        int32_t *dtg = dev_put(tg, (size_t)N * 4);
        float *dloss = dev_put(NULL, (size_t)N * 4);
        float *loss1 = hbuf((size_t)N * 4), *loss2 = hbuf((size_t)N * 4);
        expect_ok(cuda_xent(ddl, dloss, dlg, dtg, N, V, dscale, NULL));
        dev_get(d1, ddl, nv * 2);
        dev_get(loss1, dloss, (size_t)N * 4);
        expect_ok(cuda_xent(dlg, dloss, dlg, dtg, N, V, dscale, NULL));
        dev_get(d2, dlg, nv * 2);
        dev_get(loss2, dloss, (size_t)N * 4);
        assert_memory_equal(d1, d2, nv * 2);
        assert_memory_equal(loss1, loss2, (size_t)N * 4);
        float *got = hbuf(nv * 4);
        cuda_bf16_to_f32(got, d1, nv);
        /* a typical entry is dscale/V; atol is a thousandth of that, rtol does the work */
        assert_int_equal(tu_compare("xent dlogits", got, dl_d, nv, 1e-3 * dscale / V, BF16_RTOL), 0);
        assert_int_equal(tu_compare("xent loss", loss1, loss_d, N, F32_SUM_ATOL, F32_RTOL), 0);
        cuda_free(dlg), cuda_free(ddl), cuda_free(dtg), cuda_free(dloss);
        free(lg), free(d1), free(d2), free(lg_d), free(dl_d), free(loss_d), free(tg);
        free(loss1), free(loss2), free(got);
    }
}

static void test_cuda_xent_out_of_range_target_gives_nan_loss(void **state)
{
    (void)state;
    NEED_GPU();
    const int N = 2, V = 100;
    uint16_t lg[2 * 100];
    double lg_d[2 * 100];
    fill_bf16(lg, lg_d, 2 * 100, 120, 1.0, 0.0);
    int32_t tg[2] = {-1, V};
    uint16_t *dlg = dev_put(lg, sizeof(lg));
    int32_t *dtg = dev_put(tg, sizeof(tg));
    float *dloss = dev_put(NULL, N * 4);
    float loss[2];
    expect_ok(cuda_xent(dlg, dloss, dlg, dtg, N, V, 1.0f, NULL));
    dev_get(loss, dloss, sizeof(loss));
    assert_true(isnan(loss[0]) && isnan(loss[1]));
    float *d = dev_get_bf16(dlg, 2 * 100);
    double sum = 0; /* the softmax alone: no onehot subtracted */
    for (int j = 0; j < V; j++)
        sum += d[j];
    assert_true(fabs(sum - 1.0) < 2e-2);
    cuda_free(dlg), cuda_free(dtg), cuda_free(dloss);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_conversion_rounds_to_nearest_even),
        cmocka_unit_test(test_cuda_nn_rejects_bad_arguments),
        cmocka_unit_test(test_cuda_embed_fwd_copies_rows),
        cmocka_unit_test(test_cuda_embed_bwd_sums_rows_in_token_order),
        cmocka_unit_test(test_cuda_rmsnorm_fwd_matches_reference),
        cmocka_unit_test(test_cuda_rmsnorm_bwd_x_matches_reference),
        cmocka_unit_test(test_cuda_rmsnorm_bwd_w_matches_reference_and_repeats_bitwise),
        cmocka_unit_test(test_cuda_rope_table_matches_reference),
        cmocka_unit_test(test_cuda_rope_table_freq_matches_reference),
        cmocka_unit_test(test_cuda_rope_fwd_matches_reference),
        cmocka_unit_test(test_cuda_rope_bwd_matches_reference),
        cmocka_unit_test(test_cuda_swiglu_fwd_matches_reference),
        cmocka_unit_test(test_cuda_swiglu_bwd_matches_reference),
        cmocka_unit_test(test_cuda_nn_eight_at_a_time_is_one_at_a_time_bitwise),
        cmocka_unit_test(test_cuda_xent_matches_reference_in_and_out_of_place),
        cmocka_unit_test(test_cuda_xent_out_of_range_target_gives_nan_loss),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
