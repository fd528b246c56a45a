/* `ctitan launch` end to end, with real processes, sockets, shared memory and files: the
 * coordinator starts the loader, pipeline stages and optimizer shards of manifests/tiny.toml
 * on a small corpus prepared by `ctitan prep`. Losses are compared as the exact decimal
 * strings of the metrics file (%.17g round-trips a double), so "equal" means bitwise. Also:
 * loader kill and swap, Ctrl-C, a killed or stopped stage, bad manifests, stale segments;
 * the review's attacks on the control plane (issue 12), each from an outsider and from the
 * job's own operator key; after every run no process and no segment of the job is left. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>
#include <zmq.h>

#include "checkpointd/ckpt.h"
#include "ipc/ctl.h"
#include "ipc/msg.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "stages/job/job.h"
#include "tests/testutil.h"
#include "stages/data/tokfile.h"
#include "stages/runtime/worker.h"

#define MAX_STEPS 4096

static char g_dir[64]; /* temp dir: data/ from ctitan prep, runs/, metrics files */

static void sleep_ms(int ms) { nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL); }


static int setup(void **state)
{
    if (access(tu_ctitan(), X_OK))
        return 0; /* each test skips */
    snprintf(g_dir, sizeof(g_dir), "/tmp/ctitan-launch-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    /* sentences over 64 made-up words with a pattern a tiny model picks up */
    static const char *syl[] = {"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo"};
    char path[256], cmd[1024], out[8192];
    snprintf(path, sizeof(path), "%s/corpus.txt", g_dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    for (int i = 0; i < 20000; i++)
        fprintf(f, "%s%s%s", syl[(i * 3) % 7], syl[(i * 5 + 1) % 8], i % 7 == 6 ? ".\n" : " ");
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s prep --vocab 300 --out %s/data %s 2>&1", tu_ctitan(), g_dir, path);
    return tu_run(cmd, out, sizeof(out)) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    if (g_dir[0])
        tu_rmtree(g_dir);
    return 0;
}

/* The common arguments of a test run of job `job`: its own dump folder and metrics file. */
static void base_args(char *buf, size_t n, const char *job)
{
    snprintf(buf, n,
             "launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
             "--loader.dataset_path %s/data/train.bin --metrics.file %s/%s.jsonl --metrics.peak_tflops 1 "
             "--training.steps 12",
             job, g_dir, job, g_dir, g_dir, job);
}

/* Runs `ctitan launch` for job with extra arguments to the end; returns its exit status. */
static int launch(const char *job, const char *extra, char *out, size_t outlen)
{
    char args[2048], cmd[4096];
    base_args(args, sizeof(args), job);
    snprintf(cmd, sizeof(cmd), "%s %s %s 2>&1", tu_ctitan(), args, extra);
    return tu_run(cmd, out, outlen);
}

/* launch() that must succeed; prints the job's output when it does not. */
static void launch_ok(const char *job, const char *extra, char *out, size_t outlen)
{
    int rc = launch(job, extra, out, outlen);
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
}

/* Starts `ctitan launch` in the background with its output in DIR/JOB.out; returns its pid. */
static pid_t launch_bg(const char *job, const char *extra)
{
    char args[2048], line[4096], *argv[128];
    base_args(args, sizeof(args), job);
    snprintf(line, sizeof(line), "%s %s %s", tu_ctitan(), args, extra);
    int argc = 0;
    for (char *t = strtok(line, " "); t && argc < 127; t = strtok(NULL, " "))
        argv[argc++] = t;
    argv[argc] = NULL;
    char out[256];
    snprintf(out, sizeof(out), "%s/%s.out", g_dir, job);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static int losses_from(const char *job, int first, char (*loss)[40]);

/* The "loss" strings of each step in job's metrics file; returns the number of steps. */
static int losses(const char *job, char (*loss)[40]) { return losses_from(job, 1, loss); }

/* Whether two jobs' losses are bitwise the same over `steps` steps. */
static void assert_same_losses(const char *a, const char *b, int steps)
{
    static char la[MAX_STEPS][40], lb[MAX_STEPS][40];
    assert_int_equal(losses(a, la), steps);
    assert_int_equal(losses(b, lb), steps);
    for (int i = 0; i < steps; i++)
        if (strcmp(la[i], lb[i])) {
            print_error("step %d: %s has loss %s, %s has %s\n", i + 1, a, la[i], b, lb[i]);
            fail();
        }
}

/* Processes whose environment names the job (workers carry CTITAN_JOB). */
static int job_procs(const char *job)
{
    char want[128], path[300], env[16384];
    int wl = snprintf(want, sizeof(want), "CTITAN_JOB=%s", job) + 1;
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/environ", e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t k = read(fd, env, sizeof(env));
        close(fd);
        for (ssize_t i = 0; i + wl <= k; i += (ssize_t)strlen(env + i) + 1)
            if (!memcmp(env + i, want, (size_t)wl))
                n++;
    }
    closedir(d);
    return n;
}

static int job_segments(const char *job)
{
    char names[64][SHM_NAME_MAX];
    return shm_list(job, names, 64);
}

static void assert_clean(const char *job)
{
    assert_int_equal(job_procs(job), 0);
    assert_int_equal(job_segments(job), 0);
}

/* The pid of launch's process running `comm` (its /proc comm name: "ctitan-coord", the
 * coordinator under its supervisor, or one of the coordinator's workers), or 0. */
static pid_t child_named(pid_t parent, const char *comm) { return tu_descendant_named(parent, comm); }

/* Waits until job's metrics file has reached `step`; 0 or -1 after timeout_s. */
static int wait_step(const char *job, int step, int timeout_s)
{
    char need[64], path[256];
    static char buf[1 << 20]; /* a few hundred steps of metrics lines */
    snprintf(need, sizeof(need), "{\"step\": %d,", step);
    snprintf(path, sizeof(path), "%s/%s.jsonl", g_dir, job);
    for (int i = 0; i < timeout_s * 100; i++) {
        tu_read_file(path, buf, sizeof(buf));
        if (strstr(buf, need))
            return 0;
        sleep_ms(10);
    }
    return -1;
}

static void job_name(char *buf, size_t n, const char *what)
{
    snprintf(buf, n, "t%d%s", (int)getpid(), what);
}

/* ---- checkpoints ---- */

/* The loss strings of steps [first, first + n) of job's metrics file, consecutive from the
 * last record of step `first` on (a resumed run appends, starting at its first step after the
 * checkpoint); returns how many were found. */
static int losses_from(const char *job, int first, char (*loss)[40])
{
    char path[256], line[4096];
    snprintf(path, sizeof(path), "%s/%s.jsonl", g_dir, job);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int n = 0, on = 0;
    while (fgets(line, sizeof(line), f)) {
        int step;
        char *p = strstr(line, "\"loss\": ");
        if (sscanf(line, "{\"step\": %d", &step) != 1 || !p)
            continue;
        if (step == first)
            n = 0, on = 1;
        if (on && step == first + n && n < MAX_STEPS)
            sscanf(p + 8, "%39[^,]", loss[n++]);
        else
            on = 0;
    }
    fclose(f);
    return n;
}

/* Job b resumed after step `from`: its losses equal job a's from step from + 1 to `last`. */
static void assert_resumed_losses(const char *a, const char *b, int from, int last)
{
    static char la[MAX_STEPS][40], lb[MAX_STEPS][40];
    assert_int_equal(losses(a, la), last);
    assert_int_equal(losses_from(b, from + 1, lb), last - from);
    for (int s = from + 1; s <= last; s++)
        if (strcmp(la[s - 1], lb[s - from - 1])) {
            print_error("step %d: %s has loss %s, %s (resumed after step %d) has %s\n", s, a, la[s - 1], b, from,
                        lb[s - from - 1]);
            fail();
        }
}

static void ckpt_dir(char *buf, size_t n, const char *job) { snprintf(buf, n, "%s/runs/%s/checkpoint", g_dir, job); }

static void test_launch_resume_is_bitwise_in_any_topology(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], c[32], d[32], dir[256], extra[512];
    job_name(a, sizeof(a), "ck");
    launch_ok(a, "--checkpoint.enable true --checkpoint.interval 4", out, sizeof(out));
    assert_non_null(strstr(out, "checkpoint: step 4 saved to"));
    assert_clean(a);
    ckpt_dir(dir, sizeof(dir), a);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 3); /* 4, 8 and the last step */
    assert_int_equal(steps[0], 4);
    assert_int_equal(steps[2], 12);
    free(steps);
    /* pipeline 2 -> 1 and 2 -> 3 optimizer shards, from step 4: bitwise */
    job_name(b, sizeof(b), "ckb");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000004 --parallelism.pipeline_parallel_degree 1 "
             "--optshard.shards 3", dir);
    launch_ok(b, extra, out, sizeof(out));
    assert_non_null(strstr(out, "resuming from"));
    assert_resumed_losses(a, b, 4, 12);
    assert_clean(b);
    /* pipeline 3 and one shard from step 8: bitwise */
    job_name(c, sizeof(c), "ckc");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000008 --parallelism.pipeline_parallel_degree 3 "
             "--optshard.shards 1", dir);
    assert_int_equal(launch(c, extra, out, sizeof(out)), 0);
    assert_resumed_losses(a, c, 8, 12);
    /* data parallel 2 with the same global batch from step 4: as close as dp 2 is to dp 1 */
    job_name(d, sizeof(d), "ckd");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000004 --parallelism.data_parallel_replicate_degree 2 "
             "--training.local_batch_size 2 --parallelism.pipeline_parallel_microbatches 1", dir);
    launch_ok(d, extra, out, sizeof(out));
    static char la[MAX_STEPS][40], ld[MAX_STEPS][40];
    assert_int_equal(losses(a, la), 12);
    assert_int_equal(losses_from(d, 5, ld), 8);
    for (int i = 0; i < 8; i++)
        assert_true(fabs(atof(la[4 + i]) - atof(ld[i])) <= 1e-5 * fabs(atof(la[4 + i])));
    /* a run already at its last step has nothing to do */
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000012", dir);
    assert_int_equal(launch(b, extra, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "nothing left to train"));
}

