/* Export of a checkpoint as a Hugging Face model folder, the one `ctitan ckpt export --hf DIR`
 * writes and `LlamaForCausalLM.from_pretrained(DIR)` / `AutoTokenizer.from_pretrained(DIR)`
 * load with no arguments:
 *   config.json                   LlamaForCausalLM: the model's shape (hf_config_json)
 *   generation_config.json        bos/eos token ids when known, do_sample false
 *   model.safetensors             the weights (fp32 master copies, or bf16 rounded to nearest
 *                                 even), or above max_shard_bytes model-0000K-of-0000N.safetensors
 *                                 and model.safetensors.index.json, split as transformers splits
 *   tokenizer.json ...            the run's tokenizer: a Hugging Face tokenizer.json copied with
 *                                 the tokenizer_config.json and special_tokens_map.json beside
 *                                 it, or ctitan's tokenizer.bin converted (hf_tok_bin_json)
 * ctitan's parameter names and layouts are Hugging Face Llama's (kernels/params.h, rotary
 * layout included), so the tensors go out as they are stored. */
#ifndef CTITAN_HF_EXPORT_H
#define CTITAN_HF_EXPORT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/config.h"

#define HF_DEFAULT_SHARD 5000000000ull /* transformers' max_shard_size "5GB" */

/* config.json of a LlamaForCausalLM with cfg's shape (validated), "torch_dtype" torch_dtype
 * ("float32", "bfloat16"), bos/eos token ids (< 0: unknown, written as null). rope_scaling is
 * null, or {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings} when cfg->rope_scaling_factor > 0; intermediate_size is
 * config_ffn_hidden(cfg); tie_word_embeddings, attention_bias, mlp_bias false. The import
 * (checkpointd/hf_config.c) reads the same keys back. Returns a new reference, NULL on ENOMEM. */
json_t *hf_config_json(const model_config_t *cfg, const char *torch_dtype, int bos_id, int eos_id);
/* hf_config_json written durably to path (util_afile), indented and key-sorted as transformers
 * writes it. Returns 0 or -errno with the file in err. */
int hf_config_write(const model_config_t *cfg, const char *torch_dtype, int bos_id, int eos_id, const char *path,
                    char *err, size_t errlen);

typedef struct {
    uint64_t max_shard_bytes; /* 0: HF_DEFAULT_SHARD */
    int bf16;                 /* weights as BF16 (round to nearest even) instead of F32 */
    const char *tokenizer;    /* NULL: the manifest's model.tokenizer_path */
    int no_tokenizer;         /* no tokenizer files (AutoTokenizer will not load the folder) */
} hf_export_opts_t;

/* Writes the folder dir from checkpoint ckpt_path (every weight chunk checked as it is read;
 * a full check is the caller's, ckpt_verify). Atomic and durable: everything goes into a
 * temporary folder beside dir (.NAME.tmp-hf.PID), each file fsynced, then the folder renamed
 * to dir and the parent fsynced; on failure nothing is left. An existing dir that is not an
 * empty folder is refused (-EEXIST naming it). Notes (a converted tokenizer's duplicates) go
 * to log (may be NULL). Returns 0 or -errno with the reason (the file, the tensor) in err. */
int hf_export(const char *ckpt_path, const char *dir, const hf_export_opts_t *o, FILE *log, char *err,
              size_t errlen);

/* ---- tokenizers (hf_export_tok.c) ---- */

/* Whether the file at path starts with ctitan's tokenizer.bin magic: 1 yes, 0 no, -errno. */
int hf_tok_is_bin(const char *path);
/* ctitan's tokenizer.bin at path as an equivalent Hugging Face tokenizer.json: a byte-level BPE
 * (vocab as GPT-2's byte-to-unicode strings, token id = ctitan's id, merges in rank order), a
 * Split pre-tokenizer whose regex reproduces tok_chunk_len (exact but for letter runs with
 * non-ASCII characters longer than TOK_MAX_CHUNK bytes: a regex counts characters, not bytes)
 * then ByteLevel without its own regex, a ByteLevel decoder. *n_dup gets the merges whose bytes
 * an earlier token already has (Hugging Face's vocabulary maps bytes to one id: such tokens
 * encode as the earlier id). Returns a new reference in *out, or -errno with err. */
int hf_tok_bin_json(const char *path, json_t **out, int *n_dup, char *err, size_t errlen);
/* Puts the tokenizer files for src (a tokenizer.json or a tokenizer.bin) into folder dir and
 * finds the BOS/EOS ids (-1 when unknown). Files are written with hf_put_file. */
int hf_tok_export(const char *src, const char *dir, int *bos_id, int *eos_id, FILE *log, char *err,
                  size_t errlen);

/* Creates dir/name (which must not exist) holding len bytes, fsynced. 0 or -errno with err. */
int hf_put_file(const char *dir, const char *name, const void *buf, size_t len, char *err, size_t errlen);
/* json as dir/name, indented by 2 with sorted keys (flags 0) or as given, and a newline. */
int hf_put_json(const char *dir, const char *name, const json_t *json, size_t flags, char *err, size_t errlen);

#endif
