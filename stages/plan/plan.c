/* The memory plan (see plan.h): one row per process of this host and one for the shared
 * segments, each column from the code that allocates it, then the check against what the
 * host and its GPUs have. */
#include "stages/plan/plan.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/util.h"
#include "kernels/act_bytes.h"
#include "kernels/cpu/model.h"
#include "kernels/params.h"
#include "stages/data/tokfile.h"
#include "stages/job/devdir.h"
#include "stages/job/job.h"
#include "stages/job/ldr_seg.h"
#include "stages/job/staging.h"
#include "stages/report/evaluate.h"
#include "stages/runtime/plane.h"

/* kernels/cuda/model.cu and matmul.cu: the elements past each stage's buffers
 * (CUDA_MODEL_SLACK) and cuBLASLt's workspace per model (WORKSPACE_BYTES); plan.c does not
 * include the CUDA headers, so the CPU build has them here, and a change there must come here. */
#define CUDA_SLACK 4096
#define CUDA_WORKSPACE (32.0 * PLAN_MIB)
/* checkpointd/uring.c: the registered write buffers (UW_NBUF x UW_BUF + UW_HUGE) */
#define CKPTD_BUFFERS (8.0 * 4 * PLAN_MIB)
/* stages/report/evaluate.c: the coordinator's unigram entropy reads this many tokens */
#define ENTROPY_TOKENS ((double)(1u << 24))

static const char *kind_name[PLAN_KINDS] = {"weights", "grads", "optimizer", "activations", "rings+segs",
                                            "staging", "workspace", "cuda ctx", "runtime"};

static double page(double b) { return b <= 0 ? 0 : (double)util_round_page((size_t)b); }

static plan_row_t *add_row(plan_t *p, int device, const char *fmt, int a, int b)
{
    plan_row_t *r = realloc(p->rows, (size_t)(p->n + 1) * sizeof(*r));
    if (!r)
        return NULL;
    p->rows = r;
    r = &p->rows[p->n++];
    *r = (plan_row_t){.device = device};
    snprintf(r->who, sizeof(r->who), fmt, a, b);
    if (device >= 0 && device + 1 > p->gpus)
        p->gpus = device + 1;
    return r;
}

/* Bytes of the token file's pages a reader of `tokens` tokens maps (the whole file at most),
 * 0 when it cannot be opened (the launch says why). */
static double file_pages(const char *pattern, int vocab, double tokens)
{
    glob_t g;
    double bytes = 0;
    if (glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc) {
        tokfile_t *tf = NULL;
        struct stat st;
        char err[256];
        if (stat(g.gl_pathv[0], &st) == 0 && tokfile_open(&tf, g.gl_pathv[0], vocab, err, sizeof(err)) == 0) {
            double n = (double)tokfile_count(tf), per = n > 0 ? (double)st.st_size / n : 0;
            bytes = tokens < n ? page(tokens * per) : (double)st.st_size;
            tokfile_close(&tf);
        }
    }
    globfree(&g);
    return bytes;
}

static void shared_row(plan_t *p, plan_row_t *r, const job_layout_t *l, const manifest_t *m)
{
    double params = page((double)job_params_bytes(l));
    int seqs = m->local_batch_size / m->microbatches;
    r->bytes[PLAN_WEIGHTS] = params;
    /* with parameter sharding, the exchanges' buffers: one piece's gradients a replica */
    r->bytes[PLAN_GRADS] = (l->gpu_shards ? 0 : params) + page((double)job_fsdp_bytes(l));
    r->bytes[PLAN_OPTIM] = m->host_rank == 0 ? page((double)job_optstate_bytes(l, m->shards)) : 0;
    r->bytes[PLAN_STAGING] = manifest_snapshots(m) || manifest_loads(m)
                                 ? page((double)staging_bytes(l->total, l->arrays)) : 0;
    r->bytes[PLAN_RINGS] = page((double)job_seg_bytes(l)) +
                           page((double)ldr_seg_bytes(m->dp, manifest_loader_slots(m), seqs, m->seq_len)) +
                           (l->S > 1 && plane_uses_act_segment(plane_transport(l)) ? page((double)job_act_bytes(l))
                                                                                     : 0) +
                           (l->gpu ? page((double)devdir_bytes(l)) : 0);
}

/* The coordinator: at the end of a run the validation loss runs the whole model over
 * local_batch_size x seq_len on the host (stages/report/evaluate.c), then the sample `ctitan
 * generate`'s KV-cache model over the prompt's 8 tokens and its own (a GPU job's on the GPU, the
 * CPU's counted: its fallback); before the run the unigram entropy reads the data. */
static void coord_row(plan_row_t *r, const manifest_t *m)
{
    const model_config_t *cfg = &m->model;
    int top = cfg->n_layers + 2;
    /* forwards only: the pages of the backward's buffers are never touched */
    double eval = m->val_enable
                      ? (double)model_acts_forward_bytes_for(cfg, 0, top, m->local_batch_size, m->seq_len) : 0;
    double sample = m->sample_tokens > 0 && m->tokenizer_path[0] ? (double)eval_sample_bytes(cfg, m->sample_tokens) : 0;
    r->bytes[PLAN_ACTS] = eval > sample ? eval : sample;
    r->bytes[PLAN_WORKSPACE] = eval ? (double)model_fixed_bytes(cfg) : 0;
    r->file = m->command[0] ? 0 : file_pages(m->dataset_path, cfg->vocab_size, ENTROPY_TOKENS);
    r->bytes[PLAN_RUNTIME] = PLAN_PROC_BYTES + r->file;
}

/* The built-in loader maps the training file: the windows of every step in order, or all of
 * it when shuffling. */
static void loader_row(plan_row_t *r, const manifest_t *m)
{
    double tokens = m->shuffle ? 1e18 : (double)m->steps * m->dp * m->local_batch_size * (m->seq_len + 1.0);
    r->file = m->command[0] ? 0 : file_pages(m->dataset_path, m->model.vocab_size, tokens);
    r->bytes[PLAN_RUNTIME] = PLAN_PROC_BYTES + r->file;
}

