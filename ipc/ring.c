/* SPSC shared-memory ring (see ring.h). The futex words are the low 32 bits of the 64-bit
 * head and tail counters (x86-64 is little-endian): a waiter sleeps until the counter it
 * watches moves, so there is no separate sequence word to keep in step. */
#include "ipc/ring.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc/util.h"

typedef struct {
    uint64_t magic;
    uint32_t version, nslots;
    uint64_t slot_bytes;  /* payload capacity, a multiple of UTIL_PAGE */
    uint64_t total_bytes;
    uint64_t payload_off; /* from the start of the ring */
    _Atomic uint64_t base;
    _Alignas(64) _Atomic uint64_t head;   /* written by the producer */
    _Alignas(64) _Atomic uint64_t tail;   /* written by the consumer */
    _Alignas(64) _Atomic uint32_t closed; /* written by whoever closes */
} ring_hdr_t;

_Static_assert(sizeof(ring_hdr_t) <= UTIL_PAGE, "ring header fits its page");

struct ring {
    ring_hdr_t *h;
    ring_meta_t *meta;
    char *payload;
    char name[64];
};

static size_t meta_bytes(uint32_t nslots) { return util_round_page(nslots * sizeof(ring_meta_t)); }

size_t ring_bytes(uint32_t nslots, size_t slot_bytes)
{
    return UTIL_PAGE + meta_bytes(nslots) + (size_t)nslots * util_round_page(slot_bytes ? slot_bytes : 1);
}

int ring_format(void *mem, size_t bytes, uint32_t nslots, size_t slot_bytes, uint64_t base)
{
    if (!mem || nslots == 0 || ((uintptr_t)mem % UTIL_PAGE) || bytes < ring_bytes(nslots, slot_bytes))
        return -EINVAL;
    ring_hdr_t *h = mem;
    memset(h, 0, UTIL_PAGE + meta_bytes(nslots));
    h->magic = RING_MAGIC;
    h->version = RING_VERSION;
    h->nslots = nslots;
    h->slot_bytes = util_round_page(slot_bytes ? slot_bytes : 1);
    h->total_bytes = ring_bytes(nslots, slot_bytes);
    h->payload_off = UTIL_PAGE + meta_bytes(nslots);
    atomic_store(&h->base, base);
    atomic_store(&h->head, 0);
    atomic_store(&h->tail, 0);
    atomic_store(&h->closed, 0);
    return 0;
}

int ring_attach(ring_t **out, void *mem, size_t bytes, const char *name, char *err, size_t errlen)
{
    ring_hdr_t *h = mem;
    if (!mem || bytes < UTIL_PAGE || h->magic != RING_MAGIC)
        return util_fail(err, errlen, -EINVAL, "ring %s: no ring here (bad magic)", name);
    if (h->version != RING_VERSION)
        return util_fail(err, errlen, -EPROTO, "ring %s: version %u, this build reads %u", name,
                         h->version, RING_VERSION);
    if (h->nslots == 0 || h->total_bytes > bytes ||
        h->total_bytes != ring_bytes(h->nslots, h->slot_bytes) ||
        h->payload_off != UTIL_PAGE + meta_bytes(h->nslots))
        return util_fail(err, errlen, -EINVAL, "ring %s: inconsistent header (%u slots of %llu bytes in %zu)",
                         name, h->nslots, (unsigned long long)h->slot_bytes, bytes);
    ring_t *r = calloc(1, sizeof(*r));
    if (!r)
        return util_fail(err, errlen, -ENOMEM, "ring %s: out of memory", name);
    r->h = h;
    r->meta = (ring_meta_t *)((char *)mem + UTIL_PAGE);
    r->payload = (char *)mem + h->payload_off;
    snprintf(r->name, sizeof(r->name), "%s", name);
    *out = r;
    return 0;
}

void ring_detach(ring_t **pr)
{
    free(*pr);
    *pr = NULL;
}

static void wake_all(_Atomic uint64_t *counter) { util_futex_wake((void *)counter); }

/* Sleeps while *counter still holds `seen` (low 32 bits), at most until `deadline`
 * (CLOCK_MONOTONIC seconds; < 0 = none) and at most 100 ms at a time: ring_close cannot move
 * the counter, so a close that lands between a waiter's check and its sleep is seen at the
 * next slice. Returns -ETIMEDOUT when the deadline has passed. */
