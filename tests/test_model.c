/* The whole model: the double reference against finite differences, the CPU model
 * against the reference, the B/W backward split, splitting into pipeline pieces, and
 * bitwise determinism across thread counts. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/act_bytes.h"
#include "kernels/cpu/model.h"
#include "kernels/ops.h"
#include "kernels/ref/model_ref.h"
#include "tests/testutil.h"

typedef struct {
    model_config_t cfg;
    param_table_t tab;
    float *w;          /* (total) */
    int B, T;
    int32_t *tok, *tgt;
} fixture_t;

static void fixture_init(fixture_t *f, model_config_t cfg, int B, int T, uint64_t seed)
{
    char err[256];
    f->cfg = cfg;
    assert_int_equal(config_validate(&f->cfg, err, sizeof(err)), 0);
    assert_int_equal(params_table_init(&f->tab, &f->cfg), 0);
    f->w = malloc(f->tab.total * sizeof(float));
    params_init(&f->tab, &f->cfg, seed, f->w, 0, f->tab.total);
    /* norms away from 1 so their gradients are exercised in a general position */
    uint64_t s = seed;
    for (int i = 0; i < f->tab.n; i++) {
        const param_info_t *p = &f->tab.t[i];
        if (p->ndim == 1)
            for (size_t j = 0; j < p->numel; j++)
                f->w[p->offset + j] = (float)(1.0 + tu_uniform(&s, 0.3));
    }
    f->B = B, f->T = T;
    f->tok = malloc(sizeof(int32_t) * B * T);
    f->tgt = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) {
        f->tok[i] = (int32_t)(tu_next(&s) % (uint64_t)cfg.vocab_size);
        f->tgt[i] = (int32_t)(tu_next(&s) % (uint64_t)cfg.vocab_size);
    }
}

static void fixture_free(fixture_t *f)
{
    free(f->w);
    free(f->tok);
    free(f->tgt);
    params_table_free(&f->tab);
}

static model_config_t tiny(void)
{
    model_config_t c;
    config_preset("tiny", &c); /* dim 16, 2 layers, 4 heads, 2 kv heads, vocab 32, ffn 48 */
    return c;
}

/* Runs the CPU model over all pieces; returns the loss sum, grads zeroed first. */
static double cpu_loss_grad(const fixture_t *f, float *grads, pool_t *pool)
{
    size_t n = f->tab.total;
    memset(grads, 0, n * sizeof(float));
    model_t *m = model_new(&f->cfg, 0, f->cfg.n_layers + 2, f->w, grads, pool);
    assert_non_null(m);
    model_acts_t *a = model_acts_new(m, f->B, f->T);
    assert_non_null(a);
    double loss = model_forward(m, a, f->tok, NULL, f->tgt, 1.0f / (f->B * f->T), NULL);
    model_backward_b(m, a, NULL, NULL);
    model_backward_w(m, a);
    model_acts_destroy(&a);
    model_destroy(&m);
    return loss;
}

static void test_model_reference_gradient_matches_finite_differences(void **state)
{
    fixture_t f;
    fixture_init(&f, tiny(), 2, 5, 7);
    size_t n = f.tab.total;
    double *w = malloc(n * sizeof(double)), *g = calloc(n, sizeof(double));
    tu_to_double(w, f.w, n);
    double scale = 1.0 / (f.B * f.T);
    ref_model_loss(&f.cfg, &f.tab, w, g, f.tok, f.tgt, f.B, f.T, scale);
    size_t bad = 0;
    double eps = 1e-5;
    for (size_t i = 0; i < n; i++) { /* every parameter of the model */
        double keep = w[i];
        w[i] = keep + eps;
        double lp = ref_model_loss(&f.cfg, &f.tab, w, NULL, f.tok, f.tgt, f.B, f.T, scale);
        w[i] = keep - eps;
        double lm = ref_model_loss(&f.cfg, &f.tab, w, NULL, f.tok, f.tgt, f.B, f.T, scale);
        w[i] = keep;
        double fd = (lp - lm) * scale / (2 * eps);
        if (fabs(fd - g[i]) > 1e-8 + 1e-5 * fabs(fd)) {
            if (bad++ < 5)
                print_error("param %zu: analytic %.10g finite-difference %.10g\n", i, g[i], fd);
        }
    }
    assert_int_equal(bad, 0);
    free(w);
    free(g);
    fixture_free(&f);
}

