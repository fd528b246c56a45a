/* Checkpoint -> Hugging Face model folder (see hf_export.h). The model's shape comes from the
 * manifest inside the checkpoint; the weights stream tensor by tensor, chunk by chunk, from the
 * checkpoint into safetensors shards inside a temporary folder that is renamed into place. */
#include "checkpointd/hf_export.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"
#include "ipc/util.h"
#include "kernels/bf16.h"
#include "kernels/params.h"
#include "stages/job/manifest.h"

/* ---- config.json ---- */

static json_t *id_or_null(int id) { return id >= 0 ? json_integer(id) : json_null(); }

static json_t *rope_scaling_json(const model_config_t *cfg)
{
    if (cfg->rope_scaling_factor <= 0)
        return json_null();
    return json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", cfg->rope_scaling_factor,
                     "low_freq_factor", cfg->rope_low_freq_factor, "high_freq_factor", cfg->rope_high_freq_factor,
                     "original_max_position_embeddings", cfg->rope_original_max_seq_len);
}

json_t *hf_config_json(const model_config_t *cfg, const char *torch_dtype, int bos_id, int eos_id)
{
    json_t *c = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:f, s:o, s:i, s:i, s:b, s:b, "
                          "s:b, s:s, s:o, s:o, s:f, s:f, s:i, s:b}",
                          "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size", cfg->dim,
                          "intermediate_size", config_ffn_hidden(cfg), "num_hidden_layers", cfg->n_layers,
                          "num_attention_heads", cfg->n_heads, "num_key_value_heads", cfg->n_kv_heads, "head_dim",
                          config_head_dim(cfg), "hidden_act", "silu", "rms_norm_eps", cfg->norm_eps, "rope_theta",
                          cfg->rope_theta, "rope_scaling", rope_scaling_json(cfg), "max_position_embeddings",
                          cfg->max_seq_len, "vocab_size", cfg->vocab_size, "tie_word_embeddings", 0,
                          "attention_bias", 0, "mlp_bias", 0, "torch_dtype", torch_dtype, "bos_token_id",
                          id_or_null(bos_id), "eos_token_id", id_or_null(eos_id), "attention_dropout", 0.0,
                          "initializer_range", 0.02, "pretraining_tp", 1, "use_cache", 1);
    return c;
}

int hf_config_write(const model_config_t *cfg, const char *torch_dtype, int bos_id, int eos_id, const char *path,
                    char *err, size_t errlen)
{
    json_t *j = hf_config_json(cfg, torch_dtype, bos_id, eos_id);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (!text)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    util_afile_t af = {.fd = -1};
    int rc = util_afile_begin(&af, path, err, errlen);
    if (!rc && !(rc = util_afile_write(&af, text, strlen(text), err, errlen)) &&
        !(rc = util_afile_write(&af, "\n", 1, err, errlen)))
        rc = util_afile_commit(&af, err, errlen);
    else if (af.tmp)
        util_afile_abort(&af);
    free(text);
    return rc;
}

/* ---- files in the temporary folder ---- */

static int open_new(const char *dir, const char *name, char *err, size_t errlen)
{
    char p[PATH_MAX];
    if ((size_t)snprintf(p, sizeof(p), "%s/%s", dir, name) >= sizeof(p))
        return util_fail(err, errlen, -ENAMETOOLONG, "%s/%s: path too long", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return util_fail(err, errlen, -errno, "%s: cannot create: %s", p, strerror(errno));
    return fd;
}

/* fsync and close; the error names dir/name */
static int close_synced(int fd, const char *dir, const char *name, char *err, size_t errlen)
{
    int rc = fsync(fd) ? -errno : 0;
    if (close(fd) && !rc)
        rc = -errno;
    return rc ? util_fail(err, errlen, rc, "%s/%s: cannot sync: %s", dir, name, strerror(-rc)) : 0;
}

int hf_put_file(const char *dir, const char *name, const void *buf, size_t len, char *err, size_t errlen)
{
    int fd = open_new(dir, name, err, errlen);
    if (fd < 0)
        return fd;
    int rc = util_write_all(fd, buf, len);
    if (rc) {
        close(fd);
        return util_fail(err, errlen, rc, "%s/%s: cannot write: %s", dir, name, strerror(-rc));
    }
    return close_synced(fd, dir, name, err, errlen);
}

int hf_put_json(const char *dir, const char *name, const json_t *json, size_t flags, char *err, size_t errlen)
{
    char *text = json_dumps(json, flags ? flags : JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text)
        return util_fail(err, errlen, -ENOMEM, "%s/%s: out of memory", dir, name);
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return util_fail(err, errlen, -ENOMEM, "%s/%s: out of memory", dir, name);
    }
    t2[n] = '\n';
    int rc = hf_put_file(dir, name, t2, n + 1, err, errlen);
    free(t2);
    return rc;
}

