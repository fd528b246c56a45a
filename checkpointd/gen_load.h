/* Weights for inference (`ctitan generate`): the fp32 model tensors of a ctitan checkpoint,
 * the model's shape from the manifest inside it, or a Hugging Face folder's (config.json and
 * safetensors, read as the import reads them: checkpointd/hf_import.h). */
#ifndef CTITAN_GEN_LOAD_H
#define CTITAN_GEN_LOAD_H

#include <stddef.h>

#include "checkpointd/hf_config.h"
#include "kernels/config.h"

#define GEN_PATH_MAX 512

typedef struct {
    model_config_t cfg;     /* validated */
    float *w;               /* (params total) the whole model, kernels/params.h order (owned) */
    size_t n;               /* floats in w */
    char source[GEN_PATH_MAX];         /* the checkpoint directory (or Hugging Face folder) read */
    char tokenizer_path[GEN_PATH_MAX]; /* the source's tokenizer ("" = none named) */
    int eos[HF_EOS_MAX];    /* the ids a Hugging Face folder ends a generation with (hf_eos_ids) */
    int n_eos;              /* how many: none from a ctitan checkpoint */
} gen_model_t;

/* Loads from path:
 *   a checkpoint (a step-N directory, or any directory holding an index): its weights, each
 *     chunk checked (ckpt_read), the fp32 master copy where the backend kept one, and the shape
 *     of the manifest inside it; tokenizer_path is that manifest's model.tokenizer_path;
 *   a checkpoint folder (step-N directories): the newest checkpoint in it whose files are all
 *     there and whose weights load (each chunk checked as it is read; a damaged one is passed
 *     over, said on stderr);
 *   a Hugging Face folder (config.json): config.json's shape, its safetensors weights (a tied
 *     lm_head a copy of the embedding), tokenizer_path its tokenizer.json when there is one,
 *     eos the end-of-text ids of its generation_config.json (else config.json).
 * Returns 0, or -errno with the reason naming the path (and the tensor or key at fault) in err;
 * nothing is left allocated then. */
int gen_load_weights(const char *path, gen_model_t *out, char *err, size_t errlen);
void gen_model_free(gen_model_t *m);

#endif
