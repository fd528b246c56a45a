/* The control-plane sockets: a ROUTER server and DEALER clients over ipc:// and tcp://,
 * routing by id, timeouts, garbage from raw peers, a client in a forked process, handover of
 * a reconnecting id, and two threads each with its own socket. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "ipc/ctl.h"
#include "tests/testutil.h"
#include "ipc/util.h"

#define WAIT_MS 2000 /* generous: a pass takes milliseconds */

typedef struct {
    char dir[64];
    char ep[128];
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    strcpy(f->dir, "/tmp/ctitan-test-ctl-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->ep, sizeof f->ep, "ipc://%s/ctl.sock", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    int rc = tu_rmtree(f->dir);
    free(f);
    return rc;
}

static void must(int rc, const char *err)
{
    if (rc) fail_msg("rc %d: %s", rc, err);
}

static void recv_ok(ctl_t *c, char *from, msg_t *m)
{
    char err[256] = "";
    int rc = ctl_recv(c, WAIT_MS, from, m, err, sizeof err);
    if (rc) fail_msg("ctl_recv: %d (%s) %s", rc, strerror(-rc), err);
}

static msg_t hello(const char *role, int rank, int64_t pid)
{
    msg_t m = {.type = MSG_HELLO, .rank = rank, .replica = 0, .pid = pid};
    snprintf(m.role, sizeof m.role, "%s", role);
    return m;
}

/* hello from the client, step back from the server */
static void exchange(ctl_t *srv, ctl_t *cli, const char *id)
{
    msg_t h = hello("stage", 1, 4321), m;
    assert_int_equal(ctl_send(cli, NULL, &h), 0);
    char from[CTL_ID_MAX];
    recv_ok(srv, from, &m);
    assert_string_equal(from, id);
    assert_int_equal(m.type, MSG_HELLO);
    assert_string_equal(m.role, "stage");
    assert_int_equal(m.rank, 1);
    assert_int_equal(m.pid, 4321);

    msg_t cfg = {.type = MSG_CONFIG, .step = 17};
    assert_int_equal(msg_set_text(&cfg, "[train]\nsteps = 100\n"), 0);
    assert_int_equal(ctl_send(srv, from, &cfg), 0);
    recv_ok(cli, NULL, &m);
    assert_int_equal(m.type, MSG_CONFIG);
    assert_int_equal(m.step, 17);
    assert_string_equal(m.text, cfg.text);
    msg_clear(&m);
    msg_clear(&cfg);
}

static void test_ctl_ipc_messages_flow_both_ways_with_the_routing_id(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *cli;
    char err[256] = "";
    must(ctl_server_new(&srv, f->ep, err, sizeof err), err);
    assert_string_equal(ctl_endpoint(srv), f->ep);
    must(ctl_client_new(&cli, f->ep, "stage.1.0", err, sizeof err), err);
    assert_non_null(ctl_socket(cli));
    exchange(srv, cli, "stage.1.0");
    exchange(srv, cli, "stage.1.0");
    ctl_destroy(&cli);
    ctl_destroy(&srv);
    assert_null(srv);
    assert_null(cli);
    ctl_destroy(&srv); /* twice is harmless */
}

static void test_ctl_tcp_on_an_ephemeral_port(void **state)
{
    ctl_t *srv, *cli;
    char err[256] = "";
    must(ctl_server_new(&srv, "tcp://127.0.0.1:*", err, sizeof err), err);
    const char *ep = ctl_endpoint(srv);
    int port = 0;
    assert_int_equal(sscanf(ep, "tcp://127.0.0.1:%d", &port), 1);
    assert_true(port > 0 && port < 65536);
    must(ctl_client_new(&cli, ep, "loader.0.0", err, sizeof err), err);
    exchange(srv, cli, "loader.0.0");
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

static void test_ctl_send_to_an_unknown_peer_is_ehostunreach(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *cli;
    char err[256] = "";
    must(ctl_server_new(&srv, f->ep, err, sizeof err), err);
    must(ctl_client_new(&cli, f->ep, "stage.0.0", err, sizeof err), err);
    exchange(srv, cli, "stage.0.0");
    msg_t stop = {.type = MSG_STOP};
    assert_int_equal(ctl_send(srv, "stage.9.9", &stop), -EHOSTUNREACH);
    assert_int_equal(ctl_send(srv, "", &stop), -EHOSTUNREACH);
    /* the server still talks to the peer it knows */
    assert_int_equal(ctl_send(srv, "stage.0.0", &stop), 0);
    msg_t m;
    recv_ok(cli, NULL, &m);
    assert_int_equal(m.type, MSG_STOP);
    /* misuse: a server needs a peer, a client takes none */
    assert_int_equal(ctl_send(srv, NULL, &stop), -EINVAL);
    assert_int_equal(ctl_send(cli, "x", &stop), -EINVAL);
    /* and an unencodable message is refused before anything is sent */
    msg_t bad = {.type = MSG_SWAP};
    assert_int_equal(ctl_send(cli, NULL, &bad), -EINVAL);
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

static void test_ctl_recv_times_out_with_eagain(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *cli;
    char err[256] = "", from[CTL_ID_MAX];
    must(ctl_server_new(&srv, f->ep, err, sizeof err), err);
    must(ctl_client_new(&cli, f->ep, "stage.0.0", err, sizeof err), err);
    msg_t m;
    double t0 = util_now();
    assert_int_equal(ctl_recv(srv, 50, from, &m, err, sizeof err), -EAGAIN);
    double dt = util_now() - t0;
    assert_true(dt >= 0.045 && dt < 1.0);
    assert_int_equal(ctl_recv(cli, 0, NULL, &m, err, sizeof err), -EAGAIN);
    assert_int_equal(ctl_recv(srv, 0, from, &m, err, sizeof err), -EAGAIN);
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

/* A raw DEALER in its own context, to send what ctl_send never would. */
typedef struct {
    void *ctx, *sock;
} raw_t;

static raw_t raw_dealer(const char *ep, const char *id)
{
    raw_t r = {zmq_ctx_new(), NULL};
    r.sock = zmq_socket(r.ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(r.sock, ZMQ_LINGER, &zero, sizeof zero);
    if (id) zmq_setsockopt(r.sock, ZMQ_ROUTING_ID, id, strlen(id));
    assert_int_equal(zmq_connect(r.sock, ep), 0);
    return r;
}

static void raw_close(raw_t *r)
{
    zmq_close(r->sock);
    zmq_ctx_term(r->ctx);
}

static void expect_badmsg(ctl_t *srv, const char *want_from, const char *want_err)
{
    char err[256] = "", from[CTL_ID_MAX] = "junk";
    msg_t m;
    int rc = ctl_recv(srv, WAIT_MS, from, &m, err, sizeof err);
    if (rc != -EBADMSG) fail_msg("expected -EBADMSG, got %d (%s)", rc, err);
    if (!strstr(err, want_err)) fail_msg("error \"%s\" lacks \"%s\"", err, want_err);
    assert_string_equal(from, want_from);
    assert_null(m.text);
}

static void test_ctl_garbage_from_a_raw_peer_is_ebadmsg_and_the_server_goes_on(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv;
    char err[256] = "", from[CTL_ID_MAX];
    must(ctl_server_new(&srv, f->ep, err, sizeof err), err);
    raw_t r = raw_dealer(f->ep, "rogue");
    assert_int_equal(zmq_send(r.sock, "\xc1garbage", 8, 0), 8);
    expect_badmsg(srv, "rogue", "invalid msgpack byte 0xc1");
    /* two frames where one is expected */
    uint8_t *buf;
    size_t len;
    msg_t stop = {.type = MSG_STOP};
    assert_int_equal(msg_encode(&stop, &buf, &len), 0);
    assert_int_equal(zmq_send(r.sock, buf, len, ZMQ_SNDMORE), (int)len);
    assert_int_equal(zmq_send(r.sock, buf, len, ZMQ_SNDMORE), (int)len);
    assert_int_equal(zmq_send(r.sock, buf, len, 0), (int)len);
    expect_badmsg(srv, "rogue", "expected 2 frames, got 4");
    /* an empty frame, then a future version */
    assert_int_equal(zmq_send(r.sock, "", 0, 0), 0);
    expect_badmsg(srv, "rogue", "truncated");
    assert_int_equal(zmq_send(r.sock, "\x82\xa1v\x02\xa4type\xa4stop", 14, 0), 14);
    expect_badmsg(srv, "rogue", "unsupported message version 2");
    /* and the next good message is delivered */
    assert_int_equal(zmq_send(r.sock, buf, len, 0), (int)len);
    msg_t m;
    recv_ok(srv, from, &m);
    assert_string_equal(from, "rogue");
    assert_int_equal(m.type, MSG_STOP);
    free(buf);

    /* a peer without a routing id gets one from the ROUTER that is not a name */
    raw_t anon = raw_dealer(f->ep, NULL);
    msg_t h = hello("stage", 0, 1);
    assert_int_equal(msg_encode(&h, &buf, &len), 0);
    assert_int_equal(zmq_send(anon.sock, buf, len, 0), (int)len);
    expect_badmsg(srv, "", "routing id is not a name");
    free(buf);
    raw_close(&anon);
    raw_close(&r);
    ctl_destroy(&srv);
}

static void test_ctl_an_oversized_frame_drops_that_peer_not_the_server(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *cli;
    char err[256] = "", from[CTL_ID_MAX];
    must(ctl_server_new(&srv, f->ep, err, sizeof err), err);
    raw_t r = raw_dealer(f->ep, "hog");
    size_t big = MSG_MAX_BYTES + 1;
    char *p = calloc(1, big);
    assert_int_equal(zmq_send(r.sock, p, big, 0), (int)big);
    free(p);
    msg_t m;
    assert_int_equal(ctl_recv(srv, 200, from, &m, err, sizeof err), -EAGAIN);
    must(ctl_client_new(&cli, f->ep, "stage.0.0", err, sizeof err), err);
    exchange(srv, cli, "stage.0.0");
    ctl_destroy(&cli);
    raw_close(&r);
    ctl_destroy(&srv);
}

static void test_ctl_client_rejects_garbage_from_the_server(void **state)
{
    fixture_t *f = *state;
    void *ctx = zmq_ctx_new(), *router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_bind(router, f->ep), 0);
    ctl_t *cli;
    char err[256] = "";
    must(ctl_client_new(&cli, f->ep, "stage.2.0", err, sizeof err), err);
    msg_t h = hello("stage", 2, 7), m;
    assert_int_equal(ctl_send(cli, NULL, &h), 0);
    char id[64], payload[256];
    int n = zmq_recv(router, id, sizeof id, 0);
    assert_int_equal(n, 9);
    assert_memory_equal(id, "stage.2.0", 9);
    assert_true(zmq_recv(router, payload, sizeof payload, 0) > 0);
    zmq_send(router, id, (size_t)n, ZMQ_SNDMORE);
    zmq_send(router, "\x93\x01\x02\x03", 4, 0);
    assert_int_equal(ctl_recv(cli, WAIT_MS, NULL, &m, err, sizeof err), -EBADMSG);
    assert_string_equal(err, "not a msgpack map (got an array)");
    zmq_send(router, id, (size_t)n, ZMQ_SNDMORE);
    zmq_send(router, "a", 1, ZMQ_SNDMORE);
    zmq_send(router, "b", 1, 0);
    assert_int_equal(ctl_recv(cli, WAIT_MS, NULL, &m, err, sizeof err), -EBADMSG);
    assert_string_equal(err, "expected 1 frame, got 2");
    ctl_destroy(&cli);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

/* In the child: no cmocka, just an exit status saying which step failed. */
static int child_main(const char *ep)
{
    ctl_t *cli;
    char err[256];
    if (ctl_client_new(&cli, ep, "optshard.0.1", err, sizeof err)) return 10;
    msg_t h = hello("optshard", 0, getpid()), m;
    h.replica = 1;
    if (ctl_send(cli, NULL, &h)) return 11;
    if (ctl_recv(cli, WAIT_MS, NULL, &m, err, sizeof err) || m.type != MSG_UPDATE || m.step != 5)
        return 12;
    msg_t done = {.type = MSG_UPDATED, .step = m.step, .lr = m.grad_norm * m.scale, .t_busy = 0.25};
    if (ctl_send(cli, NULL, &done)) return 13;
    ctl_destroy(&cli);
    return 0;
}

static void test_ctl_client_in_a_forked_child_talks_to_the_parent(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv;
    char err[256] = "", from[CTL_ID_MAX];
    must(ctl_server_new(&srv, f->ep, err, sizeof err), err); /* the parent's context exists */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(child_main(f->ep));
    msg_t m;
    recv_ok(srv, from, &m);
    assert_string_equal(from, "optshard.0.1");
    assert_int_equal(m.type, MSG_HELLO);
    assert_int_equal(m.pid, pid);
    assert_int_equal(m.replica, 1);
    msg_t up = {.type = MSG_UPDATE, .step = 5, .grad_norm = 3.0, .scale = 0.5};
    assert_int_equal(ctl_send(srv, from, &up), 0);
    recv_ok(srv, from, &m);
    assert_int_equal(m.type, MSG_UPDATED);
    assert_int_equal(m.step, 5);
    assert_true(m.lr == 1.5 && m.t_busy == 0.25);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    ctl_destroy(&srv);
}

static void test_ctl_a_reconnecting_client_with_the_same_id_takes_over(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *old, *new;
    char err[256] = "", from[CTL_ID_MAX];
    must(ctl_server_new(&srv, f->ep, err, sizeof err), err);
    must(ctl_client_new(&old, f->ep, "loader.0.0", err, sizeof err), err);
    msg_t h = hello("loader", 0, 100), m;
    assert_int_equal(ctl_send(old, NULL, &h), 0);
    recv_ok(srv, from, &m);
    assert_int_equal(m.pid, 100);
    /* a restarted loader connects while the old socket is still open */
    must(ctl_client_new(&new, f->ep, "loader.0.0", err, sizeof err), err);
    h.pid = 200;
    assert_int_equal(ctl_send(new, NULL, &h), 0);
    recv_ok(srv, from, &m);
    assert_string_equal(from, "loader.0.0");
    assert_int_equal(m.pid, 200);
    msg_t st = {.type = MSG_STEP, .step = 3};
    assert_int_equal(ctl_send(srv, "loader.0.0", &st), 0);
    recv_ok(new, NULL, &m);
    assert_int_equal(m.type, MSG_STEP);
    assert_int_equal(m.step, 3);
    assert_int_equal(ctl_recv(old, 100, NULL, &m, err, sizeof err), -EAGAIN);
    ctl_destroy(&old);
    ctl_destroy(&new);
    ctl_destroy(&srv);
}

static void test_ctl_replaces_a_stale_ipc_socket_file(void **state)
{
    fixture_t *f = *state;
    const char *path = f->ep + strlen("ipc://");
    /* a socket file left behind by a dead process */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    ctl_t *srv, *cli;
    char err[256] = "";
    must(ctl_server_new(&srv, f->ep, err, sizeof err), err);
    must(ctl_client_new(&cli, f->ep, "stage.0.0", err, sizeof err), err);
    exchange(srv, cli, "stage.0.0");
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

static void test_ctl_refuses_an_ipc_path_a_live_server_or_a_file_holds(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *second = NULL;
    char err[256] = "";
    must(ctl_server_new(&srv, f->ep, err, sizeof err), err);
    assert_int_equal(ctl_server_new(&second, f->ep, err, sizeof err), -EADDRINUSE);
    assert_null(second);
    assert_true(strstr(err, "cannot bind ipc://") && strstr(err, "already listening"));
    ctl_destroy(&srv);

    char ep[160], path[140];
    snprintf(path, sizeof path, "%s/notes.txt", f->dir);
    snprintf(ep, sizeof ep, "ipc://%s", path);
    FILE *fp = fopen(path, "w");
    fputs("keep me", fp);
    fclose(fp);
    assert_int_equal(ctl_server_new(&srv, ep, err, sizeof err), -EEXIST);
    assert_non_null(strstr(err, "is not a socket"));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 7);
}

static void test_ctl_bad_endpoints_and_ids_are_reported(void **state)
{
    ctl_t *c = (ctl_t *)1;
    char err[256] = "";
    assert_int_not_equal(ctl_server_new(&c, "bogus://nowhere", err, sizeof err), 0);
    assert_null(c);
    assert_non_null(strstr(err, "cannot bind bogus://nowhere: "));
    assert_int_not_equal(ctl_server_new(&c, "tcp://127.0.0.1:notaport", err, sizeof err), 0);
    assert_non_null(strstr(err, "cannot bind tcp://127.0.0.1:notaport"));
    assert_int_not_equal(ctl_client_new(&c, "bogus://x", "a", err, sizeof err), 0);
    assert_non_null(strstr(err, "cannot connect bogus://x"));
    char id[CTL_ID_MAX + 1];
    memset(id, 'i', CTL_ID_MAX);
    id[CTL_ID_MAX] = '\0';
    assert_int_equal(ctl_client_new(&c, "tcp://127.0.0.1:1", id, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "routing id"));
    assert_int_equal(ctl_client_new(&c, "tcp://127.0.0.1:1", "", err, sizeof err), -EINVAL);
    id[CTL_ID_MAX - 1] = '\0'; /* the longest id is fine */
    must(ctl_client_new(&c, "tcp://127.0.0.1:1", id, err, sizeof err), err);
    ctl_destroy(&c);
}

typedef struct {
    const char *ep;
    int sent;
    int rc;
} hb_arg_t;

/* A worker's heartbeat thread: its own ctl_t, the same process context. */
static void *heartbeat_thread(void *p)
{
    hb_arg_t *a = p;
    ctl_t *c;
    char err[256];
    a->rc = ctl_client_new(&c, a->ep, "stage.0.0.hb", err, sizeof err);
    if (a->rc) return NULL;
    for (int i = 0; i < 20 && !a->rc; i++) {
        msg_t hb = {.type = MSG_HEARTBEAT, .progress = (uint64_t)i, .pid = getpid()};
        strcpy(hb.role, "stage");
        a->rc = ctl_send(c, NULL, &hb);
        a->sent += !a->rc;
    }
    ctl_destroy(&c);
    return NULL;
}

static void test_ctl_two_threads_each_with_a_socket_share_the_process(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *cli;
    char err[256] = "", from[CTL_ID_MAX];
    must(ctl_server_new(&srv, f->ep, err, sizeof err), err);
    must(ctl_client_new(&cli, f->ep, "stage.0.0", err, sizeof err), err);
    hb_arg_t a = {.ep = f->ep};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, heartbeat_thread, &a), 0);
    for (int i = 0; i < 20; i++) {
        msg_t d = {.type = MSG_STEP_DONE, .step = i, .loss = i * 0.5};
        assert_int_equal(ctl_send(cli, NULL, &d), 0);
    }
    int beats = 0, dones = 0;
    uint64_t next_beat = 0;
    int64_t next_step = 0;
    while (beats < 20 || dones < 20) {
        msg_t m;
        recv_ok(srv, from, &m);
        if (m.type == MSG_HEARTBEAT) {
            assert_string_equal(from, "stage.0.0.hb");
            assert_true(m.progress == next_beat++); /* in order per peer */
            beats++;
        } else {
            assert_string_equal(from, "stage.0.0");
            assert_int_equal(m.type, MSG_STEP_DONE);
            assert_int_equal(m.step, next_step++);
            dones++;
        }
    }
    pthread_join(th, NULL);
    assert_int_equal(a.rc, 0);
    assert_int_equal(a.sent, 20);
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_ctl_ipc_messages_flow_both_ways_with_the_routing_id),
        T(test_ctl_tcp_on_an_ephemeral_port),
        T(test_ctl_send_to_an_unknown_peer_is_ehostunreach),
        T(test_ctl_recv_times_out_with_eagain),
        T(test_ctl_garbage_from_a_raw_peer_is_ebadmsg_and_the_server_goes_on),
        T(test_ctl_an_oversized_frame_drops_that_peer_not_the_server),
        T(test_ctl_client_rejects_garbage_from_the_server),
        T(test_ctl_client_in_a_forked_child_talks_to_the_parent),
        T(test_ctl_a_reconnecting_client_with_the_same_id_takes_over),
        T(test_ctl_replaces_a_stale_ipc_socket_file),
        T(test_ctl_refuses_an_ipc_path_a_live_server_or_a_file_holds),
        T(test_ctl_bad_endpoints_and_ids_are_reported),
        T(test_ctl_two_threads_each_with_a_socket_share_the_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
