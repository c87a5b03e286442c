#!/usr/bin/env bash
# Issue 4 on the H200: loss alignment (50 steps, ours vs transformers + PEFT on
# the same batches and initial adapter) in bf16 and fp32 on the GPU, and the
# PEFT round trip both ways, for each tiny family in .h200/tiny with its
# trainer project in .h200/la-gen (generated here with the fixtures' targets).
# usage: bench/h200_validate.sh OUTDIR   (after bench/h200_check.sh built the runtime)
# env: FAMILIES (default: all in .h200/la-gen), DTYPES (bf16), LORA_RANK (LoRA rank, 4;
#      8 or more takes the fused expert LoRA kernel on the GPU), TRAIN_ARGS (more flags for
#      our trainer's training runs, e.g. --no-cuda-graphs), TAG (appended to the record's name),
#      SEQ_LEN (tokens per sequence, 16; 200 runs the delta rule over four 64-token chunks)
# Each run's line ends with which guarded ops ran their CUDA kernels (ours/kernels.json).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_validate.sh OUTDIR}; mkdir -p "$OUT"
W=/tmp/adapt-h200
for f in ${FAMILIES:-$(ls .h200/la-gen)}; do
  cmake -S .h200/la-gen/$f -B $W/la-$f -G Ninja -DCMAKE_BUILD_TYPE=Release -DAdaptRuntime_DIR=$W/rt > /dev/null 2>&1
  cmake --build $W/la-$f > $OUT/build-la-$f.log 2>&1 || { echo "$f: build failed"; tail -5 $OUT/build-la-$f.log; continue; }
  for dt in ${DTYPES:-bf16}; do
    echo -n "$f cuda $dt: "
    python3 validation/loss_alignment.py .h200/tiny/$f $W/la-$f/train $W/la-out-$f-$dt --device cuda --dtype $dt \
      --rank ${LORA_RANK:-4} --seq-len ${SEQ_LEN:-16} $(for a in ${TRAIN_ARGS:-}; do echo "--train-arg=$a"; done) 2>&1 | tail -3
    # Which guarded ops reached their CUDA kernels in our run (runtime/KernelLedger.h).
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
def tally(v):
    return " ".join([str(v["kernel"]), "kernel"] + (["/", str(v["switched_off"]), "off"] if v["switched_off"] else [])
                    + (["/", str(v["refused"]), "REFUSED (first:", v.get("first_refused", "?") + ")"] if v["refused"] else []))
print("  kernels:", "; ".join(k + " " + tally(v) for k, v in d["sites"].items()))' \
      $W/la-out-$f-$dt/ours/kernels.json 2>/dev/null || echo "  kernels: no kernels.json"
    cp $W/la-out-$f-$dt/ours/kernels.json $OUT/kernels-$f-cuda-$dt${TAG:-}.json 2>/dev/null
    cp $W/la-out-$f-$dt/loss-alignment.json $OUT/loss-alignment-$f-cuda-$dt${LORA_RANK:+-r$LORA_RANK}${TAG:-}.json 2>/dev/null
  done
done
