/* embed.c: BitNet embedding models (Qwen3 / Gemma 3 bases) from GGUF, the embeddings group of
 * mlrt.h. The reference is backends/reference/bitnet.py (its docstring lists every decision);
 * the GGUFs are those of tools/convert_bitnet.py (seed 004). Read top to bottom:
 *
 *   model       hyper-parameters, per layer the norms (float, owned) and seven projections in
 *               one of two readings (decision bitnet.reading; the file's own by default, as
 *               bitnet.cpp: ternary for I2_S, float for f32/f16):
 *                 ternary  packed I2_S rows: in the map for I2_S tensors, ternarized at load for
 *                          f32/f16 ones with the I2_S writer's rule (i2s_ternarize)
 *                 float    F16 / F32 rows in the map (I2_S dequantized to owned F32 rows)
 *   loader      every key and tensor checked (presence, type, shape, contents) before use; the
 *               per-projection norms are all there (a student) or none (a teacher)
 *   small ops   rmsnorm (NumPy's pairwise sum order), RoPE tables in double, SiLU, tanh-GELU
 *   linear      RMSNorm(x, <proj>_norm_in) when the file has it, then: ternary, int8 activations
 *               per token -> integer dot (four tokens per kernel call) -> the float epilogue;
 *               float, the input rounded to f16 for F16 weights (llama.cpp's F16 matmul) ->
 *               float dot (the table's fixed order); weight rows split over the pool
 *   attention   causal (Gemma sliding layers: 0 <= i - j < window), GQA, heads over the pool
 *   ml_embed    the layers, the final norm, pooling, optional L2 normalization
 *
 * Every output element is computed by the same operations whatever the number of threads, so
 * threads=1 equals threads=N bit for bit. Against the reference, the float operations are the
 * same and in the same order where cheap (norm sums pairwise as NumPy, RoPE angles in double,
 * the i2s epilogue); what remains is the order of the attention sums (eight running sums here,
 * NumPy's einsum has its own), libm's expf in the softmax against NumPy's, and the activations:
 * the table's act_mul (one exp formula on every ISA, i2s_kernels.h, within 2 ulp of exp; GELU as
 * g / (1 + exp(-2z)), the same function as 0.5 g (1 + tanh z)) against NumPy's exp/tanh. Those ulps
 * now and then move an int8 activation across a rounding boundary (one step: up to ~1/127 of a
 * projection's output scale), more often the longer the sequence: a tolerance
 * (tests/test_bitnet_embed.py).
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "bitnet.h"
#include "gguf.h"

#define LIMIT_DIM 65536       /* dim, head_dim, feed_forward_length, q/kv widths */
#define LIMIT_HEADS 4096
#define LIMIT_LAYERS 4096
#define LIMIT_VOCAB (1 << 24)
#define TOKEN_CHUNK 8         /* tokens per pass over a range of weight rows (dot_rows2x8's 8): 8 rows of int8
                               * activations (8 x 3072 bytes at most here) stay in L1 while the weight rows
                               * stream past; 64 went to L2 and was 9% slower on the 0.6B bench */
#define ROW_TILE 64           /* weight rows whose integer dots are gathered before their epilogue */

/* ---------------------------------------------------------------- model */
enum { P_Q, P_K, P_V, P_O, P_GATE, P_UP, P_DOWN, N_PROJ };
static const char *const proj_name[N_PROJ] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                              "ffn_gate", "ffn_up", "ffn_down"};
enum { W_TERNARY, W_F16, W_F32 }; /* how a projection is held and multiplied */

typedef struct {
    int32_t rows, cols;
    int fmt;
    const uint8_t *packed; /* W_TERNARY: rows * cols/4 bytes (specs/i2s.yaml `layout`): in the map or `owned` */
    uint8_t *owned;
    float d;               /* W_TERNARY: the stored scale */
    const void *w;         /* W_F16 (uint16_t) / W_F32 (float) rows: in the map, or `wf` */
    float *wf;             /* W_F32 rows dequantized from I2_S (the float reading of an I2_S file) */
} proj;

typedef struct {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm, *post_attn_norm, *post_ffw_norm; /* owned */
    float *norm_in[N_PROJ];
    proj p[N_PROJ];
    int sliding;  /* Gemma: the layer's attention is windowed */
    double base;  /* its RoPE base */
} layer;

struct ml_embedder {
    gguf_file g;
    int gemma;
    int32_t dim, n_layers, n_heads, n_kv, hd, ff, vocab;
    int32_t window; /* Gemma sliding window (0: none) */
    int32_t pooling; /* ML_POOL_MEAN / CLS / LAST from the GGUF (mean when unset) */
    int32_t reading; /* ML_READ_FLOAT or ML_READ_TERNARY, resolved at load */
    int norm_in;     /* the per-projection norms are there (a BitNet student) */
    float eps, attn_scale, embd_scale;
    const uint8_t *tok; /* token_embd rows in the map */
    int tok_f16;
    float *output_norm;
    layer *layers;
    struct ml_pool *pool;
    const i2s_kernel_table *k;
};

static void free_model(ml_embedder *e) {
    if (!e) return;
    if (e->layers)
        for (int32_t l = 0; l < e->n_layers; l++) {
            layer *L = &e->layers[l];
            free(L->attn_norm), free(L->ffn_norm), free(L->q_norm), free(L->k_norm);
            free(L->post_attn_norm), free(L->post_ffw_norm);
            for (int i = 0; i < N_PROJ; i++) free(L->norm_in[i]), free(L->p[i].owned), free(L->p[i].wf);
        }
    free(e->layers);
    free(e->output_norm);
    if (e->pool) ml_pool_free(e->pool);
    gguf_close(&e->g);
    free(e);
}

/* ---------------------------------------------------------------- loader */
typedef struct {
    const char *path;
    char *reason;
    size_t reason_len;
    ml_embedder *e;
    char arch[16];
    const char *rule; /* the rule of the refusal */
} loader;

/* A refusal: the status, the rule of specs/gguf.yaml ("" for none: out of memory, a bad argument)
 * and the reason, which names the file, the key or tensor and the value. */
__attribute__((format(printf, 4, 5)))
static int fail(loader *L, int status, const char *rule, const char *fmt, ...) {
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (*rule)
        ml_reason(L->reason, L->reason_len, "%s: %s [%s]", L->path, what, rule);
    else
        ml_reason(L->reason, L->reason_len, "%s: %s", L->path, what);
    L->rule = rule;
    return status;
}

