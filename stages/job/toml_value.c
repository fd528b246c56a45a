/* The TOML subset reader's cursor and values (see toml.h, toml_int.h): errors at the cursor,
 * the encoding check, white space, comments and keys, and every value (strings with their
 * escapes, numbers, booleans, arrays), checked against TOML's grammar before any strtod or
 * strtoll. The document (tables, keys, the parse) is toml.c. */
#include "stages/job/toml_int.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int toml_perr(ps_t *ps, const char *fmt, ...)
{
    if (!ps->err || !ps->errlen)
        return -EINVAL;
    int n = 0;
    if (ps->path)
        n = snprintf(ps->err, ps->errlen, "%s:%d: ", ps->path, ps->line);
    if (n < 0)
        n = 0;
    if ((size_t)n < ps->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

int toml_enomem(ps_t *ps)
{
    toml_perr(ps, "out of memory");
    return -ENOMEM;
}

/* The character at the cursor, for messages: 'x', "end of line", "byte 0xff". */
const char *toml_what(const ps_t *ps, char *buf, size_t len)
{
    if (ps->p >= ps->end)
        return "end of file";
    unsigned char c = (unsigned char)*ps->p;
    if (c == '\n' || c == '\r')
        return "end of line";
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, len, "'%c'", c);
    else
        snprintf(buf, len, "byte 0x%02x", c);
    return buf;
}

static int buf_push(buf_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *d = realloc(b->d, cap);
        if (!d)
            return -ENOMEM;
        b->d = d, b->cap = cap;
    }
    memcpy(b->d + b->n, s, n);
    b->n += n;
    b->d[b->n] = 0;
    return 0;
}

long toml_utf8_invalid_at(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = u[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) n = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef) n = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4) n = 3, cp = c & 0x07;
        else return (long)i;
        if (len - i <= n)
            return (long)i;
        for (size_t k = 1; k <= n; k++) {
            if ((u[i + k] & 0xc0) != 0x80)
                return (long)i;
            cp = cp << 6 | (u[i + k] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return (long)i;
        i += n + 1;
    }
    return -1;
}

/* NUL bytes and invalid UTF-8 are rejected up front, so later code can treat the text as
 * a C string per line and copy string bytes through unchecked. */
int toml_check_encoding(ps_t *ps)
{
    size_t len = (size_t)(ps->end - ps->p);
    const char *nul = memchr(ps->p, 0, len);
    long bad = toml_utf8_invalid_at(ps->p, len);
    const char *at = nul;
    if (bad >= 0 && (!at || ps->p + bad < at))
        at = ps->p + bad;
    if (!at)
        return 0;
    for (const char *q = ps->p; q < at; q++)
        ps->line += *q == '\n';
    if (at == nul)
        return toml_perr(ps, "NUL byte in the text");
    return toml_perr(ps, "invalid UTF-8 (byte 0x%02x)", (unsigned char)*at);
}

void toml_skip_ws(ps_t *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t'))
        ps->p++;
}

int toml_at_eol(const ps_t *ps)
{
    return ps->p >= ps->end || *ps->p == '\n' || *ps->p == '\r';
}

int toml_eat_newline(ps_t *ps)
{
    if (*ps->p == '\r') {
        if (ps->end - ps->p < 2 || ps->p[1] != '\n')
            return toml_perr(ps, "carriage return not followed by a newline");
        ps->p++;
    }
    ps->p++;
    ps->line++;
    return 0;
}

int toml_skip_comment(ps_t *ps)
{
    for (ps->p++; !toml_at_eol(ps); ps->p++) {
        unsigned char c = (unsigned char)*ps->p;
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return toml_perr(ps, "control character (0x%02x) in a comment", c);
    }
    return 0;
}

int toml_is_bare(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

/* A bare key at the cursor, copied into a new string (NULL with *rc = 0 when empty). */
char *toml_bare_key(ps_t *ps, int *rc)
{
    const char *s = ps->p;
    while (ps->p < ps->end && toml_is_bare(*ps->p))
        ps->p++;
    *rc = 0;
    if (ps->p == s)
        return NULL;
    char *k = strndup(s, (size_t)(ps->p - s));
    if (!k)
        *rc = toml_enomem(ps);
    return k;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int put_utf8(buf_t *b, uint32_t cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xc0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3f)), n = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xe0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3f)),
        u[2] = (char)(0x80 | (cp & 0x3f)), n = 3;
    else
        u[0] = (char)(0xf0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3f)),
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (char)(0x80 | (cp & 0x3f)), n = 4;
    return buf_push(b, u, n);
}

static int unicode_escape(ps_t *ps, buf_t *b, int digits)
{
    uint32_t cp = 0;
    for (int i = 0; i < digits; i++) {
        int h = ps->p + 1 + i < ps->end ? hexval(ps->p[1 + i]) : -1;
        if (h < 0)
            return toml_perr(ps, "\\%c escape needs %d hex digits", digits == 4 ? 'u' : 'U', digits);
        cp = cp << 4 | (uint32_t)h;
    }
    if (cp == 0)
        return toml_perr(ps, "\\u0000 is not supported (strings end at NUL)");
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return toml_perr(ps, "escape \\%c%.*s is not a Unicode scalar value", digits == 4 ? 'u' : 'U',
                    digits, ps->p + 1);
    ps->p += digits;
    return put_utf8(b, cp) ? toml_enomem(ps) : 0;
}

