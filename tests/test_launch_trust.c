/* The control plane's trust, end to end (issue 12): attacks on a running `ctitan launch` from
 * an outsider, from the job's own operator key and from inside (a worker's key sending what its
 * role may not): garbage on the socket, forged messages, a claimed route, floods, an operator
 * that never reads, a swap that must run no shell. Each is rejected and the job's losses are
 * those of a run without it. The job helpers are tests/testjob.h's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>
#include <zmq.h>

#include "checkpointd/ckpt.h"
#include "ipc/ctl.h"
#include "ipc/msg.h"
#include "ipc/util.h"
#include "stages/job/job.h"
#include "stages/runtime/worker.h"

#include "tests/testjob.h"

/* Every job here runs 12 steps unless its arguments say otherwise. */
static int setup(void **state) { tj_base = "--training.steps 12"; return tj_setup("ltrust"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 't', what); }

/* A socket of this test's own on job's control endpoint, with any routing id it likes: an
 * outsider's (no key), or one holding the job's operator key, which the job's owner (this
 * test) can read in the run folder: an insider, of the wrong role for all but swap and status. */
typedef struct {
    void *ctx, *sock;
} atk_t;

/* The first key of a key file (40 Z85 characters) into key; 0, or -1 when there is none. */
static int atk_key(const char *path, char *key)
{
    char buf[1024];
    tu_read_file(path, buf, sizeof(buf));
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
        if (line[0] != '#' && strlen(line) >= 40) {
            memcpy(key, line, 40);
            key[40] = 0;
            return 0;
        }
    return -1;
}

static void atk_close(atk_t *a)
{
    zmq_close(a->sock);
    zmq_ctx_term(a->ctx);
}

/* Returns 0, or -1 when as_operator and the job has no operator key to take. */
static int atk_open(atk_t *a, const char *job, const char *id, int as_operator)
{
    shm_seg_t *seg = NULL;
    char err[256], ep[256];
    if (shm_attach(&seg, job, "job", err, sizeof(err)))
        fail_msg("%s: %s", job, err);
    snprintf(ep, sizeof(ep), "%s", ((job_hdr_t *)shm_data(seg))->endpoint);
    shm_detach(&seg);
    a->ctx = zmq_ctx_new();
    a->sock = zmq_socket(a->ctx, ZMQ_DEALER);
    int linger = 1000;
    zmq_setsockopt(a->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(a->sock, ZMQ_ROUTING_ID, id, strlen(id));
    if (as_operator) {
        char path[300], sec[41], pub[41], srv[41];
        snprintf(path, sizeof(path), "%s/runs/%s/run/operator.key", tj_dir, job);
        int rc = atk_key(path, sec);
        snprintf(path, sizeof(path), "%s/runs/%s/run/coordinator.pub", tj_dir, job);
        if (rc || atk_key(path, srv) || zmq_curve_public(pub, sec)) {
            atk_close(a);
            return -1;
        }
        zmq_setsockopt(a->sock, ZMQ_CURVE_SERVERKEY, srv, 40);
        zmq_setsockopt(a->sock, ZMQ_CURVE_PUBLICKEY, pub, 40);
        zmq_setsockopt(a->sock, ZMQ_CURVE_SECRETKEY, sec, 40);
    }
    assert_int_equal(zmq_connect(a->sock, ep), 0);
    return 0;
}

static void atk_send(atk_t *a, const msg_t *m)
{
    uint8_t *buf;
    size_t len;
    assert_int_equal(msg_encode(m, &buf, &len), 0);
    zmq_send(a->sock, buf, len, ZMQ_DONTWAIT);
    free(buf);
}

/* A swap_argv message (words, NULL-terminated), packed by hand: the wire format itself. */
static void atk_send_argv(atk_t *a, const char *const *words)
{
    char data[1024];
    size_t n = 0;
    for (; *words; words++) {
        size_t k = strlen(*words) + 1;
        memcpy(data + n, *words, k);
        n += k;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "v", 1);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "swap_argv", 9);
    msgpack_pack_str_with_body(&pk, "data", 4);
    msgpack_pack_bin_with_body(&pk, data, n);
    zmq_send(a->sock, sb.data, sb.size, ZMQ_DONTWAIT);
    msgpack_sbuffer_destroy(&sb);
}

