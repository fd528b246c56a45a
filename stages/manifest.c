/* The job manifest (see manifest.h). One table names every key: its section, type and field.
 * The file parser, the command-line overrides, manifest_to_toml and the "where did this
 * value come from" part of every message all read that table. */
#include "stages/manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kernels/params.h"
#include "stages/toml.h"
#include "ipc/util.h"

typedef enum {
    K_INT,    /* int */
    K_U64,    /* uint64_t, written as a non-negative TOML integer */
    K_DOUBLE, /* double; TOML integers are accepted too */
    K_BOOL,   /* int 0/1 */
    K_STR,    /* char[size]; too long is an error, never a truncation */
    K_FLAVOR, /* char[size], a config_preset name: re-derives the model config */
    K_SCHED,  /* sched_kind_t by name */
    K_DECAY,  /* lr_decay_t by name */
    K_SPLITS, /* split_points + n_split_points, from ["layers.N", ...] */
} ktype_t;

typedef struct {
    const char *section, *key;
    ktype_t type;
    size_t off, size;
    int min;   /* K_INT: smallest valid value (manifest_validate); NO_MIN: checked elsewhere */
    int model; /* a model_config_t field: an explicit value is kept over the flavor's */
} mkey_t;

#define NO_MIN INT_MIN
#define FLD(f) offsetof(manifest_t, f), sizeof(((manifest_t *)0)->f)
#define KINT(s, k, f, min) {s, k, K_INT, FLD(f), min, 0}
#define KDBL(s, k, f) {s, k, K_DOUBLE, FLD(f), 0, 0}
#define KSTR(s, k, f) {s, k, K_STR, FLD(f), 0, 0}
#define KBOOL(s, k, f) {s, k, K_BOOL, FLD(f), 0, 0}
#define KMI(k) {"model", #k, K_INT, FLD(model.k), NO_MIN, 1}
#define KMD(k) {"model", #k, K_DOUBLE, FLD(model.k), 0, 1}

/* Order here is the order of manifest_to_toml; sections must be contiguous. */
static const mkey_t keys[] = {
    KSTR("job", "name", name),
    KSTR("job", "dump_folder", dump_folder),
    KSTR("job", "description", description),
    KSTR("job", "endpoint", endpoint),
    KSTR("job", "device", device),
    KINT("job", "hosts", hosts, 1),
    KINT("job", "host_rank", host_rank, 0),
    KINT("job", "heartbeat_interval_ms", heartbeat_interval_ms, 1),
    KINT("job", "heartbeat_timeout_ms", heartbeat_timeout_ms, 1),
    KSTR("model", "name", model_name),
    {"model", "flavor", K_FLAVOR, FLD(flavor), 0, 0},
    KSTR("model", "tokenizer_path", tokenizer_path),
    KMI(dim), KMI(n_layers), KMI(n_heads), KMI(n_kv_heads), KMI(vocab_size), KMI(multiple_of),
    KMD(ffn_dim_multiplier), KMD(norm_eps), KMD(rope_theta), KMI(max_seq_len),
    KINT("training", "steps", steps, 1),
    KINT("training", "local_batch_size", local_batch_size, 1),
    KINT("training", "seq_len", seq_len, 2),
    {"training", "seed", K_U64, FLD(seed), 0, 0},
    KDBL("training", "max_norm", max_norm),
    KINT("training", "threads", threads, 0),
    KINT("parallelism", "pipeline_parallel_degree", pp, 1),
    {"parallelism", "pipeline_parallel_schedule", K_SCHED, FLD(schedule), 0, 0},
    KINT("parallelism", "pipeline_parallel_microbatches", microbatches, 1),
    {"parallelism", "pipeline_parallel_split_points", K_SPLITS, FLD(split_points), 0, 0},
    KINT("parallelism", "data_parallel_replicate_degree", dp, 1),
    KSTR("parallelism", "data_plane", data_plane),
    KSTR("optimizer", "name", optimizer_name),
    KDBL("optimizer", "lr", lr),
    KDBL("optimizer", "beta1", beta1),
    KDBL("optimizer", "beta2", beta2),
    KDBL("optimizer", "eps", eps),
    KDBL("optimizer", "weight_decay", weight_decay),
    KBOOL("optimizer", "decay_embed_and_norms", decay_embed_and_norms),
    KINT("lr_scheduler", "warmup_steps", lr_sched.warmup_steps, 0),
    KDBL("lr_scheduler", "decay_ratio", lr_sched.decay_ratio),
    {"lr_scheduler", "decay_type", K_DECAY, FLD(lr_sched.decay_type), 0, 0},
    KDBL("lr_scheduler", "min_lr_factor", lr_sched.lr_min),
    KSTR("loader", "dataset_path", dataset_path),
    KBOOL("loader", "shuffle", shuffle),
    KINT("loader", "prefetch", prefetch, 1),
    KSTR("loader", "command", command),
    KINT("optshard", "shards", shards, 1),
    KSTR("optshard", "device", shard_device),
    KBOOL("checkpoint", "enable", ckpt_enable),
    KINT("checkpoint", "interval", ckpt_interval, 1),
    KSTR("checkpoint", "folder", ckpt_folder),
    KINT("checkpoint", "keep_latest_k", ckpt_keep, 0),
    KSTR("checkpoint", "load", ckpt_load),
    KSTR("checkpoint", "endpoint", ckpt_endpoint),
    KSTR("checkpoint", "server_key", ckpt_server_key),
    KSTR("checkpoint", "client_key", ckpt_client_key),
    KINT("metrics", "log_freq", log_freq, 1),
    KSTR("metrics", "file", metrics_file),
    KDBL("metrics", "peak_tflops", peak_tflops),
    KBOOL("validation", "enable", val_enable),
    KSTR("validation", "dataset_path", val_dataset_path),
    KINT("validation", "steps", val_steps, 1),
    KINT("sample", "tokens", sample_tokens, 0),
    KDBL("sample", "temperature", sample_temperature),
};
#define NKEYS ((int)(sizeof(keys) / sizeof(keys[0])))
_Static_assert(sizeof(keys) / sizeof(keys[0]) <= sizeof(((manifest_t *)0)->origin_line) /
                                                     sizeof(int),
               "origin_line has a slot per key");

