/* forward.c: the forward pass of an MLB v1 model in runtime semantics (specs/forward.yaml),
 * meant to be read top to bottom like llama2.c:
 *
 *   state       KV cache per attention layer, conv inputs and S per linear layer, scratch
 *   RoPE        inverse frequencies and angles in double, as the reference computes them
 *   small ops   rmsnorm, activations, softcap
 *   matmul      each input row quantized to Q8_0 once, then the packed GEMM (groups of 8 rows
 *               repacked at open, repack.c) over every token of the chunk, or dot4 where a table
 *               has none: one pass over the weights per chunk, row groups split over the pool
 *   layers      attention, linear attention (the gated delta rule), FFN
 *   ml_forward  argument checks, then the tokens in chunks of at most CHUNK
 *
 * Every output element is computed by the same operations in the same order whatever the chunk
 * boundaries or the number of threads, so one token at a time equals a batch, and threads=1
 * equals threads=N, bit for bit. Against the NumPy reference the float operations are the same
 * and in the same order where it matters (norm sums in NumPy's pairwise order, RoPE tables in
 * double); what remains is the order of other float sums, the softmax's polynomial exp
 * (ml_exp_le0) and the last bit of libm's expf and tanhf against NumPy's, a tolerance
 * (tests/test_native_forward.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "kernels.h"
#include "model.h"
#include "util.h"

#define CHUNK 64 /* tokens per pass over the weights: bounds the scratch */
#define PI 3.14159265358979323846

/* ------------------------------------------------------------------ state */
typedef struct {
    float *k, *v;   /* attention layer: ctx x kv_dim keys (rotated) and values */
    float *conv;    /* linear layer: the last lin_conv - 1 convolution inputs, lin_qkv each */
    float *S;       /* linear layer: V x dk x dv recurrent state */
} layer_state;

typedef struct {
    layer_state *layers;
    int linear;                 /* the model has linear layers: it cannot rewind */
    size_t bytes;               /* everything ml_forward_init allocated (the memory bound's test) */
    int chunk;                  /* tokens per pass */
    size_t conv_len, S_len;     /* floats of one linear layer's conv and S */
    double *inv_freq[2];        /* rot_dim/2 inverse frequencies: [0] the model's RoPE, [1] the local base */
    float *cos[2], *sin[2];     /* chunk x rot_dim/2: the RoPE tables of the chunk's positions */
    /* scratch for a chunk, one row per token */
    float *x;                   /* residual stream (dim) */
    float *xb;                  /* normalized input of a sublayer (dim) */
    float *xb2;                 /* output of a sublayer (dim) */
    float *q;                   /* queries (q_dim), or a linear layer's q, k, v (lin_qkv) */
    float *gate;                /* wg·h (q_dim), or a linear layer's z (lin_v_width) */
    float *o;                   /* input of wo (q_dim) or of lout (lin_v_width) */
    float *hb, *hb2;            /* FFN hidden (hidden_dim) */
    float *beta, *g;            /* linear layers: b then beta, a then g, per value head */
    float *att;                 /* n_heads x ctx attention weights */
    int8_t *xq;                 /* a matrix input quantized to Q8_0 ... */
    float *xd;                  /* ... its scales */
    int32_t *xs;                /* ... and the sum of each block's bytes (the packed GEMM's offset) */
    int nonfinite;              /* a matrix input was not finite: the call fails (forward.nonfinite) */
} fstate;

static size_t max4(size_t a, size_t b, size_t c, size_t d) {
    size_t m = a > b ? a : b;
    m = m > c ? m : c;
    return m > d ? m : d;
}

/* zeroed n x size bytes on a cache-line boundary (whole-row SIMD loads then never straddle two
 * lines; freed by ml_free_aligned), added to *total (when given); on failure (or an n x size that
 * overflows) NULL and *ok = false */
static void *alloc(size_t n, size_t size, bool *ok, size_t *total) {
    size_t b = (n ? n : 1) * size;
    void *p = size && n > SIZE_MAX / size ? NULL : ml_calloc_aligned(b);
    if (!p) *ok = false;
    else if (total) *total += b;
    return p;
}

/* ------------------------------------------------------------------ RoPE */
/* yarn's d(r): the dimension at which a wavelength fits r rotations into orig (over rot dims) */
static double yarn_dim(int rot, double orig, double base, double r) {
    return rot * log(orig / (2 * PI * r)) / (2 * log(base));
}

/* Inverse frequencies of the rot/2 pairs in double, scaled per rope_type, with the reference's
 * operations in its order (rope_inv_freq); `local` is rope_local_theta unscaled. */
static void rope_inv_freq(const ml_header *h, int rot, int local, double *inv) {
    double base = local ? h->rope_local_theta : h->rope_theta;
    int type = local ? 0 : (int)h->rope_type;
    double f = h->rope_factor, lo = h->rope_low_freq_factor, hi = h->rope_high_freq_factor;
    double orig = h->rope_orig_max_seq;
    double ylo = 0, yhi = 1;
    if (type == 3) { /* yarn: lo is beta_fast, hi beta_slow */
        ylo = fmax(floor(yarn_dim(rot, orig, base, lo)), 0);
        yhi = fmin(ceil(yarn_dim(rot, orig, base, hi)), rot - 1);
        if (yhi == ylo) yhi = ylo + 0.001; /* as transformers' linear ramp */
    }
    for (int i = 0; i < rot / 2; i++) {
        double v = pow(base, -2.0 * i / rot);
        if (type == 1) { /* llama3 */
            double wavelen = 2 * PI / v;
            double s = (orig / wavelen - lo) / (hi - lo);
            if (wavelen < orig / hi) {
                /* high frequency: unchanged */
            } else if (wavelen > orig / lo) {
                v = v / f;
            } else {
                v = (1 - s) * v / f + s * v;
            }
        } else if (type == 2) { /* linear */
            v = v / f;
        } else if (type == 3) {
            double ramp = fmin(fmax((i - ylo) / (yhi - ylo), 0), 1);
            v = v / f * ramp + v * (1 - ramp);
        }
        inv[i] = v;
    }
}