/* ---- weights ---- */

typedef struct {
    const param_info_t *p;
    char src[CKPT_NAME_MAX + 32]; /* the checkpoint's tensor: the fp32 master copy */
    uint64_t bytes;               /* in the output dtype */
    int shard;
} hf_tensor_t;

/* Shards as huggingface_hub's split_torch_state_dict_into_shards makes them: tensors in order
 * fill a shard until the next would take it past max, which then starts a new one; a tensor
 * larger than max goes alone into a shard of its own, listed before the one being filled.
 * Returns the number of shards. */
static int plan_shards(hf_tensor_t *t, int n, uint64_t max)
{
    int next = 0, pending = 0; /* tensors [pending, i) without a shard are the current one's */
    uint64_t cur = 0;
    for (int i = 0; i < n; i++) {
        t[i].shard = -1;
        if (t[i].bytes > max) {
            t[i].shard = next++;
            continue;
        }
        if (cur + t[i].bytes > max) {
            for (int k = pending; k < i; k++)
                if (t[k].shard < 0)
                    t[k].shard = next;
            next++;
            pending = i;
            cur = 0;
        }
        cur += t[i].bytes;
    }
    int any = 0;
    for (int k = pending; k < n; k++)
        if (t[k].shard < 0)
            t[k].shard = next, any = 1;
    return next + any;
}

static void shard_name(char *buf, size_t n, int k, int n_shards)
{
    if (n_shards == 1)
        snprintf(buf, n, "model.safetensors");
    else
        snprintf(buf, n, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
}

/* The safetensors header of shard k, padded with spaces to a multiple of 8. */
static char *shard_header(const hf_tensor_t *t, int n, int k, int bf16, size_t *len)
{
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (t[i].shard != k)
            continue;
        json_t *shape = json_array();
        for (int d = 0; d < t[i].p->ndim; d++)
            json_array_append_new(shape, json_integer(t[i].p->shape[d]));
        json_object_set_new(h, t[i].p->name, json_pack("{s:s, s:o, s:[I,I]}", "dtype", bf16 ? "BF16" : "F32",
                                                       "shape", shape, "data_offsets", (json_int_t)off,
                                                       (json_int_t)(off + t[i].bytes)));
        off += t[i].bytes;
    }
    char *s = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!s)
        return NULL;
    size_t l = strlen(s), pad = (8 - l % 8) % 8;
    char *p = realloc(s, l + pad + 1);
    if (!p) {
        free(s);
        return NULL;
    }
    memset(p + l, ' ', pad);
    p[l + pad] = 0;
    *len = l + pad;
    return p;
}

/* How far a long export is, said on log (util_say_s): the weights read of the checkpoint. */
typedef struct {
    FILE *log;
    util_every_t every;
    double done, total; /* bytes */
} say_t;

static void said(say_t *y, uint64_t bytes)
{
    y->done += (double)bytes;
    double secs = y->log ? util_every_due(&y->every) : -1;
    if (secs >= 0) {
        fprintf(y->log, "ctitan: export: %.1f of %.1f GiB of weights written (%.0f s)\n", y->done / (1 << 30),
                y->total / (1 << 30), secs);
        fflush(y->log);
    }
}

/* Streams tensor t from the checkpoint to fd, chunk by chunk. */
static int write_tensor(ckpt_t *c, const hf_tensor_t *t, int bf16, int fd, float *buf, const char *what, say_t *y,
                        char *err, size_t errlen)
{
    const ckpt_tensor_t *ct = ckpt_index_find(ckpt_index(c), t->src);
    uint64_t first = 0;
    for (uint32_t j = 0; j < ct->n_chunks; j++) {
        uint64_t n = ct->chunks[j].length / 4;
        int rc = ckpt_read(c, t->src, first, n, buf, err, errlen);
        if (rc)
            return rc;
        if (bf16) { /* in place: bytes [2i, 2i+2) are written after [4i, 4i+4) are read */
            unsigned char *b = (unsigned char *)buf;
            for (uint64_t i = 0; i < n; i++) {
                float f;
                memcpy(&f, b + 4 * i, 4);
                uint16_t h = bf16_of(f);
                memcpy(b + 2 * i, &h, 2);
            }
        }
        if ((rc = util_write_all(fd, buf, n * (bf16 ? 2 : 4))))
            return util_fail(err, errlen, rc, "%s: cannot write: %s", what, strerror(-rc));
        first += n;
        said(y, n * 4);
    }
    return 0;
}

