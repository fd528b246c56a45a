/* Control-plane message codec (see msg.h): msg_t <-> one msgpack map, as the control plane's
 * tables for ipc/codec.h, which does the encoding and every check of the decoding. */
#include "ipc/msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/codec.h"

typedef enum {
    F_ROLE, F_RANK, F_REPLICA, F_PID, F_STEP, F_PROGRESS, F_LOSS, F_GRAD_NORM, F_SCALE,
    F_LR, F_T_F, F_T_B, F_T_W, F_T_BUSY, F_T_WAIT, F_OK, F_TEXT, F_MEM, F_DATA, F_COUNT
} field_t;

/* Encoded in this order. */
static const codec_field_t fields[F_COUNT] = {
    [F_ROLE]      = {"role",      CODEC_CHARS,      offsetof(msg_t, role), MSG_ROLE_MAX},
    [F_RANK]      = {"rank",      CODEC_I32_NONNEG, offsetof(msg_t, rank), 0},
    [F_REPLICA]   = {"replica",   CODEC_I32_NONNEG, offsetof(msg_t, replica), 0},
    [F_PID]       = {"pid",       CODEC_I64,        offsetof(msg_t, pid), 0},
    [F_STEP]      = {"step",      CODEC_I64_NONNEG, offsetof(msg_t, step), 0},
    [F_PROGRESS]  = {"progress",  CODEC_U64,        offsetof(msg_t, progress), 0},
    [F_LOSS]      = {"loss",      CODEC_F64,        offsetof(msg_t, loss), 0},
    [F_GRAD_NORM] = {"grad_norm", CODEC_F64,        offsetof(msg_t, grad_norm), 0},
    [F_SCALE]     = {"scale",     CODEC_F64,        offsetof(msg_t, scale), 0},
    [F_LR]        = {"lr",        CODEC_F64,        offsetof(msg_t, lr), 0},
    [F_T_F]       = {"t_f",       CODEC_F64,        offsetof(msg_t, t_f), 0},
    [F_T_B]       = {"t_b",       CODEC_F64,        offsetof(msg_t, t_b), 0},
    [F_T_W]       = {"t_w",       CODEC_F64,        offsetof(msg_t, t_w), 0},
    [F_T_BUSY]    = {"t_busy",    CODEC_F64,        offsetof(msg_t, t_busy), 0},
    [F_T_WAIT]    = {"t_wait",    CODEC_F64,        offsetof(msg_t, t_wait), 0},
    [F_OK]        = {"ok",        CODEC_BOOL,       offsetof(msg_t, ok), 0},
    [F_TEXT]      = {"text",      CODEC_TEXT,       offsetof(msg_t, text), offsetof(msg_t, text_len)},
    [F_MEM]       = {"mem",       CODEC_U64,        offsetof(msg_t, mem), 0},
    [F_DATA]      = {"data",      CODEC_DATA,       offsetof(msg_t, data), offsetof(msg_t, data_len)},
};

#define B(f) (1u << (f))
#define WHO (B(F_ROLE) | B(F_RANK) | B(F_REPLICA))

