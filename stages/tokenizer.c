/* Byte-level BPE (see stages/tokenizer.h): training with incremental pair counts over the
 * unique chunks of the corpus, encoding with a per-chunk cache, the tokenizer.bin format. */
#include "stages/tokenizer.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "stages/tokfile.h"
#include "ipc/util.h"

#define TOK_HEADER_BYTES 32
/* The encode cache is dropped when it grows past these, so memory stays bounded on
 * corpora with unbounded distinct chunks (random bytes, numbers). */
#define CACHE_MAX_ENTRIES (1u << 21)
#define CACHE_MAX_POOL (64u << 20)

static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(p, c * elem);
    if (q) *cap = c;
    return q;
}

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t)a << 32 | b; }

/* ---- pre-split ---- */

enum { C_SPACE, C_LETTER, C_DIGIT, C_OTHER };

static unsigned char byte_class(uint8_t c)
{
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return C_SPACE;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return C_LETTER;
    if (c >= '0' && c <= '9') return C_DIGIT;
    return C_OTHER;
}

static unsigned char cls[256];
static pthread_once_t cls_once = PTHREAD_ONCE_INIT;
static void fill_classes(void)
{
    for (int c = 0; c < 256; c++) cls[c] = byte_class((uint8_t)c);
}
static void init_classes(void) { pthread_once(&cls_once, fill_classes); }

size_t tok_chunk_len(const uint8_t *p, size_t n)
{
    init_classes();
    size_t max = n < TOK_MAX_CHUNK ? n : TOK_MAX_CHUNK;
    size_t i = 0;
    if (p[0] == ' ' && max > 1 && cls[p[1]] != C_SPACE) i = 1; /* " word" stays one chunk */
    if (cls[p[i]] != C_SPACE) {
        unsigned char k = cls[p[i++]];
        while (i < max && cls[p[i]] == k) i++;
        return i;
    }
    while (i < max && cls[p[i]] == C_SPACE) i++;
    /* "  word": the last space goes with the word, as in GPT-2 */
    if (i < n && i > 1 && p[i - 1] == ' ' && cls[p[i]] != C_SPACE) i--;
    return i;
}

/* ---- chunk table: byte strings -> uint32 value; keys are copied into a byte pool ---- */

typedef struct {
    uint64_t hash; /* 0 = empty slot */
    uint64_t off;  /* key bytes at bytes + off */
    uint32_t len;
    uint32_t val;
} cslot_t;

typedef struct {
    cslot_t *slot;
    size_t cap, n; /* cap is a power of two */
    uint8_t *bytes;
    size_t nbytes, bcap;
} ctab_t;

static void ctab_free(ctab_t *t)
{
    free(t->slot);
    free(t->bytes);
    memset(t, 0, sizeof(*t));
}

static int ctab_rehash(ctab_t *t, size_t cap)
{
    cslot_t *s = calloc(cap, sizeof(cslot_t));
    if (!s) return -ENOMEM;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slot[i].hash) continue;
        size_t j = t->slot[i].hash & (cap - 1);
        while (s[j].hash) j = (j + 1) & (cap - 1);
        s[j] = t->slot[i];
    }
    free(t->slot);
    t->slot = s;
    t->cap = cap;
    return 0;
}

/* Finds the key or inserts it (val = UINT32_MAX); *found says which. The returned slot is
 * valid until the next insert. NULL on ENOMEM. */
static cslot_t *ctab_upsert(ctab_t *t, const uint8_t *p, uint32_t len, int *found)
{
    if ((t->n + 1) * 2 > t->cap && ctab_rehash(t, t->cap ? t->cap * 2 : 1024)) return NULL;
    uint64_t h = XXH3_64bits(p, len) | 1;
    size_t j = h & (t->cap - 1);
    for (;; j = (j + 1) & (t->cap - 1)) {
        cslot_t *s = &t->slot[j];
        if (!s->hash) break;
        if (s->hash == h && s->len == len && !memcmp(t->bytes + s->off, p, len)) {
            *found = 1;
            return s;
        }
    }
    uint8_t *b = grow(t->bytes, &t->bcap, t->nbytes + len, 1);
    if (!b) return NULL;
    t->bytes = b;
    memcpy(b + t->nbytes, p, len);
    cslot_t *s = &t->slot[j];
    *s = (cslot_t){.hash = h, .off = t->nbytes, .len = len, .val = UINT32_MAX};
    t->nbytes += len;
    t->n++;
    *found = 0;
    return s;
}

