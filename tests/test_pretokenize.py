"""The hand-written pre-tokenizer scanners (backends/reference/pretokenize.py) against the regexes
of specs/mlt.yaml as HF `tokenizers` runs them (Oniguruma: Split(behavior="isolated"),
ByteLevel(use_regex=True), Digits(individual_digits=True)), and against the `regex` module as a
second engine. The classes are HF's own on every code point (specs/unicode.json, Unicode 16.0;
tests/test_native_unicode.py probes them); the `regex` module follows its own Unicode version, so
it only sees code points whose class is the same in both.
"""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlconf import specs
from mlconf.backends.reference import pretokenize, unicode_classes
from mlconf.backends.reference.unicode_classes import LETTER, NUMBER, OTHER, SPACE, char_class

REGEXES: dict[str, str] = specs.load("mlt")["regexes"]
PATTERNS = ("llama3", "llama3_single_digits", "gpt2")

STRESS = [
    "",
    " ",
    "  ",
    "\n",
    "\r\n",
    " \n ",
    "   \n\n  \t",
    "a  ",
    "  a",
    "a  b",
    "a \n b",
    "\t\tx",
    " \t\n\r\n x",
    "hello world",
    "Hello  World\n\nI'm HERE'S they'LL we'Ve you'D it'T",
    "'s's 'S 'ſ ſ 'll'LL 'lL",
    "'",
    "''",
    "'''s",
    "x'",
    "'re're'",
    "don't",
    "DON'T",
    "O'Neil's",
    "rock'n'roll",
    "1 12 123 1234 12345 1234567890",
    "a1b22c333d4444",
    " 1 22 333",
    "٣٤٥ ²³ Ⅻ ①",
    "3.14159, -2e10",
    "a\tb\r\nc\rd\x0be\x0cf",
    "!!!...??",
    " !!",
    "!!\n\n",
    " !\r\n\r\nx",
    "(a) [b] {c}",
    "a+b=c",
    "__init__",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 😀👍🏽 x😀y",
    "中文日本語 東京 。、",
    "ภาษาไทย",
    "नमस्ते दुनिया",
    "Привет, мир!",
    "e\u0301 é \u0301\u0301",
    "\u00a0nbsp\u2003em\u3000ideo",
    "\x1c\x1d\x1e\x1f x \x1c",
    "\x85next\u2028line\u2029para",
    "\x00\x01 \x7f",
    "trailing  ",
    "  leading",
    "x \u200d y",
    "\u200b",
    "a\u00ad b",
    "def f(x):\n    return x  # ok\n\n\n",
    "<|endoftext|> <s>",
    "mixed\tTAB s\n 12abc",
    # letters and numbers newer than Python 3.11's Unicode 14.0 (Nag Mundari, CJK Ext. H, Kaktovik,
    # Garay: 15.0-16.0) and numbers of 17.0, which the 16.0 regex does not know but Digits splits
    "\U0001e4d0\U0001e4d5\U0001e4da\U0001e4e0's book",
    "\U00031350\U00031351's \U0002ebf0'LL",
    " \U0001d2c0\U0001d2c1\U0001d2c2\U0001d2c3 \U00010d40\U00010d41x",
    "a\U00011de0\U00011de1 \U00016ff4b 7",
]


def hf_split(pattern: str):
    tokenizers = pytest.importorskip("tokenizers")
    pt = tokenizers.pre_tokenizers
    pre = pt.Split(tokenizers.Regex(REGEXES[pattern]), behavior="isolated", invert=False)
    return lambda text: [p for p, _ in pre.pre_tokenize_str(text)]


def hf_byte_level_gpt2():
    """ByteLevel(use_regex=True): HF's own copy of the GPT-2 regex (pieces recovered by offset)."""
    tokenizers = pytest.importorskip("tokenizers")
    pre = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return lambda text: [text[a:b] for _, (a, b) in pre.pre_tokenize_str(text)]


def assigned(c: str) -> bool:
    """Assigned in Python's Unicode: the regex module's version may be older than the tables'."""
    return unicodedata.category(c) not in ("Cn", "Cs")


# -- the character classes -------------------------------------------------------------------


def test_white_space_is_not_isspace():
    # The four information separators are str.isspace() but not White_Space (nor Oniguruma's \s).
    for c in "\x1c\x1d\x1e\x1f":
        assert c.isspace() and char_class(c) == OTHER
    assert char_class("a") == LETTER and char_class("٣") == NUMBER and char_class("Ⅻ") == NUMBER
    assert char_class("\u0301") == OTHER and char_class("_") == OTHER and char_class("\u3000") == SPACE


