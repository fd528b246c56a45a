/* Pipeline schedules: the built lists against torchtitan's / Megatron's orders, the checker
 * against hand-made broken lists, and the simulator against makespans worked out by hand. */
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

#include "stages/job/schedule.h"

#define MAXR 8
#define MAXA 96
#define NKINDS 6 /* sched_kind_t values */

/* A schedule written by hand: per rank a string of tokens "F0", "B1", "W0", or "F0c1" for
 * microbatch 0 on chunk 1. Storage is inside the struct, so no sched_free. */
typedef struct {
    sched_t s;
    int n[MAXR];
    sched_action_t *rows[MAXR];
    sched_action_t acts[MAXR][MAXA];
} hand_t;

static void hand_init(hand_t *h, int pp, int vstages, int m, const char *const *lists)
{
    memset(h, 0, sizeof(*h));
    h->s = (sched_t){.kind = SCHED_GPIPE, .pp = pp, .vstages = vstages, .microbatches = m,
                     .n = h->n, .a = h->rows};
    for (int r = 0; r < pp; r++) {
        h->rows[r] = h->acts[r];
        const char *p = lists[r];
        while (*p) {
            while (*p == ' ') p++;
            if (!*p) break;
            sched_action_t *a = &h->acts[r][h->n[r]++];
            a->op = *p == 'F' ? SCHED_F : *p == 'B' ? SCHED_B : *p == 'W' ? SCHED_W : 9;
            char *end;
            a->mb = (int32_t)strtol(p + 1, &end, 10);
            p = end;
            if (*p == 'c') {
                a->chunk = (uint8_t)strtol(p + 1, &end, 10);
                p = end;
            }
        }
    }
}

/* "F0 F1 B0 W0 ..." (with chunks "F0c0 F0c1 ...") for one rank's list, to compare with the
 * expected order. */
static const char *list_str(const sched_t *s, int r, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < s->n[r] && off < len; i++) {
        off += (size_t)snprintf(buf + off, len - off, "%s%c%d", i ? " " : "",
                                "FBW"[s->a[r][i].op], s->a[r][i].mb);
        if (s->vstages > 1 && off < len) /* hand_init's "F0c1" */
            off += (size_t)snprintf(buf + off, len - off, "c%d", s->a[r][i].chunk);
    }
    return buf;
}

static void assert_lists(const sched_t *s, const char *const *expected)
{
    char buf[1024];
    for (int r = 0; r < s->pp; r++)
        assert_string_equal(list_str(s, r, buf, sizeof(buf)), expected[r]);
}

static void fill_times(double t[MAXR][3], double tf, double tb, double tw)
{
    for (int r = 0; r < MAXR; r++) {
        t[r][SCHED_F] = tf;
        t[r][SCHED_B] = tb;
        t[r][SCHED_W] = tw;
    }
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static void test_sched_kind_parse_accepts_torchtitan_names_in_any_case(void **state)
{
    sched_kind_t k = (sched_kind_t)-1;
    assert_int_equal(sched_kind_parse("gpipe", &k), 0);
    assert_int_equal(k, SCHED_GPIPE);
    assert_int_equal(sched_kind_parse("GPipe", &k), 0);
    assert_int_equal(k, SCHED_GPIPE);
    assert_int_equal(sched_kind_parse("1F1B", &k), 0);
    assert_int_equal(k, SCHED_1F1B);
    k = SCHED_GPIPE;
    assert_int_equal(sched_kind_parse("1f1b", &k), 0);
    assert_int_equal(k, SCHED_1F1B);
    assert_int_equal(sched_kind_parse("interleaved", &k), -EINVAL);
    assert_int_equal(sched_kind_parse("ZBV", &k), -EINVAL);
    assert_int_equal(sched_kind_parse("", &k), -EINVAL);
    assert_int_equal(k, SCHED_1F1B); /* untouched on failure */
    assert_string_equal(sched_kind_name(SCHED_GPIPE), "GPipe");
    assert_string_equal(sched_kind_name(SCHED_1F1B), "1F1B");
    /* torchtitan's (PyTorch's get_schedule_class) names of the kinds with virtual stages */
    const struct {
        const char *name, *other_case;
        sched_kind_t kind;
    } named[] = {
        {"Interleaved1F1B", "interleaved1f1b", SCHED_INTERLEAVED_1F1B},
        {"InterleavedZeroBubble", "INTERLEAVEDZEROBUBBLE", SCHED_INTERLEAVED_ZB},
        {"ZBVZeroBubble", "zbvzerobubble", SCHED_ZBV},
        {"DualPipeV", "dualpipev", SCHED_DUALPIPEV},
    };
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
        k = SCHED_GPIPE;
        assert_int_equal(sched_kind_parse(named[i].name, &k), 0);
        assert_int_equal(k, named[i].kind);
        k = SCHED_GPIPE;
        assert_int_equal(sched_kind_parse(named[i].other_case, &k), 0);
        assert_int_equal(k, named[i].kind);
        assert_string_equal(sched_kind_name(named[i].kind), named[i].name);
    }
    assert_string_equal(sched_kind_name((sched_kind_t)6), "?");
    assert_string_equal(sched_kind_name((sched_kind_t)-1), "?");
}

