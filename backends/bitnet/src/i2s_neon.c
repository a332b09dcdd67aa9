/* i2s_neon.c: NEON (ASIMD, baseline on aarch64) I2_S kernels. Twin: i2s_scalar.c, which states
 * the rules (specs/i2s.yaml).
 *
 * quantize_act: the scalar twin's float32 operations four lanes at a time. vrndaq_f32 (FRINTA) is
 * C round() exactly: to nearest, ties away from zero. amax is a max of |x| (no NaN: inputs are
 * finite), exact in any order. The pragma keeps t = x * a one rounding (aarch64 always has FMA).
 *
 * Dots: the 2-bit codes (0..3 as stored: code 3 is not rejected here) are unpacked with byte
 * shifts and masks; vmull_s8 / vmlal_s8 widen code * x products (|.| <= 3 * 128 = 384) into int16
 * lanes, 16 products per lane per block (<= 6144, no overflow for any bytes), and vpadalq_s16
 * adds pairs into int32 once per block. Exact integer sums, identical to the scalar twin.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <arm_neon.h>
#include <math.h>

#include "i2s_kernels.h"

static inline int32x4_t quant4(float32x4_t x, float32x4_t a) {
    float32x4_t t = vmulq_f32(x, a);
    float32x4_t r = vrndaq_f32(t);
    r = vminq_f32(vmaxq_f32(r, vdupq_n_f32(-128.0f)), vdupq_n_f32(127.0f));
    return vcvtq_s32_f32(r); /* r is an integer: exact */
}

static float quantize_act(const float *x, int n, int8_t *q, int32_t *sum) {
    float32x4_t m4 = vdupq_n_f32(0.0f);
    int k = 0;
    for (; k + 4 <= n; k += 4) m4 = vmaxq_f32(vabsq_f32(vld1q_f32(x + k)), m4);
    float amax = vmaxvq_f32(m4);
    for (; k < n; k++) {
        float v = fabsf(x[k]);
        amax = v > amax ? v : amax;
    }
    double m = (double)amax > 1e-5 ? (double)amax : 1e-5;
    float a = (float)(127.0 / m);
    const float32x4_t av = vdupq_n_f32(a);
    int32x4_t s4 = vdupq_n_s32(0);
    for (k = 0; k + 16 <= n; k += 16) {
        int32x4_t i0 = quant4(vld1q_f32(x + k), av), i1 = quant4(vld1q_f32(x + k + 4), av);
        int32x4_t i2 = quant4(vld1q_f32(x + k + 8), av), i3 = quant4(vld1q_f32(x + k + 12), av);
        s4 = vaddq_s32(s4, vaddq_s32(vaddq_s32(i0, i1), vaddq_s32(i2, i3)));
        int16x8_t h0 = vcombine_s16(vqmovn_s32(i0), vqmovn_s32(i1));
        int16x8_t h1 = vcombine_s16(vqmovn_s32(i2), vqmovn_s32(i3));
        vst1q_s8(q + k, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
    }
    int32_t s = vaddvq_s32(s4);
    for (; k < n; k++) {
        float t = x[k] * a;
        float r = roundf(t);
        r = r > 127.0f ? 127.0f : r < -128.0f ? -128.0f : r;
        q[k] = (int8_t)r;
        s += q[k];
    }
    *sum = s;
    return a;
}

/* The eight code vectors of one block: c[2g + h] are the codes of activation bytes
 * 32g + 16h .. 32g + 16h + 15 (group g = bits 7..6, 5..4, 3..2, 1..0; half h = bytes 16h..). */
static inline void unpack(const uint8_t *w, int8x16_t c[8]) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int h = 0; h < 2; h++) {
        uint8x16_t v = vld1q_u8(w + 16 * h);
        c[0 + h] = vreinterpretq_s8_u8(vshrq_n_u8(v, 6));
        c[2 + h] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(v, 4), m3));
        c[4 + h] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(v, 2), m3));
        c[6 + h] = vreinterpretq_s8_u8(vandq_u8(v, m3));
    }
}

/* acc + the block sum of codes c against the 128 activations x (int32 lanes) */
static inline int32x4_t block(int32x4_t acc, const int8x16_t c[8], const int8_t *x) {
    int8x16_t x0 = vld1q_s8(x);
    int16x8_t p = vmull_s8(vget_low_s8(c[0]), vget_low_s8(x0));
    p = vmlal_high_s8(p, c[0], x0);
    for (int i = 1; i < 8; i++) {
        int8x16_t xi = vld1q_s8(x + 16 * i);
        p = vmlal_s8(p, vget_low_s8(c[i]), vget_low_s8(xi));
        p = vmlal_high_s8(p, c[i], xi);
    }
    return vpadalq_s16(acc, p);
}