/* origin_line[k]: > 0 the line in m->path, ORIGIN_OVERRIDE a --section.key, 0 the default
 * (for model keys: the flavor's value). */
#define ORIGIN_DEFAULT 0
#define ORIGIN_OVERRIDE (-1)

static const char *const flavors = "debugmodel, gpt2s, llama1b, tiny"; /* config_preset's */

static int find_key(const char *section, const char *key)
{
    for (int k = 0; k < NKEYS; k++)
        if (!strcmp(keys[k].section, section) && !strcmp(keys[k].key, key))
            return k;
    return -1;
}

/* Index of a key named in this file's own code: a miss is a typo here, not bad input, and
 * every call site runs in the tests, so it aborts like an assert. */
static int kid(const char *section, const char *key)
{
    int k = find_key(section, key);
    if (k < 0)
        abort();
    return k;
}

static int section_known(const char *section)
{
    for (int k = 0; k < NKEYS; k++)
        if (!strcmp(keys[k].section, section))
            return 1;
    return 0;
}

/* "[job], [model], ..." for messages. */
static const char *section_list(char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
    for (int k = 0; k < NKEYS && n < len; k++)
        if (!k || strcmp(keys[k].section, keys[k - 1].section))
            n += (size_t)snprintf(buf + n, len - n, "%s[%s]", k ? ", " : "", keys[k].section);
    return buf;
}

static const char *sched_list(char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
    for (int s = 0; n < len && strcmp(sched_kind_name((sched_kind_t)s), "?"); s++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", s ? ", " : "",
                              sched_kind_name((sched_kind_t)s));
    return buf;
}

static int explicit_key(const manifest_t *m, int k) { return m->origin_line[k] != ORIGIN_DEFAULT; }

/* The flavor's preset with every explicitly set model key kept on top, whatever the order
 * in which flavor and keys were given. n_kv_heads follows an explicit n_heads when the
 * preset had no grouped-query attention (torchtitan's n_kv_heads = None). */
static void model_rederive(manifest_t *m)
{
    model_config_t preset, old = m->model;
    if (config_preset(m->flavor, &preset))
        return;
    m->model = preset;
    for (int k = 0; k < NKEYS; k++)
        if (keys[k].model && explicit_key(m, k))
            memcpy((char *)m + keys[k].off,
                   (const char *)&old + (keys[k].off - offsetof(manifest_t, model)), keys[k].size);
    if (!explicit_key(m, kid("model", "n_kv_heads")) && explicit_key(m, kid("model", "n_heads")) &&
        preset.n_kv_heads == preset.n_heads)
        m->model.n_kv_heads = m->model.n_heads;
}

void manifest_defaults(manifest_t *m)
{
    memset(m, 0, sizeof(*m));
    strcpy(m->name, "ctitan");
    strcpy(m->device, "cpu");
    strcpy(m->data_plane, "ipc");
    m->hosts = 1;
    m->heartbeat_interval_ms = 100;
    m->heartbeat_timeout_ms = 3000;
    strcpy(m->model_name, "llama3");
    strcpy(m->flavor, "debugmodel");
    config_preset(m->flavor, &m->model);
    m->steps = 10;
    m->local_batch_size = 8;
    m->seq_len = 256;
    m->max_norm = 1.0;
    m->pp = 1;
    m->schedule = SCHED_1F1B;
    m->microbatches = 1;
    m->dp = 1;
    strcpy(m->optimizer_name, "AdamW");
    m->lr = 8e-4;
    m->beta1 = 0.9;
    m->beta2 = 0.95;
    m->eps = 1e-8;
    m->weight_decay = 0.1;
    m->lr_sched = lr_schedule_default(m->steps);
    /* torchtitan's 200, unclipped: steps may still change; validate clips it as torchtitan does */
    m->lr_sched.warmup_steps = 200;
    m->prefetch = 4;
    m->shards = 1;
    m->ckpt_interval = 500;
    snprintf(m->ckpt_folder, sizeof(m->ckpt_folder), "checkpoint");
    m->ckpt_keep = 10;
    m->log_freq = 1;
    m->val_steps = 8;
    m->sample_temperature = 0.8;
}

/* "a float (2.5)", "a string ('abc')": the value a type error got. */
static const char *describe(const toml_value_t *v, char *buf, size_t len)
{
    switch (v->type) {
    case TOML_STRING: snprintf(buf, len, "a string ('%.40s%s')", v->s, strlen(v->s) > 40 ? "..." : ""); break;
    case TOML_INT: snprintf(buf, len, "an integer (%" PRId64 ")", v->i); break;
    case TOML_FLOAT: snprintf(buf, len, "a float (%g)", v->f); break;
    case TOML_BOOL: snprintf(buf, len, "a boolean (%s)", v->b ? "true" : "false"); break;
    case TOML_ARRAY: snprintf(buf, len, "an array"); break;
    }
    return buf;
}

