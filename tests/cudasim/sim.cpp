// The emulator's per-thread state, its device memory (memfd mappings, shareable with CUDA IPC),
// its asynchronous streams and shared-memory events, and its fibers.
#include "sim.h"

#include <condition_variable>
#include <deque>
#include <fcntl.h>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <time.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
SIM_TLS uint3_ threadIdx SIM_TLS_IE{}, blockIdx SIM_TLS_IE{};
SIM_TLS dim3 gridDim SIM_TLS_IE, blockDim SIM_TLS_IE;
SIM_TLS unsigned char *sim_smem SIM_TLS_IE;
SIM_TLS size_t sim_smem_size SIM_TLS_IE;
SIM_TLS BlockSync *sim_bs SIM_TLS_IE;
/* ---- device memory: memfd mappings, so that CUDA IPC works between processes ---- */

namespace {
struct Mapping { int fd; size_t bytes; bool imported; bool pinned = false; bool registered = false; };
std::mutex alloc_mu;
std::map<void *, Mapping> allocs;
size_t allocated; /* bytes of this process's own allocations */
struct SimHandle { uint32_t magic; int32_t pid, fd; uint64_t bytes; };
const uint32_t HANDLE_MAGIC = 0x4d495343; /* "CSIM" */
}

static cudaError_t alloc(void **p, size_t b, bool pinned);

cudaError_t sim_owner_check()
{
    static std::atomic<pid_t> owner{0};
    pid_t me = getpid(), none = 0;
    if (owner.compare_exchange_strong(none, me) || none == me)
        return cudaSuccess;
    return cudaErrorInitializationError;
}

cudaError_t cudaMalloc(void **p, size_t b) { return alloc(p, b, false); }
cudaError_t cudaMallocHost(void **p, size_t b) { return alloc(p, b, true); }

static cudaError_t alloc(void **p, size_t b, bool pinned)
{
    if (cudaError_t e = sim_owner_check())
        return e;
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
    allocs[m] = {fd, bytes, false, pinned};
    if (!pinned)
        allocated += bytes;
    *p = m;
    return 0;
}

/* Host memory the caller owns, pinned: copies to and from it become asynchronous. CUDA refuses
 * a range that overlaps one already registered, and so does this. */
cudaError_t cudaHostRegister(void *p, size_t b, unsigned)
{
    std::lock_guard<std::mutex> g(alloc_mu);
    auto it = allocs.upper_bound(p);
    if (it != allocs.end() && (char *)it->first < (char *)p + b)
        return cudaErrorHostMemoryAlreadyRegistered;
    if (it != allocs.begin() && (--it, (char *)p < (char *)it->first + it->second.bytes))
        return cudaErrorHostMemoryAlreadyRegistered;
    allocs[p] = {-1, b, false, true, true};
    return 0;
}

cudaError_t cudaHostUnregister(void *p)
{
    std::lock_guard<std::mutex> g(alloc_mu);
    auto it = allocs.find(p);
    if (it == allocs.end() || !it->second.registered)
        return cudaErrorHostMemoryNotRegistered;
    allocs.erase(it);
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
    if (it == allocs.end() || it->second.imported != imported || it->second.registered)
        return cudaErrorInvalidValue;
    munmap(p, it->second.bytes);
    if (it->second.fd >= 0)
        close(it->second.fd);
    if (!imported && !it->second.pinned)
        allocated -= it->second.bytes;
    allocs.erase(it);
    return 0;
}

/* CUDA's cudaFree waits for the device. */
cudaError_t cudaFree(void *p) { return p ? (cudaDeviceSynchronize(), unmap(p, false)) : 0; }
cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }

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
    if (cudaError_t e_ = sim_owner_check())
        return e_;
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

/* ---- streams ---- */

namespace {
std::mutex device_mu; /* kernels and copies one at a time: kernels keep __shared__ arrays in statics */
struct Op { std::function<void()> fn; bool device; };
struct Stream {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Op> q;
    bool busy = false, stop = false;
    std::thread th;
};
std::mutex streams_mu;
std::set<Stream *> streams;

void run_op(Op &op)
{
    if (op.device) {
        std::lock_guard<std::mutex> g(device_mu);
        op.fn();
    } else {
        op.fn();
    }
}

void stream_main(Stream *s)
{
    std::minstd_rand rng((unsigned)(uintptr_t)s ^ (unsigned)getpid());
    for (;;) {
        Op op;
        {
            std::unique_lock<std::mutex> lk(s->mu);
            s->cv.wait(lk, [&] { return s->stop || !s->q.empty(); });
            if (s->q.empty())
                return;
            op = std::move(s->q.front());
            s->q.pop_front();
            s->busy = true;
        }
        timespec pause = {0, (long)(rng() % 100) * 1000}; /* late, as a GPU may be */
        nanosleep(&pause, nullptr);
        run_op(op);
        {
            std::lock_guard<std::mutex> lk(s->mu);
            s->busy = false;
        }
        s->cv.notify_all();
    }
}

double now_s() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
void nap() { timespec t = {0, 20000}; nanosleep(&t, nullptr); }
}

