/* Tests of the SPSC shared-memory ring (ipc/ring.c), the data plane between processes on a
 * host: header checks, order and wrap-around in one process, then real producer and
 * consumer processes over a shm segment (streaming, blocking without spinning, close,
 * a producer that dies mid-slot). Segments are named after this run's pid and all removed. */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ipc/ring.h"
#include "ipc/shm.h"
#include "tests/testutil.h"
#include "ipc/util.h"

#define PAGE 4096u

/* The start of ring.c's header, for the tests that corrupt it on purpose (every format
 * starts with its magic and version; the sizes follow). */
typedef struct {
    uint64_t magic;
    uint32_t version, nslots;
    uint64_t slot_bytes, total_bytes, payload_off;
} hdr_prefix_t;

/* The per-slot meta follows the 4 KiB header (ring.h). */
static ring_meta_t *meta_of(void *mem) { return (ring_meta_t *)((char *)mem + PAGE); }

/* ---- fixture: this run's job, the rings a test made, its children ----------------------- */

static char job[32];

#define MAX_RINGS 4
#define MAX_KIDS 4
static struct {
    shm_seg_t *seg[MAX_RINGS];
    ring_t *ring[MAX_RINGS];
    int n;
    pid_t kids[MAX_KIDS];
    int ready[2]; /* a child writes a byte here just before it blocks */
} fx;

/* What children report back, in memory shared with them. */
typedef struct {
    double wait_s, wait_cpu_s;
    uint64_t full_waits, empty_waits;
    size_t off[2];
    int rc;
} report_t;
static report_t *rep;

static int setup(void **state)
{
    (void)state;
    snprintf(job, sizeof(job), "t%d", (int)getpid());
    memset(&fx, 0, sizeof(fx));
    if (pipe(fx.ready) < 0)
        return -1;
    rep = mmap(NULL, sizeof(*rep), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return rep == MAP_FAILED ? -1 : 0;
}

/* Kills and reaps any child a failed test left behind, detaches and removes every segment. */
static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < MAX_KIDS; i++)
        if (fx.kids[i]) {
            kill(fx.kids[i], SIGKILL);
            waitpid(fx.kids[i], NULL, 0);
        }
    for (int i = 0; i < fx.n; i++) {
        ring_detach(&fx.ring[i]);
        shm_detach(&fx.seg[i]);
    }
    close(fx.ready[0]);
    close(fx.ready[1]);
    munmap(rep, sizeof(*rep));
    shm_remove_all(job);
    char names[1][SHM_NAME_MAX];
    return shm_list(job, names, 1) == 0 ? 0 : -1;
}

/* A segment of the job holding a freshly formatted ring; fx owns both. */
static ring_t *new_ring(const char *name, uint32_t nslots, size_t slot_bytes, uint64_t base)
{
    char err[256] = "";
    assert_true(fx.n < MAX_RINGS);
    shm_seg_t *s = NULL;
    ring_t *r = NULL;
    if (shm_create(&s, job, name, ring_bytes(nslots, slot_bytes), err, sizeof(err)))
        fail_msg("%s", err);
    fx.seg[fx.n] = s;
    assert_int_equal(ring_format(shm_data(s), shm_size(s), nslots, slot_bytes, base), 0);
    if (ring_attach(&r, shm_data(s), shm_size(s), name, err, sizeof(err)))
        fail_msg("%s", err);
    fx.ring[fx.n++] = r;
    return r;
}

