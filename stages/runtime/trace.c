/* The run's timeline file (see trace.h). */
#include "stages/runtime/trace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc/util.h"

struct trace {
    FILE *f;
    char path[4096];
    double t0;
    int events;  /* written since the opening bracket (0: no comma before the next) */
    int failed;  /* errno of the first failure (0: none) */
};

/* Whether line [p, p + n) is a whole event: its braces close (outside strings). */
static int whole_event(const char *p, size_t n)
{
    int depth = 0, quoted = 0, seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (quoted) {
            if (p[i] == '\\')
                i++;
            else if (p[i] == '"')
                quoted = 0;
        } else if (p[i] == '"') {
            quoted = 1;
        } else if (p[i] == '{') {
            depth++, seen = 1;
        } else if (p[i] == '}') {
            depth--;
        }
    }
    return seen && depth == 0 && !quoted;
}

/* The end of a file a run before this one wrote: without its closing bracket if it has one
 * (a run that ended), without a last event cut short if it was killed in the middle of one
 * (and the comma before it), without a comma written after the last whole event; *events says
 * whether anything follows "[". */
static int reopen(trace_t *t, char *err, size_t errlen)
{
    if (!(t->f = fopen(t->path, "r+e")))
        return util_fail(err, errlen, -errno, "%s: cannot open: %s", t->path, strerror(errno));
    struct stat st;
    if (fstat(fileno(t->f), &st))
        return util_fail(err, errlen, -errno, "%s: %s", t->path, strerror(errno));
    long size = (long)st.st_size, keep = size, tail_from = size > 65536 ? size - 65536 : 0;
    char *tail = malloc((size_t)(size - tail_from) + 1);
    if (!tail)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    size_t n = fseek(t->f, tail_from, SEEK_SET) ? 0 : fread(tail, 1, (size_t)(size - tail_from), t->f);
    tail[n] = 0;
    if (n >= 2 && !strcmp(tail + n - 2, "]\n")) {
        keep = size - 2;
    } else if (n > 0) { /* the last line: an event, or what a kill left of one */
        char *nl = strrchr(tail, '\n'), *end = nl ? strrchr(nl + 1, '}') : NULL;
        if (nl && !whole_event(nl + 1, strlen(nl + 1)))
            keep = tail_from + (nl - tail) - (nl > tail && nl[-1] == ',' ? 1 : 0);
        else if (end && end[1]) /* a whole event and the comma after it, cut before its newline */
            keep = tail_from + (end + 1 - tail);
    }
    free(tail);
    if (keep != size && ftruncate(fileno(t->f), keep))
        return util_fail(err, errlen, -errno, "%s: cannot take off its end: %s", t->path, strerror(errno));
    if (fseek(t->f, keep, SEEK_SET))
        return util_fail(err, errlen, -errno, "%s: %s", t->path, strerror(errno));
    if (keep == 0 && fputs("[\n", t->f) < 0)
        return util_fail(err, errlen, -EIO, "%s: cannot write", t->path);
    t->events = keep > 2;
    return 0;
}

