/* What the test programs that run whole jobs share (the test_launch* programs, test_restart,
 * test_recover, test_hosts, test_fsdp and more): one temp folder per program holding data/ (`ctitan prep` of a generated
 * corpus), runs/, and each job's metrics (JOB.jsonl) and output (JOB.out); jobs of
 * manifests/tiny.toml started in the foreground or the background; waiting on a job's metrics
 * and reading them (steps, losses, restart records); the processes a job left; a run's sample
 * against `ctitan generate`.
 * Header-only (static functions, one copy per program) like testutil.h; include cmocka first. */
#ifndef CTITAN_TESTJOB_H
#define CTITAN_TESTJOB_H

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ipc/shm.h"
#include "stages/data/tokenizer.h"
#include "stages/data/tokfile.h"
#include "tests/testutil.h"

static char tj_dir[64]; /* the program's temp folder ("" when the programs are not built) */
/* Arguments every job of the program starts with, before each run's own (which win): e.g. the
 * launch tests' "--training.steps 12". */
static const char *tj_base = "";

/* cmocka group set-up: the temp folder /tmp/ctitan-TAG-XXXXXX and its data/. Without a built
 * ctitan it does nothing and each test skips (TU_NEED_BIN). */
static inline int tj_setup(const char *tag)
{
    if (access(tu_ctitan(), X_OK))
        return 0;
    snprintf(tj_dir, sizeof(tj_dir), "/tmp/ctitan-%s-XXXXXX", tag);
    if (!mkdtemp(tj_dir))
        return -1;
    char path[256], cmd[1024], out[8192];
    snprintf(path, sizeof(path), "%s/corpus.txt", tj_dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    for (int i = 0; i < 20000; i++)
        fprintf(f, "w%d%s", (i * 7) % 61, i % 9 == 8 ? ".\n" : " ");
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s prep --vocab 300 --out %s/data %s 2>&1", tu_ctitan(), tj_dir, path);
    return tu_run(cmd, out, sizeof(out)) == 0 ? 0 : -1;
}

static inline int tj_teardown(void)
{
    if (tj_dir[0])
        tu_rmtree(tj_dir);
    return 0;
}

/* A job name of this program's run: TAG, the pid, then what. */
static inline void tj_name(char *buf, size_t n, char tag, const char *what)
{
    snprintf(buf, n, "%c%d%s", tag, (int)getpid(), what);
}

/* The arguments of a run of job `job` (the tiny manifest, its own dump folder and metrics
 * file), then `extra`. */
static inline void tj_args(char *buf, size_t n, const char *job, const char *extra)
{
    snprintf(buf, n,
             "launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
             "--loader.dataset_path %s/data/train.bin --metrics.file %s/%s.jsonl --metrics.peak_tflops 1 %s %s",
             job, tj_dir, job, tj_dir, tj_dir, job, tj_base, extra);
}

/* Runs `ctitan launch` to its end under `timeout timeout_s` (prefix: e.g. variables or a
 * ulimit, or ""); returns its exit status, its output in out. */
static inline int tj_launch(const char *prefix, int timeout_s, const char *job, const char *extra, char *out,
                            size_t outlen)
{
    char args[4096], cmd[8192];
    tj_args(args, sizeof(args), job, extra);
    snprintf(cmd, sizeof(cmd), "%s timeout %d %s %s 2>&1", prefix, timeout_s, tu_ctitan(), args);
    return tu_run(cmd, out, outlen);
}

/* tj_launch with no prefix and a bound no test job comes near (10 minutes). */
static inline int tj_run(const char *job, const char *extra, char *out, size_t outlen)
{
    return tj_launch("", 600, job, extra, out, outlen);
}

/* tj_run that must succeed; fails with the job's output when it does not. */
static inline void tj_run_ok(const char *job, const char *extra, char *out, size_t outlen)
{
    int rc = tj_run(job, extra, out, outlen);
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
}

/* Starts `ctitan launch` in the background with its output in DIR/OUT.out (two "hosts" of one
 * job each have their own); returns its pid. */
static inline pid_t tj_launch_bg_to(const char *job, const char *out_name, const char *extra)
{
    char args[4096], line[8192], *argv[128], out[256];
    tj_args(args, sizeof(args), job, extra);
    snprintf(line, sizeof(line), "%s %s", tu_ctitan(), args);
    int argc = 0;
    for (char *t = strtok(line, " "); t && argc < 127; t = strtok(NULL, " "))
        argv[argc++] = t;
    argv[argc] = NULL;
    snprintf(out, sizeof(out), "%s/%s.out", tj_dir, out_name);
    fflush(NULL);
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

/* Starts `ctitan launch` in the background with its output in DIR/JOB.out; returns its pid. */
static inline pid_t tj_launch_bg(const char *job, const char *extra) { return tj_launch_bg_to(job, job, extra); }

/* DIR/once-JOB, a new folder for CTITAN_TEST_DIE_ONCE (each test point then hits only the first
 * process that reaches it, so its replacement goes on): its path in buf, returned. */
static inline const char *tj_once_dir(char *buf, size_t n, const char *job)
{
    snprintf(buf, n, "%s/once-%s", tj_dir, job);
    assert_int_equal(mkdir(buf, 0700), 0);
    return buf;
}

/* Job's output (of tj_launch_bg) and metrics file. */
static inline void tj_read_out(const char *job, char *buf, size_t n)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, job);
    tu_read_file(path, buf, n);
}

