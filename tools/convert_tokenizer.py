"""Convert a Hugging Face tokenizer.json (BPE) to an .mlt tokenizer file (seed 000, ".mlt tokenizer format").

    python tools/convert_tokenizer.py tokenizer.json OUT.mlt [--config tokenizer_config.json]

Library: ``convert(json_path, out_path, config_path=None) -> Tokenizer`` and ``build(...)`` (no file)
(mlconf.tools.convert_tokenizer). A tokenizer_config.json beside the input is read when present
(bos_token, eos_token, add_bos_token, add_eos_token); ``--config`` names another one.

What maps to what (the tables below are the code; HF = what `tokenizers` does):

  construct in tokenizer.json                                 kind  flags
  normalizer Sequence[Prepend("▁"), Replace(" ", "▁")]          1    0   ▁ before every piece
  pre_tokenizer Metaspace(prepend_scheme first, split false)    1    4   ▁ at offset 0 only
  model.byte_fallback + <0xXX> vocab entries                    1    -   attr 2, the one byte
  pre_tokenizer ByteLevel(use_regex=true)                       2   32   GPT-2 regex
  Split(Regex(llama3), Isolated) + ByteLevel(use_regex=false)   2    0
  Split(Regex(llama3, \\p{N}), Isolated) + ByteLevel(...)        2   16   Qwen2
  Split(Regex(gpt2), Isolated) + ByteLevel(use_regex=false)     2   32
  Digits(individual_digits=true) before the above               2   64   SmolLM
  normalizer NFC                                                2    8
  model.ignore_merges                                          1, 2  2
  post_processor TemplateProcessing single [BOS, $A]           1, 2  1   bos = that token
  added_tokens                                                 1, 2  -   attr 1, UTF-8 content

Everything else is refused with a message naming the construct (exit 1, no file written): other
models (Unigram, WordPiece, WordLevel), other normalizers and pre-tokenizers, unknown regexes,
Metaspace split=true or prepend_scheme always/never, dropout, continuing_subword_prefix,
end_of_word_suffix, an unk_token HF can emit (the format has no unk id: kind 1 without byte_fallback,
or a byte with no token), byte_fallback in a byte-level model, added tokens with lstrip / rstrip /
single_word, normalized added tokens where normalization changes what they match, EOS appended by
the post-processor or add_eos_token, truncation and padding, merges naming pieces not in the vocab.

Decisions (each matches what HF does, checked in tests/test_convert_tokenizer.py against HF):
- Flag 4 unset is HF's Prepend normalizer: ▁ before every non-empty piece between added tokens,
  even one that starts with a space. Flag 4 is Metaspace prepend_scheme "first": ▁ only for the
  piece at offset 0, and not when it starts with a space. Metaspace "always" (every piece, but not
  one that starts with a space) is neither, so it is refused.
- A merge pair listed twice keeps its later rank (HF builds its map in list order).
- normalized=true added tokens are accepted only without a normalizer, and only when none can
  overlap a normalized=false one (HF matches the two groups in two passes, the format in one).
- A byte with no token is refused only when HF would emit unk_token for it; without one, HF drops
  the character, as the format does.
- BOS: flag 1 and bos from the post-processor (what `tokenizers` adds); bos from bos_token in
  tokenizer_config.json when the post-processor adds none; eos from eos_token, else -1. A config
  whose add_bos_token or bos_token contradicts the post-processor is refused as ambiguous.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlconf import specs
from mlconf.tools import exits, mlt
from mlconf.tools.files import read_regular
from mlconf.tools.mlt import (
    ATTR_ADDED,
    ATTR_BYTE,
    ATTR_PLAIN,
    FLAG_ADD_BOS,
    FLAG_GPT2_REGEX,
    FLAG_IGNORE_MERGES,
    FLAG_INDIVIDUAL_DIGITS,
    FLAG_NFC,
    FLAG_PREFIX_FIRST_ONLY,
    FLAG_SINGLE_DIGITS,
    KIND_BYTE_LEVEL,
    KIND_SP,
    Tokenizer,
)

SPIECE = "\u2581"  # ▁, SentencePiece's space
BYTE_TOKEN = re.compile(r"<0x([0-9A-F]{2})>")  # the exact spelling HF's byte_fallback looks up


class ConvertError(ValueError):
    """A tokenizer the converter refuses; the message names the construct."""


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable alphabet: byte -> the character tokenizer.json uses for it."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:  # the unprintable bytes take the code points from U+0100 on, in byte order
            out[b] = chr(256 + extra)
            extra += 1
    return out


BYTE_TO_CHAR = gpt2_bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}

# ---------------------------------------------------------------- construct -> flag tables
_REGEXES = specs.load("mlt")["regexes"]
# Split(Regex(...), Isolated) before ByteLevel(use_regex=false): the regex text -> flag
SPLIT_REGEX_FLAGS: dict[str, int] = {
    _REGEXES["llama3"]: 0,
    _REGEXES["llama3_single_digits"]: FLAG_SINGLE_DIGITS,
    _REGEXES["gpt2"]: FLAG_GPT2_REGEX,
}
BYTE_LEVEL_REGEX_FLAG = FLAG_GPT2_REGEX  # ByteLevel(use_regex=true) splits with the GPT-2 regex
DIGITS_FLAG = FLAG_INDIVIDUAL_DIGITS  # Digits(individual_digits=true) before the byte-level split
# Metaspace prepend_scheme -> flag. "always" is HF's per-piece prefix but skipped when the piece
# already starts with ▁ (a leading space); flag 4 unset is the Prepend normalizer's unconditional
# prefix (Llama 2 = SentencePiece add_dummy_prefix), so "always" has no exact flag. "first" is
# the conditional prefix at offset 0 only, which is what flag 4 means (see Decisions above).
METASPACE_SCHEME_FLAGS: dict[str, int] = {"first": FLAG_PREFIX_FIRST_ONLY}
NORMALIZER_FLAGS: dict[str, tuple[int, int]] = {"NFC": (KIND_BYTE_LEVEL, FLAG_NFC)}  # type -> (kind, flag)
MODEL_FLAGS: dict[str, int] = {"ignore_merges": FLAG_IGNORE_MERGES}
# Added-token options with no .mlt equivalent: the format matches the literal content anywhere.
ADDED_REFUSED: dict[str, str] = {
    "lstrip": "HF takes the white space before it into the token",
    "rstrip": "HF takes the white space after it into the token",
    "single_word": "HF matches it only between word boundaries",
}


# ---------------------------------------------------------------- helpers
def _flatten(node: dict | None, seq_key: str) -> list[dict]:
    """The leaves of a (possibly nested) Sequence normalizer / pre-tokenizer / processor."""
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [leaf for child in node.get(seq_key) or [] for leaf in _flatten(child, seq_key)]
    return [node]


def _describe(node: dict) -> str:
    """A short spelling of a node for messages: Type(key=value, ...)."""
    args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in node.items() if k != "type")
    return f"{node.get('type')}({args})"


def _pattern(node: dict) -> tuple[str, str]:
    """('String' | 'Regex', text) of a Split / Replace pattern."""
    pat = node.get("pattern") or {}
    if len(pat) != 1:
        raise ConvertError(f"{_describe(node)}: pattern is neither String nor Regex")
    ((kind, text),) = pat.items()
    return kind, text


def _token_name(value: Any) -> str | None:
    """A tokenizer_config.json token: a string, {"content": ...} (AddedToken) or null."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


