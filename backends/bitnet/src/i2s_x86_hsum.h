/* i2s_x86_hsum.h: horizontal int32 sums of AVX2 vectors, shared by the AVX2 and AVX-VNNI tables
 * (both compiled with -mavx2). */
#ifndef I2S_X86_HSUM_H
#define I2S_X86_HSUM_H

#include <immintrin.h>
#include <stdint.h>

static inline int32_t hsum8(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* the four int32 totals of a, b, c, d (8 lanes each) */
static inline __m128i hsum8x4(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

#endif
