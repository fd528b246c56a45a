/* The NCCL data plane's communicator ids (see coord_priv.h): the coordinator makes every id
 * (ncclGetUniqueId: it hosts each communicator's bootstrap root) and hands each stage the ids
 * of the communicators it joins over the control plane, right after its config. */
#include "stages/coord/coord_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/util.h"
#include "kernels/cuda_plugin.h"

/* kind 0: the activation communicator of (replica, boundary), 1: its gradient one, 2: the
 * replicas' communicator of pipeline rank `boundary_or_rank`. */
static cuda_nccl_id_t *nccl_id(coord_t *c, int kind, int replica, int boundary_or_rank)
{
    int pp = c->m->pp, dp = c->m->dp;
    size_t i = kind < 2 ? ((size_t)replica * (pp - 1) + boundary_or_rank) * 2 + kind
                        : (size_t)dp * (pp - 1) * 2 + boundary_or_rank;
    return &c->nccl_ids[i];
}

int coord_make_nccl_ids(coord_t *c, char *err, size_t errlen)
{
    const manifest_t *m = c->m;
    size_t n = (size_t)m->dp * (m->pp - 1) * 2 + m->pp;
    char why[512];
    const cuda_plugin_t *cu = cuda_plugin_load(why, sizeof(why));
    if (!cu)
        return util_fail(err, errlen, -ENODEV, "parallelism.data_plane = \"nccl\": %s", why);
    if (!(c->nccl_ids = calloc(n, sizeof(cuda_nccl_id_t))))
        return util_fail(err, errlen, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (cu->nccl_id(&c->nccl_ids[i]))
            return util_fail(err, errlen, -EIO, "parallelism.data_plane = \"nccl\": %s", cu->last_error());
    return 0;
}

/* The communicators stage (rank, replica) joins, as MSG_NCCL's data (stages/job/job.h's order). */
void coord_send_nccl_ids(coord_t *c, coord_proc_t *p)
{
    cuda_nccl_id_t ids[JOB_NCCL_COMMS];
    int s = p->rank, r = p->replica, pp = c->m->pp;
    memset(ids, 0, sizeof(ids));
    if (s > 0) {
        ids[JOB_NCCL_ACT_IN] = *nccl_id(c, 0, r, s - 1);
        ids[JOB_NCCL_GRAD_OUT] = *nccl_id(c, 1, r, s - 1);
    }
    if (s < pp - 1) {
        ids[JOB_NCCL_ACT_OUT] = *nccl_id(c, 0, r, s);
        ids[JOB_NCCL_GRAD_IN] = *nccl_id(c, 1, r, s);
    }
    ids[JOB_NCCL_DP] = *nccl_id(c, 2, 0, s);
    msg_t m = {.type = MSG_NCCL, .data = (uint8_t *)ids, .data_len = sizeof(ids)};
    coord_send(c, p, &m);
}