# ---------------------------------------------------------------- the pipeline
def _normalizer(node: dict | None) -> tuple[str | None, int, int | None]:
    """(SentencePiece prefix source or None, flags, kind it requires or None) of the normalizer."""
    leaves = _flatten(node, "normalizers")
    types = [leaf.get("type") for leaf in leaves]
    odd = [leaf for leaf in leaves if leaf.get("type") not in ("Prepend", "Replace", *NORMALIZER_FLAGS)]
    if odd:
        raise ConvertError(f"normalizer {_describe(odd[0])} has no .mlt flag")
    if {"Prepend", "Replace"} & set(types) and sorted(types) != ["Prepend", "Replace"]:
        raise ConvertError(
            f'normalizer Sequence{types}: only Prepend("▁") with Replace(" ", "▁") '
            "is expressible (the SentencePiece prefix)"
        )
    if types in (["Prepend", "Replace"], ["Replace", "Prepend"]):
        # Replace(" " -> ▁) and an unconditional Prepend(▁) give the same text in either order.
        prep, repl = leaves[types.index("Prepend")], leaves[types.index("Replace")]
        if prep.get("prepend") != SPIECE:
            raise ConvertError(f'normalizer {_describe(prep)}: only Prepend("▁") is the ▁ prefix')
        if _pattern(repl) != ("String", " ") or repl.get("content") != SPIECE:
            raise ConvertError(f'normalizer {_describe(repl)}: only Replace(" ", "▁") is expressible')
        return "prepend", 0, KIND_SP
    flags, kind = 0, None
    for leaf in leaves:
        kind, flag = NORMALIZER_FLAGS[leaf["type"]]
        flags |= flag
    return None, flags, kind


