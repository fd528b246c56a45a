/* libFuzzer harness: a Hugging Face config.json (checkpointd/hf_config.h hf_config_parse). An
 * accepted one must describe a model config_validate takes, as it stands. The same text as a
 * generation_config.json (hf_eos_parse): what it accepts is at most HF_EOS_MAX ids below the
 * vocabulary, and none without the key. */
#include <string.h>

#include "checkpointd/hf_config.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    int ids[HF_EOS_MAX], n = -1, found = -1, vocab = 128256; /* Llama 3's */
    if (!hf_eos_parse((const char *)data, size, "generation_config.json", vocab, ids, &n, &found, err, sizeof(err))) {
        FUZZ_CHECK(n >= 0 && n <= HF_EOS_MAX && (found || n == 0), "%d ids, found %d", n, found);
        for (int i = 0; i < n; i++)
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "id %d of %d: %d", i, n, ids[i]);
    } else {
        FUZZ_CHECK(n == 0, "%d ids after a refusal", n);
    }
    hf_config_t h;
    if (hf_config_parse((const char *)data, size, "config.json", &h, err, sizeof(err)))
        return 0;
    model_config_t c = h.model;
    FUZZ_CHECK(config_validate(&c, err, sizeof(err)) == 0, "an accepted config does not validate: %s", err);
    FUZZ_CHECK(!memcmp(&c, &h.model, sizeof(c)), "validation changed an accepted config");
    FUZZ_CHECK(h.tied == 0 || h.tied == 1, "tied %d", h.tied);
    return 0;
}
