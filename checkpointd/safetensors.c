/* Checkpoint weights -> safetensors (see safetensors.h). The JSON header is built from the
 * checkpoint's index alone; then the data streams from the checkpoint's data files through
 * one chunk-sized buffer into a temporary file that is renamed into place once synced. */
#include "checkpointd/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/restore.h"
#include "stages/job/toml.h"
#include "ipc/util.h"

#define ST_OPT_PREFIX "optimizer."

/* ---- a growing string for the JSON header ---- */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf_t *b, const char *s) { sb_put(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp))
        b->oom = 1; /* only numbers go through here */
    else
        sb_put(b, tmp, (size_t)n);
}

/* s[0, len) as a JSON string. Bytes that are not UTF-8 become U+FFFD: the header must be
 * valid UTF-8, and only metadata can hold such bytes (tensor names are checked before). */
static void sb_json_str(sbuf_t *b, const char *s, size_t len)
{
    sb_put(b, "\"", 1);
    size_t i = 0;
    while (i < len) {
        long bad = toml_utf8_invalid_at(s + i, len - i);
        size_t good = bad < 0 ? len - i : (size_t)bad;
        size_t run = i; /* start of bytes that go out as they are */
        for (size_t k = i; k < i + good; k++) {
            unsigned char c = (unsigned char)s[k];
            if (c >= 0x20 && c != '"' && c != '\\')
                continue;
            sb_put(b, s + run, k - run);
            run = k + 1;
            switch (c) {
            case '"': sb_put(b, "\\\"", 2); break;
            case '\\': sb_put(b, "\\\\", 2); break;
            case '\n': sb_put(b, "\\n", 2); break;
            case '\r': sb_put(b, "\\r", 2); break;
            case '\t': sb_put(b, "\\t", 2); break;
            default: sb_printf(b, "\\u%04x", c); break;
            }
        }
        sb_put(b, s + run, i + good - run);
        i += good;
        if (bad >= 0) {
            sb_put(b, "\\ufffd", 6);
            i++;
        }
    }
    sb_put(b, "\"", 1);
}

/* "key": "value" with a leading comma unless first */
static void sb_meta(sbuf_t *b, int *first, const char *key, const char *value)
{
    if (!*first)
        sb_put(b, ",", 1);
    *first = 0;
    sb_json_str(b, key, strlen(key));
    sb_put(b, ":", 1);
    sb_json_str(b, value, strlen(value));
}

