/* What every worker process (stage, optshard, loader, checkpointd) does with the coordinator:
 * take its keys from the descriptor CTITAN_KEYS_FD names (never from a command line), connect a
 * CURVE DEALER named role.rank.replica to CTITAN_ENDPOINT, say hello, receive the resolved
 * manifest and the first step, say ready, take commands, and send heartbeats from a thread
 * of its own every job.heartbeat_interval_ms (with a progress counter the main thread bumps),
 * so a stopped or wedged process is noticed even while its main thread is busy. The
 * coordinator answers each heartbeat; a worker whose coordinator stops answering for
 * job.heartbeat_timeout_ms exits (status 1) instead of waiting on its rings forever. */
#ifndef CTITAN_WORKER_H
#define CTITAN_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "ipc/keys.h"
#include "ipc/msg.h"
#include "stages/job/manifest.h"

/* Environment a worker is started with (the coordinator sets them). */
#define WORKER_ENV_ENDPOINT "CTITAN_ENDPOINT"
#define WORKER_ENV_JOB "CTITAN_JOB"
#define WORKER_ENV_HOST "CTITAN_HOST" /* job.host_rank of the host the worker runs on */
#define WORKER_ENV_KEYS "CTITAN_KEYS_FD" /* the descriptor that holds its keys (worker_keys_pipe) */

/* What a worker needs to join the control plane: the coordinator's public key, which it trusts,
 * and its own key pair, which the coordinator's ZAP handler binds to its role, rank and replica
 * (on another host: the host's key pair, from the operator's key files). */
typedef struct {
    char server[KEYS_Z85 + 1];
    keys_pair_t me;
} worker_keys_t;

/* For the spawner: a pipe holding k, its write end already closed. Returns the read end
 * (close-on-exec: the child clears the flag and names it in CTITAN_KEYS_FD) or -errno. */
int worker_keys_pipe(const worker_keys_t *k);
/* The keys the spawner handed over (worker_open takes them): read once from the descriptor
 * CTITAN_KEYS_FD names, which is closed and unset, so what this process starts inherits none. */
int worker_keys_take(worker_keys_t *k, const char *who, char *err, size_t errlen);

typedef struct worker worker_t;

/* Connects, says hello and waits up to 60 s for the config. Returns 0 or -errno with err. */
int worker_open(worker_t **out, const char *role, int rank, int replica, char *err, size_t errlen);
/* Stops the heartbeat thread and closes the sockets. */
void worker_close(worker_t **w);

const manifest_t *worker_manifest(const worker_t *w);
const char *worker_job(const worker_t *w);
/* The step the config named: the first this worker takes part in (steps done before it). */
int64_t worker_first_step(const worker_t *w);

int worker_send(worker_t *w, const msg_t *m);
/* Next command (fields role/rank/replica are filled in for the caller's convenience).
 * Malformed messages are logged and skipped. Returns 0, -EAGAIN on timeout, or -errno. */
int worker_recv(worker_t *w, int timeout_ms, msg_t *m);
/* Blocks until the next command (a process main's loop); dies if the control socket breaks. */
void worker_command(worker_t *w, msg_t *m);
/* Tells the coordinator this worker is set up. */
int worker_ready(worker_t *w);
/* Bumps the progress counter the heartbeats carry. */
void worker_progress(worker_t *w);
/* The main thread waits on a peer (on) or works (off): while it waits the heartbeats count as
 * progress, so the coordinator's step watchdog blames the peer that wedged, not the ones that
 * wait on it. A SIGABRT dumps the main thread's stack to standard error (worker_open installs
 * the handler). */
void worker_waiting(worker_t *w, int on);
/* Reports an error to the coordinator (role, rank, replica, reason). */
void worker_report(worker_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Test hook (NOTES.md "Test hooks"): a worker dies by SIGKILL at a named point of a step
 * (1-based in the variable) when CTITAN_TEST_DIE_AT lists "<role>.<rank>.<replica>:<point>:<step>"
 * (comma-separated), or its main thread hangs there (its heartbeats go on) when
 * CTITAN_TEST_HANG_AT does; with CTITAN_TEST_DIE_ONCE naming a folder, only the first process
 * to reach the point is hit (a file per point there), so its replacement goes on. */
void worker_test_point(worker_t *w, const char *point, int64_t step);
/* Test hook: 1 when CTITAN_TEST_MUTE_AT lists this point (as above): the caller leaves the
 * message it was about to send unsent, as if the coordinator had not read it before seeing the
 * worker die (a window no kill can open on purpose). */
int worker_test_mute(worker_t *w, const char *point, int64_t step);

/* For process mains: report, log and exit(1). w may be NULL (before the connection). */
_Noreturn void worker_die(worker_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Check macro for worker mains: on failure, dies with file:line, the call and the reason. */
#define WORKER_CHECK(w, cond, ...) \
    do { if (!(cond)) worker_die((w), __FILE__ ":" WORKER_STR(__LINE__) ": " __VA_ARGS__); } while (0)
#define WORKER_STR(x) WORKER_STR2(x)
#define WORKER_STR2(x) #x

#endif
