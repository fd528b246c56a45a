/* The job manifest (see manifest.h): its defaults, the resolved TOML every process reads,
 * and what the topology derives from it (a stage's pieces, a shard's range). Reading is in
 * manifest_parse.c, checking in manifest_check.c, the key table in manifest_keys.c. */
#include "stages/job/manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/params.h"
#include "stages/job/manifest_keys.h"

void manifest_defaults(manifest_t *m)
{
    memset(m, 0, sizeof(*m));
    strcpy(m->name, "ctitan");
    strcpy(m->device, "cpu");
    strcpy(m->data_plane, "ipc");
    m->hosts = 1;
    m->heartbeat_interval_ms = 100;
    m->heartbeat_timeout_ms = 3000;
    m->startup_timeout_s = 120;
    m->max_restarts = 3;
    m->restart_backoff_ms = 1000;
    m->host_timeout_s = 600;
    strcpy(m->mps, "off");
    strcpy(m->model_name, "llama3");
    strcpy(m->flavor, "debugmodel");
    config_preset(m->flavor, &m->model);
    m->steps = 10;
    m->local_batch_size = 8;
    m->seq_len = 256;
    m->max_norm = 1.0;
    m->pp = 1;
    m->schedule = SCHED_1F1B;
    m->microbatches = 1;
    m->ac_every = 2; /* torchtitan's selective_ac_option default, "2" */
    m->dp = m->dp_replicate = m->dp_shard = 1;
    strcpy(m->fsdp_reshard, "default");
    strcpy(m->mp_reduce, "float32");
    strcpy(m->attention, "auto");
    strcpy(m->optimizer_name, "AdamW");
    m->lr = 8e-4;
    m->beta1 = 0.9;
    m->beta2 = 0.95;
    m->eps = 1e-8;
    m->weight_decay = 0.1;
    m->lr_sched = lr_schedule_default(m->steps);
    /* torchtitan's 200, unclipped: steps may still change; validate clips it as torchtitan does */
    m->lr_sched.warmup_steps = 200;
    m->prefetch = 4;
    m->shards = 1;
    m->gpu_banks = 1;
    m->host_banks = 2;
    snprintf(m->offload_dtype, sizeof(m->offload_dtype), "float32");
    m->ckpt_interval = 500;
    snprintf(m->ckpt_folder, sizeof(m->ckpt_folder), "checkpoint");
    m->ckpt_keep = 10;
    m->log_freq = 1;
    snprintf(m->tb_folder, sizeof(m->tb_folder), "tb");
    m->val_steps = 8;
    m->sample_temperature = 0.8;
}

static void put_string(FILE *f, const char *s, size_t size)
{
    fputc('"', f);
    for (size_t i = 0; i < size && s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04X", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* The shortest %.Ng that reads back to the same bits, always in float syntax. */
static void put_double(FILE *f, double x)
{
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, x);
        double y = strtod(buf, NULL);
        if (!memcmp(&x, &y, sizeof(x)) || !isfinite(x))
            break;
    }
    fputs(buf, f);
    if (isfinite(x) && !strpbrk(buf, ".e"))
        fputs(".0", f);
}

char *manifest_to_toml(const manifest_t *m)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f)
        return NULL;
    fputs("# ctitan job manifest, resolved: every key, as each process of the job reads it\n", f);
    for (int k = 0; k < mkey_count; k++) {
        const mkey_t *K = &mkey_table[k];
        const char *field = (const char *)m + K->off;
        if (!k || strcmp(K->section, mkey_table[k - 1].section))
            fprintf(f, "%s[%s]\n", k ? "\n" : "", K->section);
        fprintf(f, "%s = ", K->key);
        switch (K->type) {
        case MKEY_INT: fprintf(f, "%d", *(const int *)field); break;
        case MKEY_U64: fprintf(f, "%" PRIu64, *(const uint64_t *)field); break;
        case MKEY_DOUBLE: put_double(f, *(const double *)field); break;
        case MKEY_BOOL: fputs(*(const int *)field ? "true" : "false", f); break;
        case MKEY_STR: case MKEY_FLAVOR: /* checkpoint.load's "" reads back as the default, "latest" */
            put_string(f, field == m->ckpt_load && !field[0] ? "none" : field, K->size);
            break;
        case MKEY_SCHED: fprintf(f, "\"%s\"", sched_kind_name(*(const sched_kind_t *)field)); break;
        case MKEY_DECAY: fprintf(f, "\"%s\"", lr_decay_name(*(const lr_decay_t *)field)); break;
        case MKEY_AC_MODE: fprintf(f, "\"%s\"", config_ac_mode_name(*(const int *)field)); break;
        case MKEY_AC_OPTION:
            if (*(const int *)field > 0)
                fprintf(f, "\"%d\"", *(const int *)field);
            else
                fputs("\"op\"", f);
            break;
        case MKEY_SPLITS:
            fputc('[', f);
            for (int i = 0; i < m->n_split_points && i < MANIFEST_MAX_PP; i++)
                fprintf(f, "%s\"layers.%d\"", i ? ", " : "", m->split_points[i]);
            fputc(']', f);
            break;
        }
        fputc('\n', f);
    }
    int bad = ferror(f);
    if (fclose(f) || bad) {
        free(out);
        return NULL;
    }
    return out;
}

