#!/usr/bin/env python3
"""Synthesizes the mission's reference model as a release folder (no weights).

~2.8T parameters, 896 routed experts with 16 active per token, three
gated-delta-rule linear-attention layers to every top-k (k = 2048) sparse MLA
layer, a Qwen3-VL-style image encoder, one MTP layer. Writes config.json, then
asks `adapt inspect --emit mlir` for the tensors that config implies and
writes them as model.safetensors.index.json (one tensor per expert, 64
shards): the manifest `adapt gaps` then checks tensor by tensor.
Usage: synthesize_reference_model.py ADAPT_BINARY OUT_DIR
"""
import json
import os
import re
import subprocess
import sys

LAYERS = 72
CONFIG = {
    "architectures": ["ReferenceHybridForConditionalGeneration"],
    "model_type": "reference_hybrid_2p8t",  # unseen on purpose
    "hidden_size": 7168, "num_hidden_layers": LAYERS, "vocab_size": 163840,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                    for i in range(LAYERS)],
    "full_attention_interval": 4,
    "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128,
    "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "n_routed_experts": 896, "num_experts_per_tok": 16, "moe_intermediate_size": 2048,
    "n_shared_experts": 1, "intermediate_size": 18432, "first_k_dense_replace": 0,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
    "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "num_nextn_predict_layers": 1, "max_position_embeddings": 1048576,
    "rope_theta": 10000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vision_config": {"model_type": "qwen3_vl_moe", "depth": 27, "hidden_size": 1152,
                      "intermediate_size": 4304, "num_heads": 16, "patch_size": 16,
                      "temporal_patch_size": 2, "in_channels": 3, "spatial_merge_size": 2,
                      "num_position_embeddings": 2304, "out_hidden_size": 7168,
                      "deepstack_visual_indexes": [8, 16, 24]},
}


def main(adapt, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    ir = subprocess.run([adapt, "inspect", os.path.join(out, "config.json"), "--emit", "mlir"],
                        check=True, capture_output=True, text=True).stdout
    names = []
    for m in re.finditer(r'adapt\.weight @"?([^" ]+)"? : tensor<([0-9x]+)x[a-z0-9]+>(.*)', ir):
        name, dims, attrs = m.group(1), m.group(2).split("x"), m.group(3)
        if "per_expert" in attrs:
            names.extend(name.replace("{e}", str(e)) for e in range(int(dims[0])))
        else:
            names.append(name)
    shards = 64
    weight_map = {n: f"model-{i * shards // len(names) + 1:05d}-of-{shards:05d}.safetensors"
                  for i, n in enumerate(names)}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=1)
    print(f"{out}: {len(names)} tensors in {shards} shards")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
