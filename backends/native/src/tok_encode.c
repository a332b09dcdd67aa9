/* tok_encode.c: the .mlt encoder and decoder, a port of backends/reference/tokenizer.py and
 * pretokenize.py (read those for the rules; the comments here say how the C follows them).
 *
 * Encoding: the UTF-8 input is decoded with Python's errors="replace" semantics (ml_utf8_decode)
 * and re-encoded, so everything below sees valid UTF-8. Added tokens are matched first (leftmost,
 * then longest, then lowest id); the segments between them are encoded by kind:
 *   kind 1 (SentencePiece): spaces -> U+2581 and the U+2581 prefix per flag 4, the whole segment is
 *     one BPE word whose symbols are its characters' plain tokens or byte-fallback tokens;
 *   kind 2 (byte-level): NFC (flag 8), the numeric split (flag 64, Digits), the Llama 3 or GPT-2 regex by
 *     hand (flags 16, 32), each piece's bytes a BPE word over the single-byte plain tokens,
 *     memoized in a per-tokenizer word cache.
 * BPE: a binary heap of (rank, position) over adjacent pairs and a linked list of live symbols,
 * stale entries skipped when popped (HF's Word::merge_all). Tables are open-addressing hash maps
 * built once at load time; an encode call allocates its scratch buffers once and grows them.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "unicode.h"
#include "util.h"

#define CACHE_SLOTS (1u << 17)      /* word cache: at most half full, then emptied */
#define CACHE_MAX_WORD 256          /* longer words are not cached */
#define MAX_TEXT ((size_t)1 << 29)  /* bytes of text: 3 * 2^29 + 3 symbols fit in int32 */
static const uint8_t SPIECE[3] = {0xE2, 0x96, 0x81};   /* U+2581 */

static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---------------------------------------------------------------- hashing */
static uint64_t mix64(uint64_t h) {
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 32;
    return h;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = mix64(h ^ v);
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return mix64(h ^ v ^ 0xff51afd7ed558ccdull);
}

static size_t pow2_above(size_t n) {
    size_t c = 16;
    while (c < 2 * n) c *= 2;
    return c;
}

/* ---------------------------------------------------------------- u64 -> u64 map (merges) */
static int hmap_init(ml_hmap *m, size_t n) {
    m->cap = pow2_above(n);
    m->count = 0;
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->vals = malloc(m->cap * sizeof *m->vals);
    return m->keys && m->vals ? ML_OK : ML_E_NOMEM;
}

static void hmap_put(ml_hmap *m, uint64_t key, uint64_t val) {   /* overwrites */
    size_t mask = m->cap - 1, i = (size_t)mix64(key) & mask;
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & mask;
    if (!m->keys[i]) m->count++;
    m->keys[i] = key;
    m->vals[i] = val;
}

static inline bool hmap_get(const ml_hmap *m, uint64_t key, uint64_t *val) {
    size_t mask = m->cap - 1, i = (size_t)mix64(key) & mask;
    while (m->keys[i]) {
        if (m->keys[i] == key) {
            *val = m->vals[i];
            return true;
        }
        i = (i + 1) & mask;
    }
    return false;
}

static inline uint64_t pair_key(uint32_t a, uint32_t b) { return ((uint64_t)a << 32 | b) + 1; }

/* ---------------------------------------------------------------- plain pieces by bytes */
static inline const uint8_t *piece(const ml_tokenizer *t, uint32_t id) { return t->data + t->tok_off[id]; }

static int32_t plain_get(const ml_tokenizer *t, const uint8_t *p, size_t n) {
    uint64_t h = hash_bytes(p, n);
    size_t mask = t->plain_cap - 1, i = (size_t)h & mask;
    while (t->plain_ids[i]) {
        uint32_t id = t->plain_ids[i] - 1;
        if (t->plain_hash[i] == h && t->tok_len[id] == n && memcmp(piece(t, id), p, n) == 0) return (int32_t)id;
        i = (i + 1) & mask;
    }
    return -1;
}