static void sleep_s(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static double cpu_s(const struct rusage *ru)
{
    return ru->ru_utime.tv_sec + ru->ru_utime.tv_usec * 1e-6 + ru->ru_stime.tv_sec +
           ru->ru_stime.tv_usec * 1e-6;
}

/* ---- child processes ------------------------------------------------------------------ */

/* A child runs plain C checks, never cmocka's asserts (they would unwind into the child's
 * copy of the test runner); the first failed check prints itself and becomes exit status 1. */
#define CHECK(c)                                                                            \
    do {                                                                                    \
        if (!(c)) {                                                                         \
            fprintf(stderr, "%s:%d: check failed in child: %s\n", __FILE__, __LINE__, #c);  \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

static pid_t spawn(int (*fn)(void *), void *arg)
{
    fflush(NULL); /* or buffered output would be written twice */
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30); /* last resort should the parent be gone; its own limits are shorter */
        _exit(fn(arg));
    }
    assert_true(pid > 0);
    for (int i = 0; i < MAX_KIDS; i++)
        if (!fx.kids[i]) {
            fx.kids[i] = pid;
            break;
        }
    return pid;
}

/* tu_reap, and the child is no longer one to clean up. */
static int reap(pid_t pid, double timeout_s, struct rusage *ru)
{
    int rc = tu_reap(pid, timeout_s, ru);
    for (int i = 0; i < MAX_KIDS; i++)
        if (fx.kids[i] == pid)
            fx.kids[i] = 0;
    return rc;
}

/* Child side: says it is about to block. */
static void say_ready(void)
{
    char c = 1;
    while (write(fx.ready[1], &c, 1) < 0 && errno == EINTR)
        ;
}

/* Parent side: waits (up to 5 s) until the child says it is about to block. */
static void wait_ready(void)
{
    struct pollfd p = {.fd = fx.ready[0], .events = POLLIN};
    int n;
    while ((n = poll(&p, 1, 5000)) < 0 && errno == EINTR)
        ;
    assert_int_equal(n, 1);
    char c;
    assert_int_equal(read(fx.ready[0], &c, 1), 1);
}

/* Child side: its own mapping of the named ring segment, as a separate process has. */
static int child_attach(const char *name, shm_seg_t **s, ring_t **r)
{
    char err[256] = "";
    CHECK(shm_attach(s, job, name, err, sizeof(err)) == 0);
    CHECK(ring_attach(r, shm_data(*s), shm_size(*s), name, err, sizeof(err)) == 0);
    return 0;
}

/* ---- message contents: a length and bytes that follow from the message index ---------- */

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static size_t msg_len(uint64_t i, size_t slot_bytes)
{
    if (i % 7 == 0)
        return slot_bytes; /* a full slot now and then, and an empty one */
    if (i % 11 == 0)
        return 0;
    return (size_t)(mix(i) % (slot_bytes + 1));
}

static void msg_fill(void *p, size_t len, uint64_t i)
{
    unsigned char *d = p;
    for (size_t k = 0; k < len; k += 8) {
        uint64_t w = mix(i * 1000003u + k);
        memcpy(d + k, &w, len - k < 8 ? len - k : 8);
    }
}

/* Index of the first byte that differs from msg_fill's, or len. */
static size_t msg_check(const void *p, size_t len, uint64_t i)
{
    const unsigned char *d = p;
    for (size_t k = 0; k < len; k += 8) {
        uint64_t w = mix(i * 1000003u + k);
        size_t n = len - k < 8 ? len - k : 8;
        if (memcmp(d + k, &w, n))
            return k;
    }
    return len;
}

static uint64_t fnv1a(const void *p, size_t len)
{
    const unsigned char *d = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t k = 0; k < len; k++)
        h = (h ^ d[k]) * 0x100000001b3ULL;
    return h;
}

/* ---- header and arguments --------------------------------------------------------------- */

static void test_ring_bytes_covers_header_meta_and_page_aligned_slots(void **state)
{
    uint32_t ns[] = {1, 2, 3, 127, 128, 129, 1000};
    size_t sb[] = {0, 1, PAGE - 1, PAGE, PAGE + 1, 1u << 20};
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
        for (size_t j = 0; j < sizeof(sb) / sizeof(sb[0]); j++) {
            size_t b = ring_bytes(ns[i], sb[j]);
            size_t slot = sb[j] ? (sb[j] + PAGE - 1) / PAGE * PAGE : PAGE;
            assert_int_equal(b % PAGE, 0);
            assert_true(b >= PAGE + ns[i] * sizeof(ring_meta_t) + ns[i] * slot);
        }
    assert_int_equal(ring_bytes(4, 100), PAGE + PAGE + 4 * PAGE);
}

static void test_ring_format_rejects_bad_arguments(void **state)
{
    size_t need = ring_bytes(2, 100);
    void *mem = NULL;
    assert_int_equal(posix_memalign(&mem, PAGE, need + PAGE), 0);
    assert_int_equal(ring_format(NULL, need, 2, 100, 0), -EINVAL);
    assert_int_equal(ring_format(mem, need, 0, 100, 0), -EINVAL);
    assert_int_equal(ring_format((char *)mem + 64, need, 2, 100, 0), -EINVAL);
    assert_int_equal(ring_format(mem, need - 1, 2, 100, 0), -EINVAL);
    assert_int_equal(ring_format(mem, need, 3, 100, 0), -EINVAL); /* too small for 3 slots */
    assert_int_equal(ring_format(mem, need, 2, 100, 0), 0);
    free(mem);
}

static void test_ring_attach_reports_geometry_and_an_empty_stream(void **state)
{
    ring_t *r = new_ring("geo", 3, 100, 777);
    assert_string_equal(ring_name(r), "geo");
    assert_int_equal(ring_nslots(r), 3);
    assert_int_equal(ring_slot_bytes(r), PAGE); /* rounded up to a page */
    assert_int_equal(ring_base(r), 777);
    assert_int_equal(ring_head(r), 0);
    assert_int_equal(ring_tail(r), 0);
    assert_false(ring_closed(r));
    /* slots are page-aligned in the segment */
    void *p = NULL;
    assert_int_equal(ring_reserve(r, 0, &p), 0);
    assert_int_equal((uintptr_t)p % PAGE, 0);
}

/* Formats a 2-slot ring in a segment, lets `spoil` damage it, and returns ring_attach's rc
 * with its message in err; r must stay unset on failure. */
static int attach_spoiled(void (*spoil)(void *mem, size_t *bytes), char *err, size_t errlen)
{
    if (!fx.n) {
        char e[256];
        shm_seg_t *s = NULL;
        if (shm_create(&s, job, "spoilt", ring_bytes(2, 100), e, sizeof(e)))
            fail_msg("%s", e);
        fx.seg[fx.n++] = s;
    }
    void *mem = shm_data(fx.seg[0]);
    size_t bytes = shm_size(fx.seg[0]);
    assert_int_equal(ring_format(mem, bytes, 2, 100, 0), 0);
    spoil(mem, &bytes);
    ring_t *r = NULL;
    err[0] = '\0';
    int rc = ring_attach(&r, mem, bytes, "acts-s1", err, errlen);
    if (rc)
        assert_null(r);
    ring_detach(&r);
    return rc;
}

static void spoil_nothing(void *mem, size_t *bytes) { (void)mem, (void)bytes; }
static void spoil_magic(void *mem, size_t *bytes) { ((hdr_prefix_t *)mem)->magic ^= 1; }
static void spoil_all(void *mem, size_t *bytes) { memset(mem, 0, PAGE); }
static void spoil_short(void *mem, size_t *bytes) { *bytes = PAGE - 1; }
static void spoil_version(void *mem, size_t *bytes) { ((hdr_prefix_t *)mem)->version = 2; }
static void spoil_bytes(void *mem, size_t *bytes) { *bytes -= PAGE; }
static void spoil_nslots(void *mem, size_t *bytes) { ((hdr_prefix_t *)mem)->nslots = 3; }
static void spoil_nslots0(void *mem, size_t *bytes) { ((hdr_prefix_t *)mem)->nslots = 0; }
static void spoil_slot_bytes(void *mem, size_t *bytes) { ((hdr_prefix_t *)mem)->slot_bytes = 2 * PAGE; }
static void spoil_total(void *mem, size_t *bytes) { ((hdr_prefix_t *)mem)->total_bytes -= PAGE; }
static void spoil_payload_off(void *mem, size_t *bytes) { ((hdr_prefix_t *)mem)->payload_off += PAGE; }

static void test_ring_attach_rejects_bad_magic_naming_the_ring(void **state)
{
    char err[256];
    assert_int_equal(attach_spoiled(spoil_nothing, err, sizeof(err)), 0);
    void (*spoils[])(void *, size_t *) = {spoil_magic, spoil_all, spoil_short};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(attach_spoiled(spoils[i], err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "acts-s1"));
        assert_non_null(strstr(err, "magic"));
    }
    ring_t *r = NULL;
    assert_int_equal(ring_attach(&r, NULL, PAGE, "nil", err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "nil"));
}

