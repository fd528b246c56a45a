/* The checkpoint format's names and index (see ckpt.h): the plan of a checkpoint's files and
 * chunks, the data file header, and the index's encoding and checked decoding. Reading data
 * back is ckpt.c; step folders, latest and retention are ckpt_dir.c. */
#include "checkpointd/ckpt.h"

#include <errno.h>
#include <inttypes.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "ipc/codec.h"
#include "ipc/util.h"

#define INDEX_HDR 24   /* magic 8, version 4, reserved 4, body length 8 */
#define INDEX_TAIL 8   /* XXH64 of everything before it */

int ckpt_safe_name(const char *s)
{
    size_t n = strnlen(s, CKPT_FILE_MAX);
    if (n < 1 || n >= CKPT_FILE_MAX || s[0] == '.')
        return 0;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '.' ||
              *s == '_' || *s == '-'))
            return 0;
    return 1;
}

const char *ckpt_shape_str(int ndim, const int64_t *shape, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

size_t ckpt_dtype_size(const char *dtype)
{
    if (!strcmp(dtype, "F32"))
        return 4;
    if (!strcmp(dtype, "BF16"))
        return 2;
    return 0;
}

/* ---- plan ---- */

/* What every plan has: step, time, manifest, cursor, room for n_files files (named for n_parts
 * parts), and a tensor per array of the training state and parameter, each with its name, dtype
 * and shape (chunks left to the caller). */
static int plan_head(ckpt_index_t *ix, const param_table_t *tab, const optim_t *o, int64_t step,
                     const char *manifest, const void *cursor, size_t cursor_len, int n_parts)
{
    int arrays = optim_arrays(o), n_files = ckpt_files(o, n_parts);
    memset(ix, 0, sizeof(*ix));
    if (cursor_len > CKPT_CURSOR_MAX)
        return -EINVAL;
    ix->step = step;
    ix->created = (int64_t)time(NULL);
    ix->manifest = strdup(manifest ? manifest : "");
    ix->files = calloc((size_t)n_files, sizeof(ckpt_file_t));
    ix->tensors = calloc((size_t)arrays * (size_t)tab->n, sizeof(ckpt_tensor_t));
    if (!ix->manifest || !ix->files || !ix->tensors) {
        ckpt_index_free(ix);
        return -ENOMEM;
    }
    if (cursor_len)
        memcpy(ix->cursor, cursor, cursor_len);
    ix->cursor_len = (uint32_t)cursor_len;
    ix->n_files = n_files;
    for (int f = 0; f < n_files; f++)
        ckpt_file_name(o, (uint32_t)f, n_parts, ix->files[f].name, CKPT_FILE_MAX);
    for (int a = 0; a < arrays; a++)
        for (int i = 0; i < tab->n; i++) {
            const param_info_t *p = &tab->t[i];
            ckpt_tensor_t *t = &ix->tensors[ix->n_tensors++];
            ckpt_tensor_name(o, a, p->name, t->name, sizeof(t->name));
            snprintf(t->dtype, sizeof(t->dtype), "F32");
            t->ndim = p->ndim;
            for (int d = 0; d < p->ndim; d++)
                t->shape[d] = p->shape[d];
            t->numel = p->numel;
        }
    return 0;
}

int ckpt_index_plan(ckpt_index_t *ix, const param_table_t *tab, const optim_t *o, int64_t step, const char *manifest,
                    const void *cursor, size_t cursor_len)
{
    int rc = plan_head(ix, tab, o, step, manifest, cursor, cursor_len, 1);
    if (rc)
        return rc;
    for (int f = 0; f < ix->n_files; f++)
        ix->files[f].bytes = CKPT_DATA_HDR + (uint64_t)tab->total * sizeof(float);
    for (int f = 0; f < ix->n_files; f++)
        for (int i = 0; i < tab->n; i++) {
            const param_info_t *p = &tab->t[i];
            ckpt_tensor_t *t = &ix->tensors[f * tab->n + i];
            uint64_t bytes = (uint64_t)p->numel * sizeof(float);
            t->n_chunks = (uint32_t)((bytes + CKPT_CHUNK_BYTES - 1) / CKPT_CHUNK_BYTES);
            t->chunks = calloc(t->n_chunks ? t->n_chunks : 1, sizeof(ckpt_chunk_t));
            if (!t->chunks) {
                ckpt_index_free(ix);
                return -ENOMEM;
            }
            for (uint32_t c = 0; c < t->n_chunks; c++) {
                uint64_t off = (uint64_t)c * CKPT_CHUNK_BYTES;
                t->chunks[c] = (ckpt_chunk_t){.file = (uint32_t)f,
                                              .offset = CKPT_DATA_HDR + p->offset * sizeof(float) + off,
                                              .length = bytes - off < CKPT_CHUNK_BYTES ? bytes - off : CKPT_CHUNK_BYTES};
            }
        }
    return 0;
}

/* The chunks of elements [tb, te) of array a in a plan in parts: runs of ranges of one part are
 * contiguous in that part's files (its ranges lie back to back there), so a chunk ends at
 * CKPT_CHUNK_BYTES, at the tensor's end, or where the owner changes. at[i]: the byte offset of
 * range i in its part's files. With out NULL, only counts them. */
static uint32_t part_chunks(const optim_t *o, const ckpt_part_range_t *r, int n_ranges, const uint64_t *at, int a,
                            uint64_t tb, uint64_t te, ckpt_chunk_t *out)
{
    const uint64_t step = CKPT_CHUNK_BYTES / sizeof(float);
    int lo = 0, hi = n_ranges - 1; /* the range holding tb: the last with begin <= tb */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (r[mid].begin <= tb)
            lo = mid;
        else
            hi = mid - 1;
    }
    uint32_t n = 0;
    for (int i = lo; i < n_ranges && r[i].begin < te;) {
        int j = i; /* the run of ranges of i's part */
        while (j + 1 < n_ranges && r[j + 1].part == r[i].part)
            j++;
        uint64_t b = tb > r[i].begin ? tb : r[i].begin, e = te < r[j].end ? te : r[j].end;
        uint32_t file = ckpt_file_of(o, r[i].part, a);
        for (uint64_t x = b; x < e; x += step, n++)
            if (out)
                out[n] = (ckpt_chunk_t){.file = file, .offset = at[i] + (x - r[i].begin) * sizeof(float),
                                        .length = (e - x < step ? e - x : step) * sizeof(float)};
        i = j + 1;
    }
    return n;
}

