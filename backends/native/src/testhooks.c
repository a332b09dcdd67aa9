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
 *
 * int mlrt_test_gemm8(...): the packed GEMM; mlrt_test_attn(...): attention's kernels (below).
 *
 * size_t mlrt_test_state_bytes(const ml_model *m): the bytes of m's run-time state and packed
 * weights (decision runtime.memory_bound; tests/test_native_memory.py).
 */
#include <stdlib.h>
#include <string.h>

#include "../include/mlrt.h"
#include "forward.h"
#include "kernels.h"
#include "model.h"
#include "unicode.h"
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


/* int mlrt_test_gemm8(isa, fmt, rows, cols, nt, w, wd, wd_f16, x, xd, out): the packed GEMM as
 * forward.c runs it: a rows x cols matrix as stored (fmt 1 Q8_0: int8 w[rows][cols]; 2 Q4_0: 16
 * bytes per block), its scales wd[rows][cols / 32] (wd_f16: packed as f16, which they must be
 * exactly), packed by repack.c (rows a multiple of 8), against nt
 * rows x[nt][cols] with scales xd[nt][cols / 32] and their block sums (ml_block_sums):
 * out[t][r] (float[nt][rows]). Returns ML_OK, ML_E_ARG, ML_E_NOMEM, or ML_E_UNSUPPORTED (ISA not
 * runnable here, or a table without gemm8). */
ML_API int mlrt_test_gemm8(const char *isa, int fmt, int rows, int cols, int nt, const void *w, const float *wd,
                           int wd_f16, const int8_t *x, const float *xd, float *out);

ML_API int mlrt_test_gemm8(const char *isa, int fmt, int rows, int cols, int nt, const void *w, const float *wd,
                           int wd_f16, const int8_t *x, const float *xd, float *out) {
    if (!isa || !w || !wd || !x || !xd || !out || rows <= 0 || rows % ML_PACK || cols <= 0 || cols % QK ||
        nt <= 0 || nt > 64 || (fmt != ML_FMT_Q8_0 && fmt != ML_FMT_Q4_0))
        return ML_E_ARG;
    const ml_kernel_table *t = ml_kernels_named(isa);
    if (t == NULL || t->gemm8_q8_0 == NULL) return ML_E_UNSUPPORTED;
    ml_matrix m = {.fmt = fmt, .rows = rows, .cols = cols, .q = w, .d = wd};
    int nb = cols / QK;
    uint8_t *pq = malloc(ml_packed_q_bytes(&m));
    uint8_t *pd = malloc(ml_packed_d_bytes(&m, wd_f16));
    int32_t *xs = malloc((size_t)nt * nb * sizeof(int32_t));
    const int8_t *xp[64];
    const float *xdp[64];
    const int32_t *xsp[64];
    int rc = pq && pd && xs ? ML_OK : ML_E_NOMEM;
    if (rc == ML_OK) {
        ml_pack_groups(&m, 0, rows / ML_PACK, pq, pd, wd_f16);
        for (int i = 0; i < nt; i++) {
            xp[i] = x + (size_t)i * cols;
            xdp[i] = xd + (size_t)i * nb;
            xsp[i] = xs + (size_t)i * nb;
            ml_block_sums(xp[i], nb, xs + (size_t)i * nb);
        }
        m.pq = pq, m.pd = pd, m.pd_f16 = wd_f16;
        ml_gemm8_groups(t, &m, 0, rows / ML_PACK, nt, xp, xdp, xsp, out, (size_t)rows);
    }
    free(pq);
    free(pd);
    free(xs);
    return rc;
}

/* int mlrt_test_attn(isa, op, nk, hd, stride, a, kv, out): attention's float kernels:
 *   "scores_f32": a = q[hd], kv = nk keys every stride floats; out = float[nk];
 *   "wsum_f32":   a = {alpha, o[hd], weights[nk]}, kv = nk values every stride floats; out = float[hd]:
 *                 o * alpha plus the weighted values;
 *   "softmax_step_f32": a = scores[nk], kv = {scale, m, l}; out = float[nk + 3]: the weights, then
 *                 m, l and alpha after the step (hd, stride unused);
 *   "exp":        a = x[nk]; out = ml_exp_le0 of each (isa, kv, hd, stride unused).
 * Returns ML_OK, ML_E_ARG or ML_E_UNSUPPORTED. */
ML_API int mlrt_test_attn(const char *isa, const char *op, int nk, int hd, size_t stride, const float *a,
                          const float *kv, float *out);

