/* Byte-level BPE tokenizer: trained by `ctitan prep` on a text corpus, used to encode text
 * into token shards (stages/data/tokfile.h) and to decode sampled tokens back into bytes.
 *
 * Tokens 0..255 are the single bytes; token 256 + r is merge r, the pair (a, b) of earlier
 * tokens, in rank order. Text is first cut into chunks, GPT-2 style but over ASCII classes
 * (bytes >= 0x80 count as letters so UTF-8 words stay whole): an optional single leading
 * space plus a run of letters, of digits, or of other non-space bytes; or a run of whitespace
 * that leaves its last space to the word after it. Chunks longer than TOK_MAX_CHUNK bytes are
 * cut, which bounds the per-chunk encoding cost. Merges never cross a chunk boundary.
 * Training picks the most frequent adjacent pair each round; ties go to the pair with the
 * smallest (a, b), so the same corpus always gives the same merges.
 *
 * File format (tokenizer.bin), version 1, integers little-endian:
 *   offset  0  char[8]  magic "CTTOKBPE"
 *   offset  8  uint32   version (1)
 *   offset 12  uint32   vocab_size (256 + number of merges)
 *   offset 16  uint32   pre-split rule (1 = the rule above)
 *   offset 20  uint32   TOK_MAX_CHUNK the file was trained with
 *   offset 24  uint64   XXH64 (seed 0) of the merge table below
 *   offset 32  uint32[2 * (vocab_size - 256)]  merges: a, b for ranks 0, 1, ...
 *               (each a, b < 256 + rank); nothing after them
 */
#ifndef CTITAN_TOKENIZER_H
#define CTITAN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define TOK_MAGIC "CTTOKBPE"
#define TOK_VERSION 1u
#define TOK_SPLIT_RULE 1u
#define TOK_MAX_CHUNK 128
#define TOK_MIN_VOCAB 257
#define TOK_MAX_VOCAB (1 << 20)

typedef struct tok tok_t;

/* Trains on text[0..n) to exactly vocab_size tokens. Fails with -EINVAL (and says so in err)
 * when vocab_size is out of [TOK_MIN_VOCAB, TOK_MAX_VOCAB] or the corpus runs out of pairs
 * to merge before reaching it. The caller owns *out (tok_destroy). */
int tok_train(tok_t **out, const uint8_t *text, size_t n, int vocab_size, char *err,
              size_t errlen);
/* Durable and atomic (tokfile_write_bytes). */
int tok_save(const tok_t *t, const char *path, char *err, size_t errlen);
/* Checks magic, version, split rule, sizes, checksum and merge ids; errors name the file.
 * A Hugging Face tokenizer.json (the file begins with '{') is read as well: a byte-level BPE
 * encoded token for token as the `tokenizers` library does (stages/data/hftok.c; what it
 * refuses, by name: other models, normalizers, pre-tokenizer regexes). Its BOS and EOS come
 * from the tokenizer_config.json beside it when there is one. A folder (a Hugging Face
 * model's) stands for its tokenizer.json. tok_save then writes the tokenizer.json text back
 * out, and tok_merge gives its merges as ids. */
int tok_load(tok_t **out, const char *path, char *err, size_t errlen);
#define TOK_MAX_JSON (1u << 30)
void tok_destroy(tok_t **t);

int tok_vocab_size(const tok_t *t);
/* Merge `rank` (0-based; the token it makes is 256 + rank). -ERANGE if out of range. */
int tok_merge(const tok_t *t, int rank, uint32_t *a, uint32_t *b);

/* Encodes text[0..n) into out, which must hold n tokens (never more tokens than bytes);
 * *nout gets the count. Any bytes are fine (NUL, invalid UTF-8, empty). Remembers the
 * encoding of each chunk it has seen, so it mutates t: do not encode with one tokenizer
 * from two threads at once. Returns 0 or -ENOMEM, or -E2BIG where n tokens are too few
 * (only a tokenizer.json with a prefix space: see tok_max_tokens). */
int tok_encode(tok_t *t, const uint8_t *text, size_t n, uint32_t *out, size_t *nout);
/* The most tokens n bytes may encode to: n, except for a tokenizer.json whose ByteLevel
 * pre-tokenizer adds a prefix space (2n). tok_encode_cap takes an out of cap tokens and fails
 * with -E2BIG rather than write past it; tok_encode is tok_encode_cap with cap n. */
size_t tok_max_tokens(const tok_t *t, size_t n);
int tok_encode_cap(tok_t *t, const uint8_t *text, size_t n, uint32_t *out, size_t cap, size_t *nout);
/* Decodes n tokens into a malloc'ed buffer (*out, caller frees; *nout bytes). -EINVAL if a
 * token id is >= vocab_size, -ENOMEM. */
int tok_decode(const tok_t *t, const uint32_t *tok, size_t n, uint8_t **out, size_t *nout);
/* (A tokenizer.json's added tokens decode to their content; an id no token has is -EINVAL.) */
/* The bytes of one token (pointer into t, valid until tok_destroy); NULL if id is invalid. */
const uint8_t *tok_token_bytes(const tok_t *t, uint32_t id, size_t *len);

/* The file name a tokenizer's format is kept under: "tokenizer.json" for a Hugging Face one (tok_save
 * writes its JSON back), "tokenizer.bin" for ctitan's own. */
const char *tok_file_name(const tok_t *t);
/* The id of an added (special) token by its exact text, e.g. "<|end_of_text|>"; -1 when the
 * tokenizer has no such token (a tokenizer.bin has none). */
int tok_token_id(const tok_t *t, const char *text);
/* The tokens a document begins and ends with in training data (torchtitan's BOS and EOS), or -1
 * when the tokenizer has none. */
int tok_bos(const tok_t *t);
int tok_eos(const tok_t *t);

/* Length of the chunk that starts text[0..n) (n > 0): the pre-split rule, exposed for tests. */
size_t tok_chunk_len(const uint8_t *text, size_t n);

#endif
