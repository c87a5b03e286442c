#!/usr/bin/env bash
# Generated operators on the H200 (issue 6).
#  1. CUDA candidates, as `adapt generate --target cuda` treats them (adapt
#     itself needs MLIR, which the GPU machine lacks, so this script runs the
#     loop's two steps by hand with the same recipe): the candidate plus the
#     entry point, nvcc with `adapt-candidate-check --cuda-compile-flags`, then
#     the op stage on the GPU (`--device cuda`). The stub server's CUDA
#     candidates: a correct kernel, a wrong one, LibTorch composites run on
#     the GPU (one of them makes its mask on the CPU: only the GPU run
#     catches that, which is why adapt generate checks LibTorch candidates
#     on a GPU too when it sees one).
#  2. Approved generated operators inside trainers on CUDA (bf16): projects
#     made here with `adapt build --no-compile` (library vs generated router;
#     library vs generated attention core + activation) in CARRY, compiled
#     there against the runtime and trained side by side.
# usage: [SCENARIOS="CUDA_CORRECT:moe_routing ..."] [MODELS="dsv3 oss"]
#        bench/h200_candidates.sh OUTDIR [CARRY]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_candidates.sh OUTDIR [CARRY]}; CARRY=${2:-}; mkdir -p "$OUT"
W=/tmp/adapt-h200; mkdir -p $W
PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
echo "== building the runtime and adapt-candidate-check (LibTorch only)"
cmake -S runtime -B $W/rt -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" > $OUT/cmake-runtime.log 2>&1 || { tail -20 $OUT/cmake-runtime.log; exit 1; }
cmake --build $W/rt --target adapt_runtime adapt-candidate-check > $OUT/build-runtime.log 2>&1 || { grep -m5 -A5 error $OUT/build-runtime.log; exit 1; }
CHECK=$(find $W/rt -name adapt-candidate-check -type f | head -1)
$CHECK --cuda-available && echo "LibTorch sees a GPU" || echo "LibTorch sees NO GPU"
FLAGS=$($CHECK --cuda-compile-flags)
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
echo "== CUDA candidates ($($NVCC --version | tail -1))"
for spec in ${SCENARIOS:-CUDA_CORRECT:moe_routing CUDA_WRONG:moe_routing CORRECT:moe_routing \
              ATTENTION_CORRECT:attention_core ATTENTION_CPU_MASK:attention_core}; do
  scenario=${spec%%:*}; task=${spec##*:}
  case $task in
    moe_routing) params="--param scoring=1 --param use_bias=1 --param norm_topk_prob=1 --param routed_scaling_factor=2.5";;
    attention_core) params="--param use_sinks=1 --param window=128";;
  esac
  d=$W/cand/$scenario; mkdir -p $d
  ext=cu
  python3 - "$scenario" "$d/build.$ext" <<'PY'
import sys
sys.path.insert(0, "tests/e2e")
import llm_stub_server as stub
source = getattr(stub, sys.argv[1])
open(sys.argv[2], "w").write('#line 1 "candidate.cu"\n' + source +
    '\nextern "C" void *adapt_candidate_entry() {\n'
    '  return reinterpret_cast<void *>(&adapt_candidate);\n}\n')
PY
  start=$(date +%s.%N)
  if $NVCC $d/build.$ext -o $d/candidate.so $FLAGS > $d/compile.log 2>&1; then
    echo "$scenario: compiled in $(python3 -c "print(round($(date +%s.%N)-$start,1))") s"
    $CHECK --task $task --library $d/candidate.so --out $OUT/$scenario.json --device cuda $params
    echo "$scenario: checker exit $? -> $(python3 -c "import json;r=json.load(open('$OUT/$scenario.json'));print(r['status'], r.get('device'), [c['status'][0] for c in r['checks']], [c['detail'][:80] for c in r['checks'] if c['status']!='passed'][:1])")"
  else
    echo "$scenario: did not compile"; tail -20 $d/compile.log
  fi
done

[ -n "$CARRY" ] || exit 0
echo "== approved generated operators in trainers, CUDA bf16"
for name in ${MODELS:-dsv3 oss}; do
  set -- $name tiny-$name
  for kind in lib gen; do
    p=$CARRY/$1-$kind
    cmake -S $p -B $W/$1-$kind -G Ninja -DCMAKE_BUILD_TYPE=Release -DAdaptRuntime_DIR=$W/rt > $OUT/cmake-$1-$kind.log 2>&1 || { tail -20 $OUT/cmake-$1-$kind.log; continue; }
    cmake --build $W/$1-$kind > $OUT/build-$1-$kind.log 2>&1 || { grep -m5 -A5 error $OUT/build-$1-$kind.log; continue; }
    rm -rf $W/run-$1-$kind
    $W/$1-$kind/train --model $CARRY/$2 --data $CARRY/data.jsonl --out $W/run-$1-$kind --device cuda \
      --steps 12 --batch 4 --seq-len 32 --lr 1e-2 --log-every 0 2>&1 | grep -v "^step" | tail -3
    cp $W/run-$1-$kind/metrics.jsonl $OUT/metrics-$1-$kind.jsonl 2>/dev/null
  done
  python3 - $OUT/metrics-$1-lib.jsonl $OUT/metrics-$1-gen.jsonl <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f) if l.strip()] for f in sys.argv[1:3])
print("losses library", [round(x, 4) for x in a])
print("losses generated", [round(x, 4) for x in b])
print("max |difference|", max(abs(x - y) for x, y in zip(a, b)) if a and b else "n/a")
PY
done