/* "layers.N" (or a plain N) -> N. */
static int parse_split(const char *s, int *out)
{
    if (!strncmp(s, "layers.", 7))
        s += 7;
    if (!*s || strlen(s) > 9)
        return -EINVAL;
    for (const char *c = s; *c; c++)
        if (*c < '0' || *c > '9')
            return -EINVAL;
    *out = atoi(s);
    return 0;
}

/* Sets key k from a parsed value; `where` is "PATH:LINE" or "--section.key". Writes nothing
 * on error. */
static int set_value(manifest_t *m, int k, const toml_value_t *v, const char *where, int origin,
                     char *err, size_t errlen)
{
    const mkey_t *K = &keys[k];
    char *field = (char *)m + K->off;
    char got[80], list[128];
    const char *want = NULL;
    switch (K->type) {
    case K_INT:
        if (v->type != TOML_INT) {
            want = "an integer";
            break;
        }
        if (v->i < INT_MIN || v->i > INT_MAX)
            return util_fail(err, errlen, -EINVAL, "%s: %" PRId64 " is out of range for a 32-bit integer",
                             where, v->i);
        if (k == kid("model", "n_heads") && !explicit_key(m, kid("model", "n_kv_heads")) &&
            m->model.n_kv_heads == m->model.n_heads)
            m->model.n_kv_heads = (int)v->i;
        *(int *)field = (int)v->i;
        break;
    case K_U64:
        if (v->type != TOML_INT) {
            want = "an integer";
            break;
        }
        if (v->i < 0)
            return util_fail(err, errlen, -EINVAL, "%s: %" PRId64 " must be >= 0", where,
                             v->i);
        *(uint64_t *)field = (uint64_t)v->i;
        break;
    case K_DOUBLE: {
        if (v->type != TOML_INT && v->type != TOML_FLOAT) {
            want = "a number";
            break;
        }
        double x = v->type == TOML_INT ? (double)v->i : v->f;
        if (!isfinite(x))
            return util_fail(err, errlen, -EINVAL, "%s: expected a finite number, got %g",
                             where, x);
        *(double *)field = x;
        break;
    }
    case K_BOOL:
        if (v->type != TOML_BOOL) {
            want = "a boolean (true or false)";
            break;
        }
        *(int *)field = v->b;
        break;
    case K_STR:
    case K_FLAVOR:
    case K_SCHED:
    case K_DECAY: {
        if (v->type != TOML_STRING) {
            want = "a string";
            break;
        }
        if (K->type == K_SCHED) {
            sched_kind_t s;
            if (sched_kind_parse(v->s, &s))
                return util_fail(err, errlen, -EINVAL, "%s: unknown schedule '%s' (expected one of %s)",
                                 where, v->s, sched_list(list, sizeof(list)));
            *(sched_kind_t *)field = s;
            break;
        }
        if (K->type == K_DECAY) {
            lr_decay_t d;
            if (lr_decay_parse(v->s, &d))
                return util_fail(err, errlen, -EINVAL,
                                 "%s: unknown decay type '%s' (expected linear, sqrt or cosine)",
                                 where, v->s);
            *(lr_decay_t *)field = d;
            break;
        }
        size_t len = strlen(v->s);
        if (len >= K->size)
            return util_fail(err, errlen, -EINVAL, "%s: the string is %zu bytes long; at most %zu fit",
                             where, len, K->size - 1);
        model_config_t tmp;
        if (K->type == K_FLAVOR && config_preset(v->s, &tmp))
            return util_fail(err, errlen, -EINVAL, "%s: unknown flavor '%s' (expected one of %s)",
                             where, v->s, flavors);
        memset(field, 0, K->size);
        memcpy(field, v->s, len);
        break;
    }
    case K_SPLITS: {
        if (v->type != TOML_ARRAY) {
            want = "an array of \"layers.N\" strings";
            break;
        }
        if (v->n > MANIFEST_MAX_PP - 1)
            return util_fail(err, errlen, -EINVAL, "%s: %d entries; at most %d",
                             where, v->n, MANIFEST_MAX_PP - 1);
        int sp[MANIFEST_MAX_PP];
        for (int i = 0; i < v->n; i++) {
            const toml_value_t *it = &v->items[i];
            int ok = it->type == TOML_STRING ? !parse_split(it->s, &sp[i])
                   : it->type == TOML_INT ? it->i >= 0 && it->i <= INT_MAX : 0;
            if (it->type == TOML_INT && ok)
                sp[i] = (int)it->i;
            if (!ok)
                return util_fail(err, errlen, -EINVAL, "%s: entry %d: expected \"layers.N\", got %s",
                                 where, i + 1, describe(it, got, sizeof(got)));
        }
        memset(m->split_points, 0, sizeof(m->split_points));
        memcpy(m->split_points, sp, (size_t)v->n * sizeof(int));
        m->n_split_points = v->n;
        break;
    }
    }
    if (want)
        return util_fail(err, errlen, -EINVAL, "%s: expected %s, got %s", where, want, describe(v, got, sizeof(got)));
    m->origin_line[k] = origin;
    if (K->type == K_FLAVOR)
        model_rederive(m);
    if (k == kid("training", "steps"))
        m->lr_sched.steps = m->steps;
    return 0;
}

