/* The control-plane sockets: a ROUTER server and DEALER clients over ipc:// and tcp://, all
 * CURVE; routing by route, timeouts, garbage from raw peers, a client in a forked process, a
 * restarted client, two threads each with its own socket; and what issue 12 asks of them:
 * keys not allowed are refused at the handshake (counted, not delivered), the key and not the
 * routing id names the sender, a route cannot be taken over, a revoked key cannot connect. */
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
    keys_pair_t srv; /* the server's key pair */
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    strcpy(f->dir, "/tmp/ctitan-test-ctl-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->ep, sizeof f->ep, "ipc://%s/ctl.sock", f->dir);
    if (keys_pair_new(&f->srv, NULL, 0)) return -1;
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

static fixture_t *g_f; /* the current test's, for the helpers below */

/* A server bound to ep with the fixture's key. */
static int server_new(ctl_t **srv, const char *ep, char *err, size_t errlen)
{
    int rc = ctl_server_new(srv, g_f->srv.sec, err, errlen);
    if (!rc && (rc = ctl_bind(*srv, ep, err, errlen)))
        ctl_destroy(srv);
    return rc;
}

/* A client named id with a fresh key that srv admits as user id (srv may be NULL: a key
 * nobody allowed). */
static int client_new(ctl_t **cli, ctl_t *srv, const char *ep, const char *id, char *err, size_t errlen)
{
    keys_pair_t k;
    if (keys_pair_new(&k, err, errlen)) return -1;
    if (srv) assert_int_equal(ctl_allow(srv, k.pub, id), 0);
    return ctl_client_new(cli, ep, id, g_f->srv.pub, &k, err, errlen);
}

/* Whether route is name followed by '#' and the random suffix. */
static void assert_route_of(const char *route, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(route, name, n) || route[n] != '#' || strlen(route + n + 1) != CTL_NONCE)
        fail_msg("route '%s' is not '%s#' and %d characters", route, name, CTL_NONCE);
}

static void recv_ok(ctl_t *c, ctl_peer_t *from, msg_t *m)
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
    ctl_peer_t from;
    recv_ok(srv, &from, &m);
    assert_string_equal(from.user, id);
    assert_route_of(from.route, id);
    assert_string_equal(from.route, ctl_route(cli));
    assert_int_equal(m.type, MSG_HELLO);
    assert_string_equal(m.role, "stage");
    assert_int_equal(m.rank, 1);
    assert_int_equal(m.pid, 4321);

    msg_t cfg = {.type = MSG_CONFIG, .step = 17};
    assert_int_equal(msg_set_text(&cfg, "[train]\nsteps = 100\n"), 0);
    assert_int_equal(ctl_send(srv, from.route, &cfg), 0);
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
    must(server_new(&srv, f->ep, err, sizeof err), err);
    assert_string_equal(ctl_endpoint(srv), f->ep);
    must(client_new(&cli, srv, f->ep, "stage.1.0", err, sizeof err), err);
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
    must(server_new(&srv, "tcp://127.0.0.1:*", err, sizeof err), err);
    const char *ep = ctl_endpoint(srv);
    int port = 0;
    assert_int_equal(sscanf(ep, "tcp://127.0.0.1:%d", &port), 1);
    assert_true(port > 0 && port < 65536);
    must(client_new(&cli, srv, ep, "loader.0.0", err, sizeof err), err);
    exchange(srv, cli, "loader.0.0");
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

