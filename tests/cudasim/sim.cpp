// The emulator's per-thread state and the stand-ins for cuda_ops.h's runtime helpers (host memory;
// cuda_last_error comes from kernels/cuda/cuda_err.cu, built with the emulated kernels).
#include "sim.h"

#include <memory>
#include <ucontext.h>
thread_local uint3_ threadIdx, blockIdx;
thread_local dim3 gridDim, blockDim;
thread_local unsigned char *sim_smem;
thread_local size_t sim_smem_size;
thread_local BlockSync *sim_bs;
extern "C" {
int cuda_device_count(void) { return 1; }
int cuda_alloc(void **p, size_t b) { if (posix_memalign(p, 256, b)) return -12; memset(*p, 0xff, b); return 0; }
int cuda_free(void *p) { free(p); return 0; }
int cuda_copy_to_device(void *d, const void *s, size_t b) { memcpy(d, s, b); return 0; }
int cuda_copy_to_host(void *d, const void *s, size_t b) { memcpy(d, s, b); return 0; }
}

/* ---- fibers ---- */

namespace {
struct Fiber {
    ucontext_t ctx;
    int state;   /* 0 runnable, 1 waiting, 2 done */
    int wait_on; /* -1 block, w warp */
    uint3_ tid;
};
thread_local std::vector<Fiber> *fibers;
thread_local int current;
thread_local ucontext_t scheduler;
thread_local const std::function<void()> *kernel_call;
const size_t STACK = 128 * 1024;

void trampoline()
{
    (*kernel_call)();
    Fiber &f = (*fibers)[current];
    f.state = 2;
    swapcontext(&f.ctx, &scheduler); /* never resumed */
}
}

void sim_wait(int warp)
{
    Fiber &f = (*fibers)[current];
    f.state = 1;
    f.wait_on = warp;
    swapcontext(&f.ctx, &scheduler);
}

void sim_run(dim3 grid, dim3 block, size_t smem, const std::function<void()> &kernel)
{
    unsigned T = block.x * block.y * block.z;
    static thread_local std::unique_ptr<char[]> stacks; /* kept: mapping them is what costs */
    static thread_local size_t stack_threads;
    if (stack_threads < T) {
        stacks.reset(new char[T * STACK]);
        stack_threads = T;
    }
    std::vector<Fiber> f(T);
    unsigned char *buf = smem ? (unsigned char *)aligned_alloc(128, (smem + 127) / 128 * 128) : nullptr;
    BlockSync bs;
    fibers = &f;
    kernel_call = &kernel;
    gridDim = grid, blockDim = block, sim_smem = buf, sim_smem_size = smem, sim_bs = &bs;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                if (buf)
                    memset(buf, 0xff, smem); /* NaN garbage: uninitialised smem must not matter */
                blockIdx = {x, y, z};
                bs.any = 0;
                for (unsigned t = 0; t < T; t++) {
                    getcontext(&f[t].ctx);
                    f[t].ctx.uc_stack.ss_sp = stacks.get() + (size_t)t * STACK;
                    f[t].ctx.uc_stack.ss_size = STACK;
                    f[t].ctx.uc_link = nullptr;
                    makecontext(&f[t].ctx, trampoline, 0);
                    f[t].state = 0;
                    f[t].tid = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                }
                for (;;) {
                    for (unsigned t = 0; t < T; t++)
                        if (f[t].state == 0) {
                            current = (int)t;
                            threadIdx = f[t].tid;
                            swapcontext(&scheduler, &f[t].ctx);
                        }
                    unsigned live = 0, at_block = 0;
                    for (unsigned t = 0; t < T; t++)
                        if (f[t].state != 2) {
                            live++;
                            at_block += f[t].wait_on == -1;
                        }
                    if (!live)
                        break;
                    if (at_block == live) { /* everyone at __syncthreads */
                        for (auto &e : f)
                            if (e.state == 1)
                                e.state = 0;
                        continue;
                    }
                    bool released = false;
                    for (unsigned w = 0; w * 32 < T; w++) {
                        bool all = true, some = false;
                        for (unsigned t = w * 32; t < T && t < w * 32 + 32; t++)
                            if (f[t].state == 1) {
                                some = true;
                                all &= f[t].wait_on == (int)w;
                            }
                        if (some && all) {
                            for (unsigned t = w * 32; t < T && t < w * 32 + 32; t++)
                                if (f[t].state == 1)
                                    f[t].state = 0;
                            released = true;
                        }
                    }
                    if (!released) {
                        fprintf(stderr, "cudasim: deadlock: threads wait at different barriers\n");
                        abort();
                    }
                }
            }
    free(buf);
}
