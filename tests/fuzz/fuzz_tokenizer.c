/* libFuzzer harness: the tokenizer file reader (stages/data/tokenizer.h tok_load), on the bytes of a
 * memfd. The first byte picks the form: even, the harness writes the merge table's XXH64 into
 * the header (offset 24) so that mutations get past the checksum; odd, the rest is read as it
 * is. A loaded tokenizer must encode and decode the input's own bytes back to themselves. */
#include <string.h>
#include <xxhash.h>

#include "stages/data/tokenizer.h"
#include "tests/fuzz/fuzz.h"

static void load_checked(const uint8_t *file, size_t size)
{
    char err[512];
    tok_t *t;
    size_t i = 0;
    while (i < size && (file[i] == ' ' || file[i] == '\t' || file[i] == '\n' || file[i] == '\r')) i++;
    if (i < size && file[i] == '{')
        return; /* a tokenizer.json: fuzz_hftok's, whose round trip has exceptions (lstrip, prefix) */
    const char *path = fuzz_file(file, size);
    if (!path || tok_load(&t, path, err, sizeof(err)))
        return;
    int V = tok_vocab_size(t);
    FUZZ_CHECK(V >= TOK_MIN_VOCAB && V <= TOK_MAX_VOCAB, "vocab %d", V);
    uint32_t *tok = malloc((size + 1) * sizeof(*tok));
    uint8_t *back = NULL;
    size_t n = 0, nb = 0;
    if (tok && tok_encode(t, file, size, tok, &n) == 0) {
        FUZZ_CHECK(n <= size, "%zu tokens for %zu bytes", n, size);
        FUZZ_CHECK(tok_decode(t, tok, n, &back, &nb) == 0, "decoding what was encoded");
        FUZZ_CHECK(nb == size && !memcmp(back, file, size), "decode(encode(x)) != x");
    }
    free(back);
    free(tok);
    tok_destroy(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if ((data[0] & 1) || size - 1 < 32) {
        load_checked(data + 1, size - 1);
        return 0;
    }
    uint8_t *buf = malloc(size - 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, size - 1);
    uint64_t sum = XXH64(buf + 32, size - 1 - 32, 0);
    memcpy(buf + 24, &sum, 8);
    load_checked(buf, size - 1);
    free(buf);
    return 0;
}