static void ctab_clear(ctab_t *t)
{
    if (t->slot) memset(t->slot, 0, t->cap * sizeof(cslot_t));
    t->n = 0;
    t->nbytes = 0;
}

/* ---- the tokenizer ---- */

struct tok {
    int vocab_size;
    int n_merges;
    uint32_t *merges; /* (n_merges, 2): a, b */
    /* merge lookup: (a, b) -> rank, open addressing; UINT64_MAX marks an empty slot */
    uint64_t *mkey;
    uint32_t *mrank;
    size_t mcap;
    /* bytes of each token */
    uint32_t *tb_off; /* (vocab_size) */
    uint32_t *tb_len; /* (vocab_size) */
    uint8_t *tb;
    /* encode cache: chunk bytes -> offset in pool of [count, tokens...] */
    ctab_t cache;
    uint32_t *pool;
    size_t npool, pool_cap;
};

void tok_destroy(tok_t **p)
{
    tok_t *t = *p;
    if (!t) return;
    free(t->merges);
    free(t->mkey);
    free(t->mrank);
    free(t->tb_off);
    free(t->tb_len);
    free(t->tb);
    ctab_free(&t->cache);
    free(t->pool);
    free(t);
    *p = NULL;
}

int tok_vocab_size(const tok_t *t) { return t->vocab_size; }

int tok_merge(const tok_t *t, int rank, uint32_t *a, uint32_t *b)
{
    if (rank < 0 || rank >= t->n_merges) return -ERANGE;
    *a = t->merges[2 * rank];
    *b = t->merges[2 * rank + 1];
    return 0;
}

static int64_t merge_rank(const tok_t *t, uint32_t a, uint32_t b)
{
    uint64_t k = pair_key(a, b);
    for (size_t j = mix64(k) & (t->mcap - 1);; j = (j + 1) & (t->mcap - 1)) {
        if (t->mkey[j] == k) return t->mrank[j];
        if (t->mkey[j] == UINT64_MAX) return -1;
    }
}

/* Takes ownership of merges (validated by the caller) and builds the lookup tables. */
static int tok_build(tok_t **out, uint32_t *merges, int n_merges)
{
    init_classes();
    tok_t *t = calloc(1, sizeof(*t));
    if (!t) {
        free(merges);
        return -ENOMEM;
    }
    t->merges = merges;
    t->n_merges = n_merges;
    t->vocab_size = 256 + n_merges;
    t->mcap = 16;
    while (t->mcap < 2 * (size_t)n_merges) t->mcap *= 2;
    t->mkey = malloc(t->mcap * sizeof(uint64_t));
    t->mrank = malloc(t->mcap * sizeof(uint32_t));
    t->tb_off = malloc(t->vocab_size * sizeof(uint32_t));
    t->tb_len = malloc(t->vocab_size * sizeof(uint32_t));
    if (!t->mkey || !t->mrank || !t->tb_off || !t->tb_len) goto nomem;
    memset(t->mkey, 0xff, t->mcap * sizeof(uint64_t));
    size_t total = 256;
    for (int i = 0; i < 256; i++) t->tb_len[i] = 1;
    for (int r = 0; r < n_merges; r++) {
        uint32_t a = merges[2 * r], b = merges[2 * r + 1];
        t->tb_len[256 + r] = t->tb_len[a] + t->tb_len[b];
        total += t->tb_len[256 + r];
        uint64_t k = pair_key(a, b);
        size_t j = mix64(k) & (t->mcap - 1);
        while (t->mkey[j] != UINT64_MAX && t->mkey[j] != k) j = (j + 1) & (t->mcap - 1);
        if (t->mkey[j] == UINT64_MAX) { /* a duplicate keeps its first (lowest) rank */
            t->mkey[j] = k;
            t->mrank[j] = (uint32_t)r;
        }
    }
    if (total > UINT32_MAX || !(t->tb = malloc(total))) goto nomem;
    size_t off = 0;
    for (int i = 0; i < 256; i++) {
        t->tb_off[i] = (uint32_t)off;
        t->tb[off++] = (uint8_t)i;
    }
    for (int r = 0; r < n_merges; r++) {
        uint32_t a = merges[2 * r], b = merges[2 * r + 1];
        t->tb_off[256 + r] = (uint32_t)off;
        memcpy(t->tb + off, t->tb + t->tb_off[a], t->tb_len[a]);
        memcpy(t->tb + off + t->tb_len[a], t->tb + t->tb_off[b], t->tb_len[b]);
        off += t->tb_len[256 + r];
    }
    *out = t;
    return 0;
nomem:
    tok_destroy(&t);
    return -ENOMEM;
}

