"""The C ABI of include/mlrt.h as cffi sees it (ABI mode: ffi.cdef + ffi.dlopen, no compiler).

CDEF repeats the declarations of mlrt.h; tests/test_native_backend.py checks that every function
of the header is declared here with the same prototype. A library may omit a group of functions:
CAPABILITY_SYMBOLS says which symbols each backend capability needs.
"""

from __future__ import annotations

CDEF = """
#define ML_OK 0
#define ML_E_IO 1
#define ML_E_FORMAT 2
#define ML_E_SHAPE 3
#define ML_E_ARG 4
#define ML_E_NOMEM 5
#define ML_E_UNSUPPORTED 6

const char *ml_version(void);
const char *ml_isa(void);
int ml_set_isa(const char *isa);
int ml_set_target_version(uint32_t major, uint32_t minor, uint32_t patch);

typedef struct ml_model ml_model;
int ml_check(const char *path, char *reason, size_t reason_len);
int ml_check_rule(const char *path, char *rule, size_t rule_len, char *reason, size_t reason_len);
int ml_load(const char *path, int32_t ctx, int32_t threads, ml_model **out, char *reason, size_t reason_len);
void ml_free(ml_model *m);
void ml_reset(ml_model *m);
int32_t ml_vocab(const ml_model *m);
int32_t ml_ctx(const ml_model *m);
int ml_forward(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits);
int ml_forward_last(ml_model *m, const int32_t *tokens, int32_t n, int32_t pos, float *logits);
int ml_imatrix_start(ml_model *m);
int ml_imatrix_get(const ml_model *m, double *sums, size_t n, uint64_t *tokens, uint64_t *tokens_cls);

int ml_quantize_q8_0(const float *x, size_t n, int f16, int8_t *q, void *d);
int ml_quantize_q4_0(const float *x, size_t rows, size_t cols, int rule, int f16, const float *importance,
                     uint8_t *qs, void *d);

typedef struct ml_tokenizer ml_tokenizer;
int ml_tok_load(const char *path, int32_t model_vocab, ml_tokenizer **out, char *reason, size_t reason_len);
void ml_tok_free(ml_tokenizer *t);
int ml_tok_check_rule(const char *path, int32_t model_vocab, char *rule, size_t rule_len, char *reason,
                      size_t reason_len);
int ml_tok_encode(const ml_tokenizer *t, const char *text, size_t len, int32_t *ids, size_t cap,
                  size_t *n_out);
int ml_tok_decode(const ml_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap,
                  size_t *len_out);

int ml_i2s_quantize(const float *w, size_t rows, size_t cols, uint8_t *payload);
int ml_i2s_quantize_act(const float *x, size_t rows, size_t cols, int8_t *q, float *scale, int32_t *sum);
int ml_i2s_matmul(const uint8_t *payload, size_t rows, size_t cols, const float *x, size_t n, float *y);

#define ML_POOL_MODEL -1
#define ML_POOL_MEAN 1
#define ML_POOL_CLS 2
#define ML_POOL_LAST 3
typedef struct ml_embedder ml_embedder;
int ml_embed_load(const char *path, int32_t threads, ml_embedder **out, char *reason, size_t reason_len);
int ml_embed_check_rule(const char *path, char *rule, size_t rule_len, char *reason, size_t reason_len);
#define ML_READ_MODEL 0
#define ML_READ_FLOAT 1
#define ML_READ_TERNARY 2
int ml_embed_load_reading(const char *path, int32_t threads, int32_t reading, ml_embedder **out, char *reason,
                          size_t reason_len);
void ml_embed_free(ml_embedder *e);
int32_t ml_embed_dim(const ml_embedder *e);
int32_t ml_embed_vocab(const ml_embedder *e);
int ml_embed(ml_embedder *e, const int32_t *tokens, int32_t n, int32_t pooling, int32_t normalize,
             float *out);
"""

FUNCTIONS = (
    "ml_version",
    "ml_isa",
    "ml_set_isa",
    "ml_set_target_version",
    "ml_check",
    "ml_check_rule",
    "ml_load",
    "ml_free",
    "ml_reset",
    "ml_vocab",
    "ml_ctx",
    "ml_forward",
    "ml_forward_last",
    "ml_imatrix_start",
    "ml_imatrix_get",
    "ml_quantize_q8_0",
    "ml_quantize_q4_0",
    "ml_tok_load",
    "ml_tok_free",
    "ml_tok_check_rule",
    "ml_tok_encode",
    "ml_tok_decode",
    "ml_i2s_quantize",
    "ml_i2s_quantize_act",
    "ml_i2s_matmul",
    "ml_embed_load",
    "ml_embed_check_rule",
    "ml_embed_load_reading",
    "ml_embed_free",
    "ml_embed_dim",
    "ml_embed_vocab",
    "ml_embed",
)

STATUS_NAMES = {
    0: "ML_OK",
    1: "ML_E_IO",
    2: "ML_E_FORMAT",
    3: "ML_E_SHAPE",
    4: "ML_E_ARG",
    5: "ML_E_NOMEM",
    6: "ML_E_UNSUPPORTED",
}
ML_OK, ML_E_FORMAT, ML_E_ARG, ML_E_UNSUPPORTED = 0, 2, 4, 6
Q4_0_RULES = {"round": 0, "search": 1}  # ML_Q4_0_ROUND, ML_Q4_0_SEARCH

# Backend capability -> the symbols it needs (mlconf.backends.CAPABILITIES).
CAPABILITY_SYMBOLS: dict[str, tuple[str, ...]] = {
    "load": ("ml_check",),
    "quantize_q8_0": ("ml_quantize_q8_0",),
    "quantize_q4_0": ("ml_quantize_q4_0",),
    "forward": ("ml_load", "ml_free", "ml_reset", "ml_vocab", "ml_forward"),
    "load_tokenizer": ("ml_tok_load", "ml_tok_free"),
    "encode": ("ml_tok_load", "ml_tok_free", "ml_tok_encode", "ml_tok_decode"),
    "i2s": ("ml_i2s_quantize", "ml_i2s_quantize_act", "ml_i2s_matmul"),
    "embed": ("ml_embed_load", "ml_embed_free", "ml_embed_dim", "ml_embed_vocab", "ml_embed"),
    "load_gguf": ("ml_embed_load", "ml_embed_free"),
}

# The functions no capability needs: used when a library exports them (README "Implementing the C ABI")
OPTIONAL = tuple(sorted(set(FUNCTIONS) - {s for syms in CAPABILITY_SYMBOLS.values() for s in syms}))

# open_embedder's reading -> the ML_READ_* code of ml_embed_load_reading (optional in the embed group)
READING_CODES = {None: 0, "float": 1, "ternary": 2}

REASON_LEN = 1024  # bytes of the reason buffers given to ml_check, ml_load and ml_tok_load
RULE_LEN = 128  # bytes of the rule buffers of ml_check_rule, ml_tok_check_rule and ml_embed_check_rule


def status_name(code: int) -> str:
    return STATUS_NAMES.get(code, f"status {code}")