int manifest_parse(manifest_t *m, const char *text, size_t len, const char *path, char *err,
                   size_t errlen)
{
    const char *name = path ? path : "<text>";
    if (path && strlen(path) >= sizeof(m->path))
        return util_fail(err, errlen, -EINVAL, "%.64s...: path longer than %zu bytes", path,
                         sizeof(m->path) - 1);
    toml_doc_t doc;
    int rc = toml_parse(&doc, text, len, name, err, errlen);
    if (rc)
        return rc;
    manifest_t *t = malloc(sizeof(*t));
    if (!t) {
        toml_free(&doc);
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", name);
    }
    *t = *m;
    memset(t->path, 0, sizeof(t->path));
    if (path)
        strcpy(t->path, path);
    char where[MANIFEST_PATH_MAX + 96], list[160];
    /* Document order: keys before any header, then each section and its keys. */
    int e = 0;
    for (int s = -1; !rc && s < doc.n_sections; s++) {
        if (s >= 0 && !section_known(doc.sections[s].name))
            rc = util_fail(err, errlen, -EINVAL, "%s:%d: unknown section [%s] (expected one of %s)",
                           name, doc.sections[s].line, doc.sections[s].name,
                           section_list(list, sizeof(list)));
        for (; !rc && e < doc.n_entries && doc.entries[e].section == s; e++) {
            const toml_entry_t *en = &doc.entries[e];
            if (s < 0) {
                rc = util_fail(err, errlen, -EINVAL,
                               "%s:%d: key '%s' is outside any section (put it under one of %s)",
                               name, en->line, en->key, section_list(list, sizeof(list)));
                break;
            }
            int k = find_key(doc.sections[s].name, en->key);
            if (k < 0) {
                rc = util_fail(err, errlen, -EINVAL, "%s:%d: unknown key '%s' in [%s]", name,
                               en->line, en->key, doc.sections[s].name);
                break;
            }
            snprintf(where, sizeof(where), "%s:%d: %s.%s", name, en->line, keys[k].section,
                     keys[k].key);
            rc = set_value(t, k, &en->value, where, en->line, err, errlen);
        }
    }
    if (!rc)
        *m = *t;
    free(t);
    toml_free(&doc);
    return rc;
}

int manifest_load(manifest_t *m, const char *path, char *err, size_t errlen)
{
    manifest_defaults(m);
    size_t size;
    int fd = util_open_regular(path, &size, err, errlen);
    if (fd < 0)
        return fd;
    int rc = 0;
    char *buf = NULL;
    size_t got = 0;
    if (size > MANIFEST_MAX_BYTES)
        rc = util_fail(err, errlen, -EFBIG, "%s: %zu bytes is too large for a manifest (at most %d)",
                       path, size, MANIFEST_MAX_BYTES);
    else if (!(buf = malloc(size + 1)))
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    while (!rc && got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = util_fail(err, errlen, -errno, "%s: read failed: %s", path, strerror(errno));
        else if (n == 0)
            rc = util_fail(err, errlen, -EIO, "%s: file shrank while reading", path);
        else
            got += (size_t)n;
    }
    close(fd);
    if (!rc)
        rc = manifest_parse(m, buf, got, path, err, errlen);
    free(buf);
    return rc;
}

int manifest_override(manifest_t *m, const char *dotted_key, const char *value, char *err,
                      size_t errlen)
{
    const char *d = dotted_key;
    if (!strncmp(d, "--", 2))
        d += 2;
    const char *dot = strchr(d, '.');
    char section[32], list[160];
    if (!dot || dot == d || (size_t)(dot - d) >= sizeof(section))
        return util_fail(err, errlen, -EINVAL, "--%s: expected --section.key (e.g. --training.steps)", d);
    memcpy(section, d, (size_t)(dot - d));
    section[dot - d] = 0;
    if (!section_known(section))
        return util_fail(err, errlen, -EINVAL, "--%s: unknown section [%s] (expected one of %s)", d,
                         section, section_list(list, sizeof(list)));
    int k = find_key(section, dot + 1);
    if (k < 0)
        return util_fail(err, errlen, -EINVAL, "--%s: unknown key '%s' in [%s]", d, dot + 1, section);
    if (!value)
        return util_fail(err, errlen, -EINVAL, "--%s: missing value", d);
    if (toml_utf8_invalid_at(value, strlen(value)) >= 0)
        return util_fail(err, errlen, -EINVAL, "--%s: the value is not valid UTF-8", d);
    const mkey_t *K = &keys[k];
    char where[80];
    snprintf(where, sizeof(where), "--%s.%s", K->section, K->key);
    toml_value_t v = {0};
    int rc = 0, owned = 1;
    switch (K->type) {
    case K_INT: case K_U64: case K_DOUBLE: case K_BOOL:
        if (toml_parse_value(&v, value, strlen(value), NULL, 0))
            return util_fail(err, errlen, -EINVAL, "%s: expected %s, got '%s'", where,
                             K->type == K_BOOL ? "true or false"
                             : K->type == K_DOUBLE ? "a number" : "an integer", value);
        break;
    case K_SPLITS: {
        /* "layers.2,layers.4", "2,4", "" (balanced) or a TOML array */
        const char *s = value;
        while (*s == ' ' || *s == '\t')
            s++;
        if (*s == '[') {
            char msg[160];
            if (toml_parse_value(&v, value, strlen(value), msg, sizeof(msg)))
                return util_fail(err, errlen, -EINVAL, "%s: %s", where, msg);
            break;
        }
        v.type = TOML_ARRAY;
        char *copy = strdup(value);
        size_t n_items = 1;
        for (const char *c = value; *c; c++)
            n_items += *c == ',';
        v.items = calloc(n_items, sizeof(*v.items));
        if (!copy || !v.items) {
            free(copy);
            free(v.items);
            return util_fail(err, errlen, -ENOMEM, "%s: out of memory", where);
        }
        int all_blank = 1;
        for (char *tok = copy, *next; tok; tok = next) {
            next = strchr(tok, ',');
            if (next)
                *next++ = 0;
            while (*tok == ' ' || *tok == '\t')
                tok++;
            size_t l = strlen(tok);
            while (l && (tok[l - 1] == ' ' || tok[l - 1] == '\t'))
                tok[--l] = 0;
            all_blank &= !l;
            v.items[v.n].type = TOML_STRING;
            v.items[v.n].s = strdup(tok);
            if (!v.items[v.n++].s)
                rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", where);
        }
        free(copy);
        if (all_blank && v.n == 1) { /* "" clears the list: balanced split */
            toml_value_free(&v);
            v.type = TOML_ARRAY;
        }
        break;
    }
    default:
        v.type = TOML_STRING;
        v.s = (char *)value;
        owned = 0;
        break;
    }
    if (!rc)
        rc = set_value(m, k, &v, where, ORIGIN_OVERRIDE, err, errlen);
    if (owned)
        toml_value_free(&v);
    return rc;
}

