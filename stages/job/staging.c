/* The staging segment between the optimizer shards and checkpointd: its creation (the layout
 * is in staging.h; the coordinator creates it, shards and checkpointd fill and read it). */
#include "stages/job/staging.h"

int staging_create(shm_seg_t **out, const char *job, size_t total, char *err, size_t errlen)
{
    int rc = shm_create(out, job, STAGING_SEG, staging_bytes(total), err, errlen);
    if (rc)
        return rc;
    staging_hdr_t *h = shm_data(*out);
    *h = (staging_hdr_t){.magic = STAGING_MAGIC, .version = STAGING_VERSION, .total = total,
                         .stride = staging_stride(total)};
    atomic_store(&h->step, -1);
    return 0;
}
