#!/usr/bin/env bash
# The H200 run that judges the kernels gated by ADAPT_UNCHECKED_KERNELS
# (runtime/Ops.h: uncheckedKernelsEnabled): their op checks on CUDA, bf16 loss
# alignment with them on, and the 12-layer Qwen3-30B-A3B step with them off
# and on, side by side with transformers + PEFT, then a kernel-level profile
# with them on. When all of it passes, the gate can go.
# usage: bench/h200_unchecked.sh OUTDIR   (here first: bench/h200_prepare.sh "1 12" and
#        bench/h200_validate_prepare.sh "qwen3_moe deepseek_v3 qwen3_next" 16; carry .h200)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_unchecked.sh OUTDIR}; mkdir -p "$OUT"
W=/tmp/adapt-h200; mkdir -p $W
PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S runtime -B $W/rt -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" > $OUT/cmake-runtime.log 2>&1 ||
  { tail -20 $OUT/cmake-runtime.log; exit 1; }
cmake --build $W/rt --target adapt_runtime adapt-op-check > $OUT/build-runtime.log 2>&1 ||
  { grep -B2 -A8 error $OUT/build-runtime.log | head -60; exit 1; }
export ADAPT_UNCHECKED_KERNELS=1
for only in route expert_mlp grouped_linear; do
  $W/rt/adapt-op-check --out $OUT/ops-$only --device cuda --seeds 2 --only $only 2>&1 | tail -3
done
FAMILIES="${FAMILIES:-qwen3_moe deepseek_v3 qwen3_next}" LORA_RANK=16 TAG=-unchecked bash bench/h200_validate.sh $OUT/align
ADAPT_UNCHECKED_KERNELS=0 DEPTHS="1 12" PEER=0 PROFILE=0 MODELS=/dev/shm bash bench/h200_speed.sh $OUT/speed-off
DEPTHS="1 12" PEER_DEPTHS=12 PROFILE_DEPTHS=12 MODELS=/dev/shm bash bench/h200_speed.sh $OUT/speed-on
python3 bench/h200/trace_kernels.py $W/prof-L12/profile/trace.json 2 80 > $OUT/kernels-L12.md 2>/dev/null
head -30 $OUT/kernels-L12.md | cut -c1-200
