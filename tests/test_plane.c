/* The data plane (stages/runtime/plane.h) between real stage processes: the shm transport carries
 * activations forward and gradients back, each slot with its (step, microbatch) tags and
 * bytes, in order, round the rings many times; it refuses a slot with other tags and a link
 * the stage does not have, and counts the host's waits; the loader's rings are links too. On the emulated CUDA plugin the IPC
 * transport's device rings deliver every slot's bytes in order while the emulator's streams
 * run late (a missing event wait would show as stale bytes). Segments are named after this
 * run's pid and removed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "ipc/ring.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "kernels/cuda_plugin.h"
#include "stages/job/devdir.h"
#include "stages/job/ldr_seg.h"
#include "stages/runtime/plane.h"
#include "tests/testutil.h"

#define SLOTS 3      /* slots per ring = microbatches */
#define STEPS 5   /* STEPS * SLOTS hand-offs each way: round each ring five times */
#define FLOATS 256

static char job[32];
static job_layout_t lay;
static shm_seg_t *act, *dev, *batch;

/* The act segment of a two-stage replica: the rings stage 0 -> 1 and back, formatted as the
 * coordinator does, and the loader's segment (stage 0 takes tokens, stage 1 targets). gpu:
 * payload-free rings ordering device rings, and a device directory. */
static void make_segments(int gpu)
{
    char err[256];
    snprintf(job, sizeof(job), "p%d", (int)getpid());
    size_t slot = FLOATS * sizeof(float);
    lay = (job_layout_t){.dp = 1, .pp = 2, .vs = 1, .S = 2, .M = SLOTS, .hosts = 1, .gpu = gpu,
                         .act_slot = gpu ? 0 : slot, .dev_slot = slot};
    lay.act_ring = ring_bytes(SLOTS, lay.act_slot);
    assert_int_equal(shm_create(&act, job, "act", job_act_bytes(&lay), err, sizeof(err)), 0);
    for (int g = 0; g < 2; g++)
        assert_int_equal(ring_format((char *)shm_data(act) + job_act_off(&lay, 0, 0, g), lay.act_ring, SLOTS,
                                     lay.act_slot, 0), 0);
    ldr_info_t info = {.dp = 1, .microbatches = SLOTS, .seqs = 1, .seq_len = 4, .vocab_size = 8, .steps = STEPS};
    size_t bytes = ldr_seg_bytes(1, SLOTS, 1, 4);
    assert_int_equal(shm_create(&batch, job, LDR_SEG_NAME, bytes, err, sizeof(err)), 0);
    assert_int_equal(ldr_seg_format(shm_data(batch), bytes, &info, SLOTS, NULL, 0), 0);
    if (gpu)
        assert_int_equal(shm_create(&dev, job, DEVDIR_SEG, devdir_bytes(&lay), err, sizeof(err)), 0);
}

/* A child stage: dies with the test (a stage left blocked on a ring would wait forever). */
static pid_t fork_stage(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        prctl(PR_SET_PDEATHSIG, SIGKILL);
    return pid;
}

/* Reaps both stages; once one fails the other, which may be waiting for it, is killed.
 * Returns 0 when both exited with 0. */
