/* The GPU data plane's device calls (kernels/cuda/cuda_dev.h): the optimizer shard's kernels
 * against plain loops, and CUDA IPC memory and events between two real processes. Skipped
 * with a message where there is no GPU; `make test` also runs it on the CPU emulator
 * (test_cuda_dev_sim), whose device memory is shareable between processes too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/norm_order.h"
#include "tests/testutil.h"

#define NEED_GPU()                                                                              \
    do {                                                                                        \
        if (cuda_device_count() == 0) {                                                         \
            print_message("no CUDA device: skipping (%s)\n", cuda_last_error());               \
            skip();                                                                             \
        }                                                                                       \
    } while (0)

static void test_cuda_dev_kernels_match_plain_loops(void **state)
{
    NEED_GPU();
    size_t n = 5003, block = 1024, nb = (n + block - 1) / block; /* the last block is short */
    float *x = malloc(n * 4), *y = malloc(n * 4), *got = malloc(n * 4);
    double *xd = malloc(n * 8), *yd = malloc(n * 8), sums[8], ref[8];
    uint16_t *b = malloc(n * 2);
    tu_fill(xd, x, n, 11, 3.0);
    tu_fill(yd, y, n, 12, 3.0);
    x[7] = 1e-30f; /* a denormal-free tiny value and an exact halfway case for rounding */
    x[8] = 1.00390625f;
    float *dx, *dy;
    uint16_t *db;
    double *ds;
    assert_int_equal(cuda_alloc((void **)&dx, n * 4), 0);
    assert_int_equal(cuda_alloc((void **)&dy, n * 4), 0);
    assert_int_equal(cuda_alloc((void **)&db, n * 2), 0);
    assert_int_equal(cuda_alloc((void **)&ds, nb * 8), 0);
    assert_int_equal(cuda_copy_to_device(dx, x, n * 4), 0);
    assert_int_equal(cuda_copy_to_device(dy, y, n * 4), 0);

    assert_int_equal(cuda_f32_add(dy, dx, n, NULL), 0);
    assert_int_equal(cuda_f32_scale(dy, 0.5f, n, NULL), 0);
    assert_int_equal(cuda_copy_to_host(got, dy, n * 4), 0);
    for (size_t i = 0; i < n; i++)
        assert_true(got[i] == (y[i] + x[i]) * 0.5f); /* one fp32 add and multiply: exact */

    assert_int_equal(cuda_f32_to_bf16_dev(db, dx, n, NULL), 0);
    assert_int_equal(cuda_copy_to_host(b, db, n * 2), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(b[i], tu_f32_to_bf16(x[i]));

    /* a bf16 reduce's sum added into the fp32 gradients: y += float(b), one exact widening and add */
    assert_int_equal(cuda_f32_add_bf16(dy, db, n, NULL), 0);
    float *was = malloc(n * 4);
    memcpy(was, got, n * 4);
    assert_int_equal(cuda_copy_to_host(got, dy, n * 4), 0);
    for (size_t i = 0; i < n; i++)
        assert_true(got[i] == was[i] + tu_bf16_to_f32(b[i]));
    free(was);

    assert_int_equal(cuda_block_sumsq(ds, dx, n, block, NULL), 0);
    assert_int_equal(cuda_copy_to_host(sums, ds, nb * 8), 0);
    for (size_t k = 0; k < nb; k++) {
        ref[k] = 0;
        for (size_t i = k * block; i < n && i < (k + 1) * block; i++)
            ref[k] += (double)x[i] * x[i];
    }
    assert_int_equal(tu_compare_d("block sums of squares", sums, ref, nb, 0, 1e-12), 0);
    assert_int_equal(cuda_block_sumsq(ds, dx, n, 0, NULL), -22);
    cuda_free(dx), cuda_free(dy), cuda_free(db), cuda_free(ds);
    free(x), free(y), free(got), free(xd), free(yd), free(b);
}

