/* The loader library (stages/runtime/ldr.h): the loader's side of the job's control plane and of
 * its segment's rings (stages/job/ldr_seg.h). */
#include "stages/runtime/ldr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/codec.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "stages/job/ldr_seg.h"
#include "stages/runtime/trace.h"
#include "stages/runtime/worker.h"

/* ---- the loader side ---- */

struct ldr {
    worker_t *w;
    shm_seg_t *seg;
    void *mem;
    ldr_info_t info;
    uint8_t cursor[LDR_CURSOR_MAX];
    size_t cursor_len;
    ring_t **rings;       /* 2 * dp */
    uint64_t *have;       /* per ring: stream slots the stages already hold (skip below it) */
    uint64_t base;        /* step of stream slot 0 */
    int32_t *scratch;     /* where skipped microbatches go */
    int64_t step;         /* position of the next ldr_next */
    int replica, mb;
    int pending;          /* ldr_next handed out a slot not yet committed */
    int ready;            /* READY sent: the loader's own set-up worked */
    int stopped;
    /* [profiling] trace_file: this step's fills (and waits for free slots), sent as the
     * step's last slot is committed (MSG_TRACE) */
    trace_rec_t *recs;    /* NULL when not tracing */
    int nrecs;
    double fill_t0;       /* when ldr_next handed out the slot in hand */
};

/* One interval for the trace (trace_note: none when not tracing). */
static void note(ldr_t *l, int op, double t0, double t1)
{
    trace_note(l->recs, &l->nrecs, (trace_rec_t){.op = (uint8_t)op, .pad = (uint16_t)l->replica, .mb = l->mb,
                                                .t0 = t0, .t1 = t1});
}

static int fail_open(ldr_t *l, int rc)
{
    ldr_close(&l);
    return rc;
}

int ldr_open(ldr_t **out, char *err, size_t errlen)
{
    ldr_t *l = calloc(1, sizeof(*l));
    if (!l)
        return util_fail(err, errlen, -ENOMEM, "loader: out of memory");
    const char *host = getenv(WORKER_ENV_HOST); /* job.hosts > 1: one loader per host, by host rank */
    int rc = worker_open(&l->w, "loader", host ? atoi(host) : 0, 0, err, errlen);
    if (rc)
        return fail_open(l, rc);
    rc = shm_attach(&l->seg, worker_job(l->w), LDR_SEG_NAME, err, errlen);
    if (rc)
        return fail_open(l, rc);
    if (worker_manifest(l->w)->trace_file[0] && !(l->recs = malloc(TRACE_RECS_MAX * sizeof(trace_rec_t))))
        return fail_open(l, util_fail(err, errlen, -ENOMEM, "out of memory"));
    l->mem = shm_data(l->seg);
    ldr_seg_hdr_t *h = l->mem;
    if ((rc = ldr_seg_check(h, err, errlen)))
        return fail_open(l, rc);
    l->info = (ldr_info_t){.dp = (int)h->dp, .microbatches = (int)h->microbatches, .seqs = (int)h->seqs,
                           .seq_len = (int)h->seq_len, .vocab_size = (int)h->vocab_size,
                           .shuffle = (int)h->shuffle, .seed = h->seed, .first_step = h->resume_step,
                           .steps = h->steps, .replica0 = (int)h->replica0, .replicas = (int)h->replicas};
    snprintf(l->info.dataset_path, sizeof(l->info.dataset_path), "%s", h->dataset_path);
    l->cursor_len = h->resume_len <= LDR_CURSOR_MAX ? h->resume_len : 0;
    memcpy(l->cursor, h->resume_cursor, l->cursor_len);
    int nr = 2 * l->info.dp;
    l->rings = calloc((size_t)nr, sizeof(ring_t *));
    l->have = calloc((size_t)nr, sizeof(uint64_t));
    l->scratch = malloc(ldr_seg_slot_bytes(l->info.seqs, l->info.seq_len));
    if (!l->rings || !l->have || !l->scratch)
        return fail_open(l, util_fail(err, errlen, -ENOMEM, "loader: out of memory"));
    for (int i = 0; i < nr; i++) {
        if ((rc = ldr_seg_ring(l->mem, i, &l->rings[i], err, errlen)))
            return fail_open(l, rc);
        int r = i / 2, here = r >= l->info.replica0 && r < l->info.replica0 + l->info.replicas;
        l->have[i] = here ? ring_head(l->rings[i]) : UINT64_MAX; /* another host's: always scratch */
        l->base = ring_base(l->rings[i]);
    }
    l->step = l->info.first_step;
    *out = l;
    return 0;
}

void ldr_close(ldr_t **pl)
{
    ldr_t *l = *pl;
    if (!l)
        return;
    free(l->recs);
    if (l->rings)
        for (int i = 0; i < 2 * l->info.dp; i++)
            ring_detach(&l->rings[i]);
    free(l->rings);
    free(l->have);
    free(l->scratch);
    shm_detach(&l->seg);
    worker_close(&l->w);
    free(l);
    *pl = NULL;
}

const ldr_info_t *ldr_info(const ldr_t *l) { return &l->info; }

const uint8_t *ldr_cursor(const ldr_t *l, size_t *len)
{
    *len = l->cursor_len;
    return l->cursor;
}

