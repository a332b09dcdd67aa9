"""The reference forward pass of an .mlb model (specs/forward.yaml), in NumPy.

Two modes: runtime semantics (default; every matrix input quantized to Q8_0 and integer block
dot products, what a runtime must match) and float semantics (float_mode=True; dequantized
weights, float activations, what is compared with transformers). Vectorized over positions and
heads; only the recurrence of linear-attention layers steps through positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mlconf.tools import mlb
from mlconf.tools.mlb import Imatrix

from ..base import InputError, NumericError
from . import portable, quant

F32 = np.float32


class ForwardError(InputError):
    """A valid model asked to do something it cannot (token out of range, ctx, positions)."""


# ---------------------------------------------------------------- RoPE
def rope_inv_freq(h: dict, rot_dim: int, local: bool) -> np.ndarray:
    """Inverse frequencies of the rot_dim/2 pairs (float64), scaled per rope_type (seed: RoPE)."""
    base = h["rope_local_theta"] if local else h["rope_theta"]
    i = np.arange(rot_dim // 2, dtype=np.float64)
    inv = portable.pow64(base, -2.0 * i / rot_dim)
    rt = 0 if local else h["rope_type"]
    f = h["rope_factor"]
    if rt == 1:  # llama3
        lo, hi, orig = h["rope_low_freq_factor"], h["rope_high_freq_factor"], h["rope_orig_max_seq"]
        wavelen = 2 * math.pi / inv
        s = (orig / wavelen - lo) / (hi - lo)
        mid = (1 - s) * inv / f + s * inv
        inv = np.where(wavelen < orig / hi, inv, np.where(wavelen > orig / lo, inv / f, mid))
    elif rt == 2:  # linear
        inv = inv / f
    elif rt == 3:  # yarn
        beta_fast, beta_slow = h["rope_low_freq_factor"], h["rope_high_freq_factor"]
        orig = h["rope_orig_max_seq"]

        def d(r: float) -> float:
            return rot_dim * portable.ln(orig / (2 * math.pi * r)) / (2 * portable.ln(base))

        lo = max(math.floor(d(beta_fast)), 0)
        hi = min(math.ceil(d(beta_slow)), rot_dim - 1)
        if hi == lo:
            hi = lo + 0.001  # as transformers' linear ramp
        ramp = np.clip((i - lo) / (hi - lo), 0, 1)
        inv = inv / f * ramp + inv * (1 - ramp)
    return inv


def apply_rope(x: np.ndarray, positions: np.ndarray, inv: np.ndarray, mult: float) -> np.ndarray:
    """Rotate interleaved pairs (2i, 2i+1) of the first 2*len(inv) dims of every head.
    x: (T, heads, head_dim) float32; positions: (T,) absolute."""
    ang = positions[:, None].astype(np.float64) * inv[None, :]
    cos, sin = portable.cos_sin64(ang)
    c = (cos * mult).astype(F32)[:, None, :]
    s = (sin * mult).astype(F32)[:, None, :]
    n = 2 * len(inv)
    out = x.copy()
    x0, x1 = x[..., 0:n:2], x[..., 1:n:2]
    out[..., 0:n:2] = x0 * c - x1 * s
    out[..., 1:n:2] = x0 * s + x1 * c
    return out


# ---------------------------------------------------------------- small ops
def rmsnorm(v: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(v * v, axis=-1, keepdims=True, dtype=F32)
    return (v * (F32(1) / np.sqrt(ms + F32(eps)))) * w


def silu(v: np.ndarray) -> np.ndarray:
    return v / (F32(1) + portable.exp(-v))


def gelu_tanh(v: np.ndarray) -> np.ndarray:
    inner = F32(math.sqrt(2 / math.pi)) * (v + F32(0.044715) * v * v * v)
    return F32(0.5) * v * (F32(1) + portable.tanh(inner))


def sigmoid(v: np.ndarray) -> np.ndarray:
    return F32(1) / (F32(1) + portable.exp(-v))


def softplus(v: np.ndarray) -> np.ndarray:
    return portable.softplus(v)


def softcap(v: np.ndarray, cap: float) -> np.ndarray:
    return F32(cap) * portable.tanh(v / F32(cap)) if cap else v


# ---------------------------------------------------------------- state
@dataclass
class State:
    """KV cache (attention layers) and conv inputs + recurrent state (linear layers)."""

    filled: int = 0
    k: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (ctx, n_kv, head_dim)
    v: dict[int, np.ndarray] = field(default_factory=dict)
    conv: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (lin_conv - 1, channels)
    S: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (V, dk, dv) float32


class Forward:
    """One model with its state: ``forward(tokens, pos) -> logits (n, vocab) float32``."""

    def __init__(self, model: mlb.Model, ctx: int | None = None, float_mode: bool = False):
        h = model.header
        ctx = h["max_seq"] if ctx is None else ctx
        if not 1 <= ctx <= h["max_seq"]:
            raise ForwardError(f"{model.path}: ctx {ctx} must be in 1..max_seq ({h['max_seq']})")
        self.m, self.h, self.d, self.ctx, self.float_mode = model, h, model.derived, ctx, float_mode
        self._w: dict[str, tuple] = {}
        self.state = State()
        self.imatrix: Imatrix | None = None  # set by start_imatrix: sums of squared matmul inputs
        self._pos = 0  # the first position of the forward call under way

    def start_imatrix(self) -> Imatrix:
        """Accumulate the MLI1 sums (seed: "Importance matrix file") over every later forward."""
        h, d = self.h, self.d
        q_dim = 0 if d["q_dim"] == h["dim"] else d["q_dim"]
        im = Imatrix(h["n_layers"], h["dim"], h["hidden_dim"], q_dim, 0, 0, np.empty(0))
        im.sums = np.zeros(im.expected_len(), dtype=np.float64)
        self.imatrix = im
        return im

    def _record(self, layer: int | None, slot: str, x: np.ndarray) -> None:
        if self.imatrix is not None:
            view = self.imatrix.channels(layer, slot)  # a view into imatrix.sums
            view += np.sum(x.astype(np.float64) ** 2, axis=0)

    def reset(self) -> None:
        self.state = State()

    def close(self) -> None:
        self._w.clear()
        self.state = State()

    # ------------------------------------------------ weights and products
    def _arr(self, name: str) -> np.ndarray:
        return np.asarray(self.m.arrays[name], dtype=F32)

    def _prepared(self, name: str):
        if name not in self._w:
            fmt, q, d = self.m.matrix(name)
            if self.float_mode:
                self._w[name] = (quant.dequantize(fmt, q, d),)
            else:
                levels = (
                    np.asarray(q, dtype=F32)
                    if fmt == "Q8_0"
                    else quant.unpack_nibbles(np.asarray(q)).astype(F32)
                )
                rows = q.shape[0]
                nb = d.shape[1]
                lv = levels.reshape(rows, nb, 32).transpose(1, 2, 0).copy()  # (nb, 32, rows)
                self._w[name] = (lv, np.asarray(d, dtype=F32))  # d: (rows, nb)
        return self._w[name]

    def matmul(self, name: str, x: np.ndarray) -> np.ndarray:
        """W·x for every row of x (T, cols): runtime semantics quantize x to Q8_0 first."""
        w = self._prepared(name)
        if self.float_mode:
            return portable.matmul(x, w[0])
        lv, dw = w
        bad = ~np.isfinite(x)
        if bad.any():  # decision forward.nonfinite: the quantizer's rule has no meaning for it
            t, c = (int(v) for v in np.argwhere(bad)[0])
            raise NumericError(
                f"{self.m.path}: non-finite activation {float(x[t, c])!r} at position "
                f"{self._pos + t}, element {c} of the input of {name} (decision "
                f"forward.nonfinite)"
            )
        xq, xd = quant.q8_0(np.ascontiguousarray(x, dtype=F32))
        t, cols = x.shape
        xb = xq.astype(F32).reshape(t, cols // 32, 32)
        y = np.zeros((t, lv.shape[2]), F32)
        for b in range(cols // 32):  # block order fixed, so a row's result does not depend on T
            isum = xb[:, b, :] @ lv[b]  # integer block sums, exact in float32
            y += isum * (xd[:, b, None] * dw[None, :, b])
        return y

    # ------------------------------------------------ layers
    def _windowed(self, layer: int) -> bool:
        h = self.h
        if not h["sliding_window"]:
            return False
        return not h["layer_flags"] or bool(self.m.flags[layer] & 1)

    def _flag(self, layer: int) -> int:
        return self.m.flags[layer] if self.m.flags is not None else 0

    def _attention(self, i: int, x: np.ndarray, pos: int) -> np.ndarray:
        h, d, p = self.h, self.d, f"layers.{i}."
        t = x.shape[0]
        hd, nh, nkv = d["head_dim"], h["n_heads"], h["n_kv_heads"]
        hn = rmsnorm(x, self._arr(p + "attn_norm"), h["norm_eps"])
        self._record(i, "attn", hn)
        q = self.matmul(p + "wq", hn)
        k = self.matmul(p + "wk", hn)
        v = self.matmul(p + "wv", hn)
        if h["qkv_bias"]:
            q, k, v = q + self._arr(p + "bq"), k + self._arr(p + "bk"), v + self._arr(p + "bv")
        q, k, v = q.reshape(t, nh, hd), k.reshape(t, nkv, hd), v.reshape(t, nkv, hd)
        if h["qk_norm"]:
            q = rmsnorm(q, self._arr(p + "q_norm"), h["norm_eps"])
            k = rmsnorm(k, self._arr(p + "k_norm"), h["norm_eps"])
        flag = self._flag(i)
        positions = np.arange(pos, pos + t)
        if not flag & 4:
            local = bool(flag & 2)
            inv = rope_inv_freq(h, d["rot_dim"], local)
            mult = h["rope_attn_factor"] if h["rope_type"] == 3 and not local else 1.0
            q, k = apply_rope(q, positions, inv, mult), apply_rope(k, positions, inv, mult)
        st = self.state
        if i not in st.k:
            st.k[i] = np.zeros((self.ctx, nkv, hd), F32)
            st.v[i] = np.zeros((self.ctx, nkv, hd), F32)
        st.k[i][pos : pos + t], st.v[i][pos : pos + t] = k, v
        keys, vals = st.k[i][: pos + t], st.v[i][: pos + t]
        group = nh // nkv
        keys = np.repeat(keys, group, axis=1)  # (P, nh, hd)
        vals = np.repeat(vals, group, axis=1)
        scale = h["attn_scale"] or 1 / math.sqrt(hd)
        s = portable.matmul(q.transpose(1, 0, 2), keys.transpose(1, 0, 2)) * F32(scale)  # (nh, T, P)
        s = softcap(s, h["attn_softcap"])
        kpos = np.arange(pos + t)
        mask = kpos[None, :] <= positions[:, None]
        if self._windowed(i):
            mask &= positions[:, None] - kpos[None, :] < h["sliding_window"]
        s = np.where(mask[None], s, -np.inf)
        s = portable.exp(s - s.max(axis=-1, keepdims=True))
        s = s / portable.sum_last(s)
        o = portable.matmul(s, vals.transpose(1, 2, 0)).transpose(1, 0, 2).reshape(t, nh * hd)
        if h["attn_gate"]:
            o = o * sigmoid(self.matmul(p + "wg", hn))
        self._record(i, "wo", o)
        return self.matmul(p + "wo", o)

    def _linear(self, i: int, x: np.ndarray) -> np.ndarray:
        h, p = self.h, f"layers.{i}."
        t = x.shape[0]
        K, V, dk, dv, kc = h["lin_k_heads"], h["lin_v_heads"], h["lin_k_dim"], h["lin_v_dim"], h["lin_conv"]
        hn = rmsnorm(x, self._arr(p + "attn_norm"), h["norm_eps"])
        self._record(i, "attn", hn)  # lout's input has no MLI1 slot (decision imatrix.slots)
        c = self.matmul(p + "lqkv", hn)
        z = self.matmul(p + "lz", hn)
        b = self.matmul(p + "lb", hn)
        a = self.matmul(p + "la", hn)
        st = self.state
        prev = st.conv.get(i, np.zeros((kc - 1, c.shape[1]), F32))
        padded = np.concatenate([prev, c], axis=0)  # (kc - 1 + T, channels)
        w = self._arr(p + "lconv")  # (channels, kc)
        u = np.zeros_like(c)
        for tap in range(kc):
            u += w[:, tap] * padded[tap : tap + t]
        st.conv[i] = padded[len(padded) - (kc - 1) :] if kc > 1 else prev
        u = silu(u)
        q = u[:, : K * dk].reshape(t, K, dk)
        k = u[:, K * dk : 2 * K * dk].reshape(t, K, dk)
        v = u[:, 2 * K * dk :].reshape(t, V, dv)
        q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + F32(1e-6))
        k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + F32(1e-6))
        q = q / F32(math.sqrt(dk))
        rep = V // K
        q, k = np.repeat(q, rep, axis=1), np.repeat(k, rep, axis=1)  # value head h uses h // rep
        beta = sigmoid(b)  # (T, V)
        g = -portable.exp(self._arr(p + "A_log")) * softplus(a + self._arr(p + "dt_bias"))
        S = st.S.get(i, np.zeros((V, dk, dv), F32))
        out = np.empty((t, V, dv), F32)
        for s_ in range(t):  # the recurrence: one position after the other (seed, step 4)
            S = S * portable.exp(g[s_])[:, None, None]
            kv_mem = portable.matmul(k[s_][:, None, :], S.transpose(0, 2, 1))[:, 0]
            delta = (v[s_] - kv_mem) * beta[s_][:, None]
            S = S + k[s_][:, :, None] * delta[:, None, :]
            out[s_] = portable.matmul(q[s_][:, None, :], S.transpose(0, 2, 1))[:, 0]
        st.S[i] = S.astype(F32)
        o = rmsnorm(out, self._arr(p + "lnorm"), h["norm_eps"]) * silu(z.reshape(t, V, dv))
        return self.matmul(p + "lout", o.reshape(t, V * dv))

    def _ffn(self, i: int, x: np.ndarray) -> np.ndarray:
        h, p = self.h, f"layers.{i}."
        hn = rmsnorm(x, self._arr(p + "ffn_norm"), h["norm_eps"])
        self._record(i, "ffn", hn)
        g = self.matmul(p + "w1", hn)
        u = self.matmul(p + "w3", hn)
        act = gelu_tanh(g) if h["act"] == 1 else silu(g)
        self._record(i, "w2", act * u)
        f = self.matmul(p + "w2", act * u)
        if h["post_norms"]:
            f = rmsnorm(f, self._arr(p + "post_ffn_norm"), h["norm_eps"])
        return f

    # ------------------------------------------------ the pass
    def _check(self, tokens: np.ndarray, pos: int) -> None:
        name, h = self.m.path, self.h
        if tokens.ndim != 1 or len(tokens) == 0:
            raise ForwardError(f"{name}: tokens must be a non-empty 1-D sequence")
        bad = (tokens < 0) | (tokens >= h["vocab"])
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ForwardError(
                f"{name}: token {int(tokens[j])} at index {j} is outside 0..{h['vocab'] - 1} (vocab)"
            )
        if pos < 0:
            raise ForwardError(f"{name}: pos {pos} is negative")
        if pos + len(tokens) > self.ctx:
            raise ForwardError(f"{name}: pos {pos} + {len(tokens)} tokens exceeds ctx {self.ctx}")
        linear = self._has_linear()
        if pos > self.state.filled or (linear and pos != self.state.filled):
            need = "equal to" if linear else "at most"
            raise ForwardError(
                f"{name}: pos {pos} must be {need} the {self.state.filled} positions "
                f"already fed (reset() to start over)"
            )

    def _has_linear(self) -> bool:
        return self.m.flags is not None and any(f & 8 for f in self.m.flags)

    def forward(self, tokens, pos: int) -> np.ndarray:
        """Logits (len(tokens), vocab) float32 of the tokens at positions pos, pos+1, ...; a
        non-finite matrix input raises NumericError and feeds none of the call's positions (a
        model with linear layers starts over: its recurrent state cannot be undone)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        self._check(tokens, pos)
        self._pos = pos
        try:
            with np.errstate(all="ignore"):  # a NaN or inf is judged, not warned of
                return self._forward(tokens, pos)
        except NumericError:
            if self._has_linear():
                self.state = State()
            else:
                self.state.filled = min(self.state.filled, pos)
            raise

    def _forward(self, tokens: np.ndarray, pos: int) -> np.ndarray:
        h = self.h
        x = self.m.rows("tok_emb", tokens)
        if h["embed_scale"]:
            x = x * F32(h["embed_scale"])
        for i in range(h["n_layers"]):
            p = f"layers.{i}."
            a = self._linear(i, x) if self._flag(i) & 8 else self._attention(i, x, pos)
            if h["post_norms"]:
                a = rmsnorm(a, self._arr(p + "post_attn_norm"), h["norm_eps"])
            x = x + a
            x = x + self._ffn(i, x)
        xn = rmsnorm(x, self._arr("final_norm"), h["norm_eps"])
        self._record(None, "cls", xn)
        if self.imatrix is not None:
            self.imatrix.tokens += len(tokens)
            self.imatrix.tokens_cls += len(tokens)
        logits = self.matmul("tok_emb" if h["shared_classifier"] else "wcls", xn)
        self.state.filled = pos + len(tokens)
        return softcap(logits, h["final_softcap"]).astype(F32)
