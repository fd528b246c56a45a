/* libFuzzer harness: the text corpus reader (stages/data/corpus.h) on a file of any bytes,
 * gzip-compressed or not. The first byte picks the format (bits 0-1: lines, file, JSON Lines),
 * bit 2 --on-bad-line error, bit 3 the token streams instead of the units; the rest is the file.
 * Units: every unit of the first pass must lie in order inside the uncompressed stream, and
 * seeking to a unit's start must give that unit again. Token streams (a small tokenizer, BOS and
 * EOS, pieces of 64-byte chunks): from the position before any sequence, the same sequences. */
#include <errno.h>
#include <string.h>
#include <xxhash.h>

#include "stages/data/corpus.h"
#include "tests/fuzz/fuzz.h"

#define KEEP 64

typedef struct {
    uint32_t file;
    uint64_t off, hash;
    size_t len;
    int start, end;
} seen_t;

#define SEQS 40
#define T 8

/* The token streams of one source: positions before each sequence resume exactly. */
static void streams(const corpus_src_opts_t *so)
{
    static tok_t *tok;
    char err[512];
    if (!tok) {
        const char *text = "the quick brown fox jumps over the lazy dog; {\"text\": \"\u00e9\"}\n 0123456789 ";
        FUZZ_CHECK(tok_train(&tok, (const uint8_t *)text, strlen(text), 280, err, sizeof(err)) == 0, "%s", err);
    }
    corpus_opts_t o = {.n = 1, .src = {*so}, .weight = {1}, .tok = tok, .bos = 1, .eos = 2, .seq_len = T, .seed = 5};
    corpus_t *c, *d;
    if (corpus_open(&c, &o, err, sizeof(err)))
        return;
    static uint32_t seq[SEQS][T + 1];
    static corpus_pos_t pos[SEQS];
    int n = 0;
    while (n < SEQS && !corpus_position(c, 0, &pos[n], err, sizeof(err)) &&
           !corpus_next(c, (uint64_t)n, seq[n], err, sizeof(err)))
        n++;
    for (int k = 0; k < n; k += 3) {
        FUZZ_CHECK(corpus_open(&d, &o, err, sizeof(err)) == 0, "%s", err);
        FUZZ_CHECK(corpus_seek(d, 0, &pos[k], err, sizeof(err)) == 0, "seek before sequence %d: %s", k, err);
        uint32_t got[T + 1];
        for (int j = k; j < n && j < k + 4; j++) {
            FUZZ_CHECK(corpus_next(d, (uint64_t)j, got, err, sizeof(err)) == 0, "sequence %d: %s", j, err);
            FUZZ_CHECK(!memcmp(got, seq[j], sizeof(got)), "sequence %d differs after a seek before %d", j, k);
        }
        corpus_destroy(&d);
    }
    corpus_destroy(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *path = fuzz_file(data + 1, size - 1);
    if (!path)
        return 0;
    int fmt[] = {CORPUS_LINES, CORPUS_FILE, CORPUS_JSONL, CORPUS_JSONL};
    corpus_src_opts_t o = {.pattern = path, .format = fmt[data[0] & 3], .chunk_bytes = 64,
                           .on_bad_line = data[0] & 4 ? CORPUS_BAD_ERROR : CORPUS_BAD_SKIP};
    if (data[0] & 8) {
        streams(&o);
        return 0;
    }
    corpus_reader_t *r;
    char err[512];
    if (corpus_reader_open(&r, &o, err, sizeof(err)))
        return 0;
    static seen_t seen[KEEP];
    int n = 0, rc;
    uint64_t end = 0;
    corpus_unit_t u;
    while (n < 100000 && !(rc = corpus_reader_next(r, &u, err, sizeof(err))) && corpus_reader_epoch(r) == 0) {
        FUZZ_CHECK(u.file == 0 && u.off >= end && u.len > 0, "unit %d at %llu after %llu", n,
                   (unsigned long long)u.off, (unsigned long long)end);
        if (o.format != CORPUS_JSONL)
            end = u.off + u.len;
        else
            end = u.off + 1;
        if (n < KEEP)
            seen[n] = (seen_t){u.file, u.off, XXH64(u.text, u.len, 0), u.len, u.doc_start, u.doc_end};
        n++;
    }
    FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENODATA || rc == -ENOMEM, "error %d: %s", rc, err);
    for (int i = 0; rc == 0 && i < n && i < KEEP; i += 1 + i / 4) {
        FUZZ_CHECK(corpus_reader_seek(r, seen[i].file, seen[i].off, err, sizeof(err)) == 0, "seek to unit %d: %s", i,
                   err);
        FUZZ_CHECK(corpus_reader_next(r, &u, err, sizeof(err)) == 0, "unit %d after a seek: %s", i, err);
        FUZZ_CHECK(u.off == seen[i].off && u.len == seen[i].len && XXH64(u.text, u.len, 0) == seen[i].hash &&
                       u.doc_start == seen[i].start && u.doc_end == seen[i].end,
                   "unit %d differs after a seek to %llu", i, (unsigned long long)seen[i].off);
    }
    corpus_reader_destroy(&r);
    return 0;
}
