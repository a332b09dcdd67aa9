"""The reference .mlt loader: every rule of specs/mlt.yaml, in its order (the first failing rule
decides the status, as for .mlb). A check returns None when the rule holds, or the reason."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from functools import cached_property

from mlconf import specs
from mlconf.tools import files

from ..base import LoadResult

HEADER = struct.Struct("<4sIIIIiiI")
FIELDS = ("magic", "version", "kind", "n_vocab", "n_merges", "bos", "eos", "flags")
KIND_FLAGS = {1: 1 | 2 | 4, 2: 1 | 2 | 8 | 16 | 32 | 64}  # specs/mlt.yaml flags[].kinds


class Context:
    """The file's bytes, with the header and the token records parsed on first use."""

    def __init__(self, data: bytes, model_vocab: int | None):
        self.data, self.model_vocab = data, model_vocab

    @cached_property
    def h(self) -> dict:
        return dict(zip(FIELDS, HEADER.unpack_from(self.data), strict=True))

    @cached_property
    def records(self) -> tuple[list[tuple[int, int, int]], str | None]:
        """((attr, offset, length) of each token, or the reason the records run past the end)."""
        out, off, data = [], HEADER.size, self.data
        for i in range(self.h["n_vocab"]):
            if off + 5 > len(data):
                return out, (
                    f"token {i}: its record header at offset {off} runs past the end ({len(data)} bytes)"
                )
            attr, n = struct.unpack_from("<BI", data, off)
            if off + 5 + n > len(data):
                return out, f"token {i}: length {n} at offset {off + 1} runs past the end ({len(data)} bytes)"
            out.append((attr, off + 5, n))
            off += 5 + n
        return out, None

    @property
    def merges_offset(self) -> int:
        recs = self.records[0]
        return recs[-1][1] + recs[-1][2] if recs else HEADER.size

    def piece(self, i: int) -> bytes:
        _, off, n = self.records[0][i]
        return self.data[off : off + n]

    def merges(self):
        base = self.merges_offset
        for k in range(self.h["n_merges"]):
            yield k, struct.unpack_from("<III", self.data, base + 12 * k)


Check = Callable[[Context], "str | None"]


def _flags_kind(c: Context) -> str | None:
    h = c.h
    extra = h["flags"] & ~KIND_FLAGS[h["kind"]]
    if extra:
        return (
            f"header field flags (offset 28) = {h['flags']:#x}: bits {extra:#x} do not apply to "
            f"kind {h['kind']}"
        )
    if h["flags"] & 16 and h["flags"] & 32:
        return (
            "header field flags (offset 28): flag 16 (single digits) applies to the Llama 3 regex, "
            "not to flag 32 (GPT-2)"
        )
    return None


def _special(c: Context) -> str | None:
    n = c.h["n_vocab"]
    for name in ("bos", "eos"):
        v = c.h[name]
        if not -1 <= v < n:
            return f"header field {name} = {v} is outside -1 .. n_vocab - 1 = {n - 1}"
    return None


def _each_token(test: Callable[[int, int, bytes], str | None]) -> Check:
    def check(c: Context) -> str | None:
        for i, (attr, off, n) in enumerate(c.records[0]):
            reason = test(c.h["kind"], attr, c.data[off : off + n])
            if reason:
                return f"token {i} (record at offset {off - 5}): {reason}"
        return None

    return check


def _merges_truncated(c: Context) -> str | None:
    need = c.merges_offset + 12 * c.h["n_merges"]
    if len(c.data) < need:
        return (
            f"the {c.h['n_merges']} merge records (header field n_merges, offset 16) end at {need}, "
            f"the file has {len(c.data)} bytes"
        )
    return None


def _merge_ids(c: Context) -> str | None:
    n = c.h["n_vocab"]
    for k, m in c.merges():
        if max(m) >= n:
            return f"merge {k} = {m} names a token id >= n_vocab = {n}"
    return None