static void test_launch_latest_falls_back_past_a_corrupt_checkpoint(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], dir[256], p[400], extra[512];
    job_name(a, sizeof(a), "cl");
    assert_int_equal(launch(a, "--checkpoint.enable true --checkpoint.interval 4", out, sizeof(out)), 0);
    ckpt_dir(dir, sizeof(dir), a);
    /* 12 loses its index (as if the machine died before the rename), 8 gets a flipped byte */
    snprintf(p, sizeof(p), "%s/step-00000012/index", dir);
    assert_int_equal(unlink(p), 0);
    snprintf(p, sizeof(p), "%s/step-00000008/exp_avg_sq.bin", dir);
    assert_int_equal(tu_flip_byte(p, 4096 + 100), 0);
    /* an explicit path to the corrupt one is refused, naming the tensor and the file */
    job_name(b, sizeof(b), "clb");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000008", dir);
    assert_int_equal(launch(b, extra, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "exp_avg_sq.bin"));
    assert_non_null(strstr(out, "optimizer.exp_avg_sq.model.embed_tokens.weight"));
    assert_non_null(strstr(out, "not resuming from it"));
    assert_clean(b);
    /* latest: 12 and 8 are passed over, saying why; 4 is loaded */
    snprintf(extra, sizeof(extra), "--checkpoint.load latest --checkpoint.folder %s", dir);
    launch_ok(b, extra, out, sizeof(out));
    assert_non_null(strstr(out, "step-00000012 is not loadable"));
    assert_non_null(strstr(out, "incomplete"));
    assert_non_null(strstr(out, "step-00000008 is not loadable"));
    assert_non_null(strstr(out, "checksum mismatch"));
    assert_non_null(strstr(out, "resuming from"));
    assert_resumed_losses(a, b, 4, 12);
    /* an empty folder: latest is a fresh start */
    snprintf(extra, sizeof(extra), "--checkpoint.load latest --checkpoint.folder %s/none", g_dir);
    assert_int_equal(launch(b, extra, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "starting from step 0"));
    assert_same_losses(a, b, 12);
    /* a different model is refused by name */
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000004 --model.dim 64", dir);
    assert_int_equal(launch(b, extra, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "its model.dim = 32, this run's is 64"));
}

static void test_launch_keeps_the_latest_k_checkpoints(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], dir[256];
    job_name(a, sizeof(a), "ck2");
    assert_int_equal(launch(a, "--checkpoint.enable true --checkpoint.interval 2 --checkpoint.keep_latest_k 2", out,
                            sizeof(out)), 0);
    ckpt_dir(dir, sizeof(dir), a);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 2);
    assert_int_equal(steps[0], 10);
    assert_int_equal(steps[1], 12);
    free(steps);
    DIR *dd = opendir(dir);
    struct dirent *e;
    int entries = 0;
    while ((e = readdir(dd)))
        entries += e->d_name[0] != '.';
    closedir(dd);
    assert_int_equal(entries, 2);
}

static void test_launch_checkpoint_due_while_one_is_written_waits_and_says_so(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], ref[32], dir[256], p[300], err[512];
    job_name(ref, sizeof(ref), "ckwref");
    assert_int_equal(launch(ref, "", out, sizeof(out)), 0);
    job_name(a, sizeof(a), "ckw");
    setenv("CTITAN_TEST_CKPT_DELAY_MS", "100", 1); /* each write takes > 2 tiny steps */
    int rc = launch(a, "--checkpoint.enable true --checkpoint.interval 2 --checkpoint.keep_latest_k 0", out,
                    sizeof(out));
    unsetenv("CTITAN_TEST_CKPT_DELAY_MS");
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "is still being written at step"));
    /* none dropped, none damaged, and the losses are those of a run without checkpoints */
    ckpt_dir(dir, sizeof(dir), a);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 6);
    for (int i = 0; i < 6; i++) {
        int bad;
        assert_int_equal(steps[i], 2 * (i + 1));
        ckpt_step_path(p, sizeof(p), dir, steps[i]);
        assert_int_equal(ckpt_verify(p, NULL, &bad, err, sizeof(err)), 0);
    }
    free(steps);
    assert_same_losses(ref, a, 12);
}

/* checkpointd killed while it writes step 4: a new one writes step 4 again from the staging
 * segment (no checkpoint lost, issue 13), the killed one's temporary directory never becomes a
 * checkpoint, and training goes on bitwise. */
static void test_launch_checkpointd_killed_mid_write_is_restarted_and_rewrites_it(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], ref[32], dir[256], tmp_prefix[64];
    job_name(ref, sizeof(ref), "ckref");
    assert_int_equal(launch(ref, "", out, sizeof(out)), 0);
    job_name(a, sizeof(a), "ckk");
    ckpt_dir(dir, sizeof(dir), a);
    setenv("CTITAN_TEST_CKPT_DELAY_MS", "300", 1); /* checkpointd pauses after each data file */
    pid_t pid = launch_bg(a, "--checkpoint.enable true --checkpoint.interval 4");
    unsetenv("CTITAN_TEST_CKPT_DELAY_MS");
    /* wait for the temporary directory of step 4 to appear, then kill the writer */
    snprintf(tmp_prefix, sizeof(tmp_prefix), ".tmp-step-00000004.");
    int seen = 0;
    for (int i = 0; i < 1000 && !seen; i++) {
        DIR *dd = opendir(dir);
        struct dirent *e;
        while (dd && (e = readdir(dd)))
            seen |= !strncmp(e->d_name, tmp_prefix, strlen(tmp_prefix));
        if (dd)
            closedir(dd);
        if (!seen)
            sleep_ms(10);
    }
    assert_true(seen);
    pid_t ck = child_named(pid, "checkpointd");
    assert_true(ck > 0);
    kill(ck, SIGKILL);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, a);
    tu_read_file(path, out, sizeof(out));
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        print_error("%s\n", out);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_non_null(strstr(out, "while writing the checkpoint of step 4: a new checkpointd writes it again"));
    assert_non_null(strstr(out, "checkpoint: step 4 saved to"));
    assert_non_null(strstr(out, "checkpoint: step 8 saved to"));
    /* the killed writer's temporary directory never became a checkpoint and is gone; step 4,
     * written again from the staging segment, 8 and 12 verify */
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 3);
    assert_int_equal(steps[0], 4);
    assert_int_equal(steps[1], 8);
    assert_int_equal(steps[2], 12);
    free(steps);
    DIR *dd = opendir(dir);
    struct dirent *e;
    while ((e = readdir(dd)))
        assert_true(strncmp(e->d_name, ".tmp-", 5));
    closedir(dd);
    char p8[300], err[512];
    int bad;
    snprintf(p8, sizeof(p8), "%s/step-00000008", dir);
    assert_int_equal(ckpt_verify(p8, NULL, &bad, err, sizeof(err)), 0);
    snprintf(p8, sizeof(p8), "%s/step-00000004", dir);
    assert_int_equal(ckpt_verify(p8, NULL, &bad, err, sizeof(err)), 0);
    /* and training never noticed */
    assert_same_losses(ref, a, 12);
    assert_clean(a);
    /* the rewritten step 4 is the real one: a run resumed from it goes on as the reference */
    char b[32], extra[400];
    job_name(b, sizeof(b), "ckkb");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000004", dir);
    assert_int_equal(launch(b, extra, out, sizeof(out)), 0);
    assert_resumed_losses(ref, b, 4, 12);
}

