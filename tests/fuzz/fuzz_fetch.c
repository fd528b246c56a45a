/* libFuzzer harness: the parts of a fetch (checkpointd/remote_int.h rmt_fetch_part and
 * rmt_fetch_done) into the directory sink (rmt_dir_sink_t: `rmt_client_fetch_dir`), what a
 * trainer takes from what its storage host sends (a host it trusts by key, whose files may
 * still be damaged or its process broken). The input is a list of parts, each 12 bytes then
 * its payload:
 *   file (1), flags (1), size (4, LE), offset (4, LE), n (2, LE), then n bytes unless FILL
 *   flags: TRUE_SIZE: the file's real size instead of `size` (the harness's index: its length
 *          for file 0, the index's size of data file K - 1); AT_GOT: the offset is where the
 *          file stands instead of `offset`; FILL: no bytes follow, the payload is n bytes of
 *          the real file from that offset (file 0: the index's bytes; data files: zeros), n 0
 *          meaning up to its end; DONE: the server's ok comes after this part.
 * so that mutations get past the index's checksum into the data files' rules. Properties: the
 * directory only ever holds plain files named "index" or as the decoded index names them; a
 * fetch that ends well holds every file of the index at its size, and an index file that
 * decodes to one of step 5 naming them. */
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpointd/remote_int.h"
#include "kernels/optim.h"
#include "tests/fuzz/fuzz.h"

enum { TRUE_SIZE = 1, AT_GOT = 2, FILL = 4, DONE = 8 };

static char g_root[64];
static uint8_t *g_index; /* a real index: two tensors of 4 floats, AdamW */
static size_t g_index_n;
static ckpt_index_t g_ix;

static void cleanup(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_root);
    if (g_root[0] && system(cmd)) {}
}

static void setup(void)
{
    snprintf(g_root, sizeof(g_root), "/tmp/ctitan-fuzz-fetch-XXXXXX");
    FUZZ_CHECK(mkdtemp(g_root), "mkdtemp");
    atexit(cleanup);
    param_info_t t[2] = {{.name = "model.norm.weight", .kind = 0, .layer = -1, .ndim = 1, .shape = {4}, .numel = 4},
                         {.name = "lm_head.weight", .kind = 0, .layer = -1, .ndim = 2, .shape = {2, 2},
                          .offset = 4, .numel = 4}};
    param_table_t tab = {.n = 2, .t = t, .total = 8};
    FUZZ_CHECK(ckpt_index_plan(&g_ix, &tab, optim_find("AdamW"), 5, "", NULL, 0) == 0, "plan");
    FUZZ_CHECK(ckpt_index_encode(&g_ix, &g_index, &g_index_n) == 0, "encode");
}

static uint32_t le(const uint8_t *p, int n)
{
    uint32_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* What the directory holds: plain files, named "index" or by the decoded index. */
static void check_dir(const char *dir, const rmt_fetch_t *F)
{
    DIR *d = opendir(dir);
    FUZZ_CHECK(d, "%s gone", dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        int known = !strcmp(e->d_name, "index");
        for (int k = 0; F->have_ix && k < F->ix.n_files; k++)
            known |= !strcmp(e->d_name, F->ix.files[k].name);
        FUZZ_CHECK(known, "%s/%s: not a file of the index", dir, e->d_name);
        FUZZ_CHECK(e->d_type == DT_REG, "%s/%s: not a plain file", dir, e->d_name);
    }
    closedir(d);
}

/* A fetch that ended well: every file there at the index's size, the index file an index of
 * step 5 naming them. */
static void check_whole(const char *dir, const rmt_fetch_t *F)
{
    char path[PATH_MAX], err[512];
    struct stat st;
    FUZZ_CHECK(F->have_ix, "done without an index");
    for (int k = 0; k < F->ix.n_files; k++) {
        snprintf(path, sizeof(path), "%s/%s", dir, F->ix.files[k].name);
        FUZZ_CHECK(stat(path, &st) == 0 && (uint64_t)st.st_size == F->ix.files[k].bytes, "%s: not %llu bytes", path,
                   (unsigned long long)F->ix.files[k].bytes);
    }
    snprintf(path, sizeof(path), "%s/index", dir);
    FILE *f = fopen(path, "rb");
    FUZZ_CHECK(f && stat(path, &st) == 0, "%s missing", path);
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    FUZZ_CHECK(buf && fread(buf, 1, (size_t)st.st_size, f) == (size_t)st.st_size, "read %s", path);
    fclose(f);
    ckpt_index_t ix;
    FUZZ_CHECK(ckpt_index_decode(buf, (size_t)st.st_size, &ix, path, err, sizeof(err)) == 0, "%s", err);
    FUZZ_CHECK(ix.step == 5 && ix.n_files == F->ix.n_files, "the index written is another one");
    ckpt_index_free(&ix);
    free(buf);
}

/* The directory, holding plain files only (check_dir), removed. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    FUZZ_CHECK(d, "%s", dir);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            FUZZ_CHECK(unlinkat(dirfd(d), e->d_name, 0) == 0, "unlink %s/%s", dir, e->d_name);
    closedir(d);
    FUZZ_CHECK(rmdir(dir) == 0, "rmdir %s", dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_index)
        setup();
    char dir[PATH_MAX], err[1024];
    snprintf(dir, sizeof(dir), "%s/d", g_root);
    FUZZ_CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    rmt_dir_sink_t ds;
    rmt_dir_sink_init(&ds, dir);
    rmt_fetch_t F;
    rmt_fetch_init(&F, &ds.sink, "job", 5, "fuzz");
    static uint8_t zeros[1 << 16];
    int rc = 0, done = 0;
    size_t at = 0;
    while (!rc && !done && size - at >= 12) {
        const uint8_t *r = data + at;
        uint8_t flags = r[1];
        rmt_hdr_t h = {.type = RMT_PART, .file = r[0], .size = le(r + 2, 4), .offset = le(r + 6, 4)};
        size_t n = le(r + 10, 2);
        at += 12;
        if (flags & TRUE_SIZE)
            h.size = h.file == 0 ? g_index_n : h.file <= (uint32_t)g_ix.n_files ? g_ix.files[h.file - 1].bytes : 0;
        if (flags & AT_GOT)
            h.offset = F.any && h.file == F.file ? F.got : 0;
        const uint8_t *payload;
        if (flags & FILL) {
            uint64_t end = h.file == 0 ? g_index_n : h.size;
            n = n ? n : (size_t)(end > h.offset ? end - h.offset : 0);
            if (n > sizeof(zeros))
                n = sizeof(zeros);
            payload = h.file == 0 && h.offset <= g_index_n && n <= g_index_n - h.offset ? g_index + h.offset : zeros;
        } else {
            if (n > size - at)
                n = size - at;
            payload = data + at;
            at += n;
        }
        rc = rmt_fetch_part(&F, &h, payload, n, err, sizeof(err));
        check_dir(dir, &F);
        if (!rc && (flags & DONE)) {
            done = 1;
            if (rmt_fetch_done(&F, err, sizeof(err)) == 0)
                check_whole(dir, &F);
            check_dir(dir, &F);
        }
    }
    rmt_fetch_free(&F);
    rmt_dir_sink_close(&ds);
    remove_dir(dir);
    return 0;
}