static inline void tj_read_metrics(const char *job, char *buf, size_t n)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.jsonl", tj_dir, job);
    tu_read_file(path, buf, n);
}

static inline void tj_sleep_ms(int ms) { nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL); }

/* Waits until job's metrics file has reached `step`; 0 or -1 after timeout_s. */
static inline int tj_wait_step(const char *job, int step, int timeout_s)
{
    static char buf[1 << 20];
    char need[64];
    snprintf(need, sizeof(need), "{\"step\": %d,", step);
    for (int i = 0; i < timeout_s * 100; i++) {
        tj_read_metrics(job, buf, sizeof(buf));
        if (strstr(buf, need))
            return 0;
        tj_sleep_ms(10);
    }
    return -1;
}

/* The newest step job's metrics file records (its last 4 KiB read), or 0 when none yet. */
static inline int tj_last_step(const char *job)
{
    char path[256], buf[4097];
    snprintf(path, sizeof(path), "%s/%s.jsonl", tj_dir, job);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > 4096 ? size - 4096 : 0, SEEK_SET);
    size_t n = fread(buf, 1, 4096, f);
    fclose(f);
    buf[n] = 0;
    int last = 0;
    for (const char *p = buf; (p = strstr(p, "{\"step\": ")) != NULL; p++)
        last = atoi(p + 9);
    return last;
}

/* A two-host job of `base` (as test_hosts runs them: two "hosts" on this machine, host 1's
 * `ctitan launch` placed as under srun, its segments named -h1): its name (tj_name with tag and
 * what), the hosts' keys (as an operator makes them), a free loopback port; the arguments of
 * both hosts in extra. */
typedef struct {
    char j[32], jh1[40], extra[2048];
} tj_hosts_t;

static inline void tj_two_hosts(tj_hosts_t *h, char tag, const char *what, const char *base)
{
    char keys[128], cmd[1024], out[4096];
    tj_name(h->j, sizeof(h->j), tag, what);
    snprintf(h->jh1, sizeof(h->jh1), "%s-h1", h->j);
    snprintf(keys, sizeof(keys), "%s/keys-%s", tj_dir, h->j);
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && %s ckpt keygen %s/host0 && %s ckpt keygen %s/host1 2>&1", keys,
             tu_ctitan(), keys, tu_ctitan(), keys);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    int port = tu_free_port();
    assert_true(port > 0);
    snprintf(h->extra, sizeof(h->extra),
             "--metrics.log_freq 100000 %s --job.hosts 2 --job.endpoint tcp://127.0.0.1:%d --job.keys %s", base,
             port, keys);
}

/* Host 1's launch of the job in the background (with SLURM_NODEID 1), its output in
 * DIR/<job>-h1.out. */
