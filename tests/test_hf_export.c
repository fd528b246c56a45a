/* `ctitan ckpt export --hf DIR`: a checkpoint of a small Llama (grouped-query attention, an
 * explicit intermediate size) written with the writer API, exported, then loaded by
 * transformers with no arguments (tests/hf_check.py): the weights equal the checkpoint's bit
 * for bit, the logits equal ctitan's CPU model's, the converted tokenizer encodes as ctitan's;
 * sharded and bfloat16 exports; a tokenizer.json copied; refusals that leave nothing behind;
 * and how closely the converted tokenizer agrees with tok_encode on the fortunes corpus. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/hf_export.h"
#include "checkpointd/safetensors.h"
#include "checkpointd/writer.h"
#include "kernels/cpu/model.h"
#include "kernels/params.h"
#include "stages/data/tokenizer.h"
#include "stages/job/manifest.h"
#include "tests/testutil.h"
#include "tests/testjob.h"

#define STEP 3
#define FORTUNES "/usr/share/games/fortunes"
static const char sample_text[] =
    "The quick brown fox jumps over the lazy dog.  Twice, 1234 times!\n\tcaf\xc3\xa9 na\xc3\xafve  ok?";

typedef struct {
    char dir[64];
    char ckpt[256];      /* DIR/ckpts/step-00000003 */
    char tok[256];       /* DIR/tokenizer.bin */
    char ref[256];       /* DIR/ref.safetensors: --safetensors of the checkpoint */
    model_config_t cfg;
    param_table_t tab;
    float *data[3];
} fx_t;

/* Text to train the tokenizer on: some of the fortunes when installed, else sample_text. */
static uint8_t *corpus(size_t *n)
{
    uint8_t *buf = malloc(1 << 16);
    FILE *f = fopen(FORTUNES "/fortunes", "rb");
    *n = f ? fread(buf, 1, 1 << 16, f) : 0;
    if (f)
        fclose(f);
    for (size_t k = *n; k < 4096; k += sizeof(sample_text) - 1, *n = k)
        memcpy(buf + k, sample_text, sizeof(sample_text) - 1);
    return buf;
}

static int write_ckpt(fx_t *fx, const char *manifest)
{
    ckpt_index_t ix;
    char err[512], dir[128];
    snprintf(dir, sizeof(dir), "%s/ckpts", fx->dir);
    int rc = ckpt_index_plan(&ix, &fx->tab, optim_find("AdamW"), STEP, manifest, NULL, 0);
    if (rc)
        return rc;
    for (uint32_t f = 0; f < 3; f++)
        ckpt_index_hash(&ix, f, fx->data[f]);
    ckw_t *w = NULL;
    if (!(rc = ckw_begin(&w, dir, &ix, err, sizeof(err)))) {
        static uint8_t block[CKPT_DATA_HDR];
        for (uint32_t f = 0; f < 3 && !rc; f++) {
            ckpt_data_header(block, f, STEP);
            if (!(rc = ckw_write(w, f, 0, block, sizeof(block), err, sizeof(err))))
                rc = ckw_write(w, f, CKPT_DATA_HDR, fx->data[f], fx->tab.total * sizeof(float), err, sizeof(err));
        }
        if (rc)
            ckw_abort(&w);
        else
            rc = ckw_commit(&w, fx->ckpt, sizeof(fx->ckpt), NULL, err, sizeof(err));
    }
    if (rc)
        print_message("writing a checkpoint in %s: %s\n", dir, err);
    ckpt_index_free(&ix);
    return rc;
}

static int setup_fixture(fx_t *fx)
{
    snprintf(fx->dir, sizeof(fx->dir), "/tmp/ctitan-hf-XXXXXX");
    if (!mkdtemp(fx->dir))
        return -1;
    char err[512];
    size_t n;
    uint8_t *text = corpus(&n);
    tok_t *t = NULL;
    snprintf(fx->tok, sizeof(fx->tok), "%s/tokenizer.bin", fx->dir);
    int rc = tok_train(&t, text, n, 300, err, sizeof(err));
    free(text);
    if (rc || tok_save(t, fx->tok, err, sizeof(err))) {
        print_message("tokenizer: %s\n", err);
        tok_destroy(&t);
        return -1;
    }
    tok_destroy(&t);
    manifest_t *m = calloc(1, sizeof(*m));
    manifest_defaults(m);
    snprintf(m->flavor, sizeof(m->flavor), "tiny");
    config_preset("tiny", &m->model);
    m->model.dim = 32, m->model.vocab_size = 300, m->model.hidden_dim = 48, m->model.rope_theta = 500000;
    snprintf(m->tokenizer_path, sizeof(m->tokenizer_path), "%s", fx->tok);
    char *toml = NULL;
    if (config_validate(&m->model, err, sizeof(err)) || !(toml = manifest_to_toml(m)) ||
        params_table_init(&fx->tab, &m->model)) {
        free(m);
        free(toml);
        return -1;
    }
    fx->cfg = m->model;
    free(m);
    for (int f = 0; f < 3; f++)
        fx->data[f] = malloc(fx->tab.total * sizeof(float));
    params_init(&fx->tab, &fx->cfg, 7, fx->data[0], 0, fx->tab.total);
    /* halfway between two bfloat16 values, both ways, for the rounding to even */
    static const uint32_t ties[] = {0x3F808000u, 0x3F818000u, 0xBF808000u, 0x3F80C000u, 0x3F807FFFu};
    for (int i = 0; i < 5; i++)
        memcpy(&fx->data[0][i], &ties[i], 4);
    tu_fill(NULL, fx->data[1], fx->tab.total, 101, 1.0);
    tu_fill(NULL, fx->data[2], fx->tab.total, 102, 1.0);
    rc = write_ckpt(fx, toml);
    free(toml);
    snprintf(fx->ref, sizeof(fx->ref), "%s/ref.safetensors", fx->dir);
    if (!rc && (rc = st_export(fx->ckpt, fx->ref, err, sizeof(err))))
        print_message("st_export: %s\n", err);
    return rc;
}

