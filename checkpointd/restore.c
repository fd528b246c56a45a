/* Loading a checkpoint into the staging segment (see restore.h). LOAD is the mirror of SAVE,
 * so that checkpointd stays the only process that knows the checkpoint format:
 *
 *   SAVE  the optimizer shards copy their slices into the staging segment (SNAPSHOT) and the
 *         coordinator puts the step and the loader cursor in its header; checkpointd turns
 *         the segment into DIR/step-N (index, chunks, checksums) and answers SAVED.
 *   LOAD  checkpointd turns DIR/step-N back into the segment (verified, the model checked,
 *         every tensor read by name; the step and the cursor in the header) and answers
 *         LOADED with them; the coordinator formats the loader segment from that cursor and
 *         the optimizer shards copy their slices out of the segment as they start.
 *
 * Same segment, same layout, same process on the format's side in both directions. The
 * segment holds the whole flat parameter space, so neither direction knows the other run's
 * topology: any shard count, pipeline split or replica count takes [begin, end) of it, and
 * resharding costs nothing. */
#include "checkpointd/restore.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/ckpt_stream.h"
#include "checkpointd/hf_import.h"
#include "ipc/util.h"
#include "kernels/optim.h"
#include "stages/runtime/ldr.h"
#include "stages/job/staging.h"

_Static_assert(CKPT_CURSOR_MAX <= sizeof(((staging_hdr_t *)0)->cursor), "a checkpoint's cursor fits the staging header");

/* One load's arguments (restore_load_stored's), and what "latest"'s search did. */
typedef struct {
    const manifest_t *m;
    const restore_stored_t *stored;
    const param_table_t *tab;
    void *staging;
    FILE *log;
    const char *what; /* checkpoint.load as given */
    const char *key;  /* the key that named the directory loaded */
    int loaded;       /* latest's search loaded the one it took */
} load_t;

static int load_dir(load_t *L, const char *path, int *corrupt, char *err, size_t errlen);
static int remote_latest(load_t *L, char *path, size_t n, char *err, size_t errlen);

/* latest's load of a checkpoint of the folder (ckpt_find_loading, which checks its files first
 * and passes over one whose data proves damaged). */
static int latest_load(void *arg, const char *path, int *corrupt, char *err, size_t errlen)
{
    load_t *L = arg;
    int rc = load_dir(L, path, corrupt, err, errlen);
    L->loaded = !rc;
    return rc;
}

/* After latest loaded checkpoint `step` of the folder, the complete ones after it were all
 * passed over as damaged (said on log), and a run that writes checkpoints would write over
 * them: each is moved aside (ckpt_set_aside), kept, as the supervisor does with one a restart
 * could not load. */
static void set_aside_newer(const char *folder, int64_t step, FILE *log)
{
    int64_t *steps = NULL;
    int n = ckpt_list(folder, &steps);
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX], aside[PATH_MAX + 32];
        if (steps[i] <= step)
            continue;
        ckpt_step_path(path, sizeof(path), folder, steps[i]);
        int rc = ckpt_set_aside(path, aside, sizeof(aside));
        if (log && rc)
            fprintf(log, "ctitan: %s (damaged, see above) cannot be moved aside to %s: %s; this run may write over "
                    "it\n", path, aside, strerror(-rc));
        else if (log)
            fprintf(log, "ctitan: %s (damaged, see above) moved aside to %s, kept\n", path, aside);
    }
    free(steps);
}

/* checkpoint.load to a directory: "latest" is the newest one of the folder that loads (and is
 * loaded: L->loaded; none: path ""), any other must exist and have all its files (its data is
 * checked as it loads). */
