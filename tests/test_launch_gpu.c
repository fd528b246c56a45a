/* `ctitan launch` with `job.device cuda` on the emulated CUDA backend (tests/cudasim; a real
 * GPU where the machine has one, for the first test): the GPU path's losses against the CPU's,
 * a missing event wait caught, offload and GPU shards, a resume, the NCCL data plane, two
 * "hosts" of this machine training as one and resuming a one-host checkpoint. The job helpers
 * are tests/testjob.h's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/testjob.h"

/* Every job here runs 12 steps unless its arguments say otherwise. */
static int setup(void **state) { tj_base = "--training.steps 12"; return tj_setup("lgpu"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 't', what); }

/* Steps whose losses are within rel of each other's; with bits = 0 they must also differ
 * somewhere (bf16 against fp32: it did not run on the CPU). */
static void assert_close_losses(const char *a, const char *b, int steps, double rel, int bits)
{
    static char la[TJ_MAX_STEPS][40], lb[TJ_MAX_STEPS][40];
    assert_int_equal(tj_losses(a, la), steps);
    assert_int_equal(tj_losses(b, lb), steps);
    int differ = 0;
    for (int i = 0; i < steps; i++) {
        print_message("step %d: %s %s, %s %s\n", i + 1, a, la[i], b, lb[i]);
        assert_true(fabs(atof(la[i]) - atof(lb[i])) <= rel * atof(la[i]));
        differ |= strcmp(la[i], lb[i]) != 0;
    }
    if (!bits)
        assert_true(differ);
}

/* The largest mem_peak_bytes of a job's metrics. */
static double peak_mem(const char *job)
{
    char path[256], line[4096];
    snprintf(path, sizeof(path), "%s/%s.jsonl", tj_dir, job);
    FILE *f = fopen(path, "r");
    double peak = 0;
    while (f && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "\"mem_peak_bytes\": ");
        if (p && atof(p + 18) > peak)
            peak = atof(p + 18);
    }
    if (f)
        fclose(f);
    return peak;
}

/* [job] device = "cuda": on a machine with an NVIDIA GPU it trains with the same losses as the
 * CPU within bf16's tolerance, on the IPC data plane (pipeline 2) and on a one-rank NCCL one;
 * without a GPU the job fails cleanly, naming the process and why. */
static void test_launch_cuda_device_trains_or_fails_cleanly(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32];
    const char *shape = "--model.dim 128 --model.n_heads 2 --model.n_kv_heads 1"; /* head dim 64 */
    char extra[512];
    job_name(a, sizeof(a), "gpucpu");
    job_name(b, sizeof(b), "gpu");
    assert_int_equal(tj_run(a, shape, out, sizeof(out)), 0);
    snprintf(extra, sizeof(extra), "%s --job.device cuda", shape);
    int rc = tj_run(b, extra, out, sizeof(out));
    if (access("/dev/nvidiactl", F_OK) == 0) {
        if (rc)
            print_error("%s\n", out);
        assert_int_equal(rc, 0);
        static char la[TJ_MAX_STEPS][40], lb[TJ_MAX_STEPS][40];
        assert_int_equal(tj_losses(a, la), 12);
        assert_int_equal(tj_losses(b, lb), 12);
        for (int i = 0; i < 12; i++) /* bf16 activations: a few per cent */
            assert_true(fabs(atof(la[i]) - atof(lb[i])) <= 0.03 * atof(la[i]));
        /* the NCCL data plane with one rank (a single GPU cannot hold two NCCL ranks) */
        char c[32];
        job_name(c, sizeof(c), "gpunccl");
        snprintf(extra, sizeof(extra), "%s --job.device cuda --parallelism.pipeline_parallel_degree 1 "
                 "--parallelism.data_plane nccl", shape);
        tj_run_ok(c, extra, out, sizeof(out));
        assert_int_equal(tj_losses(c, lb), 12);
        for (int i = 0; i < 12; i++)
            assert_true(fabs(atof(la[i]) - atof(lb[i])) <= 0.03 * atof(la[i]));
        tj_assert_clean(c);
    } else {
        print_message("no NVIDIA device here: checking that a cuda job fails cleanly\n");
        assert_int_equal(rc, 1);
        /* whichever stage or optimizer shard noticed first */
        assert_true(strstr(out, "failed: stage rank") || strstr(out, "failed: optshard "));
        char so[512];
        if (access(tu_lib("libctitan_cuda.so", so, sizeof(so)), F_OK) == 0)
            assert_non_null(strstr(out, "no usable CUDA device"));
        else /* make CUDA=0 (the sanitizer build): no plugin to load */
            assert_non_null(strstr(out, "cannot load the CUDA backend"));
    }
    tj_assert_clean(b);
}

/* The GPU path end to end on the emulated backend, pipeline 2 with 2 optimizer shards on the
 * "GPU": activations and gradients through device rings (CUDA IPC), the shards updating the
 * stages' device weights in place. The CPU's losses within bf16's tolerance. Two steps: the
 * emulator takes seconds a step. */
static void test_launch_cuda_path_on_the_emulated_backend(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], extra[512];
    const char *shape = "--model.dim 128 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 2";
    job_name(a, sizeof(a), "simcpu");
    job_name(b, sizeof(b), "simgpu");
    assert_int_equal(tj_run(a, shape, out, sizeof(out)), 0);
    snprintf(extra, sizeof(extra), "%s --job.device cuda", shape);
    TJ_NEED_SIM_PLUGIN();
    int rc = tj_run(b, extra, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_close_losses(a, b, 2, 0.01, 0);
    assert_true(peak_mem(a) > 1e6);  /* a stage's resident set */
    assert_true(peak_mem(b) > 1e6);  /* the emulated device's memory in use */
    assert_non_null(strstr(out, " GiB\n"));
    tj_assert_clean(b);
}

