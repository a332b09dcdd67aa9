/* testhooks.c: one exported entry point for tests (tests/test_bitnet_kernels.py), so that Python
 * can run any I2_S kernel of any ISA runnable here and compare it with the reference. Not part of
 * include/mlrt.h.
 *
 * int mlbitnet_test_kernel(isa, op, n, a, b, out):
 *   "quantize_act": a = float x[n] (n >= 1, finite); out = int8 q[n], then float scale (byte
 *                   offset n), then int32 sum (byte offset n + 4), both unaligned;
 *   "dot":          a = packed row (n / 4 bytes), b = int8 x[n]; out = int32;
 *   "dot4":         a = packed row, b = four int8 rows x[4][n]; out = int32[4];
 *   "dot_rows4":    a = four packed rows (4 * n / 4 bytes), b = int8 x[n]; out = int32[4];
 *   "dot_rows2x8":  a = two packed rows, b = eight int8 rows x[8][n]; out = int32[8][3]: token t's
 *                   dots with rows 0 and 1 at [t][0] and [t][1] (the kernel's stride 3), [t][2]
 *                   left as it was (ML_E_UNSUPPORTED if the table has none);
 *   "dot_f16":      a = f16 bits w[n], b = float x[n]; out = float;
 *   "dot_f32":      a = float w[n], b = float x[n]; out = float.
 *   "dot_f32x4":    a = float w[n], b = float x[4][n]; out = float[4];
 *   "dot_f32x4_keys": a = float w[nk][n], b = {int32 nk, float x[4][n]}; out = float[4][nk];
 *   "epilogue":     a = int32 sumi[n], b = {int32 act_sum, float a, float d}; out = float y[n];
 *   "axpy":         a = float x[n], b = {float p, float y[n]}; out = float y[n] after y += p x;
 *   "axpy4":        a = float x[nt][n], b = {int32 nt, float p[4][nt], float y[4][n]}; out = float
 *                   y[4][n] after;
 *   "silu_mul", "gelu_mul": a = float g[n], b = float u[n]; out = float act(g) * u [n];
 *   "norm_mul":     a = float v[n], b = {float r, float w[n]}; out = float (v * r) * w [n],
 *                   computed in place (out holds v first);
 *   "exp":          a = float x[n]; out = float i2s_exp(x) [n] (the header's formula, no table).
 * out holds at least 16 bytes (96 for dot_rows2x8). The integer dots need n a positive multiple of 128, the others n >= 1. Returns ML_OK, ML_E_ARG (NULL pointer, n, unknown
 * op) or ML_E_UNSUPPORTED (ISA not built or not runnable on this CPU). The ISA in use (ml_isa) is
 * not changed.
 */
#include <string.h>

#include "bitnet.h"

ML_API int mlbitnet_test_kernel(const char *isa, const char *op, int n, const void *a, const void *b, void *out);

