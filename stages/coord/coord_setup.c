/* The coordinator's set-up before any process starts (see coord_setup.h): the control
 * endpoint, signal handling, and the job's shared segments (each formatted by the module that
 * owns its layout: job.h, staging.h, ldr_seg.h), and their rings. */
#include "stages/coord/coord_setup.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "ipc/log.h"
#include "ipc/util.h"
#include "stages/job/devdir.h"
#include "stages/job/ldr_seg.h"
#include "stages/job/staging.h"
#include "stages/runtime/plane.h"

int coord_resolve_endpoint(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    if (m->endpoint[0]) {
        snprintf(c->endpoint, sizeof(c->endpoint), "%s", m->endpoint);
        return 0;
    }
    char abs[PATH_MAX];
    if (!realpath(m->dump_folder, abs))
        return util_fail(err, errlen, -errno, "job.dump_folder %s: %s", m->dump_folder, strerror(errno));
    int n = snprintf(c->sock_path, sizeof(c->sock_path), "%s/ctl.sock", abs);
    if (n >= 100) /* sun_path holds 108 bytes */
        return util_fail(err, errlen, -ENAMETOOLONG,
                         "control socket path %s is too long for a Unix socket: set job.endpoint "
                         "(e.g. ipc:///tmp/%s.sock) or a shorter job.dump_folder", c->sock_path, m->name);
    snprintf(c->endpoint, sizeof(c->endpoint), "ipc://%.200s", c->sock_path); /* < 100 bytes, checked */
    return 0;
}

int coord_setup_signals(coord_t *c)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
        return -errno;
    signal(SIGPIPE, SIG_IGN);
    c->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    return c->sigfd < 0 ? -errno : 0;
}

void coord_read_signals(coord_t *c)
{
    struct signalfd_siginfo si;
    while (read(c->sigfd, &si, sizeof(si)) == sizeof(si))
        if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM || si.ssi_signo == SIGHUP)
            c->interrupted = (int)si.ssi_signo;
}

/* Segments of this job name left by an earlier run: refused while their coordinator runs,
 * removed when it is gone. */
static int clear_stale(coord_t *c, char *err, size_t errlen)
{
    char names[256][SHM_NAME_MAX];
    if (shm_list(c->job, names, 256) <= 0)
        return 0;
    shm_seg_t *old = NULL;
    if (shm_attach(&old, c->job, "job", NULL, 0) == 0) {
        job_hdr_t h = *(job_hdr_t *)shm_data(old);
        shm_detach(&old);
        if (h.magic == JOB_MAGIC && job_owner_alive(&h))
            return util_fail(err, errlen, -EBUSY,
                             "job '%s' is already running (coordinator pid %lld): stop it or set job.name", c->job,
                             (long long)h.owner_pid);
    }
    int removed = shm_remove_all(c->job);
    LOG_W("removed %d stale shared-memory segments of job '%s' left by an earlier run that did not "
          "shut down", removed, c->job);
    return 0;
}

/* While the segments' pages are touched (seconds for a large model): a Ctrl-C gives the set-up
 * up at once, and after 2 s a line every 2 s says how far it is. */
static int setup_progress(void *arg, const char *name, size_t done, size_t total)
{
    coord_t *c = arg;
    coord_read_signals(c);
    if (c->interrupted)
        return 1;
    double s = util_every_due(&c->setup_say);
    if (s >= 0) {
        printf("launch: set-up: making the shared-memory segment %s.%s: %.1f of %.1f GiB (%.0f s)\n", c->job, name,
               (double)done / (1 << 30), (double)total / (1 << 30), s);
        fflush(stdout);
    }
    return 0;
}

static int make_segments(coord_t *c, char *err, size_t errlen);

int coord_make_segments(coord_t *c, char *err, size_t errlen)
{
    shm_progress_hook(setup_progress, c);
    int rc = make_segments(c, err, errlen);
    shm_progress_hook(NULL, NULL);
    return rc;
}

static int make_segments(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    const job_layout_t *l = &c->lay;
    int rc = clear_stale(c, err, errlen);
    if (rc || (rc = job_seg_create(&c->seg_job, c->job, l, err, errlen)))
        return rc;
    c->segs_made = 1;
    c->hdr = shm_data(c->seg_job);
    if ((rc = shm_create(&c->seg_params, c->job, "params", job_params_bytes(l), err, errlen)) ||
        (!l->gpu_shards && (rc = shm_create(&c->seg_grads, c->job, "grads", job_params_bytes(l), err, errlen))) ||
        (l->gpu && (rc = shm_create(&c->seg_dev, c->job, DEVDIR_SEG, devdir_bytes(l), err, errlen))) ||
        (l->S > 1 && plane_uses_act_segment(plane_transport(l)) &&
         (rc = job_act_create(&c->seg_act, c->job, l, err, errlen))) ||
        (job_fsdp_bytes(l) && (rc = shm_create(&c->seg_fsdp, c->job, JOB_FSDP_SEG, job_fsdp_bytes(l), err, errlen))) ||
        (!l->gpu_shards && m->host_rank == 0 &&
         (rc = job_optstate_create(&c->seg_opt, c->job, l, m->shards, err, errlen))))
        return rc;
    /* checkpointd loads into it too (coord_resume.c) */
    if (manifest_snapshots(m) || manifest_loads(m))
        rc = staging_create(&c->seg_ckpt, c->job, l->total, l->arrays, err, errlen);
    return rc;
}

int coord_make_batch(coord_t *c, int64_t step, const uint8_t *cursor, size_t len, char *err, size_t errlen)
{
    shm_detach(&c->seg_batch);
    shm_unlink_name(c->job, LDR_SEG_NAME); /* an earlier one's (a rewind, a relaunched coordinator's START) */
    return ldr_seg_create(&c->seg_batch, c->job, c->m, step, cursor, len, err, errlen);
}

void coord_each_ring(coord_t *c, void (*fn)(ring_t *r), int loader)
{
    const job_layout_t *l = &c->lay;
    ring_t *r;
    for (int rep = 0; c->seg_act && rep < l->dp; rep++)
        for (int b = 0; b < l->S - 1; b++)
            for (int g = 0; g < 2; g++)
                if (!ring_attach(&r, (char *)shm_data(c->seg_act) + job_act_off(l, rep, b, g), l->act_ring, "act",
                                 NULL, 0)) {
                    fn(r);
                    ring_detach(&r);
                }
    for (int i = 0; loader && i < 2 * l->dp; i++)
        if (!ldr_seg_ring(shm_data(c->seg_batch), i, &r, NULL, 0)) {
            fn(r);
            ring_detach(&r);
        }
}

static void reset(ring_t *r) { ring_reset(r, 0); }

void coord_reset_rings(coord_t *c)
{
    coord_each_ring(c, reset, 0);
    if (c->seg_fsdp) /* parameter sharding's exchanges open again, from sequence 0 */
        job_fsdp_set_closed(shm_data(c->seg_fsdp), &c->lay, 0);
}

void coord_remove_segments(coord_t *c)
{
    shm_seg_t **segs[] = {&c->seg_job,   &c->seg_params, &c->seg_grads, &c->seg_act,  &c->seg_batch,
                          &c->seg_ckpt,  &c->seg_dev,    &c->seg_opt,   &c->seg_fsdp};
    for (size_t i = 0; i < sizeof(segs) / sizeof(segs[0]); i++)
        shm_detach(segs[i]);
    if (c->segs_made && c->interrupted) /* a Ctrl-C does not wait for the kernel to free them */
        shm_remove_all_async(c->job);
    else if (c->segs_made)
        shm_remove_all(c->job);
}
