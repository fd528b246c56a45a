// The emulator's per-thread state, its device memory (memfd mappings, shareable with CUDA IPC)
// and its fibers.
#include "sim.h"

#include <fcntl.h>
#include <map>
#include <memory>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
thread_local uint3_ threadIdx, blockIdx;
thread_local dim3 gridDim, blockDim;
thread_local unsigned char *sim_smem;
thread_local size_t sim_smem_size;
thread_local BlockSync *sim_bs;
/* ---- device memory: memfd mappings, so that CUDA IPC works between processes ---- */

namespace {
struct Mapping { int fd; size_t bytes; bool imported; };
std::mutex alloc_mu;
std::map<void *, Mapping> allocs;
size_t allocated; /* bytes of this process's own allocations */
struct SimHandle { uint32_t magic; int32_t pid, fd; uint64_t bytes; };
const uint32_t HANDLE_MAGIC = 0x4d495343; /* "CSIM" */
}

cudaError_t cudaMalloc(void **p, size_t b)
{
    size_t bytes = b ? b : 1;
    int fd = memfd_create("cudasim", MFD_CLOEXEC);
    if (fd < 0)
        return cudaErrorMemoryAllocation;
    void *m = ftruncate(fd, (off_t)bytes) ? MAP_FAILED : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return cudaErrorMemoryAllocation;
    }
    memset(m, 0xff, bytes); /* NaN garbage, as fresh device memory may hold */
    std::lock_guard<std::mutex> g(alloc_mu);
    allocs[m] = {fd, bytes, false};
    allocated += bytes;
    *p = m;
    return 0;
}

cudaError_t cudaMemGetInfo(size_t *f, size_t *t)
{
    std::lock_guard<std::mutex> g(alloc_mu);
    *t = (size_t)80 << 30;
    *f = *t - allocated;
    return 0;
}

static cudaError_t unmap(void *p, bool imported)
{
    std::lock_guard<std::mutex> g(alloc_mu);
    auto it = allocs.find(p);
    if (it == allocs.end() || it->second.imported != imported)
        return cudaErrorInvalidValue;
    munmap(p, it->second.bytes);
    if (it->second.fd >= 0)
        close(it->second.fd);
    if (!imported)
        allocated -= it->second.bytes;
    allocs.erase(it);
    return 0;
}

cudaError_t cudaFree(void *p) { return p ? unmap(p, false) : 0; }

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
    std::lock_guard<std::mutex> g(alloc_mu);
    auto it = allocs.find(p);
    if (it == allocs.end() || it->second.imported) /* CUDA's rule: the base of an own allocation */
        return cudaErrorInvalidValue;
    SimHandle s = {HANDLE_MAGIC, (int32_t)getpid(), it->second.fd, it->second.bytes};
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, &s, sizeof(s));
    return 0;
}

void *sim_map_other(int pid, int fd, size_t bytes)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
    int mine = open(path, O_RDWR | O_CLOEXEC);
    if (mine < 0)
        return nullptr;
    void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mine, 0);
    close(mine);
    return m == MAP_FAILED ? nullptr : m;
}

cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned)
{
    SimHandle s;
    memcpy(&s, h.reserved, sizeof(s));
    if (s.magic != HANDLE_MAGIC || s.pid == getpid()) /* CUDA refuses a process's own handles too */
        return cudaErrorInvalidValue;
    void *m = sim_map_other(s.pid, s.fd, s.bytes);
    if (!m)
        return cudaErrorMapBufferObjectFailed;
    std::lock_guard<std::mutex> g(alloc_mu);
    allocs[m] = {-1, s.bytes, true};
    *p = m;
    return 0;
}

cudaError_t cudaIpcCloseMemHandle(void *p) { return unmap(p, true); }

/* ---- fibers ---- */

/* A fiber switch saves the callee-saved registers and the stack pointer, and restores another
 * fiber's. glibc's swapcontext also saves the signal mask with a system call on every switch,
 * which made the emulator spend half its time in the kernel; on x86-64 this does without. */
#if defined(__x86_64__)
extern "C" void sim_switch(void **save_sp, void *load_sp);
asm(R"(
    .text
    .globl sim_switch
    .type sim_switch, @function
sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size sim_switch, .-sim_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#endif

namespace {
struct Fiber {
#if defined(__x86_64__)
    void *sp;
#else
    ucontext_t ctx;
#endif
    int state;   /* 0 runnable, 1 waiting, 2 done */
    int wait_on; /* -1 block, w warp */
    uint3_ tid;
};
thread_local std::vector<Fiber> *fibers;
thread_local int current;
#if defined(__x86_64__)
thread_local void *scheduler_sp;
#else
thread_local ucontext_t scheduler;
#endif
thread_local const std::function<void()> *kernel_call;
const size_t STACK = 128 * 1024;

void to_scheduler(Fiber &f)
{
#if defined(__x86_64__)
    sim_switch(&f.sp, scheduler_sp);
#else
    swapcontext(&f.ctx, &scheduler);
#endif
}

void trampoline()
{
    (*kernel_call)();
    Fiber &f = (*fibers)[current];
    f.state = 2;
    to_scheduler(f); /* never resumed */
    abort();
}

void fiber_start(Fiber &f, char *stack)
{
#if defined(__x86_64__)
    void **sp = (void **)(((uintptr_t)(stack + STACK)) & ~(uintptr_t)15);
    *--sp = nullptr;                 /* trampoline's return address: never used, keeps the ABI's alignment */
    *--sp = (void *)trampoline;      /* where sim_switch's ret goes */
    for (int i = 0; i < 6; i++)      /* rbp rbx r12 r13 r14 r15 */
        *--sp = nullptr;
    f.sp = sp;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack;
    f.ctx.uc_stack.ss_size = STACK;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, trampoline, 0);
#endif
}

void run_fiber(Fiber &f)
{
#if defined(__x86_64__)
    sim_switch(&scheduler_sp, f.sp);
#else
    swapcontext(&scheduler, &f.ctx);
#endif
}
}

void sim_wait(int warp)
{
    Fiber &f = (*fibers)[current];
    f.state = 1;
    f.wait_on = warp;
    to_scheduler(f);
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
                    fiber_start(f[t], stacks.get() + (size_t)t * STACK);
                    f[t].state = 0;
                    f[t].tid = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                }
                for (;;) {
                    for (unsigned t = 0; t < T; t++)
                        if (f[t].state == 0) {
                            current = (int)t;
                            threadIdx = f[t].tid;
                            run_fiber(f[t]);
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
