/* Where every shared buffer of a running job lives. The coordinator creates the segments;
 * workers attach them; offsets come from the resolved manifest alone, so every process
 * computes the same layout.
 *
 *   ctitan.<job>.job     job_hdr_t (owner, endpoint, step), then the gradient-norm partials:
 *                        one double per MANIFEST_BLOCK floats of the flat space
 *   ctitan.<job>.params  one copy of the flat fp32 parameters per replica group (`copies` =
 *                        dp / fsdp of them, stride floats apart: replica r computes on copy
 *                        r / fsdp); with GPU optimizer shards only copy 0, written at the end
 *   ctitan.<job>.grads   the same copies of the flat fp32 gradients (none with GPU optimizer
 *                        shards)
 *   ctitan.<job>.fsdp    with parameter sharding (fsdp > 1): per group and virtual stage an
 *                        exchange (job_fsdp_xchg_t, then one buffer per member of the stage's
 *                        largest piece): the reduce-scatter of stages/runtime/fsdp.h
 *   ctitan.<job>.act     per replica and pipeline boundary b (virtual stage b -> b+1, of pp x
 *                        vs): an activation ring (forward) and a gradient ring (backward), M
 *                        slots each (both ends may be one process: a rank's two chunks)
 *   ctitan.<job>.batch   the loader's segment (stages/job/ldr_seg.h)
 *   ctitan.<job>.dev     with job.device = "cuda": the CUDA IPC handles (stages/job/devdir.h)
 *   ctitan.<job>.optstate with CPU optimizer shards: their state, where a replacement shard
 *                        takes it over (DESIGN.md "Recovery"): a header, per shard a commit
 *                        record, then two banks (one with optshard.host_banks = 1) of the
 *                        training state's arrays (the fp32 master weights and the
 *                        optimizer's state: kernels/optim.h) over the flat space (stride
 *                        floats each) */
#ifndef CTITAN_JOB_H
#define CTITAN_JOB_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ipc/shm.h"
#include "ipc/util.h"
#include "kernels/optim.h"
#include "stages/job/manifest.h"

#define JOB_MAGIC 0x31424f4a4e544943ULL /* "CITNJOB1" */
#define JOB_VERSION 2u
#define JOB_HDR_BYTES 4096

typedef struct {
    uint64_t magic;
    uint32_t version, pad;
    int64_t owner_pid;          /* the coordinator */
    uint64_t owner_start;       /* its start time (/proc/PID/stat field 22), against PID reuse */
    char endpoint[256];         /* control endpoint, for `ctitan loader swap --job` */
    _Atomic int64_t step;       /* step in progress */
    uint64_t n_blocks;          /* norm partials that follow the header */
    char ctl_key[48];           /* the coordinator's public key (Z85): what `ctitan` trusts */
    char run_dir[1024];         /* the coordinator's run folder, with the operator's key */
} job_hdr_t;
_Static_assert(sizeof(job_hdr_t) <= JOB_HDR_BYTES, "the job header fits its page");

typedef struct {
    int dp, pp, M, mb, T, D;
    int vs, S;          /* virtual stages per rank (manifest_vstages), and in all: pp x vs */
    size_t total;       /* floats in the flat parameter space */
    size_t stride;      /* floats between replicas in params/grads: total rounded up to 4 KiB */
    size_t n_blocks;    /* MANIFEST_BLOCK blocks of the flat space */
    size_t act_slot;    /* bytes of one activation hand-off: mb * T * D floats (0 with gpu: the
                         * payload is in the device ring, the host ring only orders it) */
    size_t act_ring;    /* bytes of one activation or gradient ring */
    int gpu;            /* job.device = "cuda": device rings (stages/job/devdir.h) */
    int gpu_shards;     /* optshard.device = "cuda": no host copies of weights and gradients */
    int host_banks;     /* CPU shards: banks of their state in the optstate segment (optshard.host_banks) */
    int host_bf16;      /* offload (GPU stages, CPU shards) with optshard.offload_dtype "bfloat16": the
                         * params and grads segments hold bf16 (job_host_elem) */
    size_t dev_slot;    /* bytes of one device hand-off: mb * T * D bf16 */
    int nccl;           /* parallelism.data_plane = "nccl" (no act segment; shards = job_chunks x pp) */
    int hosts;          /* job.hosts: host h runs replicas [h * dp / hosts, (h + 1) * dp / hosts) */
    int fsdp;           /* parallelism.data_parallel_shard_degree: replicas per copy of the weights */
    int copies;         /* dp / fsdp: copies of the weights and gradients (replica groups) */
    size_t fsdp_unit[MANIFEST_MAX_PP]; /* with fsdp > 1: floats of virtual stage v's largest piece,
                                        * rounded up to 1024 (one member's exchange buffer) */
    int fsdp_pieces[MANIFEST_MAX_PP]; /* with fsdp > 1: virtual stage v's pieces */
    int fsdp_reshard;   /* GPU: piece weights gathered again for the backward
                         * (parallelism.fsdp_reshard_after_forward "always"; "default" with pp 1) */
    int fsdp_bf16;      /* with fsdp > 1: a piece's gradients reduced in bf16
                         * (training.mixed_precision_reduce "bfloat16"; else fp32) */
    const optim_t *opt; /* [optimizer] name's row */
    int arrays;         /* the training state's arrays per parameter (optim_arrays) */
    int shards;         /* optshard.shards */
    int norm_on_device; /* GPU shards on one host's IPC plane, slices at block boundaries: the
                         * shards sum each other's block norms on the device and make the clip
                         * factor there (one UPDATE round a step, no REDUCE: stages/runtime/devnorm.h
                         * devnorm_clip); the test hook CTITAN_TEST_HOST_NORM=1 keeps the
                         * coordinator's sum on the host */
} job_layout_t;

