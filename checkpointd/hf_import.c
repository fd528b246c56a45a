/* Hugging Face Llama -> ctitan training state of step 0 (hf_import.h): config.json against the
 * run's model, every safetensors tensor checked against the parameter table, then the master
 * weights tensor by tensor in flat order and the optimizer's arrays as zeros: through the
 * checkpoint writer (a checkpoint on disk), or straight into a job's staging arrays. */
#include "checkpointd/hf_import.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/hf_config.h"
#include "checkpointd/st_read.h"
#include "checkpointd/writer.h"
#include "ipc/util.h"
#include "kernels/optim.h"

#define HF_ZEROS (1u << 20)

int hf_import_manifest(manifest_t *m, const char *hf_dir, char *err, size_t errlen)
{
    hf_config_t h;
    char what[PATH_MAX + 16];
    snprintf(what, sizeof(what), "%s/config.json", hf_dir);
    int rc = hf_config_load(hf_dir, &h, err, errlen);
    if (!rc)
        rc = manifest_take_model(m, &h.model, what, err, errlen);
    return rc;
}

static int ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && !strcmp(s + a - b, tail);
}

/* The HF tensor parameter p comes from: its own, or the embedding for a tied lm_head. */
static const st_tensor_t *source(const st_set_t *s, const param_info_t *p, int tied)
{
    const st_tensor_t *t = st_set_find(s, p->name);
    if (!t && tied && p->kind == PARAM_OUTPUT)
        t = st_set_find(s, "model.embed_tokens.weight");
    return t;
}

/* Every parameter there with its shape and an importable dtype; no tensor left over. */
static int check_tensors(const st_set_t *s, const param_table_t *tab, int tied, const char *dir, FILE *log,
                         char *err, size_t errlen)
{
    char a[64], b[64];
    for (int i = 0; i < tab->n; i++) {
        const param_info_t *p = &tab->t[i];
        const st_tensor_t *t = source(s, p, tied);
        if (!t)
            return util_fail(err, errlen, -ENOENT, "%s: tensor %s is missing%s", dir, p->name,
                             p->kind == PARAM_OUTPUT ? " (and config.json's tie_word_embeddings is false)" : "");
        if (strcmp(t->dtype, "F32") && strcmp(t->dtype, "BF16") && strcmp(t->dtype, "F16"))
            return util_fail(err, errlen, -ENOTSUP, "%s: tensor %s: dtype %s: ctitan imports F32, BF16 and F16",
                             s->files[t->file], t->name, t->dtype);
        int same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = t->shape[d] == p->shape[d];
        if (!same)
            return util_fail(err, errlen, -EINVAL, "%s: tensor %s has shape %s; the model of config.json needs %s",
                             s->files[t->file], t->name, ckpt_shape_str(t->ndim, t->shape, a, sizeof(a)),
                             ckpt_shape_str(p->ndim, p->shape, b, sizeof(b)));
    }
    for (int i = 0; i < s->n; i++) {
        int known = 0;
        for (int j = 0; j < tab->n && !known; j++)
            known = !strcmp(tab->t[j].name, s->t[i].name);
        if (known)
            continue;
        if (!ends_with(s->t[i].name, "rotary_emb.inv_freq"))
            return util_fail(err, errlen, -EINVAL, "%s: unexpected tensor %s: not a weight of the Llama config.json "
                             "describes", s->files[s->t[i].file], s->t[i].name);
        if (log)
            fprintf(log, "ctitan: import: skipping %s (ctitan computes the rotary frequencies from config.json)\n",
                    s->t[i].name);
    }
    if (tied && log)
        fprintf(log, "ctitan: import: %s has tied embeddings (tie_word_embeddings); imported untied: lm_head.weight "
                "starts as a copy of model.embed_tokens.weight, and the two train apart\n", dir);
    return 0;
}

/* A long read's line on log, when one is due: how many parameters of the folder are read. */
static void say_read(FILE *log, const char *dir, size_t done, size_t total, util_every_t *every)
{
    double secs = log ? util_every_due(every) : -1;
    if (secs >= 0) {
        fprintf(log, "ctitan: import: reading %s: %zu of %zu M parameters (%.0f s)\n", dir, done / 1000000,
                total / 1000000, secs);
        fflush(log);
    }
}

