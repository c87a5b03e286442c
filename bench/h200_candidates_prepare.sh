#!/usr/bin/env bash
# Prepares CARRY for bench/h200_candidates.sh on this machine (adapt needs
# MLIR): tiny DeepSeek-V3 and gpt-oss models, a dataset, and for each a
# trainer project with the library's operators and one with approved
# generated operators (scripted LLM, registry copies that leave the router,
# resp. the sinks attention and clamped SwiGLU, to be generated).
# usage: bench/h200_candidates_prepare.sh CARRY   (then carry CARRY to the device)
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=${1:?usage: h200_candidates_prepare.sh CARRY}; rm -rf "$CARRY"; mkdir -p "$CARRY"
A=$PWD/build/bin/adapt
python3 tests/e2e/llm_stub_server.py 0 "$CARRY/requests.jsonl" > "$CARRY/port" &
STUB=$!; trap 'kill $STUB' EXIT; sleep 1
URL=http://127.0.0.1:$(head -1 "$CARRY/port")/v1
python3 - "$CARRY" <<'PY'
import json, random, sys
carry = sys.argv[1]
rng = random.Random(1)
with open(carry + "/data.jsonl", "w") as f:
    for _ in range(64):
        token, ids = rng.randrange(256), []
        for _ in range(48):
            ids.append(token); token = (token * 5 + 3) % 256
        f.write(json.dumps({"input_ids": ids}) + "\n")
for name, edit in (("dsv3", {"moe.sigmoid": ("status", "planned")}),
                   ("oss", {"moe.softmax": ("swiglu", ["plain"]), "attention.gqa": ("sinks", ["no"])})):
    reg = json.load(open("runtime/registry/ops.json"))
    for e in reg["ops"]:
        if e["id"] in edit:
            key, value = edit[e["id"]]
            (e if key == "status" else e["match"])[key] = value
    json.dump(reg, open("%s/registry-%s.json" % (carry, name), "w"))
PY
generate() { # NAME TINY_FAMILY SCENARIO COMPONENT...
  local name=$1 family=$2 scenario=$3; shift 3
  $A tiny $family --out $CARRY/tiny-$name > /dev/null
  local registry=$CARRY/registry-$name.json exported=$CARRY/registry-$name.json
  for c in "$@"; do
    local s=$scenario; [ "$c" = moe.router_bias.softmax.clamped ] && s=glu_correct
    $A generate $CARRY/tiny-$name --out $CARRY/gen-$name-$c --registry $registry --only $c \
       --endpoint $URL --model $s > /dev/null
    $A review $CARRY/gen-$name-$c --approve $c --by h200-bench > /dev/null
    $A review $CARRY/gen-$name-$c --export $CARRY/approved-$name.json --registry $exported > /dev/null
    exported=$CARRY/approved-$name.json
  done
  $A build $CARRY/tiny-$name --out $CARRY/$name-lib --no-compile > /dev/null
  $A build $CARRY/tiny-$name --out $CARRY/$name-gen --registry $exported --no-compile
}
generate dsv3 deepseek_v3 correct moe.bias_correction.grouped.sigmoid.shared
generate oss gpt_oss attention_correct attention.gqa.qkv_bias.yarn.sinks.sliding \
  attention.gqa.qkv_bias.yarn.sinks moe.router_bias.softmax.clamped
du -sh "$CARRY"
