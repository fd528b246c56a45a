/* checkpoint.load (see coord_resume.h): before any other process starts, checkpointd resolves
 * the checkpoint, checks it and reads it into the staging segment (LOAD ... LOADED; the
 * format is checkpointd's alone: checkpointd/restore.h). The run then starts after its step
 * at its loader cursor, and the optimizer shards copy their slices from the staging segment
 * as they set up. */
#include "stages/coord/coord_resume.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/log.h"
#include "ipc/util.h"
#include "stages/coord/coord_ctl.h"
#include "stages/coord/coord_outcome.h"
#include "stages/coord/coord_proc.h"
#include "stages/job/staging.h"

struct coord_resume {
    int loading;                      /* checkpointd started for a LOAD, LOADED not yet here */
    int load_sent;                    /* ... and LOAD was sent to it */
    int load_ok;
    char load_text[1536];             /* LOADED's text: the directory, "" (none there), or why not */
    int64_t load_step;
    uint8_t cursor[LDR_CURSOR_MAX];   /* the loader's, from the checkpoint loaded */
    size_t cursor_len;
    coord_start_t start;              /* where the run started */
};

static const char *on_loaded(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    struct coord_resume *r = c->res;
    if (!r->loading || !r->load_sent)
        return "no checkpoint is being loaded";
    r->loading = r->load_sent = 0;
    p->no_restart = 0;
    r->load_ok = m->ok;
    snprintf(r->load_text, sizeof(r->load_text), "%s", m->text ? m->text : "");
    r->load_step = m->step;
    if (m->data_len > sizeof(r->cursor)) {
        r->load_ok = 0;
        snprintf(r->load_text, sizeof(r->load_text), "checkpointd: a loader cursor of %zu bytes (at most %zu)",
                 m->data_len, sizeof(r->cursor));
        return NULL;
    }
    if (m->data_len)
        memcpy(r->cursor, m->data, m->data_len);
    r->cursor_len = m->data_len;
    return NULL;
}

int coord_resume_init(coord_t *c)
{
    if (!(c->res = calloc(1, sizeof(*c->res))))
        return -ENOMEM;
    coord_handle(c, MSG_LOADED, COORD_FROM(COORD_CKPTD), on_loaded);
    return 0;
}

void coord_resume_free(coord_t *c)
{
    free(c->res);
    c->res = NULL;
}

const coord_start_t *coord_resume_start(const coord_t *c) { return &c->res->start; }

static int loaded(coord_t *c, void *arg) { return !c->res->loading; }

/* Starts checkpointd, sends it LOAD of checkpoint.load and waits for LOADED. Returns 0 with
 * the answer in c->res, or -1 when the job failed or was interrupted meanwhile. */
static int exchange(coord_t *c)
{
    coord_proc_t *d = coord_ckptd(c);
    c->res->loading = 1;
    coord_spawn(c, d);
    d->no_restart = 1; /* from its start on: a checkpointd lost now fails the job */
    if (coord_pump(c, coord_proc_ready, d, coord_startup_s(c)) == -ETIMEDOUT)
        coord_fail_proc(c, coord_ckptd(c), "checkpointd did not become ready in %.0f s", coord_startup_s(c));
    if (c->failed || c->interrupted)
        return -1;
    msg_t load = {.type = MSG_LOAD, .text = c->m->ckpt_load, .text_len = strlen(c->m->ckpt_load)};
    coord_send(c, d, &load);
    c->res->load_sent = 1;
    return coord_pump(c, loaded, NULL, 1e9) ? -1 : 0;
}

/* The run's start: after c->step, from checkpoint.load as resolved, at the cursor loaded. */
static void note_start(coord_t *c)
{
    coord_start_t *s = &c->res->start;
    s->first_step = c->step;
    s->fresh = !c->m->ckpt_load[0];
    snprintf(s->load, sizeof(s->load), "%s", c->m->ckpt_load);
    memcpy(s->cursor, c->res->cursor, c->res->cursor_len);
    s->cursor_len = c->res->cursor_len;
}

/* Whether checkpointd's LOADED text names a checkpoint it fetched from the storage host
 * ("PATH on ENDPOINT"): one of the run's own, as those of its folder are. */
static int from_storage(const manifest_t *m, const char *text)
{
    size_t n = strlen(text), e = strlen(m->ckpt_endpoint);
    return e && n > e + 4 && !strcmp(text + n - e, m->ckpt_endpoint) && !strncmp(text + n - e - 4, " on ", 4);
}

