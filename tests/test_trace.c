/* The timeline file's writer (stages/runtime/trace.c): a JSON array of trace events that a relaunch
 * appends to, whether the run before it ended (its closing bracket taken off) or was killed in
 * the middle of an event (that event dropped); names with quotes stay JSON; a path that cannot
 * be written is named. Each file is checked by python3's json module where there is one, and
 * always by its brackets and braces. Also the records a process sends (MSG_TRACE): what it
 * keeps (trace_note, trace_seal) and what the coordinator accepts (trace_recs_check). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "stages/runtime/trace.h"
#include "tests/testutil.h"

static char dir[64];

static int setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/ctitan-trace-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    tu_rmtree(dir);
    return 0;
}

/* The file is one JSON array of `events` objects: by python3 when there is one, and by its
 * shape (starts "[", ends "]", braces balanced outside strings, that many top-level objects). */
static void assert_json_array(const char *path, int events)
{
    static char text[1 << 16];
    tu_read_file(path, text, sizeof(text));
    size_t n = strlen(text);
    assert_true(n >= 3 && text[0] == '[' && !strcmp(text + n - 2, "]\n"));
    int depth = 0, top = 0, quoted = 0;
    for (size_t i = 1; i < n - 2; i++) {
        char c = text[i];
        if (quoted) {
            if (c == '\\')
                i++;
            else if (c == '"')
                quoted = 0;
        } else if (c == '"') {
            quoted = 1;
        } else if (c == '{') {
            top += depth++ == 0;
        } else if (c == '}') {
            assert_true(--depth >= 0);
        }
    }
    assert_int_equal(depth, 0);
    assert_int_equal(top, events);
    char cmd[512], out[256];
    if (tu_run("command -v python3 >/dev/null", out, sizeof(out)))
        return;
    snprintf(cmd, sizeof(cmd), "python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))))' %s 2>&1", path);
    assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    assert_int_equal(atoi(out), events);
}

/* A run of `spans` slices (one process, named with a quote in it: 4 metadata events). */
static void write_run(const char *path, int append, int spans)
{
    trace_t *t;
    char err[512];
    assert_int_equal(trace_open(&t, path, append, 100.0, err, sizeof(err)), 0);
    trace_process(t, 42, "stage \"0\"", 1);
    for (int i = 0; i < spans; i++)
        trace_span(t, 42, 1, "F1", "F", 100.0 + i, 100.5 + i, i % 2 ? "\"step\": 1" : NULL);
    assert_int_equal(trace_flush(t, err, sizeof(err)), 0);
    trace_close(&t);
    assert_null(t);
}

static void test_trace_runs_append_to_one_json_array(void **state)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/ok.json", dir);
    write_run(path, 0, 3);
    assert_json_array(path, 4 + 3);
    write_run(path, 1, 2); /* a relaunch */
    assert_json_array(path, 7 + 4 + 2);
    static char text[1 << 16];
    tu_read_file(path, text, sizeof(text));
    assert_non_null(strstr(text, "\"ts\": 1000000.000, \"dur\": 500000.000")); /* microseconds from t0 */
    assert_non_null(strstr(text, "stage \\\"0\\\"")); /* the quote escaped */
}

/* A file cut in the middle of an event (a coordinator killed while it wrote): the relaunch
 * drops the torn event and the comma before it; cut right after the opening bracket, or right
 * after a separating comma, too. */
static void test_trace_a_torn_last_event_is_dropped_before_appending(void **state)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/torn.json", dir);
    FILE *f = fopen(path, "w");
    fputs("[\n{\"ph\": \"X\", \"name\": \"F0\", \"pid\": 1, \"tid\": 1, \"ts\": 0, \"dur\": 1},\n"
          "{\"ph\": \"X\", \"name\": \"B{0\", \"args\": {\"step\": 1", f); /* braces in a name, cut */
    fclose(f);
    write_run(path, 1, 1);
    assert_json_array(path, 1 + 4 + 1);
    snprintf(path, sizeof(path), "%s/torn0.json", dir);
    f = fopen(path, "w");
    fputs("[\n{\"ph\": \"X\", \"na", f);
    fclose(f);
    write_run(path, 1, 2);
    assert_json_array(path, 4 + 2);
    /* cut between an event's separating comma and its newline (a kill when a buffered write
     * ended there): the comma goes, not the whole event before it */
    snprintf(path, sizeof(path), "%s/comma.json", dir);
    f = fopen(path, "w");
    fputs("[\n{\"ph\": \"X\", \"name\": \"F0\", \"pid\": 1, \"tid\": 1, \"ts\": 0, \"dur\": 1},", f);
    fclose(f);
    write_run(path, 1, 1);
    assert_json_array(path, 1 + 4 + 1);
    snprintf(path, sizeof(path), "%s/none.json", dir); /* append with no file: a new one */
    write_run(path, 1, 1);
    assert_json_array(path, 4 + 1);
}

