/* Sampling and the generation loop (see generate.h). */
#include "stages/report/generate.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ipc/util.h"
#include "kernels/cpu/infer.h"

#define PREFILL_BATCH 256 /* prompt tokens per pass: bounds the buffers of a long prompt */

int gen_params_check(const gen_params_t *p, char *err, size_t errlen)
{
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return util_fail(err, errlen, -EINVAL, "--temperature must be a number >= 0 (0 = greedy), not %g",
                         p->temperature);
    if (p->top_k < 0)
        return util_fail(err, errlen, -EINVAL, "--top-k must be >= 0 (0 = off), not %d", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return util_fail(err, errlen, -EINVAL, "--top-p must be in (0, 1] (1 = off), not %g", p->top_p);
    return 0;
}

struct gen_sampler {
    gen_params_t p;
    int V;
    uint64_t state;
    int *idx;     /* (V) candidates */
    double *prob; /* (V) */
};

gen_sampler_t *gen_sampler_new(const gen_params_t *p, int V)
{
    gen_sampler_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->p = *p;
    s->V = V;
    s->state = p->seed;
    s->idx = malloc((size_t)V * sizeof(int));
    s->prob = malloc((size_t)V * sizeof(double));
    if (!s->idx || !s->prob)
        gen_sampler_destroy(&s);
    return s;
}

void gen_sampler_destroy(gen_sampler_t **ps)
{
    gen_sampler_t *s = *ps;
    if (!s)
        return;
    free(s->idx);
    free(s->prob);
    free(s);
    *ps = NULL;
}

/* splitmix64: a uniform double in [0, 1) */
static double next_uniform(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* Highest logit first (lg: the logits); equal logits by id, so the order is a function of the
 * logits alone. */
static int by_logit_desc(const void *a, const void *b, void *lg)
{
    int x = *(const int *)a, y = *(const int *)b;
    float lx = ((const float *)lg)[x], ly = ((const float *)lg)[y];
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return x - y;
}

static int argmax(const float *lg, int n)
{
    int best = 0;
    for (int v = 1; v < n; v++)
        if (lg[v] > lg[best]) /* strictly: a tie keeps the lower id, as torch.argmax */
            best = v;
    return best;
}

/* Candidates after top-k (ties with the k-th logit kept, as transformers' TopKLogitsWarper),
 * sorted by logit, highest first; returns how many. Tokens less likely than e^-CUT times the
 * most likely one are left out before sorting: they hold under V e^-CUT of the probability
 * (1e-26 for a vocabulary of 128256), and a large vocabulary is not sorted for every token. */
#define CUT 70.0
static int top_k_candidates(gen_sampler_t *s, const float *lg, int n)
{
    float floor_ = (float)(lg[argmax(lg, n)] - CUT * s->p.temperature);
    int m = 0;
    for (int v = 0; v < n; v++)
        if (lg[v] >= floor_)
            s->idx[m++] = v;
    qsort_r(s->idx, (size_t)m, sizeof(int), by_logit_desc, (void *)lg);
    int k = s->p.top_k > 0 && s->p.top_k < m ? s->p.top_k : m;
    while (k < m && lg[s->idx[k]] == lg[s->idx[k - 1]])
        k++;
    return k;
}

int gen_distribution(gen_sampler_t *s, const float *lg, int limit, const int **ids, const double **probs)
{
    int n = limit < s->V ? limit : s->V, k;
    *ids = s->idx;
    *probs = s->prob;
    if (s->p.temperature == 0) {
        s->idx[0] = argmax(lg, n);
        s->prob[0] = 1;
        return 1;
    }
    k = top_k_candidates(s, lg, n);
    /* softmax(logits / temperature) over the candidates */
    double mx = lg[s->idx[0]] / s->p.temperature, sum = 0;
    for (int i = 0; i < k; i++)
        sum += s->prob[i] = exp(lg[s->idx[i]] / s->p.temperature - mx);
    /* top-p (TopPLogitsWarper): a token stays while the tokens above it hold less than p;
     * the first always stays */
    if (s->p.top_p < 1) {
        double above = 0;
        int keep = 0;
        while (keep < k && above < s->p.top_p * sum)
            above += s->prob[keep++];
        k = keep ? keep : 1;
        sum = 0;
        for (int i = 0; i < k; i++)
            sum += s->prob[i];
    }
    for (int i = 0; i < k; i++)
        s->prob[i] /= sum;
    return k;
}

int gen_sample(gen_sampler_t *s, const float *lg, int limit)
{
    const int *ids;
    const double *p;
    int k = gen_distribution(s, lg, limit, &ids, &p);
    if (s->p.temperature == 0)
        return ids[0];
    double r = next_uniform(&s->state);
    for (int i = 0; i < k; i++)
        if ((r -= p[i]) < 0)
            return ids[i];
    return ids[k - 1];
}

size_t gen_utf8_ready(const uint8_t *buf, size_t n)
{
    /* the last lead byte among the final 4 bytes, if any: held when its sequence is not whole */
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        uint8_t c = buf[n - back];
        if ((c & 0xc0) == 0x80)
            continue; /* a continuation byte: look further back */
        size_t need = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The model a generation runs: the CPU's KV-cache model, or the GPU's through the plugin. */
typedef struct {
    infer_t *cpu;
    const cuda_plugin_t *pl;
    cuda_infer_t *gpu;
    float *logits; /* (V) the GPU's last logits, on the host */
} model_t;

/* The last token's logits after tokens[0..n), or NULL with the GPU's error in err. */
static const float *forward(model_t *m, const int32_t *tokens, int n, char *err, size_t errlen)
{
    if (m->cpu)
        return infer_forward(m->cpu, tokens, n, 0);
    if (m->pl->infer_forward(m->gpu, tokens, n, m->logits)) {
        util_fail(err, errlen, -EIO, "the GPU model: %s", m->pl->last_error());
        return NULL;
    }
    return m->logits;
}

/* Feeds the prompt in passes of at most PREFILL_BATCH tokens; the logits of its last token. */
static const float *prefill(model_t *m, const uint32_t *prompt, int n, int32_t *ids, char *err, size_t errlen)
{
    const float *lg = NULL;
    for (int at = 0; at < n; at += PREFILL_BATCH) {
        int len = n - at < PREFILL_BATCH ? n - at : PREFILL_BATCH;
        for (int i = 0; i < len; i++)
            ids[i] = (int32_t)prompt[at + i];
        if (!(lg = forward(m, ids, len, err, errlen)))
            return NULL;
    }
    return lg;
}

static int check_run(const model_config_t *cfg, const gen_params_t *p, const uint32_t *prompt, int n_prompt,
                     int max_tokens, char *err, size_t errlen)
{
    int rc = gen_params_check(p, err, errlen);
    if (rc)
        return rc;
    if (n_prompt < 1)
        return util_fail(err, errlen, -EINVAL, "the prompt is empty: generation needs at least one token");
    if (n_prompt >= cfg->max_seq_len)
        return util_fail(err, errlen, -EINVAL, "the prompt has %d tokens: the model sees at most max_seq_len = %d, "
                         "leaving no room for one more", n_prompt, cfg->max_seq_len);
    if (max_tokens < 1)
        return util_fail(err, errlen, -EINVAL, "--max-tokens must be >= 1, not %d", max_tokens);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= (uint32_t)cfg->vocab_size)
            return util_fail(err, errlen, -EINVAL, "prompt token %d is id %u: the model's vocabulary has %d", i,
                             prompt[i], cfg->vocab_size);
    return 0;
}

/* A run's new tokens at most (max_tokens, or the positions left), the cache's positions and the
 * prompt's tokens a pass. */
static void run_sizes(const model_config_t *cfg, int n_prompt, int max_tokens, int *budget, int *cap, int *batch)
{
    int room = cfg->max_seq_len > n_prompt ? cfg->max_seq_len - n_prompt : 0; /* 0: gen_run refuses it */
    *budget = max_tokens < room ? max_tokens : room;
    *cap = n_prompt + *budget;
    *batch = n_prompt < PREFILL_BATCH ? n_prompt : PREFILL_BATCH;
}

size_t gen_run_bytes(const model_config_t *cfg, int n_prompt, int max_tokens)
{
    int budget, cap, batch;
    run_sizes(cfg, n_prompt, max_tokens, &budget, &cap, &batch);
    /* the CPU's cache and buffers, the sampler's candidates and odds, a pass's ids */
    return infer_bytes_for(cfg, cap, batch, 0) + (size_t)cfg->vocab_size * (sizeof(int) + sizeof(double)) +
           (size_t)batch * sizeof(int32_t);
}

int gen_run(const model_config_t *cfg, const float *w, pool_t *pool, const cuda_plugin_t *gpu,
            const gen_params_t *p, const uint32_t *prompt, int n_prompt, int max_tokens, const int *eos, int n_eos,
            int vocab_limit, gen_token_fn fn, void *ctx, gen_stats_t *st, char *err, size_t errlen)
{
    int rc = check_run(cfg, p, prompt, n_prompt, max_tokens, err, errlen);
    if (rc)
        return rc;
    memset(st, 0, sizeof(*st));
    st->prompt_tokens = n_prompt;
    int budget, cap, batch;
    run_sizes(cfg, n_prompt, max_tokens, &budget, &cap, &batch);
    model_t m = {.pl = gpu};
    gen_sampler_t *s = gen_sampler_new(p, cfg->vocab_size);
    int32_t *ids = malloc((size_t)batch * sizeof(int32_t));
    if (gpu) {
        if ((m.logits = malloc((size_t)cfg->vocab_size * sizeof(float))) &&
            (rc = gpu->infer_new(&m.gpu, cfg, w, cap, batch))) {
            rc = util_fail(err, errlen, rc, "the GPU model (a cache of %d positions): %s", cap, gpu->last_error());
            goto out;
        }
    } else {
        m.cpu = infer_new(cfg, w, cap, batch, 0, pool);
    }
    if (!(m.cpu || m.gpu) || (gpu && !m.logits) || !s || !ids) {
        rc = util_fail(err, errlen, -ENOMEM, "out of memory for a cache of %d positions", cap);
        goto out;
    }
    double t0 = now_s();
    const float *lg = prefill(&m, prompt, n_prompt, ids, err, errlen);
    double t1 = now_s();
    st->prefill_s = t1 - t0;
    while (lg) {
        int32_t tok = gen_sample(s, lg, vocab_limit > 0 ? vocab_limit : cfg->vocab_size);
        st->new_tokens++;
        int stop = fn ? fn(ctx, (uint32_t)tok) : 0;
        st->stop = gen_is_eos(eos, n_eos, tok) ? "eos" : st->new_tokens == max_tokens ? "max tokens"
                   : st->new_tokens == budget ? "max_seq_len" : stop ? "callback" : NULL;
        if (st->stop)
            break;
        lg = forward(&m, &tok, 1, err, errlen);
    }
    if (!lg)
        rc = -EIO; /* the GPU failed: err says how */
    st->decode_s = now_s() - t1;
out:
    free(ids);
    free(m.logits);
    gen_sampler_destroy(&s);
    infer_destroy(&m.cpu);
    if (m.gpu)
        gpu->infer_destroy(&m.gpu);
    return rc;
}