static const char *type_name(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_F32: return "F32";
    case GGUF_TYPE_F16: return "F16";
    case GGUF_TYPE_I2_S: return "I2_S";
    default: return "unsupported";
    }
}

/* An integer key "<arch>.<suffix>": ML_OK with *out; a missing key gives def (def_ok) or
 * ML_E_FORMAT; a value outside [lo, hi] ML_E_SHAPE. */
static int key_int(loader *L, const char *suffix, int def_ok, int64_t def, int64_t lo, int64_t hi,
                   int64_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    const gguf_kv *kv = gguf_find_kv(&L->e->g, key);
    if (!kv) {
        if (!def_ok) return fail(L, ML_E_FORMAT, "bitnet.key", "missing key %s", key);
        *out = def;
    } else if (!gguf_kv_int(kv, out)) {
        return fail(L, ML_E_FORMAT, "bitnet.key", "key %s has type %s, an integer is required", key, gguf_type_name(kv->type));
    }
    if (*out < lo || *out > hi)
        return fail(L, ML_E_SHAPE, "bitnet.key_range", "key %s = %" PRId64 " is outside [%" PRId64 ", %" PRId64 "]", key, *out, lo, hi);
    return ML_OK;
}

/* A float key (f32/f64, or an integer): *present 0 when missing and not required. Non-finite or
 * negative values are refused (ML_E_FORMAT). */
static int key_float(loader *L, const char *suffix, int required, double *out, int *present) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    const gguf_kv *kv = gguf_find_kv(&L->e->g, key);
    *present = kv != NULL;
    if (!kv) return required ? fail(L, ML_E_FORMAT, "bitnet.key", "missing key %s", key) : ML_OK;
    int64_t i;
    if (gguf_kv_float(kv, out)) {
    } else if (gguf_kv_int(kv, &i)) {
        *out = (double)i;
    } else {
        return fail(L, ML_E_FORMAT, "bitnet.key", "key %s has type %s, a number is required", key, gguf_type_name(kv->type));
    }
    if (!isfinite(*out) || *out < 0)
        return fail(L, ML_E_FORMAT, "bitnet.key_value", "key %s = %g is not a finite non-negative number", key, *out);
    return ML_OK;
}

static int hparams(loader *L) {
    ml_embedder *e = L->e;
    const gguf_kv *kv = gguf_find_kv(&e->g, "general.architecture");
    gguf_str a;
    if (!kv) return fail(L, ML_E_FORMAT, "bitnet.arch", "missing key general.architecture");
    if (!gguf_kv_string(kv, &a))
        return fail(L, ML_E_FORMAT, "bitnet.arch", "key general.architecture has type %s, a string is required",
                    gguf_type_name(kv->type));
    if (gguf_str_eq(a, "qwen3")) {
        strcpy(L->arch, "qwen3");
    } else if (gguf_str_eq(a, "gemma3")) {
        strcpy(L->arch, "gemma3");
        e->gemma = 1;
    } else {
        return fail(L, ML_E_FORMAT, "bitnet.arch", "general.architecture \"%.*s\" is not supported (qwen3 or gemma3)",
                    (int)(a.len > 64 ? 64 : a.len), a.ptr);
    }
    int64_t dim, nl, nh, nkv, hd, vl, ff, pool, win = 0;
    int rc;
    if ((rc = key_int(L, "embedding_length", 0, 0, 1, LIMIT_DIM, &dim)) ||
        (rc = key_int(L, "block_count", 0, 0, 1, LIMIT_LAYERS, &nl)) ||
        (rc = key_int(L, "feed_forward_length", 0, 0, 1, LIMIT_DIM, &ff)) ||
        (rc = key_int(L, "attention.head_count", 0, 0, 1, LIMIT_HEADS, &nh)) ||
        (rc = key_int(L, "attention.head_count_kv", 1, nh, 1, nh, &nkv)) ||
        (rc = key_int(L, "attention.key_length", 1, dim / nh, 2, LIMIT_DIM, &hd)) ||
        (rc = key_int(L, "attention.value_length", 1, hd, hd, hd, &vl)) ||
        (rc = key_int(L, "pooling_type", 1, 0, INT32_MIN, INT32_MAX, &pool)))
        return rc;
    if (nh % nkv)
        return fail(L, ML_E_SHAPE, "bitnet.hparams", "%s.attention.head_count %" PRId64 " is not a multiple of head_count_kv %" PRId64,
                    L->arch, nh, nkv);
    if (hd % 2) return fail(L, ML_E_SHAPE, "bitnet.hparams", "%s.attention.key_length %" PRId64 " is odd (rotate-half RoPE)", L->arch, hd);
    if (nh * hd > LIMIT_DIM)
        return fail(L, ML_E_SHAPE, "bitnet.hparams", "head_count x key_length = %" PRId64 " exceeds %d", nh * hd, LIMIT_DIM);
    double eps, base, base_swa = 0, qpas = 0;
    int has, has_swa = 0, has_qpas = 0;
    if ((rc = key_float(L, "attention.layer_norm_rms_epsilon", 1, &eps, &has)) ||
        (rc = key_float(L, "rope.freq_base", 0, &base, &has)))
        return rc;
    if (!has) base = 10000.0;
    if (!(base > 0)) return fail(L, ML_E_FORMAT, "bitnet.key_value", "key %s.rope.freq_base = %g: a RoPE base must be positive", L->arch, base);
    const gguf_kv *pat = NULL;
    if (e->gemma) {
        if ((rc = key_float(L, "rope.freq_base_swa", 0, &base_swa, &has_swa)) ||
            (rc = key_float(L, "attention.query_pre_attn_scalar", 0, &qpas, &has_qpas)) ||
            (rc = key_int(L, "attention.sliding_window", 1, 0, 0, INT32_MAX, &win)))
            return rc;
        char key[128];
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", L->arch);
        pat = gguf_find_kv(&e->g, key);
        int64_t v;
        if (pat && (pat->type != GGUF_V_ARRAY || (pat->arr_n > 0 && !gguf_kv_array_int(pat, 0, &v))))
            return fail(L, ML_E_FORMAT, "bitnet.key", "key %s must be an array of bool", key);
        if (pat && pat->arr_n < (uint64_t)nl)
            return fail(L, ML_E_FORMAT, "bitnet.key", "key %s has %" PRIu64 " entries, block_count is %" PRId64, key, pat->arr_n, nl);
    }
    e->dim = (int32_t)dim, e->n_layers = (int32_t)nl, e->n_heads = (int32_t)nh, e->n_kv = (int32_t)nkv;
    e->hd = (int32_t)hd, e->ff = (int32_t)ff, e->window = (int32_t)win;
    e->eps = (float)eps;
    e->pooling = pool == 2 ? ML_POOL_CLS : pool == 3 ? ML_POOL_LAST : ML_POOL_MEAN; /* as the reference: else mean */
    /* as the reference: float32(1 / math.sqrt(v)), v = query_pre_attn_scalar (Gemma, when non-zero) */
    double sv = e->gemma && has_qpas && qpas != 0 ? qpas : (double)hd;
    e->attn_scale = (float)(1.0 / sqrt(sv));
    e->embd_scale = (float)sqrt((double)dim);
    e->layers = calloc((size_t)nl, sizeof *e->layers);
    if (!e->layers) return fail(L, ML_E_NOMEM, "", "out of memory");
    for (int32_t l = 0; l < e->n_layers; l++) {
        int64_t s = 0;
        if (pat) gguf_kv_array_int(pat, (uint64_t)l, &s);
        e->layers[l].sliding = e->gemma && s != 0;
        e->layers[l].base = e->layers[l].sliding && has_swa && base_swa != 0 ? base_swa : base;
    }
    return ML_OK;
}

