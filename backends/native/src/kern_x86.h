/* kern_x86.h: the x86-64 kernels. kern_avx2.c, kern_avxvnni.c and kern_avx512.c include it, each
 * compiled with its ISA's flags (build.py ISA_FLAGS), and each declares its table; one is chosen
 * at run time from cpuid and the OS's enabled state (dispatch.c). Twin: kern_scalar.c, which
 * states the rules. No path without a test that runs it where the hardware exists
 * (tests/test_native_kernels.py compares every table with the scalar twin).
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
 *
 * With VNNI (AVX-VNNI's VEX vpdpbusd, or AVX-512 VNNI's EVEX one on 256-bit vectors with
 * AVX512VL) one instruction sums four u8 x s8 products into an int32 lane, where AVX2 needs
 * maddubs (int16 pairs) then madd: the same exact integers, so every table gives the same bits.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD_ACC(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(__AVXVNNI__)
#define DPBUSD_ACC(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#endif
#ifdef DPBUSD_ACC
#define DPBUSD(u, s) DPBUSD_ACC(_mm256_setzero_si256(), (u), (s))
#endif

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

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define QB(w, b) ((w) + (size_t)(b) * QK)        /* Q8_0 block b */
#define Q4B(w, b) ((w) + (size_t)(b) * (QK / 2)) /* Q4_0 block b */

ALWAYS_INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 int16 pair sums of one block, given |w| (aw) and w: |w| * (x * sign(w)) = w * x */
ALWAYS_INLINE __m256i pairs_i8(__m256i aw, __m256i w, __m256i x) {
    return _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
}

/* 8 int32 partial sums of one block, given |w| (aw) and w */
ALWAYS_INLINE __m256i part_i8(__m256i aw, __m256i w, __m256i x) {
#ifdef DPBUSD
    return DPBUSD(aw, _mm256_sign_epi8(x, w));
#else
    return _mm256_madd_epi16(pairs_i8(aw, w, x), _mm256_set1_epi16(1));
#endif
}

/* 8 int32 partial sums of one block: w and x as 32 signed bytes each. */
ALWAYS_INLINE __m256i block_i8(__m256i w, __m256i x) { return part_i8(_mm256_sign_epi8(w, w), w, x); }

ALWAYS_INLINE __m256i block_q8_0(const int8_t *w, const int8_t *x) { return block_i8(load32(w), load32(x)); }

/* Q4_0: 16 bytes, element j in the low nibble of byte j and j + 16 in the high nibble, so
 * [bytes & 15 | bytes >> 4] is elements 0..31 in order: the unsigned nibbles u = w + 8. */
ALWAYS_INLINE __m256i nibbles(const uint8_t *w) {
    __m128i b = _mm_loadu_si128((const __m128i *)w);
    __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

ALWAYS_INLINE __m256i unpack_q4_0(const uint8_t *w) { return _mm256_sub_epi8(nibbles(w), _mm256_set1_epi8(8)); }

ALWAYS_INLINE __m256i block_q4_0(const uint8_t *w, const int8_t *x) {
#ifdef DPBUSD /* u x - 8 x in int32: no sign trick needed, u is a fine unsigned operand */
    __m256i xv = load32(x);
    return _mm256_sub_epi32(DPBUSD(nibbles(w), xv), DPBUSD(_mm256_set1_epi8(8), xv));
#else
    return block_i8(unpack_q4_0(w), load32(x));
#endif
}

/* Q4_0 pair sums without the sign trick: u is a fine unsigned operand, and maddubs(u, x) -
 * maddubs(8, x) is the pairs of (u - 8) x = w x, exact: |u x pair| <= 3810, |8 x pair| <= 2032. */
ALWAYS_INLINE __m256i pairs_q4_0(const uint8_t *w, const int8_t *x) {
    __m256i xv = load32(x);
    return _mm256_sub_epi16(_mm256_maddubs_epi16(nibbles(w), xv), _mm256_maddubs_epi16(_mm256_set1_epi8(8), xv));
}

/* Four blocks' 8-lane partials reduced to [s0 s1 s2 s3] in each 128-bit half (integers: exact
 * in any order); hsum4 adds the halves: the four block sums in block order. */
ALWAYS_INLINE __m256i hsum4_halves(__m256i a, __m256i b, __m256i c, __m256i d) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
}

