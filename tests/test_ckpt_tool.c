/* `ctitan ckpt` and the safetensors export: a real checkpoint of the tiny model is written with
 * the writer API into a temp dir, then exported and read back by an independent parser of the
 * safetensors format (and by tools/check_safetensors.py when python3 is there), and damaged in
 * the ways verify must name (flipped byte, truncated file, missing index), and listed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/writer.h"
#include "kernels/params.h"
#include "tests/testutil.h"
#include "stages/job/manifest.h"
#include "checkpointd/safetensors.h"

#define STEP 5

/* Per test: a temp dir holding DIR/ckpts/step-00000005 of the tiny model. */
typedef struct {
    char dir[64];
    char ckpts[128];     /* DIR/ckpts */
    char path[256];      /* DIR/ckpts/step-00000005 */
    param_table_t tab;
    float *data[3];      /* weights, exp_avg, exp_avg_sq: tab.total each */
    char *manifest;
} fx_t;


/* Writes checkpoint `step` of fx's model into dir with the writer API. */
static int write_ckpt(fx_t *fx, const char *dir, int64_t step, const char *manifest)
{
    ckpt_index_t ix;
    char err[512], path[256];
    const uint8_t cursor[] = {0x81, 0xa6, 's', 'a', 'm', 'p', 'l', 'e', 0x07}; /* {"sample": 7} */
    int rc = ckpt_index_plan(&ix, &fx->tab, optim_find("AdamW"), step, manifest, cursor, sizeof(cursor));
    if (rc)
        return rc;
    for (uint32_t f = 0; f < 3; f++)
        ckpt_index_hash(&ix, f, fx->data[f]);
    ckw_t *w = NULL;
    if ((rc = ckw_begin(&w, dir, &ix, err, sizeof(err))))
        goto out;
    static uint8_t block[CKPT_DATA_HDR];
    for (uint32_t f = 0; f < 3 && !rc; f++) {
        ckpt_data_header(block, f, step);
        if (!(rc = ckw_write(w, f, 0, block, sizeof(block), err, sizeof(err))))
            rc = ckw_write(w, f, CKPT_DATA_HDR, fx->data[f], fx->tab.total * sizeof(float), err, sizeof(err));
    }
    if (rc)
        ckw_abort(&w);
    else
        rc = ckw_commit(&w, path, sizeof(path), NULL, err, sizeof(err));
out:
    if (rc)
        print_message("writing a checkpoint in %s: %s\n", dir, err);
    ckpt_index_free(&ix);
    return rc;
}

static int teardown(void **state);

static int setup_fixture(fx_t *fx)
{
    snprintf(fx->dir, sizeof(fx->dir), "/tmp/ctitan-ckpt-tool-XXXXXX");
    if (!mkdtemp(fx->dir))
        return -1;
    snprintf(fx->ckpts, sizeof(fx->ckpts), "%s/ckpts", fx->dir);
    ckpt_step_path(fx->path, sizeof(fx->path), fx->ckpts, STEP);

    manifest_t m;
    manifest_defaults(&m);
    char err[256];
    if (config_preset("tiny", &m.model) || config_validate(&m.model, err, sizeof(err)))
        return -1;
    snprintf(m.flavor, sizeof(m.flavor), "tiny");
    /* something for the JSON escaping in __metadata__ to do */
    snprintf(m.description, sizeof(m.description), "a \"quoted\" \\ back\tslash, caf\xc3\xa9");
    if (!(fx->manifest = manifest_to_toml(&m)) || params_table_init(&fx->tab, &m.model))
        return -1;
    for (int f = 0; f < 3; f++) {
        if (!(fx->data[f] = malloc(fx->tab.total * sizeof(float))))
            return -1;
        tu_fill(NULL, fx->data[f], fx->tab.total, 100 + (uint64_t)f, 1.0);
    }
    return write_ckpt(fx, fx->ckpts, STEP, fx->manifest);
}

static int setup(void **state)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    if (!fx)
        return -1;
    *state = fx;
    if (setup_fixture(fx)) {
        teardown(state); /* cmocka skips the teardown of a failed setup */
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    fx_t *fx = *state;
    if (!fx)
        return 0;
    *state = NULL;
    int rc = fx->dir[0] && strcmp(fx->dir + strlen(fx->dir) - 6, "XXXXXX") ? tu_rmtree(fx->dir) : 0;
    for (int f = 0; f < 3; f++)
        free(fx->data[f]);
    free(fx->manifest);
    params_table_free(&fx->tab);
    free(fx);
    return rc;
}

