"""Byte-level pre-tokenization by hand: scanners equal to the regexes of specs/mlt.yaml, without a
regex library, so that a C port can follow them line by line with the same tables
(unicode_classes.py).

Each regex is a list of alternatives tried in order at the current position; the first that
matches wins (Perl/Oniguruma alternation) and the scan resumes after it. Every character starts a
match of some alternative, so the pieces cover the text (HF Split(behavior="isolated") and
ByteLevel(use_regex=True) keep nothing else). Each _alt function below returns the end of its
alternative's match at i, or -1, and says how backtracking shapes it.

    split(text, "llama3" | "llama3_single_digits" | "gpt2") -> pieces
    split_numbers(text) -> pieces (HF Digits(individual_digits=True): every numeric on its own)
"""

from __future__ import annotations

from collections.abc import Callable

from .unicode_classes import LETTER, NUMBER, OTHER, SPACE, char_class, is_numeric

__all__ = ["PATTERNS", "split", "spans", "split_numbers"]

# The letters of the contractions, matched case-insensitively in the Llama 3 regex: Oniguruma's
# case folding also maps U+017F LATIN SMALL LETTER LONG S to s (checked over every code point
# against HF); no other character folds to these letters.
_FOLD = {"s": "sS\u017f", "t": "tT", "r": "rR", "e": "eE", "v": "vV", "m": "mM", "l": "lL", "d": "dD"}
_CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")  # after the apostrophe, in regex order
_CRLF = "\r\n"


def _run(t: str, i: int, cls: int) -> int:
    """End of the run of characters of class cls starting at i."""
    n = len(t)
    while i < n and char_class(t[i]) == cls:
        i += 1
    return i


def _contraction(t: str, i: int, fold: bool) -> int:
    """'s|'t|'re|'ve|'m|'ll|'d at i (case-insensitive when fold): the end, or -1."""
    if t[i] != "'":
        return -1
    for suffix in _CONTRACTIONS:
        j = i + 1
        for ch in suffix:
            if j >= len(t) or not (t[j] in _FOLD[ch] if fold else t[j] == ch):
                break
            j += 1
        else:
            return j
    return -1


def _space_tail(t: str, i: int) -> int:
    """\\s+(?!\\S)|\\s+ at i, where t[i] is white space. \\s+ takes the whole run; if a
    non-space follows, the lookahead fails and backtracking gives back one character (which is
    white space, so the lookahead then holds), unless the run is a single character, when the
    second alternative takes it."""
    e = _run(t, i, SPACE)
    if e == len(t) or e - i == 1:
        return e
    return e - 1


def _llama3(t: str, i: int, max_digits: int) -> int:
    n, c = len(t), t[i]
    k = char_class(c)
    # (?i:'s|'t|'re|'ve|'m|'ll|'d)
    j = _contraction(t, i, fold=True)
    if j >= 0:
        return j
    # [^\r\n\p{L}\p{N}]?\p{L}+ : a letter run, with one optional leading non-letter non-number
    # that is not CR/LF (if no letter follows it, ? gives it back and \p{L}+ fails on it).
    if k == LETTER:
        return _run(t, i, LETTER)
    if k != NUMBER and c not in _CRLF and i + 1 < n and char_class(t[i + 1]) == LETTER:
        return _run(t, i + 1, LETTER)
    # \p{N}{1,3} (or \p{N} with flag 16)
    if k == NUMBER:
        j = i + 1
        while j < n and j - i < max_digits and char_class(t[j]) == NUMBER:
            j += 1
        return j
    #  ?[^\s\p{L}\p{N}]+[\r\n]* : only U+0020 may lead (other white space is \s)
    j = i + 1 if c == " " else i
    if j < n and char_class(t[j]) == OTHER:
        j = _run(t, j, OTHER)
        while j < n and t[j] in _CRLF:
            j += 1
        return j
    # Here t[i] is white space. \s*[\r\n]+ : \s* takes the whole white-space run, then gives back
    # until [\r\n]+ matches, i.e. at the last CR/LF of the run, which ends the match.
    e = _run(t, i, SPACE)
    for j in range(e - 1, i - 1, -1):
        if t[j] in _CRLF:
            return j + 1
    # \s+(?!\S)|\s+
    return _space_tail(t, i)


def _gpt2(t: str, i: int) -> int:
    n, c = len(t), t[i]
    # 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
    j = _contraction(t, i, fold=False)
    if j >= 0:
        return j
    #  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : an optional U+0020, then a run of one class
    j = i + 1 if c == " " and i + 1 < n else i
    k = char_class(t[j])
    if k != SPACE:
        return _run(t, j, k)
    # Here t[i] is white space (a lone trailing U+0020, or one followed by white space).
    return _space_tail(t, i)


PATTERNS: dict[str, Callable[[str, int], int]] = {
    "llama3": lambda t, i: _llama3(t, i, 3),
    "llama3_single_digits": lambda t, i: _llama3(t, i, 1),
    "gpt2": _gpt2,
}


def spans(text: str, pattern: str) -> list[tuple[int, int]]:
    """(start, end) of each piece of text under the named regex of specs/mlt.yaml."""
    match = PATTERNS[pattern]
    out, i = [], 0
    while i < len(text):
        j = match(text, i)
        out.append((i, j))
        i = j
    return out


def split(text: str, pattern: str) -> list[str]:
    return [text[a:b] for a, b in spans(text, pattern)]


def split_numbers(text: str) -> list[str]:
    """Every numeric character a piece of its own, the runs between kept whole (HF
    Digits(individual_digits=True), which tests Rust's char::is_numeric: N* of Unicode 17.0,
    unicode_classes.is_numeric)."""
    out, start = [], 0
    for i, c in enumerate(text):
        if is_numeric(c):
            if start < i:
                out.append(text[start:i])
            out.append(c)
            start = i + 1
    if start < len(text):
        out.append(text[start:])
    return out
