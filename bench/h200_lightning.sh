#!/usr/bin/env bash
# MiniMax's lightning attention on the delta rule's kernels (the default
# since session 53; ADAPT_LIGHTNING_KERNEL=0: the LibTorch blocked form)
# beside that composition and fla 0.6's simple GLA, in one device call: the
# op checks of lightning on the kernels (bf16; the fp32 ones stay on the
# composition) and of the delta rules whose kernels it shares
# (gated_delta_rule, kimi_delta), memcheck, forward and forward + backward
# timings with peak memory at 64 heads x 8K and 32K and 4 x 16 x 4K, fla at
# the same shapes, GDN's default row, and the kernels' table from a profile
# at 32K. Each later part is skipped once the call has run past its deadline
# (seconds from the start: MEMCHECK_BY, SHAPES_BY, FLA_BY, END_BY,
# PROFILE_BY); 363 s on a fresh H100 (session 53, build 123 s).
# usage: bench/h200_lightning.sh OUTDIR   (from the repository root; .whl
#        and .fla-cache-parts carried for fla)
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_lightning.sh OUTDIR}
source bench/h200/start.sh
export CHECK_ROWS="dk128|dk 128|T150|T200|T40"
check lightning-kernel ADAPT_NONE=1 lightning
check gdn ADAPT_NONE=1 gated_delta_rule
check kimi ADAPT_NONE=1 kimi_delta.no_grad
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ] && [ $(el) -lt ${MEMCHECK_BY:-200} ]; then
  timeout 90 $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check --device cuda --seeds 1 \
    --dtype bfloat16 --only lightning --out $W/checks/memcheck > $W/memcheck.log 2>&1
  echo "-- memcheck lightning (kernel): rc $? $(grep -m1 'ERROR SUMMARY' $W/memcheck.log) ($(el) s)"; grep -m4 -A4 "Invalid" $W/memcheck.log
fi
echo "== timings $(el) s"
for s in "1 64 8192" "1 64 32768" "4 16 4096"; do
  [ "$s" = "4 16 4096" ] && [ $(el) -gt ${SHAPES_BY:-230} ] && continue
  for e in ADAPT_NONE=1 ADAPT_LIGHTNING_KERNEL=0; do
    echo "lightning [$e] $(env $e timeout 60 $W/lc/long_context --lightning $s 128 256 --iters 5 2>&1 | tail -1)"
  done
done
if [ $(el) -lt ${FLA_BY:-280} ]; then # fla's first shape once more: its first row carries Triton's warm-up
  source bench/h200/fla_env.sh
  timeout $(( ${END_BY:-360} - $(el) )) python3 bench/h200/fla_delta_rule.py --lightning 1 64 8192 128 128 \
    1 64 8192 128 128 1 64 32768 128 128 4 16 4096 128 128 2>&1 | grep -v Warning | tail -3
fi
if [ $(el) -lt ${PROFILE_BY:-400} ]; then
  echo "gdn-default $(timeout 60 $W/lc/long_context --delta-rule 1 32 8192 128 128 --iters 5 2>&1 | tail -1)"
  timeout 60 $W/lc/long_context --lightning 1 64 32768 128 256 --iters 2 --profile $W/proflight > $W/proflight.log 2>&1
  python3 bench/h200/trace_kernels.py $W/proflight/profile/trace.json 3 12 2>&1 | tail -12
fi
echo "== done $(el) s"
