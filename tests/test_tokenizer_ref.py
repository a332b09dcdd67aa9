"""The reference encoder/decoder (backends/reference/tokenizer.py).

(a) tiny tokenizers built by hand, ids derived by hand: merge order, leftmost among equal ranks,
    ignore_merges, added tokens (leftmost, then longest), byte fallback, prefixes, BOS, decoding;
(b) tokenizers trained here with HF `tokenizers` (BpeTrainer, deterministic), mapped to the .mlt
    Tokenizer by a minimal converter written here, compared with HF's encode(...).ids and decode on
    a stress set for every flag combination of both kinds;
(c) properties (hypothesis): byte-level decode(encode(text)) == text.encode(); encode never raises.
"""

from __future__ import annotations

import json
import random
import re
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlconf import specs
from mlconf.backends.reference import tokenizer as reftok
from mlconf.backends.reference.tokenizer import Encoder, bpe
from mlconf.tools.mlt import Tokenizer

S = "\u2581"
REGEXES: dict[str, str] = specs.load("mlt")["regexes"]


# -- (a) by hand -----------------------------------------------------------------------------


def byte_level(
    pieces: list[bytes],
    merges: list[tuple[bytes, bytes]],
    flags: int = 0,
    added: list[bytes] = (),
    bos: int = -1,
    skip_bytes: bytes = b"",
) -> Tokenizer:
    """Ids 0..255 are the bytes (minus skip_bytes, whose ids are taken by b'?'-free fillers), then
    pieces, then added tokens; merges by piece."""
    tokens = [(0, bytes([b])) for b in range(256) if b not in skip_bytes]
    tokens += [(0, p) for p in pieces] + [(1, a) for a in added]
    ids = {p: i for i, (a, p) in enumerate(tokens) if a == 0}
    return Tokenizer(2, flags, bos, -1, tokens, [(ids[a], ids[b], ids[a + b]) for a, b in merges])


def sp(
    pieces: list[str],
    merges: list[tuple[str, str]],
    flags: int = 0,
    added: list[str] = (),
    byte_tokens: bool = True,
    bos: int = -1,
) -> Tokenizer:
    """Ids 0..255 are the byte tokens <0xXX> (if byte_tokens), then pieces, then added tokens."""
    tokens = [(2, bytes([b])) for b in range(256)] if byte_tokens else []
    tokens += [(0, p.encode()) for p in pieces] + [(1, a.encode()) for a in added]
    ids = {p.decode(): i for i, (a, p) in enumerate(tokens) if a == 0}
    return Tokenizer(1, flags, bos, -1, tokens, [(ids[a], ids[b], ids[a + b]) for a, b in merges])


def pieces_of(tok: Tokenizer, ids: list[int]) -> list[bytes]:
    return [tok.tokens[i][1] for i in ids]


def test_bpe_lowest_rank_first():
    # "abcd": c+d (rank 0), then b+cd (rank 1) beats a+b (rank 2) though a+b stood first.
    tok = byte_level([b"cd", b"bcd", b"ab"], [(b"c", b"d"), (b"b", b"cd"), (b"a", b"b")])
    assert pieces_of(tok, Encoder(tok).encode("abcd")) == [b"a", b"bcd"]
    # The same merges in another order: a+b first, then nothing joins ab with cd.
    tok = byte_level([b"ab", b"cd", b"bcd"], [(b"a", b"b"), (b"c", b"d"), (b"b", b"cd")])
    assert pieces_of(tok, Encoder(tok).encode("abcd")) == [b"ab", b"cd"]


def test_bpe_leftmost_among_equal_ranks():
    tok = byte_level([b"aa", b"aaaa"], [(b"a", b"a"), (b"aa", b"aa")])
    enc = Encoder(tok)
    assert pieces_of(tok, enc.encode("aaa")) == [b"aa", b"a"]
    assert pieces_of(tok, enc.encode("aaaa")) == [b"aaaa"]
    assert pieces_of(tok, enc.encode("aaaaa")) == [b"aaaa", b"a"]
    assert pieces_of(tok, enc.encode("aaaaaaa")) == [b"aaaa", b"aa", b"a"]


