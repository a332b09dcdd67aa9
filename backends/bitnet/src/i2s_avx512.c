/* i2s_avx512.c: I2_S integer dots with AVX-512 VNNI (512-bit vpdpbusd; compiled with -mavx512f
 * -mavx512bw -mavx512vnni -mavx2 -mfma -mf16c on x86-64 only; chosen at run time when the CPU has
 * AVX-512 F, BW and VNNI and the OS saves the ZMM state). Twin: i2s_scalar.c (specs/i2s.yaml `dot`).
 *
 * As i2s_avxvnni.c, on 64 bytes: a block's 32 packed bytes are broadcast to both halves of a ZMM
 * register and shifted by (6, 4) and (2, 0) per half, so two 64-byte code vectors hold the codes
 * of elements 0..63 and 64..127 in element order, each against 64 consecutive activations. Exact
 * int32 sums in any order, as the twin's. Float kernels: AVX2's, but for attention's scores and
 * weighted values (below).
 */
/* as i2s_avx2.c: no contraction of a multiply and an add into an FMA the twin does not do */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>
#include <math.h>

#include "i2s_kernels.h"
#include "i2s_x86_hsum.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The two code vectors of one packed block: lo = elements 0..63, hi = 64..127. */
ALWAYS_INLINE __m512i halves16(short low, short high) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(low)), _mm256_set1_epi16(high), 1);
}

ALWAYS_INLINE void unpack(const uint8_t *w, __m512i *lo, __m512i *hi) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)w));
    *lo = _mm512_and_si512(_mm512_srlv_epi16(v, halves16(6, 4)), m3); /* elements 0..31 | 32..63 */
    *hi = _mm512_and_si512(_mm512_srlv_epi16(v, halves16(2, 0)), m3); /* elements 64..95 | 96..127 */
}

ALWAYS_INLINE __m512i block_dot(__m512i acc, __m512i lo, __m512i hi, const int8_t *x) {
    acc = _mm512_dpbusd_epi32(acc, lo, _mm512_loadu_si512(x));
    return _mm512_dpbusd_epi32(acc, hi, _mm512_loadu_si512(x + 64));
}

static int32_t dot(int n, const uint8_t *w, const int8_t *x) {
    __m512i acc = _mm512_setzero_si512();
    for (int b = 0; b < n / I2S_BLOCK; b++) {
        __m512i lo, hi;
        unpack(w + (size_t)b * I2S_BLOCK_BYTES, &lo, &hi);
        acc = block_dot(acc, lo, hi, x + (size_t)b * I2S_BLOCK);
    }
    return _mm512_reduce_add_epi32(acc);
}

static void dot4(int n, const uint8_t *w, const int8_t *const x[4], int32_t out[4]) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (int b = 0; b < n / I2S_BLOCK; b++) {
        __m512i lo, hi;
        unpack(w + (size_t)b * I2S_BLOCK_BYTES, &lo, &hi);
        const size_t o = (size_t)b * I2S_BLOCK;
        a0 = block_dot(a0, lo, hi, x[0] + o);
        a1 = block_dot(a1, lo, hi, x[1] + o);
        a2 = block_dot(a2, lo, hi, x[2] + o);
        a3 = block_dot(a3, lo, hi, x[3] + o);
    }
    out[0] = _mm512_reduce_add_epi32(a0), out[1] = _mm512_reduce_add_epi32(a1);
    out[2] = _mm512_reduce_add_epi32(a2), out[3] = _mm512_reduce_add_epi32(a3);
}

/* The low and high 256-bit halves of a added: 8 lanes whose total is a's (for hsum8x4) */
ALWAYS_INLINE __m256i half_sum(__m512i a) {
    return _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
}

/* Two consecutive weight rows, eight activation rows (the prefill tile): each block of the two
 * rows unpacked once for the eight tokens and each activation vector loaded once for the two
 * rows; 16 accumulators. Measured on the 0.6B shape's 128-token embedding (AMD EPYC, 1 thread):
 * 1.18x dot4 with one row x 8 tokens, 1.15x more with two rows. */
