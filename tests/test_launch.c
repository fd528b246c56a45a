/* `ctitan launch` end to end, with real processes, sockets, shared memory and files: the
 * coordinator starts the loader, pipeline stages and optimizer shards of manifests/tiny.toml
 * on a small corpus prepared by `ctitan prep`. Losses are compared as the exact decimal
 * strings of the metrics file (%.17g round-trips a double), so "equal" means bitwise. Here:
 * the same losses in every topology and schedule, loader kill and swap, Ctrl-C, a killed or
 * stopped stage, bad manifests, stale segments; after every run no process and no segment of
 * the job is left. Checkpoints are test_launch_ckpt's, the emulated GPU test_launch_gpu's, the
 * control plane's trust test_launch_trust's (the job helpers of all four: tests/testjob.h). */
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

#include "stages/data/tokfile.h"
#include "stages/job/job.h"

#include "tests/testjob.h"

/* Every job here runs 12 steps unless its arguments say otherwise. */
static int setup(void **state) { tj_base = "--training.steps 12"; return tj_setup("launch"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 't', what); }

static void test_launch_losses_bitwise_equal_for_pipeline_degree_1_2_4(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[3][32], extra[256];
    int pp[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        job_name(j[i], sizeof(j[i]), i == 0 ? "pp1" : i == 1 ? "pp2" : "pp4");
        snprintf(extra, sizeof(extra), "--parallelism.pipeline_parallel_degree %d --parallelism.pipeline_parallel_microbatches 4",
                 pp[i]);
        tj_run_ok(j[i], extra, out, sizeof(out));
        tj_assert_clean(j[i]);
    }
    tj_assert_same_losses(j[0], j[1], 12);
    tj_assert_same_losses(j[0], j[2], 12);
    /* and it learns: the last loss is well below the first */
    static char l[TJ_MAX_STEPS][40];
    tj_losses(j[0], l);
    assert_true(atof(l[11]) < atof(l[0]) - 0.5);
}

/* 1 and 3 optimizer shards give the same losses; and the first job's set-up and end-of-run
 * validation say how far they are (CTITAN_TEST_SAY_S 0: a line at every chance, from the
 * coordinator and from the shard). */
static void test_launch_losses_bitwise_equal_for_1_and_3_optimizer_shards(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32];
    job_name(a, sizeof(a), "k1");
    job_name(b, sizeof(b), "k3");
    char val[512];
    snprintf(val, sizeof(val), "--optshard.shards 1 --validation.enable true --validation.steps 2 "
             "--validation.dataset_path %s/data/val.bin", tj_dir);
    setenv("CTITAN_TEST_SAY_S", "0", 1); /* the progress lines at every chance */
    int rc = tj_run(a, val, out, sizeof(out));
    unsetenv("CTITAN_TEST_SAY_S");
    assert_int_equal(rc, 0);
    const char *lines[] = {"launch: set-up: making the shared-memory segment", "processes ready (",
                           "initialising the weights of its slice: ", "ctitan: validation: 1 of "};
    for (int i = 0; i < 4; i++)
        if (!strstr(out, lines[i]))
            TJ_FAIL_WITH(out, "no line with \"%s\"", lines[i]);
    tj_run_ok(b, "--optshard.shards 3", out, sizeof(out));
    tj_assert_same_losses(a, b, 12);
    tj_assert_clean(a);
    tj_assert_clean(b);
}

static void test_launch_losses_bitwise_equal_for_gpipe_and_1f1b(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32];
    job_name(a, sizeof(a), "gpipe");
    job_name(b, sizeof(b), "1f1b");
    const char *mb = "--parallelism.pipeline_parallel_microbatches 4 --parallelism.pipeline_parallel_degree 3";
    char extra[512];
    snprintf(extra, sizeof(extra), "%s --parallelism.pipeline_parallel_schedule GPipe", mb);
    assert_int_equal(tj_run(a, extra, out, sizeof(out)), 0);
    snprintf(extra, sizeof(extra), "%s --parallelism.pipeline_parallel_schedule 1F1B", mb);
    assert_int_equal(tj_run(b, extra, out, sizeof(out)), 0);
    tj_assert_same_losses(a, b, 12);
}

