# Sourced by the one-call GPU scripts (bench/h200_delta_rule_brief.sh,
# bench/h200_lightning.sh) with OUT set: the clock (el: seconds since the
# start), the GPU's name, the runtime and long-context bench built into $W,
# and check NAME ENVS ONLY [DTYPE], which runs the op checks matching ONLY
# on the GPU under ENVS and prints their verdict, failures and the rows of
# their table that match $CHECK_ROWS (a regex; default: the first rows).
export W=/tmp/adapt-h200; mkdir -p $W/checks "$OUT"; T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
source bench/h200/build_runtime.sh
echo "== built $(el) s"
check() { local name=$1 envs=$2 only=$3 dtype=${4:-bfloat16}
  env $envs timeout 80 $W/rt/adapt-op-check --device cuda --seeds 2 --dtype $dtype --only $only --out $W/checks/$name > $W/checks-$name.log 2>&1
  echo "-- $name [$envs] $only $dtype: rc $? ($(el) s)"; grep -E "FAIL|fail|rror" $W/checks-$name.log | head -5
  grep -E "^\|" $W/checks/$name/op-stage.md 2>/dev/null | grep -v -- "---" | grep -E "${CHECK_ROWS:-.}" | head -8
  cp $W/checks-$name.log "$OUT/" 2>/dev/null; }
