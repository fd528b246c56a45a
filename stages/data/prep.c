/* `ctitan prep` as a library (see stages/data/prep.h): text files in, tokenizer and token shards
 * out. Outputs are written under temp names and renamed into place only once all three are
 * complete, so a failed run leaves the output directory as it was. */
#include "stages/data/prep.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "stages/data/corpus.h"
#include "stages/data/tokenizer.h"
#include "stages/data/tokfile.h"
#include "ipc/util.h"

void prep_defaults(prep_opts_t *o)
{
    *o = (prep_opts_t){
        .vocab_size = PREP_DEFAULT_VOCAB,
        .out_dir = PREP_DEFAULT_OUT,
        .val_fraction = PREP_DEFAULT_VAL_FRACTION,
        .corpus_dir = PREP_FORTUNES_DIR,
    };
}

void prep_usage(FILE *f)
{
    fprintf(f,
            "usage: ctitan prep [--vocab N | --tokenizer PATH] [--out DIR] [--val-fraction F] [--field NAME]\n"
            "                   [FILE ...]\n"
            "\n"
            "Trains a byte-level BPE tokenizer on the text FILEs (default: the plain files of\n"
            "the Debian `fortunes` package in %s) and writes\n"
            "DIR/tokenizer.bin, DIR/train.bin and DIR/val.bin.\n"
            "\n"
            "  --vocab N          vocabulary size, %d..%d (default %d)\n"
            "  --tokenizer PATH   encode with this tokenizer instead of training one: a\n"
            "                     tokenizer.bin or a Hugging Face tokenizer.json (then written\n"
            "                     as DIR/tokenizer.json, with the tokenizer_config.json beside it)\n"
            "  --out DIR          output directory, created if missing (default %s)\n"
            "  --val-fraction F   the last F of the tokens go to val.bin, 0 <= F < 1 "
            "(default %.2f)\n"
            "  --field NAME       the document's field in JSON Lines files (default text)\n"
            "  --help             this text\n"
            "\n"
            "A FILE may be a quoted glob ('data/*.jsonl.gz'), gzip-compressed or not; JSON Lines\n"
            "files (*.jsonl, *.ndjson) give their documents a line each.\n"
            "\n"
            "Exit status: 0 done, 1 runtime error (unreadable file, write failure), 2 usage "
            "error.\n",
            PREP_FORTUNES_DIR, TOK_MIN_VOCAB, TOK_MAX_VOCAB, PREP_DEFAULT_VOCAB, PREP_DEFAULT_OUT,
            PREP_DEFAULT_VAL_FRACTION);
}

