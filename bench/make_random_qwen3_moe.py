#!/usr/bin/env python3
"""Writes a Qwen3-MoE model folder with random weights at a real model's widths.

The H200 benchmark trains Qwen3-30B-A3B's widths at reduced depth: the real
config.json with num_hidden_layers replaced, and random bf16 tensors under
the real checkpoint's names (per-expert tensors, as released). With
--manifest-only it writes config.json and model.safetensors.index.json only,
which is all `adapt build --no-compile` needs to generate the trainer.

usage: make_random_qwen3_moe.py CONFIG --layers N --out DIR [--manifest-only]
"""
import argparse
import json
import os
import sys


def tensors(cfg):
    """(name, shape) of every tensor, in checkpoint order."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    e, w = cfg["num_experts"], cfg["moe_intermediate_size"]
    out = [("model.embed_tokens.weight", [v, h])]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h]),
                (p + "self_attn.q_proj.weight", [heads * d, h]), (p + "self_attn.k_proj.weight", [kv * d, h]),
                (p + "self_attn.v_proj.weight", [kv * d, h]), (p + "self_attn.o_proj.weight", [h, heads * d]),
                (p + "self_attn.q_norm.weight", [d]), (p + "self_attn.k_norm.weight", [d]),
                (p + "mlp.gate.weight", [e, h])]
        for x in range(e):
            q = f"{p}mlp.experts.{x}."
            out += [(q + "gate_proj.weight", [w, h]), (q + "up_proj.weight", [w, h]), (q + "down_proj.weight", [h, w])]
    out += [("model.norm.weight", [h]), ("lm_head.weight", [v, h])]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--manifest-only", action="store_true")
    args = ap.parse_args()
    cfg = json.load(open(args.config))
    cfg["num_hidden_layers"] = args.layers
    cfg["max_window_layers"] = args.layers
    os.makedirs(args.out, exist_ok=True)
    json.dump(cfg, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    names = tensors(cfg)
    # One shard per layer keeps writing memory bounded.
    shard_of = {}
    groups = {}
    for name, shape in names:
        key = name.split(".")[2] if name.startswith("model.layers.") else "rest"
        groups.setdefault(key, []).append((name, shape))
    files = sorted(groups, key=lambda k: (k == "rest", int(k) if k.isdigit() else 0))
    total = 0
    for n, key in enumerate(files):
        fname = f"model-{n + 1:05d}-of-{len(files):05d}.safetensors"
        for name, shape in groups[key]:
            shard_of[name] = fname
            numel = 1
            for s in shape:
                numel *= s
            total += 2 * numel
    json.dump({"metadata": {"total_size": total}, "weight_map": shard_of},
              open(os.path.join(args.out, "model.safetensors.index.json"), "w"), indent=2)
    if args.manifest_only:
        return
    import torch
    from safetensors.torch import save_file
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    for n, key in enumerate(files):
        out = {}
        for name, shape in groups[key]:
            if name.endswith("norm.weight"):
                t = torch.ones(shape, device=dev)
            else:
                t = torch.randn(shape, device=dev, generator=g) * 0.02
            out[name] = t.to(torch.bfloat16).cpu()
        save_file(out, os.path.join(args.out, shard_of[groups[key][0][0]]))
        print(f"\rwrote shard {n + 1}/{len(files)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