/* Attackers of job: [0] an outsider, [1] the operator's key (absent before issue 12: *n = 1). */
static void atk_both(atk_t *a, int *n, const char *job, const char *id)
{
    atk_open(&a[0], job, id, 0);
    *n = 1 + (atk_open(&a[1], job, id, 1) == 0);
}

static void atk_close_all(atk_t *a, int n)
{
    for (int i = 0; i < n; i++)
        atk_close(&a[i]);
}

/* The step in progress, from the job segment as the coordinator publishes it. */
static int64_t job_step(const char *job)
{
    shm_seg_t *seg = NULL;
    if (shm_attach(&seg, job, "job", NULL, 0))
        return -1;
    int64_t s = atomic_load(&((job_hdr_t *)shm_data(seg))->step);
    shm_detach(&seg);
    return s;
}

/* An attacked job runs until it is stopped, with a constant learning rate after warmup, so
 * that its first N losses are those of a run of N steps whatever N: every attack lands
 * mid-run, however fast the steps, and is compared against a reference of the same length.
 * Its batch makes a step a few ms here, so N stays small. */
#define ATK_ARGS "--training.steps 1000000 --lr_scheduler.decay_ratio 0 --metrics.log_freq 100000 " \
                 "--training.local_batch_size 32"

static pid_t atk_job(const char *job, const char *extra)
{
    char args[512];
    snprintf(args, sizeof(args), "%s %s", ATK_ARGS, extra);
    pid_t pid = tj_launch_bg(job, args);
    assert_int_equal(tj_wait_step(job, 3, 60), 0);
    return pid;
}

/* After the attack: job runs 20 more steps (a hung or failed job does not), is stopped, and
 * its losses so far equal those of a reference run `ref` of as many steps. */
static void atk_finish(pid_t pid, const char *ref, const char *job)
{
    static char out[1 << 16], lr[TJ_MAX_STEPS][40], lj[TJ_MAX_STEPS][40];
    int64_t s = job_step(job);
    assert_true(s > 0);
    int n = (int)s + 20, rc = -1;
    for (int i = 0; i < 6000 && rc; i++) { /* 60 s: the step in progress, not the metrics file */
        rc = job_step(job) > n ? 0 : -1;
        if (rc)
            tj_sleep_ms(10);
    }
    kill(pid, SIGINT);
    int status = tu_reap(pid, 30, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(status, 130);
    tj_assert_clean(job);
    assert_true(n < TJ_MAX_STEPS);
    char extra[512];
    snprintf(extra, sizeof(extra), "%s --training.steps %d", ATK_ARGS, n);
    tj_run_ok(ref, extra, out, sizeof(out));
    assert_int_equal(tj_losses(ref, lr), n);
    assert_true(tj_losses(job, lj) >= n);
    for (int i = 0; i < n; i++)
        if (strcmp(lr[i], lj[i])) {
            print_error("step %d: %s has loss %s, %s has %s\n", i + 1, ref, lr[i], job, lj[i]);
            fail();
        }
}

/* The control plane over TCP on loopback, with garbage thrown at the coordinator's socket
 * while it trains: it rejects the garbage and the losses are those of the ipc:// run. */
static void test_launch_over_tcp_with_garbage_on_the_socket_gives_the_same_losses(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], endpoint[256];
    job_name(a, sizeof(a), "ipc");
    job_name(b, sizeof(b), "tcp");
    assert_int_equal(tj_run(a, "--training.steps 400", out, sizeof(out)), 0);
    pid_t pid = tj_launch_bg(b, "--training.steps 400 --job.endpoint tcp://127.0.0.1:*");
    assert_int_equal(tj_wait_step(b, 2, 60), 0);
    /* the coordinator records its bound endpoint in the job segment */
    shm_seg_t *seg = NULL;
    char err[256];
    assert_int_equal(shm_attach(&seg, b, "job", err, sizeof(err)), 0);
    snprintf(endpoint, sizeof(endpoint), "%s", ((job_hdr_t *)shm_data(seg))->endpoint);
    shm_detach(&seg);
    assert_memory_equal(endpoint, "tcp://127.0.0.1:", 16);
    /* garbage reaches the decoder only under one of the job's keys (issue 12): the operator's */
    atk_t at;
    assert_int_equal(atk_open(&at, b, "rogue", 1), 0);
    void *sock = at.sock;
    int linger = 5000; /* zmq_ctx_term below waits until the garbage is delivered */
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
    uint64_t seed = 42;
    char junk[512];
    for (int i = 0; i < 300; i++) {
        size_t len = tu_next(&seed) % sizeof(junk);
        for (size_t k = 0; k < len; k++)
            junk[k] = (char)tu_next(&seed);
        if (i % 3 == 0) /* a valid-looking map of an unknown version */
            memcpy(junk, "\x82\xa1v\x07\xa4type\xa4step", len = 14);
        zmq_send(sock, junk, len, ZMQ_DONTWAIT);
    }
    atk_close(&at);
    assert_int_equal(tu_reap(pid, 120, NULL), 0);
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, b);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "rejected a control message"));
    tj_assert_same_losses(a, b, 400);
    tj_assert_clean(b);
}