static void dot_rows2x8(int n, const uint8_t *w, const int8_t *const x[8], int32_t *out, size_t os) {
    const size_t rs = (size_t)(n / 4);
    __m512i a[8], c[8];
    for (int t = 0; t < 8; t++) a[t] = c[t] = _mm512_setzero_si512();
    for (int b = 0; b < n / I2S_BLOCK; b++) {
        __m512i lo, hi, lo2, hi2;
        unpack(w + (size_t)b * I2S_BLOCK_BYTES, &lo, &hi);
        unpack(w + rs + (size_t)b * I2S_BLOCK_BYTES, &lo2, &hi2);
        const size_t o = (size_t)b * I2S_BLOCK;
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            __m512i xl = _mm512_loadu_si512(x[t] + o), xh = _mm512_loadu_si512(x[t] + o + 64);
            a[t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a[t], lo, xl), hi, xh);
            c[t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(c[t], lo2, xl), hi2, xh);
        }
    }
    /* written out: a loop over the two halves kept a[] and c[] on the stack (gcc 12) */
    store_rows2(hsum8x4(half_sum(a[0]), half_sum(a[1]), half_sum(a[2]), half_sum(a[3])),
                hsum8x4(half_sum(c[0]), half_sum(c[1]), half_sum(c[2]), half_sum(c[3])), out, os, 0);
    store_rows2(hsum8x4(half_sum(a[4]), half_sum(a[5]), half_sum(a[6]), half_sum(a[7])),
                hsum8x4(half_sum(c[4]), half_sum(c[5]), half_sum(c[6]), half_sum(c[7])), out, os, 4);
}

static void dot_rows4(int n, const uint8_t *w, const int8_t *x, int32_t out[4]) {
    const size_t rs = (size_t)(n / 4);
    __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};
    for (int b = 0; b < n / I2S_BLOCK; b++) {
        _mm_prefetch((const char *)(w + 4 * rs) + 128 * (size_t)b, _MM_HINT_T0);
        _mm_prefetch((const char *)(w + 4 * rs) + 128 * (size_t)b + 64, _MM_HINT_T0);
        for (int r = 0; r < 4; r++) {
            __m512i lo, hi;
            unpack(w + (size_t)r * rs + (size_t)b * I2S_BLOCK_BYTES, &lo, &hi);
            a[r] = block_dot(a[r], lo, hi, x + (size_t)b * I2S_BLOCK);
        }
    }
    for (int r = 0; r < 4; r++) out[r] = _mm512_reduce_add_epi32(a[r]);
}

/* Attention (i2s_kernels.h att_*): AVX2's scheme on 16 lanes, each value the twin's fmaf chain in
 * its order (one vfmadd per lane), so the bits are the twin's. Register tiles of eight queries x
 * two zmm (32 keys or output elements: 16 accumulators of 32 registers) read each key or value
 * vector once for eight queries where AVX2's 16 registers allow four: the tile, which lives in
 * L2, is read half as often. The leftovers (fewer than eight queries, 32 keys or 32 columns) go
 * to AVX2's kernels or a 16-lane loop. */
