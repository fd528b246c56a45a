/* `ctitan loader swap` (see coord_swap.h): the request, from the operator alone (the registry's
 * rule), is taken at any time and carried out at the next step boundary, when the stages and
 * shards are idle: the old loader stops, the rings are emptied, the new one starts from the
 * boundary's cursor, on trial (coord_core.h: its failure is not the job's); if it does not
 * become ready, the old one comes back. The command is an argument vector (ipc/argv.h), exec'ed
 * as it is: no shell ever sees it. */
#include "stages/coord/coord_swap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/log.h"
#include "stages/coord/coord_ctl.h"
#include "stages/coord/coord_proc.h"
#include "stages/job/ldr_seg.h"

struct coord_swap {
    int pending;
    uint8_t argv[ARGV_MAX_BYTES];     /* the swap asked for, packed */
    size_t argv_len;
    char from[CTL_ROUTE_MAX];         /* the operator's socket, for the answer */
};

int coord_swap_due(const coord_t *c) { return c->swap->pending; }

static const char *on_swap(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    struct coord_swap *w = c->swap;
    argv_t a;
    char err[256], shown[512];
    if (w->pending) {
        coord_reply_cli(c, from->route, 0, "a loader swap is already pending");
    } else if (argv_unpack(m->data, m->data_len, &a, err, sizeof(err))) {
        coord_reply_cli(c, from->route, 0, "swap: %s", err);
    } else {
        w->pending = 1;
        argv_pack(&a, w->argv, &w->argv_len); /* fits: unpack checked the size */
        snprintf(w->from, sizeof(w->from), "%s", from->route);
        LOG_I("loader swap requested by the operator: %s (at the end of step %lld)",
              argv_show(&a, shown, sizeof(shown)), (long long)c->step + 1);
        argv_free(&a);
    }
    return NULL;
}

/* The swap of before issue 12 carried a command for a shell: answered, never run. */
static const char *on_shell_swap(coord_t *c, coord_proc_t *p, const ctl_peer_t *from, const msg_t *m)
{
    coord_reply_cli(c, from->route, 0, "swap: refused: a loader command is an argument vector (swap_argv), never "
                    "a shell command; use this version's `ctitan loader swap`");
    return NULL;
}

int coord_swap_init(coord_t *c)
{
    if (!(c->swap = calloc(1, sizeof(*c->swap))))
        return -ENOMEM;
    coord_handle(c, MSG_SWAP, COORD_FROM_OPERATOR, on_shell_swap);
    coord_handle(c, MSG_SWAP_ARGV, COORD_FROM_OPERATOR, on_swap);
    return 0;
}

void coord_swap_free(coord_t *c)
{
    free(c->swap);
    c->swap = NULL;
}

/* The loader command, for messages ("the built-in loader" when there is none). */
static const char *loader_shown(coord_t *c, char *buf, size_t n)
{
    argv_t a;
    if (!c->loader_argv_len || argv_unpack(c->loader_argv, c->loader_argv_len, &a, NULL, 0))
        return snprintf(buf, n, "the built-in loader"), buf;
    argv_show(&a, buf, n);
    argv_free(&a);
    return buf;
}

static int loader_settled(coord_t *c, void *arg) { return coord_loader(c)->ready || c->trial.failed; }

void coord_do_swap(coord_t *c)
{
    struct coord_swap *w = c->swap;
    w->pending = 0;
    int64_t next = c->step + 1;
    if (next >= c->m->steps) {
        coord_reply_cli(c, w->from, 0, "the job ended at step %lld before the swap", (long long)next);
        return;
    }
    coord_proc_t *L = coord_loader(c);
    coord_stop_proc(c, L);
    if (c->failed || c->interrupted)
        return;
    uint8_t old[sizeof(c->loader_argv)];
    size_t old_len = c->loader_argv_len;
    memcpy(old, c->loader_argv, old_len);
    char shown[512];
    for (int attempt = 0; attempt < 2; attempt++) {
        if (ldr_seg_prepare_swap(shm_data(c->seg_batch), next)) {
            coord_fail_proc(c, L, "loader swap: no loader cursor recorded for step %lld", (long long)next);
            return;
        }
        c->loader_argv_len = attempt == 0 ? w->argv_len : old_len;
        memcpy(c->loader_argv, attempt == 0 ? w->argv : old, c->loader_argv_len);
        c->trial.p = attempt == 0 ? L : NULL;
        c->trial.failed = 0;
        coord_spawn(c, L);
        int rc = coord_pump(c, loader_settled, NULL, coord_startup_s(c));
        c->trial.p = NULL;
        if (rc == 0 && L->ready) {
            if (attempt == 0) {
                loader_shown(c, shown, sizeof(shown));
                LOG_I("loader swapped after step %lld: %s (pid %d)", (long long)next, shown, (int)L->pid);
                coord_reply_cli(c, w->from, 1, "loader swapped after step %lld: %s (pid %d)", (long long)next,
                                shown, (int)L->pid);
            }
            return;
        }
        if (c->failed || c->interrupted)
            return;
        if (attempt == 1) {
            coord_fail_proc(c, L, "loader swap failed and the previous loader did not come back either");
            return;
        }
        if (rc == -ETIMEDOUT)
            snprintf(c->trial.why, sizeof(c->trial.why), "the new loader did not become ready in %.0f s",
                     coord_startup_s(c));
        LOG_W("loader swap failed: %s; back to the previous loader", c->trial.why);
        coord_reply_cli(c, w->from, 0, "loader swap failed: %s; the previous loader continues", c->trial.why);
        coord_stop_proc(c, L);
        if (c->failed || c->interrupted)
            return;
    }
}
