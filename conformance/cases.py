"""Every conformance case, as data built from the specs and the goldens.

A Case names the capability it needs, the spec row it comes from and its expectation. Areas:
  header  valid fixtures of specs/mlb_fixtures.yaml: the loader must accept them
  loader  malformed and edge fixtures of specs/mlb_errors.yaml: the status the spec gives
  quant   hand-derived edge vectors of specs/quant.yaml and the gguf-py golden (bit-exact)
  forward golden/logits: transformers' logits of converted tiny models, within
          specs/tolerances.yaml logits_runtime_vs_oracle, prefilled and decoded token by token
  tokenizer .mlt loader statuses (specs/mlt.yaml), and token ids and the bytes the ids decode to
          against HF tokenizers' goldens
  bitnet  I2_S packing, int8 activations and the BitLinear matmul (specs/i2s.yaml edge cases and
          golden/bitnet/i2s_edge.npz bit-exact, seeded random inputs bit-exact against the reference,
          refusals), and BitNet GGUF embeddings (golden/bitnet/NAME.gguf + NAME.npz from a PyTorch
          BitLinear oracle, within specs/tolerances.yaml embeddings_vs_oracle; against the
          reference within embeddings_runtime_vs_reference; damaged GGUFs refused), and the GGUF
          loader fixtures of specs/gguf.yaml (the hostile-file classes: status and rule)
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlconf import fixtures, specs, versions
from mlconf.backends.reference import layout
from mlconf.golden import GOLDEN_DIR

AREAS = ("header", "loader", "quant", "forward", "tokenizer", "bitnet")
FORWARD_MODES = ("prefill", "decode")  # areas/forward.py forward_calls: one call, or one token at a time


@dataclass(frozen=True)
class Case:
    id: str  # stable, selectable with -k: "<area>/<spec row>/<name>"
    area: str
    capability: str  # the backend capability it needs (backends.CAPABILITIES)
    spec: str  # where it comes from: "<spec file>#<row>"
    compare: str  # status | bit-exact | refused | toleranced
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    expected: Any = field(default=None, hash=False, compare=False)


# ---------------------------------------------------------------- header / loader
def _fixture_cases(target: specs.Version | None = None) -> list[Case]:
    """``target``: a Krafla version; the .mlb expectations are then the spec's for a runtime of
    that version (versions.expected, derived by the runner from each file's bytes)."""
    out = []
    for f in fixtures.catalog():
        if f.file.startswith("gguf/"):
            name = f.file.rsplit("/", 1)[-1].removesuffix(".gguf")
            row = f"gguf.yaml#{f.rule or f.kind}" + ("" if f.rule else f".{name}")
            cid = f"bitnet/gguf/{f.rule or f.kind}/{name}"  # area bitnet: decision gguf.area
            out.append(Case(cid, "bitnet", "load_gguf", row, "status", {"fixture": f}, f.expected))
            continue
        if f.file.startswith("tokenizer/"):
            name = f.file.rsplit("/", 1)[-1].removesuffix(".mlt")
            row = f"mlt.yaml#{f.rule}" if f.rule else f"mlconf/mlt_fixtures.py#{f.base}"
            cid = f"tokenizer/load/{f.rule or 'valid'}/{name}"
            out.append(Case(cid, "tokenizer", "load_tokenizer", row, "status", {"fixture": f}, f.expected))
            continue
        params = {"fixture": f} if target is None else {"fixture": f, "target_version": target}
        name = f.file.rsplit("/", 1)[-1].removesuffix(".mlb")
        if f.kind == "valid":
            out.append(
                Case(
                    f"header/{f.base}",
                    "header",
                    "load",
                    f"mlb_fixtures.yaml#{f.base}",
                    "status",
                    params,
                    f.expected,
                )
            )
        elif f.kind == "malformed":
            out.append(
                Case(
                    f"loader/{f.rule}/{name}",
                    "loader",
                    "load",
                    f"mlb_errors.yaml#{f.rule}",
                    "status",
                    params,
                    f.expected,
                )
            )
        else:
            out.append(
                Case(
                    f"loader/accepted/{name}",
                    "loader",
                    "load",
                    f"mlb_errors.yaml#accepted.{name}",
                    "status",
                    params,
                    f.expected,
                )
            )
    return out


def claims(case: Case) -> tuple[str, ...]:
    """The variants of its capability a case needs (backends.SUB_CAPABILITIES), () for none."""
    p = case.params
    if case.capability == "quantize_q8_0":
        return ("quantize_q8_0.f16",) if p.get("f16") else ()
    if case.capability == "quantize_q4_0":
        out = [f"quantize_q4_0.{p['rule']}"] + ["quantize_q4_0.f16"] * bool(p.get("f16"))
        return tuple(out + ["quantize_q4_0.importance"] * (p.get("importance") is not None))
    return ()


# ---------------------------------------------------------------- quantizers
QUANT_OPS = {  # op -> (capability, call parameters)
    "q8_0": ("quantize_q8_0", {"f16": False}),
    "q8_0_f16": ("quantize_q8_0", {"f16": True}),
    "q4_0_round": ("quantize_q4_0", {"rule": "round", "f16": False}),
    "q4_0_round_f16": ("quantize_q4_0", {"rule": "round", "f16": True}),
    "q4_0_search": ("quantize_q4_0", {"rule": "search", "f16": False}),
    "q4_0_search_f16": ("quantize_q4_0", {"rule": "search", "f16": True}),
}


def _value(v: Any) -> float:
    return float.fromhex(v) if isinstance(v, str) else float(v)


def block_values(spec: Any, n: int = 32) -> list[float]:
    """A block given as a list, or as {fill: V, at: {INDEX: V}} (specs/quant.yaml edge_cases)."""
    if isinstance(spec, dict):
        vals = [_value(spec.get("fill", 0))] * n
        for i, v in (spec.get("at") or {}).items():
            vals[int(i)] = _value(v)
        return vals
    if len(spec) != n:
        raise ValueError(f"a block has {n} values, got {len(spec)}")
    return [_value(v) for v in spec]


def encode_expected(op: str, levels: list[int], d: float) -> tuple[bytes, bytes]:
    """The stored bytes of one block: quants (int8, or Q4 nibbles) and the scale (f32 or f16)."""
    lv = np.array(levels, dtype=np.int64)
    if op.startswith("q8_0"):
        q = lv.astype(np.int8).tobytes()
    else:
        n = (lv + 8).astype(np.uint8)
        q = (n[:16] | (n[16:] << 4)).astype(np.uint8).tobytes()
    dt = "<f2" if op.endswith("_f16") else "<f4"
    return q, np.array([d], dtype=dt).tobytes()


def _edge_cases() -> list[Case]:
    out = []
    for e in specs.load("quant").get("edge_cases") or []:
        cap, call = QUANT_OPS[e["op"]]
        x = np.array(block_values(e["x"]), dtype=np.float32)
        levels = [int(v) for v in block_values(e["expect"]["q"])]
        expected = encode_expected(e["op"], levels, _value(e["expect"]["d"]))
        out.append(
            Case(
                f"quant/{e['op']}/{e['name']}",
                "quant",
                cap,
                f"quant.yaml#edge_cases.{e['name']}",
                "bit-exact",
                {**call, "x": x},
                expected,
            )
        )
    for e in specs.load("quant").get("refused") or []:
        cap, call = QUANT_OPS[e["op"]]
        x = np.array(block_values(e["x"]), dtype=np.float32)
        out.append(
            Case(
                f"quant/{e['op']}/refused/{e['name']}",
                "quant",
                cap,
                f"quant.yaml#refused.{e['name']}",
                "refused",
                {**call, "x": x},
                None,
            )
        )
    return out


# Matrices assembled from the edge blocks of one op (quant.yaml `assembled`): every rule quantizes
# block by block (the search too, without an importance), so the expectation of a matrix is its
# blocks' hand-derived bytes in row-major order. They catch what one block cannot: a scale per
# tensor or per row, blocks, rows or nibbles in another order, a wrong row stride.
def _assembled_layouts(blocks: list[dict]) -> dict[str, list[list[dict]]]:
    by_amax = sorted(blocks, key=lambda b: float(np.max(np.abs(b["x"]))))
    large, small = by_amax[-1], by_amax[0]
    tiny = next((b for b in by_amax if np.max(np.abs(b["x"])) > 0), large)
    rev = blocks[::-1] + blocks[-1:] * (len(blocks) % 2)  # pad with the first block: even rows
    return {
        "one_row": [blocks],
        "one_block_per_row": [[b] for b in blocks],
        "two_per_row_reversed": [rev[i : i + 2] for i in range(0, len(rev), 2)],
        "zero_row_between_largest": [[large, large], [small, small], [large, large]],
        "last_block_tiny": [[large, large, tiny], [large, large, tiny]],
    }


def _assembled_cases() -> list[Case]:
    edges: dict[str, list[dict]] = {}
    for e in specs.load("quant").get("edge_cases") or []:
        levels = [int(v) for v in block_values(e["expect"]["q"])]
        q, d = encode_expected(e["op"], levels, _value(e["expect"]["d"]))
        x = np.array(block_values(e["x"]), dtype=np.float32)
        edges.setdefault(e["op"], []).append({"name": e["name"], "x": x, "q": q, "d": d})
    out = []
    for op, blocks in edges.items():
        if len(blocks) < 2:
            continue
        cap, call = QUANT_OPS[op]
        for name, rows in _assembled_layouts(blocks).items():
            x = np.array([np.concatenate([b["x"] for b in row]) for row in rows], dtype=np.float32)
            expected = (b"".join(b["q"] for r in rows for b in r), b"".join(b["d"] for r in rows for b in r))
            grid = "; ".join(", ".join(b["name"] for b in r) for r in rows)
            out.append(
                Case(
                    f"quant/{op}/matrix/{name}",
                    "quant",
                    cap,
                    f"quant.yaml#edge_cases of {op}, assembled by rows: {grid}",
                    "bit-exact",
                    {**call, "x": x},
                    expected,
                )
            )
    return out


def _matrix_cases() -> list[Case]:
    """quant.yaml `matrix_cases`: whole matrices with an importance vector, hand-derived."""
    out = []
    for e in specs.load("quant").get("matrix_cases") or []:
        cap, call = QUANT_OPS[e["op"]]
        cols = int(e["cols"])
        x = np.array([block_values(r, cols) for r in e["x"]], dtype=np.float32)
        imp = (
            None if e.get("importance") is None else np.array(block_values(e["importance"], cols), np.float32)
        )
        parts = [
            encode_expected(e["op"], [int(v) for v in block_values(b["q"])], _value(b["d"]))
            for b in e["expect"]
        ]
        if len(parts) != x.size // 32:
            raise ValueError(
                f"quant.yaml matrix_cases {e['name']}: {len(parts)} expected blocks for {x.size // 32}"
            )
        out.append(
            Case(
                f"quant/{e['op']}/matrix/{e['name']}",
                "quant",
                cap,
                f"quant.yaml#matrix_cases.{e['name']}",
                "bit-exact",
                {**call, "x": x, "importance": imp},
                (b"".join(q for q, _ in parts), b"".join(d for _, d in parts)),
            )
        )
    return out


def _golden_cases() -> list[Case]:
    path = GOLDEN_DIR / "q4_0_round_gguf.npz"
    if not path.exists():
        return []
    g = np.load(path)
    x = g["x"].astype(np.float32)
    expected = (g["qs"].tobytes(), g["d"].tobytes())
    return [
        Case(
            "quant/q4_0_round_f16/gguf_golden",
            "quant",
            "quantize_q4_0",
            "quant.yaml#q4_0_round (oracle gguf-py, golden/q4_0_round_gguf.npz)",
            "bit-exact",
            {"rule": "round", "f16": True, "x": x},
            expected,
        )
    ]


def _forward_cases(target: specs.Version | None = None) -> list[Case]:
    """Each golden model prefilled, decoded and against the reference; a model that needs a Krafla
    version newer than ``target`` becomes one case instead: the runtime must refuse to load it."""
    out = []
    for npz in sorted((GOLDEN_DIR / "logits").glob("*.npz")):
        name = npz.stem
        head = versions.read_head(npz.with_suffix(".mlb"))
        needs = versions.file_version(head)
        if target is not None and needs is not None and needs > target:
            status, rule, _ = versions.expectation("ML_OK", "", head, target)
            out.append(
                Case(
                    f"forward/{name}/refused_by_older",
                    "forward",
                    "load",
                    f"mlb_header.yaml#versions (golden/logits/{name}.mlb needs Krafla "
                    f"{specs.format_version(needs)})",
                    "status",
                    {"path": npz.with_suffix(".mlb"), "rule": rule},
                    status,
                )
            )
            continue
        g = np.load(npz)
        spec = f"tolerances.yaml#logits_runtime_vs_oracle (golden/logits/{name}, oracle transformers)"
        for mode in FORWARD_MODES:
            params = {
                "model": npz.with_suffix(".mlb"),
                "tokens": g["tokens"],
                "mode": mode,
                "tolerance": "logits_runtime_vs_oracle",
            }
            out.append(
                Case(f"forward/{name}/{mode}", "forward", "forward", spec, "toleranced", params, g["logits"])
            )
        # cross-backend: the reference backend's runtime logits are the expectation (not run on it)
        params = {
            "model": npz.with_suffix(".mlb"),
            "tokens": g["tokens"],
            "mode": "prefill",
            "tolerance": "logits_runtime_vs_reference",
            "expected_from": "reference",
        }
        out.append(
            Case(
                f"forward/{name}/vs_reference",
                "forward",
                "forward",
                f"tolerances.yaml#logits_runtime_vs_reference (golden/logits/{name})",
                "toleranced",
                params,
                None,
            )
        )
        # the whole context (the goldens' tokens repeated to max_seq): past a 64-key tile and in
        # more than one prefill chunk, so that a tiled attention's rescaling between key tiles and
        # a chunked prefill's reuse of the cache are exercised
        long = np.resize(g["tokens"], layout.parse_header(head)["max_seq"]).astype(np.int32)
        out.append(
            Case(
                f"forward/{name}/long_vs_reference",
                "forward",
                "forward",
                f"tolerances.yaml#logits_runtime_vs_reference (golden/logits/{name}, {long.size} tokens: "
                "the whole context)",
                "toleranced",
                {**params, "tokens": long},
                None,
            )
        )
    return out


def _fixture_run_cases(target: specs.Version | None = None) -> list[Case]:
    """Every valid and accepted .mlb fixture fully loaded (ml_load: weights mapped, run-time state
    allocated) and run for two tokens, prefilled and one by one, against the reference backend's
    logits: a loader that accepts a file must also run it (issue 17). The files with NaN weights
    fail the forward where the reference does (decision forward.nonfinite). Fixtures a Krafla
    ``target`` cannot read are left out (their loader cases expect the refusal)."""
    out = []
    for f in fixtures.catalog():
        if f.kind not in ("valid", "accepted") or not f.file.endswith(".mlb"):
            continue
        head = fixtures.head_bytes(f)
        needs = versions.file_version(head)
        if target is not None and needs is not None and needs > target:
            continue
        n = min(2, layout.parse_header(head)["max_seq"])  # minimal_dims holds one position
        name = f.base if f.kind == "valid" else f.file.rsplit("/", 1)[-1].removesuffix(".mlb")
        for mode in FORWARD_MODES:
            out.append(
                Case(
                    f"forward/fixture/{f.kind}/{name}/{mode}",
                    "forward",
                    "forward",
                    f"tolerances.yaml#logits_runtime_vs_reference ({f.file}, {n} tokens)",
                    "toleranced",
                    {
                        "fixture": f,
                        "tokens": np.arange(1, n + 1),
                        "mode": mode,
                        "tolerance": "logits_runtime_vs_reference",
                        "expected_from": "reference",
                    },
                )
            )
    return out


def _tokenizer_golden_cases() -> list[Case]:
    """HF tokenizers' ids of golden/tokenizers/NAME.json for every text of
    specs/tokenizer_texts.yaml; the runner converts NAME.json to .mlt with tools/convert_tokenizer."""
    import json

    out = []
    texts = specs.load("tokenizer_texts")["texts"]
    for path in sorted((GOLDEN_DIR / "tokenizers").glob("*.ids.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        name = path.name.removesuffix(".ids.json")
        for text_name, rec in doc["ids"].items():
            out.append(
                Case(
                    f"tokenizer/encode/{name}/{text_name}",
                    "tokenizer",
                    "encode",
                    f"tokenizer_texts.yaml#{text_name} (golden/tokenizers/{name}.json, oracle "
                    f"{doc['oracle']})",
                    "ids",
                    {"golden": GOLDEN_DIR / "tokenizers" / doc["tokenizer"], "text": texts[text_name]},
                    rec["ids"],
                )
            )
    return out


# goldens whose .mlt is also run with every merge listed twice (one of each kind)
DUPLICATE_MERGES = ("llama2", "gpt2")


def _tokenizer_duplicate_merge_cases() -> list[Case]:
    """The encode cases of DUPLICATE_MERGES on their .mlt with every merge listed twice, reversed
    and then in rank order (areas/tokenizer.py duplicate_merges): a pair listed twice keeps its last
    rank (decision tok.bpe_start), so HF's ids of the golden are still the expectation."""
    out = []
    for c in _tokenizer_golden_cases():
        name, text_name = c.id.split("/")[2:]
        if name in DUPLICATE_MERGES:
            out.append(
                Case(
                    f"tokenizer/encode/{name}_duplicate_merges/{text_name}",
                    c.area,
                    c.capability,
                    f"decisions.yaml#tok.bpe_start: {c.spec}, every merge listed twice",
                    c.compare,
                    {**c.params, "variant": "duplicate_merges"},
                    c.expected,
                )
            )
    return out


def _tokenizer_decode_cases() -> list[Case]:
    """HF tokenizers' text of the golden ids of every text, the BOS the tokenizer prepends left out
    (ids[decode_from:] of NAME.ids.json), as UTF-8 bytes: what decode(ids) must give (decision
    tok.decode)."""
    import json

    out = []
    for path in sorted((GOLDEN_DIR / "tokenizers").glob("*.ids.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        name, skip = path.name.removesuffix(".ids.json"), doc["decode_from"]
        for text_name, rec in doc["ids"].items():
            out.append(
                Case(
                    f"tokenizer/decode/{name}/{text_name}",
                    "tokenizer",
                    "encode",
                    f"decisions.yaml#tok.decode: tokenizer_texts.yaml#{text_name} (golden/tokenizers/"
                    f"{name}.json, ids[{skip}:], oracle {doc['oracle']})",
                    "bit-exact",
                    {"golden": GOLDEN_DIR / "tokenizers" / doc["tokenizer"], "ids": rec["ids"][skip:]},
                    rec["decoded"].encode("utf-8"),
                )
            )
    return out


# ---------------------------------------------------------------- bitnet (I2_S, embeddings)
I2S_BLOCK, I2S_TAIL = 128, 32  # specs/i2s.yaml block, tail_bytes
BITNET_DIR = GOLDEN_DIR / "bitnet"
EMBED_POOLINGS = ("mean", "cls", "last")
EMBED_SEQUENCES = 3  # tokens_0 .. tokens_2 of golden/bitnet/NAME.npz
# A long sequence, compared with the reference only (the goldens' are 1, 5 and 12 tokens): past
# two key tiles of 64 and nine query tiles of 16 of a tiled (flash-style) attention, so that its
# running max / sum rescaling between tiles and its masks at tile edges are exercised, and far
# past Gemma's sliding window.
EMBED_LONG = 150
# seeded random inputs compared bit for bit with the reference backend: (rows, cols, n tokens)
I2S_RANDOM = ((1, 128, 1), (3, 256, 2), (17, 384, 5), (64, 512, 7), (5, 1280, 3))
# I2_S inputs every backend must refuse (specs/i2s.yaml `refused`): name -> (shape, NaN at flat index)
I2S_REFUSED = {"cols_64": ((1, 64), None), "cols_130": ((2, 130), None), "nan_weight": ((2, 128), 77)}
# damaged copies of a golden GGUF that open_embedder must refuse (areas/bitnet.py damage_gguf makes them)
GGUF_DAMAGE = ("nan_norm", "truncated", "code3")
# calls on a valid embedder that must raise InputError: name -> (tokens, pooling)
EMBED_BAD_CALLS = {
    "no_tokens": ([], "mean"),
    "token_out_of_range": ([1, 2, None], "mean"),
    "negative_token": ([1, -1], "mean"),
    "unknown_pooling": ([1, 2], "max"),
}


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """2-bit codes (flat, length a multiple of 128) -> packed bytes, specs/i2s.yaml `layout`:
    byte j of a block = c[j] << 6 | c[j+32] << 4 | c[j+64] << 2 | c[j+96]."""
    c = np.asarray(codes, dtype=np.uint8).reshape(-1, 4, 32)
    return ((c[:, 0] << 6) | (c[:, 1] << 4) | (c[:, 2] << 2) | c[:, 3]).reshape(-1).astype(np.uint8)


def i2s_payload_bytes(packed: bytes | np.ndarray, d: float) -> bytes:
    """packed codes, the f32 scale (little endian), 28 zero bytes."""
    scale = np.array([d], dtype="<f4").tobytes()
    return bytes(np.asarray(packed, dtype=np.uint8)) + scale + bytes(I2S_TAIL - 4)


def _i2s_spec_cases() -> list[Case]:
    doc = specs.load("i2s")
    out = []
    edge = doc.get("edge_cases") or []
    packed_of = {}  # w values -> payload, for the bitlinear case's weight
    for e in edge:
        name, op = e["name"], e["op"]
        spec = f"i2s.yaml#edge_cases.{name}"
        exp = e["expect"]
        if op == "ternarize":
            w = np.array(block_values(e["w"], I2S_BLOCK), dtype=np.float32).reshape(1, -1)
            payload = bytes.fromhex(exp["packed"]) + bytes.fromhex(exp["payload_tail"])
            packed_of[w.tobytes()] = payload
            out.append(
                Case(
                    f"bitnet/i2s_pack/{name}",
                    "bitnet",
                    "i2s",
                    spec,
                    "bit-exact",
                    {"op": "pack", "w": w, "d": _value(exp["d"])},
                    payload,
                )
            )
        elif op == "activations":
            x = np.array(block_values(e["x"], I2S_BLOCK), dtype=np.float32).reshape(1, -1)
            xq = np.array([int(v) for v in block_values(exp["xq"], I2S_BLOCK)], dtype=np.int8)
            expected = (
                xq.tobytes(),
                np.array([_value(exp["scale"])], dtype="<f4").tobytes(),
                np.array([int(exp["act_sum"])], dtype="<i4").tobytes(),
            )
            out.append(
                Case(
                    f"bitnet/i2s_act/{name}",
                    "bitnet",
                    "i2s",
                    spec,
                    "bit-exact",
                    {"op": "act", "x": x},
                    expected,
                )
            )
    for e in edge:
        if e["op"] != "dot":
            continue
        name, exp, cols = e["name"], e["expect"], int(e["cols"])
        codes = np.array([int(v) for v in block_values(e["codes"], cols)], dtype=np.uint8)
        payload = i2s_payload_bytes(pack_codes(codes), _value(e["d"]))
        x = np.array(block_values(e["x"], cols), dtype=np.float32).reshape(1, -1)
        y = np.array([_value(exp["y"])], dtype="<f4").tobytes()
        out.append(
            Case(
                f"bitnet/i2s_matmul/{name}",
                "bitnet",
                "i2s",
                f"i2s.yaml#edge_cases.{name}",
                "bit-exact",
                {
                    "op": "matmul",
                    "payload": payload,
                    "shape": (1, cols),
                    "x": x,
                    "note": f"sumi {exp['sumi']} (bitnet.cpp's AVX2 dot: {exp['bitnet_cpp_sumi']}), "
                    f"act_sum {exp['act_sum']}",
                },
                y,
            )
        )
    for e in edge:
        if e["op"] != "bitlinear":
            continue
        name, exp = e["name"], e["expect"]
        w = np.array(block_values(e["w"], I2S_BLOCK), dtype=np.float32).reshape(1, -1)
        x = np.array(block_values(e["x"], I2S_BLOCK), dtype=np.float32).reshape(1, -1)
        payload = packed_of.get(w.tobytes())
        if payload is None:
            raise ValueError(
                f"i2s.yaml#edge_cases.{name}: its w is the w of no ternarize edge case, so the "
                "payload it multiplies is not stated by the spec"
            )
        y = np.array([_value(exp["y"])], dtype="<f4").tobytes()
        out.append(
            Case(
                f"bitnet/i2s_matmul/{name}",
                "bitnet",
                "i2s",
                f"i2s.yaml#edge_cases.{name}",
                "bit-exact",
                {
                    "op": "matmul",
                    "payload": payload,
                    "shape": w.shape,
                    "x": x,
                    "note": f"sumi {exp['sumi']}, act_sum {exp['act_sum']}",
                },
                y,
            )
        )
    for name, (shape, nan_at) in I2S_REFUSED.items():
        w = np.linspace(-1, 1, shape[0] * shape[1], dtype=np.float32).reshape(shape)
        if nan_at is not None:
            w.reshape(-1)[nan_at] = np.nan
        out.append(
            Case(
                f"bitnet/i2s_pack/refused/{name}",
                "bitnet",
                "i2s",
                "i2s.yaml#refused",
                "refused",
                {"op": "pack", "w": w},
            )
        )
    x = np.linspace(-3, 3, 2 * 256, dtype=np.float32).reshape(2, 256)
    x[1, 200] = np.inf
    out.append(
        Case(
            "bitnet/i2s_act/refused/inf_activation",
            "bitnet",
            "i2s",
            "i2s.yaml#refused",
            "refused",
            {"op": "act", "x": x},
        )
    )
    codes = np.ones(4 * 256, dtype=np.uint8)
    codes[300] = 3
    shape = (4, 256)
    x = np.linspace(-1, 1, 2 * 256, dtype=np.float32).reshape(2, 256)
    out.append(
        Case(
            "bitnet/i2s_matmul/refused/code3",
            "bitnet",
            "i2s",
            "i2s.yaml#layout.reading",
            "refused",
            {"op": "matmul", "payload": i2s_payload_bytes(pack_codes(codes), 0.5), "shape": shape, "x": x},
        )
    )
    good = i2s_payload_bytes(pack_codes(np.ones(4 * 256, dtype=np.uint8)), 0.5)
    out.append(
        Case(
            "bitnet/i2s_matmul/refused/payload_length",
            "bitnet",
            "i2s",
            "i2s.yaml#layout.reading",
            "refused",
            {"op": "matmul", "payload": good[:-1], "shape": shape, "x": x},
        )
    )
    return out


def _i2s_golden_cases() -> list[Case]:
    """golden/bitnet/i2s_edge.npz: w_NAME float32 and payload_NAME uint8 (an independent packer)."""
    path = BITNET_DIR / "i2s_edge.npz"
    if not path.exists():
        return []
    out = []
    with np.load(path) as g:
        for key in sorted(k for k in g.files if k.startswith("w_")):
            name = key.removeprefix("w_")
            if f"payload_{name}" not in g.files:
                continue
            out.append(
                Case(
                    f"bitnet/i2s_pack/golden/{name}",
                    "bitnet",
                    "i2s",
                    f"i2s.yaml#ternarize (golden/bitnet/i2s_edge.npz {name})",
                    "bit-exact",
                    {"op": "pack", "w": g[key].astype(np.float32)},
                    g[f"payload_{name}"].astype(np.uint8).tobytes(),
                )
            )
    return out


def _i2s_random_cases() -> list[Case]:
    """Seeded random inputs; the reference backend's answer is the expectation (not run on it)."""
    out = []
    for seed, (rows, cols, n) in enumerate(I2S_RANDOM):
        rng = np.random.default_rng(1000 + seed)
        tag = f"{rows}x{cols}_n{n}_seed{seed}"
        w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2)).astype(np.float32)
        x = (rng.standard_normal((n, cols)) * rng.uniform(0.1, 10)).astype(np.float32)
        x[:, rng.integers(0, cols)] *= 20  # an outlier column sets amax
        codes = rng.integers(0, 3, rows * cols).astype(np.uint8)
        payload = i2s_payload_bytes(pack_codes(codes), float(np.float32(rng.uniform(1e-3, 1))))
        common = {"expected_from": "reference", "seed": 1000 + seed}
        spec = "i2s.yaml (seeded random input, the reference backend as expectation)"
        out += [
            Case(
                f"bitnet/i2s_pack/random_{tag}/vs_reference",
                "bitnet",
                "i2s",
                spec,
                "bit-exact",
                {"op": "pack", "w": w, **common},
            ),
            Case(
                f"bitnet/i2s_act/random_{tag}/vs_reference",
                "bitnet",
                "i2s",
                spec,
                "bit-exact",
                {"op": "act", "x": x, **common},
            ),
            Case(
                f"bitnet/i2s_matmul/random_{tag}/vs_reference",
                "bitnet",
                "i2s",
                spec,
                "bit-exact",
                {"op": "matmul", "payload": payload, "shape": (rows, cols), "x": x, **common},
            ),
        ]
    return out


def bitnet_goldens() -> list[str]:
    """Names of the golden embedding models: golden/bitnet/NAME.gguf with NAME.npz."""
    if not BITNET_DIR.is_dir():
        return []
    return sorted(p.stem for p in BITNET_DIR.glob("*.gguf") if p.with_suffix(".npz").exists())


# A golden's readings: npz key prefix -> (the reading passed to open_embedder, None for the file's
# own, and the case id's infix); reading -> (tolerance against the oracle, against the reference).
EMBED_READINGS = {"": (None, ""), "ternary_": ("ternary", "ternary/")}
EMBED_TOLERANCES = {
    "ternary": ("embeddings_vs_oracle", "embeddings_runtime_vs_reference"),
    "float": ("embeddings_float_vs_oracle", "embeddings_float_vs_reference"),
}


def _embed_cases() -> list[Case]:
    out = []
    for name in bitnet_goldens():
        gguf, npz = BITNET_DIR / f"{name}.gguf", BITNET_DIR / f"{name}.npz"
        with np.load(npz) as g:
            data = {k: g[k] for k in g.files}
        own = str(data.get("reading", "ternary"))  # the file's own reading (golden_bitnet.EmbedCase)
        declared = gguf_pooling(gguf)  # what pooling None (ML_POOL_MODEL) must give
        for prefix, (reading, infix) in EMBED_READINGS.items():
            vs_oracle, vs_reference = EMBED_TOLERANCES[reading or own]
            for i in range(EMBED_SEQUENCES):
                if f"tokens_{i}" not in data:
                    continue
                tokens = data[f"tokens_{i}"].astype(np.int32)
                for pooling in EMBED_POOLINGS:
                    for normalize in (False, True):
                        key = f"{prefix}{pooling}_norm_{i}" if normalize else f"{prefix}{pooling}_{i}"
                        if key not in data:
                            continue
                        label = f"{infix}{i}/{pooling}_norm" if normalize else f"{infix}{i}/{pooling}"
                        params = {
                            "op": "embed",
                            "model": gguf,
                            "tokens": tokens,
                            "pooling": pooling,
                            "normalize": normalize,
                            "reading": reading,
                        }
                        out.append(
                            Case(
                                f"bitnet/embed/{name}/{label}",
                                "bitnet",
                                "embed",
                                f"tolerances.yaml#{vs_oracle} (golden/bitnet/{name}, "
                                f"{reading or own} reading)",
                                "toleranced",
                                {**params, "tolerance": vs_oracle},
                                data[key].astype(np.float32),
                            )
                        )
                        out.append(
                            Case(
                                f"bitnet/embed/{name}/{label}/vs_reference",
                                "bitnet",
                                "embed",
                                f"tolerances.yaml#{vs_reference} (golden/bitnet/{name})",
                                "toleranced",
                                {**params, "tolerance": vs_reference, "expected_from": "reference"},
                            )
                        )
                        if pooling == declared and not normalize:  # the model's own pooling
                            out.append(
                                Case(
                                    f"bitnet/embed/{name}/{infix}{i}/model_pooling",
                                    "bitnet",
                                    "embed",
                                    f"mlrt.h#ML_POOL_MODEL: the GGUF's pooling_type is {pooling} "
                                    f"(tolerances.yaml#{vs_oracle}, golden/bitnet/{name})",
                                    "toleranced",
                                    {**params, "pooling": None, "tolerance": vs_oracle},
                                    data[key].astype(np.float32),
                                )
                            )
        # the goldens' own tokens, repeated to EMBED_LONG (valid ids of the model's vocabulary)
        long = np.resize(np.concatenate([data[f"tokens_{i}"] for i in range(EMBED_SEQUENCES)]), EMBED_LONG)
        for pooling in EMBED_POOLINGS:
            out.append(
                Case(
                    f"bitnet/embed/{name}/long_{EMBED_LONG}/{pooling}/vs_reference",
                    "bitnet",
                    "embed",
                    f"tolerances.yaml#{EMBED_TOLERANCES[own][1]} (golden/bitnet/{name}, {EMBED_LONG} "
                    "tokens: across attention tiles)",
                    "toleranced",
                    {
                        "op": "embed",
                        "model": gguf,
                        "tokens": long.astype(np.int32),
                        "pooling": pooling,
                        "normalize": False,
                        "reading": None,
                        "tolerance": EMBED_TOLERANCES[own][1],
                        "expected_from": "reference",
                    },
                )
            )
        for kind in GGUF_DAMAGE:
            if kind == "code3" and not any(t["type"] == GGUF_I2_S for t in gguf_tensors(gguf)):
                continue
            out.append(
                Case(
                    f"bitnet/embed/refused/{name}/{kind}",
                    "bitnet",
                    "embed",
                    f"mlrt.h#ml_embed_load (golden/bitnet/{name}.gguf, damaged: {kind})",
                    "refused",
                    {"op": "open", "model": gguf, "damage": kind},
                )
            )
    names = bitnet_goldens()
    if names:
        gguf = BITNET_DIR / f"{names[0]}.gguf"
        for kind in fixtures.SPECIAL_PATHS:  # not a regular file: ML_E_IO (loader.special_files)
            out.append(
                Case(
                    f"bitnet/embed/refused/path/{kind}",
                    "bitnet",
                    "embed",
                    "decisions.yaml#loader.special_files (mlrt.h#ml_embed_load)",
                    "refused",
                    {"op": "open", "model": gguf, "damage": kind},
                )
            )
        for kind, (tokens, pooling) in EMBED_BAD_CALLS.items():
            out.append(
                Case(
                    f"bitnet/embed/refused/{names[0]}/{kind}",
                    "bitnet",
                    "embed",
                    "mlrt.h#ml_embed (ML_E_ARG)",
                    "refused",
                    {"op": "embed_call", "model": gguf, "tokens": tokens, "pooling": pooling},
                )
            )
    return out


def bitnet_cases() -> list[Case]:
    return _i2s_spec_cases() + _i2s_golden_cases() + _i2s_random_cases() + _embed_cases()


# ---------------------------------------------------------------- GGUF tensor infos (gguf-py)
GGUF_F32, GGUF_F16, GGUF_I2_S = 0, 1, 36  # GGML type ids


GGUF_POOLINGS = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's enum llama_pooling_type


def gguf_pooling(path) -> str:
    """The pooling a BitNet GGUF declares (ARCH.pooling_type; mean when it has none)."""
    import gguf

    from mlconf.tools.convert_bitnet import register_i2s

    register_i2s()
    fields = gguf.GGUFReader(str(path)).fields
    kind = next((int(f.contents()) for k, f in fields.items() if k.endswith(".pooling_type")), 1)
    return GGUF_POOLINGS.get(kind, "mean")


def gguf_tensors(path) -> list[dict]:
    """The tensor infos of a GGUF file, read with gguf-py (I2_S registered in memory): name, shape
    (GGUF order), type id, absolute offset and byte size (I2_S: packed bytes + the 32-byte tail)."""
    import gguf

    from mlconf.tools.convert_bitnet import register_i2s

    register_i2s()
    return [
        {
            "name": t.name,
            "shape": [int(d) for d in t.shape],
            "type": int(t.tensor_type),
            "offset": int(t.data_offset),
            "nbytes": int(t.n_bytes) + (I2S_TAIL if int(t.tensor_type) == GGUF_I2_S else 0),
        }
        for t in gguf.GGUFReader(str(path)).tensors
    ]


def collect(
    areas: tuple[str, ...] | list[str] | None = None,
    keyword: str | None = None,
    target_version: specs.Version | None = None,
) -> list[Case]:
    """The cases of ``areas`` (all by default) whose id matches ``keyword`` (-k), with the
    expectations of a Krafla ``target_version`` runtime (None: the newest)."""
    areas = tuple(areas or AREAS)
    unknown = set(areas) - set(AREAS)
    if unknown:
        raise ValueError(f"unknown area(s) {sorted(unknown)}; areas: {', '.join(AREAS)}")
    out: list[Case] = []
    if {"header", "loader", "tokenizer"} & set(areas):
        out += [c for c in _fixture_cases(target_version) if c.area in areas]
    if "tokenizer" in areas:
        out += _tokenizer_golden_cases() + _tokenizer_duplicate_merge_cases() + _tokenizer_decode_cases()
    if "quant" in areas:
        out += _edge_cases() + _assembled_cases() + _matrix_cases() + _golden_cases()
    if "forward" in areas:
        out += _forward_cases(target_version) + _fixture_run_cases(target_version)
    if "bitnet" in areas:
        out += bitnet_cases()
    if keyword:
        match = keyword_matcher(keyword)
        out = [c for c in out if match(c.id)]
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """ "K/N" (1 <= K <= N) of --shard; ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard {text!r}: expected K/N with 1 <= K <= N")
    return int(m.group(1)), int(m.group(2))


def shard(selected: list[Case], k: int, n: int) -> list[Case]:
    """The cases of shard k of n: those whose id's sha256 is k - 1 modulo n. A case's shard
    depends on its id alone, so adding or removing another case moves no case between shards."""
    return [
        c
        for c in selected
        if int.from_bytes(hashlib.sha256(c.id.encode("utf-8")).digest()[:8], "big") % n == k - 1
    ]


# ---------------------------------------------------------------- -k expressions
_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def keyword_matcher(expr: str):
    """pytest-style -k: words (substrings of the case id, case-insensitive) with and/or/not and
    parentheses. Raises ValueError on a malformed expression."""
    tokens = _TOKEN.findall(expr)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"-k {expr!r}: unexpected end of expression")
        pos += 1
        return tokens[pos - 1]

    def parse_or():
        left = parse_and()
        while peek() == "or":
            take()
            right = parse_and()
            left = (lambda a, b: lambda s: a(s) or b(s))(left, right)
        return left

    def parse_and():
        left = parse_not()
        while peek() == "and":
            take()
            right = parse_not()
            left = (lambda a, b: lambda s: a(s) and b(s))(left, right)
        return left

    def parse_not():
        if peek() == "not":
            take()
            inner = parse_not()
            return lambda s: not inner(s)
        tok = take()
        if tok == "(":
            inner = parse_or()
            if take() != ")":
                raise ValueError(f"-k {expr!r}: missing ')'")
            return inner
        if tok in (")", "and", "or"):
            raise ValueError(f"-k {expr!r}: unexpected {tok!r}")
        word = tok.lower()
        return lambda s: word in s.lower()

    if not tokens:
        return lambda s: True
    fn = parse_or()
    if pos != len(tokens):
        raise ValueError(f"-k {expr!r}: unexpected {tokens[pos]!r}")
    return fn
