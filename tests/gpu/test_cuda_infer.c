/* The GPU's KV-cache inference (kernels/cuda/cuda_infer.h) against the CPU's (kernels/cpu/infer.h,
 * itself checked against the whole-window model and transformers in test_generate): the same
 * weights, the same tokens fed in the same passes, the last token's logits equal to float
 * rounding at every call, prompt passes and one-token steps alike; Llama 3.1's rotary scaling
 * and grouped-query heads included; bad calls refused without touching the cache. On a GPU
 * (tools/gpu_check.sh runs every tests/gpu program) and on the emulator as test_cuda_infer_sim. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/infer.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/cuda_infer.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/params.h"
#include "tests/testutil.h"

#define RTOL 1e-4 /* fp32 both; only the order of sums differs */

static void need_gpu(void)
{
    if (cuda_device_count() == 0) {
        print_message("no CUDA device: skipping (%s)\n", cuda_err_text());
        skip();
    }
}

/* GQA (4 query heads, 2 kv heads, head dim 16); rope_scaled: Llama 3.1's scaling, every branch. */
static model_config_t config(int rope_scaled)
{
    model_config_t c;
    config_preset("tiny", &c);
    c.dim = 64, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 300, c.max_seq_len = 80;
    if (rope_scaled)
        c.rope_theta = 10000, c.rope_scaling_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4,
        c.rope_original_max_seq_len = 16;
    char err[256];
    if (config_validate(&c, err, sizeof(err)))
        fail_msg("config: %s", err);
    return c;
}

static float *weights(const model_config_t *c, uint64_t seed)
{
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, c), 0);
    float *w = malloc(tab.total * sizeof(float));
    assert_non_null(w);
    tu_fill(NULL, w, tab.total, seed, 0.5);
    for (int t = 0; t < tab.n; t++)
        if (tab.t[t].ndim == 1) /* norms near 1 */
            for (size_t i = 0; i < tab.t[t].numel; i++)
                w[tab.t[t].offset + i] = 1.0f + 0.2f * w[tab.t[t].offset + i];
    params_table_free(&tab);
    return w;
}

static void assert_logits_close(const float *gpu, const float *cpu, int V, const char *what, int call)
{
    double worst = 0, scale = 0;
    for (int v = 0; v < V; v++)
        scale = fmax(scale, fabs(cpu[v]));
    for (int v = 0; v < V; v++) {
        double d = fabs((double)gpu[v] - cpu[v]);
        worst = fmax(worst, d);
        if (!(d <= RTOL * (1 + scale)))
            fail_msg("%s, call %d: logit %d: GPU %.9g, CPU %.9g", what, call, v, gpu[v], cpu[v]);
    }
    print_message("%s, call %d: worst difference %.3g (logits up to %.3g)\n", what, call, worst, scale);
}

/* A prompt in passes of `pass` tokens, then single tokens to the end of the cache. */
static void check_against_cpu(int rope_scaled, int pass, int prompt)
{
    need_gpu();
    model_config_t c = config(rope_scaled);
    float *w = weights(&c, 11 + rope_scaled), *lg = malloc((size_t)c.vocab_size * sizeof(float));
    int cap = c.max_seq_len;
    infer_t *cpu = infer_new(&c, w, cap, pass, 0, NULL);
    cuda_infer_t *gpu = NULL;
    assert_non_null(cpu);
    assert_int_equal(cuda_infer_new(&gpu, &c, w, cap, pass), 0);
    uint64_t seed = 5;
    int32_t tok[64];
    for (int call = 0; cuda_infer_pos(gpu) < cap; call++) {
        int at = cuda_infer_pos(gpu), n = at < prompt ? (prompt - at < pass ? prompt - at : pass) : 1;
        for (int i = 0; i < n; i++)
            tok[i] = (int32_t)(tu_next(&seed) % (uint64_t)c.vocab_size);
        const float *want = infer_forward(cpu, tok, n, 0);
        assert_non_null(want);
        int rc = cuda_infer_forward(gpu, tok, n, lg);
        if (rc)
            fail_msg("cuda_infer_forward: %d: %s", rc, cuda_err_text());
        assert_int_equal(cuda_infer_pos(gpu), at + n);
        assert_logits_close(lg, want, c.vocab_size, rope_scaled ? "llama3 rope" : "plain rope", call);
    }
    cuda_infer_destroy(&gpu);
    assert_null(gpu);
    infer_destroy(&cpu);
    free(lg);
    free(w);
}

static void test_cuda_infer_matches_the_cpu_prompt_then_tokens(void **state) { check_against_cpu(0, 24, 40); }

/* Passes up to 8 tokens (matrix-vector products up to 4 rows, the tiled product above) and the
 * scaled rotary table. */
static void test_cuda_infer_matches_the_cpu_with_llama3_rope(void **state) { check_against_cpu(1, 8, 30); }

/* A call past max_batch or the cache's end is refused and leaves the position as it was; bad
 * sizes are refused at creation. */
static void test_cuda_infer_refuses_bad_calls(void **state)
{
    need_gpu();
    model_config_t c = config(0);
    float *w = weights(&c, 3), *lg = malloc((size_t)c.vocab_size * sizeof(float));
    cuda_infer_t *gpu = NULL;
    assert_int_equal(cuda_infer_new(&gpu, &c, w, 0, 1), -EINVAL);
    assert_null(gpu);
    assert_int_equal(cuda_infer_new(&gpu, &c, w, c.max_seq_len + 1, 1), -EINVAL);
    assert_int_equal(cuda_infer_new(&gpu, &c, w, 4, 5), -EINVAL);
    assert_non_null(strstr(cuda_err_text(), "a cache of 4 positions with 5 tokens a call"));
    assert_int_equal(cuda_infer_new(&gpu, &c, w, 4, 3), 0);
    int32_t tok[4] = {1, 2, 3, 4};
    assert_int_equal(cuda_infer_forward(gpu, tok, 4, lg), -EINVAL); /* more than max_batch */
    assert_int_equal(cuda_infer_forward(gpu, tok, 0, lg), -EINVAL);
    assert_int_equal(cuda_infer_pos(gpu), 0);
    assert_int_equal(cuda_infer_forward(gpu, tok, 3, lg), 0);
    assert_int_equal(cuda_infer_forward(gpu, tok, 2, lg), -EINVAL); /* past the cache's end */
    assert_int_equal(cuda_infer_pos(gpu), 3);
    assert_int_equal(cuda_infer_forward(gpu, tok, 1, lg), 0);
    assert_int_equal(cuda_infer_pos(gpu), 4);
    assert_true(cuda_infer_bytes(gpu) > 0);
    cuda_infer_destroy(&gpu);
    free(lg);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_infer_matches_the_cpu_prompt_then_tokens),
        cmocka_unit_test(test_cuda_infer_matches_the_cpu_with_llama3_rope),
        cmocka_unit_test(test_cuda_infer_refuses_bad_calls),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