/* ---- training ---- */

typedef struct {
    int64_t count;
    uint32_t a, b;
    int32_t *occ; /* words that contain (or once contained) the pair; may hold stale ids */
    uint32_t nocc, cocc;
    int32_t touched; /* merge round that last created occurrences of it, for dedupe */
} pair_t;

typedef struct {
    pair_t *v;
    size_t n, cap;
    uint64_t *key; /* open addressing over pair_key; UINT64_MAX = empty */
    uint32_t *idx;
    size_t tcap;
} ptab_t;

static int ptab_rehash(ptab_t *t, size_t cap)
{
    uint64_t *k = malloc(cap * sizeof(uint64_t));
    uint32_t *x = malloc(cap * sizeof(uint32_t));
    if (!k || !x) {
        free(k);
        free(x);
        return -ENOMEM;
    }
    memset(k, 0xff, cap * sizeof(uint64_t));
    for (size_t i = 0; i < t->n; i++) {
        uint64_t key = pair_key(t->v[i].a, t->v[i].b);
        size_t j = mix64(key) & (cap - 1);
        while (k[j] != UINT64_MAX) j = (j + 1) & (cap - 1);
        k[j] = key;
        x[j] = (uint32_t)i;
    }
    free(t->key);
    free(t->idx);
    t->key = k;
    t->idx = x;
    t->tcap = cap;
    return 0;
}

/* Index of pair (a, b), added with count 0 if new; -1 on ENOMEM. */
static int64_t ptab_get(ptab_t *t, uint32_t a, uint32_t b)
{
    uint64_t key = pair_key(a, b);
    if (t->tcap) {
        for (size_t j = mix64(key) & (t->tcap - 1);; j = (j + 1) & (t->tcap - 1)) {
            if (t->key[j] == key) return t->idx[j];
            if (t->key[j] == UINT64_MAX) break;
        }
    }
    if ((t->n + 1) * 2 > t->tcap && ptab_rehash(t, t->tcap ? t->tcap * 2 : 1 << 16)) return -1;
    pair_t *v = grow(t->v, &t->cap, t->n + 1, sizeof(pair_t));
    if (!v) return -1;
    t->v = v;
    v[t->n] = (pair_t){.a = a, .b = b, .touched = -1};
    size_t j = mix64(key) & (t->tcap - 1);
    while (t->key[j] != UINT64_MAX) j = (j + 1) & (t->tcap - 1);
    t->key[j] = key;
    t->idx[j] = (uint32_t)t->n;
    return (int64_t)t->n++;
}

static int pair_add_occ(pair_t *p, int32_t w)
{
    if (p->nocc && p->occ[p->nocc - 1] == w) return 0;
    if (p->nocc == p->cocc) {
        uint32_t c = p->cocc ? p->cocc * 2 : 4;
        int32_t *o = realloc(p->occ, c * sizeof(int32_t));
        if (!o) return -ENOMEM;
        p->occ = o;
        p->cocc = c;
    }
    p->occ[p->nocc++] = w;
    return 0;
}

