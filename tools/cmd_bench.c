/* `ctitan bench`: the machine's sgemm peak, per-op throughput, and the full
 * forward+backward+AdamW step of the demo and GPT-2-small-sized models, with tokens/s and
 * model FLOP utilisation against the peak measured in the same run. Prints markdown. */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "kernels/act_bytes.h"
#include "kernels/cpu/model.h"
#include "kernels/ops.h"
#include "tools/bench_ckpt.h"
#include "tools/bench_pipeline.h"
#include "tools/cmds.h"
#include "kernels/cpu/peak.h"
#include "ipc/util.h"

static float *randn(size_t n, unsigned seed, float scale)
{
    float *x = malloc(n * sizeof(float));
    if (!x) {
        fprintf(stderr, "bench: out of memory (%zu floats)\n", n);
        exit(1);
    }
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = scale * ((float)(s >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
    }
    return x;
}

/* Best of `reps` timings of fn after one warm-up call. */
#define BEST_OF(reps, secs, ...)                                   \
    do {                                                           \
        __VA_ARGS__;                                               \
        secs = 1e30;                                               \
        for (int r_ = 0; r_ < (reps); r_++) {                      \
            double t0_ = util_now();                                    \
            __VA_ARGS__;                                           \
            double t_ = util_now() - t0_;                               \
            if (t_ < secs) secs = t_;                              \
        }                                                          \
    } while (0)

typedef struct {
    int threads;
    int quick;
    int ckpt_only;        /* --checkpoints: only the checkpoint section */
    int sched_only;       /* --schedules: only the schedules section */
    int ac_only;          /* --ac: only activation checkpointing's section */
    double peak;          /* GFLOP/s */
} bench_t;

static void measure_peak(bench_t *b)
{
    int n = b->quick ? 1024 : 2048;
    double native, pooled;
    b->peak = peak_sgemm_gflops(b->threads, n, &native, &pooled);
    printf("## sgemm peak (n=%d, %d threads, OPENBLAS_CORETYPE=%s)\n\n", n, b->threads,
           getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "(auto)");
    printf("| sgemm | GFLOP/s |\n|---|---|\n");
    printf("| OpenBLAS, its own %d threads | %.1f |\n", b->threads, native);
    printf("| ctitan pool, row-chunked (as the trainer runs) | %.1f |\n", pooled);
    printf("| **peak used for MFU** (the higher) | **%.1f** |\n\n", b->peak);
}

static void bench_ops(bench_t *b)
{
    /* GPT-2-small shapes: N = 4 x 256 tokens, dim 768, ffn 2048, 12 heads of 64 */
    int B = 4, T = 256, N = B * T, D = 768, F = 2048, H = 12, hd = 64, V = 50304;
    pool_t *p = pool_new(b->threads);
    size_t big = (size_t)N * V;
    float *x = randn((size_t)N * F, 3, 1), *w = randn((size_t)F * D, 4, 0.05f);
    float *y = randn((size_t)N * F, 5, 1), *z = randn(big, 6, 1), *r = randn(N, 7, 1);
    float *q = randn((size_t)N * D, 8, 1), *k = randn((size_t)N * D, 9, 1),
          *v = randn((size_t)N * D, 10, 1), *dq = randn((size_t)N * D, 11, 1),
          *dk = randn((size_t)N * D, 12, 1), *dv = randn((size_t)N * D, 13, 1);
    float *probs = malloc((size_t)B * H * T * T * sizeof(float));
    float *cs = malloc((size_t)T * hd / 2 * sizeof(float)), *sn = malloc((size_t)T * hd / 2 * sizeof(float));
    int32_t *tgt = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tgt[i] = (i * 7919) % V;
    ops_rope_table(cs, sn, T, hd, 10000.0);
    double t, mm = 2.0 * N * D * F, attn = 4.0 * B * H * T * T * hd / 2; /* causal half */
    int reps = b->quick ? 2 : 5;
    printf("## ops (GPT-2-small shapes: %d tokens, dim %d, ffn %d, %d heads, vocab %d)\n\n", N, D,
           F, H, V);
    printf("| op | shape | ms | rate |\n|---|---|---|---|\n");
#define ROW(name, shape, unit, amount, ...)                                               \
    BEST_OF(reps, t, __VA_ARGS__);                                                      \
    printf("| %s | %s | %.3f | %.1f %s |\n", name, shape, t * 1e3, (amount) / t * 1e-9, unit)
    ROW("matmul fwd", "1024x768 · (2048x768)ᵀ", "GFLOP/s", mm, ops_matmul_fwd(p, y, x, w, N, D, F));
    ROW("matmul bwd_x", "1024x2048 · 2048x768", "GFLOP/s", mm, ops_matmul_bwd_x(p, x, y, w, N, D, F, 0));
    ROW("matmul bwd_w", "(1024x2048)ᵀ · 1024x768", "GFLOP/s", mm, ops_matmul_bwd_w(p, w, y, x, N, D, F));
    ROW("attention fwd", "4x12x256x256, hd 64", "GFLOP/s", attn,
        ops_attn_fwd(p, y, probs, q, k, v, B, T, H, H, hd));
    ROW("attention bwd", "4x12x256x256, hd 64", "GFLOP/s", 2 * attn,
        ops_attn_bwd(p, dq, dk, dv, y, probs, q, k, v, B, T, H, H, hd));
    ROW("rope fwd", "1024x12x64", "GB/s", 2.0 * N * D * 4, ops_rope_fwd(p, q, cs, sn, B, T, H, hd));
    ROW("rmsnorm fwd", "1024x768", "GB/s", 2.0 * N * D * 4, ops_rmsnorm_fwd(p, y, r, x, w, N, D, 1e-5f));
    ROW("rmsnorm bwd_x", "1024x768", "GB/s", 3.0 * N * D * 4, ops_rmsnorm_bwd_x(p, y, q, x, r, w, N, D));
    ROW("rmsnorm bwd_w", "1024x768", "GB/s", 2.0 * N * D * 4, ops_rmsnorm_bwd_w(p, w, q, x, r, N, D));
    ROW("swiglu fwd", "1024x768", "GB/s", 3.0 * N * D * 4, ops_swiglu_fwd(p, y, x, dq, (size_t)N * D));
    ROW("swiglu bwd", "1024x768", "GB/s", 5.0 * N * D * 4,
        ops_swiglu_bwd(p, y, dk, dv, x, q, (size_t)N * D));
    ROW("softmax xent", "1024x50304", "GB/s", 2.0 * big * 4, ops_xent(p, z, r, z, tgt, N, V, 1e-3f));
    ROW("embed bwd", "1024x768", "GB/s", 2.0 * N * D * 4, ops_embed_bwd(p, z, q, tgt, N, D));
    ROW("adamw", "786k params", "GB/s", 7.0 * N * D * 4,
        ops_adamw(p, x, y, dq, dv, (size_t)N * D, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3));
#undef ROW
    printf("\n");
    pool_destroy(&p);
    free(x), free(w), free(y), free(z), free(r), free(q), free(k), free(v), free(dq), free(dk),
        free(dv), free(probs), free(cs), free(sn), free(tgt);
}

static void bench_step(bench_t *b, const char *preset, const char *label, int B, int T)
{
    model_config_t cfg;
    char err[256];
    config_preset(preset, &cfg);
    cfg.max_seq_len = T > cfg.max_seq_len ? T : cfg.max_seq_len;
    if (config_validate(&cfg, err, sizeof(err))) {
        fprintf(stderr, "bench: %s\n", err);
        exit(1);
    }
    param_table_t tab;
    params_table_init(&tab, &cfg);
    size_t n = tab.total;
    float *w = malloc(n * sizeof(float)), *g = calloc(n, sizeof(float));
    float *m1 = calloc(n, sizeof(float)), *m2 = calloc(n, sizeof(float));
    params_init(&tab, &cfg, 1, w, 0, n);
    pool_t *p = pool_new(b->threads);
    model_t *m = model_new(&cfg, 0, cfg.n_layers + 2, w, g, p);
    model_acts_t *a = model_acts_new(m, B, T);
    int N = B * T;
    int32_t *tok = malloc(N * sizeof(int32_t)), *tgt = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tok[i] = (i * 31 + 7) % cfg.vocab_size, tgt[i] = (i * 17 + 3) % cfg.vocab_size;
    int steps = b->quick ? 1 : 3;
    double best = 1e30, tf = 0, tb = 0, tw = 0, to = 0, loss = 0;
    for (int s = 0; s <= steps; s++) { /* step 0 warms up */
        double t0 = util_now();
        loss = model_forward(m, a, tok, NULL, tgt, 1.0f / N, NULL) / N;
        double t1 = util_now();
        model_backward_b(m, a, NULL, NULL);
        double t2 = util_now();
        model_backward_w(m, a);
        double t3 = util_now();
        ops_adamw(p, w, g, m1, m2, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, s + 1);
        memset(g, 0, n * sizeof(float));
        double t4 = util_now();
        if (s > 0 && t4 - t0 < best)
            best = t4 - t0, tf = t1 - t0, tb = t2 - t1, tw = t3 - t2, to = t4 - t3;
    }
    double fpt = config_flops_per_token(&cfg, T);
    double tps = N / best, mfu = fpt * N / best * 1e-9 / b->peak;
    printf("| %s | %.1fM | %dx%d | %.0f | %.0f / %.0f / %.0f / %.0f | %.0f | %.1f | **%.1f%%** | %.0f | %.2f |\n",
           label, n / 1e6, B, T, best * 1e3, tf * 1e3, tb * 1e3, tw * 1e3, to * 1e3, tps,
           fpt * N / best * 1e-9, 100 * mfu, model_acts_bytes(a) / 1048576.0, loss);
    fflush(stdout);
    free(tok), free(tgt), free(w), free(g), free(m1), free(m2);
    model_acts_destroy(&a);
    model_destroy(&m);
    pool_destroy(&p);
    params_table_free(&tab);
}

/* `ctitan bench --ac`: activation checkpointing's cost in one process: a microbatch's forward
 * and backward (B then W in mode none, model_backward with the recompute otherwise), each
 * mode's best of `reps` with the modes interleaved in every round (on a shared machine the load
 * moves between rounds, not inside one), and the activation bytes each mode holds. */
static void bench_ac_shape(bench_t *b, const char *label, model_config_t cfg, int B, int T)
{
    static const struct { const char *name; int mode, every; } modes[] = {
        {"none", CONFIG_AC_NONE, 0}, {"full", CONFIG_AC_FULL, 0}, {"selective 2", CONFIG_AC_SELECTIVE, 2},
        {"selective op", CONFIG_AC_SELECTIVE, 0},
    };
    enum { NM = 4 };
    char err[256];
    cfg.max_seq_len = T > cfg.max_seq_len ? T : cfg.max_seq_len;
    if (config_validate(&cfg, err, sizeof(err))) {
        fprintf(stderr, "bench: %s\n", err);
        exit(1);
    }
    param_table_t tab;
    params_table_init(&tab, &cfg);
    float *w = malloc(tab.total * sizeof(float)), *g = calloc(tab.total, sizeof(float));
    params_init(&tab, &cfg, 1, w, 0, tab.total);
    pool_t *p = pool_new(b->threads);
    int N = B * T, reps = b->quick ? 1 : 4;
    int32_t *tok = malloc(N * sizeof(int32_t)), *tgt = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tok[i] = (i * 31 + 7) % cfg.vocab_size, tgt[i] = (i * 17 + 3) % cfg.vocab_size;
    model_t *m[NM];
    model_acts_t *a[NM];
    double tf[NM], tbw[NM];
    for (int k = 0; k < NM; k++) {
        model_config_t c = cfg;
        c.ac_mode = modes[k].mode, c.ac_every = modes[k].every;
        m[k] = model_new(&c, 0, c.n_layers + 2, w, g, p);
        a[k] = model_acts_new(m[k], B, T);
        if (!m[k] || !a[k]) {
            fprintf(stderr, "bench: out of memory for the %s model\n", label);
            exit(1);
        }
        tf[k] = tbw[k] = 1e30;
    }
    for (int r = 0; r <= reps; r++) /* round 0 warms up */
        for (int k = 0; k < NM; k++) {
            double t0 = util_now();
            model_forward(m[k], a[k], tok, NULL, tgt, 1.0f / N, NULL);
            double t1 = util_now();
            if (modes[k].mode == CONFIG_AC_NONE) {
                model_backward_b(m[k], a[k], NULL, NULL);
                model_backward_w(m[k], a[k]);
            } else {
                model_backward(m[k], a[k], NULL, NULL);
            }
            double t2 = util_now();
            if (r > 0 && t2 - t0 < tf[k] + tbw[k])
                tf[k] = t1 - t0, tbw[k] = t2 - t1;
        }
    for (int k = 0; k < NM; k++) {
        printf("| %s | %dx%d | %s | %.0f | %.0f / %.0f | %.2fx | %.1f | %.1f |\n", label, B, T, modes[k].name,
               (tf[k] + tbw[k]) * 1e3, tf[k] * 1e3, tbw[k] * 1e3, (tf[k] + tbw[k]) / (tf[0] + tbw[0]),
               model_acts_bytes(a[k]) / 1048576.0, model_work_bytes(m[k]) / 1048576.0);
        model_acts_destroy(&a[k]);
        model_destroy(&m[k]);
    }
    fflush(stdout);
    free(tok), free(tgt), free(w), free(g);
    pool_destroy(&p);
    params_table_free(&tab);
}

static void bench_ac(bench_t *b)
{
    printf("## activation checkpointing (one microbatch, fwd + bwd, the whole model, fp32, one process)\n\n");
    printf("| model | batch x seq | mode | ms | fwd / bwd ms | vs none | activations MiB / microbatch | work sets MiB |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    model_config_t c;
    config_preset("debugmodel", &c);
    bench_ac_shape(b, "demo (debugmodel)", c, 1, 256);
    config_preset("debugmodel", &c); /* ~160M parameters */
    c.dim = 768, c.n_layers = 16, c.n_heads = 12, c.n_kv_heads = 12, c.vocab_size = 32000;
    bench_ac_shape(b, "~160M (768 x 16 layers, vocab 32000)", c, 1, 128);
    printf("\n");
}

/* `ctitan bench --gpu-peak`: the card's measured bf16 matrix-product rate in TFLOP/s (the MFU
 * denominator of `make bench-gpu`), from the CUDA plugin build/lib/libctitan_cuda.so. */
static int gpu_peak(void)
{
    char exe[PATH_MAX], path[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return 1;
    exe[n] = 0;
    *strrchr(exe, '/') = 0;
    snprintf(path, sizeof(path), "%s/../lib/libctitan_cuda.so", exe);
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf(stderr, "bench: cannot load the CUDA backend %s: %s\n", path, dlerror());
        return 1;
    }
    int (*peak)(int, double *);
    const char *(*why)(void);
    *(void **)&peak = dlsym(so, "cuda_matmul_peak_tflops");
    *(void **)&why = dlsym(so, "cuda_matmul_last_error");
    double t = 0;
    int rc = peak && why ? peak(8192, &t) : -1;
    if (rc)
        fprintf(stderr, "bench: cannot measure the GPU's bf16 peak: %s\n", why ? why() : "no such function");
    else
        printf("%.1f\n", t);
    dlclose(so);
    return rc ? 1 : 0;
}

int cmd_bench(int argc, char **argv)
{
    bench_t b = {.threads = (int)sysconf(_SC_NPROCESSORS_ONLN)};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            b.quick = 1;
        } else if (!strcmp(argv[i], "--checkpoints")) {
            b.ckpt_only = 1;
        } else if (!strcmp(argv[i], "--schedules")) {
            b.sched_only = 1;
        } else if (!strcmp(argv[i], "--ac")) {
            b.ac_only = 1;
        } else if (!strcmp(argv[i], "--gpu-peak")) {
            return gpu_peak();
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            b.threads = atoi(argv[++i]);
            if (b.threads < 1) {
                fprintf(stderr, "bench: --threads must be >= 1, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--help")) {
            printf("usage: ctitan bench [--threads N] [--quick] [--checkpoints | --schedules | --ac] | --gpu-peak\n"
                   "Prints the sgemm peak, per-op rates, the training step of the demo and\n"
                   "GPT-2-small-sized models, the process pipeline, every pipeline schedule and\n"
                   "checkpoints as markdown tables (--checkpoints, --schedules: only that section;\n"
                   "--ac: activation checkpointing's cost and memory, not part of the full run).\n"
                   "--gpu-peak prints the GPU's measured bf16 matrix-product rate in TFLOP/s (make\n"
                   "bench-gpu: tools/bench_gpu.sh).\n");
            return 0;
        } else {
            fprintf(stderr, "bench: unknown argument '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    time_t now_t = time(NULL);
    char date[32];
    strftime(date, sizeof(date), "%Y-%m-%d", gmtime(&now_t));
    printf("# ctitan bench, %s, %d threads, %ld CPUs online\n\n", date, b.threads,
           sysconf(_SC_NPROCESSORS_ONLN));
    if (b.ckpt_only)
        return bench_ckpt(b.quick) ? 1 : 0;
    if (b.ac_only) {
        bench_ac(&b);
        return 0;
    }
    measure_peak(&b);
    if (b.sched_only)
        return bench_schedules(b.peak, b.quick) ? 1 : 0;
    bench_ops(&b);
    printf("## training step (forward + backward B + backward W + AdamW, fp32, one process)\n\n");
    printf("MFU = model FLOPs (6 x matmul params incl. lm_head + 12 x layers x dim x seq, per token) / step time / sgemm peak above.\n\n");
    printf("| model | params | batch x seq | step ms | fwd / B / W / adamw ms | tokens/s | GFLOP/s | MFU | activations MiB | loss |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    bench_step(&b, "debugmodel", "demo (debugmodel)", 8, 256);
    bench_step(&b, "gpt2s", "GPT-2-small-sized Llama", b.quick ? 2 : 4, 256);
    printf("\n");
    int rc = bench_pipeline(b.peak, b.quick);
    return rc || bench_schedules(b.peak, b.quick) || bench_ckpt(b.quick) ? 1 : 0;
}
