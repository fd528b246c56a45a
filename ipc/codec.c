/* The table-driven msgpack codec (see codec.h): the bytes are walked before msgpack-c sees
 * them, the map's keys are sorted once so that each field is a binary search (a hostile map
 * may hold many thousands of unused keys), and a protocol's tables say the rest. */
#include "ipc/codec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"

const char *codec_printable(const void *s, size_t n, char out[CODEC_PRINTABLE])
{
    const unsigned char *p = s;
    size_t j = 0;
    for (size_t i = 0; i < n && i < CODEC_SHOWN; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' && p[i] != '\'')
            out[j++] = (char)p[i];
        else
            j += (size_t)sprintf(out + j, "\\x%02x", p[i]);
    }
    if (n > CODEC_SHOWN)
        j += (size_t)sprintf(out + j, "...");
    out[j] = '\0';
    return out;
}

int codec_pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    int rc = msgpack_pack_str(pk, n);
    return rc ? rc : msgpack_pack_str_body(pk, s, n);
}

/* ---- encoding ---- */

static int pack_bytes(msgpack_packer *pk, bool bin, const void *p, size_t n)
{
    int rc = bin ? msgpack_pack_bin(pk, n) : msgpack_pack_str(pk, n);
    if (rc || !n) /* no body: p may be NULL */
        return rc;
    return bin ? msgpack_pack_bin_body(pk, p, n) : msgpack_pack_str_body(pk, p, n);
}

/* The encoder refuses what the decoder would reject. */
static int check_field(const codec_proto_t *p, const codec_field_t *f, const char *obj)
{
    const char *v = obj + f->off;
    switch (f->kind) {
    case CODEC_I32_NONNEG: return *(const int32_t *)v < 0 ? -EINVAL : 0;
    case CODEC_I64_NONNEG: return *(const int64_t *)v < 0 ? -EINVAL : 0;
    case CODEC_CHARS: return memchr(v, '\0', f->aux) ? 0 : -EINVAL;
    case CODEC_TEXT:
        if (!*(char *const *)v)
            return -EINVAL;
        return strlen(*(char *const *)v) > p->max_bytes ? -EMSGSIZE : 0;
    case CODEC_DATA:
    case CODEC_STR: {
        size_t n = *(const size_t *)(obj + f->aux);
        if (!*(const void *const *)v && n)
            return -EINVAL;
        return n > p->max_bytes ? -EMSGSIZE : 0;
    }
    default: return 0;
    }
}

static int pack_field(msgpack_packer *pk, const codec_field_t *f, const char *obj)
{
    const char *v = obj + f->off;
    int rc = codec_pack_str(pk, f->key);
    if (rc)
        return rc;
    switch (f->kind) {
    case CODEC_BOOL: return *(const int *)v ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    case CODEC_I32_NONNEG: return msgpack_pack_int32(pk, *(const int32_t *)v);
    case CODEC_U32: return msgpack_pack_uint32(pk, *(const uint32_t *)v);
    case CODEC_I64:
    case CODEC_I64_NONNEG: return msgpack_pack_int64(pk, *(const int64_t *)v);
    case CODEC_U64: return msgpack_pack_uint64(pk, *(const uint64_t *)v);
    case CODEC_F64: return msgpack_pack_double(pk, *(const double *)v);
    case CODEC_CHARS: return codec_pack_str(pk, v);
    case CODEC_TEXT: return codec_pack_str(pk, *(char *const *)v);
    case CODEC_DATA:
    case CODEC_STR:
        return pack_bytes(pk, f->kind == CODEC_DATA, *(const void *const *)v, *(const size_t *)(obj + f->aux));
    }
    return -1;
}

/* The type's entry, or NULL when id is none of p's types (or names fields p does not have). */
static const codec_type_t *type_of(const codec_proto_t *p, int id)
{
    if (id <= 0 || id >= p->n_types || !p->types[id].name)
        return NULL;
    if (p->n_fields < 32 && p->types[id].fields >> p->n_fields)
        return NULL;
    return &p->types[id];
}