ALWAYS_INLINE __m128i add_halves(__m256i s) {
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

ALWAYS_INLINE __m128i hsum4(__m256i a, __m256i b, __m256i c, __m256i d) { return add_halves(hsum4_halves(a, b, c, d)); }

/* The same from four blocks' int16 pair sums when every product is at most 8 * 127 (Q4_0): two
 * hadd_epi16 keep sums of 8 products (<= 8128) in int16, one madd widens them: 3 madds fewer. */
ALWAYS_INLINE __m256i hsum4_16_halves(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i s = _mm256_hadd_epi16(_mm256_hadd_epi16(a, b), _mm256_hadd_epi16(c, d));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

ALWAYS_INLINE __m128i hsum4_16(__m256i a, __m256i b, __m256i c, __m256i d) {
    return add_halves(hsum4_16_halves(a, b, c, d));
}

/* [low half + high half of a | of b]: two rows' or two groups' block sums in one vector */
ALWAYS_INLINE __m256i join_halves(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

static inline int32_t hsum1(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

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
ALWAYS_INLINE __m128 terms4(__m128 wd4, const float *xd, __m128i isum) {
    __m128 s = _mm_mul_ps(wd4, _mm_loadu_ps(xd));
    return _mm_mul_ps(s, _mm_cvtepi32_ps(isum));
}

static inline float lanes(__m128 acc) {
    __m128 h = _mm_hadd_ps(acc, acc); /* l0 + l1, l2 + l3 */
    return _mm_cvtss_f32(_mm_hadd_ps(h, h));
}

/* s + the terms of the blocks whose sums are in is[0..], from block b to nb - 1, in order */
static inline float tail(float s, int b, int nb, const float *wd, const float *xd, __m128i isum) {
    int32_t is[4];
    _mm_storeu_si128((__m128i *)is, isum);
    for (int k = 0; b < nb; b++, k++) {
        float t = wd[b] * xd[b];
        t = t * (float)is[k];
        s = s + t;
    }
    return s;
}

/* Eight blocks per step: their sums in one vector [b..b+3 | b+4..b+7], the terms computed 8 wide,
 * then added to the 4 lanes low half first: the order of two steps of four. */
#define DOT1(BLOCK, HSUM_HALVES, HSUM)                                                          \
    do {                                                                                        \
        __m128 acc = _mm_setzero_ps();                                                          \
        int b = 0;                                                                              \
        for (; b + 8 <= nb; b += 8) {                                                           \
            __m256i lo = HSUM_HALVES(BLOCK(b), BLOCK(b + 1), BLOCK(b + 2), BLOCK(b + 3));       \
            __m256i hi = HSUM_HALVES(BLOCK(b + 4), BLOCK(b + 5), BLOCK(b + 6), BLOCK(b + 7));   \
            __m256i is = join_halves(lo, hi);                                                   \
            __m256 t = _mm256_mul_ps(_mm256_loadu_ps(wd + b), _mm256_loadu_ps(xd + b));         \
            t = _mm256_mul_ps(t, _mm256_cvtepi32_ps(is));                                       \
            acc = _mm_add_ps(acc, _mm256_castps256_ps128(t));                                   \
            acc = _mm_add_ps(acc, _mm256_extractf128_ps(t, 1));                                 \
        }                                                                                       \
        if (b + 4 <= nb) {                                                                      \
            acc = _mm_add_ps(acc, terms4(_mm_loadu_ps(wd + b), xd + b,                          \
                                         HSUM(BLOCK(b), BLOCK(b + 1), BLOCK(b + 2), BLOCK(b + 3)))); \
            b += 4;                                                                             \
        }                                                                                       \
        float s = lanes(acc);                                                                   \
        if (b == nb) return s;                                                                  \
        __m256i p[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), \
                        _mm256_setzero_si256()};                                                \
        for (int k = 0; b + k < nb; k++) p[k] = BLOCK(b + k);                                   \
        return tail(s, b, nb, wd, xd, HSUM(p[0], p[1], p[2], p[3])); /* absent blocks: 0 */     \
    } while (0)

#define BLOCK_Q8(b) block_q8_0(QB(w, b), QB(x, b))
#define PAIRS_Q4(b) pairs_q4_0(Q4B(w, b), QB(x, b))

static float dot_q8_0(int nb, const int8_t *w, const float *wd, const int8_t *x, const float *xd) {
    DOT1(BLOCK_Q8, hsum4_halves, hsum4);
}

#define BLOCK_Q4(b) block_q4_0(Q4B(w, b), QB(x, b))

static float dot_q4_0(int nb, const uint8_t *w, const float *wd, const int8_t *x, const float *xd) {
#ifdef DPBUSD
    DOT1(BLOCK_Q4, hsum4_halves, hsum4);
#else
    DOT1(PAIRS_Q4, hsum4_16_halves, hsum4_16);
#endif
}

/* Four rows x[t]: a weight block's |w| (and Q4_0's unpacking) is computed once for the four,
 * then row t takes dot_q8_0's steps: rows 0, 1 share the accumulator acc01 (row 0 in the low
 * half, lane k its lane k), rows 2, 3 acc23, so that the reduction's last steps and the terms
 * run 8 wide. Written out without arrays of vectors: gcc -O2 keeps those in memory (and stores
 * them in halves). */

#ifdef DPBUSD /* PART: a block's int32 partials; the same reduction for both formats */
#define PART part_i8
#define HSUM_Q8 hsum4_halves
#define HSUM_Q4 hsum4_halves
#else /* PART: int16 pairs; Q8_0 madds them to int32 first (2 * 127 * 127 pairs do not add in int16) */
#define PART pairs_i8
#define HSUM_Q8(a, b, c, d)                                                                      \
    hsum4_halves(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones), _mm256_madd_epi16(c, ones), \
                 _mm256_madd_epi16(d, ones))
#define HSUM_Q4 hsum4_16_halves
#endif

/* blocks b..b+3 of row x against the weight blocks w0..w3 (|w| in a0..a3), halves not added */
#define ROW_HALVES(HSUM, x)                                                                      \
    HSUM(PART(a0, w0, load32(x)), PART(a1, w1, load32((x) + QK)),                                \
         PART(a2, w2, load32((x) + 2 * QK)), PART(a3, w3, load32((x) + 3 * QK)))

/* acc (rows t, u in the low, high half) + their terms of blocks b..b+3 */
#define TWO_ROWS(HSUM, acc, t, u)                                                                \
    do {                                                                                         \
        __m256i is = join_halves(ROW_HALVES(HSUM, QB(x[t], b)), ROW_HALVES(HSUM, QB(x[u], b)));   \
        __m256 sc = _mm256_mul_ps(wd8, _mm256_loadu2_m128(xd[u] + b, xd[t] + b));                 \
        acc = _mm256_add_ps(acc, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(is)));                      \
    } while (0)

/* lane t: s + (wd * xd[t][b]) * isum_t, tail's steps, for weight block w of block b */
ALWAYS_INLINE __m128 tail4(__m128 s, float wd, const float *const xd[4], int b, __m256i w, const int8_t *const x[4]) {
    __m256i a = _mm256_sign_epi8(w, w);
    __m128i is = hsum4(part_i8(a, w, load32(QB(x[0], b))), part_i8(a, w, load32(QB(x[1], b))),
                       part_i8(a, w, load32(QB(x[2], b))), part_i8(a, w, load32(QB(x[3], b))));
    __m128 t = _mm_mul_ps(_mm_set1_ps(wd), _mm_setr_ps(xd[0][b], xd[1][b], xd[2][b], xd[3][b]));
    t = _mm_mul_ps(t, _mm_cvtepi32_ps(is));
    return _mm_add_ps(s, t);
}

/* The body of dot4_*: LOAD(b) gives weight block b as 32 signed bytes. */
#define DOT4(LOAD, HSUM)                                                                         \
    do {                                                                                         \
        const __m256i ones = _mm256_set1_epi16(1);                                               \
        (void)ones;                                                                              \
        __m256 acc01 = _mm256_setzero_ps(), acc23 = acc01;                                       \
        int b = 0;                                                                               \
        for (; b + 4 <= nb; b += 4) {                                                            \
            __m256i w0 = LOAD(b), w1 = LOAD(b + 1), w2 = LOAD(b + 2), w3 = LOAD(b + 3);          \
            __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);                \
            __m256i a2 = _mm256_sign_epi8(w2, w2), a3 = _mm256_sign_epi8(w3, w3);                \
            const __m256 wd8 = _mm256_broadcast_ps((const __m128 *)(wd + b));                    \
            TWO_ROWS(HSUM, acc01, 0, 1);                                                         \
            TWO_ROWS(HSUM, acc23, 2, 3);                                                         \
        }                                                                                        \
        /* lane t: (l0 + l1) + (l2 + l3) of row t */                                              \
        __m128 s = _mm_hadd_ps(_mm_hadd_ps(_mm256_castps256_ps128(acc01), _mm256_extractf128_ps(acc01, 1)),   \
                               _mm_hadd_ps(_mm256_castps256_ps128(acc23), _mm256_extractf128_ps(acc23, 1)));  \
        for (; b < nb; b++) s = tail4(s, wd[b], xd, b, LOAD(b), x);                              \
        _mm_storeu_ps(out, s);                                                                   \
    } while (0)

