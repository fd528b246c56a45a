/* Tests of the text corpus reader and mix (stages/data/corpus.h) on real files: JSON Lines,
 * plain text, gzip, globs, bad lines, positions that resume exactly at every point, the
 * refusals; then real jobs of ctitan-loader-text on two weighted JSON Lines/text sources:
 * they train, resume bitwise from a checkpoint mid-epoch, and give the same losses through a
 * loader swap and a kill -9 of the loader. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "stages/data/corpus.h"
#include "stages/data/prep.h"
#include "stages/data/tokenizer.h"
#include "tests/testjob.h"

/* ---- files ---- */

static void put(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void put_gz(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    gzFile g = gzopen(path, "wb");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, text, (unsigned)strlen(text)), (int)strlen(text));
    assert_int_equal(gzclose(g), Z_OK);
}

static char g_tmp[64]; /* the unit tests' folder */

static const char *in_tmp(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", g_tmp, name);
    return buf[k];
}

static corpus_src_opts_t src(const char *name)
{
    return (corpus_src_opts_t){.pattern = in_tmp(name)};
}

/* Every unit of the first pass: their texts joined by '|', and how many. */
static int one_pass(corpus_reader_t *r, char *out, size_t n, corpus_unit_t *units, int max)
{
    corpus_unit_t u;
    char err[512];
    int k = 0;
    out[0] = 0;
    while (corpus_reader_epoch(r) == 0) {
        int rc = corpus_reader_next(r, &u, err, sizeof(err));
        if (rc)
            fail_msg("%s", err);
        if (corpus_reader_epoch(r) > 0)
            break;
        if (k < max)
            units[k] = u;
        k++;
        snprintf(out + strlen(out), n - strlen(out), "%s%.*s", k > 1 ? "|" : "", (int)u.len, u.text);
    }
    return k;
}

/* ---- the reader ---- */

static void test_corpus_reads_jsonl_gzip_and_plain_through_a_sorted_glob(void **state)
{
    mkdir(in_tmp("j"), 0755);
    put_gz(in_tmp("j"), "b.jsonl.gz", "{\"text\": \"third\", \"id\": 3}\n{\"text\": \"fourth\\nline\"}\n");
    put(in_tmp("j"), "a.jsonl", "\xEF\xBB\xBF{\"text\": \"first\"}\n\n{\"id\": 2, \"text\": \"second \\u00e9\"}");
    corpus_src_opts_t o = src("j/*.jsonl*");
    corpus_reader_t *r;
    char err[512], all[512];
    corpus_unit_t u[8];
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), 0);
    assert_int_equal(corpus_reader_files(r), 2);
    assert_non_null(strstr(corpus_reader_file(r, 0), "a.jsonl"));
    assert_int_equal(one_pass(r, all, sizeof(all), u, 8), 4);
    assert_string_equal(all, "first|second \xc3\xa9|third|fourth\nline");
    assert_int_equal(u[1].file, 0);
    assert_int_equal(u[1].off, 22); /* after the byte order mark, the first line and the blank one */
    assert_int_equal(u[2].file, 1);
    assert_int_equal(u[2].off, 0);
    assert_int_equal(u[3].off, 27); /* in the uncompressed stream */
    assert_true(u[3].doc_start && u[3].doc_end);
    assert_int_equal(corpus_reader_bad_lines(r), 0);
    /* a named field, and seeking to a unit's start */
    assert_int_equal(corpus_reader_seek(r, 1, 27, err, sizeof(err)), 0);
    assert_int_equal(corpus_reader_next(r, &u[0], err, sizeof(err)), 0);
    assert_int_equal(u[0].len, 11);
    assert_int_equal(corpus_reader_seek(r, 1, 26, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "not at a line start"));
    assert_int_equal(corpus_reader_seek(r, 1, 500, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "past its end"));
    assert_int_equal(corpus_reader_seek(r, 2, 0, err, sizeof(err)), -EINVAL);
    corpus_reader_destroy(&r);
    assert_null(r);
}

