/* Rotary embedding and causal grouped-query attention: fast fp32 against the double
 * reference, reference backwards against finite differences, causality, rope's
 * relative-position property, and bitwise determinism across pool sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/config.h"
#include "kernels/ops.h"
#include "kernels/ref/ref_ops.h"
#include "tests/testutil.h"

typedef struct { int B, T, Hq, Hkv, hd; } shape_t;

static const shape_t shapes[] = {
    {2, 7, 4, 2, 8}, {1, 1, 2, 2, 16}, {2, 33, 6, 1, 16}, {1, 20, 3, 3, 64}, {3, 5, 4, 4, 8},
};

typedef struct {
    shape_t s;
    size_t nq, nk, np;
    float *q, *k, *v, *dy, *y, *probs, *dq, *dk, *dv;
    double *qd, *kd, *vd, *dyd, *yd, *pd, *dqd, *dkd, *dvd;
} attn_case_t;

static void case_init(attn_case_t *c, shape_t s, uint64_t seed)
{
    memset(c, 0, sizeof(*c));
    c->s = s;
    c->nq = (size_t)s.B * s.T * s.Hq * s.hd;
    c->nk = (size_t)s.B * s.T * s.Hkv * s.hd;
    c->np = (size_t)s.B * s.Hq * s.T * s.T;
#define A(f, n) c->f = malloc((n) * sizeof(float)), c->f##d = malloc((n) * sizeof(double))
    A(q, c->nq); A(k, c->nk); A(v, c->nk); A(dy, c->nq); A(y, c->nq); A(dq, c->nq);
    A(dk, c->nk); A(dv, c->nk);
#undef A
    c->probs = malloc(c->np * sizeof(float));
    c->pd = malloc(c->np * sizeof(double));
    tu_fill(c->qd, c->q, c->nq, seed, 1.5);
    tu_fill(c->kd, c->k, c->nk, seed + 1, 1.5);
    tu_fill(c->vd, c->v, c->nk, seed + 2, 1.0);
    tu_fill(c->dyd, c->dy, c->nq, seed + 3, 1.0);
}

static void case_free(attn_case_t *c)
{
    float *f[] = {c->q, c->k, c->v, c->dy, c->y, c->probs, c->dq, c->dk, c->dv};
    double *d[] = {c->qd, c->kd, c->vd, c->dyd, c->yd, c->pd, c->dqd, c->dkd, c->dvd};
    for (int i = 0; i < 9; i++)
        free(f[i]), free(d[i]);
}

static void test_attn_fast_matches_reference(void **state)
{
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        attn_case_t c;
        shape_t s = shapes[i];
        case_init(&c, s, 100 + i);
        ops_attn_fwd(NULL, c.y, c.probs, c.q, c.k, c.v, s.B, s.T, s.Hq, s.Hkv, s.hd);
        ref_attn_fwd(c.yd, c.pd, c.qd, c.kd, c.vd, s.B, s.T, s.Hq, s.Hkv, s.hd);
        assert_int_equal(tu_compare("y", c.y, c.yd, c.nq, 1e-5, 1e-4), 0);
        assert_int_equal(tu_compare("probs", c.probs, c.pd, c.np, 1e-6, 1e-4), 0);
        ops_attn_bwd(NULL, c.dq, c.dk, c.dv, c.dy, c.probs, c.q, c.k, c.v, s.B, s.T, s.Hq, s.Hkv, s.hd);
        ref_attn_bwd(c.dqd, c.dkd, c.dvd, c.dyd, c.pd, c.qd, c.kd, c.vd, s.B, s.T, s.Hq, s.Hkv, s.hd);
        assert_int_equal(tu_compare("dq", c.dq, c.dqd, c.nq, 1e-5, 1e-4), 0);
        assert_int_equal(tu_compare("dk", c.dk, c.dkd, c.nk, 1e-5, 1e-4), 0);
        assert_int_equal(tu_compare("dv", c.dv, c.dvd, c.nk, 1e-5, 1e-4), 0);
        case_free(&c);
    }
}

/* loss = sum(y * R), R = dy */
static double attn_loss(attn_case_t *c)
{
    shape_t s = c->s;
    ref_attn_fwd(c->yd, c->pd, c->qd, c->kd, c->vd, s.B, s.T, s.Hq, s.Hkv, s.hd);
    double l = 0;
    for (size_t i = 0; i < c->nq; i++)
        l += c->yd[i] * c->dyd[i];
    return l;
}

