"""The objects a library backend opens (a model, a tokenizer, an embedder): handles into its
worker, valid while the worker that made them lives."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..base import BackendError, InputError, NumericError
from ..child import Handle
from . import abi
from .inputs import INT32, POOLING_CODES, int32, tokens32

if TYPE_CHECKING:
    from .library import LibraryBackend


class _Handle(Handle):
    def _free(self, op: str) -> None:
        self._release(lambda: self.backend._call(f"close({self.path!r})", op, self.handle))


class ModelSession(_Handle):
    def __init__(self, backend: LibraryBackend, handle: int, vocab: int, ctx: int, path: str):
        super().__init__(backend, handle, path)
        self.vocab, self.ctx = vocab, ctx

    def forward(self, tokens: np.ndarray, pos: int) -> np.ndarray:
        self._live()
        t = tokens32(tokens)
        pos = int32(pos, "pos")
        st, logits = self.backend._call(
            f"forward({self.path!r}, tokens[{t.size}], pos={pos})",
            "forward",
            self.handle,
            t.astype(np.int32),
            pos,
        )
        if st == abi.ML_E_ARG:
            raise InputError(
                f"ml_forward refused {t.size} token(s) at pos {pos} (ML_E_ARG): a token "
                f"outside [0, {self.vocab}), or pos beyond the positions fed, or pos + n above "
                f"ctx {self.ctx}"
            )
        if st == abi.ML_E_FORMAT:
            raise NumericError(
                f"{self.path}: ml_forward of {t.size} token(s) at pos {pos} returned "
                f"ML_E_FORMAT: a non-finite activation (decision forward.nonfinite)"
            )
        if st != abi.ML_OK:
            raise BackendError(f"ml_forward returned {abi.status_name(st)}")
        return logits

    def reset(self) -> None:
        self._live()
        self.backend._call(f"reset({self.path!r})", "reset", self.handle)

    def close(self) -> None:
        self._free("free")


class TokenizerSession(_Handle):
    def encode(self, text: str) -> list[int]:
        self._live()
        data = text.encode("utf-8", "surrogatepass")
        st, ids = self.backend._call(
            f"encode({self.path!r}, {len(data)} bytes)", "tok_encode", self.handle, data
        )
        if st != abi.ML_OK:
            raise BackendError(f"ml_tok_encode returned {abi.status_name(st)}")
        return [int(i) for i in ids]

    def decode(self, ids: list[int]) -> bytes:
        self._live()
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        if a.size and (a.min() < INT32[0] or a.max() > INT32[1]):
            raise InputError("an id does not fit the ABI's int32_t")
        st, out = self.backend._call(
            f"decode({self.path!r}, ids[{a.size}])", "tok_decode", self.handle, a.astype(np.int32)
        )
        if st == abi.ML_E_ARG:
            raise InputError("ml_tok_decode refused the ids (ML_E_ARG): an id outside the vocabulary")
        if st != abi.ML_OK:
            raise BackendError(f"ml_tok_decode returned {abi.status_name(st)}")
        return out

    def close(self) -> None:
        self._free("tok_free")


class EmbedderSession(_Handle):
    def __init__(self, backend: LibraryBackend, handle: int, dim: int, vocab: int, path: str):
        super().__init__(backend, handle, path)
        self.dim, self.vocab = dim, vocab

    def embed(self, tokens: np.ndarray, pooling: str | None = None, normalize: bool = False) -> np.ndarray:
        self._live()
        t = tokens32(tokens)
        if pooling not in POOLING_CODES:
            raise InputError(f"pooling {pooling!r} is not one of {tuple(POOLING_CODES)}")
        st, out = self.backend._call(
            f"embed({self.path!r}, tokens[{t.size}], {pooling}, normalize={bool(normalize)})",
            "embed",
            self.handle,
            t.astype(np.int32),
            POOLING_CODES[pooling],
            int(bool(normalize)),
        )
        if st == abi.ML_E_ARG:
            bad = np.flatnonzero((t < 0) | (t >= self.vocab))
            if t.size == 0:
                why = "no tokens"
            elif bad.size:
                why = f"token {int(t[bad[0]])} at index {int(bad[0])} is outside [0, {self.vocab})"
            else:
                why = f"no rule refuses {t.size} tokens in [0, {self.vocab}) with pooling {pooling!r}"
            raise InputError(f"ml_embed refused the call (ML_E_ARG): {why}")
        if st == abi.ML_E_FORMAT:
            raise NumericError(
                f"{self.path}: ml_embed returned ML_E_FORMAT: the model's values overflow to "
                f"a non-finite activation (decision forward.nonfinite)"
            )
        if st != abi.ML_OK:
            raise BackendError(f"ml_embed returned {abi.status_name(st)}")
        return out

    def close(self) -> None:
        self._free("embed_free")
