/* checkpointd: the checkpoint daemon.
 *
 *   checkpointd --job NAME      started by `ctitan launch` ([checkpoint] enable or load): a
 *                               worker of the job. On LOAD, before the other processes start,
 *                               it reads checkpoint.load into the staging segment
 *                               (checkpointd/restore.h) and answers LOADED. On SAVE it reads
 *                               the staging segment the optimizer shards filled
 *                               (stages/job/staging.h), checksums it, and writes
 *                               checkpoint.folder/step-N (checkpointd/writer.h), or streams it
 *                               to the remote checkpointd at checkpoint.endpoint; then answers
 *                               SAVED. Training does not wait for it. Across hosts (job.hosts >
 *                               1, on host 0) a checkpoint is written in parts, one per host,
 *                               into one temporary directory of checkpoint.folder (a folder every
 *                               host sees): SAVE_PART writes host 0's part and answers WRITTEN;
 *                               COMMIT, once every host's part is written, checks them all,
 *                               writes the index over them and renames it into place (or, with
 *                               ok false, removes them), and answers SAVED.
 *   checkpointd --job NAME --load WHAT < MANIFEST
 *                               the same LOAD for a host's agent (job.hosts > 1), once, then exits.
 *   checkpointd --job NAME-hK --save-part TMPNAME --step N < MANIFEST
 *                               a host's agent's part of a checkpoint across hosts: part
 *                               job.host_rank of the staged snapshot of step N, from NAME-hK's
 *                               staging segment into checkpoint.folder/TMPNAME, then
 *                               `written BYTES SECONDS` on stdout and exit 0 (1 and the reason on
 *                               stderr when it fails).
 *   checkpointd --listen tcp://ADDR:PORT --dir DIR --key SERVER.key --allow TRAINERS.pub
 *                               on a storage host: receives checkpoints from trainers whose
 *                               public key is in the allow file (checkpointd/remote.h).
 *
 * The daemon never exits in the middle of a write on bad input: a failed checkpoint is
 * reported (SAVED with ok = false) and the next one is tried afresh. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/remote.h"
#include "checkpointd/restore.h"
#include "checkpointd/writer.h"
#include "ipc/log.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "kernels/optim.h"
#include "kernels/params.h"
#include "stages/job/job.h"
#include "stages/job/staging.h"
#include "stages/runtime/worker.h"

#define PIECE (64u << 20) /* bytes handed to the writer at a time */

typedef struct {
    worker_t *w;
    const manifest_t *m;
    char *toml;
    char folder[PATH_MAX];
    param_table_t tab;
    const optim_t *opt;         /* [optimizer] name: the arrays of the training state */
    shm_seg_t *seg;
    rmt_client_t *remote;
    int idle;     /* runs at SCHED_IDLE (from the first SAVE on) */
    int delay_ms; /* CTITAN_TEST_CKPT_DELAY_MS: a pause after each data file (tests kill us mid-write) */
    ckpt_part_range_t *ranges; /* job.hosts > 1: which host writes which ranges (job_host_parts) */
    int n_ranges, n_parts;
} ckd_t;

/* Where the bytes go: the local writer or the remote daemon. */
typedef struct {
    ckd_t *d;
    ckw_t *w;
    int replace; /* the coordinator saves this step again: it may replace the one stored */
} sink_t;

static int sink_begin(sink_t *s, const ckpt_index_t *plan, char *err, size_t errlen)
{
    if (s->d->remote)
        return rmt_client_begin_replace(s->d->remote, s->d->m->name, s->d->m->ckpt_keep, s->replace, plan, 30000,
                                        err, errlen);
    return ckw_begin(&s->w, s->d->folder, plan, err, errlen);
}

static int sink_write(sink_t *s, uint32_t f, uint64_t off, const void *p, size_t n, char *err, size_t errlen)
{
    if (s->d->remote)
        return rmt_client_write(s->d->remote, f, off, p, n, err, errlen);
    return ckw_write(s->w, f, off, p, n, err, errlen);
}

static int sink_commit(sink_t *s, char *path, size_t n, char *err, size_t errlen)
{
    if (s->d->remote)
        return rmt_client_commit(s->d->remote, path, n, 300000, err, errlen);
    ckw_stats_t st;
    int rc = ckw_commit(&s->w, path, n, &st, err, errlen);
    if (!rc)
        LOG_I("%s: %.1f MiB in %.3f s (%s, %s)", path, st.bytes / 1048576.0, st.secs,
              st.direct ? "O_DIRECT" : "buffered", st.fixed ? "registered buffers" : "plain buffers");
    return rc;
}