/* [activation_checkpoint] (issue 24): every mode gives mode none's losses bit for bit at pp 2,
 * whatever the schedule: 1F1B (each W runs inside its B), GPipe, InterleavedZeroBubble (two
 * chunks a rank) and ZBVZeroBubble (W held back: the recompute's work sets wait for it); and on
 * the emulated GPU under 1F1B and ZB-H1 (InterleavedZeroBubble at one stage a rank). Every
 * schedule gives 1F1B's losses, so one baseline per device. */
static void test_launch_activation_checkpointing_keeps_the_losses_under_each_schedule(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    const char *shape = "--model.n_layers 4 --parallelism.pipeline_parallel_microbatches 4 --training.steps 3";
    static const struct { const char *name, *args; } runs[] = {
        {"acfull", "--parallelism.pipeline_parallel_schedule 1F1B --activation_checkpoint.mode full"},
        {"acsel2", "--parallelism.pipeline_parallel_schedule GPipe --activation_checkpoint.mode selective"},
        {"acop", "--parallelism.pipeline_parallel_schedule InterleavedZeroBubble --activation_checkpoint.mode "
                 "selective --activation_checkpoint.selective_ac_option op"},
        {"aczbv", "--parallelism.pipeline_parallel_schedule ZBVZeroBubble --activation_checkpoint.mode full"},
    };
    char base[32], j[32], extra[512];
    job_name(base, sizeof(base), "acnone");
    tj_run_ok(base, shape, out, sizeof(out));
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        job_name(j, sizeof(j), runs[i].name);
        snprintf(extra, sizeof(extra), "%s %s", shape, runs[i].args);
        tj_run_ok(j, extra, out, sizeof(out));
        tj_assert_same_losses(base, j, 3);
        tj_assert_clean(j);
    }
    /* the GPU model on the emulator: dim 128 for its attention's head dimension */
    const char *gpu = "--model.dim 128 --model.n_heads 2 --model.n_kv_heads 1 --job.device cuda --training.steps 2 "
                      "--training.seq_len 8 --training.local_batch_size 2 --parallelism.pipeline_parallel_microbatches 2";
    TJ_NEED_SIM_PLUGIN();
    job_name(base, sizeof(base), "acgnone");
    tj_run_ok(base, gpu, out, sizeof(out));
    static const char *gruns[][2] = {
        {"acgfull", "--activation_checkpoint.mode full"},
        {"acgzbop", "--parallelism.pipeline_parallel_schedule InterleavedZeroBubble "
                    "--parallelism.pipeline_parallel_layers_per_stage 1 --activation_checkpoint.mode selective "
                    "--activation_checkpoint.selective_ac_option op"},
    };
    for (size_t i = 0; i < 2; i++) {
        job_name(j, sizeof(j), gruns[i][0]);
        snprintf(extra, sizeof(extra), "%s %s", gpu, gruns[i][1]);
        tj_run_ok(j, extra, out, sizeof(out));
        tj_assert_same_losses(base, j, 2);
        tj_assert_clean(j);
    }
    unsetenv("CTITAN_CUDA_PLUGIN");
}

static void test_launch_data_parallel_2_matches_1_with_the_same_global_batch(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32];
    job_name(a, sizeof(a), "dp1");
    job_name(b, sizeof(b), "dp2");
    assert_int_equal(tj_run(a, "--training.local_batch_size 8 --parallelism.pipeline_parallel_microbatches 4", out,
                            sizeof(out)), 0);
    tj_run_ok(b, "--training.local_batch_size 4 --parallelism.pipeline_parallel_microbatches 2 "
                       "--parallelism.data_parallel_replicate_degree 2", out, sizeof(out));
    tj_assert_clean(b);
    static char la[TJ_MAX_STEPS][40], lb[TJ_MAX_STEPS][40];
    assert_int_equal(tj_losses(a, la), 12);
    assert_int_equal(tj_losses(b, lb), 12);
    int differ = 0;
    for (int i = 0; i < 12; i++) {
        double x = atof(la[i]), y = atof(lb[i]);
        assert_true(fabs(x - y) <= 1e-5 * fabs(x));
        differ += strcmp(la[i], lb[i]) != 0;
    }
    print_message("dp2 vs dp1: %d of 12 losses differ in the last bits\n", differ);
}

