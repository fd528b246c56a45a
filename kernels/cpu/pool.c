/* Thread pool behind the CPU kernels: workers block on a condition variable between
 * parallel regions (two vCPUs cannot afford spinning) and pull task indices atomically. */
#include "kernels/cpu/pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>

struct pool {
    int nthreads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned long generation; /* bumped for each pool_for */
    int active;               /* workers still inside the current region */
    int stop;
    pool_fn fn;
    void *ctx;
    int ntasks;
    atomic_int next;
};

/* OpenBLAS must never thread on its own: its own split of a product could differ from run
 * to run, and its spinning threads would fight the pool for the two cores. */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) { openblas_set_num_threads(1); }

static void run_tasks(pool_t *p)
{
    for (;;) {
        int t = atomic_fetch_add(&p->next, 1);
        if (t >= p->ntasks)
            return;
        p->fn(p->ctx, t);
    }
}

static void *worker(void *arg)
{
    pool_t *p = arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->start, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_tasks(p);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Stops and joins workers [1, started) of a pool being given up, then frees it. */
static void pool_free(pool_t *p, int started, int sync_made)
{
    if (sync_made) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_broadcast(&p->start);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < started; i++)
            pthread_join(p->threads[i], NULL);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->start);
        pthread_cond_destroy(&p->done);
    }
    free(p->threads);
    free(p);
}

pool_t *pool_new(int nthreads)
{
    if (nthreads < 1)
        nthreads = 1;
    if (nthreads > POOL_MAX_THREADS)
        nthreads = POOL_MAX_THREADS;
    pthread_once(&blas_once, blas_single_thread);
    pool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->nthreads = nthreads;
    if (!(p->threads = calloc((size_t)nthreads, sizeof(pthread_t)))) {
        pool_free(p, 0, 0);
        errno = ENOMEM;
        return NULL;
    }
    int rc = pthread_mutex_init(&p->mu, NULL);
    if (rc || (rc = pthread_cond_init(&p->start, NULL)) || (rc = pthread_cond_init(&p->done, NULL))) {
        pool_free(p, 0, 0); /* none of them allocates on Linux: nothing to destroy */
        errno = rc;
        return NULL;
    }
    for (int i = 1; i < nthreads; i++)
        if ((rc = pthread_create(&p->threads[i], NULL, worker, p)) != 0) {
            pool_free(p, i, 1); /* all or none: a smaller pool would hide that it is smaller */
            errno = rc;
            return NULL;
        }
    return p;
}

void pool_destroy(pool_t **pp)
{
    pool_t *p = *pp;
    if (!p)
        return;
    pool_free(p, p->nthreads, 1);
    *pp = NULL;
}

int pool_threads(const pool_t *p) { return p ? p->nthreads : 1; }

void pool_for(pool_t *p, int ntasks, pool_fn fn, void *ctx)
{
    if (ntasks <= 0)
        return;
    pthread_once(&blas_once, blas_single_thread);
    if (!p || p->nthreads == 1 || ntasks == 1) {
        for (int t = 0; t < ntasks; t++)
            fn(ctx, t);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->ntasks = ntasks;
    atomic_store(&p->next, 0);
    p->active = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);

    run_tasks(p);

    pthread_mutex_lock(&p->mu);
    while (p->active > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
