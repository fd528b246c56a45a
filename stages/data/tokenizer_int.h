/* Inside the tokenizer module (tokenizer.h's tok_*): what training (tokenizer_train.c) shares
 * with the tokenizer itself (tokenizer.c): growing arrays, hashing pairs, the chunk table, and
 * building a tokenizer from its merges. */
#ifndef CTITAN_TOKENIZER_INT_H
#define CTITAN_TOKENIZER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "stages/data/tokenizer.h"

/* p grown (realloc) to at least `need` elements of elem bytes, doubling; *cap follows. NULL on
 * ENOMEM, p then still valid. */
void *tok_grow(void *p, size_t *cap, size_t need, size_t elem);

static inline uint64_t tok_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t tok_pair_key(uint32_t a, uint32_t b) { return (uint64_t)a << 32 | b; }

/* Chunk table: byte strings -> uint32 value; keys are copied into a byte pool. */
typedef struct {
    uint64_t hash; /* 0 = empty slot */
    uint64_t off;  /* key bytes at bytes + off */
    uint32_t len;
    uint32_t val;
} tok_cslot_t;

typedef struct {
    tok_cslot_t *slot;
    size_t cap, n; /* cap is a power of two */
    uint8_t *bytes;
    size_t nbytes, bcap;
} tok_ctab_t;

/* Finds the key or inserts it (val = UINT32_MAX); *found says which. The returned slot is
 * valid until the next insert. NULL on ENOMEM. */
tok_cslot_t *tok_ctab_upsert(tok_ctab_t *t, const uint8_t *p, uint32_t len, int *found);
void tok_ctab_free(tok_ctab_t *t);

/* Takes ownership of merges (n_merges pairs, each using only earlier tokens: validated by the
 * caller) and builds the lookup tables. 0 or -ENOMEM. */
int tok_build(tok_t **out, uint32_t *merges, int n_merges);

#endif
