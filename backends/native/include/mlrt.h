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
/* Read .mlb files as Krafla major.minor.patch does (`mlconf run --target-version`): a header field
 * or layer-flag bit introduced later (specs/mlb_header.yaml `since`: flag bit 2 in 0.8.0, bit 3 and
 * offsets 132..159 in 0.9.0) is refused as padding or an unknown bit, ML_E_FORMAT. Default: the
 * newest. Process-wide: call before loading models. ML_E_ARG for a part above 65535. Optional:
 * mlconf takes a library without it to be of the version it targets. */
int ml_set_target_version(uint32_t major, uint32_t minor, uint32_t patch);

/* ---------------------------------------------------------------- models (.mlb) */
typedef struct ml_model ml_model;

/* Validate only: the status of the first failing rule, in specs/mlb_errors.yaml order. */
int ml_check(const char *path, char *reason, size_t reason_len);
/* Optional: ml_check, and `rule` receives the id of that rule (specs/mlb_errors.yaml `id`, e.g.
 * "format.truncated_body"; "" when the file is accepted), NUL-terminated, truncated to rule_len.
 * With it, mlconf fails a case refused with the right status by the wrong rule; without it a
 * loader case is judged by its status alone ("status only" in the reports). */
int ml_check_rule(const char *path, char *rule, size_t rule_len, char *reason, size_t reason_len);

/* Load (validating as ml_check) with a KV cache of ctx positions (0: max_seq; at most max_seq)
 * and `threads` worker threads (0: the number of cores). On failure *out is NULL. */
int ml_load(const char *path, int32_t ctx, int32_t threads, ml_model **out, char *reason, size_t reason_len);
void ml_free(ml_model *m);
void ml_reset(ml_model *m);              /* forget every position (KV cache, linear-attention state) */
int32_t ml_vocab(const ml_model *m);
int32_t ml_ctx(const ml_model *m);

/* Logits of tokens[0..n) at positions pos .. pos+n-1, runtime semantics (Q8_0 activations):
 * logits receives n * vocab floats. 0 <= pos <= positions already fed (exactly equal for models
 * with linear-attention layers), pos + n <= ctx, every token < vocab; else ML_E_ARG.
 * ML_E_FORMAT: a matrix input was NaN or infinite (NaN or inf weights in the file, or values that
 * overflow float32; decision forward.nonfinite). Then logits is unspecified and none of the call's
 * positions is fed: positions fed becomes pos (0 for a model with linear-attention layers). */
int ml_forward(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits);
/* The same, but logits receives only the last position's vocab floats (a prompt's prefill that
 * only needs the next token; optional for other libraries). The classifier input of the other
 * positions is not computed, so it is not checked either. */
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
/* Q4_0 of a (rows, cols) matrix, row-major, cols a multiple of 32: qs receives rows*cols/2 bytes
 * (16 per block: element j in the low nibble of byte j, element j + 16 in the high one; value
 * nibble - 8), d rows*cols/32 scales, float (f16=0) or binary16 bits (f16=1). rule ML_Q4_0_ROUND
 * (llama.cpp's) or ML_Q4_0_SEARCH (the writer's, specs/quant.yaml); importance: NULL, or cols
 * floats weighting the search (the importance of an MLI1 imatrix). ML_E_ARG: a NULL pointer, a
 * shape, a non-finite value, an importance with the round rule, a block the search cannot fit in
 * float32, or (f16) a scale above 65504; nothing is written then. Bit-identical to the reference. */
enum { ML_Q4_0_ROUND = 0, ML_Q4_0_SEARCH = 1 };
int ml_quantize_q4_0(const float *x, size_t rows, size_t cols, int rule, int f16, const float *importance,
                     uint8_t *qs, void *d);

/* ---------------------------------------------------------------- tokenizers (.mlt) */
typedef struct ml_tokenizer ml_tokenizer;

/* model_vocab: the vocab of the model the tokenizer goes with (n_vocab above it is ML_E_SHAPE);
 * 0 or negative: no model given. */
int ml_tok_load(const char *path, int32_t model_vocab, ml_tokenizer **out, char *reason, size_t reason_len);
void ml_tok_free(ml_tokenizer *t);
/* Optional: validate as ml_tok_load, and `rule` receives the id of the rule of specs/mlt.yaml that
 * refused the file ("" when accepted), as ml_check_rule does for .mlb files. */
int ml_tok_check_rule(const char *path, int32_t model_vocab, char *rule, size_t rule_len, char *reason,
                      size_t reason_len);
/* Encode UTF-8 text: ids receives at most cap ids; *n_out the number needed (ML_E_ARG if > cap). */
int ml_tok_encode(const ml_tokenizer *t, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n_out);
/* Decode ids to bytes: out receives at most cap bytes; *len_out the number needed. */
int ml_tok_decode(const ml_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap, size_t *len_out);

