/* The job layout (stages/job/job.h) as plain functions of a manifest: which host owns which ranges
 * of the flat space across hosts (job_host_parts), the split a checkpoint in parts follows, and
 * the optimizer shards' slices (job_shard_range), and the optimizer-state segment's header
 * check (job_optstate_check). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc/shm.h"
#include "kernels/optim.h"
#include "kernels/params.h"
#include "stages/job/job.h"
#include "stages/job/manifest.h"

/* A validated manifest of pp stages and dp replicas on `hosts` hosts (the NCCL plane on the
 * GPU, as across hosts it must be). */
static void topology(manifest_t *m, int pp, int dp, int hosts)
{
    char err[512], v[3][16];
    snprintf(v[0], sizeof(v[0]), "%d", pp);
    snprintf(v[1], sizeof(v[1]), "%d", dp);
    snprintf(v[2], sizeof(v[2]), "%d", hosts);
    const char *kv[][2] = {{"parallelism.data_plane", "nccl"}, {"job.device", "cuda"},
                           {"parallelism.pipeline_parallel_degree", v[0]},
                           {"parallelism.data_parallel_replicate_degree", v[1]}, {"job.hosts", v[2]},
                           {"job.endpoint", "tcp://10.0.0.1:29500"}};
    manifest_defaults(m);
    for (size_t k = 0; k < sizeof(kv) / sizeof(kv[0]); k++)
        if (manifest_override(m, kv[k][0], kv[k][1], err, sizeof(err)))
            fail_msg("%s = %s: %s", kv[k][0], kv[k][1], err);
    if (manifest_validate(m, err, sizeof(err)))
        fail_msg("pp %d dp %d hosts %d: %s", pp, dp, hosts, err);
}

