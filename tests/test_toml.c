/* The TOML subset reader: values of every supported type, the messages for each syntax error
 * (always "PATH:LINE: ..."), and random or mutated input that must fail cleanly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"
#include "stages/job/toml.h"

static toml_doc_t parse_ok(const char *text)
{
    toml_doc_t doc;
    char err[256] = "";
    int rc = toml_parse(&doc, text, strlen(text), "t.toml", err, sizeof(err));
    if (rc)
        fail_msg("unexpected error: %s", err);
    return doc;
}

/* Fails unless parsing gives -EINVAL with "t.toml:LINE: " and `needle` in the message. */
static void parse_fails(const char *text, int line, const char *needle)
{
    toml_doc_t doc;
    char err[256] = "", prefix[32];
    assert_int_equal(toml_parse(&doc, text, strlen(text), "t.toml", err, sizeof(err)), -EINVAL);
    assert_int_equal(doc.n_entries, 0);
    snprintf(prefix, sizeof(prefix), "t.toml:%d: ", line);
    if (strncmp(err, prefix, strlen(prefix)) || !strstr(err, needle))
        fail_msg("for input '%s': error '%s' lacks '%s' or '%s'", text, err, prefix, needle);
}

static const toml_value_t *get(const toml_doc_t *doc, const char *section, const char *key)
{
    for (int i = 0; i < doc->n_entries; i++) {
        const toml_entry_t *e = &doc->entries[i];
        const char *s = e->section < 0 ? "" : doc->sections[e->section].name;
        if (!strcmp(s, section) && !strcmp(e->key, key))
            return &e->value;
    }
    fail_msg("no key %s.%s", section, key);
    return NULL;
}

static void test_toml_parses_sections_keys_and_comments(void **state)
{
    toml_doc_t doc = parse_ok("# leading comment\n"
                              "top = 1\n"
                              "\n"
                              "[job]   # trailing comment\n"
                              "  name = \"demo\"  # after a value\n"
                              "\tsteps=10\n"
                              "[ training ]\n"
                              "lr = 2e-3\n"
                              "my-key_2 = true\n");
    assert_int_equal(doc.n_sections, 2);
    assert_string_equal(doc.sections[0].name, "job");
    assert_int_equal(doc.sections[0].line, 4);
    assert_string_equal(doc.sections[1].name, "training");
    assert_int_equal(doc.n_entries, 5);
    assert_int_equal(doc.entries[0].section, -1);
    assert_int_equal(get(&doc, "", "top")->i, 1);
    assert_string_equal(get(&doc, "job", "name")->s, "demo");
    assert_int_equal(doc.entries[1].line, 5);
    assert_int_equal(get(&doc, "job", "steps")->i, 10);
    assert_true(get(&doc, "training", "lr")->f == 2e-3);
    assert_int_equal(get(&doc, "training", "my-key_2")->type, TOML_BOOL);
    toml_free(&doc);
}

static void test_toml_empty_and_comment_only_texts_parse(void **state)
{
    const char *texts[] = {"", "\n\n", "# only a comment", "  \t\n# x\n\r\n"};
    for (size_t i = 0; i < 4; i++) {
        toml_doc_t doc = parse_ok(texts[i]);
        assert_int_equal(doc.n_entries + doc.n_sections, 0);
        toml_free(&doc);
    }
}

static void test_toml_basic_string_escapes(void **state)
{
    toml_doc_t doc = parse_ok("a = \"q\\\"b\\\\s\\nn\\tt\\r\\b\\f\"\n"
                              "u = \"caf\\u00e9 \\U0001F600 \\u20AC\"\n"
                              "raw = \"caf\xc3\xa9 # not a comment\"\n"
                              "e = \"\"\n");
    assert_string_equal(get(&doc, "", "a")->s, "q\"b\\s\nn\tt\r\b\f");
    assert_string_equal(get(&doc, "", "u")->s, "caf\xc3\xa9 \xf0\x9f\x98\x80 \xe2\x82\xac");
    assert_string_equal(get(&doc, "", "raw")->s, "caf\xc3\xa9 # not a comment");
    assert_string_equal(get(&doc, "", "e")->s, "");
    toml_free(&doc);
}

