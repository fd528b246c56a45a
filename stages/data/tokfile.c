/* Token shard files (see stages/data/tokfile.h for both formats): the reader maps a file read-only
 * and checks everything a loader would otherwise trip over later; the writer is durable and
 * atomic (temp file, fsync, rename, fsync of the directory). */
#include "stages/data/tokfile.h"
#include "ipc/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokfile assumes a little-endian host (the files are little-endian)"
#endif

struct tokfile {
    char *path;
    const uint8_t *map;   /* whole file, read-only */
    size_t map_len;
    const void *tokens;   /* map + header size */
    size_t count;
    int dtype;            /* bytes per token: 2 or 4 */
    int vocab_size;       /* from the header; 0 if unknown (llm.c) */
    tokfile_format_t format;
};

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The first token >= limit, or count if none. Max-reduce first (vectorises), find the
 * position only on failure. */
static size_t first_bad_token(const void *tokens, int dtype, size_t count, uint64_t limit)
{
    uint32_t mx = 0;
    if (dtype == 2) {
        const uint16_t *t = tokens;
        uint16_t m = 0;
        for (size_t i = 0; i < count; i++) m = t[i] > m ? t[i] : m;
        mx = m;
    } else {
        const uint32_t *t = tokens;
        for (size_t i = 0; i < count; i++) mx = t[i] > mx ? t[i] : mx;
    }
    if (count == 0 || mx < limit) return count;
    for (size_t i = 0; i < count; i++) {
        uint32_t v = dtype == 2 ? ((const uint16_t *)tokens)[i] : ((const uint32_t *)tokens)[i];
        if (v >= limit) return i;
    }
    return count;
}

/* The ctitan header of a file of `size` bytes mapped at map: its size, dtype and vocab into
 * tf, the header length into *hdr and the token count into *count. */
static int read_ctitan_header(tokfile_t *tf, const char *path, const uint8_t *map, size_t size, size_t *hdr,
                              uint64_t *count, char *err, size_t errlen)
{
    *hdr = TOKFILE_HEADER_BYTES;
    if (size < *hdr)
        return util_fail(err, errlen, -EINVAL, "%s: header too short: file has %zu bytes, the header needs %zu",
                         path, size, *hdr);
    uint32_t version = rd32(map + 8), dtype = rd32(map + 12), vocab = rd32(map + 24);
    *count = rd64(map + 16);
    if (version != TOKFILE_VERSION)
        return util_fail(err, errlen, -EINVAL, "%s: unsupported version %u (this build reads %u)", path, version,
                         TOKFILE_VERSION);
    if (dtype != 2 && dtype != 4)
        return util_fail(err, errlen, -EINVAL, "%s: unknown token dtype %u (expected 2 = uint16 or 4 = uint32)",
                         path, dtype);
    if (vocab == 0 || vocab > INT32_MAX || (dtype == 2 && vocab > 65536))
        return util_fail(err, errlen, -EINVAL, "%s: invalid vocab_size %u in header for dtype %u", path, vocab,
                         dtype);
    tf->format = TOKFILE_FORMAT_CTITAN;
    tf->dtype = (int)dtype;
    tf->vocab_size = (int)vocab;
    return 0;
}

/* The same for llm.c's header (magic already matched). */
static int read_llmc_header(tokfile_t *tf, const char *path, const uint8_t *map, size_t size, size_t *hdr,
                            uint64_t *count, char *err, size_t errlen)
{
    *hdr = TOKFILE_LLMC_HEADER_BYTES;
    if (size < *hdr)
        return util_fail(err, errlen, -EINVAL, "%s: header too short: file has %zu bytes, an llm.c header needs %zu",
                         path, size, *hdr);
    uint32_t magic = rd32(map), version = rd32(map + 4);
    int32_t n = (int32_t)rd32(map + 8);
    uint32_t want = magic == TOKFILE_LLMC_MAGIC ? TOKFILE_LLMC_VERSION : TOKFILE_LLMC_LLAMA3_VERSION;
    if (version != want)
        return util_fail(err, errlen, -EINVAL, "%s: unsupported version %u for llm.c magic %u (this build reads %u)",
                         path, version, magic, want);
    if (n < 0)
        return util_fail(err, errlen, -EINVAL, "%s: negative token count %d in llm.c header", path, n);
    *count = (uint64_t)n;
    tf->format = TOKFILE_FORMAT_LLMC;
    tf->dtype = magic == TOKFILE_LLMC_MAGIC ? 2 : 4;
    tf->vocab_size = 0;
    return 0;
}

