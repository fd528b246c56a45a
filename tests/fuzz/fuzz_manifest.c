/* libFuzzer harness: the job manifest (stages/job/manifest.h): manifest_parse of a TOML text over
 * the defaults, manifest_validate, and for a valid one the resolved text every worker gets
 * (manifest_to_toml), which must parse and validate to the same text again. */
#include <string.h>

#include "stages/job/manifest.h"
#include "tests/fuzz/fuzz.h"

static manifest_t m, m2; /* large: static, one input at a time */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[1024];
    manifest_defaults(&m);
    if (manifest_parse(&m, (const char *)data, size, "fuzz.toml", err, sizeof(err)) ||
        manifest_validate(&m, err, sizeof(err)))
        return 0;
    /* each call builds the parameter table: bounded work per input (the split is the same code
     * for every size), or deep models with many stages slow the run to a crawl */
    for (int s = 0; s < m.pp && (long)m.pp * m.model.n_layers <= 4096; s++) {
        int p0, p1;
        if (manifest_stage_pieces(&m, s, &p0, &p1) == 0)
            FUZZ_CHECK(0 <= p0 && p0 < p1 && p1 <= m.model.n_layers + 2, "stage %d: pieces [%d, %d)", s, p0, p1);
    }
    char *text = manifest_to_toml(&m);
    if (!text)
        return 0;
    manifest_defaults(&m2);
    int rc = manifest_parse(&m2, text, strlen(text), "resolved", err, sizeof(err));
    FUZZ_CHECK(rc == 0, "the resolved manifest does not parse: %s\n%s", err, text);
    rc = manifest_validate(&m2, err, sizeof(err));
    FUZZ_CHECK(rc == 0, "the resolved manifest does not validate: %s\n%s", err, text);
    char *again = manifest_to_toml(&m2);
    if (again)
        FUZZ_CHECK(!strcmp(text, again), "resolving twice differs:\n%s\n----\n%s", text, again);
    free(text);
    free(again);
    return 0;
}
