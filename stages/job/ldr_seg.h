/* The loader's shared segment (ctitan.<job>.batch), coordinator and stage side. The loader
 * side is stages/runtime/ldr.h. Layout, all in one segment:
 *
 *   header (4 KiB)      ldr_seg_hdr_t: shapes, resume point, ring geometry
 *   cursor table        LDR_SEG_CURSORS entries: the cursor at the start of step s lives in
 *                       entry s % LDR_SEG_CURSORS, tagged with s (seqlock: step -1 while written)
 *   rings               2 per replica: 2r = tokens (read by stage 0), 2r+1 = targets (last
 *                       stage); slot j of a ring holds step base + j / M, microbatch j % M,
 *                       tagged (step, microbatch) */
#ifndef CTITAN_LDR_SEG_H
#define CTITAN_LDR_SEG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc/ring.h"
#include "ipc/shm.h"
#include "stages/job/ldr_info.h"
#include "stages/job/manifest.h"

#define LDR_SEG_NAME "batch"
#define LDR_SEG_MAGIC 0x3148544142544321ULL /* "!CTBATH1" (bytes in memory order) */
#define LDR_SEG_VERSION 2u
#define LDR_SEG_CURSORS 64

typedef struct {
    _Atomic int64_t step; /* -1 while being written */
    uint32_t len;
    uint8_t data[LDR_CURSOR_MAX];
} ldr_cursor_entry_t;

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t dp, microbatches, seqs, seq_len, vocab_size, shuffle, nslots;
    uint64_t seed;
    int64_t steps;
    int64_t resume_step;            /* where a (re)started loader begins */
    uint32_t resume_len;
    uint8_t resume_cursor[LDR_CURSOR_MAX];
    uint64_t cursors_off, rings_off, ring_bytes;
    char dataset_path[512];
    uint32_t replica0, replicas;    /* the replicas whose rings this host's loader fills */
} ldr_seg_hdr_t;

/* Size of the segment for these shapes (nslots = [loader] prefetch); of one ring slot. */
size_t ldr_seg_bytes(int dp, int nslots, int seqs, int seq_len);
size_t ldr_seg_slot_bytes(int seqs, int seq_len);
/* 0 when mem holds a loader segment of this version; -EINVAL or -EPROTO with err. */
int ldr_seg_check(const void *mem, char *err, size_t errlen);
/* Formats a fresh segment: empty rings starting at first_step, resume point first_step with
 * the given cursor (may be empty). */
int ldr_seg_format(void *mem, size_t bytes, const ldr_info_t *info, int nslots,
                   const uint8_t *cursor, size_t cursor_len);
/* Creates ctitan.<job>.batch for the manifest's shapes ([loader] prefetch slots per ring) and
 * formats it: this host's replicas (job.hosts, job.host_rank), rings starting at first_step,
 * whose cursor is `cursor` (len 0: the start of the data). Returns 0 or -errno with err. The
 * caller owns *out. */
int ldr_seg_create(shm_seg_t **out, const char *job, const manifest_t *m, int64_t first_step,
                   const uint8_t *cursor, size_t cursor_len, char *err, size_t errlen);
/* Ring i (0 .. 2*dp-1) of a formatted segment, attached. */
int ldr_seg_ring(void *mem, int i, ring_t **out, char *err, size_t errlen);

/* Cursor at the start of `step` from the table; -ENOENT if not (or no longer) recorded. */
int ldr_seg_cursor(void *mem, int64_t step, uint8_t *buf, size_t *len);
/* Records the cursor at the start of `step` (the loader library does this). */
void ldr_seg_put_cursor(void *mem, int64_t step, const void *cursor, size_t len);

/* After a loader died: the first step not fully delivered into every ring; its cursor
 * becomes the resume point. Returns 0 or -ENOENT if that cursor is missing. */
int ldr_seg_prepare_restart(void *mem, int64_t *resume_step);
/* At a step boundary with the loader stopped and the stages idle: empties the rings and
 * makes `step` the resume point (with its recorded cursor). */
int ldr_seg_prepare_swap(void *mem, int64_t step);

#endif