static void test_launch_streams_checkpoints_to_a_remote_checkpointd(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char keys[256], store[256], ep[256], cmd[2048], a[32], b[32], c[32], extra[1024], p[512];
    snprintf(keys, sizeof(keys), "%s/keys", g_dir);
    snprintf(store, sizeof(store), "%s/storage", g_dir);
    mkdir(keys, 0700);
    snprintf(cmd, sizeof(cmd), "%s ckpt keygen %s/storage && %s ckpt keygen %s/trainer && %s ckpt keygen %s/intruder",
             tu_ctitan(), keys, tu_ctitan(), keys, tu_ctitan(), keys);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    pid_t srv = tu_start_storage(store, keys, ep, sizeof(ep));
    assert_true(srv > 0);
    assert_true(ep[0]);
    /* a trainer with an accepted key: every checkpoint lands on the storage side */
    job_name(a, sizeof(a), "rem");
    snprintf(extra, sizeof(extra), "--checkpoint.enable true --checkpoint.interval 4 --checkpoint.endpoint %s "
             "--checkpoint.server_key %s/storage.pub --checkpoint.client_key %s/trainer.key", ep, keys, keys);
    launch_ok(a, extra, out, sizeof(out));
    assert_non_null(strstr(out, "checkpoint: step 12 saved to"));
    snprintf(p, sizeof(p), "%s/%s", store, a);
    int64_t *steps;
    assert_int_equal(ckpt_list(p, &steps), 3);
    free(steps);
    /* nothing was written on the trainer's side */
    char local[256];
    ckpt_dir(local, sizeof(local), a);
    assert_int_equal(access(local, F_OK), -1);
    /* resuming from the storage copy is bitwise */
    job_name(b, sizeof(b), "remb");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/%s/step-00000004", store, a);
    assert_int_equal(launch(b, extra, out, sizeof(out)), 0);
    assert_resumed_losses(a, b, 4, 12);
    /* a trainer whose key is not allowed: with checkpoint.load = latest (the default) it does not
     * start, as it cannot learn what the host holds; started over on purpose (load none) every
     * checkpoint fails, saying why; training does not, but with its last checkpoint not written
     * the job does not end as a success (README) */
    job_name(c, sizeof(c), "remc");
    snprintf(extra, sizeof(extra), "--checkpoint.enable true --checkpoint.interval 6 --checkpoint.endpoint %s "
             "--checkpoint.server_key %s/storage.pub --checkpoint.client_key %s/intruder.key", ep, keys, keys);
    assert_int_equal(launch(c, extra, out, sizeof(out)), 1);
    if (!strstr(out, "cannot ask the storage host what it holds of job") || !strstr(out, "refused our key") ||
        strstr(out, "step 1 "))
        fail_msg("a launch with a refused key: %s", out);
    strcat(extra, " --checkpoint.load none");
    assert_int_equal(launch(c, extra, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "checkpoint of step 6 failed"));
    assert_non_null(strstr(out, "refused our key"));
    assert_non_null(strstr(out, "the checkpoint of step 12, the last, was not written"));
    assert_non_null(strstr(out, "0 of 2 checkpoints"));
    assert_same_losses(a, c, 12);
    snprintf(p, sizeof(p), "%s/%s", store, c);
    assert_int_equal(access(p, F_OK), -1);
    /* a launch of job a again resumes from the storage host (checkpoint.load = latest, the
     * default). There step 12 is gone and step 8 damaged (a byte of its weights flipped, which
     * only the load's checksums see): step 8 is fetched, passed over as it loads, and step 4
     * fetched and loaded; steps 5-12 train again bit for bit, step 8 is written again over the
     * damaged one. Nothing of it is written on the trainer's side. */
    snprintf(p, sizeof(p), "%s/%s/step-00000012", store, a);
    assert_int_equal(tu_rmtree(p), 0);
    snprintf(p, sizeof(p), "%s/%s/step-00000008/model.bin", store, a);
    assert_int_equal(tu_flip_byte(p, 4096 + 100), 0);
    char again[40];
    snprintf(again, sizeof(again), "%sx", a);
    snprintf(extra, sizeof(extra), "--checkpoint.enable true --checkpoint.interval 4 --checkpoint.endpoint %s "
             "--checkpoint.server_key %s/storage.pub --checkpoint.client_key %s/trainer.key --metrics.file %s/%s.jsonl",
             ep, keys, keys, g_dir, again);
    int rc = launch(a, extra, out, sizeof(out));
    /* and a fresh start over the host's checkpoints is refused (it would write over them) */
    static char fresh_out[1 << 16];
    char fresh[1280];
    snprintf(fresh, sizeof(fresh), "--checkpoint.enable true --checkpoint.endpoint %s --checkpoint.server_key "
             "%s/storage.pub --checkpoint.client_key %s/trainer.key --checkpoint.load none --metrics.file %s/%sn.jsonl",
             ep, keys, keys, g_dir, a);
    int fresh_rc = launch(a, fresh, fresh_out, sizeof(fresh_out));
    kill(srv, SIGTERM); /* first: a test that fails must not leave it running */
    int st;
    assert_int_equal(waitpid(srv, &st, 0), srv);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (fresh_rc != 1 || !strstr(fresh_out, "the storage host's folder of job") || !strstr(fresh_out, "would write over"))
        fail_msg("a fresh start against the storage host (rc %d): %s", fresh_rc, fresh_out);
    char want[512];
    snprintf(want, sizeof(want), "resuming from %s/%s/step-00000004 on %s (after step 4)", store, a, ep);
    if (rc || !strstr(out, "step 8 of job") || !strstr(out, "not loading it") || !strstr(out, want))
        fail_msg("a relaunch against the storage host (rc %d): %s", rc, out);
    assert_resumed_losses(a, again, 4, 12);
    for (int step = 8; step <= 12; step += 4) {
        snprintf(p, sizeof(p), "%s/%s/step-%08d", store, a, step);
        int bad = -1;
        assert_int_equal(ckpt_verify(p, NULL, &bad, out, sizeof(out)), 0);
    }
    snprintf(p, sizeof(p), "%s/%s", store, a);
    assert_int_equal(ckpt_list(p, &steps), 3);
    free(steps);
    assert_int_equal(access(local, F_OK), -1); /* streamed into memory: nothing on the trainer's disk */
    assert_clean(a);
    assert_clean(c);
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
    assert_int_equal(launch(a, shape, out, sizeof(out)), 0);
    snprintf(extra, sizeof(extra), "%s --job.device cuda", shape);
    int rc = launch(b, extra, out, sizeof(out));
    if (access("/dev/nvidiactl", F_OK) == 0) {
        if (rc)
            print_error("%s\n", out);
        assert_int_equal(rc, 0);
        static char la[MAX_STEPS][40], lb[MAX_STEPS][40];
        assert_int_equal(losses(a, la), 12);
        assert_int_equal(losses(b, lb), 12);
        for (int i = 0; i < 12; i++) /* bf16 activations: a few per cent */
            assert_true(fabs(atof(la[i]) - atof(lb[i])) <= 0.03 * atof(la[i]));
        /* the NCCL data plane with one rank (a single GPU cannot hold two NCCL ranks) */
        char c[32];
        job_name(c, sizeof(c), "gpunccl");
        snprintf(extra, sizeof(extra), "%s --job.device cuda --parallelism.pipeline_parallel_degree 1 "
                 "--parallelism.data_plane nccl", shape);
        launch_ok(c, extra, out, sizeof(out));
        assert_int_equal(losses(c, lb), 12);
        for (int i = 0; i < 12; i++)
            assert_true(fabs(atof(la[i]) - atof(lb[i])) <= 0.03 * atof(la[i]));
        assert_clean(c);
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
    assert_clean(b);
}

/* The emulated CUDA backend (tests/cudasim, a CPU stand-in for the GPU whose device memory
 * is shareable between processes like CUDA IPC's): CTITAN_CUDA_PLUGIN points the stages and
 * optimizer shards at it. Skips the test when it is not built. */
static void use_sim_plugin(void)
{
    char so[512];
    snprintf(so, sizeof(so), "%s", tu_ctitan());
    *strrchr(so, '/') = 0;
    strcat(so, "/../lib/libctitan_cuda_sim.so");
    if (access(so, R_OK)) {
        print_message("%s not built: skipping\n", so);
        skip();
    }
    setenv("CTITAN_CUDA_PLUGIN", so, 1);
}

/* Steps whose losses are within rel of each other's; with bits = 0 they must also differ
 * somewhere (bf16 against fp32: it did not run on the CPU). */
static void assert_close_losses(const char *a, const char *b, int steps, double rel, int bits)
{
    static char la[MAX_STEPS][40], lb[MAX_STEPS][40];
    assert_int_equal(losses(a, la), steps);
    assert_int_equal(losses(b, lb), steps);
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
    snprintf(path, sizeof(path), "%s/%s.jsonl", g_dir, job);
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
    assert_int_equal(launch(a, shape, out, sizeof(out)), 0);
    snprintf(extra, sizeof(extra), "%s --job.device cuda", shape);
    use_sim_plugin();
    int rc = launch(b, extra, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_close_losses(a, b, 2, 0.01, 0);
    assert_true(peak_mem(a) > 1e6);  /* a stage's resident set */
    assert_true(peak_mem(b) > 1e6);  /* the emulated device's memory in use */
    assert_non_null(strstr(out, " GiB\n"));
    assert_clean(b);
}

/* The emulated GPU runs streams late and out of step, as a GPU may: without the waits on the
 * neighbours' interprocess events (a test hook drops them) the pipeline reads its inputs before
 * they are written, on the IPC rings and on the NCCL links alike, and the losses go wrong. So
 * the GPU-path tests here can fail for a missing wait, not only for wrong arithmetic. */
static void test_launch_emulated_gpu_catches_a_missing_event_wait(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], c[32], extra[512];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 2 --job.device cuda";
    job_name(a, sizeof(a), "waits");
    job_name(b, sizeof(b), "nowaits");
    job_name(c, sizeof(c), "nowaitsnccl");
    use_sim_plugin();
    launch_ok(a, shape, out, sizeof(out));
    setenv("CTITAN_TEST_NO_EVENT_WAITS", "1", 1);
    int rc = launch(b, shape, out, sizeof(out));
    snprintf(extra, sizeof(extra), "%s --parallelism.data_plane nccl", shape);
    int rc2 = launch(c, extra, out, sizeof(out));
    unsetenv("CTITAN_TEST_NO_EVENT_WAITS");
    unsetenv("CTITAN_CUDA_PLUGIN");
    static char la[MAX_STEPS][40], lb[MAX_STEPS][40];
    assert_int_equal(losses(a, la), 2);
    const char *bad[] = {b, c};
    int rcs[] = {rc, rc2};
    for (int j = 0; j < 2; j++) {
        int n = losses(bad[j], lb), wrong = rcs[j] != 0 || n < 2;
        for (int i = 0; i < n && i < 2; i++)
            wrong |= strcmp(la[i], lb[i]) != 0;
        print_message("%s: exit %d, %d steps, step 1 loss %s (with the waits: %s)\n", bad[j], rcs[j], n,
                      n ? lb[0] : "-", la[0]);
        assert_true(wrong);
    }
    assert_clean(b);
    assert_clean(c);
}

/* Data parallel 2 x pipeline 2 on the emulated GPU: optimizer shards on the GPU (summing the
 * two replicas' device gradients through IPC) and offload mode ([optshard] device = "cpu")
 * agree with each other closely and with the CPU within bf16's tolerance. */
static void test_launch_cuda_offload_and_gpu_shards_agree_on_the_emulated_backend(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], c[32], extra[512];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 2 "
                        "--parallelism.data_parallel_replicate_degree 2";
    job_name(a, sizeof(a), "simdpcpu");
    job_name(b, sizeof(b), "simdpgpu");
    job_name(c, sizeof(c), "simdpoff");
    assert_int_equal(launch(a, shape, out, sizeof(out)), 0);
    use_sim_plugin();
    snprintf(extra, sizeof(extra), "%s --job.device cuda", shape);
    launch_ok(b, extra, out, sizeof(out));
    snprintf(extra, sizeof(extra), "%s --job.device cuda --optshard.device cpu", shape);
    int rc = launch(c, extra, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_close_losses(a, b, 2, 0.01, 0);
    assert_close_losses(b, c, 2, 1e-4, 1);
    assert_clean(b);
    assert_clean(c);
}

/* GPU optimizer shards checkpoint (snapshot copied from the device) and resume (uploaded):
 * the resumed run's losses are bitwise those of the uninterrupted one. The snapshot's copy into
 * the pinned staging segment is slowed to 1.5 s an array (the emulator's
 * CTITAN_SIM_PINNED_COPY_DELAY_MS) while the next step runs on: a shard that updated its state
 * before the copy had read it would checkpoint step 3's state as step 2's. */
static void test_launch_cuda_gpu_shards_resume_bitwise_on_the_emulated_backend(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], dir[256], extra[512];
    const char *shape = "--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.steps 4 --job.device cuda";
    job_name(a, sizeof(a), "simck");
    job_name(b, sizeof(b), "simckb");
    use_sim_plugin();
    snprintf(extra, sizeof(extra), "%s --checkpoint.enable true --checkpoint.interval 2", shape);
    setenv("CTITAN_SIM_PINNED_COPY_DELAY_MS", "1500", 1);
    launch_ok(a, extra, out, sizeof(out));
    unsetenv("CTITAN_SIM_PINNED_COPY_DELAY_MS");
    assert_non_null(strstr(out, "checkpoint: step 2 saved to"));
    ckpt_dir(dir, sizeof(dir), a);
    snprintf(extra, sizeof(extra), "%s --checkpoint.load %s/step-00000002", shape, dir);
    int rc = launch(b, extra, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_resumed_losses(a, b, 2, 4); /* step 4's loss reads the optimizer state of step 2 */
    assert_clean(b);
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
    use_sim_plugin();
    snprintf(extra, sizeof(extra), "%s --checkpoint.enable true --checkpoint.interval 2", shape);
    launch_ok(a, extra, out, sizeof(out));
    snprintf(extra, sizeof(extra), "%s --parallelism.data_plane nccl", shape);
    launch_ok(b, extra, out, sizeof(out));
    assert_non_null(strstr(out, "4 optimizer shards")); /* dp x pp */
    ckpt_dir(dir, sizeof(dir), a);
    snprintf(extra, sizeof(extra), "%s --parallelism.data_plane nccl --checkpoint.load %s/step-00000002", shape, dir);
    int rc = launch(c, extra, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_close_losses(a, b, 3, 1e-4, 1);
    static char la[MAX_STEPS][40], lc[MAX_STEPS][40];
    assert_int_equal(losses(a, la), 3);
    assert_int_equal(losses_from(c, 3, lc), 1);
    print_message("step 3: %s %s, resumed %s %s\n", a, la[2], c, lc[0]);
    assert_true(fabs(atof(la[2]) - atof(lc[0])) <= 1e-4 * atof(la[2]));
    assert_clean(b);
    assert_clean(c);
}

/* Job b on two "hosts" of this machine (host 1's segments carry the suffix -h1): host 1's
 * agent in the background, placed by SLURM_STEP_NUM_NODES / SLURM_NODEID as under srun, and
 * the coordinator (host_rank 0) here, on a free loopback port; both must succeed. out gets the
 * coordinator's output, agent_out the agent's. */
static void launch_two_hosts(const char *b, const char *args, char *out, size_t outlen, char *agent_out, size_t alen)
{
    char extra[1400], path[300], keys[128], cmd[2048];
    /* the hosts' control-plane keys, as an operator makes them (issue 12) */
    snprintf(keys, sizeof(keys), "%s/keys-%s", g_dir, b);
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && %s ckpt keygen %s/host0 && %s ckpt keygen %s/host1 2>&1", keys,
             tu_ctitan(), keys, tu_ctitan(), keys);
    assert_int_equal(tu_run(cmd, out, outlen), 0);
    int port = tu_free_port();
    assert_true(port > 0);
    snprintf(extra, sizeof(extra), "%s --job.hosts 2 --job.endpoint tcp://127.0.0.1:%d --job.keys %s", args, port,
             keys);
    setenv("SLURM_STEP_NUM_NODES", "2", 1);
    setenv("SLURM_NODEID", "1", 1);
    pid_t agent = launch_bg(b, extra);
    unsetenv("SLURM_STEP_NUM_NODES");
    unsetenv("SLURM_NODEID");
    int rc = launch(b, extra, out, outlen);
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_int_equal(tu_reap(agent, 60, NULL), 0);
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, b);
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
    use_sim_plugin();
    launch_ok(a, shape, out, sizeof(out));
    launch_two_hosts(b, shape, out, sizeof(out), agent_out, sizeof(agent_out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    assert_non_null(strstr(out, "4 optimizer shards; 10 processes")); /* a loader per host */
    assert_non_null(strstr(agent_out, "host 1 of 2: 5 processes"));
    assert_same_losses(a, b, 3);
    assert_clean(b);
    assert_clean(bh1);
}

static void test_launch_rejects_bad_checkpoint_keys(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32];
    job_name(a, sizeof(a), "ckbad");
    assert_int_equal(launch(a, "--checkpoint.endpoint http://x:1", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "--checkpoint.endpoint"));
    assert_int_equal(launch(a, "--checkpoint.endpoint tcp://127.0.0.1:9 --checkpoint.client_key k", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "checkpoint.server_key"));
    assert_int_equal(launch(a, "--checkpoint.interval 0", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "checkpoint.interval = 0 must be >= 1"));
    assert_int_equal(launch(a, "--checkpoint.load /nonexistent/step-00000004", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "/nonexistent/step-00000004"));
}

/* checkpoint.load without checkpoint.enable: checkpointd loads, then stops; the run has the
 * processes of one without checkpoints and writes none. */
static void test_launch_load_without_enable_only_loads(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], dir[256], extra[512];
    job_name(a, sizeof(a), "lo");
    launch_ok(a, "--checkpoint.enable true --checkpoint.interval 4", out, sizeof(out));
    ckpt_dir(dir, sizeof(dir), a);
    job_name(b, sizeof(b), "lob");
    snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-00000004 --checkpoint.enable false", dir);
    launch_ok(b, extra, out, sizeof(out));
    assert_non_null(strstr(out, "2 optimizer shards; 5 processes")); /* loader, 2 stages, 2 shards */
    assert_null(strstr(out, "saved to"));
    ckpt_dir(dir, sizeof(dir), b);
    assert_int_equal(access(dir, F_OK), -1);
    assert_resumed_losses(a, b, 4, 12);
    assert_clean(b);
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
    use_sim_plugin();
    snprintf(extra, sizeof(extra), "%s --checkpoint.enable true --checkpoint.interval 2", shape);
    launch_ok(a, extra, out, sizeof(out));
    ckpt_dir(dir, sizeof(dir), a);
    snprintf(extra, sizeof(extra), "%s --checkpoint.load %s/step-00000002", shape, dir);
    launch_two_hosts(b, extra, out, sizeof(out), agent_out, sizeof(agent_out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    assert_non_null(strstr(out, "(after step 2)"));
    assert_non_null(strstr(agent_out, "host 1: checkpoint of step 2 loaded"));
    assert_resumed_losses(a, b, 2, 4);
    assert_clean(b);
    assert_clean(bh1);
}

/* A checkpoint.load directory that does not exist: one line that names it once and says why
 * (it used to print its own message inside itself, with an empty reason). */
static void test_launch_missing_checkpoint_is_named_once_with_the_reason(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], path[300], extra[400];
    job_name(a, sizeof(a), "cknone");
    snprintf(path, sizeof(path), "%s/missing/step-00000004", g_dir);
    snprintf(extra, sizeof(extra), "--checkpoint.load %s", path);
    assert_int_equal(launch(a, extra, out, sizeof(out)), 1);
    char *line = strstr(out, "launch: checkpoint.load");
    assert_non_null(line);
    *strchrnul(line, '\n') = 0;
    char *again = strstr(line, path);
    assert_non_null(again);
    if (strstr(again + 1, path))
        print_error("the path twice: %s\n", line);
    assert_null(strstr(again + 1, path));
    assert_non_null(strstr(line, "is not loadable (no such directory): not resuming from it"));
    assert_clean(a);
}

/* ---- equivalence ---- */

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
        launch_ok(j[i], extra, out, sizeof(out));
        assert_clean(j[i]);
    }
    assert_same_losses(j[0], j[1], 12);
    assert_same_losses(j[0], j[2], 12);
    /* and it learns: the last loss is well below the first */
    static char l[MAX_STEPS][40];
    losses(j[0], l);
    assert_true(atof(l[11]) < atof(l[0]) - 0.5);
}

