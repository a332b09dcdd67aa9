/* gguf.c: the GGUF v2/v3 reader of gguf.h.
 *
 * Layout read (ggml docs/gguf.md): "GGUF" magic, u32 version, u64 tensor count, u64 kv count;
 * kv pairs (string key, u32 value type, value); tensor infos (string name, u32 n_dims, u64 dims,
 * u32 ggml type, u64 offset); padding to general.alignment; the data section. Strings are a u64
 * length and that many bytes. Every read goes through a cursor that checks the bytes left first,
 * with 64-bit overflow-checked arithmetic, so a count or length of any size is a truncated file,
 * never a wrapped size. Little-endian hosts only (x86-64, aarch64), as the rest of mlconf.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bitnet.h"

#define MAX_ARRAY_DEPTH 8

typedef struct {
    const uint8_t *base;
    uint64_t size, pos;
} cursor;

static const uint64_t value_size[GGUF_V_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static const char *const value_name[GGUF_V_COUNT] = {"u8",     "i8",    "u16", "i16", "u32", "i32", "f32",
                                                     "bool",   "string", "array", "u64", "i64", "f64"};

const char *gguf_type_name(uint32_t t) { return t < GGUF_V_COUNT ? value_name[t] : "?"; }

uint32_t gguf_rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

uint16_t gguf_rd_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

float gguf_rd_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Take n bytes: their address, or NULL when fewer are left. */
static const uint8_t *take(cursor *c, uint64_t n) {
    if (n > c->size - c->pos) return NULL;
    const uint8_t *p = c->base + c->pos;
    c->pos += n;
    return p;
}

static int take_u32(cursor *c, uint32_t *v) {
    const uint8_t *p = take(c, 4);
    if (!p) return 0;
    *v = gguf_rd_u32(p);
    return 1;
}

static int take_u64(cursor *c, uint64_t *v) {
    const uint8_t *p = take(c, 8);
    if (!p) return 0;
    *v = rd_u64(p);
    return 1;
}

static int take_str(cursor *c, gguf_str *s) {
    uint64_t n;
    if (!take_u64(c, &n)) return 0;
    const uint8_t *p = take(c, n);
    if (!p) return 0;
    s->ptr = (const char *)p;
    s->len = n;
    return 1;
}

int gguf_str_eq(gguf_str s, const char *z) {
    size_t n = strlen(z);
    return s.len == n && memcmp(s.ptr, z, n) == 0;
}

/* Skip one value of type t (arrays recursively, at most MAX_ARRAY_DEPTH deep). 1 on success,
 * 0 if truncated, -1 if the type is unknown or nesting too deep. */
static int skip_value(cursor *c, uint32_t t, int depth) {
    if (t >= GGUF_V_COUNT) return -1;
    if (t == GGUF_V_STRING) {
        gguf_str s;
        return take_str(c, &s);
    }
    if (t != GGUF_V_ARRAY) return take(c, value_size[t]) != NULL;
    if (depth >= MAX_ARRAY_DEPTH) return -1;
    uint32_t et;
    uint64_t n;
    if (!take_u32(c, &et) || !take_u64(c, &n)) return 0;
    if (et >= GGUF_V_COUNT) return -1;
    if (et != GGUF_V_STRING && et != GGUF_V_ARRAY) {
        bool ovf = false;
        uint64_t bytes = ml_mul_u64(n, value_size[et], &ovf);
        if (ovf) return 0;
        return take(c, bytes) != NULL;
    }
    for (uint64_t i = 0; i < n; i++) {
        /* each element takes at least 8 bytes: a count past the end fails within size/8 steps */
        int r = skip_value(c, et, depth + 1);
        if (r != 1) return r;
    }
    return 1;
}