/* The emulated GPU runs streams late and out of step, as a GPU may: without the waits on the
 * neighbours' interprocess events (a test hook drops them) the pipeline reads its inputs before
 * they are written, on the IPC rings and on the NCCL links alike, and the losses go wrong; at
 * pipeline 1 (no rings) the stage's next step reads its weights before the GPU optimizer shards'
 * update has written them (the shards answer an UPDATE without waiting for their device: the
 * stage's stream waits on their events), and with the hook's value "grads" alone the shards
 * read the gradients before the stage's backward has made them (the stage answers its step
 * without waiting for its device: the shards' streams wait on its event). So the GPU-path tests
 * here can fail for a missing wait, not only for wrong arithmetic. */
static void test_launch_emulated_gpu_catches_a_missing_event_wait(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], c[32], a1[32], d[32], e[32], extra[512];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 2 --job.device cuda";
    const char *pp1 = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --model.vocab_size 4096 --job.device cuda "
                      "--parallelism.pipeline_parallel_degree 1";
    job_name(a, sizeof(a), "waits");
    job_name(b, sizeof(b), "nowaits");
    job_name(c, sizeof(c), "nowaitsnccl");
    job_name(a1, sizeof(a1), "waitspp1");
    job_name(d, sizeof(d), "nowaitspp1");
    job_name(e, sizeof(e), "nogradwaits");
    TJ_NEED_SIM_PLUGIN();
    tj_run_ok(a, shape, out, sizeof(out));
    tj_run_ok(a1, pp1, out, sizeof(out));
    setenv("CTITAN_TEST_NO_EVENT_WAITS", "1", 1);
    int rc = tj_run(b, shape, out, sizeof(out));
    snprintf(extra, sizeof(extra), "%s --parallelism.data_plane nccl", shape);
    int rc2 = tj_run(c, extra, out, sizeof(out));
    int rc3 = tj_run(d, pp1, out, sizeof(out));
    setenv("CTITAN_TEST_NO_EVENT_WAITS", "grads", 1); /* only the shards' waits on the gradients */
    int rc4 = tj_run(e, pp1, out, sizeof(out));
    unsetenv("CTITAN_TEST_NO_EVENT_WAITS");
    unsetenv("CTITAN_CUDA_PLUGIN");
    static char la[TJ_MAX_STEPS][40], lb[TJ_MAX_STEPS][40];
    const char *bad[] = {b, c, d, e}, *good[] = {a, a, a1, a1};
    int rcs[] = {rc, rc2, rc3, rc4}, steps[] = {2, 2, 12, 12};
    for (int j = 0; j < 4; j++) {
        assert_int_equal(tj_losses(good[j], la), steps[j]);
        int n = tj_losses(bad[j], lb), wrong = rcs[j] != 0 || n < steps[j];
        for (int i = 0; i < n && i < steps[j]; i++)
            wrong |= strcmp(la[i], lb[i]) != 0;
        print_message("%s: exit %d, %d steps, last loss %s (with the waits: %s)\n", bad[j], rcs[j], n,
                      n ? lb[n - 1] : "-", la[steps[j] - 1]);
        assert_true(wrong);
    }
    tj_assert_clean(b);
    tj_assert_clean(c);
    tj_assert_clean(d);
    tj_assert_clean(e);
}

