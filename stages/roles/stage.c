/* ctitan-stage: pipeline rank `--rank` of data-parallel replica `--replica`. Holds the
 * pieces of the model its rank owns, as one chunk per virtual stage of the rank (one, or
 * several for interleaved and V schedules: stages/job/schedule.h places them), and runs the
 * schedule's action list every step, each action on its chunk: forwards take tokens (virtual
 * stage 0) or activations from the previous virtual stage and write their output straight into
 * a slot to the next; backwards do the same with gradients in the other direction; the last
 * virtual stage computes the loss. Gradients accumulate where the optimizer shards read them.
 *
 * Two seams, both chosen at set-up: the backend (kernels/backend.h, [job] device: the CPU
 * model computing on the shared params/grads segments, or the CUDA plugin's, so CPU jobs never
 * load the CUDA libraries) does the math and holds the weights; the data plane
 * (stages/runtime/plane.h, its transport the job's: the act segment's shm rings, CUDA IPC device
 * rings or NCCL links, and the loader's rings) carries the hand-offs in the backend's memory and
 * publishes what the optimizer shards read. With [optshard] device = "cuda" they update this
 * stage's device weights in place; with "cpu" (offload) the backend uploads the shared fp32
 * weights at the start of each step and writes the step's gradients back at its end.
 *
 * When another stage of the job dies mid-step, the coordinator closes the rings (ring_close):
 * a wait on one returns -ECANCELED, and this stage leaves the step (ABORTED) and waits for the
 * step to be sent again, once the coordinator has reset the rings and gradients (DESIGN.md
 * "Recovery"). With parameter sharding (parallelism.data_parallel_shard_degree) the model
 * takes each piece's weights from, and gives its gradients to, the plane's exchange of its group
 * (plane_shard_io), which the coordinator closes the same way on the CPU. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/log.h"
#include "ipc/shm.h"
#include "ipc/util.h"
#include "kernels/backend.h"
#include "kernels/params.h"
#include "stages/job/job.h"
#include "stages/runtime/plane.h"
#include "stages/job/schedule.h"
#include "stages/runtime/trace.h"
#include "stages/runtime/worker.h"

/* One virtual stage of the rank: its pieces of the model, its links, its activations. */
typedef struct {
    int vstage, first, last;     /* virtual stage (of lay.S); it holds the embedding / the head */
    backend_model_t *model;
    plane_t *plane;              /* links to virtual stages vstage - 1 and vstage + 1, and from the
                                  * loader (tokens: first, targets: last) */
    backend_acts_t **acts;       /* (sched_peak_acts of the chunk) */
    int *acts_mb;                /* microbatch each holds, -1 free */
    int nacts;
} chunk_t;

typedef struct {
    worker_t *w;
    const manifest_t *man;
    job_layout_t lay;
    int rank, replica;
    shm_seg_t *params, *grads;
    const backend_t *be;
    chunk_t *chunk;              /* (lay.vs), in the schedule's chunk order */
    sched_t sched;
    int device;
    size_t mem_peak;             /* the backend's memory in use (GPU: by every process on the device;
                                  * CPU: this process's peak resident set), highest seen at a step's end */
    float dscale;                /* 1 / tokens in the global batch */
    double t_op[3], t_wait;
    int n_op[3];
    int aborted;                 /* a ring was closed: this step is left unfinished */
    /* [profiling] trace_file: this step's intervals, sent to the coordinator (MSG_TRACE) */
    trace_rec_t *recs;           /* NULL when not tracing */
    int nrecs;
    int cur_chunk, cur_mb;       /* of the action in progress (for its waits) */
} stage_t;

/* A backend call that must succeed (BE_WHY: its reason), and a data-plane one of chunk k. */
#define BE_CHECK(st, call, ...) WORKER_CHECK((st)->w, (call) == 0, __VA_ARGS__)
#define BE_WHY(st) (st)->be->last_error()
#define PLANE_CHECK(st, k, call) WORKER_CHECK((st)->w, (call) == 0, "%s", plane_error((k)->plane))

/* The coordinator's data for this stage's transport (plane_cfg_t.boot: NCCL's communicator
 * ids), which comes right after the config. */