int prep_parse_args(int argc, char **argv, prep_opts_t *o, char *err, size_t errlen)
{
    prep_defaults(o);
    int i = 1, first_file = argc;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            first_file = i + 1;
            break;
        }
        if (a[0] != '-' || !a[1]) { /* a file ("-" alone is a file name too) */
            first_file = i;
            break;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        const char *names[] = {"--vocab", "--out", "--val-fraction", "--field", "--tokenizer"};
        int which = -1;
        const char *val = NULL;
        for (int k = 0; k < 5; k++) {
            size_t l = strlen(names[k]);
            if (!strncmp(a, names[k], l) && (a[l] == '\0' || a[l] == '=')) {
                which = k;
                val = a[l] == '=' ? a + l + 1 : NULL;
            }
        }
        if (which < 0) return util_fail(err, errlen, -EINVAL, "unknown option '%s'", a);
        if (!val) {
            if (i + 1 >= argc)
                return util_fail(err, errlen, -EINVAL, "%s needs a value", names[which]);
            val = argv[++i];
        }
        char *end;
        errno = 0;
        if (which == 0) {
            long v = strtol(val, &end, 10);
            if (errno || end == val || *end || v < TOK_MIN_VOCAB || v > TOK_MAX_VOCAB)
                return util_fail(err, errlen, -EINVAL,
                            "--vocab '%s': expected an integer in [%d, %d]", val, TOK_MIN_VOCAB,
                            TOK_MAX_VOCAB);
            o->vocab_size = (int)v;
        } else if (which == 4) {
            if (!*val) return util_fail(err, errlen, -EINVAL, "--tokenizer: empty path");
            o->tokenizer = val;
        } else if (which == 1) {
            if (!*val) return util_fail(err, errlen, -EINVAL, "--out: empty directory name");
            o->out_dir = val;
        } else if (which == 3) {
            if (!*val) return util_fail(err, errlen, -EINVAL, "--field: empty field name");
            o->field = val;
        } else {
            double v = strtod(val, &end);
            if (errno || end == val || *end || !(v >= 0.0 && v < 1.0))
                return util_fail(err, errlen, -EINVAL,
                            "--val-fraction '%s': expected a number with 0 <= F < 1", val);
            o->val_fraction = v;
        }
    }
    o->files = (const char *const *)argv + first_file;
    o->n_files = (size_t)(argc - first_file);
    return 0;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int prep_list_corpus(const char *dir, char ***files, size_t *n, char *err, size_t errlen)
{
    *files = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return util_fail(err, errlen, -errno,
                    "%s: %s; the default corpus is the Debian package `fortunes` (install it: "
                    "apt-get install fortunes), or name text files to read",
                    dir, strerror(errno));
    size_t cnt = 0, cap = 0, bytes = 0;
    char **names = NULL;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] == '.' || (l >= 4 && !strcmp(e->d_name + l - 4, ".dat"))) continue;
        char path[PATH_MAX];
        struct stat st;
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path)) continue;
        if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode)) continue; /* *.u8 links, off/ */
        if (cnt == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof(char *));
            if (!nn) {
                rc = -ENOMEM;
                break;
            }
            names = nn;
        }
        if (!(names[cnt] = strdup(path))) {
            rc = -ENOMEM;
            break;
        }
        bytes += strlen(path) + 1;
        cnt++;
    }
    closedir(d);
    if (!rc && cnt == 0)
        rc = util_fail(err, errlen, -ENOENT,
                  "%s: no text files in it; the default corpus is the Debian package `fortunes` "
                  "(install it: apt-get install fortunes), or name text files to read",
                  dir);
    /* repack into one block so the caller frees once */
    char **block = NULL;
    if (!rc) {
        block = malloc(cnt * sizeof(char *) + bytes);
        if (!block) rc = -ENOMEM;
    }
    if (!rc) {
        qsort(names, cnt, sizeof(char *), name_cmp);
        char *p = (char *)(block + cnt);
        for (size_t i = 0; i < cnt; i++) {
            size_t l = strlen(names[i]) + 1;
            memcpy(p, names[i], l);
            block[i] = p;
            p += l;
        }
        *files = block;
        *n = cnt;
    } else if (rc == -ENOMEM) {
        util_fail(err, errlen, rc, "%s: out of memory listing the directory", dir);
    }
    for (size_t i = 0; i < cnt; i++) free(names[i]);
    free(names);
    return rc;
}

/* mkdir -p that remembers the directories it made, so a failed run can remove them. */
typedef struct {
    char *made[64];
    int n;
} mkdirs_t;

static int make_dirs(const char *dir, mkdirs_t *m, char *err, size_t errlen)
{
    char p[PATH_MAX];
    if (snprintf(p, sizeof(p), "%s", dir) >= (int)sizeof(p))
        return util_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);
    size_t l = strlen(p);
    while (l > 1 && p[l - 1] == '/') p[--l] = '\0';
    for (size_t i = 1; i <= l; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) == 0) {
            if (m->n < 64) m->made[m->n++] = strdup(p);
        } else if (errno != EEXIST) {
            int e = errno;
            p[i] = c;
            return util_fail(err, errlen, -e, "%s: cannot create directory: %s", dir, strerror(e));
        }
        p[i] = c;
    }
    struct stat st;
    if (stat(p, &st) < 0 || !S_ISDIR(st.st_mode))
        return util_fail(err, errlen, -ENOTDIR, "%s: exists and is not a directory", dir);
    return 0;
}

static void undo_dirs(mkdirs_t *m, int remove)
{
    for (int i = m->n - 1; i >= 0; i--) {
        if (remove) rmdir(m->made[i]);
        free(m->made[i]);
    }
    m->n = 0;
}

static double unigram_entropy(const uint32_t *tok, size_t n, int vocab)
{
    if (!n) return 0.0;
    size_t *cnt = calloc((size_t)vocab, sizeof(size_t));
    if (!cnt) return NAN;
    for (size_t i = 0; i < n; i++) cnt[tok[i]]++;
    double h = 0;
    for (int v = 0; v < vocab; v++) {
        if (!cnt[v]) continue;
        double p = (double)cnt[v] / (double)n;
        h -= p * log(p);
    }
    free(cnt);
    return h;
}