static void check_cpu_against_reference(model_config_t cfg, int B, int T)
{
    fixture_t f;
    fixture_init(&f, cfg, B, T, 11);
    size_t n = f.tab.total;
    double *w = malloc(n * sizeof(double)), *g = calloc(n, sizeof(double));
    float *gf = malloc(n * sizeof(float));
    tu_to_double(w, f.w, n);
    double ref = ref_model_loss(&f.cfg, &f.tab, w, g, f.tok, f.tgt, B, T, 1.0 / (B * T));
    double got = cpu_loss_grad(&f, gf, NULL);
    assert_true(fabs(got - ref) <= 1e-5 * fabs(ref));
    for (int i = 0; i < f.tab.n; i++) { /* per tensor: tolerance relative to its own scale */
        const param_info_t *p = &f.tab.t[i];
        double mx = 0;
        for (size_t j = 0; j < p->numel; j++)
            mx = fmax(mx, fabs(g[p->offset + j]));
        assert_int_equal(tu_compare(p->name, gf + p->offset, g + p->offset, p->numel,
                                    1e-4 * mx + 1e-9, 1e-3), 0);
    }
    free(w);
    free(g);
    free(gf);
    fixture_free(&f);
}

static void test_model_cpu_matches_reference_tiny(void **state)
{
    check_cpu_against_reference(tiny(), 2, 5);
}

static void test_model_cpu_matches_reference_wider(void **state)
{
    model_config_t c = tiny();
    c.dim = 48, c.n_heads = 6, c.n_kv_heads = 3, c.n_layers = 3, c.vocab_size = 97;
    check_cpu_against_reference(c, 3, 19);
}

/* F B W per microbatch versus all forwards, all Bs, then all Ws (same W order): the
 * weight-gradient part may run later without changing a bit. */
static void test_model_deferred_weight_gradients_are_bitwise_identical(void **state)
{
    fixture_t f;
    fixture_init(&f, tiny(), 2, 8, 3);
    size_t n = f.tab.total;
    float *g1 = calloc(n, sizeof(float)), *g2 = calloc(n, sizeof(float));
    int L = f.cfg.n_layers + 2, N = f.B * f.T;
    int32_t *tok2 = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tok2[i] = (f.tok[i] + 5) % f.cfg.vocab_size;
    const int32_t *toks[2] = {f.tok, tok2};
    double l1 = 0, l2 = 0;
    {
        model_t *m = model_new(&f.cfg, 0, L, f.w, g1, NULL);
        model_acts_t *a = model_acts_new(m, f.B, f.T);
        for (int mb = 0; mb < 2; mb++) {
            l1 += model_forward(m, a, toks[mb], NULL, f.tgt, 1.0f / (2 * N), NULL);
            model_backward_b(m, a, NULL, NULL);
            model_backward_w(m, a);
        }
        model_acts_destroy(&a);
        model_destroy(&m);
    }
    {
        model_t *m = model_new(&f.cfg, 0, L, f.w, g2, NULL);
        model_acts_t *a[2] = {model_acts_new(m, f.B, f.T), model_acts_new(m, f.B, f.T)};
        for (int mb = 0; mb < 2; mb++)
            l2 += model_forward(m, a[mb], toks[mb], NULL, f.tgt, 1.0f / (2 * N), NULL);
        model_backward_b(m, a[1], NULL, NULL);
        model_backward_b(m, a[0], NULL, NULL);
        model_backward_w(m, a[0]);
        model_backward_w(m, a[1]);
        model_acts_destroy(&a[0]);
        model_acts_destroy(&a[1]);
        model_destroy(&m);
    }
    assert_true(l1 == l2);
    assert_memory_equal(g1, g2, n * sizeof(float));
    free(g1);
    free(g2);
    free(tok2);
    fixture_free(&f);
}

/* Parameter sharding's hook (params.h shard_io_t): the model hands each piece's weight
 * gradients of a microbatch to io piece by piece, in the order its W runs (head, layers from
 * the top, embedding), in a buffer it zeroed first (the io here fills it with garbage), and adds
 * none into its own gradients; io that adds them back gives the gradients of the model without
 * io bit for bit (one microbatch: zero plus the sum), with B and W split or fused (activation
 * checkpointing). A failing give stops the rest of the W and is model_status's. */
