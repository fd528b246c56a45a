/* The memory plan (stages/job/plan.h): its figures for a small job against numbers worked out
 * by hand, the refusals `ctitan launch` gives before any process starts (a 40B-shaped model on an
 * 80 GB GPU, llama1b on a small host), the dry run, and a Ctrl-C during a launch's set-up. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/shm.h"
#include "kernels/act_bytes.h"
#include "stages/job/job.h"
#include "stages/plan/plan.h"
#include "tests/testjob.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* A validated manifest of the defaults and these "key", "value" pairs (NULL-terminated). */
static void manifest_of(manifest_t *m, const char *const *kv)
{
    char err[1024];
    manifest_defaults(m);
    for (int i = 0; kv[i]; i += 2)
        if (manifest_override(m, kv[i], kv[i + 1], err, sizeof(err)))
            fail_msg("%s = %s: %s", kv[i], kv[i + 1], err);
    if (manifest_validate(m, err, sizeof(err)))
        fail_msg("%s", err);
}

static const plan_row_t *row(const plan_t *p, const char *who, int device)
{
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->rows[i].who, who) && p->rows[i].device == device)
            return &p->rows[i];
    fail_msg("no row %s on device %d", who, device);
    return NULL;
}

/* dim 64, 2 layers, 4 heads (head dim 16), 2 kv heads, FFN 128, vocab 256: an embedding and a
 * head of 256 x 64 = 16384 each, a layer of 64 + 4096 + 2048 + 2048 + 4096 + 64 + 3 x 8192 =
 * 36992, the final norm 64: 106816 parameters, 107520 floats with the replica stride (1024). */
static const char *const small[] = {
    "model.flavor", "tiny", "model.dim", "64", "model.n_layers", "2", "model.n_heads", "4",
    "model.n_kv_heads", "2", "model.hidden_dim", "128", "model.vocab_size", "256",
    "training.seq_len", "32", "training.local_batch_size", "4",
    "parallelism.pipeline_parallel_degree", "2", "parallelism.pipeline_parallel_microbatches", "4",
    "parallelism.pipeline_parallel_split_points", "[\"layers.1\"]", "optshard.shards", "2",
    "loader.dataset_path", "/nonexistent/train.bin", NULL};

/* kv = the small job's pairs (NULL-terminated at the count returned, room for 12 pairs more). */
static int small_kv(const char **kv)
{
    int n = 0;
    for (; small[n]; n++)
        kv[n] = small[n];
    kv[n] = NULL;
    return n;
}

