/* Byte-level BPE (see stages/data/tokenizer.h): the pre-split, the tokenizer built from its merges,
 * encoding with a per-chunk cache, decoding, the tokenizer.bin format. Training, which makes
 * the merges, is tokenizer_train.c. */
#include "stages/data/tokenizer.h"

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

#include "ipc/util.h"
#include "stages/data/hftok_int.h"
#include "stages/data/tokenizer_int.h"
#include "stages/data/tokfile.h"

#define TOK_HEADER_BYTES 32
/* The encode cache is dropped when it grows past these, so memory stays bounded on
 * corpora with unbounded distinct chunks (random bytes, numbers). */
#define CACHE_MAX_ENTRIES (1u << 21)
#define CACHE_MAX_POOL (64u << 20)

void *tok_grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(p, c * elem);
    if (q) *cap = c;
    return q;
}

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

void tok_ctab_free(tok_ctab_t *t)
{
    free(t->slot);
    free(t->bytes);
    memset(t, 0, sizeof(*t));
}

static int ctab_rehash(tok_ctab_t *t, size_t cap)
{
    tok_cslot_t *s = calloc(cap, sizeof(tok_cslot_t));
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

tok_cslot_t *tok_ctab_upsert(tok_ctab_t *t, const uint8_t *p, uint32_t len, int *found)
{
    if ((t->n + 1) * 2 > t->cap && ctab_rehash(t, t->cap ? t->cap * 2 : 1024)) return NULL;
    uint64_t h = XXH3_64bits(p, len) | 1;
    size_t j = h & (t->cap - 1);
    for (;; j = (j + 1) & (t->cap - 1)) {
        tok_cslot_t *s = &t->slot[j];
        if (!s->hash) break;
        if (s->hash == h && s->len == len && !memcmp(t->bytes + s->off, p, len)) {
            *found = 1;
            return s;
        }
    }
    uint8_t *b = tok_grow(t->bytes, &t->bcap, t->nbytes + len, 1);
    if (!b) return NULL;
    t->bytes = b;
    memcpy(b + t->nbytes, p, len);
    tok_cslot_t *s = &t->slot[j];
    *s = (tok_cslot_t){.hash = h, .off = t->nbytes, .len = len, .val = UINT32_MAX};
    t->nbytes += len;
    t->n++;
    *found = 0;
    return s;
}

static void ctab_clear(tok_ctab_t *t)
{
    if (t->slot) memset(t->slot, 0, t->cap * sizeof(tok_cslot_t));
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
    tok_ctab_t cache;
    uint32_t *pool;
    size_t npool, pool_cap;
    hftok_t *hf; /* a Hugging Face tokenizer.json: everything goes to hftok.c */
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
    tok_ctab_free(&t->cache);
    free(t->pool);
    hftok_destroy(&t->hf);
    free(t);
    *p = NULL;
}

int tok_vocab_size(const tok_t *t) { return t->hf ? hftok_vocab_size(t->hf) : t->vocab_size; }
int tok_token_id(const tok_t *t, const char *text) { return t->hf ? hftok_token_id(t->hf, text) : -1; }
int tok_bos(const tok_t *t) { return t->hf ? hftok_bos(t->hf) : -1; }
const char *tok_file_name(const tok_t *t) { return t->hf ? "tokenizer.json" : "tokenizer.bin"; }
int tok_eos(const tok_t *t) { return t->hf ? hftok_eos(t->hf) : -1; }
size_t tok_max_tokens(const tok_t *t, size_t n) { return t->hf && hftok_may_grow(t->hf) ? 2 * n : n; }

int tok_merge(const tok_t *t, int rank, uint32_t *a, uint32_t *b)
{
    if (t->hf) return hftok_merge(t->hf, rank, a, b);
    if (rank < 0 || rank >= t->n_merges) return -ERANGE;
    *a = t->merges[2 * rank];
    *b = t->merges[2 * rank + 1];
    return 0;
}

static int64_t merge_rank(const tok_t *t, uint32_t a, uint32_t b)
{
    uint64_t k = tok_pair_key(a, b);
    for (size_t j = tok_mix64(k) & (t->mcap - 1);; j = (j + 1) & (t->mcap - 1)) {
        if (t->mkey[j] == k) return t->mrank[j];
        if (t->mkey[j] == UINT64_MAX) return -1;
    }
}

int tok_build(tok_t **out, uint32_t *merges, int n_merges)
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
        uint64_t k = tok_pair_key(a, b);
        size_t j = tok_mix64(k) & (t->mcap - 1);
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

int tok_encode_cap(tok_t *t, const uint8_t *text, size_t n, uint32_t *out, size_t cap, size_t *nout)
{
    if (t->hf) return hftok_encode(t->hf, text, n, out, cap, nout);
    if (cap < n) return -E2BIG;
    return tok_encode(t, text, n, out, nout);
}

int tok_encode(tok_t *t, const uint8_t *text, size_t n, uint32_t *out, size_t *nout)
{
    if (t->hf) return hftok_encode(t->hf, text, n, out, n, nout);
    size_t no = 0;
    for (size_t i = 0; i < n;) {
        size_t len = tok_chunk_len(text + i, n - i);
        if (t->cache.n >= CACHE_MAX_ENTRIES || t->npool >= CACHE_MAX_POOL) {
            ctab_clear(&t->cache);
            t->npool = 0;
        }
        int found;
        tok_cslot_t *s = tok_ctab_upsert(&t->cache, text + i, (uint32_t)len, &found);
        if (!s) return -ENOMEM;
        if (!found) {
            uint32_t *p = tok_grow(t->pool, &t->pool_cap, t->npool + len + 1, sizeof(uint32_t));
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
    if (t->hf) return hftok_token_bytes(t->hf, id, len);
    if (id >= (uint32_t)t->vocab_size) return NULL;
    *len = t->tb_len[id];
    return t->tb + t->tb_off[id];
}

int tok_decode(const tok_t *t, const uint32_t *tok, size_t n, uint8_t **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    size_t total = 0, len;
    for (size_t i = 0; i < n; i++) {
        if (!tok_token_bytes(t, tok[i], &len)) return -EINVAL;
        total += len;
    }
    uint8_t *buf = malloc(total ? total : 1);
    if (!buf) return -ENOMEM;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = tok_token_bytes(t, tok[i], &len);
        memcpy(buf + off, b, len);
        off += len;
    }
    *out = buf;
    *nout = total;
    return 0;
}

/* ---- tokenizer.bin ---- */

int tok_save(const tok_t *t, const char *path, char *err, size_t errlen)
{
    if (t->hf) return hftok_save(t->hf, path, err, errlen);
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

/* The whole file at path (at most TOK_HEADER_BYTES + 8 x TOK_MAX_VOCAB bytes) into a
 * malloc'ed *buf of *size bytes. */
static int read_file(const char *path, uint8_t **buf, size_t *size, char *err, size_t errlen)
{
    *buf = NULL;
    int fd = util_open_regular(path, size, err, errlen);
    if (fd < 0)
        return fd;
    int rc = 0;
    if (*size < TOK_HEADER_BYTES)
        rc = util_fail(err, errlen, -EINVAL, "%s: header too short: file has %zu bytes, a tokenizer header needs %d",
                       path, *size, TOK_HEADER_BYTES);
    else if (*size > TOK_HEADER_BYTES + 8 * (size_t)TOK_MAX_VOCAB)
        rc = util_fail(err, errlen, -EINVAL, "%s: too large for a tokenizer file (%zu bytes)", path, *size);
    else if (!(*buf = malloc(*size)))
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    long got = rc ? 0 : util_read_all(fd, *buf, *size, 0);
    if (!rc && (got < 0 || (size_t)got < *size))
        rc = util_fail(err, errlen, got < 0 ? (int)got : -EIO, "%s: read failed: %s", path,
                       got < 0 ? strerror((int)-got) : "file shrank while reading");
    close(fd);
    if (rc) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

/* Magic, version, split rule, vocab_size against the size, and the checksum; *n_merges. */
static int check_header(const char *path, const uint8_t *buf, size_t size, size_t *n_merges, char *err,
                        size_t errlen)
{
    if (memcmp(buf, TOK_MAGIC, 8))
        return util_fail(err, errlen, -EINVAL, "%s: not a ctitan tokenizer file (bad magic, expected \"%s\")", path,
                         TOK_MAGIC);
    uint32_t version, vocab, rule, maxc;
    uint64_t sum;
    memcpy(&version, buf + 8, 4);
    memcpy(&vocab, buf + 12, 4);
    memcpy(&rule, buf + 16, 4);
    memcpy(&maxc, buf + 20, 4);
    memcpy(&sum, buf + 24, 8);
    if (version != TOK_VERSION)
        return util_fail(err, errlen, -EINVAL, "%s: unsupported version %u (this build reads %u)", path, version,
                         TOK_VERSION);
    if (rule != TOK_SPLIT_RULE || maxc != TOK_MAX_CHUNK)
        return util_fail(err, errlen, -EINVAL,
                         "%s: made with pre-split rule %u, max chunk %u; this build uses rule %u, max "
                         "chunk %d",
                         path, rule, maxc, TOK_SPLIT_RULE, TOK_MAX_CHUNK);
    if (vocab < TOK_MIN_VOCAB || vocab > TOK_MAX_VOCAB)
        return util_fail(err, errlen, -EINVAL, "%s: vocab_size %u is outside [%d, %d]", path, vocab, TOK_MIN_VOCAB,
                         TOK_MAX_VOCAB);
    size_t body = 8 * ((size_t)vocab - 256);
    if (size != TOK_HEADER_BYTES + body)
        return util_fail(err, errlen, -EINVAL, "%s: file size %zu does not match vocab_size %u (expected %zu bytes)",
                         path, size, vocab, TOK_HEADER_BYTES + body);
    if (XXH64(buf + TOK_HEADER_BYTES, body, 0) != sum)
        return util_fail(err, errlen, -EINVAL, "%s: checksum mismatch: the merge table is corrupt", path);
    *n_merges = (size_t)vocab - 256;
    return 0;
}

/* A tokenizer.json (first non-blank byte '{') into a tok_t that hands everything to hftok.c. */
static int load_hf(tok_t **out, const char *path, int *is_json, char *err, size_t errlen)
{
    size_t size;
    int fd = util_open_regular(path, &size, err, errlen);
    if (fd < 0) return fd;
    uint8_t head[64];
    long got = util_read_all(fd, head, sizeof(head), 0), i = 0;
    while (i < got && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r')) i++;
    *is_json = i < got && head[i] == '{';
    uint8_t *buf = NULL;
    int rc = 0;
    if (*is_json) {
        if (size > TOK_MAX_JSON)
            rc = util_fail(err, errlen, -EINVAL, "%s: too large for a tokenizer.json (%zu bytes)", path, size);
        else if (!(buf = malloc(size)))
            rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
        else if ((got = util_read_all(fd, buf, size, 0)) < 0 || (size_t)got != size)
            rc = util_fail(err, errlen, -EIO, "%s: read failed or the file changed while reading", path);
        tok_t *t = rc ? NULL : calloc(1, sizeof(*t));
        if (!rc && !t) rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
        if (!rc && !(rc = hftok_load(&t->hf, path, buf, size, err, errlen))) *out = t;
        else if (t) free(t);
    }
    free(buf);
    close(fd);
    return rc;
}

int tok_load(tok_t **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    uint8_t *buf;
    size_t size, n_merges = 0;
    int is_json = 0;
    char sub[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) &&
        snprintf(sub, sizeof(sub), "%s/tokenizer.json", path) < (int)sizeof(sub))
        path = sub; /* a Hugging Face model folder */
    int rc = load_hf(out, path, &is_json, err, errlen);
    if (rc || is_json)
        return rc;
    rc = read_file(path, &buf, &size, err, errlen);
    if (rc)
        return rc;
    uint32_t *merges = NULL;
    if ((rc = check_header(path, buf, size, &n_merges, err, errlen)))
        goto out;
    if (!(merges = malloc(8 * n_merges))) {
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
        goto out;
    }
    memcpy(merges, buf + TOK_HEADER_BYTES, 8 * n_merges);
    for (size_t r = 0; r < n_merges; r++)
        if (merges[2 * r] >= 256 + r || merges[2 * r + 1] >= 256 + r) {
            rc = util_fail(err, errlen, -EINVAL, "%s: merge %zu is (%u, %u), but may only use tokens below %zu",
                           path, r, merges[2 * r], merges[2 * r + 1], 256 + r);
            goto out;
        }
    rc = tok_build(out, merges, (int)n_merges);
    merges = NULL;
    if (rc) util_fail(err, errlen, rc, "%s: out of memory", path);
out:
    free(merges);
    free(buf);
    return rc;
}
