/* Remote checkpoints: trainers stream checkpoints over ZeroMQ TCP to a checkpointd on a
 * storage host (`checkpointd --listen tcp://ADDR:PORT --dir DIR --key SERVER.key --allow
 * TRAINERS.pub`), and fetch one back from it to resume from. The connection is ZeroMQ
 * CURVE: the trainer knows the server's public key, and the server accepts only trainers
 * whose public key is in its allow file (checked by a ZAP handler); everything else is
 * refused at the handshake.
 *
 * The server writes DIR/<job>/step-N through checkpointd/writer.h, so a remote checkpoint is
 * as atomic as a local one. It never writes outside DIR whatever a client sends: the job
 * name and every file name must pass ckpt_safe_name, tensor names are only data inside the
 * index, offsets and sizes are checked against the plan.
 *
 * Key files hold Z85 text (40 characters), one key per line, '#' comments allowed (on their
 * own line or after a key): a secret key file (mode 0600) holds one secret key; an allow
 * file holds public keys: the key files of ipc/keys.h, which every CURVE endpoint shares
 * (keys_gen writes them, `ctitan ckpt keygen`).
 * Functions return 0 or -errno and say why in err; nothing here exits. */
#ifndef CTITAN_REMOTE_H
#define CTITAN_REMOTE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "checkpointd/ckpt.h"
#include "ipc/keys.h"

#define RMT_FRAME_MAX (64u << 20)      /* largest frame a server accepts (an index, a data piece) */
#define RMT_DATA_FRAME (4u << 20)      /* the client sends data in pieces of at most this */
#define RMT_IDLE_TIMEOUT_MS 60000      /* a client silent this long mid-checkpoint is aborted */

/* Serves until *stop becomes non-zero (checked at least every 200 ms): binds `listen`
 * (tcp://ADDR:PORT; a port of * picks a free one), prints "listening on ENDPOINT" with the
 * real endpoint as the first line on `log`, then one line per checkpoint received or
 * refused, and per refused connection (address and key; a client that keeps retrying is
 * summed up, not repeated). Creates DIR if needed. The secret key file must not be readable
 * by others (-EPERM, like ssh). Returns 0 after a stop, -errno when it cannot start (bad key
 * or allow file, cannot bind); bad input from clients never ends it. */
int rmt_serve(const char *listen, const char *dir, const char *secret_key_path, const char *allow_path,
              volatile sig_atomic_t *stop, FILE *log, char *err, size_t errlen);
/* rmt_serve with another idle timeout than RMT_IDLE_TIMEOUT_MS (tests, a --idle option). */
int rmt_serve_idle(const char *listen, const char *dir, const char *secret_key_path, const char *allow_path,
                   int idle_ms, volatile sig_atomic_t *stop, FILE *log, char *err, size_t errlen);

typedef struct rmt_client rmt_client_t;

/* Connects (CURVE, client key pair from the secret key file, server public key file). Returns
 * at once: ZeroMQ connects in the background, and rmt_client_begin tells what happened. */
int rmt_client_new(rmt_client_t **out, const char *endpoint, const char *server_pub_path,
                   const char *client_secret_path, char *err, size_t errlen);
/* An unfinished checkpoint is aborted on the server; waits at most 1 s for that to go out. */
void rmt_client_destroy(rmt_client_t **c);
/* Starts checkpoint plan->step of `job` on the server (keep: its keep_latest_k, 0 = all).
 * Waits up to timeout_ms for the server to accept. -EACCES: the server refused our key (the
 * message names our public key to add to its allow file); -EPROTO: the CURVE handshake
 * failed otherwise (a wrong server public key); -ETIMEDOUT: no answer (err says whether
 * nothing was listening, the handshake never finished, or the server went quiet); -EINVAL
 * (or the server's -EBUSY, -ENOSPC...): it refused the plan. An unfinished earlier checkpoint
 * of this client is aborted first. Any error ends the checkpoint: begin again to retry. */
