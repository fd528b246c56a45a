/* The memory plan (issue 24): what a job will hold, per process and per device, computed from
 * the resolved manifest alone before any process starts, and the check that refuses a job
 * that cannot fit. `ctitan plan` and `ctitan launch --dry-run` print it; every launch checks
 * it (tools/cmd_launch.c) before the supervisor or the coordinator starts anything.
 *
 * Each row is one process of this host, or the shared-memory segments (one row: shared pages
 * count once, whichever processes map them), on one device: host RAM, or GPU ordinal k of
 * this host. Its columns follow the code that allocates: weights, gradients and the optimizer
 * state (kernels/optim.h's arrays per parameter); activations, one microbatch's
 * under the manifest's activation checkpointing (kernels/act_bytes.h, the layouts each model
 * allocates) times the microbatches the schedule keeps in flight on that rank (sched_peak_acts,
 * with the recompute work sets: model_act_total, sched_peak_held_w); rings and segments;
 * kernel workspaces (cuBLASLt's, the attention's per-thread scratch, the rotary tables); a
 * CUDA context per GPU process; and each process's runtime (code, libraries, threads), a
 * constant measured on the CPU. The GPU figures follow kernels/cuda/model.cu's allocations;
 * the context and the GPU processes' host runtime are estimates still to be measured on a GPU. */
#ifndef CTITAN_PLAN_H
#define CTITAN_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "stages/job/manifest.h"

#define PLAN_HOST (-1)              /* plan_row_t.device of host RAM */
#define PLAN_MAX_GPUS 64
#define PLAN_MIB (1024.0 * 1024.0)
#define PLAN_GIB (1024.0 * 1024.0 * 1024.0)

/* Host RAM a CPU process holds whatever the job: code, libraries, the ZeroMQ and pool threads'
 * stacks, the allocator's arenas. Measured on the CPU (BENCHMARKS.md "Memory plan"): the
 * private resident memory of the demo's launcher, loader and checkpointd (its buffers apart). */
#define PLAN_PROC_BYTES (8.0 * PLAN_MIB)
/* A stage's (OpenBLAS, the pool's threads) and an optimizer shard's (its copy thread), measured
 * the same way, activations and block norms apart. */
#define PLAN_STAGE_BYTES (8.5 * PLAN_MIB)
#define PLAN_SHARD_BYTES (9.5 * PLAN_MIB)
/* Estimates, to be measured on a GPU: the device memory a CUDA context with cuBLASLt takes per
 * process (H100, CUDA 12), and the host memory the CUDA libraries add to a process that loads
 * the plugin. */
#define PLAN_CUDA_CONTEXT_BYTES (512.0 * PLAN_MIB)
#define PLAN_CUDA_HOST_BYTES (300.0 * PLAN_MIB)

typedef enum {
    PLAN_WEIGHTS,      /* fp32 on the host (the params segment), bf16 on a GPU stage */
    PLAN_GRADS,        /* fp32 */
    PLAN_OPTIM,        /* the training state: master weights and the optimizer's arrays */
    PLAN_ACTS,         /* activations: per microbatch x in flight */
    PLAN_RINGS,        /* hand-off rings, the loader's and the job's small segments */
    PLAN_STAGING,      /* the checkpoint staging segment */
    PLAN_WORKSPACE,    /* kernel workspaces and tables */
    PLAN_CONTEXT,      /* a CUDA context (an estimate) */
    PLAN_RUNTIME,      /* the process itself (PLAN_PROC_BYTES, PLAN_STAGE_BYTES, CUDA's host part) */
    PLAN_KINDS
} plan_kind_t;

typedef struct {
    char who[40];          /* "coordinator", "loader", "stage R.P" (rank R of replica P),
                            * "optshard K", "checkpointd", "shared memory" */
    int device;            /* PLAN_HOST, or a GPU ordinal of this host */
    double bytes[PLAN_KINDS];
    double total;
    double file;           /* of its runtime, pages of token files it maps: counted in the table
                            * (they are resident), not in the check (the kernel reclaims them) */
    double act_mb;         /* stage rows: one microbatch's activations, summed over the chunks */
    int in_flight;         /* ... and the microbatches the schedule keeps (sched_peak_acts) */
    double act_work;       /* ... and the work sets besides them (recompute; the gradients B keeps for W) */
    int act_head;          /* ... among which the CUDA head's logits chunk (model_act_size_t head) */
} plan_row_t;