int codec_encode(const codec_proto_t *p, int type, const void *obj, uint8_t **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    const codec_type_t *t = type_of(p, type);
    if (!t)
        return -EINVAL;
    int rc = 0;
    for (int f = 0; f < p->n_fields && !rc; f++)
        if (t->fields & (1u << f))
            rc = check_field(p, &p->fields[f], obj);
    if (rc)
        return rc;

    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    bool bad = msgpack_pack_map(&pk, 2 + (size_t)__builtin_popcount(t->fields)) || codec_pack_str(&pk, "v") ||
               msgpack_pack_uint64(&pk, p->version) || codec_pack_str(&pk, "type") || codec_pack_str(&pk, t->name);
    for (int f = 0; f < p->n_fields && !bad; f++)
        if (t->fields & (1u << f))
            bad = pack_field(&pk, &p->fields[f], obj) != 0;
    if (bad)
        rc = -ENOMEM; /* sbuffer writes fail only when realloc does */
    else if (sb.size > p->max_bytes)
        rc = -EMSGSIZE;
    if (!rc) {
        *buf = (uint8_t *)sb.data; /* realloc'ed by msgpack_sbuffer_write: the caller free()s */
        *len = sb.size;
        sb.data = NULL;
    }
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* ---- the walk before msgpack-c ---- */

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* How one msgpack header byte continues: bytes to skip, items to follow (a map's are keys and
 * values), bytes of a big-endian length that adds to one or the other. */
static void head(uint8_t c, uint64_t *skip, uint64_t *items, int *lenbytes)
{
    *skip = *items = 0;
    *lenbytes = 0;
    if (c <= 0x7f || c >= 0xe0 || (c >= 0xc0 && c <= 0xc3))
        return;
    if (c >= 0xa0 && c <= 0xbf) {
        *skip = c & 0x1f;
        return;
    }
    if (c >= 0x90 && c <= 0x9f) {
        *items = c & 0x0f;
        return;
    }
    if (c >= 0x80 && c <= 0x8f) {
        *items = 2u * (c & 0x0f);
        return;
    }
    switch (c) {
    case 0xcc: case 0xd0: *skip = 1; break;
    case 0xcd: case 0xd1: *skip = 2; break;
    case 0xca: case 0xce: case 0xd2: *skip = 4; break;
    case 0xcb: case 0xcf: case 0xd3: *skip = 8; break;
    case 0xd4: *skip = 2; break; /* fixext: type byte + data */
    case 0xd5: *skip = 3; break;
    case 0xd6: *skip = 5; break;
    case 0xd7: *skip = 9; break;
    case 0xd8: *skip = 17; break;
    case 0xc4: case 0xd9: *lenbytes = 1; break;
    case 0xc5: case 0xda: *lenbytes = 2; break;
    case 0xc6: case 0xdb: *lenbytes = 4; break;
    case 0xc7: *lenbytes = 1, *skip = 1; break; /* ext: length, type byte, data */
    case 0xc8: *lenbytes = 2, *skip = 1; break;
    case 0xc9: *lenbytes = 4, *skip = 1; break;
    case 0xdc: case 0xde: *lenbytes = 2; break;
    case 0xdd: case 0xdf: *lenbytes = 4; break;
    }
}

/* msgpack-c allocates a container's element array when it reads the header, so without this
 * walk a 5-byte "array of 2^32 items" would ask for 64 GiB. */
int codec_prescan(const void *buf, size_t len, const char *noun, char *err, size_t errlen)
{
    uint64_t pending[CODEC_MAX_DEPTH + 1]; /* items still owed by each open container */
    int depth = 0;
    pending[0] = 1;
    const uint8_t *p = buf, *end = p + len;
    for (;;) {
        while (depth >= 0 && pending[depth] == 0)
            depth--;
        if (depth < 0)
            break;
        if (p == end)
            return util_fail(err, errlen, -EBADMSG, "%s truncated", noun);
        pending[depth]--;
        uint8_t c = *p++;
        if (c == 0xc1)
            return util_fail(err, errlen, -EBADMSG, "invalid msgpack byte 0xc1");
        size_t avail = (size_t)(end - p);
        uint64_t skip, items;
        int lenbytes;
        head(c, &skip, &items, &lenbytes);
        if (lenbytes) {
            if (avail < (size_t)lenbytes)
                return util_fail(err, errlen, -EBADMSG, "%s truncated", noun);
            uint64_t n = be(p, lenbytes);
            p += lenbytes;
            avail -= (size_t)lenbytes;
            if (c == 0xdc || c == 0xdd)
                items = n;
            else if (c == 0xde || c == 0xdf)
                items = 2 * n;
            else
                skip += n;
        }
        if (skip > avail)
            return util_fail(err, errlen, -EBADMSG, "%s truncated", noun);
        p += skip;
        if (items) {
            /* each item takes at least a byte: fail early on absurd counts */
            if (items > (uint64_t)(end - p))
                return util_fail(err, errlen, -EBADMSG, "%s truncated", noun);
            if (depth == CODEC_MAX_DEPTH)
                return util_fail(err, errlen, -EBADMSG, "%s nested more than %d levels deep", noun,
                                 CODEC_MAX_DEPTH);
            pending[++depth] = items;
        }
    }
    if (p != end)
        return util_fail(err, errlen, -EBADMSG, "%zu trailing bytes after the %s", (size_t)(end - p), noun);
    return 0;
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

static bool is_scalar(const msgpack_object *o)
{
    return o->type != MSGPACK_OBJECT_ARRAY && o->type != MSGPACK_OBJECT_MAP && o->type != MSGPACK_OBJECT_BIN &&
           o->type != MSGPACK_OBJECT_EXT;
}

static const char *expected(codec_kind_t k)
{
    switch (k) {
    case CODEC_BOOL: return "a boolean";
    case CODEC_I32_NONNEG: return "a non-negative 32-bit integer";
    case CODEC_U32: return "an integer from 0 to 2^32-1";
    case CODEC_I64: return "a 64-bit integer";
    case CODEC_I64_NONNEG: return "a non-negative 64-bit integer";
    case CODEC_U64: return "a non-negative integer";
    case CODEC_F64: return "a number";
    case CODEC_CHARS:
    case CODEC_TEXT:
    case CODEC_STR: return "a string";
    case CODEC_DATA: return "binary data";
    }
    return "?";
}

static int key_cmp(const void *a, const void *b)
{
    const msgpack_object_str *x = &(*(const msgpack_object_kv *const *)a)->key.via.str;
    const msgpack_object_str *y = &(*(const msgpack_object_kv *const *)b)->key.via.str;
    uint32_t n = x->size < y->size ? x->size : y->size;
    int c = n ? memcmp(x->ptr, y->ptr, n) : 0;
    if (c)
        return c;
    return (x->size > y->size) - (x->size < y->size);
}

static const msgpack_object *lookup(msgpack_object_kv **sorted, size_t n, const char *key)
{
    msgpack_object_kv probe = {.key = {.type = MSGPACK_OBJECT_STR, .via.str = {(uint32_t)strlen(key), key}}};
    msgpack_object_kv *pp = &probe;
    msgpack_object_kv **hit = n ? bsearch(&pp, sorted, n, sizeof *sorted, key_cmp) : NULL;
    return hit ? &(*hit)->val : NULL;
}

static int field_fail(char *err, size_t errlen, const char *tname, const codec_field_t *f, const msgpack_object *o)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return util_fail(err, errlen, -EBADMSG, "%s: field '%s' must be %s, got %" PRIu64, tname, f->key,
                         expected(f->kind), o->via.u64);
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return util_fail(err, errlen, -EBADMSG, "%s: field '%s' must be %s, got %" PRId64, tname, f->key,
                         expected(f->kind), o->via.i64);
    return util_fail(err, errlen, -EBADMSG, "%s: field '%s' must be %s, got %s", tname, f->key, expected(f->kind),
                     what(o));
}

/* An integer kind: the value if o is one in range, else the error. */
static int read_int(const codec_field_t *f, const msgpack_object *o, char *v, const char *tname, char *err,
                    size_t errlen)
{
    bool pos = o->type == MSGPACK_OBJECT_POSITIVE_INTEGER, neg = o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
    uint64_t u = o->via.u64;
    switch (f->kind) {
    case CODEC_I32_NONNEG:
        if (!pos || u > INT32_MAX)
            break;
        *(int32_t *)v = (int32_t)u;
        return 0;
    case CODEC_U32:
        if (!pos || u > UINT32_MAX)
            break;
        *(uint32_t *)v = (uint32_t)u;
        return 0;
    case CODEC_I64:
        if (neg) {
            *(int64_t *)v = o->via.i64;
            return 0;
        }
        /* fall through */
    case CODEC_I64_NONNEG:
        if (!pos || u > INT64_MAX)
            break;
        *(int64_t *)v = (int64_t)u;
        return 0;
    case CODEC_U64:
        if (!pos)
            break;
        *(uint64_t *)v = u;
        return 0;
    default: break;
    }
    return field_fail(err, errlen, tname, f, o);
}

/* A string kind: CHARS copied in place, TEXT copied to the heap, STR pointed at. */
static int read_str(const codec_field_t *f, const msgpack_object *o, char *obj, const char *tname, char *err,
                    size_t errlen)
{
    if (o->type != MSGPACK_OBJECT_STR)
        return field_fail(err, errlen, tname, f, o);
    const char *s = o->via.str.ptr;
    size_t n = o->via.str.size;
    char *v = obj + f->off;
    if (f->kind == CODEC_STR) {
        *(const char **)v = s;
        *(size_t *)(obj + f->aux) = n;
        return 0;
    }
    if (n && memchr(s, '\0', n))
        return util_fail(err, errlen, -EBADMSG, "%s: field '%s' contains a NUL byte", tname, f->key);
    if (f->kind == CODEC_CHARS) {
        if (n > f->aux - 1)
            return util_fail(err, errlen, -EBADMSG, "%s: field '%s' is %zu bytes long, at most %zu allowed", tname,
                             f->key, n, f->aux - 1);
        memcpy(v, s, n);
        v[n] = '\0';
        return 0;
    }
    char *t = malloc(n + 1);
    if (!t)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if (n)
        memcpy(t, s, n);
    t[n] = '\0';
    *(char **)v = t;
    *(size_t *)(obj + f->aux) = n;
    return 0;
}

static int read_field(const codec_field_t *f, const msgpack_object *o, char *obj, const char *tname, char *err,
                      size_t errlen)
{
    char *v = obj + f->off;
    switch (f->kind) {
    case CODEC_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            return field_fail(err, errlen, tname, f, o);
        *(int *)v = o->via.boolean ? 1 : 0;
        return 0;
    case CODEC_F64:
        if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
            *(double *)v = o->via.f64;
        else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            *(double *)v = (double)o->via.u64;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            *(double *)v = (double)o->via.i64;
        else
            return field_fail(err, errlen, tname, f, o);
        return 0;
    case CODEC_CHARS:
    case CODEC_TEXT:
    case CODEC_STR: return read_str(f, o, obj, tname, err, errlen);
    case CODEC_DATA: {
        if (o->type != MSGPACK_OBJECT_BIN)
            return field_fail(err, errlen, tname, f, o);
        size_t n = o->via.bin.size;
        uint8_t *d = malloc(n ? n : 1);
        if (!d)
            return util_fail(err, errlen, -ENOMEM, "out of memory");
        if (n)
            memcpy(d, o->via.bin.ptr, n);
        *(uint8_t **)v = d;
        *(size_t *)(obj + f->aux) = n;
        return 0;
    }
    default: return read_int(f, o, v, tname, err, errlen);
    }
}

/* The map's entries sorted by key into sorted[] (keys all strings, no key twice, and with
 * p->flat no value a container). */
static int sort_keys(const codec_proto_t *p, const msgpack_object_map *map, msgpack_object_kv **sorted, char *err,
                     size_t errlen)
{
    char shown[CODEC_PRINTABLE];
    for (uint32_t i = 0; i < map->size; i++) {
        const msgpack_object_kv *kv = &map->ptr[i];
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return util_fail(err, errlen, -EBADMSG, "%s keys must be strings, got %s", p->noun, what(&kv->key));
        if (p->flat && !is_scalar(&kv->val))
            return util_fail(err, errlen, -EBADMSG, "%s field '%s' is not a scalar (%ss are flat)", p->noun,
                             codec_printable(kv->key.via.str.ptr, kv->key.via.str.size, shown), p->noun);
        sorted[i] = &map->ptr[i];
    }
    qsort(sorted, map->size, sizeof *sorted, key_cmp);
    for (uint32_t i = 1; i < map->size; i++)
        if (key_cmp(&sorted[i - 1], &sorted[i]) == 0) {
            const msgpack_object_str *k = &sorted[i]->key.via.str;
            return util_fail(err, errlen, -EBADMSG, "duplicate key '%s'", codec_printable(k->ptr, k->size, shown));
        }
    return 0;
}

/* "v" and "type": the type's id, or the error. */
static int read_head(const codec_proto_t *p, msgpack_object_kv **sorted, size_t n, int *type, char *err,
                     size_t errlen)
{
    const msgpack_object *v = lookup(sorted, n, "v");
    if (!v)
        return util_fail(err, errlen, -EBADMSG, "missing field 'v' (no protocol version)");
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return util_fail(err, errlen, -EBADMSG, "field 'v' must be a positive integer, got %s", what(v));
    if (v->via.u64 != p->version)
        return util_fail(err, errlen, -EPROTO, "unsupported %s version %" PRIu64 " (this build speaks %" PRIu64 ")",
                         p->name, v->via.u64, p->version);
    const msgpack_object *t = lookup(sorted, n, "type");
    if (!t)
        return util_fail(err, errlen, -EBADMSG, "missing field 'type'");
    if (t->type != MSGPACK_OBJECT_STR)
        return util_fail(err, errlen, -EBADMSG, "field 'type' must be a string, got %s", what(t));
    for (int i = 1; i < p->n_types; i++)
        if (type_of(p, i) && strlen(p->types[i].name) == t->via.str.size &&
            !memcmp(p->types[i].name, t->via.str.ptr, t->via.str.size))
            *type = i;
    char shown[CODEC_PRINTABLE];
    if (!*type)
        return util_fail(err, errlen, -EBADMSG, "unknown message type '%s'",
                         codec_printable(t->via.str.ptr, t->via.str.size, shown));
    return 0;
}

/* Fills *type and obj from the top-level object (well-formed msgpack: the walk passed). */
static int decode_object(const codec_proto_t *p, const msgpack_object *root, int *type, void *obj, char *err,
                         size_t errlen)
{
    if (root->type != MSGPACK_OBJECT_MAP)
        return util_fail(err, errlen, -EBADMSG, "not a msgpack map (got %s)", what(root));
    const msgpack_object_map *map = &root->via.map;
    size_t n = map->size;
    msgpack_object_kv *small[32];
    msgpack_object_kv **sorted = n <= 32 ? small : malloc(n * sizeof *sorted);
    if (!sorted)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    int rc = sort_keys(p, map, sorted, err, errlen);
    if (!rc)
        rc = read_head(p, sorted, n, type, err, errlen);
    const char *tname = rc ? NULL : p->types[*type].name;
    for (int f = 0; f < p->n_fields && !rc; f++) {
        if (!(p->types[*type].fields & (1u << f)))
            continue;
        const codec_field_t *fd = &p->fields[f];
        const msgpack_object *o = lookup(sorted, n, fd->key);
        if (!o && p->says_is_missing)
            rc = util_fail(err, errlen, -EBADMSG, "%s: field '%s' is missing", tname, fd->key);
        else if (!o)
            rc = util_fail(err, errlen, -EBADMSG, "%s: missing field '%s'", tname, fd->key);
        else
            rc = read_field(fd, o, obj, tname, err, errlen);
    }
    if (sorted != small)
        free(sorted);
    return rc;
}

/* ---- maps of unsigned integers ---- */

size_t codec_pack_u64_map(uint8_t *buf, size_t cap, int n, const char *const *keys, const uint64_t *vals)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        codec_pack_str(&pk, keys[i]);
        msgpack_pack_uint64(&pk, vals[i]);
    }
    size_t len = sb.data && sb.size <= cap ? sb.size : 0;
    if (len)
        memcpy(buf, sb.data, len);
    msgpack_sbuffer_destroy(&sb);
    return len;
}

