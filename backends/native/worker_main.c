/* worker_main.c: the native runtime as a worker process, for machines that cannot dlopen it.
 *
 * native:neon and native:neon-dotprod on a host that is not aarch64 (backends/native/qemu.py) run
 * this program, statically linked with every source of src/ for aarch64 (build.py build_worker),
 * under `qemu-aarch64 -cpu max`. It serves the operations of the Python worker (worker.py) over
 * its stdin and stdout with the binary protocol below; whatever the library prints goes to stderr
 * (fd 1 is moved there first), so it cannot corrupt the replies.
 *
 * Protocol. All integers little-endian. A string is u32 length + that many bytes (no NUL); an
 * array is raw little-endian elements filling the rest of the payload, so its length follows
 * from the payload length.
 *   request:  u32 op, u32 payload length, payload
 *   reply:    u32 status, u32 payload length, payload
 * status 0 (WK_OK): the payload is the operation's result below. status 1 (WK_ERROR): the payload
 * is a message (UTF-8) saying why the request could not be served: unknown op, malformed payload,
 * unknown handle, out of memory. The library's own status codes (ML_OK, ML_E_*) are i32 values
 * inside a WK_OK payload. End of input: the worker exits 0 (it frees nothing).
 *   op                 request payload                         reply payload (WK_OK)
 *   1  INFO            str isa ("" keeps the automatic choice)  i32 ml_set_isa status (0 if isa is
 *                                                              ""), str ml_version(), str ml_isa(),
 *                                                              u32 n, n str: the ABI functions served
 *   2  CHECK           str path                                i32 status, str reason, str rule
 *                                                              (ml_check_rule)
 *   3  QUANTIZE_Q8_0   u32 f16, f32 x[n]                       i32 status, i8 q[n], then ceil(n/32)
 *                                                              scales: f32, or f16 bits (u16) if f16
 *   4  LOAD            str path, i32 ctx, i32 threads          i32 status, u32 handle (0: none),
 *                                                              str reason, i32 vocab, i32 ctx
 *   5  FORWARD         u32 handle, i32 pos, i32 tokens[n]      i32 status, f32 logits[n * vocab]
 *   6  RESET           u32 handle                              (empty)
 *   7  FREE            u32 handle (unknown: nothing)           (empty)
 *   8  IMATRIX_START   u32 handle                              i32 status
 *   9  IMATRIX_GET     u32 handle, u64 n                       i32 status, u64 tokens, u64 tokens_cls,
 *                                                              f64 sums[n]
 *   10 TOK_LOAD        str path, i32 model_vocab               i32 status, u32 handle (0: none), str reason
 *   11 TOK_ENCODE      u32 handle, u8 text[len]                i32 status, i32 ids[n]
 *   12 TOK_DECODE      u32 handle, i32 ids[n]                  i32 status, u8 bytes[len]
 *   13 TOK_FREE        u32 handle (unknown: nothing)           (empty)
 *   14 QUANTIZE_Q4_0   u32 rows, u32 cols, u32 rule, u32 f16,   i32 status, u8 qs[rows*cols/2], then
 *                      u32 has_importance, f32 importance[cols  rows*cols/32 scales: f32, or f16 bits
 *                      if has_importance], f32 x[rows*cols]    (u16) if f16
 *   15 TARGET_VERSION  u32 major, u32 minor, u32 patch          i32 ml_set_target_version status
 *   16 TOK_CHECK       str path, i32 model_vocab               i32 status, str reason, str rule
 *                                                              (ml_tok_check_rule)
 * Handles name models and tokenizers living in this process; they start at 1 and are not reused.
 *
 * Test hook: with MLRT_WORKER_TEST_HOOKS=1 in the environment, CHECK of a path whose file name
 * contains "crash" dereferences NULL (a real SIGSEGV) and one containing "hang" never returns, as
 * examples/crash/crash.c does for lib:PATH (tests/test_native_neon.py). Without it, nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mlrt.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the worker protocol is little-endian and this file writes host order"
#endif

#define WK_OK 0u
#define WK_ERROR 1u
#define REASON_LEN 1024
#define MAX_PAYLOAD 0xFFFFFFFFu

enum {
    OP_INFO = 1, OP_CHECK, OP_QUANTIZE_Q8_0, OP_LOAD, OP_FORWARD, OP_RESET, OP_FREE, OP_IMATRIX_START,
    OP_IMATRIX_GET, OP_TOK_LOAD, OP_TOK_ENCODE, OP_TOK_DECODE, OP_TOK_FREE, OP_QUANTIZE_Q4_0,
    OP_TARGET_VERSION, OP_TOK_CHECK
};

static const char *const FUNCTIONS[] = {
    "ml_version", "ml_isa", "ml_set_isa", "ml_set_target_version", "ml_check", "ml_check_rule", "ml_load", "ml_free", "ml_reset", "ml_vocab", "ml_ctx",
    "ml_forward", "ml_imatrix_start", "ml_imatrix_get", "ml_quantize_q8_0", "ml_quantize_q4_0", "ml_tok_load",
    "ml_tok_free", "ml_tok_check_rule", "ml_tok_encode", "ml_tok_decode",
};

/* ---------------------------------------------------------------- payload reading and writing */
typedef struct {
    const uint8_t *p;
    size_t len, at;
    const char *bad; /* the first problem met, or NULL */
} reader;

