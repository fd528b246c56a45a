/* libFuzzer harness: a part's checksum file (checkpointd/ckpt.h ckpt_part_sums_decode), which the
 * committing host reads from a folder other machines wrote. The first byte picks the form: even,
 * the rest is the file without its trailing XXH64 and the harness appends it, so that mutations
 * get past the checksum to the fields; odd, the rest is decoded as it is. An accepted file's
 * fields are in range and it encodes back to exactly its own bytes (nothing in it unchecked). */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "checkpointd/ckpt.h"
#include "tests/fuzz/fuzz.h"

static void decode_checked(const uint8_t *data, size_t size)
{
    char err[512];
    ckpt_part_sums_t ps;
    if (ckpt_part_sums_decode(data, size, &ps, "fuzz", err, sizeof(err)))
        return;
    FUZZ_CHECK(ps.step >= 0 && ps.step <= CKPT_STEP_MAX, "step %lld", (long long)ps.step);
    FUZZ_CHECK(ps.n_parts >= 1 && ps.n_parts <= CKPT_PARTS_MAX && ps.part < ps.n_parts, "part %u of %u", ps.part,
               ps.n_parts);
    FUZZ_CHECK(ckpt_part_sums_bytes(ps.count) == size, "%llu checksums in %zu bytes", (unsigned long long)ps.count,
               size);
    uint8_t *buf;
    size_t len;
    FUZZ_CHECK(ckpt_part_sums_encode(&ps, &buf, &len) == 0, "cannot encode");
    FUZZ_CHECK(len == size && !memcmp(buf, data, size), "re-encoded as %zu other bytes", len);
    free(buf);
    ckpt_part_sums_free(&ps);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1) {
        decode_checked(data + 1, size - 1);
        return 0;
    }
    size_t n = size - 1;
    uint8_t *buf = malloc(n + 8);
    if (!buf)
        return 0;
    if (n)
        memcpy(buf, data + 1, n);
    uint64_t sum = XXH64(buf, n, 0);
    memcpy(buf + n, &sum, 8);
    decode_checked(buf, n + 8);
    free(buf);
    return 0;
}
