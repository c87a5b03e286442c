#!/usr/bin/env bash
# The forward's state kernel with 16 value columns a block
# (ADAPT_DELTA_RULE_STATE_COLUMNS=16; runtime/cuda/DeltaRuleState.cuh) on a
# GPU machine, in one call:
#   1. op checks with 16 columns: gated_delta_rule (bf16; every form), its
#      chunked form in fp32, kimi_delta (bf16) and its chunked form in fp32;
#      compute-sanitizer's memcheck over the chunked GDN and Kimi checks;
#   2. forward and forward + backward at the issue's shapes, 32 columns
#      and 16 side by side, GDN and KDA (`auto` takes 16 where B·H x 4 <= SMs);
#   3. fla 0.6's GDN at 1 x 32 x 32K (wheels carried in .whl/), unless SKIP_FLA=1.
# Written in session 45, whose device time allowed one such call.
# usage: [SKIP_FLA=1] [FLA_TIMEOUT=150] bench/h200_state_columns.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_state_columns.sh OUTDIR}; mkdir -p "$OUT"
W=/tmp/adapt-h200; mkdir -p $W/checks
echo "== build $(date +%T)"
source bench/h200/build_runtime.sh
echo "== checks $(date +%T)"
for spec in "gated_delta_rule bfloat16" "gated_delta_rule.chunked float32" "kimi_delta bfloat16" \
  "kimi_delta.chunked float32"; do
  set -- $spec
  d=$W/checks/c16-$1-$2
  ADAPT_DELTA_RULE_STATE_COLUMNS=16 timeout 90 $W/rt/adapt-op-check --device cuda --seeds 2 --dtype $2 --only $1 \
    --out $d > $d.log 2>&1
  echo "-- $1 $2: rc $? $(grep -c '| pass |' $d/op-stage.md 2>/dev/null) pass, $(grep -c '| FAIL |' $d/op-stage.md 2>/dev/null) fail," \
    "worst $(grep -E '^\| ' $d/op-stage.md 2>/dev/null | grep -v 'worst error' | awk -F'|' '{print $5}' | sort -g | tail -1)"
  grep "| FAIL |" $d/op-stage.md 2>/dev/null | head -4
done
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for only in gated_delta_rule.chunked kimi_delta.chunked; do
  [ -n "$SAN" ] || { echo "-- memcheck: no compute-sanitizer"; break; }
  ADAPT_DELTA_RULE_STATE_COLUMNS=16 timeout 90 $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check --device cuda \
    --seeds 1 --dtype bfloat16 --only $only --out $W/checks/c16-memcheck > $W/c16-memcheck.log 2>&1
  echo "-- memcheck $only: rc $? $(grep -m1 'ERROR SUMMARY' $W/c16-memcheck.log)"
  grep -m6 -B2 -A6 "Invalid\|out of bounds" $W/c16-memcheck.log
done
echo "== timings $(date +%T)"
SHAPES="1 32 8192 128 128 1 32 32768 128 128 4 16 4096 128 128"
for extra in "" --per-channel; do
  for columns in 32 16; do
    set -- $SHAPES
    while [ $# -ge 5 ]; do
      echo "columns-$columns $(ADAPT_DELTA_RULE_STATE_COLUMNS=$columns timeout 100 $W/lc/long_context --delta-rule $1 $2 $3 $4 $5 \
        --iters 5 $extra 2>&1 | tail -1)"
      shift 5
    done
  done
done
[ -n "${SKIP_FLA:-}" ] && { echo "== done $(date +%T)"; exit 0; }
echo "== fla 0.6 $(date +%T)"
source bench/h200/fla_env.sh
timeout ${FLA_TIMEOUT:-150} python3 bench/h200/fla_delta_rule.py --bypass-triton-guard 1 32 32768 128 128 \
  2>&1 | grep -v Warning | tail -2
save_fla_cache "$OUT"
echo "== done $(date +%T)"