void sim_enqueue(cudaStream_t st, std::function<void()> fn, bool device)
{
    Op op{std::move(fn), device};
    if (!st) {
        run_op(op);
        return;
    }
    Stream *s = (Stream *)st;
    {
        std::lock_guard<std::mutex> lk(s->mu);
        s->q.push_back(std::move(op));
    }
    s->cv.notify_all();
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned)
{
    if (cudaError_t e_ = sim_owner_check())
        return e_;
    Stream *s = new Stream;
    s->th = std::thread(stream_main, s);
    std::lock_guard<std::mutex> g(streams_mu);
    streams.insert(s);
    *out = s;
    return 0;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    if (!st)
        return 0; /* the legacy stream ran everything in the caller */
    Stream *s = (Stream *)st;
    std::unique_lock<std::mutex> lk(s->mu);
    s->cv.wait(lk, [&] { return s->q.empty() && !s->busy; });
    return 0;
}

cudaError_t cudaStreamDestroy(cudaStream_t st)
{
    if (!st)
        return 0;
    Stream *s = (Stream *)st;
    cudaStreamSynchronize(st);
    {
        std::lock_guard<std::mutex> g(streams_mu);
        streams.erase(s);
    }
    {
        std::lock_guard<std::mutex> lk(s->mu);
        s->stop = true;
    }
    s->cv.notify_all();
    s->th.join();
    delete s;
    return 0;
}

cudaError_t cudaDeviceSynchronize()
{
    std::vector<Stream *> all;
    {
        std::lock_guard<std::mutex> g(streams_mu);
        all.assign(streams.begin(), streams.end());
    }
    for (Stream *s : all)
        cudaStreamSynchronize(s);
    return 0;
}

/* ---- events: counters in a memfd page, so another process can record or wait on them ---- */

namespace {
struct EventMem { std::atomic<uint64_t> issued, done; };
std::map<void *, int> event_fds; /* under alloc_mu */
struct EventHandle { uint32_t magic; int32_t pid, fd; };
const uint32_t EVENT_MAGIC = 0x54564543; /* "CEVT" */
const double WAIT_LIMIT_S = 300;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned)
{
    if (cudaError_t e_ = sim_owner_check())
        return e_;
    int fd = memfd_create("cudasim-event", MFD_CLOEXEC);
    void *m = fd < 0 || ftruncate(fd, 4096) ? MAP_FAILED : mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        if (fd >= 0)
            close(fd);
        return cudaErrorMemoryAllocation;
    }
    std::lock_guard<std::mutex> g(alloc_mu);
    event_fds[m] = fd;
    *e = m;
    return 0;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    std::lock_guard<std::mutex> g(alloc_mu);
    auto it = event_fds.find(e);
    if (it == event_fds.end())
        return cudaErrorInvalidValue;
    if (it->second >= 0)
        close(it->second);
    munmap(e, 4096);
    event_fds.erase(it);
    return 0;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st)
{
    EventMem *ev = (EventMem *)e;
    uint64_t n = ev->issued.fetch_add(1) + 1;
    sim_enqueue(st, [ev, n] {
        uint64_t d = ev->done.load();
        while (d < n && !ev->done.compare_exchange_weak(d, n))
            ;
    }, false);
    return 0;
}

