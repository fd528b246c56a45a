/* What the coordinator tells the user (see coord_report.h): the data check, the launch banner,
 * one progress line and one metrics record per step (and its scalars as TensorBoard events,
 * stages/report/tb.h), and at the end the validation loss and a sample from the final weights
 * (stages/report/evaluate.h holds the math). */
#include "stages/coord/coord_report.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/util.h"
#include "kernels/cpu/pool.h"
#include "kernels/cuda_plugin.h"
#include "stages/coord/coord_trace.h"
#include "stages/data/tokenizer.h"
#include "stages/data/tokfile.h"
#include "stages/job/ldr_seg.h"
#include "stages/report/evaluate.h"
#include "stages/report/peak_cache.h"
#include "stages/report/tb.h"
#include "stages/runtime/ldr.h"

struct coord_report {
    FILE *metrics;                    /* metrics.file, or NULL */
    tb_t *tb;                         /* metrics.enable_tensorboard: the event file */
    double peak_gflops;               /* what MFU divides by */
    double entropy;                   /* of the first training file (NaN with a custom loader) */
    char first_file[PATH_MAX];        /* the first file loader.dataset_path matches */
};

int coord_report_init(coord_t *c)
{
    if (!(c->rep = calloc(1, sizeof(*c->rep))))
        return -ENOMEM;
    c->rep->entropy = NAN;
    return 0;
}

FILE *coord_report_metrics(coord_t *c) { return c->rep->metrics; }

/* Checks the data before any process starts, so a wrong path is one clear error: the
 * dataset pattern must match, and its first file must be a valid token file (the loader
 * checks the others as it opens them). */
int coord_check_data(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    tokfile_t *tf = NULL;
    char why[PATH_MAX + 256];
    int rc = 0;
    c->rep->entropy = NAN;
    if (!m->command[0]) {
        glob_t g;
        if (glob(m->dataset_path, GLOB_ERR, NULL, &g)) {
            globfree(&g);
            return util_fail(err, errlen, -ENOENT, "loader.dataset_path %s: no such file", m->dataset_path);
        }
        snprintf(c->rep->first_file, sizeof(c->rep->first_file), "%s", g.gl_pathv[0]);
        rc = tokfile_open(&tf, c->rep->first_file, m->model.vocab_size, why, sizeof(why));
        if (!rc)
            c->rep->entropy = eval_unigram_entropy(tf, (size_t)1 << 24);
        tokfile_close(&tf);
        globfree(&g);
        if (rc)
            return util_fail(err, errlen, rc, "loader.dataset_path: %s", why);
    }
    if (m->val_enable) {
        if ((rc = tokfile_open(&tf, m->val_dataset_path, m->model.vocab_size, why, sizeof(why))))
            return util_fail(err, errlen, rc, "validation.dataset_path: %s", why);
        tokfile_close(&tf);
    }
    if (m->sample_tokens > 0 && m->tokenizer_path[0]) {
        tok_t *tok = NULL;
        if ((rc = tok_load(&tok, m->tokenizer_path, why, sizeof(why))))
            return util_fail(err, errlen, rc, "model.tokenizer_path: %s", why);
        if (tok_vocab_size(tok) > m->model.vocab_size)
            rc = util_fail(err, errlen, -EINVAL, "model.tokenizer_path %s has %d tokens but model.vocab_size is %d",
                           m->tokenizer_path,
                           tok_vocab_size(tok), m->model.vocab_size);
        tok_destroy(&tok);
    }
    return rc;
}

int coord_report_open(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    /* a supervisor's relaunch and a resume from a checkpoint append: the file keeps the earlier
     * run's steps (and the restart record), later records of a step replacing earlier ones; a
     * run from step 0 starts it anew. "e": no worker inherits the descriptor */
    const char *mode = (c->sup && c->sup->append_metrics) || c->step > 0 ? "ae" : "we";
    if (m->metrics_file[0] && !(c->rep->metrics = fopen(m->metrics_file, mode)))
        return util_fail(err, errlen, -errno, "metrics.file %s: cannot open: %s", m->metrics_file, strerror(errno));
    if (m->tb_enable) { /* a new file each run, whose steps TensorBoard shows over earlier files' */
        char dir[PATH_MAX], why[PATH_MAX + 256];
        manifest_tb_folder(m, dir, sizeof(dir));
        int rc = tb_open(&c->rep->tb, dir, c->step + 1, why, sizeof(why));
        if (rc)
            return util_fail(err, errlen, rc, "metrics.save_tb_folder: %s", why);
    }
    return 0;
}

