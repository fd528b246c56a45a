/* The cached sgemm and GPU peaks (see peak_cache.h). */
#include "stages/report/peak_cache.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#include <xxhash.h>

#include "ipc/util.h"
#include "kernels/cpu/peak.h"

#define MAGIC "ctitan sgemm peak cache"
#define MAX_BYTES 4096 /* a cache file is ~300 bytes; anything much larger is not one */

/* src as one line into dst[n]: blanks at either end dropped, control characters as '?'. */
static void one_line(char *dst, size_t n, const char *src)
{
    while (*src == ' ' || *src == '\t')
        src++;
    size_t len = strlen(src);
    while (len && (src[len - 1] == ' ' || src[len - 1] == '\t' || src[len - 1] == '\n'))
        len--;
    len = len < n - 1 ? len : n - 1;
    for (size_t i = 0; i < len; i++)
        dst[i] = (unsigned char)src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
    dst[len] = 0;
}

static void cpu_model(char *dst, size_t n)
{
    FILE *f = fopen("/proc/cpuinfo", "re");
    char line[512];
    snprintf(dst, n, "unknown");
    while (f && fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && colon) {
            one_line(dst, n, colon + 1);
            break;
        }
    }
    if (f)
        fclose(f);
}

void peak_cache_key(peak_cache_key_t *k, int threads)
{
    memset(k, 0, sizeof(*k));
    cpu_model(k->cpu, sizeof(k->cpu));
    k->threads = threads;
    one_line(k->blas, sizeof(k->blas), openblas_get_config());
    one_line(k->core, sizeof(k->core), openblas_get_corename());
    k->n = PEAK_CACHE_N;
    k->runs = PEAK_CACHE_RUNS;
}

/* ---- the file: a version line, then these fields, one `name value` line each, in order ---- */

enum { F_STR, F_INT, F_DBL, F_TIME };
#define KEY(f) offsetof(peak_cache_entry_t, key.f), sizeof(((peak_cache_key_t *)0)->f)
#define ENT(f) offsetof(peak_cache_entry_t, f), sizeof(((peak_cache_entry_t *)0)->f)
static const struct {
    const char *name;
    int type;
    size_t off, size;
} fields[] = {
    {"cpu", F_STR, KEY(cpu)},        {"threads", F_INT, KEY(threads)}, {"blas", F_STR, KEY(blas)},
    {"core", F_STR, KEY(core)},      {"n", F_INT, KEY(n)},             {"runs", F_INT, KEY(runs)},
    {"gflops", F_DBL, ENT(gflops)},  {"native", F_DBL, ENT(native)},   {"pooled", F_DBL, ENT(pooled)},
    {"measured", F_TIME, ENT(measured)},
};
#define NKEY 6 /* fields[0, NKEY) are the key */
#define NFIELDS (int)(sizeof(fields) / sizeof(fields[0]))

/* Field i of e as its line's value. */
static void put_field(char *buf, size_t n, const peak_cache_entry_t *e, int i)
{
    const char *p = (const char *)e + fields[i].off;
    switch (fields[i].type) {
    case F_STR: snprintf(buf, n, "%s", p); break;
    case F_INT: snprintf(buf, n, "%d", *(const int *)p); break;
    case F_DBL: snprintf(buf, n, "%.17g", *(const double *)p); break;
    default: snprintf(buf, n, "%lld", *(const long long *)p); break;
    }
}

