/* Checkpoints written in parts, one per host (checkpointd/ckpt.h ckpt_index_plan_parts,
 * checkpointd/writer.h ckw_begin_part / ckw_commit_part / ckw_commit_parts, and
 * `checkpointd --save-part`): the plan's files and chunks, parts written by separate processes
 * into one temporary directory and committed into an ordinary checkpoint that every reader
 * reads, every way a part can be missing or damaged refused by name with no step-N left, and a
 * host's one-shot checkpointd writing its part from its staging segment. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <cmocka.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/restore.h"
#include "checkpointd/writer.h"
#include "ipc/ctl.h"
#include "ipc/shm.h"
#include "kernels/params.h"
#include "stages/job/job.h"
#include "stages/job/manifest.h"
#include "stages/job/staging.h"
#include "stages/runtime/worker.h"
#include "tests/testutil.h"

#define STEP 7

typedef struct {
    char dir[256], job[64], tmp[64]; /* tmp: the temporary directory's name for STEP */
    manifest_t m;          /* a job of 2 hosts (pp 2, dp 2), checkpoints in dir */
    param_table_t tab;
    float *arr[3];         /* weights, exp_avg, exp_avg_sq: tab.total each */
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    char err[512];
    snprintf(f->dir, sizeof(f->dir), "/tmp/ctitan-test-ckparts-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->job, sizeof(f->job), "test-ckparts-%d", (int)getpid());
    snprintf(f->tmp, sizeof(f->tmp), ".tmp-step-%08d.%d", STEP, (int)getpid());
    /* across hosts: the NCCL plane on the GPU, whole replicas per host, a TCP endpoint; the tiny
     * model with a head dimension the CUDA attention takes */
    const char *kv[][2] = {{"job.name", f->job}, {"model.flavor", "tiny"}, {"model.dim", "64"},
                           {"training.seq_len", "16"}, {"parallelism.data_plane", "nccl"}, {"job.device", "cuda"},
                           {"parallelism.pipeline_parallel_degree", "2"},
                           {"parallelism.data_parallel_replicate_degree", "2"}, {"job.hosts", "2"},
                           {"job.host_rank", "1"}, {"job.endpoint", "tcp://127.0.0.1:29500"},
                           {"checkpoint.folder", f->dir}};
    manifest_defaults(&f->m);
    for (size_t k = 0; k < sizeof(kv) / sizeof(kv[0]); k++)
        if (manifest_override(&f->m, kv[k][0], kv[k][1], err, sizeof(err)))
            fail_msg("%s: %s", kv[k][0], err);
    if (manifest_validate(&f->m, err, sizeof(err)))
        fail_msg("%s", err);
    assert_int_equal(params_table_init(&f->tab, &f->m.model), 0);
    for (int a = 0; a < 3; a++) {
        f->arr[a] = malloc(f->tab.total * sizeof(float));
        tu_fill(NULL, f->arr[a], f->tab.total, 300 + a, 1.0);
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    shm_remove_all(f->job);
    char seg[96];
    snprintf(seg, sizeof(seg), "%s-h1", f->job);
    shm_remove_all(seg);
    tu_rmtree(f->dir);
    for (int a = 0; a < 3; a++)
        free(f->arr[a]);
    params_table_free(&f->tab);
    free(f);
    return 0;
}

/* n ranges over [0, total) of the given parts, cut at uneven places (inside tensors). */
static void cut(ckpt_part_range_t *r, uint64_t total, const int *parts, int n)
{
    for (int i = 0; i < n; i++)
        r[i] = (ckpt_part_range_t){i ? r[i - 1].end : 0, i == n - 1 ? total : total * (i + 1) / n + 37 * (i + 1),
                                   parts[i]};
}

/* Part `part` of a plan, from the fixture's arrays, into DIR/tmp as a host writes it: each
 * array's header, then the part's ranges in flat order, in uneven pieces. */
static int write_part(fx_t *f, const char *dir, const char *tmp, const ckpt_index_t *plan, const ckpt_part_range_t *r,
                      int n_r, int part, int n_parts, char *err, size_t errlen)
{
    ckw_t *w;
    int rc = ckw_begin_part(&w, dir, tmp, plan, part, n_parts, err, errlen);
    if (rc)
        return rc;
    static _Alignas(4096) uint8_t hdr[CKPT_DATA_HDR];
    for (int a = 0; a < 3 && !rc; a++) {
        uint32_t file = (uint32_t)(3 * part + a);
        uint64_t off = CKPT_DATA_HDR;
        ckpt_data_header(hdr, file, plan->step);
        rc = ckw_write(w, file, 0, hdr, sizeof(hdr), err, errlen);
        for (int i = 0; i < n_r && !rc; i++) {
            if (r[i].part != part)
                continue;
            const char *p = (const char *)(f->arr[a] + r[i].begin);
            size_t n = (r[i].end - r[i].begin) * sizeof(float), piece = 1234 * 4;
            for (size_t x = 0; x < n && !rc; x += piece) {
                size_t k = n - x < piece ? n - x : piece;
                rc = ckw_write(w, file, off, p + x, k, err, errlen);
                off += k;
            }
        }
    }
    if (rc)
        ckw_abort(&w);
    else
        rc = ckw_commit_part(&w, NULL, err, errlen);
    return rc;
}

/* The same arrays as one ordinary checkpoint in DIR (the reference). */
static void write_whole(fx_t *f, const char *dir, char *path, size_t pathlen)
{
    char err[1024];
    ckpt_index_t plan;
    assert_int_equal(ckpt_index_plan(&plan, &f->tab, optim_find("AdamW"), STEP, "", NULL, 0), 0);
    plan.created = 1764000000; /* as the parts' plan of the same arrays: the same export */
    ckw_t *w;
    assert_int_equal(ckw_begin(&w, dir, &plan, err, sizeof(err)), 0);
    static _Alignas(4096) uint8_t hdr[CKPT_DATA_HDR];
    for (int a = 0; a < 3; a++) {
        ckpt_data_header(hdr, (uint32_t)a, STEP);
        assert_int_equal(ckw_write(w, (uint32_t)a, 0, hdr, sizeof(hdr), err, sizeof(err)), 0);
        assert_int_equal(ckw_write(w, (uint32_t)a, CKPT_DATA_HDR, f->arr[a], f->tab.total * sizeof(float), err,
                                   sizeof(err)), 0);
    }
    assert_int_equal(ckw_commit(&w, path, pathlen, NULL, err, sizeof(err)), 0);
    ckpt_index_free(&plan);
}

/* Every tensor of the checkpoint at path reads back as the fixture's arrays, and it verifies. */
static void expect_arrays(fx_t *f, const char *path)
{
    char err[1024];
    int bad;
    if (ckpt_verify(path, stderr, &bad, err, sizeof(err)))
        fail_msg("%s", err);
    ckpt_t *ck;
    assert_int_equal(ckpt_open(&ck, path, err, sizeof(err)), 0);
    assert_int_equal(ckpt_index(ck)->n_tensors, 3 * f->tab.n);
    const char *pre[3] = {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."};
    for (int a = 0; a < 3; a++)
        for (int t = 0; t < f->tab.n; t++) {
            const param_info_t *p = &f->tab.t[t];
            char name[256];
            snprintf(name, sizeof(name), "%s%s", pre[a], p->name);
            float *got = malloc(p->numel * sizeof(float));
            if (ckpt_read(ck, name, 0, p->numel, got, err, sizeof(err)))
                fail_msg("%s", err);
            assert_memory_equal(got, f->arr[a] + p->offset, p->numel * sizeof(float));
            free(got);
        }
    ckpt_close(&ck);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void test_ckpt_parts_one_part_is_the_whole_plan_byte_for_byte(void **state)
{
    (void)state;
    static const char *flavors[] = {"tiny", "gpt2s"}; /* gpt2s: tensors of many 4 MiB chunks */
    uint8_t cur[3] = {0x81, 0xa1, 's'};
    for (int v = 0; v < 2; v++) {
        model_config_t c;
        param_table_t tab;
        assert_int_equal(config_preset(flavors[v], &c), 0);
        assert_int_equal(params_table_init(&tab, &c), 0);
        ckpt_part_range_t one = {0, tab.total, 0}, three[3];
        int zeros[3] = {0, 0, 0};
        cut(three, tab.total, zeros, 3); /* ranges of one part are one run: the same chunks */
        const ckpt_part_range_t *sets[2] = {&one, three};
        int sizes[2] = {1, 3};
        ckpt_index_t want, got;
        uint8_t *wb, *gb;
        size_t wl, gl;
        assert_int_equal(ckpt_index_plan(&want, &tab, optim_find("AdamW"), 12, "[job]\nname = \"x\"\n", cur, sizeof(cur)), 0);
        want.created = 1;
        assert_int_equal(ckpt_index_encode(&want, &wb, &wl), 0);
        for (int s = 0; s < 2; s++) {
            assert_int_equal(ckpt_index_plan_parts(&got, &tab, optim_find("AdamW"), 12, "[job]\nname = \"x\"\n", cur, sizeof(cur), 1,
                                                   sets[s], sizes[s]), 0);
            got.created = 1;
            assert_int_equal(ckpt_index_encode(&got, &gb, &gl), 0);
            assert_int_equal(gl, wl);
            assert_memory_equal(gb, wb, wl);
            free(gb);
            ckpt_index_free(&got);
        }
        free(wb);
        ckpt_index_free(&want);
        params_table_free(&tab);
    }
}

/* A plan in parts: the decoder takes it; files are part-major with their names and sizes (a
 * part that owns nothing has its three, header only); each tensor's chunks cover it in element
 * order, at most 4 MiB, none across a change of owner, each in its owner's file at the offset
 * its range has there. */
static void test_ckpt_parts_plan_puts_every_chunk_in_its_owners_file(void **state)
{
    (void)state;
    static const struct {
        const char *flavor;
        int n_parts, n_ranges, parts[8];
    } cases[] = {
        {"tiny", 2, 4, {0, 1, 0, 1}},
        {"tiny", 3, 5, {1, 0, 1, 0, 1}},       /* part 2 owns nothing */
        {"gpt2s", 2, 4, {0, 1, 0, 1}},         /* cuts inside 4 MiB chunks of large tensors */
        {"gpt2s", 4, 8, {0, 1, 2, 3, 0, 1, 2, 3}},
        {"debugmodel", 2, 3, {1, 1, 0}},       /* a run of two ranges of one part */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        model_config_t cfg;
        param_table_t tab;
        assert_int_equal(config_preset(cases[c].flavor, &cfg), 0);
        assert_int_equal(params_table_init(&tab, &cfg), 0);
        int H = cases[c].n_parts, R = cases[c].n_ranges;
        ckpt_part_range_t r[8];
        cut(r, tab.total, cases[c].parts, R);
        ckpt_index_t ix, dec;
        assert_int_equal(ckpt_index_plan_parts(&ix, &tab, optim_find("AdamW"), 3, "", NULL, 0, H, r, R), 0);
        uint8_t *buf;
        size_t len;
        char err[512];
        assert_int_equal(ckpt_index_encode(&ix, &buf, &len), 0);
        if (ckpt_index_decode(buf, len, &dec, "plan", err, sizeof(err)))
            fail_msg("case %zu: %s", c, err);
        ckpt_index_free(&dec);
        free(buf);
        /* where each range lies in its part's files, computed here independently, and the runs of
         * ranges of one owner (ranges of one part side by side lie side by side in its files, so a
         * chunk may span them; the ranges of job_host_parts are merged: a run is a range) */
        uint64_t at[8], owned[8] = {0}, sum = 0, run_at[8];
        ckpt_part_range_t run[8];
        int nr = 0;
        for (int i = 0; i < R; i++) {
            at[i] = CKPT_DATA_HDR + owned[r[i].part] * 4;
            owned[r[i].part] += r[i].end - r[i].begin;
            if (nr && run[nr - 1].part == r[i].part) {
                run[nr - 1].end = r[i].end;
            } else {
                run_at[nr] = at[i];
                run[nr++] = r[i];
            }
        }
        assert_int_equal(ix.n_files, 3 * H);
        const char *stems[3] = {"model", "exp_avg", "exp_avg_sq"};
        for (int k = 0; k < H; k++)
            for (int a = 0; a < 3; a++) {
                char name[64];
                snprintf(name, sizeof(name), "%s.h%d.bin", stems[a], k);
                assert_string_equal(ix.files[3 * k + a].name, name);
                assert_int_equal(ix.files[3 * k + a].bytes, CKPT_DATA_HDR + owned[k] * 4);
                assert_int_equal(ckpt_part_of_file((uint32_t)(3 * k + a), ix.n_files, H), k);
                sum += ix.files[3 * k + a].bytes;
            }
        assert_int_equal(sum, 3 * ((uint64_t)H * CKPT_DATA_HDR + 4 * (uint64_t)tab.total));
        for (int a = 0; a < 3; a++)
            for (int t = 0; t < tab.n; t++) {
                const ckpt_tensor_t *ct = &ix.tensors[a * tab.n + t];
                uint64_t x = tab.t[t].offset, te = x + tab.t[t].numel;
                for (uint32_t k = 0; k < ct->n_chunks; k++) {
                    const ckpt_chunk_t *ch = &ct->chunks[k];
                    int i = 0;
                    while (run[i].end <= x)
                        i++;
                    uint64_t n = ch->length / 4;
                    if (ch->length % 4 || !n || ch->length > CKPT_CHUNK_BYTES || x + n > run[i].end)
                        fail_msg("case %zu %s chunk %u: %llu bytes at element %llu, its owner's run ends at %llu", c,
                                 ct->name, k, (unsigned long long)ch->length, (unsigned long long)x,
                                 (unsigned long long)run[i].end);
                    if (ch->length < CKPT_CHUNK_BYTES && x + n != te && x + n != run[i].end)
                        fail_msg("case %zu %s chunk %u: short, at neither the tensor's end nor its owner's", c,
                                 ct->name, k);
                    assert_int_equal(ch->file, 3 * run[i].part + a);
                    assert_int_equal(ch->offset, run_at[i] + (x - run[i].begin) * 4);
                    assert_true(ch->offset + ch->length <= ix.files[ch->file].bytes);
                    x += n;
                }
                assert_int_equal(x, te);
            }
        ckpt_index_free(&ix);
        /* ranges that do not tile the space are refused */
        ckpt_part_range_t badr[8];
        memcpy(badr, r, sizeof(r));
        badr[1].begin += 1; /* a gap */
        assert_int_equal(ckpt_index_plan_parts(&ix, &tab, optim_find("AdamW"), 3, "", NULL, 0, H, badr, R), -EINVAL);
        memcpy(badr, r, sizeof(r));
        badr[R - 1].end -= 1; /* short of the end */
        assert_int_equal(ckpt_index_plan_parts(&ix, &tab, optim_find("AdamW"), 3, "", NULL, 0, H, badr, R), -EINVAL);
        memcpy(badr, r, sizeof(r));
        badr[0].part = H; /* no such part */
        assert_int_equal(ckpt_index_plan_parts(&ix, &tab, optim_find("AdamW"), 3, "", NULL, 0, H, badr, R), -EINVAL);
        assert_int_equal(ckpt_index_plan_parts(&ix, &tab, optim_find("AdamW"), 3, "", NULL, 0, CKPT_PARTS_MAX + 1, r, R), -EINVAL);
        params_table_free(&tab);
    }
}

/* The checksum file's codec: a round trip, and every flipped byte and truncation refused. */
static void test_ckpt_parts_sums_file_round_trips_and_refuses_damage(void **state)
{
    (void)state;
    uint64_t sums[5] = {1, 2, 3, 0xfeedfacecafebeefULL, 0};
    ckpt_part_sums_t ps = {.step = 9, .part = 1, .n_parts = 3, .count = 5, .xxh = sums}, got;
    uint8_t *buf;
    size_t len;
    char err[512], name[32];
    assert_int_equal(ckpt_part_sums_encode(&ps, &buf, &len), 0);
    assert_int_equal(len, ckpt_part_sums_bytes(5));
    assert_int_equal(ckpt_part_sums_decode(buf, len, &got, "p", err, sizeof(err)), 0);
    assert_true(got.step == 9 && got.part == 1 && got.n_parts == 3 && got.count == 5);
    assert_memory_equal(got.xxh, sums, sizeof(sums));
    ckpt_part_sums_free(&got);
    for (size_t i = 0; i < len; i++) {
        buf[i] ^= 0x20;
        assert_int_equal(ckpt_part_sums_decode(buf, len, &got, "p", err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "p: bad part checksum file: "));
        buf[i] ^= 0x20;
    }
    for (size_t n = 0; n < len; n++)
        assert_int_equal(ckpt_part_sums_decode(buf, n, &got, "p", err, sizeof(err)), -EBADMSG);
    free(buf);
    ps.part = 3; /* part >= n_parts, checksum right */
    assert_int_equal(ckpt_part_sums_encode(&ps, &buf, &len), 0);
    assert_int_equal(ckpt_part_sums_decode(buf, len, &got, "p", err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "part 3 of 3 parts"));
    free(buf);
    ckpt_part_sums_name(name, sizeof(name), 12);
    assert_string_equal(name, "part-12.xxh");
    assert_true(ckpt_safe_name(name));
}

/* Two parts written by two processes at once into one temporary directory, then committed:
 * an ordinary checkpoint (only its index and data files), which verifies and reads back every
 * tensor as the arrays, as a one-part checkpoint of them does. */
static void test_ckpt_parts_two_processes_write_one_checkpoint(void **state)
{
    fx_t *f = *state;
    char dir[300], err[1024], path[512], whole[512], p[700];
    snprintf(dir, sizeof(dir), "%s/c", f->dir);
    int parts[5] = {0, 1, 1, 0, 1};
    ckpt_part_range_t r[5];
    cut(r, f->tab.total, parts, 5);
    ckpt_index_t plan; /* manifest, cursor and time as write_whole's: the same safetensors below */
    assert_int_equal(ckpt_index_plan_parts(&plan, &f->tab, optim_find("AdamW"), STEP, "", NULL, 0, 2, r, 5), 0);
    plan.created = 1764000000;
    pid_t pid[2];
    fflush(NULL);
    for (int k = 0; k < 2; k++)
        if ((pid[k] = fork()) == 0) /* the writer is set up in the child: never one inherited */
            _exit(write_part(f, dir, f->tmp, &plan, r, 5, k, 2, err, sizeof(err)) ? (fprintf(stderr, "%s\n", err), 1)
                                                                                  : 0);
    for (int k = 0; k < 2; k++) {
        int st;
        assert_int_equal(waitpid(pid[k], &st, 0), pid[k]);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    snprintf(p, sizeof(p), "%s/%s", dir, f->tmp);
    assert_int_equal(count_entries(p), 8); /* 6 data files, 2 checksum files */
    ckw_stats_t st;
    if (ckw_commit_parts(dir, f->tmp, &plan, 2, path, sizeof(path), &st, err, sizeof(err)))
        fail_msg("%s", err);
    snprintf(p, sizeof(p), "%s/step-%08d", dir, STEP);
    assert_string_equal(path, p);
    assert_int_equal(st.bytes, 3 * (2 * CKPT_DATA_HDR + 4 * (uint64_t)f->tab.total));
    assert_int_equal(count_entries(dir), 1);  /* step-N only: the temporary directory is gone */
    assert_int_equal(count_entries(path), 7); /* the index and 6 data files */
    expect_arrays(f, path);
    char wd[400];
    snprintf(wd, sizeof(wd), "%s/whole", f->dir);
    write_whole(f, wd, whole, sizeof(whole));
    expect_arrays(f, whole);
    /* the same tensors, in the same order, with the same bytes */
    ckpt_t *a, *b;
    assert_int_equal(ckpt_open(&a, path, err, sizeof(err)), 0);
    assert_int_equal(ckpt_open(&b, whole, err, sizeof(err)), 0);
    const ckpt_index_t *ia = ckpt_index(a), *ib = ckpt_index(b);
    assert_int_equal(ia->n_tensors, ib->n_tensors);
    for (int i = 0; i < ia->n_tensors; i++) {
        assert_string_equal(ia->tensors[i].name, ib->tensors[i].name);
        assert_int_equal(ia->tensors[i].numel, ib->tensors[i].numel);
        size_t n = ia->tensors[i].numel * 4;
        float *x = malloc(n), *y = malloc(n);
        assert_int_equal(ckpt_read(a, ia->tensors[i].name, 0, ia->tensors[i].numel, x, err, sizeof(err)), 0);
        assert_int_equal(ckpt_read(b, ib->tensors[i].name, 0, ib->tensors[i].numel, y, err, sizeof(err)), 0);
        assert_memory_equal(x, y, n);
        free(x);
        free(y);
    }
    ckpt_close(&a);
    ckpt_close(&b);
    /* `ctitan ckpt` reads it as any other: verify, and the same safetensors as the reference's */
    if (!access(tu_ctitan(), X_OK)) {
        char cmd[4096], out[4096], sa[600], sb_[600];
        snprintf(cmd, sizeof(cmd), "%s ckpt verify %s 2>&1", tu_ctitan(), path);
        if (tu_run(cmd, out, sizeof(out)))
            fail_msg("%s", out);
        snprintf(sa, sizeof(sa), "%s/parts.safetensors", f->dir);
        snprintf(sb_, sizeof(sb_), "%s/whole.safetensors", f->dir);
        snprintf(cmd, sizeof(cmd), "%s ckpt export %s --safetensors %s 2>&1 && %s ckpt export %s --safetensors %s 2>&1 "
                 "&& cmp %s %s 2>&1", tu_ctitan(), path, sa, tu_ctitan(), whole, sb_, sa, sb_);
        if (tu_run(cmd, out, sizeof(out)))
            fail_msg("%s", out);
    }
    /* committed again over it (a resumed run reaching the same step): replaced, nothing else left */
    for (int k = 0; k < 2; k++)
        assert_int_equal(write_part(f, dir, f->tmp, &plan, r, 5, k, 2, err, sizeof(err)), 0);
    assert_int_equal(ckw_commit_parts(dir, f->tmp, &plan, 2, path, sizeof(path), NULL, err, sizeof(err)), 0);
    assert_int_equal(count_entries(dir), 1);
    expect_arrays(f, path);
    ckpt_index_free(&plan);
}

/* Three parts, one of which owns nothing (its files are headers only), written in turn. */
static void test_ckpt_parts_a_part_that_owns_nothing_still_has_its_files(void **state)
{
    fx_t *f = *state;
    char dir[300], err[1024], path[512];
    snprintf(dir, sizeof(dir), "%s/e", f->dir);
    int parts[3] = {2, 0, 2};
    ckpt_part_range_t r[3];
    cut(r, f->tab.total, parts, 3);
    ckpt_index_t plan;
    assert_int_equal(ckpt_index_plan_parts(&plan, &f->tab, optim_find("AdamW"), STEP, "", NULL, 0, 3, r, 3), 0);
    for (int k = 2; k >= 0; k--) /* any order */
        assert_int_equal(write_part(f, dir, f->tmp, &plan, r, 3, k, 3, err, sizeof(err)), 0);
    if (ckw_commit_parts(dir, f->tmp, &plan, 3, path, sizeof(path), NULL, err, sizeof(err)))
        fail_msg("%s", err);
    char p[700];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/exp_avg.h1.bin", path);
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_size, CKPT_DATA_HDR);
    expect_arrays(f, path);
    ckpt_index_free(&plan);
}

/* Commits and expects it to fail with `needle` in the error, no step-N and no temporary
 * directory left. */
static void expect_commit_fails(const char *dir, const char *tmp, const ckpt_index_t *plan, int n_parts,
                                const char *needle)
{
    char err[1024] = "", path[512] = "", p[700];
    int rc = ckw_commit_parts(dir, tmp, plan, n_parts, path, sizeof(path), NULL, err, sizeof(err));
    if (rc >= 0 || !strstr(err, needle))
        fail_msg("commit: %d '%s', expected '%s'", rc, err, needle);
    int64_t *steps;
    assert_int_equal(ckpt_list(dir, &steps), 0);
    free(steps);
    snprintf(p, sizeof(p), "%s/step-%08d", dir, STEP);
    assert_int_equal(access(p, F_OK), -1);
    snprintf(p, sizeof(p), "%s/%s", dir, tmp);
    assert_int_equal(access(p, F_OK), -1);
}

/* Parts 0 and 1 of plan written into dir/tmp, then `damage` applied to the directory. */
static void write_both(fx_t *f, const char *dir, const ckpt_index_t *plan, const ckpt_part_range_t *r, int n_r,
                       int skip)
{
    char err[1024];
    for (int k = 0; k < 2; k++)
        if (k != skip && write_part(f, dir, f->tmp, plan, r, n_r, k, 2, err, sizeof(err)))
            fail_msg("part %d: %s", k, err);
}

static void test_ckpt_parts_commit_refuses_a_missing_or_damaged_part_by_name(void **state)
{
    fx_t *f = *state;
    char dir[300], p[700], err[1024];
    snprintf(dir, sizeof(dir), "%s/d", f->dir);
    int parts[4] = {0, 1, 0, 1};
    ckpt_part_range_t r[4];
    cut(r, f->tab.total, parts, 4);
    ckpt_index_t plan;
    assert_int_equal(ckpt_index_plan_parts(&plan, &f->tab, optim_find("AdamW"), STEP, "", NULL, 0, 2, r, 4), 0);
    char sums[700], model1[700];
    snprintf(sums, sizeof(sums), "%s/%s/part-1.xxh", dir, f->tmp);
    snprintf(model1, sizeof(model1), "%s/%s/model.h1.bin", dir, f->tmp);
    /* a part missing: never written, or its writer died before its checksum file */
    write_both(f, dir, &plan, r, 4, 1);
    expect_commit_fails(dir, f->tmp, &plan, 2, "part-1.xxh: missing: part 1 of 2 was not written");
    write_both(f, dir, &plan, r, 4, -1);
    assert_int_equal(unlink(sums), 0);
    expect_commit_fails(dir, f->tmp, &plan, 2, "part-1.xxh: missing");
    /* its checksum file truncated, a byte of it flipped */
    write_both(f, dir, &plan, r, 4, -1);
    struct stat sb;
    assert_int_equal(stat(sums, &sb), 0);
    assert_int_equal(truncate(sums, sb.st_size - 8), 0);
    expect_commit_fails(dir, f->tmp, &plan, 2, "part-1.xxh: bad part checksum file: ");
    write_both(f, dir, &plan, r, 4, -1);
    assert_int_equal(truncate(sums, 0), 0);
    expect_commit_fails(dir, f->tmp, &plan, 2, "part-1.xxh: bad part checksum file: no CTCKSUM1 magic");
    write_both(f, dir, &plan, r, 4, -1);
    assert_int_equal(tu_flip_byte(sums, 45), 0);
    expect_commit_fails(dir, f->tmp, &plan, 2, "part-1.xxh: bad part checksum file: checksum mismatch");
    /* one of another step (a whole, valid file left from another checkpoint), another part's,
     * one of another plan */
    static const struct {
        int64_t step;
        uint32_t part;
        int64_t count_delta;
        const char *needle;
    } foreign[] = {
        {STEP + 1, 1, 0, "part-1.xxh: part 1 of step 8, but this checkpoint is step 7"},
        {STEP, 0, 0, "part-1.xxh: says part 0 of 2, its name and the plan part 1 of 2"},
        {STEP, 1, -1, "checksums, but part 1's files hold"},
    };
    for (size_t i = 0; i < sizeof(foreign) / sizeof(foreign[0]); i++) {
        write_both(f, dir, &plan, r, 4, -1);
        uint8_t buf[4096], *enc;
        size_t len;
        FILE *fp = fopen(sums, "rb");
        size_t n = fread(buf, 1, sizeof(buf), fp);
        fclose(fp);
        ckpt_part_sums_t ps;
        assert_int_equal(ckpt_part_sums_decode(buf, n, &ps, "s", err, sizeof(err)), 0);
        ps.step = foreign[i].step;
        ps.part = foreign[i].part;
        ps.count = (uint64_t)((int64_t)ps.count + foreign[i].count_delta);
        assert_int_equal(ckpt_part_sums_encode(&ps, &enc, &len), 0);
        fp = fopen(sums, "wb");
        assert_int_equal(fwrite(enc, 1, len, fp), len);
        fclose(fp);
        free(enc);
        ckpt_part_sums_free(&ps);
        expect_commit_fails(dir, f->tmp, &plan, 2, foreign[i].needle);
    }
    /* a data file of the wrong size, missing, or with another file's header */
    write_both(f, dir, &plan, r, 4, -1);
    assert_int_equal(stat(model1, &sb), 0);
    assert_int_equal(truncate(model1, sb.st_size - 4), 0);
    snprintf(p, sizeof(p), "model.h1.bin: %lld bytes, the plan says %lld", (long long)sb.st_size - 4,
             (long long)sb.st_size);
    expect_commit_fails(dir, f->tmp, &plan, 2, p);
    write_both(f, dir, &plan, r, 4, -1);
    assert_int_equal(unlink(model1), 0);
    expect_commit_fails(dir, f->tmp, &plan, 2, "model.h1.bin: missing");
    write_both(f, dir, &plan, r, 4, -1);
    assert_int_equal(tu_flip_byte(model1, 12), 0); /* the file number */
    expect_commit_fails(dir, f->tmp, &plan, 2, "model.h1.bin: header: file 19 of step 7, the plan's is file 3");
    /* given up on purpose: everything goes */
    write_both(f, dir, &plan, r, 4, -1);
    assert_int_equal(ckw_abort_parts(dir, f->tmp, STEP, err, sizeof(err)), 0);
    assert_int_equal(count_entries(dir), 0);
    assert_int_equal(ckw_abort_parts(dir, f->tmp, STEP, err, sizeof(err)), 0); /* nothing there: no error */
    /* after all that, a good commit; then a data byte flipped afterwards is found by verify */
    char path[512];
    write_both(f, dir, &plan, r, 4, -1);
    assert_int_equal(ckw_commit_parts(dir, f->tmp, &plan, 2, path, sizeof(path), NULL, err, sizeof(err)), 0);
    expect_arrays(f, path);
    snprintf(p, sizeof(p), "%s/exp_avg.h1.bin", path);
    assert_int_equal(tu_flip_byte(p, CKPT_DATA_HDR + 4 * 10 + 1), 0);
    char *out = NULL;
    size_t olen;
    int bad;
    FILE *mem = open_memstream(&out, &olen);
    assert_int_equal(ckpt_verify(path, mem, &bad, err, sizeof(err)), -EBADMSG);
    fclose(mem);
    assert_int_equal(bad, 1);
    if (!strstr(out, "exp_avg.h1.bin") || !strstr(out, "checksum mismatch") || !strstr(out, "optimizer.exp_avg."))
        fail_msg("%s", out);
    free(out);
    ckpt_index_free(&plan);
}

/* Names of the wrong form are refused before anything is made or removed; a part writes only
 * its own files; beginning a part again removes only that part's files of an earlier attempt. */
static void test_ckpt_parts_writer_keeps_to_its_name_and_its_files(void **state)
{
    fx_t *f = *state;
    char dir[300], err[1024], p[700];
    snprintf(dir, sizeof(dir), "%s/n", f->dir);
    int parts[2] = {0, 1};
    ckpt_part_range_t r[2];
    cut(r, f->tab.total, parts, 2);
    ckpt_index_t plan;
    assert_int_equal(ckpt_index_plan_parts(&plan, &f->tab, optim_find("AdamW"), STEP, "", NULL, 0, 2, r, 2), 0);
    char other_step[64], no_pid[64], zero_pid[64], slash[64];
    snprintf(other_step, sizeof(other_step), ".tmp-step-%08d.%d", STEP + 1, (int)getpid());
    snprintf(no_pid, sizeof(no_pid), ".tmp-step-%08d.", STEP);
    snprintf(zero_pid, sizeof(zero_pid), ".tmp-step-%08d.0123", STEP);
    snprintf(slash, sizeof(slash), ".tmp-step-%08d.1/../../x", STEP);
    const char *names[] = {other_step, no_pid, zero_pid, slash, "../x", ".tmp-step-7.1", "", "step-00000007"};
    ckw_t *w;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        assert_int_equal(ckw_begin_part(&w, dir, names[i], &plan, 0, 2, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "is not the name of a temporary directory of step 7"));
        assert_int_equal(ckw_commit_parts(dir, names[i], &plan, 2, NULL, 0, NULL, err, sizeof(err)), -EINVAL);
        assert_int_equal(ckw_abort_parts(dir, names[i], STEP, err, sizeof(err)), -EINVAL);
    }
    assert_int_equal(access(dir, F_OK), -1); /* nothing made */
    assert_int_equal(ckw_begin_part(&w, dir, f->tmp, &plan, 2, 2, err, sizeof(err)), -EINVAL);
    assert_int_equal(ckw_begin_part(&w, dir, f->tmp, &plan, 0, 3, err, sizeof(err)), -EINVAL);
    /* part 1 writes files 3..5 only */
    assert_int_equal(ckw_begin_part(&w, dir, f->tmp, &plan, 1, 2, err, sizeof(err)), 0);
    uint8_t hdr[64] = {0};
    assert_int_equal(ckw_write(w, 0, 0, hdr, sizeof(hdr), err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "part 1 writes files 3 to 5"));
    ckw_stats_t st;
    assert_int_equal(ckw_commit(&w, NULL, 0, &st, err, sizeof(err)), -EINVAL); /* not how a part ends */
    assert_null(w);
    /* part 0 written; part 1 begun twice and aborted: part 0's files stay */
    assert_int_equal(write_part(f, dir, f->tmp, &plan, r, 2, 0, 2, err, sizeof(err)), 0);
    snprintf(p, sizeof(p), "%s/%s", dir, f->tmp);
    assert_int_equal(count_entries(p), 4);
    assert_int_equal(write_part(f, dir, f->tmp, &plan, r, 2, 1, 2, err, sizeof(err)), 0);
    assert_int_equal(count_entries(p), 8);
    assert_int_equal(ckw_begin_part(&w, dir, f->tmp, &plan, 1, 2, err, sizeof(err)), 0);
    assert_int_equal(count_entries(p), 4); /* the earlier attempt at part 1 is gone */
    static _Alignas(4096) uint8_t block[CKPT_DATA_HDR];
    ckpt_data_header(block, 3, STEP);
    assert_int_equal(ckw_write(w, 3, 0, block, sizeof(block), err, sizeof(err)), 0);
    ckw_abort(&w);
    assert_int_equal(count_entries(p), 4);
    /* a part that ends before all its files are sent fails and leaves none of its files */
    assert_int_equal(ckw_begin_part(&w, dir, f->tmp, &plan, 1, 2, err, sizeof(err)), 0);
    assert_int_equal(ckw_write(w, 3, 0, block, sizeof(block), err, sizeof(err)), 0);
    assert_int_equal(ckw_commit_part(&w, NULL, err, sizeof(err)), -EINVAL);
    assert_null(w);
    assert_int_equal(count_entries(p), 4);
    expect_commit_fails(dir, f->tmp, &plan, 2, "part-1.xxh: missing");
    ckpt_index_free(&plan);
}

/* ---- the one-shot of a host's agent: checkpointd --save-part ---- */

/* NAME-h1's staging segment holding the fixture's arrays at STEP, its manifest in dir/m.toml. */
static shm_seg_t *stage_host1(fx_t *f, char *seg_job, size_t n, char *mpath, size_t mn)
{
    char err[512];
    shm_seg_t *seg;
    snprintf(seg_job, n, "%s-h1", f->job);
    assert_int_equal(staging_create(&seg, seg_job, f->tab.total, 3, err, sizeof(err)), 0);
    staging_hdr_t *h = shm_data(seg);
    for (int a = 0; a < 3; a++)
        memcpy(staging_array(h, a), f->arr[a], f->tab.total * sizeof(float));
    h->cursor_len = 1;
    h->cursor[0] = 0x90;
    atomic_store(&h->step, STEP);
    snprintf(mpath, mn, "%s/m.toml", f->dir);
    char *toml = manifest_to_toml(&f->m);
    FILE *fp = fopen(mpath, "w");
    assert_non_null(fp);
    fputs(toml, fp);
    fclose(fp);
    free(toml);
    return seg;
}

/* `checkpointd --job seg_job --save-part TMP --step step < mpath`, stdout in out, stderr in
 * f->dir/err.txt; returns its status. */
static int run_one_shot(fx_t *f, const char *seg_job, const char *tmp, int step, const char *mpath, char *out,
                        size_t n)
{
    char bin[256], cmd[2048];
    tu_program("checkpointd", bin, sizeof(bin));
    snprintf(cmd, sizeof(cmd), "%s --job %s --save-part %s --step %d < %s 2> %s/err.txt", bin, seg_job, tmp, step,
             mpath, f->dir);
    return tu_run(cmd, out, n);
}

static void test_ckpt_parts_one_shot_writes_a_hosts_part_from_its_staging_segment(void **state)
{
    fx_t *f = *state;
    char bin[256], seg_job[96], mpath[300], out[512], errtxt[1024], err[1024], path[512], p[700];
    if (access(tu_program("checkpointd", bin, sizeof(bin)), X_OK)) {
        print_message("%s not built: skipping\n", bin);
        skip();
    }
    shm_seg_t *seg = stage_host1(f, seg_job, sizeof(seg_job), mpath, sizeof(mpath));
    /* the parts of the job's real split: host 1 owns replica 1's chunk of each stage */
    job_layout_t l;
    job_range_t *jr;
    int n;
    assert_int_equal(job_layout(&l, &f->m), 0);
    assert_int_equal(job_host_parts(&l, &f->m, &jr, &n), 0);
    assert_int_equal(n, 4);
    ckpt_part_range_t r[4];
    uint64_t owned1 = 0;
    for (int i = 0; i < n; i++) {
        r[i] = (ckpt_part_range_t){jr[i].begin, jr[i].end, jr[i].host};
        owned1 += jr[i].host == 1 ? jr[i].end - jr[i].begin : 0;
    }
    free(jr);
    ckpt_index_t plan;
    assert_int_equal(ckpt_index_plan_parts(&plan, &f->tab, optim_find("AdamW"), STEP, "", NULL, 0, 2, r, n), 0);
    /* the wrong step: refused, nothing written */
    assert_int_equal(run_one_shot(f, seg_job, f->tmp, STEP + 1, mpath, out, sizeof(out)), 1);
    snprintf(p, sizeof(p), "%s/err.txt", f->dir);
    tu_read_file(p, errtxt, sizeof(errtxt));
    if (!strstr(errtxt, "checkpointd: the staging segment holds step 7, not 8"))
        fail_msg("%s", errtxt);
    assert_string_equal(out, "");
    /* a name of the wrong form */
    assert_int_equal(run_one_shot(f, seg_job, "../x", STEP, mpath, out, sizeof(out)), 1);
    tu_read_file(p, errtxt, sizeof(errtxt));
    assert_non_null(strstr(errtxt, "is not the name of a temporary directory of step 7"));
    /* host 1's part by the one-shot, host 0's here */
    int rc = run_one_shot(f, seg_job, f->tmp, STEP, mpath, out, sizeof(out));
    tu_read_file(p, errtxt, sizeof(errtxt));
    if (rc)
        fail_msg("status %d: %s", rc, errtxt);
    unsigned long long bytes;
    double secs;
    char extra;
    if (sscanf(out, "written %llu %lf%c", &bytes, &secs, &extra) != 3 || extra != '\n' || secs < 0)
        fail_msg("output '%s'", out);
    assert_int_equal(bytes, 3 * (CKPT_DATA_HDR + 4 * owned1));
    assert_int_equal(write_part(f, f->dir, f->tmp, &plan, r, n, 0, 2, err, sizeof(err)), 0);
    if (ckw_commit_parts(f->dir, f->tmp, &plan, 2, path, sizeof(path), NULL, err, sizeof(err)))
        fail_msg("%s", err);
    expect_arrays(f, path);
    /* killed mid-write (paused after its first data file): its part is missing at the commit */
    assert_int_equal(ckpt_remove_dir(path), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(mpath, O_RDONLY);
        dup2(fd, 0);
        setenv("CTITAN_TEST_CKPT_DELAY_MS", "2000", 1);
        execl(bin, bin, "--job", seg_job, "--save-part", f->tmp, "--step", "7", (char *)NULL);
        _exit(127);
    }
    assert_int_equal(write_part(f, f->dir, f->tmp, &plan, r, n, 0, 2, err, sizeof(err)), 0);
    snprintf(p, sizeof(p), "%s/%s/exp_avg.h1.bin", f->dir, f->tmp);
    for (int i = 0; i < 3000 && access(p, F_OK); i++) /* the second file begun: the first is whole */
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    assert_int_equal(access(p, F_OK), 0);
    kill(pid, SIGKILL);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    expect_commit_fails(f->dir, f->tmp, &plan, 2, "part-1.xxh: missing: part 1 of 2 was not written");
    ckpt_index_free(&plan);
    shm_detach(&seg);
}

/* ---- host 0's checkpointd, a worker of the job: SAVE_PART, COMMIT ---- */

/* The next message of type `want` from checkpointd, answering its heartbeats meanwhile (a
 * coordinator's part); an ERROR fails the test with its text. */
static void expect_msg(ctl_t *srv, msg_type_t want, ctl_peer_t *from, msg_t *m)
{
    char err[512];
    for (int i = 0; i < 3000; i++) {
        int rc = ctl_recv(srv, 100, from, m, err, sizeof(err));
        if (rc == -EAGAIN || rc == -EINTR)
            continue;
        if (rc)
            fail_msg("ctl_recv: %s", err);
        if (m->type == MSG_HEARTBEAT) {
            msg_t hb = {.type = MSG_HEARTBEAT};
            ctl_send(srv, from->route, &hb);
            msg_clear(m);
            continue;
        }
        if (m->type == MSG_ERROR)
            fail_msg("checkpointd: %s", m->text);
        if (m->type != want)
            fail_msg("got %s, expected %s", msg_type_name(m->type), msg_type_name(want));
        return;
    }
    fail_msg("no %s from checkpointd in 300 s", msg_type_name(want));
}

/* Sends a command (type, step, ok, text) and returns the answer of type `want`. */
static void command(ctl_t *srv, const char *route, msg_type_t type, int64_t step, int ok, const char *text,
                    msg_type_t want, msg_t *r)
{
    msg_t m = {.type = type, .step = step, .ok = ok};
    if (text)
        assert_int_equal(msg_set_text(&m, text), 0);
    assert_int_equal(ctl_send(srv, route, &m), 0);
    msg_clear(&m);
    ctl_peer_t from;
    expect_msg(srv, want, &from, r);
    assert_int_equal(r->step, step);
}

static void test_ckpt_parts_daemon_writes_host_0s_part_and_commits_every_part(void **state)
{
    fx_t *f = *state;
    char bin[256], err[1024], ep[300], path[512], tmp[64], p[700];
    if (access(tu_program("checkpointd", bin, sizeof(bin)), X_OK)) {
        print_message("%s not built: skipping\n", bin);
        skip();
    }
    /* host 0's staging segment with the arrays of STEP */
    shm_seg_t *seg;
    assert_int_equal(staging_create(&seg, f->job, f->tab.total, 3, err, sizeof(err)), 0);
    staging_hdr_t *h = shm_data(seg);
    for (int a = 0; a < 3; a++)
        memcpy(staging_array(h, a), f->arr[a], f->tab.total * sizeof(float));
    static const uint8_t s42[] = {0x81, 0xa6, 's', 'a', 'm', 'p', 'l', 'e', 0x2a}; /* {"sample": 42} */
    h->cursor_len = sizeof(s42);
    memcpy(h->cursor, s42, sizeof(s42));
    atomic_store(&h->step, STEP);
    /* a coordinator: the control socket, checkpointd's keys, the config (host 0's manifest) */
    keys_pair_t sk, ck;
    assert_int_equal(keys_pair_new(&sk, err, sizeof(err)), 0);
    assert_int_equal(keys_pair_new(&ck, err, sizeof(err)), 0);
    ctl_t *srv;
    snprintf(ep, sizeof(ep), "ipc://%s/ctl.sock", f->dir);
    assert_int_equal(ctl_server_new(&srv, sk.sec, err, sizeof(err)), 0);
    assert_int_equal(ctl_allow(srv, ck.pub, "checkpointd.0.0"), 0);
    assert_int_equal(ctl_bind(srv, ep, err, sizeof(err)), 0);
    worker_keys_t wk = {.me = ck};
    snprintf(wk.server, sizeof(wk.server), "%s", sk.pub);
    int kfd = worker_keys_pipe(&wk);
    assert_true(kfd >= 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char fd[16];
        snprintf(fd, sizeof(fd), "%d", kfd);
        fcntl(kfd, F_SETFD, 0);
        setenv(WORKER_ENV_ENDPOINT, ep, 1);
        setenv(WORKER_ENV_JOB, f->job, 1);
        setenv(WORKER_ENV_KEYS, fd, 1);
        setenv("CTITAN_LOG", "warn", 1);
        execl(bin, bin, "--job", f->job, (char *)NULL);
        _exit(127);
    }
    close(kfd);
    ctl_peer_t from;
    msg_t m, r;
    expect_msg(srv, MSG_HELLO, &from, &m);
    msg_clear(&m);
    manifest_t *m0 = malloc(sizeof(*m0));
    *m0 = f->m;
    m0->host_rank = 0;
    char *toml = manifest_to_toml(m0);
    msg_t cfg = {.type = MSG_CONFIG, .step = 0};
    assert_int_equal(msg_set_text(&cfg, toml), 0);
    assert_int_equal(ctl_send(srv, from.route, &cfg), 0);
    msg_clear(&cfg);
    free(toml);
    expect_msg(srv, MSG_READY, &from, &m);
    msg_clear(&m);
    /* the parts of the job's split; the temporary directory named for checkpointd's PID */
    job_layout_t l;
    job_range_t *jr;
    int n;
    assert_int_equal(job_layout(&l, m0), 0);
    assert_int_equal(job_host_parts(&l, m0, &jr, &n), 0);
    ckpt_part_range_t rg[8];
    uint64_t owned0 = 0;
    for (int i = 0; i < n; i++) {
        rg[i] = (ckpt_part_range_t){jr[i].begin, jr[i].end, jr[i].host};
        owned0 += jr[i].host == 0 ? jr[i].end - jr[i].begin : 0;
    }
    free(jr);
    ckpt_index_t plan;
    assert_int_equal(ckpt_index_plan_parts(&plan, &f->tab, optim_find("AdamW"), STEP, "", NULL, 0, 2, rg, n), 0);
    snprintf(tmp, sizeof(tmp), ".tmp-step-%08d.%d", STEP, (int)pid);
    /* SAVE is not how a job across hosts checkpoints */
    command(srv, from.route, MSG_SAVE, STEP, 0, NULL, MSG_SAVED, &r);
    assert_false(r.ok);
    assert_non_null(strstr(r.text, "job.hosts = 2: a checkpoint across hosts is written in parts"));
    msg_clear(&r);
    /* SAVE_PART: host 0's part; host 1's here; COMMIT: step-N, every tensor as staged */
    command(srv, from.route, MSG_SAVE_PART, STEP, 0, tmp, MSG_WRITTEN, &r);
    if (!r.ok)
        fail_msg("%s", r.text);
    assert_string_equal(r.text, "");
    assert_int_equal(r.progress, 3 * (CKPT_DATA_HDR + 4 * owned0));
    msg_clear(&r);
    assert_int_equal(write_part(f, f->dir, tmp, &plan, rg, n, 1, 2, err, sizeof(err)), 0);
    command(srv, from.route, MSG_COMMIT, STEP, 1, tmp, MSG_SAVED, &r);
    if (!r.ok)
        fail_msg("%s", r.text);
    snprintf(path, sizeof(path), "%s/step-%08d", f->dir, STEP);
    assert_string_equal(r.text, path);
    assert_int_equal(r.progress, 3 * (2 * CKPT_DATA_HDR + 4 * (uint64_t)f->tab.total));
    msg_clear(&r);
    expect_arrays(f, path);
    /* a run of one host, one stage, resumes from it: every array as staged, the step, the cursor */
    manifest_t *one = malloc(sizeof(*one));
    const char *kv[][2] = {{"model.flavor", "tiny"}, {"model.dim", "64"}, {"training.seq_len", "16"},
                           {"checkpoint.folder", f->dir}};
    manifest_defaults(one);
    for (size_t k = 0; k < sizeof(kv) / sizeof(kv[0]); k++)
        assert_int_equal(manifest_override(one, kv[k][0], kv[k][1], err, sizeof(err)), 0);
    if (manifest_validate(one, err, sizeof(err)))
        fail_msg("%s", err);
    char rjob[96], got[512];
    shm_seg_t *rseg;
    snprintf(rjob, sizeof(rjob), "%s-r", f->job);
    assert_int_equal(staging_create(&rseg, rjob, f->tab.total, 3, err, sizeof(err)), 0);
    staging_hdr_t *rh = shm_data(rseg);
    if (restore_load("latest", one, &f->tab, rh, stderr, got, sizeof(got), err, sizeof(err)))
        fail_msg("%s", err);
    assert_string_equal(got, path);
    assert_int_equal(atomic_load(&rh->step), STEP);
    assert_int_equal(rh->cursor_len, sizeof(s42));
    assert_memory_equal(rh->cursor, s42, sizeof(s42));
    for (int a = 0; a < 3; a++)
        assert_memory_equal(staging_array(rh, a), f->arr[a], f->tab.total * sizeof(float));
    shm_detach(&rseg);
    shm_remove_all(rjob);
    free(one);
    /* a commit with host 1's part missing: SAVED says which, nothing changes */
    command(srv, from.route, MSG_SAVE_PART, STEP, 0, tmp, MSG_WRITTEN, &r);
    assert_true(r.ok);
    msg_clear(&r);
    command(srv, from.route, MSG_COMMIT, STEP, 1, tmp, MSG_SAVED, &r);
    assert_false(r.ok);
    if (!strstr(r.text, "part-1.xxh: missing: part 1 of 2 was not written"))
        fail_msg("%s", r.text);
    msg_clear(&r);
    snprintf(p, sizeof(p), "%s/%s", f->dir, tmp);
    assert_int_equal(access(p, F_OK), -1);
    /* given up: the parts go, SAVED says so */
    command(srv, from.route, MSG_SAVE_PART, STEP, 0, tmp, MSG_WRITTEN, &r);
    assert_true(r.ok);
    msg_clear(&r);
    assert_int_equal(write_part(f, f->dir, tmp, &plan, rg, n, 1, 2, err, sizeof(err)), 0);
    command(srv, from.route, MSG_COMMIT, STEP, 0, tmp, MSG_SAVED, &r);
    assert_false(r.ok);
    if (!strstr(r.text, "the checkpoint of step 7 was given up"))
        fail_msg("%s", r.text);
    msg_clear(&r);
    assert_int_equal(access(p, F_OK), -1);
    /* a SAVE_PART for a step the staging segment does not hold, and a name of the wrong form */
    command(srv, from.route, MSG_SAVE_PART, STEP + 1, 0, tmp, MSG_WRITTEN, &r);
    assert_false(r.ok);
    assert_non_null(strstr(r.text, "the staging segment holds step 7, not 8"));
    msg_clear(&r);
    command(srv, from.route, MSG_SAVE_PART, STEP, 0, "../../x", MSG_WRITTEN, &r);
    assert_false(r.ok);
    assert_non_null(strstr(r.text, "is not the name of a temporary directory"));
    msg_clear(&r);
    expect_arrays(f, path); /* still the first one */
    msg_t stop = {.type = MSG_STOP};
    assert_int_equal(ctl_send(srv, from.route, &stop), 0);
    assert_int_equal(tu_reap(pid, 30, NULL), 0);
    ctl_destroy(&srv);
    ckpt_index_free(&plan);
    shm_detach(&seg);
    free(m0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ckpt_parts_one_part_is_the_whole_plan_byte_for_byte),
        cmocka_unit_test(test_ckpt_parts_plan_puts_every_chunk_in_its_owners_file),
        cmocka_unit_test(test_ckpt_parts_sums_file_round_trips_and_refuses_damage),
        cmocka_unit_test_setup_teardown(test_ckpt_parts_two_processes_write_one_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_parts_a_part_that_owns_nothing_still_has_its_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_parts_commit_refuses_a_missing_or_damaged_part_by_name, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_parts_writer_keeps_to_its_name_and_its_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_parts_one_shot_writes_a_hosts_part_from_its_staging_segment, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_parts_daemon_writes_host_0s_part_and_commits_every_part, setup,
                                        teardown),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
