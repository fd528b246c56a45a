/* The data plane's calls (plane.h) handed to each link's transport, and what the transports
 * share (plane_link.h): errors, the host's wait time, the act segment's rings. */
#include "stages/runtime/plane.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"
#include "stages/runtime/plane_link.h"

static const char *const link_names[PLANE_LINKS] = {"act_in", "act_out", "grad_in", "grad_out"};

plane_t *plane_alloc(const plane_cfg_t *c, const plane_ops_t *ops)
{
    plane_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->cfg = *c;
    p->lay = *c->lay;
    p->cfg.lay = &p->lay;
    p->ops = ops;
    return p;
}

int plane_fail(plane_t *p, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof(p->err), fmt, ap);
    va_end(ap);
    return rc;
}

int plane_abort(plane_t **p, int rc, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s", *p ? (*p)->err : "out of memory");
    plane_destroy(p);
    return rc;
}

void plane_destroy(plane_t **pp)
{
    plane_t *p = *pp;
    if (!p)
        return;
    for (int l = 0; l < PLANE_LINKS; l++)
        if (p->end[l])
            p->end[l]->ops->destroy(p->end[l]);
    if (p->ops && p->ops->destroy)
        p->ops->destroy(p);
    shm_detach(&p->act);
    free(p);
    *pp = NULL;
}

int plane_event_waits(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("CTITAN_TEST_NO_EVENT_WAITS");
        on = !(v && v[0] == '1');
    }
    return on;
}

/* The link's end; NULL (p->err saying so) when this stage has no such neighbour. */
static plane_end_t *end_of(plane_t *p, plane_link_t l)
{
    if ((unsigned)l < PLANE_LINKS && p->end[l])
        return p->end[l];
    char where[48] = "";
    if (p->cfg.lay->vs > 1)
        snprintf(where, sizeof(where), " (virtual stage %d)", p->cfg.vstage);
    plane_fail(p, -EINVAL, "stage %d%s of replica %d has no link %s", p->cfg.rank, where, p->cfg.replica,
               (unsigned)l < PLANE_LINKS ? link_names[l] : "?");
    return NULL;
}

int plane_recv(plane_t *p, plane_link_t l, int64_t step, int mb, void **slot)
{
    plane_end_t *e = end_of(p, l);
    return e ? e->ops->recv(e, step, mb, slot) : -EINVAL;
}

int plane_done(plane_t *p, plane_link_t l)
{
    plane_end_t *e = end_of(p, l);
    return e ? e->ops->done(e) : -EINVAL;
}

int plane_reserve(plane_t *p, plane_link_t l, int64_t step, int mb, void **slot)
{
    plane_end_t *e = end_of(p, l);
    return e ? e->ops->reserve(e, step, mb, slot) : -EINVAL;
}

int plane_send(plane_t *p, plane_link_t l)
{
    plane_end_t *e = end_of(p, l);
    return e ? e->ops->send(e) : -EINVAL;
}

int plane_step_begin(plane_t *p) { return p->ops && p->ops->step_begin ? p->ops->step_begin(p) : 0; }

int plane_step_end(plane_t *p) { return p->ops && p->ops->step_end ? p->ops->step_end(p) : 0; }

double plane_waited(plane_t *p)
{
    double w = p->waited;
    p->waited = 0;
    return w;
}

const char *plane_error(const plane_t *p) { return p->err; }

/* ---- the act segment's rings ---- */

int plane_link_attach(plane_t *p, ring_t **r, int boundary, int grad)
{
    int rc;
    if (!p->act && (rc = shm_attach(&p->act, p->cfg.job, "act", p->err, sizeof(p->err))))
        return rc;
    char name[48];
    snprintf(name, sizeof(name), "%s.%d.%d", grad ? "grad" : "act", p->cfg.replica, boundary);
    size_t off = job_act_off(&p->lay, p->cfg.replica, boundary, grad);
    return ring_attach(r, (char *)shm_data(p->act) + off, p->lay.act_ring, name, p->err, sizeof(p->err));
}

int plane_ring_take(ring_t *r, int64_t step, int mb, void **payload, double *waited, char *err, size_t errlen)
{
    ring_meta_t meta;
    double t0 = util_now();
    int rc = ring_peek(r, -1, payload, &meta);
    *waited += util_now() - t0;
    if (rc)
        return util_fail(err, errlen, rc, "ring %s: %s", ring_name(r), strerror(-rc));
    if (meta.tag[0] != (uint64_t)step || meta.tag[1] != (uint64_t)mb)
        return util_fail(err, errlen, -EPROTO,
                         "ring %s delivered step %llu microbatch %llu, expected step %lld microbatch %d",
                         ring_name(r), (unsigned long long)meta.tag[0], (unsigned long long)meta.tag[1],
                         (long long)step, mb);
    return 0;
}

int plane_link_take(plane_t *p, ring_t *r, int64_t step, int mb, void **payload)
{
    return plane_ring_take(r, step, mb, payload, &p->waited, p->err, sizeof(p->err));
}

int plane_link_reserve(plane_t *p, ring_t *r, void **payload)
{
    double t0 = util_now();
    int rc = ring_reserve(r, -1, payload);
    p->waited += util_now() - t0;
    return rc ? plane_fail(p, rc, "ring %s: %s", ring_name(r), strerror(-rc)) : 0;
}