static void test_toml_literal_strings_keep_backslashes(void **state)
{
    toml_doc_t doc = parse_ok("p = 'C:\\path\\n \"quoted\"'\ne = ''\n");
    assert_string_equal(get(&doc, "", "p")->s, "C:\\path\\n \"quoted\"");
    assert_string_equal(get(&doc, "", "e")->s, "");
    toml_free(&doc);
}

static void test_toml_rejects_bad_strings(void **state)
{
    parse_fails("a = 1\nb = \"open\n", 2, "unterminated string");
    parse_fails("b = 'open", 1, "unterminated string");
    parse_fails("b = \"x\\q\"", 1, "invalid escape");
    parse_fails("b = \"\\u12\"", 1, "\\u escape needs 4 hex digits");
    parse_fails("b = \"\\uD800\"", 1, "not a Unicode scalar value");
    parse_fails("b = \"\\U00110000\"", 1, "not a Unicode scalar value");
    parse_fails("b = \"\\u0000\"", 1, "\\u0000 is not supported");
    parse_fails("b = \"a\x01\"", 1, "control character (0x01) in a string");
    parse_fails("b = \"\"\"multi\"\"\"", 1, "multi-line strings");
    parse_fails("b = '''multi'''", 1, "multi-line strings");
    parse_fails("b = \"x\\", 1, "unterminated string");
}

static void test_toml_integers_with_underscores_signs_and_bases(void **state)
{
    toml_doc_t doc = parse_ok("a = 42\nb = -17\nc = +3\nd = 1_000_000\ne = 0\nf = -0\n"
                              "g = 0xdead_BEEF\nh = 0o755\ni = 0b1010\n"
                              "j = 9223372036854775807\nk = -9223372036854775808\n");
    int64_t want[] = {42, -17, 3, 1000000, 0, 0, 0xdeadbeef, 0755, 10, INT64_MAX, INT64_MIN};
    const char *names = "abcdefghijk";
    for (int i = 0; i < 11; i++) {
        char key[2] = {names[i], 0};
        const toml_value_t *v = get(&doc, "", key);
        assert_int_equal(v->type, TOML_INT);
        assert_true(v->i == want[i]);
    }
    toml_free(&doc);
}

static void test_toml_rejects_bad_integers(void **state)
{
    parse_fails("a = 012", 1, "leading zeros");
    parse_fails("a = 1__2", 1, "underscore must sit between two digits");
    parse_fails("a = 1_", 1, "underscore");
    parse_fails("a = _1", 1, "strings need quotes");
    parse_fails("a = 9223372036854775808", 1, "out of range");
    parse_fails("a = 0x8000000000000000", 1, "out of range");
    parse_fails("a = -0x1", 1, "take no sign");
    parse_fails("a = 0x", 1, "invalid hexadecimal integer");
    parse_fails("a = 0b102", 1, "invalid binary integer");
    parse_fails("a = 1.2.3", 1, "invalid number");
    parse_fails("a = +", 1, "invalid number");
}

static void test_toml_floats(void **state)
{
    toml_doc_t doc = parse_ok("a = 1.0\nb = 1e-4\nc = -2.5E3\nd = 6.02e+23\ne = 1_000.5\n"
                              "f = 0.1\ng = -0.0\nh = 1e05\ni = inf\nj = -inf\nk = nan\n");
    assert_true(get(&doc, "", "a")->f == 1.0);
    assert_true(get(&doc, "", "b")->f == 1e-4);
    assert_true(get(&doc, "", "c")->f == -2500.0);
    assert_true(get(&doc, "", "d")->f == 6.02e23);
    assert_true(get(&doc, "", "e")->f == 1000.5);
    assert_true(get(&doc, "", "f")->f == 0.1);
    assert_true(signbit(get(&doc, "", "g")->f));
    assert_true(get(&doc, "", "h")->f == 1e5);
    assert_true(isinf(get(&doc, "", "i")->f) && get(&doc, "", "i")->f > 0);
    assert_true(isinf(get(&doc, "", "j")->f) && get(&doc, "", "j")->f < 0);
    assert_true(isnan(get(&doc, "", "k")->f));
    for (int i = 0; i < doc.n_entries; i++)
        assert_int_equal(doc.entries[i].value.type, TOML_FLOAT);
    toml_free(&doc);
}

