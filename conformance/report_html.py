"""report.html: one self-contained page built from a results.json dict (schema mlconf-results/1).

Everything is inline: CSS, a small script, and SVG plots drawn here in Python. The page fetches
nothing (no CDN, no web fonts, no images by URL), so it opens from a CI artifact or a mail
attachment. Sections, top to bottom:

- header: mlconf version, run options, backends (description, capabilities), areas, outcome counts;
- failures (only when there are any): fail, crash, timeout, error, in that order, each linking to
  its detail;
- ``#matrix``: feature (spec row) x backend, grouped and collapsible by area, a cell coloured by
  the outcomes of its cases (green all pass, red any fail/error/crash/timeout, grey unsupported
  only, light green pass mixed with unsupported) and showing their counts;
- ``#bitexact``: per output kind, backend x backend, the share of bit-identical cases with the
  worst distance on hover/click;
- ``#errors``: per output kind of the toleranced records, each record's NMSE on a log10 axis, a
  dot per record in its backend's row, the tolerance thresholds as vertical lines.

The records are embedded as JSON in ``<script type="application/json" id="data">``; the script
builds the detail views (a cell's cases, a case's expected / got / distances) from it with
textContent only, so no string from the results is ever parsed as HTML. Every string written by
Python goes through html.escape. The output is a function of the input only (no timestamps).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from html import escape
from typing import Any

OUTCOMES = ("pass", "fail", "unsupported", "error", "crash", "timeout")
BAD = ("fail", "crash", "timeout", "error")  # the failures list's order: most useful first
MAX_VALUE_CHARS = 2000  # expected / got longer than this (as JSON) are embedded as a preview
MAX_FAILURES = 300  # listed at the top; the rest stay reachable through the matrix


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _num(v: Any) -> str:
    """A distance for people: integers as they are, floats to 3 significant digits."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}"


def _is_metric(v: Any) -> bool:
    """A number, or a non-finite one as a JSON writer spells it (not a status name or a reason)."""
    if isinstance(v, bool):
        return False
    return isinstance(v, int | float) or v in ("NaN", "nan", "Infinity", "-Infinity", "inf", "-inf")


def _jsonable(obj: Any) -> Any:
    """Plain JSON values only: non-finite floats become strings (JSON.parse rejects NaN), bytes
    hex, tuples lists, NumPy scalars their Python value, anything else its str()."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, bytes | bytearray):
        return bytes(obj).hex()
    if hasattr(obj, "tolist"):  # NumPy scalars and arrays
        return _jsonable(obj.tolist())
    return str(obj)


def _preview(value: Any) -> Any:
    value = _jsonable(value)
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if len(text) <= MAX_VALUE_CHARS:
        return value
    return f"{text[:MAX_VALUE_CHARS]} ... ({len(text)} characters, see results.json)"


def _script_json(data: Any) -> str:
    """JSON safe inside <script>: no '<', '>' or '&' survives, so '</script>' cannot end it."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _tolerances() -> dict[str, dict]:
    try:
        from mlconf import specs

        table = specs.load("tolerances") or {}
    except Exception:  # a report is still worth having without the thresholds
        return {}
    out = {}
    for name, entry in table.items():
        if isinstance(entry, dict):
            out[name] = {
                k: v for k, v in entry.items() if isinstance(v, int | float) and not isinstance(v, bool)
            }
    return out


def cell_class(counts: Counter) -> str:
    """The colour of a matrix cell from the outcome counts of its cases."""
    total = sum(counts.values())
    if total == 0:
        return "none"
    known_ok = counts.get("pass", 0) + counts.get("unsupported", 0)
    if known_ok < total:  # fail, error, crash, timeout or an outcome this page does not know
        return "bad"
    if counts.get("unsupported", 0) == 0:
        return "ok"
    return "unsup" if counts.get("pass", 0) == 0 else "mixed"


def _ordered_outcomes(counts: Counter) -> list[str]:
    return [o for o in OUTCOMES if counts.get(o)] + sorted(o for o in counts if o not in OUTCOMES)


def _cell_text(counts: Counter) -> str:
    bad = sum(n for o, n in counts.items() if o not in ("pass", "unsupported"))
    parts = []
    if bad:
        parts.append(f"{bad}\u2717")
    if counts.get("pass"):
        parts.append(f"{counts['pass']}\u2713")
    if counts.get("unsupported"):
        parts.append(f"{counts['unsupported']}\u2013")
    return " ".join(parts) or "\u00b7"


def _cell_title(counts: Counter) -> str:
    return ", ".join(f"{counts[o]} {o}" for o in _ordered_outcomes(counts)) or "no cases"


# ---- model ---------------------------------------------------------------------------------------


