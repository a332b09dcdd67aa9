/* tok_load.c: read and validate an .mlt tokenizer (specs/mlt.yaml).
 *
 * The checks are the rules of specs/mlt.yaml, in the spec's order: the first failing rule decides
 * the status, and the reason names the file, the field and the rule id, as the reference loader
 * (backends/reference/mlt.py) does. The file is read whole into memory; every read below is
 * bounds-checked against its size in 64-bit arithmetic (a u32 length cannot wrap an offset), and
 * each rule reads only what the rules before it made safe to read: the header once the file holds
 * 32 bytes, the token records once they are inside the file, the merges once they are.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer.h"
#include "util.h"

#define HEADER_SIZE 32
#define RECORD_HEAD 5           /* u8 attr, u32 len */
#define MERGE_SIZE 12
#define FLAGS_ALL 0x7Fu
static const uint32_t KIND_FLAGS[3] = {0, 1 | 2 | 4, 1 | 2 | 8 | 16 | 32 | 64};   /* flags[].kinds */


/* ---------------------------------------------------------------- reading the file */
static int read_file(const ml_report *r, uint8_t **out, size_t *size) {
    int fd;
    struct stat st;
    int rc = ml_open_regular(r, &fd, &st);
    if (rc != ML_OK) return rc;
    bool too_big = false;
    size_t n = ml_size_of_u64((uint64_t)st.st_size, &too_big);
    uint8_t *buf = too_big ? NULL : malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return ml_fail(r, ML_E_NOMEM, "io.open", "cannot allocate %lld bytes", (long long)st.st_size);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return ml_fail(r, ML_E_IO, "io.open", "cannot read %zu bytes: %s", n,
                        k < 0 ? strerror(e) : "the file shrank while read");
        }
        got += (size_t)k;
    }
    close(fd);
    *out = buf;
    *size = n;
    return ML_OK;
}

/* ---------------------------------------------------------------- the rules, in order */
static int check_header(const ml_report *r, const uint8_t *d, size_t size, int32_t model_vocab,
                        ml_tokenizer *t) {
    if (size == 0) return ml_fail(r, ML_E_FORMAT, "format.empty", "the file is empty");
    if (size < HEADER_SIZE)
        return ml_fail(r, ML_E_FORMAT, "format.short_header", "the file has %zu bytes, shorter than the "
                    "32-byte header", size);
    if (memcmp(d, "MLT1", 4) != 0)
        return ml_fail(r, ML_E_FORMAT, "format.magic", "magic is %02x %02x %02x %02x, expected \"MLT1\"",
                    d[0], d[1], d[2], d[3]);
    uint32_t version = ml_rd_u32(d + 4);
    t->kind = ml_rd_u32(d + 8);
    t->n_vocab = ml_rd_u32(d + 12);
    t->n_merges = ml_rd_u32(d + 16);
    t->bos = (int32_t)ml_rd_u32(d + 20);
    t->eos = (int32_t)ml_rd_u32(d + 24);
    t->flags = ml_rd_u32(d + 28);
    if (version != 1)
        return ml_fail(r, ML_E_FORMAT, "format.version", "header field version (offset 4) = %" PRIu32
                    ", only version 1 is defined", version);
    if (t->kind != MLT_KIND_SP && t->kind != MLT_KIND_BYTE_LEVEL)
        return ml_fail(r, ML_E_FORMAT, "format.kind", "header field kind (offset 8) = %" PRIu32
                    " is not 1 (SentencePiece) or 2 (byte-level)", t->kind);
    if (t->flags & ~FLAGS_ALL)
        return ml_fail(r, ML_E_FORMAT, "format.flags.unknown", "header field flags (offset 28) = %#" PRIx32
                    " sets unknown bits %#" PRIx32, t->flags, t->flags & ~FLAGS_ALL);
    uint32_t extra = t->flags & ~KIND_FLAGS[t->kind];
    if (extra)
        return ml_fail(r, ML_E_FORMAT, "format.flags.kind", "header field flags (offset 28) = %#" PRIx32
                    ": bits %#" PRIx32 " do not apply to kind %" PRIu32, t->flags, extra, t->kind);
    if ((t->flags & MLT_FLAG_SINGLE_DIGITS) && (t->flags & MLT_FLAG_GPT2_REGEX))
        return ml_fail(r, ML_E_FORMAT, "format.flags.kind", "header field flags (offset 28): flag 16 (single "
                    "digits) applies to the Llama 3 regex, not to flag 32 (GPT-2)");
    if ((t->flags & MLT_FLAG_ADD_BOS) && t->bos == -1)
        return ml_fail(r, ML_E_FORMAT, "format.add_bos_without_bos", "flag 1 (prepend BOS) with header field "
                    "bos = -1");
    if (model_vocab > 0 && t->n_vocab > (uint32_t)model_vocab)
        return ml_fail(r, ML_E_SHAPE, "shape.n_vocab_model", "header field n_vocab (offset 12) = %" PRIu32
                    " is above the model's vocab %" PRId32, t->n_vocab, model_vocab);
    const char *names[2] = {"bos", "eos"};
    int32_t vals[2] = {t->bos, t->eos};
    for (int k = 0; k < 2; k++)
        if (vals[k] < -1 || (int64_t)vals[k] >= (int64_t)t->n_vocab)
            return ml_fail(r, ML_E_SHAPE, "shape.special_range", "header field %s = %" PRId32 " is outside "
                        "-1 .. n_vocab - 1 = %" PRId64, names[k], vals[k], (int64_t)t->n_vocab - 1);
    return ML_OK;
}

