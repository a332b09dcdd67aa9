/* kern_neon_common.h: the body shared by kern_neon.c and kern_neon_dotprod.c. The including
 * file defines NEON_TABLE, NEON_NAME and dot16(acc, w, x) (its block sum); everything else is
 * the same code, compiled once per table with that file's flags. Rules: kern_scalar.c. */
#ifndef NEON_TABLE
#error "include from kern_neon.c or kern_neon_dotprod.c"
#endif

static void quantize_q8_0(const float *x, int n, int8_t *q, float *d) {
    const float32x4_t half = vdupq_n_f32(0.5f), lo = vdupq_n_f32(-127.0f), hi = vdupq_n_f32(127.0f);
    const uint32x4_t signbit = vdupq_n_u32(0x80000000u);
    for (int b = 0; b < n / QK; b++, x += QK, q += QK) {
        float32x4_t v[8];
        float32x4_t acc = vdupq_n_f32(0.0f);
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(x + 4 * k);
            float32x4_t a = vabsq_f32(v[k]);
            acc = vbslq_f32(vcgtq_f32(a, acc), a, acc); /* NaN |x| loses, as the scalar twin */
        }
        float amax = vmaxvq_f32(acc); /* acc holds no NaN: an exact max in any order */
        if (amax < 1e-30f) {
            d[b] = 0.0f;
            vst1q_s8(q, vdupq_n_s8(0));
            vst1q_s8(q + 16, vdupq_n_s8(0));
            continue;
        }
        const float32x4_t id = vdupq_n_f32(127.0f / amax);
        d[b] = amax / 127.0f;
        int16x8_t h[4];
        for (int k = 0; k < 8; k += 2) {
            int32x4_t i2[2];
            for (int e = 0; e < 2; e++) {
                float32x4_t s = vreinterpretq_f32_u32(
                    vorrq_u32(vandq_u32(vreinterpretq_u32_f32(v[k + e]), signbit), vreinterpretq_u32_f32(half)));
                float32x4_t t = vmulq_f32(v[k + e], id);
                t = vaddq_f32(t, s);
                t = vbslq_f32(vcgtq_f32(t, lo), t, lo); /* NaN -> -127 */
                t = vbslq_f32(vcltq_f32(t, hi), t, hi);
                i2[e] = vcvtq_s32_f32(t); /* truncation */
            }
            h[k / 2] = vcombine_s16(vmovn_s32(i2[0]), vmovn_s32(i2[1]));
        }
        vst1q_s8(q, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
        vst1q_s8(q + 16, vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
    }
}

static inline int32x4_t block_q8_0(const int8_t *w, const int8_t *x) {
    int32x4_t acc = dot16(vdupq_n_s32(0), vld1q_s8(w), vld1q_s8(x));
    return dot16(acc, vld1q_s8(w + 16), vld1q_s8(x + 16));
}

/* Q4_0: low nibbles are elements 0..15, high nibbles 16..31; minus 8 gives signed weights. */
static inline int32x4_t block_q4_0(const uint8_t *w, const int8_t *x) {
    const uint8x16_t b = vld1q_u8(w);
    const int8x16_t eight = vdupq_n_s8(8);
    int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))), eight);
    int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), eight);
    int32x4_t acc = dot16(vdupq_n_s32(0), lo, vld1q_s8(x));
    return dot16(acc, hi, vld1q_s8(x + 16));
}

/* Four block sums in block order (integers: exact in any order). */
static inline int32x4_t hsum4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

#define QB(w, b) ((w) + (size_t)(b) * QK)
#define Q4B(w, b) ((w) + (size_t)(b) * (QK / 2))

static void isums_q8_0(int nb, const int8_t *w, const int8_t *x, int32_t *out) {
    int b = 0;
    for (; b + 4 <= nb; b += 4)
        vst1q_s32(out + b, hsum4(block_q8_0(QB(w, b), QB(x, b)), block_q8_0(QB(w, b + 1), QB(x, b + 1)),
                                 block_q8_0(QB(w, b + 2), QB(x, b + 2)), block_q8_0(QB(w, b + 3), QB(x, b + 3))));
    for (; b < nb; b++) out[b] = vaddvq_s32(block_q8_0(QB(w, b), QB(x, b)));
}

static void isums_q4_0(int nb, const uint8_t *w, const int8_t *x, int32_t *out) {
    int b = 0;
    for (; b + 4 <= nb; b += 4)
        vst1q_s32(out + b, hsum4(block_q4_0(Q4B(w, b), QB(x, b)), block_q4_0(Q4B(w, b + 1), QB(x, b + 1)),
                                 block_q4_0(Q4B(w, b + 2), QB(x, b + 2)), block_q4_0(Q4B(w, b + 3), QB(x, b + 3))));
    for (; b < nb; b++) out[b] = vaddvq_s32(block_q4_0(Q4B(w, b), QB(x, b)));
}

/* Dots in the scalar twin's order: lane k takes blocks b = k (mod 4), terms (wd * xd) * isum
 * without FMA, then (l0 + l1) + (l2 + l3), then the tail in block order. */
