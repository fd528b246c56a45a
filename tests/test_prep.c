/* Tests of `ctitan prep` (stages/data/prep.c): argument parsing, the default corpus listing, a full
 * run on small temp files whose outputs must decode back to the input, and failures that must
 * leave no partial output. The built binary's exit codes are checked when it exists. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/testutil.h"
#include "stages/data/prep.h"
#include "stages/data/tokenizer.h"
#include "stages/data/tokfile.h"

extern char **environ;


typedef struct {
    char *dir;
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    f->dir = strdup("/tmp/ctitan-test-prep-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    int gone = tu_rmtree(f->dir) == 0;
    free(f->dir);
    free(f);
    return gone ? 0 : -1;
}

static void write_file(const char *path, const void *b, size_t n)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(b, 1, n, fp), n);
    fclose(fp);
}

static size_t count_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* Some text: sentences from a small word list, with a NUL and invalid UTF-8 in the mix. */
static uint8_t *make_text(uint64_t seed, size_t n)
{
    static const char *w[] = {"time", " flies", " like", " an", " arrow", ".", "\n", " fruit",
                              " bananas", ",", " 1999", " naïve", " the", " of"};
    uint8_t *t = malloc(n);
    uint64_t s = seed;
    size_t i = 0;
    char word[16];
    while (i < n) {
        uint64_t r = tu_next(&s);
        const char *x = w[r % 14];
        if ((r >> 8) % 4 == 0) { /* a made-up word, so there is always more to merge */
            int l = 3 + (int)((r >> 16) % 5);
            word[0] = ' ';
            for (int k = 1; k <= l; k++) word[k] = "etaoinshrdlu"[(r >> (20 + 3 * k)) % 12];
            word[l + 1] = '\0';
            x = word;
        }
        size_t l = strlen(x);
        for (size_t k = 0; k < l && i < n; k++) t[i++] = (uint8_t)x[k];
    }
    t[n / 2] = 0;
    t[n / 3] = 0xff;
    return t;
}

static char **argv_of(char *buf, const char *line, int *argc)
{
    static char *av[32];
    strcpy(buf, line);
    int n = 0;
    for (char *tok = strtok(buf, " "); tok && n < 31; tok = strtok(NULL, " ")) av[n++] = tok;
    av[n] = NULL;
    *argc = n;
    return av;
}

/* ---- argument parsing ---- */

static void test_parse_args_defaults_and_values(void **state)
{
    prep_opts_t o;
    char buf[256], err[256];
    int argc;
    char **av = argv_of(buf, "prep", &argc);
    assert_int_equal(prep_parse_args(argc, av, &o, err, sizeof(err)), 0);
    assert_int_equal(o.vocab_size, 2048);
    assert_string_equal(o.out_dir, "data/fortunes");
    assert_true(o.val_fraction == 0.05);
    assert_int_equal(o.n_files, 0);

    av = argv_of(buf, "prep --vocab 300 --out d/x --val-fraction=0.25 a.txt b.txt", &argc);
    assert_int_equal(prep_parse_args(argc, av, &o, err, sizeof(err)), 0);
    assert_int_equal(o.vocab_size, 300);
    assert_string_equal(o.out_dir, "d/x");
    assert_true(o.val_fraction == 0.25);
    assert_int_equal(o.n_files, 2);
    assert_string_equal(o.files[0], "a.txt");
    assert_string_equal(o.files[1], "b.txt");

    av = argv_of(buf, "prep --vocab=4096 -- --odd-name", &argc);
    assert_int_equal(prep_parse_args(argc, av, &o, err, sizeof(err)), 0);
    assert_int_equal(o.vocab_size, 4096);
    assert_int_equal(o.n_files, 1);
    assert_string_equal(o.files[0], "--odd-name");

    av = argv_of(buf, "prep --vocab 300 --help", &argc);
    assert_int_equal(prep_parse_args(argc, av, &o, err, sizeof(err)), 1);
}

static void expect_parse_error(const char *line, const char *want)
{
    prep_opts_t o;
    char buf[256], err[256] = "";
    int argc;
    char **av = argv_of(buf, line, &argc);
    assert_int_equal(prep_parse_args(argc, av, &o, err, sizeof(err)), -EINVAL);
    if (!strstr(err, want)) fail_msg("\"%s\": error \"%s\" lacks \"%s\"", line, err, want);
}

