/* The loader's shared segment (stages/job/ldr_seg.h): its layout, the cursor table, the rings'
 * geometry, and the resume point a (re)started or swapped loader begins at. */
#include "stages/job/ldr_seg.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ipc/util.h"

static size_t cursors_bytes(void) { return util_round_page(LDR_SEG_CURSORS * sizeof(ldr_cursor_entry_t)); }

size_t ldr_seg_slot_bytes(int seqs, int seq_len) { return (size_t)seqs * seq_len * sizeof(int32_t); }

_Static_assert(sizeof(ldr_seg_hdr_t) <= UTIL_PAGE, "the loader segment header fits its page");

size_t ldr_seg_bytes(int dp, int nslots, int seqs, int seq_len)
{
    return UTIL_PAGE + cursors_bytes() + 2 * (size_t)dp * ring_bytes((uint32_t)nslots, ldr_seg_slot_bytes(seqs, seq_len));
}

static ldr_cursor_entry_t *entry(void *mem, int64_t step)
{
    ldr_seg_hdr_t *h = mem;
    return (ldr_cursor_entry_t *)((char *)mem + h->cursors_off) + (uint64_t)step % LDR_SEG_CURSORS;
}

void ldr_seg_put_cursor(void *mem, int64_t step, const void *cursor, size_t len)
{
    ldr_cursor_entry_t *e = entry(mem, step);
    atomic_store(&e->step, -1);
    e->len = (uint32_t)len;
    if (len)
        memcpy(e->data, cursor, len);
    atomic_store(&e->step, step);
}

int ldr_seg_cursor(void *mem, int64_t step, uint8_t *buf, size_t *len)
{
    ldr_cursor_entry_t *e = entry(mem, step);
    if (atomic_load(&e->step) != step)
        return -ENOENT;
    uint32_t n = e->len;
    if (n > LDR_CURSOR_MAX)
        return -ENOENT;
    memcpy(buf, e->data, n);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load(&e->step) != step) /* rewritten while we copied */
        return -ENOENT;
    *len = n;
    return 0;
}

int ldr_seg_format(void *mem, size_t bytes, const ldr_info_t *info, int nslots,
                   const uint8_t *cursor, size_t cursor_len)
{
    if (bytes < ldr_seg_bytes(info->dp, nslots, info->seqs, info->seq_len) || cursor_len > LDR_CURSOR_MAX ||
        nslots < 1)
        return -EINVAL;
    ldr_seg_hdr_t *h = mem;
    memset(h, 0, UTIL_PAGE);
    *h = (ldr_seg_hdr_t){.magic = LDR_SEG_MAGIC, .version = LDR_SEG_VERSION, .dp = (uint32_t)info->dp,
                         .microbatches = (uint32_t)info->microbatches, .seqs = (uint32_t)info->seqs,
                         .seq_len = (uint32_t)info->seq_len, .vocab_size = (uint32_t)info->vocab_size,
                         .shuffle = (uint32_t)info->shuffle, .nslots = (uint32_t)nslots,
                         .seed = info->seed, .steps = info->steps, .resume_step = info->first_step,
                         .cursors_off = UTIL_PAGE, .rings_off = UTIL_PAGE + cursors_bytes(),
                         .replica0 = (uint32_t)info->replica0,
                         .replicas = (uint32_t)(info->replicas ? info->replicas : info->dp),
                         .ring_bytes = ring_bytes((uint32_t)nslots, ldr_seg_slot_bytes(info->seqs, info->seq_len))};
    snprintf(h->dataset_path, sizeof(h->dataset_path), "%s", info->dataset_path);
    h->resume_len = (uint32_t)cursor_len;
    if (cursor_len)
        memcpy(h->resume_cursor, cursor, cursor_len);
    ldr_cursor_entry_t *tab = (ldr_cursor_entry_t *)((char *)mem + h->cursors_off);
    for (int i = 0; i < LDR_SEG_CURSORS; i++)
        atomic_store(&tab[i].step, -1);
    ldr_seg_put_cursor(mem, info->first_step, cursor, cursor_len);
    for (int i = 0; i < 2 * info->dp; i++) {
        int rc = ring_format((char *)mem + h->rings_off + i * h->ring_bytes, h->ring_bytes,
                             (uint32_t)nslots, ldr_seg_slot_bytes(info->seqs, info->seq_len),
                             (uint64_t)info->first_step);
        if (rc)
            return rc;
    }
    return 0;
}

