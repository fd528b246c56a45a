/* Tests for the non-attention ops (kernels/cpu/ops_basic.c against kernels/ref/ref_basic.c):
 * fast fp32 vs double reference on awkward and multi-task sizes, finite differences of every
 * reference backward (and of the fast rmsnorm/matmul/swiglu backwards), bitwise determinism
 * across pool sizes, and AdamW pinned to hand-computed values and the same out of place as in
 * place. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/ops.h"
#include "kernels/ref/ref_ops.h"
#include "tests/testutil.h"

static float *fbuf(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}
static double *dbuf(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    assert_non_null(p);
    return p;
}
static int32_t *tokens(int n, int V, uint64_t seed)
{
    int32_t *t = malloc((size_t)n * sizeof(int32_t));
    assert_non_null(t);
    uint64_t s = seed;
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(tu_next(&s) % (uint64_t)V);
    return t;
}
static double dot(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}
static double dotf(const float *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ------------------------------------------------------------------------------------------
 * Fast fp32 against the double reference. Tolerances are atol + rtol*|ref| per op. */

static void test_embed_fwd_copies_rows(void **state)
{
    (void)state;
    pool_t *p = pool_new(2);
    const int N = 37, D = 33, V = 11;
    float *tab = fbuf((size_t)V * D), *out = fbuf((size_t)N * D);
    double *tabd = dbuf((size_t)V * D), *outd = dbuf((size_t)N * D);
    int32_t *tok = tokens(N, V, 1);
    tu_fill(tabd, tab, (size_t)V * D, 2, 1.0);
    ops_embed_fwd(p, out, tab, tok, N, D);
    ref_embed_fwd(outd, tabd, tok, N, D);
    assert_int_equal(tu_compare("embed_fwd", out, outd, (size_t)N * D, 0, 0), 0); /* a copy: exact */
    free(tab), free(out), free(tabd), free(outd), free(tok);
    pool_destroy(&p);
}

/* Few rows in the table so that tokens repeat; dtable is prefilled to check "adds into". */
static void test_embed_bwd_adds_into_table(void **state)
{
    (void)state;
    pool_t *p = pool_new(2);
    int shapes[][3] = {{37, 33, 5}, {600, 300, 50}};
    for (int s = 0; s < 2; s++) {
        int N = shapes[s][0], D = shapes[s][1], V = shapes[s][2];
        float *dt = fbuf((size_t)V * D), *dout = fbuf((size_t)N * D);
        double *dtd = dbuf((size_t)V * D), *doutd = dbuf((size_t)N * D);
        int32_t *tok = tokens(N, V, 3);
        tu_fill(dtd, dt, (size_t)V * D, 4, 1.0);
        tu_fill(doutd, dout, (size_t)N * D, 5, 1.0);
        ops_embed_bwd(p, dt, dout, tok, N, D);
        ref_embed_bwd(dtd, doutd, tok, N, D);
        assert_int_equal(tu_compare("embed_bwd", dt, dtd, (size_t)V * D, 1e-5, 1e-5), 0);
        free(dt), free(dout), free(dtd), free(doutd), free(tok);
    }
    pool_destroy(&p);
}

/* (N, D): awkward, one long row, more rows than one task holds (42 rows of 768 per task). */
static const int rms_shapes[][2] = {{37, 33}, {1, 768}, {200, 768}, {70, 4097}};

static void test_rmsnorm_fwd_matches_ref(void **state)
{
    (void)state;
    pool_t *p = pool_new(2);
    for (int s = 0; s < 4; s++) {
        int N = rms_shapes[s][0], D = rms_shapes[s][1];
        size_t n = (size_t)N * D;
        float *x = fbuf(n), *w = fbuf(D), *out = fbuf(n), *rstd = fbuf(N);
        double *xd = dbuf(n), *wd = dbuf(D), *outd = dbuf(n), *rstdd = dbuf(N);
        tu_fill(xd, x, n, 10 + s, 2.0);
        tu_fill(wd, w, D, 20 + s, 1.5);
        ops_rmsnorm_fwd(p, out, rstd, x, w, N, D, 1e-5f);
        ref_rmsnorm_fwd(outd, rstdd, xd, wd, N, D, (double)1e-5f);
        assert_int_equal(tu_compare("rmsnorm out", out, outd, n, 1e-6, 1e-5), 0);
        assert_int_equal(tu_compare("rmsnorm rstd", rstd, rstdd, N, 0, 1e-6), 0);
        free(x), free(w), free(out), free(rstd), free(xd), free(wd), free(outd), free(rstdd);
    }
    pool_destroy(&p);
}

/* dx and dw are prefilled with random values: both backwards add into them. */
static void test_rmsnorm_bwd_matches_ref_and_adds_into(void **state)
{
    (void)state;
    pool_t *p = pool_new(2);
    for (int s = 0; s < 4; s++) {
        int N = rms_shapes[s][0], D = rms_shapes[s][1];
        size_t n = (size_t)N * D;
        float *x = fbuf(n), *w = fbuf(D), *out = fbuf(n), *rstd = fbuf(N), *dout = fbuf(n),
              *dx = fbuf(n), *dw = fbuf(D);
        double *xd = dbuf(n), *wd = dbuf(D), *outd = dbuf(n), *rstdd = dbuf(N), *doutd = dbuf(n),
               *dxd = dbuf(n), *dwd = dbuf(D);
        tu_fill(xd, x, n, 30 + s, 2.0);
        tu_fill(wd, w, D, 40 + s, 1.5);
        tu_fill(doutd, dout, n, 50 + s, 1.0);
        tu_fill(dxd, dx, n, 60 + s, 1.0);
        tu_fill(dwd, dw, D, 70 + s, 1.0);
        ops_rmsnorm_fwd(p, out, rstd, x, w, N, D, 1e-5f);
        tu_to_double(rstdd, rstd, N); /* same rstd on both sides: test the backward alone */
        ops_rmsnorm_bwd_x(p, dx, dout, x, rstd, w, N, D);
        ops_rmsnorm_bwd_w(p, dw, dout, x, rstd, N, D);
        ref_rmsnorm_bwd_x(dxd, doutd, xd, rstdd, wd, N, D);
        ref_rmsnorm_bwd_w(dwd, doutd, xd, rstdd, N, D);
        assert_int_equal(tu_compare("rmsnorm dx", dx, dxd, n, 1e-5, 1e-5), 0);
        /* dw sums N products in fp32: error grows like sqrt(N) */
        assert_int_equal(tu_compare("rmsnorm dw", dw, dwd, D, 1e-6 * sqrt(N) + 1e-6, 1e-5), 0);
        free(x), free(w), free(out), free(rstd), free(dout), free(dx), free(dw);
        free(xd), free(wd), free(outd), free(rstdd), free(doutd), free(dxd), free(dwd);
    }
    pool_destroy(&p);
}