static int resolve(const char *what, load_t *L, char *path, size_t n, char *err, size_t errlen)
{
    const manifest_t *m = L->m;
    const restore_stored_t *stored = L->stored;
    path[0] = 0;
    if (!what[0]) /* a fresh start */
        return 0;
    if (!strcmp(what, "latest") && stored)
        return stored->n ? remote_latest(L, path, n, err, errlen) : 0; /* none there: a fresh start */
    if (!strcmp(what, "latest")) {
        char folder[PATH_MAX];
        manifest_ckpt_folder(m, folder, sizeof(folder));
        int rc = ckpt_find_loading(folder, latest_load, L, path, n, L->log, err, errlen);
        if (!rc && L->loaded && m->ckpt_enable)
            set_aside_newer(folder, atomic_load(&((staging_hdr_t *)L->staging)->step), L->log);
        return rc == -ENOENT ? 0 : rc;
    }
    struct stat st;
    if (stat(what, &st)) {
        int e = errno;
        return util_fail(err, errlen, -e, "checkpoint.load %s is not loadable (%s): not resuming from it", what,
                         e == ENOENT ? "no such directory" : strerror(e));
    }
    char why[1024];
    int nbad, rc = ckpt_check_files(what, L->log, &nbad, why, sizeof(why));
    if (rc) {
        size_t k = strlen(what); /* ckpt.h's reasons start with the path: name it once */
        const char *r = !strncmp(why, what, k) && !strncmp(why + k, ": ", 2) ? why + k + 2 : why;
        return util_fail(err, errlen, rc, "checkpoint.load %s is not loadable (%s): not resuming from it", what,
                         rc == -EBADMSG ? "corrupt: see above" : r);
    }
    snprintf(path, n, "%s", what);
    return 0;
}

static int check_overwrite(const char *what, const manifest_t *m, const restore_stored_t *stored, int64_t start,
                           char *err, size_t errlen);
static int check_run(load_t *L, const optim_t **o, char *err, size_t errlen);

/* The Hugging Face Llama of checkpoint.initial_load_path (initial_load_in_hf) read straight into
 * the staging segment as step 0, the optimizer fresh (hf_load_state: no checkpoint written and
 * read back, 12 bytes a parameter each way): read again on every fresh start, so the folder's
 * weights as they are now count. path gets the folder: what the other hosts' agents are told
 * to load (each reads it itself: it must be at that path on every host). */
static int initial_hf(load_t *L, char *path, size_t n, char *err, size_t errlen)
{
    const manifest_t *m = L->m;
    const char *from = m->ckpt_initial_path;
    staging_hdr_t *h = L->staging;
    const optim_t *o;
    char why[1024];
    int rc = check_run(L, &o, err, errlen);
    if (!rc) /* a fresh start: nothing of an earlier run's after step 0 to write over */
        rc = check_overwrite(L->what, m, L->stored, 0, err, errlen);
    if (rc)
        return rc;
    if (strlen(from) >= n)
        return util_fail(err, errlen, -ENAMETOOLONG, "checkpoint.initial_load_path %s is too long", from);
    if (L->log)
        fprintf(L->log, "ctitan: no checkpoint to resume from: reading the Hugging Face Llama %s\n", from);
    float *arrays[OPTIM_ARRAYS_MAX];
    for (int a = 0; a < optim_arrays(o); a++)
        arrays[a] = staging_array(L->staging, a);
    atomic_store(&h->step, -1); /* nothing whole in the segment until the end */
    if ((rc = hf_load_state(from, m, arrays, optim_arrays(o), L->log, why, sizeof(why))))
        return util_fail(err, errlen, rc, "checkpoint.initial_load_path %s (initial_load_in_hf): %s", from, why);
    h->cursor_len = 0;
    atomic_store(&h->step, 0);
    snprintf(path, n, "%s", from);
    L->loaded = 1;
    return 0;
}

/* A run with nothing to resume from starts from checkpoint.initial_load_path (torchtitan's
 * rule: a run's own checkpoints win): a checkpoint directory, loaded as checkpoint.load loads
 * one, or with initial_load_in_hf a Hugging Face Llama folder (initial_hf). path stays "" without
 * one. */
static int initial(load_t *L, char *path, size_t n, char *err, size_t errlen)
{
    const manifest_t *m = L->m;
    const char *from = m->ckpt_initial_path;
    if (!from[0])
        return 0;
    L->key = "checkpoint.initial_load_path";
    if (m->ckpt_initial_hf)
        return initial_hf(L, path, n, err, errlen);
    char why[1024];
    load_t own = *L;
    own.stored = NULL;
    int rc = resolve(from, &own, path, n, why, sizeof(why));
    L->loaded = own.loaded;
    return rc ? util_fail(err, errlen, rc, "checkpoint.initial_load_path: %s", why) : 0;
}

/* A run that writes checkpoints into its folder from after step `start` on: no complete
 * checkpoint of another run may be there after that step, for this run would write over it.
 * After "latest" the newer ones there did not verify (they were said to fall back past) and
 * may go. A remote folder is the storage host's to check. */
