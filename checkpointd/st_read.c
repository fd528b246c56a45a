/* safetensors reading (st_read.h): st_parse checks one header; st_set_open gathers a model's
 * files (one, or the shards of an index) and st_set_read_f32 reads a tensor as fp32. */
#include "checkpointd/st_read.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ipc/util.h"
#include "kernels/bf16.h"

static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
                 {"I8", 1}, {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1},
                 {"F8_E5M2", 1}};

size_t st_dtype_size(const char *dtype)
{
    for (size_t i = 0; i < sizeof(st_dtypes) / sizeof(st_dtypes[0]); i++)
        if (!strcmp(dtype, st_dtypes[i].name))
            return st_dtypes[i].size;
    return 0;
}

/* One entry of the header: dtype, shape, data_offsets, checked against each other and the
 * data's size. */
static int parse_tensor(const char *name, json_t *v, uint64_t data_bytes, uint64_t base, st_tensor_t *t,
                        const char *what, char *err, size_t errlen)
{
    if (strlen(name) >= sizeof(t->name) || !name[0])
        return util_fail(err, errlen, -EBADMSG, "%s: a tensor name is empty or longer than %zu bytes", what,
                         sizeof(t->name) - 1);
    snprintf(t->name, sizeof(t->name), "%s", name);
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    json_t *shape = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !dt || !json_is_array(shape) || !json_is_array(off) || json_array_size(off) != 2)
        return util_fail(err, errlen, -EBADMSG, "%s: tensor %s: needs dtype, shape and data_offsets [begin, end]",
                         what, name);
    size_t esz = st_dtype_size(dt);
    if (!esz || strlen(dt) >= sizeof(t->dtype))
        return util_fail(err, errlen, -EBADMSG, "%s: tensor %s: unknown dtype \"%s\"", what, name, dt);
    snprintf(t->dtype, sizeof(t->dtype), "%s", dt);
    if (json_array_size(shape) > ST_MAX_DIMS)
        return util_fail(err, errlen, -EBADMSG, "%s: tensor %s: %zu dimensions (at most %d)", what, name,
                         json_array_size(shape), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(shape, (size_t)d);
        long long s = json_is_integer(x) ? json_integer_value(x) : -1;
        if (s < 0 || (s && t->numel > (UINT64_MAX / 8) / (uint64_t)s))
            return util_fail(err, errlen, -EBADMSG, "%s: tensor %s: bad shape", what, name);
        t->shape[d] = s;
        t->numel *= (uint64_t)s;
    }
    json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
    long long bv = json_is_integer(b) ? json_integer_value(b) : -1, ev = json_is_integer(e) ? json_integer_value(e) : -1;
    if (bv < 0 || ev < bv || (uint64_t)ev > data_bytes)
        return util_fail(err, errlen, -EBADMSG, "%s: tensor %s: data_offsets [%lld, %lld] are not inside the "
                         "file's %llu data bytes", what, name, bv, ev, (unsigned long long)data_bytes);
    t->bytes = (uint64_t)(ev - bv);
    if (t->bytes != t->numel * esz)
        return util_fail(err, errlen, -EBADMSG, "%s: tensor %s: data_offsets hold %llu bytes, its shape and dtype "
                         "%llu", what, name, (unsigned long long)t->bytes, (unsigned long long)(t->numel * esz));
    t->offset = base + (uint64_t)bv;
    return 0;
}

static int cmp_offset(const void *a, const void *b)
{
    const st_tensor_t *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : (x->bytes > y->bytes) - (x->bytes < y->bytes);
}

/* No two tensors share a byte (empty ones aside). */
static int check_overlap(const st_tensor_t *t, int n, const char *what, char *err, size_t errlen)
{
    st_tensor_t *s = malloc(((size_t)n + 1) * sizeof(*s));
    if (!s)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", what);
    memcpy(s, t, (size_t)n * sizeof(*s));
    qsort(s, (size_t)n, sizeof(*s), cmp_offset);
    int rc = 0, last = -1;
    for (int i = 0; i < n && !rc; i++) {
        if (!s[i].bytes)
            continue;
        if (last >= 0 && s[i].offset < s[last].offset + s[last].bytes)
            rc = util_fail(err, errlen, -EBADMSG, "%s: tensors %s and %s overlap", what, s[last].name, s[i].name);
        last = i;
    }
    free(s);
    return rc;
}