/* cos and sin of the chunk's positions for both RoPE kinds; yarn multiplies them by
 * rope_attn_factor (the model's RoPE only: the local base is unscaled) */
static void rope_tables(const struct ml_model *m, fstate *s, int n, int pos) {
    int half = m->rot_dim / 2;
    int kinds = m->h.rope_local_theta > 0 ? 2 : 1; /* without a local base no layer uses it */
    for (int kind = 0; kind < kinds; kind++) {
        double mult = kind == 0 && m->h.rope_type == 3 ? m->h.rope_attn_factor : 1.0;
        for (int t = 0; t < n; t++) {
            for (int i = 0; i < half; i++) {
                double ang = (double)(pos + t) * s->inv_freq[kind][i];
                s->cos[kind][t * half + i] = (float)(cos(ang) * mult);
                s->sin[kind][t * half + i] = (float)(sin(ang) * mult);
            }
        }
    }
}

/* rotate the interleaved pairs (2i, 2i+1), i < half, of each of `heads` heads */
static void rope(float *x, int heads, int head_dim, int half, const float *c, const float *s) {
    for (int h = 0; h < heads; h++) {
        for (int i = 0; i < half; i++) {
            float *p = x + h * head_dim + 2 * i;
            float x0 = p[0], x1 = p[1];
            p[0] = x0 * c[i] - x1 * s[i];
            p[1] = x0 * s[i] + x1 * c[i];
        }
    }
}

/* ------------------------------------------------------------------ small ops */
/* Sum of v[i]^2 in float32, in NumPy's pairwise order (np.add.reduce over a contiguous axis:
 * 8 running sums up to 128 elements, halves above). The reference's norms sum this way, and a
 * one-ulp change here moves int8 steps of the next quantized matrix input. */
static float sum_squares(const float *v, int n) {
    if (n < 8) {
        float r = 0;
        for (int i = 0; i < n; i++) r += v[i] * v[i];
        return r;
    }
    if (n <= 128) {
        float r[8];
        int i = 8;
        for (int j = 0; j < 8; j++) r[j] = v[j] * v[j];
        for (; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; j++) r[j] += v[i + j] * v[i + j];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += v[i] * v[i];
        return res;
    }
    int half = n / 2;
    half -= half % 8;
    return sum_squares(v, half) + sum_squares(v + half, n - half);
}

/* out = v / sqrt(mean(v^2) + eps) * w (in place allowed), the reference's float32 operations */
static void rmsnorm(float *out, const float *v, const float *w, int n, float eps) {
    float ms = sum_squares(v, n) / (float)n;
    float r = 1.0f / sqrtf(ms + eps);
    for (int i = 0; i < n; i++) out[i] = (v[i] * r) * w[i];
}

/* Split [0, n) over the pool, or run it here when the model has none or when `work` (in block
 * dots, ~0.5 ns each) is below MIN_POOL_WORK: half of it saves less than handing it over costs. */
#define MIN_POOL_WORK 2048
static void run(struct ml_model *m, int64_t n, int64_t work, void (*fn)(void *, int64_t, int64_t), void *arg) {
    if (m->pool && work >= MIN_POOL_WORK) ml_pool_run(m->pool, n, fn, arg);
    else fn(arg, 0, n);
}

/* The row-wise steps between the matmuls (norms, quantization, the activation, each token's q/k
 * work): a row's result depends on that row alone, so they split over the pool by token, and
 * every split gives the same bits. Run on the caller alone, they left the other threads waiting
 * (a quarter of a 512-token prefill's wall time, SmolLM2 shape, 2 threads). `work` counts about
 * one unit per float operation, a rough match for run()'s. */
typedef struct {
    void (*row)(void *ctx, int t);
    void *ctx;
} rows_job;

static void rows_run(void *arg, int64_t t0, int64_t t1) {
    const rows_job *j = arg;
    for (int64_t t = t0; t < t1; t++) j->row(j->ctx, (int)t);
}

static void each_row(struct ml_model *m, int n, int64_t work, void (*row)(void *, int), void *ctx) {
    rows_job j = {row, ctx};
    run(m, n, n > 1 ? work : 0, rows_run, &j); /* one row (a decode step) is not split */
}

typedef struct {
    float *out;
    const float *x, *w;
    int width;
    float eps;
} norm_ctx;

static void norm_row(void *ctx, int t) {
    const norm_ctx *c = ctx;
    rmsnorm(c->out + (size_t)t * c->width, c->x + (size_t)t * c->width, c->w, c->width, c->eps);
}

static void rmsnorm_rows(struct ml_model *m, float *out, const float *x, const float *w, int n, int width,
                         float eps) {
    norm_ctx c = {out, x, w, width, eps};
    each_row(m, n, (int64_t)n * width, norm_row, &c);
}

static float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
static float silu(float v) { return v / (1.0f + expf(-v)); }

static float gelu_tanh(float v) {
    const float c = (float)0.7978845608028654; /* sqrt(2 / pi) */
    return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
}

/* log(1 + exp(v)) as NumPy's logaddexp(0, v) computes it */
static float softplus(float v) { return v > 0 ? v + log1pf(expf(-v)) : log1pf(expf(v)); }

static float softcap(float v, float cap) { return cap * tanhf(v / cap); }

static void add_rows(float *x, const float *a, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] + a[i];
}

/* ------------------------------------------------------------------ importance matrix */
enum { SLOT_ATTN, SLOT_WO, SLOT_FFN, SLOT_W2 };