static void test_trace_an_unwritable_path_is_named(void **state)
{
    trace_t *t = NULL;
    char err[512], path[128];
    snprintf(path, sizeof(path), "%s/no/such/folder/t.json", dir);
    assert_true(trace_open(&t, path, 0, 0, err, sizeof(err)) < 0);
    assert_null(t);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "cannot create"));
}

/* A process keeps its waits of TRACE_MIN_WAIT_S or more and every action, at most
 * TRACE_RECS_MAX - 1 of them, so that trace_seal's sending time always has its place; nothing
 * when it is not tracing. */
static void test_trace_note_keeps_waits_and_room_for_the_sending_time(void **state)
{
    static trace_rec_t recs[TRACE_RECS_MAX];
    int n = 0;
    trace_note(NULL, &n, (trace_rec_t){.op = 0, .t0 = 0, .t1 = 1});
    assert_int_equal(n, 0);
    trace_note(recs, &n, (trace_rec_t){.op = TRACE_WAIT, .t0 = 1, .t1 = 1 + TRACE_MIN_WAIT_S / 2});
    assert_int_equal(n, 0);
    trace_note(recs, &n, (trace_rec_t){.op = TRACE_WAIT, .t0 = 1, .t1 = 1 + 2 * TRACE_MIN_WAIT_S});
    trace_note(recs, &n, (trace_rec_t){.op = 0, .t0 = 2, .t1 = 2}); /* an action, however short */
    assert_int_equal(n, 2);
    for (int i = 0; i < 2 * TRACE_RECS_MAX; i++)
        trace_note(recs, &n, (trace_rec_t){.op = 1, .t0 = 3, .t1 = 4});
    assert_int_equal(n, TRACE_RECS_MAX - 1);
    assert_int_equal(trace_seal(recs, n), TRACE_RECS_MAX);
    assert_int_equal(recs[n].op, TRACE_SENT);
    assert_true(recs[n].t0 > 0 && recs[n].t0 == recs[n].t1);
}

/* What another process sends is checked before any of it is written: whole records, the sending
 * time last, ops and chunks in range, finite times that do not run backwards (an infinite one
 * made the file invalid JSON: "ts": inf). */
static void test_trace_records_from_another_process_are_checked(void **state)
{
    trace_rec_t r[4] = {{.op = 0, .chunk = 1, .mb = 0, .t0 = 1, .t1 = 2}, {.op = TRACE_WAIT, .mb = -1, .t0 = 2,
                        .t1 = 3}};
    char err[160];
    int n = trace_seal(r, 2);
    assert_int_equal(trace_recs_check(r, n * sizeof(r[0]), TRACE_WAIT, 2, err, sizeof(err)), 2);
    assert_int_equal(trace_recs_check(r, n * sizeof(r[0]) - 1, TRACE_WAIT, 2, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "not a whole number of trace records"));
    assert_int_equal(trace_recs_check(r, 2 * sizeof(r[0]), TRACE_WAIT, 2, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "no sending time as its last record");
    assert_int_equal(trace_recs_check(r, 0, TRACE_WAIT, 2, err, sizeof(err)), -EINVAL);
    assert_int_equal(trace_recs_check(r, n * sizeof(r[0]), TRACE_WAIT, 1, err, sizeof(err)), -EINVAL); /* chunk 1 */
    assert_non_null(strstr(err, "trace record 0 out of range (op 0, chunk 1"));
    r[1].op = TRACE_FILL; /* a loader's op, from a stage */
    assert_int_equal(trace_recs_check(r, n * sizeof(r[0]), TRACE_WAIT, 2, err, sizeof(err)), -EINVAL);
    assert_int_equal(trace_recs_check(r, n * sizeof(r[0]), TRACE_FILL, 2, err, sizeof(err)), 2);
    r[1].op = TRACE_SENT; /* only last */
    assert_int_equal(trace_recs_check(r, n * sizeof(r[0]), TRACE_FILL, 2, err, sizeof(err)), -EINVAL);
    r[1].op = TRACE_WAIT;
    const double bad[][2] = {{1, INFINITY}, {-INFINITY, 1}, {NAN, 1}, {3, 2}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r[0].t0 = bad[i][0], r[0].t1 = bad[i][1];
        assert_int_equal(trace_recs_check(r, n * sizeof(r[0]), TRACE_WAIT, 2, err, sizeof(err)), -EINVAL);
    }
    r[0].t0 = 1, r[0].t1 = 2;
    r[2].t0 = INFINITY;
    assert_int_equal(trace_recs_check(r, n * sizeof(r[0]), TRACE_WAIT, 2, err, sizeof(err)), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_runs_append_to_one_json_array),
        cmocka_unit_test(test_trace_a_torn_last_event_is_dropped_before_appending),
        cmocka_unit_test(test_trace_an_unwritable_path_is_named),
        cmocka_unit_test(test_trace_note_keeps_waits_and_room_for_the_sending_time),
        cmocka_unit_test(test_trace_records_from_another_process_are_checked),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
