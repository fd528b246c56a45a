/* A fixed pool of worker threads for the CPU kernels.
 * Work is cut into tasks whose boundaries never depend on the thread count, and each
 * task writes its own outputs, so results are bitwise identical for any pool size. */
#ifndef CTITAN_POOL_H
#define CTITAN_POOL_H

typedef struct pool pool_t;
typedef void (*pool_fn)(void *ctx, int task);

/* The most threads a pool runs (training.threads is checked against it): more only wake one
 * another on each region (1024 on 2 CPUs already cost ~0.5 s a step of the tiny model). */
#define POOL_MAX_THREADS 1024

/* nthreads >= 1 counts the calling thread; 1 means run everything inline; more than
 * POOL_MAX_THREADS runs POOL_MAX_THREADS. Returns NULL with errno set (ENOMEM, EAGAIN) when
 * the pool or any of its threads cannot be had: never a pool smaller than asked for.
 * The first pool_new or pool_for pins OpenBLAS to one thread: the pool, not OpenBLAS,
 * splits matrix products. */
pool_t *pool_new(int nthreads);
void pool_destroy(pool_t **p);
int pool_threads(const pool_t *p);   /* 1 for NULL */

/* Runs fn(ctx, t) for t in [0, ntasks), tasks handed out in order; returns when all are
 * done. p may be NULL (inline). Workers sleep on a condition variable between calls. */
void pool_for(pool_t *p, int ntasks, pool_fn fn, void *ctx);

#endif