ML_API int mlrt_test_attn(const char *isa, const char *op, int nk, int hd, size_t stride, const float *a,
                          const float *kv, float *out) {
    if (!isa || !op || !a || !kv || !out || nk < 0 || hd < 0 || stride < (size_t)hd) return ML_E_ARG;
    const ml_kernel_table *t = ml_kernels_named(isa);
    if (t == NULL) return ML_E_UNSUPPORTED;
    if (strcmp(op, "scores_f32") == 0) t->scores_f32(a, kv, stride, nk, hd, out);
    else if (strcmp(op, "wsum_f32") == 0) {
        memcpy(out, a + 1, (size_t)hd * sizeof *out);
        t->wsum_f32(a + 1 + hd, kv, stride, nk, hd, a[0], out);
    }
    else if (strcmp(op, "softmax_step_f32") == 0) {
        memcpy(out, a, (size_t)nk * sizeof *out);
        out[nk] = kv[1], out[nk + 1] = kv[2];
        out[nk + 2] = t->softmax_step_f32(out, nk, kv[0], &out[nk], &out[nk + 1]);
    } else if (strcmp(op, "exp") == 0)
        for (int i = 0; i < nk; i++) out[i] = ml_exp_le0(a[i]);
    else return ML_E_ARG;
    return ML_OK;
}

/* int mlrt_test_unicode(op, in, n, out, cap, n_out): the Unicode functions of unicode.h
 * (tests/test_native_unicode.py), n and cap counted in elements of the op's types:
 *   "class":   in = uint32 code points[n]; out = int32 codes[n] (ml_uc_code: class + numeric) (cap >= n);
 *   "decode":  in = bytes[n]; out = uint32 code points (cap >= n); *n_out = their count;
 *   "offsets": as "decode", but out = the uint32 byte offset of each code point;
 *   "nfc":     in = uint32 code points[n]; out = uint32[cap]; *n_out = the count NFC needs (only
 *              the first cap are written);
 *   "version": out = the Unicode version string, NUL-terminated (cap bytes).
 * Returns ML_OK, ML_E_ARG (NULL pointer, cap too small, unknown op) or ML_E_NOMEM. */
ML_API int mlrt_test_unicode(const char *op, const void *in, size_t n, void *out, size_t cap,
                             size_t *n_out);

ML_API int mlrt_test_unicode(const char *op, const void *in, size_t n, void *out, size_t cap,
                             size_t *n_out) {
    if (op == NULL || out == NULL || n_out == NULL || (in == NULL && n > 0)) return ML_E_ARG;
    if (strcmp(op, "version") == 0) {
        const char *v = ml_uc_version();
        size_t len = strlen(v);
        if (cap <= len) return ML_E_ARG;
        memcpy(out, v, len + 1);
        *n_out = len;
        return ML_OK;
    }
    if (strcmp(op, "class") == 0) {
        if (cap < n) return ML_E_ARG;
        for (size_t i = 0; i < n; i++) ((int32_t *)out)[i] = ml_uc_code(((const uint32_t *)in)[i]);
        *n_out = n;
        return ML_OK;
    }
    if (strcmp(op, "decode") == 0) {
        if (cap < n) return ML_E_ARG;
        *n_out = ml_utf8_decode(in, n, out, NULL);
        return ML_OK;
    }
    if (strcmp(op, "offsets") == 0) {
        if (cap < n) return ML_E_ARG;
        bool overflow = false;
        size_t bytes = ml_mul_size(n ? n : 1, sizeof(size_t), &overflow);
        if (overflow) return ML_E_ARG;
        uint32_t *cps = malloc(bytes);  /* sizeof(uint32_t) <= sizeof(size_t) */
        size_t *offs = malloc(bytes);
        if (cps == NULL || offs == NULL) {
            free(cps);
            free(offs);
            return ML_E_NOMEM;
        }
        *n_out = ml_utf8_decode(in, n, cps, offs);
        for (size_t i = 0; i < *n_out; i++) ((uint32_t *)out)[i] = (uint32_t)offs[i];
        free(cps);
        free(offs);
        return ML_OK;
    }
    if (strcmp(op, "nfc") == 0) {
        *n_out = ml_uc_nfc(in, n, out, cap);
        return ML_OK;
    }
    return ML_E_ARG;
}

ML_API size_t mlrt_test_state_bytes(const ml_model *m);

ML_API size_t mlrt_test_state_bytes(const ml_model *m) { return m ? ml_forward_state_bytes(m) + m->packed_bytes : 0; }