/* The shortest %g form that reads back as the same double. */
static void fmt_double(char *buf, size_t n, double v)
{
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* __metadata__ values must be strings: the step, the creation time, every scalar key of the
 * manifest's [model] section as "model.KEY", and the whole manifest. */
static void put_metadata(sbuf_t *b, const ckpt_index_t *ix)
{
    int first = 1;
    char v[64];
    sb_str(b, "\"__metadata__\":{");
    sb_meta(b, &first, "format", "pt");
    snprintf(v, sizeof(v), "%lld", (long long)ix->step);
    sb_meta(b, &first, "step", v);
    time_t t = (time_t)ix->created;
    struct tm tm;
    if (gmtime_r(&t, &tm) && strftime(v, sizeof(v), "%Y-%m-%dT%H:%M:%SZ", &tm))
        sb_meta(b, &first, "created", v);
    if (ix->manifest) {
        toml_doc_t doc;
        char terr[256];
        /* a manifest that does not parse still goes out whole below */
        if (!toml_parse(&doc, ix->manifest, strlen(ix->manifest), "manifest", terr, sizeof(terr))) {
            for (int i = 0; i < doc.n_entries; i++) {
                const toml_entry_t *e = &doc.entries[i];
                if (e->section < 0 || strcmp(doc.sections[e->section].name, "model"))
                    continue;
                const toml_value_t *val = &e->value;
                const char *s = v;
                switch (val->type) {
                case TOML_STRING: s = val->s; break;
                case TOML_INT: snprintf(v, sizeof(v), "%lld", (long long)val->i); break;
                case TOML_FLOAT: fmt_double(v, sizeof(v), val->f); break;
                case TOML_BOOL: s = val->b ? "true" : "false"; break;
                default: continue; /* arrays: none in [model] */
                }
                char key[160];
                snprintf(key, sizeof(key), "model.%s", e->key);
                sb_meta(b, &first, key, s);
            }
            toml_free(&doc);
        }
        sb_meta(b, &first, "manifest", ix->manifest);
    }
    sb_put(b, "}", 1);
}

static int is_weight(const ckpt_tensor_t *t)
{
    return strncmp(t->name, ST_OPT_PREFIX, strlen(ST_OPT_PREFIX)) != 0;
}

/* Checks what the header will say about weight t: a name that is a valid, unique JSON key
 * other than __metadata__, a known dtype, a shape whose product is numel, chunks of whole
 * elements. Returns the element size or -EINVAL. */
static int check_weight(const ckpt_index_t *ix, int i, const char *path, uint64_t *max_chunk, char *err,
                        size_t errlen)
{
    const ckpt_tensor_t *t = &ix->tensors[i];
    size_t nlen = strnlen(t->name, sizeof(t->name));
    if (nlen == 0 || nlen == sizeof(t->name) || toml_utf8_invalid_at(t->name, nlen) >= 0 ||
        !strcmp(t->name, "__metadata__"))
        return util_fail(err, errlen, -EINVAL, "%s: tensor %d has a name safetensors cannot hold", path, i);
    for (int j = 0; j < i; j++)
        if (!strcmp(ix->tensors[j].name, t->name))
            return util_fail(err, errlen, -EINVAL, "%s: tensor %s appears twice in the index", path, t->name);
    char dtype[sizeof(t->dtype) + 1] = {0};
    memcpy(dtype, t->dtype, sizeof(t->dtype));
    size_t esz = ckpt_dtype_size(dtype);
    if (!esz)
        return util_fail(err, errlen, -EINVAL, "%s: tensor %s: unknown dtype '%s'", path, t->name, dtype);
    if (t->ndim < 0 || t->ndim > CKPT_MAX_DIMS)
        return util_fail(err, errlen, -EINVAL, "%s: tensor %s: %d dimensions", path, t->name, t->ndim);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || (t->shape[d] && numel > UINT64_MAX / (uint64_t)t->shape[d]))
            return util_fail(err, errlen, -EINVAL, "%s: tensor %s: bad shape", path, t->name);
        numel *= (uint64_t)t->shape[d];
    }
    if (numel != t->numel || numel > UINT64_MAX / esz)
        return util_fail(err, errlen, -EINVAL, "%s: tensor %s: shape does not match its %llu elements", path,
                         t->name, (unsigned long long)t->numel);
    for (uint32_t k = 0; k < t->n_chunks; k++) {
        if (t->chunks[k].length % esz)
            return util_fail(err, errlen, -EINVAL, "%s: tensor %s: chunk %u is not whole elements", path,
                             t->name, k);
        if (t->chunks[k].length > *max_chunk)
            *max_chunk = t->chunks[k].length;
    }
    return (int)esz;
}

/* Weights in file order: larger elements first (index order within a size), so every tensor
 * starts at a multiple of its element size, as Hugging Face's writer does. With only F32
 * weights this is the index order. Fills order[] (n_weights entries) and esz[]. */
static const size_t st_sizes[] = {8, 4, 2, 1};

