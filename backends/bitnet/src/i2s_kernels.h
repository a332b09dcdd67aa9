/* i2s_kernels.h: the I2_S kernels of the bitnet runtime, one table per ISA (specs/i2s.yaml).
 *
 * i2s_scalar.c is the twin every SIMD table is tested against (tests/test_bitnet_kernels.py):
 * int8 activations, their scales and sums, and the integer dots are identical on every ISA. The
 * dots are exact integer sums, so their order does not matter. The table is chosen once from the
 * CPU's features (i2s_kernels()) or forced with ml_set_isa (dispatch.c); it is the library's only
 * global state. NEON is tested under qemu-aarch64 through backends/bitnet/tests/i2s_main.c.
 *
 * Which dot to call: one token against many weight rows (decode, matvec) is fastest with
 * dot_rows4 (four consecutive rows per call; the payload's rows are consecutive); eight tokens
 * (prefill) with dot_rows2x8 where the table has it, four with dot4 (the weight block is
 * unpacked once for the four); dot for the leftovers.
 *
 * Packed rows (spec `layout`): a row of n values (n % 128 == 0) is n / 4 bytes; byte j of block b
 * holds the 2-bit codes (q + 1) of elements 128b + j, +32, +64, +96 at bits 7..6, 5..4, 3..2, 1..0.
 */
#ifndef MLBITNET_I2S_KERNELS_H
#define MLBITNET_I2S_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define I2S_BLOCK 128       /* values per block */
#define I2S_BLOCK_BYTES 32  /* packed bytes per block */
#define I2S_TAIL 32         /* payload bytes after the packed data: f32 scale + 28 zero bytes */

typedef struct {
    const char *name;  /* "scalar", "avx2", "neon" */
    /* Spec `activations` for one row of n finite floats (n >= 1): q[n], returns the scale a and
     * stores sum q in *sum. */
    float (*quantize_act)(const float *x, int n, int8_t *q, int32_t *sum);
    /* sum_k code[k] * x[k] over one packed row of n values (n % 128 == 0): codes 0..3 as stored. */
    int32_t (*dot)(int n, const uint8_t *w, const int8_t *x);
    /* One packed row against four activation rows: out[t] = dot(n, w, x[t]). */
    void (*dot4)(int n, const uint8_t *w, const int8_t *const x[4], int32_t out[4]);
    /* Four consecutive packed rows (row t at w + t * (n / 4), as in a payload) against one
     * activation row: out[t] = dot(n, w + t * (n / 4), x). The matvec path: each activation
     * block is loaded once for the four rows. */
    void (*dot_rows4)(int n, const uint8_t *w, const int8_t *x, int32_t out[4]);
    /* Two consecutive packed rows against eight activation rows (the prefill tile): out[t * os + r]
     * = dot(n, w + r * (n / 4), x[t]), written where the caller gathers each token's row dots (a
     * copy after the call stalled on the stores' forwarding: 9-12 % of a prefill). Each block is
     * unpacked once for eight tokens and each activation vector loaded once for two rows. NULL in
     * a table without one (AVX2, NEON): the prefill then runs dot4. */
    void (*dot_rows2x8)(int n, const uint8_t *w, const int8_t *const x[8], int32_t *out, size_t os);
    /* Float dots of the float reading (F16 / F32 weights): sum_k w[k] * x[k]
     * over n >= 0 values in one fixed order on every ISA: element k goes to running sum k % 8
     * (product rounded, then added: no FMA), and the eight sums combine as ((s0 + s1) + (s2 + s3))
     * + ((s4 + s5) + (s6 + s7)). dot_f16 widens the f16 weights exactly first. */
    float (*dot_f16)(int n, const uint16_t *w, const float *x);
    float (*dot_f32)(int n, const float *w, const float *x);
    /* Element-wise float kernels (the prefill's row loops), each element computed by the one
     * formula below (i2s_epilogue, i2s_act1, i2s_norm1), so every table gives the same
     * bits:
     * y[k] = i2s_epilogue(sumi[k], act_sum, a, d): one token's epilogue over n weight rows; */
    void (*epilogue)(int n, const int32_t *sumi, int32_t act_sum, float a, float d, float *y);
    /* Attention by tiles of keys (attn.c), each value by the one formula below on every ISA:
     * att_scores: s[i * ss + j] = (acc = 0; acc = fmaf(q_i[d], k_j[d], acc) for d = 0 .. hd - 1;
     * then acc * scale) for i < nq (q_i = q + i * qs) and j < nk; kt holds the tile's keys
     * transposed in blocks of I2S_ATT_KB keys, k_j[d] at kt[I2S_ATT_KT(hd, j, d)]; */
    void (*att_scores)(int hd, int nq, const float *q, size_t qs, int nk, const float *kt, float scale, float *s,
                       size_t ss);
    /* att_softmax: the online-softmax step of nq <= I2S_ATT_MAX_ROWS queries over one tile: row i
     * of scores s + i * ss (nk of them, its keys [a[i], b[i]), the rest masked) becomes its weights
     * p, and m[i], l[i], alpha[i] are as i2s_att_softmax_row (below) computes them. */
    void (*att_softmax)(int nq, int nk, const int *a, const int *b, float *s, size_t ss, float *m, float *l,
                        float *alpha);
    /* att_pv: o_i[c] = o_i[c] * alpha[i], then o_i[c] = fmaf(p[i * ps + j], v[j * hd + c], o_i[c])
     * for j = 0 .. nk - 1 in order, for i < nq (o_i = o + i * os) and c < hd. */
    void (*att_pv)(int hd, int nq, int nk, const float *p, size_t ps, const float *v, const float *alpha, float *o,
                   size_t os);
    /* g[k] = act(g[k]) * u[k], act SiLU (gelu 0) or the tanh GELU (gelu 1): the gated FFN. */
    void (*act_mul)(int gelu, int n, float *g, const float *u);
    /* out[k] = i2s_norm1(v[k], r, w[k]): RMSNorm's scaling by r = 1 / rms and the weight (out may
     * be v). */
    void (*norm_mul)(int n, const float *v, float r, const float *w, float *out);
} i2s_kernel_table;

