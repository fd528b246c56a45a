/* `ctitan generate`: continue a prompt with a trained model (a checkpoint; a Hugging Face
 * folder once its importer lands: checkpointd/gen_load.h), on the CPU with a KV cache
 * (stages/report/generate.h), streaming the text to stdout and a speed summary to stderr.
 * Exit status: 0 ok, 1 the model, tokenizer or prompt could not be used, 2 bad usage. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpointd/gen_load.h"
#include "kernels/cpu/pool.h"
#include "kernels/cuda_plugin.h"
#include "stages/data/tokenizer.h"
#include "stages/report/generate.h"
#include "ipc/util.h"
#include "tools/cmds.h"

static const char usage_text[] =
    "usage: ctitan generate CHECKPOINT --prompt TEXT [options]\n"
    "Continues the prompt with the model of CHECKPOINT (a step-N directory, a checkpoint folder:\n"
    "its newest checkpoint that verifies, or a Hugging Face folder) on the CPU, printing the new\n"
    "text as it is made and a summary (tokens/s) to stderr. Generation stops after an end-of-text\n"
    "token: the tokenizer's EOS and, for a Hugging Face folder, every eos_token_id of its\n"
    "generation_config.json (else config.json), as transformers' generate does.\n"
    "  --prompt TEXT         the prompt (or --prompt-file F, or --prompt-ids 'ID ID ...')\n"
    "  --prompt-file F       the prompt is the bytes of file F\n"
    "  --prompt-ids LIST     the prompt as token ids (spaces or commas between them)\n"
    "  --max-tokens N (128)  new tokens at most (generation also stops at EOS and max_seq_len)\n"
    "  --ignore-eos          go on past end-of-text tokens (to --max-tokens or max_seq_len)\n"
    "  --temperature T (0.8) 0 = greedy (the highest logit)\n"
    "  --top-k K (0 = off)   sample among the K most likely tokens only\n"
    "  --top-p P (1 = off)   sample among the fewest most likely tokens holding probability P\n"
    "  --seed S (0)          the sampler's seed: the same seed gives the same text\n"
    "  --tokenizer PATH      default: the checkpoint manifest's model.tokenizer_path\n"
    "  --threads N           default: all CPUs\n"
    "  --device cpu|cuda     where it runs (default cpu); cuda: the first GPU, in fp32 with a device KV cache\n"
    "  --no-stream           print the text once it is all made\n"
    "  --ids                 print the new token ids instead of text\n"
    "  --bos / --no-bos      begin a text prompt with the tokenizer's BOS token (default: when it has one)\n";

typedef struct {
    const char *model, *prompt, *prompt_file, *prompt_ids, *tokenizer;
    int max_tokens, threads, stream, ids, bos; /* bos: -1 = the tokenizer's default */
    int ignore_eos;
    int cuda;                                  /* --device cuda */
    gen_params_t p;
} gen_args_t;

/* Bad usage: the message, where to look, status 2. */
__attribute__((format(printf, 1, 2))) static int bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ctitan generate: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(ctitan generate --help lists the options)\n");
    return 2;
}

/* A whole number in [lo, hi] or a finite double >= lo (is_int 0) from text v. */
static int num(const char *flag, const char *v, int is_int, double lo, double hi, double *out)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x) || x < lo || x > hi || (is_int && x != floor(x))) {
        char range[64];
        snprintf(range, sizeof(range), isinf(hi) ? ">= %.15g" : "from %.15g to %.15g", lo, hi);
        fprintf(stderr, "ctitan generate: %s expects %s %s, got '%s'\n(ctitan generate --help lists the options)\n",
                flag, is_int ? "a whole number" : "a number", range, v);
        return 2;
    }
    *out = x;
    return 0;
}

