/* libFuzzer harness: remote checkpointd's header frames (checkpointd/remote_int.h
 * rmt_hdr_decode), what the storage host reads from any trainer that passed CURVE, and what a
 * trainer reads from its storage host (replies, a fetch's parts). The first byte's low bit says
 * whether a payload frame came with the header; the rest is the header. An accepted header
 * must re-encode to one that decodes and encodes to the same bytes. */
#include <string.h>

#include "checkpointd/remote_int.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int payload = data[0] & 1;
    char err[512];
    rmt_hdr_t h, h2;
    if (rmt_hdr_decode(data + 1, size - 1, payload, &h, err, sizeof(err)))
        return 0;
    FUZZ_CHECK(h.type > RMT_NONE && h.type < RMT_TYPE_END, "type %d", (int)h.type);
    FUZZ_CHECK(!payload == !rmt_has_payload(h.type), "payload %d for %s", payload, rmt_type_name(h.type));
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    FUZZ_CHECK(rmt_hdr_encode(&h, &a, &na) == 0, "a decoded %s does not encode", rmt_type_name(h.type));
    FUZZ_CHECK(rmt_hdr_decode(a, na, payload, &h2, err, sizeof(err)) == 0, "re-encoded: %s", err);
    FUZZ_CHECK(rmt_hdr_encode(&h2, &b, &nb) == 0, "second encoding");
    FUZZ_CHECK(na == nb && !memcmp(a, b, na), "%s: the encoding changes on a round trip", rmt_type_name(h.type));
    free(a);
    free(b);
    return 0;
}