/* ---- an independent reader of the safetensors format ---- */

/* A JSON value: just what a safetensors header holds. */
typedef struct jv {
    char type;          /* 'o' object, 'a' array, 's' string, 'n' integer, 'b' true/false/null */
    char *s;            /* 's': UTF-8, NUL-terminated (no NUL inside for our uses) */
    size_t slen;
    long long num;      /* 'n' */
    int n;              /* 'o', 'a': members */
    char **keys;        /* 'o' */
    struct jv *items;
} jv_t;

typedef struct {
    const char *p, *end;
} jp_t;

static void jv_free(jv_t *v)
{
    for (int i = 0; i < v->n; i++) {
        if (v->keys)
            free(v->keys[i]);
        jv_free(&v->items[i]);
    }
    free(v->keys);
    free(v->items);
    free(v->s);
    memset(v, 0, sizeof(*v));
}

static void jp_ws(jp_t *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int hex4(const char *p, unsigned *out)
{
    *out = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *out = *out * 16 + (unsigned)d;
    }
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 63)); o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 63));
    o[2] = (char)(0x80 | (cp >> 6 & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static int jp_string(jp_t *j, char **out, size_t *outlen)
{
    if (j->p >= j->end || *j->p != '"')
        return -1;
    j->p++;
    char *o = malloc((size_t)(j->end - j->p) + 1);
    size_t n = 0;
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        if (c < 0x20)
            goto bad; /* raw control characters are not JSON */
        if (c != '\\') {
            o[n++] = (char)c;
            continue;
        }
        if (j->p >= j->end)
            goto bad;
        char e = *j->p++;
        unsigned cp, lo;
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u':
            if (j->end - j->p < 4 || hex4(j->p, &cp))
                goto bad;
            j->p += 4;
            if (cp >= 0xd800 && cp < 0xdc00) {
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || hex4(j->p + 2, &lo) ||
                    lo < 0xdc00 || lo > 0xdfff)
                    goto bad;
                j->p += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp < 0xe000) {
                goto bad;
            }
            n += put_utf8(o + n, cp);
            break;
        default:
            goto bad;
        }
    }
    if (j->p >= j->end)
        goto bad;
    j->p++;
    o[n] = 0;
    *out = o;
    *outlen = n;
    return 0;
bad:
    free(o);
    return -1;
}

static int jp_value(jp_t *j, jv_t *v, int depth)
{
    memset(v, 0, sizeof(*v));
    jp_ws(j);
    if (j->p >= j->end || depth > 8)
        return -1;
    char c = *j->p;
    if (c == '"') {
        v->type = 's';
        return jp_string(j, &v->s, &v->slen);
    }
    if (c == '{' || c == '[') {
        v->type = c == '{' ? 'o' : 'a';
        char close = c == '{' ? '}' : ']';
        j->p++;
        jp_ws(j);
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return 0;
        }
        for (;;) {
            v->items = realloc(v->items, (size_t)(v->n + 1) * sizeof(jv_t));
            if (v->type == 'o') {
                v->keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof(char *));
                size_t kl;
                jp_ws(j);
                if (jp_string(j, &v->keys[v->n], &kl))
                    return -1;
                jp_ws(j);
                if (j->p >= j->end || *j->p++ != ':') {
                    free(v->keys[v->n]);
                    return -1;
                }
            }
            if (jp_value(j, &v->items[v->n], depth + 1)) {
                if (v->keys)
                    free(v->keys[v->n]);
                return -1;
            }
            v->n++;
            jp_ws(j);
            if (j->p >= j->end)
                return -1;
            if (*j->p == ',') {
                j->p++;
                continue;
            }
            if (*j->p++ != close)
                return -1;
            return 0;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) { /* integers only: a header has no others */
        v->type = 'n';
        int neg = c == '-';
        if (neg)
            j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9' || (*j->p == '0' && j->p + 1 < j->end && j->p[1] >= '0' && j->p[1] <= '9'))
            return -1;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            v->num = v->num * 10 + (*j->p++ - '0');
        if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
            return -1;
        v->num = neg ? -v->num : v->num;
        return 0;
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++)
        if ((size_t)(j->end - j->p) >= strlen(words[i]) && !strncmp(j->p, words[i], strlen(words[i]))) {
            v->type = 'b';
            j->p += strlen(words[i]);
            return 0;
        }
    return -1;
}

