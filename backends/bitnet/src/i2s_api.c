/* i2s_api.c: the I2_S group of the ABI (backends/native/include/mlrt.h; rules: specs/i2s.yaml,
 * reference: backends/reference/i2s.py). Every result is bit-identical to the reference.
 *
 * ml_i2s_quantize (spec `ternarize`, `layout`, `payload`): the stored scale is the float32 mean
 * of |w| exactly as BitNet's embedding converter gets it from NumPy 1.26 (np.mean on the float32
 * tensor, decision i2s.mean_precision): from 0, one float32 pairwise sum per chunk of 8192 values
 * (numpy/_core/src/umath/loops_utils.h pairwise_sum: below 8 values a plain loop, up to 128
 * eight accumulators combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) then the
 * leftovers, above that the halves split at a multiple of 8), the sum divided by n and rounded
 * once (through double, which for a division is the correctly rounded float). Any other order
 * changes the last bit of the mean for most large tensors. Then d = m, or 1e-5f when m < 1e-5
 * (in double); s = 1.0f / d; q = clamp(nearbyintf(w * s), -1, 1) (half to even in the default
 * rounding mode). Packed row-major in blocks of 128, then d (little endian: x86-64 and aarch64)
 * and 28 zero bytes.
 *
 * ml_i2s_quantize_act: the current table's quantize_act per row. ml_i2s_matmul: per-row int8
 * activations, the current table's integer dots (dot4: four tokens per weight row; dot_rows4: four
 * weight rows per token), then i2s_epilogue.
 *
 * Refusals, checked before anything is written:
 *   ML_E_ARG     a NULL pointer; rows (or n) of 0; cols not a positive multiple of 128; a
 *                non-finite weight or activation; rows * cols overflowing size_t; and, for
 *                quantize_act and matmul, cols above I2S_MAX_COLS (the int32 sums of a row,
 *                |sum code * x| <= 384 * cols, must not overflow; the kernels take an int n).
 *   ML_E_FORMAT  a payload holding a code 3 (matmul; decision i2s.code3).
 *   ML_E_NOMEM   matmul's activation buffer cannot be allocated.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bitnet.h"

#define I2S_MAX_COLS (1u << 22)
#define NUMPY_BUFSIZE 8192 /* NumPy 1.26's reduction chunk (its buffer size in elements) */

/* NumPy's float32 pairwise_sum of |w[0..n)| (see the file comment). */
static float pairwise_abs_sum(const float *w, size_t n) {
    if (n < 8) {
        float res = 0.0f;
        for (size_t i = 0; i < n; i++) res += fabsf(w[i]);
        return res;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; j++) r[j] = fabsf(w[j]);
        size_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += fabsf(w[i + j]);
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += fabsf(w[i]);
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_abs_sum(w, n2) + pairwise_abs_sum(w + n2, n - n2);
}

/* NumPy 1.26's np.mean(np.abs(w)) of a float32 array of n values. */
static float numpy_abs_mean(const float *w, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i += NUMPY_BUFSIZE)
        s += pairwise_abs_sum(w + i, n - i < NUMPY_BUFSIZE ? n - i : NUMPY_BUFSIZE);
    return (float)((double)s / (double)n);
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* rows * cols (rows, cols > 0, cols % 128 == 0) into *n, or 0 if the shape is refused. */
static int shape_ok(size_t rows, size_t cols, size_t *n) {
    if (rows == 0 || cols == 0 || cols % I2S_BLOCK) return 0;
    bool overflow = false;
    *n = ml_mul_size(rows, cols, &overflow);
    return !overflow;
}

void i2s_ternarize(const float *w, size_t n, uint8_t *packed, float *d_out) {
    const float m = numpy_abs_mean(w, n);
    const float d = (double)m < 1e-5 ? 1e-5f : m;
    const float s = 1.0f / d;
    uint8_t *p = packed;
    for (size_t b = 0; b < n / I2S_BLOCK; b++, w += I2S_BLOCK, p += I2S_BLOCK_BYTES) {
        uint8_t c[I2S_BLOCK];
        for (int k = 0; k < I2S_BLOCK; k++) {
            float q = nearbyintf(w[k] * s);
            q = q > 1.0f ? 1.0f : q < -1.0f ? -1.0f : q;
            c[k] = (uint8_t)((int)q + 1);
        }
        for (int j = 0; j < 32; j++)
            p[j] = (uint8_t)(c[j] << 6 | c[j + 32] << 4 | c[j + 64] << 2 | c[j + 96]);
    }
    *d_out = d;
}

