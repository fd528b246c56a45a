/* Remote checkpoints over ZeroMQ CURVE (see remote.h): key files, the server loop of
 * `checkpointd --listen` with its ZAP handler, and the trainer's client. Sits between the
 * coordinator, which streams a checkpoint's files, and checkpointd/writer.c on the storage host.
 *
 * Wire protocol, version 1. Every message is multipart:
 *   frame 1  a flat msgpack map {"v": 1, "type": T, "seq": S, <fields of T>} of at most
 *            RMT_HDR_MAX bytes; values are integers, strings or booleans; keys a type does not
 *            use are ignored, every key it uses is type-checked; "v" is checked first
 *   frame 2  the payload, for the types that have one (at most RMT_FRAME_MAX bytes)
 * client -> server (seq numbers the client's messages 1, 2, 3, ...):
 *   "begin"   job (str), keep (int >= 0), step (int >= 0); payload: the index as
 *             ckpt_index_encode writes it, whose step must be `step`. Always answered.
 *   "data"    file (int), offset (int); payload: the next bytes of that file, in ckw_write's
 *             order, at most RMT_DATA_FRAME bytes from our client. Answered only when refused.
 *   "commit"  no fields. Always answered; the text of an ok reply is the server-side path.
 *   "abort"   no fields: drop this connection's checkpoint, if any. Never answered. (A begin
 *             while a checkpoint is open aborts both: a client starting over sends abort first.)
 * server -> client:
 *   "reply"   seq (the message answered), ok (bool), code (an errno, 0 when ok), text.
 * Data are not acknowledged, so that a client streams at the speed of the link. When a data
 * message is refused the server answers it at once, aborts the checkpoint and drops that
 * connection's further data until its commit (answered with the same error) or next begin.
 * A checkpoint whose client is silent for the idle timeout is aborted and the client told
 * the same way (a reply with the seq of its last message). The client takes any error reply
 * with a seq at or after its begin's as the end of that checkpoint, so it learns of an error
 * at its next write or at commit, whichever comes first.
 *
 * The server keeps a state per connection (ZeroMQ routing id): none -> open (begin accepted)
 * -> none (commit, abort); an error or RMT_IDLE_TIMEOUT_MS of silence aborts the checkpoint
 * and leaves the connection failed (its error is the answer to its commit) until its next
 * begin or abort, or another idle period. Only authenticated clients get this far: the ZAP
 * handler runs in the server's poll loop and answers 400 to any key not in the allow file. */
#include "checkpointd/remote.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "checkpointd/writer.h"
#include "ipc/util.h"

#define RMT_VERSION 1
#define RMT_HDR_MAX 4096             /* bytes of a header frame */
#define RMT_MAX_PEERS 64             /* connections with a state on the server */
#define RMT_MAX_OPEN 8               /* checkpoints being written at once (32 MiB of buffers each) */
#define RMT_HWM 8                    /* messages queued per connection each way: 8 x 4 MiB */
#define RMT_SEND_TIMEOUT_MS 60000    /* a client blocked this long on a full queue gives up */
#define RMT_LINGER_MS 1000           /* what a closing client still tries to deliver */
#define RMT_RECONNECT_MS 250
#define RMT_MAX_KEYS 4096            /* in an allow file */
#define RMT_LINE_MAX 1024            /* of a key file */
#define RMT_POLL_MS 100              /* < 200: remote.h promises to look at *stop that often */
#define RMT_REFUSAL_QUIET_S 60       /* a refused client that keeps retrying is logged once per */
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

/* ---- small helpers ---- */

/* A peer-supplied string made safe for a message: at most 64 bytes shown, others escaped. */
static const char *printable(const void *s, size_t n, char out[300])
{
    const unsigned char *p = s;
    size_t j = 0;
    for (size_t i = 0; i < n && i < 64; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' && p[i] != '\'')
            out[j++] = (char)p[i];
        else
            j += (size_t)sprintf(out + j, "\\x%02x", p[i]);
    }
    if (n > 64)
        j += (size_t)sprintf(out + j, "...");
    out[j] = '\0';
    return out;
}

static int set_int(void *sock, int opt, int v)
{
    return zmq_setsockopt(sock, opt, &v, sizeof v) == 0 ? 0 : -errno;
}

/* Receives one whole multipart message: the first max frames into f (initialised here, the
 * caller closes all max of them), the rest counted and dropped; *n gets the frame count.
 * flags: ZMQ_DONTWAIT or 0 for the first frame; the rest of a message is always there. */
static int recv_frames(void *sock, zmq_msg_t *f, int max, int *n, int flags)
{
    for (int i = 0; i < max; i++)
        zmq_msg_init(&f[i]);
    *n = 0;
    int r;
    while ((r = zmq_msg_recv(&f[0], sock, flags)) < 0 && errno == EINTR && !(flags & ZMQ_DONTWAIT)) {}
    if (r < 0)
        return -errno;
    *n = 1;
    for (bool more = zmq_msg_more(&f[0]); more; (*n)++) {
        zmq_msg_t extra, *dst = *n < max ? &f[*n] : &extra;
        if (dst == &extra)
            zmq_msg_init(&extra);
        while ((r = zmq_msg_recv(dst, sock, 0)) < 0 && errno == EINTR) {}
        more = r >= 0 && zmq_msg_more(dst);
        if (dst == &extra)
            zmq_msg_close(&extra);
        if (r < 0)
            return -errno;
    }
    return 0;
}

static void close_frames(zmq_msg_t *f, int max)
{
    for (int i = 0; i < max; i++)
        zmq_msg_close(&f[i]);
}

/* ---- keys ---- */

static const char z85_chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/* Reads the first key (all: every key, at most max) of a key file, binary (32 bytes) or Z85. A line is blank, a comment
 * (first non-blank character '#'), or a key of exactly 40 Z85 characters, optionally followed
 * by blanks and a '#' comment. A key is tried first because '#' is a Z85 character too. */
static int load_keys(const char *path, uint8_t (*keys)[32], char (*z85)[RMT_KEY_Z85 + 1], int max, bool all,
                     int *n, char *err, size_t errlen)
{
    *n = 0;
    FILE *f = fopen(path, "re");
    if (!f)
        return util_fail(err, errlen, -errno, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0, lineno = 0;
    while ((all || *n < 1) && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len > RMT_LINE_MAX || memchr(line, '\0', (size_t)len)) {
            rc = util_fail(err, errlen, -EINVAL, "%s:%d: not a key file (line too long or binary)", path, lineno);
            goto out;
        }
        char *p = line + strspn(line, " \t\r\n");
        if (!*p)
            continue;
        size_t tok = strcspn(p, " \t\r\n");
        char *rest = p + tok;
        rest += strspn(rest, " \t\r\n");
        bool is_z85 = tok == RMT_KEY_Z85;
        for (size_t i = 0; i < tok && is_z85; i++)
            is_z85 = p[i] && strchr(z85_chars, p[i]) != NULL;
        if (!is_z85 || (*rest && *rest != '#')) {
            if (*p == '#')
                continue;
            if (tok != RMT_KEY_Z85)
                rc = util_fail(err, errlen, -EINVAL, "%s:%d: expected a key of %d Z85 characters, found %zu characters",
                               path, lineno, RMT_KEY_Z85, tok);
            else if (!is_z85)
                rc = util_fail(err, errlen, -EINVAL, "%s:%d: expected a key of %d Z85 characters, found a character "
                               "that is not Z85", path, lineno, RMT_KEY_Z85);
            else
                rc = util_fail(err, errlen, -EINVAL, "%s:%d: unexpected text after the key (comments start with '#')",
                               path, lineno);
            goto out;
        }
        if (*n == max) {
            rc = util_fail(err, errlen, -E2BIG, "%s:%d: more than %d keys", path, lineno, max);
            goto out;
        }
        char z[RMT_KEY_Z85 + 1];
        memcpy(z, p, RMT_KEY_Z85);
        z[RMT_KEY_Z85] = '\0';
        uint8_t bin[32];
        if (!zmq_z85_decode(bin, z)) {
            rc = util_fail(err, errlen, -EINVAL, "%s:%d: not a valid Z85 key", path, lineno);
            goto out;
        }
        if (keys)
            memcpy(keys[*n], bin, 32);
        if (z85)
            memcpy(z85[*n], z, sizeof z);
        (*n)++;
    }
    if (ferror(f))
        rc = util_fail(err, errlen, -EIO, "%s: read error", path);
    else if (*n == 0)
        rc = util_fail(err, errlen, -EINVAL, "%s: no key in the file (expected a line of %d Z85 characters)", path,
                       RMT_KEY_Z85);
out:
    free(line);
    fclose(f);
    return rc;
}