/* Strict UTF-8 (Python's bytes.decode("utf-8")): no overlongs, surrogates or values past U+10FFFF. */
static bool utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c < 0x80) { i++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return false;
        if (n - i <= k) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return false;
        i += k + 1;
    }
    return true;
}

static int added_cmp(const void *pa, const void *pb) {
    const ml_added *a = pa, *b = pb;
    if (a->text[0] != b->text[0]) return a->text[0] < b->text[0] ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

typedef struct {
    uint64_t *hash;             /* per slot; 0 with len UINT32_MAX: empty */
    uint32_t *koff, *klen, *ioff, *nids;
    uint8_t *keys;
    int32_t *ids;
    size_t count, keys_len, keys_cap, ids_len, ids_cap;
} word_cache;

static void cache_free(word_cache *c) {
    if (!c) return;
    free(c->hash);
    free(c->koff);
    free(c->klen);
    free(c->ioff);
    free(c->nids);
    free(c->keys);
    free(c->ids);
    free(c);
}

static void cache_clear(word_cache *c) {
    for (size_t i = 0; i < CACHE_SLOTS; i++) c->klen[i] = UINT32_MAX;
    c->count = c->keys_len = c->ids_len = 0;
}

static word_cache *cache_new(void) {
    word_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->hash = malloc(CACHE_SLOTS * sizeof *c->hash);
    c->koff = malloc(CACHE_SLOTS * sizeof *c->koff);
    c->klen = malloc(CACHE_SLOTS * sizeof *c->klen);
    c->ioff = malloc(CACHE_SLOTS * sizeof *c->ioff);
    c->nids = malloc(CACHE_SLOTS * sizeof *c->nids);
    c->keys_cap = 1 << 20;
    c->ids_cap = 1 << 18;
    c->keys = malloc(c->keys_cap);
    c->ids = malloc(c->ids_cap * sizeof *c->ids);
    if (!c->hash || !c->koff || !c->klen || !c->ioff || !c->nids || !c->keys || !c->ids) {
        cache_free(c);
        return NULL;
    }
    cache_clear(c);
    return c;
}

int ml_tok_build(ml_tokenizer *t) {
    for (int b = 0; b < 256; b++) t->byte_ids[b] = -1;
    size_t n_plain = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        if (t->tok_attr[i] == MLT_ATTR_PLAIN) n_plain++;
        if (t->tok_attr[i] == MLT_ATTR_ADDED) t->n_added++;
    }
    t->plain_cap = pow2_above(n_plain);
    t->plain_ids = calloc(t->plain_cap, sizeof *t->plain_ids);
    t->plain_hash = malloc(t->plain_cap * sizeof *t->plain_hash);
    t->added = malloc((t->n_added ? t->n_added : 1) * sizeof *t->added);
    if (!t->plain_ids || !t->plain_hash || !t->added || hmap_init(&t->pairs, t->n_merges) != ML_OK)
        return ML_E_NOMEM;
    size_t na = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        const uint8_t *p = piece(t, i);
        uint32_t n = t->tok_len[i];
        if (t->tok_attr[i] == MLT_ATTR_PLAIN) {
            if (plain_get(t, p, n) < 0) {   /* a piece listed twice keeps its lowest id */
                uint64_t h = hash_bytes(p, n);
                size_t mask = t->plain_cap - 1, s = (size_t)h & mask;
                while (t->plain_ids[s]) s = (s + 1) & mask;
                t->plain_ids[s] = i + 1;
                t->plain_hash[s] = h;
            }
            if (t->kind == MLT_KIND_BYTE_LEVEL && n == 1 && t->byte_ids[p[0]] < 0) t->byte_ids[p[0]] = (int32_t)i;
        } else if (t->tok_attr[i] == MLT_ATTR_BYTE) {
            if (n == 1 && t->byte_ids[p[0]] < 0) t->byte_ids[p[0]] = (int32_t)i;
        } else if (utf8_valid(p, n)) {   /* an added token that is not UTF-8 never matches */
            t->added[na++] = (ml_added){n, i, p};
        }
    }
    t->n_added = na;
    qsort(t->added, na, sizeof *t->added, added_cmp);
    for (int b = 0, k = 0; b <= 256; b++) {
        while ((size_t)k < na && t->added[k].text[0] < b) k++;
        t->added_first[b] = (uint32_t)k;
    }
    for (uint32_t r = 0; r < t->n_merges; r++) {   /* a pair listed twice takes its last rank */
        const uint8_t *m = t->merges + 12 * (size_t)r;
        uint32_t a = rd_u32(m), b = rd_u32(m + 4), c = rd_u32(m + 8);
        hmap_put(&t->pairs, pair_key(a, b), (uint64_t)r << 32 | c);
    }
    t->cache = cache_new();
    return t->cache ? ML_OK : ML_E_NOMEM;
}

