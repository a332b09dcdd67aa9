/* q4_0.c: the Q4_0 quantizer of the C ABI (ml_quantize_q4_0, mlrt.h), bit-identical to the
 * reference (backends/reference/quant.py, specs/quant.yaml):
 * - the round rule (llama.cpp's quantize_row_q4_0): d = (element of largest magnitude) / -8,
 *   levels min(trunc(x * (1/d) + 8.5), 15) - 8; 1/d = 0 when it overflows (decision
 *   q4_0.round_id_overflow); with f16 scales the levels use the unrounded 1/d (q4_0.round_f16);
 * - the search rule: the 13 candidate levels, each a weighted least-squares fit, the smallest
 *   weighted error kept; weights x^2, or imp * sqrt(s^2 + x^2) with an importance vector (s^2 the
 *   row's mean square). The candidates' arithmetic is the kernel table's q4_0_search (scalar twin
 *   and SIMD, one block per lane, the same float32 operations in the same order); the blocks are
 *   prepared here: blocks below 1e-6 in magnitude are scaled to 1 first, all-zero blocks give 0.
 * Nothing is written when the input is refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "mlrt.h"
#include "util.h"

#define F16_MAX 65504.0f

/* First index of the largest |x| (numpy argmax: the first of equal magnitudes). */
static int block_imax(const float *x, float *amax) {
    int im = 0;
    float m = fabsf(x[0]);
    for (int j = 1; j < QK; j++)
        if (fabsf(x[j]) > m) m = fabsf(x[j]), im = j;
    *amax = m;
    return im;
}

static void pack_block(const int8_t *l, uint8_t *qs) {
    for (int j = 0; j < QK / 2; j++)
        qs[j] = (uint8_t)((l[j] + 8) | ((l[j + QK / 2] + 8) << 4));
}

/* The round rule for one block: levels into l, the scale returned. */
static float round_block(const float *x, int8_t *l) {
    float amax;
    float d = x[block_imax(x, &amax)] / -8.0f;
    float id = 1.0f / d;
    if (!isfinite(id)) id = 0.0f;
    for (int j = 0; j < QK; j++) {
        float v = truncf(x[j] * id + 8.5f);
        l[j] = (int8_t)((v < 15.0f ? v : 15.0f) - 8.0f);
    }
    return d;
}

/* s^2 of a row: x*x summed in float32 in column order, over the width. */
static float row_mean_square(const float *x, size_t cols) {
    float acc = 0.0f;
    for (size_t c = 0; c < cols; c++) acc += x[c] * x[c];
    return acc / (float)cols;
}

/* The search rule for the nb blocks of one row (x, and imp or NULL): levels into l, scales into d.
 * Returns the index of the first block no candidate fits (float32 overflow), or -1. */
static long search_row(const ml_kernel_table *k, const float *x, size_t cols, const float *imp,
                       float *xs, float *w, float *xmax, float *scale, float *err, int8_t *l, float *d) {
    size_t nb = cols / QK;
    float s2 = imp ? row_mean_square(x, cols) : 0.0f;
    for (size_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK;
        float amax;
        int im = block_imax(xb, &amax);
        int tiny = amax < 1e-6f && amax != 0.0f;
        scale[b] = amax == 0.0f ? 0.0f : tiny ? amax : 1.0f;   /* 0 marks an all-zero block */
        for (int j = 0; j < QK; j++) {
            float v = tiny ? xb[j] / scale[b] : xb[j];
            xs[b * QK + j] = v;
            w[b * QK + j] = imp ? imp[b * QK + j] * sqrtf(s2 + xb[j] * xb[j]) : v * v;
        }
        xmax[b] = amax == 0.0f ? 1.0f : xs[b * QK + im];
    }
    k->q4_0_search((int)nb, xs, w, xmax, d, err, l);
    for (size_t b = 0; b < nb; b++) {
        int zero = scale[b] == 0.0f;
        if (isinf(err[b]) && !zero) return (long)b;
        if (zero) {
            d[b] = 0.0f;
            memset(l + b * QK, 0, QK);
        } else {
            d[b] *= scale[b];
        }
    }
    return -1;
}

ML_API int ml_quantize_q4_0(const float *x, size_t rows, size_t cols, int rule, int f16,
                            const float *importance, uint8_t *qs, void *d) {
    if (!x || !qs || !d || rows == 0 || cols == 0 || cols % QK) return ML_E_ARG;
    if (rule != ML_Q4_0_ROUND && rule != ML_Q4_0_SEARCH) return ML_E_ARG;
    if (rule == ML_Q4_0_ROUND && importance) return ML_E_ARG;
    bool of = false;
    size_t n = ml_mul_size(rows, cols, &of);
    if (of) return ML_E_ARG;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return ML_E_ARG;
    if (importance)
        for (size_t c = 0; c < cols; c++)
            if (!isfinite(importance[c])) return ML_E_ARG;
    size_t nb = cols / QK;
    /* Per row: the block data of the search (6 floats per element at most) and the results of
     * the whole matrix, written to qs and d only once every block is known to be storable. */
    float *work = malloc(sizeof(float) * (2 * cols + 4 * nb));
    float *dall = malloc(sizeof(float) * (n / QK));
    int8_t *lall = malloc(n);
    if (!work || !dall || !lall) {
        free(work), free(dall), free(lall);
        return ML_E_NOMEM;
    }
    const ml_kernel_table *k = ml_kernels();
    int st = ML_OK;
    for (size_t r = 0; r < rows && st == ML_OK; r++) {
        const float *xr = x + r * cols;
        float *dr = dall + r * nb;
        int8_t *lr = lall + r * cols;
        if (rule == ML_Q4_0_ROUND) {
            for (size_t b = 0; b < nb; b++) dr[b] = round_block(xr + b * QK, lr + b * QK);
        } else if (search_row(k, xr, cols, importance, work, work + cols, work + 2 * cols,
                              work + 2 * cols + nb, work + 2 * cols + 2 * nb, lr, dr) >= 0) {
            st = ML_E_ARG;   /* decision q4_0.search_overflow */
        }
        for (size_t b = 0; b < nb && st == ML_OK && f16; b++)
            if (fabsf(dr[b]) > F16_MAX) st = ML_E_ARG;   /* the scale cannot be stored as f16 */
    }
    if (st == ML_OK) {
        for (size_t b = 0; b < n / QK; b++) {
            pack_block(lall + b * QK, qs + b * (QK / 2));
            if (f16) ((uint16_t *)d)[b] = ml_f32_to_f16(dall[b]);
            else ((float *)d)[b] = dall[b];
        }
    }
    free(work), free(dall), free(lall);
    return st;
}