static long recv_boot(void *arg, void *buf, size_t cap)
{
    stage_t *st = arg;
    msg_t m;
    worker_command(st->w, &m);
    WORKER_CHECK(st->w, m.type == MSG_NCCL, "expected the data plane's ids from the coordinator, got %s",
                 msg_type_name(m.type) ? msg_type_name(m.type) : "?");
    WORKER_CHECK(st->w, m.data_len <= cap, "the data plane's ids from the coordinator: %zu bytes, at most %zu",
                 m.data_len, cap);
    memcpy(buf, m.data, m.data_len);
    long n = (long)m.data_len;
    msg_clear(&m);
    return n;
}

static void plane_waiting(void *arg, int on) { worker_waiting(((stage_t *)arg)->w, on); }

/* Chunk k's data plane over the job's transport: its links, its loader rings; on the GPU its
 * device buffers published for its neighbours and the optimizer shards; with parameter sharding
 * the model's exchange. [begin, end): the chunk's range of the flat space. */
static void setup_plane(stage_t *st, chunk_t *k, size_t begin, size_t end)
{
    char err[512];
    plane_cfg_t c = {.lay = &st->lay, .job = worker_job(st->w), .replica = st->replica, .rank = st->rank,
                     .vstage = k->vstage, .stream = st->be->model_stream(k->model), .device = st->device,
                     .stage_begin = begin, .stage_end = end, .waiting = plane_waiting, .boot = recv_boot, .arg = st};
    st->be->model_buffers(k->model, &c.w, &c.g, &c.begin, &c.end);
    int rc = plane_new(&k->plane, plane_transport(&st->lay), &c, err, sizeof(err));
    WORKER_CHECK(st->w, rc == 0, "%s", err);
    shard_io_t io;
    PLANE_CHECK(st, k, plane_shard_io(k->plane, &io));
    WORKER_CHECK(st->w, !io.take || st->be->model_shard, "parallelism.data_parallel_shard_degree = %d: the %s "
                 "backend cannot shard its parameters", st->lay.fsdp, st->be->name);
    if (io.take) {
        BE_CHECK(st, st->be->model_shard(k->model, &io), "%s parameter sharding: %s", st->be->name, BE_WHY(st));
        if (io.weights)
            LOG_D("parameter sharding: keeps [%zu, %zu) of [%zu, %zu)", c.begin, c.end, begin, end);
        else
            LOG_D("parameter sharding: member %d of %d of group %d", st->replica % st->lay.fsdp, st->lay.fsdp,
                  job_copy_of(&st->lay, st->replica));
    }
}

/* Chunk k (virtual stage k->vstage): its model on its pieces' range of the shared weights and
 * gradients (or the device's), its loader rings, its links, its activation buffers. */
static void setup_chunk(stage_t *st, chunk_t *k, int c, int threads)
{
    const manifest_t *m = st->man;
    int p0, p1;
    WORKER_CHECK(st->w, manifest_stage_pieces(m, k->vstage, &p0, &p1) == 0, "out of memory");
    param_table_t tab;
    WORKER_CHECK(st->w, params_table_init(&tab, &m->model) == 0, "out of memory");
    size_t begin, end;
    params_piece_range(&tab, p0, p1, &begin, &end);
    params_table_free(&tab);
    size_t at = ((size_t)job_copy_of(&st->lay, st->replica) * st->lay.stride + begin) * job_host_elem(&st->lay);
    void *host_w = st->params ? (char *)shm_data(st->params) + at : NULL;
    void *host_g = st->grads ? (char *)shm_data(st->grads) + at : NULL;
    model_config_t cfg = m->model; /* [activation_checkpoint] rides in the model's config */
    cfg.host_bf16 = st->lay.host_bf16;
    cfg.ac_mode = m->ac_mode;
    cfg.ac_every = m->ac_every;
    config_attn_parse(m->attention, &cfg.attn); /* checked by manifest_check */
    if (st->lay.fsdp > 1 && st->lay.gpu) /* the GPU keeps its part: job_fsdp_part */
        job_fsdp_part(&st->lay, st->replica, begin, end, &cfg.own_begin, &cfg.own_end);
    BE_CHECK(st, st->be->model_new(&k->model, &cfg, p0, p1, host_w, host_g, threads),
             "%s model of pieces [%d, %d): %s", st->be->name, p0, p1, BE_WHY(st));
    setup_plane(st, k, begin, end);
    k->nacts = sched_peak_acts(&st->sched, st->rank, c); /* forward done, its weight gradients not yet */
    k->acts = calloc((size_t)k->nacts, sizeof(*k->acts));
    k->acts_mb = malloc((size_t)k->nacts * sizeof(int));
    WORKER_CHECK(st->w, k->acts && k->acts_mb, "out of memory");
    for (int i = 0; i < k->nacts; i++) {
        BE_CHECK(st, st->be->acts_new(&k->acts[i], k->model, st->lay.mb, st->lay.T),
                 "%s activations of %d microbatches: %s", st->be->name, k->nacts, BE_WHY(st));
        k->acts_mb[i] = -1;
    }
    LOG_D("chunk %d: virtual stage %d of %d, pieces [%d, %d) (%zu parameters), %d activation buffers", c,
          k->vstage, st->lay.S, p0, p1, end - begin, k->nacts);
}

