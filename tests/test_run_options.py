"""`mlconf run` options: --jobs, --strict, --fail-fast, --timeout, --report, progress, an empty
selection (issue 7 item 3)."""

from __future__ import annotations

import io
import json

import pytest

from mlconf import backends, cases, cli, forked, reports, runner
from mlconf.backends import get
from mlconf.backends.reference import ReferenceBackend

# every area, ~300 cases
MIXED = (
    "flags or magic or q8_0 or gemma3 or gpt2/added or i2s_pack or qwen3_i2s/0 or embed/refused"
    " or llama and not tokenizer/decode/llama and not duplicate_merges"
)


class Wrong(ReferenceBackend):
    """The reference with Q8_0 quant 5 flipped."""

    name = "wrong-q8"

    def quantize_q8_0(self, x, f16):
        q, d = super().quantize_q8_0(x, f16)
        q = q.copy()
        q.reshape(-1)[5] ^= 1
        return q, d


@pytest.fixture
def wrong_registered():
    backends.register("wrong-q8", lambda name: Wrong(), builtin=False)
    yield "wrong-q8"
    backends.unregister("wrong-q8")


def run_cli(tmp_path, *args, name="out"):
    rc = cli.main(["run", *args, "--report", str(tmp_path / name)])
    doc = json.loads((tmp_path / name / "results.json").read_text(encoding="utf-8"))
    return rc, doc


def test_mixed_selection_covers_every_area():
    sel = cases.collect(None, MIXED)
    assert {c.area for c in sel} == set(cases.AREAS) and 250 <= len(sel) <= 450


def test_jobs_2_gives_the_serial_records(tmp_path, capsys):
    builtin = ("-b", "reference", "-b", "native", "-b", "bitnet")  # other tests may register more
    rc1, serial = run_cli(tmp_path, *builtin, "-k", MIXED, name="serial")
    rc2, par = run_cli(tmp_path, *builtin, "-k", MIXED, "--jobs", "2", name="par")
    assert rc1 == rc2 == 0
    assert len(serial["records"]) >= 250
    assert {r["backend"] for r in serial["records"]} == {"reference", "native", "bitnet"}
    assert par["records"] == serial["records"]
    assert par["matrix"] == serial["matrix"] and par["summary"] == serial["summary"]
    assert (serial["run"]["jobs"], par["run"]["jobs"]) == (1, 2)
    assert any(m["compared"] and m["identical"] == m["compared"] for m in par["matrix"])


def test_runner_jobs_keeps_outputs_and_order():
    sel = cases.collect(["quant", "bitnet"], "q8_0/ or i2s_pack/golden")
    bs = [ReferenceBackend(), Wrong()]
    a = runner.run(sel, bs)
    b = runner.run(sel, [ReferenceBackend(), Wrong()], jobs=3)
    assert [(r.backend, r.case, r.outcome, r.detail) for r in a] == [
        (r.backend, r.case, r.outcome, r.detail) for r in b
    ]
    assert any(r.outcome == "fail" for r in b)
    assert all((x.output is None) == (y.output is None) for x, y in zip(a, b, strict=True))


def test_strict_turns_unsupported_into_failures(tmp_path, capsys):
    args = ("-b", "native", "--area", "bitnet", "-k", "i2s_pack/golden")
    rc, doc = run_cli(tmp_path, *args, name="lax")
    assert rc == 0 and doc["records"] and all(r["outcome"] == "unsupported" for r in doc["records"])
    rc, doc = run_cli(tmp_path, *args, "--strict", name="strict")
    assert rc == 1 and doc["run"]["strict"] is True
    out = capsys.readouterr()
    assert f"{len(doc['records'])} failed, errored, crashed, timed out or were unsupported" in out.out
    assert "UNSUPPORTED native bitnet/i2s_pack/golden" in out.err
    md = (tmp_path / "strict" / "summary.md").read_text(encoding="utf-8")
    assert "--strict" in md and md.count("| unsupported |") == len(doc["records"])
    junit = (tmp_path / "strict" / "junit.xml").read_text(encoding="utf-8")
    assert f'failures="{len(doc["records"])}"' in junit