/* Mirrors the comments on msg_type_t in msg.h. */
static const codec_type_t types[MSG_TYPE_END] = {
    [MSG_HELLO]     = {"hello",     WHO | B(F_PID), 0},
    [MSG_CONFIG]    = {"config",    B(F_TEXT) | B(F_STEP), 0},
    [MSG_READY]     = {"ready",     WHO | B(F_PID), 0},
    [MSG_STEP]      = {"step",      B(F_STEP), 0},
    [MSG_STEP_DONE] = {"step_done", B(F_STEP) | B(F_LOSS) | B(F_T_F) | B(F_T_B) | B(F_T_W) |
                                    B(F_T_BUSY) | B(F_T_WAIT) | B(F_MEM), 0},
    [MSG_REDUCE]    = {"reduce",    B(F_STEP), 0},
    [MSG_REDUCED]   = {"reduced",   B(F_STEP) | B(F_T_BUSY) | B(F_GRAD_NORM), 0},
    [MSG_UPDATE]    = {"update",    B(F_STEP) | B(F_GRAD_NORM) | B(F_SCALE), 0},
    [MSG_UPDATED]   = {"updated",   B(F_STEP) | B(F_LR) | B(F_T_BUSY) | B(F_GRAD_NORM), 0},
    [MSG_HEARTBEAT] = {"heartbeat", WHO | B(F_PID) | B(F_PROGRESS), 0},
    [MSG_ERROR]     = {"error",     WHO | B(F_PID) | B(F_TEXT), 0},
    [MSG_STOP]      = {"stop",      0, 0},
    [MSG_SWAP]      = {"swap",      B(F_TEXT), 0},
    [MSG_REPLY]     = {"reply",     B(F_OK) | B(F_TEXT), 0},
    [MSG_STATUS]    = {"status",    0, 0},
    [MSG_SNAPSHOT]  = {"snapshot",  B(F_STEP), 0},
    [MSG_SNAPPED]   = {"snapped",   B(F_STEP) | B(F_T_BUSY), 0},
    [MSG_SAVE]      = {"save",      B(F_STEP) | B(F_OK), 0},
    [MSG_SAVED]     = {"saved",     B(F_STEP) | B(F_OK) | B(F_TEXT) | B(F_T_BUSY) | B(F_PROGRESS), 0},
    [MSG_NCCL]      = {"nccl",      B(F_DATA), 0},
    [MSG_LOAD]      = {"load",      B(F_TEXT), 0},
    [MSG_LOADED]    = {"loaded",    B(F_OK) | B(F_STEP) | B(F_TEXT) | B(F_DATA), 0},
    [MSG_SWAP_ARGV] = {"swap_argv", B(F_DATA), 0},
    [MSG_ABORTED]   = {"aborted",   B(F_STEP), 0},
    [MSG_REWIND]    = {"rewind",    B(F_STEP) | B(F_OK) | B(F_DATA), 0},
    [MSG_LOST]      = {"lost",      WHO | B(F_PID) | B(F_TEXT), 0},
    [MSG_SAVE_PART] = {"save_part", B(F_STEP) | B(F_TEXT), 0},
    [MSG_WRITTEN]   = {"written",   B(F_STEP) | B(F_OK) | B(F_TEXT) | B(F_T_BUSY) | B(F_PROGRESS), 0},
    [MSG_COMMIT]    = {"commit",    B(F_STEP) | B(F_OK) | B(F_TEXT), 0},
    [MSG_START]     = {"start",     B(F_STEP) | B(F_OK) | B(F_TEXT) | B(F_DATA), 0},
    [MSG_TRACE]     = {"trace",     B(F_STEP) | B(F_DATA), 0},
    [MSG_REMAP]     = {"remap",     B(F_STEP), 0},
    [MSG_REMAPPED]  = {"remapped",  B(F_STEP) | B(F_T_BUSY), 0},
    [MSG_GIVEN_UP]  = {"given_up",  B(F_TEXT), 0},
};

static const codec_proto_t proto = {
    .name = "message",
    .noun = "message",
    .version = MSG_VERSION,
    .max_bytes = MSG_MAX_BYTES,
    .types = types,
    .n_types = MSG_TYPE_END,
    .fields = fields,
    .n_fields = F_COUNT,
};

const char *msg_type_name(msg_type_t t)
{
    if ((int)t <= 0 || t >= MSG_TYPE_END) return NULL;
    return types[t].name;
}

void msg_clear(msg_t *m)
{
    if (!m) return;
    free(m->text);
    free(m->data);
    memset(m, 0, sizeof *m);
}

int msg_set_text(msg_t *m, const char *s)
{
    size_t n = strlen(s);
    char *t = malloc(n + 1);
    if (!t) return -ENOMEM;
    memcpy(t, s, n + 1);
    free(m->text);
    m->text = t;
    m->text_len = n;
    return 0;
}

int msg_set_data(msg_t *m, const void *p, size_t n)
{
    uint8_t *d = malloc(n ? n : 1);
    if (!d) return -ENOMEM;
    if (n) memcpy(d, p, n);
    free(m->data);
    m->data = d;
    m->data_len = n;
    return 0;
}

int msg_encode(const msg_t *m, uint8_t **buf, size_t *len)
{
    return codec_encode(&proto, (int)m->type, m, buf, len);
}

int msg_decode(const void *buf, size_t len, msg_t *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int type;
    int rc = codec_decode(&proto, buf, len, &type, m, err, errlen);
    if (rc)
        msg_clear(m);
    else
        m->type = (msg_type_t)type;
    return rc;
}
