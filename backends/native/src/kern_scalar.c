/* kern_scalar.c: the scalar kernels, the twin every SIMD table is tested against.
 *
 * Quantizer (seed "Quantization rule", specs/quant.yaml q8_0): every float32 operation is
 * rounded on its own, in the order written. x * id + copysign(0.5, x) must be two roundings, so
 * the compiler must not fuse it into an FMA: -std=c11 already means -ffp-contract=off for gcc,
 * the pragmas below say so for gcc in GNU mode and for clang (whose default contracts within one
 * expression), and the multiply and the add are separate statements.
 *
 * Non-finite input (refused by ml_quantize_q8_0, and by ml_forward before it quantizes: decision
 * forward.nonfinite) still gets a defined result that every ISA reproduces, so that no input is
 * undefined behaviour: amax ignores NaN like _mm256_max_ps(|x|, acc), a NaN quant becomes -127
 * and +-inf clamp (the comparisons below are exactly max_ps/min_ps's semantics).
 *
 * Dot products: term_b = (wd[b] * xd[b]) * (float)isum_b (isum_b is exact in float: |isum_b| <=
 * 32 * 127 * 127 < 2^24). Every ISA uses the same order so that the dots are bit-identical too:
 * four partial sums, lane k adding the terms of blocks b = k (mod 4) for b < nb - nb % 4, then
 * s = (lane0 + lane1) + (lane2 + lane3), then the remaining nb % 4 terms in block order. The
 * four-row dots (dot4_*) follow that order for each row: out[t] is the single-row dot's bits.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>

#include "kernels.h"

static void quantize_q8_0(const float *x, int n, int8_t *q, float *d) {
    for (int b = 0; b < n / QK; b++, x += QK, q += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            float a = fabsf(x[j]);
            amax = a > amax ? a : amax; /* NaN never wins, as max_ps(a, acc) */
        }
        if (amax < 1e-30f) { /* 127/amax would overflow */
            d[b] = 0.0f;
            for (int j = 0; j < QK; j++) q[j] = 0;
            continue;
        }
        float id = 127.0f / amax;
        d[b] = amax / 127.0f;
        for (int j = 0; j < QK; j++) {
            float v = x[j] * id;
            v = v + copysignf(0.5f, x[j]);
            v = v > -127.0f ? v : -127.0f; /* NaN -> -127, as max_ps(v, -127) */
            v = v < 127.0f ? v : 127.0f;
            q[j] = (int8_t)(int32_t)v; /* conversion truncates: trunc() of the seed */
        }
    }
}

static int32_t isum_q8_0(const int8_t *w, const int8_t *x) {
    int32_t s = 0;
    for (int j = 0; j < QK; j++) s += (int32_t)w[j] * x[j];
    return s;
}

static int32_t isum_q4_0(const uint8_t *w, const int8_t *x) {
    int32_t s = 0;
    for (int j = 0; j < QK / 2; j++) {
        s += ((int32_t)(w[j] & 0x0F) - 8) * x[j];
        s += ((int32_t)(w[j] >> 4) - 8) * x[j + QK / 2];
    }
    return s;
}

static void isums_q8_0(int nb, const int8_t *w, const int8_t *x, int32_t *out) {
    for (int b = 0; b < nb; b++) out[b] = isum_q8_0(w + b * QK, x + b * QK);
}

static void isums_q4_0(int nb, const uint8_t *w, const int8_t *x, int32_t *out) {
    for (int b = 0; b < nb; b++) out[b] = isum_q4_0(w + b * (QK / 2), x + b * QK);
}

static float term(float wd, float xd, int32_t isum) {
    float s = wd * xd;
    return s * (float)isum;
}

/* One statement per rounding: also exact on x87 (-m32), where an expression keeps excess precision. */
static float lanes(const float acc[4]) {
    float s01 = acc[0] + acc[1];
    float s23 = acc[2] + acc[3];
    return s01 + s23;
}

