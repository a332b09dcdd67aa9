/* loader.c: open, validate and map an .mlb v1 file.
 *
 * The checks are the rules of specs/mlb_errors.yaml, one `if` each, in the spec's order: the
 * first failing rule decides the status (decision loader.precedence), and the reason names the
 * file, the field and the rule id, as the reference loader (backends/reference/loader.py) does.
 * Each check reads only what the rules before it made safe to read: the header once the file
 * holds 256 bytes, the layer-flag bytes once layer_flags is 1 and the file holds them, the body
 * once its implied size fits in the file.
 *
 * The body's layout (specs/mlb_body.yaml) is written down once, in walk_layer and walk_body, and
 * used three ways: to measure the size the header implies (no memory read), to scan every Q8_0
 * quant array for -128, and to point the model's arrays into the map. Sizes are 64-bit and
 * overflow-checked, so a header implying more than 2^64 bytes (or more than size_t on 32-bit
 * targets) is a truncated body, never a wrapped size. Nothing is copied but the f16 scales,
 * converted to f32 once.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels.h"
#include "model.h"
#include "util.h"

#define HEADER_SIZE 256
#define ALIGNMENT 64
#define LINEAR_BIT 8
#define LIMIT_DIMS 65536u       /* decision limits.dims */
#define LIMIT_Q_DIM 65536u
#define LIMIT_2_24 16777216u    /* vocab, max_seq, sliding_window */

/* q8_mask bits of the matrix classes (specs/mlb_body.yaml class_bits). */
enum {
    CLS_TOK_EMB = 1, CLS_WCLS = 2, CLS_WQ = 4, CLS_WV = 8, CLS_WO = 16, CLS_W13 = 32, CLS_W2 = 64,
    CLS_SHARED_TOK_EMB = 3,     /* a shared tok_emb is Q8_0 if bit 1 or 2 is set */
};

/* ---------------------------------------------------------------- header */

