/* The CUDA model (kernels/cuda/cuda_model.h) against the fp32 CPU model on the same weights
 * and batch: the loss and every weight gradient, for the whole model in one piece and split
 * into two pipeline stages with host hand-offs. bf16 activations make the GPU differ from the
 * CPU by bf16 rounding: the loss within 2% and each gradient tensor within 8% in relative L2
 * norm (a wrong equation is off by far more; a transposed or missing term by ~100%). Skipped
 * where there is no GPU. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/act_bytes.h"
#include "kernels/act_groups.h"
#include "kernels/cuda/cuda_model.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cpu/model.h"
#include "kernels/params.h"
#include "tests/testutil.h"

/* Under tests/cudasim (the CPU emulator `make test` runs this program on, with plain C++ in
 * place of the cuBLASLt products) the model and batch are smaller. */
#ifdef CUDASIM
#define SIM_OR(sim, gpu) (sim)
#else
#define SIM_OR(sim, gpu) (gpu)
#endif

#define LOSS_RTOL 2e-2
#define GRAD_RTOL 8e-2

static model_config_t config(void)
{
    model_config_t c;
    config_preset("tiny", &c);
    c.dim = 128, c.n_layers = SIM_OR(2, 3), c.n_heads = 2, c.n_kv_heads = 1, c.vocab_size = 256, c.multiple_of = 32;
    c.max_seq_len = 64;
    return c;
}

static void need_gpu(void)
{
    if (cuda_device_count() == 0) {
        print_message("no CUDA device: skipping (%s)\n", cuda_last_error());
        skip();
    }
}