/* format.token_overrun: walk the records (reading nothing past the end), then record where
 * each token's bytes are. Returns the offset after the last record in *end. */
static int walk_tokens(const ml_report *r, ml_tokenizer *t, size_t *end) {
    const uint8_t *d = t->data;
    uint64_t off = HEADER_SIZE, size = t->size;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        if (off + RECORD_HEAD > size)
            return ml_fail(r, ML_E_FORMAT, "format.token_overrun", "token %" PRIu32 ": its record header at "
                        "offset %" PRIu64 " runs past the end (%" PRIu64 " bytes)", i, off, size);
        uint32_t n = ml_rd_u32(d + off + 1);
        if (off + RECORD_HEAD + n > size)
            return ml_fail(r, ML_E_FORMAT, "format.token_overrun", "token %" PRIu32 ": length %" PRIu32
                        " at offset %" PRIu64 " runs past the end (%" PRIu64 " bytes)", i, n, off + 1, size);
        off += RECORD_HEAD + (uint64_t)n;
    }
    /* Every record is inside the file, so n_vocab <= size / 5 and the tables fit in memory. */
    size_t nv = t->n_vocab ? t->n_vocab : 1;
    t->tok_off = malloc(nv * sizeof *t->tok_off);
    t->tok_len = malloc(nv * sizeof *t->tok_len);
    t->tok_attr = malloc(nv);
    if (!t->tok_off || !t->tok_len || !t->tok_attr)
        return ml_fail(r, ML_E_NOMEM, "format.token_overrun", "cannot allocate the tables of %" PRIu32
                    " tokens", t->n_vocab);
    size_t o = HEADER_SIZE;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        t->tok_attr[i] = d[o];
        t->tok_len[i] = ml_rd_u32(d + o + 1);
        t->tok_off[i] = o + RECORD_HEAD;
        o += RECORD_HEAD + t->tok_len[i];
    }
    *end = o;
    return ML_OK;
}

static int check_tokens(const ml_report *r, const ml_tokenizer *t) {
    for (uint32_t i = 0; i < t->n_vocab; i++)
        if (t->tok_attr[i] > MLT_ATTR_BYTE)
            return ml_fail(r, ML_E_FORMAT, "format.token_attr", "token %" PRIu32 " (record at offset %zu): attr "
                        "%u is not 0, 1 or 2", i, t->tok_off[i] - RECORD_HEAD, t->tok_attr[i]);
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        if (t->tok_attr[i] != MLT_ATTR_BYTE) continue;
        if (t->kind == MLT_KIND_BYTE_LEVEL)
            return ml_fail(r, ML_E_FORMAT, "format.byte_token", "token %" PRIu32 " (record at offset %zu): a "
                        "byte token (attr 2) in a byte-level tokenizer", i, t->tok_off[i] - RECORD_HEAD);
        if (t->tok_len[i] != 1)
            return ml_fail(r, ML_E_FORMAT, "format.byte_token", "token %" PRIu32 " (record at offset %zu): a "
                        "byte token (attr 2) of length %" PRIu32 ", not 1", i, t->tok_off[i] - RECORD_HEAD,
                        t->tok_len[i]);
    }
    for (uint32_t i = 0; i < t->n_vocab; i++)
        if (t->tok_len[i] == 0)
            return ml_fail(r, ML_E_FORMAT, "format.empty_token", "token %" PRIu32 " (record at offset %zu): "
                        "length 0", i, t->tok_off[i] - RECORD_HEAD);
    return ML_OK;
}