static void test_corpus_bad_lines_are_skipped_and_counted_or_an_error(void **state)
{
    put(g_tmp, "bad.jsonl",
        "{\"text\": \"one\"}\n"
        "not json\n"
        "[\"an\", \"array\"]\n"
        "{\"body\": \"no text field\"}\n"
        "{\"text\": 7}\n"
        "   \n"
        "{\"text\": \"\"}\n"
        "{\"text\": \"two\", \"body\": \"b\"}\n"
        "{\"text\": \"bad \xff utf-8\"}\n");
    corpus_src_opts_t o = src("bad.jsonl");
    char err[512], all[256];
    corpus_unit_t u[4];
    corpus_reader_t *r;
    FILE *log = tmpfile();
    o.log = log;
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), 0);
    assert_int_equal(one_pass(r, all, sizeof(all), u, 4), 2);
    assert_string_equal(all, "one|two");
    assert_int_equal(corpus_reader_bad_lines(r), 5); /* blank and empty documents are not bad */
    char text[4096] = {0};
    rewind(log);
    assert_true(fread(text, 1, sizeof(text) - 1, log) > 0);
    fclose(log);
    assert_non_null(strstr(text, "bad.jsonl:2: not JSON"));
    assert_non_null(strstr(text, "bad.jsonl:3: not a JSON object"));
    assert_non_null(strstr(text, "bad.jsonl:4: no field \"text\""));
    assert_non_null(strstr(text, "bad.jsonl:5: field \"text\" is not a string"));
    assert_non_null(strstr(text, "bad.jsonl:9: not JSON"));
    corpus_reader_destroy(&r);
    /* another field */
    o.field = "body";
    o.log = NULL;
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), 0);
    assert_int_equal(one_pass(r, all, sizeof(all), u, 4), 2);
    assert_string_equal(all, "no text field|b");
    corpus_reader_destroy(&r);
    /* --on-bad-line error: the first bad line stops the read, named */
    o.field = NULL;
    o.on_bad_line = CORPUS_BAD_ERROR;
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), 0);
    assert_int_equal(corpus_reader_next(r, &u[0], err, sizeof(err)), 0);
    assert_int_equal(corpus_reader_next(r, &u[0], err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "bad.jsonl:2: not JSON"));
    corpus_reader_destroy(&r);
}

static void test_corpus_text_is_a_document_a_line_or_a_file(void **state)
{
    put(g_tmp, "lines.txt", "alpha beta\r\n\ngamma\ndelta");
    corpus_src_opts_t o = src("lines.txt");
    char err[512], all[4096];
    corpus_unit_t u[64];
    corpus_reader_t *r;
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), 0);
    assert_int_equal(one_pass(r, all, sizeof(all), u, 64), 3);
    assert_string_equal(all, "alpha beta|gamma|delta");
    assert_int_equal(u[1].off, 13);
    corpus_reader_destroy(&r);
    /* a file a document: chunks of whole lines, BOS at the first, EOS at the last */
    char big[3000] = {0};
    for (int i = 0; strlen(big) < 2900; i++)
        snprintf(big + strlen(big), sizeof(big) - strlen(big), "line %d of the file\n", i);
    put_gz(g_tmp, "whole.txt.gz", big);
    o = src("whole.txt.gz");
    o.format = CORPUS_FILE;
    o.chunk_bytes = 256;
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), 0);
    int n = one_pass(r, all, sizeof(all), u, 64);
    assert_true(n > 5 && n < 64);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(u[i].off, at);
        assert_true(u[i].len >= 256 && (u[i].len <= 512 || i == n - 1));
        assert_int_equal(u[i].doc_start, i == 0);
        assert_int_equal(u[i].doc_end, i == n - 1);
        at += u[i].len;
    }
    assert_int_equal(at, strlen(big));
    corpus_reader_destroy(&r);
}