static inline pid_t tj_start_host1(const tj_hosts_t *h, const char *more)
{
    char extra[2200];
    if ((size_t)snprintf(extra, sizeof(extra), "%s %s", h->extra, more) >= sizeof(extra))
        fail_msg("host 1's arguments are too long: %s %s", h->extra, more);
    setenv("SLURM_STEP_NUM_NODES", "2", 1);
    setenv("SLURM_NODEID", "1", 1);
    pid_t pid = tj_launch_bg_to(h->j, h->jh1, extra);
    unsetenv("SLURM_STEP_NUM_NODES");
    unsetenv("SLURM_NODEID");
    assert_true(pid > 0);
    return pid;
}

/* Both hosts of h run to their end (host 1 in the background); host 0's status, host 1's in
 * *host1_rc, their outputs in out and agent_out. */
static inline int tj_run_both(const tj_hosts_t *h, char *out, size_t n, char *agent_out, size_t an, int *host1_rc)
{
    pid_t agent = tj_start_host1(h, "");
    int rc = tj_launch("", 120, h->j, h->extra, out, n);
    *host1_rc = tu_reap(agent, 60, NULL);
    tj_read_out(h->jh1, agent_out, an);
    return rc;
}

/* The checkpoint folder of a job run by tj_args. */
static inline void tj_ckpt_dir(char *buf, size_t n, const char *job)
{
    snprintf(buf, n, "%s/runs/%s/checkpoint", tj_dir, job);
}

/* A run's sample (in its output `out`) is `ctitan generate`'s on its checkpoint
 * ckpt/step-LAST, with the same prompt (the first 8 tokens of data/PROMPT_FILE), the program's
 * tokenizer (data/tokenizer.bin), at most 12 tokens and `args` (its temperature and seed, its
 * device): the header (`how`: ", greedy", ", on the GPU"), the decoded prompt, then generate's
 * text. */
static inline void tj_assert_sample_is_generates(const char *out, const char *ckpt, int last,
                                                 const char *prompt_file, const char *how, const char *args)
{
    char path[256], ids[256], err[256], cmd[2048];
    static char gen[8192], want[16384];
    snprintf(path, sizeof(path), "%s/data/%s", tj_dir, prompt_file);
    tokfile_t *tf = NULL;
    assert_int_equal(tokfile_open(&tf, path, 300, err, sizeof(err)), 0);
    uint32_t prompt[8];
    int at = 0;
    for (int i = 0; i < 8; i++)
        at += snprintf(ids + at, sizeof(ids) - at, "%s%u", i ? " " : "", prompt[i] = tokfile_get(tf, i));
    tokfile_close(&tf);
    snprintf(cmd, sizeof(cmd), "%s generate %s/step-%08d --tokenizer %s/data/tokenizer.bin --prompt-ids '%s' "
             "--max-tokens 12 %s 2>/dev/null", tu_ctitan(), ckpt, last, tj_dir, ids, args);
    assert_int_equal(tu_run(cmd, gen, sizeof(gen)), 0);
    snprintf(path, sizeof(path), "%s/data/tokenizer.bin", tj_dir);
    tok_t *tok = NULL;
    uint8_t *text;
    size_t nb;
    assert_int_equal(tok_load(&tok, path, err, sizeof(err)), 0);
    assert_int_equal(tok_decode(tok, prompt, 8, &text, &nb), 0);
    tok_destroy(&tok);
    snprintf(want, sizeof(want), "--- sample (prompt: the first 8 validation tokens%s) ---\n%.*s%s---\n", how,
             (int)nb, (const char *)text, gen); /* generate ends its text with a newline */
    free(text);
    if (!strstr(out, want))
        fail_msg("the run's sample is not generate's:\n%s\nwanted:\n%s", out, want);
}

#define TJ_MAX_STEPS 4096
#define TJ_MAX_RESTARTS 16

/* The "loss" strings of steps [first, first + n) of job's metrics file, consecutive from the
 * last record of step `first` on (a resumed run appends, starting at its first step after the
 * checkpoint); returns how many were found. */
static inline int tj_losses_from(const char *job, int first, char (*loss)[40])
{
    char path[256], line[4096];
    snprintf(path, sizeof(path), "%s/%s.jsonl", tj_dir, job);
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
        if (on && step == first + n && n < TJ_MAX_STEPS)
            sscanf(p + 8, "%39[^,]", loss[n++]);
        else
            on = 0;
    }
    fclose(f);
    return n;
}