/* After a checkpoint is in place: the oldest beyond checkpoint.keep_latest_k go. */
static void retain(ckd_t *d)
{
    int removed = ckpt_retain(d->folder, d->m->ckpt_keep);
    if (removed > 0)
        LOG_I("removed %d old checkpoint%s (keep_latest_k = %d)", removed, removed == 1 ? "" : "s", d->m->ckpt_keep);
}

/* Writes the staged snapshot of `step`. Returns 0 with the path, or -errno with err. */
static int save(ckd_t *d, int64_t step, int replace, char *path, size_t pathlen, uint64_t *bytes, char *err,
                size_t errlen)
{
    staging_hdr_t *h = shm_data(d->seg);
    if (atomic_load(&h->step) != step)
        return util_fail(err, errlen, -EINVAL, "the staging segment holds step %" PRId64 ", not %" PRId64,
                         (int64_t)atomic_load(&h->step), step);
    ckpt_index_t plan;
    int rc = ckpt_index_plan(&plan, &d->tab, d->opt, step, d->toml, h->cursor, h->cursor_len);
    if (rc)
        return util_fail(err, errlen, rc, "cannot plan the checkpoint: %s", strerror(-rc));
    /* no checksums in the plan: the writer (here, or the storage host's) takes them from
     * the bytes as it writes them */
    sink_t s = {.d = d, .replace = replace};
    *bytes = 0;
    if ((rc = sink_begin(&s, &plan, err, errlen)))
        goto out;
    static _Alignas(4096) uint8_t block[CKPT_DATA_HDR];
    for (int f = 0; f < optim_arrays(d->opt) && !rc; f++) {
        ckpt_data_header(block, (uint32_t)f, step);
        rc = sink_write(&s, (uint32_t)f, 0, block, sizeof(block), err, errlen);
        const uint8_t *a = (const uint8_t *)staging_array(h, f);
        uint64_t n = (uint64_t)d->tab.total * sizeof(float);
        for (uint64_t off = 0; off < n && !rc; off += PIECE) {
            size_t k = n - off < PIECE ? (size_t)(n - off) : PIECE;
            rc = sink_write(&s, (uint32_t)f, CKPT_DATA_HDR + off, a + off, k, err, errlen);
            worker_progress(d->w);
        }
        *bytes += CKPT_DATA_HDR + n;
        if (d->delay_ms > 0)
            nanosleep(&(struct timespec){d->delay_ms / 1000, (d->delay_ms % 1000) * 1000000L}, NULL);
    }
    if (!rc)
        rc = sink_commit(&s, path, pathlen, err, errlen);
    else
        ckw_abort(&s.w);
    if (!rc && !d->remote)
        retain(d);
out:
    ckpt_index_free(&plan);
    return rc;
}

/* ---- checkpoints across hosts: one part per host ---- */

/* Which host writes what, in checkpointd's terms: the ranges of job_host_parts, host = part. */
static int host_parts(ckd_t *d, char *err, size_t errlen)
{
    job_layout_t l;
    job_range_t *r = NULL;
    int n = 0, rc = job_layout(&l, d->m);
    if (!rc)
        rc = job_host_parts(&l, d->m, &r, &n);
    if (!rc && !(d->ranges = malloc((size_t)n * sizeof(*d->ranges))))
        rc = -ENOMEM;
    for (int i = 0; !rc && i < n; i++)
        d->ranges[i] = (ckpt_part_range_t){r[i].begin, r[i].end, r[i].host};
    free(r);
    if (rc)
        return util_fail(err, errlen, rc, "cannot split the flat space between the job's hosts: %s", strerror(-rc));
    d->n_ranges = n;
    d->n_parts = l.hosts;
    return 0;
}

/* The plan of a checkpoint in parts of the staged snapshot of `step` (the staging header must
 * hold that step), the same on every host. Returns 0 or -errno with err. */
