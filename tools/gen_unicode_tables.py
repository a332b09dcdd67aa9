"""The Unicode data of the tokenizers, in two steps:

1. ``data()`` writes specs/unicode.json from pinned packages, with the Unicode version HF tokenizers
   follows for each operation (measured over every code point by tools/unicode_probe.py; decision
   tok.unicode_version):
   - the classes of the pre-tokenizer regexes (\\p{L}, \\p{N}, \\s): Unicode 16.0 (Oniguruma in
     tokenizers 0.23), from unicodedataplus 16.0.0.post1;
   - the numeric test of Digits(individual_digits) (Rust's char::is_numeric): Unicode 17.0, from
     unicodedata2 17.0.1;
   - NFC (the unicode-normalization-alignments crate): Unicode 9.0: the 16.0 data of the code
     points assigned by 9.0 (unicodedataplus.age). The Normalization Stability Policy fixes a
     character's canonical decomposition, combining class and composition exclusion once it is
     assigned, so that is 9.0's data; later characters are starters that neither decompose nor
     compose, as they are in 9.0.
   It needs the extra `oracle`; tests/test_unicode_data.py regenerates it and compares.

       python tools/gen_unicode_tables.py --data [OUT.json]

2. ``render()`` writes backends/native/src/unicode_tables.h (git-ignored, never hand-edited) from
   specs/unicode.json, with no dependency: backends/native/build.py runs it before compiling when
   the header is missing or older than the data. The reference reads the same file
   (backends/reference/unicode_classes.py, nfc.py), so both backends follow one table.

       python tools/gen_unicode_tables.py [OUT.h]

specs/unicode.json holds:
- ``classes``: [start, code] runs covering U+0000..U+10FFFF, code = class (0 other, 1 \\p{L},
  2 \\p{N}, 3 White_Space) + 4 when the code point is numeric (Nd Nl No) for Digits;
- ``ccc``: [first, last, class] runs of equal non-zero canonical combining class;
- ``decompositions``: [cp, [full canonical decomposition]], Hangul syllables excepted (NFC
  decomposes and composes them algorithmically);
- ``compositions``: [a, b, composite], the primary composites (not Full_Composition_Exclusion),
  sorted.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path

try:
    from mlconf.tools.files import atomic_write
except ImportError:  # loaded by path by backends/native/build.py, before mlconf is installed
    _spec = importlib.util.spec_from_file_location("_mlconf_files", Path(__file__).with_name("files.py"))
    _files = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_files)
    atomic_write = _files.atomic_write

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "specs" / "unicode.json"
DEFAULT_OUT = ROOT / "backends" / "native" / "src" / "unicode_tables.h"
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
MAX = 0x110000
OTHER, LETTER, NUMBER, SPACE, NUMERIC = 0, 1, 2, 3, 4
# Unicode PropList.txt White_Space (unchanged since Unicode 6.3, when U+180E left it): Oniguruma's
# \s. Not str.isspace(), which adds U+001C..U+001F.
WHITE_SPACE = frozenset(
    [
        *range(0x09, 0x0E),
        0x20,
        0x85,
        0xA0,
        0x1680,
        *range(0x2000, 0x200B),
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
    ]
)
# The packages data() reads, and the Unicode version each must report.
PINNED = {"unicodedataplus": ("16.0.0.post1", "16.0.0"), "unicodedata2": ("17.0.1", "17.0.0")}
NFC_VERSION = (9, 0)


@functools.cache
def pinned():
    """(unicodedataplus, unicodedata2), refused unless they are the pinned versions."""
    import importlib.metadata

    import unicodedata2
    import unicodedataplus

    for mod in (unicodedataplus, unicodedata2):
        dist, unidata = PINNED[mod.__name__]
        got = importlib.metadata.version(mod.__name__)
        if (got, mod.unidata_version) != (dist, unidata):
            raise SystemExit(
                f"gen_unicode_tables: needs {mod.__name__}=={dist} (Unicode {unidata}); "
                f"found {got} (Unicode {mod.unidata_version})"
            )
    return unicodedataplus, unicodedata2


def _runs(values: list[int]) -> list[list[int]]:
    """[start, value] at each change of value over U+0000..U+10FFFF."""
    runs: list[list[int]] = []
    for cp, v in enumerate(values):
        if not runs or runs[-1][1] != v:
            runs.append([cp, v])
    return runs


def data() -> dict:
    """specs/unicode.json's content, from the pinned packages."""
    u16, u17 = pinned()

    def regex_class(c: str) -> int:
        if ord(c) in WHITE_SPACE:
            return SPACE
        cat = u16.category(c)[0]
        return LETTER if cat == "L" else NUMBER if cat == "N" else OTHER

    def in_nfc_version(c: str) -> bool:
        age = u16.age(c)
        return age != "Unassigned" and tuple(map(int, age.split("."))) <= NFC_VERSION

    codes = []
    ccc: list[list[int]] = []
    decomp: list[list] = []
    pairs: list[list[int]] = []
    standard: set[tuple[int, int, int]] = set()
    for cp in range(MAX):
        c = chr(cp)
        surrogate = 0xD800 <= cp <= 0xDFFF
        codes.append(OTHER if surrogate else regex_class(c) + NUMERIC * (u17.category(c)[0] == "N"))
        if surrogate or not in_nfc_version(c):
            continue
        k = u16.combining(c)
        if k:
            if ccc and ccc[-1][1] == cp - 1 and ccc[-1][2] == k:
                ccc[-1][1] = cp
            else:
                ccc.append([cp, cp, k])
        if HANGUL_FIRST <= cp <= HANGUL_LAST:
            continue
        nfd = u16.normalize("NFD", c)
        if nfd != c:
            decomp.append([cp, [ord(x) for x in nfd]])
        m = u16.decomposition(c)
        if m and not m.startswith("<") and len(m.split()) == 2:
            a, b = (int(x, 16) for x in m.split())
            if u16.normalize("NFC", chr(a) + chr(b)) == c:
                pairs.append([a, b, cp])
            # The standard rule: a two-code-point canonical mapping whose character is its own
            # NFC and starts with a starter is a primary composite.
            if u16.normalize("NFC", c) == c and u16.combining(chr(a)) == 0:
                standard.add((a, b, cp))
            if not (in_nfc_version(chr(a)) and in_nfc_version(chr(b))):
                raise SystemExit(f"gen_unicode_tables: U+{cp:04X} decomposes into a later character")
    if {tuple(p) for p in pairs} != standard:
        raise SystemExit("gen_unicode_tables: composition pairs disagree with the standard rule")
    plus, nfc_v = PINNED["unicodedataplus"][0], "{}.{}".format(*NFC_VERSION)
    return {
        "about": "GENERATED by tools/gen_unicode_tables.py --data; do not edit. The Unicode data of the "
        "tokenizers: the version HF tokenizers follows for each operation "
        "(specs/decisions.yaml tok.unicode_version).",
        "versions": {
            "classes": PINNED["unicodedataplus"][1],
            "numeric": PINNED["unicodedata2"][1],
            "nfc": f"{nfc_v}.0",
        },
        "sources": {
            "classes": f"unicodedataplus=={plus}",
            "numeric": f"unicodedata2=={PINNED['unicodedata2'][0]}",
            "nfc": f"unicodedataplus=={plus}, code points whose age is at most {nfc_v}",
        },
        "class_codes": {"other": OTHER, "L": LETTER, "N": NUMBER, "White_Space": SPACE, "numeric": NUMERIC},
        "classes": _runs(codes),
        "ccc": ccc,
        "decompositions": decomp,
        "compositions": sorted(pairs),
    }