int ldr_seg_create(shm_seg_t **out, const char *job, const manifest_t *m, int64_t first_step,
                   const uint8_t *cursor, size_t cursor_len, char *err, size_t errlen)
{
    int per_host = m->dp / m->hosts, seqs = m->local_batch_size / m->microbatches;
    ldr_info_t info = {.dp = m->dp, .microbatches = m->microbatches, .seqs = seqs, .seq_len = m->seq_len,
                       .vocab_size = m->model.vocab_size, .shuffle = m->shuffle, .seed = m->seed,
                       .first_step = first_step, .steps = m->steps, .replica0 = m->host_rank * per_host,
                       .replicas = per_host};
    snprintf(info.dataset_path, sizeof(info.dataset_path), "%s", m->dataset_path);
    int slots = manifest_loader_slots(m);
    size_t bytes = ldr_seg_bytes(m->dp, slots, seqs, m->seq_len);
    int rc = shm_create(out, job, LDR_SEG_NAME, bytes, err, errlen);
    if (!rc && (rc = ldr_seg_format(shm_data(*out), bytes, &info, slots, cursor, cursor_len)))
        util_fail(err, errlen, rc, "loader segment: cannot format it: %s", strerror(-rc));
    return rc;
}

int ldr_seg_check(const void *mem, char *err, size_t errlen)
{
    const ldr_seg_hdr_t *h = mem;
    if (h->magic != LDR_SEG_MAGIC)
        return util_fail(err, errlen, -EINVAL, "loader segment: bad magic");
    if (h->version != LDR_SEG_VERSION)
        return util_fail(err, errlen, -EPROTO, "loader segment: version %u, this build reads %u",
                         h->version, LDR_SEG_VERSION);
    return 0;
}

int ldr_seg_ring(void *mem, int i, ring_t **out, char *err, size_t errlen)
{
    ldr_seg_hdr_t *h = mem;
    int rc = ldr_seg_check(mem, err, errlen);
    if (rc)
        return rc;
    if (i < 0 || i >= 2 * (int)h->dp)
        return util_fail(err, errlen, -EINVAL, "loader segment: no ring %d", i);
    char name[32];
    snprintf(name, sizeof(name), "%s.%u", i % 2 ? "targets" : "tokens", (unsigned)i / 2);
    return ring_attach(out, (char *)mem + h->rings_off + i * h->ring_bytes, h->ring_bytes, name, err,
                       errlen);
}

static int set_resume(void *mem, int64_t step)
{
    ldr_seg_hdr_t *h = mem;
    uint8_t buf[LDR_CURSOR_MAX];
    size_t len = 0;
    int rc = ldr_seg_cursor(mem, step, buf, &len);
    if (rc)
        return rc;
    h->resume_step = step;
    h->resume_len = (uint32_t)len;
    memcpy(h->resume_cursor, buf, len);
    return 0;
}

int ldr_seg_prepare_restart(void *mem, int64_t *resume_step)
{
    ldr_seg_hdr_t *h = mem;
    uint64_t least = UINT64_MAX, base = 0;
    for (int i = 0; i < 2 * (int)h->dp; i++) {
        ring_t *r;
        if (ldr_seg_ring(mem, i, &r, NULL, 0))
            return -EINVAL;
        uint64_t head = ring_head(r);
        base = ring_base(r);
        least = head < least ? head : least;
        ring_detach(&r);
    }
    int64_t step = (int64_t)(base + least / h->microbatches);
    if (step >= h->steps)
        step = h->steps;
    int rc = step < h->steps ? set_resume(mem, step) : 0;
    if (step >= h->steps)
        h->resume_step = step;
    *resume_step = step;
    return rc;
}

int ldr_seg_prepare_swap(void *mem, int64_t step)
{
    ldr_seg_hdr_t *h = mem;
    int rc = set_resume(mem, step);
    if (rc)
        return rc;
    for (int i = 0; i < 2 * (int)h->dp; i++) {
        ring_t *r;
        if (ldr_seg_ring(mem, i, &r, NULL, 0))
            return -EINVAL;
        ring_reset(r, (uint64_t)step);
        ring_detach(&r);
    }
    return 0;
}
