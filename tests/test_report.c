/* What a whole job (`ctitan launch`, real processes and files) tells the user, issue 14's
 * "training you can watch" (stages/coord/coord_report.c): the peak MFU is measured against and
 * where it came from (measured once into the cache, read from it at the next launch, or given
 * by metrics.peak_tflops), and the validation loss in the metrics file at full precision
 * beside the printed short form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "ipc/util.h"
#include "kernels/config.h"
#include "stages/report/peak_cache.h"
#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("report"); }
static int teardown(void **state) { return tj_teardown(); }

/* The line of out that starts with `start` into line ("" when none). */
static void find_line(const char *out, const char *start, char *line, size_t n)
{
    line[0] = 0;
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, start, strlen(start))) {
            size_t len = strcspn(p, "\n");
            snprintf(line, n, "%.*s", (int)len, p);
            return;
        }
}

/* Every step record's mfu is its tokens_per_s x model FLOPs per token / the peak (mfu and
 * tokens/s are printed with 5 and 1 decimals). */
static void assert_mfu_against(const char *job, double gflops)
{
    static char buf[1 << 16];
    model_config_t cfg;
    char err[256];
    config_preset("tiny", &cfg); /* manifests/tiny.toml's model */
    config_set(&cfg, "vocab_size", "300", err, sizeof(err));
    config_set(&cfg, "dim", "32", err, sizeof(err));
    double fpt = config_flops_per_token(&cfg, 32);
    tj_read_metrics(job, buf, sizeof(buf));
    int n = 0;
    for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n")) {
        const char *t = strstr(l, "\"tokens_per_s\": "), *m = strstr(l, "\"mfu\": ");
        if (!t || !m)
            continue;
        double want = fpt * atof(t + 16) / (gflops * 1e9), got = atof(m + 7);
        if (fabs(got - want) > 1e-5 + 1e-3 * want)
            fail_msg("%s: mfu %g, %g against %.17g GFLOP/s: %s", job, got, want, gflops, l);
        n++;
    }
    assert_true(n > 0);
}

/* A launch with a malformed cache file warns, naming the file and what is wrong, measures the
 * peak (n=2048) and writes the file; the next launch takes the peak from it (no measurement:
 * the banner says so, the same value) and its MFU divides by it; metrics.peak_tflops wins
 * over it and leaves the file as it was. */