static void test_toml_rejects_bad_floats(void **state)
{
    parse_fails("a = 1.", 1, "digits must follow '.'");
    parse_fails("a = .5", 1, "invalid number");
    parse_fails("a = 1e", 1, "digits must follow the exponent");
    parse_fails("a = 1.e5", 1, "digits must follow '.'");
    parse_fails("a = 1e999", 1, "out of range");
    parse_fails("a = 01.5", 1, "leading zeros");
    parse_fails("a = 1.5x", 1, "invalid number");
}

static void test_toml_booleans(void **state)
{
    toml_doc_t doc = parse_ok("t = true\nf = false\n");
    assert_int_equal(get(&doc, "", "t")->b, 1);
    assert_int_equal(get(&doc, "", "f")->b, 0);
    toml_free(&doc);
    parse_fails("t = True", 1, "strings need quotes");
    parse_fails("t = truex", 1, "strings need quotes");
}

static void test_toml_arrays_single_and_multi_line(void **state)
{
    toml_doc_t doc = parse_ok("a = [\"layers.2\", 'layers.4']\n"
                              "b = []\n"
                              "c = [ 1, 2.5, true, ]\n"
                              "d = [\n"
                              "  1,   # one\n"
                              "  # a comment line\n"
                              "  2\n"
                              "]\n"
                              "e = [[1, 2], [\"x\"], []]\n"
                              "f = 3\n");
    const toml_value_t *a = get(&doc, "", "a");
    assert_int_equal(a->type, TOML_ARRAY);
    assert_int_equal(a->n, 2);
    assert_string_equal(a->items[1].s, "layers.4");
    assert_int_equal(get(&doc, "", "b")->n, 0);
    const toml_value_t *c = get(&doc, "", "c");
    assert_int_equal(c->n, 3);
    assert_int_equal(c->items[1].type, TOML_FLOAT);
    assert_int_equal(c->items[2].type, TOML_BOOL);
    const toml_value_t *d = get(&doc, "", "d");
    assert_int_equal(d->n, 2);
    assert_int_equal(d->items[1].line, 7);
    const toml_value_t *e = get(&doc, "", "e");
    assert_int_equal(e->n, 3);
    assert_int_equal(e->items[0].items[1].i, 2);
    assert_string_equal(e->items[1].items[0].s, "x");
    assert_int_equal(e->items[2].n, 0);
    assert_int_equal(doc.entries[doc.n_entries - 1].line, 10); /* lines counted inside arrays */
    toml_free(&doc);
}

static void test_toml_rejects_bad_arrays(void **state)
{
    parse_fails("a = [1 2]", 1, "expected ',' or ']'");
    parse_fails("a = [1,,2]", 1, "expected a value, got ','");
    parse_fails("a = [1, 2\nb = 3\n", 2, "expected ',' or ']'");
    parse_fails("a = [1,\n2,\n", 3, "unterminated array (opened on line 1)");
    parse_fails("a = [[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]", 1, "nested deeper than 16");
    parse_fails("a = [1] 2", 1, "unexpected '2' after the value");
}

static void test_toml_rejects_duplicate_key(void **state)
{
    parse_fails("[job]\nname = \"a\"\nsteps = 1\nname = \"b\"\n", 4,
                "duplicate key 'name' (first set on line 2)");
    /* the same key in two sections is fine */
    toml_doc_t doc = parse_ok("[a]\nx = 1\n[b]\nx = 2\n");
    assert_int_equal(doc.n_entries, 2);
    toml_free(&doc);
}

static void test_toml_rejects_duplicate_section(void **state)
{
    parse_fails("[job]\nname = \"a\"\n[training]\n[job]\n", 4,
                "duplicate section [job] (first on line 1)");
}

static void test_toml_rejects_dotted_and_quoted_names(void **state)
{
    parse_fails("[model.extra]\n", 1, "nested tables ([model.extra]) are not supported");
    parse_fails("a.b = 1\n", 1, "dotted keys (a.b) are not supported");
    parse_fails("\"a b\" = 1\n", 1, "quoted keys are not supported");
    parse_fails("[\"job\"]\n", 1, "quoted section names are not supported");
    parse_fails("[[job]]\n", 1, "arrays of tables");
    parse_fails("[]\n", 1, "expected a section name");
    parse_fails("[job\n", 1, "expected ']'");
}

