#!/usr/bin/env bash
# Here (with MLIR): what bench/h200_validate.sh runs on the H200, into .h200/
# (gitignored; carried with `carry: [".h200"]`): each family's tiny model in
# .h200/tiny/F and its trainer project in .h200/la-gen/F, generated with the
# fixture's LoRA targets (as tests/e2e/test_loss_alignment.py does).
# usage: bench/h200_validate_prepare.sh [FAMILIES] [RANK]   (default: the six of
#        the default test tier; rank 4, alpha twice the rank)
set -euo pipefail
cd "$(dirname "$0")/.."
ADAPT=${ADAPT:-build/bin/adapt}
RANK=${2:-4}
for f in ${1:-qwen3_moe deepseek_v3 gpt_oss llama4 minimax qwen3_next}; do
  rm -rf .h200/tiny/$f .h200/la-gen/$f
  $ADAPT tiny $f --out .h200/tiny/$f > /dev/null
  targets=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(",".join(m["lora"]["target_modules"] + ["experts"]))' \
    validation/fixtures/$f/fixture.json)
  $ADAPT build .h200/tiny/$f --out .h200/la-gen/$f --no-compile --lora-targets "$targets" \
    --lora-rank $RANK --lora-alpha $((2 * RANK)) > /dev/null
  echo ".h200/la-gen/$f"
done
