/* What fuzz_fetch and fuzz_stream share: a fetch's parts read from the fuzzer's input, and the
 * small checkpoint behind them (two tensors of 4 floats, AdamW's three arrays, step 5: an
 * index whose chunk checksums are those of zeros, data files of a real header then zeros).
 * The input is a list of parts, each 12 bytes then its payload:
 *   file (1), flags (1), size (4, LE), offset (4, LE), n (2, LE), then n bytes unless FILL
 *   flags: TRUE_SIZE: the file's real size instead of `size` (the index's length for file 0,
 *          the index's size of data file K - 1); AT_GOT: the offset is where the file stands
 *          instead of `offset`; FILL: no bytes follow, the payload is n bytes of the real file
 *          from that offset, n 0 meaning up to its end; DONE: the server's ok comes after it.
 * so that mutations get past the index's checksum into the rules for the data. Header-only. */
#ifndef CTITAN_FETCH_PARTS_H
#define CTITAN_FETCH_PARTS_H

#include <string.h>

#include "checkpointd/remote_int.h"
#include "kernels/optim.h"
#include "tests/fuzz/fuzz.h"

enum { TRUE_SIZE = 1, AT_GOT = 2, FILL = 4, DONE = 8 };

typedef struct {
    param_info_t t[2];
    param_table_t tab;
    ckpt_index_t ix;
    uint8_t *index; /* ix encoded */
    size_t index_n;
} fake_ckpt_t;

static void fake_ckpt_init(fake_ckpt_t *k)
{
    param_info_t t[2] = {{.name = "model.norm.weight", .kind = 0, .layer = -1, .ndim = 1, .shape = {4}, .numel = 4},
                         {.name = "lm_head.weight", .kind = 0, .layer = -1, .ndim = 2, .shape = {2, 2},
                          .offset = 4, .numel = 4}};
    memcpy(k->t, t, sizeof(t));
    k->tab = (param_table_t){.n = 2, .t = k->t, .total = 8};
    static const float zeros[8];
    FUZZ_CHECK(ckpt_index_plan(&k->ix, &k->tab, optim_find("AdamW"), 5, "", NULL, 0) == 0, "plan");
    for (int f = 0; f < k->ix.n_files; f++)
        ckpt_index_hash(&k->ix, (uint32_t)f, zeros);
    FUZZ_CHECK(ckpt_index_encode(&k->ix, &k->index, &k->index_n) == 0, "encode");
}

static uint32_t fetch_le(const uint8_t *p, int n)
{
    uint32_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Bytes [off, off + n) of the real file `file` into buf (past its end: zeros). */
static void fake_bytes(const fake_ckpt_t *k, uint32_t file, uint64_t off, uint8_t *buf, size_t n)
{
    static uint8_t hdr[CKPT_DATA_HDR];
    memset(buf, 0, n);
    if (file == 0) {
        if (off < k->index_n)
            memcpy(buf, k->index + off, k->index_n - off < n ? k->index_n - off : n);
        return;
    }
    ckpt_data_header(hdr, file - 1, k->ix.step);
    if (off < CKPT_DATA_HDR)
        memcpy(buf, hdr + off, CKPT_DATA_HDR - off < n ? CKPT_DATA_HDR - off : n);
}

/* Feeds the input's parts into F until one is refused (its error), the input ends (0), or a
 * DONE part went in (0, *done = 1: the caller sends the server's ok, rmt_fetch_done). After
 * each part, after(arg) when given. */
static int feed_parts(rmt_fetch_t *F, const fake_ckpt_t *k, const uint8_t *data, size_t size, int *done,
                      void (*after)(void *), void *arg, char *err, size_t errlen)
{
    static uint8_t fill[1 << 16];
    int rc = 0;
    size_t at = 0;
    *done = 0;
    while (!rc && !*done && size - at >= 12) {
        const uint8_t *r = data + at;
        uint8_t flags = r[1];
        rmt_hdr_t h = {.type = RMT_PART, .file = r[0], .size = fetch_le(r + 2, 4), .offset = fetch_le(r + 6, 4)};
        size_t n = fetch_le(r + 10, 2);
        at += 12;
        if (flags & TRUE_SIZE)
            h.size = h.file == 0 ? k->index_n : h.file <= (uint32_t)k->ix.n_files ? k->ix.files[h.file - 1].bytes : 0;
        if (flags & AT_GOT)
            h.offset = F->any && h.file == F->file ? F->got : 0;
        const uint8_t *payload;
        if (flags & FILL) {
            uint64_t end = h.file == 0 ? k->index_n : h.size;
            n = n ? n : (size_t)(end > h.offset ? end - h.offset : 0);
            if (n > sizeof(fill))
                n = sizeof(fill);
            fake_bytes(k, h.file, h.offset, fill, n);
            payload = fill;
        } else {
            if (n > size - at)
                n = size - at;
            payload = data + at;
            at += n;
        }
        rc = rmt_fetch_part(F, &h, payload, n, err, errlen);
        if (after)
            after(arg);
        *done = !rc && (flags & DONE);
    }
    return rc;
}

#endif