/* Smallest largest-stage size over contiguous splits of w[0, P) into k non-empty stages
 * (k <= P), then the lexicographically earliest split reaching it: start[0..k].
 * pre and need are scratch of P + 1 each. */
static void balanced_split(const size_t *w, int P, int k, int *start, size_t *pre, int *need)
{
    size_t lo = 0, hi = 0;
    for (int i = 0; i < P; i++) {
        lo = w[i] > lo ? w[i] : lo;
        hi += w[i];
    }
    while (lo < hi) { /* fewest stages needed at cap mid, by greedy packing */
        size_t mid = lo + (hi - lo) / 2, run = 0;
        int parts = 1;
        for (int i = 0; i < P; i++) {
            if (run + w[i] > mid)
                parts++, run = 0;
            run += w[i];
        }
        if (parts <= k)
            hi = mid;
        else
            lo = mid + 1;
    }
    size_t cap = lo;
    pre[0] = 0; /* need[i]: fewest stages for pieces [i, P) at this cap */
    for (int i = 0; i < P; i++)
        pre[i + 1] = pre[i] + w[i];
    need[P] = 0;
    for (int i = P - 1, j = P; i >= 0; i--) {
        while (pre[j] - pre[i] > cap)
            j--;
        need[i] = 1 + need[j];
    }
    /* The earliest end for each stage that leaves a feasible rest (need is non-increasing). */
    int i = 0;
    for (int s = 0; s < k - 1; s++) {
        start[s] = i;
        int j = i + 1;
        while (need[j] > k - s - 1)
            j++;
        i = j;
    }
    start[k - 1] = i;
    start[k] = P;
}

size_t manifest_piece_cost(const manifest_t *m, const param_table_t *tab, int piece)
{
    size_t b, e;
    params_piece_range(tab, piece, piece + 1, &b, &e);
    if (piece == 0) /* the embedding: a lookup */
        return 0;
    if (piece == m->model.n_layers + 1) /* the norm and the head */
        return e - b;
    return (e - b) + (size_t)m->seq_len * m->model.dim; /* a layer: causal attention's half of 2 T D */
}

#define RANK_SPLITS_MAX 2000000 /* splits tried one by one for several stages per rank; more: per stage */

/* Binomial C(n, k), saturating at limit + 1. */
static double splits(int n, int k, double limit)
{
    double c = 1;
    for (int i = 1; i <= k && c <= limit; i++)
        c = c * (n - k + i) / i;
    return c;
}

/* Several virtual stages per rank: the contiguous split of w[0, P) into S stages whose largest
 * rank (the sum of its stages' costs) is least, then whose largest stage is, then the earliest,
 * found by trying every split (at most RANK_SPLITS_MAX of them; returns -1 beyond). */
static int rank_balanced_split(const manifest_t *m, const size_t *w, int P, int S, int *best)
{
    if (splits(P - 1, S - 1, RANK_SPLITS_MAX) > RANK_SPLITS_MAX)
        return -1;
    size_t pre[MANIFEST_MAX_PP * 4 + 3], rank[MANIFEST_MAX_PP], best_rank = SIZE_MAX, best_stage = SIZE_MAX;
    int start[MANIFEST_MAX_PP + 1];
    sched_placement_t placement = (sched_placement_t)sched_kind_placement(m->schedule); /* a checked kind */
    if (P + 1 > (int)(sizeof(pre) / sizeof(pre[0])))
        return -1;
    pre[0] = 0;
    for (int i = 0; i < P; i++)
        pre[i + 1] = pre[i] + w[i];
    for (int s = 0; s < S; s++)
        start[s] = s;
    start[S] = P;
    for (;;) {
        size_t worst_rank = 0, worst_stage = 0;
        memset(rank, 0, sizeof(size_t) * (size_t)m->pp);
        for (int s = 0; s < S; s++) {
            size_t c = pre[start[s + 1]] - pre[start[s]];
            worst_stage = c > worst_stage ? c : worst_stage;
            size_t *r = &rank[sched_placement_rank(placement, m->pp, s, NULL)];
            *r += c;
            worst_rank = *r > worst_rank ? *r : worst_rank;
        }
        if (worst_rank < best_rank || (worst_rank == best_rank && worst_stage < best_stage)) {
            best_rank = worst_rank, best_stage = worst_stage;
            memcpy(best, start, sizeof(int) * (size_t)(S + 1));
        }
        int s = S - 1; /* the next starts 1 .. S-1 in lexicographic order */
        while (s >= 1 && start[s] == P - (S - s))
            s--;
        if (s < 1)
            return 0;
        start[s]++;
        for (int t = s + 1; t < S; t++)
            start[t] = start[t - 1] + 1;
    }
}