static void test_launch_losses_bitwise_equal_for_1_and_3_optimizer_shards(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32];
    job_name(a, sizeof(a), "k1");
    job_name(b, sizeof(b), "k3");
    assert_int_equal(launch(a, "--optshard.shards 1", out, sizeof(out)), 0);
    launch_ok(b, "--optshard.shards 3", out, sizeof(out));
    assert_same_losses(a, b, 12);
    assert_clean(a);
    assert_clean(b);
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
    assert_int_equal(launch(a, extra, out, sizeof(out)), 0);
    snprintf(extra, sizeof(extra), "%s --parallelism.pipeline_parallel_schedule 1F1B", mb);
    assert_int_equal(launch(b, extra, out, sizeof(out)), 0);
    assert_same_losses(a, b, 12);
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
    launch_ok(base, shape, out, sizeof(out));
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        job_name(j, sizeof(j), runs[i].name);
        snprintf(extra, sizeof(extra), "%s %s", shape, runs[i].args);
        launch_ok(j, extra, out, sizeof(out));
        assert_same_losses(base, j, 3);
        assert_clean(j);
    }
    /* the GPU model on the emulator: dim 128 for its attention's head dimension */
    const char *gpu = "--model.dim 128 --model.n_heads 2 --model.n_kv_heads 1 --job.device cuda --training.steps 2 "
                      "--training.seq_len 8 --training.local_batch_size 2 --parallelism.pipeline_parallel_microbatches 2";
    use_sim_plugin();
    job_name(base, sizeof(base), "acgnone");
    launch_ok(base, gpu, out, sizeof(out));
    static const char *gruns[][2] = {
        {"acgfull", "--activation_checkpoint.mode full"},
        {"acgzbop", "--parallelism.pipeline_parallel_schedule InterleavedZeroBubble "
                    "--parallelism.pipeline_parallel_layers_per_stage 1 --activation_checkpoint.mode selective "
                    "--activation_checkpoint.selective_ac_option op"},
    };
    for (size_t i = 0; i < 2; i++) {
        job_name(j, sizeof(j), gruns[i][0]);
        snprintf(extra, sizeof(extra), "%s %s", gpu, gruns[i][1]);
        launch_ok(j, extra, out, sizeof(out));
        assert_same_losses(base, j, 2);
        assert_clean(j);
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
    assert_int_equal(launch(a, "--training.local_batch_size 8 --parallelism.pipeline_parallel_microbatches 4", out,
                            sizeof(out)), 0);
    launch_ok(b, "--training.local_batch_size 4 --parallelism.pipeline_parallel_microbatches 2 "
                       "--parallelism.data_parallel_replicate_degree 2", out, sizeof(out));
    assert_clean(b);
    static char la[MAX_STEPS][40], lb[MAX_STEPS][40];
    assert_int_equal(losses(a, la), 12);
    assert_int_equal(losses(b, lb), 12);
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
    snprintf(path, sizeof(path), "%s/data/train.bin", g_dir);
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
    snprintf(path, sizeof(path), "%s/llmc.bin", g_dir);
    FILE *f = fopen(path, "wb");
    fwrite(hdr, sizeof(hdr), 1, f);
    fwrite(u16, sizeof(uint16_t), n, f);
    fclose(f);
    /* window i of the whole file starts at token i*T: part 1 ends one token into window `cut/T` */
    snprintf(path, sizeof(path), "%s/part-1.bin", g_dir);
    assert_int_equal(tokfile_write(path, u, cut + 1, 300, err, sizeof(err)), 0);
    snprintf(path, sizeof(path), "%s/part-2.bin", g_dir);
    assert_int_equal(tokfile_write(path, u + cut, n - cut, 300, err, sizeof(err)), 0);
    free(tok), free(u), free(u16);
    char a[32], b[32], c[32], extra[512];
    job_name(a, sizeof(a), "ctfile");
    job_name(b, sizeof(b), "llmcfile");
    job_name(c, sizeof(c), "globfiles");
    assert_int_equal(launch(a, "--loader.shuffle true --training.steps 40", out, sizeof(out)), 0);
    snprintf(extra, sizeof(extra), "--loader.shuffle true --training.steps 40 --loader.dataset_path %s/llmc.bin", g_dir);
    launch_ok(b, extra, out, sizeof(out));
    snprintf(extra, sizeof(extra), "--loader.shuffle true --training.steps 40 --loader.dataset_path '%s/part-*.bin'",
             g_dir);
    launch_ok(c, extra, out, sizeof(out));
    assert_same_losses(a, b, 40);
    assert_same_losses(a, c, 40);
    /* and shuffling does change the order: a sequential run differs */
    char d[32];
    static char la[MAX_STEPS][40], ld[MAX_STEPS][40];
    job_name(d, sizeof(d), "sequential");
    assert_int_equal(launch(d, "--training.steps 40", out, sizeof(out)), 0);
    losses(a, la);
    losses(d, ld);
    assert_true(strcmp(la[0], ld[0]) != 0); /* other sequences in the first batch */
}

