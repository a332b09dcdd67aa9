"""The reference backend: NumPy, the readable truth (loader, quantizers; later forward,
tokenizer and I2_S math)."""

from __future__ import annotations

import numpy as np

from ..base import LoadResult, Unsupported
from . import loader, quant


class ReferenceBackend:
    name = "reference"
    capabilities = frozenset({"load", "quantize_q8_0", "quantize_q4_0", "forward", "load_tokenizer",
                              "encode"})

    def __init__(self, float_mode: bool = False):
        self.float_mode = float_mode  # float semantics: no activation quantization

    def load(self, path: str) -> LoadResult:
        return loader.load(path)

    def open_model(self, path: str, ctx: int | None = None):
        """Load (validating) and return a Forward session; a rejected file raises InputError."""
        from mlconf.tools import mlb  # tools/mlb.py imports this package: import it late

        from .forward import Forward, ForwardError
        try:
            model = mlb.read(path)
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

    def quantize_q4_0(self, x: np.ndarray, rule: str, f16: bool,
                      importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        if rule == "round":
            if importance is not None:
                raise Unsupported("the round rule takes no importance weights")
            return quant.q4_0_round(x, f16=f16)
        if rule == "search":
            return quant.q4_0_search(x, f16=f16, importance=importance)
        raise Unsupported(f"Q4_0 rule {rule!r}")