static char bad_text[256];

static int need(reader *r, size_t n, const char *what) {
    if (r->bad) return 0;
    if (r->len - r->at < n) {
        snprintf(bad_text, sizeof bad_text, "malformed request (%s): the payload is too short", what);
        r->bad = bad_text;
        return 0;
    }
    return 1;
}

static uint32_t get_u32(reader *r, const char *what) {
    uint32_t v = 0;
    if (need(r, 4, what)) memcpy(&v, r->p + r->at, 4), r->at += 4;
    return v;
}

static int32_t get_i32(reader *r, const char *what) { return (int32_t)get_u32(r, what); }

static uint64_t get_u64(reader *r, const char *what) {
    uint64_t v = 0;
    if (need(r, 8, what)) memcpy(&v, r->p + r->at, 8), r->at += 8;
    return v;
}

/* A string as a NUL-terminated copy (free it), or NULL with r->bad set. */
static char *get_str(reader *r, const char *what) {
    uint32_t n = get_u32(r, what);
    if (!need(r, n, what)) return NULL;
    if (memchr(r->p + r->at, 0, n)) {
        snprintf(bad_text, sizeof bad_text, "malformed request (%s): the string holds a NUL byte", what);
        r->bad = bad_text;
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        r->bad = "out of memory for a string of the request";
        return NULL;
    }
    memcpy(s, r->p + r->at, n);
    s[n] = '\0';
    r->at += n;
    return s;
}

/* The rest of the payload as an array of `size`-byte elements. */
static const uint8_t *get_rest(reader *r, size_t size, size_t *count, const char *what) {
    *count = 0;
    if (r->bad) return NULL;
    size_t left = r->len - r->at;
    if (left % size) {
        snprintf(bad_text, sizeof bad_text, "malformed request: %s", what);
        r->bad = bad_text;
        return NULL;
    }
    *count = left / size;
    const uint8_t *p = r->p + r->at;
    r->at = r->len;
    return p;
}

typedef struct {
    uint8_t *p;
    size_t len, cap;
    int oom;
} writer;

static void *reserve(writer *w, size_t n) {
    if (w->oom) return NULL;
    if (n > SIZE_MAX - w->len) {
        w->oom = 1;
        return NULL;
    }
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n) cap = cap > SIZE_MAX / 2 ? w->len + n : cap * 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p) {
            w->oom = 1;
            return NULL;
        }
        w->p = p, w->cap = cap;
    }
    void *at = w->p + w->len;
    w->len += n;
    return at;
}