static int check_overwrite(const char *what, const manifest_t *m, const restore_stored_t *stored, int64_t start,
                           char *err, size_t errlen)
{
    if (!m->ckpt_enable || (m->ckpt_endpoint[0] && !stored) || !strcmp(what, "latest"))
        return 0;
    char folder[PATH_MAX + 64];
    int64_t *steps = NULL, newest = -1;
    int n, later = 0;
    if (stored) { /* the newest, newest first */
        snprintf(folder, sizeof(folder), "the storage host's folder of job %s", m->name);
        n = stored->n;
        for (int i = 0; i < n && i < RESTORE_STORED_MAX; i++)
            later += stored->steps[i] > start;
        later += n > RESTORE_STORED_MAX && later == RESTORE_STORED_MAX ? n - RESTORE_STORED_MAX : 0;
        newest = n ? stored->steps[0] : -1;
    } else {
        manifest_ckpt_folder(m, folder, sizeof(folder));
        if ((n = ckpt_list(folder, &steps)) < 0)
            return util_fail(err, errlen, n, "checkpoint.folder %s: %s", folder, strerror(-n));
        for (int i = 0; i < n; i++)
            later += steps[i] > start;
        newest = n ? steps[n - 1] : -1;
        free(steps);
    }
    if (!later)
        return 0;
    return util_fail(err, errlen, -EEXIST, "checkpoint.folder %s holds %d checkpoint%s of an earlier run after step "
                     "%lld, where this run starts (the newest: step %lld), which this run would write over: resume "
                     "from the newest (checkpoint.load = latest, the default), or give this run another "
                     "job.dump_folder or checkpoint.folder, or move them away", folder, later, later == 1 ? "" : "s",
                     (long long)start, (long long)newest);
}

/* The first key of the learning-rate schedule that differs between the run that wrote a
 * checkpoint (as its manifest asked) and this one, or NULL. */
static const char *schedule_diff(const manifest_t *old, const manifest_t *m)
{
    const lr_schedule_t *a = &old->lr_sched, *b = &m->lr_sched;
    if (old->steps != m->steps)
        return "training.steps";
    if (old->lr != m->lr)
        return "optimizer.lr";
    if ((a->warmup_steps > old->steps ? old->steps : a->warmup_steps) != b->warmup_steps) /* both clipped */
        return "lr_scheduler.warmup_steps";
    if (a->decay_ratio != b->decay_ratio || a->decay_type != b->decay_type || a->lr_min != b->lr_min)
        return "lr_scheduler.decay_ratio, decay_type or min_lr_factor";
    return NULL;
}

/* The run that wrote the checkpoint must have had this run's model; its data order and
 * learning-rate schedule may differ (a note each). A stored manifest that does not parse leaves
 * the check to the tensors' shapes. */
static int check_model(const ckpt_index_t *ix, const manifest_t *m, const char *path, FILE *log, char *err,
                       size_t errlen)
{
    manifest_t *old = malloc(sizeof(*old));
    char why[512];
    int rc = 0;
    if (!old)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    manifest_defaults(old);
    if (manifest_parse(old, ix->manifest, strlen(ix->manifest), path, why, sizeof(why))) {
        if (log)
            fprintf(log, "ctitan: note: the manifest inside %s does not parse (%s); the tensors are checked "
                    "against the model as they load\n", path, why);
        goto out;
    }
    double was, is;
    const char *key = config_diff(&old->model, &m->model, &was, &is);
    if (key)
        rc = util_fail(err, errlen, -EINVAL, "checkpoint %s was written for another model: its model.%s = %g, "
                       "this run's is %g", path, key, was, is);
    else if (log && (old->seed != m->seed || strcmp(old->dataset_path, m->dataset_path) || old->shuffle != m->shuffle))
        fprintf(log, "ctitan: note: training.seed, loader.dataset_path or loader.shuffle differ from the run "
                "that wrote %s: the data order will differ from that run's\n", path);
    const char *sched = schedule_diff(old, m);
    if (!rc && log && sched)
        fprintf(log, "ctitan: note: %s differs from the run that wrote %s: the learning rate follows this run's "
                "schedule from step %lld on, not that run's\n", sched, path, (long long)ix->step);
out:
    free(old);
    return rc;
}