void ml_tok_release(ml_tokenizer *t) {
    free(t->plain_ids);
    free(t->plain_hash);
    free(t->added);
    free(t->pairs.keys);
    free(t->pairs.vals);
    cache_free(t->cache);
    t->plain_ids = NULL;
    t->plain_hash = NULL;
    t->added = NULL;
    t->pairs.keys = t->pairs.vals = NULL;
    t->cache = NULL;
}

/* ---------------------------------------------------------------- scratch of one encode call */
typedef struct {
    uint32_t rank, pos, merged;
} heap_item;

typedef struct {
    const ml_tokenizer *t;
    bool nomem;
    int32_t *out;               /* the ids */
    size_t n_out, cap_out;
    int32_t *sym, *nxt, *prv;   /* BPE word */
    size_t cap_sym;
    heap_item *heap;
    size_t cap_heap;
    uint8_t *buf;               /* bytes of a word or an SP segment */
    size_t cap_buf;
    uint32_t *cps, *nfc;        /* code points of a segment, its NFC */
    size_t cap_nfc;
    uint8_t *cls;               /* classes of the code points of a part */
    size_t cap_cls;
} enc;

/* Grow *p to hold n elements of `size` bytes (at least doubling); false when out of memory. */
static bool grow(enc *e, void **p, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return true;
    bool of = false;
    size_t c = *cap ? *cap : 64;
    while (c < n) c = ml_mul_size(c, 2, &of);
    size_t bytes = ml_mul_size(c, size, &of);
    void *q = of ? NULL : realloc(*p, bytes);
    if (!q) {
        e->nomem = true;
        return false;
    }
    *p = q;
    *cap = c;
    return true;
}

static bool emit(enc *e, const int32_t *ids, size_t n) {
    if (n == 0) return true;   /* e->out may still be NULL: no pointer arithmetic on it (libFuzzer, UBSan) */
    if (!grow(e, (void **)&e->out, &e->cap_out, e->n_out + n, sizeof *e->out)) return false;
    memcpy(e->out + e->n_out, ids, n * sizeof *ids);
    e->n_out += n;
    return true;
}

/* ---------------------------------------------------------------- BPE */
static inline bool heap_less(heap_item a, heap_item b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(heap_item *h, size_t *n, heap_item x) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!heap_less(x, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], x = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = x;
    return top;
}

/* Merge e->sym[0..n) in place by rank (lowest, then leftmost); returns the symbols left, in
 * e->sym[0..). Each merge adds at most two heap entries, so the heap holds fewer than 3n. */
