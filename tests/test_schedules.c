/* Every pipeline schedule run by real processes (issue 14): stage processes holding one chunk
 * per virtual stage (loop or V placement, stages/job/schedule.h) on the shared-memory rings, each
 * run of tests/testjob.h's tiny manifest with 8 layers. The losses are bitwise those of 1F1B
 * with one stage per rank for every schedule, pipeline degree and stages per rank (weight
 * gradients summed in microbatch order everywhere); a stage killed in the middle of an
 * interleaved step is replaced and the step redone, bitwise; a checkpoint written under one
 * schedule resumes under another. The generators' own rules are tests/test_schedule.c's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "stages/job/schedule.h"
#include "tests/testjob.h"

static int setup(void **state) { return tj_setup("scheds"); }
static int teardown(void **state) { return tj_teardown(); }

static void job_name(char *buf, size_t n, const char *what) { tj_name(buf, n, 'p', what); }

/* 8 layers (10 pieces: up to 4 ranks x 2 virtual stages), 8 microbatches of one sequence */
#define BASE "--metrics.log_freq 100000 --model.n_layers 8 --training.local_batch_size 8 " \
             "--parallelism.pipeline_parallel_microbatches 8 "

/* Runs `what` with BASE, `steps` steps and `extra`; fails with its output unless it ends well.
 * job receives its name. */
static void run(char *job, size_t n, const char *what, int steps, const char *extra)
{
    static char out[1 << 16];
    char args[1024];
    job_name(job, n, what);
    snprintf(args, sizeof(args), BASE "--training.steps %d %s", steps, extra);
    int rc = tj_launch("", 180, job, args, out, sizeof(out));
    if (rc)
        TJ_FAIL_WITH(out, "%s: status %d", what, rc);
    tj_assert_clean(job);
}

/* job's losses are ref's, step by step, bit for bit. */
static void assert_same_losses(const char *job, const char *ref, int steps)
{
    static tj_metrics_t a, b;
    tj_parse_metrics(ref, &a);
    tj_parse_metrics(job, &b);
    assert_int_equal(a.n, steps);
    assert_int_equal(b.n, steps);
    for (int i = 0; i < steps; i++)
        if (strcmp(a.loss[i], b.loss[i]))
            fail_msg("step %d: %s has loss %s, %s has %s", i + 1, job, b.loss[i], ref, a.loss[i]);
}

static void test_schedules_every_schedule_and_chunk_count_gives_1f1bs_losses(void **state)
{
    TU_NEED_BIN();
    static const struct {
        const char *what, *args;
    } runs[] = {
        {"gpipe2", "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule GPipe"},
        {"il2", "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B"},
        {"il2v4", "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B "
                  "--parallelism.pipeline_parallel_layers_per_stage 1"},
        {"zbh1", "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule "
                 "InterleavedZeroBubble --parallelism.pipeline_parallel_layers_per_stage 4"},
        {"izb2", "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule "
                 "InterleavedZeroBubble"},
        {"zbv2", "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule ZBVZeroBubble"},
        {"dpv2", "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule DualPipeV"},
        {"zbv4", "--parallelism.pipeline_parallel_degree 4 --parallelism.pipeline_parallel_schedule ZBVZeroBubble"},
        {"dpv4", "--parallelism.pipeline_parallel_degree 4 --parallelism.pipeline_parallel_schedule DualPipeV"},
        {"il1", "--parallelism.pipeline_parallel_degree 1 --parallelism.pipeline_parallel_schedule Interleaved1F1B"},
    };
    char ref[32], j[32];
    run(ref, sizeof(ref), "ref", 3, "--parallelism.pipeline_parallel_degree 2");
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        run(j, sizeof(j), runs[i].what, 3, runs[i].args);
        assert_same_losses(j, ref, 3);
    }
}