/* Max-heap of (count, pair) with lazy deletion: an entry whose count no longer matches its
 * pair is refreshed when it reaches the top. Pair counts only fall, except in the round that
 * creates the pair's newer token, which pushes a fresh entry, so the top valid entry is the
 * true maximum. Order: larger count first, then smaller (a, b). */
typedef struct {
    int64_t count;
    uint64_t key;
    uint32_t pi;
} hent_t;

typedef struct {
    hent_t *v;
    size_t n, cap;
} heap_t;

static inline int hless(const hent_t *x, const hent_t *y) /* x below y */
{
    return x->count < y->count || (x->count == y->count && x->key > y->key);
}

static int heap_push(heap_t *h, hent_t e)
{
    hent_t *v = grow(h->v, &h->cap, h->n + 1, sizeof(hent_t));
    if (!v) return -ENOMEM;
    h->v = v;
    size_t i = h->n++;
    while (i && hless(&v[(i - 1) / 2], &e)) {
        v[i] = v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    v[i] = e;
    return 0;
}

static hent_t heap_pop(heap_t *h)
{
    hent_t top = h->v[0], e = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && hless(&h->v[c], &h->v[c + 1])) c++;
        if (!hless(&e, &h->v[c])) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (n) h->v[i] = e;
    return top;
}