static void test_toml_rejects_trailing_garbage(void **state)
{
    parse_fails("a = 1\nb = 2 3\n", 2, "unexpected '3' after the value");
    parse_fails("b = \"x\" y\n", 1, "unexpected 'y' after the value");
    parse_fails("[job] x\n", 1, "unexpected 'x' after the section header");
    parse_fails("b = true false\n", 1, "unexpected 'f' after the value");
}

static void test_toml_errors_name_path_and_line(void **state)
{
    parse_fails("a = 1\n\n\nb =\n", 4, "missing value for the key 'b'");
    parse_fails("a = 1\n= 2\n", 2, "missing key before '='");
    parse_fails("a 1\n", 1, "expected '=' after the key 'a', got '1'");
    parse_fails("a = hello\n", 1, "invalid value 'hello' (strings need quotes)");
    parse_fails("a = {x = 1}\n", 1, "inline tables");
    parse_fails("a = 1979-05-27\n", 1, "dates and times are not supported");
    parse_fails("a = 07:32:00\n", 1, "dates and times are not supported");
    parse_fails("a = 1 # ok\n!b = 2\n", 2, "expected a key, got '!'");
    parse_fails("a = 1 # bad \x01 comment\n", 1, "control character (0x01) in a comment");
    parse_fails("a = 1\rb = 2\n", 1, "carriage return not followed by a newline");
}

static void test_toml_crlf_line_endings(void **state)
{
    toml_doc_t doc = parse_ok("[job]\r\nname = \"x\" # c\r\n\r\nsteps = 3\r\n");
    assert_int_equal(get(&doc, "job", "steps")->i, 3);
    assert_int_equal(doc.entries[1].line, 4);
    toml_free(&doc);
}

static void test_toml_rejects_nul_and_invalid_utf8(void **state)
{
    toml_doc_t doc;
    char err[256];
    const char with_nul[] = "a = 1\nb = \"x\0y\"\n";
    assert_int_equal(toml_parse(&doc, with_nul, sizeof(with_nul) - 1, "t.toml", err, sizeof(err)),
                     -EINVAL);
    assert_non_null(strstr(err, "t.toml:2: NUL byte"));
    parse_fails("a = 1\n\nb = \"\xff\"\n", 3, "invalid UTF-8 (byte 0xff)");
    parse_fails("b = \"\xc0\xaf\"\n", 1, "invalid UTF-8"); /* overlong '/' */
    parse_fails("b = \"\xed\xa0\x80\"\n", 1, "invalid UTF-8"); /* surrogate */
    parse_fails("b = \"\xe2\x82\"\n", 1, "invalid UTF-8"); /* truncated sequence */
    assert_int_equal(toml_utf8_invalid_at("ok \xc3\xa9 \xf0\x9f\x98\x80", 10), -1);
    assert_int_equal(toml_utf8_invalid_at("ab\xf5", 3), 2);
}

