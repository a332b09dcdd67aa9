/* i2s_avx2.c: AVX2 I2_S kernels (compiled with -mavx2 -mfma -mf16c on x86-64 only; chosen at run
 * time when the CPU has them). Twin: i2s_scalar.c, which states the rules (specs/i2s.yaml).
 *
 * quantize_act: the scalar twin's float32 operations eight lanes at a time. amax is a max of
 * |x| (exact in any order); a = (float)(127 / amax) in double, as the twin. C round() (half away
 * from zero) has no AVX instruction, so: r = trunc(t); t - r is exact (the fraction of t); if
 * |t - r| >= 0.5, r += copysign(1, t). Not t + 0.5 (that rounds twice: 0.49999997 + 0.5 -> 1).
 * The pragma keeps t = x * a one rounding: under -mfma, gcc could fuse x * a - r into vfmsub,
 * whose exact product would move the fraction across 0.5.
 *
 * Dots: _mm256_maddubs_epi16 multiplies unsigned 2-bit codes (0..3 as stored: code 3 is not
 * rejected here, the API refuses it) by the signed int8 activations (-128 included) and adds
 * pairs into int16; _mm256_madd_epi16 with ones widens the int16 sums to int32 every GROUP
 * blocks. Unpacking (BLOCK) takes one 16-bit shift and four masks per 32 packed bytes: two of
 * the four code groups come out as 4 * code, whose products are summed apart and divided by 4
 * (exactly: every such product is a multiple of 4) when widened. No int16 stage can overflow
 * or saturate for any bytes (bounds at BLOCK): the sums are exact integers, identical to the
 * scalar twin's.
 *
 * Speed (the matvec path is dot_rows4): per 32 packed bytes of one row, 1 shift, 4 ands, 4
 * maddubs and 4 adds, plus the widening; the activation block is read from L1 by each row. On
 * a 4096 x 4096 matvec that is about 3.5 cycles per 32 weight bytes, compute-bound (the same
 * speed with the weights in L2): ~0.14 ms at 1 thread on the machine it was measured on, against
 * ~0.35 ms for the native runtime's AVX2 Q8_0 matvec (bench.c). From memory (the caches
 * flushed, as in a forward pass) the four 1 KB rows of a call are too short for the hardware
 * prefetcher, which halved the speed; prefetching the next four rows keeps it at ~0.15 ms
 * (Q8_0: ~0.6 ms).
 */
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
#define GROUP 4 /* blocks summed in int16 before widening (see BLOCK) */

ALWAYS_INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* The scalar twin's steps for one value (the tail of a row whose length is not a multiple of 32). */
static inline int8_t quant1(float x, float a) {
    float t = x * a;
    float r = roundf(t);
    r = r > 127.0f ? 127.0f : r < -128.0f ? -128.0f : r;
    return (int8_t)r;
}

ALWAYS_INLINE __m256i quant8(__m256 x, __m256 a) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 signmask = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256 t = _mm256_mul_ps(x, a);
    __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_and_ps(_mm256_sub_ps(t, r), absmask);
    __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 step = _mm256_or_ps(_mm256_and_ps(t, signmask), _mm256_set1_ps(1.0f)); /* copysign(1, t) */
    r = _mm256_add_ps(r, _mm256_and_ps(up, step));
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(r); /* r is an integer: exact */
}

float i2s_avx2_quantize_act(const float *x, int n, int8_t *q, int32_t *sum) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m8 = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= n; k += 8) m8 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), absmask), m8);
    float amax = hmax8(m8);
    for (; k < n; k++) {
        float v = fabsf(x[k]);
        amax = v > amax ? v : amax;
    }
    double m = (double)amax > 1e-5 ? (double)amax : 1e-5;
    float a = (float)(127.0 / m);
    const __m256 av = _mm256_set1_ps(a);
    /* packs interleave 128-bit lanes: this restores element order */
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i s8 = _mm256_setzero_si256();
    for (k = 0; k + 32 <= n; k += 32) {
        __m256i i0 = quant8(_mm256_loadu_ps(x + k), av), i1 = quant8(_mm256_loadu_ps(x + k + 8), av);
        __m256i i2 = quant8(_mm256_loadu_ps(x + k + 16), av), i3 = quant8(_mm256_loadu_ps(x + k + 24), av);
        s8 = _mm256_add_epi32(s8, _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)(q + k), _mm256_permutevar8x32_epi32(p, perm));
    }
    int32_t s = hsum8(s8);
    for (; k < n; k++) {
        q[k] = quant1(x[k], a);
        s += q[k];
    }
    *sum = s;
    return a;
}