/* Stage rank s of a replica, on the host (CPU) or on its GPU. */
static int stage_rows(plan_t *p, const manifest_t *m, const job_layout_t *l, const sched_t *sched, int replica,
                      int s, int threads)
{
    model_config_t ac = m->model; /* the stage's model: the manifest's activation checkpointing */
    ac.ac_mode = m->ac_mode;
    ac.ac_every = m->ac_every;
    const model_config_t *cfg = &ac;
    int gpu = l->gpu ? job_local_ordinal(l, replica, s) : PLAN_HOST;
    plan_row_t *h = add_row(p, PLAN_HOST, "stage %d.%d", s, replica), *d = NULL;
    if (!h)
        return -ENOMEM;
    if (gpu >= 0 && !(d = add_row(p, gpu, "stage %d.%d", s, replica)))
        return -ENOMEM;
    h = d ? &p->rows[p->n - 2] : h; /* add_row may have moved the rows */
    h->bytes[PLAN_RUNTIME] = PLAN_STAGE_BYTES + (d ? PLAN_CUDA_HOST_BYTES : 0);
    param_table_t tab;
    if (params_table_init(&tab, cfg))
        return -ENOMEM;
    for (int c = 0; c < l->vs; c++) {
        int v = sched_vstage(sched, s, c), p0, p1, n_acts = sched_peak_acts(sched, s, c);
        size_t b, e;
        if (v < 0 || n_acts < 0 || manifest_stage_pieces(m, v, &p0, &p1)) {
            params_table_free(&tab);
            return -ENOMEM;
        }
        params_piece_range(&tab, p0, p1, &b, &e);
        double n = (double)(e - b);
        plan_row_t *r = d ? d : h;
        model_act_size_t act; /* kernels/act_bytes.h: checked against what each model allocates */
        if (model_act_bytes(cfg, p0, p1, l->mb, l->T, d ? MODEL_ACT_CUDA : MODEL_ACT_CPU, &act)) {
            params_table_free(&tab);
            return -EINVAL;
        }
        r->act_mb += (double)act.per_mb;
        r->in_flight = r->in_flight > n_acts ? r->in_flight : n_acts;
        /* a stage runs a W with its B (stage.c) under recompute or without a gradient to hand
         * down (the embedding's chunk); else B and W apart: one microbatch held between them */
        int held_w = sched_peak_held_w(sched, s, c);
        if (!held_w && cfg->ac_mode == CONFIG_AC_NONE && v > 0)
            held_w = 1;
        double acts = (double)model_act_total(&act, n_acts, held_w);
        r->bytes[PLAN_ACTS] += acts;
        r->act_work += acts - (double)n_acts * (double)act.per_mb;
        r->act_head |= act.head > 0;
        r->bytes[PLAN_WORKSPACE] += (double)model_fixed_bytes(cfg);
        double unit = l->fsdp > 1 ? (double)l->fsdp_unit[v] : 0;
        if (!d) { /* the CPU model on the shared segments; attention's backward scratch is T x T a thread */
            r->bytes[PLAN_WORKSPACE] += (double)threads * l->T * l->T * sizeof(float) / l->vs;
            if (l->fsdp_bf16) /* a bf16 reduce: the piece's fp32 gradients before rounding (fsdp.c) */
                r->bytes[PLAN_GRADS] += unit * 4;
            continue;
        }
        if (l->fsdp > 1) { /* its chunk, and the pieces it gathers (plane_nccl.c): two, or never resharded all */
            size_t ob, oe;
            job_fsdp_part(l, replica, b, e, &ob, &oe);
            n = (double)(oe - ob);
            d->bytes[PLAN_WEIGHTS] += (l->fsdp_reshard ? 2 * unit : (double)(e - b)) * 2;
            /* two pieces' gradients and an owner's sum; a bf16 reduce: the piece rounded, a bf16 sum */
            d->bytes[PLAN_GRADS] += l->fsdp_bf16 ? (2 * unit * 4 + 2 * unit * 2) : 3 * unit * 4;
        }
        d->bytes[PLAN_WEIGHTS] += (n + CUDA_SLACK) * 2;
        d->bytes[PLAN_GRADS] += (n + CUDA_SLACK) * 4;
        d->bytes[PLAN_WORKSPACE] += CUDA_WORKSPACE;
        double ring = (double)l->M * l->dev_slot;
        if (l->nccl) /* each end holds its slots: act and grad links to each neighbour */
            d->bytes[PLAN_RINGS] += ring * 2 * ((v > 0) + (v < l->S - 1));
        else /* a stage owns its outgoing rings: activations up, gradients down */
            d->bytes[PLAN_RINGS] += ring * ((v < l->S - 1) + (v > 0));
    }
    params_table_free(&tab);
    if (d)
        d->bytes[PLAN_CONTEXT] = PLAN_CUDA_CONTEXT_BYTES;
    return 0;
}

/* The fp32 gradients a CPU shard of slice [b, e) sums at a time with offload in bf16: a chunk, or
 * the longest tensor part of its slice for an optimizer of whole tensors (optshard.c setup). */
static size_t bf16_chunk(const manifest_t *m, size_t b, size_t e)
{
    size_t most = JOB_GRAD_CHUNK;
    param_table_t tab;
    const optim_t *o = optim_find(m->optimizer_name);
    if (!o || !o->whole_tensors || params_table_init(&tab, &m->model))
        return most;
    for (int t = 0; t < tab.n; t++) {
        size_t lo = tab.t[t].offset > b ? tab.t[t].offset : b, hi = tab.t[t].offset + tab.t[t].numel;
        hi = hi < e ? hi : e;
        most = hi > lo && hi - lo > most ? hi - lo : most;
    }
    params_table_free(&tab);
    return most;
}