static void test_corpus_refuses_clearly(void **state)
{
    char err[512];
    corpus_reader_t *r;
    corpus_unit_t u;
    corpus_src_opts_t o = src("nothing-*.jsonl");
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "nothing-*.jsonl: the glob matches no file"));
    assert_null(r);
    put(g_tmp, "lit[1].txt", "literal\n"); /* a file whose name looks like a glob */
    o = src("lit[1].txt");
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), 0);
    assert_int_equal(corpus_reader_files(r), 1);
    assert_int_equal(corpus_reader_next(r, &u, err, sizeof(err)), 0);
    assert_int_equal(u.len, 7);
    corpus_reader_destroy(&r);
    o = src("missing.txt");
    assert_true(corpus_reader_open(&r, &o, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "missing.txt"));
    /* corrupt gzip: a flipped byte in the deflate data, and a truncated file */
    char text[20000] = {0};
    for (int i = 0; strlen(text) < 19000; i++)
        snprintf(text + strlen(text), sizeof(text) - strlen(text), "{\"text\": \"doc %d %d\"}\n", i, i * 7919 % 1000);
    put_gz(g_tmp, "flip.jsonl.gz", text);
    assert_int_equal(tu_flip_byte(in_tmp("flip.jsonl.gz"), 200), 0);
    o = src("flip.jsonl.gz");
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), 0);
    int rc;
    while (!(rc = corpus_reader_next(r, &u, err, sizeof(err))) && corpus_reader_epoch(r) == 0)
        ;
    assert_int_equal(rc, -EINVAL);
    assert_non_null(strstr(err, "flip.jsonl.gz: corrupt gzip data near compressed byte"));
    corpus_reader_destroy(&r);
    put_gz(g_tmp, "cut.jsonl.gz", text);
    assert_int_equal(truncate(in_tmp("cut.jsonl.gz"), 300), 0);
    o = src("cut.jsonl.gz");
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), 0);
    while (!(rc = corpus_reader_next(r, &u, err, sizeof(err))) && corpus_reader_epoch(r) == 0)
        ;
    assert_int_equal(rc, -EINVAL);
    assert_non_null(strstr(err, "cut.jsonl.gz: corrupt gzip data"));
    corpus_reader_destroy(&r);
    /* a source with no document at all */
    put(g_tmp, "empty.jsonl", "\n{\"title\": \"x\"}\n");
    o = src("empty.jsonl");
    assert_int_equal(corpus_reader_open(&r, &o, err, sizeof(err)), 0);
    assert_int_equal(corpus_reader_next(r, &u, err, sizeof(err)), -ENODATA);
    assert_non_null(strstr(err, "empty.jsonl: no document"));
    corpus_reader_destroy(&r);
}

/* ---- the mix ---- */

static tok_t *g_tok; /* a small tokenizer trained on the unit tests' text */

static void make_mix_sources(void)
{
    static char a[8192], b[4096];
    a[0] = b[0] = 0;
    for (int i = 0; i < 24; i++) { /* documents of 5 to ~300 bytes: some over 2 * 64 */
        snprintf(a + strlen(a), sizeof(a) - strlen(a), "{\"id\": %d, \"text\": \"", i);
        for (int w = 0; w < 1 + (i * 13) % 40; w++)
            snprintf(a + strlen(a), sizeof(a) - strlen(a), "w%d%s", (i * 31 + w * 7) % 53, w % 11 == 10 ? "\\n" : " ");
        snprintf(a + strlen(a), sizeof(a) - strlen(a), "\"}\n%s", i == 9 ? "not json\n" : "");
    }
    put_gz(g_tmp, "mix-a.jsonl.gz", a);
    for (int i = 0; i < 30; i++)
        snprintf(b + strlen(b), sizeof(b) - strlen(b), "line %d says v%d v%d\n%s", i, i * 3 % 17, i * 5 % 19,
                 i % 7 == 3 ? "\n" : "");
    put(g_tmp, "mix-b.txt", b);
}

static corpus_opts_t mix_opts(void)
{
    corpus_opts_t o = {.n = 2, .tok = g_tok, .bos = 1, .eos = 2, .seq_len = 16, .seed = 1234};
    o.src[0] = (corpus_src_opts_t){.pattern = in_tmp("mix-a.jsonl.gz"), .chunk_bytes = 64};
    o.src[1] = (corpus_src_opts_t){.pattern = in_tmp("mix-b.txt"), .chunk_bytes = 64};
    o.weight[0] = 0.7;
    o.weight[1] = 0.3;
    return o;
}

static void test_corpus_documents_are_framed_by_bos_and_eos(void **state)
{
    put(g_tmp, "frame.jsonl", "{\"text\": \"first doc\"}\n{\"text\": \"second\"}\n");
    corpus_opts_t o = {.n = 1, .tok = g_tok, .bos = 1, .eos = 2, .seq_len = 40, .seed = 1, .weight = {1}};
    o.src[0] = src("frame.jsonl");
    corpus_t *c;
    char err[512];
    assert_int_equal(corpus_open(&c, &o, err, sizeof(err)), 0);
    uint32_t got[41], want[41], enc[16];
    size_t n = 0, m;
    for (int pass = 0; n < 41; pass++) {
        const char *doc = pass % 2 ? "second" : "first doc";
        want[n++] = 1;
        assert_int_equal(tok_encode(g_tok, (const uint8_t *)doc, strlen(doc), enc, &m), 0);
        for (size_t i = 0; i < m && n < 41; i++)
            want[n++] = enc[i];
        if (n < 41)
            want[n++] = 2;
    }
    assert_int_equal(corpus_next(c, 0, got, err, sizeof(err)), 0);
    assert_memory_equal(got, want, sizeof(got)); /* and the source wrapped to its start */
    corpus_destroy(&c);
    assert_null(c);
    /* no BOS/EOS: the documents back to back */
    o.bos = o.eos = -1;
    assert_int_equal(corpus_open(&c, &o, err, sizeof(err)), 0);
    assert_int_equal(corpus_next(c, 0, got, err, sizeof(err)), 0);
    assert_int_equal(tok_encode(g_tok, (const uint8_t *)"first doc", 9, enc, &m), 0);
    assert_memory_equal(got, enc, m * sizeof(*enc));
    corpus_destroy(&c);
}

