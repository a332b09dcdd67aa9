/* bitnet.h: what the sources of the bitnet runtime share. The ABI is the I2_S and embeddings
 * groups of backends/native/include/mlrt.h (plus ml_version, ml_isa, ml_set_isa); the thread pool
 * and the f16 conversion are the native runtime's infrastructure files (pool.c, f16.c), compiled
 * into this library too (build.py LIBRARIES). No math of the native runtime is used. */
#ifndef MLBITNET_H
#define MLBITNET_H

#include <stddef.h>
#include <stdint.h>

#include "../../native/include/mlrt.h"
#include "../../native/src/util.h"
#include "i2s_kernels.h"

/* native/src/f16.c: float -> IEEE binary16 bits, rounded to nearest even (the other way,
 * ml_f16_to_f32, is declared in i2s_kernels.h). */
uint16_t ml_f32_to_f16(float f);

/* i2s_api.c: spec `ternarize` and `layout` of n finite floats (n % 128 == 0): the packed codes
 * (n / 4 bytes) and the stored scale d, as ml_i2s_quantize writes them. */
void i2s_ternarize(const float *w, size_t n, uint8_t *packed, float *d);

/* native/src/pool.c: run fn(arg, i0, i1) over [0, n) split in contiguous ranges across threads. */
struct ml_pool;
struct ml_pool *ml_pool_new(int threads);
void ml_pool_free(struct ml_pool *p);
void ml_pool_run(struct ml_pool *p, int64_t n, void (*fn)(void *arg, int64_t i0, int64_t i1), void *arg);

#endif