/* What the plan is computed from besides the manifest. */
typedef struct {
    int cpus;              /* CPUs for the stages' threads (0: this machine's) */
} plan_opts_t;

typedef struct {
    plan_row_t *rows;      /* owned */
    int n;
    int gpus;              /* GPUs of this host the job uses (0 on the CPU) */
    double host;           /* the host RAM rows summed: every process at its own peak */
    double host_need;      /* the most held at once, what the check compares: the larger of the
                            * training (every process, the coordinator's end-of-run evaluation
                            * apart) and the end (the workers stopped, the coordinator evaluating
                            * over the segments), token files' pages apart */
    double file;           /* the rows' token-file pages */
    double gpu[PLAN_MAX_GPUS];
    char job[64], device[16];
    char ac_mode[48];      /* the manifest's activation checkpointing, as words */
} plan_t;

/* Computes the plan of a validated manifest for this host (job.host_rank). Returns 0, -ENOMEM,
 * or -EINVAL for pieces the model cannot hold. */
int plan_build(plan_t *p, const manifest_t *m, const plan_opts_t *o, char *err, size_t errlen);
void plan_free(plan_t *p);
/* The rows, the columns in MiB, and each device's total. */
void plan_print(const plan_t *p, FILE *f);

/* What there is. Host: MemAvailable of /proc/meminfo, or the memory cgroup's limit less its usage
 * (its file cache given back; v1 or v2) when lower, and /dev/shm's free space for the shared row;
 * CTITAN_PLAN_HOST_BYTES (for tests and experiments; "@FILE": the number in FILE, read at each
 * check) replaces both. Each GPU: CTITAN_PLAN_DEVICE_BYTES (tests, experiments), else
 * job.device_memory_gib, else the free memory nvidia-smi reports (a child process: the launcher
 * never loads CUDA); < 0 unknown. */
typedef struct {
    double host, shm;      /* bytes; < 0 unknown */
    char host_from[96];    /* where the figure came from */
    double gpu[PLAN_MAX_GPUS];
    char gpu_from[96];
    int gpus;              /* GPUs nvidia-smi found; 0: as many as the plan uses (the overrides) */
} plan_have_t;
void plan_capacity(plan_have_t *h, const manifest_t *m, int gpus);
/* plan_capacity's reading of `nvidia-smi --query-gpu=index,uuid,memory.free
 * --format=csv,noheader,nounits` (smi, changed in place) under CUDA_VISIBLE_DEVICES cvd (NULL:
 * unset): h->gpu[k] and h->gpus for the GPUs the job's CUDA will number 0, 1, ...; nothing when
 * a line is not understood or no GPU is visible (they stay unknown). */
void plan_visible_gpus(plan_have_t *h, char *smi, const char *cvd);
/* The GPUs the job's processes share: the plan's, or fewer when the host has fewer (ordinal k
 * on GPU k % n, as the CUDA plugin places them), and what GPU g of them holds. */
int plan_gpus(const plan_t *p, const plan_have_t *h);
double plan_gpu_need(const plan_t *p, const plan_have_t *h, int g);
/* The most of the job's processes on one GPU of this host (0 on the CPU): two or more are
 * time-sliced there unless NVIDIA's Multi-Process Service runs them (job.mps). */
int plan_gpu_sharing(const plan_t *p, const plan_have_t *h);

/* Whether the plan fits: 0, or -ENOMEM with err naming, per device that does not fit, what the
 * job needs (its largest items) and what there is, and the knobs that would make it fit. */
int plan_check(const plan_t *p, const plan_have_t *h, const manifest_t *m, char *err, size_t errlen);

/* plan_build, plan_capacity and plan_check in one, printing nothing (the supervisor's check
 * before a relaunch): 0 fits, -ENOMEM with plan_check's err, or plan_build's error. */
int plan_fits(const manifest_t *m, char *err, size_t errlen);

#endif