int tok_train(tok_t **out, const uint8_t *text, size_t n, int vocab_size, char *err,
              size_t errlen)
{
    *out = NULL;
    if (vocab_size < TOK_MIN_VOCAB || vocab_size > TOK_MAX_VOCAB)
        return util_fail(err, errlen, -EINVAL, "vocab_size %d is outside [%d, %d]", vocab_size,
                    TOK_MIN_VOCAB, TOK_MAX_VOCAB);
    init_classes();
    int rc = -ENOMEM;
    int n_merges = vocab_size - 256;
    ctab_t words = {0};
    int64_t *wcount = NULL;
    size_t wcap = 0;
    uint32_t *sym = NULL, *woff = NULL, *wlen = NULL, *touched = NULL;
    uint32_t *merges = NULL;
    int32_t *stamp = NULL;
    ptab_t pt = {0};
    heap_t heap = {0};
    size_t ntouched = 0, ctouched = 0;

    /* 1. unique chunks and their counts */
    for (size_t i = 0; i < n;) {
        size_t len = tok_chunk_len(text + i, n - i);
        int found;
        cslot_t *s = ctab_upsert(&words, text + i, (uint32_t)len, &found);
        if (!s) goto nomem;
        if (!found) {
            s->val = (uint32_t)(words.n - 1);
            int64_t *c = grow(wcount, &wcap, words.n, sizeof(int64_t));
            if (!c) goto nomem;
            wcount = c;
            wcount[s->val] = 0;
        }
        wcount[s->val]++;
        i += len;
    }
    size_t nw = words.n;
    /* 2. each unique chunk as a symbol sequence; words.bytes holds them back to back in
     * first-seen order, since ids were handed out in insertion order */
    sym = malloc((words.nbytes ? words.nbytes : 1) * sizeof(uint32_t));
    woff = malloc((nw ? nw : 1) * sizeof(uint32_t));
    wlen = malloc((nw ? nw : 1) * sizeof(uint32_t));
    stamp = malloc((nw ? nw : 1) * sizeof(int32_t));
    merges = malloc(2 * (size_t)n_merges * sizeof(uint32_t));
    if (!sym || !woff || !wlen || !stamp || !merges) goto nomem;
    for (size_t i = 0; i < words.nbytes; i++) sym[i] = words.bytes[i];
    for (size_t i = 0; i < words.cap; i++) {
        cslot_t *s = &words.slot[i];
        if (!s->hash) continue;
        woff[s->val] = (uint32_t)s->off;
        wlen[s->val] = s->len;
    }
    /* 3. initial pair counts */
    for (size_t w = 0; w < nw; w++) {
        stamp[w] = -1;
        const uint32_t *s = sym + woff[w];
        for (uint32_t i = 0; i + 1 < wlen[w]; i++) {
            int64_t pi = ptab_get(&pt, s[i], s[i + 1]);
            if (pi < 0) goto nomem;
            pt.v[pi].count += wcount[w];
            if (pair_add_occ(&pt.v[pi], (int32_t)w)) goto nomem;
        }
    }
    for (size_t i = 0; i < pt.n; i++)
        if (heap_push(&heap, (hent_t){pt.v[i].count, pair_key(pt.v[i].a, pt.v[i].b), (uint32_t)i}))
            goto nomem;

    /* 4. merges */
    for (int m = 0; m < n_merges; m++) {
        hent_t top;
        for (;;) {
            if (!heap.n) {
                rc = util_fail(err, errlen, -EINVAL,
                          "corpus too small for vocab_size %d: no pairs left to merge after %d "
                          "merges (%zu bytes of text); use a smaller vocab or more text",
                          vocab_size, m, n);
                goto out;
            }
            top = heap_pop(&heap);
            int64_t c = pt.v[top.pi].count;
            if (c == top.count) break;
            if (c > 0 && heap_push(&heap, (hent_t){c, top.key, top.pi})) goto nomem;
        }
        uint32_t a = pt.v[top.pi].a, b = pt.v[top.pi].b, z = 256 + (uint32_t)m;
        merges[2 * m] = a;
        merges[2 * m + 1] = b;
        ntouched = 0;
        /* pt.v may move while we add pairs: re-read the occurrence list through the index */
        for (uint32_t oi = 0; oi < pt.v[top.pi].nocc; oi++) {
            int32_t w = pt.v[top.pi].occ[oi];
            if (stamp[w] == m) continue;
            stamp[w] = m;
            uint32_t *s = sym + woff[w], L = wlen[w];
            uint32_t i = 0;
            while (i + 1 < L && !(s[i] == a && s[i + 1] == b)) i++;
            if (i + 1 >= L) continue; /* stale entry: an earlier merge consumed the pair */
            int64_t c = wcount[w];
            for (uint32_t k = 0; k + 1 < L; k++) pt.v[ptab_get(&pt, s[k], s[k + 1])].count -= c;
            uint32_t j = 0;
            for (uint32_t k = 0; k < L;) {
                if (k + 1 < L && s[k] == a && s[k + 1] == b) {
                    s[j++] = z;
                    k += 2;
                } else {
                    s[j++] = s[k++];
                }
            }
            wlen[w] = L = j;
            for (uint32_t k = 0; k + 1 < L; k++) {
                int64_t pi = ptab_get(&pt, s[k], s[k + 1]);
                if (pi < 0) goto nomem;
                pair_t *p = &pt.v[pi];
                p->count += c;
                if (s[k] != z && s[k + 1] != z) continue;
                if (pair_add_occ(p, w)) goto nomem;
                if (p->touched != m) {
                    p->touched = m;
                    uint32_t *tt = grow(touched, &ctouched, ntouched + 1, sizeof(uint32_t));
                    if (!tt) goto nomem;
                    touched = tt;
                    touched[ntouched++] = (uint32_t)pi;
                }
            }
        }
        /* the merged pair's words are done with; its list is no longer needed */
        free(pt.v[top.pi].occ);
        pt.v[top.pi].occ = NULL;
        pt.v[top.pi].nocc = pt.v[top.pi].cocc = 0;
        for (size_t k = 0; k < ntouched; k++) {
            pair_t *p = &pt.v[touched[k]];
            if (p->count > 0 && heap_push(&heap, (hent_t){p->count, pair_key(p->a, p->b), touched[k]}))
                goto nomem;
        }
    }
    rc = tok_build(out, merges, n_merges);
    merges = NULL;
    if (rc) util_fail(err, errlen, rc, "out of memory building the tokenizer");
    goto out;
nomem:
    rc = util_fail(err, errlen, -ENOMEM, "out of memory training the tokenizer");
out:
    ctab_free(&words);
    free(wcount);
    free(sym);
    free(woff);
    free(wlen);
    free(stamp);
    free(merges);
    free(touched);
    for (size_t i = 0; i < pt.n; i++) free(pt.v[i].occ);
    free(pt.v);
    free(pt.key);
    free(pt.idx);
    free(heap.v);
    return rc;
}

/* ---- encoding and decoding ---- */

