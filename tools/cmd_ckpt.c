/* `ctitan ckpt`: looking after checkpoints written by checkpointd (format: checkpointd/ckpt.h).
 *   ctitan ckpt ls DIR                                what is in a checkpoint folder
 *   ctitan ckpt verify PATH                           read and check every byte of one
 *   ctitan ckpt export PATH --safetensors OUT         its weights for Hugging Face loaders
 *   ctitan ckpt export PATH --hf DIR                  a folder from_pretrained loads
 *   ctitan ckpt keygen PREFIX                         a CURVE key pair for remote checkpoints
 *   ctitan ckpt fetch ENDPOINT JOB --out DIR ...      a storage host's checkpoint, copied here
 * Exit status: 0 ok, 1 the checkpoint (or file) is bad or an operation failed, 2 bad usage. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/remote.h"
#include "checkpointd/restore.h"
#include "ipc/util.h"
#include "tools/cmds.h"
#include "checkpointd/safetensors.h"
#include "checkpointd/hf_export.h"

static const char usage_main[] =
    "usage: ctitan ckpt COMMAND ...\n"
    "  ls DIR                               list the checkpoints in DIR (a [checkpoint] folder)\n"
    "  verify PATH                          read every chunk of checkpoint PATH and check it\n"
    "  export PATH --safetensors OUT        write its model weights as a safetensors file\n"
    "  export PATH --hf DIR                 write a Hugging Face model folder (config, weights, tokenizer)\n"
    "  keygen PREFIX                        make PREFIX.key and PREFIX.pub for remote checkpoints\n"
    "  fetch ENDPOINT JOB --out DIR         copy a checkpoint of JOB from a storage host into DIR\n"
    "  import HF_DIR --out FOLDER           a Hugging Face Llama as checkpoint FOLDER/step-00000000\n"
    "`ctitan ckpt COMMAND --help` describes each.\n";

static const char usage_ls[] =
    "usage: ctitan ckpt ls DIR\n"
    "Lists the checkpoint directories of DIR, oldest first: step, size, tensors, creation time\n"
    "and state: complete (an index that reads back), incomplete (a step-N directory whose index\n"
    "is missing or unreadable) or temporary (a .tmp-step-N.PID directory a writer left or is\n"
    "still writing). Only the indexes are read; `ctitan ckpt verify` checks the data.\n";

static const char usage_verify[] =
    "usage: ctitan ckpt verify PATH\n"
    "Reads every chunk of checkpoint PATH (a step-N directory) and checks it against the index:\n"
    "prints one line per problem (the file, the tensor, what is wrong), then a summary.\n"
    "Exit status: 0 all is well, 1 corrupt or incomplete, 2 bad usage.\n";

static const char usage_export[] =
    "usage: ctitan ckpt export PATH --safetensors OUT [--no-verify]\n"
    "       ctitan ckpt export PATH --hf DIR [--max-shard-size SIZE] [--dtype float32|bfloat16]\n"
    "                                        [--tokenizer FILE | --no-tokenizer] [--no-verify]\n"
    "PATH is a checkpoint (step-N) or a checkpoint folder: then its newest checkpoint that verifies.\n"
    "--safetensors writes the model weights of checkpoint PATH (every tensor but optimizer.*) to\n"
    "OUT in the safetensors format, under their Hugging Face Llama names, with the step and the\n"
    "model's shape in __metadata__.\n"
    "--hf writes a folder that transformers' LlamaForCausalLM.from_pretrained(DIR) and\n"
    "AutoTokenizer.from_pretrained(DIR) load with no other arguments: config.json,\n"
    "generation_config.json, the weights (model.safetensors, or shards of at most SIZE bytes -\n"
    "default 5GB; 500MB, 2GiB and plain bytes are understood - with model.safetensors.index.json)\n"
    "in float32 (default) or bfloat16 (rounded to nearest even), and the tokenizer of the\n"
    "manifest's model.tokenizer_path or --tokenizer FILE: a tokenizer.json is copied with the\n"
    "tokenizer_config.json and special_tokens_map.json beside it; ctitan's tokenizer.bin is\n"
    "converted to a tokenizer.json. DIR must not exist or be an empty folder; it appears only\n"
    "once complete and synced, and nothing is left there on failure.\n"
    "The whole checkpoint is verified first and a checkpoint that does not verify is refused;\n"
    "--no-verify skips that (e.g. to rescue the weights when only the optimizer moments are\n"
    "damaged): every weight chunk is still checked as it is copied.\n"
    "OUT appears only once complete and synced.\n";

static const char usage_keygen[] =
    "usage: ctitan ckpt keygen PREFIX\n"
    "Writes a fresh CURVE key pair for remote checkpoints: PREFIX.key (secret, mode 0600) and\n"
    "PREFIX.pub (public), and prints the public key. A checkpointd server lists trainers'\n"
    "public keys in its --allow file; trainers are given the server's PREFIX.pub.\n"
    "Existing key files are never overwritten: remove them first to replace a pair.\n";

static const char usage_fetch[] =
    "usage: ctitan ckpt fetch ENDPOINT JOB --out DIR --server-key SERVER.pub --client-key CLIENT.key\n"
    "                         [--step N]\n"
    "Copies checkpoint step N of job JOB (its newest that verifies, without --step) from the\n"
    "checkpointd --listen at ENDPOINT (tcp://HOST:PORT) into DIR/step-N, as the storage host holds\n"
    "it: for `ctitan ckpt export`, `ctitan generate` or a run's --checkpoint.load on this machine.\n"
    "The keys are a trainer's: the server's public key, and a secret key its --allow file lists.\n"
    "The copy is verified (every chunk) before it appears, by rename, in DIR (made if missing);\n"
    "DIR/step-N must not exist. A run that checkpoints to the storage host needs none of this: it\n"
    "resumes from there by itself.\n";

static int is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

static int show_help(const char *usage)
{
    fputs(usage, stdout);
    return 0;
}

/* Bad usage: the message, the usage text, status 2. */
__attribute__((format(printf, 2, 3))) static int bad_usage(const char *usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ctitan ckpt: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n\n%s", usage);
    return 2;
}