/* Optimizer shard k: CPU shards work in the optstate segment; GPU shards keep the state on
 * the device beside the stage whose slice they hold (made there at set-up through a host
 * buffer of JOB_STATE_PIECE parameters: optshard.c make_state), and a sum of the replicas'
 * gradients with more than one. */
static int shard_rows(plan_t *p, const manifest_t *m, const job_layout_t *l, int k)
{
    size_t b, e;
    if (job_shard_range(l, m, k, &b, &e))
        return -ENOMEM;
    double n = (double)(e - b), blocks = n / MANIFEST_BLOCK + 2;
    plan_row_t *h = add_row(p, PLAN_HOST, "optshard %d", k, 0);
    if (!h)
        return -ENOMEM;
    h->bytes[PLAN_RUNTIME] = PLAN_SHARD_BYTES + blocks * 8;
    if (!l->gpu_shards) { /* with several copies, the sum of theirs (plane_reduce.c place_sum); offload
                           * in bf16 sums a chunk (or a tensor's part) at a time (optshard.c grads_at) */
        h->bytes[PLAN_GRADS] = l->host_bf16 ? (double)bf16_chunk(m, b, e) * 4 : l->copies > 1 ? n * 4 : 0;
        return 0;
    }
    int r, s;
    plane_shard_beside(plane_transport(l), l, k, &r, &s);
    int gpu = r >= 0 ? job_local_ordinal(l, r, s) : k;
    plan_row_t *d = add_row(p, gpu, "optshard %d", k, 0);
    if (!d)
        return -ENOMEM;
    h = &p->rows[p->n - 2];
    h->bytes[PLAN_RUNTIME] += PLAN_CUDA_HOST_BYTES;
    h->bytes[PLAN_OPTIM] = (n < (double)JOB_STATE_PIECE ? n : (double)JOB_STATE_PIECE) * 4;
    /* optshard.gpu_banks copies; the block norms (two steps' with the norm on the device) */
    d->bytes[PLAN_OPTIM] = n * l->arrays * 4 * m->gpu_banks + blocks * 8 * (l->norm_on_device ? 2 : 1);
    d->bytes[PLAN_GRADS] = l->dp > 1 ? n * 4 : 0;
    d->bytes[PLAN_CONTEXT] = PLAN_CUDA_CONTEXT_BYTES;
    return 0;
}

int plan_build(plan_t *p, const manifest_t *m, const plan_opts_t *o, char *err, size_t errlen)
{
    *p = (plan_t){0};
    snprintf(p->job, sizeof(p->job), "%s", m->name);
    snprintf(p->device, sizeof(p->device), "%s", m->device);
    if (m->ac_mode == CONFIG_AC_SELECTIVE && m->ac_every > 0)
        snprintf(p->ac_mode, sizeof(p->ac_mode), "selective, every %d layers", m->ac_every);
    else if (m->ac_mode == CONFIG_AC_SELECTIVE)
        snprintf(p->ac_mode, sizeof(p->ac_mode), "selective, op");
    else
        snprintf(p->ac_mode, sizeof(p->ac_mode), "%s", config_ac_mode_name(m->ac_mode));
    job_layout_t l;
    sched_t sched;
    if (job_layout(&l, m))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    int rc = sched_build(&sched, m->pp, l.vs, m->microbatches, m->schedule, err, errlen);
    if (rc)
        return rc;
    long cpus = o && o->cpus > 0 ? o->cpus : sysconf(_SC_NPROCESSORS_ONLN);
    int threads = m->threads > 0 ? m->threads : (int)(cpus / (m->pp * m->dp));
    threads = threads < 1 ? 1 : threads;
    plan_row_t *r;
    rc = -ENOMEM;
    if (!(r = add_row(p, PLAN_HOST, "shared memory", 0, 0)))
        goto out;
    shared_row(p, r, &l, m);
    if (!(r = add_row(p, PLAN_HOST, m->host_rank == 0 ? "coordinator" : "agent", 0, 0)))
        goto out;
    r->bytes[PLAN_RUNTIME] = PLAN_PROC_BYTES;
    if (m->host_rank == 0) {
        coord_row(r, m);
        if (!(r = add_row(p, PLAN_HOST, "launcher", 0, 0)))
            goto out;
        r->bytes[PLAN_RUNTIME] = PLAN_PROC_BYTES;
    }
    if (!(r = add_row(p, PLAN_HOST, "loader", 0, 0)))
        goto out;
    loader_row(r, m);
    for (int rep = 0; rep < l.dp; rep++)
        for (int s = 0; s < l.pp; s++)
            if (job_host_of(&l, rep) == m->host_rank && stage_rows(p, m, &l, &sched, rep, s, threads))
                goto out;
    for (int k = 0; k < m->shards; k++)
        if ((l.hosts == 1 || job_host_of(&l, k % l.dp) == m->host_rank) && shard_rows(p, m, &l, k))
            goto out;
    if (m->host_rank == 0 && (m->ckpt_enable || manifest_loads(m))) {
        if (!(r = add_row(p, PLAN_HOST, "checkpointd", 0, 0)))
            goto out;
        r->bytes[PLAN_RUNTIME] = PLAN_PROC_BYTES;
        r->bytes[PLAN_WORKSPACE] = m->ckpt_enable ? CKPTD_BUFFERS : 0;
    }
    double end = 0, eval = 0; /* coordinator.c: the workers are stopped before the validation */
    for (int i = 0; i < p->n; i++) {
        plan_row_t *x = &p->rows[i];
        for (int k = 0; k < PLAN_KINDS; k++)
            x->total += x->bytes[k];
        if (x->device == PLAN_HOST)
            p->host += x->total;
        else if (x->device < PLAN_MAX_GPUS)
            p->gpu[x->device] += x->total;
        if (x->device == PLAN_HOST && (!strcmp(x->who, "shared memory") || !strcmp(x->who, "coordinator") ||
                                       !strcmp(x->who, "launcher")))
            end += x->total - x->file;
        p->file += x->file;
        if (!strcmp(x->who, "coordinator"))
            eval = x->bytes[PLAN_ACTS] + x->bytes[PLAN_WORKSPACE];
    }
    p->host_need = p->host - p->file - eval > end ? p->host - p->file - eval : end;
    rc = 0;
out:
    sched_free(&sched);
    if (rc) {
        plan_free(p);
        util_fail(err, errlen, rc, "out of memory");
    }
    return rc;
}

