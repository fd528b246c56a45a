/* Where a GPU process's time goes, per kernel, with no change to the program profiled: a CUDA
 * injection library (the driver loads the file named by CUDA_INJECTION64_PATH at cuInit and
 * calls InitializeInjection) that records every kernel, copy and memset through CUPTI's
 * activity API and, when the process exits, writes one table to
 * $CTITAN_GPUPROF_DIR/gpuprof-<pid>.tsv:
 *
 *   # window_ns <ns> busy_ns <ns> skipped <records>
 *   <kind>\t<name>\t<count>\t<total ns>
 *
 * kind is kernel, memcpy or memset; a copy's name is its direction (HtoD, DtoH, DtoD, PtoP,
 * ...). The window is the last CTITAN_GPUPROF_LAST_MS milliseconds (default: all) before the
 * process's last record ended: the steady steps at the end of a run, not the set-up (weights
 * made and handed over, the first steps' lazy loading) nor the wait for other processes at the
 * start; records starting before it are counted in "skipped" only. busy_ns is the union of the
 * window's records (concurrent kernels counted once), so window - busy is the time the device
 * did nothing for this process. tools/gpu_breakdown.sh runs a job under it and sums the tables into shares.
 *
 * With CTITAN_GPUPROF_TRACE=1 it also writes gpuprof-<pid>.trace: every record (the last
 * TRACE_MAX of them), in start order, one a line after a header:
 *
 *   # base <ns>
 *   <start ns>\t<end ns>\t<kind>\t<name>
 *
 * times from base, on CUPTI's clock, which is the same for every process on the machine, so the
 * traces of a job's processes line up (tools/gpuprof/window.sh, waits.sh). base is a multiple of
 * 2^32 ns: the bases' differences and the times from them are exact in awk's doubles, which the
 * clock's own values (epoch nanoseconds are past 2^53) would not be.
 *
 * Built only with CUDA (it links CUPTI); never part of ctitan's own processes. */
#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUF_BYTES (8u << 20)
#define MAX_NAMES 4096
#define TRACE_MAX 1000000 /* records a trace keeps, the last ones: ~50 MB */

typedef struct { char kind[8]; char *name; uint64_t count, ns; } Entry;
typedef struct { uint64_t start, end; uint32_t name; } Rec;

static Entry names[MAX_NAMES];
static size_t n_names;
static Rec *recs;
static size_t n_recs, cap_recs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* CUPTI delivers buffers from its own thread */

static const char *copy_kind(uint8_t k)
{
    switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
    }
}

/* One record, kept until the process exits (the window is known only then). */
static void note(const char *kind, const char *name, uint64_t start, uint64_t end)
{
    size_t i = 0;
    if (!name)
        name = "?";
    while (i < n_names && (strcmp(names[i].kind, kind) != 0 || strcmp(names[i].name, name) != 0))
        i++;
    if (i == n_names) {
        if (n_names == MAX_NAMES || !(names[i].name = strdup(name)))
            return;
        snprintf(names[i].kind, sizeof names[i].kind, "%s", kind);
        n_names++;
    }
    if (n_recs == cap_recs) {
        size_t cap = cap_recs ? 2 * cap_recs : 65536;
        Rec *r = realloc(recs, cap * sizeof *r);
        if (!r)
            return;
        recs = r;
        cap_recs = cap;
    }
    recs[n_recs++] = (Rec){start, end > start ? end : start, (uint32_t)i};
}

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&lock);
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            const CUpti_ActivityKernel10 *k = (const void *)r;
            note("kernel", k->name, k->start, k->end);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const CUpti_ActivityMemcpy6 *m = (const void *)r;
            note("memcpy", copy_kind(m->copyKind), m->start, m->end);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY2: {
            const CUpti_ActivityMemcpyPtoP4 *m = (const void *)r;
            note("memcpy", copy_kind(m->copyKind), m->start, m->end);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const CUpti_ActivityMemset4 *m = (const void *)r;
            note("memset", "memset", m->start, m->end);
            break;
        }
        default:
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    free(buf);
}

static int by_start(const void *a, const void *b)
{
    const Rec *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void write_locked(void);

static void write_table(void)
{
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&lock);
    if (n_recs > 0)
        write_locked();
    pthread_mutex_unlock(&lock);
}

static void write_locked(void)
{
    qsort(recs, n_recs, sizeof *recs, by_start);
    uint64_t last = 0;
    for (size_t i = 0; i < n_recs; i++)
        if (recs[i].end > last)
            last = recs[i].end;
    const char *env = getenv("CTITAN_GPUPROF_LAST_MS");
    uint64_t want = env ? strtoull(env, NULL, 10) * 1000000ull : 0;
    uint64_t from = want && want < last - recs[0].start ? last - want : recs[0].start;
    uint64_t busy = 0, lo = 0, hi = 0, skipped = 0;
    int open = 0;
    for (size_t i = 0; i < n_recs; i++) {
        const Rec *r = &recs[i];
        if (r->start < from) {
            skipped++;
            continue;
        }
        names[r->name].count++;
        names[r->name].ns += r->end - r->start;
        if (open && r->start <= hi) {
            if (r->end > hi)
                hi = r->end;
            continue;
        }
        busy += open ? hi - lo : 0;
        lo = r->start;
        hi = r->end;
        open = 1;
    }
    busy += open ? hi - lo : 0;
    const char *dir = getenv("CTITAN_GPUPROF_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/gpuprof-%ld.tsv", dir && *dir ? dir : ".", (long)getpid());
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "gpuprof: cannot write %s\n", path);
        return;
    }
    fprintf(f, "# window_ns %llu busy_ns %llu skipped %llu\n", (unsigned long long)(last - from),
            (unsigned long long)busy, (unsigned long long)skipped);
    for (size_t i = 0; i < n_names; i++)
        if (names[i].count)
            fprintf(f, "%s\t%s\t%llu\t%llu\n", names[i].kind, names[i].name, (unsigned long long)names[i].count,
                    (unsigned long long)names[i].ns);
    fclose(f);
    const char *trace = getenv("CTITAN_GPUPROF_TRACE");
    if (!trace || strcmp(trace, "1") != 0)
        return;
    snprintf(path, sizeof path, "%s/gpuprof-%ld.trace", dir && *dir ? dir : ".", (long)getpid());
    if (!(f = fopen(path, "w"))) {
        fprintf(stderr, "gpuprof: cannot write %s\n", path);
        return;
    }
    size_t first = n_recs > TRACE_MAX ? n_recs - TRACE_MAX : 0;
    uint64_t base = recs[first].start & ~0xffffffffull;
    fprintf(f, "# base %llu\n", (unsigned long long)base);
    for (size_t i = first; i < n_recs; i++)
        fprintf(f, "%llu\t%llu\t%s\t%s\n", (unsigned long long)(recs[i].start - base),
                (unsigned long long)(recs[i].end - base), names[recs[i].name].kind, names[recs[i].name].name);
    if (fclose(f) != 0)
        fprintf(stderr, "gpuprof: cannot write %s\n", path);
}

int InitializeInjection(void);
int InitializeInjection(void)
{
    if (cuptiActivityRegisterCallbacks(buf_request, buf_complete) != CUPTI_SUCCESS)
        return 0;
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    atexit(write_table);
    return 1;
}