/* Collects positional arguments (at most max) and the flags named in flags (a NULL-terminated
 * list; a flag ending in '=' takes a value, stored in vals[i]). Returns -1 for --help, 2 after
 * a usage message, 0 when fine. */
static int parse(int argc, char **argv, const char *usage, const char **pos, int max, int *npos,
                 const char *const *flags, const char **vals, int *set)
{
    *npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a))
            return -1;
        if (a[0] == '-' && a[1]) {
            int k = 0, found = 0;
            for (; flags && flags[k]; k++) {
                size_t fl = strlen(flags[k]);
                int takes = flags[k][fl - 1] == '=';
                size_t nl = takes ? fl - 1 : fl;
                if (strncmp(a, flags[k], nl))
                    continue;
                if (a[nl] == '=' && takes) {
                    vals[k] = a + nl + 1;
                } else if (!a[nl] && takes) {
                    if (i + 1 >= argc)
                        return bad_usage(usage, "%s needs a value", a);
                    vals[k] = argv[++i];
                } else if (!a[nl]) {
                    set[k] = 1;
                } else {
                    continue;
                }
                found = 1;
                break;
            }
            if (!found)
                return bad_usage(usage, "unknown option '%s'", a);
            continue;
        }
        if (*npos >= max)
            return bad_usage(usage, "unexpected argument '%s'", a);
        pos[(*npos)++] = a;
    }
    return 0;
}

static void human_bytes(char *buf, size_t n, uint64_t b)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 5)
        v /= 1024, u++;
    if (u == 0)
        snprintf(buf, n, "%" PRIu64 " B", b);
    else
        snprintf(buf, n, "%.1f %s", v, units[u]);
}

static void fmt_time(char *buf, size_t n, int64_t t)
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (!localtime_r(&tt, &tm) || !strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm))
        snprintf(buf, n, "%" PRId64, t);
}

/* ---- ls ---- */

enum { ROW_COMPLETE, ROW_INCOMPLETE, ROW_TEMPORARY };

typedef struct {
    char name[NAME_MAX + 1];
    int64_t step;
    int state;
    uint64_t bytes;       /* regular files directly inside it */
    int tensors;          /* complete only */
    int64_t created;      /* complete only */
    char note[160];
} row_t;