class _Model:
    """The results dict indexed for the page: backends, areas and features in a stable order."""

    def __init__(self, results: dict):
        run = results.get("run") or {}
        self.version = results.get("mlconf_version", "?")
        self.schema = results.get("schema", "")
        self.run = run
        self.records: list[dict] = [r for r in results.get("records") or [] if isinstance(r, dict)]
        self.matrix: list[dict] = [m for m in results.get("matrix") or [] if isinstance(m, dict)]
        self.backend_info: list[dict] = [b for b in run.get("backends") or [] if isinstance(b, dict)]
        names = [str(b.get("name", "")) for b in self.backend_info]
        for r in self.records:
            if str(r.get("backend", "")) not in names:
                names.append(str(r.get("backend", "")))
        self.backends = names
        areas = [str(a) for a in run.get("areas") or []]
        self.features: list[str] = []
        feature_area: dict[str, str] = {}
        for r in self.records:
            spec, area = str(r.get("spec") or r.get("case") or "?"), str(r.get("area") or "?")
            if spec not in feature_area:
                feature_area[spec] = area
                self.features.append(spec)
            if area not in areas:
                areas.append(area)
        self.areas = areas
        # rows of one spec file together, each file's rows in the order their cases came
        file_rank: dict[str, int] = {}
        for f in self.features:
            file_rank.setdefault(f.partition("#")[0], len(file_rank))
        first = {f: i for i, f in enumerate(self.features)}
        self.features.sort(key=lambda f: (file_rank[f.partition("#")[0]], first[f]))
        self.feature_area = feature_area
        self.f_index = {f: i for i, f in enumerate(self.features)}
        self.b_index = {b: i for i, b in enumerate(self.backends)}
        self.cells: dict[tuple[int, int], Counter] = {}
        for r in self.records:
            key = (
                self.f_index[str(r.get("spec") or r.get("case") or "?")],
                self.b_index[str(r.get("backend", ""))],
            )
            self.cells.setdefault(key, Counter())[str(r.get("outcome"))] += 1
        self.tolerances = _tolerances()

    def data(self) -> dict:
        """The embedded JSON, column by column (``cols[field]`` a list of N values, or ``{"v": the
        distinct values, "i": N indices}`` for a field with few distinct values: the detail of every
        unsupported case is the same few strings). The spec row and the backend are the indices
        ``f`` and ``b`` into ``features`` and ``backends``; a value null means the field is absent."""
        fields = (
            "case",
            "f",
            "b",
            "outcome",
            "compare",
            "output_kind",
            "tolerance",
            "expected",
            "got",
            "detail",
            "distances",
            "output_sha256",
        )
        cols: dict[str, list] = {k: [] for k in fields}
        for r in self.records:
            cols["case"].append(str(r.get("case", "")))
            cols["f"].append(self.f_index[str(r.get("spec") or r.get("case") or "?")])
            cols["b"].append(self.b_index[str(r.get("backend", ""))])
            cols["outcome"].append(str(r.get("outcome")))
            for key in ("compare", "output_kind", "tolerance", "detail", "output_sha256"):
                v = r.get(key)
                cols[key].append(None if v in (None, "") else _jsonable(v))
            for key in ("expected", "got"):
                cols[key].append(None if r.get(key) is None else _preview(r[key]))
            d = r.get("distances")
            cols["distances"].append(_jsonable(d) if isinstance(d, dict) and d else None)
        packed: dict[str, Any] = {}
        for key, values in cols.items():
            if all(v is None for v in values):
                continue
            texts = [json.dumps(v, sort_keys=True) for v in values]
            distinct: dict[str, int] = {}
            for t in texts:
                distinct.setdefault(t, len(distinct))
            if key in ("f", "b") or 2 * len(distinct) >= len(values):
                packed[key] = values
            else:
                packed[key] = {"v": [json.loads(t) for t in distinct], "i": [distinct[t] for t in texts]}
        used = {r.get("tolerance") for r in self.records}
        return {
            "backends": self.backends,
            "features": self.features,
            "areas": [self.feature_area[f] for f in self.features],
            "tolerances": {k: v for k, v in self.tolerances.items() if k in used},
            "n": len(self.records),
            "cols": packed,
        }


# ---- sections ------------------------------------------------------------------------------------