static void test_parse_args_rejects_bad_arguments(void **state)
{
    expect_parse_error("prep --vocab abc", "--vocab 'abc'");
    expect_parse_error("prep --vocab 256", "--vocab '256'");
    expect_parse_error("prep --vocab 12x", "--vocab '12x'");
    expect_parse_error("prep --val-fraction 1", "--val-fraction '1'");
    expect_parse_error("prep --val-fraction -0.1", "--val-fraction '-0.1'");
    expect_parse_error("prep --out", "--out needs a value");
    expect_parse_error("prep --out=", "--out: empty");
    expect_parse_error("prep --frobnicate", "unknown option '--frobnicate'");
    expect_parse_error("prep --vocabulary 5", "unknown option '--vocabulary'");
}

/* ---- default corpus ---- */

static void test_list_corpus_skips_dat_links_and_folders(void **state)
{
    fixture_t *f = *state;
    char p[600], q[600];
    const char *plain[] = {"zippy", "art", "computers"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s/%s", f->dir, plain[i]);
        write_file(p, "x\n%\ny\n", 6);
        snprintf(q, sizeof(q), "%s/%s.dat", f->dir, plain[i]);
        write_file(q, "\0\0\0\2", 4);
        snprintf(q, sizeof(q), "%s/%s.u8", f->dir, plain[i]);
        assert_int_equal(symlink(plain[i], q), 0);
    }
    snprintf(p, sizeof(p), "%s/off", f->dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/off/rude", f->dir);
    write_file(p, "no", 2);
    snprintf(p, sizeof(p), "%s/.hidden", f->dir);
    write_file(p, "no", 2);

    char **files = NULL, err[512];
    size_t n = 0;
    assert_int_equal(prep_list_corpus(f->dir, &files, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 3);
    const char *want[] = {"art", "computers", "zippy"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s/%s", f->dir, want[i]);
        assert_string_equal(files[i], p);
    }
    free(files);
}

static void test_missing_corpus_says_to_install_fortunes(void **state)
{
    fixture_t *f = *state;
    char missing[600], err[512];
    snprintf(missing, sizeof(missing), "%s/games/fortunes", f->dir);
    char **files = NULL;
    size_t n = 0;
    assert_true(prep_list_corpus(missing, &files, &n, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, missing));
    assert_non_null(strstr(err, "install fortunes"));
    /* present but empty */
    assert_true(prep_list_corpus(f->dir, &files, &n, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "no text files"));
    assert_non_null(strstr(err, "fortunes"));
    /* and prep_run with no files reports the same */
    prep_opts_t o;
    prep_defaults(&o);
    prep_result_t r;
    char out[600];
    snprintf(out, sizeof(out), "%s/out", f->dir);
    o.out_dir = out;
    o.corpus_dir = missing;
    assert_true(prep_run(&o, &r, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "install fortunes"));
    assert_int_equal(access(out, F_OK), -1);
}

static void test_installed_fortunes_corpus_is_listed(void **state)
{
    char **files = NULL, err[512];
    size_t n = 0;
    if (access(PREP_FORTUNES_DIR, F_OK)) skip(); /* package `fortunes` not installed */
    assert_int_equal(prep_list_corpus(PREP_FORTUNES_DIR, &files, &n, err, sizeof(err)), 0);
    assert_true(n >= 10);
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(files[i]);
        assert_false(l > 4 && !strcmp(files[i] + l - 4, ".dat"));
        assert_false(l > 3 && !strcmp(files[i] + l - 3, ".u8"));
        if (i) assert_true(strcmp(files[i - 1], files[i]) < 0);
    }
    free(files);
}

/* ---- full runs ---- */

static void test_prep_outputs_decode_to_the_input(void **state)
{
    fixture_t *f = *state;
    size_t n1 = 30000, n2 = 12345;
    uint8_t *t1 = make_text(1, n1), *t2 = make_text(2, n2);
    char p1[600], p2[600], out[600], err[512];
    snprintf(p1, sizeof(p1), "%s/one.txt", f->dir);
    snprintf(p2, sizeof(p2), "%s/two.txt", f->dir);
    snprintf(out, sizeof(out), "%s/data/small", f->dir); /* two levels to create */
    write_file(p1, t1, n1);
    write_file(p2, t2, n2);

    prep_opts_t o;
    prep_defaults(&o);
    const char *files[] = {p1, p2};
    o.files = files;
    o.n_files = 2;
    o.out_dir = out;
    o.vocab_size = 400;
    o.val_fraction = 0.1;
    prep_result_t r;
    if (prep_run(&o, &r, err, sizeof(err))) fail_msg("prep: %s", err);
    assert_int_equal(r.n_files, 2);
    assert_int_equal(r.bytes_in, n1 + n2);
    assert_int_equal(r.vocab_size, 400);
    assert_int_equal(r.n_train + r.n_val, r.n_tokens);
    assert_int_equal(r.n_val, (size_t)llround(0.1 * r.n_tokens));
    assert_true(r.n_tokens < (n1 + n2) / 2);
    assert_int_equal(count_dir_entries(out), 3); /* no temp files left */

    char path[700];
    tok_t *tk = NULL;
    snprintf(path, sizeof(path), "%s/tokenizer.bin", out);
    if (tok_load(&tk, path, err, sizeof(err))) fail_msg("%s", err);
    tokfile_t *tr = NULL, *va = NULL;
    snprintf(path, sizeof(path), "%s/train.bin", out);
    if (tokfile_open(&tr, path, tok_vocab_size(tk), err, sizeof(err))) fail_msg("%s", err);
    snprintf(path, sizeof(path), "%s/val.bin", out);
    if (tokfile_open(&va, path, tok_vocab_size(tk), err, sizeof(err))) fail_msg("%s", err);
    assert_int_equal(tokfile_count(tr), r.n_train);
    assert_int_equal(tokfile_count(va), r.n_val);
    assert_int_equal(tokfile_vocab_size(tr), 400);

    size_t nt = r.n_tokens;
    uint32_t *all = malloc(nt * sizeof(uint32_t));
    for (size_t i = 0; i < r.n_train; i++) all[i] = tokfile_get(tr, i);
    for (size_t i = 0; i < r.n_val; i++) all[r.n_train + i] = tokfile_get(va, i);
    uint8_t *back = NULL;
    size_t nb = 0;
    assert_int_equal(tok_decode(tk, all, nt, &back, &nb), 0);
    assert_int_equal(nb, n1 + n2);
    assert_memory_equal(back, t1, n1);
    assert_memory_equal(back + n1, t2, n2);

    /* the reported entropy is the unigram entropy of these tokens */
    size_t *cnt = calloc(400, sizeof(size_t));
    for (size_t i = 0; i < nt; i++) cnt[all[i]]++;
    double h = 0;
    for (int v = 0; v < 400; v++)
        if (cnt[v]) h -= (double)cnt[v] / nt * log((double)cnt[v] / nt);
    assert_true(fabs(h - r.entropy) < 1e-9);
    assert_true(r.entropy > 0 && r.entropy <= log(400.0));

    free(cnt);
    free(back);
    free(all);
    tokfile_close(&tr);
    tokfile_close(&va);
    tok_destroy(&tk);
    free(t1);
    free(t2);
}

static void test_prep_missing_input_names_it_and_writes_nothing(void **state)
{
    fixture_t *f = *state;
    char p1[600], missing[600], out[600], err[512];
    snprintf(p1, sizeof(p1), "%s/one.txt", f->dir);
    snprintf(missing, sizeof(missing), "%s/nope.txt", f->dir);
    snprintf(out, sizeof(out), "%s/out", f->dir);
    write_file(p1, "hello hello hello", 17);
    prep_opts_t o;
    prep_defaults(&o);
    const char *files[] = {p1, missing};
    o.files = files;
    o.n_files = 2;
    o.out_dir = out;
    prep_result_t r;
    assert_true(prep_run(&o, &r, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, missing));
    assert_non_null(strstr(err, "No such file"));
    assert_int_equal(access(out, F_OK), -1);
}

static void test_prep_failure_keeps_previous_outputs(void **state)
{
    fixture_t *f = *state;
    size_t n = 20000;
    uint8_t *t = make_text(3, n);
    char p1[600], out[600], path[700], err[512];
    snprintf(p1, sizeof(p1), "%s/one.txt", f->dir);
    snprintf(out, sizeof(out), "%s/out", f->dir);
    write_file(p1, t, n);
    prep_opts_t o;
    prep_defaults(&o);
    const char *files[] = {p1};
    o.files = files;
    o.n_files = 1;
    o.out_dir = out;
    o.vocab_size = 300;
    prep_result_t r;
    if (prep_run(&o, &r, err, sizeof(err))) fail_msg("prep: %s", err);
    size_t first_tokens = r.n_train;

    /* too large a vocab for this text: fails in training, old outputs stay */
    o.vocab_size = 100000;
    assert_true(prep_run(&o, &r, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "corpus too small"));
    assert_int_equal(count_dir_entries(out), 3);
    tokfile_t *tf = NULL;
    snprintf(path, sizeof(path), "%s/train.bin", out);
    assert_int_equal(tokfile_open(&tf, path, 300, err, sizeof(err)), 0);
    assert_int_equal(tokfile_count(tf), first_tokens);
    tokfile_close(&tf);

    /* fails at the very end (val.bin cannot be replaced: it is a folder): temp files go */
    snprintf(path, sizeof(path), "%s/val.bin", out);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0755), 0);
    o.vocab_size = 280;
    assert_true(prep_run(&o, &r, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, path));
    assert_int_equal(count_dir_entries(out), 3);
    snprintf(path, sizeof(path), "%s/train.bin", out);
    assert_int_equal(tokfile_open(&tf, path, 300, err, sizeof(err)), 0);
    assert_int_equal(tokfile_count(tf), first_tokens); /* not replaced by the vocab-280 run */
    tokfile_close(&tf);

    /* a failed run removes the output folder it created */
    char deep[700];
    snprintf(deep, sizeof(deep), "%s/new/deeper", f->dir);
    o.out_dir = deep;
    o.vocab_size = 100000;
    assert_true(prep_run(&o, &r, err, sizeof(err)) < 0);
    snprintf(path, sizeof(path), "%s/new", f->dir);
    assert_int_equal(access(path, F_OK), -1);
    free(t);
}

