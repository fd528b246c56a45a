/* The control-plane codec: every type round-trips, and malformed, truncated, oversized,
 * wrongly-typed or hostile input (fuzzed, deeply nested, huge declared lengths) is rejected
 * with a message naming the problem, never a crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/msg.h"
#include "tests/testutil.h"

#define assert_err_has(err, s)                                                                    \
    do {                                                                                          \
        if (!strstr((err), (s))) fail_msg("error \"%s\" does not contain \"%s\"", (err), (s));    \
    } while (0)

/* What msg.h's comments say each type carries. */
static const struct {
    msg_type_t type;
    const char *name;
    const char *fields; /* space-separated keys */
} ttab[] = {
    {MSG_HELLO, "hello", "role rank replica pid"},
    {MSG_CONFIG, "config", "text step"},
    {MSG_READY, "ready", "role rank replica pid"},
    {MSG_STEP, "step", "step"},
    {MSG_STEP_DONE, "step_done", "step loss t_f t_b t_w t_busy t_wait mem"},
    {MSG_REDUCE, "reduce", "step"},
    {MSG_REDUCED, "reduced", "step t_busy grad_norm"},
    {MSG_UPDATE, "update", "step grad_norm scale"},
    {MSG_UPDATED, "updated", "step grad_norm lr t_busy"},
    {MSG_HEARTBEAT, "heartbeat", "role rank replica pid progress"},
    {MSG_ERROR, "error", "role rank replica pid text"},
    {MSG_STOP, "stop", ""},
    {MSG_SWAP, "swap", "text"},
    {MSG_REPLY, "reply", "ok text"},
    {MSG_STATUS, "status", ""},
    {MSG_SNAPSHOT, "snapshot", "step"},
    {MSG_SNAPPED, "snapped", "step t_busy"},
    {MSG_SAVE, "save", "step ok"},
    {MSG_SAVED, "saved", "step ok text t_busy progress"},
    {MSG_NCCL, "nccl", "data"},
    {MSG_LOAD, "load", "text"},
    {MSG_LOADED, "loaded", "ok step text data"},
    {MSG_SWAP_ARGV, "swap_argv", "data"},
    {MSG_ABORTED, "aborted", "step"},
    {MSG_REWIND, "rewind", "step ok data"},
    {MSG_LOST, "lost", "role rank replica pid text"},
    {MSG_SAVE_PART, "save_part", "step text"},
    {MSG_WRITTEN, "written", "step ok text t_busy progress"},
    {MSG_COMMIT, "commit", "step ok text"},
    {MSG_START, "start", "step ok text data"},
    {MSG_TRACE, "trace", "step data"},
    {MSG_REMAP, "remap", "step"},
    {MSG_REMAPPED, "remapped", "step t_busy"},
    {MSG_GIVEN_UP, "given_up", "text"},
};
#define NTYPES (sizeof ttab / sizeof ttab[0])

enum { T_NONNEG, T_INT, T_NUM, T_BOOL, T_STR, T_BIN };
static const struct {
    const char *key;
    int kind;
} ftab[] = {
    {"role", T_STR},  {"rank", T_NONNEG}, {"replica", T_NONNEG}, {"pid", T_INT},
    {"step", T_NONNEG}, {"progress", T_NONNEG}, {"loss", T_NUM}, {"grad_norm", T_NUM},
    {"scale", T_NUM}, {"lr", T_NUM}, {"t_f", T_NUM}, {"t_b", T_NUM}, {"t_w", T_NUM},
    {"t_busy", T_NUM}, {"t_wait", T_NUM}, {"ok", T_BOOL}, {"text", T_STR}, {"mem", T_NONNEG},
    {"data", T_BIN},
};
#define NFIELDS (sizeof ftab / sizeof ftab[0])

