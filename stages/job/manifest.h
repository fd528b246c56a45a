/* The job manifest: a TOML file in the shape of torchtitan's train configs, plus command-line
 * overrides with the same dotted names (--training.steps 10). The coordinator resolves it once
 * and sends the resolved text (manifest_to_toml) to every worker, so all processes of a job
 * read the same values. Every error names where the value came from: "FILE:LINE" for a key
 * in the file, "--section.key" for an override, and says what was expected.
 *
 * Sections and keys (defaults in manifest_defaults; README.md lists them for users):
 *   [job]          name, dump_folder, description, endpoint, device, hosts, host_rank, keys,
 *                  heartbeat_interval_ms, heartbeat_timeout_ms, max_restarts, restart_backoff_ms,
 *                  watchdog_s, startup_timeout_s
 *   [model]        name, flavor, tokenizer_path, and any model_config_t key
 *                  (dim, n_layers, n_heads, n_kv_heads, vocab_size, multiple_of,
 *                   ffn_dim_multiplier, norm_eps, rope_theta, max_seq_len) over the flavor
 *   [training]     steps, local_batch_size, seq_len, seed, max_norm, threads
 *   [parallelism]  pipeline_parallel_degree, pipeline_parallel_schedule,
 *                  pipeline_parallel_microbatches, pipeline_parallel_split_points,
 *                  pipeline_parallel_layers_per_stage,
 *                  data_parallel_replicate_degree, data_plane
 *   [activation_checkpoint] mode, selective_ac_option
 *   [optimizer]    name, lr, beta1, beta2, eps, weight_decay, decay_embed_and_norms
 *   [lr_scheduler] warmup_steps, decay_ratio, decay_type, min_lr_factor
 *   [loader]       dataset_path, shuffle, prefetch, command
 *   [optshard]     shards, device
 *   [checkpoint]   enable, interval, snapshot_interval, folder, keep_latest_k, load, endpoint,
 *                  server_key, client_key, initial_load_path, initial_load_in_hf
 *   [metrics]      log_freq, file, peak_tflops, enable_tensorboard, save_tb_folder
 *   [profiling]    trace_file
 *   [validation]   enable, dataset_path, steps
 *   [sample]       tokens, temperature */
#ifndef CTITAN_MANIFEST_H
#define CTITAN_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/config.h"
#include "kernels/lr.h"
#include "kernels/params.h"
#include "stages/job/schedule.h"

#define MANIFEST_MAX_PP 64
#define MANIFEST_PATH_MAX 512
#define MANIFEST_MAX_RESTARTS 1000     /* job.max_restarts */
#define MANIFEST_MAX_BACKOFF_MS 30000  /* job.restart_backoff_ms, and the doubled wait's cap */

