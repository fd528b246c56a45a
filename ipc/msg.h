/* Control-plane messages: what the coordinator and the workers (loader, stages, optshards,
 * the `ctitan` CLI) say to each other over ZeroMQ. On the wire every message is one msgpack
 * map: {"v": MSG_VERSION, "type": "<name>", <fields of that type>}. Bytes of tensors never
 * travel here (see ipc/ring.h).
 *
 * The decoder is the guard at the process boundary: malformed, truncated, oversized
 * (> MSG_MAX_BYTES), unknown-version, unknown-type, missing-field and wrongly-typed input
 * is rejected with a message in err, never a crash. Keys a type does not use are ignored
 * (so a field can be added within a version); every key it uses is type-checked.
 * Type ids are only ever appended. */
#ifndef CTITAN_MSG_H
#define CTITAN_MSG_H

#include <stddef.h>
#include <stdint.h>

#define MSG_VERSION 1
#define MSG_MAX_BYTES (1 << 20)
#define MSG_ROLE_MAX 16

typedef enum {
    MSG_HELLO = 1,   /* worker -> coord: role, rank, replica, pid (first message of a worker) */
    MSG_CONFIG,      /* coord -> worker: text (the resolved manifest TOML), step (first step) */
    MSG_READY,       /* worker -> coord: role, rank, replica, pid (set up, waiting for commands) */
    MSG_STEP,        /* coord -> stage: step (run this step's action list) */
    MSG_STEP_DONE,   /* stage -> coord: step, loss (sum of token losses; last stage, else 0),
                      * t_f, t_b, t_w (mean seconds per F, B, W action), t_busy (seconds
                      * computing this step), t_wait (seconds blocked on rings), mem */
    MSG_REDUCE,      /* coord -> optshard: step (sum replicas' gradients, norm partials) */
    MSG_REDUCED,     /* optshard -> coord: step, t_busy, grad_norm (the squared norm of its
                      * slice's summed gradient) */
    MSG_UPDATE,      /* coord -> optshard: step, grad_norm (global), scale (clip factor; both
                      * unused when the shards make them on the device, job.h
                      * norm_on_device) */
    MSG_UPDATED,     /* optshard -> coord: step, lr, t_busy, grad_norm (the global norm when the
                      * shard made it on the device, else 0) */
    MSG_HEARTBEAT,   /* worker -> coord: role, rank, replica, pid, progress (a counter) */
    MSG_ERROR,       /* worker -> coord: role, rank, replica, pid, text (the reason) */
    MSG_STOP,        /* coord -> worker: exit cleanly now */
    MSG_SWAP,        /* cli -> coord: text (a loader command for a shell). Retired by issue 12:
                      * refused, since no message may make the coordinator run a shell */
    MSG_REPLY,       /* coord -> cli: ok, text (what happened) */
    MSG_STATUS,      /* cli -> coord: (no fields) */
    MSG_SNAPSHOT,    /* coord -> optshard: step (copy state into the staging segment) */
    MSG_SNAPPED,     /* optshard -> coord: step, t_busy */
    MSG_SAVE,        /* coord -> checkpointd: step (write the staged snapshot), ok (this run
                      * saves that step again, a retry or after a rewind: it may replace the
                      * one stored) */
    MSG_SAVED,       /* checkpointd -> coord: step, ok, text (the path, or why not), t_busy
                      * (seconds writing), progress (bytes written) */
    MSG_NCCL,        /* coord -> stage, right after config with the NCCL data plane: data, the
                      * ncclUniqueIds of the communicators the stage joins, back to back in the
                      * order stages/job/job.h names (JOB_NCCL_*) */
    MSG_LOAD,        /* coord -> checkpointd: text ("latest" or a checkpoint directory): read
                      * it into the staging segment, where the optimizer shards take their
                      * slices of weights and moments */
    MSG_LOADED,      /* checkpointd -> coord: ok, step (the checkpoint's: training resumes
                      * after it), text (the directory loaded; "" for "latest" when there is
                      * none, a fresh start; or why it cannot load), data (the loader cursor of
                      * the next step) */
    MSG_SWAP_ARGV,   /* operator -> coord: data, the new loader's argument vector, each word
                      * NUL-terminated, back to back (ipc/argv.h); exec'ed as is, no shell */
    MSG_ABORTED,     /* stage -> coord: step (it left the step unfinished: its rings were closed
                      * because another stage of the job died; the step is redone) */
    MSG_REWIND,      /* coord -> a host's agent (job.hosts > 1): step, ok (from the staging
                      * segment's snapshot of that step; false: the initial weights), data (the
                      * loader cursor of the next step): restart every worker of the host there */
    MSG_LOST,        /* agent -> coord: role, rank, replica, pid, text: a worker of its host died
                      * (how, in text); the agent's own hello is a HELLO with role "agent", its
                      * heartbeats HEARTBEATs with role "agent" (the coordinator answers each) */
    MSG_SAVE_PART,   /* coord -> checkpointd (host 0) and -> a host's agent (job.hosts > 1): step,
                      * text (the temporary directory's name in checkpoint.folder, every host's):
                      * write this host's part of the staged snapshot there */
    MSG_WRITTEN,     /* checkpointd (host 0) or a host's agent -> coord: step, ok, text (why
                      * not; "" when ok), t_busy (seconds writing), progress (bytes written):
                      * the host's part is written and synced */
    MSG_COMMIT,      /* coord -> checkpointd (host 0): step, ok (false: every part is given up),
                      * text (the temporary directory): the index over every host's part, then
                      * the rename; answered by SAVED */
    MSG_START,       /* coord -> a host's agent (job.hosts > 1), answering its hello: step (the
                      * steps done), ok (resumed from a checkpoint), text (its directory, "" for
                      * the initial weights), data (the loader cursor of the next step): load it
                      * and start the host's workers */
    MSG_TRACE,       /* stage -> coord, before its STEP_DONE with [profiling] trace_file, and loader
                      * -> coord as a step's last slot is filled: step, data (the step's
                      * intervals, stages/runtime/trace.h trace_rec_t, back to back) */
    MSG_REMAP,       /* coord -> optshard (GPU shards): step: the stages were started again; map
                      * their device buffers anew and write the master weights into them */
    MSG_REMAPPED,    /* optshard -> coord: step, t_busy: done */
    MSG_GIVEN_UP,    /* host 0's supervisor -> a host's agent (job.hosts > 1), answering its hello
                      * or heartbeat once no coordinator will come: text (why the job ended):
                      * stop the host's workers and exit 1 */
    MSG_TYPE_END     /* append new types above this */
} msg_type_t;

