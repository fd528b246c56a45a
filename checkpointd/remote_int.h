/* Inside the remote module (remote.h's rmt_*): what its server (remote_server.c), client
 * (remote_client.c, a fetch's receiving end remote_fetch.c) and key files (remote_keys.c)
 * share, and what test_remote and the fuzz harnesses reach: the header frames of the wire
 * protocol (remote_wire.c), multipart frames, a fetch's parts, key loading.
 *
 * Wire protocol, version RMT_VERSION (2). Every message is multipart:
 *   frame 1  a flat msgpack map {"v": 2, "type": T, "seq": S, <fields of T>} of at most
 *            RMT_HDR_MAX bytes (ipc/codec.h); values are integers, strings or booleans; keys a
 *            type does not use are ignored, every key it uses is type-checked
 *   frame 2  the payload, for the types that have one (at most RMT_FRAME_MAX bytes)
 * client -> server (seq numbers the client's messages 1, 2, 3, ...):
 *   "begin"   job (str), keep (int >= 0), step (int >= 0); payload: the index as
 *             ckpt_index_encode writes it, whose step must be `step`. Always answered.
 *   "data"    file (int), offset (int); payload: the next bytes of that file, in ckw_write's
 *             order, at most RMT_DATA_FRAME bytes from our client. Answered only when refused.
 *   "commit"  no fields. Always answered; the text of an ok reply is the server-side path.
 *   "abort"   no fields: drop this connection's checkpoint, if any. Never answered. (A begin
 *             while a checkpoint is open aborts both: a client starting over sends abort first.)
 *   "list"    job (str). Answered: the text of an ok reply is "COUNT STEP..." (newest first).
 *   "fetch"   job (str), step (int): send that stored checkpoint back. Answered by its files as
 *             "part" messages, then an ok reply whose text is the server-side path; or by an
 *             error reply (at once, or after some parts: the step is gone, a file is cut short).
 *             Any other message from the client ends a fetch in progress.
 * server -> client:
 *   "reply"   seq (the message answered), ok (bool), code (an errno, 0 when ok), text.
 *   "part"    seq (the fetch's), file (0: the index, K + 1: the index's data file K), offset,
 *             size (the whole file's bytes); payload: the next bytes of that file, at most
 *             RMT_DATA_FRAME. Files in order, each from offset 0 up to its size, every file
 *             at least one part (an empty one too). Sent as fast as the client takes them
 *             (RMT_HWM messages queued): a fetch holds 4 MiB of the server's memory.
 *             The client checks what arrives only for shape (order, sizes, the index's own
 *             checks and file names); the data's checksums are checked as it loads them.
 * Data are not acknowledged, so that a client streams at the speed of the link. When a data
 * message is refused the server answers it at once, aborts the checkpoint and drops that
 * connection's further data until its commit (answered with the same error) or next begin.
 * A checkpoint whose client is silent for the idle timeout is aborted and the client told
 * the same way (a reply with the seq of its last message). The client takes any error reply
 * with a seq at or after its begin's as the end of that checkpoint, so it learns of an error
 * at its next write or at commit, whichever comes first. */
#ifndef CTITAN_REMOTE_INT_H
#define CTITAN_REMOTE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/ckpt_stream.h"
#include "checkpointd/remote.h"

#define RMT_VERSION 2 /* 2: begin says whether it may replace a stored step (replace). Types are
                        * only appended (list, then fetch and part): a server older than a type
                        * answers it with an error naming it, and the version stays */
#define RMT_HDR_MAX 4096 /* bytes of a header frame */
#define RMT_HWM 8        /* messages queued per connection each way: 8 x 4 MiB */

/* Message types; ids are only ever appended. */
typedef enum {
    RMT_NONE, RMT_BEGIN, RMT_DATA, RMT_COMMIT, RMT_ABORT, RMT_REPLY, RMT_LIST, RMT_FETCH, RMT_PART, RMT_TYPE_END
} rmt_type_t;

/* A header, both ways. Strings are not NUL-terminated: decoded, they point into the frame. */
typedef struct {
    rmt_type_t type;
    uint64_t seq;
    const char *job;      /* begin, list, fetch */
    size_t job_len;
    int32_t keep;         /* begin: the job's keep_latest_k, 0 = all */
    int replace;          /* begin: the step may replace a stored one that verifies (the trainer
                           * saves it again: a retry, or after a rewind) */
    uint64_t step;        /* begin, fetch */
    uint32_t file;        /* data, part */
    uint64_t offset;      /* data, part */
    uint64_t size;        /* part: the file's bytes */
    int ok;               /* reply */
    uint64_t code;        /* reply: an errno, 0 when ok */
    const char *text;     /* reply */
    size_t text_len;
} rmt_hdr_t;