#define LOAD_Q8(b) load32(QB(w, b))
#define LOAD_Q4(b) unpack_q4_0(Q4B(w, b))

static void dot4_q8_0(int nb, const int8_t *w, const float *wd, const int8_t *const x[4], const float *const xd[4],
                      float out[4]) {
    DOT4(LOAD_Q8, HSUM_Q8);
}

static void dot4_q4_0(int nb, const uint8_t *w, const float *wd, const int8_t *const x[4], const float *const xd[4],
                      float out[4]) {
    DOT4(LOAD_Q4, HSUM_Q4);
}

/* The packed GEMM (kernels.h gemm8_*): lane r of every vector is row r of the group, so a block's
 * 8 integer sums come out of vertical operations, and the float terms and the four running sums
 * of dot_* (lane k of the single-row dot: here the accumulator acc[t][k]) are vertical too. A tile
 * of TT tokens shares each block's loaded and unpacked weights; acc needs 4 TT vectors, so AVX-512
 * (32 vector registers) takes 4 tokens per tile and the VEX tables (16) 2.
 *
 * AVX-512 takes the groups in pairs on 512-bit vectors: group j's 8 rows in the low half, group
 * j + 1's in the high half (gs bytes and ds scales further on). Each lane does the 8-row tile's
 * operations in its order, so the same bits, with half the instructions per row: the block
 * operands, the scales and the float terms serve 16 rows. SmolLM2-135M prefill 1.30x (AMD EPYC).
 * Only for a chunk of at least one full tile (nt >= TT): with fewer tokens nothing amortizes the
 * two-group loads, and the 8-row path was faster on decode (SmolLM2 Q4_0 1.44x, Q8_0 1.27x) and on
 * 2 and 3 tokens (1.19x, 1.14x), AMD EPYC Zen 4, 2 threads, the two libraries in one process. */