static float dot_q8_0(int nb, const int8_t *w, const float *wd, const int8_t *x, const float *xd) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int b = 0;
    for (; b + 4 <= nb; b += 4)
        for (int k = 0; k < 4; k++)
            acc[k] += term(wd[b + k], xd[b + k], isum_q8_0(w + (b + k) * QK, x + (b + k) * QK));
    float s = lanes(acc);
    for (; b < nb; b++) s = s + term(wd[b], xd[b], isum_q8_0(w + b * QK, x + b * QK));
    return s;
}

static float dot_q4_0(int nb, const uint8_t *w, const float *wd, const int8_t *x, const float *xd) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int b = 0;
    for (; b + 4 <= nb; b += 4)
        for (int k = 0; k < 4; k++)
            acc[k] += term(wd[b + k], xd[b + k],
                                   isum_q4_0(w + (b + k) * (QK / 2), x + (b + k) * QK));
    float s = lanes(acc);
    for (; b < nb; b++) s = s + term(wd[b], xd[b], isum_q4_0(w + b * (QK / 2), x + b * QK));
    return s;
}

/* Four activation rows, each in dot_q8_0's order: out[t] is dot_q8_0(.., x[t], xd[t]) exactly. */
static void dot4_q8_0(int nb, const int8_t *w, const float *wd, const int8_t *const x[4], const float *const xd[4],
                      float out[4]) {
    for (int t = 0; t < 4; t++) out[t] = dot_q8_0(nb, w, wd, x[t], xd[t]);
}

/* Q4_0 block to its 32 signed values: isum_q8_0 of them is isum_q4_0 */
static void unpack_q4_0(const uint8_t *w, int8_t *v) {
    for (int j = 0; j < QK / 2; j++) {
        v[j] = (int8_t)((w[j] & 0x0F) - 8);
        v[j + QK / 2] = (int8_t)((w[j] >> 4) - 8);
    }
}

/* Each block unpacked once for the four rows; every row keeps dot_q4_0's order. */
static void dot4_q4_0(int nb, const uint8_t *w, const float *wd, const int8_t *const x[4], const float *const xd[4],
                      float out[4]) {
    float acc[4][4] = {{0.0f}};
    int8_t v[QK];
    int b = 0;
    for (; b + 4 <= nb; b += 4)
        for (int k = 0; k < 4; k++) {
            unpack_q4_0(w + (b + k) * (QK / 2), v);
            for (int t = 0; t < 4; t++)
                acc[t][k] += term(wd[b + k], xd[t][b + k], isum_q8_0(v, x[t] + (b + k) * QK));
        }
    float s[4];
    for (int t = 0; t < 4; t++) s[t] = lanes(acc[t]);
    for (; b < nb; b++) {
        unpack_q4_0(w + b * (QK / 2), v);
        for (int t = 0; t < 4; t++) s[t] = s[t] + term(wd[b], xd[t][b], isum_q8_0(v, x[t] + b * QK));
    }
    for (int t = 0; t < 4; t++) out[t] = s[t];
}

/* Row r of block b in the packed layout (kernels.h), summed against x's block directly (not
 * through the sum-of-x offset the SIMD tables use, so the twin checks that identity too). */
static int32_t isum_packed_q8_0(const uint8_t *blk, int r, const int8_t *x) {
    int32_t s = 0;
    for (int g = 0; g < 8; g++)
        for (int i = 0; i < 4; i++) s += ((int32_t)blk[32 * g + 4 * r + i] - 128) * x[4 * g + i];
    return s;
}

static int32_t isum_packed_q4_0(const uint8_t *blk, int r, const int8_t *x) {
    int32_t s = 0;
    for (int g = 0; g < 4; g++)
        for (int i = 0; i < 4; i++) {
            int32_t v = blk[32 * g + 4 * r + i];
            s += ((v & 0x0F) - 8) * x[4 * g + i] + ((v >> 4) - 8) * x[QK / 2 + 4 * g + i];
        }
    return s;
}