/* One block of packed bytes v against activations x0..x3 (bytes 0..31, 32..63, 64..95, 96..127 of
 * the block), with one shift: u = v >> 4 (16-bit shift; the masks drop the bits that cross bytes)
 *   u & 3    = c1         (x1)      v & 3    = c3         (x3)      scale 1
 *   u & 12   = 4 * c0     (x0)      v & 12   = 4 * c2     (x2)      scale 4
 * s1 += the scale-1 pairs, s4 += the scale-4 pairs (4 * the true products): |s1| grows by at most
 * 2 * 768 per block, |s4| by 2 * 3072, so GROUP = 4 blocks stay below 2^15 in int16. */
#define BLOCK(v, x0, x1, x2, x3, s1, s4)                                                                          \
    do {                                                                                                          \
        const __m256i u_ = _mm256_srli_epi16(v, 4);                                                               \
        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(u_, m3), x1));                            \
        s4 = _mm256_add_epi16(s4, _mm256_maddubs_epi16(_mm256_and_si256(u_, m12), x0));                           \
        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(v, m3), x3));                             \
        s4 = _mm256_add_epi16(s4, _mm256_maddubs_epi16(_mm256_and_si256(v, m12), x2));                            \
    } while (0)

/* acc + the int32 pairs of s1 + s4 / 4 (every lane of madd(s4) is a multiple of 4: exact) */
ALWAYS_INLINE __m256i widen(__m256i acc, __m256i s1, __m256i s4) {
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(s1, ones),
                                                  _mm256_srai_epi32(_mm256_madd_epi16(s4, ones), 2)));
}

#define CONSTS const __m256i m3 = _mm256_set1_epi8(3), m12 = _mm256_set1_epi8(12)
#define WB(w, b) load32((w) + (size_t)(b) * I2S_BLOCK_BYTES)
#define XB(x, b, k) load32((x) + (size_t)(b) * I2S_BLOCK + 32 * (k))

static int32_t dot(int n, const uint8_t *w, const int8_t *x) {
    CONSTS;
    const int nb = n / I2S_BLOCK;
    __m256i acc = _mm256_setzero_si256();
    for (int b = 0; b < nb;) {
        const int e = b + GROUP < nb ? b + GROUP : nb;
        __m256i s1 = _mm256_setzero_si256(), s4 = s1;
        for (; b < e; b++) BLOCK(WB(w, b), XB(x, b, 0), XB(x, b, 1), XB(x, b, 2), XB(x, b, 3), s1, s4);
        acc = widen(acc, s1, s4);
    }
    return hsum8(acc);
}

/* One weight row, four activation rows: the weight block is loaded and unpacked once for the
 * four, into the four code vectors themselves (three shifts, four masks: c0 = v >> 6 & 3, ...,
 * c3 = v & 3), so that each token needs one int16 accumulator: four accumulators, four codes and
 * the mask stay in registers (the s1 / s4 split of BLOCK took two per token, and gcc spilled them
 * to the stack: 56 GMAC/s on one AMD EPYC core). |one block's four pairs| <= 4 * 768, so
 * GROUP4 = 8 blocks stay below 2^15 in int16 before they are widened. */
#define GROUP4 8
ALWAYS_INLINE __m256i tok4(__m256i s, __m256i c0, __m256i c1, __m256i c2, __m256i c3, const int8_t *xb) {
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(c0, load32(xb)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(c1, load32(xb + 32)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(c2, load32(xb + 64)));
    return _mm256_add_epi16(s, _mm256_maddubs_epi16(c3, load32(xb + 96)));
}

static void dot4(int n, const uint8_t *w, const int8_t *const x[4], int32_t out[4]) {
    const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    const int nb = n / I2S_BLOCK;
    const int8_t *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int b = 0; b < nb;) {
        const int e = b + GROUP4 < nb ? b + GROUP4 : nb;
        __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
        for (; b < e; b++) {
            const __m256i v = WB(w, b);
            const __m256i c0 = _mm256_and_si256(_mm256_srli_epi16(v, 6), m3);
            const __m256i c1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m3);
            const __m256i c2 = _mm256_and_si256(_mm256_srli_epi16(v, 2), m3);
            const __m256i c3 = _mm256_and_si256(v, m3);
            const size_t o = (size_t)b * I2S_BLOCK;
            s0 = tok4(s0, c0, c1, c2, c3, x0 + o);
            s1 = tok4(s1, c0, c1, c2, c3, x1 + o);
            s2 = tok4(s2, c0, c1, c2, c3, x2 + o);
            s3 = tok4(s3, c0, c1, c2, c3, x3 + o);
        }
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(s0, ones));
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(s1, ones));
        acc2 = _mm256_add_epi32(acc2, _mm256_madd_epi16(s2, ones));
        acc3 = _mm256_add_epi32(acc3, _mm256_madd_epi16(s3, ones));
    }
    _mm_storeu_si128((__m128i *)out, hsum8x4(acc0, acc1, acc2, acc3));
}

