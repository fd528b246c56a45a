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

#define LOG(level, ...) do { if (log_enabled(level)) log_write(level, __VA_ARGS__); } while (0)
#define LOG_E(...) LOG(LOG_ERROR, __VA_ARGS__)
#define LOG_W(...) LOG(LOG_WARN, __VA_ARGS__)
#define LOG_I(...) LOG(LOG_INFO, __VA_ARGS__)
#define LOG_D(...) LOG(LOG_DEBUG, __VA_ARGS__)

#endif