/* The block norms are the same bits for the same block wherever it sits: a block's four at a time
 * (x 16-byte aligned) and one at a time (the same values one float off the alignment) agree bit
 * for bit, over 21 blocks (three CUDA blocks of 8 warps, the last short) and a short last norm
 * block; and a block's sum does not depend on the blocks around it (the second half alone). */
static void test_cuda_block_sumsq_is_the_same_bits_wherever_the_block_sits(void **state)
{
    NEED_GPU();
    const size_t block = 1024, n = 20 * block + 333, nb = 21;
    float *x = malloc(n * 4);
    double *xd = malloc(n * 8), a[21], b[21], c[21];
    tu_fill(xd, x, n, 21, 2.0);
    float *d;
    double *ds;
    assert_int_equal(cuda_alloc((void **)&d, (n + 4) * 4), 0);
    assert_int_equal(cuda_alloc((void **)&ds, nb * 8), 0);
    assert_int_equal(cuda_copy_to_device(d, x, n * 4), 0);
    assert_int_equal(cuda_block_sumsq(ds, d, n, block, NULL), 0);
    assert_int_equal(cuda_copy_to_host(a, ds, nb * 8), 0);
    assert_int_equal(cuda_copy_to_device(d + 1, x, n * 4), 0);
    assert_int_equal(cuda_block_sumsq(ds, d + 1, n, block, NULL), 0);
    assert_int_equal(cuda_copy_to_host(b, ds, nb * 8), 0);
    assert_memory_equal(a, b, nb * 8);
    assert_int_equal(cuda_copy_to_device(d, x + 10 * block, (n - 10 * block) * 4), 0);
    assert_int_equal(cuda_block_sumsq(ds, d, n - 10 * block, block, NULL), 0);
    assert_int_equal(cuda_copy_to_host(c, ds, 11 * 8), 0);
    assert_memory_equal(a + 10, c, 11 * 8);
    double ref = 0;
    for (size_t i = 20 * block; i < n; i++)
        ref += (double)x[i] * x[i];
    assert_true(fabs(a[20] - ref) <= 1e-12 * ref);
    cuda_free(d), cuda_free(ds);
    free(x), free(xd);
}

/* The device's sum of the flat space's block norms and its clip factor (cuda_norm_clip, what GPU
 * optimizer shards make between themselves) are the host's norm_sum and norm_clip_scale bit for
 * bit, and its 1024 lanes' running sums norm_lanes', however the blocks are split into runs (one;
 * three, not at lane boundaries; with an empty one), over 20000 blocks (19 rounds of the lanes
 * and part of another: the lanes' eight loads at a time and the rest one by one) in [1, 1000]:
 * each lane's sum shows the order of its additions in its bits (another order gives other bits:
 * checked), and so does a block counted in the wrong lane; the total is within 1e-12 of a plain
 * sum. */