/* dot_*'s order for each of the 8 rows and nt tokens (xs is for the SIMD tables' offset) */
/* packed scale i: f16 bits (exact in f32) or a float */
static float packed_scale(const void *wd, int wd_f16, size_t i) {
    return wd_f16 ? ml_f16_to_f32(((const uint16_t *)wd)[i]) : ((const float *)wd)[i];
}

static void gemm8(int ng, int nb, const uint8_t *w, const void *wd, int wd_f16, int nt, const int8_t *const *x,
                  const float *const *xd, float *out, size_t ldo, size_t bytes,
                  int32_t (*isum)(const uint8_t *, int, const int8_t *)) {
    for (int g = 0; g < ng; g++) {
        const uint8_t *gw = w + (size_t)g * nb * bytes;
        size_t gd = (size_t)g * nb * ML_PACK; /* the group's first packed scale */
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < ML_PACK; r++) {
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                int b = 0;
                for (; b + 4 <= nb; b += 4)
                    for (int k = 0; k < 4; k++)
                        acc[k] += term(packed_scale(wd, wd_f16, gd + (size_t)ML_PACK * (b + k) + r), xd[t][b + k],
                                       isum(gw + (size_t)(b + k) * bytes, r, x[t] + (size_t)(b + k) * QK));
                float s = lanes(acc);
                for (; b < nb; b++)
                    s = s + term(packed_scale(wd, wd_f16, gd + (size_t)ML_PACK * b + r), xd[t][b],
                                 isum(gw + (size_t)b * bytes, r, x[t] + (size_t)b * QK));
                out[(size_t)t * ldo + (size_t)g * ML_PACK + r] = s;
            }
    }
}

static void gemm8_q8_0(int ng, int nb, const uint8_t *w, const void *wd, int wd_f16, int nt,
                       const int8_t *const *x, const float *const *xd, const int32_t *const *xs, float *out,
                       size_t ldo) {
    (void)xs;
    gemm8(ng, nb, w, wd, wd_f16, nt, x, xd, out, ldo, ML_PACK_Q8, isum_packed_q8_0);
}

static void gemm8_q4_0(int ng, int nb, const uint8_t *w, const void *wd, int wd_f16, int nt,
                       const int8_t *const *x, const float *const *xd, const int32_t *const *xs, float *out,
                       size_t ldo) {
    (void)xs;
    gemm8(ng, nb, w, wd, wd_f16, nt, x, xd, out, ldo, ML_PACK_Q4, isum_packed_q4_0);
}

/* q . k in scores_f32's order (kernels.h) */
static float dot_f32(const float *q, const float *k, int hd) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int d = 0;
    for (; d + 8 <= hd; d += 8)
        for (int j = 0; j < 8; j++) s[j] += q[d + j] * k[d + j];
    float s01 = s[0] + s[1], s23 = s[2] + s[3], s45 = s[4] + s[5], s67 = s[6] + s[7];
    float s0123 = s01 + s23, s4567 = s45 + s67;
    float r = s0123 + s4567;
    for (; d < hd; d++) r += q[d] * k[d];
    return r;
}

void ml_scores_f32_scalar(const float *q, const float *k, size_t stride, int nk, int hd, float *out) {
    for (int i = 0; i < nk; i++) out[i] = dot_f32(q, k + (size_t)i * stride, hd);
}

void ml_wsum_f32_scalar(const float *a, const float *v, size_t stride, int nk, int hd, float alpha, float *o) {
    for (int d = 0; d < hd; d++) o[d] = o[d] * alpha;
    for (int i = 0; i < nk; i++)
        for (int d = 0; d < hd; d++) o[d] += a[i] * v[(size_t)i * stride + d];
}

/* exp(x) for x <= 0 (softmax_step_f32's, kernels.h): n = rint(x log2 e), r = (x - n C1) - n C2 with
 * C1 + C2 = ln 2 (C1 short, so n C1 is exact: Cody-Waite), Cephes' degree-6 polynomial for e^r
 * in Horner order, then y 2^n; 0 below -87 (2^n would leave the normal range), NaN for NaN. Every
 * operation rounded on its own, so the x86 tables' eight lanes give these bits. */
