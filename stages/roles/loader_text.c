/* ctitan-loader-text: trains on text as people keep it, written only against the public loader
 * header (stages/runtime/ldr.h): plain text and JSON Lines, gzip-compressed or not, files or
 * globs, several sources mixed by weight, tokenized on the fly (stages/data/corpus.h).
 *
 *   ctitan-loader-text --tokenizer TOK (--source GLOB [--weight W] [--field NAME]
 *                      [--format lines|file|jsonl])... [--text FILE] [--chunk-bytes N]
 *                      [--on-bad-line skip|error] [--bos ID|none] [--eos ID|none]
 *
 * --weight, --field and --format apply to the --source before them; --text FILE is
 * `--source FILE --format file` (the whole file one document). Sequence k comes from the
 * source corpus_pick(k) chooses, by weight, from the seed and k. Its cursor is {"sample": k,
 * "h": the corpus's fingerprint, and per source i "fI", "oI", "sI": the next token is sI tokens
 * into the unit starting at offset oI of file fI}. A cursor without them (a loader of another
 * kind) or of another corpus resumes from "sample" alone, replaying the mix from the start.
 * Sequential only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "stages/runtime/ldr.h"
#include "stages/data/corpus.h"
#include "ipc/util.h"

#define CURSOR_KEYS (2 + 3 * CORPUS_MAX_SOURCES)

typedef struct {
    corpus_opts_t co;
    const char *tok_path;
    size_t chunk;
    int on_bad;
    int bos_set, eos_set; /* given by flag (value in co.bos / co.eos, -1 for none) */
} args_t;

static int usage(const char *why)
{
    if (why)
        fprintf(stderr, "ctitan-loader-text: %s\n", why);
    fprintf(stderr,
            "usage: ctitan-loader-text --tokenizer TOK (--source GLOB [--weight W] [--field NAME]\n"
            "         [--format lines|file|jsonl])... [--text FILE] [--chunk-bytes N]\n"
            "         [--on-bad-line skip|error] [--bos ID|none] [--eos ID|none]\n"
            "(started by `ctitan launch` or `ctitan loader swap`)\n");
    return 2;
}

static int parse_id(const char *v, int *out)
{
    char *end;
    if (!strcmp(v, "none")) {
        *out = -1;
        return 0;
    }
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 0 || x > TOK_MAX_VOCAB)
        return -1;
    *out = (int)x;
    return 0;
}

/* One option that applies to the last --source; 0, or a usage message in why. */
static int source_opt(args_t *a, const char *opt, const char *v, const char **why)
{
    if (a->co.n == 0)
        return *why = "--weight, --field and --format follow the --source they apply to", -1;
    corpus_src_opts_t *s = &a->co.src[a->co.n - 1];
    char *end;
    if (!strcmp(opt, "--weight")) {
        errno = 0;
        a->co.weight[a->co.n - 1] = strtod(v, &end);
        if (errno || end == v || *end || !(a->co.weight[a->co.n - 1] > 0))
            return *why = "--weight: expected a positive number", -1;
    } else if (!strcmp(opt, "--field")) {
        if (!*v)
            return *why = "--field: empty field name", -1;
        s->field = v;
    } else if (!strcmp(v, "lines") || !strcmp(v, "file") || !strcmp(v, "jsonl")) {
        s->format = !strcmp(v, "lines") ? CORPUS_LINES : !strcmp(v, "file") ? CORPUS_FILE : CORPUS_JSONL;
    } else {
        return *why = "--format: expected lines, file or jsonl", -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, args_t *a, const char **why)
{
    *a = (args_t){.chunk = CORPUS_DEFAULT_CHUNK, .co = {.bos = -1, .eos = -1}};
    for (int i = 1; i < argc; i += 2) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return *why = "an option without its value", -1;
        if (!strcmp(o, "--source") || !strcmp(o, "--text")) {
            if (a->co.n == CORPUS_MAX_SOURCES)
                return *why = "too many sources (the cursor holds 8)", -1;
            a->co.src[a->co.n] = (corpus_src_opts_t){.pattern = v, .format = o[2] == 't' ? CORPUS_FILE : CORPUS_AUTO};
            a->co.weight[a->co.n++] = 1.0;
        } else if (!strcmp(o, "--weight") || !strcmp(o, "--field") || !strcmp(o, "--format")) {
            if (source_opt(a, o, v, why))
                return -1;
        } else if (!strcmp(o, "--tokenizer")) {
            a->tok_path = v;
        } else if (!strcmp(o, "--chunk-bytes")) {
            char *end;
            a->chunk = strtoull(v, &end, 10);
            if (*end || a->chunk < CORPUS_MIN_CHUNK || a->chunk > ((size_t)64 << 20))
                return *why = "--chunk-bytes: expected an integer from 64 to 64 MiB", -1;
        } else if (!strcmp(o, "--on-bad-line")) {
            if (strcmp(v, "skip") && strcmp(v, "error"))
                return *why = "--on-bad-line: expected skip or error", -1;
            a->on_bad = !strcmp(v, "error") ? CORPUS_BAD_ERROR : CORPUS_BAD_SKIP;
        } else if (!strcmp(o, "--bos") || !strcmp(o, "--eos")) {
            if (parse_id(v, o[2] == 'b' ? &a->co.bos : &a->co.eos))
                return *why = "--bos/--eos: expected a token id or none", -1;
            *(o[2] == 'b' ? &a->bos_set : &a->eos_set) = 1;
        } else {
            static char unknown[256];
            snprintf(unknown, sizeof(unknown), "unknown option '%.200s'", o);
            return *why = unknown, -1;
        }
    }
    if (!a->tok_path || a->co.n == 0)
        return *why = "--tokenizer and at least one --source (or --text) are needed", -1;
    for (int i = 0; i < a->co.n; i++) {
        a->co.src[i].chunk_bytes = a->chunk;
        a->co.src[i].on_bad_line = a->on_bad;
        a->co.src[i].log = stderr;
    }
    return 0;
}