int rmt_key_load(const char *path, char key[RMT_KEY_Z85 + 1], char *err, size_t errlen)
{
    char z[1][RMT_KEY_Z85 + 1];
    int n, rc = load_keys(path, NULL, z, 1, false, &n, err, errlen);
    if (!rc)
        memcpy(key, z[0], RMT_KEY_Z85 + 1);
    return rc;
}

int rmt_key_public(const char *secret, char pub[RMT_KEY_Z85 + 1])
{
    if (strlen(secret) != RMT_KEY_Z85)
        return -EINVAL;
    return zmq_curve_public(pub, secret) == 0 ? 0 : (errno == ENOTSUP ? -ENOTSUP : -EINVAL);
}

/* A secret key file, refused like ssh does when others can read it. */
static int load_secret(const char *path, char key[RMT_KEY_Z85 + 1], char pub[RMT_KEY_Z85 + 1], char *err,
                       size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return util_fail(err, errlen, -errno, "%s: cannot open: %s", path, strerror(errno));
    if (st.st_mode & 077)
        return util_fail(err, errlen, -EPERM, "%s: a secret key others can read (mode %04o); chmod 600 %s", path,
                         (unsigned)(st.st_mode & 07777), path);
    int rc = rmt_key_load(path, key, err, errlen);
    if (rc)
        return rc;
    if (rmt_key_public(key, pub) != 0)
        return util_fail(err, errlen, -EINVAL, "%s: not a CURVE secret key (this libzmq has CURVE: %s)", path,
                         zmq_has("curve") ? "yes" : "no");
    return 0;
}

static int write_key_file(const char *path, const char *text, mode_t mode, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return util_fail(err, errlen, -errno, errno == EEXIST ? "%s exists: not overwriting a key"
                                                              : "%s: cannot create: %s", path, strerror(errno));
    int rc = fchmod(fd, mode) ? -errno : 0; /* whatever the umask */
    if (!rc)
        rc = util_write_all(fd, text, strlen(text));
    if (!rc && fsync(fd) != 0)
        rc = -errno;
    if (close(fd) != 0 && !rc)
        rc = -errno;
    if (rc) {
        unlink(path);
        return util_fail(err, errlen, rc, "%s: cannot write: %s", path, strerror(-rc));
    }
    return 0;
}

int rmt_keygen(const char *prefix, char *err, size_t errlen)
{
    char kpath[PATH_MAX], ppath[PATH_MAX];
    if (snprintf(kpath, sizeof kpath, "%s.key", prefix) >= (int)sizeof kpath ||
        snprintf(ppath, sizeof ppath, "%s.pub", prefix) >= (int)sizeof ppath)
        return util_fail(err, errlen, -ENAMETOOLONG, "%s: name too long", prefix);
    if (access(ppath, F_OK) == 0) /* before creating the secret one */
        return util_fail(err, errlen, -EEXIST, "%s exists: not overwriting a key", ppath);
    char pub[RMT_KEY_Z85 + 1], sec[RMT_KEY_Z85 + 1];
    if (zmq_curve_keypair(pub, sec) != 0)
        return util_fail(err, errlen, -errno, "cannot make a CURVE key pair: %s (libzmq built without CURVE?)",
                         zmq_strerror(errno));
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const char *base = strrchr(prefix, '/') ? strrchr(prefix, '/') + 1 : prefix;
    char text[512];
    snprintf(text, sizeof text, "# ctitan CURVE secret key; its public key is in %s.pub. Keep it private.\n%s\n",
             base, sec);
    int rc = write_key_file(kpath, text, 0600, err, errlen);
    if (rc)
        return rc;
    snprintf(text, sizeof text, "%s # %s.pub from %s\n", pub, base, host);
    if ((rc = write_key_file(ppath, text, 0644, err, errlen)))
        unlink(kpath);
    return rc;
}

/* ---- headers: frame 1 of every message ---- */

typedef enum { T_NONE, T_BEGIN, T_DATA, T_COMMIT, T_ABORT, T_REPLY } mtype_t;
static const char *const type_names[] = {"?", "begin", "data", "commit", "abort", "reply"};

enum { H_V, H_TYPE, H_SEQ, H_JOB, H_KEEP, H_STEP, H_FILE, H_OFFSET, H_OK, H_CODE, H_TEXT, H_COUNT };
static const char *const hkeys[H_COUNT] = {"v", "type", "seq", "job", "keep", "step", "file", "offset", "ok",
                                           "code", "text"};
#define HB(k) (1u << (k))
/* Which fields each type carries (and so needs), after v, type and seq. */
static const uint32_t type_fields[] = {
    [T_BEGIN] = HB(H_JOB) | HB(H_KEEP) | HB(H_STEP),
    [T_DATA] = HB(H_FILE) | HB(H_OFFSET),
    [T_COMMIT] = 0,
    [T_ABORT] = 0,
    [T_REPLY] = HB(H_OK) | HB(H_CODE) | HB(H_TEXT),
};
static const int type_payload[] = {[T_BEGIN] = 1, [T_DATA] = 1};

typedef struct {
    mtype_t type;
    uint64_t seq, file, offset;
    int64_t keep, step, code;
    int ok;
    const char *job, *text; /* into the frame, not NUL-terminated */
    size_t job_len, text_len;
} hdr_t;

typedef struct {
    enum { V_UINT, V_NEG, V_STR, V_BOOL, V_NIL, V_FLOAT } kind;
    uint64_t u;
    int64_t i;
    const uint8_t *s;
    size_t n;
} val_t;

/* One msgpack value of a header as a scalar; containers, binary and extensions are refused
 * (headers are flat). Strings point into the frame (msgpack-c does not copy them). */
static int obj_val(const msgpack_object *o, val_t *v)
{
    memset(v, 0, sizeof *v);
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: v->kind = V_UINT, v->u = o->via.u64; return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: v->kind = V_NEG, v->i = o->via.i64; return 0;
    case MSGPACK_OBJECT_STR:
        v->kind = V_STR, v->s = (const uint8_t *)o->via.str.ptr, v->n = o->via.str.size;
        return 0;
    case MSGPACK_OBJECT_BOOLEAN: v->kind = V_BOOL, v->u = o->via.boolean; return 0;
    case MSGPACK_OBJECT_NIL: v->kind = V_NIL; return 0;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: v->kind = V_FLOAT; return 0;
    default: return -2;
    }
}

static const char *val_what(const val_t *v)
{
    static const char *const w[] = {"an integer", "a negative integer", "a string", "a boolean", "nil", "a float"};
    return w[v->kind];
}

/* Parses and checks a header: version first, then the type, then the fields that type needs.
 * payload: whether a second frame came. On error, err says why and *h holds what was read. */