static void put(writer *w, const void *src, size_t n) {
    void *at = reserve(w, n);
    if (at && n) memcpy(at, src, n);
}

static void put_u32(writer *w, uint32_t v) { put(w, &v, 4); }
static void put_i32(writer *w, int32_t v) { put(w, &v, 4); }
static void put_u64(writer *w, uint64_t v) { put(w, &v, 8); }

static void put_str(writer *w, const char *s) {
    size_t n = s ? strlen(s) : 0;
    put_u32(w, (uint32_t)n);
    put(w, s, n);
}

/* ---------------------------------------------------------------- handles */
enum { KIND_FREE, KIND_MODEL, KIND_TOKENIZER };

typedef struct {
    int kind;
    void *p;
} slot;

static slot *slots;
static uint32_t n_slots, cap_slots;

static uint32_t keep(int kind, void *p) {
    if (n_slots == cap_slots) {
        uint32_t cap = cap_slots ? cap_slots * 2 : 16;
        slot *s = realloc(slots, (size_t)cap * sizeof *s);
        if (!s) return 0;
        slots = s, cap_slots = cap;
    }
    slots[n_slots].kind = kind;
    slots[n_slots].p = p;
    return ++n_slots;
}

static void *lookup(uint32_t h, int kind) {
    if (h == 0 || h > n_slots || slots[h - 1].kind != kind) return NULL;
    return slots[h - 1].p;
}

static void *release(uint32_t h, int kind) {
    void *p = lookup(h, kind);
    if (p) slots[h - 1].kind = KIND_FREE, slots[h - 1].p = NULL;
    return p;
}

/* ---------------------------------------------------------------- operations */
static char error_text[512];

/* Ends an operation that cannot be served: the reply becomes WK_ERROR with this message. */
static uint32_t fail(const char *fmt, const char *arg) {
    snprintf(error_text, sizeof error_text, fmt, arg);
    return WK_ERROR;
}

static int test_hooks(void) {
    const char *v = getenv("MLRT_WORKER_TEST_HOOKS");
    return v && strcmp(v, "1") == 0;
}

static void test_hook_check(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (strstr(name, "crash")) {
        volatile int *volatile p = NULL; /* opaque to the optimizer: a real SIGSEGV, not a trap */
        *p = 1;
    }
    if (strstr(name, "hang"))
        for (;;) sleep(1);
}

static uint32_t op_info(reader *r, writer *w) {
    char *isa = get_str(r, "INFO: str isa");
    if (!isa) return fail("%s", r->bad);
    int st = isa[0] ? ml_set_isa(isa) : ML_OK;
    free(isa);
    put_i32(w, st);
    put_str(w, ml_version());
    put_str(w, ml_isa());
    put_u32(w, (uint32_t)(sizeof FUNCTIONS / sizeof FUNCTIONS[0]));
    for (size_t i = 0; i < sizeof FUNCTIONS / sizeof FUNCTIONS[0]; i++) put_str(w, FUNCTIONS[i]);
    return WK_OK;
}

static uint32_t op_check(reader *r, writer *w) {
    char *path = get_str(r, "CHECK: str path");
    if (!path) return fail("%s", r->bad);
    if (test_hooks()) test_hook_check(path);
    char reason[REASON_LEN] = "", rule[128] = "";
    int st = ml_check_rule(path, rule, sizeof rule, reason, sizeof reason);
    free(path);
    put_i32(w, st);
    put_str(w, reason);
    put_str(w, rule);
    return WK_OK;
}

