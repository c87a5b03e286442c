#!/usr/bin/env bash
# Runs the validation ladder's CPU stages for every family and copies the
# records into validation/records/cpu-fp32/ (committed): the op stage, each
# family's model stage against its fixture, and each family's 50-step loss
# alignment and PEFT round trip.
# usage: validation/record_all.sh [ADAPT_BINARY]   (default build/bin/adapt)
#        FAMILIES="gpt_oss llama4" validation/record_all.sh   (those families only)
set -euo pipefail
cd "$(dirname "$0")/.."
ADAPT=${1:-build/bin/adapt}
PY=${ADAPT_PYTHON:-.venv/bin/python}
W=$(mktemp -d /tmp/adapt-records-XXXXXX)
DEST=validation/records/cpu-fp32
mkdir -p $DEST
$ADAPT validate models/tiny-qwen3-moe --stage op --out $W/op > /dev/null
cp $W/op/op-stage.json $W/op/op-stage.md $DEST/
for f in ${FAMILIES:-qwen3_moe mixtral deepseek_v3 kimi_k2 gpt_oss glm4_moe minimax_m2 llama4 minimax \
    qwen3_vl_moe qwen3_next kimi_linear deepseek_v32 glm_moe_dsa}; do
  echo "== $f"
  $ADAPT tiny $f --out $W/$f > /dev/null
  mkdir -p $W/rec-$f && cp $W/op/op-stage.json $W/rec-$f/
  $ADAPT validate $W/$f --stage model --out $W/rec-$f --fixture validation/fixtures/$f | tail -1
  cp $W/rec-$f/model-stage.json $DEST/model-stage-$f.json
  cp $W/rec-$f/model-stage.md $DEST/model-stage-$f.md
  targets=$($PY -c "import json;m=json.load(open('validation/fixtures/$f/fixture.json'))['lora'];print(','.join(m['target_modules']+['experts']))")
  $ADAPT build $W/$f --out $W/align-$f --lora-targets $targets --lora-rank 4 --lora-alpha 8 > /dev/null
  $PY validation/loss_alignment.py $W/$f $W/align-$f/train $W/align-out-$f --lr 1e-2 2>/dev/null | tail -1
  cp $W/align-out-$f/loss-alignment.json $DEST/loss-alignment-$f.json
  cp $W/align-out-$f/loss-alignment.md $DEST/loss-alignment-$f.md
done
rm -rf $W