static void setup(stage_t *st)
{
    const manifest_t *m = st->man;
    char err[512];
    WORKER_CHECK(st->w, job_layout(&st->lay, m) == 0, "out of memory");
    const char *job = worker_job(st->w);
    if (!st->lay.gpu_shards) { /* the CPU model computes on them; offload moves weights and gradients */
        WORKER_CHECK(st->w, shm_attach(&st->params, job, "params", err, sizeof(err)) == 0, "%s", err);
        WORKER_CHECK(st->w, shm_attach(&st->grads, job, "grads", err, sizeof(err)) == 0, "%s", err);
    }
    WORKER_CHECK(st->w, sched_build(&st->sched, m->pp, st->lay.vs, m->microbatches, m->schedule, err,
                                    sizeof(err)) == 0, "%s", err);
    WORKER_CHECK(st->w, st->chunk = calloc((size_t)st->lay.vs, sizeof(chunk_t)), "out of memory");
    for (int c = 0; c < st->lay.vs; c++) {
        chunk_t *k = &st->chunk[c];
        k->vstage = sched_vstage(&st->sched, st->rank, c);
        k->first = k->vstage == 0;
        k->last = k->vstage == st->lay.S - 1;
    }
    int threads = m->threads;
    if (threads <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int)(cpus / (m->pp * m->dp));
        threads = threads < 1 ? 1 : threads;
    }
    WORKER_CHECK(st->w, st->be = backend_load(m->device, err, sizeof(err)), "job.device = \"%s\": %s", m->device,
                 err);
    int ordinal = job_local_ordinal(&st->lay, st->replica, st->rank);
    BE_CHECK(st, st->be->dev_select(ordinal, &st->device), "%s", BE_WHY(st));
    for (int c = 0; c < st->lay.vs; c++)
        setup_chunk(st, &st->chunk[c], c, threads);
    st->dscale = 1.0f / (float)((double)m->dp * m->local_batch_size * m->seq_len);
    if (m->trace_file[0])
        WORKER_CHECK(st->w, st->recs = malloc(TRACE_RECS_MAX * sizeof(trace_rec_t)), "out of memory");
    LOG_D("%d chunk%s, %d threads, schedule %s", st->lay.vs, st->lay.vs == 1 ? "" : "s", threads,
          sched_kind_name(m->schedule));
}

/* Index of chunk k's activation buffer holding microbatch mb (take: a free one, now mb's). */
static int acts_for(stage_t *st, chunk_t *k, int mb, int take)
{
    for (int i = 0; i < k->nacts; i++)
        if (k->acts_mb[i] == (take ? -1 : mb)) {
            if (take)
                k->acts_mb[i] = mb;
            return i;
        }
    worker_die(st->w, "schedule bug: no activation buffer of virtual stage %d %s microbatch %d", k->vstage,
               take ? "free for" : "holds", mb);
}

static void acts_free(chunk_t *k, int mb)
{
    for (int i = 0; i < k->nacts; i++)
        if (k->acts_mb[i] == mb)
            k->acts_mb[i] = -1;
}

/* One interval of the action in progress for the trace (trace_note: none when not tracing). */
static void note(stage_t *st, int op, double t0, double t1)
{
    trace_note(st->recs, &st->nrecs, (trace_rec_t){.op = (uint8_t)op, .chunk = (uint8_t)st->cur_chunk,
                                                  .mb = st->cur_mb, .t0 = t0, .t1 = t1});
}

/* A backward's result: the exchange of parameter sharding closed for a recovery (-ECANCELED)
 * leaves the step like a closed ring; any other failure ends the stage. */
static void backward_rc(stage_t *st, int rc, const char *what)
{
    if (rc == -ECANCELED && st->lay.fsdp > 1)
        st->aborted = 1;
    else
        BE_CHECK(st, rc, "%s %s: %s", st->be->name, what, BE_WHY(st));
}