int ckpt_index_plan_parts(ckpt_index_t *ix, const param_table_t *tab, const optim_t *o, int64_t step,
                          const char *manifest, const void *cursor, size_t cursor_len, int n_parts,
                          const ckpt_part_range_t *ranges, int n_ranges)
{
    memset(ix, 0, sizeof(*ix));
    if (n_parts < 1 || n_parts > CKPT_PARTS_MAX || ckpt_files(o, n_parts) > CKPT_FILES_MAX || n_ranges < 1)
        return -EINVAL;
    uint64_t end = 0;
    for (int i = 0; i < n_ranges; i++) {
        if (ranges[i].begin != end || ranges[i].end <= ranges[i].begin || ranges[i].part < 0 ||
            ranges[i].part >= n_parts)
            return -EINVAL;
        end = ranges[i].end;
    }
    if (end != tab->total)
        return -EINVAL;
    uint64_t *at = malloc((size_t)n_ranges * sizeof(uint64_t)), *owned = calloc((size_t)n_parts, sizeof(uint64_t));
    int rc = at && owned ? plan_head(ix, tab, o, step, manifest, cursor, cursor_len, n_parts) : -ENOMEM;
    if (rc)
        goto out;
    for (int i = 0; i < n_ranges; i++) {
        at[i] = CKPT_DATA_HDR + owned[ranges[i].part] * sizeof(float);
        owned[ranges[i].part] += ranges[i].end - ranges[i].begin;
    }
    for (int k = 0; k < n_parts; k++)
        for (int a = 0; a < optim_arrays(o); a++)
            ix->files[ckpt_file_of(o, k, a)].bytes = CKPT_DATA_HDR + owned[k] * sizeof(float);
    for (int a = 0; a < optim_arrays(o); a++)
        for (int i = 0; i < tab->n; i++) {
            const param_info_t *p = &tab->t[i];
            ckpt_tensor_t *t = &ix->tensors[a * tab->n + i];
            uint64_t tb = p->offset, te = p->offset + p->numel;
            t->n_chunks = part_chunks(o, ranges, n_ranges, at, a, tb, te, NULL);
            if (!(t->chunks = calloc(t->n_chunks ? t->n_chunks : 1, sizeof(ckpt_chunk_t)))) {
                ckpt_index_free(ix);
                rc = -ENOMEM;
                goto out;
            }
            part_chunks(o, ranges, n_ranges, at, a, tb, te, t->chunks);
        }
out:
    free(at);
    free(owned);
    return rc;
}