def _pre_tokenizer(node: dict | None) -> tuple[str | None, int, int | None]:
    """(SentencePiece prefix source or None, flags, kind it implies or None) of the pre-tokenizer."""
    leaves = _flatten(node, "pretokenizers")
    if not leaves:
        return None, 0, None
    types = [leaf.get("type") for leaf in leaves]
    if types == ["Metaspace"]:
        ms = leaves[0]
        if ms.get("replacement", SPIECE) != SPIECE:
            raise ConvertError(f'pre_tokenizer {_describe(ms)}: replacement must be "▁"')
        if ms.get("split", True):  # HF's default is split=true (a piece per word)
            raise ConvertError(f"pre_tokenizer {_describe(ms)}: split=true (a piece per word) has no flag")
        scheme = ms.get("prepend_scheme")
        if scheme is None:  # before tokenizers 0.15: add_prefix_space true = "always"
            scheme = "always" if ms.get("add_prefix_space", True) else "never"
        if scheme not in METASPACE_SCHEME_FLAGS:
            raise ConvertError(
                f"pre_tokenizer {_describe(ms)}: prepend_scheme {scheme!r} has no .mlt flag "
                "(flag 4 is prepend_scheme first; the per-piece prefix is Prepend's)"
            )
        return "metaspace", METASPACE_SCHEME_FLAGS[scheme], KIND_SP
    flags, rest = 0, list(leaves)
    if rest[0].get("type") == "Digits":
        if rest[0].get("individual_digits") is not True:
            raise ConvertError(f"pre_tokenizer {_describe(rest[0])}: only individual_digits=true has a flag")
        flags |= DIGITS_FLAG
        rest = rest[1:]
    if [x.get("type") for x in rest] not in (["ByteLevel"], ["Split", "ByteLevel"]):
        odd = next((x for x in leaves if x.get("type") not in ("Digits", "Split", "ByteLevel")), None)
        if odd is not None:
            raise ConvertError(f"pre_tokenizer {_describe(odd)} has no .mlt flag")
        raise ConvertError(
            f"pre_tokenizer Sequence{types} has no .mlt flag (byte-level is [Digits] then "
            "ByteLevel(use_regex=true) or Split(known regex) + ByteLevel(use_regex=false))"
        )
    bl = rest[-1]
    if bl.get("add_prefix_space"):
        raise ConvertError(f"pre_tokenizer {_describe(bl)}: add_prefix_space=true has no .mlt flag")
    use_regex = bl.get("use_regex", True)
    if len(rest) == 2:
        split = rest[0]
        kind, text = _pattern(split)
        if kind != "Regex" or text not in SPLIT_REGEX_FLAGS:
            raise ConvertError(
                f"pre_tokenizer Split: pattern {kind} {text!r} is not the Llama 3, Qwen2 or GPT-2 regex"
            )
        if split.get("behavior") != "Isolated" or split.get("invert"):
            raise ConvertError(
                f"pre_tokenizer Split(behavior={split.get('behavior')}, invert="
                f"{json.dumps(split.get('invert'))}): only Isolated, invert false has a flag"
            )
        if use_regex:
            raise ConvertError("pre_tokenizer ByteLevel(use_regex=true) after a Split: two regexes, no flag")
        flags |= SPLIT_REGEX_FLAGS[text]
    elif use_regex:
        flags |= BYTE_LEVEL_REGEX_FLAG
    else:
        raise ConvertError("pre_tokenizer ByteLevel(use_regex=false) without a Split regex has no .mlt flag")
    return None, flags, KIND_BYTE_LEVEL