/* Fills the layout from a validated manifest. Returns 0, -ENOMEM, or -EINVAL for an optimizer
 * kernels/optim.h does not know (a manifest that was not validated). */
int job_layout(job_layout_t *l, const manifest_t *m);
size_t job_seg_bytes(const job_layout_t *l);     /* ctitan.<job>.job */
size_t job_params_bytes(const job_layout_t *l);  /* params, and grads alike (no grads with gpu_shards) */
/* Bytes of one element of the params and grads segments: 4 (fp32), 2 with host_bf16. */
static inline size_t job_host_elem(const job_layout_t *l) { return l->host_bf16 ? 2 : 4; }
size_t job_act_bytes(const job_layout_t *l);     /* act (0 with one virtual stage in all) */
/* Offset in the act segment of the ring from virtual stage b to b+1 (grad = 0) or back (grad = 1). */
size_t job_act_off(const job_layout_t *l, int replica, int boundary, int grad);

/* Where replica r's weights and gradients are: copy r / fsdp of params and grads, as member
 * r % fsdp of its group. */
static inline int job_copy_of(const job_layout_t *l, int replica) { return replica / l->fsdp; }

/* Parameter sharding on a device: the part [*b, *e) of a stage's range [begin, end) that replica
 * r keeps (its weights and gradients): chunk r % fsdp of job_dp_chunk, which the NCCL data
 * plane's optimizer shard beside group 0's member owns. */
void job_fsdp_part(const job_layout_t *l, int replica, size_t begin, size_t end, size_t *b, size_t *e);

/* ---- ctitan.<job>.fsdp (parameter sharding; stages/runtime/fsdp.h does the exchange) ---- */
#define JOB_FSDP_SEG "fsdp"
#define JOB_FSDP_HDR 4096
/* One group's exchange for one virtual stage: every member's sequence number (a cache line
 * each; the low 32 bits are a futex word), and closed, set by the coordinator to end every
 * wait for a recovery (stage processes only read it). */
typedef struct {
    _Atomic uint64_t seq;
    char pad[56];
} job_fsdp_member_t;
typedef struct {
    _Atomic uint64_t closed;
    char pad[56];
    job_fsdp_member_t member[];
} job_fsdp_xchg_t;
/* Bytes of the segment (0 without sharding, and on the GPU: the NCCL data plane's exchange) and
 * the exchange of (group, vstage) in it; its member buffers follow its JOB_FSDP_HDR bytes,
 * fsdp_unit[vstage] elements each: fp32, or bf16 with fsdp_bf16 (job_fsdp_elem bytes). */
size_t job_fsdp_bytes(const job_layout_t *l);
job_fsdp_xchg_t *job_fsdp_xchg(void *seg, const job_layout_t *l, int group, int vstage);
static inline size_t job_fsdp_elem(const job_layout_t *l) { return l->fsdp_bf16 ? 2 : 4; }
static inline void *job_fsdp_buf(job_fsdp_xchg_t *x, const job_layout_t *l, int vstage, int member)
{
    return (char *)x + JOB_FSDP_HDR + (size_t)member * l->fsdp_unit[vstage] * job_fsdp_elem(l);
}
/* Every exchange closed (1: every wait ends) or open again with every sequence number at 0
 * (0: only while no stage is inside one: the coordinator, between steps or after a recovery's
 * stages went idle). */
