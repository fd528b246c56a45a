/* Loading a checkpoint into the staging segment (stages/job/staging.h): checkpointd does it on
 * MSG_LOAD, before the optimizer shards start, which then copy their slices out of the
 * staging segment. The mirror of a save (checkpointd/main.c, writer.h): see restore.c.
 * Returns 0 or -errno with the reason in err; nothing here exits. */
#ifndef CTITAN_RESTORE_H
#define CTITAN_RESTORE_H

#include <stddef.h>
#include <stdio.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/remote.h"
#include "kernels/params.h"
#include "stages/job/manifest.h"

/* Loads checkpoint `what` for the run of manifest m (its model, its checkpoint.folder):
 *   ""         nothing: a fresh start (0, path "")
 *   "latest"   the newest checkpoint of the folder that loads; each newer one that does
 *              not (a file missing or cut short, a chunk whose checksum is wrong) is reported
 *              on `log` with why; none at all is a fresh start (0, path "")
 *   else       that directory, which must exist with all its files (their problems go to
 *              `log`); a chunk whose checksum is wrong refuses the load (-EBADMSG naming it)
 * then checks that it was written for m's model (else -EINVAL naming the first key that
 * differs) and that its loader cursor keeps stages/runtime/ldr.h's convention (else -EBADMSG), and
 * reads every tensor by name into `staging` (mapped, formatted for tab->total floats and m's
 * optimizer): every array of the training state (the master weights, then the optimizer's
 * state: kernels/optim.h) in the flat order of tab, so any topology takes its slices from it,
 * each chunk's checksum checked as it is read (the data is read once, not verified first).
 * Last it sets the header's cursor and step (steps the checkpoint completed; when that is
 * m->steps or more, nothing is left to train and no tensor is read).
 * A run that writes checkpoints (locally) is refused with -EEXIST when its folder holds a
 * complete checkpoint after its first step that it would write over (except after "latest",
 * whose newer ones did not load).
 * path gets the directory (-ENAMETOOLONG when it does not fit pathlen); notes (a stored
 * manifest whose data order differs) go to `log`, which may be NULL. */
int restore_load(const char *what, const manifest_t *m, const param_table_t *tab, void *staging, FILE *log,
                 char *path, size_t pathlen, char *err, size_t errlen);

/* What a storage host holds of the job (checkpoint.endpoint), as it answered a list: how many
 * complete checkpoints, the newest (up to RESTORE_STORED_MAX, newest first), and how to fetch
 * one: fetch streams step `step` into the sink (rmt_client_fetch) and names it in `where`
 * ("PATH on ENDPOINT"); 0, or -errno with why in err: -ENOENT or -EBADMSG when that copy is
 * gone or damaged there (passed over), the sink's error, any other ends the search. */
#define RESTORE_STORED_MAX 32
typedef struct {
    int n;
    int64_t steps[RESTORE_STORED_MAX];
    int (*fetch)(void *arg, int64_t step, const rmt_sink_t *sink, char *where, size_t wherelen, char *err,
                 size_t errlen);
    void *arg;
} restore_stored_t;

/* restore_load for a run whose checkpoints go to a storage host holding `stored`: "latest" is
 * the newest of them that loads, streamed into `staging` as it is fetched (nothing on the
 * trainer's disk): the index checked as a local load checks it, each data file's header and
 * every chunk's checksum as its bytes come; one damaged there or in what comes is reported on
 * `log` and passed over for the next older; none loading is -EBADMSG, never a fresh start over
 * them; path gets its `where`. A fresh start when it holds none; the overwrite check is against
 * what it holds. */
int restore_load_stored(const char *what, const manifest_t *m, const restore_stored_t *stored,
                        const param_table_t *tab, void *staging, FILE *log, char *path, size_t pathlen, char *err,
                        size_t errlen);

/* The tensors of a checkpoint's index against the model of the manifest inside it: each of
 * its parameters, under every array of its optimizer, is there with the model's shape (not
 * only its number of elements). Returns 0, -EBADMSG naming the tensor and both shapes (or the
 * one missing), or 1 when there is nothing to check against (no manifest, or one that does not
 * parse: err says which). `ctitan ckpt verify` and export run it; a load checks against the
 * run's own model. */
int restore_check_shapes(const ckpt_index_t *ix, const char *path, char *err, size_t errlen);

#endif