/* n zero bytes into file f at *off. */
static int write_zeros(ckw_t *w, uint32_t f, uint64_t *off, uint64_t n, const void *zeros, char *err, size_t errlen)
{
    while (n) {
        size_t k = n < HF_ZEROS ? (size_t)n : HF_ZEROS;
        int rc = ckw_write(w, f, *off, zeros, k, err, errlen);
        if (rc)
            return rc;
        *off += k, n -= k;
    }
    return 0;
}

/* The master weights (file 0), tensor by tensor in flat order, then the state arrays; a long
 * read of hf_dir said on log. */
static int write_arrays(ckw_t *w, const st_set_t *s, const param_table_t *tab, const optim_t *o, int tied,
                        float *buf, const void *zeros, const char *hf_dir, FILE *log, char *err, size_t errlen)
{
    util_every_t every;
    util_every_start(&every, util_say_s());
    static uint8_t block[CKPT_DATA_HDR];
    uint64_t end = CKPT_DATA_HDR + (uint64_t)tab->total * sizeof(float);
    for (int a = 0; a < optim_arrays(o); a++) {
        uint64_t off = 0;
        ckpt_data_header(block, (uint32_t)a, 0);
        int rc = ckw_write(w, (uint32_t)a, 0, block, sizeof(block), err, errlen);
        off = CKPT_DATA_HDR;
        for (int i = 0; i < tab->n && a == 0 && !rc; i++) {
            const param_info_t *p = &tab->t[i];
            uint64_t at = CKPT_DATA_HDR + (uint64_t)p->offset * sizeof(float);
            if (!(rc = write_zeros(w, 0, &off, at - off, zeros, err, errlen)) &&
                !(rc = st_set_read_f32(s, source(s, p, tied), buf, err, errlen)))
                rc = ckw_write(w, 0, off, buf, p->numel * sizeof(float), err, errlen);
            off += p->numel * sizeof(float);
            if (!rc)
                say_read(log, hf_dir, p->offset + p->numel, tab->total, &every);
        }
        if (!rc)
            rc = write_zeros(w, (uint32_t)a, &off, end - off, zeros, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

static int write_ckpt(const st_set_t *s, const param_table_t *tab, const manifest_t *m, int tied, const char *folder,
                      char *path, size_t pathlen, const char *hf_dir, FILE *log, char *err, size_t errlen)
{
    const optim_t *o = optim_find(m->optimizer_name);
    if (!o)
        return util_fail(err, errlen, -EINVAL, "optimizer.name = \"%s\": no such optimizer", m->optimizer_name);
    size_t most = 1;
    for (int i = 0; i < tab->n; i++)
        most = tab->t[i].numel > most ? tab->t[i].numel : most;
    char *toml = manifest_to_toml(m);
    float *buf = malloc(most * sizeof(float));
    void *zeros = calloc(1, HF_ZEROS);
    ckpt_index_t plan = {0};
    ckw_t *w = NULL;
    int rc = 0;
    if (!toml || !buf || !zeros)
        rc = util_fail(err, errlen, -ENOMEM, "out of memory");
    else if ((rc = ckpt_index_plan(&plan, tab, o, 0, toml, NULL, 0)))
        util_fail(err, errlen, rc, "cannot plan the checkpoint (%s)", strerror(-rc));
    else if (!(rc = ckw_begin(&w, folder, &plan, err, errlen))) {
        rc = write_arrays(w, s, tab, o, tied, buf, zeros, hf_dir, log, err, errlen);
        if (rc)
            ckw_abort(&w);
        else
            rc = ckw_commit(&w, path, pathlen, NULL, err, errlen);
    }
    ckpt_index_free(&plan);
    free(toml);
    free(buf);
    free(zeros);
    return rc;
}

/* HF_DIR opened and checked: config.json's model against run's (NULL: config.json's own is
 * the model, in *cfg), the parameter table of that model in *tab, every tensor checked against
 * it (check_tensors) in the open set *s, tied embeddings in *tied. On failure nothing is left
 * open. */
static int open_checked(const char *hf_dir, const model_config_t *run, model_config_t *cfg, param_table_t *tab,
                        st_set_t *s, int *tied, FILE *log, char *err, size_t errlen)
{
    hf_config_t h;
    int rc = hf_config_load(hf_dir, &h, err, errlen);
    if (rc)
        return rc;
    if (run) {
        double was, is;
        /* config.json has no multiple_of nor ffn_dim_multiplier: its intermediate_size
         * (hidden_dim) makes them moot, so the run's stay */
        h.model.multiple_of = run->multiple_of, h.model.ffn_dim_multiplier = run->ffn_dim_multiplier;
        const char *key = config_diff(&h.model, run, &was, &is);
        if (key)
            return util_fail(err, errlen, -EINVAL, "%s/config.json gives model.%s = %g, the run's manifest %g", hf_dir,
                             key, was, is);
    }
    if (params_table_init(tab, &h.model))
        return util_fail(err, errlen, -ENOMEM, "out of memory for the parameter table");
    if (!(rc = st_set_open(s, hf_dir, err, errlen)) && (rc = check_tensors(s, tab, h.tied, hf_dir, log, err, errlen)))
        st_set_close(s);
    if (rc) {
        params_table_free(tab);
        return rc;
    }
    *cfg = h.model;
    *tied = h.tied;
    return 0;
}

int hf_import(const char *hf_dir, const manifest_t *m, const char *folder, FILE *log, char *path, size_t pathlen,
              char *err, size_t errlen)
{
    model_config_t cfg;
    param_table_t tab = {0};
    st_set_t s;
    int tied, rc = open_checked(hf_dir, &m->model, &cfg, &tab, &s, &tied, log, err, errlen);
    if (rc)
        return rc;
    rc = write_ckpt(&s, &tab, m, tied, folder, path, pathlen, hf_dir, log, err, errlen);
    st_set_close(&s);
    params_table_free(&tab);
    return rc;
}

int hf_load_state(const char *hf_dir, const manifest_t *m, float *const *arrays, int n_arrays, FILE *log,
                  char *err, size_t errlen)
{
    model_config_t cfg;
    param_table_t tab = {0};
    st_set_t s;
    int tied, rc = open_checked(hf_dir, &m->model, &cfg, &tab, &s, &tied, log, err, errlen);
    if (rc)
        return rc;
    size_t off = 0;
    util_every_t every;
    util_every_start(&every, util_say_s());
    for (int i = 0; i < tab.n && !rc; i++) { /* flat order: the gaps before each tensor zeroed */
        const param_info_t *p = &tab.t[i];
        memset(arrays[0] + off, 0, (p->offset - off) * sizeof(float));
        rc = st_set_read_f32(&s, source(&s, p, tied), arrays[0] + p->offset, err, errlen);
        off = p->offset + p->numel;
        if (!rc)
            say_read(log, hf_dir, off, tab.total, &every);
    }
    if (!rc)
        memset(arrays[0] + off, 0, (tab.total - off) * sizeof(float));
    for (int a = 1; a < n_arrays && !rc; a++)
        memset(arrays[a], 0, tab.total * sizeof(float));
    st_set_close(&s);
    params_table_free(&tab);
    return rc;
}

int hf_read_weights(const char *hf_dir, model_config_t *cfg, float **w, size_t *n, FILE *log, char *err,
                    size_t errlen)
{
    param_table_t tab = {0};
    st_set_t s;
    int tied, rc = open_checked(hf_dir, NULL, cfg, &tab, &s, &tied, log, err, errlen);
    *w = NULL;
    *n = 0;
    if (rc)
        return rc;
    if (!(*w = malloc(tab.total * sizeof(float))))
        rc = util_fail(err, errlen, -ENOMEM, "out of memory for %zu weights", tab.total);
    for (int i = 0; i < tab.n && !rc; i++)
        rc = st_set_read_f32(&s, source(&s, &tab.t[i], tied), *w + tab.t[i].offset, err, errlen);
    st_set_close(&s);
    if (rc) {
        free(*w);
        *w = NULL;
    } else {
        *n = tab.total;
    }
    params_table_free(&tab);
    return rc;
}
