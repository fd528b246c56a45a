/* Reading a manifest (see manifest.h): TOML text and --section.key overrides onto a
 * manifest_t, through the key table (manifest_keys.h). Every value is typed and bounded here;
 * the checks across keys are manifest_validate's (manifest_check.c). */
#include "stages/job/manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/util.h"
#include "stages/job/manifest_keys.h"
#include "stages/job/toml.h"

/* The flavor's preset with every explicitly set model key kept on top, whatever the order
 * in which flavor and keys were given. n_kv_heads follows an explicit n_heads when the
 * preset had no grouped-query attention (torchtitan's n_kv_heads = None). */
static void model_rederive(manifest_t *m)
{
    model_config_t preset, old = m->model;
    if (config_preset(m->flavor, &preset))
        return;
    m->model = preset;
    for (int k = 0; k < mkey_count; k++)
        if (mkey_table[k].model && mkey_explicit(m, k))
            memcpy((char *)m + mkey_table[k].off,
                   (const char *)&old + (mkey_table[k].off - offsetof(manifest_t, model)), mkey_table[k].size);
    if (!mkey_explicit(m, mkey_id("model", "n_kv_heads")) && mkey_explicit(m, mkey_id("model", "n_heads")) &&
        preset.n_kv_heads == preset.n_heads)
        m->model.n_kv_heads = m->model.n_heads;
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

/* What a key of type t takes when v is not it ("an integer"), or NULL. */
static const char *wrong_type(mkey_type_t t, const toml_value_t *v)
{
    switch (t) {
    case MKEY_INT:
    case MKEY_U64: return v->type == TOML_INT ? NULL : "an integer";
    case MKEY_DOUBLE: return v->type == TOML_INT || v->type == TOML_FLOAT ? NULL : "a number";
    case MKEY_BOOL: return v->type == TOML_BOOL ? NULL : "a boolean (true or false)";
    case MKEY_STR:
    case MKEY_FLAVOR:
    case MKEY_SCHED:
    case MKEY_DECAY: return v->type == TOML_STRING ? NULL : "a string";
    case MKEY_SPLITS: return v->type == TOML_ARRAY ? NULL : "an array of \"layers.N\" strings";
    case MKEY_AC_MODE: return v->type == TOML_STRING ? NULL : "a string (none, full or selective)";
    case MKEY_AC_OPTION:
        return v->type == TOML_STRING || v->type == TOML_INT ? NULL : "a positive integer or \"op\"";
    }
    return "?";
}

static int set_int(manifest_t *m, int k, const toml_value_t *v, const char *where, char *err, size_t errlen)
{
    if (v->i < INT_MIN || v->i > INT_MAX)
        return util_fail(err, errlen, -EINVAL, "%s: %" PRId64 " is out of range for a 32-bit integer", where, v->i);
    if (k == mkey_id("model", "n_heads") && !mkey_explicit(m, mkey_id("model", "n_kv_heads")) &&
        m->model.n_kv_heads == m->model.n_heads)
        m->model.n_kv_heads = (int)v->i;
    *(int *)((char *)m + mkey_table[k].off) = (int)v->i;
    return 0;
}

/* A schedule or decay type by name. */
static int set_enum(manifest_t *m, int k, const toml_value_t *v, const char *where, char *err, size_t errlen)
{
    char *field = (char *)m + mkey_table[k].off, list[128];
    if (mkey_table[k].type == MKEY_SCHED) {
        sched_kind_t s;
        if (sched_kind_parse(v->s, &s))
            return util_fail(err, errlen, -EINVAL, "%s: unknown schedule '%s' (expected one of %s)", where, v->s,
                             mkey_sched_list(list, sizeof(list)));
        *(sched_kind_t *)field = s;
        return 0;
    }
    lr_decay_t d;
    if (lr_decay_parse(v->s, &d))
        return util_fail(err, errlen, -EINVAL, "%s: unknown decay type '%s' (expected linear, sqrt or cosine)",
                         where, v->s);
    *(lr_decay_t *)field = d;
    return 0;
}

/* [activation_checkpoint] mode by name; selective_ac_option as N >= 1 (an integer or its
 * digits as a string, torchtitan's form) or "op" (0). */
static int set_ac(manifest_t *m, int k, const toml_value_t *v, const char *where, char *err, size_t errlen)
{
    const mkey_t *K = &mkey_table[k];
    int *field = (int *)((char *)m + K->off), x;
    if (K->type == MKEY_AC_MODE) {
        if (config_ac_mode_parse(v->s, &x))
            return util_fail(err, errlen, -EINVAL, "%s = \"%.40s\": expected none, full or selective", where, v->s);
        *field = x;
        return 0;
    }
    if (v->type == TOML_STRING && !strcmp(v->s, "op")) {
        *field = 0;
        return 0;
    }
    int ok = v->type == TOML_INT ? v->i >= 1 && v->i <= INT_MAX : !parse_split(v->s, &x) && x >= 1 &&
                                                                  !strchr(v->s, '.');
    if (!ok) {
        char got[80];
        if (v->type == TOML_STRING)
            snprintf(got, sizeof(got), "\"%.40s\"", v->s);
        else
            snprintf(got, sizeof(got), "%" PRId64, v->i);
        return util_fail(err, errlen, -EINVAL,
                         "%s = %s: expected a positive integer N (every Nth layer recomputed) or \"op\"", where, got);
    }
    *field = v->type == TOML_INT ? (int)v->i : x;
    return 0;
}

/* A string that must fit its field; a flavor must also be a config_preset name. */
static int set_string(manifest_t *m, int k, const toml_value_t *v, const char *where, char *err, size_t errlen)
{
    const mkey_t *K = &mkey_table[k];
    size_t len = strlen(v->s);
    if (len >= K->size)
        return util_fail(err, errlen, -EINVAL, "%s: the string is %zu bytes long; at most %zu fit", where, len,
                         K->size - 1);
    model_config_t tmp;
    if (K->type == MKEY_FLAVOR && config_preset(v->s, &tmp))
        return util_fail(err, errlen, -EINVAL, "%s: unknown flavor '%s' (expected one of %s)", where, v->s,
                         MKEY_FLAVOR_LIST);
    char *field = (char *)m + K->off;
    memset(field, 0, K->size);
    memcpy(field, v->s, len);
    return 0;
}

/* ["layers.N", ...] (or plain integers) into split_points. */
static int set_splits(manifest_t *m, const toml_value_t *v, const char *where, char *err, size_t errlen)
{
    if (v->n > MANIFEST_MAX_PP - 1)
        return util_fail(err, errlen, -EINVAL, "%s: %d entries; at most %d", where, v->n, MANIFEST_MAX_PP - 1);
    int sp[MANIFEST_MAX_PP];
    char got[80];
    for (int i = 0; i < v->n; i++) {
        const toml_value_t *it = &v->items[i];
        int ok = it->type == TOML_STRING ? !parse_split(it->s, &sp[i])
               : it->type == TOML_INT ? it->i >= 0 && it->i <= INT_MAX : 0;
        if (it->type == TOML_INT && ok)
            sp[i] = (int)it->i;
        if (!ok)
            return util_fail(err, errlen, -EINVAL, "%s: entry %d: expected \"layers.N\", got %s", where, i + 1,
                             describe(it, got, sizeof(got)));
    }
    memset(m->split_points, 0, sizeof(m->split_points));
    memcpy(m->split_points, sp, (size_t)v->n * sizeof(int));
    m->n_split_points = v->n;
    return 0;
}

/* Sets key k from a parsed value; `where` is "PATH:LINE" or "--section.key". Writes nothing
 * on error. */
static int set_value(manifest_t *m, int k, const toml_value_t *v, const char *where, int origin, char *err,
                     size_t errlen)
{
    const mkey_t *K = &mkey_table[k];
    char *field = (char *)m + K->off, got[80];
    const char *want = wrong_type(K->type, v);
    if (want)
        return util_fail(err, errlen, -EINVAL, "%s: expected %s, got %s", where, want, describe(v, got, sizeof(got)));
    int rc = 0;
    switch (K->type) {
    case MKEY_INT: rc = set_int(m, k, v, where, err, errlen); break;
    case MKEY_U64:
        if (v->i < 0)
            return util_fail(err, errlen, -EINVAL, "%s: %" PRId64 " must be >= 0", where, v->i);
        *(uint64_t *)field = (uint64_t)v->i;
        break;
    case MKEY_DOUBLE: {
        double x = v->type == TOML_INT ? (double)v->i : v->f;
        if (!isfinite(x))
            return util_fail(err, errlen, -EINVAL, "%s: expected a finite number, got %g", where, x);
        *(double *)field = x;
        break;
    }
    case MKEY_BOOL: *(int *)field = v->b; break;
    case MKEY_SCHED:
    case MKEY_DECAY: rc = set_enum(m, k, v, where, err, errlen); break;
    case MKEY_STR:
    case MKEY_FLAVOR: rc = set_string(m, k, v, where, err, errlen); break;
    case MKEY_SPLITS: rc = set_splits(m, v, where, err, errlen); break;
    case MKEY_AC_MODE:
    case MKEY_AC_OPTION: rc = set_ac(m, k, v, where, err, errlen); break;
    }
    if (rc)
        return rc;
    m->origin_line[k] = origin;
    if (K->type == MKEY_FLAVOR)
        model_rederive(m);
    if (k == mkey_id("training", "steps"))
        m->lr_sched.steps = m->steps;
    if (k == mkey_id("parallelism", "data_parallel_replicate_degree") ||
        k == mkey_id("parallelism", "data_parallel_shard_degree")) /* both >= 1; the check bounds them */
        m->dp = (long long)m->dp_replicate * m->dp_shard > INT_MAX ? INT_MAX : m->dp_replicate * m->dp_shard;
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
        if (s >= 0 && !mkey_section_known(doc.sections[s].name))
            rc = util_fail(err, errlen, -EINVAL, "%s:%d: unknown section [%s] (expected one of %s)",
                           name, doc.sections[s].line, doc.sections[s].name,
                           mkey_section_list(list, sizeof(list)));
        for (; !rc && e < doc.n_entries && doc.entries[e].section == s; e++) {
            const toml_entry_t *en = &doc.entries[e];
            if (s < 0) {
                rc = util_fail(err, errlen, -EINVAL,
                               "%s:%d: key '%s' is outside any section (put it under one of %s)",
                               name, en->line, en->key, mkey_section_list(list, sizeof(list)));
                break;
            }
            int k = mkey_find(doc.sections[s].name, en->key);
            if (k < 0) {
                rc = util_fail(err, errlen, -EINVAL, "%s:%d: unknown key '%s' in [%s]", name,
                               en->line, en->key, doc.sections[s].name);
                break;
            }
            snprintf(where, sizeof(where), "%s:%d: %s.%s", name, en->line, mkey_table[k].section,
                     mkey_table[k].key);
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
    long got = 0;
    if (size > MANIFEST_MAX_BYTES)
        rc = util_fail(err, errlen, -EFBIG, "%s: %zu bytes is too large for a manifest (at most %d)",
                       path, size, MANIFEST_MAX_BYTES);
    else if (!(buf = malloc(size + 1)))
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    else if ((got = util_read_all(fd, buf, size, -1)) < 0)
        rc = util_fail(err, errlen, (int)got, "%s: read failed: %s", path, strerror((int)-got));
    else if ((size_t)got < size)
        rc = util_fail(err, errlen, -EIO, "%s: file shrank while reading", path);
    close(fd);
    if (!rc)
        rc = manifest_parse(m, buf, got, path, err, errlen);
    free(buf);
    return rc;
}

/* An override's split points: "layers.2,layers.4", "2,4", "" (balanced) or a TOML array,
 * into *v (zeroed; the caller frees it, also on error). */
static int splits_from_text(toml_value_t *v, const char *value, const char *where, char *err, size_t errlen)
{
    const char *s = value;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '[') {
        char msg[160];
        if (toml_parse_value(v, value, strlen(value), msg, sizeof(msg)))
            return util_fail(err, errlen, -EINVAL, "%s: %s", where, msg);
        return 0;
    }
    v->type = TOML_ARRAY;
    char *copy = strdup(value);
    size_t n_items = 1;
    for (const char *c = value; *c; c++)
        n_items += *c == ',';
    v->items = calloc(n_items, sizeof(*v->items));
    if (!copy || !v->items) {
        free(copy);
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", where);
    }
    int all_blank = 1, rc = 0;
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
        v->items[v->n].type = TOML_STRING;
        v->items[v->n].s = strdup(tok);
        if (!v->items[v->n++].s)
            rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", where);
    }
    free(copy);
    if (!rc && all_blank && v->n == 1) { /* "" clears the list: balanced split */
        toml_value_free(v);
        v->type = TOML_ARRAY;
    }
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
    if (!mkey_section_known(section))
        return util_fail(err, errlen, -EINVAL, "--%s: unknown section [%s] (expected one of %s)", d,
                         section, mkey_section_list(list, sizeof(list)));
    int k = mkey_find(section, dot + 1);
    if (k < 0)
        return util_fail(err, errlen, -EINVAL, "--%s: unknown key '%s' in [%s]", d, dot + 1, section);
    if (!value)
        return util_fail(err, errlen, -EINVAL, "--%s: missing value", d);
    if (toml_utf8_invalid_at(value, strlen(value)) >= 0)
        return util_fail(err, errlen, -EINVAL, "--%s: the value is not valid UTF-8", d);
    const mkey_t *K = &mkey_table[k];
    char where[80];
    snprintf(where, sizeof(where), "--%s.%s", K->section, K->key);
    toml_value_t v = {0};
    int rc, owned = 1;
    switch (K->type) {
    case MKEY_INT: case MKEY_U64: case MKEY_DOUBLE: case MKEY_BOOL:
        if (toml_parse_value(&v, value, strlen(value), NULL, 0))
            return util_fail(err, errlen, -EINVAL, "%s: expected %s, got '%s'", where,
                             K->type == MKEY_BOOL ? "true or false"
                             : K->type == MKEY_DOUBLE ? "a number" : "an integer", value);
        break;
    case MKEY_SPLITS:
        if ((rc = splits_from_text(&v, value, where, err, errlen))) {
            toml_value_free(&v);
            return rc;
        }
        break;
    default:
        v.type = TOML_STRING;
        v.s = (char *)value;
        owned = 0;
        break;
    }
    rc = set_value(m, k, &v, where, MKEY_OVERRIDE, err, errlen);
    if (owned)
        toml_value_free(&v);
    return rc;
}