/* Reports why to the coordinator (ldr_fail) and returns -1. */
static int fail(ldr_t *l, const char *why)
{
    ldr_fail(l, why);
    return -1;
}

/* XXH64 of the tokenizer file: part of the corpus fingerprint. */
static uint64_t file_hash(const char *path)
{
    size_t size;
    char err[256];
    int fd = util_open_regular(path, &size, err, sizeof(err));
    if (fd < 0)
        return 0;
    void *buf = malloc(size ? size : 1);
    long r = buf ? util_read_all(fd, buf, size, 0) : -1;
    uint64_t h = r == (long)size ? XXH64(buf, size, 0) : 0;
    free(buf);
    close(fd);
    return h;
}

/* The tokenizer and the corpus; 0, or -1 after ldr_fail. */
static int open_corpus(args_t *a, ldr_t *l, tok_t **tok, corpus_t **c)
{
    const ldr_info_t *in = ldr_info(l);
    char err[1024];
    if (in->shuffle)
        return fail(l, "ctitan-loader-text reads sequentially: set loader.shuffle = false");
    if (tok_load(tok, a->tok_path, err, sizeof(err)))
        return fail(l, err);
    if (tok_vocab_size(*tok) > in->vocab_size) {
        snprintf(err, sizeof(err), "%s has %d tokens but the model's vocab_size is %d", a->tok_path,
                 tok_vocab_size(*tok), in->vocab_size);
        return fail(l, err);
    }
    a->co.tok = *tok;
    if (!a->bos_set)
        a->co.bos = tok_bos(*tok);
    if (!a->eos_set)
        a->co.eos = tok_eos(*tok);
    a->co.seq_len = in->seq_len;
    a->co.seed = in->seed;
    a->co.tok_fingerprint = file_hash(a->tok_path);
    if (corpus_open(c, &a->co, err, sizeof(err)))
        return fail(l, err);
    return 0;
}

static void cursor_key(char keys[][8], int i, char what)
{
    snprintf(keys[2 + 3 * i + (what == 'f' ? 0 : what == 'o' ? 1 : 2)], 8, "%c%c", what, (char)('0' + i));
}

/* Where to start: every source where the cursor puts it, or (a cursor of another loader or
 * corpus) replayed from sample k; *k gets the cursor's sample. 0, or -1 after ldr_fail. */