__attribute__((format(printf, 4, 5)))
static int fail(const gguf_file *g, char *reason, size_t reason_len, const char *fmt, ...) {
    char what[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ml_reason(reason, reason_len, "%s: %s", g->path, what);
    return ML_E_FORMAT;
}

void gguf_close(gguf_file *g) {
    if (!g) return;
    free(g->kv);
    free(g->tensors);
    if (g->base) munmap((void *)g->base, g->size);
    memset(g, 0, sizeof *g);
}

/* Bytes of a tensor of a known type with these dims; 0 with *known = 0 for other types. */
static uint64_t tensor_bytes(const gguf_tensor *t, int *known, bool *ovf) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) n = ml_mul_u64(n, t->dims[d], ovf);
    *known = 1;
    switch (t->type) {
    case GGUF_TYPE_F32: return ml_mul_u64(n, 4, ovf);
    case GGUF_TYPE_F16: return ml_mul_u64(n, 2, ovf);
    case GGUF_TYPE_I2_S: return ml_add_u64(n / 4, I2S_TAIL, ovf); /* rows*cols/4 + 32 */
    default: *known = 0; return 0;
    }
}

static int str_cmp(const void *a, const void *b) {
    const gguf_str *x = *(const gguf_str *const *)a, *y = *(const gguf_str *const *)b;
    uint64_t n = x->len < y->len ? x->len : y->len;
    int r = n ? memcmp(x->ptr, y->ptr, (size_t)n) : 0;
    return r ? r : (x->len > y->len) - (x->len < y->len);
}

static const gguf_str dup_nomem;

/* The first name (in sorted order) that occurs twice among the keys, then among the tensor
 * names; NULL if none; &dup_nomem if the sort buffer cannot be allocated. Sorting: O(n log n)
 * even for a file of millions of tiny entries. */
static const gguf_str *first_duplicate(const gguf_file *g, const char **what) {
    uint64_t most = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
    const gguf_str **v = malloc((most ? (size_t)most : 1) * sizeof *v);
    if (!v) return &dup_nomem;
    const gguf_str *dup = NULL;
    for (int pass = 0; pass < 2 && !dup; pass++) {
        uint64_t n = pass ? g->n_tensors : g->n_kv;
        for (uint64_t i = 0; i < n; i++) v[i] = pass ? &g->tensors[i].name : &g->kv[i].key;
        qsort(v, (size_t)n, sizeof *v, str_cmp);
        for (uint64_t i = 1; i < n && !dup; i++)
            if (str_cmp(&v[i - 1], &v[i]) == 0) dup = v[i];
        *what = pass ? "tensor" : "key";
    }
    free(v);
    return dup;
}