int peak_cache_path(const peak_cache_key_t *k, char *path, size_t n)
{
    const char *own = getenv("CTITAN_PEAK_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (own && own[0])
        return (size_t)snprintf(path, n, "%s", own) < n ? 0 : -ENAMETOOLONG;
    /* one file per key: machines sharing a home folder, or runs with another OPENBLAS_CORETYPE,
     * keep their own peaks */
    peak_cache_entry_t e = {.key = *k};
    char v[256], text[1024]; /* the key's lines: < 500 bytes */
    size_t used = 0;
    for (int i = 0; i < NKEY; i++) {
        put_field(v, sizeof(v), &e, i);
        used += (size_t)snprintf(text + used, sizeof(text) - used, "%s %s\n", fields[i].name, v);
    }
    unsigned long long d = XXH64(text, used, 0);
    int len;
    if (xdg && xdg[0] == '/') /* the XDG spec: a relative path is to be ignored */
        len = snprintf(path, n, "%s/ctitan/peak-%016llx", xdg, d);
    else if (home && home[0])
        len = snprintf(path, n, "%s/.cache/ctitan/peak-%016llx", home, d);
    else
        return -ENOENT;
    return (size_t)len < n ? 0 : -ENAMETOOLONG;
}

/* Parses one value of field i from v (a NUL-terminated line without its newline). */
static int get_field(peak_cache_entry_t *e, int i, const char *v, const char *path, int line, char *err,
                     size_t errlen)
{
    char *p = (char *)e + fields[i].off, *end;
    errno = 0;
    switch (fields[i].type) {
    case F_STR:
        if (!v[0] || strlen(v) >= fields[i].size)
            return util_fail(err, errlen, -EINVAL, "%s:%d: %s: expected 1 to %zu characters", path, line,
                             fields[i].name, fields[i].size - 1);
        memcpy(p, v, strlen(v) + 1);
        return 0;
    case F_INT: {
        long x = strtol(v, &end, 10);
        if (end == v || *end || errno || x < 1 || x > 1 << 20)
            return util_fail(err, errlen, -EINVAL, "%s:%d: %s: expected a whole number from 1 to %d, got '%s'",
                             path, line, fields[i].name, 1 << 20, v);
        *(int *)p = (int)x;
        return 0;
    }
    case F_DBL: {
        double x = strtod(v, &end);
        int positive = !strcmp(fields[i].name, "gflops");
        if (end == v || *end || !isfinite(x) || x < 0 || (positive && x == 0))
            return util_fail(err, errlen, -EINVAL, "%s:%d: %s: expected a finite number %s 0, got '%s'", path,
                             line, fields[i].name, positive ? ">" : ">=", v);
        *(double *)p = x;
        return 0;
    }
    default: {
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || errno || x < 0)
            return util_fail(err, errlen, -EINVAL, "%s:%d: %s: expected seconds since the epoch, got '%s'", path,
                             line, fields[i].name, v);
        *(long long *)p = x;
        return 0;
    }
    }
}

int peak_cache_read(const char *path, peak_cache_entry_t *e, char *err, size_t errlen)
{
    size_t size;
    int fd = util_open_regular(path, &size, err, errlen);
    if (fd < 0)
        return fd;
    char buf[MAX_BYTES + 2];
    long got = util_read_all(fd, buf, MAX_BYTES + 1, 0); /* one more: a file that grew is seen */
    close(fd);
    if (size > MAX_BYTES || got > MAX_BYTES)
        return util_fail(err, errlen, -EINVAL, "%s: more than %d bytes: not a peak cache", path, MAX_BYTES);
    if (got < 0)
        return util_fail(err, errlen, (int)got, "%s: cannot read: %s", path, strerror((int)-got));
    if (memchr(buf, 0, (size_t)got))
        return util_fail(err, errlen, -EINVAL, "%s: holds a NUL byte: not a peak cache", path);
    buf[got] = 0;
    memset(e, 0, sizeof(*e));
    char *line = buf;
    for (int ln = 1; ln <= NFIELDS + 2; ln++) {
        char *nl = strchr(line, '\n');
        if (ln == NFIELDS + 2) { /* past the last field: nothing more */
            if (*line)
                return util_fail(err, errlen, -EINVAL, "%s:%d: unexpected text after the last field", path, ln);
            break;
        }
        if (!nl) {
            const char *want = ln == 1 ? "the version line" : fields[ln - 2].name;
            return util_fail(err, errlen, -EINVAL, "%s:%d: %s where %s was expected", path, ln,
                             *line ? "a line without its newline" : "the end of the file", want);
        }
        *nl = 0;
        if (ln == 1) {
            char *end;
            long v = strncmp(line, MAGIC " ", sizeof(MAGIC)) ? -1 : strtol(line + sizeof(MAGIC), &end, 10);
            if (v < 0 || end == line + sizeof(MAGIC) || *end)
                return util_fail(err, errlen, -EINVAL, "%s:1: not a ctitan peak cache (expected '%s %d')", path,
                                 MAGIC, PEAK_CACHE_VERSION);
            if (v != PEAK_CACHE_VERSION)
                return util_fail(err, errlen, -EINVAL, "%s:1: a peak cache of version %ld (this build reads %d)",
                                 path, v, PEAK_CACHE_VERSION);
        } else {
            int i = ln - 2;
            size_t k = strlen(fields[i].name);
            if (strncmp(line, fields[i].name, k) || line[k] != ' ')
                return util_fail(err, errlen, -EINVAL, "%s:%d: expected '%s VALUE'", path, ln, fields[i].name);
            int rc = get_field(e, i, line + k + 1, path, ln, err, errlen);
            if (rc)
                return rc;
        }
        line = nl + 1;
    }
    if (e->gflops != (e->native > e->pooled ? e->native : e->pooled))
        return util_fail(err, errlen, -EINVAL, "%s: gflops %.17g is not the higher of native and pooled", path,
                         e->gflops);
    return 0;
}

