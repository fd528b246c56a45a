/* One msgpack codec for the project's versioned messages: a C struct <-> one flat map
 * {"v": version, "type": "<name>", <the fields of that type>}. A protocol is tables: its types
 * (name, which fields) and its fields (key, kind, where in the caller's struct). The control
 * plane (ipc/msg.c) and remote checkpointd's header frames (checkpointd/remote_wire.c) are two
 * such protocols; each keeps its own version, types and wire format.
 *
 * Decoding is the guard at a process boundary: the bytes are walked first without allocating
 * (bounds, nesting depth, trailing bytes), so msgpack-c only ever sees well-formed input whose
 * declared sizes are backed by real bytes; then keys must be strings and unique, "v" must be
 * the protocol's version, "type" one of its names, and every field of that type present and of
 * its kind. Keys a type does not use are ignored (a field can be added within a version).
 * Every failure is an error text naming the field, never a crash. Encoding refuses what the
 * decoder would reject, so a sender learns of it first. Nothing here exits. */
#ifndef CTITAN_CODEC_H
#define CTITAN_CODEC_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CODEC_MAX_DEPTH 16                       /* of nested containers (under unused keys) */
#define CODEC_SHOWN 64                           /* bytes of a peer's string shown in a text */
#define CODEC_PRINTABLE (CODEC_SHOWN * 4 + 4)    /* room for them escaped, "...", NUL */

typedef enum {
    CODEC_BOOL,       /* int, 0 or 1: a msgpack boolean */
    CODEC_I32_NONNEG, /* int32_t >= 0 */
    CODEC_U32,        /* uint32_t */
    CODEC_I64,        /* int64_t */
    CODEC_I64_NONNEG, /* int64_t >= 0 */
    CODEC_U64,        /* uint64_t */
    CODEC_F64,        /* double; an integer is taken too, a float32 widened exactly */
    CODEC_CHARS,      /* char[aux], NUL-terminated, no NUL inside */
    CODEC_TEXT,       /* char *, NUL-terminated, no NUL inside; decoding mallocs a copy (the
                       * caller frees it) and puts its length in the size_t at offset aux */
    CODEC_DATA,       /* uint8_t *, msgpack binary, its length in the size_t at offset aux;
                       * decoding mallocs a copy (the caller frees it) */
    CODEC_STR,        /* const char *, a string of the length in the size_t at offset aux,
                       * NUL bytes allowed; decoding points into the decoded buffer (no copy) */
} codec_kind_t;

typedef struct {
    const char *key;
    codec_kind_t kind;
    size_t off; /* of the value in the protocol's struct */
    size_t aux; /* CODEC_CHARS: the array's size; TEXT, DATA, STR: offset of the size_t length */
} codec_field_t;

typedef struct {
    const char *name; /* on the wire; NULL: no type has this id */
    uint32_t fields;  /* bit f set: the type carries, and so requires, fields[f] */
    unsigned flags;   /* the protocol's own (remote: a payload frame follows); not looked at here */
} codec_type_t;

typedef struct {
    const char *name;          /* what "v" versions, in texts: "unsupported <name> version 2" */
    const char *noun;          /* what is decoded, in texts: "<noun> truncated" */
    uint64_t version;
    size_t max_bytes;          /* of an encoding */
    bool flat;                 /* every value, used or not, is nil, a boolean, a number or a string */
    bool says_is_missing;      /* "begin: field 'step' is missing", not "step: missing field 'step'"
                                * (each protocol keeps the wording its peers and tests know) */
    const codec_type_t *types; /* indexed by type id; 0 is never a type */
    int n_types;
    const codec_field_t *fields; /* encoded in this order, after "v" and "type" */
    int n_fields;                /* at most 32 */
} codec_proto_t;

/* Encodes the fields of `type` from the struct at obj into a malloc'ed buffer (the caller
 * free()s it). Returns 0, -EINVAL (not a type of p; a CHARS without its NUL; a TEXT that is
 * NULL; a DATA or STR with a length but no bytes; a negative value for a *_NONNEG kind),
 * -EMSGSIZE (over p->max_bytes) or -ENOMEM. */
int codec_encode(const codec_proto_t *p, int type, const void *obj, uint8_t **buf, size_t *len);

/* Decodes exactly len bytes into *type and the fields of that type in the struct at obj
 * (fields it does not carry are left alone: the caller zeroes obj first). Returns 0, or
 * -EBADMSG / -EMSGSIZE / -EPROTO (another version) / -ENOMEM with the reason in err. On
 * error, *type and the fields read before the one at fault stay set (a server can answer a
 * message by the sequence number it carries); TEXT and DATA copies among them are the
 * caller's to free. */
int codec_decode(const codec_proto_t *p, const void *buf, size_t len, int *type, void *obj, char *err,
                 size_t errlen);

/* Walks one complete msgpack value at buf without allocating: every declared length backed
 * by bytes, nesting at most CODEC_MAX_DEPTH, nothing after it. Texts name the noun ("header
 * truncated"). Returns 0 or -EBADMSG. */
int codec_prescan(const void *buf, size_t len, const char *noun, char *err, size_t errlen);

/* A peer-supplied string made safe for an error text: at most CODEC_SHOWN bytes shown (then
 * "..."), control bytes, non-ASCII, '\\' and '\'' as \xNN. Returns out. */
const char *codec_printable(const void *s, size_t n, char out[CODEC_PRINTABLE]);

/* Packs a NUL-terminated string; msgpack-c's return code (0 = written). */
int codec_pack_str(msgpack_packer *pk, const char *s);

/* Maps of string keys (the loader cursor's convention, stages/runtime/ldr.h). Packs n keys with
 * unsigned values into buf (cap bytes); returns the length, 0 when it does not fit. Reads one
 * key's unsigned value from such a map (other values may be anything) behind the same guard as
 * codec_decode: the bytes walked first, keys strings and unique. Returns 0, -ENOENT (no such
 * key; an empty buffer has none), -EINVAL (not such a map, or the value is not an unsigned
 * integer) or -ENOMEM. */
size_t codec_pack_u64_map(uint8_t *buf, size_t cap, int n, const char *const *keys, const uint64_t *vals);
int codec_get_u64(const void *buf, size_t len, const char *key, uint64_t *val);

#endif
