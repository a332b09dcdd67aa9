/* broken_mlrt.c: libmlrt.so with four planted mistakes, for tests/test_replay.py. Linked against
 * libmlrt.so, it overrides four functions of the ABI and calls the real ones (dlsym RTLD_NEXT):
 *   ml_check          answers ML_OK where the real one says ML_E_SHAPE (ml_check_rule too)
 *   ml_quantize_q8_0  sets the lowest bit of the first quant of every block
 *   ml_tok_encode     drops the last id of texts of more than three
 *   ml_forward        multiplies the logits by 1.02 (outside the runtime tolerance, inside the oracle's)
 * and one variant it does not do, as a runtime without f16 scales for Q4_0 would say:
 *   ml_quantize_q4_0  ML_E_UNSUPPORTED with f16 scales, on every input (refused ones included)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

#include "mlrt.h"

#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

int ml_check(const char *path, char *reason, size_t reason_len) {
    int st = REAL(ml_check)(path, reason, reason_len);
    return st == ML_E_SHAPE ? ML_OK : st;
}

int ml_check_rule(const char *path, char *rule, size_t rule_len, char *reason, size_t reason_len) {
    int st = REAL(ml_check_rule)(path, rule, rule_len, reason, reason_len);
    if (st == ML_E_SHAPE && rule_len) rule[0] = 0;
    return st == ML_E_SHAPE ? ML_OK : st;
}

int ml_quantize_q8_0(const float *x, size_t n, int f16, int8_t *q, void *d) {
    int st = REAL(ml_quantize_q8_0)(x, n, f16, q, d);
    if (st == ML_OK)
        for (size_t b = 0; b < n; b += 32) q[b] |= 1;
    return st;
}

int ml_tok_encode(const ml_tokenizer *t, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n_out) {
    int st = REAL(ml_tok_encode)(t, text, len, ids, cap, n_out);
    if (st == ML_OK && *n_out > 3) *n_out -= 1;
    return st;
}

int ml_forward(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits) {
    int st = REAL(ml_forward)(m, tokens, n, pos, logits);
    if (st == ML_OK)
        for (int64_t i = 0; i < (int64_t)n * ml_vocab(m); i++) logits[i] *= 1.02f;
    return st;
}

int ml_quantize_q4_0(const float *x, size_t rows, size_t cols, int rule, int f16, const float *importance,
                     uint8_t *qs, void *d) {
    if (f16) return ML_E_UNSUPPORTED;
    return REAL(ml_quantize_q4_0)(x, rows, cols, rule, f16, importance, qs, d);
}
