/* `ctitan generate`: the KV-cache model (kernels/cpu/infer.h) against the whole-window model
 * (kernels/cpu/model.h) at every position, the sampler (stages/report/generate.h), greedy
 * generation against transformers' LlamaForCausalLM.generate on the same weights (a checkpoint
 * written with the writer API, exported with `ctitan ckpt export --safetensors`), seeds, EOS,
 * max_seq_len, the tokenizer a checkpoint names, and bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/gen_load.h"
#include "checkpointd/writer.h"
#include "kernels/cpu/infer.h"
#include "kernels/cpu/model.h"
#include "kernels/params.h"
#include "stages/data/tokenizer.h"
#include "stages/job/manifest.h"
#include "stages/report/generate.h"
#include "tests/testjob.h"
#include "tests/testutil.h"

/* The test model: GQA (4 query heads, 2 kv heads), vocab 300, 64 positions. */
static model_config_t test_config(int rope_scaled)
{
    model_config_t c;
    config_preset("tiny", &c);
    c.dim = 32, c.vocab_size = 300, c.max_seq_len = 64;
    if (rope_scaled) /* Llama 3.1's llama3 scaling, sized so every branch of it is taken; room for a
                      * prompt longer than one prefill pass */
        c.rope_theta = 10000, c.rope_scaling_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4,
        c.rope_original_max_seq_len = 16, c.max_seq_len = 400;
    char err[256];
    if (config_validate(&c, err, sizeof(err)))
        fail_msg("test config: %s", err);
    return c;
}

/* Random weights large enough that attention is sharp and every position matters; norms near 1. */
static float *test_weights(const model_config_t *c, uint64_t seed, size_t *n)
{
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, c), 0);
    float *w = malloc(tab.total * sizeof(float));
    assert_non_null(w);
    tu_fill(NULL, w, tab.total, seed, 0.5);
    for (int t = 0; t < tab.n; t++)
        if (tab.t[t].ndim == 1)
            for (size_t i = 0; i < tab.t[t].numel; i++)
                w[tab.t[t].offset + i] = 1.0f + 0.2f * w[tab.t[t].offset + i];
    *n = tab.total;
    params_table_free(&tab);
    return w;
}

static void random_tokens(int32_t *tok, int n, int V, uint64_t seed)
{
    for (int i = 0; i < n; i++)
        tok[i] = (int32_t)(tu_next(&seed) % (uint64_t)V);
}

/* The KV-cache logits of every position, fed in passes of `pass` tokens, against one forward of
 * the whole window. */
static void check_cache_against_full(int pass, int max_batch)
{
    model_config_t c = test_config(0);
    size_t nw;
    float *w = test_weights(&c, 11, &nw);
    enum { T = 40 };
    int32_t tok[T];
    random_tokens(tok, T, c.vocab_size, 5);
    model_t *m = model_new(&c, 0, c.n_layers + 2, w, NULL, NULL);
    model_acts_t *a = model_acts_new(m, 1, T);
    assert_non_null(a);
    model_forward(m, a, tok, NULL, NULL, 0, NULL);
    const float *full = model_logits(a);
    pool_t *pool = pool_new(2);
    infer_t *s = infer_new(&c, w, T, max_batch, 1, pool);
    assert_non_null(s);
    size_t bad = 0;
    for (int at = 0; at < T; at += pass) {
        int n = T - at < pass ? T - at : pass;
        const float *lg = infer_forward(s, tok + at, n, 1);
        assert_non_null(lg);
        for (size_t i = 0; i < (size_t)n * c.vocab_size; i++) {
            double ref = full[(size_t)at * c.vocab_size + i];
            if (fabs(lg[i] - ref) > 1e-5 + 1e-5 * fabs(ref) && bad++ < 5)
                print_message("position %d, token %zu: %.8g, full forward %.8g\n", at + (int)(i / c.vocab_size),
                              i % c.vocab_size, lg[i], ref);
        }
    }
    assert_int_equal(bad, 0);
    assert_int_equal(infer_pos(s), T);
    assert_null(infer_forward(s, tok, 1, 0)); /* the cache is full */
    infer_reset(s);
    assert_non_null(infer_forward(s, tok, 1, 0));
    infer_destroy(&s);
    s = infer_new(&c, w, T, max_batch, 0, pool); /* room for the last token's logits only */
    assert_non_null(s);
    if (max_batch > 1)
        assert_null(infer_forward(s, tok, 2, 1));
    assert_non_null(infer_forward(s, tok, 1, 1));
    infer_destroy(&s);
    pool_destroy(&pool);
    model_acts_destroy(&a);
    model_destroy(&m);
    free(w);
}

static void test_kv_cache_logits_equal_the_full_forward_one_token_at_a_time(void **state)
{
    check_cache_against_full(1, 1);
}

static void test_kv_cache_logits_equal_the_full_forward_in_one_prefill(void **state)
{
    check_cache_against_full(40, 40);
}

static void test_kv_cache_logits_equal_the_full_forward_in_uneven_passes(void **state)
{
    check_cache_against_full(7, 8);
}

/* How often each of 4 tokens is drawn from logits lg in `draws` draws. */
static void draw_counts(const gen_params_t *p, const float *lg, int limit, int draws, int *count)
{
    gen_sampler_t *s = gen_sampler_new(p, 4);
    assert_non_null(s);
    memset(count, 0, 4 * sizeof(int));
    for (int i = 0; i < draws; i++) {
        int t = gen_sample(s, lg, limit);
        assert_true(t >= 0 && t < 4);
        count[t]++;
    }
    gen_sampler_destroy(&s);
}

static void test_greedy_takes_the_lowest_id_among_equal_highest_logits(void **state)
{
    const float lg[4] = {0.5f, 2.0f, 2.0f, -1.0f};
    gen_params_t p = {.temperature = 0, .top_p = 1};
    int count[4];
    draw_counts(&p, lg, 4, 10, count);
    assert_int_equal(count[1], 10);
    const float lg2[4] = {0.5f, 2.0f, 2.0f, 9.0f};
    draw_counts(&p, lg2, 3, 10, count); /* token 3 is past the limit */
    assert_int_equal(count[1], 10);
}