void ckpt_index_hash(ckpt_index_t *ix, uint32_t file, const void *data)
{
    for (int i = 0; i < ix->n_tensors; i++)
        for (uint32_t c = 0; c < ix->tensors[i].n_chunks; c++) {
            ckpt_chunk_t *ch = &ix->tensors[i].chunks[c];
            if (ch->file == file)
                ch->xxh = XXH3_64bits((const char *)data + (ch->offset - CKPT_DATA_HDR), ch->length);
        }
}

void ckpt_data_header(void *block, uint32_t file, int64_t step)
{
    uint8_t *b = block;
    memset(b, 0, CKPT_DATA_HDR);
    memcpy(b, CKPT_DATA_MAGIC, 8);
    uint32_t v = CKPT_VERSION;
    memcpy(b + 8, &v, 4);
    memcpy(b + 12, &file, 4);
    memcpy(b + 16, &step, 8);
}

int ckpt_data_header_read(const void *buf, size_t len, uint32_t *file, int64_t *step, char *err, size_t errlen)
{
    const uint8_t *b = buf;
    uint32_t v;
    if (len < CKPT_DATA_HDR)
        return util_fail(err, errlen, -EBADMSG, "header: %zu bytes, shorter than the %d of a data file's header",
                         len, CKPT_DATA_HDR);
    if (memcmp(b, CKPT_DATA_MAGIC, 8))
        return util_fail(err, errlen, -EBADMSG, "header: no %s magic (not a ctitan checkpoint data file, or "
                         "corrupt)", CKPT_DATA_MAGIC);
    memcpy(&v, b + 8, 4);
    if (v != CKPT_VERSION)
        return util_fail(err, errlen, -EBADMSG, "header: version %u; this build reads version %u", v, CKPT_VERSION);
    uint32_t f;
    int64_t s;
    memcpy(&f, b + 12, 4);
    memcpy(&s, b + 16, 8);
    if (s < 0 || s > CKPT_STEP_MAX)
        return util_fail(err, errlen, -EBADMSG, "header: step %" PRId64 " is %s (corrupt)", s,
                         s < 0 ? "negative" : "more than any run's training.steps");
    for (size_t i = 24; i < CKPT_DATA_HDR; i++)
        if (b[i])
            return util_fail(err, errlen, -EBADMSG, "header: byte %zu is 0x%02x where the header holds zeros "
                             "(corrupt)", i, b[i]);
    *file = f;
    *step = s;
    return 0;
}

/* ---- encoding ---- */