static void test_plan_figures_of_a_small_cpu_job(void **state)
{
    manifest_t m;
    plan_t p;
    char err[512];
    manifest_of(&m, small);
    assert_int_equal(plan_build(&p, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    const plan_row_t *shm = row(&p, "shared memory", PLAN_HOST);
    /* fp32 weights and gradients of one replica; AdamW: two banks of 3 arrays (master, m, v)
     * behind a header page */
    assert_int_equal((long)shm->bytes[PLAN_WEIGHTS], 107520L * 4);
    assert_int_equal((long)shm->bytes[PLAN_GRADS], 107520L * 4);
    assert_int_equal((long)shm->bytes[PLAN_OPTIM], 4096L + 2 * 3 * 107520L * 4);
    /* one microbatch of 1 x 32 tokens (N = 32): a layer keeps N x (4 D + 2 + 2 QD + 2 KD + 3 F)
     * = 32 x 834 floats and the probabilities 1 x 4 x 32 x 32; every stage the scratch
     * N x (F + max(QD, D)) and the tokens N = 6176; the embedding's gradient N x D = 2048; the
     * head N x (3 D + 1 + V) = 14368. Besides, one gradient work set a stage (a layer's
     * gradients B keeps for W, N x (4 D + 2 F + QD + 2 KD) = 32 x 640: W runs with its B) */
    long layer = 32L * 834 + 4096, common = 6176, grads = 32L * 640;
    const plan_row_t *s0 = row(&p, "stage 0.0", PLAN_HOST), *s1 = row(&p, "stage 1.0", PLAN_HOST);
    /* 1F1B keeps pp - rank microbatches in flight: 2 on rank 0, 1 on rank 1 */
    assert_int_equal(s0->in_flight, 2);
    assert_int_equal(s1->in_flight, 1);
    assert_int_equal((long)s0->act_mb, (layer + common + 2048) * 4);
    assert_int_equal((long)s0->bytes[PLAN_ACTS], (2 * (layer + common + 2048) + grads) * 4);
    assert_int_equal((long)s1->bytes[PLAN_ACTS], (layer + common + 14368 + grads) * 4);
    assert_int_equal((long)s0->act_work, grads * 4); /* printed beside the microbatches */
    assert_int_equal((long)s1->act_work, grads * 4);
    double sum = 0;
    for (int i = 0; i < p.n; i++)
        sum += p.rows[i].device == PLAN_HOST ? p.rows[i].total : 0;
    assert_true(sum == p.host);
    /* the validation at the end runs after the workers are stopped: the most held at once is
     * less than every process's peak summed, and at least the segments and the coordinator */
    const plan_row_t *coord = row(&p, "coordinator", PLAN_HOST);
    assert_true(p.host_need <= p.host);
    assert_true(p.host_need >= shm->total + coord->total);
    assert_int_equal(p.gpus, 0);
    assert_string_equal(p.ac_mode, "none");
    double none0 = s0->bytes[PLAN_ACTS];
    plan_free(&p);
    /* full activation checkpointing: each microbatch as kernels/act_bytes.h says (checked there
     * against the model's allocations), with the recompute work sets; less than without */
    m.ac_mode = CONFIG_AC_FULL;
    assert_int_equal(plan_build(&p, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    assert_string_equal(p.ac_mode, "full");
    model_config_t cfg = m.model;
    cfg.ac_mode = CONFIG_AC_FULL;
    model_act_size_t a;
    assert_int_equal(model_act_bytes(&cfg, 0, 2, 1, 32, MODEL_ACT_CPU, &a), 0);
    s0 = row(&p, "stage 0.0", PLAN_HOST);
    assert_int_equal((long)s0->act_mb, (long)a.per_mb);
    assert_int_equal((long)s0->bytes[PLAN_ACTS], (long)model_act_total(&a, 2, 0));
    assert_true(s0->bytes[PLAN_ACTS] < none0);
    plan_free(&p);
    /* optshard.host_banks 1: one bank of the three arrays */
    const char *kv[64];
    int n = small_kv(kv);
    kv[n++] = "optshard.host_banks", kv[n++] = "1", kv[n] = NULL;
    manifest_of(&m, kv);
    assert_int_equal(plan_build(&p, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    assert_int_equal((long)row(&p, "shared memory", PLAN_HOST)->bytes[PLAN_OPTIM], 4096L + 3 * 107520L * 4);
    plan_free(&p);
}

/* A CPU job whose shards' second bank is what keeps it from fitting: the refusal names
 * optshard.host_banks 1 and says it fits alone; with it the job fits that host. */
static void test_plan_names_one_bank_of_shard_state_where_it_fits(void **state)
{
    manifest_t m;
    plan_t two, one;
    char err[4096];
    const char *kv[64];
    int n = small_kv(kv); /* ~35M parameters: the optimizer's state is most of the host's need */
    kv[n++] = "model.dim", kv[n++] = "512", kv[n++] = "model.n_layers", kv[n++] = "8";
    kv[n++] = "model.vocab_size", kv[n++] = "16384", kv[n] = NULL;
    manifest_of(&m, kv);
    assert_int_equal(plan_build(&two, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    kv[n++] = "optshard.host_banks", kv[n++] = "1", kv[n] = NULL;
    manifest_t m1;
    manifest_of(&m1, kv);
    assert_int_equal(plan_build(&one, &m1, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    assert_true(one.host_need < two.host_need);
    plan_have_t h = {.host = (one.host_need + two.host_need) / 2, .shm = -1, .gpus = 0};
    for (int g = 0; g < PLAN_MAX_GPUS; g++)
        h.gpu[g] = -1;
    assert_int_equal(plan_check(&two, &h, &m, err, sizeof(err)), -ENOMEM);
    const char *knob = strstr(err, "(--optshard.host_banks 1: ");
    if (!knob || !strstr(knob, ") (alone it fits)"))
        fail_msg("expected the knob optshard.host_banks 1, fitting alone: %s", err);
    assert_int_equal(plan_check(&one, &h, &m1, err, sizeof(err)), 0);
    plan_free(&two);
    plan_free(&one);
}

/* Offload (GPU stages, CPU shards) with optshard.offload_dtype bfloat16: the shared weights and
 * gradients at 2 bytes a parameter, not 4, and each CPU shard's chunk of fp32 sums
 * (JOB_GRAD_CHUNK); where neither that nor one bank alone makes the job fit but both do, the
 * refusal says so of each (ZeRO-Offload's 16 bytes a parameter), and both together fit. */
static void test_plan_offload_in_bf16_halves_the_host_copies_and_is_named_with_one_bank(void **state)
{
    manifest_t m32, m16, both;
    plan_t p32, p16, pb;
    char err[8192];
    const char *kv[64];
    int n = small_kv(kv); /* ~35M parameters: the state and the copies are most of the host's need */
    kv[n++] = "model.dim", kv[n++] = "512", kv[n++] = "model.n_layers", kv[n++] = "8";
    kv[n++] = "model.vocab_size", kv[n++] = "16384", kv[n++] = "job.device", kv[n++] = "cuda";
    kv[n++] = "optshard.device", kv[n++] = "cpu", kv[n] = NULL;
    manifest_of(&m32, kv);
    kv[n++] = "optshard.offload_dtype", kv[n++] = "bfloat16", kv[n] = NULL;
    manifest_of(&m16, kv);
    kv[n++] = "optshard.host_banks", kv[n++] = "1", kv[n] = NULL;
    manifest_of(&both, kv);
    assert_int_equal(plan_build(&p32, &m32, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    assert_int_equal(plan_build(&p16, &m16, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    assert_int_equal(plan_build(&pb, &both, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    job_layout_t l;
    assert_int_equal(job_layout(&l, &m16), 0);
    assert_int_equal(l.host_bf16, 1);
    double copy = (double)util_round_page(l.stride * 2); /* one replica's, bf16 */
    const plan_row_t *s32 = row(&p32, "shared memory", PLAN_HOST), *s16 = row(&p16, "shared memory", PLAN_HOST);
    assert_true(s16->bytes[PLAN_WEIGHTS] == copy && s16->bytes[PLAN_GRADS] == copy);
    assert_true(s32->bytes[PLAN_WEIGHTS] == (double)util_round_page(l.stride * 4));
    assert_true(row(&p16, "optshard 0", PLAN_HOST)->bytes[PLAN_GRADS] == JOB_GRAD_CHUNK * 4.0);
    assert_true(row(&p32, "optshard 0", PLAN_HOST)->bytes[PLAN_GRADS] == 0); /* one replica: in place */
    double sums = 0; /* every shard's chunk */
    for (int i = 0; i < p16.n; i++)
        sums += !strncmp(p16.rows[i].who, "optshard", 8) ? p16.rows[i].bytes[PLAN_GRADS] : 0;
    assert_true(sums == m16.shards * JOB_GRAD_CHUNK * 4.0);
    assert_true(fabs(p32.host_need - p16.host_need - (s32->total - s16->total - sums)) < 1);
    /* a host between what both need and what one bank alone needs */
    manifest_t one;
    plan_t po;
    kv[n - 4] = "optshard.offload_dtype", kv[n - 3] = "float32";
    manifest_of(&one, kv);
    assert_int_equal(plan_build(&po, &one, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    assert_true(pb.host_need < po.host_need && po.host_need < p16.host_need);
    plan_have_t h = {.host = (pb.host_need + po.host_need) / 2, .shm = -1, .gpus = 0};
    for (int g = 0; g < PLAN_MAX_GPUS; g++)
        h.gpu[g] = -1;
    assert_int_equal(plan_check(&p32, &h, &m32, err, sizeof(err)), -ENOMEM);
    const char *k16 = strstr(err, "(--optshard.offload_dtype bfloat16: "),
               *kb = strstr(err, "both (--optshard.offload_dtype bfloat16 --optshard.host_banks 1: ");
    if (!k16 || !strstr(k16, "(alone not enough: it would need host RAM") || !kb || !strstr(kb, ") (alone it fits)"))
        fail_msg("expected offload_dtype bfloat16 (not enough alone) and both knobs (fitting): %s", err);
    assert_int_equal(plan_check(&pb, &h, &both, err, sizeof(err)), 0);
    plan_free(&p32), plan_free(&p16), plan_free(&pb), plan_free(&po);
}

static void test_plan_figures_of_a_small_gpu_job(void **state)
{
    manifest_t m;
    plan_t p;
    char err[2048];
    const char *kv[64];
    int n = small_kv(kv);
    kv[n++] = "job.device", kv[n++] = "cuda", kv[n] = NULL;
    manifest_of(&m, kv);
    assert_int_equal(plan_build(&p, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    assert_int_equal(p.gpus, 2); /* one GPU a stage process */
    /* stage 0 holds the embedding and layer 0: 16384 + 36992 = 53376 parameters, in bf16 and
     * their fp32 gradients, each with CUDA_MODEL_SLACK (4096) elements past the end */
    const plan_row_t *d0 = row(&p, "stage 0.0", 0);
    assert_int_equal((long)d0->bytes[PLAN_WEIGHTS], (53376L + 4096) * 2);
    assert_int_equal((long)d0->bytes[PLAN_GRADS], (53376L + 4096) * 4);
    assert_true(d0->bytes[PLAN_CONTEXT] == PLAN_CUDA_CONTEXT_BYTES);
    assert_true(d0->bytes[PLAN_WORKSPACE] >= 32.0 * PLAN_MIB); /* cuBLASLt's */
    assert_int_equal(d0->in_flight, 2);
    /* its activations as kernels/cuda/model.cu carves them (N = 32 tokens, head dim 16, buffers
     * rounded up to 256 bytes): a layer 4 bf16 (N, D) + 2 (N, QD) + 2 (N, KD) + 3 (N, F) = 16384
     * + 8192 + 4096 + 24576 bytes, r1 and r2 256 each, lse (B x heads x T fp32) 512 = 54272; then
     * tokens and targets 2 x 256, io (N, D) fp32 8192, x_top and d_bottom 2 x 4096, s_dm 8192,
     * s_dy 4096, delta 512 = 29696; and one gradient work set, 4 bf16 (N, D) + (N, QD) + 2 (N, KD)
     * + 2 (N, F) = 40960 */
    assert_int_equal((long)d0->act_mb, 54272L + 29696);
    assert_int_equal((long)d0->bytes[PLAN_ACTS], 2 * (54272L + 29696) + 40960);
    /* GPU optimizer shards (optshard.device follows job.device): their slices' AdamW state on
     * a GPU; the host keeps no gradients then */
    const plan_row_t *shm = row(&p, "shared memory", PLAN_HOST);
    assert_true(shm->bytes[PLAN_GRADS] == 0);
    double held = 0;
    for (int i = 0; i < p.n; i++)
        if (!strncmp(p.rows[i].who, "optshard", 8) && p.rows[i].device >= 0)
            held += p.rows[i].bytes[PLAN_OPTIM];
    assert_true(held >= 106816.0 * 3 * 4 && held < 106816.0 * 3 * 4 + 65536);
    /* optshard.gpu_banks 2: the state twice on the device (the block norms once), the host's
     * rows the same */
    plan_t p2;
    kv[n++] = "optshard.gpu_banks", kv[n++] = "2", kv[n] = NULL;
    manifest_of(&m, kv);
    assert_int_equal(plan_build(&p2, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    double held2 = 0;
    for (int i = 0; i < p2.n; i++)
        if (!strncmp(p2.rows[i].who, "optshard", 8) && p2.rows[i].device >= 0)
            held2 += p2.rows[i].bytes[PLAN_OPTIM];
        else if (!strncmp(p2.rows[i].who, "optshard", 8))
            assert_true(p2.rows[i].bytes[PLAN_OPTIM] == row(&p, p2.rows[i].who, PLAN_HOST)->bytes[PLAN_OPTIM]);
    assert_true(held2 == held + 106816.0 * 3 * 4);
    plan_have_t tight = {.host = -1, .shm = -1, .gpus = 0}; /* refused: one bank is a knob */
    for (int g = 0; g < PLAN_MAX_GPUS; g++)
        tight.gpu[g] = p.gpu[0] * 0.5;
    assert_int_equal(plan_check(&p2, &tight, &m, err, sizeof(err)), -ENOMEM);
    assert_non_null(strstr(err, "--optshard.gpu_banks 1"));
    plan_free(&p2);
    /* on a host with one GPU both stage processes and their shards share it (ordinal % GPUs) */
    plan_have_t one = {.gpus = 1}, same = {.gpus = 0};
    assert_int_equal(plan_gpus(&p, &one), 1);
    assert_true(plan_gpu_need(&p, &one, 0) == p.gpu[0] + p.gpu[1]);
    assert_int_equal(plan_gpus(&p, &same), 2);
    assert_true(plan_gpu_need(&p, &same, 1) == p.gpu[1]);
    /* job.mps "auto"'s measure: the most processes on one GPU (the 2 stages and 2 shards on one) */
    int gpu_rows = 0;
    for (int i = 0; i < p.n; i++)
        gpu_rows += p.rows[i].device >= 0;
    assert_int_equal(gpu_rows, 4);
    assert_int_equal(plan_gpu_sharing(&p, &one), 4);
    assert_int_equal(plan_gpu_sharing(&p, &same), 2);
    plan_free(&p);
}

/* Parameter sharding in the plan: on the CPU 4 replicas hold 4 copies of the weights and
 * gradients, S4 one and the exchange (per member a buffer of the stage's largest piece), R2 x S2
 * two; on the GPU (NCCL plane, pp 1) a stage holds its chunk (a quarter) and the pieces it
 * gathers. A refusal on the CPU with replicas names sharding as the knob. */
static void test_plan_with_parameter_sharding(void **state)
{
    manifest_t m;
    plan_t p;
    char err[2048];
    const char *kv[64];
    int n = small_kv(kv);
    kv[n++] = "parallelism.pipeline_parallel_degree", kv[n++] = "1";
    kv[n++] = "parallelism.pipeline_parallel_split_points", kv[n++] = "[]";
    kv[n++] = "parallelism.pipeline_parallel_microbatches", kv[n++] = "1";
    int base = n;
    double w[3];
    const char *layouts[3][2] = {{"4", "1"}, {"1", "4"}, {"2", "2"}};
    for (int i = 0; i < 3; i++) {
        n = base;
        kv[n++] = "parallelism.data_parallel_replicate_degree", kv[n++] = layouts[i][0];
        kv[n++] = "parallelism.data_parallel_shard_degree", kv[n++] = layouts[i][1], kv[n] = NULL;
        manifest_of(&m, kv);
        assert_int_equal(plan_build(&p, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
        const plan_row_t *shm = row(&p, "shared memory", PLAN_HOST);
        w[i] = shm->bytes[PLAN_WEIGHTS];
        /* the exchange: a buffer of the largest piece (the layer, 36992 -> 37888 floats) a member */
        double xchg = i ? (double)atoi(layouts[i][0]) * (4096 + atoi(layouts[i][1]) * 37888.0 * 4) : 0;
        assert_true(shm->bytes[PLAN_GRADS] == w[i] + xchg);
        /* CPU optimizer shards sum the copies into a buffer of their slice; one copy is summed in place */
        size_t b, e;
        job_layout_t l;
        assert_int_equal(job_layout(&l, &m), 0);
        assert_int_equal(job_shard_range(&l, &m, 0, &b, &e), 0);
        assert_true(row(&p, "optshard 0", PLAN_HOST)->bytes[PLAN_GRADS] == (l.copies > 1 ? (double)(e - b) * 4 : 0));
        if (i == 0) { /* R4 on a host too small for its shared memory: sharding is a way out */
            plan_have_t have = {.host = p.host_need * 0.9, .shm = -1, .gpus = 0};
            assert_int_equal(plan_check(&p, &have, &m, err, sizeof(err)), -ENOMEM);
            assert_non_null(strstr(err, "--parallelism.data_parallel_shard_degree 4"));
            /* each knob tried as the launch would plan it: here the processes' runtime is most of it */
            assert_non_null(strstr(err, "a stage) (alone not enough: it would need host RAM ")); /* then "; " */
            assert_non_null(strstr(err, "GiB of 0.08); parameter sharding ("));
            assert_non_null(strstr(err, "; none of these alone makes it fit this machine"));
        }
        plan_free(&p);
    }
    assert_true(w[0] == 4 * 107520.0 * 4 && w[1] == w[0] / 4 && w[2] == w[0] / 2);
    /* a bf16 reduce (S4): the exchange's buffers are bf16, each stage rounds from an fp32 piece */
    double g[2][2];
    for (int bf = 0; bf < 2; bf++) {
        n = base;
        kv[n++] = "parallelism.data_parallel_shard_degree", kv[n++] = "4";
        kv[n++] = "training.mixed_precision_reduce", kv[n++] = bf ? "bfloat16" : "float32", kv[n] = NULL;
        manifest_of(&m, kv);
        assert_int_equal(plan_build(&p, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
        g[bf][0] = row(&p, "shared memory", PLAN_HOST)->bytes[PLAN_GRADS];
        g[bf][1] = row(&p, "stage 0.0", PLAN_HOST)->bytes[PLAN_GRADS];
        plan_free(&p);
    }
    assert_true(g[0][0] - g[1][0] == 4 * 37888.0 * 2 && g[1][1] - g[0][1] == 37888.0 * 4);
    /* the GPU: S4 on the NCCL plane, each stage a quarter of the 106816 floats and its pieces */
    n = base;
    kv[n++] = "parallelism.data_parallel_shard_degree", kv[n++] = "4";
    kv[n++] = "job.device", kv[n++] = "cuda", kv[n++] = "parallelism.data_plane", kv[n++] = "nccl", kv[n] = NULL;
    manifest_of(&m, kv);
    assert_int_equal(plan_build(&p, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    const plan_row_t *d0 = row(&p, "stage 0.0", 0);
    assert_int_equal((long)d0->bytes[PLAN_WEIGHTS], (26704L + 4096 + 2 * 37888) * 2); /* pp 1: resharded */
    assert_int_equal((long)d0->bytes[PLAN_GRADS], (26704L + 4096 + 3 * 37888) * 4);
    plan_free(&p);
    /* with a bf16 reduce: two fp32 piece gradients, the piece rounded and an owner's sum in bf16 */
    kv[n++] = "training.mixed_precision_reduce", kv[n++] = "bfloat16", kv[n] = NULL;
    manifest_of(&m, kv);
    assert_int_equal(plan_build(&p, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
    d0 = row(&p, "stage 0.0", 0);
    assert_int_equal((long)d0->bytes[PLAN_GRADS], (26704L + 4096 + 2 * 37888) * 4 + 2 * 37888L * 2);
    plan_free(&p);
}

/* A GPU job refused for its activations is told to checkpoint them only when it does not yet
 * (it was, under mode full too: a knob that is already on). */
static void test_plan_suggests_activation_checkpointing_only_when_it_is_off(void **state)
{
    manifest_t m;
    plan_t p;
    char err[4096];
    const char *kv[64];
    int n = small_kv(kv);
    kv[n++] = "job.device", kv[n++] = "cuda";
    kv[n++] = "activation_checkpoint.mode";
    for (int full = 0; full < 2; full++) {
        kv[n] = full ? "full" : "none", kv[n + 1] = NULL;
        manifest_of(&m, kv);
        assert_int_equal(plan_build(&p, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
        plan_have_t have = {.host = -1, .shm = -1, .gpus = 0};
        for (int g = 0; g < PLAN_MAX_GPUS; g++) /* the stage's memory but its activations */
            have.gpu[g] = p.gpu[0] - row(&p, "stage 0.0", 0)->bytes[PLAN_ACTS] * 0.5;
        assert_int_equal(plan_check(&p, &have, &m, err, sizeof(err)), -ENOMEM);
        assert_non_null(strstr(err, "fewer activations"));
        assert_non_null(strstr(err, "pipeline_parallel_microbatches above"));
        if (full)
            assert_null(strstr(err, "--activation_checkpoint.mode full"));
        else
            assert_non_null(strstr(err, "--activation_checkpoint.mode full"));
        plan_free(&p);
    }
}

/* A GPU job with offload refused for host memory, its optimizer state most of it: the knob is
 * that state back on the GPUs, with its size; more pipeline stages are not offered (on the host
 * they hold no activations to spread), and the list ends without a separator. Without offload
 * (its refusal for host memory then only the shared segments and processes) no such knob. */
static void test_plan_host_refusal_of_offload_names_the_optimizer_on_the_gpus(void **state)
{
    manifest_t m;
    plan_t p;
    char err[4096];
    const char *kv[64];
    int n = small_kv(kv);
    /* ~30M parameters: offload's two banks of state (24 bytes each) outweigh the processes */
    kv[n++] = "model.dim", kv[n++] = "1024", kv[n++] = "model.hidden_dim", kv[n++] = "4096";
    kv[n++] = "model.n_heads", kv[n++] = "16";
    kv[n++] = "job.device", kv[n++] = "cuda", kv[n++] = "optshard.device";
    for (int off = 1; off >= 0; off--) {
        kv[n] = off ? "cpu" : "cuda", kv[n + 1] = NULL;
        manifest_of(&m, kv);
        assert_int_equal(plan_build(&p, &m, &(plan_opts_t){.cpus = 2}, err, sizeof(err)), 0);
        plan_have_t have = {.host = p.host_need * 0.5, .shm = -1, .gpus = 0};
        for (int g = 0; g < PLAN_MAX_GPUS; g++)
            have.gpu[g] = -1;
        assert_int_equal(plan_check(&p, &have, &m, err, sizeof(err)), -ENOMEM);
        print_message("offload %d: %s\n", off, err);
        if (off)
            assert_non_null(strstr(err, "to fit: the optimizer state on the GPUs (--optshard.device cuda: its "));
        else
            assert_null(strstr(err, "--optshard.device cuda"));
        assert_null(strstr(err, "pipeline_parallel_degree above"));
        size_t len = strlen(err);
        assert_true(len > 8 && strcmp(err + len - 2, "; ") && strcmp(err + len - 8, "to fit: "));
        if (!off) { /* the state on GPUs too small for it, the host large: offload, tried, fits */
            plan_have_t big = {.host = 64 * PLAN_GIB, .shm = -1, .gpus = 0};
            for (int g = 0; g < PLAN_MAX_GPUS; g++)
                big.gpu[g] = g < p.gpus ? 0.9 * p.gpu[g] : -1;
            assert_int_equal(plan_check(&p, &big, &m, err, sizeof(err)), -ENOMEM);
            print_message("on GPUs of 90%%: %.900s\n", err);
            assert_non_null(strstr(err, "optimizer offload (--optshard.device cpu keeps the optimizer state in host "
                                        "memory) (alone it fits)"));
            assert_null(strstr(err, "none of these alone"));
        }
        plan_free(&p);
    }
}

/* `ctitan launch` of the tiny manifest with these overrides under `env`; its output in out, its
 * status returned, its time in *secs. */
static int launch(const char *env, const char *job, const char *extra, char *out, size_t n, double *secs)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s %s launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
             "--loader.dataset_path %s/data/train.bin --metrics.peak_tflops 1 %s 2>&1", env, tu_ctitan(), job, tj_dir,
             job, tj_dir, extra);
    double t0 = now_s();
    int rc = tu_run(cmd, out, n);
    *secs = now_s() - t0;
    return rc;
}

/* The GPUs' free memory from nvidia-smi (CTITAN_PLAN_NVIDIA_SMI: a stand-in script): a line a GPU
 * of its index, UUID and MiB free; a line it cannot read ("[N/A]" under MIG) leaves every GPU
 * unknown (not checked) instead of read as 0 bytes free, which would refuse every job. With
 * CUDA_VISIBLE_DEVICES the GPUs are those it names, in its order, as CUDA numbers them: by index
 * or UUID (a unique prefix), the list ending at the first entry naming none; a MIG instance
 * leaves them unknown. */
static void test_gpu_capacity_from_nvidia_smi_and_not_a_number_is_unknown(void **state)
{
#define SMI3 "0, GPU-aaaa-1111, 1000\n1, GPU-bbbb-2222, 2000\n2, GPU-bbbc-3333, 3000\n"
    static const struct {
        const char *prints, *cvd; /* cvd NULL: unset */
        int gpus;
        double free[3]; /* MiB as CUDA numbers them */
    } cases[] = {
        {"0, GPU-aaaa, 81000\n1, GPU-bbbb, 40000\n", NULL, 2, {81000, 40000}},
        {"0, GPU-aaaa, [N/A]\n", NULL, 0, {-1}},
        {"0, GPU-aaaa, 81000\n1, GPU-bbbb, [N/A]\n", NULL, 0, {-1}},
        {"", NULL, 0, {-1}},
        {"0, GPU-aaaa, -5\n", NULL, 0, {-1}},
        {"81000\n", NULL, 0, {-1}}, /* not the query's three fields */
        {SMI3, "2", 1, {3000}},
        {SMI3, "2,0", 2, {3000, 1000}},
        {SMI3, "GPU-bbbc,GPU-aaaa-1111", 2, {3000, 1000}},
        {SMI3, "1,7,0", 1, {2000}},     /* 7 names no GPU: CUDA stops there */
        {SMI3, "GPU-bbb", 0, {-1}},     /* a prefix of two UUIDs names none */
        {SMI3, "MIG-xyz", 0, {-1}},     /* a MIG instance: its memory is not nvidia-smi's line */
        {SMI3, "", 0, {-1}},            /* no GPU visible */
        {SMI3, "2,2,0", 1, {3000}},     /* named twice: CUDA stops there too */
        {"0, GPU-aaaa, nan\n", NULL, 0, {-1}}, /* not a size */
    };
#undef SMI3
    manifest_t m;
    manifest_of(&m, small);
    char smi[256], *was = getenv("CUDA_VISIBLE_DEVICES");
    was = was ? strdup(was) : NULL;
    snprintf(smi, sizeof(smi), "%s/nvidia-smi", tj_dir);
    setenv("CTITAN_PLAN_NVIDIA_SMI", smi, 1);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        FILE *f = fopen(smi, "w");
        assert_non_null(f);
        fprintf(f, "#!/bin/sh\nprintf '%s'\n", cases[i].prints);
        fclose(f);
        assert_int_equal(chmod(smi, 0755), 0);
        if (cases[i].cvd)
            setenv("CUDA_VISIBLE_DEVICES", cases[i].cvd, 1);
        else
            unsetenv("CUDA_VISIBLE_DEVICES");
        plan_have_t h;
        plan_capacity(&h, &m, 1);
        int ok = h.gpus == cases[i].gpus;
        for (int g = 0; g < (cases[i].gpus ? cases[i].gpus : 1); g++)
            ok = ok && h.gpu[g] == (cases[i].gpus ? cases[i].free[g] * 1048576 : -1);
        if (!ok)
            fail_msg("nvidia-smi printing '%s', CUDA_VISIBLE_DEVICES %s: %d GPUs, GPU 0 %.0f bytes", cases[i].prints,
                     cases[i].cvd ? cases[i].cvd : "unset", h.gpus, h.gpu[0]);
        if (cases[i].gpus)
            assert_non_null(strstr(h.gpu_from, "nvidia-smi's memory.free"));
    }
    /* more output than the plan reads: 51 lines of 100 bytes, then one its 5 KiB end cuts in
     * its number ("8" of 81000): nothing known, not GPU 51 at 8 MiB */
    unsetenv("CUDA_VISIBLE_DEVICES");
    FILE *f = fopen(smi, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\ncat <<'EOF'\n");
    for (int i = 0; i < 51; i++)
        fprintf(f, "%2d, GPU-%084d, 81000\n", i, i);
    fprintf(f, "51, GPU-abcdefgh, 81000\nEOF\n");
    fclose(f);
    plan_have_t h;
    plan_capacity(&h, &m, 1);
    if (h.gpus != 0 || h.gpu[0] != -1)
        fail_msg("nvidia-smi's output cut short: %d GPUs, GPU 0 %.0f bytes", h.gpus, h.gpu[0]);
    if (was)
        setenv("CUDA_VISIBLE_DEVICES", was, 1);
    else
        unsetenv("CUDA_VISIBLE_DEVICES");
    free(was);
    unsetenv("CTITAN_PLAN_NVIDIA_SMI");
}

static void test_launch_refuses_40b_on_an_80gb_gpu(void **state)
{
    TU_NEED_BIN();
    char job[64], out[8192];
    double secs;
    tj_name(job, sizeof(job), 'p', "big");
    int rc = launch("CTITAN_PLAN_DEVICE_BYTES=80000000000 CTITAN_PLAN_HOST_BYTES=1e15", job,
                    "--job.device cuda --model.flavor llama1b --model.dim 8192 --model.n_layers 48 --model.n_heads 64 --model.n_kv_heads 8 "
                    "--model.vocab_size 128256 --training.seq_len 2048 --training.local_batch_size 1 "
                    "--parallelism.pipeline_parallel_degree 1 --parallelism.pipeline_parallel_microbatches 1",
                    out, sizeof(out), &secs);
    if (rc != 1 || !strstr(out, "does not fit GPU 0") || !strstr(out, "74.51 GiB") ||
        !strstr(out, "CTITAN_PLAN_DEVICE_BYTES") || !strstr(out, "--optshard.device cpu"))
        TJ_FAIL_WITH(out, "status %d: expected a refusal naming the GPU's 74.51 GiB and the knobs", rc);
    /* refused from the plan alone: before any process or segment, and at once (it used to run
     * on silently until killed; the bound leaves room for a loaded machine under ASan) */
    assert_true(secs < 5.0);
    tj_assert_clean(job);
}

static void test_launch_refuses_llama1b_on_a_small_host(void **state)
{
    TU_NEED_BIN();
    char job[64], out[8192];
    double secs;
    tj_name(job, sizeof(job), 'p', "1b");
    int rc = launch("CTITAN_PLAN_HOST_BYTES=8000000000", job,
                    "--model.flavor llama1b --model.vocab_size 32000 --model.dim 2048 --training.seq_len 2048 "
                    "--training.local_batch_size 4", out, sizeof(out), &secs);
    if (rc != 1 || !strstr(out, "does not fit this host's memory") || !strstr(out, "7.45 GiB") ||
        !strstr(out, "activation_checkpoint.mode") || !strstr(out, "--parallelism.pipeline_parallel_degree") ||
        !strstr(out, "--training.local_batch_size"))
        TJ_FAIL_WITH(out, "status %d: expected a refusal naming the host's 7.45 GiB and the knobs", rc);
    assert_true(secs < 5.0); /* the coordinator used to climb to 17 GB first */
    tj_assert_clean(job);
}

static void test_dry_run_prints_the_plan_and_starts_nothing(void **state)
{
    TU_NEED_BIN();
    char job[64], out[16384];
    double secs;
    tj_name(job, sizeof(job), 'p', "dry");
    int rc = launch("", job, "--dry-run", out, sizeof(out), &secs);
    if (rc != 0 || !strstr(out, "plan: job") || !strstr(out, "stage 1.0") || !strstr(out, "optshard 1") ||
        !strstr(out, "shared memory") || !strstr(out, "fits"))
        TJ_FAIL_WITH(out, "status %d: expected the plan and `fits`", rc);
    tj_assert_clean(job);
    /* the same refusal a launch gives, with status 1 */
    rc = launch("CTITAN_PLAN_HOST_BYTES=1000000", job, "--dry-run", out, sizeof(out), &secs);
    if (rc != 1 || !strstr(out, "refused: job"))
        TJ_FAIL_WITH(out, "status %d: expected the refusal", rc);
    /* a GPU job's stage and shard share each GPU: what job.mps does with them (PATH without
     * NVIDIA's program: "auto" stays time-sliced) */
    rc = launch("PATH=/usr/bin:/bin", job, "--dry-run --job.device cuda --job.mps auto --model.n_heads 2", out, sizeof(out),
                &secs);
    if (rc != 0 || !strstr(out, "  GPU processes: 2 share a GPU, time-sliced (job.mps = \"auto\": "
                                "nvidia-cuda-mps-control is not on PATH)"))
        TJ_FAIL_WITH(out, "status %d: expected the GPU processes' line", rc);
}

/* A Ctrl-C as soon as the job's first segment exists: the set-up then goes on to measure the
 * sgemm peak (no cache: seconds of work that reads no signal) and start the processes; all of it
 * must be gone within a second. */
static void test_sigint_in_set_up_stops_the_launch_within_a_second(void **state)
{
    TU_NEED_BIN();
    char job[64], cache[256], seg[256], out[256];
    tj_name(job, sizeof(job), 'p', "int");
    snprintf(cache, sizeof(cache), "%s/peak-%s", tj_dir, job); /* none yet: measured in the set-up */
    snprintf(seg, sizeof(seg), "/dev/shm/" SHM_PREFIX "%s.job", job);
    snprintf(out, sizeof(out), "%s/%s.out", tj_dir, job);
    setenv("CTITAN_PEAK_CACHE", cache, 1);
    pid_t pid = tj_launch_bg(job, "--training.steps 1000 --metrics.peak_tflops 0"); /* 0: measure it */
    unsetenv("CTITAN_PEAK_CACHE");
    int up = 0;
    for (int i = 0; i < 3000 && !(up = access(seg, F_OK) == 0); i++)
        nanosleep(&(struct timespec){0, 2000000L}, NULL);
    double t0 = now_s();
    kill(pid, SIGINT);
    int st = -1;
    pid_t got;
    while ((got = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
        ;
    double secs = now_s() - t0;
    int procs = tj_job_procs(job);
    char names[64][SHM_NAME_MAX], text[8192];
    int segs = shm_list(job, names, 64);
    tj_remove_leftovers(job); /* whatever happened, nothing stays behind */
    tu_read_file(out, text, sizeof(text));
    if (!up)
        TJ_FAIL_WITH(text, "the job's segment never appeared");
    assert_int_equal(got, pid);
    if (secs >= 1.0 || procs || segs || !WIFEXITED(st) || WEXITSTATUS(st) != 130)
        TJ_FAIL_WITH(text, "after SIGINT: %.2f s to exit (status %d), %d processes and %d segments left", secs,
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1, procs, segs);
}

/* A launch right after another run's Ctrl-C: that stop returned before the kernel had freed the
 * run's segments (shm_remove_all_async), and the launch sizes itself against the host's memory
 * only once it is freed, saying so while it waits. A child holds the freers' lock (as a freer
 * does) past the first report, then lets go. */
static void test_launch_waits_for_a_stopped_runs_memory_saying_so(void **state)
{
    TU_NEED_BIN();
    char job[64], out[16384];
    double secs;
    int said[2];
    assert_int_equal(pipe(said), 0);
    pid_t child = fork();
    if (child == 0) {
        int lk = open("/dev/shm/ctitan-free.lock", O_RDWR | O_CREAT, 0600);
        if (lk < 0 || flock(lk, LOCK_SH) || write(said[1], "L", 1) != 1)
            _exit(1);
        struct timespec t = {(time_t)SHM_WAIT_SAY_S + 1, 200000000L}; /* past the launch's report */
        nanosleep(&t, NULL);
        _exit(0);
    }
    char b;
    close(said[1]);
    assert_int_equal(read(said[0], &b, 1), 1);
    close(said[0]);
    tj_name(job, sizeof(job), 'p', "wait");
    int rc = launch("", job, "--dry-run", out, sizeof(out), &secs);
    int st;
    assert_int_equal(waitpid(child, &st, WNOHANG), child); /* gone before the launch went on */
    if (rc != 0 || !strstr(out, "waiting for the memory of a stopped run to be freed") || !strstr(out, "fits"))
        TJ_FAIL_WITH(out, "status %d: expected the wait, then the plan", rc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_figures_of_a_small_cpu_job),
        cmocka_unit_test(test_plan_figures_of_a_small_gpu_job),
        cmocka_unit_test(test_plan_with_parameter_sharding),
        cmocka_unit_test(test_plan_suggests_activation_checkpointing_only_when_it_is_off),
        cmocka_unit_test(test_plan_host_refusal_of_offload_names_the_optimizer_on_the_gpus),
        cmocka_unit_test(test_gpu_capacity_from_nvidia_smi_and_not_a_number_is_unknown),
        cmocka_unit_test(test_launch_refuses_40b_on_an_80gb_gpu),
        cmocka_unit_test(test_plan_names_one_bank_of_shard_state_where_it_fits),
        cmocka_unit_test(test_plan_offload_in_bf16_halves_the_host_copies_and_is_named_with_one_bank),
        cmocka_unit_test(test_launch_refuses_llama1b_on_a_small_host),
        cmocka_unit_test(test_dry_run_prints_the_plan_and_starts_nothing),
        cmocka_unit_test(test_sigint_in_set_up_stops_the_launch_within_a_second),
        cmocka_unit_test(test_launch_waits_for_a_stopped_runs_memory_saying_so),
    };
    if (tj_setup("plan"))
        return 1;
    int rc = tu_run_group_tests(tests, NULL, NULL);
    tj_teardown();
    return rc;
}
