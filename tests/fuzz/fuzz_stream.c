/* libFuzzer harness: a fetch streamed into the staging segment (checkpointd/restore.h
 * restore_load_stored with a storage host: its sink checks the index as a load does, copies
 * each chunk the run reads into the segment and checks its checksum and each data file's
 * header as the bytes come), what a trainer resuming from its storage host takes. The
 * input: tests/fuzz/fetch_parts.h, the parts a fake host sends of its one checkpoint (step
 * 5); parts that end without the server's ok are a host gone quiet. Properties: a load that
 * succeeds leaves the segment holding step 5 and exactly the checkpoint's data (zeros, over a
 * segment filled with 0xff before), one that fails leaves no step in it; the sink never
 * writes outside the segment (ASan). */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "checkpointd/restore.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "stages/job/staging.h"
#include "tests/fuzz/fetch_parts.h"

static fake_ckpt_t g_k;
static shm_seg_t *g_seg;
static manifest_t g_m;
static char g_job[64];

static void cleanup(void)
{
    shm_detach(&g_seg);
    shm_remove_all(g_job);
}

static void setup(void)
{
    char err[512];
    fake_ckpt_init(&g_k);
    snprintf(g_job, sizeof(g_job), "fuzz-stream-%d", (int)getpid());
    FUZZ_CHECK(staging_create(&g_seg, g_job, g_k.tab.total, 3, err, sizeof(err)) == 0, "%s", err);
    atexit(cleanup);
    manifest_defaults(&g_m);
    g_m.steps = 100;
    g_m.ckpt_enable = 1;
    snprintf(g_m.ckpt_endpoint, sizeof(g_m.ckpt_endpoint), "tcp://fuzz:1");
}

typedef struct {
    const uint8_t *data;
    size_t size;
} input_t;

/* The fake host: the input's parts, then its ok if a DONE part came, else silence. */
static int host(void *arg, int64_t step, const rmt_sink_t *sink, char *where, size_t wherelen, char *err,
                size_t errlen)
{
    const input_t *in = arg;
    rmt_fetch_t F;
    rmt_fetch_init(&F, sink, "job", step, "fuzz");
    int done, rc = feed_parts(&F, &g_k, in->data, in->size, &done, NULL, NULL, err, errlen);
    if (!rc)
        rc = done ? rmt_fetch_done(&F, err, errlen) : util_fail(err, errlen, -ETIMEDOUT, "the host went quiet");
    rmt_fetch_free(&F);
    snprintf(where, wherelen, "/srv/job/step-00000005 on tcp://fuzz:1");
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_seg)
        setup();
    void *seg = shm_data(g_seg);
    for (int a = 0; a < 3; a++)
        memset(staging_array(seg, a), 0xff, g_k.tab.total * sizeof(float));
    input_t in = {data, size};
    restore_stored_t st = {.n = 1, .steps = {5}, .fetch = host, .arg = &in};
    char path[sizeof(g_m.ckpt_load)], err[1024];
    int rc = restore_load_stored("latest", &g_m, &st, &g_k.tab, seg, NULL, path, sizeof(path), err, sizeof(err));
    int64_t step = atomic_load(&((staging_hdr_t *)seg)->step);
    if (rc) {
        FUZZ_CHECK(step == -1, "a failed load (%s) left step %lld", err, (long long)step);
        return 0;
    }
    FUZZ_CHECK(step == 5, "step %lld", (long long)step);
    static const float zeros[8];
    for (int a = 0; a < 3; a++)
        FUZZ_CHECK(!memcmp(staging_array(seg, a), zeros, sizeof(zeros)), "array %d is not the checkpoint's", a);
    return 0;
}
