/* The sgemm peak the coordinator's MFU divides by, measured once per machine and kept in a
 * small file, so that the same step speed reads as the same MFU from launch to launch
 * (issue 14). `metrics.peak_tflops` wins over it; `ctitan bench` measures its own peak in the
 * same run instead (kernels/cpu/peak.h). */
#ifndef CTITAN_PEAK_CACHE_H
#define CTITAN_PEAK_CACHE_H

#include <limits.h>
#include <stddef.h>

#define PEAK_CACHE_VERSION 1
#define PEAK_CACHE_N 2048  /* the product's size: n x n x n */
#define PEAK_CACHE_RUNS 5  /* timed runs each way, after a warm-up; their median counts */

/* What a measured peak holds for: the same CPU model, thread count, OpenBLAS build and kernel
 * set, and the same measurement. Strings are one line each (control characters become '?'). */
typedef struct {
    char cpu[128];  /* /proc/cpuinfo's first "model name" ("unknown" without one) */
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
} peak_from_t;

typedef struct {
    double gflops;
    peak_from_t from;
    peak_cache_entry_t entry;   /* unless PEAK_GIVEN */
    int cached;                 /* PEAK_MEASURED: written to path */
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

/* One line for the banner: which peak, from where ("given by metrics.peak_tflops = 1", "the
 * sgemm peak from the cache PATH (measured ...)", "... measured now ... and cached at PATH"). */
void peak_cache_describe(const peak_cache_t *p, char *buf, size_t n);

#endif
