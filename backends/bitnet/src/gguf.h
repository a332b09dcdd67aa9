/* gguf.h: a read-only GGUF v2/v3 reader over mmap (the bitnet runtime's only file format).
 *
 * gguf_open maps the file and checks every gguf.* rule of specs/gguf.yaml in its reading order:
 * the header, every key-value pair (all GGUF value types; arrays of strings and nested arrays are
 * measured with a bounded stack, never by recursion), the alignment, every tensor info (type,
 * block, sizes without overflow, aligned offset), then each tensor's data: in order, each at the
 * next multiple of the alignment, inside the file. Every length, count and offset is 64-bit and
 * overflow-checked against the file size, so nothing here reads past the end of the map, and the
 * tables it allocates are O(file size) (gguf.counts). Strings point into the map and are not
 * NUL-terminated (ptr + len).
 */
#ifndef MLBITNET_GGUF_H
#define MLBITNET_GGUF_H

#include <stddef.h>
#include <stdint.h>

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_KEY 65535       /* bytes of a key (docs/gguf.md) */
#define GGUF_MAX_NAME 63         /* bytes of a tensor name (ggml GGML_MAX_NAME 64, NUL included) */
#define GGUF_MAX_ARRAY_DEPTH 8   /* levels of arrays in one value */

/* ggml tensor types this runtime reads */
#define GGUF_TYPE_F32 0
#define GGUF_TYPE_F16 1
#define GGUF_TYPE_I2_S 36 /* BitNet ternary: rows*cols/4 packed bytes + 32-byte tail (specs/i2s.yaml) */

/* GGUF metadata value types */
enum {
    GGUF_V_U8 = 0, GGUF_V_I8, GGUF_V_U16, GGUF_V_I16, GGUF_V_U32, GGUF_V_I32, GGUF_V_F32, GGUF_V_BOOL,
    GGUF_V_STRING, GGUF_V_ARRAY, GGUF_V_U64, GGUF_V_I64, GGUF_V_F64, GGUF_V_COUNT
};

typedef struct {
    const char *ptr;
    uint64_t len;
} gguf_str;

typedef struct {
    gguf_str key;
    uint32_t type;       /* GGUF_V_* */
    const uint8_t *val;  /* scalars: the value's bytes (little endian, maybe unaligned); strings:
                          * the u64 length; arrays: the first element */
    uint32_t arr_type;   /* arrays: the element type */
    uint64_t arr_n;      /* arrays: the element count */
} gguf_kv;

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t dims[GGUF_MAX_DIMS]; /* ggml order: dims[0] is the row length (cols) */
    uint32_t type;
    uint64_t offset;              /* from the start of the data section */
    uint64_t nbytes;              /* the data size (I2_S: rows*cols/4 + 32), checked inside the file */
    const uint8_t *data;          /* base + data_offset + offset */
} gguf_tensor;

typedef struct {
    const char *path;
    const uint8_t *base; /* the map (NULL for an empty file) */
    size_t size;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;
    const char *rule;    /* while parsing: the rule a failure broke */
} gguf_file;

/* Map and parse `path` into *g (zeroed first). ML_OK, ML_E_IO (cannot open / map: rule
 * gguf.io.open), ML_E_FORMAT (a gguf.* rule), ML_E_NOMEM; *rule the id of the rule broken ("" when
 * accepted or out of memory); the reason names the file, the field and the rule. On failure *g
 * holds nothing to free. */
int gguf_open(const char *path, gguf_file *g, const char **rule, char *reason, size_t reason_len);
/* Values per block and bytes per block of ggml tensor type `type`: 1, or 0 if it is not a type. */
int gguf_type_block(uint32_t type, uint32_t *block, uint32_t *bytes);
void gguf_close(gguf_file *g);

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);
const char *gguf_type_name(uint32_t value_type); /* "u32", "string", ... ("?" if unknown) */

/* Scalar readers: 1 with *out set when the kv holds a value of a compatible type (any integer
 * type for gguf_kv_int when the value fits in int64; f32/f64 for gguf_kv_float), else 0. */
int gguf_kv_int(const gguf_kv *kv, int64_t *out);
int gguf_kv_float(const gguf_kv *kv, double *out);
/* A string value: 1 and *out, else 0. */
int gguf_kv_string(const gguf_kv *kv, gguf_str *out);
/* Element i of an array of bool or integers as int64: 1 and *out, else 0. */
int gguf_kv_array_int(const gguf_kv *kv, uint64_t i, int64_t *out);

int gguf_str_eq(gguf_str s, const char *z);

/* Unaligned little-endian loads from the map. */
uint32_t gguf_rd_u32(const uint8_t *p);
float gguf_rd_f32(const uint8_t *p);
uint16_t gguf_rd_u16(const uint8_t *p);

#endif
