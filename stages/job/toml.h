/* A small TOML reader for job manifests: the subset a torchtitan-style config needs, with
 * every error as "PATH:LINE: what is wrong". stages/manifest maps the parsed entries onto
 * manifest_t; nothing else in the tree parses TOML.
 *
 * Supported: comments, blank lines, LF and CRLF line ends, [section] headers, key = value with
 * bare keys, basic strings "..." (escapes \b \t \n \f \r \" \\ \uXXXX \UXXXXXXXX), literal
 * strings '...', integers (decimal with sign and _ separators; 0x 0o 0b), floats (1.0, 1e-4,
 * -2.5E3, inf, nan), booleans, and arrays of any of these (nested, multi-line, trailing comma).
 * Rejected with a message naming the construct: dotted keys and [a.b] tables, quoted keys,
 * [[arrays of tables]], inline tables, multi-line strings, dates and times. Duplicate keys in
 * a section and duplicate section headers are errors, as is anything after a value on its
 * line other than a comment. The input must be UTF-8 without NUL bytes. */
#ifndef CTITAN_TOML_H
#define CTITAN_TOML_H

#include <stddef.h>
#include <stdint.h>

typedef enum { TOML_STRING, TOML_INT, TOML_FLOAT, TOML_BOOL, TOML_ARRAY } toml_type_t;

typedef struct toml_value {
    toml_type_t type;
    int line;                  /* where the value starts */
    char *s;                   /* TOML_STRING: NUL-terminated UTF-8 (no NUL inside), owned */
    int64_t i;                 /* TOML_INT */
    double f;                  /* TOML_FLOAT */
    int b;                     /* TOML_BOOL: 0 or 1 */
    int n;                     /* TOML_ARRAY: items */
    struct toml_value *items;  /* TOML_ARRAY: (n), owned */
} toml_value_t;

typedef struct {
    char *name;                /* owned */
    int line;                  /* of the [name] header */
} toml_section_t;

typedef struct {
    int section;               /* index into toml_doc_t.sections, -1 before any header */
    char *key;                 /* owned */
    int line;                  /* of the key */
    toml_value_t value;
} toml_entry_t;

/* Entries in file order; the entries of one section are contiguous (no section repeats). */
typedef struct {
    int n_sections;
    toml_section_t *sections;  /* owned */
    int n_entries;
    toml_entry_t *entries;     /* owned */
} toml_doc_t;

/* Bounds that keep hostile input cheap: nesting of arrays, keys plus sections. */
#define TOML_MAX_DEPTH 16
#define TOML_MAX_ENTRIES 10000

/* Parses text[0, len). `path` prefixes every message ("PATH:LINE: ..."). On success fills
 * *doc (free with toml_free) and returns 0; on error returns -EINVAL (or -ENOMEM) with the
 * message in err and *doc empty. */
int toml_parse(toml_doc_t *doc, const char *text, size_t len, const char *path, char *err,
               size_t errlen);
void toml_free(toml_doc_t *doc);

/* Parses one value on its own (what follows "key =" on a line), e.g. a command-line override
 * "1e-4" or "[1, 2]"; surrounding spaces are allowed, nothing else. Errors carry no
 * "PATH:LINE:" prefix. Free with toml_value_free. Returns 0 or -EINVAL. */
int toml_parse_value(toml_value_t *out, const char *text, size_t len, char *err, size_t errlen);
void toml_value_free(toml_value_t *v);

/* "a string", "an integer", "a float", "a boolean", "an array": for "expected X, got Y". */
const char *toml_type_name(toml_type_t type);

/* Offset of the first byte of s[0, len) that is not part of valid UTF-8 (overlongs,
 * surrogates and code points above U+10FFFF are invalid), or -1 when it is all valid. */
long toml_utf8_invalid_at(const char *s, size_t len);

#endif