float ml_exp_le0(float x) {
    if (x != x) return x;
    if (x < -87.0f) return 0.0f;
    float n = rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * (r * r);
    y = y + r;
    y = y + 1.0f;
    union { uint32_t u; float f; } two_n = {.u = (uint32_t)((int32_t)n + 127) << 23};
    return y * two_n.f;
}

float ml_softmax_step_f32_scalar(float *x, int n, float scale, float *m, float *l) {
    float mt = *m;
    for (int i = 0; i < n; i++) {
        x[i] = x[i] * scale;
        if (x[i] > mt) mt = x[i];
    }
    float alpha = *m == -INFINITY ? 0.0f : ml_exp_le0(*m - mt), s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int n8 = n - n % 8;
    for (int i = 0; i < n; i++) {
        x[i] = ml_exp_le0(x[i] - mt);
        if (i < n8) s[i % 8] += x[i];
    }
    float sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (int i = n8; i < n; i++) sum += x[i];
    *l = *l * alpha + sum;
    *m = mt;
    return alpha;
}

const float ml_q4_0_candidates[13] = {-6.0f, -6.2f, -6.4f, -6.6f, -6.8f, -7.0f, -7.2f,
                                     -7.4f, -7.6f, -7.8f, -8.0f, -8.2f, -8.4f};

/* The Q4_0 search, one block at a time (kernels.h; the SIMD tables run the same operations on a
 * block per lane). */
void ml_q4_0_search_scalar(int nb, const float *xs, const float *w, const float *xmax, float *d, float *err,
                           int8_t *l) {
    for (int b = 0; b < nb; b++) {
        const float *x = xs + (size_t)b * QK, *wb = w + (size_t)b * QK;
        float best = INFINITY, best_d = 0.0f, lv[QK], best_l[QK] = {0};
        for (int c = 0; c < 13; c++) {
            float iscale = ml_q4_0_candidates[c] / xmax[b];
            float sumlx = 0.0f, suml2 = 0.0f;
            for (int j = 0; j < QK; j++) {
                float v = rintf(x[j] * iscale);
                lv[j] = v < -8.0f ? -8.0f : v > 7.0f ? 7.0f : v;
                sumlx += (wb[j] * x[j]) * lv[j];
                suml2 += wb[j] * (lv[j] * lv[j]);
            }
            float dc = suml2 > 0.0f ? sumlx / suml2 : 0.0f;
            float e = 0.0f;
            for (int j = 0; j < QK; j++) {
                float r = x[j] - dc * lv[j];
                e += wb[j] * (r * r);
            }
            if (e < best) {
                best = e, best_d = dc;
                for (int j = 0; j < QK; j++) best_l[j] = lv[j];
            }
        }
        d[b] = best_d, err[b] = best;
        for (int j = 0; j < QK; j++) l[(size_t)b * QK + j] = (int8_t)best_l[j];
    }
}

const ml_kernel_table ml_kernels_scalar = {
    .name = "scalar",
    .quantize_q8_0 = quantize_q8_0,
    .isums_q8_0 = isums_q8_0,
    .isums_q4_0 = isums_q4_0,
    .dot_q8_0 = dot_q8_0,
    .dot_q4_0 = dot_q4_0,
    .dot4_q8_0 = dot4_q8_0,
    .dot4_q4_0 = dot4_q4_0,
    .gemm8_q8_0 = gemm8_q8_0,
    .gemm8_q4_0 = gemm8_q4_0,
    .scores_f32 = ml_scores_f32_scalar,
    .wsum_f32 = ml_wsum_f32_scalar,
    .softmax_step_f32 = ml_softmax_step_f32_scalar,
    .q4_0_search = ml_q4_0_search_scalar,
};
