/* Loading weights for inference (see gen_load.h). */
#include "checkpointd/gen_load.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/hf_import.h"
#include "ipc/util.h"
#include "kernels/params.h"
#include "stages/job/manifest.h"

/* The model shape and tokenizer of the manifest inside checkpoint c. */
static int read_manifest(ckpt_t *c, gen_model_t *out, char *err, size_t errlen)
{
    const ckpt_index_t *ix = ckpt_index(c);
    const char *path = ckpt_path(c);
    if (!ix->manifest || !ix->manifest[0])
        return util_fail(err, errlen, -EINVAL, "checkpoint %s holds no manifest: the model's shape is unknown", path);
    manifest_t *m = malloc(sizeof(*m));
    if (!m)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    char why[512];
    int rc = 0;
    manifest_defaults(m);
    if (manifest_parse(m, ix->manifest, strlen(ix->manifest), path, why, sizeof(why)))
        rc = util_fail(err, errlen, -EINVAL, "the manifest inside checkpoint %s does not parse: %s", path, why);
    else if (config_validate(&m->model, why, sizeof(why)))
        rc = util_fail(err, errlen, -EINVAL, "the model of checkpoint %s's manifest is not valid: %s", path, why);
    if (!rc) {
        out->cfg = m->model;
        snprintf(out->tokenizer_path, sizeof(out->tokenizer_path), "%s", m->tokenizer_path);
    }
    free(m);
    return rc;
}

/* Every weight of the model, by its name, into out->w. */
static int read_weights(ckpt_t *c, gen_model_t *out, char *err, size_t errlen)
{
    param_table_t tab;
    if (params_table_init(&tab, &out->cfg))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    int rc = 0;
    out->n = tab.total;
    if (!(out->w = malloc(tab.total * sizeof(float))))
        rc = util_fail(err, errlen, -ENOMEM, "out of memory for %zu weights", tab.total);
    for (int t = 0; t < tab.n && !rc; t++) {
        const param_info_t *p = &tab.t[t];
        char buf[CKPT_NAME_MAX + 32];
        const char *name = ckpt_master_name(c, p->name, buf, sizeof(buf));
        const ckpt_tensor_t *ct = ckpt_index_find(ckpt_index(c), name);
        if (!ct)
            rc = util_fail(err, errlen, -ENOENT, "checkpoint %s has no tensor %s", ckpt_path(c), name);
        else if (strcmp(ct->dtype, "F32") || ct->numel != p->numel)
            rc = util_fail(err, errlen, -EINVAL, "checkpoint %s: tensor %s is %s with %llu elements; the model of "
                           "its manifest needs F32 with %zu", ckpt_path(c), name, ct->dtype,
                           (unsigned long long)ct->numel, p->numel);
        else
            rc = ckpt_read(c, name, 0, p->numel, out->w + p->offset, err, errlen);
    }
    params_table_free(&tab);
    return rc;
}

static int exists_in(const char *dir, const char *name)
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* Checkpoint dir's model and weights into out, each chunk's checksum checked as it is read.
 * *corrupt: what failed was the data (a chunk's checksum, a file cut short), not the model. */
static int load_dir(const char *dir, gen_model_t *out, int *corrupt, char *err, size_t errlen)
{
    ckpt_t *c = NULL;
    *corrupt = 0;
    int rc = ckpt_open(&c, dir, err, errlen);
    if (!rc && !(rc = read_manifest(c, out, err, errlen))) {
        rc = read_weights(c, out, err, errlen);
        *corrupt = rc == -EBADMSG;
    }
    ckpt_close(&c);
    if (rc)
        gen_model_free(out);
    return rc;
}

/* A checkpoint of a folder (ckpt_find_loading, which checks its files first and passes over
 * one whose weights prove damaged): its weights read once, not every array verified first. */
static int folder_load(void *arg, const char *path, int *corrupt, char *err, size_t errlen)
{
    return load_dir(path, arg, corrupt, err, errlen);
}

/* The checkpoint at path when it holds an index, else the newest of the folder path that loads. */
static int load_checkpoint(const char *path, gen_model_t *out, char *err, size_t errlen)
{
    if (exists_in(path, "index")) {
        int corrupt;
        if (snprintf(out->source, sizeof(out->source), "%s", path) >= (int)sizeof(out->source))
            return util_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", path);
        return load_dir(path, out, &corrupt, err, errlen);
    }
    int rc = ckpt_find_loading(path, folder_load, out, out->source, sizeof(out->source), stderr, err, errlen);
    if (rc == -ENOENT)
        return util_fail(err, errlen, rc, "%s is neither a checkpoint (no index), a folder of checkpoints nor a "
                         "Hugging Face folder (no config.json)", path);
    return rc;
}

/* A Hugging Face folder: its config.json and weights (hf_read_weights), its tokenizer.json. */
static int load_hf(const char *path, gen_model_t *out, char *err, size_t errlen)
{
    if (snprintf(out->source, sizeof(out->source), "%s", path) >= (int)sizeof(out->source))
        return util_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", path);
    int rc = hf_read_weights(path, &out->cfg, &out->w, &out->n, stderr, err, errlen);
    if (!rc && (rc = hf_eos_ids(path, out->cfg.vocab_size, out->eos, &out->n_eos, err, errlen)))
        gen_model_free(out);
    if (!rc && exists_in(path, "tokenizer.json"))
        snprintf(out->tokenizer_path, sizeof(out->tokenizer_path), "%s/tokenizer.json", path);
    return rc;
}

int gen_load_weights(const char *path, gen_model_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    struct stat st;
    if (stat(path, &st))
        return util_fail(err, errlen, -errno, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return util_fail(err, errlen, -ENOTDIR, "%s is not a directory: give a checkpoint (step-N) or a Hugging "
                         "Face folder", path);
    if (exists_in(path, "config.json"))
        return load_hf(path, out, err, errlen);
    return load_checkpoint(path, out, err, errlen);
}

void gen_model_free(gen_model_t *m)
{
    free(m->w);
    m->w = NULL;
    m->n = 0;
}