static int hdr_parse(const void *buf, size_t len, int payload, hdr_t *h, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    if (len > RMT_HDR_MAX)
        return util_fail(err, errlen, -EBADMSG, "header of %zu bytes, at most %d allowed", len, RMT_HDR_MAX);
    if (len == 0)
        return util_fail(err, errlen, -EBADMSG, "empty header");
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(&up, buf, len, &off);
    int rc = 0;
    uint32_t have = 0;
    val_t vals[H_COUNT];
    if (ur != MSGPACK_UNPACK_SUCCESS)
        rc = util_fail(err, errlen, -EBADMSG, ur == MSGPACK_UNPACK_CONTINUE ? "header truncated"
                                                                            : "the header is not msgpack");
    else if (off != len)
        rc = util_fail(err, errlen, -EBADMSG, "%zu bytes after the header", len - off);
    else if (up.data.type != MSGPACK_OBJECT_MAP)
        rc = util_fail(err, errlen, -EBADMSG, "the header is not a msgpack map");
    for (uint32_t i = 0; !rc && i < up.data.via.map.size; i++) {
        val_t k, v;
        char shown[300];
        const msgpack_object_kv *kv = &up.data.via.map.ptr[i];
        if (obj_val(&kv->key, &k) || k.kind != V_STR) {
            rc = util_fail(err, errlen, -EBADMSG, "header key %u is not a string", i);
            break;
        }
        if (obj_val(&kv->val, &v)) {
            rc = util_fail(err, errlen, -EBADMSG, "header field '%s' is not a scalar (headers are flat)",
                           printable(k.s, k.n, shown));
            break;
        }
        for (int f = 0; f < H_COUNT && !rc; f++) {
            if (k.n != strlen(hkeys[f]) || memcmp(k.s, hkeys[f], k.n))
                continue;
            if (have & HB(f))
                rc = util_fail(err, errlen, -EBADMSG, "header field '%s' given twice", hkeys[f]);
            have |= HB(f);
            vals[f] = v;
        }
    }
    msgpack_unpacked_destroy(&up); /* the strings in vals point into buf, not into it */
    if (rc)
        return rc;
    if (!(have & HB(H_V)))
        return util_fail(err, errlen, -EPROTO, "no protocol version ('v') in the header");
    if (vals[H_V].kind != V_UINT || vals[H_V].u != RMT_VERSION) {
        if (vals[H_V].kind == V_UINT)
            return util_fail(err, errlen, -EPROTO, "protocol version %" PRIu64 "; this build speaks version %d",
                             vals[H_V].u, RMT_VERSION);
        return util_fail(err, errlen, -EPROTO, "protocol version is %s; this build speaks version %d",
                         val_what(&vals[H_V]), RMT_VERSION);
    }
    if (!(have & HB(H_TYPE)) || vals[H_TYPE].kind != V_STR)
        return util_fail(err, errlen, -EBADMSG, "the header has no 'type' string");
    for (int t = T_BEGIN; t <= T_REPLY; t++)
        if (vals[H_TYPE].n == strlen(type_names[t]) && !memcmp(vals[H_TYPE].s, type_names[t], vals[H_TYPE].n))
            h->type = (mtype_t)t;
    char shown[300];
    if (h->type == T_NONE)
        return util_fail(err, errlen, -EBADMSG, "unknown message type '%s'",
                         printable(vals[H_TYPE].s, vals[H_TYPE].n, shown));
    const char *tn = type_names[h->type];
    if (!(have & HB(H_SEQ)) || vals[H_SEQ].kind != V_UINT)
        return util_fail(err, errlen, -EBADMSG, "%s: field 'seq' must be a non-negative integer", tn);
    h->seq = vals[H_SEQ].u;
    uint32_t need = type_fields[h->type];
    for (int f = 0; f < H_COUNT; f++) {
        if (!(need & HB(f)))
            continue;
        if (!(have & HB(f)))
            return util_fail(err, errlen, -EBADMSG, "%s: field '%s' is missing", tn, hkeys[f]);
        const val_t *v = &vals[f];
        const char *want = NULL;
        switch (f) {
        case H_JOB:
        case H_TEXT:
            if (v->kind != V_STR)
                want = "a string";
            else if (f == H_JOB)
                h->job = (const char *)v->s, h->job_len = v->n;
            else
                h->text = (const char *)v->s, h->text_len = v->n;
            break;
        case H_OK:
            if (v->kind != V_BOOL)
                want = "a boolean";
            h->ok = (int)v->u;
            break;
        case H_KEEP:
            if (v->kind != V_UINT || v->u > INT32_MAX)
                want = "an integer from 0 to 2^31-1";
            h->keep = (int64_t)v->u;
            break;
        case H_STEP:
        case H_CODE:
            if (v->kind != V_UINT || v->u > INT64_MAX)
                want = "a non-negative integer";
            *(f == H_STEP ? &h->step : &h->code) = (int64_t)v->u;
            break;
        case H_FILE:
            if (v->kind != V_UINT || v->u > UINT32_MAX)
                want = "an integer from 0 to 2^32-1";
            h->file = v->u;
            break;
        case H_OFFSET:
            if (v->kind != V_UINT)
                want = "a non-negative integer";
            h->offset = v->u;
            break;
        }
        if (want) {
            if (v->kind == V_UINT)
                return util_fail(err, errlen, -EBADMSG, "%s: field '%s' must be %s, got %" PRIu64, tn, hkeys[f],
                                 want, v->u);
            return util_fail(err, errlen, -EBADMSG, "%s: field '%s' must be %s, got %s", tn, hkeys[f], want,
                             val_what(v));
        }
    }
    if (payload != type_payload[h->type])
        return util_fail(err, errlen, -EBADMSG, "%s: %s", tn,
                         payload ? "no payload frame expected" : "the payload frame is missing");
    return 0;
}

/* Encoding: the fields of a header, v/type/seq first. */
typedef struct {
    mtype_t type;
    uint64_t seq;
    const char *job;
    int64_t keep, step;
    uint64_t file, offset;
    int ok;
    int64_t code;
    const char *text;
} hdr_out_t;

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* Into sb (initialised by the caller); returns 0 or -ENOMEM. */
static int hdr_pack(msgpack_sbuffer *sb, const hdr_out_t *h)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    uint32_t fs = type_fields[h->type];
    msgpack_pack_map(&pk, 3 + (size_t)__builtin_popcount(fs));
    pack_str(&pk, "v");
    msgpack_pack_int(&pk, RMT_VERSION);
    pack_str(&pk, "type");
    pack_str(&pk, type_names[h->type]);
    pack_str(&pk, "seq");
    msgpack_pack_uint64(&pk, h->seq);
    for (int f = 0; f < H_COUNT; f++) {
        if (!(fs & HB(f)))
            continue;
        pack_str(&pk, hkeys[f]);
        switch (f) {
        case H_JOB: pack_str(&pk, h->job); break;
        case H_TEXT: pack_str(&pk, h->text ? h->text : ""); break;
        case H_KEEP: msgpack_pack_int64(&pk, h->keep); break;
        case H_STEP: msgpack_pack_int64(&pk, h->step); break;
        case H_CODE: msgpack_pack_int64(&pk, h->code); break;
        case H_FILE: msgpack_pack_uint64(&pk, h->file); break;
        case H_OFFSET: msgpack_pack_uint64(&pk, h->offset); break;
        case H_OK: h->ok ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk); break;
        }
    }
    return sb->data ? 0 : -ENOMEM; /* sbuffer writes fail only when realloc does */
}

