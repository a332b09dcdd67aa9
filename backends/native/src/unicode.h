/* unicode.h: what the native tokenizer needs of Unicode: UTF-8 decoding, the character classes
 * of the pre-tokenizer regexes and NFC. The tables come from Python's unicodedata at build time
 * (tools/gen_unicode_tables.py writes unicode_tables.h, never hand-edited), the same tables the
 * reference uses (backends/reference/unicode_classes.py), so both follow one Unicode version.
 */
#ifndef MLRT_UNICODE_H
#define MLRT_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* The classes of backends/reference/unicode_classes.py (same codes). */
enum { ML_UC_OTHER = 0, ML_UC_LETTER = 1, ML_UC_NUMBER = 2, ML_UC_SPACE = 3 };

int ml_uc_class(uint32_t cp);          /* class of a code point (OTHER above U+10FFFF) */
const char *ml_uc_version(void);       /* the Unicode version of the tables, e.g. "14.0.0" */

/* UTF-8 -> code points with Python's bytes.decode("utf-8", "replace") semantics (each maximal
 * invalid subpart becomes U+FFFD; surrogates encoded in UTF-8 are invalid). out has room for len
 * code points; returns the count written; offs (if not NULL) receives each code point's byte
 * offset in s. */
size_t ml_utf8_decode(const uint8_t *s, size_t len, uint32_t *out, size_t *offs);
/* Code point -> UTF-8 (1..4 bytes written to out); returns the byte count. */
size_t ml_utf8_encode(uint32_t cp, uint8_t out[4]);

/* NFC of in[0..n) (unicodedata.normalize("NFC", ...)): writes at most cap code points to out and
 * returns the count needed (NFC never needs more than 3 * n). */
size_t ml_uc_nfc(const uint32_t *in, size_t n, uint32_t *out, size_t cap);

#endif
