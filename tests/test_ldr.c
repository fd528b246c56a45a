/* The loader library's pieces that need no running job: the shuffle permutation, cursor
 * maps, and the loader segment (cursor table, restart and swap points computed from real
 * rings in memory). ldr_open/ldr_next are exercised end to end by test_launch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "stages/runtime/ldr.h"
#include "stages/job/ldr_seg.h"

static void test_ldr_shuffle_is_a_permutation_for_every_size(void **state)
{
    for (uint64_t n = 1; n <= 300; n++) {
        unsigned char *seen = calloc(n, 1);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t j = ldr_shuffle(7, 3, n, i);
            assert_true(j < n);
            assert_int_equal(seen[j], 0);
            seen[j] = 1;
        }
        free(seen);
    }
    enum { BIG = 100003 }; /* a prime, far from a power of two */
    static unsigned char seen[BIG];
    uint64_t fixed = 0;
    for (uint64_t i = 0; i < BIG; i++) {
        uint64_t j = ldr_shuffle(1, 0, BIG, i) % BIG;
        assert_int_equal(ldr_shuffle(1, 0, BIG, i), j);
        assert_int_equal(seen[j], 0);
        seen[j] = 1;
        fixed += j == i;
    }
    assert_true(fixed < 100); /* it does move things (a random permutation fixes ~1 point) */
}

static void test_ldr_shuffle_depends_on_seed_and_epoch_only(void **state)
{
    int same_seed = 0, other_seed = 0, other_epoch = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        same_seed += ldr_shuffle(5, 2, 1000, i) == ldr_shuffle(5, 2, 1000, i);
        other_seed += ldr_shuffle(5, 2, 1000, i) == ldr_shuffle(6, 2, 1000, i);
        other_epoch += ldr_shuffle(5, 2, 1000, i) == ldr_shuffle(5, 3, 1000, i);
    }
    assert_int_equal(same_seed, 1000);
    assert_true(other_seed < 20);
    assert_true(other_epoch < 20);
}