const i2s_kernel_table *i2s_kernels(void);                /* the table in use */
const i2s_kernel_table *i2s_kernels_named(const char *name); /* NULL if not built or not runnable */

extern const i2s_kernel_table i2s_kernels_scalar;
#if defined(__x86_64__)
extern const i2s_kernel_table i2s_kernels_avx2;    /* compiled with -mavx2 -mfma -mf16c */
extern const i2s_kernel_table i2s_kernels_avxvnni; /* + -mavxvnni: the integer dots with vpdpbusd (VEX) */
extern const i2s_kernel_table i2s_kernels_avx512;  /* + AVX-512 F/BW/VNNI: the integer dots, 512-bit */
/* AVX2's float kernels, which the VNNI tables share (every VNNI CPU has AVX2, FMA and F16C) */
float i2s_avx2_quantize_act(const float *x, int n, int8_t *q, int32_t *sum);
float i2s_avx2_dot_f16(int n, const uint16_t *w, const float *x);
float i2s_avx2_dot_f32(int n, const float *w, const float *x);
void i2s_avx2_epilogue(int n, const int32_t *sumi, int32_t act_sum, float a, float d, float *y);
void i2s_avx2_act_mul(int gelu, int n, float *g, const float *u);
void i2s_avx2_norm_mul(int n, const float *v, float r, const float *w, float *out);
void i2s_avx2_att_scores(int hd, int nq, const float *q, size_t qs, int nk, const float *kt, float scale, float *s,
                         size_t ss);
void i2s_avx2_att_softmax(int nq, int nk, const int *a, const int *b, float *s, size_t ss, float *m, float *l,
                          float *alpha);
void i2s_avx2_att_pv(int hd, int nq, int nk, const float *p, size_t ps, const float *v, const float *alpha, float *o,
                     size_t os);
/* Their entries, written once for the AVX2 and AVX-VNNI tables, which add their integer dots (the
 * AVX-512 table lists its own: two of its float kernels are 16 lanes wide). */