#ifdef __AVX512VL__
#define TT 4
#else
#define TT 2
#endif

ALWAYS_INLINE __m256i bcast4(const int8_t *p) { /* x's bytes p[0..3] in every lane */
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* Block operands U[g], g < 8, lane r: row r's bytes against x's bytes 4g..4g+3 (both formats) */
ALWAYS_INLINE void operands8_q8_0(const uint8_t *p, size_t gs, __m256i U[8]) {
    (void)gs;
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        U[g] = load32(p + 32 * g); /* w + 128: vpdpbusd's unsigned operand */
#ifndef DPBUSD_ACC
        U[g] = _mm256_xor_si256(U[g], _mm256_set1_epi8((char)0x80)); /* w, for the sign trick */
#endif
    }
}

ALWAYS_INLINE void operands8_q4_0(const uint8_t *p, size_t gs, __m256i U[8]) {
    (void)gs;
    const __m256i m = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        __m256i v = load32(p + 32 * g);
        U[g] = _mm256_and_si256(v, m);                         /* elements 4g.. + 8 */
        U[g + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m); /* elements 16 + 4g.. + 8 */
    }
}

#ifdef DPBUSD_ACC
/* sum_g u x over the block, per lane: two chains of four, so that two vpdpbusd latencies overlap */
ALWAYS_INLINE __m256i dp_groups(const __m256i U[8], const int8_t *xb) {
    __m256i a = DPBUSD(U[0], bcast4(xb)), c = DPBUSD(U[1], bcast4(xb + 4));
#pragma GCC unroll 4
    for (int g = 2; g < 8; g += 2) {
        a = DPBUSD_ACC(a, U[g], bcast4(xb + 4 * g));
        c = DPBUSD_ACC(c, U[g + 1], bcast4(xb + 4 * g + 4));
    }
    return _mm256_add_epi32(a, c);
}
#endif

/* The 8 rows' integer sums of a block against x's block xb (xs: the sum of its bytes). */
ALWAYS_INLINE __m256i sums8_q8_0(const __m256i U[8], const int8_t *xb, int32_t xs) {
#ifdef DPBUSD_ACC /* sum (w + 128) x - 128 sum x */
    return _mm256_sub_epi32(dp_groups(U, xb), _mm256_set1_epi32(128 * xs));
#else /* the sign trick on w: no offset */
    (void)xs;
    __m256i a = part_i8(_mm256_sign_epi8(U[0], U[0]), U[0], bcast4(xb));
    __m256i c = part_i8(_mm256_sign_epi8(U[1], U[1]), U[1], bcast4(xb + 4));
#pragma GCC unroll 4
    for (int g = 2; g < 8; g += 2) {
        a = _mm256_add_epi32(a, part_i8(_mm256_sign_epi8(U[g], U[g]), U[g], bcast4(xb + 4 * g)));
        c = _mm256_add_epi32(c, part_i8(_mm256_sign_epi8(U[g + 1], U[g + 1]), U[g + 1], bcast4(xb + 4 * g + 4)));
    }
    return _mm256_add_epi32(a, c);
#endif
}

