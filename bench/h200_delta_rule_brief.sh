#!/usr/bin/env bash
# The delta rule's and lightning attention's defaults in one short device
# call, for when calls are scarce (bench/h200_delta_rule.sh holds the full
# checks and rows, two calls): their op checks (bf16, fp32), their timings
# beside the latest opt-outs, then memcheck, ncu's view of Kimi's forward
# kernels, fla's KDA rows and MiniMax's lightning attention (its kernels, the
# default since session 53, and the composition) beside fla's simple GLA, each skipped once the call has run past its deadline (seconds
# from the start; MEMCHECK_BY, NCU_BY, FLA_BY, SINGLES_BY, END_BY,
# LIGHTNING_BY). ~475 s on a fresh H100 (session 51).
# usage: bench/h200_delta_rule_brief.sh OUTDIR   (from the repository root,
#        .whl and .fla-cache-parts carried)
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_delta_rule_brief.sh OUTDIR}
source bench/h200/start.sh
# Session 51's defaults off: the plain decay loop and one output block.
OFF="ADAPT_KIMI_STAGED_DECAY=0 ADAPT_KIMI_OUTPUT_TWO_BLOCKS=0"
check kimi ADAPT_NONE=1 kimi_delta
check kimi-fp32 ADAPT_NONE=1 kimi_delta.chunked float32
check gdn ADAPT_NONE=1 gated_delta_rule
check lightning ADAPT_NONE=1 lightning
row() { local label=$1 envs=$2; shift 2
  for s in "$@"; do echo "$label $(env $envs timeout 60 $W/lc/long_context --delta-rule $s 128 128 --iters 5 ${EXTRA:-} 2>&1 | tail -1)"; done; }
S3=("1 32 8192" "1 32 32768" "4 16 4096")
echo "== timings $(el) s"
EXTRA=--per-channel row kda-default ADAPT_NONE=1 "${S3[@]}"
row gdn-default ADAPT_NONE=1 "${S3[@]}"
if [ $(el) -lt ${SINGLES_BY:-250} ]; then
  EXTRA=--per-channel row kda-forward-opt-outs "$OFF" "${S3[@]:0:2}"
fi
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ] && [ $(el) -lt ${MEMCHECK_BY:-270} ]; then
  timeout 110 $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check --device cuda --seeds 1 --dtype bfloat16 \
    --only kimi_delta.chunked --out $W/checks/memcheck > $W/memcheck.log 2>&1
  echo "-- memcheck kimi_delta.chunked: rc $? $(grep -m1 'ERROR SUMMARY' $W/memcheck.log) ($(el) s)"; grep -m4 -A4 "Invalid" $W/memcheck.log
fi
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ $(el) -lt ${NCU_BY:-300} ]; then
  for e in ADAPT_NONE=1 "$OFF"; do
    env $e timeout 80 $NCU --clock-control none -k "regex:kimiTransform|kimiOutput|deltaRuleStateKernel" -c 3 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      $W/lc/long_context --delta-rule 1 32 8192 128 128 --per-channel --iters 1 > $W/ncu.log 2>&1
    echo "-- ncu [$e]: rc $? ($(el) s)"; cp $W/ncu.log $OUT/ncu-$(echo $e | cut -c1-12).log
    grep -E "^  [a-zA-Z].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Dynamic Shared|Achieved Occupancy|Theoretical Occupancy|Block Limit (Reg|Shared)" $W/ncu.log | head -40
  done
fi
if [ $(el) -lt ${FLA_BY:-330} ]; then
  source bench/h200/fla_env.sh
  timeout $(( ${END_BY:-380} - $(el) )) python3 bench/h200/fla_delta_rule.py --bypass-triton-guard --per-channel 1 32 8192 128 128 1 32 32768 128 128 2>&1 | grep -v Warning | tail -3
fi
if [ $(el) -lt ${LIGHTNING_BY:-450} ]; then # MiniMax's lightning attention beside fla's simple GLA
  for e in ADAPT_NONE=1 ADAPT_LIGHTNING_KERNEL=0; do
    for T in 8192 32768; do
      echo "lightning [$e] $(env $e timeout 60 $W/lc/long_context --lightning 1 64 $T 128 256 --iters 5 2>&1 | tail -1)"
    done
  done
  timeout 60 $W/lc/long_context --lightning 1 64 8192 128 256 --iters 2 --profile $W/proflight > $W/proflight.log 2>&1
  python3 bench/h200/trace_kernels.py $W/proflight/profile/trace.json 3 12 2>&1 | tail -14
  source bench/h200/fla_env.sh
  timeout $(( ${LIGHTNING_END_BY:-560} - $(el) )) python3 bench/h200/fla_delta_rule.py --lightning 1 64 8192 128 128 1 64 32768 128 128 2>&1 | grep -v Warning | tail -2
fi
echo "== done $(el) s"
