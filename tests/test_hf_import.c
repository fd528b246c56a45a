/* Importing a Hugging Face Llama (checkpointd/hf_import.h, hf_config.h, st_read.h, `ctitan ckpt
 * import`, checkpoint.initial_load_path): models written by transformers (tests/hf_llama.py) in
 * fp32, bf16 and fp16, tied or not, with Llama 3.1's rotary scaling, sharded or not, give
 * transformers' logits on ctitan's CPU model; a job starts from one and trains; bad input of
 * every kind is refused by name and leaves nothing behind. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/hf_config.h"
#include "checkpointd/hf_import.h"
#include "checkpointd/st_read.h"
#include "kernels/cpu/model.h"
#include "stages/data/tokfile.h"
#include "tests/testjob.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/ctitan-hfimp-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    return tj_setup("hfjob");
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(dir);
    return tj_teardown();
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* tests/hf_llama.py OUT ARGS */
static void make_hf(const char *py, const char *out, const char *args)
{
    char cmd[1024], log[8192];
    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python tests/hf_llama.py %s %s 2>&1", py, out, args);
    if (tu_run(cmd, log, sizeof(log)))
        fail_msg("%s:\n%s", cmd, log);
}

static size_t read_bin(const char *path, void *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* The manifest `ctitan ckpt import` makes without --manifest, for HF folder hf. */
static void import_manifest(manifest_t *m, const char *hf)
{
    char err[1024];
    manifest_defaults(m);
    if (hf_import_manifest(m, hf, err, sizeof(err)))
        fail_msg("%s", err);
    m->seq_len = m->model.max_seq_len < m->seq_len ? m->model.max_seq_len : m->seq_len;
    if (manifest_validate(m, err, sizeof(err)))
        fail_msg("%s", err);
}

/* Imports hf into out/step-00000000 and reads its master weights back (flat, caller frees). */
static float *import_weights(const char *hf, const char *out, manifest_t *m, param_table_t *tab)
{
    char err[1024], path[512];
    import_manifest(m, hf);
    if (hf_import(hf, m, out, NULL, path, sizeof(path), err, sizeof(err)))
        fail_msg("%s", err);
    assert_int_equal(params_table_init(tab, &m->model), 0);
    float *w = malloc(tab->total * sizeof(float));
    ckpt_t *ck;
    assert_int_equal(ckpt_open(&ck, path, err, sizeof(err)), 0);
    for (int i = 0; i < tab->n; i++)
        if (ckpt_read(ck, tab->t[i].name, 0, tab->t[i].numel, w + tab->t[i].offset, err, sizeof(err)))
            fail_msg("%s", err);
    const ckpt_index_t *ix = ckpt_index(ck);
    assert_int_equal(ix->step, 0);
    ckpt_close(&ck);
    return w;
}

/* A model from transformers, imported: ctitan's CPU forward gives its logits. */
static void check_logits(const char *name, const char *args)
{
    const char *py;
    TU_NEED_PY(py);
    char hf[256], out[256], path[300];
    snprintf(hf, sizeof(hf), "%s/%s", dir, name);
    snprintf(out, sizeof(out), "%s/%s-ckpt", dir, name);
    make_hf(py, hf, args);
    static manifest_t m;
    param_table_t tab;
    float *w = import_weights(hf, out, &m, &tab);
    int32_t tokens[4096];
    snprintf(path, sizeof(path), "%s/tokens.i32", hf);
    size_t nt = read_bin(path, tokens, sizeof(tokens)) / 4;
    int T = 12, B = (int)nt / T, V = m.model.vocab_size;
    assert_int_equal((size_t)B * T, nt);
    float *ref = malloc(nt * V * sizeof(float)), *g = calloc(tab.total, sizeof(float));
    snprintf(path, sizeof(path), "%s/logits.f32", hf);
    assert_int_equal(read_bin(path, ref, nt * V * sizeof(float)), nt * V * sizeof(float));
    model_t *mod = model_new(&m.model, 0, m.model.n_layers + 2, w, g, NULL);
    assert_non_null(mod);
    model_acts_t *a = model_acts_new(mod, B, T);
    model_forward(mod, a, tokens, NULL, NULL, 0, NULL);
    const float *lg = model_logits(a);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < nt * V; i++) {
        worst = fmax(worst, fabs((double)lg[i] - ref[i]));
        scale = fmax(scale, fabs((double)ref[i]));
    }
    print_message("%s: logits within %.3g of transformers' (largest |logit| %.3g)\n", name, worst, scale);
    assert_true(worst < 1e-5 * fmax(1.0, scale));
    model_acts_destroy(&a);
    model_destroy(&mod);
    params_table_free(&tab);
    free(w);
    free(g);
    free(ref);
}

static void test_fp32_model_gives_transformers_logits(void **state)
{
    (void)state;
    check_logits("fp32", "--dtype float32");
}

static void test_fp32_sharded_llama3_rope_gives_transformers_logits(void **state)
{
    (void)state;
    check_logits("rope", "--dtype float32 --rope-llama3 --shard");
}

