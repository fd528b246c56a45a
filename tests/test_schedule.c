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

#include "stages/schedule.h"

#define MAXR 8
#define MAXA 96

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

/* "F0 F1 B0 W0 ..." for one rank's list, to compare with the expected order. */
static const char *list_str(const sched_t *s, int r, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < s->n[r] && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%c%d", i ? " " : "",
                                "FBW"[s->a[r][i].op], s->a[r][i].mb);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
