/* GPU fused attention (kernels/cuda/attn.cu) against the double reference (kernels/ref/ref_attn.c)
 * on bf16-rounded inputs, the causal property, determinism and argument checks; the GPU tests
 * are skipped with a message where there is no GPU (the argument checks run anyway). The same
 * reference checks and determinism for cuDNN's fused attention (kernels/cuda/cudnn_sdpa.c) on a
 * GPU where cuDNN 9 loads; not on the emulator (no cuDNN there). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_attn.h"
#include "kernels/cuda/cuda_ops.h"
#ifndef CUDASIM
#include "kernels/cuda/cudnn_sdpa.h"
#endif
#include "kernels/ref/ref_ops.h"
#include "tests/testutil.h"

/* Tolerances, atol + rtol*|ref|, per dtype of the compared output.
 * bf16 (out, dq, dk, dv): rounding the result to bf16 costs up to 2^-9 (~0.2%) relative, and the
 * kernels round P and dS to bf16 before their products (another ~2^-9 of each term, mostly
 * cancelling over the sum) and take delta = rowsum(dout * out) from the bf16 out. Values here
 * are O(0.1..3), so expected errors are a few 1e-3; 2e-2 leaves headroom, while a wrong index,
 * mask or head mapping moves results by O(0.1..1) (and the causal test below is bitwise).
 * fp32 (lse): scores are exact bf16 products summed in fp32; lse ~ 1..12 comes out within ~1e-5. */
#define BF16_ATOL 2e-2
#define BF16_RTOL 2e-2
#define LSE_ATOL 1e-3
#define LSE_RTOL 1e-5

/* Under tests/cudasim (the CPU emulator `make test` runs this program on: a fiber per CUDA
 * thread, thousands of times slower than a GPU) the larger cases are cut down and the
 * 4096-token one skipped. */
#ifdef CUDASIM
#define SIM_OR(sim, gpu) (sim)
#else
#define SIM_OR(sim, gpu) (gpu)
#endif

#define SKIP_WITHOUT_GPU()                                                                         \
    do {                                                                                           \
        if (cuda_device_count() == 0) {                                                            \
            print_message("no CUDA device (cuda_device_count() == 0): skipping\n");            \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0)                                                                              \
            fprintf(stderr, "%s: %d (%s)\n", #call, rc_, cuda_attn_last_error());                  \
        assert_int_equal(rc_, 0);                                                                  \
    } while (0)

static size_t compare_bf16(const char *what, const uint16_t *got, const double *ref, size_t n)
{
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = tu_bf16_to_f32(got[i]);
    size_t bad = tu_compare(what, f, ref, n, BF16_ATOL, BF16_RTOL);
    free(f);
    return bad;
}

/* One problem: inputs on host and device, the GPU's results copied back by case_run. */
typedef struct {
    int B, T, H, Hkv, hd;
    size_t nq, nk, nr;            /* elements of q/out/dq, of k/v/dk/dv, of lse */
    uint16_t *q, *k, *v, *dout;   /* inputs, bf16 */
    double *qd, *kd, *vd, *doutd; /* the same values in double */
    uint16_t *out, *dq, *dk, *dv; /* results */
    float *lse;
    void *g_q, *g_k, *g_v, *g_dout, *g_out, *g_dq, *g_dk, *g_dv, *g_lse, *g_delta;
} acase_t;

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    if (cuda_alloc(&p, bytes) != 0)
        fprintf(stderr, "cuda_alloc(%zu): %s\n", bytes, cuda_last_error());
    assert_non_null(p);
    return p;
}

/* q and k in [-2, 2) so that scores spread over a few units (peaked and flat rows both occur),
 * v and dout in [-1, 1). */
