/* libFuzzer harness: a loader cursor read back (stages/runtime/ldr.h ldr_cursor_get, over
 * ipc/codec.h codec_get_u64), what checkpointd reads from a checkpoint's index and a loader
 * from the batch segment. Any bytes give 0, -ENOENT or -EINVAL; a value read, packed again
 * alone, reads back the same. */
#include <errno.h>
#include <string.h>

#include "stages/runtime/ldr.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const keys[] = {"sample", "byte", "skip"};
    for (int k = 0; k < 3; k++) {
        uint64_t v = 0, w = 0;
        int rc = ldr_cursor_get(data, size, keys[k], &v);
        FUZZ_CHECK(rc == 0 || rc == -ENOENT || rc == -EINVAL, "%s: %d", keys[k], rc);
        if (rc)
            continue;
        uint8_t buf[64];
        size_t n = ldr_cursor_pack(buf, sizeof(buf), 1, &keys[k], &v);
        FUZZ_CHECK(n > 0 && ldr_cursor_get(buf, n, keys[k], &w) == 0 && w == v, "%s: %llu packed again", keys[k],
                   (unsigned long long)v);
    }
    return 0;
}
