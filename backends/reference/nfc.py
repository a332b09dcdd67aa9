"""NFC as HF tokenizers computes it (the NFC flag of specs/mlt.yaml): Unicode 9.0's data from
specs/unicode.json (tools/gen_unicode_tables.py), not the running Python's unicodedata, whose
newer combining classes and compositions change some texts (decision tok.unicode_version).

The algorithm of UAX #15: full canonical decomposition (Hangul syllables algorithmically), the
canonical ordering of each run of non-starters (stable by combining class), then canonical
composition: a character composes with the last starter unless a character between them has
class 0 or a class not below its own; two starters compose only when adjacent.

    nfc("e\\u0301") == "\\u00e9"
"""

from __future__ import annotations

from mlconf import specs

_DATA = specs.load_json("unicode")
VERSION: str = _DATA["versions"]["nfc"]
_CCC = {cp: k for first, last, k in _DATA["ccc"] for cp in range(first, last + 1)}
_DECOMP = {cp: tuple(seq) for cp, seq in _DATA["decompositions"]}
_COMPOSE = {(a, b): c for a, b, c in _DATA["compositions"]}
# Below this every character is a starter that neither decomposes nor composes with a preceding
# starter (the bound unicode_tables.h calls ML_UC_NFC_FAST_BELOW).
FAST_BELOW = chr(min(min(_DECOMP), min(_CCC), min(b for _, b in _COMPOSE)))

S_BASE, L_BASE, V_BASE, T_BASE = 0xAC00, 0x1100, 0x1161, 0x11A7
L_COUNT, V_COUNT, T_COUNT = 19, 21, 28
N_COUNT = V_COUNT * T_COUNT
S_COUNT = L_COUNT * N_COUNT


def _decompose(cp: int) -> tuple[int, ...]:
    s = cp - S_BASE
    if 0 <= s < S_COUNT:
        lv = (L_BASE + s // N_COUNT, V_BASE + (s % N_COUNT) // T_COUNT)
        return lv + ((T_BASE + s % T_COUNT,) if s % T_COUNT else ())
    return _DECOMP.get(cp, (cp,))


def _compose(a: int, b: int) -> int | None:
    if 0 <= a - L_BASE < L_COUNT and 0 <= b - V_BASE < V_COUNT:
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT
    if 0 <= a - S_BASE < S_COUNT and (a - S_BASE) % T_COUNT == 0 and 0 < b - T_BASE < T_COUNT:
        return a + (b - T_BASE)
    return _COMPOSE.get((a, b))


def nfc(text: str) -> str:
    if not text or max(text) < FAST_BELOW:
        return text
    cps = [d for c in text for d in _decompose(ord(c))]
    i = 0  # canonical ordering, run by run
    while i < len(cps):
        if _CCC.get(cps[i], 0) == 0:
            i += 1
            continue
        j = i
        while j < len(cps) and _CCC.get(cps[j], 0):
            j += 1
        cps[i:j] = sorted(cps[i:j], key=lambda cp: _CCC[cp])
        i = j
    out: list[int] = []
    starter = -1  # index in out of the last starter
    for cp in cps:
        k = _CCC.get(cp, 0)
        if starter >= 0:
            last = _CCC.get(out[-1], 0)
            if len(out) - 1 == starter or 0 < last < k:
                composite = _compose(out[starter], cp)
                if composite is not None:
                    out[starter] = composite
                    continue
        if k == 0:
            starter = len(out)
        out.append(cp)
    return "".join(map(chr, out))