static void case_init(acase_t *c, int B, int T, int H, int Hkv, int hd, uint64_t seed)
{
    memset(c, 0, sizeof(*c));
    c->B = B, c->T = T, c->H = H, c->Hkv = Hkv, c->hd = hd;
    c->nq = (size_t)B * T * H * hd, c->nk = (size_t)B * T * Hkv * hd, c->nr = (size_t)B * H * T;
    c->q = malloc(c->nq * 2), c->dout = malloc(c->nq * 2), c->out = malloc(c->nq * 2);
    c->dq = malloc(c->nq * 2);
    c->k = malloc(c->nk * 2), c->v = malloc(c->nk * 2), c->dk = malloc(c->nk * 2);
    c->dv = malloc(c->nk * 2);
    c->qd = malloc(c->nq * 8), c->doutd = malloc(c->nq * 8);
    c->kd = malloc(c->nk * 8), c->vd = malloc(c->nk * 8);
    c->lse = malloc(c->nr * 4);
    tu_fill_bf16(c->q, c->qd, c->nq, seed, 2.0);
    tu_fill_bf16(c->k, c->kd, c->nk, seed + 1, 2.0);
    tu_fill_bf16(c->v, c->vd, c->nk, seed + 2, 1.0);
    tu_fill_bf16(c->dout, c->doutd, c->nq, seed + 3, 1.0);
    c->g_q = dev_alloc(c->nq * 2), c->g_dout = dev_alloc(c->nq * 2), c->g_out = dev_alloc(c->nq * 2);
    c->g_dq = dev_alloc(c->nq * 2);
    c->g_k = dev_alloc(c->nk * 2), c->g_v = dev_alloc(c->nk * 2), c->g_dk = dev_alloc(c->nk * 2);
    c->g_dv = dev_alloc(c->nk * 2);
    c->g_lse = dev_alloc(c->nr * 4), c->g_delta = dev_alloc(c->nr * 4);
    assert_int_equal(cuda_copy_to_device(c->g_q, c->q, c->nq * 2), 0);
    assert_int_equal(cuda_copy_to_device(c->g_dout, c->dout, c->nq * 2), 0);
    assert_int_equal(cuda_copy_to_device(c->g_k, c->k, c->nk * 2), 0);
    assert_int_equal(cuda_copy_to_device(c->g_v, c->v, c->nk * 2), 0);
}

static void case_upload_kv(acase_t *c)
{
    assert_int_equal(cuda_copy_to_device(c->g_k, c->k, c->nk * 2), 0);
    assert_int_equal(cuda_copy_to_device(c->g_v, c->v, c->nk * 2), 0);
}

#ifndef CUDASIM
/* Non-NULL: case_run runs cuDNN's attention instead of attn.cu's. */
static cudnn_sdpa_t *g_cudnn;
#define CHECK_CUDNN(call)                                                                          \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0)                                                                              \
            fprintf(stderr, "%s: %d (%s)\n", #call, rc_, cudnn_sdpa_error(g_cudnn));               \
        assert_int_equal(rc_, 0);                                                                  \
    } while (0)
#endif

