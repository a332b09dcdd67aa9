"""Plug-in backends: the ``cmd:`` backend (line-based JSON protocol, mlconf.backends.cmd) and the
entry-point group ``mlconf.backends``, with the examples of examples/ (issue 7 item 4)."""

from __future__ import annotations

import base64
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from mlconf import backends, cases, runner
from mlconf.backends import (
    BackendError,
    InputError,
    NumericError,
    Unsupported,
    WorkerCrash,
    child,
    entry_points,
)
from mlconf.backends.cmd import pack, unpack

ROOT = Path(__file__).resolve().parents[1]
Q8_RUNTIME = ROOT / "examples" / "cmd_runtime" / "q8_runtime.py"
PLUGIN_SRC = ROOT / "examples" / "plugin_backend"
MISBEHAVE = ROOT / "tests" / "data" / "cmd_misbehave.py"
PY = shlex.quote(sys.executable)
MLCONF = [sys.executable, "-c", "import sys; from mlconf.cli import main; sys.exit(main())"]

# the --wrong runtime rounds with ties to even: exactly these cases have a tie after the multiply,
# and so does every matrix assembled from one of their blocks (cases.py _assembled_cases)
WRONG_BLOCKS = {
    "quant/q8_0/ties_after_the_multiply",
    "quant/q8_0/half_minus_ulp_rounds_up_subnormals_minus_zero",
    "quant/q8_0_f16/scale_ties_to_even",
    "quant/q8_0_f16/subnormal_scale_needs_clamp",
}


def _blocks(case) -> set[str]:
    """The edge cases a matrix case is assembled from (its spec: "... assembled by rows: a, b; c")."""
    return set(case.spec.split("assembled by rows: ", 1)[-1].replace("; ", ", ").split(", "))


WRONG_FAILS = WRONG_BLOCKS | {
    c.id
    for c in cases.collect(("quant",))
    if "/matrix/" in c.id
    and any(
        c.id.startswith(b.rsplit("/", 1)[0] + "/matrix/") and b.rsplit("/", 1)[1] in _blocks(c)
        for b in WRONG_BLOCKS
    )
}


def cmd_name(script: Path, *args: str) -> str:
    return "cmd:" + shlex.join([sys.executable, str(script), *args])


@pytest.fixture(scope="module")
def quant_cases():
    return cases.collect(["quant"])


def run_quant(backend, quant_cases) -> dict[str, runner.Result]:
    return {r.case: r for r in runner.run(quant_cases, [backend])}


def is_q8(case_id: str) -> bool:
    return case_id.startswith("quant/q8_0")


# ---------------------------------------------------------------- protocol helpers
def test_pack_unpack_round_trip():
    a = np.array([[1.5, -0.0, np.inf]], dtype=np.float32)
    b = unpack({"v": pack(a, "<f4")}, "v", "<f4", (1, 3), "t")
    assert b.tobytes() == a.tobytes() and b.shape == (1, 3)
    h = np.array([1.0, 65504.0], dtype=np.float16).view(np.uint16)
    assert unpack({"v": pack(h, "<u2")}, "v", "<u2", (2,), "t").view(np.float16).tolist() == [1.0, 65504.0]
    with pytest.raises(BackendError, match=r"'v' has 3 float32 values .* expected 4"):
        unpack({"v": pack(np.zeros(3, np.float32), "<f4")}, "v", "<f4", (4,), "t")
    with pytest.raises(BackendError, match="not base64"):
        unpack({"v": "!!"}, "v", "u1", None, "t")
    with pytest.raises(BackendError, match="must be a base64 string"):
        unpack({}, "v", "u1", None, "t")


def test_bad_names():
    with pytest.raises(BackendError, match="give the program"):
        backends.get("cmd:")
    with pytest.raises(BackendError, match="not found on PATH"):
        backends.get("cmd:no-such-program-mlconf --x")
    with pytest.raises(BackendError, match="is not a file"):
        backends.get("cmd:./no/such/runtime")
    with pytest.raises(BackendError, match="cannot split"):
        backends.get("cmd:python 'unterminated")


def test_program_that_dies_at_hello(tmp_path):
    p = tmp_path / "dies.py"
    p.write_text("import sys\nsys.stderr.write('no GPU here\\n')\nsys.exit(4)\n", encoding="utf-8")
    with pytest.raises(WorkerCrash, match=r"exited with status 4 during hello.*no GPU here"):
        backends.get(cmd_name(p))


