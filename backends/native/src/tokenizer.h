/* tokenizer.h: the loaded .mlt tokenizer (tok_load.c) and what its encoder and decoder
 * (tok_encode.c) build from it at load time: hash tables of the plain pieces and the merges, the
 * added tokens by first byte, the single-byte symbols and a per-word cache. */
#ifndef MLRT_TOKENIZER_H
#define MLRT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "mlrt.h"

enum { MLT_KIND_SP = 1, MLT_KIND_BYTE_LEVEL = 2 };
enum { MLT_ATTR_PLAIN = 0, MLT_ATTR_ADDED = 1, MLT_ATTR_BYTE = 2 };
enum {
    MLT_FLAG_ADD_BOS = 1, MLT_FLAG_IGNORE_MERGES = 2, MLT_FLAG_PREFIX_FIRST_ONLY = 4, MLT_FLAG_NFC = 8,
    MLT_FLAG_SINGLE_DIGITS = 16, MLT_FLAG_GPT2_REGEX = 32, MLT_FLAG_INDIVIDUAL_DIGITS = 64,
};

/* Open-addressing hash table from a 64-bit key to a 64-bit value (key 0 is never stored; the
 * callers' keys are nonzero by construction). Capacity a power of two, at most half full. */
typedef struct {
    uint64_t *keys;
    uint64_t *vals;
    size_t cap, count;
} ml_hmap;

typedef struct {
    uint32_t len, id;           /* bytes of the text, token id */
    const uint8_t *text;
} ml_added;

struct ml_tokenizer {
    uint8_t *data;              /* the whole file */
    size_t size;
    uint32_t kind, n_vocab, n_merges, flags;
    int32_t bos, eos;
    size_t *tok_off;            /* each token's bytes: data + tok_off[i], tok_len[i] bytes */
    uint32_t *tok_len;
    uint8_t *tok_attr;
    const uint8_t *merges;      /* n_merges records of three u32 */
    /* encoder tables (tok_encode.c) */
    uint32_t *plain_ids;        /* plain pieces by bytes: id + 1 per slot (0: empty), lowest id */
    uint64_t *plain_hash;       /* the hash of the slot's piece */
    size_t plain_cap;           /* a power of two */
    ml_hmap pairs;              /* (left << 32 | right) + 1 -> rank << 32 | merged */
    int32_t byte_ids[256];      /* single-byte symbols, -1 if none */
    ml_added *added;            /* sorted by first byte, then longest first, then lowest id */
    size_t n_added;
    uint32_t added_first[257];  /* added[added_first[b] .. added_first[b+1]) start with byte b */
    void *cache;                /* the word cache (tok_encode.c), mutable behind const */
};

int ml_tok_build(struct ml_tokenizer *t);      /* tok_encode.c: the encoder tables; ML_E_NOMEM */
void ml_tok_release(struct ml_tokenizer *t);   /* tok_encode.c: frees what ml_tok_build made */

#endif
