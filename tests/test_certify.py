"""Must-pass lists, expectations files, certification packages and their verification (issue 37).

The certification tests use a small must-pass list (the header cases and two loader rules, put in
place of specs/mustpass/current.txt) so that each package takes seconds: the runtimes are the
native library and tests/data/cmd_one_mistake.py (the reference with one loader rule unchecked:
its format.magic cases fail). Every tamper test edits a real package as a forger would, with the
certificate's file hashes brought up to date, so the check that catches it is the one named.
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mlconf import certify, cli, expectations, mustpass, reports
from mlconf.backends import native

ROOT = Path(__file__).resolve().parent.parent
ONE_MISTAKE = "cmd:" + shlex.join(
    [sys.executable, str(ROOT / "tests" / "data" / "cmd_one_mistake.py"), "rule", "format.magic"]
)
SMALL = ("header/", "loader/format.magic/", "loader/format.version/")
needs_native = pytest.mark.skipif(not native.LIBRARY.exists(), reason="the native library is not built")


# ---------------------------------------------------------------- must-pass lists
@pytest.mark.parametrize("version", mustpass.versions())
def test_mustpass_list_is_in_step_with_the_suite(version):
    """A released list: none of its cases gone or changed; the current one: the suite exactly
    (regenerated and compared). A failure names each case; `mlconf mustpass --write` rewrites the
    current list after a reviewed change."""
    assert mustpass.drift(version) == []


def test_the_lists_are_the_released_versions_and_current():
    assert mustpass.versions() == sorted([*mustpass.RELEASED, mustpass.CURRENT])
    for v in mustpass.versions():
        rows, _ = mustpass.load(v)
        assert len(rows) > 1000 and {cap for cap, _, _ in rows} >= {"load", "forward", "encode", "embed"}


def test_fingerprint_follows_the_meaning():
    from mlconf import cases

    c = next(
        c
        for c in cases.collect()
        if c.id.startswith("forward/") and c.compare == "toleranced" and c.expected is not None
    )
    assert mustpass.fingerprint(c) == mustpass.fingerprint(replace(c, spec="reworded"))
    changed = [
        replace(c, expected=np.asarray(c.expected) + np.float32(1)),
        replace(c, params={**c.params, "tokens": np.asarray(c.params["tokens"])[:-1]}),
        replace(c, params={**c.params, "tolerance": "other"}),
        replace(c, compare="bit-exact"),
    ]
    assert len({mustpass.fingerprint(x) for x in changed} | {mustpass.fingerprint(c)}) == 5


def test_released_list_drift_names_the_case(monkeypatch):
    rows = mustpass.generate("0.9.0")
    gone, changed = rows[0][1], rows[1][1]
    now = [r for r in rows if r[1] != gone]
    now = [(cap, cid, "0" * 16 if cid == changed else fp) for cap, cid, fp in now]
    monkeypatch.setattr(mustpass, "generate", lambda v: now + [("load", "header/brand_new", "1" * 16)])
    got = mustpass.drift("0.9.0")
    assert got == [f"{gone}: in the 0.9.0 list, no longer in the suite", got[1]] and changed in got[1]
    assert "changed meaning" in got[1]  # a new case does not join a released list: not reported


def test_mustpass_parse_errors_name_the_line():
    with pytest.raises(mustpass.MustPassError, match=r"x.txt:2: expected"):
        mustpass.parse("# head\nload header/a 12\n", "x.txt")
    with pytest.raises(mustpass.MustPassError, match="listed twice"):
        mustpass.parse("load a 0123456789abcdef\nload a 0123456789abcdef\n", "x.txt")


# ---------------------------------------------------------------- expectations
@pytest.mark.parametrize(
    "entry, message",
    [
        ({"cases": "a", "expect": "fail"}, "'reason' is a required property"),
        ({"cases": "a", "expect": "flaky", "reason": "a good reason"}, "'reruns' is a required property"),
        ({"cases": "a", "expect": "fail", "reruns": 2, "reason": "a good reason"}, "should not be valid"),
        ({"cases": "a", "expect": "pass", "reason": "a good reason"}, "is not one of"),
        ({"cases": "a", "expect": "fail", "reason": "short"}, "is too short"),
    ],
)
def test_expectations_file_refusals_name_the_file_and_entry(tmp_path, entry, message):
    p = tmp_path / "exp.yaml"
    p.write_text(json.dumps({"expectations": [entry]}))
    with pytest.raises(expectations.ExpectationsError, match=message) as e:
        expectations.load(p)
    assert str(p) in str(e.value) and "expectations/0" in str(e.value)


def test_verdicts():
    fail, flaky = {"expect": "fail"}, {"expect": "flaky", "reruns": 2}
    assert expectations.verdict(fail, "fail", []) == "expected fail"
    assert expectations.verdict(fail, "pass", []) == "unexpected pass"
    assert expectations.verdict(fail, "crash", []) == "unexpected crash"
    assert expectations.verdict(flaky, "pass", []) is None
    assert expectations.verdict(flaky, "fail", ["fail", "pass"]) == "flaky pass"
    assert expectations.verdict(flaky, "fail", ["fail", "fail"]) == "flaky fail"
    assert [
        expectations.fails(v) for v in ("expected fail", "flaky pass", "unexpected pass", "flaky fail")
    ] == [
        False,
        False,
        True,
        True,
    ]
    entries = [
        {"cases": "loader/*", "backend": "native", "expect": "fail"},
        {"cases": "loader/a", "expect": "crash"},
    ]
    assert expectations.entry_for(entries, "loader/a", "native") == 0  # the first match
    assert expectations.entry_for(entries, "loader/a", "other") == 1
    assert expectations.entry_for(entries, "header/a", "native") is None


def _expect_file(tmp_path, *entries) -> Path:
    p = tmp_path / "expect.yaml"
    p.write_text(json.dumps({"expectations": list(entries)}))
    return p


MAGIC_FAILS = {
    "cases": "loader/format.magic/*",
    "expect": "fail",
    "reason": "this runtime does not check the magic",
}


def test_run_expect_turns_known_failures_into_expected_ones(tmp_path, capsys):
    k = "loader/format.magic or header/q8_min"
    base = ["run", "-b", ONE_MISTAKE, "-k", k, "--report", str(tmp_path / "r")]
    assert cli.main(base) == 1  # the mistake fails its cases
    assert cli.main([*base, "--expect", str(_expect_file(tmp_path, MAGIC_FAILS))]) == 0
    doc = reports.load(tmp_path / "r" / "results.json")
    got = {r["case"]: (r["outcome"], (r.get("expectation") or {}).get("verdict")) for r in doc["records"]}
    assert got["header/q8_min"] == ("pass", None)
    magic = [v for c, v in got.items() if c.startswith("loader/format.magic/")]
    assert magic and set(magic) == {("fail", "expected fail")}
    junit = (tmp_path / "r" / "junit.xml").read_text()
    assert "expected fail: this runtime does not check the magic" in junit
    # a case expected to fail that passes fails the run until the file is updated
    wrong = {"cases": "header/q8_min", "expect": "fail", "reason": "expected to fail, wrongly"}
    capsys.readouterr()
    assert cli.main([*base, "--expect", str(_expect_file(tmp_path, MAGIC_FAILS, wrong))]) == 1
    out = capsys.readouterr().out  # the verdict named, with the case and its entry
    assert "1 unexpected pass against " in out and "header/q8_min (entry 1)" in out
    doc = reports.load(tmp_path / "r" / "results.json")
    assert [r["expectation"]["verdict"] for r in doc["records"] if r["case"] == "header/q8_min"] == [
        "unexpected pass"
    ]


def test_flaky_reruns_are_recorded(tmp_path):
    flaky = {
        "cases": "loader/format.magic/gguf",
        "expect": "flaky",
        "reruns": 2,
        "reason": "said to be flaky here",
    }
    base = ["run", "-b", ONE_MISTAKE, "-k", "loader/format.magic/gguf", "--report", str(tmp_path / "r")]
    assert cli.main([*base, "--expect", str(_expect_file(tmp_path, flaky))]) == 1  # it fails every time
    (r,) = reports.load(tmp_path / "r" / "results.json")["records"]
    assert r["expectation"]["verdict"] == "flaky fail" and r["expectation"]["reruns"] == ["fail", "fail"]


def test_unused_entries_are_reported(tmp_path, capsys):
    typo = {"cases": "loader/no.such.rule/*", "expect": "fail", "reason": "a typo in the pattern"}
    cli.main(
        [
            "run",
            "-b",
            "reference",
            "-k",
            "header/q8_min",
            "--report",
            str(tmp_path / "r"),
            "--expect",
            str(_expect_file(tmp_path, typo)),
        ]
    )
    assert "entry 0 (loader/no.such.rule/*) matched no case" in capsys.readouterr().err
    assert reports.load(tmp_path / "r" / "results.json")["run"]["expectations"]["unused"] == [0]


# ---------------------------------------------------------------- certification
@pytest.fixture
def small_list(tmp_path, monkeypatch):
    """specs/mustpass/current.txt replaced by its header and two loader rules' cases."""
    rows = [r for r in mustpass.generate("current") if r[1].startswith(SMALL)]
    folder = tmp_path / "mustpass"
    folder.mkdir()
    (folder / "current.txt").write_text(mustpass.text("current", rows))
    monkeypatch.setattr(mustpass, "MUSTPASS_DIR", folder)
    return rows