int ckpt_index_encode(const ckpt_index_t *ix, uint8_t **buf, size_t *len)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    uint8_t hdr[INDEX_HDR] = {0};
    msgpack_sbuffer_write(&sb, (const char *)hdr, INDEX_HDR); /* filled in below */
    msgpack_pack_map(&pk, 6);
    codec_pack_str(&pk, "step");
    msgpack_pack_int64(&pk, ix->step);
    codec_pack_str(&pk, "created");
    msgpack_pack_int64(&pk, ix->created);
    codec_pack_str(&pk, "manifest");
    codec_pack_str(&pk, ix->manifest ? ix->manifest : "");
    codec_pack_str(&pk, "cursor");
    msgpack_pack_bin(&pk, ix->cursor_len);
    msgpack_pack_bin_body(&pk, ix->cursor, ix->cursor_len);
    codec_pack_str(&pk, "files");
    msgpack_pack_array(&pk, (size_t)ix->n_files);
    for (int f = 0; f < ix->n_files; f++) {
        msgpack_pack_array(&pk, 2);
        codec_pack_str(&pk, ix->files[f].name);
        msgpack_pack_uint64(&pk, ix->files[f].bytes);
    }
    codec_pack_str(&pk, "tensors");
    msgpack_pack_array(&pk, (size_t)ix->n_tensors);
    for (int i = 0; i < ix->n_tensors; i++) {
        const ckpt_tensor_t *t = &ix->tensors[i];
        msgpack_pack_array(&pk, 4);
        codec_pack_str(&pk, t->name);
        codec_pack_str(&pk, t->dtype);
        msgpack_pack_array(&pk, (size_t)t->ndim);
        for (int d = 0; d < t->ndim; d++)
            msgpack_pack_int64(&pk, t->shape[d]);
        msgpack_pack_array(&pk, t->n_chunks);
        for (uint32_t c = 0; c < t->n_chunks; c++) {
            msgpack_pack_array(&pk, 4);
            msgpack_pack_uint32(&pk, t->chunks[c].file);
            msgpack_pack_uint64(&pk, t->chunks[c].offset);
            msgpack_pack_uint64(&pk, t->chunks[c].length);
            msgpack_pack_uint64(&pk, t->chunks[c].xxh);
        }
    }
    if (!sb.data) {
        msgpack_sbuffer_destroy(&sb);
        return -ENOMEM;
    }
    uint64_t body = sb.size - INDEX_HDR, sum;
    uint32_t v = CKPT_VERSION;
    memcpy(sb.data, CKPT_INDEX_MAGIC, 8);
    memcpy(sb.data + 8, &v, 4);
    memcpy(sb.data + 16, &body, 8);
    sum = XXH64(sb.data, sb.size, 0);
    msgpack_sbuffer_write(&sb, (const char *)&sum, sizeof(sum));
    *len = sb.size;
    *buf = (uint8_t *)msgpack_sbuffer_release(&sb);
    return *buf ? 0 : -ENOMEM;
}

/* ---- decoding ---- */

typedef struct {
    const char *what;
    char *err;
    size_t errlen;
} dctx_t;