/* Forward and backward on the default stream; the copies back wait for them. */
static void case_run(acase_t *c)
{
#ifndef CUDASIM
    if (g_cudnn) {
        CHECK_CUDNN(cudnn_sdpa_fwd(g_cudnn, c->g_out, c->g_lse, c->g_q, c->g_k, c->g_v, c->B, c->T, c->H,
                                   c->Hkv, c->hd, NULL));
        CHECK_CUDNN(cudnn_sdpa_bwd(g_cudnn, c->g_dq, c->g_dk, c->g_dv, c->g_delta, c->g_dout, c->g_q, c->g_k,
                                   c->g_v, c->g_out, c->g_lse, c->B, c->T, c->H, c->Hkv, c->hd, NULL));
    } else
#endif
    {
        CHECK_OK(cuda_attn_fwd(c->g_out, c->g_lse, c->g_q, c->g_k, c->g_v, c->B, c->T, c->H, c->Hkv,
                               c->hd, NULL));
        CHECK_OK(cuda_attn_bwd(c->g_dq, c->g_dk, c->g_dv, c->g_delta, c->g_dout, c->g_q, c->g_k,
                               c->g_v, c->g_out, c->g_lse, c->B, c->T, c->H, c->Hkv, c->hd, NULL));
    }
    int rc = cuda_copy_to_host(c->out, c->g_out, c->nq * 2);
    if (rc)
        fprintf(stderr, "after the kernels: %s\n", cuda_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(cuda_copy_to_host(c->lse, c->g_lse, c->nr * 4), 0);
    assert_int_equal(cuda_copy_to_host(c->dq, c->g_dq, c->nq * 2), 0);
    assert_int_equal(cuda_copy_to_host(c->dk, c->g_dk, c->nk * 2), 0);
    assert_int_equal(cuda_copy_to_host(c->dv, c->g_dv, c->nk * 2), 0);
}

static void case_free(acase_t *c)
{
    void *host[] = {c->q, c->k, c->v, c->dout, c->qd, c->kd, c->vd, c->doutd,
                    c->out, c->dq, c->dk, c->dv, c->lse};
    void *dev[] = {c->g_q, c->g_k, c->g_v, c->g_dout, c->g_out, c->g_dq, c->g_dk, c->g_dv,
                   c->g_lse, c->g_delta};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        free(host[i]);
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        cuda_free(dev[i]);
}

static const double *qrow(const acase_t *c, const double *x, int b, int t, int h)
{
    return x + (((size_t)b * c->T + t) * c->H + h) * c->hd;
}
static const double *krow(const acase_t *c, const double *x, int b, int t, int hk)
{
    return x + (((size_t)b * c->T + t) * c->Hkv + hk) * c->hd;
}
static double dot(const double *a, const double *b, int n)
{
    double s = 0;
    for (int d = 0; d < n; d++)
        s += a[d] * b[d];
    return s;
}

/* Attention of one query row directly in double: o[hd] and the returned log-sum-exp; s is
 * scratch of T doubles. */
static double row_fwd(const acase_t *c, int b, int h, int i, double *o, double *s)
{
    int hk = h / (c->H / c->Hkv), hd = c->hd;
    double scale = 1.0 / sqrt((double)hd), mx = -INFINITY, sum = 0;
    const double *qi = qrow(c, c->qd, b, i, h);
    for (int j = 0; j <= i; j++) {
        s[j] = dot(qi, krow(c, c->kd, b, j, hk), hd) * scale;
        mx = fmax(mx, s[j]);
    }
    memset(o, 0, hd * sizeof(double));
    for (int j = 0; j <= i; j++) {
        double p = exp(s[j] - mx);
        const double *vj = krow(c, c->vd, b, j, hk);
        sum += p;
        for (int d = 0; d < hd; d++)
            o[d] += p * vj[d];
    }
    for (int d = 0; d < hd; d++)
        o[d] /= sum;
    return mx + log(sum);
}

/* The GPU's forward and backward against ref_attn_fwd / ref_attn_bwd in full. */
static void check_against_reference(int B, int T, int H, int Hkv, int hd, uint64_t seed)
{
    acase_t c;
    case_init(&c, B, T, H, Hkv, hd, seed);
    case_run(&c);

    double *y = malloc(c.nq * 8), *probs = malloc((size_t)B * H * T * T * 8);
    double *lse = malloc(c.nr * 8), *o = malloc(hd * 8), *s = malloc(T * 8);
    ref_attn_fwd(y, probs, c.qd, c.kd, c.vd, B, T, H, Hkv, hd);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++)
                lse[((size_t)b * H + h) * T + i] = row_fwd(&c, b, h, i, o, s);
    assert_int_equal(compare_bf16("out", c.out, y, c.nq), 0);
    assert_int_equal(tu_compare("lse", c.lse, lse, c.nr, LSE_ATOL, LSE_RTOL), 0);

    double *dq = malloc(c.nq * 8), *dk = malloc(c.nk * 8), *dv = malloc(c.nk * 8);
    ref_attn_bwd(dq, dk, dv, c.doutd, probs, c.qd, c.kd, c.vd, B, T, H, Hkv, hd);
    assert_int_equal(compare_bf16("dq", c.dq, dq, c.nq), 0);
    assert_int_equal(compare_bf16("dk", c.dk, dk, c.nk), 0);
    assert_int_equal(compare_bf16("dv", c.dv, dv, c.nk), 0);

    free(y), free(probs), free(lse), free(o), free(s), free(dq), free(dk), free(dv);
    case_free(&c);
}

