"""The tokenizer cases: the ids a backend's encoder gives a text, against HF tokenizers' (the
first differing position, the ids there and the text around it), and the bytes its decoder gives
those ids, against HF's text of them (the first differing byte and the bytes around it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlconf.backends import Backend
    from mlconf.cases import Case
    from mlconf.runner import Result, Workdir


def duplicate_merges(src: str | Path, dst: str | Path) -> None:
    """Write a copy of .mlt ``src`` that lists every merge twice: in reverse rank order, then in
    rank order. A pair listed twice keeps its last rank (decision tok.bpe_start; HF builds its map
    in list order), so the copy encodes every text as ``src`` does; a runtime that keeps the first
    rank applies the merges in reverse."""
    from mlconf.tools import mlt

    tok = mlt.read(src)
    mlt.write(dst, replace(tok, merges=[*reversed(tok.merges), *tok.merges]))


def _first_diff(got: list[int], want: list[int]) -> int | None:
    if got == want:
        return None
    pairs = enumerate(zip(got, want, strict=False))
    return next((k for k, (a, b) in pairs if a != b), min(len(got), len(want)))


def _ids_detail(case: Case, work: Workdir, got: list[int], i: int) -> str:
    """The first differing position, the ids there and the text around it (reference decoder)."""
    want = list(case.expected)
    from mlconf.backends.reference.tokenizer import Encoder
    from mlconf.tools import mlt

    enc = Encoder(mlt.read(work.tokenizer(case.params["golden"], case.params.get("variant"))))
    before = enc.decode(want[max(0, i - 8) : i])[-24:]
    after = enc.decode(want[i : i + 4])[:24]
    return (
        f"ids differ first at position {i} of {len(want)} (got {len(got)} ids): expected "
        f"{want[max(0, i - 2) : i + 3]}, got {got[max(0, i - 2) : i + 3]} (from index {max(0, i - 2)}); "
        f"text there: {before!r} | {after!r}; input {case.params['text'][:60]!r}"
    )


def _bytes_detail(got: bytes, want: bytes, i: int) -> str:
    return (
        f"bytes differ first at byte {i} of {len(want)} (got {len(got)} bytes): expected "
        f"{want[max(0, i - 8) : i + 8]!r}, got {got[max(0, i - 8) : i + 8]!r} (from byte {max(0, i - 8)})"
    )


def run(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    mlt_path = work.tokenizer(case.params["golden"], case.params.get("variant"))
    session = backend.open_tokenizer(str(mlt_path))
    decode = "ids" in case.params  # a decode case: ids -> bytes
    try:
        if decode:
            out = session.decode(list(case.params["ids"]))
        else:
            got = [int(i) for i in session.encode(case.params["text"])]
    finally:
        if hasattr(session, "close"):
            session.close()
    if decode:
        _decoded(case, out, r)
        return
    first = _first_diff(got, list(case.expected))
    r.got = got
    r.output = got
    r.outcome = "pass" if first is None else "fail"
    r.detail = f"{len(got)} ids identical" if first is None else _ids_detail(case, work, got, first)
    r.metrics = {"first_diff": first, "len_expected": len(case.expected), "len_got": len(got)}


def _decoded(case: Case, out: bytes, r: Result) -> None:
    from mlconf.compare import byte_distance

    got, want = bytes(out), bytes(case.expected)
    r.got = r.output = got
    r.metrics = byte_distance(want, got)
    first = r.metrics["first_diff"]
    r.outcome = "pass" if first is None else "fail"
    r.detail = f"{len(got)} bytes identical" if first is None else _bytes_detail(got, want, first)