static int has_field(const char *fields, const char *key)
{
    size_t n = strlen(key);
    for (const char *p = fields; (p = strstr(p, key)); p += n)
        if ((p == fields || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

/* Every field set to a value that round-trips only if each is carried faithfully. */
static void fill_all(msg_t *m, msg_type_t t)
{
    memset(m, 0, sizeof *m);
    m->type = t;
    strcpy(m->role, "optshard");
    m->rank = INT32_MAX;
    m->replica = 3;
    m->pid = -4242; /* pid has no sign constraint */
    m->step = INT64_MAX;
    m->progress = UINT64_MAX;
    m->loss = 0.1;
    m->grad_norm = -1e-300;
    m->scale = 1e300;
    m->lr = 4.9406564584124654e-324; /* subnormal */
    m->t_f = 1.0 / 3;
    m->t_b = -2.5;
    m->t_w = 123456789.123456789;
    m->t_busy = 0.0;
    m->t_wait = 6.02214076e23;
    m->ok = 1;
    m->mem = UINT64_MAX - 1;
    assert_int_equal(msg_set_text(m, "[model]\ndim = 64 # héllo wörld ✓ 日本\n\ttab\r\n"), 0);
    uint8_t bytes[640];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (uint8_t)(i * 37 + 11); /* NULs included */
    assert_int_equal(msg_set_data(m, bytes, sizeof bytes), 0);
}

static int same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Compares the fields type t carries (the decoder leaves the others zero). */
static void assert_msg_equal(const msg_t *a, const msg_t *b, const char *fields)
{
    assert_int_equal(a->type, b->type);
#define F(k, expr)                                                                                \
    if (has_field(fields, k) && !(expr)) fail_msg("field %s differs", k)
    F("role", strcmp(a->role, b->role) == 0);
    F("rank", a->rank == b->rank);
    F("replica", a->replica == b->replica);
    F("pid", a->pid == b->pid);
    F("step", a->step == b->step);
    F("progress", a->progress == b->progress);
    F("loss", same_double(a->loss, b->loss));
    F("grad_norm", same_double(a->grad_norm, b->grad_norm));
    F("scale", same_double(a->scale, b->scale));
    F("lr", same_double(a->lr, b->lr));
    F("t_f", same_double(a->t_f, b->t_f));
    F("t_b", same_double(a->t_b, b->t_b));
    F("t_w", same_double(a->t_w, b->t_w));
    F("t_busy", same_double(a->t_busy, b->t_busy));
    F("t_wait", same_double(a->t_wait, b->t_wait));
    F("ok", a->ok == b->ok);
    F("mem", a->mem == b->mem);
    F("text", a->text && b->text && a->text_len == b->text_len &&
                  memcmp(a->text, b->text, a->text_len + 1) == 0);
    F("data", a->data && b->data && a->data_len == b->data_len &&
                  memcmp(a->data, b->data, a->data_len) == 0);
#undef F
}

static int decode_buf(const void *buf, size_t len, msg_t *m, char *err)
{
    err[0] = '\0';
    return msg_decode(buf, len, m, err, 256);
}

/* ---- a tiny writer for hand-made (often invalid) maps ---- */

enum { V_VALID, V_NIL, V_TRUE, V_POS, V_NEG, V_FLOAT, V_STR, V_BIN, V_ARRAY, V_MAP, V_EXT, V_N };

static void pk_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static void pk_value(msgpack_packer *pk, int v, int kind)
{
    switch (v) {
    case V_VALID:
        switch (kind) {
        case T_NONNEG: msgpack_pack_uint64(pk, 7); break;
        case T_INT: msgpack_pack_int64(pk, -7); break;
        case T_NUM: msgpack_pack_double(pk, 0.5); break;
        case T_BOOL: msgpack_pack_true(pk); break;
        case T_STR: pk_str(pk, "stage"); break;
        case T_BIN: msgpack_pack_bin(pk, 3); msgpack_pack_bin_body(pk, "a\0b", 3); break;
        }
        break;
    case V_NIL: msgpack_pack_nil(pk); break;
    case V_TRUE: msgpack_pack_true(pk); break;
    case V_POS: msgpack_pack_int(pk, 7); break;
    case V_NEG: msgpack_pack_int(pk, -7); break;
    case V_FLOAT: msgpack_pack_float(pk, 1.5f); break;
    case V_STR: pk_str(pk, "x"); break;
    case V_BIN: msgpack_pack_bin(pk, 2); msgpack_pack_bin_body(pk, "ab", 2); break;
    case V_ARRAY: msgpack_pack_array(pk, 1); msgpack_pack_int(pk, 1); break;
    case V_MAP: msgpack_pack_map(pk, 1); pk_str(pk, "k"); msgpack_pack_int(pk, 1); break;
    case V_EXT: msgpack_pack_ext(pk, 1, 5); msgpack_pack_ext_body(pk, "a", 1); break;
    }
}

static int accepts(int kind, int v)
{
    switch (kind) {
    case T_NONNEG: return v == V_POS;
    case T_INT: return v == V_POS || v == V_NEG;
    case T_NUM: return v == V_POS || v == V_NEG || v == V_FLOAT;
    case T_BOOL: return v == V_TRUE;
    case T_STR: return v == V_STR;
    case T_BIN: return v == V_BIN;
    }
    return 0;
}

/* {"v":1,"type":name, fields...}, leaving out `skip` and writing value `v` for `key`. */
static void build(msgpack_sbuffer *sb, const char *name, const char *fields, const char *skip,
                  const char *key, int v)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    size_t n = 2;
    for (size_t i = 0; i < NFIELDS; i++)
        n += has_field(fields, ftab[i].key) && !(skip && strcmp(skip, ftab[i].key) == 0);
    msgpack_pack_map(&pk, n);
    pk_str(&pk, "v");
    msgpack_pack_int(&pk, 1);
    pk_str(&pk, "type");
    pk_str(&pk, name);
    for (size_t i = 0; i < NFIELDS; i++) {
        const char *k = ftab[i].key;
        if (!has_field(fields, k) || (skip && strcmp(skip, k) == 0)) continue;
        pk_str(&pk, k);
        pk_value(&pk, key && strcmp(key, k) == 0 ? v : V_VALID, ftab[i].kind);
    }
}

/* Bytes from hex digits; spaces are only for reading. */
static size_t raw_map(uint8_t *out, const char *hex)
{
    size_t n = 0;
    int half = -1;
    for (const char *p = hex; *p; p++) {
        if (*p == ' ') continue;
        int d = *p <= '9' ? *p - '0' : (*p | 0x20) - 'a' + 10;
        if (half < 0) {
            half = d;
        } else {
            out[n++] = (uint8_t)(half << 4 | d);
            half = -1;
        }
    }
    assert_true(half < 0);
    return n;
}

/* ---- tests ---- */

static void test_msg_type_names_are_the_wire_names(void **state)
{
    for (size_t i = 0; i < NTYPES; i++)
        assert_string_equal(msg_type_name(ttab[i].type), ttab[i].name);
    assert_int_equal(NTYPES, MSG_TYPE_END - 1);
    assert_null(msg_type_name(0));
    assert_null(msg_type_name(MSG_TYPE_END));
    assert_null(msg_type_name((msg_type_t)-1));
}

static void test_msg_encoding_carries_exactly_the_fields_of_each_type(void **state)
{
    for (size_t i = 0; i < NTYPES; i++) {
        msg_t m;
        fill_all(&m, ttab[i].type);
        uint8_t *buf;
        size_t len;
        assert_int_equal(msg_encode(&m, &buf, &len), 0);
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        size_t off = 0;
        assert_int_equal(msgpack_unpack_next(&up, (const char *)buf, len, &off),
                         MSGPACK_UNPACK_SUCCESS);
        assert_int_equal(off, len);
        assert_int_equal(up.data.type, MSGPACK_OBJECT_MAP);
        size_t want = 2;
        for (size_t f = 0; f < NFIELDS; f++) want += has_field(ttab[i].fields, ftab[f].key);
        assert_int_equal(up.data.via.map.size, want);
        for (uint32_t k = 0; k < up.data.via.map.size; k++) {
            msgpack_object *key = &up.data.via.map.ptr[k].key, *val = &up.data.via.map.ptr[k].val;
            assert_int_equal(key->type, MSGPACK_OBJECT_STR);
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)key->via.str.size, key->via.str.ptr);
            if (strcmp(name, "v") == 0) {
                assert_int_equal(val->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
                assert_int_equal(val->via.u64, MSG_VERSION);
            } else if (strcmp(name, "type") == 0) {
                assert_int_equal(val->type, MSGPACK_OBJECT_STR);
                assert_int_equal(val->via.str.size, strlen(ttab[i].name));
                assert_memory_equal(val->via.str.ptr, ttab[i].name, val->via.str.size);
            } else if (!has_field(ttab[i].fields, name)) {
                fail_msg("%s carries unexpected key %s", ttab[i].name, name);
            }
        }
        msgpack_unpacked_destroy(&up);
        free(buf);
        msg_clear(&m);
    }
}

static void test_msg_round_trips_every_type_with_all_its_fields(void **state)
{
    for (size_t i = 0; i < NTYPES; i++) {
        msg_t m, d;
        fill_all(&m, ttab[i].type);
        uint8_t *buf;
        size_t len;
        char err[256];
        assert_int_equal(msg_encode(&m, &buf, &len), 0);
        int rc = decode_buf(buf, len, &d, err);
        if (rc) fail_msg("%s: %s", ttab[i].name, err);
        assert_msg_equal(&m, &d, ttab[i].fields);
        if (!has_field(ttab[i].fields, "text")) assert_null(d.text);
        if (!has_field(ttab[i].fields, "data")) assert_null(d.data);
        free(buf);
        msg_clear(&m);
        msg_clear(&d);
    }
}

static void test_msg_round_trips_edge_values(void **state)
{
    msg_t m = {.type = MSG_HEARTBEAT, .rank = 0, .replica = 0, .pid = INT64_MIN, .progress = 0};
    memset(m.role, 'r', MSG_ROLE_MAX - 1); /* longest role */
    msg_t d;
    uint8_t *buf;
    size_t len;
    char err[256];
    assert_int_equal(msg_encode(&m, &buf, &len), 0);
    assert_int_equal(decode_buf(buf, len, &d, err), 0);
    assert_msg_equal(&m, &d, "role rank replica pid progress");
    free(buf);

    msg_t s = {.type = MSG_STEP_DONE, .step = 0, .loss = NAN, .t_f = INFINITY, .t_b = -INFINITY,
               .t_w = -0.0, .t_busy = DBL_MAX, .t_wait = DBL_MIN};
    assert_int_equal(msg_encode(&s, &buf, &len), 0);
    assert_int_equal(decode_buf(buf, len, &d, err), 0);
    assert_msg_equal(&s, &d, "step loss t_f t_b t_w t_busy t_wait");
    free(buf);

    msg_t r = {.type = MSG_REPLY, .ok = 0};
    assert_int_equal(msg_set_text(&r, ""), 0);
    assert_int_equal(msg_encode(&r, &buf, &len), 0);
    assert_int_equal(decode_buf(buf, len, &d, err), 0);
    assert_int_equal(d.ok, 0);
    assert_string_equal(d.text, "");
    assert_int_equal(d.text_len, 0);
    free(buf);
    msg_clear(&d);
    msg_clear(&r);
}

static void test_msg_accepts_integers_for_doubles_and_ignores_unknown_keys(void **state)
{
    uint8_t b[128];
    /* {"v":1,"type":"reduced","step":5,"t_busy":-3,"grad_norm":0,"zz":[1,{"a":[nil]}],"x":"y"} */
    size_t n = raw_map(b, "87 a176 01 a474797065 a772656475636564 a473746570 05 a6745f62757379 fd"
                          "a9677261645f6e6f726d 00 a27a7a 92 01 81 a161 91 c0 a178 a179");
    msg_t m;
    char err[256];
    int rc = decode_buf(b, n, &m, err);
    if (rc) fail_msg("%s", err);
    assert_int_equal(m.type, MSG_REDUCED);
    assert_int_equal(m.step, 5);
    assert_true(m.t_busy == -3.0);
    /* a float32 is widened exactly */
    n = raw_map(b, "84 a176 01 a474797065 a772656475636564 a473746570 05 a9677261645f6e6f726d 00");
    b[0] = 0x85;
    n += raw_map(b + n, "a6745f62757379 ca 3fc00000");
    assert_int_equal(decode_buf(b, n, &m, err), 0);
    assert_true(m.t_busy == 1.5);
}

static void test_msg_rejects_unknown_version(void **state)
{
    uint8_t b[64];
    size_t n = raw_map(b, "82 a176 02 a474797065 a473746f70"); /* {"v":2,"type":"stop"} */
    msg_t m;
    char err[256];
    assert_int_equal(decode_buf(b, n, &m, err), -EPROTO);
    assert_string_equal(err, "unsupported message version 2 (this build speaks 1)");
    n = raw_map(b, "82 a176 00 a474797065 a473746f70");
    assert_int_equal(decode_buf(b, n, &m, err), -EPROTO);
    n = raw_map(b, "82 a176 cf ffffffffffffffff a474797065 a473746f70");
    assert_int_equal(decode_buf(b, n, &m, err), -EPROTO);
    assert_err_has(err, "18446744073709551615");
}

static void test_msg_rejects_missing_or_mistyped_version(void **state)
{
    uint8_t b[64];
    msg_t m;
    char err[256];
    size_t n = raw_map(b, "81 a474797065 a473746f70"); /* {"type":"stop"} */
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "missing field 'v'");
    n = raw_map(b, "82 a176 a131 a474797065 a473746f70"); /* "v":"1" */
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "field 'v' must be a positive integer, got a string");
    n = raw_map(b, "82 a176 ff a474797065 a473746f70"); /* "v":-1 */
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "field 'v'");
    n = raw_map(b, "82 a176 cb 3ff0000000000000 a474797065 a473746f70"); /* "v":1.0 */
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "got a float");
}

