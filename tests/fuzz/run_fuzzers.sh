#!/usr/bin/env bash
# Builds each parser's libFuzzer target with clang-19 (ASan + UBSan) and runs
# it for a bounded time on its seed corpus. Usage: run_fuzzers.sh SECONDS OUTDIR
#   run_fuzzers.sh --build-only [OUTDIR]   only (re)builds the targets
#                                          (what run_at_scale.sh calls)
set -euo pipefail
build_only=
[ "${1:-}" = "--build-only" ] && build_only=1
seconds=${ADAPT_FUZZ_SECONDS:-${1:-20}}
out=${2:-build/fuzz}
src=$(cd "$(dirname "$0")/../.." && pwd)
targets="config manifest safetensors onnx jsonrpc"
mkdir -p "$out"
flags="-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$src"
build() { # name sources-and-flags... ; DEPS: more files that make it stale
  local name=$1; shift
  local files=() arg
  for arg in "$@" ${DEPS:-}; do [ -f "$arg" ] && files+=("$arg"); done
  if [ ! -x "$out/$name" ] || [ -n "$(find "${files[@]}" -newer "$out/$name" 2>/dev/null)" ]; then
    echo "== building $name"
    clang++-19 $flags "$@" -o "$out/$name" ${LIBS:-}
  fi
}
build fuzz-config "$src/tests/fuzz/FuzzConfig.cpp" "$src/parser/ConfigReader.cpp" "$src/parser/SizeLimits.cpp" \
  "$src/parser/ConfigKeys.cpp" "$src/models/WeightSchema.cpp"
build fuzz-manifest "$src/tests/fuzz/FuzzManifest.cpp" "$src/parser/Manifest.cpp" "$src/parser/Safetensors.cpp"
build fuzz-safetensors "$src/tests/fuzz/FuzzSafetensors.cpp" "$src/parser/Safetensors.cpp" "$src/parser/Manifest.cpp"
LIBS="-lonnx_proto -lprotobuf" build fuzz-onnx "$src/tests/fuzz/FuzzOnnx.cpp" \
  "$src/parser/OnnxModel.cpp" "$src/parser/OnnxComponents.cpp" "$src/parser/Safetensors.cpp" "$src/parser/Manifest.cpp" \
  -DONNX_NAMESPACE=onnx -DONNX_ML=1
# FuzzJsonRpc.cpp includes McpServer.cpp itself (its class is file-local).
mcp=$src/agent/mcp
LIBS="-lcpp-httplib -pthread" DEPS="$mcp/McpServer.cpp $(echo "$mcp"/*.h)" build fuzz-jsonrpc \
  "$src/tests/fuzz/FuzzJsonRpc.cpp" "$mcp/McpTransport.cpp" "$mcp/McpProtocol.cpp" "$mcp/McpTasks.cpp" "$mcp/McpParamHeaders.cpp" "$mcp/ConnectionGuard.cpp" \
  "$mcp/McpFixtures.cpp" "$mcp/McpFixturesMultiRound.cpp" "$mcp/McpFixturesTasks.cpp"
[ -n "$build_only" ] && exit 0
for target in $targets; do
  corpus="$out/corpus-$target"
  mkdir -p "$corpus"
  echo "== fuzzing $target for ${seconds}s"
  "$out/fuzz-$target" "$corpus" "$src/tests/fuzz/corpus/$target" \
    -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -print_final_stats=0 2>&1 | tail -n 3
done
echo "== fuzz runs found nothing"
