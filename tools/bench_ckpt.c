/* Checkpoint bench (see bench_ckpt.h). */
#include "tools/bench_ckpt.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/uring.h"
#include "checkpointd/writer.h"
#include "kernels/config.h"
#include "kernels/params.h"
#include "tools/bench_pipeline.h"
#include "ipc/util.h"

#define REPS 5
#define MAX_STEPS 64

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

/* One checkpoint of the arrays through the real write path; returns seconds or -1. */
static double write_ckpt(const char *dir, const param_table_t *tab, float *const arr[3], int64_t step)
{
    char err[1024], path[PATH_MAX];
    double t0 = util_now();
    ckpt_index_t plan;
    if (ckpt_index_plan(&plan, tab, optim_find("AdamW"), step, "", NULL, 0))
        return -1;
    ckw_t *w;
    int rc = ckw_begin(&w, dir, &plan, err, sizeof(err));
    static _Alignas(4096) uint8_t hdr[CKPT_DATA_HDR];
    for (int a = 0; a < 3 && !rc; a++) {
        ckpt_data_header(hdr, (uint32_t)a, step);
        rc = ckw_write(w, (uint32_t)a, 0, hdr, sizeof(hdr), err, sizeof(err));
        if (!rc)
            rc = ckw_write(w, (uint32_t)a, CKPT_DATA_HDR, arr[a], tab->total * sizeof(float), err, sizeof(err));
    }
    if (!rc)
        rc = ckw_commit(&w, path, sizeof(path), NULL, err, sizeof(err));
    else if (w)
        ckw_abort(&w);
    ckpt_index_free(&plan);
    if (rc) {
        fprintf(stderr, "bench: checkpoint write failed: %s\n", err);
        return -1;
    }
    return util_now() - t0;
}

/* Checkpoint write vs raw write of the same bytes, alternating, for one model size. */
static int bench_write(const char *dir, const char *flavor, const char *label)
{
    model_config_t cfg;
    param_table_t tab;
    if (config_preset(flavor, &cfg) || params_table_init(&tab, &cfg))
        return -1;
    float *arr[3];
    for (int a = 0; a < 3; a++) {
        arr[a] = malloc(tab.total * sizeof(float));
        if (!arr[a])
            return -1;
        uint64_t s = 0x9e3779b97f4a7c15ULL * (a + 1);
        for (size_t i = 0; i < tab.total; i++) { /* incompressible, and every page touched */
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            arr[a][i] = (float)(int64_t)(s >> 12) * 0x1p-40f;
        }
    }
    uint64_t bytes = 3 * (CKPT_DATA_HDR + (uint64_t)tab.total * sizeof(float));
    double ck[REPS], raw[REPS];
    int rc = 0, direct = 0;
    char raw_path[PATH_MAX], ck_dir[PATH_MAX], err[512];
    snprintf(raw_path, sizeof(raw_path), "%s/raw.bin", dir);
    snprintf(ck_dir, sizeof(ck_dir), "%s/ckpt", dir);
    for (int r = 0; r < REPS && !rc; r++)
        for (int k = 0; k < 2 && !rc; k++) {
            /* the order alternates between rounds, and the disk gets a second to drain its
             * write-back cache before each measurement: neither side inherits the other's */
            sync();
            sleep(2);
            if ((k + r) % 2 == 0) {
                if (uw_raw_write(raw_path, bytes, &raw[r], &direct, err, sizeof(err))) {
                    fprintf(stderr, "bench: %s\n", err);
                    rc = -1;
                }
                unlink(raw_path);
            } else {
                if ((ck[r] = write_ckpt(ck_dir, &tab, arr, r + 1)) < 0)
                    rc = -1;
                ckpt_retain(ck_dir, 1);
            }
        }
    if (!rc) {
        double mc = median(ck, REPS), mr = median(raw, REPS), bc = ck[0], br = raw[0]; /* sorted by median() */
        printf("| %s | %.1f | %.2f (%.0f-%.0f) | %.2f (%.0f-%.0f) | %.0f%% | **%.0f%%** |\n", label, bytes / 1048576.0,
               bytes / mr / 1e9, br * 1e3, raw[REPS - 1] * 1e3, bytes / mc / 1e9, bc * 1e3, ck[REPS - 1] * 1e3,
               100 * br / bc, 100 * mr / mc);
    }
    for (int a = 0; a < 3; a++)
        free(arr[a]);
    params_table_free(&tab);
    return rc;
}

typedef struct {
    int n;
    double step[MAX_STEPS];  /* ms, index = step - 1 */
    int n_saved;
    double write_s[MAX_STEPS], write_mib[MAX_STEPS];
} job_t;