static void test_bf16_tied_sharded_gives_transformers_logits(void **state)
{
    (void)state;
    check_logits("bf16", "--dtype bfloat16 --tied --shard --rope-llama3");
}

static void test_fp16_tied_gives_transformers_logits(void **state)
{
    (void)state;
    check_logits("fp16", "--dtype float16 --tied");
}

/* fp32 in, fp32 stored: every weight of the checkpoint is the safetensors file's bits. */
static void test_fp32_import_is_bitwise(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    char hf[256], out[256], err[512];
    snprintf(hf, sizeof(hf), "%s/exact", dir);
    snprintf(out, sizeof(out), "%s/exact-ckpt", dir);
    make_hf(py, hf, "--dtype float32 --shard --seed 3");
    static manifest_t m;
    param_table_t tab;
    float *w = import_weights(hf, out, &m, &tab);
    st_set_t s;
    assert_int_equal(st_set_open(&s, hf, err, sizeof(err)), 0);
    assert_true(s.n_files > 1);
    for (int i = 0; i < tab.n; i++) {
        const st_tensor_t *t = st_set_find(&s, tab.t[i].name);
        assert_non_null(t);
        assert_string_equal(t->dtype, "F32");
        float *x = malloc(t->bytes);
        FILE *f = fopen(s.files[t->file], "rb");
        assert_non_null(f);
        assert_int_equal(fseek(f, (long)t->offset, SEEK_SET), 0);
        assert_int_equal(fread(x, 1, t->bytes, f), t->bytes);
        fclose(f);
        assert_memory_equal(x, w + tab.t[i].offset, t->bytes);
        free(x);
    }
    st_set_close(&s);
    params_table_free(&tab);
    free(w);
}

/* ---- bad input ---- */

static void expect_config(const char *json, int rc, const char *needle)
{
    hf_config_t h;
    char err[512] = "";
    int got = hf_config_parse(json, strlen(json), "config.json", &h, err, sizeof(err));
    if (got != rc || !strstr(err, needle))
        fail_msg("%s: got %d '%s', expected %d with '%s'", json, got, err, rc, needle);
}

#define CFG_BASE "\"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, " \
                 "\"intermediate_size\": 16, \"vocab_size\": 16, \"max_position_embeddings\": 32, " \
                 "\"rms_norm_eps\": 1e-6"
#define CFG(extra) "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", " CFG_BASE extra "}"

