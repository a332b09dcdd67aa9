"""Every subcommand fed bad arguments and bad files (issue 16's table and its siblings): the exit
status, one `mlconf: error: ...` line naming the argument or the file, no traceback, no hang and
no new file at the output path. Special files as inputs are refused before they are read.

The rows run in-process (cli.main), but for the ones whose point is what the shell passes (bytes
that are not UTF-8) or that could block (a FIFO), which run as a subprocess with a timeout."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlconf import cli
from mlconf.golden import GOLDEN_DIR
from mlconf.tools import exits

GGUF = GOLDEN_DIR / "bitnet" / "qwen3_i2s.gguf"


@pytest.fixture(scope="module")
def work(tmp_path_factory, generated):
    """A folder of inputs: models, tokenizers, arrays, and every kind of bad file."""
    out, _ = generated
    w = tmp_path_factory.mktemp("bad")
    shutil.copy(GOLDEN_DIR / "logits" / "llama.mlb", w / "llama.mlb")
    shutil.copy(out / "tokenizer" / "valid" / "bl.mlt", w / "tok.mlt")
    shutil.copy(out / "accepted" / "nan_scale.mlb", w / "nan.mlb")
    shutil.copy(out / "tokenizer" / "valid" / "bl.mlt", w / "TOK.MLT")
    if GGUF.exists():
        shutil.copy(GGUF, w / "emb.gguf")
    np.save(w / "x.npy", np.ones((4, 64), np.float32))
    np.save(w / "empty_rows.npy", np.zeros((0, 32), np.float32))
    np.save(w / "ints.npy", np.ones((2, 32), np.int32))
    (w / "e.npy").write_bytes(b"")
    (w / "e.mlb").write_bytes(b"")
    (w / "picture.png").write_bytes(bytes(range(256)) * 8)
    (w / "adir").mkdir()
    for name in ("f.mlb", "f.mlt", "f.npy", "f.gguf", "f.txt", "f.json"):
        os.mkfifo(w / name)
    (w / "ck").mkdir()
    os.mkfifo(w / "ck" / "config.json")
    os.symlink("no-such-file", w / "dangling.mlb")
    os.symlink("/dev/null", w / "null.mlb")
    (w / "afile").write_bytes(b"x")
    return w


def run(work: Path, *args, env=None):
    """cli.main in ``work``: (exit status, stdout, stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    old = Path.cwd()
    os.chdir(work)
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main([str(a) for a in args])
            except SystemExit as e:  # argparse --help and the converters' own parsers
                rc = e.code
    finally:
        os.chdir(old)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rc, out.getvalue(), err.getvalue()


def subprocess_run(work: Path, *args: bytes | str, timeout: float = 60):
    argv = [
        sys.executable,
        "-m",
        "mlconf.cli",
        *(a if isinstance(a, bytes) else str(a).encode() for a in args),
    ]
    r = subprocess.run(argv, capture_output=True, cwd=work, timeout=timeout)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def assert_one_error(rc: int, err: str, want_rc: int, names: str) -> None:
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    assert rc == want_rc, (rc, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith("mlconf: error: "), err
    assert names in last, (names, last)


# (arguments, exit status, a text the error line must hold, an output path that must not appear)
USAGE = exits.USAGE
ROWS = [
    # 3: absurd token ids, on every command that takes them
    (["forward", "llama.mlb", "--tokens", "99999999999999999999999"], USAGE, "--tokens", None),
    (
        ["imatrix", "llama.mlb", "--tokens", "99999999999999999999999", "-o", "x.mli"],
        USAGE,
        "--tokens",
        "x.mli",
    ),
    (["embed", "emb.gguf", "--tokens", "99999999999999999999999"], USAGE, "--tokens", None),
    (["decode", "tok.mlt", "--ids", "99999999999999999999999"], USAGE, "--ids", None),
    (["forward", "llama.mlb", "--tokens", "-1"], USAGE, "--tokens", None),
    (["forward", "llama.mlb", "--tokens", "1,x"], USAGE, "--tokens", None),
    # 4, 12: --model-vocab and --ctx out of range
    (["load", "tok.mlt", "-b", "native", "--model-vocab", "4294967296"], USAGE, "--model-vocab", None),
    (["load", "tok.mlt", "-b", "native", "--model-vocab", "-1"], USAGE, "--model-vocab", None),
    (["forward", "llama.mlb", "--tokens", "1,2", "--ctx", "0", "-b", "native"], USAGE, "--ctx", None),
    (["forward", "llama.mlb", "--tokens", "1,2", "--ctx", "-5"], USAGE, "--ctx", None),
    (["imatrix", "llama.mlb", "--tokens", "1", "--ctx", "0", "-o", "x.mli"], USAGE, "--ctx", "x.mli"),
    # 5: a capability the backend lacks
    (["load", "llama.mlb", "-b", "bitnet"], USAGE, "no load capability", None),
    (["forward", "llama.mlb", "--tokens", "1", "-b", "bitnet"], USAGE, "no forward capability", None),
    # 6, 15, 21: bad .npy inputs
    (["quantize", "--type", "q8_0", "e.npy", "o.npz"], USAGE, "e.npy: not an .npy file", "o.npz"),
    (["quantize", "--type", "q8_0", "picture.png", "o.npz"], USAGE, "picture.png: not an .npy file", "o.npz"),
    (["quantize", "--type", "q8_0", "ints.npy", "o.npz"], USAGE, "ints.npy", "o.npz"),
    (["quantize", "--type", "q8_0", "adir", "o.npz"], USAGE, "adir: cannot read: is a directory", "o.npz"),
    (["quantize", "--type", "q8_0", "absent.npy", "o.npz"], USAGE, "absent.npy", "o.npz"),
    # 7, 8: empty and binary token input
    (["imatrix", "llama.mlb", "--tokens", "", "-o", "x.mli"], USAGE, "--tokens", "x.mli"),
    (["imatrix", "llama.mlb", "--tokens-file", "picture.png", "-o", "x.mli"], USAGE, "picture.png", "x.mli"),
    (
        ["imatrix", "llama.mlb", "--tokens-file", "adir", "-o", "x.mli"],
        USAGE,
        "adir: cannot read: is a directory",
        "x.mli",
    ),
    (["encode", "tok.mlt", "--file", "picture.png"], USAGE, "picture.png", None),
    # 10: bench arguments
    (["bench", "quant", "--rows", "-1"], USAGE, "--rows", None),
    (["bench", "quant", "--cols", "33"], USAGE, "--cols", None),
    (["bench", "quant", "--cols", "0"], USAGE, "--cols", None),
    (["bench", "quant", "--repeat", "0"], USAGE, "--repeat", None),
    (["bench", "forward", "--model", "e.mlb"], USAGE, "e.mlb", None),
    (["bench", "forward", "--model", "adir"], USAGE, "adir: cannot read: is a directory", None),
    (["bench", "bitnet", "--shapes", "Qwen3-0.6B,Llama"], USAGE, "--shapes: 'Llama' is not one of", None),
    (["bench", "bitnet", "--seqs", "128,0"], USAGE, "--seqs: 0 is not in 1..4096", None),
    (["bench", "bitnet", "--seqs", "8192"], USAGE, "--seqs: 8192 is not in 1..4096", None),
    (["bench", "bitnet", "--seqs", "128,,256"], USAGE, "--seqs: '128,,256' is not a comma-separated", None),
    (["bench", "bitnet", "--threads", "two"], USAGE, "--threads: 'two' is not an integer", None),
    (["bench", "bitnet", "--threads", "0"], USAGE, "--threads: 0 is not in 1..256", None),
    (["bench", "quant", "--seqs", "128"], USAGE, "--seqs: only with `mlconf bench bitnet`", None),
    # 11: timeouts
    (["run", "--timeout", "1e8", "-b", "native", "-k", "format.magic"], USAGE, "--timeout", None),
    (["run", "--timeout", "inf", "-k", "format.magic"], USAGE, "--timeout", None),
    (["run", "--timeout", "0", "-k", "format.magic"], USAGE, "--timeout", None),
    (["run", "--jobs", "0", "-k", "format.magic"], USAGE, "--jobs", None),
    # 13: report folder checked before the run
    (["run", "-b", "reference", "-k", "format.magic", "--report", "afile"], USAGE, "afile", None),
    (["run", "-b", "reference", "-k", "format.magic", "--report", "afile/sub"], USAGE, "afile", "afile/sub"),
    (["report", "absent.json"], USAGE, "absent.json", None),
    (["diff", "absent.json", "llama.mlb"], USAGE, "absent.json", None),
    # 14: output paths name themselves
    (["imatrix", "llama.mlb", "--tokens", "1,2", "-o", "nodir/x.mli"], USAGE, "nodir/x.mli", "nodir/x.mli"),
    (["imatrix", "llama.mlb", "--tokens", "1,2", "-o", "adir"], USAGE, "adir: is a directory", None),
    (["quantize", "--type", "q8_0", "x.npy", "afile/o.npz"], USAGE, "afile/o.npz", "afile/o.npz"),
    (["forward", "llama.mlb", "--tokens", "1", "-o", "nodir/l.npy"], USAGE, "nodir/l.npy", "nodir/l.npy"),
    # 16: the option named is the one given
    (["decode", "tok.mlt", "--ids", ""], USAGE, "--ids", None),
    (["decode", "tok.mlt", "--ids", "1e9"], USAGE, "--ids", None),
    # 17: directories are directories
    (["embed", "adir", "--tokens", "1"], USAGE, "adir: cannot read: is a directory", None),
    (["forward", "adir", "--tokens", "1"], USAGE, "is a directory (ML_E_IO)", None),
    (["encode", "adir", "--text", "a"], USAGE, "is a directory (ML_E_IO)", None),
    (["forward", "dangling.mlb", "--tokens", "1"], USAGE, "dangling.mlb", None),
    (["forward", "null.mlb", "--tokens", "1"], USAGE, "is a character device (ML_E_IO)", None),
    # a model whose values turn NaN (decision forward.nonfinite): the matrix and the position
    (
        ["forward", "nan.mlb", "--tokens", "1,2"],
        USAGE,
        "position 0, element 0 of the input of layers.0.w2",
        None,
    ),
    (
        ["forward", "nan.mlb", "--tokens", "1,2", "-b", "native", "-o", "l.npy"],
        USAGE,
        "nan.mlb: ml_forward of 2 token(s) at pos 0 returned ML_E_FORMAT: a non-finite activation",
        "l.npy",
    ),
    (["imatrix", "nan.mlb", "--tokens", "1,2", "-o", "x.mli"], USAGE, "non-finite activation nan", "x.mli"),
    # 18: empty text
    (["embed", "emb.gguf", "--text", ""], USAGE, "--text", None),
    # 19: an empty output folder name
    (["fixtures", ""], USAGE, "empty path", None),
    (["fixtures", "afile"], USAGE, "afile", None),
    # 22: a backend named twice
    (["run", "-b", "reference", "-b", "reference", "-k", "format.magic"], USAGE, "-b reference", None),
    # 24: the converters speak like the rest
    (["convert"], USAGE, "convert", None),
    (["convert-tokenizer"], USAGE, "convert-tokenizer", None),
    (["convert-bitnet"], USAGE, "convert-bitnet", None),
    (["convert-tokenizer", "adir", "o.mlt"], USAGE, "adir: cannot read: is a directory", "o.mlt"),
    (["convert-tokenizer", "picture.png", "o.mlt"], USAGE, "picture.png", "o.mlt"),
    (["convert", "adir", "o.mlb"], USAGE, "adir/config.json", "o.mlb"),
    (["convert-bitnet", "adir", "o.gguf"], USAGE, "adir/config.json", "o.gguf"),
    # siblings: unknown backend, unknown option value, nothing to do
    (["load", "llama.mlb", "-b", "nope"], USAGE, "nope", None),
    (["run", "--area", "nope"], USAGE, "--area", None),
    (["run", "--shard", "4/3"], USAGE, "--shard", None),
    (["run", "--target-version", "x"], USAGE, "--target-version", None),
]


@pytest.mark.parametrize("args,rc,names,output", ROWS, ids=[" ".join(r[0])[:60] for r in ROWS])
def test_bad_argument(work, args, rc, names, output):
    if "emb.gguf" in args and not (work / "emb.gguf").exists():
        pytest.skip("no golden BitNet GGUF")
    before = {p.name for p in work.iterdir()}
    got, _, err = run(work, *args)
    assert_one_error(got, err, rc, names)
    if output:
        assert not os.path.lexists(work / output), output
    assert {p.name for p in work.iterdir()} == before  # nothing half-written, nothing new


@pytest.mark.parametrize(
    "args",
    [
        ["load", "f.mlb"],
        ["load", "f.mlt"],
        ["load", "f.mlb", "-b", "native"],
        ["load", "f.mlt", "-b", "native"],
    ],
)
def test_a_fifo_is_refused_at_once(work, args):
    """Rows 1-2: a FIFO with no writer is ML_E_IO on every backend, without blocking."""
    rc, out, err = subprocess_run(work, *args, "--json", timeout=60)
    assert rc == exits.REJECTED, err
    assert '"status": "ML_E_IO"' in out, out


@pytest.mark.parametrize("name", ["/dev/null", "/dev/zero", "null.mlb", "dangling.mlb", "adir"])
@pytest.mark.parametrize("backend", ["reference", "native"])
def test_special_files_one_status(work, name, backend):
    for suffix in ("", ".mlt"):
        path = name
        if suffix:  # the same special file read as a tokenizer: a symlink named .mlt
            path = f"as_tok_{Path(name).name}{suffix}"
            if not os.path.lexists(work / path):
                os.symlink(os.path.abspath(work / name) if not name.startswith("/") else name, work / path)
        rc, out, err = run(work, "load", path, "-b", backend, "--json")
        assert rc == exits.REJECTED and '"status": "ML_E_IO"' in out, (path, out, err)


@pytest.mark.parametrize(
    "args",
    [
        ["quantize", "--type", "q8_0", "f.npy", "o.npz"],
        ["imatrix", "llama.mlb", "--tokens-file", "f.txt", "-o", "x.mli"],
        ["encode", "tok.mlt", "--file", "f.txt"],
        ["forward", "f.mlb", "--tokens", "1"],
        ["embed", "f.gguf", "--tokens", "1"],
        ["convert-tokenizer", "f.json", "o.mlt"],
        ["convert", "ck", "o.mlb"],
        ["convert-bitnet", "ck", "o.gguf"],
    ],
)
def test_fifo_inputs_of_commands(work, args):
    rc, _, err = subprocess_run(work, *args, timeout=60)
    assert_one_error(rc, err, exits.USAGE, "is a FIFO")
    assert not any((work / o).exists() for o in ("o.npz", "x.mli", "o.mlt", "o.mlb", "o.gguf"))


def test_worker_timeout_variable(work):
    rc, _, err = run(work, "load", "llama.mlb", "-b", "native", env={"MLCONF_WORKER_TIMEOUT": "inf"})
    assert_one_error(rc, err, exits.USAGE, "MLCONF_WORKER_TIMEOUT")


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_text_arguments_are_the_shell_s_bytes(work, backend):
    """Row 9, decision cli.text: ED A0 80 (a surrogate's UTF-8) is three U+FFFD on every backend."""
    rc, out, err = subprocess_run(work, "encode", "tok.mlt", "--text", b"\xed\xa0\x80", "-b", backend)
    rc2, out2, _ = subprocess_run(work, "encode", "tok.mlt", "--text", "\ufffd\ufffd\ufffd", "-b", backend)
    assert rc == rc2 == 0, err
    assert out == out2


def test_extension_is_case_insensitive(work):
    """Row 23: TOK.MLT is a tokenizer."""
    rc, out, err = run(work, "load", "TOK.MLT")
    assert rc == 0 and out.startswith("ML_OK"), (out, err)


def test_empty_rows_quantize_alike(work, tmp_path):
    """Row 21: a (0, 32) array quantizes to empty arrays on every backend."""
    for backend in ("reference", "native"):
        rc, _, err = run(
            work, "quantize", "--type", "q8_0", "empty_rows.npy", tmp_path / f"{backend}.npz", "-b", backend
        )
        assert rc == 0, err
        z = np.load(tmp_path / f"{backend}.npz")
        assert z["q"].shape == (0, 32) and z["d"].shape == (0, 1)


def test_fixtures_manifest_lists_every_file(generated):
    """Row 20: every file `mlconf fixtures` writes is in manifest.json."""
    import json

    out, _ = generated
    doc = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    listed = {
        p
        for f in doc["fixtures"]
        for p in (f["file"], f["imatrix"])
        if p and {"path": "missing"} not in f["mutate"]
    } | {"manifest.json"}
    written = set()
    for folder, dirs, names in os.walk(out):
        for n in dirs + names:
            p = Path(folder) / n
            if p.is_dir() and not p.is_symlink() and p.relative_to(out).as_posix() not in listed:
                continue  # a folder of files
            written.add(p.relative_to(out).as_posix())
    assert written == listed


# ---------------------------------------------------------------- numbers, by hypothesis
NUMBERS = st.one_of(
    st.integers(-(2**80), 2**80),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(NUMBERS)
def test_int_arguments_take_or_refuse(v):
    """An int_in argument accepts exactly the integers of its range; anything else is an
    argparse error (a usage error naming the option), never another exception."""
    parse = cli.int_in(1, 2**24)
    try:
        got = parse(str(v))
    except argparse.ArgumentTypeError:
        assert not (isinstance(v, int) and 1 <= v <= 2**24)
    else:
        assert isinstance(v, (int, str)) and got == int(str(v)) and 1 <= got <= 2**24


@settings(max_examples=300, deadline=None)
@given(NUMBERS)
def test_timeouts_take_or_refuse(v):
    try:
        got = cli.seconds(str(v))
    except argparse.ArgumentTypeError:
        return
    assert 0 < got <= 1e6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=4)), max_size=5))