/* Flags with a value; returns 0, or 2 after a usage message. */
static int value_flag(gen_args_t *a, const char *k, const char *v)
{
    double x;
    int rc = 0;
    if (!strcmp(k, "--prompt")) a->prompt = v;
    else if (!strcmp(k, "--prompt-file")) a->prompt_file = v;
    else if (!strcmp(k, "--prompt-ids")) a->prompt_ids = v;
    else if (!strcmp(k, "--tokenizer")) a->tokenizer = v;
    else if (!strcmp(k, "--device")) {
        if (!strcmp(v, "cuda") || !strcmp(v, "cpu"))
            a->cuda = !strcmp(v, "cuda");
        else
            rc = bad_usage("%s expects cpu or cuda, got '%s'", k, v);
    }
    else if (!strcmp(k, "--max-tokens")) { if (!(rc = num(k, v, 1, 1, INT_MAX, &x))) a->max_tokens = (int)x; }
    else if (!strcmp(k, "--threads")) { if (!(rc = num(k, v, 1, 1, POOL_MAX_THREADS, &x))) a->threads = (int)x; }
    else if (!strcmp(k, "--top-k")) { if (!(rc = num(k, v, 1, 0, INT_MAX, &x))) a->p.top_k = (int)x; }
    else if (!strcmp(k, "--seed")) { if (!(rc = num(k, v, 1, 0, 0x1p63, &x))) a->p.seed = (uint64_t)x; }
    else if (!strcmp(k, "--temperature")) { if (!(rc = num(k, v, 0, 0, INFINITY, &x))) a->p.temperature = x; }
    else if (!strcmp(k, "--top-p")) {
        if (!(rc = num(k, v, 0, 0, 1, &x)) && x == 0)
            rc = bad_usage("%s must be above 0 (1 = off), got '%s'", k, v);
        a->p.top_p = x;
    } else return bad_usage("unknown option '%s'", k);
    return rc;
}

static const char *const value_flags[] = {"--prompt", "--prompt-file", "--prompt-ids", "--tokenizer", "--device",
                                          "--max-tokens", "--threads", "--top-k", "--seed", "--temperature", "--top-p",
                                          NULL};

static int takes_value(const char *k)
{
    for (int i = 0; value_flags[i]; i++)
        if (!strcmp(k, value_flags[i]))
            return 1;
    return 0;
}

/* Returns 0, -1 for --help, or 2 after a usage message. */
static int parse_args(int argc, char **argv, gen_args_t *a)
{
    *a = (gen_args_t){.max_tokens = 128, .threads = (int)sysconf(_SC_NPROCESSORS_ONLN), .stream = 1, .bos = -1,
                      .p = {.temperature = 0.8, .top_k = 0, .top_p = 1, .seed = 0}};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        int rc = 0;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) return -1;
        else if (!strcmp(k, "--no-stream")) a->stream = 0;
        else if (!strcmp(k, "--ids")) a->ids = 1;
        else if (!strcmp(k, "--ignore-eos")) a->ignore_eos = 1;
        else if (!strcmp(k, "--bos")) a->bos = 1;
        else if (!strcmp(k, "--no-bos")) a->bos = 0;
        else if (takes_value(k) && i + 1 >= argc) return bad_usage("%s needs a value", k);
        else if (takes_value(k)) rc = value_flag(a, k, argv[++i]);
        else if (k[0] == '-' && k[1]) return bad_usage("unknown option '%s'", k);
        else if (a->model) return bad_usage("unexpected argument '%s' (the model is '%s')", k, a->model);
        else a->model = k;
        if (rc)
            return rc;
    }
    if (!a->model)
        return bad_usage("give the model: a checkpoint (step-N directory) or a Hugging Face folder");
    int given = !!a->prompt + !!a->prompt_file + !!a->prompt_ids;
    if (given != 1)
        return bad_usage("%s", given ? "give only one of --prompt, --prompt-file and --prompt-ids"
                                     : "give the prompt: --prompt TEXT, --prompt-file F or --prompt-ids LIST");
    return 0;
}

/* --prompt-ids: ids separated by spaces or commas, each below vocab. */
static int parse_ids(const char *s, int vocab, uint32_t **out, int *n)
{
    size_t cap = strlen(s) / 2 + 1;
    uint32_t *ids = malloc(cap * sizeof(uint32_t));
    int k = 0;
    if (!ids)
        return -ENOMEM;
    while (*s) {
        if (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n') {
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v >= vocab || (*end && !strchr(" ,\t\n", *end))) {
            fprintf(stderr, "ctitan generate: --prompt-ids: '%.*s' is not a token id below the model's vocabulary "
                            "of %d\n", (int)strcspn(s, " ,\t\n"), s, vocab);
            free(ids);
            return -EINVAL;
        }
        ids[k++] = (uint32_t)v;
        s = end;
    }
    *out = ids;
    *n = k;
    return 0;
}