static void test_ring_attach_rejects_wrong_version_naming_the_ring(void **state)
{
    char err[256];
    assert_int_equal(attach_spoiled(spoil_version, err, sizeof(err)), -EPROTO);
    assert_non_null(strstr(err, "acts-s1"));
    assert_non_null(strstr(err, "version 2"));
}

static void test_ring_attach_rejects_inconsistent_sizes_naming_the_ring(void **state)
{
    void (*spoils[])(void *, size_t *) = {spoil_bytes, spoil_nslots, spoil_nslots0,
                                          spoil_slot_bytes, spoil_total, spoil_payload_off};
    for (size_t i = 0; i < sizeof(spoils) / sizeof(spoils[0]); i++) {
        char err[256];
        int rc = attach_spoiled(spoils[i], err, sizeof(err));
        if (rc != -EINVAL)
            fail_msg("spoil %zu: rc %d (%s)", i, rc, err);
        assert_non_null(strstr(err, "acts-s1"));
        assert_non_null(strstr(err, "inconsistent"));
    }
}

/* ---- one process ------------------------------------------------------------------------ */

static void test_ring_single_process_fifo_keeps_order_tags_and_lengths(void **state)
{
    ring_t *r = new_ring("fifo", 4, 100, 0);
    size_t sb = ring_slot_bytes(r), lens[] = {0, 1, 100, sb};
    for (uint64_t i = 0; i < 4; i++) {
        void *p = NULL;
        assert_int_equal(ring_reserve(r, 0, &p), 0);
        msg_fill(p, lens[i], i);
        assert_int_equal(ring_commit(r, 10 + i, 20 + i, lens[i]), 0);
        assert_int_equal(ring_head(r), i + 1);
    }
    for (uint64_t i = 0; i < 4; i++) {
        void *p = NULL, *q = NULL;
        ring_meta_t m, m2;
        assert_int_equal(ring_peek(r, 0, &p, &m), 0);
        assert_int_equal(m.seq, i);
        assert_int_equal(m.tag[0], 10 + i);
        assert_int_equal(m.tag[1], 20 + i);
        assert_int_equal(m.len, lens[i]);
        assert_int_equal(msg_check(p, lens[i], i), lens[i]);
        /* peeking again before release shows the same slot; meta is optional */
        assert_int_equal(ring_peek(r, 0, &q, &m2), 0);
        assert_ptr_equal(p, q);
        assert_memory_equal(&m, &m2, sizeof(m));
        assert_int_equal(ring_peek(r, 0, &q, NULL), 0);
        assert_ptr_equal(p, q);
        assert_int_equal(ring_tail(r), i);
        ring_release(r);
        assert_int_equal(ring_tail(r), i + 1);
    }
    void *p = NULL;
    assert_int_equal(ring_peek(r, 0, &p, NULL), -ETIMEDOUT);
}

static void test_ring_full_ring_makes_reserve_time_out(void **state)
{
    ring_t *r = new_ring("full", 2, 1, 0);
    void *p = NULL, *q = NULL;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ring_reserve(r, 0, &p), 0);
        assert_int_equal(ring_commit(r, i, 0, 1), 0);
    }
    double t0 = util_now();
    assert_int_equal(ring_reserve(r, 0, &q), -ETIMEDOUT);
    assert_true(util_now() - t0 < 1.0);
    /* a timed wait returns no earlier than its deadline (by the same clock), and not hours
     * later */
    t0 = util_now();
    assert_int_equal(ring_reserve(r, 50, &q), -ETIMEDOUT);
    double dt = util_now() - t0;
    assert_true(dt >= 0.049 && dt < 2.0);
    assert_int_equal(ring_head(r), 2);
    /* one release makes room for exactly one */
    assert_int_equal(ring_peek(r, 0, &p, NULL), 0);
    ring_release(r);
    assert_int_equal(ring_reserve(r, 0, &q), 0);
    assert_ptr_equal(p, q); /* the slot just freed */
    assert_int_equal(ring_commit(r, 2, 0, 1), 0);
    assert_int_equal(ring_reserve(r, 0, &q), -ETIMEDOUT);
}

