/* libFuzzer harness: the sgemm peak's cache file (stages/report/peak_cache.h peak_cache_read) on the
 * bytes of a memfd. An accepted file's entry has a positive finite peak, the higher of its
 * two, and comes back the same, bit for bit, from the text peak_cache_write would write. */
#include <math.h>
#include <string.h>

#include "stages/report/peak_cache.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    peak_cache_entry_t e, r;
    char err[512], text[8192];
    if (!path || peak_cache_read(path, &e, err, sizeof(err)))
        return 0;
    FUZZ_CHECK(isfinite(e.gflops) && e.gflops > 0, "gflops %g", e.gflops);
    FUZZ_CHECK(e.gflops == fmax(e.native, e.pooled), "gflops %g, native %g, pooled %g", e.gflops, e.native,
               e.pooled);
    FUZZ_CHECK(e.key.threads >= 1 && e.key.n >= 1 && e.key.runs >= 1, "threads %d, n %d, runs %d", e.key.threads,
               e.key.n, e.key.runs);
    int n = peak_cache_format(&e, text, sizeof(text));
    FUZZ_CHECK(n > 0 && (size_t)n < sizeof(text), "formatted %d bytes", n);
    path = fuzz_file((const uint8_t *)text, (size_t)n);
    FUZZ_CHECK(path && peak_cache_read(path, &r, err, sizeof(err)) == 0, "re-read: %s", err);
    FUZZ_CHECK(!memcmp(&r.key, &e.key, sizeof(e.key)), "the key changed");
    FUZZ_CHECK(r.gflops == e.gflops && r.native == e.native && r.pooled == e.pooled && r.measured == e.measured,
               "the figures changed");
    return 0;
}
