#!/usr/bin/env bash
# Times `adapt plan` (best of 3) on every model in ../shared/models at 64 GPUs
# and on the synthesized ~2.8T reference model at 1,024 GPUs and 1M tokens.
# Usage: bench/bench_plan.sh [build/bin/adapt]
set -euo pipefail
cd "$(dirname "$0")/.."
adapt=${1:-build/bin/adapt}
models=${ADAPT_SHARED_MODELS:-../shared/models}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 bench/synthesize_reference_model.py "$adapt" "$work/reference" >/dev/null
best() { # args...
  local best=999
  for _ in 1 2 3; do
    local t0 t1
    t0=$(date +%s.%N)
    "$adapt" plan "$@" >/dev/null 2>&1 || true
    t1=$(date +%s.%N)
    best=$(python3 -c "print(min($best, $t1 - $t0))")
  done
  printf '%.3f' "$best"
}
printf '%-45s %8s\n' "model" "seconds"
for m in "$models"/*/; do
  [ -f "$m/config.json" ] || continue
  printf '%-45s %8s\n' "$(basename "$m")" "$(best "$m" --gpus 64)"
done
printf '%-45s %8s\n' "reference-2.8T (synthesized), 1024 GPUs, 1M" \
  "$(best "$work/reference" --gpus 1024 --seq-len 1048576 --global-batch 64)"