static size_t fd_check(attn_case_t *c, double *x, const double *g, size_t n, const char *what)
{
    size_t bad = 0;
    double eps = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + eps;
        double lp = attn_loss(c);
        x[i] = keep - eps;
        double lm = attn_loss(c);
        x[i] = keep;
        double fd = (lp - lm) / (2 * eps);
        if (fabs(fd - g[i]) > 1e-7 + 1e-6 * fabs(fd) && bad++ < 3)
            print_error("%s[%zu]: analytic %.10g fd %.10g\n", what, i, g[i], fd);
    }
    return bad;
}

static void test_attn_reference_backward_matches_finite_differences(void **state)
{
    shape_t all[] = {{2, 6, 4, 2, 8}, {1, 5, 3, 1, 4}};
    for (int i = 0; i < 2; i++) {
        attn_case_t c;
        shape_t s = all[i];
        case_init(&c, s, 7 + i);
        attn_loss(&c);
        ref_attn_bwd(c.dqd, c.dkd, c.dvd, c.dyd, c.pd, c.qd, c.kd, c.vd, s.B, s.T, s.Hq, s.Hkv, s.hd);
        double *gq = malloc(c.nq * 8), *gk = malloc(c.nk * 8), *gv = malloc(c.nk * 8);
        memcpy(gq, c.dqd, c.nq * 8), memcpy(gk, c.dkd, c.nk * 8), memcpy(gv, c.dvd, c.nk * 8);
        assert_int_equal(fd_check(&c, c.qd, gq, c.nq, "dq"), 0);
        assert_int_equal(fd_check(&c, c.kd, gk, c.nk, "dk"), 0);
        assert_int_equal(fd_check(&c, c.vd, gv, c.nk, "dv"), 0);
        free(gq), free(gk), free(gv);
        case_free(&c);
    }
}

static void test_attn_fast_backward_matches_finite_differences_loosely(void **state)
{
    shape_t s = {1, 6, 2, 1, 8};
    attn_case_t c;
    case_init(&c, s, 55);
    ops_attn_fwd(NULL, c.y, c.probs, c.q, c.k, c.v, s.B, s.T, s.Hq, s.Hkv, s.hd);
    ops_attn_bwd(NULL, c.dq, c.dk, c.dv, c.dy, c.probs, c.q, c.k, c.v, s.B, s.T, s.Hq, s.Hkv, s.hd);
    float *xs[] = {c.q, c.k, c.v}, *gs[] = {c.dq, c.dk, c.dv};
    size_t ns[] = {c.nq, c.nk, c.nk};
    for (int w = 0; w < 3; w++)
        for (size_t i = 0; i < ns[w]; i++) {
            float keep = xs[w][i], eps = 1e-2f;
            double l[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                xs[w][i] = keep + (sgn ? -eps : eps);
                ops_attn_fwd(NULL, c.y, c.probs, c.q, c.k, c.v, s.B, s.T, s.Hq, s.Hkv, s.hd);
                l[sgn] = 0;
                for (size_t j = 0; j < c.nq; j++)
                    l[sgn] += (double)c.y[j] * c.dy[j];
            }
            xs[w][i] = keep;
            double fd = (l[0] - l[1]) / (2 * eps);
            assert_true(fabs(fd - gs[w][i]) <= 2e-3 + 2e-2 * fabs(fd));
        }
    case_free(&c);
}

static void test_attn_is_causal(void **state)
{
    shape_t s = {2, 9, 4, 2, 16};
    attn_case_t c;
    case_init(&c, s, 31);
    float *y0 = malloc(c.nq * sizeof(float));
    ops_attn_fwd(NULL, y0, c.probs, c.q, c.k, c.v, s.B, s.T, s.Hq, s.Hkv, s.hd);
    int t = 4; /* change k and v at positions > t of batch 1 */
    for (int u = t + 1; u < s.T; u++)
        for (int e = 0; e < s.Hkv * s.hd; e++) {
            size_t at = ((size_t)1 * s.T + u) * s.Hkv * s.hd + e;
            c.k[at] += 3.0f, c.v[at] -= 2.0f;
        }
    ops_attn_fwd(NULL, c.y, c.probs, c.q, c.k, c.v, s.B, s.T, s.Hq, s.Hkv, s.hd);
    size_t row = (size_t)s.Hq * s.hd;
    assert_memory_equal(y0, c.y, (size_t)(s.T + t + 1) * row * sizeof(float)); /* b0 all, b1 <= t */
    assert_memory_not_equal(y0 + (s.T + t + 1) * row, c.y + (s.T + t + 1) * row, row * sizeof(float));
    free(y0);
    case_free(&c);
}

