/* `ctitan ckpt import HF_DIR --out FOLDER [--manifest M.toml]`: a Hugging Face Llama folder as a
 * ctitan checkpoint of step 0 (checkpointd/hf_import.h), which a run then loads with
 * checkpoint.load = FOLDER/step-00000000. Called by cmd_ckpt (tools/cmd_ckpt.c).
 * Exit status: 0 imported, 1 refused or failed (nothing written), 2 bad usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpointd/hf_import.h"
#include "tools/cmds.h"

static const char usage_import[] =
    "usage: ctitan ckpt import HF_DIR --out FOLDER [--manifest M.toml]\n"
    "Imports a Hugging Face Llama (HF_DIR/config.json of LlamaForCausalLM, and model.safetensors\n"
    "or the shards of model.safetensors.index.json, in F32, BF16 or F16) as the checkpoint\n"
    "FOLDER/step-00000000: fp32 master weights, the optimizer state zero (a fresh start). The\n"
    "model's shape comes from config.json; the rest of the run's manifest (the optimizer above\n"
    "all) from M.toml when given, where a [model] key that disagrees with config.json is an\n"
    "error. Tied embeddings are imported untied (lm_head starts as a copy of embed_tokens).\n"
    "Anything ctitan cannot run (another architecture, biases, a rope_scaling other than\n"
    "llama3) is refused by name, and a refused import writes nothing. An existing\n"
    "FOLDER/step-00000000 is never written over.\n"
    "A job can do the same itself: checkpoint.initial_load_path = \"HF_DIR\" with\n"
    "checkpoint.initial_load_in_hf = true.\n";

int cmd_ckpt_import(int argc, char **argv)
{
    const char *hf = NULL, *out = NULL, *man = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_import, stdout);
            return 0;
        }
        const char **slot = !strcmp(a, "--out") ? &out : !strcmp(a, "--manifest") ? &man : NULL;
        if (slot && i + 1 < argc)
            *slot = argv[++i];
        else if (a[0] != '-' && !hf)
            hf = a;
        else {
            fprintf(stderr, "ctitan ckpt import: unexpected '%s'\n\n%s", a, usage_import);
            return 2;
        }
    }
    if (!hf || !out) {
        fprintf(stderr, "ctitan ckpt import: needs HF_DIR and --out FOLDER\n\n%s", usage_import);
        return 2;
    }
    static manifest_t m;
    char err[2048], path[4096];
    if ((size_t)snprintf(path, sizeof(path), "%s/step-00000000", out) < sizeof(path) && access(path, F_OK) == 0) {
        fprintf(stderr, "ctitan ckpt import: %s exists: it is not written over; remove it or give another --out\n",
                path);
        return 1;
    }
    manifest_defaults(&m);
    int rc = man ? manifest_load(&m, man, err, sizeof(err)) : 0;
    if (!rc)
        rc = hf_import_manifest(&m, hf, err, sizeof(err));
    if (!rc && !man && m.seq_len > m.model.max_seq_len) /* the default's training.seq_len */
        m.seq_len = m.model.max_seq_len;
    if (!rc)
        rc = manifest_validate(&m, err, sizeof(err));
    if (!rc)
        rc = hf_import(hf, &m, out, stderr, path, sizeof(path), err, sizeof(err));
    if (rc) {
        fprintf(stderr, "ctitan ckpt import: %s\n", err);
        return 1;
    }
    printf("imported %s as %s (step 0: dim %d, %d layers, %d heads, %d kv heads, FFN %d, vocabulary %d)\n", hf, path,
           m.model.dim, m.model.n_layers, m.model.n_heads, m.model.n_kv_heads, config_ffn_hidden(&m.model),
           m.model.vocab_size);
    return 0;
}
