/* `ctitan loader swap` (coord_swap.c): the request, from the operator alone, taken at any time
 * and carried out at the next step boundary. */
#ifndef CTITAN_COORD_SWAP_H
#define CTITAN_COORD_SWAP_H

#include "stages/coord/coord_core.h"

/* The operator's swap requests into the registry. Returns 0 or -ENOMEM. */
int coord_swap_init(coord_t *c);
void coord_swap_free(coord_t *c);
/* Whether a swap waits for the step boundary. */
int coord_swap_due(const coord_t *c);
/* Replaces the loader at the boundary after step c->step (stages and shards are idle). */
void coord_do_swap(coord_t *c);

#endif