static void test_job_host_parts_of_one_host_is_the_whole_space(void **state)
{
    (void)state;
    manifest_t *m = malloc(sizeof(*m));
    char err[512];
    manifest_defaults(m);
    assert_int_equal(manifest_override(m, "parallelism.pipeline_parallel_degree", "2", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    job_layout_t l;
    assert_int_equal(job_layout(&l, m), 0);
    job_range_t *r;
    int n;
    assert_int_equal(job_host_parts(&l, m, &r, &n), 0);
    assert_int_equal(n, 1);
    assert_true(r[0].begin == 0 && r[0].end == l.total && r[0].host == 0);
    free(r);
    topology(m, 2, 2, 1); /* the NCCL plane on one host: still one part */
    assert_int_equal(job_layout(&l, m), 0);
    assert_int_equal(job_host_parts(&l, m, &r, &n), 0);
    assert_int_equal(n, 1);
    assert_true(r[0].begin == 0 && r[0].end == l.total && r[0].host == 0);
    free(r);
    free(m);
}

/* For each topology: the ranges are sorted, tile [0, total) without overlap, merged (no two
 * neighbours of one host), and every float's host is the host of the one shard that holds it,
 * so each host's ranges are exactly the union of its shards' ranges. */
static void test_job_host_parts_are_each_hosts_shards_and_tile_the_space(void **state)
{
    (void)state;
    static const int topo[][3] = {{1, 2, 2}, {2, 2, 2}, {1, 4, 2}, {2, 4, 2}, {3, 6, 3}, {2, 6, 2},
                                  {4, 4, 4}, {8, 2, 2}, {3, 3, 3}, {2, 8, 4}};
    manifest_t *m = malloc(sizeof(*m));
    for (size_t t = 0; t < sizeof(topo) / sizeof(topo[0]); t++) {
        int pp = topo[t][0], dp = topo[t][1], hosts = topo[t][2];
        topology(m, pp, dp, hosts);
        job_layout_t l;
        assert_int_equal(job_layout(&l, m), 0);
        assert_int_equal(m->shards, pp * dp);
        signed char *owner = malloc(l.total);
        memset(owner, -1, l.total);
        for (int k = 0; k < m->shards; k++) {
            size_t b, e;
            assert_int_equal(job_shard_range(&l, m, k, &b, &e), 0);
            for (size_t i = b; i < e; i++) {
                if (owner[i] >= 0)
                    fail_msg("pp %d dp %d hosts %d: float %zu in two shards", pp, dp, hosts, i);
                owner[i] = (signed char)job_host_of(&l, k % dp);
            }
        }
        job_range_t *r;
        int n;
        assert_int_equal(job_host_parts(&l, m, &r, &n), 0);
        /* each stage's replicas in host order, so hosts * pp ranges: none merges across stages */
        if (n != hosts * pp)
            fail_msg("pp %d dp %d hosts %d: %d ranges, expected %d", pp, dp, hosts, n, hosts * pp);
        size_t at = 0;
        int seen[8] = {0};
        for (int i = 0; i < n; i++) {
            if (r[i].begin != at || r[i].end <= r[i].begin || r[i].host < 0 || r[i].host >= hosts)
                fail_msg("pp %d dp %d hosts %d: range %d [%zu, %zu) of host %d after %zu", pp, dp, hosts, i,
                         r[i].begin, r[i].end, r[i].host, at);
            if (i && r[i].host == r[i - 1].host)
                fail_msg("pp %d dp %d hosts %d: ranges %d and %d of host %d not merged", pp, dp, hosts, i - 1, i,
                         r[i].host);
            for (size_t x = r[i].begin; x < r[i].end; x++)
                if (owner[x] != r[i].host)
                    fail_msg("pp %d dp %d hosts %d: float %zu is in host %d's range, its shard is host %d's", pp,
                             dp, hosts, x, r[i].host, owner[x]);
            seen[r[i].host] = 1;
            at = r[i].end;
        }
        assert_int_equal(at, l.total);
        for (int h = 0; h < hosts; h++)
            assert_true(seen[h]);
        free(r);
        free(owner);
    }
    free(m);
}

/* An optimizer that needs whole tensors (optim_t.whole_tensors; AdamW does not) gets slices
 * that still tile the flat space, each beginning and ending at a tensor boundary, and the
 * global norm is then summed in shard order; AdamW's stay block-aligned and summed by blocks. */
static void test_job_shard_ranges_of_a_whole_tensor_optimizer_end_at_tensors(void **state)
{
    (void)state;
    manifest_t *m = malloc(sizeof(*m));
    char err[512];
    const optim_t whole = {.name = "whole", .n_state = 1, .state = {"s"}, .whole_tensors = 1};
    param_table_t tab;
    for (int shards = 1; shards <= 7; shards++) {
        char v[8];
        snprintf(v, sizeof(v), "%d", shards);
        manifest_defaults(m);
        assert_int_equal(manifest_override(m, "optshard.shards", v, err, sizeof(err)), 0);
        assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
        assert_int_equal(params_table_init(&tab, &m->model), 0);
        job_layout_t l;
        assert_int_equal(job_layout(&l, m), 0);
        assert_true(job_norm_by_blocks(&l));
        l.opt = &whole;
        assert_false(job_norm_by_blocks(&l));
        size_t at = 0;
        int cut_inside = 0;
        for (int k = 0; k < shards; k++) {
            size_t b, e, ab, ae;
            assert_int_equal(job_shard_range(&l, m, k, &b, &e), 0);
            assert_true(b == at && e >= b);
            assert_int_equal(params_next_boundary(&tab, b), b);
            assert_int_equal(params_next_boundary(&tab, e), e);
            l.opt = optim_find("AdamW");
            assert_int_equal(job_shard_range(&l, m, k, &ab, &ae), 0);
            l.opt = &whole;
            assert_true(ab % MANIFEST_BLOCK == 0 && b >= ab); /* moved up, never down */
            cut_inside |= params_next_boundary(&tab, ae) != ae;
            at = e;
        }
        assert_int_equal(at, l.total);
        if (shards > 2)
            assert_true(cut_inside); /* AdamW's cuts do fall inside tensors: the test tells them apart */
        params_table_free(&tab);
    }
    free(m);
}

static char optstate_job[32]; /* the job name of the segment test_job_optstate_check makes */

/* Removes that segment whether the test passed or failed an assertion half-way. */
static int remove_optstate(void **state)
{
    (void)state;
    if (optstate_job[0])
        shm_remove_all(optstate_job);
    return 0;
}

/* A shard attaching ctitan.<job>.optstate takes it only if its header is this job's: made for
 * the layout it is checked against, it passes; another shard count, another model's size or
 * stride, another optimizer's arrays, a wrong magic or version are each refused, naming the
 * segment's shape and the job's. A real segment in /dev/shm, removed after. */
static void test_job_optstate_check_refuses_a_segment_made_for_another_job(void **state)
{
    (void)state;
    manifest_t *m = malloc(sizeof(*m));
    char err[512], *job = optstate_job;
    manifest_defaults(m);
    assert_int_equal(manifest_override(m, "parallelism.pipeline_parallel_degree", "2", err, sizeof(err)), 0);
    assert_int_equal(manifest_validate(m, err, sizeof(err)), 0);
    job_layout_t l, other;
    assert_int_equal(job_layout(&l, m), 0);
    snprintf(job, sizeof(optstate_job), "tjob%d", (int)getpid());
    shm_seg_t *seg = NULL;
    assert_int_equal(job_optstate_create(&seg, job, &l, 2, err, sizeof(err)), 0);
    job_optstate_hdr_t *h = shm_data(seg), saved = *h;
    assert_int_equal(job_optstate_check(h, &l, 2, err, sizeof(err)), 0);
    assert_int_equal(job_optstate_check(h, &l, 3, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "the optstate segment is not this job's (2 shards of"));
    assert_non_null(strstr(err, "the job has 3 of"));
    other = l;
    other.total += 1;
    assert_int_equal(job_optstate_check(h, &other, 2, err, sizeof(err)), -EINVAL);
    other = l;
    other.stride += 16;
    assert_int_equal(job_optstate_check(h, &other, 2, err, sizeof(err)), -EINVAL);
    other = l;
    other.arrays += 1;
    assert_int_equal(job_optstate_check(h, &other, 2, err, sizeof(err)), -EINVAL);
    /* a segment of two banks for a job of one (optshard.host_banks 1), and one bank's arrays */
    assert_int_equal(l.host_banks, 2);
    other = l;
    other.host_banks = 1;
    assert_int_equal(job_optstate_check(h, &other, 2, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "2 banks; the job has 2 of"));
    assert_true(job_optstate_bytes(&other, 2) == job_optstate_bytes(&l, 2) - (size_t)l.arrays * l.stride * 4);
    assert_true(job_optstate_array(h, 1, 0) == job_optstate_array(h, 0, 0) + (size_t)l.arrays * l.stride);
    h->banks = 1;
    assert_true(job_optstate_array(h, 1, 2) == job_optstate_array(h, 0, 2));
    *h = saved;
    h->magic ^= 1;
    assert_int_equal(job_optstate_check(h, &l, 2, err, sizeof(err)), -EINVAL);
    *h = saved;
    h->version += 1;
    assert_int_equal(job_optstate_check(h, &l, 2, err, sizeof(err)), -EINVAL);
    *h = saved;
    assert_int_equal(job_optstate_check(h, &l, 2, err, sizeof(err)), 0);
    shm_detach(&seg);
    assert_int_equal(shm_remove_all(job), 1);
    optstate_job[0] = '\0';
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_job_host_parts_of_one_host_is_the_whole_space),
        cmocka_unit_test(test_job_host_parts_are_each_hosts_shards_and_tile_the_space),
        cmocka_unit_test(test_job_shard_ranges_of_a_whole_tensor_optimizer_end_at_tensors),
        cmocka_unit_test_teardown(test_job_optstate_check_refuses_a_segment_made_for_another_job, remove_optstate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
