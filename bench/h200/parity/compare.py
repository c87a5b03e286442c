"""Compares parity's logits with transformers + PEFT (fp32, CPU) on the same ids.
usage: compare.py MODEL_DIR OUT_DIR"""
import sys, torch, peft, warnings
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
model_dir, out = sys.argv[1], sys.argv[2]
d = load_file(out + "/logits.safetensors")
m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
pm = peft.PeftModel.from_pretrained(m, out + "/adapter")
# every adapter tensor in the file must have landed in the model
sd = load_file(out + "/adapter/adapter_model.safetensors")
params = dict(pm.named_parameters())
missing = [k for k in sd if k.replace(".weight", ".default.weight") not in params]
with torch.no_grad():
    ref = pm(d["input_ids"]).logits
diff = (ref - d["logits"]).abs().max().item()
print(f"{model_dir}: max|diff| {diff:.3e} ref max {ref.abs().max().item():.3e} rel {diff/ref.abs().max().item():.2e} unloaded-keys {len(missing)} {missing[:3]}")
