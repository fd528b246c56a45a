/* Control-plane message codec (see msg.h): msg_t <-> one msgpack map. Decoding first walks
 * the raw bytes without allocating (bounds, nesting depth, trailing bytes), so msgpack-c only
 * ever sees well-formed input whose declared sizes are backed by real bytes. */
#include "ipc/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"

/* Containers nested deeper than this are rejected before msgpack-c runs; its own parser has
 * a fixed stack of MSGPACK_EMBED_STACK_SIZE (32) levels. Our maps are flat. */
#define MSG_MAX_DEPTH 16

typedef enum {
    K_I32_NONNEG,
    K_I64,
    K_I64_NONNEG,
    K_U64,
    K_F64,
    K_BOOL,
    K_TEXT,
    K_ROLE,
    K_DATA,
} kind_t;

typedef enum {
    F_ROLE, F_RANK, F_REPLICA, F_PID, F_STEP, F_PROGRESS, F_LOSS, F_GRAD_NORM, F_SCALE,
    F_LR, F_T_F, F_T_B, F_T_W, F_T_BUSY, F_T_WAIT, F_OK, F_TEXT, F_MEM, F_DATA, F_COUNT
} field_t;

typedef struct {
    const char *key;
    kind_t kind;
    size_t off; /* in msg_t */
} field_desc_t;

static const field_desc_t fields[F_COUNT] = {
    [F_ROLE]      = {"role",      K_ROLE,       offsetof(msg_t, role)},
    [F_RANK]      = {"rank",      K_I32_NONNEG, offsetof(msg_t, rank)},
    [F_REPLICA]   = {"replica",   K_I32_NONNEG, offsetof(msg_t, replica)},
    [F_PID]       = {"pid",       K_I64,        offsetof(msg_t, pid)},
    [F_STEP]      = {"step",      K_I64_NONNEG, offsetof(msg_t, step)},
    [F_PROGRESS]  = {"progress",  K_U64,        offsetof(msg_t, progress)},
    [F_LOSS]      = {"loss",      K_F64,        offsetof(msg_t, loss)},
    [F_GRAD_NORM] = {"grad_norm", K_F64,        offsetof(msg_t, grad_norm)},
    [F_SCALE]     = {"scale",     K_F64,        offsetof(msg_t, scale)},
    [F_LR]        = {"lr",        K_F64,        offsetof(msg_t, lr)},
    [F_T_F]       = {"t_f",       K_F64,        offsetof(msg_t, t_f)},
    [F_T_B]       = {"t_b",       K_F64,        offsetof(msg_t, t_b)},
    [F_T_W]       = {"t_w",       K_F64,        offsetof(msg_t, t_w)},
    [F_T_BUSY]    = {"t_busy",    K_F64,        offsetof(msg_t, t_busy)},
    [F_T_WAIT]    = {"t_wait",    K_F64,        offsetof(msg_t, t_wait)},
    [F_OK]        = {"ok",        K_BOOL,       offsetof(msg_t, ok)},
    [F_TEXT]      = {"text",      K_TEXT,       offsetof(msg_t, text)},
    [F_MEM]       = {"mem",       K_U64,        offsetof(msg_t, mem)},
    [F_DATA]      = {"data",      K_DATA,       offsetof(msg_t, data)},
};

#define B(f) (1u << (f))
#define WHO (B(F_ROLE) | B(F_RANK) | B(F_REPLICA))