static void test_ring_empty_ring_makes_peek_time_out(void **state)
{
    ring_t *r = new_ring("empty", 2, 1, 0);
    void *p = NULL;
    ring_meta_t m;
    double t0 = util_now();
    assert_int_equal(ring_peek(r, 0, &p, &m), -ETIMEDOUT);
    assert_true(util_now() - t0 < 1.0);
    t0 = util_now();
    assert_int_equal(ring_peek(r, 50, &p, &m), -ETIMEDOUT);
    double dt = util_now() - t0;
    assert_true(dt >= 0.049 && dt < 2.0);
    /* a reserved but uncommitted slot is not visible */
    assert_int_equal(ring_reserve(r, 0, &p), 0);
    assert_int_equal(ring_peek(r, 0, &p, &m), -ETIMEDOUT);
    assert_int_equal(ring_commit(r, 5, 6, 0), 0);
    assert_int_equal(ring_peek(r, 0, &p, &m), 0);
    assert_int_equal(m.tag[0], 5);
    ring_release(r);
    assert_int_equal(ring_peek(r, 0, &p, &m), -ETIMEDOUT);
}

static void test_ring_wraps_after_full_cycle(void **state)
{
    enum { NS = 3, CYCLES = 1000 };
    ring_t *r = new_ring("wrap", NS, 64, 0);
    void *slot0 = NULL;
    assert_int_equal(ring_reserve(r, 0, &slot0), 0);
    size_t sb = ring_slot_bytes(r);
    uint64_t in = 0, out = 0;
    for (int c = 0; c < CYCLES; c++) {
        /* alternate filling the ring to the brim with trickling a part of it through, so
         * head and tail cross every slot boundary in both states */
        int burst = c % 2 ? NS : 1 + c % NS;
        for (int k = 0; k < burst; k++, in++) {
            void *p = NULL;
            assert_int_equal(ring_reserve(r, 0, &p), 0);
            assert_ptr_equal(p, (char *)slot0 + (in % NS) * sb);
            assert_int_equal(ring_slot_of(r, p), in % NS); /* what device rings index by */
            memcpy(p, &in, sizeof(in));
            assert_int_equal(ring_commit(r, in, ~in, sizeof(in)), 0);
        }
        if (burst == NS) {
            void *p = NULL;
            assert_int_equal(ring_reserve(r, 0, &p), -ETIMEDOUT);
        }
        for (int k = 0; k < burst; k++, out++) {
            void *p = NULL;
            ring_meta_t m;
            uint64_t got;
            assert_int_equal(ring_peek(r, 0, &p, &m), 0);
            assert_ptr_equal(p, (char *)slot0 + (out % NS) * sb);
            assert_int_equal(ring_slot_of(r, p), out % NS);
            assert_int_equal(m.seq, out);
            assert_int_equal(m.tag[0], out);
            assert_int_equal(m.tag[1], ~out);
            memcpy(&got, p, sizeof(got));
            assert_int_equal(got, out);
            ring_release(r);
        }
        assert_int_equal(ring_head(r), in);
        assert_int_equal(ring_tail(r), out);
    }
    assert_true(in > 10 * NS);
}

static void test_ring_commit_longer_than_slot_fails(void **state)
{
    ring_t *r = new_ring("long", 2, 100, 0);
    size_t sb = ring_slot_bytes(r);
    void *p = NULL, *q = NULL;
    ring_meta_t m;
    assert_int_equal(ring_reserve(r, 0, &p), 0);
    assert_int_equal(ring_commit(r, 1, 2, sb + 1), -EINVAL);
    assert_int_equal(ring_commit(r, 1, 2, SIZE_MAX), -EINVAL);
    assert_int_equal(ring_head(r), 0);
    assert_int_equal(ring_peek(r, 0, &q, &m), -ETIMEDOUT);
    /* the slot is still reserved and a full-length commit of it goes through */
    assert_int_equal(ring_reserve(r, 0, &q), 0);
    assert_ptr_equal(p, q);
    assert_int_equal(ring_commit(r, 1, 2, sb), 0);
    assert_int_equal(ring_peek(r, 0, &q, &m), 0);
    assert_int_equal(m.len, sb);
}

static void test_ring_reserve_twice_before_commit_returns_the_same_slot(void **state)
{
    ring_t *r = new_ring("twice", 3, 1, 0);
    void *p = NULL, *q = NULL;
    assert_int_equal(ring_reserve(r, 0, &p), 0);
    memset(p, 0xab, 16);
    assert_int_equal(ring_reserve(r, 100, &q), 0);
    assert_ptr_equal(p, q);
    assert_int_equal(((unsigned char *)q)[15], 0xab); /* what was written is still there */
    assert_int_equal(ring_head(r), 0);
    assert_int_equal(ring_commit(r, 0, 0, 16), 0);
    assert_int_equal(ring_reserve(r, 0, &q), 0);
    assert_ptr_not_equal(p, q);
}

static void test_ring_two_mappings_of_one_segment_share_the_ring(void **state)
{
    /* the header holds offsets, not pointers, so each process may map it anywhere */
    ring_t *prod = new_ring("maps", 2, 64, 9);
    char err[256] = "";
    shm_seg_t *s = NULL;
    ring_t *cons = NULL;
    if (shm_attach(&s, job, "maps", err, sizeof(err)))
        fail_msg("%s", err);
    fx.seg[fx.n] = s;
    assert_ptr_not_equal(shm_data(s), shm_data(fx.seg[0]));
    if (ring_attach(&cons, shm_data(s), shm_size(s), "maps", err, sizeof(err)))
        fail_msg("%s", err);
    fx.ring[fx.n++] = cons;
    for (uint64_t i = 0; i < 5; i++) {
        void *p = NULL;
        ring_meta_t m;
        assert_int_equal(ring_reserve(prod, 0, &p), 0);
        msg_fill(p, 64, i);
        assert_int_equal(ring_commit(prod, i, 0, 64), 0);
        assert_int_equal(ring_peek(cons, 0, &p, &m), 0);
        assert_true((char *)p >= (char *)shm_data(s) && (char *)p < (char *)shm_data(s) + shm_size(s));
        assert_int_equal(m.seq, i);
        assert_int_equal(msg_check(p, 64, i), 64);
        ring_release(cons);
    }
    assert_int_equal(ring_base(cons), 9);
    assert_int_equal(ring_tail(prod), 5);
}

