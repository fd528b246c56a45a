/* checkpoint.load (see coord_priv.h): before any other process starts, checkpointd resolves
 * the checkpoint, checks it and reads it into the staging segment (LOAD ... LOADED; the
 * format is checkpointd's alone: checkpointd/restore.h). The run then starts after its step
 * at its loader cursor, and the optimizer shards copy their slices from the staging segment
 * as they set up. */
#include "stages/coord/coord_priv.h"

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
#include "stages/job/staging.h"

const char *coord_on_loaded(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    if (!c->loading || !c->load_sent)
        return "no checkpoint is being loaded";
    c->loading = c->load_sent = 0;
    c->load_ok = m->ok;
    snprintf(c->load_text, sizeof(c->load_text), "%s", m->text ? m->text : "");
    c->load_step = m->step;
    if (m->data_len > sizeof(c->resume_cursor)) {
        c->load_ok = 0;
        snprintf(c->load_text, sizeof(c->load_text), "checkpointd: a loader cursor of %zu bytes (at most %zu)",
                 m->data_len, sizeof(c->resume_cursor));
        return NULL;
    }
    if (m->data_len)
        memcpy(c->resume_cursor, m->data, m->data_len);
    c->resume_cursor_len = (uint32_t)m->data_len;
    return NULL;
}

static int loaded(coord_t *c, void *arg) { return !c->loading; }

/* Starts checkpointd, sends it LOAD of checkpoint.load and waits for LOADED. Returns 0 with
 * the answer in c->load_*, or -1 when the job failed or was interrupted meanwhile. */
static int exchange(coord_t *c)
{
    coord_proc_t *d = coord_ckptd(c);
    c->loading = 1; /* from its start on: a checkpointd lost now fails the job (coord_reap) */
    coord_spawn(c, d);
    if (coord_pump(c, coord_proc_ready, d, COORD_STARTUP_TIMEOUT_S) == -ETIMEDOUT)
        coord_fail_proc(c, coord_ckptd(c), "checkpointd did not become ready in %.0f s", COORD_STARTUP_TIMEOUT_S);
    if (c->failed || c->interrupted)
        return -1;
    msg_t load = {.type = MSG_LOAD, .text = c->m->ckpt_load, .text_len = strlen(c->m->ckpt_load)};
    coord_send(c, d, &load);
    c->load_sent = 1;
    return coord_pump(c, loaded, NULL, 1e9) ? -1 : 0;
}

int coord_resume(coord_t *c, char *err, size_t errlen)
{
    manifest_t *m = c->m;
    if (!m->ckpt_load[0])
        return 0;
    if (exchange(c))
        return -1;
    if (!c->load_ok)
        return util_fail(err, errlen, -EIO, "%s", c->load_text);
    if (!c->load_text[0]) {
        char folder[PATH_MAX];
        manifest_ckpt_folder(m, folder, sizeof(folder));
        printf("checkpoint: none in %s: starting from step 0\n", folder);
    } else if (strlen(c->load_text) >= sizeof(m->ckpt_load)) {
        return util_fail(err, errlen, -ENAMETOOLONG, "checkpoint path %s is too long", c->load_text);
    } else {
        c->step = c->load_step;
        printf("checkpoint: resuming from %s (after step %lld)\n", c->load_text, (long long)c->step);
    }
    /* every other process gets the directory loaded, or "" for a fresh start */
    memcpy(m->ckpt_load, c->load_text, strlen(c->load_text) + 1);
    free(c->toml);
    if (!(c->toml = manifest_to_toml(m)))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if (!m->ckpt_enable) /* it only loads: no SAVE follows */
        coord_stop_proc(c, coord_ckptd(c));
    return c->failed || c->interrupted ? -1 : 0;
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
    if (h->cursor_len > sizeof(c->resume_cursor))
        return util_fail(err, errlen, -EBADMSG, "host %d: the staging segment holds a loader cursor of %u bytes (at "
                         "most %zu)", m->host_rank, h->cursor_len, sizeof(c->resume_cursor));
    printf("launch: host %d: checkpoint of step %lld loaded\n", m->host_rank, (long long)step);
    fflush(stdout);
    return 0;
}