/* Mirrors the comments on msg_type_t in msg.h. */
static const struct {
    const char *name;
    uint32_t fields;
} types[MSG_TYPE_END] = {
    [MSG_HELLO]     = {"hello",     WHO | B(F_PID)},
    [MSG_CONFIG]    = {"config",    B(F_TEXT) | B(F_STEP)},
    [MSG_READY]     = {"ready",     WHO | B(F_PID)},
    [MSG_STEP]      = {"step",      B(F_STEP)},
    [MSG_STEP_DONE] = {"step_done", B(F_STEP) | B(F_LOSS) | B(F_T_F) | B(F_T_B) | B(F_T_W) |
                                    B(F_T_BUSY) | B(F_T_WAIT) | B(F_MEM)},
    [MSG_REDUCE]    = {"reduce",    B(F_STEP)},
    [MSG_REDUCED]   = {"reduced",   B(F_STEP) | B(F_T_BUSY) | B(F_GRAD_NORM)},
    [MSG_UPDATE]    = {"update",    B(F_STEP) | B(F_GRAD_NORM) | B(F_SCALE)},
    [MSG_UPDATED]   = {"updated",   B(F_STEP) | B(F_LR) | B(F_T_BUSY)},
    [MSG_HEARTBEAT] = {"heartbeat", WHO | B(F_PID) | B(F_PROGRESS)},
    [MSG_ERROR]     = {"error",     WHO | B(F_PID) | B(F_TEXT)},
    [MSG_STOP]      = {"stop",      0},
    [MSG_SWAP]      = {"swap",      B(F_TEXT)},
    [MSG_REPLY]     = {"reply",     B(F_OK) | B(F_TEXT)},
    [MSG_STATUS]    = {"status",    0},
    [MSG_SNAPSHOT]  = {"snapshot",  B(F_STEP)},
    [MSG_SNAPPED]   = {"snapped",   B(F_STEP) | B(F_T_BUSY)},
    [MSG_SAVE]      = {"save",      B(F_STEP)},
    [MSG_SAVED]     = {"saved",     B(F_STEP) | B(F_OK) | B(F_TEXT) | B(F_T_BUSY) | B(F_PROGRESS)},
    [MSG_NCCL]      = {"nccl",      B(F_DATA)},
    [MSG_LOAD]      = {"load",      B(F_TEXT)},
    [MSG_LOADED]    = {"loaded",    B(F_OK) | B(F_STEP) | B(F_TEXT) | B(F_DATA)},
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

/* ---- encoding ---- */

static int pack_key(msgpack_packer *pk, const char *k)
{
    size_t n = strlen(k);
    int rc = msgpack_pack_str(pk, n);
    return rc ? rc : msgpack_pack_str_body(pk, k, n);
}

static int pack_str(msgpack_packer *pk, const char *s, size_t n)
{
    int rc = msgpack_pack_str(pk, n);
    return rc ? rc : msgpack_pack_str_body(pk, s, n);
}

static int pack_field(msgpack_packer *pk, const msg_t *m, const field_desc_t *f)
{
    const char *p = (const char *)m + f->off;
    int rc = pack_key(pk, f->key);
    if (rc) return rc;
    switch (f->kind) {
    case K_I32_NONNEG: return msgpack_pack_int32(pk, *(const int32_t *)p);
    case K_I64:
    case K_I64_NONNEG: return msgpack_pack_int64(pk, *(const int64_t *)p);
    case K_U64: return msgpack_pack_uint64(pk, *(const uint64_t *)p);
    case K_F64: return msgpack_pack_double(pk, *(const double *)p);
    case K_BOOL: return *(const int *)p ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    case K_ROLE: return pack_str(pk, p, strlen(p));
    case K_TEXT: return pack_str(pk, m->text, strlen(m->text));
    case K_DATA:
        rc = msgpack_pack_bin(pk, m->data_len);
        return rc ? rc : msgpack_pack_bin_body(pk, m->data, m->data_len);
    }
    return -1;
}

/* The encoder refuses what the decoder would reject, so a sender learns of it first. */
static int check_encodable(const msg_t *m, uint32_t fs)
{
    if ((fs & B(F_ROLE)) && memchr(m->role, '\0', MSG_ROLE_MAX) == NULL) return -EINVAL;
    if ((fs & B(F_RANK)) && m->rank < 0) return -EINVAL;
    if ((fs & B(F_REPLICA)) && m->replica < 0) return -EINVAL;
    if ((fs & B(F_STEP)) && m->step < 0) return -EINVAL;
    if (fs & B(F_TEXT)) {
        if (!m->text) return -EINVAL;
        if (strlen(m->text) > MSG_MAX_BYTES) return -EMSGSIZE;
    }
    if (fs & B(F_DATA)) {
        if (!m->data && m->data_len) return -EINVAL;
        if (m->data_len > MSG_MAX_BYTES) return -EMSGSIZE;
    }
    return 0;
}

int msg_encode(const msg_t *m, uint8_t **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    const char *name = msg_type_name(m->type);
    if (!name) return -EINVAL;
    uint32_t fs = types[m->type].fields;
    int rc = check_encodable(m, fs);
    if (rc) return rc;

    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int nf = __builtin_popcount(fs);
    bool bad = msgpack_pack_map(&pk, (size_t)nf + 2) || pack_key(&pk, "v") ||
               msgpack_pack_int(&pk, MSG_VERSION) || pack_key(&pk, "type") ||
               pack_str(&pk, name, strlen(name));
    for (int f = 0; f < F_COUNT && !bad; f++)
        if (fs & B(f)) bad = pack_field(&pk, m, &fields[f]) != 0;
    if (bad) {
        rc = -ENOMEM; /* sbuffer writes fail only when realloc does */
        goto out;
    }
    if (sb.size > MSG_MAX_BYTES) {
        rc = -EMSGSIZE;
        goto out;
    }
    *buf = (uint8_t *)sb.data; /* realloc'ed by msgpack_sbuffer_write: the caller free()s */
    *len = sb.size;
    sb.data = NULL;
out:
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* ---- decoding ---- */

static const char *what(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return "an integer";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "a negative integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "a float";
    case MSGPACK_OBJECT_STR: return "a string";
    case MSGPACK_OBJECT_ARRAY: return "an array";
    case MSGPACK_OBJECT_MAP: return "a map";
    case MSGPACK_OBJECT_BIN: return "binary data";
    case MSGPACK_OBJECT_EXT: return "an extension value";
    }
    return "an unknown object";
}

/* A peer-supplied string made safe for an error message: at most 40 bytes, escaped. */
static const char *printable(const char *s, size_t n, char out[200])
{
    size_t j = 0;
    for (size_t i = 0; i < n && i < 40; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
            out[j++] = (char)c;
        else
            j += (size_t)sprintf(out + j, "\\x%02x", c);
    }
    if (n > 40) j += (size_t)sprintf(out + j, "...");
    out[j] = '\0';
    return out;
}

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* Walks one complete msgpack object at buf without allocating: every declared length must be
 * backed by bytes, nesting is bounded, nothing may follow. msgpack-c allocates a container's
 * element array when it reads the header, so without this a 5-byte "array of 2^32 items"
 * would ask for 64 GiB. */
static int prescan(const uint8_t *buf, size_t len, char *err, size_t errlen)
{
    uint64_t pending[MSG_MAX_DEPTH + 1]; /* items still owed by each open container */
    int depth = 0;
    pending[0] = 1;
    const uint8_t *p = buf, *end = buf + len;
    for (;;) {
        while (depth >= 0 && pending[depth] == 0) depth--;
        if (depth < 0) break;
        if (p == end) return util_fail(err, errlen, -EBADMSG, "message truncated");
        pending[depth]--;
        uint8_t c = *p++;
        size_t avail = (size_t)(end - p);
        uint64_t skip = 0, items = 0;
        int lenbytes = 0;
        if (c <= 0x7f || c >= 0xe0 || (c >= 0xc0 && c <= 0xc3)) {
            if (c == 0xc1) return util_fail(err, errlen, -EBADMSG, "invalid msgpack byte 0xc1");
        } else if (c >= 0xa0 && c <= 0xbf) {
            skip = c & 0x1f;
        } else if (c >= 0x90 && c <= 0x9f) {
            items = c & 0x0f;
        } else if (c >= 0x80 && c <= 0x8f) {
            items = 2u * (c & 0x0f);
        } else {
            switch (c) {
            case 0xcc: case 0xd0: skip = 1; break;
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xca: case 0xce: case 0xd2: skip = 4; break;
            case 0xcb: case 0xcf: case 0xd3: skip = 8; break;
            case 0xd4: skip = 2; break; /* fixext: type byte + data */
            case 0xd5: skip = 3; break;
            case 0xd6: skip = 5; break;
            case 0xd7: skip = 9; break;
            case 0xd8: skip = 17; break;
            case 0xc4: case 0xd9: lenbytes = 1; break;
            case 0xc5: case 0xda: lenbytes = 2; break;
            case 0xc6: case 0xdb: lenbytes = 4; break;
            case 0xc7: lenbytes = 1; skip = 1; break; /* ext: length, type byte, data */
            case 0xc8: lenbytes = 2; skip = 1; break;
            case 0xc9: lenbytes = 4; skip = 1; break;
            case 0xdc: case 0xde: lenbytes = 2; break;
            case 0xdd: case 0xdf: lenbytes = 4; break;
            }
            if (lenbytes) {
                if (avail < (size_t)lenbytes)
                    return util_fail(err, errlen, -EBADMSG, "message truncated");
                uint64_t n = be(p, lenbytes);
                p += lenbytes;
                avail -= (size_t)lenbytes;
                if (c == 0xdc || c == 0xdd) items = n;
                else if (c == 0xde || c == 0xdf) items = 2 * n;
                else skip += n;
            }
        }
        if (skip > avail) return util_fail(err, errlen, -EBADMSG, "message truncated");
        p += skip;
        if (items) {
            /* each item takes at least a byte: fail early on absurd counts */
            if (items > (uint64_t)(end - p))
                return util_fail(err, errlen, -EBADMSG, "message truncated");
            if (depth == MSG_MAX_DEPTH)
                return util_fail(err, errlen, -EBADMSG, "message nested more than %d levels deep",
                                 MSG_MAX_DEPTH);
            pending[++depth] = items;
        }
    }
    if (p != end)
        return util_fail(err, errlen, -EBADMSG, "%zu trailing bytes after the message",
                         (size_t)(end - p));
    return 0;
}

static int key_cmp(const void *a, const void *b)
{
    const msgpack_object_str *x = &(*(const msgpack_object_kv *const *)a)->key.via.str;
    const msgpack_object_str *y = &(*(const msgpack_object_kv *const *)b)->key.via.str;
    uint32_t n = x->size < y->size ? x->size : y->size;
    int c = n ? memcmp(x->ptr, y->ptr, n) : 0;
    if (c) return c;
    return (x->size > y->size) - (x->size < y->size);
}

static const msgpack_object *lookup(msgpack_object_kv **sorted, size_t n, const char *key)
{
    msgpack_object_kv probe = {.key = {.type = MSGPACK_OBJECT_STR,
                                       .via.str = {(uint32_t)strlen(key), key}}};
    msgpack_object_kv *pp = &probe;
    msgpack_object_kv **hit = n ? bsearch(&pp, sorted, n, sizeof *sorted, key_cmp) : NULL;
    return hit ? &(*hit)->val : NULL;
}

static const char *expected(kind_t k)
{
    switch (k) {
    case K_I32_NONNEG: return "a non-negative 32-bit integer";
    case K_I64: return "a 64-bit integer";
    case K_I64_NONNEG: return "a non-negative 64-bit integer";
    case K_U64: return "a non-negative 64-bit integer";
    case K_F64: return "a number";
    case K_BOOL: return "a boolean";
    case K_TEXT: return "a string";
    case K_ROLE: return "a string";
    case K_DATA: return "binary data";
    }
    return "?";
}

static int field_fail(char *err, size_t errlen, const char *tname, const field_desc_t *f,
                      const msgpack_object *o)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return util_fail(err, errlen, -EBADMSG, "%s: field '%s' must be %s, got %" PRIu64, tname,
                         f->key, expected(f->kind), o->via.u64);
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return util_fail(err, errlen, -EBADMSG, "%s: field '%s' must be %s, got %" PRId64, tname,
                         f->key, expected(f->kind), o->via.i64);
    return util_fail(err, errlen, -EBADMSG, "%s: field '%s' must be %s, got %s", tname, f->key,
                     expected(f->kind), what(o));
}