static int teardown(void **state)
{
    fx_t *fx = *state;
    if (!fx)
        return 0;
    *state = NULL;
    int rc = strcmp(fx->dir + strlen(fx->dir) - 6, "XXXXXX") ? tu_rmtree(fx->dir) : 0;
    for (int f = 0; f < 3; f++)
        free(fx->data[f]);
    params_table_free(&fx->tab);
    free(fx);
    return rc;
}

static int setup(void **state)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    *state = fx;
    if (!fx || setup_fixture(fx)) {
        teardown(state);
        return -1;
    }
    return 0;
}

/* ---- helpers ---- */

static int write_raw(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(p, 1, n, f) == n;
    return (f && fclose(f)) || !ok ? -1 : 0;
}

/* Runs `ctitan ckpt export CKPT ARGS`; its status, output in out. */
static int export_cli(const fx_t *fx, const char *args, char *out, size_t n)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s ckpt export %s %s 2>&1", tu_ctitan(), fx->ckpt, args);
    int rc = tu_run(cmd, out, n);
    print_message("%s\n", out);
    return rc;
}

/* tests/NAME from the working folder, else from the source tree above build/tests/. */
static const char *script(const char *name, char *buf, size_t n)
{
    char rel[128];
    snprintf(buf, n, "tests/%s", name);
    if (access(buf, R_OK) == 0)
        return buf;
    /* build/tests/ or build/asan/tests/ */
    for (int up = 0; up < 2; up++) {
        snprintf(rel, sizeof(rel), "%stests/%s", up ? "../" : "", name);
        if (access(tu_built("..", rel, buf, n), R_OK) == 0)
            break;
    }
    return buf;
}

/* Runs tests/hf_check.py on DIR with ARGS; its status. */
static int hf_check(const fx_t *fx, const char *py, const char *dir, const char *args)
{
    char cmd[4096], out[4096], s[512];
    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python %s %s --ref %s %s 2>&1 | tail -8", py,
             script("hf_check.py", s, sizeof(s)), dir, fx->ref, args);
    int rc = tu_run(cmd, out, sizeof(out));
    print_message("%s", out);
    return rc ? rc : strstr(out, "hf_check: ok") ? 0 : 1;
}

/* Entries of the fixture's folder whose name holds `part` (leftover temporary folders). */
static int count_entries(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strstr(e->d_name, part) != NULL;
    if (d)
        closedir(d);
    return n;
}

/* ctitan's logits for the tokens of sample_text, and those tokens and the text, as files. */
static void write_reference(fx_t *fx)
{
    tok_t *t = NULL;
    char err[256], p[320];
    assert_int_equal(tok_load(&t, fx->tok, err, sizeof(err)), 0);
    size_t n = sizeof(sample_text) - 1, nt = 0;
    uint32_t *ids = malloc(n * sizeof(uint32_t));
    assert_int_equal(tok_encode(t, (const uint8_t *)sample_text, n, ids, &nt), 0);
    tok_destroy(&t);
    int T = (int)nt < fx->cfg.max_seq_len ? (int)nt : fx->cfg.max_seq_len;
    snprintf(p, sizeof(p), "%s/ids.i32", fx->dir);
    assert_int_equal(write_raw(p, ids, nt * 4), 0);
    snprintf(p, sizeof(p), "%s/text.bin", fx->dir);
    assert_int_equal(write_raw(p, sample_text, n), 0);
    snprintf(p, sizeof(p), "%s/tokens.i32", fx->dir);
    assert_int_equal(write_raw(p, ids, (size_t)T * 4), 0);

    float *grads = calloc(fx->tab.total, sizeof(float));
    model_t *m = model_new(&fx->cfg, 0, fx->cfg.n_layers + 2, fx->data[0], grads, NULL);
    model_acts_t *a = model_acts_new(m, 1, T);
    model_forward(m, a, (const int32_t *)ids, NULL, NULL, 0, NULL);
    snprintf(p, sizeof(p), "%s/logits.f32", fx->dir);
    assert_int_equal(write_raw(p, model_logits(a), (size_t)T * fx->cfg.vocab_size * 4), 0);
    model_acts_destroy(&a);
    model_destroy(&m);
    free(grads);
    free(ids);
}

/* ---- tests ---- */