static int plan_parts(ckd_t *d, int64_t step, ckpt_index_t *plan, char *err, size_t errlen)
{
    staging_hdr_t *h = shm_data(d->seg);
    if (d->n_parts < 2)
        return util_fail(err, errlen, -EINVAL, "job.hosts = 1: a checkpoint of one host is written whole (SAVE)");
    if (atomic_load(&h->step) != step)
        return util_fail(err, errlen, -EINVAL, "the staging segment holds step %" PRId64 ", not %" PRId64,
                         (int64_t)atomic_load(&h->step), step);
    int rc = ckpt_index_plan_parts(plan, &d->tab, d->opt, step, d->toml, h->cursor, h->cursor_len, d->n_parts,
                                   d->ranges, d->n_ranges);
    return rc ? util_fail(err, errlen, rc, "cannot plan the checkpoint: %s", strerror(-rc)) : 0;
}

/* Writes part `part` of the staged snapshot of `step` into checkpoint.folder/tmp_name: each
 * array's header, then the part's ranges of it in flat order, through ckw_begin_part and
 * ckw_commit_part. *bytes: what it wrote. */
static int save_part(ckd_t *d, int64_t step, const char *tmp_name, int part, uint64_t *bytes, char *err,
                     size_t errlen)
{
    staging_hdr_t *h = shm_data(d->seg);
    *bytes = 0;
    ckpt_index_t plan;
    int rc = plan_parts(d, step, &plan, err, errlen);
    if (rc)
        return rc;
    ckw_t *w = NULL;
    ckw_stats_t st;
    if ((rc = ckw_begin_part(&w, d->folder, tmp_name, &plan, part, d->n_parts, err, errlen)))
        goto out;
    static _Alignas(4096) uint8_t block[CKPT_DATA_HDR];
    for (int a = 0; a < optim_arrays(d->opt) && !rc; a++) {
        uint32_t f = ckpt_file_of(d->opt, part, a);
        const uint8_t *arr = (const uint8_t *)staging_array(h, a);
        uint64_t off = CKPT_DATA_HDR;
        ckpt_data_header(block, f, step);
        rc = ckw_write(w, f, 0, block, sizeof(block), err, errlen);
        for (int i = 0; i < d->n_ranges && !rc; i++) {
            if (d->ranges[i].part != part)
                continue;
            uint64_t e = d->ranges[i].end * sizeof(float);
            for (uint64_t x = d->ranges[i].begin * sizeof(float); x < e && !rc; x += PIECE) {
                size_t k = e - x < PIECE ? (size_t)(e - x) : PIECE;
                rc = ckw_write(w, f, off, arr + x, k, err, errlen);
                off += k;
                if (d->w)
                    worker_progress(d->w);
            }
        }
        *bytes += off;
        if (d->delay_ms > 0)
            nanosleep(&(struct timespec){d->delay_ms / 1000, (d->delay_ms % 1000) * 1000000L}, NULL);
    }
    if (rc)
        ckw_abort(&w);
    else if (!(rc = ckw_commit_part(&w, &st, err, errlen)) && d->w)
        LOG_I("%s/%s: part %d of %d, %.1f MiB in %.3f s (%s, %s)", d->folder, tmp_name, part, d->n_parts,
              st.bytes / 1048576.0, st.secs, st.direct ? "O_DIRECT" : "buffered",
              st.fixed ? "registered buffers" : "plain buffers");
out:
    ckpt_index_free(&plan);
    return rc;
}

/* COMMIT: with ok, every host's part checked and the index written over them, renamed into
 * place (ckw_commit_parts), then retention, as after SAVE; *bytes: the data of every part. The
 * plan is made again from the staging header, which nothing overwrites before SAVED (one
 * snapshot at a time). Without ok, the parts are removed and the answer says it was given up. */
static int commit(ckd_t *d, int64_t step, int ok, const char *tmp_name, char *path, size_t pathlen, uint64_t *bytes,
                  char *err, size_t errlen)
{
    *bytes = 0;
    if (!ok) {
        char why[1024] = "";
        int rc = ckw_abort_parts(d->folder, tmp_name, step, why, sizeof(why));
        return util_fail(err, errlen, -ECANCELED, "the checkpoint of step %" PRId64 " was given up (not every host "
                         "wrote its part)%s%s", step, rc ? "; and its parts are not removed: " : "", why);
    }
    ckpt_index_t plan;
    int rc = plan_parts(d, step, &plan, err, errlen);
    if (rc)
        return rc;
    ckw_stats_t st;
    if (!(rc = ckw_commit_parts(d->folder, tmp_name, &plan, d->n_parts, path, pathlen, &st, err, errlen))) {
        *bytes = st.bytes;
        LOG_I("%s: %.1f MiB in %d parts, committed in %.3f s", path, st.bytes / 1048576.0, d->n_parts, st.secs);
        retain(d);
    }
    ckpt_index_free(&plan);
    return rc;
}