static int check_merges(const ml_report *r, ml_tokenizer *t, size_t base) {
    uint64_t need = (uint64_t)base + (uint64_t)MERGE_SIZE * t->n_merges;
    if (need > t->size)
        return ml_fail(r, ML_E_FORMAT, "format.merges_truncated", "the %" PRIu32 " merge records (header field "
                    "n_merges, offset 16) end at %" PRIu64 ", the file has %zu bytes", t->n_merges, need,
                    t->size);
    const uint8_t *m = t->data + base;
    for (uint32_t k = 0; k < t->n_merges; k++) {
        uint32_t a = ml_rd_u32(m + 12 * (size_t)k), b = ml_rd_u32(m + 12 * (size_t)k + 4);
        uint32_t c = ml_rd_u32(m + 12 * (size_t)k + 8);
        if (a >= t->n_vocab || b >= t->n_vocab || c >= t->n_vocab)
            return ml_fail(r, ML_E_FORMAT, "format.merge_id", "merge %" PRIu32 " = (%" PRIu32 ", %" PRIu32
                        ", %" PRIu32 ") names a token id >= n_vocab = %" PRIu32, k, a, b, c, t->n_vocab);
    }
    for (uint32_t k = 0; k < t->n_merges; k++) {
        uint32_t a = ml_rd_u32(m + 12 * (size_t)k), b = ml_rd_u32(m + 12 * (size_t)k + 4);
        uint32_t c = ml_rd_u32(m + 12 * (size_t)k + 8);
        uint64_t la = t->tok_len[a], lb = t->tok_len[b];
        if (t->tok_len[c] != la + lb || memcmp(t->data + t->tok_off[c], t->data + t->tok_off[a], la) != 0 ||
            memcmp(t->data + t->tok_off[c] + la, t->data + t->tok_off[b], lb) != 0)
            return ml_fail(r, ML_E_FORMAT, "format.merge_concat", "merge %" PRIu32 ": token %" PRIu32 " is not "
                        "token %" PRIu32 " + token %" PRIu32, k, c, a, b);
    }
    if (need != t->size)
        return ml_fail(r, ML_E_FORMAT, "format.trailing_bytes", "%" PRIu64 " bytes after the last merge (at %"
                    PRIu64 ")", (uint64_t)t->size - need, need);
    t->merges = m;
    return ML_OK;
}

static void tok_destroy(ml_tokenizer *t) {
    ml_tok_release(t);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_attr);
    free(t->data);
    free(t);
}

/* ml_tok_load and ml_tok_check_rule (out NULL: validate only). */
static int tok_open(const char *path, int32_t model_vocab, ml_tokenizer **out, char *rule, size_t rule_len,
                    char *reason, size_t reason_len) {
    ml_report rep = {path ? path : "(null)", reason, reason_len, rule, rule_len};
    ml_reason(rule, rule_len, "%s", "");
    if (out) *out = NULL;
    if (!path) return ml_fail(&rep, ML_E_ARG, "io.open", "no path");
    ml_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return ml_fail(&rep, ML_E_NOMEM, "io.open", "out of memory");
    int rc = read_file(&rep, &t->data, &t->size);
    size_t end = 0;
    if (rc == ML_OK) rc = check_header(&rep, t->data, t->size, model_vocab, t);
    if (rc == ML_OK) rc = walk_tokens(&rep, t, &end);
    if (rc == ML_OK) rc = check_tokens(&rep, t);
    if (rc == ML_OK) rc = check_merges(&rep, t, end);
    if (rc == ML_OK && out) {
        rc = ml_tok_build(t);
        if (rc != ML_OK) ml_fail(&rep, rc, "io.open", "cannot allocate the encoder tables");
    }
    if (rc != ML_OK || !out) {
        tok_destroy(t);
        if (rc == ML_OK) ml_reason(reason, reason_len, "%s: accepted", rep.path);
        return rc;
    }
    ml_reason(reason, reason_len, "%s: accepted", rep.path);
    *out = t;
    return ML_OK;
}

ML_API int ml_tok_load(const char *path, int32_t model_vocab, ml_tokenizer **out, char *reason,
                       size_t reason_len) {
    return tok_open(path, model_vocab, out, NULL, 0, reason, reason_len);
}

ML_API int ml_tok_check_rule(const char *path, int32_t model_vocab, char *rule, size_t rule_len, char *reason,
                             size_t reason_len) {
    return tok_open(path, model_vocab, NULL, rule, rule_len, reason, reason_len);
}

ML_API void ml_tok_free(ml_tokenizer *t) {
    if (t) tok_destroy(t);
}