static void test_config_reads_llama_and_refuses_what_ctitan_cannot_run(void **state)
{
    (void)state;
    hf_config_t h;
    char err[512];
    const char *ok = CFG(", \"tie_word_embeddings\": true, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, "
                         "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}");
    if (hf_config_parse(ok, strlen(ok), "config.json", &h, err, sizeof(err)))
        fail_msg("%s", err);
    assert_int_equal(h.model.dim, 8);
    assert_int_equal(h.model.n_kv_heads, 2); /* absent: the heads */
    assert_int_equal(h.model.hidden_dim, 16);
    assert_true(h.model.rope_theta == 10000.0 && h.model.norm_eps == 1e-6);
    assert_true(h.model.rope_scaling_factor == 32.0 && h.model.rope_original_max_seq_len == 8192);
    assert_int_equal(h.tied, 1);
    expect_config("{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\", " CFG_BASE "}",
                  -ENOTSUP, "architecture MistralForCausalLM");
    expect_config("{\"model_type\": \"gemma\", " CFG_BASE "}", -ENOTSUP, "model_type \"gemma\"");
    expect_config(CFG(", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}"), -ENOTSUP, "\"yarn\"");
    expect_config(CFG(", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}"), -ENOTSUP, "\"linear\"");
    expect_config(CFG(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 2.0}"), -EINVAL, "low_freq_factor");
    expect_config(CFG(", \"attention_bias\": true"), -ENOTSUP, "attention_bias");
    expect_config(CFG(", \"mlp_bias\": true"), -ENOTSUP, "mlp_bias");
    expect_config(CFG(", \"hidden_act\": \"gelu\""), -ENOTSUP, "hidden_act gelu");
    expect_config(CFG(", \"head_dim\": 8"), -ENOTSUP, "head_dim 8");
    expect_config("{\"model_type\": \"llama\", \"hidden_size\": 8}", -EINVAL, "num_hidden_layers is missing");
    expect_config(CFG(", \"vocab_size\": 16"), -EINVAL, "vocab_size"); /* a duplicate key */
    expect_config("{\"model_type\": ", -EINVAL, "not JSON");
    expect_config(CFG(", \"num_key_value_heads\": 3"), -EINVAL, "n_kv_heads");
}

/* manifest_take_model: the flavor's values give way, explicit equal ones stay, an explicit other
 * one is an error naming both and where it came from; an explicit max_seq_len stays. */
/* config.json is read only as a regular file of at most HF_CONFIG_MAX bytes (util_read_file):
 * a larger one and a FIFO are refused, naming the path, without reading or blocking. */
static void test_config_json_is_bounded_and_regular(void **state)
{
    (void)state;
    char d[300], path[400], err[1024];
    hf_config_t h;
    snprintf(d, sizeof(d), "%s/bounded", dir);
    assert_int_equal(mkdir(d, 0755), 0);
    snprintf(path, sizeof(path), "%s/config.json", d);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (unsigned i = 0; i <= HF_CONFIG_MAX; i++)
        fputc(' ', f);
    fclose(f);
    assert_int_equal(hf_config_load(d, &h, err, sizeof(err)), -EFBIG);
    assert_non_null(strstr(err, "more than a config.json has"));
    assert_non_null(strstr(err, path));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(hf_config_load(d, &h, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "not a regular file"));
}

static void test_manifest_takes_the_shape_from_config(void **state)
{
    (void)state;
    static manifest_t m;
    hf_config_t h;
    char err[512];
    const char *cfg = CFG(", \"num_key_value_heads\": 1, \"rope_theta\": 500000.0");
    assert_int_equal(hf_config_parse(cfg, strlen(cfg), "config.json", &h, err, sizeof(err)), 0);
    const char *toml = "[model]\nflavor = \"tiny\"\ndim = 8\nmax_seq_len = 16\n[training]\nseq_len = 16\n";
    manifest_defaults(&m);
    assert_int_equal(manifest_parse(&m, toml, strlen(toml), "run.toml", err, sizeof(err)), 0);
    if (manifest_take_model(&m, &h.model, "config.json", err, sizeof(err)) || manifest_validate(&m, err, sizeof(err)))
        fail_msg("%s", err);
    assert_int_equal(m.model.n_layers, 1);
    assert_int_equal(m.model.n_kv_heads, 1);
    assert_int_equal(m.model.hidden_dim, 16);
    assert_int_equal(m.model.max_seq_len, 16);
    assert_true(m.model.rope_theta == 500000.0 && m.model.norm_eps == 1e-6);
    manifest_defaults(&m);
    assert_int_equal(manifest_parse(&m, toml, strlen(toml), "run.toml", err, sizeof(err)), 0);
    assert_int_equal(manifest_override(&m, "model.norm_eps", "1e-5", err, sizeof(err)), 0);
    assert_int_equal(manifest_take_model(&m, &h.model, "config.json", err, sizeof(err)), -EINVAL);
    if (!strstr(err, "model.norm_eps = 1e-05 (--model.norm_eps) but config.json has 1e-06"))
        fail_msg("%s", err);
    manifest_defaults(&m);
    assert_int_equal(manifest_override(&m, "checkpoint.initial_load_in_hf", "true", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(&m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "needs checkpoint.initial_load_path"));
}

/* A safetensors file written here: tensors of the small config above (F32 zeros), changed by
 * each test. */
typedef struct {
    char name[96], dtype[8];
    int nd;
    long shape[2];
} ent_t;

static int model_ents(ent_t *e, int tied)
{
    model_config_t c = config_defaults();
    c.dim = 8, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 2, c.hidden_dim = 16, c.vocab_size = 16;
    c.max_seq_len = 32, c.norm_eps = 1e-6;
    char err[256];
    assert_int_equal(config_validate(&c, err, sizeof(err)), 0);
    param_table_t tab;
    assert_int_equal(params_table_init(&tab, &c), 0);
    int n = 0;
    for (int i = 0; i < tab.n; i++) {
        if (tied && tab.t[i].kind == PARAM_OUTPUT)
            continue;
        snprintf(e[n].name, sizeof(e[n].name), "%s", tab.t[i].name);
        strcpy(e[n].dtype, "F32");
        e[n].nd = tab.t[i].ndim;
        e[n].shape[0] = tab.t[i].shape[0], e[n].shape[1] = tab.t[i].shape[1];
        n++;
    }
    params_table_free(&tab);
    return n;
}

/* header_cut > 0: the file ends that many bytes into the header; overlap: the second tensor
 * starts where the first does. */
static void write_st(const char *path, const ent_t *e, int n, long header_cut, int overlap)
{
    char hdr[16384];
    size_t k = (size_t)snprintf(hdr, sizeof(hdr), "{\"__metadata__\": {\"format\": \"pt\"}");
    uint64_t off = 0, prev = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = st_dtype_size(e[i].dtype);
        for (int d = 0; d < e[i].nd; d++)
            bytes *= (uint64_t)e[i].shape[d];
        uint64_t at = overlap && i == 1 ? prev : off;
        k += (size_t)snprintf(hdr + k, sizeof(hdr) - k, ", \"%s\": {\"dtype\": \"%s\", \"shape\": [", e[i].name,
                              e[i].dtype);
        for (int d = 0; d < e[i].nd; d++)
            k += (size_t)snprintf(hdr + k, sizeof(hdr) - k, "%s%ld", d ? ", " : "", e[i].shape[d]);
        k += (size_t)snprintf(hdr + k, sizeof(hdr) - k, "], \"data_offsets\": [%llu, %llu]}",
                              (unsigned long long)at, (unsigned long long)(at + bytes));
        prev = at;
        off = at + bytes > off ? at + bytes : off;
    }
    k += (size_t)snprintf(hdr + k, sizeof(hdr) - k, "}");
    assert_true(k < sizeof(hdr));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hn = k;
    fwrite(&hn, 8, 1, f);
    if (header_cut > 0) {
        fwrite(hdr, 1, (size_t)header_cut, f);
    } else {
        fwrite(hdr, 1, k, f);
        void *z = calloc(1, off + 1);
        fwrite(z, 1, off, f);
        free(z);
    }
    fclose(f);
}

/* Writes folder bad-NAME (config.json and, with e, model.safetensors) and imports it into
 * bad-NAME-ckpt; returns the import's status, its reason in err. */
static int try_import(const char *name, const char *config, const ent_t *e, int n, long cut, int overlap, char *out,
                      size_t outlen, char *err, size_t errlen)
{
    char hf[256], path[300], p[512];
    snprintf(hf, sizeof(hf), "%s/bad-%s", dir, name);
    snprintf(out, outlen, "%s/bad-%s-ckpt", dir, name);
    mkdir(hf, 0755);
    snprintf(path, sizeof(path), "%s/config.json", hf);
    write_text(path, config);
    snprintf(path, sizeof(path), "%s/model.safetensors", hf);
    if (e)
        write_st(path, e, n, cut, overlap);
    static manifest_t m;
    manifest_defaults(&m);
    int rc = hf_import_manifest(&m, hf, err, errlen);
    if (!rc) {
        m.seq_len = 32;
        assert_int_equal(manifest_validate(&m, err, errlen), 0);
        rc = hf_import(hf, &m, out, NULL, p, sizeof(p), err, errlen);
    }
    return rc;
}

/* The import is refused with `needle` in its reason and leaves no checkpoint folder. */
static void expect_refused(const char *name, const char *config, const ent_t *e, int n, long cut, int overlap,
                           const char *needle)
{
    char out[300], err[1024] = "";
    int rc = try_import(name, config, e, n, cut, overlap, out, sizeof(out), err, sizeof(err));
    if (!rc || !strstr(err, needle))
        fail_msg("%s: got %d '%s', expected a refusal with '%s'", name, rc, err, needle);
    print_message("%s: %s\n", name, err);
    assert_int_not_equal(access(out, F_OK), 0);
}

#define GOOD_CFG CFG(", \"num_key_value_heads\": 2")

static void test_bad_models_are_refused_and_leave_nothing(void **state)
{
    (void)state;
    ent_t e[64], b[64];
    char out[300], err[1024];
    int n = model_ents(e, 0);
    if (try_import("good", GOOD_CFG, e, n, 0, 0, out, sizeof(out), err, sizeof(err)))
        fail_msg("the unchanged model: %s", err);
    expect_refused("arch", "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", " CFG_BASE "}", e,
                   n, 0, 0, "architecture Qwen2ForCausalLM");
    expect_refused("rope", CFG(", \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}"), e, n, 0, 0,
                   "\"dynamic\"");
    expect_refused("bias", CFG(", \"attention_bias\": true"), e, n, 0, 0, "attention_bias");
    memcpy(b, e, sizeof(e));
    b[3].shape[0]++;
    char need[256];
    snprintf(need, sizeof(need), "tensor %s has shape [%ld, %ld]", b[3].name, b[3].shape[0], b[3].shape[1]);
    expect_refused("shape", GOOD_CFG, b, n, 0, 0, need);
    memcpy(b, e, sizeof(e));
    strcpy(b[2].dtype, "I64");
    snprintf(need, sizeof(need), "tensor %s: dtype I64", b[2].name);
    expect_refused("dtype", GOOD_CFG, b, n, 0, 0, need);
    memcpy(b, e, sizeof(e));
    strcpy(b[2].dtype, "Q4");
    expect_refused("dtype-unknown", GOOD_CFG, b, n, 0, 0, "unknown dtype \"Q4\"");
    snprintf(need, sizeof(need), "tensor %.96s is missing", e[n - 1].name);
    expect_refused("missing", GOOD_CFG, e, n - 1, 0, 0, need);
    memcpy(b, e, sizeof(e));
    strcpy(b[n].name, "model.layers.0.self_attn.q_proj.bias");
    strcpy(b[n].dtype, "F32");
    b[n].nd = 1, b[n].shape[0] = 8;
    expect_refused("extra", GOOD_CFG, b, n + 1, 0, 0, "unexpected tensor model.layers.0.self_attn.q_proj.bias");
    expect_refused("truncated", GOOD_CFG, e, n, 100, 0, "truncated");
    expect_refused("overlap", GOOD_CFG, e, n, 0, 1, "overlap");
    expect_refused("nofile", GOOD_CFG, NULL, 0, 0, 0, "no model.safetensors");
    /* a shard the index names is missing */
    char path[300];
    snprintf(path, sizeof(path), "%s/bad-shard", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/bad-shard/model.safetensors.index.json", dir);
    write_text(path, "{\"metadata\": {}, \"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\"}}");
    expect_refused("shard", GOOD_CFG, NULL, 0, 0, 0, "shard model-00001-of-00002.safetensors");
    /* a weight_map that points outside the folder */
    snprintf(path, sizeof(path), "%s/bad-escape", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/bad-escape/model.safetensors.index.json", dir);
    write_text(path, "{\"weight_map\": {\"model.embed_tokens.weight\": \"../bad-good/model.safetensors\"}}");
    expect_refused("escape", GOOD_CFG, NULL, 0, 0, 0, "is not a file name in the folder");
}

/* st_parse: the header alone, against the file's size. */
static void test_safetensors_header_checks(void **state)
{
    (void)state;
    char err[512];
    st_tensor_t *t = NULL;
    int n = 0;
    uint8_t buf[256];
    const char *h = "{\"a\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 12]}}";
    uint64_t hn = strlen(h);
    memcpy(buf, &hn, 8);
    memcpy(buf + 8, h, hn);
    assert_int_equal(st_parse(buf, 8 + hn, 8 + hn + 12, "f", &t, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 1);
    assert_int_equal(t[0].offset, 8 + hn);
    assert_int_equal(t[0].numel, 6);
    free(t);
    /* the data is 11 bytes: the tensor ends outside the file */
    assert_int_equal(st_parse(buf, 8 + hn, 8 + hn + 11, "f", &t, &n, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "not inside"));
    /* shape and offsets disagree */
    h = "{\"a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 12]}}";
    hn = strlen(h);
    memcpy(buf, &hn, 8);
    memcpy(buf + 8, h, hn);
    assert_int_equal(st_parse(buf, 8 + hn, 8 + hn + 24, "f", &t, &n, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "hold 12 bytes"));
    /* a header size past the file, and one beyond any bound */
    assert_int_equal(st_parse(buf, 8 + hn, 8 + hn - 1, "f", &t, &n, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "truncated"));
    hn = 1ull << 40;
    memcpy(buf, &hn, 8);
    assert_int_equal(st_parse(buf, sizeof(buf), 1ull << 41, "f", &t, &n, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "out of range"));
    assert_int_equal(st_parse(buf, 4, 4, "f", &t, &n, err, sizeof(err)), -EBADMSG);
}

/* `ctitan ckpt import`: the command's output and status, and a refusal's. */
static void test_ckpt_import_command(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    TU_NEED_BIN();
    char hf[256], cmd[1024], out[8192];
    snprintf(hf, sizeof(hf), "%s/cli", dir);
    make_hf(py, hf, "--dtype bfloat16 --tied");
    /* (saying how far it is after every tensor: CTITAN_TEST_SAY_S 0) */
    snprintf(cmd, sizeof(cmd), "CTITAN_TEST_SAY_S=0 %s ckpt import %s --out %s/cli-ckpt 2>&1", tu_ctitan(), hf, dir);
    if (tu_run(cmd, out, sizeof(out)))
        fail_msg("%s", out);
    assert_non_null(strstr(out, "step-00000000 (step 0: dim 32, 2 layers, 4 heads, 2 kv heads, FFN 64"));
    char said[400];
    snprintf(said, sizeof(said), "ctitan: import: reading %s: 0 of 0 M parameters (", hf);
    assert_non_null(strstr(out, said));
    assert_non_null(strstr(out, "imported untied: lm_head.weight starts as a copy of model.embed_tokens.weight"));
    snprintf(cmd, sizeof(cmd), "%s ckpt verify %s/cli-ckpt/step-00000000 2>&1", tu_ctitan(), dir);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    /* again into the same folder: refused, the first import kept as it was */
    char again[1024], index[300], before[4096], after[4096];
    snprintf(index, sizeof(index), "%s/cli-ckpt/step-00000000/index", dir);
    tu_read_file(index, before, sizeof(before));
    snprintf(again, sizeof(again), "%s ckpt import %s --out %s/cli-ckpt 2>&1", tu_ctitan(), hf, dir);
    assert_int_equal(tu_run(again, out, sizeof(out)), 1);
    if (!strstr(out, "cli-ckpt/step-00000000 exists: it is not written over"))
        fail_msg("%s", out);
    tu_read_file(index, after, sizeof(after));
    assert_memory_equal(before, after, sizeof(before));
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    /* a manifest whose model disagrees */
    char man[300];
    snprintf(man, sizeof(man), "%s/dim.toml", dir);
    write_text(man, "[model]\nflavor = \"tiny\"\ndim = 64\n");
    snprintf(cmd, sizeof(cmd), "%s ckpt import %s --out %s/cli-bad --manifest %s 2>&1", tu_ctitan(), hf, dir, man);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 1);
    if (!strstr(out, "model.dim = 64") || !strstr(out, "config.json has 32"))
        fail_msg("%s", out);
    snprintf(cmd, sizeof(cmd), "%s/cli-bad", dir);
    assert_int_not_equal(access(cmd, F_OK), 0);
}

/* Import, no step, export --hf: the folder from_pretrained loads holds the model imported bit
 * for bit (bf16 exported as bf16; a tied lm_head as its own copy of the embedding). */
static void round_trip(const char *name, const char *args, const char *dtype)
{
    const char *py;
    TU_NEED_PY(py);
    TU_NEED_BIN();
    char hf[256], cmd[4096], out[8192];
    snprintf(hf, sizeof(hf), "%s/%s", dir, name);
    make_hf(py, hf, args);
    snprintf(cmd, sizeof(cmd), "%s ckpt import %s --out %s-ckpt 2>&1 && %s ckpt export %s-ckpt/step-00000000 --hf "
             "%s-back --dtype %s --no-tokenizer 2>&1 && %s/venv/bin/python tests/hf_same.py %s %s-back 2>&1",
             tu_ctitan(), hf, hf, tu_ctitan(), hf, hf, dtype, py, hf, hf);
    if (tu_run(cmd, out, sizeof(out)))
        fail_msg("%s:\n%s", cmd, out);
    print_message("%s", strstr(out, "hf_same: ") ? strstr(out, "hf_same: ") : out);
}

static void test_round_trip_fp32_is_bitwise(void **state)
{
    (void)state;
    round_trip("rt32", "", "float32");
}

static void test_round_trip_bf16_tied_llama3_sharded_is_bitwise(void **state)
{
    (void)state;
    round_trip("rt16", "--dtype bfloat16 --tied --rope-llama3 --shard", "bfloat16");
}

/* transformers' mean loss, for the model of HF folder hf, on the first `rows` windows of the
 * jobs' token file (window w: tokens [32w, 32w + 33), as manifests/tiny.toml reads them in order). */
static double hf_loss(const char *py, const char *hf, int rows)
{
    char path[512], cmd[2048], got[256], err[512];
    snprintf(path, sizeof(path), "%s/data/train.bin", tj_dir);
    tokfile_t *tf;
    assert_int_equal(tokfile_open(&tf, path, 300, err, sizeof(err)), 0);
    int32_t win[16 * 33];
    assert_true(rows <= 16);
    for (int r = 0; r < rows; r++)
        assert_int_equal(tokfile_read(tf, (size_t)r * 32, 33, win + r * 33), 0);
    tokfile_close(&tf);
    snprintf(path, sizeof(path), "%s/rows%d.i32", dir, rows);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(win, sizeof(int32_t) * 33, (size_t)rows, f), (size_t)rows);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python tests/hf_llama.py --loss %s %s %d 2>&1", py, hf, path, rows);
    if (tu_run(cmd, got, sizeof(got)))
        fail_msg("%s: %s", cmd, got);
    return atof(got);
}

/* A job launched with checkpoint.initial_load_path (in_hf) and nothing to resume starts from the
 * Hugging Face weights, read straight into memory (nothing written under its dump folder): pp
 * 2, 2 optimizer shards (manifests/tiny.toml), and trains; the same bits as a job started from
 * the checkpoint `ctitan ckpt import` writes of that folder. */
static void test_job_starts_from_hf_weights(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    TU_NEED_BIN();
    char hf[256], job[64], extra[1024], out[65536];
    snprintf(hf, sizeof(hf), "%s/job", dir);
    make_hf(py, hf, "--dtype bfloat16 --tied --vocab 300 --hidden 32 --inter 64 --max-pos 64");
    tj_name(job, sizeof(job), 'h', "hf");
    snprintf(extra, sizeof(extra), "--training.steps 3 --checkpoint.initial_load_path %s "
             "--checkpoint.initial_load_in_hf true", hf);
    /* (the read says how far it is: here after every tensor) */
    int rc = tj_launch("CTITAN_TEST_SAY_S=0", 120, job, extra, out, sizeof(out));
    if (rc)
        fail_msg("launch: %d\n%.4000s", rc, out);
    char said[400];
    snprintf(said, sizeof(said), "ctitan: import: reading %s: ", hf);
    if (!strstr(out, "reading the Hugging Face Llama") || !strstr(out, "the optimizer fresh") || !strstr(out, said))
        fail_msg("%s", out);
    char runs[512];
    struct stat st;
    snprintf(runs, sizeof(runs), "%s/runs/%s/hf-import", tj_dir, job);
    assert_int_not_equal(stat(runs, &st), 0);
    static tj_metrics_t mt;
    tj_parse_metrics(job, &mt);
    assert_int_equal(mt.n, 3);
    for (int i = 0; i < 3; i++)
        assert_true(isfinite(atof(mt.loss[i])));
    /* step 1's loss is transformers' on the same windows (4 rows of seq_len 32 a step) */
    double want = hf_loss(py, hf, 4), loss1 = atof(mt.loss[0]);
    print_message("step 1 loss %.9g, transformers' on the same rows %.9g\n", loss1, want);
    assert_true(fabs(loss1 - want) < 1e-5 * fabs(want));
    /* data parallel 2, one stage, 3 optimizer shards: 8 rows a step */
    char dp[64];
    tj_name(dp, sizeof(dp), 'h', "dp");
    snprintf(extra, sizeof(extra), "--training.steps 1 --parallelism.data_parallel_replicate_degree 2 "
             "--parallelism.pipeline_parallel_degree 1 --optshard.shards 3 --checkpoint.initial_load_path %s "
             "--checkpoint.initial_load_in_hf true", hf);
    if (tj_launch("", 120, dp, extra, out, sizeof(out)))
        fail_msg("%.4000s", out);
    static tj_metrics_t md;
    tj_parse_metrics(dp, &md);
    want = hf_loss(py, hf, 8);
    print_message("dp 2: step 1 loss %s, transformers' %.9g\n", md.loss[0], want);
    assert_true(fabs(atof(md.loss[0]) - want) < 1e-5 * fabs(want));
    /* without initial_load_in_hf, initial_load_path is a ctitan checkpoint: the one `ctitan ckpt
     * import` writes of the folder */
    char ck[64], cmd[2048];
    tj_name(ck, sizeof(ck), 'h', "ck");
    snprintf(cmd, sizeof(cmd), "%s ckpt import %s --out %s/job-ckpt --manifest manifests/tiny.toml 2>&1", tu_ctitan(),
             hf, dir);
    if (tu_run(cmd, out, sizeof(out)))
        fail_msg("%s", out);
    snprintf(extra, sizeof(extra), "--training.steps 1 --model.hidden_dim 64 --checkpoint.initial_load_path "
             "%s/job-ckpt/step-00000000", dir);
    if (tj_launch("", 120, ck, extra, out, sizeof(out)))
        fail_msg("%.4000s", out);
    static tj_metrics_t mc;
    tj_parse_metrics(ck, &mc);
    assert_string_equal(mc.loss[0], mt.loss[0]);
    /* a job with checkpoints of its own resumes from them, not from the Hugging Face weights */
    char own[64];
    tj_name(own, sizeof(own), 'h', "own");
    snprintf(extra, sizeof(extra), "--training.steps 2 --checkpoint.enable true --checkpoint.interval 2 "
             "--checkpoint.initial_load_path %s --checkpoint.initial_load_in_hf true", hf);
    if (tj_launch("", 120, own, extra, out, sizeof(out)))
        fail_msg("%.4000s", out);
    assert_non_null(strstr(out, "reading the Hugging Face Llama"));
    snprintf(extra, sizeof(extra), "--training.steps 3 --checkpoint.enable true --checkpoint.interval 2 "
             "--checkpoint.initial_load_path %s --checkpoint.initial_load_in_hf true", hf);
    if (tj_launch("", 120, own, extra, out, sizeof(out)))
        fail_msg("%.4000s", out);
    if (strstr(out, "reading the Hugging Face") || !strstr(out, "step-00000002 (after step 2)"))
        fail_msg("%.4000s", out);
    /* a [model] key that disagrees with config.json is refused before anything starts */
    snprintf(extra, sizeof(extra), "--training.steps 3 --checkpoint.initial_load_path %s "
             "--checkpoint.initial_load_in_hf true --model.n_layers 4", hf);
    tj_name(job, sizeof(job), 'h', "bad");
    assert_int_equal(tj_launch("", 60, job, extra, out, sizeof(out)), 2);
    if (!strstr(out, "model.n_layers = 4 (--model.n_layers) but") || !strstr(out, "config.json has 2"))
        fail_msg("%s", out);
}

/* The same on the CUDA backend (the emulator's plugin in make test, so the bf16 kernels and
 * their scaled rotary tables): head_dim 16 for the CUDA attention, Llama 3.1's rotary scaling;
 * step 1's loss is transformers' fp32 one to bf16's precision. */
static void test_cuda_job_starts_from_hf_weights(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    char hf[256], job[64], extra[1024];
    static char out[65536];
    snprintf(hf, sizeof(hf), "%s/cuda", dir);
    make_hf(py, hf, "--dtype bfloat16 --vocab 300 --hidden 32 --heads 2 --kv-heads 1 --inter 64 --max-pos 64 "
            "--rope-llama3");
    tj_name(job, sizeof(job), 'h', "cuda");
    snprintf(extra, sizeof(extra), "--training.steps 2 --job.device cuda --checkpoint.initial_load_path %s "
             "--checkpoint.initial_load_in_hf true", hf);
    int rc = tj_launch("", 120, job, extra, out, sizeof(out));
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc)
        fail_msg("launch: %d\n%.4000s", rc, out);
    static tj_metrics_t mt;
    tj_parse_metrics(job, &mt);
    assert_int_equal(mt.n, 2);
    double want = hf_loss(py, hf, 4), loss1 = atof(mt.loss[0]);
    print_message("step 1 loss on the CUDA backend %.9g, transformers' (fp32) %.9g\n", loss1, want);
    assert_true(fabs(loss1 - want) < 2e-2 * fabs(want));
}

