/* The job manifest: parsing a realistic file, every kind of error with its origin (FILE:LINE,
 * --override or default), flavor and override semantics, topology validation, the stage and
 * shard splits, the resolved-TOML round trip, the example manifests, and garbage input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/params.h"
#include "tests/testutil.h"
#include "stages/job/manifest.h"

static const char full_text[] =
    "# a realistic manifest, every section\n"                    /* 1 */
    "[job]\n"                                                     /* 2 */
    "name = \"exp-7_b\"\n"                                        /* 3 */
    "dump_folder = \"/tmp/ctitan/exp7\"\n"                        /* 4 */
    "description = \"GQA run: 'llama1b' minus layers\"\n"         /* 5 */
    "endpoint = \"tcp://127.0.0.1:5555\"\n"                       /* 6 */
    "device = \"cpu\"\n"                                          /* 7 */
    "heartbeat_interval_ms = 50\n"                                /* 8 */
    "heartbeat_timeout_ms = 2_000\n"                              /* 9 */
    "\n"                                                          /* 10 */
    "[model]\n"                                                   /* 11 */
    "n_layers = 4            # over the flavor, before it\n"      /* 12 */
    "name = \"llama3\"\n"                                         /* 13 */
    "flavor = \"llama1b\"\n"                                      /* 14 */
    "tokenizer_path = 'data/tok.bin'\n"                           /* 15 */
    "dim = 512\n"                                                 /* 16 */
    "n_heads = 8\n"                                               /* 17 */
    "n_kv_heads = 2\n"                                            /* 18 */
    "vocab_size = 4096\n"                                         /* 19 */
    "multiple_of = 64\n"                                          /* 20 */
    "ffn_dim_multiplier = 1.3\n"                                  /* 21 */
    "norm_eps = 1e-6\n"                                           /* 22 */
    "rope_theta = 500000\n"                                       /* 23 */
    "max_seq_len = 1024\n"                                        /* 24 */
    "\n"                                                          /* 25 */
    "[training]\n"                                                /* 26 */
    "steps = 1000\n"                                              /* 27 */
    "local_batch_size = 16\n"                                     /* 28 */
    "seq_len = 512\n"                                             /* 29 */
    "seed = 1234567890123\n"                                      /* 30 */
    "max_norm = 0.5\n"                                            /* 31 */
    "threads = 4\n"                                               /* 32 */
    "\n"                                                          /* 33 */
    "[parallelism]\n"                                             /* 34 */
    "pipeline_parallel_degree = 3\n"                              /* 35 */
    "pipeline_parallel_schedule = \"gpipe\"\n"                    /* 36 */
    "pipeline_parallel_microbatches = 8\n"                        /* 37 */
    "pipeline_parallel_split_points = [\"layers.1\", \"layers.3\"]\n" /* 38 */
    "data_parallel_replicate_degree = 2\n"                        /* 39 */
    "\n"                                                          /* 40 */
    "[optimizer]\n"                                               /* 41 */
    "name = \"AdamW\"\n"                                          /* 42 */
    "lr = 3e-4\n"                                                 /* 43 */
    "beta1 = 0.85\n"                                              /* 44 */
    "beta2 = 0.999\n"                                             /* 45 */
    "eps = 1e-10\n"                                               /* 46 */
    "weight_decay = 0.05\n"                                       /* 47 */
    "decay_embed_and_norms = true\n"                              /* 48 */
    "\n"                                                          /* 49 */
    "[lr_scheduler]\n"                                            /* 50 */
    "warmup_steps = 100\n"                                        /* 51 */
    "decay_ratio = 0.8\n"                                         /* 52 */
    "decay_type = \"sqrt\"\n"                                     /* 53 */
    "min_lr_factor = 0.1\n"                                       /* 54 */
    "\n"                                                          /* 55 */
    "[loader]\n"                                                  /* 56 */
    "dataset_path = \"data/train.bin\"\n"                         /* 57 */
    "shuffle = true\n"                                            /* 58 */
    "prefetch = 6\n"                                              /* 59 */
    "command = \"\"\n"                                            /* 60 */
    "\n"                                                          /* 61 */
    "[optshard]\n"                                                /* 62 */
    "shards = 4\n"                                                /* 63 */
    "\n"                                                          /* 64 */
    "[metrics]\n"                                                 /* 65 */
    "log_freq = 10\n"                                             /* 66 */
    "file = \"metrics.jsonl\"\n"                                  /* 67 */
    "peak_tflops = 1.5\n"                                         /* 68 */
    "\n"                                                          /* 69 */
    "[validation]\n"                                              /* 70 */
    "enable = true\n"                                             /* 71 */
    "dataset_path = \"data/val.bin\"\n"                           /* 72 */
    "steps = 4\n"                                                 /* 73 */
    "\n"                                                          /* 74 */
    "[sample]\n"                                                  /* 75 */
    "tokens = 64\n"                                               /* 76 */
    "temperature = 1.0\n";                                        /* 77 */

static void parse_ok(manifest_t *m, const char *text)
{
    char err[512] = "";
    manifest_defaults(m);
    if (manifest_parse(m, text, strlen(text), "m.toml", err, sizeof(err)))
        fail_msg("unexpected error: %s", err);
}

static void validate_ok(manifest_t *m)
{
    char err[512] = "";
    if (manifest_validate(m, err, sizeof(err)))
        fail_msg("unexpected validation error: %s", err);
}

static void override_ok(manifest_t *m, const char *key, const char *value)
{
    char err[512] = "";
    if (manifest_override(m, key, value, err, sizeof(err)))
        fail_msg("unexpected override error: %s", err);
}

static void must_contain(const char *err, const char *needle)
{
    if (!strstr(err, needle))
        fail_msg("error '%s' does not contain '%s'", err, needle);
}

/* Parsing fails with "m.toml:LINE: " first and every needle (NULL-terminated) in the message. */
static void parse_fails(const char *text, int line, ...)
{
    manifest_t m;
    char err[512] = "", prefix[32];
    manifest_defaults(&m);
    assert_int_equal(manifest_parse(&m, text, strlen(text), "m.toml", err, sizeof(err)), -EINVAL);
    snprintf(prefix, sizeof(prefix), "m.toml:%d: ", line);
    if (strncmp(err, prefix, strlen(prefix)))
        fail_msg("for '%s': error '%s' does not start with '%s'", text, err, prefix);
    va_list ap;
    va_start(ap, line);
    for (const char *n; (n = va_arg(ap, const char *));)
        must_contain(err, n);
    va_end(ap);
}

static void override_fails(manifest_t *m, const char *key, const char *value, const char *needle)
{
    char err[512] = "";
    assert_int_equal(manifest_override(m, key, value, err, sizeof(err)), -EINVAL);
    must_contain(err, needle);
}

/* Validation of m with one override fails, the message starting with `start`. */
static void validate_fails(const manifest_t *base, const char *key, const char *value,
                           const char *start, const char *needle)
{
    manifest_t m = *base;
    char err[512] = "";
    if (key)
        override_ok(&m, key, value);
    assert_int_equal(manifest_validate(&m, err, sizeof(err)), -EINVAL);
    if (strncmp(err, start, strlen(start)))
        fail_msg("for %s = %s: error '%s' does not start with '%s'", key, value, err, start);
    must_contain(err, needle);
}

/* Every public field, doubles bitwise. */
static void assert_same_manifest(const manifest_t *a, const manifest_t *b)
{
#define S(f) assert_string_equal(a->f, b->f)
#define I(f) assert_true(a->f == b->f)
#define D(f) assert_memory_equal(&a->f, &b->f, sizeof(double))
    S(name); S(dump_folder); S(description); S(endpoint); S(device); S(mps);
    I(heartbeat_interval_ms); I(heartbeat_timeout_ms); I(max_restarts); I(restart_backoff_ms); D(watchdog_s);
    S(model_name); S(flavor); S(tokenizer_path);
    I(model.dim); I(model.n_layers); I(model.n_heads); I(model.n_kv_heads); I(model.vocab_size);
    I(model.multiple_of); D(model.ffn_dim_multiplier); D(model.norm_eps); D(model.rope_theta);
    I(model.max_seq_len);
    I(steps); I(local_batch_size); I(seq_len); I(seed); D(max_norm); I(threads);
    I(pp); I(schedule); I(microbatches); I(n_split_points); I(dp); I(layers_per_stage); I(host_timeout_s);
    I(ac_mode); I(ac_every);
    for (int i = 0; i < a->n_split_points; i++)
        I(split_points[i]);
    S(optimizer_name); D(lr); D(beta1); D(beta2); D(eps); D(weight_decay);
    I(decay_embed_and_norms);
    I(lr_sched.steps); I(lr_sched.warmup_steps); D(lr_sched.decay_ratio); I(lr_sched.decay_type);
    D(lr_sched.lr_min);
    S(dataset_path); I(shuffle); I(prefetch); S(command);
    I(shards);
    I(log_freq); S(metrics_file); D(peak_tflops); I(tb_enable); S(tb_folder); S(trace_file);
    I(val_enable); S(val_dataset_path); I(val_steps);
    I(sample_tokens); D(sample_temperature);
#undef S
#undef I
#undef D
}

static void test_manifest_defaults_validate(void **state)
{
    manifest_t m;
    manifest_defaults(&m);
    assert_string_equal(m.name, "ctitan");
    assert_string_equal(m.flavor, "debugmodel");
    assert_int_equal(m.model.dim, 256);
    assert_int_equal(m.schedule, SCHED_1F1B);
    assert_int_equal(m.lr_sched.warmup_steps, 200);
    assert_true(m.lr_sched.decay_ratio == -1);
    assert_int_equal(m.max_restarts, 3);
    assert_int_equal(m.restart_backoff_ms, 1000);
    validate_ok(&m);
    assert_string_equal(m.dump_folder, "runs/ctitan");
    assert_int_equal(m.lr_sched.steps, 10);
    assert_int_equal(m.lr_sched.warmup_steps, 10); /* clipped to steps, as torchtitan does */
}