#define I2S_AVX2_FLOAT_OPS                                                                    \
    .quantize_act = i2s_avx2_quantize_act, .dot_f16 = i2s_avx2_dot_f16, .dot_f32 = i2s_avx2_dot_f32, \
    .epilogue = i2s_avx2_epilogue, .act_mul = i2s_avx2_act_mul, .norm_mul = i2s_avx2_norm_mul,   \
    .att_scores = i2s_avx2_att_scores, .att_softmax = i2s_avx2_att_softmax, .att_pv = i2s_avx2_att_pv
#endif
/* the scalar twin's element-wise kernels (i2s_scalar.c), which NEON shares */
void i2s_scalar_epilogue(int n, const int32_t *sumi, int32_t act_sum, float a, float d, float *y);
void i2s_scalar_act_mul(int gelu, int n, float *g, const float *u);
void i2s_scalar_norm_mul(int n, const float *v, float r, const float *w, float *out);
void i2s_scalar_att_scores(int hd, int nq, const float *q, size_t qs, int nk, const float *kt, float scale, float *s,
                           size_t ss);
void i2s_scalar_att_softmax(int nq, int nk, const int *a, const int *b, float *s, size_t ss, float *m, float *l,
                            float *alpha);
void i2s_scalar_att_pv(int hd, int nq, int nk, const float *p, size_t ps, const float *v, const float *alpha, float *o,
                       size_t os);
#if defined(__aarch64__)
extern const i2s_kernel_table i2s_kernels_neon;
#endif

float ml_f16_to_f32(uint16_t h); /* native/src/f16.c: exact */

/* The float dots' one order (the table's comment), shared by every table so that it is written
 * once: elements [k, n) go into their running sums s[k % 8] (product, then sum: the callers'
 * files keep fp-contract off), then the sums combine ((s0 + s1) + (s2 + s3)) + ((s4 + s5) +
 * (s6 + s7)). The scalar twin passes k = 0 and zeros; a SIMD table the lanes of its whole
 * groups of eight and the first leftover k. */
