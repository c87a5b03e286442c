#!/usr/bin/env bash
# Times `adapt gaps` on the largest real manifest in ../shared/models and on a
# synthesized manifest of the mission's ~2.8T reference model (best of 5).
# Usage: bench/bench_gaps.sh [build/bin/adapt]
set -euo pipefail
cd "$(dirname "$0")/.."
adapt=${1:-build/bin/adapt}
models=${ADAPT_SHARED_MODELS:-../shared/models}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
largest=$(ls -S "$models"/*/model.safetensors.index.json | head -n 1)
python3 bench/synthesize_reference_model.py "$adapt" "$work/reference" >/dev/null
best() { # dir
  local best=999
  for _ in 1 2 3 4 5; do
    local t0 t1
    t0=$(date +%s.%N)
    "$adapt" gaps "$1" --out "$work/out" >/dev/null 2>&1 || true
    t1=$(date +%s.%N)
    best=$(python3 -c "print(min($best, $t1 - $t0))")
  done
  printf '%.3f' "$best"
}
tensors() { python3 -c "import json,sys;print(len(json.load(open(sys.argv[1]))['weight_map']))" "$1"; }
printf '%-40s %10s %8s\n' "model" "tensors" "seconds"
printf '%-40s %10s %8s\n' "$(basename "$(dirname "$largest")")" "$(tensors "$largest")" "$(best "$(dirname "$largest")")"
printf '%-40s %10s %8s\n' "reference-2.8T (synthesized)" "$(tensors "$work/reference/model.safetensors.index.json")" "$(best "$work/reference")"
"$adapt" inspect "$work/reference" | sed -n '/parameters/,/active/p'
