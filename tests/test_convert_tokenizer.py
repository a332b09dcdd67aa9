"""tools/convert_tokenizer.py on tokenizer.json variants built here: the flag of each construct,
every refusal (exit 1, a one-line message naming the construct, no file), both merges spellings,
the GPT-2 byte alphabet, tokenizer_config.json. When HF `tokenizers` is installed, every accepted
variant is also encoded by HF and by the reference encoder on a few texts, which must agree.

The base files are minimal but complete: a SentencePiece-style one (Llama 2 layout: <unk> <s> </s>,
the 256 <0xXX> pieces, a few merges spelling "▁hello") and a byte-level one (the 256 GPT-2
alphabet characters, merges spelling "Ġhello", <|endoftext|> added).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mlconf import specs
from mlconf.tools import convert_tokenizer as ct
from mlconf.tools import mlt

REPO = Path(__file__).resolve().parents[1]
REGEX = specs.load("mlt")["regexes"]
SP = "\u2581"
SAMPLE = [
    "hello",
    " hello  world",
    "hello<s>hello</s>",
    "Hi 123 4567!",
    "cafe\u0301 caf\u00e9",
    "\u0e44\u0e17\u0e22",
    "<|endoftext|>hello<|endoftext|>",
    "it's HELLO'S",
    "\n\n \t",
    "",
]


# ---------------------------------------------------------------- base files
def _added(i: int, content: str, **kw) -> dict:
    return {
        "id": i,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
        **kw,
    }


def _model(vocab: dict[str, int], merges: list[list[str]], **kw) -> dict:
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
        "vocab": vocab,
        "merges": merges,
        **kw,
    }


def _doc(model: dict, added: list[dict], normalizer=None, pre=None, post=None) -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre,
        "post_processor": post,
        "decoder": None,
        "model": model,
    }


PREPEND = {
    "type": "Sequence",
    "normalizers": [
        {"type": "Prepend", "prepend": SP},
        {"type": "Replace", "pattern": {"String": " "}, "content": SP},
    ],
}
BL_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
BL_PLAIN = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def metaspace(scheme: str = "first", split_: bool = False) -> dict:
    return {"type": "Metaspace", "replacement": SP, "prepend_scheme": scheme, "split": split_}


def template(*single: str, ids: dict[str, int]) -> dict:
    parts = [
        {"Sequence": {"id": "A", "type_id": 0}} if s == "$A" else {"SpecialToken": {"id": s, "type_id": 0}}
        for s in single
    ]
    return {
        "type": "TemplateProcessing",
        "single": parts,
        "pair": parts,
        "special_tokens": {k: {"id": k, "ids": [v], "tokens": [k]} for k, v in ids.items()},
    }


def seq(kind: str, *items: dict) -> dict:
    key = {"normalizer": "normalizers", "pre": "pretokenizers", "post": "processors"}[kind]
    return {"type": "Sequence", key: list(items)}


SP_MERGES = [[SP, "h"], ["l", "l"], [SP + "h", "e"], [SP + "he", "ll"], [SP + "hell", "o"], ["w", "o"]]


def sp_base() -> dict:
    pieces = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], SP, *"helowrd"]
    pieces += [a + b for a, b in SP_MERGES]
    vocab = {p: i for i, p in enumerate(pieces)}
    added = [_added(0, "<unk>"), _added(1, "<s>"), _added(2, "</s>")]
    model = _model(vocab, copy.deepcopy(SP_MERGES), unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    return _doc(model, added, normalizer=copy.deepcopy(PREPEND))


G = ct.BYTE_TO_CHAR
BL_MERGES = [
    [G[32], "h"],
    ["e", "l"],
    [G[32] + "h", "el"],
    [G[32] + "hel", "l"],
    [G[32] + "hell", "o"],
    ["1", "2"],
    ["12", "3"],
]


def bl_base() -> dict:
    pieces = [G[b] for b in range(256)] + [a + b for a, b in BL_MERGES]
    vocab = {p: i for i, p in enumerate(pieces)}
    added = [_added(len(pieces), "<|endoftext|>")]
    return _doc(_model(vocab, copy.deepcopy(BL_MERGES)), added, pre=copy.deepcopy(BL_REGEX))


BASES = {"sp": sp_base, "bl": bl_base}


def run(doc: dict, tmp: Path, config: dict | None = None) -> tuple[int, str, Path]:
    """main() on doc (and a tokenizer_config.json beside it): (exit status, stderr, output path)."""
    src = tmp / "tokenizer.json"
    src.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    if config is not None:
        (tmp / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    out = tmp / "out" / "tok.mlt"
    out.parent.mkdir(exist_ok=True)
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = ct.main([str(src), str(out)])
    return code, err.getvalue(), out


def hf_agrees(doc: dict, tok: mlt.Tokenizer) -> None:
    """HF's ids equal the reference encoder's on SAMPLE (when both are importable)."""
    tokenizers = pytest.importorskip("tokenizers")
    from mlconf.backends.reference.tokenizer import Encoder

    hf = tokenizers.Tokenizer.from_str(json.dumps(doc))
    enc = Encoder(tok)
    for text in SAMPLE:
        assert enc.encode(text) == hf.encode(text, add_special_tokens=True).ids, repr(text)


# ---------------------------------------------------------------- construct -> flag
def _set(path: str, value) -> Callable[[dict], None]:
    def f(d: dict) -> None:
        node = d
        *head, last = path.split(".")
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = copy.deepcopy(value)

    return f


def _all(*fs: Callable[[dict], None]) -> Callable[[dict], None]:
    def f(d: dict) -> None:
        for g in fs:
            g(d)

    return f


def _drop_byte(b: int, base: str) -> Callable[[dict], None]:
    def f(d: dict) -> None:
        piece = f"<0x{b:02X}>" if base == "sp" else G[b]
        v = d["model"]["vocab"]
        i = v.pop(piece)
        v[f"spare{i}"] = i  # keep ids contiguous: only the byte is missing

    return f


BOS_SP = template("<s>", "$A", ids={"<s>": 1})
DIGITS = {"type": "Digits", "individual_digits": True}
BL_POST = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}


def pre(*items: dict) -> Callable[[dict], None]:
    return _set("pre_tokenizer", items[0] if len(items) == 1 else seq("pre", *items))


def norm(*items: dict | None) -> Callable[[dict], None]:
    return _set("normalizer", items[0] if len(items) == 1 else seq("normalizer", *items))


def post(node: dict) -> Callable[[dict], None]:
    return _set("post_processor", node)


def add(token: dict) -> Callable[[dict], None]:
    return lambda d: d["added_tokens"].append(token)


META = _all(norm(None), pre(metaspace()))
NO_UNK = _set("model.unk_token", None)
LLAMA3 = pre(split(REGEX["llama3"]), BL_PLAIN)
BOS_BL = template("<|endoftext|>", "$A", ids={"<|endoftext|>": 263})
FLAG_CASES: dict[str, tuple[str, Callable[[dict], None], int, int]] = {
    # name: (base, mutation, kind, flags)
    "sp_prepend_replace": ("sp", lambda d: None, 1, 0),
    "sp_replace_then_prepend": ("sp", norm(*PREPEND["normalizers"][::-1]), 1, 0),
    "sp_metaspace_first": ("sp", META, 1, 4),
    "sp_template_bos": ("sp", post(BOS_SP), 1, 1),
    "sp_ignore_merges": ("sp", _set("model.ignore_merges", True), 1, 2),
    "sp_metaspace_bos_ignore": ("sp", _all(META, post(BOS_SP), _set("model.ignore_merges", True)), 1, 7),
    "sp_dropout_zero": ("sp", _set("model.dropout", 0.0), 1, 0),
    "bl_bytelevel_regex": ("bl", lambda d: None, 2, 32),
    "bl_split_llama3": ("bl", LLAMA3, 2, 0),
    "bl_split_qwen2": ("bl", pre(split(REGEX["llama3_single_digits"]), BL_PLAIN), 2, 16),
    "bl_split_gpt2": ("bl", pre(split(REGEX["gpt2"]), BL_PLAIN), 2, 32),
    "bl_digits_bytelevel": ("bl", pre(DIGITS, BL_REGEX), 2, 64 | 32),
    "bl_digits_split_llama3": ("bl", pre(DIGITS, split(REGEX["llama3"]), BL_PLAIN), 2, 64),
    "bl_nested_sequence": ("bl", pre(seq("pre", split(REGEX["llama3"])), seq("pre", BL_PLAIN)), 2, 0),
    "bl_nfc": ("bl", norm({"type": "NFC"}), 2, 32 | 8),
    "bl_nfc_in_sequence": ("bl", norm(seq("normalizer", {"type": "NFC"})), 2, 32 | 8),
    "bl_ignore_merges": ("bl", _set("model.ignore_merges", True), 2, 32 | 2),
    "bl_bytelevel_post": ("bl", post(BL_POST), 2, 32),
    "bl_llama3_bos": ("bl", _all(LLAMA3, post(seq("post", BL_POST, BOS_BL))), 2, 1),
    "bl_normalized_added_no_normalizer": (
        "bl",
        add(_added(264, "<|user|>", normalized=True, special=False)),
        2,
        32,
    ),
    # a byte without a token: HF drops the character when there is no unk_token, as the format does
    "bl_missing_byte_no_unk": ("bl", _drop_byte(0x0A, "bl"), 2, 32),
    "sp_missing_byte_no_unk": ("sp", _all(_drop_byte(0xB8, "sp"), NO_UNK), 1, 0),
    "sp_no_byte_fallback_no_unk": ("sp", _all(_set("model.byte_fallback", False), NO_UNK), 1, 0),
    # an ASCII character with its own piece never falls back to its byte (a space is ▁ by then)
    "sp_ascii_byte_not_needed": ("sp", _all(_drop_byte(0x68, "sp"), _drop_byte(0x20, "sp")), 1, 0),
}


@pytest.mark.parametrize("name", FLAG_CASES)
def test_construct_flag(name, tmp_path):
    base, mutate, kind, flags = FLAG_CASES[name]
    doc = BASES[base]()
    mutate(doc)
    code, err, out = run(doc, tmp_path)
    assert code == 0, err
    tok = mlt.read(out)
    assert (tok.kind, tok.flags) == (kind, flags)
    assert tok.bos >= 0 if flags & 1 else tok.bos == -1
    hf_agrees(doc, tok)


def test_table_names_every_flag():
    """Every flag of specs/mlt.yaml is produced by some construct above."""
    produced = 0
    for _, _, _, flags in FLAG_CASES.values():
        produced |= flags
    assert produced == sum(f["bit"] for f in specs.load("mlt")["flags"])


# ---------------------------------------------------------------- refusals
def _cfg(d: dict, cfg: dict) -> None:
    d["__config__"] = cfg


def vocab(**pieces: int) -> Callable[[dict], None]:
    """Add vocab pieces (and drop the added tokens, whose ids they may take)."""

    def f(d: dict) -> None:
        d["model"]["vocab"].update(pieces)
        d["added_tokens"].clear()

    return f


def merges(*ms) -> Callable[[dict], None]:
    return lambda d: d["model"].update(merges=list(ms))


def cfg(**kw) -> Callable[[dict], None]:
    return lambda d: _cfg(d, kw)


UNIGRAM = {"type": "Unigram", "unk_id": None, "vocab": [["a", 0.0]], "byte_fallback": False}
WORDPIECE = {
    "type": "WordPiece",
    "unk_token": "[UNK]",
    "continuing_subword_prefix": "##",
    "max_input_chars_per_word": 100,
    "vocab": {"a": 0},
}
WORDLEVEL = {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}
SPLIT_STRING = {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False}
STRIP = {"type": "Strip", "strip_left": True, "strip_right": True}
ROBERTA = {
    "type": "RobertaProcessing",
    "sep": ["</s>", 2],
    "cls": ["<s>", 1],
    "trim_offsets": True,
    "add_prefix_space": False,
}
BERT = {"type": "BertProcessing", "sep": ["a", 2], "cls": ["b", 1]}
TRUNCATION = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
PADDING = {
    "strategy": {"Fixed": 8},
    "direction": "Right",
    "pad_to_multiple_of": None,
    "pad_id": 0,
    "pad_type_id": 0,
    "pad_token": "!",
}
OLD_METASPACE = {"type": "Metaspace", "replacement": SP, "add_prefix_space": True, "split": False}
TWO_IDS = dict(BOS_SP, special_tokens={"<s>": {"id": "<s>", "ids": [1, 2], "tokens": ["<s>", "</s>"]}})
L3 = split(REGEX["llama3"])

REFUSALS: dict[str, tuple[str, Callable[[dict], None], str]] = {
    # name: (base, mutation, text the message must contain)
    "unigram": ("sp", _set("model", UNIGRAM), "model Unigram"),
    "wordpiece": ("bl", _set("model", WORDPIECE), "model WordPiece"),
    "wordlevel": ("bl", _set("model", WORDLEVEL), "model WordLevel"),
    "unknown_regex": ("bl", pre(split(r"\w+|\s+"), BL_PLAIN), "pattern Regex"),
    "split_string_pattern": ("bl", pre(SPLIT_STRING, BL_PLAIN), "pattern String"),
    "split_removed": ("bl", pre(dict(L3, behavior="Removed"), BL_PLAIN), "behavior"),
    "split_invert": ("bl", pre(dict(L3, invert=True), BL_PLAIN), "invert"),
    "split_then_regex_bytelevel": ("bl", pre(L3, BL_REGEX), "two regexes"),
    "bytelevel_no_regex_alone": ("bl", pre(BL_PLAIN), "use_regex=false"),
    "bytelevel_add_prefix_space": ("bl", pre(dict(BL_REGEX, add_prefix_space=True)), "add_prefix_space"),
    "digits_grouped": ("bl", pre(dict(DIGITS, individual_digits=False), BL_REGEX), "individual_digits"),
    "digits_after_bytelevel": ("bl", pre(BL_REGEX, DIGITS), "Sequence"),
    "bert_pre_tokenizer": ("bl", pre({"type": "BertPreTokenizer"}), "BertPreTokenizer"),
    "whitespace_then_bytelevel": ("bl", pre({"type": "Whitespace"}, BL_REGEX), "Whitespace"),
    "lowercase": ("bl", norm({"type": "Lowercase"}), "normalizer Lowercase"),
    "nfkc": ("bl", norm({"type": "NFKC"}), "normalizer NFKC"),
    "nfd": ("bl", norm({"type": "NFD"}), "normalizer NFD"),
    "nfc_then_lowercase": ("bl", norm({"type": "NFC"}, {"type": "Lowercase"}), "Lowercase"),
    "strip": ("sp", norm(*PREPEND["normalizers"], STRIP), "Strip"),
    "prepend_other": ("sp", _set("normalizer.normalizers.0.prepend", "_"), "Prepend"),
    "replace_other": ("sp", _set("normalizer.normalizers.1.content", "_"), "Replace"),
    "nfc_in_sentencepiece": ("sp", _all(norm({"type": "NFC"}), pre(metaspace())), "does not apply"),
    "metaspace_split": ("sp", _all(norm(None), pre(metaspace(split_=True))), "split=true"),
    "metaspace_always": ("sp", _all(norm(None), pre(metaspace("always"))), "prepend_scheme 'always'"),
    "metaspace_never": ("sp", _all(norm(None), pre(metaspace("never"))), "prepend_scheme 'never'"),
    "metaspace_legacy_add_prefix_space": ("sp", _all(norm(None), pre(OLD_METASPACE)), "'always'"),
    "prepend_and_metaspace": ("sp", pre(metaspace()), "both"),
    "no_kind": ("sp", norm(None), "no .mlt kind"),
    "bytelevel_with_prepend": ("bl", norm(PREPEND), "does not apply"),
    "dropout": ("sp", _set("model.dropout", 0.1), "dropout"),
    "continuing_subword_prefix": ("bl", _set("model.continuing_subword_prefix", "##"), "continuing_subword"),
    "end_of_word_suffix": ("bl", _set("model.end_of_word_suffix", "</w>"), "end_of_word_suffix"),
    "sp_unk_without_byte_fallback": ("sp", _set("model.byte_fallback", False), "unk_token='<unk>'"),
    "bl_byte_fallback": ("bl", _set("model.byte_fallback", True), "byte_fallback"),
    "sp_missing_byte_token": ("sp", _drop_byte(0x80, "sp"), "<0x80>"),
    "bl_missing_byte_with_unk": ("bl", _all(_drop_byte(0x0A, "bl"), _set("model.unk_token", "!")), "0x0a"),
    "added_lstrip": ("bl", _set("added_tokens.0.lstrip", True), "lstrip"),
    "added_rstrip": ("bl", _set("added_tokens.0.rstrip", True), "rstrip"),
    "added_single_word": ("bl", _set("added_tokens.0.single_word", True), "single_word"),
    "added_normalized_with_prepend": ("sp", _set("added_tokens.1.normalized", True), "normalized=true"),
    "added_normalized_with_nfc": (
        "bl",
        _all(norm({"type": "NFC"}), _set("added_tokens.0.normalized", True)),
        "normalized=true",
    ),
    "added_normalized_overlap": (
        "bl",
        add(_added(264, "x<|endoftext", normalized=True, special=False)),
        "overlap",
    ),
    "added_empty": ("bl", _set("added_tokens.0.content", ""), "non-empty content"),
    "added_id_twice": ("bl", add(_added(263, "<|x|>")), "listed twice"),
    "added_differs_from_vocab": ("sp", _set("added_tokens.1.content", "<S>"), "differs from vocab piece"),
    "id_gap": ("bl", _set("added_tokens.0.id", 300), "not contiguous"),
    "vocab_id_twice": ("bl", vocab(zz=5), "both 5"),
    "piece_outside_alphabet": ("bl", lambda d: vocab(**{" x": 263})(d), "GPT-2 byte alphabet"),
    "merge_result_missing": ("bl", merges(*BL_MERGES, ["h", "e"]), "the result 'he'"),
    "merge_side_missing": ("bl", merges(*BL_MERGES, ["zz", "e"]), "'zz' is not in the vocab"),
    "merge_string_three_parts": ("sp", merges(f"{SP} h x"), "one space"),
    "merge_not_pair": ("bl", merges(["a", "b", "c"]), "not a pair"),
    "roberta_processing": ("bl", post(ROBERTA), "RobertaProcessing"),
    "bert_processing": ("bl", post(BERT), "BertProcessing"),
    "template_eos": ("sp", post(template("$A", "</s>", ids={"</s>": 2})), "['A', 'S']"),
    "template_bos_eos": ("sp", post(template("<s>", "$A", "</s>", ids={"<s>": 1, "</s>": 2})), "'A', 'S'"),
    "template_two_ids": ("sp", post(TWO_IDS), "one id"),
    "truncation": ("bl", _set("truncation", TRUNCATION), "truncation"),
    "padding": ("bl", _set("padding", PADDING), "padding"),
    "config_add_eos": ("sp", cfg(add_eos_token=True), "add_eos_token"),
    "config_add_bos_without_template": ("sp", cfg(add_bos_token=True, bos_token="<s>"), "add_bos_token=True"),
    "config_no_bos_with_template": ("sp", _all(post(BOS_SP), cfg(add_bos_token=False)), "add_bos_token=Fal"),
    "config_bos_differs": ("sp", _all(post(BOS_SP), cfg(bos_token="</s>")), "differs"),
    "config_eos_unknown": ("sp", cfg(eos_token="<eos>"), "'<eos>' is not a token"),
    "empty_piece": ("bl", lambda d: vocab(**{"": 263})(d), "vocab piece 263 is empty"),
}


@pytest.mark.parametrize("name", REFUSALS)
def test_refusal(name, tmp_path):
    base, mutate, needle = REFUSALS[name]
    doc = BASES[base]()
    mutate(doc)
    config = doc.pop("__config__", None)
    code, err, out = run(doc, tmp_path, config)
    assert code == 4
    assert err.startswith("mlconf: error: ") and err.count("\n") == 1, err
    assert needle in err, err
    assert list(out.parent.iterdir()) == [], "a refusal leaves no file (not even a temporary one)"


def test_refusal_keeps_an_existing_output(tmp_path):
    doc = bl_base()
    doc["model"]["dropout"] = 0.5
    out = tmp_path / "out" / "tok.mlt"
    out.parent.mkdir()
    out.write_bytes(b"old")
    src = tmp_path / "t.json"
    src.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ct.ConvertError):
        ct.convert(src, out)
    assert out.read_bytes() == b"old"


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"model": 3}'])
def test_unreadable_input(content, tmp_path, capsys):
    src = tmp_path / "tokenizer.json"
    src.write_text(content, encoding="utf-8")
    assert ct.main([str(src), str(tmp_path / "o.mlt")]) == 4
    assert capsys.readouterr().err.startswith(f"mlconf: error: {src}: ")
    assert not (tmp_path / "o.mlt").exists()
    assert ct.main([str(tmp_path / "missing.json"), str(tmp_path / "o.mlt")]) == 4


@pytest.mark.parametrize(
    "mutate",
    [
        _set("added_tokens", [3]),
        _set("model.merges", [[1, 2]]),
        _set("model.merges", 7),
        _set("post_processor", template("<s>", "$A", ids={}) | {"single": [{"SpecialToken": {}}]}),
        _set("pre_tokenizer", {"type": "Sequence", "pretokenizers": [5]}),
        _set("normalizer", "NFC"),
    ],
    ids=[
        "added_not_objects",
        "merge_ints",
        "merges_int",
        "template_no_id",
        "pre_not_object",
        "normalizer_str",
    ],
)
def test_malformed_fields_give_one_line(mutate, tmp_path):
    doc = sp_base()
    mutate(doc)
    code, err, out = run(doc, tmp_path)
    assert code == 4 and err.startswith("mlconf: error: ") and err.count("\n") == 1, err
    assert list(out.parent.iterdir()) == []


# ---------------------------------------------------------------- merges, bytes, pieces
def test_merges_both_spellings_give_the_same_file(tmp_path):
    for base in (sp_base, bl_base):
        pairs, strings = base(), base()
        strings["model"]["merges"] = [" ".join(m) for m in strings["model"]["merges"]]
        a = mlt.to_bytes(ct.build(_write(pairs, tmp_path / "a.json")))
        b = mlt.to_bytes(ct.build(_write(strings, tmp_path / "b.json")))
        assert a == b


def test_merges_are_ids_in_rank_order(tmp_path):
    tok = ct.build(_write(sp_base(), tmp_path / "t.json"))
    v = sp_base()["model"]["vocab"]
    assert tok.merges == [(v[a], v[b], v[a + b]) for a, b in SP_MERGES]


def test_duplicate_merge_takes_its_later_rank(tmp_path):
    """HF builds its merge map in list order, so a pair listed twice has its later rank."""
    doc = bl_base()
    doc["model"]["merges"] = [["e", "l"], [G[32], "h"], [G[32] + "h", "el"], ["e", "l"]]
    tok = ct.build(_write(doc, tmp_path / "t.json"))
    v = doc["model"]["vocab"]
    assert tok.merges == [
        (v[G[32]], v["h"], v[G[32] + "h"]),
        (v[G[32] + "h"], v["el"], v[G[32] + "hel"]),
        (v["e"], v["l"], v["el"]),
    ]
    tokenizers = pytest.importorskip("tokenizers")
    from mlconf.backends.reference.tokenizer import Encoder

    hf = tokenizers.Tokenizer.from_str(json.dumps(doc))
    for text in (" hel", "hel", " help"):
        assert Encoder(tok).encode(text) == hf.encode(text).ids


def test_gpt2_byte_alphabet():
    m = ct.BYTE_TO_CHAR
    assert sorted(m) == list(range(256)) and len(set(m.values())) == 256
    assert all(m[b] == chr(b) for b in range(0x21, 0x7F))  # printable ASCII is itself
    # the unprintable bytes take U+0100.. in byte order: 0x00-0x20, 0x7F-0xA0, 0xAD
    assert [m[b] for b in (0x00, 0x0A, 0x20, 0x7F, 0xA0, 0xAD)] == [
        "\u0100",
        "\u010a",
        "\u0120",
        "\u0121",
        "\u0142",
        "\u0143",
    ]
    assert ct.CHAR_TO_BYTE["\u0120"] == 0x20
    tokenizers = pytest.importorskip("tokenizers")
    assert set(m.values()) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())


def test_byte_level_pieces_are_raw_bytes(tmp_path):
    doc = bl_base()
    n = len(doc["model"]["vocab"])
    doc["model"]["vocab"].update({"\u00c3\u00a9": n, "\u0120\u010a": n + 1})  # "é" in UTF-8, " \n"
    doc["added_tokens"][0]["id"] = n + 2
    tok = ct.build(_write(doc, tmp_path / "t.json"))
    assert tok.tokens[0x41] == (mlt.ATTR_PLAIN, b"A") and tok.tokens[0x20] == (mlt.ATTR_PLAIN, b" ")
    assert tok.tokens[256] == (mlt.ATTR_PLAIN, b" h")
    assert tok.tokens[n] == (mlt.ATTR_PLAIN, "é".encode()) and tok.tokens[n + 1] == (mlt.ATTR_PLAIN, b" \n")
    assert tok.tokens[n + 2] == (mlt.ATTR_ADDED, b"<|endoftext|>")


def test_byte_pieces_without_byte_fallback_are_plain(tmp_path):
    doc = sp_base()
    doc["model"].update(byte_fallback=False, unk_token=None)
    tok = ct.build(_write(doc, tmp_path / "t.json"))
    assert tok.tokens[3] == (mlt.ATTR_PLAIN, b"<0x00>")


def test_sentencepiece_pieces(tmp_path):
    doc = sp_base()
    n = len(doc["model"]["vocab"])
    doc["model"]["vocab"].update({"<0x0a>": n, "\u4e2d": n + 1})  # lower-case hex is not a byte token in HF
    tok = ct.build(_write(doc, tmp_path / "t.json"))
    assert tok.tokens[:3] == [(mlt.ATTR_ADDED, b"<unk>"), (mlt.ATTR_ADDED, b"<s>"), (mlt.ATTR_ADDED, b"</s>")]
    assert tok.tokens[3] == (mlt.ATTR_BYTE, b"\x00") and tok.tokens[3 + 0x0A] == (mlt.ATTR_BYTE, b"\n")
    assert tok.tokens[258] == (mlt.ATTR_BYTE, b"\xff")
    assert tok.tokens[259] == (mlt.ATTR_PLAIN, SP.encode())
    assert tok.tokens[n] == (mlt.ATTR_PLAIN, b"<0x0a>")
    assert tok.tokens[n + 1] == (mlt.ATTR_PLAIN, "中".encode())


def test_added_tokens_beyond_the_vocab(tmp_path):
    doc = bl_base()
    n = len(doc["model"]["vocab"])
    doc["added_tokens"] += [_added(n + 1, "<|eot_id|>"), _added(n + 2, "<|a b|>", special=False)]
    tok = ct.build(_write(doc, tmp_path / "t.json"))
    assert tok.tokens[n:] == [(1, b"<|endoftext|>"), (1, b"<|eot_id|>"), (1, b"<|a b|>")]


# ---------------------------------------------------------------- bos / eos and tokenizer_config.json
def test_specials_from_config_and_template(tmp_path):
    doc = sp_base()
    doc["post_processor"] = BOS_SP
    cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": {"content": "<s>", "lstrip": False},
        "eos_token": "</s>",
    }
    code, err, out = run(doc, tmp_path, cfg)
    assert code == 0, err
    tok = mlt.read(out)
    assert (tok.bos, tok.eos, tok.flags) == (1, 2, 1)


def test_specials_without_config(tmp_path):
    tok = ct.build(_write(sp_base(), tmp_path / "t.json"))
    assert (tok.bos, tok.eos, tok.flags) == (-1, -1, 0)
    doc = sp_base()
    doc["post_processor"] = BOS_SP
    tok = ct.build(_write(doc, tmp_path / "t.json"))
    assert (tok.bos, tok.eos, tok.flags) == (1, -1, 1)


def test_bos_named_in_config_is_not_added(tmp_path):
    """Early Llama 3 files: bos_token in the config, no BOS in the post-processor -> bos set, flag 1 clear
    (HF tokenizers adds none)."""
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}), encoding="utf-8")
    tok = ct.build(_write(bl_base(), tmp_path / "t.json"), cfg)
    assert (tok.bos, tok.eos, tok.flags & 1) == (263, 263, 0)


def test_config_option_and_beside(tmp_path, capsys):
    src = _write(sp_base(), tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}), encoding="utf-8")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"eos_token": "<unk>"}), encoding="utf-8")
    assert ct.build(src).eos == 2
    assert ct.build(src, other).eos == 0
    assert ct.main([str(src), str(tmp_path / "a.mlt"), "--config", str(other)]) == 0
    assert mlt.read(tmp_path / "a.mlt").eos == 0
    assert "n_vocab" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    assert ct.main([str(src), str(tmp_path / "b.mlt"), "--config", str(bad)]) == 4
    assert not (tmp_path / "b.mlt").exists()


# ---------------------------------------------------------------- as a script, imports
def test_runs_as_a_script(tmp_path):
    src = _write(bl_base(), tmp_path / "t.json")
    script = REPO / "tools" / "convert_tokenizer.py"
    r = subprocess.run(
        [sys.executable, str(script), str(src), str(tmp_path / "t.mlt")],
        capture_output=True,
        text=True,
        encoding="utf-8",
    )
    assert r.returncode == 0, r.stderr
    assert mlt.read(tmp_path / "t.mlt").kind == 2
    doc = bl_base()
    doc["model"]["type"] = "WordPiece"
    src = _write(doc, tmp_path / "w.json")
    r = subprocess.run(
        [sys.executable, str(script), str(src), str(tmp_path / "w.mlt")],
        capture_output=True,
        text=True,
        encoding="utf-8",
    )
    assert r.returncode == 4 and r.stderr.startswith("mlconf: error: ") and "Traceback" not in r.stderr
    assert not (tmp_path / "w.mlt").exists()


def test_imports_neither_the_harness_nor_hf():
    code = (
        "import sys, mlconf.tools.convert_tokenizer, mlconf.tools.golden_tokenizers\n"
        "mods = [m for m in sys.modules if m.startswith('mlconf.')]\n"
        "ok = ('mlconf.tools', 'mlconf.backends', 'mlconf.specs', 'mlconf.golden')\n"
        "bad = [m for m in mods if not m.startswith(ok)]\n"
        "assert not bad, bad\n"
        "assert 'tokenizers' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, encoding="utf-8")
    assert r.returncode == 0, r.stderr


def _write(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return path