static size_t bpe(enc *e, size_t n) {
    if (n < 2) return n;
    const ml_hmap *pairs = &e->t->pairs;
    bool of = false;
    size_t hcap = ml_mul_size(n, 3, &of);
    if (of || !grow(e, (void **)&e->heap, &e->cap_heap, hcap, sizeof *e->heap)) {
        e->nomem = true;
        return 0;
    }
    int32_t *ids = e->sym, *nxt = e->nxt, *prv = e->prv;
    heap_item *heap = e->heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prv[i] = (int32_t)i - 1;
    }
    uint64_t v;
    for (size_t i = 0; i + 1 < n; i++)
        if (hmap_get(pairs, pair_key((uint32_t)ids[i], (uint32_t)ids[i + 1]), &v))
            heap_push(heap, &hn, (heap_item){(uint32_t)(v >> 32), (uint32_t)i, (uint32_t)v});
    while (hn) {
        heap_item it = heap_pop(heap, &hn);
        int32_t i = (int32_t)it.pos, j = nxt[i];
        if (ids[i] < 0 || j < 0 || !hmap_get(pairs, pair_key((uint32_t)ids[i], (uint32_t)ids[j]), &v) ||
            (uint32_t)v != it.merged)
            continue;   /* stale */
        ids[i] = (int32_t)it.merged;
        ids[j] = -1;
        int32_t k = nxt[j];
        nxt[i] = k;
        if (k >= 0) prv[k] = i;
        int32_t p = prv[i];
        if (p >= 0 && hmap_get(pairs, pair_key((uint32_t)ids[p], it.merged), &v))
            heap_push(heap, &hn, (heap_item){(uint32_t)(v >> 32), (uint32_t)p, (uint32_t)v});
        if (k >= 0 && hmap_get(pairs, pair_key(it.merged, (uint32_t)ids[k]), &v))
            heap_push(heap, &hn, (heap_item){(uint32_t)(v >> 32), (uint32_t)i, (uint32_t)v});
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0) ids[m++] = ids[i];
    return m;
}

static bool sym_room(enc *e, size_t n) {
    size_t c = e->cap_sym;
    if (!grow(e, (void **)&e->sym, &c, n, sizeof *e->sym)) return false;
    size_t c2 = e->cap_sym;
    if (!grow(e, (void **)&e->nxt, &c2, n, sizeof *e->nxt)) return false;
    size_t c3 = e->cap_sym;
    if (!grow(e, (void **)&e->prv, &c3, n, sizeof *e->prv)) return false;
    e->cap_sym = c;
    return true;
}

/* ---------------------------------------------------------------- kind 2: one pre-token word */
static void word(enc *e, const uint8_t *w, size_t n) {
    const ml_tokenizer *t = e->t;
    word_cache *c = t->cache;
    uint64_t h = 0;
    size_t slot = 0;
    bool cacheable = n <= CACHE_MAX_WORD;
    if (cacheable) {
        h = hash_bytes(w, n);
        size_t mask = CACHE_SLOTS - 1;
        slot = (size_t)h & mask;
        while (c->klen[slot] != UINT32_MAX) {
            if (c->hash[slot] == h && c->klen[slot] == n && memcmp(c->keys + c->koff[slot], w, n) == 0) {
                emit(e, c->ids + c->ioff[slot], c->nids[slot]);
                return;
            }
            slot = (slot + 1) & mask;
        }
    }
    size_t m;
    int32_t whole = (t->flags & MLT_FLAG_IGNORE_MERGES) ? plain_get(t, w, n) : -1;
    if (!sym_room(e, n ? n : 1)) return;
    if (whole >= 0) {
        e->sym[0] = whole;
        m = 1;
    } else {
        m = 0;
        for (size_t i = 0; i < n; i++)
            if (t->byte_ids[w[i]] >= 0) e->sym[m++] = t->byte_ids[w[i]];
        m = bpe(e, m);
        if (e->nomem) return;
    }
    emit(e, e->sym, m);
    if (!cacheable) return;
    if (c->count >= CACHE_SLOTS / 2 || c->keys_len + n > c->keys_cap || c->ids_len + m > c->ids_cap) {
        cache_clear(c);   /* bounds memory only; then find the slot again */
        slot = (size_t)h & (CACHE_SLOTS - 1);
    }
    memcpy(c->keys + c->keys_len, w, n);
    memcpy(c->ids + c->ids_len, e->sym, m * sizeof *e->sym);
    c->hash[slot] = h;
    c->klen[slot] = (uint32_t)n;
    c->koff[slot] = (uint32_t)c->keys_len;
    c->ioff[slot] = (uint32_t)c->ids_len;
    c->nids[slot] = (uint32_t)m;
    c->keys_len += n;
    c->ids_len += m;
    c->count++;
}

/* ---------------------------------------------------------------- kind 2: the pre-tokenizer */
/* Classes of ASCII (unicode_classes.py): letters, digits, White_Space 09..0D and 20. */
static inline int uc_class(uint32_t cp) {
    if (cp < 128) {
        if ((cp | 32) - 'a' < 26) return ML_UC_LETTER;
        if (cp - '0' < 10) return ML_UC_NUMBER;
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return ML_UC_SPACE;
        return ML_UC_OTHER;
    }
    return ml_uc_class(cp);
}

