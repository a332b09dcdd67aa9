/* attn.c: the prefill's causal attention, flash style (attn.h).
 *
 * The earlier attention computed a block of four queries' whole score rows, then their softmax,
 * then the weighted sum, reading every key and value row before the block once per four
 * queries: at 2048 tokens that was half of a Qwen3-0.6B embedding, and it grew with n^2 from
 * L3. Here a unit of work is one query head and a tile of I2S_ATT_QTILE queries. It walks the
 * key tiles its queries see (none past the last query: causal; none wholly before the first
 * query's window), and for each tile: the scores (att_scores: the tile's keys transposed, so
 * that a register holds eight keys' partial sums and each multiply-add is one fused step), the
 * online softmax step per query (att_softmax: running max m and sum l, the weights p, the
 * rescale alpha of what came before), and the weighted values (att_pv: the output rows scaled by
 * alpha, then the tile's values in order). At the end each output row is divided by its l.
 *
 * The float order is fixed by the key tile grid (multiples of I2S_ATT_TILE from key 0), not by
 * the threads, the table or which queries share a unit: a masked key's weight is exactly 0 and a
 * tile with none of a query's keys leaves its m, l and output as they were (i2s_att_softmax).
 */
#include <math.h>
#include <string.h>

#include "attn.h"
#include "bitnet.h"

typedef struct {
    const i2s_attn *a;
    int64_t qtiles;
} attn_job;

static int first_key(const i2s_attn *a, int i) {
    return a->window > 0 && i - a->window + 1 > 0 ? i - a->window + 1 : 0;
}

/* query tile qt of head h */
static void unit(const i2s_attn *a, int h, int qt) {
    const i2s_kernel_table *k = a->k;
    const int T = I2S_ATT_TILE, hd = a->hd;
    const size_t qd = (size_t)a->n_heads * (size_t)hd;
    const int i0 = qt * I2S_ATT_QTILE, nq = a->n - i0 < I2S_ATT_QTILE ? a->n - i0 : I2S_ATT_QTILE;
    const int last = i0 + nq - 1, kvh = h / (a->n_heads / a->n_kv);
    const float *q = a->q + (size_t)i0 * qd + (size_t)h * (size_t)hd;
    const float *kt = a->kt + (size_t)kvh * i2s_att_tiles(a->n) * (size_t)hd * T;
    const float *v = a->v + (size_t)kvh * (size_t)a->n * (size_t)hd;
    float *o = a->o + (size_t)i0 * qd + (size_t)h * (size_t)hd;
    float sc[I2S_ATT_QTILE][I2S_ATT_TILE], m[I2S_ATT_QTILE], l[I2S_ATT_QTILE], alpha[I2S_ATT_QTILE];
    int lo[I2S_ATT_QTILE], hi[I2S_ATT_QTILE];
    for (int i = 0; i < nq; i++) {
        memset(o + (size_t)i * qd, 0, (size_t)hd * sizeof(float));
        m[i] = -INFINITY, l[i] = 0.0f;
    }
    for (int b = first_key(a, i0) / T; b <= last / T; b++) {
        const int j0 = b * T, nk = last + 1 - j0 < T ? last + 1 - j0 : T;
        k->att_scores(hd, nq, q, qd, nk, kt + (size_t)b * (size_t)hd * T, a->scale, &sc[0][0], T);
        for (int i = 0; i < nq; i++) {
            int a0 = first_key(a, i0 + i) - j0, b0 = i0 + i + 1 - j0;
            lo[i] = a0 < 0 ? 0 : a0 > nk ? nk : a0;
            hi[i] = b0 > nk ? nk : b0 < lo[i] ? lo[i] : b0;
        }
        k->att_softmax(nq, nk, lo, hi, &sc[0][0], T, m, l, alpha);
        k->att_pv(hd, nq, nk, &sc[0][0], T, v + (size_t)j0 * (size_t)hd, alpha, o, qd);
    }
    for (int i = 0; i < nq; i++)
        for (int c = 0; c < hd; c++) o[(size_t)i * qd + (size_t)c] = o[(size_t)i * qd + (size_t)c] / l[i];
}

/* units [u0, u1): head u / qtiles, the later (costlier) query tiles first, so that the pool's
 * last claimed chunks are the short ones */
static void units(void *arg, int64_t u0, int64_t u1) {
    const attn_job *j = arg;
    for (int64_t u = u0; u < u1; u++) unit(j->a, (int)(u / j->qtiles), (int)(j->qtiles - 1 - u % j->qtiles));
}

void i2s_attention(struct ml_pool *pool, const i2s_attn *a) {
    attn_job j = {a, (a->n + I2S_ATT_QTILE - 1) / I2S_ATT_QTILE};
    ml_pool_run(pool, (int64_t)a->n_heads * j.qtiles, units, &j);
}
