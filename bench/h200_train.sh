#!/usr/bin/env bash
# The H200 run of issue 3: builds the runtime and a generated trainer with
# PyTorch's LibTorch alone, trains Qwen3-30B-A3B's widths at reduced depth
# (random weights) with LoRA on attention and experts, and runs the peer
# (transformers + PEFT, same model, same batch, same GPU) side by side.
#
# usage: bench/h200_train.sh OUTDIR [BATCH] [SEQ]   (4 layers: the generated
# project was built for the 4-layer manifest)
# The trainer project is .h200/q30-L4, which bench/h200_prepare.sh generates
# here (`adapt build --no-compile` from the manifest make_random_qwen3_moe.py
# writes); carry .h200 to the device.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_train.sh OUTDIR [BATCH] [SEQ]}
LAYERS=4; BATCH=${2:-4}; SEQ=${3:-2048}; STEPS=${STEPS:-12}
mkdir -p "$OUT"
# Peak GPU memory of a command, the same way for both: nvidia-smi samples.
with_peak() {
  local tag=$1; shift
  ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done ) > $OUT/$tag.smi &
  local sampler=$!
  "$@"; local rc=$?
  kill $sampler; sort -n $OUT/$tag.smi | tail -1 | awk -v t=$tag '{printf "%s peak GPU memory: %.1f GiB\n", t, $1/1024}' | tee $OUT/$tag.peak
  return $rc
}
PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
W=/tmp/adapt-h200; mkdir -p $W
echo "== random model: Qwen3-30B-A3B widths, $LAYERS layers"
python3 bench/make_random_qwen3_moe.py bench/h200/qwen3-30b-a3b-config.json --layers "$LAYERS" --out $W/model
echo "== building the runtime and the generated trainer (LibTorch only)"
cmake -S runtime -B $W/rt -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" > $OUT/cmake-runtime.log
cmake --build $W/rt --target adapt_runtime 2>&1 | tail -3
cmake -S .h200/q30-L$LAYERS -B $W/train -G Ninja -DAdaptRuntime_DIR=$W/rt > $OUT/cmake-train.log
cmake --build $W/train 2>&1 | tail -3
python3 - "$W/data.jsonl" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(512):
        f.write(json.dumps({"input_ids": [random.randrange(151936) for _ in range(4096)]}) + "\n")
PY
echo "== adapt trainer: batch $BATCH x $SEQ, $STEPS steps"
with_peak adapt $W/train/train --model $W/model --data $W/data.jsonl --out $W/run --steps "$STEPS" --batch "$BATCH" \
  --seq-len "$SEQ" --device cuda --dtype bf16 --lr 1e-4 --checkpoint-every 1000 --log-every 1 2>&1 | tail -5
cp $W/run/metrics.jsonl $OUT/adapt-metrics.jsonl
echo "== peer: transformers + PEFT"
with_peak peer python3 bench/peer_hf_peft.py $W/model --batch "$BATCH" --seq-len "$SEQ" --steps 6 --rank 16 --alpha 32 --experts \
  | tee $OUT/peer.json
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(out + "/adapt-metrics.jsonl")]
steady = sorted(r["tokens_per_s"] for r in rows[3:]) or [rows[-1]["tokens_per_s"]]
ours = steady[len(steady) // 2]
peer = json.loads([l for l in open(out + "/peer.json") if l.startswith("{")][-1])
summary = {"adapt_tokens_per_s": ours, "peer_tokens_per_s": peer["tokens_per_s"],
           "ratio": ours / peer["tokens_per_s"], "adapt_peak_gib_smi": open(out + "/adapt.peak").read().split()[-2],
           "peer_peak_gib_smi": open(out + "/peer.peak").read().split()[-2], "peer_peak_allocated_gib": peer["peak_mem_gib"], "adapt_loss_first": rows[0]["loss"], "adapt_loss_last": rows[-1]["loss"]}
json.dump(summary, open(out + "/summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY
