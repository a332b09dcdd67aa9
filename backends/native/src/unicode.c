/* unicode.c: the Unicode of the native tokenizer (unicode.h): character classes, UTF-8 with
 * Python's errors="replace" semantics, and NFC. The data is unicode_tables.h, rendered from
 * specs/unicode.json by tools/gen_unicode_tables.py (build.py runs it); Hangul syllables are
 * decomposed and composed algorithmically (Unicode 3.12).
 */
#include "unicode.h"

#include "unicode_tables.h"

/* ------------------------------------------------------------------ classes */
int ml_uc_code(uint32_t cp) {
    if (cp > 0x10FFFF) return ML_UC_OTHER;
    size_t lo = 0, hi = ML_UC_CLASS_RUNS;  /* the last run whose start <= cp: start[0] = 0 */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (ml_uc_class_start[mid] <= cp) lo = mid;
        else hi = mid;
    }
    return ml_uc_class_code[lo];
}

const char *ml_uc_version(void) { return ML_UC_VERSION; }

/* ------------------------------------------------------------------ UTF-8 */
/* The valid range of the second byte after a lead byte (Unicode Table 3-7); 0 for bytes that
 * cannot start a sequence. */
static int utf8_len(uint8_t b, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80) return 1;
    if (b < 0xC2) return 0;
    if (b < 0xE0) return 2;
    if (b < 0xF0) {
        if (b == 0xE0) *lo = 0xA0;
        else if (b == 0xED) *hi = 0x9F;  /* no surrogates */
        return 3;
    }
    if (b < 0xF5) {
        if (b == 0xF0) *lo = 0x90;
        else if (b == 0xF4) *hi = 0x8F;  /* nothing above U+10FFFF */
        return 4;
    }
    return 0;
}

size_t ml_utf8_decode(const uint8_t *s, size_t len, uint32_t *out, size_t *offs) {
    size_t i = 0, n = 0;
    while (i < len) {
        size_t start = i;
        uint8_t b = s[i], lo, hi;
        uint32_t cp;
        if (b < 0x80) {
            cp = b;
            i++;
        } else {
            int need = utf8_len(b, &lo, &hi);
            cp = 0xFFFD;
            i++;
            if (need > 0) {
                /* Take continuation bytes while they are valid: a maximal subpart of an
                 * ill-formed sequence is one U+FFFD (what CPython's decoder does). */
                uint32_t v = b & (0x7F >> need);
                int got = 1;
                while (got < need && i < len && s[i] >= lo && s[i] <= hi) {
                    v = (v << 6) | (s[i] & 0x3F);
                    i++;
                    got++;
                    lo = 0x80;
                    hi = 0xBF;
                }
                if (got == need) cp = v;
            }
        }
        out[n] = cp;
        if (offs) offs[n] = start;
        n++;
    }
    return n;
}

size_t ml_utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | ((cp >> 18) & 0x07));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* ------------------------------------------------------------------ NFC */
enum {
    S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7,
    L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT,
};

static int ccc(uint32_t cp) {
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = ML_UC_CCC_RUNS;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < ml_uc_ccc[mid].first) hi = mid;
        else if (cp > ml_uc_ccc[mid].last) lo = mid + 1;
        else return ml_uc_ccc[mid].ccc;
    }
    return 0;
}