static void test_msg_rejects_missing_or_mistyped_type(void **state)
{
    uint8_t b[64];
    msg_t m;
    char err[256];
    size_t n = raw_map(b, "81 a176 01");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "missing field 'type'");
    n = raw_map(b, "82 a176 01 a474797065 03");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "field 'type' must be a string, got an integer");
}

static void test_msg_rejects_unknown_type(void **state)
{
    uint8_t b[64];
    msg_t m;
    char err[256];
    size_t n = raw_map(b, "82 a176 01 a474797065 a3666f6f");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "unknown message type 'foo'");
    /* names are matched exactly, and odd bytes are escaped in the message */
    n = raw_map(b, "82 a176 01 a474797065 a573746f7000");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "unknown message type 'stop\\x00'");
    n = raw_map(b, "82 a176 01 a474797065 a0");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "unknown message type ''");
}

static void test_msg_rejects_each_field_with_a_wrong_msgpack_type(void **state)
{
    int checked = 0;
    for (size_t i = 0; i < NTYPES; i++)
        for (size_t f = 0; f < NFIELDS; f++) {
            if (!has_field(ttab[i].fields, ftab[f].key)) continue;
            for (int v = V_NIL; v < V_N; v++) {
                msgpack_sbuffer sb;
                build(&sb, ttab[i].name, ttab[i].fields, NULL, ftab[f].key, v);
                msg_t m;
                char err[256], want[128];
                int rc = decode_buf(sb.data, sb.size, &m, err);
                if (accepts(ftab[f].kind, v)) {
                    if (rc) fail_msg("%s.%s value %d: %s", ttab[i].name, ftab[f].key, v, err);
                } else {
                    if (rc != -EBADMSG)
                        fail_msg("%s.%s accepted value kind %d", ttab[i].name, ftab[f].key, v);
                    snprintf(want, sizeof want, "%s: field '%s' must be ", ttab[i].name,
                             ftab[f].key);
                    assert_err_has(err, want);
                    checked++;
                }
                msg_clear(&m);
                msgpack_sbuffer_destroy(&sb);
            }
        }
    assert_true(checked > 200);
    /* the wording of the example in msg.h */
    msgpack_sbuffer sb;
    build(&sb, "step_done", "step loss t_f t_b t_w t_busy t_wait", NULL, "loss", V_STR);
    msg_t m;
    char err[256];
    assert_int_equal(decode_buf(sb.data, sb.size, &m, err), -EBADMSG);
    assert_string_equal(err, "step_done: field 'loss' must be a number, got a string");
    msgpack_sbuffer_destroy(&sb);
}