/* The banner says how many virtual stages each rank holds; one stage per rank says nothing. */
static void test_schedules_the_banner_names_the_stages_per_rank(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char j[32], args[512];
    job_name(j, sizeof(j), "banner");
    snprintf(args, sizeof(args), BASE "--training.steps 1 --parallelism.pipeline_parallel_schedule ZBVZeroBubble");
    assert_int_equal(tj_launch("", 120, j, args, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "pipeline 2 (ZBVZeroBubble, 2 virtual stages per rank, 8 microbatches of 1x32)"));
    tj_assert_clean(j);
}

/* A stage killed -9 in the middle of an interleaved step (rank 1 holds virtual stages 1 and 3):
 * replaced, every ring of every virtual boundary reset, the step redone, the same losses. */
static void test_schedules_a_stage_killed_mid_step_of_an_interleaved_schedule_is_replaced_bitwise(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16];
    char ref[32], j[32], once[128], args[1024];
    const char *il = "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B";
    run(ref, sizeof(ref), "killref", 4, il);
    job_name(j, sizeof(j), "kill");
    char env[300];
    snprintf(env, sizeof(env), "CTITAN_TEST_DIE_ONCE=%s CTITAN_TEST_DIE_AT=stage.1.0:mid:3",
             tj_once_dir(once, sizeof(once), j));
    snprintf(args, sizeof(args), BASE "--training.steps 4 %s", il);
    int rc = tj_launch(env, 180, j, args, out, sizeof(out));
    if (rc || tj_count(out, "recovered 1 (in place, at step 3): stage rank 1 replica 0 (pid ") != 1 ||
        !strstr(out, "the step redone by every stage"))
        TJ_FAIL_WITH(out, "status %d", rc);
    assert_same_losses(j, ref, 4);
    tj_assert_clean(j);
}

/* A checkpoint written under ZBVZeroBubble on 2 ranks resumes under Interleaved1F1B on 1 rank,
 * and under 1F1B on 4: the state is the flat parameter space, whoever held which layers. */
static void test_schedules_a_checkpoint_resumes_under_another_schedule_bitwise(void **state)
{
    TU_NEED_BIN();
    char ref[32], a[32], b[32], c[32], args[1024];
    run(ref, sizeof(ref), "ckref", 4, "--parallelism.pipeline_parallel_degree 2");
    run(a, sizeof(a), "ckzbv", 2,
        "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule ZBVZeroBubble "
        "--checkpoint.enable true --checkpoint.interval 2");
    snprintf(args, sizeof(args), "--parallelism.pipeline_parallel_degree 1 --parallelism.pipeline_parallel_schedule "
             "Interleaved1F1B --checkpoint.load %s/runs/%s/checkpoint/step-00000002", tj_dir, a);
    run(b, sizeof(b), "ckil", 4, args);
    snprintf(args, sizeof(args), "--parallelism.pipeline_parallel_degree 4 --checkpoint.load "
             "%s/runs/%s/checkpoint/step-00000002", tj_dir, a);
    run(c, sizeof(c), "ck1f", 4, args);
    static tj_metrics_t r, x, y;
    tj_parse_metrics(ref, &r);
    tj_parse_metrics(b, &x);
    tj_parse_metrics(c, &y);
    assert_int_equal(x.n, 2);
    assert_int_equal(y.n, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(x.step[i], 3 + i);
        assert_string_equal(x.loss[i], r.loss[2 + i]);
        assert_string_equal(y.loss[i], r.loss[2 + i]);
    }
}

/* ---- the timeline ---- */

typedef struct {
    char name[32], cat[16];
    long long pid;
    int tid, step;
    double ts, dur;
} ev_t;

#define MAX_EV 20000

/* The trace's slices (one per line, as stages/runtime/trace.c writes them) and its stage tracks:
 * pids[replica * pp + rank]. Returns the number of slices. */
