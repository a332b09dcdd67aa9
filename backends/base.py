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
}
STATUSES = ("ML_OK", "ML_E_IO", "ML_E_FORMAT", "ML_E_SHAPE")


class Unsupported(Exception):
    """The backend lacks this capability or this variant of it."""


class BackendError(Exception):
    """A backend name that cannot be resolved, or a backend that failed to start."""


class InputError(ValueError):
    """A valid model asked for something it cannot do (a token out of range, pos beyond ctx)."""


class WorkerCrash(BackendError):
    """The worker process of an isolated backend (native, lib:PATH) died during a call: killed by a
    signal (the message names it, e.g. SIGSEGV) or exited. The next call starts a fresh worker."""


class WorkerTimeout(BackendError):
    """A call to an isolated backend's worker took longer than its timeout; the worker was killed
    and the next call starts a fresh one."""


@dataclass
class LoadResult:
    status: str                 # one of STATUSES
    reason: str = ""
    rule: str = ""              # reference only: the failing rule id of specs/mlb_errors.yaml

    @property
    def ok(self) -> bool:
        return self.status == "ML_OK"


@runtime_checkable
class Backend(Protocol):
    name: str
    capabilities: frozenset[str]

    def load(self, path: str) -> LoadResult: ...

    def quantize_q8_0(self, x: np.ndarray, f16: bool) -> tuple[np.ndarray, np.ndarray]: ...

    def quantize_q4_0(self, x: np.ndarray, rule: str, f16: bool,
                      importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]: ...

    def open_model(self, path: str, ctx: int | None = None) -> ModelSession: ...

    def load_tokenizer(self, path: str, model_vocab: int | None = None) -> LoadResult: ...

    def open_tokenizer(self, path: str) -> TokenizerSession: ...


class TokenizerSession(Protocol):
    """A loaded .mlt tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> bytes: ...


class ModelSession(Protocol):
    """A loaded model with its KV cache; positions must be fed in order (reset to start over)."""

    def forward(self, tokens: np.ndarray, pos: int) -> np.ndarray: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...