static void test_ldr_cursor_maps_round_trip_and_reject_bad_input(void **state)
{
    uint8_t buf[64];
    const char *keys[] = {"sample", "byte"};
    uint64_t vals[] = {123456789012ULL, 7}, v = 0;
    size_t n = ldr_cursor_pack(buf, sizeof(buf), 2, keys, vals);
    assert_true(n > 0);
    assert_int_equal(ldr_cursor_get(buf, n, "sample", &v), 0);
    assert_true(v == 123456789012ULL);
    assert_int_equal(ldr_cursor_get(buf, n, "byte", &v), 0);
    assert_int_equal(v, 7);
    assert_int_equal(ldr_cursor_get(buf, n, "skip", &v), -ENOENT);
    assert_int_equal(ldr_cursor_get(buf, 0, "sample", &v), -ENOENT);
    assert_int_equal(ldr_cursor_get(buf, n - 1, "sample", &v), -EINVAL); /* truncated */
    const uint8_t not_map[] = {0x93, 1, 2, 3};                          /* [1, 2, 3] */
    assert_int_equal(ldr_cursor_get(not_map, sizeof(not_map), "sample", &v), -EINVAL);
    const uint8_t str_val[] = {0x81, 0xa6, 's', 'a', 'm', 'p', 'l', 'e', 0xa1, 'x'}; /* {"sample": "x"} */
    assert_int_equal(ldr_cursor_get(str_val, sizeof(str_val), "sample", &v), -EINVAL);
    assert_int_equal(ldr_cursor_pack(buf, 4, 2, keys, vals), 0); /* does not fit */
    /* what a checkpoint's index may carry, read behind the codec's guard: a map that claims
     * 2^32 - 1 entries in 5 bytes (msgpack-c alone would allocate 64 GiB for them), the same key
     * twice, a key that is not a string */
    const uint8_t huge[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(ldr_cursor_get(huge, sizeof(huge), "sample", &v), -EINVAL);
    const uint8_t twice[] = {0x82, 0xa1, 'k', 1, 0xa1, 'k', 2}; /* {"k": 1, "k": 2} */
    assert_int_equal(ldr_cursor_get(twice, sizeof(twice), "k", &v), -EINVAL);
    const uint8_t int_key[] = {0x82, 0x01, 1, 0xa1, 'k', 2}; /* {1: 1, "k": 2} */
    assert_int_equal(ldr_cursor_get(int_key, sizeof(int_key), "k", &v), -EINVAL);
}

typedef struct {
    void *mem;
    size_t bytes;
    ldr_info_t info;
} seg_t;

static void seg_make(seg_t *s, int dp, int M, int nslots, int64_t first, int64_t steps)
{
    s->info = (ldr_info_t){.dp = dp, .microbatches = M, .seqs = 2, .seq_len = 8, .vocab_size = 50,
                           .first_step = first, .steps = steps};
    s->bytes = ldr_seg_bytes(dp, nslots, 2, 8);
    assert_int_equal(posix_memalign(&s->mem, 4096, s->bytes), 0);
    const char *key = "sample";
    uint64_t k = 40;
    uint8_t cur[32];
    size_t n = ldr_cursor_pack(cur, sizeof(cur), 1, &key, &k);
    assert_int_equal(ldr_seg_format(s->mem, s->bytes, &s->info, nslots, cur, n), 0);
}

/* Commits the (step, replica, mb) slots of the loader's order up to `count` pairs, recording
 * the cursor of each next step as the loader library does. */
static void produce(seg_t *s, ring_t **rings, int count, int64_t from)
{
    int64_t step = from;
    int r = 0, mb = 0;
    for (int i = 0; i < count; i++) {
        int last = r == s->info.dp - 1 && mb == s->info.microbatches - 1;
        if (last) {
            uint8_t cur[32];
            const char *key = "sample";
            uint64_t k = 1000 + (uint64_t)step + 1;
            ldr_seg_put_cursor(s->mem, step + 1, cur, ldr_cursor_pack(cur, sizeof(cur), 1, &key, &k));
        }
        for (int t = 0; t < 2; t++) {
            void *p;
            assert_int_equal(ring_reserve(rings[2 * r + t], 0, &p), 0);
            assert_int_equal(ring_commit(rings[2 * r + t], (uint64_t)step, (uint64_t)mb, 64), 0);
        }
        if (++mb == s->info.microbatches && (mb = 0, ++r == s->info.dp))
            r = 0, step++;
    }
}

static void test_ldr_seg_format_records_the_first_cursor(void **state)
{
    seg_t s;
    seg_make(&s, 1, 2, 4, 5, 100);
    uint8_t buf[LDR_CURSOR_MAX];
    size_t len;
    uint64_t k;
    assert_int_equal(ldr_seg_cursor(s.mem, 5, buf, &len), 0);
    assert_int_equal(ldr_cursor_get(buf, len, "sample", &k), 0);
    assert_int_equal(k, 40);
    assert_int_equal(ldr_seg_cursor(s.mem, 6, buf, &len), -ENOENT);
    ldr_seg_hdr_t *h = s.mem;
    assert_int_equal(h->resume_step, 5);
    ring_t *r;
    assert_int_equal(ldr_seg_ring(s.mem, 1, &r, NULL, 0), 0);
    assert_int_equal(ring_base(r), 5);
    assert_int_equal(ring_nslots(r), 4);
    ring_detach(&r);
    assert_int_not_equal(ldr_seg_ring(s.mem, 2, &r, NULL, 0), 0); /* dp 1: rings 0 and 1 only */
    free(s.mem);
}

static void test_ldr_seg_cursor_table_forgets_entries_64_steps_old(void **state)
{
    seg_t s;
    seg_make(&s, 1, 1, 1, 0, 1000);
    uint8_t buf[LDR_CURSOR_MAX], c = 9;
    size_t len;
    for (int64_t st = 1; st <= 70; st++)
        ldr_seg_put_cursor(s.mem, st, &c, 1);
    assert_int_equal(ldr_seg_cursor(s.mem, 70, buf, &len), 0);
    assert_int_equal(ldr_seg_cursor(s.mem, 7, buf, &len), 0);
    assert_int_equal(ldr_seg_cursor(s.mem, 6, buf, &len), -ENOENT); /* entry reused by step 70 */
    free(s.mem);
}

static void test_ldr_seg_restart_resumes_at_the_first_step_not_fully_delivered(void **state)
{
    seg_t s;
    seg_make(&s, 2, 3, 16, 0, 100);
    ring_t *rings[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(ldr_seg_ring(s.mem, i, &rings[i], NULL, 0), 0);
    /* step 0 complete (6 pairs), step 1: replica 0 complete, replica 1 one microbatch */
    produce(&s, rings, 6 + 3 + 1, 0);
    int64_t from = -1;
    assert_int_equal(ldr_seg_prepare_restart(s.mem, &from), 0);
    assert_int_equal(from, 1);
    ldr_seg_hdr_t *h = s.mem;
    uint64_t k;
    assert_int_equal(h->resume_step, 1);
    assert_int_equal(ldr_cursor_get(h->resume_cursor, h->resume_len, "sample", &k), 0);
    assert_int_equal(k, 1001); /* the cursor recorded when step 0 ended */
    /* consumers may have taken slots meanwhile: the resume point does not move back */
    void *p;
    ring_meta_t meta;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ring_peek(rings[0], 0, &p, &meta), 0);
        ring_release(rings[0]);
    }
    assert_int_equal(ldr_seg_prepare_restart(s.mem, &from), 0);
    assert_int_equal(from, 1);
    for (int i = 0; i < 4; i++)
        ring_detach(&rings[i]);
    free(s.mem);
}

static void test_ldr_seg_swap_empties_the_rings_at_the_boundary(void **state)
{
    seg_t s;
    seg_make(&s, 1, 2, 8, 0, 100);
    ring_t *rings[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(ldr_seg_ring(s.mem, i, &rings[i], NULL, 0), 0);
    produce(&s, rings, 7, 0); /* steps 0-2 and half of 3 prefetched */
    assert_int_equal(ldr_seg_prepare_swap(s.mem, 2), 0);
    ldr_seg_hdr_t *h = s.mem;
    uint64_t k;
    assert_int_equal(h->resume_step, 2);
    assert_int_equal(ldr_cursor_get(h->resume_cursor, h->resume_len, "sample", &k), 0);
    assert_int_equal(k, 1002);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ring_head(rings[i]), 0);
        assert_int_equal(ring_base(rings[i]), 2);
    }
    assert_int_equal(ldr_seg_prepare_swap(s.mem, 50), -ENOENT); /* no cursor for step 50 */
    for (int i = 0; i < 2; i++)
        ring_detach(&rings[i]);
    free(s.mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ldr_shuffle_is_a_permutation_for_every_size),
        cmocka_unit_test(test_ldr_shuffle_depends_on_seed_and_epoch_only),
        cmocka_unit_test(test_ldr_cursor_maps_round_trip_and_reject_bad_input),
        cmocka_unit_test(test_ldr_seg_format_records_the_first_cursor),
        cmocka_unit_test(test_ldr_seg_cursor_table_forgets_entries_64_steps_old),
        cmocka_unit_test(test_ldr_seg_restart_resumes_at_the_first_step_not_fully_delivered),
        cmocka_unit_test(test_ldr_seg_swap_empties_the_rings_at_the_boundary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
