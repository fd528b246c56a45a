/* Checking a parsed manifest (see manifest.h, manifest_validate): each key's bounds, then the
 * values across keys, the model, the topology, checkpoints and placement, every error naming
 * the key's origin; then the values that follow from others (resolve). */
#include "stages/job/manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ipc/argv.h"
#include "ipc/util.h"
#include "kernels/cpu/pool.h"
#include "kernels/optim.h"
#include "kernels/params.h"
#include "stages/job/manifest_keys.h"

/* "ORIGIN: message" for key k. */
static int fail_at(const manifest_t *m, int k, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail_at(const manifest_t *m, int k, char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return -EINVAL;
    char o[MANIFEST_PATH_MAX + 64];
    int n = snprintf(err, errlen, "%s: ", mkey_origin(m, k, o, sizeof(o)));
    if (n >= 0 && (size_t)n < errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

static int valid_job_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 63)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-'))
            return 0;
    return 1;
}

/* Every key's own bounds: strings terminated, integers at or above their minimum, numbers finite. */
static int check_keys(const manifest_t *m, char *err, size_t errlen)
{
    for (int k = 0; k < mkey_count; k++) {
        const mkey_t *K = &mkey_table[k];
        const char *field = (const char *)m + K->off;
        if ((K->type == MKEY_STR || K->type == MKEY_FLAVOR) && strnlen(field, K->size) == K->size)
            return fail_at(m, k, err, errlen, "%s.%s is not NUL-terminated", K->section, K->key);
        if (K->type == MKEY_INT && K->min != MKEY_NO_MIN && *(const int *)field < K->min)
            return fail_at(m, k, err, errlen, "%s.%s = %d must be >= %d", K->section, K->key,
                           *(const int *)field, K->min);
        if (K->type == MKEY_DOUBLE && !isfinite(*(const double *)field))
            return fail_at(m, k, err, errlen, "%s.%s = %g must be a finite number", K->section,
                           K->key, *(const double *)field);
    }
    return 0;
}

/* Whether a loader command splits into words (ipc/argv.h: no shell runs it); why not in why. */
static int command_splits(const char *command, char *why, size_t n)
{
    argv_t a;
    int rc = command[0] ? argv_split(command, &a, why, n) : 0;
    if (command[0] && !rc)
        argv_free(&a);
    return rc == 0;
}

/* The checks below return on the first failure: "ORIGIN: message" for section.key. */
#define CHECK(cond, sec, key, ...) \
    do { if (!(cond)) return fail_at(m, mkey_id(sec, key), err, errlen, __VA_ARGS__); } while (0)

/* Names, enums and the optimizer's and schedule's numbers. */
static int check_values(const manifest_t *m, char *err, size_t errlen)
{
    char o2[MANIFEST_PATH_MAX + 64], list[128];
    CHECK(valid_job_name(m->name), "job", "name",
          "job.name '%s' must be 1 to 63 characters from A-Z a-z 0-9 _ - (it names shared "
          "segments and the control socket)", m->name);
    CHECK(!strcmp(m->device, "cpu") || !strcmp(m->device, "cuda"), "job", "device",
          "job.device = \"%s\": expected \"cpu\" or \"cuda\"", m->device);
    CHECK(m->heartbeat_timeout_ms > m->heartbeat_interval_ms, "job", "heartbeat_timeout_ms",
          "job.heartbeat_timeout_ms = %d must exceed job.heartbeat_interval_ms = %d (%s)",
          m->heartbeat_timeout_ms, m->heartbeat_interval_ms,
          mkey_origin(m, mkey_id("job", "heartbeat_interval_ms"), o2, sizeof(o2)));
    CHECK(m->max_restarts <= MANIFEST_MAX_RESTARTS, "job", "max_restarts",
          "job.max_restarts = %d must be in 0..%d (0: a failed job is not restarted)", m->max_restarts,
          MANIFEST_MAX_RESTARTS);
    CHECK(m->restart_backoff_ms <= MANIFEST_MAX_BACKOFF_MS, "job", "restart_backoff_ms",
          "job.restart_backoff_ms = %d must be in 0..%d (the wait doubles per restart up to %d ms anyway)",
          m->restart_backoff_ms, MANIFEST_MAX_BACKOFF_MS, MANIFEST_MAX_BACKOFF_MS);
    CHECK(!strcmp(m->model_name, "llama3"), "model", "name",
          "model.name = \"%s\": expected \"llama3\" (the only model family)", m->model_name);
    model_config_t preset;
    CHECK(!config_preset(m->flavor, &preset), "model", "flavor",
          "model.flavor: unknown flavor '%s' (expected one of %s)", m->flavor, MKEY_FLAVOR_LIST);
    char optims[128];
    CHECK(optim_find(m->optimizer_name), "optimizer", "name", "optimizer.name = \"%s\": expected %s (the optimizers built in)",
          m->optimizer_name, optim_names(optims, sizeof(optims)));
    CHECK(m->seed <= (uint64_t)INT64_MAX, "training", "seed",
          "training.seed = %" PRIu64 " must be below 2^63 (TOML integers are signed 64-bit)", m->seed);
    CHECK(m->threads <= POOL_MAX_THREADS, "training", "threads",
          "training.threads = %d exceeds %d, the most threads a stage process runs (0 = CPUs / stage processes)",
          m->threads, POOL_MAX_THREADS);
    CHECK(m->host_timeout_s <= 86400, "job", "host_timeout_s", "job.host_timeout_s = %d must be in 1..86400",
          m->host_timeout_s);
    CHECK(m->startup_timeout_s <= 86400, "job", "startup_timeout_s", "job.startup_timeout_s = %d must be in 1..86400",
          m->startup_timeout_s);
    CHECK(m->device_memory_gib >= 0 && m->device_memory_gib <= 1e6, "job", "device_memory_gib",
          "job.device_memory_gib = %g must be in 0..1e6 (GiB of each GPU for the memory plan; 0 = ask nvidia-smi)",
          m->device_memory_gib);
    CHECK(!strcmp(m->mps, "off") || !strcmp(m->mps, "on") || !strcmp(m->mps, "auto"), "job", "mps",
          "job.mps = \"%s\": expected \"off\", \"on\" or \"auto\" (NVIDIA's Multi-Process Service for the "
          "processes sharing a GPU)", m->mps);
    CHECK(m->watchdog_s >= 0 && m->watchdog_s <= 86400, "job", "watchdog_s",
          "job.watchdog_s = %g must be in 0..86400 (0: 10 x the median step time + 10 s)", m->watchdog_s);
    CHECK(m->max_norm >= 0, "training", "max_norm", "training.max_norm = %g must be >= 0 (0 = no clipping)", m->max_norm);
    CHECK(m->lr >= 0, "optimizer", "lr", "optimizer.lr = %g must be >= 0", m->lr);
    CHECK(m->beta1 >= 0 && m->beta1 < 1, "optimizer", "beta1", "optimizer.beta1 = %g must be in [0, 1)", m->beta1);
    CHECK(m->beta2 >= 0 && m->beta2 < 1, "optimizer", "beta2", "optimizer.beta2 = %g must be in [0, 1)", m->beta2);
    CHECK(m->eps > 0, "optimizer", "eps", "optimizer.eps = %g must be > 0", m->eps);
    CHECK(m->weight_decay >= 0, "optimizer", "weight_decay", "optimizer.weight_decay = %g must be >= 0", m->weight_decay);
    CHECK(m->lr_sched.decay_ratio == -1 || (m->lr_sched.decay_ratio >= 0 && m->lr_sched.decay_ratio <= 1),
          "lr_scheduler", "decay_ratio",
          "lr_scheduler.decay_ratio = %g must be in [0, 1] (or -1: every step after warmup decays)",
          m->lr_sched.decay_ratio);
    CHECK(strcmp(lr_decay_name(m->lr_sched.decay_type), "?"), "lr_scheduler", "decay_type",
          "lr_scheduler.decay_type: invalid value %d", (int)m->lr_sched.decay_type);
    CHECK(m->lr_sched.lr_min >= 0 && m->lr_sched.lr_min <= 1, "lr_scheduler", "min_lr_factor",
          "lr_scheduler.min_lr_factor = %g must be in [0, 1]", m->lr_sched.lr_min);
    CHECK(m->peak_tflops >= 0, "metrics", "peak_tflops",
          "metrics.peak_tflops = %g must be >= 0 (0 = the cached sgemm peak)", m->peak_tflops);
    CHECK(m->tb_folder[0], "metrics", "save_tb_folder",
          "metrics.save_tb_folder must not be empty (\"tb\": under job.dump_folder)");
    CHECK(m->sample_temperature >= 0, "sample", "temperature", "sample.temperature = %g must be >= 0 (0 = greedy)",
          m->sample_temperature);
    CHECK(strcmp(sched_kind_name(m->schedule), "?"), "parallelism", "pipeline_parallel_schedule",
          "parallelism.pipeline_parallel_schedule: invalid value %d (expected one of %s)",
          (int)m->schedule, mkey_sched_list(list, sizeof(list)));
    CHECK(!m->val_enable || m->val_dataset_path[0], "validation", "enable",
          "validation.enable is true but validation.dataset_path is empty");
    char why[256];
    CHECK(command_splits(m->command, why, sizeof(why)), "loader", "command", "loader.command: %s", why);
    return 0;
}

/* The model (config_validate names the field, "model.dim (250) ...": the error points at
 * that key), and the batch shape against it. config_validate also completes the model config
 * (n_kv_heads 0 = n_heads), the one derived value set during the checks: the topology's
 * checks count the parameters of the whole model. */
static int check_model(manifest_t *m, char *err, size_t errlen)
{
    char o2[MANIFEST_PATH_MAX + 64], msg[256];
    if (config_validate(&m->model, msg, sizeof(msg))) {
        int at = mkey_id("model", "flavor");
        for (const char *p = strstr(msg, "model."); p; p = strstr(p + 1, "model.")) {
            size_t n = strspn(p + 6, "abcdefghijklmnopqrstuvwxyz_");
            char key[32];
            if (n && n < sizeof(key)) {
                memcpy(key, p + 6, n);
                key[n] = 0;
                int k = mkey_find("model", key);
                if (k >= 0 && mkey_table[k].model) {
                    at = k;
                    break;
                }
            }
        }
        return fail_at(m, at, err, errlen, "%s", msg);
    }
    const model_config_t *c = &m->model;
    CHECK(m->seq_len <= c->max_seq_len, "training", "seq_len",
          "training.seq_len = %d exceeds model.max_seq_len = %d (%s)", m->seq_len, c->max_seq_len,
          mkey_origin(m, mkey_id("model", "max_seq_len"), o2, sizeof(o2)));
    /* the loader's cursor table (stages/job/ldr_seg.h) holds 64 steps; the loader runs at most
     * prefetch / microbatches + 1 steps ahead of the stages */
    CHECK(m->prefetch <= 32 * m->microbatches, "loader", "prefetch",
          "loader.prefetch = %d exceeds 32 x parallelism.pipeline_parallel_microbatches = %d",
          m->prefetch, 32 * m->microbatches);
    CHECK(m->local_batch_size % m->microbatches == 0, "parallelism", "pipeline_parallel_microbatches",
          "parallelism.pipeline_parallel_microbatches = %d does not divide training.local_batch_size = %d (%s)",
          m->microbatches, m->local_batch_size,
          mkey_origin(m, mkey_id("training", "local_batch_size"), o2, sizeof(o2)));
    return 0;
}

/* Pipeline degree, split points and shard count against the model. */
static int check_topology(const manifest_t *m, char *err, size_t errlen)
{
    const model_config_t *c = &m->model;
    char o2[MANIFEST_PATH_MAX + 64];
    int pieces = c->n_layers + 2;
    CHECK(m->pp <= pieces, "parallelism", "pipeline_parallel_degree",
          "parallelism.pipeline_parallel_degree = %d exceeds the %d pipeline pieces of the model "
          "(embedding, %d layers, head)", m->pp, pieces, c->n_layers);
    CHECK(m->pp <= MANIFEST_MAX_PP, "parallelism", "pipeline_parallel_degree",
          "parallelism.pipeline_parallel_degree = %d exceeds the most supported, %d", m->pp,
          MANIFEST_MAX_PP);
    const char *sps = "pipeline_parallel_split_points", *lps = "pipeline_parallel_layers_per_stage";
    int L = m->layers_per_stage;
    CHECK(L == 0 || c->n_layers % L == 0, "parallelism", lps,
          "parallelism.%s = %d does not divide model.n_layers = %d", lps, L, c->n_layers);
    CHECK(L == 0 || (c->n_layers / L) % m->pp == 0, "parallelism", lps,
          "parallelism.%s = %d makes %d virtual stages (model.n_layers = %d), not a multiple of "
          "pipeline_parallel_degree = %d", lps, L, c->n_layers / (L ? L : 1), c->n_layers, m->pp);
    CHECK(L == 0 || !m->n_split_points, "parallelism", lps,
          "parallelism.%s and pipeline_parallel_split_points both say where stages begin: give one", lps);
    int v = manifest_vstages(m), S = m->pp * v;
    CHECK(S <= pieces && S <= MANIFEST_MAX_PP, "parallelism", "pipeline_parallel_degree",
          "parallelism.pipeline_parallel_degree = %d with %d virtual stages per rank makes %d stages: more than "
          "the %d pipeline pieces of the model (embedding, %d layers, head) or the most supported, %d", m->pp, v, S,
          pieces, c->n_layers, MANIFEST_MAX_PP);
    CHECK(v == 1 || strcmp(m->device, "cuda"), "parallelism", L ? lps : "pipeline_parallel_schedule",
          "%d virtual stages per pipeline rank (%s, schedule %s): not built for job.device = \"cuda\" (its device "
          "rings and optimizer shards are one per stage process); use one stage per rank there (GPipe, 1F1B, or "
          "InterleavedZeroBubble with pipeline_parallel_layers_per_stage = model.n_layers / "
          "pipeline_parallel_degree)", v, L ? "pipeline_parallel_layers_per_stage" : "the schedule's default",
          sched_kind_name(m->schedule));
    CHECK(m->n_split_points >= 0 && m->n_split_points < MANIFEST_MAX_PP, "parallelism", sps,
          "parallelism.%s: invalid count %d", sps, m->n_split_points);
    char per_rank[48] = "";
    if (v > 1)
        snprintf(per_rank, sizeof(per_rank), " with %d virtual stages per rank", v);
    CHECK(!m->n_split_points || m->n_split_points == S - 1, "parallelism", sps,
          "parallelism.%s has %d entries but pipeline_parallel_degree = %d (%s)%s needs %d (or none for a balanced "
          "split)", sps, m->n_split_points, m->pp,
          mkey_origin(m, mkey_id("parallelism", "pipeline_parallel_degree"), o2, sizeof(o2)), per_rank, S - 1);
    for (int i = 0; i < m->n_split_points; i++) {
        int s = m->split_points[i];
        CHECK(s >= 1 && s <= c->n_layers, "parallelism", sps,
              "parallelism.%s: layers.%d is outside layers.1 .. layers.%d (the model has %d layers)",
              sps, s, c->n_layers, c->n_layers);
        CHECK(i == 0 || s > m->split_points[i - 1], "parallelism", sps,
              "parallelism.%s: layers.%d does not come after layers.%d (split points must increase)",
              sps, s, m->split_points[i - 1]);
    }
    /* the schedule's own rules for this degree, stages per rank and microbatch count, in its words */
    char why[512];
    CHECK(sched_kind_check(m->schedule, m->pp, v, m->microbatches, why, sizeof(why)) == 0, "parallelism",
          "pipeline_parallel_schedule",
          "parallelism.pipeline_parallel_schedule = \"%s\" with pipeline_parallel_degree = %d, %d virtual stage%s "
          "per rank and %d microbatches: %s", sched_kind_name(m->schedule), m->pp, v, v == 1 ? "" : "s",
          m->microbatches, why);
    param_table_t tab;
    if (params_table_init(&tab, c))
        return util_fail(err, errlen, -ENOMEM, "out of memory building the parameter table");
    size_t total = tab.total, blocks = (total + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK;
    params_table_free(&tab);
    /* the shard count given: the NCCL plane's (dp x pp) is resolved after the checks */
    CHECK((size_t)m->shards <= blocks, "optshard", "shards",
          "optshard.shards = %d exceeds the %zu blocks of %d parameters in the model "
          "(%zu parameters)", m->shards, blocks, MANIFEST_BLOCK, total);
    return 0;
}

/* Where checkpoints go. */
static int check_checkpoint(const manifest_t *m, char *err, size_t errlen)
{
    CHECK(!m->ckpt_endpoint[0] || !strncmp(m->ckpt_endpoint, "tcp://", 6), "checkpoint", "endpoint",
          "checkpoint.endpoint = \"%s\": expected \"\" (write locally) or tcp://HOST:PORT of a remote "
          "checkpointd", m->ckpt_endpoint);
    CHECK(m->hosts == 1 || !m->ckpt_enable || !m->ckpt_endpoint[0], "checkpoint", "endpoint",
          "checkpoint.endpoint with job.hosts = %d: a remote checkpointd across hosts is not built; every host "
          "writes its part into checkpoint.folder, which must be one folder every host sees (a shared mount)",
          m->hosts);
    CHECK(!m->ckpt_endpoint[0] || m->ckpt_server_key[0], "checkpoint", "endpoint",
          "checkpoint.endpoint is remote: checkpoint.server_key (the checkpointd's public key file) is needed");
    CHECK(!m->ckpt_endpoint[0] || m->ckpt_client_key[0], "checkpoint", "endpoint",
          "checkpoint.endpoint is remote: checkpoint.client_key (this trainer's secret key file, from "
          "`ctitan ckpt keygen`) is needed");
    CHECK(m->ckpt_folder[0], "checkpoint", "folder", "checkpoint.folder must not be empty");
    CHECK(!m->ckpt_initial_hf || m->ckpt_initial_path[0], "checkpoint", "initial_load_in_hf",
          "checkpoint.initial_load_in_hf = true needs checkpoint.initial_load_path (the Hugging Face folder)");
    return 0;
}

/* Devices, the data plane and hosts. */
static int check_placement(const manifest_t *m, char *err, size_t errlen)
{
    const char *shard_device = m->shard_device[0] ? m->shard_device : m->device; /* as resolve() sets it */
    CHECK(!strcmp(shard_device, "cpu") || !strcmp(shard_device, "cuda"), "optshard", "device",
          "optshard.device = \"%s\": expected \"cpu\" or \"cuda\"", shard_device);
    CHECK(!strcmp(shard_device, "cpu") || !strcmp(m->device, "cuda"), "optshard", "device",
          "optshard.device = \"cuda\" needs job.device = \"cuda\" (the shards update the stages' GPU weights)");
    CHECK(m->gpu_banks == 1 || (m->gpu_banks == 2 && !strcmp(shard_device, "cuda")), "optshard", "gpu_banks",
          "optshard.gpu_banks = %d: expected 1, or 2 with optimizer shards on the GPU (optshard.device \"cuda\"; "
          "CPU shards keep theirs in optshard.host_banks)", m->gpu_banks);
    CHECK(m->host_banks == 2 || (m->host_banks == 1 && !strcmp(shard_device, "cpu")), "optshard", "host_banks",
          "optshard.host_banks = %d: expected 2, or 1 with optimizer shards on the CPU (optshard.device \"cpu\"; "
          "GPU shards keep theirs in optshard.gpu_banks)", m->host_banks);
    CHECK(!strcmp(m->offload_dtype, "float32") || !strcmp(m->offload_dtype, "bfloat16"), "optshard", "offload_dtype",
          "optshard.offload_dtype = \"%s\": expected \"float32\" or \"bfloat16\"", m->offload_dtype);
    CHECK(!strcmp(m->offload_dtype, "float32") || (!strcmp(m->device, "cuda") && !strcmp(shard_device, "cpu")),
          "optshard", "offload_dtype",
          "optshard.offload_dtype = \"bfloat16\" is offload's: it needs GPU stages (job.device = \"cuda\") and CPU "
          "shards (optshard.device = \"cpu\"); a CPU job's stages compute on the fp32 copies, GPU shards use none");
    CHECK(!strcmp(m->data_plane, "ipc") || !strcmp(m->data_plane, "nccl"), "parallelism", "data_plane",
          "parallelism.data_plane = \"%s\": expected \"ipc\" or \"nccl\"", m->data_plane);
    CHECK(strcmp(m->data_plane, "nccl") || !strcmp(shard_device, "cuda"), "parallelism", "data_plane",
          "parallelism.data_plane = \"nccl\" needs job.device = \"cuda\" and optimizer shards on the GPU "
          "(optshard.device = \"cuda\")");
    const optim_t *o = optim_find(m->optimizer_name);
    CHECK(strcmp(m->data_plane, "nccl") || !o || !o->whole_tensors, "optimizer", "name",
          "optimizer.name = \"%s\" needs whole tensors in each shard, and the NCCL data plane's shards are the "
          "replicas' slices of a stage: use data_plane = \"ipc\"", m->optimizer_name);
    CHECK(strcmp(m->data_plane, "nccl") || m->dp <= 4096, "parallelism", "data_parallel_replicate_degree",
          "parallelism.data_parallel_replicate_degree = %d: the NCCL data plane takes at most 4096 replicas", m->dp);
    CHECK(!strcmp(m->fsdp_reshard, "default") || !strcmp(m->fsdp_reshard, "always") ||
          !strcmp(m->fsdp_reshard, "never"), "parallelism", "fsdp_reshard_after_forward",
          "parallelism.fsdp_reshard_after_forward = \"%s\": expected \"default\", \"always\" or \"never\"",
          m->fsdp_reshard);
    int attn;
    CHECK(!config_attn_parse(m->attention, &attn), "training", "attention",
          "training.attention = \"%s\": expected \"auto\", \"cudnn\" or \"ctitan\"", m->attention);
    CHECK(strcmp(m->attention, "cudnn") || !strcmp(m->device, "cuda"), "training", "attention",
          "training.attention = \"cudnn\" is the GPU model's: it needs job.device = \"cuda\"");
    CHECK(!strcmp(m->mp_reduce, "float32") || !strcmp(m->mp_reduce, "bfloat16"), "training", "mixed_precision_reduce",
          "training.mixed_precision_reduce = \"%s\": expected \"float32\" or \"bfloat16\"", m->mp_reduce);
    CHECK(!strcmp(m->mp_reduce, "float32") || m->dp_shard > 1, "training", "mixed_precision_reduce",
          "training.mixed_precision_reduce = \"bfloat16\" is parameter sharding's reduce: it needs "
          "parallelism.data_parallel_shard_degree > 1 (replicas holding whole weights sum in fp32)");
    CHECK(m->dp_shard <= 32, "parallelism", "data_parallel_shard_degree",
          "parallelism.data_parallel_shard_degree = %d: at most 32 replicas share one copy of the weights",
          m->dp_shard);
    CHECK((long long)m->dp_replicate * m->dp_shard <= 4096, "parallelism", "data_parallel_replicate_degree",
          "parallelism.data_parallel_replicate_degree = %d x data_parallel_shard_degree = %d: at most 4096 "
          "data-parallel ranks", m->dp_replicate, m->dp_shard);
    CHECK(m->dp_shard == 1 || !strcmp(m->device, "cpu") || !strcmp(m->data_plane, "nccl"), "parallelism",
          "data_parallel_shard_degree",
          "parallelism.data_parallel_shard_degree = %d with job.device = \"cuda\": parameter sharding on GPUs runs on "
          "the NCCL data plane (parallelism.data_plane = \"nccl\")", m->dp_shard);
    CHECK(m->host_rank < m->hosts, "job", "host_rank", "job.host_rank = %d: the job has job.hosts = %d", m->host_rank,
          m->hosts);
    CHECK(m->hosts == 1 || !strcmp(m->data_plane, "nccl"), "job", "hosts",
          "job.hosts = %d needs parallelism.data_plane = \"nccl\" (CUDA IPC and shared memory stay on one host)",
          m->hosts);
    CHECK(m->dp % m->hosts == 0, "job", "hosts",
          "job.hosts = %d must divide parallelism.data_parallel_replicate_degree = %d (each host runs whole "
          "replicas)", m->hosts, m->dp);
    CHECK(m->hosts == 1 || (!strncmp(m->endpoint, "tcp://", 6) && !strchr(m->endpoint, '*')), "job", "endpoint",
          "job.hosts = %d: job.endpoint must be tcp://HOST:PORT of the coordinator (host_rank 0), the same on "
          "every host", m->hosts);
    CHECK(m->snapshot_interval == 0 || !strcmp(m->device, "cuda") || m->host_banks == 1, "checkpoint",
          "snapshot_interval", "checkpoint.snapshot_interval = %d: in-memory snapshots are what a GPU job (job.device "
          "= \"cuda\") or one with optshard.host_banks = 1 rewinds to; a CPU job recovers in place without them",
          m->snapshot_interval);
    CHECK(m->hosts == 1 || (!m->val_enable && m->sample_tokens == 0), "validation", "enable",
          "job.hosts = %d: the end-of-run validation and sample need every optimizer shard on the coordinator's "
          "host; set validation.enable = false and sample.tokens = 0", m->hosts);
    int hd = config_head_dim(&m->model);
    CHECK(strcmp(m->device, "cuda") || hd == 16 || hd == 32 || hd == 64 || hd == 128, "job", "device",
          "job.device = \"cuda\": the model's head dimension is %d (model.dim %d / model.n_heads %d); the CUDA "
          "attention kernel takes 16, 32, 64 or 128", hd, m->model.dim, m->model.n_heads);
    return 0;
}

#undef CHECK

/* Values that follow from others, set once every check passed. */
static void resolve(manifest_t *m)
{
    if (!m->shard_device[0])
        snprintf(m->shard_device, sizeof(m->shard_device), "%s", m->device);
    if (!strcmp(m->data_plane, "nccl"))
        m->shards = (m->dp_shard > 1 ? m->dp_shard : m->dp) * m->pp; /* a shard per chunk (job_chunks) */
    if (!m->dump_folder[0])
        snprintf(m->dump_folder, sizeof(m->dump_folder), "runs/%s", m->name);
    /* checkpoint.load: a run that writes checkpoints resumes from the newest by default, as
     * torchtitan's does; "none" starts over (written "none" again by manifest_to_toml, so that
     * the resolved manifest reads back the same) */
    if (!strcmp(m->ckpt_load, "none"))
        m->ckpt_load[0] = '\0';
    else if (!m->ckpt_load[0] && m->ckpt_enable)
        snprintf(m->ckpt_load, sizeof(m->ckpt_load), "latest");
    m->lr_sched.steps = m->steps;
    m->warmup_asked = 0;
    if (m->lr_sched.warmup_steps > m->steps) { /* torchtitan clips (with a warning) too */
        m->warmup_asked = m->lr_sched.warmup_steps;
        m->lr_sched.warmup_steps = m->steps;
    }
}

int manifest_validate(manifest_t *m, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_keys(m, err, errlen)) || (rc = check_values(m, err, errlen)) ||
        (rc = check_model(m, err, errlen)) || (rc = check_topology(m, err, errlen)) ||
        (rc = check_checkpoint(m, err, errlen)) || (rc = check_placement(m, err, errlen)))
        return rc;
    resolve(m);
    return 0;
}