static void test_cuda_attn_matches_reference_gqa_ragged_tile(void **state)
{
    SKIP_WITHOUT_GPU();
    check_against_reference(2, 100, 4, 2, 64, 11); /* T not a multiple of the 64-row tiles */
}

static void test_cuda_attn_matches_reference_small_heads(void **state)
{
    SKIP_WITHOUT_GPU();
    check_against_reference(2, 70, 4, 2, 16, 33); /* debugmodel's head dimension */
    check_against_reference(1, 90, 4, 4, 32, 44);
}

static void test_cuda_attn_matches_reference_hd128(void **state)
{
    SKIP_WITHOUT_GPU();
    check_against_reference(1, SIM_OR(65, 257), SIM_OR(2, 8), SIM_OR(2, 8), 128, 22); /* one row into the next tile */
}

/* The edges of the kernels' tiling (64-row query and key tiles; the dK/dV loop steps over 64
 * query rows, 32 at hd 128): one row, T inside one tile, T a multiple of the tiles, partial
 * 32-row steps, and T long enough that some steps need no mask at all. */
static void test_cuda_attn_matches_reference_tile_edges(void **state)
{
    SKIP_WITHOUT_GPU();
    check_against_reference(1, 1, 2, 1, 64, 61);   /* a single row: lse is its one score */
    check_against_reference(2, 5, 2, 2, 16, 62);   /* T far inside one tile, batch 2 */
    check_against_reference(1, 128, 4, 1, 16, 63); /* two whole tiles, 4 heads on one kv head */
    check_against_reference(1, 40, 2, 1, 128, 64); /* one partial tile; dK/dV steps 32 + 8 rows */
    check_against_reference(1, 160, 2, 1, 32, 65); /* unmasked dK/dV steps (q0 >= 64, < T) */
    check_against_reference(1, SIM_OR(130, 300), 2, 1, 128, 66); /* the same at hd 128 */
}

/* T = 4096 (1024 on the emulator): the reference's T x T probabilities would be 268 MB and
 * minutes of work, so the test
 * computes every row's output and lse directly in double (one pass, ~2 GFLOP), and dq, dk, dv
 * for a sample of rows at tile edges, from the softmax definitions:
 *   dq_i = scale sum_{j<=i} P_ij (dout_i.v_j - D_i) k_j,     D_i = dout_i . o_i
 *   dk_j = scale sum_{h in group} sum_{i>=j} P_ij (dout_i.v_j - D_i) q_i
 *   dv_j = sum_{h in group} sum_{i>=j} P_ij dout_i. */
static void test_cuda_attn_long_sequence_matches_direct_rows(void **state)
{
    SKIP_WITHOUT_GPU();
    /* 4096 on a GPU; the emulator (make test, twice with the sanitizers) takes 1024: 16 tiles of
     * rows, a quarter of the 4096's sum lengths, a sixteenth of its time */
    const int B = 1, T = SIM_OR(1024, 4096), H = 2, Hkv = 1, hd = 64, group = H / Hkv;
    const double scale = 1.0 / sqrt((double)hd);
    acase_t c;
    case_init(&c, B, T, H, Hkv, hd, 33);
    case_run(&c);

    double *o = malloc(c.nq * 8), *lse = malloc(c.nr * 8), *D = malloc(c.nr * 8);
    double *s = malloc(T * 8);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < T; i++) {
            double *oi = o + ((size_t)i * H + h) * hd;
            lse[(size_t)h * T + i] = row_fwd(&c, 0, h, i, oi, s);
            D[(size_t)h * T + i] = dot(qrow(&c, c.doutd, 0, i, h), oi, hd);
        }
    assert_int_equal(compare_bf16("out", c.out, o, c.nq), 0);
    assert_int_equal(tu_compare("lse", c.lse, lse, c.nr, LSE_ATOL, LSE_RTOL), 0);