/* (N, I, O): awkward; larger than one 256x2048 tile in every dimension that is tiled. */
static const int mm_shapes[][3] = {{37, 70, 129}, {1, 33, 5}, {300, 33, 700}, {513, 64, 2500}};

/* Inner products of up to K=2500 uniform terms; fp32 error ~ sqrt(K)*eps, bound generously. */
#define MM_ATOL 1e-4
#define MM_RTOL 1e-4

static void test_matmul_fwd_matches_ref(void **state)
{
    (void)state;
    pool_t *p = pool_new(2);
    for (int s = 0; s < 4; s++) {
        int N = mm_shapes[s][0], I = mm_shapes[s][1], O = mm_shapes[s][2];
        float *x = fbuf((size_t)N * I), *w = fbuf((size_t)O * I), *y = fbuf((size_t)N * O);
        double *xd = dbuf((size_t)N * I), *wd = dbuf((size_t)O * I), *yd = dbuf((size_t)N * O);
        tu_fill(xd, x, (size_t)N * I, 100 + s, 1.0);
        tu_fill(wd, w, (size_t)O * I, 110 + s, 1.0);
        tu_fill(NULL, y, (size_t)N * O, 120 + s, 9.0); /* garbage: fwd overwrites */
        ops_matmul_fwd(p, y, x, w, N, I, O);
        ref_matmul_fwd(yd, xd, wd, N, I, O);
        assert_int_equal(tu_compare("matmul y", y, yd, (size_t)N * O, MM_ATOL, MM_RTOL), 0);
        free(x), free(w), free(y), free(xd), free(wd), free(yd);
    }
    pool_destroy(&p);
}

static void test_matmul_bwd_x_overwrites_or_accumulates(void **state)
{
    (void)state;
    pool_t *p = pool_new(2);
    for (int s = 0; s < 4; s++)
        for (int acc = 0; acc < 2; acc++) {
            int N = mm_shapes[s][0], I = mm_shapes[s][1], O = mm_shapes[s][2];
            float *dy = fbuf((size_t)N * O), *w = fbuf((size_t)O * I), *dx = fbuf((size_t)N * I);
            double *dyd = dbuf((size_t)N * O), *wd = dbuf((size_t)O * I), *dxd = dbuf((size_t)N * I);
            tu_fill(dyd, dy, (size_t)N * O, 130 + s, 1.0);
            tu_fill(wd, w, (size_t)O * I, 140 + s, 1.0);
            tu_fill(dxd, dx, (size_t)N * I, 150 + s, 3.0);
            ops_matmul_bwd_x(p, dx, dy, w, N, I, O, acc);
            ref_matmul_bwd_x(dxd, dyd, wd, N, I, O, acc);
            assert_int_equal(tu_compare(acc ? "matmul dx (acc)" : "matmul dx", dx, dxd, (size_t)N * I,
                                        MM_ATOL, MM_RTOL),
                             0);
            free(dy), free(w), free(dx), free(dyd), free(wd), free(dxd);
        }
    pool_destroy(&p);
}

static void test_matmul_bwd_w_adds_into(void **state)
{
    (void)state;
    pool_t *p = pool_new(2);
    for (int s = 0; s < 4; s++) {
        int N = mm_shapes[s][0], I = mm_shapes[s][1], O = mm_shapes[s][2];
        float *dy = fbuf((size_t)N * O), *x = fbuf((size_t)N * I), *dw = fbuf((size_t)O * I);
        double *dyd = dbuf((size_t)N * O), *xd = dbuf((size_t)N * I), *dwd = dbuf((size_t)O * I);
        tu_fill(dyd, dy, (size_t)N * O, 160 + s, 1.0);
        tu_fill(xd, x, (size_t)N * I, 170 + s, 1.0);
        tu_fill(dwd, dw, (size_t)O * I, 180 + s, 3.0);
        ops_matmul_bwd_w(p, dw, dy, x, N, I, O);
        ref_matmul_bwd_w(dwd, dyd, xd, N, I, O);
        assert_int_equal(tu_compare("matmul dw", dw, dwd, (size_t)O * I, MM_ATOL, MM_RTOL), 0);
        free(dy), free(x), free(dw), free(dyd), free(xd), free(dwd);
    }
    pool_destroy(&p);
}

/* Gate inputs over [-12, 12] plus saturating values, which exercise the clamps of the fast exp. */
static void fill_gate(double *d, float *f, size_t n, uint64_t seed)
{
    tu_fill(d, f, n, seed, 12.0);
    static const float special[] = {-100.f, -88.f, -87.4f, -30.f, 0.f, 30.f, 88.5f, 100.f};
    for (size_t i = 0; i < 8 && i < n; i++) {
        f[i * 3 % n] = special[i];
        d[i * 3 % n] = special[i];
    }
}