void plan_free(plan_t *p)
{
    free(p->rows);
    p->rows = NULL;
    p->n = 0;
}

static void dev_name(int device, char *buf, size_t n)
{
    if (device == PLAN_HOST)
        snprintf(buf, n, "host");
    else
        snprintf(buf, n, "gpu%d", device);
}

void plan_print(const plan_t *p, FILE *f)
{
    fprintf(f, "plan: job %s, device %s, activation checkpointing %s (MiB; per process, shared segments once)\n",
            p->job, p->device, p->ac_mode);
    fprintf(f, "  %-16s %-6s", "process", "device");
    for (int k = 0; k < PLAN_KINDS; k++)
        fprintf(f, " %11s", kind_name[k]);
    fprintf(f, " %11s\n", "total");
    for (int i = 0; i < p->n; i++) {
        const plan_row_t *r = &p->rows[i];
        char dev[16];
        dev_name(r->device, dev, sizeof(dev));
        fprintf(f, "  %-16s %-6s", r->who, dev);
        for (int k = 0; k < PLAN_KINDS; k++)
            fprintf(f, " %11.1f", r->bytes[k] / PLAN_MIB);
        fprintf(f, " %11.1f\n", r->total / PLAN_MIB);
    }
    for (int i = 0; i < p->n; i++) {
        const plan_row_t *r = &p->rows[i];
        char dev[16];
        dev_name(r->device, dev, sizeof(dev));
        if (r->in_flight)
            fprintf(f, "  %s (%s): activations %.1f MiB a microbatch x %d in flight, and %.1f MiB of work sets "
                    "(recomputed layers, the gradients B keeps for W%s)\n", r->who, dev, r->act_mb / PLAN_MIB,
                    r->in_flight, r->act_work / PLAN_MIB, r->act_head ? ", the head's logits chunk" : "");
    }
    fprintf(f, "  host RAM: %.2f GiB, each process at its peak; at most %.2f GiB at once (the coordinator's "
            "end-of-run validation runs after the workers are stopped; the %.1f MiB of token files' pages the "
            "kernel can reclaim left out)\n", p->host / PLAN_GIB, p->host_need / PLAN_GIB, p->file / PLAN_MIB);
    for (int g = 0; g < p->gpus && g < PLAN_MAX_GPUS; g++) {
        double ctx = 0;
        for (int i = 0; i < p->n; i++)
            ctx += p->rows[i].device == g ? p->rows[i].bytes[PLAN_CONTEXT] : 0;
        fprintf(f, "  gpu%d: %.2f GiB (of which CUDA contexts %.2f GiB: an estimate, to be measured on a GPU)\n", g,
                p->gpu[g] / PLAN_GIB, ctx / PLAN_GIB);
    }
}

/* ---- what there is ---- */

/* This process's memory cgroup folder: v2 ("0::PATH") or v1 ("N:...memory...:PATH"); 1 for v1,
 * 0 for v2, -1 when there is none. */
static int cgroup_dir(char *dir, size_t n)
{
    char line[640];
    int v = -1;
    FILE *f = fopen("/proc/self/cgroup", "re");
    while (f && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = 0;
        if (!strcmp(c1 + 1, "") && v < 0) {
            snprintf(dir, n, "/sys/fs/cgroup%s", strcmp(c2 + 1, "/") ? c2 + 1 : "");
            v = 0;
        } else if (strstr(c1 + 1, "memory")) { /* v1 wins: on a hybrid host it holds the limit */
            snprintf(dir, n, "/sys/fs/cgroup/memory%s", strcmp(c2 + 1, "/") ? c2 + 1 : "");
            v = 1;
        }
    }
    if (f)
        fclose(f);
    return v;
}

/* A number from a file of dir, or the value of `key` in it ("key N" lines); -1 when absent or
 * "max". */
static double cgroup_value(const char *dir, const char *file, const char *key)
{
    char path[1024], line[256];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    FILE *f = fopen(path, "re");
    double v = -1;
    size_t k = key ? strlen(key) : 0;
    while (f && fgets(line, sizeof(line), f)) {
        if (key && (strncmp(line, key, k) || line[k] != ' '))
            continue;
        if (strncmp(line + k, "max", 3))
            v = strtod(line + k, NULL);
        break;
    }
    if (f)
        fclose(f);
    return v;
}

/* What the cgroup lets this process's job take: its limit less its usage, the file cache it
 * holds given back (the kernel reclaims it before it refuses); -1 without a limit. */
static double cgroup_room(void)
{
    char dir[700];
    int v1 = cgroup_dir(dir, sizeof(dir));
    if (v1 < 0)
        return -1;
    double max = cgroup_value(dir, v1 ? "memory.limit_in_bytes" : "memory.max", NULL);
    double cur = cgroup_value(dir, v1 ? "memory.usage_in_bytes" : "memory.current", NULL);
    double act = cgroup_value(dir, "memory.stat", v1 ? "total_active_file" : "active_file");
    double inact = cgroup_value(dir, "memory.stat", v1 ? "total_inactive_file" : "inactive_file");
    if (max < 0 || cur < 0 || max >= 0x1p62) /* v1 says "no limit" with a page-rounded 2^63 */
        return -1;
    double room = max - cur + (act > 0 ? act : 0) + (inact > 0 ? inact : 0);
    return room > 0 ? room : 0;
}

