"""The reference backend as a Backend: its calls on the modules of this package (loader.py,
quant.py, forward.py, tokenizer.py, i2s.py, bitnet.py), in-process."""

from __future__ import annotations

import numpy as np

from ..base import POOLINGS, READINGS, InputError, LoadResult, Unsupported, token_array
from . import i2s, loader, quant


class ReferenceBackend:
    name = "reference"
    capabilities = frozenset(
        {
            "load",
            "quantize_q8_0",
            "quantize_q4_0",
            "forward",
            "load_tokenizer",
            "encode",
            "i2s",
            "embed",
            "load_gguf",
        }
    )
    description = "the NumPy reference (backends/reference), in-process"

    def __init__(self, float_mode: bool = False):
        self.float_mode = float_mode  # float semantics: no activation quantization
        self.target_version = None  # the Krafla version whose files it reads; None: the newest

    def set_target_version(self, version: tuple[int, int, int] | None) -> bool:
        """Read .mlb files as Krafla ``version`` does (specs/mlb_header.yaml `versions`)."""
        self.target_version = version
        return True

    def load(self, path: str) -> LoadResult:
        return loader.load(path, self.target_version)

    def open_model(self, path: str, ctx: int | None = None):
        """Load (validating) and return a Forward session; a rejected file raises InputError."""
        from mlconf.tools import mlb  # tools/mlb.py imports this package: import it late

        from .forward import Forward, ForwardError

        try:
            model = mlb.read(path, self.target_version)
        except mlb.MLBError as e:
            raise ForwardError(str(e)) from None
        return Forward(model, ctx=ctx, float_mode=self.float_mode)

    def load_tokenizer(self, path: str, model_vocab: int | None = None) -> LoadResult:
        from . import mlt

        return mlt.load(path, model_vocab)

    def open_tokenizer(self, path: str):
        """The reference encoder of a validated .mlt; a rejected file raises InputError."""
        from mlconf.tools import mlt

        from ..base import InputError
        from .tokenizer import Encoder

        try:
            return Encoder(mlt.read(path))
        except mlt.MLTError as e:
            raise InputError(str(e)) from None

    def quantize_q8_0(self, x: np.ndarray, f16: bool) -> tuple[np.ndarray, np.ndarray]:
        return quant.q8_0(x, f16=f16)

    def quantize_q4_0(
        self, x: np.ndarray, rule: str, f16: bool, importance: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        if rule == "round":
            if importance is not None:
                raise Unsupported("the round rule takes no importance weights")
            return quant.q4_0_round(x, f16=f16)
        if rule == "search":
            return quant.q4_0_search(x, f16=f16, importance=importance)
        raise Unsupported(f"Q4_0 rule {rule!r}")

    # -- I2_S (specs/i2s.yaml); I2SError is a ValueError
    def i2s_quantize(self, w: np.ndarray) -> bytes:
        if np.asarray(w).size == 0:
            raise i2s.I2SError(f"no weights (shape {np.shape(w)})")  # the ABI's rows of 0
        return i2s.payload(w)

    def i2s_quantize_act(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = np.asarray(x)
        _act_shape(x)
        q, s = i2s.quantize_activations(x)
        total = q.astype(np.int32).sum(axis=1, dtype=np.int32)
        return q.reshape(x.shape), s.reshape(x.shape[:-1]), total.reshape(x.shape[:-1])

    def i2s_matmul(self, payload: bytes, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        _act_shape(x)
        rows, cols = (int(v) for v in shape)
        if x.shape[-1] != cols:
            raise i2s.I2SError(f"activation width {x.shape[-1]} != weight cols {cols}")
        packed = i2s.split_payload(bytes(payload), (rows, cols))[0]
        i2s.unpack(packed, rows * cols)  # code 3 is refused (decision i2s.code3), as the ABI's ML_E_FORMAT
        y = i2s.bitlinear(x, bytes(payload), (rows, cols))
        return y.reshape(*x.shape[:-1], rows)

    # -- BitNet GGUF embeddings
    def load_gguf(self, path: str) -> LoadResult:
        from . import gguf_model

        return gguf_model.load(path)

    def open_embedder(self, path: str, reading: str | None = None) -> Embedder:
        """The reference embedder of a GGUF (reference/bitnet.py) in ``reading`` (None: the
        file's own; float semantics: float); a refused file or reading raises InputError."""
        return Embedder(path, reading or ("float" if self.float_mode else None))


def _act_shape(x: np.ndarray) -> None:
    """The ABI's rule for activations: 1-D or 2-D, at least one row, width a positive multiple of 128."""
    if x.ndim not in (1, 2):
        raise i2s.I2SError(f"activations must be 1-D or 2-D, got shape {x.shape}")
    if x.size == 0 or x.shape[-1] % i2s.BLOCK:
        raise i2s.I2SError(
            f"shape {x.shape}: rows > 0 and a width that is a positive multiple of {i2s.BLOCK} required"
        )


class Embedder:
    """A loaded BitNet GGUF (backends.base.EmbedderSession)."""

    def __init__(self, path: str, reading: str | None = None):
        from . import bitnet

        if reading not in READINGS:
            raise InputError(f"reading {reading!r} is not one of {READINGS}")
        self.path = str(path)
        try:
            self.model = bitnet.load_gguf(path)
            emb = self.model.tensors["token_embd.weight"]
        except bitnet.BitnetError as e:
            raise InputError(str(e) if self.path in str(e) else f"{self.path}: {e}") from None
        except OSError as e:
            raise InputError(f"{self.path}: cannot be read: {e}") from None
        except (ValueError, KeyError, IndexError, TypeError, EOFError) as e:
            # what gguf-py raises on a damaged file (a truncated one: a tensor cut short)
            raise InputError(
                f"{self.path}: not a readable BitNet GGUF (truncated or damaged?): {type(e).__name__}: {e}"
            ) from None
        self.vocab, self.dim = int(emb.shape[0]), int(self.model.hp["dim"])
        self.reading = reading or self.model.reading
        if self.reading == "ternary" and not self.model.norm_in:
            raise InputError(
                f"{self.path}: reading ternary needs a BitNet student (per-projection norms); "
                "this GGUF is a plain model (a float teacher): read it as float"
            )

    def embed(self, tokens: np.ndarray, pooling: str | None = None, normalize: bool = False) -> np.ndarray:
        from . import bitnet

        t = token_array(tokens)
        if t.size == 0:
            raise InputError("no tokens")
        bad = np.flatnonzero((t < 0) | (t >= self.vocab))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"token {int(t[i])} at index {i} is outside [0, {self.vocab})")
        if pooling not in POOLINGS:
            raise InputError(f"pooling {pooling!r} is not one of {POOLINGS}")
        try:
            return bitnet.embed(self.model, t, pooling, bool(normalize), reading=self.reading)
        except bitnet.BitnetError as e:
            raise InputError(str(e)) from None

    def close(self) -> None:
        pass