def _header(m: _Model) -> str:
    counts = Counter(str(r.get("outcome")) for r in m.records)
    badges = "".join(
        f'<span class="badge o-{_e(o)}">{_e(o)} <b>{counts[o]}</b></span>' for o in _ordered_outcomes(counts)
    )
    opts = []
    for key in ("k", "strict", "jobs", "fail_fast", "timeout", "target_version"):
        if key in m.run and m.run[key] not in (None, False):
            opts.append(f"{_e(key)}={_e(m.run[key])}")
    rows = []
    info = {str(b.get("name", "")): b for b in m.backend_info}
    per_backend = Counter((str(r.get("backend", "")), str(r.get("outcome"))) for r in m.records)
    for name in m.backends:
        b = info.get(name, {})
        caps = ", ".join(str(c) for c in b.get("capabilities") or [])
        mine = Counter({o: n for (bn, o), n in per_backend.items() if bn == name})
        rows.append(
            f"<tr><th>{_e(name)}</th><td>{_e(b.get('description', ''))}</td>"
            f"<td class=caps>{_e(caps)}</td>"
            f"<td class={cell_class(mine)}>{_e(_cell_title(mine))}</td></tr>"
        )
    return (
        f"<header><h1>mlconf report</h1><p class=meta>mlconf {_e(m.version)}"
        + (f" \u00b7 {_e(m.schema)}" if m.schema else "")
        + f" \u00b7 {len(m.records)} case runs on {len(m.backends)} backend(s)"
        + (f" \u00b7 {' '.join(opts)}" if opts else "")
        + f"</p><p class=badges>{badges}</p>"
        + f"<p class=meta>areas: {_e(', '.join(m.areas)) or 'none'}</p>"
        + '<table class="plain backends"><thead><tr><th>backend</th><th>description</th>'
        + "<th>capabilities</th><th>outcomes</th></tr></thead>"
        + f"<tbody>{''.join(rows)}</tbody></table></header>"
    )


def _failures(m: _Model) -> str:
    rank = {o: i for i, o in enumerate(BAD)}
    bad = [(i, r) for i, r in enumerate(m.records) if str(r.get("outcome")) not in ("pass", "unsupported")]
    if not bad:
        return ""
    bad.sort(key=lambda t: (rank.get(str(t[1].get("outcome")), len(BAD)), t[0]))
    items = []
    for i, r in bad[:MAX_FAILURES]:
        detail = str(r.get("detail") or "")
        if len(detail) > 240:
            detail = detail[:240] + "\u2026"
        dist = r.get("distances") or {}
        dist_text = (
            " ".join(f"{k} {_num(v)}" for k, v in dist.items() if _is_metric(v))
            if isinstance(dist, dict)
            else ""
        )
        items.append(
            f'<li><a href="#r{i}"><span class="badge o-{_e(r.get("outcome"))}">{_e(r.get("outcome"))}</span> '
            f"<b>{_e(r.get('backend'))}</b> <code>{_e(r.get('case'))}</code></a>"
            f" <span class=detail>{_e(detail)}</span>"
            + (f" <span class=dist>{_e(dist_text)}</span>" if dist_text else "")
            + "</li>"
        )
    more = (
        f"<p class=meta>\u2026 and {len(bad) - MAX_FAILURES} more (see the matrix)</p>"
        if len(bad) > MAX_FAILURES
        else ""
    )
    return f'<section id="failures"><h2>Failures ({len(bad)})</h2><ol>{"".join(items)}</ol>{more}</section>'


def _matrix(m: _Model) -> str:
    head = "".join(f"<th class=b>{_e(b)}</th>" for b in m.backends)
    bodies = []
    for area in m.areas:
        feats = [f for f in m.features if m.feature_area[f] == area]
        if not feats:
            continue
        agg_cells = []
        for bi in range(len(m.backends)):
            c = Counter()
            for f in feats:
                c.update(m.cells.get((m.f_index[f], bi), Counter()))
            agg_cells.append(
                f'<td class="{cell_class(c)}" title="{_e(_cell_title(c))}">{_e(_cell_text(c))}</td>'
            )
        rows = [
            f"<tr class=area-head><th><button type=button class=toggle aria-expanded=true>"
            f"{_e(area)} <small>({len(feats)} features)</small></button></th>{''.join(agg_cells)}</tr>"
        ]
        for f in feats:
            fi = m.f_index[f]
            file, _, row = f.partition("#")
            name = f"<span class=file>{_e(file)}#</span>{_e(row)}" if row else _e(f)
            cells = []
            for bi in range(len(m.backends)):
                c = m.cells.get((fi, bi), Counter())
                if not c:
                    cells.append("<td class=none>\u00b7</td>")
                    continue
                cells.append(
                    f'<td class="{cell_class(c)}" title="{_e(_cell_title(c))}">'
                    f'<a href="#c{fi}.{bi}">{_e(_cell_text(c))}</a></td>'
                )
            rows.append(f"<tr><th class=feat>{name}</th>{''.join(cells)}</tr>")
        bodies.append(f'<tbody class=area data-area="{_e(area)}">{"".join(rows)}</tbody>')
    legend = (
        '<p class=legend><span class="key ok">all pass</span><span class="key mixed">pass + '
        'unsupported</span><span class="key unsup">unsupported only</span><span class="key bad">'
        "any fail / error / crash / timeout</span> \u2717 failed \u2713 passed \u2013 unsupported"
        " \u00b7 click a cell for its cases, an area to fold it "
        "<button type=button id=fold-all>fold all</button>"
        "<button type=button id=unfold-all>unfold all</button></p>"
    )
    return (
        f'<section id="features"><h2>Features \u00d7 backends</h2>{legend}'
        f'<table id="matrix" class=matrix><thead><tr><th>feature (spec row)</th>{head}</tr></thead>'
        f"{''.join(bodies)}</table></section>"
    )


