#!/usr/bin/env bash
# A switch of the experts' kernels (runtime/cuda/ExpertCombineKernel.cu,
# LowRankKernel.cu, ...) against the default on a GPU machine, in one call:
# the `expert` op checks in bf16 and fp32 with the switch on, memcheck over
# `expert` with it on, then one Qwen3-30B-A3B layer (batch 2 x 4096, LoRA
# r=16) profiled with it off and on (--profile 2; each kernel matching
# KERNELS, its time per step from the Chrome trace), then DEPTHS (default
# "12") layers with it on against off in one call (bench/h200_speed.sh's
# COMPARE_ENV).
#   ON       the switch (default ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN=1, session 46)
#   OFF      the default's (default ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN=0)
#   KERNELS  kernel names to print (default "gradRows|combineBackward|zeroUnowned")
# Session 45's form of this script (bench/h200_low_rank.sh) measured
# ADAPT_LOW_RANK_TILE_ROWS=128 (137.2 against 137.0 us a step; removed), and
# session 44's ADAPT_LOW_RANK_EARLY_LOADS=1 and ADAPT_LOW_RANK_MMA=1 (both
# slower; removed). Builds the runtime (bench/h200/build_runtime.sh, sourced
# here); needs .h200/q30-L1 and .h200/q30-L<N> (bench/h200_prepare.sh).
# usage: [ON=VAR=value] [OFF=VAR=value] [KERNELS=regex] [DEPTHS="12"] bench/h200_expert_switch.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_expert_switch.sh OUTDIR}; mkdir -p "$OUT"
W=/tmp/adapt-h200; mkdir -p $W
source bench/h200/build_runtime.sh
ON=${ON:-ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN=1} OFF=${OFF:-ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN=0}
KERNELS=${KERNELS:-gradRows|combineBackward|zeroUnowned}
for dtype in bfloat16 float32; do
  env $ON timeout 60 $W/rt/adapt-op-check --device cuda --seeds 2 --dtype $dtype --only expert \
    --out $W/es-checks-$dtype > $W/es-checks-$dtype.log 2>&1
  echo "-- expert $dtype, $ON: rc $? $(grep -c '| pass |' $W/es-checks-$dtype/op-stage.md 2>/dev/null) pass," \
    "$(grep -c '| FAIL |' $W/es-checks-$dtype/op-stage.md 2>/dev/null) fail"
  grep "| FAIL |" $W/es-checks-$dtype/op-stage.md 2>/dev/null | head -6
done
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$SAN" ] && env $ON timeout 90 $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check \
  --device cuda --seeds 1 --dtype bfloat16 --only expert --out $W/es-memcheck > $W/es-memcheck.log 2>&1
echo "-- memcheck expert: rc $? $(grep -m1 'ERROR SUMMARY' $W/es-memcheck.log 2>/dev/null)"
python3 - "$W/es-data.jsonl" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(16):
        f.write(json.dumps({"input_ids": [random.randrange(151936) for _ in range(8192)]}) + "\n")
PY
python3 bench/make_random_qwen3_moe.py bench/h200/qwen3-30b-a3b-config.json --layers 1 --out /dev/shm/es-model > /dev/null
cmake -S .h200/q30-L1 -B $W/train-L1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DAdaptRuntime_DIR=$W/rt > /dev/null 2>&1
cmake --build $W/train-L1 > $W/build-L1.log 2>&1 || { echo "build failed"; tail -20 $W/build-L1.log; exit 1; }
for on in 0 1; do
  rm -rf $W/es-prof-$on
  switch=$OFF; [ $on = 1 ] && switch=$ON
  env $switch timeout 120 $W/train-L1/train --model /dev/shm/es-model --data $W/es-data.jsonl \
    --out $W/es-prof-$on --steps 4 --batch 2 --seq-len 4096 --device cuda --dtype bf16 --lr 1e-4 \
    --checkpoint-every 1000 --log-every 0 --profile 2 > $W/es-prof-$on.log 2>&1
  echo "-- $switch: rc $?, loss $(tail -1 $W/es-prof-$on/metrics.jsonl | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')"
  python3 bench/h200/trace_kernels.py $W/es-prof-$on/profile/trace.json 2 80 2>&1 | grep -E "ms/step|$KERNELS" | head -8
  cp $W/es-prof-$on/profile/breakdown.md $OUT/breakdown-$on.md 2>/dev/null
done
rm -rf /dev/shm/es-model
for n in ${DEPTHS:-12}; do
  env $ON COMPARE_ENV="$OFF" DEPTHS=$n PEER=0 PROFILE=0 MODELS=/dev/shm \
    timeout ${DEPTH_TIMEOUT:-300} bash bench/h200_speed.sh $OUT/L$n > $W/es-speed-L$n.log 2>&1
  echo "-- $n layers: rc $?"; grep -E "tokens_per_s|speedup|loss_rel" $OUT/L$n/speed.json 2>/dev/null || tail -5 $W/es-speed-L$n.log
done