/* Four weight rows (consecutive, n / 4 bytes apart), one activation row: the matvec path. The
 * activation block is read from L1 by each row's maddubs (memory operands): holding it in four
 * registers makes gcc spill the sixteen accumulators (measured slower). */
static void dot_rows4(int n, const uint8_t *w, const int8_t *x, int32_t out[4]) {
    CONSTS;
    const int nb = n / I2S_BLOCK;
    const size_t rs = (size_t)(n / 4);
    const uint8_t *w0 = w, *w1 = w + rs, *w2 = w + 2 * rs, *w3 = w + 3 * rs;
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int b = 0; b < nb;) {
        const int e = b + GROUP < nb ? b + GROUP : nb;
        __m256i a1 = _mm256_setzero_si256(), a4 = a1, b1 = a1, b4 = a1, c1 = a1, c4 = a1, d1 = a1, d4 = a1;
        for (; b < e; b++) {
            /* the next four rows (4 * rs bytes on) are consumed as fast as these: two lines ahead
             * per block keep the stream going where the hardware prefetcher loses 1 KB rows */
            _mm_prefetch((const char *)(w0 + 4 * rs) + 128 * (size_t)b, _MM_HINT_T0);
            _mm_prefetch((const char *)(w0 + 4 * rs) + 128 * (size_t)b + 64, _MM_HINT_T0);
            BLOCK(WB(w0, b), XB(x, b, 0), XB(x, b, 1), XB(x, b, 2), XB(x, b, 3), a1, a4);
            BLOCK(WB(w1, b), XB(x, b, 0), XB(x, b, 1), XB(x, b, 2), XB(x, b, 3), b1, b4);
            BLOCK(WB(w2, b), XB(x, b, 0), XB(x, b, 1), XB(x, b, 2), XB(x, b, 3), c1, c4);
            BLOCK(WB(w3, b), XB(x, b, 0), XB(x, b, 1), XB(x, b, 2), XB(x, b, 3), d1, d4);
        }
        acc0 = widen(acc0, a1, a4);
        acc1 = widen(acc1, b1, b4);
        acc2 = widen(acc2, c1, c4);
        acc3 = widen(acc3, d1, d4);
    }
    _mm_storeu_si128((__m128i *)out, hsum8x4(acc0, acc1, acc2, acc3));
}

/* Float dots: lane j of one __m256 is the twin's running sum j (element k of each group of 8 in
 * lane k % 8), multiply then add (no FMA, as the pragma keeps it), the leftover elements into
 * their lanes and the combination as the twin (i2s_kernels.h). F16C widens f16 exactly. */
float i2s_avx2_dot_f16(int n, const uint16_t *w, const float *x) {
    __m256 acc = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k)));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(wv, _mm256_loadu_ps(x + k)));
    }
    float s[8];
    _mm256_storeu_ps(s, acc);
    return i2s_f16_dot_end(k, n, w, x, s);
}

float i2s_avx2_dot_f32(int n, const float *w, const float *x) {
    __m256 acc = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= n; k += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k)));
    float s[8];
    _mm256_storeu_ps(s, acc);
    return i2s_f32_dot_end(k, n, w, x, s);
}

/* The element-wise kernels: the header's one-element formulas eight lanes at a time, each step
 * the same IEEE operation (cvtdq2ps is (float) of an int32, maxps / minps are `x > c ? x : c` /
 * `x < c ? x : c`, floorps is floorf), the leftovers by the formulas themselves. */
void i2s_avx2_epilogue(int n, const int32_t *sumi, int32_t act_sum, float a, float d, float *y) {
    const __m256 sv = _mm256_set1_ps((float)act_sum), av = _mm256_set1_ps(a), dv = _mm256_set1_ps(d);
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 v = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(sumi + k)));
        v = _mm256_div_ps(_mm256_sub_ps(v, sv), av);
        _mm256_storeu_ps(y + k, _mm256_mul_ps(v, dv));
    }
    for (; k < n; k++) y[k] = i2s_epilogue(sumi[k], act_sum, a, d);
}