/* The "loss" strings of each step in job's metrics file; returns the number of steps. */
static inline int tj_losses(const char *job, char (*loss)[40]) { return tj_losses_from(job, 1, loss); }

/* Two jobs' losses are bitwise the same over `steps` steps. */
static inline void tj_assert_same_losses(const char *a, const char *b, int steps)
{
    static char la[TJ_MAX_STEPS][40], lb[TJ_MAX_STEPS][40];
    assert_int_equal(tj_losses(a, la), steps);
    assert_int_equal(tj_losses(b, lb), steps);
    for (int i = 0; i < steps; i++)
        if (strcmp(la[i], lb[i]))
            fail_msg("step %d: %s has loss %s, %s has %s", i + 1, a, la[i], b, lb[i]);
}

/* Job b resumed after step `from`: its losses equal job a's from step from + 1 to `last`. */
static inline void tj_assert_resumed_losses(const char *a, const char *b, int from, int last)
{
    static char la[TJ_MAX_STEPS][40], lb[TJ_MAX_STEPS][40];
    assert_int_equal(tj_losses(a, la), last);
    assert_int_equal(tj_losses_from(b, from + 1, lb), last - from);
    for (int s = from + 1; s <= last; s++)
        if (strcmp(la[s - 1], lb[s - from - 1]))
            fail_msg("step %d: %s has loss %s, %s (resumed after step %d) has %s", s, a, la[s - 1], b, from,
                     lb[s - from - 1]);
}

/* A job's metrics file: every step line in order, and the restart records among them. */
typedef struct {
    int n;                                 /* steps */
    int step[TJ_MAX_STEPS];
    char loss[TJ_MAX_STEPS][40];           /* as written (%.17g) */
    int restarts;                          /* restart records */
    int restart_at[TJ_MAX_RESTARTS];       /* each one's position among the steps (steps before it) */
    char restart[TJ_MAX_RESTARTS][1024];   /* and its line */
} tj_metrics_t;

static inline void tj_parse_metrics(const char *job, tj_metrics_t *mt)
{
    char path[256], line[4096];
    snprintf(path, sizeof(path), "%s/%s.jsonl", tj_dir, job);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    memset(mt, 0, sizeof(*mt));
    while (fgets(line, sizeof(line), f)) {
        char *p = strstr(line, "\"loss\": ");
        if (!strncmp(line, "{\"restart\": ", 12) && mt->restarts < TJ_MAX_RESTARTS) {
            mt->restart_at[mt->restarts] = mt->n;
            snprintf(mt->restart[mt->restarts++], sizeof(mt->restart[0]), "%.1000s", line);
        } else if (p && mt->n < TJ_MAX_STEPS && sscanf(line, "{\"step\": %d", &mt->step[mt->n]) == 1) {
            sscanf(p + 8, "%39[^,]", mt->loss[mt->n++]);
        }
    }
    fclose(f);
}

/* Processes whose environment names the job (workers carry CTITAN_JOB). */
static inline int tj_job_procs(const char *job)
{
    char want[128], path[300], env[16384];
    int wl = snprintf(want, sizeof(want), "CTITAN_JOB=%s", job) + 1, n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while ((e = readdir(d))) {
        snprintf(path, sizeof(path), "/proc/%s/environ", e->d_name);
        int fd = e->d_name[0] >= '1' && e->d_name[0] <= '9' ? open(path, O_RDONLY) : -1;
        if (fd < 0)
            continue;
        ssize_t k = read(fd, env, sizeof(env));
        close(fd);
        for (ssize_t i = 0; i + wl <= k; i += (ssize_t)strlen(env + i) + 1)
            n += !memcmp(env + i, want, (size_t)wl);
    }
    closedir(d);
    return n;
}

/* Fails with the job's whole output (cmocka's print_error and fail_msg cut at 1 KiB). */
#define TJ_FAIL_WITH(out, ...) do { fputs(out, stderr); fputc('\n', stderr); fail_msg(__VA_ARGS__); } while (0)

/* The run of `extra` by run() (0: it succeeded), made once per argument string in this program
 * and shared between its tests: its job name (tj_name with `tag`, "refN"). */
