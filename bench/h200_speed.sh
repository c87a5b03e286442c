#!/usr/bin/env bash
# Issue 17 on the H200: adapt's generated trainer against transformers + PEFT,
# side by side in one call, at several depths of Qwen3-30B-A3B's widths
# (random bf16 weights, LoRA r=16 on q/k/v/o and the routed experts, AdamW),
# then a --profile breakdown of adapt's step. Per-layer cost and fixed cost
# come from two depths: (t_deep - t_shallow) / (deep - shallow).
# usage: bench/h200_speed.sh OUTDIR   (after bench/h200_check.sh built the
#        runtime; projects from bench/h200_prepare.sh in .h200/q30-L<N>)
# env: DEPTHS ("1 12"), BATCH (2), SEQ (4096), STEPS (8), PEER (1: run it),
#      PEER_DEPTHS (the depths the peer runs at; default all), PROFILE (1: profile
#      each depth in PROFILE_DEPTHS, default all), MODELS (where random weights are written; /dev/shm for 48
#      layers, whose ~57 GB do not fit the disk beside the build), EAGER (1: also
#      run adapt with --no-cuda-graphs, and compare speed and per-step losses),
#      NAME (q30: Qwen3-30B-A3B's widths; qn: Qwen3-Next-80B-A3B's, whose
#      weights bench/fill_random_weights.py makes from .h200/qn-L<N>-model),
#      COMPARE_ENV (e.g. "ADAPT_RESIDUAL_NORM_KERNEL=0": also run adapt with
#      these environment settings, the baseline beside the default in the
#      same call; speed, peak and the losses' largest relative difference),
#      PEER_TARGETS (the peer's LoRA modules; default q/k/v/o, plus
#      in_proj_qkvz and out_proj for qn), PEER_ARGS (more flags for
#      bench/peer_hf_peft.py, e.g. --bypass-fla-triton-guard when fla's wheels
#      are on PYTHONPATH)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_speed.sh OUTDIR}; mkdir -p "$OUT"
W=/tmp/adapt-h200; M=${MODELS:-$W}; NAME=${NAME:-q30}; DEFAULT_TARGETS=q_proj,k_proj,v_proj,o_proj
[ "$NAME" = qn ] && DEFAULT_TARGETS=$DEFAULT_TARGETS,in_proj_qkvz,out_proj
PEER_TARGETS=${PEER_TARGETS:-$DEFAULT_TARGETS} BATCH=${BATCH:-2}; SEQ=${SEQ:-4096}; STEPS=${STEPS:-8}
python3 - "$W/data.jsonl" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(256):
        f.write(json.dumps({"input_ids": [random.randrange(151936) for _ in range(8192)]}) + "\n")
PY
for n in ${DEPTHS:-1 12}; do
  if [ "$NAME" = q30 ]; then
    python3 bench/make_random_qwen3_moe.py bench/h200/qwen3-30b-a3b-config.json --layers $n --out $M/model-L$n > /dev/null
  else
    rm -rf $M/model-L$n; cp -r .h200/$NAME-L$n-model $M/model-L$n
    python3 bench/fill_random_weights.py $M/model-L$n
  fi
  cmake -S .h200/$NAME-L$n -B $W/train-L$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DAdaptRuntime_DIR=$W/rt > /dev/null 2>&1
  cmake --build $W/train-L$n > $W/build-L$n.log 2>&1 || { echo "L$n: build failed"; tail -20 $W/build-L$n.log; continue; }
  rm -rf $W/run-L$n
  $W/train-L$n/train --model $M/model-L$n --data $W/data.jsonl --out $W/run-L$n --steps $STEPS --batch $BATCH \
    --seq-len $SEQ --device cuda --dtype bf16 --lr 1e-4 --checkpoint-every 1000 --log-every 0 ${EXTRA:-} \
    > $W/run-L$n.log 2>&1 || { echo "L$n: adapt failed"; tail -5 $W/run-L$n.log; }
  if [ "${EAGER:-0}" = 1 ]; then # the same run with every step eager: speed and losses against the graph's
    rm -rf $W/eager-L$n
    $W/train-L$n/train --model $M/model-L$n --data $W/data.jsonl --out $W/eager-L$n --steps $STEPS --batch $BATCH \
      --seq-len $SEQ --device cuda --dtype bf16 --lr 1e-4 --checkpoint-every 1000 --log-every 0 --no-cuda-graphs \
      ${EXTRA:-} > $W/eager-L$n.log 2>&1 || { echo "L$n: adapt (eager) failed"; tail -5 $W/eager-L$n.log; }
  fi
  if [ -n "${COMPARE_ENV:-}" ]; then # the baseline: the same run under COMPARE_ENV
    rm -rf $W/compare-L$n
    env $COMPARE_ENV $W/train-L$n/train --model $M/model-L$n --data $W/data.jsonl --out $W/compare-L$n --steps $STEPS \
      --batch $BATCH --seq-len $SEQ --device cuda --dtype bf16 --lr 1e-4 --checkpoint-every 1000 --log-every 0 \
      ${EXTRA:-} > $W/compare-L$n.log 2>&1 || { echo "L$n: adapt ($COMPARE_ENV) failed"; tail -5 $W/compare-L$n.log; }
  fi
  grep -h "CUDA graph" $W/run-L$n.log
  if [ "${PEER:-1}" = 1 ] && [[ " ${PEER_DEPTHS:-$n} " == *" $n "* ]]; then
    python3 bench/peer_hf_peft.py $M/model-L$n --batch $BATCH --seq-len $SEQ --steps 6 --rank 16 --alpha 32 \
      --experts --targets "$PEER_TARGETS" ${PEER_ARGS:-} 2>$W/peer-L$n.err | grep '^{' | tail -1 > $W/peer-L$n.json || echo '{}' > $W/peer-L$n.json
    grep -q tokens_per_s $W/peer-L$n.json || { echo "L$n: the peer failed"; grep -v Warning $W/peer-L$n.err | tail -3; }
  else
    echo '{}' > $W/peer-L$n.json
  fi
  rm -rf $W/prof-L$n
  [ "${PROFILE:-1}" = 1 ] && [[ " ${PROFILE_DEPTHS:-$n} " == *" $n "* ]] && $W/train-L$n/train --model $M/model-L$n --data $W/data.jsonl --out $W/prof-L$n --steps 4 --batch $BATCH \
    --seq-len $SEQ --device cuda --dtype bf16 --lr 1e-4 --checkpoint-every 1000 --log-every 0 --profile 2 ${EXTRA:-} \
    > /dev/null 2>&1 && cp $W/prof-L$n/profile/breakdown.md $OUT/breakdown-L$n.md
  rm -rf $M/model-L$n
