/* The coordinator's set-up before any process starts (coord_setup.c): the control endpoint,
 * signal handling, and this host's shared segments of the job. */
#ifndef CTITAN_COORD_SETUP_H
#define CTITAN_COORD_SETUP_H

#include "ipc/ring.h"
#include "stages/coord/coord_core.h"

int coord_resolve_endpoint(coord_t *c, char *err, size_t errlen);
/* SIGCHLD, SIGINT, SIGTERM, SIGHUP through c->sigfd. */
int coord_setup_signals(coord_t *c);
/* Reads pending signals: SIGINT, SIGTERM or SIGHUP set c->interrupted. */
void coord_read_signals(coord_t *c);
/* Every segment of this host but the loader's (refuses a job that runs, clears a stale one). */
int coord_make_segments(coord_t *c, char *err, size_t errlen);
/* The loader's segment (made anew: an old one is removed), its rings starting at `step`, whose
 * loader cursor is `cursor` (len 0: the start of the data). */
int coord_make_batch(coord_t *c, int64_t step, const uint8_t *cursor, size_t len, char *err, size_t errlen);
void coord_remove_segments(coord_t *c);
/* fn on every ring between this host's stages (the act segment's), and with `loader` the
 * loader's too. */
void coord_each_ring(coord_t *c, void (*fn)(ring_t *r), int loader);
/* Every ring of the act segment empty, from step 0. */
void coord_reset_rings(coord_t *c);

#endif
