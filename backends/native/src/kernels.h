/* kernels.h: the SIMD kernels of the native runtime, one table per ISA.
 *
 * Every table has the same functions; kern_scalar.c is the twin every SIMD version is tested
 * against (tests/test_native_kernels.py): quantizer bytes, integer block sums and the dots are
 * identical on every ISA (the dots fix their summation order, see dot_q8_0). The ISA is chosen once, at the first
 * call of ml_kernels() (CPU features) or by ml_set_isa(); it is the only global state.
 */
#ifndef MLRT_KERNELS_H
#define MLRT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define QK 32  /* values per block */

typedef struct {
    const char *name;  /* "scalar", "avx2", "avxvnni", "avx512", "neon", "neon-dotprod" */
    /* Q8_0 of n floats (n % 32 == 0), f32 scales, the seed's float32 operations: activations. */
    void (*quantize_q8_0)(const float *x, int n, int8_t *q, float *d);
    /* Integer sums of nb blocks: out[b] = sum_j w[32b + j] * x[32b + j]. */
    void (*isums_q8_0)(int nb, const int8_t *w, const int8_t *x, int32_t *out);
    /* Q4_0 weights (16 bytes per block: element j low nibble, j + 16 high; value nibble - 8). */
    void (*isums_q4_0)(int nb, const uint8_t *w, const int8_t *x, int32_t *out);
    /* One row: sum_b (wd[b] * xd[b]) * isum_b, two roundings per term, no FMA; lane k sums
     * the blocks b = k (mod 4), then (l0 + l1) + (l2 + l3), then the leftover blocks in order,
     * on every ISA (so the scalar twin gives the same bits). */
    float (*dot_q8_0)(int nb, const int8_t *w, const float *wd, const int8_t *x, const float *xd);
    float (*dot_q4_0)(int nb, const uint8_t *w, const float *wd, const int8_t *x, const float *xd);
    /* One weight row against four activation rows (prefill): out[t] is dot(w, x[t]) bit for bit,
     * but the row is loaded (and Q4_0 unpacked) once per block for the four. */
    void (*dot4_q8_0)(int nb, const int8_t *w, const float *wd, const int8_t *const x[4],
                      const float *const xd[4], float out[4]);
    void (*dot4_q4_0)(int nb, const uint8_t *w, const float *wd, const int8_t *const x[4],
                      const float *const xd[4], float out[4]);
    /* The packed GEMM (prefill and decode): ng consecutive groups of 8 weight rows in the packed
     * layout below (group j's blocks at w + j * nb * ML_PACK_Q*, its scales at wd + j * nb * 8
     * scales) against nt activation rows x[t] (xd[t] its scales, xs[t][b] the sum of its block b's
     * 32 bytes): out[t * ldo + 8 j + r] is dot_*(row r of group j, x[t]) bit for bit, in the same
     * order of the same float operations, for r < 8, j < ng and t < nt. NULL in a table without one
     * (NEON): forward.c then runs dot4 on the rows as stored. */
    void (*gemm8_q8_0)(int ng, int nb, const uint8_t *w, const void *wd, int wd_f16, int nt,
                       const int8_t *const *x, const float *const *xd, const int32_t *const *xs, float *out,
                       size_t ldo);
    void (*gemm8_q4_0)(int ng, int nb, const uint8_t *w, const void *wd, int wd_f16, int nt,
                       const int8_t *const *x, const float *const *xd, const int32_t *const *xs, float *out,
                       size_t ldo);
    /* Attention's float kernels (forward.c), one order on every ISA. scores_f32: out[i] = q . k_i
     * for the nk keys k_i = k + i * stride of hd floats: 8 running sums s_j over d = j (mod 8)
     * (each product rounded, then added), then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)),
     * then the last hd % 8 terms in order. wsum_f32: o[d] = o[d] * alpha + sum_i a[i] * v_i[d],
     * v_i = v + i * stride: o[d] * alpha first, then the products added in key order from 0 (each
     * product rounded, then added). */
    void (*scores_f32)(const float *q, const float *k, size_t stride, int nk, int hd, float *out);
    void (*wsum_f32)(const float *a, const float *v, size_t stride, int nk, int hd, float alpha, float *o);
    /* softmax_step_f32: one step of the online softmax (forward.c's tiled attention) over a tile's
     * n scores x: x[i] scaled (x[i] * scale), mt the largest of *m and the non-NaN x[i], alpha =
     * ml_exp_le0(*m - mt) (0 while *m is -inf), e_i = ml_exp_le0(x[i] - mt) into x[i]; sum: 8
     * running sums s_j over i = j (mod 8) for i < n - n % 8, then ((s0 + s1) + (s2 + s3)) + ((s4 +
     * s5) + (s6 + s7)), then the last n % 8 in order; *l = *l * alpha + sum, *m = mt; returns alpha. */
    float (*softmax_step_f32)(float *x, int n, float scale, float *m, float *l);
    /* The Q4_0 search of nb prepared blocks (q4_0.c): xs, w (nb * 32, block-major) the values
     * and their weights, xmax[b] the value that maps to each candidate level. For each of the 13
     * candidates c (specs/quant.yaml, in order), per block, in float32: iscale = c / xmax,
     * l_j = clamp(rint(xs_j * iscale), -8, 7), sumlx = sum_j (w_j * xs_j) * l_j and
     * suml2 = sum_j w_j * (l_j * l_j) in element order, dc = suml2 > 0 ? sumlx / suml2 : 0,
     * e = sum_j w_j * (r_j * r_j) with r_j = xs_j - dc * l_j; the first candidate whose e is below
     * the best so far (initially +inf) gives d[b], err[b] and l (nb * 32). */
    void (*q4_0_search)(int nb, const float *xs, const float *w, const float *xmax, float *d, float *err,
                        int8_t *l);
} ml_kernel_table;

