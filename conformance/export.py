"""Every case of the suite as files a runtime replays without Python (`mlconf fixtures OUT`).

The cases are cases.collect()'s, the ones `mlconf run` runs, so the two cannot drift. Each becomes
one entry of manifest.json's ``cases`` (specs/fixtures_manifest.schema.json): the C ABI function
to call (include/mlrt.h) with its scalar arguments, its input files and the expectation: a status,
refusal, bytes to match bit for bit, token ids, or float outputs with the thresholds of
specs/tolerances.yaml. Arrays are raw little-endian files (``{"file", "dtype", "shape"}``; dtype
i8 u8 i32 u16 f32); models, tokenizers and GGUFs are the files themselves, texts their UTF-8
bytes. Where ``mlconf run`` compares a case with the reference backend ("vs_reference"), the
reference's output is written as the expectation (``"from": "reference"``).

The bytes are the same on every run and every host: the reference's float math does not follow
the host's NumPy loops or BLAS kernels (backends/reference/portable.py, decision
reference.portable_math).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mlconf import cases as case_list
from mlconf import fixtures, specs
from mlconf.golden import GOLDEN_DIR
from mlconf.tools.files import atomic_write

FORMAT = "mlconf fixtures v2"
DTYPES = {"i8": "<i1", "u8": "<u1", "i32": "<i4", "u16": "<u2", "f32": "<f4"}
POOLING = {None: -1, "mean": 1, "cls": 2, "last": 3}  # mlrt.h ML_POOL_* (None: ML_POOL_MODEL)
READING = {None: 0, "float": 1, "ternary": 2}  # mlrt.h ML_READ_*
REFUSALS = ["ML_E_IO", "ML_E_FORMAT", "ML_E_SHAPE", "ML_E_ARG"]  # a refusal: any of these statuses


class Exporter:
    """Writes the files of the cases under ``out`` (fixtures and per-run files through the runner's
    Workdir, the rest under cases/<case id>/) and builds their manifest entries."""

    def __init__(self, out: Path):
        from mlconf.runner import Workdir

        self.out = out
        self.work = Workdir(out)  # fixtures, converted tokenizers, damaged GGUFs: in out
        self.tol = specs.load("tolerances")

    # -- files
    def rel(self, path: Path) -> str:
        return (
            Path(os.path.abspath(path)).relative_to(os.path.abspath(self.out)).as_posix()
        )  # no symlink followed

    def golden(self, path: Path) -> str:
        """A golden file copied to out/golden/..., its path relative to out."""
        dst = self.out / "golden" / Path(path).resolve().relative_to(GOLDEN_DIR.resolve())
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dst)
        return self.rel(dst)

    def array(self, case_id: str, name: str, a: Any, dtype: str) -> dict:
        a = np.ascontiguousarray(np.asarray(a).astype(DTYPES[dtype], copy=False))
        p = self.out / "cases" / case_id / f"{name}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(p, [a.tobytes()])
        return {"file": self.rel(p), "dtype": dtype, "shape": list(a.shape)}

    def raw(self, case_id: str, name: str, data: bytes, dtype: str = "u8") -> dict:
        return self.array(case_id, name, np.frombuffer(bytes(data), DTYPES[dtype]), dtype)

    def text(self, case_id: str, text: str) -> dict:
        p = self.out / "cases" / case_id / "text.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(p, [text.encode("utf-8", "surrogatepass")])
        return {"file": self.rel(p)}

    def tolerance(self, name: str) -> dict:
        t = self.tol[name]
        return {
            "name": name,
            **{k: t[k] for k in ("nmse", "max_abs", "max_ulp", "argmax", "cosine") if k in t},
        }

    # -- cases
    def entry(self, case) -> dict:
        e = {
            "id": case.id,
            "area": case.area,
            "spec": case.spec,
            "capability": case.capability,
            "min_version": None,
        }
        fx = case.params.get("fixture")
        if fx is not None:
            e["min_version"] = fx.min_version
        if case.compare == "status":
            return {**e, **self._status(case)}
        if case.area == "quant":
            return {**e, **self._quant(case)}
        if case.compare == "ids":
            return {**e, **self._ids(case)}
        if case.area == "tokenizer":
            return {**e, **self._decode(case)}
        if case.area == "forward":
            return {**e, **self._forward(case)}
        return {**e, **self._bitnet(case)}

    def _status(self, case) -> dict:
        fx = case.params["fixture"]
        path = {"file": self.rel(self.work.path(fx))}
        if fx.mutate and fixtures._path_kind(fx.mutate):
            path["special"] = fixtures._path_kind(fx.mutate)
        if case.capability == "load_tokenizer":
            return {
                "op": "ml_tok_load",
                "args": {"model_vocab": fx.model_vocab or 0},
                "inputs": {"path": path},
                "expect": {"compare": "status", "status": case.expected, "rule": fx.rule},
            }
        if case.capability == "load_gguf":  # ml_embed_check_rule when exported, else load and free
            return {
                "op": "ml_embed_load",
                "args": {},
                "inputs": {"path": path},
                "expect": {"compare": "status", "status": case.expected, "rule": fx.rule},
            }
        return {
            "op": "ml_check",
            "args": {},
            "inputs": {"path": path},
            "expect": {"compare": "status", "status": case.expected, "rule": fx.rule},
        }

    def _quant(self, case) -> dict:
        p, cid = case.params, case.id
        x = np.asarray(p["x"], np.float32)
        d_type = "u16" if p["f16"] else "f32"
        if case.capability == "quantize_q8_0":
            op, args, outs = "ml_quantize_q8_0", {"n": int(x.size), "f16": int(p["f16"])}, ("q", "i8")
        else:
            rows, cols = (1, x.size) if x.ndim == 1 else x.shape
            op, outs = "ml_quantize_q4_0", ("qs", "u8")
            args = {
                "rows": int(rows),
                "cols": int(cols),
                "rule": 0 if p["rule"] == "round" else 1,
                "f16": int(p["f16"]),
            }
        inputs = {"x": self.array(cid, "x", x, "f32")}
        if p.get("importance") is not None:
            inputs["importance"] = self.array(cid, "importance", p["importance"], "f32")
        if case.compare == "refused":
            return {
                "op": op,
                "args": args,
                "inputs": inputs,
                "expect": {"compare": "refused", "statuses": REFUSALS},
            }
        want_q, want_d = case.expected
        return {
            "op": op,
            "args": args,
            "inputs": inputs,
            "expect": {
                "compare": "bit-exact",
                "from": "spec",
                "outputs": {
                    outs[0]: self.raw(cid, outs[0], want_q, outs[1]),
                    "d": self.raw(cid, "d", want_d, d_type),
                },
            },
        }

    def _ids(self, case) -> dict:
        tok = self.work.tokenizer(case.params["golden"], case.params.get("variant"))
        return {
            "op": "ml_tok_encode",
            "args": {"model_vocab": 0},
            "inputs": {"tokenizer": {"file": self.rel(tok)}, "text": self.text(case.id, case.params["text"])},
            "expect": {
                "compare": "ids",
                "from": "oracle",
                "outputs": {"ids": self.array(case.id, "ids", case.expected, "i32")},
            },
        }

    def _decode(self, case) -> dict:
        tok = self.work.tokenizer(case.params["golden"])
        return {
            "op": "ml_tok_decode",
            "args": {"model_vocab": 0},
            "inputs": {
                "tokenizer": {"file": self.rel(tok)},
                "ids": self.array(case.id, "ids", np.asarray(case.params["ids"], np.int64), "i32"),
            },
            "expect": {
                "compare": "bit-exact",
                "from": "oracle",
                "outputs": {"bytes": self.raw(case.id, "bytes", case.expected)},
            },
        }

    def _forward(self, case) -> dict:
        from mlconf.areas.forward import NonFinite

        p = case.params
        if "fixture" in p:
            case = replace(case, params={**p, "model": self.work.path(p["fixture"])})
            p = case.params
            model = self.rel(p["model"])
        else:
            model = self.golden(p["model"])
        frm = "reference" if case.expected is None else "oracle"
        want = case.expected if case.expected is not None else self.work.expected_logits(case)
        expect = {"compare": "toleranced", "from": frm, "tolerance": self.tolerance(p["tolerance"])}
        logits = want.logits if isinstance(want, NonFinite) else want
        expect["outputs"] = {"logits": self.array(case.id, "logits", logits, "f32")}
        if isinstance(want, NonFinite):  # decision forward.nonfinite: the call after these rows fails
            expect["refused_after_rows"] = int(len(logits))
            expect["statuses"] = ["ML_E_FORMAT"]
        return {
            "op": "ml_forward",
            "args": {"ctx": int(p.get("ctx") or 0), "mode": p["mode"]},
            "inputs": {"model": {"file": model}, "tokens": self.array(case.id, "tokens", p["tokens"], "i32")},
            "expect": expect,
        }

    def _bitnet(self, case) -> dict:
        from mlconf.areas.bitnet import run_embed, run_i2s

        p, cid = case.params, case.id
        op = p["op"]
        if op in ("pack", "act", "matmul"):
            if op == "pack":
                call, inputs = "ml_i2s_quantize", {"w": self.array(cid, "w", p["w"], "f32")}
                args = {"rows": int(np.shape(p["w"])[0]), "cols": int(np.shape(p["w"])[1])}
            elif op == "act":
                x = np.asarray(p["x"], np.float32)
                call, inputs, args = (
                    "ml_i2s_quantize_act",
                    {"x": self.array(cid, "x", x, "f32")},
                    {"rows": int(x.shape[0]), "cols": int(x.shape[1])},
                )
            else:
                x = np.asarray(p["x"], np.float32)
                call = "ml_i2s_matmul"
                inputs = {
                    "payload": self.raw(cid, "payload", p["payload"]),
                    "x": self.array(cid, "x", x, "f32"),
                }
                args = {"rows": int(p["shape"][0]), "cols": int(p["shape"][1]), "n": int(x.shape[0])}
            if case.compare == "refused":
                return {
                    "op": call,
                    "args": args,
                    "inputs": inputs,
                    "expect": {"compare": "refused", "statuses": REFUSALS},
                }
            frm = "reference" if p.get("expected_from") else "spec"
            want = (
                self.work.expected_from_reference(case, run_i2s) if p.get("expected_from") else case.expected
            )
            if op == "pack":
                outs = {"payload": self.raw(cid, "payload_out", want)}
            elif op == "act":
                outs = {
                    "q": self.raw(cid, "q", want[0], "i8"),
                    "scale": self.raw(cid, "scale", want[1], "f32"),
                    "sum": self.raw(cid, "sum", want[2], "i32"),
                }
            else:
                outs = {"y": self.raw(cid, "y", want, "f32")}
            return {
                "op": call,
                "args": args,
                "inputs": inputs,
                "expect": {"compare": "bit-exact", "from": frm, "outputs": outs},
            }
        model = {"file": self.golden(p["model"])}
        if op == "open":
            path, _ = self.work.damaged_gguf(p["model"], p["damage"])
            damaged = {"file": self.rel(path)}
            if p["damage"] in fixtures.SPECIAL_PATHS:
                damaged["special"] = p["damage"]
            return {
                "op": "ml_embed_load",
                "args": {"reading": 0},
                "inputs": {"model": damaged},
                "expect": {"compare": "refused", "statuses": REFUSALS},
            }
        if op == "embed_call":  # a bad call on a valid model; a None token stands for the vocab size
            vocab = _gguf_vocab(p["model"])
            toks = [vocab if t is None else t for t in p["tokens"]]
            return {
                "op": "ml_embed",
                "args": {"pooling": POOLING.get(p["pooling"], 0), "normalize": 0, "reading": 0},
                "inputs": {
                    "model": model,
                    "tokens": self.array(cid, "tokens", np.array(toks, np.int64), "i32"),
                },
                "expect": {"compare": "refused", "statuses": ["ML_E_ARG"]},
            }
        frm = "reference" if case.expected is None else "oracle"
        want = (
            case.expected if case.expected is not None else self.work.expected_from_reference(case, run_embed)
        )
        return {
            "op": "ml_embed",
            "args": {
                "pooling": POOLING[p["pooling"]],
                "normalize": int(bool(p["normalize"])),
                "reading": READING[p.get("reading")],
            },
            "inputs": {"model": model, "tokens": self.array(cid, "tokens", p["tokens"], "i32")},
            "expect": {
                "compare": "toleranced",
                "from": frm,
                "tolerance": self.tolerance(p["tolerance"]),
                "outputs": {"embedding": self.array(cid, "embedding", want, "f32")},
            },
        }


def _gguf_vocab(path: Path) -> int:
    from mlconf.backends.reference import ReferenceBackend

    session = ReferenceBackend().open_embedder(str(path))
    try:
        return int(session.vocab)
    finally:
        session.close()


def export(outdir: str | Path, areas: list[str] | None = None) -> dict:
    """Write the fixtures and every case of ``areas`` (default all) under ``outdir``, and manifest.json;
    returns the manifest."""
    out = Path(outdir)
    ex = Exporter(out)
    fxs = fixtures.generate(out)
    ex.work._written = True  # the Workdir reads the fixtures just written
    selected = case_list.collect(areas)
    entries = [ex.entry(c) for c in selected]
    manifest = {
        "format": FORMAT,
        "spec": "MLB v1",
        "mlconf_version": _version(),
        "statuses": specs.load("mlb_errors")["statuses"],
        "areas": list(areas or case_list.AREAS),
        "cases": entries,
        "fixtures": [dict(vars(f)) for f in fxs],
    }
    atomic_write(out / "manifest.json", [json.dumps(manifest, indent=1, ensure_ascii=False).encode()])
    return manifest


def _version() -> str:
    from mlconf import __version__

    return __version__


__all__ = ["FORMAT", "export"]
