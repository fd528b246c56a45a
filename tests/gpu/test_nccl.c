/* NCCL through ctitan's wrappers (kernels/cuda/cuda_nccl.h), with ids passed as the opaque
 * bytes the control plane carries: a one-rank communicator (what a single-GPU machine can
 * run) and two ranks in two real processes (needs two GPUs: NCCL refuses two ranks on one
 * device). `make test` runs both on the CPU emulator's stand-in (test_nccl_sim). Skipped with
 * a message where there is no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_nccl.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/testutil.h"

#define NC(call)                                                                              \
    do {                                                                                      \
        if ((call) != 0)                                                                      \
            fail_msg("%s: %s", #call, cuda_last_error());                                    \
    } while (0)

static void test_nccl_one_rank_collectives(void **state)
{
    if (cuda_device_count() == 0) {
        print_message("no CUDA device: skipping (%s)\n", cuda_last_error());
        skip();
    }
    cuda_nccl_id_t id, wire;
    NC(cuda_nccl_id(&id));
    memcpy(&wire, &id, sizeof(id)); /* as it travels: opaque bytes */
    cuda_nccl_t *c;
    NC(cuda_nccl_init(&c, &wire, 1, 0));
    enum { N = 1 << 16 };
    float *h = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float)), *d;
    uint16_t *hb = malloc(N * 2), *bb = malloc(N * 2), *db;
    for (int i = 0; i < N; i++)
        h[i] = (float)(i % 1000) * 0.5f, hb[i] = (uint16_t)(i * 7);
    assert_int_equal(cuda_alloc((void **)&d, N * sizeof(float)), 0);
    assert_int_equal(cuda_alloc((void **)&db, N * 2), 0);
    assert_int_equal(cuda_copy_to_device(d, h, N * sizeof(float)), 0);
    assert_int_equal(cuda_copy_to_device(db, hb, N * 2), 0);
    void *s;
    NC(cuda_stream_new(&s));
    NC(cuda_nccl_reduce_scatter_f32(c, d, d, N, s)); /* in place; one rank: its whole slice */
    NC(cuda_nccl_all_gather_bf16(c, db, db, N, s));
    NC(cuda_stream_sync(s));
    assert_int_equal(cuda_copy_to_host(back, d, N * sizeof(float)), 0);
    assert_int_equal(cuda_copy_to_host(bb, db, N * 2), 0);
    assert_memory_equal(back, h, N * sizeof(float)); /* a sum over one rank is the identity */
    assert_memory_equal(bb, hb, N * 2);
    cuda_nccl_destroy(&c);
    assert_null(c);
    cuda_stream_free(s);
    cuda_free(d), cuda_free(db);
    free(h), free(back), free(hb), free(bb);
}

enum { CHUNK = 3000, MSGS = 3 };
#define RANK1 "--rank1" /* argv[1] of the two-rank test's second process: this program again */

/* Rank r of two: three messages each way with its peer, then an in-place reduce-scatter of
 * 2 x CHUNK floats (rank k holds k + 1 + i / 1000), an in-place all-gather of CHUNK bf16 and a bf16
 * reduce to rank 1.
 * Returns 0, or the step that went wrong. */
