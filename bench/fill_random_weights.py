#!/usr/bin/env python3
"""Fills a model folder that `adapt tiny FAMILY --config CONFIG --manifest-only`
wrote: one safetensors shard per entry of its index, each tensor drawn from the
normal distribution random_weights.json gives it (mean, std; bf16), on the GPU
when there is one. A real model's widths at a few layers hold tens of GB, too
much to carry to the device: the names and shapes travel, the values are made
there.

usage: fill_random_weights.py DIR [--seed N]
"""
import argparse
import json
import os
import sys
import time

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--seed", type=int, default=None, help="default: random_weights.json's seed")
    args = ap.parse_args()
    spec_path = os.path.join(args.dir, "random_weights.json")
    try:
        spec = json.load(open(spec_path))
        tensors = spec["tensors"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"fill_random_weights: {spec_path}: expected the file adapt tiny --manifest-only writes ({e})")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(spec.get("seed", 0) if args.seed is None else args.seed)
    by_shard = {}
    for t in tensors:
        if t.get("dtype") != "BF16":
            sys.exit(f"fill_random_weights: {spec_path}: {t.get('name')}: expected dtype BF16")
        by_shard.setdefault(t["shard"], []).append(t)
    start = time.time()
    for n, (shard, entries) in enumerate(sorted(by_shard.items())):
        out = {}
        for t in entries:
            x = torch.randn(t["shape"], generator=gen, device=device, dtype=torch.float32)
            out[t["name"]] = (x * t["std"] + t["mean"]).to(torch.bfloat16).cpu()
        save_file(out, os.path.join(args.dir, shard), metadata={"format": "pt"})
        print(f"[{n + 1}/{len(by_shard)}] {shard}: {len(entries)} tensors, {time.time() - start:.0f} s",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