def test_bpe_function_directly():
    merges = {(1, 1): (0, 2), (2, 2): (1, 3)}  # x+x -> xx, xx+xx -> xxxx
    assert bpe([], merges) == [] and bpe([1], merges) == [1]
    assert bpe([1, 1, 1, 1, 1, 1], merges) == [3, 2]
    assert bpe([1, 4, 1, 1], merges) == [1, 4, 2]


def test_duplicate_merge_takes_last_rank():
    # a+b listed at ranks 0 and 2, b+c at 1: the map keeps rank 2, so b+c (1) goes first (as HF).
    tok = byte_level([b"ab", b"bc"], [(b"a", b"b"), (b"b", b"c"), (b"a", b"b")])
    assert pieces_of(tok, Encoder(tok).encode("abc")) == [b"a", b"bc"]


def test_ignore_merges():
    # "xyz" is a piece no merge reaches: only flag 2 finds it whole; "xy" is reachable either way.
    merges = [(b"x", b"y")]
    for flags, want in ((0, [b"xy", b"z"]), (2, [b"xyz"])):
        tok = byte_level([b"xy", b"xyz"], merges, flags=flags)
        assert pieces_of(tok, Encoder(tok).encode("xyz")) == want
    tok = byte_level([b"xy", b"xyz"], merges, flags=2)
    assert pieces_of(tok, Encoder(tok).encode("xyzxy")) == [b"xy", b"z", b"xy"]  # not a whole piece


def test_added_tokens_leftmost_then_longest():
    tok = byte_level([], [], added=[b"<a>", b"<a><b>", b"<b>", b"bcd", b"ab"])
    enc = Encoder(tok)
    ids = {p: i for i, (_, p) in enumerate(tok.tokens)}
    assert enc.encode("x<a><b><a>y") == [ord("x"), ids[b"<a><b>"], ids[b"<a>"], ord("y")]
    assert enc.encode("abcd") == [ids[b"ab"], ord("c"), ord("d")]  # leftmost beats longer "bcd"
    assert enc.encode("<a<b>>") == [ord("<"), ord("a"), ids[b"<b>"], ord(">")]
    assert enc.encode("<a") == [ord("<"), ord("a")]  # a prefix of a token is text


def test_byte_level_missing_byte_is_dropped():
    # No token for "z": the byte is dropped and its neighbours become adjacent (HF BPE, no unk).
    tok = byte_level([b"ab"], [(b"a", b"b")], skip_bytes=b"z")
    enc = Encoder(tok)
    assert pieces_of(tok, enc.encode("azb")) == [b"ab"]
    assert enc.encode("zzz") == []


def test_bos_and_no_eos():
    tok = byte_level([], [], flags=1, added=[b"<s>"], bos=256)
    tok.eos = 256
    assert Encoder(tok).encode("") == [256] and Encoder(tok).encode("a") == [256, 97]


def test_sp_prefix_and_spaces():
    pieces = [S, "a", "b", S + "a", S + S]
    tok = sp(pieces, [(S, "a"), (S, S)], added=["<s>"])
    enc = Encoder(tok)
    ids = {p.encode(): 256 + i for i, p in enumerate(pieces)} | {b"<s>": 256 + len(pieces)}
    pre, a, b, pa, pp, bos = (ids[x.encode()] for x in (S, "a", "b", S + "a", S + S, "<s>"))
    assert enc.encode("") == []
    assert enc.encode("a") == [pa]
    assert enc.encode(" b") == [pp, b]  # the prefix is prepended even before a space
    assert enc.encode(" a") == [pre, pa]  # S+a (rank 0) before S+S (rank 1)
    assert enc.encode("a b") == [pa, pre, b]
    assert enc.encode(" ") == [pp]
    assert enc.encode("<s>a") == [bos, pa]  # every segment gets the prefix
    assert enc.encode("a<s><s>") == [pa, bos, bos]  # an empty segment gives nothing


