/* Job segment layout and owner checks (see job.h). */
#include "stages/job/job.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ipc/ring.h"
#include "ipc/util.h"
#include "kernels/params.h"
#include "stages/job/devdir.h"
#include "stages/job/ldr_seg.h"
#include "stages/job/staging.h"

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

int job_layout(job_layout_t *l, const manifest_t *m)
{
    param_table_t tab;
    if (params_table_init(&tab, &m->model))
        return -ENOMEM;
    *l = (job_layout_t){.dp = m->dp, .pp = m->pp, .M = m->microbatches,
                        .mb = m->local_batch_size / m->microbatches, .T = m->seq_len,
                        .D = m->model.dim, .total = tab.total, .vs = manifest_vstages(m)};
    l->S = l->pp * l->vs;
    l->fsdp = m->dp_shard > 0 ? m->dp_shard : 1;
    l->fsdp_reshard = !strcmp(m->fsdp_reshard, "always") || (strcmp(m->fsdp_reshard, "never") && m->pp == 1);
    l->copies = m->dp / l->fsdp;
    l->fsdp_bf16 = l->fsdp > 1 && !strcmp(m->mp_reduce, "bfloat16");
    for (int v = 0; l->fsdp > 1 && v < l->S; v++) {
        int p0, p1;
        if (manifest_stage_pieces(m, v, &p0, &p1)) {
            params_table_free(&tab);
            return -ENOMEM;
        }
        l->fsdp_pieces[v] = p1 - p0;
        for (int p = p0; p < p1; p++) {
            size_t b, e;
            params_piece_range(&tab, p, p + 1, &b, &e);
            l->fsdp_unit[v] = e - b > l->fsdp_unit[v] ? e - b : l->fsdp_unit[v];
        }
        l->fsdp_unit[v] = round_up(l->fsdp_unit[v], 1024);
    }
    params_table_free(&tab);
    l->stride = round_up(l->total, 1024);
    l->n_blocks = (l->total + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK;
    l->gpu = !strcmp(m->device, "cuda");
    l->gpu_shards = !strcmp(m->shard_device, "cuda");
    l->host_banks = l->gpu_shards ? 0 : m->host_banks;
    l->host_bf16 = l->gpu && !l->gpu_shards && !strcmp(m->offload_dtype, "bfloat16");
    l->dev_slot = (size_t)l->mb * l->T * l->D * 2;
    l->act_slot = l->gpu ? 0 : (size_t)l->mb * l->T * l->D * sizeof(float);
    l->nccl = !strcmp(m->data_plane, "nccl");
    l->hosts = m->hosts > 0 ? m->hosts : 1;
    l->act_ring = ring_bytes((uint32_t)l->M, l->act_slot);
    if (!(l->opt = optim_find(m->optimizer_name)))
        return -EINVAL; /* cannot happen: the manifest was checked */
    l->arrays = optim_arrays(l->opt);
    l->shards = m->shards;
    const char *host_norm = getenv("CTITAN_TEST_HOST_NORM");
    l->norm_on_device = l->gpu_shards && job_norm_by_blocks(l) && l->hosts == 1 && !(host_norm && *host_norm == '1');
    return 0;
}

size_t job_seg_bytes(const job_layout_t *l) { return JOB_HDR_BYTES + l->n_blocks * sizeof(double); }

int job_norm_by_blocks(const job_layout_t *l) { return !l->nccl && !l->opt->whole_tensors; }

size_t job_params_bytes(const job_layout_t *l)
{
    return (size_t)(l->gpu_shards ? 1 : l->copies) * l->stride * job_host_elem(l);
}

static size_t fsdp_xchg_bytes(const job_layout_t *l, int v)
{
    return JOB_FSDP_HDR + (size_t)l->fsdp * l->fsdp_unit[v] * job_fsdp_elem(l);
}

static size_t fsdp_group_bytes(const job_layout_t *l)
{
    size_t n = 0;
    for (int v = 0; v < l->S; v++)
        n += fsdp_xchg_bytes(l, v);
    return n;
}

size_t job_fsdp_bytes(const job_layout_t *l)
{
    return l->fsdp > 1 && !l->gpu ? (size_t)l->copies * fsdp_group_bytes(l) : 0; /* the GPU's: plane_nccl.c */
}

job_fsdp_xchg_t *job_fsdp_xchg(void *seg, const job_layout_t *l, int group, int vstage)
{
    size_t off = (size_t)group * fsdp_group_bytes(l);
    for (int v = 0; v < vstage; v++)
        off += fsdp_xchg_bytes(l, v);
    return (job_fsdp_xchg_t *)((char *)seg + off);
}

void job_fsdp_set_closed(void *seg, const job_layout_t *l, int closed)
{
    for (int g = 0; seg && g < l->copies; g++)
        for (int v = 0; v < l->S; v++) {
            job_fsdp_xchg_t *x = job_fsdp_xchg(seg, l, g, v);
            for (int k = 0; !closed && k < l->fsdp; k++)
                atomic_store(&x->member[k].seq, 0);
            atomic_store(&x->closed, (uint64_t)closed);
            for (int k = 0; k < l->fsdp; k++) /* a waiter sleeps on a member's sequence number */
                util_futex_wake((void *)&x->member[k].seq);
        }
}

size_t job_act_bytes(const job_layout_t *l) { return l->nccl ? 0 : (size_t)l->dp * (l->S - 1) * 2 * l->act_ring; }

int job_stage_range(const manifest_t *m, int s, size_t *b, size_t *e)
{
    int p0, p1;
    param_table_t tab;
    if (manifest_stage_pieces(m, s, &p0, &p1) || params_table_init(&tab, &m->model))
        return -ENOMEM;
    params_piece_range(&tab, p0, p1, b, e);
    params_table_free(&tab);
    return 0;
}

size_t job_dp_chunk(const job_layout_t *l, size_t n)
{
    size_t c = (size_t)job_chunks(l);
    return (n + c - 1) / c;
}

void job_fsdp_part(const job_layout_t *l, int replica, size_t begin, size_t end, size_t *b, size_t *e)
{
    size_t chunk = job_dp_chunk(l, end - begin), at = begin + (size_t)(replica % l->fsdp) * chunk;
    *b = at < end ? at : end;
    *e = at + chunk < end ? at + chunk : end;
}

int job_shard_range(const job_layout_t *l, const manifest_t *m, int k, size_t *b, size_t *e)
{
    if (!l->nccl) {
        manifest_shard_range(l->total, m->shards, k, b, e);
        if (!l->opt->whole_tensors)
            return 0;
        param_table_t tab; /* each cut moved up to the next tensor boundary: still a tiling */
        if (params_table_init(&tab, &m->model))
            return -ENOMEM;
        *b = params_next_boundary(&tab, *b);
        *e = params_next_boundary(&tab, *e);
        params_table_free(&tab);
        return 0;
    }
    size_t sb, se;
    if (job_stage_range(m, k / job_chunks(l), &sb, &se))
        return -ENOMEM;
    size_t chunk = job_dp_chunk(l, se - sb), r = (size_t)(k % job_chunks(l));
    *b = sb + r * chunk < se ? sb + r * chunk : se;
    *e = sb + (r + 1) * chunk < se ? sb + (r + 1) * chunk : se;
    return 0;
}

int job_host_parts(const job_layout_t *l, const manifest_t *m, job_range_t **out, int *n)
{
    *out = NULL;
    *n = 0;
    int shards = l->hosts > 1 ? m->shards : 1;
    job_range_t *r = malloc((size_t)shards * sizeof(*r));
    if (!r)
        return -ENOMEM;
    if (l->hosts <= 1) {
        r[0] = (job_range_t){0, l->total, 0};
        *out = r;
        *n = 1;
        return 0;
    }
    /* across hosts the data plane is NCCL: shard k = s * C + r is replica r's chunk of stage s,
     * so shards in order of k are in flat order (empty ones where a stage has fewer floats than
     * replicas) */
    int k_n = 0;
    size_t at = 0;
    for (int k = 0; k < shards; k++) {
        size_t b, e;
        if (job_shard_range(l, m, k, &b, &e)) {
            free(r);
            return -ENOMEM;
        }
        if (b == e)
            continue;
        if (b != at) {
            free(r);
            return -EINVAL;
        }
        int host = job_host_of(l, k % job_chunks(l));
        if (k_n && r[k_n - 1].host == host)
            r[k_n - 1].end = e;
        else
            r[k_n++] = (job_range_t){b, e, host};
        at = e;
    }
    if (at != l->total) {
        free(r);
        return -EINVAL;
    }
    *out = r;
    *n = k_n;
    return 0;
}

size_t job_act_off(const job_layout_t *l, int replica, int boundary, int grad)
{
    return (((size_t)replica * (l->S - 1) + boundary) * 2 + (grad ? 1 : 0)) * l->act_ring;
}

int job_seg_create(shm_seg_t **out, const char *job, const job_layout_t *l, char *err, size_t errlen)
{
    int rc = shm_create(out, job, "job", job_seg_bytes(l), err, errlen);
    if (rc)
        return rc;
    job_hdr_t *h = shm_data(*out);
    *h = (job_hdr_t){.magic = JOB_MAGIC, .version = JOB_VERSION, .owner_pid = getpid(),
                     .owner_start = job_proc_start(getpid()), .n_blocks = l->n_blocks};
    return 0;
}

int job_act_create(shm_seg_t **out, const char *job, const job_layout_t *l, char *err, size_t errlen)
{
    int rc = shm_create(out, job, "act", job_act_bytes(l), err, errlen);
    for (int r = 0; r < l->dp && !rc; r++)
        for (int b = 0; b < l->S - 1 && !rc; b++)
            for (int g = 0; g < 2 && !rc; g++)
                if ((rc = ring_format((char *)shm_data(*out) + job_act_off(l, r, b, g), l->act_ring, (uint32_t)l->M,
                                      l->act_slot, 0)))
                    util_fail(err, errlen, rc, "act segment: cannot format its rings: %s", strerror(-rc));
    return rc;
}

size_t job_optstate_bytes(const job_layout_t *l, int shards)
{
    return l->gpu_shards ? 0
                         : job_optstate_hdr_bytes(shards) + (size_t)l->host_banks * l->arrays * l->stride * sizeof(float);
}

int job_optstate_create(shm_seg_t **out, const char *job, const job_layout_t *l, int shards, char *err,
                        size_t errlen)
{
    int rc = shm_create(out, job, JOB_OPTSTATE_SEG, job_optstate_bytes(l, shards), err, errlen);
    if (rc)
        return rc;
    void *mem = shm_data(*out);
    *(job_optstate_hdr_t *)mem = (job_optstate_hdr_t){.magic = JOB_OPTSTATE_MAGIC, .version = JOB_OPTSTATE_VERSION,
                                                      .shards = (uint32_t)shards, .total = l->total,
                                                      .stride = l->stride, .arrays = (uint32_t)l->arrays,
                                                      .banks = (uint32_t)l->host_banks};
    for (int k = 0; k < shards; k++) {
        atomic_store(&job_optstate_rec(mem, k)->done, -1);
        atomic_store(&job_optstate_rec(mem, k)->writing, 0);
    }
    return 0;
}

int job_optstate_check(const void *mem, const job_layout_t *l, int shards, char *err, size_t errlen)
{
    const job_optstate_hdr_t *h = mem;
    if (h->magic != JOB_OPTSTATE_MAGIC || h->version != JOB_OPTSTATE_VERSION || h->shards != (uint32_t)shards ||
        h->total != l->total || h->stride != l->stride || h->arrays != (uint32_t)l->arrays ||
        h->banks != (uint32_t)l->host_banks)
        return util_fail(err, errlen, -EINVAL, "the optstate segment is not this job's (%u shards of %llu "
                         "parameters, %u banks; the job has %d of %zu, %d banks)", h->shards,
                         (unsigned long long)h->total, h->banks, shards, l->total, l->host_banks);
    return 0;
}

double job_meminfo(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "re");
    char line[256];
    double v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            v = strtod(line + n + 1, NULL) * 1024; /* kB */
            break;
        }
    if (f)
        fclose(f);
    return v;
}