static void wait_done(EventMem *ev, uint64_t target)
{
    for (double t0 = now_s(); ev->done.load() < target; nap())
        if (now_s() - t0 > WAIT_LIMIT_S) {
            fprintf(stderr, "cudasim: an event wait did not end in %.0f s (its recorder is gone?)\n", WAIT_LIMIT_S);
            abort();
        }
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e, unsigned)
{
    if (!e)
        return cudaErrorInvalidValue;
    EventMem *ev = (EventMem *)e;
    uint64_t target = ev->issued.load(); /* the records issued by now, as CUDA's wait */
    if (target)
        sim_enqueue(st, [ev, target] { wait_done(ev, target); }, false);
    return 0;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    EventMem *ev = (EventMem *)e;
    wait_done(ev, ev->issued.load());
    return 0;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e)
{
    std::lock_guard<std::mutex> g(alloc_mu);
    auto it = event_fds.find(e);
    if (it == event_fds.end() || it->second < 0)
        return cudaErrorInvalidValue;
    EventHandle s = {EVENT_MAGIC, (int32_t)getpid(), it->second};
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, &s, sizeof(s));
    return 0;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t h)
{
    EventHandle s;
    memcpy(&s, h.reserved, sizeof(s));
    if (s.magic != EVENT_MAGIC)
        return cudaErrorInvalidValue;
    void *m = sim_map_other(s.pid, s.fd, 4096);
    if (!m)
        return cudaErrorMapBufferObjectFailed;
    std::lock_guard<std::mutex> g(alloc_mu);
    event_fds[m] = -1;
    *e = m;
    return 0;
}

/* ---- copies ---- */

/* Whether p is pageable host memory: not device memory, not pinned host memory. */
static bool pageable(const void *p)
{
    std::lock_guard<std::mutex> g(alloc_mu);
    auto it = allocs.upper_bound((void *)p);
    if (it == allocs.begin())
        return true;
    --it;
    return !((const char *)p < (const char *)it->first + it->second.bytes);
}

/* Whether p is in host memory cudaHostRegister pinned (a segment the caller owns). */
static bool registered_host(const void *p)
{
    std::lock_guard<std::mutex> g(alloc_mu);
    auto it = allocs.upper_bound((void *)p);
    if (it == allocs.begin())
        return false;
    --it;
    return (const char *)p < (const char *)it->first + it->second.bytes && it->second.registered;
}

/* CTITAN_SIM_PINNED_COPY_DELAY_MS: an asynchronous copy into registered host memory (a segment
 * cudaHostRegister pinned: the shards' checkpoint staging) waits this long on its stream before
 * it reads its source, as a slow bus would; a caller that changes the source before the copy is
 * done then copies the changed bytes (tests of who waits for what). Copies into cudaMallocHost's
 * memory (a model's loss blocks and offload staging, every step) are not slowed. */
static unsigned pinned_copy_delay_us()
{
    static const unsigned us = [] {
        const char *v = getenv("CTITAN_SIM_PINNED_COPY_DELAY_MS");
        return v ? (unsigned)strtoul(v, nullptr, 10) * 1000u : 0u;
    }();
    return us;
}

cudaError_t cudaMemcpy(void *d, const void *src, size_t b, cudaMemcpyKind)
{
    sim_enqueue(nullptr, [=] { memmove(d, src, b); });
    return 0;
}

cudaError_t cudaMemcpyAsync(void *d, const void *src, size_t b, cudaMemcpyKind, cudaStream_t st)
{
    if (pageable(d)) { /* to pageable memory: returns once done */
        cudaStreamSynchronize(st);
        sim_enqueue(nullptr, [=] { memmove(d, src, b); });
    } else if (pageable(src)) { /* from pageable memory: the bytes as they are now */
        auto copy = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + b);
        sim_enqueue(st, [=] { memcpy(d, copy->data(), b); });
    } else {
        if (unsigned delay = registered_host(d) ? pinned_copy_delay_us() : 0) /* outside the device lock */
            sim_enqueue(st, [=] { usleep(delay); }, false);
        sim_enqueue(st, [=] { memmove(d, src, b); });
    }
    return 0;
}

cudaError_t cudaMemsetAsync(void *d, int v, size_t b, cudaStream_t st)
{
    sim_enqueue(st, [=] { memset(d, v, b); });
    return 0;
}

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
SIM_TLS std::vector<Fiber> *fibers SIM_TLS_IE;
SIM_TLS int current SIM_TLS_IE;
#if defined(__x86_64__)
SIM_TLS void *scheduler_sp SIM_TLS_IE;
#else
thread_local ucontext_t scheduler;
#endif
SIM_TLS const std::function<void()> *kernel_call SIM_TLS_IE;
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
    auto bsp = std::make_unique<BlockSync>(); /* ~130 KiB: not on the caller's stack */
    BlockSync &bs = *bsp;
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
                memset(bs.xpar, 0, sizeof bs.xpar);
                for (auto &c : bs.cp_pending)
                    c.clear();
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