/* Whether file NAME of step 2's checkpoint is byte for byte the same in jobs a and b. */
static int same_ckpt_step_file(const char *a, const char *b, int step, const char *name)
{
    char pa[512], pb[512], da[256], db[256];
    tj_ckpt_dir(da, sizeof(da), a);
    tj_ckpt_dir(db, sizeof(db), b);
    snprintf(pa, sizeof(pa), "%s/step-%08d/%s", da, step, name);
    snprintf(pb, sizeof(pb), "%s/step-%08d/%s", db, step, name);
    FILE *fa = fopen(pa, "rb"), *fb = fopen(pb, "rb");
    int same = fa && fb;
    long n = 0;
    for (int ca = 0; same && ca != EOF; n += ca != EOF) {
        ca = getc(fa);
        same = ca == getc(fb);
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    print_message("step %d's %s: %s after %ld bytes\n", step, name, same ? "the same" : "differs", n);
    return same && n > 0;
}

static int same_ckpt_file(const char *a, const char *b, const char *name) { return same_ckpt_step_file(a, b, 2, name); }

/* Job c, `extra` with offload's CPU shards (--optshard.device cpu), run on the emulated plugin
 * (which it leaves unset), trains as job b did with GPU shards, bit for bit: the losses of
 * `steps` steps and step 2's master weights and both moments. */
static void assert_offload_as(const char *b, const char *c, const char *extra, int steps, char *out, size_t outlen)
{
    char more[2048];
    snprintf(more, sizeof(more), "%s --optshard.device cpu", extra);
    int rc = tj_run(c, more, out, outlen);
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    tj_assert_same_losses(b, c, steps);
    assert_true(same_ckpt_file(b, c, "model.bin"));
    assert_true(same_ckpt_file(b, c, "exp_avg.bin"));
    assert_true(same_ckpt_file(b, c, "exp_avg_sq.bin"));
}

/* The val_loss record of job's metrics, as written (%.17g); "" without one. */
static void val_loss(const char *job, char *out, size_t n)
{
    static char text[1 << 16];
    tj_read_metrics(job, text, sizeof(text));
    const char *v = strstr(text, "\"val_loss\": ");
    snprintf(out, n, "%.*s", v ? (int)strcspn(v + 12, ",}") : 0, v ? v + 12 : "");
}

/* The "grad_norm" strings (as written, %.17g) of each step of job's metrics; returns how many. */
static int grad_norms(const char *job, char (*norm)[40])
{
    static char text[1 << 16];
    tj_read_metrics(job, text, sizeof(text));
    int n = 0;
    for (const char *p = text; (p = strstr(p, "\"grad_norm\": ")) && n < TJ_MAX_STEPS; p++)
        sscanf(p + 13, "%39[^,}]", norm[n++]);
    return n;
}

/* Data parallel 2 x pipeline 2 on the emulated GPU: optimizer shards on the GPU (summing the
 * two replicas' device gradients through IPC) and offload mode ([optshard] device = "cpu")
 * give the same bits, the fp32 master weights and both moments of step 2's checkpoints as
 * well as the losses: the same sums in replica order, the same gradient norms to the bit and so
 * the same clip factor (max_norm 0.05: every step clips; the block norms in one order on both
 * backends, summed by the coordinator for the CPU shards and on the device by the GPU ones, in
 * one order too), and AdamW's arithmetic is one on both (kernels/adamw.h). Both agree with the
 * CPU within bf16's tolerance. The end's validation runs on the GPU (the same
 * weights: the same bits in both), within bf16's tolerance of the CPU job's, and so does the
 * sample: `ctitan generate --device cuda`'s on the last checkpoint. */
static void test_launch_cuda_offload_and_gpu_shards_agree_on_the_emulated_backend(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], c[32], extra[1024];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 2 "
                        "--parallelism.data_parallel_replicate_degree 2 --training.max_norm 0.05 "
                        "--checkpoint.enable true --checkpoint.interval 2 --validation.enable true "
                        "--validation.steps 2";
    char val[512], va[40], vb[40], vc[40];
    snprintf(val, sizeof(val), "%s --validation.dataset_path %s/data/val.bin", shape, tj_dir);
    shape = val;
    job_name(a, sizeof(a), "simdpcpu");
    job_name(b, sizeof(b), "simdpgpu");
    job_name(c, sizeof(c), "simdpoff");
    assert_int_equal(tj_run(a, shape, out, sizeof(out)), 0);
    TJ_NEED_SIM_PLUGIN();
    snprintf(extra, sizeof(extra), "%s --job.device cuda --model.tokenizer_path %s/data/tokenizer.bin "
             "--sample.tokens 12 --sample.temperature 0", shape, tj_dir);
    tj_run_ok(b, extra, out, sizeof(out));
    if (!strstr(out, "over 2 batches on the GPU"))
        TJ_FAIL_WITH(out, "the validation did not run on the GPU");
    char ckpt[256];
    tj_ckpt_dir(ckpt, sizeof(ckpt), b);
    tj_assert_sample_is_generates(out, ckpt, 2, "val.bin", ", greedy, on the GPU", "--temperature 0 --device cuda");
    snprintf(extra, sizeof(extra), "%s --job.device cuda", shape);
    assert_offload_as(b, c, extra, 2, out, sizeof(out));
    assert_close_losses(a, b, 2, 0.01, 0);
    val_loss(a, va, sizeof(va));
    val_loss(b, vb, sizeof(vb));
    val_loss(c, vc, sizeof(vc));
    print_message("val_loss: CPU %s, GPU shards %s, offload %s\n", va, vb, vc);
    assert_true(va[0] && fabs(atof(va) - atof(vb)) <= 0.01 * atof(va));
    assert_string_equal(vb, vc);
    static char nb[TJ_MAX_STEPS][40], nc[TJ_MAX_STEPS][40];
    assert_int_equal(grad_norms(b, nb), 2);
    assert_int_equal(grad_norms(c, nc), 2);
    for (int i = 0; i < 2; i++) { /* the norms' doubles too (a float clip factor hides their last bits) */
        print_message("step %d: grad_norm %s (GPU shards), %s (offload)\n", i + 1, nb[i], nc[i]);
        assert_string_equal(nb[i], nc[i]);
        assert_true(atof(nb[i]) > 0.05); /* clipped */
    }
    tj_assert_clean(b);
    tj_assert_clean(c);
}

/* Offload in bf16 (optshard.offload_dtype "bfloat16": the shared weights and gradients halved)
 * on the emulated GPU, data parallel 2 x pipeline 2, max_norm 0.05 (every step clips):
 * (1) step 1's loss is the fp32 offload's bit for bit (the CPU shards round the masters to bf16
 * as the GPU does), the later ones within 1e-3 of it (the gradients reach the optimizer rounded
 * to bf16), the grad norms within 1%;
 * (2) any shard count and chunk gives the same bits: one shard against three that sum the two
 * replicas' bf16 gradients two blocks at a time (CTITAN_TEST_GRAD_CHUNK_BLOCKS): losses, grad
 * norms, step 2's master weights and moments;
 * (3) the end's validation and sample read the shards' fp32 masters (the params segment holds
 * bf16): the sample is `ctitan generate --device cuda`'s on the last checkpoint;
 * (4) resumed from step 2's checkpoint, step 3 is the uninterrupted run's. */
