/* Text corpora as people keep them, read for the loaders (stages/roles/loader_text.c) and
 * `ctitan prep`: plain text and JSON Lines, gzip-compressed or not, a file or a glob, several
 * sources mixed by weight, tokenized on the fly into one token stream per source.
 *
 * A source is a file or a glob (its matches sorted by name) of one format:
 *   CORPUS_LINES   plain text, one document per line (Hugging Face's `text` dataset): the line
 *                  without its "\n" (and a "\r" before it); empty lines are no document.
 *   CORPUS_FILE    plain text, each file one document, read and tokenized a chunk of whole
 *                  lines at a time (from chunk_bytes on, cut at 2 * chunk_bytes), newlines kept.
 *   CORPUS_JSONL   JSON Lines: one JSON object a line, the document the string in `field`
 *                  ("text"); blank lines are skipped; a bad line (not JSON, not an object, the
 *                  field missing or not a string, empty document excepted) is skipped and
 *                  counted, the first CORPUS_BAD_REPORTED named FILE:LINE in the log, or is an
 *                  error (CORPUS_BAD_ERROR).
 * Each file is gzip-compressed or not, told by its magic (zlib); offsets are always in the
 * uncompressed stream. A UTF-8 byte order mark at a file's start is dropped (line formats). A source is read as units (a line, a JSON Lines document, a chunk of a
 * CORPUS_FILE file): a unit starts at (file index, offset) and is the unit that begins there
 * whatever came before, which is what makes positions exact. At its end a source wraps to its
 * first file (a new epoch); a whole pass without one document is an error.
 *
 * The token stream of a source is its units' tokens back to back, BOS before and EOS after each
 * document (torchtitan's convention) when the tokenizer has them or the options name them.
 * A unit longer than 2 * chunk_bytes is tokenized in pieces cut at a newline or space after
 * chunk_bytes. Sequence k of the mix comes from source corpus_pick(k) (a weighted choice
 * decided by the seed and k alone), reading T + 1 tokens of that source's stream and moving on
 * by T. A source's position is (file, off, skip): skip tokens into the unit at (file, off).
 *
 * Functions return 0 or -errno with a message naming the file, line or option in err. */
#ifndef CTITAN_CORPUS_H
#define CTITAN_CORPUS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "stages/data/tokenizer.h"

enum { CORPUS_AUTO = 0, CORPUS_LINES, CORPUS_FILE, CORPUS_JSONL };
enum { CORPUS_BAD_SKIP = 0, CORPUS_BAD_ERROR = 1 };

#define CORPUS_MAX_SOURCES 8
#define CORPUS_MAX_LINE ((size_t)256 << 20)  /* longest line read (bytes) */
#define CORPUS_BAD_REPORTED 5
#define CORPUS_DEFAULT_CHUNK 65536
#define CORPUS_MIN_CHUNK 64

typedef struct {
    const char *pattern;   /* a file, or a glob (sorted matches) */
    int format;            /* CORPUS_*; AUTO: JSONL for *.jsonl, *.ndjson (also .gz), else LINES */
    const char *field;     /* JSONL: the document's field; NULL: "text" */
    int on_bad_line;       /* CORPUS_BAD_* */
    size_t chunk_bytes;    /* 0: CORPUS_DEFAULT_CHUNK */
    FILE *log;             /* where skipped lines are reported (the first few); NULL: nowhere */
} corpus_src_opts_t;

/* ---- one source's units ---- */

typedef struct corpus_reader corpus_reader_t;

typedef struct {
    const uint8_t *text;   /* valid until the next call on the reader */
    size_t len;
    uint32_t file;         /* index into the source's files */
    uint64_t off;          /* where the unit starts in that file's uncompressed stream */
    int doc_start, doc_end;/* the unit begins / ends a document (BOS / EOS go there) */
} corpus_unit_t;

/* Expands the glob (a pattern without * ? [, or naming an existing file, is a plain path) and
 * checks every file opens;
 * refuses a glob matching nothing. The caller owns *out. */
