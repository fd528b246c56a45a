/* sgemm peak measurement (see peak.h). */
#include "kernels/cpu/peak.h"

#include <stdlib.h>
#include <time.h>

#include <cblas.h>

#include "kernels/ops.h"

/* kernels/ sits below ipc/ (no util_now here) */
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The best (median = 0) or the median of `runs` timings of y = x w^T, after one warm-up: on the
 * pool p, or OpenBLAS's own threads when p is NULL. */
static double timing(pool_t *p, float *y, const float *x, const float *w, int n, int runs, int median)
{
    double t[65];
    runs = runs < 1 ? 1 : runs > 64 ? 64 : runs;
    for (int r = 0; r <= runs; r++) { /* the first warms up */
        double t0 = now();
        if (p)
            ops_matmul_fwd(p, y, x, w, n, n, n);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, x, n, w, n, 0.0f, y, n);
        t[r] = now() - t0;
    }
    qsort(t + 1, (size_t)runs, sizeof(double), cmp_double);
    return median ? (runs % 2 ? t[1 + runs / 2] : 0.5 * (t[runs / 2] + t[1 + runs / 2])) : t[1];
}

static double measure(int threads, int n, int runs, int median, double *native, double *pooled)
{
    size_t nn = (size_t)n * n;
    float *x = malloc(nn * sizeof(float)), *w = malloc(nn * sizeof(float)), *y = malloc(nn * sizeof(float));
    if (!x || !w || !y) {
        free(x), free(w), free(y);
        return 0;
    }
    for (size_t i = 0; i < nn; i++)
        x[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f, w[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    double flops = 2.0 * n * n * n;
    openblas_set_num_threads(threads);
    double a = flops / timing(NULL, y, x, w, n, runs, median) * 1e-9;
    pool_t *p = pool_new(threads); /* pins OpenBLAS to one thread from here on */
    double b = flops / timing(p, y, x, w, n, runs, median) * 1e-9;
    pool_destroy(&p);
    free(x), free(w), free(y);
    if (native)
        *native = a;
    if (pooled)
        *pooled = b;
    return a > b ? a : b;
}

double peak_sgemm_gflops(int threads, int n, double *native, double *pooled)
{
    return measure(threads, n, 3, 0, native, pooled);
}

double peak_sgemm_median_gflops(int threads, int n, int runs, double *native, double *pooled)
{
    return measure(threads, n, runs, 1, native, pooled);
}