static int parse(gguf_file *g, char *reason, size_t reason_len) {
    cursor c = {g->base, g->size, 0};
    const uint8_t *magic = take(&c, 4);
    if (!magic || memcmp(magic, "GGUF", 4) != 0)
        return fail(g, reason, reason_len, "not a GGUF file (magic is not \"GGUF\")");
    if (!take_u32(&c, &g->version)) return fail(g, reason, reason_len, "truncated header (version)");
    if (g->version != 2 && g->version != 3)
        return fail(g, reason, reason_len, "GGUF version %" PRIu32 " is not supported (2 or 3)", g->version);
    if (!take_u64(&c, &g->n_tensors) || !take_u64(&c, &g->n_kv))
        return fail(g, reason, reason_len, "truncated header (tensor and kv counts)");
    /* a kv pair takes at least 12 bytes, a tensor info at least 24: larger counts are truncation */
    if (g->n_kv > g->size / 12)
        return fail(g, reason, reason_len, "kv count %" PRIu64 " exceeds what the file can hold (truncated)", g->n_kv);
    if (g->n_tensors > g->size / 24)
        return fail(g, reason, reason_len, "tensor count %" PRIu64 " exceeds what the file can hold (truncated)",
                    g->n_tensors);
    g->kv = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        ml_reason(reason, reason_len, "%s: out of memory for %" PRIu64 " kv pairs and %" PRIu64 " tensors", g->path,
                  g->n_kv, g->n_tensors);
        return ML_E_NOMEM;
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        if (!take_str(&c, &kv->key) || !take_u32(&c, &kv->type))
            return fail(g, reason, reason_len, "truncated kv pair %" PRIu64 " (key)", i);
        if (kv->type >= GGUF_V_COUNT)
            return fail(g, reason, reason_len, "key %.*s has unknown value type %" PRIu32,
                        (int)(kv->key.len > 200 ? 200 : kv->key.len), kv->key.ptr, kv->type);
        kv->val = g->base + c.pos;
        if (kv->type == GGUF_V_ARRAY && c.size - c.pos >= 12) {
            kv->arr_type = gguf_rd_u32(kv->val);
            kv->arr_n = rd_u64(kv->val + 4);
        }
        int r = skip_value(&c, kv->type, 0);
        if (r != 1)
            return fail(g, reason, reason_len, "key %.*s: %s value", (int)(kv->key.len > 200 ? 200 : kv->key.len),
                        kv->key.ptr, r == 0 ? "truncated" : "unknown element type or arrays nested too deep in its");
        if (kv->type == GGUF_V_ARRAY) kv->val += 12;
    }
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = gguf_find_kv(g, "general.alignment");
    if (al) {
        int64_t a;
        if (!gguf_kv_int(al, &a) || a <= 0 || a > (1 << 30) || (a & (a - 1)))
            return fail(g, reason, reason_len, "general.alignment is not a power of two up to 2^30");
        g->alignment = (uint64_t)a;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        if (!take_str(&c, &t->name) || !take_u32(&c, &t->n_dims))
            return fail(g, reason, reason_len, "truncated tensor info %" PRIu64, i);
        int nl = (int)(t->name.len > 200 ? 200 : t->name.len);
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
            return fail(g, reason, reason_len, "tensor %.*s has %" PRIu32 " dimensions (1 to %d)", nl, t->name.ptr,
                        t->n_dims, GGUF_MAX_DIMS);
        for (uint32_t d = 0; d < t->n_dims; d++)
            if (!take_u64(&c, &t->dims[d]))
                return fail(g, reason, reason_len, "truncated tensor info of %.*s (dims)", nl, t->name.ptr);
        if (!take_u32(&c, &t->type) || !take_u64(&c, &t->offset))
            return fail(g, reason, reason_len, "truncated tensor info of %.*s (type, offset)", nl, t->name.ptr);
        if (t->offset % g->alignment)
            return fail(g, reason, reason_len, "tensor %.*s: offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                        nl, t->name.ptr, t->offset, g->alignment);
    }
    const char *what;
    const gguf_str *dup = first_duplicate(g, &what);
    if (dup == &dup_nomem) {
        ml_reason(reason, reason_len, "%s: out of memory", g->path);
        return ML_E_NOMEM;
    }
    if (dup) return fail(g, reason, reason_len, "duplicate %s %.*s", what, (int)(dup->len > 200 ? 200 : dup->len), dup->ptr);
    bool ovf = false;
    g->data_offset = ml_align_u64(c.pos, g->alignment, &ovf);
    if (ovf || g->data_offset > g->size)
        return fail(g, reason, reason_len, "truncated: the data section starts at %" PRIu64 ", past the end (%zu bytes)",
                    g->data_offset, g->size);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        int nl = (int)(t->name.len > 200 ? 200 : t->name.len);
        int known;
        ovf = false;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if (t->dims[d] == 0)
                return fail(g, reason, reason_len, "tensor %.*s has a zero dimension", nl, t->name.ptr);
        uint64_t nb = tensor_bytes(t, &known, &ovf);
        if (!known) continue;
        uint64_t end = ml_add_u64(ml_add_u64(g->data_offset, t->offset, &ovf), nb, &ovf);
        if (ovf)
            return fail(g, reason, reason_len, "truncated: tensor %.*s: its data size or end overflows 64 bits", nl,
                        t->name.ptr);
        if (end > g->size)
            return fail(g, reason, reason_len,
                        "truncated: tensor %.*s data (%" PRIu64 " bytes at data offset %" PRIu64 ") ends past the end "
                        "of the file (%zu bytes)",
                        nl, t->name.ptr, nb, t->offset, g->size);
        t->nbytes = nb;
        t->data = g->base + g->data_offset + t->offset;
    }
    return ML_OK;
}