static uint32_t op_quantize_q8_0(reader *r, writer *w) {
    uint32_t f16 = get_u32(r, "QUANTIZE_Q8_0: u32 f16");
    size_t n;
    const uint8_t *x = get_rest(r, 4, &n, "QUANTIZE_Q8_0: the floats are not a whole number of f32");
    if (r->bad) return fail("%s", r->bad);
    size_t nb = n / 32 + (n % 32 != 0), dsize = f16 ? 2 : 4;
    /* Aligned copies: the payload holds the floats at an offset of 4 bytes past a malloc'd start. */
    float *xf = malloc(n * 4 + 4);
    int8_t *q = calloc(n + 1, 1);
    void *d = calloc(nb + 1, dsize);
    if (!xf || !q || !d) {
        free(xf), free(q), free(d);
        return fail("%s", "QUANTIZE_Q8_0: out of memory");
    }
    memcpy(xf, x, n * 4);
    put_i32(w, ml_quantize_q8_0(xf, n, f16 != 0, q, d));
    put(w, q, n);
    put(w, d, nb * dsize);
    free(xf), free(q), free(d);
    return WK_OK;
}

static uint32_t op_quantize_q4_0(reader *r, writer *w) {
    uint32_t rows = get_u32(r, "QUANTIZE_Q4_0: u32 rows"), cols = get_u32(r, "QUANTIZE_Q4_0: u32 cols");
    uint32_t rule = get_u32(r, "QUANTIZE_Q4_0: u32 rule"), f16 = get_u32(r, "QUANTIZE_Q4_0: u32 f16");
    uint32_t has_imp = get_u32(r, "QUANTIZE_Q4_0: u32 has_importance");
    size_t n;
    const uint8_t *rest = get_rest(r, 4, &n, "QUANTIZE_Q4_0: the floats are not a whole number of f32");
    if (r->bad) return fail("%s", r->bad);
    size_t ni = has_imp ? cols : 0;
    if (n < ni || n - ni != (size_t)rows * cols) return fail("%s", "QUANTIZE_Q4_0: rows * cols floats expected");
    n -= ni;
    size_t nb = n / 32, dsize = f16 ? 2 : 4;
    /* Aligned copies: the payload holds the floats at an unaligned offset. */
    float *imp = malloc(ni * 4 + 4), *xf = malloc(n * 4 + 4);
    uint8_t *qs = calloc(n / 2 + 1, 1);
    void *d = calloc(nb + 1, dsize);
    if (!imp || !xf || !qs || !d) {
        free(imp), free(xf), free(qs), free(d);
        return fail("%s", "QUANTIZE_Q4_0: out of memory");
    }
    memcpy(imp, rest, ni * 4);
    memcpy(xf, rest + ni * 4, n * 4);
    put_i32(w, ml_quantize_q4_0(xf, rows, cols, (int)rule, f16 != 0, has_imp ? imp : NULL, qs, d));
    put(w, qs, n / 2);
    put(w, d, nb * dsize);
    free(imp), free(xf), free(qs), free(d);
    return WK_OK;
}

static uint32_t op_load(reader *r, writer *w) {
    char *path = get_str(r, "LOAD: str path");
    int32_t ctx = get_i32(r, "LOAD: i32 ctx"), threads = get_i32(r, "LOAD: i32 threads");
    if (r->bad) {
        free(path);
        return fail("%s", r->bad);
    }
    char reason[REASON_LEN] = "";
    ml_model *m = NULL;
    int st = ml_load(path, ctx, threads, &m, reason, sizeof reason);
    free(path);
    uint32_t h = 0;
    if (st == ML_OK && m) {
        h = keep(KIND_MODEL, m);
        if (!h) {
            ml_free(m);
            return fail("%s", "LOAD: out of memory for the handle table");
        }
    }
    put_i32(w, st);
    put_u32(w, h);
    put_str(w, reason);
    put_i32(w, h ? ml_vocab(m) : 0);
    put_i32(w, h ? ml_ctx(m) : 0);
    return WK_OK;
}