typedef struct {
    /* [job] */
    char name[64];               /* "ctitan"; [A-Za-z0-9_-]: names segments and the socket */
    char dump_folder[MANIFEST_PATH_MAX]; /* "runs/<name>" when empty: control socket, metrics */
    char description[256];
    char endpoint[256];          /* coordinator ROUTER; "" = ipc://<dump_folder>/ctl.sock */
    char device[16];             /* "cpu", or "cuda": stages run on the GPU, hand-offs through CUDA IPC */
    int hosts;                   /* 1: hosts the job spans (`ctitan launch` runs on each) */
    int host_rank;               /* 0: this host; 0 runs the coordinator, the others are agents that
                                  * start their host's processes (whole replicas: dp % hosts == 0) */
    char job_keys[MANIFEST_PATH_MAX]; /* "": the control plane's keys are made at launch (one host);
                                  * job.hosts > 1: a folder of host<K>.key (this host's secret key)
                                  * and host<K>.pub, from `ctitan ckpt keygen` */
    int heartbeat_interval_ms;   /* 100 */
    int heartbeat_timeout_ms;    /* 3000: a peer silent this long is dead or hung */
    int max_restarts;            /* 3 (0..1000): `ctitan launch` relaunches a failed job from its newest
                                  * checkpoint this many times in a row from the same step; 0 = never */
    int restart_backoff_ms;      /* 1000 (0..30000): the wait before a restart, doubled per restart in a
                                  * row from the same step, at most 30 s */
    int host_timeout_s;          /* 600 (1..86400), job.hosts > 1: how long a coordinator waits for every
                                  * host's agent as a run starts (a relaunch, a host started again),
                                  * and an agent waits for a coordinator to come back */
    double watchdog_s;           /* 0 (automatic: 10 x the median step time + 10 s, startup_timeout_s
                                  * before 3 steps): a stage or shard that owes a reply, or the loader,
                                  * making no progress this long is stack-dumped, killed and replaced */
    double device_memory_gib;    /* 0: with job.device = "cuda", each GPU's memory for the memory plan
                                  * (stages/job/plan.h); 0 = the free memory nvidia-smi reports */
    char mps[8];                 /* "off", "on" or "auto": `ctitan launch` runs the host's GPU processes
                                  * under a private NVIDIA Multi-Process Service daemon
                                  * (stages/supervise/mps.h); auto: where two or more share a GPU and
                                  * nvidia-cuda-mps-control is on PATH */
    int startup_timeout_s;       /* 120 (1..86400): how long a process may take to become ready (at
                                  * the start, a replacement, a swapped-in loader: the swap then
                                  * falls back to the previous loader) */

    /* [model] */
    char model_name[32];         /* "llama3" (the only family) */
    char flavor[32];             /* "debugmodel": a config_preset name */
    model_config_t model;        /* the flavor's preset with the [model] keys given on top */
    char tokenizer_path[MANIFEST_PATH_MAX]; /* "" = none (no text sample) */

    /* [training] */
    int steps;                   /* 10 */
    int local_batch_size;        /* 8: sequences per data-parallel replica per step */
    int seq_len;                 /* 256 */
    uint64_t seed;               /* 0: initialisation and shuffling */
    double max_norm;             /* 1.0: global gradient-norm clip, 0 = off */
    int threads;                 /* 0: CPU threads per stage process, 0 = CPUs / stage processes */

    /* [parallelism] */
    int pp;                      /* pipeline_parallel_degree, 1 */
    sched_kind_t schedule;       /* pipeline_parallel_schedule, "1F1B" */
    int microbatches;            /* pipeline_parallel_microbatches, 1; divides local_batch_size */
    int n_split_points;          /* pipeline_parallel_split_points = ["layers.3", ...]: */
    int split_points[MANIFEST_MAX_PP]; /* virtual stage s+1 starts at layer split_points[s]; empty =
                                  * balanced (pp x stages per rank - 1 of them) */
    int layers_per_stage;        /* pipeline_parallel_layers_per_stage, 0: layers per virtual stage (the
                                  * embedding joins the first, the head the last); it sets the stages per
                                  * rank, n_layers / layers_per_stage / pp; 0 = the schedule's default
                                  * (manifest_vstages) */
    int dp_replicate;            /* data_parallel_replicate_degree, 1: groups that each hold the whole
                                  * weights (HSDP's replicas; with shard degree 1, plain data parallel) */
    int dp_shard;                /* data_parallel_shard_degree, 1: data-parallel ranks sharing one copy
                                  * of the weights and gradients (FSDP; DESIGN.md "Parameter sharding") */
    char fsdp_reshard[16];       /* fsdp_reshard_after_forward, "default": with parameter sharding on the
                                  * GPU, whether a piece's gathered weights go after its forward and
                                  * are gathered again for its backward ("always") or stay for the
                                  * step ("never": the stage's weights whole on each GPU); "default" is
                                  * "always" at pp 1, "never" with a pipeline (torchtitan's) */
    char mp_reduce[16];          /* training.mixed_precision_reduce, "float32": the dtype parameter
                                  * sharding reduces a piece's gradients in among a group's members
                                  * ("bfloat16": half the bytes, each partial sum rounded to bf16);
                                  * needs data_parallel_shard_degree > 1 */
    char attention[16];          /* training.attention, "auto": the GPU model's attention, cuDNN's fused
                                  * kernels where cuDNN 9 loads and agrees with ctitan's own at first
                                  * use, else ctitan's (kernels/cuda/attn.cu); "cudnn" or fail; "ctitan" */
    int dp;                      /* not a key: the data-parallel ranks, dp_replicate x dp_shard (the
                                  * stage replicas; replica r is rank r % dp_shard of group r / dp_shard) */
    char data_plane[16];         /* "ipc": CUDA IPC rings on one host, GPU shards summing replicas;
                                  * "nccl": NCCL send/recv between neighbours, reduce-scatter and
                                  * all-gather across replicas, one optimizer shard per stage process
                                  * (shards = dp x pp, with sharding shard degree x pp); needs device and optshard.device "cuda" */

    /* [activation_checkpoint] (torchtitan's): what each layer keeps for its backward; the stages
     * copy them into their model's config (model_config_t ac_mode, ac_every; config_ac_keep) */
    int ac_mode;                 /* mode, "none": CONFIG_AC_NONE, CONFIG_AC_FULL ("full"),
                                  * CONFIG_AC_SELECTIVE ("selective") */
    int ac_every;                /* selective_ac_option, "2": selective recomputes every Nth layer as
                                  * full; "op" (0 here) keeps the products' outputs in every layer */

    /* [optimizer] (torch.optim.AdamW's numbers) */
    char optimizer_name[16];     /* "AdamW": a row of kernels/optim.h's table */
    double lr;                   /* 8e-4 */
    double beta1, beta2;         /* 0.9, 0.95 */
    double eps;                  /* 1e-8 */
    double weight_decay;         /* 0.1 */
    int decay_embed_and_norms;   /* false: norms and the embedding are not decayed */

    /* [lr_scheduler]: warmup_steps (200, clipped to steps), decay_ratio (-1 = all post-warmup
     * steps decay; the key takes a number in [0, 1]), decay_type ("linear"), min_lr_factor (0);
     * lr_sched.steps mirrors training.steps */
    lr_schedule_t lr_sched;
    int warmup_asked;            /* not a key: the warmup_steps asked for when it was clipped to the
                                  * steps (the banner says so), else 0 */

    /* [loader] */
    char dataset_path[MANIFEST_PATH_MAX]; /* token file (ctitan or llm.c) for the built-in loader */
    int shuffle;                 /* false: sequential windows; true: seeded shuffle per epoch */
    int prefetch;                /* 4: microbatches buffered per replica ring */
    char command[1024];          /* "" = built-in loader; else a program on stages/runtime/ldr.h and its
                                  * arguments, split into words without a shell (ipc/argv.h) */

    /* [optshard] */
    int shards;                  /* 1: optimizer-state shard processes */
    char shard_device[16];       /* "" = job.device: "cuda" updates the stages' GPU weights in place
                                  * through CUDA IPC, "cpu" is offload mode (fp32 in shared memory) */
    int gpu_banks;               /* 1: copies of a GPU shard's state on its device; 2: AdamW writes the
                                  * other, so a checkpoint's copy off the device overlaps the next
                                  * update instead of holding it (12 bytes a parameter more) */
    int host_banks;              /* 2: banks of the CPU shards' state in the optstate segment (AdamW
                                  * reads one, writes the other: a lost shard is replaced alone);
                                  * 1: updated in place, 12 bytes a parameter less, a shard lost
                                  * during its update rewinds the job to its newest snapshot */
    char offload_dtype[16];      /* "float32": the dtype of the weights and gradients offload moves
                                  * between GPU stages and CPU shards through shared memory;
                                  * "bfloat16" halves both (the GPU computes in bf16; the gradients
                                  * reach the optimizer rounded to bf16, as ZeRO-Offload's do) */

    /* [checkpoint] (torchtitan's names where it has them) */
    int ckpt_enable;             /* false: write checkpoints */
    int ckpt_interval;           /* 500: every `interval` steps, and at the last step */
    int snapshot_interval;       /* 0: a GPU job also copies its state into the staging segment every
                                  * this many steps, in memory only: what a rewind goes back to */
    char ckpt_folder[MANIFEST_PATH_MAX]; /* "checkpoint": under dump_folder unless absolute */
    int ckpt_keep;               /* keep_latest_k, 10: older checkpoints are removed; 0 = keep all */
    char ckpt_load[MANIFEST_PATH_MAX]; /* "latest": the newest checkpoint of the folder that
                                  * verifies (fresh if there is none), the default when
                                  * checkpoint.enable; "none" (resolved to ""): start fresh, the
                                  * default otherwise; else a checkpoint directory */
    char ckpt_endpoint[256];     /* "": checkpointd writes locally; "tcp://HOST:PORT": stream to
                                  * the checkpointd on a storage host */
    char ckpt_server_key[MANIFEST_PATH_MAX]; /* its public key file (remote only) */
    char ckpt_client_key[MANIFEST_PATH_MAX]; /* this trainer's secret key file (remote only) */
    char ckpt_initial_path[MANIFEST_PATH_MAX]; /* initial_load_path, "": what a run with no checkpoint
                                  * to resume from (checkpoint.load resolved to nothing) starts from: a
                                  * checkpoint directory, or with initial_load_in_hf a Hugging Face Llama
                                  * folder (config.json + safetensors; checkpointd/hf_import.h) */
    int ckpt_initial_hf;         /* initial_load_in_hf, false */

    /* [metrics] */
    int log_freq;                /* 1: a progress line every log_freq steps */
    char metrics_file[MANIFEST_PATH_MAX]; /* "": one JSON object per step when set */
    double peak_tflops;          /* 0 = the sgemm peak measured once per machine (peak_cache.h); MFU's divisor */
    int tb_enable;               /* enable_tensorboard, false: TensorBoard event files of each step (stages/report/tb.h) */
    char tb_folder[MANIFEST_PATH_MAX]; /* save_tb_folder, "tb": under dump_folder unless absolute */

    /* [profiling] */
    char trace_file[MANIFEST_PATH_MAX]; /* "": a timeline of every action of every step (stages/runtime/trace.h),
                                  * Chrome trace-event JSON for Perfetto and chrome://tracing */

    /* [validation] */
    int val_enable;              /* false */
    char val_dataset_path[MANIFEST_PATH_MAX];
    int val_steps;               /* 8 batches */

    /* [sample] */
    int sample_tokens;           /* 0 = no sample at the end */
    double sample_temperature;   /* 0.8; 0 = greedy (argmax) */

    char path[MANIFEST_PATH_MAX]; /* the file it was read from ("" for defaults only) */
    int origin_line[128];         /* internal: where each key came from (for messages) */
} manifest_t;