int trace_open(trace_t **out, const char *path, int append, double t0, char *err, size_t errlen)
{
    *out = NULL;
    trace_t *t = calloc(1, sizeof(*t));
    if (!t)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    snprintf(t->path, sizeof(t->path), "%s", path);
    t->t0 = t0;
    int rc = 0;
    if (append && access(path, F_OK) == 0)
        rc = reopen(t, err, errlen);
    else if (!(t->f = fopen(path, "we")) || fputs("[\n", t->f) < 0)
        rc = util_fail(err, errlen, -errno ? -errno : -EIO, "%s: cannot create: %s", path, strerror(errno));
    if (!rc && fflush(t->f))
        rc = util_fail(err, errlen, -errno, "%s: cannot write: %s", path, strerror(errno));
    if (rc) {
        if (t->f)
            fclose(t->f);
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* The comma between events. */
static void next(trace_t *t)
{
    if (t->events++)
        fputs(",\n", t->f);
}

/* s as a JSON string's contents (names are ours: quotes and backslashes are all to mind). */
static void put_str(FILE *f, const char *s)
{
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
}

void trace_process(trace_t *t, int64_t pid, const char *name, int sort)
{
    if (!t)
        return;
    next(t);
    fprintf(t->f, "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %lld, \"tid\": 0, \"args\": {\"name\": \"",
            (long long)pid);
    put_str(t->f, name);
    fputs("\"}}", t->f);
    next(t);
    fprintf(t->f, "{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": %lld, \"tid\": 0, \"args\": "
            "{\"sort_index\": %d}}", (long long)pid, sort);
    static const char *const threads[] = {"actions", "ideal (simulated)"};
    for (int i = 0; i < 2; i++) {
        next(t);
        fprintf(t->f, "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %lld, \"tid\": %d, \"args\": "
                "{\"name\": \"%s\"}}", (long long)pid, i + 1, threads[i]);
    }
}

void trace_span(trace_t *t, int64_t pid, int tid, const char *name, const char *cat, double t0, double t1,
                const char *args)
{
    if (!t)
        return;
    next(t);
    fprintf(t->f, "{\"ph\": \"X\", \"name\": \"");
    put_str(t->f, name);
    fprintf(t->f, "\", \"cat\": \"%s\", \"pid\": %lld, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f", cat,
            (long long)pid, tid, (t0 - t->t0) * 1e6, (t1 > t0 ? t1 - t0 : 0) * 1e6);
    if (args)
        fprintf(t->f, ", \"args\": {%s}", args);
    fputc('}', t->f);
}

int trace_flush(trace_t *t, char *err, size_t errlen)
{
    if (!t->failed && (ferror(t->f) || fflush(t->f)))
        t->failed = errno ? errno : EIO;
    if (t->failed)
        return util_fail(err, errlen, -t->failed, "%s: cannot write: %s", t->path, strerror(t->failed));
    return 0;
}

void trace_close(trace_t **pt)
{
    trace_t *t = *pt;
    if (!t)
        return;
    fputs("\n]\n", t->f);
    fclose(t->f);
    free(t);
    *pt = NULL;
}

int trace_seal(trace_rec_t *recs, int n)
{
    double now = util_now();
    recs[n] = (trace_rec_t){.op = TRACE_SENT, .mb = -1, .t0 = now, .t1 = now};
    return n + 1;
}

void trace_note(trace_rec_t *recs, int *n, trace_rec_t r)
{
    if (!recs || *n >= TRACE_RECS_MAX - 1 || (r.op == TRACE_WAIT && r.t1 - r.t0 < TRACE_MIN_WAIT_S))
        return;
    recs[(*n)++] = r;
}

int trace_recs_check(const void *data, size_t len, int max_op, int chunks, char *err, size_t errlen)
{
    if (len % sizeof(trace_rec_t) || len / sizeof(trace_rec_t) > TRACE_RECS_MAX)
        return util_fail(err, errlen, -EINVAL, "%zu bytes: not a whole number of trace records, or more than %d",
                         len, TRACE_RECS_MAX);
    const trace_rec_t *r = data;
    size_t n = len / sizeof(trace_rec_t);
    if (!n || r[n - 1].op != TRACE_SENT || !isfinite(r[n - 1].t0))
        return util_fail(err, errlen, -EINVAL, "no sending time as its last record");
    for (size_t i = 0; i + 1 < n; i++)
        if (r[i].op > max_op || r[i].chunk >= chunks || !isfinite(r[i].t0) || !isfinite(r[i].t1) ||
            !(r[i].t1 >= r[i].t0))
            return util_fail(err, errlen, -EINVAL, "trace record %zu out of range (op %d, chunk %d, times %g to %g)",
                             i, r[i].op, r[i].chunk, r[i].t0, r[i].t1);
    return (int)(n - 1);
}
