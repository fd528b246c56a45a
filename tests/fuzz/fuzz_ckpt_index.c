/* libFuzzer harness: the checkpoint index decoder (checkpointd/ckpt.h ckpt_index_decode), run on
 * resume, by `ctitan ckpt` and on what a remote trainer sends. The first byte picks the form:
 * even, the rest is the msgpack body and the harness frames it (header, XXH64 tail) so that
 * mutations get past the checksum; odd, the rest is decoded as it is. An accepted index must
 * re-encode to an index that decodes and encodes to the same bytes. */
#include <string.h>
#include <xxhash.h>

#include "checkpointd/ckpt.h"
#include "tests/fuzz/fuzz.h"

#define HDR 24 /* magic 8, version 4, reserved 4, body length 8 (ckpt_index.c) */

static void decode_checked(const uint8_t *buf, size_t len)
{
    char err[512];
    ckpt_index_t ix, ix2;
    if (ckpt_index_decode(buf, len, &ix, "fuzz", err, sizeof(err)))
        return;
    for (int i = 0; i < ix.n_files; i++)
        FUZZ_CHECK(ckpt_safe_name(ix.files[i].name), "file name %s", ix.files[i].name);
    FUZZ_CHECK(ix.cursor_len <= CKPT_CURSOR_MAX, "cursor %u bytes", ix.cursor_len);
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    FUZZ_CHECK(ckpt_index_encode(&ix, &a, &na) == 0, "a decoded index does not encode");
    FUZZ_CHECK(ckpt_index_decode(a, na, &ix2, "re-encoded", err, sizeof(err)) == 0, "re-encoded: %s", err);
    FUZZ_CHECK(ckpt_index_encode(&ix2, &b, &nb) == 0, "second encoding");
    FUZZ_CHECK(na == nb && !memcmp(a, b, na), "the encoding changes on a round trip");
    free(a);
    free(b);
    ckpt_index_free(&ix2);
    ckpt_index_free(&ix);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1) {
        decode_checked(data + 1, size - 1);
        return 0;
    }
    size_t body = size - 1, len = HDR + body + 8;
    uint8_t *buf = malloc(len);
    if (!buf)
        return 0;
    uint32_t version = CKPT_VERSION, reserved = 0;
    uint64_t blen = body;
    memcpy(buf, CKPT_INDEX_MAGIC, 8);
    memcpy(buf + 8, &version, 4);
    memcpy(buf + 12, &reserved, 4);
    memcpy(buf + 16, &blen, 8);
    memcpy(buf + HDR, data + 1, body);
    uint64_t sum = XXH64(buf, HDR + body, 0);
    memcpy(buf + HDR + body, &sum, 8);
    decode_checked(buf, len);
    free(buf);
    return 0;
}