/* "step-N" (digits only) -> N, ".tmp-step-N..." -> N and the writer's *pid (ckpt_layout.h); -1
 * for anything else. */
static int64_t parse_name(const char *name, int *temporary, long *pid)
{
    int64_t step;
    *pid = 0;
    if ((*temporary = ckpt_tmp_of(name, &step, pid)))
        return step;
    return ckpt_step_of(name);
}

static uint64_t dir_bytes(const char *path)
{
    uint64_t sum = 0;
    DIR *d = opendir(path);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            sum += (uint64_t)st.st_size;
    }
    closedir(d);
    return sum;
}

static int cmp_row(const void *a, const void *b)
{
    const row_t *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    if (x->state != y->state)
        return x->state - y->state;
    return strcmp(x->name, y->name);
}

static int in_list(const int64_t *steps, int n, int64_t s)
{
    for (int i = 0; i < n; i++)
        if (steps[i] == s)
            return 1;
    return 0;
}

/* The row of one step folder at path: its state (temporary, incomplete, complete) and what
 * it holds; complete: whether it is among ckpt_list's steps and its index reads. */
static void fill_row(row_t *r, const char *name, const char *path, int64_t step, int temporary, long pid,
                     const int64_t *steps, int n_complete)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->step = step;
    r->bytes = dir_bytes(path);
    if (temporary) {
        r->state = ROW_TEMPORARY;
        if (pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM))
            snprintf(r->note, sizeof(r->note), "(its writer, pid %ld, is running)", pid);
        else if (pid > 0)
            snprintf(r->note, sizeof(r->note), "(a leftover: writer pid %ld is gone)", pid);
        else
            snprintf(r->note, sizeof(r->note), "(a leftover)");
    } else if (!in_list(steps, n_complete, step)) {
        r->state = ROW_INCOMPLETE;
        snprintf(r->note, sizeof(r->note), "(no index)");
    } else {
        ckpt_t *c = NULL;
        char err[512];
        if (ckpt_open(&c, path, err, sizeof(err))) {
            r->state = ROW_INCOMPLETE;
            snprintf(r->note, sizeof(r->note), "(unreadable index: %.130s)", err);
        } else {
            r->state = ROW_COMPLETE;
            r->tensors = ckpt_index(c)->n_tensors;
            r->created = ckpt_index(c)->created;
            ckpt_close(&c);
        }
    }
}

/* The table, by step, and the summary line. */
static void print_rows(const char *dir, row_t *rows, int n)
{
    int counts[3] = {0};
    if (n)
        qsort(rows, (size_t)n, sizeof(row_t), cmp_row);
    if (n)
        printf("%10s  %10s  %7s  %-19s  %-10s  %s\n", "STEP", "SIZE", "TENSORS", "CREATED", "STATE", "NAME");
    for (int i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        static const char *const state[] = {"complete", "incomplete", "temporary"};
        char size[32], tensors[16] = "-", created[32] = "-";
        human_bytes(size, sizeof(size), r->bytes);
        if (r->state == ROW_COMPLETE) {
            snprintf(tensors, sizeof(tensors), "%d", r->tensors);
            fmt_time(created, sizeof(created), r->created);
        }
        printf("%10" PRId64 "  %10s  %7s  %-19s  %-10s  %s%s%s\n", r->step, size, tensors, created,
               state[r->state], r->name, r->note[0] ? " " : "", r->note);
        counts[r->state]++;
    }
    printf("%s: %d complete, %d incomplete, %d temporary\n", dir, counts[ROW_COMPLETE], counts[ROW_INCOMPLETE],
           counts[ROW_TEMPORARY]);
    char ip[PATH_MAX];
    snprintf(ip, sizeof(ip), "%s/index", dir);
    if (!n && access(ip, F_OK) == 0)
        printf("(%s is a checkpoint itself: ls lists the folder that holds checkpoints)\n", dir);
}