ML_API int ml_i2s_quantize(const float *w, size_t rows, size_t cols, uint8_t *payload) {
    size_t n;
    if (w == NULL || payload == NULL || !shape_ok(rows, cols, &n) || !all_finite(w, n)) return ML_E_ARG;
    float d;
    i2s_ternarize(w, n, payload, &d);
    memcpy(payload + n / 4, &d, sizeof d); /* little endian on every target of this library */
    memset(payload + n / 4 + sizeof d, 0, I2S_TAIL - sizeof d);
    return ML_OK;
}

ML_API int ml_i2s_quantize_act(const float *x, size_t rows, size_t cols, int8_t *q, float *scale, int32_t *sum) {
    size_t n;
    if (x == NULL || q == NULL || scale == NULL || sum == NULL || !shape_ok(rows, cols, &n) || cols > I2S_MAX_COLS ||
        !all_finite(x, n))
        return ML_E_ARG;
    const i2s_kernel_table *k = i2s_kernels();
    for (size_t r = 0; r < rows; r++) scale[r] = k->quantize_act(x + r * cols, (int)cols, q + r * cols, &sum[r]);
    return ML_OK;
}

/* 1 if some 2-bit field of the bytes is 3 */
static int has_code3(const uint8_t *p, size_t len) {
    size_t i = 0;
    uint64_t acc = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        acc |= v & (v >> 1);
    }
    for (; i < len; i++) acc |= (uint64_t)(p[i] & (p[i] >> 1));
    return (acc & 0x5555555555555555ull) != 0;
}

ML_API int ml_i2s_matmul(const uint8_t *payload, size_t rows, size_t cols, const float *x, size_t n, float *y) {
    size_t nw, nx;
    if (payload == NULL || x == NULL || y == NULL || !shape_ok(rows, cols, &nw) || !shape_ok(n, cols, &nx) ||
        cols > I2S_MAX_COLS || !all_finite(x, nx))
        return ML_E_ARG;
    const size_t wbytes = nw / 4, rb = cols / 4;
    if (has_code3(payload, wbytes)) return ML_E_FORMAT;
    float d;
    memcpy(&d, payload + wbytes, sizeof d);
    bool overflow = false;
    size_t qbytes = ml_add_size(nx, ml_mul_size(n, sizeof(float) + sizeof(int32_t), &overflow), &overflow);
    (void)ml_mul_size(n, rows, &overflow); /* y's element count */
    if (overflow) return ML_E_ARG;
    float *a = malloc(qbytes); /* a[n], asum[n], then q[n * cols]: aligned in this order */
    if (a == NULL) return ML_E_NOMEM;
    int32_t *asum = (int32_t *)(a + n);
    int8_t *q = (int8_t *)(asum + n);
    const i2s_kernel_table *k = i2s_kernels();
    const int c = (int)cols;
    for (size_t t = 0; t < n; t++) a[t] = k->quantize_act(x + t * cols, c, q + t * cols, &asum[t]);
    int32_t sumi[4];
    size_t t = 0;
    for (; t + 4 <= n; t += 4) { /* four tokens per weight row */
        const int8_t *xs[4] = {q + t * cols, q + (t + 1) * cols, q + (t + 2) * cols, q + (t + 3) * cols};
        for (size_t r = 0; r < rows; r++) {
            k->dot4(c, payload + r * rb, xs, sumi);
            for (size_t u = 0; u < 4; u++) y[(t + u) * rows + r] = i2s_epilogue(sumi[u], asum[t + u], a[t + u], d);
        }
    }
    for (; t < n; t++) { /* the remaining tokens: four weight rows per call */
        const int8_t *xq = q + t * cols;
        float *yt = y + t * rows;
        size_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            k->dot_rows4(c, payload + r * rb, xq, sumi);
            for (int u = 0; u < 4; u++) yt[r + u] = i2s_epilogue(sumi[u], asum[t], a[t], d);
        }
        for (; r < rows; r++) yt[r] = i2s_epilogue(k->dot(c, payload + r * rb, xq), asum[t], a[t], d);
    }
    free(a);
    return ML_OK;
}