/* "demo.toml:7", "--training.steps", "default", or for a model key left to the flavor
 * "demo.toml:3 (flavor tiny)". */
static const char *origin(const manifest_t *m, int k, char *buf, size_t len)
{
    int o = m->origin_line[k];
    if (o > 0)
        snprintf(buf, len, "%s:%d", m->path[0] ? m->path : "<text>", o);
    else if (o == ORIGIN_OVERRIDE)
        snprintf(buf, len, "--%s.%s", keys[k].section, keys[k].key);
    else if (keys[k].model) {
        char f[MANIFEST_PATH_MAX + 32];
        snprintf(buf, len, "%s (flavor %s)", origin(m, kid("model", "flavor"), f, sizeof(f)),
                 m->flavor);
    } else
        snprintf(buf, len, "default");
    return buf;
}

/* "ORIGIN: message" for key k. */
static int fail_at(const manifest_t *m, int k, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail_at(const manifest_t *m, int k, char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return -EINVAL;
    char o[MANIFEST_PATH_MAX + 64];
    int n = snprintf(err, errlen, "%s: ", origin(m, k, o, sizeof(o)));
    if (n >= 0 && (size_t)n < errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

static int valid_job_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 63)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-'))
            return 0;
    return 1;
}

int manifest_validate(manifest_t *m, char *err, size_t errlen)
{
    char o2[MANIFEST_PATH_MAX + 64], list[128];
    int k;
    for (k = 0; k < NKEYS; k++) {
        const mkey_t *K = &keys[k];
        const char *field = (const char *)m + K->off;
        if ((K->type == K_STR || K->type == K_FLAVOR) && strnlen(field, K->size) == K->size)
            return fail_at(m, k, err, errlen, "%s.%s is not NUL-terminated", K->section, K->key);
        if (K->type == K_INT && K->min != NO_MIN && *(const int *)field < K->min)
            return fail_at(m, k, err, errlen, "%s.%s = %d must be >= %d", K->section, K->key,
                           *(const int *)field, K->min);
        if (K->type == K_DOUBLE && !isfinite(*(const double *)field))
            return fail_at(m, k, err, errlen, "%s.%s = %g must be a finite number", K->section,
                           K->key, *(const double *)field);
    }
#define CHECK(cond, sec, key, ...) \
    do { if (!(cond)) return fail_at(m, kid(sec, key), err, errlen, __VA_ARGS__); } while (0)
    CHECK(valid_job_name(m->name), "job", "name",
          "job.name '%s' must be 1 to 63 characters from A-Z a-z 0-9 _ - (it names shared "
          "segments and the control socket)", m->name);
    CHECK(!strcmp(m->device, "cpu") || !strcmp(m->device, "cuda"), "job", "device",
          "job.device = \"%s\": expected \"cpu\" or \"cuda\"", m->device);
    CHECK(m->heartbeat_timeout_ms > m->heartbeat_interval_ms, "job", "heartbeat_timeout_ms",
          "job.heartbeat_timeout_ms = %d must exceed job.heartbeat_interval_ms = %d (%s)",
          m->heartbeat_timeout_ms, m->heartbeat_interval_ms,
          origin(m, kid("job", "heartbeat_interval_ms"), o2, sizeof(o2)));
    CHECK(!strcmp(m->model_name, "llama3"), "model", "name",
          "model.name = \"%s\": expected \"llama3\" (the only model family)", m->model_name);
    model_config_t preset;
    CHECK(!config_preset(m->flavor, &preset), "model", "flavor",
          "model.flavor: unknown flavor '%s' (expected one of %s)", m->flavor, flavors);
    CHECK(strcasecmp(m->optimizer_name, "AdamW") == 0, "optimizer", "name",
          "optimizer.name = \"%s\": expected \"AdamW\" (the only optimizer)", m->optimizer_name);
    CHECK(m->seed <= (uint64_t)INT64_MAX, "training", "seed",
          "training.seed = %" PRIu64 " must be below 2^63 (TOML integers are signed 64-bit)", m->seed);
    CHECK(m->max_norm >= 0, "training", "max_norm", "training.max_norm = %g must be >= 0 (0 = no clipping)", m->max_norm);
    CHECK(m->lr >= 0, "optimizer", "lr", "optimizer.lr = %g must be >= 0", m->lr);
    CHECK(m->beta1 >= 0 && m->beta1 < 1, "optimizer", "beta1", "optimizer.beta1 = %g must be in [0, 1)", m->beta1);
    CHECK(m->beta2 >= 0 && m->beta2 < 1, "optimizer", "beta2", "optimizer.beta2 = %g must be in [0, 1)", m->beta2);
    CHECK(m->eps > 0, "optimizer", "eps", "optimizer.eps = %g must be > 0", m->eps);
    CHECK(m->weight_decay >= 0, "optimizer", "weight_decay", "optimizer.weight_decay = %g must be >= 0", m->weight_decay);
    CHECK(m->lr_sched.decay_ratio == -1 || (m->lr_sched.decay_ratio >= 0 && m->lr_sched.decay_ratio <= 1),
          "lr_scheduler", "decay_ratio",
          "lr_scheduler.decay_ratio = %g must be in [0, 1] (or -1: every step after warmup decays)",
          m->lr_sched.decay_ratio);
    CHECK(strcmp(lr_decay_name(m->lr_sched.decay_type), "?"), "lr_scheduler", "decay_type",
          "lr_scheduler.decay_type: invalid value %d", (int)m->lr_sched.decay_type);
    CHECK(m->lr_sched.lr_min >= 0 && m->lr_sched.lr_min <= 1, "lr_scheduler", "min_lr_factor",
          "lr_scheduler.min_lr_factor = %g must be in [0, 1]", m->lr_sched.lr_min);
    CHECK(m->peak_tflops >= 0, "metrics", "peak_tflops", "metrics.peak_tflops = %g must be >= 0 (0 = measure)", m->peak_tflops);
    CHECK(m->sample_temperature > 0, "sample", "temperature", "sample.temperature = %g must be > 0", m->sample_temperature);
    CHECK(strcmp(sched_kind_name(m->schedule), "?"), "parallelism", "pipeline_parallel_schedule",
          "parallelism.pipeline_parallel_schedule: invalid value %d (expected one of %s)",
          (int)m->schedule, sched_list(list, sizeof(list)));
    CHECK(!m->val_enable || m->val_dataset_path[0], "validation", "enable",
          "validation.enable is true but validation.dataset_path is empty");

    /* The model: config_validate names the field ("model.dim (250) ..."); point at it. */
    char msg[256];
    if (config_validate(&m->model, msg, sizeof(msg))) {
        int at = kid("model", "flavor");
        for (const char *p = strstr(msg, "model."); p; p = strstr(p + 1, "model.")) {
            size_t n = strspn(p + 6, "abcdefghijklmnopqrstuvwxyz_");
            char key[32];
            if (n && n < sizeof(key)) {
                memcpy(key, p + 6, n);
                key[n] = 0;
                if ((k = find_key("model", key)) >= 0 && keys[k].model) {
                    at = k;
                    break;
                }
            }
        }
        return fail_at(m, at, err, errlen, "%s", msg);
    }
    const model_config_t *c = &m->model;
    CHECK(m->seq_len <= c->max_seq_len, "training", "seq_len",
          "training.seq_len = %d exceeds model.max_seq_len = %d (%s)", m->seq_len, c->max_seq_len,
          origin(m, kid("model", "max_seq_len"), o2, sizeof(o2)));
    /* the loader's cursor table (stages/ldr_seg.h) holds 64 steps; the loader runs at most
     * prefetch / microbatches + 1 steps ahead of the stages */
    CHECK(m->prefetch <= 32 * m->microbatches, "loader", "prefetch",
          "loader.prefetch = %d exceeds 32 x parallelism.pipeline_parallel_microbatches = %d",
          m->prefetch, 32 * m->microbatches);
    CHECK(m->local_batch_size % m->microbatches == 0, "parallelism", "pipeline_parallel_microbatches",
          "parallelism.pipeline_parallel_microbatches = %d does not divide training.local_batch_size = %d (%s)",
          m->microbatches, m->local_batch_size,
          origin(m, kid("training", "local_batch_size"), o2, sizeof(o2)));

    /* Topology. */
    int pieces = c->n_layers + 2;
    CHECK(m->pp <= pieces, "parallelism", "pipeline_parallel_degree",
          "parallelism.pipeline_parallel_degree = %d exceeds the %d pipeline pieces of the model "
          "(embedding, %d layers, head)", m->pp, pieces, c->n_layers);
    CHECK(m->pp <= MANIFEST_MAX_PP, "parallelism", "pipeline_parallel_degree",
          "parallelism.pipeline_parallel_degree = %d exceeds the most supported, %d", m->pp,
          MANIFEST_MAX_PP);
    const char *sps = "pipeline_parallel_split_points";
    CHECK(m->n_split_points >= 0 && m->n_split_points < MANIFEST_MAX_PP, "parallelism", sps,
          "parallelism.%s: invalid count %d", sps, m->n_split_points);
    CHECK(!m->n_split_points || m->n_split_points == m->pp - 1, "parallelism", sps,
          "parallelism.%s has %d entries but pipeline_parallel_degree = %d (%s) needs %d "
          "(or none for a balanced split)", sps, m->n_split_points, m->pp,
          origin(m, kid("parallelism", "pipeline_parallel_degree"), o2, sizeof(o2)), m->pp - 1);
    for (int i = 0; i < m->n_split_points; i++) {
        int s = m->split_points[i];
        CHECK(s >= 1 && s <= c->n_layers, "parallelism", sps,
              "parallelism.%s: layers.%d is outside layers.1 .. layers.%d (the model has %d layers)",
              sps, s, c->n_layers, c->n_layers);
        CHECK(i == 0 || s > m->split_points[i - 1], "parallelism", sps,
              "parallelism.%s: layers.%d does not come after layers.%d (split points must increase)",
              sps, s, m->split_points[i - 1]);
    }
    param_table_t tab;
    if (params_table_init(&tab, c))
        return util_fail(err, errlen, -ENOMEM, "out of memory building the parameter table");
    size_t total = tab.total, blocks = (total + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK;
    params_table_free(&tab);
    CHECK((size_t)m->shards <= blocks, "optshard", "shards",
          "optshard.shards = %d exceeds the %zu blocks of %d parameters in the model "
          "(%zu parameters)", m->shards, blocks, MANIFEST_BLOCK, total);
    CHECK(!m->ckpt_endpoint[0] || !strncmp(m->ckpt_endpoint, "tcp://", 6), "checkpoint", "endpoint",
          "checkpoint.endpoint = \"%s\": expected \"\" (write locally) or tcp://HOST:PORT of a remote "
          "checkpointd", m->ckpt_endpoint);
    CHECK(!m->ckpt_endpoint[0] || m->ckpt_server_key[0], "checkpoint", "endpoint",
          "checkpoint.endpoint is remote: checkpoint.server_key (the checkpointd's public key file) is needed");
    CHECK(!m->ckpt_endpoint[0] || m->ckpt_client_key[0], "checkpoint", "endpoint",
          "checkpoint.endpoint is remote: checkpoint.client_key (this trainer's secret key file, from "
          "`ctitan ckpt keygen`) is needed");
    CHECK(m->ckpt_folder[0], "checkpoint", "folder", "checkpoint.folder must not be empty");
    if (!m->shard_device[0])
        snprintf(m->shard_device, sizeof(m->shard_device), "%s", m->device);
    CHECK(!strcmp(m->shard_device, "cpu") || !strcmp(m->shard_device, "cuda"), "optshard", "device",
          "optshard.device = \"%s\": expected \"cpu\" or \"cuda\"", m->shard_device);
    CHECK(!strcmp(m->shard_device, "cpu") || !strcmp(m->device, "cuda"), "optshard", "device",
          "optshard.device = \"cuda\" needs job.device = \"cuda\" (the shards update the stages' GPU weights)");
    CHECK(!strcmp(m->data_plane, "ipc") || !strcmp(m->data_plane, "nccl"), "parallelism", "data_plane",
          "parallelism.data_plane = \"%s\": expected \"ipc\" or \"nccl\"", m->data_plane);
    CHECK(strcmp(m->data_plane, "nccl") || !strcmp(m->shard_device, "cuda"), "parallelism", "data_plane",
          "parallelism.data_plane = \"nccl\" needs job.device = \"cuda\" and optimizer shards on the GPU "
          "(optshard.device = \"cuda\")");
    CHECK(strcmp(m->data_plane, "nccl") || m->dp <= 4096, "parallelism", "data_parallel_replicate_degree",
          "parallelism.data_parallel_replicate_degree = %d: the NCCL data plane takes at most 4096 replicas", m->dp);
    if (!strcmp(m->data_plane, "nccl"))
        m->shards = m->dp * m->pp; /* one shard per stage process: its chunk after the reduce-scatter */
    CHECK(m->host_rank < m->hosts, "job", "host_rank", "job.host_rank = %d: the job has job.hosts = %d", m->host_rank,
          m->hosts);
    CHECK(m->hosts == 1 || !strcmp(m->data_plane, "nccl"), "job", "hosts",
          "job.hosts = %d needs parallelism.data_plane = \"nccl\" (CUDA IPC and shared memory stay on one host)",
          m->hosts);
    CHECK(m->dp % m->hosts == 0, "job", "hosts",
          "job.hosts = %d must divide parallelism.data_parallel_replicate_degree = %d (each host runs whole "
          "replicas)", m->hosts, m->dp);
    CHECK(m->hosts == 1 || (!strncmp(m->endpoint, "tcp://", 6) && !strchr(m->endpoint, '*')), "job", "endpoint",
          "job.hosts = %d: job.endpoint must be tcp://HOST:PORT of the coordinator (host_rank 0), the same on "
          "every host", m->hosts);
    CHECK(m->hosts == 1 || !m->ckpt_enable, "checkpoint", "enable",
          "checkpoint.enable with job.hosts = %d: checkpoints across hosts are not built yet", m->hosts);
    CHECK(m->hosts == 1 || (!m->val_enable && m->sample_tokens == 0), "validation", "enable",
          "job.hosts = %d: the end-of-run validation and sample need every optimizer shard on the coordinator's "
          "host; set validation.enable = false and sample.tokens = 0", m->hosts);
    int hd = config_head_dim(&m->model);
    CHECK(strcmp(m->device, "cuda") || hd == 16 || hd == 32 || hd == 64 || hd == 128, "job", "device",
          "job.device = \"cuda\": the model's head dimension is %d (model.dim %d / model.n_heads %d); the CUDA "
          "attention kernel takes 16, 32, 64 or 128", hd, m->model.dim, m->model.n_heads);

    /* Derived values. */
    if (!m->dump_folder[0])
        snprintf(m->dump_folder, sizeof(m->dump_folder), "runs/%s", m->name);
    m->lr_sched.steps = m->steps;
    if (m->lr_sched.warmup_steps > m->steps)
        m->lr_sched.warmup_steps = m->steps; /* torchtitan clips (with a warning) too */
#undef CHECK
    return 0;
}

static void put_string(FILE *f, const char *s, size_t size)
{
    fputc('"', f);
    for (size_t i = 0; i < size && s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04X", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* The shortest %.Ng that reads back to the same bits, always in float syntax. */
static void put_double(FILE *f, double x)
{
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, x);
        double y = strtod(buf, NULL);
        if (!memcmp(&x, &y, sizeof(x)) || !isfinite(x))
            break;
    }
    fputs(buf, f);
    if (isfinite(x) && !strpbrk(buf, ".e"))
        fputs(".0", f);
}

char *manifest_to_toml(const manifest_t *m)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f)
        return NULL;
    fputs("# ctitan job manifest, resolved: every key, as each process of the job reads it\n", f);
    for (int k = 0; k < NKEYS; k++) {
        const mkey_t *K = &keys[k];
        const char *field = (const char *)m + K->off;
        if (!k || strcmp(K->section, keys[k - 1].section))
            fprintf(f, "%s[%s]\n", k ? "\n" : "", K->section);
        fprintf(f, "%s = ", K->key);
        switch (K->type) {
        case K_INT: fprintf(f, "%d", *(const int *)field); break;
        case K_U64: fprintf(f, "%" PRIu64, *(const uint64_t *)field); break;
        case K_DOUBLE: put_double(f, *(const double *)field); break;
        case K_BOOL: fputs(*(const int *)field ? "true" : "false", f); break;
        case K_STR: case K_FLAVOR: put_string(f, field, K->size); break;
        case K_SCHED: fprintf(f, "\"%s\"", sched_kind_name(*(const sched_kind_t *)field)); break;
        case K_DECAY: fprintf(f, "\"%s\"", lr_decay_name(*(const lr_decay_t *)field)); break;
        case K_SPLITS:
            fputc('[', f);
            for (int i = 0; i < m->n_split_points && i < MANIFEST_MAX_PP; i++)
                fprintf(f, "%s\"layers.%d\"", i ? ", " : "", m->split_points[i]);
            fputc(']', f);
            break;
        }
        fputc('\n', f);
    }
    int bad = ferror(f);
    if (fclose(f) || bad) {
        free(out);
        return NULL;
    }
    return out;
}

