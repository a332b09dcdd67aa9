/* kern_neon.c: NEON (ASIMD, baseline on aarch64) kernels. Twin: kern_scalar.c.
 *
 * Quantizer: the scalar twin's float32 operations four lanes at a time. vmulq/vaddq must stay two
 * roundings (aarch64 always has FMA, and gcc's vmulq_f32 is a plain `*` it could contract): hence
 * the pragma. max/min are compare-and-select, not vmaxq/vminq, because those propagate NaN where
 * the scalar twin (and x86's maxps) keep the other operand.
 *
 * Integer sums: vmull_s8 widens 8 products to int16 (|w x| <= 127 * 128 fits), vpadalq_s16 adds
 * pairs into int32. Q4_0 nibbles: [bytes & 15 | bytes >> 4] is elements 0..31 in order, minus 8.
 * The dotprod table (kern_neon_dotprod.c) replaces the block sum with two vdotq_s32.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <arm_neon.h>

#include <math.h>

#include "kernels.h"

#define NEON_TABLE ml_kernels_neon
#define NEON_NAME "neon"

/* 4 int32 partial sums of 16 weights x 16 activations */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t x) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w), vget_low_s8(x)));
    return vpadalq_s16(acc, vmull_s8(vget_high_s8(w), vget_high_s8(x)));
}

#include "kern_neon_common.h"
