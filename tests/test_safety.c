/* Safe by default (issue 22), with real processes, files and sockets: what a user saved is
 * neither overwritten nor deleted, nothing hangs without a word, and what goes wrong names the
 * manifest key it comes from. One test per finding; each failed before its fix. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("safety"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 's', what); }

/* A launch expected to fail before training, whose error names `key`. */
static void assert_refused_naming(const char *what, const char *extra, const char *key)
{
    static char out[1 << 16];
    char j[32];
    job_name(j, sizeof(j), what);
    int rc = tj_launch("", 60, j, extra, out, sizeof(out));
    if (rc == 0 || !strstr(out, key))
        TJ_FAIL_WITH(out, "%s: status %d, and the output should name %s", what, rc, key);
    tj_assert_clean(j);
}

/* A missing validation file, tokenizer or training file: the error names its manifest key. */
static void test_safety_a_missing_data_file_is_named_by_its_key(void **state)
{
    TU_NEED_BIN();
    assert_refused_naming("val", "--validation.enable true --validation.dataset_path /nonexistent/val.bin",
                          "validation.dataset_path");
    assert_refused_naming("tok", "--sample.tokens 4 --model.tokenizer_path /nonexistent/tokenizer.bin",
                          "model.tokenizer_path");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safety_a_missing_data_file_is_named_by_its_key),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