static inline bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

static size_t run(const uint8_t *k, size_t n, size_t i, int cls) {
    while (i < n && k[i] == cls) i++;
    return i;
}

/* 's|'t|'re|'ve|'m|'ll|'d at i (case-insensitive with fold, where U+017F folds to s): the end, or
 * (size_t)-1. */
static size_t contraction(const uint32_t *t, size_t n, size_t i, bool fold) {
    static const char *const SUFFIX[7] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (t[i] != '\'') return (size_t)-1;
    for (int s = 0; s < 7; s++) {
        size_t j = i + 1;
        const char *p = SUFFIX[s];
        for (; *p; p++, j++) {
            if (j >= n) break;
            uint32_t c = t[j], want = (uint32_t)*p;
            bool ok = c == want || (fold && (c == want - 32 || (want == 's' && c == 0x17F)));
            if (!ok) break;
        }
        if (!*p) return j;
    }
    return (size_t)-1;
}

static size_t space_tail(const uint8_t *k, size_t n, size_t i) {
    size_t e = run(k, n, i, ML_UC_SPACE);
    if (e == n || e - i == 1) return e;
    return e - 1;
}

static size_t llama3(const uint32_t *t, const uint8_t *k, size_t n, size_t i, size_t max_digits) {
    uint32_t c = t[i];
    int kc = k[i];
    size_t j = contraction(t, n, i, true);
    if (j != (size_t)-1) return j;
    if (kc == ML_UC_LETTER) return run(k, n, i, ML_UC_LETTER);
    if (kc != ML_UC_NUMBER && !is_crlf(c) && i + 1 < n && k[i + 1] == ML_UC_LETTER)
        return run(k, n, i + 1, ML_UC_LETTER);
    if (kc == ML_UC_NUMBER) {
        j = i + 1;
        while (j < n && j - i < max_digits && k[j] == ML_UC_NUMBER) j++;
        return j;
    }
    j = c == ' ' ? i + 1 : i;
    if (j < n && k[j] == ML_UC_OTHER) {
        j = run(k, n, j, ML_UC_OTHER);
        while (j < n && is_crlf(t[j])) j++;
        return j;
    }
    size_t e = run(k, n, i, ML_UC_SPACE);
    for (size_t q = e; q > i; q--)
        if (is_crlf(t[q - 1])) return q;
    return space_tail(k, n, i);
}

static size_t gpt2(const uint32_t *t, const uint8_t *k, size_t n, size_t i) {
    size_t j = contraction(t, n, i, false);
    if (j != (size_t)-1) return j;
    j = t[i] == ' ' && i + 1 < n ? i + 1 : i;
    int kc = k[j];
    if (kc != ML_UC_SPACE) return run(k, n, j, kc);
    return space_tail(k, n, i);
}

/* The pieces of t[0..n) under the tokenizer's regex, each a word. */
static void split_words(enc *e, const uint32_t *t, const uint8_t *k, size_t n) {
    uint32_t fl = e->t->flags;
    size_t i = 0;
    while (i < n && !e->nomem) {
        size_t j = (fl & MLT_FLAG_GPT2_REGEX) ? gpt2(t, k, n, i)
                                              : llama3(t, k, n, i, (fl & MLT_FLAG_SINGLE_DIGITS) ? 1 : 3);
        /* the piece's UTF-8 bytes (at most 4 per code point; e->buf holds 4 * the segment) */
        size_t b = 0;
        for (size_t q = i; q < j; q++) {
            uint32_t cp = t[q];
            if (cp < 0x80) e->buf[b++] = (uint8_t)cp;
            else b += ml_utf8_encode(cp, e->buf + b);
        }
        word(e, e->buf, b);
        i = j;
    }
}

