/* `ctitan bench` section for the process pipeline: real `ctitan launch` jobs on synthetic
 * tokens, measured against the schedule's ideal (sched_simulate with the per-action times the
 * stages measured in the same run), and the control plane's cost per step. */
#ifndef CTITAN_BENCH_PIPELINE_H
#define CTITAN_BENCH_PIPELINE_H

/* Prints markdown tables. peak_gflops: the sgemm peak MFU is reported against. Returns 0
 * or -1 when a job failed (its output is printed). */
int bench_pipeline(double peak_gflops, int quick);

/* Every schedule at pp 1 (1F1B), 2 and (not quick) 4 for 1, 2, 4 and 8 microbatches of the same
 * jobs: step time against its own simulated ideal, the bubble measured, simulated and in theory,
 * the activations kept; then the best zero-bubble schedule against pp 1 and 1F1B. Markdown;
 * returns 0 or -1 when a job failed. */
int bench_schedules(double peak_gflops, int quick);

/* Writes DIR/tokens.bin: n uniformly random tokens below vocab (a fixed seed), for bench jobs.
 * Returns 0 or -1 (said on stderr). */
int bench_random_tokens(const char *dir, int n, int vocab);

#endif
