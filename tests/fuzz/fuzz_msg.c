/* libFuzzer harness: the control-plane message decoder (ipc/msg.h msg_decode), what every
 * process runs on whatever reaches its ZeroMQ socket. Accepted messages must re-encode, and
 * the encoding must decode back to the same encoding (msg_encode's form is canonical). */
#include <errno.h>
#include <string.h>

#include "ipc/msg.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    msg_t m;
    if (msg_decode(data, size, &m, err, sizeof(err)))
        return 0;
    FUZZ_CHECK(msg_type_name(m.type) != NULL, "type %d", (int)m.type);
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int rc = msg_encode(&m, &a, &na);
    /* floats sent as float32 widen to float64: an accepted message near the limit may not fit */
    FUZZ_CHECK(rc == 0 || rc == -EMSGSIZE, "msg_encode of a decoded %s: %d", msg_type_name(m.type), rc);
    if (rc == 0) {
        msg_t m2;
        rc = msg_decode(a, na, &m2, err, sizeof(err));
        FUZZ_CHECK(rc == 0, "%s re-encoded does not decode: %s", msg_type_name(m.type), err);
        FUZZ_CHECK(msg_encode(&m2, &b, &nb) == 0, "second encoding of %s", msg_type_name(m.type));
        FUZZ_CHECK(na == nb && !memcmp(a, b, na), "%s: the encoding changes on a round trip", msg_type_name(m.type));
        msg_clear(&m2);
    }
    free(a);
    free(b);
    msg_clear(&m);
    return 0;
}