# ---------------------------------------------------------------- the example cmd: runtime
def test_example_runtime_passes_q8_0(quant_cases):
    b = backends.get(cmd_name(Q8_RUNTIME))
    try:
        assert b.capabilities == {"quantize_q8_0"}
        assert "q8_runtime" in b.description
        res = run_quant(b, quant_cases)
    finally:
        b.close()
    q8 = {k: r for k, r in res.items() if is_q8(k)}
    assert len(q8) >= 20 and {r.outcome for r in q8.values()} == {"pass"}, [
        (k, r.outcome, r.detail) for k, r in q8.items() if r.outcome != "pass"
    ]
    other = [r for k, r in res.items() if not is_q8(k)]
    assert other and {r.outcome for r in other} == {"unsupported"}
    assert all("does not declare quantize_q4_0" in r.detail for r in other)
    refused = [r for k, r in q8.items() if "/refused/" in k]
    assert len(refused) == 5 and all(r.got == "refused" for r in refused)


def test_example_runtime_matches_the_reference_on_random_rows():
    """Beyond the hand-derived edge cases: seeded random (8, 256) inputs of several magnitudes,
    f32 and f16 scales, bit for bit against the reference backend (shapes and dtypes too)."""
    ref = backends.get("reference")
    b = backends.get(cmd_name(Q8_RUNTIME))
    rng = np.random.default_rng(7)
    try:
        for f16 in (False, True):
            for scale in (1e-6, 1e-3, 1.0, 1e3, 1e5):
                x = (rng.standard_normal((8, 256)) * scale).astype(np.float32)
                x[:, ::7] = np.round(x[:, ::7])  # some exact ties
                (rq, rd), (q, d) = ref.quantize_q8_0(x, f16), b.quantize_q8_0(x, f16)
                assert (q.dtype, q.shape, d.dtype, d.shape) == (rq.dtype, rq.shape, rd.dtype, rd.shape)
                assert q.tobytes() == rq.tobytes() and d.tobytes() == rd.tobytes(), (f16, scale)
    finally:
        b.close()


def test_example_runtime_wrong_is_caught(quant_cases):
    b = backends.get(cmd_name(Q8_RUNTIME, "--wrong"))
    try:
        res = run_quant(b, quant_cases)
    finally:
        b.close()
    failed = {k for k, r in res.items() if r.outcome == "fail"}
    assert failed == WRONG_FAILS
    assert all(r.outcome == "pass" for k, r in res.items() if is_q8(k) and k not in WRONG_FAILS)
    # 5 * 0.5 = 2.5 -> spec 3, ties to even 2; the first tie is element 2: 253 * 0.5 = 126.5 -> 127
    d = res["quant/q8_0/ties_after_the_multiply"].detail
    assert "quants" in d and re.search(r"first at\D{0,30}\b2\b", d), d
    assert "(block 0, element 2)" in d, d
    assert re.search(r"got\D{0,12}7e\b.*expected\D{0,12}7f\b", d), d
    d = res["quant/q8_0_f16/subnormal_scale_needs_clamp"].detail
    assert re.search(r"first at\D{0,30}\b6\b", d), d
    assert re.search(r"got\D{0,12}00\b.*expected\D{0,12}01\b", d), d
    assert "scales" not in d  # the scale is right; only the rounding of the quants is wrong