static int ckpt_ls(int argc, char **argv)
{
    const char *pos[1];
    int npos, rc = parse(argc, argv, usage_ls, pos, 1, &npos, NULL, NULL, NULL);
    if (rc)
        return rc < 0 ? show_help(usage_ls) : rc;
    if (npos != 1)
        return bad_usage(usage_ls, "ls needs the checkpoint folder DIR");
    const char *dir = pos[0];

    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "ctitan ckpt ls: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    int64_t *steps = NULL;
    int n_complete = ckpt_list(dir, &steps); /* the same notion of complete as resuming */
    if (n_complete < 0) {
        fprintf(stderr, "ctitan ckpt ls: %s: %s\n", dir, strerror(-n_complete));
        closedir(d);
        return 1;
    }
    row_t *rows = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int temporary;
        long pid;
        int64_t step = parse_name(e->d_name, &temporary, &pid);
        struct stat st;
        if (step < 0 || fstatat(dirfd(d), e->d_name, &st, 0) || !S_ISDIR(st.st_mode))
            continue;
        if (n == cap) {
            row_t *g = realloc(rows, (size_t)(cap = cap ? 2 * cap : 16) * sizeof(row_t));
            if (!g) {
                fprintf(stderr, "ctitan ckpt ls: out of memory\n");
                rc = 1;
                goto out;
            }
            rows = g;
        }
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        fill_row(&rows[n++], e->d_name, path, step, temporary, pid, steps, n_complete);
    }
    print_rows(dir, rows, n);
out:
    free(rows);
    free(steps);
    closedir(d);
    return rc;
}

/* ---- verify ---- */

/* Runs ckpt_verify, reporting on `report`, and prints the summary line. Returns 0 when the
 * checkpoint is sound, else 1. */
static int verify_one(const char *path, FILE *report)
{
    char err[1024] = "";
    int n_bad = 0;
    int rc = ckpt_verify(path, report, &n_bad, err, sizeof(err));
    if (rc == 0) {
        ckpt_t *c = NULL;
        char e2[1024];
        if (ckpt_open(&c, path, e2, sizeof(e2)) == 0) {
            const ckpt_index_t *ix = ckpt_index(c);
            int shapes = restore_check_shapes(ix, path, e2, sizeof(e2));
            if (shapes < 0) {
                fprintf(report, "%s\n%s: CORRUPT: 1 problem\n", e2, path);
                ckpt_close(&c);
                return 1;
            }
            if (shapes > 0)
                fprintf(report, "note: %s\n", e2);
            uint64_t bytes = 0;
            for (int f = 0; f < ix->n_files; f++)
                bytes += ix->files[f].bytes;
            char size[32];
            human_bytes(size, sizeof(size), bytes);
            fprintf(report, "%s: OK: step %" PRId64 ", %d tensors in %d files, %s\n", path, ix->step, ix->n_tensors,
                    ix->n_files, size);
            ckpt_close(&c);
        } else {
            fprintf(report, "%s: OK\n", path);
        }
        return 0;
    }
    /* ckpt_verify has printed err already for ENOENT and EBADMSG */
    struct stat st;
    if (rc == -ENOENT && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        fprintf(report, "%s: INCOMPLETE: no index\n", path);
    else if (rc == -ENOENT)
        fprintf(report, "%s: not a checkpoint directory\n", path);
    else if (rc == -EBADMSG)
        fprintf(report, "%s: CORRUPT: %d problem%s\n", path, n_bad, n_bad == 1 ? "" : "s");
    else
        fprintf(report, "%s: cannot verify: %s\n", path, err[0] ? err : strerror(-rc));
    return 1;
}

static int ckpt_verify_cmd(int argc, char **argv)
{
    const char *pos[1];
    int npos, rc = parse(argc, argv, usage_verify, pos, 1, &npos, NULL, NULL, NULL);
    if (rc)
        return rc < 0 ? show_help(usage_verify) : rc;
    if (npos != 1)
        return bad_usage(usage_verify, "verify needs the checkpoint PATH");
    return verify_one(pos[0], stdout);
}

/* ---- export ---- */

/* "5GB", "500MB", "2GiB", "123" -> bytes (transformers' units: KB, MB, GB decimal; KiB, MiB,
 * GiB binary). 0 when it is not a size. */
static uint64_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 1))
        return 0;
    static const struct { const char *unit; double mult; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (!strcasecmp(end, units[i].unit) && (end[0] || v == (double)(uint64_t)v))
            return v * units[i].mult < 1.8e19 ? (uint64_t)(v * units[i].mult) : 0;
    return 0;
}