static const jv_t *jv_get(const jv_t *o, const char *key)
{
    for (int i = 0; o->type == 'o' && i < o->n; i++)
        if (!strcmp(o->keys[i], key))
            return &o->items[i];
    return NULL;
}

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static int utf8_valid(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], need, cp, min;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xe0) == 0xc0) need = 1, cp = c & 0x1f, min = 0x80;
        else if ((c & 0xf0) == 0xe0) need = 2, cp = c & 0x0f, min = 0x800;
        else if ((c & 0xf8) == 0xf0) need = 3, cp = c & 0x07, min = 0x10000;
        else return 0;
        for (unsigned k = 1; k <= need; k++) {
            if (i + k >= n || (s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
            return 0;
        i += need + 1;
    }
    return 1;
}

typedef struct {
    uint8_t *file;
    size_t size;
    uint64_t n;          /* header bytes */
    jv_t hdr;            /* the parsed header object */
} stfile_t;

static uint8_t *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return b;
}

/* Reads and checks a safetensors file per the spec: the size prefix, the header (UTF-8 JSON
 * object starting with '{', padded only with spaces, here to a multiple of 8), each tensor's
 * dtype, shape and data_offsets, and that the tensors tile the data exactly. Asserts. */
static void st_load(const char *path, stfile_t *st)
{
    memset(st, 0, sizeof(*st));
    st->file = slurp(path, &st->size);
    assert_non_null(st->file);
    assert_true(st->size >= 8);
    for (int i = 7; i >= 0; i--)
        st->n = st->n << 8 | st->file[i];
    assert_true(st->n <= st->size - 8);
    assert_int_equal((8 + st->n) % 8, 0);
    const char *h = (const char *)st->file + 8;
    assert_int_equal(h[0], '{');
    assert_true(utf8_valid((const unsigned char *)h, st->n));
    jp_t j = {h, h + st->n};
    assert_int_equal(jp_value(&j, &st->hdr, 0), 0);
    assert_int_equal(st->hdr.type, 'o');
    for (; j.p < j.end; j.p++)
        assert_int_equal(*j.p, ' ');
    /* no duplicate keys */
    for (int a = 0; a < st->hdr.n; a++)
        for (int b = a + 1; b < st->hdr.n; b++)
            assert_string_not_equal(st->hdr.keys[a], st->hdr.keys[b]);
    /* every tensor well formed; sorted by begin they tile [0, data bytes) */
    uint64_t data = st->size - 8 - st->n, covered = 0;
    int tensors = 0;
    for (int i = 0; i < st->hdr.n; i++) {
        if (!strcmp(st->hdr.keys[i], "__metadata__"))
            continue;
        const jv_t *t = &st->hdr.items[i];
        assert_int_equal(t->type, 'o');
        assert_int_equal(t->n, 3);
        const jv_t *dt = jv_get(t, "dtype"), *sh = jv_get(t, "shape"), *off = jv_get(t, "data_offsets");
        assert_non_null(dt);
        assert_non_null(sh);
        assert_non_null(off);
        assert_int_equal(dt->type, 's');
        assert_string_equal(dt->s, "F32");
        assert_int_equal(sh->type, 'a');
        long long numel = 1;
        for (int d = 0; d < sh->n; d++) {
            assert_int_equal(sh->items[d].type, 'n');
            assert_true(sh->items[d].num >= 0);
            numel *= sh->items[d].num;
        }
        assert_int_equal(off->type, 'a');
        assert_int_equal(off->n, 2);
        long long b = off->items[0].num, e = off->items[1].num;
        assert_true(b >= 0 && e >= b && (uint64_t)e <= data);
        assert_int_equal(e - b, numel * 4);
        /* no overlap with any other tensor */
        for (int k = 0; k < st->hdr.n; k++) {
            const jv_t *o = k == i ? NULL : jv_get(&st->hdr.items[k], "data_offsets");
            if (o && numel)
                assert_true(o->items[1].num <= b || o->items[0].num >= e || o->items[0].num == o->items[1].num);
        }
        covered += (uint64_t)(e - b);
        tensors++;
    }
    /* disjoint and summing to the buffer: no gaps either */
    assert_int_equal(covered, data);
    assert_true(tensors > 0);
}

