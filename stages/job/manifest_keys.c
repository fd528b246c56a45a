/* The manifest's key table (see manifest_keys.h) and the names and origins that messages
 * about keys use. */
#include "stages/job/manifest_keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FLD(f) offsetof(manifest_t, f), sizeof(((manifest_t *)0)->f)
#define KINT(s, k, f, min) {s, k, MKEY_INT, FLD(f), min, 0}
#define KDBL(s, k, f) {s, k, MKEY_DOUBLE, FLD(f), 0, 0}
#define KSTR(s, k, f) {s, k, MKEY_STR, FLD(f), 0, 0}
#define KBOOL(s, k, f) {s, k, MKEY_BOOL, FLD(f), 0, 0}
#define KMI(k) {"model", #k, MKEY_INT, FLD(model.k), MKEY_NO_MIN, 1}
#define KMD(k) {"model", #k, MKEY_DOUBLE, FLD(model.k), 0, 1}

/* Order here is the order of manifest_to_toml; sections must be contiguous. */
const mkey_t mkey_table[] = {
    KSTR("job", "name", name),
    KSTR("job", "dump_folder", dump_folder),
    KSTR("job", "description", description),
    KSTR("job", "endpoint", endpoint),
    KSTR("job", "device", device),
    KINT("job", "hosts", hosts, 1),
    KINT("job", "host_rank", host_rank, 0),
    KSTR("job", "keys", job_keys),
    KINT("job", "heartbeat_interval_ms", heartbeat_interval_ms, 1),
    KINT("job", "heartbeat_timeout_ms", heartbeat_timeout_ms, 1),
    KINT("job", "max_restarts", max_restarts, 0),
    KINT("job", "restart_backoff_ms", restart_backoff_ms, 0),
    KINT("job", "host_timeout_s", host_timeout_s, 1),
    KDBL("job", "watchdog_s", watchdog_s),
    KINT("job", "startup_timeout_s", startup_timeout_s, 1),
    KDBL("job", "device_memory_gib", device_memory_gib),
    KSTR("job", "mps", mps),
    KSTR("model", "name", model_name),
    {"model", "flavor", MKEY_FLAVOR, FLD(flavor), 0, 0},
    KSTR("model", "tokenizer_path", tokenizer_path),
    KMI(dim), KMI(n_layers), KMI(n_heads), KMI(n_kv_heads), KMI(vocab_size), KMI(multiple_of),
    KMD(ffn_dim_multiplier), KMD(norm_eps), KMD(rope_theta), KMI(max_seq_len), KMI(hidden_dim),
    KMD(rope_scaling_factor), KMD(rope_low_freq_factor), KMD(rope_high_freq_factor), KMI(rope_original_max_seq_len),
    KINT("training", "steps", steps, 1),
    KINT("training", "local_batch_size", local_batch_size, 1),
    KINT("training", "seq_len", seq_len, 2),
    {"training", "seed", MKEY_U64, FLD(seed), 0, 0},
    KDBL("training", "max_norm", max_norm),
    KSTR("training", "mixed_precision_reduce", mp_reduce),
    KSTR("training", "attention", attention),
    KINT("training", "threads", threads, 0),
    KINT("parallelism", "pipeline_parallel_degree", pp, 1),
    {"parallelism", "pipeline_parallel_schedule", MKEY_SCHED, FLD(schedule), 0, 0},
    KINT("parallelism", "pipeline_parallel_microbatches", microbatches, 1),
    {"parallelism", "pipeline_parallel_split_points", MKEY_SPLITS, FLD(split_points), 0, 0},
    KINT("parallelism", "pipeline_parallel_layers_per_stage", layers_per_stage, 0),
    KINT("parallelism", "data_parallel_replicate_degree", dp_replicate, 1),
    KINT("parallelism", "data_parallel_shard_degree", dp_shard, 1),
    KSTR("parallelism", "fsdp_reshard_after_forward", fsdp_reshard),
    KSTR("parallelism", "data_plane", data_plane),
    {"activation_checkpoint", "mode", MKEY_AC_MODE, FLD(ac_mode), 0, 0},
    {"activation_checkpoint", "selective_ac_option", MKEY_AC_OPTION, FLD(ac_every), 0, 0},
    KSTR("optimizer", "name", optimizer_name),
    KDBL("optimizer", "lr", lr),
    KDBL("optimizer", "beta1", beta1),
    KDBL("optimizer", "beta2", beta2),
    KDBL("optimizer", "eps", eps),
    KDBL("optimizer", "weight_decay", weight_decay),
    KBOOL("optimizer", "decay_embed_and_norms", decay_embed_and_norms),
    KINT("lr_scheduler", "warmup_steps", lr_sched.warmup_steps, 0),
    KDBL("lr_scheduler", "decay_ratio", lr_sched.decay_ratio),
    {"lr_scheduler", "decay_type", MKEY_DECAY, FLD(lr_sched.decay_type), 0, 0},
    KDBL("lr_scheduler", "min_lr_factor", lr_sched.lr_min),
    KSTR("loader", "dataset_path", dataset_path),
    KBOOL("loader", "shuffle", shuffle),
    KINT("loader", "prefetch", prefetch, 1),
    KSTR("loader", "command", command),
    KINT("optshard", "shards", shards, 1),
    KSTR("optshard", "device", shard_device),
    KINT("optshard", "gpu_banks", gpu_banks, 1),
    KINT("optshard", "host_banks", host_banks, 1),
    KSTR("optshard", "offload_dtype", offload_dtype),
    KBOOL("checkpoint", "enable", ckpt_enable),
    KINT("checkpoint", "interval", ckpt_interval, 1),
    KINT("checkpoint", "snapshot_interval", snapshot_interval, 0),
    KSTR("checkpoint", "folder", ckpt_folder),
    KINT("checkpoint", "keep_latest_k", ckpt_keep, 0),
    KSTR("checkpoint", "load", ckpt_load),
    KSTR("checkpoint", "endpoint", ckpt_endpoint),
    KSTR("checkpoint", "server_key", ckpt_server_key),
    KSTR("checkpoint", "client_key", ckpt_client_key),
    KSTR("checkpoint", "initial_load_path", ckpt_initial_path),
    KBOOL("checkpoint", "initial_load_in_hf", ckpt_initial_hf),
    KINT("metrics", "log_freq", log_freq, 1),
    KSTR("metrics", "file", metrics_file),
    KDBL("metrics", "peak_tflops", peak_tflops),
    KBOOL("metrics", "enable_tensorboard", tb_enable),
    KSTR("metrics", "save_tb_folder", tb_folder),
    KSTR("profiling", "trace_file", trace_file),
    KBOOL("validation", "enable", val_enable),
    KSTR("validation", "dataset_path", val_dataset_path),
    KINT("validation", "steps", val_steps, 1),
    KINT("sample", "tokens", sample_tokens, 0),
    KDBL("sample", "temperature", sample_temperature),
};
#define NKEYS ((int)(sizeof(mkey_table) / sizeof(mkey_table[0])))
_Static_assert(sizeof(mkey_table) / sizeof(mkey_table[0]) <= sizeof(((manifest_t *)0)->origin_line) / sizeof(int),
               "origin_line has a slot per key");