/* Fields, by key. Which ones a type carries (and so which the decoder requires) is in the
 * table in msg.c, mirroring the comments above. */
typedef struct {
    msg_type_t type;
    char role[MSG_ROLE_MAX];   /* "role": "loader", "stage", "optshard", "checkpointd" (what a
                                * worker says it is; the coordinator goes by its key) */
    int32_t rank;              /* "rank": pipeline rank or shard index, >= 0 */
    int32_t replica;           /* "replica": data-parallel replica, >= 0 */
    int64_t pid;               /* "pid" */
    int64_t step;              /* "step", >= 0 */
    uint64_t progress;         /* "progress" */
    double loss;               /* "loss" */
    double grad_norm;          /* "grad_norm" */
    double scale;              /* "scale" */
    double lr;                 /* "lr" */
    double t_f, t_b, t_w;      /* "t_f", "t_b", "t_w" */
    double t_busy, t_wait;     /* "t_busy", "t_wait" */
    int ok;                    /* "ok": a msgpack boolean */
    uint64_t mem;              /* "mem": peak memory in bytes (step_done: the stage's device
                                * memory in use on a GPU, its resident set on the CPU) */
    char *text;                /* "text": NUL-terminated, owned (msg_clear frees); NULL if absent */
    size_t text_len;
    uint8_t *data;             /* "data": msgpack binary, owned (msg_clear frees); NULL if absent */
    size_t data_len;
} msg_t;

/* Name on the wire ("step_done"), or NULL for an unknown type. */
const char *msg_type_name(msg_type_t t);

/* Encodes m into a malloc'ed buffer. Returns 0, -EINVAL (unknown type, a required text
 * missing, role too long), -EMSGSIZE (over MSG_MAX_BYTES) or -ENOMEM. */
int msg_encode(const msg_t *m, uint8_t **buf, size_t *len);

/* Decodes exactly len bytes into *m (zeroed first; free with msg_clear). Returns 0, or
 * -EBADMSG / -EMSGSIZE / -EPROTO (unknown version) with the reason in err, naming the
 * field when one is at fault ("step_done: field 'loss' must be a number, got a string"). */
int msg_decode(const void *buf, size_t len, msg_t *m, char *err, size_t errlen);

/* Frees m->text and zeroes m. */
void msg_clear(msg_t *m);

/* Sets m->text to a copy of s (replacing any). Returns 0 or -ENOMEM. */
int msg_set_text(msg_t *m, const char *s);
/* Sets m->data to a copy of n bytes at p (replacing any). Returns 0 or -ENOMEM. */
int msg_set_data(msg_t *m, const void *p, size_t n);

#endif