#define CK(call)                                                                 \
    do {                                                                         \
        int rc_ = (call);                                                        \
        if (rc_)                                                                 \
            fail_msg("%s: %d: %s", #call, rc_, cuda_model_last_error());         \
    } while (0)

/* GPU run over the given piece splits [cuts[s], cuts[s+1]); returns the loss, grads in g. With
 * kept the head's loss is kept and taken after the backward (cuda_model_loss_take), a forward
 * dropped before (cuda_model_loss_drop) and one whose loss was wanted at once after it (the
 * take counts neither). */
static double gpu_run_as(const model_config_t *c, const param_table_t *tab, const float *w, float *g, const int *cuts,
                         int stages, const int32_t *tok, const int32_t *tgt, int B, int T, int kept)
{
    int N = B * T, D = c->dim;
    cuda_model_t *m[4];
    cuda_model_acts_t *a[4];
    size_t b[4], e[4];
    float *x = malloc((size_t)N * D * sizeof(float)), *dx = malloc((size_t)N * D * sizeof(float));
    for (int s = 0; s < stages; s++) {
        params_piece_range(tab, cuts[s], cuts[s + 1], &b[s], &e[s]);
        CK(cuda_model_new(&m[s], c, cuts[s], cuts[s + 1]));
        CK(cuda_model_set_weights(m[s], w + b[s]));
        CK(cuda_model_acts_new(&a[s], m[s], B, T));
    }
    double loss = 0, now = -1;
    for (int s = 0; s < stages; s++) {
        const int32_t *tk = s == 0 ? tok : NULL, *tg = s == stages - 1 ? tgt : NULL;
        if (kept && tg) { /* one kept and dropped first: the take must not count it */
            CK(cuda_model_forward(m[s], a[s], tk, s == 0 ? NULL : x, tg, 1.0f / N, NULL, NULL));
            cuda_model_loss_drop(m[s]);
        }
        CK(cuda_model_forward(m[s], a[s], tk, s == 0 ? NULL : x, tg, 1.0f / N, s == stages - 1 ? NULL : x,
                              kept && tg ? NULL : &loss));
        if (kept && tg) /* the same again, its loss wanted now: the kept one stays for the take */
            CK(cuda_model_forward(m[s], a[s], tk, s == 0 ? NULL : x, tg, 1.0f / N, NULL, &now));
    }
    for (int s = stages - 1; s >= 0; s--) {
        CK(cuda_model_backward_b(m[s], a[s], s == stages - 1 ? NULL : dx, s == 0 ? NULL : dx));
        CK(cuda_model_backward_w(m[s], a[s]));
        CK(cuda_model_take_grads(m[s], g + b[s]));
    }
    if (kept) {
        CK(cuda_model_loss_take(m[stages - 1], &loss));
        assert_memory_equal(&loss, &now, sizeof(double));
        double none = -1;
        CK(cuda_model_loss_take(m[stages - 1], &none));
        assert_true(none == 0.0);
    }
    for (int s = 0; s < stages; s++) {
        cuda_model_acts_destroy(&a[s]);
        cuda_model_destroy(&m[s]);
    }
    free(x), free(dx);
    return loss / N;
}

static double gpu_run(const model_config_t *c, const param_table_t *tab, const float *w, float *g, const int *cuts,
                      int stages, const int32_t *tok, const int32_t *tgt, int B, int T)
{
    return gpu_run_as(c, tab, w, g, cuts, stages, tok, tgt, B, T, 0);
}

static void compare_grads(const param_table_t *tab, const float *got, const float *want)
{
    for (int i = 0; i < tab->n; i++) {
        const param_info_t *p = &tab->t[i];
        double d = 0, n = 0;
        for (size_t j = 0; j < p->numel; j++) {
            double x = got[p->offset + j], y = want[p->offset + j];
            d += (x - y) * (x - y);
            n += y * y;
        }
        double rel = sqrt(d) / (sqrt(n) + 1e-30);
        if (!(rel <= GRAD_RTOL))
            fail_msg("%s: gradient off by %.3g in relative L2 norm (|cpu| %.3g)", p->name, rel, sqrt(n));
    }
}

enum { REF_B = SIM_OR(1, 2), REF_T = SIM_OR(24, 64) };

/* The CPU model's loss over a [REF_B, REF_T] batch drawn from seed, its gradients in gc; the
 * weights w (initialised), tokens and targets as it used them. */
static double cpu_reference(const model_config_t *c, const param_table_t *tab, uint64_t seed, float *w, float *gc,
                            int32_t *tok, int32_t *tgt)
{
    enum { B = REF_B, T = REF_T };
    params_init(tab, c, 3, w, 0, tab->total);
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)(tu_next(&seed) % 256), tgt[i] = (int32_t)(tu_next(&seed) % 256);
    model_t *cm = model_new(c, 0, c->n_layers + 2, w, gc, NULL);
    model_acts_t *ca = model_acts_new(cm, B, T);
    double want = model_forward(cm, ca, tok, NULL, tgt, 1.0f / (B * T), NULL) / (B * T);
    model_backward_b(cm, ca, NULL, NULL);
    model_backward_w(cm, ca);
    model_acts_destroy(&ca);
    model_destroy(&cm);
    return want;
}

/* The GPU model against the CPU's (cpu_reference, seed), whole and in two stages (embedding +
 * layer 0 | the rest), the head's loss also kept and read once after the backward. */
static void check_against_cpu(const model_config_t *c, uint64_t seed)
{
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, c), 0);
    float *w = malloc(tab.total * sizeof(float)), *gc = calloc(tab.total, sizeof(float));
    float *gg = calloc(tab.total, sizeof(float));
    enum { B = REF_B, T = REF_T };
    int32_t tok[B * T], tgt[B * T];
    double want = cpu_reference(c, &tab, seed, w, gc, tok, tgt);
    int whole[2] = {0, c->n_layers + 2}, split[3] = {0, 2, c->n_layers + 2};
    double got = gpu_run(c, &tab, w, gg, whole, 1, tok, tgt, B, T);
    print_message("loss (head in chunks of %d rows): cpu %.6f, gpu %.6f\n", act_head_rows(c, B * T), want, got);
    assert_true(fabs(got - want) <= LOSS_RTOL * want);
    compare_grads(&tab, gg, gc);
    /* the head's loss kept and read once after the backward (no wait in the forward): the same bits */
    memset(gg, 0, tab.total * sizeof(float));
    double kept = gpu_run_as(c, &tab, w, gg, whole, 1, tok, tgt, B, T, 1);
    assert_memory_equal(&kept, &got, sizeof(double));
    memset(gg, 0, tab.total * sizeof(float));
    double got2 = gpu_run(c, &tab, w, gg, split, 2, tok, tgt, B, T);
    assert_true(fabs(got2 - want) <= LOSS_RTOL * want);
    compare_grads(&tab, gg, gc);
    params_table_free(&tab);
    free(w), free(gc), free(gg);
}