static int bad(dctx_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(dctx_t *d, const char *fmt, ...)
{
    if (d->err && d->errlen) {
        int n = snprintf(d->err, d->errlen, "%s: bad index: ", d->what);
        if (n >= 0 && (size_t)n < d->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(d->err + n, d->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -EBADMSG;
}

static const msgpack_object *field(const msgpack_object *map, const char *key)
{
    size_t n = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && !memcmp(k->via.str.ptr, key, n))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

static int get_u64(const msgpack_object *o, uint64_t *v)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return -1;
    *v = o->via.u64;
    return 0;
}

static int get_i64(const msgpack_object *o, int64_t *v)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
        *v = (int64_t)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        *v = o->via.i64;
    else
        return -1;
    return 0;
}

/* A string of at most cap-1 bytes without NUL into buf. */
static int get_str(const msgpack_object *o, char *buf, size_t cap)
{
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size >= cap || memchr(o->via.str.ptr, 0, o->via.str.size))
        return -1;
    memcpy(buf, o->via.str.ptr, o->via.str.size);
    buf[o->via.str.size] = 0;
    return 0;
}

static int decode_tensor(dctx_t *d, const msgpack_object *o, ckpt_index_t *ix, ckpt_tensor_t *t, int i)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 4)
        return bad(d, "tensor %d: expected [name, dtype, shape, chunks]", i);
    const msgpack_object *a = o->via.array.ptr;
    if (get_str(&a[0], t->name, sizeof(t->name)) || !t->name[0])
        return bad(d, "tensor %d: the name must be a string of 1 to %d bytes", i, CKPT_NAME_MAX - 1);
    size_t es;
    if (get_str(&a[1], t->dtype, sizeof(t->dtype)) || !(es = ckpt_dtype_size(t->dtype)))
        return bad(d, "tensor %s: unknown dtype", t->name);
    if (a[2].type != MSGPACK_OBJECT_ARRAY || a[2].via.array.size < 1 || a[2].via.array.size > CKPT_MAX_DIMS)
        return bad(d, "tensor %s: the shape must have 1 to %d dimensions", t->name, CKPT_MAX_DIMS);
    t->ndim = (int)a[2].via.array.size;
    t->numel = 1;
    for (int k = 0; k < t->ndim; k++) {
        if (get_i64(&a[2].via.array.ptr[k], &t->shape[k]) || t->shape[k] < 0 || t->shape[k] > (1LL << 40))
            return bad(d, "tensor %s: dimension %d is not a size", t->name, k);
        t->numel *= (uint64_t)t->shape[k];
        if (t->numel > (1ULL << 40))
            return bad(d, "tensor %s: too large", t->name);
    }
    if (a[3].type != MSGPACK_OBJECT_ARRAY)
        return bad(d, "tensor %s: chunks must be an array", t->name);
    t->n_chunks = a[3].via.array.size;
    t->chunks = calloc(t->n_chunks ? t->n_chunks : 1, sizeof(ckpt_chunk_t));
    if (!t->chunks)
        return -ENOMEM;
    uint64_t covered = 0;
    for (uint32_t c = 0; c < t->n_chunks; c++) {
        const msgpack_object *co = &a[3].via.array.ptr[c];
        ckpt_chunk_t *ch = &t->chunks[c];
        uint64_t file;
        if (co->type != MSGPACK_OBJECT_ARRAY || co->via.array.size != 4 || get_u64(&co->via.array.ptr[0], &file) ||
            get_u64(&co->via.array.ptr[1], &ch->offset) || get_u64(&co->via.array.ptr[2], &ch->length) ||
            get_u64(&co->via.array.ptr[3], &ch->xxh))
            return bad(d, "tensor %s chunk %u: expected [file, offset, length, xxh3] (unsigned integers)", t->name, c);
        if (file >= (uint64_t)ix->n_files)
            return bad(d, "tensor %s chunk %u: file %" PRIu64 " does not exist", t->name, c, file);
        ch->file = (uint32_t)file;
        uint64_t fb = ix->files[file].bytes;
        if (ch->length == 0 || ch->length % es || ch->offset > fb || ch->length > fb - ch->offset)
            return bad(d, "tensor %s chunk %u: %" PRIu64 " bytes at %" PRIu64 " do not fit in %s (%" PRIu64 " bytes)",
                       t->name, c, ch->length, ch->offset, ix->files[file].name, fb);
        covered += ch->length;
    }
    if (covered != t->numel * es)
        return bad(d, "tensor %s: its chunks hold %" PRIu64 " bytes, its shape needs %" PRIu64, t->name, covered,
                   t->numel * es);
    return 0;
}