/* Sends [to,] header [, payload]. flags adds ZMQ_DONTWAIT where the caller must not block. */
static int send_msg(void *sock, const void *to, size_t tolen, const hdr_out_t *h, const void *payload, size_t n,
                    int flags)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    int rc = hdr_pack(&sb, h);
    bool more = type_payload[h->type];
    if (!rc && to && zmq_send(sock, to, tolen, ZMQ_SNDMORE | flags) < 0)
        rc = -errno;
    /* the later frames of a message never wait on the high-water mark: only the first does */
    if (!rc && zmq_send(sock, sb.data, sb.size, (more ? ZMQ_SNDMORE : 0) | flags) < 0)
        rc = -errno;
    if (!rc && more && zmq_send(sock, payload, n, flags) < 0)
        rc = -errno;
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* ---- server ---- */

typedef enum { P_OPEN, P_FAILED } pstate_t;

typedef struct {
    uint8_t id[256];          /* routing id */
    size_t idlen;
    pstate_t state;
    ckw_t *w;                 /* open */
    char job[CKPT_FILE_MAX];
    int keep;
    int64_t step;
    char who[128];            /* "ADDR (key ABCDEFGH...)" for log lines */
    double t0, last;          /* begin, last message */
    uint64_t bytes;
    uint64_t seq;             /* of its last message */
    int code;                 /* failed: the answer to its commit */
    char reason[1152];
} peer_t;

typedef struct {
    const char *dir, *allow_path;
    FILE *log;
    int idle_ms;
    void *ctx, *router, *zap;
    uint8_t (*allowed)[32];
    int n_allowed;
    peer_t *peers[RMT_MAX_PEERS];
    int n_open;
    char last_refused[512];   /* refused-connection log lines are not repeated for a while */
    double last_refused_t;
    int refused_repeats;
} srv_t;