static void test_cuda_model_matches_the_cpu_model_whole_and_split(void **state)
{
    need_gpu();
    model_config_t c = config();
    check_against_cpu(&c, 5);
}

/* The head makes its logits a chunk of rows at a time (cfg.head_rows; a last chunk shorter) and
 * runs its own backward in its forward: the loss and gradients still match the CPU model's, and
 * a microbatch's storage has no N x V logits (the chunk is the model's, in its work bytes). A
 * forward_only model (the evaluations) gives the same loss bit for bit, adds no gradient and
 * refuses a backward. */
static void test_cuda_model_head_in_chunks_and_forward_only(void **state)
{
    need_gpu();
    model_config_t c = config();
    c.head_rows = 7;
    check_against_cpu(&c, 11);
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, &c), 0);
    float *w = malloc(tab.total * sizeof(float)), *gc = calloc(tab.total, sizeof(float));
    float *gg = calloc(tab.total, sizeof(float));
    enum { B = REF_B, T = REF_T };
    int32_t tok[B * T], tgt[B * T];
    cpu_reference(&c, &tab, 11, w, gc, tok, tgt);
    /* the sizes: the plan's, and no logits in a microbatch's storage (a vocabulary twice as
     * large leaves it as it is; the chunk, here as large as the microbatch, grows) */
    model_act_size_t z, z1;
    assert_int_equal(model_act_bytes(&c, 0, c.n_layers + 2, B, T, MODEL_ACT_CUDA, &z), 0);
    assert_int_equal(z.head, ((size_t)7 * c.vocab_size * 2 + 255) / 256 * 256);
    model_config_t c1 = c;
    c1.head_rows = 0, c1.vocab_size = 2 * c.vocab_size;
    assert_int_equal(model_act_bytes(&c1, 0, c.n_layers + 2, B, T, MODEL_ACT_CUDA, &z1), 0);
    assert_int_equal(z1.head, ((size_t)B * T * c1.vocab_size * 2 + 255) / 256 * 256);
    assert_int_equal(z1.per_mb, z.per_mb);
    cuda_model_t *m;
    cuda_model_acts_t *a;
    CK(cuda_model_new(&m, &c, 0, c.n_layers + 2));
    CK(cuda_model_set_weights(m, w));
    CK(cuda_model_acts_new(&a, m, B, T));
    assert_int_equal(cuda_model_acts_bytes(a), z.per_mb);
    assert_int_equal(cuda_model_work_bytes(m), z.units_fused * z.unit + z.unit_b + z.units_g_fused * z.unit_g + z.head);
    double train = 0, only = 0;
    CK(cuda_model_forward(m, a, tok, NULL, tgt, 1.0f / (B * T), NULL, &train));
    cuda_model_acts_destroy(&a);
    cuda_model_destroy(&m);
    model_config_t fo = c;
    fo.forward_only = 1;
    CK(cuda_model_new(&m, &fo, 0, c.n_layers + 2));
    CK(cuda_model_set_weights(m, w));
    CK(cuda_model_acts_new(&a, m, B, T));
    CK(cuda_model_forward(m, a, tok, NULL, tgt, 1.0f / (B * T), NULL, &only));
    assert_memory_equal(&only, &train, sizeof(double));
    CK(cuda_model_take_grads(m, gg));
    for (size_t i = 0; i < tab.total; i++)
        if (gg[i] != 0.0f)
            fail_msg("forward_only added a gradient at %zu: %g", i, gg[i]);
    assert_int_equal(cuda_model_backward_b(m, a, NULL, NULL), -EINVAL);
    cuda_model_acts_destroy(&a);
    cuda_model_destroy(&m);
    params_table_free(&tab);
    free(w), free(gc), free(gg);
}

