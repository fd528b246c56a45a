/* The staging segment between the optimizer shards and checkpointd: its creation (the layout
 * is in staging.h; the coordinator creates it, shards and checkpointd fill and read it). */
#include "stages/job/staging.h"

#include <errno.h>

#include "ipc/util.h"

int staging_create(shm_seg_t **out, const char *job, size_t total, int arrays, char *err, size_t errlen)
{
    int rc = shm_create(out, job, STAGING_SEG, staging_bytes(total, arrays), err, errlen);
    if (rc)
        return rc;
    staging_hdr_t *h = shm_data(*out);
    *h = (staging_hdr_t){.magic = STAGING_MAGIC, .version = STAGING_VERSION,
                         .arrays = (uint32_t)arrays, .total = total,
                         .stride = staging_stride(total)};
    atomic_store(&h->step, -1);
    return 0;
}

int staging_check(const void *seg, size_t total, int arrays, char *err, size_t errlen)
{
    const staging_hdr_t *h = seg;
    if (h->magic != STAGING_MAGIC || h->version != STAGING_VERSION)
        return util_fail(err, errlen, -EINVAL, "the staging segment is not one this build reads");
    if (h->total != total || h->arrays != (uint32_t)arrays)
        return util_fail(err, errlen, -EINVAL, "the staging segment holds %u arrays of %llu parameters, the job %d "
                         "of %zu", h->arrays, (unsigned long long)h->total, arrays, total);
    return 0;
}