void coord_report_close(coord_t *c)
{
    if (!c->rep)
        return;
    if (c->rep->metrics)
        fclose(c->rep->metrics);
    tb_close(&c->rep->tb);
    free(c->rep);
    c->rep = NULL;
}

/* The GPU's bf16 peak in GFLOP/s from `ctitan bench --gpu-peak` in a child process (the
 * coordinator never loads CUDA; the stages have not started, so the GPU is idle), 0 when it
 * cannot (its reason is on stderr). */
static double gpu_peak_measure(void *arg)
{
    const coord_t *c = arg;
    char exe[PATH_MAX + 16], out[128] = "";
    snprintf(exe, sizeof(exe), "%s/ctitan", c->bin_dir);
    char *argv[] = {exe, "bench", "--gpu-peak", NULL};
    int fd[2];
    if (pipe2(fd, O_CLOEXEC))
        return 0;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    pid_t pid;
    extern char **environ;
    int rc = posix_spawn(&pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    size_t len = 0;
    ssize_t r;
    while (!rc && len + 1 < sizeof(out) && (r = read(fd[0], out + len, sizeof(out) - 1 - len)) != 0)
        if (r > 0)
            len += (size_t)r;
        else if (errno != EINTR)
            break;
    close(fd[0]);
    int status = 0;
    while (!rc && waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    out[len] = 0;
    char *end;
    double tflops = strtod(out, &end);
    return !rc && WIFEXITED(status) && WEXITSTATUS(status) == 0 && end != out && tflops > 0 ? tflops * 1e3 : 0;
}

void coord_banner(coord_t *c)
{
    const manifest_t *m = c->m;
    int n = 0; /* a checkpointd that only loaded has stopped */
    for (int i = 0; i < c->np; i++)
        n += !c->p[i].expect_exit;
    peak_cache_t peak;
    char from[PATH_MAX + 512];
    if (!strcmp(m->device, "cuda"))
        c->rep->peak_gflops = peak_cache_get_gpu(m->peak_tflops * 1e3, gpu_peak_measure, c, &peak);
    else
        c->rep->peak_gflops = peak_cache_get(m->peak_tflops * 1e3, (int)sysconf(_SC_NPROCESSORS_ONLN), NULL, &peak);
    if (peak.warning[0] && peak.from != PEAK_NONE) /* PEAK_NONE's reason is in the MFU line */
        fprintf(stderr, "launch: warning: %s\n", peak.warning);
    peak_cache_describe(&peak, from, sizeof(from));
    char chunks[48] = "";
    if (c->lay.vs > 1)
        snprintf(chunks, sizeof(chunks), ", %d virtual stages per rank", c->lay.vs);
    char shape[MANIFEST_PATH_MAX + 64];
    if (m->ckpt_initial_hf) /* the shape is its config.json's, not the flavor's */
        snprintf(shape, sizeof(shape), "the Llama of %s/config.json", m->ckpt_initial_path);
    else
        snprintf(shape, sizeof(shape), "%s %s", m->model_name, m->flavor);
    char sharded[96] = "";
    if (m->dp_shard > 1 && m->dp_replicate > 1)
        snprintf(sharded, sizeof(sharded), " (%d groups of %d sharing their weights: HSDP)", m->dp_replicate,
                 m->dp_shard);
    else if (m->dp_shard > 1)
        snprintf(sharded, sizeof(sharded), " (weights and gradients sharded: FSDP)");
    printf("launch: job %s: %s, %.2fM parameters; pipeline %d (%s%s, %d microbatches of %dx%d), data parallel %d%s, "
           "%d optimizer shards; %d processes\n",
           m->name, shape, c->lay.total / 1e6, m->pp, sched_kind_name(m->schedule), chunks,
           m->microbatches, c->lay.mb, m->seq_len, m->dp, sharded, m->shards, n);
    if (peak.from == PEAK_NONE)
        printf("launch: %s\n", from);
    else
        printf("launch: MFU against %.0f GFLOP/s, %s\n", c->rep->peak_gflops, from);
    if (m->warmup_asked)
        printf("launch: note: lr_scheduler.warmup_steps = %d is more than training.steps = %d: the warmup is cut "
               "to %d steps, the whole run\n", m->warmup_asked, m->steps, m->steps);
    if (c->rep->tb) {
        char dir[PATH_MAX];
        manifest_tb_folder(m, dir, sizeof(dir));
        printf("launch: TensorBoard events in %s (tensorboard --logdir %s)\n", tb_path(c->rep->tb), dir);
    }
    if (!isnan(c->rep->entropy))
        printf("launch: data %s, unigram entropy %.4f nats/token (first file)\n", m->dataset_path, c->rep->entropy);
    fflush(stdout);
}

/* `"key": value` after a comma; a value that is not finite is null (JSON has no NaN or
 * infinity) and is named, with what it was, in `nf` for the record's "not_finite" field. */
static void put_num(FILE *f, const char *key, const char *fmt, double v, char *nf, size_t nflen)
{
    fprintf(f, ", \"%s\": ", key);
    if (isfinite(v)) {
        fprintf(f, fmt, v);
        return;
    }
    fputs("null", f);
    size_t n = strlen(nf);
    snprintf(nf + n, nflen - n, "%s\"%s\": \"%s\"", n ? ", " : "", key, isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
}

/* Whether the loader's cursor after step c->step holds a sample count (the built-in loader's
 * does, a custom loader's may not), and the count in *sample. */
static int loader_sample(coord_t *c, uint64_t *sample)
{
    uint8_t cur[LDR_CURSOR_MAX];
    size_t clen;
    return ldr_seg_cursor(shm_data(c->seg_batch), c->step + 1, cur, &clen) == 0 &&
           ldr_cursor_get(cur, clen, "sample", sample) == 0;
}

/* The pipeline's idle share of step c->step, measured and ideal: each stage's time outside its
 * actions over its step (stage_t's run, waits included), the mean over the stages; and the
 * schedule simulated with replica 0's measured action times (sched_bubble: 1 - busy /
 * (ranks x makespan)), which t[rank] receives. */
static void bubbles(coord_t *c, double (*t)[3], double *measured, double *ideal)
{
    const manifest_t *m = c->m;
    int per = c->lay.vs * m->microbatches; /* each of F, B, W per rank and step */
    double sum = 0;
    for (int i = 1; i <= c->n_stages; i++) {
        const msg_t *r = &c->p[i].reply;
        double span = r->t_busy + r->t_wait, busy = per * (r->t_f + r->t_b + r->t_w);
        sum += span > 0 ? 1 - busy / span : 0;
    }
    *measured = sum / c->n_stages;
    for (int s = 0; s < m->pp; s++) {
        const msg_t *r = &coord_stage(c, s, 0)->reply;
        t[s][SCHED_F] = r->t_f, t[s][SCHED_B] = r->t_b, t[s][SCHED_W] = r->t_w;
    }
    *ideal = sched_bubble(&c->sched, (const double (*)[3])t, 0);
}

/* One JSON line of step c->step in the metrics file. */
static void write_metrics(coord_t *c, double loss, double norm, double lr, double tps, double mfu, double t_step,
                          double ctl, double t_opt, uint64_t mem, double bubble, double bubble_ideal)
{
    const manifest_t *m = c->m;
    uint64_t sample = 0;
    int have = loader_sample(c, &sample);
    char nf[256] = "";
    FILE *f = c->rep->metrics;
    fprintf(f, "{\"step\": %d", (int)c->step + 1);
    put_num(f, "loss", "%.17g", loss, nf, sizeof(nf));
    put_num(f, "grad_norm", "%.17g", norm, nf, sizeof(nf));
    put_num(f, "lr", "%.17g", lr, nf, sizeof(nf));
    put_num(f, "tokens_per_s", "%.1f", tps, nf, sizeof(nf));
    put_num(f, "mfu", "%.5f", mfu, nf, sizeof(nf));
    put_num(f, "step_time_ms", "%.3f", t_step * 1e3, nf, sizeof(nf));
    put_num(f, "ctl_overhead_ms", "%.3f", ctl * 1e3, nf, sizeof(nf));
    put_num(f, "optimizer_ms", "%.3f", t_opt * 1e3, nf, sizeof(nf));
    put_num(f, "bubble", "%.5f", bubble, nf, sizeof(nf));
    put_num(f, "bubble_ideal", "%.5f", bubble_ideal, nf, sizeof(nf));
    fprintf(f, ", \"mem_peak_bytes\": %llu", (unsigned long long)mem);
    if (have)
        fprintf(f, ", \"loader_sample\": %llu", (unsigned long long)sample);
    if (nf[0])
        fprintf(f, ", \"not_finite\": {%s}", nf);
    fprintf(f, ", \"stage_ms\": [");
    for (int s = 0; s < m->pp; s++) {
        const msg_t *r = &coord_stage(c, s, 0)->reply;
        fprintf(f, "%s[%.4f, %.4f, %.4f]", s ? ", " : "", r->t_f * 1e3, r->t_b * 1e3, r->t_w * 1e3);
    }
    fprintf(f, "]}\n");
    fflush(f);
}

/* The events written since the last flush go to the file; a file that cannot be written is
 * said once and given up (the run goes on, as with a full disk under the metrics file). */
static void flush_events(coord_t *c)
{
    char err[PATH_MAX + 256];
    if (tb_flush(c->rep->tb, err, sizeof(err))) {
        fprintf(stderr, "launch: warning: %s: no more TensorBoard events in this run\n", err);
        tb_close(&c->rep->tb);
    }
}

/* The numbers of step c->step's metrics record as TensorBoard scalars, tagged with the
 * record's names, except memory in GiB (as the progress line) and each stage's F/B/W times as
 * stage_ms/S/f, /b, /w (one chart group); a value that is not finite is written as it is
 * (TensorBoard shows NaN and infinity). Flushed: one write per step. */
static void write_events(coord_t *c, double loss, double norm, double lr, double tps, double mfu, double t_step,
                         double ctl, double t_opt, uint64_t mem, double bubble, double bubble_ideal)
{
    const manifest_t *m = c->m;
    int64_t step = c->step + 1;
    double now = tb_now();
    const struct { const char *tag; double v; } s[] = {
        {"loss", loss}, {"grad_norm", norm}, {"lr", lr}, {"tokens_per_s", tps}, {"mfu", mfu},
        {"step_time_ms", t_step * 1e3}, {"ctl_overhead_ms", ctl * 1e3}, {"optimizer_ms", t_opt * 1e3},
        {"bubble", bubble}, {"bubble_ideal", bubble_ideal}, {"mem_peak_gib", mem / 1073741824.0},
    };
    for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
        tb_scalar(c->rep->tb, s[i].tag, step, s[i].v, now); /* a failure is tb_flush's too */
    uint64_t sample;
    if (loader_sample(c, &sample))
        tb_scalar(c->rep->tb, "loader_sample", step, (double)sample, now);
    for (int r = 0; r < m->pp; r++) {
        const msg_t *rep = &coord_stage(c, r, 0)->reply;
        const double t[3] = {rep->t_f, rep->t_b, rep->t_w};
        for (int k = 0; k < 3; k++) {
            char tag[64];
            snprintf(tag, sizeof(tag), "stage_ms/%d/%c", r, "fbw"[k]);
            tb_scalar(c->rep->tb, tag, step, t[k] * 1e3, now);
        }
    }
    flush_events(c);
}

void coord_report_step(coord_t *c, double norm, double t_step, double t_reduce, double t_update)
{
    const manifest_t *m = c->m;
    double loss = 0, t_stages = 0;
    uint64_t mem = 0; /* the largest stage's (on a GPU: the device's use, every process on it) */
    /* replica order, a fixed sum: in each replica one rank holds the last virtual stage (the
     * last rank, or rank 0 of a V placement) and the others report 0, which adds nothing */
    for (int r = 0; r < m->dp; r++)
        for (int s = 0; s < m->pp; s++)
            loss += coord_stage(c, s, r)->reply.loss;
    for (int i = 1; i <= c->n_stages; i++) {
        double t = c->p[i].reply.t_busy + c->p[i].reply.t_wait;
        t_stages = t > t_stages ? t : t_stages;
        mem = c->p[i].reply.mem > mem ? c->p[i].reply.mem : mem;
    }
    double tokens = (double)m->dp * m->local_batch_size * m->seq_len;
    loss /= tokens;
    double lr = coord_shard(c, 0)->reply.lr, tps = tokens / t_step;
    double peak = c->rep->peak_gflops; /* 0: none known (a GPU job without one): no MFU */
    double mfu = peak > 0 ? config_flops_per_token(&m->model, m->seq_len) * tps / (peak * 1e9) : 0;
    int step = (int)c->step + 1;
    if (step % m->log_freq == 0 || step == m->steps || step == 1) {
        char mfu_s[16] = "   n/a";
        if (peak > 0)
            snprintf(mfu_s, sizeof(mfu_s), "%5.2f%%", 100 * mfu);
        printf("step %5d  loss %7.4f  grad_norm %7.3f  lr %.2e  tokens/s %7.0f  mfu %s  %6.0f ms  mem %.2f GiB\n",
               step, loss, norm, lr, tps, mfu_s, t_step * 1e3, mem / 1073741824.0);
        fflush(stdout);
    }
    double ctl = t_step - t_stages - t_reduce - t_update, bubble, bubble_ideal, t[MANIFEST_MAX_PP][3];
    bubbles(c, t, &bubble, &bubble_ideal);
    if (c->rep->metrics)
        write_metrics(c, loss, norm, lr, tps, mfu, t_step, ctl, t_reduce + t_update, mem, bubble, bubble_ideal);
    if (c->rep->tb)
        write_events(c, loss, norm, lr, tps, mfu, t_step, ctl, t_reduce + t_update, mem, bubble, bubble_ideal);
    coord_trace_step(c, (const double (*)[3])t);
}

/* The validation loss's record in the metrics file, after the last step's: the loss in full
 * (the printed line has 4 decimals), the batches and tokens it is the mean over. */
static void write_validation(coord_t *c, double loss, int batches)
{
    const manifest_t *m = c->m;
    char nf[64] = "";
    FILE *f = c->rep->metrics;
    fprintf(f, "{\"step\": %d", m->steps);
    put_num(f, "val_loss", "%.17g", loss, nf, sizeof(nf));
    fprintf(f, ", \"val_batches\": %d, \"val_tokens\": %lld", batches,
            (long long)batches * m->local_batch_size * m->seq_len);
    if (nf[0])
        fprintf(f, ", \"not_finite\": {%s}", nf);
    fprintf(f, "}\n");
    fflush(f);
}

/* A GPU job's end of run on its first GPU (its stages are gone, their memory with them): the
 * loaded CUDA plugin with device 0 selected, or NULL with why. */
static const cuda_plugin_t *end_gpu(const manifest_t *m, char *why, size_t n)
{
    if (strcmp(m->device, "cuda"))
        return NULL;
    const cuda_plugin_t *gpu = cuda_plugin_load(why, n);
    if (gpu && gpu->backend.dev_select(0, NULL)) {
        snprintf(why, n, "%s", gpu->last_error());
        gpu = NULL;
    }
    return gpu;
}

/* The sample's prompt comes from held-out text, else from the training data. A GPU job's runs
 * on its GPU, else (or when that fails) on the CPU. */
static void sample(coord_t *c, const float *w, pool_t *pool, tokfile_t *val)
{
    const manifest_t *m = c->m;
    tok_t *tok = NULL;
    tokfile_t *src = val;
    char err[512] = "";
    int rc = -ENOENT;
    if (!src && c->rep->first_file[0])
        tokfile_open(&src, c->rep->first_file, m->model.vocab_size, err, sizeof(err));
    if (src && !(rc = tok_load(&tok, m->tokenizer_path, err, sizeof(err)))) {
        const cuda_plugin_t *gpu = end_gpu(m, err, sizeof(err));
        if (!gpu && !strcmp(m->device, "cuda"))
            fprintf(stderr, "ctitan: note: the sample on the GPU did not run (%s): on the CPU instead\n", err);
        rc = eval_sample(&m->model, w, pool, gpu, tok, src, m->sample_tokens, m->sample_temperature, m->seed, stdout,
                         err, sizeof(err));
        if (rc && gpu) {
            fprintf(stderr, "ctitan: note: the sample on the GPU failed (%s): on the CPU instead\n", err);
            rc = eval_sample(&m->model, w, pool, NULL, tok, src, m->sample_tokens, m->sample_temperature, m->seed,
                             stdout, err, sizeof(err));
        }
    }
    if (rc)
        fprintf(stderr, "ctitan: no sample: %s\n", err[0] ? err : "no token file to take a prompt from");
    tok_destroy(&tok);
    if (src != val)
        tokfile_close(&src);
}


/* A GPU job's validation on its first GPU; NaN with a note on stderr when that cannot be done
 * (the CPU's then). */
static double validate_on_gpu(const manifest_t *m, float *w, const tokfile_t *val, int *used, const eval_say_t *say)
{
    char why[512];
    const cuda_plugin_t *gpu = end_gpu(m, why, sizeof(why));
    double vl = gpu ? eval_loss_on(&gpu->backend, &m->model, w, val, m->local_batch_size, m->seq_len, m->val_steps,
                                   used, say, why, sizeof(why))
                    : NAN;
    if (isnan(vl))
        fprintf(stderr, "ctitan: note: the validation on the GPU did not run (%s): on the CPU instead\n", why);
    return vl;
}

void coord_end_of_run(coord_t *c, int64_t first, double secs)
{
    const manifest_t *m = c->m;
    /* replica 0's fp32 weights; with offload in bf16 the params segment holds them rounded, and
     * the CPU shards' masters are read instead (the bank of the last step: the same bits the
     * fp32 params segment would hold) */
    float *w = c->lay.host_bf16 ? job_optstate_array(shm_data(c->seg_opt), m->steps % 2, 0) : shm_data(c->seg_params);
    pool_t *pool = pool_new((int)sysconf(_SC_NPROCESSORS_ONLN));
    tokfile_t *val = NULL;
    char err[512];
    if (first > 0)
        printf("done: steps %lld to %d in %.1f s", (long long)first + 1, m->steps, secs);
    else
        printf("done: %d steps in %.1f s", m->steps, secs);
    if (m->val_enable && tokfile_open(&val, m->val_dataset_path, m->model.vocab_size, err, sizeof(err)) == 0) {
        int used = 0;
        /* says how far it is on stderr (util_say_s), while the "done:" line waits for its loss */
        eval_say_t say = {"ctitan", util_say_s()};
        double vl = strcmp(m->device, "cuda") ? NAN : validate_on_gpu(m, w, val, &used, &say);
        const char *where = isnan(vl) ? "" : " on the GPU";
        if (isnan(vl))
            vl = eval_loss(&m->model, w, pool, val, m->local_batch_size, m->seq_len, m->val_steps, &used, &say);
        printf("; validation loss %.4f over %d batches%s", vl, used, where);
        if (c->rep->metrics)
            write_validation(c, vl, used);
        if (c->rep->tb) { /* at the last step, as in the metrics file */
            tb_scalar(c->rep->tb, "val_loss", m->steps, vl, tb_now());
            flush_events(c);
        }
    }
    if (!isnan(c->rep->entropy))
        printf("; training data unigram entropy %.4f", c->rep->entropy);
    printf("\n");
    if (m->sample_tokens > 0 && m->tokenizer_path[0])
        sample(c, w, pool, val);
    tokfile_close(&val);
    pool_destroy(&pool);
    fflush(stdout);
}