/* gcc -O2 keeps the scalar loop scalar: out may alias v, and -O2's vectorizer adds no runtime
 * alias check (7% of a Gemma3-270M embedding) */
void i2s_avx2_norm_mul(int n, const float *v, float r, const float *w, float *out) {
    const __m256 rv = _mm256_set1_ps(r);
    int k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(v + k), rv), _mm256_loadu_ps(w + k)));
    for (; k < n; k++) out[k] = i2s_norm1(v[k], r, w[k]);
}

#define SET1 _mm256_set1_ps
ALWAYS_INLINE __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, SET1(I2S_EXP_LO));
    x = _mm256_min_ps(x, SET1(I2S_EXP_HI));
    __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, SET1(I2S_LOG2E)), SET1(0.5f)));
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, SET1(I2S_LN2_HI)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, SET1(I2S_LN2_LO)));
    __m256 p = SET1(I2S_EXP_P0);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), SET1(I2S_EXP_P1));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), SET1(I2S_EXP_P2));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), SET1(I2S_EXP_P3));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), SET1(I2S_EXP_P4));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), SET1(I2S_EXP_P5));
    p = _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r);
    p = _mm256_add_ps(p, SET1(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

void i2s_avx2_act_mul(int gelu, int n, float *g, const float *u) {
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 gv = _mm256_loadu_ps(g + k);
        __m256 z;
        if (gelu) {
            z = _mm256_mul_ps(_mm256_mul_ps(gv, gv), gv);
            z = _mm256_add_ps(gv, _mm256_mul_ps(SET1(I2S_GELU_K), z));
            z = _mm256_mul_ps(SET1(I2S_GELU_M2C), z);
        } else {
            z = _mm256_xor_ps(gv, SET1(-0.0f)); /* -g: the sign flipped */
        }
        const __m256 v = _mm256_div_ps(gv, _mm256_add_ps(SET1(1.0f), exp8(z)));
        _mm256_storeu_ps(g + k, _mm256_mul_ps(v, _mm256_loadu_ps(u + k)));
    }
    for (; k < n; k++) g[k] = i2s_act1(gelu, g[k], u[k]);
}
#undef SET1

/* Attention (i2s_kernels.h att_*): the twin's fmaf is one vfmadd per lane. A register holds eight
 * keys' (scores) or eight output elements' (values) running sums, and each query element or
 * weight is broadcast. Register tiles of four rows x sixteen; the leftovers eight, then one at a
 * time. Measured in place (Qwen3-0.6B's shape, 2048 tokens, AMD EPYC Zen 3, one thread): ~31 G
 * multiply-adds/s against ~47 with every operand in L1; twelve accumulators instead of eight
 * changed nothing, so the loads, not the FMA latency, bound it. */
#define FMA _mm256_fmadd_ps
#define BQ(r, d) _mm256_broadcast_ss((r) + (d))
/* keys [j0, nk) of one query: eight at a time within their block, then one */
static void scores1(int hd, const float *q, int j0, int nk, const float *kt, float scale, float *s) {
    const __m256 sc = _mm256_set1_ps(scale);
    int j = j0;
    for (; j + 8 <= nk && j % I2S_ATT_KB + 8 <= I2S_ATT_KB; j += 8) {
        const float *k = kt + I2S_ATT_KT(hd, j, 0);
        __m256 a = _mm256_setzero_ps();
        for (int d = 0; d < hd; d++, k += I2S_ATT_KB) a = FMA(BQ(q, d), _mm256_loadu_ps(k), a);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(a, sc));
    }
    for (; j < nk; j++) {
        float acc = 0.0f;
        for (int d = 0; d < hd; d++) acc = fmaf(q[d], kt[I2S_ATT_KT(hd, j, d)], acc);
        s[j] = acc * scale;
    }
}

/* Sixteen keys (one block of kt: hd x 16 floats, contiguous) of four queries in named
 * accumulators (gcc keeps an array of them in memory); the block stays in L1 while every group
 * of four queries passes over it. */