def test_example_runtime_through_the_cli(tmp_path):
    """`mlconf run -b "cmd:python examples/cmd_runtime/q8_runtime.py" --area quant` as a runtime
    author types it (from the repository root), the --wrong variant fails with exit status 1."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    rel = Q8_RUNTIME.relative_to(ROOT)
    args = ["run", "--area", "quant", "--report", str(tmp_path / "reports")]
    r = subprocess.run(
        MLCONF + args + ["-b", f"cmd:python {rel}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        encoding="utf-8",
        timeout=120,
    )
    if r.returncode and "--report" in r.stderr and "unrecognized" in r.stderr:  # before reports exist
        args = args[:3]
        r = subprocess.run(
            MLCONF + args + ["-b", f"cmd:python {rel}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            encoding="utf-8",
            timeout=120,
        )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"cmd:python {rel}" in r.stdout
    w = subprocess.run(
        MLCONF + args + ["-b", f"cmd:python {rel} --wrong"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        encoding="utf-8",
        timeout=120,
    )
    assert w.returncode == 1, w.stdout + w.stderr
    assert "ties_after_the_multiply" in w.stdout + w.stderr


# ---------------------------------------------------------------- isolation
def q8_case(first: float) -> cases.Case:
    x = np.zeros(32, dtype=np.float32)
    x[0] = first
    return cases.Case(
        f"quant/q8_0/misbehave_{first:g}",
        "quant",
        "quantize_q8_0",
        "test",
        "bit-exact",
        {"f16": False, "x": x},
        (bytes(32), bytes(4)),
    )


@pytest.fixture
def misbehave():
    b = backends.get(cmd_name(MISBEHAVE))
    yield b
    b.close()


def test_unknown_capability_names_are_ignored(misbehave):
    assert misbehave.capabilities == {"quantize_q8_0", "forward"}
    assert misbehave.unknown_capabilities == ["no_such_capability"]
    assert "no_such_capability" in misbehave.unsupported["load"]


def test_crash_names_the_exit_status_and_quotes_stderr(misbehave, tmp_path, monkeypatch):
    monkeypatch.setattr(child, "EXIT_WAIT", 0.3)
    work = runner.Workdir(tmp_path)
    r = runner.run_case(q8_case(1.0), misbehave, work)
    assert r.outcome == "crash"
    assert "exited with status 3 during quantize_q8_0(float32[32], f16=False)" in r.detail
    assert "about to die" in r.detail
    assert runner.run_case(q8_case(0.5), misbehave, work).outcome == "pass"  # started again
    assert misbehave.epoch == 2
    r = runner.run_case(q8_case(2.0), misbehave, work)
    assert r.outcome == "crash" and "killed by SIGSEGV" in r.detail, r.detail
    r = runner.run_case(q8_case(6.0), misbehave, work)  # closes stdout, lives on: killed, a crash
    assert r.outcome == "crash" and "closed its stdout" in r.detail and "killed" in r.detail, r.detail
    assert runner.run_case(q8_case(0.5), misbehave, work).outcome == "pass"


def test_hang_times_out_and_the_next_call_restarts(misbehave, tmp_path):
    work = runner.Workdir(tmp_path)
    misbehave.timeout = 0.5
    t0 = time.monotonic()
    r = runner.run_case(q8_case(3.0), misbehave, work)
    assert time.monotonic() - t0 < 5
    assert r.outcome == "timeout"
    assert "no reply within 0.5 s during quantize_q8_0" in r.detail and "killed" in r.detail
    misbehave.timeout = 60  # a legit call on a loaded machine may take longer than 0.5 s
    assert runner.run_case(q8_case(0.5), misbehave, work).outcome == "pass"
    assert misbehave.epoch == 2


def test_timeout_from_the_environment(monkeypatch):
    monkeypatch.setenv("MLCONF_WORKER_TIMEOUT", "7.5")
    b = backends.get(cmd_name(MISBEHAVE))
    try:
        assert b.timeout == 7.5
    finally:
        b.close()


def test_malformed_reply_is_an_error_quoting_it(misbehave, tmp_path):
    work = runner.Workdir(tmp_path)
    r = runner.run_case(q8_case(4.0), misbehave, work)
    assert r.outcome == "error"
    assert "malformed reply during quantize_q8_0" in r.detail and "this is not json {" in r.detail
    r = runner.run_case(q8_case(5.0), misbehave, work)
    assert r.outcome == "error" and "id 8, expected 1" in r.detail, r.detail
    assert runner.run_case(q8_case(0.5), misbehave, work).outcome == "pass"


def test_unknown_op_is_unsupported(misbehave, tmp_path):
    work = runner.Workdir(tmp_path)
    case = cases.Case(
        "forward/x/prefill",
        "forward",
        "forward",
        "test",
        "toleranced",
        {
            "model": tmp_path / "m.mlb",
            "tokens": np.array([1, 2]),
            "mode": "prefill",
            "tolerance": "logits_runtime_vs_oracle",
        },
        np.zeros((2, 4), np.float32),
    )
    r = runner.run_case(case, misbehave, work)
    assert r.outcome == "unsupported" and "unknown op open_model" in r.detail, r.detail
    with pytest.raises(Unsupported, match="unknown op frobnicate"):
        misbehave.request("frobnicate()", "frobnicate")
    with pytest.raises(Unsupported, match="does not declare load"):
        misbehave.load("x.mlb")


def test_error_kinds_map_to_exceptions(tmp_path):
    p = tmp_path / "kinds.py"
    p.write_text(
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    r = json.loads(line)\n"
        "    if r['op'] == 'hello':\n"
        "        out = {'ok': True, 'capabilities': ['load', 'quantize_q8_0', 'encode']}\n"
        "    elif r['op'] == 'load':\n"
        "        out = {'ok': False, 'error': {'kind': r['path'], 'message': 'because'}}\n"
        "    elif r['op'] == 'open_tokenizer':\n"
        "        out = {'ok': True, 'handle': 'tok1'}\n"
        "    elif r['op'] == 'encode':\n"
        "        out = {'ok': True, 'ids': [len(r['text']), len(r['utf8'])]}\n"
        "    else:\n"
        "        out = {'ok': False, 'error': {'kind': 'input', 'message': 'non-finite'}}\n"
        "    print(json.dumps({'id': r['id'], **out}), flush=True)\n",
        encoding="utf-8",
    )
    b = backends.get(cmd_name(p))
    try:
        with pytest.raises(InputError, match="because"):
            b.load("input")
        with pytest.raises(Unsupported, match="because"):
            b.load("unsupported")
        with pytest.raises(BackendError, match="because .internal error"):
            b.load("internal")
        with pytest.raises(BackendError, match="malformed error reply"):
            b.load("weird")
        with pytest.raises(NumericError, match="because"):  # decision forward.nonfinite
            b.load("nonfinite")
        with pytest.raises(ValueError, match="non-finite") as e:
            b.quantize_q8_0(np.zeros(32, np.float32), False)
        assert not isinstance(e.value, InputError)
        t = b.open_tokenizer("t.mlt")
        assert t.encode("h\u00e9") == [2, 4]  # base64 of 3 UTF-8 bytes is 4 characters
    finally:
        b.close()


# ---------------------------------------------------------------- entry points
@pytest.fixture
def plugin_path(monkeypatch):
    """Put a folder on sys.path for the entry points it holds; the registry reads them afresh."""
    added = []

    def add(folder: Path) -> None:
        monkeypatch.syspath_prepend(str(folder))
        importlib.invalidate_caches()
        added.append(folder)
        entry_points.reset()

    yield add
    entry_points.reset()
    for m in ("mlconf_example_q8", "mlconf_raising_plugin"):
        sys.modules.pop(m, None)


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory) -> Path:
    """examples/plugin_backend installed with pip into a folder (not the venv): its dist-info with
    entry_points.txt makes importlib.metadata see the plug-in when the folder is on sys.path. The
    source is copied first: pip's in-tree build would leave build/ and *.egg-info in examples/."""
    tmp = tmp_path_factory.mktemp("plugin")
    src = tmp / "src"
    shutil.copytree(PLUGIN_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp / "site"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--no-compile",
            "-q",
            "--target",
            str(target),
            str(src),
        ],
        capture_output=True,
        encoding="utf-8",
        timeout=120,
    )
    if r.returncode:
        pytest.skip(f"pip cannot build examples/plugin_backend offline: {r.stderr.strip()[-300:]}")
    assert list(target.glob("mlconf_example_q8-*.dist-info/entry_points.txt"))
    return target


