/* i2s_scalar.c: the scalar I2_S kernels, the twin every SIMD table is tested against.
 *
 * quantize_act (specs/i2s.yaml `activations`): amax over |x| (exact), floored at 1e-5 in double;
 * a = (float)(127 / amax) in double (one rounding); t = x * a, one float rounding (no FMA: the
 * pragmas below, and -std=c11 means -ffp-contract=off for gcc); q = round half away from zero
 * (C roundf, exact on floats), clamped to [-128, 127].
 *
 * dot_f16 / dot_f32 (the table's comment): eight running sums, element k into sum k % 8, each
 * product rounded and then added, combined pairwise; f16 weights widened exactly (f16.c).
 *
 * epilogue / act_mul / norm_mul: the header's one-element formulas in a loop (NEON shares these).
 *
 * att_scores / att_softmax / att_pv (attention, attn.c): the header's definitions as loops; fmaf
 * is the fused multiply-add (one rounding) every SIMD table performs with its FMA instruction.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>

#include "i2s_kernels.h"

static float quantize_act(const float *x, int n, int8_t *q, int32_t *sum) {
    float amax = 0.0f;
    for (int k = 0; k < n; k++) {
        float v = fabsf(x[k]);
        amax = v > amax ? v : amax;
    }
    double m = (double)amax > 1e-5 ? (double)amax : 1e-5;
    float a = (float)(127.0 / m);
    int32_t s = 0;
    for (int k = 0; k < n; k++) {
        float t = x[k] * a;
        float r = roundf(t);
        r = r > 127.0f ? 127.0f : r < -128.0f ? -128.0f : r;
        q[k] = (int8_t)r;
        s += q[k];
    }
    *sum = s;
    return a;
}

static int32_t dot(int n, const uint8_t *w, const int8_t *x) {
    int32_t s = 0;
    for (int b = 0; b < n / I2S_BLOCK; b++, w += I2S_BLOCK_BYTES, x += I2S_BLOCK)
        for (int j = 0; j < 32; j++) {
            uint8_t v = w[j];
            s += (v >> 6) * x[j] + ((v >> 4) & 3) * x[j + 32] + ((v >> 2) & 3) * x[j + 64] + (v & 3) * x[j + 96];
        }
    return s;
}

static void dot4(int n, const uint8_t *w, const int8_t *const x[4], int32_t out[4]) {
    for (int t = 0; t < 4; t++) out[t] = dot(n, w, x[t]);
}

static void dot_rows4(int n, const uint8_t *w, const int8_t *x, int32_t out[4]) {
    for (int t = 0; t < 4; t++) out[t] = dot(n, w + (size_t)t * (size_t)(n / 4), x);
}

static void dot_rows2x8(int n, const uint8_t *w, const int8_t *const x[8], int32_t *out, size_t os) {
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 8; t++) out[(size_t)t * os + (size_t)r] = dot(n, w + (size_t)r * (size_t)(n / 4), x[t]);
}

static float dot_f16(int n, const uint16_t *w, const float *x) {
    float s[8] = {0};
    return i2s_f16_dot_end(0, n, w, x, s);
}

static float dot_f32(int n, const float *w, const float *x) {
    float s[8] = {0};
    return i2s_f32_dot_end(0, n, w, x, s);
}

void i2s_scalar_epilogue(int n, const int32_t *sumi, int32_t act_sum, float a, float d, float *y) {
    for (int k = 0; k < n; k++) y[k] = i2s_epilogue(sumi[k], act_sum, a, d);
}

void i2s_scalar_att_scores(int hd, int nq, const float *q, size_t qs, int nk, const float *kt, float scale, float *s,
                           size_t ss) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++) {
            float acc = 0.0f;
            for (int d = 0; d < hd; d++) acc = fmaf(q[(size_t)i * qs + (size_t)d], kt[I2S_ATT_KT(hd, j, d)], acc);
            s[(size_t)i * ss + (size_t)j] = acc * scale;
        }
}

void i2s_scalar_att_softmax(int nq, int nk, const int *a, const int *b, float *s, size_t ss, float *m, float *l,
                            float *alpha) {
    for (int i = 0; i < nq; i++) alpha[i] = i2s_att_softmax_row(nk, a[i], b[i], s + (size_t)i * ss, &m[i], &l[i]);
}

void i2s_scalar_att_pv(int hd, int nq, int nk, const float *p, size_t ps, const float *v, const float *alpha, float *o,
                       size_t os) {
    for (int i = 0; i < nq; i++)
        for (int c = 0; c < hd; c++) {
            float acc = o[(size_t)i * os + (size_t)c] * alpha[i];
            for (int j = 0; j < nk; j++) acc = fmaf(p[(size_t)i * ps + (size_t)j], v[(size_t)j * (size_t)hd + (size_t)c], acc);
            o[(size_t)i * os + (size_t)c] = acc;
        }
}

void i2s_scalar_norm_mul(int n, const float *v, float r, const float *w, float *out) {
    for (int k = 0; k < n; k++) out[k] = i2s_norm1(v[k], r, w[k]);
}

void i2s_scalar_act_mul(int gelu, int n, float *g, const float *u) {
    for (int k = 0; k < n; k++) g[k] = i2s_act1(gelu, g[k], u[k]);
}

const i2s_kernel_table i2s_kernels_scalar = {
    .name = "scalar",
    .quantize_act = quantize_act,
    .dot = dot,
    .dot4 = dot4,
    .dot_rows4 = dot_rows4,
    .dot_rows2x8 = dot_rows2x8,
    .dot_f16 = dot_f16,
    .dot_f32 = dot_f32,
    .epilogue = i2s_scalar_epilogue,
    .att_scores = i2s_scalar_att_scores,
    .att_softmax = i2s_scalar_att_softmax,
    .att_pv = i2s_scalar_att_pv,
    .norm_mul = i2s_scalar_norm_mul,
    .act_mul = i2s_scalar_act_mul,
};