def _model(model: dict, kind: int) -> int:
    """Check the BPE model's options; returns the flags they add."""
    mtype = model.get("type") or ("BPE" if "merges" in model else None)
    if mtype != "BPE":
        raise ConvertError(f"model {mtype}: only BPE has an .mlt kind")
    if model.get("dropout") not in (None, 0, 0.0):
        raise ConvertError(f"model BPE dropout={model['dropout']}: random merges are not expressible")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise ConvertError(f"model BPE {key}={model[key]!r} is not expressible")
    if kind == KIND_SP and not model.get("byte_fallback") and model.get("unk_token") is not None:
        raise ConvertError(
            f"model BPE without byte_fallback (unk_token={model.get('unk_token')!r}) in a "
            "SentencePiece-style tokenizer: the format has no unk id"
        )
    if kind == KIND_BYTE_LEVEL and model.get("byte_fallback"):
        raise ConvertError("model BPE byte_fallback=true in a byte-level tokenizer: byte tokens are kind 1")
    return sum(flag for key, flag in MODEL_FLAGS.items() if model.get(key))


def _merges(model: dict, vocab: dict[str, int]) -> list[tuple[int, int, int]]:
    """Merges in rank order as ids; both the "a b" and the ["a", "b"] spellings."""
    ranks: dict[tuple[int, int], tuple[int, int]] = {}
    for rank, m in enumerate(model.get("merges") or []):
        if isinstance(m, str):
            parts = m.split(" ")
            if len(parts) != 2:
                raise ConvertError(f"merge {rank} {m!r} is not two pieces separated by one space")
        else:
            parts = list(m)
            if len(parts) != 2 or not all(isinstance(p, str) for p in parts):
                raise ConvertError(f"merge {rank} {m!r} is not a pair of strings")
        left, right = parts
        for piece in (left, right):
            if piece not in vocab:
                raise ConvertError(f"merge {rank} {left!r} + {right!r}: {piece!r} is not in the vocab")
        if left + right not in vocab:
            raise ConvertError(
                f"merge {rank} {left!r} + {right!r}: the result {left + right!r} is not in the vocab"
            )
        # A pair listed twice takes its later rank in HF (a map built in list order): keep that one.
        ranks[(vocab[left], vocab[right])] = (rank, vocab[left + right])
    return [(a, b, merged) for (a, b), (_, merged) in sorted(ranks.items(), key=lambda kv: kv[1][0])]


def _overlap(a: str, b: str) -> bool:
    """Can a and b cover a common character of some text (one inside the other, or chained)?"""
    chained = any(a.endswith(b[:k]) or b.endswith(a[:k]) for k in range(1, min(len(a), len(b))))
    return a in b or b in a or chained