/* The loader cursor by stages/runtime/ldr.h's convention: a map whose "sample", when there, counts the
 * sequences produced (below 2^63). Anything else would reach the loader as a position. */
static int check_cursor(const ckpt_index_t *ix, const char *path, char *err, size_t errlen)
{
    uint64_t sample;
    int rc = ix->cursor_len ? ldr_cursor_get(ix->cursor, ix->cursor_len, "sample", &sample) : -ENOENT;
    if (rc == -ENOENT || (!rc && sample <= INT64_MAX))
        return 0;
    return util_fail(err, errlen, -EBADMSG, "checkpoint %s: its loader cursor's \"sample\" is %s: not a count of "
                     "sequences (an unsigned integer below 2^63, stages/runtime/ldr.h)", path,
                     rc ? "not an unsigned integer, or the cursor is not a map" : "2^63 or more");
}

/* Tensor ct of the index has the shape of parameter p (whose model `whose` names), or -EBADMSG. */
static int check_shape(const ckpt_tensor_t *ct, const param_info_t *p, const char *path, const char *whose, char *err,
                       size_t errlen)
{
    int same = ct->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++)
        same = ct->shape[d] == p->shape[d];
    if (same)
        return 0;
    char a[96], b[96];
    return util_fail(err, errlen, -EBADMSG, "checkpoint %s: tensor %s is %s in the index; %s makes it %s", path,
                     ct->name, ckpt_shape_str(ct->ndim, ct->shape, a, sizeof(a)), whose,
                     ckpt_shape_str(p->ndim, p->shape, b, sizeof(b)));
}

/* Each tensor of every array of table tab (o's arrays; a master copy too when the index has
 * one) is in the index with its shape. */
static int check_tensors(const ckpt_index_t *ix, const param_table_t *tab, const optim_t *o, const char *path,
                         const char *whose, char *err, size_t errlen)
{
    for (int t = 0; t < tab->n; t++)
        for (int a = -1; a < optim_arrays(o); a++) {
            char name[CKPT_NAME_MAX + 32];
            if (a < 0)
                ckpt_master_tensor(tab->t[t].name, name, sizeof(name));
            else
                ckpt_tensor_name(o, a, tab->t[t].name, name, sizeof(name));
            const ckpt_tensor_t *ct = ckpt_index_find(ix, name);
            if (!ct && a >= 0)
                return util_fail(err, errlen, -EBADMSG, "checkpoint %s has no tensor %s, which %s has", path, name,
                                 whose);
            int rc = ct ? check_shape(ct, &tab->t[t], path, whose, err, errlen) : 0;
            if (rc)
                return rc;
        }
    return 0;
}

int restore_check_shapes(const ckpt_index_t *ix, const char *path, char *err, size_t errlen)
{
    if (!ix->manifest || !ix->manifest[0])
        return util_fail(err, errlen, 1, "checkpoint %s holds no manifest: its tensors' shapes are not checked", path);
    manifest_t *m = malloc(sizeof(*m));
    param_table_t tab = {0};
    char why[512];
    int rc;
    if (!m)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    manifest_defaults(m);
    const optim_t *o = NULL;
    if (manifest_parse(m, ix->manifest, strlen(ix->manifest), path, why, sizeof(why)))
        rc = util_fail(err, errlen, 1, "the manifest inside %s does not parse (%s): its tensors' shapes are not "
                       "checked", path, why);
    else if (!(o = optim_find(m->optimizer_name)))
        rc = util_fail(err, errlen, -EBADMSG, "checkpoint %s: its manifest's optimizer.name = \"%s\" is no optimizer "
                       "of this build", path, m->optimizer_name);
    else if ((rc = params_table_init(&tab, &m->model)))
        util_fail(err, errlen, rc, "out of memory");
    else
        rc = check_tensors(ix, &tab, o, path, "the model of its own manifest", err, errlen);
    params_table_free(&tab);
    free(m);
    return rc;
}

/* Every array of the training state (the master weights, then optimizer o's state), tensor by
 * tensor by name, into the staging arrays at its offset in the flat space. */
/* The tensor of index ix (named `path` in messages) holding array a of parameter p: the fp32
 * master copy for a = 0 when the index has one, else the array's own; F32 with p's elements,
 * or NULL with -ENOENT / -EINVAL in *rc and why in err. */