/* doubles of the MLI1 body: per layer dim + q_dim + dim + hidden_dim, then dim */
static size_t im_len(const struct ml_model *m, bool *ovf) {
    size_t stride = 2 * (size_t)m->h.dim + (size_t)m->q_dim + m->h.hidden_dim;
    return ml_add_size(ml_mul_size(m->h.n_layers, stride, ovf), m->h.dim, ovf);
}

/* add the squares of n rows of x to a slot (layer n_layers, SLOT_ATTN: the classifier input) */
static void im_record(struct ml_model *m, int layer, int slot, const float *x, int n, int width) {
    if (!m->imatrix) return;
    size_t off = (size_t)layer * (2 * (size_t)m->h.dim + (size_t)m->q_dim + m->h.hidden_dim);
    if (slot > SLOT_ATTN) off += m->h.dim;
    if (slot > SLOT_WO) off += (size_t)m->q_dim;
    if (slot > SLOT_FFN) off += m->h.dim;
    double *sums = m->imatrix + off;
    for (int t = 0; t < n; t++)
        for (int c = 0; c < width; c++) {
            double v = x[(size_t)t * width + c];
            sums[c] += v * v;
        }
}

/* ------------------------------------------------------------------ matmul */
/* 1 if a float of x[0..n) is NaN or infinite: exponent bits all ones (a loop compilers vectorize) */
static int any_nonfinite(const float *x, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return (int)bad;
}

/* Quantize n rows of x (cols each) to Q8_0 into the scratch: done once per input, then shared
 * by every matrix that reads it (wq, wk, wv, wg read the same h). Decision forward.nonfinite: the
 * quantizer's rule has no meaning for NaN or inf, so such an input fails the call (the layer runs
 * on, on whatever the scratch holds, and its result is dropped). */
typedef struct {
    fstate *s;
    const float *x;
    int cols;
    int bad; /* a row held NaN or inf (set with __atomic: rows run on several threads) */
} quant_ctx;

static void quantize_row(void *ctx, int t) {
    quant_ctx *c = ctx;
    const float *x = c->x + (size_t)t * c->cols;
    if (any_nonfinite(x, (size_t)c->cols)) {
        __atomic_store_n(&c->bad, 1, __ATOMIC_RELAXED);
        return;
    }
    int nb = c->cols / QK;
    ml_kernels()->quantize_q8_0(x, c->cols, c->s->xq + (size_t)t * c->cols, c->s->xd + (size_t)t * nb);
    ml_block_sums(c->s->xq + (size_t)t * c->cols, nb, c->s->xs + (size_t)t * nb);
}

static void quantize(struct ml_model *m, fstate *s, const float *x, int n, int cols) {
    quant_ctx c = {s, x, cols, 0};
    each_row(m, n, (int64_t)n * cols, quantize_row, &c);
    if (__atomic_load_n(&c.bad, __ATOMIC_RELAXED)) s->nonfinite = 1; /* the pool's join orders it */
}

typedef struct {
    const ml_matrix *w;
    const ml_kernel_table *k;
    float *out;
    int n;
    int64_t groups;          /* packed groups of 8 rows (0: the table has no gemm8 or w is not packed) */
    const int8_t *xq[CHUNK]; /* token t's quantized input, its scales and block sums */
    const float *xd[CHUNK];
    const int32_t *xs[CHUNK];
} matmul_job;

/* Units u0..u1 of W against every token: unit u < groups is the packed group u (rows 8u..8u+7,
 * gemm8 reads its weights once for the chunk), the others are the rows left over, each read
 * once for the chunk with four tokens per dot4 call. Both give every token the single-row dot's
 * bits: batched == one at a time. */
static void matmul_rows(void *arg, int64_t u0, int64_t u1) {
    const matmul_job *j = arg;
    const ml_matrix *w = j->w;
    const ml_kernel_table *k = j->k;
    int nb = w->cols / QK, n = j->n;
    size_t rows = (size_t)w->rows;
    int64_t G = j->groups;
    if (u0 < G) ml_gemm8_groups(k, w, u0, u1 < G ? u1 : G, n, j->xq, j->xd, j->xs, j->out, rows);
    for (int64_t u = u0 > G ? u0 : G; u < u1; u++) {
        int64_t r = G * ML_PACK + (u - G); /* a row left over */
        const float *wd = w->d + r * nb;
        const int8_t *w8 = (const int8_t *)w->q + r * w->cols;
        const uint8_t *w4 = (const uint8_t *)w->q + r * (nb * 16);
        float *out = j->out + r;
        float y[4];
        int t = 0;
        for (; t + 4 <= n; t += 4) {
            if (w->fmt == ML_FMT_Q8_0) k->dot4_q8_0(nb, w8, wd, j->xq + t, j->xd + t, y);
            else k->dot4_q4_0(nb, w4, wd, j->xq + t, j->xd + t, y);
            for (int i = 0; i < 4; i++) out[(size_t)(t + i) * rows] = y[i];
        }
        for (; t < n; t++)
            out[(size_t)t * rows] = w->fmt == ML_FMT_Q8_0 ? k->dot_q8_0(nb, w8, wd, j->xq[t], j->xd[t])
                                                          : k->dot_q4_0(nb, w4, wd, j->xq[t], j->xd[t]);
    }
}

/* out[t][r] = W·x[t] for the n tokens last quantized (out: n x rows) */
static void matmul(struct ml_model *m, fstate *s, float *out, const ml_matrix *w, int n) {
    matmul_job j = {.w = w, .k = ml_kernels(), .out = out, .n = n};
    j.groups = w->pq && j.k->gemm8_q8_0 ? w->rows / ML_PACK : 0;
    int nb = w->cols / QK;
    for (int t = 0; t < n; t++) {
        j.xq[t] = s->xq + (size_t)t * w->cols;
        j.xd[t] = s->xd + (size_t)t * nb;
        j.xs[t] = s->xs + (size_t)t * nb;
    }
    int64_t units = j.groups + (w->rows - j.groups * ML_PACK);
    run(m, units, (int64_t)w->rows * nb * n, matmul_rows, &j);
}

