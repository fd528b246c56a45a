/* Model config: defaults, presets, text setters and validation (see config.h). */
#include "kernels/config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

model_config_t config_defaults(void)
{
    return (model_config_t){
        .multiple_of = 256,
        .ffn_dim_multiplier = 0,
        .norm_eps = 1e-5,
        .rope_theta = 10000.0,
        .max_seq_len = 2048,
    };
}

int config_preset(const char *name, model_config_t *cfg)
{
    model_config_t c = config_defaults();
    if (!strcmp(name, "debugmodel")) {
        c.dim = 256, c.n_layers = 6, c.n_heads = 16, c.vocab_size = 2048, c.rope_theta = 500000;
    } else if (!strcmp(name, "gpt2s")) {
        c.dim = 768, c.n_layers = 12, c.n_heads = 12, c.vocab_size = 50304;
    } else if (!strcmp(name, "llama1b")) {
        c.dim = 2048, c.n_layers = 16, c.n_heads = 16, c.n_kv_heads = 8, c.vocab_size = 32000,
        c.rope_theta = 500000;
    } else if (!strcmp(name, "tiny")) {
        c.dim = 16, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 32,
        c.multiple_of = 16, c.max_seq_len = 64;
    } else {
        return -EINVAL;
    }
    c.n_kv_heads = c.n_kv_heads ? c.n_kv_heads : c.n_heads;
    *cfg = c;
    return 0;
}

static int parse_int(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < -2147483647L || v > 2147483647L)
        return -EINVAL;
    *out = (int)v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return -EINVAL;
    *out = v;
    return 0;
}

int config_set(model_config_t *cfg, const char *key, const char *value, char *err, size_t errlen)
{
    static const struct {
        const char *key;
        size_t off;
        int is_int;
    } keys[] = {
#define K(f, i) {#f, offsetof(model_config_t, f), i}
        K(dim, 1), K(n_layers, 1), K(n_heads, 1), K(n_kv_heads, 1), K(vocab_size, 1),
        K(multiple_of, 1), K(ffn_dim_multiplier, 0), K(norm_eps, 0), K(rope_theta, 0),
        K(max_seq_len, 1), K(hidden_dim, 1), K(rope_scaling_factor, 0), K(rope_low_freq_factor, 0),
        K(rope_high_freq_factor, 0), K(rope_original_max_seq_len, 1),
#undef K
    };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (strcmp(key, keys[i].key))
            continue;
        char *field = (char *)cfg + keys[i].off;
        int rc = keys[i].is_int ? parse_int(value, (int *)field) : parse_double(value, (double *)field);
        if (rc)
            snprintf(err, errlen, "model.%s: expected %s, got '%s'", key,
                     keys[i].is_int ? "an integer" : "a number", value);
        return rc;
    }
    snprintf(err, errlen, "model.%s: unknown key", key);
    return -EINVAL;
}

int config_validate(model_config_t *c, char *err, size_t errlen)
{
#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -EINVAL; } while (0)
    if (c->dim <= 0) FAIL("model.dim must be > 0 (got %d)", c->dim);
    if (c->n_layers <= 0 || c->n_layers > CONFIG_MAX_LAYERS)
        FAIL("model.n_layers must be between 1 and %d (got %d)", CONFIG_MAX_LAYERS, c->n_layers);
    if (c->n_heads <= 0) FAIL("model.n_heads must be > 0 (got %d)", c->n_heads);
    if (c->n_kv_heads == 0)
        c->n_kv_heads = c->n_heads;
    if (c->n_kv_heads < 0 || c->n_kv_heads > c->n_heads)
        FAIL("model.n_kv_heads (%d) must be between 1 and model.n_heads (%d)", c->n_kv_heads,
             c->n_heads);
    if (c->dim % c->n_heads)
        FAIL("model.dim (%d) is not divisible by model.n_heads (%d)", c->dim, c->n_heads);
    if (c->n_heads % c->n_kv_heads)
        FAIL("model.n_heads (%d) is not divisible by model.n_kv_heads (%d)", c->n_heads,
             c->n_kv_heads);
    if ((c->dim / c->n_heads) % 2)
        FAIL("head dim model.dim/model.n_heads (%d) must be even for rotary embedding",
             c->dim / c->n_heads);
    if (c->vocab_size < 2) FAIL("model.vocab_size must be >= 2 (got %d)", c->vocab_size);
    if (c->multiple_of <= 0) FAIL("model.multiple_of must be > 0 (got %d)", c->multiple_of);
    if (c->ffn_dim_multiplier < 0)
        FAIL("model.ffn_dim_multiplier must be >= 0 (got %g)", c->ffn_dim_multiplier);
    if (!(c->norm_eps > 0)) FAIL("model.norm_eps must be > 0 (got %g)", c->norm_eps);
    if (!(c->rope_theta > 0)) FAIL("model.rope_theta must be > 0 (got %g)", c->rope_theta);
    if (c->max_seq_len <= 0) FAIL("model.max_seq_len must be > 0 (got %d)", c->max_seq_len);
    if (c->hidden_dim < 0) FAIL("model.hidden_dim must be >= 0 (0: from dim and multiple_of; got %d)", c->hidden_dim);
    if (c->rope_scaling_factor < 0 || c->rope_scaling_factor != c->rope_scaling_factor)
        FAIL("model.rope_scaling_factor must be >= 0 (0: no scaling; got %g)", c->rope_scaling_factor);
    if (c->rope_scaling_factor > 0 &&
        !(c->rope_low_freq_factor > 0 && c->rope_high_freq_factor > c->rope_low_freq_factor &&
          c->rope_original_max_seq_len > 0))
        FAIL("model.rope_scaling_factor %g needs model.rope_low_freq_factor > 0, model.rope_high_freq_factor above "
             "it and model.rope_original_max_seq_len > 0 (got %g, %g, %d)", c->rope_scaling_factor,
             c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_original_max_seq_len);
    long long hidden = config_ffn_hidden(c);
    if (hidden <= 0 || hidden > (1 << 24))
        FAIL("model FFN hidden size %lld (hidden_dim, or from dim, ffn_dim_multiplier, multiple_of) is out of range",
             hidden);
    if (c->ac_mode < CONFIG_AC_NONE || c->ac_mode > CONFIG_AC_SELECTIVE)
        FAIL("activation_checkpoint.mode: %d is not none (0), full (1) or selective (2)", c->ac_mode);
    if (c->ac_every < 0)
        FAIL("activation_checkpoint.selective_ac_option must be >= 1 or \"op\" (got %d)", c->ac_every);
#undef FAIL
    return 0;
}

