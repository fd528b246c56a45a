/* Byte-level BPE training (see tokenizer.h, tok_train): the corpus as its unique chunks
 * ("words") with their counts, pair counts kept incrementally as each merge rewrites only the
 * words that hold the merged pair, and a heap to find the most frequent pair each round. */
#include "stages/data/tokenizer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"
#include "stages/data/tokenizer_int.h"

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
        uint64_t key = tok_pair_key(t->v[i].a, t->v[i].b);
        size_t j = tok_mix64(key) & (cap - 1);
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
    uint64_t key = tok_pair_key(a, b);
    if (t->tcap) {
        for (size_t j = tok_mix64(key) & (t->tcap - 1);; j = (j + 1) & (t->tcap - 1)) {
            if (t->key[j] == key) return t->idx[j];
            if (t->key[j] == UINT64_MAX) break;
        }
    }
    if ((t->n + 1) * 2 > t->tcap && ptab_rehash(t, t->tcap ? t->tcap * 2 : 1 << 16)) return -1;
    pair_t *v = tok_grow(t->v, &t->cap, t->n + 1, sizeof(pair_t));
    if (!v) return -1;
    t->v = v;
    v[t->n] = (pair_t){.a = a, .b = b, .touched = -1};
    size_t j = tok_mix64(key) & (t->tcap - 1);
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
    hent_t *v = tok_grow(h->v, &h->cap, h->n + 1, sizeof(hent_t));
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

/* The training state: the corpus's unique chunks as symbol sequences, their pairs, the heap. */
typedef struct {
    tok_ctab_t words;     /* chunk bytes -> word id, in first-seen order */
    int64_t *wcount;      /* (nw) occurrences of each word in the corpus */
    size_t wcap, nw;
    uint32_t *sym;        /* every word's symbols, word w at sym + woff[w], wlen[w] of them */
    uint32_t *woff, *wlen;
    int32_t *stamp;       /* (nw) the merge round that last looked at the word */
    ptab_t pt;
    heap_t heap;
    uint32_t *touched;    /* pairs the current round created occurrences of */
    size_t ntouched, ctouched;
} train_t;

static void train_free(train_t *tr)
{
    tok_ctab_free(&tr->words);
    free(tr->wcount);
    free(tr->sym);
    free(tr->woff);
    free(tr->wlen);
    free(tr->stamp);
    free(tr->touched);
    for (size_t i = 0; i < tr->pt.n; i++)
        free(tr->pt.v[i].occ);
    free(tr->pt.v);
    free(tr->pt.key);
    free(tr->pt.idx);
    free(tr->heap.v);
}

/* 1. The unique chunks of text and their counts. */
static int count_words(train_t *tr, const uint8_t *text, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t len = tok_chunk_len(text + i, n - i);
        int found;
        tok_cslot_t *s = tok_ctab_upsert(&tr->words, text + i, (uint32_t)len, &found);
        if (!s)
            return -ENOMEM;
        if (!found) {
            s->val = (uint32_t)(tr->words.n - 1);
            int64_t *c = tok_grow(tr->wcount, &tr->wcap, tr->words.n, sizeof(int64_t));
            if (!c)
                return -ENOMEM;
            tr->wcount = c;
            tr->wcount[s->val] = 0;
        }
        tr->wcount[s->val]++;
        i += len;
    }
    tr->nw = tr->words.n;
    return 0;
}

/* 2. Each unique chunk as a symbol sequence; words.bytes holds them back to back in
 * first-seen order, since ids were handed out in insertion order. */
static int split_words(train_t *tr)
{
    size_t nw = tr->nw;
    tr->sym = malloc((tr->words.nbytes ? tr->words.nbytes : 1) * sizeof(uint32_t));
    tr->woff = malloc((nw ? nw : 1) * sizeof(uint32_t));
    tr->wlen = malloc((nw ? nw : 1) * sizeof(uint32_t));
    tr->stamp = malloc((nw ? nw : 1) * sizeof(int32_t));
    if (!tr->sym || !tr->woff || !tr->wlen || !tr->stamp)
        return -ENOMEM;
    for (size_t i = 0; i < tr->words.nbytes; i++)
        tr->sym[i] = tr->words.bytes[i];
    for (size_t i = 0; i < tr->words.cap; i++) {
        tok_cslot_t *s = &tr->words.slot[i];
        if (!s->hash)
            continue;
        tr->woff[s->val] = (uint32_t)s->off;
        tr->wlen[s->val] = s->len;
    }
    return 0;
}

/* 3. Initial pair counts, every pair on the heap. */
static int count_pairs(train_t *tr)
{
    ptab_t *pt = &tr->pt;
    for (size_t w = 0; w < tr->nw; w++) {
        tr->stamp[w] = -1;
        const uint32_t *s = tr->sym + tr->woff[w];
        for (uint32_t i = 0; i + 1 < tr->wlen[w]; i++) {
            int64_t pi = ptab_get(pt, s[i], s[i + 1]);
            if (pi < 0)
                return -ENOMEM;
            pt->v[pi].count += tr->wcount[w];
            if (pair_add_occ(&pt->v[pi], (int32_t)w))
                return -ENOMEM;
        }
    }
    for (size_t i = 0; i < pt->n; i++)
        if (heap_push(&tr->heap, (hent_t){pt->v[i].count, tok_pair_key(pt->v[i].a, pt->v[i].b), (uint32_t)i}))
            return -ENOMEM;
    return 0;
}

