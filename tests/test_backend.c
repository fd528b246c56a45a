/* The backend table (kernels/backend.h) as stages and optimizer shards use it: the CPU one
 * must give exactly the bits the CPU code computed before the table existed (the model of
 * model.h, the optimizer's plain loops: a sequential double sum per block, y += x, ops_adamw),
 * since every loss of a CPU job depends on them; backend_load picks and refuses; and the
 * CUDA plugin's table on the emulator agrees with the CPU's within bf16/float tolerances. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/backend.h"
#include "kernels/cpu/model.h"
#include "kernels/cuda_plugin.h"
#include "kernels/ops.h"
#include "tests/testutil.h"

#define N 3000     /* not a multiple of the block: a short last block */
#define BLOCK 1024

static float *filled(uint64_t seed, double scale)
{
    float *x = malloc(N * sizeof(float));
    assert_non_null(x);
    tu_fill(NULL, x, N, seed, scale);
    return x;
}

static void test_backend_load_picks_cpu_and_refuses_other_devices(void **state)
{
    char err[512];
    assert_ptr_equal(backend_load("cpu", err, sizeof(err)), backend_cpu());
    assert_string_equal(backend_cpu()->name, "cpu");
    assert_null(backend_load("tpu", err, sizeof(err)));
    assert_non_null(strstr(err, "device \"tpu\": expected \"cpu\" or \"cuda\""));
    setenv(CUDA_PLUGIN_ENV, "/nonexistent/libctitan_cuda.so", 1);
    assert_null(backend_load("cuda", err, sizeof(err)));
    assert_non_null(strstr(err, "cannot load the CUDA backend /nonexistent/libctitan_cuda.so"));
    unsetenv(CUDA_PLUGIN_ENV);
}

static void test_backend_cpu_vector_ops_are_the_plain_loops_bitwise(void **state)
{
    const backend_t *be = backend_cpu();
    void *s;
    assert_int_equal(be->stream_new(&s), 0);
    float *x = filled(1, 2.0), *y = filled(2, 3.0), *want = malloc(N * sizeof(float));
    memcpy(want, y, N * sizeof(float));
    for (size_t i = 0; i < N; i++)
        want[i] += x[i];
    assert_int_equal(be->f32_add(y, x, N, s), 0);
    assert_memory_equal(y, want, N * sizeof(float));

    /* block norms: within double rounding of a plain sum, and bit for bit the documented order
     * (element i of a block in lane (i / 4) % 32, each lane's in increasing i, then lane l += lane
     * l + o for o = 16, ..., 1), the CUDA warp's */
    double norm[3], ref[3], plain[3];
    for (size_t b = 0; b < 3; b++) {
        double lane[32] = {0};
        plain[b] = 0;
        for (size_t i = b * BLOCK; i < N && i < (b + 1) * BLOCK; i++) {
            lane[(i - b * BLOCK) / 4 % 32] += (double)y[i] * y[i];
            plain[b] += (double)y[i] * y[i];
        }
        for (int o = 16; o > 0; o /= 2)
            for (int l = 0; l < o; l++)
                lane[l] += lane[l + o];
        ref[b] = lane[0];
    }
    assert_int_equal(be->block_sumsq(norm, y, N, BLOCK, s), 0);
    assert_memory_equal(norm, ref, sizeof(ref));
    assert_int_equal(tu_compare_d("block norms", norm, plain, 3, 0, 1e-12), 0);
    assert_int_equal(be->block_sumsq(norm, y, N, 0, s), -EINVAL);

    float *w = filled(3, 0.5), *m = filled(4, 0.1), *v = filled(5, 0.1);
    float *w2 = malloc(N * sizeof(float)), *m2 = malloc(N * sizeof(float)), *v2 = malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++)
        v[i] = v2[i] = v[i] * v[i]; /* second moments are >= 0 */
    memcpy(w2, w, N * sizeof(float));
    memcpy(m2, m, N * sizeof(float));
    /* step 7 alone; step 8 with the publish in the same call: the new weights copied out (fp32
     * on the CPU), the gradient (a copy of y) read and then cleared */
    float *wout = malloc(N * sizeof(float)), *gy = malloc(N * sizeof(float));
    for (int step = 7; step <= 8; step++) {
        memcpy(gy, y, N * sizeof(float));
        int out = step == 8;
        ops_adamw(NULL, w2, y, m2, v2, N, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
        assert_int_equal(be->adamw(w, m, v, w, m, v, gy, 1.0f, NULL, N, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step,
                                   out ? wout : NULL, out ? gy : NULL, s), 0);
        assert_memory_equal(w, w2, N * sizeof(float));
        assert_memory_equal(m, m2, N * sizeof(float));
        assert_memory_equal(v, v2, N * sizeof(float));
        for (size_t i = 0; i < N; i++)
            assert_true(out ? gy[i] == 0.0f && wout[i] == w2[i] : gy[i] == y[i]);
    }
    free(wout), free(gy);

    float *dev;
    assert_int_equal(be->alloc((void **)&dev, N * sizeof(float)), 0);
    assert_int_equal(be->to_weights(dev, w, N, s), 0); /* fp32 weights on the CPU: a copy */
    assert_memory_equal(dev, w, N * sizeof(float));
    assert_int_equal(be->zero(dev, 10 * sizeof(float), s), 0);
    assert_true(dev[9] == 0.0f && dev[10] == w[10]);
    assert_int_equal(be->copy(dev, x, N * sizeof(float), s), 0);
    assert_int_equal(be->stream_sync(s), 0);
    assert_memory_equal(dev, x, N * sizeof(float));
    assert_int_equal(be->free(dev), 0);
    be->stream_free(s);
    int used = -1;
    assert_int_equal(be->dev_select(3, &used), 0);
    assert_int_equal(used, 0);
    free(x), free(y), free(want), free(w), free(m), free(v), free(w2), free(m2), free(v2);
}

