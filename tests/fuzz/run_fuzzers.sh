#!/usr/bin/env bash
# Builds each parser's libFuzzer target with clang-19 (ASan + UBSan) and runs
# it for a bounded time on its seed corpus. Usage: run_fuzzers.sh SECONDS OUTDIR
set -euo pipefail
seconds=${ADAPT_FUZZ_SECONDS:-${1:-20}}
out=${2:-build/fuzz}
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
flags="-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$src"
build() { # name sources...
  local name=$1; shift
  if [ ! -x "$out/$name" ] || [ -n "$(find "$@" -newer "$out/$name" 2>/dev/null)" ]; then
    echo "== building $name"
    clang++-19 $flags "$@" -o "$out/$name" ${LIBS:-}
  fi
}
build fuzz-config "$src/tests/fuzz/FuzzConfig.cpp" "$src/parser/ConfigReader.cpp" "$src/parser/SizeLimits.cpp" \
  "$src/parser/ConfigKeys.cpp" "$src/models/WeightSchema.cpp"
build fuzz-manifest "$src/tests/fuzz/FuzzManifest.cpp" "$src/parser/Manifest.cpp" "$src/parser/Safetensors.cpp"
build fuzz-safetensors "$src/tests/fuzz/FuzzSafetensors.cpp" "$src/parser/Safetensors.cpp" "$src/parser/Manifest.cpp"
LIBS="-lonnx_proto -lprotobuf" build fuzz-onnx "$src/tests/fuzz/FuzzOnnx.cpp" \
  "$src/parser/OnnxModel.cpp" "$src/parser/OnnxComponents.cpp" -DONNX_NAMESPACE=onnx -DONNX_ML=1
for target in config manifest safetensors onnx; do
  corpus="$out/corpus-$target"
  mkdir -p "$corpus"
  echo "== fuzzing $target for ${seconds}s"
  "$out/fuzz-$target" "$corpus" "$src/tests/fuzz/corpus/$target" \
    -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -print_final_stats=0 2>&1 | tail -n 3
done
echo "== fuzz runs found nothing"