def _merge_concat(c: Context) -> str | None:
    for k, (left, right, merged) in c.merges():
        if c.piece(merged) != c.piece(left) + c.piece(right):
            return (
                f"merge {k}: token {merged} {c.piece(merged)!r} is not token {left} {c.piece(left)!r} "
                f"+ token {right} {c.piece(right)!r}"
            )
    return None


def _trailing(c: Context) -> str | None:
    end = c.merges_offset + 12 * c.h["n_merges"]
    return None if len(c.data) == end else f"{len(c.data) - end} bytes after the last merge (at {end})"


RULES: dict[str, Check] = {
    "io.open": lambda c: None,  # checked when the file is opened
    "format.empty": lambda c: "the file is empty" if not c.data else None,
    "format.short_header": lambda c: (
        f"the file has {len(c.data)} bytes, shorter than the 32-byte header"
        if len(c.data) < HEADER.size
        else None
    ),
    "format.magic": lambda c: (
        None if c.h["magic"] == b"MLT1" else (f"magic is {c.h['magic']!r}, expected b'MLT1'")
    ),
    "format.version": lambda c: (
        None
        if c.h["version"] == 1
        else (f"header field version (offset 4) = {c.h['version']}, only version 1 is defined")
    ),
    "format.kind": lambda c: (
        None
        if c.h["kind"] in KIND_FLAGS
        else (f"header field kind (offset 8) = {c.h['kind']} is not 1 (SentencePiece) or 2 (byte-level)")
    ),
    "format.flags.unknown": lambda c: (
        None
        if not c.h["flags"] & ~0x7F
        else (
            f"header field flags (offset 28) = {c.h['flags']:#x} sets unknown bits {c.h['flags'] & ~0x7F:#x}"
        )
    ),
    "format.flags.kind": _flags_kind,
    "format.add_bos_without_bos": lambda c: (
        "flag 1 (prepend BOS) with header field bos = -1" if (c.h["flags"] & 1 and c.h["bos"] == -1) else None
    ),
    "shape.n_vocab_model": lambda c: (
        None
        if c.model_vocab is None or c.h["n_vocab"] <= c.model_vocab
        else (
            f"header field n_vocab (offset 12) = {c.h['n_vocab']} is above the model's vocab {c.model_vocab}"
        )
    ),
    "shape.special_range": _special,
    "format.token_overrun": lambda c: c.records[1],
    "format.token_attr": _each_token(
        lambda k, a, p: None if a in (0, 1, 2) else (f"attr {a} is not 0, 1 or 2")
    ),
    "format.byte_token": _each_token(
        lambda k, a, p: (
            None
            if a != 2
            else (
                "a byte token (attr 2) in a byte-level tokenizer"
                if k == 2
                else None
                if len(p) == 1
                else f"a byte token (attr 2) of length {len(p)}, not 1"
            )
        )
    ),
    "format.empty_token": _each_token(lambda k, a, p: "length 0" if not p else None),
    "format.merges_truncated": _merges_truncated,
    "format.merge_id": _merge_ids,
    "format.merge_concat": _merge_concat,
    "format.trailing_bytes": _trailing,
}


def rule_table() -> list[dict]:
    return specs.load("mlt")["rules"]


def check(data: bytes, name: str = "<bytes>", model_vocab: int | None = None) -> LoadResult:
    """Validate the bytes of a .mlt file against every rule, in order."""
    c = Context(data, model_vocab)
    for r in rule_table():
        reason = RULES[r["id"]](c)
        if reason is not None:
            return LoadResult(r["status"], f"{name}: {reason} [{r['id']}]", r["id"])
    return LoadResult("ML_OK", f"{name}: accepted", "")


def load_bytes(path: str | os.PathLike, model_vocab: int | None = None) -> tuple[LoadResult, bytes]:
    name = os.fspath(path)
    try:
        data = files.read_regular(name)  # decision loader.special_files
    except OSError as e:
        return LoadResult("ML_E_IO", f"{name}: cannot open: {files.reason(e)}", "io.open"), b""
    return check(data, name, model_vocab), data


def load(path: str | os.PathLike, model_vocab: int | None = None) -> LoadResult:
    return load_bytes(path, model_vocab)[0]