/* The table's AdamW out of place (two banks of state, each step reading one and writing the
 * other) with the clip factor as gscale gives the bits of AdamW in place on a scaled copy of
 * the gradient, and leaves the bank it read and the gradient as they were; the outputs start as
 * NaN, so an element left unwritten shows. A size with short last blocks and tasks. */
static void test_backend_cpu_adamw_out_of_place_with_clip_is_scale_then_in_place_bitwise(void **state)
{
    const backend_t *be = backend_cpu();
    const size_t n = 16384 * 2 + 77, bytes = n * sizeof(float);
    float *w = malloc(bytes), *m = malloc(bytes), *v = malloc(bytes), *g = malloc(bytes), *saved = malloc(3 * bytes);
    float *scaled = malloc(bytes), *g_was = malloc(bytes);
    const float clip[] = {0.37f, 1.0f, 0.81f};
    float *bank[2][3];
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 3; j++)
            assert_non_null(bank[b][j] = malloc(bytes));
    assert_true(w && m && v && g && saved && scaled && g_was);
    tu_fill(NULL, w, n, 20, 0.5);
    tu_fill(NULL, m, n, 21, 0.1);
    tu_fill(NULL, v, n, 22, 0.1);
    for (size_t i = 0; i < n; i++) {
        v[i] *= v[i];
        for (int j = 0; j < 3; j++)
            bank[1][j][i] = NAN;
    }
    memcpy(bank[0][0], w, bytes), memcpy(bank[0][1], m, bytes), memcpy(bank[0][2], v, bytes);
    for (int step = 1; step <= 3; step++) {
        float *const *src = bank[(step - 1) % 2], *const *dst = bank[step % 2];
        tu_fill(NULL, g, n, 30 + step, 0.3);
        for (int j = 0; j < 3; j++)
            memcpy(saved + j * n, src[j], bytes);
        memcpy(scaled, g, bytes);
        memcpy(g_was, g, bytes);
        for (size_t i = 0; i < n; i++)
            scaled[i] *= clip[step - 1];
        assert_int_equal(be->adamw(w, m, v, w, m, v, scaled, 1.0f, NULL, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step, NULL,
                                   NULL, NULL), 0);
        assert_int_equal(be->adamw(dst[0], dst[1], dst[2], src[0], src[1], src[2], g, clip[step - 1], NULL, n, 3e-4f,
                                   0.9f, 0.95f, 1e-8f, 0.1f, step, NULL, NULL, NULL),
                         0);
        assert_memory_equal(g, g_was, bytes);
        assert_memory_equal(dst[0], w, bytes);
        assert_memory_equal(dst[1], m, bytes);
        assert_memory_equal(dst[2], v, bytes);
        for (int j = 0; j < 3; j++)
            assert_memory_equal(src[j], saved + j * n, bytes);
    }
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 3; j++)
            free(bank[b][j]);
    free(w), free(m), free(v), free(g), free(saved), free(scaled), free(g_was);
}