/* Whether a data-plane call's rc says the coordinator closed the rings (sets st->aborted). */
static int closed(stage_t *st, int rc)
{
    if (rc == -ECANCELED)
        st->aborted = 1;
    return rc == -ECANCELED;
}

/* Token ids from a loader are checked before they index the embedding: a bad loader must
 * fail the job with a reason, not read outside the table. */
static void check_ids(stage_t *st, const int32_t *ids, const char *what, int64_t step, int mb)
{
    int n = st->lay.mb * st->lay.T, V = st->man->model.vocab_size;
    for (int i = 0; i < n; i++)
        WORKER_CHECK(st->w, ids[i] >= 0 && ids[i] < V,
                     "the loader sent %s id %d at step %lld microbatch %d position %d: not in [0, %d)",
                     what, ids[i], (long long)step, mb, i, V);
}

/* The slot of chunk k's link l that carries (step, mb) in, or a free one for it out; NULL once
 * the ring is closed. */
static void *recv_slot(stage_t *st, chunk_t *k, plane_link_t l, int64_t step, int mb)
{
    void *slot;
    double t0 = util_now();
    worker_waiting(st->w, 1);
    int rc = plane_recv(k->plane, l, step, mb, &slot);
    worker_waiting(st->w, 0);
    note(st, TRACE_WAIT, t0, util_now());
    if (closed(st, rc))
        return NULL;
    PLANE_CHECK(st, k, rc);
    return slot;
}

static void *reserve_slot(stage_t *st, chunk_t *k, plane_link_t l, int64_t step, int mb)
{
    void *slot;
    double t0 = util_now();
    worker_waiting(st->w, 1);
    int rc = plane_reserve(k->plane, l, step, mb, &slot);
    worker_waiting(st->w, 0);
    note(st, TRACE_WAIT, t0, util_now());
    if (closed(st, rc))
        return NULL;
    PLANE_CHECK(st, k, rc);
    return slot;
}

/* A microbatch's forward; the head's loss is kept by the backend (loss_take at the step's end:
 * no wait for the device here). */
static void forward(stage_t *st, chunk_t *k, int64_t step, int mb)
{
    int a = acts_for(st, k, mb, 1);
    const int32_t *tok = NULL, *tgt = NULL;
    void *x_in = NULL, *x_out = NULL;
    if (k->first ? !(tok = recv_slot(st, k, PLANE_TOKENS, step, mb)) : !(x_in = recv_slot(st, k, PLANE_ACT_IN, step, mb)))
        return;
    if (k->first)
        check_ids(st, tok, "token", step, mb);
    if (k->last ? !(tgt = recv_slot(st, k, PLANE_TARGETS, step, mb))
                : !(x_out = reserve_slot(st, k, PLANE_ACT_OUT, step, mb)))
        return;
    if (k->last)
        check_ids(st, tgt, "target", step, mb);
    double t0 = util_now();
    BE_CHECK(st, st->be->forward(k->model, k->acts[a], tok, x_in, tgt, st->dscale, x_out, NULL), "%s forward: %s",
             st->be->name, BE_WHY(st));
    st->t_op[SCHED_F] += util_now() - t0;
    st->n_op[SCHED_F]++;
    PLANE_CHECK(st, k, plane_done(k->plane, k->first ? PLANE_TOKENS : PLANE_ACT_IN));
    if (k->last)
        PLANE_CHECK(st, k, plane_done(k->plane, PLANE_TARGETS));
    else
        PLANE_CHECK(st, k, plane_send(k->plane, PLANE_ACT_OUT));
}

/* Backward B; with w (activation checkpointing, W next in the list) its W too, layer by layer
 * (backend.h backward: the same bits), the time counted as B's and the W a zero. */
static void backward_b(stage_t *st, chunk_t *k, int64_t step, int mb, int w)
{
    int a = acts_for(st, k, mb, 0);
    void *dy = NULL, *dx = NULL;
    if ((!k->last && !(dy = recv_slot(st, k, PLANE_GRAD_IN, step, mb))) ||
        (!k->first && !(dx = reserve_slot(st, k, PLANE_GRAD_OUT, step, mb))))
        return;
    double t0 = util_now();
    backward_rc(st, (w ? st->be->backward : st->be->backward_b)(k->model, k->acts[a], dy, dx), "backward");
    if (st->aborted)
        return;
    st->t_op[SCHED_B] += util_now() - t0;
    st->n_op[SCHED_B]++;
    if (w) {
        st->n_op[SCHED_W]++;
        acts_free(k, mb);
    }
    if (dy)
        PLANE_CHECK(st, k, plane_done(k->plane, PLANE_GRAD_IN));
    if (dx)
        PLANE_CHECK(st, k, plane_send(k->plane, PLANE_GRAD_OUT));
}