/* "..." or '...' at the cursor; the result is in b->d (never NULL on success). */
static int string_value(ps_t *ps, buf_t *b)
{
    char q = *ps->p;
    if (ps->end - ps->p >= 3 && ps->p[1] == q && ps->p[2] == q)
        return toml_perr(ps, "multi-line strings (%c%c%c) are not supported", q, q, q);
    ps->p++;
    if (buf_push(b, "", 0))
        return toml_enomem(ps);
    for (;;) {
        if (toml_at_eol(ps))
            return toml_perr(ps, "unterminated string (a string must end on its line)");
        unsigned char c = (unsigned char)*ps->p;
        if (c == (unsigned char)q) {
            ps->p++;
            return 0;
        }
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return toml_perr(ps, "control character (0x%02x) in a string; use an escape", c);
        if (c == '\\' && q == '"') {
            if (ps->p + 1 >= ps->end)
                return toml_perr(ps, "unterminated string (a string must end on its line)");
            const char *rep = NULL;
            switch (ps->p[1]) {
            case 'b': rep = "\b"; break;
            case 't': rep = "\t"; break;
            case 'n': rep = "\n"; break;
            case 'f': rep = "\f"; break;
            case 'r': rep = "\r"; break;
            case '"': rep = "\""; break;
            case '\\': rep = "\\"; break;
            case 'u': case 'U': {
                ps->p++;
                int rc = unicode_escape(ps, b, *ps->p == 'u' ? 4 : 8);
                if (rc)
                    return rc;
                ps->p++;
                continue;
            }
            default: {
                char w[16];
                ps->p++;
                return toml_perr(ps, "invalid escape in a string: backslash followed by %s",
                            toml_what(ps, w, sizeof(w)));
            }
            }
            if (buf_push(b, rep, 1))
                return toml_enomem(ps);
            ps->p += 2;
            continue;
        }
        if (buf_push(b, ps->p, 1))
            return toml_enomem(ps);
        ps->p++;
    }
}

static int is_tokchar(char c)
{
    return toml_is_bare(c) || c == '+' || c == '.' || c == ':';
}

static int is_digit_base(char c, int base)
{
    int v = hexval(c);
    return v >= 0 && v < base;
}

/* digit ('_'? digit)* into out; returns the digit count, or -1 on a misplaced underscore. */
static int digits_us(const char **s, char *out, size_t *on, int base)
{
    int count = 0;
    for (;;) {
        char c = **s;
        if (c && is_digit_base(c, base)) {
            out[(*on)++] = c;
            count++;
            (*s)++;
        } else if (c == '_') {
            if (!count || !is_digit_base((*s)[1], base))
                return -1;
            (*s)++;
        } else {
            return count;
        }
    }
}

static int number(ps_t *ps, const char *tok, toml_value_t *v)
{
    const char *s = tok;
    char clean[80];
    size_t n = 0;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'o' || s[1] == 'b')) {
        int base = s[1] == 'x' ? 16 : s[1] == 'o' ? 8 : 2;
        s += 2;
        int d = digits_us(&s, clean, &n, base);
        if (d <= 0 || *s)
            return toml_perr(ps, "invalid %s integer '%s'",
                        base == 16 ? "hexadecimal" : base == 8 ? "octal" : "binary", tok);
        uint64_t x = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t h = (uint64_t)hexval(clean[i]);
            if (x > (uint64_t)(INT64_MAX - h) / (uint64_t)base)
                return toml_perr(ps, "integer '%s' is out of range (64-bit signed)", tok);
            x = x * (uint64_t)base + h;
        }
        v->type = TOML_INT;
        v->i = (int64_t)x;
        return 0;
    }
    if (*s == '+' || *s == '-') {
        if (s[1] == '0' && (s[2] == 'x' || s[2] == 'o' || s[2] == 'b'))
            return toml_perr(ps, "hexadecimal, octal and binary integers take no sign: '%s'", tok);
        clean[n++] = *s++;
    }
    const char *int_start = s;
    int d = digits_us(&s, clean, &n, 10);
    if (d < 0)
        return toml_perr(ps, "invalid number '%s' (an underscore must sit between two digits)", tok);
    if (d == 0)
        return toml_perr(ps, "invalid number '%s'", tok);
    if (*int_start == '0' && d > 1)
        return toml_perr(ps, "invalid number '%s' (leading zeros are not allowed)", tok);
    int is_float = 0;
    if (*s == '.') {
        clean[n++] = *s++;
        d = digits_us(&s, clean, &n, 10);
        if (d <= 0)
            return toml_perr(ps, "invalid number '%s' (digits must follow '.')", tok);
        is_float = 1;
    }
    if (*s == 'e' || *s == 'E') {
        clean[n++] = *s++;
        if (*s == '+' || *s == '-')
            clean[n++] = *s++;
        d = digits_us(&s, clean, &n, 10);
        if (d <= 0)
            return toml_perr(ps, "invalid number '%s' (digits must follow the exponent)", tok);
        is_float = 1;
    }
    if (*s)
        return toml_perr(ps, "invalid number '%s'", tok);
    clean[n] = 0;
    errno = 0;
    if (is_float) {
        v->type = TOML_FLOAT;
        v->f = strtod(clean, NULL);
        if (isinf(v->f))
            return toml_perr(ps, "float '%s' is out of range", tok);
    } else {
        v->type = TOML_INT;
        v->i = strtoll(clean, NULL, 10);
        if (errno == ERANGE)
            return toml_perr(ps, "integer '%s' is out of range (64-bit signed)", tok);
    }
    return 0;
}