ALWAYS_INLINE __m256i sums8_q4_0(const __m256i U[8], const int8_t *xb, int32_t xs) {
#ifdef DPBUSD_ACC /* sum u x - 8 sum x */
    return _mm256_sub_epi32(dp_groups(U, xb), _mm256_set1_epi32(8 * xs));
#else /* int16 pairs u x: |pair| <= 2 * 15 * 128, so the 8 groups' pairs add in int16 (<= 30720) */
    __m256i a = _mm256_maddubs_epi16(U[0], bcast4(xb)), c = _mm256_maddubs_epi16(U[1], bcast4(xb + 4));
#pragma GCC unroll 4
    for (int g = 2; g < 8; g += 2) {
        a = _mm256_add_epi16(a, _mm256_maddubs_epi16(U[g], bcast4(xb + 4 * g)));
        c = _mm256_add_epi16(c, _mm256_maddubs_epi16(U[g + 1], bcast4(xb + 4 * g + 4)));
    }
    __m256i s = _mm256_madd_epi16(_mm256_add_epi16(a, c), _mm256_set1_epi16(1));
    return _mm256_sub_epi32(s, _mm256_set1_epi32(8 * xs));
#endif
}

/* Block b's 8 packed scales: f16 (F16C's conversion is exact) or floats */
ALWAYS_INLINE __m256 scales8(const void *wd, int wd_f16, size_t b, size_t ds) {
    (void)ds;
    return wd_f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)wd + ML_PACK * b)))
                  : _mm256_loadu_ps((const float *)wd + ML_PACK * b);
}

/* (wd * xd) * isum for the 8 rows: term()'s two roundings */
ALWAYS_INLINE __m256 terms8(__m256 wd8, float xd, __m256i is) {
    return _mm256_mul_ps(_mm256_mul_ps(wd8, _mm256_set1_ps(xd)), _mm256_cvtepi32_ps(is));
}

#ifdef __AVX512F__
/* The same on 16 rows, the two groups' halves (above) */
ALWAYS_INLINE __m512i load2x32(const uint8_t *p, size_t gs) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load32(p)), load32(p + gs), 1);
}

ALWAYS_INLINE void operands16_q8_0(const uint8_t *p, size_t gs, __m512i U[8]) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) U[g] = load2x32(p + 32 * g, gs);
}

ALWAYS_INLINE void operands16_q4_0(const uint8_t *p, size_t gs, __m512i U[8]) {
    const __m512i m = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        __m512i v = load2x32(p + 32 * g, gs);
        U[g] = _mm512_and_si512(v, m);
        U[g + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
    }
}

ALWAYS_INLINE __m512i bcast4x16(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/* sum_g u x - off over the block, per lane, the offset (128 or 8 times x's byte sum) the first
 * chain's start: exact int32, so dp_groups' integer less the offset */
ALWAYS_INLINE __m512i sums16(const __m512i U[8], const int8_t *xb, int32_t off) {
    __m512i a = _mm512_dpbusd_epi32(_mm512_set1_epi32(-off), U[0], bcast4x16(xb));
    __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), U[1], bcast4x16(xb + 4));
#pragma GCC unroll 4
    for (int g = 2; g < 8; g += 2) {
        a = _mm512_dpbusd_epi32(a, U[g], bcast4x16(xb + 4 * g));
        c = _mm512_dpbusd_epi32(c, U[g + 1], bcast4x16(xb + 4 * g + 4));
    }
    return _mm512_add_epi32(a, c);
}

ALWAYS_INLINE __m512i sums16_q8_0(const __m512i U[8], const int8_t *xb, int32_t xs) { return sums16(U, xb, 128 * xs); }
ALWAYS_INLINE __m512i sums16_q4_0(const __m512i U[8], const int8_t *xb, int32_t xs) { return sums16(U, xb, 8 * xs); }

ALWAYS_INLINE __m512 scales16(const void *wd, int wd_f16, size_t b, size_t ds) {
    if (wd_f16) {
        const uint16_t *p = (const uint16_t *)wd + ML_PACK * b;
        __m128i lo = _mm_loadu_si128((const __m128i *)p), hi = _mm_loadu_si128((const __m128i *)(p + ds));
        return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
    }
    const float *p = (const float *)wd + ML_PACK * b;
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(p))),
                                               _mm256_castps_pd(_mm256_loadu_ps(p + ds)), 1));
}

ALWAYS_INLINE __m512 terms16(__m512 wd16, float xd, __m512i is) {
    return _mm512_mul_ps(_mm512_mul_ps(wd16, _mm512_set1_ps(xd)), _mm512_cvtepi32_ps(is));
}
#endif

/* One token (decode) reads every weight once: fetch the blocks PF bytes ahead of both groups'
 * streams into L1, which the hardware prefetcher alone does not keep up with */