TOLERANCED_KINDS = ("logits", "embeddings")  # compared within a tolerance, bit-identity not required


def _share_colour(share: float, toleranced: bool = False) -> str:
    """The bit-identical share as a colour: red (0) through yellow to green (1) where the output
    must be bit-exact; white to blue for toleranced outputs, where 0 % is no failure."""
    share = min(max(share, 0.0), 1.0)
    if toleranced:
        return f"hsl(210,70%,{round(96 - 26 * share)}%)"
    return f"hsl({round(120 * share)},65%,78%)"


def _bitexact(m: _Model) -> str:
    if not m.matrix:
        return (
            '<section id="bitexact"><h2>Cross-backend bit-exactness</h2>'
            "<p class=meta>No cross-backend comparison in these results.</p></section>"
        )
    kinds: list[str] = []
    for e in m.matrix:
        if str(e.get("kind")) not in kinds:
            kinds.append(str(e.get("kind")))
    tables, idle = [], []
    for kind in kinds:
        entries = [e for e in m.matrix if str(e.get("kind")) == kind]
        if not any(e.get("compared") for e in entries):
            idle.append(kind)
            continue
        toleranced = kind in TOLERANCED_KINDS
        pair = {}
        names: list[str] = []
        for e in entries:
            a, b = str(e.get("a")), str(e.get("b"))
            pair[(a, b)] = pair[(b, a)] = e
            names += [n for n in (a, b) if n not in names]
        names.sort(key=lambda n: (m.b_index.get(n, len(m.backends)), n))
        rows = []
        for a in names:
            cells = []
            for b in names:
                if a == b:
                    cells.append("<td class=diag>\u2014</td>")
                    continue
                e = pair.get((a, b))
                if e is None:
                    cells.append("<td class=none>\u00b7</td>")
                    continue
                compared, identical = e.get("compared") or 0, e.get("identical") or 0
                share = e.get("share")
                if not isinstance(share, int | float) or isinstance(share, bool):
                    share = identical / compared if compared else None
                worst = e.get("worst") or {}
                worst_text = (
                    ", ".join(f"{k} {_num(v)}" for k, v in worst.items())
                    if isinstance(worst, dict) and worst
                    else "none"
                )
                title = (
                    f"{a} vs {b}, {kind}: {identical} of {compared} bit-identical; "
                    f"worst otherwise: {worst_text}"
                )
                if share is None:
                    cells.append(f'<td class=none title="{_e(title)}">\u2013</td>')
                    continue
                cells.append(
                    f'<td class=share style="background:{_share_colour(share, toleranced)}" '
                    f'title="{_e(title)}">{round(100 * share)}%'
                    f"<small>{_e(identical)}/{_e(compared)}</small></td>"
                )
            rows.append(f"<tr><th>{_e(a)}</th>{''.join(cells)}</tr>")
        head = "".join(f"<th>{_e(n)}</th>" for n in names)
        note = " <small>(toleranced)</small>" if toleranced else ""
        tables.append(
            f'<div class=kind><h3>{_e(kind)}{note}</h3><table class="plain bx"><thead><tr><th></th>'
            f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        )
    return (
        '<section id="bitexact"><h2>Cross-backend bit-exactness</h2>'
        "<p class=meta>Share of the cases both backends ran whose outputs are bit-identical; "
        "hover or click a cell for the worst distance of the others. Red to green where the output "
        "must be bit-exact; blue for toleranced outputs (logits, embeddings), which pass within "
        "their tolerance without being bit-identical.</p>"
        f"<div class=kinds>{''.join(tables)}</div><p class=worst id=worst-out></p>"
        + (f"<p class=meta>No case of {_e(', '.join(idle))} ran on two backends.</p>" if idle else "")
        + "</section>"
    )


def _nmse(r: dict) -> float | str | None:
    d = r.get("distances")
    if not isinstance(d, dict) or "nmse" not in d:
        return None
    v = d["nmse"]
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v) if math.isfinite(v) else "off"
    try:
        x = float(v)  # "nan" / "inf" strings from a JSON writer
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else "off"


