/* kern_avx2.c: AVX2 kernels (compiled with -mavx2 -mfma -mf16c on x86-64 only; chosen at run
 * time when the CPU has AVX2, FMA and F16C). Twin: kern_scalar.c, which states the rules.
 *
 * Quantizer: the same float32 operations as the scalar twin, eight lanes at a time. gcc's
 * _mm256_mul_ps / _mm256_add_ps are plain vector `*` and `+`, which -ffp-contract=fast would
 * fuse into vfmadd under -mfma: the pragma keeps them two roundings (the tests compare bytes).
 *
 * Integer sums use the sign trick: maddubs multiplies unsigned by signed bytes, so
 * |w| = sign(w, w) becomes the unsigned operand and x * sign(w) = sign(x, w) the signed one;
 * |w| * (x * sign(w)) = w * x. Pairs of products fit int16 (2 * 127 * 127 = 32258 < 32767,
 * no saturation) and madd with ones widens them to int32. This is why the loader refuses the
 * Q8_0 byte -128 (seed): with w = -128, sign(x, w) would have to negate an x of -128. Q8_0
 * activations and weights are in [-127, 127], and Q4_0 weights in [-8, 7], so it is exact.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>
#include <math.h>

#include "kernels.h"

static inline float hmax8(__m256 v) { /* max is exact: any order gives the scalar result */
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static void quantize_q8_0(const float *x, int n, int8_t *q, float *d) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 signmask = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    /* packs interleave 128-bit lanes: this restores element order */
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < n / QK; b++, x += QK, q += QK) {
        __m256 v[4];
        __m256 acc = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            acc = _mm256_max_ps(_mm256_and_ps(v[k], absmask), acc); /* NaN |x| loses: acc kept */
        }
        float amax = hmax8(acc);
        if (amax < 1e-30f) {
            d[b] = 0.0f;
            _mm256_storeu_si256((__m256i *)q, _mm256_setzero_si256());
            continue;
        }
        const __m256 id = _mm256_set1_ps(127.0f / amax);
        d[b] = amax / 127.0f;
        __m256i i[4];
        for (int k = 0; k < 4; k++) {
            __m256 t = _mm256_mul_ps(v[k], id);
            t = _mm256_add_ps(t, _mm256_or_ps(_mm256_and_ps(v[k], signmask), half));
            t = _mm256_min_ps(_mm256_max_ps(t, lo), hi); /* NaN -> -127, as the scalar twin */
            i[k] = _mm256_cvttps_epi32(t);               /* truncation */
        }
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p, perm));
    }
}

/* 8 int32 partial sums of one block: w and x as 32 signed bytes each. */
static inline __m256i block_i8(__m256i w, __m256i x) {
    __m256i aw = _mm256_sign_epi8(w, w);
    __m256i sx = _mm256_sign_epi8(x, w);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
}

static inline __m256i block_q8_0(const int8_t *w, const int8_t *x) {
    return block_i8(_mm256_loadu_si256((const __m256i *)w), _mm256_loadu_si256((const __m256i *)x));
}

/* Q4_0: 16 bytes, element j in the low nibble of byte j and j + 16 in the high nibble, so
 * [bytes & 15 | bytes >> 4] is elements 0..31 in order; minus 8 gives the signed weights. */
static inline __m256i block_q4_0(const uint8_t *w, const int8_t *x) {
    __m128i b = _mm_loadu_si128((const __m128i *)w);
    __m128i m = _mm_set1_epi8(0x0F);
    __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
    __m256i ws = _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
    return block_i8(ws, _mm256_loadu_si256((const __m256i *)x));
}