#define PF 2048
ALWAYS_INLINE void prefetch_rows(const uint8_t *p, size_t gs, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) {
        _mm_prefetch((const char *)(p + PF + o), _MM_HINT_T0);
        if (gs) _mm_prefetch((const char *)(p + gs + PF + o), _MM_HINT_T0);
    }
}

/* Tokens t0..t0+TN-1 against R rows (8: one group on 256-bit vectors W; 16: two on 512-bit ones):
 * dot_*'s order per row and token, acc[i][k] its lane k */
#define GEMM_TILE(R, W, FMT, BYTES, TN)                                                          \
    do {                                                                                         \
        __m##W acc[TN][4];                                                                       \
        _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++)                                     \
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) acc[i][k] = _mm##W##_setzero_ps(); \
        int b = 0;                                                                               \
        for (; b + 4 <= nb; b += 4)                                                              \
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {                                \
                __m##W##i U[8];                                                                  \
                if (TN == 1) prefetch_rows(w + (size_t)(b + k) * (BYTES), R == 16 ? gs : 0, BYTES);  \
                operands##R##_##FMT(w + (size_t)(b + k) * (BYTES), gs, U);                       \
                const __m##W wdv = scales##R(wd, wd_f16, (size_t)(b + k), ds);                   \
                _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) {                           \
                    __m##W##i is = sums##R##_##FMT(U, QB(x[t0 + i], b + k), xs[t0 + i][b + k]);  \
                    acc[i][k] = _mm##W##_add_ps(acc[i][k], terms##R(wdv, xd[t0 + i][b + k], is)); \
                }                                                                                \
            }                                                                                    \
        __m##W s[TN];                                                                            \
        _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) s[i] =                              \
            _mm##W##_add_ps(_mm##W##_add_ps(acc[i][0], acc[i][1]), _mm##W##_add_ps(acc[i][2], acc[i][3])); \
        for (; b < nb; b++) {                                                                    \
            __m##W##i U[8];                                                                      \
            operands##R##_##FMT(w + (size_t)b * (BYTES), gs, U);                                 \
            const __m##W wdv = scales##R(wd, wd_f16, (size_t)b, ds);                             \
            _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) s[i] = _mm##W##_add_ps(         \
                s[i], terms##R(wdv, xd[t0 + i][b], sums##R##_##FMT(U, QB(x[t0 + i], b), xs[t0 + i][b]))); \
        }                                                                                        \
        _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++)                                     \
            _mm##W##_storeu_ps(out + (size_t)(t0 + i) * ldo, s[i]);                              \
    } while (0)

/* R rows (one group or two) against the nt tokens: tiles of TT, then the tokens left one by one */
#define GEMM_ROWS(R, W, FMT, BYTES)                                                              \
    static void rows##R##_##FMT(int nb, const uint8_t *w, const void *wd, int wd_f16, int nt,    \
                                const int8_t *const *x, const float *const *xd,                  \
                                const int32_t *const *xs, float *out, size_t ldo) {              \
        const size_t gs = (size_t)nb * (BYTES), ds = (size_t)nb * ML_PACK;                       \
        int t0 = 0;                                                                              \
        for (; t0 + TT <= nt; t0 += TT) GEMM_TILE(R, W, FMT, BYTES, TT);                         \
        for (; t0 < nt; t0++) GEMM_TILE(R, W, FMT, BYTES, 1);                                    \
    }
GEMM_ROWS(8, 256, q8_0, ML_PACK_Q8)
GEMM_ROWS(8, 256, q4_0, ML_PACK_Q4)
#ifdef __AVX512F__
GEMM_ROWS(16, 512, q8_0, ML_PACK_Q8)
GEMM_ROWS(16, 512, q4_0, ML_PACK_Q4)
#define PAIRS(FMT) for (; nt >= TT && j + 2 <= ng; j += 2) rows16_##FMT(nb, GROUP_ARGS(j))
#else
#define PAIRS(FMT) (void)0
#endif

/* kernels.h gemm8_*: the groups in pairs where the table has 512-bit vectors, the rest one by one */
#define GROUP_ARGS(j)                                                                            \
    w + (size_t)(j) * nb * bytes, (const uint8_t *)wd + (size_t)(j) * nb * ML_PACK * (wd_f16 ? 2 : 4), wd_f16, \
        nt, x, xd, xs, out + (size_t)(j) * ML_PACK, ldo
#define GEMM8(FMT, BYTES)                                                                        \
    static void gemm8_##FMT(int ng, int nb, const uint8_t *w, const void *wd, int wd_f16, int nt, \
                            const int8_t *const *x, const float *const *xd, const int32_t *const *xs, \
                            float *out, size_t ldo) {                                            \
        const size_t bytes = (BYTES);                                                            \
        int j = 0;                                                                               \
        PAIRS(FMT);                                                                              \
        for (; j < ng; j++) rows8_##FMT(nb, GROUP_ARGS(j));                                      \
    }