def test_sp_prefix_first_only():
    pieces = [S, "a", "b", S + "a", S + S]
    tok = sp(pieces, [(S, "a"), (S, S)], flags=4, added=["<s>"])
    enc = Encoder(tok)
    pre, a, b, pa, pp, bos = (256 + i for i in range(6))
    assert enc.encode("a") == [pa]
    assert enc.encode("<s>a") == [bos, a]  # the text starts with an added token: no prefix
    assert enc.encode("a<s>a") == [pa, bos, a]
    assert enc.encode("a<s> a") == [pa, bos, pa]  # its own space still becomes U+2581
    assert enc.encode(" a") == [pa]  # already starts with U+2581 (HF Metaspace)


def test_sp_byte_fallback():
    tok = sp([S, "a", S + "a"], [(S, "a")])
    enc = Encoder(tok)
    assert enc.encode("aé") == [256 + 2, 0xC3, 0xA9]
    assert pieces_of(tok, enc.encode("😀")) == [S.encode(), b"\xf0", b"\x9f", b"\x98", b"\x80"]
    # Without byte tokens an unknown character is dropped.
    tok = sp([S, "a", S + "a"], [(S, "a")], byte_tokens=False)
    assert Encoder(tok).encode("éaé") == [2]
    # A character whose bytes are only partly covered is dropped whole.
    tok = sp([S, "a"], [], byte_tokens=False)
    tok.tokens.append((2, b"\xc3"))
    assert Encoder(tok).encode("é") == [0]


def test_sp_ignore_merges_whole_segment():
    tok = sp([S, "a", "b", S + "a", S + "ab"], [(S, "a")], flags=2)
    assert pieces_of(tok, Encoder(tok).encode("ab")) == [(S + "ab").encode()]
    tok.flags = 0
    assert pieces_of(tok, Encoder(tok).encode("ab")) == [(S + "a").encode(), b"b"]


def test_decode_sentencepiece():
    tok = sp([S, "a", S + "a", "b" + S], [(S, "a")], added=["<s>", S + "x"])
    enc = Encoder(tok)
    pre, a, pa, bp, bos, addx = (256 + i for i in range(6))
    assert enc.decode([pa, pre, a]) == b"a a"  # one leading space stripped
    assert enc.decode([pre, pre, a]) == b" a"
    assert enc.decode([0x20, a]) == b"a"  # whatever made it (HF Strip after Fuse)
    assert enc.decode([bos, pa]) == b"<s> a"  # not at the start: kept
    assert enc.decode([bp, addx]) == b"b " + S.encode() + b"x"  # added tokens: stored bytes
    assert enc.decode([0xC3, 0xA9]) == "é".encode()
    # decode_text: a run of byte tokens that is not valid UTF-8 gives one U+FFFD per byte token.
    assert enc.decode_text([0xE4, 0xB8]) == "\ufffd\ufffd"
    assert enc.decode_text([0x41, 0xFF]) == "\ufffd\ufffd"
    assert enc.decode_text([0xE4, a, 0xB8]) == "\ufffda\ufffd"
    assert enc.decode_text([0xC3, 0xA9, pa]) == "é a"
    assert enc.decode_text([]) == "" and enc.decode([]) == b""
    with pytest.raises(ValueError, match="token id 999"):
        enc.decode([999])


def test_decode_byte_level():
    tok = byte_level([b"ab"], [(b"a", b"b")], added=[b"<|e|>"])
    enc = Encoder(tok)
    assert enc.decode([257, 0x20]) == b"<|e|> "  # no stripping in kind 2
    assert enc.decode_text([0xE4, 0xB8, 0x41, 0xFF]) == "\ufffdA\ufffd"  # maximal subparts
    with pytest.raises(ValueError):
        enc.decode([-1])