static void test_msg_rejects_each_missing_field(void **state)
{
    for (size_t i = 0; i < NTYPES; i++) {
        msgpack_sbuffer sb;
        msg_t m;
        char err[256], want[128];
        build(&sb, ttab[i].name, ttab[i].fields, NULL, NULL, 0);
        int rc = decode_buf(sb.data, sb.size, &m, err);
        if (rc) fail_msg("%s: %s", ttab[i].name, err);
        msg_clear(&m);
        msgpack_sbuffer_destroy(&sb);
        for (size_t f = 0; f < NFIELDS; f++) {
            if (!has_field(ttab[i].fields, ftab[f].key)) continue;
            build(&sb, ttab[i].name, ttab[i].fields, ftab[f].key, NULL, 0);
            assert_int_equal(decode_buf(sb.data, sb.size, &m, err), -EBADMSG);
            snprintf(want, sizeof want, "%s: missing field '%s'", ttab[i].name, ftab[f].key);
            assert_string_equal(err, want);
            msgpack_sbuffer_destroy(&sb);
        }
    }
}

static void test_msg_rejects_negative_and_out_of_range_integers(void **state)
{
    const char *who = "82 a176 01 a474797065 a5 72 65 61 64 79"; /* "ready" */
    uint8_t b[128];
    msg_t m;
    char err[256];
    size_t n;
    /* rank -1 */
    n = raw_map(b, who);
    b[0] = 0x85;
    n += raw_map(b + n, "a4726f6c65 a57374616765 a472616e6b ff a77265706c696361 00");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "ready: field 'rank' must be a non-negative 32-bit integer, got -1");
    /* rank 2^31 */
    n = raw_map(b, who);
    b[0] = 0x85;
    n += raw_map(b + n, "a4726f6c65 a57374616765 a472616e6b ce80000000 a77265706c696361 00");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "field 'rank'");
    assert_err_has(err, "2147483648");
    /* replica -128 */
    n = raw_map(b, who);
    b[0] = 0x85;
    n += raw_map(b + n, "a4726f6c65 a57374616765 a472616e6b 00 a77265706c696361 d080");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "ready: field 'replica'");
    /* step -1 */
    n = raw_map(b, "83 a176 01 a474797065 a473746570 a473746570 ff");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "step: field 'step' must be a non-negative 64-bit integer, got -1");
    /* step 2^63 */
    n = raw_map(b, "83 a176 01 a474797065 a473746570 a473746570 cf8000000000000000");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "9223372036854775808");
    /* the largest step is fine */
    n = raw_map(b, "83 a176 01 a474797065 a473746570 a473746570 cf7fffffffffffffff");
    assert_int_equal(decode_buf(b, n, &m, err), 0);
    assert_true(m.step == INT64_MAX);
}

