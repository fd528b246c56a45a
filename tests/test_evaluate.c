/* What a trainer does with finished weights (stages/report/evaluate.h): the sample, greedy at
 * temperature 0 (each token the argmax of its logits over the whole context, up to the model's
 * max_seq_len), sampled above it, and refused below it; the validation loss, the bits of a
 * training forward in one layer's memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cpu/model.h"
#include "stages/data/tokfile.h"
#include "stages/report/evaluate.h"
#include "tests/testutil.h"

#define PROMPT 8 /* eval_sample's prompt: the first 8 tokens of its file */
#define CTX 24     /* the model's max_seq_len: 16 new tokens at most */

typedef struct {
    model_config_t cfg;
    param_table_t tab;
    float *w; /* (total) */
    pool_t *pool;
    tok_t *tok;
    tokfile_t *prompt, *short_file; /* PROMPT tokens and more; PROMPT - 1 */
    uint32_t seq[CTX];
} fixture_t;

/* A token file of n ids of seq at path, opened; the file is gone when this returns. */
static tokfile_t *token_file(const fixture_t *f, const char *path, size_t n)
{
    char err[256];
    tokfile_t *tf = NULL;
    assert_int_equal(tokfile_write(path, f->seq, n, f->cfg.vocab_size, err, sizeof(err)), 0);
    int rc = tokfile_open(&tf, path, f->cfg.vocab_size, err, sizeof(err));
    unlink(path);
    assert_int_equal(rc, 0);
    return tf;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    char err[256], dir[] = "/tmp/ctitan-evalXXXXXX", path[64];
    config_preset("tiny", &f->cfg); /* dim 16, 2 layers */
    f->cfg.vocab_size = 300; /* a byte-level tokenizer's 256 and its merges */
    f->cfg.max_seq_len = CTX;
    assert_int_equal(config_validate(&f->cfg, err, sizeof(err)), 0);
    assert_int_equal(params_table_init(&f->tab, &f->cfg), 0);
    f->w = malloc(f->tab.total * sizeof(float));
    params_init(&f->tab, &f->cfg, 7, f->w, 0, f->tab.total);
    f->pool = pool_new(2);
    static char corpus[1 << 16];
    size_t n = 0;
    for (int i = 0; i < 4000; i++)
        n += (size_t)snprintf(corpus + n, sizeof(corpus) - n, "w%d%s", (i * 7) % 61, i % 9 == 8 ? ".\n" : " ");
    assert_int_equal(tok_train(&f->tok, (const uint8_t *)corpus, n, 290, err, sizeof(err)), 0);
    uint64_t s = 3;
    for (int i = 0; i < CTX; i++)
        f->seq[i] = (uint32_t)(tu_next(&s) % 290);
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/prompt.bin", dir);
    f->prompt = token_file(f, path, CTX);
    f->short_file = token_file(f, path, PROMPT - 1);
    rmdir(dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    tokfile_close(&f->prompt);
    tokfile_close(&f->short_file);
    tok_destroy(&f->tok);
    pool_destroy(&f->pool);
    params_table_free(&f->tab);
    free(f->w);
    free(f);
    return 0;
}

/* eval_sample's whole output at this temperature, seed and length, into buf; returns its rc. */
static int sample(fixture_t *f, double temperature, uint64_t seed, int ntokens, char *buf, size_t n, char *err)
{
    FILE *out = fmemopen(buf, n, "w");
    assert_non_null(out);
    int rc = eval_sample(&f->cfg, f->w, f->pool, NULL, f->tok, f->prompt, ntokens, temperature, seed, out, err, 256);
    assert_int_equal(fclose(out), 0);
    return rc;
}

/* What eval_sample must write for the prompt and these new ids (the footer when it stopped
 * before ntokens at max_seq_len), into buf. */
static void expected(fixture_t *f, const uint32_t *ids, int n, const char *how, int stopped, char *buf, size_t len)
{
    uint8_t *text;
    size_t nb;
    assert_int_equal(tok_decode(f->tok, ids, (size_t)n, &text, &nb), 0);
    int at = snprintf(buf, len, "\n--- sample (prompt: the first %d validation tokens%s) ---\n%.*s", PROMPT, how,
                      (int)nb, (const char *)text);
    if (stopped)
        at += snprintf(buf + at, len - at, "\n--- %d tokens, stopped at max_seq_len", n - PROMPT);
    snprintf(buf + at, len - at, "\n---\n");
    free(text);
}

/* Greedy decoding is the argmax of the logits at every position, computed here on our own: the
 * whole model over the prompt and every token so far (zeros after them), the first highest
 * logit of the last one among the tokenizer's ids. The text is theirs decoded; it stops at the
 * model's max_seq_len, saying so, and a shorter sample is its beginning. */
static void test_evaluate_greedy_sample_is_the_argmax_of_the_logits(void **state)
{
    fixture_t *f = *state;
    int T = CTX, V = f->cfg.vocab_size, limit = tok_vocab_size(f->tok), distinct = 0;
    uint32_t ids[CTX];
    memcpy(ids, f->seq, PROMPT * sizeof(uint32_t));
    model_t *m = model_new(&f->cfg, 0, f->cfg.n_layers + 2, f->w, NULL, f->pool);
    model_acts_t *acts = model_acts_new(m, 1, T);
    int32_t ctx[CTX];
    for (int n = PROMPT; n < T; n++) {
        memset(ctx, 0, sizeof(ctx));
        for (int i = 0; i < n; i++)
            ctx[i] = (int32_t)ids[i];
        model_forward(m, acts, ctx, NULL, NULL, 0, NULL);
        const float *lg = model_logits(acts) + (size_t)(n - 1) * V;
        int want = 0;
        for (int v = 0; v < limit; v++)
            if (lg[v] > lg[want])
                want = v;
        ids[n] = (uint32_t)want;
        distinct += n == PROMPT || ids[n] != ids[n - 1];
    }
    model_acts_destroy(&acts);
    model_destroy(&m);
    assert_true(distinct > 1); /* not a constant the model happens to prefer everywhere */
    static char got[8192], want[8192];
    char err[256];
    assert_int_equal(sample(f, 0, 1, 100, got, sizeof(got), err), 0);
    expected(f, ids, CTX, ", greedy", 1, want, sizeof(want));
    assert_string_equal(got, want);
    assert_int_equal(sample(f, 0, 99, 5, got, sizeof(got), err), 0); /* the seed does not matter */
    expected(f, ids, PROMPT + 5, ", greedy", 0, want, sizeof(want));
    assert_string_equal(got, want);
}

/* Above 0 the temperature samples: the seed decides and is reproducible, and a hot enough draw
 * leaves the argmax path. */
static void test_evaluate_positive_temperature_samples_from_the_seed(void **state)
{
    fixture_t *f = *state;
    static char g[8192], a[8192], b[8192], c[8192];
    char err[256];
    assert_int_equal(sample(f, 0, 1, 12, g, sizeof(g), err), 0);
    assert_int_equal(sample(f, 50.0, 1, 12, a, sizeof(a), err), 0);
    assert_int_equal(sample(f, 50.0, 1, 12, b, sizeof(b), err), 0);
    assert_int_equal(sample(f, 50.0, 2, 12, c, sizeof(c), err), 0);
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    assert_string_not_equal(strstr(a, " ---\n"), strstr(g, " ---\n")); /* the texts, past the headers */
}

/* A negative temperature and a prompt file too short are refused, saying why, writing nothing. */
static void test_evaluate_bad_samples_are_refused_writing_nothing(void **state)
{
    fixture_t *f = *state;
    char buf[256] = "", err[256];
    assert_int_equal(sample(f, -1.0, 1, 4, buf, sizeof(buf), err), -EINVAL);
    assert_non_null(strstr(err, "temperature"));
    assert_int_equal(sample(f, NAN, 1, 4, buf, sizeof(buf), err), -EINVAL);
    assert_string_equal(buf, "");
    FILE *out = fmemopen(buf, sizeof(buf), "w");
    assert_int_equal(eval_sample(&f->cfg, f->w, f->pool, NULL, f->tok, f->short_file, 4, 0, 1, out, err, sizeof(err)),
                     -EINVAL);
    fclose(out);
    assert_string_equal(buf, "");
    assert_non_null(strstr(err, "fewer than 8 tokens"));
}

/* A process's resident set (field "VmRSS:") or its peak ("VmHWM:"), in bytes; 0 if unread. */
static size_t status_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0, n = strlen(field);
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, field, n))
            kb = strtoull(line + n, NULL, 10);
    if (f)
        fclose(f);
    return kb * 1024;
}

