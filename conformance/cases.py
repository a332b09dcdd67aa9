"""Every conformance case, as data built from the specs and the goldens.

A Case names the capability it needs, the spec row it comes from and its expectation. Areas:
  header  valid fixtures of specs/mlb_fixtures.yaml: the loader must accept them
  loader  malformed and edge fixtures of specs/mlb_errors.yaml: the status the spec gives
  quant   hand-derived edge vectors of specs/quant.yaml and the gguf-py golden (bit-exact)
  forward golden/logits: transformers' logits of converted tiny models, within
          specs/tolerances.yaml logits_runtime_vs_oracle, prefilled and decoded token by token
  tokenizer .mlt loader statuses (specs/mlt.yaml) and token ids against HF tokenizers' goldens
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlconf import fixtures, specs
from mlconf.golden import GOLDEN_DIR

AREAS = ("header", "loader", "quant", "forward", "tokenizer")


@dataclass(frozen=True)
class Case:
    id: str                     # stable, selectable with -k: "<area>/<spec row>/<name>"
    area: str
    capability: str             # the backend capability it needs (backends.CAPABILITIES)
    spec: str                   # where it comes from: "<spec file>#<row>"
    compare: str                # status | bit-exact | refused | toleranced
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    expected: Any = field(default=None, hash=False, compare=False)


# ---------------------------------------------------------------- header / loader
def _fixture_cases() -> list[Case]:
    out = []
    for f in fixtures.catalog():
        if f.file.startswith("tokenizer/"):
            name = f.file.rsplit("/", 1)[-1].removesuffix(".mlt")
            row = f"mlt.yaml#{f.rule}" if f.rule else f"mlconf/mlt_fixtures.py#{f.base}"
            cid = f"tokenizer/load/{f.rule or 'valid'}/{name}"
            out.append(Case(cid, "tokenizer", "load_tokenizer", row, "status", {"fixture": f}, f.expected))
        elif f.kind == "valid":
            out.append(Case(f"header/{f.base}", "header", "load", f"mlb_fixtures.yaml#{f.base}",
                            "status", {"fixture": f}, f.expected))
        elif f.kind == "malformed":
            name = f.file.rsplit("/", 1)[-1].removesuffix(".mlb")
            out.append(Case(f"loader/{f.rule}/{name}", "loader", "load", f"mlb_errors.yaml#{f.rule}",
                            "status", {"fixture": f}, f.expected))
        else:
            name = f.file.rsplit("/", 1)[-1].removesuffix(".mlb")
            out.append(Case(f"loader/accepted/{name}", "loader", "load",
                            f"mlb_errors.yaml#accepted.{name}", "status", {"fixture": f}, f.expected))
    return out


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
        out.append(Case(f"quant/{e['op']}/{e['name']}", "quant", cap, f"quant.yaml#edge_cases.{e['name']}",
                        "bit-exact", {**call, "x": x}, expected))
    for e in specs.load("quant").get("refused") or []:
        cap, call = QUANT_OPS[e["op"]]
        x = np.array(block_values(e["x"]), dtype=np.float32)
        out.append(Case(f"quant/{e['op']}/refused/{e['name']}", "quant", cap,
                        f"quant.yaml#refused.{e['name']}", "refused", {**call, "x": x}, None))
    return out


def _golden_cases() -> list[Case]:
    path = GOLDEN_DIR / "q4_0_round_gguf.npz"
    if not path.exists():
        return []
    g = np.load(path)
    x = g["x"].astype(np.float32)
    expected = (g["qs"].tobytes(), g["d"].tobytes())
    return [Case("quant/q4_0_round_f16/gguf_golden", "quant", "quantize_q4_0",
                 "quant.yaml#q4_0_round (oracle gguf-py, golden/q4_0_round_gguf.npz)", "bit-exact",
                 {"rule": "round", "f16": True, "x": x}, expected)]


def _forward_cases() -> list[Case]:
    out = []
    for npz in sorted((GOLDEN_DIR / "logits").glob("*.npz")):
        g = np.load(npz)
        name = npz.stem
        spec = f"tolerances.yaml#logits_runtime_vs_oracle (golden/logits/{name}, oracle transformers)"
        for mode in ("prefill", "decode"):
            params = {"model": npz.with_suffix(".mlb"), "tokens": g["tokens"], "mode": mode,
                      "tolerance": "logits_runtime_vs_oracle"}
            out.append(Case(f"forward/{name}/{mode}", "forward", "forward", spec, "toleranced", params,
                            g["logits"]))
        # cross-backend: the reference backend's runtime logits are the expectation (not run on it)
        params = {"model": npz.with_suffix(".mlb"), "tokens": g["tokens"], "mode": "prefill",
                  "tolerance": "logits_runtime_vs_reference", "expected_from": "reference"}
        out.append(Case(f"forward/{name}/vs_reference", "forward", "forward",
                        f"tolerances.yaml#logits_runtime_vs_reference (golden/logits/{name})", "toleranced",
                        params, None))
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
            out.append(Case(f"tokenizer/encode/{name}/{text_name}", "tokenizer", "encode",
                            f"tokenizer_texts.yaml#{text_name} (golden/tokenizers/{name}.json, oracle "
                            f"{doc['oracle']})", "ids",
                            {"golden": GOLDEN_DIR / "tokenizers" / doc["tokenizer"],
                             "text": texts[text_name]}, rec["ids"]))
    return out


def collect(areas: tuple[str, ...] | list[str] | None = None, keyword: str | None = None) -> list[Case]:
    areas = tuple(areas or AREAS)
    unknown = set(areas) - set(AREAS)
    if unknown:
        raise ValueError(f"unknown area(s) {sorted(unknown)}; areas: {', '.join(AREAS)}")
    out: list[Case] = []
    if {"header", "loader", "tokenizer"} & set(areas):
        out += [c for c in _fixture_cases() if c.area in areas]
    if "tokenizer" in areas:
        out += _tokenizer_golden_cases()
    if "quant" in areas:
        out += _edge_cases() + _golden_cases()
    if "forward" in areas:
        out += _forward_cases()
    if keyword:
        match = keyword_matcher(keyword)
        out = [c for c in out if match(c.id)]
    return out


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