/* Header, size and token ids of the file mapped at map into tf. */
static int read_file(tokfile_t *tf, const char *path, const uint8_t *map, size_t size, int vocab_size, char *err,
                     size_t errlen)
{
    size_t hdr = 0;
    uint64_t count = 0;
    uint32_t magic = rd32(map);
    int rc;
    if (!memcmp(map, TOKFILE_MAGIC, 8))
        rc = read_ctitan_header(tf, path, map, size, &hdr, &count, err, errlen);
    else if (magic == TOKFILE_LLMC_MAGIC || magic == TOKFILE_LLMC_LLAMA3_MAGIC)
        rc = read_llmc_header(tf, path, map, size, &hdr, &count, err, errlen);
    else
        rc = util_fail(err, errlen, -EINVAL,
                       "%s: not a token file: unknown magic (first bytes %02x %02x %02x %02x; expected "
                       "\"%s\" or llm.c's %d)",
                       path, map[0], map[1], map[2], map[3], TOKFILE_MAGIC, TOKFILE_LLMC_MAGIC);
    if (rc)
        return rc;
    uint64_t body = size - hdr;
    if (count > body / (uint64_t)tf->dtype || body != count * (uint64_t)tf->dtype)
        return util_fail(err, errlen, -EINVAL,
                         "%s: file size %zu does not match the header's %llu tokens of %d bytes "
                         "(expected %llu bytes)",
                         path, size, (unsigned long long)count, tf->dtype,
                         (unsigned long long)(hdr + count * (uint64_t)tf->dtype));
    tf->map = map;
    tf->map_len = size;
    tf->tokens = map + hdr;
    tf->count = (size_t)count;
    /* tokens must be valid for both the tokenizer that wrote them and the model reading them */
    uint64_t limit = tf->vocab_size ? (uint64_t)tf->vocab_size : UINT64_MAX;
    if (vocab_size > 0 && (uint64_t)vocab_size < limit) limit = (uint64_t)vocab_size;
    if (limit > (uint64_t)INT32_MAX + 1) limit = (uint64_t)INT32_MAX + 1; /* tokfile_read: int32 */
    size_t bad = first_bad_token(tf->tokens, tf->dtype, tf->count, limit);
    if (bad < tf->count)
        return util_fail(err, errlen, -EINVAL, "%s: token %u at position %zu is >= vocab_size %llu%s", path,
                         tokfile_get(tf, bad), bad, (unsigned long long)limit,
                         limit == (uint64_t)vocab_size ? "" : " (from the file header)");
    return 0;
}

int tokfile_open(tokfile_t **out, const char *path, int vocab_size, char *err, size_t errlen)
{
    *out = NULL;
    int rc = 0;
    tokfile_t *tf = NULL;
    uint8_t *map = MAP_FAILED;
    size_t size = 0;
    int fd = util_open_regular(path, &size, err, errlen);
    if (fd < 0)
        return fd;
    if (size < 8) {
        rc = util_fail(err, errlen, -EINVAL,
                  "%s: header too short: file has %zu bytes, a token file header needs %d", path,
                  size, TOKFILE_HEADER_BYTES);
        goto out;
    }
    map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = util_fail(err, errlen, -errno, "%s: cannot mmap: %s", path, strerror(errno));
        goto out;
    }
    tf = calloc(1, sizeof(*tf));
    if (!tf || !(tf->path = strdup(path))) {
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
        goto out;
    }
    if ((rc = read_file(tf, path, map, size, vocab_size, err, errlen)))
        goto out;
    madvise(map, size, MADV_SEQUENTIAL);
    map = MAP_FAILED; /* owned by tf now */
    *out = tf;
    tf = NULL;