/* The most a --prompt-file may hold (a prompt is at most max_seq_len tokens anyway). */
#define GEN_PROMPT_FILE_MAX ((size_t)64 << 20)

/* The prompt's text: --prompt, or the bytes of --prompt-file, a regular file of at most
 * GEN_PROMPT_FILE_MAX bytes (malloc'ed, *len bytes). */
static uint8_t *prompt_text(const gen_args_t *a, size_t *len)
{
    if (a->prompt) {
        *len = strlen(a->prompt);
        uint8_t *t = malloc(*len + 1);
        if (t)
            memcpy(t, a->prompt, *len + 1);
        return t;
    }
    char *t = NULL, err[1024];
    if (util_read_file(a->prompt_file, GEN_PROMPT_FILE_MAX, "prompt file", &t, len, err, sizeof(err))) {
        fprintf(stderr, "ctitan generate: --prompt-file %s\n", err);
        return NULL;
    }
    return (uint8_t *)t;
}

/* The prompt's token ids: --prompt-ids, or the text encoded (BOS first when asked). */
static int prompt_ids(const gen_args_t *a, tok_t *tok, int vocab, uint32_t **ids, int *n)
{
    if (a->prompt_ids)
        return parse_ids(a->prompt_ids, vocab, ids, n);
    size_t len, got;
    uint8_t *text = prompt_text(a, &len);
    if (!text)
        return -EINVAL;
    int bos = tok_bos(tok), use_bos = a->bos < 0 ? bos >= 0 : a->bos;
    if (use_bos && bos < 0) {
        fprintf(stderr, "ctitan generate: --bos: the tokenizer has no BOS token\n");
        free(text);
        return -EINVAL;
    }
    *ids = malloc((len + 1) * sizeof(uint32_t));
    int rc = *ids ? tok_encode(tok, text, len, *ids + use_bos, &got) : -ENOMEM;
    free(text);
    if (rc) {
        fprintf(stderr, "ctitan generate: encoding the prompt: %s\n", strerror(-rc));
        return rc;
    }
    if (use_bos)
        (*ids)[0] = (uint32_t)bos;
    *n = (int)got + use_bos;
    return 0;
}

typedef struct {
    tok_t *tok;
    int ids, stream;
    int eos[HF_EOS_MAX + 1], n_eos; /* the model folder's end-of-text ids and the tokenizer's */
    uint8_t *pend;    /* text not written yet */
    size_t n, cap;
    int failed;       /* ENOMEM */
} out_t;

static void out_write(out_t *o, size_t n)
{
    fwrite(o->pend, 1, n, stdout);
    fflush(stdout);
    memmove(o->pend, o->pend + n, o->n - n);
    o->n -= n;
}

/* Each new token: its id, or its bytes as far as they end in whole UTF-8 characters. */
static int on_token(void *ctx, uint32_t id)
{
    out_t *o = ctx;
    if (o->ids) {
        printf("%s%u", o->n++ ? " " : "", id);
        if (o->stream)
            fflush(stdout);
        return 0;
    }
    size_t len;
    const uint8_t *b = gen_is_eos(o->eos, o->n_eos, (int32_t)id) ? NULL : tok_token_bytes(o->tok, id, &len);
    if (!b)
        return 0;
    if (o->n + len > o->cap) {
        size_t cap = (o->n + len) * 2;
        uint8_t *g = realloc(o->pend, cap);
        if (!g)
            return o->failed = 1;
        o->pend = g, o->cap = cap;
    }
    memcpy(o->pend + o->n, b, len);
    o->n += len;
    if (o->stream)
        out_write(o, gen_utf8_ready(o->pend, o->n));
    return 0;
}

/* The tokenizer: --tokenizer, else the one the model names. NULL with *rc set when needed
 * and not had; NULL with *rc 0 when not needed (ids in and out). */
