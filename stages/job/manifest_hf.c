/* The model's shape from a Hugging Face config.json (manifest_take_model, manifest.h): what the
 * weights to be loaded fix wins over the flavor's preset; an explicit key that disagrees is an
 * error naming both. */
#include "stages/job/manifest.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"
#include "stages/job/manifest_keys.h"

static double field(const mkey_t *K, const void *base)
{
    const char *p = (const char *)base + K->off - offsetof(manifest_t, model);
    if (K->type == MKEY_INT) {
        int v;
        memcpy(&v, p, sizeof(v));
        return v;
    }
    double v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* The shortest %g that reads back as v. */
static const char *num(char *buf, size_t n, double v)
{
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

int manifest_take_model(manifest_t *m, const model_config_t *src, const char *what, char *err, size_t errlen)
{
    model_config_t out = m->model;
    for (int k = 0; k < mkey_count; k++) {
        const mkey_t *K = &mkey_table[k];
        if (!K->model || !strcmp(K->key, "multiple_of") || !strcmp(K->key, "ffn_dim_multiplier"))
            continue;
        int expl = mkey_explicit(m, k);
        if (!strcmp(K->key, "max_seq_len") && expl)
            continue;
        double mine = field(K, &m->model), theirs = field(K, src);
        if (!strcmp(K->key, "n_kv_heads") && mine == 0)
            mine = m->model.n_heads; /* 0: as many as the heads */
        if (expl && mine != theirs) {
            char where[128], a[32], b[32];
            return util_fail(err, errlen, -EINVAL, "model.%s = %s (%s) but %s has %s: the model's shape comes "
                             "from the weights loaded (leave model.%s out)", K->key, num(a, sizeof(a), mine),
                             mkey_origin(m, k, where, sizeof(where)), what, num(b, sizeof(b), theirs), K->key);
        }
        memcpy((char *)&out + K->off - offsetof(manifest_t, model),
               (const char *)src + K->off - offsetof(manifest_t, model), K->size);
    }
    m->model = out;
    return 0;
}
