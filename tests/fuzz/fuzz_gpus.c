/* libFuzzer harness: the memory plan's reading of nvidia-smi's GPUs under CUDA_VISIBLE_DEVICES
 * (stages/plan/plan.h plan_visible_gpus). Input: a first byte (odd: the variable unset), then
 * the variable's value up to a newline, then nvidia-smi's output. Whatever it reads, the GPUs it
 * reports are at most PLAN_MAX_GPUS, each a finite free size >= 0, every other one unknown, and
 * a second reading of the same text gives the same answer. */
#include <math.h>
#include <string.h>

#include "stages/plan/plan.h"
#include "tests/fuzz/fuzz.h"

static void read_gpus(plan_have_t *h, const char *smi, size_t n, const char *cvd)
{
    static char buf[1 << 14];
    memcpy(buf, smi, n);
    buf[n] = 0;
    memset(h, 0, sizeof(*h));
    for (int g = 0; g < PLAN_MAX_GPUS; g++)
        h->gpu[g] = -1;
    plan_visible_gpus(h, buf, cvd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1 << 14) - 1)
        return 0;
    int unset = data[0] & 1;
    const char *rest = (const char *)data + 1;
    size_t left = size - 1;
    const char *nl = memchr(rest, '\n', left);
    char cvd[512] = "";
    if (nl && (size_t)(nl - rest) < sizeof(cvd)) {
        memcpy(cvd, rest, (size_t)(nl - rest));
        cvd[nl - rest] = 0;
        left -= (size_t)(nl - rest) + 1;
        rest = nl + 1;
    }
    if (memchr(rest, 0, left))
        return 0; /* text: a NUL would end it early, which is another input */
    plan_have_t a, b;
    read_gpus(&a, rest, left, unset ? NULL : cvd);
    read_gpus(&b, rest, left, unset ? NULL : cvd);
    FUZZ_CHECK(a.gpus >= 0 && a.gpus <= PLAN_MAX_GPUS, "%d GPUs", a.gpus);
    for (int g = 0; g < PLAN_MAX_GPUS; g++) {
        if (g < a.gpus)
            FUZZ_CHECK(isfinite(a.gpu[g]) && a.gpu[g] >= 0, "GPU %d: %g bytes", g, a.gpu[g]);
        else
            FUZZ_CHECK(a.gpu[g] == -1, "GPU %d past the %d read: %g", g, a.gpus, a.gpu[g]);
        FUZZ_CHECK(a.gpu[g] == b.gpu[g], "GPU %d read twice: %g, %g", g, a.gpu[g], b.gpu[g]);
    }
    FUZZ_CHECK(a.gpus == b.gpus, "read twice: %d, %d GPUs", a.gpus, b.gpus);
    return 0;
}
