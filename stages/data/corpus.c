/* Text corpora read a unit at a time and tokenized on the fly (see stages/data/corpus.h): the
 * reader over one source's files (zlib reads gzip and plain files alike), then the per-source
 * token queues and the weighted mix the loader serves sequences from. */
#include "stages/data/corpus.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

#include "ipc/util.h"

#define RD_BLOCK 65536

struct corpus_reader {
    corpus_src_opts_t o;   /* pattern and field point at copies below */
    char *pattern, *field;
    char **files;
    int *fmt;              /* per file: CORPUS_LINES, FILE or JSONL */
    size_t n_files;
    /* the open file */
    gzFile gz;
    size_t cur;            /* its index */
    uint64_t pos;          /* uncompressed offset of buf[b_pos] */
    uint64_t line;         /* 1-based number of the line starting at pos */
    uint8_t *buf;
    size_t b_pos, b_end, b_cap;
    int eof;
    /* a JSON Lines document (json strings are freed with their object) */
    uint8_t *doc;
    size_t doc_cap;
    uint64_t bad, epoch, units_this_pass;
    int pass_from_start;   /* this pass began at file 0, offset 0 */
};

/* ---- files ---- */

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int format_of(const char *path, int want)
{
    if (want != CORPUS_AUTO)
        return want;
    const char *j[] = {".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz"};
    for (int i = 0; i < 4; i++)
        if (has_suffix(path, j[i]))
            return CORPUS_JSONL;
    return CORPUS_LINES;
}

static int rd_close_file(corpus_reader_t *r)
{
    if (r->gz)
        gzclose_r(r->gz);
    r->gz = NULL;
    r->b_pos = r->b_end = 0;
    r->eof = 0;
    return 0;
}

static int rd_open_file(corpus_reader_t *r, size_t i, char *err, size_t errlen)
{
    rd_close_file(r);
    size_t size;
    int fd = util_open_regular(r->files[i], &size, err, errlen);
    if (fd < 0)
        return fd;
    if (!(r->gz = gzdopen(fd, "rb"))) {
        close(fd);
        return util_fail(err, errlen, -ENOMEM, "%s: cannot open for reading (zlib)", r->files[i]);
    }
    gzbuffer(r->gz, 1 << 17);
    r->cur = i;
    r->pos = 0;
    r->line = 1;
    return 0;
}

/* Reads more of the file into buf (keeping buf[b_pos, b_end)); sets eof at its end. */
static int rd_more(corpus_reader_t *r, char *err, size_t errlen)
{
    if (r->b_pos > 0) {
        memmove(r->buf, r->buf + r->b_pos, r->b_end - r->b_pos);
        r->b_end -= r->b_pos;
        r->b_pos = 0;
    }
    if (r->b_cap - r->b_end < RD_BLOCK) {
        size_t c = r->b_cap ? 2 * r->b_cap : 4 * RD_BLOCK;
        uint8_t *b = realloc(r->buf, c);
        if (!b)
            return util_fail(err, errlen, -ENOMEM, "%s: out of memory reading it", r->files[r->cur]);
        r->buf = b;
        r->b_cap = c;
    }
    size_t want = r->b_cap - r->b_end;
    int n = gzread(r->gz, r->buf + r->b_end, (unsigned)(want < INT_MAX ? want : INT_MAX));
    int zerr = Z_OK;
    const char *msg = gzerror(r->gz, &zerr);
    if (n < 0 || (zerr != Z_OK && zerr != Z_STREAM_END)) {
        if (zerr == Z_ERRNO)
            return util_fail(err, errlen, -EIO, "%s: read failed: %s", r->files[r->cur], strerror(errno));
        return util_fail(err, errlen, -EINVAL, "%s: corrupt gzip data near compressed byte %lld: %s",
                         r->files[r->cur], (long long)gzoffset(r->gz), msg);
    }
    if (n == 0)
        r->eof = 1;
    r->b_end += (size_t)n;
    return 0;
}

