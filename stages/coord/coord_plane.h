/* What the data plane's transport needs from the coordinator (coord_plane.c). */
#ifndef CTITAN_COORD_PLANE_H
#define CTITAN_COORD_PLANE_H

#include "stages/coord/coord_core.h"

/* Each stage's share, sent right after its config, into the registry. */
void coord_plane_init(coord_t *c);
/* c->boot made anew (plane_boot_make; at a rewind the old communicators died with their
 * ranks). Returns 0 or -errno with err. */
int coord_make_boot(coord_t *c, char *err, size_t errlen);

#endif
