"""The reference backend: NumPy, the readable truth (loader, quantizers, forward, tokenizer, I2_S
math and BitNet GGUF embeddings).

backend.py: the Backend; layout.py: the format layout read from the specs; loader.py: every
validation rule; quant.py: the quantizers; forward.py: the forward pass; portable.py: float math
with the same bits on every host; tokenizer.py, pretokenize.py, mlt.py: the MLT tokenizer;
nfc.py and unicode_classes.py: its Unicode tables; gguf_vocab.py: text with a GGUF's own
vocabulary; i2s.py and bitnet.py: the I2_S math and the BitNet embeddings.
"""

from .backend import Embedder, ReferenceBackend

__all__ = ["Embedder", "ReferenceBackend"]