#ifdef CUDASIM
    static const int rows[] = {0, 1, 63, 64, 65, 127, 128, 500, 960, 1000, 1023};
#else
    static const int rows[] = {0, 1, 63, 64, 65, 127, 128, 1000, 2047, 2048, 3071, 4032, 4095};
#endif
    enum { NS = sizeof(rows) / sizeof(rows[0]) };
    uint16_t *got = malloc((size_t)NS * H * hd * 2);
    double *want = calloc((size_t)NS * H * hd, 8);
    for (int n = 0; n < NS; n++) /* dq of row i, every head */
        for (int h = 0; h < H; h++) {
            int i = rows[n];
            const double *qi = qrow(&c, c.qd, 0, i, h), *di = qrow(&c, c.doutd, 0, i, h);
            double *w = want + ((size_t)n * H + h) * hd;
            for (int j = 0; j <= i; j++) {
                const double *kj = krow(&c, c.kd, 0, j, h / group), *vj = krow(&c, c.vd, 0, j, h / group);
                double p = exp(dot(qi, kj, hd) * scale - lse[(size_t)h * T + i]);
                double ds = p * (dot(di, vj, hd) - D[(size_t)h * T + i]) * scale;
                for (int d = 0; d < hd; d++)
                    w[d] += ds * kj[d];
            }
            memcpy(got + ((size_t)n * H + h) * hd, c.dq + ((size_t)i * H + h) * hd, hd * 2);
        }
    assert_int_equal(compare_bf16("dq (sampled rows)", got, want, (size_t)NS * H * hd), 0);

    uint16_t *gotk = malloc((size_t)NS * hd * 2), *gotv = malloc((size_t)NS * hd * 2);
    double *wk = calloc((size_t)NS * hd, 8), *wv = calloc((size_t)NS * hd, 8);
    for (int n = 0; n < NS; n++) { /* dk, dv of key row j (Hkv = 1) */
        int j = rows[n];
        const double *kj = krow(&c, c.kd, 0, j, 0), *vj = krow(&c, c.vd, 0, j, 0);
        for (int h = 0; h < H; h++)
            for (int i = j; i < T; i++) {
                const double *qi = qrow(&c, c.qd, 0, i, h), *di = qrow(&c, c.doutd, 0, i, h);
                double p = exp(dot(qi, kj, hd) * scale - lse[(size_t)h * T + i]);
                double ds = p * (dot(di, vj, hd) - D[(size_t)h * T + i]) * scale;
                for (int d = 0; d < hd; d++) {
                    wk[(size_t)n * hd + d] += ds * qi[d];
                    wv[(size_t)n * hd + d] += p * di[d];
                }
            }
        memcpy(gotk + (size_t)n * hd, c.dk + (size_t)j * hd, hd * 2);
        memcpy(gotv + (size_t)n * hd, c.dv + (size_t)j * hd, hd * 2);
    }
    assert_int_equal(compare_bf16("dk (sampled rows)", gotk, wk, (size_t)NS * hd), 0);
    assert_int_equal(compare_bf16("dv (sampled rows)", gotv, wv, (size_t)NS * hd), 0);

    free(o), free(lse), free(D), free(s), free(got), free(want);
    free(gotk), free(gotv), free(wk), free(wv);
    case_free(&c);
}

