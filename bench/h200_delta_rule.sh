#!/usr/bin/env bash
# The delta rule's CUDA kernels on a GPU machine, in two phases that share one
# warm machine's build (/tmp/adapt-h200):
#   PHASE=checks   op-stage checks of the default kernels, then of the switches
#                  (no prefetch) and of the opt-in switches waiting for them, bf16,
#                  and memcheck with the switches on (SKIP_CHECKS=1: only
#                  what still waits for a GPU, and memcheck of the chunked
#                  GDN and Kimi ops)
#   PHASE=timings  forward and forward+backward of the op at the issue's shapes,
#                  default against opt-outs and opt-ins (earlier sessions' rows are
#                  in git history), a Kineto profile at 32K, and
#                  flash-linear-attention 0.6 (wheels carried in .whl/) last
# Logs stay in /tmp/adapt-h200; the summary goes to stdout (pipe it to $OUT).
# Each phase takes ~8 min with a cold build (~135 s): one device call each.
#   PHASE=both     the two, in that order
# fla compiles its Triton kernels on first use: in session 44 its GDN rows
# took 150 s and its KDA produced no row in 150 s more, so KDA runs one shape
# by default (FLA_KDA_SHAPES, FLA_KDA_TIMEOUT); the compiled kernels come back
# as OUTDIR/fla-cache.tgz.part-* for a later call to carry (bench/h200/fla_env.sh).
# usage: PHASE=checks|timings|both [ROWS="gdn kda ..."] [CHECK_TIMEOUT=110] [SKIP_FLA=1] [SKIP_FLA_GDN=1] [SKIP_FLA_KDA=1] [MEMCHECK="ids"] [MEMCHECK_TIMEOUT=200] bench/h200_delta_rule.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: PHASE=checks|timings h200_delta_rule.sh OUTDIR}; mkdir -p "$OUT"
W=/tmp/adapt-h200; mkdir -p $W
echo "== build $(date +%T)"
source bench/h200/build_runtime.sh
echo "== built $(date +%T)"

# check NAME ENV... -- ONLY [DTYPE]: one op-check run under the given switches;
# prints its verdict line per check and keeps the record in $W/checks/NAME.
check() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local only=$1 dtype=${2:-bfloat16}
  local t0=$(date +%s)
  env "${envs[@]}" timeout ${CHECK_TIMEOUT:-110} $W/rt/adapt-op-check --device cuda --seeds 2 --dtype $dtype \
    --only $only --out $W/checks/$name > $W/checks-$name.log 2>&1
  local rc=$?
  echo "-- $name [${envs[*]}] $only $dtype: rc $rc, $(( $(date +%s) - t0 )) s"
  grep -E "FAIL|fail|error" $W/checks-$name.log | head -8
  [ -f $W/checks/$name/op-stage.md ] && grep -E "^\|" $W/checks/$name/op-stage.md | grep -v -- "---" | head -14
}