/* Across two hosts (test_hosts' kind: both on this machine, the emulated CUDA backend, data
 * parallel 2 on the NCCL plane, one replica a host): host 0's checkpointd reads the Hugging Face
 * folder into its staging segment, and host 1's agent, told to load the same folder, reads it
 * itself; every step's loss is the one-host job's, bit for bit. */
static void test_cuda_job_across_hosts_starts_from_hf_weights(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    TU_NEED_BIN();
    if (tj_use_sim_plugin())
        skip();
    char hf[256], one[64], base[1024];
    static char out[65536], agent_out[65536];
    snprintf(hf, sizeof(hf), "%s/hosts", dir);
    make_hf(py, hf, "--dtype bfloat16 --vocab 300 --hidden 32 --heads 2 --kv-heads 1 --inter 64 --max-pos 64");
    snprintf(base, sizeof(base), "--training.steps 2 --job.device cuda --parallelism.data_parallel_replicate_degree 2 "
             "--parallelism.data_plane nccl --checkpoint.initial_load_path %s --checkpoint.initial_load_in_hf true",
             hf);
    tj_name(one, sizeof(one), 'h', "one");
    int rc = tj_launch("", 120, one, base, out, sizeof(out));
    if (rc)
        fail_msg("one host: %d\n%.4000s", rc, out);
    tj_hosts_t h;
    tj_two_hosts(&h, 'h', "two", base);
    int arc;
    rc = tj_run_both(&h, out, sizeof(out), agent_out, sizeof(agent_out), &arc);
    unsetenv("CTITAN_CUDA_PLUGIN");
    if (rc || arc)
        fail_msg("host 0: %d, host 1: %d\n%.4000s\n--- host 1:\n%.4000s", rc, arc, out, agent_out);
    if (!strstr(agent_out, "reading the Hugging Face Llama"))
        fail_msg("host 1 did not read the folder itself:\n%.4000s", agent_out);
    tj_assert_same_losses(h.j, one, 2);
    tj_assert_clean(h.j);
    tj_assert_clean(h.jh1);
}

