/* The data plane: every byte of a step that moves between processes, over one of the
 * transports below, picked by name. Two faces:
 *
 *   a stage's plane (plane_new): its links to its pipeline neighbours, which carry each
 *     microbatch's activations forward (act_in from the previous virtual stage, act_out to the
 *     next) and their gradients backward (grad_in, grad_out), one slot per hand-off, in the
 *     backend's memory and dtype (kernels/backend.h: host fp32 on the CPU, device bf16 on
 *     CUDA); the loader's rings of tokens (the first virtual stage) and targets (the last),
 *     host int32 on every transport; and the data-parallel exchanges a transport makes around
 *     a step.
 *   an optimizer shard's view (plane_reduce_new): where each replica holds the weights and
 *     gradients of the shard's slice; the replicas' gradients summed (in replica order) and
 *     the new weights written back to every replica.
 *
 * The transports (stages/roles/stage.c and optshard.c see only this header):
 *
 *   shm   job.device "cpu": the act segment's shared-memory rings (stages/job/job.h), payload
 *         in the slots
 *   ipc   job.device "cuda" on one host: device rings exported with CUDA IPC (stages/job/
 *         devdir.h), ordered by those same rings, whose slots then carry only the tags, and
 *         interprocess events
 *   nccl  parallelism.data_plane "nccl": NCCL point-to-point links, M slots each; the replicas
 *         reduce-scatter the gradients and all-gather the weights, so a shard maps only the
 *         one stage (beside it) that holds its slice's sum
 *
 * Parameter sharding (parallelism.data_parallel_shard_degree, DESIGN.md "Parameter sharding"):
 * plane_shard_io gives the model its group's exchange, piece by piece: on shm the group shares
 * one copy of the weights and its members reduce-scatter each piece's gradients through the
 * fsdp segment (stages/runtime/fsdp.h); on nccl each member keeps its chunk of the stage's
 * weights and gradients, each piece's weights are broadcast from their owners before it runs
 * and its gradients reduced to them after its W.
 *
 * A shard on the CPU (a CPU job, or offload: [optshard] device "cpu") reads every replica's
 * part of the params and grads segments; one on the GPU maps the stages' device buffers.
 *
 * (A ZeroMQ TCP transport across hosts would be one more row: stages/runtime/plane_link.h.)
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

#include "kernels/backend.h"
#include "stages/job/job.h"

typedef enum {
    PLANE_ACT_IN,
    PLANE_ACT_OUT,
    PLANE_GRAD_IN,
    PLANE_GRAD_OUT,
    PLANE_TOKENS,   /* from the loader: [mb, T] int32 inputs (the first virtual stage) */
    PLANE_TARGETS,  /* from the loader: [mb, T] int32 targets (the last virtual stage) */
    PLANE_LINKS
} plane_link_t;

/* How a job on a transport comes back from a lost stage or optimizer shard (DESIGN.md
 * "Recovery"): the one process replaced while the others run on (its state lives in shared
 * memory); every stage started again, the shards keeping theirs (a stage's neighbours map its
 * device memory, which dies with it); or the whole job back to its newest snapshot. */
typedef enum { PLANE_RECOVER_IN_PLACE, PLANE_RECOVER_RESTAGE, PLANE_RECOVER_REWIND } plane_recovery_t;

typedef struct plane plane_t;

/* The transport of a job: "shm", "ipc" or "nccl". */
const char *plane_transport(const job_layout_t *l);
/* What a transport declares (the name must be one of the above). */
plane_recovery_t plane_recovery(const char *transport);
/* Whether the transport orders its hand-offs with the act segment's rings (job_act_create). */
int plane_uses_act_segment(const char *transport);

/* Where a stage sits, and what its plane needs. */
typedef struct {
    const job_layout_t *lay;
    const char *job;          /* the job's segments */
    int replica, rank;
    int vstage;               /* the virtual stage whose links these are (a rank with several
                               * chunks has a plane per chunk; the device transports take one
                               * stage per rank: vstage = rank); virtual stage 0 has no act_in /
                               * grad_out and takes tokens, lay->S - 1 no act_out / grad_in and
                               * takes targets */
    /* the device transports */
    void *stream;             /* the model's stream (backend_t.model_stream) */
    int device;               /* the ordinal the stage computes on */
    void *w;                  /* the model's weights (backend dtype) and gradients of the range */
    float *g;                 /* [begin, end) of the flat space (backend_t.model_buffers: with
                               * parameter sharding on a device, the replica's part) */
    size_t begin, end;
    size_t stage_begin, stage_end; /* the virtual stage's whole range */
    /* called around each wait for other replicas in plane_shard_io's exchange (may be NULL) */
    void (*waiting)(void *arg, int on);
    /* what the coordinator hands this stage for its transport after its config (plane_boot),
     * fetched when the transport needs it: fills buf (at most cap bytes), returns its length
     * or -errno */
    long (*boot)(void *arg, void *buf, size_t cap);
    void *arg;
} plane_cfg_t;

/* Stage side: the plane of cfg over `transport`. Joins what the transport joins (NCCL: blocks
 * until the neighbours and replicas have). Returns 0 or -errno with err. */
int plane_new(plane_t **out, const char *transport, const plane_cfg_t *c, char *err, size_t errlen);
void plane_destroy(plane_t **p);