#define MIX_N 400

static void test_corpus_positions_resume_exactly_at_every_point(void **state)
{
    make_mix_sources();
    corpus_opts_t o = mix_opts();
    static uint32_t ref[MIX_N][17];
    static corpus_pos_t pos[MIX_N][2];
    corpus_t *c, *d;
    char err[512];
    assert_int_equal(corpus_open(&c, &o, err, sizeof(err)), 0);
    int picked0 = 0;
    for (int k = 0; k < MIX_N; k++) {
        for (int i = 0; i < 2; i++)
            assert_int_equal(corpus_position(c, i, &pos[k][i], err, sizeof(err)), 0);
        picked0 += corpus_pick(c, (uint64_t)k) == 0;
        assert_int_equal(corpus_next(c, (uint64_t)k, ref[k], err, sizeof(err)), 0);
    }
    assert_true(corpus_bad_lines(c) >= 2); /* counted again each epoch */
    /* both sources wrapped: the streams are ~1000 and ~600 tokens long */
    assert_true(pos[MIX_N - 1][0].file == 0 && pos[MIX_N - 1][1].file == 0);
    assert_true(picked0 > MIX_N * 6 / 10 && picked0 < MIX_N * 8 / 10);
    for (int k = 0; k < MIX_N; k += 3) { /* mid-document, mid-piece, mid-gzip-stream */
        assert_int_equal(corpus_open(&d, &o, err, sizeof(err)), 0);
        for (int i = 0; i < 2; i++)
            if (corpus_seek(d, i, &pos[k][i], err, sizeof(err)))
                fail_msg("sequence %d, source %d: %s", k, i, err);
        uint32_t got[17];
        for (int j = k; j < k + 12 && j < MIX_N; j++) {
            assert_int_equal(corpus_next(d, (uint64_t)j, got, err, sizeof(err)), 0);
            if (memcmp(got, ref[j], sizeof(got)))
                fail_msg("resumed before sequence %d: sequence %d differs", k, j);
        }
        corpus_destroy(&d);
    }
    for (int k = 0; k < MIX_N; k += 37) { /* from a sample count alone */
        assert_int_equal(corpus_open(&d, &o, err, sizeof(err)), 0);
        assert_int_equal(corpus_replay(d, (uint64_t)k, err, sizeof(err)), 0);
        uint32_t got[17];
        assert_int_equal(corpus_next(d, (uint64_t)k, got, err, sizeof(err)), 0);
        assert_memory_equal(got, ref[k], sizeof(got));
        corpus_destroy(&d);
    }
    /* another corpus has another fingerprint; a position of nothing is refused */
    assert_int_equal(corpus_open(&d, &o, err, sizeof(err)), 0);
    assert_true(corpus_fingerprint(c) == corpus_fingerprint(d));
    corpus_pos_t bad = pos[5][0];
    bad.off += 1;
    assert_int_equal(corpus_seek(d, 0, &bad, err, sizeof(err)), -EINVAL);
    corpus_destroy(&d);
    o.weight[0] = 0.2; /* other weights: the positions hold */
    o.seed = 99;
    assert_int_equal(corpus_open(&d, &o, err, sizeof(err)), 0);
    assert_true(corpus_fingerprint(c) == corpus_fingerprint(d));
    corpus_destroy(&d);
    o.src[1].field = "body";
    assert_int_equal(corpus_open(&d, &o, err, sizeof(err)), 0);
    assert_true(corpus_fingerprint(c) != corpus_fingerprint(d));
    corpus_destroy(&d);
    corpus_destroy(&c);
}