enum { EX_ST, EX_HF, EX_SHARD, EX_DTYPE, EX_TOK, EX_NOTOK, EX_NOVERIFY, EX_N };

static int export_hf(const char *path, const char **vals, const int *set)
{
    hf_export_opts_t o = {.tokenizer = vals[EX_TOK], .no_tokenizer = set[EX_NOTOK]};
    if (vals[EX_SHARD] && !(o.max_shard_bytes = parse_size(vals[EX_SHARD])))
        return bad_usage(usage_export, "--max-shard-size '%s' is not a size (e.g. 5GB, 500MB, 1000000)",
                         vals[EX_SHARD]);
    if (vals[EX_DTYPE] && strcmp(vals[EX_DTYPE], "float32") && strcmp(vals[EX_DTYPE], "bfloat16"))
        return bad_usage(usage_export, "--dtype '%s': float32 or bfloat16", vals[EX_DTYPE]);
    o.bf16 = vals[EX_DTYPE] && !strcmp(vals[EX_DTYPE], "bfloat16");
    if (o.tokenizer && o.no_tokenizer)
        return bad_usage(usage_export, "--tokenizer and --no-tokenizer together");
    char err[1024];
    if (hf_export(path, vals[EX_HF], &o, stderr, err, sizeof(err))) {
        fprintf(stderr, "ctitan ckpt export: %s\n", err);
        return 1;
    }
    printf("wrote %s (Hugging Face Llama, %s) from %s\n", vals[EX_HF], o.bf16 ? "bfloat16" : "float32", path);
    return 0;
}

/* Whether dir holds an index (is one checkpoint, complete or not), not a folder of them. */
static int has_index(const char *dir)
{
    char p[PATH_MAX];
    return snprintf(p, sizeof(p), "%s/index", dir) < (int)sizeof(p) && access(p, F_OK) == 0;
}

static int ckpt_export(int argc, char **argv)
{
    const char *pos[1], *vals[EX_N] = {NULL};
    int set[EX_N] = {0}, npos;
    static const char *const flags[] = {"--safetensors=", "--hf=", "--max-shard-size=", "--dtype=", "--tokenizer=",
                                        "--no-tokenizer", "--no-verify", NULL};
    int rc = parse(argc, argv, usage_export, pos, 1, &npos, flags, vals, set);
    if (rc)
        return rc < 0 ? show_help(usage_export) : rc;
    if (npos != 1)
        return bad_usage(usage_export, "export needs the checkpoint PATH");
    if ((!vals[EX_ST] || !vals[EX_ST][0]) == (!vals[EX_HF] || !vals[EX_HF][0]))
        return bad_usage(usage_export, "export needs one of --safetensors OUT and --hf DIR");
    if (vals[EX_ST] && (vals[EX_SHARD] || vals[EX_DTYPE] || vals[EX_TOK] || set[EX_NOTOK]))
        return bad_usage(usage_export, "--max-shard-size, --dtype and --tokenizer go with --hf");
    const char *path = pos[0], *out = vals[EX_ST];
    char newest[PATH_MAX], why[1024];
    if (!has_index(path)) { /* a checkpoint folder: its newest checkpoint that verifies */
        if (ckpt_find_latest(path, newest, sizeof(newest), stderr, why, sizeof(why)) == 0) {
            printf("exporting %s, the newest checkpoint of %s\n", newest, path);
            path = newest;
        }
    }
    if (!set[EX_NOVERIFY] && verify_one(path, stderr)) {
        fprintf(stderr, "ctitan ckpt export: refusing to export %s: it does not verify "
                        "(--no-verify exports the weights anyway, checking each weight chunk)\n", path);
        return 1;
    }
    if (vals[EX_HF])
        return export_hf(path, vals, set);
    char err[1024];
    if ((rc = st_export(path, out, err, sizeof(err)))) {
        fprintf(stderr, "ctitan ckpt export: %s\n", err);
        return 1;
    }
    struct stat st;
    char size[32] = "?";
    if (stat(out, &st) == 0)
        human_bytes(size, sizeof(size), (uint64_t)st.st_size);
    printf("wrote %s (%s) from %s\n", out, size, path);
    return 0;
}

