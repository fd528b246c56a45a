/* NVIDIA's Multi-Process Service for one host's part of a job (job.mps). Without it the job's
 * processes on one GPU (a stage and its GPU optimizer shards; two stages at pipeline 2 on one
 * GPU) are time-sliced: the GPU runs one process's kernels at a time and switches between them.
 * Under MPS their kernels share the GPU at once. `ctitan launch` (host 0's supervisor, or another
 * host's agent) starts a private control daemon, `nvidia-cuda-mps-control -f`, as its own child
 * (its own process group, so a Ctrl-C reaches the job first; its parent-death signal ends it
 * with the launch), in /tmp/ctitan-mps-UID-JOB-hHOST/{pipe,log}, and exports
 * CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY: every process of the job started after
 * (the coordinator, its workers, their replacements and a relaunched run) finds the daemon
 * there; CUDA starts the daemon's server with the first client. The daemon sees every GPU of
 * the host (its CUDA_VISIBLE_DEVICES is unset), so the clients' own CUDA_VISIBLE_DEVICES keeps
 * its meaning. A client that cannot reach the daemon runs without MPS, as CUDA does anyway. */
#ifndef CTITAN_MPS_H
#define CTITAN_MPS_H

#include <stddef.h>
#include <sys/types.h>

#include "stages/job/manifest.h"

#define MPS_CONTROL "nvidia-cuda-mps-control"

typedef struct {
    pid_t pid;          /* the control daemon, a child of this process; 0: none started */
    int pidfd;          /* its pidfd (signals reach it and no process that reuses the pid); -1 */
    char dir[160];      /* its folder: pipe/ and log/ */
} mps_t;

/* Starts the daemon where m->mps asks: "on" always (for a GPU job), "auto" where `sharing` (the
 * most of this host's processes on one GPU: plan_gpu_sharing) is 2 or more and MPS_CONTROL is
 * on PATH, "off" never; nor where CUDA_MPS_PIPE_DIRECTORY is set already (the job then uses
 * that daemon). A folder left by a launch killed outright is cleared first (its daemon told to
 * quit). Says on stderr what it did. Returns 0 (started, or not wanted: s->pid 0), or -1 with
 * err (job.mps "on" and no daemon could be started: nothing is left behind). */
int mps_start(mps_t *s, const manifest_t *m, int sharing, char *err, size_t errlen);

/* Whether MPS_CONTROL is on PATH. */
int mps_available(void);

/* The daemon told to quit (its server leaves the GPU with it), waited for (a few seconds, then
 * killed), its folder removed and the two variables unset. Nothing when none was started. */
void mps_stop(mps_t *s);

#endif