static inline float32x4_t terms4(const float *wd, const float *xd, int32x4_t isum) {
    float32x4_t s = vmulq_f32(vld1q_f32(wd), vld1q_f32(xd));
    return vmulq_f32(s, vcvtq_f32_s32(isum));
}

static inline float lanes(float32x4_t acc) {
    float32x4_t p = vpaddq_f32(acc, acc); /* l0 + l1, l2 + l3, .. */
    return vpadds_f32(vget_low_f32(p));
}

static inline float tail(float s, float wd, float xd, int32_t isum) {
    float t = wd * xd;
    t = t * (float)isum;
    return s + t;
}

static float dot_q8_0(int nb, const int8_t *w, const float *wd, const int8_t *x, const float *xd) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        int32x4_t is = hsum4(block_q8_0(QB(w, b), QB(x, b)), block_q8_0(QB(w, b + 1), QB(x, b + 1)),
                             block_q8_0(QB(w, b + 2), QB(x, b + 2)), block_q8_0(QB(w, b + 3), QB(x, b + 3)));
        acc = vaddq_f32(acc, terms4(wd + b, xd + b, is));
    }
    float s = lanes(acc);
    for (; b < nb; b++) s = tail(s, wd[b], xd[b], vaddvq_s32(block_q8_0(QB(w, b), QB(x, b))));
    return s;
}

static float dot_q4_0(int nb, const uint8_t *w, const float *wd, const int8_t *x, const float *xd) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        int32x4_t is = hsum4(block_q4_0(Q4B(w, b), QB(x, b)), block_q4_0(Q4B(w, b + 1), QB(x, b + 1)),
                             block_q4_0(Q4B(w, b + 2), QB(x, b + 2)), block_q4_0(Q4B(w, b + 3), QB(x, b + 3)));
        acc = vaddq_f32(acc, terms4(wd + b, xd + b, is));
    }
    float s = lanes(acc);
    for (; b < nb; b++) s = tail(s, wd[b], xd[b], vaddvq_s32(block_q4_0(Q4B(w, b), QB(x, b))));
    return s;
}

/* Four rows x[t]: a weight block (Q4_0: unpacked) is loaded once for the four; row t takes
 * dot_q8_0's steps, in lane t where the rows share a vector. Written out without arrays of
 * vectors, which gcc -O2 may keep in memory. */
static inline int32x4_t block_w(int8x16_t w0, int8x16_t w1, const int8_t *x) {
    int32x4_t acc = dot16(vdupq_n_s32(0), w0, vld1q_s8(x));
    return dot16(acc, w1, vld1q_s8(x + 16));
}

/* acc + the terms of blocks b..b+3 of one row (weight blocks lo_k | hi_k, scales wd4) */
#define ROW_GROUP(acc, x, xd)                                                                     \
    vaddq_f32(acc, vmulq_f32(vmulq_f32(wd4, vld1q_f32(xd)),                                       \
                             vcvtq_f32_s32(hsum4(block_w(l0, h0, x), block_w(l1, h1, (x) + QK),  \
                                                 block_w(l2, h2, (x) + 2 * QK), block_w(l3, h3, (x) + 3 * QK)))))

#define LOAD_Q8(b, lo, hi) (lo = vld1q_s8(QB(w, b)), hi = vld1q_s8(QB(w, b) + 16))
#define LOAD_Q4(b, lo, hi)                                                                        \
    do {                                                                                          \
        const uint8x16_t u = vld1q_u8(Q4B(w, b));                                                 \
        lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(u, vdupq_n_u8(0x0F))), vdupq_n_s8(8));         \
        hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(u, 4)), vdupq_n_s8(8));                      \
    } while (0)

#define DOT4(LOAD)                                                                                \
    do {                                                                                          \
        float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;              \
        int8x16_t l0, h0, l1, h1, l2, h2, l3, h3;                                                 \
        int b = 0;                                                                                \
        for (; b + 4 <= nb; b += 4) {                                                             \
            LOAD(b, l0, h0);                                                                      \
            LOAD(b + 1, l1, h1);                                                                  \
            LOAD(b + 2, l2, h2);                                                                  \
            LOAD(b + 3, l3, h3);                                                                  \
            const float32x4_t wd4 = vld1q_f32(wd + b);                                            \
            acc0 = ROW_GROUP(acc0, QB(x[0], b), xd[0] + b);                                       \
            acc1 = ROW_GROUP(acc1, QB(x[1], b), xd[1] + b);                                       \
            acc2 = ROW_GROUP(acc2, QB(x[2], b), xd[2] + b);                                       \
            acc3 = ROW_GROUP(acc3, QB(x[3], b), xd[3] + b);                                       \
        }                                                                                         \
        /* lane t: (l0 + l1) + (l2 + l3) of acc_t */                                              \
        float32x4_t s = vpaddq_f32(vpaddq_f32(acc0, acc1), vpaddq_f32(acc2, acc3));               \
        for (; b < nb; b++) { /* lane t: tail's steps for row t */                                \
            LOAD(b, l0, h0);                                                                      \
            int32x4_t is = hsum4(block_w(l0, h0, QB(x[0], b)), block_w(l0, h0, QB(x[1], b)),      \
                                 block_w(l0, h0, QB(x[2], b)), block_w(l0, h0, QB(x[3], b)));     \
            const float xdb[4] = {xd[0][b], xd[1][b], xd[2][b], xd[3][b]};                        \
            float32x4_t t = vmulq_f32(vdupq_n_f32(wd[b]), vld1q_f32(xdb));                        \
            s = vaddq_f32(s, vmulq_f32(t, vcvtq_f32_s32(is)));                                    \
        }                                                                                         \
        vst1q_f32(out, s);                                                                        \
    } while (0)