static void backward_w(stage_t *st, chunk_t *k, int mb)
{
    double t0 = util_now();
    int a = acts_for(st, k, mb, 0);
    backward_rc(st, st->be->backward_w(k->model, k->acts[a]), "weight gradients");
    if (st->aborted)
        return;
    st->t_op[SCHED_W] += util_now() - t0;
    st->n_op[SCHED_W]++;
    acts_free(k, mb);
}

static void run_step(stage_t *st, int64_t step)
{
    memset(st->t_op, 0, sizeof(st->t_op));
    memset(st->n_op, 0, sizeof(st->n_op));
    st->t_wait = 0;
    for (int c = 0; c < st->lay.vs; c++)
        plane_waited(st->chunk[c].plane); /* a step left unfinished counted no waits of this one */
    double loss = 0, t0 = util_now();
    for (int c = 0; c < st->lay.vs; c++) {
        chunk_t *k = &st->chunk[c];
        BE_CHECK(st, st->be->step_begin(k->model), "%s weights: %s", st->be->name, BE_WHY(st));
        PLANE_CHECK(st, k, plane_step_begin(k->plane, step));
    }
    const sched_action_t *a = st->sched.a[st->rank];
    int n = st->sched.n[st->rank];
    st->aborted = 0;
    st->nrecs = 0;
    for (int i = 0; i < n && !st->aborted; i++) {
        if (i == n / 2)
            worker_test_point(st->w, "mid", step);
        chunk_t *k = &st->chunk[a[i].chunk];
        double ta = util_now();
        st->cur_chunk = a[i].chunk, st->cur_mb = a[i].mb;
        switch (a[i].op) {
        case SCHED_F: forward(st, k, step, a[i].mb); break;
        case SCHED_B: {
            /* a W right after its B runs inside it, layer by layer (the same bits): one or two
             * layers' gradients for W alive, and with recompute one layer's recomputed tensors.
             * Without recompute only where no input gradient goes down (the first chunk): the
             * upper layers' W would come before the hand-off and lengthen the pipeline */
            int w = (st->man->ac_mode != CONFIG_AC_NONE || k->first) && i + 1 < n && a[i + 1].op == SCHED_W &&
                    a[i + 1].chunk == a[i].chunk && a[i + 1].mb == a[i].mb;
            backward_b(st, k, step, a[i].mb, w);
            if (w && !st->aborted) {
                note(st, SCHED_B, ta, util_now());
                worker_progress(st->w);
                ta = util_now();
                if (++i == n / 2) /* the W done: noted below as an empty interval */
                    worker_test_point(st->w, "mid", step);
            }
            break;
        }
        case SCHED_W: backward_w(st, k, a[i].mb); break;
        }
        note(st, a[i].op, ta, util_now());
        worker_progress(st->w);
    }
    if (st->aborted) { /* the coordinator resets rings and gradients, then sends the step again */
        for (int c = 0; c < st->lay.vs; c++)
            for (int i = 0; i < st->chunk[c].nacts; i++)
                st->chunk[c].acts_mb[i] = -1;
        LOG_I("step %lld left unfinished: the rings%s were closed for a recovery", (long long)step + 1,
              st->lay.fsdp > 1 && !st->lay.gpu ? " and parameter sharding's exchanges" : "");
        msg_t m = {.type = MSG_ABORTED, .step = step};
        WORKER_CHECK(st->w, worker_send(st->w, &m) == 0, "cannot reach the coordinator");
        return;
    }
    worker_test_point(st->w, "end", step);
    for (int c = 0; c < st->lay.vs; c++) {
        chunk_t *k = &st->chunk[c];
        PLANE_CHECK(st, k, plane_step_end(k->plane));
        if (!plane_grads_ordered(k->plane)) /* else the shards wait for them on the device */
            BE_CHECK(st, st->be->step_end(k->model), "%s step: %s", st->be->name, BE_WHY(st));
        st->t_wait += plane_waited(k->plane);
        double l;
        BE_CHECK(st, st->be->loss_take(k->model, &l), "%s loss: %s", st->be->name, BE_WHY(st));
        loss += l; /* the head's microbatches in forward order: fixed bits */
    }
    size_t used;
    if (st->be->mem_used(&used) == 0 && used > st->mem_peak)
        st->mem_peak = used;
    double total = util_now() - t0;
    if (st->recs) { /* the step's timeline, before the reply that ends the round */
        msg_t tr = {.type = MSG_TRACE, .step = step, .data = (uint8_t *)st->recs,
                    .data_len = (size_t)trace_seal(st->recs, st->nrecs) * sizeof(trace_rec_t)};
        WORKER_CHECK(st->w, worker_send(st->w, &tr) == 0, "cannot reach the coordinator");
    }
    msg_t m = {.type = MSG_STEP_DONE, .step = step, .loss = loss, .t_wait = st->t_wait,
               .t_busy = total - st->t_wait, .mem = st->mem_peak};
    m.t_f = st->n_op[SCHED_F] ? st->t_op[SCHED_F] / st->n_op[SCHED_F] : 0;
    m.t_b = st->n_op[SCHED_B] ? st->t_op[SCHED_B] / st->n_op[SCHED_B] : 0;
    m.t_w = st->n_op[SCHED_W] ? st->t_op[SCHED_W] / st->n_op[SCHED_W] : 0;
    WORKER_CHECK(st->w, worker_send(st->w, &m) == 0, "cannot reach the coordinator");
    worker_test_point(st->w, "done", step);
}