static int read_field(msg_t *m, const char *tname, const field_desc_t *f, const msgpack_object *o,
                      char *err, size_t errlen)
{
    char *p = (char *)m + f->off;
    bool pos = o->type == MSGPACK_OBJECT_POSITIVE_INTEGER;
    bool neg = o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
    switch (f->kind) {
    case K_I32_NONNEG:
        if (!pos || o->via.u64 > INT32_MAX) return field_fail(err, errlen, tname, f, o);
        *(int32_t *)p = (int32_t)o->via.u64;
        return 0;
    case K_I64:
        if (neg) {
            *(int64_t *)p = o->via.i64;
            return 0;
        }
        /* fall through */
    case K_I64_NONNEG:
        if (!pos || o->via.u64 > INT64_MAX) return field_fail(err, errlen, tname, f, o);
        *(int64_t *)p = (int64_t)o->via.u64;
        return 0;
    case K_U64:
        if (!pos) return field_fail(err, errlen, tname, f, o);
        *(uint64_t *)p = o->via.u64;
        return 0;
    case K_F64:
        if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
            *(double *)p = o->via.f64;
        else if (pos)
            *(double *)p = (double)o->via.u64;
        else if (neg)
            *(double *)p = (double)o->via.i64;
        else
            return field_fail(err, errlen, tname, f, o);
        return 0;
    case K_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN) return field_fail(err, errlen, tname, f, o);
        *(int *)p = o->via.boolean ? 1 : 0;
        return 0;
    case K_ROLE:
    case K_TEXT: {
        if (o->type != MSGPACK_OBJECT_STR) return field_fail(err, errlen, tname, f, o);
        const char *s = o->via.str.ptr;
        size_t n = o->via.str.size;
        if (n && memchr(s, '\0', n))
            return util_fail(err, errlen, -EBADMSG, "%s: field '%s' contains a NUL byte", tname,
                             f->key);
        if (f->kind == K_ROLE) {
            if (n > MSG_ROLE_MAX - 1)
                return util_fail(err, errlen, -EBADMSG,
                                 "%s: field '%s' is %zu bytes long, at most %d allowed", tname,
                                 f->key, n, MSG_ROLE_MAX - 1);
            memcpy(m->role, s, n);
            m->role[n] = '\0';
            return 0;
        }
        char *t = malloc(n + 1);
        if (!t) return util_fail(err, errlen, -ENOMEM, "out of memory");
        if (n) memcpy(t, s, n);
        t[n] = '\0';
        m->text = t;
        m->text_len = n;
        return 0;
    }
    case K_DATA:
        if (o->type != MSGPACK_OBJECT_BIN) return field_fail(err, errlen, tname, f, o);
        m->data = malloc(o->via.bin.size ? o->via.bin.size : 1);
        if (!m->data) return util_fail(err, errlen, -ENOMEM, "out of memory");
        if (o->via.bin.size) memcpy(m->data, o->via.bin.ptr, o->via.bin.size);
        m->data_len = o->via.bin.size;
        return 0;
    }
    return -EINVAL;
}