int codec_get_u64(const void *buf, size_t len, const char *key, uint64_t *val)
{
    static const codec_proto_t map = {.noun = "map"}; /* for sort_keys: string keys, no key twice */
    if (len == 0)
        return -ENOENT;
    if (codec_prescan(buf, len, map.noun, NULL, 0))
        return -EINVAL;
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    int rc = -EINVAL;
    if (msgpack_unpack_next(&up, buf, len, &off) == MSGPACK_UNPACK_SUCCESS && off == len &&
        up.data.type == MSGPACK_OBJECT_MAP) {
        const msgpack_object_map *m = &up.data.via.map;
        msgpack_object_kv *small[32], **sorted = m->size <= 32 ? small : malloc(m->size * sizeof *sorted);
        if (!sorted)
            rc = -ENOMEM;
        else if (!sort_keys(&map, m, sorted, NULL, 0)) {
            const msgpack_object *v = lookup(sorted, m->size, key);
            rc = !v ? -ENOENT : v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? 0 : -EINVAL;
            if (!rc)
                *val = v->via.u64;
        }
        if (sorted != small)
            free(sorted);
    }
    msgpack_unpacked_destroy(&up);
    return rc;
}

int codec_decode(const codec_proto_t *p, const void *buf, size_t len, int *type, void *obj, char *err,
                 size_t errlen)
{
    *type = 0;
    if (len > p->max_bytes)
        return util_fail(err, errlen, -EMSGSIZE, "%s is %zu bytes, over the limit of %zu", p->noun, len,
                         p->max_bytes);
    if (len == 0 || !buf)
        return util_fail(err, errlen, -EBADMSG, "%s truncated (empty)", p->noun);
    int rc = codec_prescan(buf, len, p->noun, err, errlen);
    if (rc)
        return rc;
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(&up, buf, len, &off);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
        rc = util_fail(err, errlen, -ENOMEM, "out of memory decoding a %s", p->noun);
    else if (ur != MSGPACK_UNPACK_SUCCESS || off != len) /* the walk should have caught it */
        rc = util_fail(err, errlen, -EBADMSG, "malformed msgpack");
    else
        rc = decode_object(p, &up.data, type, obj, err, errlen);
    msgpack_unpacked_destroy(&up); /* CODEC_STR values point into buf, not into it */
    return rc;
}