int manifest_vstages(const manifest_t *m)
{
    if (m->layers_per_stage > 0 && m->pp > 0)
        return m->model.n_layers / m->layers_per_stage / m->pp;
    int lo, hi, dflt;
    return sched_kind_vstages(m->schedule, &lo, &hi, &dflt) ? 1 : dflt;
}

int manifest_loader_slots(const manifest_t *m)
{
    int shared = m->pp == 1 || sched_kind_placement(m->schedule) == SCHED_V || m->dp_shard > 1;
    return shared && m->microbatches > m->prefetch ? m->microbatches : m->prefetch;
}

int manifest_stage_pieces(const manifest_t *m, int stage, int *p0, int *p1)
{
    int P = m->model.n_layers + 2, pp = m->pp * manifest_vstages(m), L = m->layers_per_stage;
    if (L > 0) { /* layers [stage * L, (stage + 1) * L), piece = layer + 1 */
        *p0 = stage == 0 ? 0 : stage * L + 1;
        *p1 = stage == pp - 1 ? P : (stage + 1) * L + 1;
        return 0;
    }
    if (m->n_split_points > 0) {
        *p0 = stage == 0 ? 0 : m->split_points[stage - 1] + 1;
        *p1 = stage == pp - 1 ? P : m->split_points[stage] + 1;
        return 0;
    }
    int k = pp < P ? pp : P, start[MANIFEST_MAX_PP + 1];
    if (k > MANIFEST_MAX_PP)
        k = MANIFEST_MAX_PP;
    if (stage >= k) { /* only for an unvalidated pp beyond the pieces */
        *p0 = *p1 = P;
        return 0;
    }
    /* every process must find the same split: no fallback when memory is short, an error */
    size_t *w = malloc((2 * (size_t)P + 1) * sizeof(*w));
    int *need = malloc(((size_t)P + 1) * sizeof(*need));
    param_table_t tab;
    int rc = w && need && !params_table_init(&tab, &m->model) ? 0 : -ENOMEM;
    if (!rc) {
        for (int i = 0; i < P; i++)
            w[i] = manifest_piece_cost(m, &tab, i);
        params_table_free(&tab);
        if (k == m->pp || rank_balanced_split(m, w, P, k, start)) /* one stage per rank: the ranks' own */
            balanced_split(w, P, k, start, w + P, need);
        *p0 = start[stage];
        *p1 = start[stage + 1];
    }
    free(w);
    free(need);
    return rc;
}

/* path, under job.dump_folder unless absolute. */
static void under_dump(const manifest_t *m, const char *path, char *buf, size_t n)
{
    if (path[0] == '/')
        snprintf(buf, n, "%s", path);
    else
        snprintf(buf, n, "%s/%s", m->dump_folder, path);
}

void manifest_ckpt_folder(const manifest_t *m, char *buf, size_t n) { under_dump(m, m->ckpt_folder, buf, n); }

void manifest_tb_folder(const manifest_t *m, char *buf, size_t n) { under_dump(m, m->tb_folder, buf, n); }

void manifest_shard_range(size_t total, int shards, int k, size_t *begin, size_t *end)
{
    /* The extra blocks go to the last shards, so the short last block evens out instead of
     * widening the gap: float counts then also differ by at most one block. */
    size_t nb = (total + MANIFEST_BLOCK - 1) / MANIFEST_BLOCK, K = (size_t)shards;
    size_t base = nb / K, rem = nb % K, first_big = K - rem;
    size_t b0 = (size_t)k * base + ((size_t)k > first_big ? (size_t)k - first_big : 0);
    size_t b1 = ((size_t)k + 1) * base + ((size_t)k + 1 > first_big ? (size_t)k + 1 - first_big : 0);
    *begin = b0 * MANIFEST_BLOCK < total ? b0 * MANIFEST_BLOCK : total;
    *end = b1 * MANIFEST_BLOCK < total ? b1 * MANIFEST_BLOCK : total;
}
