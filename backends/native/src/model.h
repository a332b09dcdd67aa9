/* model.h: a loaded .mlb model (loader.c fills it, forward.c runs it). */
#ifndef MLRT_MODEL_H
#define MLRT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../include/mlrt.h"
#include "kernels.h"

enum { ML_FMT_Q8_0 = 1, ML_FMT_Q4_0 = 2 };

typedef struct {           /* a quantized matrix, rows x cols (cols % 32 == 0) */
    int fmt;               /* ML_FMT_Q8_0 or ML_FMT_Q4_0 */
    int32_t rows, cols;
    const void *q;         /* int8 (Q8_0) or 16 bytes per block (Q4_0), in the mmap */
    const float *d;        /* rows * cols/32 scales: in the mmap (f32) or converted at load (f16) */
    const uint8_t *pq;     /* rows / 8 groups in the packed layout (kernels.h ML_PACK), or NULL */
    const void *pd;        /* their scales: f16 bits (pd_f16) or floats */
    int pd_f16;
} ml_matrix;

typedef struct {
    uint32_t dim, n_layers, n_heads, n_kv_heads, hidden_dim, vocab, max_seq;
    float rope_theta, norm_eps;
    uint32_t wtype, shared_classifier, rope_type;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    uint32_t rope_orig_max_seq, q8_mask, qkv_bias, head_dim, qk_norm;
    float rope_attn_factor;
    uint32_t sliding_window, layer_flags;
    float rope_local_theta;
    uint32_t act, post_norms;
    float embed_scale, attn_scale;
    uint32_t scale_f16;
    float attn_softcap, final_softcap;
    uint32_t rot_dim, attn_gate, lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, lin_conv;
} ml_header;               /* the 256-byte header, fields as stored (offsets in specs/mlb_header.yaml) */

typedef struct {
    uint8_t flags;         /* layer flag byte (0 without layer_flags) */
    const float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffn_norm;
    /* attention layers */
    ml_matrix wq, wk, wv, wo, wg;
    const float *bq, *bk, *bv, *q_norm, *k_norm;
    /* linear-attention layers (flag bit 3) */
    ml_matrix lqkv, lz, lb, la, lout;
    const float *lconv, *dt_bias, *A_log, *lnorm;
    /* FFN */
    ml_matrix w1, w2, w3;
} ml_layer;

struct ml_model {
    ml_header h;
    /* derived */
    int32_t head_dim, q_dim, kv_dim, rot_dim, lin_qkv, lin_v_width;
    const uint8_t *map;    /* the mmap of the file */
    size_t map_size;
    ml_matrix tok_emb, wcls;      /* wcls == tok_emb when shared */
    const float *final_norm;
    ml_layer *layers;
    float *f16_scales;     /* owned: every f16 scale converted to f32 at load (NULL if scale_f16 == 0) */
    void *packed;          /* owned: the packed matrices (repack.c), NULL before ml_repack or without gemm8 */
    size_t packed_bytes;
    /* run-time state (forward.c) */
    int32_t ctx, threads, filled;
    void *state;           /* KV cache, linear-attention state, scratch: forward.c */
    struct ml_pool *pool;  /* matmul row workers (pool.c) */
    double *imatrix;       /* MLI1 sums when collecting (forward.c) */
    uint64_t im_tokens, im_tokens_cls;
};

/* loader.c: validate and map; on failure returns the status and fills reason. */
int ml_model_open(const char *path, struct ml_model *m, char *reason, size_t reason_len);
void ml_model_close(struct ml_model *m);

/* forward.c */
int ml_forward_init(struct ml_model *m);   /* allocate state for m->ctx */
void ml_forward_free(struct ml_model *m);

/* repack.c: pack every whole group of 8 rows of the matrices the forward pass multiplies by
 * (m->pool must exist); ML_OK, also when the kernel table has no packed GEMM (nothing packed). */
int ml_repack(struct ml_model *m);
void ml_pack_groups(const ml_matrix *w, int64_t g0, int64_t g1, uint8_t *q, void *d, int d_f16);
size_t ml_packed_q_bytes(const ml_matrix *w);
size_t ml_packed_d_bytes(const ml_matrix *w, int d_f16);
void ml_block_sums(const int8_t *q, int nb, int32_t *out);
void ml_gemm8_groups(const ml_kernel_table *k, const ml_matrix *w, int64_t g0, int64_t g1, int nt,
                     const int8_t *const *x, const float *const *xd, const int32_t *const *xs, float *out,
                     size_t ldo);

/* pool.c: run fn(arg, i0, i1) over [0, n) split in contiguous ranges across the pool's threads */
struct ml_pool;
struct ml_pool *ml_pool_new(int threads);
void ml_pool_free(struct ml_pool *p);
void ml_pool_run(struct ml_pool *p, int64_t n, void (*fn)(void *arg, int64_t i0, int64_t i1), void *arg);

#endif