/* The control plane over TCP on loopback, with garbage thrown at the coordinator's socket
 * while it trains: it rejects the garbage and the losses are those of the ipc:// run. */
/* ---- attackers of a running job's control plane (issue 12) ---- */

/* A socket of this test's own on job's control endpoint, with any routing id it likes: an
 * outsider's (no key), or one holding the job's operator key, which the job's owner (this
 * test) can read in the run folder: an insider, of the wrong role for all but swap and status. */
typedef struct {
    void *ctx, *sock;
} atk_t;

/* The first key of a key file (40 Z85 characters) into key; 0, or -1 when there is none. */
static int atk_key(const char *path, char *key)
{
    char buf[1024];
    tu_read_file(path, buf, sizeof(buf));
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
        if (line[0] != '#' && strlen(line) >= 40) {
            memcpy(key, line, 40);
            key[40] = 0;
            return 0;
        }
    return -1;
}

static void atk_close(atk_t *a)
{
    zmq_close(a->sock);
    zmq_ctx_term(a->ctx);
}

/* Returns 0, or -1 when as_operator and the job has no operator key to take. */
static int atk_open(atk_t *a, const char *job, const char *id, int as_operator)
{
    shm_seg_t *seg = NULL;
    char err[256], ep[256];
    if (shm_attach(&seg, job, "job", err, sizeof(err)))
        fail_msg("%s: %s", job, err);
    snprintf(ep, sizeof(ep), "%s", ((job_hdr_t *)shm_data(seg))->endpoint);
    shm_detach(&seg);
    a->ctx = zmq_ctx_new();
    a->sock = zmq_socket(a->ctx, ZMQ_DEALER);
    int linger = 1000;
    zmq_setsockopt(a->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(a->sock, ZMQ_ROUTING_ID, id, strlen(id));
    if (as_operator) {
        char path[300], sec[41], pub[41], srv[41];
        snprintf(path, sizeof(path), "%s/runs/%s/run/operator.key", g_dir, job);
        int rc = atk_key(path, sec);
        snprintf(path, sizeof(path), "%s/runs/%s/run/coordinator.pub", g_dir, job);
        if (rc || atk_key(path, srv) || zmq_curve_public(pub, sec)) {
            atk_close(a);
            return -1;
        }
        zmq_setsockopt(a->sock, ZMQ_CURVE_SERVERKEY, srv, 40);
        zmq_setsockopt(a->sock, ZMQ_CURVE_PUBLICKEY, pub, 40);
        zmq_setsockopt(a->sock, ZMQ_CURVE_SECRETKEY, sec, 40);
    }
    assert_int_equal(zmq_connect(a->sock, ep), 0);
    return 0;
}

static void atk_send(atk_t *a, const msg_t *m)
{
    uint8_t *buf;
    size_t len;
    assert_int_equal(msg_encode(m, &buf, &len), 0);
    zmq_send(a->sock, buf, len, ZMQ_DONTWAIT);
    free(buf);
}

/* A swap_argv message (words, NULL-terminated), packed by hand: the wire format itself. */
static void atk_send_argv(atk_t *a, const char *const *words)
{
    char data[1024];
    size_t n = 0;
    for (; *words; words++) {
        size_t k = strlen(*words) + 1;
        memcpy(data + n, *words, k);
        n += k;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "v", 1);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "swap_argv", 9);
    msgpack_pack_str_with_body(&pk, "data", 4);
    msgpack_pack_bin_with_body(&pk, data, n);
    zmq_send(a->sock, sb.data, sb.size, ZMQ_DONTWAIT);
    msgpack_sbuffer_destroy(&sb);
}

/* Attackers of job: [0] an outsider, [1] the operator's key (absent before issue 12: *n = 1). */
static void atk_both(atk_t *a, int *n, const char *job, const char *id)
{
    atk_open(&a[0], job, id, 0);
    *n = 1 + (atk_open(&a[1], job, id, 1) == 0);
}

static void atk_close_all(atk_t *a, int n)
{
    for (int i = 0; i < n; i++)
        atk_close(&a[i]);
}

/* The step in progress, from the job segment as the coordinator publishes it. */
static int64_t job_step(const char *job)
{
    shm_seg_t *seg = NULL;
    if (shm_attach(&seg, job, "job", NULL, 0))
        return -1;
    int64_t s = atomic_load(&((job_hdr_t *)shm_data(seg))->step);
    shm_detach(&seg);
    return s;
}

/* An attacked job runs until it is stopped, with a constant learning rate after warmup, so
 * that its first N losses are those of a run of N steps whatever N: every attack lands
 * mid-run, however fast the steps, and is compared against a reference of the same length.
 * Its batch makes a step a few ms here, so N stays small. */
#define ATK_ARGS "--training.steps 1000000 --lr_scheduler.decay_ratio 0 --metrics.log_freq 100000 " \
                 "--training.local_batch_size 32"

static pid_t atk_job(const char *job, const char *extra)
{
    char args[512];
    snprintf(args, sizeof(args), "%s %s", ATK_ARGS, extra);
    pid_t pid = launch_bg(job, args);
    assert_int_equal(wait_step(job, 3, 60), 0);
    return pid;
}

/* After the attack: job runs 20 more steps (a hung or failed job does not), is stopped, and
 * its losses so far equal those of a reference run `ref` of as many steps. */
static void atk_finish(pid_t pid, const char *ref, const char *job)
{
    static char out[1 << 16], lr[MAX_STEPS][40], lj[MAX_STEPS][40];
    int64_t s = job_step(job);
    assert_true(s > 0);
    int n = (int)s + 20, rc = -1;
    for (int i = 0; i < 6000 && rc; i++) { /* 60 s: the step in progress, not the metrics file */
        rc = job_step(job) > n ? 0 : -1;
        if (rc)
            sleep_ms(10);
    }
    kill(pid, SIGINT);
    int status = tu_reap(pid, 30, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(status, 130);
    assert_clean(job);
    assert_true(n < MAX_STEPS);
    char extra[512];
    snprintf(extra, sizeof(extra), "%s --training.steps %d", ATK_ARGS, n);
    launch_ok(ref, extra, out, sizeof(out));
    assert_int_equal(losses(ref, lr), n);
    assert_true(losses(job, lj) >= n);
    for (int i = 0; i < n; i++)
        if (strcmp(lr[i], lj[i])) {
            print_error("step %d: %s has loss %s, %s has %s\n", i + 1, ref, lr[i], job, lj[i]);
            fail();
        }
}

static void test_launch_over_tcp_with_garbage_on_the_socket_gives_the_same_losses(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], endpoint[256];
    job_name(a, sizeof(a), "ipc");
    job_name(b, sizeof(b), "tcp");
    assert_int_equal(launch(a, "--training.steps 400", out, sizeof(out)), 0);
    pid_t pid = launch_bg(b, "--training.steps 400 --job.endpoint tcp://127.0.0.1:*");
    assert_int_equal(wait_step(b, 2, 60), 0);
    /* the coordinator records its bound endpoint in the job segment */
    shm_seg_t *seg = NULL;
    char err[256];
    assert_int_equal(shm_attach(&seg, b, "job", err, sizeof(err)), 0);
    snprintf(endpoint, sizeof(endpoint), "%s", ((job_hdr_t *)shm_data(seg))->endpoint);
    shm_detach(&seg);
    assert_memory_equal(endpoint, "tcp://127.0.0.1:", 16);
    /* garbage reaches the decoder only under one of the job's keys (issue 12): the operator's */
    atk_t at;
    assert_int_equal(atk_open(&at, b, "rogue", 1), 0);
    void *sock = at.sock;
    int linger = 5000; /* zmq_ctx_term below waits until the garbage is delivered */
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
    uint64_t seed = 42;
    char junk[512];
    for (int i = 0; i < 300; i++) {
        size_t len = tu_next(&seed) % sizeof(junk);
        for (size_t k = 0; k < len; k++)
            junk[k] = (char)tu_next(&seed);
        if (i % 3 == 0) /* a valid-looking map of an unknown version */
            memcpy(junk, "\x82\xa1v\x07\xa4type\xa4step", len = 14);
        zmq_send(sock, junk, len, ZMQ_DONTWAIT);
    }
    atk_close(&at);
    assert_int_equal(tu_reap(pid, 120, NULL), 0);
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, b);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "rejected a control message"));
    assert_same_losses(a, b, 400);
    assert_clean(b);
}

/* ---- the loader: kill, swap ---- */

static void test_launch_killed_loader_is_restarted_and_losses_match(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], extra[256];
    job_name(a, sizeof(a), "undisturbed");
    job_name(b, sizeof(b), "loaderkill");
    /* a small prefetch keeps the loader busy through the run, so kills land mid-step */
    snprintf(extra, sizeof(extra), "--training.steps 300 --loader.prefetch 1");
    assert_int_equal(launch(a, extra, out, sizeof(out)), 0);
    pid_t pid = launch_bg(b, extra);
    int kills = 0;
    for (int target = 5; target <= 205; target += 100) {
        assert_int_equal(wait_step(b, target, 60), 0);
        pid_t ldr = child_named(pid, "ctitan-loader");
        if (ldr > 0 && kill(ldr, SIGKILL) == 0)
            kills++;
    }
    assert_int_equal(tu_reap(pid, 120, NULL), 0);
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, b);
    tu_read_file(path, out, sizeof(out));
    assert_true(kills >= 2);
    assert_non_null(strstr(out, "restarted"));
    assert_same_losses(a, b, 300);
    assert_clean(b);
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
    assert_int_equal(launch(a, extra, out, sizeof(out)), 0);
    pid_t pid = launch_bg(b, extra);
    assert_int_equal(wait_step(b, 5, 60), 0);
    pid_t ldr = child_named(pid, "ctitan-loader");
    assert_true(ldr > 0);
    kill(ldr, SIGSTOP);
    assert_int_equal(tu_reap(pid, 120, NULL), 0);
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, b);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "killing it to restart it"));
    assert_same_losses(a, b, 200);
    assert_clean(b);
}