/* Tensor kinds: what types and how many dimensions they may have. */
enum { K_NORM, K_EMBED, K_PROJ };

/* The tensor `name` of `kind` with ggml dims (d0) or (d0, d1): checked present (ML_E_FORMAT),
 * of an allowed type (ML_E_FORMAT), of that shape (ML_E_SHAPE). */
static int tensor(loader *L, const char *name, int kind, uint64_t d0, uint64_t d1, const gguf_tensor **out) {
    const gguf_tensor *t = gguf_find_tensor(&L->e->g, name);
    if (!t) return fail(L, ML_E_FORMAT, "bitnet.tensor_missing", "missing tensor %s", name);
    int ok = t->type == GGUF_TYPE_F32 || t->type == GGUF_TYPE_F16 || (kind == K_PROJ && t->type == GGUF_TYPE_I2_S);
    if (!ok)
        return fail(L, ML_E_FORMAT, "bitnet.tensor_type", "tensor %s has type %s (%" PRIu32 "), expected %s", name, type_name(t->type),
                    t->type, kind == K_PROJ ? "F32, F16 or I2_S" : "F32 or F16");
    uint32_t nd = kind == K_NORM ? 1 : 2;
    if (t->n_dims != nd || t->dims[0] != d0 || (nd == 2 && t->dims[1] != d1)) {
        char got[96] = "", want[64];
        size_t o = 0;
        for (uint32_t i = 0; i < t->n_dims && o < sizeof got; i++)
            o += (size_t)snprintf(got + o, sizeof got - o, "%s%" PRIu64, i ? ", " : "", t->dims[i]);
        if (nd == 1)
            snprintf(want, sizeof want, "%" PRIu64, d0);
        else
            snprintf(want, sizeof want, "%" PRIu64 ", %" PRIu64, d0, d1);
        return fail(L, ML_E_SHAPE, "bitnet.tensor_shape", "tensor %s has shape [%s], the hyper-parameters imply [%s] (ggml order: cols first)",
                    name, got, want);
    }
    *out = t;
    return ML_OK;
}

static int finite_bits_f32(uint32_t u) { return (u & 0x7f800000u) != 0x7f800000u; }
static int finite_bits_f16(uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }

/* Index of the first non-finite element of a float tensor of n elements, or n. */
static uint64_t first_nonfinite(const gguf_tensor *t, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (t->type == GGUF_TYPE_F32 ? !finite_bits_f32(gguf_rd_u32(t->data + 4 * i))
                                     : !finite_bits_f16(gguf_rd_u16(t->data + 2 * i)))
            return i;
    return n;
}

static float elem(const gguf_tensor *t, uint64_t i) {
    return t->type == GGUF_TYPE_F32 ? gguf_rd_f32(t->data + 4 * i) : ml_f16_to_f32(gguf_rd_u16(t->data + 2 * i));
}

static int check_finite(loader *L, const char *name, const gguf_tensor *t, uint64_t n) {
    uint64_t bad = first_nonfinite(t, n);
    if (bad < n) return fail(L, ML_E_FORMAT, "bitnet.finite", "tensor %s: element %" PRIu64 " is not finite", name, bad);
    return ML_OK;
}

/* A 1-D norm of n floats, converted to an owned float array. */
static int norm(loader *L, const char *name, int32_t n, float **out) {
    const gguf_tensor *t;
    int rc = tensor(L, name, K_NORM, (uint64_t)n, 0, &t);
    if (rc || (rc = check_finite(L, name, t, (uint64_t)n))) return rc;
    float *w = malloc((size_t)n * sizeof *w);
    if (!w) return fail(L, ML_E_NOMEM, "", "out of memory for tensor %s", name);
    for (int32_t i = 0; i < n; i++) w[i] = elem(t, (uint64_t)i);
    *out = w;
    return ML_OK;
}

/* A projection (rows, cols) in the model's reading. Ternary: I2_S mapped after its checks, f32/f16
 * checked and ternarized (i2s_ternarize). Float: f32/f16 mapped after the finiteness check, I2_S
 * checked and dequantized (q * d). */