static int build_header(const ckpt_index_t *ix, const char *path, sbuf_t *b, int *order, int *n_order,
                        uint64_t *max_chunk, char *err, size_t errlen)
{
    int n = 0;
    int *esz = calloc((size_t)ix->n_tensors + 1, sizeof(int));
    if (!esz)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    int rc = 0;
    for (int i = 0; i < ix->n_tensors; i++) {
        if (!is_weight(&ix->tensors[i]))
            continue;
        if ((rc = check_weight(ix, i, path, max_chunk, err, errlen)) < 0)
            goto out;
        esz[i] = rc;
        rc = 0;
    }
    sb_put(b, "{", 1);
    put_metadata(b, ix);
    uint64_t off = 0;
    for (size_t s = 0; s < sizeof(st_sizes) / sizeof(st_sizes[0]); s++)
        for (int i = 0; i < ix->n_tensors; i++) {
            if (!esz[i] || (size_t)esz[i] != st_sizes[s])
                continue;
            const ckpt_tensor_t *t = &ix->tensors[i];
            uint64_t bytes = t->numel * (uint64_t)esz[i];
            sb_put(b, ",", 1);
            sb_json_str(b, t->name, strlen(t->name));
            sb_str(b, ":{\"dtype\":");
            sb_json_str(b, t->dtype, strnlen(t->dtype, sizeof(t->dtype)));
            sb_str(b, ",\"shape\":[");
            for (int d = 0; d < t->ndim; d++)
                sb_printf(b, d ? ",%lld" : "%lld", (long long)t->shape[d]);
            sb_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                      (unsigned long long)(off + bytes));
            off += bytes;
            order[n++] = i;
        }
    sb_put(b, "}", 1);
    /* spaces up to a multiple of 8, so the data (and each tensor in it) is aligned */
    while (!b->oom && b->len % 8)
        sb_put(b, " ", 1);
    if (b->oom)
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    else if (!n)
        rc = util_fail(err, errlen, -EINVAL, "%s: no model weights in the checkpoint (only optimizer.* tensors)",
                       path);
    *n_order = n;
out:
    free(esz);
    return rc;
}

/* Short writes and EINTR are retried here, and only here. */
int st_export(const char *ckpt_path, const char *out_path, char *err, size_t errlen)
{
    ckpt_t *c = NULL;
    sbuf_t hdr = {0};
    int *order = NULL, n_order = 0;
    void *buf = NULL;
    util_afile_t af = {.fd = -1};
    uint64_t max_chunk = 0;

    int rc = ckpt_open(&c, ckpt_path, err, errlen);
    if (rc)
        goto out;
    const ckpt_index_t *ix = ckpt_index(c);
    rc = restore_check_shapes(ix, ckpt_path, err, errlen); /* 1: nothing to check against */
    if (rc < 0)
        goto out;
    if (!(order = calloc((size_t)ix->n_tensors + 1, sizeof(int)))) {
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", ckpt_path);
        goto out;
    }
    if ((rc = build_header(ix, ckpt_path, &hdr, order, &n_order, &max_chunk, err, errlen)))
        goto out;
    if (!(buf = malloc(max_chunk ? max_chunk : 1))) {
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory for a %llu-byte chunk", ckpt_path,
                       (unsigned long long)max_chunk);
        goto out;
    }

    if ((rc = util_afile_begin(&af, out_path, err, errlen)))
        goto out;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
    if ((rc = util_afile_write(&af, len8, 8, err, errlen)) || (rc = util_afile_write(&af, hdr.p, hdr.len, err, errlen)))
        goto out;
    for (int k = 0; k < n_order; k++) {
        const ckpt_tensor_t *t = &ix->tensors[order[k]];
        size_t esz = ckpt_dtype_size(t->dtype);
        uint64_t first = 0;
        for (uint32_t j = 0; j < t->n_chunks; j++) {
            uint64_t n = t->chunks[j].length / esz;
            if ((rc = ckpt_read(c, t->name, first, n, buf, err, errlen)))
                goto out; /* err names the tensor and the file */
            if ((rc = util_afile_write(&af, buf, t->chunks[j].length, err, errlen)))
                goto out;
            first += n;
        }
    }
    rc = util_afile_commit(&af, err, errlen);
out:
    if (rc && af.tmp)
        util_afile_abort(&af);
    free(buf);
    free(order);
    free(hdr.p);
    if (c)
        ckpt_close(&c);
    return rc;
}
