#!/usr/bin/env bash
# What waits for a GPU, in one call, most needed first (written in session 48,
# when no device could be had after two H100 calls): each step's summary goes
# to stdout and OUTDIR/waiting.log as it finishes, so a call cut short keeps
# what it measured.
#   1. the sub-chunk scores' second form (ADAPT_KIMI_SCORES_SUBCHUNKS=1): op
#      checks (kimi_scores fp32, kimi_delta bf16, kimi_delta.chunked fp32),
#      memcheck, KDA forward + backward at the issue's three shapes with it
#      off and on, and the scores kernels' profile at 8K;
#   2. Kimi's backward terms in one pass (ADAPT_KIMI_FUSED_TERMS=1): op checks
#      (kimi_delta bf16, kimi_delta.chunked fp32) and KDA at the three shapes;
#      the output scores saved for the backward (ADAPT_KIMI_SAVED_SCORES=1):
#      kimi_delta bf16 checks and KDA at the three shapes;
#      then GDN's profile at 1 x 32 x 32K (where fla's forward is ahead);
#   3. the experts' by-token gradient rows (ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN=1):
#      the `expert` op checks in bf16 and fp32;
#   4. fla 0.6's KDA at the three shapes (carry .whl and .fla-cache-parts),
#      given what is left of LIMIT seconds, at most FLA_MAX.
# The 48-layer comparison needs an H200 and a call of its own:
#   ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN=1 COMPARE_ENV=ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN=0 STEPS=6 \
#     MODELS=/dev/shm DEPTHS=48 PEER=0 PROFILE=0 bash bench/h200_speed.sh OUT   (carry .h200)
# usage: [LIMIT=560] [FLA_MAX=220] bench/h200_waiting.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_waiting.sh OUTDIR}; W=/tmp/adapt-h200; mkdir -p $W "$OUT"; T0=$(date +%s)
log() { echo "$*" | tee -a "$OUT/waiting.log"; }
log "== $(nvidia-smi --query-gpu=name --format=csv,noheader)"
source bench/h200/build_runtime.sh
log "== built in $(( $(date +%s) - T0 )) s"

# opcheck ENV ONLY DTYPE: one op-check run, its verdict counts and worst error.
opcheck() {
  local env=$1 only=$2 dtype=$3 dir=$W/waiting-$2-$3
  env $env timeout 70 $W/rt/adapt-op-check --device cuda --seeds 2 --dtype $dtype --only $only --out $dir > $dir.log 2>&1
  log "-- $env $only $dtype: rc $?, $(grep -c '| pass |' $dir/op-stage.md 2>/dev/null) pass," \
    "$(grep -c '| FAIL |' $dir/op-stage.md 2>/dev/null) fail, worst" \
    "$(grep '| pass |\|FAIL' $dir/op-stage.md 2>/dev/null | awk -F'|' '{print $5}' | sort -g | tail -1)"
}
kernels() { python3 bench/h200/trace_kernels.py "$1" 3 "$2" 2>&1 | awk -F'|' '{print $2, $3, $7}'; }

SUB=ADAPT_KIMI_SCORES_SUBCHUNKS=1
opcheck $SUB kimi_scores float32
opcheck $SUB kimi_delta bfloat16
opcheck $SUB kimi_delta.chunked float32
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$SAN" ] && { env $SUB ADAPT_KIMI_FUSED_TERMS=1 timeout 100 $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check --device cuda \
  --seeds 1 --only kimi_delta.chunked --out $W/waiting-memcheck > $W/waiting-memcheck.log 2>&1
  log "-- memcheck kimi_delta.chunked, $SUB ADAPT_KIMI_FUSED_TERMS=1: rc $? $(grep -m1 'ERROR SUMMARY' $W/waiting-memcheck.log)"; }
for shape in "1 32 8192" "1 32 32768" "4 16 4096"; do
  for s in 0 1; do
    log "subchunks=$s $(ADAPT_KIMI_SCORES_SUBCHUNKS=$s timeout 60 $W/lc/long_context --delta-rule $shape 128 128 \
      --per-channel --iters 5 2>&1 | tail -1)"
  done
done
for s in 0 1; do
  ADAPT_KIMI_SCORES_SUBCHUNKS=$s timeout 60 $W/lc/long_context --delta-rule 1 32 8192 128 128 --per-channel \
    --profile $W/waiting-kda$s > /dev/null 2>&1
  log "== KDA 8K profile, subchunks=$s"; log "$(kernels $W/waiting-kda$s/profile/trace.json 8 | grep -i 'scores\|kernel time')"
done
TERMS=ADAPT_KIMI_FUSED_TERMS=1
opcheck $TERMS kimi_delta bfloat16
opcheck $TERMS kimi_delta.chunked float32
for shape in "1 32 8192" "1 32 32768" "4 16 4096"; do
  log "fused-terms $(env $TERMS timeout 60 $W/lc/long_context --delta-rule $shape 128 128 --per-channel --iters 5 2>&1 | tail -1)"
done
SAVED=ADAPT_KIMI_SAVED_SCORES=1
opcheck $SAVED kimi_delta bfloat16
for shape in "1 32 8192" "1 32 32768" "4 16 4096"; do
  log "saved-scores $(env $SAVED timeout 60 $W/lc/long_context --delta-rule $shape 128 128 --per-channel --iters 5 2>&1 | tail -1)"
done
timeout 60 $W/lc/long_context --delta-rule 1 32 32768 128 128 --profile $W/waiting-gdn > /dev/null 2>&1
log "== GDN 32K profile"; log "$(kernels $W/waiting-gdn/profile/trace.json 10)"

opcheck ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN=1 expert bfloat16
opcheck ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN=1 expert float32

LEFT=$(( ${LIMIT:-560} - ($(date +%s) - T0) )); [ $LEFT -gt ${FLA_MAX:-220} ] && LEFT=${FLA_MAX:-220}
log "== fla 0.6 KDA, ${LEFT} s"
source bench/h200/fla_env.sh
[ $LEFT -gt 20 ] && log "$(timeout $LEFT python3 -u bench/h200/fla_delta_rule.py --bypass-triton-guard --per-channel \
  1 32 8192 128 128 4 16 4096 128 128 1 32 32768 128 128 2>&1 | grep -v Warning | tail -4)"
save_fla_cache "$OUT"
log "== done in $(( $(date +%s) - T0 )) s"
