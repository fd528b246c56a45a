/* Evaluation helpers (see evaluate.h). */
#include "stages/report/evaluate.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/model.h"

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

double eval_loss(const model_config_t *cfg, float *w, pool_t *pool, const tokfile_t *tf, int B, int T,
                 int batches, int *used)
{
    int N = B * T, vb = 0;
    double sum = 0;
    model_t *m = forward_model(cfg, w, pool);
    model_acts_t *a = m ? model_acts_new(m, B, T) : NULL;
    int32_t *tk = malloc((size_t)N * sizeof(int32_t)), *tg = malloc((size_t)N * sizeof(int32_t));
    int32_t *win = malloc(((size_t)T + 1) * sizeof(int32_t));
    size_t cur = 0;
    if (a && tk && tg && win)
        for (; vb < batches && (vb + 1) * (size_t)N < tokfile_count(tf); vb++) {
            eval_next_batch(tf, &cur, B, T, tk, tg, win);
            sum += model_forward(m, a, tk, NULL, tg, 1.0f / N, NULL) / N;
        }
    free(tk), free(tg), free(win);
    model_acts_destroy(&a);
    model_destroy(&m);
    *used = vb;
    return vb ? sum / vb : NAN;
}

double eval_loss_on(const backend_t *be, const model_config_t *cfg, float *w, const tokfile_t *tf, int B, int T,
                    int batches, int *used, char *err, size_t errlen)
{
    model_config_t c = *cfg;
    c.ac_mode = CONFIG_AC_FULL; /* as eval_loss: one layer's activations at a time */
    int N = B * T, vb = 0, rc = 0;
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
    for (; !rc && vb < batches && (vb + 1) * (size_t)N < tokfile_count(tf); vb++) {
        eval_next_batch(tf, &cur, B, T, tk, tg, win);
        if (!(rc = be->forward(m, a, tk, NULL, tg, 1.0f / N, NULL, &loss)))
            sum += loss / N;
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

/* The next token from one position's V logits: the first highest at temperature 0, else a
 * draw from softmax(lg / temperature) with the generator state *s. p is scratch of V doubles. */
static int pick_token(const float *lg, int V, double temperature, unsigned long long *s, double *p)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (lg[v] > lg[best]) /* strictly: a tie keeps the lower id */
            best = v;
    if (temperature == 0)
        return best;
    double mx = lg[best], sum = 0;
    for (int v = 0; v < V; v++)
        sum += p[v] = exp((lg[v] - mx) / temperature);
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    double r = (double)(*s >> 11) * 0x1.0p-53 * sum;
    for (int v = 0; v < V; v++)
        if ((r -= p[v]) < 0)
            return v;
    return V - 1;
}

int eval_generate(const model_config_t *cfg, float *w, pool_t *pool, uint32_t *seq, int prompt, int len,
                  int vocab_limit, double temperature, uint64_t seed)
{
    if (!(temperature >= 0) || prompt < 1)
        return -EINVAL;
    int T = cfg->max_seq_len < 128 ? cfg->max_seq_len : 128;
    model_t *m = forward_model(cfg, w, pool);
    model_acts_t *acts = m ? model_acts_new(m, 1, T) : NULL;
    int32_t *ctx = calloc((size_t)T, sizeof(int32_t));
    double *p = malloc((size_t)cfg->vocab_size * sizeof(double));
    int rc = -ENOMEM;
    if (!acts || !ctx || !p)
        goto out;
    unsigned long long s = seed * 2654435761ULL + 12345;
    for (int n = prompt; n < len; n++) {
        int start = n > T ? n - T : 0, used = n - start;
        for (int i = 0; i < T; i++)
            ctx[i] = i < used ? (int32_t)seq[start + i] : 0;
        model_forward(m, acts, ctx, NULL, NULL, 0, NULL);
        const float *lg = model_logits(acts) + (size_t)(used - 1) * cfg->vocab_size;
        int pick = pick_token(lg, cfg->vocab_size, temperature, &s, p);
        seq[n] = (uint32_t)(pick < vocab_limit ? pick : 0);
    }
    rc = 0;
out:
    free(ctx), free(p);
    model_acts_destroy(&acts);
    model_destroy(&m);
    return rc;
}

int eval_sample(const model_config_t *cfg, float *w, pool_t *pool, tok_t *tok, const tokfile_t *prompt_src,
                int ntokens, double temperature, uint64_t seed, FILE *out)
{
    int prompt = 8, len = ntokens + prompt;
    if (tokfile_count(prompt_src) < (size_t)prompt)
        return -EINVAL;
    uint32_t *seq = calloc((size_t)len, sizeof(uint32_t));
    if (!seq)
        return -ENOMEM;
    int32_t first[8];
    tokfile_read(prompt_src, 0, prompt, first);
    for (int i = 0; i < prompt; i++)
        seq[i] = (uint32_t)first[i];
    int rc = eval_generate(cfg, w, pool, seq, prompt, len, tok_vocab_size(tok), temperature, seed);
    uint8_t *text;
    size_t nb;
    if (rc == 0 && (rc = tok_decode(tok, seq, (size_t)len, &text, &nb)) == 0) {
        fprintf(out, "\n--- sample (prompt: the first %d validation tokens%s) ---\n", prompt,
                temperature == 0 ? ", greedy" : "");
        fwrite(text, 1, nb, out);
        fprintf(out, "\n---\n");
        free(text);
    }
    free(seq);
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
