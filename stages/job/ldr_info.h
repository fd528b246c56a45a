/* What a loader is told by the job (stages/runtime/ldr.h is the loader's library, stages/job/ldr_seg.h
 * the segment that carries it): the shapes, the seed, where to start, and the largest cursor. */
#ifndef CTITAN_LDR_INFO_H
#define CTITAN_LDR_INFO_H

#include <stdint.h>

#define LDR_CURSOR_MAX 240

typedef struct {
    int dp;                /* data-parallel replicas */
    int microbatches;      /* per replica per step */
    int seqs;              /* sequences per microbatch */
    int seq_len;           /* tokens per sequence */
    int vocab_size;        /* every token and target id must be below it */
    int shuffle;           /* [loader] shuffle */
    uint64_t seed;         /* [training] seed */
    int64_t first_step;    /* the step ldr_next starts at */
    int64_t steps;         /* [training] steps: ldr_next hands out steps [first_step, steps) */
    char dataset_path[512];/* [loader] dataset_path */
    int replica0, replicas;/* the replicas this host's stages run (job.hosts > 1: a part of dp);
                            * microbatches of the others are produced but dropped */
} ldr_info_t;

#endif