static void test_swiglu_fwd_bwd_match_ref(void **state)
{
    (void)state;
    pool_t *p = pool_new(2);
    size_t sizes[] = {37, 100003};
    for (int s = 0; s < 2; s++) {
        size_t n = sizes[s];
        float *a = fbuf(n), *b = fbuf(n), *dm = fbuf(n), *m = fbuf(n), *da = fbuf(n), *db = fbuf(n);
        double *ad = dbuf(n), *bd = dbuf(n), *dmd = dbuf(n), *md = dbuf(n), *dad = dbuf(n),
               *dbd = dbuf(n);
        fill_gate(ad, a, n, 200 + s);
        tu_fill(bd, b, n, 210 + s, 2.0);
        tu_fill(dmd, dm, n, 220 + s, 1.0);
        ops_swiglu_fwd(p, m, a, b, n);
        ops_swiglu_bwd(p, da, db, dm, a, b, n);
        ref_swiglu_fwd(md, ad, bd, n);
        ref_swiglu_bwd(dad, dbd, dmd, ad, bd, n);
        assert_int_equal(tu_compare("swiglu m", m, md, n, 1e-6, 1e-5), 0);
        assert_int_equal(tu_compare("swiglu da", da, dad, n, 1e-6, 1e-5), 0);
        assert_int_equal(tu_compare("swiglu db", db, dbd, n, 1e-6, 1e-5), 0);
        free(a), free(b), free(dm), free(m), free(da), free(db);
        free(ad), free(bd), free(dmd), free(md), free(dad), free(dbd);
    }
    pool_destroy(&p);
}

/* (N, V): awkward; the real vocabulary. Row 0 is shifted by +1000 to check the max subtraction,
 * and dlogits is checked both separate from and aliasing logits. */
static void test_xent_matches_ref_and_allows_alias(void **state)
{
    (void)state;
    pool_t *p = pool_new(2);
    const int shapes[][2] = {{37, 33}, {6, 50304}};
    for (int s = 0; s < 2; s++)
        for (int alias = 0; alias < 2; alias++) {
            int N = shapes[s][0], V = shapes[s][1];
            size_t n = (size_t)N * V;
            float dscale = 1.0f / 3.0f;
            float *l = fbuf(n), *dl = alias ? l : fbuf(n), *loss = fbuf(N);
            double *ld = dbuf(n), *dld = dbuf(n), *lossd = dbuf(N);
            tu_fill(ld, l, n, 300 + s, 8.0);
            for (int j = 0; j < V; j++) {
                l[j] += 1000.0f;
                ld[j] = l[j];
            }
            int32_t *tg = tokens(N, V, 310 + s);
            ops_xent(p, dl, loss, l, tg, N, V, dscale);
            ref_xent(dld, lossd, ld, tg, N, V, (double)dscale);
            /* loss: the +1000 row loses fp32 digits in logits - max, hence the atol */
            assert_int_equal(tu_compare("xent loss", loss, lossd, N, 2e-5, 1e-5), 0);
            assert_int_equal(tu_compare("xent dlogits", dl, dld, n, 1e-8, 1e-5), 0);
            if (!alias)
                free(dl);
            free(l), free(loss), free(ld), free(dld), free(lossd), free(tg);
        }
    pool_destroy(&p);
}

static void test_adamw_several_steps_match_ref(void **state)
{
    (void)state;
    pool_t *p = pool_new(2);
    const size_t n = 100003;
    float *pa = fbuf(n), *g = fbuf(n), *m = fbuf(n), *v = fbuf(n);
    double *pd = dbuf(n), *gd = dbuf(n), *md = dbuf(n), *vd = dbuf(n);
    tu_fill(pd, pa, n, 400, 1.0);
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (int step = 1; step <= 5; step++) {
        tu_fill(gd, g, n, 410 + step, step % 2 ? 0.1 : 2.0);
        ops_adamw(p, pa, g, m, v, n, lr, b1, b2, eps, wd, step);
        ref_adamw(pd, gd, md, vd, n, lr, b1, b2, eps, wd, step);
    }
    assert_int_equal(tu_compare("adamw param", pa, pd, n, 1e-6, 1e-6), 0);
    assert_int_equal(tu_compare("adamw m", m, md, n, 1e-7, 1e-5), 0);
    assert_int_equal(tu_compare("adamw v", v, vd, n, 1e-9, 1e-5), 0);
    free(pa), free(g), free(m), free(v), free(pd), free(gd), free(md), free(vd);
    pool_destroy(&p);
}

/* One element, lr=0.1, betas (0.9, 0.999), eps=1e-8, wd=0.01, from p=1, m=v=0.
 * Step 1, g=0.5: p = 1 - 0.1*0.01*1 = 0.999; m = 0.05; v = 0.00025;
 *   m_hat = 0.05/0.1 = 0.5; v_hat = 0.00025/0.001 = 0.25; p = 0.999 - 0.1*0.5/(0.5+1e-8)
 *   = 0.899000002.
 * Step 2, g=-1: p = 0.899000002*0.999 = 0.898101001998; m = 0.045 - 0.1 = -0.055;
 *   v = 0.999*0.00025 + 0.001 = 0.00124975; m_hat = -0.055/0.19 = -0.28947368;
 *   v_hat = 0.00124975/0.001999 = 0.62518759, sqrt = 0.79068805;
 *   p = 0.898101001998 + 0.1*0.28947368/0.79068806 = 0.93471135424. */
