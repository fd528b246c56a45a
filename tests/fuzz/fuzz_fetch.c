/* libFuzzer harness: the parts of a fetch (checkpointd/remote_int.h rmt_fetch_part and
 * rmt_fetch_done) into the directory sink (rmt_dir_sink_t: `rmt_client_fetch_dir`), what a
 * trainer takes from what its storage host sends (a host it trusts by key, whose files may
 * still be damaged or its process broken). The input: tests/fuzz/fetch_parts.h. Properties:
 * the directory only ever holds plain files named "index" or as the decoded index names them;
 * a fetch that ends well holds every file of the index at its size, and an index file that
 * decodes to one of step 5 naming them, and verifies (ckpt_verify: every header and chunk), as
 * the sink checked them on the way. */
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fuzz/fetch_parts.h"

static char g_root[64];
static fake_ckpt_t g_k;

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
    fake_ckpt_init(&g_k);
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

typedef struct {
    const char *dir;
    const rmt_fetch_t *F;
} seen_t;

static void after_part(void *arg)
{
    const seen_t *v = arg;
    check_dir(v->dir, v->F);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_k.index)
        setup();
    char dir[PATH_MAX], err[1024];
    snprintf(dir, sizeof(dir), "%s/d", g_root);
    FUZZ_CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    rmt_dir_sink_t ds;
    rmt_dir_sink_init(&ds, dir, "step 5 of job job from fuzz");
    rmt_fetch_t F;
    rmt_fetch_init(&F, &ds.sink, "job", 5, "fuzz");
    seen_t v = {dir, &F};
    int done;
    if (feed_parts(&F, &g_k, data, size, &done, after_part, &v, err, sizeof(err)) == 0 && done) {
        if (rmt_fetch_done(&F, err, sizeof(err)) == 0 && rmt_dir_sink_finish(&ds, err, sizeof(err)) == 0) {
            check_whole(dir, &F);
            int bad = 0;
            FUZZ_CHECK(ckpt_verify(dir, NULL, &bad, err, sizeof(err)) == 0, "a fetch that ended well: %s", err);
        }
        check_dir(dir, &F);
    }
    rmt_fetch_free(&F);
    rmt_dir_sink_close(&ds);
    remove_dir(dir);
    return 0;
}
