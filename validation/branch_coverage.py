#!/usr/bin/env python3
"""Which of its family's branches a tiny model's fixture actually exercises.

A model-stage or loss-alignment pass proves only the code the inputs reach: a
SwiGLU clamp that no value exceeds, a window longer than the sequence or a
group-limited router whose groups never change the choice would pass with the
branch missing. This probe runs the reference (transformers, fp32, CPU) on
the fixture's own input ids and counts, per branch, how often it acted:

  swiglu_gate_clamped / swiglu_up_clamped   gpt-oss gate > limit, |up| > limit
  sliding_window, chunked_window            keys a window or chunk hid
  nope_layers, temperature_tuning           Llama-4 global layers; positions the
                                            attention temperature scaled
  lightning_blocks                          MiniMax lightning blocks past the first
  group_limited_routing                     tokens whose group-limited top-k differs
                                            from the plain top-k (DeepSeek-V3)
  sparse_selection                          DSA queries with more visible keys than
                                            index_topk (the indexer dropped some)
  unequal_linear_head_dims                  Gated DeltaNet key head dim != value head dim
  unequal_mla_head_dims                     MLA q/k head dim != v head dim
  image_tokens                              image placeholder tokens in the batch

usage: branch_coverage.py MODEL_DIR FIXTURE_DIR   (prints one JSON object)
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText


def structural(config, text, seq_len, ids):
    """Branches decided by the config and the sequence alone (counts of the
    positions or layers they act on)."""
    hits = {}
    types = getattr(text, "layer_types", None) or []
    window = getattr(text, "sliding_window", None)
    if "sliding_attention" in types and window:
        hits["sliding_window"] = max(seq_len - window, 0)
    chunk = getattr(text, "attention_chunk_size", None)
    if chunk:
        hits["chunked_window"] = max(seq_len - chunk, 0)
        rope = getattr(text, "no_rope_layers", None) or []
        hits["nope_layers"] = sum(1 for r in rope if not r)
        floor = getattr(text, "floor_scale", 8192)
        hits["temperature_tuning"] = sum(1 for p in range(seq_len) if math.floor((p + 1) / floor) >= 1)
    if text.model_type == "minimax":
        hits["lightning_blocks"] = max(math.ceil(seq_len / text.block_size) - 1, 0)
    if getattr(text, "index_topk", None):
        hits["sparse_selection"] = sum(1 for q in range(seq_len) if q + 1 > text.index_topk)
    if getattr(text, "linear_key_head_dim", None):
        hits["unequal_linear_head_dims"] = int(text.linear_key_head_dim != text.linear_value_head_dim)
    if getattr(text, "kv_lora_rank", None):
        hits["unequal_mla_head_dims"] = int(text.qk_nope_head_dim + text.qk_rope_head_dim != text.v_head_dim)
    image_token = getattr(config, "image_token_id", None)
    if image_token is not None:
        hits["image_tokens"] = int((ids == image_token).sum())
    return hits


def probe_swiglu(model, hits):
    """Counts gpt-oss gate/up values beyond the clamp on the experts' path."""
    experts = [m for m in model.modules() if type(m).__name__ == "GptOssExperts"]
    if not experts:
        return
    hits["swiglu_gate_clamped"] = 0
    hits["swiglu_up_clamped"] = 0
    for module in experts:
        original = module._apply_gate

        def counted(gate_up, original=original, limit=module.limit):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            hits["swiglu_gate_clamped"] += int((gate > limit).sum())
            hits["swiglu_up_clamped"] += int((up.abs() > limit).sum())
            return original(gate_up)
        module._apply_gate = counted


def probe_group_routing(model, text, hits):
    """Counts tokens whose group-limited top-k differs from the plain top-k."""
    groups, kept = getattr(text, "n_group", 1) or 1, getattr(text, "topk_group", 1) or 1
    if groups <= 1 or kept >= groups:
        return
    hits["group_limited_routing"] = 0
    routers = [m for m in model.modules() if hasattr(m, "e_score_correction_bias") and hasattr(m, "weight")]

    def hook(module, args):
        x = args[0].reshape(-1, args[0].shape[-1]).float()
        scores = torch.sigmoid(x @ module.weight.float().t()) + module.e_score_correction_bias.float()
        k = text.num_experts_per_tok
        plain = scores.topk(k, dim=-1).indices.sort(dim=-1).values
        grouped = scores.view(-1, groups, scores.shape[-1] // groups)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores).scatter(1, group_scores.topk(kept, dim=-1).indices, 1)
        masked = scores.masked_fill(~keep.bool().repeat_interleave(scores.shape[-1] // groups, 1), 0.0)
        limited = masked.topk(k, dim=-1).indices.sort(dim=-1).values
        hits["group_limited_routing"] += int((plain != limited).any(-1).sum())
    for r in routers:
        r.register_forward_pre_hook(hook)


def main():
    model_dir, fixture_dir = sys.argv[1], sys.argv[2]
    config = AutoConfig.from_pretrained(model_dir)
    vision = hasattr(config, "vision_config")
    text = config.text_config if vision else config
    fixture = load_file(os.path.join(fixture_dir, "fixture.safetensors"))
    ids = fixture["input_ids"]
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model = auto.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    hits = structural(config, text, ids.shape[1], ids)
    probe_swiglu(model, hits)
    probe_group_routing(model, text, hits)
    inputs = {"input_ids": ids}
    if "pixel_values" in fixture:
        inputs.update(pixel_values=fixture["pixel_values"], image_grid_thw=fixture["image_grid_thw"],
                      mm_token_type_ids=(ids == config.image_token_id).int())
    with torch.no_grad():
        model(**inputs)
    print(json.dumps(hits, sort_keys=True))


if __name__ == "__main__":
    main()