void job_fsdp_set_closed(void *seg, const job_layout_t *l, int closed);

/* Creates ctitan.<job>.job with its header: this process is the owner, no step yet. Returns
 * 0 or -errno with err (-EEXIST: the segment exists). The caller owns *out. */
int job_seg_create(shm_seg_t **out, const char *job, const job_layout_t *l, char *err, size_t errlen);
/* Creates ctitan.<job>.act (S > 1 on the shm or CUDA IPC data plane, not NCCL) with every
 * activation and gradient ring formatted empty (M slots, from step 0). Returns 0 or -errno. */
int job_act_create(shm_seg_t **out, const char *job, const job_layout_t *l, char *err, size_t errlen);

/* Whether every shard's slice starts at a MANIFEST_BLOCK boundary, so that its block norms have
 * their place in the job segment and the global norm is their sum in block order (the same
 * bits for any shard count); else (NCCL's slices, tensor-aligned ones) each shard's partial is
 * summed in shard order. */
int job_norm_by_blocks(const job_layout_t *l);
/* The gradient-norm partials after the header. */
static inline double *job_norm_blocks(job_hdr_t *h) { return (double *)((char *)h + JOB_HDR_BYTES); }

/* The host that runs replica r (its stages, its NCCL shards, a loader for it). */
static inline int job_host_of(const job_layout_t *l, int replica) { return replica / (l->dp / l->hosts); }
/* Device ordinal of stage (replica, rank) among its host's stage processes. */
static inline int job_local_ordinal(const job_layout_t *l, int replica, int rank)
{
    return (replica % (l->dp / l->hosts)) * l->pp + rank;
}
/* The replicas among which the NCCL data plane cuts a stage's range into chunks, each with the
 * GPU optimizer shard of its chunk beside it: every replica, or with parameter sharding the
 * members of a group (each group's chunk k is summed into group 0's, beside which its shard runs). */
static inline int job_chunks(const job_layout_t *l) { return l->fsdp > 1 ? l->fsdp : l->dp; }
/* Stage s's range [*b, *e) of the flat space. Returns 0 or -ENOMEM. */
int job_stage_range(const manifest_t *m, int s, size_t *b, size_t *e);
/* Elements of each replica's chunk of a stage range of n elements for the NCCL reduce-scatter
 * and all-gather: ceil(n / job_chunks) (the stage's buffers have room for dp of them:
 * CUDA_MODEL_SLACK). */
size_t job_dp_chunk(const job_layout_t *l, size_t n);
/* Optimizer shard k's slice [*b, *e) of the flat space: MANIFEST_BLOCK-aligned cuts
 * (manifest_shard_range) on the shm and IPC data planes, each moved up to the next tensor
 * boundary when the optimizer needs whole tensors (optim_t.whole_tensors); with NCCL, shard
 * k = s * C + r (C = job_chunks) is replica r's chunk of stage s's range, which the
 * reduce-scatter sums into that replica's stage. Returns 0 or -ENOMEM. */
int job_shard_range(const job_layout_t *l, const manifest_t *m, int k, size_t *b, size_t *e);

/* A range [begin, end) of the flat space and the host whose optimizer shards own it. */
typedef struct {
    size_t begin, end;
    int host;
} job_range_t;
/* Which host owns what: the ranges of the flat space, in order, each the union of adjacent
 * shards of one host (job_shard_range; shard k runs on host job_host_of(l, k % job_chunks(l))),
 * merged where neighbours have the same host; together exactly [0, total), without overlap. With
 * hosts == 1, one range of host 0. A host's staging segment holds valid data only in its
 * ranges: they are its part of a checkpoint across hosts (checkpointd). *out is malloc'ed
 * (caller frees), *n its length. Returns 0 or -ENOMEM (-EINVAL: shards that do not tile the
 * space, which cannot happen for a validated manifest). */
int job_host_parts(const job_layout_t *l, const manifest_t *m, job_range_t **out, int *n);

/* The NCCL data plane's communicators of one stage, in the order MSG_NCCL carries their
 * ncclUniqueIds (CUDA_NCCL_ID_BYTES each; a communicator the stage does not join, such as
 * act_in on rank 0, is all zeros there): its neighbours'; its pipeline rank's replicas (with
 * parameter sharding the members of its group: job_chunks of them); with sharding and
 * replicate degree > 1, the same member of every group (HSDP). */
enum { JOB_NCCL_ACT_IN, JOB_NCCL_GRAD_OUT, JOB_NCCL_ACT_OUT, JOB_NCCL_GRAD_IN, JOB_NCCL_DP, JOB_NCCL_REP, JOB_NCCL_COMMS };