/* Applies merges in rank order to one chunk: the lowest-ranked adjacent pair merges
 * everywhere (left to right), as in training. s holds len byte tokens; returns the count. */
static size_t encode_chunk(const tok_t *t, uint32_t *s, size_t len)
{
    while (len > 1) {
        int64_t best = -1;
        for (size_t i = 0; i + 1 < len; i++) {
            int64_t r = merge_rank(t, s[i], s[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r;
        }
        if (best < 0) break;
        uint32_t a = t->merges[2 * best], b = t->merges[2 * best + 1], z = 256 + (uint32_t)best;
        size_t j = 0;
        for (size_t k = 0; k < len;) {
            if (k + 1 < len && s[k] == a && s[k + 1] == b) {
                s[j++] = z;
                k += 2;
            } else {
                s[j++] = s[k++];
            }
        }
        len = j;
    }
    return len;
}

int tok_encode(tok_t *t, const uint8_t *text, size_t n, uint32_t *out, size_t *nout)
{
    size_t no = 0;
    for (size_t i = 0; i < n;) {
        size_t len = tok_chunk_len(text + i, n - i);
        if (t->cache.n >= CACHE_MAX_ENTRIES || t->npool >= CACHE_MAX_POOL) {
            ctab_clear(&t->cache);
            t->npool = 0;
        }
        int found;
        cslot_t *s = ctab_upsert(&t->cache, text + i, (uint32_t)len, &found);
        if (!s) return -ENOMEM;
        if (!found) {
            uint32_t *p = grow(t->pool, &t->pool_cap, t->npool + len + 1, sizeof(uint32_t));
            if (!p) { /* drop the half-made entry so a later lookup cannot see it */
                s->hash = 0;
                ctab_clear(&t->cache);
                t->npool = 0;
                return -ENOMEM;
            }
            t->pool = p;
            uint32_t *e = p + t->npool;
            for (size_t k = 0; k < len; k++) e[1 + k] = text[i + k];
            e[0] = (uint32_t)encode_chunk(t, e + 1, len);
            s->val = (uint32_t)t->npool;
            t->npool += 1 + e[0];
        }
        const uint32_t *e = t->pool + s->val;
        memcpy(out + no, e + 1, e[0] * sizeof(uint32_t));
        no += e[0];
        i += len;
    }
    *nout = no;
    return 0;
}

const uint8_t *tok_token_bytes(const tok_t *t, uint32_t id, size_t *len)
{
    if (id >= (uint32_t)t->vocab_size) return NULL;
    *len = t->tb_len[id];
    return t->tb + t->tb_off[id];
}

int tok_decode(const tok_t *t, const uint32_t *tok, size_t n, uint8_t **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (tok[i] >= (uint32_t)t->vocab_size) return -EINVAL;
        total += t->tb_len[tok[i]];
    }
    uint8_t *buf = malloc(total ? total : 1);
    if (!buf) return -ENOMEM;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + off, t->tb + t->tb_off[tok[i]], t->tb_len[tok[i]]);
        off += t->tb_len[tok[i]];
    }
    *out = buf;
    *nout = total;
    return 0;
}

/* ---- tokenizer.bin ---- */

int tok_save(const tok_t *t, const char *path, char *err, size_t errlen)
{
    uint8_t hdr[TOK_HEADER_BYTES] = {0};
    uint32_t version = TOK_VERSION, vocab = (uint32_t)t->vocab_size, rule = TOK_SPLIT_RULE,
             maxc = TOK_MAX_CHUNK;
    size_t body = 2 * (size_t)t->n_merges * sizeof(uint32_t);
    uint64_t sum = XXH64(t->merges, body, 0);
    memcpy(hdr, TOK_MAGIC, 8);
    memcpy(hdr + 8, &version, 4);
    memcpy(hdr + 12, &vocab, 4);
    memcpy(hdr + 16, &rule, 4);
    memcpy(hdr + 20, &maxc, 4);
    memcpy(hdr + 24, &sum, 8);
    return tokfile_write_bytes(path, hdr, sizeof(hdr), t->merges, body, err, errlen);
}