/* A two-piece split of the tiny model, run through the table and through model.h directly:
 * the same loss, hand-offs and gradients, bit for bit. */
static void test_backend_cpu_model_is_model_c_bitwise(void **state)
{
    char err[256];
    model_config_t cfg;
    config_preset("tiny", &cfg);
    assert_int_equal(config_validate(&cfg, err, sizeof(err)), 0);
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, &cfg), 0);
    size_t total = tab.total, cut_b, cut_e;
    int L = cfg.n_layers, B = 2, T = 8, D = cfg.dim;
    params_piece_range(&tab, 0, 2, &cut_b, &cut_e); /* stage 0: embedding and layer 0 */
    float *w = malloc(total * sizeof(float)), *g1 = calloc(total, sizeof(float)), *g2 = calloc(total, sizeof(float));
    params_init(&tab, &cfg, 5, w, 0, total);
    int32_t tok[16], tgt[16];
    uint64_t seed = 9;
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(tu_next(&seed) % (uint64_t)cfg.vocab_size);
        tgt[i] = (int32_t)(tu_next(&seed) % (uint64_t)cfg.vocab_size);
    }
    size_t hand = (size_t)B * T * D;
    float *x1 = malloc(hand * 4), *x2 = malloc(hand * 4), *d1 = malloc(hand * 4), *d2 = malloc(hand * 4);
    float dscale = 1.0f / (B * T);

    /* model.h directly */
    model_t *m0 = model_new(&cfg, 0, 2, w, g1, NULL), *m1 = model_new(&cfg, 2, L + 2, w + cut_e, g1 + cut_e, NULL);
    model_acts_t *a0 = model_acts_new(m0, B, T), *a1 = model_acts_new(m1, B, T);
    model_forward(m0, a0, tok, NULL, NULL, dscale, x1);
    double want = model_forward(m1, a1, NULL, x1, tgt, dscale, NULL);
    model_backward_b(m1, a1, NULL, d1);
    model_backward_w(m1, a1);
    model_backward_b(m0, a0, d1, NULL);
    model_backward_w(m0, a0);

    /* the table */
    const backend_t *be = backend_cpu();
    backend_model_t *b0, *b1;
    backend_acts_t *c0, *c1;
    assert_int_equal(be->model_new(&b0, &cfg, 0, 2, w, g2, 2), 0);
    assert_int_equal(be->model_new(&b1, &cfg, 2, L + 2, w + cut_e, g2 + cut_e, 1), 0);
    assert_int_equal(be->acts_new(&c0, b0, B, T), 0);
    assert_int_equal(be->acts_new(&c1, b1, B, T), 0);
    double got = 0, none = -1;
    assert_int_equal(be->step_begin(b0), 0);
    assert_int_equal(be->forward(b0, c0, tok, NULL, NULL, dscale, x2, &none), 0);
    assert_int_equal(be->forward(b1, c1, NULL, x2, tgt, dscale, NULL, &got), 0);
    assert_int_equal(be->backward_b(b1, c1, NULL, d2), 0);
    assert_int_equal(be->backward_w(b1, c1), 0);
    assert_int_equal(be->backward_b(b0, c0, d2, NULL), 0);
    assert_int_equal(be->backward_w(b0, c0), 0);
    assert_int_equal(be->step_end(b0), 0);
    assert_true(none == 0.0);
    assert_memory_equal(&got, &want, sizeof(double));
    assert_memory_equal(x2, x1, hand * 4);
    assert_memory_equal(d2, d1, hand * 4);
    assert_memory_equal(g2, g1, total * sizeof(float));
    /* the head's loss kept (loss NULL): loss_take adds the kept sums in forward order, then has
     * none; step_begin forgets what a step left */
    double kept = -1, sum = 0;
    assert_int_equal(be->step_begin(b1), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(be->forward(b1, c1, NULL, x2, tgt, dscale * (float)(i + 1), NULL, NULL), 0);
        sum += model_forward(m1, a1, NULL, x1, tgt, dscale * (float)(i + 1), NULL);
    }
    assert_int_equal(be->loss_take(b1, &kept), 0);
    assert_memory_equal(&kept, &sum, sizeof(double));
    assert_int_equal(be->loss_take(b1, &kept), 0);
    assert_true(kept == 0.0);
    assert_int_equal(be->forward(b1, c1, NULL, x2, tgt, dscale, NULL, NULL), 0);
    assert_int_equal(be->step_begin(b1), 0);
    assert_int_equal(be->loss_take(b1, &kept), 0);
    assert_true(kept == 0.0);

    void *bw;
    float *bg;
    size_t begin, end, mem = 0;
    be->model_buffers(b1, &bw, &bg, &begin, &end);
    assert_ptr_equal(bw, w + cut_e);
    assert_ptr_equal(bg, g2 + cut_e);
    assert_true(begin == cut_e && end == total);
    assert_null(be->model_stream(b1));
    assert_int_equal(be->mem_used(&mem), 0);
    assert_true(mem > 0);
    be->acts_destroy(&c0), be->acts_destroy(&c1);
    be->model_destroy(&b0), be->model_destroy(&b1);
    assert_null(b0);
    assert_null(c0);
    /* the CPU model works on the shared buffers: it needs both */
    assert_int_equal(be->model_new(&b0, &cfg, 0, 2, w, NULL, 1), -EINVAL);
    assert_non_null(strstr(be->last_error(), "none given"));
    model_acts_destroy(&a0), model_acts_destroy(&a1);
    model_destroy(&m0), model_destroy(&m1);
    free(w), free(g1), free(g2), free(x1), free(x2), free(d1), free(d2);
    params_table_free(&tab);
}

