/* replay.c: the whole mlconf suite replayed without Python, against any library with the C ABI of
 * include/mlrt.h (libmlrt.so, libmlbitnet.so, your runtime's).
 *
 *     mlconf fixtures fx/
 *     jq -r -f examples/replay/manifest.jq fx/manifest.json | ./replay fx/ path/to/libruntime.so
 *
 * Each line of the jq pre-pass is one case (manifest.jq says the fields). The case's function is
 * looked up in the library; a library without it makes the case "unsupported", as `mlconf run`
 * reports a missing capability. Prints each failing case with what differs, then the outcomes per
 * area, in the layout of `mlconf run`'s table:
 *
 *     area pass fail unsupported error
 *
 * Exit status 1 when a case fails or errors. The comparisons are the harness's (conformance/
 * compare.py): statuses by name; refusals by any of the listed statuses; outputs (decoded text
 * too) byte for byte; token ids; float outputs by nmse (mean squared error over the mean square of the expectation,
 * both over the elements finite in both), max_abs, max_ulp, argmax agreement over the rows and
 * cosine, each against the case's thresholds; a non-finite value must stand where the expectation
 * has the same one.
 *
 * C11 + POSIX (dlopen). Build: cc -std=c11 -O2 -Wall -Wextra -o replay replay.c -ldl -lm
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../backends/native/include/mlrt.h"

/* ---------------------------------------------------------------- the library */
typedef struct {
    int (*check)(const char *, char *, size_t);
    int (*check_rule)(const char *, char *, size_t, char *, size_t);
    int (*tok_check_rule)(const char *, int32_t, char *, size_t, char *, size_t);
    int (*load)(const char *, int32_t, int32_t, ml_model **, char *, size_t);
    void (*free_model)(ml_model *);
    int32_t (*vocab)(const ml_model *);
    int (*forward)(ml_model *, const int32_t *, int32_t, int32_t, float *);
    int (*quantize_q8_0)(const float *, size_t, int, int8_t *, void *);
    int (*quantize_q4_0)(const float *, size_t, size_t, int, int, const float *, uint8_t *, void *);
    int (*tok_load)(const char *, int32_t, ml_tokenizer **, char *, size_t);
    void (*tok_free)(ml_tokenizer *);
    int (*tok_encode)(const ml_tokenizer *, const char *, size_t, int32_t *, size_t, size_t *);
    int (*tok_decode)(const ml_tokenizer *, const int32_t *, size_t, char *, size_t, size_t *);
    int (*i2s_quantize)(const float *, size_t, size_t, uint8_t *);
    int (*i2s_quantize_act)(const float *, size_t, size_t, int8_t *, float *, int32_t *);
    int (*i2s_matmul)(const uint8_t *, size_t, size_t, const float *, size_t, float *);
    int (*embed_load)(const char *, int32_t, ml_embedder **, char *, size_t);
    int (*embed_check_rule)(const char *, char *, size_t, char *, size_t);
    int (*embed_load_reading)(const char *, int32_t, int32_t, ml_embedder **, char *, size_t);
    void (*embed_free)(ml_embedder *);
    int32_t (*embed_dim)(const ml_embedder *);
    int (*embed)(ml_embedder *, const int32_t *, int32_t, int32_t, int32_t, float *);
} lib_t;

static void *sym(void *h, const char *name) { return dlsym(h, name); }

