"""Reference writer and reader of .mlt tokenizer files (specs/mlt.yaml).

Library:  Tokenizer(...), write(path, tok), to_bytes(tok), read(path, model_vocab=None), parse(data)
Script:   python tools/mlt.py info FILE

The reader validates with the reference loader (backends/reference/mlt.py) and raises MLTError
naming the file, the field and the rule. The writer refuses what a loader would refuse and writes
atomically (temporary file, then rename).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from mlconf.tools.files import atomic_write

HEADER = struct.Struct("<4sIIIIiiI")  # magic version kind n_vocab n_merges bos eos flags
MAGIC = b"MLT1"
ATTR_PLAIN, ATTR_ADDED, ATTR_BYTE = 0, 1, 2
KIND_SP, KIND_BYTE_LEVEL = 1, 2
FLAG_ADD_BOS, FLAG_IGNORE_MERGES, FLAG_PREFIX_FIRST_ONLY = 1, 2, 4
FLAG_NFC, FLAG_SINGLE_DIGITS, FLAG_GPT2_REGEX, FLAG_INDIVIDUAL_DIGITS = 8, 16, 32, 64


class MLTError(ValueError):
    """A tokenizer file or value the reader or writer refuses (names file, field and rule)."""


@dataclass
class Tokenizer:
    kind: int  # 1 SentencePiece-style BPE, 2 byte-level BPE
    flags: int = 0
    bos: int = -1
    eos: int = -1
    tokens: list[tuple[int, bytes]] = field(default_factory=list)  # (attr, piece) in id order
    merges: list[tuple[int, int, int]] = field(default_factory=list)  # (left, right, merged), rank order

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def to_bytes(tok: Tokenizer) -> bytes:
    parts = [HEADER.pack(MAGIC, 1, tok.kind, len(tok.tokens), len(tok.merges), tok.bos, tok.eos, tok.flags)]
    for attr, piece in tok.tokens:
        parts.append(struct.pack("<BI", attr, len(piece)) + bytes(piece))
    parts.append(b"".join(struct.pack("<III", *m) for m in tok.merges))
    return b"".join(parts)


def write(path: str | os.PathLike, tok: Tokenizer) -> None:
    """Write ``tok``; raises MLTError (and writes nothing) if a loader would refuse it."""
    from mlconf.backends.reference import mlt as loader

    data = to_bytes(tok)
    res = loader.check(data, os.fspath(path))
    if not res.ok:
        raise MLTError(f"{res.reason} ({res.status})")
    atomic_write(path, [data])


def parse(data: bytes) -> Tokenizer:
    """Decode bytes already validated by the loader (no checks here)."""
    _, _, kind, n_vocab, n_merges, bos, eos, flags = HEADER.unpack_from(data)
    off = HEADER.size
    tokens = []
    for _ in range(n_vocab):
        attr, n = struct.unpack_from("<BI", data, off)
        off += 5
        tokens.append((attr, bytes(data[off : off + n])))
        off += n
    merges = [struct.unpack_from("<III", data, off + 12 * i) for i in range(n_merges)]
    return Tokenizer(kind, flags, bos, eos, tokens, [tuple(m) for m in merges])


def read(path: str | os.PathLike, model_vocab: int | None = None) -> Tokenizer:
    """Validate (optionally against a model's vocab) and parse a .mlt file."""
    from mlconf.backends.reference import mlt as loader

    res, data = loader.load_bytes(path, model_vocab)
    if not res.ok:
        raise MLTError(f"{res.reason} ({res.status})")
    return parse(data)


def info(tok: Tokenizer, path: str) -> str:
    names = {1: "SentencePiece-style BPE", 2: "byte-level BPE"}
    from mlconf import specs

    set_flags = [f["name"] for f in specs.load("mlt")["flags"] if tok.flags & f["bit"]]
    attrs = [a for a, _ in tok.tokens]
    return "\n".join(
        [
            f"{path}: MLT1 kind {tok.kind} ({names.get(tok.kind, '?')})",
            f"  n_vocab {tok.n_vocab} (added {attrs.count(ATTR_ADDED)}, byte {attrs.count(ATTR_BYTE)}), "
            f"n_merges {len(tok.merges)}, bos {tok.bos}, eos {tok.eos}",
            f"  flags {tok.flags:#x} ({', '.join(set_flags) or 'none'})",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mlt.py", description="Reference .mlt reader.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="print the header and counts")
    p.add_argument("file")
    args = ap.parse_args(argv)
    try:
        print(info(read(args.file), args.file))
    except MLTError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