def test_entry_point_plugin_passes_q8_0(installed_example, plugin_path, quant_cases):
    plugin_path(installed_example)
    info = {p.name: p for p in backends.plugins()}
    assert info["example-q8"].error == "" and "mlconf_example_q8:factory" in info["example-q8"].value
    assert "mlconf-example-q8 0.1.0" in info["example-q8"].dist.replace("_", "-")
    assert "example-q8" not in backends.builtin_names()  # plug-ins run only when named
    b = backends.get("example-q8")
    assert b.name == "example-q8" and b.capabilities == {"quantize_q8_0"}
    res = run_quant(b, quant_cases)
    q8 = [r for k, r in res.items() if is_q8(k)]
    assert len(q8) >= 20 and {r.outcome for r in q8} == {"pass"}, [(r.case, r.detail) for r in q8]
    assert {r.outcome for k, r in res.items() if not is_q8(k)} == {"unsupported"}


def test_entry_point_plugin_through_the_cli(installed_example, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(installed_example), os.environ.get("PYTHONPATH", "")]),
    }
    r = subprocess.run(
        MLCONF
        + ["run", "-b", "example-q8", "--area", "quant", "-k", "q8_0", "--report", str(tmp_path / "reports")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        encoding="utf-8",
        timeout=120,
    )
    if r.returncode and "unrecognized" in r.stderr:  # a CLI without --report
        r = subprocess.run(
            MLCONF + ["run", "-b", "example-q8", "--area", "quant", "-k", "q8_0"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            encoding="utf-8",
            timeout=120,
        )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "example-q8" in r.stdout


BROKEN_ENTRY_POINTS = """\
[mlconf.backends]
broken-import = mlconf_no_such_module_xyz:factory
broken-factory = mlconf_raising_plugin:factory
not-callable = mlconf_raising_plugin:VALUE
not-a-backend = mlconf_raising_plugin:not_a_backend
reference = mlconf_raising_plugin:factory
lib:mine = mlconf_raising_plugin:factory
"""


@pytest.fixture
def broken_site(tmp_path) -> Path:
    """A hand-made distribution (dist-info only, no pip) with broken entry points."""
    site = tmp_path / "site"
    di = site / "mlconf_broken-0.1.dist-info"
    di.mkdir(parents=True)
    (di / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mlconf-broken\nVersion: 0.1\n", encoding="utf-8"
    )
    (di / "entry_points.txt").write_text(BROKEN_ENTRY_POINTS, encoding="utf-8")
    (site / "mlconf_raising_plugin.py").write_text(
        "VALUE = 42\n\n"
        "def factory(name):\n    raise RuntimeError('no GPU found')\n\n"
        "def not_a_backend(name):\n    return object()\n",
        encoding="utf-8",
    )
    return site


def test_broken_plugins_do_not_break_mlconf(broken_site, plugin_path):
    plugin_path(broken_site)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = {p.name: p for p in backends.plugins()}
    said = sorted(str(w.message) for w in caught)
    assert len(said) == 2, said
    assert "'lib:mine'" in said[0] and "built-in prefix 'lib:'" in said[0]
    assert "'reference'" in said[1] and "the built-in backend 'reference' has that name" in said[1]
    assert "ModuleNotFoundError" in info["broken-import"].error
    assert info["reference"].shadowed and info["lib:mine"].shadowed
    with pytest.raises(BackendError) as e:
        backends.get("broken-import")
    msg = str(e.value)
    assert (
        "'broken-import'" in msg
        and "mlconf_no_such_module_xyz:factory" in msg
        and "mlconf.backends" in msg
        and "mlconf-broken 0.1" in msg
        and "ModuleNotFoundError" in msg
    ), msg
    with pytest.raises(
        BackendError,
        match=r"factory of plug-in 'broken-factory' .* raised RuntimeError: "
        r"no GPU found",
    ):
        backends.get("broken-factory")
    with pytest.raises(BackendError, match="not a callable factory"):
        backends.get("not-callable")
    with pytest.raises(BackendError, match="returned object, not a backend"):
        backends.get("not-a-backend")
    assert backends.get("reference").name == "reference"  # the built-in wins
    assert "broken-import" not in backends.builtin_names()


def test_mlconf_backends_still_works_with_broken_plugins(broken_site, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken_site), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        MLCONF + ["backends"], cwd=tmp_path, env=env, capture_output=True, encoding="utf-8", timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "reference" in r.stdout
    listed = r.stdout.split("Plug-ins", 1)[1]  # each plug-in with its state
    assert "broken-import: mlconf_no_such_module_xyz:factory (mlconf-broken 0.1)" in listed, listed
    assert "ModuleNotFoundError" in listed, listed
    assert "the built-in backend 'reference' has that name" in listed, listed
    r = subprocess.run(
        MLCONF + ["run", "-b", "broken-factory", "--area", "quant"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        encoding="utf-8",
        timeout=120,
    )
    assert r.returncode == 4 and "no GPU found" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_example_runtime_imports_nothing_from_mlconf():
    for p in (Q8_RUNTIME, PLUGIN_SRC / "mlconf_example_q8.py"):
        assert not re.search(r"^\s*(from|import)\s+mlconf", p.read_text(encoding="utf-8"), flags=re.M), p


def test_protocol_bytes_on_the_wire():
    """The quantize request carries little-endian float32 x; the reply's f16 d is the f16 bits."""
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    raw = base64.b64decode(pack(x, "<f4"))
    assert raw == x.astype("<f4").tobytes() and len(raw) == 256
