"""Which Unicode version HF tokenizers follows, for each operation the tokenizers use, probed over
every code point (decision tok.unicode_version; tests/test_unicode_probe.py runs the same probes
against both backends):

- ``hf_classes()``: the class of every code point in the pre-tokenizer regexes (Oniguruma's
  \\p{L}, \\p{N}, \\s through Split(behavior="removed"));
- ``hf_numeric()``: what Digits(individual_digits=True) splits off (Rust's char::is_numeric);
- ``hf_nfc(texts)``: the NFC normalizer; ``nfc_probe_texts()`` are the strings NFC can change:
  every code point alone, every composition's first character with every mark and composing
  second character, and every pair of marks.

    python tools/unicode_probe.py     # needs the extra `oracle`; prints the measurement

``measure()`` compares each with the Unicode versions the pinned packages know
(tools/gen_unicode_tables.py): the share of the letters/numbers new in each version that HF
classes as such, and, for NFC, the number of probe texts on which HF differs from each version's
NFC (the 16.0 normalization of the text split at the characters assigned after that version:
such a character is, in that version, a starter that neither decomposes nor composes).
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from mlconf.tools import gen_unicode_tables as gen

MAX = gen.MAX
SEP = "!"  # a starter that composes with nothing and is in no decomposition


def _code_points() -> list[int]:
    return [cp for cp in range(MAX) if not 0xD800 <= cp <= 0xDFFF]


def hf_classes() -> np.ndarray:
    """uint8 per code point: 0 other, 1 \\p{L}, 2 \\p{N}, 3 \\s, as HF's regex engine matches them
    (surrogates 0)."""
    import tokenizers

    cps = _code_points()
    text = "".join(map(chr, cps))
    out = np.zeros(MAX, np.uint8)
    for code, pattern in ((gen.LETTER, r"\p{L}"), (gen.NUMBER, r"\p{N}"), (gen.SPACE, r"\s")):
        pre = tokenizers.pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="removed")
        kept = np.zeros(len(cps), bool)
        for _, (a, b) in pre.pre_tokenize_str(text):
            kept[a:b] = True
        hit = np.asarray(cps)[~kept]
        if (out[hit] != 0).any():
            raise AssertionError(f"{pattern} overlaps another class at U+{int(hit[out[hit] != 0][0]):04X}")
        out[hit] = code
    return out


def hf_numeric() -> np.ndarray:
    """bool per code point: Digits(individual_digits=True) makes it a piece of its own."""
    import tokenizers

    cps = _code_points()
    text = "".join(chr(c) + "a" for c in cps)  # a non-numeric neighbour joins every other piece
    pre = tokenizers.pre_tokenizers.Digits(individual_digits=True)
    out = np.zeros(MAX, bool)
    alone = [a // 2 for _, (a, b) in pre.pre_tokenize_str(text) if b - a == 1 and a % 2 == 0]
    out[np.asarray(cps)[alone]] = True
    return out


def hf_nfc(texts: list[str]) -> list[str]:
    """HF's NFC normalizer on each text (one call, the texts joined by SEP)."""
    import tokenizers

    got = tokenizers.normalizers.NFC().normalize_str(SEP.join(texts)).split(SEP)
    if len(got) != len(texts):
        raise AssertionError("the NFC probe's separator composed")
    return got


def nfc_probe_texts() -> list[str]:
    """Every code point alone; every first character of a composition, and a sample of other
    starters, followed by every mark and every composing second character; every pair of marks
    (Unicode 16.0's marks and compositions: a superset of any earlier version's)."""
    u16, _ = gen.pinned()
    cps = [c for c in _code_points() if chr(c) != SEP]
    marks = [c for c in cps if u16.combining(chr(c))]
    firsts, seconds = set(), set()
    for c in cps:
        m = u16.decomposition(chr(c))
        if m and not m.startswith("<") and len(m.split()) == 2:
            a, b = (int(x, 16) for x in m.split())
            firsts.add(a)
            seconds.add(b)
    firsts |= {0x41, 0x61, 0x3B1, 0x1100, 0xAC00, 0xAC01, 0x915, 0x4E00, 0x1F600}
    texts = [chr(c) for c in cps]
    texts += [chr(a) + chr(m) for a in sorted(firsts) for m in sorted(set(marks) | seconds)]
    texts += [chr(m1) + chr(m2) for m1 in marks for m2 in marks]
    return texts


