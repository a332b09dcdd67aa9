"""Certification packages (issue 37): ``mlconf certify`` writes one, ``mlconf verify`` checks one
without running anything.

A package is a .tar.gz of flat files: certification.json (what was certified: the backend, the
Krafla version, the claimed capabilities, the library files' SHA-256 and exported symbols, the
must-pass list's and the expectations file's SHA-256, mlconf's version and git commit, the host,
the command line, and the SHA-256 of every other file), results.json, junit.xml, summary.md,
report.html, mustpass.txt and expectations.yaml (when one was given). The SHA-256 of
certification.json is the package's identity: the one a vendor publishes.

verify checks (each failure one line naming the file and the rule):
  files        every file listed, present, with its SHA-256; nothing else in the archive; no
               link, folder or absolute path; results.json valid against its schema;
  mustpass     the package's list is this mlconf's list of that version, byte for byte;
  coverage     every case of the list in a claimed capability has exactly one record of the
               backend, and no record is of a case outside the list;
  results      each allowed: pass; unsupported only outside the claimed capabilities; else a
               verdict of the package's expectations file that does not fail, recomputed here
               from the outcome, the entry and the reruns (a record cannot bring its own);
  consistency  each record's outcome agrees with its own comparison (statuses and rule ids,
               byte and id distances, toleranced distances against specs/tolerances.yaml);
               junit.xml and the summary are what results.json gives; the library SHA-256 of
               certification.json is results.json's; with --library, the files given are the
               ones certified.
A package re-made whole by someone who can run mlconf cannot be told apart from a real one
without the library: that is what --library and a rerun of ``mlconf certify`` are for; the
checks above make every partial edit fail.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from mlconf import expectations as expect_mod
from mlconf import mustpass
from mlconf import records as rec

FORMAT = "mlconf certification v1"
CERT = "certification.json"
MAX_MEMBER = 64 << 20  # bytes per file of a package read by verify
REPORT_FILES = ("results.json", "junit.xml", "summary.md", "report.html")


class CertifyError(Exception):
    """A certification that cannot be made or a package that does not verify: one line."""


# ---------------------------------------------------------------- identity
def library_files(backend) -> list[Path]:
    """The shared libraries a backend runs: lib_path (native, bitnet, lib:), llama.cpp's
    libllama.so and libggml*.so; none for an in-process Python backend."""
    if getattr(backend, "lib_path", None):  # a command (native:neon's qemu-user line) names no file
        return [Path(backend.lib_path).resolve()] if Path(backend.lib_path).is_file() else []
    argv = list(getattr(backend, "argv", []) or [])
    if "mlconf.backends.llama_cpp.program" in argv:
        if "--lib" in argv:
            folder = Path(argv[argv.index("--lib") + 1])
        else:
            import importlib.util

            spec = importlib.util.find_spec("llama_cpp")
            folder = Path(spec.origin).parent / "lib" if spec and spec.origin else Path("/nonexistent")
        return sorted(p.resolve() for p in folder.glob("lib*.so*") if p.is_file())
    return []


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _symbols(path: Path) -> list[str] | None:
    """The dynamic symbols a library defines (binutils nm), None where nm is missing."""
    nm = shutil.which("nm")
    if nm is None:
        return None
    out = subprocess.run([nm, "-D", "--defined-only", str(path)], capture_output=True, text=True, check=False)
    return sorted(
        {ln.split()[-1] for ln in out.stdout.splitlines() if len(ln.split()) == 3 and ln.split()[1] in "TW"}
    )


def library_identity(backend) -> list[dict]:
    """[{name, sha256}] of the backend's library files (results.json's run.backends[].library)."""
    return [{"name": p.name, "sha256": _sha(p)} for p in library_files(backend)]


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def host() -> dict:
    from mlconf.bench import cpu_flags

    cpu = ""
    try:
        cpu = next(
            (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""
        )
    except OSError:
        pass
    cc = shutil.which("cc") or shutil.which("gcc")
    compiler = ""
    if cc:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
        compiler = (out.stdout.splitlines() or [""])[0]
    return {
        "cpu": cpu or platform.processor(),
        "machine": platform.machine(),
        "isa": sorted(
            cpu_flags()
            & {
                "sse4_2",
                "avx",
                "avx2",
                "fma",
                "f16c",
                "avx512f",
                "avx512bw",
                "avx512_vnni",
                "avx_vnni",
                "asimd",
                "asimddp",
            }
        ),
        "os": platform.platform(),
        "python": platform.python_version(),
        "compiler": compiler,
    }


# ---------------------------------------------------------------- certify
def write_package(out: Path, files: dict[str, bytes], cert: dict) -> str:
    """Write the package atomically; returns the SHA-256 of certification.json."""
    from mlconf.tools.files import atomic_write

    cert = {**cert, "files": {n: hashlib.sha256(b).hexdigest() for n, b in sorted(files.items())}}
    cert_bytes = (json.dumps(cert, indent=1, sort_keys=True) + "\n").encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [(CERT, cert_bytes), *sorted(files.items())]:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    atomic_write(out, [buf.getvalue()])
    return hashlib.sha256(cert_bytes).hexdigest()


def certify(
    backend: str, version: str, output: str, expect: str | None, jobs: int, timeout, argv
) -> tuple[int, str]:
    """Run the must-pass list of ``version`` on ``backend`` (through ``mlconf run``: --require
    the backend's capabilities, --target-version for a released version, --expect) and write
    the package. Returns (the run's exit code, the package's SHA-256)."""
    import argparse

    from mlconf import cli

    rows, list_sha = mustpass.load(version)
    changed = mustpass.drift(version)
    if version in mustpass.RELEASED and changed:
        raise CertifyError(f"specs/mustpass/{version}.txt: this mlconf's suite departs from it: {changed[0]}")
    b = cli._backend(backend)
    claims = sorted(b.capabilities)
    with tempfile.TemporaryDirectory(prefix="mlconf-certify-") as tmp:
        args = argparse.Namespace(
            backend=[backend],
            k=None,
            area=None,
            report=tmp,
            jobs=jobs,
            fail_fast=False,
            timeout=timeout,
            strict=False,
            list=False,
            shard=None,
            require=[",".join(claims)] if claims else None,
            target_version=None if version == mustpass.CURRENT else version,
            expect=expect,
            only_ids={cid for cap, cid, _ in rows},
        )
        code = cli.cmd_run(args)
        files = {n: (Path(tmp) / n).read_bytes() for n in REPORT_FILES if (Path(tmp) / n).is_file()}
    import secrets

    try:
        checked = audit(b, version, json.loads(files["results.json"])["records"], secrets.randbits(32))
    finally:
        getattr(b, "close", lambda: None)()  # its worker process
    for m in checked["mismatches"]:
        print(f"mlconf: audit: {m}", file=sys.stderr)
    if checked["mismatches"] and code == 0:
        code = 1
    files["mustpass.txt"] = mustpass.path(version).read_bytes()
    if expect:
        files["expectations.yaml"] = Path(expect).read_bytes()
    from mlconf import __version__

    libs = library_files(b)
    cert = {
        "format": FORMAT,
        "mlconf_version": __version__,
        "mlconf_git": _git_commit(),
        "backend": b.name,
        "version": version,
        "claims": claims,
        "library": [{"name": p.name, "sha256": _sha(p), "symbols": _symbols(p)} for p in libs],
        "mustpass": {"version": version, "sha256": list_sha, "cases": len(rows)},
        "expectations": hashlib.sha256(files["expectations.yaml"]).hexdigest() if expect else None,
        "host": host(),
        "command": list(argv),
        "run_exit": code,
        "audit": checked,
    }
    return code, write_package(Path(output), files, cert)


# ---------------------------------------------------------------- audit
AUDIT_CASES = 64  # cases replayed by the audit (all of a shorter list)


def _renamer(folder: Path, rng):
    """copy(src) -> the same bytes under a fresh random name in ``folder`` (names from ``rng``, so
    that an audit replays from its seed)."""

    def copy(src: Path) -> Path:
        dst = folder / f"{rng.getrandbits(64):016x}{src.suffix}"
        shutil.copyfile(src, dst)
        return dst

    return copy


def _disguise(case, copy):
    """The case with each golden file among its parameters under a fresh name. Its inputs stay
    the suite's: drawing fresh ones (the tokens in a new order) moved toleranced verdicts with
    the inputs, not with any gaming (llama.cpp's forward/fixture/valid/q4_mask_b/decode passes on
    the suite's tokens and fails on a permutation of them, within its f16 roundings)."""
    from dataclasses import replace

    return replace(
        case,
        params={k: copy(v) if isinstance(v, Path) and v.is_file() else v for k, v in case.params.items()},
    )


def audit(backend, version: str, records: list[dict], seed: int, n: int = AUDIT_CASES) -> dict:
    """Anti-gaming replay (as MLPerf's TEST01/04/05): a seeded sample of the list's cases that ran
    to a comparison, run again in a shuffled order with every input file under a fresh random
    name (_disguise). A runtime that keys on file names or the order of cases answers
    differently: each case whose outcome or (for exact comparisons) output differs from the
    certified run is a mismatch."""
    import random

    from mlconf import cases as case_list
    from mlconf import runner

    rng = random.Random(seed)
    ran = sorted(r["case"] for r in records if r["outcome"] in rec.RAN)
    sample = rng.sample(ran, min(n, len(ran)))
    target = None if version == mustpass.CURRENT else mustpass.specs.parse_version(version)
    by_id = {c.id: c for c in case_list.collect(target_version=target) if c.id in set(sample)}
    before = {r["case"]: r for r in records}
    with tempfile.TemporaryDirectory(prefix="mlconf-audit-") as tmp:
        copy = _renamer(Path(tmp), rng)

        class Renamed(runner.Workdir):
            """Generated fixtures under fresh names (the io.open ones, not files, as they are)."""

            names: dict[str, Path] = {}

            def path(self, fixture):
                real = super().path(fixture)
                if not real.is_file() or real.is_symlink():
                    return real
                if fixture.file not in self.names:
                    self.names[fixture.file] = copy(real)
                return self.names[fixture.file]

        work = Renamed()
        try:
            todo = [_disguise(by_id[cid], copy) for cid in sample]
            results = runner.run(todo, [backend], work=work)
        finally:
            work.close()
    mismatches = []
    for res in results:
        r0 = before[res.case]
        exact = r0["compare"] != "toleranced"
        sha = rec.sha256(res.output)
        if res.outcome != r0["outcome"] or (exact and sha != r0["output_sha256"]):
            mismatches.append(f"{res.case}: {r0['outcome']} in the run, {res.outcome} renamed and reordered")
    return {
        "seed": seed,
        "cases": sample,
        "outcomes": {r.case: r.outcome for r in results},
        "mismatches": mismatches,
    }


# ---------------------------------------------------------------- verify
def read_package(path: str | Path) -> dict[str, bytes]:
    """The files of a package, read in memory (nothing extracted); CertifyError for a member
    that is not a plain file with a plain name, or too large."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for m in tar:
                if not m.isfile() or "/" in m.name or m.name in ("", ".", ".."):
                    raise CertifyError(f"{path}: member {m.name!r}: a package holds plain files only")
                if m.size > MAX_MEMBER:
                    raise CertifyError(f"{path}: member {m.name}: {m.size} bytes, over {MAX_MEMBER}")
                if m.name in files:
                    raise CertifyError(f"{path}: member {m.name} appears twice")
                files[m.name] = tar.extractfile(m).read()
    except (OSError, tarfile.TarError, EOFError) as e:
        raise CertifyError(f"{path}: not a readable .tar.gz: {e}") from None
    return files


def _num(v):
    return float(v) if isinstance(v, str) else v


def consistent(r: dict) -> str | None:
    """Why a record's outcome disagrees with its own comparison, or None."""
    d, o = r.get("distances"), r["outcome"]
    if o not in rec.RAN or d is None:
        return None
    if r["output_kind"] == "statuses":
        ok = d["got"] == d["expected"] if r["compare"] == "status" else d["got"] != "ML_OK"
        if r["compare"] == "status" and d.get("rule_expected") and d.get("rule_got") is not None:
            ok = ok and d["rule_got"] == d["rule_expected"]
    elif r["compare"] == "toleranced" and r.get("tolerance"):
        from mlconf.compare import within

        ok = within(r["tolerance"], {k: _num(v) for k, v in d.items()})[0]
    elif "differ" in d:
        ok = d["differ"] == 0
    elif "first_diff" in d:
        ok = d["first_diff"] is None and d["len_expected"] == d["len_got"]
    else:
        return None
    if ok != (o == "pass"):
        return (
            f"outcome {o}, but its distances {json.dumps(d, sort_keys=True)} say {'pass' if ok else 'fail'}"
        )
    return None


def verify(path: str | Path, libraries: list[str] = ()) -> list[str]:
    """The reasons a package is not a conformant certification (empty: it is)."""
    from mlconf import reports

    files = read_package(path)
    if CERT not in files:
        return [f"{path}: no {CERT}"]
    try:
        cert = json.loads(files[CERT])
    except ValueError as e:
        return [f"{CERT}: not JSON: {e}"]
    if not isinstance(cert, dict) or cert.get("format") != FORMAT:
        return [f"{CERT}: format is not {FORMAT!r}"]
    bad: list[str] = []
    listed = cert.get("files") or {}
    for name in sorted(set(files) - {CERT} - set(listed)):
        bad.append(f"{name}: in the archive, not listed in {CERT}")
    for name, sha in sorted(listed.items()):
        if name not in files:
            bad.append(f"{name}: listed in {CERT}, missing from the archive")
        elif hashlib.sha256(files[name]).hexdigest() != sha:
            bad.append(f"{name}: SHA-256 differs from {CERT}'s (the file was changed)")
    if bad or "results.json" not in files or "mustpass.txt" not in files:
        return bad or ["results.json and mustpass.txt are required"]
    try:
        doc = json.loads(files["results.json"])
        reports.validate(doc, "results.json")
    except (ValueError, reports.ResultsError) as e:
        return [f"results.json: {e}"]
    version = cert.get("version")
    try:
        mine = mustpass.path(str(version)).read_bytes()
    except OSError:
        return [f"{CERT}: version {version!r}: this mlconf has no must-pass list of it"]
    if files["mustpass.txt"] != mine:
        bad.append(f"mustpass.txt: not this mlconf's specs/mustpass/{version}.txt")
    if hashlib.sha256(files["mustpass.txt"]).hexdigest() != (cert.get("mustpass") or {}).get("sha256"):
        bad.append(f"mustpass.txt: SHA-256 is not the one {CERT} records")
    rows = mustpass.parse(files["mustpass.txt"].decode("utf-8"), "mustpass.txt")
    backend, claims = cert.get("backend"), set(cert.get("claims") or ())
    entries = []
    if "expectations.yaml" in files:
        import yaml

        try:
            entries = expect_mod.check(yaml.safe_load(files["expectations.yaml"]), "expectations.yaml")
        except (yaml.YAMLError, expect_mod.ExpectationsError) as e:
            bad.append(f"expectations.yaml: {e}")
    elif cert.get("expectations"):
        bad.append(f"expectations.yaml: {CERT} records one, the archive has none")
    # results.json's own record of the library and the expectations must be the certificate's
    run_backends = {b["name"]: b for b in doc["run"]["backends"]}
    if set(run_backends) != {backend}:
        bad.append(f"results.json: backends {sorted(run_backends)}, the certificate names {backend!r}")
    lib_doc = [(x["name"], x["sha256"]) for x in run_backends.get(backend, {}).get("library", [])]
    lib_cert = [(x.get("name"), x.get("sha256")) for x in cert.get("library") or []]
    if lib_doc != lib_cert:
        bad.append(f"{CERT}: library SHA-256 {lib_cert} is not results.json's {lib_doc}")
    for lib in libraries:
        sha = _sha(Path(lib))
        if (Path(lib).name, sha) not in lib_cert:
            bad.append(f"--library {lib}: SHA-256 {sha[:16]}... is not a library of this certificate")
    got_exp = (doc["run"].get("expectations") or {}).get("sha256")
    if got_exp != cert.get("expectations"):
        bad.append(
            f"results.json: expectations file {got_exp} is not the certificate's {cert.get('expectations')}"
        )
    if sorted(doc["run"].get("required") or []) != sorted(claims):
        bad.append(
            f"results.json: required {doc['run'].get('required')}, the certificate claims {sorted(claims)}"
        )
    # coverage and allowed results
    recs: dict[str, list[dict]] = {}
    for r in doc["records"]:
        recs.setdefault(r["case"], []).append(r)
    caps = {cid: cap for cap, cid, _ in rows}
    for cid in sorted(set(recs) - set(caps)):
        bad.append(f"results.json: {cid}: not a case of the must-pass list")
    for cap, cid, _ in rows:
        got = recs.get(cid, [])
        if len(got) != 1:
            if cap in claims or got:
                bad.append(f"results.json: {cid}: {len(got)} records (one required)")
            continue
        bad += [f"results.json: {cid}: {why}" for why in _judge(got[0], cap, claims, entries)]
    bad += _check_audit(cert.get("audit"), recs, rows, claims)
    if reports.junit_xml(doc) != files.get("junit.xml"):
        bad.append("junit.xml: not the report results.json gives")
    if reports.summary(doc["records"]) != doc["summary"]:
        bad.append("results.json: its summary does not count its records")
    return bad


def _check_audit(a, recs: dict[str, list[dict]], rows, claims: set[str]) -> list[str]:
    """The audit must have replayed its share of the list, with the certified outcomes."""
    if (
        not isinstance(a, dict)
        or not isinstance(a.get("cases"), list)
        or not isinstance(a.get("outcomes"), dict)
    ):
        return [f"{CERT}: no audit (a certification replays a sample renamed and reordered)"]
    ran = [cid for cid, rs in recs.items() if rs and rs[0]["outcome"] in rec.RAN]
    out = []
    need, got = min(AUDIT_CASES, len(ran)), set(a["cases"])
    if len(got) < need or not got <= set(ran):
        out.append(f"{CERT}: audit: {len(got)} cases, of those that ran: {need} required")
    for cid in a["cases"]:
        was = recs[cid][0]["outcome"] if recs.get(cid) else None
        if was is not None and a["outcomes"].get(cid) != was:
            out.append(
                f"{CERT}: audit: {cid}: {a['outcomes'].get(cid)} renamed and reordered, {was} in the run"
            )
    out += [f"{CERT}: audit: {m}" for m in a.get("mismatches") or []]
    return out


def _judge(r: dict, cap: str, claims: set[str], entries: list[dict]) -> list[str]:
    out = []
    why = consistent(r)
    if why:
        out.append(why)
    i = expect_mod.entry_for(entries, r["case"], r["backend"])
    e = r.get("expectation")
    want = None
    if i is not None:
        reruns = (e or {}).get("reruns", [])
        v = expect_mod.verdict(entries[i], r["outcome"], reruns)
        want = (
            None
            if v is None
            else {
                "entry": i,
                "expect": entries[i]["expect"],
                "reason": entries[i]["reason"],
                "verdict": v,
                "reruns": reruns,
            }
        )
    if e != want:
        out.append(f"its expectation {e} is not what the package's expectations file gives ({want})")
        return out
    if r["outcome"] == "pass":
        return out
    if e is not None:
        if expect_mod.fails(e["verdict"]):
            out.append(f"{e['verdict']} ({r['outcome']}): not an allowed result")
        return out
    if r["outcome"] == "unsupported" and cap not in claims:
        return out
    out.append(f"{r['outcome']}: not an allowed result (capability {cap} is claimed; no expectation)")
    return out