done
python3 - "$W" "$OUT" $((BATCH * SEQ)) ${DEPTHS:-1 12} <<'PY'
import json, os, sys
w, out, tokens, depths = sys.argv[1], sys.argv[2], int(sys.argv[3]), [int(d) for d in sys.argv[4:]]
rows = {}
for n in depths:
    try:
        m = [json.loads(l) for l in open(f"{w}/run-L{n}/metrics.jsonl")]
    except OSError:
        continue
    steady = sorted(r["tokens_per_s"] for r in m[2:]) or [m[-1]["tokens_per_s"]]
    peer = json.load(open(f"{w}/peer-L{n}.json")) if open(f"{w}/peer-L{n}.json").read().strip() else {}
    peak = max(max(r.get("peak_device_gib", [0])) for r in m)
    rows[n] = {"adapt_tokens_per_s": steady[len(steady) // 2], "adapt_peak_gib": peak,
               "adapt_mfu": m[-1].get("mfu"), "peer_tokens_per_s": peer.get("tokens_per_s"),
               "peer_peak_gib": peer.get("peak_mem_gib"), "peer_linear_attention": peer.get("linear_attention"),
               "peer_fla_guard_bypassed": peer.get("fla_guard_bypassed"), "loss_last": m[-1]["loss"]}
    try:  # EAGER=1: the same steps without the CUDA graph
        e = [json.loads(l) for l in open(f"{w}/eager-L{n}/metrics.jsonl")]
        es = sorted(r["tokens_per_s"] for r in e[2:]) or [e[-1]["tokens_per_s"]]
        rows[n]["eager_tokens_per_s"] = es[len(es) // 2]
        rows[n]["eager_peak_gib"] = max(max(r.get("peak_device_gib", [0])) for r in e)
        rows[n]["graph_steps"] = sum(1 for r in m if r.get("cuda_graph"))
        rows[n]["loss_rel_diff_max"] = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(m, e))
        rows[n]["grad_norm_rel_diff_max"] = max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(m, e))
    except (OSError, ValueError, KeyError):
        pass
    try:  # COMPARE_ENV: the baseline's run
        b = [json.loads(l) for l in open(f"{w}/compare-L{n}/metrics.jsonl")]
        bs = sorted(r["tokens_per_s"] for r in b[2:]) or [b[-1]["tokens_per_s"]]
        rows[n]["compare_env"] = os.environ.get("COMPARE_ENV")
        rows[n]["compare_tokens_per_s"] = bs[len(bs) // 2]
        rows[n]["compare_peak_gib"] = max(max(r.get("peak_device_gib", [0])) for r in b)
        rows[n]["speedup_over_compare"] = rows[n]["adapt_tokens_per_s"] / rows[n]["compare_tokens_per_s"]
        rows[n]["compare_loss_rel_diff_max"] = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(m, b))
    except (OSError, ValueError, KeyError):
        pass
    if peer.get("tokens_per_s"):
        rows[n]["ratio"] = rows[n]["adapt_tokens_per_s"] / peer["tokens_per_s"]
ds = sorted(rows)
if len(ds) >= 2:
    a, b = ds[0], ds[-1]
    for who in ("adapt", "peer"):
        ta, tb = rows[a].get(f"{who}_tokens_per_s"), rows[b].get(f"{who}_tokens_per_s")
        if ta and tb:
            per_layer = (1 / tb - 1 / ta) / (b - a)   # seconds per token per layer
            rows[f"{who}_per_layer_ms_per_step"] = per_layer * tokens * 1e3
            rows[f"{who}_fixed_ms_per_step"] = (1 / ta - a * per_layer) * tokens * 1e3
json.dump(rows, open(out + "/speed.json", "w"), indent=2)
print(json.dumps(rows, indent=2))
PY