def _plot(m: _Model, kind: str, items: list[tuple[int, dict, float | str]]) -> str:
    """One SVG: a row per (backend, tolerance), x = log10(nmse), a 0 column for identical arrays,
    an inf/nan column, and each tolerance's threshold as a dashed line through its own rows (two
    tolerances of one output kind, e.g. against the oracle and against the reference, have
    different thresholds, and a dot is judged by its own)."""

    def row_key(r: dict) -> tuple[str, str]:
        return str(r.get("backend")), str(r.get("tolerance") or "")

    rows = sorted(
        {row_key(r) for _, r, _ in items}, key=lambda k: (m.b_index.get(k[0], len(m.backends)), k[0], k[1])
    )
    row_of = {k: n for n, k in enumerate(rows)}
    names = sorted({k[1] for k in rows if k[1]})
    limit = {
        n: float(t)
        for n in names
        if isinstance(t := m.tolerances.get(n, {}).get("nmse"), int | float) and t > 0
    }
    thresholds: dict[float, list[str]] = {}
    for n, t in limit.items():
        thresholds.setdefault(t, []).append(n)
    logs = [math.log10(v) for _, _, v in items if isinstance(v, float) and v > 0]
    logs += [math.log10(t) for t in thresholds]
    lo = math.floor(min(logs)) if logs else -12
    hi = math.ceil(max(logs)) if logs else 0
    if hi <= lo:
        hi = lo + 1
    has_off = any(v == "off" for _, _, v in items)
    two_line = len(names) > 1  # the row label names the tolerance too
    label_w = 230 if two_line else 120
    row_h = 32 if two_line else 26
    zero_x, x0 = label_w + 20, label_w + 55
    x1 = x0 + 525
    top = 18 + 14 * len(thresholds)
    width = x1 + (70 if has_off else 25)
    bottom = top + row_h * len(rows)
    height = bottom + 34

    def xpos(v: float) -> float:
        return x0 + (math.log10(v) - lo) / (hi - lo) * (x1 - x0)

    out = [
        f'<svg class=plot width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role=img aria-label="{_e(kind)} nmse per case">'
    ]
    for n, (b, tol) in enumerate(rows):
        y = top + n * row_h
        if n % 2 == 0:
            out.append(f'<rect class=band x="0" y="{y}" width="{width}" height="{row_h}"/>')
        if two_line:
            out.append(
                f'<text class=lab x="{label_w - 4}" y="{y + 13}" text-anchor="end">{_e(b)}</text>'
                f'<text class=tick x="{label_w - 4}" y="{y + 26}" text-anchor="end">'
                f"{_e(tol or 'no tolerance')}</text>"
            )
        else:
            out.append(
                f'<text class=lab x="{label_w - 4}" y="{y + row_h / 2 + 4}" text-anchor="end">{_e(b)}</text>'
            )
    step = max(1, math.ceil((hi - lo) / 12))
    for p in range(lo, hi + 1, step):
        x = xpos(10.0**p)
        out.append(
            f'<line class=grid x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}"/>'
            f'<text class=tick x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">1e{p}</text>'
        )
    out.append(
        f'<line class=grid x1="{zero_x}" y1="{top}" x2="{zero_x}" y2="{bottom}"/>'
        f'<text class=tick x="{zero_x}" y="{bottom + 14}" text-anchor="middle">0</text>'
        f'<text class=tick x="{zero_x}" y="{bottom + 27}" text-anchor="middle">identical</text>'
        f'<text class=tick x="{(x0 + x1) / 2}" y="{bottom + 27}" text-anchor="middle">'
        "nmse (log scale)</text>"
    )
    if has_off:
        out.append(
            f'<line class=grid x1="{x1 + 40}" y1="{top}" x2="{x1 + 40}" y2="{bottom}"/>'
            f'<text class=tick x="{x1 + 40}" y="{bottom + 14}" text-anchor="middle">inf/nan</text>'
        )
    for ti, (t, tnames) in enumerate(sorted(thresholds.items())):  # a label beside its line's x
        x = xpos(t)
        right = x > (x0 + x1) / 2
        label = f"{', '.join(tnames)} \u2264 {_num(t)}"
        out.append(
            f'<text class=thrlab x="{x + (-3 if right else 3):.1f}" y="{12 + 14 * ti}"'
            + (' text-anchor="end"' if right else "")
            + f">{_e(label)}</text>"
        )
        for n, (_, tol) in enumerate(rows):
            if tol in tnames:
                out.append(
                    f'<line class=thr x1="{x:.1f}" y1="{top + n * row_h}" x2="{x:.1f}" '
                    f'y2="{top + (n + 1) * row_h}"><title>{_e(label)}</title></line>'
                )
    for i, r, v in items:
        n = row_of[row_key(r)]
        jitter = ((i * 0.6180339887) % 1.0 - 0.5) * (row_h - 12)
        y = top + n * row_h + row_h / 2 + jitter
        x = zero_x if v == 0.0 else (x1 + 40 if v == "off" else xpos(v))
        shown = "0" if v == 0.0 else ("inf/nan" if v == "off" else _num(v))
        outcome = str(r.get("outcome"))
        cls = "pass" if outcome == "pass" else ("unsup" if outcome == "unsupported" else "bad")
        out.append(
            f'<a href="#r{i}"><circle class="d {cls}" cx="{x:.1f}" cy="{y:.1f}" r="3.5">'
            f"<title>{_e(r.get('case'))} \u00b7 {_e(r.get('backend'))} \u00b7 {_e(outcome)}"
            f" \u00b7 nmse {_e(shown)}</title></circle></a>"
        )
    out.append("</svg>")
    return "".join(out)


