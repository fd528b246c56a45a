/* Writes one checkpoint directory durably and atomically (checkpointd's write path, local
 * and remote alike): data files are streamed through io_uring from a few registered 4 KiB-
 * aligned buffers, with O_DIRECT where the filesystem takes it (a buffered fallback where it
 * does not, e.g. tmpfs), then
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
/* Gives up: removes the temporary directory. */
void ckw_abort(ckw_t **w);

/* The raw rate to compare against (bench): writes `bytes` to PATH sequentially through the
 * same io_uring path (O_DIRECT when possible, fsync included). Returns 0 and the seconds. */
int ckw_raw_write(const char *path, uint64_t bytes, double *secs, int *direct, char *err, size_t errlen);

#endif