/* Consumes n buffered bytes, counting the lines they end. */
static void rd_consume(corpus_reader_t *r, size_t n)
{
    if (n == 0)
        return;
    for (const uint8_t *p = r->buf + r->b_pos, *e = p + n; (p = memchr(p, '\n', (size_t)(e - p))); p++)
        r->line++;
    r->b_pos += n;
    r->pos += n;
}

/* The next line of the file without its "\n" (pointer into buf); 1 at the end of the file. */
static int rd_line(corpus_reader_t *r, const uint8_t **p, size_t *len, char *err, size_t errlen)
{
    size_t scanned = 0;
    for (;;) {
        size_t avail = r->b_end - r->b_pos;
        const uint8_t *nl = avail > scanned ? memchr(r->buf + r->b_pos + scanned, '\n', avail - scanned) : NULL;
        if (nl || r->eof) {
            if (!nl && avail == 0)
                return 1;
            *p = r->buf + r->b_pos;
            *len = nl ? (size_t)(nl - *p) : avail;
            r->b_pos += *len + (nl != NULL);
            r->pos += *len + (nl != NULL);
            r->line += nl != NULL;
            return 0;
        }
        scanned = avail;
        if (scanned > CORPUS_MAX_LINE)
            return util_fail(err, errlen, -EINVAL, "%s:%llu: a line longer than %zu bytes", r->files[r->cur],
                             (unsigned long long)r->line, CORPUS_MAX_LINE);
        int rc = rd_more(r, err, errlen);
        if (rc)
            return rc;
    }
}

