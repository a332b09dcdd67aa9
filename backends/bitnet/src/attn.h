/* attn.h: the prefill's causal attention (attn.c), flash style: each query tile streams the key
 * and value tiles it sees once, keeping its running max, sum and output as it goes. */
#ifndef MLBITNET_ATTN_H
#define MLBITNET_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "i2s_kernels.h"

#define I2S_ATT_TILE 64   /* keys per tile: a tile's keys and values (2 x 64 x hd floats) stay in L2 */
#define I2S_ATT_QTILE 16  /* queries that stream the tiles together (each tile read once for them); <= I2S_ATT_MAX_ROWS */

struct ml_pool;

typedef struct {
    const i2s_kernel_table *k;
    int n, hd, n_heads, n_kv;
    int window;     /* keys a query sees, itself included (Gemma's sliding layers); 0: all before it */
    float scale;    /* on every score */
    const float *q; /* [n][n_heads][hd], token-major as the projection wrote it */
    const float *kt; /* [n_kv][i2s_att_tiles(n)][hd x I2S_ATT_TILE]: each tile's keys transposed (i2s_att_kt_index) */
    const float *v; /* [n_kv][n][hd] */
    float *o;       /* [n][n_heads][hd] */
} i2s_attn;

static inline size_t i2s_att_tiles(int n) { return ((size_t)n + I2S_ATT_TILE - 1) / I2S_ATT_TILE; }

/* where element d of token t's key of kv head h goes in kt: tile t / I2S_ATT_TILE, laid out as
 * att_scores reads it (I2S_ATT_KT) */
static inline size_t i2s_att_kt_index(int n, int hd, int h, int t, int d) {
    size_t tile = (size_t)h * i2s_att_tiles(n) + (size_t)t / I2S_ATT_TILE;
    return tile * (size_t)hd * I2S_ATT_TILE + I2S_ATT_KT(hd, t % I2S_ATT_TILE, d);
}

/* o = softmax(scale q k^T, causal and windowed) v per query head (GQA: head h reads kv head
 * h / (n_heads / n_kv)), split over the pool by (head, query tile). Every output is computed by
 * the same operations whatever the threads or the table (i2s_kernels.h att_*): key tiles in
 * ascending order from 0 at multiples of I2S_ATT_TILE, the online softmax step per tile. */
void i2s_attention(struct ml_pool *pool, const i2s_attn *a);

#endif
