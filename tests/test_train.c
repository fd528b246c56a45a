/* `ctitan train` end to end, as a user runs it: prep a small corpus with the real binary,
 * train a tiny model for a few dozen steps, and check the loss falls and the sample prints;
 * bad arguments get an error naming the problem. Skips if build/bin/ctitan is missing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/testutil.h"

static const char *bin(void)
{
    return tu_ctitan();
}

/* A temp folder (dir: "/tmp/ctitan-train-XXXXXX") with data/ prepared by `ctitan prep` from a
 * corpus of sentences over 64 made-up words, enough pairs for 44 merges and a pattern (word
 * order repeats every 7 words) a tiny model learns in a few dozen steps. */
static void prep(char *dir)
{
    char cmd[1024], out[8192];
    assert_non_null(mkdtemp(dir));
    static const char *syl[] = {"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo"};
    snprintf(cmd, sizeof(cmd), "%s/corpus.txt", dir);
    FILE *f = fopen(cmd, "w");
    for (int i = 0; i < 20000; i++)
        fprintf(f, "%s%s%s", syl[(i * 3) % 7], syl[(i * 5 + 1) % 8], i % 7 == 6 ? ".\n" : " ");
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s prep --vocab 300 --out %s/data %s/corpus.txt 2>&1", bin(), dir, dir);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
}

static void test_train_tiny_model_loss_falls_and_samples(void **state)
{
    if (access(bin(), X_OK)) {
        print_message("%s not built: skipping\n", bin());
        skip();
    }
    char dir[] = "/tmp/ctitan-train-XXXXXX", cmd[1024];
    static char out[1 << 20];
    prep(dir);
    snprintf(cmd, sizeof(cmd),
             "%s train --data %s/data --model tiny --model.vocab_size 300 --model.dim 32 "
             "--steps 60 --batch 4 --seq 32 --lr 1e-2 --threads 2 --sample 20 2>&1",
             bin(), dir);
    int rc = tu_run(cmd, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    double first = 0, last = 0;
    int steps = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        int s;
        double loss;
        if (sscanf(line, "step %d loss %lf", &s, &loss) == 2) {
            if (s == 1)
                first = loss;
            last = loss, steps++;
        }
        if (!strncmp(line, "done:", 5))
            assert_non_null(strstr(line, "validation loss"));
    }
    assert_int_equal(steps, 60);
    assert_true(first > 5.0);       /* ~ln(300) at init */
    assert_true(last < first - 3.0); /* the pattern is learnt */
    tu_rmtree(dir);
}

/* The sample after `--temperature 0` is greedy: said in its header, and the same text from
 * two runs. */
static void test_train_temperature_0_samples_greedily(void **state)
{
    if (access(bin(), X_OK)) {
        print_message("%s not built: skipping\n", bin());
        skip();
    }
    char dir[] = "/tmp/ctitan-train-XXXXXX", cmd[1024];
    static char out[2][1 << 16];
    prep(dir);
    for (int run = 0; run < 2; run++) {
        snprintf(cmd, sizeof(cmd),
                 "%s train --data %s/data --model tiny --model.vocab_size 300 --model.dim 32 "
                 "--steps 20 --batch 4 --seq 32 --lr 1e-2 --threads 2 --sample 24 --temperature 0 2>&1",
                 bin(), dir);
        int rc = tu_run(cmd, out[run], sizeof(out[run]));
        if (rc)
            print_error("%s\n", out[run]);
        assert_int_equal(rc, 0);
    }
    const char *a = strstr(out[0], "\n--- sample (prompt: the first 8 validation tokens, greedy) ---\n");
    const char *b = strstr(out[1], "\n--- sample (");
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(a, b);
    tu_rmtree(dir);
}

static void test_train_rejects_bad_arguments_with_a_reason(void **state)
{
    if (access(bin(), X_OK)) {
        print_message("%s not built: skipping\n", bin());
        skip();
    }
    static char out[8192];
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s train --data /nonexistent/dir 2>&1", bin());
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "/nonexistent/dir/train.bin"));
    snprintf(cmd, sizeof(cmd), "%s train --data x --model.dim 250 2>&1", bin());
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "model.dim (250) is not divisible by model.n_heads (16)"));
    snprintf(cmd, sizeof(cmd), "%s train --data x --steps many 2>&1", bin());
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "--steps"));
    snprintf(cmd, sizeof(cmd), "%s train --data x --temperature -1 2>&1", bin());
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "--temperature expects a number >= 0, got '-1'"));
    snprintf(cmd, sizeof(cmd), "%s train --data x --bogus 1 2>&1", bin());
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "unknown option '--bogus'"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_tiny_model_loss_falls_and_samples),
        cmocka_unit_test(test_train_temperature_0_samples_greedily),
        cmocka_unit_test(test_train_rejects_bad_arguments_with_a_reason),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
