#!/usr/bin/env bash
# A Kimi delta attention switch (ON, an environment setting such as
# ADAPT_KIMI_VALUE_TERMS=0 or a new opt-in =1) against the default in one
# device call: the op
# checks with it on (kimi_delta bf16, kimi_delta.chunked fp32), memcheck
# (unless past MEMCHECK_BY seconds), KDA forward + backward with it against
# the default in two interleaved rounds, and the backward's kernels at 8K
# with it on (trace_kernels.py; PROFILE_BASELINE=1: the default's too).
# Session 55 ran it for ADAPT_KIMI_BF16_OPERANDS=1 and ADAPT_KIMI_VALUE_TERMS=1
# (both opt-ins then, defaults now): 325 s on a fresh H100, 180 of them the
# build; session 56 for ADAPT_KIMI_BF16_ROWS=1 (default now): 229 s, build 143 s.
# Session 57: the defaults beside fla (FLA_BY, fla compiling from scratch)
# 553 s; ADAPT_KIMI_SCORES_MMA=1 (default now) with fla's cache carried 315 s.
# With a default-on switch, ON=NAME=0 times the two sides (checks then run off;
# CHECK_ENV=ADAPT_NONE=1 runs them on the defaults). EXTRA_ONLY=CHECK adds
# that bf16 op check, SKIP_FP32=1 drops the fp32 one, MEMCHECK_ONLY=CHECK
# runs memcheck over that check instead of kimi_delta.chunked.
# FLA_BY=SECONDS adds fla 0.6's chunk_kda at the same three shapes in the same
# call (carry .whl, and .fla-cache-parts when a call saved one) unless the
# call has run that long, and saves its Triton cache under OUTDIR.
# usage: ON=NAME=VALUE bench/h200_kimi_opt_in.sh OUTDIR   (from the repository root)
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_kimi_opt_in.sh OUTDIR}
source bench/h200/start.sh
ON=${ON:?usage: ON=NAME=VALUE bench/h200_kimi_opt_in.sh OUTDIR}
check kimi ${CHECK_ENV:-$ON} kimi_delta
[ -n "${EXTRA_ONLY:-}" ] && check extra ${CHECK_ENV:-$ON} $EXTRA_ONLY
[ -z "${SKIP_FP32:-}" ] && check kimi-fp32 ${CHECK_ENV:-$ON} kimi_delta.chunked float32
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ] && [ $(el) -lt ${MEMCHECK_BY:-330} ]; then
  env $ON timeout 110 $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check --device cuda --seeds 1 \
    --dtype bfloat16 --only ${MEMCHECK_ONLY:-kimi_delta.chunked} --out $W/checks/memcheck > $W/memcheck.log 2>&1
  echo "-- memcheck ${MEMCHECK_ONLY:-kimi_delta.chunked} [$ON]: rc $? $(grep -m1 'ERROR SUMMARY' $W/memcheck.log) ($(el) s)"
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
if [ -n "${FLA_BY:-}" ] && [ $(el) -lt $FLA_BY ]; then
  source bench/h200/fla_env.sh
  echo "-- fla chunk_kda ($(el) s)"
  timeout $(( ${FLA_END_BY:-540} - $(el) )) python3 bench/h200/fla_delta_rule.py --bypass-triton-guard --per-channel \
    ${FLA_SHAPES:-1 32 8192 128 128 1 32 32768 128 128 4 16 4096 128 128} 2>&1 | grep -v Warning | tail -4
  save_fla_cache $OUT
fi
for e in $ON ${PROFILE_BASELINE:+ADAPT_NONE=1}; do
  rm -rf $W/prof; env $e timeout 60 $W/lc/long_context --delta-rule 1 32 8192 128 128 --per-channel --iters 2 \
    --profile $W/prof > $W/prof.log 2>&1
  echo "-- kernels [$e] ($(el) s)"; python3 bench/h200/trace_kernels.py $W/prof/profile/trace.json 3 14 2>&1 | tail -15
done
echo "== done $(el) s"
