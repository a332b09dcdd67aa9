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

/* Skip one value of type t: strings by length, arrays of fixed-size elements in one step, arrays of
 * strings or arrays element by element with an explicit stack (no recursion: at most
 * GGUF_MAX_ARRAY_DEPTH levels, gguf.nesting). NULL on success, else the rule broken (what: the
 * field). An element count past the end fails within size/8 steps: each element takes 8 bytes. */
static const char *skip_value(cursor *c, uint32_t t, const char **what) {
    struct { uint32_t type; uint64_t left; } stack[GGUF_MAX_ARRAY_DEPTH];
    int depth = 0;
    if (t >= GGUF_V_COUNT) return *what = "value type", "gguf.value_type";
    for (;;) {
        if (t == GGUF_V_STRING) {
            gguf_str s;
            if (!take_str(c, &s)) return *what = "string", "gguf.truncated";
        } else if (t == GGUF_V_ARRAY) {
            if (depth >= GGUF_MAX_ARRAY_DEPTH) return *what = "arrays nested more than 8 deep", "gguf.nesting";
            uint32_t et;
            uint64_t n;
            if (!take_u32(c, &et) || !take_u64(c, &n)) return *what = "array header", "gguf.truncated";
            if (et >= GGUF_V_COUNT) return *what = "array element type", "gguf.array_type";
            if (et != GGUF_V_STRING && et != GGUF_V_ARRAY) {
                bool ovf = false;
                uint64_t bytes = ml_mul_u64(n, value_size[et], &ovf);
                if (ovf || !take(c, bytes)) return *what = "array elements", "gguf.truncated";
            } else {
                stack[depth].type = et, stack[depth].left = n;
                depth++;
            }
        } else if (!take(c, value_size[t])) {
            return *what = "value", "gguf.truncated";
        }
        while (depth && stack[depth - 1].left == 0) depth--;
        if (!depth) return NULL;
        stack[depth - 1].left--;
        t = stack[depth - 1].type;
    }
}

