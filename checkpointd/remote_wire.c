/* Remote checkpointd's wire (see remote_int.h): its header frames as a protocol of
 * ipc/codec.h, and sending and receiving multipart ZeroMQ messages. The server and the client
 * both speak through here. */
#include "checkpointd/remote_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/codec.h"
#include "ipc/util.h"

enum { H_SEQ, H_JOB, H_KEEP, H_REPLACE, H_STEP, H_FILE, H_OFFSET, H_OK, H_CODE, H_TEXT, H_SIZE, H_COUNT };

/* Encoded in this order, after "v" and "type". */
static const codec_field_t fields[H_COUNT] = {
    [H_SEQ]    = {"seq",    CODEC_U64,        offsetof(rmt_hdr_t, seq), 0},
    [H_JOB]    = {"job",    CODEC_STR,        offsetof(rmt_hdr_t, job), offsetof(rmt_hdr_t, job_len)},
    [H_KEEP]   = {"keep",   CODEC_I32_NONNEG, offsetof(rmt_hdr_t, keep), 0},
    [H_REPLACE] = {"replace", CODEC_BOOL,     offsetof(rmt_hdr_t, replace), 0},
    [H_STEP]   = {"step",   CODEC_U64,        offsetof(rmt_hdr_t, step), 0},
    [H_FILE]   = {"file",   CODEC_U32,        offsetof(rmt_hdr_t, file), 0},
    [H_OFFSET] = {"offset", CODEC_U64,        offsetof(rmt_hdr_t, offset), 0},
    [H_OK]     = {"ok",     CODEC_BOOL,       offsetof(rmt_hdr_t, ok), 0},
    [H_CODE]   = {"code",   CODEC_U64,        offsetof(rmt_hdr_t, code), 0},
    [H_TEXT]   = {"text",   CODEC_STR,        offsetof(rmt_hdr_t, text), offsetof(rmt_hdr_t, text_len)},
    [H_SIZE]   = {"size",   CODEC_U64,        offsetof(rmt_hdr_t, size), 0},
};

#define HB(k) (1u << (k))
#define PAYLOAD 1u /* codec_type_t.flags: a payload frame follows the header */

/* One entry per type id up to RMT_TYPE_END, so that any type a header can hold has its
 * fields and its payload flag here. */
static const codec_type_t types[RMT_TYPE_END] = {
    [RMT_BEGIN]  = {"begin",  HB(H_SEQ) | HB(H_JOB) | HB(H_KEEP) | HB(H_REPLACE) | HB(H_STEP), PAYLOAD},
    [RMT_DATA]   = {"data",   HB(H_SEQ) | HB(H_FILE) | HB(H_OFFSET), PAYLOAD},
    [RMT_COMMIT] = {"commit", HB(H_SEQ), 0},
    [RMT_ABORT]  = {"abort",  HB(H_SEQ), 0},
    [RMT_REPLY]  = {"reply",  HB(H_SEQ) | HB(H_OK) | HB(H_CODE) | HB(H_TEXT), 0},
    [RMT_LIST]   = {"list",   HB(H_SEQ) | HB(H_JOB), 0},
    [RMT_FETCH]  = {"fetch",  HB(H_SEQ) | HB(H_JOB) | HB(H_STEP), 0},
    [RMT_PART]   = {"part",   HB(H_SEQ) | HB(H_FILE) | HB(H_OFFSET) | HB(H_SIZE), PAYLOAD},
};

static const codec_proto_t proto = {
    .name = "remote checkpoint protocol",
    .noun = "header",
    .version = RMT_VERSION,
    .max_bytes = RMT_HDR_MAX,
    .flat = true,
    .says_is_missing = true,
    .types = types,
    .n_types = RMT_TYPE_END,
    .fields = fields,
    .n_fields = H_COUNT,
};

const char *rmt_type_name(rmt_type_t t)
{
    return t > RMT_NONE && t < RMT_TYPE_END ? types[t].name : "?";
}

bool rmt_has_payload(rmt_type_t t)
{
    return t > RMT_NONE && t < RMT_TYPE_END && (types[t].flags & PAYLOAD);
}

int rmt_hdr_decode(const void *buf, size_t len, int payload, rmt_hdr_t *h, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    int type;
    int rc = codec_decode(&proto, buf, len, &type, h, err, errlen);
    h->type = (rmt_type_t)type;
    if (rc)
        return rc;
    if (!payload != !rmt_has_payload(h->type))
        return util_fail(err, errlen, -EBADMSG, "%s: %s", types[type].name,
                         payload ? "no payload frame expected" : "the payload frame is missing");
    return 0;
}

int rmt_hdr_encode(const rmt_hdr_t *h, uint8_t **buf, size_t *len)
{
    return codec_encode(&proto, (int)h->type, h, buf, len);
}

int rmt_send(void *sock, const void *to, size_t tolen, const rmt_hdr_t *h, const void *payload, size_t n, int flags)
{
    uint8_t *buf;
    size_t len;
    int rc = rmt_hdr_encode(h, &buf, &len);
    if (rc)
        return rc;
    bool more = rmt_has_payload(h->type);
    if (to && zmq_send(sock, to, tolen, ZMQ_SNDMORE | flags) < 0)
        rc = -errno;
    /* the later frames of a message never wait on the high-water mark: only the first does */
    if (!rc && zmq_send(sock, buf, len, (more ? ZMQ_SNDMORE : 0) | flags) < 0)
        rc = -errno;
    if (!rc && more && zmq_send(sock, payload, n, flags) < 0)
        rc = -errno;
    free(buf);
    return rc;
}

int rmt_recv_frames(void *sock, zmq_msg_t *f, int max, int *n, int flags)
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

void rmt_close_frames(zmq_msg_t *f, int max)
{
    for (int i = 0; i < max; i++)
        zmq_msg_close(&f[i]);
}

int rmt_set_int(void *sock, int opt, int v)
{
    return zmq_setsockopt(sock, opt, &v, sizeof v) == 0 ? 0 : -errno;
}