/* Keys and values after position t0 change; out, lse and dq of rows <= t0 keep every bit (the
 * masked probabilities are exact zeros), and later rows do change. t0 = 37 falls inside the
 * first 64-key tile, t0 = 69 inside the second. */
static void test_cuda_attn_is_causal(void **state)
{
    SKIP_WITHOUT_GPU();
    const int B = 2, T = 100, H = 4, Hkv = 2, hd = 64;
    acase_t c;
    case_init(&c, B, T, H, Hkv, hd, 44);
    case_run(&c);
    uint16_t *out0 = malloc(c.nq * 2), *dq0 = malloc(c.nq * 2);
    uint16_t *k0 = malloc(c.nk * 2), *v0 = malloc(c.nk * 2);
    float *lse0 = malloc(c.nr * 4);
    memcpy(out0, c.out, c.nq * 2), memcpy(dq0, c.dq, c.nq * 2), memcpy(lse0, c.lse, c.nr * 4);
    memcpy(k0, c.k, c.nk * 2), memcpy(v0, c.v, c.nk * 2);

    static const int cut[] = {37, 69};
    for (int n = 0; n < 2; n++) {
        int t0 = cut[n];
        uint64_t seed = 500 + n;
        memcpy(c.k, k0, c.nk * 2), memcpy(c.v, v0, c.nk * 2);
        for (int b = 0; b < B; b++)
            for (int t = t0 + 1; t < T; t++)
                for (size_t e = 0; e < (size_t)Hkv * hd; e++) {
                    size_t at = ((size_t)b * T + t) * Hkv * hd + e;
                    c.k[at] = tu_f32_to_bf16((float)tu_uniform(&seed, 2.0));
                    c.v[at] = tu_f32_to_bf16((float)tu_uniform(&seed, 1.0));
                }
        case_upload_kv(&c);
        case_run(&c);
        int later_changed = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                size_t row = ((size_t)b * T + t) * H * hd;
                int same = memcmp(c.out + row, out0 + row, (size_t)H * hd * 2) == 0;
                if (t <= t0) {
                    assert_true(same);
                    assert_memory_equal(c.dq + row, dq0 + row, (size_t)H * hd * 2);
                    for (int h = 0; h < H; h++) {
                        size_t r = ((size_t)b * H + h) * T + t;
                        assert_memory_equal(&c.lse[r], &lse0[r], 4);
                    }
                } else if (!same) {
                    later_changed = 1;
                }
            }
        assert_true(later_changed);
    }
    free(out0), free(dq0), free(k0), free(v0), free(lse0);
    case_free(&c);
}

/* dk and dv sum over query tiles and grouped heads in a fixed order, without atomics. */
/* The forward and backward run again `runs` times give the same bits (with case_run's kernels). */
static void check_deterministic(int B, int T, int H, int Hkv, int hd, uint64_t seed, int runs)
{
    acase_t c;
    case_init(&c, B, T, H, Hkv, hd, seed);
    case_run(&c);
    uint16_t *keep = malloc((2 * c.nq + 2 * c.nk) * 2);
    memcpy(keep, c.out, c.nq * 2), memcpy(keep + c.nq, c.dq, c.nq * 2);
    memcpy(keep + 2 * c.nq, c.dk, c.nk * 2), memcpy(keep + 2 * c.nq + c.nk, c.dv, c.nk * 2);
    for (int r = 0; r < runs; r++) {
        case_run(&c);
        assert_memory_equal(keep, c.out, c.nq * 2);
        assert_memory_equal(keep + c.nq, c.dq, c.nq * 2);
        assert_memory_equal(keep + 2 * c.nq, c.dk, c.nk * 2);
        assert_memory_equal(keep + 2 * c.nq + c.nk, c.dv, c.nk * 2);
    }
    free(keep);
    case_free(&c);
}