/* The corpus: the files given, or every file of the corpus folder, back to back into *text. */
static int read_corpus(const prep_opts_t *o, prep_result_t *res, uint8_t **text, size_t *len, char *err,
                       size_t errlen)
{
    char **listed = NULL;
    const char *const *files = o->files;
    size_t n_files = o->n_files, cap = 0;
    int rc = 0;
    if (n_files == 0) {
        rc = prep_list_corpus(o->corpus_dir ? o->corpus_dir : PREP_FORTUNES_DIR, &listed, &n_files, err, errlen);
        files = (const char *const *)listed;
    }
    size_t n_read = 0;
    for (size_t i = 0; !rc && i < n_files; i++) {
        corpus_src_opts_t so = {.pattern = files[i], .field = o->field};
        rc = corpus_slurp(&so, text, len, &cap, &n_read, &res->bad_lines, err, errlen);
    }
    free(listed);
    if (rc)
        return rc;
    n_files = n_read;
    res->n_files = n_files;
    res->bytes_in = *len;
    if (*len == 0)
        return util_fail(err, errlen, -EINVAL, "no text: the %zu input file(s) are empty", n_files);
    return 0;
}

/* The tokenizer trained on text, text encoded into *tok (malloc'ed), the split and entropy. */
static int tokenize(const prep_opts_t *o, const uint8_t *text, size_t len, prep_result_t *res, tok_t **tk,
                    uint32_t **tok, char *err, size_t errlen)
{
    double t1 = util_now();
    char terr[512];
    int rc = o->tokenizer ? tok_load(tk, o->tokenizer, terr, sizeof(terr))
                          : tok_train(tk, text, len, o->vocab_size, terr, sizeof(terr));
    if (rc)
        return util_fail(err, errlen, rc, "%s the tokenizer: %s", o->tokenizer ? "loading" : "training", terr);
    double t2 = util_now();
    res->secs_train = t2 - t1;
    res->vocab_size = tok_vocab_size(*tk);
    size_t cap = tok_max_tokens(*tk, len);
    if (!(*tok = malloc((cap ? cap : 1) * sizeof(uint32_t))))
        return util_fail(err, errlen, -ENOMEM, "out of memory for %zu tokens", cap);
    if ((rc = tok_encode_cap(*tk, text, len, *tok, cap, &res->n_tokens)))
        return util_fail(err, errlen, rc, "encoding the corpus: %s", strerror(-rc));
    res->n_val = (size_t)llround(o->val_fraction * (double)res->n_tokens);
    res->n_train = res->n_tokens - res->n_val;
    if (res->n_train == 0)
        return util_fail(err, errlen, -EINVAL, "val fraction %g leaves no training tokens out of %zu",
                         o->val_fraction, res->n_tokens);
    res->entropy = unigram_entropy(*tok, res->n_tokens, res->vocab_size);
    res->secs_encode = util_now() - t2;
    return 0;
}

/* The tokenizer_config.json beside a --tokenizer tokenizer.json (its BOS and EOS), copied to tmp;
 * 0 when there is none to copy. */
static int copy_tokenizer_config(const prep_opts_t *o, const tok_t *tk, const char *tmp, int *copied, char *err,
                                 size_t errlen)
{
    char src[PATH_MAX], dir[PATH_MAX];
    struct stat st;
    *copied = 0;
    if (!o->tokenizer || strcmp(tok_file_name(tk), "tokenizer.json"))
        return 0;
    snprintf(dir, sizeof(dir), "%s", o->tokenizer);
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) { /* a file: its folder */
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof(dir), ".");
    }
    if (snprintf(src, sizeof(src), "%s/tokenizer_config.json", dir[0] ? dir : "/") >= (int)sizeof(src) ||
        stat(src, &st) || !S_ISREG(st.st_mode))
        return 0;
    char *text = NULL;
    size_t len = 0;
    int rc = util_read_file(src, 1 << 24, "tokenizer_config.json", &text, &len, err, errlen);
    if (!rc)
        rc = tokfile_write_bytes(tmp, text, len, NULL, 0, err, errlen);
    *copied = rc == 0;
    free(text);
    return rc;
}

