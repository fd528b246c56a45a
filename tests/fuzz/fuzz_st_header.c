/* libFuzzer harness: a safetensors file's header (checkpointd/st_read.h st_parse), read before
 * any byte of an imported model's data is believed. The input is the whole file. Every tensor
 * accepted must lie inside the file's data, hold exactly its shape's bytes, and share no byte
 * with another. */
#include <stdlib.h>
#include <string.h>

#include "checkpointd/st_read.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    st_tensor_t *t = NULL;
    int n = 0;
    if (st_parse(data, size, size, "fuzz.safetensors", &t, &n, err, sizeof(err)))
        return 0;
    uint64_t hn = 0;
    memcpy(&hn, data, 8);
    for (int i = 0; i < n; i++) {
        size_t esz = st_dtype_size(t[i].dtype);
        FUZZ_CHECK(esz && t[i].bytes == t[i].numel * esz, "%s: %llu bytes for %llu elements of %s", t[i].name,
                   (unsigned long long)t[i].bytes, (unsigned long long)t[i].numel, t[i].dtype);
        FUZZ_CHECK(t[i].offset >= 8 + hn && t[i].offset + t[i].bytes <= size, "%s: [%llu, +%llu) outside the data",
                   t[i].name, (unsigned long long)t[i].offset, (unsigned long long)t[i].bytes);
        for (int j = 0; j < i; j++)
            FUZZ_CHECK(!t[i].bytes || !t[j].bytes || t[i].offset >= t[j].offset + t[j].bytes ||
                       t[j].offset >= t[i].offset + t[i].bytes, "%s and %s overlap", t[i].name, t[j].name);
    }
    free(t);
    return 0;
}