static void srv_log(srv_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void srv_log(srv_t *s, const char *fmt, ...)
{
    if (!s->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(s->log, fmt, ap);
    va_end(ap);
    fputc('\n', s->log);
    fflush(s->log);
}

/* ZAP (RFC 27): request frames version, request id, domain, address, routing id, mechanism,
 * credentials; the answer: version, request id, status code and text, user id, metadata. */
static void zap_serve(srv_t *s)
{
    for (;;) {
        zmq_msg_t f[8];
        int n;
        if (recv_frames(s->zap, f, 8, &n, ZMQ_DONTWAIT) != 0) {
            close_frames(f, 8);
            return;
        }
        const char *status = "400", *text = "key not allowed";
        char user[RMT_KEY_Z85 + 1] = "", addr[300] = "?", mech[300] = "?";
        if (n >= 6) {
            printable(zmq_msg_data(&f[3]), zmq_msg_size(&f[3]) < 40 ? zmq_msg_size(&f[3]) : 40, addr);
            printable(zmq_msg_data(&f[5]), zmq_msg_size(&f[5]) < 20 ? zmq_msg_size(&f[5]) : 20, mech);
        }
        bool curve = n == 7 && !strcmp(mech, "CURVE") && zmq_msg_size(&f[6]) == 32;
        if (curve) {
            zmq_z85_encode(user, zmq_msg_data(&f[6]), 32);
            for (int i = 0; i < s->n_allowed; i++)
                if (!memcmp(s->allowed[i], zmq_msg_data(&f[6]), 32))
                    status = "200", text = "OK";
        }
        if (n < 2 || zmq_msg_size(&f[0]) != 3 || memcmp(zmq_msg_data(&f[0]), "1.0", 3)) {
            status = "500", text = "bad ZAP request";
            srv_log(s, "ZAP: a malformed request (%d frames); refusing the connection", n);
        }
        if (*status != '2') {
            char line[sizeof s->last_refused];
            if (curve)
                snprintf(line, sizeof line, "%s: key %s is not in %s", addr, user, s->allow_path);
            else
                snprintf(line, sizeof line, "%s: mechanism %s, only CURVE is accepted", addr, mech);
            double now = util_now();
            if (!strcmp(line, s->last_refused) && now - s->last_refused_t < RMT_REFUSAL_QUIET_S) {
                s->refused_repeats++;
            } else {
                if (s->refused_repeats)
                    srv_log(s, "refused %d more connection%s from %s", s->refused_repeats,
                            s->refused_repeats > 1 ? "s" : "", s->last_refused);
                srv_log(s, "refused a connection from %s", line);
                snprintf(s->last_refused, sizeof s->last_refused, "%s", line);
                s->last_refused_t = now;
                s->refused_repeats = 0;
            }
            user[0] = '\0';
        }
        /* the reply: all frames but the last with SNDMORE */
        const void *rf[6] = {"1.0", n >= 2 ? zmq_msg_data(&f[1]) : "", status, text, user, ""};
        size_t rn[6] = {3, n >= 2 ? zmq_msg_size(&f[1]) : 0, 3, strlen(text), strlen(user), 0};
        for (int i = 0; i < 6; i++)
            if (zmq_send(s->zap, rf[i], rn[i], i < 5 ? ZMQ_SNDMORE : 0) < 0)
                break;
        close_frames(f, 8);
    }
}

static peer_t *peer_find(srv_t *s, const void *id, size_t idlen, int *slot)
{
    *slot = -1;
    for (int i = 0; i < RMT_MAX_PEERS; i++) {
        peer_t *p = s->peers[i];
        if (p && p->idlen == idlen && !memcmp(p->id, id, idlen)) {
            *slot = i;
            return p;
        }
        if (!p && *slot < 0)
            *slot = i;
    }
    return NULL;
}

static void peer_free(srv_t *s, peer_t *p)
{
    for (int i = 0; i < RMT_MAX_PEERS; i++)
        if (s->peers[i] == p)
            s->peers[i] = NULL;
    if (p->w) {
        ckw_abort(&p->w);
        s->n_open--;
    }
    free(p);
}

/* Aborts p's checkpoint and keeps the reason as the answer to its commit. */
static void peer_fail(srv_t *s, peer_t *p, int code, const char *reason)
{
    if (p->w) {
        ckw_abort(&p->w);
        s->n_open--;
        srv_log(s, "%s step %" PRId64 " from %s: aborted: %s", p->job, p->step, p->who, reason);
        snprintf(p->reason, sizeof p->reason, "step %" PRId64 " of job %s: %s", p->step, p->job, reason);
    } else {
        snprintf(p->reason, sizeof p->reason, "%s", reason);
    }
    p->state = P_FAILED;
    p->code = code;
}

static void reply(srv_t *s, const void *id, size_t idlen, uint64_t seq, int code, const char *text)
{
    hdr_out_t h = {.type = T_REPLY, .seq = seq, .ok = code == 0, .code = code, .text = text};
    int rc = send_msg(s->router, id, idlen, &h, NULL, 0, ZMQ_DONTWAIT);
    if (rc && rc != -EHOSTUNREACH) /* unreachable: it is gone, nobody to tell */
        srv_log(s, "could not answer a client (%s): %s", zmq_strerror(-rc), text);
}

static int begin(srv_t *s, peer_t *p, const hdr_t *h, zmq_msg_t *payload, char *err, size_t errlen)
{
    char shown[300];
    if (h->job_len == 0 || h->job_len >= CKPT_FILE_MAX || memchr(h->job, '\0', h->job_len))
        return util_fail(err, errlen, -EINVAL, "job name '%s' is not 1 to %d characters",
                         printable(h->job, h->job_len, shown), CKPT_FILE_MAX - 1);
    memcpy(p->job, h->job, h->job_len);
    p->job[h->job_len] = '\0';
    if (!ckpt_safe_name(p->job))
        return util_fail(err, errlen, -EINVAL, "job name '%s' is not a plain name (A-Z a-z 0-9 . _ -, not "
                         "starting with '.')", printable(h->job, h->job_len, shown));
    for (int i = 0; i < RMT_MAX_PEERS; i++)
        if (s->peers[i] && s->peers[i] != p && s->peers[i]->w && !strcmp(s->peers[i]->job, p->job))
            return util_fail(err, errlen, -EBUSY, "job %s: step %" PRId64 " is being received from another "
                             "connection (%s); a silent one is dropped after %d s", p->job, s->peers[i]->step,
                             s->peers[i]->who, s->idle_ms / 1000);
    if (s->n_open >= RMT_MAX_OPEN)
        return util_fail(err, errlen, -EBUSY, "%d checkpoints are being received already; try later", s->n_open);
    if (zmq_msg_size(payload) > RMT_FRAME_MAX)
        return util_fail(err, errlen, -EMSGSIZE, "index of %zu bytes, at most %u accepted", zmq_msg_size(payload),
                         RMT_FRAME_MAX);
    ckpt_index_t ix;
    char what[96];
    snprintf(what, sizeof what, "the index for job %s", p->job);
    int rc = ckpt_index_decode(zmq_msg_data(payload), zmq_msg_size(payload), &ix, what, err, errlen);
    if (rc)
        return rc == -ENOMEM ? util_fail(err, errlen, rc, "out of memory") : -EINVAL;
    for (int f = 0; f < ix.n_files && !rc; f++) /* ckpt_index_decode checks them; these become paths */
        if (!ckpt_safe_name(ix.files[f].name))
            rc = util_fail(err, errlen, -EINVAL, "%s: file '%s' is not a plain name", what,
                           printable(ix.files[f].name, strlen(ix.files[f].name), shown));
    if (!rc && ix.step != h->step)
        rc = util_fail(err, errlen, -EINVAL, "begin says step %" PRId64 ", its index says %" PRId64, h->step,
                       ix.step);
    char jobdir[PATH_MAX];
    if (!rc && snprintf(jobdir, sizeof jobdir, "%s/%s", s->dir, p->job) >= (int)sizeof jobdir)
        rc = util_fail(err, errlen, -ENAMETOOLONG, "%s/%s: path too long", s->dir, p->job);
    if (!rc)
        rc = ckw_begin(&p->w, jobdir, &ix, err, errlen);
    ckpt_index_free(&ix);
    if (rc)
        return rc;
    s->n_open++;
    p->state = P_OPEN;
    p->reason[0] = '\0';
    p->step = h->step;
    p->keep = (int)h->keep;
    p->bytes = 0;
    p->t0 = util_now();
    return 0;
}

static void commit(srv_t *s, peer_t *p, uint64_t seq)
{
    char path[PATH_MAX], err[1024];
    ckw_stats_t st = {0};
    s->n_open--;
    int rc = ckw_commit(&p->w, path, sizeof path, &st, err, sizeof err);
    if (rc) {
        srv_log(s, "%s step %" PRId64 " from %s: commit failed: %s", p->job, p->step, p->who, err);
        reply(s, p->id, p->idlen, seq, -rc, err);
        return;
    }
    char jobdir[PATH_MAX];
    snprintf(jobdir, sizeof jobdir, "%s/%s", s->dir, p->job);
    int removed = ckpt_retain(jobdir, p->keep);
    double secs = util_now() - p->t0;
    char kept[160] = "";
    if (removed > 0)
        snprintf(kept, sizeof kept, "; removed %d older (keep %d)", removed, p->keep);
    else if (removed < 0)
        snprintf(kept, sizeof kept, "; could not remove older ones: %s", strerror(-removed));
    srv_log(s, "%s step %" PRId64 " from %s: %.1f MB in %.2f s (%.0f MB/s) -> %s%s", p->job, p->step, p->who,
            (double)p->bytes / 1e6, secs, secs > 0 ? (double)p->bytes / 1e6 / secs : 0.0, path, kept);
    reply(s, p->id, p->idlen, seq, 0, path);
}

/* "ADDR (key ABCDEFGH...)" of the connection a message came from, for log lines. */
static void who(zmq_msg_t *m, char *out, size_t n)
{
    const char *addr = zmq_msg_gets(m, "Peer-Address"), *key = zmq_msg_gets(m, "User-Id");
    snprintf(out, n, "%s (key %.8s...)", addr ? addr : "?", key ? key : "?");
}

/* A state for a connection; NULL when the table is full (the caller answers EBUSY). */
static peer_t *peer_new(srv_t *s, int slot, const void *id, size_t idlen, zmq_msg_t *hdr)
{
    peer_t *p;
    if (slot < 0 || idlen > sizeof p->id || !(p = calloc(1, sizeof *p)))
        return NULL;
    s->peers[slot] = p;
    memcpy(p->id, id, idlen);
    p->idlen = idlen;
    p->state = P_FAILED;
    p->last = util_now();
    who(hdr, p->who, sizeof p->who);
    return p;
}

/* One message from a client: [routing id] header [payload]. Never fatal. */
static void serve_one(srv_t *s)
{
    zmq_msg_t f[3];
    int n;
    if (recv_frames(s->router, f, 3, &n, ZMQ_DONTWAIT) != 0 || n < 2) {
        close_frames(f, 3);
        return;
    }
    const void *id = zmq_msg_data(&f[0]);
    size_t idlen = zmq_msg_size(&f[0]);
    hdr_t h = {0};
    char err[1024], shown[300];
    int slot = -1, rc = n > 3 ? util_fail(err, sizeof err, -EBADMSG, "%d frames, at most 2 expected", n - 1)
                              : hdr_parse(zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), n == 3, &h, err, sizeof err);
    peer_t *p = idlen <= sizeof p->id ? peer_find(s, id, idlen, &slot) : NULL;
    if (p) {
        p->last = util_now();
        p->seq = h.seq;
    }
    if (rc) { /* cannot tell what it was: answer it, and end the checkpoint in progress */
        char from[128];
        who(&f[1], from, sizeof from);
        srv_log(s, "bad message from %s: %s", from, err);
        int code = rc == -EPROTO ? EPROTO : EINVAL;
        if (p && p->state == P_OPEN)
            peer_fail(s, p, code, err);
        reply(s, id, idlen, h.seq, code, err);
        goto out;
    }
    if (!p && (h.type == T_BEGIN || h.type == T_DATA)) {
        if (!(p = peer_new(s, slot, id, idlen, &f[1]))) {
            reply(s, id, idlen, h.seq, EBUSY, "too many clients at once");
            goto out;
        }
        p->seq = h.seq;
    }
    switch (h.type) {
    case T_BEGIN:
        if (p->state == P_OPEN) {
            snprintf(err, sizeof err, "a second begin (job %s step %" PRId64 ") while step %" PRId64
                     " of job %s was open: both aborted", printable(h.job, h.job_len, shown), h.step, p->step,
                     p->job);
            peer_fail(s, p, EINVAL, err);
            reply(s, id, idlen, h.seq, EINVAL, err);
            break;
        }
        if ((rc = begin(s, p, &h, &f[2], err, sizeof err))) {
            srv_log(s, "refused a checkpoint from %s: %s", p->who, err);
            reply(s, id, idlen, h.seq, -rc, err);
            peer_free(s, p);
            break;
        }
        reply(s, id, idlen, h.seq, 0, "");
        break;
    case T_DATA:
        if (p->state != P_OPEN) {
            if (!p->reason[0]) { /* the first is answered; the rest, sent before that arrives, dropped */
                peer_fail(s, p, EINVAL, "data without a begin");
                reply(s, id, idlen, h.seq, EINVAL, p->reason);
            }
            break;
        }
        if (zmq_msg_size(&f[2]) > RMT_FRAME_MAX) {
            snprintf(err, sizeof err, "a data frame of %zu bytes, at most %u accepted", zmq_msg_size(&f[2]),
                     RMT_FRAME_MAX);
            rc = -EMSGSIZE;
        } else {
            rc = ckw_write(p->w, (uint32_t)h.file, h.offset, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), err,
                           sizeof err);
        }
        if (rc) {
            peer_fail(s, p, -rc, err);
            reply(s, id, idlen, h.seq, p->code, p->reason);
        } else {
            p->bytes += zmq_msg_size(&f[2]);
        }
        break;
    case T_COMMIT:
        if (p && p->state == P_OPEN)
            commit(s, p, h.seq);
        else
            reply(s, id, idlen, h.seq, p ? p->code : EINVAL, p ? p->reason : "commit without a begin");
        if (p)
            peer_free(s, p);
        break;
    case T_ABORT:
        if (p && p->state == P_OPEN) {
            snprintf(err, sizeof err, "%s step %" PRId64 " from %s: aborted by the client", p->job, p->step, p->who);
            peer_free(s, p);
            srv_log(s, "%s", err); /* once its temporary directory is gone */
        } else if (p) {
            peer_free(s, p);
        }
        break;
    case T_REPLY:
    case T_NONE:
        snprintf(err, sizeof err, "a '%s' message sent to the server", type_names[h.type]);
        if (p && p->state == P_OPEN)
            peer_fail(s, p, EINVAL, err);
        reply(s, id, idlen, h.seq, EINVAL, err);
        break;
    }
out:
    close_frames(f, 3);
}