static void test_cuda_attn_is_deterministic(void **state)
{
    SKIP_WITHOUT_GPU();
    check_deterministic(SIM_OR(1, 2), SIM_OR(130, 300), SIM_OR(2, 4), 1, 64, 55, 1);
}

/* cuDNN's attention: the reference checks above on the model's head dimensions (64, 128: the
 * ~160M's and ~1B's; 16 and 32, the demo's, where cuDNN plans them: else the model runs attn.cu's),
 * grouped-query and ragged sequences, and the same bits twice. */
#ifndef CUDASIM
#define NEED_CUDNN()                                                                               \
    do {                                                                                           \
        SKIP_WITHOUT_GPU();                                                                        \
        char why_[512];                                                                            \
        if (cudnn_sdpa_open(&g_cudnn, why_, sizeof why_) != 0) {                                   \
            print_message("cuDNN not loadable (%s): skipping\n", why_);                           \
            skip();                                                                                \
        }                                                                                          \
        print_message("cuDNN %ld\n", cudnn_sdpa_version(g_cudnn));                                \
    } while (0)

/* A failed assertion leaves the next tests on attn.cu's kernels. */
static int cudnn_teardown(void **state)
{
    cudnn_sdpa_close(&g_cudnn);
    return 0;
}

static void test_cudnn_attn_matches_reference(void **state)
{
    NEED_CUDNN();
    check_against_reference(2, 100, 4, 2, 64, 11);
    check_against_reference(1, 257, 8, 8, 128, 22);
    check_against_reference(1, 300, 4, 1, 128, 66);
    check_against_reference(2, 64, 16, 8, 128, 67); /* the ~1B's heads */
    for (int hd = 16; hd <= 32; hd *= 2) {
        int rc = cudnn_sdpa_graph_check(g_cudnn, 0, 1, 64, 4, 2, hd);
        assert_int_equal(rc, 0);
        acase_t c;
        case_init(&c, 1, 70, 4, 2, hd, 33);
        rc = cudnn_sdpa_fwd(g_cudnn, c.g_out, c.g_lse, c.g_q, c.g_k, c.g_v, 1, 70, 4, 2, hd, NULL);
        case_free(&c);
        if (rc) {
            print_message("head dim %d: cuDNN plans nothing (%s); the model runs attn.cu's there\n", hd,
                          cudnn_sdpa_error(g_cudnn));
            continue;
        }
        check_against_reference(2, 70, 4, 2, hd, 33);
    }
    print_message("cuDNN attention workspace: %zu bytes\n", cudnn_sdpa_workspace_bytes(g_cudnn));
    /* this GPU as cuDNN describes it, for asking its heuristics on a machine without one
     * (tools/gpu_check.sh keeps the file) */
    const char *path = getenv("CTITAN_CUDNN_DEVICEPROP");
    char *json = NULL;
    if (path && path[0] && cudnn_sdpa_device_json(g_cudnn, &json) == 0) {
        FILE *f = fopen(path, "w");
        if (f) {
            fputs(json, f);
            fclose(f);
        }
        print_message("cuDNN device properties (%zu bytes) in %s\n", strlen(json), path);
    } else if (path && path[0]) {
        print_message("cuDNN device properties: %s\n", cudnn_sdpa_error(g_cudnn));
    }
    free(json);
}

static void test_cudnn_attn_is_deterministic(void **state)
{
    NEED_CUDNN();
    check_deterministic(2, 300, 8, 2, 128, 55, 3);
}
#endif

/* Argument checks come before any CUDA call, so this runs without a GPU too; the pointers are
 * host buffers that a kernel would never be given. */