static void test_export_loads_in_transformers(void **state)
{
    fx_t *fx = *state;
    const char *py;
    TU_NEED_BIN();
    TU_NEED_PY(py);
    char out[4096], args[512], dir[128];
    snprintf(dir, sizeof(dir), "%s/hf", fx->dir);
    snprintf(args, sizeof(args), "--hf %s", dir);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 0);
    write_reference(fx);
    snprintf(args, sizeof(args), "--tokens %s/tokens.i32 --logits %s/logits.f32 --text %s/text.bin --ids %s/ids.i32",
             fx->dir, fx->dir, fx->dir, fx->dir);
    assert_int_equal(hf_check(fx, py, dir, args), 0);
    assert_int_equal(count_entries(fx->dir, "tmp-hf"), 0);
}

/* The JSON file dir/name (NULL when it does not parse). */
static json_t *load_json(const char *dir, const char *name)
{
    char p[512];
    json_error_t je;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    json_t *j = json_load_file(p, 0, &je);
    if (!j)
        print_message("%s: %s\n", p, je.text);
    return j;
}

static void test_config_json_describes_the_model(void **state)
{
    fx_t *fx = *state;
    char err[512], p[256];
    model_config_t c = fx->cfg;
    c.rope_scaling_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
    c.rope_original_max_seq_len = 16;
    snprintf(p, sizeof(p), "%s/config.json", fx->dir);
    assert_int_equal(hf_config_write(&c, "bfloat16", 5, 6, p, err, sizeof(err)), 0);
    json_t *j = load_json(fx->dir, "config.json");
    assert_non_null(j);
    assert_string_equal(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)),
                        "LlamaForCausalLM");
    assert_string_equal(json_string_value(json_object_get(j, "model_type")), "llama");
    assert_int_equal(json_integer_value(json_object_get(j, "hidden_size")), 32);
    assert_int_equal(json_integer_value(json_object_get(j, "intermediate_size")), 48);
    assert_int_equal(json_integer_value(json_object_get(j, "num_hidden_layers")), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "num_attention_heads")), 4);
    assert_int_equal(json_integer_value(json_object_get(j, "num_key_value_heads")), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "head_dim")), 8);
    assert_int_equal(json_integer_value(json_object_get(j, "vocab_size")), 300);
    assert_int_equal(json_integer_value(json_object_get(j, "max_position_embeddings")), 64);
    assert_int_equal(json_integer_value(json_object_get(j, "bos_token_id")), 5);
    assert_int_equal(json_integer_value(json_object_get(j, "eos_token_id")), 6);
    assert_true(json_real_value(json_object_get(j, "rope_theta")) == 500000.0);
    assert_true(json_real_value(json_object_get(j, "rms_norm_eps")) == c.norm_eps);
    assert_true(json_is_false(json_object_get(j, "tie_word_embeddings")));
    assert_true(json_is_false(json_object_get(j, "attention_bias")));
    assert_true(json_is_false(json_object_get(j, "mlp_bias")));
    assert_string_equal(json_string_value(json_object_get(j, "hidden_act")), "silu");
    assert_string_equal(json_string_value(json_object_get(j, "torch_dtype")), "bfloat16");
    json_t *rs = json_object_get(j, "rope_scaling");
    assert_string_equal(json_string_value(json_object_get(rs, "rope_type")), "llama3");
    assert_true(json_real_value(json_object_get(rs, "factor")) == 8.0);
    assert_true(json_real_value(json_object_get(rs, "low_freq_factor")) == 1.0);
    assert_true(json_real_value(json_object_get(rs, "high_freq_factor")) == 4.0);
    assert_int_equal(json_integer_value(json_object_get(rs, "original_max_position_embeddings")), 16);
    json_decref(j);

    /* no scaling, unknown token ids: nulls; written over the first durably */
    assert_int_equal(hf_config_write(&fx->cfg, "float32", -1, -1, p, err, sizeof(err)), 0);
    assert_non_null(j = load_json(fx->dir, "config.json"));
    assert_true(json_is_null(json_object_get(j, "rope_scaling")));
    assert_true(json_is_null(json_object_get(j, "bos_token_id")));
    assert_true(json_is_null(json_object_get(j, "eos_token_id")));
    json_decref(j);
}

/* transformers' rotary frequencies for a config.json with rope_scaling llama3 are ctitan's
 * (config_rope_inv_freq), so the import reads back what the export meant. */
static void test_rope_scaling_means_the_same_in_transformers(void **state)
{
    fx_t *fx = *state;
    const char *py;
    TU_NEED_PY(py);
    char err[512], p[256], cmd[1024], out[8192];
    model_config_t c = fx->cfg;
    c.rope_scaling_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
    c.rope_original_max_seq_len = 16;
    snprintf(p, sizeof(p), "%s/config.json", fx->dir);
    assert_int_equal(hf_config_write(&c, "float32", -1, -1, p, err, sizeof(err)), 0);
    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python -c 'import sys\nfrom transformers import LlamaConfig\n"
             "from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS as R\n"
             "c = LlamaConfig.from_pretrained(sys.argv[1])\ninv, _ = R[\"llama3\"](c, \"cpu\")\n"
             "print(\" \".join(repr(float(x)) for x in inv.double()))' %s 2>&1", py, fx->dir);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    char *s = out;
    for (int i = 0; i < config_head_dim(&c) / 2; i++) {
        char *end;
        double hf = strtod(s, &end), mine = config_rope_inv_freq(&c, i);
        assert_true(end != s);
        s = end;
        /* transformers computes in float32 */
        if (fabs(hf - mine) > 1e-6 * fabs(mine))
            fail_msg("pair %d: transformers %.9g, ctitan %.9g", i, hf, mine);
    }
}

