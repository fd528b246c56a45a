/* The peak the coordinator's MFU divides by, measured once per machine and kept in a small
 * file, so that the same step speed reads as the same MFU from launch to launch (issue 14): the
 * CPU's sgemm peak for a CPU job, the GPU's bf16 matrix-product peak (`ctitan bench
 * --gpu-peak`, cuBLASLt) for a job on job.device = "cuda" (issue 25: a GPU job's MFU was
 * divided by the CPU's peak and read 517%). `metrics.peak_tflops` wins over both; `ctitan
 * bench` measures its own peak in the same run instead (kernels/cpu/peak.h). */
#ifndef CTITAN_PEAK_CACHE_H
#define CTITAN_PEAK_CACHE_H

#include <limits.h>
#include <stddef.h>

#define PEAK_CACHE_VERSION 1
#define PEAK_CACHE_N 2048  /* the product's size: n x n x n */
#define PEAK_CACHE_RUNS 5  /* timed runs each way, after a warm-up; their median counts */
#define PEAK_GPU_N 8192    /* the GPU's product: n x n x n bf16 (cuda_matmul_peak_tflops) */

/* What a measured peak holds for: the same CPU model, thread count, OpenBLAS build and kernel
 * set, and the same measurement. Strings are one line each (control characters become '?'). */
typedef struct {
    char cpu[128];  /* /proc/cpuinfo's first "model name" ("unknown" without one); for a GPU
                     * peak the GPU's model (peak_gpu_model) */
    int threads;    /* the threads it is measured with */
    char blas[160]; /* openblas_get_config(): version and build */
    char core[64];  /* openblas_get_corename(): the kernels in use (OPENBLAS_CORETYPE, NOTES.md) */
    int n, runs;
} peak_cache_key_t;

typedef struct {
    peak_cache_key_t key;
    double gflops;         /* the higher of the two below */
    double native, pooled; /* OpenBLAS's own threads; ctitan's pool (as the trainer runs) */
    long long measured;    /* when, in seconds since the epoch */
} peak_cache_entry_t;

/* This process's key for `threads` threads (n and runs: PEAK_CACHE_N, PEAK_CACHE_RUNS). */
void peak_cache_key(peak_cache_key_t *k, int threads);

/* The cache file for key k: $CTITAN_PEAK_CACHE when set (a file), else
 * $XDG_CACHE_HOME/ctitan/peak-<XXH64 of the key>, else the same under $HOME/.cache. Returns 0,
 * or -ENOENT when none of the three is set, -ENAMETOOLONG. */
int peak_cache_path(const peak_cache_key_t *k, char *path, size_t n);

/* Reads the cache file at path (text: a version line, then one `name value` line per field in
 * a fixed order). Returns 0, -ENOENT when there is none, or -errno / -EINVAL with
 * "PATH[:LINE]: what is wrong" in err. */
int peak_cache_read(const char *path, peak_cache_entry_t *e, char *err, size_t errlen);

/* The text of e as peak_cache_write writes it into buf[n]. Returns its length (>= n: cut). */
int peak_cache_format(const peak_cache_entry_t *e, char *buf, size_t n);

/* Writes e to path durably (temporary file, fsync, rename), making its folder first. Returns 0
 * or -errno with the reason, naming the file, in err. */
int peak_cache_write(const char *path, const peak_cache_entry_t *e, char *err, size_t errlen);

typedef enum {
    PEAK_GIVEN,    /* metrics.peak_tflops */
    PEAK_CACHED,   /* read from the cache file */
    PEAK_MEASURED, /* measured now (and written to the cache file, if `cached`) */
    PEAK_NONE,     /* a GPU job on a machine where no GPU peak can be had: MFU is not computed */
} peak_from_t;

typedef struct {
    double gflops;
    peak_from_t from;
    peak_cache_entry_t entry;   /* unless PEAK_GIVEN */
    int cached;                 /* PEAK_MEASURED: written to path */
    int gpu;                    /* the GPU's bf16 peak, not the CPU's sgemm */
    char path[PATH_MAX];        /* the cache file ("" when there is none) */
    char warning[PATH_MAX + 512]; /* why the cache was passed over or not written ("" if not) */
} peak_cache_t;

/* What peak_cache_get measures with: peak_sgemm_median_gflops's signature. */
typedef double (*peak_measure_fn)(int threads, int n, int runs, double *native, double *pooled);

/* The peak to divide by: given_gflops when > 0; else the cache file's for this machine's key
 * with `threads`; else measured with `measure` (NULL: peak_sgemm_median_gflops) and written
 * to the cache file. A cache file that cannot be read, is malformed or holds another key is
 * passed over, and why goes into p->warning; so does a failed write. Never fails: a peak that
 * cannot be measured is 0. Returns p->gflops. */
double peak_cache_get(double given_gflops, int threads, peak_measure_fn measure, peak_cache_t *p);

/* The model of the machine's first NVIDIA GPU in bus order, as its driver names it
 * (/proc/driver/nvidia/gpus/<bus>/information, "Model:"), or $CTITAN_GPU_MODEL when set (tests,
 * machines without that file). Returns 0, or -ENODEV when there is neither. */
int peak_gpu_model(char *dst, size_t n);

/* What peak_cache_get_gpu measures with: the GPU's bf16 peak in GFLOP/s, 0 when it cannot. */
typedef double (*peak_gpu_measure_fn)(void *arg);

/* The GPU's bf16 peak for a job on job.device = "cuda": given_gflops when > 0; else the cache
 * file's for this GPU model (the key: peak_gpu_model, 1 thread, "cuBLASLt bf16", "cuda", PEAK_GPU_N); else
 * measure(arg), written to the cache file. No GPU model, or a measurement that fails, gives
 * PEAK_NONE with 0 and why in p->warning (MFU is then not computed; a CPU peak would be
 * meaningless). Returns p->gflops. */
double peak_cache_get_gpu(double given_gflops, peak_gpu_measure_fn measure, void *arg, peak_cache_t *p);

/* One line for the banner: which peak, from where ("given by metrics.peak_tflops = 1", "the
 * sgemm peak from the cache PATH (measured ...)", "... measured now ... and cached at PATH"). */
void peak_cache_describe(const peak_cache_t *p, char *buf, size_t n);

#endif