/* ------------------------------------------------------------------ attention */
/* Tiled (flash-attention style): a unit is one query head and a tile of ATT_QT consecutive
 * queries of the chunk. It walks the key tiles of ATT_KT positions (multiples of ATT_KT from 0)
 * that its queries see; for each tile and query: the scores (scores_f32), scaled and capped, one
 * online-softmax step (running max m and sum l; the earlier output and sum rescaled by alpha =
 * exp(m_old - m)), and the tile's weighted values (wsum_f32) added to the rescaled output. At the
 * end each output row is divided by its l. The key tile stays in L1 while the unit's queries
 * pass over it: before, each query read its keys from L2 on its own. A query's operations depend
 * on its position and the tile grid only, so one token at a time still equals a batch and every
 * thread count gives the same bits. */
#define ATT_KT 64 /* keys per tile */
#define ATT_QT 16 /* queries per unit */

typedef struct {
    const struct ml_model *m;
    fstate *s;
    const layer_state *L;
    int n, pos, window;
    float scale, cap;
    int64_t slices; /* attn_slices: at most n_heads (the rows of s->att) */
} attn_job;

static int first_key(const attn_job *j, int p) { return j->window && p >= j->window ? p - j->window + 1 : 0; }

/* One query's step over keys [a, a + nk) of a tile: sc its scores (they become the weights), mq
 * and lq its running max and sum; its output row is rescaled and the tile's values added. */
static void attend_tile(const attn_job *j, int64_t h, int t, int a, int nk, float *sc, float *mq, float *lq) {
    const struct ml_model *m = j->m;
    const ml_kernel_table *k = ml_kernels();
    int hd = m->head_dim, qd = m->q_dim, kvd = m->kv_dim, group = (int)(m->h.n_heads / m->h.n_kv_heads);
    const float *keys = j->L->k + (h / group) * hd, *vals = j->L->v + (h / group) * hd;
    k->scores_f32(j->s->q + (size_t)t * qd + h * hd, keys + (size_t)a * kvd, (size_t)kvd, nk, hd, sc);
    float scale = j->scale;
    if (j->cap) { /* the scale, then the cap; the step's scale is then 1 (exact) */
        for (int i = 0; i < nk; i++) sc[i] = softcap(sc[i] * scale, j->cap);
        scale = 1.0f;
    }
    float alpha = k->softmax_step_f32(sc, nk, scale, mq, lq);
    k->wsum_f32(sc, vals + (size_t)a * kvd, (size_t)kvd, nk, hd, alpha, j->s->o + (size_t)t * qd + h * hd);
}

/* Queries [t0, t0 + nq) of head h, key tile by key tile; scratch: ATT_KT floats */
static void attend(const attn_job *j, int64_t h, int t0, int nq, float *scratch) {
    const struct ml_model *m = j->m;
    int hd = m->head_dim, qd = m->q_dim;
    float mq[ATT_QT], lq[ATT_QT];
    for (int i = 0; i < nq; i++) {
        mq[i] = -INFINITY, lq[i] = 0.0f;
        memset(j->s->o + (size_t)(t0 + i) * qd + h * hd, 0, (size_t)hd * sizeof(float));
    }
    int last = j->pos + t0 + nq - 1;
    for (int j0 = first_key(j, j->pos + t0) / ATT_KT * ATT_KT; j0 <= last; j0 += ATT_KT)
        for (int i = 0; i < nq; i++) {
            int p = j->pos + t0 + i, a = first_key(j, p), e = p + 1;
            a = a > j0 ? a : j0;
            e = e < j0 + ATT_KT ? e : j0 + ATT_KT;
            if (a < e) attend_tile(j, h, t0 + i, a, e - a, scratch, &mq[i], &lq[i]);
        }
    for (int i = 0; i < nq; i++) {
        float *o = j->s->o + (size_t)(t0 + i) * qd + h * hd;
        for (int d = 0; d < hd; d++) o[d] = o[d] / lq[i];
    }
}

/* Slices s0..s1 of the units (head h, query tile u), head-major; slice s is the s-th of
 * j->slices contiguous runs of them with att row s its scratch, so no two slices share a row,
 * whatever thread runs them, and the threads get about equal work. */
static void attn_slices(void *arg, int64_t s0, int64_t s1) {
    const attn_job *j = arg;
    int64_t tiles = (j->n + ATT_QT - 1) / ATT_QT, units = j->m->h.n_heads * tiles;
    for (int64_t sl = s0; sl < s1; sl++) {
        float *scratch = j->s->att + sl * ATT_KT;
        for (int64_t u = units * sl / j->slices; u < units * (sl + 1) / j->slices; u++) {
            int t0 = (int)(u % tiles) * ATT_QT;
            attend(j, u / tiles, t0, j->n - t0 < ATT_QT ? j->n - t0 : ATT_QT, scratch);
        }
    }
}

/* One token's q, k, v after their matmuls: the biases, the q/k norms, RoPE */
typedef struct {
    const struct ml_model *m;
    fstate *s;
    const ml_layer *W;
    float *kc, *vc; /* the cache rows of the chunk's first position */
} qkv_ctx;