int corpus_reader_open(corpus_reader_t **out, const corpus_src_opts_t *o, char *err, size_t errlen);
void corpus_reader_destroy(corpus_reader_t **r);
size_t corpus_reader_files(const corpus_reader_t *r);
const char *corpus_reader_file(const corpus_reader_t *r, size_t i);
/* The next unit, wrapping at the end of the last file. -ENODATA when a whole pass of the
 * files holds no document; -EINVAL for a bad line under CORPUS_BAD_ERROR, a line over
 * CORPUS_MAX_LINE, or corrupt gzip data (naming the compressed offset); -EIO for read errors. */
int corpus_reader_next(corpus_reader_t *r, corpus_unit_t *u, char *err, size_t errlen);
/* The next unit read starts at (file, off), which must be a unit's start (line formats: a line
 * start); reads the file from its start to there (counting lines for the reports). */
int corpus_reader_seek(corpus_reader_t *r, uint32_t file, uint64_t off, char *err, size_t errlen);
uint64_t corpus_reader_bad_lines(const corpus_reader_t *r);
uint64_t corpus_reader_epoch(const corpus_reader_t *r);  /* wraps so far */

/* Appends the documents of every file the pattern matches to *buf (grown with realloc; *len
 * used of *cap): a JSON Lines document followed by "\n", a LINES or FILE source's files
 * whole (as `ctitan prep` always read text). Adds the files read to *n_files and the skipped
 * lines to *bad. An empty file is no error here. */
int corpus_slurp(const corpus_src_opts_t *o, uint8_t **buf, size_t *len, size_t *cap, size_t *n_files,
                 uint64_t *bad, char *err, size_t errlen);

/* ---- the weighted mix of token streams ---- */

typedef struct corpus corpus_t;

typedef struct {
    int n;                                   /* sources, 1..CORPUS_MAX_SOURCES */
    corpus_src_opts_t src[CORPUS_MAX_SOURCES];
    double weight[CORPUS_MAX_SOURCES];       /* > 0; normalized */
    tok_t *tok;                              /* borrowed; encodes (so mutates) */
    int bos, eos;                            /* token ids, or -1 for none */
    int seq_len;                             /* T */
    uint64_t seed;                           /* decides the mix */
    uint64_t tok_fingerprint;                /* the tokenizer's identity, folded into the fingerprint */
} corpus_opts_t;

typedef struct {
    uint64_t file, off, skip;
} corpus_pos_t;

/* Opens every source (corpus_reader_open); checks the weights, the ids against the
 * tokenizer. Each source starts at its beginning. */
int corpus_open(corpus_t **out, const corpus_opts_t *o, char *err, size_t errlen);
void corpus_destroy(corpus_t **c);
int corpus_sources(const corpus_t *c);
/* A hash of what positions depend on (the sources' patterns, files, formats, fields, chunk
 * size, BOS, EOS, tok_fingerprint): a position saved under another fingerprint is no good. */
uint64_t corpus_fingerprint(const corpus_t *c);
/* The source sequence k reads. */
int corpus_pick(const corpus_t *c, uint64_t k);
/* Sequence k: T + 1 tokens into out (from source corpus_pick(k), which moves on by T). */
int corpus_next(corpus_t *c, uint64_t k, uint32_t *out, char *err, size_t errlen);
/* Source i's position (the next token it gives); may read ahead. */
int corpus_position(corpus_t *c, int i, corpus_pos_t *p, char *err, size_t errlen);
/* Puts source i at p (from corpus_position of a corpus with the same fingerprint). */
int corpus_seek(corpus_t *c, int i, const corpus_pos_t *p, char *err, size_t errlen);
/* From the beginning, moves every source to where sequence k starts: source i on by T times
 * the number of j < k that picked it (a resume that has only a sample count). */
int corpus_replay(corpus_t *c, uint64_t k, char *err, size_t errlen);
uint64_t corpus_bad_lines(const corpus_t *c);

#endif