static int projection(loader *L, const char *name, int32_t rows, int32_t cols, proj *p) {
    const gguf_tensor *t;
    int rc = tensor(L, name, K_PROJ, (uint64_t)cols, (uint64_t)rows, &t);
    if (rc) return rc;
    int ternary = L->e->reading == ML_READ_TERNARY;
    if ((ternary || t->type == GGUF_TYPE_I2_S) && cols % I2S_BLOCK)
        return fail(L, ML_E_SHAPE, "bitnet.i2s_cols", "tensor %s: rows of %" PRId32 " values, the I2_S kernels need a multiple of %d", name,
                    cols, I2S_BLOCK);
    p->rows = rows, p->cols = cols;
    p->fmt = ternary ? W_TERNARY : t->type == GGUF_TYPE_F16 ? W_F16 : W_F32;
    size_t n = (size_t)rows * (size_t)cols, nbytes = n / 4;
    if (!ternary && t->type != GGUF_TYPE_I2_S) {
        p->w = t->data;
        return check_finite(L, name, t, (uint64_t)n);
    }
    if (t->type == GGUF_TYPE_I2_S) {
        /* gguf.c checked rows*cols/4 + 32 bytes inside the file: the payload is complete */
        p->packed = t->data;
        p->d = gguf_rd_f32(t->data + nbytes);
        if (!isfinite(p->d)) return fail(L, ML_E_FORMAT, "bitnet.i2s_scale", "tensor %s: the I2_S scale is not finite", name);
        for (size_t i = 0; i < nbytes; i++) {
            uint8_t v = t->data[i];
            uint8_t three = v & (uint8_t)(v >> 1) & 0x55; /* bit 2k set: field k is code 3 */
            if (three) {
                int f = three & 0x40 ? 0 : three & 0x10 ? 1 : three & 0x04 ? 2 : 3; /* field 0 = bits 7..6 */
                uint64_t el = (uint64_t)(i / 32) * I2S_BLOCK + (uint64_t)(i % 32) + 32u * (uint64_t)f;
                return fail(L, ML_E_FORMAT, "bitnet.i2s_code", "tensor %s: code 3 at element %" PRIu64 " (I2_S codes are 0, 1, 2)", name, el);
            }
        }
        if (ternary) return ML_OK;
        p->wf = malloc(n * sizeof *p->wf); /* the float reading: q * d, exact */
        if (!p->wf) return fail(L, ML_E_NOMEM, "", "out of memory for tensor %s", name);
        for (size_t i = 0; i < n; i++) {
            int code = (t->data[(i / I2S_BLOCK) * I2S_BLOCK_BYTES + i % 32] >> (6 - 2 * ((i % I2S_BLOCK) / 32))) & 3;
            p->wf[i] = (float)(code - 1) * p->d;
        }
        p->w = p->wf;
        return ML_OK;
    }
    if ((rc = check_finite(L, name, t, (uint64_t)n))) return rc;
    float *w = malloc(n * sizeof *w);
    p->owned = malloc(nbytes);
    if (!w || !p->owned) {
        free(w);
        return fail(L, ML_E_NOMEM, "", "out of memory for tensor %s", name);
    }
    for (size_t i = 0; i < n; i++) w[i] = elem(t, (uint64_t)i);
    i2s_ternarize(w, n, p->owned, &p->d);
    free(w);
    p->packed = p->owned;
    return ML_OK;
}

static int tensors(loader *L) {
    ml_embedder *e = L->e;
    /* every tensor of the file has a type the runtime reads, as the reference requires */
    for (uint64_t i = 0; i < e->g.n_tensors; i++) {
        const gguf_tensor *t = &e->g.tensors[i];
        if (t->type != GGUF_TYPE_F32 && t->type != GGUF_TYPE_F16 && t->type != GGUF_TYPE_I2_S)
            return fail(L, ML_E_FORMAT, "bitnet.tensor_type", "tensor %.*s has unsupported type %" PRIu32 " (F32, F16 or I2_S)",
                        (int)(t->name.len > 200 ? 200 : t->name.len), t->name.ptr, t->type);
    }
    const gguf_tensor *tok;
    const gguf_tensor *probe = gguf_find_tensor(&e->g, "token_embd.weight");
    if (probe && probe->n_dims != 2)
        return fail(L, ML_E_SHAPE, "bitnet.tensor_shape", "tensor token_embd.weight has %" PRIu32 " dimensions, expected 2 [%" PRId32 ", vocab]",
                    probe->n_dims, e->dim);
    uint64_t vocab = probe ? probe->dims[1] : 0;
    if (probe && (vocab < 1 || vocab > LIMIT_VOCAB))
        return fail(L, ML_E_SHAPE, "bitnet.tensor_shape", "tensor token_embd.weight: vocab %" PRIu64 " outside [1, %d]", vocab, LIMIT_VOCAB);
    int rc = tensor(L, "token_embd.weight", K_EMBED, (uint64_t)e->dim, vocab, &tok);
    if (rc || (rc = check_finite(L, "token_embd.weight", tok, vocab * (uint64_t)e->dim))) return rc;
    e->vocab = (int32_t)vocab;
    e->tok = tok->data;
    e->tok_f16 = tok->type == GGUF_TYPE_F16;
    int32_t qd = e->n_heads * e->hd, kvd = e->n_kv * e->hd;
    const int32_t rows[N_PROJ] = {qd, kvd, kvd, e->dim, e->ff, e->ff, e->dim};
    const int32_t cols[N_PROJ] = {e->dim, e->dim, e->dim, qd, e->dim, e->dim, e->ff};
    char name[96];
    /* The file's own reading (any I2_S projection: ternary, else float) and the per-projection
     * norms: all of them (a student) or none (a teacher). */
    int any_i2s = 0, n_norm_in = 0, n_proj = e->n_layers * N_PROJ;
    char missing[96] = "";
    for (int32_t l = 0; l < e->n_layers; l++)
        for (int i = 0; i < N_PROJ; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, proj_name[i]);
            const gguf_tensor *t = gguf_find_tensor(&e->g, name);
            any_i2s |= t && t->type == GGUF_TYPE_I2_S;
            snprintf(name, sizeof name, "blk.%d.%s_norm_in.weight", l, proj_name[i]);
            if (gguf_find_tensor(&e->g, name))
                n_norm_in++;
            else if (!missing[0])
                memcpy(missing, name, sizeof missing);
        }
    if (n_norm_in && n_norm_in < n_proj)
        return fail(L, ML_E_FORMAT, "bitnet.norm_in", "missing tensor %s: a BitNet GGUF has a per-projection norm for every projection "
                    "or none", missing);
    e->norm_in = n_norm_in > 0;
    /* I2_S projections are a student's: without the norms the file is no BitNet model (found by
     * mlconf fuzz: a cut tensor count once gave ML_E_ARG, a bad argument, for the file) */
    if (any_i2s && !e->norm_in)
        return fail(L, ML_E_FORMAT, "bitnet.norm_in", "missing tensor %s: I2_S projections are a BitNet student's, "
                    "which has a per-projection norm for every projection", missing);
    if (e->reading == ML_READ_MODEL) e->reading = any_i2s ? ML_READ_TERNARY : ML_READ_FLOAT;
    if (e->reading == ML_READ_TERNARY && !e->norm_in)
        return fail(L, ML_E_ARG, "", "reading ternary needs a BitNet student (per-projection norms); this GGUF is a plain "
                    "model (a float teacher): read it as float");
