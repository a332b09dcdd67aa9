/* unicode.h: what the native tokenizer needs of Unicode: UTF-8 decoding, the character classes
 * of the pre-tokenizers and NFC, each in the Unicode version HF tokenizers uses for it (regex
 * classes 16.0, Digits' numeric test 17.0, NFC 9.0; decision tok.unicode_version). The tables are
 * rendered at build time from specs/unicode.json (tools/gen_unicode_tables.py writes
 * unicode_tables.h, never hand-edited), the data the reference reads too.
 */
#ifndef MLRT_UNICODE_H
#define MLRT_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* The codes of specs/unicode.json: a regex class, plus ML_UC_NUMERIC for Digits. */
enum { ML_UC_OTHER = 0, ML_UC_LETTER = 1, ML_UC_NUMBER = 2, ML_UC_SPACE = 3, ML_UC_NUMERIC = 4 };

int ml_uc_code(uint32_t cp);           /* the table's code of a code point (OTHER above U+10FFFF) */
static inline int ml_uc_class(uint32_t cp) { return ml_uc_code(cp) & 3; }   /* regex class */
static inline int ml_uc_numeric(uint32_t cp) { return (ml_uc_code(cp) & ML_UC_NUMERIC) != 0; }
const char *ml_uc_version(void);       /* the versions of the tables, "classes 16.0.0, ..." */

/* UTF-8 -> code points with Python's bytes.decode("utf-8", "replace") semantics (each maximal
 * invalid subpart becomes U+FFFD; surrogates encoded in UTF-8 are invalid). out has room for len
 * code points; returns the count written; offs (if not NULL) receives each code point's byte
 * offset in s. */
size_t ml_utf8_decode(const uint8_t *s, size_t len, uint32_t *out, size_t *offs);
/* Code point -> UTF-8 (1..4 bytes written to out); returns the byte count. */
size_t ml_utf8_encode(uint32_t cp, uint8_t out[4]);

/* NFC of in[0..n) (Unicode 9.0, as HF's normalizer): writes at most cap code points to out and
 * returns the count needed (NFC never needs more than 3 * n). */
size_t ml_uc_nfc(const uint32_t *in, size_t n, uint32_t *out, size_t cap);

#endif
