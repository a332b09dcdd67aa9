/* i2s_x86_hsum.h: horizontal sums of AVX2 vectors (int32, and the float dots' tree), shared by the
 * x86 tables (all compiled with -mavx2). */
#ifndef I2S_X86_HSUM_H
#define I2S_X86_HSUM_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

static inline int32_t hsum8(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* The float dots' tree ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) of eight dots at once,
 * running sum j in lane j: a[i] key 0 against query i, b[i] key 1. Two hadd levels give each
 * dot's (s0 + s1) + (s2 + s3) in the low 128 bits and (s4 + s5) + (s6 + s7) in the high; their
 * sum is the last step. out[i * os] = key 0's dot with query i, out[i * os + 1] key 1's. */
static inline void f32_tree_2x4(const __m256 a[4], const __m256 b[4], float *out, size_t os) {
    __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(b[0], b[1]), _mm256_hadd_ps(b[2], b[3]));
    float r[8];
    _mm256_storeu_ps(r, _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31)));
    for (int i = 0; i < 4; i++) out[(size_t)i * os] = r[i], out[(size_t)i * os + 1] = r[4 + i];
}

/* the four int32 totals of a, b, c, d (8 lanes each) */
static inline __m128i hsum8x4(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* The prefill tile's stores: r0[i] and r1[i] (token t0 + i's dots with rows 0 and 1) go to
 * out[(t0 + i) * os] and out[(t0 + i) * os + 1], two int32 a store. */
static inline void store_rows2(__m128i r0, __m128i r1, int32_t *out, size_t os, int t0) {
    const __m128 lo = _mm_castsi128_ps(_mm_unpacklo_epi32(r0, r1)), hi = _mm_castsi128_ps(_mm_unpackhi_epi32(r0, r1));
    _mm_storel_pi((__m64 *)(out + (size_t)t0 * os), lo);
    _mm_storeh_pi((__m64 *)(out + (size_t)(t0 + 1) * os), lo);
    _mm_storel_pi((__m64 *)(out + (size_t)(t0 + 2) * os), hi);
    _mm_storeh_pi((__m64 *)(out + (size_t)(t0 + 3) * os), hi);
}

#endif