/* Test hook (NOTES.md "Test hooks"): CTITAN_TEST_FAIL_AT_STEP=N fails stage rank
 * CTITAN_TEST_FAIL_RANK (0 when unset) of replica 0 as step N (1-based) begins, in every run of
 * the job: a failure that repeats at the same step, which no restart can fix. */
static void test_fail_hook(stage_t *st, int64_t step)
{
    const char *at = getenv("CTITAN_TEST_FAIL_AT_STEP"), *rank = getenv("CTITAN_TEST_FAIL_RANK");
    if (at && st->replica == 0 && st->rank == (rank ? atoi(rank) : 0) && step + 1 == atoll(at))
        worker_die(st->w, "CTITAN_TEST_FAIL_AT_STEP=%s: failing at step %lld on purpose", at, (long long)step + 1);
}

static void usage(void) { fprintf(stderr, "usage: ctitan-stage --rank S --replica R (started by `ctitan launch`)\n"); }

int main(int argc, char **argv)
{
    stage_t st = {.rank = -1, .replica = -1};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rank")) st.rank = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--replica")) st.replica = atoi(argv[i + 1]);
    }
    if (st.rank < 0 || st.replica < 0) {
        usage();
        return 2;
    }
    char err[512];
    if (worker_open(&st.w, "stage", st.rank, st.replica, err, sizeof(err))) {
        fprintf(stderr, "ctitan-stage: %s\n", err);
        return 1;
    }
    st.man = worker_manifest(st.w);
    WORKER_CHECK(st.w, st.rank < st.man->pp && st.replica < st.man->dp,
                 "rank %d replica %d is outside the topology (pp %d, dp %d)", st.rank, st.replica,
                 st.man->pp, st.man->dp);
    worker_test_point(st.w, "setup", worker_first_step(st.w));
    setup(&st);
    WORKER_CHECK(st.w, worker_ready(st.w) == 0, "cannot reach the coordinator");
    for (;;) {
        msg_t m;
        worker_command(st.w, &m);
        msg_type_t type = m.type;
        int64_t step = m.step;
        msg_clear(&m);
        if (type == MSG_STOP)
            break;
        if (type == MSG_STEP) {
            test_fail_hook(&st, step);
            worker_test_point(st.w, "begin", step);
            run_step(&st, step);
        }
    }
    for (int c = 0; st.chunk && c < st.lay.vs; c++) {
        chunk_t *k = &st.chunk[c];
        for (int i = 0; i < k->nacts; i++)
            st.be->acts_destroy(&k->acts[i]);
        plane_destroy(&k->plane);
        if (k->model)
            st.be->model_destroy(&k->model);
        free(k->acts);
        free(k->acts_mb);
    }
    free(st.chunk);
    free(st.recs);
    sched_free(&st.sched);
    shm_detach(&st.params);
    shm_detach(&st.grads);
    worker_close(&st.w);
    return 0;
}