static void test_sharded_export_loads(void **state)
{
    fx_t *fx = *state;
    const char *py;
    TU_NEED_BIN();
    TU_NEED_PY(py);
    char out[4096], args[512], dir[128];
    snprintf(dir, sizeof(dir), "%s/hf", fx->dir);
    /* the embedding and lm_head (38400 bytes) are larger than a shard: alone in theirs */
    snprintf(args, sizeof(args), "--hf %s --max-shard-size 20KB", dir);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 0);
    json_t *ix = load_json(dir, "model.safetensors.index.json");
    assert_non_null(ix);
    json_t *map = json_object_get(ix, "weight_map");
    assert_int_equal(json_object_size(map), fx->tab.n);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(ix, "metadata"), "total_size")),
                     fx->tab.total * 4);
    const char *embed = json_string_value(json_object_get(map, "model.embed_tokens.weight"));
    assert_string_equal(embed, "model-00001-of-00006.safetensors");
    json_decref(ix);
    /* the same split as huggingface_hub makes for save_pretrained */
    assert_int_equal(hf_check(fx, py, dir, "--shards 6 --max-shard-size 20000"), 0);
    /* most tensors larger than a shard: each alone, listed before the shard being filled */
    assert_int_equal(tu_rmtree(dir), 0);
    snprintf(args, sizeof(args), "--hf %s --max-shard-size 5000 --no-verify", dir);
    setenv("CTITAN_TEST_SAY_S", "0", 1); /* how far it is, said after every chunk */
    int rc = export_cli(fx, args, out, sizeof(out));
    unsetenv("CTITAN_TEST_SAY_S");
    assert_int_equal(rc, 0);
    char last[128];
    snprintf(last, sizeof(last), "ctitan: export: %.1f of %.1f GiB of weights written (",
             fx->tab.total * 4.0 / (1 << 30), fx->tab.total * 4.0 / (1 << 30));
    assert_non_null(strstr(out, last));
    assert_int_equal(hf_check(fx, py, dir, "--max-shard-size 5000"), 0);
}

static void test_bfloat16_export_loads(void **state)
{
    fx_t *fx = *state;
    const char *py;
    TU_NEED_BIN();
    TU_NEED_PY(py);
    char out[4096], args[512], dir[128];
    snprintf(dir, sizeof(dir), "%s/hf", fx->dir);
    snprintf(args, sizeof(args), "--hf %s --dtype bfloat16", dir);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 0);
    json_t *cfg = load_json(dir, "config.json");
    assert_string_equal(json_string_value(json_object_get(cfg, "torch_dtype")), "bfloat16");
    json_decref(cfg);
    struct stat st;
    char p[256];
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    assert_int_equal(stat(p, &st), 0);
    assert_true((size_t)st.st_size < fx->tab.total * 2 + 4096);
    assert_int_equal(hf_check(fx, py, dir, "--dtype bfloat16"), 0);
}

/* Nothing at DIR and no temporary folder beside it. */
static void assert_nothing_left(const fx_t *fx, const char *dir)
{
    assert_int_equal(access(dir, F_OK), -1);
    assert_int_equal(count_entries(fx->dir, "tmp-hf"), 0);
}

/* A Hugging Face tokenizer.json is copied as it is, with the tokenizer_config.json beside it,
 * and its BOS/EOS ids go into config.json and generation_config.json. */
static void test_tokenizer_json_is_copied(void **state)
{
    fx_t *fx = *state;
    const char *py;
    TU_NEED_BIN();
    TU_NEED_PY(py);
    char out[4096], args[1024], dir[128], src[512], a[1200], b[1800];
    snprintf(dir, sizeof(dir), "%s/hf", fx->dir);
    snprintf(src, sizeof(src), "%s/llama3/tokenizer.json", py);
    snprintf(args, sizeof(args), "--hf %s --tokenizer %s --no-verify", dir, src);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 0);
    snprintf(a, sizeof(a), "cmp -s %s %s/tokenizer.json", src, dir);
    assert_int_equal(system(a), 0);
    snprintf(a, sizeof(a), "%s/llama3/tokenizer_config.json", py);
    snprintf(b, sizeof(b), "cmp -s %s %s/tokenizer_config.json", a, dir);
    if (access(a, F_OK) == 0)
        assert_int_equal(system(b), 0);
    json_t *cfg = load_json(dir, "config.json"), *gen = load_json(dir, "generation_config.json");
    assert_int_equal(json_integer_value(json_object_get(cfg, "bos_token_id")), 128000);
    assert_int_equal(json_integer_value(json_object_get(cfg, "eos_token_id")), 128001);
    assert_int_equal(json_integer_value(json_object_get(gen, "bos_token_id")), 128000);
    assert_int_equal(json_integer_value(json_object_get(gen, "eos_token_id")), 128001);
    assert_true(json_is_false(json_object_get(gen, "do_sample")));
    json_decref(cfg);
    json_decref(gen);
}

