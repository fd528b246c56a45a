/* [profiling] trace_file: the run's timeline (coord_trace.c; stages/runtime/trace.h the file).
 * Each does nothing without a trace file. */
#ifndef CTITAN_COORD_TRACE_H
#define CTITAN_COORD_TRACE_H

#include "stages/coord/coord_core.h"

/* MSG_TRACE into the registry. Returns 0 or -ENOMEM. */
int coord_trace_init(coord_t *c);
/* Opens the trace file (a relaunch appends to its run before). Returns 0 or -errno with err. */
int coord_trace_open(coord_t *c, char *err, size_t errlen);
/* A round of processes [first, first + count) that ran from t0 to t1: a slice on the
 * coordinator's track, and each process's work (its reply's t_busy, ending when it came). */
void coord_trace_round(coord_t *c, const char *name, int first, int count, double t0, double t1);
/* Process p's work of `busy` seconds that ended now (a snapshot, a checkpoint's write). */
void coord_trace_work(coord_t *c, coord_proc_t *p, const char *name, double busy);
/* After step c->step: the schedule's ideal placement with the step's measured action times
 * (t[rank] = F, B, W seconds), on every stage's second track from the step's start; flushed (a
 * failure is said once, and the trace given up). */
void coord_trace_step(coord_t *c, const double (*t)[3]);
/* The file closed, the state freed. */
void coord_trace_close(coord_t *c);

#endif