static void st_free(stfile_t *st)
{
    jv_free(&st->hdr);
    free(st->file);
}

/* ---- tests ---- */

static void test_export_writes_a_spec_conforming_file_of_the_weights(void **state)
{
    fx_t *fx = *state;
    char out[256], err[512];
    snprintf(out, sizeof(out), "%s/model.safetensors", fx->dir);
    assert_int_equal(st_export(fx->path, out, err, sizeof(err)), 0);
    stfile_t st;
    st_load(out, &st);
    /* exactly the weights, under their Hugging Face names, with their bytes */
    assert_int_equal(st.hdr.n, fx->tab.n + 1);
    const uint8_t *data = st.file + 8 + st.n;
    for (int i = 0; i < fx->tab.n; i++) {
        const param_info_t *p = &fx->tab.t[i];
        const jv_t *t = jv_get(&st.hdr, p->name);
        assert_non_null(t);
        const jv_t *sh = jv_get(t, "shape"), *off = jv_get(t, "data_offsets");
        assert_int_equal(sh->n, p->ndim);
        for (int d = 0; d < p->ndim; d++)
            assert_int_equal(sh->items[d].num, p->shape[d]);
        /* table order, back to back */
        assert_int_equal(off->items[0].num, (long long)(p->offset * sizeof(float)));
        assert_memory_equal(data + off->items[0].num, fx->data[0] + p->offset, p->numel * sizeof(float));
    }
    for (int i = 0; i < st.hdr.n; i++)
        assert_false(strncmp(st.hdr.keys[i], "optimizer.", 10) == 0);
    assert_non_null(jv_get(&st.hdr, "model.embed_tokens.weight"));
    assert_non_null(jv_get(&st.hdr, "model.layers.1.self_attn.q_proj.weight"));
    assert_non_null(jv_get(&st.hdr, "lm_head.weight"));
    /* __metadata__: strings only; format, step, the model's shape, the manifest verbatim */
    const jv_t *meta = jv_get(&st.hdr, "__metadata__");
    assert_non_null(meta);
    assert_int_equal(meta->type, 'o');
    for (int i = 0; i < meta->n; i++)
        assert_int_equal(meta->items[i].type, 's');
    assert_string_equal(jv_get(meta, "format")->s, "pt");
    assert_string_equal(jv_get(meta, "step")->s, "5");
    assert_string_equal(jv_get(meta, "model.dim")->s, "16");
    assert_string_equal(jv_get(meta, "model.n_layers")->s, "2");
    assert_string_equal(jv_get(meta, "model.n_kv_heads")->s, "2");
    assert_string_equal(jv_get(meta, "model.vocab_size")->s, "32");
    assert_string_equal(jv_get(meta, "model.flavor")->s, "tiny");
    assert_string_equal(jv_get(meta, "manifest")->s, fx->manifest); /* quotes, tab, backslash, é */
    st_free(&st);
    /* nothing left beside it */
    char cmd[512], lsout[1024];
    snprintf(cmd, sizeof(cmd), "ls -A %s", fx->dir);
    tu_run(cmd, lsout, sizeof(lsout));
    assert_null(strstr(lsout, ".tmp"));
}

static void test_export_metadata_replaces_bytes_that_are_not_utf8(void **state)
{
    fx_t *fx = *state;
    char dir[256], path[300], out[256], err[512];
    snprintf(dir, sizeof(dir), "%s/odd", fx->dir);
    /* not TOML, not UTF-8, control characters: goes out whole, as valid JSON and UTF-8 */
    assert_int_equal(write_ckpt(fx, dir, 9, "a\x01\xff\xc3(\"\n\\z"), 0);
    ckpt_step_path(path, sizeof(path), dir, 9);
    snprintf(out, sizeof(out), "%s/odd.safetensors", fx->dir);
    assert_int_equal(st_export(path, out, err, sizeof(err)), 0);
    stfile_t st;
    st_load(out, &st);
    const jv_t *meta = jv_get(&st.hdr, "__metadata__");
    assert_string_equal(jv_get(meta, "step")->s, "9");
    assert_null(jv_get(meta, "model.dim")); /* the manifest did not parse */
    assert_string_equal(jv_get(meta, "manifest")->s, "a\x01\xef\xbf\xbd\xef\xbf\xbd(\"\n\\z");
    st_free(&st);
}