/* The same tokens as an llm.c file (uint16 after a 256-int header), and split over two
 * ctitan files at a window boundary (a glob), with shuffling on: the same run. */
static void test_launch_llmc_files_and_globs_train_like_one_ctitan_file(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char path[256], err[256];
    snprintf(path, sizeof(path), "%s/data/train.bin", tj_dir);
    tokfile_t *tf = NULL;
    assert_int_equal(tokfile_open(&tf, path, 0, err, sizeof(err)), 0);
    size_t n = tokfile_count(tf), T = 32, cut = (n / T / 3) * T;
    int32_t *tok = malloc(n * sizeof(int32_t));
    uint32_t *u = malloc(n * sizeof(uint32_t));
    uint16_t *u16 = malloc(n * sizeof(uint16_t));
    assert_int_equal(tokfile_read(tf, 0, n, tok), 0);
    tokfile_close(&tf);
    for (size_t i = 0; i < n; i++)
        u[i] = (uint32_t)tok[i], u16[i] = (uint16_t)tok[i];
    int32_t hdr[256] = {TOKFILE_LLMC_MAGIC, TOKFILE_LLMC_VERSION, (int32_t)n};
    snprintf(path, sizeof(path), "%s/llmc.bin", tj_dir);
    FILE *f = fopen(path, "wb");
    fwrite(hdr, sizeof(hdr), 1, f);
    fwrite(u16, sizeof(uint16_t), n, f);
    fclose(f);
    /* window i of the whole file starts at token i*T: part 1 ends one token into window `cut/T` */
    snprintf(path, sizeof(path), "%s/part-1.bin", tj_dir);
    assert_int_equal(tokfile_write(path, u, cut + 1, 300, err, sizeof(err)), 0);
    snprintf(path, sizeof(path), "%s/part-2.bin", tj_dir);
    assert_int_equal(tokfile_write(path, u + cut, n - cut, 300, err, sizeof(err)), 0);
    free(tok), free(u), free(u16);
    char a[32], b[32], c[32], extra[512];
    job_name(a, sizeof(a), "ctfile");
    job_name(b, sizeof(b), "llmcfile");
    job_name(c, sizeof(c), "globfiles");
    assert_int_equal(tj_run(a, "--loader.shuffle true --training.steps 40", out, sizeof(out)), 0);
    snprintf(extra, sizeof(extra), "--loader.shuffle true --training.steps 40 --loader.dataset_path %s/llmc.bin", tj_dir);
    tj_run_ok(b, extra, out, sizeof(out));
    snprintf(extra, sizeof(extra), "--loader.shuffle true --training.steps 40 --loader.dataset_path '%s/part-*.bin'",
             tj_dir);
    tj_run_ok(c, extra, out, sizeof(out));
    tj_assert_same_losses(a, b, 40);
    tj_assert_same_losses(a, c, 40);
    /* and shuffling does change the order: a sequential run differs */
    char d[32];
    static char la[TJ_MAX_STEPS][40], ld[TJ_MAX_STEPS][40];
    job_name(d, sizeof(d), "sequential");
    assert_int_equal(tj_run(d, "--training.steps 40", out, sizeof(out)), 0);
    tj_losses(a, la);
    tj_losses(d, ld);
    assert_true(strcmp(la[0], ld[0]) != 0); /* other sequences in the first batch */
}

