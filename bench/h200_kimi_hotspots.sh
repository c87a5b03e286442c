#!/usr/bin/env bash
# Where KDA's kernels wait, line by line, in one device call: the runtime built
# with source lines (LINEINFO=1, no change to the kernels' code), then for each
# of Kimi's largest kernels at 1 x 32 x 8K one launch under Nsight Compute's
# full set with the source imported, and bench/h200/ncu_lines.py's summary
# (through Nsight Compute's Python report interface): stall samples by reason
# and the source lines holding the most. Written in
# session 57 for the forward (transform 0.93 ms, output 0.74 at 8K, 1.4x fla's
# forward) and the paired backward's diagonal pass (1.20 ms), whose next
# changes need this view rather than guesses. ONLY=REGEX narrows the kernels;
# ENVS=... runs the app under those settings (e.g. ADAPT_KIMI_PACKED_PAIRS=1).
# Each kernel's lines go to OUTDIR/KERNEL-lines.txt (the reports stay in the
# device's /tmp: a call returns only a few files). Expect ~125 s of build and
# ~30 s a kernel.
# usage: bench/h200_kimi_hotspots.sh OUTDIR   (from the repository root)
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_kimi_hotspots.sh OUTDIR}
export LINEINFO=1
source bench/h200/start.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu: none on this machine"; exit 1; }
KERNELS=${ONLY:-kimiTransformKernel kimiOutputKernel pairedScoresMmaKernel kimiChunkGradKernel kimiBackwardTailKernel}
# Nsight Compute's Python report interface (bench/h200/ncu_lines.py reads it).
export NCU_PYTHON=$(dirname "$(readlink -f $NCU)")/extras/python
[ -f $NCU_PYTHON/ncu_report.py ] || NCU_PYTHON=$(dirname "$(find /opt /usr/local -name ncu_report.py 2>/dev/null | head -1)")
for k in $KERNELS; do
  env ${ENVS:-ADAPT_NONE=1} timeout 150 $NCU --set full --import-source yes -k "regex:$k" -c 1 -f -o $W/$k \
    $W/lc/long_context --delta-rule 1 32 8192 128 128 --per-channel --iters 1 > $W/ncu-$k.log 2>&1
  echo "-- ncu $k [${ENVS:-defaults}]: rc $? ($(el) s)"
  [ -f $W/$k.ncu-rep ] || { tail -5 $W/ncu-$k.log; continue; }
  # The lines (session 58 on): per source line, through the report's own interface.
  python3 bench/h200/ncu_lines.py $W/$k.ncu-rep ${TOP:-14} 2>&1 | tee $OUT/$k-lines.txt | cut -c1-220
  # The headline counters, then the SASS page's CSV for the next reader (session 57's cuda page had no samples).
  $NCU --import $W/$k.ncu-rep --page details --csv > $W/$k-details.csv 2>/dev/null
  grep -E '"(Duration|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|Eligible Warps Per Scheduler)"' \
    $W/$k-details.csv | awk -F'","' '{print "   " $(NF-2) ": " $NF}' | tr -d '"' | head -6
  $NCU --import $W/$k.ncu-rep --page source --csv --print-source sass > $W/$k-sass.csv 2>/dev/null
  python3 bench/h200/ncu_hotspots.py $W/$k-sass.csv 6 > $OUT/$k-sass.txt 2>&1; head -c 300 $OUT/$k-sass.txt; echo
done
echo "== done $(el) s"