/* The emulated CUDA plugin's table (build/lib/libctitan_cuda_sim.so) does the optimizer's
 * vector work as the CPU's: exactly for elementwise fp32 and the block norms (one order on both,
 * so CPU and GPU shards make the same clip factor), to float rounding for AdamW, to bf16 for the
 * weights. */
/* The emulated plugin's table (the test is skipped where it is not built). */
static const backend_t *emulated_gpu(void)
{
    char path[PATH_MAX], err[512];
    if (access(tu_lib("libctitan_cuda_sim.so", path, sizeof(path)), R_OK)) {
        print_message("%s not built: skipping\n", path);
        skip();
    }
    setenv(CUDA_PLUGIN_ENV, path, 1);
    const backend_t *gpu = backend_load("cuda", err, sizeof(err));
    unsetenv(CUDA_PLUGIN_ENV);
    if (!gpu)
        fail_msg("%s", err);
    return gpu;
}

static void test_backend_cuda_emulated_vector_ops_agree_with_the_cpu(void **state)
{
    const backend_t *gpu = emulated_gpu(), *cpu = backend_cpu();
    assert_string_equal(gpu->name, "cuda");
    assert_int_equal(gpu->dev_select(0, NULL), 0);
    void *s;
    assert_int_equal(gpu->stream_new(&s), 0);
    float *x = filled(11, 1.0), *y = filled(12, 1.0), *w = filled(13, 0.5), *m = filled(14, 0.1);
    float *v = calloc(N, sizeof(float)), *back = malloc(N * sizeof(float));
    float *dx, *dy, *dw, *dm, *dv;
    double *dn, norm[3], ref[3];
    size_t bytes = N * sizeof(float);
    float **dev[] = {&dx, &dy, &dw, &dm, &dv};
    const float *host[] = {x, y, w, m, v};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(gpu->alloc((void **)dev[i], bytes), 0);
        assert_int_equal(gpu->copy(*dev[i], host[i], bytes, s), 0);
    }
    assert_int_equal(gpu->alloc((void **)&dn, sizeof(norm)), 0);
    assert_int_equal(gpu->f32_add(dy, dx, N, s), 0);
    assert_int_equal(gpu->block_sumsq(dn, dy, N, BLOCK, s), 0);
    assert_int_equal(gpu->copy(norm, dn, sizeof(norm), s), 0);
    assert_int_equal(gpu->copy(back, dy, bytes, s), 0);
    assert_int_equal(gpu->stream_sync(s), 0);
    cpu->f32_add(y, x, N, NULL);
    cpu->block_sumsq(ref, y, N, BLOCK, NULL);
    assert_memory_equal(back, y, bytes);
    assert_int_equal(tu_compare_d("block norms", norm, ref, 3, 0, 1e-12), 0);
    assert_memory_equal(norm, ref, sizeof(norm));

    assert_int_equal(gpu->adamw(dw, dm, dv, dw, dm, dv, dy, 1.0f, NULL, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, NULL,
                                NULL, s), 0);
    cpu->adamw(w, m, v, w, m, v, y, 1.0f, NULL, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, NULL, NULL, NULL);
    assert_int_equal(gpu->copy(back, dw, bytes, s), 0);
    assert_int_equal(gpu->stream_sync(s), 0);
    double *wd = malloc(N * sizeof(double));
    tu_to_double(wd, w, N);
    assert_int_equal(tu_compare("AdamW", back, wd, N, 1e-7, 1e-6), 0);

    /* Out of place with a clip factor, from the CPU's state on both: a second bank written, the
     * first left as it was. The GPU's outputs start as NaN, so an element left unwritten shows. */
    float *w2 = malloc(bytes), *m2 = malloc(bytes), *v2 = malloc(bytes), *nan = malloc(bytes);
    float *dw2, *dm2, *dv2;
    float **dev2[] = {&dw2, &dm2, &dv2};
    for (size_t i = 0; i < N; i++)
        nan[i] = NAN;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(gpu->alloc((void **)dev2[i], bytes), 0);
        assert_int_equal(gpu->copy(*dev2[i], nan, bytes, s), 0);
    }
    const float *src[] = {w, m, v}, *dsrc[] = {dw, dm, dv}, *dout[] = {dw2, dm2, dv2}, *out[] = {w2, m2, v2};
    for (int i = 0; i < 3; i++)
        assert_int_equal(gpu->copy((void *)dsrc[i], src[i], bytes, s), 0);
    assert_int_equal(gpu->adamw(dw2, dm2, dv2, dw, dm, dv, dy, 0.6f, NULL, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, NULL,
                                NULL, s), 0);
    assert_int_equal(cpu->adamw(w2, m2, v2, w, m, v, y, 0.6f, NULL, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, NULL, NULL,
                                NULL), 0);
    const char *what[] = {"AdamW out of place: w", "AdamW out of place: m", "AdamW out of place: v"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(gpu->copy(back, dout[i], bytes, s), 0);
        assert_int_equal(gpu->stream_sync(s), 0);
        tu_to_double(wd, out[i], N);
        assert_int_equal(tu_compare(what[i], back, wd, N, 1e-7, 1e-6), 0);
        assert_int_equal(gpu->copy(back, dsrc[i], bytes, s), 0);
        assert_int_equal(gpu->stream_sync(s), 0);
        assert_memory_equal(back, src[i], bytes);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(gpu->free(*dev2[i]), 0);
    free(w2), free(m2), free(v2), free(nan);

    uint16_t bf[N];
    assert_int_equal(gpu->to_weights(dx, w, N, s), 0); /* bf16 into the first half of dx */
    assert_int_equal(gpu->copy(bf, dx, sizeof(bf), s), 0);
    assert_int_equal(gpu->stream_sync(s), 0);
    for (size_t i = 0; i < N; i++)
        if (bf[i] != tu_f32_to_bf16(w[i]))
            fail_msg("bf16 weight %zu: %#x, want %#x", i, bf[i], tu_f32_to_bf16(w[i]));
    for (int i = 0; i < 5; i++)
        assert_int_equal(gpu->free(*dev[i]), 0);
    assert_int_equal(gpu->free(dn), 0);
    gpu->stream_free(s);
    free(x), free(y), free(w), free(m), free(v), free(back), free(wd);
}

