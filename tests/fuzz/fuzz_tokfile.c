/* libFuzzer harness: the token file reader (stages/data/tokfile.h tokfile_open), ctitan's format and
 * llm.c's, on the bytes of a memfd. An opened file's tokens must all be readable and, when a
 * vocabulary was given or recorded, below it. */
#include "stages/data/tokfile.h"
#include "tests/fuzz/fuzz.h"

static void open_checked(const char *path, size_t size, int vocab)
{
    char err[512];
    tokfile_t *tf;
    if (tokfile_open(&tf, path, vocab, err, sizeof(err)))
        return;
    size_t n = tokfile_count(tf);
    int hv = tokfile_vocab_size(tf);
    FUZZ_CHECK(n <= size, "%zu tokens in %zu bytes", n, size);
    for (size_t i = 0; i < n; i++) {
        uint32_t t = tokfile_get(tf, i);
        FUZZ_CHECK(vocab <= 0 || t < (uint32_t)vocab, "token %zu = %u, vocab %d", i, t, vocab);
        FUZZ_CHECK(hv <= 0 || t < (uint32_t)hv, "token %zu = %u, header vocab %d", i, t, hv);
    }
    int32_t tail[4];
    if (n >= 4)
        FUZZ_CHECK(tokfile_read(tf, n - 4, 4, tail) == 0, "the last 4 tokens");
    FUZZ_CHECK(tokfile_read(tf, n, 1, tail) != 0, "a read past the end");
    tokfile_close(&tf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    if (!path)
        return 0;
    open_checked(path, size, 0);
    open_checked(path, size, 300);
    return 0;
}