static void test_launch_loader_swap_mid_run_gives_the_same_losses(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], extra[256], cmd[1024];
    job_name(a, sizeof(a), "noswap");
    job_name(b, sizeof(b), "swap");
    snprintf(extra, sizeof(extra), "--training.steps 400");
    assert_int_equal(launch(a, extra, out, sizeof(out)), 0);
    pid_t pid = launch_bg(b, extra);
    assert_int_equal(wait_step(b, 3, 60), 0);
    pid_t before = child_named(pid, "ctitan-loader");
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
    pid_t after = child_named(pid, "ctitan-loader");
    assert_true(after > 0 && after != before);
    assert_int_equal(tu_reap(pid, 120, NULL), 0);
    assert_same_losses(a, b, 400);
    assert_clean(b);
}

static void test_launch_failed_swap_keeps_the_old_loader_and_the_losses(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], extra[256], cmd[1024];
    job_name(a, sizeof(a), "noswap2");
    job_name(b, sizeof(b), "badswap");
    snprintf(extra, sizeof(extra), "--training.steps 400");
    assert_int_equal(launch(a, extra, out, sizeof(out)), 0);
    pid_t pid = launch_bg(b, extra);
    assert_int_equal(wait_step(b, 3, 60), 0);
    char ldr[256];
    snprintf(cmd, sizeof(cmd),
             "%s loader swap --job %s --cmd '%s --text /nonexistent.txt "
             "--tokenizer %s/data/tokenizer.bin' 2>&1", tu_ctitan(), b,
             tu_program("ctitan-loader-text", ldr, sizeof(ldr)), g_dir);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "/nonexistent.txt"));
    assert_non_null(strstr(out, "previous loader continues"));
    assert_int_equal(tu_reap(pid, 120, NULL), 0);
    assert_same_losses(a, b, 400);
    assert_clean(b);
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
             "--chunk-bytes 4096", tu_program("ctitan-loader-text", ldr, sizeof(ldr)), g_dir, g_dir);
    /* the manifest's command runs through sh -c: pass it with --loader.command=... as one argument */
    snprintf(cmd, sizeof(cmd), "%s launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
             "--metrics.file %s/%s.jsonl --metrics.peak_tflops 1 --training.steps 300 '--loader.command=%s' 2>&1",
             tu_ctitan(), a, g_dir, a, g_dir, a, tl);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    /* b starts with the same text loader and swaps it for a fresh one mid-run */
    char line[4096];
    snprintf(line, sizeof(line), "%s launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
             "--metrics.file %s/%s.jsonl --metrics.peak_tflops 1 --training.steps 300 '--loader.command=%s' "
             "> %s/%s.out 2>&1 & echo $!", tu_ctitan(), b, g_dir, b, g_dir, b, tl, g_dir, b);
    assert_int_equal(tu_run(line, out, sizeof(out)), 0);
    pid_t pid = atoi(out);
    assert_int_equal(wait_step(b, 3, 60), 0);
    snprintf(cmd, sizeof(cmd), "%s loader swap --job %s --cmd '%s' 2>&1", tu_ctitan(), b, tl);
    rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    for (int i = 0; i < 12000 && kill(pid, 0) == 0; i++) /* not our child: poll until it exits */
        sleep_ms(10);
    assert_same_losses(a, b, 300);
    assert_clean(b);
}

/* ---- shutdown and failures ---- */

static void test_launch_ctrl_c_stops_every_process_and_removes_segments(void **state)
{
    TU_NEED_BIN();
    char j[32];
    job_name(j, sizeof(j), "sigint");
    pid_t pid = launch_bg(j, "--training.steps 100000");
    assert_int_equal(wait_step(j, 2, 60), 0);
    assert_true(job_procs(j) >= 5); /* loader, 2 stages, 2 shards */
    assert_true(job_segments(j) >= 4);
    /* a second launch of the same job is refused and leaves the running one alone: its
     * segments, and the control socket `ctitan status` reaches it through */
    static char out[1 << 16];
    char args[1024], cmd[2048];
    base_args(args, sizeof(args), j);
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
    assert_clean(j);
}

static void test_launch_killed_stage_fails_the_job_naming_it(void **state)
{
    TU_NEED_BIN();
    char j[32], path[256];
    static char out[1 << 16];
    job_name(j, sizeof(j), "stagekill");
    pid_t pid = launch_bg(j, "--training.steps 100000 --job.max_restarts 0"); /* test_restart: with restarts */
    assert_int_equal(wait_step(j, 2, 60), 0);
    pid_t st = child_named(pid, "ctitan-stage");
    assert_true(st > 0);
    kill(st, SIGKILL);
    assert_int_equal(tu_reap(pid, 30, NULL), 1);
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, j);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "failed: stage rank"));
    assert_non_null(strstr(out, "killed by signal 9"));
    assert_clean(j);
}

static void test_launch_stopped_stage_is_noticed_by_heartbeat(void **state)
{
    TU_NEED_BIN();
    char j[32], path[256];
    static char out[1 << 16];
    job_name(j, sizeof(j), "stagestop");
    pid_t pid = launch_bg(j, "--training.steps 100000 --job.heartbeat_interval_ms 50 --job.heartbeat_timeout_ms 1000 "
                          "--job.max_restarts 0");
    assert_int_equal(wait_step(j, 2, 60), 0);
    pid_t st = child_named(pid, "ctitan-stage");
    assert_true(st > 0);
    kill(st, SIGSTOP);
    int rc = tu_reap(pid, 30, NULL); /* noticed within the timeout plus clean-up, well under 30 s */
    kill(st, SIGKILL);
    assert_int_equal(rc, 1);
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, j);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "no heartbeat"));
    assert_non_null(strstr(out, "stage rank"));
    assert_clean(j);
}

static void test_launch_loader_error_fails_the_job_with_its_reason(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), "ldrerr");
    char extra[512], ldr[256];
    snprintf(extra, sizeof(extra), "'--loader.command=%s --text %s/corpus.txt "
             "--tokenizer %s/nonexistent.bin'", tu_program("ctitan-loader-text", ldr, sizeof(ldr)), g_dir, g_dir);
    int rc = launch(j, extra, out, sizeof(out));
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "failed: loader: "));
    assert_non_null(strstr(out, "nonexistent.bin"));
    assert_clean(j);
}

static void test_launch_rejects_bad_manifests_with_file_and_line(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char path[256], cmd[1024];
    snprintf(path, sizeof(path), "%s/bad.toml", g_dir);
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
             "--loader.dataset_path %s/missing.bin 2>&1", tu_ctitan(), j, g_dir, j, g_dir);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "missing.bin"));
    assert_clean(j);
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
    pid_t pid = launch_bg(j, "--training.steps 100000");
    assert_int_equal(wait_step(j, 2, 60), 0);
    pid_t coord = tu_descendant_named(pid, "ctitan-coord");
    assert_true(coord > 0);
    kill(coord, SIGSTOP);
    kill(pid, SIGKILL);
    assert_int_equal(tu_reap(pid, 10, NULL), 128 + SIGKILL);
    kill(coord, SIGKILL);
    for (int i = 0; i < 500 && job_procs(j) > 0; i++)
        sleep_ms(10);
    assert_int_equal(job_procs(j), 0);
    assert_true(job_segments(j) >= 4);
    launch_ok(j, "", out, sizeof(out));
    assert_non_null(strstr(out, "stale"));
    assert_clean(j);
    /* a live owner (this test process) is respected */
    shm_seg_t *s = NULL;
    assert_int_equal(shm_create(&s, j, "job", 4096, err, sizeof(err)), 0);
    job_hdr_t *h = shm_data(s);
    h->magic = JOB_MAGIC;
    h->owner_pid = getpid();
    h->owner_start = job_proc_start(getpid());
    shm_detach(&s);
    assert_int_equal(launch(j, "", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "already running"));
    assert_int_equal(job_segments(j), 1);
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
    pid_t pid = launch_bg(j, "--training.steps 100000 --job.heartbeat_interval_ms 50 --job.heartbeat_timeout_ms 1000 "
                          "--job.max_restarts 0");
    assert_int_equal(wait_step(j, 2, 60), 0);
    assert_true(job_procs(j) >= 5);
    pid_t coord = child_named(pid, "ctitan-coord");
    assert_true(coord > 0);
    kill(coord, SIGSTOP);
    int left = 1;
    for (int i = 0; i < 1000 && (left = job_procs(j)) > 0; i++) /* well under 10 s */
        sleep_ms(10);
    kill(coord, SIGCONT);
    assert_int_equal(left, 0);
    assert_int_equal(tu_reap(pid, 30, NULL), 1);
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, j);
    tu_read_file(path, out, sizeof(out));
    char *why = strstr(out, "failed: ");
    if (!why || !strstr(why, "the coordinator itself was not running for") || !strstr(why, "gave up on it"))
        fail_msg("%s", why ? why : out);
    assert_clean(j);
}


/* ---- issue 12: attacks on a running job's control plane (helpers above) ---- */

/* `swap` ran its command through `sh -c` for any peer: here an outsider over TCP, and the
 * operator's key with a shell command and with an argv whose first word holds a ';'. No
 * shell runs (no file appears), the operator's bad swap is refused, training is untouched. */