/* Fills m from the top-level object (already known to be well-formed msgpack). */
static int decode_object(const msgpack_object *root, msg_t *m, char *err, size_t errlen)
{
    if (root->type != MSGPACK_OBJECT_MAP)
        return util_fail(err, errlen, -EBADMSG, "not a msgpack map (got %s)", what(root));
    const msgpack_object_map *map = &root->via.map;
    size_t n = map->size;
    msgpack_object_kv *small[32];
    msgpack_object_kv **sorted = n <= 32 ? small : malloc(n * sizeof *sorted);
    if (!sorted) return util_fail(err, errlen, -ENOMEM, "out of memory");
    char tmp[200];
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (map->ptr[i].key.type != MSGPACK_OBJECT_STR) {
            rc = util_fail(err, errlen, -EBADMSG, "message keys must be strings, got %s",
                           what(&map->ptr[i].key));
            goto out;
        }
        sorted[i] = &map->ptr[i];
    }
    qsort(sorted, n, sizeof *sorted, key_cmp);
    for (size_t i = 1; i < n; i++)
        if (key_cmp(&sorted[i - 1], &sorted[i]) == 0) {
            const msgpack_object_str *k = &sorted[i]->key.via.str;
            rc = util_fail(err, errlen, -EBADMSG, "duplicate key '%s'",
                           printable(k->ptr, k->size, tmp));
            goto out;
        }

    const msgpack_object *v = lookup(sorted, n, "v");
    if (!v) {
        rc = util_fail(err, errlen, -EBADMSG, "missing field 'v' (the message version)");
        goto out;
    }
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
        rc = util_fail(err, errlen, -EBADMSG, "field 'v' must be a positive integer, got %s",
                       what(v));
        goto out;
    }
    if (v->via.u64 != MSG_VERSION) {
        rc = util_fail(err, errlen, -EPROTO,
                       "unsupported message version %" PRIu64 " (this build speaks %d)",
                       v->via.u64, MSG_VERSION);
        goto out;
    }
    const msgpack_object *t = lookup(sorted, n, "type");
    if (!t) {
        rc = util_fail(err, errlen, -EBADMSG, "missing field 'type'");
        goto out;
    }
    if (t->type != MSGPACK_OBJECT_STR) {
        rc = util_fail(err, errlen, -EBADMSG, "field 'type' must be a string, got %s", what(t));
        goto out;
    }
    msg_type_t type = 0;
    for (int i = 1; i < MSG_TYPE_END; i++)
        if (strlen(types[i].name) == t->via.str.size &&
            memcmp(types[i].name, t->via.str.ptr, t->via.str.size) == 0)
            type = (msg_type_t)i;
    if (!type) {
        rc = util_fail(err, errlen, -EBADMSG, "unknown message type '%s'",
                       printable(t->via.str.ptr, t->via.str.size, tmp));
        goto out;
    }
    m->type = type;
    const char *tname = types[type].name;
    for (int f = 0; f < F_COUNT; f++) {
        if (!(types[type].fields & B(f))) continue;
        const msgpack_object *o = lookup(sorted, n, fields[f].key);
        if (!o) {
            rc = util_fail(err, errlen, -EBADMSG, "%s: missing field '%s'", tname, fields[f].key);
            goto out;
        }
        rc = read_field(m, tname, &fields[f], o, err, errlen);
        if (rc) goto out;
    }
out:
    if (sorted != small) free(sorted);
    return rc;
}

int msg_decode(const void *buf, size_t len, msg_t *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (len > MSG_MAX_BYTES)
        return util_fail(err, errlen, -EMSGSIZE, "message is %zu bytes, over the limit of %d",
                         len, MSG_MAX_BYTES);
    if (len == 0 || !buf) return util_fail(err, errlen, -EBADMSG, "message truncated (empty)");
    int rc = prescan(buf, len, err, errlen);
    if (rc) return rc;

    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(&up, buf, len, &off);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
        rc = util_fail(err, errlen, -ENOMEM, "out of memory decoding a message");
    else if (ur != MSGPACK_UNPACK_SUCCESS || off != len) /* prescan should have caught it */
        rc = util_fail(err, errlen, -EBADMSG, "malformed msgpack");
    else
        rc = decode_object(&up.data, m, err, errlen);
    msgpack_unpacked_destroy(&up);
    if (rc) msg_clear(m);
    return rc;
}
