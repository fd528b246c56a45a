/* Evaluation helpers (see evaluate.h). */
#include "stages/report/evaluate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"
#include "kernels/cpu/model.h"
#include "stages/report/generate.h"

void eval_next_batch(const tokfile_t *tf, size_t *cursor, int B, int T, int32_t *tok, int32_t *tgt,
                     int32_t *window)
{
    size_t n = tokfile_count(tf);
    for (int b = 0; b < B; b++) {
        if (*cursor + T + 1 > n)
            *cursor = 0;
        tokfile_read(tf, *cursor, (size_t)T + 1, window);
        memcpy(tok + (size_t)b * T, window, T * sizeof(int32_t));
        memcpy(tgt + (size_t)b * T, window + 1, T * sizeof(int32_t));
        *cursor += T;
    }
}

/* A forward with nothing kept for a backward: under full activation checkpointing each layer
 * keeps only its input and runs in the one work set of each kind the forward reuses, so a
 * [B, T] evaluation holds one layer's tensors instead of every layer's (a ~1B at 4 x 2048: the
 * attention's probabilities alone are 1 GiB a layer on the CPU). The mode changes what is
 * kept, never the arithmetic: the same bits as mode none. */
static model_t *forward_model(const model_config_t *cfg, float *w, pool_t *pool)
{
    model_config_t c = *cfg;
    c.ac_mode = CONFIG_AC_FULL;
    return model_new(&c, 0, c.n_layers + 2, w, NULL, pool);
}

/* The batches that fit tf, of the `batches` asked (each window needs its N tokens and the target
 * after the last). */
static int eval_batches(const tokfile_t *tf, int N, int batches)
{
    size_t fit = tokfile_count(tf) > 0 ? (tokfile_count(tf) - 1) / (size_t)N : 0;
    return fit < (size_t)batches ? (int)fit : batches;
}

/* eval_say_t's line after batch done of n, when it is due. */
static void eval_said(const eval_say_t *say, util_every_t *e, int done, int n)
{
    double secs = say ? util_every_due(e) : -1;
    if (secs >= 0)
        fprintf(stderr, "%s: validation: %d of %d batches (%.0f s)\n", say->who, done, n, secs);
}

double eval_loss(const model_config_t *cfg, float *w, pool_t *pool, const tokfile_t *tf, int B, int T,
                 int batches, int *used, const eval_say_t *say)
{
    util_every_t every;
    util_every_start(&every, say ? say->every_s : 0);
    int N = B * T, vb = 0, n = eval_batches(tf, N, batches);
    double sum = 0;
    model_t *m = forward_model(cfg, w, pool);
    model_acts_t *a = m ? model_acts_new(m, B, T) : NULL;
    int32_t *tk = malloc((size_t)N * sizeof(int32_t)), *tg = malloc((size_t)N * sizeof(int32_t));
    int32_t *win = malloc(((size_t)T + 1) * sizeof(int32_t));
    size_t cur = 0;
    if (a && tk && tg && win)
        for (; vb < n; vb++) {
            eval_next_batch(tf, &cur, B, T, tk, tg, win);
            sum += model_forward(m, a, tk, NULL, tg, 1.0f / N, NULL) / N;
            eval_said(say, &every, vb + 1, n);
        }
    free(tk), free(tg), free(win);
    model_acts_destroy(&a);
    model_destroy(&m);
    *used = vb;
    return vb ? sum / vb : NAN;
}

double eval_loss_on(const backend_t *be, const model_config_t *cfg, float *w, const tokfile_t *tf, int B, int T,
                    int batches, int *used, const eval_say_t *say, char *err, size_t errlen)
{
    util_every_t every;
    util_every_start(&every, say ? say->every_s : 0);
    model_config_t c = *cfg;
    c.ac_mode = CONFIG_AC_FULL; /* as eval_loss: one layer's activations at a time */
    c.forward_only = 1;         /* no backward: the CUDA head computes the loss alone */
    int N = B * T, vb = 0, rc = 0, n = eval_batches(tf, N, batches);
    double sum = 0, loss;
    param_table_t tab = {0};
    backend_model_t *m = NULL;
    backend_acts_t *a = NULL;
    /* with host weights the backend wants a host buffer for gradients too (offload's write-back,
     * step_end): never called here, so its pages are never touched */
    float *g = params_table_init(&tab, &c) ? NULL : malloc(tab.total * sizeof(float));
    int32_t *tk = malloc((size_t)N * sizeof(int32_t)), *tg = malloc((size_t)N * sizeof(int32_t));
    int32_t *win = malloc(((size_t)T + 1) * sizeof(int32_t));
    size_t cur = 0;
    int host = !g || !tk || !tg || !win; /* this side's memory, not the backend's */
    if (host)
        rc = -ENOMEM;
    else if (!(rc = be->model_new(&m, &c, 0, c.n_layers + 2, w, g, 1)) && !(rc = be->acts_new(&a, m, B, T)))
        rc = be->step_begin(m); /* the weights onto the device */
    for (; !rc && vb < n; vb++) {
        eval_next_batch(tf, &cur, B, T, tk, tg, win);
        if (!(rc = be->forward(m, a, tk, NULL, tg, 1.0f / N, NULL, &loss)))
            sum += loss / N;
        if (!rc)
            eval_said(say, &every, vb + 1, n);
    }
    if (rc)
        snprintf(err, errlen, "%s", host ? "out of host memory" : be->last_error());
    be->acts_destroy(&a);
    be->model_destroy(&m);
    free(tk), free(tg), free(win), free(g);
    params_table_free(&tab);
    *used = rc ? 0 : vb;
    return rc || !vb ? NAN : sum / vb;
}

