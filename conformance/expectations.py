"""Expectations files (``mlconf run --expect FILE``, issue 37): a runtime's recorded departures.

A YAML file valid against specs/expectations.schema.json lists entries ``{cases, backend?, expect,
reruns?, reason, link?}``; the first entry whose ``cases`` (an id or fnmatch pattern, or a list of them) and
``backend`` match a record applies to it. Its verdict (the record's ``expectation``):
  expected OUTCOME   the outcome is the one expected (fail, error, crash, timeout, unsupported):
                     it does not fail the run;
  unexpected pass    expected not to pass, and passed: it fails the run until the file is
                     updated (as Chromium's expectation files and Mesa's baselines do);
  unexpected OUTCOME another outcome than the one expected: it fails the run as without the file;
  flaky pass         expect flaky: the case did not pass, one of its ``reruns`` did (every
                     rerun's outcome is recorded in ``reruns``); flaky fail: none did.
A flaky case that passes at once has no verdict. Entries that match no record are reported
(``unused``): a certification refuses them, a plain run only names them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from pathlib import Path

import yaml

from mlconf import specs

SCHEMA = Path(specs.__file__).resolve().parent / "expectations.schema.json"
PASSING_VERDICTS = ("flaky pass",)  # with every "expected ..." verdict


class ExpectationsError(ValueError):
    """An expectations file that cannot be used; the message names the file and the entry."""


def load(path: str | Path) -> tuple[list[dict], str]:
    """(entries, sha256 of the file's bytes); ExpectationsError naming the file and the entry."""
    p = Path(path)
    try:
        data = p.read_bytes()
        doc = yaml.safe_load(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ExpectationsError(f"{p}: not a readable YAML file: {str(e).splitlines()[0]}") from None
    return check(doc, str(p)), hashlib.sha256(data).hexdigest()


def check(doc, where: str) -> list[dict]:
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    if err is not None:
        at = "/".join(str(p) for p in err.absolute_path) or "top level"
        raise ExpectationsError(
            f"{where}: {at}: {err.message.splitlines()[0]} (specs/expectations.schema.json)"
        )
    return doc["expectations"]


def entry_for(entries: list[dict], case: str, backend: str) -> int | None:
    """The index of the first entry matching a case id and backend name, or None."""
    for i, e in enumerate(entries):
        pats = [e["cases"]] if isinstance(e["cases"], str) else e["cases"]
        if any(fnmatch.fnmatchcase(case, p) for p in pats) and fnmatch.fnmatchcase(
            backend, e.get("backend", "*")
        ):
            return i
    return None


def verdict(entry: dict, outcome: str, reruns: list[str]) -> str | None:
    """The verdict of an outcome (and its reruns) under an entry (see the module doc)."""
    want = entry["expect"]
    if want == "flaky":
        if outcome == "pass":
            return None
        return "flaky pass" if "pass" in reruns else "flaky fail"
    if outcome == want:
        return f"expected {want}"
    return f"unexpected {outcome}"


def fails(verdict_text: str) -> bool:
    """Whether a verdict fails the run."""
    return not (verdict_text.startswith("expected ") or verdict_text in PASSING_VERDICTS)


def apply(records: list[dict], entries: list[dict], reruns: dict[tuple[str, str], list[str]]) -> list[int]:
    """Set each matched record's ``expectation`` ({entry, expect, reason, verdict, reruns}) in
    place; ``reruns``: (backend, case) -> the outcomes of its reruns. Returns the indices of the
    entries no record matched."""
    used = set()
    for r in records:
        i = entry_for(entries, r["case"], r["backend"])
        if i is None:
            continue
        used.add(i)
        e = entries[i]
        again = reruns.get((r["backend"], r["case"]), [])
        v = verdict(e, r["outcome"], again)
        if v is not None:
            r["expectation"] = {
                "entry": i,
                "expect": e["expect"],
                "reason": e["reason"],
                "verdict": v,
                "reruns": again,
            }
    return [i for i in range(len(entries)) if i not in used]


def to_rerun(results, entries: list[dict]) -> list:
    """The results (runner.Result) a flaky entry asks to rerun: not passed, with its rerun count."""
    out = []
    for r in results:
        i = entry_for(entries, r.case, r.backend)
        if i is not None and entries[i]["expect"] == "flaky" and r.outcome != "pass":
            out.append((r, entries[i]["reruns"]))
    return out