/* All defaults (model shape from the "debugmodel" flavor). */
void manifest_defaults(manifest_t *m);

/* Parses TOML text on top of *m (normally fresh defaults); `path` names the text in errors.
 * Unknown sections or keys, wrong types, duplicate keys and TOML syntax errors fail with
 * "PATH:LINE: ..." in err. Returns 0 or -EINVAL. */
int manifest_parse(manifest_t *m, const char *text, size_t len, const char *path, char *err,
                   size_t errlen);
/* manifest_defaults + read the file + manifest_parse. -ENOENT etc. name the file. */
int manifest_load(manifest_t *m, const char *path, char *err, size_t errlen);

/* Applies one override, "section.key" and its value as text, typed like the key
 * (true/false for booleans, a comma-separated list for split points). Errors name
 * "--section.key". */
int manifest_override(manifest_t *m, const char *dotted_key, const char *value, char *err,
                      size_t errlen);

/* Checks every value and the topology once parsing and overrides are done: the model config
 * (config_validate), seq_len <= max_seq_len, local_batch_size divisible by microbatches,
 * prefetch <= 32 x microbatches (the loader's cursor table holds 64 steps),
 * 1 <= pp <= n_layers + 2 (pieces: embedding, each layer, head), split points strictly
 * increasing, inside 1..n_layers and exactly pp-1 of them when given, 1 <= shards and no more
 * shards than MANIFEST_BLOCK-float blocks in the model, names and enums valid. Errors name the
 * key's origin ("demo.toml:14: parallelism.pipeline_parallel_degree = 9 exceeds the 8
 * pipeline pieces of the model (embedding, 6 layers, head)"). Once every check passed, fills
 * the values that follow from others: dump_folder, optshard.device (job.device when empty),
 * shards = dp x pp on the NCCL data plane (data_parallel_shard_degree x pp with sharding), lr_sched.steps, warmup_steps clipped to the steps
 * (and config_validate's model defaults). Returns 0 or -EINVAL. */
