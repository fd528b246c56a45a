/* The data plane of one stage process: its links to its pipeline neighbours, which carry each
 * microbatch's activations forward (act_in from rank - 1, act_out to rank + 1) and their
 * gradients backward (grad_in from rank + 1, grad_out to rank - 1), one slot per hand-off, in
 * the backend's memory and dtype (kernels/backend.h: host fp32 on the CPU, device bf16 on
 * CUDA), and the data-parallel exchanges a transport makes around a step. stages/roles/stage.c sees
 * only this; set-up picks the transport:
 *
 *   shm   the act segment's shared-memory rings (stages/job/job.h), payload in the slots (CPU)
 *   ipc   device rings exported with CUDA IPC (stages/job/devdir.h), ordered by those same rings,
 *         whose slots then carry only the tags, and interprocess events
 *   nccl  NCCL point-to-point links, M slots each, and the replicas' reduce-scatter of the
 *         gradients / all-gather of the weights (no act segment)
 *
 * (A ZeroMQ TCP transport across hosts would be one more: stages/runtime/plane_link.h is a link's side.)
 *
 * Receiving: plane_recv waits for the link's next slot, which must carry (step, mb), and
 * plane_done gives it back once the model is done with it. Sending: plane_reserve waits for a
 * free slot, plane_send publishes it tagged with the (step, mb) given to reserve. One slot per
 * link at a time. On the device transports, "done with it" and "filled it" mean the work queued
 * so far on the model's stream: the stream, not the host, waits for a slot's arrival or its
 * last reader. Time the host spends blocked in these calls is counted (plane_waited).
 *
 * Functions return 0 or -errno, plane_error() saying why. */
#ifndef CTITAN_PLANE_H
#define CTITAN_PLANE_H

#include <stddef.h>
#include <stdint.h>

#include "ipc/ring.h"
#include "kernels/cuda/cuda_nccl.h"
#include "kernels/cuda/cuda_plugin.h"
#include "stages/job/job.h"

typedef enum { PLANE_ACT_IN, PLANE_ACT_OUT, PLANE_GRAD_IN, PLANE_GRAD_OUT, PLANE_LINKS } plane_link_t;

typedef struct plane plane_t;

/* Where a stage sits, and (device transports) what orders its hand-offs. */
typedef struct {
    const job_layout_t *lay;
    const char *job;          /* the job's segments */
    int replica, rank;        /* rank 0 has no act_in / grad_out, rank pp - 1 no act_out / grad_in */
    int vstage;               /* shm: the virtual stage whose links these are (a rank with several
                               * chunks has a plane per chunk; virtual stage 0 has no act_in /
                               * grad_out, lay->S - 1 no act_out / grad_in); the device transports
                               * take one stage per rank (vstage = rank) */
    const cuda_plugin_t *cu;  /* ipc, nccl */
    void *stream;             /* ipc, nccl: the model's stream (backend_t.model_stream) */
} plane_cfg_t;

/* Each returns 0 or -errno with err. */
int plane_shm_new(plane_t **out, const plane_cfg_t *c, char *err, size_t errlen);
/* devdir: the device directory segment; this stage's entry there must hold everything but its
 * rings, which this fills before it marks the entry ready and maps the neighbours' rings. */
int plane_ipc_new(plane_t **out, const plane_cfg_t *c, void *devdir, char *err, size_t errlen);
/* ids: the coordinator's communicator ids (stages/job/job.h's JOB_NCCL_* order); w, g: the model's
 * device weights (bf16) and gradients of n elements (backend_t.model_buffers), which the
 * replicas all-gather and reduce-scatter. Joins every communicator (blocks until the
 * neighbours and replicas have). */
int plane_nccl_new(plane_t **out, const plane_cfg_t *c, const cuda_nccl_id_t *ids, void *w, float *g, size_t n,
                   char *err, size_t errlen);
void plane_destroy(plane_t **p);

int plane_recv(plane_t *p, plane_link_t l, int64_t step, int mb, void **slot);
int plane_done(plane_t *p, plane_link_t l);
int plane_reserve(plane_t *p, plane_link_t l, int64_t step, int mb, void **slot);
int plane_send(plane_t *p, plane_link_t l);

/* Before a step's first action and after its last (nccl: the replicas' weights gathered;
 * their gradients reduced and every send on its way). */
int plane_step_begin(plane_t *p);
int plane_step_end(plane_t *p);

/* Seconds the host spent blocked in the calls above since the last call to this. */
double plane_waited(plane_t *p);
const char *plane_error(const plane_t *p);

/* The next slot of a shared-memory ring, which must carry (step, mb): the shm links' and the
 * loader's token and target rings alike (stage.c). Adds the seconds blocked to *waited.
 * Returns 0 or -errno with err (-EPROTO: other tags). */
int plane_ring_take(ring_t *r, int64_t step, int mb, void **payload, double *waited, char *err, size_t errlen);

#endif