static void test_ring_reset_empties_and_restarts_at_a_new_base(void **state)
{
    ring_t *r = new_ring("reset", 3, 1, 100);
    void *slot0 = NULL, *p = NULL;
    ring_meta_t m;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ring_reserve(r, 0, &p), 0);
        if (!i)
            slot0 = p;
        assert_int_equal(ring_commit(r, 100 + i, 0, 1), 0);
    }
    assert_int_equal(ring_peek(r, 0, &p, &m), 0);
    ring_release(r);
    ring_close(r);
    ring_reset(r, 200);
    assert_int_equal(ring_base(r), 200);
    assert_int_equal(ring_head(r), 0);
    assert_int_equal(ring_tail(r), 0);
    assert_false(ring_closed(r)); /* reset reopens */
    assert_int_equal(ring_peek(r, 0, &p, &m), -ETIMEDOUT); /* the two unread slots are gone */
    for (int i = 0; i < 4; i++) { /* the stream restarts at seq 0 in slot 0 */
        assert_int_equal(ring_reserve(r, 0, &p), 0);
        if (!i)
            assert_ptr_equal(p, slot0);
        assert_int_equal(ring_commit(r, 200 + i, 0, 1), 0);
        assert_int_equal(ring_peek(r, 0, &p, &m), 0);
        assert_int_equal(m.seq, i);
        assert_int_equal(m.tag[0], 200 + i);
        ring_release(r);
    }
}

static void test_ring_corrupted_meta_is_reported_as_eproto(void **state)
{
    ring_t *r = new_ring("corrupt", 2, 1, 0);
    ring_meta_t *meta = meta_of(shm_data(fx.seg[0]));
    void *p = NULL;
    ring_meta_t m;
    assert_int_equal(ring_reserve(r, 0, &p), 0);
    assert_int_equal(ring_commit(r, 1, 2, 3), 0);
    assert_int_equal(meta[0].seq, 0);
    meta[0].seq = 12345;
    assert_int_equal(ring_peek(r, 0, &p, &m), -EPROTO);
    assert_int_equal(ring_peek(r, 1000, &p, &m), -EPROTO); /* reported, not waited on */
    meta[0].seq = 0;
    meta[0].len = ring_slot_bytes(r) + 1;
    assert_int_equal(ring_peek(r, 0, &p, &m), -EPROTO);
    meta[0].len = 3;
    assert_int_equal(ring_peek(r, 0, &p, &m), 0);
    assert_int_equal(m.tag[1], 2);
}

static void test_ring_consumer_drains_committed_slots_after_close(void **state)
{
    ring_t *r = new_ring("drain", 4, 1, 0);
    void *p = NULL;
    ring_meta_t m;
    for (uint64_t i = 0; i < 3; i++) {
        assert_int_equal(ring_reserve(r, 0, &p), 0);
        assert_int_equal(ring_commit(r, i, 0, 0), 0);
    }
    ring_close(r);
    assert_true(ring_closed(r));
    assert_int_equal(ring_reserve(r, 0, &p), -ECANCELED); /* though a slot is free */
    assert_int_equal(ring_reserve(r, -1, &p), -ECANCELED);
    for (uint64_t i = 0; i < 3; i++) {
        assert_int_equal(ring_peek(r, 0, &p, &m), 0);
        assert_int_equal(m.tag[0], i);
        ring_release(r);
    }
    assert_int_equal(ring_peek(r, 0, &p, &m), -ECANCELED);
    assert_int_equal(ring_peek(r, 1000, &p, &m), -ECANCELED);
}

/* ---- two processes ---------------------------------------------------------------------- */

typedef struct {
    const char *name;
    uint64_t n, base;
    int producer_pause_every, consumer_pause_every; /* messages; 0 = never */
} stream_t;

/* Producer child: writes each message in place into the reserved slot. Tries without
 * waiting first to count how often the ring was full. */
static int child_stream_producer(void *arg)
{
    const stream_t *c = arg;
    shm_seg_t *s = NULL;
    ring_t *r = NULL;
    CHECK(child_attach(c->name, &s, &r) == 0);
    size_t sb = ring_slot_bytes(r);
    for (uint64_t i = 0; i < c->n; i++) {
        void *p = NULL;
        int rc = ring_reserve(r, 0, &p);
        if (rc == -ETIMEDOUT) {
            rep->full_waits++;
            rc = ring_reserve(r, 5000, &p);
        }
        CHECK(rc == 0);
        size_t len = msg_len(i, sb);
        msg_fill(p, len, i);
        CHECK(ring_commit(r, c->base + i, fnv1a(p, len), len) == 0);
        if (c->producer_pause_every && i % c->producer_pause_every == 0)
            sleep_s(100e-6);
    }
    ring_detach(&r);
    shm_detach(&s);
    return 0;
}