/* checkpoint.load as checkpointd resolved it. */
static int load(coord_t *c, char *err, size_t errlen)
{
    manifest_t *m = c->m;
    struct coord_resume *r = c->res;
    if (exchange(c))
        return -1;
    if (!r->load_ok) {
        coord_note_load_failed(c);
        return util_fail(err, errlen, -EIO, "%s", r->load_text);
    }
    char folder[PATH_MAX];
    manifest_ckpt_folder(m, folder, sizeof(folder));
    if (!r->load_text[0] && m->ckpt_load[0] && m->ckpt_endpoint[0]) {
        printf("checkpoint: the storage host at %s holds none of job %s: starting from step 0\n", m->ckpt_endpoint,
               m->name);
    } else if (!r->load_text[0] && m->ckpt_load[0]) {
        printf("checkpoint: none in %s: starting from step 0\n", folder);
    } else if (!r->load_text[0]) {
        printf("checkpoint: starting from step 0 (checkpoint.load = none); checkpoints go to %s\n",
               m->ckpt_endpoint[0] ? m->ckpt_endpoint : folder);
    } else if (strlen(r->load_text) >= sizeof(m->ckpt_load)) {
        return util_fail(err, errlen, -ENAMETOOLONG, "checkpoint path %s is too long", r->load_text);
    } else if (m->ckpt_initial_path[0] && strncmp(r->load_text, folder, strlen(folder)) &&
               !from_storage(m, r->load_text)) {
        c->step = r->load_step; /* not one of its own: the start checkpoint.initial_load_path gives */
        if (m->ckpt_initial_hf)
            printf("checkpoint: none of its own in %s: starting from the Hugging Face Llama %s "
                   "(checkpoint.initial_load_path), the optimizer fresh\n", folder, m->ckpt_initial_path);
        else
            printf("checkpoint: none of its own in %s: starting from %s (checkpoint.initial_load_path)\n", folder,
                   r->load_text);
    } else {
        c->step = r->load_step;
        printf("checkpoint: resuming from %s (after step %lld)%s\n", r->load_text, (long long)c->step,
               strcmp(m->ckpt_load, "latest") ? "" : ": checkpoint.load = latest, the default (none starts over, "
               "in a folder of its own)");
    }
    /* every other process gets the directory loaded, or "" for a fresh start */
    memcpy(m->ckpt_load, r->load_text, strlen(r->load_text) + 1);
    free(c->toml);
    if (!(c->toml = manifest_to_toml(m)))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if (!m->ckpt_enable) /* it only loads: no SAVE follows */
        coord_stop_proc(c, coord_ckptd(c));
    return c->failed || c->interrupted ? -1 : 0;
}

int coord_resume(coord_t *c, char *err, size_t errlen)
{
    /* a run that writes checkpoints always asks: checkpointd also makes sure that none it will
     * write replaces a saved step of another run */
    int rc = manifest_loads(c->m) || c->m->ckpt_enable ? load(c, err, errlen) : 0;
    if (!rc)
        note_start(c);
    return rc;
}

/* Runs `checkpointd --job JOB --load DIR` with the resolved manifest on its standard input
 * and waits for it. Returns its wait status, or -errno. */
static int load_once(coord_t *c, const char *dir)
{
    int in[2];
    if (pipe2(in, O_CLOEXEC))
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(in[0]);
        close(in[1]);
        return -e;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        dup2(in[0], 0);
        char exe[PATH_MAX + 32];
        snprintf(exe, sizeof(exe), "%s/checkpointd", c->bin_dir);
        execl(exe, exe, "--job", c->job, "--load", dir, (char *)NULL);
        fprintf(stderr, "ctitan: cannot run %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    close(in[0]);
    util_write_all(in[1], c->toml, strlen(c->toml)); /* a checkpointd that died early says why itself */
    close(in[1]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -errno;
    return st;
}

int coord_resume_host(coord_t *c, const char *dir, int64_t step, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    if (!c->seg_ckpt)
        return util_fail(err, errlen, -ENOENT, "host %d: no staging segment to load %s into (checkpoint.enable "
                         "and checkpoint.load are off in this host's manifest)", m->host_rank, dir);
    int st = load_once(c, dir);
    if (st < 0)
        return util_fail(err, errlen, st, "host %d: cannot run checkpointd to load %s: %s", m->host_rank, dir,
                         strerror(-st));
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        return util_fail(err, errlen, -EIO, "host %d: checkpointd could not load %s (its reason is above)",
                         m->host_rank, dir);
    staging_hdr_t *h = shm_data(c->seg_ckpt);
    if (atomic_load(&h->step) != step)
        return util_fail(err, errlen, -EBADMSG, "host %d: %s holds step %lld; the coordinator resumed after step %lld",
                         m->host_rank, dir, (long long)atomic_load(&h->step), (long long)step);
    if (h->cursor_len > sizeof(c->res->cursor))
        return util_fail(err, errlen, -EBADMSG, "host %d: the staging segment holds a loader cursor of %u bytes (at "
                         "most %zu)", m->host_rank, h->cursor_len, sizeof(c->res->cursor));
    printf("launch: host %d: checkpoint of step %lld loaded\n", m->host_rank, (long long)step);
    fflush(stdout);
    return 0;
}