/* `swap` ran its command through `sh -c` for any peer: here an outsider over TCP, and the
 * operator's key with a shell command and with an argv whose first word holds a ';'. No
 * shell runs (no file appears), the operator's bad swap is refused, training is untouched. */
static void test_launch_swap_runs_no_shell_and_heeds_only_the_operator(void **state)
{
    TU_NEED_BIN();
    char a[32], b[32], mark[300], shell[512];
    job_name(a, sizeof(a), "rceref");
    job_name(b, sizeof(b), "rce");
    pid_t pid = atk_job(b, "--job.endpoint tcp://127.0.0.1:*");
    snprintf(mark, sizeof(mark), "%s/%s.pwned", tj_dir, b);
    snprintf(shell, sizeof(shell), "touch %s; exec build/bin/ctitan-loader", mark);
    msg_t swap = {.type = MSG_SWAP, .text = shell, .text_len = strlen(shell)};
    atk_t at[2];
    int n;
    atk_both(at, &n, b, "cli.1.0");
    for (int i = 0; i < n; i++)
        atk_send(&at[i], &swap);
    atk_send_argv(&at[0], (const char *const[]){"sh", "-c", shell, NULL});
    if (n == 2)
        atk_send_argv(&at[1], (const char *const[]){"build/bin/ctitan-loader;", "touch", mark, NULL});
    tj_sleep_ms(1000); /* a swap happens at the next step boundary */
    atk_close_all(at, n);
    if (n == 2) { /* `ctitan status` is the operator's: heard with the key, not when others can read it */
        static char out[1 << 16];
        char cmd[1024], key[300];
        snprintf(cmd, sizeof(cmd), "%s status --job %s 2>&1", tu_ctitan(), b);
        snprintf(key, sizeof(key), "%s/runs/%s/run/operator.key", tj_dir, b);
        assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
        assert_int_equal(chmod(key, 0644), 0);
        assert_int_equal(tu_run(cmd, out, sizeof(out)), 1);
        assert_non_null(strstr(out, "others can read"));
        assert_int_equal(chmod(key, 0600), 0);
    }
    atk_finish(pid, a, b);
    assert_int_equal(access(mark, F_OK), -1); /* no shell ran */
}

/* A forged step_done from an outsider named "stage.1.0/x" (the suffix used to be taken as the
 * role) or the operator's key, for the step in progress, with a loss of its own: rejected, so
 * no round ends early and the losses stay bitwise. */
static void test_launch_forged_step_done_does_not_end_a_round(void **state)
{
    TU_NEED_BIN();
    char a[32], b[32];
    job_name(a, sizeof(a), "sdref");
    job_name(b, sizeof(b), "sdforge");
    pid_t pid = atk_job(b, "");
    atk_t at[2];
    int n;
    atk_both(at, &n, b, "stage.1.0/x");
    for (int k = 0; k < 100; k++) {
        int64_t s = job_step(b);
        for (int i = 0; i < n && s >= 0; i++)
            for (int64_t t = s; t <= s + 1; t++) {
                msg_t d = {.type = MSG_STEP_DONE, .step = t, .loss = 123.0};
                atk_send(&at[i], &d);
            }
        tj_sleep_ms(10);
    }
    atk_close_all(at, n);
    atk_finish(pid, a, b);
}

