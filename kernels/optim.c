/* The optimizer table (see optim.h): each row's step calls the backend's kernels. */
#include "kernels/optim.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* torch.optim.AdamW (decoupled weight decay, bias-corrected moments): the backend's adamw. */
static int adamw_step(const backend_t *be, float *const *to, const float *const *from, const float *g, size_t n,
                      const optim_args_t *a, void *stream)
{
    return be->adamw(to[0], to[1], to[2], from[0], from[1], from[2], g, a->gscale, a->gscale_at, n, a->lr, a->beta1,
                     a->beta2, a->eps, a->weight_decay, a->step, a->w_out, a->g_clear, stream);
}

static const optim_t table[] = {
    {.name = "AdamW", .n_state = 2, .state = {"exp_avg", "exp_avg_sq"}, .whole_tensors = 0, .step = adamw_step},
};

const optim_t *optim_find(const char *name)
{
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (!strcasecmp(name, table[i].name))
            return &table[i];
    return NULL;
}

const char *optim_names(char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]) && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s\"%s\"", i ? ", " : "", table[i].name);
    return buf;
}
