/* A checkpoint's data checked as it streams by (see ckpt_stream.h). */
#include "checkpointd/ckpt_stream.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"

static int fail(ckpt_stream_t *S, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(ckpt_stream_t *S, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    S->corrupt = 1;
    return -EBADMSG;
}

int ckpt_stream_begin(ckpt_stream_t *S, const ckpt_index_t *ix, const char *shown, char *err, size_t errlen)
{
    memset(S, 0, sizeof(*S));
    S->ix = ix, S->shown = shown;
    int chunks = 0;
    for (int t = 0; t < ix->n_tensors; t++)
        chunks += (int)ix->tensors[t].n_chunks;
    if (!(S->spans = malloc((size_t)(chunks ? chunks : 1) * sizeof(ckpt_span_t))) ||
        !(S->hdr_file = calloc((size_t)ix->n_files + 1, sizeof(int))) || !(S->xs = XXH3_createState()))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    for (int f = 0; f < ix->n_files; f++) /* files whose chunks all start past a header's room */
        S->hdr_file[f] = ix->files[f].bytes >= CKPT_DATA_HDR;
    for (int t = 0; t < ix->n_tensors; t++)
        for (uint32_t c = 0; c < ix->tensors[t].n_chunks; c++)
            if (ix->tensors[t].chunks[c].offset < CKPT_DATA_HDR)
                S->hdr_file[ix->tensors[t].chunks[c].file] = 0;
    return 0;
}

void ckpt_stream_add(ckpt_stream_t *S, const ckpt_tensor_t *t, uint32_t c, uint8_t *dst)
{
    const ckpt_chunk_t *ch = &t->chunks[c];
    S->spans[S->n_spans++] = (ckpt_span_t){.file = ch->file, .off = ch->offset, .len = ch->length, .xxh = ch->xxh,
                                           .dst = dst, .tensor = t->name};
}

void ckpt_stream_add_all(ckpt_stream_t *S)
{
    for (int t = 0; t < S->ix->n_tensors; t++)
        for (uint32_t c = 0; c < S->ix->tensors[t].n_chunks; c++)
            ckpt_stream_add(S, &S->ix->tensors[t], c, NULL);
}

static int span_order(const void *a, const void *b)
{
    const ckpt_span_t *x = a, *y = b;
    return x->file != y->file ? (x->file < y->file ? -1 : 1) : x->off < y->off ? -1 : x->off > y->off;
}

int ckpt_stream_ready(ckpt_stream_t *S, char *err, size_t errlen)
{
    qsort(S->spans, (size_t)S->n_spans, sizeof(ckpt_span_t), span_order);
    for (int i = 1; i < S->n_spans; i++) /* no writer of ours overlaps chunks */
        if (S->spans[i].file == S->spans[i - 1].file && S->spans[i].off < S->spans[i - 1].off + S->spans[i - 1].len)
            return fail(S, err, errlen, "checkpoint %s: chunks of %s and %s overlap in %s", S->shown,
                        S->spans[i - 1].tensor, S->spans[i].tensor, S->ix->files[S->spans[i].file].name);
    XXH3_64bits_reset(S->xs);
    return 0;
}

int ckpt_stream_data(ckpt_stream_t *S, uint32_t k, uint64_t off, const void *p, size_t n, char *err,
                     size_t errlen)
{
    const uint8_t *b = p;
    const char *fname = S->ix->files[k].name;
    if (S->hdr_file[k] && off < CKPT_DATA_HDR) {
        size_t h = CKPT_DATA_HDR - off < n ? (size_t)(CKPT_DATA_HDR - off) : n;
        memcpy(S->hdr + off, b, h);
        uint32_t file = 0;
        int64_t step = -1;
        char why[256] = "header of another file or step";
        if (off + h == CKPT_DATA_HDR &&
            (ckpt_data_header_read(S->hdr, CKPT_DATA_HDR, &file, &step, why, sizeof(why)) || file != k ||
             step != S->ix->step))
            return fail(S, err, errlen, "checkpoint %s: data file %s: %s", S->shown, fname, why);
    }
    while (S->next < S->n_spans && S->spans[S->next].file == k) {
        ckpt_span_t *sp = &S->spans[S->next];
        uint64_t lo = sp->off + S->in, hi = sp->off + sp->len < off + n ? sp->off + sp->len : off + n;
        if (lo < off || lo > off + n) /* not yet (a gap no chunk asked for covers), or bytes skipped */
            return lo < off ? fail(S, err, errlen, "checkpoint %s: %s: bytes came out of order", S->shown, fname) : 0;
        if (hi > lo) {
            if (sp->dst)
                memcpy(sp->dst + S->in, b + (lo - off), hi - lo);
            XXH3_64bits_update(S->xs, b + (lo - off), hi - lo);
            S->in += hi - lo;
        }
        if (S->in < sp->len)
            return 0; /* the rest of it comes with the next part */
        if (XXH3_64bits_digest(S->xs) != sp->xxh)
            return fail(S, err, errlen, "checkpoint %s: tensor %s: the chunk at byte %llu of %s: checksum mismatch",
                        S->shown, sp->tensor, (unsigned long long)sp->off, fname);
        S->next++, S->in = 0;
        XXH3_64bits_reset(S->xs);
    }
    return 0;
}

int ckpt_stream_file_done(ckpt_stream_t *S, uint32_t k, char *err, size_t errlen)
{
    if (S->next >= S->n_spans || S->spans[S->next].file != k)
        return 0;
    return fail(S, err, errlen, "checkpoint %s: %s ended before its chunk at byte %llu", S->shown,
                S->ix->files[k].name, (unsigned long long)S->spans[S->next].off);
}

int ckpt_stream_finish(ckpt_stream_t *S, char *err, size_t errlen)
{
    if (S->next == S->n_spans)
        return 0;
    return fail(S, err, errlen, "checkpoint %s: %d of its %d chunks came", S->shown, S->next, S->n_spans);
}

void ckpt_stream_free(ckpt_stream_t *S)
{
    free(S->spans);
    free(S->hdr_file);
    XXH3_freeState(S->xs);
    S->spans = NULL, S->hdr_file = NULL, S->xs = NULL;
}