/* A tokenizer_config.json beside the tokenizer.json that is not JSON: refused, naming it. */
static void test_bad_tokenizer_config_is_refused(void **state)
{
    fx_t *fx = *state;
    const char *py;
    TU_NEED_BIN();
    TU_NEED_PY(py);
    char out[4096], args[1024], dir[128], tdir[128], p[1024];
    snprintf(dir, sizeof(dir), "%s/hf", fx->dir);
    snprintf(tdir, sizeof(tdir), "%s/tok", fx->dir);
    assert_int_equal(mkdir(tdir, 0755), 0);
    snprintf(p, sizeof(p), "cp %s/llama3/tokenizer.json %s/", py, tdir);
    assert_int_equal(system(p), 0);
    snprintf(p, sizeof(p), "%s/tokenizer_config.json", tdir);
    assert_int_equal(write_raw(p, "{\"bos_token\": ", 14), 0);
    snprintf(args, sizeof(args), "--hf %s --tokenizer %s/tokenizer.json --no-verify", dir, tdir);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, p));
    assert_nothing_left(fx, dir);
}

static void test_existing_folder_is_refused(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char out[4096], args[512], dir[128], p[256];
    snprintf(dir, sizeof(dir), "%s/hf", fx->dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(p, sizeof(p), "%s/mine.txt", dir);
    assert_int_equal(write_raw(p, "keep", 4), 0);
    snprintf(args, sizeof(args), "--hf %s", dir);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "exists and is not empty"));
    assert_non_null(strstr(out, dir));
    assert_int_equal(count_entries(dir, ""), 3); /* ., .., mine.txt */
    assert_int_equal(count_entries(fx->dir, "tmp-hf"), 0);
    /* an empty folder is fine */
    assert_int_equal(unlink(p), 0);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 0);
    snprintf(p, sizeof(p), "%s/config.json", dir);
    assert_int_equal(access(p, F_OK), 0);
    /* a file */
    snprintf(p, sizeof(p), "%s/file", fx->dir);
    assert_int_equal(write_raw(p, "x", 1), 0);
    snprintf(args, sizeof(args), "--hf %s", p);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "is not a folder"));
}

static void test_unwritable_place_leaves_nothing(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char out[4096], args[1024], dir[256], p[256];
    snprintf(dir, sizeof(dir), "%s/no/such/hf", fx->dir);
    snprintf(args, sizeof(args), "--hf %s", dir);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "cannot create the temporary folder"));
    assert_nothing_left(fx, dir);
    /* a tokenizer that is neither kind fails half way: the folder goes */
    snprintf(dir, sizeof(dir), "%s/hf", fx->dir);
    snprintf(p, sizeof(p), "%s/notatokenizer.json", fx->dir);
    assert_int_equal(write_raw(p, "{\"vocab\": 1}", 12), 0);
    snprintf(args, sizeof(args), "--hf %s --tokenizer %s", dir, p);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "notatokenizer.json"));
    assert_nothing_left(fx, dir);
}

static void test_damaged_checkpoint_leaves_nothing(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char out[4096], args[512], dir[128], p[512];
    snprintf(dir, sizeof(dir), "%s/hf", fx->dir);
    snprintf(p, sizeof(p), "%s/model.bin", fx->ckpt);
    /* a byte of the last weight (lm_head), so the damage is found late, after files are written */
    assert_int_equal(tu_flip_byte(p, CKPT_DATA_HDR + (long)fx->tab.total * 4 - 8), 0);
    snprintf(args, sizeof(args), "--hf %s", dir);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "does not verify"));
    assert_nothing_left(fx, dir);
    snprintf(args, sizeof(args), "--hf %s --no-verify", dir);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "lm_head.weight"));
    assert_nothing_left(fx, dir);
}

/* The manifest's tokenizer gone: refused, naming it; --no-tokenizer exports the model alone. */
static void test_missing_tokenizer(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char out[4096], args[512], dir[128], p[256];
    snprintf(dir, sizeof(dir), "%s/hf", fx->dir);
    assert_int_equal(unlink(fx->tok), 0);
    snprintf(args, sizeof(args), "--hf %s", dir);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "model.tokenizer_path"));
    assert_non_null(strstr(out, fx->tok));
    assert_nothing_left(fx, dir);
    snprintf(args, sizeof(args), "--hf %s --no-tokenizer", dir);
    assert_int_equal(export_cli(fx, args, out, sizeof(out)), 0);
    snprintf(p, sizeof(p), "%s/tokenizer.json", dir);
    assert_int_equal(access(p, F_OK), -1);
    json_t *cfg = load_json(dir, "config.json");
    assert_true(json_is_null(json_object_get(cfg, "bos_token_id")));
    json_decref(cfg);
}

static void test_usage_errors(void **state)
{
    fx_t *fx = *state;
    TU_NEED_BIN();
    char out[4096];
    assert_int_equal(export_cli(fx, "", out, sizeof(out)), 2);
    assert_int_equal(export_cli(fx, "--hf /tmp/x --safetensors /tmp/y", out, sizeof(out)), 2);
    assert_int_equal(export_cli(fx, "--hf /tmp/x --max-shard-size lots", out, sizeof(out)), 2);
    assert_int_equal(export_cli(fx, "--hf /tmp/x --dtype float16", out, sizeof(out)), 2);
    assert_int_equal(export_cli(fx, "--safetensors /tmp/y --dtype bfloat16", out, sizeof(out)), 2);
}

/* A checkpoint of a real run (manifests/tiny.toml: two pipeline stages, two optimizer shards,
 * trained three steps on a corpus tokenized by `ctitan prep`), exported and loaded. */