static void test_export_output_passes_check_safetensors_py(void **state)
{
    fx_t *fx = *state;
    char out[256], err[512], cmd[PATH_MAX + 400], res[16384];
    if (tu_run("command -v python3 >/dev/null 2>&1", res, sizeof(res)) != 0) {
        print_message("python3 not on PATH: skipping the Python check\n");
        skip();
    }
    /* from the repository root (make test), else beside build/tests/ */
    char script[PATH_MAX + 64] = "tools/check_safetensors.py", exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (access(script, R_OK) && n > 0) {
        exe[n] = 0;
        snprintf(script, sizeof(script), "%s/../../tools/check_safetensors.py", dirname(exe));
    }
    if (access(script, R_OK)) {
        print_message("tools/check_safetensors.py not found from %s or beside the build folder: skipping\n",
                      getcwd(res, sizeof(res)));
        skip();
    }
    snprintf(out, sizeof(out), "%s/model.safetensors", fx->dir);
    assert_int_equal(st_export(fx->path, out, err, sizeof(err)), 0);
    snprintf(cmd, sizeof(cmd), "python3 %s %s 2>&1", script, out);
    int rc = tu_run(cmd, res, sizeof(res));
    if (rc)
        print_message("%s", res);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(res, "model.embed_tokens.weight F32 [32, 16]"));
    assert_non_null(strstr(res, "lm_head.weight F32 [32, 16]"));
    assert_non_null(strstr(res, "metadata step: 5"));
    assert_null(strstr(res, "optimizer."));
    /* and the checker does catch a broken file: 4 bytes short */
    struct stat sb;
    assert_int_equal(stat(out, &sb), 0);
    assert_int_equal(truncate(out, sb.st_size - 4), 0);
    rc = tu_run(cmd, res, sizeof(res));
    assert_int_equal(rc, 1);
    assert_non_null(strstr(res, "cover"));
}

/* Flips one byte of tensor `name` in data file `file` of the fixture's checkpoint. */
static void flip_byte(fx_t *fx, const char *file, const char *name)
{
    int i = params_find_name(&fx->tab, name);
    assert_true(i >= 0);
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", fx->path, file);
    assert_int_equal(tu_flip_byte(p, (long)(CKPT_DATA_HDR + fx->tab.t[i].offset * sizeof(float) + 7)), 0);
}

static int run_bin(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run_bin(char *out, size_t n, const char *fmt, ...)
{
    char args[1024], cmd[PATH_MAX + 1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof(cmd), "%s %s 2>&1", tu_ctitan(), args);
    return tu_run(cmd, out, n);
}

static void test_verify_passes_a_good_checkpoint(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char out[8192];
    int rc = run_bin(out, sizeof(out), "ckpt verify %s", fx->path);
    if (rc)
        print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "OK"));
    assert_non_null(strstr(out, "step 5"));
    char st[256];
    snprintf(st, sizeof(st), "%s/good.safetensors", fx->dir);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt export %s --safetensors %s", fx->path, st), 0);
    assert_non_null(strstr(out, "wrote"));
    stfile_t f;
    st_load(st, &f);
    assert_int_equal(f.hdr.n, fx->tab.n + 1);
    st_free(&f);
}