static void test_manifest_parses_full_realistic_manifest(void **state)
{
    manifest_t m;
    parse_ok(&m, full_text);
    assert_string_equal(m.path, "m.toml");
    assert_string_equal(m.name, "exp-7_b");
    assert_string_equal(m.dump_folder, "/tmp/ctitan/exp7");
    assert_string_equal(m.description, "GQA run: 'llama1b' minus layers");
    assert_string_equal(m.endpoint, "tcp://127.0.0.1:5555");
    assert_int_equal(m.heartbeat_interval_ms, 50);
    assert_int_equal(m.heartbeat_timeout_ms, 2000);
    assert_string_equal(m.flavor, "llama1b");
    assert_string_equal(m.tokenizer_path, "data/tok.bin");
    assert_int_equal(m.model.n_layers, 4); /* given before the flavor, still wins */
    assert_int_equal(m.model.dim, 512);
    assert_int_equal(m.model.n_heads, 8);
    assert_int_equal(m.model.n_kv_heads, 2);
    assert_int_equal(m.model.vocab_size, 4096);
    assert_int_equal(m.model.multiple_of, 64);
    assert_true(m.model.ffn_dim_multiplier == 1.3);
    assert_true(m.model.norm_eps == 1e-6);
    assert_true(m.model.rope_theta == 500000.0);
    assert_int_equal(m.model.max_seq_len, 1024);
    assert_int_equal(m.steps, 1000);
    assert_int_equal(m.lr_sched.steps, 1000);
    assert_int_equal(m.local_batch_size, 16);
    assert_int_equal(m.seq_len, 512);
    assert_true(m.seed == 1234567890123ULL);
    assert_true(m.max_norm == 0.5);
    assert_int_equal(m.threads, 4);
    assert_int_equal(m.pp, 3);
    assert_int_equal(m.schedule, SCHED_GPIPE);
    assert_int_equal(m.microbatches, 8);
    assert_int_equal(m.n_split_points, 2);
    assert_int_equal(m.split_points[0], 1);
    assert_int_equal(m.split_points[1], 3);
    assert_int_equal(m.dp, 2);
    assert_true(m.lr == 3e-4 && m.beta1 == 0.85 && m.beta2 == 0.999 && m.eps == 1e-10);
    assert_true(m.weight_decay == 0.05);
    assert_int_equal(m.decay_embed_and_norms, 1);
    assert_int_equal(m.lr_sched.warmup_steps, 100);
    assert_true(m.lr_sched.decay_ratio == 0.8);
    assert_int_equal(m.lr_sched.decay_type, LR_DECAY_SQRT);
    assert_true(m.lr_sched.lr_min == 0.1);
    assert_string_equal(m.dataset_path, "data/train.bin");
    assert_int_equal(m.shuffle, 1);
    assert_int_equal(m.prefetch, 6);
    assert_string_equal(m.command, "");
    assert_int_equal(m.shards, 4);
    assert_int_equal(m.log_freq, 10);
    assert_string_equal(m.metrics_file, "metrics.jsonl");
    assert_true(m.peak_tflops == 1.5);
    assert_int_equal(m.val_enable, 1);
    assert_string_equal(m.val_dataset_path, "data/val.bin");
    assert_int_equal(m.val_steps, 4);
    assert_int_equal(m.sample_tokens, 64);
    assert_true(m.sample_temperature == 1.0);
    validate_ok(&m);
    assert_string_equal(m.dump_folder, "/tmp/ctitan/exp7"); /* explicit: kept */
}

static void test_manifest_type_errors_name_file_line_and_key(void **state)
{
    parse_fails("[training]\nsteps = 2.5\n", 2, "training.steps: expected an integer, got a float (2.5)", NULL);
    parse_fails("[training]\n\nseq_len = \"256\"\n", 3, "training.seq_len: expected an integer, got a string ('256')", NULL);
    parse_fails("[optimizer]\nlr = \"fast\"\n", 2, "optimizer.lr: expected a number, got a string", NULL);
    parse_fails("[job]\nname = 5\n", 2, "job.name: expected a string, got an integer (5)", NULL);
    parse_fails("[loader]\nshuffle = 1\n", 2, "loader.shuffle: expected a boolean", NULL);
    parse_fails("[validation]\nenable = \"yes\"\n", 2, "validation.enable: expected a boolean", NULL);
    parse_fails("[model]\ndim = 1.5\n", 2, "model.dim: expected an integer", NULL);
    parse_fails("[model]\nnorm_eps = true\n", 2, "model.norm_eps: expected a number, got a boolean", NULL);
    parse_fails("[model]\nflavor = 7\n", 2, "model.flavor: expected a string", NULL);
    parse_fails("[training]\nsteps = [1]\n", 2, "training.steps: expected an integer, got an array", NULL);
    parse_fails("[training]\nsteps = 3_000_000_000\n", 2, "training.steps: 3000000000 is out of range", NULL);
    parse_fails("[training]\nseed = -1\n", 2, "training.seed: -1 must be >= 0", NULL);
    parse_fails("[optimizer]\nlr = nan\n", 2, "optimizer.lr: expected a finite number", NULL);
    parse_fails("[optimizer]\neps = -inf\n", 2, "optimizer.eps: expected a finite number", NULL);
    parse_fails("[parallelism]\npipeline_parallel_schedule = \"zb\"\n", 2,
                "parallelism.pipeline_parallel_schedule: unknown schedule 'zb'", "GPipe, 1F1B", NULL);
    parse_fails("[parallelism]\npipeline_parallel_schedule = 1\n", 2,
                "parallelism.pipeline_parallel_schedule: expected a string", NULL);
    parse_fails("[lr_scheduler]\ndecay_type = \"exp\"\n", 2,
                "lr_scheduler.decay_type: unknown decay type 'exp'", "linear, sqrt or cosine", NULL);
    parse_fails("[model]\nflavor = \"huge\"\n", 2, "model.flavor: unknown flavor 'huge'",
                "debugmodel, gpt2s, llama1b, tiny", NULL);
    parse_fails("[parallelism]\npipeline_parallel_split_points = \"layers.2\"\n", 2,
                "parallelism.pipeline_parallel_split_points: expected an array", NULL);
    parse_fails("[parallelism]\npipeline_parallel_split_points = [\"layers.2\", \"layer.3\"]\n", 2,
                "parallelism.pipeline_parallel_split_points: entry 2: expected \"layers.N\", got a string ('layer.3')", NULL);
    parse_fails("[parallelism]\npipeline_parallel_split_points = [true]\n", 2, "entry 1", NULL);
    parse_fails("[parallelism]\npipeline_parallel_split_points = [-1]\n", 2, "entry 1", NULL);
    /* a TOML syntax error also carries file and line */
    parse_fails("[training]\nsteps = 10 steps\n", 2, "unexpected 's' after the value", NULL);
    /* integers are fine where a float is expected, and integer split points too */
    manifest_t m;
    parse_ok(&m, "[optimizer]\nlr = 1\n[parallelism]\npipeline_parallel_split_points = [3]\n");
    assert_true(m.lr == 1.0);
    assert_int_equal(m.split_points[0], 3);
}

static void test_manifest_rejects_unknown_section(void **state)
{
    parse_fails("[job]\nname = \"x\"\n[trainer]\nsteps = 1\n", 3, "unknown section [trainer]",
                "[training]", NULL);
    parse_fails("[job]\n[empty_unknown]\n", 2, "unknown section [empty_unknown]", NULL);
}

static void test_manifest_rejects_unknown_key(void **state)
{
    parse_fails("[training]\nsteps = 1\nstep = 1\n", 3, "unknown key 'step' in [training]", NULL);
    parse_fails("[model]\ndimension = 64\n", 2, "unknown key 'dimension' in [model]", NULL);
    parse_fails("steps = 1\n[training]\n", 1, "key 'steps' is outside any section", NULL);
}

static void test_manifest_rejects_duplicate_key(void **state)
{
    parse_fails("[training]\nsteps = 1\nseq_len = 8\nsteps = 2\n", 4,
                "duplicate key 'steps' (first set on line 2)", NULL);
    parse_fails("[training]\nsteps = 1\n[job]\n[training]\n", 4, "duplicate section [training]", NULL);
}

static void test_manifest_rejects_too_long_strings(void **state)
{
    char text[1200], longname[65], longpath[600];
    memset(longname, 'a', 64);
    longname[64] = 0;
    memset(longpath, 'p', 599);
    longpath[599] = 0;
    snprintf(text, sizeof(text), "[job]\nname = \"%s\"\n", longname);
    parse_fails(text, 2, "job.name: the string is 64 bytes long; at most 63 fit", NULL);
    longname[63] = 0; /* 63 fits */
    manifest_t m;
    snprintf(text, sizeof(text), "[job]\nname = \"%s\"\n", longname);
    parse_ok(&m, text);
    assert_int_equal(strlen(m.name), 63);
    snprintf(text, sizeof(text), "[job]\nname = \"x\"\n[loader]\ndataset_path = \"%s\"\n", longpath);
    parse_fails(text, 4, "loader.dataset_path: the string is 599 bytes long; at most 511 fit", NULL);
    parse_fails("[job]\ndevice = \"cpu-with-a-long-name\"\n", 2, "job.device", "at most 15 fit", NULL);
    /* a failed parse leaves the manifest as it was */
    manifest_defaults(&m);
    char err[256];
    snprintf(text, sizeof(text), "[job]\nname = \"kept\"\n[training]\nsteps = 5\n[loader]\ndataset_path = \"%s\"\n",
             longpath);
    assert_int_equal(manifest_parse(&m, text, strlen(text), "m.toml", err, sizeof(err)), -EINVAL);
    assert_string_equal(m.name, "ctitan");
    assert_int_equal(m.steps, 10);
    override_fails(&m, "job.description", longpath, "--job.description: the string is 599 bytes long");
}

static void test_manifest_model_keys_apply_over_flavor_in_any_order(void **state)
{
    manifest_t a, b;
    parse_ok(&a, "[model]\ndim = 32\nvocab_size = 300\nflavor = \"tiny\"\n");
    parse_ok(&b, "[model]\nflavor = \"tiny\"\nvocab_size = 300\ndim = 32\n");
    assert_same_manifest(&a, &b);
    assert_int_equal(a.model.dim, 32);
    assert_int_equal(a.model.vocab_size, 300);
    assert_int_equal(a.model.n_layers, 2);   /* from tiny */
    assert_int_equal(a.model.max_seq_len, 64);
    assert_int_equal(a.model.multiple_of, 16);
}

static void test_manifest_flavor_override_keeps_explicit_model_keys(void **state)
{
    manifest_t m;
    parse_ok(&m, "[model]\nflavor = \"tiny\"\nvocab_size = 300\ndim = 32\n");
    override_ok(&m, "model.n_layers", "3");
    override_ok(&m, "model.flavor", "debugmodel");
    assert_string_equal(m.flavor, "debugmodel");
    assert_int_equal(m.model.dim, 32);          /* from the file */
    assert_int_equal(m.model.vocab_size, 300);
    assert_int_equal(m.model.n_layers, 3);      /* from an override */
    assert_int_equal(m.model.n_heads, 16);      /* re-derived from debugmodel */
    assert_int_equal(m.model.multiple_of, 256);
    assert_int_equal(m.model.max_seq_len, 2048);
    assert_true(m.model.rope_theta == 500000.0);
    /* the model keys also override after the flavor */
    override_ok(&m, "model.dim", "64");
    assert_int_equal(m.model.dim, 64);
}