/* At least n bytes buffered, or all that is left of the file. */
static int rd_ensure(corpus_reader_t *r, size_t n, char *err, size_t errlen)
{
    while (r->b_end - r->b_pos < n && !r->eof) {
        int rc = rd_more(r, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- units ---- */

/* A JSON Lines line: 0 with the document in u, 1 for no document (blank line, or a bad line
 * skipped), or -EINVAL for a bad line under CORPUS_BAD_ERROR. */
static int jsonl_doc(corpus_reader_t *r, const uint8_t *p, size_t len, uint64_t line, corpus_unit_t *u, char *err,
                     size_t errlen)
{
    size_t i = 0;
    while (i < len && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r'))
        i++;
    if (i == len)
        return 1;
    json_error_t je;
    json_t *o = json_loadb((const char *)p, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    json_t *v = o && json_is_object(o) ? json_object_get(o, r->field) : NULL;
    char why[300];
    if (!o)
        snprintf(why, sizeof(why), "not JSON: %s", je.text);
    else if (!json_is_object(o))
        snprintf(why, sizeof(why), "not a JSON object");
    else if (!v)
        snprintf(why, sizeof(why), "no field \"%.100s\"", r->field);
    else if (!json_is_string(v))
        snprintf(why, sizeof(why), "field \"%.100s\" is not a string", r->field);
    else {
        size_t n = json_string_length(v);
        if (n == 0) { /* an empty document is no document */
            json_decref(o);
            return 1;
        }
        if (n > r->doc_cap) {
            uint8_t *d = realloc(r->doc, n);
            if (!d) {
                json_decref(o);
                return util_fail(err, errlen, -ENOMEM, "%s:%llu: out of memory", r->files[r->cur],
                                 (unsigned long long)line);
            }
            r->doc = d;
            r->doc_cap = n;
        }
        memcpy(r->doc, json_string_value(v), n);
        json_decref(o);
        u->text = r->doc;
        u->len = n;
        return 0;
    }
    json_decref(o);
    if (r->o.on_bad_line == CORPUS_BAD_ERROR)
        return util_fail(err, errlen, -EINVAL, "%s:%llu: %s (--on-bad-line error)", r->files[r->cur],
                         (unsigned long long)line, why);
    if (++r->bad <= CORPUS_BAD_REPORTED && r->epoch == 0 && r->o.log) /* once, not every epoch */
        fprintf(r->o.log, "corpus: %s:%llu: %s: line skipped%s\n", r->files[r->cur], (unsigned long long)line, why,
                r->bad == CORPUS_BAD_REPORTED ? " (further ones are only counted)" : "");
    return 1;
}

/* A CORPUS_FILE chunk: whole lines from chunk_bytes on, cut at 2 * chunk_bytes (the unit then
 * ends the document when nothing follows it); 1 at the end of the file. */
static int file_chunk(corpus_reader_t *r, corpus_unit_t *u, char *err, size_t errlen)
{
    size_t chunk = r->o.chunk_bytes;
    int rc = rd_ensure(r, 2 * chunk + 1, err, errlen);
    if (rc)
        return rc;
    size_t avail = r->b_end - r->b_pos, cap = avail < 2 * chunk ? avail : 2 * chunk, e = chunk;
    if (avail == 0)
        return 1;
    const uint8_t *b = r->buf + r->b_pos;
    if (e >= cap) {
        e = cap;
    } else {
        const uint8_t *nl = memchr(b + e, '\n', cap - e);
        e = nl ? (size_t)(nl - b) + 1 : cap;
    }
    u->text = b;
    u->len = e;
    u->doc_start = r->pos == 0;
    u->doc_end = r->eof && e == avail; /* fewer than 2 * chunk + 1 bytes were left */
    rd_consume(r, e);
    return 0;
}

/* The next unit of the open file; 1 at its end. */
static int rd_next_in_file(corpus_reader_t *r, corpus_unit_t *u, char *err, size_t errlen)
{
    int fmt = r->fmt[r->cur];
    for (;;) {
        u->file = (uint32_t)r->cur;
        u->off = r->pos;
        if (fmt == CORPUS_FILE)
            return file_chunk(r, u, err, errlen);
        uint64_t line = r->line;
        const uint8_t *p = NULL;
        size_t len = 0;
        int rc = rd_line(r, &p, &len, err, errlen);
        if (rc)
            return rc;
        u->doc_start = u->doc_end = 1;
        if (u->off == 0 && len >= 3 && !memcmp(p, "\xEF\xBB\xBF", 3)) { /* a UTF-8 byte order mark */
            p += 3;
            len -= 3;
        }
        if (fmt == CORPUS_JSONL) {
            if ((rc = jsonl_doc(r, p, len, line, u, err, errlen)) <= 0)
                return rc;
            continue;
        }
        if (len && p[len - 1] == '\r')
            len--;
        if (len) {
            u->text = p;
            u->len = len;
            return 0;
        }
    }
}

int corpus_reader_next(corpus_reader_t *r, corpus_unit_t *u, char *err, size_t errlen)
{
    for (;;) {
        int rc = r->gz ? 0 : rd_open_file(r, r->cur, err, errlen);
        if (!rc)
            rc = rd_next_in_file(r, u, err, errlen);
        if (rc == 0)
            r->units_this_pass++;
        if (rc <= 0)
            return rc;
        rd_close_file(r);
        if (r->cur + 1 < r->n_files) {
            r->cur++;
            continue;
        }
        if (r->units_this_pass == 0 && r->pass_from_start)
            return util_fail(err, errlen, -ENODATA, "%s: no document in its %zu file(s)%s", r->pattern,
                             r->n_files, r->bad ? " (every line was skipped as bad)" : "");
        r->pass_from_start = 1;
        r->units_this_pass = 0;
        r->epoch++;
        r->cur = 0;
    }
}

int corpus_reader_seek(corpus_reader_t *r, uint32_t file, uint64_t off, char *err, size_t errlen)
{
    if (file >= r->n_files)
        return util_fail(err, errlen, -EINVAL, "the position names file %u of %s, which matches %zu file(s)",
                         (unsigned)file, r->pattern, r->n_files);
    int rc = rd_open_file(r, file, err, errlen);
    while (!rc && r->pos < off) {
        size_t avail = r->b_end - r->b_pos;
        if (avail == 0 && r->eof)
            rc = util_fail(err, errlen, -EINVAL, "%s: the position %llu is past its end (%llu bytes)",
                           r->files[file], (unsigned long long)off, (unsigned long long)r->pos);
        else if (avail == 0)
            rc = rd_more(r, err, errlen);
        else
            rd_consume(r, avail < off - r->pos ? avail : (size_t)(off - r->pos));
    }
    if (!rc && off > 0 && r->fmt[file] != CORPUS_FILE && r->buf[r->b_pos - 1] != '\n')
        rc = util_fail(err, errlen, -EINVAL, "%s: the position %llu is not at a line start", r->files[file],
                       (unsigned long long)off);
    if (rc) {
        rd_close_file(r);
        r->cur = 0;
        return rc;
    }
    r->pass_from_start = file == 0 && off == 0;
    r->units_this_pass = 0;
    return 0;
}

/* The pattern's files, sorted; a pattern without glob characters, or naming a file that
 * exists ("a[1].txt"), is that one file. */
static int rd_expand(corpus_reader_t *r, char *err, size_t errlen)
{
    glob_t g = {0};
    const char *one[1] = {r->pattern};
    char *const *names = (char *const *)one;
    size_t n = 1;
    if (strpbrk(r->pattern, "*?[") && access(r->pattern, F_OK) != 0) {
        int grc = glob(r->pattern, 0, NULL, &g);
        if (grc == GLOB_NOMATCH)
            return util_fail(err, errlen, -ENOENT, "%s: the glob matches no file", r->pattern);
        if (grc)
            return util_fail(err, errlen, -EIO, "%s: the glob failed (%s)", r->pattern,
                             grc == GLOB_NOSPACE ? "out of memory" : "read error");
        names = g.gl_pathv;
        n = g.gl_pathc;
    }
    int rc = 0;
    r->files = calloc(n, sizeof(*r->files));
    r->fmt = calloc(n, sizeof(*r->fmt));
    if (!r->files || !r->fmt)
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", r->pattern);
    for (size_t i = 0; !rc && i < n; i++, r->n_files++) {
        if (!(r->files[i] = strdup(names[i])))
            rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", r->pattern);
        r->fmt[i] = format_of(names[i], r->o.format);
    }
    if (names != (char *const *)one)
        globfree(&g);
    return rc;
}

int corpus_reader_open(corpus_reader_t **out, const corpus_src_opts_t *o, char *err, size_t errlen)
{
    *out = NULL;
    if (!o->pattern || !*o->pattern)
        return util_fail(err, errlen, -EINVAL, "a source without a file name");
    if (o->format < CORPUS_AUTO || o->format > CORPUS_JSONL)
        return util_fail(err, errlen, -EINVAL, "%s: unknown format %d", o->pattern, o->format);
    corpus_reader_t *r = calloc(1, sizeof(*r));
    if (!r)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    r->o = *o;
    if (!r->o.chunk_bytes)
        r->o.chunk_bytes = CORPUS_DEFAULT_CHUNK;
    r->pattern = strdup(o->pattern);
    r->field = strdup(o->field ? o->field : "text");
    r->o.pattern = r->pattern;
    r->o.field = r->field;
    r->pass_from_start = 1;
    int rc = !r->pattern || !r->field ? util_fail(err, errlen, -ENOMEM, "out of memory") : 0;
    if (!rc && r->o.chunk_bytes < CORPUS_MIN_CHUNK)
        rc = util_fail(err, errlen, -EINVAL, "%s: chunk size %zu is under %d bytes", o->pattern, r->o.chunk_bytes,
                       CORPUS_MIN_CHUNK);
    if (!rc)
        rc = rd_expand(r, err, errlen);
    for (size_t i = 0; !rc && i < r->n_files; i++) {
        size_t size;
        int fd = util_open_regular(r->files[i], &size, err, errlen);
        if (fd < 0)
            rc = fd;
        else
            close(fd);
    }
    if (rc)
        corpus_reader_destroy(&r);
    *out = r;
    return rc;
}

void corpus_reader_destroy(corpus_reader_t **rp)
{
    corpus_reader_t *r = *rp;
    if (!r)
        return;
    rd_close_file(r);
    for (size_t i = 0; i < r->n_files; i++)
        free(r->files[i]);
    free(r->files), free(r->fmt), free(r->buf), free(r->doc), free(r->pattern), free(r->field);
    free(r);
    *rp = NULL;
}

size_t corpus_reader_files(const corpus_reader_t *r) { return r->n_files; }
const char *corpus_reader_file(const corpus_reader_t *r, size_t i) { return i < r->n_files ? r->files[i] : NULL; }
uint64_t corpus_reader_bad_lines(const corpus_reader_t *r) { return r->bad; }
uint64_t corpus_reader_epoch(const corpus_reader_t *r) { return r->epoch; }

/* Appends p[0, n) to *buf. */
static int append(uint8_t **buf, size_t *len, size_t *cap, const void *p, size_t n)
{
    if (*cap - *len < n) {
        size_t c = *cap ? *cap : 65536;
        while (c - *len < n)
            c *= 2;
        uint8_t *b = realloc(*buf, c);
        if (!b)
            return -ENOMEM;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    return 0;
}

/* One file into *buf: its documents each with a "\n" (JSON Lines), or its bytes whole. */
static int slurp_file(corpus_reader_t *r, size_t i, uint8_t **buf, size_t *len, size_t *cap, char *err,
                      size_t errlen)
{
    int rc = rd_open_file(r, i, err, errlen);
    corpus_unit_t u;
    while (!rc && r->fmt[i] == CORPUS_JSONL && !(rc = rd_next_in_file(r, &u, err, errlen)))
        if (append(buf, len, cap, u.text, u.len) || append(buf, len, cap, "\n", 1))
            rc = -ENOMEM;
    while (!rc && r->fmt[i] != CORPUS_JSONL && !(r->eof && r->b_pos == r->b_end)) {
        if (r->b_pos == r->b_end)
            rc = rd_more(r, err, errlen);
        else if (append(buf, len, cap, r->buf + r->b_pos, r->b_end - r->b_pos))
            rc = -ENOMEM;
        else
            r->b_pos = r->b_end;
    }
    if (rc == -ENOMEM)
        util_fail(err, errlen, rc, "%s: out of memory reading it", r->files[i]);
    rd_close_file(r);
    return rc == 1 ? 0 : rc;
}

int corpus_slurp(const corpus_src_opts_t *o, uint8_t **buf, size_t *len, size_t *cap, size_t *n_files,
                 uint64_t *bad, char *err, size_t errlen)
{
    corpus_reader_t *r;
    int rc = corpus_reader_open(&r, o, err, errlen);
    for (size_t i = 0; !rc && i < r->n_files; i++)
        rc = slurp_file(r, i, buf, len, cap, err, errlen);
    if (!rc) {
        *n_files += r->n_files;
        *bad += r->bad;
    }
    corpus_reader_destroy(&r);
    return rc;
}

/* ---- token streams and the mix ---- */

typedef struct {
    corpus_reader_t *rd;
    corpus_unit_t u;       /* the unit being tokenized, while have_unit */
    int have_unit;
    size_t piece;          /* where its next piece starts */
    uint64_t unit_tok;     /* tokens of it queued so far */
    uint32_t *q, *q_file;  /* queued tokens, and per token where its unit starts ... */
    uint64_t *q_off, *q_skip; /* ... and its index in the unit */
    size_t q_len, q_head, q_cap;
} stream_t;

struct corpus {
    int n, bos, eos, T;
    stream_t s[CORPUS_MAX_SOURCES];
    double cum[CORPUS_MAX_SOURCES];
    tok_t *tok;
    uint64_t seed, fp;
    size_t chunk_max;      /* 2 * the largest chunk_bytes: the longest piece */
    uint32_t *enc;
};

/* Where the piece of u that starts at `from` ends: all of it up to 2 * chunk bytes, else after
 * a run of newlines or before the last space of a run (where the pre-tokenizers split anyway)
 * from chunk bytes on, else at 2 * chunk (not inside a UTF-8 character). */
static size_t piece_end(const uint8_t *t, size_t len, size_t from, size_t chunk)
{
    if (len - from <= 2 * chunk)
        return len;
    size_t lo = from + chunk, hi = from + 2 * chunk;
    const uint8_t *nl = memchr(t + lo, '\n', hi - lo);
    if (nl) {
        size_t e = (size_t)(nl - t) + 1;
        while (e < hi && (t[e] == '\n' || t[e] == '\r'))
            e++;
        return e;
    }
    for (size_t i = lo; i + 1 < hi; i++)
        if (t[i] == ' ' && t[i + 1] != ' ')
            return i;
    size_t e = hi;
    for (int k = 0; k < 3 && (t[e] & 0xC0) == 0x80; k++)
        e--;
    return e;
}

static void queue_push(stream_t *s, uint32_t tok)
{
    s->q[s->q_len] = tok;
    s->q_file[s->q_len] = s->u.file;
    s->q_off[s->q_len] = s->u.off;
    s->q_skip[s->q_len++] = s->unit_tok++;
}

/* Queues the tokens of the next piece of the source (BOS and EOS at the document's ends). */
static int refill(corpus_t *c, stream_t *s, char *err, size_t errlen)
{
    if (!s->have_unit) {
        int rc = corpus_reader_next(s->rd, &s->u, err, errlen);
        if (rc)
            return rc;
        s->have_unit = 1;
        s->piece = 0;
        s->unit_tok = 0;
    }
    if (s->q_head > 0) { /* drop what was handed out */
        size_t m = s->q_len - s->q_head;
        memmove(s->q, s->q + s->q_head, m * sizeof(*s->q));
        memmove(s->q_file, s->q_file + s->q_head, m * sizeof(*s->q_file));
        memmove(s->q_off, s->q_off + s->q_head, m * sizeof(*s->q_off));
        memmove(s->q_skip, s->q_skip + s->q_head, m * sizeof(*s->q_skip));
        s->q_len = m;
        s->q_head = 0;
    }
    size_t chunk = s->rd->o.chunk_bytes, from = s->piece, to = piece_end(s->u.text, s->u.len, from, chunk), n;
    if (s->q_len + (to - from) + 2 > s->q_cap)
        return util_fail(err, errlen, -EOVERFLOW, "corpus: token queue overflow"); /* need() prevents it */
    int rc = tok_encode(c->tok, s->u.text + from, to - from, c->enc, &n);
    if (rc)
        return util_fail(err, errlen, rc, "%s: encoding failed: %s", s->rd->files[s->u.file], strerror(-rc));
    if (from == 0 && s->u.doc_start && c->bos >= 0)
        queue_push(s, (uint32_t)c->bos);
    for (size_t i = 0; i < n; i++)
        queue_push(s, c->enc[i]);
    if (to == s->u.len && s->u.doc_end && c->eos >= 0)
        queue_push(s, (uint32_t)c->eos);
    s->piece = to;
    s->have_unit = to < s->u.len;
    return 0;
}

/* At least `want` (<= T + 1) tokens queued from q_head. */
static int need(corpus_t *c, stream_t *s, size_t want, char *err, size_t errlen)
{
    while (s->q_len - s->q_head < want) {
        int rc = refill(c, s, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* Drops n tokens of source s. */
static int skip_tokens(corpus_t *c, stream_t *s, uint64_t n, char *err, size_t errlen)
{
    while (n > 0) {
        int rc = need(c, s, 1, err, errlen);
        if (rc)
            return rc;
        size_t have = s->q_len - s->q_head, take = n < have ? (size_t)n : have;
        s->q_head += take;
        n -= take;
    }
    return 0;
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int corpus_pick(const corpus_t *c, uint64_t k)
{
    double u = (double)(mix64(mix64(c->seed) ^ k) >> 11) * 0x1p-53;
    for (int i = 0; i < c->n - 1; i++)
        if (u < c->cum[i])
            return i;
    return c->n - 1;
}

/* The fingerprint: what positions depend on, hashed. */
static uint64_t fingerprint(const corpus_t *c, const corpus_opts_t *o)
{
    XXH64_state_t *h = XXH64_createState();
    if (!h)
        return 0;
    XXH64_reset(h, 0x637469746eull);
    int64_t head[4] = {c->n, c->bos, c->eos, (int64_t)o->tok_fingerprint};
    XXH64_update(h, head, sizeof(head));
    for (int i = 0; i < c->n; i++) {
        const corpus_reader_t *r = c->s[i].rd;
        uint64_t v[2] = {r->o.chunk_bytes, r->n_files};
        XXH64_update(h, v, sizeof(v));
        XXH64_update(h, r->field, strlen(r->field) + 1);
        for (size_t f = 0; f < r->n_files; f++) {
            XXH64_update(h, r->files[f], strlen(r->files[f]) + 1);
            XXH64_update(h, &r->fmt[f], sizeof(r->fmt[f]));
        }
    }
    uint64_t d = XXH64_digest(h);
    XXH64_freeState(h);
    return d;
}

static int check_opts(const corpus_opts_t *o, char *err, size_t errlen)
{
    if (o->n < 1 || o->n > CORPUS_MAX_SOURCES)
        return util_fail(err, errlen, -EINVAL, "%d sources: between 1 and %d are allowed", o->n, CORPUS_MAX_SOURCES);
    if (!o->tok || o->seq_len < 1)
        return util_fail(err, errlen, -EINVAL, "corpus: no tokenizer or no sequence length");
    for (int i = 0; i < o->n; i++)
        if (!(o->weight[i] > 0) || o->weight[i] > 1e300)
            return util_fail(err, errlen, -EINVAL, "%s: the weight %g is not a positive number",
                             o->src[i].pattern ? o->src[i].pattern : "?", o->weight[i]);
    int v = tok_vocab_size(o->tok);
    if (o->bos >= v || o->eos >= v || o->bos < -1 || o->eos < -1)
        return util_fail(err, errlen, -EINVAL, "the BOS %d or EOS %d is not a token id (the tokenizer has %d)",
                         o->bos, o->eos, v);
    return 0;
}

static int stream_alloc(corpus_t *c, stream_t *s, char *err, size_t errlen)
{
    s->q_cap = 2 * s->rd->o.chunk_bytes + 2 + (size_t)c->T + 1;
    s->q = malloc(s->q_cap * sizeof(*s->q));
    s->q_file = malloc(s->q_cap * sizeof(*s->q_file));
    s->q_off = malloc(s->q_cap * sizeof(*s->q_off));
    s->q_skip = malloc(s->q_cap * sizeof(*s->q_skip));
    if (!s->q || !s->q_file || !s->q_off || !s->q_skip)
        return util_fail(err, errlen, -ENOMEM, "corpus: out of memory for the token queues");
    size_t m = 2 * s->rd->o.chunk_bytes;
    c->chunk_max = m > c->chunk_max ? m : c->chunk_max;
    return 0;
}

int corpus_open(corpus_t **out, const corpus_opts_t *o, char *err, size_t errlen)
{
    *out = NULL;
    int rc = check_opts(o, err, errlen);
    if (rc)
        return rc;
    corpus_t *c = calloc(1, sizeof(*c));
    if (!c)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    *c = (corpus_t){.n = o->n, .bos = o->bos, .eos = o->eos, .T = o->seq_len, .tok = o->tok, .seed = o->seed};
    double total = 0, acc = 0;
    for (int i = 0; i < o->n; i++)
        total += o->weight[i];
    for (int i = 0; i < o->n; i++)
        c->cum[i] = (acc += o->weight[i]) / total;
    for (int i = 0; !rc && i < o->n; i++)
        if (!(rc = corpus_reader_open(&c->s[i].rd, &o->src[i], err, errlen)))
            rc = stream_alloc(c, &c->s[i], err, errlen);
    if (!rc && !(c->enc = malloc(c->chunk_max * sizeof(*c->enc))))
        rc = util_fail(err, errlen, -ENOMEM, "corpus: out of memory");
    if (rc) {
        corpus_destroy(&c);
        return rc;
    }
    c->fp = fingerprint(c, o);
    *out = c;
    return 0;
}

void corpus_destroy(corpus_t **cp)
{
    corpus_t *c = *cp;
    if (!c)
        return;
    for (int i = 0; i < c->n; i++) {
        stream_t *s = &c->s[i];
        corpus_reader_destroy(&s->rd);
        free(s->q), free(s->q_file), free(s->q_off), free(s->q_skip);
    }
    free(c->enc);
    free(c);
    *cp = NULL;
}

int corpus_sources(const corpus_t *c) { return c->n; }
uint64_t corpus_fingerprint(const corpus_t *c) { return c->fp; }

uint64_t corpus_bad_lines(const corpus_t *c)
{
    uint64_t n = 0;
    for (int i = 0; i < c->n; i++)
        n += c->s[i].rd->bad;
    return n;
}

int corpus_next(corpus_t *c, uint64_t k, uint32_t *out, char *err, size_t errlen)
{
    stream_t *s = &c->s[corpus_pick(c, k)];
    size_t T = (size_t)c->T;
    int rc = need(c, s, T + 1, err, errlen);
    if (rc)
        return rc;
    memcpy(out, s->q + s->q_head, (T + 1) * sizeof(*out));
    s->q_head += T;
    return 0;
}

int corpus_position(corpus_t *c, int i, corpus_pos_t *p, char *err, size_t errlen)
{
    stream_t *s = &c->s[i];
    int rc = need(c, s, 1, err, errlen);
    if (rc)
        return rc;
    *p = (corpus_pos_t){s->q_file[s->q_head], s->q_off[s->q_head], s->q_skip[s->q_head]};
    return 0;
}

int corpus_seek(corpus_t *c, int i, const corpus_pos_t *p, char *err, size_t errlen)
{
    stream_t *s = &c->s[i];
    s->q_len = s->q_head = 0;
    s->have_unit = 0;
    if (p->file > UINT32_MAX)
        return util_fail(err, errlen, -EINVAL, "the position names file %llu", (unsigned long long)p->file);
    int rc = corpus_reader_seek(s->rd, (uint32_t)p->file, p->off, err, errlen);
    if (rc)
        return rc;
    /* the unit at off must hold skip tokens: more means another tokenizer or corpus */
    if ((rc = need(c, s, 1, err, errlen)))
        return rc;
    if (s->q_file[0] != p->file || s->q_off[0] != p->off)
        return util_fail(err, errlen, -EINVAL, "%s: no document starts at offset %llu", s->rd->files[p->file],
                         (unsigned long long)p->off);
    return skip_tokens(c, s, p->skip, err, errlen);
}

int corpus_replay(corpus_t *c, uint64_t k, char *err, size_t errlen)
{
    uint64_t picked[CORPUS_MAX_SOURCES] = {0};
    for (uint64_t j = 0; j < k; j++)
        picked[corpus_pick(c, j)]++;
    for (int i = 0; i < c->n; i++) {
        if (picked[i] > UINT64_MAX / (uint64_t)c->T)
            return util_fail(err, errlen, -EINVAL, "sample %llu is past any corpus", (unsigned long long)k);
        int rc = skip_tokens(c, &c->s[i], picked[i] * (uint64_t)c->T, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}