static void test_sched_build_rejects_bad_arguments_with_a_reason(void **state)
{
    sched_t s;
    char err[256];
    assert_int_equal(sched_build(&s, 0, 1, 4, SCHED_1F1B, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "pipeline degree"));
    assert_null(s.a);
    assert_null(s.n);
    assert_int_equal(sched_build(&s, 2, 1, 0, SCHED_GPIPE, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "microbatches"));
    assert_int_equal(sched_build(&s, 2, 1, -3, SCHED_GPIPE, err, sizeof(err)), -EINVAL);
    assert_int_equal(sched_build(&s, 2, 2, 4, SCHED_1F1B, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "1F1B needs exactly 1 virtual stage per rank, got 2");
    assert_int_equal(sched_build(&s, 2, 0, 4, SCHED_GPIPE, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "GPipe needs exactly 1 virtual stage per rank, got 0");
    assert_int_equal(sched_build(&s, 2, 1, 4, (sched_kind_t)7, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "unknown schedule kind 7"));
    assert_int_equal(sched_build(&s, 1 << 20, 1, 1 << 20, SCHED_GPIPE, err, sizeof(err)),
                     -EINVAL);
    assert_non_null(strstr(err, "too large"));
    /* err may be omitted */
    assert_int_equal(sched_build(&s, 0, 1, 1, SCHED_GPIPE, NULL, 0), -EINVAL);
}

static void test_sched_every_built_schedule_checks_with_one_f_b_w_per_microbatch(void **state)
{
    char err[512];
    for (int kind = SCHED_GPIPE; kind <= SCHED_1F1B; kind++) {
        for (int pp = 1; pp <= 8; pp++) {
            for (int m = 1; m <= 16; m++) {
                sched_t s;
                assert_int_equal(
                    sched_build(&s, pp, 1, m, (sched_kind_t)kind, err, sizeof(err)), 0);
                assert_int_equal(s.pp, pp);
                assert_int_equal(s.vstages, 1);
                assert_int_equal(s.microbatches, m);
                assert_int_equal(s.kind, kind);
                if (sched_check(&s, err, sizeof(err)))
                    fail_msg("%s pp %d m %d: %s", sched_kind_name(kind), pp, m, err);
                for (int r = 0; r < pp; r++) {
                    int pos[16][3], count[16][3] = {{0}}, next_b = 0;
                    assert_int_equal(s.n[r], 3 * m);
                    for (int i = 0; i < s.n[r]; i++) {
                        const sched_action_t *a = &s.a[r][i];
                        assert_int_equal(a->chunk, 0);
                        assert_int_equal(a->pad, 0);
                        assert_true(a->mb >= 0 && a->mb < m);
                        count[a->mb][a->op]++;
                        pos[a->mb][a->op] = i;
                        if (a->op == SCHED_B) {
                            assert_int_equal(a->mb, next_b++); /* backwards in microbatch order */
                            assert_true(i + 1 < s.n[r]);   /* and W right after its B */
                            assert_int_equal(s.a[r][i + 1].op, SCHED_W);
                            assert_int_equal(s.a[r][i + 1].mb, a->mb);
                        }
                    }
                    for (int mb = 0; mb < m; mb++) {
                        for (int op = 0; op < 3; op++) assert_int_equal(count[mb][op], 1);
                        assert_true(pos[mb][SCHED_F] < pos[mb][SCHED_B]);
                        assert_true(pos[mb][SCHED_B] < pos[mb][SCHED_W]);
                    }
                }
                sched_free(&s);
            }
        }
    }
}

static void test_sched_gpipe_runs_all_forwards_then_backwards_in_order(void **state)
{
    sched_t s;
    assert_int_equal(sched_build(&s, 2, 1, 3, SCHED_GPIPE, NULL, 0), 0);
    assert_lists(&s, (const char *const[]){"F0 F1 F2 B0 W0 B1 W1 B2 W2",
                                           "F0 F1 F2 B0 W0 B1 W1 B2 W2"});
    sched_free(&s);
}

static void test_sched_1f1b_follows_megatron_warmup_steady_cooldown(void **state)
{
    sched_t s;
    assert_int_equal(sched_build(&s, 4, 1, 6, SCHED_1F1B, NULL, 0), 0);
    assert_lists(&s, (const char *const[]){
                         "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5",
                         "F0 F1 F2 B0 W0 F3 B1 W1 F4 B2 W2 F5 B3 W3 B4 W4 B5 W5",
                         "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 F4 B3 W3 F5 B4 W4 B5 W5",
                         "F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3 F4 B4 W4 F5 B5 W5",
                     });
    sched_free(&s);
    /* fewer microbatches than stages: warmup is cut to M */
    assert_int_equal(sched_build(&s, 4, 1, 2, SCHED_1F1B, NULL, 0), 0);
    assert_lists(&s, (const char *const[]){"F0 F1 B0 W0 B1 W1", "F0 F1 B0 W0 B1 W1",
                                           "F0 F1 B0 W0 B1 W1", "F0 B0 W0 F1 B1 W1"});
    sched_free(&s);
}

static void test_sched_1f1b_keeps_at_most_pp_minus_rank_microbatches_in_flight(void **state)
{
    for (int pp = 1; pp <= 8; pp++) {
        for (int m = 1; m <= 16; m++) {
            sched_t s1, sg;
            assert_int_equal(sched_build(&s1, pp, 1, m, SCHED_1F1B, NULL, 0), 0);
            assert_int_equal(sched_build(&sg, pp, 1, m, SCHED_GPIPE, NULL, 0), 0);
            for (int r = 0; r < pp; r++) {
                int want = pp - r < m ? pp - r : m;
                assert_int_equal(sched_peak_in_flight(&s1, r), want);
                assert_int_equal(sched_peak_in_flight(&sg, r), m);
            }
            assert_int_equal(sched_peak_in_flight(&s1, -1), -EINVAL);
            assert_int_equal(sched_peak_in_flight(&s1, pp), -EINVAL);
            sched_free(&s1);
            sched_free(&sg);
        }
    }
}

static void test_sched_check_rejects_backward_before_forward_on_a_rank(void **state)
{
    hand_t h;
    char err[256];
    hand_init(&h, 1, 1, 2, (const char *const[]){"F0 B1 W1 F1 B0 W0"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "rank 0: B(mb 1) at action 1 comes before F(mb 1) at action 3");
    hand_init(&h, 1, 1, 1, (const char *const[]){"F0 W0 B0"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "rank 0: W(mb 0) at action 1 comes before B(mb 0) at action 2");
    /* the same lists in the right order pass (backwards may run in any microbatch order, weight
     * gradients may not: test_sched_check_requires_ws_and_the_losses_in_microbatch_order) */
    hand_init(&h, 1, 1, 2, (const char *const[]){"F0 F1 B1 B0 W0 W1"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), 0);
}

static void test_sched_check_reports_which_ranks_deadlock_and_on_what(void **state)
{
    hand_t h;
    char err[512];
    /* rank 0 waits in B(0) for rank 1's B(0); rank 1 first wants F(1), which rank 0 only
     * sends after its B(0): a cycle, though each list is fine on its own. */
    hand_init(&h, 2, 1, 2, (const char *const[]){"F0 B0 W0 F1 B1 W1", "F1 F0 B0 W0 B1 W1"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "deadlock after 1 of 12 actions:"
                             " rank 0 at action 1 B(mb 0) waits for B(mb 0) on rank 1;"
                             " rank 1 at action 0 F(mb 1) waits for F(mb 1) on rank 0");
    /* a short err buffer is truncated, not overrun */
    char small[20];
    memset(small, 'x', sizeof(small));
    assert_int_equal(sched_check(&h.s, small, sizeof(small)), -EINVAL);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    /* backwards out of microbatch order on both ranks is not a deadlock (their Ws stay in
     * order: the ordering rule) */
    hand_init(&h, 2, 1, 2, (const char *const[]){"F0 F1 B1 B0 W0 W1", "F0 F1 B1 B0 W0 W1"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), 0);
    /* nor is reversing only the last rank's: rank 0 waits longer, but there is no cycle */
    hand_init(&h, 2, 1, 2, (const char *const[]){"F0 F1 B0 W0 B1 W1", "F0 F1 B1 B0 W0 W1"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), 0);
}

static void test_sched_check_rejects_missing_and_duplicated_actions(void **state)
{
    hand_t h;
    char err[256];
    hand_init(&h, 2, 1, 2, (const char *const[]){"F0 F1 B0 W0 B1 W1", "F0 F1 B0 W0 B1"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "rank 1: W(mb 1) is missing");
    hand_init(&h, 2, 1, 2, (const char *const[]){"F0 F1 B0 W0 B1 W1", "F0 F0 F1 B0 W0 B1 W1"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "rank 1: F(mb 0) appears twice (actions 0 and 1)");
    hand_init(&h, 1, 1, 1, (const char *const[]){""});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "rank 0: F(mb 0) is missing");
}

static void test_sched_check_rejects_fields_out_of_range(void **state)
{
    hand_t h;
    char err[256];
    hand_init(&h, 1, 1, 2, (const char *const[]){"F0 F2 B0 W0"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "rank 0 action 1: microbatch 2 out of range [0, 2)");
    hand_init(&h, 1, 1, 1, (const char *const[]){"F0 B0 X0"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "rank 0 action 2: unknown op 9");
    hand_init(&h, 1, 1, 1, (const char *const[]){"F0c1 B0 W0"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "rank 0 action 0: chunk 1 out of range [0, 1)");
    h.s.microbatches = 0;
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "bad schedule shape"));
    assert_int_equal(sched_check(NULL, err, sizeof(err)), -EINVAL);
}

static void test_sched_check_and_simulate_follow_virtual_stage_dependencies(void **state)
{
    /* pp 2 x 2 chunks: v0 = rank 0 c0, v1 = rank 1 c0, v2 = rank 0 c1, v3 = rank 1 c1 */
    hand_t h;
    char err[256];
    hand_init(&h, 2, 2, 1, (const char *const[]){"F0c0 F0c1 B0c1 W0c1 B0c0 W0c0",
                                                 "F0c0 F0c1 B0c1 W0c1 B0c0 W0c0"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), 0);
    double t[MAXR][3];
    fill_times(t, 1, 1, 1);
    /* the chain v0 v1 v2 v3 forward, v3 v2 v1 v0 backward, each W off the chain: 4 + 4 + 1 */
    double st0[6], st1[6], *start[2] = {st0, st1};
    assert_true(sched_simulate(&h.s, (const double(*)[3])t, 0, start) == 9);
    const double want0[6] = {0, 2, 5, 6, 7, 8}, want1[6] = {1, 3, 4, 5, 6, 7};
    for (int i = 0; i < 6; i++) {
        assert_true(st0[i] == want0[i]);
        assert_true(st1[i] == want1[i]);
    }
    /* rank 0 forwarding chunk 1 first needs v1, which needs rank 0's own chunk 0 */
    hand_init(&h, 2, 2, 1, (const char *const[]){"F0c1 F0c0 B0c1 W0c1 B0c0 W0c0",
                                                 "F0c0 F0c1 B0c1 W0c1 B0c0 W0c0"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "deadlock after 0 of 12 actions:"
                             " rank 0 at action 0 F(c1, mb 0) waits for F(c0, mb 0) on rank 1;"
                             " rank 1 at action 0 F(c0, mb 0) waits for F(c0, mb 0) on rank 0");
    assert_true(sched_simulate(&h.s, (const double(*)[3])t, 0, NULL) < 0);
}

static void test_sched_simulate_uniform_makespan_is_m_plus_pp_minus_one_slots(void **state)
{
    /* t_f = 1, t_b + t_w = 2 with W = 0: the textbook (M + pp - 1)(t_f + t_b), the same for
     * GPipe and 1F1B (1F1B saves memory, not time). */
    double t[MAXR][3];
    fill_times(t, 1, 2, 0);
    for (int kind = SCHED_GPIPE; kind <= SCHED_1F1B; kind++) {
        for (int pp = 1; pp <= 8; pp++) {
            for (int m = 1; m <= 16; m++) {
                sched_t s;
                assert_int_equal(sched_build(&s, pp, 1, m, (sched_kind_t)kind, NULL, 0), 0);
                double ms = sched_simulate(&s, (const double(*)[3])t, 0, NULL);
                if (ms != (m + pp - 1) * 3.0)
                    fail_msg("%s pp %d m %d: makespan %g, want %g", sched_kind_name(kind), pp, m,
                             ms, (m + pp - 1) * 3.0);
                sched_free(&s);
            }
        }
    }
}

static void test_sched_simulate_gpipe_keeps_w_off_the_cross_rank_chain(void **state)
{
    /* Only B is handed upstream, so each earlier rank lags by t_b, not t_b + t_w:
     * (pp - 1 + M) t_f for the forwards, M (t_b + t_w) on rank 0, (pp - 1) t_b of lag. */
    double t[MAXR][3];
    fill_times(t, 1, 1, 1);
    for (int pp = 1; pp <= 8; pp++) {
        for (int m = 1; m <= 16; m++) {
            sched_t s;
            assert_int_equal(sched_build(&s, pp, 1, m, SCHED_GPIPE, NULL, 0), 0);
            double want = (pp - 1 + m) * 1.0 + m * 2.0 + (pp - 1) * 1.0;
            assert_true(sched_simulate(&s, (const double(*)[3])t, 0, NULL) == want);
            sched_free(&s);
        }
    }
}

static void test_sched_simulate_single_rank_runs_back_to_back(void **state)
{
    double t[MAXR][3];
    fill_times(t, 0.25, 0.5, 0.125);
    for (int kind = SCHED_GPIPE; kind <= SCHED_1F1B; kind++) {
        for (int m = 1; m <= 16; m++) {
            sched_t s;
            assert_int_equal(sched_build(&s, 1, 1, m, (sched_kind_t)kind, NULL, 0), 0);
            /* comm never applies: nothing leaves the rank */
            assert_true(sched_simulate(&s, (const double(*)[3])t, 5.0, NULL) == m * 0.875);
            sched_free(&s);
        }
    }
}

static void test_sched_simulate_adds_comm_to_every_cross_rank_hand_off(void **state)
{
    /* pp 2, M 1, unit times, comm 0.5: rank 0 F [0,1]; rank 1 F [1.5,2.5] B [2.5,3.5]
     * W [3.5,4.5]; rank 0 B [4,5] W [5,6]. */
    sched_t s;
    double t[MAXR][3], st0[3], st1[3], *start[2] = {st0, st1};
    fill_times(t, 1, 1, 1);
    assert_int_equal(sched_build(&s, 2, 1, 1, SCHED_GPIPE, NULL, 0), 0);
    assert_true(sched_simulate(&s, (const double(*)[3])t, 0, NULL) == 5);
    assert_true(sched_simulate(&s, (const double(*)[3])t, 0.5, start) == 6);
    assert_true(st0[0] == 0 && st0[1] == 4 && st0[2] == 5);
    assert_true(st1[0] == 1.5 && st1[1] == 2.5 && st1[2] == 3.5);
    sched_free(&s);
    /* per-rank times (a slow last rank), 1F1B pp 2 M 2, comm 0.25 */
    t[1][SCHED_F] = 2;
    t[1][SCHED_B] = 3;
    double s0[6], s1[6], *start2[2] = {s0, s1};
    assert_int_equal(sched_build(&s, 2, 1, 2, SCHED_1F1B, NULL, 0), 0);
    double ms = sched_simulate(&s, (const double(*)[3])t, 0.25, start2);
    /* rank 1: F0 1.25-3.25, B0 3.25-6.25, W0 6.25-7.25, F1 7.25-9.25, B1 9.25-12.25, W1 -13.25
     * rank 0: F0 0-1, F1 1-2, B0 6.5-7.5, W0 7.5-8.5, B1 12.5-13.5, W1 13.5-14.5 */
    const double w0[6] = {0, 1, 6.5, 7.5, 12.5, 13.5};
    const double w1[6] = {1.25, 3.25, 6.25, 7.25, 9.25, 12.25};
    for (int i = 0; i < 6; i++) {
        assert_true(s0[i] == w0[i]);
        assert_true(s1[i] == w1[i]);
    }
    assert_true(ms == 14.5);
    sched_free(&s);
}

static void test_sched_simulate_starts_each_action_as_soon_as_allowed(void **state)
{
    /* Random times: every action starts exactly when both the rank is free and its
     * dependencies (plus comm when they are on another rank) are done, never earlier, never
     * later; the makespan is the last end. */
    uint64_t seed = 12345;
    for (int kind = SCHED_GPIPE; kind <= SCHED_1F1B; kind++) {
        for (int pp = 1; pp <= 6; pp++) {
            for (int m = 1; m <= 9; m += 2) {
                double t[MAXR][3], comm = (double)(rng_next(&seed) % 4) / 8;
                for (int r = 0; r < MAXR; r++)
                    for (int op = 0; op < 3; op++) t[r][op] = 0.125 * (1 + rng_next(&seed) % 16);
                sched_t s;
                assert_int_equal(sched_build(&s, pp, 1, m, (sched_kind_t)kind, NULL, 0), 0);
                double st[MAXR][48], *start[MAXR], end[MAXR][16][3];
                for (int r = 0; r < pp; r++) start[r] = st[r];
                double ms = sched_simulate(&s, (const double(*)[3])t, comm, start);
                double last = 0;
                for (int r = 0; r < pp; r++)
                    for (int i = 0; i < s.n[r]; i++) {
                        const sched_action_t *a = &s.a[r][i];
                        end[r][a->mb][a->op] = st[r][i] + t[r][a->op];
                        if (end[r][a->mb][a->op] > last) last = end[r][a->mb][a->op];
                    }
                assert_true(ms == last);
                for (int r = 0; r < pp; r++) {
                    for (int i = 0; i < s.n[r]; i++) {
                        const sched_action_t *a = &s.a[r][i];
                        double earliest = i ? st[r][i - 1] + t[r][s.a[r][i - 1].op] : 0;
                        double dep = 0;
                        if (a->op == SCHED_F && r > 0) dep = end[r - 1][a->mb][SCHED_F] + comm;
                        if (a->op == SCHED_B && r < pp - 1) dep = end[r + 1][a->mb][SCHED_B] + comm;
                        if (a->op == SCHED_B && r == pp - 1) dep = end[r][a->mb][SCHED_F];
                        if (a->op == SCHED_W) dep = end[r][a->mb][SCHED_B];
                        if (dep > earliest) earliest = dep;
                        if (st[r][i] != earliest)
                            fail_msg("%s pp %d m %d rank %d action %d starts at %g, not %g",
                                     sched_kind_name(kind), pp, m, r, i, st[r][i], earliest);
                    }
                }
                sched_free(&s);
            }
        }
    }
}

static void test_sched_simulate_refuses_lists_that_fail_the_check(void **state)
{
    hand_t h;
    double t[MAXR][3];
    fill_times(t, 1, 1, 1);
    hand_init(&h, 2, 1, 2, (const char *const[]){"F0 B0 W0 F1 B1 W1", "F1 F0 B0 W0 B1 W1"});
    assert_true(sched_simulate(&h.s, (const double(*)[3])t, 0, NULL) == -EINVAL);
    hand_init(&h, 1, 1, 1, (const char *const[]){"F0 B0 W0 W0"});
    assert_true(sched_simulate(&h.s, (const double(*)[3])t, 0, NULL) == -EINVAL);
}

static char *render(const sched_t *s, const double (*t)[3], int width)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    sched_render(s, t, width, f);
    fclose(f);
    return buf;
}

static void test_sched_render_draws_one_row_per_rank_across_the_makespan(void **state)
{
    sched_t s;
    double t[MAXR][3];
    fill_times(t, 1, 1, 1);
    assert_int_equal(sched_build(&s, 2, 1, 2, SCHED_GPIPE, NULL, 0), 0);
    /* makespan 8, one column per second */
    char *out = render(&s, (const double(*)[3])t, 8);
    assert_string_equal(out, "01..awbw\n"
                             ".01awbw.\n");
    free(out);
    out = render(&s, (const double(*)[3])t, 16);
    assert_string_equal(out, "0011....aawwbbww\n"
                             "..0011aawwbbww..\n");
    free(out);
    sched_free(&s);

    /* 1F1B pp 4 M 8 at an odd width: pp rows of exactly width characters */
    assert_int_equal(sched_build(&s, 4, 1, 8, SCHED_1F1B, NULL, 0), 0);
    out = render(&s, (const double(*)[3])t, 37);
    int rows = 0;
    for (char *line = out, *nl; (nl = strchr(line, '\n')); line = nl + 1, rows++)
        assert_int_equal(nl - line, 37);
    assert_int_equal(rows, 4);
    assert_int_equal(out[0], '0'); /* rank 0 starts at once, the last rank idles first */
    assert_int_equal(out[3 * 38], '.');
    free(out);
    sched_free(&s);

    /* a broken list is reported, not drawn */
    hand_t h;
    hand_init(&h, 1, 1, 1, (const char *const[]){"B0 F0 W0"});
    out = render(&h.s, (const double(*)[3])t, 10);
    assert_non_null(strstr(out, "cannot be drawn"));
    free(out);
}

static void test_sched_free_clears_the_schedule_and_may_repeat(void **state)
{
    sched_t s;
    assert_int_equal(sched_build(&s, 3, 1, 4, SCHED_1F1B, NULL, 0), 0);
    sched_free(&s);
    assert_null(s.a);
    assert_null(s.n);
    assert_int_equal(s.pp, 0);
    sched_free(&s);
    sched_free(NULL);
}

/* ---- the kinds with virtual stages ---------------------------------------------------------- */

/* The rules of schedule.h written again, independently of sched_kind_check: whether (kind, pp,
 * vstages, m) builds. */
static int should_build(int kind, int pp, int v, int m)
{
    int rounds = m / pp > 1 ? m / pp : 1;
    switch (kind) {
    case SCHED_GPIPE:
    case SCHED_1F1B: return v == 1;
    case SCHED_INTERLEAVED_1F1B: return v >= 2 && m % rounds == 0;
    case SCHED_INTERLEAVED_ZB: return v >= 1 && m % rounds == 0;
    case SCHED_ZBV: return v == 2;
    case SCHED_DUALPIPEV: return v == 2 && m >= 2 * pp;
    }
    return 0;
}

/* Calls fn for every (kind, pp 1..4, vstages 1..3, m 1..16) that builds, with the schedule. */
static void for_each_built(void (*fn)(const sched_t *s, void *arg), void *arg)
{
    for (int kind = 0; kind < NKINDS; kind++)
        for (int pp = 1; pp <= 4; pp++)
            for (int v = 1; v <= 3; v++)
                for (int m = 1; m <= 16; m++) {
                    if (!should_build(kind, pp, v, m)) continue;
                    sched_t s;
                    char err[256];
                    if (sched_build(&s, pp, v, m, (sched_kind_t)kind, err, sizeof(err)))
                        fail_msg("%s pp %d v %d m %d: %s", sched_kind_name(kind), pp, v, m, err);
                    fn(&s, arg);
                    sched_free(&s);
                }
}

static void test_sched_kinds_say_their_placement_and_virtual_stages(void **state)
{
    const struct {
        sched_kind_t kind;
        int placement, min, max, dflt;
    } want[NKINDS] = {
        {SCHED_GPIPE, SCHED_LOOP, 1, 1, 1},
        {SCHED_1F1B, SCHED_LOOP, 1, 1, 1},
        {SCHED_INTERLEAVED_1F1B, SCHED_LOOP, 2, SCHED_MAX_VSTAGES, 2},
        {SCHED_INTERLEAVED_ZB, SCHED_LOOP, 1, SCHED_MAX_VSTAGES, 2},
        {SCHED_ZBV, SCHED_V, 2, 2, 2},
        {SCHED_DUALPIPEV, SCHED_V, 2, 2, 2},
    };
    for (int i = 0; i < NKINDS; i++) {
        int lo = -1, hi = -1, d = -1;
        assert_int_equal(sched_kind_placement(want[i].kind), want[i].placement);
        assert_int_equal(sched_kind_vstages(want[i].kind, &lo, &hi, &d), 0);
        assert_int_equal(lo, want[i].min);
        assert_int_equal(hi, want[i].max);
        assert_int_equal(d, want[i].dflt);
        assert_int_equal(sched_kind_vstages(want[i].kind, NULL, NULL, NULL), 0);
    }
    assert_int_equal(sched_kind_placement((sched_kind_t)NKINDS), -EINVAL);
    assert_int_equal(sched_kind_vstages((sched_kind_t)NKINDS, NULL, NULL, NULL), -EINVAL);
    assert_int_equal(sched_kind_vstages((sched_kind_t)-1, NULL, NULL, NULL), -EINVAL);
}

static void test_sched_build_refuses_each_kinds_combinations_naming_the_rule(void **state)
{
    sched_t s;
    char err[256];
    const struct {
        sched_kind_t kind;
        int pp, v, m;
        const char *why;
    } refused[] = {
        {SCHED_INTERLEAVED_1F1B, 2, 1, 4,
         "Interleaved1F1B needs 2 to 256 virtual stages per rank, got 1 (with 1 it is 1F1B)"},
        {SCHED_INTERLEAVED_1F1B, 2, 257, 4,
         "Interleaved1F1B needs 2 to 256 virtual stages per rank, got 257"},
        {SCHED_INTERLEAVED_1F1B, 4, 2, 9,
         "Interleaved1F1B: microbatches (9) must be a multiple of the number of rounds, 2 (= "
         "microbatches / pipeline degree 4, rounded down)"},
        {SCHED_INTERLEAVED_ZB, 2, 0, 4,
         "InterleavedZeroBubble needs 1 to 256 virtual stages per rank, got 0"},
        {SCHED_INTERLEAVED_ZB, 2, 1, 5,
         "InterleavedZeroBubble: microbatches (5) must be a multiple of the number of rounds, 2 (= "
         "microbatches / pipeline degree 2, rounded down)"},
        {SCHED_ZBV, 2, 3, 4, "ZBVZeroBubble needs exactly 2 virtual stages per rank, got 3"},
        {SCHED_ZBV, 0, 2, 4, "ZBVZeroBubble: pipeline degree must be >= 1, got 0"},
        {SCHED_DUALPIPEV, 2, 1, 4, "DualPipeV needs exactly 2 virtual stages per rank, got 1"},
        {SCHED_DUALPIPEV, 2, 2, 3,
         "DualPipeV: microbatches (3) must be at least the virtual stages, 2 x the pipeline degree "
         "(2) = 4"},
        {SCHED_DUALPIPEV, 2, 2, 0, "DualPipeV: microbatches must be >= 1, got 0"},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        int pp = refused[i].pp, v = refused[i].v, m = refused[i].m;
        memset(&s, 0xff, sizeof(s));
        assert_int_equal(sched_build(&s, pp, v, m, refused[i].kind, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, refused[i].why);
        assert_null(s.a);
        assert_int_equal(sched_kind_check(refused[i].kind, pp, v, m, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, refused[i].why);
        assert_int_equal(sched_kind_check(refused[i].kind, pp, v, m, NULL, 0), -EINVAL);
    }
    /* PyTorch's flexible rounds: fewer than 2 pp microbatches always pass, more in whole rounds */
    const int accepted[][2] = {{2, 3}, {4, 1}, {4, 6}, {4, 7}, {4, 10}, {3, 12}};
    for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
        for (int kind = SCHED_INTERLEAVED_1F1B; kind <= SCHED_INTERLEAVED_ZB; kind++) {
            assert_int_equal(sched_build(&s, accepted[i][0], 2, accepted[i][1], (sched_kind_t)kind,
                                         err, sizeof(err)),
                             0);
            sched_free(&s);
        }
    }
}

/* Over the grid every combination either builds a schedule that passes sched_check or is refused
 * with the same reason by sched_kind_check, and exactly those the rules allow build. */
static void test_sched_every_kind_builds_checked_lists_or_refuses_over_the_grid(void **state)
{
    char err[256], err2[256], cerr[512];
    int built = 0;
    for (int kind = 0; kind < NKINDS; kind++)
        for (int pp = 1; pp <= 4; pp++)
            for (int v = 0; v <= 3; v++)
                for (int m = 1; m <= 16; m++) {
                    sched_t s;
                    int rc = sched_build(&s, pp, v, m, (sched_kind_t)kind, err, sizeof(err));
                    int rc2 = sched_kind_check((sched_kind_t)kind, pp, v, m, err2, sizeof(err2));
                    assert_int_equal(rc, rc2);
                    if (rc != (should_build(kind, pp, v, m) ? 0 : -EINVAL))
                        fail_msg("%s pp %d v %d m %d: sched_build says %d (%s)",
                                 sched_kind_name(kind), pp, v, m, rc, rc ? err : "");
                    if (rc) {
                        assert_string_equal(err, err2);
                        assert_non_null(strstr(err, sched_kind_name(kind)));
                        continue;
                    }
                    built++;
                    assert_int_equal(s.kind, kind);
                    assert_int_equal(s.placement, sched_kind_placement((sched_kind_t)kind));
                    assert_int_equal(s.pp, pp);
                    assert_int_equal(s.vstages, v);
                    assert_int_equal(s.microbatches, m);
                    if (sched_check(&s, cerr, sizeof(cerr)))
                        fail_msg("%s pp %d v %d m %d: %s", sched_kind_name(kind), pp, v, m, cerr);
                    for (int r = 0; r < pp; r++) {
                        assert_int_equal(s.n[r], 3 * v * m);
                        for (int i = 0; i < s.n[r]; i++) assert_int_equal(s.a[r][i].pad, 0);
                    }
                    sched_free(&s);
                }
    assert_int_equal(built, 480); /* should_build's count: the grid is not mostly refusals */
}

static void check_order(const sched_t *s, void *arg)
{
    const char *name = sched_kind_name(s->kind);
    int last = s->pp * s->vstages - 1, pp = s->pp, v = s->vstages, m = s->microbatches;
    for (int r = 0; r < s->pp; r++) {
        int next_w[3] = {0, 0, 0}, next_f = 0;
        for (int i = 0; i < s->n[r]; i++) {
            const sched_action_t *a = &s->a[r][i];
            if (a->op == SCHED_W && a->mb != next_w[a->chunk]++)
                fail_msg("%s pp %d v %d m %d rank %d: W(c%d, mb %d) out of microbatch order", name,
                         pp, v, m, r, a->chunk, a->mb);
            if (a->op == SCHED_F && sched_vstage(s, r, a->chunk) == last && a->mb != next_f++)
                fail_msg("%s pp %d v %d m %d: the last virtual stage's F(mb %d) out of order", name,
                         pp, v, m, a->mb);
        }
    }
    (*(int *)arg)++;
}

/* The ordering rule, seen directly in the lists rather than through sched_check. */
static void test_sched_every_kind_runs_ws_and_the_last_stages_fs_in_microbatch_order(void **state)
{
    int n = 0;
    for_each_built(check_order, &n);
    assert_int_equal(n, 480);
}

static void test_sched_check_requires_ws_and_the_losses_in_microbatch_order(void **state)
{
    hand_t h;
    char err[512];
    hand_init(&h, 1, 1, 2, (const char *const[]){"F0 F1 B1 W1 B0 W0"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "rank 0: W(mb 1) at action 3 comes before W(mb 0) at action 5: a "
                             "chunk's W actions must run in microbatch order (its weight gradients "
                             "are summed in that order)");
    /* the last virtual stage is rank 1's; rank 0 may forward in any order */
    hand_init(&h, 2, 1, 2, (const char *const[]){"F1 F0 B0 B1 W0 W1", "F0 F1 B0 B1 W0 W1"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), 0);
    hand_init(&h, 2, 1, 2, (const char *const[]){"F0 F1 B0 B1 W0 W1", "F1 F0 B0 B1 W0 W1"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "rank 1: F(mb 1) at action 0 comes before F(mb 0) at action 1: the "
                             "last virtual stage's F actions must run in microbatch order (the "
                             "loss is summed in that order)");
    /* per chunk: chunk 0's Ws may run between chunk 1's, each in its own order */
    hand_init(&h, 1, 2, 2,
              (const char *const[]){"F0c0 F1c0 F0c1 F1c1 B0c1 B1c1 B0c0 W0c1 B1c0 W0c0 W1c0 W1c1"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), 0);
    hand_init(&h, 1, 2, 2,
              (const char *const[]){"F0c0 F1c0 F0c1 F1c1 B0c1 B1c1 B0c0 B1c0 W1c0 W0c0 W0c1 W1c1"});
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_non_null(
        strstr(err, "rank 0: W(c0, mb 1) at action 8 comes before W(c0, mb 0) at action 9"));
    /* under the V placement the last virtual stage is rank 0's chunk 1 */
    hand_init(&h, 2, 2, 2,
              (const char *const[]){"F0c0 F1c0 F1c1 F0c1 B0c1 B1c1 W0c1 W1c1 B0c0 B1c0 W0c0 W1c0",
                                    "F0c0 F1c0 F0c1 F1c1 B0c1 B1c1 B0c0 B1c0 W0c1 W1c1 W0c0 W1c0"});
    h.s.placement = SCHED_V;
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(
        err, "rank 0: F(c1, mb 1) at action 2 comes before F(c1, mb 0) at action 3: the last"));
}

static void test_sched_placement_maps_virtual_stages_both_ways(void **state)
{
    sched_t s;
    for (int kind = SCHED_INTERLEAVED_1F1B; kind <= SCHED_DUALPIPEV; kind++) {
        int pp = 3, v = 2;
        assert_int_equal(sched_build(&s, pp, v, 6, (sched_kind_t)kind, NULL, 0), 0);
        int seen[6] = {0};
        for (int r = 0; r < pp; r++)
            for (int c = 0; c < v; c++) {
                int k = sched_vstage(&s, r, c), back = -1;
                int want = s.placement == SCHED_LOOP ? c * pp + r : c ? 2 * pp - 1 - r : r;
                assert_int_equal(k, want);
                assert_int_equal(sched_rank_of(&s, k, &back), r);
                assert_int_equal(back, c);
                seen[k]++;
            }
        for (int k = 0; k < pp * v; k++) assert_int_equal(seen[k], 1);
        assert_int_equal(sched_rank_of(&s, 0, NULL), 0);
        assert_int_equal(sched_vstage(&s, -1, 0), -EINVAL);
        assert_int_equal(sched_vstage(&s, pp, 0), -EINVAL);
        assert_int_equal(sched_vstage(&s, 0, v), -EINVAL);
        assert_int_equal(sched_rank_of(&s, -1, NULL), -EINVAL);
        assert_int_equal(sched_rank_of(&s, pp * v, NULL), -EINVAL);
        sched_free(&s);
    }
    assert_int_equal(sched_vstage(NULL, 0, 0), -EINVAL);
    assert_int_equal(sched_rank_of(NULL, 0, NULL), -EINVAL);
    /* V: rank 0 holds the first and the last virtual stage; the middle hand-off is inside rank
     * pp - 1 */
    assert_int_equal(sched_build(&s, 4, 2, 8, SCHED_ZBV, NULL, 0), 0);
    assert_int_equal(sched_vstage(&s, 0, 1), 7);
    assert_int_equal(sched_vstage(&s, 3, 0), 3);
    assert_int_equal(sched_vstage(&s, 3, 1), 4);
    sched_free(&s);
}

/* Orders worked out from PyTorch's schedules.py (ScheduleInterleaved1F1B,
 * ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV), with its I as B, its
 * full backward as B W, and its no-ops dropped. */
static void test_sched_new_kinds_follow_pytorchs_orders(void **state)
{
    sched_t s;
    assert_int_equal(sched_build(&s, 2, 2, 4, SCHED_INTERLEAVED_1F1B, NULL, 0), 0);
    assert_lists(&s, (const char *const[]){
                         "F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 W0c1 F3c0 B1c1 W1c1 F2c1 B0c0 W0c0 "
                         "F3c1 B1c0 W1c0 B2c1 W2c1 B3c1 W3c1 B2c0 W2c0 B3c0 W3c0",
                         "F0c0 F1c0 F0c1 B0c1 W0c1 F1c1 B1c1 W1c1 F2c0 B0c0 W0c0 F3c0 B1c0 "
                         "W1c0 F2c1 B2c1 W2c1 F3c1 B3c1 W3c1 B2c0 W2c0 B3c0 W3c0",
                     });
    sched_free(&s);
    /* ZB-H1: rank r holds its Ws back r backwards */
    assert_int_equal(sched_build(&s, 3, 1, 4, SCHED_INTERLEAVED_ZB, NULL, 0), 0);
    assert_lists(&s, (const char *const[]){
                         "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3",
                         "F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3",
                         "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3",
                     });
    sched_free(&s);
    assert_int_equal(sched_build(&s, 2, 2, 4, SCHED_ZBV, NULL, 0), 0);
    assert_lists(&s, (const char *const[]){
                         "F0c0 F1c0 F2c0 F0c1 B0c1 W0c1 F1c1 B1c1 W1c1 F3c0 B0c0 W0c0 F2c1 "
                         "B2c1 W2c1 B1c0 W1c0 F3c1 B3c1 W3c1 B2c0 W2c0 B3c0 W3c0",
                         "F0c0 F0c1 F1c0 F1c1 B0c1 W0c1 F2c0 B0c0 W0c0 F2c1 B1c1 W1c1 F3c0 "
                         "B1c0 W1c0 F3c1 B2c1 W2c1 B2c0 B3c1 B3c0 W2c0 W3c1 W3c0",
                     });
    sched_free(&s);
    /* fewer microbatches than fill the V: the full order with the missing ones dropped */
    assert_int_equal(sched_build(&s, 2, 2, 2, SCHED_ZBV, NULL, 0), 0);
    assert_lists(&s, (const char *const[]){
                         "F0c0 F1c0 F0c1 B0c1 W0c1 F1c1 B1c1 W1c1 B0c0 W0c0 B1c0 W1c0",
                         "F0c0 F0c1 F1c0 F1c1 B0c1 W0c1 B0c0 W0c0 B1c1 W1c1 B1c0 W1c0",
                     });
    sched_free(&s);
    assert_int_equal(sched_build(&s, 2, 2, 4, SCHED_DUALPIPEV, NULL, 0), 0);
    assert_lists(&s, (const char *const[]){
                         "F0c0 F1c0 F2c0 F0c1 B0c1 W0c1 F1c1 F3c0 B1c1 W1c1 F2c1 B0c0 W0c0 "
                         "B2c1 W2c1 F3c1 B1c0 W1c0 B3c1 W3c1 B2c0 W2c0 B3c0 W3c0",
                         "F0c0 F0c1 F1c0 F1c1 F2c0 B0c1 W0c1 F2c1 B0c0 W0c0 F3c0 B1c1 W1c1 "
                         "F3c1 B1c0 W1c0 B2c1 W2c1 B2c0 W2c0 B3c1 B3c0 W3c1 W3c0",
                     });
    sched_free(&s);
}

/* The activation bounds each kind promises, per rank: in flight (F to B) and kept (F to W). */
static void check_peaks(const sched_t *s, void *arg)
{
    int pp = s->pp, v = s->vstages, m = s->microbatches, vm = v * m;
    int rounds = m / pp > 1 ? m / pp : 1, per = m / rounds;
    for (int r = 0; r < pp; r++) {
        int in_flight = sched_peak_in_flight(s, r), acts = sched_peak_acts(s, r, -1), sum = 0;
        for (int c = 0; c < v; c++) {
            int a = sched_peak_acts(s, r, c);
            assert_true(a >= 1 && a <= m);
            assert_true(a <= acts);
            sum += a;
        }
        assert_true(acts <= sum);
        assert_true(in_flight <= acts);
        /* held between B and W (a W right after its B not counted): none where every W
         * follows its B, and never more than the activations kept */
        int held = sched_peak_held_w(s, r, -1);
        assert_true(held >= 0 && held <= acts);
        if (s->kind == SCHED_GPIPE || s->kind == SCHED_1F1B || s->kind == SCHED_INTERLEAVED_1F1B)
            assert_int_equal(held, 0);
        for (int c = 0; c < v; c++)
            assert_true(sched_peak_held_w(s, r, c) <= sched_peak_acts(s, r, c));
        int want_if = -1, want_acts = -1, w;
        switch (s->kind) {
        case SCHED_GPIPE: want_if = want_acts = m; break;
        case SCHED_1F1B: want_if = want_acts = pp - r < m ? pp - r : m; break;
        case SCHED_INTERLEAVED_1F1B:
            /* Megatron's warmup: (v - 1) rounds and two per hop to the last rank, then one more */
            w = (v - 1) * per + 2 * (pp - 1 - r);
            want_if = want_acts = w + 1 < vm ? w + 1 : vm;
            break;
        case SCHED_INTERLEAVED_ZB:
            /* one per hop (only B travels back), and r more kept for the Ws held back: every rank
             * keeps (v - 1) per + pp, where 1F1B's rank r keeps pp - r */
            w = (v - 1) * per + (pp - 1 - r);
            if (w > vm) w = vm;
            want_if = w + 1 < vm ? w + 1 : vm;
            want_acts = w + 1 + r < vm ? w + 1 + r : vm;
            break;
        case SCHED_ZBV:
            /* the paper's: 1F1B's pp stages' worth, in chunks of half a stage */
            assert_true(acts <= 2 * pp);
            if (m >= 2 * pp - 1) { /* m caps them only at pp 1, m 1 */
                want_acts = 2 * pp < 2 * m ? 2 * pp : 2 * m;
                assert_int_equal(sched_peak_acts(s, r, 0), 2 * pp - r < m ? 2 * pp - r : m);
                assert_int_equal(sched_peak_acts(s, r, 1), r + 1);
            }
            break;
        case SCHED_DUALPIPEV:
            /* DualPipe's README: PP + 1 with PP = 2 pp virtual stages */
            want_acts = 2 * pp + 1;
            assert_int_equal(sched_peak_acts(s, r, 0), 2 * pp - r);
            assert_int_equal(sched_peak_acts(s, r, 1), r + 1);
            break;
        }
        if ((want_if >= 0 && in_flight != want_if) || (want_acts >= 0 && acts != want_acts))
            fail_msg("%s pp %d v %d m %d rank %d: in flight %d (want %d), kept %d (want %d)",
                     sched_kind_name(s->kind), pp, v, m, r, in_flight, want_if, acts, want_acts);
    }
    assert_int_equal(sched_peak_acts(s, -1, 0), -EINVAL);
    assert_int_equal(sched_peak_acts(s, 0, v), -EINVAL);
    assert_int_equal(sched_peak_acts(s, 0, -2), -EINVAL);
    (*(int *)arg)++;
}

static void test_sched_every_kind_keeps_the_activations_it_promises(void **state)
{
    int n = 0;
    for_each_built(check_peaks, &n);
    assert_int_equal(n, 480);
    assert_int_equal(sched_peak_acts(NULL, 0, 0), -EINVAL);
}

/* With t_F = t_B = t_W = 1 per chunk and no comm every rank is busy 3 v m, so the bubble
 * 1 - busy / (pp makespan) is idle / (3 v m + idle), idle = makespan - 3 v m the same on every
 * rank. (p - 1) t_F is the least any schedule idles: the last rank's first forward waits for
 * the p - 1 before it. */
static void check_bubble(const sched_t *s, void *arg)
{
    double t[MAXR][3];
    fill_times(t, 1, 1, 1);
    int p = s->pp, v = s->vstages, m = s->microbatches;
    double ms = sched_simulate(s, (const double(*)[3])t, 0, NULL), idle = ms - 3.0 * v * m;
    double bubble = sched_bubble(s, (const double(*)[3])t, 0);
    assert_true(fabs(bubble - idle / (3.0 * v * m + idle)) < 1e-12);
    double want = -1; /* exact where the schedule's formula is exact */
    switch (s->kind) {
    case SCHED_GPIPE:
    case SCHED_1F1B:
        /* (p - 1)(t_F + t_B): only B travels back, each W runs off the chain */
        want = 2.0 * (p - 1);
        break;
    case SCHED_INTERLEAVED_1F1B:
        /* Megatron's (p - 1)(t_F + t_B) / v in stage times is (p - 1)(t_F + t_B) in chunk times;
         * with fewer microbatches than ranks it is no worse than not interleaving */
        if (m >= p) want = 2.0 * (p - 1);
        else assert_true(idle >= 2.0 * (p - 1) && idle <= 2.0 * (p - 1) * v);
        break;
    case SCHED_INTERLEAVED_ZB:
        /* the zero-bubble paper's ZB-H1, (p - 1)(t_F + t_B - t_W): the least possible */
        if (m >= p) want = p - 1;
        else assert_true(idle >= p - 1 && idle <= 2.0 * (p - 1) * v);
        break;
    case SCHED_ZBV:
        /* ZB-V: no bubble but the unavoidable (p - 1) t_F once 2 p - 1 microbatches fill the V */
        if (m >= 2 * p - 1) want = p - 1;
        else assert_true(idle >= p - 1 && idle <= 2.0 * (p - 1) * v);
        break;
    case SCHED_DUALPIPEV:
        /* DualPipe's README: (PP/2 - 1)(F&B + B - 3W) with PP = 2p virtual stages, B a full
         * backward (2 here) and F&B a pair run one after the other (3 here): 2 (p - 1). In this
         * model each action hands off when it ends, not when its pair does: the least possible */
        want = p - 1;
        assert_true(idle <= (p - 1) * (3.0 + 2.0 - 3.0));
        break;
    }
    if (want >= 0 && idle != want)
        fail_msg("%s pp %d v %d m %d: idle %g per rank, want %g", sched_kind_name(s->kind), p, v,
                 m, idle, want);
    (*(int *)arg)++;
}

static void test_sched_every_kinds_bubble_with_equal_times_matches_its_formula(void **state)
{
    int n = 0;
    for_each_built(check_bubble, &n);
    assert_int_equal(n, 480);
}

static void test_sched_fused_backward_bubbles_match_megatron_and_zb_h1_idles_a_third(void **state)
{
    /* W folded into B (t_B = 2, t_W = 0) is the papers' plain backward: 1F1B's bubble fraction
     * is (p - 1) / (m + p - 1), the interleaved one's (p - 1) / (v m + p - 1) */
    double fused[MAXR][3], equal[MAXR][3];
    fill_times(fused, 1, 2, 0);
    fill_times(equal, 1, 1, 1);
    for (int p = 1; p <= 4; p++) {
        for (int m = 1; m <= 16; m++) {
            sched_t s;
            assert_int_equal(sched_build(&s, p, 1, m, SCHED_1F1B, NULL, 0), 0);
            double b = sched_bubble(&s, (const double(*)[3])fused, 0);
            assert_true(fabs(b - (double)(p - 1) / (m + p - 1)) < 1e-12);
            double plain = sched_simulate(&s, (const double(*)[3])fused, 0, NULL) - 3.0 * m;
            sched_free(&s);
            for (int v = 2; v <= 3 && m >= p; v++) {
                if (!should_build(SCHED_INTERLEAVED_1F1B, p, v, m)) continue;
                assert_int_equal(sched_build(&s, p, v, m, SCHED_INTERLEAVED_1F1B, NULL, 0), 0);
                b = sched_bubble(&s, (const double(*)[3])fused, 0);
                assert_true(fabs(b - (double)(p - 1) / (v * m + p - 1)) < 1e-12);
                sched_free(&s);
            }
            /* ZB-H1 idles a third of that plain 1F1B (the paper's claim, exact here) */
            if (m < p || !should_build(SCHED_INTERLEAVED_ZB, p, 1, m)) continue;
            assert_int_equal(sched_build(&s, p, 1, m, SCHED_INTERLEAVED_ZB, NULL, 0), 0);
            double zb = sched_simulate(&s, (const double(*)[3])equal, 0, NULL) - 3.0 * m;
            assert_true(3 * zb == plain);
            sched_free(&s);
        }
    }
}

/* Random times and comm, every kind: each action starts exactly when its rank is free and its
 * dependency is done, plus comm only when that dependency ran on another rank. */
static void test_sched_simulate_follows_the_placement_for_every_kind(void **state)
{
    uint64_t seed = 777;
    for (int kind = 0; kind < NKINDS; kind++) {
        for (int pp = 1; pp <= 4; pp++) {
            for (int m = 1; m <= 9; m += 2) {
                int v = kind <= SCHED_1F1B ? 1 : 2;
                if (!should_build(kind, pp, v, m)) continue;
                double t[MAXR][3], comm = (double)(1 + rng_next(&seed) % 4) / 8;
                for (int r = 0; r < MAXR; r++)
                    for (int op = 0; op < 3; op++) t[r][op] = 0.125 * (1 + rng_next(&seed) % 16);
                sched_t s;
                assert_int_equal(sched_build(&s, pp, v, m, (sched_kind_t)kind, NULL, 0), 0);
                double st[MAXR][64], *start[MAXR], end[8][9][3];
                for (int r = 0; r < pp; r++) start[r] = st[r];
                double ms = sched_simulate(&s, (const double(*)[3])t, comm, start), last = 0;
                for (int r = 0; r < pp; r++)
                    for (int i = 0; i < s.n[r]; i++) {
                        const sched_action_t *a = &s.a[r][i];
                        double e = st[r][i] + t[r][a->op];
                        end[sched_vstage(&s, r, a->chunk)][a->mb][a->op] = e;
                        if (e > last) last = e;
                    }
                assert_true(ms == last);
                for (int r = 0; r < pp; r++) {
                    for (int i = 0; i < s.n[r]; i++) {
                        const sched_action_t *a = &s.a[r][i];
                        int k = sched_vstage(&s, r, a->chunk), dk = -1, dop = -1;
                        if (a->op == SCHED_F && k > 0) dk = k - 1, dop = SCHED_F;
                        if (a->op == SCHED_B) /* the next stage's B, or the last's own F */
                            dk = k < pp * v - 1 ? k + 1 : k, dop = dk > k ? SCHED_B : SCHED_F;
                        if (a->op == SCHED_W) dk = k, dop = SCHED_B;
                        double earliest = i ? st[r][i - 1] + t[r][s.a[r][i - 1].op] : 0;
                        if (dk >= 0) {
                            double dep = end[dk][a->mb][dop];
                            if (sched_rank_of(&s, dk, NULL) != r) dep += comm;
                            if (dep > earliest) earliest = dep;
                        }
                        if (st[r][i] != earliest)
                            fail_msg("%s pp %d m %d rank %d action %d starts at %g, not %g",
                                     sched_kind_name(kind), pp, m, r, i, st[r][i], earliest);
                    }
                }
                sched_free(&s);
            }
        }
    }
}

static void test_sched_v_placement_hands_off_inside_a_rank_without_comm(void **state)
{
    /* pp 2, V: v0 rank 0, v1 rank 1, v2 rank 1 (chunk 1), v3 rank 0 (chunk 1); unit times, comm
     * 0.5. F v0 [0,1]; F v1 [1.5,2.5]; F v2 [2.5,3.5] (same rank); F v3 [4,5]; B v3 [5,6] W [6,7];
     * rank 1: B v2 [6.5,7.5] W [7.5,8.5] B v1 [8.5,9.5] W [9.5,10.5]; rank 0: B v0 [10,11] W
     * [11,12]. */
    hand_t h;
    char err[256];
    hand_init(&h, 2, 2, 1, (const char *const[]){"F0c0 F0c1 B0c1 W0c1 B0c0 W0c0",
                                                 "F0c0 F0c1 B0c1 W0c1 B0c0 W0c0"});
    h.s.placement = SCHED_V;
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), 0);
    double t[MAXR][3], st0[6], st1[6], *start[2] = {st0, st1};
    fill_times(t, 1, 1, 1);
    assert_true(sched_simulate(&h.s, (const double(*)[3])t, 0.5, start) == 12);
    const double want0[6] = {0, 4, 5, 6, 10, 11}, want1[6] = {1.5, 2.5, 6.5, 7.5, 8.5, 9.5};
    for (int i = 0; i < 6; i++) {
        assert_true(st0[i] == want0[i]);
        assert_true(st1[i] == want1[i]);
    }
    /* rank 1 forwarding its chunk 1 first waits for its own chunk 0: a deadlock inside a rank */
    hand_init(&h, 2, 2, 1, (const char *const[]){"F0c0 F0c1 B0c1 W0c1 B0c0 W0c0",
                                                 "F0c1 F0c0 B0c1 W0c1 B0c0 W0c0"});
    h.s.placement = SCHED_V;
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "deadlock after 1 of 12 actions:"
                             " rank 0 at action 1 F(c1, mb 0) waits for F(c1, mb 0) on rank 1;"
                             " rank 1 at action 0 F(c1, mb 0) waits for F(c0, mb 0) on rank 1");
    /* the V needs two chunks */
    hand_init(&h, 2, 1, 1, (const char *const[]){"F0 B0 W0", "F0 B0 W0"});
    h.s.placement = SCHED_V;
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "the V placement needs exactly 2 virtual stages per rank, got 1");
    h.s.placement = (sched_placement_t)7;
    assert_int_equal(sched_check(&h.s, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "bad schedule placement 7");
}

static void test_sched_render_draws_a_chunk_row_under_each_rank(void **state)
{
    sched_t s;
    double t[MAXR][3];
    fill_times(t, 1, 1, 1);
    assert_int_equal(sched_build(&s, 2, 2, 2, SCHED_ZBV, NULL, 0), 0);
    /* makespan 14, one column per unit: rank 0's row, its chunks, rank 1's row, its chunks */
    char *out = render(&s, (const double(*)[3])t, 14);
    assert_string_equal(out, "01.0aw1bwaw.bw\n"
                             "00.11111100.00\n"
                             ".0011awawbwbw.\n"
                             ".010111001100.\n");
    free(out);
    sched_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sched_kind_parse_accepts_torchtitan_names_in_any_case),
        cmocka_unit_test(test_sched_build_rejects_bad_arguments_with_a_reason),
        cmocka_unit_test(test_sched_every_built_schedule_checks_with_one_f_b_w_per_microbatch),
        cmocka_unit_test(test_sched_gpipe_runs_all_forwards_then_backwards_in_order),
        cmocka_unit_test(test_sched_1f1b_follows_megatron_warmup_steady_cooldown),
        cmocka_unit_test(test_sched_1f1b_keeps_at_most_pp_minus_rank_microbatches_in_flight),
        cmocka_unit_test(test_sched_check_rejects_backward_before_forward_on_a_rank),
        cmocka_unit_test(test_sched_check_reports_which_ranks_deadlock_and_on_what),
        cmocka_unit_test(test_sched_check_rejects_missing_and_duplicated_actions),
        cmocka_unit_test(test_sched_check_rejects_fields_out_of_range),
        cmocka_unit_test(test_sched_check_and_simulate_follow_virtual_stage_dependencies),
        cmocka_unit_test(test_sched_simulate_uniform_makespan_is_m_plus_pp_minus_one_slots),
        cmocka_unit_test(test_sched_simulate_gpipe_keeps_w_off_the_cross_rank_chain),
        cmocka_unit_test(test_sched_simulate_single_rank_runs_back_to_back),
        cmocka_unit_test(test_sched_simulate_adds_comm_to_every_cross_rank_hand_off),
        cmocka_unit_test(test_sched_simulate_starts_each_action_as_soon_as_allowed),
        cmocka_unit_test(test_sched_simulate_refuses_lists_that_fail_the_check),
        cmocka_unit_test(test_sched_render_draws_one_row_per_rank_across_the_makespan),
        cmocka_unit_test(test_sched_free_clears_the_schedule_and_may_repeat),
        cmocka_unit_test(test_sched_kinds_say_their_placement_and_virtual_stages),
        cmocka_unit_test(test_sched_build_refuses_each_kinds_combinations_naming_the_rule),
        cmocka_unit_test(test_sched_every_kind_builds_checked_lists_or_refuses_over_the_grid),
        cmocka_unit_test(test_sched_every_kind_runs_ws_and_the_last_stages_fs_in_microbatch_order),
        cmocka_unit_test(test_sched_check_requires_ws_and_the_losses_in_microbatch_order),
        cmocka_unit_test(test_sched_placement_maps_virtual_stages_both_ways),
        cmocka_unit_test(test_sched_new_kinds_follow_pytorchs_orders),
        cmocka_unit_test(test_sched_every_kind_keeps_the_activations_it_promises),
        cmocka_unit_test(test_sched_every_kinds_bubble_with_equal_times_matches_its_formula),
        cmocka_unit_test(test_sched_fused_backward_bubbles_match_megatron_and_zb_h1_idles_a_third),
        cmocka_unit_test(test_sched_simulate_follows_the_placement_for_every_kind),
        cmocka_unit_test(test_sched_v_placement_hands_off_inside_a_rank_without_comm),
        cmocka_unit_test(test_sched_render_draws_a_chunk_row_under_each_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
