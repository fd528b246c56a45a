/* The control plane's sockets: the coordinator binds a ZeroMQ ROUTER, every worker connects a
 * DEALER. Endpoints are ipc:// on one host and tcp:// across hosts, and every one of them is
 * authenticated and encrypted with CURVE: a client must know the server's public key, and the
 * server admits only the client keys it was given (ctl_allow), each bound to an identity, the
 * "user", by the server's ZAP handler (a thread of its own, RFC 27). ZeroMQ attaches that user
 * to every message of the connection, and ctl_recv hands it over: the key, not the routing id,
 * says who sent a message.
 *
 * Routing ids only route replies: a client's is its name plus a random suffix
 * ("stage.1.0#Xy3...", fresh at every connect), and a ROUTER never hands a routing id in use
 * to a new connection, so no peer can take over another's route, whatever id it claims.
 * Messages are msg_t (ipc/msg.h), one frame each (plus the routing-id frame on the ROUTER
 * side). Functions return 0 or -errno and never exit; a bad incoming message is reported
 * (-EBADMSG with err) and dropped, never fatal. Refused connections are counted and logged
 * at a bounded rate (ipc/log.h). */
#ifndef CTITAN_CTL_H
#define CTITAN_CTL_H

#include <stddef.h>
#include <stdint.h>

#include "ipc/keys.h"
#include "ipc/msg.h"

#define CTL_ID_MAX 64                /* a client's name, its NUL included */
#define CTL_ROUTE_MAX (CTL_ID_MAX + 16) /* a routing id: the name, '#', CTL_NONCE characters */
#define CTL_NONCE 12
#define CTL_USER_MAX 64              /* an identity ctl_allow binds to a key */

typedef struct ctl ctl_t;

/* Who sent a message (server side): its route (the routing id, to answer on that
 * connection) and its user (the identity its key was allowed with). */
typedef struct {
    char route[CTL_ROUTE_MAX];
    char user[CTL_USER_MAX];
} ctl_peer_t;

/* ROUTER with secret key server_sec (Z85), admitting no client until ctl_allow; the server
 * has a ZeroMQ context and a ZAP thread of its own. It is bound by ctl_bind, once the keys it
 * must admit are allowed: ZeroMQ never retries a client refused at its handshake. Routing to
 * an unknown peer is an error (-EHOSTUNREACH). */
int ctl_server_new(ctl_t **out, const char *server_sec, char *err, size_t errlen);
/* Binds the server to endpoint (for ipc://PATH a stale socket file is replaced). */
int ctl_bind(ctl_t *c, const char *endpoint, char *err, size_t errlen);
/* Admits connections with client key pub (Z85) from now on; their messages carry user. A key
 * allowed again gets the new user. Returns 0, -EINVAL (not a key, user empty or too long),
 * -ENOMEM. */
int ctl_allow(ctl_t *c, const char *pub, const char *user);
/* Refuses new connections with key pub (existing ones stay: a revoked key's process is gone). */
void ctl_revoke(ctl_t *c, const char *pub);
/* Connections refused so far: keys not allowed (ZAP), handshakes that failed otherwise (not
 * CURVE, a wrong server key, garbage). */
void ctl_refusals(ctl_t *c, uint64_t *keys, uint64_t *handshakes);

/* DEALER named `id`, connected to endpoint with our key pair `me`, trusting only the server
 * whose public key is server_pub. Unsent messages are dropped at close after a short linger,
 * so a dead coordinator never blocks a worker's exit. */
int ctl_client_new(ctl_t **out, const char *endpoint, const char *id, const char *server_pub, const keys_pair_t *me,
                   char *err, size_t errlen);
void ctl_destroy(ctl_t **c);
/* How long ctl_destroy lets unsent messages go out (ZMQ_LINGER; a server's is 0): a last word
 * that must arrive (the coordinator's STOP to the other hosts). Returns 0 or -errno. */
int ctl_linger(ctl_t *c, int ms);

/* Sends m; on a server, to route `to` (a ctl_peer_t's route); clients pass NULL. */
int ctl_send(ctl_t *c, const char *to, const msg_t *m);
/* Waits up to timeout_ms (-1 = forever, 0 = poll) for one message. On a server, the sender is
 * copied into from (also for -EBADMSG, so a bad message can be blamed on its sender). Returns
 * 0, -EAGAIN on timeout, -EBADMSG (err says why, the message is consumed), -EINTR. */
int ctl_recv(ctl_t *c, int timeout_ms, ctl_peer_t *from, msg_t *m, char *err, size_t errlen);

/* The ZeroMQ socket, for zmq_poll alongside other descriptors. */
void *ctl_socket(ctl_t *c);
/* The endpoint as bound or connected; for a server bound to "tcp://HOST:*" it names the port
 * the system chose (ZMQ_LAST_ENDPOINT), the address to hand to workers. Owned by c. */
const char *ctl_endpoint(ctl_t *c);
/* A client's routing id (its name and suffix). Owned by c. */
const char *ctl_route(ctl_t *c);

#endif
