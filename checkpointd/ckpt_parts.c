/* A part's checksum file (see ckpt.h): what each host leaves beside its data files when it has
 * written its part of a checkpoint across hosts, and what the committing host reads (from a
 * shared folder another machine wrote: checked whole before anything in it is used). The plan
 * of the parts is ckpt_index.c; writing and committing them is writer.c. */
#include "checkpointd/ckpt.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define SUMS_HDR 40  /* magic 8, version 4, zeros 4, step 8, part 4, n_parts 4, count 8 */
#define SUMS_TAIL 8  /* XXH64 of everything before it */

size_t ckpt_part_sums_bytes(uint64_t count) { return SUMS_HDR + (size_t)count * 8 + SUMS_TAIL; }

int ckpt_part_sums_encode(const ckpt_part_sums_t *ps, uint8_t **buf, size_t *len)
{
    size_t n = ckpt_part_sums_bytes(ps->count);
    uint8_t *b = calloc(1, n);
    if (!b)
        return -ENOMEM;
    uint32_t v = CKPT_VERSION;
    memcpy(b, CKPT_SUMS_MAGIC, 8);
    memcpy(b + 8, &v, 4);
    memcpy(b + 16, &ps->step, 8);
    memcpy(b + 24, &ps->part, 4);
    memcpy(b + 28, &ps->n_parts, 4);
    memcpy(b + 32, &ps->count, 8);
    if (ps->count)
        memcpy(b + SUMS_HDR, ps->xxh, (size_t)ps->count * 8);
    uint64_t sum = XXH64(b, n - SUMS_TAIL, 0);
    memcpy(b + n - SUMS_TAIL, &sum, 8);
    *buf = b;
    *len = n;
    return 0;
}

static int bad(const char *what, char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int bad(const char *what, char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        int n = snprintf(err, errlen, "%s: bad part checksum file: ", what);
        if (n >= 0 && (size_t)n < errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -EBADMSG;
}

int ckpt_part_sums_decode(const void *buf, size_t len, ckpt_part_sums_t *ps, const char *what, char *err,
                          size_t errlen)
{
    const uint8_t *b = buf;
    memset(ps, 0, sizeof(*ps));
    if (len < SUMS_HDR + SUMS_TAIL || memcmp(b, CKPT_SUMS_MAGIC, 8))
        return bad(what, err, errlen, "no %s magic (empty, truncated, or not one)", CKPT_SUMS_MAGIC);
    uint32_t v, zero, part, n_parts;
    int64_t step;
    uint64_t count, sum;
    memcpy(&v, b + 8, 4);
    memcpy(&zero, b + 12, 4);
    memcpy(&step, b + 16, 8);
    memcpy(&part, b + 24, 4);
    memcpy(&n_parts, b + 28, 4);
    memcpy(&count, b + 32, 8);
    memcpy(&sum, b + len - SUMS_TAIL, 8);
    if (v != CKPT_VERSION)
        return bad(what, err, errlen, "version %u; this build reads version %u", v, CKPT_VERSION);
    if ((len - SUMS_HDR - SUMS_TAIL) % 8 || count != (len - SUMS_HDR - SUMS_TAIL) / 8)
        return bad(what, err, errlen, "its %zu bytes do not hold the %" PRIu64 " checksums it counts (truncated?)",
                   len, count);
    /* the checksum before the other fields: a damaged file is called damaged, not "of step 3" */
    if (XXH64(b, len - SUMS_TAIL, 0) != sum)
        return bad(what, err, errlen, "checksum mismatch (corrupt)");
    if (zero)
        return bad(what, err, errlen, "bytes 12-15 are not zero (corrupt)");
    if (step < 0 || step > CKPT_STEP_MAX)
        return bad(what, err, errlen, "step %" PRId64 " is out of range 0..%d", step, CKPT_STEP_MAX);
    if (n_parts < 1 || n_parts > CKPT_PARTS_MAX || part >= n_parts)
        return bad(what, err, errlen, "part %u of %u parts (at most %d)", part, n_parts, CKPT_PARTS_MAX);
    ps->xxh = malloc(count ? (size_t)count * 8 : 1);
    if (!ps->xxh)
        return -ENOMEM;
    if (count)
        memcpy(ps->xxh, b + SUMS_HDR, (size_t)count * 8);
    ps->step = step;
    ps->part = part;
    ps->n_parts = n_parts;
    ps->count = count;
    return 0;
}

void ckpt_part_sums_free(ckpt_part_sums_t *ps)
{
    free(ps->xxh);
    memset(ps, 0, sizeof(*ps));
}
