/* `ctitan bench` section for checkpoints: the checkpoint write path (plan, checksums,
 * io_uring, fsyncs, rename) against the raw sequential write rate of the same disk measured
 * in the same run, and the training stall per checkpoint of real `ctitan launch` jobs of the
 * demo model (the extra time of the steps after a checkpoint over their neighbours). */
#ifndef CTITAN_BENCH_CKPT_H
#define CTITAN_BENCH_CKPT_H

/* Prints markdown. Returns 0 or -1 when something failed (said on stderr). */
int bench_ckpt(int quick);

#endif
