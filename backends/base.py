"""The Backend protocol: what every backend (reference, native, bitnet, lib:, ...) offers.

A backend has a name, a set of capability names and one method per capability. A capability it
lacks, or a variant of one it cannot do (a quantizer rule, say), raises Unsupported; the harness
reports that as "unsupported", never as a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

# Capability name -> what it means (the columns of `mlconf backends`).
CAPABILITIES = {
    "load": "validate an .mlb file: load(path) -> LoadResult",
    "quantize_q8_0": "Q8_0 quantizer: quantize_q8_0(x, f16) -> (q int8, d f32|f16)",
    "quantize_q4_0": "Q4_0 quantizer: quantize_q4_0(x, rule, f16, importance) -> (q u8, d f32|f16)",
    "forward": "logits: open_model(path, ctx) -> session; session.forward(tokens, pos) -> (n, vocab) f32",
    "load_tokenizer": "validate an .mlt file: load_tokenizer(path, model_vocab) -> LoadResult",
    "encode": "open_tokenizer(path) -> session; session.encode(text) -> ids, session.decode(ids) -> bytes",
    "i2s": "I2_S math: i2s_quantize(w) -> payload bytes; i2s_quantize_act(x) -> (q int8, scale f32, "
    "sum int32); i2s_matmul(payload, shape, x) -> y f32",
    "embed": "BitNet GGUF embeddings: open_embedder(path, reading) -> session; "
    "session.embed(tokens, pooling, normalize) -> (dim,) f32",
    "load_gguf": "validate a BitNet embedding GGUF (specs/gguf.yaml): load_gguf(path) -> LoadResult",
}
# Variants a runtime may claim one by one (`--require quantize_q4_0.round`): a case's unsupported
# outcome fails the gate when the gate holds its capability, or every variant the case needs.
SUB_CAPABILITIES = {
    "quantize_q8_0.f16": "Q8_0 with binary16 scales",
    "quantize_q4_0.round": "Q4_0, the round rule (llama.cpp's)",
    "quantize_q4_0.search": "Q4_0, the search rule (specs/quant.yaml)",
    "quantize_q4_0.f16": "Q4_0 with binary16 scales",
    "quantize_q4_0.importance": "Q4_0 search weighted by an importance vector (an imatrix)",
}
POOLINGS = (None, "mean", "cls", "last")  # EmbedderSession.embed: None is the model's own pooling
# open_embedder's reading of the projections: None is the file's own (bitnet.cpp's: ternary for
# I2_S, float for f32/f16), "float" plain matmuls, "ternary" BitLinear on the latent weights
READINGS = (None, "float", "ternary")
STATUSES = ("ML_OK", "ML_E_IO", "ML_E_FORMAT", "ML_E_SHAPE")
# the kernel table names of ml_set_isa: libmlrt's (native:ISA) and libmlbitnet's (bitnet:ISA)
NATIVE_ISAS = ("scalar", "avx2", "avxvnni", "avx512", "neon", "neon-dotprod")
BITNET_ISAS = ("scalar", "avx2", "avxvnni", "avx512")


class Unsupported(Exception):
    """The backend lacks this capability or this variant of it."""


class BackendError(Exception):
    """A backend name that cannot be resolved, or a backend that failed to start."""


class InputError(ValueError):
    """A valid model asked for something it cannot do (a token out of range, pos beyond ctx)."""


class NumericError(ArithmeticError):
    """A forward (or embed) call met a non-finite activation: NaN or infinite weights in the file, or
    values that overflow float32 (decision forward.nonfinite). The call's positions are not fed."""


class WorkerCrash(BackendError):
    """The worker process of an isolated backend (native, lib:PATH) died during a call: killed by a
    signal (the message names it, e.g. SIGSEGV) or exited. The next call starts a fresh worker."""


class WorkerTimeout(BackendError):
    """A call to an isolated backend's worker took longer than its timeout; the worker was killed
    and the next call starts a fresh one."""