static void test_launch_swap_runs_no_shell_and_heeds_only_the_operator(void **state)
{
    TU_NEED_BIN();
    char a[32], b[32], mark[300], shell[512];
    job_name(a, sizeof(a), "rceref");
    job_name(b, sizeof(b), "rce");
    pid_t pid = atk_job(b, "--job.endpoint tcp://127.0.0.1:*");
    snprintf(mark, sizeof(mark), "%s/%s.pwned", g_dir, b);
    snprintf(shell, sizeof(shell), "touch %s; exec build/bin/ctitan-loader", mark);
    msg_t swap = {.type = MSG_SWAP, .text = shell, .text_len = strlen(shell)};
    atk_t at[2];
    int n;
    atk_both(at, &n, b, "cli.1.0");
    for (int i = 0; i < n; i++)
        atk_send(&at[i], &swap);
    atk_send_argv(&at[0], (const char *const[]){"sh", "-c", shell, NULL});
    if (n == 2)
        atk_send_argv(&at[1], (const char *const[]){"build/bin/ctitan-loader;", "touch", mark, NULL});
    sleep_ms(1000); /* a swap happens at the next step boundary */
    atk_close_all(at, n);
    if (n == 2) { /* `ctitan status` is the operator's: heard with the key, not when others can read it */
        static char out[1 << 16];
        char cmd[1024], key[300];
        snprintf(cmd, sizeof(cmd), "%s status --job %s 2>&1", tu_ctitan(), b);
        snprintf(key, sizeof(key), "%s/runs/%s/run/operator.key", g_dir, b);
        assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
        assert_int_equal(chmod(key, 0644), 0);
        assert_int_equal(tu_run(cmd, out, sizeof(out)), 1);
        assert_non_null(strstr(out, "others can read"));
        assert_int_equal(chmod(key, 0600), 0);
    }
    atk_finish(pid, a, b);
    assert_int_equal(access(mark, F_OK), -1); /* no shell ran */
}

/* A forged step_done from an outsider named "stage.1.0/x" (the suffix used to be taken as the
 * role) or the operator's key, for the step in progress, with a loss of its own: rejected, so
 * no round ends early and the losses stay bitwise. */
static void test_launch_forged_step_done_does_not_end_a_round(void **state)
{
    TU_NEED_BIN();
    char a[32], b[32];
    job_name(a, sizeof(a), "sdref");
    job_name(b, sizeof(b), "sdforge");
    pid_t pid = atk_job(b, "");
    atk_t at[2];
    int n;
    atk_both(at, &n, b, "stage.1.0/x");
    for (int k = 0; k < 100; k++) {
        int64_t s = job_step(b);
        for (int i = 0; i < n && s >= 0; i++)
            for (int64_t t = s; t <= s + 1; t++) {
                msg_t d = {.type = MSG_STEP_DONE, .step = t, .loss = 123.0};
                atk_send(&at[i], &d);
            }
        sleep_ms(10);
    }
    atk_close_all(at, n);
    atk_finish(pid, a, b);
}

/* A forged error naming a real stage's pid ended the job with the attacker's text. */
static void test_launch_forged_error_does_not_end_the_job(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], path[300];
    job_name(a, sizeof(a), "erref");
    job_name(b, sizeof(b), "erforge");
    pid_t pid = atk_job(b, "");
    pid_t st = child_named(pid, "ctitan-stage");
    assert_true(st > 0);
    const char *ids[] = {"stage.0.0/x", "stage.1.0/x"};
    for (int r = 0; r < 2; r++) {
        atk_t at[2];
        int n;
        atk_both(at, &n, b, ids[r]);
        msg_t e = {.type = MSG_ERROR, .rank = r, .pid = st, .text = "pwned", .text_len = 5};
        snprintf(e.role, sizeof(e.role), "stage");
        for (int i = 0; i < n; i++)
            atk_send(&at[i], &e);
        sleep_ms(200);
        atk_close_all(at, n);
    }
    atk_finish(pid, a, b);
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, b);
    tu_read_file(path, out, sizeof(out));
    assert_null(strstr(out, "pwned"));
}

/* The pid of launch's stage process of pipeline rank `rank` (its command line says), or 0. */
static pid_t child_stage(pid_t parent, int rank) { return tu_stage_pid(parent, rank); }

/* Forged heartbeats, each with its stage's own pid, from "stage.R.0/x" and the operator's key:
 * the stopped stage is still noticed within the heartbeat timeout. */
static void test_launch_forged_heartbeats_do_not_keep_a_stopped_stage_alive(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], path[300];
    job_name(j, sizeof(j), "hbforge");
    pid_t pid = launch_bg(j, "--training.steps 100000 --job.heartbeat_interval_ms 50 --job.heartbeat_timeout_ms 1000 "
                          "--job.max_restarts 0");
    assert_int_equal(wait_step(j, 2, 60), 0);
    pid_t st[2] = {child_stage(pid, 0), child_stage(pid, 1)};
    assert_true(st[0] > 0 && st[1] > 0);
    atk_t at[2][2];
    int n[2];
    atk_both(at[0], &n[0], j, "stage.0.0/x");
    atk_both(at[1], &n[1], j, "stage.1.0/x");
    kill(st[0], SIGSTOP);
    int status = 0, ended = 0;
    uint64_t k = 0; /* forgeries until the job ends (within the heartbeat timeout, 1 s), or 60 s */
    for (double until = util_now() + 60; !ended && util_now() < until; k++) {
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < n[r]; i++) {
                msg_t hb = {.type = MSG_HEARTBEAT, .rank = r, .pid = st[r], .progress = k};
                snprintf(hb.role, sizeof(hb.role), "stage");
                atk_send(&at[r][i], &hb);
            }
        sleep_ms(20);
        ended = waitpid(pid, &status, WNOHANG) == pid;
    }
    for (int r = 0; r < 2; r++)
        atk_close_all(at[r], n[r]);
    if (!ended)
        status = tu_reap(pid, 30, NULL) << 8;
    kill(st[0], SIGKILL);
    assert_true(ended);
    assert_int_equal(WEXITSTATUS(status), 1);
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, j);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "no heartbeat"));
    assert_non_null(strstr(out, "stage rank 0"));
    assert_clean(j);
}

/* A DEALER claiming the route "stage.0.0" (outsider, then operator key) took over the stage's
 * route and hung the job: the job goes on as if it were not there. */
static void test_launch_a_claimed_route_is_not_taken_over(void **state)
{
    TU_NEED_BIN();
    char a[32], b[32];
    job_name(a, sizeof(a), "rtref");
    job_name(b, sizeof(b), "rtclaim");
    pid_t pid = atk_job(b, "");
    atk_t at[2];
    int n;
    atk_both(at, &n, b, "stage.0.0");
    msg_t hb = {.type = MSG_HEARTBEAT};
    snprintf(hb.role, sizeof(hb.role), "stage");
    for (int i = 0; i < n; i++)
        atk_send(&at[i], &hb);
    sleep_ms(300);
    atk_finish(pid, a, b); /* with the claimants still connected */
    atk_close_all(at, n);
}

/* A forged saved for the checkpoint in flight made the coordinator snapshot into the staging
 * segment while checkpointd still wrote from it: a torn checkpoint that verified. With
 * forgeries throughout the run, every checkpoint resumes bitwise. */
static void test_launch_forged_saved_does_not_tear_a_checkpoint(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], r[32], dir[256], extra[512];
    job_name(a, sizeof(a), "svref");
    job_name(b, sizeof(b), "svforge");
    job_name(r, sizeof(r), "svres");
    assert_int_equal(launch(a, "", out, sizeof(out)), 0);
    setenv("CTITAN_TEST_CKPT_DELAY_MS", "200", 1); /* each checkpoint takes 0.6 s: the forger has time */
    pid_t pid = launch_bg(b, "--checkpoint.enable true --checkpoint.interval 2 --checkpoint.keep_latest_k 0");
    unsetenv("CTITAN_TEST_CKPT_DELAY_MS");
    assert_int_equal(wait_step(b, 1, 60), 0);
    atk_t at[2];
    int n, status = 0, ended = 0;
    atk_both(at, &n, b, "checkpointd.0.0/x");
    /* forging until the job ends, however slow the machine (a count of rounds ran out first
     * on a loaded one: the job took longer than 3000 rounds of 5 ms) */
    for (double until = util_now() + 180; !ended && util_now() < until;) {
        for (int i = 0; i < n; i++)
            for (int s = 2; s <= 12; s += 2) {
                msg_t sv = {.type = MSG_SAVED, .step = s, .ok = 1, .text = "forged", .text_len = 6};
                atk_send(&at[i], &sv);
            }
        sleep_ms(5);
        ended = waitpid(pid, &status, WNOHANG) == pid;
    }
    atk_close_all(at, n);
    if (!ended)
        status = tu_reap(pid, 60, NULL) << 8;
    assert_true(ended);
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_same_losses(a, b, 12);
    ckpt_dir(dir, sizeof(dir), b);
    for (int from = 2; from <= 6; from += 4) { /* the early ones had the most time to tear */
        snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-%08d", dir, from);
        launch_ok(r, extra, out, sizeof(out));
        assert_resumed_losses(a, r, from, 12);
    }
    assert_clean(b);
}

/* 2,400 garbage messages under the operator's key and 2,400 from an outsider, and 40
 * connections that fail their handshake: a bounded number of log lines (it was one per
 * message), every rejection counted in the summary, and training untouched. */
static void test_launch_a_flood_of_bad_messages_is_logged_at_a_bounded_rate(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 20];
    char a[32], b[32], path[300];
    job_name(a, sizeof(a), "flref");
    job_name(b, sizeof(b), "flood");
    pid_t pid = atk_job(b, "");
    atk_t at[2];
    int n;
    atk_both(at, &n, b, "flood");
    uint64_t seed = 7;
    char junk[256];
    for (int k = 0; k < 2400; k++)
        for (int i = 0; i < n; i++) {
            size_t len = 1 + tu_next(&seed) % sizeof(junk);
            for (size_t q = 0; q < len; q++)
                junk[q] = (char)tu_next(&seed);
            while (zmq_send(at[i].sock, junk, len, ZMQ_DONTWAIT) < 0 && i == 1)
                sleep_ms(1); /* the operator's socket is full: wait, every message must go */
        }
    for (int k = 0; k < 40; k++) {
        atk_t o;
        atk_open(&o, b, "flood-connect", 0);
        zmq_send(o.sock, "x", 1, ZMQ_DONTWAIT);
        sleep_ms(5);
        int zero = 0; /* its message never goes: do not wait for it */
        zmq_setsockopt(o.sock, ZMQ_LINGER, &zero, sizeof(zero));
        atk_close(&o);
    }
    sleep_ms(500);
    int zero = 0; /* the outsider's queue never drains */
    zmq_setsockopt(at[0].sock, ZMQ_LINGER, &zero, sizeof(zero));
    atk_close_all(at, n);
    atk_finish(pid, a, b);
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, b);
    tu_read_file(path, out, sizeof(out));
    int lines = 0;
    for (char *p = out; (p = strstr(p, "rejected a control message")); p++)
        lines++;
    for (char *p = out; (p = strstr(p, "refused a connection")); p++)
        lines++;
    if (lines > 40)
        fail_msg("%d log lines for the flood", lines);
    unsigned long long rejected = 0;
    char *sum = strstr(out, "the control plane rejected ");
    assert_non_null(sum);
    assert_int_equal(sscanf(sum, "the control plane rejected %llu", &rejected), 1);
    assert_true(rejected >= 2400);
}