static void test_launch_cuda_offload_in_bf16_rounds_what_crosses_the_bus_and_nothing_else(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char f[32], b1[32], b3[32], br[32], extra[2048], ckpt[256];
    char shape[1024];
    snprintf(shape, sizeof(shape), "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 3 "
             "--job.device cuda --optshard.device cpu --parallelism.data_parallel_replicate_degree 2 "
             "--training.max_norm 0.05 --checkpoint.enable true --checkpoint.interval 2 --validation.enable true "
             "--validation.steps 2 --validation.dataset_path %s/data/val.bin", tj_dir);
    job_name(f, sizeof(f), "off32");
    job_name(b1, sizeof(b1), "off16");
    job_name(b3, sizeof(b3), "off16s3");
    job_name(br, sizeof(br), "off16re");
    TJ_NEED_SIM_PLUGIN();
    tj_run_ok(f, shape, out, sizeof(out));
    snprintf(extra, sizeof(extra), "%s --optshard.offload_dtype bfloat16 --model.tokenizer_path %s/data/tokenizer.bin "
             "--sample.tokens 12 --sample.temperature 0", shape, tj_dir);
    tj_run_ok(b1, extra, out, sizeof(out));
    if (!strstr(out, "over 2 batches on the GPU"))
        TJ_FAIL_WITH(out, "the validation did not run on the GPU");
    tj_ckpt_dir(ckpt, sizeof(ckpt), b1);
    tj_assert_sample_is_generates(out, ckpt, 3, "val.bin", ", greedy, on the GPU", "--temperature 0 --device cuda");
    setenv("CTITAN_TEST_GRAD_CHUNK_BLOCKS", "2", 1);
    snprintf(extra, sizeof(extra), "%s --optshard.offload_dtype bfloat16 --optshard.shards 3", shape);
    int rc = tj_run(b3, extra, out, sizeof(out));
    unsetenv("CTITAN_TEST_GRAD_CHUNK_BLOCKS");
    if (rc)
        TJ_FAIL_WITH(out, "three shards, two blocks a chunk");
    snprintf(extra, sizeof(extra), "%s --optshard.offload_dtype bfloat16 --checkpoint.load %s/step-00000002", shape,
             ckpt);
    rc = tj_run(br, extra, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc)
        TJ_FAIL_WITH(out, "the resume");
    static char lf[TJ_MAX_STEPS][40], lb[TJ_MAX_STEPS][40], nf[TJ_MAX_STEPS][40], nb[TJ_MAX_STEPS][40],
        n3[TJ_MAX_STEPS][40];
    assert_int_equal(tj_losses(f, lf), 3);
    assert_int_equal(tj_losses(b1, lb), 3);
    assert_string_equal(lf[0], lb[0]);
    assert_close_losses(f, b1, 3, 1e-3, 1);
    assert_int_equal(grad_norms(f, nf), 3);
    assert_int_equal(grad_norms(b1, nb), 3);
    assert_int_equal(grad_norms(b3, n3), 3);
    for (int i = 0; i < 3; i++) {
        print_message("step %d: grad_norm %s (fp32 offload), %s (bf16), %s (bf16, 3 shards)\n", i + 1, nf[i], nb[i],
                      n3[i]);
        assert_true(fabs(atof(nf[i]) - atof(nb[i])) <= 0.01 * atof(nf[i]));
        assert_true(atof(nb[i]) > 0.05); /* clipped */
        assert_string_equal(nb[i], n3[i]);
    }
    tj_assert_same_losses(b1, b3, 3);
    assert_true(same_ckpt_file(b1, b3, "model.bin"));
    assert_true(same_ckpt_file(b1, b3, "exp_avg.bin"));
    assert_true(same_ckpt_file(b1, b3, "exp_avg_sq.bin"));
    tj_assert_resumed_losses(b1, br, 2, 3);
    tj_assert_clean(f);
    tj_assert_clean(b1);
    tj_assert_clean(b3);
    tj_assert_clean(br);
}

/* One copy of the weights (no data parallel replica), pipeline 2, three optimizer shards on the
 * emulated GPU: the shards write the stages' bf16 weights and clear their gradients in AdamW's
 * own pass (plane_reduce_out), a slice that crosses the stages' boundary in two calls (every
 * tensor decayed: one run of AdamW a slice, split there); offload
 * mode's CPU shards do both in separate calls after theirs. The same bits: the losses of 3
 * steps and step 2's master weights and moments (a weight written wrong or a gradient left
 * uncleared changes the next step's loss). */
static void test_launch_cuda_gpu_shards_publish_in_adamw_as_offload_does_after_it(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char b[32], c[32];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 3 "
                        "--training.max_norm 0 --optshard.shards 3 --checkpoint.enable true --checkpoint.interval 2 "
                        "--optimizer.decay_embed_and_norms true --job.device cuda"; /* one run a slice */
    job_name(b, sizeof(b), "simpubgpu");
    job_name(c, sizeof(c), "simpuboff");
    TJ_NEED_SIM_PLUGIN();
    tj_run_ok(b, shape, out, sizeof(out));
    assert_offload_as(b, c, shape, 3, out, sizeof(out));
    tj_assert_clean(b);
    tj_assert_clean(c);
}

/* GPU optimizer shards checkpoint (snapshot copied from the device) and resume (uploaded):
 * the resumed run's losses are bitwise those of the uninterrupted one. The snapshot's copy into
 * the pinned staging segment is slowed to 1.5 s an array (the emulator's
 * CTITAN_SIM_PINNED_COPY_DELAY_MS) while the next step runs on: a shard that updated its state
 * before the copy had read it would checkpoint step 3's state as step 2's. With a snapshot copy
 * on the device (optshard.gpu_banks 2: the state copied there first, the copier taking that one)
 * the next updates run during the copy: the same losses and the same checkpoint, bit for bit. */
static void test_launch_cuda_gpu_shards_resume_bitwise_on_the_emulated_backend(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], a2[32], b[32], dir[256], extra[512];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 4 --job.device cuda";
    job_name(a, sizeof(a), "simck");
    job_name(a2, sizeof(a2), "simck2");
    job_name(b, sizeof(b), "simckb");
    TJ_NEED_SIM_PLUGIN();
    snprintf(extra, sizeof(extra), "%s --checkpoint.enable true --checkpoint.interval 2", shape);
    setenv("CTITAN_SIM_PINNED_COPY_DELAY_MS", "1500", 1);
    tj_run_ok(a, extra, out, sizeof(out));
    snprintf(extra, sizeof(extra), "%s --checkpoint.enable true --checkpoint.interval 2 --optshard.gpu_banks 2", shape);
    tj_run_ok(a2, extra, out, sizeof(out));
    unsetenv("CTITAN_SIM_PINNED_COPY_DELAY_MS");
    tj_assert_same_losses(a, a2, 4);
    assert_true(same_ckpt_file(a, a2, "model.bin"));
    assert_true(same_ckpt_file(a, a2, "exp_avg.bin"));
    assert_true(same_ckpt_file(a, a2, "exp_avg_sq.bin"));
    tj_assert_clean(a2);
    assert_non_null(strstr(out, "checkpoint: step 2 saved to"));
    tj_ckpt_dir(dir, sizeof(dir), a);
    snprintf(extra, sizeof(extra), "%s --checkpoint.load %s/step-00000002", shape, dir);
    int rc = tj_run(b, extra, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    tj_assert_resumed_losses(a, b, 2, 4); /* step 4's loss reads the optimizer state of step 2 */
    tj_assert_clean(b);
}

