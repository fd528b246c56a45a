/* What the coordinator tells the user (coord_report.c): the data check, the launch banner, one
 * progress line and one metrics record per step (and TensorBoard events), and at the end the
 * validation loss and a sample from the final weights. */
#ifndef CTITAN_COORD_REPORT_H
#define CTITAN_COORD_REPORT_H

#include <stdio.h>

#include "stages/coord/coord_core.h"

/* Its state. Returns 0 or -ENOMEM. */
int coord_report_init(coord_t *c);
/* The data files before any process starts, so a wrong path is one clear error. Returns 0 or
 * -errno with err. */
int coord_check_data(coord_t *c, char *err, size_t errlen);
/* The metrics file (a supervisor's relaunch appends) and the TensorBoard event file (a path that
 * cannot be written fails the launch now, not after training). Returns 0 or -errno with err. */
int coord_report_open(coord_t *c, char *err, size_t errlen);
/* "launch: job ...": the model, the topology, the processes, the data; and the peak MFU is
 * against (metrics.peak_tflops, else stages/report/peak_cache.h's) and where it is from. */
void coord_banner(coord_t *c);
/* The progress line and the metrics record of step c->step. */
void coord_report_step(coord_t *c, double norm, double t_step, double t_reduce, double t_update);
/* "done: ...", the validation loss and a sample, from replica 0's final weights. */
void coord_end_of_run(coord_t *c, int64_t first, double secs);
/* The metrics file, for another record (a recovery's), or NULL. */
FILE *coord_report_metrics(coord_t *c);
/* The files closed, the state freed. */
void coord_report_close(coord_t *c);

#endif