static void test_rope_fast_matches_reference_and_inverts(void **state)
{
    int B = 2, T = 37, H = 3, hd = 16;
    size_t n = (size_t)B * T * H * hd;
    float *x = malloc(n * 4), *x0 = malloc(n * 4), *c = malloc(T * hd / 2 * 4), *s = malloc(T * hd / 2 * 4);
    double *xd = malloc(n * 8), *cd = malloc(T * hd / 2 * 8), *sd = malloc(T * hd / 2 * 8);
    tu_fill(xd, x, n, 3, 1.0);
    memcpy(x0, x, n * 4);
    ops_rope_table(c, s, T, hd, 10000.0);
    ref_rope_table(cd, sd, T, hd, 10000.0);
    ops_rope_fwd(NULL, x, c, s, B, T, H, hd);
    ref_rope_fwd(xd, cd, sd, B, T, H, hd);
    assert_int_equal(tu_compare("rope fwd", x, xd, n, 1e-6, 1e-5), 0);
    ops_rope_bwd(NULL, x, c, s, B, T, H, hd); /* the inverse rotation brings x back */
    for (size_t i = 0; i < n; i++)
        assert_true(fabsf(x[i] - x0[i]) < 1e-5f);
    ref_rope_bwd(xd, cd, sd, B, T, H, hd);
    double *x0d = malloc(n * 8);
    tu_to_double(x0d, x0, n);
    assert_int_equal(tu_compare_d("ref rope inverse", xd, x0d, n, 1e-12, 0), 0);
    free(x), free(x0), free(c), free(s), free(xd), free(cd), free(sd), free(x0d);
}

/* Tables from config_rope_inv_freq: without scaling the same bits as from theta (the tables
 * every run had), with Llama 3.1's scaling the reference's table and another one. */
static void test_rope_table_from_config_frequencies(void **state)
{
    (void)state;
    model_config_t cfg = config_defaults();
    cfg.dim = 64, cfg.n_heads = 4, cfg.rope_theta = 500000.0;
    int T = 200, hd = 16, half = hd / 2;
    size_t n = (size_t)T * half;
    double freq[8], *cd = malloc(n * 8), *sd = malloc(n * 8);
    float *c0 = malloc(n * 4), *s0 = malloc(n * 4), *c1 = malloc(n * 4), *s1 = malloc(n * 4);
    for (int i = 0; i < half; i++)
        freq[i] = config_rope_inv_freq(&cfg, i);
    ops_rope_table(c0, s0, T, hd, cfg.rope_theta);
    ops_rope_table_freq(c1, s1, T, hd, freq);
    assert_memory_equal(c0, c1, n * 4);
    assert_memory_equal(s0, s1, n * 4);
    cfg.rope_scaling_factor = 8, cfg.rope_low_freq_factor = 1, cfg.rope_high_freq_factor = 4;
    cfg.rope_original_max_seq_len = 64;
    for (int i = 0; i < half; i++)
        freq[i] = config_rope_inv_freq(&cfg, i);
    ops_rope_table_freq(c1, s1, T, hd, freq);
    ref_rope_table_freq(cd, sd, T, hd, freq);
    assert_int_equal(tu_compare("scaled cos", c1, cd, n, 1e-7, 1e-6), 0);
    assert_int_equal(tu_compare("scaled sin", s1, sd, n, 1e-7, 1e-6), 0);
    assert_true(memcmp(c0, c1, n * 4) != 0);
    free(cd), free(sd), free(c0), free(s0), free(c1), free(s1);
}

static void test_rope_reference_backward_matches_finite_differences(void **state)
{
    int T = 5, hd = 8;
    size_t n = (size_t)T * hd;
    double *x = malloc(n * 8), *r = malloc(n * 8), *g = malloc(n * 8), *y = malloc(n * 8);
    double *c = malloc(T * hd / 2 * 8), *s = malloc(T * hd / 2 * 8);
    tu_fill(x, NULL, n, 9, 1.0);
    tu_fill(r, NULL, n, 10, 1.0);
    ref_rope_table(c, s, T, hd, 500000.0);
    memcpy(g, r, n * 8);
    ref_rope_bwd(g, c, s, 1, T, 1, hd);
    for (size_t i = 0; i < n; i++) {
        double l[2], eps = 1e-6;
        for (int sg = 0; sg < 2; sg++) {
            memcpy(y, x, n * 8);
            y[i] += sg ? -eps : eps;
            ref_rope_fwd(y, c, s, 1, T, 1, hd);
            l[sg] = 0;
            for (size_t j = 0; j < n; j++)
                l[sg] += y[j] * r[j];
        }
        assert_true(fabs((l[0] - l[1]) / (2 * eps) - g[i]) < 1e-8);
    }
    free(x), free(r), free(g), free(y), free(c), free(s);
}