static const ckpt_tensor_t *array_tensor(const ckpt_index_t *ix, const optim_t *o, const param_info_t *p, int a,
                                         const char *path, int *rc, char *err, size_t errlen)
{
    char name[CKPT_NAME_MAX + 32];
    if (a > 0 || !ckpt_index_find(ix, ckpt_master_tensor(p->name, name, sizeof(name))))
        ckpt_tensor_name(o, a, p->name, name, sizeof(name));
    const ckpt_tensor_t *ct = ckpt_index_find(ix, name);
    *rc = !ct ? util_fail(err, errlen, -ENOENT, "checkpoint %s has no tensor %s", path, name)
              : strcmp(ct->dtype, "F32") || ct->numel != p->numel
                  ? util_fail(err, errlen, -EINVAL, "checkpoint %s: tensor %s is %s with %llu elements; the model "
                              "needs F32 with %zu", path, name, ct->dtype, (unsigned long long)ct->numel, p->numel)
                  : 0;
    return *rc ? NULL : ct;
}

/* Every array of every tensor into the staging segment, saying on log how far it is (a large
 * model's checkpoint takes minutes to read). */
static int read_tensors(ckpt_t *ck, const param_table_t *tab, const optim_t *o, void *staging, FILE *log,
                        char *err, size_t errlen)
{
    int rc = 0, arrays = optim_arrays(o);
    util_every_t every;
    util_every_start(&every, util_say_s());
    double total = (double)tab->total * arrays * sizeof(float), done = 0;
    for (int t = 0; t < tab->n && !rc; t++)
        for (int a = 0; a < arrays && !rc; a++) {
            const param_info_t *p = &tab->t[t];
            const ckpt_tensor_t *ct = array_tensor(ckpt_index(ck), o, p, a, ckpt_path(ck), &rc, err, errlen);
            if (ct)
                rc = ckpt_read(ck, ct->name, 0, p->numel, staging_array(staging, a) + p->offset, err, errlen);
            done += (double)p->numel * sizeof(float);
            double secs = !rc && log ? util_every_due(&every) : -1;
            if (secs >= 0) {
                fprintf(log, "ctitan: loading %s: %.1f of %.1f GiB (%.0f s)\n", ckpt_path(ck), done / (1 << 30),
                        total / (1 << 30), secs);
                fflush(log);
            }
        }
    return rc;
}

/* The run's optimizer and the staging segment's shape for it. */
static int check_run(load_t *L, const optim_t **o, char *err, size_t errlen)
{
    const manifest_t *m = L->m;
    if (!(*o = optim_find(m->optimizer_name)))
        return util_fail(err, errlen, -EINVAL, "optimizer.name = \"%s\": no such optimizer", m->optimizer_name);
    return staging_check(L->staging, L->tab->total, optim_arrays(*o), err, errlen);
}

/* This run's checks of a checkpoint's index (`path` names it in messages), a local one's or one
 * streaming from a storage host: written for this run's model, every tensor there with its
 * shape, a cursor by the loader's convention, nothing of another run written over. */
static int check_index(load_t *L, const optim_t *o, const ckpt_index_t *ix, const char *path, char *err,
                       size_t errlen)
{
    int rc = check_model(ix, L->m, path, L->log, err, errlen);
    if (!rc) /* this run's model, whatever the manifest inside says */
        rc = check_tensors(ix, L->tab, o, path, "this run's model", err, errlen);
    if (!rc)
        rc = check_cursor(ix, path, err, errlen);
    if (!rc)
        rc = check_overwrite(L->what, L->m, L->stored, ix->step, err, errlen);
    return rc;
}

int restore_load(const char *what, const manifest_t *m, const param_table_t *tab, void *staging, FILE *log,
                 char *path, size_t pathlen, char *err, size_t errlen)
{
    return restore_load_stored(what, m, NULL, tab, staging, log, path, pathlen, err, errlen);
}

/* Checkpoint `path` into the staging segment: this run's checks, then every tensor, each chunk
 * checked as it is read. *corrupt: what failed was the data (a chunk's checksum, a file cut
 * short or gone), not a check. */