static void dot4_q8_0(int nb, const int8_t *w, const float *wd, const int8_t *const x[4], const float *const xd[4],
                      float out[4]) {
    DOT4(LOAD_Q8);
}

static void dot4_q4_0(int nb, const uint8_t *w, const float *wd, const int8_t *const x[4], const float *const xd[4],
                      float out[4]) {
    DOT4(LOAD_Q4);
}

/* The Q4_0 search on 4 blocks at once, block b in lane b, the scalar twin's operations in its
 * order (no FMA: -std=c11 keeps mul and add apart). The leftover blocks go to the twin. */
static void q4_0_search(int nb, const float *xs, const float *w, const float *xmax, float *d, float *err,
                        int8_t *l) {
    int b0 = 0;
    for (; b0 + 4 <= nb; b0 += 4) {
        float32x4_t x[QK], wt[QK], wx[QK], best_l[QK];
        for (int j = 0; j < QK; j++) {   /* element-major: lane b holds element j of block b0 + b */
            float xv[4], wv[4];
            for (int b = 0; b < 4; b++) {
                xv[b] = xs[(size_t)(b0 + b) * QK + j];
                wv[b] = w[(size_t)(b0 + b) * QK + j];
            }
            x[j] = vld1q_f32(xv);
            wt[j] = vld1q_f32(wv);
            wx[j] = vmulq_f32(wt[j], x[j]);
            best_l[j] = vdupq_n_f32(0.0f);
        }
        const float32x4_t lo = vdupq_n_f32(-8.0f), hi = vdupq_n_f32(7.0f), zero = vdupq_n_f32(0.0f);
        const float32x4_t vmax = vld1q_f32(xmax + b0);
        float32x4_t best = vdupq_n_f32(INFINITY), best_d = zero;
        for (int c = 0; c < 13; c++) {
            float32x4_t iscale = vdivq_f32(vdupq_n_f32(ml_q4_0_candidates[c]), vmax);
            float32x4_t lv[QK], sumlx = zero, suml2 = zero;
            for (int j = 0; j < QK; j++) {
                lv[j] = vminq_f32(vmaxq_f32(vrndnq_f32(vmulq_f32(x[j], iscale)), lo), hi);
                sumlx = vaddq_f32(sumlx, vmulq_f32(wx[j], lv[j]));
                suml2 = vaddq_f32(suml2, vmulq_f32(wt[j], vmulq_f32(lv[j], lv[j])));
            }
            uint32x4_t pos = vcgtq_f32(suml2, zero);
            float32x4_t q = vdivq_f32(sumlx, vbslq_f32(pos, suml2, vdupq_n_f32(1.0f)));
            float32x4_t dc = vbslq_f32(pos, q, zero);
            float32x4_t e = zero;
            for (int j = 0; j < QK; j++) {
                float32x4_t r = vsubq_f32(x[j], vmulq_f32(dc, lv[j]));
                e = vaddq_f32(e, vmulq_f32(wt[j], vmulq_f32(r, r)));
            }
            uint32x4_t better = vcltq_f32(e, best);
            best = vbslq_f32(better, e, best);
            best_d = vbslq_f32(better, dc, best_d);
            for (int j = 0; j < QK; j++) best_l[j] = vbslq_f32(better, lv[j], best_l[j]);
        }
        vst1q_f32(d + b0, best_d);
        vst1q_f32(err + b0, best);
        for (int j = 0; j < QK; j++) {
            float lvv[4];
            vst1q_f32(lvv, best_l[j]);
            for (int b = 0; b < 4; b++) l[(size_t)(b0 + b) * QK + j] = (int8_t)lvv[b];
        }
    }
    ml_q4_0_search_scalar(nb - b0, xs + (size_t)b0 * QK, w + (size_t)b0 * QK, xmax + b0, d + b0, err + b0,
                          l + (size_t)b0 * QK);
}

const ml_kernel_table NEON_TABLE = {
    .name = NEON_NAME,
    .quantize_q8_0 = quantize_q8_0,
    .isums_q8_0 = isums_q8_0,
    .isums_q4_0 = isums_q4_0,
    .dot_q8_0 = dot_q8_0,
    .dot_q4_0 = dot_q4_0,
    .dot4_q8_0 = dot4_q8_0,
    .dot4_q4_0 = dot4_q4_0,
    .scores_f32 = ml_scores_f32_scalar,
    .wsum_f32 = ml_wsum_f32_scalar,
    .softmax_step_f32 = ml_softmax_step_f32_scalar,
    .q4_0_search = q4_0_search,
};