static void test_msg_rejects_a_role_too_long_for_msg_t(void **state)
{
    uint8_t b[128];
    msg_t m;
    char err[256];
    /* ready with role "sixteen-bytes-ab" (16 bytes) */
    size_t n = raw_map(b, "85 a176 01 a474797065 a57265616479 a4726f6c65 b0"
                          "7369787465656e2d62797465732d6162 a472616e6b 00 a77265706c696361 00");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "ready: field 'role' is 16 bytes long, at most 15 allowed");
    /* 15 bytes fit */
    n = raw_map(b, "86 a176 01 a474797065 a57265616479 a4726f6c65 af"
                   "7369787465656e2d6279746573 2d61 a472616e6b 00 a77265706c696361 00 a3706964 00");
    assert_int_equal(decode_buf(b, n, &m, err), 0);
    assert_string_equal(m.role, "sixteen-bytes-a");
    /* the encoder refuses an unterminated role */
    msg_t e = {.type = MSG_READY};
    memset(e.role, 'x', MSG_ROLE_MAX);
    uint8_t *buf = (uint8_t *)"untouched";
    size_t len = 1;
    assert_int_equal(msg_encode(&e, &buf, &len), -EINVAL);
    assert_null(buf);
}

static void test_msg_rejects_text_containing_nul(void **state)
{
    uint8_t b[64];
    msg_t m;
    char err[256];
    size_t n = raw_map(b, "83 a176 01 a474797065 a473776170 a474657874 a3610062"); /* "a\0b" */
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "swap: field 'text' contains a NUL byte");
    assert_null(m.text);
    n = raw_map(b, "85 a176 01 a474797065 a57265616479 a4726f6c65 a2 6100"
                   "a472616e6b 00 a77265706c696361 00");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "field 'role' contains a NUL byte");
}

static void test_msg_rejects_a_top_level_that_is_not_a_map(void **state)
{
    static const struct {
        const char *hex, *what;
    } cases[] = {
        {"92 a176 01", "not a msgpack map (got an array)"},
        {"01", "not a msgpack map (got an integer)"},
        {"c0", "not a msgpack map (got nil)"},
        {"a473746f70", "not a msgpack map (got a string)"},
        {"cb 3ff0000000000000", "not a msgpack map (got a float)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t b[64];
        msg_t m;
        char err[256];
        size_t n = raw_map(b, cases[i].hex);
        assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
        assert_string_equal(err, cases[i].what);
    }
}

static void test_msg_rejects_keys_that_are_not_strings(void **state)
{
    uint8_t b[64];
    msg_t m;
    char err[256];
    size_t n = raw_map(b, "83 a176 01 a474797065 a473746f70 01 02");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "message keys must be strings, got an integer");
    n = raw_map(b, "82 c40176 01 a474797065 a473746f70"); /* bin "v" */
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_err_has(err, "got binary data");
}