int plane_recv(plane_t *p, plane_link_t l, int64_t step, int mb, void **slot);
int plane_done(plane_t *p, plane_link_t l);
int plane_reserve(plane_t *p, plane_link_t l, int64_t step, int mb, void **slot);
int plane_send(plane_t *p, plane_link_t l);

/* Before a step's first action and after its last (nccl: the replicas' weights gathered;
 * their gradients reduced and every send on its way; with GPU optimizer shards the stream waits
 * for their last update first, and on the IPC plane the step's end records the event the
 * shards wait on before they read the gradients). */
int plane_step_begin(plane_t *p, int64_t step);
int plane_step_end(plane_t *p);
/* Whether the readers of this stage's gradients wait for them on the device (the IPC plane
 * with GPU shards: plane_step_end's event), so the stage need not wait for its device at a
 * step's end; else it must before it answers (the shards, or the host, read them then). */
int plane_grads_ordered(const plane_t *p);

/* With parameter sharding (lay->fsdp > 1), what the model takes its pieces' weights from and
 * gives their gradients to (backend_t.model_shard); without, *io all NULL. Returns 0 or -errno
 * (-ENOTSUP: the transport has no sharding). A wait in it returns -ECANCELED once the
 * coordinator closed the exchanges for a recovery. */
int plane_shard_io(plane_t *p, shard_io_t *io);

/* Seconds the host spent blocked in the calls above since the last call to this. */
double plane_waited(plane_t *p);
const char *plane_error(const plane_t *p);

/* ---- the coordinator's part ---- */

/* What the transport needs made once per run by the coordinator (NCCL: every communicator's
 * id, made here: this process hosts their bootstrap roots), as bytes; *len 0 when nothing
 * (*boot NULL). The caller frees *boot. Returns 0 or -errno with err. */
int plane_boot_make(const char *transport, const job_layout_t *l, void **boot, size_t *len, char *err,
                    size_t errlen);
/* Stage (replica, rank)'s share of it, what plane_cfg_t.boot hands that stage, into buf (cap
 * bytes). Returns its length (0: none for this transport), or -EINVAL. */
long plane_boot_share(const char *transport, const job_layout_t *l, const void *boot, int replica, int rank,
                      void *buf, size_t cap);

/* ---- an optimizer shard's view of the replicas ---- */

typedef struct plane_reduce plane_reduce_t;

/* Where shard k runs: beside stage (*replica, *rank) when the transport sums the replicas into
 * that stage's memory (nccl: shard k = rank * job_chunks + replica), else *replica = -1. */
void plane_shard_beside(const char *transport, const job_layout_t *l, int k, int *replica, int *rank);
/* Shard k's view of slice [begin, end) over `transport`, its sums in the backend's memory on
 * `stream`: the parts of every replica that holds some of the slice (shm: the params and grads
 * segments of job for CPU shards; for GPU shards the stages' buffers, mapped through their
 * device directory entries, waited for as they set up). Returns 0 or -errno with err. */
int plane_reduce_new(plane_reduce_t **out, const char *transport, const job_layout_t *l, const char *job, int k,
                     size_t begin, size_t end, const backend_t *be, void *stream, char *err, size_t errlen);
void plane_reduce_destroy(plane_reduce_t **r);
/* The replicas' gradients of the slice summed in replica order: *sum points at them (in the
 * backend's memory; the one part itself when a single part holds the whole slice). On the IPC
 * plane the shard's stream first waits for the stages' gradients events (plane_step_end). */
int plane_reduce_sum(plane_reduce_t *r, const float **sum);
/* Offload in bf16 (job_layout_t host_bf16; CPU shards): the host copies' gradients are bf16, and
 * plane_reduce_sum refuses; plane_reduce_sum_range writes the replicas' sum of flat elements
 * [lo, lo + n) of the slice into dst (fp32, host), in replica order: the fp32 sum of the same
 * values bit for bit. plane_reduce_bf16 says which of the two a shard uses. */
int plane_reduce_bf16(const plane_reduce_t *r);
int plane_reduce_sum_range(plane_reduce_t *r, size_t lo, size_t n, float *dst);
/* Every replica's weights of the slice from `master` (fp32, the slice's length, converted to
 * the backend's weight dtype) and their gradients cleared. `written`: the optimizer's step
 * already did both where plane_reduce_out said it could (a GPU shard's step writes them in its
 * own pass). On the CPU it returns once done; a GPU shard's returns at once, having recorded
 * the event the stages' streams wait on before their next step (devdir_shard_t): a caller that
 * reads the result from the host, or another stream, syncs the shard's stream first. */
int plane_reduce_publish(plane_reduce_t *r, const float *master, int written);
/* Where the optimizer's step may write the new weights and clear the gradients itself, for the
 * slice's elements from flat index `at`: 1 with *w (the backend's dtype) and *g at `at` in the
 * one stage buffer that holds them, *n = how many of them it holds from there; 0 when the
 * publish must (CPU shards, whose gradients stay whole until the commit; a slice that several
 * replicas hold). */
int plane_reduce_out(const plane_reduce_t *r, size_t at, void **w, float **g, size_t *n);
/* The stages were started again (a stage was lost): the old mappings go, the new stages' are
 * made (GPU shards; nothing for CPU ones). */
int plane_reduce_remap(plane_reduce_t *r);
/* Why the last call failed. */
const char *plane_reduce_error(const plane_reduce_t *r);

#endif
