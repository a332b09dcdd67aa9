"""How each area's cases are run and judged, one module per area: ``run(case, backend, work, r)``
calls the backend and fills the Result ``r`` (outcome, got, detail, metrics, output). cases.py
builds the cases, section by section in the same areas; runner.run_case picks the module.

status.py (header, loader and the tokenizer loader: statuses), quant.py, forward.py,
tokenizer.py (ids), bitnet.py (I2_S bits, embeddings, refusals).
"""
