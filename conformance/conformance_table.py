"""The conformance table of one backend, rendered from a results.json (`mlconf report RESULTS.json
--conformance NAME`): its outcomes per area, the bit-exactness rows that pair it with the other
backends of the run, and each failing case with its first differing detail. The README's
"Conformance of llama.cpp" section is this output between two markers (MARKERS), rewritten with
``--update README.md`` and compared by a test with ``differences``.

The text holds no host, path or time: the same records render the same bytes. Across hosts only
the toleranced distances move in their last digits, so ``differences`` compares the numbers with
a decimal point or an exponent within a relative bound and every other character exactly.
"""

from __future__ import annotations

import re

from mlconf import records as rec
from mlconf.tools.files import atomic_write

BEGIN = "<!-- mlconf report --conformance {name}: begin -->"
END = "<!-- mlconf report --conformance {name}: end -->"
DETAIL_CHARS = 160  # a failing case's detail is cut there (the report has it whole)
# left out of the matrix rows: an integer that moves with the last bits of a float on another host
QUIET = ("max_ulp",)


class TableError(ValueError):
    """The results hold no such backend, or a README has no (or a broken) block for it."""


# a C or C++ source path in a message (an assertion's __FILE__): the build's own folder (pip's
# temporary one) is no part of the verdict, so only the file's name and line are kept
_SOURCE = re.compile(r"(?<![\w$])/(?:[^\s/'\"]+/)+([^\s/'\"]+\.(?:c|cc|cpp|h)):(\d+)")


def _cell(text: str) -> str:
    text = _SOURCE.sub(r"\1:\2", text.replace("\n", " ")).replace("|", "\\|")
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"


def _table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table without padding (the README's style)."""
    lines = [headers, ["---"] * len(headers), *rows]
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines)


def render(doc: dict, name: str) -> str:
    """The Markdown block of backend ``name`` in results ``doc`` (reports.load)."""
    run = next((b for b in doc["run"]["backends"] if b["name"] == name), None)
    if run is None:
        have = ", ".join(b["name"] for b in doc["run"]["backends"])
        raise TableError(f"backend {name!r} is not in these results (they hold {have})")
    what = run["description"].split(", protocol ")[0]
    recs = [r for r in doc["records"] if r["backend"] == name]
    order = {a: i for i, a in enumerate(doc["run"]["areas"])}
    areas = sorted({r["area"] for r in recs}, key=lambda a: order.get(a, len(order)))
    counts = [
        [a, *(sum(r["area"] == a and r["outcome"] == o for r in recs) for o in rec.OUTCOMES)] for a in areas
    ]
    out = [
        f"`mlconf run -b {name}`: {what}; {len(recs)} case runs"
        + (f" (areas {', '.join(doc['run']['areas'])})" if len(areas) < len(order) else "")
        + ".",
        "",
        _table(["area", *rec.OUTCOMES], counts),
        "",
    ]
    pairs = [m for m in doc["matrix"] if name in (m["a"], m["b"]) and m["compared"]]
    if pairs:

        def worst(m: dict) -> str:
            w = {
                k: v
                for k, v in (m["worst"] or {}).items()
                if k not in QUIET and (v or k not in ("shape_mismatch", "refusal_mismatch"))
            }
            return ", ".join(f"{k} {v:.2g}" if isinstance(v, float) else f"{k} {v}" for k, v in w.items())

        rows = [[m["a"], m["b"], m["kind"], m["compared"], m["identical"], worst(m)] for m in pairs]
        out += [
            "Beside the other backends of the run (the bit-exactness matrix):",
            "",
            _table(["a", "b", "output", "compared", "identical", "worst"], rows),
            "",
        ]
    fails = sorted(
        (r for r in recs if r["outcome"] in rec.FAILING), key=lambda r: (order.get(r["area"], 0), r["case"])
    )
    out += ["Each failing case and its first differing detail:", ""]
    rows = [[f"`{r['case']}`", r["outcome"], _cell(r["detail"])] for r in fails]
    out += [_table(["case", "outcome", "first differing detail"], rows) if fails else "None."]
    return "\n".join(out) + "\n"


def block(text: str, name: str, where: str = "README.md") -> tuple[int, int]:
    """The span of ``name``'s block in ``text``: between the end of its begin marker's line and the
    start of its end marker."""
    b, e = BEGIN.format(name=name), END.format(name=name)
    i, j = text.find(b), text.find(e)
    if i < 0 or j < 0 or j < i or text.count(b) != 1 or text.count(e) != 1:
        raise TableError(f"{where}: no single block between {b!r} and {e!r}")
    return i + len(b) + 1, j


def update(path: str, table: str, name: str) -> None:
    """Rewrite ``name``'s block of the file at ``path`` with ``table`` (written whole, then renamed)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    i, j = block(text, name, path)
    atomic_write(path, [(text[:i] + table + text[j:]).encode("utf-8")])


_FLOAT = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?|-?\d+e[-+]?\d+")


def differences(want: str, got: str, rtol: float) -> str | None:
    """None if the two renderings agree: the same text with every float (a number with a decimal
    point or an exponent) replaced, and each pair of floats within ``rtol`` of each other; else the
    first difference."""
    wl, gl = want.splitlines(), got.splitlines()
    for n, (a, b) in enumerate(zip(wl, gl, strict=False), 1):
        if _FLOAT.sub("#", a) != _FLOAT.sub("#", b):
            return f"line {n}: {a!r} != {b!r}"
        for x, y in zip(map(float, _FLOAT.findall(a)), map(float, _FLOAT.findall(b)), strict=True):
            if abs(x - y) > rtol * max(abs(x), abs(y)):
                return f"line {n}: {x:g} and {y:g} differ by more than {rtol:g} relative: {a!r} != {b!r}"
    if len(wl) != len(gl):
        return f"{len(wl)} lines != {len(gl)} lines"
    return None
