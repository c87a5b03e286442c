#!/usr/bin/env bash
# Times `adapt plan` (best of 3) on every model in ../shared/models at 64 GPUs
# and on the synthesized ~2.8T reference model at 1,024 GPUs and 1M tokens.
# Usage: bench/bench_plan.sh [build/bin/adapt]
source "$(dirname "$0")/bench_common.sh"
best() { best_of 3 "$adapt" plan "$@"; } # args...
printf '%-45s %8s\n' "model" "seconds"
for m in "$models"/*/; do
  [ -f "$m/config.json" ] || continue
  printf '%-45s %8s\n' "$(basename "$m")" "$(best "$m" --gpus 64)"
done
printf '%-45s %8s\n' "reference-2.8T (synthesized), 1024 GPUs, 1M" \
  "$(best "$work/reference" --gpus 1024 --seq-len 1048576 --global-batch 64)"