out:
    if (map != MAP_FAILED) munmap(map, size);
    if (tf) {
        free(tf->path);
        free(tf);
    }
    close(fd);
    return rc;
}

void tokfile_close(tokfile_t **p)
{
    tokfile_t *tf = *p;
    if (!tf) return;
    munmap((void *)tf->map, tf->map_len);
    free(tf->path);
    free(tf);
    *p = NULL;
}

size_t tokfile_count(const tokfile_t *tf) { return tf->count; }
int tokfile_vocab_size(const tokfile_t *tf) { return tf->vocab_size; }
tokfile_format_t tokfile_format(const tokfile_t *tf) { return tf->format; }
const char *tokfile_path(const tokfile_t *tf) { return tf->path; }

uint32_t tokfile_get(const tokfile_t *tf, size_t i)
{
    if (tf->dtype == 2) return ((const uint16_t *)tf->tokens)[i];
    return ((const uint32_t *)tf->tokens)[i];
}

int tokfile_read(const tokfile_t *tf, size_t start, size_t n, int32_t *dst)
{
    if (start > tf->count || n > tf->count - start) return -ERANGE;
    if (tf->dtype == 2) {
        const uint16_t *t = (const uint16_t *)tf->tokens + start;
        for (size_t i = 0; i < n; i++) dst[i] = t[i];
    } else {
        /* ids were checked against a vocab_size <= INT32_MAX at open */
        memcpy(dst, (const uint32_t *)tf->tokens + start, n * sizeof(int32_t));
    }
    return 0;
}

/* ---- durable, atomic writes ---- */

int tokfile_write_bytes(const char *path, const void *a, size_t alen, const void *b, size_t blen,
                        char *err, size_t errlen)
{
    util_afile_t at;
    int rc = util_afile_begin(&at, path, err, errlen);
    if (rc) return rc;
    if ((rc = util_afile_write(&at, a, alen, err, errlen)) || (rc = util_afile_write(&at, b, blen, err, errlen))) {
        util_afile_abort(&at);
        return rc;
    }
    return util_afile_commit(&at, err, errlen);
}

int tokfile_write(const char *path, const uint32_t *tok, size_t n, int vocab_size, char *err,
                  size_t errlen)
{
    if (vocab_size <= 0)
        return util_fail(err, errlen, -EINVAL, "%s: vocab_size %d must be positive", path, vocab_size);
    for (size_t i = 0; i < n; i++)
        if (tok[i] >= (uint32_t)vocab_size)
            return util_fail(err, errlen, -EINVAL, "%s: token %u at position %zu is >= vocab_size %d",
                        path, tok[i], i, vocab_size);
    int dtype = vocab_size <= 65536 ? 2 : 4;
    uint8_t hdr[TOKFILE_HEADER_BYTES] = {0};
    uint32_t version = TOKFILE_VERSION, dt = (uint32_t)dtype, vocab = (uint32_t)vocab_size;
    uint64_t count = n;
    memcpy(hdr, TOKFILE_MAGIC, 8);
    memcpy(hdr + 8, &version, 4);
    memcpy(hdr + 12, &dt, 4);
    memcpy(hdr + 16, &count, 8);
    memcpy(hdr + 24, &vocab, 4);
    if (dtype == 4) return tokfile_write_bytes(path, hdr, sizeof(hdr), tok, n * 4, err, errlen);

    util_afile_t at;
    int rc = util_afile_begin(&at, path, err, errlen);
    if (rc) return rc;
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = malloc(CHUNK * sizeof(uint16_t));
    if (!buf) {
        rc = util_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
        goto out;
    }
    if ((rc = util_afile_write(&at, hdr, sizeof(hdr), err, errlen))) goto out;
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        for (size_t j = 0; j < m; j++) buf[j] = (uint16_t)tok[i + j];
        if ((rc = util_afile_write(&at, buf, m * sizeof(uint16_t), err, errlen))) goto out;
    }
    free(buf);
    return util_afile_commit(&at, err, errlen);
out:
    free(buf);
    util_afile_abort(&at);
    return rc;
}