static lib_t open_lib(void *h) {
    lib_t L;
    *(void **)&L.check = sym(h, "ml_check");
    *(void **)&L.check_rule = sym(h, "ml_check_rule");
    *(void **)&L.tok_check_rule = sym(h, "ml_tok_check_rule");
    *(void **)&L.load = sym(h, "ml_load");
    *(void **)&L.free_model = sym(h, "ml_free");
    *(void **)&L.vocab = sym(h, "ml_vocab");
    *(void **)&L.forward = sym(h, "ml_forward");
    *(void **)&L.quantize_q8_0 = sym(h, "ml_quantize_q8_0");
    *(void **)&L.quantize_q4_0 = sym(h, "ml_quantize_q4_0");
    *(void **)&L.tok_load = sym(h, "ml_tok_load");
    *(void **)&L.tok_free = sym(h, "ml_tok_free");
    *(void **)&L.tok_encode = sym(h, "ml_tok_encode");
    *(void **)&L.tok_decode = sym(h, "ml_tok_decode");
    *(void **)&L.i2s_quantize = sym(h, "ml_i2s_quantize");
    *(void **)&L.i2s_quantize_act = sym(h, "ml_i2s_quantize_act");
    *(void **)&L.i2s_matmul = sym(h, "ml_i2s_matmul");
    *(void **)&L.embed_load = sym(h, "ml_embed_load");
    *(void **)&L.embed_check_rule = sym(h, "ml_embed_check_rule");
    *(void **)&L.embed_load_reading = sym(h, "ml_embed_load_reading");
    *(void **)&L.embed_free = sym(h, "ml_embed_free");
    *(void **)&L.embed_dim = sym(h, "ml_embed_dim");
    *(void **)&L.embed = sym(h, "ml_embed");
    return L;
}

static const char *const STATUS[] = {"ML_OK", "ML_E_IO", "ML_E_FORMAT", "ML_E_SHAPE", "ML_E_ARG", "ML_E_NOMEM",
                                     "ML_E_UNSUPPORTED"};
static const char *status_name(int st) { return st >= 0 && st <= 6 ? STATUS[st] : "unknown status"; }

/* ---------------------------------------------------------------- a case line */
#define MAX_ITEMS 16
typedef struct {
    char *key, *val;
} item;
typedef struct {
    char *path, *dtype, *special;
    size_t shape[4];
    int ndim;
    size_t count; /* elements */
} file_ref;
typedef struct {
    char *id, *area, *op, *compare;
    item args[MAX_ITEMS], inputs[MAX_ITEMS], outputs[MAX_ITEMS], expect[MAX_ITEMS];
    int n_args, n_inputs, n_outputs, n_expect;
} case_t;

static int split_items(char *s, item *out) {
    int n = 0;
    for (char *save = NULL, *t = strtok_r(s, " ", &save); t && n < MAX_ITEMS; t = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) continue;
        *eq = 0;
        out[n].key = t, out[n].val = eq + 1, n++;
    }
    return n;
}

static int parse_line(char *line, case_t *c) {
    char *f[8];
    int n = 0;
    for (char *p = line; n < 8; n++) { /* tab-separated, empty fields kept */
        f[n] = p;
        char *tab = strchr(p, '\t');
        if (!tab) {
            n++;
            break;
        }
        *tab = 0, p = tab + 1;
    }
    if (n != 8) return 0;
    f[7][strcspn(f[7], "\r\n")] = 0;
    c->id = f[0], c->area = f[1], c->op = f[2], c->compare = f[3];
    c->n_args = split_items(f[4], c->args), c->n_inputs = split_items(f[5], c->inputs);
    c->n_outputs = split_items(f[6], c->outputs), c->n_expect = split_items(f[7], c->expect);
    return 1;
}

static const char *get(const item *it, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (strcmp(it[i].key, key) == 0) return it[i].val;
    return NULL;
}

static long arg(const case_t *c, const char *key) {
    const char *v = get(c->args, c->n_args, key);
    return v ? strtol(v, NULL, 10) : 0;
}

/* FILE[:DTYPE:SHAPE][!SPECIAL] under dir */
static file_ref parse_ref(const char *dir, const char *v) {
    file_ref r = {0};
    char *s = strdup(v), *bang = strchr(s, '!');
    if (bang) *bang = 0, r.special = bang + 1;
    char *colon = strchr(s, ':');
    r.count = 1;
    if (colon) {
        *colon = 0, r.dtype = colon + 1;
        char *c2 = strchr(r.dtype, ':');
        if (c2) {
            *c2 = 0;
            for (char *save = NULL, *t = strtok_r(c2 + 1, "x", &save); t && r.ndim < 4; t = strtok_r(NULL, "x", &save))
                r.shape[r.ndim] = strtoul(t, NULL, 10), r.count *= r.shape[r.ndim++];
        }
    }
    size_t len = strlen(dir) + strlen(s) + 2;
    r.path = malloc(len);
    snprintf(r.path, len, "%s/%s", dir, s);
    r.dtype = r.dtype ? strdup(r.dtype) : NULL;
    r.special = r.special ? strdup(r.special) : NULL;
    free(s);
    return r;
}