static uint32_t op_forward(reader *r, writer *w) {
    uint32_t h = get_u32(r, "FORWARD: u32 handle");
    int32_t pos = get_i32(r, "FORWARD: i32 pos");
    size_t n;
    const uint8_t *raw = get_rest(r, 4, &n, "FORWARD: the tokens are not a whole number of i32");
    if (r->bad) return fail("%s", r->bad);
    ml_model *m = lookup(h, KIND_MODEL);
    if (!m) return fail("%s", "FORWARD: no such model handle");
    if (n > INT32_MAX) return fail("%s", "FORWARD: more tokens than int32_t counts");
    size_t vocab = (size_t)ml_vocab(m);
    if (vocab && n > (MAX_PAYLOAD - 4) / 4 / vocab)
        return fail("%s", "FORWARD: the logits would not fit one reply (4 GiB)");
    int32_t *tokens = malloc(n * 4 + 4);
    float *logits = calloc(n * vocab + 1, sizeof(float));
    if (!tokens || !logits) {
        free(tokens), free(logits);
        return fail("%s", "FORWARD: out of memory");
    }
    memcpy(tokens, raw, n * 4);
    int32_t st = ml_forward(m, tokens, (int32_t)n, pos, logits);
    put_i32(w, st);
    put(w, logits, n * vocab * sizeof(float));
    free(tokens), free(logits);
    return w->oom ? fail("%s", "FORWARD: out of memory") : WK_OK;
}

static uint32_t op_model(reader *r, writer *w, int op) {
    uint32_t h = get_u32(r, "u32 handle");
    if (r->bad) return fail("%s", r->bad);
    if (op == OP_FREE) {
        ml_model *m = release(h, KIND_MODEL);
        if (m) ml_free(m);
        return WK_OK;
    }
    ml_model *m = lookup(h, KIND_MODEL);
    if (!m) return fail("%s", "no such model handle");
    if (op == OP_RESET) {
        ml_reset(m);
        return WK_OK;
    }
    if (op == OP_IMATRIX_START) {
        put_i32(w, ml_imatrix_start(m));
        return WK_OK;
    }
    uint64_t n = get_u64(r, "IMATRIX_GET: u64 n");
    if (r->bad) return fail("%s", r->bad);
    if (n > (MAX_PAYLOAD - 20) / 8) return fail("%s", "IMATRIX_GET: n sums would not fit one reply");
    double *sums = calloc((size_t)n + 1, sizeof(double));
    if (!sums) return fail("%s", "IMATRIX_GET: out of memory");
    uint64_t tokens = 0, tokens_cls = 0;
    int32_t st = ml_imatrix_get(m, sums, (size_t)n, &tokens, &tokens_cls);
    put_i32(w, st);
    put_u64(w, tokens);
    put_u64(w, tokens_cls);
    put(w, sums, (size_t)n * sizeof(double));
    free(sums);
    return WK_OK;
}

/* TOK_LOAD, or (check) TOK_CHECK: the same request, validated only. */
static uint32_t op_tok_load(reader *r, writer *w, int check) {
    char *path = get_str(r, "TOK_LOAD: str path");
    int32_t model_vocab = get_i32(r, "TOK_LOAD: i32 model_vocab");
    if (r->bad) {
        free(path);
        return fail("%s", r->bad);
    }
    char reason[REASON_LEN] = "";
    if (check) {
        char rule[128] = "";
        int st = ml_tok_check_rule(path, model_vocab, rule, sizeof rule, reason, sizeof reason);
        free(path);
        put_i32(w, st);
        put_str(w, reason);
        put_str(w, rule);
        return WK_OK;
    }
    ml_tokenizer *t = NULL;
    int st = ml_tok_load(path, model_vocab, &t, reason, sizeof reason);
    free(path);
    uint32_t h = 0;
    if (st == ML_OK && t) {
        h = keep(KIND_TOKENIZER, t);
        if (!h) {
            ml_tok_free(t);
            return fail("%s", "TOK_LOAD: out of memory for the handle table");
        }
    }
    put_i32(w, st);
    put_u32(w, h);
    put_str(w, reason);
    return WK_OK;
}