def test_token_lists_take_or_refuse(items):
    text = ",".join(str(i) for i in items)
    try:
        ids = cli.parse_tokens(text, "--ids")
    except cli.UsageError as e:
        assert str(e).startswith("--ids")
    else:
        assert all(0 <= i < 2**31 for i in ids) and len(ids) >= 1


@settings(max_examples=40, deadline=None)
@given(st.integers(-(2**70), 2**70))
def test_ctx_on_the_command_line(work, ctx):
    rc, _, err = run(work, "forward", "llama.mlb", "--tokens", "1", "--ctx", str(ctx), "-o", "l.npy")
    if 1 <= ctx <= 2**24:
        assert rc in (exits.OK, exits.USAGE) and "Traceback" not in err  # above max_seq: the model says so
    else:
        assert_one_error(rc, err, exits.USAGE, "--ctx")
    (work / "l.npy").unlink(missing_ok=True)


def test_a_cmd_backend_without_load(work):
    """Row 5 on a cmd: runtime: the .mlb path checks the capability as the .mlt path does."""
    prog = Path(__file__).resolve().parents[1] / "examples" / "cmd_runtime" / "q8_runtime.py"
    rc, _, err = run(work, "load", "llama.mlb", "-b", f"cmd:{sys.executable} {prog}")
    assert_one_error(rc, err, exits.USAGE, "no load capability")


def test_bench_tokenizer_keeps_native_without_hf(work, monkeypatch):
    """Row 25: without HF tokenizers the reference and native rows remain."""
    from mlconf import bench
    from mlconf.backends.native import LIBRARY

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    rows = bench.tokenizer_bench(
        str(work / "tok.mlt"), str(work / "absent.json"), "hello world " * 100, repeat=1
    )
    impls = [r["impl"] for r in rows]
    assert "HF tokenizers" not in impls and impls[0] == "reference"
    assert ("native" in impls) == LIBRARY.exists()