/* A forged error naming a real stage's pid ended the job with the attacker's text. */
static void test_launch_forged_error_does_not_end_the_job(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], path[300];
    job_name(a, sizeof(a), "erref");
    job_name(b, sizeof(b), "erforge");
    pid_t pid = atk_job(b, "");
    pid_t st = tu_descendant_named(pid, "ctitan-stage");
    assert_true(st > 0);
    const char *ids[] = {"stage.0.0/x", "stage.1.0/x"};
    for (int r = 0; r < 2; r++) {
        atk_t at[2];
        int n;
        atk_both(at, &n, b, ids[r]);
        msg_t e = {.type = MSG_ERROR, .rank = r, .pid = st, .text = "pwned", .text_len = 5};
        snprintf(e.role, sizeof(e.role), "stage");
        for (int i = 0; i < n; i++)
            atk_send(&at[i], &e);
        tj_sleep_ms(200);
        atk_close_all(at, n);
    }
    atk_finish(pid, a, b);
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, b);
    tu_read_file(path, out, sizeof(out));
    assert_null(strstr(out, "pwned"));
}

/* Forged heartbeats, each with its stage's own pid, from "stage.R.0/x" and the operator's key:
 * the stopped stage is still noticed within the heartbeat timeout. */
static void test_launch_forged_heartbeats_do_not_keep_a_stopped_stage_alive(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], path[300];
    job_name(j, sizeof(j), "hbforge");
    pid_t pid = tj_launch_bg(j, "--training.steps 100000 --job.heartbeat_interval_ms 50 --job.heartbeat_timeout_ms 1000 "
                          "--job.max_restarts 0");
    assert_int_equal(tj_wait_step(j, 2, 60), 0);
    pid_t st[2] = {tu_stage_pid(pid, 0), tu_stage_pid(pid, 1)};
    assert_true(st[0] > 0 && st[1] > 0);
    atk_t at[2][2];
    int n[2];
    atk_both(at[0], &n[0], j, "stage.0.0/x");
    atk_both(at[1], &n[1], j, "stage.1.0/x");
    kill(st[0], SIGSTOP);
    int status = 0, ended = 0;
    uint64_t k = 0; /* forgeries until the job ends (within the heartbeat timeout, 1 s), or 60 s */
    for (double until = util_now() + 60; !ended && util_now() < until; k++) {
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < n[r]; i++) {
                msg_t hb = {.type = MSG_HEARTBEAT, .rank = r, .pid = st[r], .progress = k};
                snprintf(hb.role, sizeof(hb.role), "stage");
                atk_send(&at[r][i], &hb);
            }
        tj_sleep_ms(20);
        ended = waitpid(pid, &status, WNOHANG) == pid;
    }
    for (int r = 0; r < 2; r++)
        atk_close_all(at[r], n[r]);
    if (!ended)
        status = tu_reap(pid, 30, NULL) << 8;
    kill(st[0], SIGKILL);
    assert_true(ended);
    assert_int_equal(WEXITSTATUS(status), 1);
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, j);
    tu_read_file(path, out, sizeof(out));
    assert_non_null(strstr(out, "no heartbeat"));
    assert_non_null(strstr(out, "stage rank 0"));
    tj_assert_clean(j);
}

/* A DEALER claiming the route "stage.0.0" (outsider, then operator key) took over the stage's
 * route and hung the job: the job goes on as if it were not there. */
static void test_launch_a_claimed_route_is_not_taken_over(void **state)
{
    TU_NEED_BIN();
    char a[32], b[32];
    job_name(a, sizeof(a), "rtref");
    job_name(b, sizeof(b), "rtclaim");
    pid_t pid = atk_job(b, "");
    atk_t at[2];
    int n;
    atk_both(at, &n, b, "stage.0.0");
    msg_t hb = {.type = MSG_HEARTBEAT};
    snprintf(hb.role, sizeof(hb.role), "stage");
    for (int i = 0; i < n; i++)
        atk_send(&at[i], &hb);
    tj_sleep_ms(300);
    atk_finish(pid, a, b); /* with the claimants still connected */
    atk_close_all(at, n);
}