/* Aborts checkpoints whose client went silent; forgets failed connections after as long. */
static void expire(srv_t *s)
{
    double now = util_now();
    for (int i = 0; i < RMT_MAX_PEERS; i++) {
        peer_t *p = s->peers[i];
        if (!p || (now - p->last) * 1000 < s->idle_ms)
            continue;
        if (p->state == P_OPEN) {
            char why[128];
            snprintf(why, sizeof why, "no message from the client for %.0f s", (now - p->last));
            peer_fail(s, p, ETIMEDOUT, why);
            reply(s, p->id, p->idlen, p->seq, p->code, p->reason); /* read at its next write, if it is there */
            p->last = now;
        } else {
            peer_free(s, p);
        }
    }
}

int rmt_serve_idle(const char *listen, const char *dir, const char *secret_key_path, const char *allow_path,
                   int idle_ms, volatile sig_atomic_t *stop, FILE *log, char *err, size_t errlen)
{
    srv_t s = {.dir = dir, .allow_path = allow_path, .log = log, .idle_ms = idle_ms > 0 ? idle_ms : 1};
    char sec[RMT_KEY_Z85 + 1], pub[RMT_KEY_Z85 + 1];
    int rc = load_secret(secret_key_path, sec, pub, err, errlen);
    if (rc)
        return rc;
    if (!(s.allowed = malloc(RMT_MAX_KEYS * sizeof *s.allowed)))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if ((rc = load_keys(allow_path, s.allowed, NULL, RMT_MAX_KEYS, true, &s.n_allowed, err, errlen)))
        goto out;
    struct stat st;
    if ((rc = util_mkdirs(dir)) || (rc = stat(dir, &st) ? -errno : 0) || (rc = S_ISDIR(st.st_mode) ? 0 : -ENOTDIR)) {
        rc = util_fail(err, errlen, rc, "%s: cannot use as the checkpoint directory: %s", dir, strerror(-rc));
        goto out;
    }
    if (!(s.ctx = zmq_ctx_new())) {
        rc = util_fail(err, errlen, -errno, "cannot create a ZeroMQ context: %s", zmq_strerror(errno));
        goto out;
    }
    /* The ZAP handler is bound before the ROUTER: without one libzmq lets any key in. */
    if (!(s.zap = zmq_socket(s.ctx, ZMQ_REP)) || set_int(s.zap, ZMQ_LINGER, 0) || zmq_bind(s.zap, ZAP_ENDPOINT)) {
        rc = util_fail(err, errlen, -errno, "cannot start the ZAP handler: %s", zmq_strerror(errno));
        goto out;
    }
    int64_t maxmsg = RMT_FRAME_MAX;
    if (!(s.router = zmq_socket(s.ctx, ZMQ_ROUTER)) || set_int(s.router, ZMQ_LINGER, 0) ||
        set_int(s.router, ZMQ_ROUTER_MANDATORY, 1) || set_int(s.router, ZMQ_RCVHWM, RMT_HWM) ||
        zmq_setsockopt(s.router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
        set_int(s.router, ZMQ_CURVE_SERVER, 1) || zmq_setsockopt(s.router, ZMQ_CURVE_SECRETKEY, sec, RMT_KEY_Z85) ||
        zmq_setsockopt(s.router, ZMQ_ZAP_DOMAIN, "ctitan", 6)) {
        rc = util_fail(err, errlen, -errno, "cannot set up the server socket: %s", zmq_strerror(errno));
        goto out;
    }
    if (zmq_bind(s.router, listen) != 0) {
        rc = util_fail(err, errlen, -errno, "cannot bind %s: %s", listen, zmq_strerror(errno));
        goto out;
    }
    char ep[512];
    size_t epn = sizeof ep;
    if (zmq_getsockopt(s.router, ZMQ_LAST_ENDPOINT, ep, &epn) != 0)
        snprintf(ep, sizeof ep, "%s", listen);
    srv_log(&s, "listening on %s", ep);
    srv_log(&s, "server key %s; %d client key%s from %s; writing under %s", pub, s.n_allowed,
            s.n_allowed == 1 ? "" : "s", allow_path, dir);
    while (!*stop) {
        zmq_pollitem_t it[2] = {{.socket = s.router, .events = ZMQ_POLLIN}, {.socket = s.zap, .events = ZMQ_POLLIN}};
        int k = zmq_poll(it, 2, RMT_POLL_MS);
        if (k < 0 && errno != EINTR) {
            rc = util_fail(err, errlen, -errno, "poll: %s", zmq_strerror(errno));
            break;
        }
        if (k > 0 && (it[1].revents & ZMQ_POLLIN))
            zap_serve(&s);
        /* a bounded batch, so that handshakes (ZAP) and the stop flag are never starved */
        for (int i = 0; k > 0 && i < 64 && !*stop; i++) {
            uint32_t ev = 0;
            size_t evn = sizeof ev;
            if (zmq_getsockopt(s.router, ZMQ_EVENTS, &ev, &evn) != 0 || !(ev & ZMQ_POLLIN))
                break;
            serve_one(&s);
        }
        expire(&s); /* after the queue is read, so a long commit never makes others look silent */
    }
    if (!rc && s.refused_repeats)
        srv_log(&s, "refused %d more connection%s from %s", s.refused_repeats, s.refused_repeats > 1 ? "s" : "",
                s.last_refused);
    for (int i = 0; i < RMT_MAX_PEERS; i++)
        if (s.peers[i]) {
            if (s.peers[i]->w)
                peer_fail(&s, s.peers[i], ECANCELED, "the server is stopping");
            peer_free(&s, s.peers[i]);
        }
    if (!rc)
        srv_log(&s, "stopped");
out:
    if (s.router)
        zmq_close(s.router);
    if (s.zap)
        zmq_close(s.zap);
    if (s.ctx)
        while (zmq_ctx_term(s.ctx) != 0 && errno == EINTR) {}
    free(s.allowed);
    memset(sec, 0, sizeof sec);
    return rc;
}

int rmt_serve(const char *listen, const char *dir, const char *secret_key_path, const char *allow_path,
              volatile sig_atomic_t *stop, FILE *log, char *err, size_t errlen)
{
    return rmt_serve_idle(listen, dir, secret_key_path, allow_path, RMT_IDLE_TIMEOUT_MS, stop, log, err, errlen);
}

/* ---- client ---- */

struct rmt_client {
    void *ctx, *sock, *mon;
    char endpoint[512];
    char pub[RMT_KEY_Z85 + 1];   /* ours, for "add this key" messages */
    char sec[RMT_KEY_Z85 + 1], server[RMT_KEY_Z85 + 1]; /* to open a new socket */
    unsigned generation;         /* of the socket: names its monitor */
    uint64_t seq;                /* of the last message sent */
    uint64_t begin_seq;          /* of the current checkpoint's begin */
    int open;                    /* the server accepted a begin and no commit yet */
    int dirty;                   /* the server may hold a checkpoint of ours: abort before a begin */
    int stuck;                   /* a send timed out: the next begin starts on a new socket */
    /* what the monitor said */
    int tcp_connected, handshake_ok, auth_failed, proto_failed, disconnected;
    uint16_t fail_event;
    uint32_t fail_value;
};

/* Reads the monitor's events (frame 1: uint16 event, uint32 value; frame 2: endpoint). */
static void mon_drain(rmt_client_t *c)
{
    for (;;) {
        zmq_msg_t f[2];
        int n;
        int rc = recv_frames(c->mon, f, 2, &n, ZMQ_DONTWAIT);
        if (!rc && zmq_msg_size(&f[0]) >= 6) {
            uint16_t ev;
            uint32_t val;
            memcpy(&ev, zmq_msg_data(&f[0]), 2);
            memcpy(&val, (uint8_t *)zmq_msg_data(&f[0]) + 2, 4);
            switch (ev) {
            case ZMQ_EVENT_CONNECTED: c->tcp_connected = 1; break;
            case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
                c->handshake_ok = 1, c->auth_failed = c->proto_failed = c->disconnected = 0;
                break;
            case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: c->auth_failed = 1, c->fail_value = val; break;
            case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
            case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                c->proto_failed = 1, c->fail_event = ev, c->fail_value = val;
                break;
            case ZMQ_EVENT_DISCONNECTED: c->disconnected = 1; break;
            }
        }
        close_frames(f, 2);
        if (rc)
            return;
    }
}

/* An error about the connection itself, from what the monitor saw (0 when nothing wrong). */
static int conn_error(rmt_client_t *c, char *err, size_t errlen)
{
    if (c->auth_failed)
        return util_fail(err, errlen, -EACCES, "the checkpointd at %s refused our key (not in its allow list; "
                         "status %u): add %s to its --allow file", c->endpoint, c->fail_value, c->pub);
    if (c->proto_failed && !c->handshake_ok) {
        char why[128];
        if (c->fail_event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
            snprintf(why, sizeof why, "ZMTP protocol error 0x%x", c->fail_value);
        else /* the value is an errno */
            snprintf(why, sizeof why, "the connection ended: %s", strerror((int)c->fail_value));
        return util_fail(err, errlen, -EPROTO, "the CURVE handshake with %s failed (%s): is the server public key "
                         "we were given the one of that checkpointd?", c->endpoint, why);
    }
    return 0;
}

static int timeout_error(rmt_client_t *c, const char *what, int timeout_ms, char *err, size_t errlen)
{
    int rc = conn_error(c, err, errlen);
    if (rc)
        return rc;
    if (!c->tcp_connected)
        return util_fail(err, errlen, -ETIMEDOUT, "no checkpointd at %s: could not connect within %d ms",
                         c->endpoint, timeout_ms);
    if (!c->handshake_ok)
        return util_fail(err, errlen, -ETIMEDOUT, "connected to %s but the CURVE handshake did not finish within "
                         "%d ms (not a checkpointd, or a wrong server public key?)", c->endpoint, timeout_ms);
    return util_fail(err, errlen, -ETIMEDOUT, "the checkpointd at %s did not answer %s within %d ms%s", c->endpoint,
                     what, timeout_ms, c->disconnected ? " (the connection was lost)" : "");
}

/* Handles one reply. Returns 1 when it is the answer to seq `want` (ok; text into out), a
 * negative errno for an error reply about the current checkpoint (err says why), 0 for a
 * stale reply (to an earlier checkpoint) or one still to wait past. */
static int take_reply(rmt_client_t *c, uint64_t want, char *out, size_t outlen, char *err, size_t errlen)
{
    zmq_msg_t f[2];
    int n;
    int rc = recv_frames(c->sock, f, 2, &n, ZMQ_DONTWAIT);
    if (rc) {
        close_frames(f, 2);
        return rc == -EAGAIN ? 0 : rc;
    }
    hdr_t h;
    char perr[512];
    rc = n > 2 ? util_fail(perr, sizeof perr, -EBADMSG, "%d frames", n)
               : hdr_parse(zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), n == 2, &h, perr, sizeof perr);
    if (!rc && h.type != T_REPLY)
        rc = util_fail(perr, sizeof perr, -EBADMSG, "a '%s' message where a reply was expected", type_names[h.type]);
    if (rc) {
        rc = util_fail(err, errlen, -EPROTO, "the checkpointd at %s sent a bad message: %s", c->endpoint, perr);
    } else if (h.seq < c->begin_seq) {
        rc = 0;
    } else if (!h.ok) {
        char shown[1024];
        size_t k = h.text_len < sizeof shown - 1 ? h.text_len : sizeof shown - 1;
        memcpy(shown, h.text, k); /* the server's own message: shown as it is, cut to size */
        shown[k] = '\0';
        for (size_t i = 0; i < k; i++)
            if ((unsigned char)shown[i] < 0x20)
                shown[i] = ' ';
        int code = h.code > 0 && h.code < 4096 ? (int)h.code : EIO;
        rc = util_fail(err, errlen, -code, "the checkpointd at %s refused: %s", c->endpoint, shown);
    } else if (h.seq == want) {
        if (out && outlen) {
            size_t k = h.text_len < outlen - 1 ? h.text_len : outlen - 1;
            memcpy(out, h.text, k);
            out[k] = '\0';
        }
        rc = 1;
    }
    close_frames(f, 2);
    return rc;
}

/* Waits up to timeout_ms for the answer to seq want; 0 or -errno. */
static int wait_reply(rmt_client_t *c, uint64_t want, const char *what, int timeout_ms, char *out, size_t outlen,
                      char *err, size_t errlen)
{
    double deadline = util_now() + (timeout_ms > 0 ? timeout_ms : 0) / 1000.0;
    for (;;) {
        int rc = take_reply(c, want, out, outlen, err, errlen);
        if (rc)
            return rc > 0 ? 0 : rc;
        mon_drain(c);
        if ((rc = conn_error(c, err, errlen)))
            return rc;
        double left = deadline - util_now();
        if (left <= 0)
            return timeout_error(c, what, timeout_ms, err, errlen);
        zmq_pollitem_t it[2] = {{.socket = c->sock, .events = ZMQ_POLLIN}, {.socket = c->mon, .events = ZMQ_POLLIN}};
        if (zmq_poll(it, 2, (long)(left * 1000) + 1) < 0 && errno != EINTR)
            return util_fail(err, errlen, -errno, "poll: %s", zmq_strerror(errno));
    }
}

static int client_send(rmt_client_t *c, hdr_out_t *h, const void *payload, size_t n, char *err, size_t errlen)
{
    h->seq = ++c->seq;
    int rc = send_msg(c->sock, NULL, 0, h, payload, n, 0);
    if (rc == -EAGAIN)
        c->stuck = 1;
    if (rc == -EAGAIN)
        return util_fail(err, errlen, -ETIMEDOUT, "the checkpointd at %s took no data for %d s%s", c->endpoint,
                         RMT_SEND_TIMEOUT_MS / 1000, c->disconnected ? " (the connection was lost)" : "");
    if (rc)
        return util_fail(err, errlen, rc, "cannot send to %s: %s", c->endpoint, zmq_strerror(-rc));
    return 0;
}

/* Closes the socket and its monitor. linger: whether queued messages may still go out. */
static void client_close(rmt_client_t *c, bool linger)
{
    if (c->sock) {
        if (!linger)
            set_int(c->sock, ZMQ_LINGER, 0);
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->sock);
    }
    if (c->mon)
        zmq_close(c->mon);
    c->sock = c->mon = NULL;
}