static tok_t *open_tokenizer(const gen_args_t *a, const gen_model_t *m, int *rc)
{
    const char *path = a->tokenizer ? a->tokenizer : m->tokenizer_path;
    tok_t *t = NULL;
    char err[1024];
    *rc = 0;
    if (!path[0] && a->prompt_ids && a->ids)
        return NULL;
    if (!path[0]) {
        fprintf(stderr, "ctitan generate: %s names no tokenizer (model.tokenizer_path): give --tokenizer PATH "
                        "(or --prompt-ids with --ids)\n", m->source);
        *rc = -EINVAL;
    } else if ((*rc = tok_load(&t, path, err, sizeof(err)))) {
        if (a->tokenizer)
            fprintf(stderr, "ctitan generate: --tokenizer: %s\n", err);
        else
            fprintf(stderr, "ctitan generate: %s (the tokenizer that %s's manifest names in model.tokenizer_path, "
                            "relative to the current folder; --tokenizer PATH names another)\n", err, m->source);
    } else if (tok_vocab_size(t) > m->cfg.vocab_size) {
        fprintf(stderr, "ctitan generate: the tokenizer %s has %d tokens, more than the model's vocabulary of %d: "
                        "not this model's tokenizer\n", path, tok_vocab_size(t), m->cfg.vocab_size);
        tok_destroy(&t);
        *rc = -EINVAL;
    }
    return t;
}

static void summary(const gen_stats_t *st)
{
    double pre = st->prefill_s > 0 ? st->prompt_tokens / st->prefill_s : 0;
    /* the first new token comes from the prompt's pass; each later one costs one step */
    double dec = st->decode_s > 0 ? (st->new_tokens - 1) / st->decode_s : 0;
    fprintf(stderr, "generate: prompt %d tokens in %.3f s (%.1f tokens/s), %d new tokens in %.3f s "
                    "(%.1f tokens/s), stopped at %s\n", st->prompt_tokens, st->prefill_s, pre, st->new_tokens,
            st->decode_s, dec, st->stop);
}

static int run(const gen_args_t *a, gen_model_t *m)
{
    int rc;
    tok_t *tok = open_tokenizer(a, m, &rc);
    uint32_t *ids = NULL;
    int n = 0;
    pool_t *pool = NULL;
    out_t o = {.tok = tok, .ids = a->ids, .stream = a->stream, .n_eos = m->n_eos};
    memcpy(o.eos, m->eos, sizeof(m->eos));
    if (tok && tok_eos(tok) >= 0 && !gen_is_eos(o.eos, o.n_eos, tok_eos(tok)))
        o.eos[o.n_eos++] = tok_eos(tok);
    if (rc || (rc = prompt_ids(a, tok, m->cfg.vocab_size, &ids, &n)))
        goto out;
    if (!(pool = pool_new(a->threads))) {
        fprintf(stderr, "ctitan generate: cannot start %d threads: %s\n", a->threads, strerror(errno));
        rc = -errno;
        goto out;
    }
    gen_stats_t st;
    char err[512];
    const cuda_plugin_t *gpu = NULL;
    if (a->cuda && (!(gpu = cuda_plugin_load(err, sizeof(err))) || gpu->backend.dev_select(0, NULL))) {
        fprintf(stderr, "ctitan generate: --device cuda: %s\n", gpu ? gpu->last_error() : err);
        rc = -ENODEV;
        goto out;
    }
    int limit = tok ? tok_vocab_size(tok) : m->cfg.vocab_size;
    if ((rc = gen_run(&m->cfg, m->w, pool, gpu, &a->p, ids, n, a->max_tokens, o.eos, a->ignore_eos ? 0 : o.n_eos,
                      limit, on_token, &o, &st, err, sizeof(err)))) {
        fprintf(stderr, "ctitan generate: %s\n", err);
        goto out;
    }
    if (o.failed) {
        fprintf(stderr, "ctitan generate: out of memory for the text\n");
        rc = -ENOMEM;
        goto out;
    }
    if (!a->ids)
        out_write(&o, o.n);
    printf("\n");
    fflush(stdout); /* before the summary on stderr, where both go to one place */
    summary(&st);
out:
    free(o.pend);
    free(ids);
    pool_destroy(&pool);
    tok_destroy(&tok);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    gen_args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? (fputs(usage_text, stdout), 0) : rc;
    char err[1024];
    if (gen_params_check(&a.p, err, sizeof(err))) {
        fprintf(stderr, "ctitan generate: %s\n", err);
        return 2;
    }
    gen_model_t m;
    if ((rc = gen_load_weights(a.model, &m, err, sizeof(err)))) {
        fprintf(stderr, "ctitan generate: %s\n", err);
        return 1;
    }
    rc = run(&a, &m);
    gen_model_free(&m);
    return rc ? 1 : 0;
}
