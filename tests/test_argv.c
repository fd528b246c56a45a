/* Commands as argument vectors (ipc/argv.h): words split as a user expects from a shell, with
 * quotes and escapes, and everything a shell would expand or run refused; the packed form a
 * swap carries, checked like a peer's input; the quoted form splits back to the same words. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <string.h>

#include "ipc/argv.h"

static void split_ok(const char *line, int argc, const char *const *want)
{
    argv_t a;
    char err[256] = "";
    if (argv_split(line, &a, err, sizeof err))
        fail_msg("%s: %s", line, err);
    assert_int_equal(a.argc, argc);
    for (int i = 0; i < argc; i++)
        assert_string_equal(a.argv[i], want[i]);
    assert_null(a.argv[argc]);
    argv_free(&a);
    assert_null(a.argv);
}

static void split_bad(const char *line, int rc, const char *needle)
{
    argv_t a;
    char err[256] = "";
    assert_int_equal(argv_split(line, &a, err, sizeof err), rc);
    assert_null(a.argv);
    if (!strstr(err, needle))
        fail_msg("%s: error '%s' lacks '%s'", line, err, needle);
}

static void test_argv_splits_words_quotes_and_escapes_as_a_shell_would(void **state)
{
    split_ok("build/bin/ctitan-loader", 1, (const char *[]){"build/bin/ctitan-loader"});
    split_ok("  prog   --x=1,\t--y\n", 3, (const char *[]){"prog", "--x=1,", "--y"});
    split_ok("prog 'two words' \"and \\\"three\\\" \\\\ here\"", 3,
             (const char *[]){"prog", "two words", "and \"three\" \\ here"});
    split_ok("prog 'a|b;c>d$e*f' \"g&h(i)\" j\\ k", 4, (const char *[]){"prog", "a|b;c>d$e*f", "g&h(i)", "j k"});
    split_ok("prog '' \"\" x", 4, (const char *[]){"prog", "", "", "x"}); /* quoted empties are words */
    split_ok("prog a'b'\"c\"d", 2, (const char *[]){"prog", "abcd"});
    split_ok("prog a#b c~d --k=v", 4, (const char *[]){"prog", "a#b", "c~d", "--k=v"}); /* only at a word's start */
    split_ok("prog \\\n --cont", 2, (const char *[]){"prog", "--cont"});
    split_ok("'FOO=1' prog", 2, (const char *[]){"FOO=1", "prog"});
    split_ok("python3 -c 'print(\"[x]\")'", 3, (const char *[]){"python3", "-c", "print(\"[x]\")"});
}

static void test_argv_refuses_what_a_shell_would_expand_or_run(void **state)
{
    const char *shell[] = {"prog | tee x", "prog > out", "prog < in", "prog ; rm -rf x", "prog && y", "prog &",
                           "prog $HOME", "prog `id`", "prog *.txt", "prog a?b", "prog [ab]", "prog (x)",
                           "prog ~/data", "prog #comment", "touch x; exec prog"};
    for (size_t i = 0; i < sizeof shell / sizeof shell[0]; i++)
        split_bad(shell[i], -EINVAL, "without a shell");
    split_bad("prog \"$HOME\"", -EINVAL, "nothing is expanded");
    split_bad("prog \"`id`\"", -EINVAL, "nothing is expanded");
    split_bad("FOO=1 prog", -EINVAL, "environment assignment");
    split_bad("prog --x\nrm -rf data", -EINVAL, "a newline at byte 8"); /* two commands to a shell */
    split_bad("prog\n\n x", -EINVAL, "a newline at byte 4");
    split_ok("prog 'a\nb'\n\n", 2, (const char *[]){"prog", "a\nb"}); /* quoted, or only blanks after it */
    split_bad("prog 'unclosed", -EINVAL, "is not closed");
    split_bad("prog \"unclosed", -EINVAL, "is not closed");
    split_bad("prog \\", -EINVAL, "backslash ends");
    split_bad("", -EINVAL, "empty");
    split_bad("   \t ", -EINVAL, "empty");
    split_bad("'' arg", -EINVAL, "program's name is empty");
    char big[ARGV_MAX_BYTES + 8];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    split_bad(big, -E2BIG, "longer than");
    char many[2 * (ARGV_MAX_WORDS + 1) + 1];
    for (int i = 0; i <= ARGV_MAX_WORDS; i++)
        memcpy(many + 2 * i, "a ", 2);
    many[2 * (ARGV_MAX_WORDS + 1)] = '\0';
    split_bad(many, -E2BIG, "words");
}