int manifest_validate(manifest_t *m, char *err, size_t errlen);

/* The resolved manifest as TOML text naming every key; manifest_parse of it gives back the
 * same values. Caller frees. NULL on ENOMEM. */
char *manifest_to_toml(const manifest_t *m);
/* Takes the model's shape from `src` (a Hugging Face config.json, named by `what`): every
 * [model] key src sets (all but multiple_of and ffn_dim_multiplier, which hidden_dim makes
 * moot) becomes src's, and one given explicitly with another value is -EINVAL naming both,
 * e.g. "model.dim = 256 (run.toml:5) but HF/config.json has 64". max_seq_len given explicitly
 * stays (it bounds the sequence, the weights do not depend on it). The caller validates. */
int manifest_take_model(manifest_t *m, const model_config_t *src, const char *what, char *err, size_t errlen);

/* Where checkpoints go: checkpoint.folder, under job.dump_folder when relative. */
void manifest_ckpt_folder(const manifest_t *m, char *buf, size_t n);
/* Where TensorBoard event files go: metrics.save_tb_folder, under job.dump_folder when relative
 * (torchtitan's place for them). */
void manifest_tb_folder(const manifest_t *m, char *buf, size_t n);

/* Whether the shards copy their state into the staging segment during the run: for
 * checkpoints, or for the in-memory snapshots alone (checkpoint.snapshot_interval). */