/* A job whose Hugging Face folder turns out damaged when read (a safetensors file cut short):
 * the start is refused naming the key and the file, and nothing of the job stays. */
static void test_job_from_a_damaged_hf_folder_is_refused(void **state)
{
    (void)state;
    const char *py;
    TU_NEED_PY(py);
    TU_NEED_BIN();
    char hf[256], st[300], job[64], extra[1024];
    static char out[65536];
    snprintf(hf, sizeof(hf), "%s/damaged", dir);
    make_hf(py, hf, "--dtype bfloat16 --vocab 300 --hidden 32 --inter 64 --max-pos 64");
    snprintf(st, sizeof(st), "%s/model.safetensors", hf);
    struct stat sb;
    assert_int_equal(stat(st, &sb), 0);
    assert_int_equal(truncate(st, sb.st_size - 100), 0);
    tj_name(job, sizeof(job), 'h', "dmg");
    snprintf(extra, sizeof(extra), "--training.steps 1 --checkpoint.initial_load_path %s "
             "--checkpoint.initial_load_in_hf true --job.max_restarts 0", hf);
    int rc = tj_launch("", 120, job, extra, out, sizeof(out));
    if (rc == 0 || !strstr(out, "initial_load_in_hf") || !strstr(out, "model.safetensors"))
        TJ_FAIL_WITH(out, "status %d: expected the start refused, naming the key and the file", rc);
    tj_assert_clean(job);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_reads_llama_and_refuses_what_ctitan_cannot_run),
        cmocka_unit_test(test_safetensors_header_checks),
        cmocka_unit_test(test_manifest_takes_the_shape_from_config),
        cmocka_unit_test(test_bad_models_are_refused_and_leave_nothing),
        cmocka_unit_test(test_fp32_model_gives_transformers_logits),
        cmocka_unit_test(test_fp32_sharded_llama3_rope_gives_transformers_logits),
        cmocka_unit_test(test_bf16_tied_sharded_gives_transformers_logits),
        cmocka_unit_test(test_fp16_tied_gives_transformers_logits),
        cmocka_unit_test(test_fp32_import_is_bitwise),
        cmocka_unit_test(test_config_json_is_bounded_and_regular),
        cmocka_unit_test(test_ckpt_import_command),
        cmocka_unit_test(test_round_trip_fp32_is_bitwise),
        cmocka_unit_test(test_round_trip_bf16_tied_llama3_sharded_is_bitwise),
        cmocka_unit_test(test_job_starts_from_hf_weights),
        cmocka_unit_test(test_job_from_a_damaged_hf_folder_is_refused),
        cmocka_unit_test(test_cuda_job_starts_from_hf_weights),
        cmocka_unit_test(test_cuda_job_across_hosts_starts_from_hf_weights),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
