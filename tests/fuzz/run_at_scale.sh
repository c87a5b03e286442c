#!/usr/bin/env bash
# Fuzzing at scale (outside CI): builds the libFuzzer targets (ASan + UBSan,
# through run_fuzzers.sh --build-only), then runs each target for RUNS
# executions, one after the other, on its working corpus plus its seeds, and
# writes OUTDIR/at-scale.json: per target the executions done, seconds,
# exec/s, corpus size and crashes (reproducers kept in OUTDIR/crashes-TARGET).
#
#   run_at_scale.sh [RUNS] [OUTDIR]     RUNS defaults to 1000000
#   ADAPT_FUZZ_TARGETS="config onnx"    only these targets
#   ADAPT_FUZZ_MAX_SECONDS=720          also stop a target after this long
#                                       (the real count is what is recorded)
# A crash stops its target (libFuzzer's behaviour); the others still run and
# the script exits 1. Results are appended to an existing at-scale.json entry
# by target name, so targets can be run one invocation at a time.
set -euo pipefail
runs=${1:-1000000}
out=${2:-build/fuzz}
src=$(cd "$(dirname "$0")/../.." && pwd)
targets=${ADAPT_FUZZ_TARGETS:-config manifest safetensors onnx jsonrpc}
max_seconds=${ADAPT_FUZZ_MAX_SECONDS:-0}
bash "$src/tests/fuzz/run_fuzzers.sh" --build-only "$out"
summary=$out/at-scale.json
failed=0
for target in $targets; do
  corpus=$out/corpus-$target crashes=$out/crashes-$target log=$out/at-scale-$target.log
  mkdir -p "$corpus" "$crashes"
  echo "== $target: $runs runs (log: $log)"
  start=$(date +%s)
  touch "$out/.at-scale-start"
  status=0
  : >"$log"
  # Progress: libFuzzer's power-of-two "pulse" lines and anything alarming.
  "$out/fuzz-$target" "$corpus" "$src/tests/fuzz/corpus/$target" -runs="$runs" \
    -max_total_time="$max_seconds" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/" >"$log" 2>&1 &
  pid=$!
  tail -n +1 -f --pid=$pid "$log" | grep --line-buffered -E 'pulse|Done|ERROR|SUMMARY|artifact|FuzzJsonRpc' || true
  wait $pid || status=$?
  wall=$(( $(date +%s) - start ))
  # "Done N runs in S second(s)" ends a run that was not stopped by a crash.
  done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1 || true)
  if [ -n "$done_line" ]; then
    execs=$(echo "$done_line" | awk '{print $2}')
    seconds=$(echo "$done_line" | awk '{print $5}')
  else
    execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | awk '{print $2}' | tail -n 1)
    seconds=$wall
  fi
  execs=${execs:-0}
  rate=$(awk -v n="$execs" -v s="$seconds" 'BEGIN { printf "%d", (s > 0 ? n / s : n) }')
  found=$(find "$crashes" -type f -newer "$out/.at-scale-start" | wc -l) # this run's only
  size=$(find "$corpus" -type f | wc -l)
  if [ "$status" -ne 0 ] || [ "$found" -ne 0 ]; then failed=1; fi
  echo "== $target: $execs runs in ${seconds}s ($rate exec/s), corpus $size, crashes $found, exit $status"
  # One JSON line per target, replacing that target's previous line.
  python3 - "$summary" "$target" "$execs" "$seconds" "$rate" "$size" "$found" "$status" "$runs" "$wall" <<'EOF'
import json, os, sys, time
path, target = sys.argv[1], sys.argv[2]
execs, seconds, rate, size, found, status, runs, wall = map(int, sys.argv[3:])
data = json.load(open(path)) if os.path.exists(path) else {"targets": []}
data["targets"] = [t for t in data["targets"] if t["target"] != target]
data["targets"].append({"target": target, "executions": execs, "requested_runs": runs,
                        "seconds": seconds, "wall_seconds": wall, "exec_per_second": rate, "corpus_size": size,
                        "crashes": found, "exit_status": status,
                        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
with open(path, "w") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
EOF
done
echo "== summary: $summary"
exit $failed
