"""An mlconf plug-in backend: the Q8_0 quantizer of specs/quant.yaml in NumPy (its own code, not
mlconf's reference). Registered by pyproject.toml under the entry-point group "mlconf.backends":

    pip install examples/plugin_backend
    mlconf run -b example-q8 --area quant

A backend is any object with ``name``, ``capabilities`` (names of mlconf.backends.CAPABILITIES)
and a method per capability; the harness calls only the capabilities declared (the others are
reported "unsupported"). Refused inputs raise ValueError, as mlconf's own quantizers do.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32


class ExampleQ8Backend:
    capabilities = frozenset({"quantize_q8_0"})

    def __init__(self, name: str):
        self.name = name
        self.description = "mlconf-example-q8: a NumPy Q8_0 quantizer (examples/plugin_backend)"

    def quantize_q8_0(self, x: np.ndarray, f16: bool) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x)
        if x.dtype != np.float32 or x.ndim == 0 or x.shape[-1] % BLOCK:
            raise ValueError(
                f"need float32 rows of a multiple of {BLOCK} values, got {x.dtype}{list(x.shape)}"
            )
        if not np.isfinite(x).all():
            raise ValueError("non-finite input")
        blocks = x.reshape(-1, BLOCK)
        amax = np.max(np.abs(blocks), axis=1)
        used = amax >= np.float32(1e-30)
        safe = np.where(used, amax, np.float32(1))  # no division by zero below
        d = np.where(used, safe / np.float32(127), np.float32(0)).astype(np.float32)
        if f16:
            if (d > np.float32(65504)).any():
                raise ValueError("a block's scale is above 65504 and cannot be stored as f16")
            d_store = d.astype(np.float16)
            used = used & (d_store != 0)
            scale = np.float32(1) / np.where(used, d_store, np.float16(1)).astype(np.float32)
        else:
            d_store = d
            scale = np.float32(127) / safe
        t = blocks * scale[:, None].astype(np.float32)
        t = t + np.copysign(np.float32(0.5), blocks)
        q = np.clip(np.trunc(t), -127, 127)
        q = np.where(used[:, None], q, 0).astype(np.int8)
        d_store = np.where(used, d_store, 0).astype(d_store.dtype)
        return q.reshape(x.shape), d_store.reshape(*x.shape[:-1], -1)


def factory(name: str) -> ExampleQ8Backend:
    return ExampleQ8Backend(name)