/* ---- fetch ---- */

/* Step `step` of job from the storage host into DIR/step-N: fetched into DIR/.tmp-step-N.PID,
 * verified as it comes (every chunk's checksum, every data file's header: the directory sink),
 * renamed. 0; 1 after saying why on stderr (damaged: *damaged = 1). */
static int fetch_one(rmt_client_t *c, const char *endpoint, const char *job, int64_t step, const char *dir,
                     int *damaged)
{
    char tmp[PATH_MAX], final[PATH_MAX], name[64], there[PATH_MAX], err[1024];
    ckpt_tmp_name(name, sizeof(name), step, (int)getpid());
    snprintf(tmp, sizeof(tmp), "%s/%s", dir, name);
    ckpt_step_path(final, sizeof(final), dir, step);
    *damaged = 0;
    if (access(final, F_OK) == 0) {
        fprintf(stderr, "ctitan ckpt fetch: %s exists: not writing over it\n", final);
        return 1;
    }
    if (mkdir(tmp, 0755)) {
        fprintf(stderr, "ctitan ckpt fetch: %s: %s\n", tmp, strerror(errno));
        return 1;
    }
    double t0 = util_now();
    int rc = rmt_client_fetch_dir(c, job, step, tmp, there, sizeof(there), 60000, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "ctitan ckpt fetch: step %lld of job %s%s: %s\n", (long long)step, job,
                rc == -EBADMSG ? " as the storage host holds it does not verify" : "", err);
        *damaged = rc == -EBADMSG || rc == -ENOENT;
    } else if (rename(tmp, final)) {
        fprintf(stderr, "ctitan ckpt fetch: cannot rename %s to %s: %s\n", tmp, final, strerror(errno));
        rc = 1;
    }
    if (rc) {
        ckpt_remove_dir(tmp);
        return 1;
    }
    double secs = util_now() - t0;
    uint64_t bytes = 0;
    ckpt_t *ck;
    if (ckpt_open(&ck, final, err, sizeof(err)) == 0) {
        for (int f = 0; f < ckpt_index(ck)->n_files; f++)
            bytes += ckpt_index(ck)->files[f].bytes;
        ckpt_close(&ck);
    }
    char size[32];
    human_bytes(size, sizeof(size), bytes);
    printf("fetched step %lld of job %s from %s (%s there) into %s: %s in %.2f s, verified\n", (long long)step, job,
           endpoint, there, final, size, secs);
    return 0;
}