static int parse_entries(json_t *o, uint64_t data_bytes, uint64_t base, const char *what, st_tensor_t **out,
                         int *n, char *err, size_t errlen)
{
    size_t cap = json_object_size(o);
    st_tensor_t *t = calloc(cap + 1, sizeof(*t));
    if (!t)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", what);
    int k = 0, rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v))
                rc = util_fail(err, errlen, -EBADMSG, "%s: __metadata__ is not an object", what);
        } else if (!(rc = parse_tensor(key, v, data_bytes, base, &t[k], what, err, errlen)))
            k++;
        if (rc)
            break;
    }
    if (!rc)
        rc = check_overlap(t, k, what, err, errlen);
    if (rc) {
        free(t);
        return rc;
    }
    *out = t;
    *n = k;
    return 0;
}

int st_parse(const void *buf, size_t avail, uint64_t file_size, const char *what, st_tensor_t **out, int *n,
             char *err, size_t errlen)
{
    const unsigned char *p = buf;
    if (avail < 8 || file_size < 8)
        return util_fail(err, errlen, -EBADMSG, "%s: %llu bytes: too short for a safetensors header", what,
                         (unsigned long long)(file_size < avail ? file_size : avail));
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--)
        hn = hn << 8 | p[i];
    if (hn < 2 || hn > ST_HEADER_MAX)
        return util_fail(err, errlen, -EBADMSG, "%s: header size %llu is out of range [2, %u]", what,
                         (unsigned long long)hn, ST_HEADER_MAX);
    if (hn > file_size - 8 || hn > avail - 8)
        return util_fail(err, errlen, -EBADMSG, "%s: truncated: its header says %llu bytes, the file has %llu after "
                         "the size", what, (unsigned long long)hn, (unsigned long long)(file_size - 8));
    json_error_t je;
    json_t *o = json_loadb((const char *)p + 8, (size_t)hn, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return util_fail(err, errlen, -EBADMSG, "%s: header is not JSON: %s (at byte %d)", what, je.text,
                         je.position);
    int rc = json_is_object(o) ? parse_entries(o, file_size - 8 - hn, 8 + hn, what, out, n, err, errlen)
                               : util_fail(err, errlen, -EBADMSG, "%s: header is not a JSON object", what);
    json_decref(o);
    return rc;
}

/* ---- a model's files ---- */

/* Reads and parses one file's header; its tensors are appended to s with file index f. */
static int add_file(st_set_t *s, int f, const char *path, char *err, size_t errlen)
{
    size_t size = 0;
    int fd = util_open_regular(path, &size, err, errlen);
    if (fd < 0)
        return fd;
    unsigned char pre[8];
    int rc = 0;
    uint64_t hn = 0;
    char *buf = NULL;
    st_tensor_t *t = NULL;
    int n = 0;
    if (util_read_all(fd, pre, 8, 0) != 8)
        rc = util_fail(err, errlen, -EBADMSG, "%s: %zu bytes: too short for a safetensors header", path, size);
    for (int i = 7; i >= 0 && !rc; i--)
        hn = hn << 8 | pre[i];
    if (!rc && (hn > ST_HEADER_MAX || hn > size - 8))
        rc = st_parse(pre, 8, size, path, &t, &n, err, errlen); /* says which */
    else if (!rc && !(buf = malloc(8 + hn)))
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    else if (!rc && util_read_all(fd, buf, 8 + hn, 0) != (long)(8 + hn))
        rc = util_fail(err, errlen, -EIO, "%s: cannot read its header", path);
    else if (!rc)
        rc = st_parse(buf, 8 + hn, size, path, &t, &n, err, errlen);
    close(fd);
    free(buf);
    st_tensor_t *all = rc ? NULL : realloc(s->t, ((size_t)s->n + (size_t)n + 1) * sizeof(*all));
    if (!rc && !all)
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    for (int i = 0; i < n && !rc; i++) {
        s->t = all;
        if (st_set_find(s, t[i].name))
            rc = util_fail(err, errlen, -EBADMSG, "%s: tensor %s is also in another file", path, t[i].name);
        t[i].file = f;
        all[s->n++] = t[i];
    }
    if (all)
        s->t = all;
    free(t);
    return rc;
}

static int add_path(st_set_t *s, const char *dir, const char *name, char *err, size_t errlen)
{
    char **f = realloc(s->files, ((size_t)s->n_files + 1) * sizeof(*f));
    if (!f)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    s->files = f;
    size_t len = strlen(dir) + strlen(name) + 2;
    if (!(f[s->n_files] = malloc(len)))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    snprintf(f[s->n_files], len, "%s/%s", dir, name);
    s->n_files++;
    return 0;
}