/* A new socket connected to the server, with a monitor; the old one, if any, closed first
 * (nothing it queued goes out: a refused handshake may never be retried on it by libzmq). */
static int client_open(rmt_client_t *c, char *err, size_t errlen)
{
    client_close(c, false);
    c->tcp_connected = c->handshake_ok = c->auth_failed = c->proto_failed = c->disconnected = 0;
    c->open = c->dirty = c->stuck = 0;
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://monitor-%u", ++c->generation);
    int64_t maxmsg = RMT_HDR_MAX; /* the server only ever sends headers */
    if (!(c->sock = zmq_socket(c->ctx, ZMQ_DEALER)) || set_int(c->sock, ZMQ_LINGER, RMT_LINGER_MS) ||
        set_int(c->sock, ZMQ_SNDHWM, RMT_HWM) || set_int(c->sock, ZMQ_SNDTIMEO, RMT_SEND_TIMEOUT_MS) ||
        set_int(c->sock, ZMQ_RECONNECT_IVL, RMT_RECONNECT_MS) ||
        set_int(c->sock, ZMQ_HEARTBEAT_IVL, 5000) || set_int(c->sock, ZMQ_HEARTBEAT_TIMEOUT, 30000) ||
        zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, c->server, RMT_KEY_Z85) ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, c->pub, RMT_KEY_Z85) ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, c->sec, RMT_KEY_Z85))
        return util_fail(err, errlen, -errno, "cannot set up a client socket: %s", zmq_strerror(errno));
    /* the monitor is how a refused key is told apart from a server that is not there */
    if (zmq_socket_monitor(c->sock, mon,
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0 ||
        !(c->mon = zmq_socket(c->ctx, ZMQ_PAIR)) || set_int(c->mon, ZMQ_LINGER, 0) || zmq_connect(c->mon, mon) != 0)
        return util_fail(err, errlen, -errno, "cannot monitor the client socket: %s", zmq_strerror(errno));
    if (zmq_connect(c->sock, c->endpoint) != 0)
        return util_fail(err, errlen, -errno, "cannot connect %s: %s", c->endpoint, zmq_strerror(errno));
    return 0;
}

