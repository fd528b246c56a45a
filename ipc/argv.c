/* Commands as argument vectors (see argv.h): the splitter, the packed wire form, the quoted
 * form for messages. */
#include "ipc/argv.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"

/* What a shell would act on outside quotes; refused there, so that no command means something
 * else without a shell than with one. */
static const char shell_chars[] = "|&;<>()$`*?[";

/* One block: the pointers, then the n bytes of words at w (each NUL-terminated). */
static int build(const char *w, size_t n, int argc, argv_t *out)
{
    char **v = malloc((size_t)(argc + 1) * sizeof(char *) + n);
    if (!v)
        return -ENOMEM;
    char *p = (char *)(v + argc + 1);
    memcpy(p, w, n);
    for (int i = 0; i < argc; i++) {
        v[i] = p;
        p += strlen(p) + 1;
    }
    v[argc] = NULL;
    out->argc = argc;
    out->argv = v;
    return 0;
}

/* Whether word[0 .. n) is a shell variable name (what VAR=value assigns). */
static bool is_name(const char *word, size_t n)
{
    if (n == 0 || (word[0] >= '0' && word[0] <= '9'))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(word[i] == '_' || (word[i] >= 'a' && word[i] <= 'z') || (word[i] >= 'A' && word[i] <= 'Z') ||
              (word[i] >= '0' && word[i] <= '9')))
            return false;
    return true;
}

typedef struct {
    char buf[ARGV_MAX_BYTES];
    size_t n, start; /* bytes used; where the current word starts */
    int argc;
    bool in_word, quoted; /* inside a word; some of it was quoted */
} split_t;

static int put(split_t *s, char ch, char *err, size_t errlen)
{
    if (s->n + 2 > sizeof s->buf)
        return util_fail(err, errlen, -E2BIG, "the command is longer than %d bytes", ARGV_MAX_BYTES - 1);
    s->buf[s->n++] = ch;
    return 0;
}

static int end_word(split_t *s, char *err, size_t errlen)
{
    if (!s->in_word)
        return 0;
    if (s->argc == ARGV_MAX_WORDS)
        return util_fail(err, errlen, -E2BIG, "the command has more than %d words", ARGV_MAX_WORDS);
    int rc = put(s, '\0', err, errlen);
    s->argc++;
    s->in_word = s->quoted = false;
    s->start = s->n;
    return rc;
}

/* After the opening quote q at line[*i]: the quoted text into the word; *i ends on the closing quote. */
static int quoted(split_t *s, const char *line, size_t *i, char *err, size_t errlen)
{
    char q = line[*i];
    size_t open = *i;
    s->in_word = s->quoted = true;
    for ((*i)++; line[*i] && line[*i] != q; (*i)++) {
        char ch = line[*i];
        if (q == '"' && (ch == '$' || ch == '`'))
            return util_fail(err, errlen, -EINVAL, "'%c' at byte %zu inside double quotes: commands run without a "
                             "shell, nothing is expanded (use single quotes for a literal '%c')", ch, *i, ch);
        if (q == '"' && ch == '\\' && line[*i + 1] && strchr("\"\\$`\n", line[*i + 1])) {
            ch = line[++(*i)];
            if (ch == '\n')
                continue; /* a line continuation */
        }
        int rc = put(s, ch, err, errlen);
        if (rc)
            return rc;
    }
    if (!line[*i])
        return util_fail(err, errlen, -EINVAL, "the quote %c at byte %zu is not closed", q, open);
    return 0;
}

