/* repack.c: the quantized matrices copied at open into the packed layout of the GEMM kernels
 * (kernels.h, ML_PACK), so that prefill and decode sum 8 rows per vector without horizontal
 * reductions. Only the whole groups of 8 rows are packed; a matrix's last rows % 8 rows stay in
 * the mmap and go through the single-row dot. tok_emb is read row by row (embedding lookups) and
 * stays as stored; a shared classifier gets its own packed copy.
 *
 * Packing is a permutation of bytes (Q8_0 offset by 128; the scales of a scale_f16 file back in
 * f16, which they came from exactly), so it cannot change a result: every table's gemm8 gives
 * dot_*'s bits (tests/test_native_kernels.py), and a table without gemm8 (NEON) skips it.
 */
#include <stdlib.h>

#include "kernels.h"
#include "model.h"
#include "util.h"

static size_t block_bytes(int fmt) { return fmt == ML_FMT_Q8_0 ? ML_PACK_Q8 : ML_PACK_Q4; }

size_t ml_packed_q_bytes(const ml_matrix *w) {
    return (size_t)(w->rows / ML_PACK) * (size_t)(w->cols / QK) * block_bytes(w->fmt);
}

size_t ml_packed_d_bytes(const ml_matrix *w, int d_f16) {
    return (size_t)(w->rows / ML_PACK) * ML_PACK * (size_t)(w->cols / QK) * (d_f16 ? 2u : 4u);
}

/* Groups g0..g1-1 of w into q and d (the packed arrays of the whole matrix); d_f16: the scales as
 * f16 bits, exact only when they came from f16 (a file with scale_f16) */
void ml_pack_groups(const ml_matrix *w, int64_t g0, int64_t g1, uint8_t *q, void *d, int d_f16) {
    size_t nb = (size_t)(w->cols / QK), bb = block_bytes(w->fmt), row_bytes = nb * bb / ML_PACK;
    const uint8_t *src = w->q;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *rows = src + (size_t)g * ML_PACK * row_bytes;
        uint8_t *dst = q + (size_t)g * nb * bb;
        for (size_t b = 0; b < nb; b++, dst += bb)
            for (size_t c = 0; c < bb / (4 * ML_PACK); c++) /* 4-byte groups of a block's row */
                for (int r = 0; r < ML_PACK; r++) {
                    const uint8_t *in = rows + (size_t)r * row_bytes + b * (bb / ML_PACK) + 4 * c;
                    uint8_t *o = dst + 32 * c + 4 * (size_t)r;
                    for (int i = 0; i < 4; i++) o[i] = w->fmt == ML_FMT_Q8_0 ? (uint8_t)(in[i] ^ 0x80) : in[i];
                }
        for (size_t b = 0; b < nb; b++)
            for (int r = 0; r < ML_PACK; r++) {
                size_t i = ((size_t)g * nb + b) * ML_PACK + r;
                float v = w->d[((size_t)g * ML_PACK + r) * nb + b];
                if (d_f16) ((uint16_t *)d)[i] = ml_f32_to_f16(v);
                else ((float *)d)[i] = v;
            }
    }
}

/* Packed groups g0..g1-1 of w against nt tokens with table k's gemm8: rows 8g.. of out (ldo floats
 * per token). forward.c's matmul, the matvec bench and the test hook all run this. */
void ml_gemm8_groups(const ml_kernel_table *k, const ml_matrix *w, int64_t g0, int64_t g1, int nt,
                     const int8_t *const *x, const float *const *xd, const int32_t *const *xs, float *out,
                     size_t ldo) {
    if (g1 <= g0) return;
    int nb = w->cols / QK;
    const uint8_t *pq = w->pq + (size_t)g0 * nb * block_bytes(w->fmt);
    const void *pd = (const uint8_t *)w->pd + (size_t)g0 * nb * ML_PACK * (w->pd_f16 ? 2 : 4);
    float *o = out + (size_t)g0 * ML_PACK;
    int ng = (int)(g1 - g0);
    if (w->fmt == ML_FMT_Q8_0) k->gemm8_q8_0(ng, nb, pq, pd, w->pd_f16, nt, x, xd, xs, o, ldo);
    else k->gemm8_q4_0(ng, nb, pq, pd, w->pd_f16, nt, x, xd, xs, o, ldo);
}

/* out[b] = the sum of block b's 32 bytes (the packed kernels' offset, kernels.h) */
void ml_block_sums(const int8_t *q, int nb, int32_t *out) {
    for (int b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int j = 0; j < QK; j++) s += q[(size_t)b * QK + j];
        out[b] = s;
    }
}

typedef struct {
    ml_matrix *w;
    uint8_t *q;
    void *d;
    int d_f16;
} pack_job;

static void pack_range(void *arg, int64_t g0, int64_t g1) {
    const pack_job *j = arg;
    ml_pack_groups(j->w, g0, g1, j->q, j->d, j->d_f16);
}

/* Every matrix the forward pass multiplies by, in one allocation (m->packed); ML_E_NOMEM if it
 * cannot be had, with nothing packed. */
int ml_repack(struct ml_model *m) {
    if (!ml_kernels()->gemm8_q8_0) return ML_OK;
    size_t nmat = 0, cap = (size_t)m->h.n_layers * 13 + 1;
    ml_matrix **mats = malloc(cap * sizeof *mats);
    if (!mats) return ML_E_NOMEM;
    for (uint32_t l = 0; l < m->h.n_layers; l++) {
        ml_layer *L = &m->layers[l];
        ml_matrix *all[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->lqkv, &L->lz,
                            &L->lb, &L->la, &L->lout, &L->w1, &L->w2, &L->w3};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            if (all[i]->q && all[i]->rows >= ML_PACK) mats[nmat++] = all[i];
    }
    if (m->wcls.q && m->wcls.rows >= ML_PACK) mats[nmat++] = &m->wcls;
    int f16 = m->h.scale_f16 != 0; /* f16 scales stay f16: decode reads the file's scale bytes */
    bool ovf = false;
    size_t dbytes = 0, bytes = 0;
    for (size_t i = 0; i < nmat; i++) {
        dbytes = ml_add_size(dbytes, ml_packed_d_bytes(mats[i], f16), &ovf);
        bytes = ml_add_size(bytes, ml_packed_q_bytes(mats[i]), &ovf);
    }
    size_t total = ml_add_size(dbytes, bytes, &ovf);
    uint8_t *d = ovf ? NULL : ml_alloc_large(total ? total : 1); /* the scales first: aligned for them */
    if (!d) {
        free(mats);
        return ML_E_NOMEM;
    }
    m->packed = d;
    m->packed_bytes = total;
    uint8_t *q = d + dbytes;
    for (size_t i = 0; i < nmat; i++) {
        ml_matrix *w = mats[i];
        pack_job j = {w, q, d, f16};
        ml_pool_run(m->pool, w->rows / ML_PACK, pack_range, &j);
        w->pq = q;
        w->pd = d;
        w->pd_f16 = f16;
        q += ml_packed_q_bytes(w);
        d += ml_packed_d_bytes(w, f16);
    }
    free(mats);
    return ML_OK;
}
