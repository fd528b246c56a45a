/* NCCL on this machine's GPU(s): a one-rank communicator (what a single-GPU machine can test;
 * ctitan's NCCL data plane across hosts is still to be built) all-reduces, reduce-scatters and
 * all-gathers bf16-sized fp32 buffers correctly, with the ncclUniqueId passed as the bytes the
 * control plane will carry. Skipped where there is no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "kernels/cuda/cuda_ops.h"

#define NC(call)                                                                     \
    do {                                                                             \
        ncclResult_t r_ = (call);                                                    \
        if (r_ != ncclSuccess)                                                       \
            fail_msg("%s: %s", #call, ncclGetErrorString(r_));                       \
    } while (0)

static void test_nccl_one_rank_collectives(void **state)
{
    if (cuda_device_count() == 0) {
        print_message("no CUDA device: skipping (%s)\n", cuda_last_error());
        skip();
    }
    ncclUniqueId id, wire;
    NC(ncclGetUniqueId(&id));
    memcpy(&wire, &id, sizeof(id)); /* as it will travel: NCCL_UNIQUE_ID_BYTES opaque bytes */
    ncclComm_t comm;
    NC(ncclCommInitRank(&comm, 1, wire, 0));
    enum { N = 1 << 20 };
    float *h = malloc(N * sizeof(float)), *d, *e;
    for (int i = 0; i < N; i++)
        h[i] = (float)(i % 1000) * 0.5f;
    assert_int_equal(cuda_alloc((void **)&d, N * sizeof(float)), 0);
    assert_int_equal(cuda_alloc((void **)&e, N * sizeof(float)), 0);
    assert_int_equal(cuda_copy_to_device(d, h, N * sizeof(float)), 0);
    NC(ncclAllReduce(d, e, N, ncclFloat, ncclSum, comm, NULL));
    NC(ncclReduceScatter(e, d, N, ncclFloat, ncclSum, comm, NULL)); /* one rank: its whole slice */
    NC(ncclAllGather(d, e, N, ncclFloat, comm, NULL));
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    float *back = malloc(N * sizeof(float));
    assert_int_equal(cuda_copy_to_host(back, e, N * sizeof(float)), 0);
    assert_memory_equal(back, h, N * sizeof(float)); /* a sum over one rank is the identity */
    NC(ncclCommDestroy(comm));
    cuda_free(d), cuda_free(e);
    free(h), free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_one_rank_collectives),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