static int two_ranks(const cuda_nccl_id_t *id, int r)
{
    cuda_nccl_t *c;
    void *s;
    if (cuda_dev_select(r, NULL) || cuda_stream_new(&s) || cuda_nccl_init(&c, id, 2, r))
        return 1;
    int peer = 1 - r;
    float *msg, *g, h[2 * CHUNK];
    uint16_t *w, hw[2 * CHUNK];
    if (cuda_alloc((void **)&msg, 4096 * 4) || cuda_alloc((void **)&g, sizeof(h)) || cuda_alloc((void **)&w, sizeof(hw)))
        return 2;
    for (int m = 0; m < MSGS; m++) { /* rank 0 sends first, rank 1 answers: NCCL's order per pair */
        float out[4096], in[4096];
        for (int i = 0; i < 4096; i++)
            out[i] = (float)(r * 100000 + m * 4096 + i);
        if (cuda_copy_to_device(msg, out, sizeof(out)))
            return 3;
        int rc = r == 0 ? cuda_nccl_send(c, msg, sizeof(out), peer, s) || cuda_nccl_recv(c, msg, sizeof(in), peer, s)
                        : cuda_nccl_recv(c, msg, sizeof(in), peer, s) || cuda_nccl_send(c, msg, sizeof(in), peer, s);
        if (rc || cuda_stream_sync(s) || cuda_copy_to_host(in, msg, sizeof(in)))
            return 4;
        for (int i = 0; i < 4096; i++) /* rank 1 echoes what it got: both see rank 0's numbers */
            if (in[i] != (float)(m * 4096 + i))
                return 5;
    }
    for (int i = 0; i < 2 * CHUNK; i++)
        h[i] = (float)(r + 1) + (float)(i % 1000) / 1000.0f;
    for (int i = 0; i < CHUNK; i++)
        hw[r * CHUNK + i] = (uint16_t)(r * 30000 + i);
    if (cuda_copy_to_device(g, h, sizeof(h)) || cuda_copy_to_device(w, hw, sizeof(hw)))
        return 6;
    if (cuda_nccl_reduce_scatter_f32(c, g, g + r * CHUNK, CHUNK, s) ||
        cuda_nccl_all_gather_bf16(c, w + r * CHUNK, w, CHUNK, s) || cuda_stream_sync(s))
        return 7;
    if (cuda_copy_to_host(h, g, sizeof(h)) || cuda_copy_to_host(hw, w, sizeof(hw)))
        return 8;
    for (int i = 0; i < CHUNK; i++) {
        int k = r * CHUNK + i;
        if (h[k] != (1.0f + (float)(k % 1000) / 1000.0f) + (2.0f + (float)(k % 1000) / 1000.0f))
            return 9;
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < CHUNK; i++)
            if (hw[k * CHUNK + i] != (uint16_t)(k * 30000 + i))
                return 10;
    /* a bf16 reduce to rank 1 (parameter sharding's, training.mixed_precision_reduce): rank k
     * sends bf16 (k + 1) x (1 + i / 4096), whose sum is not always a bf16, so rank 1 must get it
     * rounded to nearest even, then adds it into fp32 gradients holding i */
    for (int i = 0; i < CHUNK; i++) {
        hw[i] = tu_f32_to_bf16((float)(r + 1) * (1.0f + (float)i / 4096.0f));
        h[i] = (float)i;
    }
    if (cuda_copy_to_device(w, hw, CHUNK * 2) || cuda_copy_to_device(g, h, CHUNK * 4) ||
        cuda_nccl_reduce_bf16(c, w, w + CHUNK, CHUNK, 1, s) ||
        (r == 1 && cuda_f32_add_bf16(g, w + CHUNK, CHUNK, s)) || cuda_stream_sync(s) ||
        cuda_copy_to_host(h, g, CHUNK * 4))
        return 11;
    int rounded = 0;
    for (int i = 0; r == 1 && i < CHUNK; i++) {
        float a = tu_bf16_to_f32(tu_f32_to_bf16(1.0f + (float)i / 4096.0f));
        float b = tu_bf16_to_f32(tu_f32_to_bf16(2.0f * (1.0f + (float)i / 4096.0f)));
        float want = tu_bf16_to_f32(tu_f32_to_bf16(a + b));
        rounded += want != a + b;
        if (h[i] != (float)i + want)
            return 12;
    }
    if (r == 1 && !rounded) /* the case must exercise the rounding */
        return 13;
    cuda_nccl_destroy(&c);
    cuda_free(msg), cuda_free(g), cuda_free(w);
    cuda_stream_free(s);
    return 0;
}

static void test_nccl_two_ranks_in_two_processes(void **state)
{
    int n = cuda_device_count();
    if (n < 2) {
        print_message("%s: skipping (NCCL needs a GPU per rank)\n",
                      n ? "one CUDA device" : "no CUDA device");
        skip();
    }
    cuda_nccl_id_t id;
    NC(cuda_nccl_id(&id)); /* this process hosts the id, as the coordinator does */
    /* Rank 1 runs this program afresh with the id in hex: this process has set up CUDA, and a
     * child that is only forked cannot use it (real CUDA hangs or fails it; so does the
     * emulator). */
    char hex[2 * sizeof(id) + 1];
    const unsigned char *b = (const unsigned char *)&id;
    for (size_t i = 0; i < sizeof(id); i++)
        snprintf(hex + 2 * i, 3, "%02x", b[i]);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/proc/self/exe", "test_nccl", RANK1, hex, (char *)NULL);
        _exit(100);
    }
    int rc = two_ranks(&id, 0), status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (rc)
        fail_msg("rank 0 failed at step %d: %s", rc, cuda_last_error());
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], RANK1) == 0) { /* the two-rank test's rank 1 */
        cuda_nccl_id_t id;
        unsigned char *b = (unsigned char *)&id;
        if (strlen(argv[2]) != 2 * sizeof(id))
            return 99;
        for (size_t i = 0; i < sizeof(id); i++)
            if (sscanf(argv[2] + 2 * i, "%2hhx", &b[i]) != 1)
                return 99;
        return two_ranks(&id, 1);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_one_rank_collectives),
        cmocka_unit_test(test_nccl_two_ranks_in_two_processes),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
