#!/usr/bin/env bash
# Here (with MLIR): what bench/h200_validate.sh runs on the H200, into .h200/
# (gitignored; carried with `carry: [".h200"]`): each family's tiny model in
# .h200/tiny/F and its trainer project in .h200/la-gen/F, generated with the
# fixture's LoRA targets (as tests/e2e/test_loss_alignment.py does).
# usage: bench/h200_validate_prepare.sh [FAMILIES] [RANK]   (default: the six of
#        the default test tier; rank 4, alpha twice the rank). A family F-d128
#        (qwen3_next-d128, kimi_linear-d128, minimax-d128) is F's tiny model
#        with 128-wide linear-attention heads, so the delta rule's CUDA
#        kernels (lightning's too) run in it.
set -euo pipefail
cd "$(dirname "$0")/.."
ADAPT=${ADAPT:-build/bin/adapt}
RANK=${2:-4}
for f in ${1:-qwen3_moe deepseek_v3 gpt_oss llama4 minimax qwen3_next}; do
  rm -rf .h200/tiny/$f .h200/la-gen/$f
  base=${f%-d128}
  if [ "$base" != "$f" ]; then
    # F-d128: the tiny model with 128-wide linear-attention heads, the width
    # the delta rule's CUDA kernels take (the tiny ones are 16-32 wide).
    $ADAPT tiny $base --out .h200/tiny/$f.base > /dev/null
    python3 - .h200/tiny/$f.base/config.json .h200/tiny/$f.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
if "linear_key_head_dim" in c:
    c["linear_key_head_dim"] = c["linear_value_head_dim"] = 128
elif "linear_attn_config" in c:
    c["linear_attn_config"]["head_dim"] = 128
else:  # MiniMax: one head width for lightning and full attention
    c["head_dim"] = 128
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
    $ADAPT tiny $base --config .h200/tiny/$f.json --out .h200/tiny/$f > /dev/null
    rm -rf .h200/tiny/$f.base .h200/tiny/$f.json
  else
    $ADAPT tiny $f --out .h200/tiny/$f > /dev/null
  fi
  targets=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(",".join(m["lora"]["target_modules"] + ["experts"]))' \
    validation/fixtures/$base/fixture.json)
  $ADAPT build .h200/tiny/$f --out .h200/la-gen/$f --no-compile --lora-targets "$targets" \
    --lora-rank $RANK --lora-alpha $((2 * RANK)) > /dev/null
  echo ".h200/la-gen/$f"
done