static void test_corpus_mix_refuses_bad_options(void **state)
{
    make_mix_sources();
    corpus_opts_t o = mix_opts();
    corpus_t *c;
    char err[512];
    o.weight[1] = 0;
    assert_int_equal(corpus_open(&c, &o, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "mix-b.txt: the weight 0 is not a positive number"));
    o.weight[1] = -1;
    assert_int_equal(corpus_open(&c, &o, err, sizeof(err)), -EINVAL);
    o = mix_opts();
    o.eos = 300;
    assert_int_equal(corpus_open(&c, &o, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "EOS 300"));
    o = mix_opts();
    o.src[1].pattern = in_tmp("none-*.txt");
    assert_int_equal(corpus_open(&c, &o, err, sizeof(err)), -ENOENT);
    assert_null(c);
}

static void test_corpus_slurp_gives_prep_the_documents(void **state)
{
    mkdir(in_tmp("s"), 0755);
    put_gz(in_tmp("s"), "1.jsonl.gz", "{\"text\": \"one\"}\nbad\n{\"text\": \"two\"}\n");
    put(in_tmp("s"), "2.txt", "plain\n\ntext");
    put(in_tmp("s"), "3.txt", "");
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, files = 0;
    uint64_t bad = 0;
    char err[512];
    corpus_src_opts_t o = src("s/*");
    assert_int_equal(corpus_slurp(&o, &buf, &len, &cap, &files, &bad, err, sizeof(err)), 0);
    assert_int_equal(files, 3);
    assert_int_equal(bad, 1);
    assert_int_equal(len, strlen("one\ntwo\nplain\n\ntext"));
    assert_memory_equal(buf, "one\ntwo\nplain\n\ntext", len);
    free(buf);
}

/* `ctitan prep` of a glob of JSON Lines (gzip and not, a named field) writes what it writes for
 * the same documents as a text file, a line each. */
static void test_corpus_prep_reads_jsonl_gzip_and_globs(void **state)
{
    static char docs[32768], jl[2][32768];
    uint64_t rng = 3;
    for (int d = 0; d < 200; d++) {
        char doc[400] = {0};
        for (int w = 0, n = 2 + (int)(tu_next(&rng) % 20); w < n; w++)
            snprintf(doc + strlen(doc), sizeof(doc) - strlen(doc), "%sv%d", w ? " " : "", (int)(tu_next(&rng) % 90));
        snprintf(docs + strlen(docs), sizeof(docs) - strlen(docs), "%s\n", doc);
        snprintf(jl[d / 100] + strlen(jl[d / 100]), sizeof(jl[0]) - strlen(jl[0]), "{\"body\": \"%s\"}\n", doc);
    }
    mkdir(in_tmp("p"), 0755);
    put_gz(in_tmp("p"), "0.jsonl.gz", jl[0]);
    put(in_tmp("p"), "1.jsonl", jl[1]);
    put(g_tmp, "p.txt", docs);
    char gpath[512], tpath[512];
    snprintf(gpath, sizeof(gpath), "%s", in_tmp("p/*.jsonl*"));
    snprintf(tpath, sizeof(tpath), "%s", in_tmp("p.txt"));
    const char *glob_files[] = {gpath}, *txt_files[] = {tpath};
    prep_opts_t o;
    prep_result_t r;
    char err[512], a[512], b[512];
    prep_defaults(&o);
    o.vocab_size = 300;
    o.field = "body";
    o.files = glob_files;
    o.n_files = 1;
    o.out_dir = in_tmp("prep-jsonl");
    if (prep_run(&o, &r, err, sizeof(err)))
        fail_msg("%s", err);
    assert_int_equal(r.n_files, 2);
    assert_int_equal(r.bytes_in, strlen(docs));
    o.field = NULL;
    o.files = txt_files;
    o.out_dir = in_tmp("prep-txt");
    assert_int_equal(prep_run(&o, &r, err, sizeof(err)), 0);
    const char *names[] = {"tokenizer.bin", "train.bin", "val.bin"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof(a), "cmp -s %s/prep-jsonl/%s %s/prep-txt/%s", g_tmp, names[i], g_tmp, names[i]);
        assert_int_equal(system(a), 0);
    }
    /* a glob matching nothing, and a missing field everywhere */
    const char *none[] = {in_tmp("p/*.parquet")};
    o.files = none;
    assert_int_equal(prep_run(&o, &r, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "matches no file"));
    o.files = glob_files;
    assert_int_equal(prep_run(&o, &r, err, sizeof(err)), -EINVAL);
    snprintf(b, sizeof(b), "%s", err);
    assert_non_null(strstr(b, "no text"));
}

/* ---- jobs ---- */

/* The job corpus in tj_dir: source A, two JSON Lines files (one gzip, with a bad line) matched
 * by a glob; source B, a text file of a document a line. ~3000 and ~1500 tokens: a 60-step run
 * (7680 tokens) wraps both, its step 20 is mid-epoch. */