static void qkv_row(void *ctx, int t) {
    const qkv_ctx *c = ctx;
    const ml_header *h = &c->m->h;
    const ml_layer *W = c->W;
    int hd = c->m->head_dim, qd = c->m->q_dim, kvd = c->m->kv_dim, half = c->m->rot_dim / 2;
    int nh = (int)h->n_heads, nkv = (int)h->n_kv_heads;
    float eps = h->norm_eps;
    float *q = c->s->q + (size_t)t * qd, *k = c->kc + (size_t)t * kvd, *v = c->vc + (size_t)t * kvd;
    if (h->qkv_bias) {
        for (int i = 0; i < qd; i++) q[i] = q[i] + W->bq[i];
        for (int i = 0; i < kvd; i++) k[i] = k[i] + W->bk[i];
        for (int i = 0; i < kvd; i++) v[i] = v[i] + W->bv[i];
    }
    if (h->qk_norm) {
        for (int i = 0; i < nh; i++) rmsnorm(q + i * hd, q + i * hd, W->q_norm, hd, eps);
        for (int i = 0; i < nkv; i++) rmsnorm(k + i * hd, k + i * hd, W->k_norm, hd, eps);
    }
    if (!(W->flags & 4)) { /* bit 2: no RoPE; bit 1: the local base */
        int kind = (W->flags & 2) ? 1 : 0;
        const float *co = c->s->cos[kind] + (size_t)t * half, *sn = c->s->sin[kind] + (size_t)t * half;
        rope(q, nh, hd, half, co, sn);
        rope(k, nkv, hd, half, co, sn);
    }
}

/* An attention layer on the chunk's n tokens at positions pos..: its output goes to s->xb2. */
static void attention(struct ml_model *m, fstate *s, int l, int n, int pos) {
    const ml_header *h = &m->h;
    const ml_layer *W = &m->layers[l];
    layer_state *L = &s->layers[l];
    int dim = (int)h->dim, hd = m->head_dim, qd = m->q_dim, kvd = m->kv_dim;
    int nh = (int)h->n_heads;
    float eps = h->norm_eps;

    rmsnorm_rows(m, s->xb, s->x, W->attn_norm, n, dim, eps);
    im_record(m, l, SLOT_ATTN, s->xb, n, dim);
    quantize(m, s, s->xb, n, dim);
    /* keys and values go straight into the cache rows of their positions */
    float *kc = L->k + (size_t)pos * kvd, *vc = L->v + (size_t)pos * kvd;
    matmul(m, s, s->q, &W->wq, n);
    matmul(m, s, kc, &W->wk, n);
    matmul(m, s, vc, &W->wv, n);
    if (h->attn_gate) matmul(m, s, s->gate, &W->wg, n);

    qkv_ctx c = {m, s, W, kc, vc};
    each_row(m, n, (int64_t)n * (qd + 2 * kvd) * 4, qkv_row, &c);

    int windowed = h->sliding_window && (!h->layer_flags || (W->flags & 1));
    attn_job job = {m, s, L, n, pos, windowed ? (int)h->sliding_window : 0,
                    h->attn_scale ? h->attn_scale : (float)(1.0 / sqrt((double)hd)), h->attn_softcap,
                    m->threads < nh ? m->threads : nh};
    run(m, job.slices, INT64_MAX, attn_slices, &job);

    if (h->attn_gate)
        for (size_t i = 0; i < (size_t)n * qd; i++) s->o[i] = s->o[i] * sigmoid(s->gate[i]);
    im_record(m, l, SLOT_WO, s->o, n, qd);
    quantize(m, s, s->o, n, qd);
    matmul(m, s, s->xb2, &W->wo, n);
}

/* ------------------------------------------------------------------ linear attention */
typedef struct {
    const struct ml_model *m;
    fstate *s;
    layer_state *L;
    int n;
} delta_job;

/* value heads h0..h1, one position after the other (the recurrence):
 * S = S exp(g); S = S + k (beta (v - S^T k))^T; out = S^T q */
static void delta_heads(void *arg, int64_t h0, int64_t h1) {
    const delta_job *j = arg;
    const ml_header *hdr = &j->m->h;
    const fstate *s = j->s;
    int K = (int)hdr->lin_k_heads, V = (int)hdr->lin_v_heads;
    int dk = (int)hdr->lin_k_dim, dv = (int)hdr->lin_v_dim, rep = V / K;
    int qkv = j->m->lin_qkv, vw = j->m->lin_v_width;
    for (int64_t vh = h0; vh < h1; vh++) {
        float *S = j->L->S + vh * dk * dv;
        int kh = (int)(vh / rep); /* the query and key head of value head vh */
        for (int t = 0; t < j->n; t++) {
            const float *row = s->q + (size_t)t * qkv;
            const float *q = row + kh * dk, *k = row + (K + kh) * dk, *v = row + 2 * K * dk + vh * dv;
            float beta = s->beta[(size_t)t * V + vh], decay = expf(s->g[(size_t)t * V + vh]);
            float *o = s->o + (size_t)t * vw + vh * dv;
            for (int i = 0; i < dk * dv; i++) S[i] = S[i] * decay;
            /* o = S^T k, then the delta beta (v - S^T k), kept in o until S is updated */
            memset(o, 0, (size_t)dv * sizeof *o);
            for (int a = 0; a < dk; a++)
                for (int b = 0; b < dv; b++) o[b] += S[a * dv + b] * k[a];
            for (int b = 0; b < dv; b++) o[b] = (v[b] - o[b]) * beta;
            for (int a = 0; a < dk; a++)
                for (int b = 0; b < dv; b++) S[a * dv + b] = S[a * dv + b] + k[a] * o[b];
            memset(o, 0, (size_t)dv * sizeof *o);
            for (int a = 0; a < dk; a++)
                for (int b = 0; b < dv; b++) o[b] += S[a * dv + b] * q[a];
        }
    }
}

