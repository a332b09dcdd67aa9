/* api.c: the functions of include/mlrt.h around the loader and the forward pass: version,
 * model lifetime and the Q8_0 quantizer (the tokenizer's are in tok_load.c and tok_encode.c).
 *
 * The f16-scale quantizer below follows specs/quant.yaml q8_0 f16_scales: one float32 rounding
 * per statement (also exact on x87, where an expression keeps excess precision) and no FMA
 * (-std=c11 means -ffp-contract=off for gcc; the pragmas say so for GNU mode and clang).
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "forward.h"
#include "kernels.h"
#include "model.h"
#include "util.h"

#define F16_MAX 65504.0f

ML_API const char *ml_version(void) { return "mlrt 0.1.0"; }

/* ---------------------------------------------------------------- models */
ML_API int ml_load(const char *path, int32_t ctx, int32_t threads, ml_model **out, char *reason,
                   size_t reason_len) {
    if (out) *out = NULL;
    if (!path || !out || ctx < 0 || threads < 0) {
        ml_reason(reason, reason_len, "%s: invalid argument (path %s, out %s, ctx %d, threads %d)",
                  path ? path : "(null)", path ? "set" : "NULL", out ? "set" : "NULL", (int)ctx, (int)threads);
        return ML_E_ARG;
    }
    ml_model *m = calloc(1, sizeof *m);
    if (!m) {
        ml_reason(reason, reason_len, "%s: out of memory", path);
        return ML_E_NOMEM;
    }
    int rc = ml_model_open(path, m, reason, reason_len);
    if (rc != ML_OK) {
        free(m);
        return rc;
    }
    if ((uint32_t)ctx > m->h.max_seq) {
        ml_reason(reason, reason_len, "%s: ctx %d is above max_seq = %u", path, (int)ctx, (unsigned)m->h.max_seq);
        ml_model_close(m);
        free(m);
        return ML_E_ARG;
    }
    m->ctx = ctx ? ctx : (int32_t)m->h.max_seq;   /* max_seq <= 2^24 */
    if (!threads) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores > 0 && cores < 1024 ? (int32_t)cores : 1;
    }
    m->threads = threads;
    m->pool = ml_pool_new(threads);
    rc = m->pool ? ml_forward_init(m) : ML_E_NOMEM;
    if (rc == ML_OK) rc = ml_repack(m);
    if (rc != ML_OK) {
        ml_reason(reason, reason_len, "%s: cannot allocate the run-time state for ctx %d or the packed weights (status %d)", path,
                  (int)m->ctx, rc);
        ml_free(m);
        return rc;
    }
    *out = m;
    return ML_OK;
}

ML_API void ml_free(ml_model *m) {
    if (!m) return;
    ml_forward_free(m);
    if (m->pool) ml_pool_free(m->pool);
    ml_model_close(m);
    free(m);
}

ML_API void ml_reset(ml_model *m) {
    if (m) ml_forward_reset(m);   /* filled = 0, linear-attention state zeroed */
}

ML_API int32_t ml_vocab(const ml_model *m) { return m ? (int32_t)m->h.vocab : 0; }   /* <= 2^24 */

ML_API int32_t ml_ctx(const ml_model *m) { return m ? m->ctx : 0; }

/* ---------------------------------------------------------------- quantizer */
static float block_amax(const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* One block with f16 scales: d = f16(amax / 127), q against that rounded d. */
static uint16_t q8_0_f16_block(const float *x, int8_t *q) {
    float amax = block_amax(x);
    float d = amax < 1e-30f ? 0.0f : amax / 127.0f;
    uint16_t d16 = ml_f32_to_f16(d);
    float dd = ml_f16_to_f32(d16);
    if (dd == 0.0f) {   /* decision q8_0.f16_zero_scale: 1/d would be inf; every weight is 0 anyway */
        for (int j = 0; j < QK; j++) q[j] = 0;
        return d16;
    }
    float id = 1.0f / dd;
    for (int j = 0; j < QK; j++) {
        float v = x[j] * id;
        v = v + copysignf(0.5f, x[j]);
        v = truncf(v);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;   /* a subnormal d can push |v| past 127 */
        q[j] = (int8_t)v;
    }
    return d16;
}

ML_API int ml_quantize_q8_0(const float *x, size_t n, int f16, int8_t *q, void *d) {
    if (!x || !q || !d || n % QK) return ML_E_ARG;
    size_t nb = n / QK;
    /* Refuse before writing anything: non-finite input, or (f16) a scale above 65504. */
    for (size_t b = 0; b < nb; b++) {
        for (int j = 0; j < QK; j++)
            if (!isfinite(x[b * QK + j])) return ML_E_ARG;
        float amax = block_amax(x + b * QK);
        float scale = amax / 127.0f;
        if (f16 && scale > F16_MAX) return ML_E_ARG;   /* decision q8_0.f16_limit */
    }
    if (!f16) {   /* the kernel of the ISA in use; its n is an int, so in chunks */
        const ml_kernel_table *k = ml_kernels();
        const size_t chunk = (size_t)1 << 30;   /* a multiple of 32 below INT_MAX */
        for (size_t i = 0; i < n; i += chunk) {
            size_t len = n - i < chunk ? n - i : chunk;
            k->quantize_q8_0(x + i, (int)len, q + i, (float *)d + i / QK);
        }
        return ML_OK;
    }
    uint16_t *d16 = d;
    for (size_t b = 0; b < nb; b++) d16[b] = q8_0_f16_block(x + b * QK, q + b * QK);
    return ML_OK;
}
