// The emulator's stand-in for NCCL (fake/nccl.h) between real processes: an id names a memfd
// of the process that made it (/proc/PID/fd/FD, as the emulator's CUDA IPC handles do); each
// communicator maps it. Point-to-point messages go through a ring of slots per ordered pair of
// ranks (a send returns once its bytes are in the ring, as a send of NCCL's does once the
// receiver has them); collectives write each rank's input into its area, meet at a barrier,
// and reduce in rank order. Each call is queued on its stream like a kernel.
#include "fake/nccl.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

namespace {
const uint32_t MAGIC = 0x4c43434e; /* "NCCL" */
const int MAX_RANKS = 16, NSLOT = 16;
const size_t SLOT = 128 << 10, AREA = 16 << 20, HDR = 4096;
const size_t CHANNEL = 64 + NSLOT * (8 + SLOT);
const size_t AREAS = HDR + (size_t)MAX_RANKS * MAX_RANKS * CHANNEL;
const size_t TOTAL = AREAS + (size_t)MAX_RANKS * AREA; /* sparse: only what is touched costs */
const double TIMEOUT_S = 120;

struct Id { uint32_t magic; int32_t pid, fd; };
struct Hdr { std::atomic<uint32_t> joined, bar_count, bar_gen; int32_t nranks; };
struct Channel { std::atomic<uint64_t> head, tail; };

double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
void nap() { timespec t = {0, 20000}; nanosleep(&t, nullptr); }
}

struct ncclComm { char *base; int rank, nranks; };

static Hdr *hdr(ncclComm_t c) { return (Hdr *)c->base; }
static Channel *channel(ncclComm_t c, int from, int to) { return (Channel *)(c->base + HDR + ((size_t)from * MAX_RANKS + to) * CHANNEL); }
static char *slot(Channel *ch, uint64_t i) { return (char *)ch + 64 + (i % NSLOT) * (8 + SLOT); }
static char *area(ncclComm_t c, int r) { return c->base + AREAS + (size_t)r * AREA; }

/* Every rank of c waits here until all have arrived. */
static ncclResult_t barrier(ncclComm_t c)
{
    Hdr *h = hdr(c);
    uint32_t gen = h->bar_gen.load();
    if (h->bar_count.fetch_add(1) + 1 == (uint32_t)c->nranks) {
        h->bar_count.store(0);
        h->bar_gen.fetch_add(1);
        return ncclSuccess;
    }
    for (double t0 = now(); h->bar_gen.load() == gen; nap())
        if (now() - t0 > TIMEOUT_S)
            return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    int fd = memfd_create("ncclsim", MFD_CLOEXEC); /* kept open: the id lives as long as this process */
    if (fd < 0 || ftruncate(fd, (off_t)TOTAL))
        return ncclSystemError;
    Id s = {MAGIC, (int32_t)getpid(), fd};
    memset(id, 0, sizeof(*id));
    memcpy(id->internal, &s, sizeof(s));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    Id s;
    memcpy(&s, id.internal, sizeof(s));
    if (s.magic != MAGIC || nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    void *m = sim_map_other(s.pid, s.fd, TOTAL);
    if (!m)
        return ncclSystemError;
    ncclComm_t c = new ncclComm{(char *)m, rank, nranks};
    Hdr *h = hdr(c);
    int32_t zero = 0;
    __atomic_compare_exchange_n(&h->nranks, &zero, nranks, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->nranks, __ATOMIC_SEQ_CST) != nranks) {
        munmap(m, TOTAL);
        delete c;
        return ncclInvalidUsage;
    }
    h->joined.fetch_add(1);
    for (double t0 = now(); h->joined.load() < (uint32_t)nranks; nap()) /* NCCL's init is collective */
        if (now() - t0 > TIMEOUT_S)
            return ncclSystemError;
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    munmap(c->base, TOTAL);
    delete c;
    return ncclSuccess;
}

static size_t type_bytes(ncclDataType_t t) { return t == ncclFloat32 ? 4 : t == ncclBfloat16 ? 2 : 1; }

static ncclResult_t do_send(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c)
{
    size_t bytes = count * type_bytes(t); /* arguments checked when queued (ncclSend) */
    Channel *ch = channel(c, c->rank, peer);
    uint64_t head = ch->head.load();
    for (double t0 = now(); head - ch->tail.load() == (uint64_t)NSLOT; nap())
        if (now() - t0 > TIMEOUT_S)
            return ncclSystemError;
    char *s = slot(ch, head);
    memcpy(s, &bytes, 8);
    memcpy(s + 8, buf, bytes);
    ch->head.store(head + 1);
    return ncclSuccess;
}

static ncclResult_t do_recv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c)
{
    size_t bytes = count * type_bytes(t), got;
    Channel *ch = channel(c, peer, c->rank);
    uint64_t tail = ch->tail.load();
    for (double t0 = now(); ch->head.load() == tail; nap())
        if (now() - t0 > TIMEOUT_S)
            return ncclSystemError;
    char *s = slot(ch, tail);
    memcpy(&got, s, 8);
    if (got != bytes) /* NCCL would hang or corrupt; the stand-in says so */
        return ncclInvalidUsage;
    memcpy(buf, s + 8, bytes);
    ch->tail.store(tail + 1);
    return ncclSuccess;
}

