/* The machine's fp32 matrix-product rate, which MFU figures are measured against: OpenBLAS
 * with its own threads, and ctitan's pool splitting rows over single-threaded sgemm (as the
 * trainer runs). */
#ifndef CTITAN_PEAK_H
#define CTITAN_PEAK_H

/* Best of 3 n x n x n sgemm runs each way, in GFLOP/s. Pins OpenBLAS to one thread
 * afterwards (the pool's rule). Returns the higher of the two, or 0 on ENOMEM. */
double peak_sgemm_gflops(int threads, int n, double *native, double *pooled);

#endif