static void test_toml_parse_value_for_overrides(void **state)
{
    toml_value_t v;
    char err[128];
    assert_int_equal(toml_parse_value(&v, " 20 ", 4, err, sizeof(err)), 0);
    assert_int_equal(v.type, TOML_INT);
    assert_int_equal(v.i, 20);
    toml_value_free(&v);
    assert_int_equal(toml_parse_value(&v, "1e-4", 4, err, sizeof(err)), 0);
    assert_true(v.type == TOML_FLOAT && v.f == 1e-4);
    toml_value_free(&v);
    assert_int_equal(toml_parse_value(&v, "[\"a\", 2]", 8, err, sizeof(err)), 0);
    assert_int_equal(v.n, 2);
    toml_value_free(&v);
    assert_int_equal(toml_parse_value(&v, "20 x", 4, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "unexpected 'x' after the value");
    assert_int_equal(toml_parse_value(&v, "", 0, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "expected a value"));
    assert_int_equal(toml_parse_value(&v, "abc", 3, err, sizeof(err)), -EINVAL);
    assert_string_equal(toml_type_name(TOML_FLOAT), "a float");
}

/* Random bytes, random TOML-ish tokens, and truncations and byte flips of a valid file:
 * every outcome is success or an error message with a path and line, never a crash (run
 * under ASan/UBSan to make that mean something). */
static void test_toml_fuzz_random_and_mutated_inputs_never_crash(void **state)
{
    static const char valid[] =
        "# manifest\n[job]\nname = \"demo\" # c\nsteps = 1_000\n[model]\n"
        "lr = -2.5e-3\nflags = [true, false, ]\nsplit = [\n  \"layers.2\", # x\n 'layers.4'\n]\n"
        "esc = \"a\\u00e9\\n\\\"\"\nhex = 0xff\n";
    static const char *pieces[] = {"[", "]", "=", "\"", "'", "\\", "\\u", "#", "\n", "\r\n", " ",
                                   ",", ".", "x", "1", "_", "e", "-", "+", "0x", "true", "inf",
                                   "[job]", "a = ", "\xc3\xa9", "\xff", "{", "\t", "1979-", ":"};
    char buf[512], err[256];
    uint64_t seed = 12345;
    int ok = 0, failed = 0;
    for (int iter = 0; iter < 30000; iter++) {
        size_t n = 0;
        int mode = iter % 3;
        if (mode == 0) { /* random bytes */
            n = tu_next(&seed) % 200;
            for (size_t i = 0; i < n; i++)
                buf[i] = (char)tu_next(&seed);
        } else if (mode == 1) { /* random tokens */
            int k = (int)(tu_next(&seed) % 40);
            for (int i = 0; i < k; i++) {
                const char *p = pieces[tu_next(&seed) % (sizeof(pieces) / sizeof(pieces[0]))];
                size_t l = strlen(p);
                if (n + l >= sizeof(buf))
                    break;
                memcpy(buf + n, p, l);
                n += l;
            }
        } else { /* a valid file, truncated and with a few bytes changed */
            n = tu_next(&seed) % sizeof(valid);
            memcpy(buf, valid, n);
            int flips = (int)(tu_next(&seed) % 4);
            for (int i = 0; i < flips && n; i++)
                buf[tu_next(&seed) % n] = (char)tu_next(&seed);
        }
        toml_doc_t doc;
        err[0] = 0;
        int rc = toml_parse(&doc, buf, n, "f.toml", err, sizeof(err));
        if (rc) {
            assert_int_equal(rc, -EINVAL);
            if (strncmp(err, "f.toml:", 7))
                fail_msg("error without a location: '%s'", err);
            failed++;
        } else {
            ok++;
            toml_free(&doc);
        }
        toml_value_t v;
        if (!toml_parse_value(&v, buf, n, err, sizeof(err)))
            toml_value_free(&v);
    }
    assert_true(ok > 100 && failed > 100); /* both paths were exercised */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_toml_parses_sections_keys_and_comments),
        cmocka_unit_test(test_toml_empty_and_comment_only_texts_parse),
        cmocka_unit_test(test_toml_basic_string_escapes),
        cmocka_unit_test(test_toml_literal_strings_keep_backslashes),
        cmocka_unit_test(test_toml_rejects_bad_strings),
        cmocka_unit_test(test_toml_integers_with_underscores_signs_and_bases),
        cmocka_unit_test(test_toml_rejects_bad_integers),
        cmocka_unit_test(test_toml_floats),
        cmocka_unit_test(test_toml_rejects_bad_floats),
        cmocka_unit_test(test_toml_booleans),
        cmocka_unit_test(test_toml_arrays_single_and_multi_line),
        cmocka_unit_test(test_toml_rejects_bad_arrays),
        cmocka_unit_test(test_toml_rejects_duplicate_key),
        cmocka_unit_test(test_toml_rejects_duplicate_section),
        cmocka_unit_test(test_toml_rejects_dotted_and_quoted_names),
        cmocka_unit_test(test_toml_rejects_trailing_garbage),
        cmocka_unit_test(test_toml_errors_name_path_and_line),
        cmocka_unit_test(test_toml_crlf_line_endings),
        cmocka_unit_test(test_toml_rejects_nul_and_invalid_utf8),
        cmocka_unit_test(test_toml_parse_value_for_overrides),
        cmocka_unit_test(test_toml_fuzz_random_and_mutated_inputs_never_crash),
    };
    return tu_run_group_tests(tests, NULL, NULL);
}