#define NORM(field, fmt, width)                                      \
    do {                                                             \
        snprintf(name, sizeof name, fmt, l);                         \
        if ((rc = norm(L, name, width, &Ly->field))) return rc;      \
    } while (0)
    for (int32_t l = 0; l < e->n_layers; l++) {
        layer *Ly = &e->layers[l];
        NORM(attn_norm, "blk.%d.attn_norm.weight", e->dim);
        for (int i = 0; i < N_PROJ; i++) {
            snprintf(name, sizeof name, "blk.%d.%s_norm_in.weight", l, proj_name[i]);
            if (e->norm_in && (rc = norm(L, name, cols[i], &Ly->norm_in[i]))) return rc;
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, proj_name[i]);
            if ((rc = projection(L, name, rows[i], cols[i], &Ly->p[i]))) return rc;
        }
        NORM(q_norm, "blk.%d.attn_q_norm.weight", e->hd);
        NORM(k_norm, "blk.%d.attn_k_norm.weight", e->hd);
        NORM(ffn_norm, "blk.%d.ffn_norm.weight", e->dim);
        if (e->gemma) {
            NORM(post_attn_norm, "blk.%d.post_attention_norm.weight", e->dim);
            NORM(post_ffw_norm, "blk.%d.post_ffw_norm.weight", e->dim);
        }
    }
#undef NORM
    return norm(L, "output_norm.weight", e->dim, &e->output_norm);
}

/* Load in `reading`; check_only: no thread pool (ml_embed_check_rule). *rule: the rule of a refusal. */
static int load(const char *path, int32_t threads, int32_t reading, int check_only, ml_embedder **out,
                const char **rule, char *reason, size_t reason_len) {
    *out = NULL;
    *rule = "";
    ml_embedder *e = calloc(1, sizeof *e);
    if (!e) {
        ml_reason(reason, reason_len, "%s: out of memory", path);
        return ML_E_NOMEM;
    }
    e->reading = reading;
    loader L = {path, reason, reason_len, e, "", ""};
    int rc = gguf_open(path, &e->g, rule, reason, reason_len);
    if (rc == ML_OK) rc = hparams(&L);
    if (rc == ML_OK) rc = tensors(&L);
    if (rc == ML_OK && !check_only) {
        e->k = i2s_kernels();
        e->pool = ml_pool_new(threads);
        if (!e->pool) rc = fail(&L, ML_E_NOMEM, "", "cannot start %" PRId32 " threads", threads);
    }
    if (L.rule[0]) *rule = L.rule;
    if (rc != ML_OK) {
        free_model(e);
        return rc;
    }
    *out = e;
    return ML_OK;
}

ML_API int ml_embed_load(const char *path, int32_t threads, ml_embedder **out, char *reason, size_t reason_len) {
    return ml_embed_load_reading(path, threads, ML_READ_MODEL, out, reason, reason_len);
}

ML_API int ml_embed_load_reading(const char *path, int32_t threads, int32_t reading, ml_embedder **out, char *reason,
                                 size_t reason_len) {
    if (out) *out = NULL;
    if (!path || !out || threads < 0 || reading < ML_READ_MODEL || reading > ML_READ_TERNARY) {
        ml_reason(reason, reason_len, "%s: invalid argument (path %s, out %s, threads %d, reading %d)",
                  path ? path : "(null)", path ? "set" : "NULL", out ? "set" : "NULL", (int)threads, (int)reading);
        return ML_E_ARG;
    }
    const char *rule;
    return load(path, threads, reading, 0, out, &rule, reason, reason_len);
}

ML_API int ml_embed_check_rule(const char *path, char *rule, size_t rule_len, char *reason, size_t reason_len) {
    if (!path) {
        ml_reason(reason, reason_len, "(null): invalid argument (path NULL)");
        return ML_E_ARG;
    }
    ml_embedder *e;
    const char *r;
    int rc = load(path, 1, ML_READ_MODEL, 1, &e, &r, reason, reason_len);
    if (e) free_model(e);
    if (rc == ML_OK) ml_reason(reason, reason_len, "%s: accepted", path);
    if (rule && rule_len) snprintf(rule, rule_len, "%s", r);
    return rc;
}

ML_API void ml_embed_free(ml_embedder *e) { free_model(e); }
ML_API int32_t ml_embed_dim(const ml_embedder *e) { return e ? e->dim : 0; }
ML_API int32_t ml_embed_vocab(const ml_embedder *e) { return e ? e->vocab : 0; }

/* ---------------------------------------------------------------- small ops */
/* Sum of v[i]^2 in float32 in NumPy's pairwise order (np.add.reduce over a contiguous axis: 8
 * running sums up to 128 elements, halves above), as forward.py's rmsnorm sums. */
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

/* forward.py rmsnorm: out = (v * (1 / sqrt(mean(v^2) + eps))) * w, float32 (in place allowed),
 * the last step by the table's norm_mul */
static void rmsnorm(const ml_embedder *e, float *out, const float *v, const float *w, int n) {
    float ms = sum_squares(v, n) / (float)n;
    float r = 1.0f / sqrtf(ms + e->eps);
    e->k->norm_mul(n, v, r, w, out);
}


/* RoPE tables (n, hd/2) of one base, as the reference: inv = base^(-2i/hd) and ang = pos * inv in
 * double, cos and sin in double rounded to float. */
static void rope_table(int n, int hd, double base, float *c, float *s) {
    int half = hd / 2;
    for (int f = 0; f < half; f++) {
        double inv = pow(base, -(double)(2 * f) / (double)hd);
        for (int t = 0; t < n; t++) {
            double ang = (double)t * inv;
            c[(size_t)t * half + f] = (float)cos(ang);
            s[(size_t)t * half + f] = (float)sin(ang);
        }
    }
}

/* Rotate-half (NEOX) over a whole head x[hd]: (x1 c - x2 s, x2 c + x1 s). */
static void rope(float *x, int hd, const float *c, const float *s) {
    int half = hd / 2;
    for (int f = 0; f < half; f++) {
        float x1 = x[f], x2 = x[f + half];
        x[f] = x1 * c[f] - x2 * s[f];
        x[f + half] = x2 * c[f] + x1 * s[f];
    }
}

/* ---------------------------------------------------------------- scratch */
typedef struct {
    float *x, *h, *xin, *q, *k, *v, *att, *y, *g, *u, *cos0, *sin0, *cos1, *sin1;
    float *kt, *vh; /* the attention's keys in transposed tiles (attn.h) and values head-major [kv head][token][hd] */
    int8_t *q8;
    float *ascale;
    int32_t *asum;
} scratch;

