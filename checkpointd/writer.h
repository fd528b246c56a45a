/* Writes one checkpoint directory durably and atomically (checkpointd's write path, local
 * and remote alike): data files are streamed through io_uring (checkpointd/uring.h: a few
 * registered 4 KiB-aligned buffers, O_DIRECT where the filesystem takes it), then
 *
 *   fsync every data file -> write + fsync the index -> fsync the temporary directory ->
 *   rename DIR/.tmp-step-N.PID to DIR/step-N -> fsync DIR.
 *
 * A crash anywhere before the rename leaves only a temporary directory, which no reader
 * takes for a checkpoint and ckpt_retain removes; after it, the complete checkpoint. An
 * existing DIR/step-N (a run resumed from an earlier step) is replaced by an atomic exchange.
 *
 * The index given to ckw_begin is the plan: files (name, size) and chunks. The writer takes
 * each chunk's XXH3 checksum from the bytes as they go by: a plan without checksums (all 0)
 * gets them filled in; a plan with them has them checked, and a chunk that does not match
 * fails its ckw_write with -EBADMSG. Chunks of one file must not overlap.
 * The caller then hands over every file's bytes in order with ckw_write, the whole file:
 * for the data files of ckpt_index_plan that is the 4 KiB header block (ckpt_data_header) at
 * offset 0, then the payload from CKPT_DATA_HDR on. The sizes are checked at commit.
 * A process may write several checkpoints at once, from one thread (the writer keeps one set
 * of buffers for the next checkpoint in a static). Functions return 0 or -errno with the reason in err. */
#ifndef CTITAN_WRITER_H
#define CTITAN_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "checkpointd/ckpt.h"

typedef struct ckw ckw_t;

typedef struct {
    int direct;           /* O_DIRECT was used for every data file */
    int fixed;            /* registered buffers were used */
    uint64_t bytes;       /* data bytes written */
    double secs;          /* ckw_begin to the end of ckw_commit */
} ckw_stats_t;

/* Whether checkpoints can be written under DIR: creates it as needed, then a temporary
 * directory in it with a file inside, and removes both (checkpointd does this as it starts,
 * so that a folder nobody can write is an error before training, not a failed checkpoint
 * after it). Returns 0 or -errno with "DIR: ..." in err. */
int ckw_check_dir(const char *dir, char *err, size_t errlen);
/* Starts DIR/.tmp-step-N.PID (creating DIR as needed). The plan is copied. */
int ckw_begin(ckw_t **out, const char *dir, const ckpt_index_t *plan, char *err, size_t errlen);
/* Appends n bytes to data file `file` at `offset`: files in plan order, each from offset 0
 * on, contiguously (an empty file still needs one call with n = 0). Anything else is -EINVAL. */
int ckw_write(ckw_t *w, uint32_t file, uint64_t offset, const void *data, size_t n, char *err, size_t errlen);
/* Finishes: checks every file got its size, syncs, writes the index, renames. path (may be
 * NULL) receives DIR/step-N. Consumes w whether it succeeds or not (on failure the
 * temporary directory is removed). */
int ckw_commit(ckw_t **w, char *path, size_t pathlen, ckw_stats_t *st, char *err, size_t errlen);
/* Gives up: removes the temporary directory (a part's writer: only its part's files). */
void ckw_abort(ckw_t **w);

/* ---- a checkpoint written in parts (ckpt_index_plan_parts), one per host ----
 *
 * Every part writes into one temporary directory of a folder every host sees, DIR/tmp_name,
 * where tmp_name is .tmp-step-NNNNNNNN.PID for the plan's step and PID that of the checkpointd
 * that will commit (host 0's), so that ckpt_retain's rule (a temporary directory whose PID is
 * gone is removed; run where that PID lives) covers it; any other name (one with '/', another
 * step's) is refused with -EINVAL. Each part's writer writes only its part's data files
 * and its checksum file part-K.xxh; the committing host then checks them all and writes the
 * index over them:
 *
 *   part K: data files fsynced -> part-K.xxh written and fsynced -> the directory fsynced
 *   commit: every part-K.xxh and data file checked -> part-K.xxh removed -> index written and
 *           fsynced -> the directory fsynced -> renamed to DIR/step-N (exchanged when it
 *           exists) -> DIR fsynced
 *
 * A part's checksum file is its completion mark: a part without one (its writer died) is
 * missing. Nothing that fails leaves a step-N. */

/* Begins part `part` of n_parts (the plan has as many files for each part, part-major:
 * checkpointd/ckpt_layout.h) in DIR/tmp_name: creates DIR and the directory as needed (the
 * first part to begin does; one that exists is kept, the other parts' files in it too), removes
 * this part's own files from an earlier attempt, then takes the part's data files through
 * ckw_write, in order, file numbers the plan's (F * part to F * part + F - 1 for F files a part).
 * ckw_commit does not end such a writer (-EINVAL); ckw_abort removes only this part's files. */
int ckw_begin_part(ckw_t **out, const char *dir, const char *tmp_name, const ckpt_index_t *plan, int part,
                   int n_parts, char *err, size_t errlen);
/* Ends a part: checks every one of its files got its size, syncs them, writes and syncs
 * part-K.xxh (the XXH3 of each chunk in the part's files, in plan order) and syncs the
 * directory. No index, no rename. Consumes w whether it succeeds or not (on failure the part's
 * files are removed). */
int ckw_commit_part(ckw_t **w, ckw_stats_t *st, char *err, size_t errlen);
/* Commits a checkpoint whose n_parts parts are written in DIR/tmp_name (the plan every part was
 * written from, checksums left 0): reads every part's checksum file and checks it whole (magic,
 * version, step, part, n_parts, its count against the plan's chunks in that part's files, its
 * trailing checksum), checks every data file has the plan's size and its header (file number,
 * step), fills the plan's checksums from them, removes the checksum files, writes the index,
 * renames as ckw_commit does. path (may be NULL) receives DIR/step-N; st->bytes the data bytes
 * of all parts, st->secs the commit's time. On failure err names the file and what is wrong, and
 * the temporary directory is removed with every part in it (so no step-N, and nothing left for
 * a later ckpt_retain); a tmp_name of the wrong form is refused before anything is touched. */
int ckw_commit_parts(const char *dir, const char *tmp_name, const ckpt_index_t *plan, int n_parts, char *path,
                     size_t pathlen, ckw_stats_t *st, char *err, size_t errlen);
/* Gives a checkpoint in parts up: removes DIR/tmp_name (checked as above; a missing one is no
 * error). Returns 0 or -errno with err. */
int ckw_abort_parts(const char *dir, const char *tmp_name, int64_t step, char *err, size_t errlen);

#endif
