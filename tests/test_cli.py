"""The mlconf command line, run as a user runs it (a subprocess), exit codes and messages."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlconf import fixtures
from mlconf.backends.reference import quant


def mlconf(*args, cwd=None, env=None):
    """The CLI in a subprocess, its arguments and output in UTF-8 whatever this process's locale
    (PYTHONUTF8=1 unless ``env`` says otherwise), so that no test depends on the locale."""
    argv = [sys.executable, "-m", "mlconf.cli", *(str(a).encode("utf-8") for a in args)]
    env = {**os.environ, "PYTHONUTF8": "1", **(env or {})}
    return subprocess.run(
        argv, capture_output=True, encoding="utf-8", errors="replace", cwd=cwd, env=env, timeout=300
    )


def no_traceback(r):
    assert "Traceback" not in r.stderr + r.stdout


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    out = tmp_path_factory.mktemp("fx")
    r = mlconf("fixtures", out)
    assert r.returncode == 0, r.stderr
    return out


def test_backends_table():
    r = mlconf("backends")
    assert r.returncode == 0
    row = next(line for line in r.stdout.splitlines() if line.startswith("reference"))
    header = r.stdout.splitlines()[0].split()
    assert header[:4] == ["backend", "load", "quantize_q8_0", "quantize_q4_0"] and "forward" in header
    assert row.split()[1:] == ["yes"] * (len(header) - 1)


def test_load_exit_codes_and_json(fx):
    ok = mlconf("load", fx / "valid/q8_min.mlb")
    assert ok.returncode == 0 and ok.stdout.startswith("ML_OK")
    bad = mlconf("load", fx / "malformed/format.magic/gguf.mlb", "--json")
    assert bad.returncode == 2
    doc = json.loads(bad.stdout)
    assert doc["status"] == "ML_E_FORMAT" and "magic" in doc["reason"]
    shape = mlconf("load", fx / "malformed/shape.kv_divide_heads/kv_3.mlb")
    assert shape.returncode == 2 and shape.stdout.startswith("ML_E_SHAPE") and "n_kv_heads" in shape.stdout


def test_load_missing_file_is_io_not_traceback(tmp_path):
    r = mlconf("load", tmp_path / "absent.mlb", "--json")
    assert r.returncode == 2
    assert json.loads(r.stdout)["status"] == "ML_E_IO"
    assert "absent.mlb" in json.loads(r.stdout)["reason"]
    no_traceback(r)


def test_usage_errors_exit_4():
    for args in (["load"], ["load", "x.mlb", "-b", "nope"], ["frobnicate"], ["quantize", "a.npy", "b.npz"]):
        r = mlconf(*args)
        assert r.returncode == 4, args
        no_traceback(r)


def test_fixtures_manifest_matches_catalog_and_is_deterministic(fx, tmp_path):
    doc = json.loads((fx / "manifest.json").read_text(encoding="utf-8"))
    assert len(doc["fixtures"]) == len(fixtures.catalog())
    for f in doc["fixtures"]:
        p = fx / f["file"]
        missing = any("path" in op and op["path"] == "missing" for op in f["mutate"])
        assert os.path.lexists(p) != missing, f["file"]
        assert f["expected"] in doc["statuses"]
    again = tmp_path / "again"
    assert mlconf("fixtures", again).returncode == 0

    def digest(root: Path):  # what stands at each path (special files too: fixtures._state)
        out = {}
        for folder, dirs, names in os.walk(root):
            for n in dirs + names:
                p = Path(folder) / n
                out[p.relative_to(root).as_posix()] = fixtures._state(p)
        return out

    assert digest(fx) == digest(again)
    assert digest(fx)["malformed/io.open/fifo.mlb"] == "fifo"


def test_quantize_q8_and_q4(tmp_path):
    x = np.random.default_rng(1).normal(0, 1, (4, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = mlconf("quantize", "--type", "q8_0", "--f16-scales", tmp_path / "x.npy", tmp_path / "q8.npz")
    assert r.returncode == 0, r.stderr
    z = np.load(tmp_path / "q8.npz")
    q, d = quant.q8_0(x, f16=True)
    assert z["q"].tobytes() == q.tobytes() and z["d"].dtype == np.float16 and z["d"].tobytes() == d.tobytes()
    r = mlconf("quantize", "--type", "q4_0", "--rule", "round", tmp_path / "x.npy", tmp_path / "q4.npz")
    assert r.returncode == 0, r.stderr
    z = np.load(tmp_path / "q4.npz")
    assert z["q"].shape == (4, 32) and z["d"].shape == (4, 2)


def test_quantize_float64_is_rounded_to_float32(tmp_path):
    x = np.random.default_rng(2).normal(0, 1, 32)
    np.save(tmp_path / "x.npy", x)
    assert mlconf("quantize", "--type", "q8_0", tmp_path / "x.npy", tmp_path / "o.npz").returncode == 0
    q, _ = quant.q8_0(x.astype(np.float32))
    assert np.load(tmp_path / "o.npz")["q"].tobytes() == q.tobytes()


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda p: np.save(p, np.full(32, np.nan, np.float32)), "non-finite"),
        (lambda p: np.save(p, np.zeros(33, np.float32)), "multiple of 32"),
        (lambda p: np.save(p, np.zeros(32, np.int32)), "not floating point"),
        (lambda p: p.write_bytes(b"not numpy"), "not an .npy file"),
        (lambda p: p.write_bytes(b"\x93NUMPY\x01\x00garbage"), "not a readable .npy"),
        (lambda p: None, "No such file"),
    ],
)
def test_quantize_bad_input(tmp_path, make, needle):
    src = tmp_path / "in.npy"
    make(src)
    r = mlconf("quantize", "--type", "q8_0", src, tmp_path / "out.npz")
    assert r.returncode == 4 and needle in r.stderr, r.stderr
    no_traceback(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["in.npy"] if src.exists() else [])


def test_quantize_refuses_f16_overflow_and_leaves_nothing(tmp_path):
    np.save(tmp_path / "big.npy", np.full(32, 127 * 70000, np.float32))
    r = mlconf("quantize", "--type", "q8_0", "--f16-scales", tmp_path / "big.npy", tmp_path / "o.npz")
    assert r.returncode == 4 and "65504" in r.stderr
    assert not (tmp_path / "o.npz").exists() and not list(tmp_path.glob(".*part"))


def test_run_prints_table_and_selects(tmp_path):
    r = mlconf("run", "--area", "loader", "-k", "format.magic or shape.zero", "--report", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "rep" / "results.json").is_file()
    row = next(line for line in r.stdout.splitlines() if line.startswith("reference"))
    assert row.split()[:3] == ["reference", "loader", "9"]
    assert mlconf("run", "-k", "no-such-case", cwd=tmp_path).returncode == 5
    assert mlconf("run", "-k", "(unbalanced", cwd=tmp_path).returncode == 4
    assert not (tmp_path / "reports").exists()  # nothing written for a run that selects nothing


def test_forward_writes_logits_and_refuses_bad_tokens(tmp_path):
    from mlconf.golden import GOLDEN_DIR

    model = GOLDEN_DIR / "logits" / "qwen2_bias.mlb"
    r = mlconf("forward", model, "--tokens", "1,2,3", "-o", tmp_path / "l.npy")
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "l.npy").shape == (3, 128)
    r = mlconf("forward", model, "--tokens", "1,2,3")
    assert r.returncode == 0 and r.stdout.count("argmax") == 3
    for args, needle in (
        (["--tokens", "1,999"], "outside"),
        (["--tokens", "1,a"], "comma-separated"),
        (["--tokens", "1", "--ctx", "100000"], "ctx"),
        (["--tokens", "1", "-b", "nope"], "unknown backend"),
    ):
        r = mlconf("forward", model, *args)
        assert r.returncode == 4 and needle in r.stderr, (args, r.stderr)
        no_traceback(r)


def test_imatrix_command(tmp_path):
    from mlconf.golden import GOLDEN_DIR
    from mlconf.tools import mlb

    model = GOLDEN_DIR / "logits" / "qwen2_bias.mlb"
    (tmp_path / "t.txt").write_text("1 2 3\n4,5\n", encoding="utf-8")
    r = mlconf("imatrix", model, "--tokens-file", tmp_path / "t.txt", "--ctx", "2", "-o", tmp_path / "o.mli")
    assert r.returncode == 0, r.stderr
    im = mlb.read_imatrix(tmp_path / "o.mli")
    assert im.tokens == im.tokens_cls == 5 and im.n_layers == 2
    r = mlconf("imatrix", model, "--tokens", "1", "-o", tmp_path / "nodir" / "o.mli")
    assert r.returncode == 4
    no_traceback(r)


def test_convert_command(tmp_path):
    pytest.importorskip("torch")
    from mlconf.tools import hf_models

    hf_models.build("qwen2", tmp_path / "hf", seed=0)
    r = mlconf("convert", tmp_path / "hf", tmp_path / "m.mlb", "--wtype", "q4_0", "--f16-scales")
    assert r.returncode == 0, r.stderr
    assert mlconf("load", tmp_path / "m.mlb").returncode == 0
    r = mlconf("convert", tmp_path / "missing", tmp_path / "x.mlb")
    assert r.returncode == 4 and not (tmp_path / "x.mlb").exists()
    no_traceback(r)


def test_encode_decode_commands(tmp_path):
    from mlconf import mlt_fixtures
    from mlconf.tools import mlt

    p = tmp_path / "sp.mlt"
    mlt.write(p, mlt_fixtures.BASES["sp"][0])
    # <s>, "▁ab", "▁ab", "▁", then the byte tokens of é (0xC3 0xA9) at 2 + byte
    r = mlconf("encode", p, "--text", "ab ab é", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [0, 263, 263, 258, 2 + 0xC3, 2 + 0xA9]
    (tmp_path / "t.txt").write_text("ab ab é", encoding="utf-8")
    assert mlconf("encode", p, "--file", tmp_path / "t.txt").stdout.strip() == "0,263,263,258,197,171"
    r = mlconf("decode", p, "--ids", "263,263,258,197,171")
    assert r.returncode == 0 and r.stdout == "ab ab é\n"
    for args, needle in (
        (["decode", p, "--ids", "99999"], "99999"),
        (["encode", tmp_path / "absent.mlt", "--text", "x"], "ML_E_IO"),
        (["encode", p, "--file", tmp_path / "absent.txt"], "cannot read"),
    ):
        r = mlconf(*args)
        assert r.returncode == 4 and needle in r.stderr, (args, r.stderr)
        no_traceback(r)
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    r = mlconf("encode", p, "--file", tmp_path / "bad.txt")
    assert r.returncode == 4 and "UTF-8" in r.stderr


def test_decode_in_an_ascii_locale_escapes_what_it_cannot_print(tmp_path):
    """LC_ALL=C without Python's UTF-8 coercion: stdout is ASCII; "é" prints escaped, no traceback."""
    from mlconf import mlt_fixtures
    from mlconf.tools import mlt

    p = tmp_path / "sp.mlt"
    mlt.write(p, mlt_fixtures.BASES["sp"][0])
    ascii_env = {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    r = mlconf("decode", p, "--ids", "263,263,258,197,171", env=ascii_env)
    assert r.returncode == 0 and r.stdout == "ab ab \\xe9\n", r.stderr
    no_traceback(r)


@pytest.mark.slow
def test_bench_tokenizer_runs():
    r = mlconf("bench", "tokenizer", "--repeat", "1")  # the rows, not their spread
    assert r.returncode == 0, r.stderr
    impls = [
        line.split()[1]
        for line in r.stdout.splitlines()
        if line.split()[:1] and line.split()[0].endswith((".mlt", ".json"))
    ]
    assert impls.count("reference") == 2 and "MB_s" in r.stdout, r.stdout
    assert impls.count("native") == 2, r.stdout  # the C encoder, in-process


def test_unwritable_outputs_are_errors_not_tracebacks(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(32, np.float32))
    for args in (
        ["fixtures", "/proc/mlconf-no-such-dir"],
        ["quantize", "--type", "q8_0", tmp_path / "x.npy", tmp_path],
    ):
        r = mlconf(*args)
        assert r.returncode == 4 and r.stderr.startswith("mlconf: error:"), (args, r.stderr)
        no_traceback(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def test_convert_bitnet_command(tmp_path):
    pytest.importorskip("torch")
    from mlconf.tools import bitnet_models

    bitnet_models.build("qwen3", tmp_path / "ckpt", seed=0, hidden_size=128)
    r = mlconf("convert-bitnet", tmp_path / "ckpt", tmp_path / "m.gguf", "--outtype", "i2_s")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m.gguf").stat().st_size > 0
    r = mlconf("convert-bitnet", tmp_path / "missing", tmp_path / "x.gguf", "--outtype", "f32")
    assert r.returncode == 4 and not (tmp_path / "x.gguf").exists()
    no_traceback(r)


# ---------------------------------------------------------------- mlconf embed (BitNet GGUF goldens)
def _bitnet_golden(name):
    from mlconf.golden import GOLDEN_DIR

    return GOLDEN_DIR / "bitnet" / f"{name}.gguf", np.load(GOLDEN_DIR / "bitnet" / f"{name}.npz")


def test_embed_tokens_prints_the_reference_embedding_exactly():
    pytest.importorskip("gguf")
    from mlconf.backends.reference import bitnet

    path, g = _bitnet_golden("qwen3_i2s")
    toks = g["tokens_1"]
    r = mlconf("embed", path, "--tokens", ",".join(map(str, toks)))
    assert r.returncode == 0, r.stderr
    got = np.array(r.stdout.split(), dtype=np.float32)
    want = bitnet.embed(bitnet.load_gguf(path), toks)  # the GGUF's pooling (last)
    assert got.tobytes() == want.tobytes()  # the text reads back to the same float32 bits
    np.testing.assert_allclose(got, g["last_1"], rtol=0, atol=1e-5)


def test_embed_json_pooling_normalize():
    pytest.importorskip("gguf")
    path, g = _bitnet_golden("gemma3_i2s")
    toks = [int(t) for t in g["tokens_2"]]
    r = mlconf(
        "embed",
        path,
        "--tokens",
        ",".join(map(str, toks)),
        "--pooling",
        "cls",
        "--normalize",
        "--json",
        "-b",
        "reference",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"model", "backend", "tokens", "pooling", "normalize", "reading", "embedding"}
    assert doc["backend"] == "reference" and doc["tokens"] == toks and doc["pooling"] == "cls"
    assert doc["normalize"] is True and doc["model"] == str(path)
    vec = np.array(doc["embedding"], dtype=np.float32)
    assert vec.shape == g["cls_norm_2"].shape and abs(np.linalg.norm(vec) - 1) < 1e-5
    np.testing.assert_allclose(vec, g["cls_norm_2"], rtol=0, atol=1e-5)


def test_embed_reading_option():
    """--reading ternary reads the f16 student's latent weights as BitLinear (its golden's ternary_*
    arrays); the default is its float reading; a teacher refuses the ternary one in one line."""
    pytest.importorskip("gguf")
    path, g = _bitnet_golden("qwen3_f16")
    toks = ",".join(map(str, g["tokens_2"]))
    for extra, key in (
        ([], "mean_2"),
        (["--reading", "ternary"], "ternary_mean_2"),
        (["--reading", "float"], "mean_2"),
    ):
        for backend in ("reference", "bitnet"):
            r = mlconf("embed", path, "--tokens", toks, "--pooling", "mean", "--json", "-b", backend, *extra)
            assert r.returncode == 0, r.stderr
            vec = np.array(json.loads(r.stdout)["embedding"], dtype=np.float32)
            np.testing.assert_allclose(vec, g[key], rtol=0, atol=0.02, err_msg=f"{backend} {extra}")
    a = mlconf("embed", path, "--tokens", toks, "--pooling", "mean")
    b = mlconf("embed", path, "--tokens", toks, "--pooling", "mean", "--reading", "ternary")
    assert a.stdout != b.stdout
    teacher, _ = _bitnet_golden("qwen3_teacher_f16")
    for backend in ("reference", "bitnet"):
        r = mlconf("embed", teacher, "--tokens", "1,2,3", "--reading", "ternary", "-b", backend)
        assert r.returncode == 4 and "reading ternary needs a BitNet student" in r.stderr, (backend, r.stderr)
        no_traceback(r)


def test_embed_text_uses_the_gguf_tokenizer_and_appends_eos():
    """qwen3 GGUFs say add_eos_token (decision cli.embed_text): the ids are HF tokenizers' ids of the
    checkpoint's own tokenizer.json, then <|endoftext|>."""
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from mlconf.tools import bitnet_models, golden_bitnet

    path, _ = _bitnet_golden("qwen3_i2s")
    hf = bitnet_models.tokenizer("qwen3", seed=golden_bitnet.SEED)
    eos = hf.token_to_id("<|endoftext|>")
    for text in ("hello world", "the quick brown fox jumps over the lazy dog"):
        r = mlconf("embed", path, "--text", text, "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["tokens"] == hf.encode(text).ids + [eos] and doc["pooling"] is None, text
    ids = json.loads(r.stdout)["tokens"]
    same = mlconf("embed", path, "--tokens", ",".join(map(str, ids)), "--json")
    assert json.loads(same.stdout)["embedding"] == json.loads(r.stdout)["embedding"]


def test_embed_text_on_a_sentencepiece_vocabulary_prepends_bos():
    """Gemma 3 GGUFs hold a llama (SentencePiece) vocabulary and say add_bos_token: the ids are HF
    tokenizers' ids of the checkpoint's own tokenizer.json, <bos> first (its post-processor)."""
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from mlconf.tools import bitnet_models, golden_bitnet

    path, _ = _bitnet_golden("gemma3_i2s")
    hf = bitnet_models.tokenizer("gemma3_text", seed=golden_bitnet.SEED)
    for text in ("hello world", "the quick brown fox é", "a<bos>b"):
        r = mlconf("embed", path, "--text", text, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["tokens"] == hf.encode(text, add_special_tokens=True).ids, text
    assert json.loads(r.stdout)["tokens"][0] == hf.token_to_id("<bos>")


def test_embed_errors_are_one_line(tmp_path):
    pytest.importorskip("gguf")
    path, _ = _bitnet_golden("qwen3_i2s")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + bytes(20))
    (tmp_path / "text.gguf").write_text("not a model", encoding="utf-8")
    for args, needle in (
        ([tmp_path / "absent.gguf", "--tokens", "1"], "absent.gguf"),
        ([tmp_path / "bad.gguf", "--tokens", "1"], "bad.gguf"),
        ([tmp_path / "text.gguf", "--tokens", "1"], "text.gguf"),
        ([tmp_path / "text.gguf", "--text", "hi"], "text.gguf"),
        ([path, "--tokens", "5,256"], "256"),
        ([path, "--tokens", "5,-1"], "-1"),
        ([path, "--tokens", "1,x"], "--tokens"),
        ([path, "--tokens", ","], "no token"),
        ([path, "--tokens", "1", "-b", "no-such-backend"], "no-such-backend"),
    ):
        r = mlconf("embed", *args)
        assert r.returncode == 4, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("mlconf: error:") and needle in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        no_traceback(r)
    r = mlconf("embed", path, "--tokens", "1", "--pooling", "max")
    assert r.returncode == 4 and "--pooling" in r.stderr
    r = mlconf("embed", path)
    assert r.returncode == 4 and "--tokens" in r.stderr