/* Parameter sharding (cuda_model_shard): a model made with a part [own_begin, own_end) holds only
 * that part (cuda_model_buffers), takes every piece's weights from io before its forward and
 * backward (here: pointers into a whole model's device weights), and gives each piece's
 * gradients in io's buffer, zeroed first, in W order, adding none into its own: the loss and
 * the gradients are the whole model's bit for bit (one microbatch). */
typedef struct {
    cuda_model_t *m, *full;         /* the sharded model; the one whose weights io lends */
    float *dev, *host, *sum;        /* io's device buffer, a host copy, the sum of what was given */
    size_t last_hi;                 /* the pieces come top down */
    int n;
    size_t want_lo;                 /* the next piece the last weights call announced (SIZE_MAX: none) */
    size_t last_w;                  /* the piece of the last weights call */
    int asked, hints;               /* weights calls, announcements kept */
} shard_test_t;

static int st_weights(void *arg, size_t lo, size_t hi, size_t next_lo, size_t next_hi, void **w)
{
    shard_test_t *t = arg;
    uint16_t *fw;
    float *fg;
    size_t b, e;
    if (t->want_lo != SIZE_MAX && lo != t->want_lo && lo != t->last_w) /* announced, or the same again */
        return -EPROTO;
    t->hints += t->want_lo != SIZE_MAX;
    t->want_lo = next_lo < next_hi ? next_lo : SIZE_MAX;
    t->last_w = lo;
    t->asked++;
    cuda_model_buffers(t->full, &fw, &fg, &b, &e);
    *w = fw + (lo - b);
    return 0;
}

static int st_take(void *arg, size_t lo, size_t hi, float **g)
{
    shard_test_t *t = arg;
    *g = t->dev;
    return cuda_copy_to_device(t->dev, t->host, (hi - lo) * sizeof(float)); /* garbage the model must zero */
}

static int st_give(void *arg, size_t lo, size_t hi)
{
    shard_test_t *t = arg;
    int rc = cuda_model_sync(t->m);
    if (rc || (rc = cuda_copy_to_host(t->host, t->dev, (hi - lo) * sizeof(float))))
        return rc;
    if (t->n++ && hi != t->last_hi)
        return -EPROTO;
    t->last_hi = lo;
    for (size_t i = lo; i < hi; i++)
        t->sum[i] += t->host[i - lo];
    for (size_t i = 0; i < hi - lo; i++)
        t->host[i] = 1e30f;
    return 0;
}