/* Whether a shard name stays inside the folder. */
static int safe_shard(const char *s)
{
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

/* The shards of weight_map, each once, in order of first appearance; then every tensor of
 * every shard must be mapped to that shard, and every mapped tensor be in it. */
static int open_index(st_set_t *s, const char *dir, const char *ipath, json_t *map, char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(map, key, v) {
        const char *f = json_string_value(v);
        if (!f || !safe_shard(f))
            return util_fail(err, errlen, -EBADMSG, "%s: weight_map[\"%s\"] is not a file name in the folder", ipath,
                             key);
        int seen = 0;
        for (int i = 0; i < s->n_files && !seen; i++)
            seen = !strcmp(strrchr(s->files[i], '/') + 1, f);
        if (seen)
            continue;
        if ((rc = add_path(s, dir, f, err, errlen)))
            return rc;
        if ((rc = add_file(s, s->n_files - 1, s->files[s->n_files - 1], err, errlen)))
            return rc == -ENOENT ? util_fail(err, errlen, rc, "%s: shard %s (named by %s) is missing", dir, f, ipath)
                                 : rc;
    }
    for (int i = 0; i < s->n; i++) {
        const char *f = json_string_value(json_object_get(map, s->t[i].name));
        if (!f || strcmp(f, strrchr(s->files[s->t[i].file], '/') + 1))
            return util_fail(err, errlen, -EBADMSG, "%s: tensor %s is not in weight_map under this file (%s)",
                             s->files[s->t[i].file], s->t[i].name, ipath);
    }
    json_object_foreach(map, key, v) {
        if (!st_set_find(s, key))
            return util_fail(err, errlen, -EBADMSG, "%s: tensor %s is not in %s, where weight_map says it is", ipath,
                             key, json_string_value(v));
    }
    return 0;
}

int st_set_open(st_set_t *s, const char *dir, char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    char ipath[4096];
    snprintf(ipath, sizeof(ipath), "%s/model.safetensors.index.json", dir);
    int rc = 0;
    if (access(ipath, F_OK)) {
        if (!(rc = add_path(s, dir, "model.safetensors", err, errlen)))
            rc = add_file(s, 0, s->files[0], err, errlen);
        if (rc == -ENOENT)
            util_fail(err, errlen, rc, "%s: no model.safetensors nor model.safetensors.index.json", dir);
    } else {
        json_error_t je;
        json_t *o = json_load_file(ipath, JSON_REJECT_DUPLICATES, &je);
        json_t *map = json_object_get(o, "weight_map");
        if (!o)
            rc = util_fail(err, errlen, -EBADMSG, "%s:%d: not JSON: %s", ipath, je.line, je.text);
        else if (!json_is_object(map))
            rc = util_fail(err, errlen, -EBADMSG, "%s: no weight_map object", ipath);
        else
            rc = open_index(s, dir, ipath, map, err, errlen);
        json_decref(o);
    }
    if (rc)
        st_set_close(s);
    return rc;
}

void st_set_close(st_set_t *s)
{
    for (int i = 0; i < s->n_files; i++)
        free(s->files[i]);
    free(s->files);
    free(s->t);
    memset(s, 0, sizeof(*s));
}

const st_tensor_t *st_set_find(const st_set_t *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].name, name))
            return &s->t[i];
    return NULL;
}

/* IEEE half -> float, exactly (subnormals, infinities, NaN payloads kept) */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0x1f)
        bits = sign | 0x7f800000u | m << 13;
    else if (e)
        bits = sign | (e + 112) << 23 | m << 13;
    else if (!m)
        bits = sign;
    else {
        e = 113;
        while (!(m & 0x400))
            m <<= 1, e--;
        bits = sign | e << 23 | (m & 0x3ff) << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int st_set_read_f32(const st_set_t *s, const st_tensor_t *t, float *dst, char *err, size_t errlen)
{
    int wide = !strcmp(t->dtype, "F32"), bf = !strcmp(t->dtype, "BF16"), hf = !strcmp(t->dtype, "F16");
    if (!wide && !bf && !hf)
        return util_fail(err, errlen, -ENOTSUP, "%s: tensor %s: dtype %s: ctitan imports F32, BF16 and F16",
                         s->files[t->file], t->name, t->dtype);
    const char *path = s->files[t->file];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return util_fail(err, errlen, -errno, "%s: cannot open: %s", path, strerror(errno));
    /* the narrow ones land in the upper half of dst and widen forwards, each read before its
     * float is written */
    void *at = wide ? (void *)dst : (void *)((char *)dst + t->bytes);
    long got = util_read_all(fd, at, t->bytes, (long long)t->offset);
    close(fd);
    if (got != (long)t->bytes)
        return util_fail(err, errlen, got < 0 ? (int)got : -EIO, "%s: tensor %s: cannot read its %llu bytes (the "
                         "file changed?)", path, t->name, (unsigned long long)t->bytes);
    const uint16_t *h = at;
    for (uint64_t i = 0; i < t->numel && !wide; i++) {
        uint16_t x = h[i];
        dst[i] = bf ? bf16_float(x) : half_to_float(x);
    }
    return 0;
}
