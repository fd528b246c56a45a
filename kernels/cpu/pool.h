/* A fixed pool of worker threads for the CPU kernels.
 * Work is cut into tasks whose boundaries never depend on the thread count, and each
 * task writes its own outputs, so results are bitwise identical for any pool size. */
#ifndef CTITAN_POOL_H
#define CTITAN_POOL_H

typedef struct pool pool_t;
typedef void (*pool_fn)(void *ctx, int task);

/* nthreads >= 1 counts the calling thread; 1 means run everything inline.
 * The first pool_new or pool_for pins OpenBLAS to one thread: the pool, not OpenBLAS,
 * splits matrix products. */
pool_t *pool_new(int nthreads);
void pool_destroy(pool_t **p);
int pool_threads(const pool_t *p);   /* 1 for NULL */

/* Runs fn(ctx, t) for t in [0, ntasks), tasks handed out in order; returns when all are
 * done. p may be NULL (inline). Workers sleep on a condition variable between calls. */
void pool_for(pool_t *p, int ntasks, pool_fn fn, void *ctx);

#endif
