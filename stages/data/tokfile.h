/* Token shard files: what `ctitan prep` writes and the loader reads. ctitan's own format plus
 * the llm.c formats, so shards made by llm.c's dev/data scripts can be trained on directly.
 *
 * ctitan format, version 1 (all integers little-endian):
 *   offset  0  char[8]  magic "CTTOKENS"
 *   offset  8  uint32   version (1)
 *   offset 12  uint32   dtype: 2 = uint16 tokens, 4 = uint32 tokens (bytes per token);
 *                        the writer picks uint16 when vocab_size <= 65536
 *   offset 16  uint64   token count
 *   offset 24  uint32   vocab_size of the tokenizer that made the tokens (every id is below it)
 *   offset 28  uint32   reserved, 0
 *   offset 32  tokens, count * dtype bytes, nothing after them
 * llm.c format: 256 int32 header; [0] magic, [1] version, [2] token count; then the tokens:
 *   magic 20240520 version 1 = GPT-2, uint16 tokens; magic 20240801 version 7 = Llama-3, uint32.
 *
 * Functions return 0 or a negative errno and fill err (if given) with a message that names the
 * file and the problem; nothing here exits. */
#ifndef CTITAN_TOKFILE_H
#define CTITAN_TOKFILE_H

#include <stddef.h>
#include <stdint.h>

#define TOKFILE_MAGIC "CTTOKENS"
#define TOKFILE_VERSION 1u
#define TOKFILE_HEADER_BYTES 32
#define TOKFILE_LLMC_MAGIC 20240520
#define TOKFILE_LLMC_VERSION 1
#define TOKFILE_LLMC_LLAMA3_MAGIC 20240801
#define TOKFILE_LLMC_LLAMA3_VERSION 7
#define TOKFILE_LLMC_HEADER_BYTES (256 * 4)

typedef enum {
    TOKFILE_FORMAT_CTITAN = 1,
    TOKFILE_FORMAT_LLMC = 2,
} tokfile_format_t;

typedef struct tokfile tokfile_t;

/* Maps `path` read-only and validates the header, the file size and (when vocab_size > 0)
 * that every token id is below vocab_size; ctitan files are also checked against the
 * vocab_size in their own header. The caller owns *out and frees it with tokfile_close. */
int tokfile_open(tokfile_t **out, const char *path, int vocab_size, char *err, size_t errlen);
void tokfile_close(tokfile_t **tf);

size_t tokfile_count(const tokfile_t *tf);
/* vocab_size from the header; 0 for llm.c files, whose header does not record it */
int tokfile_vocab_size(const tokfile_t *tf);
tokfile_format_t tokfile_format(const tokfile_t *tf);
const char *tokfile_path(const tokfile_t *tf);

/* Token i; i must be < tokfile_count (not checked: this is the loader's inner loop). */
uint32_t tokfile_get(const tokfile_t *tf, size_t i);
/* Copies tokens [start, start + n) into dst; -ERANGE if the range passes the end. */
int tokfile_read(const tokfile_t *tf, size_t start, size_t n, int32_t *dst);

/* Writes n tokens (each < vocab_size) to `path` in the ctitan format, durably and atomically:
 * a temp file beside it, fsync, rename, fsync of the directory. On failure nothing is left
 * behind and an existing `path` is untouched. */
int tokfile_write(const char *path, const uint32_t *tok, size_t n, int vocab_size, char *err,
                  size_t errlen);

/* The same durable, atomic write for any byte buffers (header + body); tok_save uses it.
 * Either pointer may be NULL with length 0. */
int tokfile_write_bytes(const char *path, const void *a, size_t alen, const void *b, size_t blen,
                        char *err, size_t errlen);

#endif