/* The NCCL data plane on the emulated backend (its NCCL stand-in moves bytes between real
 * processes), data parallel 2 x pipeline 2: neighbours send and receive through NCCL, replicas
 * reduce-scatter gradients and all-gather weights, one GPU shard per stage process. The same
 * losses as the IPC plane within 1e-4, also when resuming the IPC run's checkpoint (its
 * shards cut the flat space elsewhere: the checkpoint reshards). */
static void test_launch_cuda_nccl_data_plane_on_the_emulated_backend(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], c[32], dir[256], extra[512];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 3 --job.device cuda "
                        "--parallelism.data_parallel_replicate_degree 2";
    job_name(a, sizeof(a), "simipc");
    job_name(b, sizeof(b), "simnccl");
    job_name(c, sizeof(c), "simncclck");
    TJ_NEED_SIM_PLUGIN();
    snprintf(extra, sizeof(extra), "%s --checkpoint.enable true --checkpoint.interval 2", shape);
    tj_run_ok(a, extra, out, sizeof(out));
    snprintf(extra, sizeof(extra), "%s --parallelism.data_plane nccl", shape);
    tj_run_ok(b, extra, out, sizeof(out));
    assert_non_null(strstr(out, "4 optimizer shards")); /* dp x pp */
    tj_ckpt_dir(dir, sizeof(dir), a);
    snprintf(extra, sizeof(extra), "%s --parallelism.data_plane nccl --checkpoint.load %s/step-00000002", shape, dir);
    int rc = tj_run(c, extra, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_close_losses(a, b, 3, 1e-4, 1);
    static char la[TJ_MAX_STEPS][40], lc[TJ_MAX_STEPS][40];
    assert_int_equal(tj_losses(a, la), 3);
    assert_int_equal(tj_losses_from(c, 3, lc), 1);
    print_message("step 3: %s %s, resumed %s %s\n", a, la[2], c, lc[0]);
    assert_true(fabs(atof(la[2]) - atof(lc[0])) <= 1e-4 * atof(la[2]));
    tj_assert_clean(b);
    tj_assert_clean(c);
}

/* Job b on two "hosts" of this machine (host 1's segments carry the suffix -h1): host 1's
 * agent in the background, placed by SLURM_STEP_NUM_NODES / SLURM_NODEID as under srun, and
 * the coordinator (host_rank 0) here, on a free loopback port; both must succeed. out gets the
 * coordinator's output, agent_out the agent's. */
static void launch_two_hosts(const char *b, const char *args, char *out, size_t outlen, char *agent_out, size_t alen)
{
    char extra[1400], path[300], keys[128], cmd[2048];
    /* the hosts' control-plane keys, as an operator makes them (issue 12) */
    snprintf(keys, sizeof(keys), "%s/keys-%s", tj_dir, b);
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && %s ckpt keygen %s/host0 && %s ckpt keygen %s/host1 2>&1", keys,
             tu_ctitan(), keys, tu_ctitan(), keys);
    assert_int_equal(tu_run(cmd, out, outlen), 0);
    int port = tu_free_port();
    assert_true(port > 0);
    snprintf(extra, sizeof(extra), "%s --job.hosts 2 --job.endpoint tcp://127.0.0.1:%d --job.keys %s", args, port,
             keys);
    setenv("SLURM_STEP_NUM_NODES", "2", 1);
    setenv("SLURM_NODEID", "1", 1);
    pid_t agent = tj_launch_bg(b, extra);
    unsetenv("SLURM_STEP_NUM_NODES");
    unsetenv("SLURM_NODEID");
    int rc = tj_run(b, extra, out, outlen);
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_int_equal(tu_reap(agent, 60, NULL), 0);
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, b);
    tu_read_file(path, agent_out, alen);
}

/* Two hosts on one machine, each running one replica (its 2 stages, 2 NCCL shards and a
 * loader); the replicas meet only through NCCL (the emulator's stand-in) and the control plane
 * over TCP. Bitwise the losses of one host. */
static void test_launch_two_hosts_train_like_one_on_the_emulated_backend(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16], agent_out[1 << 16];
    char a[32], b[32], bh1[40];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 3 --job.device cuda "
                        "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_plane nccl";
    job_name(a, sizeof(a), "onehost");
    job_name(b, sizeof(b), "twohosts");
    snprintf(bh1, sizeof(bh1), "%s-h1", b);
    TJ_NEED_SIM_PLUGIN();
    tj_run_ok(a, shape, out, sizeof(out));
    launch_two_hosts(b, shape, out, sizeof(out), agent_out, sizeof(agent_out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    assert_non_null(strstr(out, "4 optimizer shards; 10 processes")); /* a loader per host */
    assert_non_null(strstr(agent_out, "host 1 of 2: 5 processes"));
    tj_assert_same_losses(a, b, 3);
    tj_assert_clean(b);
    tj_assert_clean(bh1);
}

/* checkpoint.load across hosts: each host's agent loads its own staging segment with a
 * checkpointd that loads once (--load), host 0 through LOADED; the two-host run resumed from a
 * one-host run's checkpoint has that run's losses bit for bit. */
static void test_launch_two_hosts_resume_a_one_host_checkpoint(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16], agent_out[1 << 16];
    char a[32], b[32], bh1[40], dir[256], extra[1024];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 4 --job.device cuda "
                        "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_plane nccl";
    job_name(a, sizeof(a), "hlone");
    job_name(b, sizeof(b), "hltwo");
    snprintf(bh1, sizeof(bh1), "%s-h1", b);
    TJ_NEED_SIM_PLUGIN();
    snprintf(extra, sizeof(extra), "%s --checkpoint.enable true --checkpoint.interval 2", shape);
    tj_run_ok(a, extra, out, sizeof(out));
    tj_ckpt_dir(dir, sizeof(dir), a);
    snprintf(extra, sizeof(extra), "%s --checkpoint.load %s/step-00000002", shape, dir);
    launch_two_hosts(b, extra, out, sizeof(out), agent_out, sizeof(agent_out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    assert_non_null(strstr(out, "(after step 2)"));
    assert_non_null(strstr(agent_out, "host 1: checkpoint of step 2 loaded"));
    tj_assert_resumed_losses(a, b, 2, 4);
    tj_assert_clean(b);
    tj_assert_clean(bh1);
}

/* field ("VmHWM:", "VmRSS:") of /proc/PID/status, in bytes; 0 if unread */
static double proc_status_bytes(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    double v = 0;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, field, strlen(field)))
            v = atof(line + strlen(field)) * 1024;
    if (f)
        fclose(f);
    return v;
}