static int reap_stages(pid_t kids[2])
{
    int rc = 0, left = 2;
    for (int waited = 0; left && waited < 60000; waited++) {
        for (int i = 0; i < 2; i++) {
            int st;
            if (kids[i] <= 0 || waitpid(kids[i], &st, WNOHANG) != kids[i])
                continue;
            kids[i] = 0, left--;
            if (!WIFEXITED(st) || WEXITSTATUS(st)) {
                rc = -1;
                if (kids[!i] > 0)
                    kill(kids[!i], SIGKILL);
            }
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    for (int i = 0; i < 2; i++)
        if (kids[i] > 0) {
            kill(kids[i], SIGKILL);
            tu_reap(kids[i], 10, NULL);
            rc = -1;
        }
    return rc;
}

static int teardown(void **state)
{
    shm_detach(&act);
    shm_detach(&dev);
    shm_detach(&batch);
    shm_remove_all(job);
    return 0;
}

static plane_t *shm_plane(int rank)
{
    char err[256];
    plane_t *p;
    plane_cfg_t c = {.lay = &lay, .job = job, .replica = 0, .rank = rank, .vstage = rank};
    if (plane_new(&p, "shm", &c, err, sizeof(err)))
        fail_msg("%s", err);
    return p;
}

/* The bytes of the hand-off (step, mb): activations positive, gradients negative. */
static float pattern(int64_t step, int mb, int i, int grad) { return (grad ? -1.0f : 1.0f) * (float)(step * 1000 + mb * 100 + i); }

static void fill(float *x, int64_t step, int mb, int grad)
{
    for (int i = 0; i < FLOATS; i++)
        x[i] = pattern(step, mb, i, grad);
}

static int check(const float *x, int64_t step, int mb, int grad)
{
    for (int i = 0; i < FLOATS; i++)
        if (x[i] != pattern(step, mb, i, grad)) {
            fprintf(stderr, "step %lld mb %d %s[%d] = %g, want %g\n", (long long)step, mb, grad ? "grad" : "act", i,
                    x[i], pattern(step, mb, i, grad));
            return -1;
        }
    return 0;
}

/* The two ends of a step as a GPipe schedule runs them: stage 0 sends every microbatch's
 * activations, then takes their gradients; stage 1 answers each activation with a gradient. */
static int stage0_step(plane_t *p, int64_t step)
{
    void *x;
    for (int mb = 0; mb < SLOTS; mb++) {
        if (plane_reserve(p, PLANE_ACT_OUT, step, mb, &x))
            return -1;
        fill(x, step, mb, 0);
        if (plane_send(p, PLANE_ACT_OUT))
            return -1;
    }
    for (int mb = 0; mb < SLOTS; mb++)
        if (plane_recv(p, PLANE_GRAD_IN, step, mb, &x) || check(x, step, mb, 1) || plane_done(p, PLANE_GRAD_IN))
            return -1;
    return 0;
}

static int stage1_step(plane_t *p, int64_t step)
{
    void *x;
    for (int mb = 0; mb < SLOTS; mb++) {
        if (plane_recv(p, PLANE_ACT_IN, step, mb, &x) || check(x, step, mb, 0) || plane_done(p, PLANE_ACT_IN) ||
            plane_reserve(p, PLANE_GRAD_OUT, step, mb, &x))
            return -1;
        fill(x, step, mb, 1);
        if (plane_send(p, PLANE_GRAD_OUT))
            return -1;
    }
    return 0;
}

static void test_plane_shm_carries_tagged_slots_both_ways_round_the_rings(void **state)
{
    make_segments(0);
    pid_t kid = fork_stage();
    if (kid == 0) {
        plane_t *p = shm_plane(1);
        int rc = 0;
        for (int64_t s = 0; s < STEPS && !rc; s++)
            rc = stage1_step(p, s);
        if (rc)
            fprintf(stderr, "stage 1: %s\n", plane_error(p));
        plane_destroy(&p);
        _exit(rc ? 1 : 0);
    }
    plane_t *p = shm_plane(0);
    for (int64_t s = 0; s < STEPS; s++)
        if (stage0_step(p, s))
            fail_msg("stage 0 at step %lld: %s", (long long)s, plane_error(p));
    plane_destroy(&p);
    assert_null(p);
    assert_int_equal(tu_reap(kid, 30, NULL), 0);
    ring_t *r;
    char err[256];
    assert_int_equal(ring_attach(&r, (char *)shm_data(act) + job_act_off(&lay, 0, 0, 0), lay.act_ring, "act", err,
                                 sizeof(err)), 0);
    assert_int_equal(ring_head(r), STEPS * SLOTS); /* every slot went through, none is left */
    assert_int_equal(ring_tail(r), STEPS * SLOTS);
    ring_detach(&r);
}

static void test_plane_shm_refuses_other_tags_and_missing_links(void **state)
{
    make_segments(0);
    plane_t *p0 = shm_plane(0), *p1 = shm_plane(1);
    void *x;
    assert_int_equal(plane_reserve(p0, PLANE_ACT_OUT, 2, 1, &x), 0);
    fill(x, 2, 1, 0);
    assert_int_equal(plane_send(p0, PLANE_ACT_OUT), 0);
    assert_int_equal(plane_recv(p1, PLANE_ACT_IN, 2, 0, &x), -EPROTO);
    assert_non_null(strstr(plane_error(p1), "ring act.0.0 delivered step 2 microbatch 1, expected step 2 microbatch 0"));
    assert_int_equal(plane_recv(p1, PLANE_ACT_IN, 2, 1, &x), 0); /* still there, for the right tags */
    assert_int_equal(check(x, 2, 1, 0), 0);
    assert_int_equal(plane_done(p1, PLANE_ACT_IN), 0);
    assert_int_equal(plane_recv(p0, PLANE_ACT_IN, 0, 0, &x), -EINVAL);
    assert_non_null(strstr(plane_error(p0), "stage 0 of replica 0 has no link act_in"));
    assert_int_equal(plane_reserve(p1, PLANE_ACT_OUT, 0, 0, &x), -EINVAL);
    assert_non_null(strstr(plane_error(p1), "stage 1 of replica 0 has no link act_out"));
    assert_int_equal(plane_step_begin(p0, 0), 0); /* nothing around a step on shm */
    assert_int_equal(plane_step_end(p0), 0);
    plane_destroy(&p0);
    plane_destroy(&p1);
}

static void test_plane_shm_counts_the_hosts_waits(void **state)
{
    make_segments(0);
    pid_t kid = fork_stage();
    if (kid == 0) {
        plane_t *p = shm_plane(0);
        void *x;
        nanosleep(&(struct timespec){0, 200 * 1000000}, NULL);
        int rc = plane_reserve(p, PLANE_ACT_OUT, 0, 0, &x);
        if (!rc)
            fill(x, 0, 0, 0), rc = plane_send(p, PLANE_ACT_OUT);
        plane_destroy(&p);
        _exit(rc ? 1 : 0);
    }
    plane_t *p = shm_plane(1);
    void *x;
    assert_true(plane_waited(p) == 0);
    assert_int_equal(plane_recv(p, PLANE_ACT_IN, 0, 0, &x), 0);
    double w = plane_waited(p);
    assert_true(w > 0.1 && w < 10);
    assert_true(plane_waited(p) == 0); /* counted once */
    assert_int_equal(plane_done(p, PLANE_ACT_IN), 0);
    plane_destroy(&p);
    assert_int_equal(tu_reap(kid, 30, NULL), 0);
}

/* The loader's rings are links of the plane on every transport: the first virtual stage
 * receives tokens, the last targets, each slot with its (step, microbatch) tags as the loader
 * committed it; they are only received from, and a stage has only its own. */
static void test_plane_loader_rings_are_links_of_the_first_and_last_stage(void **state)
{
    make_segments(0);
    char err[256];
    ring_t *tok, *tgt;
    assert_int_equal(ldr_seg_ring(shm_data(batch), 0, &tok, err, sizeof(err)), 0);
    assert_int_equal(ldr_seg_ring(shm_data(batch), 1, &tgt, err, sizeof(err)), 0);
    for (int mb = 0; mb < 2; mb++) { /* what a loader does: tokens then targets of each microbatch */
        void *x;
        assert_int_equal(ring_reserve(tok, 0, &x), 0);
        ((int32_t *)x)[0] = 100 + mb;
        assert_int_equal(ring_commit(tok, 0, (uint64_t)mb, 16), 0);
        assert_int_equal(ring_reserve(tgt, 0, &x), 0);
        ((int32_t *)x)[0] = 200 + mb;
        assert_int_equal(ring_commit(tgt, 0, (uint64_t)mb, 16), 0);
    }
    plane_t *p0 = shm_plane(0), *p1 = shm_plane(1);
    void *x;
    assert_int_equal(plane_recv(p0, PLANE_TOKENS, 0, 1, &x), -EPROTO);
    assert_non_null(strstr(plane_error(p0), "ring tokens.0 delivered step 0 microbatch 0, expected step 0 microbatch 1"));
    for (int mb = 0; mb < 2; mb++) {
        assert_int_equal(plane_recv(p0, PLANE_TOKENS, 0, mb, &x), 0);
        assert_int_equal(((int32_t *)x)[0], 100 + mb);
        assert_int_equal(plane_done(p0, PLANE_TOKENS), 0);
        assert_int_equal(plane_recv(p1, PLANE_TARGETS, 0, mb, &x), 0);
        assert_int_equal(((int32_t *)x)[0], 200 + mb);
        assert_int_equal(plane_done(p1, PLANE_TARGETS), 0);
    }
    assert_int_equal(plane_reserve(p0, PLANE_TOKENS, 1, 0, &x), -EINVAL);
    assert_non_null(strstr(plane_error(p0), "only received from"));
    assert_int_equal(plane_recv(p0, PLANE_TARGETS, 1, 0, &x), -EINVAL);
    assert_non_null(strstr(plane_error(p0), "stage 0 of replica 0 has no link targets"));
    assert_int_equal(plane_recv(p1, PLANE_TOKENS, 1, 0, &x), -EINVAL);
    ring_detach(&tok);
    ring_detach(&tgt);
    plane_destroy(&p0);
    plane_destroy(&p1);
}

/* ---- the IPC transport on the emulated GPU ---- */

/* Copies between the host and a device slot on the stream (the model's, in a stage). */
static int upload(const cuda_plugin_t *cu, void *slot, int64_t step, int mb, int grad, void *stream)
{
    float x[FLOATS];
    fill(x, step, mb, grad);
    return cu->backend.copy(slot, x, sizeof(x), stream); /* pageable: staged before it returns */
}

static int download_and_check(const cuda_plugin_t *cu, const void *slot, int64_t step, int mb, int grad,
                              void *stream)
{
    float x[FLOATS];
    if (cu->backend.copy(x, slot, sizeof(x), stream) || cu->backend.stream_sync(stream))
        return -1;
    return check(x, step, mb, grad);
}

/* One stage process on the emulated GPU: uploads what it sends, downloads what it receives,
 * and never syncs before a send, so only the plane's events order the bytes. */
static int ipc_stage(int rank)
{
    char err[512];
    const cuda_plugin_t *cu = cuda_plugin_load(err, sizeof(err));
    void *stream;
    plane_t *p;
    if (!cu || cu->backend.dev_select(0, NULL) || cu->backend.stream_new(&stream)) {
        fprintf(stderr, "stage %d: %s\n", rank, cu ? cu->last_error() : err);
        return 1;
    }
    plane_cfg_t c = {.lay = &lay, .job = job, .replica = 0, .rank = rank, .vstage = rank, .stream = stream};
    if (plane_new(&p, "ipc", &c, err, sizeof(err))) {
        fprintf(stderr, "stage %d: %s\n", rank, err);
        return 1;
    }
    plane_link_t in = rank ? PLANE_ACT_IN : PLANE_GRAD_IN, out = rank ? PLANE_GRAD_OUT : PLANE_ACT_OUT;
    int rc = 0;
    void *x;
    for (int64_t s = 0; s < STEPS && !rc; s++)
        for (int mb = 0; mb < SLOTS && !rc; mb++) {
            if (rank == 0)
                rc = plane_reserve(p, out, s, mb, &x) || upload(cu, x, s, mb, 0, stream) || plane_send(p, out) ||
                     plane_recv(p, in, s, mb, &x) || download_and_check(cu, x, s, mb, 1, stream) ||
                     plane_done(p, in);
            else
                rc = plane_recv(p, in, s, mb, &x) || download_and_check(cu, x, s, mb, 0, stream) ||
                     plane_done(p, in) || plane_reserve(p, out, s, mb, &x) || upload(cu, x, s, mb, 1, stream) ||
                     plane_send(p, out);
        }
    if (rc)
        fprintf(stderr, "stage %d: %s\n", rank, plane_error(p));
    cu->backend.stream_sync(stream);
    plane_destroy(&p);
    cu->backend.stream_free(stream);
    return rc ? 1 : 0;
}

static void test_plane_ipc_device_rings_deliver_in_order_on_the_emulator(void **state)
{
    char path[PATH_MAX];
    if (access(tu_lib("libctitan_cuda_sim.so", path, sizeof(path)), R_OK)) {
        print_message("%s not built: skipping\n", path);
        skip();
    }
    make_segments(1);
    pid_t kids[2];
    for (int r = 0; r < 2; r++) /* the emulator's threads are per process: load it in each child */
        if ((kids[r] = fork_stage()) == 0) {
            setenv(CUDA_PLUGIN_ENV, path, 1);
            _exit(ipc_stage(r));
        }
    assert_int_equal(reap_stages(kids), 0);
    devdir_stage_t *e = devdir_stage(shm_data(dev), &lay, 0, 1);
    assert_int_equal(atomic_load(&e->ready), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_plane_shm_carries_tagged_slots_both_ways_round_the_rings, teardown),
        cmocka_unit_test_teardown(test_plane_shm_refuses_other_tags_and_missing_links, teardown),
        cmocka_unit_test_teardown(test_plane_shm_counts_the_hosts_waits, teardown),
        cmocka_unit_test_teardown(test_plane_loader_rings_are_links_of_the_first_and_last_stage, teardown),
        cmocka_unit_test_teardown(test_plane_ipc_device_rings_deliver_in_order_on_the_emulator, teardown),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
