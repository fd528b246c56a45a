/* Layout of the GPU data plane's directory segment (devdir.h). */
#include "stages/job/devdir.h"

#include <time.h>

static size_t ring_part(const job_layout_t *l) { return sizeof(cuda_ipc_mem_t) + 2 * l->M * sizeof(cuda_ipc_event_t); }

static size_t entry_bytes(const job_layout_t *l)
{
    size_t b = sizeof(devdir_stage_t) + 2 * ring_part(l);
    return (b + 63) / 64 * 64;
}

static size_t shard_bytes(void) { return (sizeof(devdir_shard_t) + 63) / 64 * 64; }

size_t devdir_stages_bytes(const job_layout_t *l) { return (size_t)l->dp * l->pp * entry_bytes(l); }

size_t devdir_bytes(const job_layout_t *l) { return devdir_stages_bytes(l) + (size_t)l->shards * shard_bytes(); }

devdir_shard_t *devdir_shard(void *seg, const job_layout_t *l, int k)
{
    return (devdir_shard_t *)((char *)seg + devdir_stages_bytes(l) + (size_t)k * shard_bytes());
}

devdir_shard_t *devdir_shard_wait(void *seg, const job_layout_t *l, int k, int timeout_ms)
{
    devdir_shard_t *e = devdir_shard(seg, l, k);
    for (int waited = 0; !atomic_load(&e->ready); waited++) {
        if (waited >= timeout_ms)
            return NULL;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return e;
}

devdir_stage_t *devdir_stage(void *seg, const job_layout_t *l, int replica, int rank)
{
    return (devdir_stage_t *)((char *)seg + ((size_t)replica * l->pp + rank) * entry_bytes(l));
}

devdir_stage_t *devdir_wait(void *seg, const job_layout_t *l, int replica, int rank, int timeout_ms)
{
    devdir_stage_t *e = devdir_stage(seg, l, replica, rank);
    for (int waited = 0; !atomic_load(&e->ready); waited++) {
        if (waited >= timeout_ms)
            return NULL;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return e;
}

devdir_ring_t devdir_ring(devdir_stage_t *e, const job_layout_t *l, int grad)
{
    char *p = (char *)(e + 1) + (grad ? ring_part(l) : 0);
    devdir_ring_t r = {.slots = (cuda_ipc_mem_t *)p};
    r.written = (cuda_ipc_event_t *)(p + sizeof(cuda_ipc_mem_t));
    r.read = r.written + l->M;
    return r;
}
