#!/usr/bin/env bash
# Where KDA's kernels wait, line by line, in one device call: the runtime built
# with source lines (LINEINFO=1, no change to the kernels' code), then for each
# of Kimi's largest kernels at 1 x 32 x 8K one launch under Nsight Compute's
# full set with the source imported, and bench/h200/ncu_hotspots.py's summary:
# stall samples by reason and the source lines holding the most. Written in
# session 57 for the forward (transform 0.93 ms, output 0.74 at 8K, 1.4x fla's
# forward) and the paired backward's diagonal pass (1.20 ms), whose next
# changes need this view rather than guesses. ONLY=REGEX narrows the kernels;
# ENVS=... runs the app under those settings (e.g. ADAPT_KIMI_SCORES_MMA_WIDE=1).
# The reports and CSVs are left in OUTDIR. Expect ~125 s of build and ~30 s a
# kernel.
# usage: bench/h200_kimi_hotspots.sh OUTDIR   (from the repository root)
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_kimi_hotspots.sh OUTDIR}
export LINEINFO=1
source bench/h200/start.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu: none on this machine"; exit 1; }
KERNELS=${ONLY:-kimiTransformKernel kimiOutputKernel pairedScoresMmaKernel kimiChunkGradKernel kimiBackwardTailKernel}
for k in $KERNELS; do
  env ${ENVS:-ADAPT_NONE=1} timeout 150 $NCU --set full --import-source yes -k "regex:$k" -c 1 -f -o $OUT/$k \
    $W/lc/long_context --delta-rule 1 32 8192 128 128 --per-channel --iters 1 > $W/ncu-$k.log 2>&1
  echo "-- ncu $k: rc $? ($(el) s)"
  [ -f $OUT/$k.ncu-rep ] || { tail -5 $W/ncu-$k.log; continue; }
  $NCU --import $OUT/$k.ncu-rep --page source --csv --print-source cuda > $OUT/$k-source.csv 2> $W/ncu-src-$k.log
  python3 bench/h200/ncu_hotspots.py $OUT/$k-source.csv 12
  $NCU --import $OUT/$k.ncu-rep --page details --csv > $OUT/$k-details.csv 2>/dev/null
  grep -E '"(Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|Eligible Warps Per Scheduler)"' \
    $OUT/$k-details.csv | awk -F'","' '{print "   " $(NF-2) ": " $NF}' | tr -d '"' | head -8
done
echo "== done $(el) s"
