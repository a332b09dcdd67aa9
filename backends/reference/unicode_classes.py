"""The character classes of the pre-tokenizer regexes (specs/mlt.yaml `regexes`), from Python's
unicodedata, so that the reference and a C port can share one table (class_ranges()).

\\p{L} is general category L* (Lu Ll Lt Lm Lo), \\p{N} is N* (Nd Nl No), \\s is the Unicode
White_Space property: the set Oniguruma (HF tokenizers' regex engine) uses. It is NOT
str.isspace(), which adds U+001C..U+001F (category Cc, bidi class B/S); Oniguruma puts those in
[^\\s\\p{L}\\p{N}], and so do we (tests/test_pretokenize.py checks every code point against HF).

Unicode version: the tables are those of unicodedata.unidata_version (UNICODE_VERSION). HF's
Oniguruma is newer (Unicode 16 in tokenizers 0.23): code points assigned after UNICODE_VERSION
(e.g. CJK Extension H, U+31350..) are letters or numbers there and "other" here. Every code point
assigned in UNICODE_VERSION has the same class in both.
"""

from __future__ import annotations

import unicodedata

UNICODE_VERSION: str = unicodedata.unidata_version

# Class codes: what the scanner needs to know of a character.
OTHER, LETTER, NUMBER, SPACE = 0, 1, 2, 3
CLASS_NAMES = {OTHER: "other", LETTER: "L", NUMBER: "N", SPACE: "White_Space"}

# Unicode PropList.txt White_Space (unchanged since Unicode 6.3, when U+180E left it).
WHITE_SPACE: frozenset[str] = frozenset(
    [chr(c) for c in (*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                      0x2028, 0x2029, 0x202F, 0x205F, 0x3000)])

_cache: dict[str, int] = {}


def _classify(c: str) -> int:
    if c in WHITE_SPACE:
        return SPACE
    cat = unicodedata.category(c)[0]
    return LETTER if cat == "L" else NUMBER if cat == "N" else OTHER


def char_class(c: str) -> int:
    """OTHER, LETTER, NUMBER or SPACE for one character (memoized: text repeats characters)."""
    k = _cache.get(c)
    if k is None:
        k = _cache[c] = _classify(c)
    return k


def class_ranges() -> list[tuple[int, int, int]]:
    """(first, last, class) runs covering U+0000..U+10FFFF: the table a C port embeds
    (surrogates are OTHER; they never occur in valid UTF-8)."""
    runs: list[tuple[int, int, int]] = []
    start, cur = 0, _classify(chr(0))
    for cp in range(1, 0x110000):
        k = _classify(chr(cp))
        if k != cur:
            runs.append((start, cp - 1, cur))
            start, cur = cp, k
    runs.append((start, 0x10FFFF, cur))
    return runs