static int read_trace(const char *path, ev_t *ev, long long *pids, int pp)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), f)) {
        int r, rep;
        long long pid;
        char *name = strstr(line, "\"name\": \"process_name\"");
        if (name && sscanf(line, "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %lld", &pid) == 1 &&
            strstr(line, "stage rank ") &&
            sscanf(strstr(line, "stage rank "), "stage rank %d replica %d", &r, &rep) == 2)
            pids[rep * pp + r] = pid;
        ev_t e = {.step = -1};
        if (n < MAX_EV && sscanf(line, "{\"ph\": \"X\", \"name\": \"%31[^\"]\", \"cat\": \"%15[^\"]\", \"pid\": %lld, "
                                 "\"tid\": %d, \"ts\": %lf, \"dur\": %lf", e.name, e.cat, &e.pid, &e.tid, &e.ts,
                                 &e.dur) == 6) {
            char *st = strstr(line, "\"step\": ");
            if (st)
                e.step = atoi(st + 8);
            ev[n++] = e;
        }
    }
    fclose(f);
    return n;
}

/* A ZBVZeroBubble job traced: the file is a JSON array; on every stage's track each step's
 * actions are the schedule's list for its rank, in order and one after another, every wait
 * lies inside an action, and the ideal track has the same actions; the coordinator's three
 * rounds per step and the loader's fill of each microbatch are there; each step's record has
 * the bubble, measured and ideal. */
static void test_schedules_the_trace_holds_every_action_in_the_schedules_order(void **state)
{
    TU_NEED_BIN();
    static char out[1 << 16], text[1 << 20];
    static ev_t ev[MAX_EV];
    char j[32], args[1024], path[256];
    job_name(j, sizeof(j), "trace");
    snprintf(path, sizeof(path), "%s/%s.trace.json", tj_dir, j);
    snprintf(args, sizeof(args), BASE "--training.steps 3 --parallelism.pipeline_parallel_schedule ZBVZeroBubble "
             "--profiling.trace_file %s", path);
    int rc = tj_launch("", 180, j, args, out, sizeof(out));
    if (rc)
        TJ_FAIL_WITH(out, "status %d", rc);
    tu_read_file(path, text, sizeof(text));
    assert_true(!strncmp(text, "[\n", 2));
    assert_non_null(strstr(text + strlen(text) - 3, "\n]\n"));
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "python3 -c 'import json, sys; e = json.load(open(sys.argv[1])); print(len(e))' %s 2>&1",
             path);
    if (tu_run("command -v python3 >/dev/null", out, sizeof(out)) == 0) /* a JSON reader agrees */
        assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    long long pids[2] = {0, 0};
    int n = read_trace(path, ev, pids, 2);
    assert_true(pids[0] > 0 && pids[1] > 0);
    sched_t s;
    char err[256];
    assert_int_equal(sched_build(&s, 2, 2, 8, SCHED_ZBV, err, sizeof(err)), 0);
    int rounds = 0, fills = 0;
    for (int i = 0; i < n; i++) {
        rounds += !strcmp(ev[i].cat, "round");
        fills += !strcmp(ev[i].cat, "fill") && ev[i].step >= 1 && ev[i].step <= 3;
    }
    assert_int_equal(rounds, 3 * 3);
    assert_int_equal(fills, 3 * 8); /* the loader's fill of every microbatch of every step */
    for (int r = 0; r < 2; r++)
        for (int step = 1; step <= 3; step++) {
            int k = 0, ideal = 0;
            double end = 0;
            for (int i = 0; i < n; i++) {
                if (ev[i].pid != pids[r] || ev[i].step != step)
                    continue;
                if (ev[i].tid == 2) {
                    ideal++;
                    continue;
                }
                if (!strcmp(ev[i].cat, "wait")) { /* inside an action of the same stage */
                    int inside = 0;
                    for (int a = 0; a < n && !inside; a++)
                        inside = ev[a].pid == ev[i].pid && ev[a].tid == 1 && strcmp(ev[a].cat, "wait") &&
                                 strcmp(ev[a].cat, "round") && ev[a].ts <= ev[i].ts + 1 &&
                                 ev[i].ts + ev[i].dur <= ev[a].ts + ev[a].dur + 1;
                    if (!inside)
                        fail_msg("stage %d step %d: a wait at %.3f us lies in no action", r, step, ev[i].ts);
                    continue;
                }
                assert_true(k < s.n[r]);
                const sched_action_t *a = &s.a[r][k++];
                char want[32];
                snprintf(want, sizeof(want), "%c%d c%d", "FBW"[a->op], a->mb, a->chunk);
                if (strcmp(ev[i].name, want))
                    fail_msg("stage %d step %d action %d: %s, the schedule says %s", r, step, k - 1, ev[i].name, want);
                assert_true(ev[i].ts >= end - 1); /* one after another (1 us of rounding) */
                end = ev[i].ts + ev[i].dur;
            }
            assert_int_equal(k, s.n[r]);
            assert_int_equal(ideal, s.n[r]);
        }
    sched_free(&s);
    static tj_metrics_t mt;
    tj_parse_metrics(j, &mt);
    assert_int_equal(mt.n, 3);
    tj_read_metrics(j, text, sizeof(text));
    for (const char *p = text; (p = strstr(p, "\"bubble\": ")); p++) {
        double b = atof(p + 10), i = atof(strstr(p, "\"bubble_ideal\": ") + 16);
        assert_true(b >= 0 && b < 1 && i >= 0 && i < 1);
    }
    assert_int_equal(tj_count(text, "\"bubble_ideal\": "), 3);
    tj_assert_clean(j);
}

