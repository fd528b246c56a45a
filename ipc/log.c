/* The process-wide logger (see log.h). */
#include "ipc/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"

static struct {
    char tag[48];
    int64_t step;
    log_level_t level;
    int init;
} L = {.step = -1, .level = LOG_INFO};

static void read_level(void)
{
    const char *e = getenv("CTITAN_LOG");
    if (!e) return;
    if (!strcmp(e, "error")) L.level = LOG_ERROR;
    else if (!strcmp(e, "warn")) L.level = LOG_WARN;
    else if (!strcmp(e, "info")) L.level = LOG_INFO;
    else if (!strcmp(e, "debug")) L.level = LOG_DEBUG;
}

void log_init(const char *role, int rank, int replica)
{
    if (role && *role)
        snprintf(L.tag, sizeof(L.tag), "%s %d.%d", role, rank, replica);
    else
        snprintf(L.tag, sizeof(L.tag), "coordinator");
    read_level();
    L.init = 1;
}

void log_set_step(int64_t step) { L.step = step; }

int log_enabled(log_level_t level)
{
    if (!L.init)
        log_init("", 0, 0);
    return level <= L.level;
}

static void vwrite(log_level_t level, const char *fmt, va_list ap)
{
    static const char lv[] = "EWID";
    char line[2048];
    int n = L.step >= 0 ? snprintf(line, sizeof(line), "[%s step %lld] %c ", L.tag, (long long)L.step, lv[level])
                        : snprintf(line, sizeof(line), "[%s] %c ", L.tag, lv[level]);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    fprintf(stderr, "%s\n", line); /* one write per line: lines of processes do not interleave */
}

void log_write(log_level_t level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vwrite(level, fmt, ap);
    va_end(ap);
}

void log_limit_flush(log_limit_t *l, log_level_t level)
{
    if (l->held && log_enabled(level))
        log_write(level, "%llu more %s in the last %.0f s, not shown (%llu in all)", (unsigned long long)l->held,
                  l->what, util_now() - l->window, (unsigned long long)l->total);
    l->held = 0;
}

void log_limited(log_limit_t *l, log_level_t level, const char *fmt, ...)
{
    double now = util_now();
    l->total++;
    if (l->total == 1 || now - l->window >= LOG_LIMIT_WINDOW_S) {
        log_limit_flush(l, level);
        l->window = now;
        l->lines = 0;
    }
    if (l->lines >= LOG_LIMIT_BURST) {
        l->held++;
        return;
    }
    l->lines++;
    if (!log_enabled(level))
        return;
    va_list ap;
    va_start(ap, fmt);
    vwrite(level, fmt, ap);
    va_end(ap);
}