static void test_cuda_attn_rejects_bad_arguments(void **state)
{
    static _Alignas(16) uint16_t buf[10][4096];
    static _Alignas(16) float f32[2][1024];
    uint16_t *o = buf[0], *q = buf[1], *k = buf[2], *v = buf[3], *d = buf[4];
    uint16_t *dq = buf[5], *dk = buf[6], *dv = buf[7];
    uint16_t *odd = (uint16_t *)((char *)buf[8] + 2);
    float *lse = f32[0], *delta = f32[1];
    /* valid would be: B=1 T=4 H=2 Hkv=1 hd=64 */
    assert_int_equal(cuda_attn_fwd(NULL, lse, q, k, v, 1, 4, 2, 1, 64, NULL), -EINVAL);
    assert_non_null(strstr(cuda_attn_last_error(), "cuda_attn_fwd"));
    assert_int_equal(cuda_attn_fwd(o, NULL, q, k, v, 1, 4, 2, 1, 64, NULL), -EINVAL);
    assert_int_equal(cuda_attn_fwd(o, lse, odd, k, v, 1, 4, 2, 1, 64, NULL), -EINVAL);
    assert_int_equal(cuda_attn_fwd(o, lse, q, k, v, 1, 4, 3, 2, 64, NULL), -EINVAL);
    assert_int_equal(cuda_attn_fwd(o, lse, q, k, v, 1, 4, 2, 1, 48, NULL), -EINVAL);
    assert_non_null(strstr(cuda_attn_last_error(), "head dim 48"));
    assert_int_equal(cuda_attn_fwd(o, lse, q, k, v, 1, 4, 2, 1, 96, NULL), -EINVAL);
    assert_int_equal(cuda_attn_fwd(o, lse, q, k, v, 1, 0, 2, 1, 64, NULL), -EINVAL);
    assert_int_equal(cuda_attn_fwd(o, lse, q, k, v, 0, 4, 2, 1, 64, NULL), -EINVAL);
    assert_int_equal(cuda_attn_fwd(o, lse, q, k, v, 1, 4, 2, 0, 64, NULL), -EINVAL);

    assert_int_equal(cuda_attn_bwd(dq, dk, dv, NULL, d, q, k, v, o, lse, 1, 4, 2, 1, 64, NULL),
                     -EINVAL);
    assert_non_null(strstr(cuda_attn_last_error(), "cuda_attn_bwd"));
    assert_int_equal(cuda_attn_bwd(dq, dk, odd, delta, d, q, k, v, o, lse, 1, 4, 2, 1, 64, NULL),
                     -EINVAL);
    assert_int_equal(cuda_attn_bwd(dq, dk, dv, delta, d, q, k, v, NULL, lse, 1, 4, 2, 1, 64, NULL),
                     -EINVAL);
    assert_int_equal(cuda_attn_bwd(dq, dk, dv, delta, d, q, k, v, o, lse, 1, 4, 4, 3, 64, NULL),
                     -EINVAL);
    assert_int_equal(cuda_attn_bwd(dq, dk, dv, delta, d, q, k, v, o, lse, 1, 4, 2, 1, 48, NULL),
                     -EINVAL);
    assert_int_equal(cuda_attn_bwd(dq, dk, dv, delta, d, q, k, v, o, lse, 1, -1, 2, 1, 64, NULL),
                     -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_attn_matches_reference_gqa_ragged_tile),
        cmocka_unit_test(test_cuda_attn_matches_reference_small_heads),
        cmocka_unit_test(test_cuda_attn_matches_reference_hd128),
        cmocka_unit_test(test_cuda_attn_matches_reference_tile_edges),
        cmocka_unit_test(test_cuda_attn_long_sequence_matches_direct_rows),
        cmocka_unit_test(test_cuda_attn_is_causal),
        cmocka_unit_test(test_cuda_attn_is_deterministic),
#ifndef CUDASIM
        cmocka_unit_test_teardown(test_cudnn_attn_matches_reference, cudnn_teardown),
        cmocka_unit_test_teardown(test_cudnn_attn_is_deterministic, cudnn_teardown),
#endif
        /* last: were a check missing, a kernel given host pointers could spoil the context */
        cmocka_unit_test(test_cuda_attn_rejects_bad_arguments),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