static void test_verify_names_the_tensor_and_file_of_a_flipped_byte(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    flip_byte(fx, "exp_avg.bin", "model.layers.1.mlp.up_proj.weight");
    char out[8192], st[256];
    assert_int_equal(run_bin(out, sizeof(out), "ckpt verify %s", fx->path), 1);
    assert_non_null(strstr(out, "optimizer.exp_avg.model.layers.1.mlp.up_proj.weight"));
    assert_non_null(strstr(out, "exp_avg.bin"));
    assert_non_null(strstr(out, "checksum"));
    assert_non_null(strstr(out, "CORRUPT"));
    /* export refuses it with the same report, and writes nothing */
    snprintf(st, sizeof(st), "%s/x.safetensors", fx->dir);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt export %s --safetensors %s", fx->path, st), 1);
    assert_non_null(strstr(out, "optimizer.exp_avg.model.layers.1.mlp.up_proj.weight"));
    assert_non_null(strstr(out, "refusing"));
    assert_int_not_equal(access(st, F_OK), 0);
    /* the weights themselves are intact: --no-verify rescues them */
    assert_int_equal(run_bin(out, sizeof(out), "ckpt export %s --safetensors=%s --no-verify", fx->path, st), 0);
    stfile_t f;
    st_load(st, &f);
    assert_memory_equal(f.file + 8 + f.n, fx->data[0], fx->tab.total * sizeof(float));
    st_free(&f);
}

static void test_verify_names_a_truncated_model_bin(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char p[512], out[16384], st[256];
    snprintf(p, sizeof(p), "%s/model.bin", fx->path);
    assert_int_equal(truncate(p, CKPT_DATA_HDR + (off_t)fx->tab.total * 2), 0);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt verify %s", fx->path), 1);
    assert_non_null(strstr(out, "model.bin"));
    assert_non_null(strstr(out, "truncated"));
    assert_non_null(strstr(out, "lm_head.weight")); /* a tensor past the cut */
    /* even --no-verify cannot export weights that are not there; nothing is left behind */
    snprintf(st, sizeof(st), "%s/x.safetensors", fx->dir);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt export %s --safetensors %s --no-verify", fx->path, st), 1);
    assert_non_null(strstr(out, "model.bin"));
    assert_int_not_equal(access(st, F_OK), 0);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "ls -A %s", fx->dir);
    tu_run(cmd, out, sizeof(out));
    assert_null(strstr(out, ".tmp"));
}

static void test_export_fails_cleanly_and_keeps_an_existing_file(void **state)
{
    fx_t *fx = *state;
    char out[256], err[512];
    snprintf(out, sizeof(out), "%s/model.safetensors", fx->dir);
    FILE *f = fopen(out, "w");
    assert_non_null(f);
    fputs("previous export", f);
    fclose(f);
    flip_byte(fx, "model.bin", "model.norm.weight");
    assert_int_equal(st_export(fx->path, out, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "model.norm.weight"));
    assert_non_null(strstr(err, "model.bin"));
    size_t n;
    uint8_t *b = slurp(out, &n);
    assert_non_null(b);
    assert_int_equal(n, strlen("previous export"));
    free(b);
    /* an incomplete checkpoint */
    char idx[512];
    snprintf(idx, sizeof(idx), "%s/index", fx->path);
    assert_int_equal(unlink(idx), 0);
    assert_int_equal(st_export(fx->path, out, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, fx->path));
    char cmd[512], lsout[1024];
    snprintf(cmd, sizeof(cmd), "ls -A %s", fx->dir);
    tu_run(cmd, lsout, sizeof(lsout));
    assert_null(strstr(lsout, ".tmp"));
}

static void test_verify_calls_a_checkpoint_without_index_incomplete(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char idx[512], out[8192];
    snprintf(idx, sizeof(idx), "%s/index", fx->path);
    assert_int_equal(unlink(idx), 0);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt verify %s", fx->path), 1);
    assert_non_null(strstr(out, "no index"));
    assert_non_null(strstr(out, "INCOMPLETE"));
    assert_non_null(strstr(out, fx->path));
    /* a path that is not there at all */
    assert_int_equal(run_bin(out, sizeof(out), "ckpt verify %s/nowhere", fx->dir), 1);
    assert_non_null(strstr(out, "nowhere"));
}

/* A flipped byte in model.bin's header: export refuses it even with --no-verify (every data
 * file read is checked), and writes nothing. */