static void test_top_k_and_top_p_keep_only_their_tokens(void **state)
{
    /* probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1 */
    const float lg[4] = {logf(0.3f), logf(0.1f), logf(0.4f), logf(0.2f)};
    int count[4];
    gen_params_t p = {.temperature = 1, .top_k = 2, .top_p = 1, .seed = 3};
    draw_counts(&p, lg, 4, 4000, count);
    assert_int_equal(count[1] + count[3], 0);
    assert_in_range(count[2], 2100, 2500); /* 4/7 of 4000 = 2286 */
    /* top-p 0.5: 0.4 is below it, so 0.3 stays too; 0.7 is above it, so 0.2 goes */
    p = (gen_params_t){.temperature = 1, .top_k = 0, .top_p = 0.5, .seed = 4};
    draw_counts(&p, lg, 4, 4000, count);
    assert_int_equal(count[1] + count[3], 0);
    assert_in_range(count[2], 2100, 2500);
    /* no filter: all four, about 10% for the least likely */
    p = (gen_params_t){.temperature = 1, .top_p = 1, .seed = 5};
    draw_counts(&p, lg, 4, 4000, count);
    assert_in_range(count[1], 300, 500);
    /* top-k 3 then top-p 0.6: of 0.4/0.9, 0.3/0.9, 0.2/0.9 the first two stay */
    p = (gen_params_t){.temperature = 1, .top_k = 3, .top_p = 0.6, .seed = 6};
    draw_counts(&p, lg, 4, 4000, count);
    assert_int_equal(count[1] + count[3], 0);
    assert_true(count[0] > 0 && count[2] > 0);
}