def _certify(tmp_path, backend, *more) -> tuple[int, Path]:
    out = tmp_path / f"pkg{len(list(tmp_path.glob('pkg*')))}.tar.gz"
    code = cli.main(["certify", "-b", backend, "--version", "current", "-o", str(out), *more])
    return code, out


def _rewrite(pkg: Path, edit) -> Path:
    """The package with edit(files) applied and the certificate's hashes brought up to date."""
    files = certify.read_package(pkg)
    cert = json.loads(files.pop(certify.CERT))
    edit(files, cert)
    cert.pop("files")
    out = pkg.with_name("forged.tar.gz")
    certify.write_package(out, files, cert)
    return out


def _results(files) -> dict:
    return json.loads(files["results.json"])


def _set_results(files, doc) -> None:
    files["results.json"] = reports.dumps(doc).encode()


@needs_native
def test_certify_native_and_verify(tmp_path, small_list, capsys):
    code, pkg = _certify(tmp_path, "native")
    assert code == 0 and "certification.json SHA-256" in capsys.readouterr().out
    assert certify.verify(pkg) == []
    assert cli.main(["verify", str(pkg), "--library", str(native.LIBRARY)]) == 0
    files = certify.read_package(pkg)
    cert = json.loads(files[certify.CERT])
    assert (
        cert["backend"] == "native"
        and cert["version"] == "current"
        and cert["mustpass"]["cases"] == len(small_list)
    )
    assert cert["library"][0]["sha256"] == hashlib.sha256(native.LIBRARY.read_bytes()).hexdigest()
    assert cert["library"][0]["symbols"] is None or "ml_load" in cert["library"][0]["symbols"]
    assert set(files) == {
        certify.CERT,
        "results.json",
        "junit.xml",
        "summary.md",
        "report.html",
        "mustpass.txt",
    }
    assert {r["case"] for r in _results(files)["records"]} == {cid for _, cid, _ in small_list}

    # tampering: each edit, hashes brought up to date, fails verify with its reason
    def flip(files, cert):
        doc = _results(files)
        doc["records"][0]["outcome"] = "fail"
        _set_results(files, doc)

    bad = certify.verify(_rewrite(pkg, flip))
    assert any("outcome fail, but its distances" in b for b in bad), bad
    assert any("junit.xml: not the report" in b for b in bad)

    def drop(files, cert):
        doc = _results(files)
        gone = doc["records"].pop(3)
        doc["summary"] = reports.summary(doc["records"])
        _set_results(files, doc)
        files["junit.xml"] = reports.junit_xml(doc)
        drop.case = gone["case"]

    bad = certify.verify(_rewrite(pkg, drop))
    assert bad[0] == f"results.json: {drop.case}: 0 records (one required)", bad

    def swap(files, cert):
        cert["library"][0]["sha256"] = "0" * 64

    bad = certify.verify(_rewrite(pkg, swap))
    assert len(bad) == 1 and "library SHA-256" in bad[0]

    def own_list(files, cert):  # a list of the vendor's own making
        files["mustpass.txt"] = files["mustpass.txt"].replace(b"header/", b"header/x", 1)

    assert any(
        "not this mlconf's specs/mustpass/current.txt" in b for b in certify.verify(_rewrite(pkg, own_list))
    )
    other = tmp_path / "other.so"
    other.write_bytes(b"not the library")
    assert cli.main(["verify", str(pkg), "--library", str(other)]) == 1


