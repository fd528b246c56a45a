/* `ctitan loader swap` (see coord_priv.h): the request is taken at any time and carried out
 * at the next step boundary, when the stages and shards are idle: the old loader stops, the
 * rings are emptied, the new one starts from the boundary's cursor; if it does not become
 * ready, the old one comes back. */
#include "stages/coord_priv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ipc/log.h"
#include "stages/ldr_seg.h"

void coord_on_swap(coord_t *c, coord_proc_t *p, const char *from, const msg_t *m)
{
    if (c->swap_pending) {
        coord_reply_cli(c, from, 0, "a loader swap is already pending");
    } else if (!m->text || !m->text[0] || strlen(m->text) >= sizeof(c->swap_cmd)) {
        coord_reply_cli(c, from, 0, "swap: the command is empty or too long");
    } else {
        c->swap_pending = 1;
        snprintf(c->swap_cmd, sizeof(c->swap_cmd), "%s", m->text);
        snprintf(c->swap_from, sizeof(c->swap_from), "%s", from);
        LOG_I("loader swap requested by %s: '%s' (at the end of step %lld)", from, m->text, (long long)c->step + 1);
    }
}

static int loader_settled(coord_t *c, void *arg) { return coord_loader(c)->ready || c->trial_failed; }

void coord_do_swap(coord_t *c)
{
    c->swap_pending = 0;
    int64_t next = c->step + 1;
    if (next >= c->m->steps) {
        coord_reply_cli(c, c->swap_from, 0, "the job ended at step %lld before the swap", (long long)next);
        return;
    }
    coord_proc_t *L = coord_loader(c);
    coord_stop_proc(c, L);
    if (c->failed || c->interrupted)
        return;
    char old[sizeof(c->loader_cmd)];
    snprintf(old, sizeof(old), "%s", c->loader_cmd);
    for (int attempt = 0; attempt < 2; attempt++) {
        if (ldr_seg_prepare_swap(shm_data(c->seg_batch), next)) {
            coord_fail(c, "loader swap: no loader cursor recorded for step %lld", (long long)next);
            return;
        }
        snprintf(c->loader_cmd, sizeof(c->loader_cmd), "%s", attempt == 0 ? c->swap_cmd : old);
        c->trial = attempt == 0;
        c->trial_failed = 0;
        coord_spawn(c, L);
        int rc = coord_pump(c, loader_settled, NULL, COORD_STARTUP_TIMEOUT_S);
        c->trial = 0;
        if (rc == 0 && L->ready) {
            if (attempt == 0) {
                LOG_I("loader swapped after step %lld: '%s' (pid %d)", (long long)next, c->loader_cmd, (int)L->pid);
                coord_reply_cli(c, c->swap_from, 1, "loader swapped after step %lld: '%s' (pid %d)",
                                (long long)next, c->loader_cmd, (int)L->pid);
            }
            return;
        }
        if (c->failed || c->interrupted)
            return;
        if (attempt == 1) {
            coord_fail(c, "loader swap failed and the previous loader did not come back either");
            return;
        }
        if (rc == -ETIMEDOUT)
            snprintf(c->trial_why, sizeof(c->trial_why), "the new loader did not become ready in %.0f s",
                     COORD_STARTUP_TIMEOUT_S);
        LOG_W("loader swap failed: %s; back to the previous loader", c->trial_why);
        coord_reply_cli(c, c->swap_from, 0, "loader swap failed: %s; the previous loader continues", c->trial_why);
        coord_stop_proc(c, L);
        if (c->failed || c->interrupted)
            return;
    }
}
