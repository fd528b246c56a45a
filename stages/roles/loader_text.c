/* ctitan-loader-text: an example loader of another kind, written only against the public
 * loader header (stages/runtime/ldr.h): it reads raw UTF-8 text and tokenizes it on the fly with a
 * `ctitan prep` tokenizer, a chunk of lines at a time, instead of reading token shards.
 *
 *   ctitan-loader-text --text FILE --tokenizer tokenizer.bin [--chunk-bytes N (65536)]
 *
 * The token stream is the concatenation of the chunks' tokens, the file read again from the
 * start at its end; sequence k reads tokens [k*T, k*T + T] of it. Its cursor is
 * {"sample": k, "byte": B, "skip": S}: the next sequence starts S tokens into the chunk that
 * begins at byte B. Given only {"sample": k} (from a loader of another kind) it tokenizes
 * from the start of the file up to token k*T. Sequential only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stages/runtime/ldr.h"
#include "stages/data/tokenizer.h"
#include "ipc/util.h"

typedef struct {
    const uint8_t *text;
    size_t size, chunk_bytes;
    tok_t *tok;
    size_t next_byte;      /* where the next chunk to tokenize starts */
    uint32_t *q;           /* queued tokens */
    size_t *q_byte;        /* per queued token: byte offset of its chunk */
    size_t *q_skip;        /* per queued token: its index within that chunk */
    size_t q_len, q_cap, q_head;
    uint32_t *enc;         /* scratch for one chunk's tokens */
} text_src_t;

/* Tokenizes the next chunk into the queue: whole lines from chunk_bytes on, cut at
 * 2 * chunk_bytes when a line is longer. */
static int refill(text_src_t *s)
{
    size_t b = s->next_byte, e = b + s->chunk_bytes, cap = b + 2 * s->chunk_bytes;
    cap = cap < s->size ? cap : s->size;
    if (e >= cap) {
        e = cap;
    } else {
        const uint8_t *nl = memchr(s->text + e, '\n', cap - e);
        e = nl ? (size_t)(nl - s->text) + 1 : cap;
    }
    size_t n;
    int rc = tok_encode(s->tok, s->text + b, e - b, s->enc, &n);
    if (rc)
        return rc;
    if (s->q_head > 0) { /* drop what was handed out */
        memmove(s->q, s->q + s->q_head, (s->q_len - s->q_head) * sizeof(*s->q));
        memmove(s->q_byte, s->q_byte + s->q_head, (s->q_len - s->q_head) * sizeof(*s->q_byte));
        memmove(s->q_skip, s->q_skip + s->q_head, (s->q_len - s->q_head) * sizeof(*s->q_skip));
        s->q_len -= s->q_head;
        s->q_head = 0;
    }
    if (s->q_len + n > s->q_cap)
        return -ENOMEM; /* cannot happen: need() refills only below a window's worth */
    for (size_t i = 0; i < n; i++) {
        s->q[s->q_len] = s->enc[i];
        s->q_byte[s->q_len] = b;
        s->q_skip[s->q_len++] = i;
    }
    s->next_byte = e < s->size ? e : 0;
    return 0;
}

/* Makes at least `want` tokens available from q_head. */
static int need(text_src_t *s, size_t want)
{
    while (s->q_len - s->q_head < want) {
        int rc = refill(s);
        if (rc)
            return rc;
    }
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: ctitan-loader-text --text FILE --tokenizer tokenizer.bin [--chunk-bytes N]\n"
                    "(started by `ctitan launch` or `ctitan loader swap`)\n");
    return 2;
}

/* Reports why to the coordinator (ldr_fail) and returns -1. */
static int fail(ldr_t *l, const char *why)
{
    ldr_fail(l, why);
    return -1;
}

/* The tokenizer, the text file (mapped) and the queues; 0, or -1 after ldr_fail. */
static int src_open(text_src_t *s, ldr_t *l, const char *text_path, const char *tok_path, int *fd)
{
    const ldr_info_t *in = ldr_info(l);
    char err[1024];
    if (in->shuffle)
        return fail(l, "ctitan-loader-text reads sequentially: set loader.shuffle = false");
    if (tok_load(&s->tok, tok_path, err, sizeof(err)))
        return fail(l, err);
    if (tok_vocab_size(s->tok) > in->vocab_size) {
        snprintf(err, sizeof(err), "%s has %d tokens but the model's vocab_size is %d", tok_path,
                 tok_vocab_size(s->tok), in->vocab_size);
        return fail(l, err);
    }
    if ((*fd = util_open_regular(text_path, &s->size, err, sizeof(err))) < 0 || s->size == 0)
        return fail(l, *fd < 0 ? err : "the text file is empty");
    s->text = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, *fd, 0);
    /* a chunk encodes to at most its bytes in tokens; the queue holds less than a window
     * when it is refilled */
    size_t max_chunk = 2 * s->chunk_bytes, T = (size_t)in->seq_len;
    s->q_cap = max_chunk + T + 1;
    s->q = malloc(s->q_cap * sizeof(*s->q));
    s->q_byte = malloc(s->q_cap * sizeof(*s->q_byte));
    s->q_skip = malloc(s->q_cap * sizeof(*s->q_skip));
    s->enc = malloc(max_chunk * sizeof(*s->enc));
    if (s->text == MAP_FAILED || !s->q || !s->q_byte || !s->q_skip || !s->enc)
        return fail(l, "out of memory");
    return 0;
}