static void test_trained_job_exports(void **state)
{
    fx_t *fx = *state;
    const char *py;
    TU_NEED_BIN();
    TU_NEED_PY(py);
    if (access("manifests/tiny.toml", R_OK)) {
        print_message("manifests/tiny.toml not found from here (run from the source tree): skipping\n");
        skip();
    }
    assert_int_equal(tj_setup("hfjob"), 0);
    char out[8192], extra[1024], job[64], ck[512], dir[512], cmd[4096], s[512];
    tj_name(job, sizeof(job), 'h', "job");
    snprintf(extra, sizeof(extra), "--training.steps 3 --checkpoint.enable true --checkpoint.interval 3 "
             "--model.tokenizer_path %s/data/tokenizer.bin", tj_dir);
    int rc = tj_launch("", 120, job, extra, out, sizeof(out));
    if (rc)
        print_message("%s\n", out);
    assert_int_equal(rc, 0);
    snprintf(ck, sizeof(ck), "%s/runs/%s/checkpoint/step-00000003", tj_dir, job);
    snprintf(dir, sizeof(dir), "%s/hf", tj_dir);
    snprintf(fx->ref, sizeof(fx->ref), "%s/ref.safetensors", tj_dir);
    snprintf(cmd, sizeof(cmd), "%s ckpt export %s --hf %s 2>&1 && %s ckpt export %s --safetensors %s 2>&1",
             tu_ctitan(), ck, dir, tu_ctitan(), ck, fx->ref);
    rc = tu_run(cmd, out, sizeof(out));
    print_message("%s", out);
    assert_int_equal(rc, 0);
    /* the run's tokenizer encodes a text, and the export's does the same */
    tok_t *t = NULL;
    char err[256], p[600];
    snprintf(p, sizeof(p), "%s/data/tokenizer.bin", tj_dir);
    assert_int_equal(tok_load(&t, p, err, sizeof(err)), 0);
    uint32_t ids[sizeof(sample_text)];
    size_t nt;
    assert_int_equal(tok_encode(t, (const uint8_t *)sample_text, sizeof(sample_text) - 1, ids, &nt), 0);
    tok_destroy(&t);
    snprintf(p, sizeof(p), "%s/ids.i32", tj_dir);
    assert_int_equal(write_raw(p, ids, nt * 4), 0);
    snprintf(p, sizeof(p), "%s/text.bin", tj_dir);
    assert_int_equal(write_raw(p, sample_text, sizeof(sample_text) - 1), 0);
    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python %s %s --ref %s --text %s/text.bin --ids %s/ids.i32 2>&1 | tail -4",
             py, script("hf_check.py", s, sizeof(s)), dir, fx->ref, tj_dir, tj_dir);
    rc = tu_run(cmd, out, sizeof(out));
    print_message("%s", out);
    tj_teardown();
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "hf_check: ok"));
}

/* ---- the converted tokenizer against tok_encode ---- */

static int put_record(FILE *f, const void *p, uint32_t n, size_t item)
{
    return fwrite(&n, 4, 1, f) == 1 && (!n || fwrite(p, item, n, f) == n) ? 0 : -1;
}

/* Every fortune of every file of the fortunes package (entries end at a line "%"), one
 * document each: its bytes to docs, tok_encode's tokens to ids. Returns the documents. */
static int write_fortunes(tok_t *t, FILE *docs, FILE *ids)
{
    DIR *d = opendir(FORTUNES);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d))) {
        char p[512];
        struct stat st;
        size_t l = strlen(e->d_name);
        snprintf(p, sizeof(p), "%s/%s", FORTUNES, e->d_name);
        if (lstat(p, &st) || !S_ISREG(st.st_mode) || (l > 4 && !strcmp(e->d_name + l - 4, ".dat")))
            continue;
        uint8_t *buf = malloc((size_t)st.st_size + 1);
        uint32_t *tok = malloc(((size_t)st.st_size + 1) * 4);
        FILE *f = fopen(p, "rb");
        size_t len = f ? fread(buf, 1, (size_t)st.st_size, f) : 0, nt;
        if (f)
            fclose(f);
        for (size_t i = 0; i < len;) {
            size_t j = i;
            while (j < len && !(buf[j] == '%' && (j == 0 || buf[j - 1] == '\n') && (j + 1 == len || buf[j + 1] == '\n')))
                j++;
            if (j > i) {
                assert_int_equal(tok_encode(t, buf + i, j - i, tok, &nt), 0);
                assert_int_equal(put_record(docs, buf + i, (uint32_t)(j - i), 1), 0);
                assert_int_equal(put_record(ids, tok, (uint32_t)nt, 4), 0);
                n++;
            }
            i = j + 2;
        }
        free(buf);
        free(tok);
    }
    if (d)
        closedir(d);
    return n;
}

/* The demo's tokenizer (ctitan prep on the fortunes), converted: the `tokenizers` library
 * encodes every fortune as tok_encode does, but where a run of non-ASCII letters is longer
 * than TOK_MAX_CHUNK bytes (ctitan cuts it by bytes; a regex can only count characters). */
