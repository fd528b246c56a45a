/* libFuzzer harness: a Hugging Face config.json (checkpointd/hf_config.h hf_config_parse). An
 * accepted one must describe a model config_validate takes, as it stands. */
#include <string.h>

#include "checkpointd/hf_config.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    hf_config_t h;
    if (hf_config_parse((const char *)data, size, "config.json", &h, err, sizeof(err)))
        return 0;
    model_config_t c = h.model;
    FUZZ_CHECK(config_validate(&c, err, sizeof(err)) == 0, "an accepted config does not validate: %s", err);
    FUZZ_CHECK(!memcmp(&c, &h.model, sizeof(c)), "validation changed an accepted config");
    FUZZ_CHECK(h.tied == 0 || h.tied == 1, "tied %d", h.tied);
    return 0;
}