/* The most frequent pair into *top: 1, or 0 when no pair is left, or -ENOMEM. Entries whose
 * count changed since they were pushed go back with their current count. */
static int pop_best(train_t *tr, hent_t *top)
{
    for (;;) {
        if (!tr->heap.n)
            return 0;
        *top = heap_pop(&tr->heap);
        int64_t c = tr->pt.v[top->pi].count;
        if (c == top->count)
            return 1;
        if (c > 0 && heap_push(&tr->heap, (hent_t){c, top->key, top->pi}))
            return -ENOMEM;
    }
}

/* Merge round m in word w: every (a, b) becomes z, the word's pair counts move from its old
 * pairs to its new ones, and the new pairs holding z learn of the word. */
static int merge_word(train_t *tr, int32_t w, int m, uint32_t a, uint32_t b)
{
    ptab_t *pt = &tr->pt;
    uint32_t z = 256 + (uint32_t)m;
    if (tr->stamp[w] == m)
        return 0;
    tr->stamp[w] = m;
    uint32_t *s = tr->sym + tr->woff[w], L = tr->wlen[w];
    uint32_t i = 0;
    while (i + 1 < L && !(s[i] == a && s[i + 1] == b))
        i++;
    if (i + 1 >= L)
        return 0; /* stale entry: an earlier merge consumed the pair */
    int64_t c = tr->wcount[w];
    for (uint32_t k = 0; k + 1 < L; k++)
        pt->v[ptab_get(pt, s[k], s[k + 1])].count -= c;
    uint32_t j = 0;
    for (uint32_t k = 0; k < L;) {
        if (k + 1 < L && s[k] == a && s[k + 1] == b) {
            s[j++] = z;
            k += 2;
        } else {
            s[j++] = s[k++];
        }
    }
    tr->wlen[w] = L = j;
    for (uint32_t k = 0; k + 1 < L; k++) {
        int64_t pi = ptab_get(pt, s[k], s[k + 1]);
        if (pi < 0)
            return -ENOMEM;
        pair_t *p = &pt->v[pi];
        p->count += c;
        if (s[k] != z && s[k + 1] != z)
            continue;
        if (pair_add_occ(p, w))
            return -ENOMEM;
        if (p->touched != m) {
            p->touched = m;
            uint32_t *tt = tok_grow(tr->touched, &tr->ctouched, tr->ntouched + 1, sizeof(uint32_t));
            if (!tt)
                return -ENOMEM;
            tr->touched = tt;
            tr->touched[tr->ntouched++] = (uint32_t)pi;
        }
    }
    return 0;
}

/* 4. Merge round m of pair pi in every word that holds it. */
static int merge(train_t *tr, int m, uint32_t pi)
{
    ptab_t *pt = &tr->pt;
    uint32_t a = pt->v[pi].a, b = pt->v[pi].b;
    tr->ntouched = 0;
    /* pt->v may move while we add pairs: re-read the occurrence list through the index */
    for (uint32_t oi = 0; oi < pt->v[pi].nocc; oi++)
        if (merge_word(tr, pt->v[pi].occ[oi], m, a, b))
            return -ENOMEM;
    /* the merged pair's words are done with; its list is no longer needed */
    free(pt->v[pi].occ);
    pt->v[pi].occ = NULL;
    pt->v[pi].nocc = pt->v[pi].cocc = 0;
    for (size_t k = 0; k < tr->ntouched; k++) {
        pair_t *p = &pt->v[tr->touched[k]];
        if (p->count > 0 && heap_push(&tr->heap, (hent_t){p->count, tok_pair_key(p->a, p->b), tr->touched[k]}))
            return -ENOMEM;
    }
    return 0;
}

int tok_train(tok_t **out, const uint8_t *text, size_t n, int vocab_size, char *err, size_t errlen)
{
    *out = NULL;
    if (vocab_size < TOK_MIN_VOCAB || vocab_size > TOK_MAX_VOCAB)
        return util_fail(err, errlen, -EINVAL, "vocab_size %d is outside [%d, %d]", vocab_size, TOK_MIN_VOCAB,
                         TOK_MAX_VOCAB);
    int n_merges = vocab_size - 256;
    train_t tr = {0};
    uint32_t *merges = malloc(2 * (size_t)n_merges * sizeof(uint32_t));
    int rc = merges ? 0 : -ENOMEM;
    if (!rc && !(rc = count_words(&tr, text, n)) && !(rc = split_words(&tr)))
        rc = count_pairs(&tr);
    for (int m = 0; !rc && m < n_merges; m++) {
        hent_t top;
        int found = pop_best(&tr, &top);
        if (found < 0) {
            rc = found;
        } else if (!found) {
            rc = util_fail(err, errlen, -EINVAL,
                           "corpus too small for vocab_size %d: no pairs left to merge after %d "
                           "merges (%zu bytes of text); use a smaller vocab or more text",
                           vocab_size, m, n);
        } else {
            merges[2 * m] = tr.pt.v[top.pi].a;
            merges[2 * m + 1] = tr.pt.v[top.pi].b;
            rc = merge(&tr, m, top.pi);
        }
    }
    train_free(&tr);
    if (rc == -ENOMEM)
        rc = util_fail(err, errlen, -ENOMEM, "out of memory training the tokenizer");
    if (rc) {
        free(merges);
        return rc;
    }
    rc = tok_build(out, merges, n_merges);
    if (rc)
        util_fail(err, errlen, rc, "out of memory building the tokenizer");
    return rc;
}
