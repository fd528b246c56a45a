/* Pipeline bench (see bench_pipeline.h). Each configuration is one `ctitan launch` of the
 * demo-shaped model (debugmodel, 8 x 256 tokens per step) on random tokens; the first step
 * is a warm-up and the medians of the rest are reported. */
#include "tools/bench_pipeline.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stages/job/schedule.h"
#include "stages/data/tokfile.h"
#include "ipc/util.h"

#define MAX_PP 8
#define MAX_STEPS 64

typedef struct {
    int n;
    double step[MAX_STEPS], ctl[MAX_STEPS], opt[MAX_STEPS], mfu[MAX_STEPS], tps[MAX_STEPS];
    double bubble[MAX_STEPS], mem[MAX_STEPS];
    double act[MAX_PP][3][MAX_STEPS]; /* per rank: F, B, W ms */
} runs_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[1..n) (step 1 warms up). */
static double median(const double *v, int n)
{
    double tmp[MAX_STEPS];
    int k = 0;
    for (int i = 1; i < n; i++)
        tmp[k++] = v[i];
    if (!k)
        return v[0];
    qsort(tmp, (size_t)k, sizeof(double), cmp_double);
    return k % 2 ? tmp[k / 2] : 0.5 * (tmp[k / 2 - 1] + tmp[k / 2]);
}

static double field(const char *line, const char *key)
{
    const char *p = strstr(line, key);
    return p ? atof(p + strlen(key)) : 0;
}

static int read_metrics(const char *path, int pp, runs_t *r)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    r->n = 0;
    while (r->n < MAX_STEPS && fgets(line, sizeof(line), f)) {
        int i = r->n++;
        r->step[i] = field(line, "\"step_time_ms\": ");
        r->ctl[i] = field(line, "\"ctl_overhead_ms\": ");
        r->opt[i] = field(line, "\"optimizer_ms\": ");
        r->mfu[i] = field(line, "\"mfu\": ");
        r->tps[i] = field(line, "\"tokens_per_s\": ");
        r->bubble[i] = field(line, "\"bubble\": ");
        r->mem[i] = field(line, "\"mem_peak_bytes\": ");
        const char *p = strstr(line, "\"stage_ms\": [");
        for (int s = 0; p && s < pp; s++) {
            p = strchr(p + (s ? 1 : 13), '[');
            if (p)
                sscanf(p, "[%lf, %lf, %lf]", &r->act[s][0][i], &r->act[s][1][i], &r->act[s][2][i]);
        }
    }
    fclose(f);
    return r->n > 0 ? 0 : -1;
}

static int run_job(const char *exe, const char *dir, const char *extra, int pp, runs_t *r)
{
    char cmd[3 * PATH_MAX + 1024], out[PATH_MAX], metrics[PATH_MAX];
    snprintf(out, sizeof(out), "%s/job.out", dir);
    snprintf(metrics, sizeof(metrics), "%s/m.jsonl", dir);
    snprintf(cmd, sizeof(cmd),
             "%s launch %s/bench.toml --job.dump_folder %s/runs --metrics.file %s "
             "--loader.dataset_path %s/tokens.bin %s > %s 2>&1",
             exe, dir, dir, metrics, dir, extra, out);
    if (system(cmd) == 0 && read_metrics(metrics, pp, r) == 0)
        return 0;
    fprintf(stderr, "bench: the job failed (%s):\n", cmd);
    snprintf(cmd, sizeof(cmd), "tail -20 %s >&2", out);
    (void)!system(cmd); /* the job's own words; nothing to add if tail fails */
    return -1;
}

int bench_random_tokens(const char *dir, int n, int vocab)
{
    uint32_t *tok = malloc((size_t)n * sizeof(uint32_t));
    if (!tok)
        return -1;
    uint64_t s = 88172645463325252ULL;
    for (int i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        tok[i] = (uint32_t)(s % (uint64_t)vocab);
    }
    char path[PATH_MAX], err[512];
    snprintf(path, sizeof(path), "%s/tokens.bin", dir);
    int rc = tokfile_write(path, tok, (size_t)n, vocab, err, sizeof(err));
    free(tok);
    if (rc)
        fprintf(stderr, "bench: %s\n", err);
    return rc ? -1 : 0;
}

