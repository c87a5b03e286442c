#!/usr/bin/env bash
# Kimi's paired score-gradient kernel in row blocks (four rows a thread,
# opt-in ADAPT_KIMI_SCORES_ROW_BLOCKS=1, session 54) in one device call:
# its op checks (kimi_scores, kimi_delta bf16, kimi_delta.chunked fp32) and
# memcheck with it on, then KDA forward + backward with it against the
# default in two interleaved rounds, and the backward's kernels at 8K with it
# on (trace_kernels.py). ~330 s on a warm-started H100/H200.
# usage: bench/h200_kimi_row_blocks.sh OUTDIR   (from the repository root)
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_kimi_row_blocks.sh OUTDIR}
source bench/h200/start.sh
ON=ADAPT_KIMI_SCORES_ROW_BLOCKS=1
check scores-fp32 $ON kimi_scores float32
check scores-bf16 $ON kimi_scores
check kimi $ON kimi_delta
check kimi-fp32 $ON kimi_delta.chunked float32
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ]; then
  env $ON timeout 110 $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check --device cuda --seeds 1 \
    --dtype bfloat16 --only kimi_scores --out $W/checks/memcheck > $W/memcheck.log 2>&1
  echo "-- memcheck kimi_scores [$ON]: rc $? $(grep -m1 'ERROR SUMMARY' $W/memcheck.log) ($(el) s)"
  grep -m4 -A4 "Invalid" $W/memcheck.log
fi
echo "== timings $(el) s"
for round in 1 2; do
  for e in ADAPT_NONE=1 $ON; do
    for s in "1 32 8192" "1 32 32768" "4 16 4096"; do
      echo "kda [$e] round $round $(env $e timeout 60 $W/lc/long_context --delta-rule $s 128 128 --per-channel --iters 5 2>&1 | tail -1)"
    done
  done
done
for e in ADAPT_NONE=1 $ON; do
  rm -rf $W/prof; env $e timeout 60 $W/lc/long_context --delta-rule 1 32 8192 128 128 --per-channel --iters 2 \
    --profile $W/prof > $W/prof.log 2>&1
  echo "-- kernels [$e] ($(el) s)"; python3 bench/h200/trace_kernels.py $W/prof/profile/trace.json 3 10 2>&1 | tail -11
done
echo "== done $(el) s"