static void test_launch_killed_loader_is_restarted_and_losses_match(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], extra[256];
    job_name(a, sizeof(a), "undisturbed");
    job_name(b, sizeof(b), "loaderkill");
    /* a small prefetch keeps the loader busy through the run, so kills land mid-step */
    snprintf(extra, sizeof(extra), "--training.steps 300 --loader.prefetch 1");
    assert_int_equal(tj_run(a, extra, out, sizeof(out)), 0);
    pid_t pid = tj_launch_bg(b, extra);
    int kills = 0;
    for (int target = 5; target <= 205; target += 100) {
        assert_int_equal(tj_wait_step(b, target, 60), 0);
        pid_t ldr = tu_descendant_named(pid, "ctitan-loader");
        if (ldr > 0 && kill(ldr, SIGKILL) == 0)
            kills++;
    }
    assert_int_equal(tu_reap(pid, 120, NULL), 0);
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, b);
    tu_read_file(path, out, sizeof(out));
    assert_true(kills >= 2);
    assert_non_null(strstr(out, "restarted"));
    tj_assert_same_losses(a, b, 300);
    tj_assert_clean(b);
}

/* A loader that stops answering (SIGSTOP) is killed and restarted like a dead one. */
static void test_launch_hung_loader_is_replaced_and_losses_match(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], extra[256], path[256];
    job_name(a, sizeof(a), "hungref");
    job_name(b, sizeof(b), "hungloader");
    snprintf(extra, sizeof(extra), "--training.steps 200 --loader.prefetch 1 --job.heartbeat_interval_ms 50 "
             "--job.heartbeat_timeout_ms 800");
    assert_int_equal(tj_run(a, extra, out, sizeof(out)), 0);
    pid_t pid = tj_launch_bg(b, extra);
    assert_int_equal(tj_wait_step(b, 5, 60), 0);
    pid_t ldr = tu_descendant_named(pid, "ctitan-loader");
    assert_true(ldr > 0);
    kill(ldr, SIGSTOP);
    assert_int_equal(tu_reap(pid, 120, NULL), 0);
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, b);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "killing it to restart it"));
    tj_assert_same_losses(a, b, 200);
    tj_assert_clean(b);
}

static void test_launch_loader_swap_mid_run_gives_the_same_losses(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], extra[256], cmd[1024];
    job_name(a, sizeof(a), "noswap");
    job_name(b, sizeof(b), "swap");
    snprintf(extra, sizeof(extra), "--training.steps 400");
    assert_int_equal(tj_run(a, extra, out, sizeof(out)), 0);
    pid_t pid = tj_launch_bg(b, extra);
    assert_int_equal(tj_wait_step(b, 3, 60), 0);
    pid_t before = tu_descendant_named(pid, "ctitan-loader");
    snprintf(cmd, sizeof(cmd), "%s status --job %s 2>&1", tu_ctitan(), b);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "of 400, loader pid"));
    char ldr[256];
    snprintf(cmd, sizeof(cmd), "%s loader swap --job %s --cmd '%s' 2>&1", tu_ctitan(), b,
             tu_program("ctitan-loader", ldr, sizeof(ldr)));
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    int at = 0;
    assert_int_equal(sscanf(strstr(out, "after step"), "after step %d", &at), 1);
    assert_true(at > 3 && at < 400); /* it landed mid-run */
    pid_t after = tu_descendant_named(pid, "ctitan-loader");
    assert_true(after > 0 && after != before);
    assert_int_equal(tu_reap(pid, 120, NULL), 0);
    tj_assert_same_losses(a, b, 400);
    tj_assert_clean(b);
}

static void test_launch_failed_swap_keeps_the_old_loader_and_the_losses(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], extra[256], cmd[1024];
    job_name(a, sizeof(a), "noswap2");
    job_name(b, sizeof(b), "badswap");
    snprintf(extra, sizeof(extra), "--training.steps 400");
    assert_int_equal(tj_run(a, extra, out, sizeof(out)), 0);
    pid_t pid = tj_launch_bg(b, extra);
    assert_int_equal(tj_wait_step(b, 3, 60), 0);
    char ldr[256];
    snprintf(cmd, sizeof(cmd),
             "%s loader swap --job %s --cmd '%s --text /nonexistent.txt "
             "--tokenizer %s/data/tokenizer.bin' 2>&1", tu_ctitan(), b,
             tu_program("ctitan-loader-text", ldr, sizeof(ldr)), tj_dir);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "/nonexistent.txt"));
    assert_non_null(strstr(out, "previous loader continues"));
    assert_int_equal(tu_reap(pid, 120, NULL), 0);
    tj_assert_same_losses(a, b, 400);
    tj_assert_clean(b);
}