__attribute__((format(printf, 5, 6)))
static int fail(const gguf_file *g, char *reason, size_t reason_len, const char *rule, const char *fmt, ...) {
    char what[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ml_reason(reason, reason_len, "%s: %s [%s]", g->path, what, rule);
    ((gguf_file *)g)->rule = rule;
    return ML_E_FORMAT;
}

void gguf_close(gguf_file *g) {
    if (!g) return;
    free(g->kv);
    free(g->tensors);
    if (g->base) munmap((void *)g->base, g->size);
    memset(g, 0, sizeof *g);
}

/* ggml's tensor types (specs/gguf.yaml `types`): values per block and bytes per block; 0 for an id
 * that is not a type (removed or never assigned). I2_S (36) is bitnet.cpp's: rows*cols/4 bytes and
 * a 32-byte tail. */
static const struct { uint16_t block, bytes; } type_size[] = {
    [0] = {1, 4},      [1] = {1, 2},      [2] = {32, 18},    [3] = {32, 20},   [6] = {32, 22},
    [7] = {32, 24},    [8] = {32, 34},    [9] = {32, 40},    [10] = {256, 84}, [11] = {256, 110},
    [12] = {256, 144}, [13] = {256, 176}, [14] = {256, 210}, [15] = {256, 292}, [16] = {256, 66},
    [17] = {256, 74},  [18] = {256, 98},  [19] = {256, 50},  [20] = {32, 18},  [21] = {256, 110},
    [22] = {256, 82},  [23] = {256, 136}, [24] = {1, 1},     [25] = {1, 2},    [26] = {1, 4},
    [27] = {1, 8},     [28] = {1, 8},     [29] = {256, 56},  [30] = {1, 2},    [34] = {256, 54},
    [35] = {256, 66},  [36] = {4, 1},     [39] = {32, 17},   [40] = {64, 36},  [41] = {128, 18}, [42] = {64, 18},
};
#define N_TYPES (sizeof type_size / sizeof type_size[0])

int gguf_type_block(uint32_t type, uint32_t *block, uint32_t *bytes) {
    if (type >= N_TYPES || !type_size[type].block) return 0;
    *block = type_size[type].block, *bytes = type_size[type].bytes;
    return 1;
}

static int str_cmp(const void *a, const void *b) {
    const gguf_str *x = *(const gguf_str *const *)a, *y = *(const gguf_str *const *)b;
    uint64_t n = x->len < y->len ? x->len : y->len;
    int r = n ? memcmp(x->ptr, y->ptr, (size_t)n) : 0;
    return r ? r : (x->len > y->len) - (x->len < y->len);
}

/* The name that occurs twice among n names (the one met second in file order: the reference's
 * report), NULL if none; *nomem when the sort buffer cannot be allocated. O(n log n). */
static const gguf_str *duplicate(const gguf_str *first, size_t stride, uint64_t n, int *nomem) {
    *nomem = 0;
    if (n < 2) return NULL;
    const gguf_str **v = malloc((size_t)n * sizeof *v);
    if (!v) return *nomem = 1, NULL;
    for (uint64_t i = 0; i < n; i++) v[i] = (const gguf_str *)((const char *)first + i * stride);
    qsort(v, (size_t)n, sizeof *v, str_cmp);
    const gguf_str *dup = NULL;
    for (uint64_t i = 1; i < n; i++)
        if (str_cmp(&v[i - 1], &v[i]) == 0) {
            const gguf_str *later = v[i - 1] > v[i] ? v[i - 1] : v[i]; /* the second in file order */
            if (!dup || later < dup) dup = later;
        }
    free(v);
    return dup;
}

#define SHOWN(s) (int)((s).len > 200 ? 200 : (s).len), (s).ptr

static int parse(gguf_file *g, char *reason, size_t reason_len) {
    cursor c = {g->base, g->size, 0};
    const uint8_t *magic = take(&c, 4);
    if (!magic || memcmp(magic, "GGUF", 4) != 0)
        return fail(g, reason, reason_len, "gguf.magic", "not a GGUF file (magic is not \"GGUF\")");
    if (!take_u32(&c, &g->version)) return fail(g, reason, reason_len, "gguf.truncated", "truncated header (version)");
    if (g->version != 2 && g->version != 3)
        return fail(g, reason, reason_len, "gguf.version", "GGUF version %" PRIu32 " is not supported (2 or 3)",
                    g->version);
    if (!take_u64(&c, &g->n_tensors) || !take_u64(&c, &g->n_kv))
        return fail(g, reason, reason_len, "gguf.truncated", "truncated header (tensor and kv counts)");
    /* each pair takes at least 13 bytes, each tensor info 32: larger counts cannot be in the file,
     * and the tables below are then O(file size) */
    bool ovf = false;
    uint64_t least = ml_add_u64(ml_add_u64(24, ml_mul_u64(g->n_kv, 13, &ovf), &ovf), ml_mul_u64(g->n_tensors, 32, &ovf),
                                &ovf);
    if (ovf || least > g->size)
        return fail(g, reason, reason_len, "gguf.counts",
                    "%" PRIu64 " kv pairs and %" PRIu64 " tensors cannot fit in the file (%zu bytes)", g->n_kv,
                    g->n_tensors, g->size);
    g->kv = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        ml_reason(reason, reason_len, "%s: out of memory for %" PRIu64 " kv pairs and %" PRIu64 " tensors", g->path,
                  g->n_kv, g->n_tensors);
        return ML_E_NOMEM;
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        uint64_t n;
        if (!take_u64(&c, &n)) return fail(g, reason, reason_len, "gguf.truncated", "truncated kv pair %" PRIu64, i);
        if (n < 1 || n > GGUF_MAX_KEY)
            return fail(g, reason, reason_len, "gguf.key", "key of kv pair %" PRIu64 " is %" PRIu64 " bytes long (1 to %d)",
                        i, n, GGUF_MAX_KEY);
        const uint8_t *p = take(&c, n);
        if (!p) return fail(g, reason, reason_len, "gguf.truncated", "truncated kv pair %" PRIu64 " (key)", i);
        if (memchr(p, 0, (size_t)n)) /* a C reader would read it as the part before the NUL */
            return fail(g, reason, reason_len, "gguf.key", "key of kv pair %" PRIu64 " has a NUL byte", i);
        if (!take_u32(&c, &kv->type))
            return fail(g, reason, reason_len, "gguf.truncated", "truncated kv pair %" PRIu64 " (key)", i);
        kv->key.ptr = (const char *)p, kv->key.len = n;
        kv->val = g->base + c.pos;
        if (kv->type == GGUF_V_ARRAY && c.size - c.pos >= 12) {
            kv->arr_type = gguf_rd_u32(kv->val);
            kv->arr_n = rd_u64(kv->val + 4);
        }
        const char *what, *rule = skip_value(&c, kv->type, &what);
        if (rule)
            return fail(g, reason, reason_len, rule, "key %.*s: %s (value type %" PRIu32 ")", SHOWN(kv->key), what,
                        kv->type);
        if (kv->type == GGUF_V_ARRAY) kv->val += 12;
    }
    int nomem;
    const gguf_str *dup = duplicate(&g->kv[0].key, sizeof *g->kv, g->n_kv, &nomem);
    if (!nomem && dup) return fail(g, reason, reason_len, "gguf.duplicate_key", "key %.*s occurs twice", SHOWN(*dup));
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = nomem ? NULL : gguf_find_kv(g, "general.alignment");
    if (al) {
        uint32_t a = al->type == GGUF_V_U32 ? gguf_rd_u32(al->val) : 0;
        if (!a || (a & (a - 1)))
            return fail(g, reason, reason_len, "gguf.alignment",
                        "general.alignment (%s) is not a u32 power of two", gguf_type_name(al->type));
        g->alignment = a;
    }
    for (uint64_t i = 0; i < g->n_tensors && !nomem; i++) {
        gguf_tensor *t = &g->tensors[i];
        uint64_t n;
        if (!take_u64(&c, &n)) return fail(g, reason, reason_len, "gguf.truncated", "truncated tensor info %" PRIu64, i);
        if (n < 1 || n > GGUF_MAX_NAME)
            return fail(g, reason, reason_len, "gguf.tensor.name",
                        "name of tensor info %" PRIu64 " is %" PRIu64 " bytes long (1 to %d)", i, n, GGUF_MAX_NAME);
        const uint8_t *p = take(&c, n);
        if (!p) return fail(g, reason, reason_len, "gguf.truncated", "truncated tensor info %" PRIu64, i);
        if (memchr(p, 0, (size_t)n))
            return fail(g, reason, reason_len, "gguf.tensor.name", "name of tensor info %" PRIu64 " has a NUL byte", i);
        if (!take_u32(&c, &t->n_dims))
            return fail(g, reason, reason_len, "gguf.truncated", "truncated tensor info %" PRIu64, i);
        t->name.ptr = (const char *)p, t->name.len = n;
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
            return fail(g, reason, reason_len, "gguf.tensor.n_dims", "tensor %.*s has %" PRIu32 " dimensions (1 to %d)",
                        SHOWN(t->name), t->n_dims, GGUF_MAX_DIMS);
        for (uint32_t d = 0; d < t->n_dims; d++)
            if (!take_u64(&c, &t->dims[d]))
                return fail(g, reason, reason_len, "gguf.truncated", "truncated tensor info of %.*s (dims)",
                            SHOWN(t->name));
        if (!take_u32(&c, &t->type) || !take_u64(&c, &t->offset))
            return fail(g, reason, reason_len, "gguf.truncated", "truncated tensor info of %.*s (type, offset)",
                        SHOWN(t->name));
        uint32_t block, bytes;
        if (!gguf_type_block(t->type, &block, &bytes))
            return fail(g, reason, reason_len, "gguf.tensor.type", "tensor %.*s has type %" PRIu32 ", not a ggml type",
                        SHOWN(t->name), t->type);
        if (t->dims[0] % block)
            return fail(g, reason, reason_len, "gguf.tensor.block",
                        "tensor %.*s: dims[0] %" PRIu64 " is not a multiple of its type's block %" PRIu32,
                        SHOWN(t->name), t->dims[0], block);
        uint64_t els = 1;
        ovf = false;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            els = ml_mul_u64(els, t->dims[d], &ovf);
            if (ovf || t->dims[d] >> 63 || els >> 63)
                return fail(g, reason, reason_len, "gguf.tensor.size",
                            "tensor %.*s: the element count overflows 63 bits", SHOWN(t->name));
        }
        t->nbytes = t->type == GGUF_TYPE_I2_S ? els / 4 + I2S_TAIL : ml_mul_u64(els / block, bytes, &ovf);
        if (ovf || t->nbytes >> 63)
            return fail(g, reason, reason_len, "gguf.tensor.size", "tensor %.*s: its byte size overflows 63 bits",
                        SHOWN(t->name));
        if (t->offset % g->alignment)
            return fail(g, reason, reason_len, "gguf.tensor.offset_aligned",
                        "tensor %.*s: offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, SHOWN(t->name),
                        t->offset, g->alignment);
    }
    if (!nomem) dup = duplicate(&g->tensors[0].name, sizeof *g->tensors, g->n_tensors, &nomem);
    if (nomem) {
        ml_reason(reason, reason_len, "%s: out of memory", g->path);
        return ML_E_NOMEM;
    }
    if (dup) return fail(g, reason, reason_len, "gguf.duplicate_tensor", "tensor %.*s occurs twice", SHOWN(*dup));
    g->data_offset = ml_align_u64(c.pos, g->alignment, &ovf); /* c.pos <= size, alignment <= 2^31: no overflow */
    uint64_t want = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        if (t->offset != want)
            return fail(g, reason, reason_len, "gguf.tensor.layout",
                        "tensor %.*s is at data offset %" PRIu64 "; the tensors before it end at %" PRIu64
                        " (each at the next multiple of %" PRIu64 ", in order)",
                        SHOWN(t->name), t->offset, want, g->alignment);
        ovf = false;
        uint64_t end = ml_add_u64(ml_add_u64(g->data_offset, t->offset, &ovf), t->nbytes, &ovf);
        if (ovf || end > g->size)
            return fail(g, reason, reason_len, "gguf.tensor.bounds",
                        "tensor %.*s data (%" PRIu64 " bytes at data offset %" PRIu64 ") ends past the end "
                        "of the file (%zu bytes)",
                        SHOWN(t->name), t->nbytes, t->offset, g->size);
        t->data = g->base + g->data_offset + t->offset;
        want = ml_align_u64(t->offset + t->nbytes, g->alignment, &ovf); /* <= size + alignment */
    }
    return ML_OK;
}

int gguf_open(const char *path, gguf_file *g, const char **rule, char *reason, size_t reason_len) {
    memset(g, 0, sizeof *g);
    g->path = path;
    *rule = "gguf.io.open";
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
    *rule = rc == ML_OK ? "" : g->rule ? g->rule : "";
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
