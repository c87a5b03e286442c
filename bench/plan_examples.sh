#!/usr/bin/env bash
# Regenerates the committed example plans in docs/plans/ (issue 20): DeepSeek-V3
# and Kimi-K2 on 2 and 8 nodes of 8 H200, Qwen3-235B on one node, and the
# synthesized ~2.8T hybrid reference model on 16 to 128 nodes at 128K and 1M
# tokens of context. Usage: bench/plan_examples.sh [build/bin/adapt]
set -uo pipefail
cd "$(dirname "$0")/.."
adapt=${1:-build/bin/adapt}
models=${ADAPT_SHARED_MODELS:-../shared/models}
out=docs/plans
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 bench/synthesize_reference_model.py "$adapt" "$work/reference" >/dev/null
run() { # name path args...
  local name=$1 path=$2
  shift 2
  "$adapt" plan "$path" "$@" --out "$work/$name" > "$work/$name.txt" 2>&1
  echo "$name: exit $?"
  cp "$work/$name/plan.md" "$out/$name.md"
}
mkdir -p "$out"
run deepseek-v3-16gpu "$models/DeepSeek-V3-Base" --gpus 16
run deepseek-v3-64gpu "$models/DeepSeek-V3-Base" --gpus 64
run kimi-k2-16gpu "$models/Kimi-K2-Instruct" --gpus 16
run kimi-k2-64gpu "$models/Kimi-K2-Instruct" --gpus 64
run qwen3-235b-8gpu "$models/Qwen3-235B-A22B" --gpus 8
for nodes in 16 32 64 128; do
  run reference-2.8t-${nodes}nodes-128k "$work/reference" --gpus $((nodes * 8)) --seq-len 131072 --global-batch $((nodes * 8))
done
for nodes in 64 128; do
  run reference-2.8t-${nodes}nodes-1m "$work/reference" --gpus $((nodes * 8)) --seq-len 1048576 --global-batch $((nodes))
done
