/* i2s_avxvnni.c: I2_S integer dots with AVX-VNNI (VEX vpdpbusd, 256-bit; compiled with -mavx2
 * -mfma -mf16c -mavxvnni on x86-64 only; chosen at run time when the CPU has AVX-VNNI and AVX2).
 * Twin: i2s_scalar.c (specs/i2s.yaml `dot`).
 *
 * vpdpbusd multiplies four unsigned bytes by four signed bytes and adds the four products to an
 * int32 lane, without saturation: the 2-bit codes as stored (0..3) against the int8 activations.
 * A block's packed byte j holds the codes of elements j, j+32, j+64, j+96 in bits 7..6, 5..4,
 * 3..2, 1..0: three 16-bit shifts and four masks unpack the block into four 32-byte code vectors,
 * each against the 32 activations they belong to. Every sum is an exact int32 (|lane| grows by at
 * most 4 * 3 * 128 per instruction: n < 2^22 values stay far below 2^31), in any order: the
 * scalar twin's. Float kernels (quantize_act, dot_f16, dot_f32): AVX2's.
 */
#include <immintrin.h>

#include "i2s_kernels.h"
#include "i2s_x86_hsum.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* The four code vectors of one packed block (32 bytes at w): c[g] = codes of elements 32g.. */
ALWAYS_INLINE void unpack(const uint8_t *w, __m256i c[4]) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i v = load32(w);
    c[0] = _mm256_and_si256(_mm256_srli_epi16(v, 6), m3);
    c[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m3);
    c[2] = _mm256_and_si256(_mm256_srli_epi16(v, 2), m3);
    c[3] = _mm256_and_si256(v, m3);
}

/* acc + sum over the block of codes c against activations x[0..127] */
ALWAYS_INLINE __m256i block_dot(__m256i acc, const __m256i c[4], const int8_t *x) {
    acc = _mm256_dpbusd_avx_epi32(acc, c[0], load32(x));
    acc = _mm256_dpbusd_avx_epi32(acc, c[1], load32(x + 32));
    acc = _mm256_dpbusd_avx_epi32(acc, c[2], load32(x + 64));
    return _mm256_dpbusd_avx_epi32(acc, c[3], load32(x + 96));
}

static int32_t dot(int n, const uint8_t *w, const int8_t *x) {
    __m256i acc = _mm256_setzero_si256();
    for (int b = 0; b < n / I2S_BLOCK; b++) {
        __m256i c[4];
        unpack(w + (size_t)b * I2S_BLOCK_BYTES, c);
        acc = block_dot(acc, c, x + (size_t)b * I2S_BLOCK);
    }
    return hsum8(acc);
}

/* One weight row, four activation rows: each block is unpacked once for the four. */
static void dot4(int n, const uint8_t *w, const int8_t *const x[4], int32_t out[4]) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int b = 0; b < n / I2S_BLOCK; b++) {
        __m256i c[4];
        unpack(w + (size_t)b * I2S_BLOCK_BYTES, c);
        const size_t o = (size_t)b * I2S_BLOCK;
        a0 = block_dot(a0, c, x[0] + o);
        a1 = block_dot(a1, c, x[1] + o);
        a2 = block_dot(a2, c, x[2] + o);
        a3 = block_dot(a3, c, x[3] + o);
    }
    _mm_storeu_si128((__m128i *)out, hsum8x4(a0, a1, a2, a3));
}

/* Two consecutive weight rows, eight activation rows (the prefill tile), one row at a time:
 * eight accumulators and a block's four code vectors fill twelve of the 16 YMM registers. */
static void dot_rows2x8(int n, const uint8_t *w, const int8_t *const x[8], int32_t *out, size_t os) {
    const size_t rs = (size_t)(n / 4);
    __m128i sums[2][2]; /* [row][tokens 0..3, 4..7] */
    for (int r = 0; r < 2; r++) {
        __m256i a[8];
        for (int t = 0; t < 8; t++) a[t] = _mm256_setzero_si256();
        for (int b = 0; b < n / I2S_BLOCK; b++) {
            __m256i c[4];
            unpack(w + (size_t)r * rs + (size_t)b * I2S_BLOCK_BYTES, c);
            const size_t o = (size_t)b * I2S_BLOCK;
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) a[t] = block_dot(a[t], c, x[t] + o);
        }
        sums[r][0] = hsum8x4(a[0], a[1], a[2], a[3]);
        sums[r][1] = hsum8x4(a[4], a[5], a[6], a[7]);
    }
    store_rows2(sums[0][0], sums[1][0], out, os, 0);
    store_rows2(sums[0][1], sums[1][1], out, os, 4);
}

/* Four consecutive weight rows, one activation row (the matvec path), the next four rows
 * prefetched as in the AVX2 table. Two accumulators per row (code vectors 0, 1 and 2, 3): with
 * one, a row's four vpdpbusd per block were one chain of latencies, and this table ran the
 * 4096 x 4096 matvec at 0.24 ms against AVX2's 0.10 (AMD EPYC, cached). */
static void dot_rows4(int n, const uint8_t *w, const int8_t *x, int32_t out[4]) {
    const size_t rs = (size_t)(n / 4);
    __m256i a[4], e[4];
    for (int r = 0; r < 4; r++) a[r] = e[r] = _mm256_setzero_si256();
    for (int b = 0; b < n / I2S_BLOCK; b++) {
        _mm_prefetch((const char *)(w + 4 * rs) + 128 * (size_t)b, _MM_HINT_T0);
        _mm_prefetch((const char *)(w + 4 * rs) + 128 * (size_t)b + 64, _MM_HINT_T0);
        const int8_t *xb = x + (size_t)b * I2S_BLOCK;
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m256i c[4];
            unpack(w + (size_t)r * rs + (size_t)b * I2S_BLOCK_BYTES, c);
            a[r] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(a[r], c[0], load32(xb)), c[1], load32(xb + 32));
            e[r] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(e[r], c[2], load32(xb + 64)), c[3], load32(xb + 96));
        }
    }
    _mm_storeu_si128((__m128i *)out, hsum8x4(_mm256_add_epi32(a[0], e[0]), _mm256_add_epi32(a[1], e[1]),
                                             _mm256_add_epi32(a[2], e[2]), _mm256_add_epi32(a[3], e[3])));
}

const i2s_kernel_table i2s_kernels_avxvnni = {
    .name = "avxvnni",
    .dot = dot,
    .dot4 = dot4,
    .dot_rows4 = dot_rows4,
    .dot_rows2x8 = dot_rows2x8,
    I2S_AVX2_FLOAT_OPS,
};