static void test_manifest_n_kv_heads_follows_n_heads_unless_set(void **state)
{
    manifest_t m;
    manifest_defaults(&m); /* debugmodel: 16 heads, no GQA */
    override_ok(&m, "model.n_heads", "8");
    assert_int_equal(m.model.n_kv_heads, 8);
    parse_ok(&m, "[model]\nn_heads = 8\nflavor = \"debugmodel\"\n");
    assert_int_equal(m.model.n_kv_heads, 8);
    parse_ok(&m, "[model]\nn_kv_heads = 4\nn_heads = 8\n");
    assert_int_equal(m.model.n_kv_heads, 4);
    parse_ok(&m, "[model]\nflavor = \"tiny\"\nn_heads = 8\n"); /* tiny has GQA: 4 heads, 2 kv */
    assert_int_equal(m.model.n_kv_heads, 2);
    parse_ok(&m, "[model]\nn_kv_heads = 0\n"); /* 0 = same as n_heads, filled by validate */
    validate_ok(&m);
    assert_int_equal(m.model.n_kv_heads, 16);
}

static void test_manifest_overrides_of_each_type(void **state)
{
    manifest_t m;
    manifest_defaults(&m);
    override_ok(&m, "training.steps", "20");
    assert_int_equal(m.steps, 20);
    assert_int_equal(m.lr_sched.steps, 20);
    override_ok(&m, "--training.local_batch_size", " 4 "); /* a leading -- is fine */
    assert_int_equal(m.local_batch_size, 4);
    override_ok(&m, "optimizer.lr", "1e-4");
    assert_true(m.lr == 1e-4);
    override_ok(&m, "optimizer.beta2", "1"); /* an integer for a float key */
    assert_true(m.beta2 == 1.0);
    override_ok(&m, "training.seed", "42");
    assert_true(m.seed == 42);
    override_ok(&m, "loader.shuffle", "true");
    assert_int_equal(m.shuffle, 1);
    override_ok(&m, "validation.enable", "false");
    assert_int_equal(m.val_enable, 0);
    override_ok(&m, "job.name", "run 1 \"quoted\""); /* strings are taken verbatim */
    assert_string_equal(m.name, "run 1 \"quoted\"");
    override_ok(&m, "loader.command", "python3 my_loader.py --x=1, --y");
    assert_string_equal(m.command, "python3 my_loader.py --x=1, --y");
    override_ok(&m, "parallelism.pipeline_parallel_schedule", "gpipe");
    assert_int_equal(m.schedule, SCHED_GPIPE);
    override_ok(&m, "lr_scheduler.decay_type", "cosine");
    assert_int_equal(m.lr_sched.decay_type, LR_DECAY_COSINE);
    override_ok(&m, "model.rope_theta", "10000");
    assert_true(m.model.rope_theta == 10000.0);
    override_ok(&m, "parallelism.pipeline_parallel_split_points", "layers.2,layers.4");
    assert_int_equal(m.n_split_points, 2);
    assert_int_equal(m.split_points[0], 2);
    assert_int_equal(m.split_points[1], 4);
    override_ok(&m, "parallelism.pipeline_parallel_split_points", " 1 , 3,5 ");
    assert_int_equal(m.n_split_points, 3);
    assert_int_equal(m.split_points[2], 5);
    override_ok(&m, "parallelism.pipeline_parallel_split_points", "[\"layers.3\"]");
    assert_int_equal(m.n_split_points, 1);
    assert_int_equal(m.split_points[0], 3);
    override_ok(&m, "parallelism.pipeline_parallel_split_points", "");
    assert_int_equal(m.n_split_points, 0);
}

static void test_manifest_override_errors_name_the_flag(void **state)
{
    manifest_t m;
    manifest_defaults(&m);
    override_fails(&m, "training.steps", "abc", "--training.steps: expected an integer, got 'abc'");
    override_fails(&m, "training.steps", "2.5", "--training.steps: expected an integer, got a float (2.5)");
    override_fails(&m, "training.steps", "", "--training.steps: expected an integer, got ''");
    override_fails(&m, "training.steps", "99999999999", "--training.steps: 99999999999 is out of range");
    override_fails(&m, "optimizer.lr", "fast", "--optimizer.lr: expected a number, got 'fast'");
    override_fails(&m, "optimizer.lr", "inf", "--optimizer.lr: expected a finite number");
    override_fails(&m, "loader.shuffle", "yes", "--loader.shuffle: expected true or false, got 'yes'");
    override_fails(&m, "training.seed", "-3", "--training.seed: -3 must be >= 0");
    override_fails(&m, "parallelism.pipeline_parallel_schedule", "zb",
                   "--parallelism.pipeline_parallel_schedule: unknown schedule 'zb' (expected one of GPipe, 1F1B, "
                   "Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV)");
    override_fails(&m, "lr_scheduler.decay_type", "Cosine", "--lr_scheduler.decay_type: unknown decay type");
    override_fails(&m, "model.flavor", "huge", "--model.flavor: unknown flavor 'huge'");
    override_fails(&m, "parallelism.pipeline_parallel_split_points", "layers.2,layers.x",
                   "--parallelism.pipeline_parallel_split_points: entry 2: expected \"layers.N\"");
    override_fails(&m, "parallelism.pipeline_parallel_split_points", "2,,4", "entry 2");
    override_fails(&m, "parallelism.pipeline_parallel_split_points", "[1,", "unterminated array");
    override_fails(&m, "training.nope", "1", "--training.nope: unknown key 'nope' in [training]");
    override_fails(&m, "trainer.steps", "1", "--trainer.steps: unknown section [trainer]");
    override_fails(&m, "steps", "1", "--steps: expected --section.key");
    override_fails(&m, "training.steps", NULL, "--training.steps: missing value");
    override_fails(&m, "job.description", "bad \xff utf-8", "--job.description: the value is not valid UTF-8");
    /* nothing changed */
    manifest_t d;
    manifest_defaults(&d);
    assert_same_manifest(&m, &d);
}

static manifest_t tiny_manifest(void)
{
    manifest_t m;
    parse_ok(&m, "[job]\nname = \"t\"\n"
                 "[model]\nflavor = \"tiny\"\n"
                 "[training]\nseq_len = 32\n"
                 "[parallelism]\npipeline_parallel_degree = 2\n");
    return m;
}

static void test_manifest_validate_rejects_pp_beyond_pieces(void **state)
{
    manifest_t m = tiny_manifest(), b;
    validate_ok(&m);
    m = tiny_manifest();
    override_ok(&m, "parallelism.pipeline_parallel_degree", "4");
    validate_ok(&m); /* 4 pieces: embedding, 2 layers, head */
    parse_ok(&b, "[job]\nname = \"t\"\n[model]\nflavor = \"tiny\"\n[training]\nseq_len = 32\n"
                 "\n[parallelism]\npipeline_parallel_degree = 5\n");
    validate_fails(&b, NULL, NULL, "m.toml:9: ",
                   "parallelism.pipeline_parallel_degree = 5 exceeds the 4 pipeline pieces of the "
                   "model (embedding, 2 layers, head)");
    m = tiny_manifest();
    validate_fails(&m, "parallelism.pipeline_parallel_degree", "9",
                   "--parallelism.pipeline_parallel_degree: ", "= 9 exceeds the 4 pipeline pieces");
}

static void test_manifest_validate_rejects_microbatches_not_dividing_batch(void **state)
{
    manifest_t m = tiny_manifest();
    validate_fails(&m, "parallelism.pipeline_parallel_microbatches", "3",
                   "--parallelism.pipeline_parallel_microbatches: ",
                   "pipeline_parallel_microbatches = 3 does not divide training.local_batch_size = 8 (default)");
    override_ok(&m, "parallelism.pipeline_parallel_microbatches", "4");
    validate_ok(&m);
}

static void test_manifest_validate_rejects_bad_split_points(void **state)
{
    manifest_t m;
    manifest_defaults(&m); /* debugmodel: 6 layers */
    override_ok(&m, "parallelism.pipeline_parallel_degree", "3");
    validate_fails(&m, "parallelism.pipeline_parallel_split_points", "layers.2",
                   "--parallelism.pipeline_parallel_split_points: ",
                   "has 1 entries but pipeline_parallel_degree = 3 (--parallelism.pipeline_parallel_degree) needs 2");
    validate_fails(&m, "parallelism.pipeline_parallel_split_points", "layers.4,layers.2",
                   "--parallelism.pipeline_parallel_split_points: ",
                   "layers.2 does not come after layers.4 (split points must increase)");
    validate_fails(&m, "parallelism.pipeline_parallel_split_points", "layers.3,layers.3", "--", "does not come after");
    validate_fails(&m, "parallelism.pipeline_parallel_split_points", "layers.2,layers.7", "--",
                   "layers.7 is outside layers.1 .. layers.6");
    validate_fails(&m, "parallelism.pipeline_parallel_split_points", "layers.0,layers.2", "--",
                   "layers.0 is outside");
    manifest_t f;
    parse_ok(&f, "[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_split_points = [\"layers.2\", \"layers.4\"]\n");
    validate_fails(&f, NULL, NULL, "m.toml:3: ", "has 2 entries but pipeline_parallel_degree = 2 (m.toml:2) needs 1");
    override_ok(&m, "parallelism.pipeline_parallel_split_points", "layers.1,layers.6");
    validate_ok(&m);
}

/* Virtual stages: layers per stage must split the layers into a multiple of the degree, not
 * with split points too, not on the GPU; each schedule's own rules come in its words; the
 * stages per rank default to the schedule's. */