/* The validation loss is the mean of training forwards' losses (mode none, computed here on
 * our own) bit for bit, through the backend table (eval_loss_on, the CPU's) too, and holds one
 * layer's activations at a time, not every layer's: in a child (allocations over 64 KiB mapped
 * afresh, no huge pages, the peak reset) the resident set grows by what
 * model_acts_forward_bytes_for says, within 20% (50% under ASan), where a forward keeping all 8
 * layers (the attention's probabilities 8 MiB each) would hold several times it. */
static void test_evaluate_loss_is_a_training_forward_in_one_layers_memory(void **state)
{
    (void)state;
    enum { B = 2, T = 512, BATCHES = 2, COUNT = 4000 };
    model_config_t cfg;
    char err[256], dir[] = "/tmp/ctitan-evalXXXXXX", path[64];
    config_preset("tiny", &cfg);
    cfg.dim = 64, cfg.n_layers = 8, cfg.n_heads = 4, cfg.n_kv_heads = 2, cfg.vocab_size = 64;
    cfg.max_seq_len = T;
    assert_int_equal(config_validate(&cfg, err, sizeof(err)), 0);
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, &cfg), 0);
    float *w = malloc(tab.total * sizeof(float));
    params_init(&tab, &cfg, 11, w, 0, tab.total);
    uint32_t *tok = malloc(COUNT * sizeof(uint32_t));
    uint64_t s = 5;
    for (int i = 0; i < COUNT; i++)
        tok[i] = (uint32_t)(tu_next(&s) % (uint64_t)cfg.vocab_size);
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/val.bin", dir);
    assert_int_equal(tokfile_write(path, tok, COUNT, cfg.vocab_size, err, sizeof(err)), 0);
    tokfile_t *tf;
    int opened = tokfile_open(&tf, path, cfg.vocab_size, err, sizeof(err));
    unlink(path); /* mapped now: nothing stays behind, whatever fails below */
    rmdir(dir);
    assert_int_equal(opened, 0);

    int used, N = B * T;
    double got = eval_loss(&cfg, w, NULL, tf, B, T, BATCHES, &used, NULL), want = 0;
    model_t *m = model_new(&cfg, 0, cfg.n_layers + 2, w, NULL, NULL);
    model_acts_t *a = model_acts_new(m, B, T);
    int32_t *tk = malloc(N * sizeof(int32_t)), *tg = malloc(N * sizeof(int32_t)), win[T + 1];
    size_t cur = 0;
    for (int b = 0; b < BATCHES; b++) {
        eval_next_batch(tf, &cur, B, T, tk, tg, win);
        want += model_forward(m, a, tk, NULL, tg, 1.0f / N, NULL) / N;
    }
    want /= BATCHES;
    model_acts_destroy(&a);
    model_destroy(&m);
    assert_int_equal(used, BATCHES);
    assert_memory_equal(&got, &want, sizeof(got));

    size_t planned = model_acts_forward_bytes_for(&cfg, 0, cfg.n_layers + 2, B, T);
    size_t probs = (size_t)B * cfg.n_heads * T * T * sizeof(float);
    assert_true(planned < 2 * probs); /* one layer's probabilities, not eight */
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        mallopt(M_MMAP_THRESHOLD, 64 * 1024);
        prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0); /* pages counted as touched, not 2 MiB at a time */
        FILE *cr = fopen("/proc/self/clear_refs", "w");
        int reset = cr && fputs("5", cr) >= 0;
        if (cr && fclose(cr))
            reset = 0;
        size_t before = status_bytes("VmRSS:"), grew = 0;
        double l = eval_loss(&cfg, w, NULL, tf, B, T, BATCHES, &used, NULL);
        if (reset && before && l == got)
            grew = status_bytes("VmHWM:") - before;
        ssize_t wr = write(fd[1], &grew, sizeof(grew));
        _exit(wr == sizeof(grew) ? 0 : 1);
    }
    close(fd[1]);
    size_t grew = 0;
    assert_int_equal(read(fd[0], &grew, sizeof(grew)), sizeof(grew));
    close(fd[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!grew)
        fail_msg("the child could not measure its peak (/proc/self/clear_refs, VmHWM)");
    printf("# eval_loss: resident set grew %.1f MiB, planned %.1f MiB (8 layers' probabilities alone %.1f)\n",
           grew / 1048576.0, planned / 1048576.0, 8 * probs / 1048576.0);
    double over = 1.2;
#if defined(__SANITIZE_ADDRESS__)
    over = 1.5; /* the sanitizer's shadow (an eighth more) and redzones */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    over = 1.5;
#endif
#endif
    assert_true(grew > planned * 0.8 && grew < planned * over);

    /* the same through the backend table (a GPU job's way): the CPU's backend gives the bits */
    double on = eval_loss_on(backend_cpu(), &cfg, w, tf, B, T, BATCHES, &used, NULL, err, sizeof(err));
    assert_int_equal(used, BATCHES);
    assert_memory_equal(&on, &want, sizeof(on));
    /* saying how far it is (every batch here: every_s 0), of the batches that fit (3 of 4000
     * tokens at 1024 a batch, 10 asked), on stderr, both ways */
    int saved = dup(2);
    FILE *said = tmpfile();
    assert_true(saved >= 0 && said != NULL);
    fflush(stderr);
    assert_true(dup2(fileno(said), 2) >= 0);
    eval_say_t say = {"t", 0.0}, say_on = {"u", 0.0};
    int used_on = 0;
    eval_loss(&cfg, w, NULL, tf, B, T, 10, &used, &say);
    eval_loss_on(backend_cpu(), &cfg, w, tf, B, T, 10, &used_on, &say_on, err, sizeof(err));
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char text[1024] = "";
    rewind(said);
    size_t got_n = fread(text, 1, sizeof(text) - 1, said);
    text[got_n] = 0;
    fclose(said);
    assert_int_equal(used, 3);
    assert_int_equal(used_on, 3);
    for (int k = 1; k <= 3; k++) {
        char line[64];
        snprintf(line, sizeof(line), "t: validation: %d of 3 batches (", k);
        assert_non_null(strstr(text, line));
        snprintf(line, sizeof(line), "u: validation: %d of 3 batches (", k);
        assert_non_null(strstr(text, line));
    }
    cfg.max_seq_len = T / 2; /* a batch longer than the model's positions: refused, saying why */
    on = eval_loss_on(backend_cpu(), &cfg, w, tf, B, T, BATCHES, &used, NULL, err, sizeof(err));
    assert_true(isnan(on) && used == 0 && err[0]);

    free(tk), free(tg), free(tok), free(w);
    tokfile_close(&tf);
    params_table_free(&tab);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evaluate_greedy_sample_is_the_argmax_of_the_logits),
        cmocka_unit_test(test_evaluate_positive_temperature_samples_from_the_seed),
        cmocka_unit_test(test_evaluate_bad_samples_are_refused_writing_nothing),
        cmocka_unit_test(test_evaluate_loss_is_a_training_forward_in_one_layers_memory),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