static void test_argv_packed_form_round_trips_and_is_checked(void **state)
{
    argv_t a, b;
    char err[256];
    uint8_t buf[ARGV_MAX_BYTES];
    size_t len;
    assert_int_equal(argv_split("prog 'a b' '' c", &a, err, sizeof err), 0);
    assert_int_equal(argv_pack(&a, buf, &len), 0);
    assert_int_equal(len, 5 + 4 + 1 + 2);
    assert_memory_equal(buf, "prog\0a b\0\0c\0", len);
    assert_int_equal(argv_unpack(buf, len, &b, err, sizeof err), 0);
    assert_int_equal(b.argc, 4);
    for (int i = 0; i < 4; i++)
        assert_string_equal(a.argv[i], b.argv[i]);
    argv_free(&a);
    argv_free(&b);
    /* what a peer may send instead */
    assert_int_equal(argv_unpack(NULL, 0, &b, err, sizeof err), -EINVAL);
    assert_int_equal(argv_unpack((const uint8_t *)"prog", 4, &b, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "not NUL-terminated"));
    assert_int_equal(argv_unpack((const uint8_t *)"\0x\0", 3, &b, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "program's name is empty"));
    uint8_t zeros[2 * ARGV_MAX_WORDS + 2];
    memset(zeros, 0, sizeof zeros);
    zeros[0] = 'p';
    assert_int_equal(argv_unpack(zeros, sizeof zeros, &b, err, sizeof err), -E2BIG);
    uint8_t huge[ARGV_MAX_BYTES + 1];
    memset(huge, 'x', sizeof huge);
    huge[sizeof huge - 1] = 0;
    assert_int_equal(argv_unpack(huge, sizeof huge, &b, err, sizeof err), -E2BIG);
    assert_null(b.argv);
}

static void test_argv_shown_form_splits_back_to_the_same_words(void **state)
{
    const char *lines[] = {"prog plain --k=v", "prog 'it'\\''s' \"a b\" ''", "prog 'a|b' 'x*y' '$HOME'",
                           "/usr/bin/python3 -c 'print(\"[x]\")'",
                           "'pyt=9' a=b" /* a program named like an assignment (found by fuzz_argv) */};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        argv_t a, b;
        char err[256], shown[512];
        assert_int_equal(argv_split(lines[i], &a, err, sizeof err), 0);
        argv_show(&a, shown, sizeof shown);
        if (argv_split(shown, &b, err, sizeof err))
            fail_msg("%s shown as %s: %s", lines[i], shown, err);
        assert_int_equal(a.argc, b.argc);
        for (int k = 0; k < a.argc; k++)
            assert_string_equal(a.argv[k], b.argv[k]);
        argv_free(&a);
        argv_free(&b);
    }
    argv_t a;
    char err[256], tiny[8];
    assert_int_equal(argv_split("program with many words", &a, err, sizeof err), 0);
    argv_show(&a, tiny, sizeof tiny); /* truncated, terminated */
    assert_true(strlen(tiny) < sizeof tiny);
    argv_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argv_splits_words_quotes_and_escapes_as_a_shell_would),
        cmocka_unit_test(test_argv_refuses_what_a_shell_would_expand_or_run),
        cmocka_unit_test(test_argv_packed_form_round_trips_and_is_checked),
        cmocka_unit_test(test_argv_shown_form_splits_back_to_the_same_words),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