GEMM8(q8_0, ML_PACK_Q8)
GEMM8(q4_0, ML_PACK_Q4)

/* Attention (kernels.h scores_f32): 8 keys at a time, key r's 8 running sums in a[r] (lane j:
 * d = j mod 8); two hadd levels give each key's (s0 + s1) + (s2 + s3) in the low 128 bits and
 * (s4 + s5) + (s6 + s7) in the high, and their sum is the tree's last step, 8 keys wide. */
ALWAYS_INLINE float tree8(__m256 a) { /* one key: the same tree */
    __m256 h = _mm256_hadd_ps(a, a);
    h = _mm256_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

static void scores_f32(const float *q, const float *k, size_t stride, int nk, int hd, float *out) {
    int d8 = hd - hd % 8, i = 0;
    for (; i + 8 <= nk; i += 8) {
        const float *kr = k + (size_t)i * stride;
        __m256 a[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
        for (int d = 0; d < d8; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) a[r] = _mm256_add_ps(a[r], _mm256_mul_ps(qv, _mm256_loadu_ps(kr + r * stride + d)));
        }
        __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20),
                                                _mm256_permute2f128_ps(h0, h1, 0x31)));
        for (int r = 0; r < 8 && d8 < hd; r++) {
            float t = out[i + r];
            for (int d = d8; d < hd; d++) t += q[d] * kr[r * stride + d];
            out[i + r] = t;
        }
    }
    for (; i < nk; i++) {
        const float *kr = k + (size_t)i * stride;
        __m256 a = _mm256_setzero_ps();
        for (int d = 0; d < d8; d += 8) a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kr + d)));
        float t = tree8(a);
        for (int d = d8; d < hd; d++) t += q[d] * kr[d];
        out[i] = t;
    }
}

/* kernels.h wsum_f32: 64 outputs at a time in 8 accumulators (8 independent add chains over the
 * keys), then 8 at a time, then one by one; every element o * alpha first, then added in key
 * order from 0. */
static void wsum_f32(const float *a, const float *v, size_t stride, int nk, int hd, float alpha, float *o) {
    const __m256 al = _mm256_set1_ps(alpha);
    int d = 0;
    for (; d + 64 <= hd; d += 64) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) acc[c] = _mm256_mul_ps(_mm256_loadu_ps(o + d + 8 * c), al);
        for (int i = 0; i < nk; i++) {
            __m256 av = _mm256_set1_ps(a[i]);
            const float *vr = v + (size_t)i * stride + d;
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(av, _mm256_loadu_ps(vr + 8 * c)));
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(o + d + 8 * c, acc[c]);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(o + d), al);
        for (int i = 0; i < nk; i++)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(a[i]), _mm256_loadu_ps(v + (size_t)i * stride + d)));
        _mm256_storeu_ps(o + d, acc);
    }
    for (; d < hd; d++) {
        float t = o[d] * alpha;
        for (int i = 0; i < nk; i++) t += a[i] * v[(size_t)i * stride + d];
        o[d] = t;
    }
}

/* kernels.h softmax_step_f32: ml_exp_le0's operations on 8 lanes (the same constants and order, rint
 * as round-to-nearest-even, 2^n from the exponent bits), the running sums of 8 lanes, the tail
 * through the twin's scalar exp. The largest value: _mm256_max_ps(v, m) returns m when v is NaN,
 * as the twin's `if (v > m)` skips it, and the lanes' maxima combine exactly. */
static __m256 exp_le0_8(__m256 x) {
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_mul_ps(p, _mm256_mul_ps(r, r));
    y = _mm256_add_ps(_mm256_add_ps(y, r), _mm256_set1_ps(1.0f));
    /* lanes below -87 (n below -126) and NaN lanes get garbage exponents here: masked below */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    y = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ), y);
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static float softmax_step_f32(float *x, int n, float scale, float *m, float *l) {
    int n8 = n - n % 8, i = 0;
    __m256 sv = _mm256_set1_ps(scale), mv = _mm256_set1_ps(*m);
    for (; i < n8; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sv);
        _mm256_storeu_ps(x + i, v);
        mv = _mm256_max_ps(v, mv);
    }
    float lanes[8], mt = *m;
    _mm256_storeu_ps(lanes, mv);
    for (int j = 0; j < 8; j++) mt = lanes[j] > mt ? lanes[j] : mt;
    for (; i < n; i++) {
        x[i] = x[i] * scale;
        if (x[i] > mt) mt = x[i];
    }
    __m256 mm = _mm256_set1_ps(mt), acc = _mm256_setzero_ps();
    for (i = 0; i < n8; i += 8) {
        __m256 e = exp_le0_8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(lanes, acc);
    float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; i < n; i++) {
        x[i] = ml_exp_le0(x[i] - mt);
        sum += x[i];
    }
    float alpha = *m == -INFINITY ? 0.0f : ml_exp_le0(*m - mt);
    *l = *l * alpha + sum;
    *m = mt;
    return alpha;
}