static inline int manifest_snapshots(const manifest_t *m) { return m->ckpt_enable || m->snapshot_interval > 0; }
/* Whether a run may load weights at its start (checkpointd, the staging segment): a checkpoint
 * to load, or checkpoint.initial_load_path for when there is none. */
static inline int manifest_loads(const manifest_t *m) { return m->ckpt_load[0] || m->ckpt_initial_path[0]; }

/* Flat-parameter granularity of optimizer shards (floats): shard boundaries and the
 * gradient-norm partial sums fall on multiples of it, so the clip and every update are
 * bitwise the same for any shard count. */
#define MANIFEST_BLOCK 1024
/* The largest manifest file (or manifest text on standard input) read. */
#define MANIFEST_MAX_BYTES (1 << 20)

/* Pieces [*p0, *p1) of virtual stage `stage` (0 .. pp x manifest_vstages - 1; with one stage per
 * rank, the rank) of a validated manifest: layers_per_stage layers each (the embedding with the
 * first, the norm and head with the last), or from the split points (piece = layer + 1), or
 * balanced by compute (manifest_piece_cost): with one stage per rank the contiguous split that
 * minimises the largest stage (ties: the earliest such split); with several, the split whose
 * busiest rank (its stages together, as the schedule places them) is least, then its largest
 * stage, then the earliest, tried one by one up to 2,000,000 splits, past which each stage is
 * balanced on its own. Returns 0 or -ENOMEM (never a different split: every process must find
 * the same one). */
int manifest_stage_pieces(const manifest_t *m, int stage, int *p0, int *p1);
/* What the balanced split weighs piece i by: multiply-adds per token of its forward (the
 * embedding is a lookup: 0; a layer its weights plus causal attention's T x D; the head its
 * weights): compute, not parameters, which would put the embedding's many cheap ones on a par
 * with a layer. */
size_t manifest_piece_cost(const manifest_t *m, const param_table_t *tab, int piece);
/* Virtual stages per pipeline rank: n_layers / layers_per_stage / pp when layers_per_stage is
 * given, else the schedule's default (sched_kind_vstages: 1 for GPipe and 1F1B, 2 for the
 * interleaved and V kinds). The pipeline then has pp x this
 * virtual stages, which manifest_stage_pieces numbers 0 .. pp x this - 1 in model order (which
 * rank holds which is the schedule's placement: stages/job/schedule.h). */
int manifest_vstages(const manifest_t *m);
/* Slots of each loader ring: loader.prefetch, or a whole step's microbatches when one rank
 * takes both the tokens and the targets (a V placement, or pp 1): the loader fills a step's
 * token and target slots in turn, and that rank takes a step's tokens before its first
 * targets, so fewer slots would leave both waiting on each other; and with parameter sharding,
 * whose replicas wait for each other in every backward: the loader fills one replica's step
 * before the next replica's, so a replica that could not take its whole step would wait for a
 * replica the loader has not reached. */
int manifest_loader_slots(const manifest_t *m);

/* Flat range [*begin, *end) of optimizer shard k of K over `total` floats: contiguous,
 * boundaries on multiples of MANIFEST_BLOCK, sizes differing by at most one block. */
void manifest_shard_range(size_t total, int shards, int k, size_t *begin, size_t *end);

#endif
