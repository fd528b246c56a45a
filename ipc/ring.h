/* Single-producer/single-consumer ring of fixed-size slots in shared memory: the data plane
 * between processes on one host (loader -> stage batches, stage -> stage activations and
 * gradients). The producer reserves the next slot and writes its payload in place (no extra
 * copy), then commits it with two tags (e.g. step and microbatch); the consumer peeks at the
 * oldest committed slot, reads it in place, and releases it. Head and tail are 64-bit
 * sequence numbers in the shared header; waiting blocks on a futex on them (no spinning).
 *
 * Layout (all in the caller's memory, normally part of a shm segment): a 4 KiB header, the
 * per-slot meta (sequence, tags, length), then nslots payloads, each page-aligned. A ring
 * handle holds no state of its own beyond pointers, so another process may reset or close
 * the ring while both ends are idle. Functions return 0 or -errno; nothing here exits. */
#ifndef CTITAN_RING_H
#define CTITAN_RING_H

#include <stddef.h>
#include <stdint.h>

#define RING_MAGIC 0x31474e4952544325ULL /* "%CTRING1" */
#define RING_VERSION 1u

typedef struct ring ring_t;

typedef struct {
    uint64_t seq;    /* position in the ring's stream since the last format/reset */
    uint64_t tag[2]; /* the producer's tags */
    uint64_t len;    /* payload bytes the producer wrote */
} ring_meta_t;

/* Bytes a ring of nslots slots of slot_bytes payload each needs (a multiple of 4 KiB). */
size_t ring_bytes(uint32_t nslots, size_t slot_bytes);
/* Formats an empty ring in mem (ring_bytes(nslots, slot_bytes) bytes, page-aligned) whose
 * stream starts at `base` (a number the users agree on, e.g. the first step). */
int ring_format(void *mem, size_t bytes, uint32_t nslots, size_t slot_bytes, uint64_t base);
/* Checks the header (magic, version, sizes within `bytes`) and returns a handle; `name`
 * (copied) names the ring in messages. */
int ring_attach(ring_t **out, void *mem, size_t bytes, const char *name, char *err, size_t errlen);
void ring_detach(ring_t **r);

/* Producer: waits up to timeout_ms (-1 = forever) for a free slot and points *payload at it.
 * Returns 0, -ETIMEDOUT, or -ECANCELED once the ring is closed. Calling it again before
 * commit returns the same slot. */
int ring_reserve(ring_t *r, int timeout_ms, void **payload);
/* Producer: publishes the reserved slot. -EINVAL if len exceeds the slot or the ring is full
 * (no slot was reserved). */
int ring_commit(ring_t *r, uint64_t tag0, uint64_t tag1, size_t len);

/* Consumer: waits up to timeout_ms for the oldest committed slot; *payload points at it in
 * place until ring_release. Returns 0, -ETIMEDOUT, -ECANCELED (closed and empty), or
 * -EPROTO if the slot's sequence number is not the expected one (memory corrupted). */
int ring_peek(ring_t *r, int timeout_ms, void **payload, ring_meta_t *meta);
/* Consumer: frees the slot returned by ring_peek (does nothing on an empty ring). */
void ring_release(ring_t *r);

uint64_t ring_head(const ring_t *r); /* slots committed since format/reset */
uint64_t ring_tail(const ring_t *r); /* slots released since format/reset */
uint64_t ring_base(const ring_t *r);
uint32_t ring_nslots(const ring_t *r);
size_t ring_slot_bytes(const ring_t *r);
const char *ring_name(const ring_t *r);
/* Index in [0, nslots) of the slot a payload pointer from ring_reserve or ring_peek points at
 * (device rings keep their data in slots of the same index elsewhere). */
uint32_t ring_slot_of(const ring_t *r, const void *payload);

/* Empties the ring and restarts its stream at `base`. Only while neither end is inside a
 * call (the coordinator does it at a step boundary with the producer stopped). */
void ring_reset(ring_t *r, uint64_t base);
/* Closes the ring: every waiter returns -ECANCELED (a consumer still drains what is
 * committed). ring_reset reopens it. */
void ring_close(ring_t *r);
int ring_closed(const ring_t *r);

#endif