static void test_cuda_model_shard_io_matches_the_whole_model_bitwise(void **state)
{
    need_gpu();
    model_config_t c = config();
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, &c), 0);
    size_t n = tab.total;
    float *w = malloc(n * sizeof(float)), *g = calloc(n, sizeof(float));
    params_init(&tab, &c, 7, w, 0, n);
    enum { B = 1, T = SIM_OR(16, 64) };
    int32_t tok[B * T], tgt[B * T];
    uint64_t s = 9;
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)(tu_next(&s) % 256), tgt[i] = (int32_t)(tu_next(&s) % 256);
    int all = c.n_layers + 2;
    double want = gpu_run(&c, &tab, w, g, (int[]){0, all}, 1, tok, tgt, B, T);
    shard_test_t t = {.host = malloc(n * sizeof(float)), .sum = calloc(n, sizeof(float)), .want_lo = SIZE_MAX,
                      .last_w = SIZE_MAX};
    for (size_t i = 0; i < n; i++)
        t.host[i] = 1e30f;
    CK(cuda_alloc((void **)&t.dev, n * sizeof(float)));
    CK(cuda_model_new(&t.full, &c, 0, all));
    CK(cuda_model_set_weights(t.full, w));
    model_config_t sc = c;
    sc.own_begin = n / 3, sc.own_end = 2 * n / 3;
    CK(cuda_model_new(&t.m, &sc, 0, all));
    uint16_t *ow;
    float *og;
    size_t ob, oe;
    cuda_model_buffers(t.m, &ow, &og, &ob, &oe);
    assert_true(ob == n / 3 && oe == 2 * n / 3);
    shard_io_t io = {.weights = st_weights, .take = st_take, .give = st_give, .arg = &t};
    CK(cuda_model_shard(t.m, &io));
    cuda_model_acts_t *a;
    CK(cuda_model_acts_new(&a, t.m, B, T));
    double loss;
    CK(cuda_model_forward(t.m, a, tok, NULL, tgt, 1.0f / (B * T), NULL, &loss));
    CK(cuda_model_backward_b(t.m, a, NULL, NULL));
    CK(cuda_model_backward_w(t.m, a));
    assert_true(loss / (B * T) == want);
    assert_int_equal(t.n, all);
    assert_true(t.last_hi == 0);
    /* forward: every piece; backward: the head and the layers (the embedding's W needs none) */
    assert_int_equal(t.asked, all + all - 1);
    assert_int_equal(t.hints, all - 1 + all - 2); /* each announced the next, but the last of each pass */
    assert_memory_equal(t.sum, g, n * sizeof(float));
    float *own = malloc((oe - ob) * sizeof(float));
    CK(cuda_model_take_grads(t.m, own)); /* its own part: nothing added */
    for (size_t i = 0; i < oe - ob; i++)
        assert_true(own[i] == 0.0f);
    sc.own_begin = n, sc.own_end = n + 1; /* outside the range */
    cuda_model_t *bad;
    assert_int_equal(cuda_model_new(&bad, &sc, 0, all), -EINVAL);
    cuda_model_acts_destroy(&a);
    cuda_model_destroy(&t.m);
    cuda_model_destroy(&t.full);
    cuda_free(t.dev);
    params_table_free(&tab);
    free(w), free(g), free(t.host), free(t.sum), free(own);
}

/* Activation checkpointing on the GPU model: two stages, two microbatches, every forward
 * first; backwards fused (cuda_model_backward, W with B layer by layer) or held back (every B,
 * then the W's in microbatch order). Returns the loss sum, the gradients in g, one microbatch's
 * device bytes and the work sets' of both stages. */
static double ac_run(model_config_t c, const param_table_t *tab, const float *w, float *g, int fused,
                     const int32_t *tok, const int32_t *tgt, int B, int T, size_t *acts, size_t *work)
{
    enum { S = 2, M = 2 };
    int N = B * T, D = c.dim, cuts[S + 1] = {0, 2, c.n_layers + 2};
    cuda_model_t *m[S];
    cuda_model_acts_t *a[S][M];
    size_t b[S], e[S];
    float *x[M], *dx[M];
    *acts = *work = 0;
    for (int mb = 0; mb < M; mb++)
        x[mb] = malloc((size_t)N * D * sizeof(float)), dx[mb] = malloc((size_t)N * D * sizeof(float));
    for (int s = 0; s < S; s++) {
        params_piece_range(tab, cuts[s], cuts[s + 1], &b[s], &e[s]);
        CK(cuda_model_new(&m[s], &c, cuts[s], cuts[s + 1]));
        CK(cuda_model_set_weights(m[s], w + b[s]));
        for (int mb = 0; mb < M; mb++)
            CK(cuda_model_acts_new(&a[s][mb], m[s], B, T));
        model_act_size_t z;
        assert_int_equal(model_act_bytes(&c, cuts[s], cuts[s + 1], B, T, MODEL_ACT_CUDA, &z), 0);
        assert_int_equal(z.per_mb, cuda_model_acts_bytes(a[s][0])); /* the plan's figure is the model's */
        assert_int_equal(z.units_fused * z.unit + z.unit_b + z.units_g_fused * z.unit_g + z.head,
                         cuda_model_work_bytes(m[s])); /* made with the first acts */
        *acts += z.per_mb;
    }
    double loss = 0, l;
    for (int mb = 0; mb < M; mb++) {
        CK(cuda_model_forward(m[0], a[0][mb], tok + mb * N, NULL, NULL, 1.0f / (M * N), x[mb], &l));
        CK(cuda_model_forward(m[1], a[1][mb], NULL, x[mb], tgt, 1.0f / (M * N), NULL, &l));
        loss += l;
    }
    for (int mb = 0; mb < M; mb++) {
        CK((fused ? cuda_model_backward : cuda_model_backward_b)(m[1], a[1][mb], NULL, dx[mb]));
        CK((fused ? cuda_model_backward : cuda_model_backward_b)(m[0], a[0][mb], dx[mb], NULL));
    }
    for (int mb = 0; mb < M && !fused; mb++)
        for (int s = 0; s < S; s++)
            CK(cuda_model_backward_w(m[s], a[s][mb]));
    for (int s = 0; s < S; s++) {
        CK(cuda_model_take_grads(m[s], g + b[s]));
        *work += cuda_model_work_bytes(m[s]);
        for (int mb = 0; mb < M; mb++)
            cuda_model_acts_destroy(&a[s][mb]);
        cuda_model_destroy(&m[s]);
    }
    for (int mb = 0; mb < M; mb++)
        free(x[mb]), free(dx[mb]);
    return loss;
}