def _added(added: list[dict], has_normalizer: bool) -> dict[int, str]:
    """id -> content of the added tokens, refusing what literal longest-match cannot express."""
    out: dict[int, str] = {}
    for t in added:
        name = f"added token {t.get('id')} {t.get('content')!r}"
        for key, why in ADDED_REFUSED.items():
            if t.get(key):
                raise ConvertError(f"{name}: {key}=true ({why}) is not expressible")
        if t.get("normalized") and has_normalizer:
            raise ConvertError(
                f"{name}: normalized=true is matched in the normalized text, the format "
                "matches added tokens before normalizing"
            )
        if not isinstance(t.get("id"), int) or not t.get("content"):
            raise ConvertError(f"{name}: needs an integer id and non-empty content")
        if t["id"] in out:
            raise ConvertError(f"{name}: id listed twice")
        out[t["id"]] = t["content"]
    # HF matches the non-normalized tokens first, then the normalized ones in what is left: the
    # same as one leftmost-longest pass unless a token of one group can overlap one of the other.
    norm = {t["content"] for t in added if t.get("normalized")}
    raw = {t["content"] for t in added if not t.get("normalized")}
    for a in sorted(norm):
        for b in sorted(raw):
            if _overlap(a, b):
                raise ConvertError(
                    f"added tokens {a!r} (normalized) and {b!r} (not normalized) overlap: HF "
                    "matches them in two passes, the format in one"
                )
    return out


def _post_processor(node: dict | None) -> tuple[str | None, int | None]:
    """(BOS token, its id) the post-processor prepends, or (None, None)."""
    bos: tuple[str | None, int | None] = (None, None)
    for leaf in _flatten(node, "processors"):
        ptype = leaf.get("type")
        if ptype == "ByteLevel":  # offsets only
            continue
        if ptype != "TemplateProcessing":
            raise ConvertError(f"post_processor {ptype} adds tokens the format cannot (only BOS)")
        pieces = leaf.get("single") or []
        specials = [p["SpecialToken"]["id"] for p in pieces if "SpecialToken" in p]
        shape = ["S" if "SpecialToken" in p else "A" for p in pieces]
        if shape not in (["A"], ["S", "A"]):
            raise ConvertError(
                f"post_processor TemplateProcessing single {shape}: only [$A] or [BOS, $A] "
                "is expressible (no EOS, no second special token)"
            )
        if specials:
            ids = (leaf.get("special_tokens") or {}).get(specials[0], {}).get("ids")
            if not ids or len(ids) != 1:
                raise ConvertError(
                    f"post_processor TemplateProcessing: {specials[0]!r} must map to one id, got {ids}"
                )
            if bos[0] is not None:
                raise ConvertError("post_processor: two TemplateProcessing steps each add a token")
            bos = (specials[0], ids[0])
    return bos