/* The tokenizer (tokenizer.bin, or a --tokenizer tokenizer.json with the tokenizer_config.json
 * beside it), train.bin and val.bin into out_dir as a set: each written to a temporary file
 * first, then all renamed; on failure the temporaries go and the old set stays. */
static int write_outputs(const prep_opts_t *o, const tok_t *tk, const uint32_t *tok, const prep_result_t *res,
                         char *err, size_t errlen)
{
    enum { N_OUT = 4 };
    const char *names[N_OUT] = {tok_file_name(tk), "train.bin", "val.bin", "tokenizer_config.json"};
    char tmp[N_OUT][PATH_MAX], fin[N_OUT][PATH_MAX];
    int written = 0, rc = 0, n_out = 3, config = 0;
    for (int k = 0; k < N_OUT; k++) {
        if (snprintf(fin[k], PATH_MAX, "%s/%s", o->out_dir, names[k]) >= PATH_MAX ||
            snprintf(tmp[k], PATH_MAX, "%s/.%s.prep-%d", o->out_dir, names[k], (int)getpid()) >= PATH_MAX)
            return util_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", o->out_dir);
    }
    if ((rc = tok_save(tk, tmp[0], err, errlen))) goto out;
    written = 1;
    if ((rc = tokfile_write(tmp[1], tok, res->n_train, res->vocab_size, err, errlen))) goto out;
    written = 2;
    if ((rc = tokfile_write(tmp[2], tok + res->n_train, res->n_val, res->vocab_size, err, errlen))) goto out;
    written = 3;
    if ((rc = copy_tokenizer_config(o, tk, tmp[3], &config, err, errlen))) goto out;
    written = n_out = 3 + config;
    /* Renames are atomic one by one, not as a set: catch what would make one fail before
     * the first happens (a folder in the way) so the old set stays whole. */
    for (int k = 0; k < n_out; k++) {
        struct stat st;
        if (lstat(fin[k], &st) == 0 && S_ISDIR(st.st_mode)) {
            rc = util_fail(err, errlen, -EISDIR, "%s: is a directory, cannot replace it", fin[k]);
            goto out;
        }
    }
    for (int k = 0; k < n_out; k++)
        if (rename(tmp[k], fin[k]) < 0) {
            rc = util_fail(err, errlen, -errno, "%s: rename from %s failed: %s", fin[k], tmp[k], strerror(errno));
            goto out;
        }
    written = 0;
    int dfd = open(o->out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
out:
    for (int k = 0; k < written; k++) unlink(tmp[k]); /* renamed ones are gone already */
    return rc;
}

int prep_run(const prep_opts_t *o, prep_result_t *res, char *err, size_t errlen)
{
    double t0 = util_now();
    memset(res, 0, sizeof(*res));
    if (o->vocab_size < TOK_MIN_VOCAB || o->vocab_size > TOK_MAX_VOCAB)
        return util_fail(err, errlen, -EINVAL, "vocab size %d is outside [%d, %d]", o->vocab_size,
                    TOK_MIN_VOCAB, TOK_MAX_VOCAB);
    if (!(o->val_fraction >= 0.0 && o->val_fraction < 1.0))
        return util_fail(err, errlen, -EINVAL, "val fraction %g is outside [0, 1)", o->val_fraction);
    if (!o->out_dir || !*o->out_dir)
        return util_fail(err, errlen, -EINVAL, "no output directory given");

    uint8_t *text = NULL;
    size_t len = 0;
    uint32_t *tok = NULL;
    tok_t *tk = NULL;
    mkdirs_t made = {.n = 0};
    int rc = read_corpus(o, res, &text, &len, err, errlen);
    res->secs_read = util_now() - t0;
    if (!rc)
        rc = tokenize(o, text, len, res, &tk, &tok, err, errlen);
    double t3 = util_now();
    if (!rc && !(rc = make_dirs(o->out_dir, &made, err, errlen)))
        rc = write_outputs(o, tk, tok, res, err, errlen);
    if (!rc) {
        double t4 = util_now();
        res->secs_write = t4 - t3;
        res->secs_total = t4 - t0;
    }
    undo_dirs(&made, rc != 0);
    tok_destroy(&tk);
    free(tok);
    free(text);
    return rc;
}
