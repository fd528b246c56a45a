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

static double best_of_3_pooled(pool_t *p, float *y, const float *x, const float *w, int n)
{
    double best = 1e30;
    for (int r = 0; r < 4; r++) { /* the first warms up */
        double t0 = now();
        if (p)
            ops_matmul_fwd(p, y, x, w, n, n, n);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, x, n, w, n, 0.0f, y, n);
        double t = now() - t0;
        if (r > 0 && t < best)
            best = t;
    }
    return best;
}

double peak_sgemm_gflops(int threads, int n, double *native, double *pooled)
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
    double a = flops / best_of_3_pooled(NULL, y, x, w, n) * 1e-9;
    pool_t *p = pool_new(threads); /* pins OpenBLAS to one thread from here on */
    double b = flops / best_of_3_pooled(p, y, x, w, n) * 1e-9;
    pool_destroy(&p);
    free(x), free(w), free(y);
    if (native)
        *native = a;
    if (pooled)
        *pooled = b;
    return a > b ? a : b;
}