static int load_dir(load_t *L, const char *path, int *corrupt, char *err, size_t errlen)
{
    const manifest_t *m = L->m;
    staging_hdr_t *h = L->staging;
    *corrupt = 0;
    const optim_t *o;
    int rc = check_run(L, &o, err, errlen);
    if (rc)
        return rc;
    ckpt_t *ck;
    if ((rc = ckpt_open(&ck, path, err, errlen)))
        return rc;
    const ckpt_index_t *ix = ckpt_index(ck);
    atomic_store(&h->step, -1); /* nothing whole in the segment until the end */
    rc = check_index(L, o, ix, path, err, errlen);
    if (!rc && ix->step < m->steps) { /* a run with nothing left to train needs only the step */
        rc = read_tensors(ck, L->tab, o, L->staging, L->log, err, errlen);
        *corrupt = rc == -EBADMSG;
    }
    if (!rc) {
        memcpy(h->cursor, ix->cursor, ix->cursor_len);
        h->cursor_len = ix->cursor_len;
        atomic_store(&h->step, ix->step);
    }
    ckpt_close(&ck);
    return rc;
}

/* ---- a checkpoint streamed from a storage host into the staging segment ---- */

/* One fetch as it streams in (remote.h rmt_sink_t): the index checked as load_dir checks one,
 * then each data file's header and every chunk the run reads copied into the segment, its
 * checksum checked as its last byte comes (ckpt_stream.h); the bytes no chunk of the run covers
 * are passed over. Nothing whole is in the segment until stream_finish. */
typedef struct {
    load_t *L;
    const char *shown;        /* "step N of job J on the storage host at EP" */
    int64_t step;             /* the index's step and cursor, kept for the end: -1 none came */
    uint8_t cursor[CKPT_CURSOR_MAX];
    uint32_t cursor_len;
    int index_failed;         /* the index came and this run refused it (not the data's fault) */
    int skip;                 /* nothing left to train: no data is read */
    ckpt_stream_t cs;         /* the chunks of the run, checked and copied */
} stream_t;

/* The index: this run's checks (load_dir's), then the chunks of every tensor of every array. */
static int stream_index(void *arg, const ckpt_index_t *ix, const void *bytes, size_t n, char *err, size_t errlen)
{
    stream_t *S = arg;
    load_t *L = S->L;
    const optim_t *o;
    int rc = check_run(L, &o, err, errlen);
    if (!rc)
        rc = check_index(L, o, ix, S->shown, err, errlen);
    S->step = ix->step;
    memcpy(S->cursor, ix->cursor, ix->cursor_len);
    S->cursor_len = ix->cursor_len;
    S->skip = ix->step >= L->m->steps;
    if (!rc)
        rc = ckpt_stream_begin(&S->cs, ix, S->shown, err, errlen);
    for (int t = 0; !rc && t < L->tab->n; t++) {
        const param_info_t *p = &L->tab->t[t];
        for (int a = 0; !rc && a < optim_arrays(o); a++) {
            const ckpt_tensor_t *ct = array_tensor(ix, o, p, a, S->shown, &rc, err, errlen);
            if (!ct)
                break;
            uint8_t *dst = (uint8_t *)(staging_array(L->staging, a) + p->offset);
            for (uint32_t c = 0; c < ct->n_chunks; c++) {
                ckpt_stream_add(&S->cs, ct, c, dst);
                dst += ct->chunks[c].length;
            }
        }
    }
    if (!rc)
        rc = ckpt_stream_ready(&S->cs, err, errlen);
    S->index_failed = rc && !S->cs.corrupt;
    (void)bytes, (void)n;
    return rc;
}

/* Bytes [off, off + n) of data file k: its header checked, the run's chunks copied. */
static int stream_data(void *arg, uint32_t k, uint64_t off, const void *p, size_t n, char *err, size_t errlen)
{
    stream_t *S = arg;
    return S->skip ? 0 : ckpt_stream_data(&S->cs, k, off, p, n, err, errlen);
}

/* Data file k whole: every chunk of the run in it came. */
static int stream_file_done(void *arg, uint32_t k, char *err, size_t errlen)
{
    stream_t *S = arg;
    return S->skip ? 0 : ckpt_stream_file_done(&S->cs, k, err, errlen);
}

/* The fetch ended well (its index is gone with it): the step and the cursor into the segment's
 * header. */