def _errors(m: _Model) -> str:
    by_kind: dict[str, list[tuple[int, dict, float | str]]] = {}
    for i, r in enumerate(m.records):
        if r.get("compare") != "toleranced" and not r.get("tolerance"):
            continue
        v = _nmse(r)
        if v is None:
            continue
        by_kind.setdefault(str(r.get("output_kind") or "arrays"), []).append((i, r, v))
    parts = ['<section id="errors"><h2>Error distributions</h2>']
    if not by_kind:
        parts.append("<p class=meta>No toleranced comparison with an nmse in these results.</p>")
    else:
        parts.append(
            "<p class=meta>Each dot is a case: its NMSE against the expected array, in "
            "its backend's row; identical arrays sit in the 0 column; dashed lines are the "
            "tolerance thresholds of specs/tolerances.yaml. Click a dot for the case.</p>"
        )
    for kind, items in by_kind.items():
        parts.append(
            f"<div class=plotbox><h3>{_e(kind)} <small>({len(items)} cases)</small></h3>"
            f"{_plot(m, kind, items)}</div>"
        )
    parts.append("</section>")
    return "".join(parts)


# ---- page ----------------------------------------------------------------------------------------

CSS = """
:root{--ok:#b9e4bd;--mixed:#e3f4e4;--unsup:#e2e2e2;--bad:#f6b3b3;--ink:#1d2330;--mute:#667}
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);margin:0 1.2em 3em}
h1{margin:.6em 0 .2em}h2{margin:1.4em 0 .4em;border-bottom:1px solid #ccd}h3{margin:.8em 0 .3em}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.meta{color:var(--mute)}small{color:var(--mute);font-weight:normal}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;margin-right:4px;background:var(--unsup)}
.badges .badge{font-size:15px}
.o-pass{background:var(--ok)}.o-unsupported{background:var(--unsup)}
.o-fail,.o-error,.o-crash,.o-timeout{background:var(--bad)}.o-crash,.o-timeout{outline:1px solid #b33}
table.plain{border-collapse:collapse}
table.plain td,table.plain th{border:1px solid #dde;padding:2px 7px;text-align:left;vertical-align:top}
.backends .caps{color:var(--mute);font-size:12.5px;max-width:40em}
#failures ol{padding-left:2em}#failures li{margin:2px 0}#failures a{text-decoration:none;color:inherit}
#failures .detail{color:#333}#failures .dist{color:var(--mute);font-size:12.5px}
.matrix{border-collapse:collapse}
.matrix th,.matrix td{border:1px solid #fff;padding:1px 8px;white-space:nowrap}
.matrix thead th{position:sticky;top:0;background:#f4f5f8;z-index:1}
.matrix td{text-align:center;min-width:6em}.matrix td a{color:inherit;text-decoration:none;display:block}
.matrix th.feat{text-align:left;font-weight:normal;font-family:ui-monospace,Menlo,Consolas,monospace;
font-size:12.5px}
.matrix .file{color:var(--mute)}
.matrix .area-head th{text-align:left;background:#eef0f5}.matrix .area-head td{font-weight:bold}
.toggle{border:0;background:none;font:inherit;font-weight:bold;cursor:pointer;padding:0}
.toggle::before{content:"\\25be  "}tbody.collapsed .toggle::before{content:"\\25b8  "}
tbody.collapsed tr:not(.area-head){display:none}
td.ok,.key.ok{background:var(--ok)}td.mixed,.key.mixed{background:var(--mixed)}
td.unsup,.key.unsup{background:var(--unsup)}td.bad,.key.bad{background:var(--bad)}
td.none{color:#bbb}td.sel{outline:2px solid var(--ink)}
.key{display:inline-block;padding:0 6px;margin-right:6px}
.legend button{margin-left:6px}
.kinds{display:flex;flex-wrap:wrap;gap:1.5em}.bx td.share{text-align:center;cursor:pointer;min-width:5em}
.bx td small{display:block;font-size:11px}.bx td.diag{color:#bbb;text-align:center}
.worst{min-height:1.4em;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
svg.plot{font:11px system-ui,sans-serif;max-width:100%;height:auto}
svg .band{fill:#f4f5f8}svg .grid{stroke:#ccd;stroke-width:1}svg .tick,svg .lab{fill:#445}
svg .thr{stroke:#c0392b;stroke-width:1.5;stroke-dasharray:5 3}svg .thrlab{fill:#c0392b}
svg .d{stroke:#fff;stroke-width:.7;fill-opacity:.85}svg .d.pass{fill:#2e8b3a}svg .d.bad{fill:#d12c2c}
svg .d.unsup{fill:#999}svg a:hover .d{stroke:#000;stroke-width:1.5}
#detail{position:fixed;top:0;right:0;bottom:0;width:min(46em,48vw);background:#fff;border-left:2px solid #ccd;
box-shadow:-4px 0 12px rgba(0,0,0,.12);overflow:auto;padding:.6em 1em 2em;z-index:5}
#detail[hidden]{display:none}#detail .close{float:right;text-decoration:none;font-size:18px;color:var(--ink)}
#detail pre{white-space:pre-wrap;word-break:break-all;margin:0;max-height:22em;overflow:auto;
background:#f6f7f9;padding:3px 5px}
#detail table{border-collapse:collapse;margin:.3em 0;width:100%}
#detail td,#detail th{border:1px solid #dde;padding:2px 6px;text-align:left;vertical-align:top;
overflow-wrap:anywhere}
#detail th{width:9em;background:#f4f5f8;font-weight:normal}
#detail td.over{background:var(--bad)}
"""