static void test_cuda_norm_clip_is_the_hosts_sum_bitwise(void **state)
{
    NEED_GPU();
    enum { NB = 20000 };
    static double x[NB], want_lanes[NORM_LANES], rev_lanes[NORM_LANES], lanes[NORM_LANES];
    srand(77);
    double plain = 0;
    for (int b = 0; b < NB; b++)
        x[b] = 1.0 + 999.0 * rand() / RAND_MAX, plain += x[b];
    norm_lanes(x, NB, want_lanes);
    for (int l = 0; l < NORM_LANES; l++) /* each lane's blocks the other way round */
        for (int b = (NB - 1 - l) / NORM_LANES * NORM_LANES + l, k = 0; b >= 0; b -= NORM_LANES, k++)
            rev_lanes[l] = (k ? rev_lanes[l] : 0.0) + x[b];
    int differ = 0;
    for (int l = 0; l < NORM_LANES; l++)
        differ += memcmp(&want_lanes[l], &rev_lanes[l], 8) != 0;
    print_message("%d of %d lanes' sums differ in the other order\n", differ, NORM_LANES);
    assert_true(differ > NORM_LANES / 4);
    double want = norm_sum(x, NB);
    assert_true(fabs(want - plain) <= 1e-12 * plain);
    const size_t splits[][4] = {{NB}, {1000, 9000, NB - 10000}, {1024, 0, NB - 1024}};
    const int nsplits[] = {1, 3, 3};
    const double max_norms[] = {0, 1e3, 1e12};
    double *dx, **druns, *dsq, *dlanes;
    size_t *dlens;
    float *dscale;
    assert_int_equal(cuda_alloc((void **)&dx, NB * 8), 0);
    assert_int_equal(cuda_alloc((void **)&druns, 3 * sizeof(double *)), 0);
    assert_int_equal(cuda_alloc((void **)&dlens, 3 * sizeof(size_t)), 0);
    assert_int_equal(cuda_alloc((void **)&dsq, 8), 0);
    assert_int_equal(cuda_alloc((void **)&dlanes, NORM_LANES * 8), 0);
    assert_int_equal(cuda_alloc((void **)&dscale, 4), 0);
    assert_int_equal(cuda_copy_to_device(dx, x, NB * 8), 0);
    for (int s = 0; s < 3; s++)
        for (int m = 0; m < 3; m++) {
            double *runs[3], sq;
            size_t at = 0;
            for (int r = 0; r < nsplits[s]; at += splits[s][r], r++)
                runs[r] = dx + at;
            assert_int_equal(cuda_copy_to_device(druns, runs, nsplits[s] * sizeof(double *)), 0);
            assert_int_equal(cuda_copy_to_device(dlens, splits[s], nsplits[s] * sizeof(size_t)), 0);
            assert_int_equal(cuda_norm_clip(dsq, dscale, dlanes, (const double *const *)druns, dlens, nsplits[s],
                                            max_norms[m], NULL), 0);
            float scale, want_scale = (float)norm_clip_scale(max_norms[m], sqrt(want));
            assert_int_equal(cuda_copy_to_host(&sq, dsq, 8), 0);
            assert_int_equal(cuda_copy_to_host(&scale, dscale, 4), 0);
            assert_int_equal(cuda_copy_to_host(lanes, dlanes, NORM_LANES * 8), 0);
            print_message("split %d, max_norm %g: sum %.17g (host %.17g), scale %.9g (host %.9g)\n", s, max_norms[m],
                          sq, want, scale, want_scale);
            assert_memory_equal(lanes, want_lanes, NORM_LANES * 8);
            assert_memory_equal(&sq, &want, 8);
            assert_memory_equal(&scale, &want_scale, 4);
        }
    assert_true(norm_clip_scale(1e3, sqrt(want)) < 1 && norm_clip_scale(1e12, sqrt(want)) == 1);
    assert_int_equal(cuda_norm_clip(dsq, dscale, dlanes, (const double *const *)druns, dlens, 0, 1.0, NULL), -22);
    cuda_free(dx), cuda_free(druns), cuda_free(dlens), cuda_free(dsq), cuda_free(dscale), cuda_free(dlanes);
}

#define IPC_CHILD "--ipc-child" /* argv[1] of the IPC test's child: this program run again */
#define IPC_FLOATS ((size_t)1 << 20)

/* The child: maps the parent's buffer, orders its stream after the parent's event, doubles
 * the buffer, records its own event for the parent. Exit status: 0 ok, else the failing step. */
static int child(int rfd, int wfd, size_t n)
{
    cuda_ipc_mem_t mh;
    cuda_ipc_event_t filled;
    if (read(rfd, &mh, sizeof(mh)) != sizeof(mh) || read(rfd, &filled, sizeof(filled)) != sizeof(filled))
        return 1;
    void *buf, *ev, *done, *s;
    cuda_ipc_event_t dh;
    if (cuda_dev_select(0, NULL) || cuda_stream_new(&s) || cuda_ipc_open(&buf, &mh) || cuda_ipc_event_open(&ev, &filled))
        return 2;
    if (cuda_ipc_event_new(&done, &dh) || cuda_stream_wait(s, ev) || cuda_f32_scale(buf, 2.0f, n, s) ||
        cuda_event_record(done, s) || cuda_stream_sync(s))
        return 3;
    float first;
    if (cuda_copy_async(&first, buf, 4, s) || cuda_stream_sync(s) || first != 2.0f)
        return 4;
    if (write(wfd, &dh, sizeof(dh)) != sizeof(dh))
        return 5;
    char c;
    if (read(rfd, &c, 1) != 1) /* the parent has read the buffer: the mapping may go */
        return 6;
    cuda_ipc_close(buf);
    cuda_event_free(done);
    return 0;
}

