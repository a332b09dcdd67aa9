"""llama.cpp's own readers asked about a GGUF file as it is (the load_gguf capability): ggml's
gguf_init_from_file (no_alloc, as llama.cpp's model loader calls it first), then, when that reads
the file, llama_model_load_from_file (its keys, tensor shapes and data bounds; mmap, no weights
copied). Nothing of mlconf reads the file first: a crash or a hang is llama.cpp's, and the case
says so. Its refusals carry no rule id (llama.cpp names none): status only; the reason is the
text llama.cpp logged."""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path

LOG = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
GGML_LOG_LEVEL_ERROR = 4


class _InitParams(ctypes.Structure):  # struct gguf_init_params (ggml/include/gguf.h)
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


class GgufCheck:
    def __init__(self, lib_dir: Path, llama_cpp):
        self.llama_cpp = llama_cpp
        self.ggml = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
        self.ggml.gguf_init_from_file.restype = ctypes.c_void_p
        self.ggml.gguf_init_from_file.argtypes = [ctypes.c_char_p, _InitParams]
        self.ggml.gguf_free.argtypes = [ctypes.c_void_p]
        self.lines: list[str] = []
        self._log = LOG(self._keep)  # referenced for as long as ggml may call it
        llama_log = llama_cpp.llama_log_callback(self._keep)  # llama.cpp's own lines (the model loader)
        self._logs = (self._log, llama_log)
        llama_cpp.llama_log_set(llama_log, ctypes.c_void_p(0))
        self.ggml.ggml_log_set.argtypes = [LOG, ctypes.c_void_p]
        self.ggml.ggml_log_set(self._log, None)  # ggml's (the GGUF reader)

    def _keep(self, level: int, text: bytes, _user) -> None:
        if level >= GGML_LOG_LEVEL_ERROR and text:
            self.lines.append(text.decode("utf-8", "replace").strip())

    def _said(self) -> str:
        said = "; ".join(line for line in self.lines if line)
        self.lines.clear()
        return said or "(nothing logged)"

    def load_gguf(self, path: str) -> dict:
        try:
            fifo = stat.S_ISFIFO(os.stat(path).st_mode)
        except OSError:
            fifo = False  # llama.cpp is asked, and says why it cannot open it
        if fifo:
            from .replies import NotHere

            # fopen of a FIFO with no writer blocks for ever: llama.cpp cannot be asked without a hang
            raise NotHere(f"{path} is a FIFO: llama.cpp's fopen blocks until a writer comes (it would hang)")
        self.lines.clear()
        ctx = self.ggml.gguf_init_from_file(os.fsencode(path), _InitParams(True, None))
        if not ctx:
            said = self._said()
            # its one distinction: a file it cannot open (fopen failed) is an I/O error
            status = "ML_E_IO" if "failed to open" in said else "ML_E_FORMAT"
            return {"status": status, "reason": f"{path}: gguf_init_from_file: {said}"}
        self.ggml.gguf_free(ctx)
        lc = self.llama_cpp
        params = lc.llama_model_default_params()
        params.use_mmap = True
        model = lc.llama_model_load_from_file(os.fsencode(path), params)
        if not model:
            return {"status": "ML_E_FORMAT", "reason": f"{path}: llama_model_load_from_file: {self._said()}"}
        lc.llama_model_free(model)
        self.lines.clear()
        return {"status": "ML_OK", "reason": f"{path}: llama.cpp loads it"}