int tok_load(tok_t **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    int rc = 0;
    uint8_t *buf = NULL;
    uint32_t *merges = NULL;
    size_t size;
    int fd = util_open_regular(path, &size, err, errlen);
    if (fd < 0)
        return fd;
    if (size < TOK_HEADER_BYTES) {
        rc = util_fail(err, errlen, -EINVAL,
                  "%s: header too short: file has %zu bytes, a tokenizer header needs %d", path,
                  size, TOK_HEADER_BYTES);
        goto out;
    }
    if (size > TOK_HEADER_BYTES + 8 * (size_t)TOK_MAX_VOCAB) {
        rc = util_fail(err, errlen, -EINVAL, "%s: too large for a tokenizer file (%zu bytes)", path,
                  size);
        goto out;
    }
    if (!(buf = malloc(size))) {
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
        goto out;
    }
    for (size_t got = 0; got < size;) {
        ssize_t r = pread(fd, buf + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            rc = util_fail(err, errlen, r < 0 ? -errno : -EIO, "%s: read failed: %s", path,
                      r < 0 ? strerror(errno) : "file shrank while reading");
            goto out;
        }
        got += (size_t)r;
    }
    if (memcmp(buf, TOK_MAGIC, 8)) {
        rc = util_fail(err, errlen, -EINVAL, "%s: not a ctitan tokenizer file (bad magic, expected \"%s\")",
                  path, TOK_MAGIC);
        goto out;
    }
    uint32_t version, vocab, rule, maxc;
    uint64_t sum;
    memcpy(&version, buf + 8, 4);
    memcpy(&vocab, buf + 12, 4);
    memcpy(&rule, buf + 16, 4);
    memcpy(&maxc, buf + 20, 4);
    memcpy(&sum, buf + 24, 8);
    if (version != TOK_VERSION) {
        rc = util_fail(err, errlen, -EINVAL, "%s: unsupported version %u (this build reads %u)", path,
                  version, TOK_VERSION);
        goto out;
    }
    if (rule != TOK_SPLIT_RULE || maxc != TOK_MAX_CHUNK) {
        rc = util_fail(err, errlen, -EINVAL,
                  "%s: made with pre-split rule %u, max chunk %u; this build uses rule %u, max "
                  "chunk %d",
                  path, rule, maxc, TOK_SPLIT_RULE, TOK_MAX_CHUNK);
        goto out;
    }
    if (vocab < TOK_MIN_VOCAB || vocab > TOK_MAX_VOCAB) {
        rc = util_fail(err, errlen, -EINVAL, "%s: vocab_size %u is outside [%d, %d]", path, vocab,
                  TOK_MIN_VOCAB, TOK_MAX_VOCAB);
        goto out;
    }
    size_t n_merges = vocab - 256, body = 8 * n_merges;
    if (size != TOK_HEADER_BYTES + body) {
        rc = util_fail(err, errlen, -EINVAL,
                  "%s: file size %zu does not match vocab_size %u (expected %zu bytes)", path,
                  size, vocab, TOK_HEADER_BYTES + body);
        goto out;
    }
    if (XXH64(buf + TOK_HEADER_BYTES, body, 0) != sum) {
        rc = util_fail(err, errlen, -EINVAL, "%s: checksum mismatch: the merge table is corrupt", path);
        goto out;
    }
    if (!(merges = malloc(body))) {
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
        goto out;
    }
    memcpy(merges, buf + TOK_HEADER_BYTES, body);
    for (size_t r = 0; r < n_merges; r++)
        if (merges[2 * r] >= 256 + r || merges[2 * r + 1] >= 256 + r) {
            rc = util_fail(err, errlen, -EINVAL,
                      "%s: merge %zu is (%u, %u), but may only use tokens below %zu", path, r,
                      merges[2 * r], merges[2 * r + 1], 256 + r);
            goto out;
        }
    rc = tok_build(out, merges, (int)n_merges);
    merges = NULL;
    if (rc) util_fail(err, errlen, rc, "%s: out of memory", path);
out:
    free(merges);
    free(buf);
    close(fd);
    return rc;
}