static int write_shard(ckpt_t *c, const hf_tensor_t *t, int n, int k, int n_shards, int bf16, const char *dir,
                       float *buf, say_t *y, char *err, size_t errlen)
{
    char name[64], what[PATH_MAX + 64];
    shard_name(name, sizeof(name), k, n_shards);
    snprintf(what, sizeof(what), "%s/%s", dir, name);
    size_t hlen = 0;
    char *hdr = shard_header(t, n, k, bf16, &hlen);
    if (!hdr)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", what);
    int fd = open_new(dir, name, err, errlen), rc = 0;
    if (fd < 0) {
        free(hdr);
        return fd;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    if ((rc = util_write_all(fd, len8, 8)) || (rc = util_write_all(fd, hdr, hlen)))
        util_fail(err, errlen, rc, "%s: cannot write: %s", what, strerror(-rc));
    for (int i = 0; i < n && !rc; i++)
        if (t[i].shard == k)
            rc = write_tensor(c, &t[i], bf16, fd, buf, what, y, err, errlen);
    free(hdr);
    if (rc) {
        close(fd);
        return rc;
    }
    return close_synced(fd, dir, name, err, errlen);
}

static int write_index(const hf_tensor_t *t, int n, int n_shards, const char *dir, char *err, size_t errlen)
{
    uint64_t total = 0;
    json_t *map = json_object();
    for (int i = 0; i < n; i++) {
        char name[64];
        shard_name(name, sizeof(name), t[i].shard, n_shards);
        json_object_set_new(map, t[i].p->name, json_string(name));
        total += t[i].bytes;
    }
    json_t *ix = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
    if (!ix)
        return util_fail(err, errlen, -ENOMEM, "%s: out of memory", dir);
    int rc = hf_put_json(dir, "model.safetensors.index.json", ix, 0, err, errlen);
    json_decref(ix);
    return rc;
}

/* Every parameter of tab, its fp32 master copy found in the checkpoint with the right shape. */
/* The parameters of tab in the order of LlamaForCausalLM's state_dict, which is the order
 * transformers shards them in: per layer the projections, then the norms. */
static int hf_order(const param_table_t *tab, int *order)
{
    static const param_kind_t layer[] = {PARAM_WQ, PARAM_WK, PARAM_WV, PARAM_WO, PARAM_W1,
                                         PARAM_W3, PARAM_W2, PARAM_ATTN_NORM, PARAM_FFN_NORM};
    int n = 0;
    order[n++] = params_find(tab, PARAM_EMBED, -1);
    for (int l = 0; l < tab->n_layers; l++)
        for (size_t k = 0; k < sizeof(layer) / sizeof(layer[0]); k++)
            order[n++] = params_find(tab, layer[k], l);
    order[n++] = params_find(tab, PARAM_NORM, -1);
    order[n++] = params_find(tab, PARAM_OUTPUT, -1);
    for (int i = 0; i < n; i++)
        if (order[i] < 0)
            return -EINVAL;
    return n == tab->n ? 0 : -EINVAL;
}

static int plan_tensors(ckpt_t *c, const param_table_t *tab, int bf16, hf_tensor_t *t, uint64_t *max_chunk,
                        char *err, size_t errlen)
{
    int *order = calloc((size_t)tab->n + 3 + 9 * (size_t)tab->n_layers, sizeof(int));
    if (!order)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if (hf_order(tab, order)) {
        free(order);
        return util_fail(err, errlen, -EINVAL, "checkpoint %s: the model's parameters are not a Llama's",
                         ckpt_path(c));
    }
    for (int k = 0; k < tab->n; k++) {
        int i = k;
        t[i].p = &tab->t[order[k]];
        char mbuf[sizeof(t[i].src)];
        snprintf(t[i].src, sizeof(t[i].src), "%s", ckpt_master_name(c, t[i].p->name, mbuf, sizeof(mbuf)));
        const ckpt_tensor_t *ct = ckpt_index_find(ckpt_index(c), t[i].src);
        int rc = 0;
        if (!ct)
            rc = util_fail(err, errlen, -EBADMSG, "checkpoint %s has no tensor %s", ckpt_path(c), t[i].src);
        else if (strcmp(ct->dtype, "F32") || ct->numel != t[i].p->numel)
            rc = util_fail(err, errlen, -EBADMSG, "checkpoint %s: tensor %s is %s with %llu elements; the model "
                           "of its manifest needs F32 with %zu", ckpt_path(c), t[i].src, ct->dtype,
                           (unsigned long long)ct->numel, t[i].p->numel);
        if (rc) {
            free(order);
            return rc;
        }
        for (uint32_t j = 0; j < ct->n_chunks; j++)
            if (ct->chunks[j].length > *max_chunk)
                *max_chunk = ct->chunks[j].length;
        t[i].bytes = (uint64_t)t[i].p->numel * (bf16 ? 2 : 4);
    }
    free(order);
    return 0;
}

static int write_weights(ckpt_t *c, const param_table_t *tab, const hf_export_opts_t *o, const char *dir, FILE *log,
                         char *err, size_t errlen)
{
    say_t y = {.log = log, .total = (double)tab->total * 4};
    util_every_start(&y.every, util_say_s());
    hf_tensor_t *t = calloc((size_t)tab->n, sizeof(*t));
    float *buf = NULL;
    uint64_t max_chunk = 4;
    int rc;
    if (!t)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if ((rc = plan_tensors(c, tab, o->bf16, t, &max_chunk, err, errlen)))
        goto out;
    if (!(buf = malloc(max_chunk))) {
        rc = util_fail(err, errlen, -ENOMEM, "out of memory for a %llu-byte chunk", (unsigned long long)max_chunk);
        goto out;
    }
    int n_shards = plan_shards(t, tab->n, o->max_shard_bytes ? o->max_shard_bytes : HF_DEFAULT_SHARD);
    for (int k = 0; k < n_shards && !rc; k++)
        rc = write_shard(c, t, tab->n, k, n_shards, o->bf16, dir, buf, &y, err, errlen);
    if (!rc && n_shards > 1)
        rc = write_index(t, tab->n, n_shards, dir, err, errlen);
out:
    free(buf);
    free(t);
    return rc;
}

/* ---- the folder ---- */

/* 0 when dir does not exist or is an empty folder; -EEXIST / -ENOTDIR naming it otherwise. */
static int check_target(const char *dir, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(dir, &st)) {
        if (errno == ENOENT)
            return 0;
        return util_fail(err, errlen, -errno, "%s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return util_fail(err, errlen, -EEXIST, "%s exists and is not a folder: not writing over it", dir);
    DIR *d = opendir(dir);
    if (!d)
        return util_fail(err, errlen, -errno, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n ? util_fail(err, errlen, -EEXIST, "%s exists and is not empty: not writing over it (remove it, or "
                         "name another folder)", dir) : 0;
}

/* The parent folder of dir and the temporary folder beside it. */
static int tmp_paths(const char *dir, char *parent, char *tmp, size_t n, char *err, size_t errlen)
{
    char a[PATH_MAX], b[PATH_MAX];
    if (strlen(dir) >= sizeof(a))
        return util_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);
    strcpy(a, dir);
    strcpy(b, dir);
    size_t l = strlen(a);
    while (l > 1 && a[l - 1] == '/')
        a[--l] = 0, b[l] = 0;
    const char *base = basename(a), *par = dirname(b);
    if (!strcmp(base, "/") || !strcmp(base, ".") || !strcmp(base, ".."))
        return util_fail(err, errlen, -EINVAL, "%s: name a new folder to export into", dir);
    if ((size_t)snprintf(parent, n, "%s", par) >= n ||
        (size_t)snprintf(tmp, n, "%s/.%s.tmp-hf.%ld", par, base, (long)getpid()) >= n)
        return util_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);
    return 0;
}

/* The model and tokenizer path from the manifest inside the checkpoint. */
static int ckpt_manifest(ckpt_t *c, manifest_t *m, char *err, size_t errlen)
{
    const char *text = ckpt_index(c)->manifest;
    if (!text || !text[0])
        return util_fail(err, errlen, -EINVAL, "checkpoint %s holds no manifest: the model's shape for config.json "
                         "is unknown", ckpt_path(c));
    char why[512];
    manifest_defaults(m);
    if (manifest_parse(m, text, strlen(text), ckpt_path(c), why, sizeof(why)))
        return util_fail(err, errlen, -EINVAL, "the manifest inside %s does not parse: %s", ckpt_path(c), why);
    return 0;
}

/* Everything but the rename, into the temporary folder tmp. */
static int fill_folder(ckpt_t *c, const manifest_t *m, const hf_export_opts_t *o, const char *tmp, FILE *log,
                       char *err, size_t errlen)
{
    int bos = -1, eos = -1, rc;
    const char *tok = o->tokenizer ? o->tokenizer : m->tokenizer_path;
    if (!o->no_tokenizer && !tok[0])
        return util_fail(err, errlen, -EINVAL, "checkpoint %s: its manifest names no model.tokenizer_path: "
                         "--tokenizer PATH names one (or --no-tokenizer exports the model alone)", ckpt_path(c));
    if (!o->no_tokenizer && !o->tokenizer && access(tok, R_OK))
        return util_fail(err, errlen, -errno, "the manifest's model.tokenizer_path %s: %s (run from the folder the "
                         "job ran in, or --tokenizer FILE names it; --no-tokenizer exports the model alone)", tok,
                         strerror(errno));
    if (!o->no_tokenizer && (rc = hf_tok_export(tok, tmp, &bos, &eos, log, err, errlen)))
        return rc;
    const char *dtype = o->bf16 ? "bfloat16" : "float32";
    json_t *cfg = hf_config_json(&m->model, dtype, bos, eos);
    json_t *gen = json_pack("{s:o, s:o, s:b}", "bos_token_id", id_or_null(bos), "eos_token_id", id_or_null(eos),
                            "do_sample", 0);
    if (!cfg || !gen)
        rc = util_fail(err, errlen, -ENOMEM, "out of memory");
    else if (!(rc = hf_put_json(tmp, "config.json", cfg, 0, err, errlen)))
        rc = hf_put_json(tmp, "generation_config.json", gen, 0, err, errlen);
    json_decref(cfg);
    json_decref(gen);
    if (rc)
        return rc;
    param_table_t tab = {0};
    if ((rc = params_table_init(&tab, &m->model)))
        return util_fail(err, errlen, rc, "out of memory");
    rc = write_weights(c, &tab, o, tmp, log, err, errlen);
    params_table_free(&tab);
    return rc;
}

int hf_export(const char *ckpt_path, const char *dir, const hf_export_opts_t *o, FILE *log, char *err,
              size_t errlen)
{
    char parent[PATH_MAX], tmp[PATH_MAX];
    int rc = check_target(dir, err, errlen);
    if (rc || (rc = tmp_paths(dir, parent, tmp, sizeof(parent), err, errlen)))
        return rc;
    manifest_t *m = malloc(sizeof(*m));
    ckpt_t *c = NULL;
    int made = 0;
    if (!m)
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    if ((rc = ckpt_open(&c, ckpt_path, err, errlen)) || (rc = ckpt_manifest(c, m, err, errlen)))
        goto out;
    ckpt_remove_dir(tmp); /* a leftover of an earlier process with our pid */
    if (mkdir(tmp, 0755)) {
        rc = util_fail(err, errlen, -errno, "cannot create the temporary folder %s beside %s: %s", tmp, dir,
                       strerror(errno));
        goto out;
    }
    made = 1;
    if ((rc = fill_folder(c, m, o, tmp, log, err, errlen)))
        goto out;
    if ((rc = util_fsync_dir(tmp))) {
        util_fail(err, errlen, rc, "%s: cannot sync: %s", tmp, strerror(-rc));
        goto out;
    }
    if ((rc = check_target(dir, err, errlen))) /* something appeared there meanwhile */
        goto out;
    if (rename(tmp, dir)) {
        rc = util_fail(err, errlen, -errno, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
        goto out;
    }
    made = 0;
    if ((rc = util_fsync_dir(parent)))
        util_fail(err, errlen, rc, "%s: cannot sync: %s", parent, strerror(-rc));
out:
    if (made)
        ckpt_remove_dir(tmp);
    if (c)
        ckpt_close(&c);
    free(m);
    return rc;
}