static void stream(const stream_t *c, uint32_t nslots, size_t slot_bytes)
{
    ring_t *r = new_ring(c->name, nslots, slot_bytes, c->base);
    size_t sb = ring_slot_bytes(r);
    pid_t pid = spawn(child_stream_producer, (void *)c);
    char why[256] = "";
    double give_up = util_now() + 20; /* lost wake-ups would crawl on the 100 ms re-checks */
    uint64_t i;
    for (i = 0; i < c->n && !why[0]; i++) {
        if (util_now() > give_up) {
            snprintf(why, sizeof(why), "still streaming after 20 s");
            break;
        }
        void *p = NULL;
        ring_meta_t m;
        int rc = ring_peek(r, 0, &p, &m);
        if (rc == -ETIMEDOUT) {
            rep->empty_waits++;
            rc = ring_peek(r, 5000, &p, &m);
        }
        size_t len = msg_len(i, sb), bad;
        if (rc)
            snprintf(why, sizeof(why), "peek: %s", strerror(-rc));
        else if (m.seq != i || m.tag[0] != c->base + i || m.len != len)
            snprintf(why, sizeof(why), "seq %llu tag %llu len %llu, want len %zu",
                     (unsigned long long)m.seq, (unsigned long long)m.tag[0],
                     (unsigned long long)m.len, len);
        else if (fnv1a(p, len) != m.tag[1])
            snprintf(why, sizeof(why), "checksum differs");
        else if ((bad = msg_check(p, len, i)) != len)
            snprintf(why, sizeof(why), "byte %zu of %zu differs", bad, len);
        else
            ring_release(r);
        if (c->consumer_pause_every && i % c->consumer_pause_every == 0)
            sleep_s(100e-6);
    }
    if (why[0])
        ring_close(r); /* lets the producer out of a wait so it can be reaped */
    int st = reap(pid, 10, NULL);
    if (why[0])
        fail_msg("message %llu: %s (producer: status %d, head %llu, tail %llu)",
                 (unsigned long long)(i - 1), why, st, (unsigned long long)ring_head(r),
                 (unsigned long long)ring_tail(r));
    assert_int_equal(st, 0);
    void *p = NULL;
    assert_int_equal(ring_peek(r, 0, &p, NULL), -ETIMEDOUT); /* nothing extra */
    assert_int_equal(ring_head(r), c->n);
    assert_int_equal(ring_tail(r), c->n);
}

static void test_ring_streams_10k_messages_between_processes_fast_consumer(void **state)
{
    stream_t c = {.name = "fast", .n = 10000, .base = 1000};
    stream(&c, 2, 2 * PAGE);
}

static void test_ring_streams_10k_messages_between_processes_slow_consumer(void **state)
{
    stream_t c = {.name = "slowc", .n = 10000, .base = 5, .consumer_pause_every = 8};
    stream(&c, 4, PAGE);
    /* 1250 pauses of the consumer: the producer finds the ring full in some of them */
    assert_true(rep->full_waits > 0);
}

static void test_ring_streams_10k_messages_between_processes_slow_producer(void **state)
{
    stream_t c = {.name = "slowp", .n = 10000, .base = 0, .producer_pause_every = 8};
    stream(&c, 3, PAGE);
    assert_true(rep->empty_waits > 0);
}

enum { HANDOFFS = 300 };

static int child_consumes_one_slot_ring(void *arg)
{
    shm_seg_t *s = NULL;
    ring_t *r = NULL;
    CHECK(child_attach("oneslot", &s, &r) == 0);
    for (uint64_t i = 0; i < HANDOFFS; i++) {
        void *p = NULL;
        ring_meta_t m;
        int rc = ring_peek(r, 5000, &p, &m);
        if (rc == -ECANCELED)
            return 2; /* the parent gave up */
        CHECK(rc == 0);
        CHECK(m.seq == i && m.tag[0] == i);
        ring_release(r);
    }
    return 0;
}

/* Through a one-slot ring each hand-off has one side asleep in the kernel, the consumer
 * until a commit, the producer until a release. If either failed to wake a futex waiter in
 * the other process, the sleeper would wait for its next 100 ms re-check, and 300 hand-offs
 * would take far longer than the bound (about 30 ms when the wake-ups work). */
static void test_ring_commit_and_release_wake_the_other_process_promptly(void **state)
{
    ring_t *r = new_ring("oneslot", 1, 64, 0);
    pid_t pid = spawn(child_consumes_one_slot_ring, NULL);
    double t0 = util_now();
    uint64_t i;
    int rc = 0;
    for (i = 0; i < HANDOFFS && util_now() - t0 < 3.0; i++) {
        void *p = NULL;
        if ((rc = ring_reserve(r, 2000, &p)) || (rc = ring_commit(r, i, 0, 0)))
            break;
    }
    double dt = util_now() - t0;
    if (i < HANDOFFS)
        ring_close(r);
    int st = reap(pid, 5, NULL);
    if (i < HANDOFFS)
        fail_msg("%llu of %d hand-offs in %.2f s (rc %d)", (unsigned long long)i, HANDOFFS, dt,
                 rc);
    assert_int_equal(st, 0);
    assert_int_equal(ring_tail(r), HANDOFFS);
}

static int child_waits_for_data(void *arg)
{
    shm_seg_t *s = NULL;
    ring_t *r = NULL;
    CHECK(child_attach("sleepc", &s, &r) == 0);
    struct rusage a, b;
    void *p = NULL;
    ring_meta_t m;
    getrusage(RUSAGE_SELF, &a);
    double t0 = util_now();
    say_ready();
    int rc = ring_peek(r, -1, &p, &m);
    rep->wait_s = util_now() - t0;
    getrusage(RUSAGE_SELF, &b);
    rep->wait_cpu_s = cpu_s(&b) - cpu_s(&a);
    CHECK(rc == 0);
    CHECK(m.tag[0] == 77 && m.len == 8 && msg_check(p, 8, 77) == 8);
    ring_release(r);
    return 0;
}

