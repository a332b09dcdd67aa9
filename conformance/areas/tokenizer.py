"""The tokenizer cases: the ids a backend's encoder gives a text, against HF tokenizers' (the
first differing position, the ids there and the text around it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlconf.backends import Backend
    from mlconf.cases import Case
    from mlconf.runner import Result, Workdir


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

    enc = Encoder(mlt.read(work.tokenizer(case.params["golden"])))
    before = enc.decode(want[max(0, i - 8) : i])[-24:]
    after = enc.decode(want[i : i + 4])[:24]
    return (
        f"ids differ first at position {i} of {len(want)} (got {len(got)} ids): expected "
        f"{want[max(0, i - 2) : i + 3]}, got {got[max(0, i - 2) : i + 3]} (from index {max(0, i - 2)}); "
        f"text there: {before!r} | {after!r}; input {case.params['text'][:60]!r}"
    )


def run(case: Case, backend: Backend, work: Workdir, r: Result) -> None:
    mlt_path = work.tokenizer(case.params["golden"])
    session = backend.open_tokenizer(str(mlt_path))
    try:
        got = [int(i) for i in session.encode(case.params["text"])]
    finally:
        if hasattr(session, "close"):
            session.close()
    first = _first_diff(got, list(case.expected))
    r.got = got
    r.output = got
    r.outcome = "pass" if first is None else "fail"
    r.detail = f"{len(got)} ids identical" if first is None else _ids_detail(case, work, got, first)
    r.metrics = {"first_diff": first, "len_expected": len(case.expected), "len_got": len(got)}