ALWAYS_INLINE void scores4x16(int hd, const float *q, size_t qs, const float *k, __m256 sc, float *s, size_t ss) {
    const float *q0 = q + 0 * qs, *q1 = q + 1 * qs, *q2 = q + 2 * qs, *q3 = q + 3 * qs;
    const __m256 z = _mm256_setzero_ps();
    __m256 a0 = z, b0 = z, a1 = z, b1 = z, a2 = z, b2 = z, a3 = z, b3 = z, x;
    for (int d = 0; d < hd; d++, k += I2S_ATT_KB) {
        const __m256 k0 = _mm256_loadu_ps(k), k1 = _mm256_loadu_ps(k + 8);
        x = BQ(q0, d), a0 = FMA(x, k0, a0), b0 = FMA(x, k1, b0);
        x = BQ(q1, d), a1 = FMA(x, k0, a1), b1 = FMA(x, k1, b1);
        x = BQ(q2, d), a2 = FMA(x, k0, a2), b2 = FMA(x, k1, b2);
        x = BQ(q3, d), a3 = FMA(x, k0, a3), b3 = FMA(x, k1, b3);
    }
    _mm256_storeu_ps(s + 0 * ss, _mm256_mul_ps(a0, sc)), _mm256_storeu_ps(s + 0 * ss + 8, _mm256_mul_ps(b0, sc));
    _mm256_storeu_ps(s + 1 * ss, _mm256_mul_ps(a1, sc)), _mm256_storeu_ps(s + 1 * ss + 8, _mm256_mul_ps(b1, sc));
    _mm256_storeu_ps(s + 2 * ss, _mm256_mul_ps(a2, sc)), _mm256_storeu_ps(s + 2 * ss + 8, _mm256_mul_ps(b2, sc));
    _mm256_storeu_ps(s + 3 * ss, _mm256_mul_ps(a3, sc)), _mm256_storeu_ps(s + 3 * ss + 8, _mm256_mul_ps(b3, sc));
}

void i2s_avx2_att_scores(int hd, int nq, const float *q, size_t qs, int nk, const float *kt, float scale, float *s,
                         size_t ss) {
    const __m256 sc = _mm256_set1_ps(scale);
    const int nk16 = nk - nk % 16, i4 = nq - nq % 4;
    for (int j = 0; j < nk16; j += 16) {
        const float *k = kt + I2S_ATT_KT(hd, j, 0);
        for (int i = 0; i < i4; i += 4) scores4x16(hd, q + (size_t)i * qs, qs, k, sc, s + (size_t)i * ss + j, ss);
    }
    for (int i = 0; i < i4 && nk16 < nk; i++) scores1(hd, q + (size_t)i * qs, nk16, nk, kt, scale, s + (size_t)i * ss);
    for (int i = i4; i < nq; i++) scores1(hd, q + (size_t)i * qs, 0, nk, kt, scale, s + (size_t)i * ss);
}

/* Rows one after another: first every row's max in lanes (exact in any order; masked lanes
 * -inf), then every row's exps lane by lane, so that no row waits for its max's chain. */
#define IN_RANGE(idx, lo, hi) _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(idx, lo), _mm256_cmpgt_epi32(hi, idx)))
void i2s_avx2_att_softmax(int nq, int nk, const int *a, const int *b, float *s, size_t ss, float *m, float *l,
                          float *alpha) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    float mt[I2S_ATT_MAX_ROWS];
    for (int i = 0; i < nq; i++) {
        const float *r = s + (size_t)i * ss;
        const __m256i lo = _mm256_set1_epi32(a[i] - 1), hi = _mm256_set1_epi32(b[i]);
        __m256 mx = _mm256_set1_ps(m[i]);
        int j = 0;
        for (; j + 8 <= nk; j += 8) {
            const __m256i idx = _mm256_add_epi32(lane, _mm256_set1_epi32(j));
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_loadu_ps(r + j), IN_RANGE(idx, lo, hi)));
        }
        mt[i] = i2s_att_max(j > a[i] ? j : a[i], b[i], r, hmax8(mx));
    }
    for (int i = 0; i < nq; i++) {
        float *r = s + (size_t)i * ss;
        const __m256i lo = _mm256_set1_epi32(a[i] - 1), hi = _mm256_set1_epi32(b[i]);
        const __m256 mv = _mm256_set1_ps(mt[i]);
        __m256 acc = _mm256_setzero_ps();
        int j = 0;
        for (; j + 8 <= nk; j += 8) {
            const __m256i idx = _mm256_add_epi32(lane, _mm256_set1_epi32(j));
            const __m256 p = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(r + j), mv)), IN_RANGE(idx, lo, hi));
            _mm256_storeu_ps(r + j, p);
            acc = _mm256_add_ps(acc, p);
        }
        float sum[8];
        _mm256_storeu_ps(sum, acc);
        alpha[i] = i2s_att_alpha(m[i], mt[i]);
        l[i] = l[i] * alpha[i] + i2s_att_softmax_tail(j, nk, a[i], b[i], r, mt[i], sum);
        m[i] = mt[i];
    }
}
#undef IN_RANGE