/* Collects the sample's new tokens after the prompt in seq. */
typedef struct {
    uint32_t *seq;
    int n, cap;
} sample_out_t;

static int keep_token(void *ctx, uint32_t token)
{
    sample_out_t *o = ctx;
    if (o->n < o->cap)
        o->seq[o->n++] = token;
    return 0;
}

size_t eval_sample_bytes(const model_config_t *cfg, int ntokens)
{
    return gen_run_bytes(cfg, EVAL_SAMPLE_PROMPT, ntokens) + ((size_t)EVAL_SAMPLE_PROMPT + ntokens) * sizeof(uint32_t);
}

int eval_sample(const model_config_t *cfg, const float *w, pool_t *pool, const cuda_plugin_t *gpu, tok_t *tok,
                const tokfile_t *prompt_src, int ntokens, double temperature, uint64_t seed, FILE *out, char *err,
                size_t errlen)
{
    enum { PROMPT = EVAL_SAMPLE_PROMPT };
    if (tokfile_count(prompt_src) < (size_t)PROMPT)
        return util_fail(err, errlen, -EINVAL, "the prompt's file holds fewer than %d tokens", PROMPT);
    sample_out_t o = {.seq = calloc((size_t)PROMPT + ntokens, sizeof(uint32_t)), .n = PROMPT, .cap = PROMPT + ntokens};
    if (!o.seq)
        return util_fail(err, errlen, -ENOMEM, "out of memory for %d tokens", o.cap);
    int32_t first[PROMPT];
    tokfile_read(prompt_src, 0, PROMPT, first);
    for (int i = 0; i < PROMPT; i++)
        o.seq[i] = (uint32_t)first[i];
    const gen_params_t p = {.temperature = temperature, .top_k = 0, .top_p = 1, .seed = seed};
    int eos = tok_eos(tok), limit = tok_vocab_size(tok) < cfg->vocab_size ? tok_vocab_size(tok) : cfg->vocab_size;
    gen_stats_t st;
    uint8_t *text = NULL;
    size_t nb;
    int rc = gen_run(cfg, w, pool, gpu, &p, o.seq, PROMPT, ntokens, &eos, eos >= 0, limit, keep_token, &o, &st, err,
                     errlen);
    if (!rc && o.n > PROMPT && (int)o.seq[o.n - 1] == eos)
        o.n--; /* EOS ends the text, unwritten (as `ctitan generate`) */
    if (!rc && (rc = tok_decode(tok, o.seq, (size_t)o.n, &text, &nb)))
        util_fail(err, errlen, rc, "decoding the sample: %s", strerror(-rc));
    if (!rc) {
        fprintf(out, "\n--- sample (prompt: the first %d validation tokens%s%s) ---\n", PROMPT,
                temperature == 0 ? ", greedy" : "", gpu ? ", on the GPU" : "");
        fwrite(text, 1, nb, out);
        if (strcmp(st.stop, "max tokens"))
            fprintf(out, "\n--- %d tokens, stopped at %s", st.new_tokens, st.stop);
        fprintf(out, "\n---\n");
    }
    free(text);
    free(o.seq);
    return rc;
}

double eval_unigram_entropy(const tokfile_t *tf, size_t max_tokens)
{
    size_t n = tokfile_count(tf) < max_tokens ? tokfile_count(tf) : max_tokens, V = 0;
    for (size_t i = 0; i < n; i++) {
        size_t t = tokfile_get(tf, i);
        V = t + 1 > V ? t + 1 : V;
    }
    uint64_t *count = calloc(V ? V : 1, sizeof(uint64_t));
    if (!count || !n) {
        free(count);
        return NAN;
    }
    for (size_t i = 0; i < n; i++)
        count[tokfile_get(tf, i)]++;
    double h = 0;
    for (size_t v = 0; v < V; v++)
        if (count[v]) {
            double p = (double)count[v] / n;
            h -= p * log(p);
        }
    free(count);
    return h;
}
