"""Tokenizer fixtures: small hand-built valid .mlt files (one per kind and flag) and every error
case of specs/mlt.yaml as a mutation of one of them. Part of `mlconf fixtures` (fixtures.py)."""

from __future__ import annotations

import struct

from mlconf import byte_ops, specs
from mlconf.tools import mlt
from mlconf.tools.mlt import ATTR_ADDED, ATTR_BYTE, ATTR_PLAIN, Tokenizer

SP_SPACE = "\u2581".encode()


def _byte_level(flags: int = 0) -> Tokenizer:
    """256 raw-byte tokens, a few merges, two added tokens (BOS, EOT)."""
    tokens = [(ATTR_PLAIN, bytes([i])) for i in range(256)]
    merges = []

    def add(piece: bytes, left: bytes, right: bytes) -> None:
        ids = {p: i for i, (_, p) in enumerate(tokens)}
        tokens.append((ATTR_PLAIN, piece))
        merges.append((ids[left], ids[right], len(tokens) - 1))

    add(b"th", b"t", b"h")
    add(b"the", b"th", b"e")
    add(b" t", b" ", b"t")
    add(b"in", b"i", b"n")
    add(b"ing", b"in", b"g")
    add(b"12", b"1", b"2")
    tokens += [(ATTR_ADDED, b"<|bos|>"), (ATTR_ADDED, b"<|eot|>")]
    bos, eos = len(tokens) - 2, len(tokens) - 1
    return Tokenizer(2, flags, bos, eos, tokens, merges)


def _sentencepiece(flags: int = 1) -> Tokenizer:
    """<s> </s> (added), the 256 byte-fallback tokens, then pieces with U+2581 and merges."""
    tokens = [(ATTR_ADDED, b"<s>"), (ATTR_ADDED, b"</s>")]
    tokens += [(ATTR_BYTE, bytes([i])) for i in range(256)]
    pieces = [SP_SPACE, b"a", b"b", SP_SPACE + b"a", b"ab", SP_SPACE + b"ab"]
    tokens += [(ATTR_PLAIN, p) for p in pieces]
    ids = {p: i for i, (a, p) in enumerate(tokens) if a == ATTR_PLAIN}
    merges = [
        (ids[SP_SPACE], ids[b"a"], ids[SP_SPACE + b"a"]),
        (ids[b"a"], ids[b"b"], ids[b"ab"]),
        (ids[SP_SPACE + b"a"], ids[b"b"], ids[SP_SPACE + b"ab"]),
    ]
    return Tokenizer(1, flags, 0, 1, tokens, merges)


BASES = {  # name -> (tokenizer, what it covers)
    "bl": (_byte_level(), "kind 2, Llama 3 regex, added tokens"),
    "bl_add_bos": (_byte_level(1), "flag 1"),
    "bl_ignore_merges": (_byte_level(2), "flag 2 on kind 2"),
    "bl_nfc": (_byte_level(8), "flag 8"),
    "bl_single_digits": (_byte_level(16), "flag 16"),
    "bl_gpt2": (_byte_level(32), "flag 32"),
    "bl_individual_digits": (_byte_level(64), "flag 64"),
    "bl_smollm": (_byte_level(64 | 32), "flags 64 and 32 (SmolLM)"),
    "bl_qwen2": (_byte_level(8 | 16 | 1), "flags 1, 8 and 16 (Qwen2-like)"),
    "sp": (_sentencepiece(1), "kind 1 with byte fallback, flag 1"),
    "sp_first": (_sentencepiece(1 | 4), "flag 4"),
    "sp_ignore_merges": (_sentencepiece(2), "flag 2 on kind 1"),
    "sp_no_flags": (_sentencepiece(0), "kind 1 without flags"),
}


def _record_offset(data: bytes, i: int) -> int:
    off = 32
    for _ in range(i):
        off += 5 + struct.unpack_from("<I", data, off + 1)[0]
    return off


def _token_id(tok: Tokenizer, ref) -> int:
    if isinstance(ref, str) and ref.startswith("byte_"):
        b = int(ref[5:], 16)
        return next(i for i, (a, p) in enumerate(tok.tokens) if a == ATTR_BYTE and p == bytes([b]))
    return int(ref)


HEADER_FIELDS = {
    "version": (4, "<I"),
    "kind": (8, "<I"),
    "n_vocab": (12, "<I"),
    "n_merges": (16, "<I"),
    "bos": (20, "<i"),
    "eos": (24, "<i"),
    "flags": (28, "<I"),
}


def mutate(tok: Tokenizer, ops: list[dict]) -> bytes:
    """specs/mlt.yaml case mutations: record-level edits first rebuild the bytes, then byte edits."""
    tok = Tokenizer(tok.kind, tok.flags, tok.bos, tok.eos, list(tok.tokens), list(tok.merges))
    for op in ops:
        ((kind, arg),) = op.items()
        if kind == "token_record":
            tok.tokens[_token_id(tok, arg["id"])] = (arg["attr"], bytes.fromhex(arg["bytes_hex"]))
        elif kind == "merge":
            i = arg["index"] % len(tok.merges)
            m = dict(zip(("left", "right", "merged"), tok.merges[i], strict=True))
            m.update({k: v for k, v in arg.items() if k != "index"})
            tok.merges[i] = (m["left"], m["right"], m["merged"])
        elif kind == "merge_swap":
            i = arg["index"] % len(tok.merges)
            left, right, merged = tok.merges[i]
            tok.merges[i] = (right, left, merged)
    b = bytearray(mlt.to_bytes(tok))
    for op in ops:
        ((kind, arg),) = op.items()
        if kind == "set":
            for k, v in arg.items():
                v = len(tok.tokens) if v == "n_vocab" else v  # the smallest id past the end
                off, fmt = HEADER_FIELDS[k]
                b[off : off + 4] = struct.pack(fmt, v)
        elif kind == "set_n_merges_delta":
            b[16:20] = struct.pack("<I", len(tok.merges) + arg)
        elif kind == "token_len":
            off = _record_offset(bytes(b), arg["id"])
            b[off + 1 : off + 5] = struct.pack("<I", arg["value"])
        elif kind == "token_attr":
            b[_record_offset(bytes(b), arg["id"])] = arg["value"]
        elif byte_ops.apply(b, kind, arg):
            continue
        elif kind not in ("token_record", "merge", "merge_swap", "path"):
            raise ValueError(f"unknown tokenizer mutation {kind!r}")
    return bytes(b)


def catalog():
    """Fixture records (mlconf.fixtures.Fixture) of every tokenizer fixture."""
    from mlconf.fixtures import Fixture

    out = [
        Fixture(f"tokenizer/valid/{n}.mlt", "valid", "ML_OK", [why], base=n) for n, (_, why) in BASES.items()
    ]
    for r in specs.load("mlt")["rules"]:
        for c in r["cases"]:
            f = Fixture(
                f"tokenizer/malformed/{r['id']}/{c['name']}.mlt",
                "malformed",
                r["status"],
                [r["meaning"]],
                r["id"],
                c.get("base", "bl"),
                c.get("mutate", []),
            )
            f.model_vocab = c.get("model_vocab")
            out.append(f)
    return out


def content(f) -> bytes:
    tok = BASES[f.base][0]
    return mlt.to_bytes(tok) if f.kind == "valid" else mutate(tok, f.mutate)