/* The full canonical decomposition of cp into d (1..4 code points). */
static unsigned decompose(uint32_t cp, uint32_t d[ML_UC_DECOMP_MAX]) {
    d[0] = cp;
    if (cp < ML_UC_NFC_FAST_BELOW) return 1;
    if (cp - S_BASE < S_COUNT) {
        uint32_t s = cp - S_BASE;
        d[0] = L_BASE + s / N_COUNT;
        d[1] = V_BASE + (s % N_COUNT) / T_COUNT;
        if (s % T_COUNT == 0) return 2;
        d[2] = T_BASE + s % T_COUNT;
        return 3;
    }
    size_t lo = 0, hi = ML_UC_DECOMPS;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ml_uc_decomp[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    if (lo == ML_UC_DECOMPS || ml_uc_decomp[lo].cp != cp) return 1;
    const ml_uc_decomp_entry *e = &ml_uc_decomp[lo];
    for (unsigned k = 0; k < e->len; k++) d[k] = ml_uc_decomp_pool[e->off + k];
    return e->len;
}

/* The primary composite of (a, b), or 0 if there is none. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (b < ML_UC_NFC_FAST_BELOW) return 0;
    if (a - L_BASE < L_COUNT && b - V_BASE < V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a - S_BASE < S_COUNT && (a - S_BASE) % T_COUNT == 0 && b - T_BASE - 1 < T_COUNT - 1)
        return a + (b - T_BASE);
    size_t lo = 0, hi = ML_UC_PAIRS;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ml_uc_pair *p = &ml_uc_pairs[mid];
        if (p->a < a || (p->a == a && p->b < b)) lo = mid + 1;
        else hi = mid;
    }
    if (lo < ML_UC_PAIRS && ml_uc_pairs[lo].a == a && ml_uc_pairs[lo].b == b) return ml_uc_pairs[lo].c;
    return 0;
}

/* A position in the canonical decomposition of in[0..n): code point k of the decomposition of
 * in[i]. The decomposed text is never stored; it is generated again where needed. */
typedef struct {
    const uint32_t *in;
    size_t n, i;
    unsigned k, len;
    uint32_t d[ML_UC_DECOMP_MAX];
} cursor;

static void cur_load(cursor *c) {
    if (c->i < c->n) c->len = decompose(c->in[c->i], c->d);
    c->k = 0;
}

static int cur_end(const cursor *c) { return c->i >= c->n; }

static uint32_t cur_get(const cursor *c) { return c->d[c->k]; }

static void cur_next(cursor *c) {
    if (++c->k == c->len) {
        c->i++;
        cur_load(c);
    }
}

/* NFC without a working buffer: the output is written once, left to right, except the slot of
 * the last starter, which is rewritten as marks or an adjacent starter compose with it. A run of
 * non-starters is reordered (stable by combining class) by visiting it once per combining class
 * it contains, in increasing order; then a mark composes with the last starter unless an
 * uncomposed mark of the same (or, in this order, any higher) class came before it. */
size_t ml_uc_nfc(const uint32_t *in, size_t n, uint32_t *out, size_t cap) {
    size_t w = 0, starter_at = 0;
    uint32_t starter = 0;
    int have_starter = 0, adjacent = 0;  /* adjacent: nothing written after the last starter */
    cursor c = {.in = in, .n = n, .i = 0};
    cur_load(&c);
    while (!cur_end(&c)) {
        uint32_t cp = cur_get(&c);
        if (cp < ML_UC_NFC_FAST_BELOW && c.len == 1) {  /* common case: ASCII and most of Latin-1 */
            if (w < cap) out[w] = cp;
            starter_at = w++;
            starter = cp;
            have_starter = adjacent = 1;
            c.i++;
            cur_load(&c);
            continue;
        }
        if (ccc(cp) == 0) {
            uint32_t comp = have_starter && adjacent ? compose(starter, cp) : 0;
            if (comp) {
                starter = comp;
                if (starter_at < cap) out[starter_at] = comp;
            } else {
                if (w < cap) out[w] = cp;
                starter_at = w++;
                starter = cp;
                have_starter = adjacent = 1;
            }
            cur_next(&c);
            continue;
        }
        /* A run of non-starters: which classes it holds, and where it ends. */
        uint64_t classes[4] = {0, 0, 0, 0};
        cursor run = c;
        while (!cur_end(&c)) {
            int k = ccc(cur_get(&c));
            if (k == 0) break;
            classes[k >> 6] |= (uint64_t)1 << (k & 63);
            cur_next(&c);
        }
        int last = 0;  /* class of the last mark written (0: none since the starter) */
        for (int k = 1; k < 256; k++) {
            if (!(classes[k >> 6] >> (k & 63) & 1)) continue;
            for (cursor m = run; m.i < c.i || (m.i == c.i && m.k < c.k); cur_next(&m)) {
                uint32_t mp = cur_get(&m);
                if (ccc(mp) != k) continue;
                uint32_t comp = have_starter && last < k ? compose(starter, mp) : 0;
                if (comp) {
                    starter = comp;
                    if (starter_at < cap) out[starter_at] = comp;
                } else {
                    if (w < cap) out[w] = mp;
                    w++;
                    last = k;
                    adjacent = 0;
                }
            }
        }
    }
    return w;
}
