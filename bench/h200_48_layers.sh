#!/usr/bin/env bash
# Issue 17's 48-layer bar in one H200 call (~108 GiB: an H100 cannot hold
# it): Qwen3-30B-A3B at its real depth, 2 x 4096 tokens, 6 steps, random
# weights in /dev/shm, no peer (transformers + PEFT runs out of memory long
# before 48 layers): the default, then, when COMPARE_ENV is set, a run under
# it beside the default in the same call (after the `expert` op checks under
# it).
# usage: bench/h200_48_layers.sh OUTDIR   (from the repository root; the
#        trainer project .h200/q30-L48 from bench/h200_prepare.sh, carried
#        with `carry: [".h200"]`)
cd "$(dirname "$0")/.."
set -uo pipefail
OUT=${1:?usage: h200_48_layers.sh OUTDIR}; export W=/tmp/adapt-h200; mkdir -p $W "$OUT/L48"; T0=$(date +%s)
[ -d .h200/q30-L48 ] || { echo "error: .h200/q30-L48 missing: run bench/h200_prepare.sh here and carry .h200" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
RUNTIME_ONLY=$([ -n "${COMPARE_ENV:-}" ] && echo 0 || echo 1) source bench/h200/build_runtime.sh
echo "== built $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log.txt"
COMPARE_ENV=${COMPARE_ENV:-}
if [ -n "$COMPARE_ENV" ]; then
  env $COMPARE_ENV timeout 60 $W/rt/adapt-op-check --device cuda --seeds 2 --only expert --out $W/checks-expert \
    > $W/checks-expert.log 2>&1
  echo "-- expert checks [$COMPARE_ENV]: rc $? $(tail -1 $W/checks-expert.log)" | tee -a "$OUT/log.txt"
fi
# The default first (the bar's figure), then the opt-in beside it, each step's
# metrics copied as it comes (a run cut short by the call's limit keeps them).
(while sleep 10; do cp $W/run-L48/metrics.jsonl "$OUT/L48/" 2>/dev/null
  cp $W/compare-L48/metrics.jsonl "$OUT/L48/compare-metrics.jsonl" 2>/dev/null; done) &
COPIER=$!
COMPARE_ENV=$COMPARE_ENV STEPS=6 MODELS=/dev/shm DEPTHS=48 PEER=0 \
  PROFILE=0 bash bench/h200_speed.sh "$OUT/L48" 2>&1 | tail -40 | tee -a "$OUT/log.txt"
kill $COPIER
cp $W/run-L48.log $W/compare-L48.log $W/run-L48/metrics.jsonl "$OUT/L48/" 2>/dev/null
cp $W/compare-L48/metrics.jsonl "$OUT/L48/compare-metrics.jsonl" 2>/dev/null
echo "== done $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log.txt"