static void encode_byte_level(enc *e, const uint32_t *cps, size_t n) {
    const uint32_t *t = cps;
    if (e->t->flags & MLT_FLAG_NFC) {
        bool of = false;
        size_t need = ml_mul_size(n, 3, &of);
        if (of || !grow(e, (void **)&e->nfc, &e->cap_nfc, need ? need : 1, sizeof *e->nfc)) {
            e->nomem = true;
            return;
        }
        n = ml_uc_nfc(cps, n, e->nfc, need);
        t = e->nfc;
    }
    bool of = false;
    if (!grow(e, (void **)&e->cls, &e->cap_cls, n ? n : 1, 1) ||
        !grow(e, (void **)&e->buf, &e->cap_buf, ml_mul_size(n ? n : 1, 4, &of), 1) || of) {
        e->nomem = true;
        return;
    }
    for (size_t i = 0; i < n; i++) e->cls[i] = (uint8_t)uc_class(t[i]);
    if (!(e->t->flags & MLT_FLAG_INDIVIDUAL_DIGITS)) {
        split_words(e, t, e->cls, n);
        return;
    }
    size_t start = 0;   /* every numeric character (Digits) a part of its own, the runs between whole */
    for (size_t i = 0; i < n; i++) {
        if (t[i] < 128 ? t[i] - '0' >= 10 : !ml_uc_numeric(t[i])) continue;
        if (start < i) split_words(e, t + start, e->cls + start, i - start);
        split_words(e, t + i, e->cls + i, 1);
        start = i + 1;
    }
    if (start < n) split_words(e, t + start, e->cls + start, n - start);
}