def dumps(d: dict) -> str:
    """JSON with one table row per line (reviewable diffs)."""
    lines = ["{"]
    items = list(d.items())
    for i, (k, v) in enumerate(items):
        end = "," if i < len(items) - 1 else ""
        if isinstance(v, list):
            rows = [json.dumps(r, separators=(",", ":")) for r in v]
            lines.append(f'  "{k}": [\n' + ",\n".join("    " + r for r in rows) + f"\n  ]{end}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=True)}{end}")
    return "\n".join(lines) + "\n}\n"


def load(path: str | Path = DATA) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _rows(items: list[str], per_line: int) -> str:
    return "\n".join(
        "    " + ", ".join(items[i : i + per_line]) + "," for i in range(0, len(items), per_line)
    )


def render(d: dict | None = None) -> str:
    """The C header of specs/unicode.json."""
    d = load() if d is None else d
    if d["class_codes"] != {"other": 0, "L": 1, "N": 2, "White_Space": 3, "numeric": 4}:
        raise SystemExit("gen_unicode_tables: specs/unicode.json's class codes differ from unicode.h's")
    cls, decomps, pairs = d["classes"], d["decompositions"], d["compositions"]
    # Below this bound every code point is a starter that neither decomposes nor composes with a
    # preceding starter: unicode.c's NFC copies it as it is.
    fast = min(decomps[0][0], d["ccc"][0][0], min(b for _, b, _ in pairs))
    pool: list[int] = []
    dec_rows = []
    for cp, seq in decomps:
        dec_rows.append(f"{{0x{cp:X}, {len(pool)}, {len(seq)}}}")
        pool.extend(seq)
    v = d["versions"]
    return f"""/* unicode_tables.h: GENERATED by tools/gen_unicode_tables.py from specs/unicode.json
 * (classes: Unicode {v["classes"]}; numeric: {v["numeric"]}; NFC: {v["nfc"]}). Do not edit;
 * backends/native/build.py regenerates it. */
#ifndef MLRT_UNICODE_TABLES_H
#define MLRT_UNICODE_TABLES_H

#include <stdint.h>

#define ML_UC_VERSION "classes {v["classes"]}, numeric {v["numeric"]}, nfc {v["nfc"]}"
#define ML_UC_NFC_FAST_BELOW 0x{fast:X}u

/* Run i covers [ml_uc_class_start[i], ml_uc_class_start[i + 1]) with ml_uc_class_code[i]: the
 * regex class (ML_UC_OTHER..ML_UC_SPACE) plus ML_UC_NUMERIC when Digits splits it off. */
#define ML_UC_CLASS_RUNS {len(cls)}
static const uint32_t ml_uc_class_start[ML_UC_CLASS_RUNS] = {{
{_rows([f"0x{a:X}" for a, _ in cls], 10)}
}};
static const uint8_t ml_uc_class_code[ML_UC_CLASS_RUNS] = {{
{_rows([str(k) for _, k in cls], 32)}
}};

/* Non-zero canonical combining classes: runs {{first, last, ccc}}. */
typedef struct {{ uint32_t first, last; uint8_t ccc; }} ml_uc_ccc_run;
#define ML_UC_CCC_RUNS {len(d["ccc"])}
static const ml_uc_ccc_run ml_uc_ccc[ML_UC_CCC_RUNS] = {{
{_rows([f"{{0x{a:X}, 0x{b:X}, {k}}}" for a, b, k in d["ccc"]], 5)}
}};

/* Full canonical decompositions (Hangul syllables excepted): {{cp, offset in the pool, length}}. */
typedef struct {{ uint32_t cp; uint16_t off; uint8_t len; }} ml_uc_decomp_entry;
#define ML_UC_DECOMPS {len(dec_rows)}
#define ML_UC_DECOMP_MAX {max(len(s) for _, s in decomps)}
static const ml_uc_decomp_entry ml_uc_decomp[ML_UC_DECOMPS] = {{
{_rows(dec_rows, 5)}
}};
static const uint32_t ml_uc_decomp_pool[{len(pool)}] = {{
{_rows([f"0x{c:X}" for c in pool], 10)}
}};

/* Primary composites (Hangul syllables excepted): {{a, b, composite}}, sorted by (a, b). */
typedef struct {{ uint32_t a, b, c; }} ml_uc_pair;
#define ML_UC_PAIRS {len(pairs)}
static const ml_uc_pair ml_uc_pairs[ML_UC_PAIRS] = {{
{_rows([f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}" for a, b, c in pairs], 4)}
}};

#endif
"""


def _write_text(out: str | Path, text: str) -> Path:
    atomic_write(out, [text.encode("utf-8")])
    return Path(out)


def write(out: str | Path = DEFAULT_OUT) -> Path:
    """The C header, from specs/unicode.json."""
    return _write_text(out, render())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--data"]:
        print(_write_text(argv[1] if len(argv) > 1 else DATA, dumps(data())))
    else:
        print(write(argv[0] if argv else DEFAULT_OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