if [ "${PHASE:-checks}" != timings ]; then
  mkdir -p $W/checks
  if [ -z "${SKIP_CHECKS:-}" ]; then
  check default ADAPT_NONE=1 -- gated_delta_rule.chunked
  check default-nograd ADAPT_NONE=1 -- gated_delta_rule.no_grad
  check segmented ADAPT_NONE=1 -- gated_delta_rule.segmented
  check no-prefetch ADAPT_DELTA_RULE_PREFETCH=0 -- gated_delta_rule.chunked
  check kimi-kernel ADAPT_NONE=1 -- kimi_delta.no_grad
  # The opt-in switches waiting for these checks (docs/runtime.md).
  check lean ADAPT_DELTA_RULE_LEAN_BACKWARD=1 -- gated_delta_rule.chunked
  check segmented-kernels ADAPT_DELTA_RULE_TRAIN_KERNEL=1 ADAPT_DELTA_RULE_BACKWARD_KERNEL=1 -- gated_delta_rule.segmented
  check segmented-kernels-lean ADAPT_DELTA_RULE_TRAIN_KERNEL=1 ADAPT_DELTA_RULE_BACKWARD_KERNEL=1 ADAPT_DELTA_RULE_LEAN_BACKWARD=1 -- gated_delta_rule.segmented
  check kimi-prefetch ADAPT_KIMI_DELTA_PREFETCH=1 -- kimi_delta.no_grad
  check kimi-train ADAPT_KIMI_DELTA_TRAIN_KERNEL=1 -- kimi_delta.chunked
  check kimi-train-fp32 ADAPT_KIMI_DELTA_TRAIN_KERNEL=1 -- kimi_delta.chunked float32
  check kimi-scores ADAPT_KIMI_SCORES_KERNEL=1 -- kimi_scores
  check kimi-scores-fp32 ADAPT_KIMI_SCORES_KERNEL=1 -- kimi_scores float32
  check kimi-all ADAPT_KIMI_SCORES_KERNEL=1 ADAPT_KIMI_DELTA_TRAIN_KERNEL=1 ADAPT_KIMI_DELTA_PREFETCH=1 -- kimi_delta
  check conv ADAPT_CONV_KERNEL=1 -- causal_conv1d
  check conv-fp32 ADAPT_CONV_KERNEL=1 -- causal_conv1d float32
  check gated-norm ADAPT_GATED_NORM_KERNEL=1 -- norm.gated_rms
  check gated-norm-fp32 ADAPT_GATED_NORM_KERNEL=1 -- norm.gated_rms float32
  # Session 43's opt-ins, the defaults since session 44's checks: the
  # defaults in fp32 too, and their opt-outs (the forms they replaced).
  check kimi-scores-pairs-fp32 ADAPT_NONE=1 -- kimi_scores float32
  check kimi-scores-warp ADAPT_KIMI_SCORES_PAIRS=0 -- kimi_scores
  check gdn-fp32 ADAPT_NONE=1 -- gated_delta_rule.chunked float32
  check row-inverse ADAPT_DELTA_RULE_BLOCK_INVERSE=0 -- gated_delta_rule
  check one-block ADAPT_DELTA_RULE_TWO_BLOCKS=0 -- gated_delta_rule.chunked
  check two-blocks-no-lean ADAPT_DELTA_RULE_LEAN_BACKWARD=0 -- gated_delta_rule.chunked
  # Kimi's backward tail as one kernel (default since session 45), and the
  # composition it replaced.
  check kimi-tail ADAPT_NONE=1 -- kimi_delta
  check kimi-tail-fp32 ADAPT_NONE=1 -- kimi_delta.chunked float32
  check kimi-no-tail ADAPT_KIMI_BACKWARD_TAIL_KERNEL=0 -- kimi_delta.chunked
  # Session 45's opt-ins, the defaults since session 46's checks (Kimi's
  # paired score backward, its forward pairs a thread each, eight-warp state
  # kernels): the defaults in fp32 too, and their opt-outs; Kimi's backward
  # in head slices forced down to one head.
  check kimi-paired-fp32 ADAPT_NONE=1 -- kimi_scores float32
  check kimi-unpaired ADAPT_KIMI_SCORES_PAIRED_BACKWARD=0 -- kimi_scores
  check kimi-pairs-warp ADAPT_KIMI_PAIRS_PER_THREAD=0 -- kimi_delta
  check state-warps-4 ADAPT_DELTA_RULE_STATE_WARPS=4 -- gated_delta_rule
  check state-warps-4-fp32 ADAPT_DELTA_RULE_STATE_WARPS=4 -- gated_delta_rule.chunked float32
  check kimi-slices ADAPT_KIMI_BACKWARD_SLICE_HEADS=1 -- kimi_delta.chunked
  # Session 46: GDN's forward keeps T in bf16 (its consumers: the backward
  # kernel, the LibTorch backward after the forward kernels, the segmented
  # kernels) and its backward frees dS' before allocating dk and dv. Session
  # 47: GDN's forward folds the rows' factors into T's columns and q S_n's
  # rows, and Kimi's chunk gradients run as one kernel; the defaults since
  # session 47's checks on an H100, and their opt-outs.
  check gdn-bf16-inverse-composition ADAPT_DELTA_RULE_BACKWARD_KERNEL=0 -- gated_delta_rule.chunked
  check gdn-bf16-inverse-segmented ADAPT_DELTA_RULE_TRAIN_KERNEL=1 ADAPT_DELTA_RULE_BACKWARD_KERNEL=1 -- gated_delta_rule.segmented
  check gdn-no-fold ADAPT_DELTA_RULE_FOLD_FACTORS=0 -- gated_delta_rule
  check kimi-chunk-grad-slices ADAPT_KIMI_BACKWARD_SLICE_HEADS=1 -- kimi_delta.chunked
  check kimi-no-chunk-grad ADAPT_KIMI_CHUNK_GRAD_KERNEL=0 -- kimi_delta
  # Session 47's tail kernel finishing the log decays' gradient, the default
  # since session 48's checks on an H100: without the chunk-gradient kernel
  # (the other source of sum dS' . S), and its opt-out.
  check kimi-tail-decay-no-chunk-grad ADAPT_KIMI_CHUNK_GRAD_KERNEL=0 -- kimi_delta.chunked
  check kimi-no-tail-decay ADAPT_KIMI_TAIL_DECAY_GRADIENT=0 -- kimi_delta.chunked
  fi
  # SKIP_CHECKS=1 starts here: what still waits for a GPU, then memcheck.
  # Session 49's defaults switched off one at a time (the references they
  # replaced stay checked): thread-per-pair scores, LibTorch's term passes,
  # scores rebuilt in the backward.
  check kimi-no-subchunks ADAPT_KIMI_SCORES_SUBCHUNKS=0 -- kimi_scores float32
  check kimi-no-subchunks-bf16 ADAPT_KIMI_SCORES_SUBCHUNKS=0 -- kimi_delta
  check kimi-no-fused-terms-fp32 ADAPT_KIMI_FUSED_TERMS=0 -- kimi_delta.chunked float32
  check kimi-no-saved-scores ADAPT_KIMI_SAVED_SCORES=0 -- kimi_delta
  # Session 51's defaults off (the plain decay loop, one output block) stay
  # checked; the block inverse's split sums (opt-in, not faster) too.
  check kimi-no-staged-decay ADAPT_KIMI_STAGED_DECAY=0 -- kimi_delta
  check kimi-one-output-block ADAPT_KIMI_OUTPUT_TWO_BLOCKS=0 -- kimi_delta
  check gdn-split-sums ADAPT_DELTA_RULE_INVERSE_SPLIT_SUMS=1 -- gated_delta_rule
  check kimi-split-sums ADAPT_DELTA_RULE_INVERSE_SPLIT_SUMS=1 -- kimi_delta
  check lightning-no-tf32 ADAPT_LIGHTNING_TF32=0 -- lightning
  # Out-of-bounds accesses the checks' numbers could miss: memcheck over the
  # kernels, forward and backward, at the d-128 shapes.
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$SAN" ]; then
    # With SKIP_CHECKS=1 the sites the waiting opt-ins touch, else every kernel.
    all="gated_delta_rule.chunked kimi_delta.chunked kimi_scores causal_conv1d norm.gated_rms expert"
    [ -n "${SKIP_CHECKS:-}" ] && all="kimi_scores kimi_delta.chunked gated_delta_rule.chunked"
    for only in ${MEMCHECK:-$all}; do
      ADAPT_CONV_KERNEL=1 ADAPT_GATED_NORM_KERNEL=1 ADAPT_DELTA_RULE_TRAIN_KERNEL=1 ADAPT_DELTA_RULE_BACKWARD_KERNEL=1 ADAPT_DELTA_RULE_LEAN_BACKWARD=1 \
        ADAPT_KIMI_DELTA_TRAIN_KERNEL=1 ADAPT_KIMI_DELTA_PREFETCH=1 ADAPT_KIMI_SCORES_KERNEL=1 ADAPT_KIMI_SCORES_SUBCHUNKS=1 ADAPT_KIMI_FUSED_TERMS=1 ADAPT_KIMI_SAVED_SCORES=1 ADAPT_KIMI_STAGED_DECAY=1 ADAPT_KIMI_OUTPUT_TWO_BLOCKS=1 ADAPT_DELTA_RULE_INVERSE_SPLIT_SUMS=1 \
        timeout ${MEMCHECK_TIMEOUT:-200} $SAN --tool memcheck --error-exitcode 9 $W/rt/adapt-op-check --device cuda \
        --seeds 1 --dtype bfloat16 --only $only --out $W/checks/memcheck > $W/memcheck.log 2>&1
      echo "-- memcheck $only: rc $? $(grep -m1 'ERROR SUMMARY' $W/memcheck.log)"
      grep -m6 -B2 -A6 "Invalid\|out of bounds" $W/memcheck.log
    done
  else
    echo "-- memcheck: no compute-sanitizer"
  fi