static void make_job_corpus(void)
{
    static char a[2][16384], b[8192];
    uint64_t rng = 7;
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/ja", tj_dir);
    if (mkdir(dir, 0755) && errno == EEXIST)
        return;
    for (int f = 0; f < 2; f++)
        for (int d = 0; d < 40; d++) {
            snprintf(a[f] + strlen(a[f]), sizeof(a[f]) - strlen(a[f]), "{\"id\": %d, \"text\": \"", d);
            for (int w = 0, n = 3 + (int)(tu_next(&rng) % 50); w < n; w++)
                snprintf(a[f] + strlen(a[f]), sizeof(a[f]) - strlen(a[f]), "w%d ", (int)(tu_next(&rng) % 60));
            snprintf(a[f] + strlen(a[f]), sizeof(a[f]) - strlen(a[f]), "\"}\n%s", f == 0 && d == 20 ? "garbage\n" : "");
        }
    put_gz(dir, "part-0.jsonl.gz", a[0]);
    put(dir, "part-1.jsonl", a[1]);
    for (int d = 0; d < 50; d++) {
        for (int w = 0, n = 3 + (int)(tu_next(&rng) % 30); w < n; w++)
            snprintf(b + strlen(b), sizeof(b) - strlen(b), "w%d%s", (int)(tu_next(&rng) % 60), w + 1 < n ? " " : "\n");
    }
    put(tj_dir, "jb.txt", b);
}

/* The loader command of the job corpus (chunk: its --chunk-bytes). */
static const char *job_loader(int chunk)
{
    static char cmd[1024];
    char ldr[256];
    make_job_corpus();
    snprintf(cmd, sizeof(cmd), "%s --tokenizer %s/data/tokenizer.bin --source \"%s/ja/*.jsonl*\" --weight 0.7 "
             "--field text --source %s/jb.txt --weight 0.3 --bos 1 --eos 2 --chunk-bytes %d",
             tu_program("ctitan-loader-text", ldr, sizeof(ldr)), tj_dir, tj_dir, tj_dir, chunk);
    return cmd;
}

/* `ctitan launch` of the tiny manifest with the job corpus's loader and `extra`; in the
 * background (its pid returned, output in DIR/JOB.out) or to its end (status; output in out). */
static int job_run(const char *job, const char *extra, int bg, char *out, size_t n)
{
    static char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
             "--metrics.file %s/%s.jsonl --metrics.peak_tflops 1 %s '--loader.command=%s' %s",
             tu_ctitan(), job, tj_dir, job, tj_dir, job, extra, job_loader(256),
             bg ? "> /dev/null 2>&1 & echo $!" : "2>&1");
    if (!bg)
        return tu_run(cmd, out, n);
    snprintf(cmd + strlen(cmd) - strlen("> /dev/null 2>&1 & echo $!"), 256, "> %s/%s.out 2>&1 & echo $!", tj_dir, job);
    assert_int_equal(tu_run(cmd, out, n), 0);
    return atoi(out);
}

/* Each step b reported has a's loss at that step, and b reached step `last`. */
static void assert_losses_match(const char *a, const char *b, int first, int last)
{
    static tj_metrics_t ma, mb;
    tj_parse_metrics(a, &ma);
    tj_parse_metrics(b, &mb);
    assert_true(ma.n >= last);
    int seen = 0;
    for (int i = 0; i < mb.n; i++) {
        int s = mb.step[i];
        assert_true(s >= first && s <= last);
        if (strcmp(ma.loss[s - 1], mb.loss[i]))
            fail_msg("step %d: %s has loss %s, the undisturbed %s %s", s, b, mb.loss[i], a, ma.loss[s - 1]);
        seen |= s == last;
    }
    assert_true(seen);
}