static void test_cuda_dev_ipc_shares_memory_and_events_between_processes(void **state)
{
    NEED_GPU();
    size_t n = IPC_FLOATS;
    int to_child[2], to_parent[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(to_parent), 0);
    /* The child runs this program afresh: the test before this one (and NEED_GPU) set up CUDA
     * here, and a child that is only forked cannot use CUDA after its parent did (real CUDA
     * hangs or fails it; the emulator fails it). */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char rfd[16], wfd[16];
        snprintf(rfd, sizeof(rfd), "%d", to_child[0]);
        snprintf(wfd, sizeof(wfd), "%d", to_parent[1]);
        execl("/proc/self/exe", "test_cuda_dev", IPC_CHILD, rfd, wfd, (char *)NULL);
        _exit(100);
    }
    /* Only the child writes to_parent: a child that fails reads as end of file, not a hang. */
    close(to_parent[1]);
    close(to_child[0]);
    float *h = malloc(n * 4), *dbuf;
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(i + 1);
    void *s, *filled, *done;
    cuda_ipc_mem_t mh;
    cuda_ipc_event_t fh, dh;
    assert_int_equal(cuda_dev_select(0, NULL), 0);
    assert_int_equal(cuda_stream_new(&s), 0);
    assert_int_equal(cuda_ipc_alloc((void **)&dbuf, n * 4, &mh), 0);
    assert_int_equal(cuda_ipc_event_new(&filled, &fh), 0);
    assert_int_equal(cuda_copy_async(dbuf, h, n * 4, s), 0);
    assert_int_equal(cuda_event_record(filled, s), 0);
    assert_int_equal(write(to_child[1], &mh, sizeof(mh)), (ssize_t)sizeof(mh));
    assert_int_equal(write(to_child[1], &fh, sizeof(fh)), (ssize_t)sizeof(fh));
    if (read(to_parent[0], &dh, sizeof(dh)) != (ssize_t)sizeof(dh)) {
        int status = 0;
        waitpid(pid, &status, 0);
        fail_msg("the child stopped before it sent its event (exit status %d: the failing step)",
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    assert_int_equal(cuda_ipc_event_open(&done, &dh), 0);
    assert_int_equal(cuda_stream_wait(s, done), 0);
    memset(h, 0, n * 4);
    assert_int_equal(cuda_copy_async(h, dbuf, n * 4, s), 0);
    assert_int_equal(cuda_stream_sync(s), 0);
    for (size_t i = 0; i < n; i++)
        if (h[i] != 2.0f * (float)(i + 1))
            fail_msg("element %zu is %g, expected %g", i, h[i], 2.0 * (i + 1));
    assert_int_equal(write(to_child[1], "x", 1), 1);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* a process cannot map its own handle (CUDA's rule, which the emulator keeps) */
    void *self;
    assert_true(cuda_ipc_open(&self, &mh) != 0);
    cuda_event_free(filled);
    cuda_event_free(done);
    cuda_free(dbuf);
    cuda_stream_free(s);
    free(h);
    close(to_child[1]), close(to_parent[0]);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], IPC_CHILD) == 0)
        return child(atoi(argv[2]), atoi(argv[3]), IPC_FLOATS);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_dev_kernels_match_plain_loops),
        cmocka_unit_test(test_cuda_block_sumsq_is_the_same_bits_wherever_the_block_sits),
        cmocka_unit_test(test_cuda_norm_clip_is_the_hosts_sum_bitwise),
        cmocka_unit_test(test_cuda_dev_ipc_shares_memory_and_events_between_processes),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
