# Sourced by the bench_*.sh timers: the adapt binary ($1, default
# build/bin/adapt), the shared models, a scratch folder with the synthesized
# ~2.8T reference model in $work/reference, and best_of.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
adapt=${1:-build/bin/adapt}
models=${ADAPT_SHARED_MODELS:-../shared/models}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 bench/synthesize_reference_model.py "$adapt" "$work/reference" >/dev/null

# best_of N COMMAND...: the shortest wall time of N runs, in seconds (%.3f);
# the command's output and exit status are ignored.
best_of() {
  local runs=$1 best=999 t0 t1 i
  shift
  for ((i = 0; i < runs; ++i)); do
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || true
    t1=$(date +%s.%N)
    best=$(python3 -c "print(min($best, $t1 - $t0))")
  done
  printf '%.3f' "$best"
}
