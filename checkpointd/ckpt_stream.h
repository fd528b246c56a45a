/* A checkpoint's data files checked as their bytes stream by, in order, once each (a fetch
 * from a storage host: checkpointd/remote.h rmt_sink_t): each data file's header, and the
 * checksum of every chunk asked for, each chunk's bytes copied where the caller says as they
 * pass. The same checks as reading the files afterwards (ckpt_verify, ckpt_read), without
 * reading them: checkpointd's LOAD from a storage host checks the chunks it loads into the
 * staging segment (restore.c), `ctitan ckpt fetch` every chunk of the copy it writes
 * (remote_fetch.c's directory sink). */
#ifndef CTITAN_CKPT_STREAM_H
#define CTITAN_CKPT_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "checkpointd/ckpt.h"

/* A chunk asked for, and where its bytes go (NULL: only checked). */
typedef struct {
    uint32_t file;
    uint64_t off, len, xxh;
    uint8_t *dst;
    const char *tensor;
} ckpt_span_t;

typedef struct {
    const ckpt_index_t *ix;
    const char *shown;   /* the checkpoint in messages: "step N of job J on the storage host at EP" */
    ckpt_span_t *spans;  /* by file, then offset, once ckpt_stream_ready */
    int n_spans, next;   /* the span being filled next */
    uint64_t in;         /* its bytes so far */
    XXH3_state_t *xs;
    int *hdr_file;       /* per data file: its first CKPT_DATA_HDR bytes are a header */
    uint8_t hdr[CKPT_DATA_HDR];
    int corrupt;         /* a header, a checksum or the chunks' layout was wrong */
} ckpt_stream_t;

/* Ready to be given the chunks asked for (ckpt_stream_add) of a decoded index (kept by the
 * caller while the stream lasts). 0 or -ENOMEM with err. */
int ckpt_stream_begin(ckpt_stream_t *S, const ckpt_index_t *ix, const char *shown, char *err, size_t errlen);
/* Chunk c of tensor t of the index asked for, its bytes copied to dst (NULL: only checked). */
void ckpt_stream_add(ckpt_stream_t *S, const ckpt_tensor_t *t, uint32_t c, uint8_t *dst);
/* Every chunk of every tensor of the index asked for, only checked. */
void ckpt_stream_add_all(ckpt_stream_t *S);
/* The chunks asked for put in file order; -EBADMSG (corrupt) when two overlap. */
int ckpt_stream_ready(ckpt_stream_t *S, char *err, size_t errlen);
/* Bytes [off, off + n) of data file k, the files and their bytes in order: the header checked,
 * the chunks asked for copied and their checksums checked as each ends. 0 or -EBADMSG
 * (corrupt) with err. */
int ckpt_stream_data(ckpt_stream_t *S, uint32_t k, uint64_t off, const void *p, size_t n, char *err,
                     size_t errlen);
/* Data file k ended: every chunk asked for in it came whole. 0 or -EBADMSG (corrupt). */
int ckpt_stream_file_done(ckpt_stream_t *S, uint32_t k, char *err, size_t errlen);
/* The stream ended: every chunk asked for came. 0 or -EBADMSG (corrupt). */
int ckpt_stream_finish(ckpt_stream_t *S, char *err, size_t errlen);
void ckpt_stream_free(ckpt_stream_t *S);

#endif
