/* mlrt.h: the C ABI of an MLB v1 / MLT runtime, as mlconf gates it.
 *
 * mlconf's native backend implements it (libmlrt.so, built by `pip install`), and the `lib:PATH`
 * backend loads any shared library exporting it with cffi, so a third-party runtime in C, C++,
 * Rust or Zig can be gated by implementing these functions. A library may omit a group of
 * functions (for example the tokenizer or the quantizer): mlconf then reports the matching
 * capability as unsupported. Every function is thread-compatible: one model or tokenizer object
 * is used by one thread at a time.
 *
 * Status codes: the loader statuses of specs/mlb_errors.yaml and specs/mlt.yaml, plus the
 * codes a call can fail with. `reason` buffers receive a NUL-terminated message naming the file,
 * the field and the rule (truncated to reason_len).
 */
#ifndef MLRT_H
#define MLRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ML_OK 0
#define ML_E_IO 1          /* the file cannot be opened or read */
#define ML_E_FORMAT 2      /* malformed file (specs/mlb_errors.yaml, specs/mlt.yaml) */
#define ML_E_SHAPE 3       /* invalid dimensions */
#define ML_E_ARG 4         /* invalid argument: token out of range, pos, ctx, n, NULL pointer */
#define ML_E_NOMEM 5       /* allocation failed */
#define ML_E_UNSUPPORTED 6 /* not implemented by this library (e.g. an ISA it was not built for) */

/* ---------------------------------------------------------------- library */
const char *ml_version(void);            /* e.g. "mlrt 0.1.0" */
const char *ml_isa(void);                /* ISA in use: "scalar", "avx2", "neon", "neon-dotprod" */
int ml_set_isa(const char *isa);         /* force one (before loading models); ML_E_UNSUPPORTED if absent */

/* ---------------------------------------------------------------- models (.mlb) */
typedef struct ml_model ml_model;

/* Validate only: the status of the first failing rule, in specs/mlb_errors.yaml order. */
int ml_check(const char *path, char *reason, size_t reason_len);

/* Load (validating as ml_check) with a KV cache of ctx positions (0: max_seq; at most max_seq)
 * and `threads` worker threads (0: the number of cores). On failure *out is NULL. */
int ml_load(const char *path, int32_t ctx, int32_t threads, ml_model **out, char *reason, size_t reason_len);
void ml_free(ml_model *m);
void ml_reset(ml_model *m);              /* forget every position (KV cache, linear-attention state) */
int32_t ml_vocab(const ml_model *m);
int32_t ml_ctx(const ml_model *m);

/* Logits of tokens[0..n) at positions pos .. pos+n-1, runtime semantics (Q8_0 activations):
 * logits receives n * vocab floats. 0 <= pos <= positions already fed (exactly equal for models
 * with linear-attention layers), pos + n <= ctx, every token < vocab; else ML_E_ARG. */
int ml_forward(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits);
/* The same, but logits receives only the last position's vocab floats (a prompt's prefill that
 * only needs the next token; optional for other libraries). */
int ml_forward_last(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits);

/* Importance matrix (seed: MLI1): after ml_imatrix_start, every ml_forward adds the squares of
 * the matrix inputs. ml_imatrix_get copies the n sums (layout of the MLI1 body) and counts. */
int ml_imatrix_start(ml_model *m);
int ml_imatrix_get(const ml_model *m, double *sums, size_t n, uint64_t *tokens, uint64_t *tokens_cls);

/* ---------------------------------------------------------------- quantizer */
/* Q8_0 of n floats (n a multiple of 32): q receives n int8, d receives n/32 scales, float (f16=0)
 * or IEEE binary16 bits as uint16_t (f16=1). ML_E_ARG for n not a multiple of 32, a non-finite
 * input, or (f16) a scale above 65504. Bit-identical to the reference on every ISA. */
int ml_quantize_q8_0(const float *x, size_t n, int f16, int8_t *q, void *d);

/* ---------------------------------------------------------------- tokenizers (.mlt) */
typedef struct ml_tokenizer ml_tokenizer;

/* model_vocab: the vocab of the model the tokenizer goes with (n_vocab above it is ML_E_SHAPE);
 * 0 or negative: no model given. */
int ml_tok_load(const char *path, int32_t model_vocab, ml_tokenizer **out, char *reason, size_t reason_len);
void ml_tok_free(ml_tokenizer *t);
/* Encode UTF-8 text: ids receives at most cap ids; *n_out the number needed (ML_E_ARG if > cap). */
int ml_tok_encode(const ml_tokenizer *t, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n_out);
/* Decode ids to bytes: out receives at most cap bytes; *len_out the number needed. */
int ml_tok_decode(const ml_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap, size_t *len_out);

#ifdef __cplusplus
}
#endif
#endif /* MLRT_H */