static void test_converted_tokenizer_agrees_on_fortunes(void **state)
{
    fx_t *fx = *state;
    const char *py;
    TU_NEED_BIN();
    TU_NEED_PY(py);
    if (access(FORTUNES, F_OK)) {
        print_message("%s missing (apt-get install fortunes): skipping\n", FORTUNES);
        skip();
    }
    char cmd[2048], out[8192], p[3][256], s[512], err[512];
    snprintf(cmd, sizeof(cmd), "%s prep --out %s/fort 2>&1", tu_ctitan(), fx->dir);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    snprintf(p[0], sizeof(p[0]), "%s/fort/tokenizer.bin", fx->dir);
    json_t *tj = NULL;
    int n_dup = -1;
    assert_int_equal(hf_tok_bin_json(p[0], &tj, &n_dup, err, sizeof(err)), 0);
    snprintf(p[1], sizeof(p[1]), "%s/tokenizer.json", fx->dir);
    assert_int_equal(json_dump_file(tj, p[1], JSON_COMPACT), 0);
    json_decref(tj);

    tok_t *t = NULL;
    assert_int_equal(tok_load(&t, p[0], err, sizeof(err)), 0);
    snprintf(p[0], sizeof(p[0]), "%s/docs.bin", fx->dir);
    snprintf(p[2], sizeof(p[2]), "%s/ids.bin", fx->dir);
    FILE *docs = fopen(p[0], "wb"), *ids = fopen(p[2], "wb");
    int n = write_fortunes(t, docs, ids);
    tok_destroy(&t);
    assert_int_equal(fclose(docs) | fclose(ids), 0);
    assert_true(n > 1000);

    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python %s %s %s %s 2>&1", py, script("hf_tok_agree.py", s, sizeof(s)),
             p[1], p[0], p[2]);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    print_message("merges making an earlier token's bytes: %d\n%s", n_dup, out);
    json_error_t je;
    json_t *r = json_loads(out, 0, &je);
    assert_non_null(r);
    double docs_n = (double)json_integer_value(json_object_get(r, "docs")) -
                    (double)json_integer_value(json_object_get(r, "not_utf8"));
    double agree = (double)json_integer_value(json_object_get(r, "docs_agree"));
    assert_int_equal(json_integer_value(json_object_get(r, "roundtrip_fail")), 0);
    print_message("documents encoded alike: %.0f of %.0f (%.3f%%)\n", agree, docs_n, 100 * agree / docs_n);
    assert_true(agree >= 0.999 * docs_n);
    json_decref(r);
}

/* The cases the pre-split regex must get right, each a document: runs longer than
 * TOK_MAX_CHUNK of every class, whitespace runs before words, control bytes, DEL; all alike,
 * but the documented difference, a run of non-ASCII letters longer than TOK_MAX_CHUNK bytes. */
static void test_converted_tokenizer_hard_cases(void **state)
{
    fx_t *fx = *state;
    const char *py;
    TU_NEED_PY(py);
    static char cases[16][600];
    int n = 0;
    memset(cases[n], '-', 300), n++;                      /* other, cut at 128 */
    cases[n][0] = ' ', memset(cases[n] + 1, 'a', 300), n++; /* " word" cut at 128 with its space */
    memset(cases[n], '7', 257), n++;                      /* digits */
    memset(cases[n], ' ', 200), strcpy(cases[n] + 200, "x"), n++; /* spaces, the last to the word */
    memset(cases[n], ' ', 128), strcpy(cases[n] + 128, "x"), n++;
    memset(cases[n], ' ', 129), strcpy(cases[n] + 129, "x"), n++;
    memset(cases[n], '\n', 130), strcpy(cases[n] + 130, "  \t \n  word  "), n++;
    strcpy(cases[n++], "a  b\t\tc \n d\r\n\x0b\x0c e\x01\x02\x7f f 12ab!! ?x 3.14 caf\xc3\xa9  ");
    strcpy(cases[n++], " \xe2\x80\x94 \xf0\x9f\x98\x80x \xe4\xb8\xad\xe6\x96\x87 end ");
    strcpy(cases[n++], " ");
    strcpy(cases[n++], "  ");
    int known = n; /* 43 CJK characters: 129 bytes, one chunk in the regex, two in ctitan */
    for (int i = 0; i < 43; i++)
        memcpy(cases[n] + 3 * i, "\xe4\xb8\xad", 3);
    n++;
    char err[512], p[3][256], cmd[2048], out[8192], s[512], cjk[256];
    /* the known difference shows only with merges of the bytes of the character cut in two */
    snprintf(cjk, sizeof(cjk), "%s/cjk.bin", fx->dir);
    tok_t *t = NULL;
    char train[128] = "";
    for (int i = 0; i < 20; i++) /* merges inside the character: (e4, b8), then (e4b8, ad) */
        strcat(train, " \xe4\xb8\xad");
    assert_int_equal(tok_train(&t, (const uint8_t *)train, strlen(train), 258, err, sizeof(err)), 0);
    assert_int_equal(tok_save(t, cjk, err, sizeof(err)), 0);
    tok_destroy(&t);
    for (int k = 0; k < 2; k++) { /* the ones alike, then the known difference */
        const char *bin = k ? cjk : fx->tok;
        json_t *tj = NULL;
        int n_dup;
        assert_int_equal(hf_tok_bin_json(bin, &tj, &n_dup, err, sizeof(err)), 0);
        snprintf(p[1], sizeof(p[1]), "%s/tokenizer.json", fx->dir);
        assert_int_equal(json_dump_file(tj, p[1], JSON_COMPACT), 0);
        json_decref(tj);
        assert_int_equal(tok_load(&t, bin, err, sizeof(err)), 0);
        snprintf(p[0], sizeof(p[0]), "%s/docs.bin", fx->dir);
        snprintf(p[2], sizeof(p[2]), "%s/ids.bin", fx->dir);
        FILE *docs = fopen(p[0], "wb"), *ids = fopen(p[2], "wb");
        for (int i = k ? known : 0; i < (k ? n : known); i++) {
            uint32_t tok[600];
            size_t len = strlen(cases[i]), nt;
            assert_int_equal(tok_encode(t, (const uint8_t *)cases[i], len, tok, &nt), 0);
            assert_int_equal(put_record(docs, cases[i], (uint32_t)len, 1), 0);
            assert_int_equal(put_record(ids, tok, (uint32_t)nt, 4), 0);
        }
        assert_int_equal(fclose(docs) | fclose(ids), 0);
        snprintf(cmd, sizeof(cmd), "%s/venv/bin/python %s %s %s %s 2>&1", py,
                 script("hf_tok_agree.py", s, sizeof(s)), p[1], p[0], p[2]);
        assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
        print_message("%s", out);
        json_error_t je;
        json_t *r = json_loads(out, 0, &je);
        assert_non_null(r);
        assert_int_equal(json_integer_value(json_object_get(r, "roundtrip_fail")), 0);
        assert_int_equal(json_integer_value(json_object_get(r, "docs_agree")), k ? 0 : known);
        json_decref(r);
        tok_destroy(&t);
    }
}