static void test_adamw_matches_hand_computed_steps(void **state)
{
    (void)state;
    double pd = 1, md = 0, vd = 0, g1 = 0.5, g2 = -1.0;
    ref_adamw(&pd, &g1, &md, &vd, 1, 0.1, 0.9, 0.999, 1e-8, 0.01, 1);
    assert_true(fabs(pd - 0.899000002) < 1e-12);
    assert_true(fabs(md - 0.05) < 1e-15 && fabs(vd - 0.00025) < 1e-15);
    ref_adamw(&pd, &g2, &md, &vd, 1, 0.1, 0.9, 0.999, 1e-8, 0.01, 2);
    assert_true(fabs(pd - 0.93471135424) < 1e-10);
    assert_true(fabs(md + 0.055) < 1e-15 && fabs(vd - 0.00124975) < 1e-15);

    float pf = 1, mf = 0, vf = 0, gf1 = 0.5f, gf2 = -1.0f;
    ops_adamw(NULL, &pf, &gf1, &mf, &vf, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
    assert_true(fabs(pf - 0.899000002) < 1e-6);
    ops_adamw(NULL, &pf, &gf2, &mf, &vf, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2);
    assert_true(fabs(pf - 0.93471135424) < 1e-6);
    /* 0.999f is 0.99900001287, so 1 - beta2 in fp32 is 1.3e-5 off in relative terms */
    assert_true(fabs(mf + 0.055) < 1e-7 && fabs(vf - 0.00124975) < 1e-7);
}

/* Two banks of state, as a crash-consistent optimizer keeps them: each step reads one bank
 * and writes the other, with a clip factor (gscale) on the unscaled gradient. Every output
 * must be the in-place run's on a gradient scaled beforehand, bit for bit (the outputs start
 * as NaN, so an element left unwritten shows), and the bank read and the gradient must stay
 * as they were. Sizes with a short last block and a short last task; no pool and a pool of 3. */
static void test_adamw_out_of_place_is_in_place_bitwise_and_keeps_the_sources(void **state)
{
    (void)state;
    pool_t *pools[] = {NULL, pool_new(3)};
    const size_t ns[] = {1, 255, 16384 * 2 + 77};
    for (int pi = 0; pi < 2; pi++)
        for (int k = 0; k < 3; k++) {
            const size_t n = ns[k], bytes = n * sizeof(float);
            float *ip = fbuf(n), *im = fbuf(n), *iv = fbuf(n), *g = fbuf(n), *saved = fbuf(3 * n);
            float *scaled = fbuf(n), *g_was = fbuf(n);
            float *bank[2][3];
            for (int b = 0; b < 2; b++)
                for (int j = 0; j < 3; j++)
                    bank[b][j] = fbuf(n);
            tu_fill(NULL, ip, n, 420, 1.0);
            tu_fill(NULL, im, n, 421, 0.1);
            tu_fill(NULL, iv, n, 422, 0.1);
            for (size_t i = 0; i < n; i++) {
                iv[i] *= iv[i]; /* second moments are >= 0 */
                for (int j = 0; j < 3; j++)
                    bank[1][j][i] = NAN;
            }
            memcpy(bank[0][0], ip, bytes), memcpy(bank[0][1], im, bytes), memcpy(bank[0][2], iv, bytes);
            for (int step = 1; step <= 4; step++) {
                float *const *src = bank[(step - 1) % 2], *const *dst = bank[step % 2];
                tu_fill(NULL, g, n, 430 + step, step % 2 ? 0.1 : 2.0);
                const float wd = step == 3 ? 0.0f : 0.1f, clip = step == 2 ? 1.0f : 0.4f + 0.1f * step;
                for (int j = 0; j < 3; j++)
                    memcpy(saved + j * n, src[j], bytes);
                for (size_t i = 0; i < n; i++)
                    scaled[i] = g[i] * clip;
                memcpy(g_was, g, bytes);
                ops_adamw(pools[pi], ip, scaled, im, iv, n, 3e-3f, 0.9f, 0.95f, 1e-8f, wd, step);
                ops_adamw_to(pools[pi], dst[0], dst[1], dst[2], src[0], src[1], src[2], g, clip, n, 3e-3f, 0.9f,
                             0.95f, 1e-8f, wd, step);
                assert_memory_equal(g, g_was, bytes);
                assert_memory_equal(dst[0], ip, bytes);
                assert_memory_equal(dst[1], im, bytes);
                assert_memory_equal(dst[2], iv, bytes);
                for (int j = 0; j < 3; j++)
                    assert_memory_equal(src[j], saved + j * n, bytes);
            }
            for (int b = 0; b < 2; b++)
                for (int j = 0; j < 3; j++)
                    free(bank[b][j]);
            free(ip), free(im), free(iv), free(g), free(saved), free(scaled), free(g_was);
        }
    pool_destroy(&pools[1]);
}

/* ------------------------------------------------------------------------------------------
 * Finite differences of the reference backwards, in double: loss = sum(out * R) for a fixed
 * random R, central differences with h = 1e-6, agreement to ~1e-6 relative. */

#define FD_H 1e-6
#define FD_ATOL 1e-8
#define FD_RTOL 1e-6

typedef double (*loss_fn)(void *ctx);

/* Checks grad[i] against the central difference of f in v[i], for every i. */
static size_t fd_check(const char *what, loss_fn f, void *ctx, double *v, const double *grad, size_t n,
                       double h, double atol, double rtol)
{
    double *num = dbuf(n);
    for (size_t i = 0; i < n; i++) {
        double keep = v[i];
        v[i] = keep + h;
        double fp = f(ctx);
        v[i] = keep - h;
        double fm = f(ctx);
        v[i] = keep;
        num[i] = (fp - fm) / (2 * h);
    }
    size_t bad = tu_compare_d(what, grad, num, n, atol, rtol);
    free(num);
    return bad;
}

struct fd_ctx {
    int N, D, I, O, V;
    double *x, *w, *R, *out, *rstd, *b, dscale;
    const int32_t *tok;
};

static double embed_loss(void *c)
{
    struct fd_ctx *k = c;
    ref_embed_fwd(k->out, k->w, k->tok, k->N, k->D);
    return dot(k->out, k->R, (size_t)k->N * k->D);
}

static void test_embed_bwd_ref_matches_finite_differences(void **state)
{
    (void)state;
    struct fd_ctx k = {.N = 9, .D = 5, .V = 4};
    k.w = dbuf((size_t)k.V * k.D), k.R = dbuf((size_t)k.N * k.D), k.out = dbuf((size_t)k.N * k.D);
    k.tok = tokens(k.N, k.V, 500);
    tu_fill(k.w, NULL, (size_t)k.V * k.D, 501, 1.0);
    tu_fill(k.R, NULL, (size_t)k.N * k.D, 502, 1.0);
    double *dt = dbuf((size_t)k.V * k.D);
    ref_embed_bwd(dt, k.R, k.tok, k.N, k.D);
    assert_int_equal(fd_check("embed dtable", embed_loss, &k, k.w, dt, (size_t)k.V * k.D, FD_H,
                              FD_ATOL, FD_RTOL),
                     0);
    free(k.w), free(k.R), free(k.out), free((void *)k.tok), free(dt);
}

static double rms_loss(void *c)
{
    struct fd_ctx *k = c;
    ref_rmsnorm_fwd(k->out, k->rstd, k->x, k->w, k->N, k->D, 1e-5);
    return dot(k->out, k->R, (size_t)k->N * k->D);
}

static void test_rmsnorm_bwd_ref_matches_finite_differences(void **state)
{
    (void)state;
    struct fd_ctx k = {.N = 3, .D = 7};
    size_t n = (size_t)k.N * k.D;
    k.x = dbuf(n), k.w = dbuf(k.D), k.R = dbuf(n), k.out = dbuf(n), k.rstd = dbuf(k.N);
    tu_fill(k.x, NULL, n, 510, 1.0);
    tu_fill(k.w, NULL, k.D, 511, 1.5);
    tu_fill(k.R, NULL, n, 512, 1.0);
    rms_loss(&k);
    double *dx = dbuf(n), *dw = dbuf(k.D);
    ref_rmsnorm_bwd_x(dx, k.R, k.x, k.rstd, k.w, k.N, k.D);
    ref_rmsnorm_bwd_w(dw, k.R, k.x, k.rstd, k.N, k.D);
    assert_int_equal(fd_check("rmsnorm dx", rms_loss, &k, k.x, dx, n, FD_H, FD_ATOL, FD_RTOL), 0);
    assert_int_equal(fd_check("rmsnorm dw", rms_loss, &k, k.w, dw, k.D, FD_H, FD_ATOL, FD_RTOL), 0);

    /* "adds into": a second call on prefilled buffers gives prefill + gradient */
    double *dx2 = dbuf(n), *dw2 = dbuf(k.D), *want = dbuf(n);
    tu_fill(dx2, NULL, n, 513, 1.0);
    tu_fill(dw2, NULL, k.D, 514, 1.0);
    for (size_t i = 0; i < n; i++)
        want[i] = dx2[i] + dx[i];
    ref_rmsnorm_bwd_x(dx2, k.R, k.x, k.rstd, k.w, k.N, k.D);
    assert_int_equal(tu_compare_d("rmsnorm dx adds", dx2, want, n, 1e-15, 1e-14), 0);
    for (int i = 0; i < k.D; i++)
        want[i] = dw2[i] + dw[i];
    ref_rmsnorm_bwd_w(dw2, k.R, k.x, k.rstd, k.N, k.D);
    assert_int_equal(tu_compare_d("rmsnorm dw adds", dw2, want, k.D, 1e-15, 1e-14), 0);
    free(k.x), free(k.w), free(k.R), free(k.out), free(k.rstd), free(dx), free(dw), free(dx2),
        free(dw2), free(want);
}

static double mm_loss(void *c)
{
    struct fd_ctx *k = c;
    ref_matmul_fwd(k->out, k->x, k->w, k->N, k->I, k->O);
    return dot(k->out, k->R, (size_t)k->N * k->O);
}

static void test_matmul_bwd_ref_matches_finite_differences(void **state)
{
    (void)state;
    struct fd_ctx k = {.N = 4, .I = 5, .O = 3};
    k.x = dbuf((size_t)k.N * k.I), k.w = dbuf((size_t)k.O * k.I), k.R = dbuf((size_t)k.N * k.O),
    k.out = dbuf((size_t)k.N * k.O);
    tu_fill(k.x, NULL, (size_t)k.N * k.I, 520, 1.0);
    tu_fill(k.w, NULL, (size_t)k.O * k.I, 521, 1.0);
    tu_fill(k.R, NULL, (size_t)k.N * k.O, 522, 1.0);
    double *dx = dbuf((size_t)k.N * k.I), *dw = dbuf((size_t)k.O * k.I);
    ref_matmul_bwd_x(dx, k.R, k.w, k.N, k.I, k.O, 0);
    ref_matmul_bwd_w(dw, k.R, k.x, k.N, k.I, k.O);
    assert_int_equal(fd_check("matmul dx", mm_loss, &k, k.x, dx, (size_t)k.N * k.I, FD_H, FD_ATOL,
                              FD_RTOL),
                     0);
    assert_int_equal(fd_check("matmul dw", mm_loss, &k, k.w, dw, (size_t)k.O * k.I, FD_H, FD_ATOL,
                              FD_RTOL),
                     0);
    free(k.x), free(k.w), free(k.R), free(k.out), free(dx), free(dw);
}

static double swiglu_loss(void *c)
{
    struct fd_ctx *k = c;
    ref_swiglu_fwd(k->out, k->x, k->b, (size_t)k->N);
    return dot(k->out, k->R, (size_t)k->N);
}

static void test_swiglu_bwd_ref_matches_finite_differences(void **state)
{
    (void)state;
    struct fd_ctx k = {.N = 23};
    k.x = dbuf(k.N), k.b = dbuf(k.N), k.R = dbuf(k.N), k.out = dbuf(k.N);
    tu_fill(k.x, NULL, k.N, 530, 6.0);
    tu_fill(k.b, NULL, k.N, 531, 2.0);
    tu_fill(k.R, NULL, k.N, 532, 1.0);
    double *da = dbuf(k.N), *db = dbuf(k.N);
    ref_swiglu_bwd(da, db, k.R, k.x, k.b, k.N);
    assert_int_equal(fd_check("swiglu da", swiglu_loss, &k, k.x, da, k.N, FD_H, FD_ATOL, FD_RTOL), 0);
    assert_int_equal(fd_check("swiglu db", swiglu_loss, &k, k.b, db, k.N, FD_H, FD_ATOL, FD_RTOL), 0);
    free(k.x), free(k.b), free(k.R), free(k.out), free(da), free(db);
}

/* Loss = dscale * sum_n loss[n]; its gradient in the logits is dlogits. */
static double xent_loss(void *c)
{
    struct fd_ctx *k = c;
    double s = 0;
    ref_xent(k->out, k->rstd, k->x, k->tok, k->N, k->V, k->dscale);
    for (int n = 0; n < k->N; n++)
        s += k->rstd[n];
    return s * k->dscale;
}

static void test_xent_ref_dlogits_match_finite_differences(void **state)
{
    (void)state;
    struct fd_ctx k = {.N = 4, .V = 9, .dscale = 0.25};
    size_t n = (size_t)k.N * k.V;
    k.x = dbuf(n), k.out = dbuf(n), k.rstd = dbuf(k.N);
    tu_fill(k.x, NULL, n, 540, 4.0);
    k.tok = tokens(k.N, k.V, 541);
    double *dl = dbuf(n), *loss = dbuf(k.N);
    ref_xent(dl, loss, k.x, k.tok, k.N, k.V, k.dscale);
    assert_int_equal(fd_check("xent dlogits", xent_loss, &k, k.x, dl, n, FD_H, FD_ATOL, FD_RTOL), 0);
    free(k.x), free(k.out), free(k.rstd), free((void *)k.tok), free(dl), free(loss);
}

/* ------------------------------------------------------------------------------------------
 * Finite differences through the fast fp32 forwards (loss summed in double): fp32 rounding
 * needs h ~ 1e-2, so the tolerance is loose, but a wrong formula is off by O(1). */

#define FDF_H 1e-2
#define FDF_ATOL 2e-3
#define FDF_RTOL 2e-2

struct fdf_ctx {
    int N, D, I, O;
    double *xd, *wd, *bd; /* perturbed in double, copied to fp32 before every evaluation */
    float *x, *w, *b, *out, *rstd;
    const double *R;
};

static void to_float(float *f, const double *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        f[i] = (float)d[i];
}

static double rms_loss_fast(void *c)
{
    struct fdf_ctx *k = c;
    to_float(k->x, k->xd, (size_t)k->N * k->D);
    to_float(k->w, k->wd, k->D);
    ops_rmsnorm_fwd(NULL, k->out, k->rstd, k->x, k->w, k->N, k->D, 1e-5f);
    return dotf(k->out, k->R, (size_t)k->N * k->D);
}

static void test_rmsnorm_fast_bwd_matches_finite_differences(void **state)
{
    (void)state;
    struct fdf_ctx k = {.N = 3, .D = 16};
    size_t n = (size_t)k.N * k.D;
    double *R = dbuf(n);
    k.xd = dbuf(n), k.wd = dbuf(k.D), k.x = fbuf(n), k.w = fbuf(k.D), k.out = fbuf(n),
    k.rstd = fbuf(k.N), k.R = R;
    tu_fill(k.xd, NULL, n, 600, 1.0);
    tu_fill(k.wd, NULL, k.D, 601, 1.5);
    float *Rf = fbuf(n), *dx = fbuf(n), *dw = fbuf(k.D);
    tu_fill(R, Rf, n, 602, 1.0); /* the same values in both precisions */
    rms_loss_fast(&k);
    ops_rmsnorm_bwd_x(NULL, dx, Rf, k.x, k.rstd, k.w, k.N, k.D);
    ops_rmsnorm_bwd_w(NULL, dw, Rf, k.x, k.rstd, k.N, k.D);
    double *dxd = dbuf(n), *dwd = dbuf(k.D);
    tu_to_double(dxd, dx, n);
    tu_to_double(dwd, dw, k.D);
    assert_int_equal(fd_check("fast rmsnorm dx", rms_loss_fast, &k, k.xd, dxd, n, FDF_H, FDF_ATOL,
                              FDF_RTOL),
                     0);
    assert_int_equal(fd_check("fast rmsnorm dw", rms_loss_fast, &k, k.wd, dwd, k.D, FDF_H, FDF_ATOL,
                              FDF_RTOL),
                     0);
    free(R), free(k.xd), free(k.wd), free(k.x), free(k.w), free(k.out), free(k.rstd), free(Rf),
        free(dx), free(dw), free(dxd), free(dwd);
}

static double mm_loss_fast(void *c)
{
    struct fdf_ctx *k = c;
    to_float(k->x, k->xd, (size_t)k->N * k->I);
    to_float(k->w, k->wd, (size_t)k->O * k->I);
    ops_matmul_fwd(NULL, k->out, k->x, k->w, k->N, k->I, k->O);
    return dotf(k->out, k->R, (size_t)k->N * k->O);
}

static void test_matmul_fast_bwd_matches_finite_differences(void **state)
{
    (void)state;
    struct fdf_ctx k = {.N = 5, .I = 6, .O = 7};
    size_t nx = (size_t)k.N * k.I, nw = (size_t)k.O * k.I, ny = (size_t)k.N * k.O;
    double *R = dbuf(ny);
    float *Rf = fbuf(ny), *dx = fbuf(nx), *dw = fbuf(nw);
    k.xd = dbuf(nx), k.wd = dbuf(nw), k.x = fbuf(nx), k.w = fbuf(nw), k.out = fbuf(ny), k.R = R;
    tu_fill(k.xd, NULL, nx, 610, 1.0);
    tu_fill(k.wd, NULL, nw, 611, 1.0);
    tu_fill(R, Rf, ny, 612, 1.0);
    mm_loss_fast(&k);
    ops_matmul_bwd_x(NULL, dx, Rf, k.w, k.N, k.I, k.O, 0);
    ops_matmul_bwd_w(NULL, dw, Rf, k.x, k.N, k.I, k.O);
    double *dxd = dbuf(nx), *dwd = dbuf(nw);
    tu_to_double(dxd, dx, nx);
    tu_to_double(dwd, dw, nw);
    assert_int_equal(fd_check("fast matmul dx", mm_loss_fast, &k, k.xd, dxd, nx, FDF_H, FDF_ATOL,
                              FDF_RTOL),
                     0);
    assert_int_equal(fd_check("fast matmul dw", mm_loss_fast, &k, k.wd, dwd, nw, FDF_H, FDF_ATOL,
                              FDF_RTOL),
                     0);
    free(R), free(Rf), free(dx), free(dw), free(k.xd), free(k.wd), free(k.x), free(k.w), free(k.out),
        free(dxd), free(dwd);
}

static double swiglu_loss_fast(void *c)
{
    struct fdf_ctx *k = c;
    to_float(k->x, k->xd, (size_t)k->N);
    to_float(k->b, k->bd, (size_t)k->N);
    ops_swiglu_fwd(NULL, k->out, k->x, k->b, (size_t)k->N);
    return dotf(k->out, k->R, (size_t)k->N);
}

static void test_swiglu_fast_bwd_matches_finite_differences(void **state)
{
    (void)state;
    struct fdf_ctx k = {.N = 29};
    size_t n = (size_t)k.N;
    double *R = dbuf(n);
    float *Rf = fbuf(n), *da = fbuf(n), *db = fbuf(n);
    k.xd = dbuf(n), k.bd = dbuf(n), k.x = fbuf(n), k.b = fbuf(n), k.out = fbuf(n), k.R = R;
    tu_fill(k.xd, NULL, n, 620, 6.0);
    tu_fill(k.bd, NULL, n, 621, 2.0);
    tu_fill(R, Rf, n, 622, 1.0);
    swiglu_loss_fast(&k);
    ops_swiglu_bwd(NULL, da, db, Rf, k.x, k.b, n);
    double *dad = dbuf(n), *dbd = dbuf(n);
    tu_to_double(dad, da, n);
    tu_to_double(dbd, db, n);
    assert_int_equal(fd_check("fast swiglu da", swiglu_loss_fast, &k, k.xd, dad, n, FDF_H, FDF_ATOL,
                              FDF_RTOL),
                     0);
    assert_int_equal(fd_check("fast swiglu db", swiglu_loss_fast, &k, k.bd, dbd, n, FDF_H, FDF_ATOL,
                              FDF_RTOL),
                     0);
    free(R), free(Rf), free(da), free(db), free(k.xd), free(k.bd), free(k.x), free(k.b), free(k.out),
        free(dad), free(dbd);
}

/* ------------------------------------------------------------------------------------------
 * Determinism: every fast op run with pools of 1, 2 and 3 threads (and none) on sizes that
 * make many tasks gives the same bits. */

enum { DET_RUNS = 4 };

struct det_case {
    const char *name;
    size_t out_floats; /* compared bytes: all outputs of the op, packed in one buffer */
    void (*run)(pool_t *p, float *out);
};

/* Inputs shared by every run, made once. */
static struct {
    float *x, *w, *dy, *a, *b, *logits, *grad;
    int32_t *tok, *tg;
} in;

enum { DN = 300, DI = 70, DO = 700, DD = 768, DV = 50304, DXN = 20, DSW = 300001, DEV = 50 };

static void det_embed(pool_t *p, float *out)
{
    ops_embed_fwd(p, out, in.w, in.tok, DN, DD);
    memcpy(out + (size_t)DN * DD, in.w, (size_t)DEV * DD * sizeof(float));
    ops_embed_bwd(p, out + (size_t)DN * DD, in.dy, in.tok, DN, DD);
}
static void det_rmsnorm(pool_t *p, float *out)
{
    float *y = out, *rstd = y + (size_t)DN * DD, *dx = rstd + DN, *dw = dx + (size_t)DN * DD;
    ops_rmsnorm_fwd(p, y, rstd, in.x, in.w, DN, DD, 1e-5f);
    memcpy(dx, in.dy, (size_t)DN * DD * sizeof(float));
    ops_rmsnorm_bwd_x(p, dx, in.dy, in.x, rstd, in.w, DN, DD);
    memcpy(dw, in.a, DD * sizeof(float));
    ops_rmsnorm_bwd_w(p, dw, in.dy, in.x, rstd, DN, DD);
}
static void det_matmul(pool_t *p, float *out)
{
    float *y = out, *dx = y + (size_t)DN * DO, *dw = dx + (size_t)DN * DI;
    ops_matmul_fwd(p, y, in.x, in.w, DN, DI, DO);
    memcpy(dx, in.a, (size_t)DN * DI * sizeof(float));
    ops_matmul_bwd_x(p, dx, in.dy, in.w, DN, DI, DO, 1);
    memcpy(dw, in.b, (size_t)DO * DI * sizeof(float));
    ops_matmul_bwd_w(p, dw, in.dy, in.x, DN, DI, DO);
}
static void det_swiglu(pool_t *p, float *out)
{
    ops_swiglu_fwd(p, out, in.a, in.b, DSW);
    ops_swiglu_bwd(p, out + DSW, out + 2 * DSW, in.dy, in.a, in.b, DSW);
}
static void det_xent(pool_t *p, float *out)
{
    ops_xent(p, out, out + (size_t)DXN * DV, in.logits, in.tg, DXN, DV, 1.0f / 7.0f);
}
static void det_adamw(pool_t *p, float *out)
{
    float *pa = out, *m = pa + DSW, *v = m + DSW;
    memcpy(pa, in.a, DSW * sizeof(float));
    memset(m, 0, 2 * DSW * sizeof(float));
    for (int step = 1; step <= 3; step++)
        ops_adamw(p, pa, in.grad, m, v, DSW, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
}

static const struct det_case det_cases[] = {
    {"embed", (size_t)DN * DD + (size_t)DEV * DD, det_embed},
    {"rmsnorm", 2 * (size_t)DN * DD + DN + DD, det_rmsnorm},
    {"matmul", (size_t)DN * DO + (size_t)DN * DI + (size_t)DO * DI, det_matmul},
    {"swiglu", 3 * (size_t)DSW, det_swiglu},
    {"xent", (size_t)DXN * DV + DXN, det_xent},
    {"adamw", 3 * (size_t)DSW, det_adamw},
};

static void test_fast_ops_are_bitwise_identical_for_any_pool_size(void **state)
{
    (void)state;
    size_t big = (size_t)DXN * DV > (size_t)DO * DI * 2 ? (size_t)DXN * DV : (size_t)DO * DI * 2;
    if (big < (size_t)DSW)
        big = DSW;
    if (big < (size_t)DN * DO)
        big = (size_t)DN * DO;
    in.x = fbuf(big), in.w = fbuf(big), in.dy = fbuf(big), in.a = fbuf(big), in.b = fbuf(big);
    in.logits = fbuf((size_t)DXN * DV), in.grad = fbuf(DSW);
    tu_fill(NULL, in.x, big, 700, 1.0);
    tu_fill(NULL, in.w, big, 701, 1.0);
    tu_fill(NULL, in.dy, big, 702, 1.0);
    tu_fill(NULL, in.a, big, 703, 8.0);
    tu_fill(NULL, in.b, big, 704, 1.0);
    tu_fill(NULL, in.logits, (size_t)DXN * DV, 705, 10.0);
    tu_fill(NULL, in.grad, DSW, 706, 0.5);
    in.tok = tokens(DN, DEV, 707);
    in.tg = tokens(DXN, DV, 708);

    pool_t *pools[DET_RUNS] = {NULL, pool_new(1), pool_new(2), pool_new(3)};
    for (size_t c = 0; c < sizeof(det_cases) / sizeof(det_cases[0]); c++) {
        const struct det_case *dc = &det_cases[c];
        float *out[DET_RUNS];
        for (int r = 0; r < DET_RUNS; r++) {
            out[r] = fbuf(dc->out_floats);
            dc->run(pools[r], out[r]);
        }
        for (int r = 1; r < DET_RUNS; r++) {
            if (memcmp(out[0], out[r], dc->out_floats * sizeof(float)) != 0)
                fail_msg("%s: pool of %d threads differs from no pool", dc->name, r);
        }
        for (int r = 0; r < DET_RUNS; r++)
            free(out[r]);
    }
    for (int r = 0; r < DET_RUNS; r++)
        pool_destroy(&pools[r]);
    free(in.x), free(in.w), free(in.dy), free(in.a), free(in.b), free(in.logits), free(in.grad);
    free(in.tok), free(in.tg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed_fwd_copies_rows),
        cmocka_unit_test(test_embed_bwd_adds_into_table),
        cmocka_unit_test(test_rmsnorm_fwd_matches_ref),
        cmocka_unit_test(test_rmsnorm_bwd_matches_ref_and_adds_into),
        cmocka_unit_test(test_matmul_fwd_matches_ref),
        cmocka_unit_test(test_matmul_bwd_x_overwrites_or_accumulates),
        cmocka_unit_test(test_matmul_bwd_w_adds_into),
        cmocka_unit_test(test_swiglu_fwd_bwd_match_ref),
        cmocka_unit_test(test_xent_matches_ref_and_allows_alias),
        cmocka_unit_test(test_adamw_several_steps_match_ref),
        cmocka_unit_test(test_adamw_matches_hand_computed_steps),
        cmocka_unit_test(test_adamw_out_of_place_is_in_place_bitwise_and_keeps_the_sources),
        cmocka_unit_test(test_embed_bwd_ref_matches_finite_differences),
        cmocka_unit_test(test_rmsnorm_bwd_ref_matches_finite_differences),
        cmocka_unit_test(test_matmul_bwd_ref_matches_finite_differences),
        cmocka_unit_test(test_swiglu_bwd_ref_matches_finite_differences),
        cmocka_unit_test(test_xent_ref_dlogits_match_finite_differences),
        cmocka_unit_test(test_rmsnorm_fast_bwd_matches_finite_differences),
        cmocka_unit_test(test_matmul_fast_bwd_matches_finite_differences),
        cmocka_unit_test(test_swiglu_fast_bwd_matches_finite_differences),
        cmocka_unit_test(test_fast_ops_are_bitwise_identical_for_any_pool_size),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
