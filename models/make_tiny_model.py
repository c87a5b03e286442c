#!/usr/bin/env python3
"""Writes models/tiny-qwen3-moe: a real (tiny, random-weight) Qwen3-MoE release.

config.json, model.safetensors.index.json and two safetensors shards with
real BF16 bytes, so `adapt gaps` exercises every reader on real files. Uses
only the standard library; deterministic (fixed seed), so re-running it
reproduces the committed files byte for byte.
"""
import json
import os
import random
import struct
import sys

HIDDEN, LAYERS, VOCAB, HEADS, KV, HEAD_DIM, EXPERTS, TOPK, WIDTH = 64, 2, 128, 4, 2, 16, 4, 2, 32

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
    "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HEAD_DIM,
    "intermediate_size": 96, "moe_intermediate_size": WIDTH, "num_experts": EXPERTS,
    "num_experts_per_tok": TOPK, "norm_topk_prob": True, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "attention_bias": False, "max_position_embeddings": 4096,
}


def tensors():
    yield "model.embed_tokens.weight", [VOCAB, HIDDEN]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", [HIDDEN]
        yield p + "post_attention_layernorm.weight", [HIDDEN]
        yield p + "self_attn.q_proj.weight", [HEADS * HEAD_DIM, HIDDEN]
        yield p + "self_attn.k_proj.weight", [KV * HEAD_DIM, HIDDEN]
        yield p + "self_attn.v_proj.weight", [KV * HEAD_DIM, HIDDEN]
        yield p + "self_attn.o_proj.weight", [HIDDEN, HEADS * HEAD_DIM]
        yield p + "self_attn.q_norm.weight", [HEAD_DIM]
        yield p + "self_attn.k_norm.weight", [HEAD_DIM]
        yield p + "mlp.gate.weight", [EXPERTS, HIDDEN]
        for e in range(EXPERTS):
            yield p + f"mlp.experts.{e}.gate_proj.weight", [WIDTH, HIDDEN]
            yield p + f"mlp.experts.{e}.up_proj.weight", [WIDTH, HIDDEN]
            yield p + f"mlp.experts.{e}.down_proj.weight", [HIDDEN, WIDTH]
    yield "model.norm.weight", [HIDDEN]
    yield "lm_head.weight", [VOCAB, HIDDEN]


def write_shard(path, items, rng):
    header, blobs, offset = {}, [], 0
    for name, shape in items:
        n = 1
        for d in shape:
            n *= d
        # BF16 = the top 16 bits of an fp32 N(0, 0.02) sample.
        data = b"".join(struct.pack("<f", rng.gauss(0, 0.02))[2:] for _ in range(n))
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    return offset


def main(out):
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1234)
    items = list(tensors())
    half = len(items) // 2
    shards = [("model-00001-of-00002.safetensors", items[:half]),
              ("model-00002-of-00002.safetensors", items[half:])]
    weight_map, total = {}, 0
    for name, part in shards:
        total += write_shard(os.path.join(out, name), part, rng)
        for tensor, _ in part:
            weight_map[tensor] = name
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "tiny-qwen3-moe"))
