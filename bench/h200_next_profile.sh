#!/usr/bin/env bash
# The planner's calibration data for the Gated DeltaNet hybrid (docs/plan.md
# "Not calibrated yet") in one device call: Qwen3-Next-80B-A3B's widths at 4
# and 8 layers (2 x 4096 tokens, LoRA r=16 on attention, in_proj_qkvz,
# out_proj and the experts; no peer), tokens/s and the allocator peak at each
# depth (per layer from the two), then the 4-layer step's --profile
# breakdown by kind and its largest kernels (bench/h200/trace_kernels.py):
# the delta rule, its elementwise neighbours, the projections and the MoE.
# usage: bench/h200_next_profile.sh OUTDIR   (from the repository root;
#        .h200/qn-L4 and qn-L8 from `NEXT_DEPTHS="4 8" bench/h200_prepare.sh`,
#        carried with `carry: [".h200"]`)
cd "$(dirname "$0")/.."
OUT=${1:?usage: h200_next_profile.sh OUTDIR}
source bench/h200/start.sh
NAME=qn DEPTHS="4 8" PEER=0 PROFILE=1 PROFILE_DEPTHS=4 STEPS=8 bash bench/h200_speed.sh "$OUT" 2>&1 | tail -60
python3 bench/h200/trace_kernels.py $W/prof-L4/profile/trace.json 2 40 > "$OUT/kernels-L4.txt" 2>&1
head -45 "$OUT/kernels-L4.txt"; cat "$OUT/breakdown-L4.md" 2>/dev/null | head -30
echo "== done $(el) s"