/* Writing a checkpoint must not slow training down: from the first SAVE on, this thread (not
 * the heartbeat one worker_open started) runs at idle CPU priority, so checksums and I/O
 * submission use only CPU time the stages leave idle. A LOAD comes before training starts,
 * while the job waits for it alone: it runs at normal priority. */
static void lower_priority(ckd_t *d)
{
    struct sched_param none = {0};
    if (sched_setscheduler(0, SCHED_IDLE, &none))
        LOG_W("cannot lower checkpointd to SCHED_IDLE; it runs at normal priority");
    d->idle = 1;
}

/* restore_stored_t's fetch: a step of the job from the storage host, named "PATH on ENDPOINT"
 * (the coordinator tells the run's own checkpoints by that ending). */
static int fetch_step(void *arg, int64_t step, const rmt_sink_t *sink, char *where, size_t wherelen, char *err,
                      size_t errlen)
{
    ckd_t *d = arg;
    char path[PATH_MAX];
    double t0 = util_now();
    int rc = rmt_client_fetch(d->remote, d->m->name, step, sink, path, sizeof(path), 60000, err, errlen);
    if (!rc) {
        snprintf(where, wherelen, "%s on %s", path, d->m->ckpt_endpoint);
        LOG_I("fetched step %lld of job %s from %s in %.2f s", (long long)step, d->m->name, d->m->ckpt_endpoint,
              util_now() - t0);
    }
    return rc;
}

/* LOAD: the checkpoint into the staging segment, then LOADED (the directory, its step and
 * loader cursor, or why not). The checkpoints written afterwards store the run's manifest with
 * checkpoint.load resolved, as the job's other processes get it from the coordinator. */
static void load(ckd_t *d, const char *what)
{
    char path[sizeof(d->m->ckpt_load)], err[1024];
    staging_hdr_t *h = shm_data(d->seg);
    restore_stored_t stored = {.fetch = fetch_step, .arg = d};
    int rc = 0;
    _Static_assert(RESTORE_STORED_MAX == RMT_LIST_MAX, "a list answer fits");
    /* the storage host says what it holds: latest resumes from it (fetched), and this run never
     * writes over it. latest needs its answer (not knowing is not "none there": a relaunch
     * while the host is down would start over); a run that loads nothing from it, or another
     * checkpoint, goes on without one, the host's refusal of an upload that would replace a
     * step it holds being the guard (remote.h) */
    char why[1024];
    if (d->remote && rmt_client_list(d->remote, d->m->name, stored.steps, &stored.n, 30000, why, sizeof(why))) {
        if (!strcmp(what, "latest"))
            rc = util_fail(err, sizeof(err), -EIO, "checkpoint.load = latest: cannot ask the storage host what it "
                           "holds of job %s, so not starting (it may hold checkpoints to resume from): %s; start it "
                           "(or have its --allow file list this trainer's key), or give --checkpoint.load none to "
                           "start over without them", d->m->name, why);
        else
            LOG_W("cannot ask the storage host what it holds of job %s: %s", d->m->name, why);
        stored.n = 0;
    }
    if (!rc)
        rc = restore_load_stored(what, d->m, d->remote ? &stored : NULL, &d->tab, h, stderr, path, sizeof(path), err,
                                 sizeof(err));
    msg_t r = {.type = MSG_LOADED, .ok = rc == 0};
    WORKER_CHECK(d->w, msg_set_text(&r, rc ? err : path) == 0, "out of memory");
    if (!rc && path[0]) {
        r.step = atomic_load(&h->step);
        WORKER_CHECK(d->w, msg_set_data(&r, h->cursor, h->cursor_len) == 0, "out of memory");
    }
    if (!rc) {
        manifest_t *m = malloc(sizeof(*m));
        WORKER_CHECK(d->w, m, "out of memory");
        *m = *d->m;
        snprintf(m->ckpt_load, sizeof(m->ckpt_load), "%s", path);
        free(d->toml);
        WORKER_CHECK(d->w, (d->toml = manifest_to_toml(m)), "out of memory");
        free(m);
    }
    worker_progress(d->w);
    WORKER_CHECK(d->w, worker_send(d->w, &r) == 0, "cannot reach the coordinator");
    msg_clear(&r);
}

