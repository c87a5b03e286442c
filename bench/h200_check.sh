#!/usr/bin/env bash
# CUDA correctness on the H200: the runtime built with LibTorch alone, then
# each tiny family's generated model against transformers + PEFT, in fp32
# and bf16 on the GPU. Tiny models and generated projects travel in .h200/
# (made here by `adapt tiny` and `adapt build --no-compile`).
# usage: bench/h200_check.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_check.sh OUTDIR}; mkdir -p "$OUT"
W=/tmp/adapt-h200; mkdir -p $W
PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
if [ ! -f $W/rt/AdaptRuntimeConfig.cmake ]; then
  echo "== building the runtime (LibTorch only)"
  cmake -S runtime -B $W/rt -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" > $OUT/cmake-runtime.log 2>&1 || { tail -20 $OUT/cmake-runtime.log; exit 1; }
  cmake --build $W/rt --target adapt_runtime > $OUT/build-runtime.log 2>&1 || { tail -30 $OUT/build-runtime.log; exit 1; }
fi
python3 bench/h200/grouped_mm_alignment.py
for f in ${FAMILIES:-$(ls .h200/gen)}; do
  cmake -S bench/h200/parity -B $W/parity-$f -G Ninja -DGEN=$PWD/.h200/gen/$f -DAdaptRuntime_DIR=$W/rt > /dev/null 2>&1
  cmake --build $W/parity-$f > $OUT/build-parity-$f.log 2>&1 || { echo "$f: build failed"; tail -20 $OUT/build-parity-$f.log; continue; }
  for dt in fp32 bf16; do
    $W/parity-$f/parity .h200/tiny/$f $W/out-$f-$dt cuda $dt 2>&1 | tail -1
    echo "$f cuda $dt:"
    python3 bench/h200/parity/compare.py .h200/tiny/$f $W/out-$f-$dt $dt 2>&1 | grep "vs transformers\|Error" | tail -3
  done
done | tee $OUT/parity.txt
