/* `ctitan train`: one-process training on token shards (the reference trainer until the
 * process pipeline lands): sequential batches, AdamW with clipping and the torchtitan lr
 * schedule, one progress line per step, a validation loss and a text sample at the end. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/lr.h"
#include "kernels/cpu/model.h"
#include "kernels/ops.h"
#include "tools/cmds.h"
#include "stages/report/evaluate.h"
#include "stages/data/tokenizer.h"
#include "stages/data/tokfile.h"
#include "ipc/util.h"

typedef struct {
    const char *data, *model;
    model_config_t cfg;
    int steps, batch, seq, threads, sample, eval_batches, warmup;
    double lr, wd, clip, min_lr, temperature;
    lr_decay_t decay;
    unsigned long long seed;
} train_args_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ctitan train --data DIR [options]\n"
            "  --data DIR            folder from `ctitan prep` (train.bin, val.bin, tokenizer.bin)\n"
            "  --model NAME          debugmodel (default), gpt2s, llama1b, tiny\n"
            "  --model.KEY VALUE     override a model key (dim, n_layers, n_heads, ...)\n"
            "  --steps N (300)  --batch B (8)  --seq T (256)  --threads N (all CPUs)\n"
            "  --lr X (8e-4)  --warmup N (steps/10)  --decay linear|sqrt|cosine (cosine)\n"
            "  --min-lr-factor X (0.1)  --weight-decay X (0.1)  --clip X (1.0)  --seed N (0)\n"
            "  --sample N (200 tokens, 0 = none)  --temperature X (0.8; 0 = greedy)\n");
}

static int parse_args(int argc, char **argv, train_args_t *a)
{
    *a = (train_args_t){.model = "debugmodel", .steps = 300, .batch = 8, .seq = 256,
                        .threads = (int)sysconf(_SC_NPROCESSORS_ONLN), .sample = 200,
                        .eval_batches = 8, .warmup = -1, .lr = 8e-4, .wd = 0.1, .clip = 1.0,
                        .min_lr = 0.1, .temperature = 0.8, .decay = LR_DECAY_COSINE};
    const char *overrides[64][2];
    int nover = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "train: %s needs a value (try --help)\n", k);
            return -EINVAL;
        }
        const char *v = argv[++i];
        char *end = NULL;
        double x = strtod(v, &end);
        int numeric = end != v && *end == '\0';
#define NUM(flag, field, lo)                                                                \
    else if (!strcmp(k, flag)) {                                                            \
        if (!numeric || x < (lo)) {                                                         \
            fprintf(stderr, "train: %s expects a number >= %g, got '%s'\n", flag, (double)(lo), v); \
            return -EINVAL;                                                                 \
        }                                                                                   \
        a->field = x;                                                                       \
    }
        if (!strcmp(k, "--data")) a->data = v;
        else if (!strcmp(k, "--model")) a->model = v;
        else if (!strncmp(k, "--model.", 8) && nover < 64) overrides[nover][0] = k + 8, overrides[nover++][1] = v;
        NUM("--steps", steps, 1) NUM("--batch", batch, 1) NUM("--seq", seq, 2)
        NUM("--threads", threads, 1) NUM("--sample", sample, 0) NUM("--warmup", warmup, 0)
        NUM("--lr", lr, 0) NUM("--weight-decay", wd, 0) NUM("--clip", clip, 0)
        NUM("--min-lr-factor", min_lr, 0) NUM("--temperature", temperature, 0)
        NUM("--seed", seed, 0)
        else if (!strcmp(k, "--decay")) {
            if (lr_decay_parse(v, &a->decay)) {
                fprintf(stderr, "train: --decay expects linear, sqrt or cosine, got '%s'\n", v);
                return -EINVAL;
            }
        } else {
            fprintf(stderr, "train: unknown option '%s' (try --help)\n", k);
            return -EINVAL;
        }
#undef NUM
    }
    if (!a->data) {
        fprintf(stderr, "train: --data DIR is required (make one with `ctitan prep`)\n");
        return -EINVAL;
    }
    if (config_preset(a->model, &a->cfg)) {
        fprintf(stderr, "train: unknown --model '%s' (debugmodel, gpt2s, llama1b, tiny)\n", a->model);
        return -EINVAL;
    }
    char err[256];
    for (int i = 0; i < nover; i++)
        if (config_set(&a->cfg, overrides[i][0], overrides[i][1], err, sizeof(err))) {
            fprintf(stderr, "train: %s\n", err);
            return -EINVAL;
        }
    if (a->cfg.max_seq_len < a->seq)
        a->cfg.max_seq_len = a->seq;
    if (config_validate(&a->cfg, err, sizeof(err))) {
        fprintf(stderr, "train: %s\n", err);
        return -EINVAL;
    }
    if (a->warmup < 0)
        a->warmup = a->steps / 10;
    return 0;
}

static int open_tokens(tokfile_t **tf, const char *dir, const char *name, const train_args_t *a)
{
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (tokfile_open(tf, path, a->cfg.vocab_size, err, sizeof(err))) {
        fprintf(stderr, "train: %s\n", err);
        return -EINVAL;
    }
    if (tokfile_count(*tf) < (size_t)a->seq + 1) {
        fprintf(stderr, "train: %s: %zu tokens, fewer than --seq %d + 1\n", path, tokfile_count(*tf),
                a->seq);
        tokfile_close(tf);
        return -EINVAL;
    }
    return 0;
}

int cmd_train(int argc, char **argv)
{
    train_args_t a;
    if (parse_args(argc, argv, &a))
        return 2;
    model_config_t *cfg = &a.cfg;
    char path[4096], err[512];
    tokfile_t *train = NULL, *val = NULL;
    tok_t *tok = NULL;
    if (open_tokens(&train, a.data, "train.bin", &a) || open_tokens(&val, a.data, "val.bin", &a))
        return 1;
    snprintf(path, sizeof(path), "%s/tokenizer.bin", a.data);
    if (a.sample > 0 && tok_load(&tok, path, err, sizeof(err))) {
        fprintf(stderr, "train: %s\n", err);
        return 1;
    }
    if (tok && tok_vocab_size(tok) > cfg->vocab_size) {
        fprintf(stderr, "train: %s has %d tokens but model.vocab_size is %d\n", path,
                tok_vocab_size(tok), cfg->vocab_size);
        return 1;
    }
    param_table_t tab;
    params_table_init(&tab, cfg);
    size_t n = tab.total;
    float *w = malloc(n * sizeof(float)), *g = calloc(n, sizeof(float));
    float *m1 = calloc(n, sizeof(float)), *m2 = calloc(n, sizeof(float));
    int B = a.batch, T = a.seq, N = B * T;
    int32_t *tk = malloc(N * sizeof(int32_t)), *tg = malloc(N * sizeof(int32_t));
    int32_t *win = malloc(((size_t)T + 1) * sizeof(int32_t));
    if (!w || !g || !m1 || !m2 || !tk || !tg || !win) {
        fprintf(stderr, "train: out of memory for %zu parameters\n", n);
        return 1;
    }
    params_init(&tab, cfg, a.seed, w, 0, n);
    pool_t *pool = pool_new(a.threads);
    if (!pool) {
        fprintf(stderr, "train: cannot start %d threads: %s\n", a.threads, strerror(errno));
        return 1;
    }
    model_t *m = model_new(cfg, 0, cfg->n_layers + 2, w, g, pool);
    model_acts_t *acts = model_acts_new(m, B, T);
    lr_schedule_t sched = {.steps = a.steps, .warmup_steps = a.warmup, .decay_ratio = -1,
                           .decay_type = a.decay, .lr_min = a.min_lr};
    printf("train: %s, %.2fM parameters, %zu train tokens, batch %dx%d, %d threads\n", a.model,
           n / 1e6, tokfile_count(train), B, T, a.threads);
    size_t cursor = 0;
    double t_start = util_now();
    for (int step = 0; step < a.steps; step++) {
        double t0 = util_now();
        eval_next_batch(train, &cursor, B, T, tk, tg, win);
        double loss = model_forward(m, acts, tk, NULL, tg, 1.0f / N, NULL) / N;
        model_backward_b(m, acts, NULL, NULL);
        model_backward_w(m, acts);
        double sq = 0;
        for (size_t i = 0; i < n; i++)
            sq += (double)g[i] * g[i];
        double norm = sqrt(sq), scale = a.clip > 0 && norm > a.clip ? a.clip / norm : 1.0;
        if (scale != 1.0)
            for (size_t i = 0; i < n; i++)
                g[i] *= (float)scale;
        double lr = a.lr * lr_factor(&sched, step);
        for (int t = 0; t < tab.n; t++) {
            const param_info_t *p = &tab.t[t];
            ops_adamw(pool, w + p->offset, g + p->offset, m1 + p->offset, m2 + p->offset, p->numel,
                      (float)lr, 0.9f, 0.95f, 1e-8f, params_is_decayed(p->kind) ? (float)a.wd : 0,
                      step + 1);
        }
        memset(g, 0, n * sizeof(float));
        double dt = util_now() - t0;
        printf("step %5d  loss %7.4f  grad_norm %7.3f  lr %.2e  tokens/s %7.0f  %6.0f ms\n",
               step + 1, loss, norm, lr, N / dt, dt * 1e3);
        fflush(stdout);
    }
    int vb;
    double vloss = eval_loss(cfg, w, pool, val, B, T, a.eval_batches, &vb, NULL);
    printf("done: %d steps in %.1f s; validation loss %.4f over %d batches\n", a.steps,
           util_now() - t_start, vloss, vb);
    if (tok && eval_sample(cfg, w, pool, NULL, tok, val, a.sample, a.temperature, a.seed, stdout, err, sizeof(err)))
        fprintf(stderr, "ctitan train: no sample: %s\n", err);
    model_acts_destroy(&acts);
    model_destroy(&m);
    pool_destroy(&pool);
    params_table_free(&tab);
    tokfile_close(&train);
    tokfile_close(&val);
    tok_destroy(&tok);
    free(w), free(g), free(m1), free(m2), free(tk), free(tg), free(win);
    return 0;
}