static float rd_f32(const uint8_t *p) {
    uint32_t u = ml_rd_u32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void parse_header(const uint8_t *b, ml_header *h) {
    h->dim = ml_rd_u32(b + 8);
    h->n_layers = ml_rd_u32(b + 12);
    h->n_heads = ml_rd_u32(b + 16);
    h->n_kv_heads = ml_rd_u32(b + 20);
    h->hidden_dim = ml_rd_u32(b + 24);
    h->vocab = ml_rd_u32(b + 28);
    h->max_seq = ml_rd_u32(b + 32);
    h->rope_theta = rd_f32(b + 36);
    h->norm_eps = rd_f32(b + 40);
    h->wtype = ml_rd_u32(b + 44);
    h->shared_classifier = ml_rd_u32(b + 48);
    h->rope_type = ml_rd_u32(b + 52);
    h->rope_factor = rd_f32(b + 56);
    h->rope_low_freq_factor = rd_f32(b + 60);
    h->rope_high_freq_factor = rd_f32(b + 64);
    h->rope_orig_max_seq = ml_rd_u32(b + 68);
    h->q8_mask = ml_rd_u32(b + 72);
    h->qkv_bias = ml_rd_u32(b + 76);
    h->head_dim = ml_rd_u32(b + 80);
    h->qk_norm = ml_rd_u32(b + 84);
    h->rope_attn_factor = rd_f32(b + 88);
    h->sliding_window = ml_rd_u32(b + 92);
    h->layer_flags = ml_rd_u32(b + 96);
    h->rope_local_theta = rd_f32(b + 100);
    h->act = ml_rd_u32(b + 104);
    h->post_norms = ml_rd_u32(b + 108);
    h->embed_scale = rd_f32(b + 112);
    h->attn_scale = rd_f32(b + 116);
    h->scale_f16 = ml_rd_u32(b + 120);
    h->attn_softcap = rd_f32(b + 124);
    h->final_softcap = rd_f32(b + 128);
    h->rot_dim = ml_rd_u32(b + 132);
    h->attn_gate = ml_rd_u32(b + 136);
    h->lin_k_heads = ml_rd_u32(b + 140);
    h->lin_v_heads = ml_rd_u32(b + 144);
    h->lin_k_dim = ml_rd_u32(b + 148);
    h->lin_v_dim = ml_rd_u32(b + 152);
    h->lin_conv = ml_rd_u32(b + 156);
}

/* ---------------------------------------------------------------- the open file */
typedef struct {
    ml_report rep;
    const uint8_t *map;         /* the whole file, read-only */
    size_t size;
    ml_header h;
    const uint8_t *flags;       /* the layer-flag bytes, NULL without layer_flags */
    /* derived sizes (specs/mlb_header.yaml `derived`), 64-bit: a header cannot wrap them */
    uint64_t head_dim, q_dim, kv_dim, rot_dim, lin_qkv, lin_v_width;
    uint32_t n_linear;          /* layers with flag bit 3 */
    size_t n_scales;            /* f16 scales in the body (counted by the -128 scan) */
} mlb_file;

static int fmt_of(const mlb_file *f, uint32_t cls) {
    if (f->h.wtype == ML_FMT_Q8_0) return ML_FMT_Q8_0;
    return (f->h.q8_mask & cls) ? ML_FMT_Q8_0 : ML_FMT_Q4_0;
}

/* ---------------------------------------------------------------- the body layout */
typedef struct {
    const mlb_file *f;
    const uint8_t *map;         /* NULL: measure only, read nothing */
    uint64_t off;               /* offset of the next array (64-byte aligned) */
    uint64_t end;               /* end of the last array, before its (optional) padding */
    bool overflow;
    int layer;                  /* for names: the layer walked, -1 outside the layers */
    bool scan;                  /* look for -128 in Q8_0 quants */
    char bad[96];               /* the first Q8_0 array holding -128 ("" if none) */
    uint64_t bad_offset, bad_index;
    float *scales;              /* NULL, or where the f16 scales are converted to */
    size_t n_scales;            /* f16 scales walked so far */
} cursor;

/* Reserve an array of n elements of `size` bytes; returns its offset. */
static uint64_t take(cursor *c, uint64_t n, uint64_t size) {
    uint64_t off = c->off;
    c->end = ml_add_u64(off, ml_mul_u64(n, size, &c->overflow), &c->overflow);
    c->off = ml_align_u64(c->end, ALIGNMENT, &c->overflow);
    return off;
}

static const float *f32_array(cursor *c, uint64_t rows, uint64_t cols) {
    uint64_t off = take(c, ml_mul_u64(rows, cols, &c->overflow), 4);
    return c->map ? (const float *)(c->map + off) : NULL;   /* aligned: off % 64 == 0 */
}

/* A quantized matrix: its quants, then its scales. */
static void matrix(cursor *c, const char *name, uint64_t rows, uint64_t cols, int fmt, ml_matrix *out) {
    bool f16 = c->f->h.scale_f16;
    uint64_t nq = ml_mul_u64(rows, fmt == ML_FMT_Q8_0 ? cols : cols / 2, &c->overflow);
    uint64_t nd = ml_mul_u64(rows, cols / QK, &c->overflow);
    uint64_t q_off = take(c, nq, 1);
    uint64_t d_off = take(c, nd, f16 ? 2 : 4);
    if (!c->map) return;
    /* Walked with a map only after the size check: every array is inside the file, so its
     * sizes fit in size_t. */
    const uint8_t *q = c->map + q_off, *d = c->map + d_off;
    size_t first_scale = c->n_scales;
    if (f16) c->n_scales = ml_add_size(c->n_scales, (size_t)nd, &c->overflow);
    if (c->scan && fmt == ML_FMT_Q8_0 && !c->bad[0]) {
        const uint8_t *hit = memchr(q, 0x80, (size_t)nq);   /* int8 -128 */
        if (hit) {
            if (c->layer >= 0) snprintf(c->bad, sizeof c->bad, "layers.%d.%s", c->layer, name);
            else snprintf(c->bad, sizeof c->bad, "%s", name);
            c->bad_offset = q_off;
            c->bad_index = (uint64_t)(hit - q);
        }
    }
    out->fmt = fmt;
    out->rows = (int32_t)rows;   /* ml_model_open checks every dimension fits in int32 */
    out->cols = (int32_t)cols;
    out->q = q;
    if (!f16) {
        out->d = (const float *)d;
    } else if (c->scales) {      /* converted exactly, once */
        float *dst = c->scales + first_scale;
        for (size_t i = 0; i < (size_t)nd; i++) dst[i] = ml_f16_to_f32((uint16_t)(d[2 * i] | d[2 * i + 1] << 8));
        out->d = dst;
    } else {
        out->d = NULL;           /* validating only: no conversion */
    }
}

/* One layer (specs/mlb_body.yaml attention_layer or linear_layer, then ffn). */
static void walk_layer(cursor *c, uint8_t flags, ml_layer *L) {
    const mlb_file *f = c->f;
    const ml_header *h = &f->h;
    L->flags = flags;
    L->attn_norm = f32_array(c, 1, h->dim);
    if (flags & LINEAR_BIT) {
        matrix(c, "lqkv", f->lin_qkv, h->dim, fmt_of(f, CLS_WQ), &L->lqkv);
        matrix(c, "lz", f->lin_v_width, h->dim, fmt_of(f, CLS_WV), &L->lz);
        matrix(c, "lb", h->lin_v_heads, h->dim, ML_FMT_Q8_0, &L->lb);   /* always Q8_0 */
        matrix(c, "la", h->lin_v_heads, h->dim, ML_FMT_Q8_0, &L->la);
        L->lconv = f32_array(c, f->lin_qkv, h->lin_conv);
        L->dt_bias = f32_array(c, 1, h->lin_v_heads);
        L->A_log = f32_array(c, 1, h->lin_v_heads);
        L->lnorm = f32_array(c, 1, h->lin_v_dim);
        matrix(c, "lout", h->dim, f->lin_v_width, fmt_of(f, CLS_WO), &L->lout);
    } else {
        matrix(c, "wq", f->q_dim, h->dim, fmt_of(f, CLS_WQ), &L->wq);
        matrix(c, "wk", f->kv_dim, h->dim, fmt_of(f, CLS_WQ), &L->wk);
        matrix(c, "wv", f->kv_dim, h->dim, fmt_of(f, CLS_WV), &L->wv);
        matrix(c, "wo", h->dim, f->q_dim, fmt_of(f, CLS_WO), &L->wo);
        if (h->attn_gate) matrix(c, "wg", f->q_dim, h->dim, fmt_of(f, CLS_WQ), &L->wg);
        if (h->qkv_bias) {
            L->bq = f32_array(c, 1, f->q_dim);
            L->bk = f32_array(c, 1, f->kv_dim);
            L->bv = f32_array(c, 1, f->kv_dim);
        }
        if (h->qk_norm) {
            L->q_norm = f32_array(c, 1, f->head_dim);
            L->k_norm = f32_array(c, 1, f->head_dim);
        }
    }
    L->ffn_norm = f32_array(c, 1, h->dim);
    matrix(c, "w1", h->hidden_dim, h->dim, fmt_of(f, CLS_W13), &L->w1);
    matrix(c, "w2", h->dim, h->hidden_dim, fmt_of(f, CLS_W2), &L->w2);
    matrix(c, "w3", h->hidden_dim, h->dim, fmt_of(f, CLS_W13), &L->w3);
    if (h->post_norms) {
        L->post_attn_norm = f32_array(c, 1, h->dim);
        L->post_ffn_norm = f32_array(c, 1, h->dim);
    }
}

static void walk_head(cursor *c, ml_model *m) {
    const ml_header *h = &c->f->h;
    c->off = HEADER_SIZE;
    c->layer = -1;
    if (h->layer_flags) take(c, h->n_layers, 1);
    matrix(c, "tok_emb", h->vocab, h->dim,
           fmt_of(c->f, h->shared_classifier ? CLS_SHARED_TOK_EMB : CLS_TOK_EMB), &m->tok_emb);
}

static void walk_tail(cursor *c, ml_model *m) {
    const ml_header *h = &c->f->h;
    c->layer = -1;
    m->final_norm = f32_array(c, 1, h->dim);
    if (h->shared_classifier) m->wcls = m->tok_emb;
    else matrix(c, "wcls", h->vocab, h->dim, fmt_of(c->f, CLS_WCLS), &m->wcls);
}

/* Every array in file order; `layers` NULL: one scratch layer (scan or count only). */
static void walk_body(cursor *c, ml_model *m, ml_layer *layers) {
    ml_layer scratch = {0};
    walk_head(c, m);
    for (uint32_t i = 0; i < c->f->h.n_layers; i++) {
        c->layer = (int)i;
        uint8_t flags = c->f->flags ? c->f->flags[i] : 0;
        walk_layer(c, flags, layers ? &layers[i] : &scratch);
    }
    walk_tail(c, m);
}

/* Bytes the file must hold: the end of the last array. Measured per layer kind, so a header
 * claiming 65536 layers costs two layer walks; *overflow when it exceeds 2^64. */
static uint64_t required_size(const mlb_file *f, bool *overflow) {
    ml_model scratch_model = {0};
    ml_layer scratch_layer = {0};
    cursor c = {.f = f};
    walk_head(&c, &scratch_model);
    uint32_t kinds[2] = {f->h.n_layers - f->n_linear, f->n_linear};   /* attention, linear */
    for (int linear = 0; linear < 2; linear++) {
        if (!kinds[linear]) continue;   /* an unused kind's sizes may not even fit */
        cursor one = {.f = f};
        walk_layer(&one, linear ? LINEAR_BIT : 0, &scratch_layer);
        c.overflow |= one.overflow;
        c.off = ml_add_u64(c.off, ml_mul_u64(kinds[linear], one.off, &c.overflow), &c.overflow);
    }
    walk_tail(&c, &scratch_model);
    *overflow = c.overflow;
    return c.end;
}

/* ---------------------------------------------------------------- open and map */
static int open_file(mlb_file *f) {
    const ml_report *r = &f->rep;
    int fd;
    struct stat st;
    int rc = ml_open_regular(r, &fd, &st);
    if (rc != ML_OK) return rc;
    /* Empty and short files are refused before mmap (which cannot map 0 bytes). */
    if (st.st_size == 0) {
        close(fd);
        return ml_fail(r, ML_E_FORMAT, "format.empty", "the file is empty");
    }
    if (st.st_size < HEADER_SIZE) {
        close(fd);
        return ml_fail(r, ML_E_FORMAT, "format.short_header",
                    "the file has %lld bytes, shorter than the 256-byte header", (long long)st.st_size);
    }
    bool too_big = false;
    size_t size = ml_size_of_u64((uint64_t)st.st_size, &too_big);
    void *map = too_big ? MAP_FAILED : mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = too_big ? ENOMEM : errno;
    close(fd);
    if (map == MAP_FAILED)
        return ml_fail(r, e == ENOMEM ? ML_E_NOMEM : ML_E_IO, "io.open", "cannot map %lld bytes: %s",
                    (long long)st.st_size, strerror(e));
    f->map = map;
    f->size = size;
    return ML_OK;
}

static void unmap_file(mlb_file *f) {
    if (f->map) munmap((void *)f->map, f->size);
    f->map = NULL;
}

/* ---------------------------------------------------------------- the rules, in order */
#define FIELD_U(name, off) "header field " #name " (offset " #off ") = %" PRIu32
#define FIELD_F(name, off) "header field " #name " (offset " #off ") = %.9g"

/* The Krafla version files are read as (ml_set_target_version); the numbers are
 * specs/mlb_header.yaml's `since` (tests/test_versions.py compares this loader with the spec's
 * expectations at every version). */
#define KRAFLA(a, b, c) (((uint64_t)(a) << 32) | ((uint64_t)(b) << 16) | (uint64_t)(c))
static uint64_t target_version = UINT64_MAX;   /* the newest */
static char target_text[24] = "";

ML_API int ml_set_target_version(uint32_t major, uint32_t minor, uint32_t patch) {
    if (major > 0xFFFF || minor > 0xFFFF || patch > 0xFFFF) return ML_E_ARG;
    target_version = KRAFLA(major, minor, patch);
    snprintf(target_text, sizeof target_text, "%u.%u.%u", (unsigned)major, (unsigned)minor, (unsigned)patch);
    return ML_OK;
}

static bool finite_positive(float v) { return isfinite(v) && v > 0; }
static bool finite_nonneg(float v) { return isfinite(v) && v >= 0; }   /* -0.0 >= 0 */

static int check_header_format(const mlb_file *f) {
    const ml_report *r = &f->rep;
    const uint8_t *b = f->map;
    const ml_header *h = &f->h;
    const int F = ML_E_FORMAT;
    if (memcmp(b, "MLB1", 4) != 0)
        return ml_fail(r, F, "format.magic", "magic is %02x %02x %02x %02x, expected \"MLB1\"", b[0], b[1], b[2], b[3]);
    uint32_t version = ml_rd_u32(b + 4);
    if (version != 1)
        return ml_fail(r, F, "format.version", FIELD_U(version, 4) ", only version 1 is defined", version);
    if (target_version < KRAFLA(0, 9, 0))   /* offsets 132..159 came with 0.9.0: padding before */
        for (int i = 132; i < 160; i++)
            if (b[i]) return ml_fail(r, F, "format.padding", "header byte %d is 0x%02x: offsets 132..159 need Krafla "
                                     "0.9.0, the target is %s, so they are padding and must be zero", i, b[i], target_text);
    for (int i = 160; i < HEADER_SIZE; i++)
        if (b[i]) return ml_fail(r, F, "format.padding", "header byte %d is 0x%02x; bytes 160..255 must be zero", i, b[i]);
    if (h->wtype != ML_FMT_Q8_0 && h->wtype != ML_FMT_Q4_0)
        return ml_fail(r, F, "format.wtype", FIELD_U(wtype, 44) " is not 1 (Q8_0) or 2 (Q4_0)", h->wtype);
    if (h->wtype == ML_FMT_Q8_0 && h->q8_mask)
        return ml_fail(r, F, "format.q8_mask.q8_model", FIELD_U(q8_mask, 72) " on a Q8_0 model; it must be 0", h->q8_mask);
    if (h->q8_mask & ~0x7Fu)
        return ml_fail(r, F, "format.q8_mask.unknown_bits", FIELD_U(q8_mask, 72) " sets bits above 0..6", h->q8_mask);
    if (!finite_positive(h->rope_theta))
        return ml_fail(r, F, "format.rope_theta", FIELD_F(rope_theta, 36) " must be finite and > 0", h->rope_theta);
    if (!finite_nonneg(h->norm_eps))
        return ml_fail(r, F, "format.norm_eps", FIELD_F(norm_eps, 40) " must be finite and >= 0", h->norm_eps);
    if (h->rope_type > 3)
        return ml_fail(r, F, "format.rope_type", FIELD_U(rope_type, 52) " is not 0..3", h->rope_type);
    if (h->rope_type == 1) {   /* llama3 */
        if (!finite_positive(h->rope_factor))
            return ml_fail(r, F, "format.llama3.factor", FIELD_F(rope_factor, 56) ": llama3 needs > 0", h->rope_factor);
        if (!finite_positive(h->rope_low_freq_factor))
            return ml_fail(r, F, "format.llama3.low_freq_factor", FIELD_F(rope_low_freq_factor, 60) ": llama3 needs > 0",
                        h->rope_low_freq_factor);
        if (!(isfinite(h->rope_high_freq_factor) && h->rope_high_freq_factor > h->rope_low_freq_factor))
            return ml_fail(r, F, "format.llama3.high_freq_factor",
                        FIELD_F(rope_high_freq_factor, 64) ": llama3 needs a finite value > rope_low_freq_factor",
                        h->rope_high_freq_factor);
        if (!h->rope_orig_max_seq)
            return ml_fail(r, F, "format.llama3.orig_max_seq", FIELD_U(rope_orig_max_seq, 68) ": llama3 needs > 0",
                        h->rope_orig_max_seq);
    }
    if (h->rope_type == 2 && !finite_positive(h->rope_factor))
        return ml_fail(r, F, "format.linear.factor", FIELD_F(rope_factor, 56) ": linear needs > 0", h->rope_factor);
    if (h->rope_type == 3) {   /* yarn: low = beta_fast, high = beta_slow */
        if (!finite_positive(h->rope_factor))
            return ml_fail(r, F, "format.yarn.factor", FIELD_F(rope_factor, 56) ": yarn needs > 0", h->rope_factor);
        if (!finite_positive(h->rope_high_freq_factor))
            return ml_fail(r, F, "format.yarn.beta_slow", FIELD_F(rope_high_freq_factor, 64) ": yarn needs beta_slow > 0",
                        h->rope_high_freq_factor);
        if (!(isfinite(h->rope_low_freq_factor) && h->rope_high_freq_factor < h->rope_low_freq_factor))
            return ml_fail(r, F, "format.yarn.beta_order",
                        FIELD_F(rope_low_freq_factor, 60) ": yarn needs a finite beta_fast > beta_slow",
                        h->rope_low_freq_factor);
        if (!h->rope_orig_max_seq)
            return ml_fail(r, F, "format.yarn.orig_max_seq", FIELD_U(rope_orig_max_seq, 68) ": yarn needs > 0",
                        h->rope_orig_max_seq);
        if (!finite_positive(h->rope_attn_factor))
            return ml_fail(r, F, "format.yarn.attn_factor", FIELD_F(rope_attn_factor, 88) ": yarn needs > 0",
                        h->rope_attn_factor);
    }
    if (h->rope_type != 3 && h->rope_attn_factor != 0)   /* NaN != 0 too */
        return ml_fail(r, F, "format.rope_attn_factor_without_yarn", FIELD_F(rope_attn_factor, 88) " without yarn",
                    h->rope_attn_factor);
    if (h->qkv_bias > 1) return ml_fail(r, F, "format.bool.qkv_bias", FIELD_U(qkv_bias, 76) " must be 0 or 1", h->qkv_bias);
    if (h->qk_norm > 1) return ml_fail(r, F, "format.bool.qk_norm", FIELD_U(qk_norm, 84) " must be 0 or 1", h->qk_norm);
    if (h->layer_flags > 1)
        return ml_fail(r, F, "format.bool.layer_flags", FIELD_U(layer_flags, 96) " must be 0 or 1", h->layer_flags);
    if (h->post_norms > 1)
        return ml_fail(r, F, "format.bool.post_norms", FIELD_U(post_norms, 108) " must be 0 or 1", h->post_norms);
    if (h->scale_f16 > 1)
        return ml_fail(r, F, "format.bool.scale_f16", FIELD_U(scale_f16, 120) " must be 0 or 1", h->scale_f16);
    if (h->attn_gate > 1)
        return ml_fail(r, F, "format.bool.attn_gate", FIELD_U(attn_gate, 136) " must be 0 or 1", h->attn_gate);
    if (h->act > 1) return ml_fail(r, F, "format.act", FIELD_U(act, 104) " is not 0 (SiLU) or 1 (GELU tanh)", h->act);
    if (!finite_nonneg(h->embed_scale))
        return ml_fail(r, F, "format.embed_scale", FIELD_F(embed_scale, 112) " must be finite and >= 0", h->embed_scale);
    if (!finite_nonneg(h->attn_scale))
        return ml_fail(r, F, "format.attn_scale", FIELD_F(attn_scale, 116) " must be finite and >= 0", h->attn_scale);
    if (!finite_nonneg(h->attn_softcap))
        return ml_fail(r, F, "format.attn_softcap", FIELD_F(attn_softcap, 124) " must be finite and >= 0", h->attn_softcap);
    if (!finite_nonneg(h->final_softcap))
        return ml_fail(r, F, "format.final_softcap", FIELD_F(final_softcap, 128) " must be finite and >= 0",
                    h->final_softcap);
    if (!finite_nonneg(h->rope_local_theta))
        return ml_fail(r, F, "format.rope_local_theta", FIELD_F(rope_local_theta, 100) " must be finite and >= 0",
                    h->rope_local_theta);
    if (h->sliding_window > LIMIT_2_24)
        return ml_fail(r, F, "format.sliding_window", FIELD_U(sliding_window, 92) " is above 2^24", h->sliding_window);
    return ML_OK;
}

static int check_header_shape(mlb_file *f) {
    const ml_report *r = &f->rep;
    const ml_header *h = &f->h;
    const int S = ML_E_SHAPE;
    const struct { const char *rule, *what; uint32_t v; } nonzero[] = {
        {"shape.zero.dim", "dim (offset 8)", h->dim},
        {"shape.zero.n_layers", "n_layers (offset 12)", h->n_layers},
        {"shape.zero.n_heads", "n_heads (offset 16)", h->n_heads},
        {"shape.zero.n_kv_heads", "n_kv_heads (offset 20)", h->n_kv_heads},
        {"shape.zero.hidden_dim", "hidden_dim (offset 24)", h->hidden_dim},
        {"shape.zero.max_seq", "max_seq (offset 32)", h->max_seq},
    };
    for (size_t i = 0; i < sizeof nonzero / sizeof nonzero[0]; i++)
        if (!nonzero[i].v) return ml_fail(r, S, nonzero[i].rule, "header field %s must not be zero", nonzero[i].what);
    const struct { const char *rule, *what; uint32_t v, limit; } limits[] = {
        {"shape.limit.dim", "dim (offset 8)", h->dim, LIMIT_DIMS},
        {"shape.limit.n_layers", "n_layers (offset 12)", h->n_layers, LIMIT_DIMS},
        {"shape.limit.n_heads", "n_heads (offset 16)", h->n_heads, LIMIT_DIMS},
        {"shape.limit.n_kv_heads", "n_kv_heads (offset 20)", h->n_kv_heads, LIMIT_DIMS},
        {"shape.limit.hidden_dim", "hidden_dim (offset 24)", h->hidden_dim, LIMIT_DIMS},
        {"shape.limit.vocab", "vocab (offset 28)", h->vocab, LIMIT_2_24},
        {"shape.limit.max_seq", "max_seq (offset 32)", h->max_seq, LIMIT_2_24},
    };
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
        if (limits[i].v > limits[i].limit)
            return ml_fail(r, S, limits[i].rule, "header field %s = %" PRIu32 " is above the limit %" PRIu32,
                        limits[i].what, limits[i].v, limits[i].limit);
    if (h->dim % 32) return ml_fail(r, S, "shape.dim_multiple_32", FIELD_U(dim, 8) " is not a multiple of 32", h->dim);
    if (h->hidden_dim % 32)
        return ml_fail(r, S, "shape.hidden_multiple_32", FIELD_U(hidden_dim, 24) " is not a multiple of 32", h->hidden_dim);
    if (!h->head_dim && h->dim % h->n_heads)
        return ml_fail(r, S, "shape.heads_divide_dim", FIELD_U(n_heads, 16) " does not divide dim and head_dim is 0",
                    h->n_heads);
    if (h->n_heads % h->n_kv_heads)
        return ml_fail(r, S, "shape.kv_divide_heads", FIELD_U(n_kv_heads, 20) " does not divide n_heads", h->n_kv_heads);
    /* head_dim <= 2^32 - 1 and n_heads <= 2^16: the products fit in 64 bits. */
    f->head_dim = h->head_dim ? h->head_dim : h->dim / h->n_heads;
    f->q_dim = f->head_dim * h->n_heads;
    f->kv_dim = f->head_dim * h->n_kv_heads;
    f->rot_dim = h->rot_dim ? h->rot_dim : f->head_dim;
    if (f->head_dim % 2)
        return ml_fail(r, S, "shape.odd_head_dim", "head_dim = %" PRIu64 " (%s) is odd", f->head_dim,
                    h->head_dim ? "header field head_dim (offset 80)" : "dim / n_heads");
    if (f->q_dim % 32)
        return ml_fail(r, S, "shape.q_dim_multiple_32", "q_dim = head_dim x n_heads = %" PRIu64 " is not a multiple of 32",
                    f->q_dim);
    if (f->q_dim > LIMIT_Q_DIM)
        return ml_fail(r, S, "shape.q_dim_limit", "q_dim = head_dim x n_heads = %" PRIu64 " is above 65536", f->q_dim);
    if (h->vocab < 3)
        return ml_fail(r, S, "shape.vocab_min", FIELD_U(vocab, 28) " is below 3 (ids 1 and 2 are BOS and EOS)", h->vocab);
    if (h->rot_dim % 2 || h->rot_dim > f->head_dim)
        return ml_fail(r, S, "shape.rot_dim", FIELD_U(rot_dim, 132) " must be even and at most head_dim = %" PRIu64,
                    h->rot_dim, f->head_dim);
    return ML_OK;
}

/* The layer-flag rules; each looks at every layer before the next rule runs. */
static int check_flags(mlb_file *f) {
    const ml_report *r = &f->rep;
    const ml_header *h = &f->h;
    if (!h->layer_flags) return ML_OK;
    if (f->size < (uint64_t)HEADER_SIZE + h->n_layers) return ML_OK;   /* cut: a truncated body, below */
    f->flags = f->map + HEADER_SIZE;
    const uint8_t *fl = f->flags;
    uint32_t n = h->n_layers;
    /* bit 2 came with Krafla 0.8.0, bit 3 with 0.9.0: unknown bits before */
    uint8_t unknown = 0xF0 | (target_version < KRAFLA(0, 9, 0) ? 8 : 0) | (target_version < KRAFLA(0, 8, 0) ? 4 : 0);
    for (uint32_t i = 0; i < n; i++)
        if (fl[i] & unknown)
            return ml_fail(r, ML_E_FORMAT, "format.layer.unknown_bits",
                        "layer flag byte of layer %" PRIu32 " (offset %" PRIu32 ") = 0x%02x: bits 4..7 must be 0%s%s",
                        i, HEADER_SIZE + i, fl[i], unknown & 0x0F ? " and bits 2..3 need Krafla 0.8.0 and 0.9.0; the target is " : "",
                        unknown & 0x0F ? target_text : "");
    for (uint32_t i = 0; i < n; i++)
        if ((fl[i] & 6) == 6)
            return ml_fail(r, ML_E_FORMAT, "format.layer.local_and_norope",
                        "layer flag byte of layer %" PRIu32 " = 0x%02x: bit 1 (local RoPE base) and bit 2 (no RoPE) "
                        "cannot be combined", i, fl[i]);
    for (uint32_t i = 0; i < n; i++)
        if ((fl[i] & LINEAR_BIT) && fl[i] != LINEAR_BIT)
            return ml_fail(r, ML_E_FORMAT, "format.layer.linear_not_alone",
                        "layer flag byte of layer %" PRIu32 " = 0x%02x: bit 3 (linear attention) must be alone", i, fl[i]);
    if (h->rope_local_theta == 0)
        for (uint32_t i = 0; i < n; i++)
            if (fl[i] & 2)
                return ml_fail(r, ML_E_FORMAT, "format.layer.local_without_theta",
                            "layer flag byte of layer %" PRIu32 " = 0x%02x: a local-RoPE layer needs rope_local_theta > 0,"
                            " header field rope_local_theta (offset 100) is 0", i, fl[i]);
    for (uint32_t i = 0; i < n; i++) f->n_linear += (fl[i] & LINEAR_BIT) != 0;
    return ML_OK;
}

/* decision header.linear: the lin_* fields are checked only when a layer has flag bit 3. */
static int check_linear(mlb_file *f) {
    const ml_report *r = &f->rep;
    const ml_header *h = &f->h;
    const int S = ML_E_SHAPE;
    if (!f->n_linear) return ML_OK;
    if (!h->lin_k_heads) return ml_fail(r, S, "shape.linear.k_heads", FIELD_U(lin_k_heads, 140) " must be > 0", h->lin_k_heads);
    if (!h->lin_v_heads) return ml_fail(r, S, "shape.linear.v_heads", FIELD_U(lin_v_heads, 144) " must be > 0", h->lin_v_heads);
    if (h->lin_v_heads % 4 || h->lin_v_heads % h->lin_k_heads)
        return ml_fail(r, S, "shape.linear.v_heads_multiple",
                    FIELD_U(lin_v_heads, 144) " must be a multiple of 4 and of lin_k_heads", h->lin_v_heads);
    if (!h->lin_k_dim) return ml_fail(r, S, "shape.linear.k_dim", FIELD_U(lin_k_dim, 148) " must be > 0", h->lin_k_dim);
    if (!h->lin_v_dim) return ml_fail(r, S, "shape.linear.v_dim", FIELD_U(lin_v_dim, 152) " must be > 0", h->lin_v_dim);
    f->lin_v_width = (uint64_t)h->lin_v_heads * h->lin_v_dim;   /* two u32: fits */
    if (f->lin_v_width % 32)
        return ml_fail(r, S, "shape.linear.v_width_multiple_32",
                    FIELD_U(lin_v_dim, 152) ": lin_v_heads x lin_v_dim must be a multiple of 32", h->lin_v_dim);
    if (!h->lin_conv) return ml_fail(r, S, "shape.linear.conv", FIELD_U(lin_conv, 156) " must be > 0", h->lin_conv);
    return ML_OK;
}

static int check_body(mlb_file *f) {
    const ml_report *r = &f->rep;
    const ml_header *h = &f->h;
    if (h->layer_flags && !f->flags)
        return ml_fail(r, ML_E_FORMAT, "format.truncated_body",
                    "the file has %zu bytes; the %" PRIu32 " layer-flag bytes end at %" PRIu64,
                    f->size, h->n_layers, (uint64_t)HEADER_SIZE + h->n_layers);
    if (f->n_linear) {   /* 2 K dk + V dv: up to 2^66, so checked (a layer larger than any file) */
        bool overflow = false;
        f->lin_qkv = ml_add_u64(ml_mul_u64(2 * (uint64_t)h->lin_k_heads, h->lin_k_dim, &overflow),
                                f->lin_v_width, &overflow);
        if (overflow)
            return ml_fail(r, ML_E_FORMAT, "format.truncated_body",
                        "the file has %zu bytes; the lqkv rows of the header (2 x lin_k_heads x lin_k_dim + "
                        "lin_v_heads x lin_v_dim) exceed 2^64", f->size);
    }
    bool overflow = false;
    uint64_t need = required_size(f, &overflow);
    if (overflow)
        return ml_fail(r, ML_E_FORMAT, "format.truncated_body",
                    "the file has %zu bytes; the header implies more than 2^64", f->size);
    if (f->size < need)
        return ml_fail(r, ML_E_FORMAT, "format.truncated_body",
                    "the file has %zu bytes; the header implies %" PRIu64, f->size, need);
    /* Every array is inside the file now: scan the Q8_0 quants (and count the f16 scales). */
    ml_model scratch = {0};
    cursor c = {.f = f, .map = f->map, .scan = true};
    walk_body(&c, &scratch, NULL);
    if (c.overflow)   /* cannot happen once need <= size; kept as a guard */
        return ml_fail(r, ML_E_FORMAT, "format.truncated_body", "the body's offsets overflow");
    f->n_scales = c.n_scales;
    if (c.bad[0])
        return ml_fail(r, ML_E_FORMAT, "format.q8_minus128",
                    "array %s (Q8_0 quants at offset %" PRIu64 ") has -128 at element %" PRIu64
                    "; quants must be in [-127, 127]", c.bad, c.bad_offset, c.bad_index);
    return ML_OK;
}

/* Open, map and run every rule. On ML_OK the file stays mapped (unmap_file). */
static int validate(mlb_file *f) {
    int rc = open_file(f);
    if (rc != ML_OK) return rc;
    parse_header(f->map, &f->h);
    if ((rc = check_header_format(f)) != ML_OK || (rc = check_header_shape(f)) != ML_OK ||
        (rc = check_flags(f)) != ML_OK || (rc = check_linear(f)) != ML_OK || (rc = check_body(f)) != ML_OK) {
        unmap_file(f);
        return rc;
    }
    return ML_OK;
}

/* ---------------------------------------------------------------- public */
ML_API int ml_check_rule(const char *path, char *rule, size_t rule_len, char *reason, size_t reason_len) {
    mlb_file f = {.rep = {path ? path : "(null)", reason, reason_len, rule, rule_len}};
    ml_reason(rule, rule_len, "%s", "");
    if (!path) return ml_fail(&f.rep, ML_E_ARG, "io.open", "no path");
    int rc = validate(&f);
    if (rc == ML_OK) {
        ml_reason(reason, reason_len, "%s: accepted", path);
        unmap_file(&f);
    }
    return rc;
}

ML_API int ml_check(const char *path, char *reason, size_t reason_len) {
    return ml_check_rule(path, NULL, 0, reason, reason_len);
}

int ml_model_open(const char *path, struct ml_model *m, char *reason, size_t reason_len) {
    memset(m, 0, sizeof *m);
    mlb_file f = {.rep = {path ? path : "(null)", reason, reason_len, NULL, 0}};
    if (!path) return ml_fail(&f.rep, ML_E_ARG, "io.open", "no path");
    int rc = validate(&f);
    if (rc != ML_OK) return rc;
    m->h = f.h;
    m->map = f.map;
    m->map_size = f.size;
    /* A valid file bounds the linear-attention widths only by its size: this runtime keeps
     * dimensions in int32 (every other one is at most 2^24 by the rules). */
    if (f.n_linear && (f.lin_qkv > INT32_MAX || f.lin_v_width > INT32_MAX || f.h.lin_conv > INT32_MAX)) {
        ml_model_close(m);
        return ml_fail(&f.rep, ML_E_UNSUPPORTED, "runtime.int32",
                    "linear-attention widths above 2^31 - 1 (lqkv rows %" PRIu64 ", lin_conv %" PRIu32 ")",
                    f.lin_qkv, f.h.lin_conv);
    }
    m->head_dim = (int32_t)f.head_dim;   /* q_dim <= 65536 bounds head_dim, kv_dim, rot_dim */
    m->q_dim = (int32_t)f.q_dim;
    m->kv_dim = (int32_t)f.kv_dim;
    m->rot_dim = (int32_t)f.rot_dim;
    m->lin_qkv = f.n_linear ? (int32_t)f.lin_qkv : 0;   /* unused (and unchecked) without linear layers */
    m->lin_v_width = f.n_linear ? (int32_t)f.lin_v_width : 0;
    bool overflow = false;
    size_t scale_bytes = ml_mul_size(f.n_scales, sizeof(float), &overflow);
    m->layers = calloc(f.h.n_layers, sizeof *m->layers);
    if (f.h.scale_f16 && !overflow) m->f16_scales = malloc(scale_bytes ? scale_bytes : 1);
    if (!m->layers || (f.h.scale_f16 && !m->f16_scales)) {
        ml_model_close(m);
        return ml_fail(&f.rep, ML_E_NOMEM, "runtime.nomem", "cannot allocate %" PRIu32 " layers and %zu f16 scales",
                    f.h.n_layers, f.n_scales);
    }
    cursor c = {.f = &f, .map = f.map, .scales = m->f16_scales};
    walk_body(&c, m, m->layers);
    ml_reason(reason, reason_len, "%s: accepted", path);
    return ML_OK;
}

void ml_model_close(struct ml_model *m) {
    if (m->map) munmap((void *)m->map, m->map_size);
    free(m->layers);
    free(m->f16_scales);
    free(m->packed);
    m->packed = NULL;
    m->map = NULL;
    m->map_size = 0;
    m->layers = NULL;
    m->f16_scales = NULL;
}
