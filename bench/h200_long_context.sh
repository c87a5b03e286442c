#!/usr/bin/env bash
# Long context on the H200: forward+backward time and peak memory of the
# linear (Gated DeltaNet), sparse (DSA, top-k 2048) and hybrid 3:1 blocks at
# 8K..512K tokens, and our chunked gated delta rule side by side with
# flash-linear-attention 0.6 (its wheels travel in .whl/).
# usage: [MIXERS="gdn dsa hybrid"] [SKIP_OPS=1] bench/h200_long_context.sh OUTDIR [LENGTHS...]
# (hybrid = 3 gdn + 1 dsa, each layer recomputed in the backward pass)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_long_context.sh OUTDIR [LENGTHS...]}; shift; mkdir -p "$OUT"
LENGTHS=${*:-8192 32768 131072 524288}
W=/tmp/adapt-h200; mkdir -p $W
echo "== building the runtime and the bench (LibTorch only)"
source bench/h200/build_runtime.sh

if [ -z "${SKIP_OPS:-}" ]; then
echo "== gated delta rule: ours (LibTorch composition) vs flash-linear-attention 0.6"
SHAPES="1 32 8192 128 128 1 32 32768 128 128 4 16 4096 128 128"
set -- $SHAPES
while [ $# -ge 5 ]; do
  timeout 300 $W/lc/long_context --delta-rule $1 $2 $3 $4 $5 | tee -a $OUT/delta_rule.jsonl
  shift 5
done
source bench/h200/fla_env.sh
if python3 -c 'import fla' 2>/dev/null; then
  timeout 300 python3 bench/h200/fla_delta_rule.py --bypass-triton-guard $SHAPES | tee -a $OUT/delta_rule.jsonl
  save_fla_cache "$OUT"
else
  echo "flash-linear-attention is not installed (carry .whl/)" | tee -a $OUT/delta_rule.jsonl
fi
fi

echo "== long context: forward+backward, bf16, LoRA r16"
for T in $LENGTHS; do
  for m in ${MIXERS:-gdn dsa hybrid}; do
    flags="--iters 2"; [ $T -ge 524288 ] && flags="--iters 1 --no-warmup"
    [ $m = hybrid ] && flags="$flags --recompute"
    timeout ${STEP_TIMEOUT:-280} $W/lc/long_context --mixer $m --tokens $T $flags 2>&1 | tail -1 | tee -a $OUT/long_context.jsonl
  done
done