/* ---------------------------------------------------------------- kind 1 */
static size_t utf8_len(uint8_t lead) {
    return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

/* seg[0..n): valid UTF-8; at_start: the segment is at offset 0 of the text. */
static void encode_sp(enc *e, const uint8_t *seg, size_t n, bool at_start) {
    const ml_tokenizer *t = e->t;
    bool of = false;
    size_t cap = ml_add_size(ml_mul_size(n, 3, &of), 3, &of);
    if (of || !grow(e, (void **)&e->buf, &e->cap_buf, cap, 1)) {
        e->nomem = true;
        return;
    }
    uint8_t *s = e->buf;
    size_t m = 0;
    bool starts_spiece = n > 0 && (seg[0] == ' ' || (n >= 3 && memcmp(seg, SPIECE, 3) == 0));
    if (!(t->flags & MLT_FLAG_PREFIX_FIRST_ONLY) || (at_start && !starts_spiece)) {
        memcpy(s, SPIECE, 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (seg[i] == ' ') {
            memcpy(s + m, SPIECE, 3);
            m += 3;
        } else {
            s[m++] = seg[i];
        }
    }
    if (t->flags & MLT_FLAG_IGNORE_MERGES) {
        int32_t whole = plain_get(t, s, m);
        if (whole >= 0) {
            emit(e, &whole, 1);
            return;
        }
    }
    if (!sym_room(e, m ? m : 1)) return;
    size_t ns = 0;
    for (size_t i = 0; i < m;) {
        size_t cl = utf8_len(s[i]);
        int32_t id = plain_get(t, s + i, cl);
        if (id >= 0) {
            e->sym[ns++] = id;
        } else {   /* byte fallback: all of its bytes or nothing */
            size_t q = 0;
            while (q < cl && t->byte_ids[s[i + q]] >= 0) q++;
            if (q == cl)
                for (q = 0; q < cl; q++) e->sym[ns++] = t->byte_ids[s[i + q]];
        }
        i += cl;
    }
    ns = bpe(e, ns);
    if (!e->nomem) emit(e, e->sym, ns);
}

/* ---------------------------------------------------------------- the entry points */
static void enc_free(enc *e) {
    free(e->out);
    free(e->sym);
    free(e->nxt);
    free(e->prv);
    free(e->heap);
    free(e->buf);
    free(e->cps);
    free(e->nfc);
    free(e->cls);
}

/* The segment of clean text u[a..b) (code points cps[ca..cb)). */
static void segment(enc *e, const uint8_t *u, size_t a, size_t b, const uint32_t *cps, size_t ca, size_t cb) {
    if (a >= b) return;
    if (e->t->kind == MLT_KIND_SP) encode_sp(e, u + a, b - a, a == 0);
    else encode_byte_level(e, cps + ca, cb - ca);
}

ML_API int ml_tok_encode(const ml_tokenizer *t, const char *text, size_t len, int32_t *ids, size_t cap,
                         size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!t || !n_out || (!text && len) || (!ids && cap)) return ML_E_ARG;
    if (len > MAX_TEXT) return ML_E_ARG;   /* symbol positions are int32 */
    enc e = {.t = t};
    bool of = false;
    size_t n1 = len ? len : 1;
    uint32_t *cps = malloc(ml_mul_size(n1, sizeof *cps, &of));
    uint8_t *u = NULL;
    if (!of && cps) u = malloc(ml_mul_size(n1, 4, &of));
    if (of || !cps || !u) {
        free(cps);
        free(u);
        return ML_E_NOMEM;
    }
    e.cps = cps;
    /* Decode (errors="replace") and re-encode: u is valid UTF-8, 1..4 bytes per code point. */
    size_t ncp = len ? ml_utf8_decode((const uint8_t *)text, len, cps, NULL) : 0, nu = 0;
    for (size_t i = 0; i < ncp; i++) {
        if (cps[i] < 0x80) u[nu++] = (uint8_t)cps[i];
        else nu += ml_utf8_encode(cps[i], u + nu);
    }
    if (t->flags & MLT_FLAG_ADD_BOS) emit(&e, &t->bos, 1);
    /* Added tokens: leftmost, then longest, then lowest id. */
    size_t i = 0, ci = 0, start = 0, cstart = 0;
    while (i < nu && !e.nomem) {
        uint8_t b0 = u[i];
        const ml_added *hit = NULL;
        for (uint32_t k = t->added_first[b0]; k < t->added_first[b0 + 1]; k++) {
            const ml_added *a = &t->added[k];
            if (a->len <= nu - i && memcmp(u + i, a->text, a->len) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i += utf8_len(b0);
            ci++;
            continue;
        }
        segment(&e, u, start, i, cps, cstart, ci);
        int32_t id = (int32_t)hit->id;
        emit(&e, &id, 1);
        for (uint32_t q = 0; q < hit->len; q++) ci += (hit->text[q] & 0xC0) != 0x80;
        i += hit->len;
        start = i;
        cstart = ci;
    }
    if (!e.nomem) segment(&e, u, start, nu, cps, cstart, ncp);
    free(u);
    int rc = ML_OK;
    if (e.nomem) {
        rc = ML_E_NOMEM;
    } else {
        *n_out = e.n_out;   /* the first cap ids are written either way */
        size_t k = e.n_out < cap ? e.n_out : cap;
        if (k) memcpy(ids, e.out, k * sizeof *ids);
        if (e.n_out > cap) rc = ML_E_ARG;
    }
    enc_free(&e);
    return rc;
}

/* Kind 1: U+2581 in plain pieces is a space, one leading space is stripped; byte tokens are their
 * byte, added tokens their stored bytes. */
ML_API int ml_tok_decode(const ml_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap,
                         size_t *len_out) {
    if (len_out) *len_out = 0;
    if (!t || !len_out || (!ids && n) || (!out && cap)) return ML_E_ARG;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_vocab) return ML_E_ARG;
    bool sp = t->kind == MLT_KIND_SP, skip = false;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = (uint32_t)ids[i];
        const uint8_t *p = piece(t, id);
        size_t len = t->tok_len[id];
        bool repl = sp && t->tok_attr[id] == MLT_ATTR_PLAIN;
        for (size_t q = 0; q < len;) {
            uint8_t c = p[q];
            size_t step = 1;
            if (repl && len - q >= 3 && memcmp(p + q, SPIECE, 3) == 0) {
                c = ' ';
                step = 3;
            }
            if (w == 0 && !skip && sp && c == ' ') {
                skip = true;   /* the leading space */
            } else {
                if (w < cap) out[w] = (char)c;
                w++;
            }
            skip = true;
            q += step;
        }
    }
    *len_out = w;
    return w > cap ? ML_E_ARG : ML_OK;
}