static int run_cli(const char *const *args)
{
    pid_t pid;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    int rc = posix_spawn(&pid, args[0], &fa, NULL, (char *const *)args, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(rc, 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void test_cli_exit_codes(void **state)
{
    fixture_t *f = *state;
    const char *bin = tu_ctitan();
    if (access(bin, X_OK)) {
        fprintf(stderr, "%s not built (run from the repo root after `make`): skipping\n", bin);
        skip();
    }
    char out[600], missing[600], txt[600];
    snprintf(out, sizeof(out), "%s/cli", f->dir);
    snprintf(missing, sizeof(missing), "%s/nope.txt", f->dir);
    snprintf(txt, sizeof(txt), "%s/a.txt", f->dir);
    uint8_t *t = make_text(4, 5000);
    write_file(txt, t, 5000);
    free(t);
    assert_int_equal(run_cli((const char *[]){bin, "prep", "--help", NULL}), 0);
    assert_int_equal(run_cli((const char *[]){bin, "prep", "--vocab", "abc", NULL}), 2);
    assert_int_equal(run_cli((const char *[]){bin, "prep", "--bogus", NULL}), 2);
    assert_int_equal(run_cli((const char *[]){bin, "prep", "--out", out, missing, NULL}), 1);
    assert_int_equal(access(out, F_OK), -1);
    assert_int_equal(
        run_cli((const char *[]){bin, "prep", "--vocab", "260", "--out", out, txt, NULL}), 0);
    assert_int_equal(count_dir_entries(out), 3);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_parse_args_defaults_and_values),
        T(test_parse_args_rejects_bad_arguments),
        T(test_list_corpus_skips_dat_links_and_folders),
        T(test_missing_corpus_says_to_install_fortunes),
        T(test_installed_fortunes_corpus_is_listed),
        T(test_prep_outputs_decode_to_the_input),
        T(test_prep_missing_input_names_it_and_writes_nothing),
        T(test_prep_failure_keeps_previous_outputs),
        T(test_cli_exit_codes),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