/* A forged saved for the checkpoint in flight made the coordinator snapshot into the staging
 * segment while checkpointd still wrote from it: a torn checkpoint that verified. With
 * forgeries throughout the run, every checkpoint resumes bitwise. */
static void test_launch_forged_saved_does_not_tear_a_checkpoint(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], r[32], dir[256], extra[512];
    job_name(a, sizeof(a), "svref");
    job_name(b, sizeof(b), "svforge");
    job_name(r, sizeof(r), "svres");
    assert_int_equal(tj_run(a, "", out, sizeof(out)), 0);
    setenv("CTITAN_TEST_CKPT_DELAY_MS", "200", 1); /* each checkpoint takes 0.6 s: the forger has time */
    pid_t pid = tj_launch_bg(b, "--checkpoint.enable true --checkpoint.interval 2 --checkpoint.keep_latest_k 0");
    unsetenv("CTITAN_TEST_CKPT_DELAY_MS");
    assert_int_equal(tj_wait_step(b, 1, 60), 0);
    atk_t at[2];
    int n, status = 0, ended = 0;
    atk_both(at, &n, b, "checkpointd.0.0/x");
    /* forging until the job ends, however slow the machine (a count of rounds ran out first
     * on a loaded one: the job took longer than 3000 rounds of 5 ms) */
    for (double until = util_now() + 180; !ended && util_now() < until;) {
        for (int i = 0; i < n; i++)
            for (int s = 2; s <= 12; s += 2) {
                msg_t sv = {.type = MSG_SAVED, .step = s, .ok = 1, .text = "forged", .text_len = 6};
                atk_send(&at[i], &sv);
            }
        tj_sleep_ms(5);
        ended = waitpid(pid, &status, WNOHANG) == pid;
    }
    atk_close_all(at, n);
    if (!ended)
        status = tu_reap(pid, 60, NULL) << 8;
    assert_true(ended);
    assert_int_equal(WEXITSTATUS(status), 0);
    tj_assert_same_losses(a, b, 12);
    tj_ckpt_dir(dir, sizeof(dir), b);
    for (int from = 2; from <= 6; from += 4) { /* the early ones had the most time to tear */
        snprintf(extra, sizeof(extra), "--checkpoint.load %s/step-%08d", dir, from);
        tj_run_ok(r, extra, out, sizeof(out));
        tj_assert_resumed_losses(a, r, from, 12);
    }
    tj_assert_clean(b);
}

/* 2,400 garbage messages under the operator's key and 2,400 from an outsider, and 40
 * connections that fail their handshake: a bounded number of log lines (it was one per
 * message), every rejection counted in the summary, and training untouched. */
static void test_launch_a_flood_of_bad_messages_is_logged_at_a_bounded_rate(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 20];
    char a[32], b[32], path[300];
    job_name(a, sizeof(a), "flref");
    job_name(b, sizeof(b), "flood");
    pid_t pid = atk_job(b, "");
    atk_t at[2];
    int n;
    atk_both(at, &n, b, "flood");
    uint64_t seed = 7;
    char junk[256];
    for (int k = 0; k < 2400; k++)
        for (int i = 0; i < n; i++) {
            size_t len = 1 + tu_next(&seed) % sizeof(junk);
            for (size_t q = 0; q < len; q++)
                junk[q] = (char)tu_next(&seed);
            while (zmq_send(at[i].sock, junk, len, ZMQ_DONTWAIT) < 0 && i == 1)
                tj_sleep_ms(1); /* the operator's socket is full: wait, every message must go */
        }
    for (int k = 0; k < 40; k++) {
        atk_t o;
        atk_open(&o, b, "flood-connect", 0);
        zmq_send(o.sock, "x", 1, ZMQ_DONTWAIT);
        tj_sleep_ms(5);
        int zero = 0; /* its message never goes: do not wait for it */
        zmq_setsockopt(o.sock, ZMQ_LINGER, &zero, sizeof(zero));
        atk_close(&o);
    }
    tj_sleep_ms(500);
    int zero = 0; /* the outsider's queue never drains */
    zmq_setsockopt(at[0].sock, ZMQ_LINGER, &zero, sizeof(zero));
    atk_close_all(at, n);
    atk_finish(pid, a, b);
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, b);
    tu_read_file(path, out, sizeof(out));
    int lines = 0;
    for (char *p = out; (p = strstr(p, "rejected a control message")); p++)
        lines++;
    for (char *p = out; (p = strstr(p, "refused a connection")); p++)
        lines++;
    if (lines > 40)
        fail_msg("%d log lines for the flood", lines);
    unsigned long long rejected = 0;
    char *sum = strstr(out, "the control plane rejected ");
    assert_non_null(sum);
    assert_int_equal(sscanf(sum, "the control plane rejected %llu", &rejected), 1);
    assert_true(rejected >= 2400);
}