/* The example text loader resumes exactly from its own cursor when swapped for itself. */
static void test_launch_text_loader_swapped_for_itself_resumes_exactly(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], cmd[2048], tl[512];
    job_name(a, sizeof(a), "text");
    job_name(b, sizeof(b), "textswap");
    char ldr[256];
    snprintf(tl, sizeof(tl), "%s --text %s/corpus.txt --tokenizer %s/data/tokenizer.bin "
             "--chunk-bytes 4096", tu_program("ctitan-loader-text", ldr, sizeof(ldr)), tj_dir, tj_dir);
    /* the manifest's command runs through sh -c: pass it with --loader.command=... as one argument */
    snprintf(cmd, sizeof(cmd), "%s launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
             "--metrics.file %s/%s.jsonl --metrics.peak_tflops 1 --training.steps 300 '--loader.command=%s' 2>&1",
             tu_ctitan(), a, tj_dir, a, tj_dir, a, tl);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    /* b starts with the same text loader and swaps it for a fresh one mid-run */
    char line[4096];
    snprintf(line, sizeof(line), "%s launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
             "--metrics.file %s/%s.jsonl --metrics.peak_tflops 1 --training.steps 300 '--loader.command=%s' "
             "> %s/%s.out 2>&1 & echo $!", tu_ctitan(), b, tj_dir, b, tj_dir, b, tl, tj_dir, b);
    assert_int_equal(tu_run(line, out, sizeof(out)), 0);
    pid_t pid = atoi(out);
    assert_int_equal(tj_wait_step(b, 3, 60), 0);
    snprintf(cmd, sizeof(cmd), "%s loader swap --job %s --cmd '%s' 2>&1", tu_ctitan(), b, tl);
    rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    for (int i = 0; i < 12000 && kill(pid, 0) == 0; i++) /* not our child: poll until it exits */
        tj_sleep_ms(10);
    tj_assert_same_losses(a, b, 300);
    tj_assert_clean(b);
}

static void test_launch_ctrl_c_stops_every_process_and_removes_segments(void **state)
{
    TU_NEED_BIN();
    char j[32];
    job_name(j, sizeof(j), "sigint");
    pid_t pid = tj_launch_bg(j, "--training.steps 100000");
    assert_int_equal(tj_wait_step(j, 2, 60), 0);
    assert_true(tj_job_procs(j) >= 5); /* loader, 2 stages, 2 shards */
    assert_true(tj_job_segments(j) >= 4);
    /* a second launch of the same job is refused and leaves the running one alone: its
     * segments, and the control socket `ctitan status` reaches it through */
    static char out[1 << 16];
    char args[1024], cmd[2048];
    tj_args(args, sizeof(args), j, "");
    snprintf(cmd, sizeof(cmd), "%s %s 2>&1", tu_ctitan(), args);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "already running"));
    snprintf(cmd, sizeof(cmd), "%s status --job %s 2>&1", tu_ctitan(), j);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    kill(pid, SIGINT);
    assert_int_equal(tu_reap(pid, 30, NULL), 130);
    tj_assert_clean(j);
}

static void test_launch_killed_stage_fails_the_job_naming_it(void **state)
{
    TU_NEED_BIN();
    char j[32], path[256];
    static char out[1 << 16];
    job_name(j, sizeof(j), "stagekill");
    pid_t pid = tj_launch_bg(j, "--training.steps 100000 --job.max_restarts 0"); /* test_restart: with restarts */
    assert_int_equal(tj_wait_step(j, 2, 60), 0);
    pid_t st = tu_descendant_named(pid, "ctitan-stage");
    assert_true(st > 0);
    kill(st, SIGKILL);
    assert_int_equal(tu_reap(pid, 30, NULL), 1);
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, j);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "failed: stage rank"));
    assert_non_null(strstr(out, "killed by signal 9"));
    tj_assert_clean(j);
}

