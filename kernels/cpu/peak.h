/* The machine's fp32 matrix-product rate, which MFU figures are measured against: OpenBLAS
 * with its own threads, and ctitan's pool splitting rows over single-threaded sgemm (as the
 * trainer runs). */
#ifndef CTITAN_PEAK_H
#define CTITAN_PEAK_H

/* Best of 3 n x n x n sgemm runs each way, in GFLOP/s. Pins OpenBLAS to one thread
 * afterwards (the pool's rule). Returns the higher of the two, or 0 on ENOMEM. `ctitan bench`
 * uses it: its figures compare within one run. */
double peak_sgemm_gflops(int threads, int n, double *native, double *pooled);

/* The same with the median of `runs` timed runs each way (after one warm-up) instead of the
 * best of 3: less at the mercy of one lucky or unlucky run, for a peak that is measured once
 * and kept (stages/report/peak_cache.h). */
double peak_sgemm_median_gflops(int threads, int n, int runs, double *native, double *pooled);

#endif
