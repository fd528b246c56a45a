/* ctitan-loader: the built-in data loader. Reads token files (ctitan's or llm.c's; one file or
 * a glob pattern such as "data/fineweb_train_*.bin", files in sorted order) and fills the
 * batch rings with [seqs, seq_len] inputs and next-token targets through stages/runtime/ldr.h.
 * The files' whole windows of T+1 tokens (file f's window i starts at its token i*T) are
 * numbered across the files in order; sequence k of the run reads window k mod W
 * (sequential) or a seeded permutation of it per epoch k / W (shuffle), W the total.
 * Its cursor is {"sample": k}. */
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stages/runtime/ldr.h"
#include "stages/data/tokfile.h"

typedef struct {
    tokfile_t **files;
    uint64_t *first;   /* (n + 1) global index of each file's first window; first[n] = W */
    size_t n;
} shards_t;

static void shards_close(shards_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        tokfile_close(&s->files[i]);
    free(s->files);
    free(s->first);
}

static int shards_open(shards_t *s, const char *pattern, int vocab, uint64_t T, char *err, size_t errlen)
{
    glob_t g;
    int rc = glob(pattern, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        snprintf(err, errlen, "loader.dataset_path %s: no such file", pattern);
        return -ENOENT;
    }
    if (rc) {
        snprintf(err, errlen, "loader.dataset_path %s: cannot list the files", pattern);
        return -EIO;
    }
    s->files = calloc(g.gl_pathc, sizeof(*s->files));
    s->first = calloc(g.gl_pathc + 1, sizeof(*s->first));
    rc = s->files && s->first ? 0 : -ENOMEM;
    for (size_t i = 0; !rc && i < g.gl_pathc; i++) {
        if ((rc = tokfile_open(&s->files[i], g.gl_pathv[i], vocab, err, errlen)))
            break;
        size_t count = tokfile_count(s->files[i]);
        s->first[i + 1] = s->first[i] + (count > T ? (count - 1) / T : 0);
        s->n = i + 1;
    }
    if (!rc && s->first[s->n] == 0) {
        snprintf(err, errlen, "loader.dataset_path %s: no file holds seq_len + 1 = %llu tokens", pattern,
                 (unsigned long long)T + 1);
        rc = -EINVAL;
    }
    globfree(&g);
    return rc;
}

/* Reads global window w into window[0..T]. */
static void shards_read(const shards_t *s, uint64_t w, uint64_t T, int32_t *window)
{
    size_t lo = 0, hi = s->n - 1; /* the last file whose first window is <= w */
    while (lo < hi) {
        size_t mid = (lo + hi + 1) / 2;
        if (s->first[mid] <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    tokfile_read(s->files[lo], (w - s->first[lo]) * T, T + 1, window);
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    ldr_t *l = NULL;
    char err[1024];
    if (ldr_open(&l, err, sizeof(err))) {
        fprintf(stderr, "ctitan-loader: %s\n", err);
        return 1;
    }
    const ldr_info_t *in = ldr_info(l);
    uint64_t T = (uint64_t)in->seq_len, k = 0;
    shards_t sh = {0};
    int rc = 1;
    int32_t *window = malloc((T + 1) * sizeof(int32_t));
    if (!window) {
        ldr_fail(l, "out of memory");
        goto out;
    }
    if (shards_open(&sh, in->dataset_path, in->vocab_size, T, err, sizeof(err))) {
        ldr_fail(l, err);
        goto out;
    }
    uint64_t W = sh.first[sh.n];
    size_t clen;
    const uint8_t *cur = ldr_cursor(l, &clen);
    int crc = clen ? ldr_cursor_get(cur, clen, "sample", &k) : 0;
    if (crc) {
        ldr_fail(l, crc == -ENOENT ? "the resume cursor has no \"sample\" key: it comes from a loader of another kind"
                                   : "the resume cursor's \"sample\" is not an unsigned integer (stages/runtime/ldr.h)");
        goto out;
    }
    ldr_batch_t b;
    while (ldr_next(l, &b) == 0) {
        for (int q = 0; q < b.seqs; q++, k++) {
            uint64_t epoch = k / W, i = k % W;
            shards_read(&sh, in->shuffle ? ldr_shuffle(in->seed, epoch, W, i) : i, T, window);
            memcpy(b.tokens + (size_t)q * T, window, T * sizeof(int32_t));
            memcpy(b.targets + (size_t)q * T, window + 1, T * sizeof(int32_t));
        }
        uint8_t next[32];
        const char *key = "sample";
        ldr_commit(l, next, ldr_cursor_pack(next, sizeof(next), 1, &key, &k));
    }
    rc = 0;
out:
    free(window);
    shards_close(&sh);
    ldr_close(&l);
    return rc;
}