/* A coordinator killed -9 mid-run: the relaunch appends its run to the same trace file, which
 * still ends as a JSON array. */
static void test_schedules_a_relaunch_appends_to_the_trace(void **state)
{
    TU_NEED_BIN();
    static char text[1 << 21];
    char j[32], args[1024], path[256];
    job_name(j, sizeof(j), "trrelaunch");
    snprintf(path, sizeof(path), "%s/%s.trace.json", tj_dir, j);
    snprintf(args, sizeof(args), BASE "--training.steps 40 --job.restart_backoff_ms 0 --profiling.trace_file %s",
             path);
    pid_t pid = tj_launch_bg(j, args);
    assert_int_equal(tj_wait_step(j, 3, 60), 0);
    pid_t coord = tu_descendant_named(pid, "ctitan-coord");
    assert_true(coord > 0);
    kill(coord, SIGKILL);
    int rc = tu_reap(pid, 120, NULL);
    tj_read_out(j, text, sizeof(text));
    if (rc || !strstr(text, "\nrestart 1 "))
        TJ_FAIL_WITH(text, "status %d", rc);
    tu_read_file(path, text, sizeof(text));
    assert_true(!strncmp(text, "[\n", 2));
    assert_non_null(strstr(text + strlen(text) - 3, "\n]\n"));
    assert_true(tj_count(text, "\"name\": \"coordinator\"") == 2); /* both runs' tracks */
    assert_true(tj_count(text, "\"name\": \"update\", \"cat\": \"round\"") > 40); /* steps 1.. twice over */
    char cmd[512], out[256];
    snprintf(cmd, sizeof(cmd), "python3 -c 'import json, sys; json.load(open(sys.argv[1]))' %s 2>&1", path);
    if (tu_run("command -v python3 >/dev/null", out, sizeof(out)) == 0)
        assert_int_equal(tu_run(cmd, out, sizeof(out)), 0);
    tj_assert_clean(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedules_every_schedule_and_chunk_count_gives_1f1bs_losses),
        cmocka_unit_test(test_schedules_the_banner_names_the_stages_per_rank),
        cmocka_unit_test(test_schedules_a_stage_killed_mid_step_of_an_interleaved_schedule_is_replaced_bitwise),
        cmocka_unit_test(test_schedules_a_checkpoint_resumes_under_another_schedule_bitwise),
        cmocka_unit_test(test_schedules_the_trace_holds_every_action_in_the_schedules_order),
        cmocka_unit_test(test_schedules_a_relaunch_appends_to_the_trace),
    };
    return tu_run_group_tests(tests, setup, teardown);
}