fi

if [ "${PHASE:-checks}" != checks ]; then
  SHAPES="1 32 8192 128 128 1 32 32768 128 128 4 16 4096 128 128"
  run_shapes() { # LABEL ENV... : the op at each shape
    local label=$1; shift
    set -- "$@" -- $SHAPES
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    while [ $# -ge 5 ]; do
      echo "$label $(env "${envs[@]}" timeout 120 $W/lc/long_context --delta-rule $1 $2 $3 $4 $5 --iters 5 ${EXTRA:-} 2>&1 | tail -1)"
      shift 5
    done
  }
  # ROWS picks the groups below (default all of them; one call cannot hold
  # them all with fla's rows): gdn, gdn-switches, kda, kda-switches,
  # lightning, layers, profiles, ncu (not in the default).
  ROWS=${ROWS:-gdn gdn-switches kda kda-switches lightning layers profiles}
  want() { [[ " $ROWS " == *" $1 "* ]]; }
  echo "== gated delta rule $(date +%T)"
  want gdn && run_shapes default ADAPT_NONE=1
  want gdn && run_shapes no-fold ADAPT_DELTA_RULE_FOLD_FACTORS=0 # session 47's folded factors, off
  want gdn && run_shapes split-sums ADAPT_DELTA_RULE_INVERSE_SPLIT_SUMS=1 # session 49's opt-in
  if want gdn-switches; then
  run_shapes state-warps-4 ADAPT_DELTA_RULE_STATE_WARPS=4
  run_shapes no-lean ADAPT_DELTA_RULE_LEAN_BACKWARD=0
  run_shapes no-prefetch ADAPT_DELTA_RULE_PREFETCH=0
  fi
  echo "== Kimi delta attention $(date +%T)"
  want kda && EXTRA=--per-channel run_shapes kda-default ADAPT_NONE=1
  want kda && EXTRA=--per-channel run_shapes kda-forward-opt-outs ADAPT_KIMI_STAGED_DECAY=0 ADAPT_KIMI_OUTPUT_TWO_BLOCKS=0 # session 51's defaults, off
  want kda && EXTRA=--per-channel run_shapes kda-split-sums ADAPT_DELTA_RULE_INVERSE_SPLIT_SUMS=1
  if want kda-switches; then
  EXTRA=--per-channel run_shapes kda-no-chunk-grad ADAPT_KIMI_CHUNK_GRAD_KERNEL=0 # session 47's kernel, off
  EXTRA=--per-channel run_shapes kda-one-pass ADAPT_KIMI_BACKWARD_SLICE_HEADS=1024
  EXTRA=--per-channel run_shapes kda-no-tail-decay ADAPT_KIMI_TAIL_DECAY_GRADIENT=0 # session 48's default, off
  EXTRA=--per-channel run_shapes kda-no-subchunks ADAPT_KIMI_SCORES_SUBCHUNKS=0 # session 49's defaults, off
  EXTRA=--per-channel run_shapes kda-no-fused-terms ADAPT_KIMI_FUSED_TERMS=0
  EXTRA=--per-channel run_shapes kda-no-saved-scores ADAPT_KIMI_SAVED_SCORES=0
  EXTRA=--per-channel run_shapes kda-no-tail ADAPT_KIMI_BACKWARD_TAIL_KERNEL=0
  EXTRA=--per-channel run_shapes kda-slices-8 ADAPT_KIMI_BACKWARD_SLICE_HEADS=8
  EXTRA=--per-channel run_shapes kda-session-45-opt-outs ADAPT_KIMI_PAIRS_PER_THREAD=0 ADAPT_KIMI_SCORES_PAIRED_BACKWARD=0 \
    ADAPT_DELTA_RULE_STATE_WARPS=4
  fi
  if want lightning; then
  echo "== lightning attention (MiniMax-M1: 64 heads of 128, block 256) $(date +%T)"
  for T in 8192 32768; do
    echo "default $(timeout 120 $W/lc/long_context --lightning 1 64 $T 128 256 --iters 5 2>&1 | tail -1)"
    echo "no-tf32 $(ADAPT_LIGHTNING_TF32=0 timeout 120 $W/lc/long_context --lightning 1 64 $T 128 256 --iters 5 2>&1 | tail -1)"
  done
  echo "-- lightning's kernels at 8K"
  timeout 120 $W/lc/long_context --lightning 1 64 8192 128 256 --iters 2 --profile $W/proflight > $W/proflight.log 2>&1
  python3 bench/h200/trace_kernels.py $W/proflight/profile/trace.json 3 16 2>&1 | tail -18
  fi
  if want layers; then
  echo "== one Gated DeltaNet layer (Qwen3-Next's heads at hidden 7,168), and the 3:1 hybrid block $(date +%T)"
  for T in 8192 131072; do
    echo "default $(timeout 120 $W/lc/long_context --mixer gdn --tokens $T --iters 2 2>&1 | tail -1)"
    echo "no-conv/norm-kernels $(ADAPT_CONV_KERNEL=0 ADAPT_GATED_NORM_KERNEL=0 timeout 120 $W/lc/long_context --mixer gdn --tokens $T --iters 2 2>&1 | tail -1)"
  done
  timeout 120 $W/lc/long_context --mixer hybrid --tokens 131072 --recompute --iters 1 2>&1 | tail -1
  fi
  if want profiles; then
  echo "== profile at 32K $(date +%T)"
  timeout 120 $W/lc/long_context --delta-rule 1 32 32768 128 128 --profile $W/prof32k > $W/prof32k.log 2>&1
  grep -m3 "GPU time\|Wall" $W/prof32k/profile/breakdown.md
  python3 bench/h200/trace_kernels.py $W/prof32k/profile/trace.json 3 14 2>&1 | tail -18
  echo "== Kimi profile at 8K $(date +%T)"
  timeout 120 $W/lc/long_context --delta-rule 1 32 8192 128 128 --per-channel --profile $W/profkda > $W/profkda.log 2>&1
  grep -m3 "GPU time\|Wall" $W/profkda/profile/breakdown.md
  python3 bench/h200/trace_kernels.py $W/profkda/profile/trace.json 3 14 2>&1 | tail -18
  echo "== Kimi profile at 32K, the backward in head slices $(date +%T)"
  timeout 120 $W/lc/long_context --delta-rule 1 32 32768 128 128 --per-channel --profile $W/profkda32 > $W/profkda32.log 2>&1
  grep -m3 "GPU time\|Wall" $W/profkda32/profile/breakdown.md
  python3 bench/h200/trace_kernels.py $W/profkda32/profile/trace.json 3 14 2>&1 | tail -18
  fi
  if want ncu; then
  # Hardware counters of Kimi's forward kernels at 8K (ncu reads them on a
  # Firecracker machine; clocks left alone, METHOD.md): one launch each.
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  if [ -n "$NCU" ]; then
    echo "== ncu, Kimi's forward kernels at 8K $(date +%T)"
    timeout ${NCU_TIMEOUT:-240} $NCU --clock-control none -k "regex:${NCU_KERNELS:-kimiTransform|kimiOutput|perChannelScores|deltaRuleStateKernel}" \
      -c ${NCU_LAUNCHES:-4} --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis $W/lc/long_context --delta-rule 1 32 8192 128 128 --per-channel --iters 1 > $W/ncu.log 2>&1
    echo "-- ncu: rc $?"
    grep -E "^  [a-zA-Z].*\(|Duration|Throughput|Registers|Shared Memory Config|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|Warp Cycles|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Executed Ipc" $W/ncu.log | head -${NCU_LINES:-120}
  else
    echo "-- ncu: none"
  fi
  fi
  [ -n "${SKIP_FLA:-}" ] && { echo "== done $(date +%T)"; exit 0; }
  echo "== fla 0.6 $(date +%T)"
  source bench/h200/fla_env.sh
  [ -z "${SKIP_FLA_GDN:-}" ] &&
    timeout ${FLA_TIMEOUT:-240} python3 bench/h200/fla_delta_rule.py --bypass-triton-guard $SHAPES 2>&1 | grep -v Warning | tail -4
  [ -z "${SKIP_FLA_KDA:-}" ] &&
    timeout ${FLA_KDA_TIMEOUT:-240} python3 bench/h200/fla_delta_rule.py --bypass-triton-guard --per-channel \
      ${FLA_KDA_SHAPES:-1 32 8192 128 128} 2>&1 | grep -v Warning | tail -4
  # fla's simple GLA with MiniMax's fixed decays: the lightning rows' peer.
  want lightning && [ -z "${SKIP_FLA_LIGHTNING:-}" ] &&
    timeout ${FLA_LIGHTNING_TIMEOUT:-180} python3 bench/h200/fla_delta_rule.py --lightning \
      1 64 8192 128 128 1 64 32768 128 128 2>&1 | grep -v Warning | tail -2
  save_fla_cache "$OUT"
fi
echo "== done $(date +%T)"
