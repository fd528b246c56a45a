/* The whole Llama model in plain double precision, built from the reference ops: the
 * yardstick for the CPU model's loss and gradients, and itself checked by finite
 * differences on tiny configs. Slow by design; no threads. */
#ifndef CTITAN_MODEL_REF_H
#define CTITAN_MODEL_REF_H

#include <stdint.h>

#include "kernels/config.h"
#include "kernels/params.h"

/* Returns the sum over the B*T tokens of the cross-entropy loss. When grads is not NULL,
 * adds d(dscale * sum)/d(params) into grads (flat layout of tab). Returns NAN on ENOMEM. */
double ref_model_loss(const model_config_t *cfg, const param_table_t *tab, const double *params,
                      double *grads, const int32_t *tokens, const int32_t *targets, int B, int T,
                      double dscale);

#endif