/* Smallest largest-stage size over contiguous splits of w[0, P) into k non-empty stages
 * (k <= P), then the lexicographically earliest split reaching it: start[0..k].
 * pre and need are scratch of P + 1 each. */
static void balanced_split(const size_t *w, int P, int k, int *start, size_t *pre, int *need)
{
    size_t lo = 0, hi = 0;
    for (int i = 0; i < P; i++) {
        lo = w[i] > lo ? w[i] : lo;
        hi += w[i];
    }
    while (lo < hi) { /* fewest stages needed at cap mid, by greedy packing */
        size_t mid = lo + (hi - lo) / 2, run = 0;
        int parts = 1;
        for (int i = 0; i < P; i++) {
            if (run + w[i] > mid)
                parts++, run = 0;
            run += w[i];
        }
        if (parts <= k)
            hi = mid;
        else
            lo = mid + 1;
    }
    size_t cap = lo;
    pre[0] = 0; /* need[i]: fewest stages for pieces [i, P) at this cap */
    for (int i = 0; i < P; i++)
        pre[i + 1] = pre[i] + w[i];
    need[P] = 0;
    for (int i = P - 1, j = P; i >= 0; i--) {
        while (pre[j] - pre[i] > cap)
            j--;
        need[i] = 1 + need[j];
    }
    /* The earliest end for each stage that leaves a feasible rest (need is non-increasing). */
    int i = 0;
    for (int s = 0; s < k - 1; s++) {
        start[s] = i;
        int j = i + 1;
        while (need[j] > k - s - 1)
            j++;
        i = j;
    }
    start[k - 1] = i;
    start[k] = P;
}