def test_fail_fast_stops_at_the_first_failure(tmp_path, wrong_registered, capsys):
    args = ("-b", wrong_registered, "--area", "quant", "-k", "q8_0/ and not refused")
    rc, full = run_cli(tmp_path, *args, name="full")
    fails = [i for i, r in enumerate(full["records"]) if r["outcome"] == "fail"]
    assert rc == 1 and len(fails) >= 2
    rc, doc = run_cli(tmp_path, *args, "--fail-fast", name="ff")
    assert rc == 1
    # serial order is the suite's case order: the run stops right after the first failing case
    order = [c.id for c in cases.collect(["quant"], "q8_0/ and not refused")]
    first = min(order.index(full["records"][i]["case"]) for i in fails)
    assert sorted(r["case"] for r in doc["records"]) == sorted(order[: first + 1])
    assert sum(r["outcome"] == "fail" for r in doc["records"]) == 1
    assert "stopped at the first failure" in capsys.readouterr().out
    assert (tmp_path / "ff" / "summary.md").exists() and (tmp_path / "ff" / "junit.xml").exists()
    rc, doc = run_cli(tmp_path, *args, "--fail-fast", "--jobs", "2", name="ff2")
    assert rc == 1 and 1 <= sum(r["outcome"] == "fail" for r in doc["records"]) <= len(fails)


def test_timeout_sets_the_worker_timeout(tmp_path, monkeypatch, capsys):
    seen = {}
    real = runner.run

    def spy(cases_, backends_, **kw):
        seen.update({b.name: getattr(b, "timeout", None) for b in backends_})
        return real(cases_, backends_, **kw)

    monkeypatch.setattr(runner, "run", spy)
    rc, _ = run_cli(
        tmp_path, "-b", "native", "-b", "bitnet", "-b", "reference", "-k", "flags_zero", "--timeout", "7.5"
    )
    assert rc == 0
    assert seen == {"native": 7.5, "bitnet": 7.5, "reference": None}  # reference: in-process, none
    assert cli.main(["run", "-k", "flags_zero", "--timeout", "0", "--report", str(tmp_path / "x")]) == 4
    assert "--timeout" in capsys.readouterr().err


def test_forked_children_get_their_own_worker_with_the_timeout():
    b = get("native")
    b.timeout = 3.25
    fresh = forked._fresh(b)
    try:
        assert fresh is not b and fresh.timeout == 3.25 and type(fresh) is type(b)
    finally:
        fresh.close()
    w = Wrong()
    assert forked._fresh(w) is w  # not registered: the forked copy (in-process)


def test_require_gates_only_the_named_capabilities(tmp_path, capsys):
    """--require fails the unsupported cases of the named capabilities only, and results.json says
    what each backend was gated on (and which of those it lacks)."""
    args = ("-b", "native", "-k", "i2s_pack/golden or flags_zero")
    rc, doc = run_cli(tmp_path, *args, "--require", "load,quantize_q8_0", name="claimed")
    assert rc == 0 and {r["outcome"] for r in doc["records"]} == {"pass", "unsupported"}
    assert doc["run"]["required"] == ["load", "quantize_q8_0"] and doc["run"]["strict"] is False
    assert doc["run"]["backends"][0]["gated_missing"] == []
    rc, doc = run_cli(tmp_path, *args, "--require", "load", "--require", "i2s", name="i2s")
    assert rc == 1 and doc["run"]["backends"][0]["gated_missing"] == ["i2s"]
    fails = reports.failures(doc)
    assert fails and {r["capability"] for r in fails} == {"i2s"}
    assert "--require i2s,load" in (tmp_path / "i2s" / "summary.md").read_text(encoding="utf-8")
    capsys.readouterr()
    assert cli.main(["run", *args, "--require", "gpu", "--report", str(tmp_path / "x")]) == 4
    assert "--require gpu: not a capability" in capsys.readouterr().err


