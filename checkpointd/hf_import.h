/* Importing a Hugging Face Llama (config.json + safetensors, hf_config.h and st_read.h) as a
 * ctitan checkpoint of step 0 (`ctitan ckpt import`), or straight into a job's staging segment
 * for its checkpoint.initial_load_path with initial_load_in_hf (restore.h).
 * ctitan's parameter names and layouts are Hugging Face's (kernels/params.h, rotary layout
 * included): the tensors are copied, widened to fp32 (F32 bit for bit), not permuted. The
 * optimizer state is zero: AdamW's fresh start. Tied embeddings (tie_word_embeddings, Llama
 * 3.2) are imported untied: lm_head.weight starts as a copy of model.embed_tokens.weight
 * (ctitan's pipeline keeps the head on the last stage, the embedding on the first) and train
 * apart from there on. Returns 0 or -errno with the reason in err; nothing exits. */
#ifndef CTITAN_HF_IMPORT_H
#define CTITAN_HF_IMPORT_H

#include <stddef.h>
#include <stdio.h>

#include "stages/job/manifest.h"

/* HF_DIR/config.json read and its shape taken into m (manifest_take_model: an explicit [model]
 * key that disagrees is -EINVAL naming both); the caller then validates m. */
int hf_import_manifest(manifest_t *m, const char *hf_dir, char *err, size_t errlen);

/* Writes folder/step-00000000 (replacing one there) from HF_DIR for the run of manifest m,
 * whose model must be config.json's (hf_import_manifest) and whose optimizer names the state
 * arrays; the checkpoint stores m's manifest. Every tensor is checked before anything is
 * written (each the model needs present with its shape and dtype F32, BF16 or F16, no other
 * tensor but rotary_emb.inv_freq buffers, which are skipped), and a failure later leaves no
 * checkpoint (checkpointd/writer.h). Notes (tied embeddings, skipped buffers) go to log (may be
 * NULL); path gets the checkpoint's directory. */
int hf_import(const char *hf_dir, const manifest_t *m, const char *folder, FILE *log, char *path, size_t pathlen,
              char *err, size_t errlen);

/* HF_DIR read straight into the arrays of a training state of step 0 (a job's staging
 * segment: checkpoint.initial_load_path with initial_load_in_hf, restore.c), with nothing
 * written to disk: arrays[0], the master weights in kernels/params.h's flat order, from the
 * safetensors (the gaps between tensors zero), every other of the n_arrays arrays zero (the
 * optimizer's fresh start), each of m's parameter count; the same bits as hf_import's
 * checkpoint loaded, after the same checks. A failure leaves the arrays partly written. A long
 * read says on log how far it is (util_say_s: a large model's folder takes minutes), as
 * hf_import does. */
int hf_load_state(const char *hf_dir, const manifest_t *m, float *const *arrays, int n_arrays, FILE *log,
                  char *err, size_t errlen);

/* The whole model of HF_DIR as fp32 in kernels/params.h's flat order, for inference (`ctitan
 * generate`): *cfg from config.json, *w (malloc'ed, caller frees) of *n floats; the tensors are
 * checked as hf_import checks them, and a tied lm_head is a copy of the embedding. */
int hf_read_weights(const char *hf_dir, model_config_t *cfg, float **w, size_t *n, FILE *log, char *err,
                    size_t errlen);

#endif