def test_word_cache_is_invisible(monkeypatch):
    tok = byte_level([b"ab", b" ab"], [(b"a", b"b"), (b" ", b"ab")])
    monkeypatch.setattr(reftok, "CACHE_MAX", 2)
    enc = Encoder(tok)
    text = "ab ab x ab y ab ab"
    assert enc.encode(text) == enc.encode(text) == Encoder(tok).encode(text)
    assert len(enc._cache) <= 2


# -- (b) against HF tokenizers ---------------------------------------------------------------

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or "
    "one had by word but not what all were we when your can said there use an each which she do "
    "how their if will up other about out many then them these so some her would make like"
).split()
RARE = ["naïve", "café", "Zürich", "東京", "中文", "привет", "नमस्ते", "ภาษาไทย", "😀", "👍🏽"]
PUNCT = [".", ",", "!", "?", "...", ":", ";", "-", "(", ")", '"', "--"]
ADDED = ["<A>", "<AB>", "<ABC>", "<BC>", "<A><AB>", "[INST]", "[/INST]", "🤗"]
SPECIALS = {1: ["<s>", "</s>"], 2: ["<|begin|>", "<|end|>"]}

STRESS = [
    "",
    " ",
    "  ",
    "          ",
    "   \n\n  \t",
    "\t",
    "\n",
    "\r\n",
    "a\tb\r\nc",
    "hello world",
    "Hello  World\n\nI'm HERE'S they'LL we'Ve you'D",
    "don't DON'T Don'T 'ſ",
    "1 12 123 1234 12345",
    "1234567890123 0 00 007",
    "3.14159 -2e10 1,000,000",
    "!!!...?? --- ((x))",
    "a+b=c; x->y",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 😀👍🏽 x😀y",
    "中文日本語 東京",
    "ภาษาไทย นิดเดียว",
    "नमस्ते दुनिया",
    "Привет, мир!",
    "e\u0301 é a\u0308 ä \u0301",
    "\u00a0nbsp\u2003em\u3000",
    "\x1c\x1d\x1e\x1f x",
    "zqjxkvw ŋ ẞ ſ Ω",
    "<|begin|>hello<|end|><|end|>x",
    "<|begi <|end",
    "x<A><AB><ABC>y",
    "<A<B>> <AB>C<BC>",
    "[INST] hi [/INST]",
    "<A>the<BC> of",
    "🤗🤗x🤗",
    "<s>hello</s> <s> x",
    " leading",
    "trailing ",
    "the   of    and\n\n\nthe",
    "def f(x):\n    return x  # ok\n",
    "THE OF AND",
    "the'S one'LL",
    "naïve café Zürich",
]


def corpus(n: int = 3000, seed: int = 0) -> list[str]:
    r = random.Random(seed)
    lines = []
    for _ in range(n):
        ws = []
        for _ in range(r.randint(1, 12)):
            x = r.random()
            w = (
                r.choice(WORDS)
                if x < 0.75
                else r.choice(RARE)
                if x < 0.82
                else str(r.randint(0, 10 ** r.randint(1, 7)))
                if x < 0.9
                else r.choice(WORDS) + r.choice(["'s", "'t", "'re", "'ll", "'ve", "'d", "'m"])
            )
            w = w.capitalize() if r.random() < 0.15 else w.upper() if r.random() < 0.03 else w
            ws.append(w + r.choice(PUNCT) if r.random() < 0.2 else w)
        lines.append(r.choice([" "] * 8 + ["  ", "\t", "\n", " \n"]).join(ws))
    return lines