static int run_worker(void)
{
    ckd_t d = {0};
    char err[1024];
    if (worker_open(&d.w, "checkpointd", 0, 0, err, sizeof(err))) {
        fprintf(stderr, "checkpointd: %s\n", err);
        return 1;
    }
    d.m = worker_manifest(d.w);
    const char *delay = getenv("CTITAN_TEST_CKPT_DELAY_MS");
    d.delay_ms = delay ? atoi(delay) : 0;
    manifest_ckpt_folder(d.m, d.folder, sizeof(d.folder));
    WORKER_CHECK(d.w, (d.toml = manifest_to_toml(d.m)) && params_table_init(&d.tab, &d.m->model) == 0,
                 "out of memory");
    d.opt = optim_find(d.m->optimizer_name); /* the manifest was validated */
    WORKER_CHECK(d.w, shm_attach(&d.seg, worker_job(d.w), STAGING_SEG, err, sizeof(err)) == 0, "%s", err);
    WORKER_CHECK(d.w, staging_check(shm_data(d.seg), d.tab.total, optim_arrays(d.opt), err, sizeof(err)) == 0, "%s",
                 err);
    if (d.m->hosts > 1 && d.m->ckpt_enable && d.m->ckpt_endpoint[0])
        worker_die(d.w, "checkpoint.endpoint with job.hosts = %d: a remote checkpointd across hosts is not built "
                   "(every host writes its part into checkpoint.folder, a folder they all see)", d.m->hosts);
    if (d.m->hosts > 1 && host_parts(&d, err, sizeof(err)))
        worker_die(d.w, "%s", err);
    if (d.m->ckpt_enable && d.m->ckpt_endpoint[0])
        WORKER_CHECK(d.w, rmt_client_new(&d.remote, d.m->ckpt_endpoint, d.m->ckpt_server_key,
                                         d.m->ckpt_client_key, err, sizeof(err)) == 0, "%s", err);
    else if (d.m->ckpt_enable && ckw_check_dir(d.folder, err, sizeof(err)))
        worker_die(d.w, "checkpoint.folder %s", err); /* before training, not at its first checkpoint */
    else if (d.m->ckpt_enable)
        ckpt_retain(d.folder, 0); /* temporary directories of writers that died */
    WORKER_CHECK(d.w, worker_ready(d.w) == 0, "cannot reach the coordinator");
    for (;;) {
        msg_t m;
        worker_command(d.w, &m);
        if (m.type == MSG_STOP) {
            msg_clear(&m);
            break;
        }
        if (m.type == MSG_LOAD)
            load(&d, m.text);
        if (m.type == MSG_SAVE || m.type == MSG_SAVE_PART || m.type == MSG_COMMIT) {
            if (!d.idle)
                lower_priority(&d);
            char path[PATH_MAX + 64] = "";
            uint64_t bytes = 0;
            double t0 = util_now();
            int rc;
            const char *tmp = m.text ? m.text : ""; /* the decoder requires it; "" is refused as a name */
            if (m.type == MSG_SAVE_PART)
                rc = save_part(&d, m.step, tmp, d.m->host_rank, &bytes, err, sizeof(err));
            else if (m.type == MSG_COMMIT)
                rc = commit(&d, m.step, m.ok, tmp, path, sizeof(path), &bytes, err, sizeof(err));
            else if (d.n_parts > 1)
                rc = util_fail(err, sizeof(err), -EINVAL, "job.hosts = %d: a checkpoint across hosts is written in "
                               "parts (SAVE_PART, COMMIT), not by SAVE", d.n_parts);
            else
                rc = save(&d, m.step, m.ok, path, sizeof(path), &bytes, err, sizeof(err));
            if (!rc && m.type != MSG_SAVE_PART)
                worker_test_point(d.w, "committed", m.step - 1); /* a test's: done, SAVED not yet sent */
            msg_t r = {.type = m.type == MSG_SAVE_PART ? MSG_WRITTEN : MSG_SAVED, .step = m.step, .ok = rc == 0,
                       .t_busy = util_now() - t0, .progress = bytes};
            msg_set_text(&r, rc ? err : path);
            worker_progress(d.w);
            WORKER_CHECK(d.w, worker_send(d.w, &r) == 0, "cannot reach the coordinator");
            msg_clear(&r);
        }
        msg_clear(&m);
    }
    rmt_client_destroy(&d.remote);
    shm_detach(&d.seg);
    params_table_free(&d.tab);
    free(d.ranges);
    free(d.toml);
    worker_close(&d.w);
    return 0;
}