/* A tokenizer.bin whose merges make the same bytes twice ("ab"+"c" and "a"+"bc"): Hugging
 * Face's vocabulary keeps the first id, the conversion says how many, and the library loads it
 * and encodes as ctitan does (tok_encode always reaches "abc" through "ab"). */
static void test_converted_tokenizer_with_duplicate_bytes(void **state)
{
    fx_t *fx = *state;
    const char *py;
    TU_NEED_PY(py);
    static const uint32_t merges[] = {'a', 'b', 256, 'c', 'b', 'c', 'a', 258};
    uint8_t file[32 + sizeof(merges)];
    uint32_t head[4] = {TOK_VERSION, 256 + 4, TOK_SPLIT_RULE, TOK_MAX_CHUNK};
    uint64_t sum = XXH64(merges, sizeof(merges), 0);
    memcpy(file, TOK_MAGIC, 8);
    memcpy(file + 8, head, 16);
    memcpy(file + 24, &sum, 8);
    memcpy(file + 32, merges, sizeof(merges));
    char bin[256], p[3][256], err[512], cmd[2048], out[4096], s[512];
    snprintf(bin, sizeof(bin), "%s/dup.bin", fx->dir);
    assert_int_equal(write_raw(bin, file, sizeof(file)), 0);
    json_t *tj = NULL;
    int n_dup = 0;
    assert_int_equal(hf_tok_bin_json(bin, &tj, &n_dup, err, sizeof(err)), 0);
    assert_int_equal(n_dup, 1);
    json_t *vocab = json_object_get(json_object_get(tj, "model"), "vocab");
    assert_int_equal(json_integer_value(json_object_get(vocab, "abc")), 257);
    assert_int_equal(json_object_size(vocab), 259);
    snprintf(p[1], sizeof(p[1]), "%s/tokenizer.json", fx->dir);
    assert_int_equal(json_dump_file(tj, p[1], JSON_COMPACT), 0);
    json_decref(tj);

    static const char *const docs_text[] = {"abc", "bc abc cab", "aabbcc abcabc"};
    tok_t *t = NULL;
    assert_int_equal(tok_load(&t, bin, err, sizeof(err)), 0);
    snprintf(p[0], sizeof(p[0]), "%s/docs.bin", fx->dir);
    snprintf(p[2], sizeof(p[2]), "%s/ids.bin", fx->dir);
    FILE *docs = fopen(p[0], "wb"), *ids = fopen(p[2], "wb");
    for (int i = 0; i < 3; i++) {
        uint32_t tok[32];
        size_t len = strlen(docs_text[i]), nt;
        assert_int_equal(tok_encode(t, (const uint8_t *)docs_text[i], len, tok, &nt), 0);
        assert_int_equal(put_record(docs, docs_text[i], (uint32_t)len, 1), 0);
        assert_int_equal(put_record(ids, tok, (uint32_t)nt, 4), 0);
    }
    tok_destroy(&t);
    assert_int_equal(fclose(docs) | fclose(ids), 0);
    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python %s %s %s %s 2>&1", py, script("hf_tok_agree.py", s, sizeof(s)),
             p[1], p[0], p[2]);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    print_message("%s", out);
    json_error_t je;
    json_t *r = json_loads(out, 0, &je);
    assert_non_null(r);
    assert_int_equal(json_integer_value(json_object_get(r, "docs_agree")), 3);
    json_decref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_export_loads_in_transformers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_json_describes_the_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rope_scaling_means_the_same_in_transformers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_export_loads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bfloat16_export_loads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokenizer_json_is_copied, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_tokenizer_config_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_existing_folder_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unwritable_place_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_checkpoint_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_tokenizer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_usage_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trained_job_exports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_converted_tokenizer_agrees_on_fortunes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_converted_tokenizer_hard_cases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_converted_tokenizer_with_duplicate_bytes, setup, teardown),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