static void test_ring_blocked_consumer_sleeps_instead_of_spinning(void **state)
{
    ring_t *r = new_ring("sleepc", 2, 64, 0);
    pid_t pid = spawn(child_waits_for_data, NULL);
    wait_ready();
    sleep_s(0.3); /* the child sits in ring_peek meanwhile */
    void *p = NULL;
    assert_int_equal(ring_reserve(r, 0, &p), 0);
    msg_fill(p, 8, 77);
    assert_int_equal(ring_commit(r, 77, 0, 8), 0);
    struct rusage ru;
    assert_int_equal(reap(pid, 5, &ru), 0);
    assert_int_equal(ring_tail(r), 1);
    /* a spinning wait would burn about the 0.3 s it waited */
    if (rep->wait_cpu_s > 0.05 || cpu_s(&ru) > 0.05)
        fail_msg("child used %.3f s of CPU waiting %.3f s (%.3f s in all)", rep->wait_cpu_s,
                 rep->wait_s, cpu_s(&ru));
}

static int child_waits_for_room(void *arg)
{
    shm_seg_t *s = NULL;
    ring_t *r = NULL;
    CHECK(child_attach("sleepp", &s, &r) == 0);
    void *p = NULL;
    for (int i = 0; i < 2; i++) {
        CHECK(ring_reserve(r, 0, &p) == 0);
        CHECK(ring_commit(r, i, 0, 0) == 0);
    }
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    double t0 = util_now();
    say_ready();
    int rc = ring_reserve(r, -1, &p);
    rep->wait_s = util_now() - t0;
    getrusage(RUSAGE_SELF, &b);
    rep->wait_cpu_s = cpu_s(&b) - cpu_s(&a);
    CHECK(rc == 0);
    CHECK(ring_commit(r, 2, 0, 0) == 0);
    return 0;
}

static void test_ring_blocked_producer_sleeps_instead_of_spinning(void **state)
{
    ring_t *r = new_ring("sleepp", 2, 64, 0);
    pid_t pid = spawn(child_waits_for_room, NULL);
    wait_ready();
    sleep_s(0.3); /* the child sits in ring_reserve meanwhile */
    void *p = NULL;
    ring_meta_t m;
    assert_int_equal(ring_peek(r, 0, &p, &m), 0);
    ring_release(r);
    struct rusage ru;
    assert_int_equal(reap(pid, 5, &ru), 0);
    assert_int_equal(ring_head(r), 3);
    if (rep->wait_cpu_s > 0.05 || cpu_s(&ru) > 0.05)
        fail_msg("child used %.3f s of CPU waiting %.3f s (%.3f s in all)", rep->wait_cpu_s,
                 rep->wait_s, cpu_s(&ru));
}

static int child_peeks_until_closed(void *arg)
{
    shm_seg_t *s = NULL;
    ring_t *r = NULL;
    CHECK(child_attach("closec", &s, &r) == 0);
    void *p = NULL;
    say_ready();
    rep->rc = ring_peek(r, -1, &p, NULL);
    CHECK(rep->rc == -ECANCELED);
    return 0;
}

static void test_ring_close_wakes_a_blocked_consumer_in_another_process(void **state)
{
    ring_t *r = new_ring("closec", 2, 64, 0);
    pid_t pid = spawn(child_peeks_until_closed, NULL);
    wait_ready();
    sleep_s(0.1); /* let it fall asleep in ring_peek */
    ring_close(r);
    double t0 = util_now();
    int st = reap(pid, 2, NULL); /* kills it if the close did not wake it within 2 s */
    if (st)
        fail_msg("child: status %d, ring_peek returned %d", st, rep->rc);
    assert_true(util_now() - t0 < 2.0);
}

static int child_reserves_until_closed(void *arg)
{
    shm_seg_t *s = NULL;
    ring_t *r = NULL;
    CHECK(child_attach("closep", &s, &r) == 0);
    void *p = NULL;
    for (int i = 0; i < 2; i++) {
        CHECK(ring_reserve(r, 0, &p) == 0);
        CHECK(ring_commit(r, i, 0, 0) == 0);
    }
    say_ready();
    rep->rc = ring_reserve(r, -1, &p);
    CHECK(rep->rc == -ECANCELED);
    return 0;
}

static void test_ring_close_wakes_a_blocked_producer_in_another_process(void **state)
{
    ring_t *r = new_ring("closep", 2, 64, 0);
    pid_t pid = spawn(child_reserves_until_closed, NULL);
    wait_ready();
    sleep_s(0.1); /* let it fall asleep in ring_reserve */
    ring_close(r);
    double t0 = util_now();
    int st = reap(pid, 2, NULL);
    if (st)
        fail_msg("child: status %d, ring_reserve returned %d", st, rep->rc);
    assert_true(util_now() - t0 < 2.0);
    /* what it committed before the close is still delivered */
    void *p = NULL;
    ring_meta_t m;
    for (uint64_t i = 0; i < 2; i++) {
        assert_int_equal(ring_peek(r, 0, &p, &m), 0);
        assert_int_equal(m.tag[0], i);
        ring_release(r);
    }
    assert_int_equal(ring_peek(r, 0, &p, &m), -ECANCELED);
}

