#!/usr/bin/env bash
# The query/key L2-norm kernels (ADAPT_L2NORM_KERNEL, the default since
# session 54's H100 call of this script) in one device call: their op checks (norm.l2 and
# its strided form, fp32 and bf16) and the delta rule's (gated_delta_rule,
# kimi_delta, unless past KIMI_BY seconds) with them on, Qwen3-Next-80B-A3B's
# widths at 4 layers with them against without (adapt alone, 8 steps, the
# losses' largest relative difference), then memcheck (unless past
# MEMCHECK_BY seconds).
# usage: bench/h200_l2norm.sh OUTDIR   (from the repository root; .h200/qn-L4
#        from `NEXT_DEPTHS=4 bench/h200_prepare.sh`, carried with
#        `carry: [".h200"]`)
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_l2norm.sh OUTDIR}
source bench/h200/start.sh
ON=ADAPT_L2NORM_KERNEL=1
check l2-fp32 $ON norm.l2 float32
check l2-bf16 $ON norm.l2
check gdn $ON gated_delta_rule
[ $(el) -lt ${KIMI_BY:-200} ] && check kimi $ON kimi_delta
export $ON
COMPARE_ENV=ADAPT_L2NORM_KERNEL=0 NAME=qn DEPTHS=4 PEER=0 PROFILE=0 STEPS=8 bash bench/h200_speed.sh "$OUT" 2>&1 | tail -30
python3 -c "import json,sys; print('l2_normalize:', json.load(open(sys.argv[1])).get('sites', {}).get('l2_normalize'))" $W/run-L4/kernels.json
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ] && [ $(el) -lt ${MEMCHECK_BY:-330} ]; then
  timeout 60 $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check --device cuda --seeds 1 \
    --dtype bfloat16 --only norm.l2 --out $W/checks/memcheck > $W/memcheck.log 2>&1
  echo "-- memcheck norm.l2 [$ON]: rc $? $(grep -m1 'ERROR SUMMARY' $W/memcheck.log) ($(el) s)"
fi
echo "== done $(el) s"