static void scratch_free(scratch *s) {
    free(s->x), free(s->h), free(s->xin), free(s->q), free(s->k), free(s->v), free(s->att), free(s->y);
    free(s->kt), free(s->vh);
    free(s->g), free(s->u), free(s->cos0), free(s->sin0), free(s->cos1), free(s->sin1);
    free(s->q8), free(s->ascale), free(s->asum);
}

static void *alloc(size_t n, size_t size, bool *ok) {
    bool ovf = false;
    size_t b = ml_mul_size(n, size, &ovf);
    void *p = ovf ? NULL : ml_alloc_aligned(b); /* whole-row SIMD loads stay within cache lines */
    if (!p) *ok = false;
    return p;
}

static int scratch_new(const ml_embedder *e, int n, scratch *s) {
    memset(s, 0, sizeof *s);
    size_t N = (size_t)n, qd = (size_t)e->n_heads * (size_t)e->hd, kvd = (size_t)e->n_kv * (size_t)e->hd;
    size_t D = (size_t)e->dim, F = (size_t)e->ff;
    size_t wide = D > qd ? D : qd;
    wide = wide > F ? wide : F;
    bool ok = true, ovf = false;
    s->x = alloc(ml_mul_size(N, D, &ovf), sizeof(float), &ok);
    s->h = alloc(ml_mul_size(N, D, &ovf), sizeof(float), &ok);
    s->xin = alloc(ml_mul_size(N, wide, &ovf), sizeof(float), &ok);
    s->q8 = alloc(ml_mul_size(N, wide, &ovf), 1, &ok);
    s->ascale = alloc(N, sizeof(float), &ok);
    s->asum = alloc(N, sizeof(int32_t), &ok);
    s->q = alloc(ml_mul_size(N, qd, &ovf), sizeof(float), &ok);
    s->att = alloc(ml_mul_size(N, qd, &ovf), sizeof(float), &ok);
    s->k = alloc(ml_mul_size(N, kvd, &ovf), sizeof(float), &ok);
    s->v = alloc(ml_mul_size(N, kvd, &ovf), sizeof(float), &ok);
    s->kt = alloc(ml_mul_size(i2s_att_tiles(n) * I2S_ATT_TILE, kvd, &ovf), sizeof(float), &ok);
    s->vh = alloc(ml_mul_size(N, kvd, &ovf), sizeof(float), &ok);
    s->y = alloc(ml_mul_size(N, D > F ? D : F, &ovf), sizeof(float), &ok);
    s->g = alloc(ml_mul_size(N, F, &ovf), sizeof(float), &ok);
    s->u = alloc(ml_mul_size(N, F, &ovf), sizeof(float), &ok);
    size_t rt = ml_mul_size(N, (size_t)e->hd / 2, &ovf);
    s->cos0 = alloc(rt, sizeof(float), &ok), s->sin0 = alloc(rt, sizeof(float), &ok);
    s->cos1 = alloc(rt, sizeof(float), &ok), s->sin1 = alloc(rt, sizeof(float), &ok);
    if (!ok || ovf) {
        scratch_free(s);
        return ML_E_NOMEM;
    }
    return ML_OK;
}

/* ---------------------------------------------------------------- bitlinear */
typedef struct {
    const ml_embedder *e;
    const proj *p;
    const scratch *s;
    int n;
    float *y; /* (n, rows) */
} lin_job;

/* Rows [r0, r1) of y, tokens in chunks of TOKEN_CHUNK (their int8 rows stay in cache while the
 * weight rows stream past): a whole chunk two rows x eight tokens per kernel call (dot_rows2x8),
 * else four tokens per call (dot4), then one; the integer dots of ROW_TILE rows are
 * gathered per token, then the table's epilogue runs along them (y's rows are per token). */
static void lin_rows(void *arg, int64_t r0, int64_t r1) {
    const lin_job *j = arg;
    const proj *p = j->p;
    const i2s_kernel_table *k = j->e->k;
    const int8_t *q8 = j->s->q8;
    const float *a = j->s->ascale;
    const int32_t *sum = j->s->asum;
    size_t cols = (size_t)p->cols, rows = (size_t)p->rows, rb = cols / 4;
    int32_t acc[TOKEN_CHUNK][ROW_TILE];
    for (int t0 = 0; t0 < j->n; t0 += TOKEN_CHUNK) {
        int t1 = j->n - t0 > TOKEN_CHUNK ? t0 + TOKEN_CHUNK : j->n;
        for (int64_t rt = r0; rt < r1; rt += ROW_TILE) {
            int nr = r1 - rt < ROW_TILE ? (int)(r1 - rt) : ROW_TILE;
            int i = 0;
            if (k->dot_rows2x8 && t1 - t0 == 8) /* a whole chunk: two rows x eight tokens a call */
                for (; i + 2 <= nr; i += 2) {
                    const int8_t *x[8];
                    for (int u = 0; u < 8; u++) x[u] = q8 + (size_t)(t0 + u) * cols;
                    k->dot_rows2x8(p->cols, p->packed + (size_t)(rt + i) * rb, x, &acc[0][i], ROW_TILE);
                }
            for (; i < nr; i++) {
                const uint8_t *w = p->packed + (size_t)(rt + i) * rb;
                int t = t0;
                for (; t + 4 <= t1; t += 4) {
                    const int8_t *x[4] = {q8 + (size_t)t * cols, q8 + (size_t)(t + 1) * cols,
                                          q8 + (size_t)(t + 2) * cols, q8 + (size_t)(t + 3) * cols};
                    int32_t o[4];
                    k->dot4(p->cols, w, x, o);
                    for (int u = 0; u < 4; u++) acc[t - t0 + u][i] = o[u];
                }
                for (; t < t1; t++) acc[t - t0][i] = k->dot(p->cols, w, q8 + (size_t)t * cols);
            }
            for (int t = t0; t < t1; t++) k->epilogue(nr, acc[t - t0], sum[t], a[t], p->d, j->y + (size_t)t * rows + (size_t)rt);
        }
    }
}

/* The float reading: rows [r0, r1) of y = x W^T, x the (f16-rounded, for F16 weights) inputs in
 * s->xin; tokens in chunks of TOKEN_CHUNK against each weight row, as lin_rows. */
