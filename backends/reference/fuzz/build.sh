#!/bin/sh
# OSS-Fuzz style build of the atheris targets of the reference loaders
# (https://google.github.io/oss-fuzz/getting-started/new-project-guide/python-lang/), run from
# the repository root inside the infrastructure's Python base image, where compile_python_fuzzer
# packs each target with PyInstaller into $OUT. The dictionaries are the libFuzzer targets'.
set -eu
pip3 install .
for target in fuzz_mlb_load fuzz_mlt_load fuzz_gguf_load; do
  compile_python_fuzzer "backends/reference/fuzz/$target.py" --collect-data mlconf.specs
  kind=${target#fuzz_}
  cp "backends/native/fuzz/${kind%%_*}.dict" "$OUT/$target.dict"
done