static int stream_finish(stream_t *S, char *err, size_t errlen)
{
    staging_hdr_t *h = S->L->staging;
    int rc = S->step < 0 ? util_fail(err, errlen, -EBADMSG, "checkpoint %s: no index came", S->shown)
             : S->skip   ? 0
                         : ckpt_stream_finish(&S->cs, err, errlen);
    if (rc)
        return rc;
    memcpy(h->cursor, S->cursor, S->cursor_len);
    h->cursor_len = S->cursor_len;
    atomic_store(&h->step, S->step);
    return 0;
}

/* latest from a storage host (restore_load_stored): its newest checkpoint that loads, streamed
 * into the staging segment as it is fetched; one damaged there (a file missing or cut short)
 * or in what comes (a chunk's checksum, a header) is passed over for the next older. */
static int remote_latest(load_t *L, char *path, size_t n, char *err, size_t errlen)
{
    const restore_stored_t *st = L->stored;
    const manifest_t *m = L->m;
    char where[PATH_MAX + 320], why[1024], shown[512];
    int tried = 0;
    atomic_store(&((staging_hdr_t *)L->staging)->step, -1); /* a fetch may fail before its index */
    for (int i = 0; i < st->n && i < RESTORE_STORED_MAX; i++, tried++) {
        snprintf(shown, sizeof(shown), "step %lld of job %s on the storage host at %s", (long long)st->steps[i],
                 m->name, m->ckpt_endpoint);
        stream_t S = {.L = L, .shown = shown, .step = -1};
        rmt_sink_t sink = {.index = stream_index, .data = stream_data, .file_done = stream_file_done, .arg = &S};
        int rc = st->fetch(st->arg, st->steps[i], &sink, where, sizeof(where), why, sizeof(why));
        if (!rc)
            rc = stream_finish(&S, why, sizeof(why));
        int corrupt = (rc == -ENOENT || rc == -EBADMSG) && !S.index_failed;
        ckpt_stream_free(&S.cs);
        if (!rc) {
            if (strlen(where) >= n)
                return util_fail(err, errlen, -ENAMETOOLONG, "checkpoint path %s is too long", where);
            snprintf(path, n, "%s", where);
            L->loaded = 1;
            return 0;
        }
        if (!corrupt)
            return util_fail(err, errlen, rc, "checkpoint.load = latest: %s: %s", shown, why);
        if (L->log)
            fprintf(L->log, "ctitan: %s: %s: not loading it\n", shown, why);
    }
    return util_fail(err, errlen, -EBADMSG, "checkpoint.load = latest: none of the newest %d checkpoint%s of job %s "
                     "on the storage host at %s loads (see above); `ctitan ckpt verify` on the storage host lists "
                     "every problem", tried, tried == 1 ? "" : "s", m->name, m->ckpt_endpoint);
}

int restore_load_stored(const char *what, const manifest_t *m, const restore_stored_t *stored,
                        const param_table_t *tab, void *staging, FILE *log, char *path, size_t pathlen, char *err,
                        size_t errlen)
{
    load_t L = {.m = m, .stored = stored, .tab = tab, .staging = staging, .log = log, .what = what,
                .key = "checkpoint.load"};
    char dir[PATH_MAX];
    /* the Hugging Face folder host 0 started from, as the other hosts' agents are told it */
    int hf = m->ckpt_initial_hf && m->ckpt_initial_path[0] && !strcmp(what, m->ckpt_initial_path), corrupt;
    int rc = hf ? initial(&L, dir, sizeof(dir), err, errlen) : resolve(what, &L, dir, sizeof(dir), err, errlen);
    if (!rc && !dir[0])
        rc = initial(&L, dir, sizeof(dir), err, errlen);
    if (rc)
        return rc;
    if (strlen(dir) >= pathlen)
        return util_fail(err, errlen, -ENAMETOOLONG, "checkpoint path %s is too long", dir);
    memcpy(path, dir, strlen(dir) + 1);
    if (!path[0])
        return check_overwrite(what, m, stored, 0, err, errlen);
    if (L.loaded)
        return 0;
    char why[1024];
    if (!(rc = load_dir(&L, path, &corrupt, why, sizeof(why))))
        return 0;
    if (!corrupt)
        return util_fail(err, errlen, rc, "%s", why);
    return util_fail(err, errlen, rc, "%s %s is not loadable (%s): not resuming from it (`ctitan ckpt verify %s` "
                     "lists every problem)", L.key, path, why, path);
}
