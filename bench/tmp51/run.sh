#!/usr/bin/env bash
# Session 51's second check: the new defaults (Kimi staged decays + output two blocks,
# lightning TF32 and its in-place loop) against the opt-outs and lightning's parent code.
OUT=${1:?}; export W=/tmp/adapt-h200; T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name --format=csv,noheader
source bench/h200/build_runtime.sh > $W/build.log 2>&1; echo "built $(el) s"; tail -2 $W/build.log
mkdir -p $W/checks
for c in "kimi kimi_delta bfloat16" "light lightning bfloat16" "kimi32 kimi_delta.chunked float32"; do set -- $c
  timeout 90 $W/rt/adapt-op-check --device cuda --seeds 2 --dtype $3 --only $2 --out $W/checks/$1 > $W/c-$1.log 2>&1
  echo "-- check $1: rc $? ($(el) s)"; grep -E "FAIL|rror" $W/c-$1.log | head -3; grep -E "^\|" $W/checks/$1/op-stage.md | grep -v -- "---" | sort -t'|' -k5 -g | tail -2
done
lc() { echo "$1 $(env $2 timeout 60 $W/lc/long_context $3 2>&1 | tail -1)"; }
for s in "1 32 8192" "1 32 32768" "4 16 4096"; do
  lc kda-default ADAPT_NONE=1 "--delta-rule $s 128 128 --iters 7 --per-channel"
  lc kda-opt-outs "ADAPT_KIMI_STAGED_DECAY=0 ADAPT_KIMI_OUTPUT_TWO_BLOCKS=0" "--delta-rule $s 128 128 --iters 7 --per-channel"
done
for T in 8192 32768; do
  lc lightning-default ADAPT_NONE=1 "--lightning 1 64 $T 128 256 --iters 5"
  lc lightning-no-tf32 ADAPT_LIGHTNING_TF32=0 "--lightning 1 64 $T 128 256 --iters 5"
done
cp bench/tmp51/Lightning.parent.cpp runtime/Lightning.cpp; source bench/h200/build_runtime.sh > $W/build2.log 2>&1; echo "rebuilt $(el) s"
for T in 8192 32768; do lc lightning-parent ADAPT_NONE=1 "--lightning 1 64 $T 128 256 --iters 5"; done
echo "done $(el) s"