/* The one-shot modes' manifest: the job's resolved TOML on standard input, parsed and
 * validated into *m (malloc'ed), its text in *toml (malloc'ed), and the model's table. */
static int read_manifest(manifest_t **m, char **toml, param_table_t *tab, char *err, size_t errlen)
{
    size_t cap = MANIFEST_MAX_BYTES;
    long n = 0;
    *toml = malloc(cap + 2);
    *m = malloc(sizeof(**m));
    int rc = *toml && *m ? 0 : util_fail(err, errlen, -ENOMEM, "out of memory");
    if (!rc && (n = util_read_all(0, *toml, cap + 1, -1)) < 0)
        rc = util_fail(err, errlen, (int)n, "reading the manifest on standard input: %s", strerror((int)-n));
    else if (!rc && (size_t)n > cap)
        rc = util_fail(err, errlen, -EFBIG, "the manifest on standard input is over %zu bytes", cap);
    if (!rc) {
        (*toml)[n] = 0;
        manifest_defaults(*m);
        if (!(rc = manifest_parse(*m, *toml, n, "standard input", err, errlen)) &&
            !(rc = manifest_validate(*m, err, errlen)) && params_table_init(tab, &(*m)->model))
            rc = util_fail(err, errlen, -ENOMEM, "out of memory");
    }
    return rc;
}

/* checkpointd --job NAME --load WHAT: LOAD without a coordinator to answer, for the agent of
 * a host other than the coordinator's (job.hosts > 1), which has no control socket of its
 * own: the job's resolved manifest comes on standard input, WHAT goes into NAME's staging
 * segment (its header then holds the step and the cursor, or step -1 for a fresh start), and
 * the exit status says whether it worked (the reason on stderr). */
static int run_load(const char *job, const char *what)
{
    char err[1024], path[PATH_MAX] = "";
    char *toml = NULL;
    manifest_t *m = NULL;
    param_table_t tab = {0};
    shm_seg_t *seg = NULL;
    int rc = read_manifest(&m, &toml, &tab, err, sizeof(err));
    if (!rc)
        rc = shm_attach(&seg, job, STAGING_SEG, err, sizeof(err));
    if (!rc)
        rc = restore_load(what, m, &tab, shm_data(seg), stderr, path, sizeof(path), err, sizeof(err));
    if (rc)
        fprintf(stderr, "checkpointd: %s\n", err);
    shm_detach(&seg);
    params_table_free(&tab);
    free(m);
    free(toml);
    return rc ? 1 : 0;
}

/* checkpointd --job NAME-hK --save-part TMPNAME --step N: SAVE_PART for the agent of host K
 * (job.hosts > 1), which has no control socket of its own: the job's resolved manifest (host
 * K's, job.host_rank = K) on standard input, part K of the snapshot of step N in NAME-hK's
 * staging segment written into checkpoint.folder/TMPNAME at SCHED_IDLE (training goes on
 * meanwhile), then one line `written BYTES SECONDS` on standard output and status 0; on
 * failure the reason on stderr and status 1 (the part's files removed). */