static void test_launch_stopped_stage_is_noticed_by_heartbeat(void **state)
{
    TU_NEED_BIN();
    char j[32], path[256];
    static char out[1 << 16];
    job_name(j, sizeof(j), "stagestop");
    pid_t pid = tj_launch_bg(j, "--training.steps 100000 --job.heartbeat_interval_ms 50 --job.heartbeat_timeout_ms 1000 "
                          "--job.max_restarts 0");
    assert_int_equal(tj_wait_step(j, 2, 60), 0);
    pid_t st = tu_descendant_named(pid, "ctitan-stage");
    assert_true(st > 0);
    kill(st, SIGSTOP);
    int rc = tu_reap(pid, 30, NULL); /* noticed within the timeout plus clean-up, well under 30 s */
    kill(st, SIGKILL);
    assert_int_equal(rc, 1);
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, j);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "no heartbeat"));
    assert_non_null(strstr(out, "stage rank"));
    tj_assert_clean(j);
}

static void test_launch_loader_error_fails_the_job_with_its_reason(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "ldrerr");
    char extra[512], ldr[256];
    snprintf(extra, sizeof(extra), "'--loader.command=%s --text %s/corpus.txt "
             "--tokenizer %s/nonexistent.bin'", tu_program("ctitan-loader-text", ldr, sizeof(ldr)), tj_dir, tj_dir);
    int rc = tj_run(j, extra, out, sizeof(out));
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "failed: loader: "));
    assert_non_null(strstr(out, "nonexistent.bin"));
    tj_assert_clean(j);
}

static void test_launch_rejects_bad_manifests_with_file_and_line(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char path[256], cmd[1024];
    snprintf(path, sizeof(path), "%s/bad.toml", tj_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "[job]\nname = \"bad\"\n\n[training]\nsteps = 10\nbogus = 3\n");
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s launch %s 2>&1", tu_ctitan(), path);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "bad.toml:6"));
    assert_non_null(strstr(out, "bogus"));
    snprintf(cmd, sizeof(cmd), "%s launch manifests/tiny.toml --parallelism.pipeline_parallel_degree 9 2>&1", tu_ctitan());
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "pipeline_parallel_degree"));
    snprintf(cmd, sizeof(cmd), "%s launch manifests/tiny.toml --training.local_batch_size 3 2>&1", tu_ctitan());
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "local_batch_size"));
    snprintf(cmd, sizeof(cmd), "%s launch manifests/tiny.toml --training.steps ten 2>&1", tu_ctitan());
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "--training.steps"));
    /* a missing data file is named before any process starts, and nothing is left */
    char j[32];
    job_name(j, sizeof(j), "nodata");
    snprintf(cmd, sizeof(cmd), "%s launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
             "--loader.dataset_path %s/missing.bin 2>&1", tu_ctitan(), j, tj_dir, j, tj_dir);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "missing.bin"));
    tj_assert_clean(j);
}

static void test_launch_clears_stale_segments_but_not_a_live_job(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], err[256];
    job_name(j, sizeof(j), "stale");
    /* a launch killed outright, its coordinator too (stopped first, so that it does not take
     * its supervisor's death as a stop and clean up): the workers die with it (parent-death
     * signals), its segments stay behind; the coordinator, orphaned, is a zombie until init
     * reaps it, and counts as gone */
    pid_t pid = tj_launch_bg(j, "--training.steps 100000");
    assert_int_equal(tj_wait_step(j, 2, 60), 0);
    pid_t coord = tu_descendant_named(pid, "ctitan-coord");
    assert_true(coord > 0);
    kill(coord, SIGSTOP);
    kill(pid, SIGKILL);
    assert_int_equal(tu_reap(pid, 10, NULL), 128 + SIGKILL);
    kill(coord, SIGKILL);
    for (int i = 0; i < 500 && tj_job_procs(j) > 0; i++)
        tj_sleep_ms(10);
    assert_int_equal(tj_job_procs(j), 0);
    assert_true(tj_job_segments(j) >= 4);
    tj_run_ok(j, "", out, sizeof(out));
    assert_non_null(strstr(out, "stale"));
    tj_assert_clean(j);
    /* a live owner (this test process) is respected */
    shm_seg_t *s = NULL;
    assert_int_equal(shm_create(&s, j, "job", 4096, err, sizeof(err)), 0);
    job_hdr_t *h = shm_data(s);
    h->magic = JOB_MAGIC;
    h->owner_pid = getpid();
    h->owner_start = job_proc_start(getpid());
    shm_detach(&s);
    assert_int_equal(tj_run(j, "", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "already running"));
    assert_int_equal(tj_job_segments(j), 1);
    shm_remove_all(j);
}