int job_check_memory(const job_layout_t *l, const manifest_t *m, char *err, size_t errlen)
{
    const double G = 1073741824.0;
    int seqs = m->local_batch_size / m->microbatches;
    double params = (double)job_params_bytes(l), grads = l->gpu_shards ? 0 : params;
    double staging = manifest_snapshots(m) || m->ckpt_load[0] ? (double)staging_bytes(l->total, l->arrays) : 0;
    double other = (double)job_seg_bytes(l) + (l->S > 1 && !l->nccl ? (double)job_act_bytes(l) : 0) +
                   (double)job_fsdp_bytes(l) +
                   (l->gpu ? (double)devdir_bytes(l) : 0) + (double)ldr_seg_bytes(m->dp, manifest_loader_slots(m), seqs, m->seq_len);
    /* the CPU shards' state: optshard.host_banks banks of the training state (job_optstate_bytes) */
    double state = m->host_rank == 0 ? (double)job_optstate_bytes(l, m->shards) : 0;
    double shm = params + grads + staging + other + state;
    double avail = job_meminfo("MemAvailable"), swap = job_meminfo("SwapFree"), shm_free = -1;
    struct statvfs vfs;
    if (statvfs("/dev/shm", &vfs) == 0)
        shm_free = (double)vfs.f_bavail * (double)vfs.f_frsize;
    if (avail >= 0 && swap > 0)
        avail += swap;
    if ((avail < 0 || shm <= avail) && (shm_free < 0 || shm <= shm_free))
        return 0;
    char have[128] = "", dev_shm[96] = "";
    if (avail >= 0)
        snprintf(have, sizeof(have), "%.1f GiB are available (MemAvailable + SwapFree)", avail / G);
    if (shm_free >= 0)
        snprintf(dev_shm, sizeof(dev_shm), "%s/dev/shm has %.1f GiB free", have[0] ? " and " : "", shm_free / G);
    return util_fail(err, errlen, -ENOMEM, "the job needs at least %.1f GiB of memory on this host in shared "
                     "segments (params %.1f GiB, grads %.1f, optimizer state %.1f, staging %.1f, the rest %.2f) but "
                     "%s%s: a smaller model, fewer replicas or a larger machine", shm / G, params / G, grads / G,
                     state / G, staging / G, other / G, have, dev_shm);
}

/* The state (field 3) and start time (field 22) of process pid from /proc; 0 when gone. */
static int proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    /* the command name (field 2) may hold spaces and parentheses: count from the last ')' */
    char *p = strrchr(buf, ')');
    unsigned long long st = 0;
    /* fields 3..22 follow: state, then 18 numbers, then starttime */
    if (!p || sscanf(p + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", state,
                     &st) != 2)
        return 0;
    *start = st;
    return 1;
}

uint64_t job_proc_start(pid_t pid)
{
    char state;
    uint64_t start;
    return proc_stat(pid, &state, &start) ? start : 0;
}

int job_owner_alive(const job_hdr_t *h)
{
    char state;
    uint64_t start;
    if (h->owner_pid <= 0)
        return 0;
    if (kill((pid_t)h->owner_pid, 0) < 0 && errno == ESRCH)
        return 0;
    /* a zombie is gone too: an orphaned coordinator (its supervisor killed) waits for init to reap it */
    return proc_stat((pid_t)h->owner_pid, &state, &start) && start == h->owner_start && state != 'Z' &&
           state != 'X';
}
