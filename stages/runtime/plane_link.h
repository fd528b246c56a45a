/* The side of the data plane (plane.h) a transport implements: this stage's end of each link
 * as a small table of calls, and the plane's hooks around a step. Included only by
 * stages/plane*.c; plane.c holds what the transports share (errors, wait time, the act
 * segment's rings). */
#ifndef CTITAN_PLANE_LINK_H
#define CTITAN_PLANE_LINK_H

#include "ipc/ring.h"
#include "ipc/shm.h"
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
    int (*step_begin)(plane_t *p);
    int (*step_end)(plane_t *p);
    void (*destroy)(plane_t *p); /* the transport's own state, p->ctx */
} plane_ops_t;

struct plane {
    plane_end_t *end[PLANE_LINKS]; /* NULL where the stage has no such neighbour */
    const plane_ops_t *ops;        /* NULL: nothing around a step */
    void *ctx;
    plane_cfg_t cfg;
    job_layout_t lay;              /* cfg.lay points here */
    shm_seg_t *act;                /* shm, ipc: the act segment */
    double waited;
    char err[512];
};

/* A plane with no links yet (cfg copied); NULL when out of memory. */
plane_t *plane_alloc(const plane_cfg_t *c, const plane_ops_t *ops);
/* Formats p->err and returns rc (< 0). */
int plane_fail(plane_t *p, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A transport's constructor failed: copies p->err into err, destroys p, returns rc. */
int plane_abort(plane_t **p, int rc, char *err, size_t errlen);
/* Whether to make streams wait on the neighbours' events: the test hook
 * CTITAN_TEST_NO_EVENT_WAITS=1 drops those waits, so test_launch can show that the emulated
 * GPU catches a missing one. */
int plane_event_waits(void);

/* The act segment's rings (shm, ipc): attaches the segment once, then the ring of boundary b
 * (stage b -> b + 1), activations (grad = 0) or gradients (grad = 1). */
int plane_link_attach(plane_t *p, ring_t **r, int boundary, int grad);
/* The ring's next slot (plane_ring_take) or a free one; the waits count in p->waited. */
int plane_link_take(plane_t *p, ring_t *r, int64_t step, int mb, void **payload);
int plane_link_reserve(plane_t *p, ring_t *r, void **payload);

#endif