/* The operator's key on a client that asks for the status 20,000 times and never reads a
 * reply: the replies that cannot go are logged at the flood's bounded rate, then summed up. */
static void test_launch_an_operator_that_never_reads_is_logged_at_a_bounded_rate(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 20];
    char a[32], b[32], path[300];
    job_name(a, sizeof(a), "deafref");
    job_name(b, sizeof(b), "deaf");
    pid_t pid = atk_job(b, "");
    atk_t o;
    assert_int_equal(atk_open(&o, b, "deaf", 1), 0);
    int one = 1;
    zmq_setsockopt(o.sock, ZMQ_RCVHWM, &one, sizeof(one));
    msg_t st = {.type = MSG_STATUS};
    for (int k = 0; k < 20000; k++) {
        atk_send(&o, &st);
        if (k % 1000 == 999)
            sleep_ms(20);
    }
    sleep_ms(500);
    int zero = 0;
    zmq_setsockopt(o.sock, ZMQ_LINGER, &zero, sizeof(zero));
    atk_close(&o);
    atk_finish(pid, a, b);
    snprintf(path, sizeof(path), "%s/%s.out", g_dir, b);
    tu_read_file(path, out, sizeof(out));
    int lines = 0;
    for (char *p = out; (p = strstr(p, "cannot answer the operator")); p++)
        lines++;
    if (lines == 0 || lines > 40)
        fail_msg("%d log lines for the replies that could not go", lines);
}

/* ---- insiders: a worker's own key, of the wrong role or at the wrong time ---- */

/* Run as a worker the coordinator started, through a wrapper script in a copy of build/bin
 * (CTITAN_TEST_EVIL lists the messages, argv[1..] is the real program): sends each message
 * with the worker's own key, on a socket of its own, before the real program starts with the
 * same keys. No cmocka here: the exit status is the real program's. */
static int evil_main(char **argv)
{
    worker_keys_t k;
    ctl_t *c = NULL;
    char err[256];
    if (worker_keys_take(&k, "evil", err, sizeof(err)) ||
        ctl_client_new(&c, getenv(WORKER_ENV_ENDPOINT), "evil", k.server, &k.me, err, sizeof(err))) {
        fprintf(stderr, "evil: %s\n", err);
        return 1;
    }
    char list[256];
    snprintf(list, sizeof(list), "%s", getenv("CTITAN_TEST_EVIL"));
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
        msg_t m = {.pid = getpid(), .step = 0, .ok = 1, .text = "evil", .text_len = 4};
        snprintf(m.role, sizeof(m.role), "evil");
        for (int i = 1; i < MSG_TYPE_END; i++)
            if (!strcmp(msg_type_name((msg_type_t)i), t))
                m.type = (msg_type_t)i;
        msg_set_data(&m, "build/bin/ctitan-loader", 24);
        ctl_send(c, NULL, &m);
        free(m.data);
    }
    sleep_ms(300);
    ctl_destroy(&c); /* its linger delivers them */
    int fd = worker_keys_pipe(&k);
    char num[16];
    snprintf(num, sizeof(num), "%d", fd);
    fcntl(fd, F_SETFD, 0);
    setenv(WORKER_ENV_KEYS, num, 1);
    unsetenv("CTITAN_TEST_EVIL");
    execv(argv[1], argv + 1);
    fprintf(stderr, "evil: cannot run %s: %s\n", argv[1], strerror(errno));
    return 127;
}

/* A copy of build/bin whose checkpointd, loader and stage first send, with their own keys,
 * what their role may not send or what nobody expects yet (issue 12's table): a checkpointd's
 * saved for a checkpoint not being written, its loaded with no load asked for, a step_done;
 * a loader's swap_argv, status, step_done and a ready before its hello; a stage's step_done
 * before any step. Each is rejected with one line naming the sender's key and why; the job,
 * its checkpoints and its losses are those of a run without them. */
static void test_launch_workers_keys_are_bound_to_their_role_and_to_what_is_expected(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], bin[300], real[400], cmd[4096], args[2048], self[400];
    job_name(a, sizeof(a), "inref");
    job_name(b, sizeof(b), "insider");
    char resolved[PATH_MAX];
    assert_non_null(realpath(tu_ctitan(), resolved));
    assert_true(strlen(resolved) < sizeof(real));
    snprintf(real, sizeof(real), "%.399s", resolved);
    *strrchr(real, '/') = 0;
    ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1); /* this program: the wrappers run it */
    assert_true(k > 0);
    self[k] = 0;
    snprintf(bin, sizeof(bin), "%s/evilbin-%s", g_dir, b);
    static const struct {
        const char *prog, *evil;
    } w[] = {{"checkpointd", "saved,loaded,step_done"},
             {"ctitan-loader", "swap_argv,status,step_done,ready"},
             {"ctitan-stage", "step_done"},
             {"ctitan-optshard", NULL},
             {"ctitan-loader-text", NULL}};
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && cp %s/ctitan %s/", bin, real, bin);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        char path[400];
        snprintf(path, sizeof(path), "%s/%s", bin, w[i].prog);
        if (!w[i].evil) {
            snprintf(cmd, sizeof(cmd), "%s/%s", real, w[i].prog);
            assert_int_equal(symlink(cmd, path), 0);
            continue;
        }
        FILE *f = fopen(path, "w");
        fprintf(f, "#!/bin/sh\nCTITAN_TEST_EVIL=%s exec %s %s/%s \"$@\"\n", w[i].evil, self, real, w[i].prog);
        fclose(f);
        chmod(path, 0755);
    }
    const char *extra = "--checkpoint.enable true --checkpoint.interval 4";
    launch_ok(a, extra, out, sizeof(out));
    base_args(args, sizeof(args), b);
    snprintf(cmd, sizeof(cmd), "%s/ctitan %s %s 2>&1", bin, args, extra);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    static const char *const want[] = {
        "saved from checkpointd.0.0@", "no checkpoint of that step is being written",
        "loaded from checkpointd.0.0@", "no checkpoint is being loaded",
        "step_done from checkpointd.0.0@", "a checkpointd does not send it",
        "swap_argv from loader.0.0@", "status from loader.0.0@", "step_done from loader.0.0@",
        "a loader does not send it", "ready from loader.0.0@", "ready before hello",
        "step_done from stage.0.0@", "step_done from stage.1.0@", "no round is waiting for it from this process",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (!strstr(out, want[i]))
            fail_msg("no \"%s\" in:\n%s", want[i], out);
    char *first = strstr(out, "saved from checkpointd");
    assert_null(strstr(first + 1, "saved from checkpointd")); /* logged once */
    assert_same_losses(a, b, 12);
    char dir[256];
    ckpt_dir(dir, sizeof(dir), b);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 3);
    free(steps);
    assert_clean(b);
}

int main(int argc, char **argv)
{
    if (getenv("CTITAN_TEST_EVIL") && argc > 1) /* a wrapper of the insider test */
        return evil_main(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch_losses_bitwise_equal_for_pipeline_degree_1_2_4),
        cmocka_unit_test(test_launch_losses_bitwise_equal_for_1_and_3_optimizer_shards),
        cmocka_unit_test(test_launch_losses_bitwise_equal_for_gpipe_and_1f1b),
        cmocka_unit_test(test_launch_activation_checkpointing_keeps_the_losses_under_each_schedule),
        cmocka_unit_test(test_launch_data_parallel_2_matches_1_with_the_same_global_batch),
        cmocka_unit_test(test_launch_llmc_files_and_globs_train_like_one_ctitan_file),
        cmocka_unit_test(test_launch_over_tcp_with_garbage_on_the_socket_gives_the_same_losses),
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
        cmocka_unit_test(test_launch_resume_is_bitwise_in_any_topology),
        cmocka_unit_test(test_launch_latest_falls_back_past_a_corrupt_checkpoint),
        cmocka_unit_test(test_launch_keeps_the_latest_k_checkpoints),
        cmocka_unit_test(test_launch_checkpoint_due_while_one_is_written_waits_and_says_so),
        cmocka_unit_test(test_launch_checkpointd_killed_mid_write_is_restarted_and_rewrites_it),
        cmocka_unit_test(test_launch_streams_checkpoints_to_a_remote_checkpointd),
        cmocka_unit_test(test_launch_rejects_bad_checkpoint_keys),
        cmocka_unit_test(test_launch_missing_checkpoint_is_named_once_with_the_reason),
        cmocka_unit_test(test_launch_load_without_enable_only_loads),
        cmocka_unit_test(test_launch_two_hosts_resume_a_one_host_checkpoint),
        cmocka_unit_test(test_launch_cuda_device_trains_or_fails_cleanly),
        cmocka_unit_test(test_launch_cuda_path_on_the_emulated_backend),
        cmocka_unit_test(test_launch_emulated_gpu_catches_a_missing_event_wait),
        cmocka_unit_test(test_launch_cuda_offload_and_gpu_shards_agree_on_the_emulated_backend),
        cmocka_unit_test(test_launch_cuda_gpu_shards_resume_bitwise_on_the_emulated_backend),
        cmocka_unit_test(test_launch_cuda_nccl_data_plane_on_the_emulated_backend),
        cmocka_unit_test(test_launch_two_hosts_train_like_one_on_the_emulated_backend),
        cmocka_unit_test(test_launch_swap_runs_no_shell_and_heeds_only_the_operator),
        cmocka_unit_test(test_launch_forged_step_done_does_not_end_a_round),
        cmocka_unit_test(test_launch_forged_error_does_not_end_the_job),
        cmocka_unit_test(test_launch_forged_heartbeats_do_not_keep_a_stopped_stage_alive),
        cmocka_unit_test(test_launch_a_claimed_route_is_not_taken_over),
        cmocka_unit_test(test_launch_forged_saved_does_not_tear_a_checkpoint),
        cmocka_unit_test(test_launch_a_flood_of_bad_messages_is_logged_at_a_bounded_rate),
        cmocka_unit_test(test_launch_an_operator_that_never_reads_is_logged_at_a_bounded_rate),
        cmocka_unit_test(test_launch_workers_keys_are_bound_to_their_role_and_to_what_is_expected),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
