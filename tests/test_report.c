/* What a whole job (`ctitan launch`, real processes and files) tells the user, issue 14's
 * "training you can watch" (stages/coord_report.c): the validation loss in the metrics file at
 * full precision beside the printed short form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("report"); }
static int teardown(void **state) { return tj_teardown(); }

/* The line of out that starts with `start` into line ("" when none). */
static void find_line(const char *out, const char *start, char *line, size_t n)
{
    line[0] = 0;
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, start, strlen(start))) {
            size_t len = strcspn(p, "\n");
            snprintf(line, n, "%.*s", (int)len, p);
            return;
        }
}

/* With validation the metrics file's last record is the validation loss at the last step:
 * %.17g, which round-trips, and rounds to the 4 decimals the done line prints; over the batches
 * the line names, batch x seq_len tokens each. */
static void test_report_validation_loss_goes_into_the_metrics_file(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16], buf[1 << 16];
    char j[32], extra[512], line[4096];
    tj_name(j, sizeof(j), 'r', "val");
    snprintf(extra, sizeof(extra),
             "--training.steps 4 --validation.enable true --validation.dataset_path %s/data/val.bin "
             "--validation.steps 3", tj_dir);
    int rc = tj_launch("", 300, j, extra, out, sizeof(out));
    if (rc)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    find_line(out, "done: ", line, sizeof(line));
    const char *p = strstr(line, "; validation loss ");
    assert_non_null(p);
    char shown[32];
    int batches;
    assert_int_equal(sscanf(p, "; validation loss %31s over %d batches", shown, &batches), 2);
    assert_int_equal(batches, 3);

    tj_read_metrics(j, buf, sizeof(buf));
    char *last = buf + strlen(buf) - 1; /* the last line */
    assert_true(*last == '\n');
    *last = 0;
    last = strrchr(buf, '\n') ? strrchr(buf, '\n') + 1 : buf;
    assert_non_null(strstr(buf, "{\"step\": 4, \"loss\": "));
    char full[64];
    int step, vb;
    long long tokens;
    if (sscanf(last, "{\"step\": %d, \"val_loss\": %63[^,], \"val_batches\": %d, \"val_tokens\": %lld}", &step, full,
               &vb, &tokens) != 4)
        fail_msg("the last record is not the validation's: %s", last);
    assert_int_equal(step, 4);
    assert_int_equal(vb, batches);
    assert_int_equal(tokens, 3LL * 4 * 32); /* tiny.toml: local_batch_size 4, seq_len 32 */
    char *end;
    double v = strtod(full, &end), s = atof(shown);
    assert_true(*end == 0);
    char again[64], rounded[32];
    snprintf(again, sizeof(again), "%.17g", v);
    assert_string_equal(again, full);        /* written with every digit */
    snprintf(rounded, sizeof(rounded), "%.4f", v);
    assert_string_equal(rounded, shown);     /* the printed value is its short form */
    assert_true(strlen(full) > 12);
    assert_true(v != s && fabs(v - s) <= 5e-5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_validation_loss_goes_into_the_metrics_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