int rmt_client_begin(rmt_client_t *c, const char *job, int keep, const ckpt_index_t *plan, int timeout_ms,
                     char *err, size_t errlen);
/* rmt_client_begin that may replace (replace != 0) a step the server holds and that verifies;
 * without it the server refuses such a step with -EEXIST (a stored step is never written over
 * by another run's upload). A trainer replaces a step only when it saves it again. */
int rmt_client_begin_replace(rmt_client_t *c, const char *job, int keep, int replace, const ckpt_index_t *plan,
                             int timeout_ms, char *err, size_t errlen);
#define RMT_LIST_MAX 32 /* steps a list answer names (the newest) */

/* The complete checkpoints the server holds of `job` (step-N directories with an index): how
 * many in *n, the newest (up to RMT_LIST_MAX, newest first) in steps. What a trainer asks
 * before it starts, so that it never writes over a step the server holds. */
int rmt_client_list(rmt_client_t *c, const char *job, int64_t steps[RMT_LIST_MAX], int *n, int timeout_ms,
                    char *err, size_t errlen);
/* Where a fetch's bytes go: the index, whole, decoded and checked (its checksum, plain file
 * names, the step asked for; bytes: as it came), then each data file K of it in order, its
 * bytes from offset 0 to its size, then file_done (may be NULL). Each returns 0 or -errno with
 * why in err, which ends the fetch with that error. */
typedef struct {
    int (*index)(void *arg, const ckpt_index_t *ix, const void *bytes, size_t n, char *err, size_t errlen);
    int (*data)(void *arg, uint32_t k, uint64_t offset, const void *p, size_t n, char *err, size_t errlen);
    int (*file_done)(void *arg, uint32_t k, char *err, size_t errlen);
    void *arg;
} rmt_sink_t;

/* Fetches checkpoint `step` of `job` from the server into the sink. What comes is checked for
 * shape (files in order and whole, their sizes the index's, the index's own checks); the
 * chunks' checksums are the sink's to check (checkpointd's load checks them as it copies them
 * into the staging segment). path gets the server-side directory. idle_ms bounds each wait
 * for the server, not the whole fetch. -ENOENT: the server holds no such step; -EBADMSG: its
 * copy is damaged (a file missing or cut short there) or what came does not fit its index;
 * -EACCES, -EPROTO, -ETIMEDOUT as rmt_client_begin's; the sink's own errors. */
int rmt_client_fetch(rmt_client_t *c, const char *job, int64_t step, const rmt_sink_t *sink, char *path,
                     size_t pathlen, int idle_ms, char *err, size_t errlen);
/* rmt_client_fetch into dir, an empty directory the caller made: the index and every data file
 * as the server holds them, with their names (a local write's -errno too). After an error dir
 * may hold some of the files: the caller removes it. */
int rmt_client_fetch_dir(rmt_client_t *c, const char *job, int64_t step, const char *dir, char *path,
                         size_t pathlen, int idle_ms, char *err, size_t errlen);
/* Sends the next bytes of a data file (same order rules as ckw_write), in pieces of at most
 * RMT_DATA_FRAME. Returns when they are queued (blocks while the link is full, up to 60 s:
 * -ETIMEDOUT). Data are not acknowledged one by one: an error the server found in earlier
 * data is returned by the next write or by the commit. */
int rmt_client_write(rmt_client_t *c, uint32_t file, uint64_t offset, const void *data, size_t n, char *err,
                     size_t errlen);
/* Asks the server to commit and waits for it (timeout_ms; it includes the server's fsyncs);
 * path gets the server-side path. The server's error (-EINVAL for bad data, or its -errno,
 * e.g. -ENOSPC) comes with its reason in err. */
int rmt_client_commit(rmt_client_t *c, char *path, size_t pathlen, int timeout_ms, char *err, size_t errlen);

#endif
