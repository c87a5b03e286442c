#!/usr/bin/env bash
# Issue 15 on the H200: the runtime built with LibTorch + NCCL, then
#  1. tiny qwen3_moe in fp32 on the GPU: one plain process against a torchrun
#     job (groups formed through NCCL, gradients all-reduced, experts gathered
#     for the export): losses and every step's gradients must agree;
#  2. Qwen3-30B-A3B's widths at 4 layers (random bf16 weights): tokens/s of a
#     plain process and of torchrun at the lent GPU count (GPUS, default the
#     visible GPUs; EP = GPUS), so the collectives' cost is measured.
#  3. with 2+ GPUs, PP2 (4 micro-batches), CP2, TP2 and DP2 on that model.
# usage: bench/h200_parallel.sh OUTDIR   (trainer projects from
#        bench/h200_prepare.sh in .h200/tiny-qwen3-moe and .h200/q30-L4)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_parallel.sh OUTDIR}; mkdir -p "$OUT"
W=/tmp/adapt-h200; mkdir -p $W
GPUS=${GPUS:-$(nvidia-smi -L | wc -l)}
PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
echo "== runtime (LibTorch + NCCL), $GPUS GPU(s)"
cmake -S runtime -B $W/rt -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" > $OUT/cmake-runtime.log 2>&1 || { tail -20 $OUT/cmake-runtime.log; exit 1; }
grep "adapt runtime:" $OUT/cmake-runtime.log
cmake --build $W/rt --target adapt_runtime > $OUT/build-runtime.log 2>&1 || { tail -30 $OUT/build-runtime.log; exit 1; }
for p in tiny-qwen3-moe q30-L4; do
  cmake -S .h200/$p -B $W/$p -G Ninja -DAdaptRuntime_DIR=$W/rt > /dev/null 2>&1
  cmake --build $W/$p > $OUT/build-$p.log 2>&1 || { echo "$p: build failed"; tail -20 $OUT/build-$p.log; exit 1; }
done
python3 - "$W/tiny.jsonl" "$W/big.jsonl" <<'PY'
import json, random, sys
tiny_vocab = json.load(open("models/tiny-qwen3-moe/config.json"))["vocab_size"]
for path, vocab, length, docs in ((sys.argv[1], tiny_vocab, 48, 64), (sys.argv[2], 151936, 4096, 256)):
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(docs):
            t, ids = rng.randrange(vocab), []
            for _ in range(length):
                ids.append(t); t = (t * 5 + 3) % vocab
            f.write(json.dumps({"input_ids": ids}) + "\n")
PY
TINY="--model models/tiny-qwen3-moe --data $W/tiny.jsonl --steps 6 --batch 4 --seq-len 32 --lr 1e-2 --log-every 0 --device cuda --dtype fp32"
echo "== 1. tiny qwen3_moe fp32: plain vs torchrun (NCCL)"
rm -rf $W/t-plain $W/t-nccl
$W/tiny-qwen3-moe/train $TINY --out $W/t-plain --export $W/t-plain/adapter --dump-gradients $W/t-plain/g.safetensors 2>&1 | tail -1
torchrun --nproc-per-node 1 --no-python $W/tiny-qwen3-moe/train $TINY --out $W/t-nccl \
  --export $W/t-nccl/adapter --dump-gradients $W/t-nccl/g.safetensors > $OUT/tiny-nccl.log 2>&1; echo "torchrun exit $?"
grep -E "rank 0 of|error" $OUT/tiny-nccl.log | head -3
python3 - $W/t-plain $W/t-nccl <<'PY' | tee $OUT/tiny-compare.txt
import json, sys
from safetensors.torch import load_file
a, b = sys.argv[1:3]
la = [json.loads(l)["loss"] for l in open(a + "/metrics.jsonl")]
lb = [json.loads(l)["loss"] for l in open(b + "/metrics.jsonl")]
ga, gb = load_file(a + "/g.safetensors"), load_file(b + "/g.safetensors")
loss = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
grad = max(((ga[k] - gb[k]).norm() / ga[k].norm().clamp_min(1e-30)).item() for k in ga)
print(f"tiny fp32 cuda, torchrun world 1 (NCCL) vs plain: losses {loss:.2e}, gradients {grad:.2e}, steps {len(lb)}")
PY
BIG="--data $W/big.jsonl --steps 12 --batch 4 --seq-len 2048 --lr 1e-4 --log-every 0 --device cuda --dtype bf16 --checkpoint-every 1000"
echo "== 2. Qwen3-30B-A3B widths, 4 layers, bf16"
python3 bench/make_random_qwen3_moe.py bench/h200/qwen3-30b-a3b-config.json --layers 4 --out $W/model > /dev/null
rm -rf $W/b-plain $W/b-dist
$W/q30-L4/train --model $W/model $BIG --out $W/b-plain > $OUT/big-plain.log 2>&1; echo "plain exit $?"
torchrun --nproc-per-node $GPUS --no-python $W/q30-L4/train --model $W/model $BIG --ep $GPUS \
  --out $W/b-dist > $OUT/big-dist.log 2>&1; echo "torchrun ($GPUS GPUs, EP$GPUS) exit $?"
python3 - $W/b-plain $W/b-dist $GPUS <<'PY' | tee $OUT/big-compare.txt
import json, statistics, sys
def med(path, key):
    rows = [json.loads(l) for l in open(path + "/metrics.jsonl")][3:]
    return statistics.median(r[key] for r in rows if r.get(key) is not None) if rows else float("nan")
p, d, gpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
tp, td = med(p, "tokens_per_s"), med(d, "tokens_per_s")
print(f"plain {tp:,.0f} tok/s; torchrun EP{gpus} {td:,.0f} tok/s ({td / tp:.3f}x), "
      f"allreduce {med(d, 'allreduce_s') * 1e3:.2f} ms/step, alltoall {med(d, 'alltoall_s') * 1e3:.2f} ms/step")
PY
cp $W/b-dist/metrics.jsonl $OUT/big-dist-metrics.jsonl 2>/dev/null
# 3. With 2+ GPUs: the other layouts on the same model, 2 ranks each (PP
#    with 4 micro-batches per step, CP splitting the 2048 tokens, TP), so
#    their cost against plain and EP is on record whenever GPUs are lent.
if [ "$GPUS" -ge 2 ]; then
  for layout in "--pp 2 --micro-batches 4" "--cp 2" "--tp 2" "--dp 2"; do
    name=$(echo "$layout" | tr -d ' -')
    rm -rf $W/b-$name
    torchrun --nproc-per-node 2 --no-python $W/q30-L4/train --model $W/model $BIG $layout \
      --out $W/b-$name > $OUT/big-$name.log 2>&1; echo "torchrun 2 GPUs ($layout) exit $?"
    python3 - $W/b-plain $W/b-$name "$layout" <<'PY' | tee -a $OUT/big-compare.txt
import json, statistics, sys
def med(path, key):
    rows = [json.loads(l) for l in open(path + "/metrics.jsonl")][3:]
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")
p, d, layout = sys.argv[1:4]
tp, td = med(p, "tokens_per_s"), med(d, "tokens_per_s")
print(f"torchrun 2 GPUs {layout}: {td:,.0f} tok/s ({td / tp:.3f}x plain), per GPU {td / 2:,.0f}; "
      f"allreduce {med(d, 'allreduce_s') * 1e3:.2f} ms, tp {med(d, 'tp_allreduce_s') * 1e3:.2f} ms, "
      f"pipeline wait {med(d, 'pipeline_wait_s') * 1e3:.2f} ms per step")
PY
  done
fi