def gpt2_bytes_to_unicode() -> dict[int, str]:
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@cache
def trained(kind: int) -> tuple[dict, list]:
    """(vocab, merges) trained by HF's BpeTrainer: byte-level with the Llama 3 split (all 256 bytes
    in the alphabet), or SentencePiece-style on whole lines with a small alphabet (so that rarer
    characters need the byte fallback)."""
    tk = pytest.importorskip("tokenizers")
    t = tk.Tokenizer(tk.models.BPE())
    if kind == 2:
        t.pre_tokenizer = tk.pre_tokenizers.Sequence(
            [
                tk.pre_tokenizers.Split(tk.Regex(REGEXES["llama3"]), "isolated"),
                tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        trainer = tk.trainers.BpeTrainer(
            vocab_size=700,
            special_tokens=SPECIALS[2],
            show_progress=False,
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        )
    else:
        t.normalizer = tk.normalizers.Sequence([tk.normalizers.Prepend(S), tk.normalizers.Replace(" ", S)])
        trainer = tk.trainers.BpeTrainer(
            vocab_size=600, limit_alphabet=60, special_tokens=SPECIALS[1], show_progress=False
        )
    t.train_from_iterator(corpus(), trainer)
    model = json.loads(t.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]


def hf_tokenizer(kind: int, flags: int):
    """The HF pipeline that flags describe (what tools/convert_tokenizer.py reads)."""
    tk = pytest.importorskip("tokenizers")
    pt, norm, dec = tk.pre_tokenizers, tk.normalizers, tk.decoders
    vocab, merges = trained(kind)
    if kind == 1:  # byte tokens <0xXX> after the specials, as in Llama 2
        v = {p: i for i, p in enumerate(SPECIALS[1] + [f"<0x{b:02X}>" for b in range(256)])}
        for p in sorted(vocab, key=vocab.get):
            v.setdefault(p, len(v))
        vocab = v
    t = tk.Tokenizer(tk.models.BPE(vocab, merges, byte_fallback=kind == 1, ignore_merges=bool(flags & 2)))
    if kind == 1:
        if flags & 4:
            t.pre_tokenizer = pt.Metaspace(replacement=S, prepend_scheme="first", split=False)
        else:
            t.normalizer = norm.Sequence([norm.Prepend(S), norm.Replace(" ", S)])
        t.decoder = dec.Sequence([dec.Replace(S, " "), dec.ByteFallback(), dec.Fuse(), dec.Strip(" ", 1, 0)])
    else:
        if flags & 8:
            t.normalizer = norm.NFC()
        steps = [pt.Digits(individual_digits=True)] if flags & 64 else []
        if flags & 32:
            steps.append(pt.ByteLevel(add_prefix_space=False, use_regex=True))
        else:
            regex = REGEXES["llama3_single_digits" if flags & 16 else "llama3"]
            steps += [
                pt.Split(tk.Regex(regex), "isolated"),
                pt.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        t.pre_tokenizer = pt.Sequence(steps)
        t.decoder = dec.ByteLevel()
    t.add_special_tokens([tk.AddedToken(a, normalized=False) for a in SPECIALS[kind]])
    t.add_tokens([tk.AddedToken(a, normalized=False) for a in ADDED])
    return t


def to_mlt(hf, kind: int, flags: int) -> Tokenizer:
    """A minimal tokenizer.json -> .mlt mapping: byte-level pieces back to raw bytes, <0xXX> to
    byte tokens, added tokens as their UTF-8 text."""
    j = json.loads(hf.to_str())
    vocab = dict(j["model"]["vocab"])
    added = {a["id"]: a["content"] for a in j["added_tokens"]}
    by_id = {i: p for p, i in vocab.items()} | added
    u2b = {u: b for b, u in gpt2_bytes_to_unicode().items()}
    tokens = []
    for i in range(len(by_id)):
        p = by_id[i]
        if i in added:
            tokens.append((1, p.encode()))
        elif kind == 1 and (m := re.fullmatch(r"<0x([0-9A-F]{2})>", p)):
            tokens.append((2, bytes([int(m[1], 16)])))
        else:
            tokens.append((0, bytes(u2b[c] for c in p) if kind == 2 else p.encode()))
    merges = [(vocab[a], vocab[b], vocab[a + b]) for a, b in j["model"]["merges"]]
    bos = hf.token_to_id(SPECIALS[kind][0])
    return Tokenizer(kind, flags, bos, hf.token_to_id(SPECIALS[kind][1]), tokens, merges)


CONFIGS = [(2, f) for f in (0, 1, 2, 8, 16, 32, 64, 2 | 8 | 64, 16 | 64, 2 | 32 | 64, 1 | 2 | 8)] + [
    (1, f) for f in (0, 1, 2, 4, 2 | 4, 1 | 4)
]


@cache
def pair(kind: int, flags: int):
    hf = hf_tokenizer(kind, flags)
    return hf, Encoder(to_mlt(hf, kind, flags))


def hf_ids(hf, enc: Encoder, text: str) -> list[int]:
    ids = hf.encode(text, add_special_tokens=False).ids
    return [enc.tok.bos, *ids] if enc.flags & 1 else ids


def test_trained_tokenizers_are_meaningful():
    hf, enc = pair(1, 0)
    assert any(a == 2 for a in (enc.tok.tokens[i][0] for i in enc.encode("东京 zqjx")))  # byte fallback
    assert len(enc.tok.merges) > 200 and any(S.encode() in p[1:] for _, p in enc.tok.tokens)
    hf, enc = pair(2, 0)
    assert len(enc.tok.merges) > 300 and len(enc.encode("the of and")) == 3


@pytest.mark.parametrize(("kind", "flags"), CONFIGS, ids=[f"kind{k}-flags{f}" for k, f in CONFIGS])
def test_stress_against_hf(kind, flags):
    hf, enc = pair(kind, flags)
    for text in STRESS + corpus(40, seed=1):
        ids = enc.encode(text)
        assert ids == hf_ids(hf, enc, text), repr(text)
        assert enc.decode_text(ids) == hf.decode(ids, skip_special_tokens=False), repr(text)


ALPHABET = (
    list(" \t\r\n\x0b\x1c\x85\xa0\u3000'sStTlLdDſ0123456789٣²abxyzé\u0301!?.,-<>|ABC中😀👍🏽\u200d" + S)
    + WORDS[:12]
    + RARE[:4]
    + ADDED
    + SPECIALS[1]
    + SPECIALS[2]
    + ["<A", "[INST"]
)
TEXTS = st.one_of(st.text(max_size=30), st.lists(st.sampled_from(ALPHABET), max_size=20).map("".join))


@settings(max_examples=150, deadline=None)
@given(text=TEXTS)
def test_generated_against_hf(text):
    for kind, flags in CONFIGS:
        hf, enc = pair(kind, flags)
        ids = enc.encode(text)
        assert ids == hf_ids(hf, enc, text)
        assert enc.decode_text(ids) == hf.decode(ids, skip_special_tokens=False)


# -- (c) properties --------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(text=TEXTS)
def test_byte_level_roundtrip(text):
    for kind, flags in CONFIGS:
        if kind == 2 and not flags & (1 | 8):  # no BOS, no NFC: decoding gives the text back
            _, enc = pair(kind, flags)
            assert enc.decode(enc.encode(text)) == text.encode()
    tok = byte_level([b"ab", b" ab"], [(b"a", b"b"), (b" ", b"ab")], added=[b"<|e|>"])
    enc = Encoder(tok)
    assert enc.decode(enc.encode(text)) == text.encode()


HAND = [
    byte_level([b"ab"], [(b"a", b"b")], flags=2 | 8 | 64, skip_bytes=b"z\xc3"),
    byte_level([b"ab"], [(b"a", b"b")], flags=16, added=[b"<|e|>", b"\xff"]),
    byte_level([], [], flags=32),
    sp([S, "a", S + "a"], [(S, "a")], byte_tokens=False, added=["<s>"]),
    sp([S, "a", S + "a"], [(S, "a")], flags=4 | 2, added=["<s>"]),
]


@settings(max_examples=200, deadline=None)
@given(text=st.text(), bos=st.booleans())
def test_encode_never_raises(text, bos):
    for tok in HAND:
        tok.flags = tok.flags | 1 if bos else tok.flags & ~1
        tok.bos = 0
        enc = Encoder(tok)
        ids = enc.encode(text)
        assert all(0 <= i < tok.n_vocab for i in ids)
        assert isinstance(enc.decode(ids), bytes) and isinstance(enc.decode_text(ids), str)