static void test_corpus_job_on_two_weighted_sources_trains_and_resumes_bitwise(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 17];
    char a[32], b[32], extra[512];
    tj_name(a, sizeof(a), 'c', "mix");
    int rc = job_run(a, "--training.steps 60 --checkpoint.enable true --checkpoint.interval 20", 0, out, sizeof(out));
    if (rc)
        TJ_FAIL_WITH(out, "the job failed: %d", rc);
    assert_non_null(strstr(out, "part-0.jsonl.gz:22: not JSON"));
    assert_non_null(strstr(out, "bad JSON Lines line(s) skipped"));
    static tj_metrics_t m;
    tj_parse_metrics(a, &m);
    assert_int_equal(m.n, 60);
    double first = atof(m.loss[0]), last = atof(m.loss[59]);
    assert_true(isfinite(last) && last < first - 1.0); /* it learns the corpus */
    for (int from = 20; from <= 40; from += 20) { /* mid-epoch (20) and after both wrapped (40) */
        tj_name(b, sizeof(b), 'c', from == 20 ? "res20" : "res40");
        snprintf(extra, sizeof(extra), "--training.steps 60 --checkpoint.load %s/runs/%s/checkpoint/step-%08d", tj_dir,
                 a, from);
        rc = job_run(b, extra, 0, out, sizeof(out));
        if (rc || !strstr(out, "resuming from"))
            TJ_FAIL_WITH(out, "the resumed job: %d", rc);
        assert_losses_match(a, b, from + 1, 60);
        tj_assert_clean(b);
    }
    tj_assert_clean(a);
}

/* Waits for the background launch pid (not our child) to exit. */
static void wait_gone(pid_t pid)
{
    for (int i = 0; i < 12000 && kill(pid, 0) == 0; i++)
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    assert_int_not_equal(kill(pid, 0), 0);
}

static void swap_to(const char *job, const char *cmd_line, int *at)
{
    static char cmd[4096], out[1 << 14];
    snprintf(cmd, sizeof(cmd), "%s loader swap --job %s --cmd '%s' 2>&1", tu_ctitan(), job, cmd_line);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        TJ_FAIL_WITH(out, "loader swap: %d", rc);
    assert_non_null(strstr(out, "after step"));
    assert_int_equal(sscanf(strstr(out, "after step"), "after step %d", at), 1);
}

/* A swap to the same command (the cursor, exactly), a swap to another command over the same
 * data (another fingerprint: replayed from the sample count) and a kill -9 of the loader (the
 * library restarts it from its cursor): the losses of an undisturbed run. */
static void test_corpus_job_loader_swaps_and_a_killed_loader_give_the_same_losses(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 20]; /* a line a step */
    char a[32], b[32];
    const char *steps = "--training.steps 2000";
    tj_name(a, sizeof(a), 'c', "ref");
    tj_name(b, sizeof(b), 'c', "swap");
    int rc = job_run(a, steps, 0, out, sizeof(out));
    if (rc)
        TJ_FAIL_WITH(out, "the job failed: %d", rc);
    pid_t pid = job_run(b, steps, 1, out, sizeof(out));
    assert_true(pid > 0);
    assert_int_equal(tj_wait_step(b, 3, 60), 0);
    int at1, at2;
    char same[1024], other[1024];
    snprintf(same, sizeof(same), "%s", job_loader(256));
    snprintf(other, sizeof(other), "%s", job_loader(1024)); /* every document is under 2 * 256 bytes */
    swap_to(b, same, &at1);
    swap_to(b, other, &at2);
    assert_true(at1 >= 3 && at2 >= at1 && at2 < 1900);
    assert_int_equal(tj_wait_step(b, at2 + 20, 60), 0);
    pid_t ldr = tu_descendant_named(pid, "ctitan-loader-t");
    assert_true(ldr > 0);
    assert_int_equal(kill(ldr, SIGKILL), 0);
    wait_gone(pid);
    tj_read_out(b, out, sizeof(out));
    assert_non_null(strstr(out, "replaying the mix to sample"));
    assert_non_null(strstr(out, "was killed by signal 9"));
    if (!strstr(out, "done: 2000 steps"))
        TJ_FAIL_WITH(out, "no end");
    assert_losses_match(a, b, 1, 2000);
    tj_assert_clean(b);
}