/* Every activation checkpointing mode gives mode none's loss and weight gradients bit for bit
 * (the same kernels on the same inputs), fused or with W held back, and a microbatch's device
 * storage shrinks by what the recomputed layers no longer keep; the gradients B keeps for W are
 * in work sets, one per layer and microbatch held back, two a stage at most with W fused. */
static void test_cuda_model_activation_checkpointing_is_bitwise_and_saves_memory(void **state)
{
    need_gpu();
    model_config_t c = config();
    c.n_layers = 2;
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, &c), 0);
    enum { B = 1, T = SIM_OR(8, 64), N = B * T };
    float *w = malloc(tab.total * sizeof(float)), *g0 = calloc(tab.total, sizeof(float));
    float *g = calloc(tab.total, sizeof(float));
    params_init(&tab, &c, 7, w, 0, tab.total);
    int32_t tok[2 * N], tgt[N];
    uint64_t s = 9;
    for (int i = 0; i < 2 * N; i++)
        tok[i] = (int32_t)(tu_next(&s) % 256);
    for (int i = 0; i < N; i++)
        tgt[i] = (int32_t)(tu_next(&s) % 256);
    size_t acts0, work0, acts, work;
    double l0 = ac_run(c, &tab, w, g0, 0, tok, tgt, B, T, &acts0, &work0);
    /* what a layer keeps besides its input in mode none (bf16 tensors, each a multiple of 256
     * bytes here, and fp32 r1, r2, lse, each rounded up to 256 bytes), what op keeps of it, and
     * the gradients B keeps for W (in work sets, not a microbatch's storage) */
#define R256(x) (((x) + 255) / 256 * 256)
    size_t D = c.dim, F = (size_t)config_ffn_hidden(&c), QD = D, KD = D / 2, H = c.n_heads;
    size_t rest = 2 * N * (3 * D + 2 * QD + 2 * KD + 3 * F) + 2 * R256(4 * N) + R256(4 * B * H * T);
    size_t ops = 2 * N * (2 * QD + 2 * KD + D + 2 * F) + R256(4 * B * H * T);
    size_t grad = 2 * N * (4 * D + QD + 2 * KD + 2 * F);
    size_t head = R256(2 * N * (size_t)c.vocab_size); /* the second stage's logits chunk: N rows here */