/* A linear-attention layer (flag bit 3) on the chunk's n tokens: its output goes to s->xb2. */
static void linear_attention(struct ml_model *m, fstate *s, int l, int n) {
    const ml_header *h = &m->h;
    const ml_layer *W = &m->layers[l];
    layer_state *L = &s->layers[l];
    int dim = (int)h->dim, K = (int)h->lin_k_heads, V = (int)h->lin_v_heads;
    int dk = (int)h->lin_k_dim, dv = (int)h->lin_v_dim, kc = (int)h->lin_conv;
    int qkv = m->lin_qkv, vw = m->lin_v_width;
    float eps = h->norm_eps;

    rmsnorm_rows(m, s->xb, s->x, W->attn_norm, n, dim, eps);
    im_record(m, l, SLOT_ATTN, s->xb, n, dim); /* lout's input has no MLI1 slot */
    quantize(m, s, s->xb, n, dim);
    matmul(m, s, s->q, &W->lqkv, n);
    matmul(m, s, s->gate, &W->lz, n);
    matmul(m, s, s->beta, &W->lb, n);
    matmul(m, s, s->g, &W->la, n);

    float qscale = (float)sqrt((double)dk);
    for (int t = 0; t < n; t++) {
        float *c = s->q + (size_t)t * qkv;
        /* causal convolution over the channel's last kc inputs (tap kc-1 is this position),
         * then SiLU; the state keeps the last kc - 1 inputs, oldest first */
        for (int ch = 0; ch < qkv; ch++) {
            const float *w = W->lconv + (size_t)ch * kc;
            float in = c[ch], u = 0;
            for (int tap = 0; tap < kc - 1; tap++) u += w[tap] * L->conv[(size_t)tap * qkv + ch];
            u += w[kc - 1] * in;
            for (int tap = 0; tap + 1 < kc - 1; tap++)
                L->conv[(size_t)tap * qkv + ch] = L->conv[(size_t)(tap + 1) * qkv + ch];
            if (kc > 1) L->conv[(size_t)(kc - 2) * qkv + ch] = in;
            c[ch] = silu(u);
        }
        /* query and key heads to unit L2 norm; queries also divided by sqrt(dk) */
        for (int i = 0; i < 2 * K; i++) {
            float *x = c + (size_t)i * dk;
            float norm = sqrtf(sum_squares(x, dk) + 1e-6f);
            for (int d = 0; d < dk; d++) x[d] = x[d] / norm;
            if (i < K)
                for (int d = 0; d < dk; d++) x[d] = x[d] / qscale;
        }
        for (int i = 0; i < V; i++) {
            float *b = s->beta + (size_t)t * V + i, *a = s->g + (size_t)t * V + i;
            *b = sigmoid(*b);
            *a = -expf(W->A_log[i]) * softplus(*a + W->dt_bias[i]);
        }
    }

    delta_job job = {m, s, L, n};
    run(m, V, INT64_MAX, delta_heads, &job);

    /* per head: rmsnorm with lnorm, times silu(z) */
    for (int t = 0; t < n; t++)
        for (int i = 0; i < V; i++) {
            float *o = s->o + (size_t)t * vw + (size_t)i * dv;
            const float *z = s->gate + (size_t)t * vw + (size_t)i * dv;
            rmsnorm(o, o, W->lnorm, dv, eps);
            for (int d = 0; d < dv; d++) o[d] = o[d] * silu(z[d]);
        }
    quantize(m, s, s->o, n, vw);
    matmul(m, s, s->xb2, &W->lout, n);
}

/* ------------------------------------------------------------------ FFN */
/* f = w2·(act(w1·h) * (w3·h)), h = rmsnorm(x, ffn_norm): into s->xb2 */
/* the gated activation of one token's hidden row: hb = act(hb) * hb2 */
typedef struct {
    float *hb;
    const float *hb2;
    int hid, gelu;
} act_ctx;

static void act_row(void *ctx, int t) {
    const act_ctx *c = ctx;
    float *g = c->hb + (size_t)t * c->hid;
    const float *u = c->hb2 + (size_t)t * c->hid;
    for (int i = 0; i < c->hid; i++) g[i] = (c->gelu ? gelu_tanh(g[i]) : silu(g[i])) * u[i];
}

static void ffn(struct ml_model *m, fstate *s, int l, int n) {
    const ml_header *h = &m->h;
    const ml_layer *W = &m->layers[l];
    int dim = (int)h->dim, hid = (int)h->hidden_dim;

    rmsnorm_rows(m, s->xb, s->x, W->ffn_norm, n, dim, h->norm_eps);
    im_record(m, l, SLOT_FFN, s->xb, n, dim);
    quantize(m, s, s->xb, n, dim);
    matmul(m, s, s->hb, &W->w1, n);
    matmul(m, s, s->hb2, &W->w3, n);
    act_ctx c = {s->hb, s->hb2, hid, h->act == 1};
    each_row(m, n, (int64_t)n * hid * 8, act_row, &c); /* ~8: expf or tanhf per element */
    im_record(m, l, SLOT_W2, s->hb, n, hid);
    quantize(m, s, s->hb, n, hid);
    matmul(m, s, s->xb2, &W->w2, n);
    if (h->post_norms) rmsnorm_rows(m, s->xb2, s->xb2, W->post_ffn_norm, n, dim, h->norm_eps);
}

/* ------------------------------------------------------------------ the pass */
/* the dequantized row of a token (the embedding is not quantized again) */
static void embed(const ml_matrix *w, int32_t token, float *out) {
    int nb = w->cols / QK;
    const float *d = w->d + (size_t)token * nb;
    if (w->fmt == ML_FMT_Q8_0) {
        const int8_t *q = (const int8_t *)w->q + (size_t)token * w->cols;
        for (int i = 0; i < w->cols; i++) out[i] = (float)q[i] * d[i / QK];
    } else { /* byte j of a block: element j low nibble, element j + 16 high */
        const uint8_t *q = (const uint8_t *)w->q + (size_t)token * nb * 16;
        for (int b = 0; b < nb; b++)
            for (int j = 0; j < 16; j++) {
                out[b * QK + j] = (float)((q[b * 16 + j] & 15) - 8) * d[b];
                out[b * QK + j + 16] = (float)((q[b * 16 + j] >> 4) - 8) * d[b];
            }
    }
}