/* The packed layout (repack.c writes it at open): groups of ML_PACK rows. Block b of a group is
 * ML_PACK_Q8 or ML_PACK_Q4 bytes, its rows' bytes interleaved 4 at a time so that one 32-bit lane
 * of a vector is one row and a block's 8 integer sums need no horizontal reduction:
 *   Q8_0: byte 32g + 4r + i = (uint8_t)(w[r][32b + 4g + i] + 128), g < 8 (unsigned: vpdpbusd's
 *         u8 operand, and sum (w + 128) x = isum + 128 sum x);
 *   Q4_0: byte 32g + 4r + i = the stored byte 16b + 4g + i of row r, g < 4: its low nibble is
 *         element 4g + i + 8 and its high nibble element 16 + 4g + i + 8 (sum u x = isum + 8 sum x);
 * and the group's scales are 8 per block, wd[8b + r]: f16 bits (wd_f16: the file's scales were
 * f16, so decode reads as many scale bytes as the file holds) or floats. llama.cpp's CPU repack
 * buffers do the same for its Q4_0 8x8 kernels. */
#define ML_PACK 8
#define ML_PACK_Q8 (ML_PACK * QK)
#define ML_PACK_Q4 (ML_PACK * QK / 2)

/* The 13 candidate levels of the Q4_0 search: -6.0, -6.2, ..., -8.4 as float32. */
extern const float ml_q4_0_candidates[13];
/* The scalar twin of q4_0_search, which the SIMD tables also run on their leftover blocks. */
void ml_q4_0_search_scalar(int nb, const float *xs, const float *w, const float *xmax, float *d, float *err,
                           int8_t *l);

/* The scalar twins of scores_f32, wsum_f32 and softmax_step_f32, which the NEON tables use as they are. */
void ml_scores_f32_scalar(const float *q, const float *k, size_t stride, int nk, int hd, float *out);
void ml_wsum_f32_scalar(const float *a, const float *v, size_t stride, int nk, int hd, float alpha, float *o);
float ml_softmax_step_f32_scalar(float *x, int n, float scale, float *m, float *l);
/* exp(x) for x <= 0 or NaN, a polynomial every table computes the same way (kern_scalar.c). */
float ml_exp_le0(float x);

const ml_kernel_table *ml_kernels(void);            /* the table in use */
const ml_kernel_table *ml_kernels_named(const char *name); /* NULL if not built or not runnable */

extern const ml_kernel_table ml_kernels_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern const ml_kernel_table ml_kernels_avx2;        /* compiled with -mavx2 -mfma -mf16c */
extern const ml_kernel_table ml_kernels_avxvnni;     /* ... and -mavxvnni */
extern const ml_kernel_table ml_kernels_avx512;      /* ... and -mavx512f -mavx512bw -mavx512vl -mavx512vnni */
#endif
#if defined(__aarch64__)
extern const ml_kernel_table ml_kernels_neon;
extern const ml_kernel_table ml_kernels_neon_dotprod; /* compiled with +dotprod */
#endif

/* f16 bits <-> f32, exact (round to nearest even for f32 -> f16). */
float ml_f16_to_f32(uint16_t h);
uint16_t ml_f32_to_f16(float f);

#endif
