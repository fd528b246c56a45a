/* ctitan-loader: the built-in data loader. Reads a token file (ctitan's or llm.c's) and fills
 * the batch rings with [seqs, seq_len] inputs and next-token targets through stages/ldr.h.
 * Sequence k of the run reads window w of T+1 tokens starting at token w*T, where
 * w = k mod W (sequential) or a seeded permutation of it per epoch k / W (shuffle), and W is
 * the number of whole windows in the file. Its cursor is {"sample": k}. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stages/ldr.h"
#include "tools/tokfile.h"

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
    tokfile_t *tf = NULL;
    int rc = 1;
    int32_t *window = malloc(((size_t)in->seq_len + 1) * sizeof(int32_t));
    if (!window) {
        ldr_fail(l, "out of memory");
        goto out;
    }
    if (tokfile_open(&tf, in->dataset_path, in->vocab_size, err, sizeof(err))) {
        ldr_fail(l, err);
        goto out;
    }
    uint64_t T = (uint64_t)in->seq_len;
    if (tokfile_count(tf) < T + 1) {
        snprintf(err, sizeof(err), "%s: %zu tokens, fewer than seq_len %d + 1", in->dataset_path,
                 tokfile_count(tf), in->seq_len);
        ldr_fail(l, err);
        goto out;
    }
    uint64_t W = (tokfile_count(tf) - 1) / T;
    size_t clen;
    const uint8_t *cur = ldr_cursor(l, &clen);
    uint64_t k = 0;
    if (clen && ldr_cursor_get(cur, clen, "sample", &k)) {
        ldr_fail(l, "the resume cursor has no \"sample\" key: it comes from a loader of another kind");
        goto out;
    }
    ldr_batch_t b;
    while (ldr_next(l, &b) == 0) {
        for (int q = 0; q < b.seqs; q++, k++) {
            uint64_t epoch = k / W, i = k % W;
            uint64_t w = in->shuffle ? ldr_shuffle(in->seed, epoch, W, i) : i;
            tokfile_read(tf, w * T, T + 1, window);
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
    tokfile_close(&tf);
    ldr_close(&l);
    return rc;
}