static int write_inputs(const char *dir)
{
    char path[PATH_MAX];
    if (bench_random_tokens(dir, 300000, 2048))
        return -1;
    snprintf(path, sizeof(path), "%s/bench.toml", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "[job]\nname = \"bench%d\"\n\n[model]\nflavor = \"debugmodel\"\n\n"
               "[training]\nlocal_batch_size = 8\nseq_len = 256\n\n[lr_scheduler]\nwarmup_steps = 2\n\n"
               "[optshard]\nshards = 2\n",
            (int)getpid());
    fclose(f);
    return 0;
}

/* A temporary folder dir (its template, "/tmp/ctitan-bench-XXXXXX") with the bench's manifest
 * and tokens, and this program's path in exe. Returns 0 or -1. */
static int bench_dir(char *dir, char *exe, size_t exelen)
{
    ssize_t n = readlink("/proc/self/exe", exe, exelen - 1);
    if (n <= 0 || !mkdtemp(dir))
        return -1;
    exe[n] = 0;
    return write_inputs(dir);
}

static void remove_dir(const char *dir)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)!system(cmd);
}

int bench_pipeline(double peak_gflops, int quick)
{
    char dir[] = "/tmp/ctitan-bench-XXXXXX", exe[PATH_MAX];
    int rc = bench_dir(dir, exe, sizeof(exe)), steps = quick ? 4 : 8;
    sched_t shown = {0};
    double shown_t[MAX_PP][3];
    printf("## process pipeline (`ctitan launch`, debugmodel 6.2M, 8 x 256 tokens per step, 1F1B, "
           "2 optimizer shards, one stage process per pipeline rank on %ld CPUs)\n\n",
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("Ideal = the 1F1B action lists simulated with the per-action times the stages measured in the "
           "same run (medians over steps 2..%d), plus the optimizer rounds; it includes the bubble but no "
           "waiting on the control plane or rings.\n\n", steps);
    printf("| pp | microbatches | step ms | ideal ms | measured / ideal | tokens/s | MFU | F / B / W ms per "
           "microbatch, by rank | optimizer ms | control plane ms |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (int pp = 1; pp <= 2 && !rc; pp++)
        for (int M = 1; M <= 8 && !rc; M *= 2) {
            char extra[512];
            snprintf(extra, sizeof(extra),
                     "--training.steps %d --parallelism.pipeline_parallel_degree %d "
                     "--parallelism.pipeline_parallel_microbatches %d --metrics.peak_tflops %g",
                     steps, pp, M, peak_gflops * 1e-3);
            runs_t r;
            if ((rc = run_job(exe, dir, extra, pp, &r)))
                break;
            double t[MAX_PP][3];
            char acts[256] = "";
            size_t len = 0;
            for (int s = 0; s < pp; s++) {
                for (int op = 0; op < 3; op++)
                    t[s][op] = median(r.act[s][op], r.n) * 1e-3;
                len += (size_t)snprintf(acts + len, sizeof(acts) - len, "%s%.0f / %.0f / %.0f", s ? "; " : "",
                                        t[s][0] * 1e3, t[s][1] * 1e3, t[s][2] * 1e3);
            }
            sched_t sc;
            char err[256];
            if (sched_build(&sc, pp, 1, M, SCHED_1F1B, err, sizeof(err))) {
                rc = -1;
                break;
            }
            double opt = median(r.opt, r.n), ideal = sched_simulate(&sc, t, 0, NULL) * 1e3 + opt;
            if (pp == 2 && M == 4) { /* the picture of one row, drawn after the table */
                shown = sc;
                memcpy(shown_t, t, sizeof(double) * 3 * pp);
            } else {
                sched_free(&sc);
            }
            double step = median(r.step, r.n);
            printf("| %d | %d | %.0f | %.0f | %.2f | %.0f | %.1f%% | %s | %.1f | %.2f |\n", pp, M, step, ideal,
                   step / ideal, median(r.tps, r.n), 100 * median(r.mfu, r.n), acts, opt, median(r.ctl, r.n));
            fflush(stdout);
        }
    if (!rc && shown.a) {
        printf("\nThe pp 2, 4 microbatches row as the schedule plays it with the measured times (F: digit, B: "
               "letter, W: w, idle: .):\n\n```\n");
        sched_render(&shown, (const double (*)[3])shown_t, 96, stdout);
        printf("```\n");
    }
    sched_free(&shown);
    if (!rc) {
        /* a model with next to no compute: what is left of a step is the control plane */
        runs_t r;
        rc = run_job(exe, dir,
                     "--training.steps 60 --model.flavor tiny --model.vocab_size 2048 --training.seq_len 8 "
                     "--training.local_batch_size 2 --parallelism.pipeline_parallel_degree 2 "
                     "--parallelism.pipeline_parallel_microbatches 2 --metrics.peak_tflops 1",
                     2, &r);
        if (!rc)
            printf("\nControl plane: with a negligible model (tiny, 2 x 8 tokens, pp 2, 2 microbatches, 2 "
                   "optimizer shards: 3 rounds of 2 messages out and 2 back per step) a whole step takes "
                   "**%.2f ms** (median of 59), of which %.2f ms is outside any process's own work.\n\n",
                   median(r.step, r.n), median(r.ctl, r.n));
    }
    remove_dir(dir);
    return rc ? -1 : 0;
}

/* One row of the schedules table: the job of (kind, pp, M) with the kind's default stages per
 * rank, against its own ideal (the schedule simulated with the stages' measured action times,
 * plus the optimizer rounds) and, for the bubble, against the same schedule with equal action
 * times (its theory). *step_ms and *bubble receive the row's medians. A combination the
 * schedule refuses is a row that says why. */
static int schedule_row(const char *exe, const char *dir, sched_kind_t kind, int pp, int M, int steps,
                        double peak_gflops, double *step_ms, double *bubble)
{
    int lo, hi, v;
    char err[256], extra[512];
    *step_ms = *bubble = 0;
    sched_kind_vstages(kind, &lo, &hi, &v);
    if (sched_kind_check(kind, pp, v, M, err, sizeof(err))) {
        printf("| %s | %d | %d | %d | refused: %s | | | | | | | |\n", sched_kind_name(kind), pp, M, v, err);
        return 0;
    }
    snprintf(extra, sizeof(extra),
             "--training.steps %d --parallelism.pipeline_parallel_degree %d --parallelism.pipeline_parallel_microbatches "
             "%d --parallelism.pipeline_parallel_schedule %s --metrics.peak_tflops %g",
             steps, pp, M, sched_kind_name(kind), peak_gflops * 1e-3);
    runs_t r;
    if (run_job(exe, dir, extra, pp, &r))
        return -1;
    double t[MAX_PP][3], eq[MAX_PP][3];
    for (int s = 0; s < pp; s++)
        for (int op = 0; op < 3; op++) {
            t[s][op] = median(r.act[s][op], r.n) * 1e-3;
            eq[s][op] = 1;
        }
    sched_t sc;
    if (sched_build(&sc, pp, v, M, kind, err, sizeof(err)))
        return -1;
    double opt = median(r.opt, r.n), ideal = sched_simulate(&sc, (const double (*)[3])t, 0, NULL) * 1e3 + opt;
    double theory = sched_bubble(&sc, (const double (*)[3])eq, 0), simulated = sched_bubble(&sc, (const double (*)[3])t, 0);
    int acts = 0;
    for (int s = 0; s < pp; s++)
        acts = sched_peak_acts(&sc, s, -1) > acts ? sched_peak_acts(&sc, s, -1) : acts;
    sched_free(&sc);
    *step_ms = median(r.step, r.n);
    *bubble = median(r.bubble, r.n);
    printf("| %s | %d | %d | %d | %.0f | %.0f | %.3f | %.1f%% | %.1f%% | %.1f%% | %d | %.0f |\n",
           sched_kind_name(kind), pp, M, v, *step_ms, ideal, *step_ms / ideal, 100 * *bubble, 100 * simulated,
           100 * theory, acts, median(r.mem, r.n) / 1048576.0);
    fflush(stdout);
    return 0;
}

int bench_schedules(double peak_gflops, int quick)
{
    char dir[] = "/tmp/ctitan-bench-XXXXXX", exe[PATH_MAX];
    int rc = bench_dir(dir, exe, sizeof(exe)), steps = quick ? 4 : 8;
    static const sched_kind_t kinds[] = {SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED_1F1B, SCHED_INTERLEAVED_ZB,
                                         SCHED_ZBV, SCHED_DUALPIPEV};
    printf("## pipeline schedules (`ctitan launch`, debugmodel 6.2M, 8 x 256 tokens per step, each schedule's "
           "default virtual stages per rank, 2 optimizer shards, on %ld CPUs)\n\n", sysconf(_SC_NPROCESSORS_ONLN));
    printf("Ideal: the schedule's action lists simulated with the action times its stages measured in the same "
           "job (medians over steps 2..%d), plus the optimizer rounds. Bubble: the stages' idle share of their "
           "step, measured (the metrics' `bubble`), simulated with the measured times, and in theory (equal F, B "
           "and W times). Kept: the most microbatches a rank keeps the activations of (forward done, weight "
           "gradients not yet: sched_peak_acts, over its chunks). RSS: the largest stage process's peak resident "
           "set, activations, weights and gradients together.\n\n", steps);
    printf("| schedule | pp | microbatches | stages per rank | step ms | ideal ms | measured / ideal | bubble "
           "measured | bubble simulated | bubble theory | kept | RSS MiB |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    double pp1[9] = {0}, best[9] = {0}, f1b[9] = {0}, zb_bubble[9] = {0}, f1b_bubble[9] = {0}, step, bubble;
    const char *best_name[9] = {0};
    for (int M = 1; M <= 8 && !rc; M *= 2)
        rc = schedule_row(exe, dir, SCHED_1F1B, 1, M, steps, peak_gflops, &pp1[M], &bubble);
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]) && !rc; k++)
        for (int M = 1; M <= 8 && !rc; M *= 2) {
            rc = schedule_row(exe, dir, kinds[k], 2, M, steps, peak_gflops, &step, &bubble);
            if (kinds[k] == SCHED_1F1B)
                f1b[M] = step, f1b_bubble[M] = bubble;
            int zero_bubble = kinds[k] == SCHED_INTERLEAVED_ZB || kinds[k] == SCHED_ZBV || kinds[k] == SCHED_DUALPIPEV;
            if (zero_bubble && step > 0 && (best[M] == 0 || step < best[M]))
                best[M] = step, zb_bubble[M] = bubble, best_name[M] = sched_kind_name(kinds[k]);
        }
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]) && !rc && !quick; k++) /* 4 ranks on these CPUs */
        rc = schedule_row(exe, dir, kinds[k], 4, 8, steps, peak_gflops, &step, &bubble);
    if (!rc && best[8] > 0 && pp1[8] > 0 && f1b[8] > 0)
        printf("\nAt 8 microbatches, pp 2: the best zero-bubble schedule (%s) takes %.3f x pp 1's step time "
               "(1F1B: %.3f x), and its measured bubble is %.0f%% of 1F1B's.\n\n", best_name[8], best[8] / pp1[8],
               f1b[8] / pp1[8], f1b_bubble[8] > 0 ? 100 * zb_bubble[8] / f1b_bubble[8] : 0.0);
    remove_dir(dir);
    return rc ? -1 : 0;
}