static void test_msg_rejects_every_truncation_of_a_valid_message(void **state)
{
    for (size_t i = 0; i < NTYPES; i++) {
        msg_t m, d;
        fill_all(&m, ttab[i].type);
        uint8_t *buf;
        size_t len;
        char err[256];
        assert_int_equal(msg_encode(&m, &buf, &len), 0);
        for (size_t cut = 0; cut < len; cut++) {
            uint8_t *p = malloc(cut ? cut : 1); /* exact size: ASan sees any over-read */
            memcpy(p, buf, cut);
            assert_int_equal(decode_buf(p, cut, &d, err), -EBADMSG);
            assert_err_has(err, "message truncated");
            assert_null(d.text);
            free(p);
        }
        free(buf);
        msg_clear(&m);
    }
}

static void test_msg_rejects_trailing_bytes(void **state)
{
    msg_t m = {.type = MSG_STEP, .step = 9}, d;
    uint8_t *buf;
    size_t len;
    char err[256];
    assert_int_equal(msg_encode(&m, &buf, &len), 0);
    uint8_t *p = malloc(len + 3);
    memcpy(p, buf, len);
    memcpy(p + len, "\xc0\x01\x02", 3);
    assert_int_equal(decode_buf(p, len + 1, &d, err), -EBADMSG);
    assert_string_equal(err, "1 trailing bytes after the message");
    assert_int_equal(decode_buf(p, len + 3, &d, err), -EBADMSG);
    assert_string_equal(err, "3 trailing bytes after the message");
    assert_int_equal(decode_buf(p, len, &d, err), 0); /* and the message alone is fine */
    free(p);
    free(buf);
}

static void test_msg_rejects_oversized_messages(void **state)
{
    size_t big = MSG_MAX_BYTES + 1;
    uint8_t *p = calloc(1, big);
    msg_t d;
    char err[256];
    assert_int_equal(decode_buf(p, big, &d, err), -EMSGSIZE);
    assert_err_has(err, "over the limit");
    free(p);
    /* the encoder will not produce one either */
    char *text = malloc(MSG_MAX_BYTES);
    memset(text, 'a', MSG_MAX_BYTES - 1);
    text[MSG_MAX_BYTES - 1] = '\0';
    msg_t m = {.type = MSG_SWAP, .text = text};
    uint8_t *buf;
    size_t len;
    assert_int_equal(msg_encode(&m, &buf, &len), -EMSGSIZE);
    /* while a message just under the limit goes through */
    text[MSG_MAX_BYTES - 100] = '\0';
    assert_int_equal(msg_encode(&m, &buf, &len), 0);
    assert_true(len <= MSG_MAX_BYTES);
    assert_int_equal(decode_buf(buf, len, &d, err), 0);
    assert_int_equal(d.text_len, MSG_MAX_BYTES - 100);
    free(buf);
    free(text);
    msg_clear(&d);
}

static void test_msg_rejects_duplicate_keys(void **state)
{
    uint8_t b[64];
    msg_t m;
    char err[256];
    size_t n = raw_map(b, "84 a176 01 a474797065 a473746570 a473746570 01 a473746570 02");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "duplicate key 'step'");
    n = raw_map(b, "84 a176 01 a474797065 a473746f70 a178 01 a178 02"); /* unused key too */
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "duplicate key 'x'");
    n = raw_map(b, "83 a176 01 a176 01 a474797065 a473746f70");
    assert_int_equal(decode_buf(b, n, &m, err), -EBADMSG);
    assert_string_equal(err, "duplicate key 'v'");

    /* a big map: 10000 distinct keys, then one repeated far apart */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 10003);
    pk_str(&pk, "v");
    msgpack_pack_int(&pk, 1);
    pk_str(&pk, "type");
    pk_str(&pk, "stop");
    char k[16];
    for (int i = 0; i < 10000; i++) {
        snprintf(k, sizeof k, "k%d", i);
        pk_str(&pk, k);
        msgpack_pack_nil(&pk);
    }
    pk_str(&pk, "k17");
    msgpack_pack_nil(&pk);
    assert_int_equal(decode_buf(sb.data, sb.size, &m, err), -EBADMSG);
    assert_string_equal(err, "duplicate key 'k17'");
    msgpack_sbuffer_destroy(&sb);
}

/* {"v":1, "type":"step", "step":41 (unless skipped), and n unused keys around them} */
static void build_big(msgpack_sbuffer *sb, int n, int with_step)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (size_t)n + 2 + with_step);
    char k[16];
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof k, "k%d", i);
        pk_str(&pk, k);
        msgpack_pack_int(&pk, i);
        if (i == n / 2) {
            pk_str(&pk, "type");
            pk_str(&pk, "step");
        }
        if (i == n / 3 && with_step) {
            pk_str(&pk, "step");
            msgpack_pack_int(&pk, 41);
        }
    }
    pk_str(&pk, "v");
    msgpack_pack_int(&pk, 1);
}