static void test_a_seed_gives_the_same_draws(void **state)
{
    float lg[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    gen_params_t p = {.temperature = 2, .top_p = 1, .seed = 42};
    gen_sampler_t *a = gen_sampler_new(&p, 4), *b = gen_sampler_new(&p, 4);
    p.seed = 43;
    gen_sampler_t *c = gen_sampler_new(&p, 4);
    int differ = 0;
    for (int i = 0; i < 64; i++) {
        int x = gen_sample(a, lg, 4);
        assert_int_equal(x, gen_sample(b, lg, 4));
        differ += x != gen_sample(c, lg, 4);
    }
    assert_true(differ > 0);
    gen_sampler_destroy(&a), gen_sampler_destroy(&b), gen_sampler_destroy(&c);
}

static void test_params_check_names_the_flag(void **state)
{
    char err[256];
    gen_params_t p = {.temperature = -1, .top_p = 1};
    assert_int_equal(gen_params_check(&p, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--temperature"));
    p = (gen_params_t){.temperature = NAN, .top_p = 1};
    assert_int_equal(gen_params_check(&p, err, sizeof(err)), -EINVAL);
    p = (gen_params_t){.temperature = 1, .top_k = -2, .top_p = 1};
    assert_int_equal(gen_params_check(&p, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--top-k"));
    p = (gen_params_t){.temperature = 1, .top_p = 0};
    assert_int_equal(gen_params_check(&p, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--top-p"));
    p = (gen_params_t){.temperature = 1, .top_p = 1.5};
    assert_int_equal(gen_params_check(&p, err, sizeof(err)), -EINVAL);
}

static void test_utf8_hold_back_keeps_only_an_incomplete_last_character(void **state)
{
#define READY(s) gen_utf8_ready((const uint8_t *)(s), sizeof(s) - 1)
    assert_int_equal(READY("abc"), 3);
    assert_int_equal(READY(""), 0);
    assert_int_equal(READY("a\xe2\x82"), 1);          /* half of the euro sign */
    assert_int_equal(READY("a\xe2\x82\xac"), 4);      /* all of it */
    assert_int_equal(READY("\xc3"), 0);
    assert_int_equal(READY("\xc3\xa9"), 2);
    assert_int_equal(READY("x\xf0\x9f\x98"), 1);      /* 3 of an emoji's 4 bytes */
    assert_int_equal(READY("x\xf0\x9f\x98\x80"), 5);
    assert_int_equal(READY("\xff"), 1);               /* never valid: not held */
    assert_int_equal(READY("a\x80"), 2);              /* a stray continuation byte */
    assert_int_equal(READY("\x80\x80\x80\x80\x80"), 5);
#undef READY
}

/* Greedy ids of gen_run over (c, w), eos -1, into out; returns how many. */
typedef struct {
    uint32_t ids[128];
    int n, stop_after;
} collect_t;

static int collect(void *ctx, uint32_t t)
{
    collect_t *c = ctx;
    c->ids[c->n++] = t;
    return c->stop_after && c->n >= c->stop_after;
}

static void test_generation_stops_at_eos_max_tokens_and_max_seq_len(void **state)
{
    model_config_t c = test_config(0);
    size_t nw;
    float *w = test_weights(&c, 12, &nw);
    uint32_t prompt[60];
    for (int i = 0; i < 60; i++)
        prompt[i] = (uint32_t)(i * 7 % c.vocab_size);
    gen_params_t p = {.temperature = 0, .top_p = 1};
    gen_stats_t st;
    char err[256];
    collect_t a = {0}, b = {0}, d = {0};
    assert_int_equal(gen_run(&c, w, NULL, NULL, &p, prompt, 3, 20, NULL, 0, c.vocab_size, collect, &a, &st, err,
                             sizeof(err)), 0);
    assert_int_equal(a.n, 20);
    assert_int_equal(st.new_tokens, 20);
    assert_string_equal(st.stop, "max tokens");
    /* the 6th token as EOS, among ids that never come: generation ends with its first appearance */
    int eos[3] = {-1, (int)a.ids[5], -1}, first = 0, k = 0;
    for (int v = 0; v < c.vocab_size && k < 2; v++) { /* two ids that never come */
        int seen = 0;
        for (int i = 0; i < 20; i++)
            seen |= a.ids[i] == (uint32_t)v;
        if (!seen)
            eos[k++ ? 2 : 0] = v;
    }
    assert_int_equal(k, 2);
    while (a.ids[first] != (uint32_t)eos[1])
        first++;
    assert_int_equal(gen_run(&c, w, NULL, NULL, &p, prompt, 3, 20, eos, 3, c.vocab_size, collect, &b, &st, err,
                             sizeof(err)), 0);
    assert_int_equal(b.n, first + 1);
    assert_memory_equal(a.ids, b.ids, (size_t)b.n * sizeof(uint32_t));
    assert_string_equal(st.stop, "eos");
    /* 60 prompt tokens leave 4 of the 64 positions */
    assert_int_equal(gen_run(&c, w, NULL, NULL, &p, prompt, 60, 100, NULL, 0, c.vocab_size, collect, &d, &st, err,
                             sizeof(err)), 0);
    assert_int_equal(d.n, 4);
    assert_string_equal(st.stop, "max_seq_len");
    uint32_t many[64] = {0};
    assert_int_equal(gen_run(&c, w, NULL, NULL, &p, many, 64, 1, NULL, 0, c.vocab_size, collect, &d, &st, err,
                             sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "max_seq_len"));
    prompt[1] = 300;
    assert_int_equal(gen_run(&c, w, NULL, NULL, &p, prompt, 3, 1, NULL, 0, c.vocab_size, collect, &d, &st, err,
                             sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "vocabulary"));
    free(w);
}

/* ---- the command, on checkpoints written with the writer API ---- */

static const char corpus[] =
    "The quick brown fox jumps over the lazy dog. A fox is quick and a dog is lazy; the fox runs "
    "over the hill and the dog sleeps under the tree. Where does the quick fox go? Over the lazy "
    "dog, over the hill, over and over again, caf\xc3\xa9 \xe2\x82\xac 12 345 6789. ";

typedef struct {
    char dir[64];
    char ckpt[256];       /* DIR/plain/step-00000003: the test model, naming the tokenizer */
    char scaled[256];     /* DIR/scaled/step-00000003: with llama3 rope scaling, no tokenizer */
    char tokenizer[256];  /* DIR/tokenizer.bin */
    model_config_t cfg, cfg_scaled;
} gfx_t;

/* Checkpoint step 3 of model c with weights from seed under dir/sub, its manifest naming tok. */
static int write_ckpt(const char *dir, const char *sub, const model_config_t *c, uint64_t seed, const char *tok,
                      char *path, size_t n)
{
    manifest_t *m = malloc(sizeof(*m));
    param_table_t tab;
    ckpt_index_t ix;
    ckw_t *w = NULL;
    char err[512], folder[128];
    size_t nw;
    float *data[3] = {test_weights(c, seed, &nw), calloc(nw, sizeof(float)), calloc(nw, sizeof(float))};
    manifest_defaults(m);
    m->model = *c;
    snprintf(m->flavor, sizeof(m->flavor), "tiny");
    snprintf(m->tokenizer_path, sizeof(m->tokenizer_path), "%s", tok);
    char *toml = manifest_to_toml(m);
    snprintf(folder, sizeof(folder), "%s/%s", dir, sub);
    int rc = params_table_init(&tab, c) ? -ENOMEM
             : ckpt_index_plan(&ix, &tab, optim_find("AdamW"), 3, toml, "\x80", 1);
    for (uint32_t f = 0; f < 3 && !rc; f++)
        ckpt_index_hash(&ix, f, data[f]);
    if (!rc && !(rc = ckw_begin(&w, folder, &ix, err, sizeof(err)))) {
        static uint8_t block[CKPT_DATA_HDR];
        for (uint32_t f = 0; f < 3 && !rc; f++) {
            ckpt_data_header(block, f, 3);
            if (!(rc = ckw_write(w, f, 0, block, sizeof(block), err, sizeof(err))))
                rc = ckw_write(w, f, CKPT_DATA_HDR, data[f], nw * sizeof(float), err, sizeof(err));
        }
        if (rc)
            ckw_abort(&w);
        else
            rc = ckw_commit(&w, path, n, NULL, err, sizeof(err));
    }
    if (rc)
        print_message("writing a checkpoint in %s: %s\n", folder, err);
    ckpt_index_free(&ix);
    params_table_free(&tab);
    for (int f = 0; f < 3; f++)
        free(data[f]);
    free(toml);
    free(m);
    return rc;
}

static int group_teardown(void **state)
{
    gfx_t *g = *state;
    if (g && g->dir[0])
        tu_rmtree(g->dir);
    free(g);
    return 0;
}

static int group_setup(void **state)
{
    gfx_t *g = calloc(1, sizeof(*g));
    *state = g;
    if (!g)
        return -1;
    snprintf(g->dir, sizeof(g->dir), "/tmp/ctitan-generate-XXXXXX");
    if (!mkdtemp(g->dir)) {
        g->dir[0] = 0;
        return -1;
    }
    snprintf(g->tokenizer, sizeof(g->tokenizer), "%s/tokenizer.bin", g->dir);
    tok_t *t = NULL;
    char err[256];
    g->cfg = test_config(0);
    g->cfg_scaled = test_config(1);
    if (tok_train(&t, (const uint8_t *)corpus, sizeof(corpus) - 1, 300, err, sizeof(err)) ||
        tok_save(t, g->tokenizer, err, sizeof(err))) {
        print_message("tokenizer: %s\n", err);
        tok_destroy(&t);
        return -1;
    }
    tok_destroy(&t);
    if (write_ckpt(g->dir, "plain", &g->cfg, 21, g->tokenizer, g->ckpt, sizeof(g->ckpt)) ||
        write_ckpt(g->dir, "scaled", &g->cfg_scaled, 22, "", g->scaled, sizeof(g->scaled)))
        return -1;
    return 0;
}

/* Runs ctitan with args (stderr into out too when both); returns the exit status. */
static int run_ctitan(char *out, size_t n, int both, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int run_ctitan(char *out, size_t n, int both, const char *fmt, ...)
{
    char args[8192], cmd[8192 + 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof(cmd), "%s %s %s", tu_ctitan(), args, both ? "2>&1" : "2>/dev/null");
    return tu_run(cmd, out, n);
}

static void ids_text(const uint32_t *ids, int n, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%u", i ? " " : "", ids[i]);
}

/* LlamaConfig's keyword arguments for c, as JSON. */
static void hf_config_json(const model_config_t *c, char *buf, size_t n)
{
    char scaling[256] = "null";
    if (c->rope_scaling_factor > 0)
        snprintf(scaling, sizeof(scaling), "{\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": %.17g, "
                 "\"high_freq_factor\": %.17g, \"original_max_position_embeddings\": %d}", c->rope_scaling_factor,
                 c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_original_max_seq_len);
    snprintf(buf, n, "{\"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
             "\"rms_norm_eps\": %.17g, \"rope_theta\": %.17g, \"max_position_embeddings\": %d, \"rope_scaling\": %s}",
             c->vocab_size, c->dim, config_ffn_hidden(c), c->n_layers, c->n_heads, c->n_kv_heads, c->norm_eps,
             c->rope_theta, c->max_seq_len, scaling);
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
        s[--n] = 0;
}

/* tests/NAME from the repository root (make test), else beside the build folder. */
static void py_script(const char *name, char *path, size_t n)
{
    char exe[200];
    snprintf(path, n, "tests/%s", name);
    ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (access(path, R_OK) && k > 0) {
        exe[k] = 0;
        *strrchr(exe, '/') = 0;
        snprintf(path, n, "%s/../../tests/%s", exe, name);
    }
}

/* Greedy ids of `ctitan generate` and of transformers' generate on checkpoint ckpt's weights. */
static void check_greedy_against_transformers(const gfx_t *g, const char *ckpt, const model_config_t *c,
                                              const char *name, const char *prompt)
{
    const char *py;
    TU_NEED_PY(py);
    TU_NEED_BIN();
    char st[300], out[8192], ours[8192], theirs[8192], cfg[1024], script[300];
    snprintf(st, sizeof(st), "%s/%s.safetensors", g->dir, name);
    assert_int_equal(run_ctitan(out, sizeof(out), 1, "ckpt export %s --safetensors %s", ckpt, st), 0);
    enum { N = 40 };
    int rc = run_ctitan(ours, sizeof(ours), 0, "generate %s --prompt-ids '%s' --ids --temperature 0 --max-tokens %d",
                        ckpt, prompt, N);
    assert_int_equal(rc, 0);
    hf_config_json(c, cfg, sizeof(cfg));
    char cmd[8192];
    py_script("hf_generate.py", script, sizeof(script));
    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python %s %s '%s' '%s' %d 2>&1", py, script, st, cfg, prompt, N);
    rc = tu_run(cmd, theirs, sizeof(theirs));
    if (rc)
        fail_msg("%s failed (%d): %s", cmd, rc, theirs);
    trim(ours), trim(theirs);
    print_message("%s: ctitan   %s\n%s: transformers %s\n", name, ours, name, theirs);
    assert_string_equal(ours, theirs);
}

static void test_greedy_equals_transformers_generate(void **state)
{
    gfx_t *g = *state;
    check_greedy_against_transformers(g, g->ckpt, &g->cfg, "plain", "17 4 250 99 3 3 180");
}

static void test_greedy_equals_transformers_generate_with_llama3_rope_scaling_after_a_long_prompt(void **state)
{
    gfx_t *g = *state;
    /* 300 prompt tokens: two prefill passes (256 + 44) */
    uint32_t ids[300];
    char prompt[2000];
    for (int i = 0; i < 300; i++)
        ids[i] = (uint32_t)((i * 37 + 11) % 300);
    ids_text(ids, 300, prompt, sizeof(prompt));
    check_greedy_against_transformers(g, g->scaled, &g->cfg_scaled, "scaled", prompt);
}

/* A Hugging Face folder as the model: a random Llama 3.2-like one written by transformers (tied
 * embeddings, Llama 3.1 rotary scaling, bf16 shards) generates greedily what transformers'
 * generate does from the same folder, past end-of-text ids (--ignore-eos; transformers with no
 * EOS) and stopping at them: with a generation_config.json naming two (one that never comes,
 * and the sixth token generated) both stop after that token's first appearance, saying so, and
 * --ignore-eos goes on; a bad eos_token_id is refused naming the file. */
static void test_greedy_from_a_hugging_face_folder_equals_transformers(void **state)
{
    gfx_t *g = *state;
    const char *py;
    TU_NEED_PY(py);
    TU_NEED_BIN();
    char hf[300], script[300], cmd[2048], ours[8192], theirs[8192];
    const char *prompt = "5 17 90 3 3 61 44 2";
    enum { N = 24 };
    snprintf(hf, sizeof(hf), "%s/hfgen", g->dir);
    py_script("hf_llama.py", script, sizeof(script));
    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python %s %s --dtype bfloat16 --tied --rope-llama3 --shard --vocab 300 "
             "--max-pos 128 2>&1", py, script, hf);
    if (tu_run(cmd, theirs, sizeof(theirs)))
        fail_msg("%s: %s", cmd, theirs);
    /* ctitan's ids past any end-of-text id, then generation_config.json's end-of-text ids: the
     * sixth of them, and one that never comes */
    assert_int_equal(run_ctitan(ours, sizeof(ours), 0, "generate %s --prompt-ids '%s' --ids --temperature 0 "
                                "--max-tokens %d --ignore-eos", hf, prompt, N), 0);
    trim(ours);
    uint32_t ids[N];
    int n = 0, never = -1;
    for (char *p = ours; *p && n < N; n++)
        ids[n] = (uint32_t)strtoul(p, &p, 10);
    assert_int_equal(n, N);
    for (int v = 0; v < 300 && never < 0; v++) {
        int seen = 0;
        for (int i = 0; i < N; i++)
            seen |= ids[i] == (uint32_t)v;
        never = seen ? -1 : v;
    }
    int first = 0;
    while (ids[first] != ids[5])
        first++;
    char gc[400], all[8192], upto[8192];
    snprintf(gc, sizeof(gc), "%s/generation_config.json", hf);
    FILE *f = fopen(gc, "w");
    assert_non_null(f);
    fprintf(f, "{\"bos_token_id\": 1, \"eos_token_id\": [%d, %u], \"pad_token_id\": 0}\n", never, ids[5]);
    assert_int_equal(fclose(f), 0);
    ids_text(ids, N, all, sizeof(all));
    ids_text(ids, first + 1, upto, sizeof(upto));
    /* transformers: without EOS, then with the folder's */
    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python %s --generate %s '%s' %d 2>/dev/null", py, script, hf, prompt, N);
    if (tu_run(cmd, theirs, sizeof(theirs)))
        fail_msg("%s: %s", cmd, theirs);
    char *second = strchr(theirs, '\n');
    assert_non_null(second);
    *second++ = 0;
    trim(theirs), trim(second);
    print_message("hf folder: ctitan       %s\nhf folder: transformers %s\n", all, theirs);
    assert_string_equal(all, theirs);
    assert_int_equal(run_ctitan(ours, sizeof(ours), 0, "generate %s --prompt-ids '%s' --ids --temperature 0 "
                                "--max-tokens %d", hf, prompt, N), 0);
    trim(ours);
    print_message("with eos %d and %u: ctitan %s; transformers %s\n", never, ids[5], ours, second);
    assert_string_equal(second, upto);
    assert_string_equal(ours, upto);
    assert_int_equal(run_ctitan(ours, sizeof(ours), 1, "generate %s --prompt-ids '%s' --ids --temperature 0 "
                                "--max-tokens %d", hf, prompt, N), 0);
    assert_non_null(strstr(ours, "stopped at eos"));
    assert_int_equal(run_ctitan(ours, sizeof(ours), 0, "generate %s --prompt-ids '%s' --ids --temperature 0 "
                                "--max-tokens %d --ignore-eos", hf, prompt, N), 0);
    trim(ours);
    assert_string_equal(ours, all); /* on past the end-of-text id */
    /* a bad eos_token_id is refused naming the file */
    f = fopen(gc, "w");
    assert_non_null(f);
    fprintf(f, "{\"eos_token_id\": \"</s>\"}\n");
    assert_int_equal(fclose(f), 0);
    assert_int_equal(run_ctitan(ours, sizeof(ours), 1, "generate %s --prompt-ids '%s' --max-tokens 2", hf, prompt), 1);
    if (!strstr(ours, "generation_config.json: eos_token_id must be a token id"))
        fail_msg("%s", ours);
}

/* gen_distribution against transformers' warpers (temperature, top-k, top-p, softmax) on the same
 * logits: the same tokens, the same probabilities to 1e-6. */
static void test_the_distribution_is_that_of_transformers_warpers(void **state)
{
    gfx_t *g = *state;
    const char *py;
    TU_NEED_PY(py);
    enum { V = 1000 };
    static const gen_params_t cases[] = {
        {.temperature = 0.7, .top_k = 0, .top_p = 1},
        {.temperature = 1, .top_k = 50, .top_p = 1},
        {.temperature = 1.3, .top_k = 0, .top_p = 0.9},
        {.temperature = 0.8, .top_k = 40, .top_p = 0.8},
        {.temperature = 2, .top_k = 7, .top_p = 0.5},
    };
    float lg[V];
    tu_fill(NULL, lg, V, 77, 4.0);
    char path[300], script[300], cmd[1200], out[65536];
    snprintf(path, sizeof(path), "%s/logits.f32", g->dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(lg, sizeof(float), V, f), V);
    fclose(f);
    py_script("hf_warpers.py", script, sizeof(script));
    int at = snprintf(cmd, sizeof(cmd), "%s/venv/bin/python %s %s", py, script, path);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
        at += snprintf(cmd + at, sizeof(cmd) - (size_t)at, " %.17g %d %.17g", cases[c].temperature, cases[c].top_k,
                       cases[c].top_p);
    snprintf(cmd + at, sizeof(cmd) - (size_t)at, " 2>&1");
    if (tu_run(cmd, out, sizeof(out)))
        fail_msg("%s: %s", cmd, out);
    char *line = out;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const gen_params_t *p = &cases[c];
        gen_sampler_t *s = gen_sampler_new(p, V);
        const int *ids;
        const double *probs;
        int k = gen_distribution(s, lg, V, &ids, &probs), n = 0;
        double ref[V];
        for (int v = 0; v < V; v++)
            ref[v] = 0;
        for (; *line && strncmp(line, "--", 2); n++) {
            char *end;
            long id = strtol(line, &end, 10);
            assert_true(end != line && id >= 0 && id < V);
            ref[id] = strtod(end, &line);
            while (*line == '\n')
                line++;
        }
        assert_true(!strncmp(line, "--\n", 3));
        line += 3;
        print_message("temperature %g, top-k %d, top-p %g: %d tokens (transformers %d)\n", p->temperature, p->top_k,
                      p->top_p, k, n);
        assert_int_equal(k, n);
        for (int i = 0; i < k; i++)
            if (fabs(probs[i] - ref[ids[i]]) > 1e-6)
                fail_msg("token %d: %.9g, transformers %.9g", ids[i], probs[i], ref[ids[i]]);
        gen_sampler_destroy(&s);
    }
}

static void test_top_k_1_and_a_tiny_top_p_equal_greedy(void **state)
{
    gfx_t *g = *state;
    TU_NEED_BIN();
    char greedy[4096], k1[4096], p0[4096];
    const char *args = "--prompt-ids '5 6 7' --ids --max-tokens 30";
    assert_int_equal(run_ctitan(greedy, sizeof(greedy), 0, "generate %s %s --temperature 0", g->ckpt, args), 0);
    assert_int_equal(run_ctitan(k1, sizeof(k1), 0, "generate %s %s --temperature 1.5 --top-k 1 --seed 9", g->ckpt,
                                args), 0);
    assert_int_equal(run_ctitan(p0, sizeof(p0), 0, "generate %s %s --temperature 1 --top-p 1e-9 --seed 9", g->ckpt,
                                args), 0);
    assert_true(strlen(greedy) > 30);
    assert_string_equal(k1, greedy);
    assert_string_equal(p0, greedy);
}

static void test_sampling_with_a_seed_is_reproducible(void **state)
{
    gfx_t *g = *state;
    TU_NEED_BIN();
    char a[4096], b[4096], c[4096], greedy[4096];
    const char *args = "--prompt-ids '5 6 7' --ids --max-tokens 40 --temperature 1 --top-k 50 --top-p 0.95";
    assert_int_equal(run_ctitan(a, sizeof(a), 0, "generate %s %s --seed 1", g->ckpt, args), 0);
    assert_int_equal(run_ctitan(b, sizeof(b), 0, "generate %s %s --seed 1 --threads 1", g->ckpt, args), 0);
    assert_int_equal(run_ctitan(c, sizeof(c), 0, "generate %s %s --seed 2", g->ckpt, args), 0);
    assert_int_equal(run_ctitan(greedy, sizeof(greedy), 0, "generate %s --prompt-ids '5 6 7' --ids --max-tokens 40 "
                                "--temperature 0", g->ckpt), 0);
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    assert_string_not_equal(a, greedy);
}

/* The text prompt, encoded with the tokenizer the checkpoint's manifest names: the same ids as
 * the prompt given as ids; the text streamed is the decoded ids, streamed or not. */
static void test_text_prompt_uses_the_checkpoints_tokenizer_and_streams_its_text(void **state)
{
    gfx_t *g = *state;
    TU_NEED_BIN();
    tok_t *t = NULL;
    char err[256], ids[1024], from_text[4096], from_ids[4096], text[8192], whole[8192];
    assert_int_equal(tok_load(&t, g->tokenizer, err, sizeof(err)), 0);
    const char *prompt = "the quick fox";
    uint32_t enc[64];
    size_t n;
    assert_int_equal(tok_encode(t, (const uint8_t *)prompt, strlen(prompt), enc, &n), 0);
    ids_text(enc, (int)n, ids, sizeof(ids));
    const char *args = "--temperature 0 --max-tokens 25";
    assert_int_equal(run_ctitan(from_text, sizeof(from_text), 0, "generate %s --prompt '%s' --ids %s", g->ckpt, prompt,
                                args), 0);
    assert_int_equal(run_ctitan(from_ids, sizeof(from_ids), 0, "generate %s --prompt-ids '%s' --ids %s", g->ckpt, ids,
                                args), 0);
    assert_string_equal(from_text, from_ids);
    /* the text: the decoded ids, then a newline */
    uint32_t gen[64];
    int k = 0;
    for (char *p = from_ids; *p && *p != '\n'; k++)
        gen[k] = (uint32_t)strtoul(p, &p, 10);
    assert_int_equal(k, 25);
    uint8_t *dec;
    size_t nd;
    assert_int_equal(tok_decode(t, gen, (size_t)k, &dec, &nd), 0);
    assert_int_equal(run_ctitan(text, sizeof(text), 0, "generate %s --prompt '%s' %s", g->ckpt, prompt, args), 0);
    assert_int_equal(run_ctitan(whole, sizeof(whole), 0, "generate %s --prompt '%s' %s --no-stream", g->ckpt, prompt,
                                args), 0);
    assert_int_equal(strlen(text), nd + 1);
    assert_memory_equal(text, dec, nd);
    assert_string_equal(text, whole);
    /* the summary goes to stderr */
    assert_int_equal(run_ctitan(text, sizeof(text), 1, "generate %s --prompt '%s' %s", g->ckpt, prompt, args), 0);
    assert_non_null(strstr(text, "tokens/s"));
    assert_non_null(strstr(text, "stopped at max tokens"));
    free(dec);
    tok_destroy(&t);
}

/* A tokenizer smaller than the model's vocabulary: ids it cannot decode are never drawn. */
static void test_ids_past_the_tokenizers_vocabulary_are_never_generated(void **state)
{
    gfx_t *g = *state;
    TU_NEED_BIN();
    tok_t *t = NULL;
    char err[256], small[300], out[8192];
    snprintf(small, sizeof(small), "%s/small.bin", g->dir);
    assert_int_equal(tok_train(&t, (const uint8_t *)corpus, sizeof(corpus) - 1, 260, err, sizeof(err)), 0);
    assert_int_equal(tok_save(t, small, err, sizeof(err)), 0);
    tok_destroy(&t);
    assert_int_equal(run_ctitan(out, sizeof(out), 0, "generate %s --tokenizer %s --prompt-ids '5 6 7' --ids "
                                "--temperature 3 --max-tokens 60 --seed 4", g->ckpt, small), 0);
    int k = 0;
    for (char *p = out; *p && *p != '\n'; k++)
        assert_in_range(strtoul(p, &p, 10), 0, 259);
    assert_int_equal(k, 60);
}

/* Exit status 2 and the flag named, for each bad argument; 1 and the path for a bad model. */
static void test_bad_arguments_are_refused_naming_the_flag(void **state)
{
    gfx_t *g = *state;
    TU_NEED_BIN();
    static const struct {
        const char *args, *says;
        int status;
    } cases[] = {
        {"--temperature -1", "--temperature", 2},
        {"--temperature warm", "--temperature", 2},
        {"--top-k -3", "--top-k", 2},
        {"--top-k 2.5", "--top-k", 2},
        {"--top-p 0", "--top-p", 2},
        {"--top-p 1.01", "--top-p", 2},
        {"--max-tokens 0", "--max-tokens", 2},
        {"--threads 0", "--threads", 2},
        {"--seed -1", "--seed", 2},
        {"--frobnicate", "--frobnicate", 2},
        {"--device tpu", "--device", 2},
        {"--device cuda", "/nonexistent/plugin.so", 1}, /* CTITAN_CUDA_PLUGIN below */
        {"--max-tokens", "--max-tokens needs a value", 2},
        {"--prompt-ids '1 300'", "--prompt-ids", 1},
        {"--prompt-ids '1 x'", "--prompt-ids", 1},
        {"--prompt-file /nonexistent/p.txt", "--prompt-file", 1},
        {"--prompt-file /dev/zero", "not a regular file", 1}, /* read whole before: without end */
        {"--tokenizer /nonexistent/t.bin", "/nonexistent/t.bin", 1},
        {"--bos", "--bos: the tokenizer has no BOS token", 1},
        {"--prompt ''", "the prompt is empty", 1},
    };
    char out[4096];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *prompt = strstr(cases[i].args, "--prompt") ? "" : "--prompt hi ";
        if (strstr(cases[i].args, "--device cuda")) /* a plugin that is not there: its path named */
            setenv("CTITAN_CUDA_PLUGIN", "/nonexistent/plugin.so", 1);
        int rc = run_ctitan(out, sizeof(out), 1, "generate %s %s%s", g->ckpt, prompt, cases[i].args);
        unsetenv("CTITAN_CUDA_PLUGIN");
        if (rc != cases[i].status || !strstr(out, cases[i].says))
            fail_msg("'%s': exit %d (expected %d), said: %s", cases[i].args, rc, cases[i].status, out);
    }
    assert_int_equal(run_ctitan(out, sizeof(out), 1, "generate %s", g->ckpt), 2);
    assert_non_null(strstr(out, "--prompt"));
    assert_int_equal(run_ctitan(out, sizeof(out), 1, "generate %s --prompt a --prompt-ids 1", g->ckpt), 2);
    assert_non_null(strstr(out, "only one"));
    assert_int_equal(run_ctitan(out, sizeof(out), 1, "generate --prompt a"), 2);
    /* no tokenizer named by the checkpoint, and text in or out */
    assert_int_equal(run_ctitan(out, sizeof(out), 1, "generate %s --prompt a", g->scaled), 1);
    assert_non_null(strstr(out, "--tokenizer"));
    assert_int_equal(run_ctitan(out, sizeof(out), 1, "--help"), 0);
    assert_non_null(strstr(out, "generate"));
}

/* --device cuda (on the emulated GPU: its plugin runs kernels/cuda/infer.cu on the CPU) gives
 * the CPU's greedy text, from a prompt longer than one matrix-vector pass, also with Llama 3.1's
 * rotary scaling; and, sampling with a seed, the same draws. */
static void test_device_cuda_generates_the_cpus_text(void **state)
{
    gfx_t *g = *state;
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char cpu[8192], gpu[8192];
    const char *model[] = {g->ckpt, g->ckpt, g->scaled};
    const char *args[] = {"--prompt-ids '17 4 250 99 3 3 180' --ids --temperature 0 --max-tokens 24",
                          "--prompt-ids '5 6 7' --ids --temperature 0.7 --top-k 40 --seed 9 --max-tokens 24",
                          ("--prompt-ids '1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20' --ids --temperature 0 "
                           "--max-tokens 24")};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(run_ctitan(cpu, sizeof(cpu), 0, "generate %s %s --device cpu", model[i], args[i]), 0);
        int rc = run_ctitan(gpu, sizeof(gpu), 0, "generate %s %s --device cuda", model[i], args[i]);
        if (rc) {
            run_ctitan(gpu, sizeof(gpu), 1, "generate %s %s --device cuda", model[i], args[i]);
            fail_msg("--device cuda: exit %d: %s", rc, gpu);
        }
        *strchr(cpu, '\n') = 0;
        assert_non_null(strchr(gpu, '\n'));
        *strchr(gpu, '\n') = 0;
        print_message("cpu:  %s\ncuda: %s\n", cpu, gpu);
        assert_string_equal(gpu, cpu);
        assert_int_equal(strlen(cpu) > 24, 1);
    }
    unsetenv("CTITAN_CUDA_PLUGIN");
}

static void test_bad_models_are_refused_naming_the_path(void **state)
{
    gfx_t *g = *state;
    TU_NEED_BIN();
    char out[4096], hf[300];
    assert_int_equal(run_ctitan(out, sizeof(out), 1, "generate /nonexistent/ckpt --prompt a"), 1);
    assert_non_null(strstr(out, "/nonexistent/ckpt"));
    assert_int_equal(run_ctitan(out, sizeof(out), 1, "generate %s --prompt a", g->dir), 1);
    assert_non_null(strstr(out, "neither a checkpoint"));
    snprintf(hf, sizeof(hf), "%s/hf", g->dir);
    assert_int_equal(mkdir(hf, 0755), 0);
    char cfg[400];
    snprintf(cfg, sizeof(cfg), "%s/config.json", hf);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\"}\n", f);
    fclose(f);
    assert_int_equal(run_ctitan(out, sizeof(out), 1, "generate %s --prompt a", hf), 1);
    assert_non_null(strstr(out, "config.json")); /* what it lacks, named */
    assert_non_null(strstr(out, "hidden_size"));
    /* a checkpoint folder: its newest checkpoint */
    char folder[300], a[4096], b[4096];
    snprintf(folder, sizeof(folder), "%s/plain", g->dir);
    assert_int_equal(run_ctitan(a, sizeof(a), 0, "generate %s --prompt-ids 3 --ids --temperature 0", folder), 0);
    assert_int_equal(run_ctitan(b, sizeof(b), 0, "generate %s --prompt-ids 3 --ids --temperature 0", g->ckpt), 0);
    assert_string_equal(a, b);
}

/* A checkpoint folder's newest checkpoint is read for its weights alone, each chunk checked as
 * it is read (no verify of the optimizer's arrays first): damage in its exp_avg does not keep
 * generate from it; damage in its weights passes it over, saying why (here none is left). */
static void test_gen_load_weights_from_a_folder_reads_only_the_weights(void **state)
{
    gfx_t *g = *state;
    gen_model_t m;
    char err[1024], step[256], folder[300], file[400];
    assert_int_equal(write_ckpt(g->dir, "damaged", &g->cfg, 23, "", step, sizeof(step)), 0);
    snprintf(folder, sizeof(folder), "%s/damaged", g->dir);
    snprintf(file, sizeof(file), "%s/exp_avg.bin", step);
    assert_int_equal(tu_flip_byte(file, CKPT_DATA_HDR + 40), 0);
    assert_int_equal(gen_load_weights(folder, &m, err, sizeof(err)), 0);
    assert_string_equal(m.source, step);
    size_t n;
    float *w = test_weights(&g->cfg, 23, &n);
    assert_int_equal(m.n, n);
    assert_memory_equal(m.w, w, n * sizeof(float));
    free(w);
    gen_model_free(&m);
    snprintf(file, sizeof(file), "%s/model.bin", step);
    assert_int_equal(tu_flip_byte(file, CKPT_DATA_HDR + 40), 0);
    assert_int_equal(gen_load_weights(folder, &m, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "no checkpoint there verifies"));
    assert_null(m.w);
}

static void test_gen_load_weights_reads_the_checkpoint_model(void **state)
{
    gfx_t *g = *state;
    gen_model_t m;
    char err[512];
    assert_int_equal(gen_load_weights(g->scaled, &m, err, sizeof(err)), 0);
    assert_null(config_diff(&m.cfg, &g->cfg_scaled, &(double){0}, &(double){0}));
    size_t n;
    float *w = test_weights(&g->cfg_scaled, 22, &n);
    assert_int_equal(m.n, n);
    assert_memory_equal(m.w, w, n * sizeof(float));
    assert_string_equal(m.tokenizer_path, "");
    free(w);
    gen_model_free(&m);
    assert_int_equal(gen_load_weights(g->ckpt, &m, err, sizeof(err)), 0);
    assert_string_equal(m.tokenizer_path, g->tokenizer);
    gen_model_free(&m);
}

/* A prompt longer than one prefill pass (256 tokens): the first new token is the whole-window
 * model's argmax at the prompt's last position. */
static void test_a_long_prompt_goes_in_several_passes(void **state)
{
    model_config_t c = test_config(0);
    c.max_seq_len = 320;
    size_t nw;
    float *w = test_weights(&c, 13, &nw);
    enum { P = 300 };
    int32_t tok[P];
    uint32_t prompt[P];
    random_tokens(tok, P, c.vocab_size, 8);
    for (int i = 0; i < P; i++)
        prompt[i] = (uint32_t)tok[i];
    model_t *m = model_new(&c, 0, c.n_layers + 2, w, NULL, NULL);
    model_acts_t *a = model_acts_new(m, 1, P);
    assert_non_null(a);
    model_forward(m, a, tok, NULL, NULL, 0, NULL);
    const float *last = model_logits(a) + (size_t)(P - 1) * c.vocab_size;
    int best = 0;
    for (int v = 1; v < c.vocab_size; v++)
        best = last[v] > last[best] ? v : best;
    gen_params_t p = {.temperature = 0, .top_p = 1};
    gen_stats_t st;
    char err[256];
    collect_t out = {0};
    assert_int_equal(gen_run(&c, w, NULL, NULL, &p, prompt, P, 3, NULL, 0, c.vocab_size, collect, &out, &st, err,
                             sizeof(err)), 0);
    assert_int_equal(out.n, 3);
    assert_int_equal(out.ids[0], best);
    assert_int_equal(st.prompt_tokens, P);
    model_acts_destroy(&a);
    model_destroy(&m);
    free(w);
}

int main(void)
{
    const struct CMUnitTest unit[] = {
        cmocka_unit_test(test_kv_cache_logits_equal_the_full_forward_one_token_at_a_time),
        cmocka_unit_test(test_kv_cache_logits_equal_the_full_forward_in_one_prefill),
        cmocka_unit_test(test_kv_cache_logits_equal_the_full_forward_in_uneven_passes),
        cmocka_unit_test(test_greedy_takes_the_lowest_id_among_equal_highest_logits),
        cmocka_unit_test(test_top_k_and_top_p_keep_only_their_tokens),
        cmocka_unit_test(test_a_seed_gives_the_same_draws),
        cmocka_unit_test(test_params_check_names_the_flag),
        cmocka_unit_test(test_utf8_hold_back_keeps_only_an_incomplete_last_character),
        cmocka_unit_test(test_generation_stops_at_eos_max_tokens_and_max_seq_len),
        cmocka_unit_test(test_a_long_prompt_goes_in_several_passes),
    };
    const struct CMUnitTest cli[] = {
        cmocka_unit_test(test_gen_load_weights_reads_the_checkpoint_model),
        cmocka_unit_test(test_gen_load_weights_from_a_folder_reads_only_the_weights),
        cmocka_unit_test(test_greedy_equals_transformers_generate),
        cmocka_unit_test(test_greedy_from_a_hugging_face_folder_equals_transformers),
        cmocka_unit_test(test_greedy_equals_transformers_generate_with_llama3_rope_scaling_after_a_long_prompt),
        cmocka_unit_test(test_the_distribution_is_that_of_transformers_warpers),
        cmocka_unit_test(test_top_k_1_and_a_tiny_top_p_equal_greedy),
        cmocka_unit_test(test_sampling_with_a_seed_is_reproducible),
        cmocka_unit_test(test_text_prompt_uses_the_checkpoints_tokenizer_and_streams_its_text),
        cmocka_unit_test(test_ids_past_the_tokenizers_vocabulary_are_never_generated),
        cmocka_unit_test(test_bad_arguments_are_refused_naming_the_flag),
        cmocka_unit_test(test_device_cuda_generates_the_cpus_text),
        cmocka_unit_test(test_bad_models_are_refused_naming_the_path),
    };
    int failed = tu_run_group_tests_name("generate", unit, NULL, NULL);
    return failed | tu_run_group_tests_name("generate_cli", cli, group_setup, group_teardown);
}
