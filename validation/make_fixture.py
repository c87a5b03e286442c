#!/usr/bin/env python3
"""Reference fixture of one tiny model: transformers 5.17 + PEFT 0.21, fp32, CPU.

Given a model folder (from `adapt tiny FAMILY`), builds the reference model,
puts a PEFT LoRA adapter on the attention projections and the routed experts
(fused expert tensors through `target_parameters`) with deterministic
non-zero initial values, runs forward and backward on fixed token ids and
saves, under OUT:

  fixture.safetensors   input_ids; logits; loss; every adapter tensor's
                        initial value (PEFT's file keys) and its gradient
                        ("<key>.grad"); each decoder layer's attention
                        output, FFN output and layer output
                        ("layers.<i>.attention|ffn|output")
  adapter/              the initial adapter, as PEFT saves it
  fixture.json          family, versions, seeds, shapes and the SHA-256 of
                        every model file, so a fixture never meets other weights

usage: make_fixture.py MODEL_DIR OUT [--seed N] [--batch B] [--seq-len T] [--rank R]
"""
import argparse
import hashlib
import json
import os

import peft
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_files(model_dir):
    return {name: sha256(os.path.join(model_dir, name)) for name in sorted(os.listdir(model_dir))
            if name.endswith((".json", ".safetensors"))}


def lora_targets(model):
    """Attention projections (nn.Linear leaves under self_attn) and fused experts."""
    modules, params = set(), set()
    for name, module in model.named_modules():
        if ".self_attn." in name and isinstance(module, torch.nn.Linear):
            modules.add(name.rsplit(".", 1)[-1])
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "experts":
            local = name.split(".layers.", 1)[1].split(".", 1)[1]
            for p in ("gate_up_proj", "down_proj"):
                if hasattr(module, p):
                    params.add(f"{local}.{p}")
    return sorted(modules), sorted(params)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=12)
    ap.add_argument("--rank", type=int, default=4)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = model.config
    modules, params = lora_targets(model)
    lora = peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=modules,
                           target_parameters=params or None)
    pm = peft.get_peft_model(model, lora)
    gen = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():  # non-zero A and B, so every factor gets a gradient
        for name, p in pm.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    os.makedirs(args.out, exist_ok=True)
    pm.save_pretrained(os.path.join(args.out, "adapter"))
    saved = peft.get_peft_model_state_dict(pm)
    by_param = {}
    for name, p in pm.named_parameters():
        if p.requires_grad:
            by_param[name.replace(".default.weight", ".weight")] = p

    captured = {}
    hooks = []
    layers = pm.base_model.model.model.layers
    for i, layer in enumerate(layers):
        ffn = getattr(layer, "mlp", None) or getattr(layer, "feed_forward")
        for tag, mod in (("attention", layer.self_attn), ("ffn", ffn), ("output", layer)):
            def hook(_m, _inp, out, key=f"layers.{i}.{tag}"):
                captured[key] = (out[0] if isinstance(out, tuple) else out).detach().clone()
            hooks.append(mod.register_forward_hook(hook))
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq_len), generator=gen)
    out = pm(input_ids=ids, labels=ids)
    out.loss.backward()
    for h in hooks:
        h.remove()

    tensors = {"input_ids": ids, "logits": out.logits.detach(), "loss": out.loss.detach().reshape(1)}
    for key, value in saved.items():
        tensors[key] = value.detach().contiguous()
        tensors[key + ".grad"] = by_param[key].grad.detach().contiguous()
    tensors.update(captured)
    save_file(tensors, os.path.join(args.out, "fixture.safetensors"))
    meta = {
        "format": "adapt-reference-fixture", "version": 1,
        "family_model_type": config.model_type, "reference": {"transformers": transformers.__version__,
                                                               "peft": peft.__version__, "torch": torch.__version__},
        "dtype": "float32", "device": "cpu", "seed": args.seed, "batch": args.batch, "seq_len": args.seq_len,
        "lora": {"rank": args.rank, "alpha": 2 * args.rank, "target_modules": modules, "target_parameters": params},
        "layers": len(layers), "model_files": model_files(args.model),
    }
    with open(os.path.join(args.out, "fixture.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