const char *config_diff(const model_config_t *a, const model_config_t *b, double *va, double *vb)
{
    const struct {
        const char *key;
        double a, b;
    } keys[] = {{"dim", a->dim, b->dim},
                {"n_layers", a->n_layers, b->n_layers},
                {"n_heads", a->n_heads, b->n_heads},
                {"n_kv_heads", a->n_kv_heads, b->n_kv_heads},
                {"vocab_size", a->vocab_size, b->vocab_size},
                {"multiple_of", a->multiple_of, b->multiple_of},
                {"ffn_dim_multiplier", a->ffn_dim_multiplier, b->ffn_dim_multiplier},
                {"norm_eps", a->norm_eps, b->norm_eps},
                {"rope_theta", a->rope_theta, b->rope_theta},
                {"hidden_dim", config_ffn_hidden(a), config_ffn_hidden(b)},
                {"rope_scaling_factor", a->rope_scaling_factor, b->rope_scaling_factor},
                {"rope_low_freq_factor", a->rope_low_freq_factor, b->rope_low_freq_factor},
                {"rope_high_freq_factor", a->rope_high_freq_factor, b->rope_high_freq_factor},
                {"rope_original_max_seq_len", a->rope_original_max_seq_len, b->rope_original_max_seq_len}};
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
        if (keys[k].a != keys[k].b) {
            *va = keys[k].a;
            *vb = keys[k].b;
            return keys[k].key;
        }
    return NULL;
}

int config_head_dim(const model_config_t *c) { return c->dim / c->n_heads; }

static const char *const attn_names[] = {"auto", "cudnn", "ctitan"};

int config_attn_parse(const char *name, int *attn)
{
    for (int i = 0; i < (int)(sizeof(attn_names) / sizeof(attn_names[0])); i++)
        if (!strcmp(name, attn_names[i])) {
            *attn = i;
            return 0;
        }
    return -1;
}

static const char *const ac_names[] = {"none", "full", "selective"};

const char *config_ac_mode_name(int mode)
{
    return mode >= 0 && mode < (int)(sizeof(ac_names) / sizeof(ac_names[0])) ? ac_names[mode] : "?";
}

int config_ac_mode_parse(const char *name, int *mode)
{
    for (int i = 0; i < (int)(sizeof(ac_names) / sizeof(ac_names[0])); i++)
        if (!strcmp(name, ac_names[i])) {
            *mode = i;
            return 0;
        }
    return -EINVAL;
}

config_keep_t config_ac_keep(const model_config_t *c, int layer)
{
    if (c->ac_mode == CONFIG_AC_FULL)
        return CONFIG_KEEP_INPUT;
    if (c->ac_mode != CONFIG_AC_SELECTIVE)
        return CONFIG_KEEP_ALL;
    if (c->ac_every <= 0)
        return CONFIG_KEEP_OPS;
    return (layer + 1) % c->ac_every == 0 ? CONFIG_KEEP_INPUT : CONFIG_KEEP_ALL;
}

double config_rope_inv_freq(const model_config_t *c, int i)
{
    int hd = config_head_dim(c);
    double f = pow(c->rope_theta, -2.0 * i / hd);
    if (!(c->rope_scaling_factor > 0))
        return f;
    /* Hugging Face's _compute_llama3_parameters: long wavelengths slowed by the factor, short
     * ones kept, those between blended */
    double old = c->rope_original_max_seq_len, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
    double wavelen = 2 * M_PI / f;
    if (wavelen < old / hi)
        return f;
    if (wavelen > old / lo)
        return f / c->rope_scaling_factor;
    double smooth = (old / wavelen - lo) / (hi - lo);
    return (1 - smooth) * f / c->rope_scaling_factor + smooth * f;
}

int config_ffn_hidden(const model_config_t *c)
{
    if (c->hidden_dim > 0)
        return c->hidden_dim;
    long long h = 4LL * c->dim;
    h = 2 * h / 3;
    if (c->ffn_dim_multiplier > 0)
        h = (long long)(c->ffn_dim_multiplier * (double)h);
    long long m = c->multiple_of;
    h = m * ((h + m - 1) / m);
    return h > (1 << 30) ? -1 : (int)h;
}

double config_flops_per_token(const model_config_t *cfg, int T)
{
    double D = cfg->dim, hd = config_head_dim(cfg), F = config_ffn_hidden(cfg);
    double per_layer = D * cfg->n_heads * hd * 2 + D * cfg->n_kv_heads * hd * 2 + 3 * D * F;
    double matmul_params = cfg->n_layers * per_layer + (double)cfg->vocab_size * D;
    return 6 * matmul_params + 12.0 * cfg->n_layers * D * T;
}