def test_exit_statuses(tmp_path, capsys, monkeypatch):
    """One meaning each (mlconf.tools.exits, README "Exit statuses"): 0 pass, 1 a failing case, 2
    a rejected file, 4 a usage or input error, 5 nothing selected, 130 Ctrl-C (one line)."""
    from mlconf.tools import exits

    assert (exits.OK, exits.FAILED, exits.REJECTED, exits.USAGE, exits.NOTHING, exits.INTERRUPTED) == (
        0,
        1,
        2,
        4,
        5,
        130,
    )
    assert run_cli(tmp_path, "-b", "reference", "-k", "flags_zero", name="ok")[0] == 0
    assert run_cli(tmp_path, "-b", "native", "-k", "i2s_pack/golden", "--strict", name="f")[0] == 1
    bad = tmp_path / "bad.mlb"
    bad.write_bytes(b"MLB1" + bytes(60))
    assert cli.main(["load", str(bad)]) == 2
    assert cli.main(["run", "--no-such-flag"]) == 4
    assert cli.main(["report", str(tmp_path / "missing.json")]) == 4
    assert cli.main(["run", "-k", "no-such-case", "--report", str(tmp_path / "n")]) == 5
    capsys.readouterr()

    def died(*args, **kwargs):
        raise RuntimeError("runner process 2 died")

    monkeypatch.setattr(runner, "run", died)
    assert cli.main(["run", "-k", "flags_zero", "--report", str(tmp_path / "d")]) == 1
    assert "runner process 2 died" in capsys.readouterr().err

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_backends", interrupted)
    assert cli.main(["backends"]) == 130
    assert capsys.readouterr().err == "mlconf: interrupted\n"


def test_no_selected_case_is_an_error(tmp_path, capsys):
    assert cli.main(["run", "-k", "no-such-case", "--report", str(tmp_path / "r")]) == 5
    assert "no case matches" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    assert cli.main(["run", "-k", "flags_zero", "--jobs", "0", "--report", str(tmp_path / "r")]) == 4


def test_progress_lines_and_in_place_updates():
    class Res:
        def __init__(self, outcome):
            self.outcome, self.backend, self.case, self.detail = outcome, "b", "area/x", "why"
            self.capability, self.claims = "load", ()

    out = io.StringIO()
    p = cli.Progress(20, stream=out)
    for i in range(20):
        p(Res("fail" if i == 4 else "unsupported"))
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[2/20] 0 failing so far" and lines[-1] == "[20/20] 1 failing so far"
    assert "FAIL b area/x: why" in lines and len(lines) == 11

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    p = cli.Progress(3, True, stream=out)
    for o in ("pass", "unsupported", "pass"):
        p(Res(o))
    p.close()
    text = out.getvalue()
    assert "\r[1/3] 0 failing so far" in text and "UNSUPPORTED b area/x: why\n" in text
    assert text.endswith("\r[3/3] 1 failing so far\n")


def test_shards_together_equal_the_unsharded_run(tmp_path, capsys):
    """--shard 1/3..3/3 split the cases (each in one shard, by its id alone) and `mlconf report`
    merges their results.json into the unsharded run's records, matrix and summary."""
    args = (
        "-b",
        "reference",
        "-b",
        "native",
        "--area",
        "quant",
        "--area",
        "loader",
        "-k",
        "q4_0 or q8_0 or flags",
    )
    _, whole = run_cli(tmp_path, *args, name="whole")
    parts = [run_cli(tmp_path, *args, "--shard", f"{k}/3", name=f"s{k}")[1] for k in (1, 2, 3)]
    assert all(p["records"] for p in parts)
    assert [p["run"]["shards"] for p in parts] == [["1/3"], ["2/3"], ["3/3"]]
    ids = [{r["case"] for r in p["records"]} for p in parts]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    files = [str(tmp_path / f"s{k}" / "results.json") for k in (1, 2, 3)]
    assert cli.main(["report", *files, "--report", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "results.json").read_text(encoding="utf-8"))
    for key in ("records", "matrix", "summary"):
        assert merged[key] == whole[key], key
    assert merged["run"]["shards"] == ["1/3", "2/3", "3/3"]
    # a case's shard does not depend on what else is selected
    sel = cases.collect(["quant"])
    assert {c.id for c in cases.shard(sel[5:], 2, 3)} == {c.id for c in cases.shard(sel, 2, 3)} - {
        c.id for c in sel[:5]
    }
    capsys.readouterr()
    assert cli.main(["report", files[0], files[0], "--report", str(tmp_path / "dup")]) == 4
    assert "is also in" in capsys.readouterr().err
    assert cli.main(["run", "--shard", "4/3", "--report", str(tmp_path / "x")]) == 4