@dataclass
class LoadResult:
    status: str  # one of STATUSES
    reason: str = ""
    # the id of the rule that refused the file (specs/mlb_errors.yaml, specs/mlt.yaml), "" when
    # accepted; None when the backend does not say (its loader cases are judged by status only)
    rule: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ML_OK"


@runtime_checkable
class Backend(Protocol):
    name: str
    capabilities: frozenset[str]

    def load(self, path: str) -> LoadResult: ...

    def quantize_q8_0(self, x: np.ndarray, f16: bool) -> tuple[np.ndarray, np.ndarray]: ...

    def quantize_q4_0(
        self, x: np.ndarray, rule: str, f16: bool, importance: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def open_model(self, path: str, ctx: int | None = None) -> ModelSession: ...

    def load_tokenizer(self, path: str, model_vocab: int | None = None) -> LoadResult: ...

    def open_tokenizer(self, path: str) -> TokenizerSession: ...

    # -- "i2s" (specs/i2s.yaml); a refused input (shape, dtype, non-finite value, payload length,
    # code 3) raises ValueError, as quantize_q8_0 does
    def i2s_quantize(self, w: np.ndarray) -> bytes:
        """The GGUF I2_S payload of a float32/float16 weight (rows, cols) or one row (cols,):
        rows*cols/4 packed bytes, the f32 scale, 28 zero bytes."""
        ...

    def i2s_quantize_act(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-row int8 activations of float32 x (rows, cols) or (cols,): (q int8 of x's shape,
        scale f32 and sum int32 of shape x.shape[:-1])."""
        ...

    def i2s_matmul(self, payload: bytes, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
        """BitLinear y = x W^T of float32 x (n, cols) or (cols,) with the payload of a (rows, cols)
        weight: float32 (n, rows) or (rows,)."""
        ...

    # -- "embed"; a GGUF the backend refuses raises InputError with the reason; a reading the
    # backend cannot do raises Unsupported
    def open_embedder(self, path: str, reading: str | None = None) -> EmbedderSession: ...

    # -- "load_gguf": the status (and rule, when the backend names it) of a GGUF's first broken rule
    def load_gguf(self, path: str) -> LoadResult: ...


class TokenizerSession(Protocol):
    """A loaded .mlt tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> bytes: ...


class EmbedderSession(Protocol):
    """A loaded BitNet embedding model (GGUF). ``dim``: the embedding width; ``vocab``: the number
    of token ids. embed raises InputError for no tokens, a token outside [0, vocab) or a pooling
    not in POOLINGS."""

    dim: int
    vocab: int

    def embed(self, tokens: np.ndarray, pooling: str | None = None, normalize: bool = False) -> np.ndarray:
        """The pooled embedding, float32 (dim,): pooling "mean", "cls", "last" or None (the model's
        pooling_type, mean when it has none); normalize divides by the L2 norm."""
        ...

    def close(self) -> None: ...


class ModelSession(Protocol):
    """A loaded model with its KV cache; positions must be fed in order (reset to start over)."""

    def forward(self, tokens: np.ndarray, pos: int) -> np.ndarray: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


def token_array(tokens) -> np.ndarray:
    """Token ids as a 1-D integer array (an empty one allowed), values unchanged; InputError
    otherwise. Every backend checks its tokens so."""
    t = np.asarray(tokens)
    if t.ndim != 1 or not (np.issubdtype(t.dtype, np.integer) or t.size == 0):
        raise InputError(f"tokens must be a 1-D integer array, got {t.dtype}{list(t.shape)}")
    return t


def as_rows(a: np.ndarray, what: str) -> np.ndarray:
    """A 1-D or 2-D array as C-contiguous (rows, cols) (ValueError otherwise); the size rules are
    the backend's."""
    if a.ndim not in (1, 2):
        raise ValueError(f"{what} must be 1-D or 2-D, got shape {a.shape}")
    return np.ascontiguousarray(a.reshape(1, -1) if a.ndim == 1 else a)