def _config(path: Path | None) -> dict:
    if path is None:
        return {}
    try:
        return json.loads(read_regular(path))
    except (OSError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from e


def _specials(d: dict, cfg: dict, ids: dict[str, int], cfg_name: str) -> tuple[int, int, int]:
    """(bos, eos, flags) from the post-processor and tokenizer_config.json."""
    bos_name, bos_id = _post_processor(d.get("post_processor"))
    flags = FLAG_ADD_BOS if bos_name is not None else 0
    if cfg.get("add_eos_token"):
        raise ConvertError(f"{cfg_name} add_eos_token=true: appending EOS is not expressible")
    if "add_bos_token" in cfg and bool(cfg["add_bos_token"]) != bool(flags):
        adds = f"adds {bos_name!r}" if bos_name else "adds no BOS"
        raise ConvertError(
            f"{cfg_name} add_bos_token={cfg['add_bos_token']} but tokenizer.json's "
            f"post_processor {adds}: ambiguous (tokenizers follows the post_processor)"
        )
    cfg_bos, cfg_eos = _token_name(cfg.get("bos_token")), _token_name(cfg.get("eos_token"))
    if bos_name is not None and cfg_bos is not None and cfg_bos != bos_name:
        raise ConvertError(f"{cfg_name} bos_token {cfg_bos!r} differs from the post_processor's {bos_name!r}")
    out = []
    for role, name in (("bos_token", cfg_bos), ("eos_token", cfg_eos)):
        if name is not None and name not in ids:
            raise ConvertError(f"{cfg_name} {role} {name!r} is not a token")
        out.append(ids[name] if name is not None else -1)
    bos = bos_id if bos_id is not None else out[0]
    return bos, out[1], flags


def build(json_path: str | os.PathLike, config_path: str | os.PathLike | None = None) -> Tokenizer:
    """The .mlt Tokenizer of a tokenizer.json (raises ConvertError naming what is refused).
    config_path None: tokenizer_config.json beside json_path when it exists."""
    json_path = Path(json_path)
    if config_path is None:
        beside = json_path.with_name("tokenizer_config.json")
        cfg_path = beside if beside.is_file() else None
    else:
        cfg_path = Path(config_path)
    try:
        d = json.loads(read_regular(json_path))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConvertError(f"cannot read: {getattr(e, 'strerror', None) or e}") from e
    if not isinstance(d, dict) or not isinstance(d.get("model"), dict):
        raise ConvertError("not a tokenizer.json (no model object)")
    cfg = _config(cfg_path)
    for key in ("truncation", "padding"):
        if d.get(key):
            raise ConvertError(f"{key} is set: it changes the ids of one encode call; remove it")

    model = d["model"]
    n_source, n_flags, n_kind = _normalizer(d.get("normalizer"))
    p_source, p_flags, p_kind = _pre_tokenizer(d.get("pre_tokenizer"))
    if n_source and p_source:
        raise ConvertError("both the Prepend/Replace normalizer and Metaspace add the ▁ prefix")
    # The kind comes from where the ▁ prefix or the byte mapping is; the normalizer's flags must fit it.
    kind = p_kind if p_kind is not None else KIND_SP if n_source else None
    if kind is None:
        raise ConvertError(
            "neither a SentencePiece prefix (Prepend/Replace normalizer or Metaspace) nor a "
            "ByteLevel pre-tokenizer: no .mlt kind"
        )
    if n_kind is not None and n_kind != kind:
        what = "Prepend/Replace (the ▁ prefix)" if n_source else _describe(d["normalizer"])
        raise ConvertError(
            f"normalizer {what} does not apply to a "
            f"{'byte-level' if kind == KIND_BYTE_LEVEL else 'SentencePiece-style'} tokenizer"
        )
    flags = n_flags | p_flags | _model(model, kind)

    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise ConvertError("model BPE vocab is not a piece -> id object")
    added = _added(d.get("added_tokens") or [], has_normalizer=d.get("normalizer") is not None)
    merges = _merges(model, vocab)

    by_id: dict[int, str] = {}
    for piece, i in vocab.items():
        if not isinstance(i, int) or i < 0:
            raise ConvertError(f"vocab {piece!r}: id {i!r} is not a non-negative integer")
        if i in by_id:
            raise ConvertError(f"vocab ids {by_id[i]!r} and {piece!r} are both {i}")
        by_id[i] = piece
    n = max([*by_id, *added], default=-1) + 1
    missing = [i for i in range(n) if i not in by_id and i not in added]
    if missing:
        raise ConvertError(f"token ids are not contiguous: {len(missing)} missing, first {missing[0]}")

    tokens: list[tuple[int, bytes]] = []
    for i in range(n):
        if i in added:
            content = added[i].encode("utf-8")
            if i in by_id and content not in _spellings(by_id[i], kind):
                raise ConvertError(f"added token {i} {added[i]!r} differs from vocab piece {by_id[i]!r}")
            tokens.append((ATTR_ADDED, content))
        else:
            tokens.append(_piece(by_id[i], kind, bool(model.get("byte_fallback"))))
            if not tokens[-1][1]:
                raise ConvertError(f"vocab piece {i} is empty")

    _check_bytes(vocab, added, kind, model)
    ids = {**{p: i for i, p in by_id.items()}, **{c: i for i, c in added.items()}}
    bos, eos, bos_flags = _specials(d, cfg, ids, str(cfg_path or "tokenizer_config.json"))
    return Tokenizer(kind=kind, flags=flags | bos_flags, bos=bos, eos=eos, tokens=tokens, merges=merges)


def _piece(piece: str, kind: int, byte_fallback: bool) -> tuple[int, bytes]:
    if kind == KIND_SP:
        m = BYTE_TOKEN.fullmatch(piece) if byte_fallback else None  # else HF never uses them as bytes
        return (ATTR_BYTE, bytes([int(m.group(1), 16)])) if m else (ATTR_PLAIN, piece.encode("utf-8"))
    try:
        return ATTR_PLAIN, bytes(CHAR_TO_BYTE[c] for c in piece)
    except KeyError as e:
        raise ConvertError(
            f"vocab piece {piece!r}: {e.args[0]!r} is not in the GPT-2 byte alphabet"
        ) from None


def _spellings(piece: str, kind: int) -> set[bytes]:
    """The bytes a vocab piece may stand for (byte-level files may keep special tokens unmapped)."""
    out = {piece.encode("utf-8")}
    if kind == KIND_BYTE_LEVEL and all(c in CHAR_TO_BYTE for c in piece):
        out.add(bytes(CHAR_TO_BYTE[c] for c in piece))
    return out


# Bytes that occur in UTF-8 text (never 0xC0, 0xC1, 0xF5..0xFF).
UTF8_BYTES = [b for b in range(256) if b not in (0xC0, 0xC1) and b < 0xF5]


def _check_bytes(vocab: dict[str, int], added: dict[int, str], kind: int, model: dict) -> None:
    """A byte of the text with no token: HF emits unk_token when it has one (refused: the format has
    no unk id), else drops the character, which is also what the format says (no refusal)."""
    unk = model.get("unk_token")
    if unk is None or (kind == KIND_SP and not model.get("byte_fallback")):
        return
    for b in UTF8_BYTES:
        if kind == KIND_SP:
            # An ASCII character with its own piece never falls back; a space is ▁ by then.
            own = chr(b) in vocab and vocab[chr(b)] not in added
            if b < 0x80 and (b == 0x20 or own):
                continue
            piece, what = f"<0x{b:02X}>", "byte-fallback token"
        else:
            piece, what = BYTE_TO_CHAR[b], "byte-level token"
        if piece not in vocab or vocab[piece] in added:
            raise ConvertError(
                f"the vocab has no {what} {piece!r} for byte {b:#04x}, so HF emits "
                f"unk_token {unk!r} for it: the format has no unk id"
            )


def convert(
    json_path: str | os.PathLike, out_path: str | os.PathLike, config_path: str | os.PathLike | None = None
) -> Tokenizer:
    """Convert and write atomically; raises ConvertError (or mlt.MLTError) and writes nothing on refusal."""
    tok = build(json_path, config_path)
    mlt.write(out_path, tok)
    return tok


def main(argv: Sequence[str] | None = None, prog: str = "convert_tokenizer.py") -> int:
    ap = exits.ArgumentParser(
        prog=prog, description="Convert a Hugging Face tokenizer.json (BPE) to an .mlt tokenizer file."
    )
    ap.add_argument("tokenizer_json", help="tokenizer.json")
    ap.add_argument("out", help="output .mlt file")
    ap.add_argument(
        "--config",
        metavar="FILE",
        help="tokenizer_config.json (default: the one beside tokenizer.json, if any)",
    )
    args = ap.parse_args(argv)
    try:
        tok = convert(args.tokenizer_json, args.out, args.config)
    except (ConvertError, mlt.MLTError) as e:
        print(f"mlconf: error: {args.tokenizer_json}: {e}".replace("\n", " "), file=sys.stderr)
        return exits.USAGE
    except (KeyError, TypeError, AttributeError, IndexError) as e:  # a field of an unexpected shape
        print(
            f"mlconf: error: {args.tokenizer_json}: malformed tokenizer.json ({type(e).__name__}: {e})",
            file=sys.stderr,
        )
        return exits.USAGE
    except OSError as e:
        print(f"mlconf: error: {args.out}: {e.strerror or e}", file=sys.stderr)
        return exits.USAGE
    print(mlt.info(tok, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