/* The emulated plugin on device 0, and the "tiny" model with head dimension 16 (the CUDA
 * attention's least) and its parameter table. */
static const backend_t *emulated_tiny(model_config_t *cfg, param_table_t *tab)
{
    char err[512];
    const backend_t *gpu = emulated_gpu();
    assert_int_equal(gpu->dev_select(0, NULL), 0);
    config_preset("tiny", cfg);
    cfg->n_heads = 1, cfg->n_kv_heads = 1;
    assert_int_equal(config_validate(cfg, err, sizeof(err)), 0);
    assert_int_equal(params_table_init(tab, cfg), 0);
    return gpu;
}

/* Offload on the emulated plugin: the model pins its range of the shared weights and gradients
 * (pinning the same pages again is refused until the model is gone), its step begins with the
 * host's weights on the device as bf16, and the fp32 weights it brought over in its gradient
 * buffer are not left there: the step's end hands back zero gradients (no backward ran) over
 * what the host held. */
static void test_backend_cuda_offload_pins_the_shared_range_and_starts_the_step_clean(void **state)
{
    model_config_t cfg;
    param_table_t tab;
    const backend_t *gpu = emulated_tiny(&cfg, &tab);
    size_t total = tab.total, page = (size_t)sysconf(_SC_PAGESIZE), bytes = (total * 4 + page - 1) / page * page;
    float *hw = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    float *hg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(hw != MAP_FAILED && hg != MAP_FAILED);
    params_init(&tab, &cfg, 7, hw, 0, total);
    for (size_t i = 0; i < total; i++)
        hg[i] = 1e30f; /* anything but the gradients */
    backend_model_t *bm;
    if (gpu->model_new(&bm, &cfg, 0, cfg.n_layers + 2, hw, hg, 1))
        fail_msg("model_new: %s", gpu->last_error());
    assert_int_not_equal(gpu->host_pin(hw, bytes), 0); /* pinned by the model already */
    assert_int_not_equal(gpu->host_pin(hg, bytes), 0);
    assert_int_equal(gpu->step_begin(bm), 0);
    void *dw;
    float *dg;
    size_t b, e;
    gpu->model_buffers(bm, &dw, &dg, &b, &e);
    assert_int_equal(e - b, total);
    uint16_t *w16 = malloc(total * 2);
    void *s;
    assert_int_equal(gpu->stream_new(&s), 0);
    assert_int_equal(gpu->copy(w16, dw, total * 2, s), 0);
    assert_int_equal(gpu->stream_sync(s), 0);
    for (size_t i = 0; i < total; i++)
        if (w16[i] != tu_f32_to_bf16(hw[i]))
            fail_msg("weight %zu on the device: %#x, want %#x", i, w16[i], tu_f32_to_bf16(hw[i]));
    assert_int_equal(gpu->step_end(bm), 0);
    for (size_t i = 0; i < total; i++)
        if (hg[i] != 0.0f)
            fail_msg("gradient %zu handed back as %g, want 0", i, hg[i]);
    gpu->stream_free(s);
    gpu->model_destroy(&bm);
    assert_int_equal(gpu->host_pin(hw, bytes), 0); /* given back with the model */
    gpu->host_unpin(hw);
    munmap(hw, bytes), munmap(hg, bytes);
    free(w16);
    params_table_free(&tab);
}