static int wait_change(_Atomic uint64_t *counter, uint64_t seen, double deadline)
{
    double left = 0.1;
    if (deadline >= 0) {
        left = deadline - util_now();
        if (left <= 0)
            return -ETIMEDOUT;
        if (left > 0.1)
            left = 0.1;
    }
    /* EAGAIN (value moved), EINTR and a wake all send the caller back to re-check its condition */
    util_futex_wait((void *)counter, seen, left);
    return 0;
}

static double deadline_of(int timeout_ms) { return timeout_ms < 0 ? -1 : util_now() + timeout_ms * 1e-3; }

int ring_reserve(ring_t *r, int timeout_ms, void **payload)
{
    ring_hdr_t *h = r->h;
    double deadline = deadline_of(timeout_ms);
    uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    for (;;) {
        if (atomic_load(&h->closed))
            return -ECANCELED;
        uint64_t tail = atomic_load_explicit(&h->tail, memory_order_acquire);
        if (head - tail < h->nslots)
            break;
        if (timeout_ms == 0 || wait_change(&h->tail, tail, deadline))
            return -ETIMEDOUT;
    }
    *payload = r->payload + (head % h->nslots) * h->slot_bytes;
    return 0;
}

int ring_commit(ring_t *r, uint64_t tag0, uint64_t tag1, size_t len)
{
    ring_hdr_t *h = r->h;
    uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    if (len > h->slot_bytes || head - atomic_load_explicit(&h->tail, memory_order_acquire) >= h->nslots)
        return -EINVAL; /* too long, or no slot was reserved: never overwrite an unread one */
    ring_meta_t *m = &r->meta[head % h->nslots];
    *m = (ring_meta_t){.seq = head, .tag = {tag0, tag1}, .len = len};
    atomic_store_explicit(&h->head, head + 1, memory_order_release);
    wake_all(&h->head);
    return 0;
}

int ring_peek(ring_t *r, int timeout_ms, void **payload, ring_meta_t *meta)
{
    ring_hdr_t *h = r->h;
    double deadline = deadline_of(timeout_ms);
    uint64_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
    for (;;) {
        uint64_t head = atomic_load_explicit(&h->head, memory_order_acquire);
        if (head != tail)
            break;
        if (atomic_load(&h->closed))
            return -ECANCELED;
        if (timeout_ms == 0 || wait_change(&h->head, head, deadline))
            return -ETIMEDOUT;
    }
    const ring_meta_t *m = &r->meta[tail % h->nslots];
    if (m->seq != tail || m->len > h->slot_bytes)
        return -EPROTO;
    if (meta)
        *meta = *m;
    *payload = r->payload + (tail % h->nslots) * h->slot_bytes;
    return 0;
}

void ring_release(ring_t *r)
{
    ring_hdr_t *h = r->h;
    uint64_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
    if (tail == atomic_load_explicit(&h->head, memory_order_acquire))
        return; /* nothing peeked: moving past head would break the stream */
    atomic_store_explicit(&h->tail, tail + 1, memory_order_release);
    wake_all(&h->tail);
}

uint64_t ring_head(const ring_t *r) { return atomic_load(&r->h->head); }
uint64_t ring_tail(const ring_t *r) { return atomic_load(&r->h->tail); }
uint64_t ring_base(const ring_t *r) { return atomic_load(&r->h->base); }
uint32_t ring_nslots(const ring_t *r) { return r->h->nslots; }
size_t ring_slot_bytes(const ring_t *r) { return r->h->slot_bytes; }
uint32_t ring_slot_of(const ring_t *r, const void *payload)
{
    return (uint32_t)(((const char *)payload - (const char *)r->payload) / r->h->slot_bytes);
}

const char *ring_name(const ring_t *r) { return r->name; }

void ring_reset(ring_t *r, uint64_t base)
{
    ring_hdr_t *h = r->h;
    atomic_store(&h->base, base);
    atomic_store(&h->head, 0);
    atomic_store(&h->tail, 0);
    memset(r->meta, 0, h->nslots * sizeof(ring_meta_t));
    atomic_store(&h->closed, 0);
    wake_all(&h->head);
    wake_all(&h->tail);
}

void ring_close(ring_t *r)
{
    atomic_store(&r->h->closed, 1);
    /* bump nothing: waiters are woken and re-check `closed` before sleeping again */
    wake_all(&r->h->head);
    wake_all(&r->h->tail);
}

int ring_closed(const ring_t *r) { return (int)atomic_load(&r->h->closed); }
