"""The reference MLB v1 loader: every validation of specs/mlb_errors.yaml, in its order.

Each rule id of the spec has one check here (RULES). The loader runs them in the spec's order and
reports the first that fails, with the status the spec gives it and a reason naming the file, the
field and the rule. A check returns None when the rule holds, or the reason text.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import cached_property

import numpy as np

from mlconf import specs
from mlconf.tools import files

from ..base import LoadResult
from . import layout

LIMITS = specs.load("mlb_header")["limits"]


class Context:
    """What the checks look at. The header is parsed and the layer-flag bytes are read on first
    use, so each check sees only what the rules before it (in the spec's order) made safe to read:
    the header once the file holds 256 bytes, the flags once layer_flags is known to be 1."""

    def __init__(
        self, path: str = "", size: int = 0, head: bytes = b"", version: specs.Version | None = None
    ):
        self.path, self.size, self.head = path, size, head
        self.version = version  # the Krafla version to read the file as; None: the newest

    @classmethod
    def of_header(cls, h: dict, flags: bytes | None) -> Context:
        """A context for a header that is not in a file (the writer's checks)."""
        c = cls()
        c.__dict__["h"] = dict(h)
        c.__dict__["_flag_bytes"] = (flags, False)
        return c

    @cached_property
    def h(self) -> dict:
        return layout.parse_header(self.head)

    @cached_property
    def _flag_bytes(self) -> tuple[bytes | None, bool]:
        """(flag bytes or None, whether the file ends inside them)."""
        if self.h["layer_flags"] != 1:
            return None, False
        n = self.h["n_layers"]
        if self.size < 256 + n:
            return None, True
        with files.open_regular(self.path) as f:
            f.seek(256)
            return f.read(n), False

    @property
    def flags(self) -> bytes | None:
        return self._flag_bytes[0]

    @property
    def flags_cut(self) -> bool:
        return self._flag_bytes[1]


Check = Callable[[Context], "str | None"]
RULES: dict[str, Check] = {}


def rule(*ids: str):
    def register(fn: Check) -> Check:
        for i in ids:
            RULES[i] = fn
        return fn

    return register


def _finite(v: float) -> bool:
    return math.isfinite(v)


def _field(name: str, h: dict) -> str:
    off = {f["name"]: f["offset"] for f in specs.load("mlb_header")["fields"]}[name]
    return f"header field {name} (offset {off}) = {h[name]!r}"


# ---------------------------------------------------------------- the file itself
@rule("io.open")
def _io(c: Context):
    return None  # checked when the file is opened, before any rule (see load)


@rule("format.empty")
def _empty(c: Context):
    return "the file is empty" if c.size == 0 else None


@rule("format.short_header")
def _short(c: Context):
    return f"the file has {c.size} bytes, shorter than the 256-byte header" if c.size < 256 else None


# ---------------------------------------------------------------- header, format
@rule("format.magic")
def _magic(c: Context):
    return None if c.h["magic"] == layout.MAGIC else f"magic is {c.h['magic']!r}, expected b'MLB1'"


@rule("format.version")
def _version(c: Context):
    return None if c.h["version"] == 1 else f"{_field('version', c.h)}, only version 1 is defined"


def _later(since: specs.Version, c: Context) -> bool:
    """Whether a feature of Krafla ``since`` is beyond the version the file is read as."""
    return c.version is not None and since > c.version


def _target(since: specs.Version, c: Context) -> str:
    return f"it needs Krafla {specs.format_version(since)}, the target is {specs.format_version(c.version)}"


@rule("format.padding")
def _padding(c: Context):
    for name, (off, since) in specs.feature_versions()["fields"].items():
        if _later(since, c) and any(c.head[off : off + 4]):  # padding for an older version
            return f"{_field(name, c.h)} must be zero (header padding): {_target(since, c)}"
    pad = c.h["padding"]
    nz = [i for i, b in enumerate(pad) if b]
    return None if not nz else f"header byte {160 + nz[0]} is {pad[nz[0]]:#04x}; bytes 160..255 must be zero"


@rule("format.wtype")
def _wtype(c: Context):
    return None if c.h["wtype"] in layout.WTYPES else f"{_field('wtype', c.h)} is not 1 (Q8_0) or 2 (Q4_0)"


@rule("format.q8_mask.q8_model")
def _mask_q8(c: Context):
    if c.h["wtype"] == 1 and c.h["q8_mask"]:
        return f"{_field('q8_mask', c.h)} on a Q8_0 model; it must be 0 unless wtype is Q4_0"
    return None


@rule("format.q8_mask.unknown_bits")
def _mask_bits(c: Context):
    extra = c.h["q8_mask"] & ~0x7F
    if not extra:
        return None
    return f"{_field('q8_mask', c.h)} sets unknown bits {extra:#x}; only bits 0..6 are classes"


def _positive_finite(name: str, rule_text: str) -> Check:
    def check(c: Context):
        v = c.h[name]
        return None if _finite(v) and v > 0 else f"{_field(name, c.h)}: {rule_text}"

    return check


def _nonneg_finite(name: str) -> Check:
    def check(c: Context):
        v = c.h[name]
        return None if _finite(v) and v >= 0 else f"{_field(name, c.h)} must be finite and >= 0"

    return check


RULES["format.rope_theta"] = _positive_finite("rope_theta", "must be finite and > 0")
for _name in ("norm_eps", "embed_scale", "attn_scale", "attn_softcap", "final_softcap", "rope_local_theta"):
    RULES[f"format.{_name}"] = _nonneg_finite(_name)


@rule("format.rope_type")
def _rope_type(c: Context):
    return None if c.h["rope_type"] <= 3 else f"{_field('rope_type', c.h)} is not 0..3"


def _for_rope(kind: int, inner: Check) -> Check:
    def check(c: Context):
        return inner(c) if c.h["rope_type"] == kind else None

    return check


RULES["format.llama3.factor"] = _for_rope(1, _positive_finite("rope_factor", "llama3 needs rope_factor > 0"))
RULES["format.llama3.low_freq_factor"] = _for_rope(
    1, _positive_finite("rope_low_freq_factor", "llama3 needs rope_low_freq_factor > 0")
)
RULES["format.linear.factor"] = _for_rope(2, _positive_finite("rope_factor", "linear needs rope_factor > 0"))
RULES["format.yarn.factor"] = _for_rope(3, _positive_finite("rope_factor", "yarn needs rope_factor > 0"))
RULES["format.yarn.beta_slow"] = _for_rope(
    3, _positive_finite("rope_high_freq_factor", "yarn needs beta_slow (rope_high_freq_factor) > 0")
)
RULES["format.yarn.attn_factor"] = _for_rope(
    3, _positive_finite("rope_attn_factor", "yarn needs rope_attn_factor > 0")
)


@rule("format.llama3.high_freq_factor")
def _llama3_high(c: Context):
    h = c.h
    if h["rope_type"] != 1:
        return None
    hi, lo = h["rope_high_freq_factor"], h["rope_low_freq_factor"]
    ok = _finite(hi) and hi > lo
    return (
        None
        if ok
        else (
            f"{_field('rope_high_freq_factor', h)}: llama3 needs a finite value "
            f"> rope_low_freq_factor = {lo!r}"
        )
    )


@rule("format.yarn.beta_order")
def _yarn_order(c: Context):
    h = c.h
    if h["rope_type"] != 3:
        return None
    fast, slow = h["rope_low_freq_factor"], h["rope_high_freq_factor"]
    ok = _finite(fast) and slow < fast
    return (
        None
        if ok
        else (f"{_field('rope_low_freq_factor', h)}: yarn needs a finite beta_fast > beta_slow = {slow!r}")
    )


def _orig(kind: int, label: str) -> Check:
    def check(c: Context):
        if c.h["rope_type"] == kind and c.h["rope_orig_max_seq"] == 0:
            return f"{_field('rope_orig_max_seq', c.h)}: {label} needs rope_orig_max_seq > 0"
        return None

    return check


RULES["format.llama3.orig_max_seq"] = _orig(1, "llama3")
RULES["format.yarn.orig_max_seq"] = _orig(3, "yarn")


@rule("format.rope_attn_factor_without_yarn")
def _attn_factor(c: Context):
    v = c.h["rope_attn_factor"]
    if c.h["rope_type"] != 3 and v != 0:
        return f"{_field('rope_attn_factor', c.h)} with rope_type {c.h['rope_type']}; only yarn takes it"
    return None


def _bool(name: str) -> Check:
    def check(c: Context):
        return None if c.h[name] in (0, 1) else f"{_field(name, c.h)} must be 0 or 1"

    return check


for _name in ("qkv_bias", "qk_norm", "layer_flags", "post_norms", "scale_f16", "attn_gate"):
    RULES[f"format.bool.{_name}"] = _bool(_name)


@rule("format.act")
def _act(c: Context):
    return None if c.h["act"] in (0, 1) else f"{_field('act', c.h)} is not 0 (SiLU) or 1 (GELU tanh)"


@rule("format.sliding_window")
def _window(c: Context):
    lim = LIMITS["sliding_window"]
    return None if c.h["sliding_window"] <= lim else f"{_field('sliding_window', c.h)} is above 2^24"


# ---------------------------------------------------------------- header, shape
def _nonzero(name: str) -> Check:
    def check(c: Context):
        return None if c.h[name] else f"{_field(name, c.h)} must not be zero"

    return check


def _limit(name: str, lim: int, text: str) -> Check:
    def check(c: Context):
        return None if c.h[name] <= lim else f"{_field(name, c.h)} is above the limit {text}"

    return check


for _name in ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "max_seq"):
    RULES[f"shape.zero.{_name}"] = _nonzero(_name)
for _name in ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim"):
    RULES[f"shape.limit.{_name}"] = _limit(_name, LIMITS["dims"], "65536")
RULES["shape.limit.vocab"] = _limit("vocab", LIMITS["vocab"], "2^24")
RULES["shape.limit.max_seq"] = _limit("max_seq", LIMITS["max_seq"], "2^24")


def _multiple_32(name: str) -> Check:
    def check(c: Context):
        return None if c.h[name] % 32 == 0 else f"{_field(name, c.h)} is not a multiple of 32"

    return check


RULES["shape.dim_multiple_32"] = _multiple_32("dim")
RULES["shape.hidden_multiple_32"] = _multiple_32("hidden_dim")


@rule("shape.heads_divide_dim")
def _heads_dim(c: Context):
    h = c.h
    if h["head_dim"] == 0 and h["dim"] % h["n_heads"]:
        return f"{_field('n_heads', h)} does not divide dim = {h['dim']} and head_dim is 0"
    return None


@rule("shape.kv_divide_heads")
def _kv(c: Context):
    h = c.h
    return (
        None
        if h["n_heads"] % h["n_kv_heads"] == 0
        else f"{_field('n_kv_heads', h)} does not divide n_heads = {h['n_heads']}"
    )


@rule("shape.odd_head_dim")
def _odd(c: Context):
    hd = layout.derive(c.h)["head_dim"]
    src = "header field head_dim (offset 80)" if c.h["head_dim"] else "dim / n_heads"
    return None if hd % 2 == 0 else f"head_dim = {hd} ({src}) is odd"


@rule("shape.q_dim_multiple_32")
def _qdim32(c: Context):
    q = layout.derive(c.h)["q_dim"]
    return None if q % 32 == 0 else f"q_dim = head_dim x n_heads = {q} is not a multiple of 32"


@rule("shape.q_dim_limit")
def _qdim_lim(c: Context):
    q = layout.derive(c.h)["q_dim"]
    return None if q <= LIMITS["q_dim"] else f"q_dim = head_dim x n_heads = {q} is above 65536"


@rule("shape.vocab_min")
def _vocab(c: Context):
    return None if c.h["vocab"] >= 3 else f"{_field('vocab', c.h)} is below 3 (ids 1 and 2 are BOS and EOS)"


@rule("shape.rot_dim")
def _rot(c: Context):
    r, hd = c.h["rot_dim"], layout.derive(c.h)["head_dim"]
    if r % 2 or r > hd:
        return f"{_field('rot_dim', c.h)} must be even and at most head_dim = {hd}"
    return None


# ---------------------------------------------------------------- layer flags
def _each_flag(test: Callable[[int], bool], text: str) -> Check:
    def check(c: Context):
        if c.flags is None:
            return None
        for i, b in enumerate(c.flags):
            if test(b):
                return f"layer flag byte of layer {i} (offset {256 + i}) = {b:#04x}: {text}"
        return None

    return check


@rule("format.layer.unknown_bits")
def _flag_bits(c: Context):
    later = {v: s for v, s in specs.feature_versions()["layer_flag_bits"].items() if _later(s, c)}
    text = "bits 4..7 must be 0" + "".join(
        f"; bit {v.bit_length() - 1} is unknown: {_target(s, c)}" for v, s in later.items()
    )
    return _each_flag(lambda b: b & (0xF0 | sum(later)), text)(c)


RULES["format.layer.local_and_norope"] = _each_flag(
    lambda b: b & 6 == 6, "bit 1 (local RoPE base) and bit 2 (no RoPE) cannot be combined"
)
RULES["format.layer.linear_not_alone"] = _each_flag(
    lambda b: b & 8 and b != 8, "bit 3 (linear attention) must be alone"
)


@rule("format.layer.local_without_theta")
def _local_theta(c: Context):
    if c.h["rope_local_theta"] != 0:
        return None
    return _each_flag(
        lambda b: b & 2,
        "a local-RoPE layer (bit 1) needs rope_local_theta > 0, "
        "header field rope_local_theta (offset 100) is 0",
    )(c)


def _has_linear(c: Context) -> bool:
    return c.flags is not None and any(b & 8 for b in c.flags)


def _linear(test: Callable[[dict], bool], name: str, text: str) -> Check:
    def check(c: Context):
        if not _has_linear(c) or test(c.h):
            return None
        return f"{_field(name, c.h)}: {text} (a layer has flag bit 3)"

    return check


RULES["shape.linear.k_heads"] = _linear(lambda h: h["lin_k_heads"] > 0, "lin_k_heads", "must be > 0")
RULES["shape.linear.v_heads"] = _linear(lambda h: h["lin_v_heads"] > 0, "lin_v_heads", "must be > 0")
RULES["shape.linear.v_heads_multiple"] = _linear(
    lambda h: h["lin_v_heads"] % 4 == 0 and h["lin_v_heads"] % h["lin_k_heads"] == 0,
    "lin_v_heads",
    "must be a multiple of 4 and of lin_k_heads",
)
RULES["shape.linear.k_dim"] = _linear(lambda h: h["lin_k_dim"] > 0, "lin_k_dim", "must be > 0")
RULES["shape.linear.v_dim"] = _linear(lambda h: h["lin_v_dim"] > 0, "lin_v_dim", "must be > 0")
RULES["shape.linear.v_width_multiple_32"] = _linear(
    lambda h: h["lin_v_heads"] * h["lin_v_dim"] % 32 == 0,
    "lin_v_dim",
    "lin_v_heads x lin_v_dim must be a multiple of 32",
)
RULES["shape.linear.conv"] = _linear(lambda h: h["lin_conv"] > 0, "lin_conv", "must be > 0")


# ---------------------------------------------------------------- body
@rule("format.truncated_body")
def _truncated(c: Context):
    if c.flags_cut:
        return (
            f"the file has {c.size} bytes; the {c.h['n_layers']} layer-flag bytes end at "
            f"{256 + c.h['n_layers']}"
        )
    need = layout.required_size(c.h, c.flags)
    return None if c.size >= need else f"the file has {c.size} bytes; the header implies {need}"


@rule("format.q8_minus128")
def _minus128(c: Context):
    mm = np.memmap(c.path, dtype=np.int8, mode="r", shape=(c.size,))
    try:
        for a in layout.plan(c.h, c.flags):
            if a.fmt == "Q8_0" and a.part == "q":
                seg = mm[a.offset : a.offset + a.nbytes]
                hit = np.flatnonzero(seg == -128)
                if hit.size:
                    return (
                        f"array {a.matrix} (Q8_0 quants at offset {a.offset}) has -128 at "
                        f"element {int(hit[0])}; quants must be in [-127, 127]"
                    )
    finally:
        del mm
    return None


# ---------------------------------------------------------------- driver
def rule_table() -> list[dict]:
    return specs.load("mlb_errors")["rules"]


def load(path: str | os.PathLike, version: specs.Version | None = None) -> LoadResult:
    """Validate a .mlb file; the first failing rule of specs/mlb_errors.yaml decides the status.
    ``version``: read it as that Krafla version does (specs/mlb_header.yaml `versions`)."""
    path = os.fspath(path)
    name = path
    try:
        with files.open_regular(path) as f:  # decision loader.special_files
            size = os.fstat(f.fileno()).st_size
            head = f.read(256)
    except OSError as e:
        return LoadResult("ML_E_IO", f"{name}: cannot open: {files.reason(e)}", "io.open")
    c = Context(path=path, size=size, head=head, version=version)
    for r in rule_table():
        reason = RULES[r["id"]](c)
        if reason is not None:
            return LoadResult(r["status"], f"{name}: {reason} [{r['id']}]", r["id"])
    return LoadResult("ML_OK", f"{name}: accepted", "")


def header_problem(h: dict, flags: bytes | None) -> tuple[str, str] | None:
    """(rule id, reason) of the first header or layer-flag rule that ``h`` and ``flags`` break,
    or None. The writer uses it to refuse what the loader would refuse."""
    c = Context.of_header(h, bytes(flags) if flags is not None else None)
    for r in rule_table():
        rid = r["id"]
        if rid.startswith(
            ("io.", "format.empty", "format.short_header", "format.truncated_body", "format.q8_minus128")
        ):
            continue
        reason = RULES[rid](c)
        if reason is not None:
            return rid, reason
    return None