/* A bare value: boolean, number, inf/nan; dates and unquoted words get a message. */
static int token(ps_t *ps, toml_value_t *v)
{
    const char *s = ps->p;
    while (ps->p < ps->end && is_tokchar(*ps->p))
        ps->p++;
    size_t len = (size_t)(ps->p - s);
    char w[16];
    if (!len) {
        if (ps->p < ps->end && *ps->p == '{')
            return toml_perr(ps, "inline tables ({...}) are not supported");
        return toml_perr(ps, "expected a value, got %s", toml_what(ps, w, sizeof(w)));
    }
    if (len > 64)
        return toml_perr(ps, "invalid value '%.32s...' (strings need quotes)", s);
    char tok[72];
    memcpy(tok, s, len);
    tok[len] = 0;
    const char *u = tok + (tok[0] == '+' || tok[0] == '-');
    if (!strcmp(tok, "true") || !strcmp(tok, "false")) {
        v->type = TOML_BOOL;
        v->b = tok[0] == 't';
        return 0;
    }
    if (!strcmp(u, "inf") || !strcmp(u, "nan")) {
        v->type = TOML_FLOAT;
        v->f = u[0] == 'i' ? (tok[0] == '-' ? -INFINITY : INFINITY) : (tok[0] == '-' ? -NAN : NAN);
        return 0;
    }
    int date = strchr(tok, ':') != NULL;
    if (len >= 5 && tok[4] == '-') {
        date = 1;
        for (int i = 0; i < 4; i++)
            date &= tok[i] >= '0' && tok[i] <= '9';
    }
    if (date)
        return toml_perr(ps, "dates and times are not supported: '%s'", tok);
    if ((tok[0] >= '0' && tok[0] <= '9') || tok[0] == '+' || tok[0] == '-' || tok[0] == '.')
        return number(ps, tok, v);
    return toml_perr(ps, "invalid value '%s' (strings need quotes)", tok);
}



/* Spaces, comments and newlines between array items. */
static int array_space(ps_t *ps)
{
    for (;;) {
        toml_skip_ws(ps);
        if (ps->p >= ps->end)
            return 0;
        int rc = 0;
        if (*ps->p == '#')
            rc = toml_skip_comment(ps);
        else if (*ps->p == '\n' || *ps->p == '\r')
            rc = toml_eat_newline(ps);
        else
            return 0;
        if (rc)
            return rc;
    }
}

static int array(ps_t *ps, toml_value_t *v)
{
    int open_line = ps->line, cap = 0, rc;
    char w[16];
    if (ps->depth >= TOML_MAX_DEPTH)
        return toml_perr(ps, "arrays nested deeper than %d", TOML_MAX_DEPTH);
    ps->depth++;
    v->type = TOML_ARRAY;
    ps->p++;
    for (;;) {
        if ((rc = array_space(ps)))
            return rc;
        if (ps->p >= ps->end)
            return toml_perr(ps, "unterminated array (opened on line %d)", open_line);
        if (*ps->p == ']')
            break;
        if (v->n == cap) {
            cap = cap ? 2 * cap : 4;
            toml_value_t *it = realloc(v->items, (size_t)cap * sizeof(*it));
            if (!it)
                return toml_enomem(ps);
            v->items = it;
        }
        memset(&v->items[v->n], 0, sizeof(v->items[0]));
        rc = toml_value(ps, &v->items[v->n]);
        v->n++; /* counted even on error, so toml_value_free releases a partial item */
        if (rc)
            return rc;
        if ((rc = array_space(ps)))
            return rc;
        if (ps->p >= ps->end)
            return toml_perr(ps, "unterminated array (opened on line %d)", open_line);
        if (*ps->p == ']')
            break;
        if (*ps->p != ',')
            return toml_perr(ps, "expected ',' or ']' in the array, got %s", toml_what(ps, w, sizeof(w)));
        ps->p++;
    }
    ps->p++;
    ps->depth--;
    return 0;
}

int toml_value(ps_t *ps, toml_value_t *v)
{
    v->line = ps->line;
    char c = *ps->p;
    if (c == '"' || c == '\'') {
        buf_t b = {0};
        int rc = string_value(ps, &b);
        if (rc) {
            free(b.d);
            return rc;
        }
        v->type = TOML_STRING;
        v->s = b.d;
        return 0;
    }
    if (c == '[')
        return array(ps, v);
    return token(ps, v);
}