/* linear layers start from zero conv inputs and a zero S at position 0 */
static void clear_linear_state(const struct ml_model *m, fstate *s) {
    for (uint32_t l = 0; s->linear && l < m->h.n_layers; l++) {
        layer_state *L = &s->layers[l];
        if (L->conv) memset(L->conv, 0, s->conv_len * sizeof(float));
        if (L->S) memset(L->S, 0, s->S_len * sizeof(float));
    }
}

/* n <= chunk tokens at positions pos..: logits receives n x vocab floats */
/* Logits of rows [first, n) go to logits (first == n: none), so a prefill that wants only the last
 * position's logits skips the classifier for the others, as llama.cpp does. */
static void forward_chunk(struct ml_model *m, fstate *s, const int32_t *tokens, int n, int pos, float *logits,
                          int first) {
    const ml_header *h = &m->h;
    int dim = (int)h->dim, vocab = (int)h->vocab;
    size_t width = (size_t)n * dim;

    for (int t = 0; t < n; t++) {
        float *x = s->x + (size_t)t * dim;
        embed(&m->tok_emb, tokens[t], x);
        if (h->embed_scale)
            for (int i = 0; i < dim; i++) x[i] = x[i] * h->embed_scale;
    }
    rope_tables(m, s, n, pos);

    for (int l = 0; l < (int)h->n_layers; l++) {
        const ml_layer *W = &m->layers[l];
        if (W->flags & 8) linear_attention(m, s, l, n);
        else attention(m, s, l, n, pos);
        if (h->post_norms) rmsnorm_rows(m, s->xb2, s->xb2, W->post_attn_norm, n, dim, h->norm_eps);
        add_rows(s->x, s->xb2, width);
        ffn(m, s, l, n);
        add_rows(s->x, s->xb2, width);
        if (s->nonfinite) return;
    }

    rmsnorm_rows(m, s->xb, s->x, m->final_norm, n, dim, h->norm_eps);
    im_record(m, (int)h->n_layers, SLOT_ATTN, s->xb, n, dim);
    if (first >= n) return;
    quantize(m, s, s->xb + (size_t)first * dim, n - first, dim);
    matmul(m, s, logits, &m->wcls, n - first);
    if (h->final_softcap)
        for (size_t i = 0; i < (size_t)(n - first) * vocab; i++) logits[i] = softcap(logits[i], h->final_softcap);
}

static int forward(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits, int last_only) {
    if (!m || !m->state || !tokens || !logits || n < 1 || pos < 0) return ML_E_ARG;
    fstate *s = m->state;
    /* decision forward.positions: rewind at will, except past a linear layer's state */
    if ((int64_t)pos + n > m->ctx || pos > m->filled || (s->linear && pos != m->filled)) return ML_E_ARG;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= m->h.vocab) return ML_E_ARG;

    if (pos == 0) clear_linear_state(m, s); /* so a start over needs no ml_forward_reset */
    for (int32_t c = 0; c < n; c += s->chunk) {
        int len = n - c < s->chunk ? n - c : s->chunk;
        if (!last_only)
            forward_chunk(m, s, tokens + c, len, pos + c, logits + (size_t)c * m->h.vocab, 0);
        else
            forward_chunk(m, s, tokens + c, len, pos + c, logits, c + len == n ? len - 1 : len);
        if (s->nonfinite) { /* decision forward.nonfinite: none of the call's positions is fed */
            s->nonfinite = 0;
            m->filled = s->linear ? 0 : pos; /* a linear layer's state cannot be undone: start over */
            return ML_E_FORMAT;
        }
        m->filled = pos + c + len;
    }
    if (m->imatrix) {
        m->im_tokens += (uint64_t)n;
        m->im_tokens_cls += (uint64_t)n;
    }
    return ML_OK;
}