static int seek_cursor(corpus_t *c, ldr_t *l, uint64_t *k)
{
    size_t clen;
    const uint8_t *cur = ldr_cursor(l, &clen);
    char err[1024];
    *k = 0;
    int rc = clen ? ldr_cursor_get(cur, clen, "sample", k) : 0;
    if (rc)
        return fail(l, rc == -ENOENT ? "the resume cursor has no \"sample\" key"
                                     : "the resume cursor's \"sample\" is not an unsigned integer (stages/runtime/ldr.h)");
    uint64_t h = 0;
    int n = corpus_sources(c), exact = clen && !ldr_cursor_get(cur, clen, "h", &h) &&
                                       h == (corpus_fingerprint(c) & 0xffffffffu);
    corpus_pos_t pos[CORPUS_MAX_SOURCES];
    char keys[CURSOR_KEYS][8];
    for (int i = 0; exact && i < n; i++) {
        cursor_key(keys, i, 'f'), cursor_key(keys, i, 'o'), cursor_key(keys, i, 's');
        exact = !ldr_cursor_get(cur, clen, keys[2 + 3 * i], &pos[i].file) &&
                !ldr_cursor_get(cur, clen, keys[3 + 3 * i], &pos[i].off) &&
                !ldr_cursor_get(cur, clen, keys[4 + 3 * i], &pos[i].skip);
    }
    if (clen && !exact)
        fprintf(stderr, "ctitan-loader-text: the cursor is not this corpus's: replaying the mix to sample %llu\n",
                (unsigned long long)*k);
    for (int i = 0; exact && i < n; i++)
        if (corpus_seek(c, i, &pos[i], err, sizeof(err)))
            return fail(l, err);
    if (!exact && corpus_replay(c, *k, err, sizeof(err)))
        return fail(l, err);
    for (int i = 0; i < n; i++) { /* every source has a document: fail before the first ldr_next */
        corpus_pos_t p;
        if (corpus_position(c, i, &p, err, sizeof(err)))
            return fail(l, err);
    }
    return 0;
}

/* The cursor after sample k into buf; its length, 0 after ldr_fail. */
static size_t make_cursor(corpus_t *c, ldr_t *l, uint64_t k, uint8_t *buf, size_t cap)
{
    char keys[CURSOR_KEYS][8], err[1024];
    const char *kp[CURSOR_KEYS];
    uint64_t vals[CURSOR_KEYS] = {k, corpus_fingerprint(c) & 0xffffffffu};
    int n = corpus_sources(c);
    snprintf(keys[0], 8, "sample"), snprintf(keys[1], 8, "h");
    for (int i = 0; i < n; i++) {
        corpus_pos_t p;
        if (corpus_position(c, i, &p, err, sizeof(err)))
            return fail(l, err), 0;
        cursor_key(keys, i, 'f'), cursor_key(keys, i, 'o'), cursor_key(keys, i, 's');
        vals[2 + 3 * i] = p.file, vals[3 + 3 * i] = p.off, vals[4 + 3 * i] = p.skip;
    }
    for (int i = 0; i < 2 + 3 * n; i++)
        kp[i] = keys[i];
    size_t len = ldr_cursor_pack(buf, cap, 2 + 3 * n, kp, vals);
    if (!len)
        fail(l, "the cursor of this many sources is over LDR_CURSOR_MAX (240 bytes): use fewer sources");
    return len;
}

/* Fills batches until the loader library says stop; k is the next sample. 0, or -1 after
 * ldr_fail. */
static int serve(corpus_t *c, ldr_t *l, uint64_t k)
{
    size_t T = (size_t)ldr_info(l)->seq_len;
    uint32_t *seq = malloc((T + 1) * sizeof(*seq));
    char err[1024];
    ldr_batch_t b;
    if (!seq)
        return fail(l, "out of memory");
    int rc = 0;
    while (!rc && ldr_next(l, &b) == 0) {
        for (int q = 0; !rc && q < b.seqs; q++, k++) {
            if ((rc = corpus_next(c, k, seq, err, sizeof(err)) ? fail(l, err) : 0))
                break;
            for (size_t t = 0; t < T; t++) {
                b.tokens[q * T + t] = (int32_t)seq[t];
                b.targets[q * T + t] = (int32_t)seq[t + 1];
            }
        }
        uint8_t next[LDR_CURSOR_MAX];
        size_t len = rc ? 0 : make_cursor(c, l, k, next, sizeof(next));
        if (!len || ldr_commit(l, next, len))
            rc = rc ? rc : len ? fail(l, "the cursor was refused") : -1;
    }
    free(seq);
    return rc;
}

int main(int argc, char **argv)
{
    args_t a;
    const char *why;
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
        return usage(NULL) - 2;
    if (parse_args(argc, argv, &a, &why))
        return usage(why);
    ldr_t *l = NULL;
    char err[1024];
    if (ldr_open(&l, err, sizeof(err))) {
        fprintf(stderr, "ctitan-loader-text: %s\n", err);
        return 1;
    }
    tok_t *tok = NULL;
    corpus_t *c = NULL;
    uint64_t k;
    int rc = open_corpus(&a, l, &tok, &c) || seek_cursor(c, l, &k) || serve(c, l, k) ? 1 : 0;
    if (c && corpus_bad_lines(c))
        fprintf(stderr, "ctitan-loader-text: %llu bad JSON Lines line(s) skipped\n",
                (unsigned long long)corpus_bad_lines(c));
    corpus_destroy(&c);
    tok_destroy(&tok);
    ldr_close(&l);
    return rc;
}