int peak_cache_format(const peak_cache_entry_t *e, char *buf, size_t n)
{
    char v[256];
    size_t len = (size_t)snprintf(buf, n, "%s %d\n", MAGIC, PEAK_CACHE_VERSION);
    for (int i = 0; i < NFIELDS; i++) {
        put_field(v, sizeof(v), e, i);
        len += (size_t)snprintf(buf + (len < n ? len : n), len < n ? n - len : 0, "%s %s\n", fields[i].name, v);
    }
    return (int)len;
}

int peak_cache_write(const char *path, const peak_cache_entry_t *e, char *err, size_t errlen)
{
    char text[MAX_BYTES], dir[PATH_MAX];
    int len = peak_cache_format(e, text, sizeof(text));
    if ((size_t)len >= sizeof(text))
        return util_fail(err, errlen, -EINVAL, "%s: the entry does not fit %zu bytes", path, sizeof(text));
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    int rc;
    if (slash && slash != dir) {
        *slash = 0;
        if ((rc = util_mkdirs(dir)))
            return util_fail(err, errlen, rc, "%s: cannot make the folder %s: %s", path, dir, strerror(-rc));
    }
    util_afile_t a;
    if ((rc = util_afile_begin(&a, path, err, errlen)))
        return rc;
    if ((rc = util_afile_write(&a, text, (size_t)len, err, errlen))) {
        util_afile_abort(&a);
        return rc;
    }
    return util_afile_commit(&a, err, errlen);
}

/* The first key field where a (the file's) and b (this machine's) differ, as
 * "core 'Haswell', here 'SkylakeX'"; 0 when they are the same. */
static int key_differs(const peak_cache_key_t *a, const peak_cache_key_t *b, char *what, size_t n)
{
    peak_cache_entry_t ea = {.key = *a}, eb = {.key = *b};
    char va[256], vb[256];
    for (int i = 0; i < NKEY; i++) {
        put_field(va, sizeof(va), &ea, i);
        put_field(vb, sizeof(vb), &eb, i);
        if (strcmp(va, vb)) {
            snprintf(what, n, "%s '%s', here '%s'", fields[i].name, va, vb);
            return 1;
        }
    }
    return 0;
}

static void warn(peak_cache_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(peak_cache_t *p, const char *fmt, ...)
{
    size_t len = strlen(p->warning);
    if (len + 1 >= sizeof(p->warning))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->warning + len, sizeof(p->warning) - len, fmt, ap);
    va_end(ap);
}

/* p->entry's key looked up in its cache file (p->path): 1 with p->entry, p->gflops and
 * PEAK_CACHED when the file holds a peak for it; else 0, with why in p->warning when there is
 * no file to use or it holds something else. name: "the sgemm peak" and the like. */
static int from_cache(peak_cache_t *p, const char *name)
{
    peak_cache_entry_t old;
    char err[PATH_MAX + 256], what[640];
    int rc = peak_cache_path(&p->entry.key, p->path, sizeof(p->path));
    if (rc) {
        p->path[0] = 0;
        if (rc == -ENOENT)
            warn(p, "no file to cache %s in: none of CTITAN_PEAK_CACHE, XDG_CACHE_HOME and HOME is set", name);
        else
            warn(p, "%s's cache file: %s", name, strerror(-rc));
    } else if ((rc = peak_cache_read(p->path, &old, err, sizeof(err))) == 0) {
        if (!key_differs(&old.key, &p->entry.key, what, sizeof(what))) {
            p->entry = old;
            p->from = PEAK_CACHED;
            p->gflops = old.gflops;
            return 1;
        }
        warn(p, "%s: a peak measured for another set-up (%s): measuring again", p->path, what);
    } else if (rc != -ENOENT) {
        warn(p, "%s: measuring again", err);
    }
    return 0;
}

/* The measured p->entry into the cache file, if there is one (p->cached), else why in p->warning. */
static void to_cache(peak_cache_t *p)
{
    char err[PATH_MAX + 256];
    if (p->path[0] && peak_cache_write(p->path, &p->entry, err, sizeof(err)))
        warn(p, "%snot cached: %s", p->warning[0] ? "; " : "", err);
    else if (p->path[0])
        p->cached = 1;
}