static int ckpt_fetch(int argc, char **argv)
{
    enum { F_OUT, F_SERVER, F_CLIENT, F_STEP, F_N };
    const char *pos[2], *vals[F_N] = {NULL};
    int set[F_N] = {0}, npos;
    static const char *const flags[] = {"--out=", "--server-key=", "--client-key=", "--step=", NULL};
    int rc = parse(argc, argv, usage_fetch, pos, 2, &npos, flags, vals, set);
    if (rc)
        return rc < 0 ? show_help(usage_fetch) : rc;
    if (npos != 2)
        return bad_usage(usage_fetch, "fetch needs the storage host's ENDPOINT and the JOB");
    if (!vals[F_OUT] || !vals[F_SERVER] || !vals[F_CLIENT])
        return bad_usage(usage_fetch, "fetch needs --out, --server-key and --client-key");
    if (!ckpt_safe_name(pos[1]))
        return bad_usage(usage_fetch, "JOB '%s' is not a job name (A-Z a-z 0-9 . _ -, not starting with '.')", pos[1]);
    char *end = NULL;
    long long want = vals[F_STEP] ? strtoll(vals[F_STEP], &end, 10) : -1;
    if (vals[F_STEP] && (!*vals[F_STEP] || *end || want < 0 || want > CKPT_STEP_MAX))
        return bad_usage(usage_fetch, "--step '%s' is not a step (0 to %d)", vals[F_STEP], CKPT_STEP_MAX);
    const char *endpoint = pos[0], *job = pos[1], *dir = vals[F_OUT];
    char err[1024];
    if ((rc = util_mkdirs(dir))) {
        fprintf(stderr, "ctitan ckpt fetch: %s: %s\n", dir, strerror(-rc));
        return 1;
    }
    rmt_client_t *c;
    if (rmt_client_new(&c, endpoint, vals[F_SERVER], vals[F_CLIENT], err, sizeof(err))) {
        fprintf(stderr, "ctitan ckpt fetch: %s\n", err);
        return 1;
    }
    int64_t steps[RMT_LIST_MAX];
    int n = 0, damaged = 0;
    if (want >= 0) {
        rc = fetch_one(c, endpoint, job, want, dir, &damaged);
    } else if (rmt_client_list(c, job, steps, &n, 30000, err, sizeof(err))) {
        fprintf(stderr, "ctitan ckpt fetch: cannot ask %s what it holds of job %s: %s\n", endpoint, job, err);
        rc = 1;
    } else if (n == 0) {
        fprintf(stderr, "ctitan ckpt fetch: %s holds no checkpoint of job %s\n", endpoint, job);
        rc = 1;
    } else { /* its newest that verifies */
        rc = 1;
        for (int i = 0; i < n && i < RMT_LIST_MAX && rc; i++)
            if ((rc = fetch_one(c, endpoint, job, steps[i], dir, &damaged)) && !damaged)
                break;
            else if (rc && i + 1 < n && i + 1 < RMT_LIST_MAX)
                fprintf(stderr, "ctitan ckpt fetch: trying step %lld, the next older\n", (long long)steps[i + 1]);
    }
    rmt_client_destroy(&c);
    return rc ? 1 : 0;
}

/* ---- keygen ---- */

static int ckpt_keygen(int argc, char **argv)
{
    const char *pos[1];
    int npos, rc = parse(argc, argv, usage_keygen, pos, 1, &npos, NULL, NULL, NULL);
    if (rc)
        return rc < 0 ? show_help(usage_keygen) : rc;
    if (npos != 1 || !pos[0][0])
        return bad_usage(usage_keygen, "keygen needs the PREFIX of the key files");
    const char *prefix = pos[0];
    char key[PATH_MAX], pub[PATH_MAX];
    snprintf(key, sizeof(key), "%s.key", prefix);
    snprintf(pub, sizeof(pub), "%s.pub", prefix);
    /* a key in use is never replaced by accident: losing it locks trainers out */
    const char *exists = access(key, F_OK) == 0 ? key : access(pub, F_OK) == 0 ? pub : NULL;
    if (exists) {
        fprintf(stderr, "ctitan ckpt keygen: %s exists: not overwriting a key (remove it first for a new pair)\n",
                exists);
        return 1;
    }
    char err[1024], z85[KEYS_Z85 + 1];
    if ((rc = keys_gen(prefix, err, sizeof(err))) || (rc = keys_load_one(pub, z85, err, sizeof(err)))) {
        fprintf(stderr, "ctitan ckpt keygen: %s\n", err);
        return 1;
    }
    printf("%s\n", z85);
    fprintf(stderr, "wrote %s (secret, mode 0600) and %s (public key above)\n", key, pub);
    return 0;
}

int cmd_ckpt(int argc, char **argv)
{
    if (argc < 2 || is_help(argv[1])) {
        fputs(usage_main, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "ls"))
        return ckpt_ls(argc - 1, argv + 1);
    if (!strcmp(sub, "verify"))
        return ckpt_verify_cmd(argc - 1, argv + 1);
    if (!strcmp(sub, "export"))
        return ckpt_export(argc - 1, argv + 1);
    if (!strcmp(sub, "keygen"))
        return ckpt_keygen(argc - 1, argv + 1);
    if (!strcmp(sub, "import"))
        return cmd_ckpt_import(argc - 1, argv + 1);
    if (!strcmp(sub, "fetch"))
        return ckpt_fetch(argc - 1, argv + 1);
    return bad_usage(usage_main, "unknown command 'ckpt %s'", sub);
}