@needs_native
def test_verify_refuses_a_changed_file_and_odd_members(tmp_path, small_list):
    _, pkg = _certify(tmp_path, "native")
    files = certify.read_package(pkg)

    def pack(members) -> Path:
        out = tmp_path / "odd.tar.gz"
        with tarfile.open(out, "w:gz") as tar:
            for info, data in members:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        return out

    def plain(name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        return info, data

    changed = dict(files, **{"summary.md": files["summary.md"] + b"\nall good\n"})
    bad = certify.verify(pack([plain(n, d) for n, d in changed.items()]))
    assert bad == ["summary.md: SHA-256 differs from certification.json's (the file was changed)"]
    extra = dict(files, **{"notes.txt": b"x"})
    assert certify.verify(pack([plain(n, d) for n, d in extra.items()])) == [
        "notes.txt: in the archive, not listed in certification.json"
    ]
    link = tarfile.TarInfo("results.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(certify.CertifyError, match="plain files only"):
        certify.verify(pack([(link, None)]))
    with pytest.raises(certify.CertifyError, match="plain files only"):
        certify.verify(pack([plain("../results.json", b"{}")]))
    (tmp_path / "junk.tar.gz").write_bytes(b"junk")
    assert cli.main(["verify", str(tmp_path / "junk.tar.gz")]) == 4


def test_certify_with_expectations(tmp_path, small_list):
    code, pkg = _certify(tmp_path, ONE_MISTAKE)
    assert code == 1
    bad = certify.verify(pkg)
    assert bad and all("loader/format.magic/" in b and "not an allowed result" in b for b in bad)
    exp = _expect_file(tmp_path, MAGIC_FAILS)
    code, pkg = _certify(tmp_path, ONE_MISTAKE, "--expect", str(exp))
    assert code == 0 and certify.verify(pkg) == []
    assert certify.read_package(pkg)["expectations.yaml"] == exp.read_bytes()

    def own_waiver(files, cert):  # a record waived by itself, not by the file
        doc = _results(files)
        r = next(r for r in doc["records"] if r["case"] == "header/q8_min")
        r["outcome"], r["expectation"] = (
            "fail",
            {"entry": 0, "expect": "fail", "reason": "made up", "verdict": "expected fail", "reruns": []},
        )
        _set_results(files, doc)

    bad = certify.verify(_rewrite(pkg, own_waiver))
    assert any("header/q8_min: its expectation" in b for b in bad), bad


def test_the_audit_catches_a_runtime_keyed_on_file_names(tmp_path, small_list, capsys):
    """It passes every case of the run (it knows the fixtures' names), and fails the audit,
    which replays a sample under fresh names in a shuffled order."""
    cheat = ONE_MISTAKE.replace("rule format.magic", "by_name")
    code, pkg = _certify(tmp_path, cheat)
    assert code == 1 and "renamed and reordered" in capsys.readouterr().err
    doc = _results(certify.read_package(pkg))
    assert {r["outcome"] for r in doc["records"]} == {"pass"}
    bad = certify.verify(pkg)
    assert bad and all("audit" in b for b in bad), bad
    assert any("loader/" in b and "pass in the run, fail renamed and reordered" in b for b in bad)


@needs_native
def test_a_forged_audit_fails_verify(tmp_path, small_list):
    _, pkg = _certify(tmp_path, "native")
    cert = json.loads(certify.read_package(pkg)[certify.CERT])
    assert (
        len(cert["audit"]["cases"]) == min(certify.AUDIT_CASES, len(small_list))
        and not cert["audit"]["mismatches"]
    )

    def thin(files, cert):
        cert["audit"]["cases"] = cert["audit"]["cases"][:3]

    assert any("audit: 3 cases" in b for b in certify.verify(_rewrite(pkg, thin)))

    def none(files, cert):
        del cert["audit"]

    assert certify.verify(_rewrite(pkg, none)) == [
        "certification.json: no audit (a certification replays a sample renamed and reordered)"
    ]


def test_certify_allows_only_its_options(tmp_path):
    assert (
        cli.main(
            [
                "certify",
                "-b",
                "native",
                "--version",
                "current",
                "-o",
                str(tmp_path / "p.tar.gz"),
                "-k",
                "header",
            ]
        )
        == 4
    )
    assert cli.main(["certify", "-b", "native", "--version", "7.7.7", "-o", str(tmp_path / "p.tar.gz")]) == 4
    assert not (tmp_path / "p.tar.gz").exists()


def test_disguise_renames_files_only(tmp_path):
    import random

    from mlconf import cases

    c = next(c for c in cases.collect(["forward"]) if c.id.endswith("/vs_reference") and "long" not in c.id)
    d = certify._disguise(c, certify._renamer(tmp_path, random.Random(7)))
    assert (
        d.id == c.id
        and d.params["model"].parent == tmp_path
        and d.params["model"].name != c.params["model"].name
    )
    assert d.params["model"].read_bytes() == c.params["model"].read_bytes()
    assert list(d.params["tokens"]) == list(c.params["tokens"])


def test_fail_fast_does_not_stop_at_an_expected_failure(tmp_path):
    base = ["run", "-b", ONE_MISTAKE, "-k", "loader/format.magic or header/q8_min", "--fail-fast"]
    assert cli.main([*base, "--report", str(tmp_path / "a")]) == 1
    assert len(reports.load(tmp_path / "a" / "results.json")["records"]) < 4  # stopped at the first
    exp = str(_expect_file(tmp_path, MAGIC_FAILS))
    assert cli.main([*base, "--report", str(tmp_path / "b"), "--expect", exp]) == 0
    assert len(reports.load(tmp_path / "b" / "results.json")["records"]) == 4