# The detail views. Data goes into the DOM through textContent only, never innerHTML.
JS = """
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("data").textContent);
  var R = [], C = D.cols;
  var panel = document.getElementById("detail"), box = document.getElementById("detail-body");
  var cells = {}, byCase = {}, i;
  for (i = 0; i < D.n; i++) R.push({});
  Object.keys(C).forEach(function (k) {
    var c = C[k];
    for (var j = 0; j < D.n; j++) {
      var v = Array.isArray(c) ? c[j] : c.v[c.i[j]];
      if (v !== null) R[j][k] = v;
    }
  });
  R.forEach(function (r, i) {
    var k = r.f + "." + r.b;
    (cells[k] = cells[k] || []).push(i);
    (byCase[r.case] = byCase[r.case] || []).push(i);
  });
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function show(v) { return typeof v === "string" ? v : JSON.stringify(v); }
  function num(v) {
    if (typeof v !== "number" || Number.isInteger(v)) return show(v);
    return Number(v.toPrecision(3)).toString();
  }
  function badge(o) { return el("span", "badge o-" + o, o); }
  function link(i, text) { var a = el("a", null, text); a.href = "#r" + i; return a; }
  function field(t, name, value, pre) {
    if (value === undefined || value === null || value === "") return;
    var tr = t.insertRow(), th = el("th", null, name), td = tr.insertCell();
    tr.appendChild(th); tr.appendChild(td);
    if (value instanceof Node) td.appendChild(value);
    else if (pre) td.appendChild(el("pre", null, show(value)));
    else td.textContent = show(value);
  }
  function select(f, b) {
    document.querySelectorAll("td.sel").forEach(function (c) { c.classList.remove("sel"); });
    var a = document.querySelector('#matrix a[href="#c' + f + "." + b + '"]');
    if (a) a.parentNode.classList.add("sel");
  }
  function showRecord(i) {
    var r = R[i];
    if (!r) return false;
    box.replaceChildren(el("h3", null, r.case));
    var t = el("table");
    field(t, "outcome", badge(r.outcome));
    field(t, "backend", D.backends[r.b]);
    field(t, "spec row", D.features[r.f]);
    field(t, "area", D.areas[r.f]);
    field(t, "compare", r.compare);
    field(t, "output kind", r.output_kind);
    field(t, "tolerance", r.tolerance);
    field(t, "expected", r.expected, true);
    field(t, "got", r.got, true);
    field(t, "detail", r.detail, true);
    field(t, "output sha256", r.output_sha256);
    box.appendChild(t);
    var d = r.distances || {}, keys = Object.keys(d);
    if (keys.length) {
      var thr = (r.tolerance && D.tolerances[r.tolerance]) || {}, hasThr = Object.keys(thr).length > 0;
      var dt = el("table"), h = dt.insertRow();
      (hasThr ? ["distance", "value", "threshold"] : ["distance", "value"]).forEach(function (s) {
        h.appendChild(el("th", null, s));
      });
      keys.forEach(function (k) {
        var tr = dt.insertRow();
        tr.insertCell().textContent = k;
        var v = tr.insertCell(); v.textContent = num(d[k]);
        if (hasThr) tr.insertCell().textContent = k in thr ? num(thr[k]) : "";
        if (k in thr && typeof d[k] === "number" &&
            (k === "argmax" || k === "cosine" ? d[k] < thr[k] : d[k] > thr[k])) v.className = "over";
      });
      box.appendChild(el("h4", null, "distances"));
      box.appendChild(dt);
    }
    var others = (byCase[r.case] || []).filter(function (j) { return j !== i; });
    if (others.length) {
      box.appendChild(el("h4", null, "the same case on other backends"));
      var ul = el("ul");
      others.forEach(function (j) {
        var li = el("li");
        li.appendChild(badge(R[j].outcome));
        li.appendChild(document.createTextNode(" "));
        li.appendChild(link(j, D.backends[R[j].b]));
        ul.appendChild(li);
      });
      box.appendChild(ul);
    }
    var back = el("a", null, "\\u2190 all cases of " + D.features[r.f] + " on " + D.backends[r.b]);
    back.href = "#c" + r.f + "." + r.b;
    box.appendChild(el("p")).appendChild(back);
    select(r.f, r.b);
    return true;
  }
  function showCell(f, b) {
    var idx = cells[f + "." + b];
    var rank = {fail: 0, crash: 1, timeout: 2, error: 3, pass: 5, unsupported: 6};
    function rk(j) { return R[j].outcome in rank ? rank[R[j].outcome] : 4; }
    if (!idx) return false;
    idx = idx.slice().sort(function (x, y) { return rk(x) - rk(y) || x - y; });  // failures first
    box.replaceChildren(el("h3", null, D.features[f] + " \\u00b7 " + D.backends[b]));
    box.appendChild(el("p", "meta", idx.length + " case(s); click one for its detail"));
    var t = el("table");
    idx.forEach(function (i) {
      var r = R[i], tr = t.insertRow();
      tr.insertCell().appendChild(badge(r.outcome));
      tr.insertCell().appendChild(link(i, r.case));
      tr.insertCell().textContent = r.detail || "";
    });
    box.appendChild(t);
    select(f, b);
    return true;
  }
  function route() {
    var h = location.hash, m, ok = false;
    if ((m = /^#r(\\d+)$/.exec(h))) ok = showRecord(+m[1]);
    else if ((m = /^#c(\\d+)\\.(\\d+)$/.exec(h))) ok = showCell(+m[1], +m[2]);
    panel.hidden = !ok;
    if (ok) panel.scrollTop = 0;
  }
  window.addEventListener("hashchange", route);
  document.getElementById("detail-close").addEventListener("click", function (ev) {
    ev.preventDefault();
    history.replaceState(null, "", location.pathname + location.search);
    route();
  });
  function fold(tb, on) {
    tb.classList.toggle("collapsed", on);
    tb.querySelector(".toggle").setAttribute("aria-expanded", on ? "false" : "true");
  }
  var bodies = document.querySelectorAll("#matrix tbody.area");
  bodies.forEach(function (tb) {
    tb.querySelector(".toggle").addEventListener("click", function () {
      fold(tb, !tb.classList.contains("collapsed"));
    });
  });
  document.getElementById("fold-all").addEventListener("click", function () {
    bodies.forEach(function (tb) { fold(tb, true); });
  });
  document.getElementById("unfold-all").addEventListener("click", function () {
    bodies.forEach(function (tb) { fold(tb, false); });
  });
  var worst = document.getElementById("worst-out");
  document.querySelectorAll("#bitexact td.share").forEach(function (c) {
    c.addEventListener("click", function () { worst.textContent = c.title; });
  });
  route();
  document.body.setAttribute("data-ready", "1");
})();
"""


def render(results: dict) -> str:
    """The report page for one results.json dict; the same input gives the same bytes."""
    m = _Model(results)
    title = f"mlconf report \u00b7 {', '.join(m.backends) or 'no backends'}"
    return "".join(
        [
            "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>",
            '<meta name=viewport content="width=device-width,initial-scale=1">',
            # Nothing from the network, even by mistake: the page's own policy says so.
            "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
            _header(m),
            _failures(m),
            _matrix(m),
            _bitexact(m),
            _errors(m),
            '<aside id="detail" hidden><a href="#" id="detail-close" class=close title="close">\u00d7</a>'
            '<div id="detail-body"></div></aside>',
            f'<script type="application/json" id="data">{_script_json(m.data())}</script>',
            f"<script>{JS}</script></body></html>\n",
        ]
    )