int rmt_client_new(rmt_client_t **out, const char *endpoint, const char *server_pub_path,
                   const char *client_secret_path, char *err, size_t errlen)
{
    *out = NULL;
    rmt_client_t *c = calloc(1, sizeof *c);
    if (!c)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    int rc;
    if ((rc = rmt_key_load(server_pub_path, c->server, err, errlen)) ||
        (rc = load_secret(client_secret_path, c->sec, c->pub, err, errlen)))
        goto out;
    if (!(c->ctx = zmq_ctx_new())) {
        rc = util_fail(err, errlen, -errno, "cannot create a ZeroMQ context: %s", zmq_strerror(errno));
        goto out;
    }
    rc = client_open(c, err, errlen);
out:
    if (rc)
        rmt_client_destroy(&c);
    *out = c;
    return rc;
}

void rmt_client_destroy(rmt_client_t **pc)
{
    rmt_client_t *c = *pc;
    if (!c)
        return;
    if (c->mon)
        mon_drain(c);
    bool abort = c->sock && c->dirty && c->handshake_ok && !c->stuck;
    if (abort) { /* so the server drops it now, not after its idle timeout */
        hdr_out_t h = {.type = T_ABORT, .seq = ++c->seq};
        send_msg(c->sock, NULL, 0, &h, NULL, 0, ZMQ_DONTWAIT);
    }
    client_close(c, abort); /* a socket that never got through has nothing worth waiting for */
    if (c->ctx)
        while (zmq_ctx_term(c->ctx) != 0 && errno == EINTR) {}
    memset(c->sec, 0, sizeof c->sec);
    free(c);
    *pc = NULL;
}

int rmt_client_begin(rmt_client_t *c, const char *job, int keep, const ckpt_index_t *plan, int timeout_ms,
                     char *err, size_t errlen)
{
    int rc;
    mon_drain(c);
    if (c->auth_failed || c->proto_failed || c->stuck) { /* a new connection rather than wait on this one */
        if ((rc = client_open(c, err, errlen)))
            return rc;
    } else if (c->dirty) { /* an unfinished one, or a begin that was not answered: drop it on the server */
        hdr_out_t a = {.type = T_ABORT};
        if ((rc = client_send(c, &a, NULL, 0, err, errlen)))
            return rc;
    }
    c->open = 0;
    c->dirty = 1;
    uint8_t *buf = NULL;
    size_t len = 0;
    if ((rc = ckpt_index_encode(plan, &buf, &len)))
        return util_fail(err, errlen, rc, "cannot encode the index of step %" PRId64 ": %s", plan->step,
                         strerror(-rc));
    if (len > RMT_FRAME_MAX) {
        free(buf);
        return util_fail(err, errlen, -EMSGSIZE, "the index of step %" PRId64 " is %zu bytes, at most %u can be "
                         "sent", plan->step, len, RMT_FRAME_MAX);
    }
    hdr_out_t h = {.type = T_BEGIN, .job = job, .keep = keep < 0 ? 0 : keep, .step = plan->step};
    rc = client_send(c, &h, buf, len, err, errlen);
    free(buf);
    if (rc)
        return rc;
    c->begin_seq = h.seq;
    char what[64];
    snprintf(what, sizeof what, "the begin of step %" PRId64, plan->step);
    if ((rc = wait_reply(c, h.seq, what, timeout_ms, NULL, 0, err, errlen)))
        return rc;
    c->open = 1;
    return 0;
}

int rmt_client_write(rmt_client_t *c, uint32_t file, uint64_t offset, const void *data, size_t n, char *err,
                     size_t errlen)
{
    if (!c->open)
        return util_fail(err, errlen, -EINVAL, "no checkpoint is open on %s (begin first; an error ends one)",
                         c->endpoint);
    const uint8_t *p = data;
    do {
        /* an error the server sent about an earlier piece ends the checkpoint here */
        int rc = take_reply(c, 0, NULL, 0, err, errlen);
        if (rc < 0) {
            c->open = 0;
            return rc;
        }
        if (rc == 0) {
            mon_drain(c);
            size_t k = n < RMT_DATA_FRAME ? n : RMT_DATA_FRAME;
            hdr_out_t h = {.type = T_DATA, .file = file, .offset = offset};
            if ((rc = client_send(c, &h, p, k, err, errlen))) {
                c->open = 0;
                return rc;
            }
            p += k, offset += k, n -= k;
        }
    } while (n);
    return 0;
}

int rmt_client_commit(rmt_client_t *c, char *path, size_t pathlen, int timeout_ms, char *err, size_t errlen)
{
    if (!c->open)
        return util_fail(err, errlen, -EINVAL, "no checkpoint is open on %s (begin first; an error ends one)",
                         c->endpoint);
    c->open = 0;
    hdr_out_t h = {.type = T_COMMIT};
    int rc = client_send(c, &h, NULL, 0, err, errlen);
    if (!rc)
        rc = wait_reply(c, h.seq, "the commit", timeout_ms, path, pathlen, err, errlen);
    if (!rc || rc != -ETIMEDOUT)
        c->dirty = 0; /* answered: the server holds nothing of ours */
    return rc;
}
