#!/bin/sh
# OSS-Fuzz style build of the libFuzzer targets (https://google.github.io/oss-fuzz/), run from the
# repository root. $CC, $CFLAGS (the sanitizer flags), $LIB_FUZZING_ENGINE and $OUT come from the
# fuzzing infrastructure; without them: clang, ASan + UBSan, -fsanitize=fuzzer, fuzz/build.
# The sources and their ISA flags are backends/native/build.py's, so the two cannot drift.
set -eu
: "${CC:=clang}" "${OUT:=backends/native/fuzz/build}"
export LIB_FUZZING_ENGINE="${LIB_FUZZING_ENGINE:--fsanitize=fuzzer}"
mkdir -p "$OUT"
for target in mlb_check mlt_load gguf_load; do
  python3 backends/native/build.py --fuzz "$target" --cc "$CC" "$OUT/$target"
  cp "backends/native/fuzz/${target%%_*}.dict" "$OUT/$target.dict"
done