/* The Q4_0 search on 8 blocks at once, block b in lane b, the scalar twin's operations in its
 * order (mul, add, div, round-to-nearest-even, min/max; no FMA). The leftover blocks go to it. */
static void q4_0_search(int nb, const float *xs, const float *w, const float *xmax, float *d, float *err,
                        int8_t *l) {
    int b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) {
        __m256 x[QK], wt[QK], wx[QK], best_l[QK];
        for (int j = 0; j < QK; j++) {   /* element-major: lane b holds element j of block b0 + b */
            float xv[8], wv[8];
            for (int b = 0; b < 8; b++) {
                xv[b] = xs[(size_t)(b0 + b) * QK + j];
                wv[b] = w[(size_t)(b0 + b) * QK + j];
            }
            x[j] = _mm256_loadu_ps(xv);
            wt[j] = _mm256_loadu_ps(wv);
            wx[j] = _mm256_mul_ps(wt[j], x[j]);
            best_l[j] = _mm256_setzero_ps();
        }
        const __m256 lo = _mm256_set1_ps(-8.0f), hi = _mm256_set1_ps(7.0f), zero = _mm256_setzero_ps();
        const __m256 vmax = _mm256_loadu_ps(xmax + b0);
        __m256 best = _mm256_set1_ps(INFINITY), best_d = zero;
        for (int c = 0; c < 13; c++) {
            __m256 iscale = _mm256_div_ps(_mm256_set1_ps(ml_q4_0_candidates[c]), vmax);
            __m256 lv[QK], sumlx = zero, suml2 = zero;
            for (int j = 0; j < QK; j++) {
                __m256 v = _mm256_round_ps(_mm256_mul_ps(x[j], iscale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                lv[j] = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
                sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(wx[j], lv[j]));
                suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(wt[j], _mm256_mul_ps(lv[j], lv[j])));
            }
            __m256 pos = _mm256_cmp_ps(suml2, zero, _CMP_GT_OQ);
            __m256 dc = _mm256_and_ps(pos, _mm256_div_ps(sumlx, _mm256_blendv_ps(_mm256_set1_ps(1.0f), suml2, pos)));
            __m256 e = zero;
            for (int j = 0; j < QK; j++) {
                __m256 r = _mm256_sub_ps(x[j], _mm256_mul_ps(dc, lv[j]));
                e = _mm256_add_ps(e, _mm256_mul_ps(wt[j], _mm256_mul_ps(r, r)));
            }
            __m256 better = _mm256_cmp_ps(e, best, _CMP_LT_OQ);
            best = _mm256_blendv_ps(best, e, better);
            best_d = _mm256_blendv_ps(best_d, dc, better);
            for (int j = 0; j < QK; j++) best_l[j] = _mm256_blendv_ps(best_l[j], lv[j], better);
        }
        _mm256_storeu_ps(d + b0, best_d);
        _mm256_storeu_ps(err + b0, best);
        for (int j = 0; j < QK; j++) {
            float lvv[8];
            _mm256_storeu_ps(lvv, best_l[j]);
            for (int b = 0; b < 8; b++) l[(size_t)(b0 + b) * QK + j] = (int8_t)lvv[b];
        }
    }
    ml_q4_0_search_scalar(nb - b0, xs + (size_t)b0 * QK, w + (size_t)b0 * QK, xmax + b0, d + b0, err + b0,
                          l + (size_t)b0 * QK);
}

/* The table of the including file's ISA: const ml_kernel_table ml_kernels_X = X86_TABLE("X"); */
#define X86_TABLE(isa)                                                                           \
    {.name = isa, .quantize_q8_0 = quantize_q8_0, .isums_q8_0 = isums_q8_0, .isums_q4_0 = isums_q4_0, \
     .dot_q8_0 = dot_q8_0, .dot_q4_0 = dot_q4_0, .dot4_q8_0 = dot4_q8_0, .dot4_q4_0 = dot4_q4_0,      \
     .gemm8_q8_0 = gemm8_q8_0, .gemm8_q4_0 = gemm8_q4_0, .scores_f32 = scores_f32, .wsum_f32 = wsum_f32,  \
     .softmax_step_f32 = softmax_step_f32, .q4_0_search = q4_0_search}