/* A GPU optimizer shard makes its state on the device through one host buffer of a piece
 * (JOB_STATE_PIECE parameters), never whole on the host: at the 8B the whole state is 12 bytes
 * a parameter, 90 GiB of host RAM the set-up would need for nothing. On the emulator a shard's
 * device memory is its own, so its resident set while training holds its state once; its peak
 * may pass that by the piece, not by the ~230 MB of a host copy of this job's ~19M-parameter
 * slice (it did, by 191 MB, when the state was made on the host first). */
static void test_launch_gpu_shards_make_their_state_on_the_device(void **state)
{
    TU_NEED_BIN();
    char job[32], want[32];
    const char *args = "--model.vocab_size 300000 --model.dim 64 --model.n_heads 2 --model.n_kv_heads 1 "
                       "--training.steps 4 --training.local_batch_size 1 --training.seq_len 8 "
                       "--parallelism.pipeline_parallel_microbatches 1 --validation.enable false --sample.tokens 0 "
                       "--job.device cuda";
    job_name(job, sizeof(job), "gpustate");
    TJ_NEED_SIM_PLUGIN();
    pid_t l = tj_launch_bg(job, args);
    unsetenv("CTITAN_CUDA_PLUGIN");
    int up = tj_wait_step(job, 1, 300);
    int wl = snprintf(want, sizeof(want), "--rank%c%d", 0, 0) + 1;
    pid_t sh = up ? 0 : tu_worker_pid(l, "ctitan-optshard", want, (size_t)wl);
    double hwm = sh > 0 ? proc_status_bytes(sh, "VmHWM:") : 0, rss = sh > 0 ? proc_status_bytes(sh, "VmRSS:") : 0;
    int rc = tu_reap(l, 300, NULL);
    print_message("optshard 0 (pid %d): peak %.1f MB, resident %.1f MB while training\n", (int)sh, hwm / 1e6,
                  rss / 1e6);
    assert_int_equal(up, 0);
    assert_true(sh > 0 && rss > 200e6); /* the ~19M-parameter slice's state, 12 bytes each */
    assert_true(hwm - rss < 100e6);
    assert_int_equal(rc, 0);
    tj_assert_clean(job);
}

/* Rounds of the coordinator named `name` in job's timeline ([profiling] trace_file). */
static int trace_rounds(const char *job, const char *name)
{
    char path[256], needle[64];
    static char text[1 << 20];
    snprintf(path, sizeof(path), "%s/%s.trace.json", tj_dir, job);
    snprintf(needle, sizeof(needle), "\"name\": \"%s\", \"cat\": \"round\"", name);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
    if (f)
        fclose(f);
    text[n] = 0;
    return tj_count(text, needle);
}

/* GPU optimizer shards on the IPC plane make the clip factor between themselves on the device
 * (stages/runtime/devnorm.h: no REDUCE round, each shard summing every shard's block norms)
 * with the bits of the coordinator's sum on the host (the test hook CTITAN_TEST_HOST_NORM=1):
 * pipeline 2, data parallel 2, three shards, max_norm 0.05 so that every step clips, 1.3M
 * parameters (1,270 blocks: more than the sum's 1,024 lanes, split over the shards anywhere); the
 * losses, the grad norms of 3 steps and steps 2's and 3's master weights and moments, bit for
 * bit. One
 * shard (the whole flat space in one run) gives the same bits again. The timelines show which
 * way each job went: three REDUCE rounds on the host's, none on the device's. */