static void test_manifest_virtual_stages_and_the_schedules_rules(void **state)
{
    manifest_t m;
    manifest_defaults(&m); /* debugmodel: 6 layers */
    override_ok(&m, "parallelism.pipeline_parallel_degree", "3");
    const char *lps = "parallelism.pipeline_parallel_layers_per_stage";
    validate_fails(&m, lps, "4", "--parallelism.pipeline_parallel_layers_per_stage: ",
                   "parallelism.pipeline_parallel_layers_per_stage = 4 does not divide model.n_layers = 6");
    validate_fails(&m, lps, "3", "--", "= 3 makes 2 virtual stages (model.n_layers = 6), not a multiple of "
                   "pipeline_parallel_degree = 3");
    manifest_t both = m;
    override_ok(&both, "parallelism.pipeline_parallel_split_points", "layers.2,layers.4");
    validate_fails(&both, lps, "2", "--", "and pipeline_parallel_split_points both say where stages begin");
    manifest_t ok = m;
    override_ok(&ok, lps, "2");
    validate_ok(&ok);
    assert_int_equal(manifest_vstages(&ok), 1);
    override_ok(&ok, lps, "1");
    override_ok(&ok, "parallelism.pipeline_parallel_schedule", "Interleaved1F1B");
    override_ok(&ok, "parallelism.pipeline_parallel_microbatches", "3");
    override_ok(&ok, "training.local_batch_size", "6");
    validate_ok(&ok);
    assert_int_equal(manifest_vstages(&ok), 2);
    int p0, p1;
    assert_int_equal(manifest_stage_pieces(&ok, 0, &p0, &p1), 0); /* the embedding and layer 0 */
    assert_int_equal(p0, 0);
    assert_int_equal(p1, 2);
    assert_int_equal(manifest_stage_pieces(&ok, 5, &p0, &p1), 0); /* layer 5, the norm and head */
    assert_int_equal(p0, 6);
    assert_int_equal(p1, 8);
    /* 1F1B takes one stage per rank; V schedules two; DualPipeV at least 2 x pp microbatches */
    override_ok(&ok, "parallelism.pipeline_parallel_schedule", "1F1B");
    validate_fails(&ok, NULL, NULL, "--parallelism.pipeline_parallel_schedule: ",
                   "= \"1F1B\" with pipeline_parallel_degree = 3, 2 virtual stages per rank and 3 microbatches: 1F1B "
                   "needs exactly 1 virtual stage per rank, got 2");
    manifest_t dv = m;
    override_ok(&dv, "parallelism.pipeline_parallel_schedule", "DualPipeV");
    validate_fails(&dv, NULL, NULL, "--parallelism.pipeline_parallel_schedule: ", "DualPipeV");
    override_ok(&dv, "parallelism.pipeline_parallel_microbatches", "6");
    override_ok(&dv, "training.local_batch_size", "6");
    override_ok(&dv, "model.n_layers", "4"); /* 6 pieces for 6 virtual stages */
    validate_ok(&dv);
    assert_int_equal(manifest_vstages(&dv), 2);
    override_ok(&dv, "model.n_layers", "3");
    validate_fails(&dv, NULL, NULL, "--parallelism.pipeline_parallel_degree: ",
                   "= 3 with 2 virtual stages per rank makes 6 stages: more than the 5 pipeline pieces");
    /* the GPU path runs one stage per rank */
    manifest_t gpu = m;
    override_ok(&gpu, "job.device", "cuda");
    override_ok(&gpu, "parallelism.pipeline_parallel_schedule", "ZBVZeroBubble");
    validate_fails(&gpu, NULL, NULL, "--parallelism.pipeline_parallel_schedule: ", "2 virtual stages per pipeline "
                   "rank (the schedule's default, schedule "
                   "ZBVZeroBubble): not built for job.device = \"cuda\"");
    override_ok(&gpu, "parallelism.pipeline_parallel_schedule", "InterleavedZeroBubble");
    override_ok(&gpu, lps, "2"); /* ZB-H1: one stage per rank */
    validate_ok(&gpu);
}

static size_t model_total(const model_config_t *c)
{
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, c), 0);
    size_t total = tab.total;
    params_table_free(&tab);
    return total;
}