static void test_export_refuses_a_damaged_header_even_without_verify(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char p[512], out[8192], st[256];
    snprintf(p, sizeof(p), "%s/model.bin", fx->path);
    assert_int_equal(tu_flip_byte(p, 3), 0); /* the magic */
    snprintf(st, sizeof(st), "%s/x.safetensors", fx->dir);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt verify %s", fx->path), 1);
    assert_non_null(strstr(out, "model.bin"));
    assert_non_null(strstr(out, "header"));
    assert_int_equal(run_bin(out, sizeof(out), "ckpt export %s --safetensors %s --no-verify", fx->path, st), 1);
    assert_non_null(strstr(out, "header"));
    assert_int_not_equal(access(st, F_OK), 0);
}

/* A FIFO in place of model.bin: `ckpt verify` and `ckpt export` (with and without its own
 * verification) name it and exit 1 at once instead of waiting for a writer (timeout's 124). */
static void test_verify_and_export_refuse_a_fifo_at_once(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char p[512], out[8192], st[256], cmd[PATH_MAX + 1100];
    snprintf(p, sizeof(p), "%s/model.bin", fx->path);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0644), 0);
    snprintf(st, sizeof(st), "%s/x.safetensors", fx->dir);
    const char *args[] = {"ckpt verify %s", "ckpt export %s --safetensors %s",
                          "ckpt export %s --safetensors %s --no-verify"};
    for (int i = 0; i < 3; i++) {
        char a[1024];
        snprintf(a, sizeof(a), args[i], fx->path, st);
        snprintf(cmd, sizeof(cmd), "timeout 10 %s %s 2>&1", tu_ctitan(), a);
        assert_int_equal(tu_run(cmd, out, sizeof(out)), 1);
        assert_non_null(strstr(out, "model.bin: not a regular file"));
    }
    assert_int_not_equal(access(st, F_OK), 0);
}

static void test_ls_lists_checkpoints_and_marks_leftovers(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    assert_int_equal(write_ckpt(fx, fx->ckpts, 12, fx->manifest), 0);
    char p[512], out[8192];
    snprintf(p, sizeof(p), "%s/.tmp-step-00000007.999999", fx->ckpts);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/.tmp-step-00000007.999999/model.bin", fx->ckpts);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("half", f);
    fclose(f);
    snprintf(p, sizeof(p), "%s/step-00000009", fx->ckpts); /* a step dir without index */
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/notes.txt", fx->ckpts); /* not a checkpoint: not listed */
    f = fopen(p, "w");
    fclose(f);
    flip_byte(fx, "model.bin", "lm_head.weight"); /* ls reads indexes only */
    /* an index that does not read back */
    assert_int_equal(write_ckpt(fx, fx->ckpts, 14, fx->manifest), 0);
    snprintf(p, sizeof(p), "%s/step-00000014/index", fx->ckpts);
    int fd = open(p, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "\xff\xff", 2, 24), 2);
    close(fd);

    assert_int_equal(run_bin(out, sizeof(out), "ckpt ls %s", fx->ckpts), 0);
    char *l5 = strstr(out, "step-00000005"), *l7 = strstr(out, ".tmp-step-00000007.999999"),
         *l9 = strstr(out, "step-00000009"), *l12 = strstr(out, "step-00000012");
    assert_non_null(l5);
    assert_non_null(l7);
    assert_non_null(l9);
    assert_non_null(l12);
    assert_true(l5 < l7 && l7 < l9 && l9 < l12); /* by step */
    assert_null(strstr(out, "notes.txt"));
    /* each row's state is on its own line */
    char line[512];
    int tensors = 3 * fx->tab.n, seen = 0;
    for (char *s = out; *s;) {
        char *nl = strchr(s, '\n');
        size_t len = nl ? (size_t)(nl - s) : strlen(s);
        snprintf(line, sizeof(line), "%.*s", (int)len, s);
        char num[16];
        snprintf(num, sizeof(num), " %d ", tensors);
        if (strstr(line, "step-00000005") || strstr(line, "step-00000012")) {
            assert_non_null(strstr(line, " complete"));
            assert_non_null(strstr(line, num));
            seen++;
        } else if (strstr(line, ".tmp-step-00000007")) {
            assert_non_null(strstr(line, "temporary"));
            assert_non_null(strstr(line, "999999"));
            seen++;
        } else if (strstr(line, "step-00000009")) {
            assert_non_null(strstr(line, "incomplete"));
            assert_non_null(strstr(line, "no index"));
            seen++;
        } else if (strstr(line, "step-00000014")) {
            assert_non_null(strstr(line, "incomplete"));
            assert_non_null(strstr(line, "unreadable index"));
            seen++;
        }
        s += len + (nl ? 1 : 0);
    }
    assert_int_equal(seen, 5);
    assert_non_null(strstr(out, "2 complete, 2 incomplete, 1 temporary"));
    /* a folder that is not there is an error naming it */
    assert_int_equal(run_bin(out, sizeof(out), "ckpt ls %s/missing", fx->dir), 1);
    assert_non_null(strstr(out, "missing"));
}

