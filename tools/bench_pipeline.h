/* `ctitan bench` section for the process pipeline: real `ctitan launch` jobs on synthetic
 * tokens, measured against the schedule's ideal (sched_simulate with the per-action times the
 * stages measured in the same run), and the control plane's cost per step. */
#ifndef CTITAN_BENCH_PIPELINE_H
#define CTITAN_BENCH_PIPELINE_H

/* Prints markdown tables. peak_gflops: the sgemm peak MFU is reported against. Returns 0
 * or -1 when a job failed (its output is printed). */
int bench_pipeline(double peak_gflops, int quick);

/* Writes DIR/tokens.bin: n uniformly random tokens below vocab (a fixed seed), for bench jobs.
 * Returns 0 or -1 (said on stderr). */
int bench_random_tokens(const char *dir, int n, int vocab);

#endif
