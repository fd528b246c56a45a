/* config.json -> model_config_t (hf_config.h). jansson parses; every key is looked up by
 * name, checked for its type and range, and whatever ctitan would run differently from
 * transformers is refused rather than ignored. */
#include "checkpointd/hf_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ipc/util.h"


/* An integer key in [lo, hi]; absent: *v = dflt, or -EINVAL when dflt < lo (required). */
static int get_int(json_t *o, const char *key, long long lo, long long hi, long long dflt, int *v,
                   const char *what, char *err, size_t errlen)
{
    json_t *j = json_object_get(o, key);
    if (!j || json_is_null(j)) {
        if (dflt < lo)
            return util_fail(err, errlen, -EINVAL, "%s: %s is missing", what, key);
        *v = (int)dflt;
        return 0;
    }
    if (!json_is_integer(j))
        return util_fail(err, errlen, -EINVAL, "%s: %s must be an integer", what, key);
    long long x = json_integer_value(j);
    if (x < lo || x > hi)
        return util_fail(err, errlen, -EINVAL, "%s: %s = %lld is out of range [%lld, %lld]", what, key, x, lo, hi);
    *v = (int)x;
    return 0;
}

/* A number key > 0; absent: dflt (0: required). */
static int get_num(json_t *o, const char *key, double dflt, double *v, const char *what, char *err, size_t errlen)
{
    json_t *j = json_object_get(o, key);
    if (!j || json_is_null(j)) {
        if (!(dflt > 0))
            return util_fail(err, errlen, -EINVAL, "%s: %s is missing", what, key);
        *v = dflt;
        return 0;
    }
    if (!json_is_number(j) || !(json_number_value(j) > 0))
        return util_fail(err, errlen, -EINVAL, "%s: %s must be a number > 0", what, key);
    *v = json_number_value(j);
    return 0;
}

/* A boolean key (absent: 0); *v its value. */
static int get_bool(json_t *o, const char *key, int *v, const char *what, char *err, size_t errlen)
{
    json_t *j = json_object_get(o, key);
    *v = 0;
    if (!j || json_is_null(j))
        return 0;
    if (!json_is_boolean(j))
        return util_fail(err, errlen, -EINVAL, "%s: %s must be true or false", what, key);
    *v = json_is_true(j);
    return 0;
}

/* architectures (LlamaForCausalLM only, when present), model_type "llama", hidden_act "silu",
 * no attention or MLP bias. */