ML_API int mlbitnet_test_kernel(const char *isa, const char *op, int n, const void *a, const void *b, void *out) {
    if (isa == NULL || op == NULL || a == NULL || out == NULL || n < 1) return ML_E_ARG;
    const i2s_kernel_table *t = i2s_kernels_named(isa);
    if (t == NULL) return ML_E_UNSUPPORTED;
    if (strcmp(op, "quantize_act") == 0) {
        int32_t sum;
        float scale = t->quantize_act(a, n, out, &sum);
        memcpy((uint8_t *)out + n, &scale, sizeof scale);
        memcpy((uint8_t *)out + n + sizeof scale, &sum, sizeof sum);
        return ML_OK;
    }
    if (b != NULL && (strcmp(op, "dot_f16") == 0 || strcmp(op, "dot_f32") == 0)) {
        float y = op[5] == '1' ? t->dot_f16(n, a, b) : t->dot_f32(n, a, b);
        memcpy(out, &y, sizeof y);
        return ML_OK;
    }
    if (strcmp(op, "exp") == 0) {
        for (int k = 0; k < n; k++) ((float *)out)[k] = i2s_exp(((const float *)a)[k]);
        return ML_OK;
    }
    if (b == NULL) return ML_E_ARG;
    if (strcmp(op, "epilogue") == 0) {
        int32_t act_sum;
        float p[2];
        memcpy(&act_sum, b, 4);
        memcpy(p, (const uint8_t *)b + 4, 8);
        t->epilogue(n, a, act_sum, p[0], p[1], out);
        return ML_OK;
    }
    if (strcmp(op, "norm_mul") == 0) {
        float r;
        memcpy(&r, b, 4);
        memcpy(out, a, sizeof(float) * (size_t)n);
        t->norm_mul(n, out, r, (const float *)b + 1, out);
        return ML_OK;
    }
    if (strcmp(op, "axpy") == 0) {
        float p;
        memcpy(&p, b, 4);
        memcpy(out, (const float *)b + 1, sizeof(float) * (size_t)n);
        t->axpy(n, p, a, out);
        return ML_OK;
    }
    if (strcmp(op, "dot_f32x4") == 0) {
        const float *x = b, *xs[4] = {x, x + n, x + 2 * (size_t)n, x + 3 * (size_t)n};
        t->dot_f32x4(n, 1, a, xs, out, 1);
        return ML_OK;
    }
    if (strcmp(op, "dot_f32x4_keys") == 0) {
        int32_t nk;
        memcpy(&nk, b, sizeof nk);
        if (nk < 0) return ML_E_ARG;
        const float *x = (const float *)b + 1, *xs[4] = {x, x + n, x + 2 * (size_t)n, x + 3 * (size_t)n};
        t->dot_f32x4(n, nk, a, xs, out, (size_t)nk);
        return ML_OK;
    }
    if (strcmp(op, "axpy4") == 0) {
        int32_t nt;
        memcpy(&nt, b, sizeof nt);
        if (nt < 0) return ML_E_ARG;
        const float *p = (const float *)b + 1;
        float *y = out, *ys[4] = {y, y + n, y + 2 * (size_t)n, y + 3 * (size_t)n};
        memcpy(out, p + 4 * (size_t)nt, 4 * sizeof(float) * (size_t)n);
        t->axpy4(n, nt, p, (size_t)nt, a, ys);
        return ML_OK;
    }
    if (strcmp(op, "silu_mul") == 0 || strcmp(op, "gelu_mul") == 0) {
        memcpy(out, a, sizeof(float) * (size_t)n);
        t->act_mul(op[0] == 'g', n, out, b);
        return ML_OK;
    }
    if (n % I2S_BLOCK) return ML_E_ARG;
    if (strcmp(op, "dot_rows2x8") == 0) {
        if (t->dot_rows2x8 == NULL) return ML_E_UNSUPPORTED;
        const int8_t *x = b, *xs[8];
        for (int i = 0; i < 8; i++) xs[i] = x + (size_t)i * (size_t)n;
        int32_t r24[24];
        memcpy(r24, out, sizeof r24);
        t->dot_rows2x8(n, a, xs, r24, 3);
        memcpy(out, r24, sizeof r24);
        return ML_OK;
    }
    int32_t r[4];
    if (strcmp(op, "dot") == 0) {
        r[0] = t->dot(n, a, b);
        memcpy(out, r, sizeof r[0]);
        return ML_OK;
    }
    if (strcmp(op, "dot4") == 0) {
        const int8_t *x = b, *xs[4] = {x, x + n, x + 2 * (size_t)n, x + 3 * (size_t)n};
        t->dot4(n, a, xs, r);
    } else if (strcmp(op, "dot_rows4") == 0) {
        t->dot_rows4(n, a, b, r);
    } else {
        return ML_E_ARG;
    }
    memcpy(out, r, sizeof r);
    return ML_OK;
}