#undef R256
    assert_int_equal(work0, 2 * 2 * grad + head); /* W held back: each stage's one layer, two microbatches */
    struct { int mode, every, fused; size_t saved; } modes[] = {
        {CONFIG_AC_FULL, 0, 1, 2 * rest}, {CONFIG_AC_FULL, 0, 0, 2 * rest},
        {CONFIG_AC_SELECTIVE, 2, 0, rest}, {CONFIG_AC_SELECTIVE, 0, 1, 2 * (rest - ops)},
        {CONFIG_AC_NONE, 0, 1, 0},
    };
    for (int i = 0; i < 5; i++) {
        model_config_t cc = c;
        cc.ac_mode = modes[i].mode, cc.ac_every = modes[i].every;
        double l = ac_run(cc, &tab, w, g, modes[i].fused, tok, tgt, B, T, &acts, &work);
        print_message("mode %s %d%s: loss %.9g (none %.9g), %zu bytes a microbatch (none %zu), work sets %zu\n",
                      config_ac_mode_name(cc.ac_mode), cc.ac_every, modes[i].fused ? " fused" : "", l, l0, acts,
                      acts0, work);
        assert_true(l == l0);
        assert_memory_equal(g, g0, tab.total * sizeof(float));
        assert_int_equal(acts0 - acts, modes[i].saved);
        assert_true(work > 0);
        if (modes[i].mode == CONFIG_AC_NONE) /* W fused: one layer's gradients a stage alive */
            assert_int_equal(work, 2 * grad + head);
    }
    params_table_free(&tab);
    free(w), free(g0), free(g);
}

/* training.attention. On a GPU with cuDNN: cuDNN's attention (decided against attn.cu's at the first
 * forward) gives the loss and gradients within the CPU's tolerances of attn.cu's, and the same
 * bits on a second run. On the emulator, through tests/cudasim/cudnn_sim.cpp's stand-in: "cudnn"
 * without cuDNN is refused by name; auto with a "cuDNN" that agrees runs it for both directions,
 * and with one that disagrees or cannot plan its backward gives attn.cu's results bit for bit
 * (the first forward's too) and calls it no more; "cudnn" with one that disagrees fails, saying
 * so. */
#ifdef CUDASIM
extern long cudnn_sim_calls[2];

static void attention_problem(const model_config_t *c, param_table_t *tab, float **w, int32_t *tok, int32_t *tgt, int n)
{
    assert_int_equal(params_table_init(tab, c), 0);
    *w = malloc(tab->total * sizeof(float));
    params_init(tab, c, 3, *w, 0, tab->total);
    uint64_t s = 9;
    for (int i = 0; i < n; i++)
        tok[i] = (int32_t)(tu_next(&s) % 256), tgt[i] = (int32_t)(tu_next(&s) % 256);
}
#endif

