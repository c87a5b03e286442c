#!/usr/bin/env bash
# Here (with MLIR): the generated trainer projects the H200 scripts build with
# LibTorch alone, written to .h200/ (gitignored; carried to the device with
# `carry: [".h200"]`):
#   .h200/q30-L<N>         Qwen3-30B-A3B's widths at N layers, LoRA r=16,
#                          alpha 32 on q/k/v/o and the routed experts
#                          (h200_speed.sh: every depth; h200_train.sh and
#                          h200_parallel.sh: L4);
#   .h200/tiny-qwen3-moe   models/tiny-qwen3-moe with the default LoRA
#                          (h200_parallel.sh);
#   .h200/qn-L<N>          Qwen3-Next-80B-A3B's widths (Gated DeltaNet hybrid)
#                          at each depth of NEXT_DEPTHS (default none), LoRA
#                          r=16 on q/k/v/o, in_proj_qkvz, out_proj and the
#                          routed experts, with .h200/qn-L<N>-model: the
#                          manifest and random_weights.json that
#                          bench/fill_random_weights.py fills on the device
#                          (h200_speed.sh with NAME=qn).
# usage: bench/h200_prepare.sh [DEPTHS]   (default "1 4 12 48")
set -euo pipefail
cd "$(dirname "$0")/.."
ADAPT=${ADAPT:-build/bin/adapt}
PY=${ADAPT_PYTHON:-.venv/bin/python}
for n in ${1:-1 4 12 48}; do
  W=$(mktemp -d /tmp/q30-manifest-XXXXXX)
  $PY bench/make_random_qwen3_moe.py bench/h200/qwen3-30b-a3b-config.json --layers $n --out $W --manifest-only
  rm -rf .h200/q30-L$n
  $ADAPT build $W --out .h200/q30-L$n --no-compile --lora-targets q_proj,k_proj,v_proj,o_proj,experts \
    --lora-rank 16 --lora-alpha 32 > /dev/null
  rm -rf $W
  echo ".h200/q30-L$n"
done
for n in ${NEXT_DEPTHS:-}; do
  rm -rf .h200/qn-L$n .h200/qn-L$n-model
  $ADAPT tiny qwen3_next --config bench/h200/qwen3-next-80b-a3b-config.json --layers $n --manifest-only \
    --out .h200/qn-L$n-model > /dev/null
  $ADAPT build .h200/qn-L$n-model --out .h200/qn-L$n --no-compile \
    --lora-targets q_proj,k_proj,v_proj,o_proj,in_proj_qkvz,out_proj,experts --lora-rank 16 --lora-alpha 32 > /dev/null
  echo ".h200/qn-L$n"
done
rm -rf .h200/tiny-qwen3-moe
$ADAPT build models/tiny-qwen3-moe --out .h200/tiny-qwen3-moe --no-compile > /dev/null
echo ".h200/tiny-qwen3-moe"
