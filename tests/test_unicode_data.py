"""specs/unicode.json, the Unicode data both tokenizers read (tools/gen_unicode_tables.py):

- it is what the generator gives from the pinned packages (unicodedataplus 16.0, unicodedata2
  17.0; extra `oracle`), byte for byte, and the C header is what it renders;
- the reference's NFC (backends/reference/nfc.py, from the file's 9.0 tables) equals an
  independent 9.0 NFC: unicodedataplus's own normalization of the text cut at the characters
  assigned after 9.0 (tools/unicode_probe.nfc_of_version);
- facts of the Unicode standard that tell the versions apart, derived by hand from the UCD.
The comparison with HF tokenizers itself is tests/test_native_unicode.py's oracle probe.
"""

from __future__ import annotations

import json

import pytest

from mlconf.backends.reference import nfc as ref_nfc
from mlconf.backends.reference import unicode_classes as uc
from mlconf.backends.reference.unicode_classes import LETTER, NUMBER, OTHER, SPACE
from mlconf.tools import gen_unicode_tables as gen


def _pinned():
    pytest.importorskip("unicodedataplus")
    pytest.importorskip("unicodedata2")
    try:
        return gen.pinned()
    except SystemExit as e:  # another version installed: say which
        pytest.fail(str(e))


@pytest.mark.oracle
def test_data_is_what_the_generator_gives():
    _pinned()
    want = json.loads(gen.dumps(gen.data()))
    have = gen.load()
    for key in want:
        if have.get(key) != want[key]:
            rows = [r for r in want[key] if r not in have.get(key, [])] if isinstance(want[key], list) else []
            pytest.fail(
                f"specs/unicode.json {key!r} differs from the generator's (first missing rows "
                f"{rows[:5]}); run python tools/gen_unicode_tables.py --data"
            )
    assert gen.DATA.read_text(encoding="utf-8") == gen.dumps(want)


def test_header_is_rendered_from_the_data():
    from mlconf.backends.native import build

    assert build.unicode_tables().read_text(encoding="utf-8") == gen.render()
    text = gen.render()
    assert '#define ML_UC_VERSION "classes 16.0.0, numeric 17.0.0, nfc 9.0.0"' in text


def test_class_runs_cover_everything():
    runs = uc.class_ranges()
    assert runs[0][0] == 0 and runs[-1][1] == 0x10FFFF
    assert all(a[1] + 1 == b[0] and a[2] != b[2] for a, b in zip(runs, runs[1:], strict=False))
    spaces = {cp for first, last, k in runs if k == SPACE for cp in range(first, last + 1)}
    assert spaces == gen.WHITE_SPACE


# (code point, regex class, numeric): from the UCD's DerivedAge and UnicodeData of 15.0-17.0.
FACTS = [
    (0x0041, LETTER, False),
    (0x0663, NUMBER, True),
    (0x216B, NUMBER, True),
    (0x001C, OTHER, False),
    (0x3000, SPACE, False),
    (0x0301, OTHER, False),
    (0x31350, LETTER, False),  # CJK Extension H (15.0)
    (0x2EBF0, LETTER, False),  # CJK Extension I (15.1)
    (0x1E4D0, LETTER, False),  # Nag Mundari letter O (15.0)
    (0x1D2C0, NUMBER, True),  # Kaktovik numeral zero (15.0, No)
    (0x10D40, NUMBER, True),  # Garay digit zero (16.0, Nd)
    (0x1CCF0, NUMBER, True),  # outlined digit zero (16.0)
    (0x11DE0, OTHER, True),  # a 17.0 digit: Digits splits it, the 16.0 regex does not know it
    (0x16FF4, OTHER, True),  # 17.0, Nl
    (0x088F, OTHER, False),  # a 17.0 Arabic letter: other for the 16.0 regex
]


@pytest.mark.parametrize("cp,cls,numeric", FACTS, ids=[f"U+{f[0]:04X}" for f in FACTS])
def test_version_facts(cp, cls, numeric):
    assert (uc.char_class(chr(cp)), uc.is_numeric(chr(cp))) == (cls, numeric)


NFC_FACTS = [
    ("e\u0301", "\u00e9"),
    ("\u1100\u1161\u11a8", "\uac01"),
    ("a\u0323\u0302", "\u1ead"),
    ("\u212b", "\u00c5"),
    ("\u0958", "\u0915\u093c"),  # a singleton, an exclusion
    ("e\u1df6\u0301", "e\u1df6\u0301"),  # U+1DF6 (10.0): a starter in 9.0, nothing moves
    ("\U00011935\U00011930", "\U00011935\U00011930"),  # composes to U+11938 only from 13.0
    ("\U0001611e\U0001611e", "\U0001611e\U0001611e"),  # Gurung Khema (16.0)
]


@pytest.mark.parametrize(
    "text,want", NFC_FACTS, ids=[t.encode("unicode_escape").decode() for t, _ in NFC_FACTS]
)
def test_nfc_facts(text, want):
    assert ref_nfc.nfc(text) == want


@pytest.mark.oracle
def test_reference_nfc_is_unicode_9():
    _pinned()
    from mlconf.tools import unicode_probe

    texts = unicode_probe.nfc_probe_texts()
    bad = [t for t in texts if ref_nfc.nfc(t) != unicode_probe.nfc_of_version(t, gen.NFC_VERSION)]
    assert not bad, f"{len(bad)} of {len(texts)} texts: " + ", ".join(
        t.encode("unicode_escape").decode() for t in bad[:10]
    )