static void test_msg_finds_fields_among_many_unused_keys(void **state)
{
    msgpack_sbuffer sb;
    msg_t m;
    char err[256];
    build_big(&sb, 50000, 1);
    int rc = decode_buf(sb.data, sb.size, &m, err);
    if (rc) fail_msg("%s", err);
    assert_int_equal(m.type, MSG_STEP);
    assert_int_equal(m.step, 41);
    msgpack_sbuffer_destroy(&sb);
    build_big(&sb, 50000, 0);
    assert_int_equal(decode_buf(sb.data, sb.size, &m, err), -EBADMSG);
    assert_string_equal(err, "step: missing field 'step'");
    msgpack_sbuffer_destroy(&sb);
}

static void test_msg_rejects_deep_nesting_without_recursing(void **state)
{
    enum { DEPTH = 100000 };
    uint8_t *p = malloc(DEPTH + 32);
    msg_t m;
    char err[256];
    /* [[[[...nil...]]]] */
    memset(p, 0x91, DEPTH);
    p[DEPTH] = 0xc0;
    assert_int_equal(decode_buf(p, DEPTH + 1, &m, err), -EBADMSG);
    assert_err_has(err, "nested more than");
    /* {{{{...}: nil}: nil}...}: maps nested in key position */
    memset(p, 0x81, DEPTH);
    assert_int_equal(decode_buf(p, DEPTH + 1, &m, err), -EBADMSG);
    assert_err_has(err, "nested more than");
    /* the same under an unused key of a real message: {"v":1,"type":"stop","x":[[[...]]]} */
    size_t n = raw_map(p, "83 a176 01 a474797065 a473746f70 a178");
    memset(p + n, 0xdd, 1); /* array32 of 1 */
    memcpy(p + n + 1, "\x00\x00\x00\x01", 4);
    memset(p + n + 5, 0x91, DEPTH - 40);
    p[n + 5 + DEPTH - 40] = 0xc0;
    assert_int_equal(decode_buf(p, n + 6 + DEPTH - 40, &m, err), -EBADMSG);
    assert_err_has(err, "nested more than");
    /* while modest nesting under an unused key is ignored */
    memset(p + n, 0x91, 8);
    p[n + 8] = 0xc0;
    assert_int_equal(decode_buf(p, n + 9, &m, err), 0);
    assert_int_equal(m.type, MSG_STOP);
    free(p);
}

static void test_msg_huge_declared_lengths_do_not_allocate(void **state)
{
    /* each is a tiny buffer declaring up to 2^32-1 items or bytes; msgpack-c would allocate
     * the element array up front (64 GiB for the array) */
    static const char *cases[] = {
        "dd ffffffff",            "df ffffffff",           "df ffffffff a176 01",
        "dc ffff 01",             "de ffff",               "db ffffffff 61",
        "c6 ffffffff",            "c9 ffffffff 01",        "c7 ff 01",
        "81 a474797065 dbffffffff", "83 a176 01 a178 dd7fffffff 91 91",
        "d8 01",                   "cf 01",                 "d9",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t b[64];
        size_t n = raw_map(b, cases[i]);
        uint8_t *p = malloc(n);
        memcpy(p, b, n);
        msg_t m;
        char err[256];
        assert_int_equal(decode_buf(p, n, &m, err), -EBADMSG);
        assert_err_has(err, "truncated");
        free(p);
    }
    uint8_t c1[] = {0x81, 0xc1, 0x01};
    msg_t m;
    char err[256];
    assert_int_equal(decode_buf(c1, sizeof c1, &m, err), -EBADMSG);
    assert_string_equal(err, "invalid msgpack byte 0xc1");
}

static void test_msg_encode_rejects_what_cannot_be_sent(void **state)
{
    uint8_t *buf;
    size_t len;
    msg_t m = {.type = 0};
    assert_int_equal(msg_encode(&m, &buf, &len), -EINVAL);
    m.type = MSG_TYPE_END;
    assert_int_equal(msg_encode(&m, &buf, &len), -EINVAL);
    m.type = MSG_SWAP; /* text required */
    assert_int_equal(msg_encode(&m, &buf, &len), -EINVAL);
    m.type = MSG_READY;
    m.rank = -1;
    assert_int_equal(msg_encode(&m, &buf, &len), -EINVAL);
    m.type = MSG_STEP;
    m.step = -5;
    assert_int_equal(msg_encode(&m, &buf, &len), -EINVAL);
    m = (msg_t){.type = MSG_NCCL, .data_len = 4}; /* a length without bytes */
    assert_int_equal(msg_encode(&m, &buf, &len), -EINVAL);
    m.data_len = 0; /* empty binary is binary */
    assert_int_equal(msg_encode(&m, &buf, &len), 0);
    free(buf);
    /* a type without text ignores a stray text pointer */
    m = (msg_t){.type = MSG_STOP};
    assert_int_equal(msg_encode(&m, &buf, &len), 0);
    assert_int_equal(len, 1 + 2 + 1 + 5 + 5); /* {"v":1,"type":"stop"} */
    free(buf);
}

