#!/usr/bin/env bash
# Times `adapt gaps` on the largest real manifest in ../shared/models and on a
# synthesized manifest of the mission's ~2.8T reference model (best of 5).
# Usage: bench/bench_gaps.sh [build/bin/adapt]
source "$(dirname "$0")/bench_common.sh"
largest=$(ls -S "$models"/*/model.safetensors.index.json | head -n 1)
best() { best_of 5 "$adapt" gaps "$1" --out "$work/out"; } # dir
tensors() { python3 -c "import json,sys;print(len(json.load(open(sys.argv[1]))['weight_map']))" "$1"; }
printf '%-40s %10s %8s\n' "model" "tensors" "seconds"
printf '%-40s %10s %8s\n' "$(basename "$(dirname "$largest")")" "$(tensors "$largest")" "$(best "$(dirname "$largest")")"
printf '%-40s %10s %8s\n' "reference-2.8T (synthesized)" "$(tensors "$work/reference/model.safetensors.index.json")" "$(best "$work/reference")"
"$adapt" inspect "$work/reference" | sed -n '/parameters/,/active/p'