const int mkey_count = NKEYS;

int mkey_find(const char *section, const char *key)
{
    for (int k = 0; k < NKEYS; k++)
        if (!strcmp(mkey_table[k].section, section) && !strcmp(mkey_table[k].key, key))
            return k;
    return -1;
}

int mkey_id(const char *section, const char *key)
{
    int k = mkey_find(section, key);
    if (k < 0)
        abort();
    return k;
}

int mkey_section_known(const char *section)
{
    for (int k = 0; k < NKEYS; k++)
        if (!strcmp(mkey_table[k].section, section))
            return 1;
    return 0;
}

const char *mkey_section_list(char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
    for (int k = 0; k < NKEYS && n < len; k++)
        if (!k || strcmp(mkey_table[k].section, mkey_table[k - 1].section))
            n += (size_t)snprintf(buf + n, len - n, "%s[%s]", k ? ", " : "", mkey_table[k].section);
    return buf;
}

const char *mkey_sched_list(char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
    for (int s = 0; n < len && strcmp(sched_kind_name((sched_kind_t)s), "?"); s++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", s ? ", " : "",
                              sched_kind_name((sched_kind_t)s));
    return buf;
}

int mkey_explicit(const manifest_t *m, int k) { return m->origin_line[k] != MKEY_DEFAULT; }

const char *mkey_origin(const manifest_t *m, int k, char *buf, size_t len)
{
    int o = m->origin_line[k];
    if (o > 0)
        snprintf(buf, len, "%s:%d", m->path[0] ? m->path : "<text>", o);
    else if (o == MKEY_OVERRIDE)
        snprintf(buf, len, "--%s.%s", mkey_table[k].section, mkey_table[k].key);
    else if (mkey_table[k].model) {
        char f[MANIFEST_PATH_MAX + 32];
        snprintf(buf, len, "%s (flavor %s)", mkey_origin(m, mkey_id("model", "flavor"), f, sizeof(f)),
                 m->flavor);
    } else
        snprintf(buf, len, "default");
    return buf;
}
