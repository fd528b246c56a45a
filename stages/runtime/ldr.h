/* ctitan's loader protocol: the public header for writing a data loader of your own.
 *
 * A loader is any program that links libctitan and does:
 *
 *     ldr_t *l; char err[256];
 *     if (ldr_open(&l, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
 *     const ldr_info_t *in = ldr_info(l);          // shapes, seed, dataset_path, ...
 *     ... restore your position from ldr_cursor(l, &len) (a msgpack map, maybe empty) ...
 *     ldr_batch_t b;
 *     while (ldr_next(l, &b) == 0) {               // blocks while the rings are full
 *         ... write b.tokens and b.targets ([b.seqs, b.seq_len] int32 each, ids < vocab) ...
 *         ldr_commit(l, cursor, cursor_len);       // your position *after* this microbatch
 *     }
 *     ldr_close(&l);                               // ldr_next returned: the job told us to stop
 *
 * and is started by the coordinator: `ctitan launch` with [loader] command = "...", or
 * `ctitan loader swap --job NAME --cmd "..."` while the job runs. The environment it is
 * started with (CTITAN_ENDPOINT, CTITAN_JOB) tells ldr_open where the job is.
 *
 * What the library does for you: the control plane (hello, ready, heartbeats, stop; the
 * coordinator counts the loader as started at its first ldr_next, so fail before that if your
 * own set-up fails: a swap to a loader that cannot start is refused and the old one kept), the
 * data plane: one shared-memory ring of tokens (read by pipeline stage 0) and one of targets
 * (read by the last stage) per data-parallel replica, filled in the order
 *     step, then replica 0..dp-1, then microbatch 0..M-1,
 * with the tensors written straight into ring slots. ldr_next hands out that order from the
 * first step the job still needs.
 *
 * Cursors. The cursor is your loader's position as a msgpack map of at most LDR_CURSOR_MAX
 * bytes; the key "sample" (an unsigned integer below 2^63: sequences produced so far, counted
 * in the order above; checkpointd refuses a checkpoint whose cursor breaks this) is the
 * convention every ctitan loader follows, so loaders can replace each
 * other. The library records the cursor at every step boundary in shared memory (not over
 * the network, so it survives a kill -9). When a loader dies, the coordinator restarts it
 * from the cursor of the first step not fully delivered, and ldr_next quietly points the
 * microbatches the stages already have at scratch memory, so no sample is skipped or
 * repeated, provided your loader produces the same data from the same cursor. A loader
 * swapped in at a step boundary starts from that boundary's cursor.
 *
 * Functions return 0 or -errno and fill err; nothing here exits. */
#ifndef CTITAN_LDR_H
#define CTITAN_LDR_H

#include <stddef.h>
#include <stdint.h>

#include "stages/job/ldr_info.h"

typedef struct ldr ldr_t;

typedef struct {
    int64_t step;
    int replica, microbatch;
    int seqs, seq_len;
    int32_t *tokens;       /* [seqs, seq_len]: write the inputs here */
    int32_t *targets;      /* [seqs, seq_len]: the next token of each input */
} ldr_batch_t;

int ldr_open(ldr_t **out, char *err, size_t errlen);
void ldr_close(ldr_t **l);
const ldr_info_t *ldr_info(const ldr_t *l);
/* The cursor to resume from (len 0: start at the beginning of the data). */
const uint8_t *ldr_cursor(const ldr_t *l, size_t *len);

/* Points b at the next microbatch to fill. Blocks while the rings are full, and once every
 * step is produced, until the job says stop. Returns 0, or -ECANCELED when the loader must
 * exit (stop received, or the job is gone). */
int ldr_next(ldr_t *l, ldr_batch_t *b);
/* Publishes the microbatch from the last ldr_next; `cursor` is the position after it.
 * -EMSGSIZE if the cursor is over LDR_CURSOR_MAX, -EINVAL without a pending ldr_next. */
int ldr_commit(ldr_t *l, const void *cursor, size_t len);
/* Reports a fatal error to the coordinator (it stops the job and prints the reason). */
void ldr_fail(ldr_t *l, const char *reason);

/* Cursor maps of unsigned integers: packs n keys into buf (cap bytes) and returns the
 * length (0 if it does not fit); reads one key back: 0, -ENOENT when absent (an empty
 * cursor has no keys), -EINVAL when the cursor is not such a map. */
size_t ldr_cursor_pack(uint8_t *buf, size_t cap, int n, const char *const *keys, const uint64_t *vals);
int ldr_cursor_get(const uint8_t *cursor, size_t len, const char *key, uint64_t *val);

/* A seeded permutation of [0, n) per epoch, without a table (a keyed Feistel network with
 * cycle walking): the window sequence i of that epoch reads. Loaders that shuffle use it so
 * that they can replace each other. */
uint64_t ldr_shuffle(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t i);

#endif