static int run_job(const char *exe, const char *dir, const char *name, const char *extra, job_t *j)
{
    char cmd[4 * PATH_MAX], out[PATH_MAX], metrics[PATH_MAX], line[8192];
    snprintf(out, sizeof(out), "%s/%s.out", dir, name);
    snprintf(metrics, sizeof(metrics), "%s/%s.jsonl", dir, name);
    snprintf(cmd, sizeof(cmd),
             "%s launch manifests/demo.toml --job.name %s%d --job.dump_folder %s/%s --metrics.file %s "
             "--loader.dataset_path %s/tokens.bin --validation.enable false --sample.tokens 0 "
             "%s > %s 2>&1",
             exe, name, (int)getpid(), dir, name, metrics, dir, extra, out);
    memset(j, 0, sizeof(*j));
    if (system(cmd)) {
        fprintf(stderr, "bench: the job failed (%s):\n", cmd);
        snprintf(cmd, sizeof(cmd), "tail -20 %s >&2", out);
        (void)!system(cmd);
        return -1;
    }
    FILE *f = fopen(metrics, "r");
    while (f && fgets(line, sizeof(line), f) && j->n < MAX_STEPS) {
        const char *p = strstr(line, "\"step_time_ms\": ");
        if (p)
            j->step[j->n++] = atof(p + 16);
    }
    if (f)
        fclose(f);
    f = fopen(out, "r");
    while (f && fgets(line, sizeof(line), f) && j->n_saved < MAX_STEPS) {
        double mib, s;
        const char *p = strstr(line, " MiB written in ");
        if (!strncmp(line, "checkpoint: step ", 17) && p && sscanf(strrchr(line, '(') + 1, "%lf", &mib) == 1 &&
            sscanf(p + 16, "%lf", &s) == 1) {
            j->write_mib[j->n_saved] = mib;
            j->write_s[j->n_saved++] = s;
        }
    }
    if (f)
        fclose(f);
    return j->n ? 0 : -1;
}

static int bench_stall(const char *exe, const char *dir, int quick)
{
    int steps = quick ? 16 : 60, every = quick ? 4 : 5;
    char extra[256];
    job_t with, without;
    snprintf(extra, sizeof(extra), "--training.steps %d --checkpoint.enable true --checkpoint.interval %d "
             "--checkpoint.keep_latest_k 2", steps, every);
    if (bench_random_tokens(dir, 400000, 2048) || run_job(exe, dir, "ck", extra, &with))
        return -1;
    snprintf(extra, sizeof(extra), "--training.steps %d", steps);
    if (run_job(exe, dir, "nock", extra, &without))
        return -1;
    /* neighbours: steps 2.. that are neither a checkpoint's next step nor the one after */
    double base[MAX_STEPS], extra1[MAX_STEPS], extra2[MAX_STEPS], all_with[MAX_STEPS], all_without[MAX_STEPS];
    int nb = 0, nc = 0;
    for (int s = 2; s <= with.n; s++) {
        int after = (s - 1) % every == 0 || (s - 2) % every == 0; /* s = c+1 or c+2 */
        if (!after || s <= every)
            base[nb++] = with.step[s - 1];
    }
    double b = median(base, nb);
    for (int c = every; c + 2 <= with.n; c += every) {
        extra1[nc] = with.step[c] - b;
        extra2[nc++] = with.step[c] + with.step[c + 1] - 2 * b;
    }
    for (int s = 2; s <= with.n; s++) {
        all_with[s - 2] = with.step[s - 1];
        all_without[s - 2] = without.step[s - 1];
    }
    double e1 = median(extra1, nc), e2 = median(extra2, nc);
    double mib = with.n_saved ? median(with.write_mib, with.n_saved) : 0;
    double ws = with.n_saved ? median(with.write_s, with.n_saved) : 0;
    double mw = median(all_with, with.n - 1), mo = median(all_without, without.n - 1);
    printf("\nTraining stall, `ctitan launch manifests/demo.toml` (debugmodel, pp 2, 1F1B, 8 microbatches, 2 "
           "optimizer shards) for %d steps with a checkpoint every %d (%d checkpoints of %.1f MiB, written by "
           "checkpointd in %.2f s each, median) and the same job without checkpoints:\n\n", steps, every,
           with.n_saved, mib, ws);
    printf("| median step ms (neighbours) | extra ms, step after a checkpoint | share of a step | extra ms, two "
           "steps after | share of a step | median step ms with / without checkpoints |\n|---|---|---|---|---|---|\n");
    printf("| %.1f | %.1f | **%.2f%%** | %.1f | %.2f%% | %.1f / %.1f |\n", b, e1, 100 * e1 / b, e2, 100 * e2 / b, mw,
           mo);
    return 0;
}

int bench_ckpt(int quick)
{
    char dir[] = "/tmp/ctitan-bench-ckpt-XXXXXX", exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0 || !mkdtemp(dir))
        return -1;
    exe[n] = 0;
    struct statfs sf;
    const char *fs = statfs(dir, &sf) ? "?" : sf.f_type == 0xEF53 ? "ext4" : sf.f_type == 0x58465342 ? "xfs"
                   : sf.f_type == 0x01021994 ? "tmpfs" : sf.f_type == 0x9123683E ? "btrfs" : "other";
    printf("## checkpoints (checkpointd: io_uring, 8 x 4 MiB registered buffers, O_DIRECT, fsync + rename)\n\n");
    printf("Write = a whole checkpoint through checkpointd's path (plan, 3 data files with the XXH3 checksum of "
           "every 4 MiB chunk taken as it streams, index, fsync of files and directories, rename); raw = the same number of bytes written "
           "sequentially to one file through the same io_uring path with nothing else (fsync included), from "
           "buffers of random bytes. Alternating (the order switching every round, a sync and 2 s of rest before "
           "each), medians of %d, in %s (%s).\n\n", REPS, dir, fs);
    printf("| model | checkpoint MiB | raw GB/s (ms: best-worst) | checkpoint GB/s (ms: best-worst) | checkpoint / raw "
           "rate, best of each | **checkpoint / raw rate, medians** |\n|---|---|---|---|---|---|\n");
    int rc = bench_write(dir, "debugmodel", "demo (debugmodel, 6.2M)");
    if (!rc && !quick)
        rc = bench_write(dir, "gpt2s", "GPT-2-small-sized Llama");
    if (!rc)
        rc = bench_stall(exe, dir, quick);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)!system(cmd);
    printf("\n");
    return rc;
}
