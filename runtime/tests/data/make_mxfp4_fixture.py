"""Regenerates mxfp4_transformers.safetensors, the fixture IoTest checks the
runtime's MXFP4 decoder against: random gpt-oss-style blocks [E, R, G, 16]
and scales [E, R, G] (U8), and `expected`, what transformers'
convert_moe_packed_tensors makes of them (bf16, [E, G*32, R]).

Run from the repository root: .venv/bin/python runtime/tests/data/make_mxfp4_fixture.py
"""
import os

import torch
from safetensors.torch import save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

torch.manual_seed(0)
E, R, G, B = 2, 3, 2, 16
blocks = torch.randint(0, 256, (E, R, G, B), dtype=torch.uint8)
# Realistic exponents around 2^0, plus the extremes of a plausible range.
scales = torch.randint(120, 134, (E, R, G), dtype=torch.uint8)
expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
assert expected.shape == (E, G * 2 * B, R), expected.shape
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxfp4_transformers.safetensors")
save_file({"experts.gate_up_proj_blocks": blocks,
           "experts.gate_up_proj_scales": scales,
           "expected": expected.contiguous()}, out)
print("wrote", out, tuple(expected.shape))
