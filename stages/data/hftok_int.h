/* Inside the tokenizer module: the Hugging Face tokenizer.json side (hftok.c), which tok_t
 * (tokenizer.c) dispatches to when tok_load finds JSON rather than a tokenizer.bin, and the
 * pre-tokenizer scanners (hftok_split.c) over the Unicode classes of unicode_tab.c. */
#ifndef CTITAN_HFTOK_INT_H
#define CTITAN_HFTOK_INT_H

#include <stddef.h>
#include <stdint.h>

/* Character classes as the pre-tokenizer regexes see them: \p{L}, \p{N}, \s, anything else.
 * An invalid UTF-8 byte is a character of its own of class UNI_OTHER. The table's entries add
 * UNI_WORD for word characters as the library's single_word test sees them (the Rust regex crate's
 * \w: Alphabetic, marks, decimal digits, connector punctuation such as '_', joiners). */
enum { UNI_OTHER, UNI_LETTER, UNI_NUMBER, UNI_SPACE, UNI_WORD = 4 };
#define UNI_BLOCK 128
extern const uint16_t uni_index[0x110000 / UNI_BLOCK];
extern const uint8_t uni_blocks[][UNI_BLOCK];

static inline int uni_class(uint32_t cp)
{
    return cp < 0x110000 ? uni_blocks[uni_index[cp / UNI_BLOCK]][cp % UNI_BLOCK] & 3 : UNI_OTHER;
}

static inline int uni_word(uint32_t cp)
{
    return cp < 0x110000 && (uni_blocks[uni_index[cp / UNI_BLOCK]][cp % UNI_BLOCK] & UNI_WORD);
}

/* The length of the character at p[0..n) (n > 0); *cp its code point, or 0x110000 for an
 * invalid byte (length 1). Strict UTF-8: no overlongs, surrogates or code points past U+10FFFF. */
size_t hf_utf8(const uint8_t *p, size_t n, uint32_t *cp);

/* Length of the first pre-token of p[0..n) (n > 0) under Llama 3's split regex
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 * and under GPT-2's (the ByteLevel pre-tokenizer's use_regex)
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
size_t hf_split_llama3(const uint8_t *p, size_t n);
size_t hf_split_gpt2(const uint8_t *p, size_t n);
#define HF_LLAMA3_REGEX                                                                        \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                 \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define HF_GPT2_REGEX                                                                          \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct hftok hftok_t;

/* Parses the tokenizer.json text buf[0..size) read from path (kept for hftok_save), and
 * tokenizer_config.json beside it when present; errors name the file and the field. */
int hftok_load(hftok_t **out, const char *path, const uint8_t *buf, size_t size, char *err,
               size_t errlen);
void hftok_destroy(hftok_t **h);
int hftok_vocab_size(const hftok_t *h);
/* At most cap tokens into out: -E2BIG if more would be needed (only possible with a
 * ByteLevel add_prefix_space), -ENOMEM. */
int hftok_encode(hftok_t *h, const uint8_t *text, size_t n, uint32_t *out, size_t cap, size_t *nout);
/* Bytes of a token: a model token through the byte-level alphabet, an added token its content. */
const uint8_t *hftok_token_bytes(const hftok_t *h, uint32_t id, size_t *len);
int hftok_token_id(const hftok_t *h, const char *text);
int hftok_bos(const hftok_t *h);
int hftok_eos(const hftok_t *h);
int hftok_merge(const hftok_t *h, int rank, uint32_t *a, uint32_t *b);
/* Whether a text of n bytes may need more than n tokens (ByteLevel add_prefix_space). */
int hftok_may_grow(const hftok_t *h);
/* Writes the tokenizer.json text it was loaded from (tokfile_write_bytes: durable, atomic). */
int hftok_save(const hftok_t *h, const char *path, char *err, size_t errlen);

#endif