static ncclResult_t do_reduce_scatter(const void *send, void *recv, size_t count, ncclComm_t c)
{
    memcpy(area(c, c->rank), send, count * c->nranks * 4);
    ncclResult_t r = barrier(c);
    if (r)
        return r;
    float *out = (float *)recv;
    for (size_t i = 0; i < count; i++) {
        float s = 0;
        for (int k = 0; k < c->nranks; k++) /* rank order */
            s += ((const float *)area(c, k))[c->rank * count + i];
        out[i] = s;
    }
    return barrier(c);
}

static ncclResult_t do_all_gather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c)
{
    size_t bytes = count * type_bytes(t);
    memmove(area(c, c->rank), send, bytes);
    ncclResult_t r = barrier(c);
    if (r)
        return r;
    for (int k = 0; k < c->nranks; k++)
        memcpy((char *)recv + k * bytes, area(c, k), bytes);
    return barrier(c);
}

/* recv (every rank) = root's send */
static ncclResult_t do_broadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t c)
{
    size_t bytes = count * type_bytes(t);
    if (c->rank == root)
        memcpy(area(c, root), send, bytes);
    ncclResult_t r = barrier(c);
    if (r)
        return r;
    if (c->rank != root || recv != send)
        memmove(recv, area(c, root), bytes);
    return barrier(c);
}

/* recv (root only) = the sum of every rank's send, in rank order; bf16: each partial sum
 * rounded to bf16 (as NCCL's bf16 sum is at each step) */
static ncclResult_t do_reduce(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t c)
{
    memcpy(area(c, c->rank), send, count * type_bytes(t));
    ncclResult_t r = barrier(c);
    if (r)
        return r;
    for (size_t i = 0; c->rank == root && i < count; i++) {
        if (t == ncclBfloat16) {
            __nv_bfloat16 s = ((const __nv_bfloat16 *)area(c, 0))[i];
            for (int k = 1; k < c->nranks; k++)
                s = __float2bfloat16(__bfloat162float(s) + __bfloat162float(((const __nv_bfloat16 *)area(c, k))[i]));
            ((__nv_bfloat16 *)recv)[i] = s;
            continue;
        }
        float s = 0;
        for (int k = 0; k < c->nranks; k++)
            s += ((const float *)area(c, k))[i];
        ((float *)recv)[i] = s;
    }
    return barrier(c);
}

/* The calls: checked now, queued on the stream (outside the device lock: they wait for peers). A
 * failure inside the queue is reported and ends the process, as a hung NCCL would stop it. */
static ncclResult_t queue(cudaStream_t s, const char *what, std::function<ncclResult_t()> op)
{
    sim_enqueue(s, [=] {
        ncclResult_t r = op();
        if (r) {
            fprintf(stderr, "cudasim: %s: %s\n", what, ncclGetErrorString(r));
            abort();
        }
    }, false);
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    if (peer < 0 || peer >= c->nranks || peer == c->rank || count * type_bytes(t) > SLOT)
        return ncclInvalidArgument;
    return queue(s, "ncclSend", [=] { return do_send(buf, count, t, peer, c); });
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    if (peer < 0 || peer >= c->nranks || peer == c->rank)
        return ncclInvalidArgument;
    return queue(s, "ncclRecv", [=] { return do_recv(buf, count, t, peer, c); });
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t,
                               ncclComm_t c, cudaStream_t s)
{
    if (t != ncclFloat32 || count * c->nranks * 4 > AREA)
        return ncclInvalidArgument;
    return queue(s, "ncclReduceScatter", [=] { return do_reduce_scatter(send, recv, count, c); });
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t s)
{
    if (count * type_bytes(t) > AREA)
        return ncclInvalidArgument;
    return queue(s, "ncclAllGather", [=] { return do_all_gather(send, recv, count, t, c); });
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t s)
{
    if (root < 0 || root >= c->nranks || count * type_bytes(t) > AREA)
        return ncclInvalidArgument;
    return queue(s, "ncclBroadcast", [=] { return do_broadcast(send, recv, count, t, root, c); });
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t, int root,
                        ncclComm_t c, cudaStream_t s)
{
    if ((t != ncclFloat32 && t != ncclBfloat16) || root < 0 || root >= c->nranks || count * type_bytes(t) > AREA)
        return ncclInvalidArgument;
    return queue(s, "ncclReduce", [=] { return do_reduce(send, recv, count, t, root, c); });
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "emulated NCCL: a system call failed or a peer never came (120 s)";
    case ncclInvalidArgument: return "emulated NCCL: invalid argument (or over the stand-in's sizes)";
    case ncclInvalidUsage: return "emulated NCCL: invalid usage (mismatched sizes or rank counts)";
    default: return "emulated NCCL: error";
    }
}