/* Offload in bf16 (optshard.offload_dtype "bfloat16": cfg.host_bf16) on the emulated plugin: one
 * step from bf16 host copies is the fp32 copies' step rounded, bit for bit. The host's bf16
 * weights (bf16.h, as the CPU shards publish them) are those the fp32 upload rounds to on the
 * device, so the loss is the same double; the gradients handed back are the fp32 ones rounded
 * to bf16 (not left in the weights' buffer: a second step from fresh weights starts from zero
 * gradients and gives the first one's gradients again). */
static void test_backend_cuda_offload_in_bf16_is_the_fp32_offload_rounded(void **state)
{
    model_config_t cfg;
    param_table_t tab;
    const backend_t *gpu = emulated_tiny(&cfg, &tab);
    enum { B = 2, T = 16 };
    size_t total = tab.total;
    float *hw = malloc(total * 4), *hg = malloc(total * 4);
    uint16_t *hw16 = malloc(total * 2), *hg16 = malloc(total * 2);
    assert_true(hw && hg && hw16 && hg16);
    params_init(&tab, &cfg, 7, hw, 0, total);
    for (size_t i = 0; i < total; i++)
        hw16[i] = tu_f32_to_bf16(hw[i]);
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++)
        tok[i] = (i * 7 + 3) % cfg.vocab_size, tgt[i] = (i * 13 + 5) % cfg.vocab_size;
    double loss[2][2];
    for (int k = 0; k < 2; k++) {
        model_config_t c = cfg;
        c.host_bf16 = k;
        backend_model_t *bm;
        backend_acts_t *a;
        if (gpu->model_new(&bm, &c, 0, c.n_layers + 2, k ? (void *)hw16 : hw, k ? (void *)hg16 : hg, 1))
            fail_msg("model_new (host_bf16 %d): %s", k, gpu->last_error());
        assert_int_equal(gpu->acts_new(&a, bm, B, T), 0);
        for (int step = 0; step < 2; step++) {
            if (k) /* NaN: anything but the gradients */
                memset(hg16, 0xff, total * 2);
            else
                memset(hg, 0xff, total * 4);
            assert_int_equal(gpu->step_begin(bm), 0);
            if (gpu->forward(bm, a, tok, NULL, tgt, 1.0f / (B * T), NULL, &loss[k][step]) ||
                gpu->backward(bm, a, NULL, NULL) || gpu->step_end(bm))
                fail_msg("step %d (host_bf16 %d): %s", step, k, gpu->last_error());
        }
        gpu->acts_destroy(&a);
        gpu->model_destroy(&bm);
    }
    assert_memory_equal(&loss[0][0], &loss[1][0], sizeof(double));
    assert_memory_equal(&loss[0][0], &loss[0][1], sizeof(double)); /* the same weights again */
    assert_memory_equal(&loss[1][0], &loss[1][1], sizeof(double));
    size_t nonzero = 0;
    for (size_t i = 0; i < total; i++) {
        if (hg16[i] != tu_f32_to_bf16(hg[i]))
            fail_msg("gradient %zu: %#x from bf16 offload, want %#x (%g rounded)", i, hg16[i], tu_f32_to_bf16(hg[i]),
                     hg[i]);
        nonzero += hg[i] != 0.0f;
    }
    print_message("loss %.17g; %zu of %zu gradients not zero\n", loss[0][0], nonzero, total);
    assert_true(nonzero > total / 2);
    free(hw), free(hg), free(hw16), free(hg16);
    params_table_free(&tab);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_load_picks_cpu_and_refuses_other_devices),
        cmocka_unit_test(test_backend_cpu_vector_ops_are_the_plain_loops_bitwise),
        cmocka_unit_test(test_backend_cpu_adamw_out_of_place_with_clip_is_scale_then_in_place_bitwise),
        cmocka_unit_test(test_backend_cpu_model_is_model_c_bitwise),
        cmocka_unit_test(test_backend_cuda_emulated_vector_ops_agree_with_the_cpu),
        cmocka_unit_test(test_backend_cuda_offload_pins_the_shared_range_and_starts_the_step_clean),
        cmocka_unit_test(test_backend_cuda_offload_in_bf16_is_the_fp32_offload_rounded),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