/* ------------------------------------------------------------------ setup */
int ml_forward_init(struct ml_model *m) {
    const ml_header *h = &m->h;
    if (m->ctx < 1 || (uint32_t)m->ctx > h->max_seq) return ML_E_ARG;
    fstate *s = calloc(1, sizeof *s);
    if (!s) return ML_E_NOMEM;
    m->state = s;
    m->filled = 0;

    size_t ctx = (size_t)m->ctx, B = m->ctx < CHUNK ? (size_t)m->ctx : CHUNK;
    size_t dim = h->dim, hid = h->hidden_dim, qd = (size_t)m->q_dim, kvd = (size_t)m->kv_dim;
    /* The lin_* fields size anything only when a layer is linear (m->lin_qkv > 0 then, 0 else):
     * a file without linear layers may hold any value there (decision header.linear). */
    bool linear = m->lin_qkv > 0;
    size_t qkv = (size_t)m->lin_qkv, vw = (size_t)m->lin_v_width, V = linear ? h->lin_v_heads : 0;
    size_t half = (size_t)(m->rot_dim / 2);
    size_t wide_q = qd > qkv ? qd : qkv, wide_o = qd > vw ? qd : vw;
    size_t in_cols = max4(dim, qd, hid, vw); /* the widest matrix input */
    bool ovf = false, ok = true;             /* a size that overflows is an allocation failure */
    size_t cache = ml_mul_size(ctx, kvd, &ovf);
    s->chunk = (int)B;
    s->conv_len = linear ? ml_mul_size(h->lin_conv - 1, qkv, &ovf) : 0;
    s->S_len = linear ? ml_mul_size(V, ml_mul_size(h->lin_k_dim, h->lin_v_dim, &ovf), &ovf) : 0;

    s->layers = alloc(h->n_layers, sizeof *s->layers, &ok, &s->bytes);
    for (uint32_t l = 0; ok && !ovf && l < h->n_layers; l++) {
        layer_state *L = &s->layers[l];
        if (m->layers[l].flags & 8) {
            s->linear = 1;
            L->conv = alloc(s->conv_len, sizeof(float), &ok, &s->bytes);
            L->S = alloc(s->S_len, sizeof(float), &ok, &s->bytes);
        } else {
            L->k = alloc(cache, sizeof(float), &ok, &s->bytes);
            L->v = alloc(cache, sizeof(float), &ok, &s->bytes);
        }
    }
    for (int kind = 0; kind < 2; kind++) {
        s->inv_freq[kind] = alloc(half, sizeof(double), &ok, &s->bytes);
        s->cos[kind] = alloc(ml_mul_size(B, half, &ovf), sizeof(float), &ok, &s->bytes);
        s->sin[kind] = alloc(ml_mul_size(B, half, &ovf), sizeof(float), &ok, &s->bytes);
    }
    s->x = alloc(ml_mul_size(B, dim, &ovf), sizeof(float), &ok, &s->bytes);
    s->xb = alloc(ml_mul_size(B, dim, &ovf), sizeof(float), &ok, &s->bytes);
    s->xb2 = alloc(ml_mul_size(B, dim, &ovf), sizeof(float), &ok, &s->bytes);
    s->q = alloc(ml_mul_size(B, wide_q, &ovf), sizeof(float), &ok, &s->bytes);
    s->gate = alloc(ml_mul_size(B, wide_o, &ovf), sizeof(float), &ok, &s->bytes);
    s->o = alloc(ml_mul_size(B, wide_o, &ovf), sizeof(float), &ok, &s->bytes);
    s->hb = alloc(ml_mul_size(B, hid, &ovf), sizeof(float), &ok, &s->bytes);
    s->hb2 = alloc(ml_mul_size(B, hid, &ovf), sizeof(float), &ok, &s->bytes);
    s->beta = alloc(ml_mul_size(B, V, &ovf), sizeof(float), &ok, &s->bytes);
    s->g = alloc(ml_mul_size(B, V, &ovf), sizeof(float), &ok, &s->bytes);
    s->att = alloc(ml_mul_size(h->n_heads, ATT_KT, &ovf), sizeof(float), &ok, &s->bytes);
    s->xq = alloc(ml_mul_size(B, in_cols, &ovf), 1, &ok, &s->bytes);
    s->xd = alloc(ml_mul_size(B, in_cols / QK, &ovf), sizeof(float), &ok, &s->bytes);
    s->xs = alloc(ml_mul_size(B, in_cols / QK, &ovf), sizeof(int32_t), &ok, &s->bytes);
    if (!ok || ovf) {
        ml_forward_free(m);
        return ML_E_NOMEM;
    }
    rope_inv_freq(h, m->rot_dim, 0, s->inv_freq[0]);
    rope_inv_freq(h, m->rot_dim, 1, s->inv_freq[1]);
    return ML_OK;
}

size_t ml_forward_state_bytes(const struct ml_model *m) {
    return m && m->state ? ((const fstate *)m->state)->bytes + sizeof(fstate) : 0;
}

void ml_forward_free(struct ml_model *m) {
    fstate *s = m->state;
    ml_free_aligned(m->imatrix);
    m->imatrix = NULL;
    if (!s) return;
    if (s->layers)
        for (uint32_t l = 0; l < m->h.n_layers; l++) {
            ml_free_aligned(s->layers[l].k);
            ml_free_aligned(s->layers[l].v);
            ml_free_aligned(s->layers[l].conv);
            ml_free_aligned(s->layers[l].S);
        }
    ml_free_aligned(s->layers);
    for (int kind = 0; kind < 2; kind++) {
        ml_free_aligned(s->inv_freq[kind]);
        ml_free_aligned(s->cos[kind]);
        ml_free_aligned(s->sin[kind]);
    }
    float *scratch[] = {s->x, s->xb, s->xb2, s->q, s->gate, s->o, s->hb, s->hb2, s->beta, s->g, s->att, s->xd};
    for (size_t i = 0; i < sizeof scratch / sizeof *scratch; i++) ml_free_aligned(scratch[i]);
    ml_free_aligned(s->xq);
    ml_free_aligned(s->xs);
    free(s);
    m->state = NULL;
}

void ml_forward_reset(struct ml_model *m) {
    m->filled = 0;
    if (m->state) clear_linear_state(m, m->state);
}

/* ------------------------------------------------------------------ importance matrix */
ML_API int ml_imatrix_start(ml_model *m) {
    if (!m) return ML_E_ARG;
    bool ovf = false, ok = true;
    size_t len = im_len(m, &ovf);
    if (ovf) return ML_E_NOMEM;
    if (!m->imatrix) m->imatrix = alloc(len, sizeof(double), &ok, NULL);
    else memset(m->imatrix, 0, len * sizeof(double));
    if (!ok) return ML_E_NOMEM;
    m->im_tokens = m->im_tokens_cls = 0;
    return ML_OK;
}

/* n must be the MLI1 body's length: n_layers * (2 dim + q_dim + hidden_dim) + dim */
ML_API int ml_imatrix_get(const ml_model *m, double *sums, size_t n, uint64_t *tokens, uint64_t *tokens_cls) {
    bool ovf = false;
    if (!m || !m->imatrix || !sums || n != im_len(m, &ovf)) return ML_E_ARG;
    memcpy(sums, m->imatrix, n * sizeof(double));
    if (tokens) *tokens = m->im_tokens;
    if (tokens_cls) *tokens_cls = m->im_tokens_cls;
    return ML_OK;
}

ML_API int ml_forward(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits) {
    return forward(m, tokens, n, pos, logits, 0);
}

ML_API int ml_forward_last(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits) {
    return forward(m, tokens, n, pos, logits, 1);
}