static void float_rows(void *arg, int64_t r0, int64_t r1) {
    const lin_job *j = arg;
    const proj *p = j->p;
    const i2s_kernel_table *k = j->e->k;
    size_t cols = (size_t)p->cols, rows = (size_t)p->rows;
    for (int t0 = 0; t0 < j->n; t0 += TOKEN_CHUNK) {
        int t1 = j->n - t0 > TOKEN_CHUNK ? t0 + TOKEN_CHUNK : j->n;
        for (int64_t r = r0; r < r1; r++) {
            for (int t = t0; t < t1; t++) {
                const float *x = j->s->xin + (size_t)t * cols;
                j->y[(size_t)t * rows + (size_t)r] =
                    p->fmt == W_F16 ? k->dot_f16(p->cols, (const uint16_t *)p->w + (size_t)r * cols, x)
                                    : k->dot_f32(p->cols, (const float *)p->w + (size_t)r * cols, x);
            }
        }
    }
}

/* The inputs of tokens [t0, t1) of one projection (prep_job): the norm, the finiteness check, then
 * the int8 activations (ternary) or the f16 rounding (F16 weights). */
typedef struct {
    const ml_embedder *e;
    scratch *s;
    const float *x, *norm_in;
    const proj *p;
    int bad; /* set (atomically) when an input is not finite */
} prep_job;

static void prep_tokens(void *arg, int64_t t0, int64_t t1) {
    prep_job *j = arg;
    const ml_embedder *e = j->e;
    const proj *p = j->p;
    scratch *s = j->s;
    size_t cols = (size_t)p->cols;
    for (int64_t t = t0; t < t1; t++) {
        float *xi = s->xin + (size_t)t * cols;
        if (j->norm_in)
            rmsnorm(e, xi, j->x + (size_t)t * cols, j->norm_in, p->cols);
        else
            memcpy(xi, j->x + (size_t)t * cols, cols * sizeof *xi);
        for (size_t i = 0; i < cols; i++)
            if (!isfinite(xi[i])) {
                __atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
                return;
            }
        if (p->fmt == W_TERNARY)
            s->ascale[t] = e->k->quantize_act(xi, p->cols, s->q8 + (size_t)t * cols, &s->asum[t]);
        else if (p->fmt == W_F16)
            for (size_t i = 0; i < cols; i++) xi[i] = ml_f16_to_f32(ml_f32_to_f16(xi[i]));
    }
}

/* y (n, rows) = one projection of x (n, cols): RMSNorm(x, norm_in) when the model has the
 * per-projection norms, then the ternary BitLinear (int8 activations -> integer dot ->
 * epilogue) or the float matmul (inputs rounded to f16 for F16 weights, as llama.cpp's F16
 * matmul). The tokens' inputs and then the weight rows are split over the pool; every value is
 * computed the same way whatever the threads. ML_E_FORMAT if an input is not finite (the
 * model's values overflowed). */
static int linear(const ml_embedder *e, scratch *s, const float *x, const float *norm_in, const proj *p, int n,
                  float *y) {
    prep_job pj = {e, s, x, norm_in, p, 0};
    ml_pool_run(e->pool, n, prep_tokens, &pj);
    if (pj.bad) return ML_E_FORMAT;
    lin_job j = {e, p, s, n, y};
    ml_pool_run(e->pool, p->rows, p->fmt == W_TERNARY ? lin_rows : float_rows, &j);
    return ML_OK;
}

/* ---------------------------------------------------------------- the pass */
/* g = act(g) * u over tokens [t0, t1) (SiLU, or Gemma's tanh GELU), split over the pool */
typedef struct {
    const ml_embedder *e;
    scratch *s;
} act_job;

static void act_tokens(void *arg, int64_t t0, int64_t t1) {
    const act_job *j = arg;
    size_t ff = (size_t)j->e->ff;
    for (int64_t t = t0; t < t1; t++)
        j->e->k->act_mul(j->e->gemma, j->e->ff, j->s->g + (size_t)t * ff, j->s->u + (size_t)t * ff);
}

/* The per-token steps between the matmuls, split over the pool by tokens (each token's values are
 * computed by the same operations whatever the split): run one after the serial loop they replaced
 * cost a tenth of a 512-token prefill on 2 threads (the other thread waited). */
enum { ST_ATTN_NORM, ST_QK, ST_ATTN_OUT, ST_FFN_OUT };
typedef struct {
    const ml_embedder *e;
    scratch *s;
    const layer *Ly;
    int n, stage;
} tok_job;

static void add_row(float *x, const float *a, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += a[i];
}

static void tok_stage(void *arg, int64_t t0, int64_t t1) {
    const tok_job *j = arg;
    const ml_embedder *e = j->e;
    scratch *s = j->s;
    const layer *Ly = j->Ly;
    size_t D = (size_t)e->dim, N = (size_t)j->n, hd = (size_t)e->hd;
    int nh = e->n_heads, nkv = e->n_kv;
    for (size_t t = (size_t)t0; t < (size_t)t1; t++) {
        switch (j->stage) {
        case ST_ATTN_NORM: /* the attention's input; the FFN's is ST_ATTN_OUT's last step */
            rmsnorm(e, s->h + t * D, s->x + t * D, Ly->attn_norm, e->dim);
            break;
        case ST_QK: { /* q/k norms and RoPE, then the keys into the attention's transposed tiles and the
                       * values head-major (attn.h): a token-major row is kvd floats, at Qwen3's 1024
                       * one 4 KiB page per key, and the prefetchers do not cross pages */
            const float *c = (Ly->sliding ? s->cos1 : s->cos0) + t * (hd / 2);
            const float *sn = (Ly->sliding ? s->sin1 : s->sin0) + t * (hd / 2);
            for (int h = 0; h < nh; h++) {
                float *q = s->q + (t * (size_t)nh + (size_t)h) * hd;
                rmsnorm(e, q, q, Ly->q_norm, e->hd);
                rope(q, e->hd, c, sn);
            }
            for (int h = 0; h < nkv; h++) {
                float *k = s->k + (t * (size_t)nkv + (size_t)h) * hd;
                rmsnorm(e, k, k, Ly->k_norm, e->hd);
                rope(k, e->hd, c, sn);
                size_t src = (t * (size_t)nkv + (size_t)h) * hd, dst = ((size_t)h * N + t) * hd;
                for (size_t d = 0; d < hd; d++) s->kt[i2s_att_kt_index(j->n, e->hd, h, (int)t, (int)d)] = k[d];
                memcpy(s->vh + dst, s->v + src, hd * sizeof(float));
            }
            break;
        }
        case ST_ATTN_OUT: /* Gemma's post norm, the residual, the FFN's input norm */
            if (e->gemma) rmsnorm(e, s->y + t * D, s->y + t * D, Ly->post_attn_norm, e->dim);
            add_row(s->x + t * D, s->y + t * D, D);
            rmsnorm(e, s->h + t * D, s->x + t * D, Ly->ffn_norm, e->dim);
            break;
        case ST_FFN_OUT:
            if (e->gemma) rmsnorm(e, s->y + t * D, s->y + t * D, Ly->post_ffw_norm, e->dim);
            add_row(s->x + t * D, s->y + t * D, D);
            break;
        }
    }
}

