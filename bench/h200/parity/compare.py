"""Compares parity's logits with transformers + PEFT on the same ids: the
fp32 CPU reference, and (on a GPU, for bf16 runs) transformers' own bf16 on
the GPU, with the share of positions that differ by more than 0.1 (a routing
flip between near-tied experts moves a whole position).
usage: compare.py MODEL_DIR OUT_DIR [bf16]"""
import sys

import peft
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

model_dir, out = sys.argv[1], sys.argv[2]
ours = load_file(out + "/logits.safetensors")
saved = load_file(out + "/adapter/adapter_model.safetensors")
setups = [(torch.float32, "cpu")]
if len(sys.argv) > 3 and sys.argv[3] == "bf16" and torch.cuda.is_available():
    setups.append((torch.bfloat16, "cuda"))
for dtype, device in setups:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    peft_model = peft.PeftModel.from_pretrained(model, out + "/adapter")
    params = dict(peft_model.named_parameters())
    unloaded = [k for k in saved if k.replace(".weight", ".default.weight") not in params]
    with torch.no_grad():
        ref = peft_model(ours["input_ids"].to(device)).logits.float().cpu()
    diff = (ref - ours["logits"]).abs()
    print(f"{model_dir} vs transformers {dtype} {device}: max|diff| {diff.max().item():.3e} "
          f"rel {(diff.max() / ref.abs().max()).item():.2e} median {diff.median().item():.2e} "
          f"positions>0.1 {(diff.amax(-1) > 0.1).float().mean().item():.3f} unloaded-keys {len(unloaded)}")