/* `timeout 2 SMI --query-gpu=index,uuid,memory.free ...`'s standard output into out[n] (no shell:
 * SMI may come from the environment). 0 when it ran to a zero status, else -1. */
static int run_capture(const char *smi, char *out, size_t n)
{
    int fd[2];
    if (access(smi, X_OK) || pipe2(fd, O_CLOEXEC))
        return -1;
    char *argv[] = {"timeout", "2", (char *)smi, "--query-gpu=index,uuid,memory.free", "--format=csv,noheader,nounits",
                    NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    extern char **environ;
    int rc = posix_spawnp(&pid, "timeout", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    size_t len = 0;
    ssize_t r;
    while (!rc && len + 1 < n && (r = read(fd[0], out + len, n - 1 - len)) != 0)
        if (r > 0)
            len += (size_t)r;
        else if (errno != EINTR)
            break;
    out[len] = 0;
    close(fd[0]);
    int st = -1;
    while (!rc && waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return !rc && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* A byte count from environment variable name: the number, or with "@FILE" the number FILE holds
 * (a test changes it between a launch and its relaunch); -1 when unset or not a count. */
static double env_bytes(const char *name)
{
    const char *s = getenv(name);
    char buf[64], *end;
    if (s && *s == '@') {
        FILE *f = fopen(s + 1, "re");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = 0;
        buf[strcspn(buf, "\n")] = 0;
        s = buf;
    }
    double v = s && *s ? strtod(s, &end) : -1;
    return s && *s && *end == 0 && v >= 0 ? v : -1;
}

/* One line of nvidia-smi: "index, uuid, MiB free". 0, or -1 when it is not that (MIG and old
 * drivers print "[N/A]" for the memory). */
static int smi_line(char *line, int *index, char *uuid, size_t ulen, double *mib)
{
    char *f[3], *save = NULL, *end;
    for (int i = 0; i < 3; i++)
        if (!(f[i] = strtok_r(i ? NULL : line, ",", &save)))
            return -1;
    if (strtok_r(NULL, ",", &save))
        return -1;
    while (*f[1] == ' ')
        f[1]++;
    long ix = strtol(f[0], &end, 10);
    if (end == f[0] || *end || ix < 0 || ix >= 4096 || snprintf(uuid, ulen, "%s", f[1]) >= (int)ulen)
        return -1;
    *index = (int)ix;
    *mib = strtod(f[2], &end);
    return end == f[2] || *end || !(*mib >= 0 && *mib < 1e12) ? -1 : 0; /* NaN, inf and the absurd too */
}

/* nvidia-smi's GPUs, as the job's CUDA will number them: CUDA_VISIBLE_DEVICES's entries in
 * its order (an index of nvidia-smi's, or a GPU-... UUID or a unique prefix of one; the first
 * entry that names none ends the list, as CUDA reads it; a MIG-... instance leaves every GPU
 * unknown: nvidia-smi does not say its memory), else every GPU in nvidia-smi's order. The
 * indices are nvidia-smi's, which are CUDA's for GPUs of one kind (CUDA puts the fastest first
 * unless CUDA_DEVICE_ORDER=PCI_BUS_ID). Any line not understood: every GPU unknown. */
void plan_visible_gpus(plan_have_t *h, char *out, const char *cvd)
{
    int n = 0, index[PLAN_MAX_GPUS];
    char uuid[PLAN_MAX_GPUS][96];
    double mib[PLAN_MAX_GPUS];
    for (char *line = out, *nl; *line; line = nl ? nl + 1 : line + strlen(line)) {
        if ((nl = strchr(line, '\n')))
            *nl = 0;
        if (n == PLAN_MAX_GPUS || smi_line(line, &index[n], uuid[n], sizeof(uuid[n]), &mib[n]))
            return;
        n++;
    }
    int order[PLAN_MAX_GPUS], found = 0;
    if (!cvd)
        for (; found < n; found++)
            order[found] = found;
    for (const char *e = cvd; e && *e && found < PLAN_MAX_GPUS; e += *e == ',') {
        size_t len = strcspn(e, ",");
        char entry[96];
        snprintf(entry, sizeof(entry), "%.*s", (int)(len < sizeof(entry) ? len : sizeof(entry) - 1), e);
        e += len;
        char *t = entry, *end;
        while (*t == ' ')
            t++;
        if (!strncmp(t, "MIG-", 4))
            return;
        int k = -1, hits = 0;
        long ix = strtol(t, &end, 10);
        for (int g = 0; g < n; g++)
            if (!strncmp(t, "GPU-", 4) ? !strncmp(uuid[g], t, strlen(t)) : end != t && !*end && index[g] == ix)
                k = g, hits++;
        for (int j = 0; j < found && hits == 1; j++)
            hits = order[j] == k ? 0 : hits; /* named twice: CUDA stops there too */
        if (hits != 1)
            break;
        order[found++] = k;
    }
    for (int g = 0; g < found; g++)
        h->gpu[g] = mib[order[g]] * PLAN_MIB;
    if (found) {
        h->gpus = found;
        snprintf(h->gpu_from, sizeof(h->gpu_from), "nvidia-smi's memory.free%s",
                 cvd ? " of CUDA_VISIBLE_DEVICES's GPUs" : "");
    }
}

void plan_capacity(plan_have_t *h, const manifest_t *m, int gpus)
{
    *h = (plan_have_t){.host = -1, .shm = -1};
    for (int g = 0; g < PLAN_MAX_GPUS; g++)
        h->gpu[g] = -1;
    double env = env_bytes("CTITAN_PLAN_HOST_BYTES");
    if (env >= 0) {
        h->host = h->shm = env;
        snprintf(h->host_from, sizeof(h->host_from), "CTITAN_PLAN_HOST_BYTES");
    } else {
        h->host = job_meminfo("MemAvailable");
        snprintf(h->host_from, sizeof(h->host_from), "MemAvailable");
        double room = cgroup_room();
        if (room >= 0 && (h->host < 0 || room < h->host)) {
            h->host = room;
            snprintf(h->host_from, sizeof(h->host_from), "the memory cgroup's limit less its usage but file cache");
        }
        struct statvfs vfs;
        if (statvfs("/dev/shm", &vfs) == 0)
            h->shm = (double)vfs.f_bavail * (double)vfs.f_frsize;
    }
    if (gpus <= 0)
        return;
    double dev = env_bytes("CTITAN_PLAN_DEVICE_BYTES");
    if (dev >= 0)
        snprintf(h->gpu_from, sizeof(h->gpu_from), "CTITAN_PLAN_DEVICE_BYTES");
    else if (m->device_memory_gib > 0) {
        dev = m->device_memory_gib * PLAN_GIB;
        snprintf(h->gpu_from, sizeof(h->gpu_from), "job.device_memory_gib");
    }
    if (dev >= 0) { /* every GPU, as many as a plan uses (a knob's trial may use more) */
        for (int g = 0; g < PLAN_MAX_GPUS; g++)
            h->gpu[g] = dev;
        return;
    }
    /* the free memory of each GPU as the driver's tool reports it, in a child (no CUDA here) */
    const char *smi = getenv("CTITAN_PLAN_NVIDIA_SMI"); /* tests: a stand-in */
    smi = smi && *smi ? smi : "/usr/bin/nvidia-smi";
    char out[PLAN_MAX_GPUS * 80] = "";
    /* a full buffer may have cut the last line short (its free memory too): then nothing known */
    if (run_capture(smi, out, sizeof(out)) == 0 && strlen(out) < sizeof(out) - 1)
        plan_visible_gpus(h, out, getenv("CUDA_VISIBLE_DEVICES"));
}

int plan_gpus(const plan_t *p, const plan_have_t *h)
{
    int n = h->gpus > 0 && h->gpus < p->gpus ? h->gpus : p->gpus;
    return n < PLAN_MAX_GPUS ? n : PLAN_MAX_GPUS;
}

/* Whether a row is on device `device` of this host's n GPUs (ordinal k runs on GPU k % n, as
 * the CUDA plugin's cuda_dev_select places it). */
static int on(const plan_row_t *r, int device, int n)
{
    return device < 0 ? r->device == device : r->device >= 0 && r->device % n == device;
}

double plan_gpu_need(const plan_t *p, const plan_have_t *h, int g)
{
    int n = plan_gpus(p, h);
    double need = 0;
    for (int i = 0; i < p->n; i++)
        if (on(&p->rows[i], g, n))
            need += p->rows[i].total;
    return need;
}

int plan_gpu_sharing(const plan_t *p, const plan_have_t *h)
{
    int n = plan_gpus(p, h), most = 0;
    for (int g = 0; g < n; g++) {
        int procs = 0;
        for (int i = 0; i < p->n; i++)
            procs += on(&p->rows[i], g, n);
        most = procs > most ? procs : most;
    }
    return most;
}

/* ---- the check ---- */

/* "weights 1.2 GiB, activations 3.4 GiB (...)": the device's items, largest first (gpus: this
 * host's). */
static void items(const plan_t *p, int device, int gpus, char *buf, size_t n)
{
    double sum[PLAN_KINDS] = {0};
    for (int i = 0; i < p->n; i++)
        if (on(&p->rows[i], device, gpus))
            for (int k = 0; k < PLAN_KINDS; k++)
                sum[k] += p->rows[i].bytes[k];
    size_t at = 0;
    buf[0] = 0;
    for (int shown = 0; shown < 5; shown++) {
        int best = -1;
        for (int k = 0; k < PLAN_KINDS; k++)
            if (sum[k] > 0 && (best < 0 || sum[k] > sum[best]))
                best = k;
        if (best < 0 || at >= n)
            break;
        at += (size_t)snprintf(buf + at, n - at, "%s%s %.2f GiB", shown ? ", " : "", kind_name[best],
                               sum[best] / PLAN_GIB);
        sum[best] = 0;
    }
}

/* The stage row on `device` with the most activations. */
static const plan_row_t *top_acts(const plan_t *p, int device, int gpus)
{
    const plan_row_t *best = NULL;
    for (int i = 0; i < p->n; i++)
        if (on(&p->rows[i], device, gpus) && p->rows[i].in_flight &&
            (!best || p->rows[i].bytes[PLAN_ACTS] > best->bytes[PLAN_ACTS]))
            best = &p->rows[i];
    return best;
}

/* A knob tried: m with `k1 = v1` (and `k2 = v2` when k2) planned against h, as the launch
 * would. Writes " (alone it fits)" or " (alone not enough: it would need ...)" into out and
 * returns 1 or 0; -1 when the manifest refuses the knob (" (not for this job: its error)"). */
static int trial(const manifest_t *m, const plan_have_t *h, const char *k1, const char *v1, const char *k2,
                 const char *v2, char *out, size_t n)
{
    manifest_t *t = malloc(sizeof(*t));
    char err[1024];
    plan_t q;
    out[0] = 0;
    if (!t)
        return -1;
    *t = *m;
    int rc = manifest_override(t, k1, v1, err, sizeof(err)) || (k2 && manifest_override(t, k2, v2, err, sizeof(err))) ||
             manifest_validate(t, err, sizeof(err)) || plan_build(&q, t, &(plan_opts_t){0}, err, sizeof(err));
    free(t);
    if (rc) { /* the manifest's own words, which name the key */
        snprintf(out, n, " (not for this job: %.200s)", err);
        return -1;
    }
    char over[160] = "";
    if (h->host >= 0 && q.host_need > h->host)
        snprintf(over, sizeof(over), "host RAM %.2f GiB of %.2f", q.host_need / PLAN_GIB, h->host / PLAN_GIB);
    for (int g = 0, gpus = plan_gpus(&q, h); g < gpus && !over[0]; g++) {
        double need = plan_gpu_need(&q, h, g);
        if (h->gpu[g] >= 0 && need > h->gpu[g])
            snprintf(over, sizeof(over), "GPU %d %.2f GiB of %.2f", g, need / PLAN_GIB, h->gpu[g] / PLAN_GIB);
    }
    plan_free(&q);
    if (over[0])
        snprintf(out, n, " (alone not enough: it would need %s)", over);
    else
        snprintf(out, n, " (alone it fits)");
    return !over[0];
}

/* The knobs that would make the job fit, for a device where it does not: each tried (trial),
 * when h is given, and said to fit alone or not; "; "-separated after "; to fit: ". */
static size_t knobs(const plan_t *p, const manifest_t *m, const plan_have_t *h, int device, int gpus, char *buf,
                    size_t n)
{
    const plan_row_t *a = top_acts(p, device, gpus);
    int mb = m->local_batch_size / m->microbatches, tried = 0, fits = 0;
    size_t at = (size_t)snprintf(buf, n, "; to fit: ");
    char v[32], v2[32];
/* the knob's trial after its text, then the separator */
#define KNOB_TRIAL(k1, v1, k2, v2)                                                                   \
    do {                                                                                           \
        int f_ = h && (k1) && at < n ? trial(m, h, k1, v1, k2, v2, buf + at, n - at) : -1;           \
        tried += f_ >= 0, fits += f_ > 0;                                                          \
        at += at < n ? strlen(buf + at) : 0;                                                       \
        at += at < n ? (size_t)snprintf(buf + at, n - at, "; ") : 0;                               \
    } while (0)
    for (int i = 0; i < p->n && device == PLAN_HOST; i++)
        if (!strcmp(p->rows[i].who, "coordinator") && p->rows[i].bytes[PLAN_ACTS] >= p->host_need / 4 && at < n) {
            at += (size_t)snprintf(buf + at, n - at, "a lighter end of run (the coordinator's validation holds "
                                   "%.2f GiB of activations, the whole model over %d x %d tokens on the CPU: "
                                   "--validation.enable false, or a smaller --training.local_batch_size)",
                                   p->rows[i].bytes[PLAN_ACTS] / PLAN_GIB, m->local_batch_size, m->seq_len);
            KNOB_TRIAL("validation.enable", "false", NULL, NULL);
        }
    if (a && at < n) {
        at += (size_t)snprintf(buf + at, n - at, "fewer activations (%s holds %.2f GiB: %.2f GiB a microbatch of %d x "
                               "%d tokens x %d in flight): %ssmaller microbatches (--parallelism."
                               "pipeline_parallel_microbatches above %d, or a smaller --training.local_batch_size "
                               "or --training.seq_len)", a->who, a->bytes[PLAN_ACTS] / PLAN_GIB,
                               a->act_mb / PLAN_GIB, mb, m->seq_len, a->in_flight,
                               m->ac_mode == CONFIG_AC_FULL ? "" : "activation checkpointing "
                               "(--activation_checkpoint.mode full, or selective), ", m->microbatches);
        snprintf(v, sizeof(v), "%d", 2 * m->microbatches);
        if (m->ac_mode != CONFIG_AC_FULL) /* the trial: AC full, else twice the microbatches */
            KNOB_TRIAL("activation_checkpoint.mode", "full", NULL, NULL);
        else if (m->local_batch_size % (2 * m->microbatches) == 0)
            KNOB_TRIAL("parallelism.pipeline_parallel_microbatches", v, NULL, NULL);
        else
            KNOB_TRIAL(NULL, NULL, NULL, NULL);
    }
    if (at < n && device >= 0 && strcmp(m->shard_device, "cpu") && m->gpu_banks > 1) {
        at += (size_t)snprintf(buf + at, n - at, "one copy of the GPU shards' state (--optshard.gpu_banks 1: "
                               "a checkpoint's copy then holds the next update)");
        KNOB_TRIAL("optshard.gpu_banks", "1", NULL, NULL);
    }
    if (at < n && device >= 0 && strcmp(m->shard_device, "cpu")) {
        at += (size_t)snprintf(buf + at, n - at, "optimizer offload (--optshard.device cpu keeps the optimizer "
                               "state in host memory)");
        KNOB_TRIAL("optshard.device", "cpu", NULL, NULL);
    }
    double optim = 0;
    for (int i = 0; i < p->n && device == PLAN_HOST; i++)
        if (p->rows[i].device == PLAN_HOST)
            optim += p->rows[i].bytes[PLAN_OPTIM];
    if (at < n && device == PLAN_HOST && !strcmp(m->device, "cuda") && !strcmp(m->shard_device, "cpu") &&
        optim >= p->host_need / 4) { /* offload's state is most of it: it can go back to the GPUs */
        at += (size_t)snprintf(buf + at, n - at, "the optimizer state on the GPUs (--optshard.device cuda: its "
                               "%.2f GiB of master weights and moments leave host memory)", optim / PLAN_GIB);
        /* (GPU shards have no host banks: one asked of the CPU ones goes with them) */
        KNOB_TRIAL("optshard.device", "cuda", m->host_banks < 2 ? "optshard.host_banks" : NULL, "2");
    }
    if (at < n && device == PLAN_HOST && !strcmp(m->shard_device, "cpu") && m->host_banks > 1 &&
        optim >= p->host_need / 4) { /* the CPU shards' state is a quarter or more of it: one bank less */
        at += (size_t)snprintf(buf + at, n - at, "one bank of the CPU shards' state (--optshard.host_banks 1: %.2f "
                               "GiB less, updated in place; a shard lost in its update then rewinds the job to "
                               "its newest snapshot instead of being replaced alone)", optim / 2 / PLAN_GIB);
        KNOB_TRIAL("optshard.host_banks", "1", NULL, NULL);
    }
    double copies = 0; /* offload's host copies of the weights and gradients (the shared segments) */
    for (int i = 0; i < p->n && device == PLAN_HOST; i++)
        if (p->rows[i].device == PLAN_HOST && !strcmp(p->rows[i].who, "shared memory"))
            copies = p->rows[i].bytes[PLAN_WEIGHTS] + p->rows[i].bytes[PLAN_GRADS];
    if (at < n && device == PLAN_HOST && !strcmp(m->device, "cuda") && !strcmp(m->shard_device, "cpu") &&
        !strcmp(m->offload_dtype, "float32") && copies >= p->host_need / 8) {
        at += (size_t)snprintf(buf + at, n - at, "offload's copies in bf16 (--optshard.offload_dtype bfloat16: "
                               "%.2f GiB less, the weights and gradients between the GPUs and the CPU shards "
                               "halved; the gradients reach the optimizer rounded to bf16)", copies / 2 / PLAN_GIB);
        KNOB_TRIAL("optshard.offload_dtype", "bfloat16", NULL, NULL);
        if (at < n && m->host_banks > 1 && optim >= p->host_need / 4) { /* the two halvings together */
            at += (size_t)snprintf(buf + at, n - at, "both (--optshard.offload_dtype bfloat16 "
                                   "--optshard.host_banks 1: ZeRO-Offload's 16 bytes a parameter)");
            KNOB_TRIAL("optshard.offload_dtype", "bfloat16", "optshard.host_banks", "1");
        }
    }
    /* more stages spread the layers over more GPUs; on the host they only share the activations
     * out differently, so they are named there only when a stage holds some */
    if (at < n && (device >= 0 || a)) {
        at += (size_t)snprintf(buf + at, n - at, "more pipeline stages (--parallelism.pipeline_parallel_degree "
                               "above %d: %s)", m->pp,
                               device >= 0 ? "fewer layers on each GPU" : "fewer layers' activations a stage");
        snprintf(v, sizeof(v), "%d", 2 * m->pp); /* split evenly: the split points were for m->pp */
        KNOB_TRIAL("parallelism.pipeline_parallel_degree", v, "parallelism.pipeline_parallel_split_points", "");
    }
    if (at < n && device == PLAN_HOST && !strcmp(m->device, "cpu") && m->dp_replicate > 1) {
        at += (size_t)snprintf(buf + at, n - at, "parameter sharding (the %d replicas hold %d copies of the "
                               "weights and gradients: --parallelism.data_parallel_shard_degree %d with "
                               "data_parallel_replicate_degree 1 holds one, the same batch)", m->dp, m->dp_replicate,
                               m->dp);
        snprintf(v, sizeof(v), "%d", m->dp);
        snprintf(v2, sizeof(v2), "%d", 1);
        KNOB_TRIAL("parallelism.data_parallel_shard_degree", v, "parallelism.data_parallel_replicate_degree", v2);
    }
#undef KNOB_TRIAL
    /* the knobs are "; "-separated: none after the last, and no "to fit" without one */
    if (at >= n)
        return at;
    while (at >= 2 && !strcmp(buf + at - 2, "; "))
        buf[at -= 2] = '\0';
    if (!strcmp(buf, "; to fit: ")) /* nothing to name */
        buf[at = 0] = '\0';
    else if (tried && !fits) /* "exactly why not" */
        at += (size_t)snprintf(buf + at, n - at, "; none of these alone makes it fit this machine");
    return at < n ? at : n;
}

int plan_check(const plan_t *p, const plan_have_t *h, const manifest_t *m, char *err, size_t errlen)
{
    char what[512];
    size_t at = 0;
    const plan_row_t *shm = NULL;
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->rows[i].who, "shared memory"))
            shm = &p->rows[i];
    int bad = 0;
    if (h->host >= 0 && p->host_need > h->host) {
        items(p, PLAN_HOST, 1, what, sizeof(what));
        at += (size_t)snprintf(err + at, at < errlen ? errlen - at : 0, "job %s does not fit this host's memory: it "
                               "needs %.2f GiB of host RAM at once (%s) but %.2f GiB are available (%s)", p->job,
                               p->host_need / PLAN_GIB, what, h->host / PLAN_GIB, h->host_from);
        if (at < errlen)
            at += knobs(p, m, h, PLAN_HOST, 1, err + at, errlen - at);
        bad = 1;
    } else if (shm && h->shm >= 0 && shm->total > h->shm) {
        at += (size_t)snprintf(err + at, at < errlen ? errlen - at : 0, "job %s does not fit /dev/shm: its shared "
                               "segments need %.2f GiB but /dev/shm has %.2f GiB free (a larger /dev/shm: mount -o "
                               "remount,size=...)", p->job, shm->total / PLAN_GIB, h->shm / PLAN_GIB);
        bad = 1;
    }
    int gpus = plan_gpus(p, h);
    for (int g = 0; g < gpus; g++) {
        double need = plan_gpu_need(p, h, g);
        if (h->gpu[g] < 0 || need <= h->gpu[g] || at >= errlen)
            continue;
        items(p, g, gpus, what, sizeof(what));
        at += (size_t)snprintf(err + at, errlen - at, "%sjob %s does not fit GPU %d: it needs %.2f GiB there (%s; "
                               "the CUDA contexts are an estimate) but %.2f GiB are available (%s)", bad ? "\n" : "",
                               p->job, g, need / PLAN_GIB, what, h->gpu[g] / PLAN_GIB, h->gpu_from);
        if (at < errlen)
            at += knobs(p, m, h, g, gpus, err + at, errlen - at);
        bad = 1;
    }
    return bad ? -ENOMEM : 0;
}

int plan_fits(const manifest_t *m, char *err, size_t errlen)
{
    plan_t p;
    plan_have_t have;
    int rc = plan_build(&p, m, &(plan_opts_t){0}, err, errlen);
    if (rc)
        return rc;
    plan_capacity(&have, m, p.gpus);
    rc = plan_check(&p, &have, m, err, errlen);
    plan_free(&p);
    return rc;
}