typedef struct {
    float *sum, *buf;
    size_t lo[8], hi[8];
    int n, fail_at;
} test_io_t;

static int io_take(void *arg, size_t lo, size_t hi, float **buf)
{
    test_io_t *t = arg;
    for (size_t i = 0; i < hi - lo; i++)
        t->buf[i] = 1e30f; /* the model must zero it */
    *buf = t->buf;
    return 0;
}

static int io_give(void *arg, size_t lo, size_t hi)
{
    test_io_t *t = arg;
    if (t->n == t->fail_at)
        return -ECANCELED;
    t->lo[t->n] = lo, t->hi[t->n] = hi, t->n++;
    for (size_t i = lo; i < hi; i++)
        t->sum[i] += t->buf[i - lo];
    return 0;
}

static void test_model_shard_io_takes_each_pieces_gradients_in_w_order(void **state)
{
    fixture_t f;
    fixture_init(&f, tiny(), 2, 8, 11);
    size_t n = f.tab.total;
    int L = f.cfg.n_layers + 2;
    float *ref = calloc(n, sizeof(float)), *own = calloc(n, sizeof(float));
    test_io_t t = {.sum = calloc(n, sizeof(float)), .buf = malloc(n * sizeof(float)), .fail_at = -1};
    double l_ref = cpu_loss_grad(&f, ref, NULL);
    for (int fused = 0; fused < 2; fused++) {
        model_config_t cfg = f.cfg;
        cfg.ac_mode = fused ? CONFIG_AC_FULL : CONFIG_AC_NONE;
        memset(t.sum, 0, n * sizeof(float));
        t.n = 0;
        model_t *m = model_new(&cfg, 0, L, f.w, own, NULL);
        shard_io_t io = {.take = io_take, .give = io_give, .arg = &t};
        model_set_shard_io(m, &io);
        model_acts_t *a = model_acts_new(m, f.B, f.T);
        double l = model_forward(m, a, f.tok, NULL, f.tgt, 1.0f / (f.B * f.T), NULL);
        if (fused)
            model_backward(m, a, NULL, NULL);
        else
            model_backward_b(m, a, NULL, NULL), model_backward_w(m, a);
        assert_int_equal(model_status(m), 0);
        assert_true(l == l_ref);
        assert_memory_equal(t.sum, ref, n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            assert_true(own[i] == 0.0f); /* nothing into the model's own gradients */
        assert_int_equal(t.n, L); /* every piece once, head first, embedding last */
        for (int k = 0; k < L; k++) {
            size_t lo, hi;
            params_piece_range(&f.tab, L - 1 - k, L - k, &lo, &hi);
            assert_true(t.lo[k] == lo && t.hi[k] == hi);
        }
        if (!fused) { /* a give that fails (the exchange closed): the rest of the W skipped, said */
            model_backward_b(m, a, NULL, NULL); /* a W reads what its B kept (in work sets since) */
            t.n = 0, t.fail_at = 1;
            model_backward_w(m, a);
            assert_int_equal(model_status(m), -ECANCELED);
            assert_int_equal(t.n, 1);
            t.fail_at = -1;
        }
        model_acts_destroy(&a);
        model_destroy(&m);
    }
    free(ref);
    free(own);
    free(t.sum);
    free(t.buf);
    fixture_free(&f);
}

/* The model cut into pipeline pieces and chained by hand gives the same bits as whole. */
static void run_split(const fixture_t *f, const int *cuts, int ncuts, float *grads, double *loss)
{
    int nst = ncuts - 1, N = f->B * f->T, D = f->cfg.dim;
    model_t *m[8];
    model_acts_t *a[8];
    float *x[8];
    memset(grads, 0, f->tab.total * sizeof(float));
    for (int s = 0; s < nst; s++) {
        size_t b, e;
        params_piece_range(&f->tab, cuts[s], cuts[s + 1], &b, &e);
        m[s] = model_new(&f->cfg, cuts[s], cuts[s + 1], f->w + b, grads + b, NULL);
        assert_non_null(m[s]);
        a[s] = model_acts_new(m[s], f->B, f->T);
        x[s] = malloc((size_t)N * D * sizeof(float));
    }
    for (int s = 0; s < nst; s++)
        *loss = model_forward(m[s], a[s], f->tok, s ? x[s - 1] : NULL, f->tgt, 1.0f / N, x[s]);
    for (int s = nst - 1; s >= 0; s--) /* x[s-1] is reused for the gradient going down */
        model_backward_b(m[s], a[s], x[s], s ? x[s - 1] : NULL);
    for (int s = 0; s < nst; s++) {
        model_backward_w(m[s], a[s]);
        model_acts_destroy(&a[s]);
        model_destroy(&m[s]);
        free(x[s]);
    }
}

/* Activation checkpointing: a pipeline of pieces cuts (stages chained by hand) runs nmb
 * microbatches, every forward first, then the backwards: with fused each B with its W
 * (model_backward, as the stage runs a W right after its B), else every B and then the W's in
 * microbatch order (a zero-bubble stage holding W back). Returns the loss sum; the
 * activation bytes of one microbatch of every stage and the work sets after the run. */
static double run_ac(const fixture_t *f, model_config_t cfg, const int *cuts, int ncuts, int nmb, int fused,
                     pool_t *pool, float *grads, size_t *acts, size_t *work)
{
    enum { S = 4, M = 3 };
    int nst = ncuts - 1, N = f->B * f->T, D = f->cfg.dim;
    assert_true(nst <= S && nmb <= M);
    model_t *m[S];
    model_acts_t *a[S][M];
    float *x[S][M];
    int32_t *tok[M];
    size_t total[S];
    memset(grads, 0, f->tab.total * sizeof(float));
    *acts = *work = 0;
    for (int mb = 0; mb < nmb; mb++) {
        tok[mb] = malloc((size_t)N * sizeof(int32_t));
        for (int i = 0; i < N; i++)
            tok[mb][i] = (f->tok[i] + 3 * mb) % f->cfg.vocab_size;
    }
    for (int s = 0; s < nst; s++) {
        size_t b, e;
        params_piece_range(&f->tab, cuts[s], cuts[s + 1], &b, &e);
        assert_non_null(m[s] = model_new(&cfg, cuts[s], cuts[s + 1], f->w + b, grads + b, pool));
        for (int mb = 0; mb < nmb; mb++) {
            assert_non_null(a[s][mb] = model_acts_new(m[s], f->B, f->T));
            x[s][mb] = malloc((size_t)N * D * sizeof(float));
        }
        *acts += model_acts_bytes(a[s][0]);
        model_act_size_t z;
        assert_int_equal(model_act_bytes(&cfg, cuts[s], cuts[s + 1], f->B, f->T, MODEL_ACT_CPU, &z), 0);
        assert_int_equal(z.per_mb, model_acts_bytes(a[s][0])); /* the plan's figure is the model's */
        assert_int_equal(z.units_fused * z.unit + z.unit_b + z.units_g_fused * z.unit_g,
                         model_work_bytes(m[s])); /* made with the first acts */
        assert_int_equal(model_act_total(&z, nmb, 0), nmb * z.per_mb + model_work_bytes(m[s]));
        total[s] = model_act_total(&z, nmb, nmb); /* the bound with every W held back */
    }
    double loss = 0;
    for (int mb = 0; mb < nmb; mb++)
        for (int s = 0; s < nst; s++)
            loss += model_forward(m[s], a[s][mb], tok[mb], s ? x[s - 1][mb] : NULL, f->tgt, 1.0f / (nmb * N),
                                  x[s][mb]);
    for (int mb = 0; mb < nmb; mb++)
        for (int s = nst - 1; s >= 0; s--) {
            float *dy = x[s][mb], *dx = s ? x[s - 1][mb] : NULL;
            if (fused)
                model_backward(m[s], a[s][mb], dy, dx);
            else
                model_backward_b(m[s], a[s][mb], dy, dx);
        }
    for (int mb = 0; mb < nmb && !fused; mb++)
        for (int s = 0; s < nst; s++)
            model_backward_w(m[s], a[s][mb]);
    for (int s = 0; s < nst; s++) {
        assert_int_equal(model_status(m[s]), 0);
        assert_true(nmb * model_acts_bytes(a[s][0]) + model_work_bytes(m[s]) <= total[s]);
        *work += model_work_bytes(m[s]);
        for (int mb = 0; mb < nmb; mb++) {
            model_acts_destroy(&a[s][mb]);
            free(x[s][mb]);
        }
        model_destroy(&m[s]);
    }
    for (int mb = 0; mb < nmb; mb++)
        free(tok[mb]);
    return loss;
}

/* Every mode gives mode none's (W held back) losses and gradients bit for bit, whole and in
 * pipeline pieces, with W right after B or held back; the per-microbatch storage shrinks by
 * what the recomputed layers no longer keep, and the work sets are two layers' with W fused,
 * one per checkpointed layer and microbatch held back otherwise. The gradients B keeps for W
 * are never in a microbatch's storage: a checkpointed layer's are in its work set, another's
 * in a gradient work set (two a stage with W fused, one per layer and microbatch held back). */
static void test_model_activation_checkpointing_is_bitwise_and_saves_memory(void **state)
{
    fixture_t f;
    model_config_t c = tiny();
    c.n_layers = 4;
    fixture_init(&f, c, 2, 6, 11);
    size_t n = f.tab.total, N = (size_t)f.B * f.T, D = c.dim, F = (size_t)config_ffn_hidden(&f.cfg);
    size_t hd = (size_t)config_head_dim(&f.cfg), QD = c.n_heads * hd, KD = f.cfg.n_kv_heads * hd;
    size_t probs = (size_t)f.B * c.n_heads * f.T * f.T;
    /* what a layer kept in mode none besides its input, and what op still keeps besides it */
    size_t layer_rest = (N * (D * 7 + 2 + QD * 3 + KD * 4 + F * 5) + probs) * sizeof(float);
    size_t ops_kept = (N * (QD * 2 + KD * 2 + D + F * 2) + probs) * sizeof(float);
    size_t b_only = (N * (QD + KD * 2 + F * 2) + probs) * sizeof(float); /* q, k, v, a, b, softmax */
    size_t grad = N * (D * 4 + F * 2 + QD + KD * 2) * sizeof(float); /* df da db dxn2 dh1 dq dk dv dxn1 */
    float *g0 = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    pool_t *pool = pool_new(2);
    int whole[] = {0, 6}, split[] = {0, 3, 6};
    const int *cuts[] = {whole, split};
    int ncuts[] = {2, 3};
    struct { int mode, every, ckpt; } modes[] = {
        {CONFIG_AC_NONE, 0, 0}, {CONFIG_AC_FULL, 0, 4}, {CONFIG_AC_SELECTIVE, 2, 2}, {CONFIG_AC_SELECTIVE, 1, 4},
        {CONFIG_AC_SELECTIVE, 0, 4},
    };
    for (int k = 0; k < 2; k++) {
        size_t acts0, work0, acts, work;
        double l0 = run_ac(&f, f.cfg, cuts[k], ncuts[k], 3, 0, pool, g0, &acts0, &work0);
        assert_int_equal(work0, 3 * 4 * grad); /* every layer's of the three microbatches at once */
        for (int i = 0; i < 5; i++)
            for (int fused = 0; fused < 2; fused++) {
                model_config_t cc = f.cfg;
                cc.ac_mode = modes[i].mode, cc.ac_every = modes[i].every;
                double l = run_ac(&f, cc, cuts[k], ncuts[k], 3, fused, pool, g, &acts, &work);
                assert_true(l == l0);
                assert_memory_equal(g, g0, n * sizeof(float));
                size_t saved = modes[i].every == 0 && modes[i].mode == CONFIG_AC_SELECTIVE
                                   ? layer_rest - ops_kept : layer_rest;
                assert_int_equal(acts0 - acts, (size_t)modes[i].ckpt * (saved - grad));
                /* the work sets hold what a recomputed layer does not keep: what W reads too,
                 * fused two per stage (one where no two checkpointed layers touch: selective
                 * 2), held back one per checkpointed layer and microbatch (3), all alive before
                 * the first W; and what B alone reads (not under op), one per stage */
                int op = modes[i].mode == CONFIG_AC_SELECTIVE && modes[i].every == 0;
                size_t unit_b = op ? 0 : b_only, stages = (size_t)(ncuts[k] - 1);
                size_t units = (size_t)modes[i].ckpt * 3;
                if (fused)
                    units = stages * (modes[i].every == 2 ? 1 : 2);
                /* the other layers' gradients: none 4 a stage, selective 2 two (0 and 2, no two
                 * adjacent: one set a stage fused) */
                size_t keep = 4 - (size_t)modes[i].ckpt;
                size_t units_g = fused ? stages * (keep == 4 ? 2 : keep ? 1 : 0) : keep * 3;
                if (!modes[i].ckpt)
                    units = 0, unit_b = 0;
                assert_int_equal(work, units * (saved - unit_b) + (unit_b ? stages * unit_b : 0) + units_g * grad);
            }
    }
    pool_destroy(&pool);
    free(g0);
    free(g);
    fixture_free(&f);
}

static void test_model_split_into_pieces_matches_whole_bitwise(void **state)
{
    fixture_t f;
    model_config_t c = tiny();
    c.n_layers = 4;
    fixture_init(&f, c, 2, 6, 5);
    size_t n = f.tab.total;
    float *gw = malloc(n * sizeof(float)), *gs = malloc(n * sizeof(float));
    double lw, ls;
    int whole[] = {0, 6};
    run_split(&f, whole, 2, gw, &lw);
    int splits[][5] = {{0, 3, 6}, {0, 1, 2, 5, 6}, {0, 2, 4, 5, 6}};
    int nsplit[] = {3, 5, 5};
    for (int i = 0; i < 3; i++) {
        run_split(&f, splits[i], nsplit[i], gs, &ls);
        assert_true(lw == ls);
        assert_memory_equal(gw, gs, n * sizeof(float));
    }
    free(gw);
    free(gs);
    fixture_free(&f);
}

static void test_model_bits_identical_for_any_thread_count(void **state)
{
    fixture_t f;
    model_config_t c = tiny();
    c.dim = 64, c.n_heads = 4, c.n_kv_heads = 4, c.vocab_size = 300, c.multiple_of = 64;
    fixture_init(&f, c, 3, 40, 9);
    size_t n = f.tab.total;
    float *g1 = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    double l1 = cpu_loss_grad(&f, g1, NULL);
    for (int threads = 2; threads <= 3; threads++) {
        pool_t *p = pool_new(threads);
        double l = cpu_loss_grad(&f, g, p);
        pool_destroy(&p);
        assert_null(p);
        assert_true(l == l1);
        assert_memory_equal(g, g1, n * sizeof(float));
    }
    free(g1);
    free(g);
    fixture_free(&f);
}

static void test_model_adamw_steps_reduce_loss_on_a_fixed_batch(void **state)
{
    fixture_t f;
    fixture_init(&f, tiny(), 2, 8, 21);
    size_t n = f.tab.total;
    float *g = malloc(n * sizeof(float)), *m1 = calloc(n, sizeof(float)),
          *m2 = calloc(n, sizeof(float));
    double first = 0, last = 0;
    for (int step = 1; step <= 40; step++) {
        last = cpu_loss_grad(&f, g, NULL) / (f.B * f.T);
        if (step == 1)
            first = last;
        ops_adamw(NULL, f.w, g, m1, m2, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, step);
    }
    assert_true(first > 3.0);        /* about ln(32) at init */
    assert_true(last < 0.5 * first); /* it memorises the batch */
    free(g);
    free(m1);
    free(m2);
    fixture_free(&f);
}

static void test_model_rejects_bad_piece_ranges_and_lengths(void **state)
{
    model_config_t c = tiny();
    float w[1], g[1];
    assert_null(model_new(&c, 2, 2, w, g, NULL));
    assert_null(model_new(&c, -1, 2, w, g, NULL));
    assert_null(model_new(&c, 0, c.n_layers + 3, w, g, NULL));
    model_t *m = model_new(&c, 1, 2, w, g, NULL);
    assert_non_null(m);
    assert_false(model_has_embed(m));
    assert_false(model_has_head(m));
    assert_null(model_acts_new(m, 1, c.max_seq_len + 1));
    model_destroy(&m);
    assert_null(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_reference_gradient_matches_finite_differences),
        cmocka_unit_test(test_model_cpu_matches_reference_tiny),
        cmocka_unit_test(test_model_cpu_matches_reference_wider),
        cmocka_unit_test(test_model_deferred_weight_gradients_are_bitwise_identical),
        cmocka_unit_test(test_model_split_into_pieces_matches_whole_bitwise),
        cmocka_unit_test(test_model_shard_io_takes_each_pieces_gradients_in_w_order),
        cmocka_unit_test(test_model_activation_checkpointing_is_bitwise_and_saves_memory),
        cmocka_unit_test(test_model_bits_identical_for_any_thread_count),
        cmocka_unit_test(test_model_adamw_steps_reduce_loss_on_a_fixed_batch),
        cmocka_unit_test(test_model_rejects_bad_piece_ranges_and_lengths),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
