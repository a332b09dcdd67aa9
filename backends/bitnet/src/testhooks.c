/* testhooks.c: exported entry points for tests, not part of include/mlrt.h.
 *
 * int mlbitnet_test_type_block(type, block, bytes): gguf_type_block, the GGUF reader's ggml type
 *   table (tests/test_gguf_rules.py compares it with specs/gguf.yaml `types`).
 *
 * The kernel entry point (tests/test_bitnet_kernels.py) runs any I2_S kernel of any ISA runnable
 * here, so that Python can compare it with the reference:
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
 *   "epilogue":     a = int32 sumi[n], b = {int32 act_sum, float a, float d}; out = float y[n];
 *   "att_scores":   n = hd; a = float kt (the tile's keys as I2S_ATT_KT lays them out, ceil(nk / 16)
 *                   blocks), b = {int32 nq, int32 nk, float scale, float q[nq][hd]}; out = float
 *                   s[nq][nk];
 *   "att_softmax":  n = nk; a = float s[nq][nk], b = {int32 nq, int32 a[nq], int32 b[nq], float
 *                   m[nq], float l[nq]}; out = {float p[nq][nk], m[nq], l[nq], alpha[nq]};
 *   "att_pv":       n = hd; a = float v[nk][hd], b = {int32 nq, int32 nk, float p[nq][nk], float
 *                   alpha[nq], float o[nq][hd]}; out = float o[nq][hd] after;
 *   "attention":    n tokens; a = float q[n][nh][hd], b = {int32 hd, nh, nkv, window, float scale,
 *                   float k[n][nkv][hd], float v[n][nkv][hd]}; out = float o[n][nh][hd]
 *                   (i2s_attention on one thread);
 *   "silu_mul", "gelu_mul": a = float g[n], b = float u[n]; out = float act(g) * u [n];
 *   "norm_mul":     a = float v[n], b = {float r, float w[n]}; out = float (v * r) * w [n],
 *                   computed in place (out holds v first);
 *   "exp":          a = float x[n]; out = float i2s_exp(x) [n] (the header's formula, no table).
 * out holds at least 16 bytes (96 for dot_rows2x8). The integer dots need n a positive multiple of 128, the others n >= 1. Returns ML_OK, ML_E_ARG (NULL pointer, n, unknown
 * op) or ML_E_UNSUPPORTED (ISA not built or not runnable on this CPU). The ISA in use (ml_isa) is
 * not changed.
 */
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "bitnet.h"
#include "gguf.h"

ML_API int mlbitnet_test_type_block(uint32_t type, uint32_t *block, uint32_t *bytes);
ML_API int mlbitnet_test_type_block(uint32_t type, uint32_t *block, uint32_t *bytes) {
    return gguf_type_block(type, block, bytes);
}

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
    if (strcmp(op, "att_scores") == 0 || strcmp(op, "att_pv") == 0 || strcmp(op, "att_softmax") == 0) {
        int32_t h[2];
        memcpy(h, b, sizeof h);
        const float *f = (const float *)b + 2;
        if (strcmp(op, "att_scores") == 0) { /* h = {nq, nk} */
            if (h[0] < 0 || h[1] < 0) return ML_E_ARG;
            t->att_scores(n, h[0], f + 1, (size_t)n, h[1], a, f[0], out, (size_t)h[1]);
        } else if (strcmp(op, "att_pv") == 0) { /* h = {nq, nk} */
            if (h[0] < 0 || h[1] < 0) return ML_E_ARG;
            const float *pw = f, *alpha = pw + (size_t)h[0] * (size_t)h[1];
            memcpy(out, alpha + h[0], sizeof(float) * (size_t)h[0] * (size_t)n);
            t->att_pv(n, h[0], h[1], pw, (size_t)h[1], a, alpha, out, (size_t)n);
        } else { /* softmax: b = {nq, a[nq], b[nq], m[nq], l[nq]} */
            const int32_t nq = h[0], *ab = (const int32_t *)b + 1;
            if (nq < 0 || nq > I2S_ATT_MAX_ROWS) return ML_E_ARG;
            int lo[I2S_ATT_MAX_ROWS], hi[I2S_ATT_MAX_ROWS];
            for (int i = 0; i < nq; i++) {
                lo[i] = ab[i], hi[i] = ab[nq + i];
                if (lo[i] < 0 || hi[i] < lo[i] || hi[i] > n) return ML_E_ARG;
            }
            float *pw = out, *m = pw + (size_t)nq * (size_t)n, *l = m + nq;
            memcpy(pw, a, sizeof(float) * (size_t)nq * (size_t)n);
            memcpy(m, ab + 2 * nq, sizeof(float) * 2 * (size_t)nq);
            t->att_softmax(nq, n, lo, hi, pw, (size_t)n, m, l, l + nq);
        }
        return ML_OK;
    }
    if (strcmp(op, "attention") == 0) {
        int32_t h[4];
        memcpy(h, b, sizeof h);
        const int hd = h[0], nh = h[1], nkv = h[2];
        if (hd < 1 || nh < 1 || nkv < 1 || nh % nkv || h[3] < 0) return ML_E_ARG;
        float scale;
        memcpy(&scale, (const int32_t *)b + 4, sizeof scale);
        const size_t kvd = (size_t)nkv * (size_t)hd;
        const float *k = (const float *)b + 5, *v = k + (size_t)n * kvd;
        float *kt = malloc(sizeof(float) * i2s_att_tiles(n) * I2S_ATT_TILE * kvd);
        float *vh = malloc(sizeof(float) * (size_t)n * kvd);
        if (!kt || !vh) {
            free(kt), free(vh);
            return ML_E_NOMEM;
        }
        for (int tk = 0; tk < n; tk++)
            for (int kh = 0; kh < nkv; kh++)
                for (int d = 0; d < hd; d++) {
                    size_t src = (size_t)tk * kvd + (size_t)kh * (size_t)hd + (size_t)d;
                    kt[i2s_att_kt_index(n, hd, kh, tk, d)] = k[src];
                    vh[((size_t)kh * (size_t)n + (size_t)tk) * (size_t)hd + (size_t)d] = v[src];
                }
        i2s_attn att = {t, n, hd, nh, nkv, h[3], scale, a, kt, vh, out};
        i2s_attention(NULL, &att);
        free(kt), free(vh);
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