/* The type's name on the wire ("begin"). */
const char *rmt_type_name(rmt_type_t t);
/* Whether a payload frame follows a header of this type. */
bool rmt_has_payload(rmt_type_t t);
/* Parses and checks a header: version first, then the type, then the fields that type needs,
 * then that a payload frame came (payload) exactly when the type has one. Returns 0, or
 * -EBADMSG / -EMSGSIZE / -EPROTO (another version) with the reason in err; *h then holds
 * what was read (its seq, once the type is known). */
int rmt_hdr_decode(const void *buf, size_t len, int payload, rmt_hdr_t *h, char *err, size_t errlen);
/* Encodes a header into a malloc'ed buffer (the caller free()s it). Returns 0, -EINVAL (not a
 * type; a string with a length but no bytes), -EMSGSIZE (over RMT_HDR_MAX) or -ENOMEM. */
int rmt_hdr_encode(const rmt_hdr_t *h, uint8_t **buf, size_t *len);
/* Sends [to,] header [, payload] on sock (to: the routing id, for the server's ROUTER). flags
 * adds ZMQ_DONTWAIT where the caller must not block. Returns 0 or -errno. */
int rmt_send(void *sock, const void *to, size_t tolen, const rmt_hdr_t *h, const void *payload, size_t n,
             int flags);

/* Receives one whole multipart message: the first max frames into f (initialised here, the
 * caller closes all max of them), the rest counted and dropped; *n gets the frame count.
 * flags: ZMQ_DONTWAIT or 0 for the first frame; the rest of a message is always there. */
int rmt_recv_frames(void *sock, zmq_msg_t *f, int max, int *n, int flags);
void rmt_close_frames(zmq_msg_t *f, int max);
/* zmq_setsockopt of an int; 0 or -errno. */
int rmt_set_int(void *sock, int opt, int v);

/* A fetch being received (rmt_client_fetch; remote_fetch.c): the parts of one stored
 * checkpoint, checked for shape and handed to a sink; `from` names the server in messages.
 * File `file` (0 the index, K + 1 the index's data file K) is coming, `got` of its `size`
 * bytes. */
typedef struct {
    const rmt_sink_t *sink;
    const char *job, *from;
    int64_t step;
    uint32_t file;
    int any;            /* a part of file `file` came */
    uint64_t size, got;
    uint8_t *index;     /* file 0's bytes */
    ckpt_index_t ix;    /* file 0 decoded, once whole */
    int have_ix;
} rmt_fetch_t;
void rmt_fetch_init(rmt_fetch_t *F, const rmt_sink_t *sink, const char *job, int64_t step, const char *from);
/* One part (h: a part of this fetch): the files in order, each from 0 to the size its first
 * part says (a data file's must be the index's), nothing past it; the index, once whole,
 * decoded with its own checks (its checksum, plain file names), of step F->step, and given to
 * the sink, as is every data byte. 0, or -EBADMSG with why (not the shape of that checkpoint),
 * -ENOMEM, or the sink's error. */
int rmt_fetch_part(rmt_fetch_t *F, const rmt_hdr_t *h, const void *data, size_t n, char *err, size_t errlen);
/* The server's ok came: every file is whole (the last one's end told to the sink). 0 or
 * -EBADMSG. */
int rmt_fetch_done(rmt_fetch_t *F, char *err, size_t errlen);
/* Frees what F holds. */
void rmt_fetch_free(rmt_fetch_t *F);

/* The sink that writes a fetch's files into dir (new files, never through a link), checking
 * every chunk's checksum and every data file's header as the bytes pass (ckpt_stream.h), so
 * that a copy it finishes verifies without being read again. */
typedef struct {
    rmt_sink_t sink;
    const char *dir;
    const ckpt_index_t *ix; /* the fetch's, once it came */
    int fd;                 /* of the data file being written; -1 */
    const char *shown;      /* the checkpoint in messages */
    ckpt_stream_t cs;
} rmt_dir_sink_t;
/* shown: the checkpoint as messages name it ("step N of job J from ..."; kept by the caller
 * while the sink lasts). */
void rmt_dir_sink_init(rmt_dir_sink_t *d, const char *dir, const char *shown);
/* After a fetch that ended well: every chunk came and checked. 0 or -EBADMSG with err. */
int rmt_dir_sink_finish(rmt_dir_sink_t *d, char *err, size_t errlen);
/* Closes what a fetch left open and frees the checks (the files written stay). */
void rmt_dir_sink_close(rmt_dir_sink_t *d);

#endif