/* ENCODE and DECODE: a first call with a generous buffer, a second with the size the library
 * asked for (ML_E_ARG and a larger *n_out), as worker.py does. */
static uint32_t op_tok_encode(reader *r, writer *w) {
    uint32_t h = get_u32(r, "TOK_ENCODE: u32 handle");
    size_t len;
    const uint8_t *text = get_rest(r, 1, &len, "TOK_ENCODE: text");
    if (r->bad) return fail("%s", r->bad);
    ml_tokenizer *t = lookup(h, KIND_TOKENIZER);
    if (!t) return fail("%s", "TOK_ENCODE: no such tokenizer handle");
    size_t cap = len + 16, n_out = 0;
    int32_t *ids = NULL;
    int st = ML_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        free(ids);
        ids = calloc(cap, sizeof *ids);
        if (!ids) return fail("%s", "TOK_ENCODE: out of memory");
        n_out = 0;
        st = ml_tok_encode(t, (const char *)text, len, ids, cap, &n_out);
        if (st == ML_E_ARG && n_out > cap && n_out < (MAX_PAYLOAD - 4) / 4) {
            cap = n_out;
            continue;
        }
        break;
    }
    put_i32(w, st);
    put(w, ids, (n_out < cap ? n_out : cap) * sizeof *ids);
    free(ids);
    return w->oom ? fail("%s", "TOK_ENCODE: out of memory") : WK_OK;
}

static uint32_t op_tok_decode(reader *r, writer *w) {
    uint32_t h = get_u32(r, "TOK_DECODE: u32 handle");
    size_t n;
    const uint8_t *raw = get_rest(r, 4, &n, "TOK_DECODE: the ids are not a whole number of i32");
    if (r->bad) return fail("%s", r->bad);
    ml_tokenizer *t = lookup(h, KIND_TOKENIZER);
    if (!t) return fail("%s", "TOK_DECODE: no such tokenizer handle");
    if (n > ((size_t)MAX_PAYLOAD - 16) / 16) return fail("%s", "TOK_DECODE: too many ids");
    int32_t *ids = malloc(n * 4 + 4);
    if (!ids) return fail("%s", "TOK_DECODE: out of memory");
    memcpy(ids, raw, n * 4);
    size_t cap = 16 * n + 16, len_out = 0;
    char *out = NULL;
    int st = ML_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        free(out);
        out = calloc(cap, 1);
        if (!out) {
            free(ids);
            return fail("%s", "TOK_DECODE: out of memory");
        }
        len_out = 0;
        st = ml_tok_decode(t, ids, n, out, cap, &len_out);
        if (st == ML_E_ARG && len_out > cap && len_out < MAX_PAYLOAD - 4) {
            cap = len_out;
            continue;
        }
        break;
    }
    put_i32(w, st);
    put(w, out, len_out < cap ? len_out : cap);
    free(out), free(ids);
    return w->oom ? fail("%s", "TOK_DECODE: out of memory") : WK_OK;
}

static uint32_t op_tok_free(reader *r) {
    uint32_t h = get_u32(r, "TOK_FREE: u32 handle");
    if (r->bad) return fail("%s", r->bad);
    ml_tokenizer *t = release(h, KIND_TOKENIZER);
    if (t) ml_tok_free(t);
    return WK_OK;
}

static uint32_t op_target_version(reader *r, writer *w) {
    uint32_t major = get_u32(r, "TARGET_VERSION: u32 major"), minor = get_u32(r, "TARGET_VERSION: u32 minor");
    uint32_t patch = get_u32(r, "TARGET_VERSION: u32 patch");
    if (r->bad) return fail("%s", r->bad);
    put_i32(w, ml_set_target_version(major, minor, patch));
    return WK_OK;
}