static void test_report_peak_is_measured_once_then_read_from_the_cache(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], cache[256], env[300], line[4096], want[1024], err[512], before[4096], after[4096];
    tj_name(j, sizeof(j), 'r', "peak");
    snprintf(cache, sizeof(cache), "%s/cache/peak", tj_dir);
    snprintf(env, sizeof(env), "CTITAN_PEAK_CACHE=%s", cache);
    snprintf(line, sizeof(line), "%s/cache", tj_dir);
    assert_int_equal(util_mkdirs(line), 0);
    FILE *f = fopen(cache, "w");
    assert_non_null(f);
    fputs("not a cache\n", f);
    fclose(f);

    int rc = tj_launch(env, 300, j, "--training.steps 3 --metrics.peak_tflops 0", out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    find_line(out, "launch: warning: ", line, sizeof(line));
    snprintf(want, sizeof(want),
             "launch: warning: %s:1: not a ctitan peak cache (expected 'ctitan sgemm peak cache 1'): measuring again",
             cache);
    assert_string_equal(line, want);
    peak_cache_entry_t e;
    assert_int_equal(peak_cache_read(cache, &e, err, sizeof(err)), 0);
    assert_int_equal(e.key.n, 2048);
    assert_true(e.gflops > 0);
    find_line(out, "launch: MFU against ", line, sizeof(line));
    snprintf(want, sizeof(want), "launch: MFU against %.0f GFLOP/s, the sgemm peak measured now (n=2048, median of %d "
             "runs, %d threads, OpenBLAS %s kernels) and cached at %s", e.gflops, e.key.runs, e.key.threads,
             e.key.core, cache);
    assert_string_equal(line, want);
    assert_int_equal(e.key.threads, (int)sysconf(_SC_NPROCESSORS_ONLN));
    assert_mfu_against(j, e.gflops);
    tu_read_file(cache, before, sizeof(before));

    rc = tj_launch(env, 300, j, "--training.steps 3 --metrics.peak_tflops 0", out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_null(strstr(out, "warning"));
    find_line(out, "launch: MFU against ", line, sizeof(line));
    snprintf(want, sizeof(want), "launch: MFU against %.0f GFLOP/s, the sgemm peak from the cache %s (n=2048", e.gflops,
             cache);
    if (strncmp(line, want, strlen(want)))
        fail_msg("banner '%s', expected it to start '%s'", line, want);
    assert_mfu_against(j, e.gflops);
    tu_read_file(cache, after, sizeof(after));
    assert_string_equal(before, after);

    rc = tj_launch(env, 300, j, "--training.steps 3 --metrics.peak_tflops 2.5", out, sizeof(out));
    assert_int_equal(rc, 0);
    find_line(out, "launch: MFU against ", line, sizeof(line));
    assert_string_equal(line, "launch: MFU against 2500 GFLOP/s, given by metrics.peak_tflops = 2.5");
    assert_mfu_against(j, 2500);
    tu_read_file(cache, after, sizeof(after));
    assert_string_equal(before, after);
    tj_read_metrics(j, out, sizeof(out));
    assert_null(strstr(out, "val_loss")); /* no validation, no record */
}

/* A job on job.device = "cuda" divides by the GPU's bf16 peak, never the CPU's sgemm peak (the
 * progress line read mfu 517% on an H100, issue 25): taken from the cache for the GPU's model;
 * on a machine with no GPU to name, no MFU at all, the banner saying why (emulated backend). */
static void test_report_gpu_job_mfu_is_against_the_gpus_peak(void **state)
{
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    static char out[1 << 16];
    char j[32], cache[256], env[600], line[4096], err[512];
    const char *shape = "--training.steps 2 --metrics.peak_tflops 0 --model.dim 32 --model.n_heads 2 "
                        "--model.n_kv_heads 1 --job.device cuda";
    tj_name(j, sizeof(j), 'r', "gpupeak");
    snprintf(cache, sizeof(cache), "%s/cache-gpu/peak", tj_dir);
    peak_cache_entry_t e = {.key = {.cpu = "NVIDIA Test GPU", .threads = 1, .blas = "cuBLASLt bf16", .core = "cuda",
                                    .n = PEAK_GPU_N, .runs = PEAK_CACHE_RUNS},
                            .gflops = 500000, .native = 500000, .pooled = 500000, .measured = 1800000000};
    assert_int_equal(peak_cache_write(cache, &e, err, sizeof(err)), 0);
    snprintf(env, sizeof(env), "CTITAN_PEAK_CACHE=%s CTITAN_GPU_MODEL='NVIDIA Test GPU'", cache);
    int rc = tj_launch(env, 300, j, shape, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    find_line(out, "launch: MFU against ", line, sizeof(line));
    char want[1024];
    snprintf(want, sizeof(want), "launch: MFU against 500000 GFLOP/s, the GPU's bf16 peak from the cache %s "
             "(NVIDIA Test GPU, cuBLASLt 8192^3; measured 2027-01-15 08:00 UTC)", cache);
    assert_string_equal(line, want);
    assert_mfu_against(j, 500000);

    if (access("/proc/driver/nvidia/gpus", F_OK) == 0)
        skip(); /* a GPU to name: the peak would be measured */
    snprintf(env, sizeof(env), "CTITAN_PEAK_CACHE=%s", cache); /* holds no peak for this machine's (no) GPU */
    rc = tj_launch(env, 300, j, shape, out, sizeof(out));
    assert_int_equal(rc, 0);
    assert_null(strstr(out, "MFU against"));
    find_line(out, "launch: no GPU peak", line, sizeof(line));
    assert_string_equal(line, "launch: no GPU peak (no NVIDIA GPU in /proc/driver/nvidia/gpus to measure the bf16 "
                              "peak of): MFU is not computed; set metrics.peak_tflops");
    find_line(out, "step     2", line, sizeof(line));
    if (!strstr(line, "  mfu    n/a  "))
        print_error("%s\n", out);
    assert_non_null(strstr(line, "  mfu    n/a  "));
}

/* With validation the metrics file's last record is the validation loss at the last step:
 * %.17g, which round-trips, and rounds to the 4 decimals the done line prints; over the batches
 * the line names, batch x seq_len tokens each. */
static void test_report_validation_loss_goes_into_the_metrics_file(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16], buf[1 << 16];
    char j[32], extra[512], line[4096];
    tj_name(j, sizeof(j), 'r', "val");
    snprintf(extra, sizeof(extra),
             "--training.steps 4 --validation.enable true --validation.dataset_path %s/data/val.bin "
             "--validation.steps 3", tj_dir);
    int rc = tj_launch("", 300, j, extra, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    find_line(out, "done: ", line, sizeof(line));
    const char *p = strstr(line, "; validation loss ");
    assert_non_null(p);
    char shown[32];
    int batches;
    assert_int_equal(sscanf(p, "; validation loss %31s over %d batches", shown, &batches), 2);
    assert_int_equal(batches, 3);

    tj_read_metrics(j, buf, sizeof(buf));
    char *last = buf + strlen(buf) - 1; /* the last line */
    assert_true(*last == '\n');
    *last = 0;
    last = strrchr(buf, '\n') ? strrchr(buf, '\n') + 1 : buf;
    assert_non_null(strstr(buf, "{\"step\": 4, \"loss\": "));
    char full[64];
    int step, vb;
    long long tokens;
    if (sscanf(last, "{\"step\": %d, \"val_loss\": %63[^,], \"val_batches\": %d, \"val_tokens\": %lld}", &step, full,
               &vb, &tokens) != 4)
        fail_msg("the last record is not the validation's: %s", last);
    assert_int_equal(step, 4);
    assert_int_equal(vb, batches);
    assert_int_equal(tokens, 3LL * 4 * 32); /* tiny.toml: local_batch_size 4, seq_len 32 */
    char *end;
    double v = strtod(full, &end), s = atof(shown);
    assert_true(*end == 0);
    char again[64], rounded[32];
    snprintf(again, sizeof(again), "%.17g", v);
    assert_string_equal(again, full);        /* written with every digit */
    snprintf(rounded, sizeof(rounded), "%.4f", v);
    assert_string_equal(rounded, shown);     /* the printed value is its short form */
    assert_true(strlen(full) > 12);
    assert_true(v != s && fabs(v - s) <= 5e-5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_peak_is_measured_once_then_read_from_the_cache),
        cmocka_unit_test(test_report_validation_loss_goes_into_the_metrics_file),
        cmocka_unit_test(test_report_gpu_job_mfu_is_against_the_gpus_peak),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