static inline const char *tj_reference(char tag, const char *extra,
                                       int (*run)(const char *job, const char *extra, char *out, size_t outlen))
{
    static char refs[24][2048], names[24][32];
    static char out[1 << 16];
    for (int i = 0; i < 24; i++) {
        if (!strcmp(refs[i], extra) && names[i][0])
            return names[i];
        if (!names[i][0]) {
            char what[16];
            snprintf(what, sizeof(what), "ref%d", i);
            tj_name(names[i], sizeof(names[i]), tag, what);
            snprintf(refs[i], sizeof(refs[i]), "%s", extra);
            int rc = run(names[i], extra, out, sizeof(out));
            if (rc)
                fail_msg("the reference run of %s: status %d:\n%s", extra, rc, out);
            return names[i];
        }
    }
    fail_msg("too many references");
    return NULL;
}

/* How often `needle` occurs in s. */
static inline int tj_count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* The job's shared memory segments. */
static inline int tj_job_segments(const char *job)
{
    char names[64][SHM_NAME_MAX];
    return shm_list(job, names, 64);
}

/* Nothing of the job is left: no process, no segment. */
static inline void tj_assert_clean(const char *job)
{
    assert_int_equal(tj_job_procs(job), 0);
    assert_int_equal(tj_job_segments(job), 0);
}

/* What a job killed outright leaves, which its next launch would clear: its segments and the
 * lock file of its name (taken, then removed: ipc/shm.h). */
static inline void tj_remove_leftovers(const char *job)
{
    shm_remove_all(job);
    int fd = shm_job_lock(job, NULL, 0);
    if (fd >= 0)
        shm_job_unlock(job, fd);
}

/* CTITAN_CUDA_PLUGIN at the emulator for the jobs of this test (0), or 1 when it is not built
 * (the test skips). */
static inline int tj_use_sim_plugin(void)
{
    char so[512];
    snprintf(so, sizeof(so), "%s", tu_ctitan());
    *strrchr(so, '/') = 0;
    strcat(so, "/../lib/libctitan_cuda_sim.so");
    if (access(so, R_OK)) {
        print_message("%s not built: skipping\n", so);
        return 1;
    }
    setenv("CTITAN_CUDA_PLUGIN", so, 1);
    return 0;
}

/* In a test: CTITAN_CUDA_PLUGIN at the emulator, or skip when it is not built. */
#define TJ_NEED_SIM_PLUGIN()          \
    do {                              \
        if (tj_use_sim_plugin())      \
            skip();                   \
    } while (0)

/* A job that went back (a rewind, a relaunch) reports the steps it ran again twice: every step
 * record of job has the loss of the undisturbed ref at that step, each of steps 1..steps is
 * there, the last is `steps`, and there are `restarts` restart records, each containing
 * `scope`. Returns the records (static). */
static inline const tj_metrics_t *tj_assert_losses_by_step(const char *job, const char *ref, int steps, int restarts,
                                                           const char *scope)
{
    static tj_metrics_t a, b;
    tj_parse_metrics(ref, &a);
    tj_parse_metrics(job, &b);
    assert_int_equal(a.n, steps);
    int seen[TJ_MAX_STEPS] = {0};
    for (int i = 0; i < b.n; i++) {
        int s = b.step[i];
        assert_true(s >= 1 && s <= steps);
        if (strcmp(a.loss[s - 1], b.loss[i]))
            fail_msg("step %d: %s has loss %s, the undisturbed %s %s", s, job, b.loss[i], ref, a.loss[s - 1]);
        seen[s - 1] = 1;
    }
    for (int s = 1; s <= steps; s++)
        if (!seen[s - 1])
            fail_msg("%s never reported step %d", job, s);
    assert_int_equal(b.step[b.n - 1], steps);
    if (b.restarts != restarts)
        fail_msg("%s: %d restart records, expected %d", job, b.restarts, restarts);
    for (int i = 0; i < b.restarts; i++)
        if (!strstr(b.restart[i], scope))
            fail_msg("%s: restart record %d is not %s: %s", job, i, scope, b.restart[i]);
    return &b;
}

#endif