static void test_ctl_send_to_an_unknown_peer_is_ehostunreach(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *cli;
    char err[256] = "";
    must(server_new(&srv, f->ep, err, sizeof err), err);
    must(client_new(&cli, srv, f->ep, "stage.0.0", err, sizeof err), err);
    exchange(srv, cli, "stage.0.0");
    msg_t stop = {.type = MSG_STOP};
    assert_int_equal(ctl_send(srv, "stage.9.9", &stop), -EHOSTUNREACH);
    assert_int_equal(ctl_send(srv, "", &stop), -EHOSTUNREACH);
    /* a name without its suffix is not a route either */
    assert_int_equal(ctl_send(srv, "stage.0.0", &stop), -EHOSTUNREACH);
    /* the server still talks to the peer it knows */
    assert_int_equal(ctl_send(srv, ctl_route(cli), &stop), 0);
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
    char err[256] = "";
    ctl_peer_t from;
    must(server_new(&srv, f->ep, err, sizeof err), err);
    must(client_new(&cli, srv, f->ep, "stage.0.0", err, sizeof err), err);
    msg_t m;
    double t0 = util_now();
    assert_int_equal(ctl_recv(srv, 50, &from, &m, err, sizeof err), -EAGAIN);
    double dt = util_now() - t0;
    assert_true(dt >= 0.045 && dt < 1.0);
    assert_int_equal(ctl_recv(cli, 0, NULL, &m, err, sizeof err), -EAGAIN);
    assert_int_equal(ctl_recv(srv, 0, &from, &m, err, sizeof err), -EAGAIN);
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

/* A raw DEALER in its own context, to send what ctl_send never would: plain (key NULL: no
 * CURVE at all) or CURVE with key k against server key srv_pub; id NULL: no routing id. */
typedef struct {
    void *ctx, *sock;
} raw_t;

static raw_t raw_dealer(const char *ep, const char *id, const char *srv_pub, const keys_pair_t *k)
{
    raw_t r = {zmq_ctx_new(), NULL};
    r.sock = zmq_socket(r.ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(r.sock, ZMQ_LINGER, &zero, sizeof zero);
    if (id) zmq_setsockopt(r.sock, ZMQ_ROUTING_ID, id, strlen(id));
    if (k) {
        assert_int_equal(zmq_setsockopt(r.sock, ZMQ_CURVE_SERVERKEY, srv_pub, KEYS_Z85), 0);
        assert_int_equal(zmq_setsockopt(r.sock, ZMQ_CURVE_PUBLICKEY, k->pub, KEYS_Z85), 0);
        assert_int_equal(zmq_setsockopt(r.sock, ZMQ_CURVE_SECRETKEY, k->sec, KEYS_Z85), 0);
    }
    assert_int_equal(zmq_connect(r.sock, ep), 0);
    return r;
}

/* A raw CURVE DEALER whose fresh key srv admits as user. */
static raw_t raw_allowed(ctl_t *srv, const char *ep, const char *id, const char *user)
{
    keys_pair_t k;
    assert_int_equal(keys_pair_new(&k, NULL, 0), 0);
    assert_int_equal(ctl_allow(srv, k.pub, user), 0);
    return raw_dealer(ep, id, g_f->srv.pub, &k);
}

static void raw_close(raw_t *r)
{
    zmq_close(r->sock);
    zmq_ctx_term(r->ctx);
}

static void expect_badmsg(ctl_t *srv, const char *want_from, const char *want_err)
{
    char err[256] = "";
    ctl_peer_t from = {.route = "junk"};
    msg_t m;
    int rc = ctl_recv(srv, WAIT_MS, &from, &m, err, sizeof err);
    if (rc != -EBADMSG) fail_msg("expected -EBADMSG, got %d (%s)", rc, err);
    if (!strstr(err, want_err)) fail_msg("error \"%s\" lacks \"%s\"", err, want_err);
    assert_string_equal(from.route, want_from);
    assert_null(m.text);
}

static void test_ctl_garbage_from_a_raw_peer_is_ebadmsg_and_the_server_goes_on(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv;
    char err[256] = "";
    ctl_peer_t from;
    must(server_new(&srv, f->ep, err, sizeof err), err);
    raw_t r = raw_allowed(srv, f->ep, "rogue", "rogue-user");
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
    /* and the next good message is delivered, with the user its key was allowed as */
    assert_int_equal(zmq_send(r.sock, buf, len, 0), (int)len);
    msg_t m;
    recv_ok(srv, &from, &m);
    assert_string_equal(from.route, "rogue");
    assert_string_equal(from.user, "rogue-user");
    assert_int_equal(m.type, MSG_STOP);
    free(buf);

    /* a peer without a routing id gets one from the ROUTER that is not a name */
    raw_t anon = raw_allowed(srv, f->ep, NULL, "anon");
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
    char err[256] = "";
    ctl_peer_t from;
    must(server_new(&srv, f->ep, err, sizeof err), err);
    raw_t r = raw_allowed(srv, f->ep, "hog", "hog");
    size_t big = MSG_MAX_BYTES + 1;
    char *p = calloc(1, big);
    assert_int_equal(zmq_send(r.sock, p, big, 0), (int)big);
    free(p);
    msg_t m;
    assert_int_equal(ctl_recv(srv, 200, &from, &m, err, sizeof err), -EAGAIN);
    must(client_new(&cli, srv, f->ep, "stage.0.0", err, sizeof err), err);
    exchange(srv, cli, "stage.0.0");
    ctl_destroy(&cli);
    raw_close(&r);
    ctl_destroy(&srv);
}

static void test_ctl_client_rejects_garbage_from_the_server(void **state)
{
    fixture_t *f = *state;
    void *ctx = zmq_ctx_new(), *router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0, one = 1;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(router, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, f->srv.sec, KEYS_Z85);
    assert_int_equal(zmq_bind(router, f->ep), 0);
    ctl_t *cli;
    char err[256] = "";
    must(client_new(&cli, NULL, f->ep, "stage.2.0", err, sizeof err), err);
    msg_t h = hello("stage", 2, 7), m;
    assert_int_equal(ctl_send(cli, NULL, &h), 0);
    char id[CTL_ROUTE_MAX], payload[256];
    int n = zmq_recv(router, id, sizeof id, 0);
    assert_int_equal(n, 9 + 1 + CTL_NONCE);
    assert_memory_equal(id, "stage.2.0#", 10);
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
static int child_main(const char *ep, const char *srv_pub, const keys_pair_t *k)
{
    ctl_t *cli;
    char err[256];
    if (ctl_client_new(&cli, ep, "optshard.0.1", srv_pub, k, err, sizeof err)) return 10;
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
    char err[256] = "";
    ctl_peer_t from;
    must(server_new(&srv, f->ep, err, sizeof err), err); /* the parent's context exists */
    keys_pair_t k;
    assert_int_equal(keys_pair_new(&k, err, sizeof err), 0);
    assert_int_equal(ctl_allow(srv, k.pub, "optshard.0.1"), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(child_main(f->ep, f->srv.pub, &k));
    msg_t m;
    recv_ok(srv, &from, &m);
    assert_string_equal(from.user, "optshard.0.1");
    assert_int_equal(m.type, MSG_HELLO);
    assert_int_equal(m.pid, pid);
    assert_int_equal(m.replica, 1);
    msg_t up = {.type = MSG_UPDATE, .step = 5, .grad_norm = 3.0, .scale = 0.5};
    assert_int_equal(ctl_send(srv, from.route, &up), 0);
    recv_ok(srv, &from, &m);
    assert_int_equal(m.type, MSG_UPDATED);
    assert_int_equal(m.step, 5);
    assert_true(m.lr == 1.5 && m.t_busy == 0.25);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    ctl_destroy(&srv);
}

/* A restarted loader connects with a new key while the old socket is still open: the server
 * reaches the new one at its own route, and the old one gets nothing (issue 12: routes are
 * never handed over, so a restart needs none). */
static void test_ctl_a_restarted_client_is_reached_at_its_new_route(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *old, *new;
    char err[256] = "";
    ctl_peer_t from;
    must(server_new(&srv, f->ep, err, sizeof err), err);
    must(client_new(&old, srv, f->ep, "loader.0.0", err, sizeof err), err);
    msg_t h = hello("loader", 0, 100), m;
    assert_int_equal(ctl_send(old, NULL, &h), 0);
    recv_ok(srv, &from, &m);
    assert_int_equal(m.pid, 100);
    must(client_new(&new, srv, f->ep, "loader.0.0", err, sizeof err), err);
    h.pid = 200;
    assert_int_equal(ctl_send(new, NULL, &h), 0);
    recv_ok(srv, &from, &m);
    assert_string_equal(from.user, "loader.0.0");
    assert_string_equal(from.route, ctl_route(new));
    assert_string_not_equal(from.route, ctl_route(old));
    assert_int_equal(m.pid, 200);
    msg_t st = {.type = MSG_STEP, .step = 3};
    assert_int_equal(ctl_send(srv, from.route, &st), 0);
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
    must(server_new(&srv, f->ep, err, sizeof err), err);
    must(client_new(&cli, srv, f->ep, "stage.0.0", err, sizeof err), err);
    exchange(srv, cli, "stage.0.0");
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

static void test_ctl_refuses_an_ipc_path_a_live_server_or_a_file_holds(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *second = NULL;
    char err[256] = "";
    must(server_new(&srv, f->ep, err, sizeof err), err);
    assert_int_equal(server_new(&second, f->ep, err, sizeof err), -EADDRINUSE);
    assert_null(second);
    assert_true(strstr(err, "cannot bind ipc://") && strstr(err, "already listening"));
    ctl_destroy(&srv);

    char ep[160], path[140];
    snprintf(path, sizeof path, "%s/notes.txt", f->dir);
    snprintf(ep, sizeof ep, "ipc://%s", path);
    FILE *fp = fopen(path, "w");
    fputs("keep me", fp);
    fclose(fp);
    assert_int_equal(server_new(&srv, ep, err, sizeof err), -EEXIST);
    assert_non_null(strstr(err, "is not a socket"));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 7);
}

static void test_ctl_bad_endpoints_and_ids_are_reported(void **state)
{
    fixture_t *f = *state;
    ctl_t *c = (ctl_t *)1;
    char err[256] = "";
    keys_pair_t k;
    assert_int_equal(keys_pair_new(&k, err, sizeof err), 0);
    assert_int_not_equal(server_new(&c, "bogus://nowhere", err, sizeof err), 0);
    assert_null(c);
    assert_non_null(strstr(err, "cannot bind bogus://nowhere: "));
    assert_int_not_equal(server_new(&c, "tcp://127.0.0.1:notaport", err, sizeof err), 0);
    assert_non_null(strstr(err, "cannot bind tcp://127.0.0.1:notaport"));
    assert_int_not_equal(ctl_client_new(&c, "bogus://x", "a", f->srv.pub, &k, err, sizeof err), 0);
    assert_non_null(strstr(err, "cannot connect bogus://x"));
    char id[CTL_ID_MAX + 1];
    memset(id, 'i', CTL_ID_MAX);
    id[CTL_ID_MAX] = '\0';
    assert_int_equal(ctl_client_new(&c, "tcp://127.0.0.1:1", id, f->srv.pub, &k, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "routing id"));
    assert_int_equal(ctl_client_new(&c, "tcp://127.0.0.1:1", "", f->srv.pub, &k, err, sizeof err), -EINVAL);
    id[CTL_ID_MAX - 1] = '\0'; /* the longest id is fine */
    must(ctl_client_new(&c, "tcp://127.0.0.1:1", id, f->srv.pub, &k, err, sizeof err), err);
    assert_route_of(ctl_route(c), id);
    ctl_destroy(&c);
    /* keys: a server needs its secret key, a client a server key and its own pair */
    assert_int_equal(ctl_server_new(&c, "not a key", err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "not a CURVE key"));
    assert_int_equal(ctl_client_new(&c, f->ep, "a", "short", &k, err, sizeof err), -EINVAL);
    assert_int_equal(ctl_client_new(&c, f->ep, "a", f->srv.pub, NULL, err, sizeof err), -EINVAL);
    must(server_new(&c, f->ep, err, sizeof err), err);
    assert_int_equal(ctl_allow(c, "short", "user"), -EINVAL);
    assert_int_equal(ctl_allow(c, k.pub, ""), -EINVAL);
    ctl_destroy(&c);
}

typedef struct {
    const char *ep;
    const keys_pair_t *k;
    int sent;
    int rc;
} hb_arg_t;

/* A worker's heartbeat thread: its own ctl_t with the worker's key, the same process context. */
static void *heartbeat_thread(void *p)
{
    hb_arg_t *a = p;
    ctl_t *c;
    char err[256];
    a->rc = ctl_client_new(&c, a->ep, "stage.0.0/hb", g_f->srv.pub, a->k, err, sizeof err);
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
    char err[256] = "";
    ctl_peer_t from;
    must(server_new(&srv, f->ep, err, sizeof err), err);
    keys_pair_t k;
    assert_int_equal(keys_pair_new(&k, err, sizeof err), 0);
    assert_int_equal(ctl_allow(srv, k.pub, "stage.0.0"), 0);
    must(ctl_client_new(&cli, f->ep, "stage.0.0", f->srv.pub, &k, err, sizeof err), err);
    hb_arg_t a = {.ep = f->ep, .k = &k};
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
        recv_ok(srv, &from, &m);
        assert_string_equal(from.user, "stage.0.0"); /* one key, two connections */
        if (m.type == MSG_HEARTBEAT) {
            assert_route_of(from.route, "stage.0.0/hb");
            assert_true(m.progress == next_beat++); /* in order per peer */
            beats++;
        } else {
            assert_string_equal(from.route, ctl_route(cli));
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

/* ---- issue 12: who may connect, and who a message is from ---- */

/* Nothing from a peer without an allowed key reaches the server: not a plain (NULL mechanism)
 * DEALER, not CURVE with a key nobody allowed, not CURVE against another server key. Each is
 * refused at the handshake and counted; an allowed client goes on as before. */
static void test_ctl_peers_without_an_allowed_key_are_refused_at_the_handshake(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *cli;
    char err[256] = "";
    ctl_peer_t from;
    must(server_new(&srv, f->ep, err, sizeof err), err);
    keys_pair_t stranger, other_srv;
    assert_int_equal(keys_pair_new(&stranger, err, sizeof err), 0);
    assert_int_equal(keys_pair_new(&other_srv, err, sizeof err), 0);
    raw_t plain = raw_dealer(f->ep, "stage.0.0", NULL, NULL);
    raw_t unknown = raw_dealer(f->ep, "stage.0.0", f->srv.pub, &stranger);
    raw_t wrong_srv = raw_dealer(f->ep, "stage.0.0", other_srv.pub, &stranger);
    uint8_t *buf;
    size_t len;
    msg_t done = {.type = MSG_STEP_DONE, .step = 1, .loss = 9.0};
    assert_int_equal(msg_encode(&done, &buf, &len), 0);
    for (int i = 0; i < 3; i++) {
        zmq_send(plain.sock, buf, len, ZMQ_DONTWAIT);
        zmq_send(unknown.sock, buf, len, ZMQ_DONTWAIT);
        zmq_send(wrong_srv.sock, buf, len, ZMQ_DONTWAIT);
    }
    msg_t m;
    assert_int_equal(ctl_recv(srv, 500, &from, &m, err, sizeof err), -EAGAIN);
    uint64_t keys = 0, handshakes = 0;
    for (int i = 0; i < 200 && (keys < 1 || handshakes < 2); i++) {
        ctl_refusals(srv, &keys, &handshakes);
        usleep(10000);
    }
    assert_true(keys >= 1);       /* the unknown key, at ZAP */
    assert_true(handshakes >= 2); /* no CURVE; a CURVE hello this server cannot open */
    must(client_new(&cli, srv, f->ep, "stage.0.0", err, sizeof err), err);
    exchange(srv, cli, "stage.0.0");
    free(buf);
    raw_close(&plain);
    raw_close(&unknown);
    raw_close(&wrong_srv);
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

/* Two allowed peers both calling themselves stage.0.0: the server tells them apart by key
 * (user), whatever their routing ids say. */
static void test_ctl_the_key_not_the_routing_id_names_the_sender(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *real;
    char err[256] = "";
    ctl_peer_t from;
    must(server_new(&srv, f->ep, err, sizeof err), err);
    must(client_new(&real, srv, f->ep, "stage.0.0", err, sizeof err), err);
    raw_t liar = raw_allowed(srv, f->ep, "stage.0.0/hb", "operator");
    exchange(srv, real, "stage.0.0");
    uint8_t *buf;
    size_t len;
    msg_t h = hello("stage", 0, 1);
    assert_int_equal(msg_encode(&h, &buf, &len), 0);
    assert_int_equal(zmq_send(liar.sock, buf, len, 0), (int)len);
    msg_t m;
    recv_ok(srv, &from, &m);
    assert_string_equal(from.route, "stage.0.0/hb");
    assert_string_equal(from.user, "operator");
    free(buf);
    raw_close(&liar);
    ctl_destroy(&real);
    ctl_destroy(&srv);
}

/* A peer that claims the exact route of a connected client (suffix and all) does not take it
 * over: messages to that route still reach the client, and the claimant gets nothing. */
static void test_ctl_a_route_cannot_be_taken_over(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *real;
    char err[256] = "";
    must(server_new(&srv, f->ep, err, sizeof err), err);
    must(client_new(&real, srv, f->ep, "stage.0.0", err, sizeof err), err);
    exchange(srv, real, "stage.0.0");
    raw_t thief = raw_allowed(srv, f->ep, ctl_route(real), "thief");
    uint8_t *buf;
    size_t len;
    msg_t h = hello("stage", 0, 1);
    assert_int_equal(msg_encode(&h, &buf, &len), 0);
    assert_int_equal(zmq_send(thief.sock, buf, len, 0), (int)len); /* connected and heard from, or refused */
    free(buf);
    usleep(200000);
    msg_t stop = {.type = MSG_STOP}, m;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ctl_send(srv, ctl_route(real), &stop), 0);
        recv_ok(real, NULL, &m);
        assert_int_equal(m.type, MSG_STOP);
    }
    char got[64];
    assert_int_equal(zmq_recv(thief.sock, got, sizeof got, ZMQ_DONTWAIT), -1);
    raw_close(&thief);
    ctl_destroy(&real);
    ctl_destroy(&srv);
}

/* A revoked key (a process that ended) cannot connect again; another key goes on. */
static void test_ctl_a_revoked_key_cannot_connect_again(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *cli;
    char err[256] = "";
    ctl_peer_t from;
    must(server_new(&srv, f->ep, err, sizeof err), err);
    keys_pair_t k;
    assert_int_equal(keys_pair_new(&k, err, sizeof err), 0);
    assert_int_equal(ctl_allow(srv, k.pub, "loader.0.0@1"), 0);
    must(ctl_client_new(&cli, f->ep, "loader.0.0", f->srv.pub, &k, err, sizeof err), err);
    msg_t h = hello("loader", 0, 1), m;
    assert_int_equal(ctl_send(cli, NULL, &h), 0);
    recv_ok(srv, &from, &m);
    assert_string_equal(from.user, "loader.0.0@1");
    ctl_destroy(&cli);
    ctl_revoke(srv, k.pub);
    must(ctl_client_new(&cli, f->ep, "loader.0.0", f->srv.pub, &k, err, sizeof err), err);
    assert_int_equal(ctl_send(cli, NULL, &h), 0);
    assert_int_equal(ctl_recv(srv, 500, &from, &m, err, sizeof err), -EAGAIN);
    uint64_t keys = 0, handshakes = 0;
    ctl_refusals(srv, &keys, &handshakes);
    assert_true(keys >= 1);
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

/* Why the coordinator allows every key before it binds, and a worker's key before it starts
 * the worker: ZeroMQ (4.3) does not retry a client refused at its handshake, even once its key
 * is allowed; a new connection is needed. */
static void test_ctl_a_refused_client_stays_refused_after_its_key_is_allowed(void **state)
{
    fixture_t *f = *state;
    ctl_t *srv, *cli;
    char err[256] = "";
    ctl_peer_t from;
    must(server_new(&srv, f->ep, err, sizeof err), err);
    keys_pair_t k;
    assert_int_equal(keys_pair_new(&k, err, sizeof err), 0);
    must(ctl_client_new(&cli, f->ep, "early", f->srv.pub, &k, err, sizeof err), err);
    msg_t h = hello("stage", 0, 1), m;
    assert_int_equal(ctl_send(cli, NULL, &h), 0);
    uint64_t keys = 0, handshakes = 0;
    for (int i = 0; i < 200 && keys < 1; i++) {
        ctl_refusals(srv, &keys, &handshakes);
        usleep(10000);
    }
    assert_true(keys >= 1);
    assert_int_equal(ctl_allow(srv, k.pub, "early"), 0);
    assert_int_equal(ctl_recv(srv, 500, &from, &m, err, sizeof err), -EAGAIN);
    ctl_destroy(&cli);
    must(ctl_client_new(&cli, f->ep, "early", f->srv.pub, &k, err, sizeof err), err);
    assert_int_equal(ctl_send(cli, NULL, &h), 0);
    recv_ok(srv, &from, &m);
    assert_string_equal(from.user, "early");
    ctl_destroy(&cli);
    ctl_destroy(&srv);
}

static int setup_test(void **state)
{
    int rc = setup(state);
    g_f = *state;
    return rc;
}

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup_test, teardown)
    const struct CMUnitTest tests[] = {
        T(test_ctl_ipc_messages_flow_both_ways_with_the_routing_id),
        T(test_ctl_tcp_on_an_ephemeral_port),
        T(test_ctl_send_to_an_unknown_peer_is_ehostunreach),
        T(test_ctl_recv_times_out_with_eagain),
        T(test_ctl_garbage_from_a_raw_peer_is_ebadmsg_and_the_server_goes_on),
        T(test_ctl_an_oversized_frame_drops_that_peer_not_the_server),
        T(test_ctl_client_rejects_garbage_from_the_server),
        T(test_ctl_client_in_a_forked_child_talks_to_the_parent),
        T(test_ctl_a_restarted_client_is_reached_at_its_new_route),
        T(test_ctl_replaces_a_stale_ipc_socket_file),
        T(test_ctl_refuses_an_ipc_path_a_live_server_or_a_file_holds),
        T(test_ctl_bad_endpoints_and_ids_are_reported),
        T(test_ctl_two_threads_each_with_a_socket_share_the_process),
        T(test_ctl_peers_without_an_allowed_key_are_refused_at_the_handshake),
        T(test_ctl_the_key_not_the_routing_id_names_the_sender),
        T(test_ctl_a_route_cannot_be_taken_over),
        T(test_ctl_a_revoked_key_cannot_connect_again),
        T(test_ctl_a_refused_client_stays_refused_after_its_key_is_allowed),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
