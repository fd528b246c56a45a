/* The data plane's part in the coordinator (see coord_plane.h): what the job's transport needs
 * made once per run (plane_boot_make: NCCL's communicator ids, whose bootstrap roots this
 * process hosts), and each stage's share of it, sent right after its config (MSG_NCCL). */
#include "stages/coord/coord_plane.h"

#include <stdlib.h>

#include "stages/coord/coord_ctl.h"
#include "stages/runtime/plane.h"

int coord_make_boot(coord_t *c, char *err, size_t errlen)
{
    free(c->boot);
    c->boot = NULL;
    c->boot_len = 0;
    return plane_boot_make(plane_transport(&c->lay), &c->lay, &c->boot, &c->boot_len, err, errlen);
}

/* A stage said hello: its share of c->boot, when it has one. */
static void send_boot(coord_t *c, coord_proc_t *p)
{
    uint8_t buf[1024];
    if (!c->boot || p->role != COORD_STAGE)
        return;
    long n = plane_boot_share(plane_transport(&c->lay), &c->lay, c->boot, p->replica, p->rank, buf, sizeof(buf));
    if (n <= 0)
        return;
    msg_t m = {.type = MSG_NCCL, .data = buf, .data_len = (size_t)n};
    coord_send(c, p, &m);
}

void coord_plane_init(coord_t *c) { coord_on_hello(c, send_boot); }