/* One character outside quotes at line[*i]. */
static int plain(split_t *s, const char *line, size_t *i, char *err, size_t errlen)
{
    char ch = line[*i];
    if (ch == '\n' && line[*i + strspn(line + *i, " \t\n")])
        return util_fail(err, errlen, -EINVAL, "a newline at byte %zu: commands run without a shell, to which it "
                         "would start a second command (one command only; quote it if it is meant literally)", *i);
    if (ch == ' ' || ch == '\t' || ch == '\n') /* a newline here ends the command: only blanks follow */
        return end_word(s, err, errlen);
    if (ch == '\'' || ch == '"')
        return quoted(s, line, i, err, errlen);
    if (ch == '\\') {
        if (!line[*i + 1])
            return util_fail(err, errlen, -EINVAL, "a backslash ends the command (nothing to escape)");
        ch = line[++(*i)];
        if (ch == '\n')
            return 0; /* a line continuation */
        s->in_word = s->quoted = true;
        return put(s, ch, err, errlen);
    }
    if (strchr(shell_chars, ch) || (!s->in_word && (ch == '#' || ch == '~')))
        return util_fail(err, errlen, -EINVAL, "'%c' at byte %zu: commands run without a shell (no pipes, "
                         "redirections, variables, globs, ~ or comments): quote it if it is meant literally", ch, *i);
    if (ch == '=' && s->argc == 0 && !s->quoted && is_name(s->buf + s->start, s->n - s->start))
        return util_fail(err, errlen, -EINVAL, "'%.*s=' at byte %zu: commands run without a shell, which "
                         "would take it for an environment assignment: quote it if it is the program", (int)(s->n - s->start),
                         s->buf + s->start, s->start);
    s->in_word = true;
    return put(s, ch, err, errlen);
}

int argv_split(const char *line, argv_t *out, char *err, size_t errlen)
{
    out->argc = 0;
    out->argv = NULL;
    split_t *s = calloc(1, sizeof *s);
    if (!s)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; !rc && line[i]; i++) /* after an error i may be past the end */
        rc = plain(s, line, &i, err, errlen);
    if (!rc)
        rc = end_word(s, err, errlen);
    if (!rc && (s->argc == 0 || !s->buf[0]))
        rc = util_fail(err, errlen, -EINVAL, s->argc ? "the program's name is empty" : "the command is empty");
    if (!rc && (rc = build(s->buf, s->n, s->argc, out)))
        util_fail(err, errlen, rc, "out of memory");
    free(s);
    return rc;
}

int argv_unpack(const uint8_t *data, size_t len, argv_t *out, char *err, size_t errlen)
{
    out->argc = 0;
    out->argv = NULL;
    if (len == 0 || !data)
        return util_fail(err, errlen, -EINVAL, "no program: the argument vector is empty");
    if (len > ARGV_MAX_BYTES)
        return util_fail(err, errlen, -E2BIG, "an argument vector of %zu bytes (at most %d)", len, ARGV_MAX_BYTES);
    if (data[len - 1] != '\0')
        return util_fail(err, errlen, -EINVAL, "the last word of the argument vector is not NUL-terminated");
    if (data[0] == '\0')
        return util_fail(err, errlen, -EINVAL, "the program's name is empty");
    int argc = 0;
    for (size_t i = 0; i < len; i++)
        argc += data[i] == '\0';
    if (argc > ARGV_MAX_WORDS)
        return util_fail(err, errlen, -E2BIG, "an argument vector of %d words (at most %d)", argc, ARGV_MAX_WORDS);
    int rc = build((const char *)data, len, argc, out);
    return rc ? util_fail(err, errlen, rc, "out of memory") : 0;
}

int argv_pack(const argv_t *a, uint8_t *buf, size_t *len)
{
    size_t n = 0;
    for (int i = 0; i < a->argc; i++) {
        size_t k = strlen(a->argv[i]) + 1;
        if (n + k > ARGV_MAX_BYTES)
            return -E2BIG;
        memcpy(buf + n, a->argv[i], k);
        n += k;
    }
    *len = n;
    return 0;
}

void argv_free(argv_t *a)
{
    free(a->argv);
    a->argv = NULL;
    a->argc = 0;
}

const char *argv_show(const argv_t *a, char *buf, size_t n)
{
    size_t k = 0;
    if (n)
        buf[0] = '\0';
    for (int i = 0; i < a->argc && k + 1 < n; i++) {
        const char *w = a->argv[i];
        bool bare = *w && strspn(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:=,+@%-") ==
                              strlen(w) &&
                    !(i == 0 && strchr(w, '=')); /* a first word with '=' reads as an assignment */
        if (i)
            buf[k++] = ' ';
        if (!bare)
            buf[k++] = '\'';
        for (; *w && k + 5 < n; w++) {
            if (!bare && *w == '\'') {
                memcpy(buf + k, "'\\''", 4);
                k += 4;
            } else {
                buf[k++] = *w;
            }
        }
        if (!bare && k + 1 < n)
            buf[k++] = '\'';
        buf[k < n ? k : n - 1] = '\0';
    }
    return buf;
}