/* ---------------------------------------------------------------- I2_S (BitNet ternary), specs/i2s.yaml */
/* Optional group (mlconf's `bitnet` library exports it; libmlrt.so does not). Every result is
 * bit-identical to the reference on every ISA. ML_E_ARG: a NULL pointer, rows or n of 0, cols not a
 * positive multiple of 128, a non-finite input; ML_E_FORMAT: code 3 in a payload. */

/* The GGUF payload of a float weight (rows, cols), row-major: rows*cols/4 packed bytes, the f32
 * scale, 28 zero bytes (rows*cols/4 + 32 bytes in all). */
int ml_i2s_quantize(const float *w, size_t rows, size_t cols, uint8_t *payload);
/* Per-row int8 activations of x (rows, cols): q receives rows*cols int8, scale rows floats (the
 * activation scale a), sum rows int32 (the sum of each row's q). */
int ml_i2s_quantize_act(const float *x, size_t rows, size_t cols, int8_t *q, float *scale, int32_t *sum);
/* y (n, rows) = BitLinear matmul of x (n, cols) with the payload of a (rows, cols) weight:
 * int8 activations, integer i2 x i8 dot, float epilogue. */
int ml_i2s_matmul(const uint8_t *payload, size_t rows, size_t cols, const float *x, size_t n, float *y);

/* ---------------------------------------------------------------- embeddings (BitNet GGUF) */
/* Optional group: BitNet embedding models (Qwen3 / Gemma 3 bases) in GGUF with f32, f16 or I2_S
 * linear weights, as tools/convert_bitnet.py writes them (seed 004). */
typedef struct ml_embedder ml_embedder;

#define ML_POOL_MODEL (-1) /* the GGUF's pooling_type (mean when it has none) */
#define ML_POOL_MEAN 1     /* the values of llama.cpp's enum llama_pooling_type */
#define ML_POOL_CLS 2
#define ML_POOL_LAST 3

/* Load with `threads` worker threads (0: the number of cores). On failure *out is NULL and reason
 * names the file, the tensor or key, and the rule: ML_E_IO, ML_E_FORMAT (not GGUF v2/v3, a missing
 * key or tensor, an unsupported architecture or tensor type, a truncated file, code 3 in I2_S data,
 * a non-finite weight) or ML_E_SHAPE (a tensor shape that does not fit the hyper-parameters). */
int ml_embed_load(const char *path, int32_t threads, ml_embedder **out, char *reason, size_t reason_len);
/* Optional: validate only, as ml_embed_load does (every rule of specs/gguf.yaml, in its order), and
 * `rule` receives the id of the rule that refused the file ("gguf.tensor.layout", "bitnet.finite";
 * "" when accepted), NUL-terminated, truncated to rule_len. The loader cases of GGUF files
 * (capability load_gguf) are then judged by status and rule, else by status alone. */
int ml_embed_check_rule(const char *path, char *rule, size_t rule_len, char *reason, size_t reason_len);
/* Optional: load in a given reading of the projections. ML_READ_MODEL is the file's own, what
 * ml_embed_load gives and bitnet.cpp computes: ternary for I2_S, float for f32/f16.
 * ML_READ_FLOAT: plain matmuls with the stored weights (F16: the inputs rounded to f16 first, as
 * llama.cpp's F16 matmul; I2_S dequantized). ML_READ_TERNARY: the BitLinear of the latent f32/f16
 * weights, ternarized at load as ml_i2s_quantize does; it needs the per-projection norms (a
 * student): ML_E_ARG for a plain (teacher) model. ML_E_ARG for an unknown reading. */
#define ML_READ_MODEL 0
#define ML_READ_FLOAT 1
#define ML_READ_TERNARY 2
int ml_embed_load_reading(const char *path, int32_t threads, int32_t reading, ml_embedder **out, char *reason,
                          size_t reason_len);
void ml_embed_free(ml_embedder *e);
int32_t ml_embed_dim(const ml_embedder *e);
int32_t ml_embed_vocab(const ml_embedder *e);
/* The pooled embedding (dim floats) of tokens[0..n): pooling one of ML_POOL_*, normalize 1 divides
 * by the L2 norm (llama-embedding --embd-normalize 2). ML_E_ARG: n < 1, a token outside [0, vocab),
 * an unknown pooling; ML_E_FORMAT: the model's values overflow to a non-finite activation;
 * ML_E_NOMEM. On an error `out` is left unchanged. */
int ml_embed(ml_embedder *e, const int32_t *tokens, int32_t n, int32_t pooling, int32_t normalize, float *out);

#ifdef __cplusplus
}
#endif
#endif /* MLRT_H */