/* A coordinator that stops answering (SIGSTOP): its workers notice within the heartbeat
 * timeout and exit; resumed, it finds them gone, fails and cleans up, and names the cause:
 * itself, not running, rather than the first worker it found gone (no restart: the job's
 * failure is what is checked). */
static void test_launch_workers_leave_a_stopped_coordinator(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], path[256];
    job_name(j, sizeof(j), "coordstop");
    pid_t pid = tj_launch_bg(j, "--training.steps 100000 --job.heartbeat_interval_ms 50 --job.heartbeat_timeout_ms 1000 "
                          "--job.max_restarts 0");
    assert_int_equal(tj_wait_step(j, 2, 60), 0);
    assert_true(tj_job_procs(j) >= 5);
    pid_t coord = tu_descendant_named(pid, "ctitan-coord");
    assert_true(coord > 0);
    kill(coord, SIGSTOP);
    int left = 1;
    for (int i = 0; i < 1000 && (left = tj_job_procs(j)) > 0; i++) /* well under 10 s */
        tj_sleep_ms(10);
    kill(coord, SIGCONT);
    assert_int_equal(left, 0);
    assert_int_equal(tu_reap(pid, 30, NULL), 1);
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, j);
    tu_read_file(path, out, sizeof(out));
    char *why = strstr(out, "failed: ");
    if (!why || !strstr(why, "the coordinator itself was not running for") || !strstr(why, "gave up on it"))
        fail_msg("%s", why ? why : out);
    tj_assert_clean(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch_losses_bitwise_equal_for_pipeline_degree_1_2_4),
        cmocka_unit_test(test_launch_losses_bitwise_equal_for_1_and_3_optimizer_shards),
        cmocka_unit_test(test_launch_losses_bitwise_equal_for_gpipe_and_1f1b),
        cmocka_unit_test(test_launch_activation_checkpointing_keeps_the_losses_under_each_schedule),
        cmocka_unit_test(test_launch_data_parallel_2_matches_1_with_the_same_global_batch),
        cmocka_unit_test(test_launch_llmc_files_and_globs_train_like_one_ctitan_file),
        cmocka_unit_test(test_launch_killed_loader_is_restarted_and_losses_match),
        cmocka_unit_test(test_launch_hung_loader_is_replaced_and_losses_match),
        cmocka_unit_test(test_launch_loader_swap_mid_run_gives_the_same_losses),
        cmocka_unit_test(test_launch_failed_swap_keeps_the_old_loader_and_the_losses),
        cmocka_unit_test(test_launch_text_loader_swapped_for_itself_resumes_exactly),
        cmocka_unit_test(test_launch_ctrl_c_stops_every_process_and_removes_segments),
        cmocka_unit_test(test_launch_killed_stage_fails_the_job_naming_it),
        cmocka_unit_test(test_launch_stopped_stage_is_noticed_by_heartbeat),
        cmocka_unit_test(test_launch_loader_error_fails_the_job_with_its_reason),
        cmocka_unit_test(test_launch_rejects_bad_manifests_with_file_and_line),
        cmocka_unit_test(test_launch_clears_stale_segments_but_not_a_live_job),
        cmocka_unit_test(test_launch_workers_leave_a_stopped_coordinator),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