static void test_msg_set_text_replaces_and_clear_frees(void **state)
{
    msg_t m = {0};
    assert_int_equal(msg_set_text(&m, "one"), 0);
    assert_int_equal(msg_set_text(&m, "two and more"), 0);
    assert_string_equal(m.text, "two and more");
    assert_int_equal(m.text_len, 12);
    assert_int_equal(msg_set_data(&m, "\0\1\2", 3), 0);
    assert_int_equal(msg_set_data(&m, "xy", 2), 0);
    assert_memory_equal(m.data, "xy", 2);
    assert_int_equal(m.data_len, 2);
    msg_clear(&m);
    assert_null(m.text);
    assert_int_equal(m.text_len, 0);
    assert_null(m.data);
    msg_clear(&m);
    msg_clear(NULL);
}

/* A decode either fails cleanly or yields a message that re-encodes to itself. */
static int check_decode(const uint8_t *p, size_t n)
{
    msg_t m, d;
    char err[256];
    int rc = msg_decode(p, n, &m, err, sizeof err);
    if (rc) {
        if (rc != -EBADMSG && rc != -EPROTO && rc != -EMSGSIZE) fail_msg("rc %d: %s", rc, err);
        if (!err[0]) fail_msg("rc %d without a reason", rc);
        if (m.text || m.data || m.type) fail_msg("failed decode left a message behind");
        return 0;
    }
    uint8_t *buf;
    size_t len;
    assert_int_equal(msg_encode(&m, &buf, &len), 0);
    assert_int_equal(msg_decode(buf, len, &d, err, sizeof err), 0);
    assert_msg_equal(&m, &d, ttab[m.type - 1].fields);
    free(buf);
    msg_clear(&m);
    msg_clear(&d);
    return 1;
}

static void test_msg_fuzz_random_bytes(void **state)
{
    uint64_t s = 12345;
    uint8_t buf[96];
    for (int it = 0; it < 100000; it++) {
        size_t n = tu_next(&s) % sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)tu_next(&s);
        if (n && it % 2) buf[0] = 0x80 | (buf[0] & 0x0f); /* often a fixmap, to get further */
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, buf, n);
        check_decode(p, n);
        free(p);
    }
}

static void test_msg_fuzz_mutations_of_valid_encodings(void **state)
{
    uint8_t *enc[NTYPES];
    size_t enclen[NTYPES];
    for (size_t i = 0; i < NTYPES; i++) {
        msg_t m;
        fill_all(&m, ttab[i].type);
        assert_int_equal(msg_encode(&m, &enc[i], &enclen[i]), 0);
        msg_clear(&m);
    }
    uint64_t s = 777;
    int valid = 0;
    uint8_t work[2048]; /* the longest encoding (640 bytes of data, text) and room to grow */
    for (int it = 0; it < 100000; it++) {
        size_t t = tu_next(&s) % NTYPES, n = enclen[t];
        memcpy(work, enc[t], n);
        tu_mutate(work, &n, sizeof work, &s);
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, work, n);
        valid += check_decode(p, n);
        free(p);
    }
    for (size_t i = 0; i < NTYPES; i++) free(enc[i]);
    assert_true(valid > 1000); /* mutations that keep a message valid are exercised too */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_msg_type_names_are_the_wire_names),
        cmocka_unit_test(test_msg_encoding_carries_exactly_the_fields_of_each_type),
        cmocka_unit_test(test_msg_round_trips_every_type_with_all_its_fields),
        cmocka_unit_test(test_msg_round_trips_edge_values),
        cmocka_unit_test(test_msg_accepts_integers_for_doubles_and_ignores_unknown_keys),
        cmocka_unit_test(test_msg_rejects_unknown_version),
        cmocka_unit_test(test_msg_rejects_missing_or_mistyped_version),
        cmocka_unit_test(test_msg_rejects_missing_or_mistyped_type),
        cmocka_unit_test(test_msg_rejects_unknown_type),
        cmocka_unit_test(test_msg_rejects_each_field_with_a_wrong_msgpack_type),
        cmocka_unit_test(test_msg_rejects_each_missing_field),
        cmocka_unit_test(test_msg_rejects_negative_and_out_of_range_integers),
        cmocka_unit_test(test_msg_rejects_a_role_too_long_for_msg_t),
        cmocka_unit_test(test_msg_rejects_text_containing_nul),
        cmocka_unit_test(test_msg_rejects_a_top_level_that_is_not_a_map),
        cmocka_unit_test(test_msg_rejects_keys_that_are_not_strings),
        cmocka_unit_test(test_msg_rejects_every_truncation_of_a_valid_message),
        cmocka_unit_test(test_msg_rejects_trailing_bytes),
        cmocka_unit_test(test_msg_rejects_oversized_messages),
        cmocka_unit_test(test_msg_rejects_duplicate_keys),
        cmocka_unit_test(test_msg_finds_fields_among_many_unused_keys),
        cmocka_unit_test(test_msg_rejects_deep_nesting_without_recursing),
        cmocka_unit_test(test_msg_huge_declared_lengths_do_not_allocate),
        cmocka_unit_test(test_msg_encode_rejects_what_cannot_be_sent),
        cmocka_unit_test(test_msg_set_text_replaces_and_clear_frees),
        cmocka_unit_test(test_msg_fuzz_random_bytes),
        cmocka_unit_test(test_msg_fuzz_mutations_of_valid_encodings),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
