/* loader_plan.c: test hooks over the loader's internals for tests/test_native_loader.py.
 *
 * Compiled with src/loader.c and src/f16.c (nothing else) into a test-only library, so the model
 * struct and the hidden f16 helpers can be inspected from Python: plan_dump writes every array of
 * a loaded model as "NAME FMT ROWS COLS WHERE" lines, WHERE being the byte offset of its pointer
 * in the map, or "S<i>" for the i-th converted f16 scale. The test compares them with
 * mlconf.backends.reference.layout.plan().
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "model.h"

typedef struct {
    char *buf;
    size_t cap, len;
    const ml_model *m;
    int layer;
    size_t n_scales;   /* scales of the matrices dumped so far */
} dump;

__attribute__((format(printf, 2, 3)))
static void emit(dump *o, const char *fmt, ...) {
    if (o->len >= o->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n;
}

static void name(dump *o, char *out, size_t cap, const char *base) {
    if (o->layer >= 0) snprintf(out, cap, "layers.%d.%s", o->layer, base);
    else snprintf(out, cap, "%s", base);
}

static void f32(dump *o, const char *base, const float *p) {
    char n[64];
    name(o, n, sizeof n, base);
    emit(o, "%s F32 0 0 %td\n", n, (const uint8_t *)p - o->m->map);
}

static void mat(dump *o, const char *base, const ml_matrix *x) {
    char n[64];
    const char *fmt = x->fmt == ML_FMT_Q8_0 ? "Q8_0" : x->fmt == ML_FMT_Q4_0 ? "Q4_0" : "?";
    name(o, n, sizeof n, base);
    emit(o, "%s.q %s %d %d %td\n", n, fmt, (int)x->rows, (int)x->cols, (const uint8_t *)x->q - o->m->map);
    o->n_scales += (size_t)x->rows * (size_t)(x->cols / QK);
    if (o->m->f16_scales) emit(o, "%s.d %s %d %d S%td\n", n, fmt, (int)x->rows, (int)x->cols, x->d - o->m->f16_scales);
    else emit(o, "%s.d %s %d %d %td\n", n, fmt, (int)x->rows, (int)x->cols, (const uint8_t *)x->d - o->m->map);
}

/* Load `path` and dump its plan; the converted f16 scales go to scales (up to scales_cap). */
__attribute__((visibility("default")))
int plan_dump(const char *path, char *buf, size_t cap, float *scales, size_t scales_cap, size_t *n_scales) {
    ml_model m;
    int rc = ml_model_open(path, &m, NULL, 0);
    if (rc != ML_OK) return rc;
    dump o = {buf, cap, 0, &m, -1, 0};
    const ml_header *h = &m.h;
    emit(&o, "derived %d %d %d %d %d %d\n", (int)m.head_dim, (int)m.q_dim, (int)m.kv_dim, (int)m.rot_dim,
         (int)m.lin_qkv, (int)m.lin_v_width);
    mat(&o, "tok_emb", &m.tok_emb);
    for (uint32_t i = 0; i < h->n_layers; i++) {
        const ml_layer *L = &m.layers[i];
        o.layer = (int)i;
        emit(&o, "layers.%u.flags %u\n", (unsigned)i, (unsigned)L->flags);
        f32(&o, "attn_norm", L->attn_norm);
        if (L->flags & 8) {
            mat(&o, "lqkv", &L->lqkv);
            mat(&o, "lz", &L->lz);
            mat(&o, "lb", &L->lb);
            mat(&o, "la", &L->la);
            f32(&o, "lconv", L->lconv);
            f32(&o, "dt_bias", L->dt_bias);
            f32(&o, "A_log", L->A_log);
            f32(&o, "lnorm", L->lnorm);
            mat(&o, "lout", &L->lout);
        } else {
            mat(&o, "wq", &L->wq);
            mat(&o, "wk", &L->wk);
            mat(&o, "wv", &L->wv);
            mat(&o, "wo", &L->wo);
            if (h->attn_gate) mat(&o, "wg", &L->wg);
            if (h->qkv_bias) {
                f32(&o, "bq", L->bq);
                f32(&o, "bk", L->bk);
                f32(&o, "bv", L->bv);
            }
            if (h->qk_norm) {
                f32(&o, "q_norm", L->q_norm);
                f32(&o, "k_norm", L->k_norm);
            }
        }
        f32(&o, "ffn_norm", L->ffn_norm);
        mat(&o, "w1", &L->w1);
        mat(&o, "w2", &L->w2);
        mat(&o, "w3", &L->w3);
        if (h->post_norms) {
            f32(&o, "post_attn_norm", L->post_attn_norm);
            f32(&o, "post_ffn_norm", L->post_ffn_norm);
        }
    }
    o.layer = -1;
    f32(&o, "final_norm", m.final_norm);
    if (!h->shared_classifier) mat(&o, "wcls", &m.wcls);
    else emit(&o, "wcls shared %d\n", memcmp(&m.wcls, &m.tok_emb, sizeof m.wcls) == 0);
    /* the f16 buffer holds the scales of every matrix dumped (the S<i> say where each starts) */
    size_t n = m.f16_scales ? o.n_scales : 0;
    if (n) memcpy(scales, m.f16_scales, (n < scales_cap ? n : scales_cap) * sizeof(float));
    *n_scales = n;
    ml_model_close(&m);
    return o.len < cap ? ML_OK : ML_E_NOMEM;
}

__attribute__((visibility("default")))
void plan_f16_to_f32(const uint16_t *h, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = ml_f16_to_f32(h[i]);
}

__attribute__((visibility("default")))
void plan_f32_to_f16(const float *f, uint16_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = ml_f32_to_f16(f[i]);
}