def test_class_runs_are_what_char_class_says():
    for first, last, k in unicode_classes.class_ranges()[::97]:
        assert unicode_classes.code(chr(first)) == k and unicode_classes.code(chr(last)) == k
        assert char_class(chr(last)) == k & 3


def test_every_code_point_against_hf():
    """Every letter, number and space of the tables and every code point Python assigns (private
    use and the rest sampled) in contexts that tell the four classes and the contraction letters
    apart, through the Llama 3 scanner and HF's regex."""
    cps = [
        cp
        for cp in range(0x110000)
        if not 0xD800 <= cp <= 0xDFFF
        and (
            unicode_classes.code(chr(cp))
            or unicodedata.category(chr(cp)) not in ("Co", "Cn")
            or cp % 997 == 0
        )
    ]
    text = "".join(f"a{c}1{c} {c}'{c}\n" for c in map(chr, cps))
    assert pretokenize.split(text, "llama3") == hf_split("llama3")(text)


# -- the scanners ----------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", PATTERNS)
def test_stress_against_hf(pattern):
    oracle = hf_split(pattern)
    for text in STRESS:
        assert pretokenize.split(text, pattern) == oracle(text), repr(text)


def test_gpt2_against_hf_byte_level():
    oracle = hf_byte_level_gpt2()
    for text in STRESS:
        assert pretokenize.split(text, "gpt2") == oracle(text), repr(text)


def test_split_numbers_against_hf_digits():
    tokenizers = pytest.importorskip("tokenizers")
    pre = tokenizers.pre_tokenizers.Digits(individual_digits=True)
    for text in STRESS:
        assert pretokenize.split_numbers(text) == [p for p, _ in pre.pre_tokenize_str(text)], repr(text)


def test_hand_derived_pieces():
    # Backtracking of \s+(?!\S): a run before a non-space gives its last character to the next piece.
    assert pretokenize.split("a   b", "llama3") == ["a", "  ", " b"]
    assert pretokenize.split("a \t\n  \n b", "llama3") == ["a", " \t\n  \n", " b"]  # \s*[\r\n]+
    assert pretokenize.split("x  ", "llama3") == ["x", "  "]
    assert pretokenize.split("'Sa 'ſ", "llama3") == ["'S", "a", " '", "ſ"]
    assert pretokenize.split("'Sa", "gpt2") == ["'", "Sa"]
    assert pretokenize.split("12345", "llama3") == ["123", "45"]
    assert pretokenize.split("12345", "llama3_single_digits") == list("12345")
    assert pretokenize.split(" 12345", "gpt2") == [" 12345"]
    assert pretokenize.split("!!\n\nx", "llama3") == ["!!\n\n", "x"]
    assert pretokenize.split("\thello", "llama3") == ["\thello"]
    assert pretokenize.split("\thello", "gpt2") == ["\t", "hello"]
    assert pretokenize.split_numbers("ab12 3x") == ["ab", "1", "2", " ", "3", "x"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pieces_cover_the_text(pattern):
    for text in STRESS:
        pieces = pretokenize.split(text, pattern)
        assert "".join(pieces) == text and all(pieces)


# -- generated text --------------------------------------------------------------------------

SPECIAL = st.sampled_from(
    list(" \t\r\n\x0b\x0c\x1c\x1f\x85\xa0\u2003\u3000\u200d'sStTrReEvVmMlLdDſ0123456789")
)
CHARS = st.one_of(
    SPECIAL,
    SPECIAL,
    st.characters(categories=["L", "N", "Zs", "Cc", "P", "S", "M", "Zl", "Zp", "Cf"]),
    st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF).filter(assigned),  # emoji
)
TEXT = st.one_of(
    st.text(CHARS, max_size=40),
    st.lists(
        st.sampled_from(
            [
                "'s",
                "'S",
                "'Ll",
                "'lL",
                "'RE",
                "'ve",
                "'M",
                "'d",
                "'t",
                " ",
                "  ",
                "\n",
                "\r\n",
                "\t",
                "a",
                "Zz",
                "1",
                "12",
                "1234",
                "!",
                "?!",
                "😀",
                "中",
                "é",
            ]
        ),
        max_size=20,
    ).map("".join),
)


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_generated_against_hf(text):
    for pattern in PATTERNS:
        assert pretokenize.split(text, pattern) == hf_split(pattern)(text)
    assert pretokenize.split(text, "gpt2") == hf_byte_level_gpt2()(text)


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_generated_against_regex_module(text):
    regex = pytest.importorskip("regex")
    for pattern in PATTERNS:
        assert pretokenize.split(text, pattern) == regex.findall(REGEXES[pattern], text)