static void test_launch_gpu_shards_make_the_clip_factor_on_the_device_as_the_host_does(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    static char na[TJ_MAX_STEPS][40], nb[TJ_MAX_STEPS][40], nc[TJ_MAX_STEPS][40];
    char a[32], b[32], c[32], args[1024];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --model.vocab_size 20000 "
                        "--training.steps 3 --parallelism.data_parallel_replicate_degree 2 --training.max_norm 0.05 "
                        "--checkpoint.enable true --checkpoint.interval 2 --validation.enable false --sample.tokens 0 "
                        "--job.device cuda";
    job_name(a, sizeof(a), "clipdev");
    job_name(b, sizeof(b), "cliphost");
    job_name(c, sizeof(c), "clipone");
    TJ_NEED_SIM_PLUGIN();
    snprintf(args, sizeof(args), "%s --optshard.shards 3 --profiling.trace_file %s/%s.trace.json", shape, tj_dir, a);
    tj_run_ok(a, args, out, sizeof(out));
    setenv("CTITAN_TEST_HOST_NORM", "1", 1);
    snprintf(args, sizeof(args), "%s --optshard.shards 3 --profiling.trace_file %s/%s.trace.json", shape, tj_dir, b);
    int rc = tj_run(b, args, out, sizeof(out));
    unsetenv("CTITAN_TEST_HOST_NORM");
    if (rc)
        TJ_FAIL_WITH(out, "the job with the norm on the host failed");
    snprintf(args, sizeof(args), "%s --optshard.shards 1", shape);
    tj_run_ok(c, args, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    assert_int_equal(trace_rounds(a, "reduce"), 0);
    assert_int_equal(trace_rounds(a, "update"), 3);
    assert_int_equal(trace_rounds(b, "reduce"), 3);
    tj_assert_same_losses(a, b, 3);
    tj_assert_same_losses(a, c, 3);
    assert_int_equal(grad_norms(a, na), 3);
    assert_int_equal(grad_norms(b, nb), 3);
    assert_int_equal(grad_norms(c, nc), 3);
    for (int i = 0; i < 3; i++) {
        print_message("step %d: grad_norm %s (device), %s (host), %s (one shard)\n", i + 1, na[i], nb[i], nc[i]);
        assert_string_equal(na[i], nb[i]);
        assert_string_equal(na[i], nc[i]);
        assert_true(atof(na[i]) > 0.05); /* clipped */
    }
    for (int s = 2; s <= 3; s++) {
        const char *files[] = {"model.bin", "exp_avg.bin", "exp_avg_sq.bin"};
        for (int i = 0; i < 3; i++) {
            assert_true(same_ckpt_step_file(a, b, s, files[i]));
            assert_true(same_ckpt_step_file(a, c, s, files[i]));
        }
    }
    tj_assert_clean(a);
    tj_assert_clean(b);
    tj_assert_clean(c);
}

/* A stand-in for NVIDIA's nvidia-cuda-mps-control in folder bin: with -f the daemon (it notes
 * its pid, pipe and log folders and CUDA_VISIBLE_DEVICES in $CTITAN_TEST_MPS_LOG, makes its
 * control "socket" and waits; SIGTERM ends it, noted), else a client that notes the command
 * it reads and passes "quit" on to the daemon of $CUDA_MPS_PIPE_DIRECTORY. */
static void fake_mps_control(const char *bin)
{
    char path[512];
    mkdir(bin, 0700);
    snprintf(path, sizeof(path), "%s/nvidia-cuda-mps-control", bin);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("#!/bin/sh\n"
          "log=$CTITAN_TEST_MPS_LOG\n"
          "if [ \"$1\" = -f ]; then\n"
          "  trap 'echo \"daemon $$ quit\" >> \"$log\"; rm -f \"$CUDA_MPS_PIPE_DIRECTORY/control\"; exit 0' TERM\n"
          "  echo \"daemon $$ pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY cvd=${CUDA_VISIBLE_DEVICES-unset}\" >> \"$log\"\n"
          "  echo $$ > \"$CUDA_MPS_PIPE_DIRECTORY/daemon.pid\"\n"
          "  : > \"$CUDA_MPS_PIPE_DIRECTORY/control\"\n"
          "  while :; do sleep 0.05; done\n"
          "fi\n"
          "read cmd\n"
          "echo \"client $cmd\" >> \"$log\"\n"
          "[ \"$cmd\" = quit ] && kill -TERM \"$(cat \"$CUDA_MPS_PIPE_DIRECTORY/daemon.pid\")\"\n"
          "exit 0\n", f);
    fclose(f);
    chmod(path, 0700);
}

/* job.mps = "on": `ctitan launch` runs a private MPS control daemon for the job (every GPU
 * visible to it), its workers find it through CUDA_MPS_PIPE_DIRECTORY, and it is told to quit
 * and its folder removed when the job ends; a daemon an earlier launch left is told to quit
 * first; a launch killed outright takes its daemon with it (the daemon's parent-death signal).
 * Without nvidia-cuda-mps-control on PATH "on" is refused before anything starts, "auto" runs
 * time-sliced. A stand-in program plays the daemon (fake_mps_control). */
static void test_launch_mps_daemon_serves_the_job_and_goes_with_it(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16], text[1 << 14];
    char job[32], bin[256], log[320], dir[200], pipe_dir[256], path[8192], want[512];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --job.device cuda --job.mps on";
    job_name(job, sizeof(job), "mps");
    snprintf(bin, sizeof(bin), "%s/mpsbin", tj_dir);
    snprintf(log, sizeof(log), "%s/mps.log", tj_dir);
    snprintf(dir, sizeof(dir), "/tmp/ctitan-mps-%u-%s-h0", (unsigned)getuid(), job);
    snprintf(pipe_dir, sizeof(pipe_dir), "%s/pipe", dir);
    fake_mps_control(bin);
    setenv("CTITAN_TEST_MPS_LOG", log, 1);
    char args[512];
    snprintf(args, sizeof(args), "%s --training.steps 2", shape);
    assert_int_equal(tj_run(job, args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "job.mps = \"on\": nvidia-cuda-mps-control is not on PATH"));
    assert_int_equal(tj_last_step(job), 0);
    tj_assert_clean(job);
    /* "auto" runs without it then, saying so: each emulated GPU has a stage and its shards */
    char job2[32];
    job_name(job2, sizeof(job2), "mpsauto");
    snprintf(args, sizeof(args), "%s --training.steps 2 --job.mps auto", shape);
    if (!tj_use_sim_plugin()) {
        tj_run_ok(job2, args, out, sizeof(out));
        unsetenv("CTITAN_CUDA_PLUGIN");
        assert_non_null(strstr(out, "job.mps = \"auto\": nvidia-cuda-mps-control is not on PATH: the 2 processes "
                                    "on one GPU are time-sliced"));
        tj_assert_clean(job2);
    }

    /* what a launch killed outright leaves: the folder and its daemon */
    snprintf(path, sizeof(path), "%s/log", dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(mkdir(pipe_dir, 0700), 0);
    assert_int_equal(mkdir(path, 0700), 0);
    fflush(NULL);
    pid_t stale = fork();
    if (stale == 0) {
        setenv("CUDA_MPS_PIPE_DIRECTORY", pipe_dir, 1);
        snprintf(path, sizeof(path), "%s/nvidia-cuda-mps-control", bin);
        execl(path, path, "-f", (char *)NULL);
        _exit(127);
    }
    snprintf(path, sizeof(path), "%s/control", pipe_dir);
    for (int i = 0; i < 500 && access(path, F_OK); i++)
        tj_sleep_ms(10);
    assert_int_equal(access(path, F_OK), 0);

    const char *old_path = getenv("PATH");
    static char saved_path[4096];
    char *saved = strdup(old_path ? old_path : "/usr/bin:/bin");
    snprintf(saved_path, sizeof(saved_path), "%s", saved);
    snprintf(path, sizeof(path), "%s:%s", bin, saved);
    setenv("PATH", path, 1);
    setenv("CUDA_VISIBLE_DEVICES", "0", 1); /* the clients'; the daemon sees every GPU */
    int sim = tj_use_sim_plugin();
    pid_t l = sim ? -1 : tj_launch_bg(job, shape);
    setenv("PATH", saved, 1);
    free(saved);
    unsetenv("CUDA_VISIBLE_DEVICES");
    if (sim) {
        kill(stale, SIGTERM);
        tu_reap(stale, 10, NULL);
        skip();
    }
    assert_int_equal(tj_wait_step(job, 1, 300), 0);
    /* a stage process of the job has the daemon's pipe folder */
    pid_t st = tu_stage_pid(l, 0);
    assert_true(st > 0);
    snprintf(path, sizeof(path), "/proc/%d/environ", (int)st);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    int found = 0;
    snprintf(want, sizeof(want), "CUDA_MPS_PIPE_DIRECTORY=%s", pipe_dir);
    for (size_t at = 0; at < n; at += strnlen(text + at, n - at) + 1)
        found |= !strcmp(text + at, want);
    assert_true(found);
    /* a second launch of the running job is refused and leaves the running job's daemon alone */
    snprintf(path, sizeof(path), "%s:%s", bin, saved_path);
    setenv("PATH", path, 1);
    int rc2 = tj_run(job, shape, out, sizeof(out));
    setenv("PATH", saved_path, 1);
    assert_int_equal(tu_reap(l, 600, NULL), 0);
    assert_int_equal(rc2, 1);
    assert_non_null(strstr(out, "is already running or being launched"));
    unsetenv("CTITAN_CUDA_PLUGIN");
    unsetenv("CTITAN_TEST_MPS_LOG");
    assert_int_equal(tu_reap(stale, 10, NULL), 0); /* the stale daemon was told to quit */
    /* the order of things: the stale daemon quit, the job's started (pipe and log folders its
     * own, every GPU visible), then it quit; its folder is gone */
    f = fopen(log, "r");
    assert_non_null(f);
    n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = 0;
    print_message("%s", text);
    char stale_quit[64], job_daemon[512];
    snprintf(stale_quit, sizeof(stale_quit), "daemon %d quit", (int)stale);
    snprintf(job_daemon, sizeof(job_daemon), " pipe=%s log=%s/log cvd=unset\n", pipe_dir, dir);
    const char *a = strstr(text, "client quit\n"), *b = a ? strstr(a, stale_quit) : NULL;
    const char *c = b ? strstr(b, job_daemon) : NULL, *d = c ? strstr(c, "client quit\n") : NULL;
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_non_null(d);
    assert_non_null(strstr(d, " quit\n"));
    int quits = 0; /* the stale daemon's and the job's own at its end: none from the refused launch */
    for (const char *q = strstr(text, "client quit\n"); q; q = strstr(q + 1, "client quit\n"))
        quits++;
    assert_int_equal(quits, 2);
    assert_int_not_equal(access(dir, F_OK), 0);
    tj_read_out(job, out, sizeof(out));
    assert_non_null(strstr(out, "run under MPS"));
    tj_assert_clean(job);

    /* a launch killed outright: its daemon goes with it (the parent-death signal); the next
     * launch of the job clears what both left */
    snprintf(path, sizeof(path), "%s:%s", bin, saved_path);
    setenv("PATH", path, 1);
    setenv("CTITAN_TEST_MPS_LOG", log, 1);
    unlink(log);
    tj_use_sim_plugin();
    job_name(job, sizeof(job), "mpskill");
    snprintf(dir, sizeof(dir), "/tmp/ctitan-mps-%u-%s-h0", (unsigned)getuid(), job);
    l = tj_launch_bg(job, shape);
    int up = tj_wait_step(job, 1, 300);
    kill(l, SIGKILL);
    tu_reap(l, 10, NULL);
    int quit = 0;
    for (int i = 0; i < 500 && !quit; i++, tj_sleep_ms(10)) {
        f = fopen(log, "r");
        n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
        if (f)
            fclose(f);
        text[n] = 0;
        quit = strstr(text, " quit\n") != NULL;
    }
    print_message("after kill -9 of the launch: %s", text);
    /* clears the segments and the daemon's folder, once the killed job's processes are gone */
    int rc;
    for (int i = 0;; i++) {
        rc = tj_run(job, shape, out, sizeof(out));
        if (rc == 0 || !strstr(out, "already running") || i == 50)
            break;
        tj_sleep_ms(200);
    }
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    unsetenv("CTITAN_CUDA_PLUGIN");
    unsetenv("CTITAN_TEST_MPS_LOG");
    setenv("PATH", saved_path, 1);
    assert_int_equal(up, 0);
    assert_true(quit);
    assert_int_not_equal(access(dir, F_OK), 0);
    tj_assert_clean(job);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch_two_hosts_resume_a_one_host_checkpoint),
        cmocka_unit_test(test_launch_cuda_device_trains_or_fails_cleanly),
        cmocka_unit_test(test_launch_cuda_path_on_the_emulated_backend),
        cmocka_unit_test(test_launch_emulated_gpu_catches_a_missing_event_wait),
        cmocka_unit_test(test_launch_cuda_offload_and_gpu_shards_agree_on_the_emulated_backend),
        cmocka_unit_test(test_launch_cuda_gpu_shards_resume_bitwise_on_the_emulated_backend),
        cmocka_unit_test(test_launch_cuda_gpu_shards_publish_in_adamw_as_offload_does_after_it),
        cmocka_unit_test(test_launch_cuda_offload_in_bf16_rounds_what_crosses_the_bus_and_nothing_else),
        cmocka_unit_test(test_launch_cuda_nccl_data_plane_on_the_emulated_backend),
        cmocka_unit_test(test_launch_two_hosts_train_like_one_on_the_emulated_backend),
        cmocka_unit_test(test_launch_mps_daemon_serves_the_job_and_goes_with_it),
        cmocka_unit_test(test_launch_gpu_shards_make_their_state_on_the_device),
        cmocka_unit_test(test_launch_gpu_shards_make_the_clip_factor_on_the_device_as_the_host_does),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