static void test_manifest_validate_rejects_too_many_shards(void **state)
{
    manifest_t m = tiny_manifest();
    size_t blocks = (model_total(&m.model) + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK;
    char v[32], needle[128];
    snprintf(v, sizeof(v), "%zu", blocks);
    manifest_t ok = m;
    override_ok(&ok, "optshard.shards", v);
    validate_ok(&ok);
    snprintf(v, sizeof(v), "%zu", blocks + 1);
    snprintf(needle, sizeof(needle), "optshard.shards = %zu exceeds the %zu blocks of %d parameters",
             blocks + 1, blocks, MANIFEST_BLOCK);
    validate_fails(&m, "optshard.shards", v, "--optshard.shards: ", needle);
    validate_fails(&m, "optshard.shards", "0", "--optshard.shards: ", "optshard.shards = 0 must be >= 1");
}

static void test_manifest_validate_rejects_bad_job_name(void **state)
{
    manifest_t m;
    manifest_defaults(&m);
    const char *bad[] = {"", "a b", "x/y", "dot.name", "caf\xc3\xa9", "semi;colon"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        validate_fails(&m, "job.name", bad[i], "--job.name: ", "must be 1 to 63 characters from A-Z a-z 0-9 _ -");
    manifest_t f;
    parse_ok(&f, "[job]\n\nname = \"my job\"\n");
    validate_fails(&f, NULL, NULL, "m.toml:3: ", "job.name 'my job'");
    override_ok(&m, "job.name", "Run_2-b");
    validate_ok(&m);
}

static void test_manifest_cuda_needs_a_head_dimension_the_kernels_take(void **state)
{
    (void)state;
    manifest_t *m = malloc(sizeof(*m));
    char err[512];
    manifest_defaults(m);
    assert_int_equal(manifest_override(m, "job.device", "cuda", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0); /* debugmodel: head dimension 16 */
    manifest_defaults(m);
    assert_int_equal(manifest_override(m, "job.device", "cuda", err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "model.n_heads", "32", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--job.device: job.device = \"cuda\": the model's head dimension is 8"));
    free(m);
}

/* [optshard] device follows job.device unless set; the NCCL data plane needs the GPU for both
 * and makes one optimizer shard per stage process; job.hosts > 1 needs the NCCL plane. */
static void test_manifest_optshard_device_and_data_plane(void **state)
{
    (void)state;
    manifest_t *m = malloc(sizeof(*m));
    char err[512];
    manifest_defaults(m);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    assert_string_equal(m->shard_device, "cpu");
    assert_string_equal(m->data_plane, "ipc");
    manifest_defaults(m);
    assert_int_equal(manifest_override(m, "job.device", "cuda", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    assert_string_equal(m->shard_device, "cuda");
    manifest_defaults(m);
    assert_int_equal(manifest_override(m, "optshard.device", "cuda", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--optshard.device: optshard.device = \"cuda\" needs job.device = \"cuda\""));
    manifest_defaults(m);
    assert_int_equal(manifest_override(m, "optshard.device", "tpu", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "optshard.device = \"tpu\": expected \"cpu\" or \"cuda\""));
    /* two banks of GPU shard state: only where the shards are on the GPU, and only 1 or 2 */
    manifest_defaults(m);
    assert_int_equal(m->gpu_banks, 1);
    assert_int_equal(manifest_override(m, "optshard.gpu_banks", "2", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--optshard.gpu_banks: optshard.gpu_banks = 2: expected 1, or 2 with optimizer shards "
                                "on the GPU"));
    assert_int_equal(manifest_override(m, "job.device", "cuda", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "optshard.gpu_banks", "3", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "optshard.gpu_banks = 3: expected 1, or 2"));
    /* one bank of CPU shard state: only where the shards are on the CPU, and only 1 or 2; its
     * in-memory snapshots are what such a job rewinds to */
    manifest_defaults(m);
    assert_int_equal(m->host_banks, 2);
    assert_int_equal(manifest_override(m, "checkpoint.snapshot_interval", "5", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "checkpoint.snapshot_interval = 5: in-memory snapshots are what a GPU job"));
    assert_int_equal(manifest_override(m, "optshard.host_banks", "1", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "optshard.host_banks", "3", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--optshard.host_banks: optshard.host_banks = 3: expected 2, or 1 with optimizer "
                                "shards on the CPU"));
    manifest_defaults(m);
    assert_int_equal(manifest_override(m, "job.device", "cuda", err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "optshard.host_banks", "1", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "optshard.host_banks = 1: expected 2, or 1 with optimizer shards on the CPU"));
    assert_int_equal(manifest_override(m, "optshard.device", "cpu", err, sizeof(err)), 0); /* offload */
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    /* optshard.offload_dtype: float32 (the default) or bfloat16, the latter offload's only (GPU
     * stages, CPU shards) */
    manifest_defaults(m);
    assert_string_equal(m->offload_dtype, "float32");
    assert_int_equal(manifest_override(m, "optshard.offload_dtype", "bfloat16", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL); /* a CPU job */
    assert_non_null(strstr(err, "--optshard.offload_dtype: optshard.offload_dtype = \"bfloat16\" is offload's: it "
                                "needs GPU stages"));
    assert_int_equal(manifest_override(m, "job.device", "cuda", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL); /* GPU shards */
    assert_non_null(strstr(err, "is offload's"));
    assert_int_equal(manifest_override(m, "optshard.device", "cpu", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "optshard.offload_dtype", "float16", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "optshard.offload_dtype = \"float16\": expected \"float32\" or \"bfloat16\""));
    /* job.mps: off (the default), on or auto */
    manifest_defaults(m);
    assert_string_equal(m->mps, "off");
    assert_int_equal(manifest_override(m, "job.mps", "auto", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "job.mps", "yes", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--job.mps: job.mps = \"yes\": expected \"off\", \"on\" or \"auto\""));
    manifest_defaults(m);
    assert_int_equal(manifest_override(m, "parallelism.data_plane", "mpi", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "parallelism.data_plane = \"mpi\": expected \"ipc\" or \"nccl\""));
    manifest_defaults(m); /* NCCL with the shards on the CPU: refused */
    assert_int_equal(manifest_override(m, "parallelism.data_plane", "nccl", err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "job.device", "cuda", err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "optshard.device", "cpu", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "parallelism.data_plane = \"nccl\" needs job.device = \"cuda\""));
    manifest_defaults(m);
    assert_int_equal(manifest_override(m, "parallelism.data_plane", "nccl", err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "job.device", "cuda", err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "parallelism.pipeline_parallel_degree", "2", err, sizeof(err)), 0);
    assert_int_equal(manifest_override(m, "parallelism.data_parallel_replicate_degree", "3", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    assert_int_equal(m->shards, 6);
    /* in-memory snapshots (what a GPU job rewinds to): GPU jobs only, and not below 0 */
    assert_int_equal(manifest_override(m, "checkpoint.snapshot_interval", "5", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    assert_true(manifest_snapshots(m));
    manifest_defaults(m);
    assert_false(manifest_snapshots(m));
    assert_int_equal(manifest_override(m, "checkpoint.snapshot_interval", "5", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "checkpoint.snapshot_interval = 5: in-memory snapshots are what a GPU job "
                                "(job.device = \"cuda\") or one with optshard.host_banks = 1 rewinds to"));
    assert_int_equal(manifest_override(m, "checkpoint.snapshot_interval", "-1", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "checkpoint.snapshot_interval = -1 must be >= 0"));
    /* across hosts: the NCCL plane, whole replicas per host, a TCP endpoint, checkpoints in a
     * shared folder (no remote checkpointd) */
    static const struct {
        const char *key, *value, *needle;
    } hosts[] = {
        {"parallelism.data_plane", "ipc", "job.hosts = 3 needs parallelism.data_plane = \"nccl\""},
        {"job.endpoint", "ipc:///tmp/x.sock", "job.endpoint must be tcp://HOST:PORT"},
        {"job.endpoint", "tcp://127.0.0.1:*", "job.endpoint must be tcp://HOST:PORT"},
        {"job.host_rank", "3", "job.host_rank = 3: the job has job.hosts = 3"},
        {"checkpoint.endpoint", "tcp://store:5555", "checkpoint.endpoint with job.hosts = 3: a remote checkpointd "
                                                    "across hosts is not built"},
        {"job.host_timeout_s", "0", "job.host_timeout_s = 0 must be >= 1"},
        {"job.host_timeout_s", "86401", "job.host_timeout_s = 86401 must be in 1..86400"},
        {"validation.enable", "true", "set validation.enable = false"},
    };
    for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++) {
        manifest_defaults(m);
        const char *kv[][2] = {{"parallelism.data_plane", "nccl"}, {"job.device", "cuda"},
                               {"parallelism.data_parallel_replicate_degree", "3"}, {"job.hosts", "3"},
                               {"job.endpoint", "tcp://10.0.0.1:29500"}, {"validation.dataset_path", "v.bin"},
                               {"checkpoint.enable", "true"}, {hosts[i].key, hosts[i].value}};
        for (size_t k = 0; k < sizeof(kv) / sizeof(kv[0]); k++)
            assert_int_equal(manifest_override(m, kv[k][0], kv[k][1], err, sizeof(err)), 0);
        assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
        if (!strstr(err, hosts[i].needle))
            fail_msg("%s = %s: got '%s'", hosts[i].key, hosts[i].value, err);
    }
    manifest_defaults(m); /* 3 hosts need a multiple of 3 replicas; with 6, valid (checkpoints too) */
    const char *ok[][2] = {{"parallelism.data_plane", "nccl"}, {"job.device", "cuda"}, {"job.hosts", "3"},
                           {"checkpoint.enable", "true"}, {"checkpoint.interval", "5"},
                           {"parallelism.data_parallel_replicate_degree", "4"}, {"job.endpoint", "tcp://h0:29500"}};
    for (size_t k = 0; k < sizeof(ok) / sizeof(ok[0]); k++)
        assert_int_equal(manifest_override(m, ok[k][0], ok[k][1], err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "job.hosts = 3 must divide parallelism.data_parallel_replicate_degree = 4"));
    assert_int_equal(manifest_override(m, "parallelism.data_parallel_replicate_degree", "6", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    free(m);
}

static void test_manifest_validate_rejects_bad_values(void **state)
{
    static const struct {
        const char *key, *value, *needle;
    } cases[] = {
        {"job.device", "gpu", "job.device = \"gpu\": expected \"cpu\" or \"cuda\""},
        {"job.device", "tpu", "job.device = \"tpu\": expected \"cpu\""},
        {"job.heartbeat_interval_ms", "0", "job.heartbeat_interval_ms = 0 must be >= 1"},
        {"job.heartbeat_timeout_ms", "100", "must exceed job.heartbeat_interval_ms = 100 (default)"},
        {"job.max_restarts", "-1", "job.max_restarts = -1 must be >= 0"},
        {"job.max_restarts", "1001", "job.max_restarts = 1001 must be in 0..1000"},
        {"job.restart_backoff_ms", "-5", "job.restart_backoff_ms = -5 must be >= 0"},
        {"job.restart_backoff_ms", "30001", "job.restart_backoff_ms = 30001 must be in 0..30000"},
        {"model.name", "gpt", "expected \"llama3\""},
        {"model.dim", "250", "model.dim (250) is not divisible by model.n_heads (16)"},
        {"model.n_layers", "0", "model.n_layers must be between 1 and 4096 (got 0)"},
        {"model.n_layers", "20172048", "model.n_layers must be between 1 and 4096 (got 20172048)"},
        {"optimizer.name", "SGD", "expected \"AdamW\""},
        {"training.steps", "0", "training.steps = 0 must be >= 1"},
        {"training.seq_len", "1", "training.seq_len = 1 must be >= 2"},
        {"training.seq_len", "4096", "training.seq_len = 4096 exceeds model.max_seq_len = 2048 (default (flavor debugmodel))"},
        {"training.local_batch_size", "0", "must be >= 1"},
        {"training.threads", "-1", "training.threads = -1 must be >= 0"},
        {"training.max_norm", "-1", "training.max_norm = -1 must be >= 0"},
        {"training.attention", "flash", "training.attention = \"flash\": expected \"auto\", \"cudnn\" or \"ctitan\""},
        {"training.attention", "cudnn", "training.attention = \"cudnn\" is the GPU model's: it needs job.device"},
        {"parallelism.pipeline_parallel_degree", "0", "must be >= 1"},
        {"parallelism.pipeline_parallel_microbatches", "0", "must be >= 1"},
        {"parallelism.data_parallel_replicate_degree", "0", "must be >= 1"},
        {"optimizer.lr", "-0.1", "optimizer.lr = -0.1 must be >= 0"},
        {"optimizer.beta1", "1.0", "optimizer.beta1 = 1 must be in [0, 1)"},
        {"optimizer.beta2", "-0.5", "optimizer.beta2 = -0.5 must be in [0, 1)"},
        {"optimizer.eps", "0", "optimizer.eps = 0 must be > 0"},
        {"optimizer.weight_decay", "-1", "must be >= 0"},
        {"lr_scheduler.warmup_steps", "-1", "must be >= 0"},
        {"lr_scheduler.decay_ratio", "1.5", "lr_scheduler.decay_ratio = 1.5 must be in [0, 1]"},
        {"lr_scheduler.decay_ratio", "-0.5", "must be in [0, 1]"},
        {"lr_scheduler.min_lr_factor", "2", "must be in [0, 1]"},
        {"loader.prefetch", "0", "loader.prefetch = 0 must be >= 1"},
        {"metrics.log_freq", "0", "metrics.log_freq = 0 must be >= 1"},
        {"metrics.peak_tflops", "-1", "must be >= 0"},
        {"metrics.save_tb_folder", "", "metrics.save_tb_folder must not be empty (\"tb\": under job.dump_folder)"},
        {"validation.steps", "0", "validation.steps = 0 must be >= 1"},
        {"validation.enable", "true", "validation.dataset_path is empty"},
        {"sample.tokens", "-1", "sample.tokens = -1 must be >= 0"},
        {"sample.temperature", "-1", "sample.temperature = -1 must be >= 0 (0 = greedy)"},
        {"sample.temperature", "-1e-300", "must be >= 0"},
    };
    manifest_t m;
    manifest_defaults(&m);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char start[80];
        snprintf(start, sizeof(start), "--%s: ", cases[i].key);
        validate_fails(&m, cases[i].key, cases[i].value, start, cases[i].needle);
    }
    /* the boundary values are valid */
    const char *good[][2] = {{"lr_scheduler.decay_ratio", "-1"}, {"lr_scheduler.decay_ratio", "0"},
                             {"lr_scheduler.decay_ratio", "1"}, {"optimizer.name", "adamw"},
                             {"optimizer.beta1", "0"}, {"training.max_norm", "0"},
                             {"optimizer.lr", "0"}, {"sample.tokens", "0"}, {"training.seq_len", "2"},
                             {"job.max_restarts", "0"}, {"job.max_restarts", "1000"},
                             {"job.restart_backoff_ms", "0"}, {"job.restart_backoff_ms", "30000"},
                             {"sample.temperature", "0"}, {"training.attention", "ctitan"},
                             {"training.attention", "auto"}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        manifest_t g = m;
        override_ok(&g, good[i][0], good[i][1]);
        validate_ok(&g);
    }
}

/* [metrics] enable_tensorboard and save_tb_folder, torchtitan's names and defaults (false,
 * "tb" under job.dump_folder; an absolute folder as it is): parsed, overridden, checked with
 * errors naming the key's origin, and named in the resolved TOML. */
static void test_manifest_tensorboard_keys_take_torchtitans_names(void **state)
{
    manifest_t m;
    char dir[MANIFEST_PATH_MAX + 8];
    manifest_defaults(&m);
    assert_int_equal(m.tb_enable, 0);
    assert_string_equal(m.tb_folder, "tb");
    validate_ok(&m);
    manifest_tb_folder(&m, dir, sizeof(dir));
    assert_string_equal(dir, "runs/ctitan/tb");

    parse_ok(&m, "[job]\ndump_folder = \"/data/exp\"\n"
                 "[metrics]\nenable_tensorboard = true\nsave_tb_folder = \"board/a\"\n");
    assert_int_equal(m.tb_enable, 1);
    validate_ok(&m);
    manifest_tb_folder(&m, dir, sizeof(dir));
    assert_string_equal(dir, "/data/exp/board/a");
    char *text = manifest_to_toml(&m);
    assert_non_null(text);
    must_contain(text, "[metrics]\n");
    must_contain(text, "enable_tensorboard = true\n");
    must_contain(text, "save_tb_folder = \"board/a\"\n");
    free(text);
    override_ok(&m, "metrics.save_tb_folder", "/var/tb");
    override_ok(&m, "metrics.enable_tensorboard", "false");
    assert_int_equal(m.tb_enable, 0);
    manifest_tb_folder(&m, dir, sizeof(dir));
    assert_string_equal(dir, "/var/tb");

    parse_fails("[metrics]\nenable_tensorboard = \"yes\"\n", 2, "metrics.enable_tensorboard: expected a boolean", NULL);
    parse_fails("[metrics]\n\nsave_tb_folder = 5\n", 3, "metrics.save_tb_folder: expected a string", NULL);
    override_fails(&m, "metrics.enable_tensorboard", "1",
                   "--metrics.enable_tensorboard: expected a boolean (true or false)");
    parse_ok(&m, "[metrics]\nenable_tensorboard = true\nsave_tb_folder = ''\n");
    validate_fails(&m, NULL, NULL, "m.toml:3: ", "metrics.save_tb_folder must not be empty");
}

/* [activation_checkpoint] as torchtitan names it: mode none (the default), full or selective;
 * selective_ac_option an integer N (a number or its digits) or "op"; bad values name the key
 * and what it takes; the resolved text carries both back. */
static void test_manifest_activation_checkpoint_keys_take_torchtitans_names(void **state)
{
    manifest_t m, back;
    char err[512] = "";
    manifest_defaults(&m);
    assert_int_equal(m.ac_mode, CONFIG_AC_NONE);
    assert_int_equal(m.ac_every, 2);
    parse_ok(&m, "[activation_checkpoint]\nmode = \"full\"\n");
    assert_int_equal(m.ac_mode, CONFIG_AC_FULL);
    validate_ok(&m);
    parse_ok(&m, "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"op\"\n");
    assert_int_equal(m.ac_mode, CONFIG_AC_SELECTIVE);
    assert_int_equal(m.ac_every, 0);
    parse_ok(&m, "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = 3\n");
    assert_int_equal(m.ac_every, 3);
    parse_ok(&m, "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"4\"\n");
    assert_int_equal(m.ac_every, 4);
    validate_ok(&m);
    char *text = manifest_to_toml(&m);
    assert_non_null(text);
    must_contain(text, "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"4\"\n");
    manifest_defaults(&back);
    assert_int_equal(manifest_parse(&back, text, strlen(text), "r.toml", err, sizeof(err)), 0);
    assert_int_equal(back.ac_mode, CONFIG_AC_SELECTIVE);
    assert_int_equal(back.ac_every, 4);
    free(text);
    override_ok(&m, "activation_checkpoint.selective_ac_option", "op");
    assert_int_equal(m.ac_every, 0);
    text = manifest_to_toml(&m);
    must_contain(text, "selective_ac_option = \"op\"\n");
    free(text);
    override_ok(&m, "activation_checkpoint.mode", "none");
    assert_int_equal(m.ac_mode, CONFIG_AC_NONE);

    parse_fails("[activation_checkpoint]\nmode = \"fulll\"\n", 2,
                "activation_checkpoint.mode = \"fulll\": expected none, full or selective", NULL);
    parse_fails("[activation_checkpoint]\nmode = 1\n", 2, "activation_checkpoint.mode: expected a string", NULL);
    parse_fails("[activation_checkpoint]\n\nselective_ac_option = 0\n", 3,
                "activation_checkpoint.selective_ac_option = 0: expected a positive integer N", "or \"op\"", NULL);
    parse_fails("[activation_checkpoint]\nselective_ac_option = \"ops\"\n", 2,
                "activation_checkpoint.selective_ac_option = \"ops\": expected a positive integer N", NULL);
    parse_fails("[activation_checkpoint]\nselective_ac_option = \"-2\"\n", 2, "selective_ac_option = \"-2\"", NULL);
    parse_fails("[activation_checkpoint]\nselective_ac_option = 2.5\n", 2,
                "activation_checkpoint.selective_ac_option: expected a positive integer or \"op\"", NULL);
    override_fails(&m, "activation_checkpoint.mode", "Full",
                   "--activation_checkpoint.mode = \"Full\": expected none, full or selective");
    override_fails(&m, "activation_checkpoint.selective_ac_option", "layers.2",
                   "--activation_checkpoint.selective_ac_option = \"layers.2\": expected a positive integer N");
}

/* A thread count no machine runs (100000 started threads for minutes without a step) is
 * refused, naming the key and the limit; the limit itself is valid. */
static void test_manifest_validate_caps_the_thread_count(void **state)
{
    manifest_t m;
    manifest_defaults(&m);
    validate_fails(&m, "training.threads", "100000", "--training.threads: ",
                   "training.threads = 100000 exceeds 1024");
    validate_fails(&m, "training.threads", "1025", "--training.threads: ", "exceeds 1024");
    override_ok(&m, "training.threads", "1024");
    validate_ok(&m);
}

static void test_manifest_validate_errors_name_the_origin(void **state)
{
    manifest_t m;
    /* from the file */
    parse_ok(&m, "[job]\nname = \"x\"\n[training]\nsteps = 5\nseq_len = 1\n");
    validate_fails(&m, NULL, NULL, "m.toml:5: ", "training.seq_len = 1 must be >= 2");
    /* the default is impossible with the flavor the file chose */
    parse_ok(&m, "[model]\nflavor = \"tiny\"\n");
    validate_fails(&m, NULL, NULL, "default: ",
                   "training.seq_len = 256 exceeds model.max_seq_len = 64 (m.toml:2 (flavor tiny))");
    /* a model key given in the file */
    parse_ok(&m, "[model]\nflavor = \"tiny\"\nmax_seq_len = 16\n[training]\nseq_len = 32\n");
    validate_fails(&m, NULL, NULL, "m.toml:5: ", "exceeds model.max_seq_len = 16 (m.toml:3)");
    /* config_validate's message is pointed at the model key it names */
    parse_ok(&m, "[model]\nn_heads = 16\ndim = 100\n");
    validate_fails(&m, NULL, NULL, "m.toml:3: ", "model.dim (100) is not divisible by model.n_heads (16)");
    /* an override wins over the file, and is named */
    parse_ok(&m, "[training]\nsteps = 5\n");
    validate_fails(&m, "training.steps", "0", "--training.steps: ", "training.steps = 0 must be >= 1");
}

static void test_manifest_validate_fills_derived_defaults(void **state)
{
    manifest_t m;
    parse_ok(&m, "[job]\nname = \"demo\"\n[training]\nsteps = 300\n[lr_scheduler]\nwarmup_steps = 30\n");
    validate_ok(&m);
    assert_string_equal(m.dump_folder, "runs/demo");
    assert_string_equal(m.endpoint, "");
    assert_int_equal(m.lr_sched.steps, 300);
    assert_int_equal(m.lr_sched.warmup_steps, 30);
    parse_ok(&m, "[training]\nsteps = 300\n"); /* torchtitan's default warmup of 200 */
    validate_ok(&m);
    assert_int_equal(m.lr_sched.warmup_steps, 200);
    manifest_t again = m; /* idempotent */
    validate_ok(&again);
    assert_same_manifest(&m, &again);
}

static void test_manifest_stage_pieces_follow_split_points(void **state)
{
    manifest_t m;
    parse_ok(&m, "[parallelism]\npipeline_parallel_degree = 3\n"
                 "pipeline_parallel_split_points = [\"layers.2\", \"layers.5\"]\n");
    validate_ok(&m); /* debugmodel: 6 layers, pieces 0..7 */
    int p0, p1;
    manifest_stage_pieces(&m, 0, &p0, &p1);
    assert_int_equal(p0, 0); /* embedding, layers 0-1 */
    assert_int_equal(p1, 3);
    manifest_stage_pieces(&m, 1, &p0, &p1);
    assert_int_equal(p0, 3); /* layers 2-4 */
    assert_int_equal(p1, 6);
    manifest_stage_pieces(&m, 2, &p0, &p1);
    assert_int_equal(p0, 6); /* layer 5, head */
    assert_int_equal(p1, 8);
    override_ok(&m, "parallelism.pipeline_parallel_split_points", "layers.6,layers.1");
    override_ok(&m, "parallelism.pipeline_parallel_split_points", "1,6");
    validate_ok(&m);
    manifest_stage_pieces(&m, 0, &p0, &p1);
    assert_true(p0 == 0 && p1 == 2);
    manifest_stage_pieces(&m, 2, &p0, &p1);
    assert_true(p0 == 7 && p1 == 8); /* the head alone */
}

/* The best split by exhaustive search: the smallest largest stage, first in lexicographic
 * order of the stage starts. */
static void brute_force_split(const size_t *w, int P, int pp, int *best_start)
{
    int start[MANIFEST_MAX_PP + 1];
    size_t best = SIZE_MAX;
    for (int s = 0; s < pp; s++)
        start[s] = s;
    start[pp] = P;
    for (;;) {
        size_t worst = 0;
        for (int s = 0; s < pp; s++) {
            size_t sum = 0;
            for (int i = start[s]; i < start[s + 1]; i++)
                sum += w[i];
            worst = sum > worst ? sum : worst;
        }
        if (worst < best) {
            best = worst;
            memcpy(best_start, start, sizeof(int) * (size_t)(pp + 1));
        }
        int s = pp - 1; /* next combination of starts 1..pp-1 in lexicographic order */
        while (s >= 1 && start[s] == P - (pp - s))
            s--;
        if (s < 1)
            return;
        start[s]++;
        for (int t = s + 1; t < pp; t++)
            start[t] = start[t - 1] + 1;
    }
}

static void test_manifest_stage_pieces_balanced_matches_brute_force(void **state)
{
    static const char *configs[] = {
        "[model]\nflavor = \"tiny\"\n",
        "[model]\nflavor = \"tiny\"\nvocab_size = 2000\n",      /* embedding and head dominate */
        "[model]\nflavor = \"tiny\"\nn_layers = 7\n",
        "[model]\nflavor = \"debugmodel\"\n",
        "[model]\nflavor = \"debugmodel\"\nvocab_size = 50000\nn_layers = 8\n",
        "[model]\nflavor = \"debugmodel\"\nvocab_size = 64\nn_layers = 9\n", /* layers dominate */
        "[model]\nflavor = \"tiny\"\nn_layers = 1\nvocab_size = 5000\n",
    };
    for (size_t c = 0; c < sizeof(configs) / sizeof(configs[0]); c++) {
        manifest_t m;
        parse_ok(&m, configs[c]);
        override_ok(&m, "training.seq_len", "16");
        validate_ok(&m);
        int P = m.model.n_layers + 2;
        param_table_t tab;
        assert_int_equal(params_table_init(&tab, &m.model), 0);
        size_t w[64];
        for (int i = 0; i < P; i++)
            w[i] = manifest_piece_cost(&m, &tab, i);
        params_table_free(&tab);
        for (int pp = 1; pp <= P; pp++) {
            char v[16];
            snprintf(v, sizeof(v), "%d", pp);
            override_ok(&m, "parallelism.pipeline_parallel_degree", v);
            validate_ok(&m);
            int want[MANIFEST_MAX_PP + 1];
            brute_force_split(w, P, pp, want);
            for (int s = 0; s < pp; s++) {
                int p0, p1;
                manifest_stage_pieces(&m, s, &p0, &p1);
                if (p0 != want[s] || p1 != want[s + 1])
                    fail_msg("config %zu pp %d stage %d: got [%d, %d), brute force [%d, %d)", c, pp,
                             s, p0, p1, want[s], want[s + 1]);
            }
        }
    }
}

/* The compute the balanced split weighs: nothing for the embedding, a layer's weights and its
 * attention's T x D, the head's weights. */
static void test_manifest_piece_costs_are_compute_not_parameters(void **state)
{
    manifest_t m;
    parse_ok(&m, "[model]\nflavor = \"debugmodel\"\n[training]\nseq_len = 128\n");
    validate_ok(&m);
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, &m.model), 0);
    size_t b, e;
    assert_int_equal(manifest_piece_cost(&m, &tab, 0), 0);
    params_piece_range(&tab, 1, 2, &b, &e);
    assert_int_equal(manifest_piece_cost(&m, &tab, 1), e - b + 128 * 256);
    params_piece_range(&tab, 7, 8, &b, &e);
    assert_int_equal(manifest_piece_cost(&m, &tab, 7), e - b);
    params_table_free(&tab);
}

/* Several stages per rank: the split's busiest rank (its stages together, as the schedule
 * places them) is the least any contiguous split has, found by trying them all here too. */
static void test_manifest_stage_pieces_balance_ranks_of_several_stages(void **state)
{
    static const struct {
        const char *schedule;
        int pp, layers;
    } cases[] = {{"ZBVZeroBubble", 2, 6}, {"DualPipeV", 2, 9}, {"Interleaved1F1B", 2, 6}, {"ZBVZeroBubble", 3, 10},
                 {"Interleaved1F1B", 3, 12}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        manifest_t m;
        char text[512];
        snprintf(text, sizeof(text), "[model]\nflavor = \"debugmodel\"\nn_layers = %d\n[training]\nlocal_batch_size = "
                 "12\n[parallelism]\npipeline_parallel_degree = %d\npipeline_parallel_schedule = \"%s\"\n"
                 "pipeline_parallel_microbatches = 12\n", cases[c].layers, cases[c].pp, cases[c].schedule);
        parse_ok(&m, text);
        validate_ok(&m);
        int pp = m.pp, S = pp * manifest_vstages(&m), P = m.model.n_layers + 2, V = !strcmp(cases[c].schedule, "ZBVZeroBubble") ||
                                                                        !strcmp(cases[c].schedule, "DualPipeV");
        param_table_t tab;
        assert_int_equal(params_table_init(&tab, &m.model), 0);
        size_t w[64], rank[8];
        for (int i = 0; i < P; i++)
            w[i] = manifest_piece_cost(&m, &tab, i);
        params_table_free(&tab);
        /* the split found */
        memset(rank, 0, sizeof(rank));
        int prev = 0;
        for (int s = 0; s < S; s++) {
            int p0, p1;
            assert_int_equal(manifest_stage_pieces(&m, s, &p0, &p1), 0);
            assert_int_equal(p0, prev);
            assert_true(p1 > p0);
            prev = p1;
            for (int i = p0; i < p1; i++)
                rank[V ? (s < pp ? s : S - 1 - s) : s % pp] += w[i];
        }
        assert_int_equal(prev, P);
        size_t got = 0, least = SIZE_MAX;
        for (int r = 0; r < pp; r++)
            got = rank[r] > got ? rank[r] : got;
        /* every contiguous split: S - 1 cuts among P - 1 gaps */
        int start[16];
        for (int s = 0; s < S; s++)
            start[s] = s;
        start[S] = P;
        for (;;) {
            memset(rank, 0, sizeof(rank));
            size_t worst = 0;
            for (int s = 0; s < S; s++)
                for (int i = start[s]; i < start[s + 1]; i++)
                    rank[V ? (s < pp ? s : S - 1 - s) : s % pp] += w[i];
            for (int r = 0; r < pp; r++)
                worst = rank[r] > worst ? rank[r] : worst;
            least = worst < least ? worst : least;
            int s = S - 1;
            while (s >= 1 && start[s] == P - (S - s))
                s--;
            if (s < 1)
                break;
            start[s]++;
            for (int t = s + 1; t < S; t++)
                start[t] = start[t - 1] + 1;
        }
        if (got != least)
            fail_msg("%s pp %d, %d layers: the busiest rank costs %zu, the best split's %zu", cases[c].schedule, pp,
                     cases[c].layers, got, least);
    }
}

static void test_manifest_stage_pieces_cover_all_pieces_contiguously(void **state)
{
    manifest_t m;
    manifest_defaults(&m);
    override_ok(&m, "model.n_layers", "30");
    override_ok(&m, "model.vocab_size", "30000");
    int P = 32;
    for (int pp = 1; pp <= P; pp++) {
        char v[16];
        snprintf(v, sizeof(v), "%d", pp);
        override_ok(&m, "parallelism.pipeline_parallel_degree", v);
        validate_ok(&m);
        int prev = 0;
        for (int s = 0; s < pp; s++) {
            int p0, p1;
            manifest_stage_pieces(&m, s, &p0, &p1);
            assert_int_equal(p0, prev);
            assert_true(p1 > p0);
            prev = p1;
        }
        assert_int_equal(prev, P);
    }
}

static void test_manifest_shard_ranges_cover_aligned_balanced(void **state)
{
    const size_t totals[] = {1, 1023, 1024, 1025, 5000, 7 * 1024, 7 * 1024 + 3, 123457, 6163712};
    const size_t B = MANIFEST_BLOCK;
    for (size_t t = 0; t < sizeof(totals) / sizeof(totals[0]); t++) {
        size_t total = totals[t], blocks = (total + B - 1) / B;
        for (int K = 1; K <= 12 && (size_t)K <= blocks; K++) {
            size_t prev = 0, lo = SIZE_MAX, hi = 0;
            for (int k = 0; k < K; k++) {
                size_t b, e;
                manifest_shard_range(total, K, k, &b, &e);
                assert_true(b == prev);
                assert_true(e > b);
                assert_true(b % B == 0);
                assert_true(e % B == 0 || e == total);
                lo = e - b < lo ? e - b : lo;
                hi = e - b > hi ? e - b : hi;
                prev = e;
            }
            assert_true(prev == total);
            if (hi - lo > B)
                fail_msg("total %zu, %d shards: sizes %zu..%zu differ by more than a block", total,
                         K, lo, hi);
        }
    }
    size_t b, e;
    manifest_shard_range(0, 1, 0, &b, &e);
    assert_true(b == 0 && e == 0);
}

static void test_manifest_round_trips_through_toml(void **state)
{
    manifest_t m, back;
    char err[512] = "";
    parse_ok(&m, full_text);
    override_ok(&m, "training.steps", "77");
    validate_ok(&m);
    char *text = manifest_to_toml(&m);
    assert_non_null(text);
    /* every key of every section is named */
    const char *some[] = {"[job]\n", "heartbeat_timeout_ms = 2000\n", "[model]\n", "flavor = \"llama1b\"\n",
                          "n_layers = 4\n", "pipeline_parallel_split_points = [\"layers.1\", \"layers.3\"]\n",
                          "pipeline_parallel_schedule = \"GPipe\"\n", "decay_type = \"sqrt\"\n",
                          "lr = 0.0003\n", "seed = 1234567890123\n", "[sample]\n", "temperature = 1.0\n"};
    for (size_t i = 0; i < sizeof(some) / sizeof(some[0]); i++)
        must_contain(text, some[i]);
    manifest_defaults(&back);
    if (manifest_parse(&back, text, strlen(text), "resolved.toml", err, sizeof(err)))
        fail_msg("resolved text does not parse: %s\n%s", err, text);
    assert_same_manifest(&m, &back);
    validate_ok(&back);
    assert_same_manifest(&m, &back);
    char *again = manifest_to_toml(&back);
    assert_string_equal(text, again);
    free(again);
    free(text);
    /* unvalidated defaults too */
    manifest_defaults(&m);
    text = manifest_to_toml(&m);
    manifest_defaults(&back);
    assert_int_equal(manifest_parse(&back, text, strlen(text), "d.toml", err, sizeof(err)), 0);
    assert_same_manifest(&m, &back);
    free(text);
}

static void test_manifest_round_trip_keeps_awkward_values(void **state)
{
    manifest_t m, back;
    char err[512] = "";
    manifest_defaults(&m);
    override_ok(&m, "job.description", "quote \" backslash \\ newline \n tab \t bell \x07 del \x7f caf\xc3\xa9 # not a comment");
    override_ok(&m, "loader.command", "python3 -c 'print(\"[x]\")'");
    override_ok(&m, "optimizer.lr", "0.30000000000000004");
    override_ok(&m, "optimizer.eps", "1e-300");
    override_ok(&m, "metrics.peak_tflops", "5e-324");
    override_ok(&m, "optimizer.weight_decay", "-0.0");
    override_ok(&m, "training.max_norm", "1.7976931348623157e308");
    override_ok(&m, "training.seed", "9223372036854775807");
    override_ok(&m, "model.ffn_dim_multiplier", "1.3");
    override_ok(&m, "lr_scheduler.min_lr_factor", "0.1");
    override_ok(&m, "sample.temperature", "0.7000000000000001");
    m.beta2 = nextafter(0.95, 1.0);
    validate_ok(&m);
    char *text = manifest_to_toml(&m);
    assert_non_null(text);
    manifest_defaults(&back);
    if (manifest_parse(&back, text, strlen(text), "r.toml", err, sizeof(err)))
        fail_msg("resolved text does not parse: %s\n%s", err, text);
    assert_same_manifest(&m, &back);
    assert_true(signbit(back.weight_decay));
    free(text);
}

static void test_manifest_load_reports_missing_file(void **state)
{
    manifest_t m;
    char err[512] = "";
    assert_int_equal(manifest_load(&m, "/nonexistent/dir/x.toml", err, sizeof(err)), -ENOENT);
    must_contain(err, "/nonexistent/dir/x.toml");
    assert_true(manifest_load(&m, "/", err, sizeof(err)) < 0);
    must_contain(err, "/: not a regular file");
    char path[] = "/tmp/test_manifest_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char bad[] = "[training]\nsteps = \"ten\"\n";
    assert_int_equal(write(fd, bad, sizeof(bad) - 1), (ssize_t)(sizeof(bad) - 1));
    close(fd);
    assert_int_equal(manifest_load(&m, path, err, sizeof(err)), -EINVAL);
    char want[128];
    snprintf(want, sizeof(want), "%s:2: training.steps: expected an integer", path);
    must_contain(err, want);
    unlink(path);
}

/* The repo's manifests/, wherever the test runs from (make runs it at the repo root). */
static void repo_file(char *buf, size_t len, const char *rel)
{
    snprintf(buf, len, "%s", rel);
    if (!access(buf, R_OK))
        return;
    const char *slash = strrchr(__FILE__, '/');
    snprintf(buf, len, "%.*s/../%s", slash ? (int)(slash - __FILE__) : 1, slash ? __FILE__ : ".", rel);
}

static void test_manifest_repo_examples_parse_and_validate(void **state)
{
    manifest_t m;
    char path[1024], err[512] = "";
    repo_file(path, sizeof(path), "manifests/demo.toml");
    if (manifest_load(&m, path, err, sizeof(err)))
        fail_msg("%s", err);
    validate_ok(&m);
    assert_string_equal(m.name, "demo");
    assert_string_equal(m.flavor, "debugmodel");
    assert_string_equal(m.tokenizer_path, "data/fortunes/tokenizer.bin");
    assert_int_equal(m.steps, 300);
    assert_int_equal(m.local_batch_size, 8);
    assert_int_equal(m.seq_len, 256);
    assert_true(m.lr == 2e-3 && m.weight_decay == 0.1 && m.max_norm == 1.0);
    assert_int_equal(m.lr_sched.warmup_steps, 30);
    assert_int_equal(m.lr_sched.decay_type, LR_DECAY_COSINE);
    assert_true(m.lr_sched.lr_min == 0.1);
    assert_int_equal(m.pp, 2);
    assert_int_equal(m.schedule, SCHED_1F1B);
    assert_int_equal(m.microbatches, 8);
    assert_int_equal(m.dp, 1);
    assert_int_equal(m.shards, 2);
    assert_string_equal(m.dataset_path, "data/fortunes/train.bin");
    assert_int_equal(m.prefetch, 4);
    assert_int_equal(m.val_enable, 1);
    assert_string_equal(m.val_dataset_path, "data/fortunes/val.bin");
    assert_int_equal(m.val_steps, 8);
    assert_int_equal(m.sample_tokens, 200);
    assert_true(m.sample_temperature == 0.8);
    assert_string_equal(m.dump_folder, "runs/demo");

    repo_file(path, sizeof(path), "manifests/tiny.toml");
    if (manifest_load(&m, path, err, sizeof(err)))
        fail_msg("%s", err);
    override_ok(&m, "loader.dataset_path", "/tmp/elsewhere/train.bin"); /* as tests do */
    validate_ok(&m);
    assert_string_equal(m.name, "tiny");
    assert_string_equal(m.flavor, "tiny");
    assert_int_equal(m.model.vocab_size, 300);
    assert_int_equal(m.model.dim, 32);
    assert_int_equal(m.model.n_layers, 2);
    assert_int_equal(m.steps, 20);
    assert_int_equal(m.local_batch_size, 4);
    assert_int_equal(m.seq_len, 32);
    assert_true(m.lr == 1e-2);
    assert_int_equal(m.lr_sched.warmup_steps, 2);
    assert_int_equal(m.pp, 2);
    assert_int_equal(m.microbatches, 2);
    assert_int_equal(m.shards, 2);
}

/* Truncated, byte-flipped and line-shuffled manifests, and random overrides: each gives 0 or
 * an error naming its origin; whatever validates also round-trips and splits cleanly. */
static void test_manifest_fuzz_garbage_gives_errors(void **state)
{
    static const char *override_keys[] = {
        "training.steps", "optimizer.lr", "loader.shuffle", "job.name", "model.flavor",
        "parallelism.pipeline_parallel_split_points", "parallelism.pipeline_parallel_degree",
        "model.n_layers", "optshard.shards", "lr_scheduler.decay_type", "training.seed", "x", ".",
        "model.", ".dim", "--", "job.name.extra"};
    static const char *override_values[] = {
        "", "0", "-1", "1", "2", "3", "1e-3", "true", "abc", "1e999", "[", "[1, 2]", "layers.",
        "layers.1,layers.2", ",", "tiny", "cosine", "99999999999999999999", "\"x\"", "nan"};
    const size_t base_len = sizeof(full_text) - 1;
    char *buf = malloc(2 * base_len + 1), *rest = malloc(2 * base_len + 1), err[512];
    uint64_t seed = 7;
    int accepted = 0, rejected = 0;
    for (int iter = 0; iter < 1500; iter++) {
        size_t n = base_len;
        memcpy(buf, full_text, n);
        int mode = iter % 3;
        if (mode == 0) {
            n = tu_next(&seed) % (base_len + 1);
        } else if (mode == 1) {
            int flips = 1 + (int)(tu_next(&seed) % 3);
            for (int i = 0; i < flips; i++)
                buf[tu_next(&seed) % n] = (char)tu_next(&seed);
        } else { /* move or copy one line elsewhere: keys in the wrong section, duplicates */
            size_t a = tu_next(&seed) % n, e, rn = 0, b;
            while (a > 0 && full_text[a - 1] != '\n')
                a--;
            for (e = a; e < n && full_text[e] != '\n'; e++)
                ;
            e += e < n;
            int copy = (int)(tu_next(&seed) % 2);
            memcpy(rest, full_text, a);
            rn = a;
            if (copy)
                memcpy(rest + rn, full_text + a, e - a), rn += e - a;
            memcpy(rest + rn, full_text + e, n - e);
            rn += n - e;
            for (b = tu_next(&seed) % rn; b > 0 && rest[b - 1] != '\n'; b--)
                ;
            memcpy(buf, rest, b);
            memcpy(buf + b, full_text + a, e - a);
            memcpy(buf + b + (e - a), rest + b, rn - b);
            n = rn + (e - a);
        }
        manifest_t m;
        manifest_defaults(&m);
        err[0] = 0;
        int rc = manifest_parse(&m, buf, n, "f.toml", err, sizeof(err));
        if (rc) {
            assert_int_equal(rc, -EINVAL);
            if (strncmp(err, "f.toml:", 7))
                fail_msg("error without a location: '%s'", err);
            rejected++;
            continue;
        }
        for (int o = 0; o < 3; o++) {
            const char *k = override_keys[tu_next(&seed) % (sizeof(override_keys) / sizeof(override_keys[0]))];
            const char *v = override_values[tu_next(&seed) % (sizeof(override_values) / sizeof(override_values[0]))];
            if (manifest_override(&m, k, v, err, sizeof(err)) && strncmp(err, "--", 2))
                fail_msg("override error without the flag: '%s'", err);
        }
        if (manifest_validate(&m, err, sizeof(err))) {
            rejected++;
            continue;
        }
        accepted++;
        char *text = manifest_to_toml(&m);
        assert_non_null(text);
        manifest_t back;
        manifest_defaults(&back);
        if (manifest_parse(&back, text, strlen(text), "r.toml", err, sizeof(err)))
            fail_msg("resolved text does not parse: %s", err);
        assert_same_manifest(&m, &back);
        free(text);
        int prev = 0;
        for (int s = 0; s < m.pp; s++) {
            int p0, p1;
            manifest_stage_pieces(&m, s, &p0, &p1);
            assert_true(p0 == prev && p1 > p0);
            prev = p1;
        }
        assert_int_equal(prev, m.model.n_layers + 2);
    }
    free(buf);
    free(rest);
    assert_true(accepted > 20 && rejected > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifest_defaults_validate),
        cmocka_unit_test(test_manifest_parses_full_realistic_manifest),
        cmocka_unit_test(test_manifest_type_errors_name_file_line_and_key),
        cmocka_unit_test(test_manifest_rejects_unknown_section),
        cmocka_unit_test(test_manifest_rejects_unknown_key),
        cmocka_unit_test(test_manifest_rejects_duplicate_key),
        cmocka_unit_test(test_manifest_rejects_too_long_strings),
        cmocka_unit_test(test_manifest_model_keys_apply_over_flavor_in_any_order),
        cmocka_unit_test(test_manifest_flavor_override_keeps_explicit_model_keys),
        cmocka_unit_test(test_manifest_n_kv_heads_follows_n_heads_unless_set),
        cmocka_unit_test(test_manifest_overrides_of_each_type),
        cmocka_unit_test(test_manifest_override_errors_name_the_flag),
        cmocka_unit_test(test_manifest_validate_rejects_pp_beyond_pieces),
        cmocka_unit_test(test_manifest_validate_rejects_microbatches_not_dividing_batch),
        cmocka_unit_test(test_manifest_validate_rejects_bad_split_points),
        cmocka_unit_test(test_manifest_virtual_stages_and_the_schedules_rules),
        cmocka_unit_test(test_manifest_validate_rejects_too_many_shards),
        cmocka_unit_test(test_manifest_validate_rejects_bad_job_name),
        cmocka_unit_test(test_manifest_optshard_device_and_data_plane),
        cmocka_unit_test(test_manifest_validate_rejects_bad_values),
        cmocka_unit_test(test_manifest_tensorboard_keys_take_torchtitans_names),
        cmocka_unit_test(test_manifest_activation_checkpoint_keys_take_torchtitans_names),
        cmocka_unit_test(test_manifest_cuda_needs_a_head_dimension_the_kernels_take),
        cmocka_unit_test(test_manifest_validate_caps_the_thread_count),
        cmocka_unit_test(test_manifest_validate_errors_name_the_origin),
        cmocka_unit_test(test_manifest_validate_fills_derived_defaults),
        cmocka_unit_test(test_manifest_stage_pieces_follow_split_points),
        cmocka_unit_test(test_manifest_stage_pieces_balanced_matches_brute_force),
        cmocka_unit_test(test_manifest_piece_costs_are_compute_not_parameters),
        cmocka_unit_test(test_manifest_stage_pieces_balance_ranks_of_several_stages),
        cmocka_unit_test(test_manifest_stage_pieces_cover_all_pieces_contiguously),
        cmocka_unit_test(test_manifest_shard_ranges_cover_aligned_balanced),
        cmocka_unit_test(test_manifest_round_trips_through_toml),
        cmocka_unit_test(test_manifest_round_trip_keeps_awkward_values),
        cmocka_unit_test(test_manifest_load_reports_missing_file),
        cmocka_unit_test(test_manifest_repo_examples_parse_and_validate),
        cmocka_unit_test(test_manifest_fuzz_garbage_gives_errors),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