/* The operator's key on a client that asks for the status 20,000 times and never reads a
 * reply: the replies that cannot go are logged at the flood's bounded rate, then summed up. */
static void test_launch_an_operator_that_never_reads_is_logged_at_a_bounded_rate(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 20];
    char a[32], b[32], path[300];
    job_name(a, sizeof(a), "deafref");
    job_name(b, sizeof(b), "deaf");
    pid_t pid = atk_job(b, "");
    atk_t o;
    assert_int_equal(atk_open(&o, b, "deaf", 1), 0);
    int one = 1;
    zmq_setsockopt(o.sock, ZMQ_RCVHWM, &one, sizeof(one));
    msg_t st = {.type = MSG_STATUS};
    for (int k = 0; k < 20000; k++) {
        atk_send(&o, &st);
        if (k % 1000 == 999)
            tj_sleep_ms(20);
    }
    tj_sleep_ms(500);
    int zero = 0;
    zmq_setsockopt(o.sock, ZMQ_LINGER, &zero, sizeof(zero));
    atk_close(&o);
    atk_finish(pid, a, b);
    snprintf(path, sizeof(path), "%s/%s.out", tj_dir, b);
    tu_read_file(path, out, sizeof(out));
    int lines = 0;
    for (char *p = out; (p = strstr(p, "cannot answer the operator")); p++)
        lines++;
    if (lines == 0 || lines > 40)
        fail_msg("%d log lines for the replies that could not go", lines);
}

/* Run as a worker the coordinator started, through a wrapper script in a copy of build/bin
 * (CTITAN_TEST_EVIL lists the messages, argv[1..] is the real program): sends each message
 * with the worker's own key, on a socket of its own, before the real program starts with the
 * same keys. No cmocka here: the exit status is the real program's. */
static int evil_main(char **argv)
{
    worker_keys_t k;
    ctl_t *c = NULL;
    char err[256];
    if (worker_keys_take(&k, "evil", err, sizeof(err)) ||
        ctl_client_new(&c, getenv(WORKER_ENV_ENDPOINT), "evil", k.server, &k.me, err, sizeof(err))) {
        fprintf(stderr, "evil: %s\n", err);
        return 1;
    }
    char list[256];
    snprintf(list, sizeof(list), "%s", getenv("CTITAN_TEST_EVIL"));
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
        msg_t m = {.pid = getpid(), .step = 0, .ok = 1, .text = "evil", .text_len = 4};
        snprintf(m.role, sizeof(m.role), "evil");
        for (int i = 1; i < MSG_TYPE_END; i++)
            if (!strcmp(msg_type_name((msg_type_t)i), t))
                m.type = (msg_type_t)i;
        msg_set_data(&m, "build/bin/ctitan-loader", 24);
        ctl_send(c, NULL, &m);
        free(m.data);
    }
    tj_sleep_ms(300);
    ctl_destroy(&c); /* its linger delivers them */
    int fd = worker_keys_pipe(&k);
    char num[16];
    snprintf(num, sizeof(num), "%d", fd);
    fcntl(fd, F_SETFD, 0);
    setenv(WORKER_ENV_KEYS, num, 1);
    unsetenv("CTITAN_TEST_EVIL");
    execv(argv[1], argv + 1);
    fprintf(stderr, "evil: cannot run %s: %s\n", argv[1], strerror(errno));
    return 127;
}

/* A copy of build/bin whose checkpointd, loader and stage first send, with their own keys,
 * what their role may not send or what nobody expects yet (issue 12's table): a checkpointd's
 * saved for a checkpoint not being written, its loaded with no load asked for, a step_done;
 * a loader's swap_argv, status, step_done and a ready before its hello; a stage's step_done
 * before any step. Each is rejected with one line naming the sender's key and why; the job,
 * its checkpoints and its losses are those of a run without them. */