static int child_commits_then_closes(void *arg)
{
    shm_seg_t *s = NULL;
    ring_t *r = NULL;
    CHECK(child_attach("drainx", &s, &r) == 0);
    for (uint64_t i = 0; i < 3; i++) {
        void *p = NULL;
        CHECK(ring_reserve(r, 1000, &p) == 0);
        msg_fill(p, 100, i);
        CHECK(ring_commit(r, i, 0, 100) == 0);
    }
    ring_close(r);
    return 0;
}

static void test_ring_consumer_in_another_process_drains_after_close(void **state)
{
    ring_t *r = new_ring("drainx", 4, 100, 0);
    assert_int_equal(reap(spawn(child_commits_then_closes, NULL), 5, NULL), 0);
    assert_true(ring_closed(r));
    for (uint64_t i = 0; i < 3; i++) {
        void *p = NULL;
        ring_meta_t m;
        assert_int_equal(ring_peek(r, 1000, &p, &m), 0);
        assert_int_equal(m.seq, i);
        assert_int_equal(msg_check(p, 100, i), 100);
        ring_release(r);
    }
    void *p = NULL;
    assert_int_equal(ring_peek(r, 1000, &p, NULL), -ECANCELED);
}

/* First producer: dies between reserve and commit, having scribbled on the slot. */
static int child_dies_holding_a_slot(void *arg)
{
    shm_seg_t *s = NULL;
    ring_t *r = NULL;
    CHECK(child_attach("died", &s, &r) == 0);
    void *p = NULL;
    CHECK(ring_reserve(r, 0, &p) == 0);
    rep->off[0] = (size_t)((char *)p - (char *)shm_data(s));
    memset(p, 0xee, ring_slot_bytes(r));
    _exit(0);
}

/* Second producer: a fresh process that picks up the stream where it stands. */
static int child_takes_over(void *arg)
{
    shm_seg_t *s = NULL;
    ring_t *r = NULL;
    CHECK(child_attach("died", &s, &r) == 0);
    for (uint64_t i = 5; i < 7; i++) {
        void *p = NULL;
        CHECK(ring_reserve(r, 1000, &p) == 0);
        if (i == 5)
            rep->off[1] = (size_t)((char *)p - (char *)shm_data(s));
        msg_fill(p, 32, i);
        CHECK(ring_commit(r, 1000 + i, 0, 32) == 0);
    }
    return 0;
}

static void test_ring_new_producer_continues_after_one_died_holding_a_slot(void **state)
{
    ring_t *r = new_ring("died", 4, 32, 0);
    void *p = NULL;
    ring_meta_t m;
    for (uint64_t i = 0; i < 5; i++) { /* head 5, tail 3: the stream has wrapped */
        assert_int_equal(ring_reserve(r, 0, &p), 0);
        msg_fill(p, 32, i);
        assert_int_equal(ring_commit(r, 1000 + i, 0, 32), 0);
        if (i < 3) {
            assert_int_equal(ring_peek(r, 0, &p, &m), 0);
            ring_release(r);
        }
    }
    assert_int_equal(reap(spawn(child_dies_holding_a_slot, NULL), 5, NULL), 0);
    assert_int_equal(ring_head(r), 5);
    assert_int_equal(ring_tail(r), 3);
    assert_int_equal(reap(spawn(child_takes_over, NULL), 5, NULL), 0);
    assert_int_equal(rep->off[1], rep->off[0]); /* the same slot, now committed */
    for (uint64_t i = 3; i < 7; i++) {
        assert_int_equal(ring_peek(r, 0, &p, &m), 0);
        assert_int_equal(m.seq, i);
        assert_int_equal(m.tag[0], 1000 + i);
        assert_int_equal(m.len, 32);
        assert_int_equal(msg_check(p, 32, i), 32);
        ring_release(r);
    }
    assert_int_equal(ring_peek(r, 0, &p, &m), -ETIMEDOUT);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_ring_bytes_covers_header_meta_and_page_aligned_slots),
        T(test_ring_format_rejects_bad_arguments),
        T(test_ring_attach_reports_geometry_and_an_empty_stream),
        T(test_ring_attach_rejects_bad_magic_naming_the_ring),
        T(test_ring_attach_rejects_wrong_version_naming_the_ring),
        T(test_ring_attach_rejects_inconsistent_sizes_naming_the_ring),
        T(test_ring_single_process_fifo_keeps_order_tags_and_lengths),
        T(test_ring_full_ring_makes_reserve_time_out),
        T(test_ring_empty_ring_makes_peek_time_out),
        T(test_ring_wraps_after_full_cycle),
        T(test_ring_commit_longer_than_slot_fails),
        T(test_ring_reserve_twice_before_commit_returns_the_same_slot),
        T(test_ring_two_mappings_of_one_segment_share_the_ring),
        T(test_ring_reset_empties_and_restarts_at_a_new_base),
        T(test_ring_corrupted_meta_is_reported_as_eproto),
        T(test_ring_consumer_drains_committed_slots_after_close),
        T(test_ring_streams_10k_messages_between_processes_fast_consumer),
        T(test_ring_streams_10k_messages_between_processes_slow_consumer),
        T(test_ring_streams_10k_messages_between_processes_slow_producer),
        T(test_ring_commit_and_release_wake_the_other_process_promptly),
        T(test_ring_blocked_consumer_sleeps_instead_of_spinning),
        T(test_ring_blocked_producer_sleeps_instead_of_spinning),
        T(test_ring_close_wakes_a_blocked_consumer_in_another_process),
        T(test_ring_close_wakes_a_blocked_producer_in_another_process),
        T(test_ring_consumer_in_another_process_drains_after_close),
        T(test_ring_new_producer_continues_after_one_died_holding_a_slot),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
