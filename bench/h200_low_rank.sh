#!/usr/bin/env bash
# A variant of the experts' low-rank kernel (runtime/cuda/LowRankKernel.cu)
# against the default on a GPU machine, in one call: the `expert` op checks
# in bf16 and fp32 with the variant on, memcheck over `expert` with it on,
# then one Qwen3-30B-A3B layer (batch 2 x 4096, LoRA r=16) profiled with it
# off and on, --profile 2, each low-rank kernel's time per step from the
# Chrome trace; then DEPTHS (default "12") layers with it on against off in
# one call (bench/h200_speed.sh's COMPARE_ENV).
#   ON   the variant's switch (default ADAPT_LOW_RANK_TILE_ROWS=128, session 45)
#   OFF  the default's (default ADAPT_LOW_RANK_TILE_ROWS=64)
# Session 44 ran this script's earlier forms for ADAPT_LOW_RANK_EARLY_LOADS=1
# (206 against 136 us a step) and ADAPT_LOW_RANK_MMA=1 (181 against 135 us);
# both were removed. Builds the runtime (bench/h200/build_runtime.sh,
# sourced here); needs .h200/q30-L1 and .h200/q30-L<N> (bench/h200_prepare.sh).
# usage: [ON=VAR=value] [OFF=VAR=value] [DEPTHS="12"] bench/h200_low_rank.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_low_rank.sh OUTDIR}; mkdir -p "$OUT"
W=/tmp/adapt-h200; mkdir -p $W
source bench/h200/build_runtime.sh
ON=${ON:-ADAPT_LOW_RANK_TILE_ROWS=128} OFF=${OFF:-ADAPT_LOW_RANK_TILE_ROWS=64}
for dtype in bfloat16 float32; do
  env $ON timeout 60 $W/rt/adapt-op-check --device cuda --seeds 2 --dtype $dtype --only expert \
    --out $W/lr-checks-$dtype > $W/lr-checks-$dtype.log 2>&1
  echo "-- expert $dtype, $ON: rc $? $(grep -c '| pass |' $W/lr-checks-$dtype/op-stage.md 2>/dev/null) pass," \
    "$(grep -c '| FAIL |' $W/lr-checks-$dtype/op-stage.md 2>/dev/null) fail"
  grep "| FAIL |" $W/lr-checks-$dtype/op-stage.md 2>/dev/null | head -6
done
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$SAN" ] && env $ON timeout 90 $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check \
  --device cuda --seeds 1 --dtype bfloat16 --only expert --out $W/lr-memcheck > $W/lr-memcheck.log 2>&1
echo "-- memcheck expert: rc $? $(grep -m1 'ERROR SUMMARY' $W/lr-memcheck.log 2>/dev/null)"
python3 - "$W/lr-data.jsonl" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(16):
        f.write(json.dumps({"input_ids": [random.randrange(151936) for _ in range(8192)]}) + "\n")
PY
python3 bench/make_random_qwen3_moe.py bench/h200/qwen3-30b-a3b-config.json --layers 1 --out /dev/shm/lr-model > /dev/null
cmake -S .h200/q30-L1 -B $W/train-L1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DAdaptRuntime_DIR=$W/rt > /dev/null 2>&1
cmake --build $W/train-L1 > $W/build-L1.log 2>&1 || { echo "build failed"; tail -20 $W/build-L1.log; exit 1; }
for mma in 0 1; do
  rm -rf $W/lr-prof-$mma
  switch=$OFF; [ $mma = 1 ] && switch=$ON
  env $switch timeout 120 $W/train-L1/train --model /dev/shm/lr-model --data $W/lr-data.jsonl \
    --out $W/lr-prof-$mma --steps 4 --batch 2 --seq-len 4096 --device cuda --dtype bf16 --lr 1e-4 \
    --checkpoint-every 1000 --log-every 0 --profile 2 > $W/lr-prof-$mma.log 2>&1
  echo "-- $switch: rc $?, loss $(tail -1 $W/lr-prof-$mma/metrics.jsonl | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')"
  python3 bench/h200/trace_kernels.py $W/lr-prof-$mma/profile/trace.json 2 80 2>&1 | grep -E "ms/step|LowRank" | head -8
  cp $W/lr-prof-$mma/profile/breakdown.md $OUT/breakdown-$mma.md 2>/dev/null
done
rm -rf /dev/shm/lr-model
for n in ${DEPTHS:-12}; do
  env $ON COMPARE_ENV="$OFF" DEPTHS=$n PEER=0 PROFILE=0 MODELS=/dev/shm \
    timeout ${DEPTH_TIMEOUT:-300} bash bench/h200_speed.sh $OUT/L$n > $W/lr-speed-L$n.log 2>&1
  echo "-- $n layers: rc $?"; grep -E "tokens_per_s|speedup|loss_rel" $OUT/L$n/speed.json 2>/dev/null || tail -5 $W/lr-speed-L$n.log
done