/* Where to start: the cursor's chunk and offset, or token k*T from the top; *k gets the
 * cursor's sample. 0, or -1 after ldr_fail. */
static int src_seek(text_src_t *s, ldr_t *l, uint64_t *k)
{
    size_t clen, T = (size_t)ldr_info(l)->seq_len;
    const uint8_t *cur = ldr_cursor(l, &clen);
    uint64_t byte = 0, skip = 0;
    *k = 0;
    int rc = clen ? ldr_cursor_get(cur, clen, "sample", k) : 0;
    if (rc)
        return fail(l, rc == -ENOENT ? "the resume cursor has no \"sample\" key"
                                     : "the resume cursor's \"sample\" is not an unsigned integer (stages/runtime/ldr.h)");
    int exact = clen && !ldr_cursor_get(cur, clen, "byte", &byte) && !ldr_cursor_get(cur, clen, "skip", &skip);
    if (!exact && *k > UINT64_MAX / T)
        return fail(l, "the resume cursor's \"sample\" is past any text file's end");
    if (!exact)
        skip = *k * T;
    if (byte >= s->size)
        return fail(l, "the resume cursor points past the end of the text file");
    s->next_byte = byte;
    for (uint64_t left = skip; left > 0;) { /* drop the tokens before the start */
        if (need(s, 1))
            return fail(l, "out of memory");
        size_t have = s->q_len - s->q_head, take = left < have ? left : have;
        s->q_head += take;
        left -= take;
    }
    return 0;
}

/* Fills batches until the loader library says stop; k is the next sample. 0, or -1 after
 * ldr_fail. */
static int serve(text_src_t *s, ldr_t *l, uint64_t k)
{
    size_t T = (size_t)ldr_info(l)->seq_len;
    ldr_batch_t b;
    while (ldr_next(l, &b) == 0) {
        for (int q = 0; q < b.seqs; q++, k++) {
            if (need(s, T + 1))
                return fail(l, "out of memory");
            for (size_t t = 0; t < T; t++) {
                b.tokens[q * T + t] = (int32_t)s->q[s->q_head + t];
                b.targets[q * T + t] = (int32_t)s->q[s->q_head + t + 1];
            }
            s->q_head += T;
        }
        if (need(s, 1))
            return fail(l, "out of memory");
        const char *keys[] = {"sample", "byte", "skip"};
        uint64_t vals[] = {k, s->q_byte[s->q_head], s->q_skip[s->q_head]};
        uint8_t next[64];
        ldr_commit(l, next, ldr_cursor_pack(next, sizeof(next), 3, keys, vals));
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *text_path = NULL, *tok_path = NULL;
    size_t chunk = 65536;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--text")) text_path = argv[i + 1];
        else if (!strcmp(argv[i], "--tokenizer")) tok_path = argv[i + 1];
        else if (!strcmp(argv[i], "--chunk-bytes")) chunk = strtoull(argv[i + 1], NULL, 10);
        else return usage();
    }
    if (!text_path || !tok_path || chunk < 64)
        return usage();
    ldr_t *l = NULL;
    char err[1024];
    if (ldr_open(&l, err, sizeof(err))) {
        fprintf(stderr, "ctitan-loader-text: %s\n", err);
        return 1;
    }
    text_src_t s = {.chunk_bytes = chunk};
    int fd = -1;
    uint64_t k;
    int rc = src_open(&s, l, text_path, tok_path, &fd) || src_seek(&s, l, &k) || serve(&s, l, k) ? 1 : 0;
    if (s.text && s.text != MAP_FAILED)
        munmap((void *)s.text, s.size);
    if (fd >= 0)
        close(fd);
    free(s.q), free(s.q_byte), free(s.q_skip), free(s.enc);
    tok_destroy(&s.tok);
    ldr_close(&l);
    return rc;
}