@functools.cache
def _age(c: str) -> tuple[int, int] | None:
    """The Unicode version that assigned c (16.0 data), None if 16.0 leaves it unassigned."""
    age = gen.pinned()[0].age(c)
    return None if age == "Unassigned" else tuple(map(int, age.split(".")))


def nfc_of_version(text: str, version: tuple[int, int]) -> str:
    """NFC as Unicode `version` computes it, from the pinned 16.0 data (see the module docstring)."""
    u16, _ = gen.pinned()
    if max(_age(c) or (99, 0) for c in text) <= version:
        return u16.normalize("NFC", text)
    out, start = [], 0
    for i, c in enumerate(text):
        age = _age(c)
        if age is not None and age > version:
            out += [u16.normalize("NFC", text[start:i]), c]
            start = i + 1
    out.append(u16.normalize("NFC", text[start:]))
    return "".join(out)


def measure() -> list[dict]:
    """One row per (operation, Unicode version): how HF treats what that version added."""
    u16, u17 = gen.pinned()
    cls, num = hf_classes(), hf_numeric()
    ages: dict[tuple[int, int], list[int]] = {}
    for cp in _code_points():
        c = chr(cp)
        v = _age(c) or ((17, 0) if u17.category(c) != "Cn" else None)
        if v is not None and v >= (14, 0):
            ages.setdefault(v, []).append(cp)
    rows = []
    for v, new in sorted(ages.items()):
        ud = u17 if v == (17, 0) else u16
        for what, want, got in (
            ("\\p{L}", "L", cls == gen.LETTER),
            ("\\p{N}", "N", cls == gen.NUMBER),
            ("Digits (is_numeric)", "N", num),
        ):
            these = [cp for cp in new if ud.category(chr(cp))[0] == want]
            if these:
                rows.append(
                    {
                        "operation": what,
                        "unicode": "{}.{}".format(*v),
                        "new": len(these),
                        "hf_agrees": int(got[these].sum()),
                    }
                )
    texts = nfc_probe_texts()
    hf = hf_nfc(texts)
    newest = [max(_age(c) or (99, 0) for c in t) for t in texts]
    nfc16 = [u16.normalize("NFC", t) for t in texts]
    for v in [(8, 0), (9, 0), (10, 0), (11, 0), (12, 0), (13, 0), (14, 0), (15, 0), (16, 0)]:
        differ = sum(
            h != (n if a <= v else nfc_of_version(t, v))
            for t, h, n, a in zip(texts, hf, nfc16, newest, strict=True)
        )
        rows.append(
            {"operation": "NFC", "unicode": "{}.{}".format(*v), "texts": len(texts), "hf_differs": differ}
        )
    return rows


def main() -> int:
    import tabulate
    import tokenizers

    print(f"HF tokenizers {tokenizers.__version__}")
    rows = measure()
    for kind in ("new", "texts"):
        print(
            tabulate.tabulate(
                [r for r in rows if kind in r], headers="keys", tablefmt="github", disable_numparse=True
            ),
            end="\n\n",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())


def script_block_texts(seed: int = 20261201) -> dict[str, str]:
    """One seeded text per block of Unicode 16.0 that has letters, numbers or marks: words of the
    block's characters with what tells the versions apart around them (contractions after the
    letters, digits after spaces, combining marks, a decomposed accent). Keys name the block."""
    import random

    u16, _ = gen.pinned()
    blocks: dict[str, list[str]] = {}
    for cp in _code_points():
        c = chr(cp)
        if u16.category(c)[0] in "LNM":
            blocks.setdefault(u16.block(c), []).append(c)
    rng = random.Random(seed)
    glue = [" ", " ", "'s ", "'LL ", "'t", " 12 ", "1", "\n", ", ", "e\u0301 ", "\u00e9", "  "]
    out = {}
    for name, chars in blocks.items():
        words = [
            "".join(rng.choice(chars) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(3, 7))
        ]
        out[f"block {name}"] = "".join(w + rng.choice(glue) for w in words)
    return out