/* The four block sums of four 8-lane partials, in block order (integer: exact in any order). */
static inline __m128i hsum4(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

static inline int32_t hsum1(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

#define QB(w, b) ((w) + (size_t)(b) * QK)        /* Q8_0 block b */
#define Q4B(w, b) ((w) + (size_t)(b) * (QK / 2)) /* Q4_0 block b */

static void isums_q8_0(int nb, const int8_t *w, const int8_t *x, int32_t *out) {
    int b = 0;
    for (; b + 4 <= nb; b += 4)
        _mm_storeu_si128((__m128i *)(out + b),
                         hsum4(block_q8_0(QB(w, b), QB(x, b)), block_q8_0(QB(w, b + 1), QB(x, b + 1)),
                               block_q8_0(QB(w, b + 2), QB(x, b + 2)), block_q8_0(QB(w, b + 3), QB(x, b + 3))));
    for (; b < nb; b++) out[b] = hsum1(block_q8_0(QB(w, b), QB(x, b)));
}

static void isums_q4_0(int nb, const uint8_t *w, const int8_t *x, int32_t *out) {
    int b = 0;
    for (; b + 4 <= nb; b += 4)
        _mm_storeu_si128((__m128i *)(out + b),
                         hsum4(block_q4_0(Q4B(w, b), QB(x, b)), block_q4_0(Q4B(w, b + 1), QB(x, b + 1)),
                               block_q4_0(Q4B(w, b + 2), QB(x, b + 2)), block_q4_0(Q4B(w, b + 3), QB(x, b + 3))));
    for (; b < nb; b++) out[b] = hsum1(block_q4_0(Q4B(w, b), QB(x, b)));
}

/* Dots in the scalar twin's order: lane k of acc takes blocks b = k (mod 4); each term is
 * (wd * xd) * isum, two roundings (no FMA); then (l0 + l1) + (l2 + l3); then the tail. */
static inline __m128 terms4(const float *wd, const float *xd, __m128i isum) {
    __m128 s = _mm_mul_ps(_mm_loadu_ps(wd), _mm_loadu_ps(xd));
    return _mm_mul_ps(s, _mm_cvtepi32_ps(isum));
}

static inline float lanes(__m128 acc) {
    __m128 h = _mm_hadd_ps(acc, acc); /* l0 + l1, l2 + l3 */
    return _mm_cvtss_f32(_mm_hadd_ps(h, h));
}

static inline float tail(float s, float wd, float xd, int32_t isum) {
    float t = wd * xd;
    t = t * (float)isum;
    return s + t;
}

static float dot_q8_0(int nb, const int8_t *w, const float *wd, const int8_t *x, const float *xd) {
    __m128 acc = _mm_setzero_ps();
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        __m128i is = hsum4(block_q8_0(QB(w, b), QB(x, b)), block_q8_0(QB(w, b + 1), QB(x, b + 1)),
                           block_q8_0(QB(w, b + 2), QB(x, b + 2)), block_q8_0(QB(w, b + 3), QB(x, b + 3)));
        acc = _mm_add_ps(acc, terms4(wd + b, xd + b, is));
    }
    float s = lanes(acc);
    for (; b < nb; b++) s = tail(s, wd[b], xd[b], hsum1(block_q8_0(QB(w, b), QB(x, b))));
    return s;
}

static float dot_q4_0(int nb, const uint8_t *w, const float *wd, const int8_t *x, const float *xd) {
    __m128 acc = _mm_setzero_ps();
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        __m128i is = hsum4(block_q4_0(Q4B(w, b), QB(x, b)), block_q4_0(Q4B(w, b + 1), QB(x, b + 1)),
                           block_q4_0(Q4B(w, b + 2), QB(x, b + 2)), block_q4_0(Q4B(w, b + 3), QB(x, b + 3)));
        acc = _mm_add_ps(acc, terms4(wd + b, xd + b, is));
    }
    float s = lanes(acc);
    for (; b < nb; b++) s = tail(s, wd[b], xd[b], hsum1(block_q4_0(Q4B(w, b), QB(x, b))));
    return s;
}

const ml_kernel_table ml_kernels_avx2 = {
    .name = "avx2",
    .quantize_q8_0 = quantize_q8_0,
    .isums_q8_0 = isums_q8_0,
    .isums_q4_0 = isums_q4_0,
    .dot_q8_0 = dot_q8_0,
    .dot_q4_0 = dot_q4_0,
};
