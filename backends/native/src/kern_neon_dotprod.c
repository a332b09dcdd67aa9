/* kern_neon_dotprod.c: NEON kernels with the Armv8.2 dot product (compiled with
 * -march=armv8.2-a+dotprod; chosen at run time when HWCAP_ASIMDDP is set). kern_neon.c but for
 * the block sum: vdotq_s32 adds four int8 products into each int32 lane. Twin: kern_scalar.c.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <arm_neon.h>

#include <math.h>

#include "kernels.h"

#define NEON_TABLE ml_kernels_neon_dotprod
#define NEON_NAME "neon-dotprod"

static inline int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t x) { return vdotq_s32(acc, w, x); }

#include "kern_neon_common.h"