/* Values: w output elements of one query (rows of hd), eight at a time, then one by one. */
static void pv1(int w, size_t hd, int nk, const float *p, const float *v, float alpha, float *o) {
    const __m256 al = _mm256_set1_ps(alpha);
    int c = 0;
    for (; c + 8 <= w; c += 8) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(o + c), al);
        for (int j = 0; j < nk; j++) a = FMA(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(v + (size_t)j * hd + c), a);
        _mm256_storeu_ps(o + c, a);
    }
    for (; c < w; c++) {
        float acc = o[c] * alpha;
        for (int j = 0; j < nk; j++) acc = fmaf(p[j], v[(size_t)j * hd + (size_t)c], acc);
        o[c] = acc;
    }
}

/* Sixteen output elements of four queries over the tile's values, in named accumulators; the
 * values' column block (nk x 64 bytes) stays in L1 while every group of queries passes over it. */
ALWAYS_INLINE void pv4x16(int hd, int nk, const float *p, size_t ps, const float *v, const float *alpha, float *o, size_t os) {
    const float *p0 = p + 0 * ps, *p1 = p + 1 * ps, *p2 = p + 2 * ps, *p3 = p + 3 * ps;
    float *o0 = o + 0 * os, *o1 = o + 1 * os, *o2 = o + 2 * os, *o3 = o + 3 * os;
    const __m256 l0 = _mm256_set1_ps(alpha[0]), l1 = _mm256_set1_ps(alpha[1]), l2 = _mm256_set1_ps(alpha[2]), l3 = _mm256_set1_ps(alpha[3]);
    __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(o0), l0), b0 = _mm256_mul_ps(_mm256_loadu_ps(o0 + 8), l0);
    __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(o1), l1), b1 = _mm256_mul_ps(_mm256_loadu_ps(o1 + 8), l1);
    __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(o2), l2), b2 = _mm256_mul_ps(_mm256_loadu_ps(o2 + 8), l2);
    __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(o3), l3), b3 = _mm256_mul_ps(_mm256_loadu_ps(o3 + 8), l3);
    __m256 x;
    for (int j = 0; j < nk; j++, v += hd) {
        const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
        x = BQ(p0, j), a0 = FMA(x, v0, a0), b0 = FMA(x, v1, b0);
        x = BQ(p1, j), a1 = FMA(x, v0, a1), b1 = FMA(x, v1, b1);
        x = BQ(p2, j), a2 = FMA(x, v0, a2), b2 = FMA(x, v1, b2);
        x = BQ(p3, j), a3 = FMA(x, v0, a3), b3 = FMA(x, v1, b3);
    }
    _mm256_storeu_ps(o0, a0), _mm256_storeu_ps(o0 + 8, b0);
    _mm256_storeu_ps(o1, a1), _mm256_storeu_ps(o1 + 8, b1);
    _mm256_storeu_ps(o2, a2), _mm256_storeu_ps(o2 + 8, b2);
    _mm256_storeu_ps(o3, a3), _mm256_storeu_ps(o3 + 8, b3);
}

void i2s_avx2_att_pv(int hd, int nq, int nk, const float *p, size_t ps, const float *v, const float *alpha, float *o,
                     size_t os) {
    const int hd16 = hd - hd % 16, i4 = nq - nq % 4;
    for (int c = 0; c < hd16; c += 16)
        for (int i = 0; i < i4; i += 4) pv4x16(hd, nk, p + (size_t)i * ps, ps, v + c, alpha + i, o + (size_t)i * os + c, os);
    for (int i = 0; i < i4 && hd16 < hd; i++)
        pv1(hd - hd16, (size_t)hd, nk, p + (size_t)i * ps, v + hd16, alpha[i], o + (size_t)i * os + hd16);
    for (int i = i4; i < nq; i++) pv1(hd, (size_t)hd, nk, p + (size_t)i * ps, v, alpha[i], o + (size_t)i * os);
}
#undef BQ
#undef FMA

const i2s_kernel_table i2s_kernels_avx2 = {
    .name = "avx2",
    .dot = dot,
    .dot4 = dot4,
    .dot_rows4 = dot_rows4,
    I2S_AVX2_FLOAT_OPS,
};
