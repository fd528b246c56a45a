/* libFuzzer harness: the checkpoint data file's 4 KiB header (checkpointd/ckpt.h
 * ckpt_data_header_read), read before any data of a checkpoint is trusted. An accepted header
 * must be byte for byte the block ckpt_data_header writes for its file and step (any damage
 * shows), and that block must read back the same. */
#include <string.h>

#include "checkpointd/ckpt.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    uint32_t file = 0, file2 = 0;
    int64_t step = 0, step2 = 0;
    if (ckpt_data_header_read(data, size, &file, &step, err, sizeof(err)))
        return 0;
    static uint8_t block[CKPT_DATA_HDR];
    ckpt_data_header(block, file, step);
    FUZZ_CHECK(size >= CKPT_DATA_HDR && !memcmp(data, block, CKPT_DATA_HDR),
               "an accepted header (file %u, step %lld) is not the one written", file, (long long)step);
    FUZZ_CHECK(ckpt_data_header_read(block, sizeof(block), &file2, &step2, err, sizeof(err)) == 0,
               "a written header does not read back: %s", err);
    FUZZ_CHECK(file == file2 && step == step2, "file %u step %lld read back as %u, %lld", file, (long long)step,
               file2, (long long)step2);
    return 0;
}