int gguf_open(const char *path, gguf_file *g, char *reason, size_t reason_len) {
    memset(g, 0, sizeof *g);
    g->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);   /* a FIFO must not block: decision loader.special_files */
    if (fd < 0) {
        ml_reason(reason, reason_len, "%s: cannot open: %s", path, strerror(errno));
        return ML_E_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        ml_reason(reason, reason_len, "%s: cannot read: %s", path, strerror(e));
        return ML_E_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        ml_reason(reason, reason_len, "%s: cannot open: %s", path, ml_file_kind(st.st_mode));
        return ML_E_IO;
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        ml_reason(reason, reason_len, "%s: too large to map on this target", path);
        return ML_E_IO;
    }
    g->size = (size_t)st.st_size;
    if (g->size > 0) {
        void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            g->size = 0;
            ml_reason(reason, reason_len, "%s: cannot map: %s", path, strerror(e));
            return ML_E_IO;
        }
        g->base = m;
    }
    close(fd);
    int rc = parse(g, reason, reason_len);
    if (rc != ML_OK) gguf_close(g);
    return rc;
}

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.ptr && gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

/* One scalar of integer type t at p as int64: 1, or 0 (not an integer type, or a u64 >= 2^63). */
static int int_at(uint32_t t, const uint8_t *p, int64_t *out) {
    switch (t) {
    case GGUF_V_U8: case GGUF_V_BOOL: *out = p[0]; return 1;
    case GGUF_V_I8: *out = (int8_t)p[0]; return 1;
    case GGUF_V_U16: *out = gguf_rd_u16(p); return 1;
    case GGUF_V_I16: *out = (int16_t)gguf_rd_u16(p); return 1;
    case GGUF_V_U32: *out = gguf_rd_u32(p); return 1;
    case GGUF_V_I32: *out = (int32_t)gguf_rd_u32(p); return 1;
    case GGUF_V_U64: {
        uint64_t v = rd_u64(p);
        if (v > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)v;
        return 1;
    }
    case GGUF_V_I64: *out = (int64_t)rd_u64(p); return 1;
    default: return 0;
    }
}

int gguf_kv_int(const gguf_kv *kv, int64_t *out) {
    if (!kv || kv->type == GGUF_V_BOOL) return 0;
    return int_at(kv->type, kv->val, out);
}

int gguf_kv_float(const gguf_kv *kv, double *out) {
    if (!kv) return 0;
    if (kv->type == GGUF_V_F32) {
        *out = gguf_rd_f32(kv->val);
        return 1;
    }
    if (kv->type == GGUF_V_F64) {
        double d;
        memcpy(&d, kv->val, 8);
        *out = d;
        return 1;
    }
    return 0;
}

int gguf_kv_string(const gguf_kv *kv, gguf_str *out) {
    if (!kv || kv->type != GGUF_V_STRING) return 0;
    out->len = rd_u64(kv->val);
    out->ptr = (const char *)kv->val + 8;
    return 1;
}

int gguf_kv_array_int(const gguf_kv *kv, uint64_t i, int64_t *out) {
    if (!kv || kv->type != GGUF_V_ARRAY || i >= kv->arr_n) return 0;
    if (kv->arr_type >= GGUF_V_COUNT || kv->arr_type == GGUF_V_STRING || kv->arr_type == GGUF_V_ARRAY ||
        kv->arr_type == GGUF_V_F32 || kv->arr_type == GGUF_V_F64)
        return 0;
    return int_at(kv->arr_type, kv->val + i * value_size[kv->arr_type], out); /* in the file: skip_value checked */
}