static void tokens(const ml_embedder *e, scratch *s, const layer *Ly, int n, int stage) {
    tok_job j = {e, s, Ly, n, stage};
    ml_pool_run(e->pool, n, tok_stage, &j);
}

static int layer_pass(const ml_embedder *e, scratch *s, const layer *Ly, int n) {
    int rc;
    tokens(e, s, Ly, n, ST_ATTN_NORM);
    if ((rc = linear(e, s, s->h, Ly->norm_in[P_Q], &Ly->p[P_Q], n, s->q)) ||
        (rc = linear(e, s, s->h, Ly->norm_in[P_K], &Ly->p[P_K], n, s->k)) ||
        (rc = linear(e, s, s->h, Ly->norm_in[P_V], &Ly->p[P_V], n, s->v)))
        return rc;
    tokens(e, s, Ly, n, ST_QK);
    i2s_attn att = {e->k, n, e->hd, e->n_heads, e->n_kv, Ly->sliding ? e->window : 0, e->attn_scale, s->q, s->kt, s->vh, s->att};
    i2s_attention(e->pool, &att);
    if ((rc = linear(e, s, s->att, Ly->norm_in[P_O], &Ly->p[P_O], n, s->y))) return rc;
    tokens(e, s, Ly, n, ST_ATTN_OUT);
    if ((rc = linear(e, s, s->h, Ly->norm_in[P_GATE], &Ly->p[P_GATE], n, s->g)) ||
        (rc = linear(e, s, s->h, Ly->norm_in[P_UP], &Ly->p[P_UP], n, s->u)))
        return rc;
    act_job ajob = {e, s};
    ml_pool_run(e->pool, n, act_tokens, &ajob);
    if ((rc = linear(e, s, s->g, Ly->norm_in[P_DOWN], &Ly->p[P_DOWN], n, s->y))) return rc;
    tokens(e, s, Ly, n, ST_FFN_OUT);
    return ML_OK;
}

/* ML_E_FORMAT (beyond the ABI's ML_E_ARG cases): the model's values overflowed to a non-finite
 * activation or output, which the reference refuses too (i2s.quantize_activations); out is then
 * left as it was. */
ML_API int ml_embed(ml_embedder *e, const int32_t *tokens, int32_t n, int32_t pooling, int32_t normalize, float *out) {
    if (!e || !tokens || !out || n < 1) return ML_E_ARG;
    if (pooling == ML_POOL_MODEL) pooling = e->pooling;
    if (pooling != ML_POOL_MEAN && pooling != ML_POOL_CLS && pooling != ML_POOL_LAST) return ML_E_ARG;
    for (int32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= e->vocab) return ML_E_ARG;
    scratch s;
    if (scratch_new(e, n, &s)) return ML_E_NOMEM;
    size_t D = (size_t)e->dim;
    for (int32_t t = 0; t < n; t++) {
        float *x = s.x + (size_t)t * D;
        const uint8_t *row = e->tok + (size_t)tokens[t] * D * (e->tok_f16 ? 2 : 4);
        for (size_t i = 0; i < D; i++)
            x[i] = e->tok_f16 ? ml_f16_to_f32(gguf_rd_u16(row + 2 * i)) : gguf_rd_f32(row + 4 * i);
        if (e->gemma)
            for (size_t i = 0; i < D; i++) x[i] = x[i] * e->embd_scale;
    }
    /* RoPE tables: the global base (cos0/sin0) and, for Gemma, the sliding layers' base */
    double b0 = e->n_layers ? e->layers[0].base : 10000.0, b1 = b0;
    for (int32_t l = 0; l < e->n_layers; l++) {
        if (e->layers[l].sliding) b1 = e->layers[l].base;
        else b0 = e->layers[l].base;
    }
    rope_table(n, e->hd, b0, s.cos0, s.sin0);
    rope_table(n, e->hd, b1, s.cos1, s.sin1);
    int rc = ML_OK;
    for (int32_t l = 0; l < e->n_layers && rc == ML_OK; l++) rc = layer_pass(e, &s, &e->layers[l], n);
    if (rc == ML_OK) {
        /* final norm, then pooling: mean sums the tokens in order and divides once, as NumPy */
        for (int32_t t = 0; t < n; t++) {
            if (pooling == ML_POOL_CLS && t != 0) continue;
            if (pooling == ML_POOL_LAST && t != n - 1) continue;
            rmsnorm(e, s.x + (size_t)t * D, s.x + (size_t)t * D, e->output_norm, e->dim);
        }
        float *v = s.y; /* the pooled vector, copied to out only when it is finite */
        if (pooling == ML_POOL_MEAN) {
            for (size_t i = 0; i < D; i++) v[i] = s.x[i];
            for (int32_t t = 1; t < n; t++)
                for (size_t i = 0; i < D; i++) v[i] += s.x[(size_t)t * D + i];
            for (size_t i = 0; i < D; i++) v[i] = (float)((double)v[i] / (double)n);
        } else {
            memcpy(v, s.x + (pooling == ML_POOL_CLS ? 0 : (size_t)(n - 1) * D), D * sizeof(float));
        }
        if (normalize) {
            double ss = 0;
            for (size_t i = 0; i < D; i++) ss += (double)v[i] * (double)v[i];
            double nrm = sqrt(ss);
            float dv = (float)(nrm > 1e-12 ? nrm : 1e-12);
            for (size_t i = 0; i < D; i++) v[i] = v[i] / dv;
        }
        for (size_t i = 0; i < D && rc == ML_OK; i++)
            if (!isfinite(v[i])) rc = ML_E_FORMAT;
        if (rc == ML_OK) memcpy(out, v, D * sizeof(float));
    }
    scratch_free(&s);
    return rc;
}
