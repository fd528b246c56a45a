/* The TOML reader's insides, shared by its two files (toml_value.c: the cursor and the values;
 * toml.c: the document). PRIVATE to stages/job/toml*.c; everyone else uses toml.h. */
#ifndef CTITAN_TOML_INT_H
#define CTITAN_TOML_INT_H

#include <stddef.h>

#include "stages/job/toml.h"

typedef struct {
    const char *p, *end;
    int line;
    const char *path; /* NULL: messages carry no "PATH:LINE: " prefix */
    char *err;
    size_t errlen;
    int depth;        /* array nesting */
} ps_t;

typedef struct {
    char *d;
    size_t n, cap;
} buf_t;

/* An error at the cursor's line ("PATH:LINE: ..."); returns -EINVAL. */
int toml_perr(ps_t *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int toml_enomem(ps_t *ps); /* "out of memory", -ENOMEM */
/* The character at the cursor, for messages: 'x', "end of line", "byte 0xff". */
const char *toml_what(const ps_t *ps, char *buf, size_t len);
/* NUL bytes and invalid UTF-8 refused up front, so the rest can treat the text as ASCII-safe. */
int toml_check_encoding(ps_t *ps);
void toml_skip_ws(ps_t *ps);
int toml_at_eol(const ps_t *ps);
int toml_eat_newline(ps_t *ps);
int toml_skip_comment(ps_t *ps);
int toml_is_bare(char c);
/* A bare key at the cursor, copied into a new string (NULL with *rc = 0 when empty). */
char *toml_bare_key(ps_t *ps, int *rc);
/* The value at the cursor. */
int toml_value(ps_t *ps, toml_value_t *v);

#endif