/* q·k after rope depends only on the distance between positions, and norms are kept. */
static void test_rope_scores_depend_only_on_relative_position(void **state)
{
    int T = 12, hd = 16;
    float *c = malloc(T * hd / 2 * 4), *s = malloc(T * hd / 2 * 4);
    float *q = malloc((size_t)T * hd * 4), *k = malloc((size_t)T * hd * 4), base_q[16], base_k[16];
    ops_rope_table(c, s, T, hd, 10000.0);
    tu_fill(NULL, base_q, hd, 1, 1.0);
    tu_fill(NULL, base_k, hd, 2, 1.0);
    for (int t = 0; t < T; t++)
        memcpy(q + t * hd, base_q, sizeof(base_q)), memcpy(k + t * hd, base_k, sizeof(base_k));
    ops_rope_fwd(NULL, q, c, s, 1, T, 1, hd);
    ops_rope_fwd(NULL, k, c, s, 1, T, 1, hd);
    double n0 = 0, n5 = 0;
    for (int d = 0; d < hd; d++)
        n0 += base_q[d] * base_q[d], n5 += q[5 * hd + d] * q[5 * hd + d];
    assert_true(fabs(n0 - n5) < 1e-5 * n0);
    for (int dist = 0; dist < 4; dist++) {
        double first = 0;
        for (int t = dist; t < T; t++) {
            double dotp = 0;
            for (int d = 0; d < hd; d++)
                dotp += (double)q[t * hd + d] * k[(t - dist) * hd + d];
            if (t == dist)
                first = dotp;
            assert_true(fabs(dotp - first) < 1e-4);
        }
    }
    free(c), free(s), free(q), free(k);
}

static void test_attn_and_rope_bits_identical_for_any_pool_size(void **state)
{
    shape_t s = {3, 40, 6, 2, 16};
    attn_case_t c[3];
    float *cs = malloc(40 * 8 * 4), *sn = malloc(40 * 8 * 4);
    ops_rope_table(cs, sn, 40, 16, 10000.0);
    for (int t = 0; t < 3; t++) {
        pool_t *p = t ? pool_new(t + 1) : NULL;
        case_init(&c[t], s, 77);
        ops_rope_fwd(p, c[t].q, cs, sn, s.B, s.T, s.Hq, s.hd);
        ops_rope_fwd(p, c[t].k, cs, sn, s.B, s.T, s.Hkv, s.hd);
        ops_attn_fwd(p, c[t].y, c[t].probs, c[t].q, c[t].k, c[t].v, s.B, s.T, s.Hq, s.Hkv, s.hd);
        ops_attn_bwd(p, c[t].dq, c[t].dk, c[t].dv, c[t].dy, c[t].probs, c[t].q, c[t].k, c[t].v, s.B,
                     s.T, s.Hq, s.Hkv, s.hd);
        ops_rope_bwd(p, c[t].dq, cs, sn, s.B, s.T, s.Hq, s.hd);
        pool_destroy(&p);
        if (t) {
            assert_memory_equal(c[t].y, c[0].y, c[0].nq * 4);
            assert_memory_equal(c[t].probs, c[0].probs, c[0].np * 4);
            assert_memory_equal(c[t].dq, c[0].dq, c[0].nq * 4);
            assert_memory_equal(c[t].dk, c[0].dk, c[0].nk * 4);
            assert_memory_equal(c[t].dv, c[0].dv, c[0].nk * 4);
        }
    }
    for (int t = 0; t < 3; t++)
        case_free(&c[t]);
    free(cs), free(sn);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn_fast_matches_reference),
        cmocka_unit_test(test_attn_reference_backward_matches_finite_differences),
        cmocka_unit_test(test_attn_fast_backward_matches_finite_differences_loosely),
        cmocka_unit_test(test_attn_is_causal),
        cmocka_unit_test(test_rope_fast_matches_reference_and_inverts),
        cmocka_unit_test(test_rope_table_from_config_frequencies),
        cmocka_unit_test(test_rope_reference_backward_matches_finite_differences),
        cmocka_unit_test(test_rope_scores_depend_only_on_relative_position),
        cmocka_unit_test(test_attn_and_rope_bits_identical_for_any_pool_size),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
