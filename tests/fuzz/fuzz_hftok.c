/* libFuzzer harness: the Hugging Face tokenizer.json reader (stages/data/hftok.c, through
 * tok_load) on a memfd, then encoding and decoding. The input is the tokenizer.json text, a NUL,
 * and the text to encode (without a NUL: the same bytes are also the text). A loaded tokenizer
 * must encode any bytes within tok_max_tokens, and every id it gives must decode. */
#include <errno.h>
#include <string.h>

#include "stages/data/tokenizer.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    const uint8_t *text = nul ? nul + 1 : data;
    size_t n = nul ? size - jlen - 1 : size;
    char err[512];
    tok_t *t;
    const char *path = fuzz_file(data, jlen);
    if (!path || tok_load(&t, path, err, sizeof(err)))
        return 0;
    int V = tok_vocab_size(t);
    FUZZ_CHECK(V >= 1 && V <= TOK_MAX_VOCAB, "vocab %d", V);
    size_t cap = tok_max_tokens(t, n) + 1, nt = 0, nb = 0;
    uint32_t *ids = malloc(cap * sizeof(uint32_t));
    uint8_t *back = NULL;
    if (ids) {
        int rc = tok_encode_cap(t, text, n, ids, cap, &nt);
        FUZZ_CHECK(rc == 0 || rc == -ENOMEM, "encode: %d", rc);
        FUZZ_CHECK(nt <= cap, "%zu tokens for a room of %zu", nt, cap);
        if (rc == 0)
            FUZZ_CHECK(tok_decode(t, ids, nt, &back, &nb) == 0, "decoding what was encoded");
    }
    free(back);
    free(ids);
    tok_destroy(&t);
    return 0;
}