double peak_cache_get(double given_gflops, int threads, peak_measure_fn measure, peak_cache_t *p)
{
    memset(p, 0, sizeof(*p));
    if (given_gflops > 0) {
        p->from = PEAK_GIVEN;
        return p->gflops = given_gflops;
    }
    peak_cache_entry_t *e = &p->entry;
    peak_cache_key(&e->key, threads);
    if (from_cache(p, "the sgemm peak"))
        return p->gflops;
    p->from = PEAK_MEASURED;
    e->gflops = (measure ? measure : peak_sgemm_median_gflops)(threads, e->key.n, e->key.runs, &e->native,
                                                              &e->pooled);
    e->measured = (long long)time(NULL);
    if (!(e->gflops > 0)) {
        warn(p, "%sthe sgemm peak could not be measured (out of memory): MFU is meaningless",
             p->warning[0] ? "; " : "");
        e->gflops = 0;
    } else {
        to_cache(p);
    }
    return p->gflops = e->gflops;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

int peak_gpu_model(char *dst, size_t n)
{
    const char *own = getenv("CTITAN_GPU_MODEL");
    if (own && own[0]) {
        one_line(dst, n, own);
        return 0;
    }
    const char *root = "/proc/driver/nvidia/gpus";
    struct dirent **ent;
    int k = scandir(root, &ent, NULL, by_name), rc = -ENODEV;
    for (int i = 0; i < k; i++) {
        char path[PATH_MAX], line[512];
        FILE *f = NULL;
        if (rc && ent[i]->d_name[0] != '.' &&
            (size_t)snprintf(path, sizeof(path), "%s/%s/information", root, ent[i]->d_name) < sizeof(path))
            f = fopen(path, "re");
        while (f && fgets(line, sizeof(line), f))
            if (!strncmp(line, "Model:", 6)) {
                one_line(dst, n, line + 6);
                rc = 0;
                break;
            }
        if (f)
            fclose(f);
        free(ent[i]);
    }
    if (k >= 0)
        free(ent);
    return rc;
}

double peak_cache_get_gpu(double given_gflops, peak_gpu_measure_fn measure, void *arg, peak_cache_t *p)
{
    memset(p, 0, sizeof(*p));
    p->gpu = 1;
    if (given_gflops > 0) {
        p->from = PEAK_GIVEN;
        return p->gflops = given_gflops;
    }
    peak_cache_entry_t *e = &p->entry;
    p->from = PEAK_NONE;
    if (peak_gpu_model(e->key.cpu, sizeof(e->key.cpu))) {
        warn(p, "no NVIDIA GPU in /proc/driver/nvidia/gpus to measure the bf16 peak of");
        return 0;
    }
    snprintf(e->key.blas, sizeof(e->key.blas), "cuBLASLt bf16");
    snprintf(e->key.core, sizeof(e->key.core), "cuda");
    e->key.threads = 1; /* one device */
    e->key.n = PEAK_GPU_N;
    e->key.runs = PEAK_CACHE_RUNS;
    if (from_cache(p, "the GPU's peak"))
        return p->gflops;
    e->gflops = measure ? measure(arg) : 0;
    e->native = e->pooled = e->gflops;
    e->measured = (long long)time(NULL);
    if (!(e->gflops > 0)) {
        warn(p, "%sthe bf16 peak of the %s could not be measured", p->warning[0] ? "; " : "", e->key.cpu);
        return p->gflops = e->gflops = 0;
    }
    p->from = PEAK_MEASURED;
    to_cache(p);
    return p->gflops = e->gflops;
}

void peak_cache_describe(const peak_cache_t *p, char *buf, size_t n)
{
    const peak_cache_entry_t *e = &p->entry;
    char how[512], when[64] = "?";
    if (p->from == PEAK_GIVEN) {
        snprintf(buf, n, "given by metrics.peak_tflops = %g", p->gflops * 1e-3);
        return;
    }
    if (p->from == PEAK_NONE) {
        snprintf(buf, n, "no GPU peak (%s): MFU is not computed; set metrics.peak_tflops", p->warning);
        return;
    }
    const char *what = p->gpu ? "the GPU's bf16 peak" : "the sgemm peak";
    if (p->gpu)
        snprintf(how, sizeof(how), "%s, cuBLASLt %d^3", e->key.cpu, e->key.n);
    else
        snprintf(how, sizeof(how), "n=%d, median of %d runs, %d threads, OpenBLAS %s kernels", e->key.n, e->key.runs,
                 e->key.threads, e->key.core);
    time_t t = (time_t)e->measured;
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", &tm);
    if (p->from == PEAK_CACHED)
        snprintf(buf, n, "%s from the cache %s (%s; measured %s)", what, p->path, how, when);
    else if (p->cached)
        snprintf(buf, n, "%s measured now (%s) and cached at %s", what, how, p->path);
    else
        snprintf(buf, n, "%s measured now (%s), not cached", what, how);
}