static int decode_body(dctx_t *d, const msgpack_object *root, ckpt_index_t *ix)
{
    if (root->type != MSGPACK_OBJECT_MAP)
        return bad(d, "the body is not a map");
    const msgpack_object *o;
    if (!(o = field(root, "step")) || get_i64(o, &ix->step) || ix->step < 0 || ix->step > CKPT_STEP_MAX)
        return bad(d, "'step' must be an integer from 0 to %d (training.steps is an int)", CKPT_STEP_MAX);
    if (!(o = field(root, "created")) || get_i64(o, &ix->created))
        return bad(d, "'created' must be an integer");
    if (!(o = field(root, "manifest")) || o->type != MSGPACK_OBJECT_STR)
        return bad(d, "'manifest' must be a string");
    if (!(ix->manifest = strndup(o->via.str.ptr, o->via.str.size)))
        return -ENOMEM;
    if (!(o = field(root, "cursor")) || o->type != MSGPACK_OBJECT_BIN || o->via.bin.size > CKPT_CURSOR_MAX)
        return bad(d, "'cursor' must be binary of at most %d bytes", CKPT_CURSOR_MAX);
    memcpy(ix->cursor, o->via.bin.ptr, o->via.bin.size);
    ix->cursor_len = o->via.bin.size;
    if (!(o = field(root, "files")) || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 1 ||
        o->via.array.size > CKPT_FILES_MAX)
        return bad(d, "'files' must be an array of 1 to %d files", CKPT_FILES_MAX);
    ix->n_files = (int)o->via.array.size;
    if (!(ix->files = calloc((size_t)ix->n_files, sizeof(ckpt_file_t))))
        return -ENOMEM;
    for (int f = 0; f < ix->n_files; f++) {
        const msgpack_object *e = &o->via.array.ptr[f];
        if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2 ||
            get_str(&e->via.array.ptr[0], ix->files[f].name, CKPT_FILE_MAX) ||
            get_u64(&e->via.array.ptr[1], &ix->files[f].bytes))
            return bad(d, "file %d: expected [name, bytes]", f);
        if (!ckpt_safe_name(ix->files[f].name) || !strcmp(ix->files[f].name, "index"))
            return bad(d, "file %d: '%s' is not a plain file name (A-Z a-z 0-9 . _ -, not starting with '.')", f,
                       ix->files[f].name);
        for (int g = 0; g < f; g++)
            if (!strcmp(ix->files[g].name, ix->files[f].name))
                return bad(d, "file '%s' is listed twice", ix->files[f].name);
    }
    if (!(o = field(root, "tensors")) || o->type != MSGPACK_OBJECT_ARRAY)
        return bad(d, "'tensors' must be an array");
    if (!(ix->tensors = calloc(o->via.array.size ? o->via.array.size : 1, sizeof(ckpt_tensor_t))))
        return -ENOMEM;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        ix->n_tensors = (int)i + 1;
        int rc = decode_tensor(d, &o->via.array.ptr[i], ix, &ix->tensors[i], (int)i);
        if (rc)
            return rc;
    }
    return 0;
}

int ckpt_index_decode(const void *buf, size_t len, ckpt_index_t *ix, const char *what, char *err, size_t errlen)
{
    dctx_t d = {what, err, errlen};
    memset(ix, 0, sizeof(*ix));
    const uint8_t *b = buf;
    if (len < INDEX_HDR + INDEX_TAIL || memcmp(b, CKPT_INDEX_MAGIC, 8))
        return bad(&d, "not a ctitan checkpoint index (no %s magic)", CKPT_INDEX_MAGIC);
    uint32_t v;
    uint64_t body, sum;
    memcpy(&v, b + 8, 4);
    memcpy(&body, b + 16, 8);
    memcpy(&sum, b + len - INDEX_TAIL, 8);
    if (v != CKPT_VERSION)
        return bad(&d, "version %u; this build reads version %u", v, CKPT_VERSION);
    if (body != len - INDEX_HDR - INDEX_TAIL)
        return bad(&d, "the body is %zu bytes but the header says %" PRIu64 " (truncated?)",
                   len - INDEX_HDR - INDEX_TAIL, body);
    if (XXH64(b, len - INDEX_TAIL, 0) != sum)
        return bad(&d, "checksum mismatch (corrupt)");
    /* a checksum is no proof against a hostile index (remote clients send theirs): walk it
     * first, so that msgpack-c never allocates for a container the bytes do not back */
    char why[128];
    if (codec_prescan(b + INDEX_HDR, body, "the body", why, sizeof why))
        return bad(&d, "%s", why);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    int rc;
    if (msgpack_unpack_next(&up, (const char *)b + INDEX_HDR, body, &off) != MSGPACK_UNPACK_SUCCESS || off != body)
        rc = bad(&d, "the body is not one msgpack value");
    else
        rc = decode_body(&d, &up.data, ix);
    msgpack_unpacked_destroy(&up);
    if (rc)
        ckpt_index_free(ix);
    return rc;
}

void ckpt_index_free(ckpt_index_t *ix)
{
    if (ix->tensors)
        for (int i = 0; i < ix->n_tensors; i++)
            free(ix->tensors[i].chunks);
    free(ix->tensors);
    free(ix->files);
    free(ix->manifest);
    memset(ix, 0, sizeof(*ix));
}

const ckpt_tensor_t *ckpt_index_find(const ckpt_index_t *ix, const char *name)
{
    for (int i = 0; i < ix->n_tensors; i++)
        if (!strcmp(ix->tensors[i].name, name))
            return &ix->tensors[i];
    return NULL;
}