static int run_save_part(const char *job, const char *tmp_name, int64_t step)
{
    ckd_t d = {0};
    char err[1024];
    manifest_t *m = NULL;
    const char *delay = getenv("CTITAN_TEST_CKPT_DELAY_MS");
    d.delay_ms = delay ? atoi(delay) : 0;
    int rc = read_manifest(&m, &d.toml, &d.tab, err, sizeof(err));
    d.m = m;
    if (!rc)
        d.opt = optim_find(m->optimizer_name);
    if (!rc && m->hosts < 2)
        rc = util_fail(err, sizeof(err), -EINVAL, "job.hosts = %d: --save-part is a host's part of a checkpoint "
                       "across hosts", m->hosts);
    if (!rc && !(rc = shm_attach(&d.seg, job, STAGING_SEG, err, sizeof(err))))
        rc = staging_check(shm_data(d.seg), d.tab.total, optim_arrays(d.opt), err, sizeof(err));
    if (!rc) {
        manifest_ckpt_folder(m, d.folder, sizeof(d.folder));
        rc = host_parts(&d, err, sizeof(err));
    }
    struct sched_param none = {0};
    if (!rc && sched_setscheduler(0, SCHED_IDLE, &none))
        fprintf(stderr, "checkpointd: cannot lower itself to SCHED_IDLE; it runs at normal priority\n");
    uint64_t bytes = 0;
    double t0 = util_now();
    if (!rc)
        rc = save_part(&d, step, tmp_name, m->host_rank, &bytes, err, sizeof(err));
    if (rc)
        fprintf(stderr, "checkpointd: %s\n", err);
    else
        printf("written %" PRIu64 " %.3f\n", bytes, util_now() - t0);
    shm_detach(&d.seg);
    params_table_free(&d.tab);
    free(d.ranges);
    free(d.toml);
    free(m);
    return rc ? 1 : 0;
}

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { stop_flag = sig; }

static void usage(FILE *f)
{
    fprintf(f, "usage:\n"
               "  checkpointd --listen tcp://ADDR:PORT --dir DIR --key SERVER.key --allow TRAINERS.pub\n"
               "      receive checkpoints from trainers (storage host); keys from `ctitan ckpt keygen`\n"
               "  checkpointd --job NAME\n"
               "      the local daemon of a job (started by `ctitan launch` with [checkpoint] enable or load)\n"
               "  checkpointd --job NAME --load latest|DIR < MANIFEST\n"
               "      reads a checkpoint into the job's staging segment and exits (a host's agent runs it)\n"
               "  checkpointd --job NAME-hK --save-part .tmp-step-NNNNNNNN.PID --step N < MANIFEST\n"
               "      writes host K's part of the checkpoint of step N from the staging segment into\n"
               "      checkpoint.folder/.tmp-step-NNNNNNNN.PID, prints `written BYTES SECONDS` and exits\n"
               "      (a host's agent runs it; host 0's checkpointd commits the parts)\n");
}

int main(int argc, char **argv)
{
    const char *listen = NULL, *dir = NULL, *key = NULL, *allow = NULL, *job = NULL, *load = NULL;
    const char *part = NULL, *step = NULL;
    for (int i = 1; i < argc; i++) {
        const char **dst = !strcmp(argv[i], "--listen")    ? &listen
                         : !strcmp(argv[i], "--dir")       ? &dir
                         : !strcmp(argv[i], "--key")       ? &key
                         : !strcmp(argv[i], "--allow")     ? &allow
                         : !strcmp(argv[i], "--job")       ? &job
                         : !strcmp(argv[i], "--load")      ? &load
                         : !strcmp(argv[i], "--save-part") ? &part
                         : !strcmp(argv[i], "--step")      ? &step
                                                           : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!dst || i + 1 >= argc) {
            fprintf(stderr, "checkpointd: %s '%s'\n", dst ? "missing the value of" : "unknown option", argv[i]);
            usage(stderr);
            return 2;
        }
        *dst = argv[++i];
    }
    if (part || step) {
        char *end = NULL;
        long long s = step ? strtoll(step, &end, 10) : -1;
        if (!job || !part || load || !step || !*step || *end || s < 0 || s > CKPT_STEP_MAX) {
            fprintf(stderr, "checkpointd: --save-part needs --job NAME-hK and --step N (0 to %d), and no --load\n",
                    CKPT_STEP_MAX);
            usage(stderr);
            return 2;
        }
        return run_save_part(job, part, (int64_t)s);
    }
    if (job && load)
        return run_load(job, load);
    if (job)
        return run_worker();
    if (!listen || !dir || !key || !allow) {
        fprintf(stderr, "checkpointd: --listen, --dir, --key and --allow are all needed\n");
        usage(stderr);
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    char err[1024];
    int rc = rmt_serve(listen, dir, key, allow, &stop_flag, stdout, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "checkpointd: %s\n", err);
        return 1;
    }
    return 0;
}