static void free_ref(file_ref *r) { free(r->path), free(r->dtype), free(r->special); }

static size_t dtype_size(const char *d) {
    return !d ? 1 : strcmp(d, "i32") == 0 || strcmp(d, "f32") == 0 ? 4 : strcmp(d, "u16") == 0 ? 2 : 1;
}

/* The whole file (*len bytes; a NUL after them); NULL if it cannot be read */
static void *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    for (size_t got; (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) buf = realloc(buf, (cap *= 2) + 1);
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---------------------------------------------------------------- outcomes */
enum { PASS, FAIL, UNSUPPORTED, ERROR, N_OUT };
static const char *const OUTCOME[] = {"pass", "fail", "unsupported", "error"};
#define MAX_AREAS 8
static char areas[MAX_AREAS][16];
static int counts[MAX_AREAS][N_OUT], n_areas;

static void count(const char *area, int outcome) {
    int a = 0;
    while (a < n_areas && strcmp(areas[a], area) != 0) a++;
    if (a == n_areas && n_areas < MAX_AREAS) snprintf(areas[n_areas++], sizeof areas[0], "%s", area);
    if (a < MAX_AREAS) counts[a][outcome]++;
}

static char detail[512];
#define SAY(...) snprintf(detail, sizeof detail, __VA_ARGS__)

/* The input or output `name` of the case: its file read whole (NULL and a detail when missing) */
typedef struct {
    file_ref ref;
    void *data;
    size_t len;
} blob;

static int input(const char *dir, const item *it, int n, const char *name, blob *b) {
    const char *v = get(it, n, name);
    memset(b, 0, sizeof *b);
    if (!v) return SAY("the manifest gives no %s", name), 0;
    b->ref = parse_ref(dir, v);
    b->data = read_file(b->ref.path, &b->len);
    if (!b->data) return SAY("cannot read %s", b->ref.path), 0;
    if (b->ref.dtype && b->len != b->ref.count * dtype_size(b->ref.dtype))
        return SAY("%s holds %zu bytes, the manifest says %zu", b->ref.path, b->len, b->ref.count * dtype_size(b->ref.dtype)), 0;
    return 1;
}

static void drop(blob *b) { free(b->data), free_ref(&b->ref); }

/* refused: the status is one of expect's statuses */
static int refused_ok(const case_t *c, int st) {
    for (int i = 0; i < c->n_expect; i++)
        if (strcmp(c->expect[i].key, "statuses") == 0 && strcmp(c->expect[i].val, status_name(st)) == 0) return 1;
    return 0;
}

/* One rule for ML_E_UNSUPPORTED, as `mlconf run` has it: "this library does not do that variant",
 * so the case is unsupported whatever it expects, a refusal included. `refusal`: a case whose input
 * must be refused (one of the expected statuses passes; `what` says what went wrong, followed by
 * the status); `not_ok`: a call that should have succeeded. */
static int refusal(const case_t *c, int st, const char *what) {
    if (st == ML_E_UNSUPPORTED) return SAY("ML_E_UNSUPPORTED"), UNSUPPORTED;
    if (refused_ok(c, st)) return PASS;
    return SAY("%s (%s)", what, status_name(st)), FAIL;
}

static int not_ok(int st, const char *fn) {
    if (st == ML_E_UNSUPPORTED) return SAY("%s: ML_E_UNSUPPORTED", fn), UNSUPPORTED;
    return SAY("%s returned %s", fn, status_name(st)), FAIL;
}

/* bit-exact: got (len bytes) against output `name` */
static int same_bytes(const char *name, const void *got, size_t len, const blob *want) {
    if (len != want->len) return SAY("%s: %zu bytes, expected %zu", name, len, want->len), 0;
    const uint8_t *g = got, *w = want->data;
    for (size_t i = 0; i < len; i++)
        if (g[i] != w[i]) return SAY("%s: byte %zu is %02x, expected %02x", name, i, g[i], w[i]), 0;
    return 1;
}

static int64_t ordered(float x) {
    int32_t i;
    memcpy(&i, &x, 4);
    return i < 0 ? -(int64_t)(i & 0x7FFFFFFF) : i;
}

/* toleranced: got against want (n floats, rows of `width`), compare.py's distances and within() */
static int within(const case_t *c, const float *got, const float *want, size_t n, size_t width, int cosine) {
    double se = 0, sw = 0, max_abs = 0, dot = 0, ng = 0, nw = 0;
    int64_t max_ulp = 0;
    size_t finite = 0, mismatch = 0;
    for (size_t i = 0; i < n; i++) {
        float g = got[i], w = want[i];
        if (!isfinite(g) || !isfinite(w)) {
            if (!((isnan(g) && isnan(w)) || (isinf(g) && g == w))) mismatch++;
            continue;
        }
        double e = (double)g - (double)w;
        se += e * e, sw += (double)w * (double)w, finite++;
        if (fabs(e) > max_abs) max_abs = fabs(e);
        int64_t u = llabs(ordered(g) - ordered(w));
        if (u > max_ulp) max_ulp = u;
        dot += (double)g * w, ng += (double)g * g, nw += (double)w * w;
    }
    double mse = finite ? se / (double)finite : 0, ms = finite ? sw / (double)finite : 0;
    double nmse = ms > 0 ? mse / ms : mse;
    size_t rows = width ? n / width : 0, agree = 0;
    for (size_t r = 0; r < rows; r++) {
        size_t ag = 0, aw = 0;
        for (size_t k = 1; k < width; k++) { /* NumPy's argmax: the first largest, NaN wins */
            if (got[r * width + k] > got[r * width + ag] || (isnan(got[r * width + k]) && !isnan(got[r * width + ag]))) ag = k;
            if (want[r * width + k] > want[r * width + aw] || (isnan(want[r * width + k]) && !isnan(want[r * width + aw]))) aw = k;
        }
        agree += ag == aw;
    }
    double argmax = rows ? (double)agree / (double)rows : 1.0;
    double cos = ng * nw > 0 ? dot / sqrt(ng * nw) : 1.0;
    const char *v;
    if (mismatch) return SAY("%zu non-finite values where the expectation differs", mismatch), 0;
    if ((v = get(c->expect, c->n_expect, "nmse")) && !(nmse <= atof(v))) return SAY("nmse %.3g > %s", nmse, v), 0;
    if ((v = get(c->expect, c->n_expect, "max_abs")) && !(max_abs <= atof(v)))
        return SAY("max_abs %.3g > %s", max_abs, v), 0;
    if ((v = get(c->expect, c->n_expect, "max_ulp")) && !((double)max_ulp <= atof(v)))
        return SAY("max_ulp %lld > %s", (long long)max_ulp, v), 0;
    if ((v = get(c->expect, c->n_expect, "argmax")) && width && !(argmax >= atof(v)))
        return SAY("argmax agreement %.3f < %s", argmax, v), 0;
    if (cosine && (v = get(c->expect, c->n_expect, "cosine")) && !(cos >= atof(v)))
        return SAY("cosine %.9g < %s", cos, v), 0;
    SAY("nmse %.3g, max_abs %.3g", nmse, max_abs);
    return 1;
}

/* ---------------------------------------------------------------- the ops */
/* A model, tokenizer or embedder the case needs did not open: unsupported if the library says so,
 * else an error (the case never reached its comparison) */
static int not_opened(const char *fn, int st, const char *reason) {
    SAY("%s: %s: %s", fn, status_name(st), reason);
    return st == ML_E_UNSUPPORTED ? UNSUPPORTED : ERROR;
}

#define NEED(fn)                                                   \
    do {                                                           \
        if (!(fn)) return SAY("the library has no %s", #fn), UNSUPPORTED; \
    } while (0)

static int op_status(const lib_t *L, const char *dir, const case_t *c) {
    const char *v = get(c->inputs, c->n_inputs, "path");
    if (!v) return SAY("no path"), ERROR;
    file_ref r = parse_ref(dir, v);
    char reason[512] = "", rule[128] = "";
    int st, has_rule = 0; /* the library names the rule behind its status (ml_check_rule) */
    if (strcmp(c->op, "ml_check") == 0) {
        if (L->check_rule) {
            st = L->check_rule(r.path, rule, sizeof rule, reason, sizeof reason), has_rule = 1;
        } else {
            NEED(L->check);
            st = L->check(r.path, reason, sizeof reason);
        }
    } else if (strcmp(c->op, "ml_embed_load") == 0) { /* a GGUF loader case */
        if (L->embed_check_rule) {
            st = L->embed_check_rule(r.path, rule, sizeof rule, reason, sizeof reason), has_rule = 1;
        } else {
            NEED(L->embed_load);
            ml_embedder *e = NULL;
            st = L->embed_load(r.path, 1, &e, reason, sizeof reason);
            if (e && L->embed_free) L->embed_free(e);
        }
    } else if (L->tok_check_rule) {
        st = L->tok_check_rule(r.path, (int32_t)arg(c, "model_vocab"), rule, sizeof rule, reason, sizeof reason);
        has_rule = 1;
    } else {
        NEED(L->tok_load);
        ml_tokenizer *t = NULL;
        st = L->tok_load(r.path, (int32_t)arg(c, "model_vocab"), &t, reason, sizeof reason);
        if (t && L->tok_free) L->tok_free(t);
    }
    free_ref(&r);
    if (st == ML_E_UNSUPPORTED) return SAY("%s", reason), UNSUPPORTED;
    const char *want = get(c->expect, c->n_expect, "status"), *want_rule = get(c->expect, c->n_expect, "rule");
    if (!want || strcmp(want, status_name(st)) != 0)
        return SAY("expected %s, got %s: %s", want ? want : "?", status_name(st), reason), FAIL;
    if (has_rule && want_rule && strcmp(want_rule, rule) != 0) /* the right status by another rule */
        return SAY("%s as expected, but by rule %s, not %s: %s", want, rule[0] ? rule : "(none)",
                   want_rule, reason), FAIL;
    return PASS;
}

static int op_quant(const lib_t *L, const char *dir, const case_t *c) {
    int q8 = strcmp(c->op, "ml_quantize_q8_0") == 0, f16 = (int)arg(c, "f16");
    if (q8)
        NEED(L->quantize_q8_0);
    else
        NEED(L->quantize_q4_0);
    blob x, imp = {0};
    if (!input(dir, c->inputs, c->n_inputs, "x", &x)) return drop(&x), ERROR;
    int has_imp = get(c->inputs, c->n_inputs, "importance") != NULL;
    if (has_imp && !input(dir, c->inputs, c->n_inputs, "importance", &imp)) return drop(&x), drop(&imp), ERROR;
    size_t n = x.ref.count, nb = n / 32;
    void *q = calloc(n ? n : 1, 1), *d = calloc(nb ? nb : 1, 4);
    int st = q8 ? L->quantize_q8_0(x.data, n, f16, q, d)
                : L->quantize_q4_0(x.data, (size_t)arg(c, "rows"), (size_t)arg(c, "cols"), (int)arg(c, "rule"), f16,
                                   has_imp ? imp.data : NULL, q, d);
    int out;
    if (strcmp(c->compare, "refused") == 0) {
        out = refusal(c, st, "the quantizer accepted an input it must refuse");
    } else if (st == ML_E_UNSUPPORTED) {
        out = UNSUPPORTED, SAY("ML_E_UNSUPPORTED");
    } else if (st != ML_OK) {
        out = FAIL, SAY("refused (%s) an input the spec quantizes", status_name(st));
    } else {
        blob wq, wd;
        int ok = input(dir, c->outputs, c->n_outputs, q8 ? "q" : "qs", &wq) && input(dir, c->outputs, c->n_outputs, "d", &wd);
        out = !ok ? ERROR : same_bytes("quants", q, q8 ? n : n / 2, &wq) &&
                                    same_bytes("scales", d, nb * (f16 ? 2 : 4), &wd)
                                ? PASS
                                : FAIL;
        drop(&wq), drop(&wd);
    }
    free(q), free(d), drop(&x);
    if (has_imp) drop(&imp);
    return out;
}

static int op_encode(const lib_t *L, const char *dir, const case_t *c) {
    NEED(L->tok_load);
    NEED(L->tok_encode);
    blob text, want;
    const char *tv = get(c->inputs, c->n_inputs, "tokenizer");
    if (!tv || !input(dir, c->inputs, c->n_inputs, "text", &text)) return ERROR;
    file_ref tr = parse_ref(dir, tv);
    ml_tokenizer *t = NULL;
    char reason[512] = "";
    int st = L->tok_load(tr.path, 0, &t, reason, sizeof reason), out = ERROR;
    free_ref(&tr);
    if (st != ML_OK) return drop(&text), not_opened("ml_tok_load", st, reason);
    size_t cap = text.len * 4 + 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    st = L->tok_encode(t, text.data, text.len, ids, cap, &n);
    if (st == ML_E_ARG && n > cap) {
        ids = realloc(ids, (cap = n) * sizeof *ids);
        st = L->tok_encode(t, text.data, text.len, ids, cap, &n);
    }
    if (st != ML_OK) {
        SAY("ml_tok_encode returned %s", status_name(st));
    } else if (input(dir, c->outputs, c->n_outputs, "ids", &want)) {
        size_t m = want.len / 4, i = 0;
        const int32_t *w = want.data;
        while (i < n && i < m && ids[i] == w[i]) i++;
        out = i == n && n == m ? PASS : FAIL;
        if (out == FAIL) SAY("ids differ first at position %zu of %zu (got %zu ids)", i, m, n);
        drop(&want);
    }
    free(ids), drop(&text);
    if (L->tok_free) L->tok_free(t);
    return out;
}

static int op_decode(const lib_t *L, const char *dir, const case_t *c) {
    NEED(L->tok_load);
    NEED(L->tok_decode);
    blob ids, want;
    const char *tv = get(c->inputs, c->n_inputs, "tokenizer");
    if (!tv || !input(dir, c->inputs, c->n_inputs, "ids", &ids)) return ERROR;
    if (!input(dir, c->outputs, c->n_outputs, "bytes", &want)) return drop(&ids), ERROR;
    file_ref tr = parse_ref(dir, tv);
    ml_tokenizer *t = NULL;
    char reason[512] = "";
    int st = L->tok_load(tr.path, 0, &t, reason, sizeof reason), out = ERROR;
    free_ref(&tr);
    if (st != ML_OK) return drop(&ids), drop(&want), not_opened("ml_tok_load", st, reason);
    size_t cap = want.len + 16, n = 0;
    char *got = malloc(cap);
    st = L->tok_decode(t, ids.data, ids.ref.count, got, cap, &n);
    if (st == ML_E_ARG && n > cap) {
        got = realloc(got, cap = n);
        st = L->tok_decode(t, ids.data, ids.ref.count, got, cap, &n);
    }
    if (st != ML_OK) SAY("ml_tok_decode returned %s", status_name(st)); /* an error, as in mlconf run */
    else out = same_bytes("decoded", got, n, &want) ? PASS : FAIL;
    free(got), drop(&ids), drop(&want);
    if (L->tok_free) L->tok_free(t);
    return out;
}

static int op_forward(const lib_t *L, const char *dir, const case_t *c) {
    NEED(L->load);
    NEED(L->forward);
    blob toks, want;
    const char *mv = get(c->inputs, c->n_inputs, "model");
    if (!mv || !input(dir, c->inputs, c->n_inputs, "tokens", &toks)) return ERROR;
    if (!input(dir, c->outputs, c->n_outputs, "logits", &want)) return drop(&toks), ERROR;
    file_ref mr = parse_ref(dir, mv);
    ml_model *m = NULL;
    char reason[512] = "";
    int st = L->load(mr.path, (int32_t)arg(c, "ctx"), 1, &m, reason, sizeof reason), out = ERROR;
    free_ref(&mr);
    if (st != ML_OK) return drop(&toks), drop(&want), not_opened("ml_load", st, reason);
    size_t n = toks.ref.count, vocab = (size_t)L->vocab(m), rows = 0;
    const int32_t *t = toks.data;
    float *got = calloc(n * vocab + 1, sizeof *got);
    int prefill = strcmp(get(c->args, c->n_args, "mode"), "prefill") == 0;
    for (size_t i = 0; i < (prefill ? 1 : n) && st == ML_OK; i++) {
        size_t k = prefill ? n : 1;
        st = L->forward(m, t + i, (int32_t)k, (int32_t)i, got + i * vocab);
        if (st == ML_OK) rows += k;
    }
    const char *after = get(c->expect, c->n_expect, "refused_after_rows");
    size_t want_rows = want.ref.ndim == 2 ? want.ref.shape[0] : 0;
    if (want.ref.ndim == 2 && want.ref.shape[1] != vocab && want_rows) {
        out = FAIL, SAY("vocab %zu, the expectation has %zu columns", vocab, want.ref.shape[1]);
    } else if (after ? !(st != ML_OK && refused_ok(c, st) && rows == want_rows) : st != ML_OK) {
        out = FAIL;
        SAY("expected %s; got %s after %zu logits rows", after ? "a refusal (decision forward.nonfinite)" : "logits",
            status_name(st), rows);
    } else {
        out = within(c, got, want.data, want_rows * vocab, vocab, 0) ? PASS : FAIL;
    }
    free(got), drop(&toks), drop(&want);
    L->free_model(m);
    return out;
}

static int op_i2s(const lib_t *L, const char *dir, const case_t *c) {
    size_t rows = (size_t)arg(c, "rows"), cols = (size_t)arg(c, "cols"), n = (size_t)arg(c, "n");
    int refused = strcmp(c->compare, "refused") == 0, st, out = ERROR;
    blob a, b = {0};
    if (strcmp(c->op, "ml_i2s_quantize") == 0) {
        NEED(L->i2s_quantize);
        if (!input(dir, c->inputs, c->n_inputs, "w", &a)) return ERROR;
        size_t len = rows * cols / 4 + 32;
        uint8_t *p = calloc(len, 1);
        st = L->i2s_quantize(a.data, rows, cols, p);
        if (refused) out = refusal(c, st, "accepted an input it must refuse");
        else if (st != ML_OK) out = not_ok(st, c->op);
        else if (input(dir, c->outputs, c->n_outputs, "payload", &b)) out = same_bytes("payload", p, len, &b) ? PASS : FAIL;
        free(p);
    } else if (strcmp(c->op, "ml_i2s_quantize_act") == 0) {
        NEED(L->i2s_quantize_act);
        if (!input(dir, c->inputs, c->n_inputs, "x", &a)) return ERROR;
        int8_t *q = calloc(rows * cols + 1, 1);
        float *scale = calloc(rows + 1, 4);
        int32_t *sum = calloc(rows + 1, 4);
        st = L->i2s_quantize_act(a.data, rows, cols, q, scale, sum);
        if (refused) out = refusal(c, st, "accepted an input it must refuse");
        else if (st != ML_OK) out = not_ok(st, c->op);
        else {
            blob wq, ws, wsum;
            int ok = input(dir, c->outputs, c->n_outputs, "q", &wq) && input(dir, c->outputs, c->n_outputs, "scale", &ws) &&
                     input(dir, c->outputs, c->n_outputs, "sum", &wsum);
            out = !ok ? ERROR
                      : same_bytes("q", q, rows * cols, &wq) && same_bytes("scale", scale, rows * 4, &ws) &&
                                same_bytes("sum", sum, rows * 4, &wsum)
                            ? PASS
                            : FAIL;
            drop(&wq), drop(&ws), drop(&wsum);
        }
        free(q), free(scale), free(sum);
    } else {
        NEED(L->i2s_matmul);
        if (!input(dir, c->inputs, c->n_inputs, "payload", &a)) return ERROR;
        blob x;
        if (!input(dir, c->inputs, c->n_inputs, "x", &x)) return drop(&a), ERROR;
        float *y = calloc(n * rows + 1, 4);
        /* the ABI takes no payload length: the caller checks it, as the harness does (specs/i2s.yaml
         * layout.reading) */
        if (cols % 128 == 0 && a.len != rows * cols / 4 + 32) st = ML_E_ARG;
        else st = L->i2s_matmul(a.data, rows, cols, x.data, n, y);
        if (refused) out = refusal(c, st, "accepted an input it must refuse");
        else if (st != ML_OK) out = not_ok(st, c->op);
        else if (input(dir, c->outputs, c->n_outputs, "y", &b)) out = same_bytes("y", y, n * rows * 4, &b) ? PASS : FAIL;
        free(y), drop(&x);
    }
    drop(&a);
    if (b.data) drop(&b);
    return out;
}

static int op_embed(const lib_t *L, const char *dir, const case_t *c) {
    NEED(L->embed_load);
    NEED(L->embed);
    const char *mv = get(c->inputs, c->n_inputs, "model");
    if (!mv) return SAY("no model"), ERROR;
    file_ref mr = parse_ref(dir, mv);
    int reading = (int)arg(c, "reading"), refused = strcmp(c->compare, "refused") == 0, out = ERROR;
    ml_embedder *e = NULL;
    char reason[512] = "";
    int st;
    if (reading) {
        NEED(L->embed_load_reading);
        st = L->embed_load_reading(mr.path, 1, reading, &e, reason, sizeof reason);
    } else {
        st = L->embed_load(mr.path, 1, &e, reason, sizeof reason);
    }
    free_ref(&mr);
    if (strcmp(c->op, "ml_embed_load") == 0) { /* a damaged file: the load must refuse it */
        if (e) L->embed_free(e);
        return refusal(c, st, "ml_embed_load accepted a file it must refuse");
    }
    if (st != ML_OK) return not_opened("ml_embed_load", st, reason);
    blob toks, want;
    if (!input(dir, c->inputs, c->n_inputs, "tokens", &toks)) return L->embed_free(e), ERROR;
    size_t dim = (size_t)L->embed_dim(e);
    float *got = calloc(dim + 1, 4);
    st = L->embed(e, toks.data, (int32_t)toks.ref.count, (int32_t)arg(c, "pooling"), (int32_t)arg(c, "normalize"), got);
    if (refused) out = refusal(c, st, "ml_embed accepted a call it must refuse");
    else if (st != ML_OK) out = not_ok(st, "ml_embed");
    else if (input(dir, c->outputs, c->n_outputs, "embedding", &want)) {
        out = want.ref.count != dim ? (SAY("dim %zu, expected %zu", dim, want.ref.count), FAIL)
              : within(c, got, want.data, dim, 0, 1) ? PASS : FAIL;
        drop(&want);
    }
    free(got), drop(&toks);
    L->embed_free(e);
    return out;
}

static int run_case(const lib_t *L, const char *dir, const case_t *c) {
    detail[0] = 0;
    if (strcmp(c->compare, "status") == 0) return op_status(L, dir, c);
    if (strncmp(c->op, "ml_quantize_", 12) == 0) return op_quant(L, dir, c);
    if (strcmp(c->op, "ml_tok_encode") == 0) return op_encode(L, dir, c);
    if (strcmp(c->op, "ml_tok_decode") == 0) return op_decode(L, dir, c);
    if (strcmp(c->op, "ml_forward") == 0) return op_forward(L, dir, c);
    if (strncmp(c->op, "ml_i2s_", 7) == 0) return op_i2s(L, dir, c);
    if (strncmp(c->op, "ml_embed", 8) == 0) return op_embed(L, dir, c);
    return SAY("unknown op %s", c->op), ERROR;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: jq -r -f manifest.jq DIR/manifest.json | %s DIR LIBRARY.so\n", argv[0]);
        return 4;
    }
    void *h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "replay: %s\n", dlerror());
        return 4;
    }
    lib_t L = open_lib(h);
    char *line = NULL;
    size_t cap = 0;
    int failing = 0, total = 0;
    while (getline(&line, &cap, stdin) > 0) {
        case_t c;
        if (!parse_line(line, &c)) {
            fprintf(stderr, "replay: a line that is not manifest.jq's: %.80s\n", line);
            return 4;
        }
        int out = run_case(&L, argv[1], &c);
        count(c.area, out);
        total++;
        if (out == FAIL || out == ERROR) failing++;
        if (out != PASS) printf("%s %s: %s\n", OUTCOME[out], c.id, detail); /* every case not passed */
    }
    free(line);
    printf("area pass fail unsupported error\n");
    for (int a = 0; a < n_areas; a++)
        printf("%s %d %d %d %d\n", areas[a], counts[a][PASS], counts[a][FAIL], counts[a][UNSUPPORTED], counts[a][ERROR]);
    printf("%d cases; %d failing\n", total, failing);
    return failing ? 1 : 0;
}
