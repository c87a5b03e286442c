#!/usr/bin/env bash
# The residual stream's norm kernels (the add before the norm and the
# stream's gradient summed in the norm's backward; runtime/cuda/RmsNormKernel.cu;
# on by default, ADAPT_RESIDUAL_NORM_KERNEL=0 off) on a GPU machine, in one call:
#   1. op checks with the switch on, bf16 and fp32: `norm.residual_rms*` and
#      `rms_norm` (whose backward kernel gained the residual gradient), and
#      compute-sanitizer's memcheck over `norm.residual_rms`;
#   2. Qwen3-30B-A3B's widths at each depth of DEPTHS (default "12 48"; 48
#      needs the H200's memory) with the switch on, and the same run with it
#      off beside it (bench/h200_speed.sh's COMPARE_ENV), no peer.
# Session 44 ran the checks and 12 layers on an H100; SKIP_CHECKS=1 leaves
# the time of a 10-minute call to the depths (48 layers: random weights
# written, then two runs).
# usage: [DEPTHS="12 48"] [SKIP_CHECKS=1] [DEPTH_TIMEOUT=400] bench/h200_residual_norm.sh OUTDIR   (.h200/q30-L<N>
#        from bench/h200_prepare.sh, carried)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_residual_norm.sh OUTDIR}; mkdir -p "$OUT"
W=/tmp/adapt-h200; mkdir -p $W
echo "== build $(date +%T)"
source bench/h200/build_runtime.sh
[ -n "${SKIP_CHECKS:-}" ] && DTYPES="" || DTYPES="bfloat16 float32"
echo "== checks $(date +%T)"
for dtype in $DTYPES; do
  for only in norm.residual_rms rms_norm; do
    ADAPT_RESIDUAL_NORM_KERNEL=1 timeout 60 $W/rt/adapt-op-check --device cuda --seeds 2 --dtype $dtype --only $only \
      --out $W/rn-$only-$dtype > $W/rn-$only-$dtype.log 2>&1
    echo "-- $only $dtype: rc $? $(grep -c '| pass |' $W/rn-$only-$dtype/op-stage.md 2>/dev/null) pass," \
      "$(grep -c '| FAIL |' $W/rn-$only-$dtype/op-stage.md 2>/dev/null) fail"
    grep "| FAIL |" $W/rn-$only-$dtype/op-stage.md 2>/dev/null | head -4
    [ $dtype = bfloat16 ] && grep "D2048" $W/rn-$only-$dtype/op-stage.md | head -4
  done
done
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "${SKIP_CHECKS:-}" ] && SAN=""
if [ -n "$SAN" ]; then
  ADAPT_RESIDUAL_NORM_KERNEL=1 timeout 60 $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check \
    --device cuda --seeds 1 --dtype bfloat16 --only norm.residual_rms --out $W/rn-memcheck > $W/rn-memcheck.log 2>&1
  echo "-- memcheck norm.residual_rms: rc $? $(grep -m1 'ERROR SUMMARY' $W/rn-memcheck.log 2>/dev/null)"
fi
for n in ${DEPTHS:-12 48}; do
  echo "== $n layers $(date +%T)"
  extra=(); [ "$n" -ge 24 ] && extra=(STEPS=6 MODELS=/dev/shm)
  env "${extra[@]}" ADAPT_RESIDUAL_NORM_KERNEL=1 DEPTHS=$n PEER=0 PROFILE=0 COMPARE_ENV=ADAPT_RESIDUAL_NORM_KERNEL=0 \
    timeout ${DEPTH_TIMEOUT:-400} bash bench/h200_speed.sh $OUT/L$n > $W/speed-L$n.log 2>&1
  echo "rc $?"; grep -v '^{$\|^}$' $OUT/L$n/speed.json 2>/dev/null || tail -5 $W/speed-L$n.log
  grep -h "residual_rms_norm" $W/run-L$n.log | head -2
done
echo "== done $(date +%T)"