static inline float i2s_f32_dot_end(int k, int n, const float *w, const float *x, float s[8]) {
    for (; k < n; k++) s[k % 8] += w[k] * x[k];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static inline float i2s_f16_dot_end(int k, int n, const uint16_t *w, const float *x, float s[8]) {
    for (; k < n; k++) s[k % 8] += ml_f16_to_f32(w[k]) * x[k];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* The float epilogue (spec `dot`): y = ((float)sumi - (float)act_sum) / a * d, four roundings. */
static inline float i2s_epilogue(int32_t sumi, int32_t act_sum, float a, float d) {
    float s = (float)sumi - (float)act_sum;
    s = s / a;
    return s * d;
}

/* RMSNorm's last step (forward.py rmsnorm): (v * r) * w, two roundings. */
static inline float i2s_norm1(float v, float r, float w) { return (v * r) * w; }

/* exp(x) for the activations, one formula on every ISA (Cephes' expf: Cody-Waite reduction by
 * n = floor(x log2(e) + 1/2) with ln 2 split so that n * I2S_LN2_HI is exact, a degree-5
 * polynomial, 2^n by exponent bits; products and sums rounded one by one, no FMA). x is first
 * clamped to [-87, 88] (so 2^n stays a normal float; a NaN becomes -87: the callers' inputs are
 * finite): within 1 ulp of exp there (measured, tests/test_bitnet_kernels.py). The SIMD tables
 * run these steps lane by lane; each comparison is written `x > c ? x : c` as maxps / minps
 * evaluate it. */
#define I2S_EXP_LO -87.0f
#define I2S_EXP_HI 88.0f
#define I2S_LOG2E 1.44269504088896341f
#define I2S_LN2_HI 0.693359375f
#define I2S_LN2_LO -2.12194440e-4f
#define I2S_EXP_P0 1.9875691500e-4f
#define I2S_EXP_P1 1.3981999507e-3f
#define I2S_EXP_P2 8.3334519073e-3f
#define I2S_EXP_P3 4.1665795894e-2f
#define I2S_EXP_P4 1.6666665459e-1f
#define I2S_EXP_P5 5.0000001201e-1f

static inline float i2s_exp(float x) {
    x = x > I2S_EXP_LO ? x : I2S_EXP_LO;
    x = x < I2S_EXP_HI ? x : I2S_EXP_HI;
    float n = floorf(x * I2S_LOG2E + 0.5f);
    float r = x - n * I2S_LN2_HI;
    r = r - n * I2S_LN2_LO;
    float p = I2S_EXP_P0;
    p = p * r + I2S_EXP_P1;
    p = p * r + I2S_EXP_P2;
    p = p * r + I2S_EXP_P3;
    p = p * r + I2S_EXP_P4;
    p = p * r + I2S_EXP_P5;
    p = p * (r * r) + r;
    p = p + 1.0f;
    union {
        uint32_t u;
        float f;
    } two_n = {.u = (uint32_t)((int32_t)n + 127) << 23};
    return p * two_n.f;
}

/* One query's step of the online softmax over a tile (att_softmax), scores s[nk] with its keys
 * [a, b): mt = the largest of m and s[a .. b); alpha = exp(m - mt) (0 while m is -inf: nothing
 * seen yet); p[j] = exp(s[j] - mt) in [a, b), 0 outside; l = l * alpha + the sum of p[0 .. nk) in
 * the float dots' order (element j into running sum j % 8, then the tree); m = mt. A tile with
 * none of its keys leaves m, l (and, alpha being exactly 1, its output) unchanged, so a query's
 * result does not depend on which other queries share its tiles. The SIMD tables take the max
 * and the sum's order from the pieces below and compute the exps lane by lane. */
#define I2S_ATT_MAX_ROWS 64 /* queries per att_softmax call */
/* A tile's keys transposed in blocks of I2S_ATT_KB: block j / KB is hd rows of KB floats (element d
 * of its keys), so that the scores of KB keys stream one contiguous hd x KB block. */
#define I2S_ATT_KB 16
#define I2S_ATT_KT(hd, j, d) (((size_t)(j) / I2S_ATT_KB * (size_t)(hd) + (size_t)(d)) * I2S_ATT_KB + (size_t)(j) % I2S_ATT_KB)
static inline float i2s_att_softmax_tail(int j, int nk, int a, int b, float *s, float mt, float sum[8]) {
    for (; j < nk; j++) {
        s[j] = j >= a && j < b ? i2s_exp(s[j] - mt) : 0.0f;
        sum[j % 8] += s[j];
    }
    return ((sum[0] + sum[1]) + (sum[2] + sum[3])) + ((sum[4] + sum[5]) + (sum[6] + sum[7]));
}

static inline float i2s_att_max(int a, int b, const float *s, float m) {
    for (int j = a; j < b; j++) m = s[j] > m ? s[j] : m;
    return m;
}

static inline float i2s_att_alpha(float m, float mt) { return m == -INFINITY ? 0.0f : i2s_exp(m - mt); }

static inline float i2s_att_softmax_row(int nk, int a, int b, float *s, float *m, float *l) {
    float mt = i2s_att_max(a, b, s, *m), alpha = i2s_att_alpha(*m, mt), sum[8] = {0};
    *l = *l * alpha + i2s_att_softmax_tail(0, nk, a, b, s, mt, sum);
    *m = mt;
    return alpha;
}

/* SiLU g / (1 + exp(-g)); the tanh GELU 0.5 g (1 + tanh(c (g + 0.044715 g^3))), c = sqrt(2/pi),
 * as g / (1 + exp(-2c (g + 0.044715 g^3))) (the same function: 1 + tanh(z) = 2 / (1 + e^-2z)) */
#define I2S_GELU_K 0.044715f
#define I2S_GELU_M2C -1.59576912160573071f /* -2 sqrt(2 / pi) */

static inline float i2s_act1(int gelu, float g, float u) {
    float z;
    if (gelu) {
        z = g * g;
        z = z * g;
        z = I2S_GELU_K * z;
        z = g + z;
        z = I2S_GELU_M2C * z;
    } else {
        z = -g;
    }
    float e = i2s_exp(z);
    return g / (1.0f + e) * u;
}

#endif
