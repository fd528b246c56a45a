/* The one logger of every ctitan process: lines on stderr tagged with the process's role,
 * rank, replica and current step ("[stage 1.0 step 12] W ring act.0.1: ..."). The level comes
 * from CTITAN_LOG (error, warn, info, debug; default info) and is checked before formatting. */
#ifndef CTITAN_LOG_H
#define CTITAN_LOG_H

#include <stdint.h>

typedef enum { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 } log_level_t;

/* Sets the tag; role "" for the coordinator. Reads CTITAN_LOG once. */
void log_init(const char *role, int rank, int replica);
void log_set_step(int64_t step);
int log_enabled(log_level_t level);
void log_write(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Lines about events a peer can cause at will (rejected messages, refused connections) come
 * under a budget, so that a flood cannot flood the log: every event is counted, at most
 * LOG_LIMIT_BURST lines are written per LOG_LIMIT_WINDOW_S seconds, and what was held back is
 * said in one line when the next window opens or at log_limit_flush. One log_limit_t per kind
 * of event, used by one thread. */
#define LOG_LIMIT_BURST 10
#define LOG_LIMIT_WINDOW_S 10.0
typedef struct {
    const char *what;  /* the events, plural, for the summary line ("rejected control messages") */
    double window;     /* when the current window opened */
    int lines;         /* written in it */
    uint64_t held;     /* counted, not written, since the last summary */
    uint64_t total;    /* every event */
} log_limit_t;
/* Counts one event and writes its line if the budget allows. */
void log_limited(log_limit_t *l, log_level_t level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Says how many events were held back, if any (at the end of a run). */
void log_limit_flush(log_limit_t *l, log_level_t level);

#define LOG(level, ...) do { if (log_enabled(level)) log_write(level, __VA_ARGS__); } while (0)
#define LOG_E(...) LOG(LOG_ERROR, __VA_ARGS__)
#define LOG_W(...) LOG(LOG_WARN, __VA_ARGS__)
#define LOG_I(...) LOG(LOG_INFO, __VA_ARGS__)
#define LOG_D(...) LOG(LOG_DEBUG, __VA_ARGS__)

#endif