static int32_t dot(int n, const uint8_t *w, const int8_t *x) {
    int32x4_t acc = vdupq_n_s32(0);
    int8x16_t c[8];
    for (int b = 0; b < n / I2S_BLOCK; b++) {
        unpack(w + (size_t)b * I2S_BLOCK_BYTES, c);
        acc = block(acc, c, x + (size_t)b * I2S_BLOCK);
    }
    return vaddvq_s32(acc);
}

static void dot4(int n, const uint8_t *w, const int8_t *const x[4], int32_t out[4]) {
    int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    int8x16_t c[8];
    for (int b = 0; b < n / I2S_BLOCK; b++) {
        unpack(w + (size_t)b * I2S_BLOCK_BYTES, c);
        for (int t = 0; t < 4; t++) acc[t] = block(acc[t], c, x[t] + (size_t)b * I2S_BLOCK);
    }
    for (int t = 0; t < 4; t++) out[t] = vaddvq_s32(acc[t]);
}

static void dot_rows4(int n, const uint8_t *w, const int8_t *x, int32_t out[4]) {
    const size_t rs = (size_t)(n / 4);
    int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    int8x16_t c[8];
    for (int b = 0; b < n / I2S_BLOCK; b++) {
        /* the next four rows, two lines ahead per block, as the AVX2 twin (a hint: never faults) */
        __builtin_prefetch(w + 4 * rs + 128 * (size_t)b);
        __builtin_prefetch(w + 4 * rs + 128 * (size_t)b + 64);
        for (int t = 0; t < 4; t++) {
            unpack(w + (size_t)t * rs + (size_t)b * I2S_BLOCK_BYTES, c);
            acc[t] = block(acc[t], c, x + (size_t)b * I2S_BLOCK);
        }
    }
    for (int t = 0; t < 4; t++) out[t] = vaddvq_s32(acc[t]);
}

/* Float dots: lanes 0..3 and 4..7 of the twin's eight running sums in two float32x4_t, multiply
 * then add (no FMA: the pragma), leftovers and the combination as the twin (i2s_kernels.h).
 * vcvt_f32_f16 widens f16 exactly. */
static float dot_f16(int n, const uint16_t *w, const float *x) {
    float32x4_t a0 = vdupq_n_f32(0), a1 = vdupq_n_f32(0);
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(w + k));
        a0 = vaddq_f32(a0, vmulq_f32(vcvt_f32_f16(vget_low_f16(h)), vld1q_f32(x + k)));
        a1 = vaddq_f32(a1, vmulq_f32(vcvt_high_f32_f16(h), vld1q_f32(x + k + 4)));
    }
    float s[8];
    vst1q_f32(s, a0), vst1q_f32(s + 4, a1);
    return i2s_f16_dot_end(k, n, w, x, s);
}

static float dot_f32(int n, const float *w, const float *x) {
    float32x4_t a0 = vdupq_n_f32(0), a1 = vdupq_n_f32(0);
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        a0 = vaddq_f32(a0, vmulq_f32(vld1q_f32(w + k), vld1q_f32(x + k)));
        a1 = vaddq_f32(a1, vmulq_f32(vld1q_f32(w + k + 4), vld1q_f32(x + k + 4)));
    }
    float s[8];
    vst1q_f32(s, a0), vst1q_f32(s + 4, a1);
    return i2s_f32_dot_end(k, n, w, x, s);
}

const i2s_kernel_table i2s_kernels_neon = {
    .name = "neon",
    .quantize_act = quantize_act,
    .dot = dot,
    .dot4 = dot4,
    .dot_rows4 = dot_rows4,
    .dot_f16 = dot_f16,
    .dot_f32 = dot_f32,
    .epilogue = i2s_scalar_epilogue, /* the element-wise and attention kernels: the twin's */
    .act_mul = i2s_scalar_act_mul,
    .norm_mul = i2s_scalar_norm_mul,
    .att_scores = i2s_scalar_att_scores,
    .att_softmax = i2s_scalar_att_softmax,
    .att_pv = i2s_scalar_att_pv,
};
