/* A command as an argument vector, never a shell string: `[loader] command` and `ctitan loader
 * swap --cmd` are split here into words the way a user expects from a shell (blanks between
 * words, '...' and "..." quoting, backslash escapes) but with nothing a shell would expand or
 * run: a pipe, a redirection, a variable, a glob, a `~`, a comment, a leading VAR=value or a
 * newline between words (a second command to a shell) is refused unless quoted. The words
 * travel in MSG_SWAP_ARGV's data field packed back to back, each NUL-terminated, and are
 * exec'ed with execvp. Functions return 0 or -errno and say why
 * in err; nothing here exits. */
#ifndef CTITAN_ARGV_H
#define CTITAN_ARGV_H

#include <stddef.h>
#include <stdint.h>

#define ARGV_MAX_WORDS 256
#define ARGV_MAX_BYTES 4096 /* packed: every word and its NUL */

/* One malloc'ed block: argv[0 .. argc-1], argv[argc] = NULL, the words after the pointers. */
typedef struct {
    int argc;
    char **argv;
} argv_t;

/* Splits line into words. Returns 0 (at least one word, the first not empty), or -EINVAL with
 * what and where in err ("'|' at byte 12: ..."), -E2BIG over the limits, -ENOMEM. */
int argv_split(const char *line, argv_t *out, char *err, size_t errlen);
/* The packed form (len bytes at data) back into words, checked like a peer's input: at least
 * one word, the first not empty, every word NUL-terminated, within the limits. */
int argv_unpack(const uint8_t *data, size_t len, argv_t *out, char *err, size_t errlen);
/* Packs a's words into buf (ARGV_MAX_BYTES); *len gets the bytes used. -E2BIG if they do not fit. */
int argv_pack(const argv_t *a, uint8_t *buf, size_t *len);
void argv_free(argv_t *a);
/* The words as one line, each quoted when it needs it, for messages; truncated to n. */
const char *argv_show(const argv_t *a, char *buf, size_t n);

#endif