/* Handles what the coordinator says between waits; returns 1 once told to stop. */
static int poll_control(ldr_t *l, int timeout_ms)
{
    msg_t m;
    while (!l->stopped && worker_recv(l->w, timeout_ms, &m) == 0) {
        if (m.type == MSG_STOP)
            l->stopped = 1;
        msg_clear(&m);
        timeout_ms = 0;
    }
    return l->stopped;
}

static uint64_t stream_pos(const ldr_t *l) { return (uint64_t)(l->step - (int64_t)l->base) * l->info.microbatches + l->mb; }

/* The slot of ring i for the current position: in the ring, or scratch when the stages
 * already have it. Waits in slices so a stop is seen while the rings are full. */
static int slot_for(ldr_t *l, int i, int32_t **out)
{
    if (stream_pos(l) < l->have[i]) {
        *out = l->scratch;
        return 0;
    }
    double t0 = util_now();
    worker_waiting(l->w, 1); /* on the stages: not wedged (the step watchdog) */
    for (;;) {
        void *p;
        int rc = ring_reserve(l->rings[i], 100, &p);
        if (rc == 0) {
            worker_waiting(l->w, 0);
            *out = p;
            note(l, TRACE_WAIT, t0, util_now()); /* a wait: the ring was full, the stages behind */
            return 0;
        }
        if (rc != -ETIMEDOUT || poll_control(l, 0)) {
            worker_waiting(l->w, 0);
            return -ECANCELED;
        }
    }
}

int ldr_next(ldr_t *l, ldr_batch_t *b)
{
    if (l->stopped)
        return -ECANCELED;
    if (!l->ready) { /* the first ldr_next means the program's own set-up succeeded */
        if (worker_ready(l->w))
            return -ECANCELED;
        l->ready = 1;
    }
    if (l->step >= l->info.steps) {
        worker_waiting(l->w, 1);
        while (!poll_control(l, 1000)) /* all produced: wait to be told to stop */
            ;
        return -ECANCELED;
    }
    if (poll_control(l, 0))
        return -ECANCELED;
    worker_test_point(l->w, "next", l->step);
    int r = l->replica;
    *b = (ldr_batch_t){.step = l->step, .replica = r, .microbatch = l->mb, .seqs = l->info.seqs,
                       .seq_len = l->info.seq_len};
    /* when both are skipped they share the scratch buffer: what is written there is dropped */
    if (slot_for(l, 2 * r, &b->tokens) || slot_for(l, 2 * r + 1, &b->targets))
        return -ECANCELED;
    l->pending = 1;
    l->fill_t0 = util_now();
    return 0;
}

int ldr_commit(ldr_t *l, const void *cursor, size_t len)
{
    if (!l->pending)
        return -EINVAL;
    if (len > LDR_CURSOR_MAX)
        return -EMSGSIZE;
    int last_of_step = l->replica == l->info.dp - 1 && l->mb == l->info.microbatches - 1;
    /* the next step's cursor is in place before its last slot is visible, so whoever sees
     * the step delivered also finds where the next one starts */
    if (last_of_step)
        ldr_seg_put_cursor(l->mem, l->step + 1, cursor, len);
    size_t bytes = ldr_seg_slot_bytes(l->info.seqs, l->info.seq_len);
    for (int k = 0; k < 2; k++) {
        int i = 2 * l->replica + k;
        if (stream_pos(l) >= l->have[i])
            ring_commit(l->rings[i], (uint64_t)l->step, (uint64_t)l->mb, bytes);
    }
    memcpy(l->cursor, cursor, len);
    l->cursor_len = len;
    l->pending = 0;
    note(l, TRACE_FILL, l->fill_t0, util_now());
    if (last_of_step && l->recs) {
        msg_t tr = {.type = MSG_TRACE, .step = l->step, .data = (uint8_t *)l->recs,
                    .data_len = (size_t)trace_seal(l->recs, l->nrecs) * sizeof(trace_rec_t)};
        if (worker_send(l->w, &tr))
            return -ECANCELED;
        l->nrecs = 0;
    }
    worker_progress(l->w);
    if (++l->mb == l->info.microbatches) {
        l->mb = 0;
        if (++l->replica == l->info.dp) {
            l->replica = 0;
            l->step++;
        }
    }
    return 0;
}

void ldr_fail(ldr_t *l, const char *reason) { worker_report(l->w, "%s", reason); }

size_t ldr_cursor_pack(uint8_t *buf, size_t cap, int n, const char *const *keys, const uint64_t *vals)
{
    return codec_pack_u64_map(buf, cap, n, keys, vals);
}

int ldr_cursor_get(const uint8_t *cursor, size_t len, const char *key, uint64_t *val)
{
    return codec_get_u64(cursor, len, key, val);
}

/* splitmix64: the round function of the permutation */
static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t ldr_shuffle(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t i)
{
    if (n <= 1)
        return 0;
    /* a balanced Feistel network on 2*half bits >= n, cycle-walking back into [0, n) */
    int bits = 64 - __builtin_clzll(n - 1);
    int half = (bits + 1) / 2;
    uint64_t mask = (1ULL << half) - 1, key = mix(seed ^ mix(epoch + 0x5bd1e995));
    uint64_t x = i;
    do {
        uint64_t lo = x & mask, hi = (x >> half) & mask;
        for (int round = 0; round < 4; round++) {
            uint64_t t = lo;
            lo = hi ^ (mix(lo ^ key ^ (uint64_t)round * 0x632be59bd9b4e019ULL) & mask);
            hi = t;
        }
        x = (hi << half) | lo;
    } while (x >= n);
    return x;
}