/* A loader that cannot serve its corpus fails the job before the first step, saying why. */
static void test_corpus_job_bad_sources_fail_the_job_with_the_reason(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16], cmd[4096];
    char j[32], ldr[256];
    make_job_corpus();
    put(tj_dir, "nodoc.jsonl", "{\"title\": \"no text\"}\n\n");
    struct {
        const char *args, *why;
    } cases[] = {
        {"--source '%s/none-*.jsonl'", "none-*.jsonl: the glob matches no file"},
        {"--source %s/nodoc.jsonl", "nodoc.jsonl: no document in its 1 file(s)"},
        {"--source %s/ja/part-0.jsonl.gz --on-bad-line error", "part-0.jsonl.gz:22: not JSON"},
        {"--source %s/jb.txt --weight 0", "--weight: expected a positive number"},
    };
    for (int i = 0; i < 4; i++) {
        char src[512];
        snprintf(src, sizeof(src), cases[i].args, tj_dir);
        tj_name(j, sizeof(j), 'c', "bad");
        snprintf(j + strlen(j), sizeof(j) - strlen(j), "%d", i);
        snprintf(cmd, sizeof(cmd), "%s launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
                 "--training.steps 100 --job.max_restarts 0 "
                 "\"--loader.command=%s --tokenizer %s/data/tokenizer.bin %s\" 2>&1",
                 tu_ctitan(), j, tj_dir, j, tu_program("ctitan-loader-text", ldr, sizeof(ldr)), tj_dir, src);
        int rc = tu_run(cmd, out, sizeof(out));
        if (rc != 1 || !strstr(out, cases[i].why))
            TJ_FAIL_WITH(out, "case %d: status %d, expected 1 and '%s'", i, rc, cases[i].why);
        if (i < 3 && !strstr(out, "failed: loader: "))
            TJ_FAIL_WITH(out, "case %d: not the loader's reason", i);
        tj_assert_clean(j);
    }
}

/* Eight sources (the most) fit the cursor, mid-file offsets and all; a ninth is refused. */
static void test_corpus_job_eight_sources_fit_the_cursor(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 17], cmd[8192];
    char j[32], ldr[256], srcs[4096] = {0};
    make_job_corpus();
    for (int n = 8; n <= 9; n++) {
        srcs[0] = 0;
        for (int i = 0; i < n; i++)
            snprintf(srcs + strlen(srcs), sizeof(srcs) - strlen(srcs), " --source %s/%s --weight %d", tj_dir,
                     i % 2 ? "jb.txt" : "ja/part-0.jsonl.gz", i + 1);
        tj_name(j, sizeof(j), 'c', n == 8 ? "eight" : "nine");
        snprintf(cmd, sizeof(cmd), "%s launch manifests/tiny.toml --job.name %s --job.dump_folder %s/runs/%s "
                 "--training.steps 30 --job.max_restarts 0 --metrics.file %s/%s.jsonl --metrics.peak_tflops 1 "
                 "\"--loader.command=%s --tokenizer %s/data/tokenizer.bin%s\" 2>&1",
                 tu_ctitan(), j, tj_dir, j, tj_dir, j, tu_program("ctitan-loader-text", ldr, sizeof(ldr)), tj_dir, srcs);
        int rc = tu_run(cmd, out, sizeof(out));
        if (n == 8 && rc)
            TJ_FAIL_WITH(out, "eight sources: status %d", rc);
        if (n == 9 && (rc != 1 || !strstr(out, "too many sources")))
            TJ_FAIL_WITH(out, "nine sources: status %d", rc);
        tj_assert_clean(j);
    }
}

static int setup(void **state)
{
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/ctitan-corpus-XXXXXX");
    if (!mkdtemp(g_tmp))
        return -1;
    char text[4096] = {0}, err[256];
    for (int i = 0; strlen(text) < 4000; i++)
        snprintf(text + strlen(text), sizeof(text) - strlen(text), "w%d line %d says v%d\n", (i * 7) % 53, i, i % 19);
    if (tok_train(&g_tok, (const uint8_t *)text, strlen(text), 300, err, sizeof(err)))
        return -1;
    return tj_setup("corpusjob");
}

static int teardown(void **state)
{
    tok_destroy(&g_tok);
    tu_rmtree(g_tmp);
    return tj_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_reads_jsonl_gzip_and_plain_through_a_sorted_glob),
        cmocka_unit_test(test_corpus_bad_lines_are_skipped_and_counted_or_an_error),
        cmocka_unit_test(test_corpus_text_is_a_document_a_line_or_a_file),
        cmocka_unit_test(test_corpus_refuses_clearly),
        cmocka_unit_test(test_corpus_documents_are_framed_by_bos_and_eos),
        cmocka_unit_test(test_corpus_positions_resume_exactly_at_every_point),
        cmocka_unit_test(test_corpus_mix_refuses_bad_options),
        cmocka_unit_test(test_corpus_slurp_gives_prep_the_documents),
        cmocka_unit_test(test_corpus_prep_reads_jsonl_gzip_and_globs),
        cmocka_unit_test(test_corpus_job_on_two_weighted_sources_trains_and_resumes_bitwise),
        cmocka_unit_test(test_corpus_job_loader_swaps_and_a_killed_loader_give_the_same_losses),
        cmocka_unit_test(test_corpus_job_bad_sources_fail_the_job_with_the_reason),
        cmocka_unit_test(test_corpus_job_eight_sources_fit_the_cursor),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