int manifest_stage_pieces(const manifest_t *m, int stage, int *p0, int *p1)
{
    int P = m->model.n_layers + 2, pp = m->pp;
    if (m->n_split_points > 0) {
        *p0 = stage == 0 ? 0 : m->split_points[stage - 1] + 1;
        *p1 = stage == pp - 1 ? P : m->split_points[stage] + 1;
        return 0;
    }
    int k = pp < P ? pp : P, start[MANIFEST_MAX_PP + 1];
    if (k > MANIFEST_MAX_PP)
        k = MANIFEST_MAX_PP;
    if (stage >= k) { /* only for an unvalidated pp beyond the pieces */
        *p0 = *p1 = P;
        return 0;
    }
    /* every process must find the same split: no fallback when memory is short, an error */
    size_t *w = malloc((2 * (size_t)P + 1) * sizeof(*w));
    int *need = malloc(((size_t)P + 1) * sizeof(*need));
    param_table_t tab;
    int rc = w && need && !params_table_init(&tab, &m->model) ? 0 : -ENOMEM;
    if (!rc) {
        for (int i = 0; i < P; i++) {
            size_t b, e;
            params_piece_range(&tab, i, i + 1, &b, &e);
            w[i] = e - b;
        }
        params_table_free(&tab);
        balanced_split(w, P, k, start, w + P, need);
        *p0 = start[stage];
        *p1 = start[stage + 1];
    }
    free(w);
    free(need);
    return rc;
}

void manifest_ckpt_folder(const manifest_t *m, char *buf, size_t n)
{
    if (m->ckpt_folder[0] == '/')
        snprintf(buf, n, "%s", m->ckpt_folder);
    else
        snprintf(buf, n, "%s/%s", m->dump_folder, m->ckpt_folder);
}

void manifest_shard_range(size_t total, int shards, int k, size_t *begin, size_t *end)
{
    /* The extra blocks go to the last shards, so the short last block evens out instead of
     * widening the gap: float counts then also differ by at most one block. */
    size_t nb = (total + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK, K = (size_t)shards;
    size_t base = nb / K, rem = nb % K, first_big = K - rem;
    size_t b0 = (size_t)k * base + ((size_t)k > first_big ? (size_t)k - first_big : 0);
    size_t b1 = ((size_t)k + 1) * base + ((size_t)k + 1 > first_big ? (size_t)k + 1 - first_big : 0);
    *begin = b0 * MANIFEST_BLOCK < total ? b0 * MANIFEST_BLOCK : total;
    *end = b1 * MANIFEST_BLOCK < total ? b1 * MANIFEST_BLOCK : total;
}