static int check_kind(json_t *o, const char *what, char *err, size_t errlen)
{
    json_t *a = json_object_get(o, "architectures");
    if (a && !json_is_null(a)) {
        if (!json_is_array(a))
            return util_fail(err, errlen, -EINVAL, "%s: architectures must be a list", what);
        for (size_t i = 0; i < json_array_size(a); i++) {
            const char *s = json_string_value(json_array_get(a, i));
            if (!s || strcmp(s, "LlamaForCausalLM"))
                return util_fail(err, errlen, -ENOTSUP, "%s: architecture %s: ctitan imports LlamaForCausalLM only",
                                 what, s ? s : "(not a string)");
        }
    }
    const char *mt = json_string_value(json_object_get(o, "model_type"));
    if (!mt)
        return util_fail(err, errlen, -EINVAL, "%s: model_type is missing (\"llama\" expected)", what);
    if (strcmp(mt, "llama"))
        return util_fail(err, errlen, -ENOTSUP, "%s: model_type \"%s\": ctitan imports \"llama\" only", what, mt);
    json_t *act = json_object_get(o, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        return util_fail(err, errlen, -ENOTSUP, "%s: hidden_act %s: ctitan's MLP is SwiGLU (\"silu\")", what,
                         json_is_string(act) ? json_string_value(act) : "(not a string)");
    static const char *const biases[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) {
        int b, rc = get_bool(o, biases[i], &b, what, err, errlen);
        if (rc)
            return rc;
        if (b)
            return util_fail(err, errlen, -ENOTSUP, "%s: %s = true: ctitan's Llama has no biases", what, biases[i]);
    }
    return 0;
}

/* rope_scaling: absent, null, {"rope_type": "default"} or Llama 3.1's "llama3". */
static int get_rope_scaling(json_t *o, model_config_t *c, const char *what, char *err, size_t errlen)
{
    json_t *rs = json_object_get(o, "rope_scaling");
    if (!rs || json_is_null(rs))
        return 0;
    if (!json_is_object(rs))
        return util_fail(err, errlen, -EINVAL, "%s: rope_scaling must be null or an object", what);
    json_t *t = json_object_get(rs, "rope_type");
    if (!t || json_is_null(t))
        t = json_object_get(rs, "type");
    const char *type = json_string_value(t);
    if (!type)
        return util_fail(err, errlen, -EINVAL, "%s: rope_scaling has no rope_type", what);
    if (!strcmp(type, "default"))
        return 0;
    if (strcmp(type, "llama3"))
        return util_fail(err, errlen, -ENOTSUP, "%s: rope_scaling type \"%s\": ctitan runs only \"llama3\" "
                         "(Llama 3.1's) or none", what, type);
    char w[600];
    snprintf(w, sizeof(w), "%s: rope_scaling", what);
    int rc = get_num(rs, "factor", 0, &c->rope_scaling_factor, w, err, errlen);
    if (!rc)
        rc = get_num(rs, "low_freq_factor", 0, &c->rope_low_freq_factor, w, err, errlen);
    if (!rc)
        rc = get_num(rs, "high_freq_factor", 0, &c->rope_high_freq_factor, w, err, errlen);
    if (!rc)
        rc = get_int(rs, "original_max_position_embeddings", 1, 1 << 30, 0, &c->rope_original_max_seq_len, w, err,
                     errlen);
    return rc;
}

static int get_shape(json_t *o, model_config_t *c, const char *what, char *err, size_t errlen)
{
    int rc = get_int(o, "hidden_size", 1, 1 << 20, 0, &c->dim, what, err, errlen);
    if (!rc)
        rc = get_int(o, "num_hidden_layers", 1, CONFIG_MAX_LAYERS, 0, &c->n_layers, what, err, errlen);
    if (!rc)
        rc = get_int(o, "num_attention_heads", 1, 1 << 16, 0, &c->n_heads, what, err, errlen);
    if (!rc)
        rc = get_int(o, "num_key_value_heads", 1, 1 << 16, c->n_heads, &c->n_kv_heads, what, err, errlen);
    if (!rc)
        rc = get_int(o, "intermediate_size", 1, 1 << 24, 0, &c->hidden_dim, what, err, errlen);
    if (!rc)
        rc = get_int(o, "vocab_size", 1, 1 << 30, 0, &c->vocab_size, what, err, errlen);
    if (!rc)
        rc = get_int(o, "max_position_embeddings", 1, 1 << 30, 0, &c->max_seq_len, what, err, errlen);
    if (!rc)
        rc = get_num(o, "rms_norm_eps", 0, &c->norm_eps, what, err, errlen);
    if (!rc)
        rc = get_num(o, "rope_theta", 10000.0, &c->rope_theta, what, err, errlen);
    if (rc)
        return rc;
    int hd = 0;
    if ((rc = get_int(o, "head_dim", 1, 1 << 16, c->dim / c->n_heads, &hd, what, err, errlen)))
        return rc;
    if (c->dim % c->n_heads || hd != c->dim / c->n_heads)
        return util_fail(err, errlen, -ENOTSUP, "%s: head_dim %d: ctitan's heads are hidden_size / "
                         "num_attention_heads (%d / %d)", what, hd, c->dim, c->n_heads);
    return 0;
}

int hf_config_parse(const char *text, size_t len, const char *what, hf_config_t *out, char *err, size_t errlen)
{
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return util_fail(err, errlen, -EINVAL, "%s:%d: not JSON: %s", what, je.line, je.text);
    hf_config_t h = {.model = config_defaults()};
    int rc = 0;
    if (!json_is_object(o))
        rc = util_fail(err, errlen, -EINVAL, "%s: not a JSON object", what);
    if (!rc)
        rc = check_kind(o, what, err, errlen);
    if (!rc)
        rc = get_shape(o, &h.model, what, err, errlen);
    if (!rc)
        rc = get_rope_scaling(o, &h.model, what, err, errlen);
    if (!rc)
        rc = get_bool(o, "tie_word_embeddings", &h.tied, what, err, errlen);
    char verr[512];
    if (!rc && config_validate(&h.model, verr, sizeof(verr)))
        rc = util_fail(err, errlen, -EINVAL, "%s: %s", what, verr);
    json_decref(o);
    if (!rc)
        *out = h;
    return rc;
}

int hf_eos_parse(const char *text, size_t len, const char *what, int vocab, int *ids, int *n, int *found, char *err,
                 size_t errlen)
{
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    json_t *e = json_is_object(o) ? json_object_get(o, "eos_token_id") : NULL;
    int rc = 0;
    *n = 0, *found = e != NULL;
    if (!o)
        rc = util_fail(err, errlen, -EINVAL, "%s:%d: not JSON: %s", what, je.line, je.text);
    else if (!json_is_object(o))
        rc = util_fail(err, errlen, -EINVAL, "%s: not a JSON object", what);
    size_t k = json_is_array(e) ? json_array_size(e) : e && !json_is_null(e);
    if (!rc && k > HF_EOS_MAX)
        rc = util_fail(err, errlen, -EINVAL, "%s: eos_token_id lists %zu ids, ctitan takes at most %d", what, k,
                       HF_EOS_MAX);
    for (size_t i = 0; !rc && i < k; i++) {
        json_t *v = json_is_array(e) ? json_array_get(e, i) : e;
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
            rc = util_fail(err, errlen, -EINVAL, "%s: eos_token_id must be a token id below the vocabulary of %d, a "
                           "list of them or null", what, vocab);
        else
            ids[(*n)++] = (int)json_integer_value(v);
    }
    json_decref(o);
    if (rc)
        *n = 0;
    return rc;
}

/* DIR/NAME's eos_token_id into ids (*n of them); *found: the file has the key. A missing file
 * has none. */
static int eos_of(const char *dir, const char *name, int vocab, int *ids, int *n, int *found, char *err,
                  size_t errlen)
{
    char path[4096];
    *n = 0, *found = 0;
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) >= sizeof(path))
        return util_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);
    if (access(path, F_OK))
        return 0;
    size_t size = 0;
    char *buf = NULL;
    int rc = util_read_file(path, HF_CONFIG_MAX, name, &buf, &size, err, errlen);
    if (!rc)
        rc = hf_eos_parse(buf, size, path, vocab, ids, n, found, err, errlen);
    free(buf);
    return rc;
}

int hf_eos_ids(const char *dir, int vocab, int *ids, int *n, char *err, size_t errlen)
{
    int found, rc = eos_of(dir, "generation_config.json", vocab, ids, n, &found, err, errlen);
    return rc || found ? rc : eos_of(dir, "config.json", vocab, ids, n, &found, err, errlen);
}

int hf_config_load(const char *dir, hf_config_t *out, char *err, size_t errlen)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof(path), "%s/config.json", dir) >= sizeof(path))
        return util_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);
    size_t size = 0;
    char *buf = NULL;
    int rc = util_read_file(path, HF_CONFIG_MAX, "config.json", &buf, &size, err, errlen);
    if (!rc)
        rc = hf_config_parse(buf, size, path, out, err, errlen);
    free(buf);
    return rc;
}
