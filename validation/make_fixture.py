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
                        A family with a vision tower (Qwen3-VL) also gets
                        images: pixel_values, image_grid_thw, input ids with
                        each image's placeholder tokens, LoRA on the vision
                        blocks' projections, and the tower's outputs
                        ("vision.merged", "vision.deepstack.<k>")
  adapter/              the initial adapter, as PEFT saves it
  fixture.json          family, versions, seeds, shapes and the SHA-256 of
                        every model file, so a fixture never meets other weights

--dtype float64 computes the same fixture in float64 (weights, adapter and
inputs are the same values; only the arithmetic is wider): the measure of the
reference's own fp32 rounding that the staleness test grounds its bound in.

usage: make_fixture.py MODEL_DIR OUT [--seed N] [--batch B] [--seq-len T] [--rank R] [--dtype float32|float64]
"""
import argparse
import hashlib
import json
import os

import peft
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_files(model_dir):
    """The files the fixture's numbers come from: config, index and weights
    (not the tokenizer, which no logit depends on)."""
    return {name: sha256(os.path.join(model_dir, name)) for name in sorted(os.listdir(model_dir))
            if name.endswith((".json", ".safetensors")) and not name.startswith("tokenizer")}


def lora_targets(model):
    """Attention projections (nn.Linear leaves under self_attn), fused experts
    and, with a vision tower, its blocks' projections (attn.qkv, attn.proj,
    mlp.linear_fc1/2). Never the sparse-attention indexer: it runs under
    no_grad, so adapters there cannot train (adapt build refuses them)."""
    modules, params = set(), set()
    for name, module in model.named_modules():
        if ".indexer." in name:
            continue
        if (".self_attn." in name or ".linear_attn." in name) and isinstance(module, torch.nn.Linear):
            modules.add(name.rsplit(".", 1)[-1])
        if ".visual.blocks." in name and isinstance(module, torch.nn.Linear):
            modules.add(".".join(name.rsplit(".", 2)[-2:]))
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "experts":
            local = name.split(".layers.", 1)[1].split(".", 1)[1]
            for p in ("gate_up_proj", "down_proj"):
                if hasattr(module, p):
                    params.add(f"{local}.{p}")
    return sorted(modules), sorted(params)


def patchify(image, patch, temporal, merge):
    """pixel_values of one normalised image [C, H, W] in the Qwen2-VL image
    processor's layout: the frame repeated to `temporal`, cut into patch x
    patch squares, ordered by merge x merge block, each row C*T*P*P."""
    c, h, w = image.shape
    frames = image[None].repeat(temporal, 1, 1, 1)
    gh, gw = h // patch, w // patch
    x = frames.reshape(1, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gh * gw, c * temporal * patch * patch), [1, gh, gw]


def image_inputs(config, batch, seq_len, gen):
    """Random images (one per sequence, different shapes) and input ids with
    their placeholder tokens between random text."""
    vision = config.vision_config
    patch, temporal, merge = vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size
    unit = patch * merge
    shapes = [(2 * unit, 3 * unit), (3 * unit, unit), (unit, unit), (2 * unit, 2 * unit)]
    pixels, grids, ids = [], [], []
    mean, std = torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0.5, 0.5, 0.5])
    vocab = config.text_config.vocab_size
    special = {config.image_token_id, config.video_token_id}
    for b in range(batch):
        h, w = shapes[b % len(shapes)]
        image = torch.randint(0, 256, (vision.in_channels, h, w), generator=gen).float() / 255
        image = (image - mean[:, None, None]) / std[:, None, None]
        pv, thw = patchify(image, patch, temporal, merge)
        pixels.append(pv)
        grids.append(thw)
        tokens = thw[1] * thw[2] // (merge * merge)
        text = torch.randint(0, vocab, (seq_len,), generator=gen)
        for t in special:  # no stray placeholder tokens in the text
            text[text == t] = 3
        start = 1 + b
        assert start + tokens < seq_len, "--seq-len too short for the images"
        text[start:start + tokens] = config.image_token_id
        ids.append(text)
    return torch.cat(pixels), torch.tensor(grids), torch.stack(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=12)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    with open(os.path.join(args.model, "config.json")) as f:
        has_vision = "vision_config" in json.load(f)
    auto = AutoModelForImageTextToText if has_vision else AutoModelForCausalLM
    model = auto.from_pretrained(args.model, dtype=torch.float32).to(dtype)
    if dtype == torch.float64:  # grouped_mm has no float64
        model.set_experts_implementation("eager")
    config = model.config
    modules, params = lora_targets(model)
    lora = peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=modules,
                           target_parameters=params or None)
    pm = peft.get_peft_model(model, lora).to(dtype)  # adapters in the same arithmetic
    gen = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():  # non-zero A and B, so every factor gets a gradient
        for name, p in pm.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)  # fp32 values, also in float64
    os.makedirs(args.out, exist_ok=True)
    pm.save_pretrained(os.path.join(args.out, "adapter"))
    saved = peft.get_peft_model_state_dict(pm)
    by_param = {}
    for name, p in pm.named_parameters():
        if p.requires_grad:
            by_param[name.replace(".default.weight", ".weight")] = p

    captured = {}
    hooks = []
    inner = pm.base_model.model.model
    layers = getattr(inner, "language_model", inner).layers
    for i, layer in enumerate(layers):
        ffn = getattr(layer, "mlp", None) or getattr(layer, "feed_forward")
        mixer = getattr(layer, "self_attn", None) or getattr(layer, "linear_attn")  # linear_attn: Qwen3-Next
        for tag, mod in (("attention", mixer), ("ffn", ffn), ("output", layer)):
            def hook(_m, _inp, out, key=f"layers.{i}.{tag}"):
                captured[key] = (out[0] if isinstance(out, tuple) else out).detach().clone()
            hooks.append(mod.register_forward_hook(hook))
    images = {}
    if has_vision:
        visual = inner.visual
        for key, mod in [("vision.merged", visual.merger)] + [
                (f"vision.deepstack.{k}", visual.deepstack_merger_list[k])
                for k in sorted(range(len(visual.deepstack_merger_list)),
                                key=lambda k: config.vision_config.deepstack_visual_indexes[k])]:
            def hook(_m, _inp, out, key=key):
                captured[key] = out.detach().clone()
            hooks.append(mod.register_forward_hook(hook))
        pixels, grid, ids = image_inputs(config, args.batch, args.seq_len, gen)
        images = {"pixel_values": pixels.to(dtype), "image_grid_thw": grid,
                  "mm_token_type_ids": (ids == config.image_token_id).int()}
    else:
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq_len), generator=gen)
    out = pm(input_ids=ids, labels=ids, **images)
    out.loss.backward()
    for h in hooks:
        h.remove()

    tensors = {"input_ids": ids, "logits": out.logits.detach(), "loss": out.loss.detach().reshape(1)}
    if has_vision:
        tensors["pixel_values"] = images["pixel_values"].contiguous()
        tensors["image_grid_thw"] = images["image_grid_thw"].contiguous()
    for key, value in saved.items():
        tensors[key] = value.detach().contiguous()
        # An adapter the reference never differentiates (DeepSeek sparse
        # attention's indexer runs under no_grad) has a zero gradient.
        grad = by_param[key].grad
        tensors[key + ".grad"] = (grad if grad is not None else torch.zeros_like(by_param[key])).detach().contiguous()
    tensors.update(captured)
    save_file(tensors, os.path.join(args.out, "fixture.safetensors"))
    meta = {
        "format": "adapt-reference-fixture", "version": 1,
        "family_model_type": config.model_type, "reference": {"transformers": transformers.__version__,
                                                               "peft": peft.__version__, "torch": torch.__version__},
        "dtype": args.dtype, "device": "cpu", "seed": args.seed, "batch": args.batch, "seq_len": args.seq_len,
        "lora": {"rank": args.rank, "alpha": 2 * args.rank, "target_modules": modules, "target_parameters": params},
        "layers": len(layers), "model_files": model_files(args.model),
    }
    if has_vision:
        meta["images"] = {"grid_thw": images["image_grid_thw"].tolist()}
    with open(os.path.join(args.out, "fixture.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