#define FMA16 _mm512_fmadd_ps
#define BQ16(r, d) _mm512_set1_ps((r)[d])
/* two blocks of kt (32 keys, each block hd x 16 floats) against eight queries */
ALWAYS_INLINE void scores8x32(int hd, const float *q, size_t qs, const float *k, __m512 sc, float *s, size_t ss) {
    const float *k2 = k + (size_t)hd * I2S_ATT_KB;
    __m512 a[8], b[8];
    const float *qi[8];
    for (int i = 0; i < 8; i++) a[i] = b[i] = _mm512_setzero_ps(), qi[i] = q + (size_t)i * qs;
    for (int d = 0; d < hd; d++, k += I2S_ATT_KB, k2 += I2S_ATT_KB) {
        const __m512 k0 = _mm512_loadu_ps(k), k1 = _mm512_loadu_ps(k2);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const __m512 x = BQ16(qi[i], d);
            a[i] = FMA16(x, k0, a[i]), b[i] = FMA16(x, k1, b[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        _mm512_storeu_ps(s + (size_t)i * ss, _mm512_mul_ps(a[i], sc)),
            _mm512_storeu_ps(s + (size_t)i * ss + 16, _mm512_mul_ps(b[i], sc));
}

static void att_scores(int hd, int nq, const float *q, size_t qs, int nk, const float *kt, float scale, float *s,
                       size_t ss) {
    const __m512 sc = _mm512_set1_ps(scale);
    const int nk32 = nk - nk % 32, i8 = nq - nq % 8;
    for (int j = 0; j < nk32; j += 32) {
        const float *k = kt + I2S_ATT_KT(hd, j, 0);
        for (int i = 0; i < i8; i += 8) scores8x32(hd, q + (size_t)i * qs, qs, k, sc, s + (size_t)i * ss + j, ss);
    }
    /* keys [nk32, nk) start a block of kt (nk32 is a multiple of I2S_ATT_KB) */
    if (i8 && nk32 < nk) i2s_avx2_att_scores(hd, i8, q, qs, nk - nk32, kt + I2S_ATT_KT(hd, nk32, 0), scale, s + nk32, ss);
    if (i8 < nq) i2s_avx2_att_scores(hd, nq - i8, q + (size_t)i8 * qs, qs, nk, kt, scale, s + (size_t)i8 * ss, ss);
}

/* 32 output elements of eight queries over the tile's values */
ALWAYS_INLINE void pv8x32(int hd, int nk, const float *p, size_t ps, const float *v, const float *alpha, float *o,
                          size_t os) {
    __m512 a[8], b[8];
    const float *pi[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        const __m512 al = _mm512_set1_ps(alpha[i]);
        float *oi = o + (size_t)i * os;
        a[i] = _mm512_mul_ps(_mm512_loadu_ps(oi), al), b[i] = _mm512_mul_ps(_mm512_loadu_ps(oi + 16), al);
        pi[i] = p + (size_t)i * ps;
    }
    for (int j = 0; j < nk; j++, v += hd) {
        const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const __m512 x = BQ16(pi[i], j);
            a[i] = FMA16(x, v0, a[i]), b[i] = FMA16(x, v1, b[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) _mm512_storeu_ps(o + (size_t)i * os, a[i]), _mm512_storeu_ps(o + (size_t)i * os + 16, b[i]);
}

/* columns [c0, hd) of one query: 16 at a time, then one by one */
static void pv1(int c0, int hd, int nk, const float *p, const float *v, float alpha, float *o) {
    int c = c0;
    for (; c + 16 <= hd; c += 16) {
        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(o + c), _mm512_set1_ps(alpha));
        for (int j = 0; j < nk; j++) a = FMA16(_mm512_set1_ps(p[j]), _mm512_loadu_ps(v + (size_t)j * hd + c), a);
        _mm512_storeu_ps(o + c, a);
    }
    for (; c < hd; c++) {
        float acc = o[c] * alpha;
        for (int j = 0; j < nk; j++) acc = fmaf(p[j], v[(size_t)j * hd + c], acc);
        o[c] = acc;
    }
}

static void att_pv(int hd, int nq, int nk, const float *p, size_t ps, const float *v, const float *alpha, float *o,
                   size_t os) {
    const int hd32 = hd - hd % 32, i8 = nq - nq % 8;
    for (int c = 0; c < hd32; c += 32)
        for (int i = 0; i < i8; i += 8) pv8x32(hd, nk, p + (size_t)i * ps, ps, v + c, alpha + i, o + (size_t)i * os + c, os);
    for (int i = 0; i < i8 && hd32 < hd; i++) pv1(hd32, hd, nk, p + (size_t)i * ps, v, alpha[i], o + (size_t)i * os);
    if (i8 < nq) i2s_avx2_att_pv(hd, nq - i8, nk, p + (size_t)i8 * ps, ps, v, alpha + i8, o + (size_t)i8 * os, os);
}
#undef BQ16
#undef FMA16

const i2s_kernel_table i2s_kernels_avx512 = {
    .name = "avx512",
    .dot = dot,
    .dot4 = dot4,
    .dot_rows4 = dot_rows4,
    .dot_rows2x8 = dot_rows2x8,
    .quantize_act = i2s_avx2_quantize_act,
    .dot_f16 = i2s_avx2_dot_f16,
    .dot_f32 = i2s_avx2_dot_f32,
    .epilogue = i2s_avx2_epilogue,
    .act_mul = i2s_avx2_act_mul,
    .norm_mul = i2s_avx2_norm_mul,
    .att_scores = att_scores,
    .att_softmax = i2s_avx2_att_softmax, /* AVX2's: a small share of the time */
    .att_pv = att_pv,
};
