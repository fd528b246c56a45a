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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/hf_export.h"
#include "checkpointd/safetensors.h"
#include "checkpointd/writer.h"
#include "kernels/cpu/model.h"
#include "kernels/params.h"
#include "stages/data/tokenizer.h"
#include "stages/job/manifest.h"
#include "tests/testutil.h"

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
    snprintf(rel, sizeof(rel), "tests/%s", name);
    return tu_built("..", rel, buf, n);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_export_loads_in_transformers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
