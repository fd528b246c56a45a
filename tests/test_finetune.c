/* manifests/finetune.toml end to end, as README "Fine-tuning a Hugging Face model" tells a user
 * to run it: a Hugging Face folder written by transformers (bf16, tied embeddings, its own
 * tokenizer.json; tests/hf_finetune.py) and JSON Lines text (one file gzip-compressed) train
 * with real processes through `ctitan launch` (the manifest as it is, only its paths and sizes
 * overridden on the command line), the checkpoint folder is exported with `ctitan ckpt export
 * --hf`, and transformers' from_pretrained / AutoTokenizer load the export with no other
 * arguments: greedy generation from a text prompt there (stopping at the EOS of the exported
 * generation_config.json) gives the ids `ctitan generate` gives from the same folder. Skips, saying why, without the Python of tools/pydeps.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("finetune"); }
static int teardown(void **state) { return tj_teardown(); }

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
        s[--n] = 0;
}

/* The mean of the losses of steps [from, to] of job's metrics. */
static double mean_loss(const tj_metrics_t *mt, int from, int to)
{
    double sum = 0;
    int n = 0;
    for (int i = 0; i < mt->n; i++)
        if (mt->step[i] >= from && mt->step[i] <= to)
            sum += atof(mt->loss[i]), n++;
    assert_true(n > 0);
    return sum / n;
}

static void test_finetune_manifest_trains_an_imported_model_on_jsonl_and_exports_for_transformers(void **state)
{
    const char *py;
    TU_NEED_PY(py);
    TU_NEED_BIN();
    static char out[1 << 16];
    char cmd[4096], job[32], model[300], ours[4096], theirs[4096];
    snprintf(cmd, sizeof(cmd), "%s/venv/bin/python tests/hf_finetune.py %s 2>&1", py, tj_dir);
    if (tu_run(cmd, out, sizeof(out)))
        fail_msg("%s:\n%s", cmd, out);
    snprintf(model, sizeof(model), "%s/model", tj_dir);
    tj_name(job, sizeof(job), 'f', "ft");
    snprintf(cmd, sizeof(cmd),
             "timeout 120 %s launch manifests/finetune.toml --job.name %s --job.dump_folder %s/runs/%s "
             "--metrics.file %s/%s.jsonl --metrics.peak_tflops 1 --checkpoint.initial_load_path %s "
             "--model.tokenizer_path %s/tokenizer.json '--loader.command=build/bin/ctitan-loader-text --tokenizer "
             "%s/tokenizer.json --source \"%s/data/*.jsonl*\" --field text' --training.steps 40 --training.seq_len 64 "
             "--optimizer.lr 3e-3 --lr_scheduler.warmup_steps 4 2>&1",
             tu_ctitan(), job, tj_dir, job, tj_dir, job, model, model, model, tj_dir);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc || !strstr(out, "starting from the Hugging Face Llama") || !strstr(out, "imported untied") ||
        !strstr(out, "checkpoint: step 40 saved"))
        fail_msg("status %d:\n%s", rc, out);
    static tj_metrics_t mt;
    tj_parse_metrics(job, &mt);
    assert_int_equal(mt.n, 40);
    double first = mean_loss(&mt, 1, 5), last = mean_loss(&mt, 36, 40);
    print_message("fine-tuning: mean loss %.4f over steps 1-5, %.4f over steps 36-40\n", first, last);
    assert_true(last < first);

    /* the checkpoint folder exported (its newest), and read back by transformers */
    snprintf(cmd, sizeof(cmd), "%s ckpt export %s/runs/%s/checkpoint --hf %s/export 2>&1", tu_ctitan(), tj_dir, job,
             tj_dir);
    if (tu_run(cmd, out, sizeof(out)) || !strstr(out, "step-00000040"))
        fail_msg("%s:\n%s", cmd, out);
    const char *prompt = "A fool and his money";
    snprintf(cmd, sizeof(cmd), "%s generate %s/export --prompt '%s' --no-bos --temperature 0 --max-tokens 16 --ids "
             "2>/dev/null", tu_ctitan(), tj_dir, prompt);
    assert_int_equal(tu_run(cmd, ours, sizeof(ours)), 0);
    snprintf(cmd, sizeof(cmd),
             "%s/venv/bin/python -c 'import sys, transformers as t\n"
             "tok = t.AutoTokenizer.from_pretrained(sys.argv[1]); m = t.LlamaForCausalLM.from_pretrained(sys.argv[1])\n"
             "ids = tok(sys.argv[2], return_tensors=\"pt\").input_ids\n"
             "o = m.generate(ids, attention_mask=ids * 0 + 1, max_new_tokens=16, do_sample=False, "
             "pad_token_id=0, synced_gpus=False)\n"
             "print(\" \".join(str(int(x)) for x in o[0, ids.shape[1]:]))' %s/export '%s' 2>/dev/null",
             py, tj_dir, prompt);
    if (tu_run(cmd, theirs, sizeof(theirs)))
        fail_msg("transformers could not load or run %s/export:\n%s", tj_dir, theirs);
    trim(ours), trim(theirs);
    print_message("greedy after \"%s\": ctitan %s; transformers %s\n", prompt, ours, theirs);
    assert_string_equal(ours, theirs);
    tj_assert_clean(job);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finetune_manifest_trains_an_imported_model_on_jsonl_and_exports_for_transformers),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