static void test_usage_errors_exit_2_and_help_exits_0(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char out[8192];
    assert_int_equal(run_bin(out, sizeof(out), "ckpt"), 2);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt frob"), 2);
    assert_non_null(strstr(out, "frob"));
    assert_int_equal(run_bin(out, sizeof(out), "ckpt verify"), 2);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt verify %s %s", fx->path, fx->path), 2);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt verify --bogus %s", fx->path), 2);
    assert_non_null(strstr(out, "--bogus"));
    assert_int_equal(run_bin(out, sizeof(out), "ckpt export %s", fx->path), 2);
    assert_non_null(strstr(out, "--safetensors"));
    assert_int_equal(run_bin(out, sizeof(out), "ckpt export %s --safetensors", fx->path), 2);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt ls"), 2);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt keygen"), 2);
    const char *subs[] = {"ls", "verify", "export", "keygen"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(run_bin(out, sizeof(out), "ckpt %s --help", subs[i]), 0);
        assert_non_null(strstr(out, "usage: ctitan ckpt"));
        assert_non_null(strstr(out, subs[i]));
    }
    assert_int_equal(run_bin(out, sizeof(out), "ckpt --help"), 0);
    assert_non_null(strstr(out, "keygen"));
    assert_int_equal(run_bin(out, sizeof(out), "--help"), 0);
    assert_non_null(strstr(out, "ckpt"));
}

static void test_keygen_writes_a_key_pair_and_never_overwrites_one(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char out[8192], prefix[256], p[300];
    snprintf(prefix, sizeof(prefix), "%s/server", fx->dir);
    char cmd[PATH_MAX + 600];
    snprintf(cmd, sizeof(cmd), "%s ckpt keygen %s 2>/dev/null", tu_ctitan(), prefix); /* stdout: the key alone */
    int rc = tu_run(cmd, out, sizeof(out));
    assert_int_equal(rc, 0);
    struct stat st;
    snprintf(p, sizeof(p), "%s.key", prefix);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    snprintf(p, sizeof(p), "%s.pub", prefix);
    size_t n;
    char *pub = (char *)slurp(p, &n);
    assert_non_null(pub);
    pub[n] = 0;
    /* the printed key (first line) is the one in PREFIX.pub */
    char key[64];
    assert_int_equal(sscanf(out, "%63s", key), 1);
    assert_int_equal(strlen(key), 40);
    assert_non_null(strstr(pub, key));
    free(pub);
    /* never over an existing key, secret or public */
    assert_int_equal(run_bin(out, sizeof(out), "ckpt keygen %s", prefix), 1);
    assert_non_null(strstr(out, "server.key"));
    assert_non_null(strstr(out, "exists"));
    snprintf(p, sizeof(p), "%s.key", prefix);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(run_bin(out, sizeof(out), "ckpt keygen %s", prefix), 1);
    assert_non_null(strstr(out, "server.pub"));
    assert_int_not_equal(access(p, F_OK), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_export_writes_a_spec_conforming_file_of_the_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_metadata_replaces_bytes_that_are_not_utf8, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_output_passes_check_safetensors_py, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_fails_cleanly_and_keeps_an_existing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verify_passes_a_good_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verify_names_the_tensor_and_file_of_a_flipped_byte, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verify_names_a_truncated_model_bin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verify_calls_a_checkpoint_without_index_incomplete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_refuses_a_damaged_header_even_without_verify, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verify_and_export_refuse_a_fifo_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ls_lists_checkpoints_and_marks_leftovers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_usage_errors_exit_2_and_help_exits_0, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keygen_writes_a_key_pair_and_never_overwrites_one, setup, teardown),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
