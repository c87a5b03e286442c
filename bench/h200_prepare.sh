#!/usr/bin/env bash
# Here (with MLIR): the generated trainer projects bench/h200_speed.sh builds on
# the H200, one per depth of Qwen3-30B-A3B's widths, in .h200/q30-L<N>
# (gitignored; carried to the device with `carry: [".h200"]`).
# usage: bench/h200_speed_prepare.sh [DEPTHS]   (default "1 12 48")
set -euo pipefail
cd "$(dirname "$0")/.."
ADAPT=${ADAPT:-build/bin/adapt}
PY=${ADAPT_PYTHON:-.venv/bin/python}
for n in ${1:-1 12 48}; do
  W=$(mktemp -d /tmp/q30-manifest-XXXXXX)
  $PY bench/make_random_qwen3_moe.py bench/h200/qwen3-30b-a3b-config.json --layers $n --out $W --manifest-only
  rm -rf .h200/q30-L$n
  $ADAPT build $W --out .h200/q30-L$n --no-compile --lora-targets q_proj,k_proj,v_proj,o_proj,experts \
    --lora-rank 16 --lora-alpha 32 > /dev/null
  rm -rf $W
  echo ".h200/q30-L$n"
done
