/* Writes the seed corpora of tests/fuzz/ (make fuzz-seeds): real inputs of each decoder made by
 * the project's own encoders, the repo's manifests, and the token file and tokenizer that
 * `ctitan prep --vocab 300` made of seed.txt (PREP_DIR). Usage: seeds DIR PREP_DIR */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpointd/ckpt.h"
#include "checkpointd/remote_int.h"
#include "ipc/argv.h"
#include "ipc/msg.h"
#include "kernels/config.h"
#include "kernels/params.h"
#include "stages/job/manifest.h"
#include "stages/report/peak_cache.h"
#include "stages/runtime/ldr.h"
#include "stages/data/tokenizer.h"
#include "stages/data/tokfile.h"

static const char *g_dir;

#define CHECK(x)                                                         \
    do {                                                                 \
        if (!(x)) {                                                      \
            fprintf(stderr, "seeds: %s:%d: %s failed\n", __FILE__, __LINE__, #x); \
            exit(1);                                                     \
        }                                                                \
    } while (0)

/* DIR/<target>/<name>: an optional first byte (the harness's mode byte, -1 for none), then data. */
static void put(const char *target, const char *name, int mode, const void *data, size_t n)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", g_dir, target);
    CHECK(mkdir(path, 0755) == 0 || errno == EEXIST);
    snprintf(path, sizeof(path), "%s/%s/%s", g_dir, target, name);
    FILE *f = fopen(path, "wb");
    CHECK(f);
    if (mode >= 0)
        CHECK(fputc(mode, f) != EOF);
    CHECK(n == 0 || fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    CHECK(f);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long k = ftell(f);
    CHECK(k >= 0);
    rewind(f);
    uint8_t *b = malloc((size_t)k + 1);
    CHECK(b && fread(b, 1, (size_t)k, f) == (size_t)k);
    fclose(f);
    *n = (size_t)k;
    return b;
}

static void msg_seed(const msg_t *m)
{
    uint8_t *buf;
    size_t n;
    CHECK(msg_encode(m, &buf, &n) == 0);
    put("msg", msg_type_name(m->type), -1, buf, n);
    free(buf);
}

static void msg_seeds(void)
{
    uint8_t cursor[16] = {0x82, 0xa5, 'e', 'p', 'o', 'c', 'h', 0x01, 0xa6, 's', 'a', 'm', 'p', 'l', 'e', 0x07};
    for (int t = MSG_HELLO; t < MSG_TYPE_END; t++) {
        msg_t m = {.type = (msg_type_t)t, .rank = 1, .replica = 0, .pid = 4242, .step = 17,
                   .progress = 123456, .loss = 4.25, .grad_norm = 0.5, .scale = 1.0, .lr = 8e-4,
                   .t_f = 0.01, .t_b = 0.02, .t_w = 0.005, .t_busy = 0.03, .t_wait = 0.001,
                   .ok = 1, .mem = 1u << 20};
        snprintf(m.role, sizeof(m.role), "stage");
        CHECK(msg_set_text(&m, t == MSG_CONFIG ? "[job]\nname = \"demo\"\n" : "runs/demo/checkpoint/step-00000017") == 0);
        CHECK(msg_set_data(&m, cursor, sizeof(cursor)) == 0);
        msg_seed(&m);
        msg_clear(&m);
    }
}

static void manifest_seeds(void)
{
    const char *files[] = {"manifests/demo.toml", "manifests/tiny.toml"};
    for (int i = 0; i < 2; i++) {
        size_t n;
        uint8_t *b = slurp(files[i], &n);
        put("manifest", strrchr(files[i], '/') + 1, -1, b, n);
        put("toml", strrchr(files[i], '/') + 1, -1, b, n);
        free(b);
    }
    static manifest_t m;
    char err[512];
    CHECK(manifest_load(&m, "manifests/demo.toml", err, sizeof(err)) == 0);
    CHECK(manifest_validate(&m, err, sizeof(err)) == 0);
    char *text = manifest_to_toml(&m);
    CHECK(text);
    put("manifest", "demo-resolved.toml", -1, text, strlen(text));
    put("toml", "demo-resolved.toml", -1, text, strlen(text));
    free(text);
    /* the syntax the reader takes, in one file; and an override value */
    const char *syntax = "# comment\r\n[job]\nname = \"a\\tb\\u00e9\\U0001F600\" # trailing\n"
                         "description = 'literal \\ string'\n[training]\nsteps = 1_000\nseed = 0xff\n"
                         "max_norm = -2.5E3\nthreads = 0o17\n[x]\nb = 0b101\nf = [inf, -inf, nan, 1e-4]\n"
                         "a = [ [1, 2], [\"x\", 'y'], [true, false], ]\nm = [\n  1,\n  2,\n]\n";
    put("toml", "syntax.toml", -1, syntax, strlen(syntax));
    const char *split = "[parallelism]\npipeline_parallel_degree = 2\n"
                        "pipeline_parallel_split_points = [\"layers.3\"]\n";
    put("manifest", "split.toml", -1, split, strlen(split));
    const char *ac = "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"op\"\n";
    put("manifest", "ac.toml", -1, ac, strlen(ac));
    put("toml", "value", -1, "[1e-4, 2]", 9);
}

static void ckpt_seeds(void)
{
    model_config_t cfg;
    CHECK(config_preset("tiny", &cfg) == 0);
    cfg.n_layers = 1;
    param_table_t tab;
    CHECK(params_table_init(&tab, &cfg) == 0);
    uint8_t cursor[3] = {0x81, 0xa1, 's'};
    ckpt_index_t ix;
    CHECK(ckpt_index_plan(&ix, &tab, optim_find("AdamW"), 17, "[job]\nname = \"t\"\n", cursor, sizeof(cursor)) == 0);
    ix.created = 1764000000; /* a fixed time: the corpus does not change from run to run */
    float *arr = calloc(tab.total, sizeof(float));
    CHECK(arr);
    for (size_t i = 0; i < tab.total; i++)
        arr[i] = (float)i * 0.25f;
    for (uint32_t f = 0; f < 3; f++)
        ckpt_index_hash(&ix, f, arr);
    uint8_t *buf;
    size_t n;
    CHECK(ckpt_index_encode(&ix, &buf, &n) == 0);
    /* the harness frames a body itself (mode 0) or takes the whole index (mode 1) */
    put("ckpt_index", "tiny-1-layer-body", 0, buf + 24, n - 24 - 8);
    put("ckpt_index", "tiny-1-layer-whole", 1, buf, n);
    free(buf);
    ckpt_index_free(&ix);
    CHECK(ckpt_index_plan(&ix, &tab, optim_find("AdamW"), 0, "", NULL, 0) == 0);
    ix.created = 1764000000;
    CHECK(ckpt_index_encode(&ix, &buf, &n) == 0);
    put("ckpt_index", "step-0-no-cursor-body", 0, buf + 24, n - 24 - 8);
    free(buf);
    ckpt_index_free(&ix);
    /* a part's checksum file of that model in 2 parts (the chunks of part 1's files), and an
     * empty one (a part that owns nothing) */
    uint64_t t3 = tab.total / 3;
    ckpt_part_range_t r[3] = {{0, t3, 0}, {t3, 2 * t3, 1}, {2 * t3, tab.total, 0}};
    CHECK(ckpt_index_plan_parts(&ix, &tab, optim_find("AdamW"), 17, "", NULL, 0, 2, r, 3) == 0);
    uint64_t sums[512];
    ckpt_part_sums_t ps = {.step = 17, .part = 1, .n_parts = 2, .xxh = sums};
    for (int i = 0; i < ix.n_tensors; i++)
        for (uint32_t c = 0; c < ix.tensors[i].n_chunks; c++)
            if (ckpt_part_of_file(ix.tensors[i].chunks[c].file, ix.n_files, 2) == 1 && ps.count < 512) {
                sums[ps.count] = 0x9e3779b97f4a7c15ULL * (ps.count + 1); /* fixed: the corpus never changes */
                ps.count++;
            }
    ckpt_index_free(&ix);
    /* the harness appends the trailing checksum itself (mode 0) or takes the whole file (mode 1) */
    CHECK(ckpt_part_sums_encode(&ps, &buf, &n) == 0);
    put("ckpt_sums", "tiny-1-layer-part-1-body", 0, buf, n - 8);
    put("ckpt_sums", "tiny-1-layer-part-1-whole", 1, buf, n);
    free(buf);
    ps = (ckpt_part_sums_t){.step = 0, .part = 2, .n_parts = 3};
    CHECK(ckpt_part_sums_encode(&ps, &buf, &n) == 0);
    put("ckpt_sums", "empty-part-2-body", 0, buf, n - 8);
    free(buf);
    free(arr);
    params_table_free(&tab);
    static uint8_t block[CKPT_DATA_HDR];
    const char *names[3] = {"model.bin", "exp_avg.bin", "exp_avg_sq.bin"};
    for (uint32_t f = 0; f < 3; f++) {
        ckpt_data_header(block, f, 17 + f);
        put("ckpt_header", names[f], -1, block, sizeof(block));
    }
}

static void tok_seeds(const char *prep)
{
    char path[1024], err[512];
    size_t n;
    snprintf(path, sizeof(path), "%s/train.bin", prep);
    uint8_t *b = slurp(path, &n);
    put("tokfile", "prep-train.bin", -1, b, n);
    free(b);
    snprintf(path, sizeof(path), "%s/val.bin", prep);
    b = slurp(path, &n);
    put("tokfile", "prep-val.bin", -1, b, n);
    free(b);
    snprintf(path, sizeof(path), "%s/tokenizer.bin", prep);
    b = slurp(path, &n);
    put("tokenizer", "prep-vocab300-fixed-sum", 0, b, n);
    put("tokenizer", "prep-vocab300-whole", 1, b, n);
    free(b);
    /* tokfile_write's two widths, and llm.c's two formats by hand (256 int32 header) */
    uint32_t tok[8] = {1, 2, 3, 70000, 5, 6, 7, 8};
    snprintf(path, sizeof(path), "%s/u32.bin", prep);
    CHECK(tokfile_write(path, tok, 8, 70001, err, sizeof(err)) == 0);
    b = slurp(path, &n);
    put("tokfile", "ctitan-u32.bin", -1, b, n);
    free(b);
    snprintf(path, sizeof(path), "%s/u16.bin", prep);
    CHECK(tokfile_write(path, tok, 3, 300, err, sizeof(err)) == 0);
    b = slurp(path, &n);
    put("tokfile", "ctitan-u16.bin", -1, b, n);
    free(b);
    int32_t hdr[256] = {0};
    uint8_t llmc[sizeof(hdr) + 16];
    uint16_t t16[4] = {10, 20, 30, 299};
    hdr[0] = TOKFILE_LLMC_MAGIC, hdr[1] = TOKFILE_LLMC_VERSION, hdr[2] = 4;
    memcpy(llmc, hdr, sizeof(hdr));
    memcpy(llmc + sizeof(hdr), t16, sizeof(t16));
    put("tokfile", "llmc-gpt2.bin", -1, llmc, sizeof(hdr) + sizeof(t16));
    uint32_t t32[4] = {10, 20, 30, 128000};
    hdr[0] = TOKFILE_LLMC_LLAMA3_MAGIC, hdr[1] = TOKFILE_LLMC_LLAMA3_VERSION, hdr[2] = 4;
    memcpy(llmc, hdr, sizeof(hdr));
    memcpy(llmc + sizeof(hdr), t32, sizeof(t32));
    put("tokfile", "llmc-llama3.bin", -1, llmc, sizeof(hdr) + sizeof(t32));
    /* the smallest tokenizer: one merge */
    const char *text = "aaaa bbbb aaaa";
    tok_t *t;
    CHECK(tok_train(&t, (const uint8_t *)text, strlen(text), TOK_MIN_VOCAB, err, sizeof(err)) == 0);
    snprintf(path, sizeof(path), "%s/min.bin", prep);
    CHECK(tok_save(t, path, err, sizeof(err)) == 0);
    tok_destroy(&t);
    b = slurp(path, &n);
    put("tokenizer", "vocab257-fixed-sum", 0, b, n);
    free(b);
}

/* argv: lines a user writes as `[loader] command` (mode 0), and the packed words of a swap
 * (mode 1) that argv_pack makes of them */
static void argv_seeds(void)
{
    const char *lines[] = {
        "build/bin/ctitan-loader",
        "python3 -u loader.py --data 'my corpus/train.bin' --seed=7",
        "prog \"a \\\"quoted\\\" word\" plain\\ space ''",
        "prog 'a|b' '$HOME' '*.bin' \"x > y\"",
    };
    for (int i = 0; i < 4; i++) {
        char name[32], err[256];
        snprintf(name, sizeof(name), "line-%d", i);
        put("argv", name, 0, lines[i], strlen(lines[i]));
        argv_t a;
        CHECK(argv_split(lines[i], &a, err, sizeof(err)) == 0);
        static uint8_t packed[ARGV_MAX_BYTES];
        size_t n;
        CHECK(argv_pack(&a, packed, &n) == 0);
        snprintf(name, sizeof(name), "packed-%d", i);
        put("argv", name, 1, packed, n);
        argv_free(&a);
    }
}

/* key files as `ctitan ckpt keygen` and the coordinator write them, and an allow file of two
 * keys with comments (fixed keys: the corpus does not change from run to run) */
static void keys_seeds(void)
{
    const char *pub = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
    const char *two = "# the hosts that may write here\n"
                      "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7   # host0\n"
                      "\n"
                      "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID # host1\n";
    char text[128];
    snprintf(text, sizeof(text), "%s\n", pub);
    put("keys", "one.pub", -1, text, strlen(text));
    put("keys", "allow.pub", -1, two, strlen(two));
}

static void remote_seeds(void)
{
    const char *text = "/srv/ckpt/demo/step-00000017";
    rmt_hdr_t h[] = {
        {.type = RMT_BEGIN, .seq = 1, .job = "demo", .job_len = 4, .keep = 3, .step = 17},
        {.type = RMT_DATA, .seq = 2, .file = 1, .offset = 4096},
        {.type = RMT_COMMIT, .seq = 3},
        {.type = RMT_ABORT, .seq = 4},
        {.type = RMT_REPLY, .seq = 3, .ok = 1, .code = 0, .text = text, .text_len = strlen(text)},
        {.type = RMT_LIST, .seq = 5, .job = "demo", .job_len = 4},
        {.type = RMT_FETCH, .seq = 6, .job = "demo", .job_len = 4, .step = 17},
        {.type = RMT_PART, .seq = 6, .file = 2, .offset = 4194304, .size = 25169920},
    };
    for (size_t i = 0; i < sizeof(h) / sizeof(h[0]); i++) {
        uint8_t *buf;
        size_t n;
        CHECK(rmt_hdr_encode(&h[i], &buf, &n) == 0);
        put("remote", rmt_type_name(h[i].type), rmt_has_payload(h[i].type), buf, n);
        free(buf);
    }
}

/* a peak cache file as the coordinator writes it (a fixed machine: the corpus does not change
 * from run to run) */
/* fuzz_fetch's and fuzz_stream's records (tests/fuzz/fetch_parts.h): file, flags, size, offset, n. */
static size_t fetch_record(uint8_t *out, int file, int flags, uint32_t size, uint32_t offset, uint16_t n)
{
    out[0] = (uint8_t)file, out[1] = (uint8_t)flags;
    for (int i = 0; i < 4; i++)
        out[2 + i] = (uint8_t)(size >> 8 * i), out[6 + i] = (uint8_t)(offset >> 8 * i);
    out[10] = (uint8_t)n, out[11] = (uint8_t)(n >> 8);
    return 12;
}

static void fetch_seeds(void)
{
    enum { TRUE_SIZE = 1, AT_GOT = 2, FILL = 4, DONE = 8 }; /* tests/fuzz/fetch_parts.h's */
    uint8_t buf[512];
    size_t n = 0;
    for (int f = 0; f <= 3; f++) /* the whole fetch: the index, the three files of AdamW's state, ok */
        n += fetch_record(buf + n, f, TRUE_SIZE | AT_GOT | FILL | (f == 3 ? DONE : 0), 0, 0, 0);
    put("fetch", "whole", -1, buf, n);
    put("stream", "whole", -1, buf, n);
    n = 0; /* in pieces: 100 bytes, an empty part, the rest */
    for (int f = 0; f <= 3; f++) {
        n += fetch_record(buf + n, f, TRUE_SIZE | AT_GOT | FILL, 0, 0, 100);
        n += fetch_record(buf + n, f, TRUE_SIZE | AT_GOT, 0, 0, 0);
        n += fetch_record(buf + n, f, TRUE_SIZE | AT_GOT | FILL | (f == 3 ? DONE : 0), 0, 0, 0);
    }
    put("fetch", "pieces", -1, buf, n);
    put("stream", "pieces", -1, buf, n);
    n = 0; /* data file 2 before 1 */
    n += fetch_record(buf + n, 0, TRUE_SIZE | AT_GOT | FILL, 0, 0, 0);
    n += fetch_record(buf + n, 2, TRUE_SIZE | AT_GOT | FILL | DONE, 0, 0, 0);
    put("fetch", "order", -1, buf, n);
    n = 0; /* an index of raw bytes */
    n += fetch_record(buf + n, 0, DONE, 8, 0, 8);
    memcpy(buf + n, "CTCKIDX1", 8);
    put("fetch", "raw-index", -1, buf, n + 8);
}

static void peak_seeds(void)
{
    peak_cache_entry_t e = {
        .key = {.cpu = "Intel(R) Xeon(R) Processor", .threads = 2,
                .blas = "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64",
                .core = "SkylakeX", .n = PEAK_CACHE_N, .runs = PEAK_CACHE_RUNS},
        .native = 199.62806131970277, .pooled = 102.02852595603987, .measured = 1795587001};
    e.gflops = e.native;
    char text[4096];
    int n = peak_cache_format(&e, text, sizeof(text));
    CHECK(n > 0 && (size_t)n < sizeof(text));
    put("peak_cache", "skylakex.txt", -1, text, (size_t)n);
}

/* loader cursors as the built-in loaders write them (ldr_cursor_pack), and an empty one */
static void cursor_seeds(void)
{
    static const char *const keys[] = {"sample", "byte", "skip"};
    const uint64_t vals[] = {123456789, 77, 3};
    uint8_t buf[LDR_CURSOR_MAX];
    size_t n = ldr_cursor_pack(buf, sizeof(buf), 1, keys, vals);
    CHECK(n > 0);
    put("cursor", "tokfile", -1, buf, n);
    n = ldr_cursor_pack(buf, sizeof(buf), 3, keys, vals);
    CHECK(n > 0);
    put("cursor", "text", -1, buf, n);
    put("cursor", "empty", -1, buf, 0);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: seeds DIR PREP_DIR (run from the repo root)\n");
        return 2;
    }
    g_dir = argv[1];
    msg_seeds();
    manifest_seeds();
    ckpt_seeds();
    tok_seeds(argv[2]);
    remote_seeds();
    fetch_seeds();
    argv_seeds();
    keys_seeds();
    peak_seeds();
    cursor_seeds();
    return 0;
}
