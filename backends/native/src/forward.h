/* forward.h: what forward.c offers the rest of the runtime besides model.h's
 * ml_forward_init / ml_forward_free and mlrt.h's ml_forward / ml_imatrix_start / ml_imatrix_get. */
#ifndef MLRT_FORWARD_H
#define MLRT_FORWARD_H

#include "model.h"

/* Forget every position: filled = 0 and the linear-attention state (conv inputs, S) zeroed.
 * The KV cache is left as it is: positions at or past `filled` are never read. ml_reset calls it.
 * The importance-matrix sums, if collecting, are kept (they add over resets, as llama-imatrix). */
void ml_forward_reset(struct ml_model *m);

/* Bytes ml_forward_init allocated for the run-time state (KV cache, linear-attention state,
 * scratch); 0 without one. The bound it keeps is decision runtime.memory_bound. */
size_t ml_forward_state_bytes(const struct ml_model *m);

#endif
