"""The reports of a run: results.json, summary.md, junit.xml and report.html.

results.json (schema specs/results.schema.json, "mlconf-results/1") holds the run's options, the
records (records.py), the cross-backend bit-exactness matrix and the summary counts; it holds no
time, so two runs of the same cases give the same file. summary.md, junit.xml and report.html are
derived from it alone (``mlconf report RESULTS.json`` rebuilds them); the wall time of a run is
only in the last line of summary.md.

The matrix: for every pair of backends of the run and every output kind, the cases both ran to a
comparison (outcome pass or fail), how many of them gave bit-identical outputs (the sha256 of the
canonical bytes, records.canonical_bytes; two refusals of the same input count as identical), the
share, and the worst distance otherwise, computed between the two backends' outputs while they
are in memory:
  logits, embeddings       differ_cases, max_ulp, max_abs, nmse (each the largest over the cases),
                           shape_mismatch (cases whose shapes differ)
  quantizer / i2s bytes,   differ_cases, max_differ (most differing bytes), refusal_mismatch
  decoded bytes
  ids                      differ_cases, first_diff (the earliest differing position)
  statuses                 differ_cases
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from mlconf import records as rec
from mlconf.compare import distances

SCHEMA_ID = "mlconf-results/1"
FILES = ("results.json", "summary.md", "junit.xml", "report.html")


class ResultsError(Exception):
    """A file that is not a valid results.json; the message names the file and the problem."""


# ---------------------------------------------------------------- the matrix
def _worst_arrays(pairs: list[tuple[Any, Any]]) -> dict:
    worst = {"differ_cases": 0, "shape_mismatch": 0, "max_ulp": 0, "max_abs": 0.0, "nmse": 0.0}
    for a, b in pairs:
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            worst["differ_cases"] += 1
            worst["shape_mismatch"] += 1
            continue
        d = distances(b, a)
        if d["differ"] or a.dtype != b.dtype:
            worst["differ_cases"] += 1
        worst["max_ulp"] = max(worst["max_ulp"], d["max_ulp"])
        for k in ("max_abs", "nmse"):
            v = d[k]
            worst[k] = v if (np.isnan(v) or np.isnan(worst[k])) else max(worst[k], v)
    return {k: rec.json_value(v) for k, v in worst.items()}


def _worst_bytes(pairs: list[tuple[Any, Any]]) -> dict:
    from mlconf.compare import byte_distance

    worst = {"differ_cases": 0, "max_differ": 0, "refusal_mismatch": 0}
    for a, b in pairs:
        if (a is None) != (b is None):
            worst["differ_cases"] += 1
            worst["refusal_mismatch"] += 1
            continue
        d = byte_distance(rec.canonical_bytes(a) or b"", rec.canonical_bytes(b) or b"")
        if d["differ"]:
            worst["differ_cases"] += 1
            worst["max_differ"] = max(worst["max_differ"], d["differ"])
    return worst


def _worst_ids(pairs: list[tuple[Any, Any]]) -> dict:
    worst: dict[str, Any] = {"differ_cases": 0, "first_diff": None}
    for a, b in pairs:
        a, b = list(a or []), list(b or [])
        if a == b:
            continue
        worst["differ_cases"] += 1
        first = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        worst["first_diff"] = first if worst["first_diff"] is None else min(worst["first_diff"], first)
    return worst


def _worst_statuses(pairs: list[tuple[Any, Any]]) -> dict:
    return {"differ_cases": sum(1 for a, b in pairs if a != b)}


WORST = {
    "logits": _worst_arrays,
    "embeddings": _worst_arrays,
    "quantizer bytes": _worst_bytes,
    "i2s bytes": _worst_bytes,
    "decoded bytes": _worst_bytes,
    "ids": _worst_ids,
    "statuses": _worst_statuses,
}


def matrix(results, backend_names: list[str] | None = None) -> list[dict]:
    """The bit-exactness matrix of runner.Results (with their outputs): one row per pair of
    backends (in the order given, else sorted) and output kind."""
    names = backend_names or sorted({r.backend for r in results})
    by: dict[tuple[str, str], Any] = {(r.backend, r.case): r for r in results}
    kinds: dict[str, str] = {r.case: r.output_kind for r in results}
    cases = sorted(kinds)
    rows = []
    for a, b in combinations(names, 2):
        for kind in rec.OUTPUT_KINDS:
            pairs, identical = [], 0
            for c in cases:
                if kinds[c] != kind:
                    continue
                ra, rb = by.get((a, c)), by.get((b, c))
                if ra is None or rb is None or ra.outcome not in rec.RAN or rb.outcome not in rec.RAN:
                    continue
                if rec.sha256(ra.output) == rec.sha256(rb.output):
                    identical += 1
                else:
                    pairs.append((ra.output, rb.output))
            compared = identical + len(pairs)
            rows.append(
                {
                    "a": a,
                    "b": b,
                    "kind": kind,
                    "compared": compared,
                    "identical": identical,
                    "share": identical / compared if compared else None,
                    "worst": WORST[kind](pairs) if pairs else None,
                }
            )
    return rows


# ---------------------------------------------------------------- results.json
def summary(records: list[dict]) -> list[dict]:
    counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in records:
        counts[(r["backend"], r["area"])][r["outcome"]] += 1
    return [
        {"backend": b, "area": a, **{o: c.get(o, 0) for o in rec.OUTCOMES}, "total": sum(c.values())}
        for (b, a), c in sorted(counts.items())
    ]


def _version() -> str:
    from mlconf import __version__

    return __version__


def build(
    results,
    backends,
    areas: list[str],
    k: str | None,
    gate: bool | frozenset[str],
    jobs: int,
    shards: list[str] | None = None,
    target_version: str | None = None,
) -> dict:
    """The results.json document of a run (runner.Results with their outputs); ``gate`` as
    records.failing takes it; ``shards``: the --shard of the run (merged runs list several);
    ``target_version``: the Krafla version gated (--target-version), None for the newest."""
    from mlconf.backends import CAPABILITIES
    from mlconf.certify import library_identity

    records = rec.records(results)
    names = [b.name for b in backends]
    gated = sorted(CAPABILITIES) if gate is True else sorted(gate or ())
    return {
        "schema": SCHEMA_ID,
        "mlconf_version": _version(),
        "run": {
            "backends": [
                {
                    "name": b.name,
                    "description": str(getattr(b, "description", "") or ""),
                    "capabilities": sorted(b.capabilities),
                    "gated": gated,
                    "gated_missing": sorted(set(gated) - set(b.capabilities)),
                    "version_switch": getattr(b, "target_version", None) is not None,
                    "library": library_identity(b),
                }
                for b in backends
            ],
            "areas": list(areas),
            "k": k,
            "strict": gate is True,
            "required": gated,
            "jobs": int(jobs),
            "shards": list(shards or []),
            "target_version": target_version,
        },
        "records": records,
        "matrix": matrix(results, names),
        "summary": summary(records),
    }


def _merge_worst(a: dict | None, b: dict | None) -> dict | None:
    """Two shards' worst distances of one matrix row: counts add, first_diff is the smaller,
    every other figure the larger (a "NaN" stays)."""
    if a is None or b is None:
        return a if b is None else b
    out = {}
    for key in a:
        x, y = a[key], b[key]
        if key.endswith("_cases") or key.endswith("_mismatch"):
            out[key] = x + y
        elif key == "first_diff":
            out[key] = y if x is None else x if y is None else min(x, y)
        elif "NaN" in (x, y):
            out[key] = "NaN"
        else:
            out[key] = max(x, y, key=float)  # float("Infinity") is inf
    return out


def merge(docs: list[dict], names: list[str]) -> dict:
    """One results document from the shards of one run (each case in one shard): the same mlconf,
    selection and gate, every backend in each; ResultsError otherwise, or when a (backend, case)
    appears twice."""
    first = docs[0]
    for doc, name in zip(docs[1:], names[1:], strict=True):
        for key, what in (
            (("mlconf_version",), "mlconf version"),
            (("run", "k"), "-k"),
            (("run", "strict"), "--strict"),
            (("run", "required"), "--require"),
            (("run", "areas"), "--area"),
            (("run", "target_version"), "--target-version"),
        ):
            va, vb = first, doc
            for part in key:
                va, vb = va.get(part), vb.get(part)
            if va != vb:
                raise ResultsError(
                    f"{name}: {what} {vb!r} differs from {names[0]}'s {va!r}: not shards of one run"
                )
        if [b["name"] for b in doc["run"]["backends"]] != [b["name"] for b in first["run"]["backends"]]:
            raise ResultsError(f"{name}: other backends than {names[0]}: not shards of one run")
    seen: dict[tuple[str, str], str] = {}
    records = []
    for doc, name in zip(docs, names, strict=True):
        for r in doc["records"]:
            key = (r["backend"], r["case"])
            if key in seen:
                raise ResultsError(f"{name}: {r['backend']} {r['case']} is also in {seen[key]}")
            seen[key] = name
            records.append(r)
    records.sort(key=lambda d: (d["backend"], d["case"]))
    rows: dict[tuple[str, str, str], dict] = {}
    for doc in docs:
        for m in doc["matrix"]:
            key = (m["a"], m["b"], m["kind"])
            if key not in rows:
                rows[key] = dict(m)
                continue
            row = rows[key]
            row["compared"] += m["compared"]
            row["identical"] += m["identical"]
            row["share"] = row["identical"] / row["compared"] if row["compared"] else None
            row["worst"] = _merge_worst(row["worst"], m["worst"])
    run = dict(
        first["run"],
        jobs=max(d["run"]["jobs"] for d in docs),
        shards=[s for d in docs for s in d["run"].get("shards", [])],
    )
    return {
        **first,
        "run": run,
        "records": records,
        "matrix": list(rows.values()),
        "summary": summary(records),
    }


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def schema() -> dict:
    from mlconf import specs

    return json.loads((Path(specs.__file__).parent / "results.schema.json").read_text(encoding="utf-8"))


def validate(doc: Any, where: str = "results.json") -> None:
    """ResultsError unless ``doc`` is a results document valid against specs/results.schema.json
    (jsonschema is a dependency: the check never weakens)."""
    import jsonschema

    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA_ID:
        raise ResultsError(f'{where}: not an mlconf results file (no "schema": "{SCHEMA_ID}")')
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema()).iter_errors(doc))
    if err is not None:
        path = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        raise ResultsError(f"{where}: {path.lstrip('.') or 'top level'}: {err.message}")


def load(path: str | Path) -> dict:
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultsError(f"{p}: not JSON ({e})") from None
    validate(doc, str(p))
    return doc


# ---------------------------------------------------------------- summary.md
def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "-" if v is None else str(v)


def _dist_text(d: dict | None) -> str:
    if not d:
        return ""
    return ", ".join(f"{k} {_fmt(v)}" for k, v in d.items())


def failures(doc: dict) -> list[dict]:
    gate = rec.gate_of(doc["run"])
    return sorted(
        (r for r in doc["records"] if rec.record_fails(r, gate)),
        key=lambda r: (r["area"], r["case"], r["backend"]),
    )


def summary_md(doc: dict, wall: float | None = None) -> str:
    run = doc["run"]
    strict, required = run["strict"], run.get("required") or []
    out = [
        "# mlconf results\n",
        f"mlconf {doc['mlconf_version']}; backends {', '.join(b['name'] for b in run['backends'])}; "
        f"areas {', '.join(run['areas'])}"
        + (f"; -k {run['k']!r}" if run["k"] else "")
        + (
            f"; --target-version {run['target_version']} (a Krafla {run['target_version']} runtime)"
            if run.get("target_version")
            else ""
        )
        + (
            "; --strict (unsupported counts as a failure)"
            if strict
            else f"; --require {','.join(required)} (unsupported counts as a failure there)"
            if required
            else ""
        )
        + "\n",
    ]
    rows = [[s["backend"], s["area"], *(s[o] for o in rec.OUTCOMES), s["total"]] for s in doc["summary"]]
    out += [
        "## Outcomes by area and backend\n",
        tabulate(rows, headers=["backend", "area", *rec.OUTCOMES, "total"], tablefmt="github"),
        "",
    ]
    n_fail = len(failures(doc))
    out.append(
        f"{len(doc['records'])} case runs; {n_fail} "
        + (
            "failing (fail, error, crash, timeout, unsupported)"
            if strict
            else "failing (fail, error, crash, timeout, unsupported where required)"
            if required
            else "failing (fail, error, crash, timeout)"
        )
        + "\n"
    )
    out += _rule_lines(doc)
    mrows = [
        [
            m["a"],
            m["b"],
            m["kind"],
            m["compared"],
            m["identical"],
            "-" if m["share"] is None else f"{m['share']:.1%}",
            _dist_text(
                {
                    k: v
                    for k, v in (m["worst"] or {}).items()
                    if v or k not in ("shape_mismatch", "refusal_mismatch")
                }
            ),
        ]
        for m in doc["matrix"]
        if m["compared"]
    ]
    out += [
        "## Bit-exactness between backends\n",
        "Cases both backends ran to a comparison, how many gave bit-identical outputs, and the worst "
        "distance between the two outputs otherwise. Pairs and kinds with no common case are left out.\n",
    ]
    out += [
        tabulate(
            mrows, headers=["a", "b", "output", "compared", "identical", "share", "worst"], tablefmt="github"
        )
        if mrows
        else "No pair of backends ran a common case.",
        "",
    ]
    frows = [
        [
            r["area"],
            r["case"],
            r["backend"],
            r["outcome"],
            _dist_text(r["distances"]),
            r["detail"].replace("|", "\\|").replace("\n", " ")[:300],
        ]
        for r in failures(doc)
    ]
    out += ["## Failures\n"]
    out += [
        tabulate(
            frows, headers=["area", "case", "backend", "outcome", "distances", "detail"], tablefmt="github"
        )
        if frows
        else "None.",
        "",
    ]
    out.append(
        f"Wall time: {wall:.2f} s."
        if wall is not None
        else "Wall time: not recorded (rebuilt from results.json)."
    )
    return "\n".join(out) + "\n"


def _rule_lines(doc: dict) -> list[str]:
    """How each backend's status verdicts were judged: by status and rule id, or by status only
    (a backend that does not report the rule behind a status: no ml_check_rule)."""
    judged: dict[str, Counter] = defaultdict(Counter)
    for r in doc["records"]:
        d = r["distances"] or {}
        if r["output_kind"] == "statuses" and d.get("rule_expected") is not None:
            judged[r["backend"]]["rule" if d.get("rule_got") is not None else "status only"] += 1
    lines = [
        f"- {b}: {c['rule']} by status and rule id, {c['status only']} by status only"
        + (
            " (it does not report rules: ml_check_rule, ml_tok_check_rule or `rule`)"
            if c["status only"]
            else ""
        )
        for b, c in sorted(judged.items())
    ]
    return ["## Status verdicts\n", *lines, ""] if lines else []


# ---------------------------------------------------------------- junit.xml
def junit_xml(doc: dict) -> bytes:
    gate = rec.gate_of(doc["run"])
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in doc["records"]:
        groups[(r["backend"], r["area"])].append(r)
    root = ET.Element("testsuites", name="mlconf")
    totals = Counter()
    for (backend, area), recs in sorted(groups.items()):
        suite = ET.SubElement(root, "testsuite", name=f"{backend}.{area}")
        n = Counter()
        for r in sorted(recs, key=lambda r: r["case"]):
            tc = ET.SubElement(suite, "testcase", classname=area, name=r["case"])
            props = ET.SubElement(tc, "properties")
            for k in ("backend", "spec", "compare", "output_kind"):
                ET.SubElement(props, "property", name=k, value=str(r[k]))
            msg = r["detail"] or r["outcome"]
            dist = _dist_text(r["distances"])
            e = r.get("expectation")
            if e and not rec.record_fails(r, gate):  # an expected outcome: reported, not failed
                ET.SubElement(tc, "skipped", message=f"{e['verdict']}: {e['reason']}")
                n["skipped"] += 1
            elif e and r["outcome"] == "pass":
                ET.SubElement(tc, "failure", message=f"{e['verdict']}: {e['reason']}", type="unexpected pass")
                n["failures"] += 1
            elif r["outcome"] == "fail" or (
                r["outcome"] == "unsupported"
                and rec.failing("unsupported", gate, r.get("capability"), r.get("claims", ()))
            ):
                el = ET.SubElement(tc, "failure", message=msg, type=r["outcome"])
                el.text = dist or None
                n["failures"] += 1
            elif r["outcome"] in ("error", "crash", "timeout"):
                ET.SubElement(tc, "error", message=msg, type=r["outcome"])
                n["errors"] += 1
            elif r["outcome"] == "unsupported":
                ET.SubElement(tc, "skipped", message=msg)
                n["skipped"] += 1
        for k in ("failures", "errors", "skipped"):
            suite.set(k, str(n[k]))
        suite.set("tests", str(len(recs)))
        totals.update(n)
        totals["tests"] += len(recs)
    for k in ("tests", "failures", "errors", "skipped"):
        root.set(k, str(totals[k]))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


# ---------------------------------------------------------------- writing
def _html(doc: dict) -> str | None:
    from mlconf.report_html import render

    try:
        return render(doc)
    except Exception as e:  # the other reports stand without it
        print(f"mlconf: report.html not written: render failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def write(doc: dict, outdir: str | Path, wall: float | None = None, results_json: bool = True) -> list[Path]:
    """Write results.json (unless rebuilding from it), summary.md, junit.xml and report.html into
    ``outdir`` (created), each atomically; returns the paths written."""
    from mlconf.tools.files import atomic_write

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[tuple[str, bytes]] = []
    if results_json:
        files.append(("results.json", dumps(doc).encode()))
    files += [("summary.md", summary_md(doc, wall).encode()), ("junit.xml", junit_xml(doc))]
    html = _html(doc)
    if html is not None:
        files.append(("report.html", html.encode()))
    written = []
    for name, data in files:
        atomic_write(out / name, [data])
        written.append(out / name)
    return written


# ---------------------------------------------------------------- diff
def diff(old: dict, new: dict) -> tuple[list[dict], list[dict]]:
    """(regressed, fixed) between two results documents. Regressed: a record that passed and now
    fails, errors, crashes, times out or is unsupported (a lost capability), or that is gone from
    the new run; fixed: a record that failed, errored, crashed, timed out or was unsupported and
    now passes."""
    a = {(r["backend"], r["case"]): r for r in old["records"]}
    b = {(r["backend"], r["case"]): r for r in new["records"]}
    regressed, fixed = [], []
    for key in sorted(a.keys() | b.keys()):
        ra, rb = a.get(key), b.get(key)
        was = ra["outcome"] if ra else None
        now = rb["outcome"] if rb else None
        row = {
            "backend": key[0],
            "case": key[1],
            "was": was or "absent",
            "now": now or "absent",
            "before": ra["distances"] if ra else None,
            "after": rb["distances"] if rb else None,
            "detail": (rb or ra)["detail"],
        }
        if was == "pass" and (now in rec.FAILING or now in (None, "unsupported")):
            regressed.append(row)
        elif (was in rec.FAILING or was == "unsupported") and now == "pass":
            fixed.append(row)
    return regressed, fixed


DIFF_WIDTH = 110


def _fit(text: str, width: int = DIFF_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def diff_text(regressed: list[dict], fixed: list[dict]) -> str:
    """One line per case (backend, case, outcome change), then its distances before and after on
    indented lines; no line over DIFF_WIDTH characters."""
    out = []
    for title, rows in (("Regressed", regressed), ("Fixed", fixed)):
        out.append(f"{title}: {len(rows)}")
        for r in rows:
            out.append(_fit(f"  {r['backend']} {r['case']}: {r['was']} -> {r['now']}"))
            for label, d in (("before", r["before"]), ("after", r["after"])):
                if d:
                    out.append(_fit(f"      {label}: {_dist_text(d)}"))
            if r["now"] in ("unsupported", "absent") and r["detail"]:
                out.append(_fit(f"      {r['detail']}"))
        out.append("")
    return "\n".join(out)
