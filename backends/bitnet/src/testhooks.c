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
 *   "dot_f16":      a = f16 bits w[n], b = float x[n]; out = float;
 *   "dot_f32":      a = float w[n], b = float x[n]; out = float.
 * The integer dots need n a positive multiple of 128, the float dots n >= 1. Returns ML_OK, ML_E_ARG (NULL pointer, n, unknown
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
    if (b == NULL || n % I2S_BLOCK) return ML_E_ARG;
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