static void test_launch_workers_keys_are_bound_to_their_role_and_to_what_is_expected(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char a[32], b[32], bin[300], real[400], cmd[4096], args[2048], self[400];
    job_name(a, sizeof(a), "inref");
    job_name(b, sizeof(b), "insider");
    char resolved[PATH_MAX];
    assert_non_null(realpath(tu_ctitan(), resolved));
    assert_true(strlen(resolved) < sizeof(real));
    snprintf(real, sizeof(real), "%.399s", resolved);
    *strrchr(real, '/') = 0;
    ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1); /* this program: the wrappers run it */
    assert_true(k > 0);
    self[k] = 0;
    snprintf(bin, sizeof(bin), "%s/evilbin-%s", tj_dir, b);
    static const struct {
        const char *prog, *evil;
    } w[] = {{"checkpointd", "saved,loaded,step_done"},
             {"ctitan-loader", "swap_argv,status,step_done,ready"},
             {"ctitan-stage", "step_done"},
             {"ctitan-optshard", NULL},
             {"ctitan-loader-text", NULL}};
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && cp %s/ctitan %s/", bin, real, bin);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        char path[400];
        snprintf(path, sizeof(path), "%s/%s", bin, w[i].prog);
        if (!w[i].evil) {
            snprintf(cmd, sizeof(cmd), "%s/%s", real, w[i].prog);
            assert_int_equal(symlink(cmd, path), 0);
            continue;
        }
        FILE *f = fopen(path, "w");
        fprintf(f, "#!/bin/sh\nCTITAN_TEST_EVIL=%s exec %s %s/%s \"$@\"\n", w[i].evil, self, real, w[i].prog);
        fclose(f);
        chmod(path, 0755);
    }
    const char *extra = "--checkpoint.enable true --checkpoint.interval 4";
    tj_run_ok(a, extra, out, sizeof(out));
    tj_args(args, sizeof(args), b, "");
    snprintf(cmd, sizeof(cmd), "%s/ctitan %s %s 2>&1", bin, args, extra);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    static const char *const want[] = {
        "saved from checkpointd.0.0@", "no checkpoint of that step is being written",
        "loaded from checkpointd.0.0@", "no checkpoint is being loaded",
        "step_done from checkpointd.0.0@", "a checkpointd does not send it",
        "swap_argv from loader.0.0@", "status from loader.0.0@", "step_done from loader.0.0@",
        "a loader does not send it", "ready from loader.0.0@", "ready before hello",
        "step_done from stage.0.0@", "step_done from stage.1.0@", "no round is waiting for it from this process",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (!strstr(out, want[i]))
            fail_msg("no \"%s\" in:\n%s", want[i], out);
    char *first = strstr(out, "saved from checkpointd");
    assert_null(strstr(first + 1, "saved from checkpointd")); /* logged once */
    tj_assert_same_losses(a, b, 12);
    char dir[256];
    tj_ckpt_dir(dir, sizeof(dir), b);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 3);
    free(steps);
    tj_assert_clean(b);
}

int main(int argc, char **argv)
{
    if (getenv("CTITAN_TEST_EVIL") && argc > 1) /* a wrapper of the insider test */
        return evil_main(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch_over_tcp_with_garbage_on_the_socket_gives_the_same_losses),
        cmocka_unit_test(test_launch_swap_runs_no_shell_and_heeds_only_the_operator),
        cmocka_unit_test(test_launch_forged_step_done_does_not_end_a_round),
        cmocka_unit_test(test_launch_forged_error_does_not_end_the_job),
        cmocka_unit_test(test_launch_forged_heartbeats_do_not_keep_a_stopped_stage_alive),
        cmocka_unit_test(test_launch_a_claimed_route_is_not_taken_over),
        cmocka_unit_test(test_launch_forged_saved_does_not_tear_a_checkpoint),
        cmocka_unit_test(test_launch_a_flood_of_bad_messages_is_logged_at_a_bounded_rate),
        cmocka_unit_test(test_launch_an_operator_that_never_reads_is_logged_at_a_bounded_rate),
        cmocka_unit_test(test_launch_workers_keys_are_bound_to_their_role_and_to_what_is_expected),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
