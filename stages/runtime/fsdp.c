/* Parameter sharding's exchange (fsdp.h). Piece k of a step has two sequence numbers per
 * member, base + 2k + 1 (its buffer holds the piece's gradients) and base + 2k + 2 (it added its
 * part of the sum: it reads the buffers no more), base = (step + 1) << 32, so that they only
 * grow across steps; the coordinator sets them to 0 again only while every member is idle. */
#include "stages/runtime/fsdp.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "ipc/util.h"
#include "kernels/bf16.h"

struct fsdp {
    job_fsdp_xchg_t *x;
    int n, me;
    void **buf;          /* n: the members' buffers (fp32, or bf16 with a bf16 reduce) */
    size_t cap;          /* elements of each */
    float *mine;         /* bf16 reduce: where the model writes a piece's fp32 gradients (cap) */
    float *grads;
    uint64_t base, k;    /* this step's base and the pieces handed over in it */
    double *waited;
    void (*waiting)(void *, int);
    void *arg;
};

/* Member k's part [*b, *e) of a piece's range [lo, hi): the range cut in fsdp parts of a
 * multiple of 16 floats (a cache line), the last the rest. */
static void fsdp_part(size_t lo, size_t hi, int fsdp, int k, size_t *b, size_t *e)
{
    size_t n = hi - lo, chunk = ((n + (size_t)fsdp - 1) / (size_t)fsdp + 15) / 16 * 16;
    size_t at = lo + (size_t)k * chunk;
    *b = at < hi ? at : hi;
    *e = at + chunk < hi ? at + chunk : hi;
}

/* -ECANCELED once the coordinator closed the exchange for a recovery, else 0. */
static int closed(const fsdp_t *f) { return atomic_load(&f->x->closed) ? -ECANCELED : 0; }

/* Waits until every member's sequence number is at least `want`; -ECANCELED once closed. */
static int wait_all(fsdp_t *f, uint64_t want)
{
    double t0 = 0;
    int rc = 0;
    for (int k = 0; k < f->n && !rc; k++) {
        _Atomic uint64_t *seq = &f->x->member[k].seq;
        uint64_t seen;
        while (!rc && (seen = atomic_load(seq)) < want) {
            if ((rc = closed(f)))
                break;
            if (!t0) {
                t0 = util_now();
                if (f->waiting)
                    f->waiting(f->arg, 1);
            }
            util_futex_wait((void *)seq, seen, 0.1); /* closing wakes it; the slice is a backstop */
        }
    }
    if (t0) {
        *f->waited += util_now() - t0;
        if (f->waiting)
            f->waiting(f->arg, 0);
    }
    return rc ? rc : closed(f);
}

static void publish(fsdp_t *f, uint64_t seq)
{
    atomic_store(&f->x->member[f->me].seq, seq);
    util_futex_wake((void *)&f->x->member[f->me].seq);
}

/* Every member added its part of the previous piece: this member's buffer is free again. */
static int prev_summed(fsdp_t *f)
{
    return f->k ? wait_all(f, f->base + 2 * f->k) : closed(f);
}

/* The buffer for the next piece: this member's in the exchange, once free; with a bf16 reduce
 * the private fp32 one at once (give waits before it rounds into the exchange, so the W of this
 * piece runs while the others still sum the previous one). */
static int take(void *arg, size_t lo, size_t hi, float **out)
{
    fsdp_t *f = arg;
    if (hi - lo > f->cap)
        return -EINVAL;
    *out = f->mine ? f->mine : f->buf[f->me];
    return f->mine ? closed(f) : prev_summed(f);
}

/* Member order, fp32: fixed bits, and with one microbatch those of the unsharded job. */
static void sum_f32(const fsdp_t *f, float *g, size_t b, size_t e)
{
    for (size_t i = b; i < e; i++) {
        float t = ((const float *)f->buf[0])[i];
        for (int k = 1; k < f->n; k++)
            t += ((const float *)f->buf[k])[i];
        g[i] += t;
    }
}

/* Member order, bf16: every partial sum rounded to bf16 (as a bf16 collective's each step),
 * the whole added to the fp32 gradient. */
static void sum_bf16(const fsdp_t *f, float *g, size_t b, size_t e)
{
    for (size_t i = b; i < e; i++) {
        float t = bf16_float(((const uint16_t *)f->buf[0])[i]);
        for (int k = 1; k < f->n; k++)
            t = bf16_float(bf16_of(t + bf16_float(((const uint16_t *)f->buf[k])[i])));
        g[i] += t;
    }
}

/* The piece's gradients are in this member's buffer (with a bf16 reduce: rounded into it from
 * `mine`): once every member's are, add their sum into the part of the copy this member owns. */
static int give(void *arg, size_t lo, size_t hi)
{
    fsdp_t *f = arg;
    int rc;
    if (f->mine) {
        if ((rc = prev_summed(f)))
            return rc;
        uint16_t *out = f->buf[f->me];
        for (size_t i = 0; i < hi - lo; i++)
            out[i] = bf16_of(f->mine[i]);
    }
    publish(f, f->base + 2 * f->k + 1);
    rc = wait_all(f, f->base + 2 * f->k + 1);
    if (rc)
        return rc;
    size_t b, e;
    fsdp_part(lo, hi, f->n, f->me, &b, &e);
    (f->mine ? sum_bf16 : sum_f32)(f, f->grads + lo, b - lo, e - lo);
    f->k++;
    publish(f, f->base + 2 * f->k);
    return 0;
}

int fsdp_new(fsdp_t **out, void *seg, const job_layout_t *l, int group, int member, int vstage, float *grads,
             double *waited, void (*waiting)(void *arg, int on), void *arg, char *err, size_t errlen)
{
    *out = NULL;
    if (l->fsdp < 2 || group < 0 || group >= l->copies || member < 0 || member >= l->fsdp || vstage < 0 ||
        vstage >= l->S)
        return util_fail(err, errlen, -EINVAL, "parameter sharding: no exchange for group %d member %d of stage %d",
                         group, member, vstage);
    fsdp_t *f = calloc(1, sizeof(*f));
    if (!f || !(f->buf = calloc((size_t)l->fsdp, sizeof(void *))) ||
        (l->fsdp_bf16 && !(f->mine = malloc(l->fsdp_unit[vstage] * sizeof(float))))) {
        if (f)
            free(f->buf);
        free(f);
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    }
    f->x = job_fsdp_xchg(seg, l, group, vstage);
    f->n = l->fsdp;
    f->me = member;
    f->cap = l->fsdp_unit[vstage];
    for (int k = 0; k < f->n; k++)
        f->buf[k] = job_fsdp_buf(f->x, l, vstage, k);
    f->grads = grads;
    f->waited = waited;
    f->waiting = waiting;
    f->arg = arg;
    *out = f;
    return 0;
}

void fsdp_destroy(fsdp_t **pf)
{
    if (!*pf)
        return;
    free((*pf)->buf);
    free((*pf)->mine);
    free(*pf);
    *pf = NULL;
}

void fsdp_step(fsdp_t *f, int64_t step)
{
    f->base = (uint64_t)(step + 1) << 32;
    f->k = 0;
}

shard_io_t fsdp_io(fsdp_t *f) { return (shard_io_t){.take = take, .give = give, .arg = f}; }
