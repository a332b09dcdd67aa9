/* testhooks.c: one exported entry point for tests (tests/test_native_kernels.py), so that Python
 * can run any kernel of any ISA runnable here and compare them. Not part of include/mlrt.h.
 *
 * int mlrt_test_kernel(isa, op, n, a, b, ad, bd, out): n values (a multiple of 32, nb = n / 32):
 *   "quantize_q8_0": a = float[n]; out = int8 q[n] then float d[nb] (at byte offset n);
 *   "isums_q8_0":    a = int8 w[n], b = int8 x[n]; out = int32[nb];
 *   "isums_q4_0":    a = uint8 w[n / 2] (16 bytes per block), b = int8 x[n]; out = int32[nb];
 *   "dot_q8_0":      a, ad = w[n], wd[nb]; b, bd = x[n], xd[nb]; out = float[1];
 *   "dot_q4_0":      as dot_q8_0 with a = uint8 w[n / 2].
 *   "dot4_q8_0":     a, ad = w[n], wd[nb]; b, bd = four rows x[4][n], xd[4][nb]; out = float[4];
 *   "dot4_q4_0":     as dot4_q8_0 with a = uint8 w[n / 2].
 * Returns ML_OK, ML_E_ARG (NULL pointer, n, unknown op) or ML_E_UNSUPPORTED (ISA not built or not
 * runnable on this CPU). The ISA in use (ml_isa) is not changed.
 */
#include <string.h>

#include "../include/mlrt.h"
#include "kernels.h"
#include "util.h"


ML_API int mlrt_test_kernel(const char *isa, const char *op, int n, const void *a, const void *b,
                            const float *ad, const float *bd, void *out);

ML_API int mlrt_test_kernel(const char *isa, const char *op, int n, const void *a, const void *b,
                            const float *ad, const float *bd, void *out) {
    if (isa == NULL || op == NULL || a == NULL || out == NULL || n < 0 || n % QK) return ML_E_ARG;
    const ml_kernel_table *t = ml_kernels_named(isa);
    if (t == NULL) return ML_E_UNSUPPORTED;
    int nb = n / QK;
    if (strcmp(op, "quantize_q8_0") == 0) {
        t->quantize_q8_0(a, n, out, (float *)((int8_t *)out + n));
        return ML_OK;
    }
    if (b == NULL) return ML_E_ARG;
    if (strcmp(op, "isums_q8_0") == 0) {
        t->isums_q8_0(nb, a, b, out);
        return ML_OK;
    }
    if (strcmp(op, "isums_q4_0") == 0) {
        t->isums_q4_0(nb, a, b, out);
        return ML_OK;
    }
    if (ad == NULL || bd == NULL) return ML_E_ARG;
    if (strcmp(op, "dot_q8_0") == 0) {
        *(float *)out = t->dot_q8_0(nb, a, ad, b, bd);
        return ML_OK;
    }
    if (strcmp(op, "dot_q4_0") == 0) {
        *(float *)out = t->dot_q4_0(nb, a, ad, b, bd);
        return ML_OK;
    }
    if (strcmp(op, "dot4_q8_0") == 0 || strcmp(op, "dot4_q4_0") == 0) {
        const int8_t *x = b, *xs[4] = {x, x + n, x + 2 * (size_t)n, x + 3 * (size_t)n};
        const float *xds[4] = {bd, bd + nb, bd + 2 * nb, bd + 3 * nb};
        if (strcmp(op, "dot4_q8_0") == 0) t->dot4_q8_0(nb, a, ad, xs, xds, out);
        else t->dot4_q4_0(nb, a, ad, xs, xds, out);
        return ML_OK;
    }
    return ML_E_ARG;
}
