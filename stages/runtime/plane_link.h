/* The side of the data plane (plane.h) a transport implements: a row of the transport table
 * (what it declares, how it makes a stage's links, what the coordinator makes for it), this
 * stage's end of each link as a small table of calls, the plane's hooks around a step, and the
 * optimizer shard's view. Included only by stages/runtime/plane*.c; plane.c holds the table and
 * what every transport shares (errors, wait time, the act segment's and the loader's rings, the
 * device directory entry), plane_reduce.c the shard's view. */
#ifndef CTITAN_PLANE_LINK_H
#define CTITAN_PLANE_LINK_H

#include "ipc/ring.h"
#include "ipc/shm.h"
#include "kernels/cuda_plugin.h"
#include "stages/job/devdir.h"
#include "stages/runtime/plane.h"

typedef struct plane_end plane_end_t;

typedef struct {
    int (*recv)(plane_end_t *e, int64_t step, int mb, void **slot);
    int (*done)(plane_end_t *e);
    int (*reserve)(plane_end_t *e, int64_t step, int mb, void **slot);
    int (*send)(plane_end_t *e);
    void (*destroy)(plane_end_t *e); /* frees e */
} plane_end_ops_t;

/* The first member of every transport's end of a link. */
struct plane_end {
    const plane_end_ops_t *ops;
    plane_t *p;
};

typedef struct {
    int (*step_begin)(plane_t *p, int64_t step);
    int (*step_end)(plane_t *p);
    void (*destroy)(plane_t *p); /* the transport's own state, p->ctx */
} plane_ops_t;

/* A row of the transport table. */
typedef struct {
    const char *name;
    plane_recovery_t recovery;
    int act_segment;               /* orders its hand-offs with the act segment's rings */
    int device;                    /* on the GPU: the stages publish a device directory entry, the
                                    * shards map the stages' buffers (else the shm segments) */
    int beside;                    /* the replicas are summed into one stage, beside which the
                                    * shard of that slice runs (plane_shard_beside) */
    /* the stage's links of p->cfg, ends in p->end[]; ops around a step in p->ops (may stay NULL) */
    int (*links)(plane_t *p);
    /* the coordinator's part (NULL: nothing): plane_boot_make, plane_boot_share */
    int (*boot_make)(const job_layout_t *l, void **boot, size_t *len, char *err, size_t errlen);
    long (*boot_share)(const job_layout_t *l, const void *boot, int replica, int rank, void *buf, size_t cap);
    /* parameter sharding's exchange (plane_shard_io; NULL: none on this transport) */
    int (*shard)(plane_t *p, shard_io_t *io);
} plane_transport_t;

extern const plane_transport_t plane_shm, plane_ipc, plane_nccl;
/* The row named `name`, or NULL. */
const plane_transport_t *plane_find(const char *name);

struct plane {
    plane_end_t *end[PLANE_LINKS]; /* NULL where the stage has no such link */
    const plane_transport_t *tr;
    const plane_ops_t *ops;        /* NULL: nothing around a step */
    void *ctx;
    plane_cfg_t cfg;
    job_layout_t lay;              /* cfg.lay points here */
    const cuda_plugin_t *cu;       /* the device transports' */
    shm_seg_t *act;                /* the act segment (act_segment transports) */
    shm_seg_t *batch;              /* the loader's segment (a stage that takes tokens or targets) */
    shm_seg_t *dev;                /* the device directory (device transports) */
    devdir_stage_t *entry;         /* this stage's entry there */
    void *done_ev;                 /* IPC plane, GPU shards: this stage's event after each step's
                                    * gradients (devdir_stage_t.done), which the shards wait on */
    void **shard_ev;               /* GPU shards: the update events of the shards that write into
                                    * this stage (devdir_shard_t), opened at the first step */
    int n_shard_ev;
    double waited;
    char err[512];
};

/* Formats p->err and returns rc (< 0). */
int plane_fail(plane_t *p, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Whether to make streams wait on the neighbours' and the GPU optimizer shards' events: the test
 * hook CTITAN_TEST_NO_EVENT_WAITS=1 drops those waits, so test_launch_gpu can show that the
 * emulated GPU catches a missing one. */
int plane_event_waits(void);
/* Whether the GPU shards' streams wait on the stages' gradients events: the same hook with the
 * value "grads" drops only those (and "1" every wait). */
int plane_grad_waits(void);

/* GPU optimizer shards: `stream` waits until the shards' last UPDATE has written this stage's
 * weights and cleared its gradients (plane_step_begin's wait on the model's stream; a transport
 * that touches them on another stream makes that one wait too). 0 or -errno. */
int plane_shard_waits(plane_t *p, void *stream);

/* The act segment's rings (shm, ipc): attaches the segment once, then the ring of boundary b
 * (stage b -> b + 1), activations (grad = 0) or gradients (grad = 1). */
int plane_link_attach(plane_t *p, ring_t **r, int boundary, int grad);
/* The ring's next slot, which must carry (step, mb) (-EPROTO: other tags), or a free one; the
 * waits count in p->waited. */
int plane_link_take(plane_t *p, ring_t *r, int64_t step, int mb, void **payload);
int plane_link_reserve(plane_t *p, ring_t *r, void **payload);

/* ---- the optimizer shard's view (plane_reduce.c) ---- */

/* The part [lo, hi) of the shard's slice that one stage replica holds: its weights there (in
 * the backend's dtype) and its fp32 gradients; with offload in bf16 (job_layout_t host_bf16)
 * bf16 weights and gradients, g16 in place of g. */
typedef struct {
    void *w;
    float *g;
    uint16_t *g16;
    size_t lo, hi;
    int replica;
} plane_part_t;

#endif