static void test_cuda_model_attention_choice(void **state)
{
    model_config_t c = config();
    enum { B = SIM_OR(1, 2), T = SIM_OR(24, 64) };
    int32_t tok[B * T], tgt[B * T];
    int whole[2] = {0, c.n_layers + 2};
#ifdef CUDASIM
    unsetenv("CTITAN_SIM_CUDNN");
    c.attn = CONFIG_ATTN_CUDNN;
    cuda_model_t *m = NULL;
    assert_int_equal(cuda_model_new(&m, &c, 0, c.n_layers + 2), -ENOSYS);
    assert_null(m);
    assert_non_null(strstr(cuda_model_last_error(), "emulator"));

    param_table_t tab;
    float *w;
    attention_problem(&c, &tab, &w, tok, tgt, B * T);
    float *g_own = calloc(tab.total, sizeof(float)), *g = calloc(tab.total, sizeof(float));
    c.attn = CONFIG_ATTN_OWN;
    double own = gpu_run(&c, &tab, w, g_own, whole, 1, tok, tgt, B, T);
    static const struct { const char *mode; int runs; } cases[] = {{"same", 1}, {"wrong", 0}, {"nobwd", 0}};
    for (int i = 0; i < 3; i++) {
        setenv("CTITAN_SIM_CUDNN", cases[i].mode, 1);
        c.attn = CONFIG_ATTN_AUTO;
        memset(g, 0, tab.total * sizeof(float));
        long before[2] = {cudnn_sim_calls[0], cudnn_sim_calls[1]};
        double got = gpu_run(&c, &tab, w, g, whole, 1, tok, tgt, B, T);
        print_message("%s: forwards %ld, backwards %ld through \"cuDNN\"\n", cases[i].mode,
                      cudnn_sim_calls[0] - before[0], cudnn_sim_calls[1] - before[1]);
        assert_memory_equal(&got, &own, sizeof(double));
        assert_memory_equal(g, g_own, tab.total * sizeof(float));
        /* the decision's own calls, then every layer's (or none) */
        long layers = c.n_layers;
        assert_int_equal(cudnn_sim_calls[0] - before[0], cases[i].runs ? layers : 1);
        assert_int_equal(cudnn_sim_calls[1] - before[1], cases[i].runs ? layers + 1 : strcmp(cases[i].mode, "wrong") == 0);
    }
    setenv("CTITAN_SIM_CUDNN", "wrong", 1);
    c.attn = CONFIG_ATTN_CUDNN;
    cuda_model_t *mm = NULL;
    cuda_model_acts_t *a = NULL;
    assert_int_equal(cuda_model_new(&mm, &c, 0, c.n_layers + 2), 0);
    assert_int_equal(cuda_model_set_weights(mm, w), 0);
    assert_int_equal(cuda_model_acts_new(&a, mm, B, T), 0);
    double loss = 0;
    assert_int_equal(cuda_model_forward(mm, a, tok, NULL, tgt, 1.0f / (B * T), NULL, &loss), -EIO);
    assert_non_null(strstr(cuda_model_last_error(), "is not ctitan's"));
    cuda_model_acts_destroy(&a);
    cuda_model_destroy(&mm);
    unsetenv("CTITAN_SIM_CUDNN");
    params_table_free(&tab);
    free(w), free(g_own), free(g);
#else
    need_gpu();
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, &c), 0);
    float *w = malloc(tab.total * sizeof(float)), *g_own = calloc(tab.total, sizeof(float));
    float *g_cudnn = calloc(tab.total, sizeof(float)), *g_again = calloc(tab.total, sizeof(float));
    params_init(&tab, &c, 3, w, 0, tab.total);
    uint64_t s = 9;
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)(tu_next(&s) % 256), tgt[i] = (int32_t)(tu_next(&s) % 256);
    c.attn = CONFIG_ATTN_OWN;
    double own = gpu_run(&c, &tab, w, g_own, whole, 1, tok, tgt, B, T);
    c.attn = CONFIG_ATTN_CUDNN;
    cuda_model_t *probe = NULL;
    int rc = cuda_model_new(&probe, &c, 0, c.n_layers + 2);
    cuda_model_destroy(&probe);
    if (rc) {
        print_message("cuDNN not usable (%s): skipping\n", cuda_model_last_error());
        params_table_free(&tab);
        free(w), free(g_own), free(g_cudnn), free(g_again);
        skip();
    }
    double cud = gpu_run(&c, &tab, w, g_cudnn, whole, 1, tok, tgt, B, T);
    double again = gpu_run(&c, &tab, w, g_again, whole, 1, tok, tgt, B, T);
    print_message("loss: attn.cu %.6f, cuDNN %.6f\n", own, cud);
    assert_true(fabs(cud - own) <= LOSS_RTOL * own);
    compare_grads(&tab, g_cudnn, g_own);
    assert_memory_equal(&again, &cud, sizeof(double));
    assert_memory_equal(g_again, g_cudnn, tab.total * sizeof(float));
    params_table_free(&tab);
    free(w), free(g_own), free(g_cudnn), free(g_again);
#endif
}

static void test_cuda_model_refuses_unsupported_shapes(void **state)
{
    /* checked before any CUDA call: runs without a GPU too */
    model_config_t c = config();
    c.n_heads = 16, c.n_kv_heads = 16; /* head dimension 8 */
    cuda_model_t *m = NULL;
    assert_int_equal(cuda_model_new(&m, &c, 0, c.n_layers + 2), -22);
    assert_null(m);
    assert_non_null(strstr(cuda_model_last_error(), "head dimension 8"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_model_matches_the_cpu_model_whole_and_split),
        cmocka_unit_test(test_cuda_model_head_in_chunks_and_forward_only),
        cmocka_unit_test(test_cuda_model_activation_checkpointing_is_bitwise_and_saves_memory),
        cmocka_unit_test(test_cuda_model_shard_io_matches_the_whole_model_bitwise),
        cmocka_unit_test(test_cuda_model_attention_choice),
        cmocka_unit_test(test_cuda_model_refuses_unsupported_shapes),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
