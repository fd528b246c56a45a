/* The control plane's sockets: the coordinator binds a ZeroMQ ROUTER, every worker connects a
 * DEALER whose routing id names it ("stage.1.0" = role.rank.replica). Endpoints are ipc://
 * on one host and tcp:// across hosts. Messages are msg_t (ipc/msg.h), one frame each
 * (plus the routing-id frame on the ROUTER side). Functions return 0 or -errno and never
 * exit; a bad incoming message is reported (-EBADMSG with err) and dropped, never fatal. */
#ifndef CTITAN_CTL_H
#define CTITAN_CTL_H

#include <stddef.h>

#include "ipc/msg.h"

#define CTL_ID_MAX 64

typedef struct ctl ctl_t;

/* ROUTER bound to endpoint (for ipc://PATH a stale socket file is replaced). Routing to an
 * unknown peer is an error (-EHOSTUNREACH), and a peer reconnecting with the same id takes
 * over (a restarted loader keeps its name). */
int ctl_server_new(ctl_t **out, const char *endpoint, char *err, size_t errlen);
/* DEALER with routing id `id`, connected to endpoint. Unsent messages are dropped at close
 * after a short linger, so a dead coordinator never blocks a worker's exit. */
int ctl_client_new(ctl_t **out, const char *endpoint, const char *id, char *err, size_t errlen);
void ctl_destroy(ctl_t **c);

/* Sends m; on a server, to peer `to` (a routing id); clients pass NULL. */
int ctl_send(ctl_t *c, const char *to, const msg_t *m);
/* Waits up to timeout_ms (-1 = forever, 0 = poll) for one message. On a server, the
 * sender's routing id is copied into from (CTL_ID_MAX bytes). Returns 0, -EAGAIN on timeout,
 * -EBADMSG (err says why, the message is consumed), -EINTR. */
int ctl_recv(ctl_t *c, int timeout_ms, char *from, msg_t *m, char *err, size_t errlen);

/* The ZeroMQ socket, for zmq_poll alongside other descriptors. */
void *ctl_socket(ctl_t *c);
/* The endpoint as bound or connected; for a server bound to "tcp://HOST:*" it names the port
 * the system chose (ZMQ_LAST_ENDPOINT), the address to hand to workers. Owned by c. */
const char *ctl_endpoint(ctl_t *c);

#endif