static uint32_t serve(uint32_t op, reader *r, writer *w) {
    uint32_t st;
    switch (op) {
    case OP_INFO: st = op_info(r, w); break;
    case OP_CHECK: st = op_check(r, w); break;
    case OP_TARGET_VERSION: st = op_target_version(r, w); break;
    case OP_QUANTIZE_Q8_0: st = op_quantize_q8_0(r, w); break;
    case OP_QUANTIZE_Q4_0: st = op_quantize_q4_0(r, w); break;
    case OP_LOAD: st = op_load(r, w); break;
    case OP_FORWARD: st = op_forward(r, w); break;
    case OP_RESET:
    case OP_FREE:
    case OP_IMATRIX_START:
    case OP_IMATRIX_GET: st = op_model(r, w, (int)op); break;
    case OP_TOK_LOAD: st = op_tok_load(r, w, 0); break;
    case OP_TOK_CHECK: st = op_tok_load(r, w, 1); break;
    case OP_TOK_ENCODE: st = op_tok_encode(r, w); break;
    case OP_TOK_DECODE: st = op_tok_decode(r, w); break;
    case OP_TOK_FREE: st = op_tok_free(r); break;
    default: {
        char code[16];
        snprintf(code, sizeof code, "%u", (unsigned)op);
        return fail("unknown operation %s", code);
    }
    }
    if (st == WK_OK && w->oom) return fail("%s", "out of memory for the reply");
    if (st == WK_OK && r->at != r->len) return fail("%s", "malformed request: bytes after its last field");
    return st;
}

/* ---------------------------------------------------------------- the loop */
/* 1: n bytes read; 0: end of input before the first byte; -1: error or end of input midway. */
static int read_full(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (uint8_t *)buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return got == 0 && k == 0 ? 0 : -1;
        got += (size_t)k;
    }
    return 1;
}

static int write_full(int fd, const void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t k = write(fd, (const uint8_t *)buf + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        done += (size_t)k;
    }
    return 0;
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc != 1) {
        fprintf(stderr, "usage: mlrt-worker (speaks the protocol of worker_main.c on stdin/stdout)\n");
        return 2;
    }
    /* The protocol owns the original stdin and stdout; the library's prints go to stderr. */
    int in = dup(0), out = dup(1);
    int null = open("/dev/null", O_RDONLY);
    if (in < 0 || out < 0 || null < 0 || dup2(2, 1) < 0 || dup2(null, 0) < 0) {
        perror("mlrt-worker: setting up the pipes");
        return 1;
    }
    close(null);
    signal(SIGPIPE, SIG_IGN); /* a harness gone away: write fails, the worker exits */
    writer w = {0};
    for (;;) {
        uint32_t head[2];
        int rc = read_full(in, head, sizeof head);
        if (rc == 0) return 0;
        if (rc < 0) {
            fprintf(stderr, "mlrt-worker: input ended inside a request header\n");
            return 1;
        }
        uint8_t *payload = malloc((size_t)head[1] + 1);
        if (!payload) {
            fprintf(stderr, "mlrt-worker: out of memory for a %u-byte request\n", (unsigned)head[1]);
            return 1;
        }
        if (head[1] && read_full(in, payload, head[1]) != 1) {
            fprintf(stderr, "mlrt-worker: input ended inside a request payload\n");
            return 1;
        }
        reader r = {payload, head[1], 0, NULL};
        w.len = 0;
        w.oom = 0;
        uint32_t st = serve(head[0], &r, &w);
        free(payload);
        const void *body = w.p;
        size_t len = w.len;
        if (st == WK_OK && len > MAX_PAYLOAD) st = fail("%s", "the reply is larger than 4 GiB");
        if (st != WK_OK) body = error_text, len = strlen(error_text);
        uint32_t rhead[2] = {st, (uint32_t)len};
        if (write_full(out, rhead, sizeof rhead) || write_full(out, body, len)) return 0;
        if (w.cap > ((size_t)64 << 20)) { /* do not keep a large reply buffer between calls */
            free(w.p);
            w = (writer){0};
        }
    }
}