/* An optimizer shard makes its first state in pieces of this many parameters (the initial
 * weights; a GPU shard's through a host buffer of one piece: stages/roles/optshard.c make_state,
 * which the memory plan counts). */
#define JOB_STATE_PIECE ((size_t)1 << 24)
/* Offload in bf16 (host_bf16): a CPU shard sums the replicas' bf16 gradients into fp32 this many
 * at a time (whole MANIFEST_BLOCKs), or a tensor's part at a time for an optimizer of whole
 * tensors when that is longer (stages/roles/optshard.c grads_at) */
#define JOB_GRAD_CHUNK ((size_t)MANIFEST_BLOCK * 1024)

/* ---- ctitan.<job>.optstate ---- */
#define JOB_OPTSTATE_SEG "optstate"
#define JOB_OPTSTATE_MAGIC 0x3154534f4e544943ULL /* "CITNOST1" */
#define JOB_OPTSTATE_VERSION 3u

typedef struct {
    uint64_t magic;
    uint32_t version, shards;
    uint64_t total, stride;
    uint32_t arrays, banks;     /* arrays per bank (optim_arrays); banks (optshard.host_banks) */
} job_optstate_hdr_t;

/* Shard k's commit record: its slice of bank done % 2 holds the state after `done` steps,
 * whole (-1: not yet made; the shard's first start makes it). An update of step s reads bank
 * s % 2, writes bank (s + 1) % 2, and only then sets done = s + 1, so a shard killed at any
 * moment leaves one whole bank behind. With one bank (optshard.host_banks = 1) both are that
 * bank, updated in place, and `writing` is 1 from the update's first write until its commit:
 * a shard killed then leaves no whole state, and the coordinator rewinds the job instead of
 * replacing it alone (stages/coord/coord_recover.c); killed at any other moment, its bank is
 * whole and it is replaced alone as with two. */
typedef struct {
    _Atomic int64_t done;
    _Atomic int32_t writing;
    char pad[52];
} job_optstate_rec_t;

/* Bytes of the segment for CPU optimizer shards (0 with GPU shards: their state is on the GPU). */
size_t job_optstate_bytes(const job_layout_t *l, int shards);
/* Creates ctitan.<job>.optstate, every record at -1. Returns 0 or -errno with err. */
int job_optstate_create(shm_seg_t **out, const char *job, const job_layout_t *l, int shards, char *err,
                        size_t errlen);
/* Checks the header of an attached segment against the layout. Returns 0 or -EINVAL with err. */
int job_optstate_check(const void *mem, const job_layout_t *l, int shards, char *err, size_t errlen);
static inline size_t job_optstate_hdr_bytes(int shards)
{
    return util_round_page(sizeof(job_optstate_hdr_t) + (size_t)shards * sizeof(job_optstate_rec_t));
}
static inline job_optstate_rec_t *job_optstate_rec(void *mem, int k)
{
    return (job_optstate_rec_t *)((char *)mem + sizeof(job_optstate_hdr_t)) + k;
}
/* Array a (0 the master weights, then the optimizer's state arrays) of bank b (0 or 1; with one
 * bank both are that one) over the flat space. */
static inline float *job_optstate_array(void *mem, int b, int a)
{
    const job_optstate_hdr_t *h = mem;
    return (float *)((char *)mem + job_optstate_hdr_bytes((int)h->shards)) +
           (size_t)((b % (int)h->banks) * h->arrays + a) * h->stride;
}

/* Whether the job fits this host's memory, before any segment is made: its segments here (job,
 * params, grads, act, dev, batch, optstate (with CPU optimizer shards optshard.host_banks banks
 * of the training state: 24 bytes a parameter with AdamW's two), the staging segment with
 * checkpoint enable or load) must fit the free space of /dev/shm and the memory available
 * (MemAvailable + SwapFree). A lower bound: activations come on top. Returns 0 or -ENOMEM
 * saying how much is needed, of what, and how much there is. */
int job_check_memory(const job_layout_t *l, const manifest_t *m, char *err, size_t errlen);
/* A field of /proc/meminfo ("MemAvailable") in bytes, or -1. */
double job_meminfo(const char *key);

/* Start time of a process (clock ticks since boot), 0 if it is gone. */
uint64_t job_proc_start(pid_t pid);
/* Whether the coordinator recorded in h still runs (same PID and start time, not a zombie). */
int job_owner_alive(const job_hdr_t *h);

#endif
